"""Speedup curve → cutoff (with a Monte Carlo band) → the numbers `tpcost whatif` reports."""

from __future__ import annotations

import dataclasses

import numpy as np

from .errors import TpcostError
from .model import BREAKDOWN_KEYS, SCHEDULES, Prediction, predict
from .profile import UNPERTURBED_PREFIXES, HardwareProfile
from .shapes import ModelShape
from .vllm_rules import vllm_sp_min_token_num

BAND_DRAWS = 200
BAND_SEED = 0
BAND_CHUNK = 50
EFFICIENCY_KEYS = ("max_efficiency", "mem_efficiency", "stream_concurrency", "efficiency")


@dataclasses.dataclass(frozen=True)
class Analysis:
    profile: HardwareProfile
    shape: ModelShape
    tp: int
    dtype: str
    seq_len: int
    max_num_batched_tokens: int
    margin: float
    cutoff_tokens: int | None
    sp_cutoff_tokens: int | None
    cutoff_band_tokens: tuple[int | None, int | None] | None
    table: Prediction  # at the display token counts
    breakdown_at_cutoff: dict[str, float] | None
    grid_tokens: np.ndarray  # the multiples of tp the cutoff is decided on
    grid_speedup_sp_asynctp: np.ndarray
    sensitivity: list[dict] | None = None  # cutoff_sensitivity(): the inputs that move the cutoff, largest first
    vllm_default_tokens: int | None = None  # vLLM 0.31's own sp_min_token_num here (None: SP off)


def token_grid(tp: int, max_num_batched_tokens: int) -> np.ndarray:
    """Multiples of tp from tp to max_num_batched_tokens (the N vLLM can run with SP enabled)."""
    top = (max_num_batched_tokens // tp) * tp
    if top < tp:
        raise TpcostError(f"--max-num-batched-tokens {max_num_batched_tokens} is below tp={tp}")
    return np.arange(tp, top + 1, tp, dtype=float)


def cutoff_from_speedup(grid: np.ndarray, speedup: np.ndarray, margin: float):
    """Smallest N on the grid from which speedup ≥ 1+margin holds for every larger N; None if none.

    `speedup` may be (n,) or (draws, n); returns an int/None or an array of floats (inf = never)."""
    ok = speedup >= 1.0 + margin
    ok2 = np.atleast_2d(ok)
    # index of the last failing point per row; the cutoff is the next grid point
    rev_fail = np.argmax(~ok2[:, ::-1], axis=1)
    any_fail = (~ok2).any(axis=1)
    first_ok = np.where(any_fail, ok2.shape[1] - rev_fail, 0)
    vals = np.where(first_ok < ok2.shape[1], grid[np.minimum(first_ok, ok2.shape[1] - 1)], np.inf)
    if ok.ndim == 1:
        return None if np.isinf(vals[0]) else int(vals[0])
    return vals


def perturbed(profile: HardwareProfile, key: str, z):
    """The value of `key` moved by z standard deviations of its tier: x·e^(σ·z), efficiencies capped at 1."""
    p = profile.params[key]
    x = p.value * np.exp(p.sigma_rel * np.asarray(z, dtype=float))
    return np.minimum(x, 1.0) if key.rsplit(".", 1)[-1] in EFFICIENCY_KEYS else x


def perturbed_values(profile: HardwareProfile, draws: int, seed: int) -> dict[str, np.ndarray]:
    """Lognormal draws (median = profile value, σ by provenance tier) as (draws, 1) arrays."""
    rng = np.random.default_rng(seed)
    out = {}
    for key in sorted(profile.params):
        if key.startswith(UNPERTURBED_PREFIXES) or profile.params[key].value == 0:
            continue
        out[key] = perturbed(profile, key, rng.standard_normal(draws))[:, None]
    return out


def cutoff_band(profile, shape, tp, dtype, seq_len, grid, margin, draws=BAND_DRAWS, seed=BAND_SEED):
    """5th–95th percentile of the cutoff over a fixed-seed Monte Carlo of the profile (never = +inf)."""
    vals = perturbed_values(profile, draws, seed)
    cuts = []
    for lo in range(0, draws, BAND_CHUNK):
        chunk = {k: v[lo:lo + BAND_CHUNK] for k, v in vals.items()}
        prof = profile.with_values(chunk, mark_modified=False)
        pred = predict(prof, shape, tp, dtype, grid, seq_len)
        cuts.append(cutoff_from_speedup(grid, pred.speedup_sp_asynctp, margin))
    c = np.concatenate(cuts)
    lo, hi = np.percentile(c, 5, method="lower"), np.percentile(c, 95, method="higher")

    def as_int(x):
        return None if np.isinf(x) else int(x)

    return as_int(lo), as_int(hi)


def model_inputs(profile: HardwareProfile, tp: int) -> list[str]:
    """The perturbable inputs the model reads at this TP size (collective entries of other TP sizes dropped)."""
    keys = []
    for key in sorted(profile.params):
        if key.startswith(UNPERTURBED_PREFIXES) or profile.params[key].value == 0:
            continue
        parts = key.split(".")
        if parts[0] == "collectives" and len(parts) == 4 and parts[2] != f"tp{profile.collective_entry_tp(parts[1], tp)}":
            continue
        keys.append(key)
    return keys


def cutoff_sensitivity(profile, shape, tp, dtype, seq_len, grid, margin, base_cutoff) -> list[dict]:
    """One at a time, each model input × e^(−σ) and × e^(+σ) (σ of its tier; efficiencies capped at 1): the
    cutoff with each. Returned for the inputs that move it away from `base_cutoff` (the profile's own),
    largest move first ("never" = beyond the grid)."""
    keys = model_inputs(profile, tp)
    variants = [(k, sign) for k in keys for sign in (-1.0, 1.0)]
    cuts = []
    for lo in range(0, len(variants), BAND_CHUNK):
        part = variants[lo:lo + BAND_CHUNK]
        vals: dict[str, np.ndarray] = {}
        for i, (k, sign) in enumerate(part):
            row = vals.setdefault(k, np.full((len(part), 1), profile.params[k].value))
            row[i, 0] = perturbed(profile, k, sign)
        pred = predict(profile.with_values(vals, mark_modified=False), shape, tp, dtype, grid, seq_len)
        cuts.append(cutoff_from_speedup(grid, pred.speedup_sp_asynctp, margin))
    c = np.concatenate(cuts)
    beyond = grid[-1] + tp
    b = beyond if base_cutoff is None else base_cutoff
    out = []
    for j, k in enumerate(keys):
        lo_c, hi_c = c[2 * j], c[2 * j + 1]
        move = max(abs(min(lo_c, beyond) - b), abs(min(hi_c, beyond) - b))
        if move > 0:
            prm = profile.params[k]
            out.append({"quantity": k, "tier": prm.tier, "sigma_rel": prm.sigma_rel, "source": prm.source,
                        "cutoff_minus_sigma_tokens": None if np.isinf(lo_c) else int(lo_c),
                        "cutoff_plus_sigma_tokens": None if np.isinf(hi_c) else int(hi_c), "_move": move})
    out.sort(key=lambda r: -r.pop("_move"))
    return out


def display_tokens(max_tokens: int = 65536) -> np.ndarray:
    return 2.0 ** np.arange(0, int(np.log2(max_tokens)) + 1)


def analyse(profile: HardwareProfile, shape: ModelShape, tp: int, dtype: str, *, seq_len: int = 1024,
            max_num_batched_tokens: int = 8192, margin: float = 0.02, band: bool = True,
            display_max_tokens: int = 65536, tokens=None) -> Analysis:
    """Cutoff, band and a table at `tokens` (default: powers of two up to display_max_tokens, plus the cutoff)."""
    if tokens is not None and (len(tokens) == 0 or any(int(t) != t or t <= 0 for t in tokens)):
        raise TpcostError("--tokens: token counts N must be integers > 0")
    if not isinstance(max_num_batched_tokens, int) or max_num_batched_tokens < 1:
        raise TpcostError("--max-num-batched-tokens must be a positive integer")
    if not (0.0 <= margin < 1.0):
        raise TpcostError(f"--margin must be in [0, 1), got {margin}")
    grid = token_grid(tp, max_num_batched_tokens)
    pred = predict(profile, shape, tp, dtype, grid, seq_len)
    cut = cutoff_from_speedup(grid, pred.speedup_sp_asynctp, margin)
    sp_cut = cutoff_from_speedup(grid, pred.speedup_sp, margin)
    band_v = cutoff_band(profile, shape, tp, dtype, seq_len, grid, margin) if band else None
    sens = cutoff_sensitivity(profile, shape, tp, dtype, seq_len, grid, margin, cut) if band else None
    shown = display_tokens(display_max_tokens) if tokens is None else np.unique(np.asarray(tokens, dtype=float))
    if cut is not None:
        shown = np.union1d(shown, [cut])
    table = predict(profile, shape, tp, dtype, shown, seq_len)
    bd = None
    if cut is not None:
        i = int(np.searchsorted(grid, cut))
        bd = {k: float(pred.breakdown[k][i]) for k in BREAKDOWN_KEYS}
    vllm_default = vllm_sp_min_token_num(profile.attrs.get("identity.vendor", ""),
                                         profile.attrs.get("identity.compute_capability", ""), shape.hidden, tp)
    return Analysis(profile, shape, tp, dtype, seq_len, max_num_batched_tokens, margin, cut, sp_cut, band_v,
                    table, bd, grid, pred.speedup_sp_asynctp, sens, vllm_default)


def provenance(profile: HardwareProfile) -> dict:
    return {"tier": profile.tier, "profile": profile.name, "origin": profile.origin,
            "modified": list(profile.modified), "tier_counts": profile.tier_counts(), "sources": profile.sources()}


def analysis_json(a: Analysis) -> dict:
    t = a.table
    rows = []
    for i, n in enumerate(t.num_tokens):
        rows.append({"num_tokens": int(n), **{f"t_{s}_s": float(t.t_forward_s(s)[i]) for s in SCHEDULES},
                     **{f"t_{s}_layer_s": float(t.schedules[s].t_layer_s[i]) for s in SCHEDULES},
                     "speedup_sp": float(t.speedup_sp[i]), "speedup_sp_asynctp": float(t.speedup_sp_asynctp[i])})
    return {
        "gpu": a.profile.name, "model": a.shape.name, "tp": a.tp, "dtype": a.dtype, "seq_len": a.seq_len,
        "max_num_batched_tokens": a.max_num_batched_tokens, "margin": a.margin,
        "cutoff_tokens": a.cutoff_tokens,
        "cutoff_band_tokens": list(a.cutoff_band_tokens) if a.cutoff_band_tokens else None,
        "sp_cutoff_tokens": a.sp_cutoff_tokens,
        "breakdown_at_cutoff_s": a.breakdown_at_cutoff,
        "cutoff_sensitivity": a.sensitivity,
        "vllm_default_sp_min_token_num": a.vllm_default_tokens,
        "notes": list(t.notes),
        "provenance": provenance(a.profile),
        "rows": rows,
    }
