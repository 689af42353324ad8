"""The cutoff decision on the operator's traffic: a /metrics scrape rendered by vLLM's own metric
classes (its iteration-tokens buckets and histogram class), a num_tokens,count CSV, and malformed
files."""

import json

import numpy as np
import pytest
from conftest import need, sp_release_flag

from costmodel import load_model, load_profile, predict
from costmodel.analysis import decide_cutoff, token_grid
from costmodel.workload import grid_weights, read_workload
from integration.cli import main
import os


def _scrape(tmp_path, observations):
    """Render vllm:iteration_tokens_total as vLLM 0.31's PrometheusStatLogger would (two
    engines)."""
    prometheus_client = need("prometheus_client")
    need("vllm")
    from vllm.v1.metrics.buckets import histogram_buckets
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    reg = prometheus_client.CollectorRegistry()
    h = PrometheusStatLogger._histogram_cls(
        name="vllm:iteration_tokens_total",
        documentation="Histogram of number of tokens per engine_step.",
        buckets=histogram_buckets("iteration_tokens"),
        labelnames=["model_name", "engine"],
        registry=reg,
    )
    for engine, values in observations.items():
        for v in values:
            h.labels("llama", str(engine)).observe(v)
    path = tmp_path / "metrics.txt"
    path.write_bytes(prometheus_client.generate_latest(reg))
    return path


def _whatif(capsys, *argv):
    assert main(["whatif", "--no-band", "--json", *sp_release_flag(), *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_metrics_scrape_decision_matches_hand_computation(tmp_path, capsys):
    # 300 decode steps of 8 tokens and 40 prefill steps of 6000 (bucket (4096, 8192]), over two
    # engines
    path = _scrape(tmp_path, {0: [8] * 200 + [6000] * 30, 1: [8] * 100 + [6000] * 10})
    d = _whatif(capsys, "--workload", str(path))
    tp, grid = 4, token_grid(4, 8192)
    # by hand: the 8-token steps land on grid point 8; the 40 steps spread evenly over 4100..8192
    # (1024 points)
    w = np.zeros(grid.size)
    w[1] = 300
    w[1024:] += 40 / 1024
    w /= w.sum()
    pred = predict(load_profile("h100-sxm"), load_model("llama-3.1-70b"), tp, "bf16", grid)
    off, on = pred.t_forward_s("tp"), pred.t_forward_s("sp_asynctp")
    cost = [np.sum(w[:i] * off[:i]) + 1.02 * np.sum(w[i:] * on[i:]) for i in range(grid.size)] + [
        np.sum(w * off)
    ]
    cost = np.array(cost)
    # ties go to the larger threshold; thresholds between two weighted points tie up to the rounding
    # of np.sum
    best = max(i for i in range(cost.size) if cost[i] <= cost.min() * (1 + 1e-12))
    expect = None if best == grid.size else int(grid[best])
    assert d["cutoff_tokens"] == expect
    assert set(d["cutoff_by_spread"]) == {"uniform", "upper", "lower"}
    assert d["cutoff_by_spread"]["uniform"] == expect
    dv = d["decision_value"]
    assert dv["saving_vs_never_s"] == pytest.approx(
        float(np.sum(w * off) - cost[best] + 0.02 * np.sum(w[best:] * on[best:])), rel=1e-6
    )
    assert dv["regret_vs_oracle_s"] >= 0 and "saving_vs_vllm_default_s" in dv


def test_csv_workload_and_weights(tmp_path, capsys):
    f = tmp_path / "hist.csv"
    f.write_text("num_tokens,count\n64,90\n8192,10\n")
    w = grid_weights(read_workload(str(f)), token_grid(4, 8192))
    assert (
        w[15] == pytest.approx(0.9) and w[-1] == pytest.approx(0.1) and w.sum() == pytest.approx(1)
    )
    d = _whatif(capsys, "--workload", str(f))
    pred = predict(
        load_profile("h100-sxm"), load_model("llama-3.1-70b"), 4, "bf16", token_grid(4, 8192)
    )
    assert d["cutoff_tokens"] == decide_cutoff(
        token_grid(4, 8192),
        pred.t_forward_s("tp"),
        pred.t_forward_s("sp_asynctp"),
        0.02,
        w,
        below=8192,
    )
    # the unconstrained best is the budget itself, which vLLM cannot realise (no compile range
    # starts there)
    assert (
        decide_cutoff(
            token_grid(4, 8192), pred.t_forward_s("tp"), pred.t_forward_s("sp_asynctp"), 0.02, w
        )
        == 8192
    )
    assert d["cutoff_tokens"] < 8192


@pytest.mark.parametrize(
    "text,needle",
    [
        ("num_tokens,count\n64,abc\n", "not a number"),
        ("num_tokens,count\n-4,1\n", "positive integer"),
        ("num_tokens,count\n64,nan\n", "finite"),
        ("tokens,n\n1,2\n", "num_tokens,count"),
        (
            '# HELP x\nvllm:iteration_tokens_total_bucket{le="8.0"} '
            '5\nvllm:iteration_tokens_total_bucket{le="16.0"} 3\n',
            "not cumulative",
        ),
        ("# HELP x\nfoo 1\n", "no vllm:iteration_tokens_total_bucket"),
        (
            '# HELP x\nvllm:iteration_tokens_total_bucket{le="8.0" 5\n',
            "not a Prometheus sample line",
        ),
        ("# HELP x\nvllm:iteration_tokens_total_bucket{le=8.0} 5\n", "malformed labels"),
    ],
)
def test_malformed_workload_one_line(tmp_path, one_line_error, text, needle):
    f = tmp_path / "w.txt"
    f.write_text(text)
    one_line_error("whatif", "--no-band", "--workload", str(f), needle=needle)


def test_steps_above_the_budget_are_chunked(capsys, tmp_path):
    """A step of 20000 tokens at budget 8192 is what vLLM runs as 8192 + 8192 + 3616: three steps,
    two at the top and one where 3616 lands; the output says so in one line, never clamping it
    silently."""
    from costmodel.workload import Workload, chunked_note

    w = Workload("w", points=((64, 100.0), (20000, 10.0)))
    g = token_grid(4, 8192)
    weights = grid_weights(w, g)
    assert weights[-1] == pytest.approx(20 / 130) and weights[3616 // 4 - 1] == pytest.approx(
        10 / 130
    )
    assert weights[15] == pytest.approx(100 / 130)
    assert "10 of 110 steps exceed max_num_batched_tokens 8192" in chunked_note(w, 8192)
    assert chunked_note(Workload("w", points=((64, 1.0),)), 8192) is None
    f = tmp_path / "w.csv"
    f.write_text("num_tokens,count\n64,100\n20000,10\n")
    assert main(["whatif", "--no-band", "--workload", str(f), *sp_release_flag()]) == 0
    assert "each counted as the ceil(n/8192) chunked steps vLLM runs" in capsys.readouterr().out


@pytest.mark.parametrize(
    "text,needle",
    [
        ("num_tokens,count\n²,3\n", "num_tokens '²' is not a positive integer"),
        ("num_tokens,count\n64,1e308\n128,1e308\n", "sum to more than a float holds"),
    ],
)
def test_workload_counts_and_digits(tmp_path, one_line_error, text, needle):
    f = tmp_path / "w.csv"
    f.write_text(text)
    for cmd in (
        ["whatif", "--no-band"],
        ["vllm-config", "--gpu", "h100-sxm"],
        ["op", "--tp", "4", "--op", "gemm_rs", "--n", "8192", "--k", "1024"],
    ):
        one_line_error(*cmd, "--workload", str(f), needle=needle)


def test_workload_prometheus_overflow_and_devices(tmp_path, one_line_error):
    f = tmp_path / "m.txt"
    f.write_text(
        "# HELP vllm:iteration_tokens_total x\n"
        + 'vllm:iteration_tokens_total_bucket{le="8.0",engine="0"} 1e308\n'
        + 'vllm:iteration_tokens_total_bucket{le="8.0",engine="1"} 1e308\n'
    )
    one_line_error(
        "whatif", "--no-band", "--workload", str(f), needle="sum to more than a float holds"
    )
    if os.path.exists("/dev/zero"):
        one_line_error(
            "whatif", "--no-band", "--workload", "/dev/zero", needle="workload /dev/zero"
        )


def test_context_len_column_is_read_and_checked(tmp_path, one_line_error):
    from costmodel.workload import read_workload

    f = tmp_path / "ctx.csv"
    f.write_text("num_tokens,count,context_len\n64,3,512\n64,1,2560\n4096,2,8192\n")
    w = read_workload(str(f))
    assert w.points == ((64, 4.0), (4096, 2.0)) and w.contexts == (
        (64, 3.0, 512),
        (64, 1.0, 2560),
        (4096, 2.0, 8192),
    )
    for text, needle in (
        ("num_tokens,count,context_len\n64,1\n", "expected 3 cells, got 2"),
        ("num_tokens,count,context_len\n64,1,0\n", "context_len '0' is not an integer in [1,"),
        ("num_tokens,count,context_len\n64,1,1.5\n", "context_len '1.5' is not an integer"),
        ("num_tokens,count,ctx\n64,1,5\n", "expected a header 'num_tokens,count',"),
    ):
        f.write_text(text)
        one_line_error("whatif", "--workload", str(f), needle=needle)


def test_decode_regime_is_the_count_weighted_context_per_padded_step():
    """By hand: 64 tokens at 3 x 512 and 1 x 2560 -> 1024 there; 4096 at 8192; elsewhere the
    workload's mean (3·512 + 2560 + 2·8192) / 6 = 3413.3; a step pads to its grid point (63 -> 64,
    4093 -> 4096)."""
    from costmodel.analysis import token_grid
    from costmodel.workload import Workload, decode_regime

    w = Workload(
        "w",
        points=((64, 4.0), (4096, 2.0)),
        contexts=((64, 3.0, 512), (64, 1.0, 2560), (4096, 2.0, 8192)),
    )
    d = decode_regime(w, token_grid(4, 8192), 256)
    got = d.context_at(np.array([63.0, 64.0, 4093.0, 4096.0, 128.0, 9000.0]))
    mean = (3 * 512 + 2560 + 2 * 8192) / 6
    np.testing.assert_allclose(got, [1024, 1024, 8192, 8192, mean, mean])
    assert decode_regime(Workload("w", points=((64, 1.0),)), token_grid(4, 8192), 256) is None


def test_a_constant_context_column_equals_the_flag(tmp_path, capsys, one_line_error):
    """Every row at context 4096: whatif decides exactly as with --context-len 4096 and the same
    counts."""
    f2, f3 = tmp_path / "two.csv", tmp_path / "three.csv"
    f2.write_text("num_tokens,count\n64,90\n2048,10\n")
    f3.write_text("num_tokens,count,context_len\n64,90,4096\n2048,10,4096\n")
    a = _whatif(capsys, "--workload", str(f3))
    b = _whatif(capsys, "--workload", str(f2), "--context-len", "4096")
    assert a["cutoff_tokens"] == b["cutoff_tokens"]
    assert a["decision_value"]["saving_vs_never_s"] == pytest.approx(
        b["decision_value"]["saving_vs_never_s"], rel=1e-12
    )
    c = _whatif(capsys, "--workload", str(f2))  # the default context (1024) reads less KV
    assert c["decision_value"]["expected_forward_s"] < a["decision_value"]["expected_forward_s"]
    one_line_error(
        "whatif", "--workload", str(f3), "--context-len", "512", needle="context_len column states"
    )
    one_line_error(
        "vllm-config",
        "--model",
        "tests/fixtures/kimi-k3.config.json",
        "--gpu",
        "b200",
        "--tp",
        "8",
        "--workload",
        str(f3),
        needle="context_len column has no effect",
    )


@pytest.mark.parametrize(
    "text,needle",
    [
        (
            "num_tokens,count\n1" + "0" * 400 + ",3\n",
            "is above 2^40 tokens",
        ),  # 10**400: an OverflowError traceback
        (
            "num_tokens,count\n1" + "0" * 5000 + ",3\n",
            "is above 2^40 tokens",
        ),  # past int()'s 4300-digit limit
        ("num_tokens,count\n1099511627777,3\n", "is above 2^40 tokens"),
        (
            '# HELP x\nvllm:iteration_tokens_total_bucket{le="1e13"} '
            '3\nvllm:iteration_tokens_total_bucket{le="+Inf"} 3\n',
            "is above 2^40 tokens",
        ),
    ],
)
def test_step_sizes_beyond_any_budget_are_refused(tmp_path, one_line_error, text, needle):
    """Issue 50: a num_tokens (or bucket bound) no step can have is refused in one line, never a
    traceback."""
    w = tmp_path / "w.txt"
    w.write_text(text)
    one_line_error("whatif", "--workload", str(w), "--no-band", needle=needle)
