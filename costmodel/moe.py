"""An MoE model under DP attention + EP: its shape and per-rank compute ops (§11)."""
# An MoE model under DP attention + expert parallelism: its shape (MLA or GQA attention, dense
# layers, shared and routed experts) from config.json, and the per-rank compute ops of one step
# (docs/model.md §11).

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import formulas as F
from .errors import TpcostError
from .ops import Hw
from .vllm_tables import ep_rules

# block-FP8 checkpoints: one fp32 scale per 128x128 weight block (DeepSeek-V3's weight_block_size)
WEIGHT_BLOCK = 128
# vLLM's default share of HBM it may use (config/cache.py gpu_memory_utilization)
GPU_MEMORY_UTILIZATION = 0.9
MLA_CITE = (
    f"vLLM 0.34 {ep_rules().mla_decode_cite} (decode: W_UK absorbed into q, MQA over the latent "
    f"cache, W_UV after), {ep_rules().mla_prefill_cite} (prefill: kv_b_proj up-projects, MHA, not "
    "absorbed)"
)


@dataclasses.dataclass(frozen=True)
class MoEShape:
    """The dimensions of an MoE decoder the EP step needs (MLA or GQA; §11.4)."""

    # MLA when kv_lora_rank > 0, else GQA.

    name: str
    hidden: int
    num_layers: int
    first_dense: int  # first_k_dense_replace: dense MLP layers before the MoE ones
    dense_intermediate: int
    num_heads: int
    num_kv_heads: int
    head_dim: int  # GQA head dim (MLA: qk_nope + qk_rope)
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope: int
    qk_rope: int
    v_head_dim: int
    num_experts: int
    top_k: int
    moe_intermediate: int
    n_shared: int
    n_group: int
    topk_group: int
    vocab: int
    weight_bytes: float  # bytes per weight element of the checkpoint (1: fp8; 2: bf16)

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.first_dense

    def check_ep(self, ep: int) -> None:
        """vLLM splits the routed experts evenly over the EP ranks (one line otherwise; §11.4)."""
        if self.num_experts % ep:
            raise TpcostError(
                f"{self.name}: {self.num_experts} routed experts do not split over EP {ep} "
                "(vLLM places E/EP experts per rank)"
            )


def _pos(
    cfg: Mapping[str, Any], key: str, where: str, default: int | None = None, zero_ok: bool = False
) -> int:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < (0 if zero_ok else 1) or v > 2**20:
        raise TpcostError(
            f"{where}: {key} must be an integer in [{0 if zero_ok else 1}, 2^20], got {v!r}"
        )
    return v


def moe_shape_from_config(cfg: Any, name: str, where: str | None = None) -> MoEShape:
    """Read an MoE config.json: DeepSeek/Kimi MLA style or Qwen3-MoE/Mixtral GQA style (§13)."""
    where = where or name
    if not isinstance(cfg, dict):
        raise TpcostError(f"{where}: config.json must hold a JSON object")
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "quantization_config": cfg.get("quantization_config")}
    n_exp = cfg.get("n_routed_experts", cfg.get("num_experts", cfg.get("num_local_experts")))
    if n_exp in (None, 0):
        raise TpcostError(
            f"{where}: not an MoE model (no n_routed_experts / num_experts): expert parallelism "
            "has nothing to place"
        )
    hidden = _pos(cfg, "hidden_size", where)
    heads = _pos(cfg, "num_attention_heads", where)
    kv_lora = _pos(cfg, "kv_lora_rank", where, 0, zero_ok=True)
    mla = kv_lora > 0
    q = cfg.get("quantization_config") or {}
    if not isinstance(q, dict):
        raise TpcostError(f"{where}: quantization_config must be an object")
    qm = q.get("quant_method")
    if qm not in (None, "fp8"):
        raise TpcostError(
            f"{where}: quant_method {qm!r} is not priced by the EP step (bf16 or block-FP8 only)"
        )
    e = _pos({"n": n_exp}, "n", where)
    k = _pos(cfg, "num_experts_per_tok", where)
    if k > e:
        raise TpcostError(f"{where}: num_experts_per_tok {k} is above the {e} routed experts")
    n_group = _pos(cfg, "n_group", where, 1)
    topk_group = _pos(cfg, "topk_group", where, n_group)
    if e % n_group or topk_group > n_group or k > topk_group * (e // n_group):
        raise TpcostError(
            f"{where}: n_group {n_group} / topk_group {topk_group} do not fit {e} experts top-{k}"
        )
    layers = _pos(cfg, "num_hidden_layers", where)
    first_dense = _pos(cfg, "first_k_dense_replace", where, 0, zero_ok=True)
    if first_dense >= layers:
        raise TpcostError(
            f"{where}: first_k_dense_replace {first_dense} leaves no MoE layer of {layers}"
        )
    kv = _pos(cfg, "num_key_value_heads", where, heads)
    if not mla and (kv > heads or heads % kv):
        raise TpcostError(
            f"{where}: num_key_value_heads {kv} must divide num_attention_heads {heads}"
        )
    head_dim = (
        _pos(cfg, "qk_nope_head_dim", where) + _pos(cfg, "qk_rope_head_dim", where)
        if mla
        else _pos(cfg, "head_dim", where, hidden // heads)
    )
    return MoEShape(
        name=name,
        hidden=hidden,
        num_layers=layers,
        first_dense=first_dense,
        dense_intermediate=_pos(cfg, "intermediate_size", where, 1),
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        q_lora_rank=_pos(cfg, "q_lora_rank", where, 0, zero_ok=True) if mla else 0,
        kv_lora_rank=kv_lora,
        qk_nope=_pos(cfg, "qk_nope_head_dim", where) if mla else 0,
        qk_rope=_pos(cfg, "qk_rope_head_dim", where) if mla else 0,
        v_head_dim=_pos(cfg, "v_head_dim", where) if mla else head_dim,
        num_experts=e,
        top_k=k,
        moe_intermediate=_pos(cfg, "moe_intermediate_size", where),
        n_shared=_pos(cfg, "n_shared_experts", where, 0, zero_ok=True),
        n_group=n_group,
        topk_group=topk_group,
        vocab=_pos(cfg, "vocab_size", where),
        weight_bytes=1.0 if qm == "fp8" else 2.0,
    )


def load_moe_model(name_or_path: str) -> MoEShape:
    """A built-in model or a config.json path, read as an MoE model (§13)."""
    from .shapes import load_model_config

    cfg, name, where = load_model_config(name_or_path)
    return moe_shape_from_config(cfg, name, where)


# ------------------------------------------------------------------ parameters and memory (§11.5)


def attention_params(s: MoEShape) -> float:
    """Attention weights of one layer (elements): MLA's five projections, or GQA's (§11.4)."""
    # MLA: q_a, q_b, kv_a, kv_b, o_proj.
    if s.mla:
        q = (
            s.hidden * s.q_lora_rank + s.q_lora_rank * s.num_heads * s.head_dim
            if s.q_lora_rank
            else s.hidden * s.num_heads * s.head_dim
        )
        return (
            q
            + s.hidden * (s.kv_lora_rank + s.qk_rope)
            + s.kv_lora_rank * s.num_heads * (s.qk_nope + s.v_head_dim)
            + s.num_heads * s.v_head_dim * s.hidden
        )
    return (
        s.hidden * (s.num_heads + 2 * s.num_kv_heads) * s.head_dim
        + s.num_heads * s.head_dim * s.hidden
    )


def weight_bytes_per_rank(s: MoEShape, ep: int) -> float:
    """Weights one DP+EP rank holds (bytes): all but the routed experts replicated (§11.4)."""
    # E/EP routed experts local.
    wb = s.weight_bytes * (1 + (4 / WEIGHT_BLOCK**2 if s.weight_bytes == 1 else 0))  # block scales
    dense = s.first_dense * 3 * s.hidden * s.dense_intermediate
    shared = s.moe_layers * 3 * s.hidden * s.moe_intermediate * s.n_shared
    routed = s.moe_layers * (s.num_experts // ep) * 3 * s.hidden * s.moe_intermediate
    router = s.moe_layers * s.hidden * s.num_experts * 2.0  # bf16 gate
    embed = 2 * s.vocab * s.hidden * 2.0  # embedding and lm_head, bf16
    return (s.num_layers * attention_params(s) + dense + shared + routed) * wb + router + embed


def check_memory(s: MoEShape, ep: int, gpu_name: str, capacity_bytes: float | None) -> float:
    """The weights per rank (bytes), or one line when they exceed vLLM's HBM share (§11.4)."""
    w = weight_bytes_per_rank(s, ep)
    if capacity_bytes is not None and w > GPU_MEMORY_UTILIZATION * capacity_bytes:
        raise TpcostError(
            f"{s.name} at EP {ep} needs {w / 1e9:.1f} GB of weights per GPU; {gpu_name} has "
            f"{GPU_MEMORY_UTILIZATION:g} x {capacity_bytes / 1e9:.0f} GB for vLLM: it does not fit "
            "(use more ranks or a larger GPU)"
        )
    return w


# ------------------------------------------------------------------ compute ops of one rank (§11.2,
# §11.4)


@dataclasses.dataclass(frozen=True)
class Phase:
    """What a step holds: tokens per rank, decode (context per sequence) or prefill (§11.4)."""

    decode: bool
    context_len: int
    seq_len: int


def t_gemm_w(hw: Hw, m: Any, n: int, k: int, w_bytes: float) -> Any:
    """One GEMM on this rank with weights of w_bytes per element (s; §2)."""
    # fp8 block-quantised at 1, bf16 at 2.
    return hw.t_gemm(m, n, k, fp8_ok=w_bytes == 1)


def t_attention_s(hw: Hw, s: MoEShape, t: Any, ph: Phase) -> Any:
    """One layer's attention on one rank (TP 1): projections, core, o_proj (s; §11.4)."""
    t = np.asarray(t, dtype=float)
    wb = s.weight_bytes
    if not s.mla:
        qkv = t_gemm_w(hw, t, (s.num_heads + 2 * s.num_kv_heads) * s.head_dim, s.hidden, wb)
        o = t_gemm_w(hw, t, s.hidden, s.num_heads * s.head_dim, wb)
        core = _core_s(
            hw,
            s,
            t,
            ph,
            qk_dim=s.head_dim,
            v_dim=s.head_dim,
            kv_elems=2 * s.num_kv_heads * s.head_dim,
        )
        return qkv + o + core
    N, L, R, P, V = s.num_heads, s.kv_lora_rank, s.qk_rope, s.qk_nope, s.v_head_dim
    q = (
        t_gemm_w(hw, t, s.q_lora_rank, s.hidden, wb)
        + t_gemm_w(hw, t, N * (P + R), s.q_lora_rank, wb)
        if s.q_lora_rank
        else t_gemm_w(hw, t, N * (P + R), s.hidden, wb)
    )
    kv_a = t_gemm_w(hw, t, L + R, s.hidden, wb)
    o = t_gemm_w(hw, t, s.hidden, N * V, wb)
    # absorbed: q_nope·W_UK and o·W_UV as N batched bf16 GEMMs, MQA over the latent cache
    if ph.decode:
        absorb = t_bmm_s(hw, t, N, P, L) + t_bmm_s(hw, t, N, L, V)
        return q + kv_a + o + absorb + t_mla_core_s(hw, s, t, ph)
    kv_b = t_gemm_w(hw, t, N * (P + V), L, wb)  # not absorbed: the new tokens' K and V up-projected
    return q + kv_a + kv_b + o + t_mla_core_s(hw, s, t, ph)


def t_mla_core_s(hw: Hw, s: MoEShape, t: Any, ph: Phase) -> Any:
    """MLA's core: absorbed MQA at decode, MHA on up-projected K/V at prefill (s; §11.4)."""
    L, R, P, V = s.kv_lora_rank, s.qk_rope, s.qk_nope, s.v_head_dim
    if ph.decode:
        return _core_s(hw, s, np.asarray(t, dtype=float), ph, qk_dim=L + R, v_dim=L, kv_elems=L + R)
    return _core_s(hw, s, np.asarray(t, dtype=float), ph, qk_dim=P + R, v_dim=V, kv_elems=L + R)


def t_bmm_s(hw: Hw, t: Any, batch: int, k: int, n: int) -> Any:
    """One bf16 batched GEMM of `batch` (t × k) @ (k × n) on the roofline (s; §2)."""
    # launch + max(FLOPs at GEMM efficiency, bytes at HBM).
    flops = 2.0 * t * batch * k * n
    byts = batch * (k * n + t * (k + n)) * 2.0
    g = hw.gemm
    t_c = flops / (hw.peak_act_flops_per_s * g["max_efficiency"])
    t_m = byts / (hw.hbm_bw_bytes_per_s * g["mem_efficiency"])
    return np.where(t > 0, g["launch_overhead_s"] + np.maximum(t_c, t_m), 0.0)


def _core_s(hw: Hw, s: MoEShape, t: Any, ph: Phase, qk_dim: int, v_dim: int, kv_elems: int) -> Any:
    """The attention core: max(FLOPs at the attention efficiency, KV bytes at HBM rate) + a launch
    (s)."""
    heads = s.num_heads
    if ph.decode:  # each token is one sequence reading its context
        flops = 2.0 * t * heads * ph.context_len * (qk_dim + v_dim)
        kv = t * ph.context_len * kv_elems * 2.0
    else:  # causal prefill of sequences of seq_len: each query sees (S+1)/2 keys on average
        flops = 2.0 * t * heads * (ph.seq_len + 1) / 2 * (qk_dim + v_dim)
        kv = t * kv_elems * 2.0 * 2
    t_c = flops / (hw.peak_act_flops_per_s * hw.attention_efficiency)
    t_m = kv / (hw.hbm_bw_bytes_per_s * hw.mem_efficiency)
    return np.where(t > 0, hw.launch_overhead_s + np.maximum(t_c, t_m), 0.0)


def t_mlp_s(hw: Hw, t: Any, hidden: int, inter: int, w_bytes: float) -> Any:
    """A gated MLP on t rows: gate_up (2I), then down (s; §11.4)."""
    return t_gemm_w(hw, t, 2 * inter, hidden, w_bytes) + t_gemm_w(hw, t, hidden, inter, w_bytes)


def t_norms_s(hw: Hw, t: Any, hidden: int) -> Any:
    """A layer's two fused add+RMSNorm kernels, memory-bound (s; §3)."""
    # read x and residual, write
    return 2 * hw.t_mem(np.asarray(t, dtype=float) * hidden * hw.act_bytes * 3.0)


def t_experts_s(
    hw: Hw, s: MoEShape, total_tokens: Any, ep: int, imbalance: float = 1.0, sm_share: float = 1.0
) -> tuple[Any, Any]:
    """(time, active local experts) of the routed grouped GEMMs on the hottest rank (§11.2)."""
    # (time, active local experts) of the routed experts' grouped GEMMs on the hottest rank (s,
    # count; §11.2). Rows per expert ~ Binomial(T_all, ι·k/E), padded to the tile; tiles quantised
    # into waves over the SMs given; weights read once per active expert.
    T = np.asarray(total_tokens, dtype=float)
    e_loc = s.num_experts // ep
    p = min(imbalance * s.top_k / s.num_experts, 1.0)
    active = F.expected_active_experts(T, s.top_k, s.num_experts, e_loc, imbalance)
    g = hw.gemm
    tm, tn = float(g["tile_m"]), float(g["tile_n"])
    sms = g["sm_count"] * sm_share
    row_tiles = e_loc * F.expected_row_tiles(T, p, int(tm))
    fp8 = s.weight_bytes == 1
    peak = hw._peak_flops(fp8) * g["max_efficiency"]
    pairs = T * p * e_loc
    total: Any = 0.0
    for n, k in ((2 * s.moe_intermediate, s.hidden), (s.hidden, s.moe_intermediate)):
        tiles = row_tiles * np.ceil(n / tn)
        t_comp = np.ceil(tiles / sms) * (2.0 * tm * tn * k) / (peak / g["sm_count"])
        in_b = hw._in_bytes(fp8)
        byts = active * n * k * s.weight_bytes + pairs * (k * in_b + n * hw.act_bytes)
        t_mem = byts / (hw.hbm_bw_bytes_per_s * g["mem_efficiency"])
        total = total + np.where(T > 0, g["launch_overhead_s"] + np.maximum(t_comp, t_mem), 0.0)
    return total, active
