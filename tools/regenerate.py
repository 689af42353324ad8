"""Regenerate what a vLLM release record or the model feeds: the derived benchmark JSON, then every
generated block.

    python tools/regenerate.py [--check]

It runs benchmarks/vllm_thresholds.py and benchmarks/dbo_thresholds.py into benchmarks/results/,
then tools/render_docs.py (the README sample and the docs tables). Measurements are not rerun here:
accuracy.json (the fits, python benchmarks/accuracy.py) and the speed files are made by their own
commands. `--check` writes nothing and exits 1 when a committed file differs from what it would
write.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DERIVED = (
    ("benchmarks/vllm_thresholds.py", "vllm_thresholds.json"),
    ("benchmarks/dbo_thresholds.py", "dbo_thresholds.json"),
)


def main(argv=None) -> int:
    from costmodel.io import doc_summary

    ap = argparse.ArgumentParser(description=doc_summary(__doc__))
    ap.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a committed file is stale"
    )
    a = ap.parse_args(argv)
    stale = []
    with tempfile.TemporaryDirectory() as tmp:
        for script, name in DERIVED:
            out = Path(tmp) / name
            subprocess.run(
                [sys.executable, str(ROOT / script), "--json", str(out)],
                check=True,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
            )
            committed = ROOT / "benchmarks" / "results" / name
            if out.read_bytes() != committed.read_bytes():
                stale.append(str(committed.relative_to(ROOT)))
                if not a.check:
                    committed.write_bytes(out.read_bytes())
    render = [sys.executable, str(ROOT / "tools" / "render_docs.py")] + (
        ["--check"] if a.check else []
    )
    rc = subprocess.run(render, cwd=ROOT).returncode
    for s in stale:
        print(f"{'stale' if a.check else 'regenerated'}: {s}")
    return 1 if a.check and (stale or rc) else rc


if __name__ == "__main__":
    sys.exit(main())
