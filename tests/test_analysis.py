"""costmodel.analysis: schedules that cannot run are null (never zero), TP 1 has no SP schedules,
and the Monte Carlo band's draws, memory and coarsening."""

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import sp_release_flag

from costmodel.analysis import perturbed
from costmodel.model import predict
from costmodel.profile import load_profile, value_range
from costmodel.shapes import load_model
from integration.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_band_draws_are_clipped_into_the_range_not_refused():
    p = load_profile("h100-sxm").with_values(
        {"asynctp.stream_concurrency": 1.0, "gemm.max_efficiency": 0.99}
    )
    z = np.linspace(-4, 4, 41)
    kappa = perturbed(p, "asynctp.stream_concurrency", z)
    eff = perturbed(p, "gemm.max_efficiency", z)
    assert kappa.max() == 1.0 and kappa.min() < 1.0
    assert eff.max() == 1.0 and eff.min() > 0
    # a draw far out is clipped at the top of the range
    bar = perturbed(p, "asynctp.barrier_s", np.array([1e3]))
    assert bar[0] == value_range("asynctp.barrier_s").hi


@pytest.mark.parametrize("band", [True, False])
def test_tp1_has_no_sp_schedules(capsys, band):
    argv = ["whatif", "--tp", "1", "--json", "--model", "llama-3.1-8b"] + (
        [] if band else ["--no-band"]
    )
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["schema_version"] == 2
    for r in d["rows"]:
        assert r["t_tp_s"] > 0
        for k in ("t_sp_s", "t_sp_asynctp_s", "speedup_sp", "speedup_sp_asynctp", "t_sp_layer_s"):
            assert r[k] is None, (k, r)
    assert (
        d["cutoff_tokens"] is None
        and d["sp_cutoff_tokens"] is None
        and d["cutoff_band_tokens"] is None
    )
    assert d["vllm_default_sp_min_token_num"] is None  # vLLM turns SP off at tp 1
    assert "tp >= 2" in d["unavailable"]["sp"]
    assert main([a for a in argv if a != "--json"]) == 0  # the table too
    assert "n/a" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv", [["--tp", "16"], ["--tp", "4", "--set", "interconnect.domain_size=2"]]
)
def test_unavailable_fused_ops_are_null_not_zero(capsys, argv):
    assert main(["whatif", "--no-band", "--json", *argv]) == 0
    d = json.loads(capsys.readouterr().out)
    for r in d["rows"]:
        assert r["speedup_sp_asynctp"] is None and r["t_sp_asynctp_s"] is None
        assert r["speedup_sp"] is not None and r["speedup_sp"] > 0
    assert "symmetric memory cannot span" in d["unavailable"]["sp_asynctp"]


def test_python_api_is_nan_never_zero():
    pred = predict(
        load_profile("h100-sxm"), load_model("llama-3.1-70b"), 16, "bf16", [64.0, 8192.0]
    )
    assert np.all(np.isnan(pred.speedup_sp_asynctp)) and np.all(pred.speedup_sp > 0)
    pred1 = predict(load_profile("h100-sxm"), load_model("llama-3.1-8b"), 1, "bf16", [64.0])
    assert np.isnan(pred1.speedup_sp[0]) and np.isinf(pred1.t_forward_s("sp")[0])


def test_band_on_a_2_20_token_budget_fits_under_rlimit_as_4gib():
    """whatif --max-num-batched-tokens 1048576 with the band, address space limited to 4 GiB
    (benchmarks time it)."""
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30)); "
        "from integration.cli import main; sys.exit(main(['whatif', '--max-num-batched-tokens', "
        "'1048576', "
        f"'--json', *{sp_release_flag()!r}]))"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600
    )
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["cutoff_tokens"] is not None and d["cutoff_band_tokens"] is not None
    assert d["band_resolution_tokens"] == 128  # 262144 multiples of 4, decided every 32nd
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert peak_kib < 2 * 1024 * 1024, peak_kib


def test_band_is_unchanged_below_the_coarsening_point(capsys):
    """Up to BAND_GRID_MAX grid points the band runs on the full grid (resolution = tp)."""
    assert main(["whatif", "--json", "--model", "llama-3.1-8b", "--tp", "2"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["band_resolution_tokens"] == 2


def test_band_reads_as_an_interval_with_the_share_that_never_pays(capsys):
    """Issue 49 item 4: a cutoff band prints as an interval of tokens; where an edge is "never" it
    also gives the share of the draws in which the op never pays (op, whatif and their JSON)."""
    import json

    import numpy as np

    from costmodel.analysis import band_edges
    from integration.cli import main

    b = band_edges(np.array([100.0] * 70 + [np.inf] * 30))
    assert tuple(b) == (100, None) and b.never_share == pytest.approx(0.3)
    assert b.text() == "[100, never] (never pays in 30% of the draws)"
    assert band_edges(np.array([100.0, 200.0])).text() == "[100, 200]"
    argv = [
        "op",
        "--gpu",
        "b200",
        "--tp",
        "8",
        "--op",
        "gemm_ar",
        "--impl",
        "kernel",
        "--n",
        "7168",
        "--k",
        "1536",
    ]
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    share = d["cutoff_band_never_share"]
    assert 0.0 <= share <= 1.0 and (d["cutoff_band_tokens"][1] is None) == (share >= 0.05)
    assert main(argv) == 0
    if d["cutoff_band_tokens"][1] is None:
        assert f"never pays in {share:.0%} of the draws" in capsys.readouterr().out


def test_band_drivers_rank_what_moves_the_decision(capsys):
    """band_drivers: Spearman's ρ of each drawn quantity with the decision, never (+inf) the
    largest; a quantity the decision follows ranks first at ρ 1, one that makes the op never pay
    correlates positively, a constant or unrelated quantity is not listed, and a constant decision
    has no drivers. `op` prints them and its JSON lists them; on B300 TP 8 at Kimi-K3's o_proj the
    switch round trip λ leads (docs/model.md §6b)."""
    import json

    import numpy as np

    from costmodel.analysis import band_drivers, band_edges
    from integration.cli import main

    a = np.arange(1.0, 101.0)
    cuts = np.where(a > 90, np.inf, 10.0 * a)  # follows a, never at its top tenth
    # ρ 0 with any monotone order of a by construction
    unrelated = np.tile([1.0, 2.0, 2.0, 1.0], 25)
    d = band_drivers({"a": a, "minus_a": -a, "flat": np.ones(100), "unrelated": unrelated}, cuts)
    assert d == (("a", 1.0), ("minus_a", -1.0))
    assert band_drivers({"a": a}, np.full(100, 7.0)) == ()
    assert band_edges(cuts, {"a": a}).drivers == (("a", 1.0),) and band_edges(cuts).drivers == ()
    argv = [
        "op",
        "--gpu",
        "b300",
        "--tp",
        "8",
        "--op",
        "gemm_ar",
        "--impl",
        "kernel",
        "--n",
        "7168",
        "--k",
        "1536",
    ]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["cutoff_band_drivers"]
    assert (
        out
        and out[0]["quantity"] == "fused_kernel.multicast_latency_s"
        and out[0]["rank_correlation"] > 0.3
    )
    assert all(abs(x["rank_correlation"]) >= 0.1 for x in out)
    assert main(argv) == 0
    assert "what moves the band" in capsys.readouterr().out
