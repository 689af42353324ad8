"""calib/reference.py: the fits of the released sources, committed as data (calib/data/family_fit.json) and
assembled by tools/build_profiles.py; the staleness test refits them from data/reference."""

from __future__ import annotations

import csv
import math

import pytest

from calib import reference as R
from costmodel.errors import TpcostError

REL = 1e-3  # a refit on another numpy / scipy may differ in the last digits; a changed row moves it by far more


def _differences(fresh: dict, committed: dict) -> list[str]:
    """Where a refit differs from the committed fit: a value or rms beyond REL, or another set of unidentified terms."""
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
                    out.append(f"{family} {sid or 'shared'} {key}: {v:.6g} != {c['values'][sid][key]:.6g}")
    return out


def test_committed_family_fit_is_current():
    """Refit every family from the committed start trees and the released rows: the committed result still holds."""
    trees = R.load_family_trees()
    assert _differences(R.fit_families(trees), R.load_family_fits(trees)) == []


def test_a_changed_released_row_makes_the_staleness_check_fail(tmp_path, monkeypatch):
    """One KRAKEN_PR19 row 30 % slower on the fused arm moves the Hopper fit: the comparison above reports it."""
    rows = list(csv.DictReader(open(R.FUSED_CSV, newline="", encoding="utf-8-sig")))
    i = next(i for i, r in enumerate(rows) if r["source_id"] == "KRAKEN_PR19")
    rows[i]["overlap_value"] = str(float(rows[i]["overlap_value"]) * 1.3)
    changed = tmp_path / "fused_ops.csv"
    with open(changed, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    monkeypatch.setattr(R, "FUSED_CSV", changed)
    trees = R.load_family_trees()
    fresh = {"hopper": R.fit_family("hopper", trees["hopper"])}
    assert _differences(fresh, R.load_family_fits(trees))


def test_fits_from_other_trees_are_refused():
    trees = R.load_family_trees()
    other = {**trees, "hopper": {"h100-sxm": {**trees["hopper"]["h100-sxm"], "schema_version": 1, "x": 1}}}
    with pytest.raises(TpcostError, match="fitted to other start trees"):
        R.load_family_fits(other)


def test_the_json_round_trip_keeps_every_term():
    """The shared terms' None key and an unidentified term's infinite sigma survive strict JSON."""
    fit = {"values": {None: {"a": 1.0}, "S": {"b": 2.0}}, "sigma_rel": {None: {"a": 0.1}, "S": {"b": float("inf")}},
           "rms_log": 0.1, "n_residuals": 3, "n_params": 2, "sources": ["S"], "unidentified": ["S: b"]}
    j = R._fit_to_json(fit)
    assert j["sigma_rel"]["S"]["b"] is None and R.SHARED_KEY in j["values"]
    assert R._fit_from_json(j) == fit
