"""The three schedules of a layer (tp, sp, sp_asynctp) as vLLM 0.31 runs them (§1)."""
# The three schedules of a transformer layer (tp, sp, sp_asynctp) as vLLM 0.31 runs them.
#
# A schedule is a declarative list of ops, each timed by costmodel.ops over the token counts N
# (formulas: costmodel.formulas; derivation and sources: docs/model.md). Param values may be
# arrays of Monte Carlo draws (shape (D, 1)) that broadcast against N (shape (n,)).

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from . import formulas as F
from .defaults import (
    DEFAULT_BUDGET_TOKENS,
    DEFAULT_CONTEXT_LEN,
    DEFAULT_MARGIN,
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_SEQ_LEN,
)
from . import fused_ops, ops, vllm_tables
from .errors import TpcostError
from .layer import LayerSpec
from .profile import HardwareProfile
from .shapes import ModelShape, check_dtype
from .vllm_tables import Vllm

SCHEDULES = ("tp", "sp", "sp_asynctp")
# every term is "positive = SP+AsyncTP saves", in JSON and in text; they sum to t_tp − t_sp_asynctp
BREAKDOWN_KEYS = (
    "overlap_gain_s",
    "chunking_s",
    "two_stream_recovery_s",
    "contention_s",
    "sync_and_memory_s",
    "host_issue_s",
    "norm_saving_s",
    "collective_change_s",
    "padding_and_other_s",
)


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Op:
    """One timed op of a schedule: per-call GPU and host issue time (s), calls per forward (§1)."""

    # Times are over the schedule's row counts: N for `tp`, the padded ⌈N/tp⌉·tp for the SP
    # schedules.

    name: str
    kind: str  # gemm | fused | comm | memory | attention
    t_s: Any
    count: int = 1
    formula: str = ""  # costmodel function that times it (one hop to docs/model.md)
    section: str = ""  # docs/model.md section
    t_host_s: Any = 0.0  # host issue time per call when the forward runs eagerly
    fused: ops.FusedOp | None = None  # the parts of a fused AsyncTP op
    slot: str | None = None  # the per-rank layer's GEMM slot it computes (costmodel.layer), if any
    flops: Any = 0.0  # FLOP per call (for achieved TFLOP/s)
    hbm_bytes: Any = 0.0  # HBM bytes per call (for achieved GB/s)
    # bus bytes per call: factor·S of a collective, bytes pulled by a fused op
    link_bytes: Any = 0.0
    # {bound: time} whose largest names the bound the op hits (compute, HBM, link, latency, host)
    parts: Any = None


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Schedule:
    name: str
    layer_ops: tuple[Op, ...]
    nonlayer_ops: tuple[Op, ...]
    num_layers: int
    eager: Any  # bool over N: the forward runs eagerly (above the CUDA-graph capture range)

    def _sum(self, attr):
        layer = sum(getattr(op, attr) * op.count for op in self.layer_ops)
        rest = sum(getattr(op, attr) * op.count for op in self.nonlayer_ops)
        return self.num_layers * layer + rest

    @functools.cached_property
    def t_layer_s(self) -> Any:
        """GPU time of one layer (s; §1)."""
        return sum(op.t_s * op.count for op in self.layer_ops)

    @functools.cached_property
    def t_gpu_forward_s(self) -> Any:
        """GPU time of one forward (s; §1)."""
        return self._sum("t_s")

    @functools.cached_property
    def t_host_forward_s(self) -> Any:
        """Host issue time of one forward when eager (s; §1)."""
        return self._sum("t_host_s")

    @functools.cached_property
    def t_forward_s(self) -> Any:
        """One forward: GPU time, or max(GPU, host issue) where it runs eagerly (s; §1)."""
        return np.where(
            self.eager,
            np.maximum(self.t_gpu_forward_s, self.t_host_forward_s),
            self.t_gpu_forward_s,
        )


@dataclasses.dataclass(frozen=True)
class DecodeRegime:
    """How vLLM schedules a step: decodes at `context_len`, the rest chunked prefill (§5)."""

    # Up to `max_num_seqs` of its tokens are decodes, each reading a KV cache of `context_len`
    # tokens.

    # tokens of KV cache per decode (where context_grid is silent)
    context_len: float = DEFAULT_CONTEXT_LEN
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    # a workload's contexts (costmodel.workload.decode_regime): per grid point (a padded step size)
    # the count-weighted mean context of the steps that pad to it; a step of N tokens reads the
    # context of the first point >= N
    context_grid: tuple[float, ...] = ()
    context_values: tuple[float, ...] = ()
    context_counted: tuple[
        bool, ...
    ] = ()  # per grid point: some of the workload's steps pad to it (else its mean)

    def context_at(self, n: Any) -> Any:
        """The KV context of a decode in a step of n tokens (tokens; broadcasts over n; §5)."""
        if not self.context_grid:
            return self.context_len
        return np.asarray(self.context_values)[self._at(n)]

    def _at(self, n: Any) -> Any:
        grid = np.asarray(self.context_grid)
        return np.minimum(np.searchsorted(grid, n, side="left"), grid.size - 1)

    def context_source(self, n: int) -> str:
        """Where the context of a step of n tokens comes from (§14)."""
        # "context_len" (one value for every step), "workload" (the count-weighted mean of the
        # workload's steps that pad to n's grid point) or "workload mean" (no step of the workload
        # pads there: its mean over all steps).
        if not self.context_grid:
            return "context_len"
        counted = self.context_counted[int(self._at(n))] if self.context_counted else True
        return "workload" if counted else "workload mean"


@dataclasses.dataclass(frozen=True)
class Regime:
    """How vLLM runs a forward, beyond the model, TP, dtype and token count (docs/model.md §5)."""

    # prefill sequences of this many tokens (attention's quadratic term)
    seq_len: int = DEFAULT_SEQ_LEN
    # largest CUDA-graph capture (None: vLLM's default; 0: eager)
    cudagraph_max_tokens: int | None = None
    # FlashInfer fused AR+RMSNorm limit (None: vLLM's table; 0: the pass off)
    fi_max_bytes: float | None = None
    # the vLLM whose dispatch runs (and --vllm-set limits)
    vllm: Vllm = dataclasses.field(default_factory=Vllm)
    # decode steps at a context length (None: every token is prefill)
    decode: DecodeRegime | None = None


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One decision's query: setup, regime, token budget, risk premium and traffic (§9)."""

    # The traffic the decision is weighted by (None: uniform over the multiples of tp).

    tp: int
    dtype: str = "bf16"
    regime: Regime = Regime()
    max_num_batched_tokens: int = DEFAULT_BUDGET_TOKENS
    margin: float = DEFAULT_MARGIN
    workload: Any = None  # costmodel.workload.Workload


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Prediction:
    """Per-op times of the three schedules over `num_tokens`, and the difference breakdown (§1)."""

    # Per forward.

    num_tokens: np.ndarray
    tp: int
    dtype: str
    schedules: dict[str, Schedule]
    notes: tuple[str, ...]
    asynctp_available: bool = True
    # schedule -> why it cannot run here (one line)
    unavailable: Any = dataclasses.field(default_factory=dict)
    num_layers: int = 0
    # the SP schedule's all-gather and reduce-scatter per call (the breakdown's terms)
    t_all_gather_s: Any = 0.0
    t_reduce_scatter_s: Any = 0.0

    @functools.cached_property
    def breakdown(self) -> dict[str, Any]:
        """BREAKDOWN_KEYS -> per-forward seconds over N, positive = SP+AsyncTP saves (§6)."""
        # Computed on first use.
        return breakdown_terms(
            self.schedules,
            self.num_layers,
            self.t_all_gather_s,
            self.t_reduce_scatter_s,
            self.asynctp_available,
        )

    def t_forward_s(self, schedule: str) -> Any:
        return self.schedules[schedule].t_forward_s

    def speedup(self, schedule: str) -> np.ndarray:
        """t_tp / t_schedule over N; NaN where the schedule cannot run, never 0 (§1)."""
        # The schedule's time is +inf where it cannot run.
        t = self.t_forward_s(schedule)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(np.isfinite(t), self.t_forward_s("tp") / t, np.nan)

    @property
    def speedup_sp(self) -> np.ndarray:
        return self.speedup("sp")

    @property
    def speedup_sp_asynctp(self) -> np.ndarray:
        return self.speedup("sp_asynctp")


def predict(
    profile: HardwareProfile,
    shape: ModelShape,
    tp: int,
    dtype: str,
    num_tokens: Any,
    regime: Regime | None = None,
) -> Prediction:
    """Per-op times of tp, sp and sp_asynctp for one forward over `num_tokens` (§1)."""
    # Per-op times of tp / sp / sp_asynctp for one forward over token counts `num_tokens`, run as
    # `regime` says. Forwards of N ≤ cudagraph_max_tokens replay CUDA graphs (no host cost); larger
    # ones run eagerly, where torch's Python AsyncTP pipeline and every other op are issued by the
    # host. `fi_max_bytes` is the FlashInfer fused all-reduce+RMSNorm limit vLLM runs with (None:
    # vLLM's table; 0: the fusion pass off, `fuse_allreduce_rms: false`). `decode`: steps as decodes
    # at a context length (None: every token is prefill of `seq_len`-token sequences, which reads no
    # KV cache).
    r = Regime() if regime is None else regime
    check_dtype(dtype)
    shape.check_tp(tp)
    if not isinstance(r.seq_len, (int, np.integer)) or r.seq_len < 1:
        raise TpcostError(f"--seq-len must be an integer >= 1, got {r.seq_len}")
    N = np.atleast_1d(np.asarray(num_tokens, dtype=float))
    if N.ndim != 1 or N.size == 0 or np.any(N <= 0) or not np.all(np.isfinite(N)):
        raise TpcostError("token counts N must be finite and > 0")
    cap = r.cudagraph_max_tokens
    if cap is not None and (not isinstance(cap, (int, np.integer)) or cap < 0):
        raise TpcostError(f"--cudagraph-max-tokens must be an integer >= 0, got {cap}")
    cap = vllm_tables.capture_size(cap, profile.identity.compute_capability)
    fw = _Ops(profile, shape, tp, dtype, N, r)
    eager = vllm_tables.runs_eagerly(N, cap)
    notes: list[str] = [
        f"{shape.name}: config.json has no {d.split(' = ')[0]}; taken as Hugging Face does: {d}"
        for d in shape.defaults
    ]
    unavailable = ops.fused_ops_available(profile, tp)
    sp_unavailable = None if tp >= 2 else "SP needs tp >= 2 (at tp 1 there is nothing to scatter)"
    tp_layer, unit_tp = _tp_layer(fw, notes)
    sp_layer, rs, norm_shard, ag = _sp_layer(fw)
    if sp_unavailable:
        notes.append(sp_unavailable)
        sp_layer = (
            fw.op(
                "sp_unavailable",
                "comm",
                np.full(N.shape, np.inf),
                formula="tp >= 2",
                section="§4",
                host_calls=0.0,
            ),
        )
    if unavailable is None:
        spa_layer = _sp_asynctp_layer(fw, rs, norm_shard, ag, notes)
    else:
        if not sp_unavailable:
            notes.append(unavailable + "; SP alone stays possible with inter-node collectives")
        spa_layer = (
            fw.op(
                "asynctp_unavailable",
                "fused",
                np.full(N.shape, np.inf),
                formula="ops.fused_ops_available",
                section="§6",
                host_calls=0.0,
            ),
        )
    if cap == 0:
        notes.append(
            "every step runs eagerly (--enforce-eager): the host issue time of every op counts, "
            "torch's "
            "Python AsyncTP pipeline included"
        )
    elif np.any(eager):
        notes.append(
            f"N > {cap} runs eagerly (vLLM's largest CUDA-graph capture size): the host "
            "issue time of every op counts there, torch's Python AsyncTP pipeline included; below, "
            "graphs replay"
        )
    nonlayer_tp, nonlayer_sp = _nonlayer(fw, unit_tp, rs, norm_shard, ag)
    L = fw.spec.num_layers
    scheds = {
        "tp": Schedule("tp", tp_layer, nonlayer_tp, L, eager),
        "sp": Schedule("sp", sp_layer, nonlayer_sp, L, eager),
        "sp_asynctp": Schedule("sp_asynctp", spa_layer, nonlayer_sp, L, eager),
    }
    why = {
        k: v
        for k, v in (("sp", sp_unavailable), ("sp_asynctp", sp_unavailable or unavailable))
        if v
    }
    return Prediction(
        num_tokens=N,
        tp=tp,
        dtype=dtype,
        schedules=scheds,
        notes=tuple(notes),
        asynctp_available=unavailable is None,
        unavailable=why,
        num_layers=L,
        t_all_gather_s=ag.t_s,
        t_reduce_scatter_s=rs.t_s,
    )


def _once(o: Op) -> Op:
    """The op run once (a non-layer copy of a per-layer op)."""
    return dataclasses.replace(o, count=1)


def dispatch_edges(n: Any, impls: Any, msg_bytes: Any) -> list[tuple[int, int, str, str, float]]:
    """Where vLLM's per-size collective implementation changes along the sorted sizes `n` (§4)."""
    # (last N of one implementation, first N of the next, their names, the message at the first in
    # MiB): vLLM's dispatch limits; issue 50 item 12.
    n, impls, msg = (
        np.atleast_1d(n),
        np.atleast_1d(impls),
        np.broadcast_to(msg_bytes, np.shape(np.atleast_1d(n))),
    )
    if impls.shape != n.shape or n.size < 2:
        return []
    order = np.argsort(n, kind="stable")
    n, impls, msg = n[order], impls[order], msg[order]
    # vectorised: predict runs this on every sweep
    steps = np.flatnonzero(impls[1:] != impls[:-1]) + 1
    return [
        (int(n[i - 1]), int(n[i]), str(impls[i - 1]), str(impls[i]), float(msg[i]) / F.MiB)
        for i in steps
    ]


class _Ops:
    """The ops of one forward at token counts N, one method per kind of op; the schedules' layers
    are built from them by _tp_layer, _sp_layer, _sp_asynctp_layer and _nonlayer (predict's
    parts)."""

    def __init__(
        self,
        profile: HardwareProfile,
        shape: ModelShape,
        tp: int,
        dtype: str,
        N: np.ndarray,
        regime: Regime,
    ):
        self.shape, self.W, self.dtype, self.N, self.regime = shape, tp, dtype, N, regime
        self.spec = LayerSpec.build(shape, tp, dtype)
        self.Np = np.ceil(N / tp) * tp  # SP pads N up to a multiple of tp
        self.hw = hw = ops.Hw(profile, dtype)
        self.mode, self.act = hw.mode, hw.mode.act_bytes
        self.host_op = profile.asynctp.host_op_s

    # ---------------------------------------------------------------- one op of each kind
    def op(
        self,
        name,
        kind,
        t,
        count=1,
        formula="",
        section="",
        fused=None,
        host_calls=1.0,
        t_host=None,
        slot=None,
        **work,
    ) -> Op:
        return Op(
            name,
            kind,
            t,
            count,
            formula,
            section,
            host_calls * self.host_op if t_host is None else t_host,
            fused,
            slot=slot,
            **work,
        )

    def gemm(self, name, n_rows, n, k, fp8_ok=True, slot=None) -> Op:
        hw, act = self.hw, self.act
        b = hw.gemm_in_bytes if fp8_ok else act
        return self.op(
            name,
            "gemm",
            hw.t_gemm(n_rows, n, k, fp8_ok=fp8_ok),
            formula="formulas.t_gemm_s",
            section="§2",
            flops=F.gemm_flops(n_rows, n, k),
            hbm_bytes=F.gemm_bytes(n_rows, n, k, b, b, act),
            parts={
                "compute": hw.t_gemm_comp(n_rows, n, k, fp8_ok=fp8_ok),
                "HBM": hw.t_gemm_mem(n_rows, n, k, fp8_ok=fp8_ok),
                "latency": hw.gemm["launch_overhead_s"],
            },
            slot=slot,
        )

    def slot_gemm(self, slot, n_rows) -> Op:
        """The whole GEMM of one slot of the per-rank layer (the router runs unquantised)."""
        return self.gemm(
            f"{slot.name}_gemm",
            n_rows,
            slot.n,
            slot.k,
            fp8_ok=slot.name != "router",
            slot=slot.name,
        )

    def mem(self, name, nbytes, formula, count=1) -> Op:
        hw = self.hw
        return self.op(
            name,
            "memory",
            hw.t_mem(nbytes),
            count,
            f"formulas.t_memory_bound_s({formula})",
            "§3",
            hbm_bytes=nbytes,
            parts={
                "HBM": nbytes / (hw.hbm_bw_bytes_per_s * hw.mem_efficiency),
                "latency": hw.launch_overhead_s,
            },
        )

    def comm(self, name, t, msg_bytes, factor, latency, count, formula) -> Op:
        return self.op(
            name,
            "comm",
            t,
            count,
            formula,
            "§4",
            link_bytes=factor * msg_bytes,
            parts={"link": t - latency, "latency": latency},
        )

    def attention(self, n) -> Op:
        """Attention over n rows, of which the step's N real tokens are decodes (up to max_num_seqs,
        at the step's context) and chunked prefill; SP's padding rows (n > N) move their q/k/v bytes
        and read no KV cache and no prefix: the KV read is the same in all three schedules
        (docs/model.md §5)."""
        hw, spec, act, decode = self.hw, self.spec, self.act, self.regime.decode
        h_rank, kv_rank, d = spec.heads_per_rank, spec.kv_heads_per_rank, spec.head_dim
        real = np.minimum(n, self.N)  # the step's own tokens; the rest is padding
        # decodes of this step
        seqs = 0.0 if decode is None else np.minimum(real, float(decode.max_num_seqs))
        pre = real - seqs  # chunked-prefill tokens
        flops = F.attention_flops(pre, self.regime.seq_len, h_rank, d)
        nbytes = F.attention_bytes(n, h_rank, kv_rank, d, act)
        t_c = flops / (hw.peak_act_flops_per_s * hw.attention_efficiency)
        t_m = nbytes / (hw.hbm_bw_bytes_per_s * hw.mem_efficiency)
        t = np.maximum(t_c, t_m)
        parts = {"compute": t_c, "HBM": t_m, "latency": hw.launch_overhead_s}
        # paged KV reads at the attention kernel's efficiency of HBM (docs/model.md §5)
        if decode is not None:
            f_d = F.decode_attention_flops(seqs, decode.context_at(real), h_rank, d)
            kv = F.kv_cache_read_bytes(seqs, decode.context_at(real), kv_rank, d, act)
            eff = hw.attention_efficiency
            t_kv = np.maximum(
                f_d / (hw.peak_act_flops_per_s * eff), kv / (hw.hbm_bw_bytes_per_s * eff)
            )
            t, flops, nbytes = t + t_kv, flops + f_d, nbytes + kv
            parts["KV read"] = t_kv
        return self.op(
            "attention",
            "attention",
            hw.launch_overhead_s + t,
            formula="formulas.attention_flops/attention_bytes"
            + ("" if decode is None else " + decode_attention_flops/kv_cache_read_bytes"),
            section="§5",
            flops=flops,
            hbm_bytes=nbytes,
            parts=parts,
        )

    def silu_mul(self, n) -> Op:
        return self.mem(
            "silu_mul",
            F.silu_mul_bytes(n, self.spec.intermediate_per_rank, self.act, self.mode.quant_bytes),
            "silu_mul_bytes",
        )

    def moe_experts(self, n) -> Op:
        """Grouped experts (roofline): the expected experts touched stream their weights (§8). SP's
        padding rows (n > N) are identical zero rows: they all route to one token's experts, so the
        experts touched are those of the N real tokens and one more; every padded row still
        computes."""
        hw, spec = self.hw, self.spec
        E, k, H, I_rank = (
            spec.num_experts,
            spec.experts_per_token,
            spec.hidden,
            spec.intermediate_per_rank,
        )
        flops = F.gemm_flops(n * k, 3 * I_rank, H)
        routed = np.where(n > self.N, self.N + 1.0, n)
        w_bytes = F.moe_expert_weight_bytes(routed, k, E, H, I_rank, hw.gemm_in_bytes)
        t_exp = hw.gemm["launch_overhead_s"] * 3 + np.maximum(
            flops / (hw.peak_flops_per_s * hw.gemm["max_efficiency"]),
            w_bytes / (hw.hbm_bw_bytes_per_s * hw.gemm["mem_efficiency"]),
        )
        return self.op(
            "moe_experts",
            "gemm",
            t_exp,
            formula="formulas.gemm_flops + moe_expert_weight_bytes (grouped roofline)",
            section="§8",
            host_calls=3.0,
        )

    def after(self, slot, n) -> list[Op]:
        """What runs right after a slot's GEMM, in vLLM's order: attention after qkv, SiluMul after
        gate_up, the routing kernels and the grouped experts after the router."""
        if slot.name == "router":
            return self.moe_block(n)
        follow = {"qkv": self.attention, "gate_up": self.silu_mul}.get(slot.name)
        return [follow(n)] if follow else []

    def moe_block(self, n) -> list[Op]:
        """What follows the router GEMM in vLLM's fused MoE: top-k, the expert-block alignment, the
        grouped experts and the sum of each token's k outputs; the three small kernels are
        memory-bound over every row (§8)."""
        spec, act = self.spec, self.act
        E, k, H = spec.num_experts, spec.experts_per_token, spec.hidden
        return [
            self.mem("moe_topk", F.moe_topk_bytes(n, E, k, act), "moe_topk_bytes"),
            self.mem("moe_align", F.moe_align_bytes(n, k, E), "moe_align_bytes"),
            self.moe_experts(n),
            self.mem("moe_sum", F.moe_sum_bytes(n, k, H, act), "moe_sum_bytes"),
        ]

    def compute_ops(self, n, slots) -> list[Op]:
        out = []
        for slot in slots:
            out += [self.slot_gemm(slot, n)] + self.after(slot, n)
        return out

    def quant(self, n, count=1) -> Op:
        """The dynamic per-token quantisation kernel after a bf16 all-gather."""
        return self.mem(
            "dynamic_quant",
            F.dynamic_quant_bytes(n, self.spec.hidden, self.act),
            "dynamic_quant_bytes",
            count,
        )

    # ---------------------------------------------------------------- the schedules' layers

    def fused(self, slot, f, formula, moved_bytes) -> Op:
        """One slot's torch fused op (§6)."""
        name = (
            f"fused_all_gather_{slot.name}_gemm"
            if slot.fuses == "ag_gemm"
            else f"fused_{slot.name}_gemm_reduce_scatter"
        )
        return self.op(
            name,
            "fused",
            f.t_gpu_s,
            formula=formula,
            section="§6",
            fused=f,
            t_host=f.t_host_s,
            flops=F.gemm_flops(self.Np, slot.n, slot.k),
            link_bytes=F.bus_bw_factor("all_gather", self.W) * moved_bytes,
            parts={
                "compute": f.t_chunks_contended_s,
                "link": f.t_pulls_s,
                "latency": f.t_sync_s,
                "HBM": f.t_memory_s,
            },
            slot=slot.name,
        )


def _tp_layer(fw: _Ops, notes: list[str]) -> tuple[tuple, list[Op]]:
    """(the layer under plain TP, its all-reduce + RMSNorm unit): vLLM's dispatched all-reduce
    (§4)."""
    hw, spec, N, W, act, mode = fw.hw, fw.spec, fw.N, fw.W, fw.act, fw.mode
    msg = spec.reduce_msg_bytes(N)
    ar = ops.all_reduce_dispatch(
        hw, msg, W, True, fi_max_bytes=fw.regime.fi_max_bytes, vllm=fw.regime.vllm
    )
    t_ar, fused_mask, impls, lat_ar = ar.t_s, ar.fused, ar.impls, ar.latency_s
    norm_bytes = np.where(fused_mask, 0.0, F.rms_norm_bytes(N, spec.hidden, act, mode.quant_bytes))
    t_norm_unfused = np.where(fused_mask, 0.0, hw.t_mem(norm_bytes))
    notes.append(
        "tp all-reduce implementations over this sweep: "
        + ", ".join(impls)
        + f" (dispatch tables of {ar.tables})"
    )
    edges = dispatch_edges(N, ar.impl_per_size, msg)
    if edges:
        notes.append(
            "tp all-reduce dispatch edges (vLLM's size limits; time can fall across one): "
            + "; ".join(
                f"{a} up to {lo} tokens, {b} from {hi} ({mib:.3g} MiB)"
                for lo, hi, a, b, mib in edges
            )
        )
    unit_tp = [
        fw.comm(
            "all_reduce",
            t_ar,
            msg,
            F.bus_bw_factor("all_reduce", W),
            lat_ar,
            2,
            f"ops.all_reduce_dispatch ({', '.join(impls)}) -> formulas.t_all_reduce_s",
        ),
        fw.op(
            "rms_norm",
            "memory",
            t_norm_unfused,
            2,
            "formulas.t_memory_bound_s(rms_norm_bytes); 0 where fused",
            "§3",
            hbm_bytes=norm_bytes,
            parts={
                "HBM": norm_bytes / (hw.hbm_bw_bytes_per_s * hw.mem_efficiency),
                "latency": np.where(fused_mask, 0.0, hw.launch_overhead_s),
            },
        ),
    ]
    return tuple(fw.compute_ops(N, spec.slots) + unit_tp), unit_tp


def _sp_layer(fw: _Ops) -> tuple[tuple, Op, Op, Op]:
    """(the layer under SP: RS -> norm(N/W) -> AG, its reduce-scatter, sharded norm, all-gather)."""
    hw, H, Np, W, act, mode = fw.hw, fw.spec.hidden, fw.Np, fw.W, fw.act, fw.mode
    t_rs = ops.t_nccl_reduce_scatter_s(hw, W, Np * (H * act))
    t_ag = ops.t_nccl_all_gather_s(hw, W, Np * (H * mode.ag_bytes))
    rs = fw.comm(
        "reduce_scatter",
        t_rs,
        Np * (H * act),
        F.bus_bw_factor("reduce_scatter", W),
        ops.collective_latency_s(hw, "nccl_reduce_scatter", W),
        2,
        "ops.t_nccl_reduce_scatter_s -> formulas.t_reduce_scatter_s",
    )
    ag = fw.comm(
        "all_gather",
        t_ag,
        Np * (H * mode.ag_bytes),
        F.bus_bw_factor("all_gather", W),
        ops.collective_latency_s(hw, "nccl_all_gather", W),
        2,
        "ops.t_nccl_all_gather_s -> formulas.t_all_gather_s",
    )
    norm_shard = fw.mem(
        "rms_norm_shard",
        F.rms_norm_bytes(Np / W, H, act, mode.ag_bytes),
        "rms_norm_bytes on N/tp rows",
        2,
    )
    dyn = [fw.quant(Np, 2)] if fw.dtype == "fp8-dynamic" else []
    return (rs, norm_shard, ag, *dyn, *fw.compute_ops(Np, fw.spec.slots)), rs, norm_shard, ag


def _sp_asynctp_layer(fw: _Ops, rs: Op, norm_shard: Op, ag: Op, notes: list[str]) -> tuple:
    """The layer under SP+AsyncTP: each slot's fusion, in order."""
    hw, H, Np, W, act, mode = fw.hw, fw.spec.hidden, fw.Np, fw.W, fw.act, fw.mode
    vllm = fw.regime.vllm
    spa = [norm_shard]
    for slot in fw.spec.slots:
        # an MoE block: SP's all-gather before it, no GEMM fusion in vLLM 0.31
        if slot.name == "router":
            spa += [_once(ag)] + fw.compute_ops(Np, [slot])
        # per-token fp8: a quant kernel sits between
        elif slot.fuses == "ag_gemm" and not mode.ag_gemm_fuses:
            spa += [_once(ag), fw.quant(Np), fw.slot_gemm(slot, Np)] + fw.after(slot, Np)
        elif slot.fuses == "ag_gemm":
            f = fused_ops.symm_mem_entry("ag_gemm", vllm).pipelined(
                hw, Np, slot.n, slot.k, W, eager=True
            )
            spa += [
                fw.fused(
                    slot,
                    f,
                    "ops.fused_ag_gemm -> formulas.t_ag_gemm_gpu_s",
                    Np * (H * mode.ag_bytes),
                )
            ]
            spa += fw.after(slot, Np)
        else:  # gemm_rs
            f = fused_ops.symm_mem_entry("gemm_rs", vllm).pipelined(
                hw, Np, slot.n, slot.k, W, eager=True
            )
            spa.append(
                fw.fused(slot, f, "ops.fused_gemm_rs -> formulas.t_gemm_rs_gpu_s", Np * (H * act))
            )
    if fw.spec.is_moe:
        spa.append(_once(rs))
        notes.append(
            f"{fw.shape.name} is MoE: its MoE block gets SP (RS/AG) but no GEMM fusion in vLLM 0.31"
        )
    return tuple(spa)


def _nonlayer(fw: _Ops, unit_tp: list[Op], rs: Op, norm_shard: Op, ag: Op) -> tuple[tuple, tuple]:
    """(the ops outside the layers under TP, and under SP): embedding, the final norm unit, lm_head,
    logits."""
    hw, H, N, Np, W, act = fw.hw, fw.spec.hidden, fw.N, fw.Np, fw.W, fw.act
    n_seqs = np.ceil(N / fw.regime.seq_len)
    embed = fw.mem("embedding", F.embedding_bytes(N, H, act), "embedding_bytes")
    lm_head = fw.gemm("lm_head_gemm", n_seqs, fw.shape.vocab / W, H, fp8_ok=False)
    logit_bytes = F.logits_bytes(n_seqs, fw.shape.vocab)
    logits = fw.comm(
        "logits_gather",
        ops.t_nccl_all_gather_s(hw, W, logit_bytes),
        logit_bytes,
        F.bus_bw_factor("all_gather", W),
        ops.collective_latency_s(hw, "nccl_all_gather", W),
        1,
        "ops.t_nccl_all_gather_s",
    )
    nonlayer_tp = (embed, *[_once(o) for o in unit_tp], lm_head, logits)
    nonlayer_sp = (
        fw.mem("embedding", F.embedding_bytes(Np, H, act), "embedding_bytes on N_p rows"),
        _once(rs),
        _once(norm_shard),
        _once(ag),
        lm_head,
        logits,
    )
    return nonlayer_tp, nonlayer_sp


def breakdown_terms(
    scheds: dict[str, Schedule], L: int, t_ag: Any, t_rs: Any, available: bool
) -> dict[str, Any]:
    """Each term from its own ops (none a remainder); positive = SP+AsyncTP saves (§6)."""
    # Σ terms = t_tp − t_sp_asynctp is then an identity that the tests check.
    tp, sp, spa = scheds["tp"], scheds["sp"], scheds["sp_asynctp"]
    zero = np.zeros_like(tp.t_gpu_forward_s)
    out = {k: zero.copy() for k in BREAKDOWN_KEYS}
    units = 2 * L + 1  # all-reduce units per forward: 2 per layer + the final norm

    def ops_of(s, pred):
        return [(o, L) for o in s.layer_ops if pred(o)] + [
            (o, 1) for o in s.nonlayer_ops if pred(o)
        ]

    def total(pairs):
        return sum((o.t_s * o.count * mult for o, mult in pairs), zero)

    ar = total(ops_of(tp, lambda o: o.name == "all_reduce"))
    norm_tp = total(ops_of(tp, lambda o: o.name == "rms_norm"))
    out["collective_change_s"] = ar - units * (t_rs + t_ag)
    out["norm_saving_s"] = norm_tp - total(ops_of(sp, lambda o: o.name == "rms_norm_shard"))
    compute = lambda o: o.kind not in ("comm",) and o.name not in ("rms_norm", "rms_norm_shard")  # noqa: E731
    out["padding_and_other_s"] = total(ops_of(tp, compute)) - total(ops_of(sp, compute))
    if not available:
        out["overlap_gain_s"] = out["overlap_gain_s"] - np.inf
        return out
    for o, mult in ops_of(spa, lambda o: o.fused is not None):
        f, k = o.fused, mult * o.count
        rs_op = o.name.endswith("reduce_scatter")
        t_coll = t_rs if rs_op else t_ag
        # the whole GEMM it replaces: same rows, n and k in the SP schedule
        t_whole = _whole_gemm(sp, o)
        pipe = f.t_gpu_s - f.t_sync_s - f.t_memory_s
        floor = np.maximum(f.t_chunks_contended_s, t_whole)
        out["overlap_gain_s"] = out["overlap_gain_s"] + k * (t_coll - (pipe - floor))
        out["chunking_s"] = out["chunking_s"] - k * (f.t_chunks_s - t_whole)
        out["two_stream_recovery_s"] = out["two_stream_recovery_s"] + k * (
            f.t_chunks_s - f.t_chunks_concurrent_s - (floor - f.t_chunks_contended_s)
        )
        out["contention_s"] = out["contention_s"] - k * (
            f.t_chunks_contended_s - f.t_chunks_concurrent_s
        )
        out["sync_and_memory_s"] = out["sync_and_memory_s"] - k * (f.t_sync_s + f.t_memory_s)
    # eager forwards: what the host issue time adds on top of the GPU time, in each schedule
    host_extra = lambda s: s.t_forward_s - s.t_gpu_forward_s  # noqa: E731
    out["host_issue_s"] = host_extra(tp) - host_extra(spa)
    out["padding_and_other_s"] = out["padding_and_other_s"] + _unfused_sp_ops_delta(sp, spa, L)
    return out


def _whole_gemm(sp, fused_op):
    """t of the whole GEMM a fused op replaces: the SP schedule's GEMM of the same slot (same rows,
    n and k)."""
    return next(o.t_s for o in sp.layer_ops if o.kind == "gemm" and o.slot == fused_op.slot)


def _unfused_sp_ops_delta(sp, spa, L):
    """What the SP schedule runs that SP+AsyncTP does not, beyond the fused ops' collectives and
    GEMMs (and vice versa): the extra all-gather/reduce-scatter counts of MoE blocks and fp8-dynamic
    (s, per forward)."""

    def by_name(s):
        acc = {}
        for o in s.layer_ops:
            if o.fused is None:
                acc[o.name] = acc.get(o.name, 0.0) + o.t_s * o.count
        return acc

    a, b = by_name(sp), by_name(spa)
    fused_names = {
        "qkv_gemm",
        "gate_up_gemm",
        "o_gemm",
        "down_gemm",
        "all_gather",
        "reduce_scatter",
    }
    delta = 0.0
    for name in set(a) | set(b):
        if name in fused_names:
            continue
        delta = delta + L * (a.get(name, 0.0) - b.get(name, 0.0))
    return delta
