"""Accuracy of tpcost on every measured set the project ships, per source, beside vLLM 0.31's rule.

    python benchmarks/accuracy.py [--json benchmarks/results/accuracy.json]

Sets: the published fused-op timings (data/reference/fused_ops.csv: KRAKEN_PR19 H100 bf16, PT_ISSUE179770
B300 fp8, PT_PR183509 B300 NVFP4) and this project's CPU validate runs (calib/data/cpu-gloo-w2). Each row
is scored by `tpcost evaluate` (costmodel.evaluate); the fused-op rows also print the predicted time of
the fused op and its sequential arm with the model's parts (chunk GEMMs, pulls, barriers, host issue).

In-sample / out-of-sample: a source is in-sample when a profile parameter was fitted to it
(tools/build_profiles.py asynctp_fits and b300's NCCL reduce-scatter latency), else out-of-sample.
Leave-one-source-out needs two usable sources for one GPU; none has two (H100: KRAKEN_PR19 only; B300:
PT_ISSUE179770 only, PT_PR183509's NVFP4 path is out of scope), and the table says so.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from costmodel.evaluate import OP_COLUMNS, evaluate_files, summarise  # noqa: E402
from costmodel.io import atomic_write_text, dumps_json  # noqa: E402
from costmodel.profile import load_profile  # noqa: E402
from tools import reference_fits as R  # noqa: E402

# which parameter each source fed (tools/build_profiles.py)
FITTED_FROM = {
    "KRAKEN_PR19": "h100-sxm asynctp.barrier_s",
    "PT_ISSUE179770": "b300 asynctp.barrier_s; b300 collectives.nccl_reduce_scatter.tp8.latency_s (sequential arm)",
}
CPU_SETS = ("calib/data/cpu-gloo-w2/validate.csv", "calib/data/cpu-gloo-w2/profile.ops.csv")


def published_ops_csv(path: Path) -> None:
    """data/reference/fused_ops.csv in evaluate's op-level schema (times in us)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(OP_COLUMNS)
    for r in R.fused_op_rows():
        w.writerow([r["hardware"], r["tp"], r["op"], r["dtype"], r["m"], r["n"] or "", r["k"] or "",
                    f"{r['baseline_s'] * 1e6:.3f}", f"{r['overlap_s'] * 1e6:.3f}", r["source"]])
    atomic_write_text(path, buf.getvalue())


def fused_rows_detail() -> list[dict]:
    out = []
    for r in R.fused_op_rows():
        if not (r["n"] and r["k"]):
            continue
        prof = load_profile(r["hardware"])
        seq, _, f = R.predict_fused_row(prof, r)
        v = lambda x: float(np.ravel(x)[0])  # noqa: E731
        out.append({"source": r["source"], "hardware": r["hardware"], "op": r["op"], "dtype": r["dtype"], "m": r["m"],
                    "n": r["n"], "k": r["k"], "measured_sequential_s": r["baseline_s"], "measured_fused_s": r["overlap_s"],
                    "predicted_sequential_s": v(seq), "predicted_fused_s": v(f.t_s), "predicted_fused_gpu_s": v(f.t_gpu_s),
                    "parts_s": {"chunk_gemms": v(f.t_chunks_contended_s), "pulls": v(f.t_pulls_s),
                                "barriers": v(f.t_sync_s), "copies_reduction": v(f.t_memory_s),
                                "host_issue": v(f.t_host_s)}})
    return out


def per_source(scored, skipped) -> dict:
    by = {}
    for s in scored:
        by.setdefault(s.source, []).append(s)
    out = {}
    for src, rows in sorted(by.items()):
        summ = summarise(rows, [])
        summ.pop("skipped")
        summ["sample"] = "in-sample" if src in FITTED_FROM else "out-of-sample"
        summ["fitted"] = FITTED_FROM.get(src, "nothing")
        out[src] = summ
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        pub = Path(tmp) / "fused_ops.eval.csv"
        published_ops_csv(pub)
        files = [str(pub)] + [str(ROOT / f) for f in CPU_SETS]
        scored, skipped = evaluate_files(files)
    for s in scored:  # the CPU rows' source is "tpcost validate/calibrate ..."; name them by their set
        if s.source.startswith("tpcost "):
            object.__setattr__(s, "source", "cpu-gloo-w2")
    table = per_source(scored, skipped)
    detail = fused_rows_detail()
    print("fused-op rows: measured and predicted (eager: torch's Python pipeline issues each call) [us]")
    print(f"{'source':15s} {'hw':9s} {'op':8s} {'dtype':5s} {'M':>6s} {'seq meas':>9s} {'pred':>7s} {'fused meas':>10s} "
          f"{'pred':>7s} {'s meas':>7s} {'s pred':>7s}  parts: gemms/pulls/barriers/mem/host")
    for d in detail:
        sm, sp = d["measured_sequential_s"] / d["measured_fused_s"], d["predicted_sequential_s"] / d["predicted_fused_s"]
        p = d["parts_s"]
        print(f"{d['source']:15s} {d['hardware']:9s} {d['op']:8s} {d['dtype']:5s} {d['m']:6d} "
              f"{d['measured_sequential_s'] * 1e6:9.1f} {d['predicted_sequential_s'] * 1e6:7.1f} "
              f"{d['measured_fused_s'] * 1e6:10.1f} {d['predicted_fused_s'] * 1e6:7.1f} {sm:7.3f} {sp:7.3f}  "
              + "/".join(f"{p[k] * 1e6:.0f}" for k in ("chunk_gemms", "pulls", "barriers", "copies_reduction", "host_issue")))
    print("\nper source (verdicts: a measured speedup within 2% of 1 is a tie, right either way)")
    print(f"{'source':16s} {'sample':14s} {'rows':>4s} {'acc':>6s} {'vLLM acc':>8s} {'mean reg%':>9s} {'vLLM':>6s} "
          f"{'max reg%':>8s} {'vLLM':>6s} {'med|err|':>8s} {'max|err|':>8s}  fitted")
    for src, t in table.items():
        v = t["vllm_rule"]
        print(f"{src:16s} {t['sample']:14s} {t['rows_scored']:4d} {t['verdict_accuracy']:6.1%} {v['verdict_accuracy']:8.1%} "
              f"{t['mean_regret_pct']:9.2f} {v['mean_regret_pct']:6.2f} {t['max_regret_pct']:8.2f} {v['max_regret_pct']:6.2f} "
              f"{t['median_abs_speedup_error']:8.3f} {t['max_abs_speedup_error']:8.3f}  {t['fitted']}")
    print("\nleave-one-source-out: not possible; no GPU has two usable sources (H100: KRAKEN_PR19; B300: "
          "PT_ISSUE179770, with PT_PR183509's NVFP4 native path out of scope)")
    for sk in skipped:
        print(f"skipped {Path(sk['where']).name}: {sk['reason']}")
    res = {"schema_version": 1, "per_source": table, "fused_rows": detail,
           "skipped": [{"where": Path(s["where"]).name, "reason": s["reason"]} for s in skipped],
           "leave_one_source_out": None}
    if a.json:
        atomic_write_text(a.json, dumps_json(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
