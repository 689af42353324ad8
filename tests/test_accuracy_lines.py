"""benchmarks/results/accuracy.json's held-out lines (issue 62): one shape for every family, and
each line above the bias limit names its data limit, with the evidence beside it (no term fitted on
the held-out rows, the in-sample bias)."""

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import accuracy as A  # noqa: E402

LINES = json.loads((ROOT / "benchmarks" / "results" / "accuracy.json").read_text())["leave_one_out"]
KEYS = {
    "family",
    "split",
    "source",
    "rows",
    "median_signed_log_error",
    "in_sample_signed_log_error",
    "terms_fitted_on_held_out",
    "within_bias_limit",
    "data_limit",
}


def test_every_family_and_split_is_in_the_one_block():
    assert {ln["family"] for ln in LINES} >= {"hopper", "blackwell", "single_kernel", "hopper_p2p"}
    assert {ln["split"] for ln in LINES} == {"source", "kernel"}
    for ln in LINES:
        assert KEYS <= set(ln), ln["source"]
        b = ln["median_signed_log_error"]
        # the decode line has its signed value too
        assert b is not None and math.isfinite(b), ln["source"]


def test_a_line_above_the_limit_names_a_data_limit_with_its_evidence():
    for ln in LINES:
        over = abs(ln["median_signed_log_error"]) > A.BIAS_LIMIT
        assert ln["within_bias_limit"] is (not over)
        if over:
            assert ln["data_limit"], (
                f"{ln['source']}: bias {ln['median_signed_log_error']:+.3f} and no data limit"
            )
            assert ln["terms_fitted_on_held_out"] == [], ln["source"]
            assert ln["in_sample_signed_log_error"] is not None, ln["source"]
        else:
            assert ln["data_limit"] is None


def test_the_block_is_built_from_the_families_as_written():
    """leave_one_out_lines recomputes the committed block from the committed per-family results (no
    edit by hand)."""
    d = json.loads((ROOT / "benchmarks" / "results" / "accuracy.json").read_text())
    again = A.leave_one_out_lines(d["families"], d["kernel"], d["p2p_kernels"])
    assert json.loads(json.dumps(again)) == LINES
