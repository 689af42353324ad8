"""Speedup curve → cutoff (with a Monte Carlo band) → what `tpcost whatif` reports (§9)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from .errors import TpcostError
from .model import BREAKDOWN_KEYS, SCHEDULES, Prediction, RunConfig, predict
from .profile import UNPERTURBED_PREFIXES, HardwareProfile, value_range
from .shapes import ModelShape
from .vllm_tables import vllm_sp_min_token_num
from .workload import uniform_workload

BAND_DRAWS = 200
BAND_SEED = 0
BAND_CHUNK = 50
# The band and the sensitivity are decided on at most this many grid points (every k-th multiple of
# tp beyond it, each carrying its block's weight): 50 draws x 8192 points bound their arrays to ~3
# MB each, so a 2^20-token budget runs in ~2 GiB less memory and 5x less time than on the full grid.
# The cutoff itself is always exact.
BAND_GRID_MAX = 8192


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Analysis:
    profile: HardwareProfile
    shape: ModelShape
    run: RunConfig  # the query: tp, dtype, regime, budget, margin, workload
    cutoff_tokens: int | None
    sp_cutoff_tokens: int | None
    cutoff_band_tokens: tuple[int | None, int | None] | None
    table: Prediction  # at the display token counts
    breakdown_at_cutoff: dict[str, float] | None
    grid_tokens: np.ndarray  # the multiples of tp the cutoff is decided on
    grid_speedup_sp_asynctp: np.ndarray
    # cutoff_sensitivity(): the inputs that move the cutoff, largest first
    sensitivity: list[dict] | None = None
    vllm_default_tokens: int | None = None  # vLLM 0.31's own sp_min_token_num here (None: SP off)
    # decision_value(): expected times and savings on the workload
    decision_value: dict | None = None
    asynctp_available: bool = True
    workload: str = ""  # what the decision was weighted by
    # histogram workloads: the cutoff under each way of spreading a bucket
    cutoff_by_spread: dict | None = None
    memory: dict | None = None  # memory_fit(): weights per GPU against the HBM capacity
    # the band's and the sensitivity's grid step (tp unless coarsened)
    band_resolution_tokens: int | None = None
    sp_decision_value: dict | None = None  # decision_value() for SP alone at sp_cutoff_tokens
    grid_speedup_sp: np.ndarray | None = None  # SP alone's speedup on the grid

    def cutoff_mib(self, tokens: int | None = None) -> float | None:
        """The cutoff (or `tokens`) as the residual-stream message per GPU in MiB (§9)."""
        # formulas.mib_per_gpu.
        from . import formulas as F
        from .ops import DTYPE_MODES

        n = self.cutoff_tokens if tokens is None else tokens
        if n is None:
            return None
        return float(
            F.mib_per_gpu(n, self.shape.hidden, DTYPE_MODES[self.run.dtype].act_bytes, self.run.tp)
        )

    def crossover(self, schedule: str = "sp_asynctp") -> int | None:
        """The grid point from which the schedule beats plain TP at every N to the budget (§9)."""
        # No premium, any traffic; apart from the cutoff, which weighs the traffic and the premium
        # (issue 61 item 13).
        s = self.grid_speedup_sp_asynctp if schedule == "sp_asynctp" else self.grid_speedup_sp
        if s is None:
            return None
        s = np.nan_to_num(np.asarray(s, dtype=float), nan=0.0)
        return crossover_tokens(self.grid_tokens, np.ones_like(s), 1.0 / np.maximum(s, 1e-30))


def _host_bound(s: Any, i: int) -> bool:
    """Row i of a schedule runs eagerly and its host issue time exceeds its GPU time: the step waits
    on the host, so the time stays flat over N (issue 61 item 14)."""
    eager = np.ravel(np.broadcast_to(s.eager, np.shape(s.t_gpu_forward_s)))[i]
    host = np.ravel(np.broadcast_to(s.t_host_forward_s, np.shape(s.t_gpu_forward_s)))[i]
    return bool(eager) and bool(host > np.ravel(s.t_gpu_forward_s)[i])


def curve(a: Analysis, num_tokens: Any) -> Prediction:
    """The prediction of analysis `a` at other N, all else the same (§9)."""
    # Same profile, model, TP, dtype, fusion range and regime.
    return predict(a.profile, a.shape, a.run.tp, a.run.dtype, num_tokens, a.run.regime)


def token_grid(tp: int, max_num_batched_tokens: int) -> np.ndarray:
    """Multiples of tp from tp to max_num_batched_tokens: the N vLLM runs with SP (§9)."""
    top = (max_num_batched_tokens // tp) * tp
    if top < tp:
        raise TpcostError(f"--max-num-batched-tokens {max_num_batched_tokens} is below tp={tp}")
    return np.arange(tp, top + 1, tp, dtype=float)


def band_grid(grid: np.ndarray, weights: Any = None) -> tuple[np.ndarray, np.ndarray, int]:
    """(grid, weights, k) the band is decided on: every k-th point of the grid (§9)."""
    # the grid itself (k = 1) up to BAND_GRID_MAX points, else every k-th point (k = ⌈n /
    # BAND_GRID_MAX⌉), each carrying the summed weight of its block of k.
    w = uniform_workload(grid) if weights is None else np.asarray(weights, dtype=float)
    k = -(-grid.size // BAND_GRID_MAX)
    if k == 1:
        return grid, w, 1
    return grid[::k], np.add.reduceat(w, np.arange(0, grid.size, k)), k


def expected_time_by_threshold_s(
    t_off_s: Any, t_on_s: Any, weights: Any, margin: float
) -> np.ndarray:
    """E[forward time] at each threshold c = grid[i], and at 'never' in the last column (§9)."""
    # E[forward time] for each threshold c = grid[i] (steps with N ≥ c run the overlapped schedule
    # at (1+margin)·t_on, the others t_off), and for 'never' in the last column (s). Shapes (..., n)
    # -> (..., n+1).
    w = np.asarray(weights, dtype=float)
    # an unavailable schedule (inf) at a zero-weight N costs nothing
    with np.errstate(invalid="ignore"):
        off = np.where(w > 0, np.asarray(t_off_s) * w, 0.0)
        on = np.where(w > 0, np.asarray(t_on_s) * ((1.0 + margin) * w), 0.0)
    # Σ_{j<i} off
    below = np.concatenate([np.zeros(off.shape[:-1] + (1,)), np.cumsum(off, axis=-1)], axis=-1)
    above = np.concatenate(
        [np.cumsum(on[..., ::-1], axis=-1)[..., ::-1], np.zeros(on.shape[:-1] + (1,))], axis=-1
    )
    return below + above


def best_split(cost: Any, prefer_larger: bool) -> Any:
    """Index of the smallest expected time over the split points (..., n+1) (§9)."""
    # Index of the smallest expected time over the split points (..., n+1); ties to the larger index
    # or the smaller one. The one argmin both decisions share (the SP cutoff and the FlashInfer
    # fusion limit).
    cost = np.where(np.isfinite(cost), cost, np.inf)
    if prefer_larger:
        return cost.shape[-1] - 1 - np.argmin(cost[..., ::-1], axis=-1)
    return np.argmin(cost, axis=-1)


def crossover_tokens(grid: np.ndarray, t_off_s: Any, t_on_s: Any) -> int | None:
    """The smallest grid point from which the fused side wins at every point to the end (§9)."""
    # The smallest grid point from which the fused side is faster at every point to the end of the
    # grid (where the curves cross for good), None where it is not faster at the last one: apart
    # from the decided threshold, which weighs the traffic and the premium (issue 50 item 8).
    wins = np.asarray(t_on_s) < np.asarray(t_off_s)
    if wins.size == 0 or not wins[-1]:
        return None
    losing = np.flatnonzero(~wins)
    return int(grid[0 if losing.size == 0 else losing[-1] + 1])


def decide_cutoff(
    grid: np.ndarray,
    t_off_s: Any,
    t_on_s: Any,
    margin: float,
    weights: Any = None,
    below: float = np.inf,
) -> Any:
    """The threshold that minimises the expected forward time over the workload (§9)."""
    # c ∈ grid (multiples of tp) or None (never); steps with N ≥ c pay (1+margin)·t_on, the rest
    # t_off; ties go to the larger c. Only c < `below` is a candidate: vLLM's SP threshold acts only
    # below the token budget (_set_compile_ranges splits at c − 1 only when 1 < c <
    # max_num_batched_tokens, and no compile range starts at c ≥ the budget), so c = budget is
    # "never" in all but name. For (draws, n) inputs returns a float array (inf = never).
    w = uniform_workload(grid) if weights is None else weights
    cost = expected_time_by_threshold_s(t_off_s, t_on_s, w, margin)
    unreal = np.append(np.asarray(grid, dtype=float) >= below, False)
    if unreal.any():
        cost = np.where(unreal, np.inf, cost)
    i = best_split(cost, prefer_larger=True)
    cands = np.append(grid, np.inf)
    vals = cands[i]
    if np.ndim(vals) == 0:
        return None if np.isinf(vals) else int(vals)
    return vals


def decide_fusion_limit(
    grid: np.ndarray,
    t_fused_s: Any,
    t_unfused_s: Any,
    margin: float,
    weights: Any = None,
    cap_tokens: int | None = None,
) -> int:
    """The FlashInfer fused all-reduce+RMSNorm limit (tokens) by the SP cutoff's rule (§9)."""
    # The FlashInfer fused all-reduce+RMSNorm limit (tokens) by the same rule as the SP cutoff:
    # steps with N ≤ c pay (1+margin)·t_fused, the rest t_unfused; c minimises the expected time
    # over the workload (0 = fusion off); ties go to the smaller c; never above `cap_tokens` (vLLM's
    # own limit: FlashInfer's workspace is sized by it, docs/model.md §9).
    w = uniform_workload(grid) if weights is None else weights
    t_f = np.asarray(t_fused_s, dtype=float)
    t_u = np.asarray(t_unfused_s, dtype=float)
    if cap_tokens is not None:  # beyond vLLM's limit the fused kernel is not a candidate
        t_f = np.where(grid <= cap_tokens, t_f, np.inf)
    cost = expected_time_by_threshold_s(t_f * (1.0 + margin), t_u, w, 0.0)
    i = int(best_split(cost, prefer_larger=False))
    return 0 if i == 0 else int(grid[i - 1])


def decision_value(
    grid: np.ndarray,
    t_off_s: Any,
    t_on_s: Any,
    margin: float,
    cutoff: int | None,
    weights: Any = None,
    vllm_default: int | None = None,
    below: float = np.inf,
) -> dict:
    """What the cutoff is worth on the workload: expected forward time at it and beside (§9)."""
    # expected forward time (s) at it, at never, at vLLM's default and at the best threshold in
    # hindsight (the oracle: no risk premium), and the savings between them.
    w = uniform_workload(grid) if weights is None else weights
    true = expected_time_by_threshold_s(t_off_s, t_on_s, w, 0.0)  # what each threshold really costs

    def at(c):
        if c is None:
            return float(true[-1])
        return float(true[int(np.searchsorted(grid, c, side="left"))])

    t_never, t_cut = at(None), at(cutoff)
    # the oracle: realisable
    real = np.where(np.append(np.asarray(grid, dtype=float) >= below, False), np.inf, true)
    i_best = int(real.size - 1 - np.argmin(real[::-1]))
    oracle = None if i_best == grid.size else int(grid[i_best])
    with_premium = expected_time_by_threshold_s(t_off_s, t_on_s, w, margin)
    i_cut = grid.size if cutoff is None else int(np.searchsorted(grid, cutoff, side="left"))
    out = {
        "expected_forward_s": t_cut,
        "expected_forward_never_s": t_never,
        "expected_forward_with_premium_s": float(with_premium[i_cut]),
        "saving_vs_never_s": t_never - t_cut,
        "saving_vs_never_rel": (t_never - t_cut) / t_never,
        "oracle_cutoff_tokens": oracle,
        "regret_vs_oracle_s": t_cut - float(true[i_best]),
    }
    if vllm_default is not None:
        vd = (
            None if vllm_default > grid[-1] else int(grid[int(np.searchsorted(grid, vllm_default))])
        )
        # inf where vLLM would enable what cannot run
        out["saving_vs_vllm_default_s"] = at(vd) - t_cut
    return {k: (v if not isinstance(v, float) or np.isfinite(v) else None) for k, v in out.items()}


def decided_schedule(a: Analysis, asynctp: bool | None = None) -> tuple[str | None, int | None]:
    """(schedule, threshold) vLLM should run, or (None, None) for plain TP (§9)."""
    # "sp_asynctp" or "sp" from its cutoff, or (None, None) for plain TP. `asynctp` None: tpcost
    # chooses between the two (AsyncTP only where torch's fused ops can run); False: SP alone (the
    # user's choice, or vLLM's resolution of an unset fuse_gemm_comms); True: SP+AsyncTP. Each
    # schedule's cost is its expected forward time at its own cutoff with the risk premium on the
    # steps it runs (decision_value); plain TP wins ties, then SP alone.
    if not a.run.regime.vllm.sp_passes:  # a release without the SP and AsyncTP passes
        return None, None
    cands: list[tuple[float, int, str | None, int | None]] = []
    dv, sdv = a.decision_value or {}, a.sp_decision_value or {}
    never = dv.get("expected_forward_never_s") or sdv.get("expected_forward_never_s")
    if never is not None:
        cands.append((never, 0, None, None))
    if (
        asynctp is not True
        and a.sp_cutoff_tokens is not None
        and sdv.get("expected_forward_with_premium_s") is not None
    ):
        cands.append((sdv["expected_forward_with_premium_s"], 1, "sp", a.sp_cutoff_tokens))
    if (
        asynctp is not False
        and a.asynctp_available
        and a.cutoff_tokens is not None
        and dv.get("expected_forward_with_premium_s") is not None
    ):
        cands.append((dv["expected_forward_with_premium_s"], 2, "sp_asynctp", a.cutoff_tokens))
    if not cands:
        return None, None
    _, _, sched, thr = min(cands)
    return sched, thr


def perturbed(
    profile: HardwareProfile, key: str, z: Any, sigma_rel: float | None = None
) -> np.ndarray:
    """The value of `key` moved by z sigmas of its tier: x·e^(σ·z), clipped (§9)."""
    # The value of `key` moved by z standard deviations of its tier (or `sigma_rel`): x·e^(σ·z),
    # clipped into the key's plausible range (profile.VALUE_RANGES: efficiencies and fractions at 1,
    # slowdowns at 10, ...); draws are never refused.
    sig = profile.provenance[key].sigma_rel if sigma_rel is None else sigma_rel
    x = profile.value(key) * np.exp(sig * np.asarray(z, dtype=float))
    r = value_range(key)
    return np.clip(x, np.nextafter(r.lo, np.inf) if r.lo_open else r.lo, r.hi)


def perturbable_keys(profile: HardwareProfile) -> list[str]:
    """The profile's quantities the band and the sensitivity table move, sorted (§9)."""
    # The profile's quantities the band and the sensitivity table move, sorted: not code constants
    # or shapes (UNPERTURBED_PREFIXES), not 0 (an ideal part).
    return [
        k
        for k, v in sorted(profile.values().items())
        if not k.startswith(UNPERTURBED_PREFIXES) and v != 0
    ]


def perturbed_values(
    profile: HardwareProfile, draws: int, seed: int, sigma_rel: Mapping[str, float] | None = None
) -> dict[str, np.ndarray]:
    """Lognormal draws of the profile's values as (draws, 1) arrays, one stream per key (§9)."""
    # Lognormal draws (median = profile value, σ by provenance tier, or `sigma_rel`'s for the keys
    # it names) as (draws, 1) arrays. Each key draws from its own stream, seeded by (seed, crc32 of
    # the key): a key added to or removed from a profile leaves every other key's draws, and so the
    # band, unchanged.
    import zlib

    def z(key: str) -> np.ndarray:
        return np.random.default_rng([seed, zlib.crc32(key.encode())]).standard_normal(draws)

    over = sigma_rel or {}
    return {
        key: perturbed(profile, key, z(key), over.get(key))[:, None]
        for key in perturbable_keys(profile)
    }


def cutoff_band(
    profile: HardwareProfile,
    shape: ModelShape,
    run: RunConfig,
    grid: np.ndarray,
    weights: Any = None,
    below: float = np.inf,
    draws: int = BAND_DRAWS,
    seed: int = BAND_SEED,
) -> tuple[int | None, int | None]:
    """5th-95th percentile of the cutoff over a fixed-seed Monte Carlo of the profile (§9)."""
    # 5th–95th percentile of the cutoff decision over a fixed-seed Monte Carlo of the profile (never
    # = +inf), on `grid` with its `weights` (run.workload is not re-read: the caller may have
    # coarsened the grid).
    from .profile import recording

    tp, dtype, margin = run.tp, run.dtype, run.margin
    # the drivers named are quantities this query reads (a --set can move them)
    traced, reads = recording(profile)
    # every size: each dispatches its own collective
    predict(traced, shape, tp, dtype, grid, run.regime)
    vals = perturbed_values(profile, draws, seed)
    cuts = []
    for lo in range(0, draws, BAND_CHUNK):
        chunk = {k: v[lo : lo + BAND_CHUNK] for k, v in vals.items()}
        prof = profile.with_values(chunk, None, mark_modified=False)
        pred = predict(prof, shape, tp, dtype, grid, run.regime)
        cuts.append(
            decide_cutoff(
                grid, pred.t_forward_s("tp"), pred.t_forward_s("sp_asynctp"), margin, weights, below
            )
        )
    return band_edges(np.concatenate(cuts), {k: v for k, v in vals.items() if k in reads})


class Band(tuple):
    """(5th, 95th percentile) of a decision over the draws, None for "never" (§9)."""

    # (5th, 95th percentile) of a decision over the profile's draws, None for "never";
    # `never_share`: the share of the draws in which the op never pays (what an edge at "never"
    # leaves unsaid); `drivers`: the inputs whose draws move the decision most ((quantity, rank
    # correlation), band_drivers; empty where not asked).

    never_share: float
    drivers: tuple[tuple[str, float], ...]

    def __new__(
        cls,
        lo: int | None,
        hi: int | None,
        never_share: float = 0.0,
        drivers: tuple[tuple[str, float], ...] = (),
    ):
        band = super().__new__(cls, (lo, hi))
        band.never_share = never_share
        band.drivers = drivers
        return band

    def text(self) -> str:
        """'[lo, hi]' in tokens; where an edge is never, the share of draws that never pay (§9)."""
        lo, hi = self
        out = f"[{'never' if lo is None else lo}, {'never' if hi is None else hi}]"
        return out + (f" (never pays in {self.never_share:.0%} of the draws)" if hi is None else "")


def band_edges(cuts: Any, draws: Mapping[str, Any] | None = None) -> Band:
    """The 5th and 95th percentile of a decision over the draws: the one reading of a band (§9)."""
    # The 5th and 95th percentile of a decision over the draws (observed values: the lower / higher
    # neighbour), an infinite one ("never") as None, and the share of draws that never pay: the one
    # reading of every band; with the `draws` the decision was made from, also what drives it
    # (band_drivers).
    c = np.atleast_1d(np.asarray(cuts, dtype=float))
    lo, hi = np.percentile(c, 5, method="lower"), np.percentile(c, 95, method="higher")
    return Band(
        None if np.isinf(lo) else int(lo),
        None if np.isinf(hi) else int(hi),
        float(np.mean(np.isinf(c))),
        band_drivers(draws, c) if draws is not None else (),
    )


def band_drivers_json(band: Any) -> list[dict] | None:
    """A band's drivers as JSON: [{quantity, rank_correlation}], None without a band (§9)."""
    if band is None:
        return None
    return [{"quantity": k, "rank_correlation": r} for k, r in getattr(band, "drivers", ())]


def band_drivers_text(band: Any) -> str:
    """One line naming what moves a band ("" where nothing does) for op and whatif (§9)."""
    drivers = getattr(band, "drivers", ())
    return (
        (
            "what moves the band (rank correlation of a quantity's draws with the cutoff, never "
            "counted as the "
            "largest): " + ", ".join(f"{k} {r:+.2f}" for k, r in drivers)
        )
        if drivers
        else ""
    )


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean of their positions; +inf ranks last)."""
    _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    return ((ends - counts + ends - 1) / 2.0)[inv]


BAND_DRIVERS_SHOWN, BAND_DRIVER_MIN = 5, 0.1


def band_drivers(draws: Mapping[str, Any], cuts: np.ndarray) -> tuple[tuple[str, float], ...]:
    """The inputs that move a decision across the draws, by rank correlation (§9)."""
    # Spearman's rank correlation of each drawn quantity with the decision (never = +inf, so a
    # quantity that makes the op never pay correlates positively), the largest BAND_DRIVERS_SHOWN
    # with |ρ| ≥ BAND_DRIVER_MIN, largest first. A constant decision has none.
    rc = _ranks(np.asarray(cuts, dtype=float).ravel())
    if np.ptp(rc) == 0:
        return ()
    rc = (rc - rc.mean()) / rc.std()
    out = []
    for key, v in draws.items():
        rv = _ranks(np.asarray(v, dtype=float).ravel())
        if rv.size != rc.size or np.ptp(rv) == 0:
            continue
        rho = float(np.mean(rc * (rv - rv.mean()) / rv.std()))
        if abs(rho) >= BAND_DRIVER_MIN:
            out.append((key, round(rho, 3)))
    return tuple(sorted(out, key=lambda t: -abs(t[1]))[:BAND_DRIVERS_SHOWN])


def model_inputs(profile: HardwareProfile, tp: int) -> list[str]:
    """The perturbable inputs the model reads at this TP size (§9)."""
    # Collective entries of other TP sizes dropped.
    keys = []
    for key in perturbable_keys(profile):
        parts = key.split(".")
        if (
            parts[0] == "collectives"
            and len(parts) == 4
            and parts[2] != f"tp{profile.collective_entry_tp(parts[1], tp)}"
        ):
            continue
        keys.append(key)
    return keys


def cutoff_sensitivity(
    profile: HardwareProfile,
    shape: ModelShape,
    run: RunConfig,
    grid: np.ndarray,
    base_cutoff: int | None,
    weights: Any = None,
    below: float = np.inf,
) -> list[dict]:
    """The cutoff with each model input moved by one sigma either way (§9)."""
    # One at a time, each model input × e^(−σ) and × e^(+σ) (σ of its tier; efficiencies capped at
    # 1): the cutoff with each. Returned for the inputs that move it away from `base_cutoff` (the
    # profile's own), largest move first ("never" = beyond the grid).
    tp, dtype, margin = run.tp, run.dtype, run.margin
    keys = model_inputs(profile, tp)
    variants = [(k, sign) for k in keys for sign in (-1.0, 1.0)]
    cuts = []
    for lo in range(0, len(variants), BAND_CHUNK):
        part = variants[lo : lo + BAND_CHUNK]
        vals: dict[str, np.ndarray] = {}
        for i, (k, sign) in enumerate(part):
            row = vals.setdefault(k, np.full((len(part), 1), profile.value(k)))
            row[i, 0] = perturbed(profile, k, sign)
        pred = predict(
            profile.with_values(vals, None, mark_modified=False), shape, tp, dtype, grid, run.regime
        )
        c_part = decide_cutoff(
            grid, pred.t_forward_s("tp"), pred.t_forward_s("sp_asynctp"), margin, weights, below
        )
        # variants of keys the prediction does not read give one cutoff for the whole chunk: one per
        # variant
        cuts.append(np.broadcast_to(np.atleast_1d(np.asarray(c_part, dtype=float)), (len(part),)))
    c = np.concatenate(cuts)
    beyond = grid[-1] + tp
    b = beyond if base_cutoff is None else base_cutoff
    out = []
    for j, k in enumerate(keys):
        lo_c, hi_c = c[2 * j], c[2 * j + 1]
        move = max(abs(min(lo_c, beyond) - b), abs(min(hi_c, beyond) - b))
        if move > 0:
            prm = profile.provenance[k]
            out.append(
                {
                    "quantity": k,
                    "tier": prm.tier,
                    "sigma_rel": prm.sigma_rel,
                    "source": prm.source,
                    "cutoff_minus_sigma_tokens": None if np.isinf(lo_c) else int(lo_c),
                    "cutoff_plus_sigma_tokens": None if np.isinf(hi_c) else int(hi_c),
                    "_move": move,
                }
            )
    out.sort(key=lambda r: -r.pop("_move"))
    return out


def display_tokens(max_tokens: int = 65536) -> np.ndarray:
    return 2.0 ** np.arange(0, int(np.log2(max_tokens)) + 1)


def analyse(
    profile: HardwareProfile,
    shape: ModelShape,
    run: RunConfig,
    *,
    band: bool = True,
    display_max_tokens: int = 65536,
    tokens: Any = None,
) -> Analysis:
    """Cutoff decision, band and a table at `tokens` for the query `run` (§9)."""
    # Cutoff decision, band and a table at `tokens` (default: powers of two up to
    # display_max_tokens, plus the cutoff) for the query `run`. Its workload
    # (costmodel.workload.Workload; None: uniform over the multiples of tp) is the traffic the
    # decision serves; its histogram buckets are spread uniformly, and the other spreads are
    # reported. Its regime's fi_max_bytes is the FlashInfer fusion limit vLLM will run with,
    # cudagraph_max_tokens vLLM's largest CUDA-graph capture size (steps above it pay the host's
    # issue time).
    tp, dtype, margin = run.tp, run.dtype, run.margin
    max_num_batched_tokens, workload, reg = run.max_num_batched_tokens, run.workload, run.regime
    if tokens is not None and (len(tokens) == 0 or any(int(t) != t or t <= 0 for t in tokens)):
        raise TpcostError("--tokens: token counts N must be integers > 0")
    if not isinstance(max_num_batched_tokens, int) or max_num_batched_tokens < 1:
        raise TpcostError("--max-num-batched-tokens must be a positive integer")
    if not (0.0 <= margin < 1.0):
        raise TpcostError(f"--margin must be in [0, 1), got {margin}")
    grid = token_grid(tp, max_num_batched_tokens)
    # vLLM realises SP thresholds c < budget only (decide_cutoff)
    budget = float(max_num_batched_tokens)
    weights, by_spread = None, None
    if workload is not None:
        from .workload import SPREADS, grid_weights

        weights = grid_weights(workload, grid, "uniform")
    pred = predict(profile, shape, tp, dtype, grid, reg)
    t_tp, t_spa = pred.t_forward_s("tp"), pred.t_forward_s("sp_asynctp")
    if workload is not None and workload.buckets:
        by_spread = {
            sp: decide_cutoff(grid, t_tp, t_spa, margin, grid_weights(workload, grid, sp), budget)
            for sp in SPREADS
        }
    cut = decide_cutoff(grid, t_tp, t_spa, margin, weights, budget)
    sp_cut = decide_cutoff(grid, t_tp, pred.t_forward_s("sp"), margin, weights, budget)
    band_v = sens = resolution = None
    # nothing to draw where the schedule cannot run
    if band and "sp_asynctp" not in pred.unavailable:
        b_grid, b_weights, k = band_grid(grid, weights)
        b_cut = (
            cut
            if k == 1
            else decide_cutoff(b_grid, t_tp[::k], t_spa[::k], margin, b_weights, budget)
        )
        band_v = cutoff_band(profile, shape, run, b_grid, b_weights, budget)
        sens = cutoff_sensitivity(profile, shape, run, b_grid, b_cut, b_weights, budget)
        resolution = k * tp
    shown = (
        display_tokens(display_max_tokens)
        if tokens is None
        else np.unique(np.asarray(tokens, dtype=float))
    )
    if cut is not None:
        shown = np.union1d(shown, [cut])
    table = predict(profile, shape, tp, dtype, shown, reg)
    bd = None
    if cut is not None:
        i = int(np.searchsorted(grid, cut))
        bd = {k: float(pred.breakdown[k][i]) for k in BREAKDOWN_KEYS}
    vllm_default = vllm_sp_min_token_num(
        profile.identity.vendor, profile.identity.compute_capability, shape.hidden, tp
    )
    value = decision_value(grid, t_tp, t_spa, margin, cut, weights, vllm_default, budget)
    sp_value = decision_value(
        grid, t_tp, pred.t_forward_s("sp"), margin, sp_cut, weights, None, budget
    )
    memory = memory_fit(profile, shape, tp, dtype)
    return Analysis(
        profile,
        shape,
        run,
        cut,
        sp_cut,
        band_v,
        table,
        bd,
        grid,
        pred.speedup_sp_asynctp,
        sens,
        vllm_default,
        value,
        pred.asynctp_available,
        "uniform over the multiples of tp"
        if workload is None
        else _workload_text(workload, max_num_batched_tokens),
        by_spread,
        memory,
        resolution,
        sp_value,
        pred.speedup("sp"),
    )


def _workload_text(workload: Any, budget: int) -> str:
    """The workload's name, with the line on its chunked steps where it has steps above the
    budget."""
    from .workload import chunked_note

    note = chunked_note(workload, budget)
    return workload.name + ("" if note is None else f"; {note}")


def memory_fit(profile: HardwareProfile, shape: ModelShape, tp: int, dtype: str) -> dict:
    """Weights per GPU at this TP and dtype against the profile's HBM capacity (§8b)."""
    # When the profile has one.
    from . import formulas as F
    from .ops import dtype_mode

    from .layer import LayerSpec

    w = float(
        F.weight_bytes_per_gpu(
            LayerSpec.build(shape, tp, dtype).params_per_rank(), dtype_mode(dtype).gemm_in_bytes
        )
    )
    cap = profile.memory.hbm_capacity_bytes
    out = {
        "weights_per_gpu_bytes": w,
        "hbm_capacity_bytes": cap,
        "fits": None if cap is None else w <= cap,
    }
    if cap is not None and w > cap:
        out["note"] = (
            f"{shape.name} does not fit: its {dtype} weights need {w / 1e9:.0f} GB per GPU at "
            f"tp={tp}, "
            f"{profile.name} has {cap / 1e9:.0f} GB (the KV cache would need more); the times "
            "assume it fits"
        )
    return out


def provenance(profile: HardwareProfile) -> dict:
    return {
        "tier": profile.tier,
        "profile": profile.name,
        "origin": profile.origin,
        "modified": list(profile.modified),
        "tier_counts": profile.tier_counts(),
        "sources": profile.sources(),
    }


def calibration_note(profile: HardwareProfile, tp: int) -> str | None:
    """One line where the collectives were calibrated at other TP sizes only (§10)."""
    # Measured points, or fitted values of tier calibrated: the answer at this TP is the prior's
    # (issue 61 item 10).
    import re

    tps = {
        int(m.group(1))
        for k, p in profile.provenance.items()
        if p.tier == "calibrated"
        for m in [re.match(r"collectives\.[a-z0-9_]+\.tp(\d+)\.", k)]
        if m
    }
    tps |= {w for per in profile.measured.values() for w in per}
    if not tps or tp in tps:
        return None
    return (
        f"{profile.name}'s collectives were calibrated at TP "
        f"{', '.join(str(x) for x in sorted(tps))} only: at "
        f"TP {tp} they are the prior's, and the answer is the same as the built-in's (calibrate at "
        f"TP {tp} too)"
    )


def provenance_line(profile: HardwareProfile) -> str:
    """One line: the profile, its origin, its weakest tier, its values by tier (§17)."""
    # whatif, op.
    pv = provenance(profile)
    counts = ", ".join(f"{k} {v}" for k, v in pv["tier_counts"].items() if v)
    mod = f"; MODIFIED by --set: {', '.join(pv['modified'])}" if pv["modified"] else ""
    return (
        f"provenance: profile {pv['profile']} ({pv['origin']}), weakest tier used: {pv['tier']}; "
        "values by tier: "
        f"{counts}{mod}"
    )


def _finite(x) -> float | None:
    """A JSON number, or None for a value that does not exist (inf, NaN)."""
    x = float(x)
    return x if np.isfinite(x) else None


def analysis_json(a: Analysis) -> dict:
    t = a.table
    decided = decided_schedule(a)
    rows = []
    speedups = {s: t.speedup(s) for s in SCHEDULES[1:]}
    dec = a.run.regime.decode
    for i, n in enumerate(t.num_tokens):  # a schedule that cannot run: null (finite_json), never 0
        rows.append(
            {
                "num_tokens": int(n),
                "decode_context_len": None
                if dec is None
                else float(np.ravel(dec.context_at(n))[0]),
                "decode_context_from": "none: every token prefill"
                if dec is None
                else dec.context_source(int(n)),
                **{f"t_{s}_s": _finite(t.t_forward_s(s)[i]) for s in SCHEDULES},
                **{f"t_{s}_layer_s": _finite(t.schedules[s].t_layer_s[i]) for s in SCHEDULES},
                **{f"speedup_{s}": _finite(v[i]) for s, v in speedups.items()},
                "host_bound": [s for s in SCHEDULES if _host_bound(t.schedules[s], i)],
            }
        )
    return {
        "gpu": a.profile.name,
        "model": a.shape.name,
        "tp": a.run.tp,
        "dtype": a.run.dtype,
        "seq_len": a.run.regime.seq_len,
        "max_num_batched_tokens": a.run.max_num_batched_tokens,
        "margin": a.run.margin,
        "cutoff_tokens": a.cutoff_tokens,
        "cutoff_mib_per_gpu": a.cutoff_mib(),
        "cutoff_band_tokens": list(a.cutoff_band_tokens) if a.cutoff_band_tokens else None,
        "cutoff_band_never_share": getattr(a.cutoff_band_tokens, "never_share", None),
        "cutoff_band_drivers": band_drivers_json(a.cutoff_band_tokens),
        "band_resolution_tokens": a.band_resolution_tokens,
        "sp_cutoff_tokens": a.sp_cutoff_tokens,
        "crossover_tokens": a.crossover("sp_asynctp"),
        "sp_crossover_tokens": a.crossover("sp"),
        "decided_schedule": decided[0],
        "decided_threshold_tokens": decided[1],
        "breakdown_at_cutoff_s": a.breakdown_at_cutoff,
        "cutoff_sensitivity": a.sensitivity,
        "vllm_default_sp_min_token_num": a.vllm_default_tokens,
        "decision_value": a.decision_value,
        "sp_decision_value": a.sp_decision_value,
        "workload": a.workload,
        "cutoff_by_spread": a.cutoff_by_spread,
        "memory": a.memory,
        "asynctp_available": a.asynctp_available,
        "unavailable": dict(t.unavailable),
        "notes": list(t.notes) + [n for n in (calibration_note(a.profile, a.run.tp),) if n],
        "provenance": provenance(a.profile),
        "rows": rows,
    }


def ops_view(pred: Prediction) -> dict[str, list[dict]]:
    """Every op of each schedule at the first N of `pred`, with the formula that times it (§1)."""
    # count, per-call GPU and host time, achieved rates, the bound it hits (the largest of its
    # parts) and the formula that times it (docs/model.md §k).

    def first(x):
        return float(np.ravel(x)[0]) if np.ndim(x) else float(x)

    out = {}
    for name, sched in pred.schedules.items():
        rows = []
        for where, group, mult in (
            ("layer", sched.layer_ops, sched.num_layers),
            ("once", sched.nonlayer_ops, 1),
        ):
            for o in group:
                t = first(o.t_s)
                parts = {k: first(v) for k, v in (o.parts or {}).items()}
                bound = max(parts, key=lambda b: parts[b]) if parts else None
                if bool(np.ravel(sched.eager)[0]) and first(o.t_host_s) > t:
                    # an eager forward issues this op slower than the GPU runs it (never under
                    # replay)
                    bound = "host"
                rows.append(
                    {
                        "op": o.name,
                        "where": where,
                        "calls_per_forward": o.count * mult,
                        "t_s": t,
                        "t_host_s": first(o.t_host_s),
                        "achieved_flops_per_s": first(o.flops) / t
                        if t > 0 and first(o.flops)
                        else None,
                        "achieved_hbm_bytes_per_s": first(o.hbm_bytes) / t
                        if t > 0 and first(o.hbm_bytes)
                        else None,
                        "achieved_bus_bytes_per_s": first(o.link_bytes) / t
                        if t > 0 and first(o.link_bytes)
                        else None,
                        "bound": bound,
                        "parts_s": parts,
                        "formula": o.formula,
                        "docs": f"docs/model.md {o.section}",
                    }
                )
        out[name] = rows
    return out
