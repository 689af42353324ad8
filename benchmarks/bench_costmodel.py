"""Cost-model speed: `import costmodel` + one cutoff in a fresh process (the config-time path), the
cutoff with and without the Monte Carlo band on the config-time grid, a full sweep N = 1..65536
(reported, not targeted), and `evaluate` on 100 000 model-level rows. Prints a table, writes JSON.

    python benchmarks/bench_costmodel.py [--json benchmarks/results/costmodel_speed.json]
"""

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FIRST_SWEEP = r"""
import resource, time
import numpy as np
from costmodel import load_model, load_profile, predict
p, m = load_profile("h100-sxm"), load_model("llama-3.1-70b")
predict(p, m, 4, "bf16", np.arange(1, 100.0)).speedup_sp_asynctp  # code paths warm, on a tiny input
N = np.arange(1, 65537, dtype=float)
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
t = time.perf_counter()
predict(p, m, 4, "bf16", N).speedup_sp_asynctp
print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""

COLD = r"""
import time
t0 = time.perf_counter()
import costmodel
from costmodel import RunConfig, analyse, load_model, load_profile
t1 = time.perf_counter()
a = analyse(load_profile("h100-sxm"), load_model("llama-3.1-70b"), RunConfig(4, "bf16"), band=False)
t2 = time.perf_counter()
import sys
print(t1 - t0, t2 - t1, a.cutoff_tokens, int(any(m in sys.modules for m in ("torch", "scipy"))))
"""


def median_time(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), min(ts), max(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    from costmodel import RunConfig, analyse, load_model, load_profile, predict
    from costmodel.analysis import cutoff_band, token_grid

    cold = []
    for _ in range(5):
        out = subprocess.run(
            [sys.executable, "-c", COLD], capture_output=True, text=True, cwd=ROOT, check=True
        ).stdout.split()
        cold.append((float(out[0]), float(out[1])))
        assert out[3] == "0", "costmodel imported torch or scipy"
    first = []
    for _ in range(5):
        out = subprocess.run(
            [sys.executable, "-c", FIRST_SWEEP],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=True,
        ).stdout.split()
        first.append((float(out[0]), int(out[1])))
    p, m = load_profile("h100-sxm"), load_model("llama-3.1-70b")
    N = np.arange(1, 65537, dtype=float)
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    sweep = median_time(lambda: predict(p, m, 4, "bf16", N).speedup_sp_asynctp, a.reps)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / (a.reps + 1)
    grid = token_grid(4, 8192)
    cutoff = median_time(lambda: predict(p, m, 4, "bf16", grid).speedup_sp_asynctp, a.reps)
    band = median_time(lambda: cutoff_band(p, m, RunConfig(4, "bf16"), grid), 3)
    band_sweep = median_time(lambda: cutoff_band(p, m, RunConfig(4, "bf16"), N), 1)
    no_band = median_time(lambda: analyse(p, m, RunConfig(4, "bf16"), band=False), 5)
    with_band = median_time(lambda: analyse(p, m, RunConfig(4, "bf16"), band=True), 3)
    import tempfile

    from costmodel.evaluate import evaluate_files
    from costmodel.vllm_tables import Vllm

    with tempfile.TemporaryDirectory() as tmp:
        rows = Path(tmp) / "rows.csv"
        rng = np.random.default_rng(0)
        lines = ["hardware,tp,model,dtype,num_tokens,baseline_us,overlap_us,scope,source"]
        for n in rng.integers(1, 16385, 100_000):
            lines.append(f"h100-sxm,4,llama-3.1-70b,bf16,{n},100,95,forward,synthetic")
        rows.write_text("\n".join(lines) + "\n")
        t = time.perf_counter()
        scored, _ = evaluate_files([str(rows)], Vllm())
        eval_s = time.perf_counter() - t
        assert len(scored) == 100_000
    res = {
        "machine": f"{platform.machine()} {platform.processor()} python "
        f"{platform.python_version()} numpy {np.__version__}",
        "import_costmodel_s_median": statistics.median(c[0] for c in cold),
        "first_cutoff_s_median": statistics.median(c[1] for c in cold),
        "sweep_1_65536_no_band_s": sweep[0],
        "sweep_minor_page_faults_per_call": faults,
        "first_sweep_in_fresh_process_s_median": statistics.median(f[0] for f in first),
        "first_sweep_minor_page_faults_median": statistics.median(f[1] for f in first),
        "cutoff_grid_2048_points_s": cutoff[0],
        "band_200_draws_cutoff_grid_s": band[0],
        "band_200_draws_sweep_1_65536_s": band_sweep[0],
        "analyse_no_band_s": no_band[0],
        "analyse_with_band_s": with_band[0],
        "evaluate_100000_model_rows_s": eval_s,
    }
    print(f"{'measurement (llama-3.1-70b, h100-sxm, tp 4, bf16)':58s} {'median':>10s}")
    print(
        f"{'import costmodel (fresh process)':58s} {res['import_costmodel_s_median'] * 1e3:8.1f} ms"
    )
    print(
        f"{'first analyse() incl. profile/model load, no band':58s} "
        f"{res['first_cutoff_s_median'] * 1e3:8.1f} ms"
    )
    print(
        f"{'predict() on the cutoff grid (2048 multiples of tp)':58s} "
        f"{res['cutoff_grid_2048_points_s'] * 1e3:8.2f} ms"
    )
    print(
        f"{'analyse() on the config-time grid, no band (cutoff decision)':58s} "
        f"{res['analyse_no_band_s'] * 1e3:8.1f} ms"
    )
    print(
        f"{'analyse() on the config-time grid, with band + sensitivity':58s} "
        f"{res['analyse_with_band_s'] * 1e3:8.1f} ms"
    )
    print(
        f"{'predict() full sweep N = 1..65536, no band (repeated)':58s} "
        f"{res['sweep_1_65536_no_band_s'] * 1e3:8.2f} ms"
    )
    print(f"{'  minor page faults per sweep (getrusage)':58s} {faults:8.0f}")
    print(
        f"{'first full sweep in a fresh process':58s} "
        f"{res['first_sweep_in_fresh_process_s_median'] * 1e3:8.2f} ms"
    )
    print(f"{'  minor page faults in it':58s} {res['first_sweep_minor_page_faults_median']:8.0f}")
    print(
        f"{'cutoff band, 200 draws, cutoff grid':58s} "
        f"{res['band_200_draws_cutoff_grid_s'] * 1e3:8.1f} ms"
    )
    print(
        f"{'cutoff band, 200 draws, full sweep N = 1..65536':58s} "
        f"{res['band_200_draws_sweep_1_65536_s'] * 1e3:8.1f} ms"
    )
    print(
        f"{'evaluate on 100 000 model-level rows':58s} {res['evaluate_100000_model_rows_s']:8.2f} s"
    )
    print(f"machine: {res['machine']}")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
