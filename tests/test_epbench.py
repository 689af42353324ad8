"""The calibration job's EP phase (calib/epbench.py) on real torch.distributed (gloo, 2 processes):
torch's all_to_all_single at the step's sizes, the routed experts' grouped GEMMs, the network it
writes; the routing it draws against the model's expectation; the transport fit on synthetic
calls."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import need

from costmodel import formulas as F
from costmodel.moe import load_moe_model
from costmodel.network import TORCH_A2A, load_network, network_from_dict

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = str(ROOT / "calib" / "cpu-tiny-moe.json")


def test_route_draws_distinct_experts_inside_the_group_limit_and_balanced():
    from calib.epbench import route

    ex = route(20000, 16, 4, 4, 2, seed=1)
    assert ex.shape == (20000, 4)
    assert all(len(set(r)) == 4 for r in ex[:500])  # distinct experts per token
    assert max(len(set(r // 4)) for r in ex) <= 2  # at most topk_group of the n_group groups
    share = np.bincount(ex.ravel(), minlength=16) / ex.size
    # balanced: each expert k/E of the tokens
    assert share == pytest.approx(np.full(16, 1 / 16), abs=0.01)


def test_local_rows_match_the_models_expected_active_experts():
    """Rank 0's active experts over many draws: the balls-in-bins expectation the step prices
    (§11.1)."""
    from calib.epbench import local_rows

    sh = load_moe_model(FIXTURE)
    for ep, t in ((2, 1), (4, 2), (2, 8)):
        draws = [(local_rows(sh, ep, t, seed=s) > 0).sum() for s in range(400)]
        want = F.expected_active_experts(t * ep, sh.top_k, sh.num_experts, sh.num_experts // ep)
        assert np.mean(draws) == pytest.approx(float(want), rel=0.08)


def test_one_gpu_ep_benches_run_on_cpu():
    need("torch")
    from calib.epbench import bench_grouped_experts, bench_mla, holdout
    from calib.timing import Timer
    from costmodel.profile import load_profile

    sh = load_moe_model(FIXTURE)
    timer = Timer("cpu", warmup_s=0.0, rep_s=0.001, min_reps=3, max_reps=3)
    recs = list(bench_grouped_experts(timer, sh, 4, (1, 16), "cpu", "fp32"))
    recs += list(bench_mla(timer, sh, "cpu", decode=((2, 32),), prefill=(16,)))
    exp = [r for r in recs if r["kind"] == "grouped_experts"]
    assert [r["tokens_per_rank"] for r in exp] == [1, 16] and all(r["median_s"] > 0 for r in recs)
    assert all(r["impl"] == "torch.matmul per expert" and r["local_experts"] == 4 for r in exp)
    assert all(1 <= r["active_experts"] <= 4 and r["rows"] >= r["active_experts"] for r in exp)
    h = holdout(recs, load_profile("h200-sxm"), sh)
    assert set(h) == {"experts EP 4", "mla decode", "mla prefill"}
    assert all(np.isfinite(v["median_log_error"]) for v in h.values())


def _rec(T, t, ep=16, gpn=8, off=None, remote=None):
    return {
        "kind": "ep_all2all",
        "impl": TORCH_A2A,
        "quantity": "dispatch",
        "ep": ep,
        "gpus_per_node": gpn,
        "tokens_per_rank": T,
        "hidden": 7168,
        "top_k": 8,
        "num_experts": 256,
        "n_group": 8,
        "topk_group": 4,
        "dispatch_dtype": "fp8",
        "send_offnode_bytes": off,
        "send_remote_bytes": remote,
        "median_s": t,
    }


def test_network_fit_recovers_the_transport_terms_and_keeps_the_measured_calls():
    """t = latency + off-node bytes / (NICs · rate · η) on synthetic calls: the fit gives back η and
    the latency, marks them calibrated, keeps every call as [[measured]], and what it writes loads
    back."""
    from calib.epbench import network_from_run

    base = load_network("ib-cx7-400g")
    rate = base.line_rate_per_gpu_bytes_per_s
    recs = [
        _rec(T, 12e-6 + b / (rate * 0.62), off=b)
        for T, b in ((1, 3e4), (32, 9e5), (256, 7e6), (1024, 3e7))
    ]
    net, notes = network_from_run(base, recs, "h200-sxm", 450e9, "test run")
    assert notes == []
    assert net.rdma_efficiency == pytest.approx(0.62, rel=1e-5)
    assert net.rdma_latency_s == pytest.approx(12e-6, rel=1e-4)
    assert (
        net.tiers["rdma_efficiency"] == "calibrated"
        and "least squares" in net.sources["rdma_latency_s"]
    )
    # what torch's calls do not measure stays the prior
    assert net.ht_latency_s == base.ht_latency_s
    assert sum(m.backend == TORCH_A2A for m in net.measured) == 4
    import tomllib

    from costmodel.network import network_toml

    back = network_from_dict(tomllib.loads(network_toml(net)), "x")
    assert back.rdma_efficiency == pytest.approx(net.rdma_efficiency) and len(back.measured) == len(
        net.measured
    )
    # inside one node: NVLink's share; a fit outside its plausible range keeps the prior and says so
    one = [
        _rec(T, 4e-6 + b / (450e9 * 0.5), ep=8, gpn=8, remote=b)
        for T, b in ((1, 1e4), (128, 2e6), (1024, 2e7))
    ]
    net1, _ = network_from_run(base, one, "h200-sxm", 450e9, "t")
    assert (
        net1.nvl_efficiency == pytest.approx(0.5, rel=1e-5)
        and net1.rdma_efficiency == base.rdma_efficiency
    )
    fast = [_rec(T, b / (450e9 * 40), ep=8, gpn=8, remote=b) for T, b in ((1, 1e4), (128, 2e6))]
    net2, notes2 = network_from_run(base, fast, "h200-sxm", 450e9, "t")
    assert net2.nvl_efficiency == base.nvl_efficiency and "kept at the prior" in notes2[0]


def test_torch_measured_calls_time_no_backend_directly():
    """torch's calls are kept as measured but never rescale a vLLM backend's time
    (all2all.measured_times)."""
    import dataclasses

    from calib.epbench import network_from_run
    from costmodel.all2all import A2ACall, Links, predict

    base = load_network("ib-cx7-400g")
    recs = [_rec(T, 5e-3, off=b) for T, b in ((1, 3e4), (256, 7e6))]
    net, _ = network_from_run(base, recs, "h200-sxm", 450e9, "t")
    net = dataclasses.replace(
        net, rdma_efficiency=base.rdma_efficiency, rdma_latency_s=base.rdma_latency_s
    )
    call = A2ACall(
        tokens=np.array([1.0, 256.0]),
        hidden=7168,
        top_k=8,
        num_experts=256,
        n_group=8,
        topk_group=4,
        ep=16,
        gpus_per_node=8,
        dispatch_dtype="fp8",
    )
    for b in ("deepep_low_latency", "deepep_high_throughput"):
        a = predict(b, call, Links(450e9, base))
        m = predict(b, call, Links(450e9, net))
        assert (
            np.array_equal(a.t_dispatch_s, m.t_dispatch_s) and "+measured" not in m.bound_dispatch
        )


def test_cpu_loop_times_the_all_to_all_and_writes_the_network(tmp_path, capfd):
    """The calibration job's EP phases on gloo (2 ranks, one host): torch's all_to_all_single at the
    step's sizes, labelled, and the network beside the profile with those calls; a second run needs
    --force for it too."""
    need("torch")
    from integration.cli import main

    prof = tmp_path / "cpu.toml"
    args = [
        "calibrate",
        "--device",
        "cpu",
        "--nproc",
        "2",
        "--budget-s",
        "600",
        "--models",
        "cpu-tiny",
        FIXTURE,
        "--network",
        "ib-cx7-400g",
        "--out",
        str(prof),
    ]
    assert main(args) == 0
    out = capfd.readouterr().out
    recs = [json.loads(x) for x in prof.with_suffix(".samples.jsonl").read_text().splitlines()]
    a2a = [r for r in recs if r["kind"] == "ep_all2all"]
    assert {r["impl"] for r in a2a} == {TORCH_A2A}
    assert {(r["quantity"], r["tokens_per_rank"]) for r in a2a} == {
        (q, t) for q in ("dispatch", "combine") for t in (1, 8, 32, 128)
    }
    assert all(r["ep"] == 2 and r["median_s"] > 0 and r["dispatch_dtype"] == "bf16" for r in a2a)
    timed = {r["tokens_per_rank"] for r in recs if r["kind"] == "grouped_experts"}
    # at 1 token per rank rank 0's experts may receive none
    assert {8, 32, 128} <= timed <= {1, 8, 32, 128}
    net_file = prof.with_suffix(".network.toml")
    net = load_network(str(net_file))
    assert net.name == "ib-cx7-400g-measured"
    from costmodel.profile import load_profile

    gpu = load_profile(str(prof)).name
    assert sum(m.backend == TORCH_A2A and m.gpu == gpu for m in net.measured) == len(a2a)
    assert f"network: {net_file}" in out and "held out, cpu-tiny-moe experts EP 2" in out
    capfd.readouterr()
    prof.unlink()  # the profile is gone, its network side file is not: refused without --force
    assert main(args) == 2
    assert "--force" in capfd.readouterr().err


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--network", "no-such-net"], "unknown network"),
        (
            [
                "--from-deepep",
                "x.log",
                "--from",
                "ib-cx7-400g",
                "--gpu",
                "h200-sxm",
                "--network",
                "ib-cx7-400g",
            ],
            "--network: a benchmark run's flags",
        ),
    ],
)
def test_calibrate_network_bad_input(tmp_path, capsys, extra, needle):
    need("torch")
    from integration.cli import main

    rc = main(
        ["calibrate", "--device", "cpu", "--out", str(tmp_path / "p.toml"), *extra]
        if extra[0] == "--network"
        else ["calibrate", "--out", str(tmp_path / "p.toml"), *extra]
    )
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())
