"""Dump every prediction a refactoring must not change, or compare two dumps byte for byte.

    python tools/compare_predictions.py dump OUT.json        # this checkout's predictions
    python tools/compare_predictions.py compare A.json B.json

What is dumped: the predicted curves (t_tp, t_sp, t_sp_asynctp per forward, and the breakdown terms)
of every built-in profile × built-in model (and the MoE fixture) × TP 2/4/8 × dtype
bf16/fp8/fp8-dynamic over N = 1…20000 (step 37); the `whatif --json` output with its band (h100-sxm
llama-3.1-70b TP 4, b200 llama-3.1-8b TP 8 fp8); and the printed output of
benchmarks/vllm_thresholds.py. Floats are written with repr (every bit), so equal files mean
identical predictions. Used for the architecture refactors (docs/model.md: "one home per formula"):
run `dump` before and after, then `compare`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

N = np.arange(1, 20001, 37, dtype=float)
WHATIF = (
    ["--gpu", "h100-sxm", "--model", "llama-3.1-70b", "--tp", "4"],
    ["--gpu", "b200", "--model", "llama-3.1-8b", "--tp", "8", "--dtype", "fp8"],
)


def _curves() -> dict:
    from costmodel.errors import TpcostError
    from costmodel.model import SCHEDULES, predict
    from costmodel.profile import builtin_profile_names, load_profile
    from costmodel.shapes import builtin_model_names, load_model

    out = {}
    models = builtin_model_names() + [str(ROOT / "tests" / "fixtures" / "moe-tiny" / "config.json")]
    for pn in builtin_profile_names():
        p = load_profile(pn)
        for mn in models:
            shape = load_model(mn)
            for tp in (2, 4, 8):
                for dtype in ("bf16", "fp8", "fp8-dynamic"):
                    try:
                        pred = predict(p, shape, tp, dtype, N)
                    except TpcostError as e:
                        out[f"{pn}|{mn}|{tp}|{dtype}"] = str(e)
                        continue
                    rec = {s: [repr(float(x)) for x in pred.t_forward_s(s)] for s in SCHEDULES}
                    rec["breakdown"] = {
                        k: [repr(float(x)) for x in np.ravel(v)] for k, v in pred.breakdown.items()
                    }
                    out[f"{pn}|{mn}|{tp}|{dtype}"] = rec
    return out


def _whatif() -> dict:
    from integration.cli import main

    out = {}
    for argv in WHATIF:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            main(["whatif", "--json", *argv])
        out[" ".join(argv)] = buf.getvalue()
    return out


def dump(path: str) -> None:
    thr = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "vllm_thresholds.py")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    res = {"curves": _curves(), "whatif": _whatif(), "vllm_thresholds": thr}
    Path(path).write_text(json.dumps(res, sort_keys=True) + "\n")


def compare(a: str, b: str) -> int:
    da, db = json.loads(Path(a).read_text()), json.loads(Path(b).read_text())
    bad = 0
    for part in ("curves", "whatif", "vllm_thresholds"):
        if da[part] == db[part]:
            print(f"{part}: identical")
            continue
        bad += 1
        if isinstance(da[part], dict):
            keys = sorted(
                k for k in set(da[part]) | set(db[part]) if da[part].get(k) != db[part].get(k)
            )
            print(f"{part}: {len(keys)} entries differ, e.g. {keys[:3]}")
        else:
            print(f"{part}: differs")
    return 1 if bad else 0


def main(argv=None) -> int:
    from costmodel.io import doc_summary

    ap = argparse.ArgumentParser(description=doc_summary(__doc__))
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("out")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    args = ap.parse_args(argv)
    if args.cmd == "dump":
        dump(args.out)
        return 0
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
