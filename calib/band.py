"""The band's model error, set by nested leave-one-source-out (docs/model.md §9, docs/accuracy.md).

    python -m calib.band [--out calib/data/band_fit.json]

The cutoff band draws every profile quantity from its σ; that covers what the parameters do not know, not what the
model gets wrong. One more quantity carries that: `asynctp.time_scale`, the measured over modelled time of torch's
fused ops, 1 by construction, whose σ (lognormal, on the fused op's GPU, host and tail time) is set here:
- each op row of a source gets its 5-95 % band as `tpcost evaluate --band` draws it (the built-in profiles, every
  quantity at its σ and time_scale at σ_m, each source's fitted harness time on both arms), moved to the source's
  leave-one-source-out prediction (the family fit without the source, its own host terms refitted on it: the
  ratio to the in-sample prediction); the row is covered where the band holds its measured speedup;
- σ_m of a set of sources is the least on a 0.01 grid whose coverage, the mean over the sources of each one's
  share of rows covered, reaches 90 % (the 5–95 % band's claim);
- nested: each source is scored at the σ_m of the others (coverage and sharpness, the median band width in
  speedup), and the built-in profiles carry the σ_m of them all.
The calibrating sources are those whose fused arm is the path the model times (CALIBRATION_SOURCES); META_AH's
fused arm is partly another code path (docs/model.md §6), so it is scored at the profiles' σ_m (its rows under the
reading of calib/reference.py, at its own leave-one-source-out prediction), never calibrates it.
The single kernel gets its own, `fused_kernel.time_scale`, the same way over calib/kernel_fit.py's three sources
(each at its leave-one-source-out prediction, with the draws of the terms that prediction does not know;
kernel_row_bands).
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

from costmodel.evaluate import OP_COLUMNS, evaluate_files
from costmodel.io import atomic_write_text, dumps_json

from . import reference as R
from .results import BAND_CMD, BAND_FIT, load_family_fits

CALIBRATION_SOURCES = ("KRAKEN_PR19", "PT_ISSUE179770", "FLASHINFER_GB200_GEMMRS_MATRIX")
SCORED_ONLY = ("META_AH_H100_ASYNCTP",)  # out of sample, another path in part: scored, never calibrating
FAMILY_OF = {"KRAKEN_PR19": "hopper", "PT_ISSUE179770": "blackwell", "FLASHINFER_GB200_GEMMRS_MATRIX": "blackwell"}
TARGET = 0.90  # a 5-95 % band claims 90 %
GRID = np.round(np.arange(0.0, 1.0 + 1e-9, 0.01), 2)
KEY = "asynctp.time_scale"


def harness_offsets_s() -> dict:
    """Each source's fitted benchmark overhead on both arms (the family fits' offset_s; FLASHINFER_GB200's ~0.11 ms
    floor), source -> s: the harness term evaluate adds to both arms (harness_us), so that a score or a band
    compares the op, not the benchmark's floor."""
    out = {}
    for fit in load_family_fits().values():
        for sid, per in fit["values"].items():
            if sid is not None and "offset_s" in per:
                out[sid] = per["offset_s"]
    return out


def published_ops_csv(path: Path, sources) -> list[dict]:
    """The fused-op rows of `sources` in evaluate's op-level schema (times in us), with each source's fitted
    harness time (harness_us, empty where none was fitted); returns the rows in file order (line i + 2)."""
    off = harness_offsets_s()
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(OP_COLUMNS + ("harness_us",))
    rows = []
    for sid in sources:
        for r in R.fused_op_rows(sid):
            h = off.get(sid)
            w.writerow([r["hardware"], r["tp"], r["op"], r["dtype"], r["m"], r["n"] or "", r["k"] or "",
                        f"{r['baseline_s'] * 1e6:.3f}", f"{r['overlap_s'] * 1e6:.3f}", r["source"],
                        "" if h is None else f"{h * 1e6:.3f}"])
            rows.append(r)
    atomic_write_text(path, buf.getvalue())
    return rows


def loso_shifts() -> dict:
    """(source, fused_ops.csv line) -> ln(leave-one-source-out speedup / in-sample speedup) of each calibrating
    source's op rows (calib/reference.py: the family fit without the source, its own terms refitted on it), and of
    each scored-only source's rows the leave-one-source-out speedup itself (the family's GPU terms, its own host
    terms refitted on it; row_bands divides by the built-in prediction)."""
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
            loso = R.source_rows(family, trees, sid, R.fit_family(family, trees, leave_out=sid), refit_own=True)
            for a, b in zip(ins, loso):
                if a["arm"] == "op":
                    s_in = a["seq_predicted_s"] / a["fused_predicted_s"]
                    s_out = b["seq_predicted_s"] / b["fused_predicted_s"]
                    out[(sid, a["row"]["line"])] = math.log(s_out / s_in)
    return out


def row_bands(grid=GRID) -> list[dict]:
    """Every scored op row of the calibrating and scored-only sources: its measured speedup and, at each model error
    σ_m of `grid`, its 5-95 % band as `tpcost evaluate --band` draws it (asynctp.time_scale at σ_m), moved by the
    log shift to the source's leave-one-source-out prediction."""
    shifts = loso_shifts()
    with tempfile.TemporaryDirectory() as tmp:
        pub = Path(tmp) / "fused_ops.eval.csv"
        written = published_ops_csv(pub, CALIBRATION_SOURCES + SCORED_ONLY)
        runs = [evaluate_files([str(pub)], band=True, band_sigma={KEY: float(s)})[0] for s in grid]
    out = []
    for i, x in enumerate(runs[0]):
        if x.band_lo is None:
            continue
        r = written[x.line - 2]
        shift = shifts.get((x.source, r["line"]))
        d = (1.0 if shift is None else math.exp(shift) if x.source in CALIBRATION_SOURCES
             else shift / x.s_predicted)  # a scored-only source: its own leave-one-source-out speedup
        out.append({"source": x.source, "line": r["line"], "s_measured": x.s_measured,
                    "lo": np.array([run[i].band_lo * d for run in runs]),
                    "hi": np.array([run[i].band_hi * d for run in runs])})
    return out


def _at(sigma_m: float, grid=GRID) -> int:
    return int(np.argmin(np.abs(grid - sigma_m)))


def coverage(rows: list[dict], sigma_m: float) -> float | None:
    """Mean over the sources of the share of their rows the band covers at model error sigma_m (a GRID point)."""
    j = _at(sigma_m)
    by: dict = {}
    for r in rows:
        by.setdefault(r["source"], []).append(r["lo"][j] <= r["s_measured"] <= r["hi"][j])
    return float(np.mean([np.mean(v) for v in by.values()])) if by else None


def sigma_for(rows: list[dict]) -> float:
    """The least σ_m on GRID at which `rows` are covered to TARGET (the grid's end where none is)."""
    for s in GRID:
        if (coverage(rows, float(s)) or 0.0) >= TARGET:
            return float(s)
    return float(GRID[-1])


def sharpness(rows: list[dict], sigma_m: float) -> float:
    """Median 5-95 % band width of the rows' speedup at model error sigma_m."""
    j = _at(sigma_m)
    return float(np.median([r["hi"][j] - r["lo"][j] for r in rows]))


KERNEL_KEY = "fused_kernel.time_scale"


KERNEL_DRAWS, KERNEL_SEED = 400, 0


def kernel_row_bands(grid=GRID, draws: int = KERNEL_DRAWS, seed: int = KERNEL_SEED) -> list[dict]:
    """The single-kernel family's rows, each source at its leave-one-source-out prediction (calib/kernel_fit.py): at
    each model error σ_m of `grid`, the 5-95 % band of the speedup seq / (h + τ·(fused − h)) over the prediction's
    own draws (kernel_fit.held_out_draws: the switch and kernel terms it does not know, as a profile draws them) and
    τ lognormal at σ_m, independent; h the source's harness time on both arms."""
    from .kernel_fit import SOURCES, held_out_draws, read_rows

    rows, out = read_rows(), []
    z = np.random.default_rng(seed + 1).standard_normal(draws)
    tau = np.exp(np.outer(grid, z))[:, :, None]  # grid × draws × 1
    for sid in SOURCES:
        d = held_out_draws(rows, sid, draws, seed)
        h = d["offset_s"]
        speedup = d["seq_s"][None] / (h + tau * (d["fused_s"][None] - h))  # grid × draws × rows
        lo, hi = np.percentile(speedup, 5, axis=1), np.percentile(speedup, 95, axis=1)
        for i, r in enumerate(d["rows"]):
            out.append({"source": sid, "line": r.line, "s_measured": r.baseline_s / r.fused_s,
                        "lo": lo[:, i], "hi": hi[:, i]})
    return out


def calibrate(rows: list[dict], calibrating, scored_only=()) -> dict:
    """σ_m of all the calibrating sources and, per source, its nested leave-one-source-out score (the scored-only
    ones at their leave-one-source-out prediction and the σ_m of all, which they never set)."""
    calib = [r for r in rows if r["source"] in calibrating]
    sigma_all = sigma_for(calib)
    per = {}
    for sid in (*calibrating, *scored_only):
        mine = [r for r in rows if r["source"] == sid]
        held = sid in calibrating
        s_m = sigma_for([r for r in calib if r["source"] != sid]) if held else sigma_all
        per[sid] = {"rows": len(mine), "sample": "nested leave-one-source-out" if held else "leave-one-source-out, never calibrating",
                    "sigma_m": s_m, "coverage": coverage(mine, s_m), "sharpness": sharpness(mine, s_m) if mine else None,
                    "coverage_parameters_only": coverage(mine, 0.0) if mine else None}
    return {"sigma_m": sigma_all, "coverage_all_calibrating": coverage(calib, sigma_all), "per_source": per}


def run() -> dict:
    from .kernel_fit import SOURCES as KERNEL_SOURCES

    torch_ops = calibrate(row_bands(), CALIBRATION_SOURCES, SCORED_ONLY)
    kernel = calibrate(kernel_row_bands(), KERNEL_SOURCES)
    return {"command": BAND_CMD, "key": KEY, "calibration_sources": list(CALIBRATION_SOURCES),
            "scored_only": list(SCORED_ONLY), "target": TARGET, **torch_ops,
            "kernel": {"key": KERNEL_KEY, "calibration_sources": list(KERNEL_SOURCES), "target": TARGET, **kernel}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=BAND_FIT, help="where the result goes (default: %(default)s)")
    args = ap.parse_args(argv)
    res = run()
    atomic_write_text(args.out, dumps_json(res) + "\n")
    for part in (res, res["kernel"]):
        print(f"model error σ_m ({part['key']}) = {part['sigma_m']:.3f} over {', '.join(part['calibration_sources'])}")
        for sid, e in part["per_source"].items():
            cov = "n/a" if e["coverage"] is None else f"{e['coverage']:.1%}"
            print(f"  {sid:31s} {e['rows']:3d} rows  {e['sample']:27s} σ_m {e['sigma_m']:.3f}  coverage {cov}"
                  f"  sharpness {e['sharpness'] or float('nan'):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
