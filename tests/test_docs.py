"""Generated docs tables are what tools/render_docs.py renders from their sources (never
retyped)."""

from conftest import sp_release_flag

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

    monkeypatch.setattr(
        P,
        "VALUE_RANGES",
        ((P.VALUE_RANGES[0][0], P.ValueRange(1, 8192, "SMs", "changed")), *P.VALUE_RANGES[1:]),
    )
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
    acc["families"]["hopper"]["sources"]["KRAKEN_PR19"]["in_sample"]["median_abs_speedup_error"] = (
        0.5
    )
    (results / "accuracy.json").write_text(json.dumps(acc))
    stale = [p.name for p, (old, new) in rd.rendered().items() if old != new]
    assert stale == ["accuracy.md"]


def test_the_band_coverage_whatif_states_is_the_measured_one(capsys):
    """integration/band_coverage.json is what render_docs makes of benchmarks/results/accuracy.json,
    and whatif states exactly it beside its band (human line and JSON)."""
    import json

    from integration.cli import main

    rd = _render_docs()
    assert rd.BAND_COVERAGE.read_text() == rd.band_coverage_json(), (
        "stale: run python tools/render_docs.py"
    )
    want = json.loads(rd.BAND_COVERAGE.read_text())["sources"]
    acc = json.loads((ROOT / "benchmarks" / "results" / "accuracy.json").read_text())[
        "band_calibration"
    ]
    assert (
        all(
            want[s] == {"rows": c["rows"], "covered": c["coverage"]}
            for s, c in acc["per_source"].items()
            if s in want
        )
        and "META_AH_H100_ASYNCTP" not in want
    )
    assert set(want) == set(acc["calibration_sources"])
    assert main(["whatif", "--json", *sp_release_flag()]) == 0
    assert json.loads(capsys.readouterr().out)["band_measured_coverage"] == want
    assert main(["whatif", *sp_release_flag()]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "measured coverage" in ln)
    assert all(f"{s} {c['covered']:.0%} of {c['rows']}" in line for s, c in want.items())


def test_flag_table_names_every_flag_of_every_command():
    """docs/cli.md's "Where each flag takes effect": every flag of every subcommand has a row naming
    it and the command (issue 50: a flag table that says where each flag takes effect), and no row
    names a flag no command has."""
    import argparse
    import re

    from integration.cli import build_parser

    text = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    block = text.split("<!-- flag-table -->")[1].split("<!-- /flag-table -->")[0]
    rows = {}
    for ln in block.strip().splitlines()[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        for flag in re.findall(r"`(--[a-z0-9-]+)`", cells[0]):
            rows.setdefault(flag, set()).update(c.strip() for c in cells[1].split(","))
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    have: dict[str, set] = {}
    for cmd, p in sub.choices.items():
        for a in p._actions:
            for flag in a.option_strings:
                if flag.startswith("--") and flag != "--help":
                    have.setdefault(flag, set()).add(cmd)
    assert rows == have, {
        f: (rows.get(f), have.get(f)) for f in set(rows) | set(have) if rows.get(f) != have.get(f)
    }


def test_a_made_up_release_moving_the_gate_regenerates_the_thresholds_doc(tmp_path, monkeypatch):
    """Issue 57 item 2: a record for a made-up next release that moves gemm_rs_ar's should_run to
    256 changes the benchmark's rows and the rendered docs/vllm-thresholds.md, with no other file
    touched."""
    import dataclasses
    import json
    import shutil

    from costmodel import vllm_tables as T

    cur = T.current()
    v = (cur.version[0], cur.version[1] + 1)
    monkeypatch.setitem(
        T.RELEASES,
        v,
        dataclasses.replace(
            cur,
            version=v,
            serves_from=v,
            wheel="made up for the test",
            kernel=dataclasses.replace(cur.kernel, min_m=256, should_run="gemm_rs_ar.py:1-2"),
        ),
    )
    spec = importlib.util.spec_from_file_location(
        "vllm_thresholds", ROOT / "benchmarks" / "vllm_thresholds.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.kernel_matrix()
    assert rows and {r["vllm_rule_tokens"] for r in rows} == {256}
    rd = _render_docs()
    results = tmp_path / "results"
    shutil.copytree(ROOT / "benchmarks" / "results", results)
    d = json.loads((results / "vllm_thresholds.json").read_text())
    (results / "vllm_thresholds.json").write_text(json.dumps({**d, "kernel_cutoffs": rows}))
    monkeypatch.setattr(rd, "RESULTS", results)
    docs = tmp_path / "docs"
    docs.mkdir()
    for (fname, _), _fn in rd.BLOCKS.items():
        (docs / fname).write_text((ROOT / "docs" / fname).read_text())
    new = {p.name: n for p, (o, n) in rd.rendered(docs).items() if o != n}
    table = (
        new["vllm-thresholds.md"]
        .split("<!-- generated:kernel-cutoffs -->")[1]
        .split("<!-- /generated")[0]
    )
    assert (
        "| M ≥ 256 |" in table
        and "at M = 256:" in table
        and "(256-8192)" in table
        and "M ≥ 128" not in table
    )
