"""Render the generated tables in docs/*.md from their single sources (code tables, benchmarks/results/*.json).

Each generated block sits between `<!-- generated:NAME -->` and `<!-- /generated:NAME -->`; everything outside
the markers is hand-written and kept. `python tools/render_docs.py` rewrites the blocks (atomically);
`--check` exits 1 when a committed block differs from what this script renders (tests/test_docs.py runs it).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from costmodel.io import atomic_write_text  # noqa: E402


def value_ranges_table() -> str:
    """The plausible range of every profile quantity (costmodel.profile.VALUE_RANGES), first match wins."""
    from costmodel.profile import UNCERTAINTY_RANGE, VALUE_RANGES

    lines = ["| quantity (dotted key, regular expression) | range | why |", "|---|---|---|"]
    for pat, r in VALUE_RANGES:
        cell = pat.replace("|", "\\|")  # a pipe inside a table cell
        lines.append(f"| `{cell}` | {r.text()} | {r.why} |")
    lines.append(f"| `<table>.uncertainty_rel.<key>` | {UNCERTAINTY_RANGE.text().strip()} | {UNCERTAINTY_RANGE.why} |")
    return "\n".join(lines)


BLOCKS = {("profiles.md", "value-ranges"): value_ranges_table}


def render(text: str, name: str, body: str) -> str:
    """`text` with the block `name` replaced by `body`; the markers must exist."""
    pat = re.compile(rf"(<!-- generated:{re.escape(name)} -->\n).*?(<!-- /generated:{re.escape(name)} -->)", re.S)
    if not pat.search(text):
        raise SystemExit(f"render_docs: no <!-- generated:{name} --> block")
    return pat.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)


def rendered(docs: Path = ROOT / "docs") -> dict[Path, tuple[str, str]]:
    """path -> (committed text, rendered text) for every doc with generated blocks."""
    out: dict[Path, tuple[str, str]] = {}
    for (fname, name), fn in BLOCKS.items():
        path = docs / fname
        old = out[path][1] if path in out else path.read_text()
        out[path] = (out[path][0] if path in out else old, render(old, name, fn()))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a committed generated block is stale")
    args = ap.parse_args(argv)
    stale = []
    for path, (old, new) in rendered().items():
        if old != new:
            if args.check:
                stale.append(str(path.relative_to(ROOT)))
            else:
                atomic_write_text(path, new)
    if stale:
        print("stale generated docs: " + ", ".join(stale) + " (run python tools/render_docs.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
