"""The band's model error, set by nested leave-one-source-out (docs/model.md §9, docs/accuracy.md).

    python -m calib.band [--out calib/data/band_fit.json]

The cutoff band draws every profile quantity from its σ; that covers what the parameters do not
know, not what the model gets wrong. One more quantity carries that: `asynctp.time_scale`, the
measured over modelled time of torch's fused ops, 1 by construction, whose σ (lognormal, on the
fused op's GPU, host and tail time) is set here:
- each op row of a source gets its 5-95 % band as `tpcost evaluate --band` draws it (the built-in
profiles, every
  quantity at its σ and time_scale at σ_m, each source's fitted harness time on both arms), moved to
  the source's leave-one-source-out prediction (the family fit without the source, its own host
  terms refitted on it: the ratio to the in-sample prediction); the row is covered where the band
  holds its measured speedup;
- σ_m of a set of sources is the least on a 0.01 grid whose coverage, the mean over the sources of
each one's
  share of rows covered, reaches 90 % (the 5–95 % band's claim);
- nested: each source is scored at the σ_m of the others (coverage and sharpness, the median band
width in
  speedup), and the built-in profiles carry the σ_m of them all.
The calibrating sources are those whose fused arm is the path the model times (CALIBRATION_SOURCES);
META_AH's fused arm is partly another code path (docs/model.md §6), so it is scored at the profiles'
σ_m (its rows under the reading of calib/reference.py, at its own leave-one-source-out prediction),
never calibrates it. The single kernel gets its own, `fused_kernel.time_scale`, the same way over
calib/kernel_fit.py's three sources (each at its leave-one-source-out prediction, with the draws of
the terms that prediction does not know; kernel_row_bands).
A row is one run: where its source times a cell twice (the FlashInfer matrix's bf16 and fp16 rows),
that run's own noise is measured (fit_run_noise: a relative part and an absolute jitter, by maximum
likelihood over the pairs) and the band it is scored against is the prediction's band with that
noise beside it, independent (an interval for one measurement, not for the op's mean); a source
timing no cell twice gets none (its noise stays inside σ_m). Each source's coverage without it is
reported beside.
"""

from __future__ import annotations

import argparse
import csv
import functools
import io
import math
import sys
import tempfile
from pathlib import Path

import numpy as np
from costmodel.vllm_tables import Vllm

from costmodel.evaluate import OP_COLUMNS, evaluate_files
from costmodel.io import atomic_write_text, dumps_json

from . import reference as R
from .results import BAND_CMD, BAND_FIT, load_family_fits

CALIBRATION_SOURCES = ("KRAKEN_PR19", "PT_ISSUE179770", "FLASHINFER_GB200_GEMMRS_MATRIX")
# out of sample, another path in part: scored, never calibrating
SCORED_ONLY = ("META_AH_H100_ASYNCTP",)
FAMILY_OF = {
    "KRAKEN_PR19": "hopper",
    "PT_ISSUE179770": "blackwell",
    "FLASHINFER_GB200_GEMMRS_MATRIX": "blackwell",
}
TARGET = 0.90  # a 5-95 % band claims 90 %
# the standard normal's 95 % point: a lognormal's 5-95 % half-width in ln is Z95·σ
Z95 = 1.6448536269514722
GRID = np.round(np.arange(0.0, 1.0 + 1e-9, 0.01), 2)
# each source's coverage (run noise kept) over σ_m 0-0.30: what a narrower band costs
TRADE_OFF_SIGMAS = GRID[:31]
KEY = "asynctp.time_scale"


def harness_offsets_s() -> dict:
    """Each source's fitted benchmark overhead on both arms (the family fits' offset_s;
    FLASHINFER_GB200's ~0.11 ms floor), source -> s: the harness term evaluate adds to both arms
    (harness_us), so that a score or a band compares the op, not the benchmark's floor."""
    out = {}
    for fit in load_family_fits().values():
        for sid, per in fit["values"].items():
            if sid is not None and "offset_s" in per:
                out[sid] = per["offset_s"]
    return out


def published_ops_csv(path: Path, sources) -> list[dict]:
    """The fused-op rows of `sources` in evaluate's op-level schema (times in us), with each
    source's fitted harness time (harness_us, empty where none was fitted); returns the rows in file
    order (line i + 2)."""
    off = harness_offsets_s()
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(OP_COLUMNS + ("harness_us", "impl"))
    rows = []
    for sid in sources:
        for r in R.fused_op_rows(sid):
            h = off.get(sid)
            w.writerow(
                [
                    r["hardware"],
                    r["tp"],
                    r["op"],
                    r["dtype"],
                    r["m"],
                    r["n"] or "",
                    r["k"] or "",
                    f"{r['baseline_s'] * 1e6:.3f}",
                    f"{r['overlap_s'] * 1e6:.3f}",
                    r["source"],
                    "" if h is None else f"{h * 1e6:.3f}",
                    r["impl"],
                ]
            )
            rows.append(r)
    atomic_write_text(path, buf.getvalue())
    return rows


def replicate_pairs(sid: str) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    """The op rows `sid` times twice, once per dtype, with torch's fused arm: ((baseline_s, fused_s)
    of one run, (baseline_s, fused_s) of the other) per cell. The FlashInfer matrix's bf16 and fp16
    rows of one shape run the same tensor-core rate and bytes, so a pair differs by its runs' noise
    alone (the kernel's pairs:
    kernel_fit.replicate_cells)."""
    cells: dict = {}
    for r in R.fused_op_rows(sid, "torch"):
        cells.setdefault((r["tp"], r["op"], r["m_as_published"], r["n"], r["k"]), []).append(r)
    return [
        ((a["baseline_s"], a["overlap_s"]), (b["baseline_s"], b["overlap_s"]))
        for a, b in (rs for rs in cells.values() if len(rs) == 2)
        if a["dtype_as_published"] != b["dtype_as_published"]
    ]


def run_noise_sigma(noise: dict | None, baseline_s, fused_s) -> np.ndarray:
    """σ of one run's ln speedup: √(r² + (j/t)²), t = √(baseline·fused) (dimensionless;
    fit_run_noise's r and j; 0 where the source times no cell twice)."""
    t = np.sqrt(np.asarray(baseline_s, dtype=float) * np.asarray(fused_s, dtype=float))
    if noise is None:
        return np.zeros_like(t)
    return np.sqrt(noise["relative"] ** 2 + (noise["jitter_s"] / t) ** 2)


def fit_run_noise(pairs) -> dict | None:
    """The run noise of a source's measurements from its replicate pairs, by maximum likelihood:
    ln(s_a/s_b) ~ N(0, 2σ²), σ² = r² + (j/t)² (run_noise_sigma; t the pair's four times' geometric
    mean): a relative part r and an absolute jitter j (s), the launch and host jitter that weighs
    most on the shortest cells. The constant-σ fit's likelihood beside it (j = 0). None for no
    pairs."""
    from scipy.optimize import minimize

    if not pairs:
        return None
    d = np.array([math.log((ba / fa) / (bb / fb)) for (ba, fa), (bb, fb) in pairs])
    t = np.array([math.exp(np.mean(np.log([ba, fa, bb, fb]))) for (ba, fa), (bb, fb) in pairs])

    def nll(x):
        v = 2.0 * (math.exp(2 * x[0]) + (math.exp(x[1]) / t) ** 2)
        return float(0.5 * np.sum(np.log(2 * math.pi * v) + d**2 / v))

    c = math.sqrt(float(np.mean(d**2)) / 2.0)
    res = minimize(
        nll,
        [math.log(max(c, 1e-6)) - 0.5, math.log(float(np.median(t)) * c)],
        method="Nelder-Mead",
        options={"xatol": 1e-8, "fatol": 1e-10, "maxiter": 4000},
    )
    v0 = 2.0 * c**2
    return {
        "pairs": len(pairs),
        "relative": float(math.exp(res.x[0])),
        "jitter_s": float(math.exp(res.x[1])),
        "nll": float(res.fun),
        "sigma_constant": c,
        "nll_constant": float(0.5 * np.sum(np.log(2 * math.pi * v0) + d**2 / v0)),
    }


@functools.lru_cache(maxsize=1)
def run_noise() -> dict:
    """(source, fused arm "torch" | "kernel") -> fit_run_noise, for every calibrating, scored-only
    and kernel source that times a cell twice (of the committed data: fitted once per process,
    row_bands, kernel_row_bands and run read it; callers do not mutate it)."""
    from .kernel_fit import SOURCES as KERNEL_SOURCES
    from .kernel_fit import read_rows, replicate_cells

    pairs = {(sid, "torch"): replicate_pairs(sid) for sid in CALIBRATION_SOURCES + SCORED_ONLY}
    pairs.update(
        {
            (sid, "kernel"): [((a.baseline_s, a.fused_s), (b.baseline_s, b.fused_s)) for a, b in ps]
            for sid, ps in replicate_cells(read_rows()).items()
            if sid in KERNEL_SOURCES
        }
    )
    return {key: fit for key, ps in pairs.items() if (fit := fit_run_noise(ps)) is not None}


def widen(lo, hi, sigma_run):
    """A 5-95 % band (lo, hi) with one run's lognormal noise σ_run beside it, independent: the
    half-width in ln about the geometric centre c = √(lo·hi) in quadrature, √(ln(hi/c)² +
    (Z95·σ_run)²) (speedup; the band's percentiles are not draws, so the centre stands for the
    median)."""
    c = np.sqrt(lo * hi)
    h = np.sqrt(np.log(hi / c) ** 2 + (Z95 * sigma_run) ** 2)
    return c * np.exp(-h), c * np.exp(h)


def loso_shifts() -> dict:
    """(source, fused_ops.csv line) -> ln(leave-one-source-out speedup / in-sample speedup) of each
    calibrating source's op rows (calib/reference.py: the family fit without the source, its own
    terms refitted on it), and of each scored-only source's rows the leave-one-source-out speedup
    itself (the family's GPU terms, its own host terms refitted on it; row_bands divides by the
    built-in prediction)."""
    out = {}
    for family, trees in R.start_trees()[0].items():
        full = R.fit_family(family, trees)
        for sid in R.scored_only_sources(family):
            for b in R.source_rows(family, trees, sid, full, refit_own=True):
                out[(sid, b["row"]["line"])] = b["seq_predicted_s"] / b["fused_predicted_s"]
        if family not in FAMILY_OF.values():
            continue
        for sid in (s for s, f in FAMILY_OF.items() if f == family):
            ins = R.source_rows(family, trees, sid, full)
            loso = R.source_rows(
                family, trees, sid, R.fit_family(family, trees, leave_out=sid), refit_own=True
            )
            for a, b in zip(ins, loso):
                if a["arm"] == "op":
                    s_in = a["seq_predicted_s"] / a["fused_predicted_s"]
                    s_out = b["seq_predicted_s"] / b["fused_predicted_s"]
                    out[(sid, a["row"]["line"])] = math.log(s_out / s_in)
    return out


def row_bands(grid=GRID) -> list[dict]:
    """Every scored op row of the calibrating and scored-only sources: its measured speedup and, at
    each model error σ_m of `grid`, its 5-95 % band as `tpcost evaluate --band` draws it
    (asynctp.time_scale at σ_m), moved by the log shift to the source's leave-one-source-out
    prediction ("lo_model"/"hi_model"), and that band with the row's run noise beside it ("lo"/"hi",
    widen; the band a measured run is scored against)."""
    shifts, noise = loso_shifts(), run_noise()
    with tempfile.TemporaryDirectory() as tmp:
        pub = Path(tmp) / "fused_ops.eval.csv"
        written = published_ops_csv(pub, CALIBRATION_SOURCES + SCORED_ONLY)
        runs = [
            evaluate_files([str(pub)], Vllm(), band=True, band_sigma={KEY: float(s)})[0]
            for s in grid
        ]
    out = []
    for i, x in enumerate(runs[0]):
        if x.band_lo is None:
            continue
        r = written[x.line - 2]
        shift = shifts.get((x.source, r["line"]))
        # a scored-only source: its own leave-one-source-out speedup
        d = (
            1.0
            if shift is None
            else math.exp(shift)
            if x.source in CALIBRATION_SOURCES
            else shift / x.s_predicted
        )
        lo = np.array([run[i].band_lo * d for run in runs])
        hi = np.array([run[i].band_hi * d for run in runs])
        sig = float(
            run_noise_sigma(noise.get((x.source, "torch")), r["baseline_s"], r["overlap_s"])
        )
        out.append(
            {
                "source": x.source,
                "line": r["line"],
                "s_measured": x.s_measured,
                "lo_model": lo,
                "hi_model": hi,
                **dict(zip(("lo", "hi"), widen(lo, hi, sig))),
                "run_noise_sigma": sig,
            }
        )
    return out


def _at(sigma_m: float, grid=GRID) -> int:
    return int(np.argmin(np.abs(grid - sigma_m)))


def coverage(rows: list[dict], sigma_m: float, band: str = "") -> float | None:
    """Mean over the sources of the share of their rows the band covers at model error sigma_m (a
    GRID point); `band` "" the band with the run's noise, "_model" the prediction's alone."""
    j = _at(sigma_m)
    by: dict = {}
    for r in rows:
        by.setdefault(r["source"], []).append(
            r["lo" + band][j] <= r["s_measured"] <= r["hi" + band][j]
        )
    return float(np.mean([np.mean(v) for v in by.values()])) if by else None


def sigma_for(rows: list[dict]) -> float:
    """The least σ_m on GRID at which `rows` are covered to TARGET (the grid's end where none
    is)."""
    for s in GRID:
        if (coverage(rows, float(s)) or 0.0) >= TARGET:
            return float(s)
    return float(GRID[-1])


def sharpness(rows: list[dict], sigma_m: float) -> float:
    """Median 5-95 % band width of the rows' predicted speedup at model error sigma_m (the band a
    profile gives, without a run's noise)."""
    j = _at(sigma_m)
    return float(np.median([r["hi_model"][j] - r["lo_model"][j] for r in rows]))


KERNEL_KEY = "fused_kernel.time_scale"


def kernel_row_bands(grid=GRID, draws: int | None = None, seed: int | None = None) -> list[dict]:
    """The single-kernel family's rows, each source at its leave-one-source-out prediction
    (calib/kernel_fit.py): at each model error σ_m of `grid`, the 5-95 % band of the speedup seq /
    (h + τ·(fused − h)) over the prediction's own draws (kernel_fit.held_out_draws: the switch and
    kernel terms it does not know, as a profile draws them) and τ lognormal at σ_m, independent; h
    the source's harness time on both arms ("lo_model"/"hi_model"); and that speedup times one run's
    noise, lognormal at the row's run_noise_sigma, independent ("lo"/"hi")."""
    from .kernel_fit import HELD_OUT_DRAWS, HELD_OUT_SEED, SOURCES, held_out_draws, read_rows

    # the draws whose median is the source's nominal
    draws = HELD_OUT_DRAWS if draws is None else draws
    seed = HELD_OUT_SEED if seed is None else seed
    rows, out, noise = read_rows(), [], run_noise()
    z = np.random.default_rng(seed + 1).standard_normal(draws)
    z_run = np.random.default_rng(seed + 2).standard_normal(draws)[None, :, None]
    tau = np.exp(np.outer(grid, z))[:, :, None]  # grid × draws × 1
    for sid in SOURCES:
        d = held_out_draws(rows, sid, draws, seed)
        h = d["offset_s"]
        speedup = d["seq_s"][None] / (h + tau * (d["fused_s"][None] - h))  # grid × draws × rows
        sig = run_noise_sigma(
            noise.get((sid, "kernel")),
            [r.baseline_s for r in d["rows"]],
            [r.fused_s for r in d["rows"]],
        )
        measured = speedup * np.exp(z_run * sig[None, None, :])
        lo0, hi0 = np.percentile(speedup, 5, axis=1), np.percentile(speedup, 95, axis=1)
        lo, hi = np.percentile(measured, 5, axis=1), np.percentile(measured, 95, axis=1)
        for i, r in enumerate(d["rows"]):
            out.append(
                {
                    "source": sid,
                    "line": r.line,
                    "s_measured": r.baseline_s / r.fused_s,
                    "lo": lo[:, i],
                    "hi": hi[:, i],
                    "lo_model": lo0[:, i],
                    "hi_model": hi0[:, i],
                    "run_noise_sigma": float(sig[i]),
                }
            )
    return out


def calibrate(rows: list[dict], calibrating, scored_only=()) -> dict:
    """σ_m of all the calibrating sources and, per source, its nested leave-one-source-out score
    (the scored-only ones at their leave-one-source-out prediction and the σ_m of all, which they
    never set)."""
    calib = [r for r in rows if r["source"] in calibrating]
    sigma_all = sigma_for(calib)
    per = {}
    for sid in (*calibrating, *scored_only):
        mine = [r for r in rows if r["source"] == sid]
        held = sid in calibrating
        s_m = sigma_for([r for r in calib if r["source"] != sid]) if held else sigma_all
        per[sid] = {
            "rows": len(mine),
            "sample": "nested leave-one-source-out"
            if held
            else "leave-one-source-out, never calibrating",
            "sigma_m": s_m,
            "coverage": coverage(mine, s_m),
            "sharpness": sharpness(mine, s_m) if mine else None,
            "coverage_parameters_only": coverage(mine, 0.0) if mine else None,
            "coverage_without_run_noise": coverage(mine, s_m, "_model") if mine else None,
            "run_noise_sigma_median": float(np.median([r["run_noise_sigma"] for r in mine]))
            if mine
            else None,
        }
    by_sigma = {
        sid: [coverage([r for r in rows if r["source"] == sid], float(g)) for g in TRADE_OFF_SIGMAS]
        for sid in per
        if per[sid]["rows"]
    }
    return {
        "sigma_m": sigma_all,
        "coverage_all_calibrating": coverage(calib, sigma_all),
        "per_source": per,
        "trade_off_sigmas": [float(g) for g in TRADE_OFF_SIGMAS],
        "coverage_by_sigma": by_sigma,
    }


def run() -> dict:
    from .kernel_fit import SOURCES as KERNEL_SOURCES

    torch_ops = calibrate(row_bands(), CALIBRATION_SOURCES, SCORED_ONLY)
    kernel = calibrate(kernel_row_bands(), KERNEL_SOURCES)
    noise = [{"source": sid, "fused_arm": impl, **fit} for (sid, impl), fit in run_noise().items()]
    return {
        "command": BAND_CMD,
        "key": KEY,
        "calibration_sources": list(CALIBRATION_SOURCES),
        "scored_only": list(SCORED_ONLY),
        "target": TARGET,
        "run_noise": noise,
        **torch_ops,
        "kernel": {
            "key": KERNEL_KEY,
            "calibration_sources": list(KERNEL_SOURCES),
            "target": TARGET,
            **kernel,
        },
    }


def main(argv: list[str] | None = None) -> int:
    from costmodel.io import doc_summary

    ap = argparse.ArgumentParser(description=doc_summary(__doc__))
    ap.add_argument(
        "--out", type=Path, default=BAND_FIT, help="where the result goes (default: %(default)s)"
    )
    args = ap.parse_args(argv)
    res = run()
    atomic_write_text(args.out, dumps_json(res) + "\n")
    for part in (res, res["kernel"]):
        print(
            f"model error σ_m ({part['key']}) = {part['sigma_m']:.3f} over "
            f"{', '.join(part['calibration_sources'])}"
        )
        for sid, e in part["per_source"].items():
            cov = "n/a" if e["coverage"] is None else f"{e['coverage']:.1%}"
            bare = (
                "n/a"
                if e["coverage_without_run_noise"] is None
                else f"{e['coverage_without_run_noise']:.1%}"
            )
            print(
                f"  {sid:31s} {e['rows']:3d} rows  {e['sample']:27s} σ_m {e['sigma_m']:.3f}  "
                f"coverage {cov}"
                f" ({bare} without the run noise)  sharpness {e['sharpness'] or float('nan'):.3f}"
            )
    for e in res["run_noise"]:
        print(
            f"run noise {e['source']} ({e['fused_arm']} arm, {e['pairs']} pairs): σ² = "
            f"{e['relative']:.4f}² + "
            f"({e['jitter_s'] * 1e6:.1f} µs / t)²; ln L {-e['nll']:.2f} against "
            f"{-e['nll_constant']:.2f} at a "
            f"constant {e['sigma_constant']:.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
