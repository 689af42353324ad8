"""The public ops API: every op of the schedules as a time over row counts (§2-§6)."""
# The public ops API: every op of the three schedules as a time over row counts, from one profile.
#
# `model.predict()` composes these into schedules; `evaluate` scores the fused ops against
# measured rows; `costmodel.decide` uses the all-reduce dispatch. Formulas: costmodel.formulas;
# derivations: docs/model.md (section numbers below). Values may be Monte Carlo draw arrays of
# shape (D, 1) that broadcast against row counts of shape (n,).

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from . import formulas as F
from . import vllm_tables
from .defaults import DEFAULT_KERNEL_SM_SHARE
from .errors import TpcostError
from .profile import HardwareProfile
from .shapes import DTYPES, ArTail
from .vllm_tables import KERNEL_TILE_M, KERNEL_TILE_N, Vllm

Arr = F.Arr  # a number or a numpy array (formulas broadcast)


@dataclasses.dataclass(frozen=True)
class DtypeMode:
    """How one vLLM dtype mode moves and computes data (docs/model.md §7); bytes per element."""

    gemm_dtype: str  # which compute.peak_flops_per_s.<x> the quantised GEMMs run at
    act_dtype: str  # peak of unquantised GEMMs (router, lm_head) and attention
    act_bytes: float  # activations, residual stream, GEMM outputs, reduce-scatter partials
    gemm_in_bytes: float  # quantised GEMM inputs and weights
    quant_bytes: float  # what the norm / SiluMul write for the next GEMM
    ag_bytes: float  # what the SP all-gather moves
    ag_gemm_fuses: bool  # AG + GEMM fuses (not with per-token fp8: a quant kernel sits between)


DTYPE_MODES: dict[str, DtypeMode] = {
    "bf16": DtypeMode("bf16", "bf16", 2.0, 2.0, 2.0, 2.0, True),
    "fp8": DtypeMode(
        "fp8", "bf16", 2.0, 1.0, 1.0, 1.0, True
    ),  # static scales: quantised before the AG
    "fp8-dynamic": DtypeMode("fp8", "bf16", 2.0, 1.0, 1.0, 2.0, False),
    "fp32": DtypeMode(
        "fp32", "fp32", 4.0, 4.0, 4.0, 4.0, True
    ),  # CPU calibration runs; not a vLLM mode
}


assert tuple(DTYPE_MODES) == DTYPES, "ops.DTYPE_MODES and shapes.DTYPES name the same dtype modes"


def dtype_mode(dtype: str) -> DtypeMode:
    try:
        return DTYPE_MODES[dtype]
    except KeyError:
        raise TpcostError(
            f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_MODES)}"
        ) from None


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class FusedOp:
    """One fused AsyncTP call: its time and its parts (s, per call, over rows; §6)."""

    t_s: Any  # what the call costs: max(t_gpu_s, t_host_s + t_tail_s) when eager, else t_gpu_s
    t_gpu_s: Any  # GPU critical path
    t_host_s: Any  # host issue time of torch's Python pipeline (0 under CUDA-graph replay)
    t_tail_s: Any  # GPU work left after the last host issue (last chunk GEMM + what follows)
    t_chunks_s: Any  # W chunk GEMMs, each alone (W·g)
    t_chunks_concurrent_s: Any  # W chunk GEMMs on two streams (W·g_c)
    t_chunks_contended_s: Any  # ... slowed by concurrent pulls (W·g_eff)
    t_pulls_s: Any  # (W−1) pulls
    t_sync_s: Any  # barriers
    t_memory_s: Any  # local copies / the exposed partial-sum reduction


class Hw:
    """Profile values pulled out once for the formulas, for one dtype mode (§2)."""

    # Floats or draw arrays. GEMM times are F.t_gemm_s's (tests/test_model.py).

    def __init__(self, p: HardwareProfile, dtype: str):
        mode = dtype_mode(dtype)
        self.p = p
        self.dtype = dtype
        self.mode = mode
        self.act_bytes = mode.act_bytes
        peaks = p.compute.peak_flops_per_s
        self.peak_flops_per_s = getattr(peaks, mode.gemm_dtype)
        # unquantised GEMMs and attention
        self.peak_act_flops_per_s = getattr(peaks, mode.act_dtype)
        self.hbm_bw_bytes_per_s = p.memory.hbm_bw_bytes_per_s
        self.mem_efficiency = p.kernels.mem_efficiency
        self.launch_overhead_s = p.kernels.launch_overhead_s
        g = p.gemm
        self.gemm = dict(
            max_efficiency=g.max_efficiency,
            mem_efficiency=g.mem_efficiency,
            hbm_bw_bytes_per_s=self.hbm_bw_bytes_per_s,
            tile_m=g.tile_m,
            tile_n=g.tile_n,
            sm_count=p.identity.sm_count,
            launch_overhead_s=g.launch_overhead_s,
        )
        self.gemm_in_bytes = mode.gemm_in_bytes

    @property
    def attention_efficiency(self) -> Any:
        """Read only when attention is timed, so --set knows what the model reads (§5)."""
        return self.p.attention.efficiency

    @property
    def asynctp(self) -> dict[str, Any]:
        """The AsyncTP values, read only when a fused op is evaluated (§6)."""
        # So --set knows what the model reads.
        a = self.p.asynctp
        return dict(
            barrier_s=a.barrier_s,
            copy_engine_bw_bytes_per_s=a.copy_engine_bw_bytes_per_s,
            copy_latency_s=a.copy_latency_s,
            compute_slowdown=a.compute_slowdown,
            stream_concurrency=a.stream_concurrency,
            host_op_s=a.host_op_s,
            time_scale=a.time_scale,
            rs_step_exposure=a.rs_step_exposure,
            link_bw_bytes_per_s=self.p.interconnect.link_bw_bytes_per_s,
        )

    # ------------------------------------------------------------------ GEMM (docs §2)
    def _in_bytes(self, fp8_ok: bool) -> float:
        """Bytes per GEMM input element: the dtype mode's (fp8 weights) where the GEMM takes them,
        else activations'."""
        return self.gemm_in_bytes if fp8_ok else self.act_bytes

    def _peak_flops(self, fp8_ok: bool) -> Any:
        """The tensor-core peak the GEMM runs at: the dtype mode's where it takes fp8 inputs, else
        the activations'."""
        return self.peak_flops_per_s if fp8_ok else self.peak_act_flops_per_s

    def t_gemm_mem(self, m: Arr, n: int, k: int, *, fp8_ok: bool = True) -> Arr:
        """Memory-bound time of one GEMM: bytes / (HBM · gemm.mem_efficiency) (s; §2)."""
        b = self._in_bytes(fp8_ok)
        return F.gemm_bytes(m, n, k, b, b, self.act_bytes) / (
            self.hbm_bw_bytes_per_s * self.gemm["mem_efficiency"]
        )

    def t_gemm_comp(self, m: Arr, n: int, k: int, *, fp8_ok: bool = True) -> Arr:
        """Compute time of one GEMM (F.t_gemm_compute_s), without launch (s; §2)."""
        g = self.gemm
        return F.t_gemm_compute_s(
            m,
            n,
            k,
            self._peak_flops(fp8_ok),
            g["max_efficiency"],
            g["tile_m"],
            g["tile_n"],
            g["sm_count"],
        )

    def t_gemm(self, m: Arr, n: int, k: int, *, fp8_ok: bool = True) -> Arr:
        """F.t_gemm_s with this profile's values: launch + max(compute, memory) (s; §2)."""
        t = np.maximum(
            self.t_gemm_comp(m, n, k, fp8_ok=fp8_ok), self.t_gemm_mem(m, n, k, fp8_ok=fp8_ok)
        )
        return np.where(np.asarray(m) > 0, self.gemm["launch_overhead_s"] + t, 0.0)

    def rows(self, n_tok: Arr, divisor: Arr) -> Arr:
        """n_tok / divisor: the rows of one chunk, or of the half a stream pair shares (§6)."""
        return n_tok / divisor

    # ------------------------------------------------------------------ memory-bound kernels (§3)
    def t_mem(self, nbytes: Arr) -> Arr:
        return F.t_memory_bound_s(
            nbytes, self.hbm_bw_bytes_per_s, self.mem_efficiency, self.launch_overhead_s
        )


# ---------------------------------------------------------------------- collectives (§4)


def collective_latency_s(hw: Hw, impl: str, tp: int) -> Arr:
    """α of one collective implementation at this TP (s; §4)."""
    return hw.p.collective(impl, tp)[0]


# regime curves beside an NCCL curve `impl` (calib/nccl_fit.py, calib.fit)
NCCL_REGIMES = (
    "_small",
    "_mid",
)


def nccl_curves(hw: Hw, impl: str, tp: int) -> tuple[list, list]:
    """(latencies s, busBWs B/s) of NCCL's regime curves for `impl` at this TP (§4)."""
    # Its bandwidth curve `impl`, and `impl_small` / `impl_mid` where the profile has them at
    # exactly this TP (one curve where it has no others).
    p = hw.p
    curves = [p.collective(impl, tp)] + [
        p.collective(impl + r, tp) for r in NCCL_REGIMES if tp in p.collective_tps(impl + r)
    ]
    return [c[0] for c in curves], [c[1] for c in curves]


def measured_or_fitted(hw: Hw, impl: str, tp: int, msg_bytes: Arr, fitted) -> Arr:
    """`impl` at this TP: a calibration's measured points where held, else the fit (s; §4)."""
    # `impl` at this TP where the profile holds its measured points (a calibration's log,
    # [measured.<impl>.tp<W>]): between the smallest and the largest measured size, the measurement
    # interpolated linearly in log size and log time (formulas.t_interp_log_s); above the largest,
    # its last point plus the fitted curve's growth beyond it (the measured line extended,
    # continuous and never falling); below the smallest, the fitted curve `fitted(S)`, which the
    # calibration says. Without points: the fitted curve (s). More bytes never take less time: the
    # measured times are read as their running maximum (a point timed faster than a smaller one is
    # noise), and below the smallest point the fitted curve is capped at the smallest measured time
    # (issue 61).
    m = hw.p.measured.get(impl, {}).get(tp)
    t_fit = fitted(msg_bytes)
    if m is None:
        return t_fit
    S = np.asarray(msg_bytes, dtype=float)
    times = np.maximum.accumulate(np.asarray(m.time_s, dtype=float))
    s_lo, s_hi, t_lo, t_hi = m.msg_bytes[0], m.msg_bytes[-1], times[0], times[-1]
    inside = F.t_interp_log_s(np.clip(S, s_lo, s_hi), np.asarray(m.msg_bytes), times)
    above = t_hi + t_fit - fitted(np.full(np.shape(S), s_hi))
    return np.where(S < s_lo, np.minimum(t_fit, t_lo), np.where(S > s_hi, above, inside))


def t_nccl_all_gather_s(hw: Hw, tp: int, msg_bytes: Arr) -> Arr:
    """NCCL all-gather of a msg_bytes gathered message at this TP (s; §4)."""
    # The fastest of its regime curves, or the measured points where a calibration holds them
    # (measured_or_fitted).
    return measured_or_fitted(
        hw,
        "nccl_all_gather",
        tp,
        msg_bytes,
        lambda S: F.t_ring_regimes_s(S, *nccl_curves(hw, "nccl_all_gather", tp), tp),
    )


def t_nccl_reduce_scatter_s(hw: Hw, tp: int, msg_bytes: Arr) -> Arr:
    """NCCL reduce-scatter of a msg_bytes unreduced message at this TP (s; §4)."""
    # The fastest of its regime curves, or the measured points where a calibration holds them
    # (measured_or_fitted).
    return measured_or_fitted(
        hw,
        "nccl_reduce_scatter",
        tp,
        msg_bytes,
        lambda S: F.t_ring_regimes_s(S, *nccl_curves(hw, "nccl_reduce_scatter", tp), tp),
    )


def reduce_scatter_dispatch(
    hw: Hw, msg_bytes: Arr, tp: int, model_level_sp: bool
) -> tuple[Any, Any]:
    """(time s, implementation per size) of the reduce-scatter vLLM runs (§4)."""
    # under model-level SP its custom backends (costmodel.vllm_tables.custom_rs_backend: Lamport,
    # multimem, IPC) where the profile has their curves, else NCCL; the generic reduce_scatter (vLLM
    # <= 0.31's compile-pass SP) always NCCL.
    p = hw.p
    # the NVLS buffer the backends need
    cap, multicast = (
        p.identity.compute_capability,
        has_multicast(p),
    )
    fully = vllm_tables.fully_connected(p.interconnect, tp)
    return _sp_collective(
        hw,
        msg_bytes,
        tp,
        model_level_sp,
        "nccl_reduce_scatter",
        lambda s: vllm_tables.custom_rs_backend(s, tp, cap, multicast, fully),
    )


def all_gather_dispatch(hw: Hw, msg_bytes: Arr, tp: int, model_level_sp: bool) -> tuple[Any, Any]:
    """(time s, implementation per size) of the all-gather vLLM runs for msg_bytes (§4)."""
    # (time s, implementation per size) of the all-gather vLLM runs for a gathered tensor of
    # msg_bytes: under model-level SP its custom all-gather
    # (costmodel.vllm_tables.custom_ag_backend, on the msg_bytes/tp shard) where the profile has its
    # curve, else NCCL; vLLM <= 0.31's compile-pass SP always NCCL.
    p = hw.p
    multicast, fully = has_multicast(p), vllm_tables.fully_connected(p.interconnect, tp)
    return _sp_collective(
        hw,
        msg_bytes,
        tp,
        model_level_sp,
        "nccl_all_gather",
        lambda s: vllm_tables.custom_ag_backend(s / tp, tp, multicast, fully),
    )


def _sp_collective(
    hw: Hw, msg_bytes: Arr, tp: int, model_level_sp: bool, nccl: str, backend
) -> tuple[Any, Any]:
    """One collective of model-level SP: NCCL's time per size, replaced where `backend(size)` names
    a custom implementation the profile has a curve for (an implementation without one keeps
    NCCL's); each priced by its COLLECTIVE_IMPLS entry."""
    msg = np.atleast_1d(np.asarray(msg_bytes, dtype=float))
    p = hw.p
    t0 = COLLECTIVE_IMPLS[nccl].t_s(hw, tp, msg)
    t = np.array(np.broadcast_to(t0, np.broadcast_shapes(np.shape(t0), msg.shape)), dtype=float)
    impls = np.full(msg.shape, nccl, dtype=object)
    if model_level_sp:
        names = np.array([backend(float(s)) or nccl for s in msg], dtype=object)
        for impl in set(names) - {nccl}:
            if tp not in p.collective_tps(impl):
                continue  # no curve for it in this profile: NCCL's stands in
            where = np.flatnonzero(names == impl)
            t[..., where] = COLLECTIVE_IMPLS[impl].t_s(hw, tp, msg[where])
            impls[where] = impl
    return t, impls.astype(str)


def t_nccl_all_reduce_s(hw: Hw, tp: int, msg_bytes: Arr) -> Arr:
    """NCCL all-reduce of a msg_bytes tensor at this TP (s; §4)."""
    # the fastest of the profile's regime curves at exactly this TP
    # (formulas.t_all_reduce_regimes_s), or the one nccl_all_reduce curve where it has no others;
    # the measured points where a calibration holds them (measured_or_fitted).
    return measured_or_fitted(
        hw,
        "nccl_all_reduce",
        tp,
        msg_bytes,
        lambda S: F.t_all_reduce_regimes_s(S, *nccl_curves(hw, "nccl_all_reduce", tp), tp),
    )


class AllReduce(NamedTuple):
    """What all_reduce_dispatch picks over the message sizes (§4)."""

    t_s: Any  # the all-reduce (+ the RMSNorm where fused), per call
    fused: Any  # bool per size: the FlashInfer kernel also did the RMSNorm
    impls: list  # implementation names used, in dispatch order
    latency_s: Any  # α of each size's implementation (for the per-op view)
    tables: str = ""  # the vLLM version whose dispatch tables picked them, with file:line
    # the implementation name at each size (str array, the shape of the sizes)
    impl_per_size: Any = None


def all_reduce_dispatch(
    hw: Hw,
    msg_bytes: Arr,
    tp: int,
    fusion_applies: bool,
    fi_max_bytes: float | None = None,
    *,
    vllm: Vllm,
    cross_host: bool = False,
) -> AllReduce:
    """The all-reduce implementation vLLM picks for each message size, and its time (§4)."""
    # Order as in CudaCommunicator.all_reduce: FlashInfer (fused AR+RMSNorm when the fusion pass
    # applies) ≤ fi limit; quick-reduce (ROCm); custom AR < its max (1-stage below the 1-stage
    # limit); torch symm-mem ≤ its max; else (Py)NCCL. `fi_max_bytes` overrides the FlashInfer limit
    # (0 = off). The limits are vLLM's own for this GPU and version (costmodel.vllm_tables.dispatch;
    # a Vllm carries --vllm-set's changes). `cross_host`: the group spans hosts of one NVLink domain
    # (an NVL72's trays), where the IPC custom all-reduce steps aside (mnnvl_only, the release's
    # notes).
    p = hw.p
    d = vllm_tables.dispatch(vllm, p.identity, p.interconnect, tp)
    msg_bytes = np.asarray(msg_bytes, dtype=float)
    fi_max = d.fi_fusion_max_bytes
    if fi_max_bytes is not None and fi_max is not None:
        fi_max = fi_max_bytes
    choices = []  # (mask, impl, fused)
    remaining = np.ones(np.shape(msg_bytes), dtype=bool)
    if fi_max is not None and p.has_collective("flashinfer_ar_rmsnorm"):
        m = msg_bytes <= fi_max
        one_max = d.fi_oneshot_max_bytes
        one = msg_bytes <= (fi_max if one_max is None else one_max)
        choices.append((m & one, "flashinfer_ar_rmsnorm", fusion_applies))
        if p.has_collective("flashinfer_ar_rmsnorm_twoshot"):
            choices.append((m & ~one, "flashinfer_ar_rmsnorm_twoshot", fusion_applies))
        remaining &= ~m
    qr_max = d.quick_reduce_max_bytes
    if qr_max is not None and p.has_collective("quick_reduce"):
        m = remaining & (msg_bytes <= qr_max)
        choices.append((m, "quick_reduce", False))
        remaining &= ~m
    ca_max = None if cross_host else d.custom_ar_max_bytes
    if ca_max is not None and p.has_collective("custom_ar_2stage"):
        one = d.custom_ar_1stage_max_bytes or 0
        m1 = remaining & (msg_bytes < ca_max) & (msg_bytes < one)
        m2 = remaining & (msg_bytes < ca_max) & ~m1
        if one:
            choices.append((m1, "custom_ar_1stage", False))
        choices.append((m2, "custom_ar_2stage", False))
        remaining &= ~(m1 | m2)
    sm_max = d.symm_mem_max_bytes
    if sm_max is not None:
        impl = "symm_mem_" + (d.symm_mem_algo or "two_shot")
        if p.has_collective(impl):
            m = remaining & (msg_bytes <= sm_max)
            choices.append((m, impl, False))
            remaining &= ~m
    choices.append((remaining, "nccl_all_reduce", False))
    params = {impl: p.collective(impl, tp) for _, impl, _ in choices}
    shape = np.broadcast_shapes(
        np.shape(msg_bytes), *(np.shape(v) for lb in params.values() for v in lb)
    )
    t = np.zeros(shape)
    lat_out = np.zeros(shape)
    fused = np.zeros(np.shape(msg_bytes), dtype=bool)
    names = np.empty(np.shape(msg_bytes), dtype=object)
    used = []
    for mask, impl, is_fused in choices:
        where = np.flatnonzero(mask)
        if not where.size:
            continue
        lat, bw = params[impl]
        sizes = msg_bytes.ravel()[where] if msg_bytes.ndim else msg_bytes
        t[..., where] = COLLECTIVE_IMPLS[impl].t_s(hw, tp, sizes)
        lat_out[..., where] = lat
        fused.ravel()[where] = is_fused
        names.ravel()[where] = impl
        used.append(impl)
    return AllReduce(t, fused, used, lat_out, vllm_tables.citations(vllm), names.astype(str))


@dataclasses.dataclass(frozen=True)
class CollectiveImpl:
    """One collective implementation a profile times: its collective and its time (§4)."""

    # NCCL's from its regime curves or a calibration's measured points, the others' from their one
    # α-β curve.

    name: str
    collective: str  # all_reduce | all_gather | reduce_scatter (formulas.COLLECTIVES)
    t_nccl: Callable[[Hw, int, Arr], Arr] | None = None  # NCCL's own time; None: the α-β curve

    def t_s(self, hw: Hw, tp: int, msg_bytes: Arr) -> Arr:
        """One call on msg_bytes at this TP (s; §4)."""
        if self.t_nccl is not None:
            return self.t_nccl(hw, tp, msg_bytes)
        lat, bw = hw.p.collective(self.name, tp)
        return _ALPHA_BETA[self.collective](msg_bytes, lat, bw, tp)


@dataclasses.dataclass(frozen=True)
class CollectiveKind:
    """One collective as vLLM dispatches it: NCCL's implementation and vLLM's picks (§4)."""

    # `dispatch`: (hw, msg, tp, model_level_sp, vllm) -> (time s, implementation per size).

    name: str
    nccl: str
    dispatch: Callable[..., tuple[Any, Any]]

    def t_nccl_s(self, hw: Hw, tp: int, msg_bytes: Arr) -> Arr:
        """NCCL's own time for it (s; §4)."""
        return COLLECTIVE_IMPLS[self.nccl].t_s(hw, tp, msg_bytes)


_ALPHA_BETA = {
    "all_reduce": F.t_all_reduce_s,
    "all_gather": F.t_all_gather_s,
    "reduce_scatter": F.t_reduce_scatter_s,
}


def _ar_dispatch(hw: Hw, msg: Arr, tp: int, model_level_sp: bool, vllm: Vllm) -> tuple[Any, Any]:
    """vLLM's plain all-reduce (no norm to fuse) as a CollectiveKind's dispatch."""
    ar = plain_all_reduce(hw, msg, tp, vllm=vllm)
    return np.asarray(ar.t_s, dtype=float), ar.impl_per_size


# One entry per implementation a profile may time: a new one is one line here (and its curve in
# the profiles), its choice by vLLM in costmodel.vllm_tables.
COLLECTIVE_IMPLS = {
    c.name: c
    for c in (
        CollectiveImpl("nccl_all_reduce", "all_reduce", t_nccl_all_reduce_s),
        CollectiveImpl("nccl_all_gather", "all_gather", t_nccl_all_gather_s),
        CollectiveImpl("nccl_reduce_scatter", "reduce_scatter", t_nccl_reduce_scatter_s),
        *(
            CollectiveImpl(name, "all_reduce")
            for name in (
                "custom_ar_1stage",
                "custom_ar_2stage",
                "quick_reduce",
                "symm_mem_multimem",
                "symm_mem_two_shot",
                "flashinfer_ar_rmsnorm",
                "flashinfer_ar_rmsnorm_twoshot",
            )
        ),
        *(
            CollectiveImpl(name, "reduce_scatter")
            for name in ("custom_rs_lamport", "custom_rs_multimem", "custom_rs_ipc")
        ),
        *(CollectiveImpl(name, "all_gather") for name in ("custom_ag_lamport", "custom_ag_ipc")),
    )
}
COLLECTIVE_KINDS = {
    "all_reduce": CollectiveKind("all_reduce", "nccl_all_reduce", _ar_dispatch),
    "reduce_scatter": CollectiveKind(
        "reduce_scatter",
        "nccl_reduce_scatter",
        lambda hw, msg, tp, sp, vllm: reduce_scatter_dispatch(hw, msg, tp, sp),
    ),
    "all_gather": CollectiveKind(
        "all_gather",
        "nccl_all_gather",
        lambda hw, msg, tp, sp, vllm: all_gather_dispatch(hw, msg, tp, sp),
    ),
}


# ---------------------------------------------------------------------- AsyncTP (§6)


def fused_ops_available(profile: HardwareProfile, tp: int) -> str | None:
    """None if torch's symmetric-memory fused ops can run at this TP, else why not (§6)."""
    # Symmetric memory maps peer HBM over NVLink/xGMI: all ranks must share one interconnect domain.
    domain = int(profile.interconnect.domain_size)
    if tp > domain:
        return (
            f"SP+AsyncTP not available at tp={tp} on {profile.name} ({domain} GPUs per "
            f"{'NVLink' if profile.identity.vendor == 'nvidia' else 'interconnect'} domain; "
            "symmetric memory cannot span nodes)"
        )
    if tp < 2:
        return "SP+AsyncTP needs tp >= 2"
    return None


def _chunk_gemms(hw: Hw, a: dict, m_c, n, k, W, t_pull_one_s, t_whole_s):
    """(g, g_c, g_eff) of one chunk GEMM of m_c rows: alone, on two streams, and slowed by the W−1
    pulls.

    W chunks never cost less than the whole GEMM (W·g ≥ t_whole: the same FLOPs and at least the
    same bytes; the tile model alone can round a chunk below its share)."""
    g = np.maximum(hw.t_gemm(m_c, n, k), t_whole_s / W)
    m2 = hw.rows(m_c, 0.5)
    g_c = F.t_chunk_concurrent_s(
        hw.t_gemm_mem(m_c, n, k),
        hw.t_gemm_comp(m_c, n, k),
        hw.t_gemm_comp(m2, n, k),
        hw.gemm["launch_overhead_s"],
        a["stream_concurrency"],
    )
    g_c = np.minimum(g_c, g)  # a second stream never slows a chunk down
    frac = F.overlapped_fraction((W - 1) * t_pull_one_s, W * g_c)
    return g, g_c, g_c * (1.0 + a["compute_slowdown"] * frac)


def _with_model_error(
    a: dict, t_gpu: Arr, t_host: Arr, t_tail: Arr, floor: Arr
) -> tuple[Arr, Arr, Arr]:
    """(GPU, host, tail) time of a torch fused op × the model error asynctp.time_scale (1 as
    modelled; its σ widens every band, calib/band.py), the GPU time never below `floor`, what
    overlap allows: the whole GEMM or the W−1 pulls, whichever is longer (s)."""
    ts = a["time_scale"]
    return np.maximum(ts * t_gpu, floor), ts * t_host, ts * t_tail


def fused_ag_gemm(hw: Hw, m: Arr, n: int, k: int, tp: int, a_bytes: float, eager: bool) -> FusedOp:
    """torch's fused_all_gather_matmul (return_A=True) on m gathered rows (§6)."""
    # _pipelined_all_gather_and_consume.
    a = hw.asynctp
    W = tp
    m_c = hw.rows(m, W)
    p = F.t_pull_s(
        m_c * (k * a_bytes),
        a["copy_engine_bw_bytes_per_s"],
        a["link_bw_bytes_per_s"],
        a["copy_latency_s"],
    )
    t_whole = hw.t_gemm(m, n, k)
    g, g_c, g_eff = _chunk_gemms(hw, a, m_c, n, k, W, p, t_whole)
    t_copy = hw.t_mem(m_c * (2.0 * k * a_bytes))  # local shard -> symmetric buffer (read + write)
    t_gpu, t_host, t_tail = _with_model_error(
        a,
        F.t_ag_gemm_gpu_s(W, g, g_eff, t_whole, p, t_copy, a["barrier_s"]),
        F.host_ops_ag_gemm(W) * a["host_op_s"] if eager else 0.0,
        g_eff + a["barrier_s"],  # the tail: the last chunk GEMM, the join and the closing barrier
        np.maximum(t_whole, (W - 1) * p),
    )
    t = F.t_eager_s(t_gpu, t_host, t_tail) if eager else t_gpu
    return FusedOp(
        t,
        t_gpu,
        t_host,
        t_tail,
        W * g,
        W * g_c,
        W * g_eff,
        (W - 1) * p,
        3.0 * a["barrier_s"],
        t_copy + np.maximum(0.0, t_copy - g_eff),
    )


def fused_gemm_rs(hw: Hw, m: Arr, n: int, k: int, tp: int, eager: bool) -> FusedOp:
    """torch's fused_matmul_reduce_scatter on m rows (§6)."""
    # _pipelined_produce_and_all2all, then the partial sum.
    a = hw.asynctp
    W = tp
    m_c = hw.rows(m, W)
    # partials bf16 even for fp8
    p = F.t_pull_s(
        m_c * (n * hw.act_bytes),
        a["copy_engine_bw_bytes_per_s"],
        a["link_bw_bytes_per_s"],
        a["copy_latency_s"],
    )
    t_whole = hw.t_gemm(m, n, k)
    g, g_c, g_eff = _chunk_gemms(hw, a, m_c, n, k, W, p, t_whole)
    t_red = hw.t_mem(F.reduction_bytes(m, n, hw.act_bytes, W))
    t_gpu, t_host, t_tail = _with_model_error(
        a,
        F.t_gemm_rs_gpu_s(W, g, g_eff, t_whole, p, t_red, a["barrier_s"], a["rs_step_exposure"]),
        F.host_ops_gemm_rs(W) * a["host_op_s"] if eager else 0.0,
        g_eff
        + a["barrier_s"]
        + t_red,  # the tail: the local chunk GEMM, the closing barrier, the reduction
        np.maximum(t_whole, (W - 1) * p),
    )
    t = F.t_eager_s(t_gpu, t_host, t_tail) if eager else t_gpu
    return FusedOp(
        t,
        t_gpu,
        t_host,
        t_tail,
        W * g,
        W * g_c,
        W * g_eff,
        (W - 1) * p,
        2.0 * W * a["barrier_s"],
        t_red,
    )


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class TorchPair:
    """torch's pipelined fused op against its sequential arm, over m rows (s; §6)."""

    fused_eager_s: (
        Any  # issued from Python per call: the benchmarks, and vLLM above its CUDA-graph size
    )
    fused_graph_s: Any  # under CUDA-graph replay: no host issue time
    unfused_s: Any  # the GEMM, then the collective
    unfused_impl: str  # "nccl_all_gather" | "nccl_reduce_scatter", or the first of unfused_impls
    # the collective's implementation per row (str array; model-level SP's dispatch)
    unfused_impls: Any = None


TORCH_BASELINES = ("nccl", "vllm_sp")


def torch_pair(
    hw: Hw, op: str, m: Arr, n: int, k: int, tp: int, baseline: str = "nccl"
) -> TorchPair:
    """The one predictor of torch's fused AG+GEMM or GEMM+RS against its sequential arm (§6)."""
    # The one predictor of torch's fused all-gather+GEMM ("ag_gemm") or GEMM+reduce-scatter
    # ("gemm_rs") against its sequential arm (tpcost op, vllm-config, evaluate); `hw` carries the
    # dtype mode (the all-gathered operand's bytes). `baseline` "nccl": the collective is NCCL's
    # (the benchmarks; vLLM <= 0.31's compile-pass SP); "vllm_sp": the one model-level SP dispatches
    # (sp_all_gather / sp_reduce_scatter: vLLM's custom backends where the profile times them, else
    # NCCL), the arm vLLM >= 0.34's sp_all_gather_matmul replaces.
    if baseline not in TORCH_BASELINES:
        raise TpcostError(
            f"torch_pair: baseline {baseline!r} is not one of {', '.join(TORCH_BASELINES)}"
        )
    if op != "ag_gemm" and op != "gemm_rs":  # the two pipelines this predictor times
        raise TpcostError(
            f"torch has no fused {op!r} (its pipelines: all-gather+GEMM, GEMM+reduce-scatter)"
        )
    ag = op == "ag_gemm"
    f = (
        fused_ag_gemm(hw, m, n, k, tp, hw.mode.ag_bytes, eager=True)
        if ag
        else fused_gemm_rs(hw, m, n, k, tp, eager=True)
    )
    if baseline == "nccl":
        u = (
            sequential_ag_gemm_s(hw, m, n, k, tp, hw.mode.ag_bytes)
            if ag
            else sequential_gemm_rs_s(hw, m, n, k, tp)
        )
        impl = "nccl_all_gather" if ag else "nccl_reduce_scatter"
        return TorchPair(f.t_s, f.t_gpu_s, u, impl, np.full(np.shape(m), impl))
    rows = np.asarray(m, dtype=float)
    coll, impls = (
        all_gather_dispatch(hw, rows * (k * hw.mode.ag_bytes), tp, True)
        if ag
        else reduce_scatter_dispatch(hw, rows * (n * hw.act_bytes), tp, True)
    )
    impls = np.asarray(impls)
    return TorchPair(f.t_s, f.t_gpu_s, hw.t_gemm(m, n, k) + coll, str(impls.ravel()[0]), impls)


def sequential_ag_gemm_s(hw: Hw, m: Arr, n: int, k: int, tp: int, a_bytes: float) -> Arr:
    """What AG+GEMM replaces: NCCL all-gather of m·k·b_A, then the whole GEMM (s; §6)."""
    return t_nccl_all_gather_s(hw, tp, m * (k * a_bytes)) + hw.t_gemm(m, n, k)


def sequential_gemm_rs_s(hw: Hw, m: Arr, n: int, k: int, tp: int) -> Arr:
    """What GEMM+RS replaces: the whole GEMM, then NCCL reduce-scatter of m·n partials (s; §6)."""
    return hw.t_gemm(m, n, k) + t_nccl_reduce_scatter_s(hw, tp, m * (n * hw.act_bytes))


# --------------------------------------------------------------------------------------------------
# The single-kernel family (docs/model.md §6b): vLLM 0.33's CuTe gemm_rs_ar, FlashInfer's CuTe
# GEMM+RS


def kernel_unpriceable(profile: HardwareProfile) -> str | None:
    """Why this profile cannot price the single kernel at all, else None (§6b)."""
    # No multicast, or no [fused_kernel] terms.
    if not has_multicast(profile):
        cc = profile.identity.compute_capability
        return (
            f"no single-kernel fused GEMM+collective on {profile.name} (cc {cc or 'n/a'}): it "
            "needs NVLink multicast (NVLS) over NVSwitch, which this profile does not have"
        )
    if profile.fused_kernel is None:
        return (
            f"no single-kernel fused GEMM+collective on {profile.name}: the profile has NVLink "
            "multicast but no [fused_kernel] terms to price the kernel with"
        )
    return None


def kernel_available(
    profile: HardwareProfile, tp: int, dtype: str = "bf16", n: int | None = None
) -> str | None:
    """None if a single-kernel GEMM+RS/AR of vLLM's design can run here, else why not (§6b)."""
    # None if a single-kernel fused GEMM+RS/AR of vLLM's design can run here, else why not (one
    # line): NVLink multicast inside one domain (interconnect.multicast), the kernel's terms
    # ([fused_kernel]) and vLLM's shape gate (costmodel.vllm_tables.kernel_gate). Whether vLLM ships
    # it on this GPU is kernel_shipped().
    why = kernel_unpriceable(profile) or vllm_tables.kernel_gate(dtype, tp)
    if why:
        return why
    if tp > int(profile.interconnect.domain_size):
        return (
            f"tp={tp} spans more than one NVLink domain "
            f"({int(profile.interconnect.domain_size)} GPUs)"
        )
    return vllm_tables.kernel_gate(dtype, tp, n)


def kernel_shipped(profile: HardwareProfile) -> str | None:
    """None if vLLM ships gemm_rs_ar on this GPU (the SM100 family), else a note (§6b)."""
    # Elsewhere the prediction is what a multimem kernel of its design would do
    # (vllm_tables.kernel_ships_on).
    cc = profile.identity.compute_capability
    if vllm_tables.kernel_ships_on(cc):
        return None
    return (
        f"not shipped by vLLM on this GPU ({profile.name}, cc {cc or 'n/a'}): vLLM's gemm_rs_ar "
        "runs on the SM100 "
        "family only; this is what a multimem kernel of its design would do here"
    )


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class KernelOp:
    """One single-kernel GEMM+RS / GEMM+AR call and the terms that explain it (over rows; §6b)."""

    # the call: (t_fixed_s + the wave pipeline (+ exposure) + t_copy_s) x the model error time_scale
    # (1)
    t_s: Any
    t_gemm_s: Any  # the whole GEMM alone (§2)
    t_comm_s: Any  # the multimem traffic at the reached multicast bandwidth
    tiles: Any  # output tiles (128 × 128)
    ctas: Any  # persistent CTAs: min(tiles, SMs)
    waves: Any  # ceil(tiles / SMs): one wave cannot overlap its own communication
    multicast_bw_bytes_per_s: Any  # min(η·link, CTAs·q/λ)
    egress_bytes: Any  # per rank into the switch
    ingress_bytes: Any  # per rank out of the switch
    t_fixed_s: Any  # launch, flags, exit barrier (+ GEMM+AR's system-scope fence)
    t_copy_s: Any  # GEMM+AR's partial[:M].clone() (0 for GEMM+RS)

    @property
    def bound(self) -> Any:
        """'link' where the multimem traffic is the longer side, else 'gemm' (per row; §6b)."""
        return np.where(self.t_comm_s >= self.t_gemm_s, "link", "gemm")


def sm_share_hw(hw: Hw, share: float) -> Hw:
    """`hw` with a share of its SMs; HBM and links unchanged (§6b "the kernel's SM share")."""
    # floor(share·SMs) SMs at the same per-SM rate; the rest held back for concurrent work.
    if not 0.0 < share <= 1.0:
        raise TpcostError(f"SM share {share!r} is not in (0, 1]")
    if share == 1.0:
        return hw
    import copy

    sms = int(hw.gemm["sm_count"])
    mine = max(1, int(np.floor(share * sms)))
    # the profile itself untouched (it may be a band's draws or a recording copy)
    out = copy.copy(hw)
    out.gemm = {**hw.gemm, "sm_count": mine}
    out.peak_flops_per_s = hw.peak_flops_per_s * (mine / sms)
    out.peak_act_flops_per_s = hw.peak_act_flops_per_s * (mine / sms)
    return out


def fused_kernel(
    hw: Hw, op: str, m: Arr, n: int, k: int, tp: int, sm_share: float = DEFAULT_KERNEL_SM_SHARE
) -> KernelOp:
    """One single-kernel fused GEMM+RS ("gemm_rs") or GEMM+AR ("gemm_ar") on m rows (§6b)."""
    # One single-kernel fused GEMM+RS (op "gemm_rs") or GEMM+AR ("gemm_ar") on m rows
    # (formulas.t_fused_kernel_s, docs/model.md §6b): its tiles in waves over the SMs, each wave's
    # multimem traffic beside the next wave's GEMM at the multicast bandwidth its CTAs keep in
    # flight; GEMM+AR ends with a clone of its output, one more m·n copy in HBM (the design:
    # costmodel.vllm_tables). `sm_share`: the kernel runs on that share of the SMs (sm_share_hw).
    fk = hw.p.fused_kernel
    if fk is None:
        raise TpcostError(kernel_available(hw.p, tp) or "no fused kernel")
    hw = sm_share_hw(hw, sm_share)
    ar = op == "gemm_ar"
    t_whole = hw.t_gemm(m, n, k)
    tiles = F.kernel_tiles(m, n, KERNEL_TILE_M, KERNEL_TILE_N)
    sms = hw.gemm["sm_count"]
    ctas = np.minimum(tiles, sms)
    waves = F.kernel_waves(tiles, sms)
    inflight = fk.inflight_scale * F.kernel_inflight_bytes(
        m, KERNEL_TILE_M, KERNEL_TILE_N, hw.act_bytes
    )
    bw = F.multicast_bw_bytes_per_s(
        ctas,
        inflight,
        fk.multicast_latency_s,
        hw.p.interconnect.link_bw_bytes_per_s,
        fk.link_efficiency,
    )
    egress = F.kernel_egress_bytes(m, n, hw.act_bytes, tp, ar)
    ingress = F.kernel_ingress_bytes(m, n, hw.act_bytes, tp, ar)
    t_comm = np.maximum(egress, ingress) / bw
    fixed = fk.fixed_s + (fk.ar_fence_s if ar else 0.0)
    t = F.t_fused_kernel_s(t_whole, t_comm, waves, fixed, fk.compute_overhead, fk.exposed_fraction)
    t_copy = hw.t_mem(2.0 * m * n * hw.act_bytes) if ar else 0.0
    # never below max(g, L)
    t_call = np.maximum(fk.time_scale * (t + t_copy), np.maximum(t_whole, t_comm))
    return KernelOp(t_call, t_whole, t_comm, tiles, ctas, waves, bw, egress, ingress, fixed, t_copy)


class KernelPair(NamedTuple):
    """One fused GEMM+RS/AR kernel against the path it replaces, over rows (s; §6b)."""

    fused_s: Any  # the kernel (+ MXFP8's activation-quantise kernel)
    unfused_s: Any  # the GEMM, then the collective
    unfused_impls: Any  # the collective's implementation per row (str array)
    kernel: KernelOp


@dataclasses.dataclass(frozen=True)
class KernelGemm:
    """One GEMM the single kernel fuses with its collective, at its call site (§6b)."""

    # the op, the GEMM (n, per-rank k) at `tp`, the weights' format and whether vLLM's residual-add
    # RMSNorm follows (a model's GEMM+AR call site).

    op: str  # gemm_rs | gemm_ar
    n: int
    k: int
    tp: int
    weights: str = "bf16"  # bf16 | mxfp8
    norm_after: bool = False
    sm_share: float = DEFAULT_KERNEL_SM_SHARE  # the kernel's share of the SMs (the rest held back)


def kernel_pair(
    hw: Hw,
    gemm: KernelGemm,
    m: Arr,
    *,
    vllm: Vllm,
    baseline: str = "vllm",
    fi_max_bytes: float | None = None,
) -> KernelPair:
    """The one predictor of the single kernel against its unfused arm (§6b)."""
    # The one predictor of the single kernel against its unfused arm (tpcost op, vllm-config,
    # evaluate, the fits). `weights` "mxfp8": the kernel quantises its activations first (m·k·(b+1)
    # bytes; costmodel.vllm_tables); `hw` carries the GEMM's dtype mode. `baseline` "vllm":
    # GEMM+AR's collective is vLLM's dispatched all-reduce, "nccl": NCCL's; GEMM+RS's is vLLM's
    # model-level-SP reduce-scatter (its custom backends, reduce_scatter_dispatch) or NCCL's.
    # `norm_after` (GEMM+AR at a model's call site): both arms end with vLLM's residual-add RMSNorm;
    # the unfused arm runs it inside FlashInfer's fused all-reduce+RMSNorm where vLLM's pass fuses
    # (messages <= `fi_max_bytes`, None: vLLM's table), the kernel arm alone, since the kernel's
    # all-reduce is invisible to the fusion pass.
    op, n, k, tp, weights, norm_after = (
        gemm.op,
        gemm.n,
        gemm.k,
        gemm.tp,
        gemm.weights,
        gemm.norm_after,
    )
    m = np.atleast_1d(np.asarray(m, dtype=float))
    kern = fused_kernel(hw, op, m, n, k, tp, gemm.sm_share)
    fused = kern.t_s + (hw.t_mem(m * k * (hw.act_bytes + 1.0)) if weights == "mxfp8" else 0.0)
    msg = m * (n * hw.act_bytes)
    norm = op == "gemm_ar" and norm_after
    t_norm = hw.t_mem(F.rms_norm_bytes(m, n, hw.act_bytes, hw.mode.quant_bytes)) if norm else 0.0
    # the kernel runs under model-level SP: vLLM's unfused path is sp_reduce_scatter
    if op == "gemm_rs":
        coll, impls = reduce_scatter_dispatch(hw, msg, tp, model_level_sp=baseline == "vllm")
    elif baseline == "vllm":
        ar = all_reduce_dispatch(
            hw, msg, tp, norm, fi_max_bytes=fi_max_bytes if norm else 0, vllm=vllm
        )
        coll, impls = ar.t_s + np.where(ar.fused, 0.0, t_norm), ar.impl_per_size
    else:
        coll, impls = t_nccl_all_reduce_s(hw, tp, msg) + t_norm, np.full(m.shape, "nccl_all_reduce")
    return KernelPair(fused + t_norm, hw.t_gemm(m, n, k) + coll, impls, kern)


def unfused_all_reduce_norm_s(hw: Hw, rows: Arr, hidden: int, tp: int, *, vllm: Vllm) -> Arr:
    """The all-reduce + RMSNorm unit without FlashInfer's fusion (s; §4)."""
    # vLLM's next all-reduce for rows·H activations, then the RMSNorm kernel (§3); the one home of
    # this unit outside the schedules.
    t_ar = plain_all_reduce(hw, rows * (hidden * hw.act_bytes), tp, vllm=vllm).t_s
    return t_ar + hw.t_mem(F.rms_norm_bytes(rows, hidden, hw.act_bytes, hw.mode.quant_bytes))


def plain_all_reduce(
    hw: Hw, msg_bytes: Arr, tp: int, *, vllm: Vllm, cross_host: bool = False
) -> AllReduce:
    """vLLM's all-reduce with no norm to fuse: its dispatch without FlashInfer (§4)."""
    # tensor_model_parallel_all_reduce.
    return all_reduce_dispatch(
        hw, msg_bytes, tp, False, fi_max_bytes=0, vllm=vllm, cross_host=cross_host
    )


def has_multicast(profile: HardwareProfile) -> bool:
    """The GPUs of one domain share an NVLink multicast (NVLS) address space (§6b)."""
    # interconnect.multicast.
    return bool(int(profile.interconnect.multicast))


# --------------------------------------------------------------------------------------------------
# A fused all-reduce with a tail (docs/model.md §4b): vLLM 0.34's MoE finalize + all-reduce kernels


class ArTailPair(NamedTuple):
    """The fused kernel against its unfused arm, per call over token counts (s; §4b)."""

    # With the terms that decide.

    fused_s: Any
    unfused_s: Any
    t_oneshot_s: Any  # the one-shot Lamport all-reduce (+ norm) the fused kernel is built on
    t_tail_s: Any  # the fused kernel's bytes beyond it (the routed rows) and its extra launches
    t_finalize_s: (
        Any  # unfused: the finalize kernel (reads the routed rows, writes one row per token)
    )
    t_add_s: Any  # unfused: + the shared-expert row
    t_all_reduce_s: Any  # unfused: vLLM's all-reduce (+ norm where FlashInfer fuses it)
    t_norm_s: Any  # unfused: the norm where FlashInfer does not fuse it
    t_quant_s: Any  # unfused: the MXFP8 quantisation of the next GEMM's input
    unfused_impl: Any  # the all-reduce implementation of the unfused arm at each size


def ar_tail_pair(
    hw: Hw, tail: ArTail, n: Arr, tp: int, *, vllm: Vllm, cross_host: bool = False
) -> ArTailPair:
    """Fused MoE finalize + one-shot all-reduce against its unfused arm (s per call; §4b)."""
    # The fused finalize + one-shot all-reduce kernel against finalize, [add,] all-reduce[+norm][,
    # quant] (s per call; docs/model.md §4b). The fused kernel does at least the one-shot all-reduce
    # of n·H·b (the profile's flashinfer_ar_rmsnorm, Lamport one-shot), plus the routed rows it
    # reads beyond that curve's own input.
    n = np.atleast_1d(np.asarray(n, dtype=float))
    h, b, rho = tail.hidden, hw.act_bytes, tail.routed_rows
    msg = n * (h * b)
    lat, bw = hw.p.collective("flashinfer_ar_rmsnorm", tp)
    t_one = F.t_all_reduce_s(msg, lat, bw, tp)
    extra = F.moe_finalize_bytes(n, rho + float(tail.shared_row), h, b, 0.0) - msg
    t_tail = (
        np.maximum(extra, 0.0) / (hw.hbm_bw_bytes_per_s * hw.mem_efficiency)
        + (tail.fused_kernels - 1) * hw.launch_overhead_s
    )
    t_fin = hw.t_mem(F.moe_finalize_bytes(n, rho, h, b, b))
    t_add = hw.t_mem(F.add_bytes(n, h, b)) if tail.shared_row else 0.0 * n
    ar = (
        all_reduce_dispatch(hw, msg, tp, True, vllm=vllm, cross_host=cross_host)
        if tail.norm
        else plain_all_reduce(hw, msg, tp, vllm=vllm, cross_host=cross_host)
    )
    t_norm = (
        np.where(ar.fused, 0.0, hw.t_mem(F.rms_norm_bytes(n, h, b, b))) if tail.norm else 0.0 * n
    )
    t_quant = hw.t_mem(F.mxfp8_quant_bytes(n, h, b)) if tail.mxfp8_out else 0.0 * n
    return ArTailPair(
        t_one + t_tail,
        t_fin + t_add + ar.t_s + t_norm + t_quant,
        t_one,
        t_tail,
        t_fin,
        t_add,
        ar.t_s,
        t_norm,
        t_quant,
        ar.impl_per_size,
    )


# --------------------------------------------------------------------------------------------------
# The Hopper P2P kernels (docs/model.md §6c): put / ring designs without multimem, fitted by
# calib/p2p_fit.py

P2P_PUT_CHUNKS = 64.0  # a put overlaps many tiles: P -> max(g', L)


@dataclasses.dataclass(frozen=True)
class P2pKernel:
    """One fused GEMM+collective kernel without multimem: its design and its terms (§6c)."""

    ring: bool  # a ring: W−1 transfers, one shard a step; else a put: one transfer, many tiles
    link_efficiency: (
        float  # η: the share of the per-direction NVLink peak its transfers reach (the hardware's)
    )
    step_latency_s: float  # λ: per transfer (the hardware's)
    fixed_s: float  # c: per call
    compute_overhead: float  # φ: the GEMM time lost to the communicating SMs
    exposed_fraction: float  # α: the share of the overlap the design gives up


def t_p2p_fused_s(hw: Hw, kern: P2pKernel, op: str, m: Arr, n: int, k: int, tp: int) -> Arr:
    """t = c + P + α·(g' + L − P) of one P2P kernel over m rows (s; §6c)."""
    # formulas.t_fused_kernel_s, L the collective's (W−1)/W·S over the links at η·peak plus one λ
    # per step.
    g = hw.t_gemm(m, n, k)
    link = hw.p.interconnect.link_bw_bytes_per_s
    steps_latency = (tp - 1 if kern.ring else 1) * kern.step_latency_s
    t_coll = F.t_all_gather_s if op == "ag_gemm" else F.t_reduce_scatter_s
    msg = m * ((k if op == "ag_gemm" else n) * hw.act_bytes)
    comm = t_coll(msg, steps_latency, kern.link_efficiency * link, tp)
    chunks = float(tp) if kern.ring else P2P_PUT_CHUNKS
    return F.t_fused_kernel_s(
        g, comm, chunks, kern.fixed_s, kern.compute_overhead, kern.exposed_fraction
    )
