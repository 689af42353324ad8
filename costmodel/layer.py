"""One per-rank description of a transformer layer, from shape, TP and dtype mode (§1)."""
# One per-rank description of a transformer layer, built once from (model shape, TP, dtype mode).
#
# Everything that needs a per-rank GEMM shape or a byte width reads it here: the schedules
# (costmodel.model), the all-reduce + norm unit (costmodel.decide, benchmarks), the calibration
# and validation runs (calib), and the fits (tools). A fused-op family plugs in through a slot's
# `fuses` (docs/model.md §1, "The per-rank layer").

from __future__ import annotations

from typing import Any
import dataclasses

from .fused_ops import TORCH_FUSES
from .ops import DtypeMode, dtype_mode
from .shapes import ModelShape

# the fusions a slot can take: torch's pipelined AG+GEMM before it, GEMM+RS after it (vLLM <= 0.31's
# AsyncTP)
FUSES = TORCH_FUSES


@dataclasses.dataclass(frozen=True)
class GemmSlot:
    """One GEMM of the layer on one rank: [rows, k] @ [k, n], its collective at its edge (§1)."""

    name: str  # qkv | o | gate_up | down | router
    n: int  # output columns per rank
    k: int  # contraction per rank
    in_bytes: float  # bytes per input element (quantised GEMMs: the fp8 mode's width)
    w_bytes: float  # bytes per weight element
    out_bytes: float  # bytes per output element (partials of a reduce: bf16 even for fp8 GEMMs)
    # "all_gather" before it (under SP), "reduce" after it (all-reduce / reduce-scatter), None
    collective: str | None
    fuses: str | None  # "ag_gemm" | "gemm_rs" | None: the fused op vLLM 0.31's AsyncTP makes of it


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """The per-rank layer: GEMM slots in order, attention and MoE dimensions, reduce unit (§1)."""

    model: str
    tp: int
    dtype: str
    mode: DtypeMode
    hidden: int  # H: the residual stream (not split)
    heads_per_rank: int
    kv_heads_per_rank: int
    head_dim: int
    intermediate_per_rank: int  # dense MLP, or one expert's (MoE)
    num_layers: int
    vocab: int
    num_experts: int  # 0: dense
    experts_per_token: int
    slots: tuple[GemmSlot, ...]
    tied_embeddings: bool = False

    @classmethod
    def build(cls, shape: ModelShape, tp: int, dtype: str) -> LayerSpec:
        """The layer of `shape` split `tp` ways as vLLM shards it, in dtype mode `dtype` (§1)."""
        # Column-parallel qkv/gate_up, row-parallel o/down; KV heads replicated below one per rank.
        shape.check_tp(tp)
        mode = dtype_mode(dtype)
        h, kv, d, H = (
            shape.num_heads // tp,
            shape.kv_heads_per_rank(tp),
            shape.head_dim,
            shape.hidden,
        )
        inter = (shape.moe_intermediate if shape.is_moe else shape.intermediate) // tp
        q, a = mode.gemm_in_bytes, mode.act_bytes
        slots = [
            GemmSlot("qkv", (h + 2 * kv) * d, H, q, q, a, "all_gather", "ag_gemm"),
            GemmSlot("o", H, h * d, q, q, a, "reduce", "gemm_rs"),
        ]
        # router + grouped experts: SP's RS/AG around them, no GEMM fusion in vLLM 0.31
        if shape.is_moe:
            slots.append(GemmSlot("router", shape.num_experts, H, a, a, a, "all_gather", None))
        else:
            slots += [
                GemmSlot("gate_up", 2 * inter, H, q, q, a, "all_gather", "ag_gemm"),
                GemmSlot("down", H, inter, q, q, a, "reduce", "gemm_rs"),
            ]
        return cls(
            shape.name,
            tp,
            dtype,
            mode,
            H,
            h,
            kv,
            d,
            inter,
            shape.num_layers,
            shape.vocab,
            shape.num_experts,
            shape.experts_per_token,
            tuple(slots),
            shape.tied_embeddings,
        )

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def slot(self, name: str) -> GemmSlot:
        return next(s for s in self.slots if s.name == name)

    def reduce_msg_bytes(self, rows: Any) -> Any:
        """The all-reduce unit's message: rows × H activations (bytes; §4)."""
        # Its RMSNorm reads the same rows.
        return rows * (self.hidden * self.mode.act_bytes)

    def rank_gemms(self) -> list[tuple[str, int, int, str | None]]:
        """(slot, n, k, fuses) of the layer's GEMMs a microbenchmark times (§10)."""
        # An MoE layer: its attention GEMMs and one expert's gate_up and down, unfused.
        out = [(s.name, s.n, s.k, s.fuses) for s in self.slots if s.name != "router"]
        if self.is_moe:
            out += [
                ("expert_gate_up", 2 * self.intermediate_per_rank, self.hidden, None),
                ("expert_down", self.hidden, self.intermediate_per_rank, None),
            ]
        return out

    def params_per_rank(self) -> float:
        """Parameters one rank holds under vLLM's TP sharding (count; §8b)."""
        # Attention and MLP split tp ways (KV heads replicated below one per rank), vocab-parallel
        # embedding and lm_head (one if tied), the MoE router replicated; norms ignored.
        h, kv, d, H = self.heads_per_rank, self.kv_heads_per_rank, self.head_dim, self.hidden
        attn = H * (h + 2 * kv) * d + h * d * H
        if self.is_moe:
            mlp = self.num_experts * 3 * H * self.intermediate_per_rank + H * self.num_experts
        else:
            mlp = 3 * H * self.intermediate_per_rank
        emb = self.vocab * H / self.tp * (1 if self.tied_embeddings else 2)
        return self.num_layers * (attn + mlp) + emb
