"""calib/reference.py and calib/components.py: the fits of the released sources, committed as data
(calib/data/component_fits.json, family_fit.json; calib/results.py reads them) and assembled by
tools/build_profiles.py. The staleness tests refit them from data/reference."""

from __future__ import annotations

import csv
import json
import math

import numpy as np

import pytest

from calib import components as CMP
from calib.assemble import family_trees
from calib import reference as R
from calib import results as CR
from costmodel.errors import TpcostError

# a refit on another numpy / scipy may differ in the last digits; a changed row moves it by far more
REL = 1e-3


def _differences(fresh: dict, committed: dict) -> list[str]:
    """Where a refit differs from the committed fit: a value or rms beyond REL, or another set of
    unidentified terms."""
    out = []
    for family, f in fresh.items():
        c = committed[family]
        if f["unidentified"] != c["unidentified"]:
            out.append(f"{family}: unidentified {f['unidentified']} != {c['unidentified']}")
        if not math.isclose(f["rms_log"], c["rms_log"], rel_tol=REL):
            out.append(f"{family}: rms_log {f['rms_log']} != {c['rms_log']}")
        for sid, per in f["values"].items():
            for key, v in per.items():
                if not math.isclose(v, c["values"][sid][key], rel_tol=REL):
                    out.append(
                        f"{family} {sid or 'shared'} {key}: {v:.6g} != {c['values'][sid][key]:.6g}"
                    )
    return out


def _tree_differences(fresh, committed, path="") -> list[str]:
    """Where two JSON trees differ: numbers beyond REL (absolute 1e-12 near zero), anything else
    exactly."""
    if isinstance(fresh, dict) and isinstance(committed, dict):
        out = [f"{path}{k}: only on one side" for k in set(fresh) ^ set(committed)]
        for k in set(fresh) & set(committed):
            out += _tree_differences(fresh[k], committed[k], f"{path}{k}.")
        return out
    if isinstance(fresh, list) and isinstance(committed, list) and len(fresh) == len(committed):
        return [
            d
            for i, (a, b) in enumerate(zip(fresh, committed))
            for d in _tree_differences(a, b, f"{path}{i}.")
        ]
    if isinstance(fresh, float) or isinstance(committed, float):
        ok = (
            isinstance(fresh, (int, float))
            and isinstance(committed, (int, float))
            and math.isclose(fresh, committed, rel_tol=REL, abs_tol=1e-12)
        )
        return [] if ok else [f"{path[:-1]}: {fresh!r} != {committed!r}"]
    if isinstance(fresh, str) and isinstance(committed, str) and fresh != committed:
        return [] if _same_text(fresh, committed) else [f"{path[:-1]}: {fresh!r} != {committed!r}"]
    return [] if fresh == committed else [f"{path[:-1]}: {fresh!r} != {committed!r}"]


def _same_text(a: str, b: str) -> bool:
    """Source strings print fit errors with 3 decimals: they may differ in a last digit on another
    build."""
    import re

    num = re.compile(r"\d+\.\d+")
    return num.sub("#", a) == num.sub("#", b)


def _one_row_slower(path, tmp_path, column, pick):
    """A copy of the CSV at `path` in which the first row `pick` selects is 30 % slower in
    `column`."""
    rows = list(csv.DictReader(open(path, newline="", encoding="utf-8-sig")))
    i = next(i for i, r in enumerate(rows) if pick(r))
    rows[i][column] = str(float(rows[i][column]) * 1.3)
    changed = tmp_path / path.name
    with open(changed, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return changed


def _fresh_components() -> dict:
    # as the JSON holds it (tuples become lists)
    return json.loads(json.dumps(CMP.component_fits()))


def test_committed_component_fits_are_current():
    """Refit every component from data/reference: the committed component_fits.json still holds."""
    assert _tree_differences(_fresh_components(), CR.load_components()) == []


def test_a_changed_component_row_makes_the_staleness_check_fail(tmp_path, monkeypatch):
    """One MEGATRON_PR5596 all-gather time 30 % slower moves the H100 all-gather fit: the comparison
    reports it."""
    monkeypatch.setattr(
        R,
        "CSV",
        _one_row_slower(
            R.CSV,
            tmp_path,
            "baseline_value",
            lambda r: r["source_id"] == "MEGATRON_PR5596" and r["metric"] == "allgather_time",
        ),
    )
    diff = _tree_differences(_fresh_components(), CR.load_components())
    assert any(d.startswith("h100_collectives.nccl_all_gather.tp8.") for d in diff)


def test_committed_family_fit_is_current():
    """Refit every family from the committed start trees and the released rows: the committed result
    still holds, and so do the fits made with it (the B300 reduce-scatter latency, the B200 TP 2
    all-reduce)."""
    raw = family_trees()
    fits, made = R.fit_families(raw)
    assert _differences(fits, CR.load_family_fits(raw)) == []
    assert _tree_differences(json.loads(json.dumps(made)), CR.load_family_result(raw)["with"]) == []


def test_a_changed_released_row_makes_the_staleness_check_fail(tmp_path, monkeypatch):
    """One KRAKEN_PR19 row 30 % slower on the fused arm moves the Hopper fit: the comparison above
    reports it."""
    monkeypatch.setattr(
        R,
        "FUSED_CSV",
        _one_row_slower(
            R.FUSED_CSV, tmp_path, "overlap_value", lambda r: r["source_id"] == "KRAKEN_PR19"
        ),
    )
    trees = family_trees()
    fresh = {"hopper": R.fit_family("hopper", trees["hopper"])}
    assert _differences(fresh, CR.load_family_fits(trees))


def test_fits_from_other_trees_are_refused():
    trees = family_trees()
    other = {
        **trees,
        "hopper": {"h100-sxm": {**trees["hopper"]["h100-sxm"], "schema_version": 1, "x": 1}},
    }
    with pytest.raises(TpcostError, match="fitted to other start trees"):
        CR.load_family_fits(other)


def test_a_missing_result_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(CR, "COMPONENT_FITS", tmp_path / "component_fits.json")
    with pytest.raises(TpcostError, match="missing: run python -m calib.components"):
        CR.load_components()
    (tmp_path / "component_fits.json").write_text("{not json")
    with pytest.raises(TpcostError, match="not readable JSON"):
        CR.load_components()


def test_the_json_round_trip_keeps_every_term():
    """The shared terms' None key and an unidentified term's infinite sigma survive strict JSON."""
    fit = {
        "values": {None: {"a": 1.0}, "S": {"b": 2.0}},
        "sigma_rel": {None: {"a": 0.1}, "S": {"b": float("inf")}},
        "rms_log": 0.1,
        "n_residuals": 3,
        "n_params": 2,
        "sources": ["S"],
        "unidentified": ["S: b"],
    }
    j = CR.fit_to_json(fit)
    assert j["sigma_rel"]["S"]["b"] is None and CR.SHARED_KEY in j["values"]
    assert CR.fit_from_json(j) == fit


def test_meta_ah_reading_scores_only_the_pipelined_rows():
    """META_AH_H100_ASYNCTP's row rule (docs/model.md §6): an AG+MM row is torch's pipelined op only
    where its measured fused arm is at least the op's W weight reads (W·k·n·2 / HBM); the 22 rows
    below it are excluded with their numbers, the 42 others scored, rows with fewer rows than ranks
    padded to W on both arms."""
    assert R.pipelined_weight_floor_s(8, 28672, 8192, 2.0, 3.35e12) == pytest.approx(
        8 * 28672 * 8192 * 2 / 3.35e12
    )
    scored = R.fused_op_rows("META_AH_H100_ASYNCTP")
    native = [
        e
        for e in R.excluded_fused_rows()
        if e["source"] == "META_AH_H100_ASYNCTP" and "weight reads" in e["reason"]
    ]
    assert len(scored) == 42 and len(native) == 22
    for r in scored:
        assert r["overlap_s"] >= R.pipelined_weight_floor_s(r["tp"], r["k"], r["n"], 2.0, 3.35e12)
        assert r["m"] % r["tp"] == 0 and r["m"] == max(r["m_as_published"], r["tp"])
    assert all("below the pipelined op's 8 weight reads" in e["reason"] for e in native)
    assert {(r["k"], r["n"]) for r in scored} == {
        (28672, 8192),
        (53248, 16384),
        (14336, 4096),
        (11008, 4096),
    }


def test_meta_ah_is_scored_leave_one_source_out_and_never_fitted():
    """META_AH is scored against the Hopper fit with its own host issue time and benchmark overhead
    refitted on it (the leave-one-source-out rule of every source), and is in no family's fit."""
    assert "META_AH_H100_ASYNCTP" not in R.family_sources("hopper")
    trees = R.start_trees()[0]["hopper"]
    full = R.fit_family("hopper", trees)
    rows = R.source_rows("hopper", trees, "META_AH_H100_ASYNCTP", full, refit_own=True)
    assert len(rows) == 42 and all(r["offset_s"] > 0 for r in rows)
    assert all(np.isfinite(r["fused_predicted_s"]) and r["fused_predicted_s"] > 0 for r in rows)


def test_decode_identifiability_profiles_the_barrier_without_pr28672():
    """The identifiability check of PR 28672's deciding term: at each barrier held on the grid the
    fit without PR 28672 is refitted (KRAKEN_PR19 only), the decode difference grows with the
    barrier (2W barriers per fused op, 64-token graph-replayed steps), the unconstrained fit is the
    least of them, and the interval is the likelihood-ratio rule applied to those points."""
    d = R.decode_identifiability(R.start_trees()[0]["hopper"])
    assert d["from"] == ["KRAKEN_PR19"] and d["term"] == "asynctp.barrier_s"
    pts = d["points"]
    assert [p["barrier_s"] for p in pts] == pytest.approx(list(R.DECODE_GRID_S))
    assert np.all(np.diff([p["decode_s"] for p in pts]) > 0)
    assert all(d["best"]["sum_sq"] <= p["sum_sq"] + 1e-12 for p in pts)
    inside = [
        p for p in [*pts, d["best"]] if p["sum_sq"] - d["best"]["sum_sq"] <= d["residual_variance"]
    ]
    assert d["interval_barrier_s"] == [
        min(p["barrier_s"] for p in inside),
        max(p["barrier_s"] for p in inside),
    ]
    assert d["interval_decode_s"][0] <= d["best"]["decode_s"] <= d["interval_decode_s"][1]
    assert d["measured_decode_s"] == pytest.approx(R.pr28672_measured_decode_s())
    # the prior where unidentified
    assert all(p["host_identified"] or p["host_op_s"] == pytest.approx(3e-6) for p in pts)
