"""The vLLM plugin's cost at config time, measured two ways in the same run:

- in-process (the number that counts): the wall time of the plugin's own work inside a cold
  `EngineArgs(...).create_engine_config()` (its first call imports costmodel, loads the profile and
  computes the recommendation; `integration.vllm_plugin.APPLY_TIMES_S`), as a fraction of that config
  build. Goal <= 1 %.
- cross-check: the same build in fresh subprocesses, VLLM_PLUGINS=tpcost vs none, paired (order
  alternated), median ratio; its run-to-run noise (+-25 %) hides a 1 % effect.

    python benchmarks/vllm_plugin_overhead.py [--pairs 5] [--json OUT.json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
import time, sys
t0 = time.perf_counter()
from vllm.engine.arg_utils import EngineArgs
t1 = time.perf_counter()
EngineArgs(model=sys.argv[1], tensor_parallel_size=4, skip_tokenizer_init=True, load_format="dummy",
           max_num_batched_tokens=8192,
           compilation_config={"pass_config": {"enable_sp": True, "fuse_gemm_comms": True}}).create_engine_config()
t2 = time.perf_counter()
try:
    from integration.vllm_plugin import APPLY_TIMES_S
    plugin = sum(APPLY_TIMES_S)
except ImportError:
    plugin = 0.0
print("TIMES", t1 - t0, t2 - t1, plugin)
"""


def one(plugins: str):
    env = {**os.environ, "VLLM_PLUGINS": plugins, "TPCOST_PROFILE": "h100-sxm"}
    r = subprocess.run([sys.executable, "-c", CHILD, str(ROOT / "tests/fixtures/llama-h8192-tiny")], env=env,
                       capture_output=True, text=True, timeout=600)
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("TIMES"))
    _, imp, cfg, plugin = line.split()
    return float(imp), float(cfg), float(plugin)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    for i in range(a.pairs):
        order = ("tpcost", "") if i % 2 == 0 else ("", "tpcost")
        res = {p: one(p) for p in order}
        rows.append({"with_s": res["tpcost"][1], "without_s": res[""][1], "plugin_in_process_s": res["tpcost"][2]})
    ratios = [r["with_s"] / r["without_s"] for r in rows]
    frac = [r["plugin_in_process_s"] / r["with_s"] for r in rows]
    out = {"pairs": rows, "median_ratio": statistics.median(ratios),
           "median_plugin_in_process_s": statistics.median(r["plugin_in_process_s"] for r in rows),
           "median_plugin_fraction_of_config": statistics.median(frac),
           "median_with_s": statistics.median(r["with_s"] for r in rows),
           "median_without_s": statistics.median(r["without_s"] for r in rows)}
    print(f"{'pair':>4} {'with tpcost [s]':>16} {'plugin [ms]':>12} {'fraction':>9} {'without [s]':>12} {'ratio':>7}")
    for i, (r, q, f) in enumerate(zip(rows, ratios, frac)):
        print(f"{i:4d} {r['with_s']:16.3f} {r['plugin_in_process_s'] * 1e3:12.1f} {f:9.2%} {r['without_s']:12.3f} {q:7.3f}")
    print(f"in-process: the plugin takes {out['median_plugin_in_process_s'] * 1e3:.1f} ms, "
          f"{out['median_plugin_fraction_of_config']:.2%} of a cold create_engine_config (goal <= 1 %)")
    print(f"cross-check, paired cold processes: median ratio {out['median_ratio']:.3f}")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
