"""Generated docs tables are what tools/render_docs.py renders from their sources (never retyped)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _render_docs():
    spec = importlib.util.spec_from_file_location("render_docs", ROOT / "tools" / "render_docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_committed_generated_blocks_are_current():
    stale = [str(p) for p, (old, new) in _render_docs().rendered().items() if old != new]
    assert not stale, f"stale: {stale} (run python tools/render_docs.py)"


def test_a_changed_source_makes_the_check_fail(tmp_path, monkeypatch):
    rd = _render_docs()
    docs = tmp_path / "docs"
    docs.mkdir()
    for (fname, _), _fn in rd.BLOCKS.items():
        (docs / fname).write_text((ROOT / "docs" / fname).read_text())
    assert all(old == new for old, new in rd.rendered(docs).values())
    import costmodel.profile as P

    monkeypatch.setattr(P, "VALUE_RANGES", ((P.VALUE_RANGES[0][0], P.ValueRange(1, 8192, "SMs", "changed")),
                                            *P.VALUE_RANGES[1:]))
    assert any(old != new for old, new in rd.rendered(docs).values())


def test_a_changed_results_json_makes_the_check_fail(tmp_path, monkeypatch):
    """Changing a number in a results JSON without re-rendering makes the committed docs stale."""
    import json
    import shutil

    rd = _render_docs()
    results = tmp_path / "results"
    shutil.copytree(ROOT / "benchmarks" / "results", results)
    monkeypatch.setattr(rd, "RESULTS", results)
    assert all(old == new for old, new in rd.rendered().values())
    acc = json.loads((results / "accuracy.json").read_text())
    acc["families"]["hopper"]["sources"]["KRAKEN_PR19"]["in_sample"]["median_abs_speedup_error"] = 0.5
    (results / "accuracy.json").write_text(json.dumps(acc))
    stale = [p.name for p, (old, new) in rd.rendered().items() if old != new]
    assert stale == ["accuracy.md"]
