"""One fused op against vLLM's unfused path over M: `tpcost op` (docs/model.md §6d, §9)."""
# One fused op against vLLM's unfused path over M: the per-op what-if behind `tpcost op`
# (docs/model.md §6b, §9).
#
# The question a kernel author or a vLLM maintainer asks: on this GPU at this TP, from which M
# does this fused GEMM+collective beat the GEMM followed by the collective vLLM dispatches? The
# cutoff is decided by the same rule as everywhere (costmodel.analysis.decide_cutoff: the
# threshold c of "fused when M >= c" minimising the expected time over the workload, the fused
# side paying the risk premium; None = never).

from __future__ import annotations

from typing import Any
import dataclasses

import numpy as np

from . import formulas as F
from . import fused_ops, ops, vllm_tables
from .analysis import (
    BAND_DRAWS,
    BAND_SEED,
    band_drivers_json,
    band_edges,
    crossover_tokens,
    decide_cutoff,
    decision_value,
    perturbed_values,
)
from .workload import weights_on
from .defaults import DEFAULT_KERNEL_SM_SHARE
from .errors import TpcostError
from .model import RunConfig
from .profile import HardwareProfile
from .fused_ops import SMALL_M, OpSpec  # noqa: F401  (OpSpec: re-exported)
from .vllm_tables import Vllm

M_STEP = 128  # M runs over the multiples of 128 (vLLM's gemm_rs_ar tiles M by 128)


@dataclasses.dataclass(frozen=True)
class OpQuery:
    """One fused GEMM+collective as asked: op, implementation, GEMM's n and per-rank k (§6d)."""

    op: str  # ag_gemm | gemm_rs | gemm_ar
    impl: str  # torch | kernel
    n: int
    k: int
    # the fused kernel's share of the SMs (ops.sm_share_hw)
    sm_share: float = DEFAULT_KERNEL_SM_SHARE


@dataclasses.dataclass(frozen=True)
class OpAnalysis:
    gpu: str
    spec: OpSpec  # the op, its shape, dtype and regime
    calls_per_forward: int
    m: np.ndarray
    t_fused_s: np.ndarray  # per forward (× calls)
    t_unfused_s: np.ndarray
    cutoff_tokens: int | None
    vllm_rule: str
    vllm_rule_tokens: int | None
    vllm_runs_kernel: np.ndarray
    decision_value: dict
    unfused_impl: str
    notes: tuple[str, ...]
    unfused_impl_per_m: np.ndarray  # the collective vLLM dispatches at each M
    # 5-95 % of the cutoff over the profile's draws (None: never)
    cutoff_band: tuple[int | None, int | None] | None
    # the single kernel's waves, ceil(tiles / SMs), at each M (torch: None)
    waves_per_m: np.ndarray | None = None

    @property
    def kind(self) -> fused_ops.FusedOpKind:
        """The registry's entry of this op and implementation (§6d)."""
        return fused_ops.kind(self.spec.op, self.spec.impl)

    @property
    def crossover_m(self) -> int | None:
        """The M from which the fused op wins for good (None: it loses at the largest M; §9)."""
        # Speedup > 1 at every row from it to the budget: where the curves cross, apart from the
        # decided threshold (issue 50 item 8).
        return crossover_tokens(self.m, self.t_unfused_s, self.t_fused_s)

    def events(self) -> list[tuple[int, str]]:
        """(M, what changes there) for every step in M that explains a jump in a row (§6d)."""
        # The kernel's wave count, the unfused collective vLLM dispatches, and torch's switch from
        # CUDA-graph replay to eager host issue.
        out: list[tuple[int, str]] = []
        m = self.m.astype(int)
        for i in range(1, m.size):
            if self.waves_per_m is not None and self.waves_per_m[i] != self.waves_per_m[i - 1]:
                out.append(
                    (
                        int(m[i]),
                        f"waves {int(self.waves_per_m[i - 1])} -> {int(self.waves_per_m[i])} "
                        "(the kernel's tiles fill one more pass over the SMs)",
                    )
                )
            if self.unfused_impl_per_m[i] != self.unfused_impl_per_m[i - 1]:
                out.append(
                    (
                        int(m[i]),
                        f"unfused collective {self.unfused_impl_per_m[i - 1]} -> "
                        f"{self.unfused_impl_per_m[i]} (vLLM's dispatch limit)",
                    )
                )
            host = self.kind.event(self.spec, int(m[i - 1]), int(m[i]))
            if host:
                out.append((int(m[i]), host))
        return out

    def wins_m_ranges(self) -> list[list[int]]:
        """[first, last] M of every run of rows where the fused op is faster (§6d)."""
        out: list[list[int]] = []
        prev = False
        for m, w in zip(self.m, self.t_unfused_s > self.t_fused_s):
            if w and not prev:
                out.append([int(m), int(m)])
            elif w:
                out[-1][1] = int(m)
            prev = bool(w)
        return out

    @property
    def answer(self) -> str:
        """'never', 'always' (fused from the grid's smallest M) or 'cutoff' (§9)."""
        if self.cutoff_tokens is None:
            return "never"
        return "always" if self.cutoff_tokens <= int(self.m[0]) else "cutoff"

    @property
    def cutoff_per_rank(self) -> int | None:
        """The cutoff in rows per rank, ceil(c/tp), where vLLM's gate counts per rank (§9)."""
        # None: not such a gate.
        if self.spec.baseline != "vllm_sp" or self.cutoff_tokens is None:
            return None
        return -(-self.cutoff_tokens // self.spec.tp)

    def to_json(self) -> dict:
        waves = (
            [None] * self.m.size if self.waves_per_m is None else [int(w) for w in self.waves_per_m]
        )
        rows = [
            {
                "m": int(m),
                "t_fused_s": float(f),
                "t_unfused_s": float(u),
                "speedup": float(u / f),
                "vllm_runs_kernel": bool(v),
                "unfused_impl": str(i),
                "waves": wv,
            }
            for m, f, u, v, i, wv in zip(
                self.m,
                self.t_fused_s,
                self.t_unfused_s,
                self.vllm_runs_kernel,
                self.unfused_impl_per_m,
                waves,
            )
        ]
        sp = self.spec
        return {
            "gpu": self.gpu,
            "op": sp.op,
            "impl": sp.impl,
            "tp": sp.tp,
            "n": sp.n,
            "k": sp.k,
            "dtype": sp.dtype,
            "kernel_sm_share": sp.sm_share,
            "calls_per_forward": self.calls_per_forward,
            "cutoff_tokens": self.cutoff_tokens,
            "cutoff_tokens_per_rank": self.cutoff_per_rank,
            "baseline": sp.baseline,
            "answer": self.answer,
            "vllm_version": sp.vllm.label,
            "vllm_version_source": sp.vllm.source,
            "vllm_rule": self.vllm_rule,
            "vllm_rule_tokens": self.vllm_rule_tokens,
            "decision_value": self.decision_value,
            "unfused_impl": self.unfused_impl,
            "cutoff_band_tokens": None if self.cutoff_band is None else list(self.cutoff_band),
            "cutoff_band_never_share": getattr(self.cutoff_band, "never_share", None),
            "cutoff_band_drivers": band_drivers_json(self.cutoff_band),
            "fused_wins_m_ranges": self.wins_m_ranges(),
            "crossover_m": self.crossover_m,
            "events": [{"m": m, "what": w} for m, w in self.events()],
            "notes": list(self.notes),
            "rows": rows,
        }


def check_combination(
    profile: HardwareProfile, op: str, impl: str, tp: int, dtype: str, n: int
) -> None:
    """One clear error for an op/impl/dtype/GPU combination that does not exist (§6d)."""
    # costmodel.fused_ops: the registry evaluate reads too.
    try:
        k = fused_ops.kind(op, impl)
    except TpcostError as e:
        raise TpcostError(f"--op {op} --impl {impl}: {e}") from None
    why = k.why_not(profile, tp, dtype, n)
    if why:
        raise TpcostError(f"--op {op} --impl {impl} --dtype {dtype}: {why}")


def vllm_rule(
    profile: HardwareProfile, op: str, impl: str, tp: int, n: int, k: int, vllm: Vllm
) -> tuple[str, int | None, Any]:
    """vLLM's own rule for a published row of this op: the entry's published_rule (§6d)."""
    # (description, threshold tokens or None, runs(m) -> bool array); tpcost evaluate,
    # benchmarks/accuracy.py.
    return tuple(fused_ops.kind(op, impl).published_rule(profile, tp, n, k, vllm)[:3])  # type: ignore[return-value]


def analyse_op(
    profile: HardwareProfile,
    query: OpQuery,
    run: RunConfig,
    *,
    calls_per_forward: int = 1,
    extra_m: Any = (),
    with_band: bool = True,
) -> OpAnalysis:
    """Fused against unfused over M, the cutoff on that grid, and vLLM's own rule (§6d)."""
    # Fused against unfused over M = the multiples of 128 up to run.max_num_batched_tokens (and
    # `extra_m`), per forward (× calls_per_forward); the cutoff on that grid for run's margin and
    # workload; vLLM's own rule and the saving against it. Of run's regime the op reads the
    # CUDA-graph size and the vLLM.
    op, impl, n, k = query.op, query.impl, query.n, query.k
    tp, dtype, max_num_batched_tokens, margin, workload = (
        run.tp,
        run.dtype,
        run.max_num_batched_tokens,
        run.margin,
        run.workload,
    )
    cudagraph_max_tokens, vllm = run.regime.cudagraph_max_tokens, run.regime.vllm
    check_combination(profile, op, impl, tp, dtype, n)
    entry = fused_ops.kind(op, impl)
    if query.sm_share != DEFAULT_KERNEL_SM_SHARE and not entry.takes_sm_share:
        raise TpcostError(
            f"--kernel-sm-share: {op} ({impl}) does not run on a share of the SMs (the single "
            "kernel, "
            "--impl kernel, does)"
        )
    if max_num_batched_tokens < M_STEP:
        raise TpcostError(
            f"--max-num-batched-tokens must be >= {M_STEP} (M runs over the multiples of {M_STEP})"
        )
    grid = np.arange(M_STEP, max_num_batched_tokens // M_STEP * M_STEP + 1, M_STEP, dtype=float)
    # decode rows the op runs at
    grid = np.concatenate([np.asarray(entry.small_rows, dtype=float), grid])
    m_all = np.union1d(grid, np.asarray(list(extra_m), dtype=float))
    entry.check_rows(m_all, extra_m, tp, M_STEP)
    cap = vllm_tables.capture_size(cudagraph_max_tokens, profile.identity.compute_capability)
    rule_text, rule_tokens, runs, baseline = entry.rule(profile, tp, n, k, vllm, cap)
    spec = OpSpec(op, impl, tp, n, k, dtype, cap, vllm, baseline, query.sm_share)
    f_all, u_all, unfused_impl, unfused_per_m, waves = op_arms(profile, spec, m_all)
    notes = entry.notes(profile, spec, m_all)
    f_all, u_all = f_all * calls_per_forward, u_all * calls_per_forward
    on_grid = np.isin(m_all, grid)
    t_on, t_off = f_all[on_grid], u_all[on_grid]
    weights = weights_on(workload, grid)
    cut = decide_cutoff(grid, t_off, t_on, margin, weights)
    value = decision_value(grid, t_off, t_on, margin, cut, weights, vllm_default=rule_tokens)
    band = op_cutoff_band(profile, spec, grid, margin, weights) if with_band else None
    return OpAnalysis(
        profile.name,
        spec,
        calls_per_forward,
        m_all,
        f_all,
        u_all,
        cut,
        rule_text,
        rule_tokens,
        runs(m_all),
        value,
        unfused_impl,
        tuple(notes),
        unfused_per_m,
        band,
        waves,
    )


def op_arms(profile: HardwareProfile, spec: OpSpec, m: np.ndarray) -> fused_ops.Arms:
    """One call of both arms over rows `m`, through the registry entry's predictor pair (§6d)."""
    # (fused s, unfused s, the unfused collective, its implementation per row, the kernel's waves
    # per row or None) of one call over rows `m` (the registry entry's predictor pair); the
    # profile's values may be Monte Carlo draws of shape (D, 1).
    return fused_ops.kind(spec.op, spec.impl).arms(profile, spec, m)


def op_cutoff_band(
    profile: HardwareProfile,
    spec: OpSpec,
    grid: np.ndarray,
    margin: float,
    weights: Any,
    draws: int = BAND_DRAWS,
    seed: int = BAND_SEED,
) -> tuple[int | None, int | None]:
    """5th-95th percentile of the op's cutoff over the profile's Monte Carlo draws (§9)."""
    # Never: None. Its drivers only among the quantities the op reads (what a --set can move).
    from .profile import recording

    traced, reads = recording(profile)
    op_arms(traced, spec, grid)
    vals = perturbed_values(profile, draws, seed)
    prof = profile.with_values(vals, None, mark_modified=False)
    f, u, _, _, _ = op_arms(prof, spec, grid)
    u, f = np.broadcast_arrays(u, f)  # one row of times per draw on both arms
    return band_edges(
        decide_cutoff(grid, u, f, margin, weights), {k: v for k, v in vals.items() if k in reads}
    )


def op_breakdown(profile: HardwareProfile, spec: OpSpec, m: int) -> dict:
    """Each arm of one call at M rows, part by part, with the rates that explain it (§6d)."""
    # Each arm of one call at M rows, part by part, with the physical rates that explain it (`tpcost
    # op --at M`): the GEMM's achieved TFLOP/s and its bound (compute or HBM), the unfused
    # collective's achieved bus bandwidth, and the fused op's own terms (the kernel's waves,
    # multicast traffic and fixed cost; torch's chunk GEMMs, pulls, barriers and host issue). Times
    # s, rates SI, per call (not × calls per forward).
    hw = ops.Hw(profile, "fp8" if spec.dtype == "mxfp8" else spec.dtype)
    rows = np.array([float(m)])
    n, k, tp = spec.n, spec.k, spec.tp
    one = lambda x: float(np.asarray(x).ravel()[0])  # noqa: E731  (the one row, as a float)
    t_gemm = one(hw.t_gemm(rows, n, k))
    t_comp, t_hbm = one(hw.t_gemm_comp(rows, n, k)), one(hw.t_gemm_mem(rows, n, k))
    flops = 2.0 * m * n * k
    gemm = {
        "t_s": t_gemm,
        "flops": flops,
        "achieved_flops_per_s": flops / t_gemm,
        "bound": "compute" if t_comp >= t_hbm else "HBM",
        "t_compute_s": t_comp,
        "t_hbm_s": t_hbm,
    }
    f, u, _, impls, waves = op_arms(profile, spec, rows)
    t_coll = float(u[0]) - t_gemm
    coll_op = fused_ops.kind(spec.op, spec.impl).collective
    msg = m * (k * hw.mode.ag_bytes if spec.op == "ag_gemm" else n * hw.act_bytes)
    factor = float(F.bus_bw_factor(coll_op, tp))
    unfused = {
        "t_s": float(u[0]),
        "gemm": gemm,
        "collective": {
            "impl": str(np.asarray(impls).ravel()[0]),
            "t_s": t_coll,
            "msg_bytes": msg,
            "achieved_bus_bytes_per_s": factor * msg / t_coll if t_coll > 0 else None,
        },
        "bound": "collective" if t_coll > t_gemm else "GEMM",
    }
    fused = fused_ops.kind(spec.op, spec.impl).fused_breakdown(hw, spec, rows, float(f[0]))
    return {"m": int(m), "fused": fused, "unfused": unfused}


def measured_against_vllm(profile: HardwareProfile, spec: OpSpec, path: str) -> dict:
    """A kernel author's measured rows, each against the unfused arm vLLM dispatches (§6d)."""
    # A kernel author's measured rows (evaluate's op CSV) of this op's shape, each against the
    # unfused arm vLLM dispatches at its M (the model's, per call), beside their own baseline; the
    # crossover of the measured kernel against vLLM's arm: the least measured M from which it is
    # faster at every measured M (None: at none). docs/model.md §6d.
    from .evaluate import read_rows

    schema, rows = read_rows(path)
    if schema != "op":
        raise TpcostError(
            f"--measured {path}: a model-level CSV; --measured takes op rows (evaluate's op schema)"
        )
    mine = [
        (line, r)
        for line, r in rows
        if r["op"] == spec.op
        and r["tp"] == spec.tp
        and r.get("n") == spec.n
        and r.get("k") == spec.k
        and r.get("dtype") == spec.dtype
    ]
    if not mine:
        shapes = sorted(
            {
                f"{r['op']} tp {r['tp']} n {r.get('n')} k {r.get('k')} {r.get('dtype')}"
                for _, r in rows
            }
        )
        raise TpcostError(
            f"--measured {path}: no row of {spec.op} tp {spec.tp} n {spec.n} k {spec.k} "
            f"{spec.dtype} "
            f"(its rows: {'; '.join(shapes[:4]) or 'none'})"
        )
    other = sorted({r["hardware"] for _, r in mine} - {profile.name})
    if other:
        raise TpcostError(
            f"--measured {path}: rows measured on {other[0]}, asked about {profile.name} (--gpu)"
        )
    mine.sort(key=lambda x: x[1]["m"])
    m = np.array([float(r["m"]) for _, r in mine])
    arms = op_arms(profile, spec, m)
    u = np.broadcast_to(arms.unfused_s, m.shape)
    out, wins = [], []
    for (line, r), mi, ui in zip(mine, m, u):
        t_f, t_b = r["overlap_us"] * 1e-6, r["baseline_us"] * 1e-6
        wins.append(ui > t_f)
        out.append(
            {
                "line": line,
                "m": int(mi),
                "t_fused_measured_s": t_f,
                "t_unfused_vllm_s": float(ui),
                "speedup_vs_vllm": float(ui / t_f),
                "t_baseline_measured_s": t_b,
                "speedup_vs_own_baseline": t_b / t_f,
            }
        )
    cross = next((int(m[i]) for i in range(m.size) if all(wins[i:])), None)
    return {
        "file": path,
        "unfused_vllm": arms.unfused_name,
        "rows": out,
        "crossover_m_vs_vllm": cross,
    }
