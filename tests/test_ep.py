"""Expert parallelism: routing expectations against a Monte Carlo, the all-to-all's physics, the EP
step, the DBO timeline by hand, the fit's files, and the `ep` command's bad input (docs/model.md
§11-12)."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from costmodel import formulas as F
from costmodel.all2all import BACKENDS, A2ACall, Links, predict
from costmodel.ep_step import EPSetup, check_setup, dbo_step, dbo_threshold, step, timeline
from costmodel.errors import TpcostError
from costmodel.moe import load_moe_model, moe_shape_from_config, t_experts_s
from costmodel.network import builtin_network_names, load_network, network_from_dict
from costmodel.ops import Hw
from costmodel.profile import load_profile
from integration.cli import main

ROOT = Path(__file__).resolve().parent.parent
DSV3 = load_moe_model("deepseek-v3")


def _routing_mc(k, E, n_group, topk_group, bins, n=20000, seed=0):
    rng = np.random.default_rng(seed)
    g = E // n_group
    hits = 0.0
    for _ in range(n):
        groups = rng.choice(n_group, size=topk_group, replace=False)
        pool = (groups[:, None] * g + np.arange(g)[None, :]).ravel()
        experts = rng.choice(pool, size=k, replace=False)
        hits += len(np.unique(experts // (E // bins)))
    return hits / n


@pytest.mark.parametrize("bins", [8, 16, 24, 32, 48, 64, 256])
def test_bins_hit_matches_a_routing_monte_carlo(bins):
    if (
        256 % bins
        # EP 24 / 48 place E/EP experts unevenly in vLLM; DeepSeek-V3's 256 do not split: check the
        # refusal
    ):
        with pytest.raises(TpcostError):
            DSV3.check_ep(bins)
        # a model whose experts split 24 and 48 ways
        shape = dict(k=6, E=96 * 4, n_group=8, topk_group=4)
    else:
        shape = dict(k=8, E=256, n_group=8, topk_group=4)
    exact = F.expected_bins_hit(shape["k"], shape["E"], shape["n_group"], shape["topk_group"], bins)
    mc = _routing_mc(shape["k"], shape["E"], shape["n_group"], shape["topk_group"], bins)
    assert exact == pytest.approx(mc, rel=0.01)


def test_active_experts_is_balls_in_bins():
    # T tokens, each picks expert e with probability k/E: E_loc(1 - (1 - k/E)^T); the limits are 0
    # and E_loc
    assert F.expected_active_experts(0, 8, 256, 16) == 0
    assert F.expected_active_experts(1e6, 8, 256, 16) == pytest.approx(16)
    rng = np.random.default_rng(1)
    T, act = 40, []
    for _ in range(3000):
        chosen = np.concatenate([rng.choice(256, 8, replace=False) for _ in range(T)])
        act.append(len(np.unique(chosen[chosen < 16])))
    assert F.expected_active_experts(T, 8, 256, 16) == pytest.approx(np.mean(act), rel=0.02)


def _setup(gpu="h200-sxm", ep=16, be="deepep_low_latency", net="ib-cx7-400g", **kw):
    return EPSetup(
        prof=load_profile(gpu),
        shape=DSV3,
        ep=ep,
        gpus_per_node=min(ep, 8),
        backend=be,
        network=load_network(net),
        budget_tokens=256 if be == "deepep_low_latency" else 2048,
        **kw,
    )


def _call(ep=32, T=(1, 16, 128, 256, 1024), dtype="fp8"):
    E = 256 if 256 % ep == 0 else 384  # EP 24 / 48: a model whose experts split that way
    return A2ACall(
        tokens=np.array(T, dtype=float),
        hidden=7168,
        top_k=8,
        num_experts=E,
        n_group=8,
        topk_group=4,
        ep=ep,
        gpus_per_node=8,
        dispatch_dtype=dtype,
    )


@pytest.mark.parametrize(
    "be", ["deepep_low_latency", "deepep_high_throughput", "allgather_reducescatter"]
)
@pytest.mark.parametrize("ep", [16, 24, 48, 64])
def test_a2a_physics(be, ep):
    net = load_network("ib-cx7-400g")
    links = Links(450e9, net)
    x = predict(be, _call(ep), links)
    for t, rdma in ((x.t_dispatch_s, x.rdma_dispatch_bytes), (x.t_combine_s, x.rdma_combine_bytes)):
        assert np.all(np.isfinite(t)) and np.all(t > 0)
        assert np.all(np.diff(t) >= 0)  # never falls as tokens grow
        # no transfer beats line rate
        assert np.all(t >= np.asarray(rdma) / net.line_rate_per_gpu_bytes_per_s)
    faster = predict(
        be,
        _call(ep),
        Links(450e9, net.with_values(nic_line_rate_bytes_per_s=2 * net.nic_line_rate_bytes_per_s)),
    )
    assert np.all(faster.t_dispatch_s <= x.t_dispatch_s) and np.all(
        faster.t_combine_s <= x.t_combine_s
    )


def test_low_latency_sends_one_copy_per_expert_normal_one_per_node():
    links = Links(450e9, load_network("ib-cx7-400g"))
    ll = predict("deepep_low_latency", _call(64, T=(128,)), links)
    ht = predict("deepep_high_throughput", _call(64, T=(128,)), links)
    b = F.a2a_token_bytes(7168, "fp8")
    assert float(ll.rdma_dispatch_bytes[0]) == pytest.approx(128 * 8 * (64 - 8) / 64 * b)
    nodes_hit = F.expected_bins_hit(8, 256, 8, 4, 8)
    assert float(ht.rdma_dispatch_bytes[0]) == pytest.approx(128 * nodes_hit * 7 / 8 * b)
    assert nodes_hit <= 4  # node-limited routing: at most topk_group nodes


def test_unpriced_backends_are_refused_in_one_line():
    for name, b in BACKENDS.items():
        if b.predict is None:
            with pytest.raises(TpcostError, match=name):
                predict(name, _call(), Links(450e9, load_network("ib-cx7-400g")))


def test_step_is_finite_monotone_and_a_faster_nic_never_slows_it():
    T = np.array([1, 4, 32, 128, 256, 600, 2048], dtype=float)
    for be in ("deepep_low_latency", "deepep_high_throughput", "allgather_reducescatter"):
        s = _setup(be=be)
        t = step(s, T).t_step_s
        assert np.all(np.isfinite(t)) and np.all(t > 0) and np.all(np.diff(t) >= 0)
        fast = dataclasses.replace(s, network=s.network.with_values(nic_line_rate_bytes_per_s=1e11))
        assert np.all(step(fast, T).t_step_s <= t + 1e-15)
        if BACKENDS[be].microbatches:
            assert np.all(dbo_step(fast, T[1:]).t_step_s <= dbo_step(s, T[1:]).t_step_s + 1e-15)


def test_experts_read_the_active_experts_weights_at_decode():
    hw = Hw(load_profile("h200-sxm"), "fp8")
    t, active = t_experts_s(hw, DSV3, np.array([16.0]), 16)
    weights = float(active[0]) * 3 * 7168 * 2048
    assert float(t[0]) >= weights / hw.hbm_bw_bytes_per_s
    whole, _ = t_experts_s(hw, DSV3, np.array([4096.0]), 16)
    half, _ = t_experts_s(hw, DSV3, np.array([2048.0]), 16)
    # a microbatched grouped GEMM is never cheaper than the whole
    assert 2 * float(half[0]) >= float(whole[0])


def test_memory_check_refuses_h100_at_ep8_and_fits_h200():
    with pytest.raises(TpcostError, match="does not fit"):
        check_setup(_setup(gpu="h100-sxm", ep=8))
    check_setup(_setup(gpu="h200-sxm", ep=8))
    check_setup(_setup(gpu="b200", ep=8))


def test_timeline_by_hand():
    # one dense layer and one MoE layer, two microbatches: the schedule written out step by step
    pre, disp, exp, comb, dense = [2.0, 3.0], [4.0, 1.0], [5.0, 2.0], [1.0, 6.0], [1.0, 1.0]
    end, comp, comm = timeline(pre, disp, exp, comb, dense, 1, 1)
    # compute: dense a 0-1, dense b 1-2, pre a 2-4, pre b 4-7; comm: disp a 4-8, disp b 8-9
    # experts a waits disp a: 8-13; experts b 13-15; combine a 13-14; combine b 15-21
    assert (float(end), float(comp), float(comm)) == (21.0, 15.0, 21.0)


def test_dbo_without_comm_costs_exactly_the_doubled_compute():
    s = _setup()
    T = np.array([8.0, 64.0, 256.0, 1000.0])
    d = dbo_step(s, T, zero_comm=True)
    st = step(s, T)
    no_comm = st.t_gpu_s - st.t_exposed_comm_s
    half = (np.floor(T / 2), T - np.floor(T / 2))
    halves = sum(
        step(s, h).t_gpu_s - step(s, h).t_exposed_comm_s - step(s, h).t_lm_head_s for h in half
    )
    assert np.allclose(d.t_gpu_s - no_comm, halves - (no_comm - st.t_lm_head_s))
    assert np.all(d.t_doubled_s >= 0)


@pytest.mark.parametrize("be", ["deepep_low_latency", "deepep_high_throughput"])
def test_dbo_never_beats_its_bounds(be):
    s = _setup(be=be)
    T = np.array([2.0, 32.0, 256.0, 2048.0])
    d = dbo_step(s, T)
    comp, comm = d.t_compute_s[0] + d.t_compute_s[1], d.t_comm_s[0] + d.t_comm_s[1]
    assert np.all(d.t_gpu_s >= np.maximum(comp, comm) - 1e-12)
    off = step(s, T)
    ratio = off.t_gpu_s / d.t_gpu_s
    bound = (comp + comm) / np.maximum(comp, comm)
    assert np.all(ratio <= bound + 1e-9)


def test_dbo_threshold_is_the_least_expected_time():
    s = _setup()
    th = dbo_threshold(s, 256, 0.02)
    T = np.arange(1, 257, dtype=float)
    off = step(s, T).t_step_s
    on = np.where(T >= 2, dbo_step(s, np.maximum(T, 2)).t_step_s, np.inf)
    costs = [np.sum(np.where(T >= th_, on * 1.02, off)) for th_ in range(2, 258)]
    best = int(np.argmin(costs)) + 2
    assert th.threshold_tokens == (best if best <= 256 else None)


def test_fit_files_match_the_fit():
    fit = json.loads((ROOT / "calib" / "data" / "ep_fit.json").read_text())
    for name, vals in fit["networks"].items():
        net = load_network(name)
        for k, v in vals.items():
            assert getattr(net, k) == pytest.approx(v, rel=1e-3), (name, k)
    assert {"AWSLABS_EP_B200", "DEEPEP_V1_README"} <= set(fit["leave_one_source_out"])
    assert set(builtin_network_names()) >= {"ib-cx7-400g", "efa-p5", "efa-p6-b200", "roce-200g"}


def test_mla_config_reads_and_bad_configs_are_one_line():
    assert DSV3.mla and DSV3.first_dense == 3 and DSV3.weight_bytes == 1
    cfg = json.loads((ROOT / "costmodel" / "models" / "deepseek-v3.json").read_text())
    for k, v in (
        ("n_routed_experts", 0),
        ("num_experts_per_tok", 300),
        ("topk_group", 9),
        ("kv_lora_rank", "x"),
        ("first_k_dense_replace", 61),
        ("quantization_config", 3),
        ("n_group", 7),
    ):
        with pytest.raises(TpcostError):
            moe_shape_from_config({**cfg, k: v}, "bad")
    with pytest.raises(TpcostError):
        moe_shape_from_config([], "bad")


def test_network_file_bad_input(tmp_path):
    good = (ROOT / "costmodel" / "networks" / "roce-200g.toml").read_text()
    assert load_network("roce-200g").transport == "roce"
    cases = {
        "transport.toml": good.replace('transport = "roce"', 'transport = "pigeon"'),
        "str.toml": good.replace("value = 25000000000.0", 'value = "25e9"', 1),
        "range.toml": good.replace("value = 25000000000.0", "value = 25.0", 1),
        "extra.toml": good + "\nspeed = 3\n",
        "broken.toml": good + "[[[",
    }
    for name, text in cases.items():
        p = tmp_path / name
        p.write_text(text)
        with pytest.raises(TpcostError):
            load_network(str(p))
    with pytest.raises(TpcostError):
        load_network("no-such-net")
    with pytest.raises(TpcostError):
        network_from_dict([], "x")


EP = ["ep", "--enable-expert-parallel"]


def test_ep_json_names_each_term(capsys):
    assert (
        main(
            [
                *EP,
                "--all2all-backend",
                "deepep_low_latency",
                "--data-parallel-size",
                "32",
                "--dbo",
                "--json",
                "--tokens",
                "1",
                "64",
                "512",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    r = out["rows"][1]
    for k in (
        "t_dispatch_s",
        "t_combine_s",
        "t_experts_s",
        "t_attention_s",
        "t_dense_s",
        "t_step_s",
    ):
        assert r[k] > 0
    d = out["dbo"]
    assert set(d) >= {
        "enable",
        "decode_token_threshold",
        "prefill_token_threshold",
        "saving_s",
        "band",
        "why",
    }
    assert out["setup"]["nodes"] == 4


@pytest.mark.parametrize(
    "gpu,ep", [("h100-sxm", 16), ("h200-sxm", 32), ("b200", 64), ("h200-sxm", 8), ("b200", 8)]
)
@pytest.mark.parametrize(
    "be", ["deepep_low_latency", "deepep_high_throughput", "allgather_reducescatter"]
)
def test_done_when_grid_answers(gpu, ep, be, capsys):
    assert (
        main(
            [
                *EP,
                "--gpu",
                gpu,
                "--data-parallel-size",
                str(ep),
                "--all2all-backend",
                be,
                "--json",
                "--tokens",
                "1",
                "256",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert all(np.isfinite(r["t_step_s"]) for r in rows)


def test_whatif_with_expert_parallel_is_the_ep_step(capsys):
    assert (
        main(
            [
                "whatif",
                "--model",
                "deepseek-v3",
                "--gpu",
                "b200",
                "--enable-expert-parallel",
                "--data-parallel-size",
                "16",
                "--json",
                "--tokens",
                "32",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["setup"]["ep"] == 16


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["ep"], "--enable-expert-parallel"),
        ([*EP, "--gpu", "h100-sxm", "--data-parallel-size", "8"], "does not fit"),
        ([*EP, "--data-parallel-size", "12"], "not a multiple"),
        ([*EP, "--data-parallel-size", "1"], ">= 2"),
        ([*EP, "--nnodes", "3"], "--nnodes"),
        ([*EP, "--data-parallel-size-local", "16"], "NVLink domain"),
        ([*EP, "--all2all-backend", "mori"], "not priced"),
        ([*EP, "--all2all-backend", "bogus"], "invalid choice"),
        ([*EP, "--network", "nope"], "unknown network"),
        ([*EP, "--model", "llama-3.1-70b"], "not an MoE"),
        ([*EP, "--imbalance", "0.5"], "--imbalance"),
        ([*EP, "--tokens", "0"], "--tokens"),
        ([*EP, "--a2a", "--dbo"], "--a2a"),
        ([*EP, "--dbo-comm-sms", "132", "--all2all-backend", "deepep_high_throughput"], "no SM"),
        ([*EP, "--at", "1"], "--at"),
        ([*EP, "--at", "4096"], "above the token budget"),
        ([*EP, "--at", "64", "--tokens", "8"], "drop --tokens"),
        (
            [*EP, "--a2a", "--seq-len", "99", "--margin", "0.2"],
            "--seq-len 99; --margin 0.2: no effect",
        ),
        ([*EP, "--seq-len", "4096"], "--seq-len 4096: no effect"),
        ([*EP, "--phase", "prefill", "--context-len", "8192"], "--context-len 8192: no effect"),
        ([*EP, "--data-parallel-size", "8", "--network", "efa-p5"], "--network efa-p5: no effect"),
        ([*EP, "--dbo-comm-sms", "40"], "--dbo-comm-sms 40: no effect"),
    ],
)
def test_ep_bad_input_is_one_line(argv, msg, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and msg in err, err


def test_dbo_refused_backend_says_why(capsys):
    assert main([*EP, "--dbo", "--json", "--tokens", "8"]) == 0
    d = json.loads(capsys.readouterr().out)["dbo"]
    assert d["enable"] is False and "deepep_low_latency" in d["why"]


@pytest.mark.parametrize(
    "flag,value,extra",
    [
        ("--seq-len", "8192", ["--phase", "prefill"]),
        ("--context-len", "8192", []),
        ("--network", "efa-p5", ["--all2all-backend", "deepep_low_latency"]),
        ("--imbalance", "2", []),
        (
            "--max-num-batched-tokens",
            "512",
            ["--all2all-backend", "deepep_low_latency", "--tokens", "1024"],
        ),
        ("--dbo-comm-sms", "40", ["--all2all-backend", "deepep_high_throughput"]),
        ("--margin", "0.3", ["--all2all-backend", "deepep_low_latency", "--dbo"]),
    ],
)
def test_ep_checked_flags_take_effect_where_accepted(flag, value, extra, capsys):
    """Each flag the inertness check guards changes the answer where it is accepted."""
    base = [*EP, *extra, "--json"]
    assert main(base) == 0
    a = json.loads(capsys.readouterr().out)
    assert main([*base, flag, value]) == 0
    b = json.loads(capsys.readouterr().out)
    a.pop("setup"), b.pop("setup")
    assert a != b


def test_dbo_thresholds_benchmark_is_current():
    """benchmarks/results/dbo_thresholds.json (rendered into docs/vllm-thresholds.md) is what
    benchmarks/dbo_thresholds.py computes now."""
    from benchmarks import dbo_thresholds as DT

    committed = json.loads((ROOT / "benchmarks" / "results" / "dbo_thresholds.json").read_text())
    cells = {(c["gpu"], c["ep"], c["all2all_backend"]): c for c in committed["cells"]}
    assert set(cells) == {(g, ep, b) for g in DT.GPUS for ep in DT.EPS for b in DT.BACKENDS}
    for key in (
        ("h200-sxm", 8, "deepep_low_latency"),
        ("b200", 32, "deepep_low_latency"),
        ("h100-sxm", 8, "deepep_high_throughput"),
    ):
        # the whole grid takes minutes
        assert json.loads(json.dumps(DT.cell(*key))) == cells[key], key


def test_the_registry_holds_every_backend_of_the_release_record():
    """One registry entry per --all2all-backend the current release lists, aliases as the record
    rewrites them, and the DBO and batched-DP flags read from the record."""
    from costmodel.vllm_tables import ep_rules

    ep = ep_rules()
    assert set(BACKENDS) == set(ep.all2all_backends)
    for name, b in BACKENDS.items():
        assert b.alias_of == ep.aliases.get(name, ""), name
        assert b.microbatches == (name in ep.dbo_backends) and b.batched_dp == (
            name in ep.batched_dp_backends
        )


V034 = ["vllm-config", "--vllm-version", "0.34", "--gpu", "h200-sxm", "--model", "deepseek-v3"]


def test_vllm_config_emits_dbo_for_dp_ep(capsys):
    """vllm-config on an MoE model under DP+EP: the arguments, the report's dbo key, and the value
    for --compilation-config left empty (DBO is set by arguments)."""
    setup = [
        *V034,
        "--enable-expert-parallel",
        "--data-parallel-size",
        "16",
        "--all2all-backend",
        "deepep_low_latency",
    ]
    assert main([*setup, "--format", "args"]) == 0
    out, err = capsys.readouterr()
    args = out.split()
    assert args[0] == "--enable-dbo" and "pays" in err
    assert main([*setup, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    d = rep["dbo"]
    assert d["vllm_args"] == args and rep["compilation_config"] == {}
    assert rep["parallel_config"] == {
        "enable_dbo": True,
        "dbo_decode_token_threshold": d["decode_token_threshold"],
        "dbo_prefill_token_threshold": d["prefill_token_threshold"],
    }
    assert {
        "enable",
        "decode_token_threshold",
        "prefill_token_threshold",
        "saving_s",
        "band",
        "why",
    } <= set(d)
    assert main([*setup, "--format", "python"]) == 0
    assert (
        capsys.readouterr().out.strip().startswith("enable_dbo=True, dbo_decode_token_threshold=")
    )


def test_vllm_config_single_node_says_dbo_stays_off_and_by_how_much(capsys):
    assert (
        main(
            [
                *V034,
                "--enable-expert-parallel",
                "--data-parallel-size",
                "8",
                "--all2all-backend",
                "deepep_low_latency",
                "--format",
                "args",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert out.strip() == "" and "keep it off" in err and "ms per step (+" in err


@pytest.mark.parametrize(
    "extra,msg",
    [
        (["--data-parallel-size", "1"], "no microbatch runner"),
        (["--data-parallel-size", "16", "--pipeline-parallel-size", "2"], "pipeline parallelism"),
        (
            ["--data-parallel-size", "16", "--tp", "8", "--workload", "x.csv"],
            "--tp, --workload: not read",
        ),
        (["--data-parallel-size", "16", "--format", "env"], "--format args"),
        (["--data-parallel-size", "16", "--all2all-backend", "mori"], "not priced"),
        (["--data-parallel-size", "16", "--network", "nope"], "unknown network"),
        (["--data-parallel-size", "16", "--data-parallel-size-local", "16"], "NVLink domain"),
    ],
)
def test_vllm_config_dbo_bad_input_is_one_line(extra, msg, capsys):
    assert main([*V034, "--enable-expert-parallel", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and msg in err, err


def test_vllm_config_dbo_refusals_outside_the_path(capsys):
    assert main([*V034, "--data-parallel-size", "16"]) == 2
    assert "add --enable-expert-parallel" in capsys.readouterr().err
    assert (
        main(
            [
                "vllm-config",
                "--vllm-version",
                "0.31",
                "--gpu",
                "h200-sxm",
                "--model",
                "deepseek-v3",
                "--enable-expert-parallel",
                "--data-parallel-size",
                "16",
            ]
        )
        == 2
    )
    assert "0.34 only" in capsys.readouterr().err
    assert main(["vllm-config", "--gpu", "h200-sxm", "--network", "efa-p5"]) == 2
    assert "--network" in capsys.readouterr().err


def _dbo_inputs(**kw):
    cfg = json.loads((ROOT / "costmodel" / "models" / "deepseek-v3.json").read_text())
    base = {
        "hf_text_config": cfg,
        "model": "deepseek-ai/DeepSeek-V3",
        "tp": 1,
        "dp": 16,
        "dp_local": 8,
        "expert_parallel": True,
        "backend": "deepep_low_latency",
        "max_tokens": 256,
        "unset": ["decode", "prefill"],
        "network": None,
        "vllm_version": [0, 34],
    }
    return {**base, **kw}


def test_plugin_dbo_plan_sets_what_was_left_unset(monkeypatch, capsys):
    """The plugin's DBO plan sets each threshold left at vLLM's default to what `tpcost ep --dbo`
    decides for the same setup, and says vLLM's, tpcost's and the saving; a threshold the user set
    is not in the plan."""
    from integration.vllm_plugin import _dbo_plan

    monkeypatch.setenv("TPCOST_PROFILE", "h200-sxm")
    plan = _dbo_plan(_dbo_inputs())
    assert (
        main([*EP, "--all2all-backend", "deepep_low_latency", "--dbo", "--json", "--tokens", "1"])
        == 0
    )
    d = json.loads(capsys.readouterr().out)["dbo"]
    assert dict(plan["set"]) == {
        "dbo_decode_token_threshold": d["decode_token_threshold"],
        "dbo_prefill_token_threshold": d["prefill_token_threshold"],
    }
    assert len(plan["said"]) == 2 and all(
        "vLLM's default" in s and "saves" in s for s in plan["said"]
    )
    only = _dbo_plan(_dbo_inputs(unset=["prefill"]))
    assert [a for a, _ in only["set"]] == ["dbo_prefill_token_threshold"]
    # one node: DBO never pays, the thresholds go above the budget
    off = _dbo_plan(_dbo_inputs(dp=8, dp_local=8))
    assert all(v == 257 for _, v in off["set"]) and all("never pays" in s for s in off["said"])
    with pytest.raises(TpcostError, match="TP 1"):
        _dbo_plan(_dbo_inputs(tp=2))


def test_plugin_dbo_leaves_vllm_alone_where_it_should(monkeypatch, caplog):
    """DBO off: nothing; a release tpcost has no EP rules for: one info line, thresholds untouched;
    a bad TPCOST_NETWORK: one warning, vLLM's thresholds stand."""
    import logging
    from types import SimpleNamespace

    from integration import vllm_plugin as P

    cfg = json.loads((ROOT / "costmodel" / "models" / "deepseek-v3.json").read_text())

    def vcfg(enable):
        par = SimpleNamespace(
            enable_dbo=enable,
            dbo_decode_token_threshold=32,
            dbo_prefill_token_threshold=512,
            tensor_parallel_size=1,
            data_parallel_size=16,
            data_parallel_size_local=8,
            enable_expert_parallel=True,
            all2all_backend="deepep_low_latency",
        )
        mc = SimpleNamespace(
            hf_text_config=SimpleNamespace(to_dict=lambda: cfg), model="deepseek-ai/DeepSeek-V3"
        )
        return SimpleNamespace(
            parallel_config=par,
            model_config=mc,
            scheduler_config=SimpleNamespace(max_num_batched_tokens=256),
        )

    monkeypatch.setenv("TPCOST_PROFILE", "h200-sxm")
    monkeypatch.setenv("TPCOST_CACHE", "0")
    c = vcfg(False)
    P._apply_dbo(c, has_sp=False)
    assert c.parallel_config.dbo_decode_token_threshold == 32
    for version, has_sp in (((0, 34), False), ((0, 31), True)):
        monkeypatch.setattr(P, "_vllm_version", lambda has_sp, v=version: list(v))
        c = vcfg(True)
        with caplog.at_level(logging.INFO, logger="vllm.tpcost"):
            P._apply_dbo(c, has_sp=has_sp)
        moved = c.parallel_config.dbo_decode_token_threshold != 32
        assert moved == (version == (0, 34)), caplog.text
    monkeypatch.setattr(P, "_vllm_version", lambda has_sp: [0, 34])
    monkeypatch.setenv("TPCOST_NETWORK", "no-such-network")
    c = vcfg(True)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vllm.tpcost"):
        P._apply_dbo(c, has_sp=False)
    assert c.parallel_config.dbo_decode_token_threshold == 32 and "unknown network" in caplog.text


def test_dbo_band_draws_only_what_the_step_reads():
    """The DBO band is reproducible (fixed seed), and a number the backend never reads (the
    high-throughput fixed cost under the low-latency backend, a collective of the TP path) can
    neither be drawn nor drive it."""
    from costmodel.ep_step import dbo_band

    s = _setup(ep=16, be="deepep_low_latency")
    a, b = dbo_band(s, 64, 0.02, draws=24), dbo_band(s, 64, 0.02, draws=24)
    assert tuple(a) == tuple(b) and a.drivers == b.drivers
    assert all(not k.startswith(("network.ht_", "collectives.")) for k, _ in a.drivers)


def test_tp_beyond_one_domain_gets_one_line(capsys):
    """vllm-config --tp 16 on 8-GPU nodes: one line says what cannot run across nodes and what
    tpcost prices there."""
    assert main(["vllm-config", "--gpu", "h100-sxm", "--tp", "16", "--vllm-version", "0.34"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"pass_config": {}}
    (line,) = [ln for ln in err.splitlines() if "spans 2 NVLink domains" in ln]
    assert "nothing fused is set" in line and "tpcost ep" in line


def test_dbo_decides_on_the_workload_per_phase(tmp_path, capsys):
    """A workload with a phase column decides each threshold on its own rows: traffic at 250 tokens
    only makes DBO pay there, traffic at 4 tokens only never reaches it; the traffic is named in the
    report."""
    w = tmp_path / "w.csv"
    w.write_text("num_tokens,count,phase\n250,10,decode\n4,10,mixed\n")
    base = [*EP, "--all2all-backend", "deepep_low_latency", "--dbo", "--json", "--tokens", "8"]
    assert main(base) == 0
    uni = json.loads(capsys.readouterr().out)["dbo"]
    assert main([*base, "--workload", str(w)]) == 0
    d = json.loads(capsys.readouterr().out)["dbo"]
    assert "decode rows" in d["traffic"]["decode"] and "mixed rows" in d["traffic"]["prefill"]
    dec, pre = d["phases"]["decode"], d["phases"]["prefill"]
    assert (
        dec["threshold_tokens"] is not None
        and dec["threshold_tokens"] <= 250
        and dec["saving_s"] > 0
    )
    assert (
        pre["saving_s"] == pytest.approx(0.0, abs=1e-12)
        and uni["phases"]["prefill"]["saving_s"] > 0
    )


@pytest.mark.parametrize(
    "text,argv,msg",
    [
        (
            "num_tokens,count,phase\n8,1,prefill\n",
            ["ep", "--enable-expert-parallel", "--dbo"],
            "not one of decode, mixed",
        ),
        (
            "num_tokens,count,phase\n8,1,decode\n",
            ["ep", "--enable-expert-parallel"],
            "read only by --dbo",
        ),
        (
            "num_tokens,count,phase\n8,1,decode\n",
            ["whatif", "--no-band"],
            "phase column is read only by tpcost ep",
        ),
        (
            "num_tokens,count,phase\n8,1,decode\n",
            [
                "op",
                "--tp",
                "8",
                "--op",
                "gemm_rs",
                "--impl",
                "torch",
                "--n",
                "8192",
                "--k",
                "3584",
                "--vllm-version",
                "0.31",
            ],
            "phase column",
        ),
    ],
)
def test_phase_column_bad_input(tmp_path, capsys, text, argv, msg):
    w = tmp_path / "w.csv"
    w.write_text(text)
    assert main([*argv, "--workload", str(w)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and msg in err, err


def test_ep_plot_and_its_refusals(tmp_path, capsys):
    """--plot with --dbo writes the DBO off/on curve; without --dbo, for a backend that cannot
    microbatch, with an empty name or over an existing file: one line each, nothing written (issue
    59 item 5, issue 61)."""
    pytest.importorskip("matplotlib")
    png = tmp_path / "dbo.png"
    base = [*EP, "--all2all-backend", "deepep_low_latency", "--tokens", "8"]
    assert main([*base, "--dbo", "--plot", str(png)]) == 0 and png.stat().st_size > 1000
    capsys.readouterr()
    for argv, msg in (
        ([*base, "--plot", str(tmp_path / "a.png")], "give --dbo too"),
        ([*EP, "--tokens", "8", "--dbo", "--plot", str(tmp_path / "b.png")], "cannot microbatch"),
        ([*base, "--dbo", "--plot", ""], "give a file name"),
        ([*base, "--dbo", "--plot", str(png)], "--force"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and msg in err, err
    assert not (tmp_path / "a.png").exists() and not (tmp_path / "b.png").exists()
    assert (
        main(["whatif", "--no-band", "--plot", ""]) == 2
        and "give a file name" in capsys.readouterr().err
    )


def test_speculative_decoding_raises_the_emitted_thresholds(capsys):
    """vLLM 0.34 raises both DBO thresholds to ubatches x (1 + K) under speculative decoding: what
    tpcost emits is what vLLM then runs, and says so."""
    base = [
        *EP,
        "--gpu",
        "b200",
        "--data-parallel-size",
        "64",
        "--all2all-backend",
        "deepep_low_latency",
        "--dbo",
        "--json",
        "--tokens",
        "8",
    ]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out)["dbo"]
    assert main([*base, "--num-speculative-tokens", "15"]) == 0
    d = json.loads(capsys.readouterr().out)["dbo"]
    assert min(plain["decode_token_threshold"], plain["prefill_token_threshold"]) < 32
    assert (
        d["decode_token_threshold"] >= 32
        and d["prefill_token_threshold"] >= 32
        and "raises" in d["why"]
    )
    assert main(["vllm-config", "--gpu", "h100-sxm", "--num-speculative-tokens", "2"]) == 2
    assert "read only for dual-batch overlap" in capsys.readouterr().err


@pytest.mark.parametrize(
    "be,phase,n",
    [("deepep_low_latency", "decode", 128), ("deepep_high_throughput", "prefill", 2048)],
)
def test_ops_add_up_to_the_step_and_none_beats_its_roofline(be, phase, n, capsys):
    """ep --ops: the ops times their counts are the step's GPU time exactly, and no compute op runs
    above the GPU's peak FLOP/s or its HBM rate (issue 58 item 5)."""
    from costmodel.ops import Hw

    # decode is the default: giving it is refused as inert
    ph = ["--phase", phase] if phase != "decode" else []
    assert main([*EP, "--all2all-backend", be, *ph, "--ops", str(n), "--json"]) == 0
    ops = json.loads(capsys.readouterr().out)["ops"]["ops"]
    s = _setup(ep=16, be=be, decode=phase == "decode")
    st = step(s, np.array([float(n)]))
    assert sum(o["count_per_step"] * o["t_s"] for o in ops) == pytest.approx(
        float(st.t_gpu_s[0]), rel=1e-9
    )
    hw = Hw(s.prof, s.dtype)
    for o in ops:
        assert (
            o["bound"] in ("compute", "memory")
            or o["formula"] == "all2all.predict"
            or o["bound"] == "overlap"
        ), o
        if o["flops"]:
            assert o["achieved_tflops"] * 1e12 <= float(hw._peak_flops(True)) * (1 + 1e-9), o
            assert o["achieved_gbps"] * 1e9 <= float(hw.hbm_bw_bytes_per_s) * (1 + 1e-9), o
    assert (
        main([*EP, "--ops", "64", "--dbo"]) == 2
        and "--ops lists one step" in capsys.readouterr().err
    )


@pytest.mark.parametrize("spread", [1.5, 2.0, 4.0])
def test_dbo_threshold_votes_on_the_smallest_rank_and_prices_the_largest(spread):
    """The DP vote (issue 59): vLLM compares its threshold with the smallest DP rank's tokens and
    every rank runs the largest's. Brute force over every threshold, each step priced at ceil(spread
    x smallest), gives tpcost's value; a wider spread never raises the threshold (a step is never
    smaller than its vote)."""
    s = _setup(dp_token_spread=spread)
    th = dbo_threshold(s, 256, 0.02)
    T = np.arange(1, 257, dtype=float)
    big = np.minimum(np.ceil(spread * T - 1e-9), 256)
    off = step(s, big).t_step_s
    on = np.where(T >= 2, dbo_step(s, np.maximum(big, 2)).t_step_s, np.inf)
    costs = [np.sum(np.where(T >= t, on * 1.02, off)) for t in range(2, 258)]
    best = int(np.argmin(costs)) + 2
    assert th.threshold_tokens == (best if best <= 256 else None)
    alike = dbo_threshold(_setup(), 256, 0.02).threshold_tokens
    assert th.threshold_tokens is not None and alike is not None and th.threshold_tokens <= alike


def test_dp_token_spread_flag_reaches_ep_and_vllm_config_alike(capsys):
    setup = [
        "--enable-expert-parallel",
        "--data-parallel-size",
        "16",
        "--all2all-backend",
        "deepep_low_latency",
    ]
    assert main(["ep", *setup, "--dbo", "--json", "--dp-token-spread", "2"]) == 0
    d = json.loads(capsys.readouterr().out)["dbo"]
    assert d["dp_token_spread"] == 2.0 and "2 x its smallest" in d["assumes"]
    assert main([*V034, *setup, "--dp-token-spread", "2", "--format", "args"]) == 0
    assert capsys.readouterr().out.split() == d["vllm_args"]
    assert main([*V034, *setup, "--format", "args"]) == 0
    assert capsys.readouterr().out.split() != d["vllm_args"]  # it takes effect


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--dbo", "--dp-token-spread", "0.5"], "--dp-token-spread must be"),
        (["--dbo", "--dp-token-spread", "inf"], "--dp-token-spread must be"),
        (["--dbo", "--dp-token-spread", "x"], "not a number"),
        (["--dp-token-spread", "2"], "no effect on this query"),  # without --dbo no vote is priced
    ],
)
def test_dp_token_spread_bad_input(argv, needle, one_line_error):
    one_line_error(
        "ep",
        "--enable-expert-parallel",
        "--data-parallel-size",
        "16",
        "--all2all-backend",
        "deepep_low_latency",
        *argv,
        needle=needle,
    )


def test_shared_experts_run_beside_an_async_backends_combine():
    """vLLM 0.34's modular kernel runs the shared experts after finalize_async, before the receive
    (EP.shared_overlap_cite): with DeepEP the layer pays max(combine, shared beside it), the
    high-throughput combine leaving the shared experts its SMs but comm_sms; the NCCL path pays
    both, one after the other."""
    from costmodel.ep_step import block, moe_layer_s

    T = np.array([16.0, 256.0, 2048.0])
    for be, beside in (
        ("deepep_low_latency", True),
        ("deepep_high_throughput", True),
        ("allgather_reducescatter", False),
    ):
        s = _setup(be=be)
        b = block(s, T)
        # no aux stream
        got = moe_layer_s(s, b, T, 0) - (b.t_router_s + b.t_dispatch_s + b.t_experts_s)
        if beside:
            assert np.allclose(got, np.maximum(b.t_combine_s, b.t_shared_beside_s), rtol=1e-12)
            assert np.all(got < b.t_combine_s + b.t_shared_s)
            # the threshold: no effect
            assert np.array_equal(moe_layer_s(s, b, T, 4096), moe_layer_s(s, b, T, 0))
        else:
            assert np.allclose(got, b.t_combine_s + b.t_shared_s, rtol=1e-12)
        if be == "deepep_high_throughput":
            # on 132 - 20 SMs: slower where compute-bound, the same where the weights' HBM reads
            # bound it
            assert (
                np.all(b.t_shared_beside_s >= b.t_shared_s)
                and b.t_shared_beside_s[-1] > b.t_shared_s[-1]
            )
        else:
            assert np.array_equal(b.t_shared_beside_s, b.t_shared_s)


def test_timeline_with_the_shared_experts_beside_the_combine_by_hand():
    # one MoE layer: compute pre a 0-2, pre b 2-5; comm disp a 2-6, disp b 6-7; experts a 6-11, post
    # a 11-13, experts b 13-15, post b 15-18; combine a 11-12 (it waits for experts a, not post a),
    # combine b 15-21
    end, comp, comm = timeline(
        [2.0, 3.0], [4.0, 1.0], [5.0, 2.0], [1.0, 6.0], [0.0, 0.0], 0, 1, [2.0, 3.0]
    )
    assert (float(end), float(comp), float(comm)) == (21.0, 18.0, 21.0)
    # a post that outlasts the last combine sets the end
    end, comp, _ = timeline(
        [2.0, 3.0], [4.0, 1.0], [5.0, 2.0], [1.0, 1.0], [0.0, 0.0], 0, 1, [2.0, 9.0]
    )
    assert (float(end), float(comp)) == (24.0, 24.0)


def test_the_dp_vote_sends_a_lopsided_microbatched_step_eager():
    """vLLM's DP vote runs a microbatched step without its graph when the largest rank holds more
    than twice the smallest (EP.dp_vote_eager_cite): the host issue time comes back to a low-latency
    decode step there, and only there."""
    # a host that binds when eager
    slow = load_profile("h200-sxm").with_values({"asynctp.host_op_s": 2e-4})
    T = np.array([16.0, 64.0])
    s = dataclasses.replace(_setup(), prof=slow)
    graph, eager = dbo_step(s, T), dbo_step(s, T, eager=True)
    assert (
        np.all(graph.t_host_s == 0)
        and np.all(eager.t_host_s > 0)
        and np.all(eager.t_step_s >= eager.t_host_s)
    )
    # never past 2x: graphs stay
    near = dbo_threshold(dataclasses.replace(s, dp_token_spread=1.9), 256, 0.02)
    fast = dbo_threshold(dataclasses.replace(_setup(), dp_token_spread=1.9), 256, 0.02)
    assert near.threshold_tokens == fast.threshold_tokens
    far = dbo_threshold(dataclasses.replace(s, dp_token_spread=3.0), 256, 0.02)
    far_fast = dbo_threshold(dataclasses.replace(_setup(), dp_token_spread=3.0), 256, 0.02)
    assert far.saving_s < far_fast.saving_s  # the eager microbatched steps pay the slow host


def test_aux_stream_formula_by_hand():
    # main 10, shared 3 inside a window of 5: 10 + 0 + 0.2·3 + 0.5 ; shared 8 over the window: 10 +
    # 3 + 0.2·5 + 0.5
    assert F.t_aux_stream_s(10.0, 3.0, 5.0, 0.2, 0.5) == pytest.approx(11.1)
    assert F.t_aux_stream_s(10.0, 8.0, 5.0, 0.2, 0.5) == pytest.approx(14.5)


def test_the_aux_stream_runs_the_shared_experts_at_or_below_vllms_threshold():
    """With allgather_reducescatter (not asynchronous) vLLM 0.34 puts the shared experts on the aux
    stream at or below VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD (EP.shared_stream_cite): the step
    prices that rule, and the threshold tpcost decides is the least expected time (brute force);
    DeepEP refuses the question in one line."""
    from costmodel.ep_step import (
        COLLECTIVE_SLOWDOWN_BESIDE_GEMM,
        EP,
        block,
        moe_layer_s,
        shared_stream_threshold,
    )

    s = _setup(be="allgather_reducescatter")
    T = np.array([16.0, 256.0, 257.0, 1024.0])
    b = block(s, T)
    serial = b.t_router_s + b.t_dispatch_s + b.t_experts_s + b.t_combine_s + b.t_shared_s
    aux = F.t_aux_stream_s(
        serial - b.t_shared_s,
        b.t_shared_s,
        b.t_dispatch_s + b.t_combine_s,
        COLLECTIVE_SLOWDOWN_BESIDE_GEMM,
        2 * float(s.prof.kernels.launch_overhead_s),
    )
    assert EP.shared_stream_tokens == 256
    assert np.allclose(moe_layer_s(s, b, T), np.where(T <= 256, aux, serial), rtol=1e-12)
    th = shared_stream_threshold(s, 512, 0.02)
    Tg = np.arange(1, 513, dtype=float)
    off = step(dataclasses.replace(s, shared_stream_tokens=0), Tg).t_step_s
    on = step(dataclasses.replace(s, shared_stream_tokens=512), Tg).t_step_s
    costs = [np.sum(np.where(Tg <= t, on * 1.02, off)) for t in range(0, 513)]
    assert th.threshold_tokens == int(np.argmin(costs))
    with pytest.raises(TpcostError, match="gates nothing here"):
        shared_stream_threshold(_setup(), 256, 0.02)


def test_ep_shared_stream_cli(capsys, one_line_error):
    args = [
        "ep",
        "--enable-expert-parallel",
        "--data-parallel-size",
        "8",
        "--all2all-backend",
        "allgather_reducescatter",
        "--shared-stream",
    ]
    assert main([*args, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)["shared_stream"]
    assert r["env"] == {"VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD": r["threshold_tokens"]}
    assert r["vllm_threshold_tokens"] == 256 and "shared_experts.py" in r["cite"]
    one_line_error(
        "ep",
        "--enable-expert-parallel",
        "--data-parallel-size",
        "16",
        "--all2all-backend",
        "deepep_low_latency",
        "--shared-stream",
        needle="gates nothing here",
    )


def _ht_setup(gpu="h200-sxm", ep=16, **kw):
    from costmodel.ep_step import EPSetup
    from costmodel.moe import load_moe_model
    from costmodel.network import load_network

    return EPSetup(
        prof=load_profile(gpu),
        shape=load_moe_model("deepseek-v3"),
        ep=ep,
        gpus_per_node=8,
        backend="deepep_high_throughput",
        network=load_network("ib-cx7-400g"),
        decode=False,
        budget_tokens=2048,
        **kw,
    )


def test_the_per_sm_rate_is_the_released_rows():
    """HT_BYTES_PER_SM_S is DEEPEP_V2_README's SM100 intranode EP 8 bandwidth on 24 SMs, the local
    rank's 1/8 taken out; 64 SMs are faster there, so 24 bind (the reason it is a per-SM rate)."""
    from costmodel.all2all import HT_BYTES_PER_SM_S

    rows = [
        r
        for r in csv.DictReader(open(ROOT / "data/reference/ep_all2all.csv"))
        if r["source_id"] == "DEEPEP_V2_README" and r["ep"] == "8" and r["comm_sms"] in ("24", "64")
    ]
    by = {int(r["comm_sms"]): r for r in rows}
    assert float(by[64]["dispatch_GBps"]) > float(by[24]["dispatch_GBps"])
    for phase in ("dispatch", "combine"):
        assert HT_BYTES_PER_SM_S[phase] == pytest.approx(
            float(by[24][f"{phase}_GBps"]) * 1e9 * 7 / 8 / 24
        )


def test_high_throughput_time_follows_its_sms_up_to_deepeps_own():
    """Fewer SMs never speed the all-to-all, and past DeepEP's own 20 (set_num_sms only lowers it)
    nothing changes; no call moves its bytes faster than its SMs at the per-SM rate."""
    from costmodel.all2all import HT_BYTES_PER_SM_S
    from costmodel.ep_step import EP, a2a

    s = _ht_setup("b200", ep=8)
    T = np.array([64.0, 1024, 8192])
    times = {k: a2a(s, T, comm_sms=k) for k in (2, 8, 16, EP.deepep_sms, 32, 64)}
    ks = sorted(times)
    for a, b in zip(ks, ks[1:]):
        assert np.all(times[b].t_dispatch_s <= times[a].t_dispatch_s * (1 + 1e-12))
    assert np.array_equal(times[32].t_dispatch_s, times[EP.deepep_sms].t_dispatch_s)
    for k, x in times.items():
        sms = min(k, EP.deepep_sms)
        floor = (x.rdma_dispatch_bytes + x.nvl_dispatch_bytes) / (
            sms * HT_BYTES_PER_SM_S["dispatch"]
        )
        assert np.all(x.t_dispatch_s >= floor)


def test_vllm_dbo_comm_sms_is_the_least_expected_step_and_never_above_deepeps_own():
    """The choice is the argmin over the candidates (leaving vLLM's 20 must beat it by the premium);
    a value above DeepEP's own only takes SMs from DeepGEMM, so it never wins; the low-latency
    backend is refused in one line."""
    import dataclasses

    from costmodel.ep_step import EP, comm_sms_choice, dbo_threshold

    s = _ht_setup()
    th = dbo_threshold(s, 2048, 0.02).threshold_tokens
    c = comm_sms_choice(s, 2048, 0.02, th)
    by = c.step_s_by_sms
    best = min(by.values())
    assert by[c.sms] == best or by[EP.comm_sms] <= best * 1.02
    assert c.saving_s == pytest.approx(by[EP.comm_sms] - by[c.sms])
    assert all(by[k] >= by[EP.deepep_sms] for k in by if k > EP.deepep_sms)
    assert c.sms <= EP.deepep_sms
    with pytest.raises(TpcostError, match="deepep_high_throughput"):
        comm_sms_choice(dataclasses.replace(s, backend="deepep_low_latency"), 2048, 0.02, th)


def test_ep_dbo_reports_the_comm_sms_what_if(capsys):
    argv = [
        "ep",
        "--model",
        "deepseek-v3",
        "--gpu",
        "h200-sxm",
        "--enable-expert-parallel",
        "--data-parallel-size",
        "16",
        "--all2all-backend",
        "deepep_high_throughput",
        "--dbo",
        "--phase",
        "prefill",
    ]
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    cs = d["dbo"]["comm_sms"]
    assert (
        cs["env"] == "VLLM_DBO_COMM_SMS"
        and set(cs["phases"]) <= {"decode", "prefill"}
        and cs["phases"]
    )
    for c in cs["phases"].values():
        assert c["vllm_sms"] == 20 and 1 <= c["sms"] <= 20 and c["saving_s"] >= 0
    assert main(argv) == 0
    assert "VLLM_DBO_COMM_SMS (prefill)" in capsys.readouterr().out
