"""The three schedules of a transformer layer (tp, sp, sp_asynctp) as vLLM 0.31 runs them.

Every op is a vectorised time over token counts N. Formulas: costmodel.formulas; derivation and
sources: docs/model.md. Param values may be arrays of Monte Carlo draws (shape (D, 1)) that
broadcast against N (shape (n,)).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from . import formulas as F
from .errors import TpcostError
from .profile import HardwareProfile
from .shapes import ModelShape, check_dtype

SCHEDULES = ("tp", "sp", "sp_asynctp")
ACT_BYTES = 2.0  # bf16 activations, residual stream and GEMM outputs in every vLLM dtype mode (fp32: 4)
BREAKDOWN_KEYS = ("overlap_gain_s", "chunking_loss_s", "concurrency_recovery_s", "contention_s",
                  "barrier_latency_s", "norm_saving_s", "collective_change_s", "padding_and_other_s")


@dataclasses.dataclass(frozen=True)
class Op:
    """One timed op of a schedule: per-call time (s) and how many times it runs per forward.

    `t_s` is over the token counts N, or — for `padded` ops of the SP schedules — over the schedule's
    `padded_tokens` (the distinct ⌈N/tp⌉·tp); `Schedule.t_layer_s`/`t_forward_s` are always over N."""

    name: str
    kind: str  # gemm | fused | comm | memory | attention
    t_s: Any
    count: int = 1
    padded: bool = False


@dataclasses.dataclass(frozen=True)
class Schedule:
    name: str
    layer_ops: tuple[Op, ...]
    nonlayer_ops: tuple[Op, ...]
    num_layers: int
    padded_tokens: Any = None  # distinct padded counts the padded ops are evaluated on
    padded_index: Any = None  # N -> position in padded_tokens (None: padded ops are already over N)

    def _split_sum(self, ops):
        padded = sum(op.t_s * op.count for op in ops if op.padded)
        return padded, sum(op.t_s * op.count for op in ops if not op.padded)

    def _expand(self, a):
        return gather(a, self.padded_index)

    @functools.cached_property
    def t_layer_s(self):
        padded, plain = self._split_sum(self.layer_ops)
        return self._expand(padded) + plain

    @functools.cached_property
    def t_forward_s(self):
        lp, lq = self._split_sum(self.layer_ops)
        npd, nq = self._split_sum(self.nonlayer_ops)
        return self._expand(self.num_layers * lp + npd) + self.num_layers * lq + nq


@dataclasses.dataclass(frozen=True)
class Prediction:
    """Per-op times of the three schedules over `num_tokens`, and the difference breakdown (per forward)."""

    num_tokens: np.ndarray
    tp: int
    dtype: str
    schedules: dict[str, Schedule]
    notes: tuple[str, ...]
    _breakdown: Any = dataclasses.field(default=None, repr=False, compare=False)  # () -> the breakdown dict

    @functools.cached_property
    def breakdown(self) -> dict[str, Any]:
        """BREAKDOWN_KEYS -> per-forward seconds over N, positive = SP+AsyncTP saves (computed on first use)."""
        return self._breakdown()

    def t_forward_s(self, schedule: str):
        return self.schedules[schedule].t_forward_s

    @property
    def speedup_sp(self):
        return self.t_forward_s("tp") / self.t_forward_s("sp")

    @property
    def speedup_sp_asynctp(self):
        return self.t_forward_s("tp") / self.t_forward_s("sp_asynctp")


class _Arena:
    """Rows of a few large blocks, one set per sweep length, that hold the per-op times of a large sweep.

    Each op's times are copied in as soon as they are made, so their temporaries are freed at once and
    reused by the next op, instead of every op's array keeping fresh pages of its own. A 65 536-point
    sweep keeps ~10 MB of results. Allocated one array at a time, glibc returns those pages to the OS after
    every call and each comes back as a page fault. Freeing the large blocks also raises glibc's adaptive
    mmap/trim thresholds (its default behaviour), so the next sweep finds its memory still mapped
    (benchmarks/bench_costmodel.py counts the faults; README "Speed")."""

    BLOCK_ROWS = 16
    MIN_ROW_BYTES = 64 * 1024  # shorter sweeps (the cutoff grid) gain nothing

    def __init__(self, lengths):
        self.blocks = {n: [] for n in set(lengths) if n * 8 >= self.MIN_ROW_BYTES}
        self.free = dict.fromkeys(self.blocks, 0)

    def keep(self, a):
        """a itself, or a copy of it in a row of this arena's blocks (1-D float64 arrays of a sweep length)."""
        if not (isinstance(a, np.ndarray) and a.ndim == 1 and a.dtype == np.float64 and a.shape[0] in self.blocks):
            return a
        n = a.shape[0]
        if any(a.base is b for b in self.blocks[n]):
            return a  # already a row
        if self.free[n] == 0:
            self.blocks[n].append(np.empty((self.BLOCK_ROWS, n)))
            self.free[n] = self.BLOCK_ROWS
        row = self.blocks[n][-1][self.BLOCK_ROWS - self.free[n]]
        self.free[n] -= 1
        row[...] = a
        return row


class _Hw:
    """Profile values pulled out once (floats or draw arrays) for the formulas."""

    def __init__(self, p: HardwareProfile, dtype: str, rows_hint: float = 0.0):
        v = p.v
        gemm_dtype = dtype if dtype in ("bf16", "fp32") else "fp8"
        act_dtype = "fp32" if dtype == "fp32" else "bf16"
        self.p = p
        self.act_bytes = 4.0 if dtype == "fp32" else ACT_BYTES
        self.peak = v(f"compute.peak_flops_per_s.{gemm_dtype}")
        self.peak_bf16 = v(f"compute.peak_flops_per_s.{act_dtype}")  # unquantised GEMMs and attention
        self.hbm = v("memory.hbm_bw_bytes_per_s")
        self.mem_eff = v("kernels.mem_efficiency")
        self.launch = v("kernels.launch_overhead_s")
        self.gemm = dict(max_efficiency=v("gemm.max_efficiency"), mem_efficiency=v("gemm.mem_efficiency"),
                         hbm_bw_bytes_per_s=self.hbm, tile_m=v("gemm.tile_m"), tile_n=v("gemm.tile_n"),
                         sm_count=v("identity.sm_count"), launch_overhead_s=v("gemm.launch_overhead_s"))
        self.gemm_in_bytes = {"bf16": 2.0, "fp32": 4.0}.get(gemm_dtype, 1.0)
        self.attn_eff = v("attention.efficiency")
        self.barrier = v("asynctp.barrier_s")
        self.ce_bw = v("asynctp.copy_engine_bw_bytes_per_s")
        self.ce_lat = v("asynctp.copy_latency_s")
        self.slowdown = v("asynctp.compute_slowdown")
        self.kappa = v("asynctp.stream_concurrency")
        self._memo: dict = {}
        self.rows_hint = rows_hint  # the largest row count this prediction will ask for (sizes the padded-row table)
        self._reps = None  # distinct padded row counts, shared by every GEMM of this prediction
        self._tables: dict = {}  # (n, k, fp8_ok) -> compute time (+ launch) over self._reps
        self.arena: _Arena | None = None  # set by predict() for a large sweep

    def _memoised(self, key, arr, compute):
        """compute() once per (array object, key) within one prediction; holding `arr` keeps its id unique."""
        full = (id(arr),) + key
        hit = self._memo.get(full)
        if hit is None or hit[0] is not arr:
            hit = (arr, compute())
            self._memo[full] = hit
        return hit[1]

    def keep(self, a):
        """a, or its copy in this prediction's arena (see _Arena); for the per-op times a Prediction holds."""
        return a if self.arena is None else self.arena.keep(a)

    def t_gemm(self, m, n, k, *, fp8_ok=True):
        """F.t_gemm_s with this profile's values; memoised per (m array, n, k) within one prediction."""
        return self._memoised(("gemm", n, k, fp8_ok), m, lambda: self.keep(self._t_gemm(m, n, k, fp8_ok)))

    def _t_gemm(self, m, n, k, fp8_ok):
        b = self.gemm_in_bytes if fp8_ok else self.act_bytes
        peak = self.peak if fp8_ok else self.peak_bf16
        g = self.gemm
        padded = self._padded_rows(m)
        if padded is None:  # Monte Carlo draws or tiny inputs: the reference formula, fully broadcast
            return F.t_gemm_s(m, n, k, peak_flops_per_s=peak, in_bytes=b, w_bytes=b, out_bytes=self.act_bytes, **g)
        # compute time depends on m only through m padded to its row tile: evaluate it once per distinct
        # padded m (a few hundred, shared by all GEMMs of one (n, k)) and expand; identical to F.t_gemm_s
        # (tests/test_model.py)
        table = self._tables.get((n, k, fp8_ok))
        if table is None:
            table = F.t_gemm_compute_s(self._reps, n, k, peak, g["max_efficiency"], g["tile_m"], g["tile_n"],
                                       g["sm_count"]) + g["launch_overhead_s"]
            self._tables[(n, k, fp8_ok)] = table
        bw = self.hbm * g["mem_efficiency"]
        t = m * ((k * b + n * self.act_bytes) / bw)
        t += k * n * b / bw + g["launch_overhead_s"]
        return np.maximum(gather(table, padded), t, out=t)

    def _padded_rows(self, m):
        """Index of m into self._reps, m rounded up to its row tile (power of two below tile_m, else a
        multiple of tile_m): run lengths for a sorted sweep, else an index; None when the table path
        does not apply (draws, short inputs)."""
        return self._memoised(("pad",), m, lambda: self._padded_rows_index(m))

    def _padded_rows_index(self, m):
        tile_m = self.gemm["tile_m"]
        if not (np.ndim(m) == 1 and m.size > 64 and all(np.ndim(v) == 0 for v in (
                tile_m, self.gemm["max_efficiency"], self.gemm["sm_count"], self.peak, self.peak_bf16))):
            return None
        tmin = float(min(64.0, tile_m))
        n_small = int(round(np.log2(tile_m / tmin))) + 1  # tmin, 2·tmin, ..., tile_m
        m_max = float(m.max())
        if self._reps is None or self._reps[-1] < m_max:  # (re)build the shared table of distinct rows
            r_max = max(1, int(np.ceil(max(m_max, self.rows_hint) / tile_m)))
            self._reps = np.concatenate([tmin * np.exp2(np.arange(n_small)), np.arange(2, r_max + 1) * float(tile_m)])
            self._tables.clear()
            self._memo = {key: hit for key, hit in self._memo.items() if key[1] != "pad"}
        if self.is_sorted(m):  # each m pads to the smallest rep >= m: run lengths from the rep boundaries
            return Runs(np.diff(np.searchsorted(m, self._reps, side="right"), prepend=0))
        idx = np.ceil(m / tile_m)
        idx += n_small - 2
        idx = idx.astype(np.intp)
        sel = np.flatnonzero(m <= tile_m)  # rows below one full tile: power-of-two tiles
        idx[sel] = np.log2(F.gemm_tile_m(m[sel], tile_m) / tmin).astype(np.intp)
        return idx

    def is_sorted(self, m):
        """is_sorted(m), memoised per array within one prediction."""
        return self._memoised(("sorted",), m, lambda: is_sorted(m))

    def mark_sorted(self, m):
        """Record that m is known to be sorted (derived from a sorted sweep)."""
        self._memoised(("sorted",), m, lambda: True)

    def rows(self, n_tok, divisor):
        """n_tok / divisor, memoised so that chunk GEMMs of the same rows share t_gemm's memo."""
        def divide():
            out = n_tok / divisor
            if np.ndim(out) == 1 and self.is_sorted(n_tok):  # a positive divisor keeps the order
                self.mark_sorted(out)
            return out
        return self._memoised(("rows", divisor), n_tok, divide)

    def t_mem(self, nbytes):
        return F.t_memory_bound_s(nbytes, self.hbm, self.mem_eff, self.launch)


def _all_reduce_dispatch(hw: _Hw, msg_bytes, tp: int, fusion_applies: bool, fi_max_bytes=None):
    """(time of all-reduce [+ the RMSNorm when fused], fused?, implementation names) as vLLM 0.31 picks.

    Order as in CudaCommunicator.all_reduce: FlashInfer (fused AR+RMSNorm when the fusion pass applies)
    ≤ fi limit; quick-reduce (ROCm); custom AR < its max (1-stage below the 1-stage limit); torch
    symm-mem ≤ its max; else (Py)NCCL. `fi_max_bytes` overrides the FlashInfer limit (0 = off)."""
    p, d = hw.p, hw.p.dispatch(tp)
    if fi_max_bytes is not None and "fi_fusion_max_bytes" in d:
        d = {**d, "fi_fusion_max_bytes": fi_max_bytes}
    choices = []  # (mask, impl, fused)
    remaining = np.ones(np.shape(msg_bytes), dtype=bool)
    if "fi_fusion_max_bytes" in d and p.has_collective("flashinfer_ar_rmsnorm"):
        m = msg_bytes <= d["fi_fusion_max_bytes"]
        one = msg_bytes <= d.get("fi_oneshot_max_bytes", d["fi_fusion_max_bytes"])
        choices.append((m & one, "flashinfer_ar_rmsnorm", fusion_applies))
        if p.has_collective("flashinfer_ar_rmsnorm_twoshot"):
            choices.append((m & ~one, "flashinfer_ar_rmsnorm_twoshot", fusion_applies))
        remaining &= ~m
    if "quick_reduce_max_bytes" in d and p.has_collective("quick_reduce"):
        m = remaining & (msg_bytes <= d["quick_reduce_max_bytes"])
        choices.append((m, "quick_reduce", False))
        remaining &= ~m
    if "custom_ar_max_bytes" in d and p.has_collective("custom_ar_2stage"):
        one = d.get("custom_ar_1stage_max_bytes", 0)
        m1 = remaining & (msg_bytes < d["custom_ar_max_bytes"]) & (msg_bytes < one)
        m2 = remaining & (msg_bytes < d["custom_ar_max_bytes"]) & ~m1
        if one:
            choices.append((m1, "custom_ar_1stage", False))
        choices.append((m2, "custom_ar_2stage", False))
        remaining &= ~(m1 | m2)
    if "symm_mem_max_bytes" in d:
        impl = "symm_mem_" + d.get("symm_mem_algo", "two_shot")
        if p.has_collective(impl):
            m = remaining & (msg_bytes <= d["symm_mem_max_bytes"])
            choices.append((m, impl, False))
            remaining &= ~m
    choices.append((remaining, "nccl_all_reduce", False))
    # each implementation's formula on its own sizes only
    params = {impl: p.collective(impl, tp) for _, impl, _ in choices}
    shape = np.broadcast_shapes(np.shape(msg_bytes), *(np.shape(v) for lb in params.values() for v in lb))
    t = np.zeros(shape)
    fused = np.zeros(np.shape(msg_bytes), dtype=bool)
    used = []
    sweep = np.ndim(msg_bytes) == 1 and hw.is_sorted(msg_bytes)
    for mask, impl, is_fused in choices:
        if sweep:  # every choice is an interval of a sorted sweep (thresholds cut it in order): a slice
            count = int(np.count_nonzero(mask))
            start = int(np.argmax(mask)) if count else 0
            where = slice(start, start + count)
        else:
            where = np.flatnonzero(mask)
            count = where.size
        if not count:
            continue
        lat, bw = params[impl]
        t[..., where] = F.t_all_reduce_s(msg_bytes[where], lat, bw, tp)
        fused[where] = is_fused
        used.append(impl)
    return t, fused, used


def _ag(hw, tp, out_bytes):
    lat, bw = hw.p.collective("nccl_all_gather", tp)
    return F.t_all_gather_s(out_bytes, lat, bw, tp)


def _rs(hw, tp, in_bytes):
    lat, bw = hw.p.collective("nccl_reduce_scatter", tp)
    return F.t_reduce_scatter_s(in_bytes, lat, bw, tp)


def _chunk_gemm_times(hw: _Hw, n_tok, n_out, k, W, t_pull_s):
    """(g, g_c, g_eff): a chunk GEMM of n_tok/W rows alone, with two-stream concurrency, and slowed by the
    W−1 pulls of t_pull_s each that overlap it (docs/model.md §6)."""
    g = hw.t_gemm(hw.rows(n_tok, W), n_out, k)
    g_conc = F.t_chunk_concurrent_s(g, hw.t_gemm(hw.rows(n_tok, W / 2), n_out, k), hw.kappa)
    frac = F.overlapped_fraction((W - 1) * t_pull_s, W * g_conc)
    return g, g_conc, g_conc * (1.0 + hw.slowdown * frac)


def _terms(W, g, g_conc, g_eff, fixed):
    return dict(chunk=W * g, conc=W * (g - g_conc), contention=W * (g_eff - g_conc), fixed=fixed)


def _fused_ag_gemm(hw: _Hw, n_tok, n_out, k, tp, a_bytes):
    """torch _pipelined_all_gather_and_consume (return_A=True): returns (time, terms) per call."""
    W = tp
    mc = hw.rows(n_tok, W)
    p = F.t_pull_s(mc * (k * a_bytes), hw.ce_bw, hw.ce_lat)
    g, g_conc, g_eff = _chunk_gemm_times(hw, n_tok, n_out, k, W, p)
    t_copy = hw.t_mem(mc * (2.0 * k * a_bytes))  # local shard -> symmetric buffer (read + write)
    fixed = 3 * hw.barrier + t_copy + np.maximum(0.0, t_copy - g_eff)  # 2nd copy hides behind last GEMM
    return fixed + F.t_ag_gemm_pipeline_s(W, g, g_eff, p), _terms(W, g, g_conc, g_eff, fixed)


def _fused_gemm_rs(hw: _Hw, n_tok, n_out, k, tp):
    """torch _pipelined_produce_and_all2all + exposed reduction: returns (time, terms) per call."""
    W = tp
    p = F.t_pull_s(hw.rows(n_tok, W) * (n_out * hw.act_bytes), hw.ce_bw, hw.ce_lat)  # partials bf16 even for fp8
    g, g_conc, g_eff = _chunk_gemm_times(hw, n_tok, n_out, k, W, p)
    t_red = hw.t_mem(F.reduction_bytes(n_tok, n_out, hw.act_bytes, W))
    fixed = 2 * hw.barrier + t_red
    t = fixed + F.t_gemm_rs_pipeline_s(W, g, g_eff, p + 2 * hw.barrier)
    # the 2 barriers of each step belong to the barrier/latency term, not to the hidden communication
    return t, _terms(W, g, g_conc, g_eff, fixed + (W - 1) * 2 * hw.barrier)


class Runs:
    """Index of a sorted sweep into its distinct values, as run lengths: value i repeats counts[i] times."""

    __slots__ = ("counts",)

    def __init__(self, counts):
        self.counts = counts


def is_sorted(x):
    """True for a non-decreasing 1-D array."""
    return bool(np.all(x[1:] >= x[:-1]))


def gather(a, idx):
    """a over distinct values -> a over the sweep (last axis; draws broadcast); a as is when idx is None."""
    if idx is None or not np.ndim(a):
        return a
    if isinstance(idx, Runs):
        return np.repeat(a, idx.counts, axis=-1)
    return a[..., idx]


def distinct_values(x):
    """(distinct values of a 1-D sweep, index from x into them), or (x, None) when that saves little."""
    if x.ndim != 1 or x.size < 256:
        return x, None
    if is_sorted(x):  # sorted sweep: linear-time distinct values, run lengths instead of an index
        keep = np.empty(x.size, dtype=bool)
        keep[0] = True
        np.not_equal(x[1:], x[:-1], out=keep[1:])
        starts = np.flatnonzero(keep)
        uniq, idx = x[starts], Runs(np.diff(starts, append=x.size))
    else:
        uniq, idx = np.unique(x, return_inverse=True)
    if uniq.size > 0.75 * x.size:  # not worth the gather
        return x, None
    return uniq, idx


def distinct_padded_tokens(N, W):
    """(⌈N/W⌉·W over its distinct values, index from N into them) for a sweep; (⌈N/W⌉·W, None) otherwise.

    The SP schedules depend on N only through the padded count, so a sweep evaluates them W× less often."""
    return distinct_values(np.ceil(N / W) * W)


def predict(profile: HardwareProfile, shape: ModelShape, tp: int, dtype: str, num_tokens,
            seq_len: int = 1024) -> Prediction:
    """Per-op times of tp / sp / sp_asynctp for one forward over token counts `num_tokens`."""
    check_dtype(dtype)
    shape.check_tp(tp)
    if not isinstance(seq_len, (int, np.integer)) or seq_len < 1:
        raise TpcostError(f"--seq-len must be an integer >= 1, got {seq_len}")
    N = np.atleast_1d(np.asarray(num_tokens, dtype=float))  # a scalar N gives 1-element arrays
    if N.size == 0 or np.any(N <= 0) or not np.all(np.isfinite(N)):
        raise TpcostError("token counts N must be > 0")
    rows_hint = float(N.max()) + tp  # SP pads N up to a multiple of tp
    hw = _Hw(profile, dtype, rows_hint)
    act = hw.act_bytes
    W = tp
    H, L = shape.hidden, shape.num_layers
    h_rank = shape.num_heads // W
    kv_rank = shape.kv_heads_per_rank(W)
    d = shape.head_dim
    qkv_n = (h_rank + 2 * kv_rank) * d
    I_rank = (shape.moe_intermediate if shape.is_moe else shape.intermediate) // W
    fp8 = dtype in ("fp8", "fp8-dynamic")
    quant_bytes = 1.0 if fp8 else act  # bytes/elem of a quantised GEMM input
    ag_bytes = 1.0 if dtype == "fp8" else act  # fp8 static quantises before the all-gather
    notes: list[str] = []
    Np, pidx = distinct_padded_tokens(N, W)  # SP pads N up to a multiple of tp; evaluated once per value
    ex = functools.partial(gather, idx=pidx)  # over the distinct padded counts -> over N
    if isinstance(pidx, Runs):
        hw.mark_sorted(Np)
    hw.arena = _Arena((N.size, Np.size))
    keep = hw.keep
    fusion_applies = True

    def attention(n):
        flops = F.attention_flops(n, seq_len, h_rank, d)
        t = np.maximum(flops / (hw.peak_bf16 * hw.attn_eff),
                       F.attention_bytes(n, h_rank, kv_rank, d, act) / (hw.hbm * hw.mem_eff))
        return keep(hw.launch + t)

    def mlp_compute(n):
        """Dense: gate_up GEMM, SiluMul, down GEMM. MoE: router + grouped experts (roofline)."""
        if not shape.is_moe:
            return [Op("gate_up_gemm", "gemm", hw.t_gemm(n, 2 * I_rank, H)),
                    Op("silu_mul", "memory", keep(hw.t_mem(F.silu_mul_bytes(n, I_rank, act, quant_bytes)))),
                    Op("down_gemm", "gemm", hw.t_gemm(n, H, I_rank))]
        E, k = shape.num_experts, shape.experts_per_token
        flops = F.gemm_flops(n * k, 3 * I_rank, H)
        w_bytes = np.minimum(E, n * k) * 3 * H * I_rank * hw.gemm_in_bytes
        t_exp = hw.gemm["launch_overhead_s"] * 3 + np.maximum(
            flops / (hw.peak * hw.gemm["max_efficiency"]), w_bytes / (hw.hbm * hw.gemm["mem_efficiency"]))
        return [Op("router_gemm", "gemm", hw.t_gemm(n, E, H, fp8_ok=False)),
                Op("moe_experts", "gemm", keep(t_exp))]

    def quant(n):  # dynamic per-token quantisation kernel after a bf16 all-gather
        return Op("dynamic_quant", "memory", keep(hw.t_mem(n * (H * (act + 1.0)))))

    # ---------------------------------------------------------------- tp
    def all_reduce_units(hw):
        """(all-reduce time, RMSNorm time where not fused into it, implementations) over N."""
        msg = N * (H * act)
        if np.ndim(N) == 1 and hw.is_sorted(N):
            hw.mark_sorted(msg)
        t_ar, fused_mask, impls = _all_reduce_dispatch(hw, msg, W, fusion_applies)
        t_norm = hw.t_mem(F.rms_norm_bytes(N, H, act, quant_bytes))
        t_norm[..., fused_mask] = 0.0
        return t_ar, t_norm, impls

    t_ar, t_norm_unfused, impls = all_reduce_units(hw)
    t_unit_tp = keep(t_ar + t_norm_unfused)
    del t_ar, t_norm_unfused  # the breakdown recomputes them: a sweep keeps fewer full-size arrays
    notes.append("tp all-reduce implementations over this sweep (vLLM 0.31 dispatch): " + ", ".join(impls))
    attn_tp = [Op("qkv_gemm", "gemm", hw.t_gemm(N, qkv_n, H)), Op("attention", "attention", attention(N)),
               Op("o_gemm", "gemm", hw.t_gemm(N, H, h_rank * d))]
    unit_tp = Op("all_reduce+rms_norm", "comm", t_unit_tp, count=2)
    tp_layer = tuple(attn_tp + mlp_compute(N) + [unit_tp])

    # ---------------------------------------------------------------- sp (RS -> norm(N/W) -> AG)
    t_rs = keep(_rs(hw, W, Np * (H * act)))
    t_ag = keep(_ag(hw, W, Np * (H * ag_bytes)))
    t_norm_shard = keep(hw.t_mem(F.rms_norm_bytes(Np / W, H, act, ag_bytes)))
    dyn = [quant(Np)] if dtype == "fp8-dynamic" else []
    sp_layer = (Op("reduce_scatter", "comm", t_rs, 2),
                Op("rms_norm_shard", "memory", t_norm_shard, 2),
                Op("all_gather", "comm", t_ag, 2),
                *[dataclasses.replace(q, count=2) for q in dyn],
                Op("qkv_gemm", "gemm", hw.t_gemm(Np, qkv_n, H)), Op("attention", "attention", attention(Np)),
                Op("o_gemm", "gemm", hw.t_gemm(Np, H, h_rank * d)), *mlp_compute(Np))

    # ---------------------------------------------------------------- sp_asynctp
    fused_calls = []  # (fused-op function, its arguments after hw, (n, k) of the whole GEMM, collective it hides)

    def fused(fn, args, whole, t_coll):
        fused_calls.append((fn, args, whole, t_coll))
        return keep(fn(hw, *args)[0])

    ops = [Op("rms_norm_shard", "memory", t_norm_shard, 2)]
    # AG + QKV (fuses unless fp8-dynamic)
    for name, n_out, with_attn in (("qkv", qkv_n, True), ("gate_up", 2 * I_rank, False)):
        if name == "gate_up" and shape.is_moe:
            ops += [Op("all_gather", "comm", t_ag)] + mlp_compute(Np)
            continue
        if dtype == "fp8-dynamic":
            ops += [Op("all_gather", "comm", t_ag), quant(Np), Op(f"{name}_gemm", "gemm", hw.t_gemm(Np, n_out, H))]
        else:
            t_f = fused(_fused_ag_gemm, (Np, n_out, H, W, ag_bytes), (n_out, H), t_ag)
            ops.append(Op(f"fused_all_gather_{name}_gemm", "fused", t_f))
        if with_attn:
            ops.append(Op("attention", "attention", attention(Np)))
            t_f = fused(_fused_gemm_rs, (Np, H, h_rank * d, W), (H, h_rank * d), t_rs)
            ops.append(Op("fused_o_gemm_reduce_scatter", "fused", t_f))
    if not shape.is_moe:
        ops.append(Op("silu_mul", "memory", keep(hw.t_mem(F.silu_mul_bytes(Np, I_rank, act, quant_bytes)))))
        t_f = fused(_fused_gemm_rs, (Np, H, I_rank, W), (H, I_rank), t_rs)
        ops.append(Op("fused_down_gemm_reduce_scatter", "fused", t_f))
    else:
        ops.append(Op("reduce_scatter", "comm", t_rs))
        notes.append(f"{shape.name} is MoE: its MoE block gets SP (RS/AG) but no GEMM fusion in vLLM 0.31")
    spa_layer = tuple(ops)

    # ---------------------------------------------------------------- non-layer parts
    n_seqs, sidx = distinct_values(np.ceil(N / seq_len))  # a sweep has few distinct sequence counts
    ex_seqs = functools.partial(gather, idx=sidx)

    embed = Op("embedding", "memory", keep(hw.t_mem(N * (2.0 * H * act))))
    lm_head = Op("lm_head_gemm", "gemm", keep(ex_seqs(hw.t_gemm(n_seqs, shape.vocab / W, H, fp8_ok=False))))
    logits = Op("logits_gather", "comm", keep(ex_seqs(_ag(hw, W, n_seqs * shape.vocab * 4.0))))
    nonlayer_tp = (embed, Op("all_reduce+rms_norm", "comm", t_unit_tp), lm_head, logits)
    padded = lambda ops: tuple(dataclasses.replace(op, padded=True) for op in ops)  # noqa: E731
    nonlayer_sp = padded((Op("embedding", "memory", keep(hw.t_mem(Np * (2.0 * H * act)))), Op("reduce_scatter", "comm", t_rs),
                          Op("rms_norm_shard", "memory", t_norm_shard), Op("all_gather", "comm", t_ag))) + (lm_head, logits)

    scheds = {"tp": Schedule("tp", tp_layer, nonlayer_tp, L),
              "sp": Schedule("sp", padded(sp_layer), nonlayer_sp, L, Np, pidx),
              "sp_asynctp": Schedule("sp_asynctp", padded(spa_layer), nonlayer_sp, L, Np, pidx)}

    # ---------------------------------------------------------------- breakdown (per forward)
    def breakdown():
        hw = _Hw(profile, dtype, rows_hint)  # recompute what predict() did not keep
        t_ar, t_norm_unfused, _ = all_reduce_units(hw)
        terms = dict(chunk=0.0, conc=0.0, contention=0.0, fixed=0.0, seq=0.0, whole=0.0)
        for fn, args, (n_out, k), t_coll in fused_calls:
            tm = fn(hw, *args)[1]
            t_whole = hw.t_gemm(Np, n_out, k)
            for key in ("chunk", "conc", "contention", "fixed"):
                terms[key] = terms[key] + tm[key]
            terms["whole"] = terms["whole"] + t_whole
            terms["seq"] = terms["seq"] + t_whole + t_coll
        t_tp, t_spa = scheds["tp"].t_forward_s, scheds["sp_asynctp"].t_forward_s
        units = 2 * L + 1
        norm_saving = units * (t_norm_unfused - ex(t_norm_shard))
        collective_change = units * (t_ar - ex(t_rs + t_ag))
        chunk_loss = ex(L * (terms["chunk"] - terms["whole"]))  # W chunk GEMMs vs the whole GEMM, over fused ops
        concurrency = ex(L * terms["conc"])
        contention = ex(L * terms["contention"])
        barrier = ex(L * terms["fixed"])
        # overlap gain: what the fused ops save against their sequential SP counterparts, net of the
        # other terms (so that the breakdown sums exactly to t_sp - t_sp_asynctp on the fused ops)
        fused_time = L * sum(op.t_s * op.count for op in spa_layer if op.kind == "fused")
        overlap_gain = ex(L * terms["seq"] - fused_time) + chunk_loss - concurrency + contention + barrier
        total = t_tp - t_spa
        other = total - (norm_saving + collective_change + overlap_gain - chunk_loss + concurrency - contention - barrier)
        return dict(overlap_gain_s=overlap_gain, chunking_loss_s=chunk_loss, concurrency_recovery_s=concurrency,
                    contention_s=contention, barrier_latency_s=barrier, norm_saving_s=norm_saving,
                    collective_change_s=collective_change, padding_and_other_s=other)

    return Prediction(num_tokens=N, tp=tp, dtype=dtype, schedules=scheds, notes=tuple(notes),
                      _breakdown=breakdown)
