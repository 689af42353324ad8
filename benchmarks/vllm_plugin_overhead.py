"""The vLLM plugin's cost at config time, measured two ways in the same run:

- in-process (the number that counts): the wall time of the plugin's own work inside a cold
  `EngineArgs(...).create_engine_config()` (`integration.vllm_plugin.APPLY_TIMES_S`), as a fraction
  of that config build, goal <= 1 %, in two cases per round:
  - miss: a fresh decision cache; the plugin imports costmodel, loads the profile and computes the
  decision,
    then stores the plan (integration/plugin_cache.py);
  - hit: a new cold process with the same inputs; it reads the plan back.
- cross-check: the same build with VLLM_PLUGINS=tpcost (hit) against none, in cold processes, order
  alternated; median ratio. Its run-to-run noise (+-25 %) hides a 1 % effect.

    python benchmarks/vllm_plugin_overhead.py [--rounds 4] [--json OUT.json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
import time, sys
t0 = time.perf_counter()
from vllm.engine.arg_utils import EngineArgs
t1 = time.perf_counter()
pass_config = {"enable_sp": True, "fuse_gemm_comms": True}
EngineArgs(model=sys.argv[1], tensor_parallel_size=4, skip_tokenizer_init=True, load_format="dummy",
           max_num_batched_tokens=8192,
           compilation_config={"pass_config": pass_config}).create_engine_config()
t2 = time.perf_counter()
try:
    from integration.vllm_plugin import APPLY_TIMES_S
    plugin = sum(APPLY_TIMES_S)
except ImportError:
    plugin = 0.0
print("TIMES", t1 - t0, t2 - t1, plugin)
"""


def one(plugins: str, cache_dir: str):
    env = {
        **os.environ,
        "VLLM_PLUGINS": plugins,
        "TPCOST_PROFILE": "h100-sxm",
        "TPCOST_CACHE_DIR": cache_dir,
    }
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT / "tests/fixtures/llama-h8192-tiny")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("TIMES"))
    _, imp, cfg, plugin = line.split()
    return float(cfg), float(plugin)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tpcost-bench-cache-") as tmp:
        for i in range(a.rounds):
            cache = os.path.join(tmp, f"round{i}")
            miss_cfg, miss_plugin = one("tpcost", cache)  # fresh cache: computes and stores
            runs = {}
            for p in ("tpcost", "") if i % 2 == 0 else ("", "tpcost"):
                runs[p] = one(p, cache)  # "tpcost" now reads the stored plan
            rows.append(
                {
                    "miss_config_s": miss_cfg,
                    "miss_plugin_s": miss_plugin,
                    "hit_config_s": runs["tpcost"][0],
                    "hit_plugin_s": runs["tpcost"][1],
                    "without_config_s": runs[""][0],
                }
            )
    med = lambda k: statistics.median(r[k] for r in rows)  # noqa: E731
    out = {
        "rounds": rows,
        "median_miss_plugin_s": med("miss_plugin_s"),
        "median_miss_fraction_of_config": statistics.median(
            r["miss_plugin_s"] / r["miss_config_s"] for r in rows
        ),
        "median_hit_plugin_s": med("hit_plugin_s"),
        "median_hit_fraction_of_config": statistics.median(
            r["hit_plugin_s"] / r["hit_config_s"] for r in rows
        ),
        "median_ratio_hit_vs_without": statistics.median(
            r["hit_config_s"] / r["without_config_s"] for r in rows
        ),
        "median_without_config_s": med("without_config_s"),
    }
    print(
        f"{'round':>5} {'miss: config [s]':>17} {'plugin [ms]':>12} {'hit: config [s]':>16} "
        f"{'plugin [ms]':>12} "
        f"{'without [s]':>12}"
    )
    for i, r in enumerate(rows):
        print(
            f"{i:5d} {r['miss_config_s']:17.3f} {r['miss_plugin_s'] * 1e3:12.2f} "
            f"{r['hit_config_s']:16.3f} "
            f"{r['hit_plugin_s'] * 1e3:12.2f} {r['without_config_s']:12.3f}"
        )
    print(
        f"in-process, first start (cache miss): {out['median_miss_plugin_s'] * 1e3:.1f} ms, "
        f"{out['median_miss_fraction_of_config']:.2%} of a cold create_engine_config"
    )
    print(
        f"in-process, later starts (cache hit): {out['median_hit_plugin_s'] * 1e3:.2f} ms, "
        f"{out['median_hit_fraction_of_config']:.2%} (goal <= 1 %)"
    )
    print(
        "cross-check, cold processes with/without the plugin (hit): median ratio "
        f"{out['median_ratio_hit_vs_without']:.3f}"
    )
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
