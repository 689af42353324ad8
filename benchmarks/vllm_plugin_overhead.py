"""Cold `EngineArgs(...).create_engine_config()` wall time in fresh subprocesses, VLLM_PLUGINS=tpcost vs
VLLM_PLUGINS= (none), paired runs (order alternated), median ratio. Goal: <= 1.01.

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
print("TIMES", t1 - t0, t2 - t1)
"""


def one(plugins: str):
    env = {**os.environ, "VLLM_PLUGINS": plugins, "TPCOST_PROFILE": "h100-sxm"}
    r = subprocess.run([sys.executable, "-c", CHILD, str(ROOT / "tests/fixtures/llama-h8192-tiny")], env=env,
                       capture_output=True, text=True, timeout=600)
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("TIMES"))
    _, imp, cfg = line.split()
    return float(imp), float(cfg)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    for i in range(a.pairs):
        order = ("tpcost", "") if i % 2 == 0 else ("", "tpcost")
        res = {p: one(p) for p in order}
        rows.append({"with_s": res["tpcost"][1], "without_s": res[""][1]})
    ratios = [r["with_s"] / r["without_s"] for r in rows]
    out = {"pairs": rows, "median_ratio": statistics.median(ratios),
           "median_with_s": statistics.median(r["with_s"] for r in rows),
           "median_without_s": statistics.median(r["without_s"] for r in rows)}
    print(f"{'pair':>4} {'with tpcost [s]':>16} {'without [s]':>12} {'ratio':>7}")
    for i, (r, q) in enumerate(zip(rows, ratios)):
        print(f"{i:4d} {r['with_s']:16.3f} {r['without_s']:12.3f} {q:7.3f}")
    print(f"median ratio (create_engine_config, cold process): {out['median_ratio']:.3f}  (goal <= 1.01)")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
