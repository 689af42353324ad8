"""The regime is an input (CUDA graphs vs eager), and vLLM PR #28672's graph-mode decode cost is reproduced.

VLLM_PR28672 is in the Hopper joint fit (calib/reference.py FamilyFit: it pins the per-barrier GPU cost), so
the decode check below is in-sample; its leave-one-source-out value is in benchmarks/results/accuracy.json."""

import json

import pytest

from integration.cli import main

MEASURED_S = 50.318 - 18.911  # data/reference/end_to_end.csv: SP+AsyncTP at every size minus thresholded
STEPS = 1023


def _rows(capsys, *extra):
    assert main(["whatif", "--gpu", "h100-sxm", "--model", "llama-3.1-70b", "--tp", "4", "--dtype", "fp8",
                 "--max-num-batched-tokens", "16384", "--tokens", "64", "--no-band", "--json", *extra]) == 0
    return {r["num_tokens"]: r for r in json.loads(capsys.readouterr().out)["rows"]}


def test_pr28672_decode_cost_within_30_percent(capsys):
    r = _rows(capsys)[64]
    predicted = STEPS * (r["t_sp_asynctp_s"] - r["t_tp_s"])
    assert abs(predicted - MEASURED_S) <= 0.30 * MEASURED_S, predicted


def test_enforce_eager_adds_the_host_issue_time_of_torchs_pipeline(capsys):
    graph = _rows(capsys)[64]
    eager = _rows(capsys, "--enforce-eager")[64]
    assert eager["t_tp_s"] >= graph["t_tp_s"]
    assert eager["t_sp_asynctp_s"] > graph["t_sp_asynctp_s"]  # the Python pipeline's calls at 10.6 us each
    capture = _rows(capsys, "--cudagraph-max-tokens", "32")[64]  # 64 > 32: this step runs eagerly too
    assert capture["t_sp_asynctp_s"] == pytest.approx(eager["t_sp_asynctp_s"])


def test_regime_flags_are_checked(capsys, one_line_error):
    one_line_error("whatif", "--cudagraph-max-tokens", "-1", needle="--cudagraph-max-tokens must be in [0,")
    one_line_error("whatif", "--cudagraph-max-tokens", "x", needle="is not an integer")
    one_line_error("whatif", "--enforce-eager", "--cudagraph-max-tokens", "8", needle="not allowed with")
