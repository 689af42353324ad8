"""Read vLLM's all-reduce dispatch and fusion tables out of a vLLM wheel (or an installed tree)
without importing it.

    python tools/read_vllm_tables.py WHEEL_OR_SITE_PACKAGES [...] --out
    tests/fixtures/vllm_tables_read.json

Each table is the literal of a module-level (or class-level) assignment, parsed with `ast` (never
executed), with the file and line it sits on and the wheel's version and commit
(`vllm/_version.py`). tests/test_vllm_tables.py compares costmodel/vllm_tables.py against the
committed output.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import re
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from costmodel.io import atomic_write_text  # noqa: E402

# (file inside the package, assignment name) of every table costmodel/vllm_tables.py reproduces
TABLES = (
    ("vllm/distributed/device_communicators/all_reduce_utils.py", "CUSTOM_ALL_REDUCE_MAX_SIZES"),
    ("vllm/distributed/device_communicators/all_reduce_utils.py", "SYMM_MEM_ALL_REDUCE_MAX_SIZES"),
    ("vllm/distributed/device_communicators/all_reduce_utils.py", "FI_MNNVL_ALLREDUCE_MAX_SIZE_MB"),
    (
        "vllm/distributed/device_communicators/all_reduce_utils.py",
        "NCCL_SYMM_MEM_ALL_REDUCE_CONFIG",
    ),
    ("vllm/distributed/device_communicators/symm_mem.py", "_WORLD_SIZES_MULTIMEM"),
    ("vllm/compilation/passes/fusion/allreduce_rms_fusion.py", "FI_ALLREDUCE_FUSION_MAX_SIZE_MB"),
    (
        "vllm/compilation/passes/fusion/allreduce_rms_fusion.py",
        "_FI_ALLREDUCE_ONE_SHOT_MAX_SIZES_MB",
    ),
)
NAMES = {"KiB": 1024, "MiB": 1024 * 1024, "GiB": 1024**3}


def _value(node):
    """A literal with KiB/MiB arithmetic folded (ast only; no code runs)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in NAMES:
        return NAMES[node.id]
    if isinstance(node, ast.BinOp):
        a, b = _value(node.left), _value(node.right)
        ops = {
            ast.Mult: lambda: a * b,
            ast.FloorDiv: lambda: a // b,
            ast.Div: lambda: a / b,
            ast.Add: lambda: a + b,
        }
        return ops[type(node.op)]()
    if isinstance(node, ast.Dict):
        return {_key(_value(k)): _value(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_value(e) for e in node.elts]
    raise ValueError(f"not a literal: {ast.dump(node)[:80]}")


def _key(k):
    return json.dumps(k) if isinstance(k, (list, tuple)) else str(k)


def _find(tree, name):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return node
    return None


def read(source: str) -> dict:
    """{version, commit, tables: {name: {file, line, value}}} of one wheel or site-packages
    directory."""
    p = Path(source)
    if p.suffix == ".whl":
        z = zipfile.ZipFile(p)
        text = lambda f: z.read(f).decode()  # noqa: E731
    else:
        text = lambda f: (p / f).read_text()  # noqa: E731
    ver = ast.parse(text("vllm/_version.py"))
    meta = {
        n.targets[0].id: n.value
        for n in ver.body
        if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
    }
    out = {
        "version": _value(meta["__version__"]) if "__version__" in meta else None,
        "commit": _value(meta["__commit_id__"]) if "__commit_id__" in meta else None,
        "from": p.name,
        "tables": {},
    }
    for f, name in TABLES:
        node = _find(ast.parse(text(f)), name)
        if node is not None:
            out["tables"][name] = {"file": f, "line": node.lineno, "value": _value(node.value)}
    return out


def main(argv=None) -> int:
    from costmodel.io import doc_summary

    ap = argparse.ArgumentParser(description=doc_summary(__doc__))
    ap.add_argument("sources", nargs="+", help="vLLM wheels or site-packages directories")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    res = {r["version"]: r for r in (read(s) for s in a.sources)}
    atomic_write_text(a.out, json.dumps(res, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())


# ------------------------------------------------------------------ the hand gates of a release's
# model code
GATE_SCAN_DIRS = ("vllm/models", "vllm/model_executor", "vllm/distributed")
GATE_NAME = re.compile(
    r"^\s*(?P<name>_?[A-Z0-9_]*(?:(?:MAX|MIN)_(?:NUM_)?(?:TOKENS|ROWS|BYTES)(?:_PER_RANK)?|THRESHOLD))"
    r"\s*(?::[^=]+)?=\s*(?P<value>[^#\n]*?)\s*(?:#.*)?$"
)


def scan_gates(site: str) -> list[tuple[str, int, str, str]]:
    """Every constant named like a token, row or byte gate (*_MAX_TOKENS, *_MIN_ROWS, *_MAX_BYTES,
    *_THRESHOLD, ...) assigned in the wheel's model, layer and communicator code: (file, line, name,
    value as written). Keyword arguments (a value ending in a comma) are not constants."""
    out = []
    root = Path(site)
    for d in GATE_SCAN_DIRS:
        for path in sorted((root / d).rglob("*.py")):
            for i, line in enumerate(
                path.read_text(encoding="utf-8", errors="replace").splitlines(), 1
            ):
                m = GATE_NAME.match(line)
                if m and not m.group("value").endswith(",") and m.group("value"):
                    out.append((str(path.relative_to(root)), i, m.group("name"), m.group("value")))
    return out


def unclassified_gates(site: str, inventory) -> tuple[list[str], list[str]]:
    """(gate-named constants of the wheel the release record does not classify, record entries the
    wheel no longer holds where the record says): what makes a new release's new gate impossible to
    slip in unlisted."""
    found = {f"{f}:{line}": name for f, line, name, _ in scan_gates(site)}
    listed = {g.where: g.name for g in inventory if g.scanned}
    new = sorted(f"{w} {n}" for w, n in found.items() if listed.get(w) != n)
    gone = sorted(f"{w} {n}" for w, n in listed.items() if found.get(w) != n)
    return new, gone
