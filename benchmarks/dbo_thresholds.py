"""vLLM 0.34's dual-batch overlap thresholds (32 decode / 512 prefill tokens, "TODO(lucas): tune")
beside tpcost's, for DeepSeek-V3 per GPU, EP size and all-to-all backend, at each GPU's built-in
network and vLLM's default token budget. Nothing here is fitted to vLLM's constants; the all-to-all
terms come from calib/ep_fit.py (the released DeepEP / UCCL runs), the GEMM and HBM terms from the
GPU profiles.

    python benchmarks/dbo_thresholds.py [--json benchmarks/results/dbo_thresholds.json]
"""

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GPUS = ("h100-sxm", "h200-sxm", "h20", "b200")
EPS = (8, 16, 32, 64)
BACKENDS = ("deepep_low_latency", "deepep_high_throughput")
MODEL = "deepseek-v3"


def cell(gpu: str, ep: int, backend: str) -> dict:
    """One grid cell: `tpcost ep --dbo --json` for the setup, or the one line it refuses with."""
    from integration.cli import main

    argv = [
        "ep",
        "--enable-expert-parallel",
        "--gpu",
        gpu,
        "--model",
        MODEL,
        "--data-parallel-size",
        str(ep),
        "--all2all-backend",
        backend,
        "--dbo",
        "--json",
        "--tokens",
        "1",
    ]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    row = {"gpu": gpu, "ep": ep, "all2all_backend": backend}
    if rc:
        return {**row, "refused": err.getvalue().strip().removeprefix("tpcost: error: ")}
    d = json.loads(out.getvalue())
    dbo, setup = d["dbo"], d["setup"]
    phases = {
        p: {
            **{
                k: dbo["phases"][p][k]
                for k in ("threshold_tokens", "crossover_tokens", "saving_s", "mean_step_s")
            },
            "band": dbo["band"][p],
        }
        for p in ("decode", "prefill")
    }
    return {
        **row,
        "network": setup["network"],
        "nodes": setup["nodes"],
        "max_num_batched_tokens": setup["max_num_batched_tokens"],
        "enable": dbo["enable"],
        "decode_token_threshold": dbo["decode_token_threshold"],
        "prefill_token_threshold": dbo["prefill_token_threshold"],
        "phases": phases,
    }


def grid() -> dict:
    """Every cell of the grid, with the command that made it."""
    from costmodel.vllm_tables import ep_rules

    return {
        "command": "python benchmarks/dbo_thresholds.py --json "
        "benchmarks/results/dbo_thresholds.json",
        "model": MODEL,
        "vllm_defaults": dict(ep_rules().dbo_thresholds),
        "cells": [cell(g, ep, b) for g in GPUS for ep in EPS for b in BACKENDS],
    }


def main(argv=None) -> int:
    from costmodel.io import atomic_write_text, dumps_json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the grid here")
    a = ap.parse_args(argv)
    g = grid()
    for c in g["cells"]:
        what = c.get("refused") or (
            f"decode {c['decode_token_threshold']} / prefill {c['prefill_token_threshold']}"
            f" (budget {c['max_num_batched_tokens']})"
        )
        print(f"{c['gpu']:9s} EP {c['ep']:3d} {c['all2all_backend']:24s} {what}")
    if a.json:
        atomic_write_text(Path(a.json), dumps_json(g, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
