"""Schedules, fused-op limits, breakdown, cutoff, band, profiles, shapes."""

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from costmodel import RunConfig, analyse, load_model, load_profile, predict
from costmodel import ops
from costmodel.analysis import decide_cutoff, expected_time_by_threshold_s, token_grid
from costmodel.profile import dump_profile, profile_from_dict, profile_to_tree
from costmodel.shapes import shape_from_config
from costmodel import formulas as F

H100 = load_profile("h100-sxm")
L70 = load_model("llama-3.1-70b")
N = np.array([1, 7, 64, 1000, 4096, 16384.0])


def _hw(**vals):
    """Hw of H100 with `vals` replaced. The limit tests take quantities to 0 or 1e30, outside the
    plausible ranges a profile may hold (docs/profiles.md): numpy values pass through with_values
    unchecked, as the band's draws do, which is what lets the formulas' limits be tested."""
    return ops.Hw(
        H100.with_values({k: np.float64(v) for k, v in vals.items()}) if vals else H100, "bf16"
    )


def _fused(kind, hw, m, n, k, W, eager=False):
    return (
        ops.fused_ag_gemm(hw, m, n, k, W, 2.0, eager)
        if kind == "ag"
        else ops.fused_gemm_rs(hw, m, n, k, W, eager)
    )


@pytest.mark.parametrize("kind", ["ag", "rs"])
def test_fused_limits_infinite_link_zero_sync(kind):
    """Link and copy engine → ∞, barrier → 0, no contention: the fused op costs its W chunk GEMMs
    plus its exposed memory kernels, and never less than the whole GEMM."""
    hw = _hw(
        **{
            "asynctp.copy_engine_bw_bytes_per_s": 1e30,
            "interconnect.link_bw_bytes_per_s": 1e30,
            "asynctp.copy_latency_s": 0.0,
            "asynctp.barrier_s": 0.0,
            "asynctp.compute_slowdown": 0.0,
        }
    )
    m, n, k, W = np.array([4096.0, 16384.0]), 8192, 8192, 4
    f = _fused(kind, hw, m, n, k, W)
    np.testing.assert_allclose(
        f.t_gpu_s,
        np.maximum(f.t_chunks_concurrent_s, hw.t_gemm(m, n, k)) + f.t_memory_s,
        rtol=1e-12,
    )
    assert np.all(f.t_s >= hw.t_gemm(m, n, k))
    assert np.all(f.t_pulls_s < 1e-12) and np.all(f.t_sync_s == 0)


def test_zero_compute_gives_no_overlap_gain():
    """Compute → 0 (infinite FLOP/s and HBM, no launches): the fused op is its pulls and barriers,
    nothing hidden: AG+GEMM = 3 barriers + (W−1) pulls; GEMM+RS = 2W barriers + (W−1) pulls."""
    z = {
        "compute.peak_flops_per_s.bf16": 1e30,
        "memory.hbm_bw_bytes_per_s": 1e30,
        "gemm.launch_overhead_s": 0.0,
        "kernels.launch_overhead_s": 0.0,
    }
    hw = _hw(**z)
    m, W = np.array([4096.0, 16384.0]), 4
    bw = min(
        H100.value("asynctp.copy_engine_bw_bytes_per_s"),
        H100.value("interconnect.link_bw_bytes_per_s"),
    )
    p = H100.value("asynctp.copy_latency_s") + m / W * 8192 * 2 / bw
    b = H100.value("asynctp.barrier_s")
    np.testing.assert_allclose(
        _fused("ag", hw, m, 8192, 8192, W).t_s, 3 * b + (W - 1) * p, rtol=1e-9
    )
    np.testing.assert_allclose(
        _fused("rs", hw, m, 8192, 8192, W).t_s, 2 * W * b + (W - 1) * p, rtol=1e-9
    )


def test_eager_host_issue_sets_a_floor_and_graphs_remove_it():
    hw = _hw()
    m = np.array([64.0, 65536.0])
    eager, graph = (
        _fused("rs", hw, m, 8192, 3584, 8, True),
        _fused("rs", hw, m, 8192, 3584, 8, False),
    )
    host = (6 * 7 + 16) * H100.value("asynctp.host_op_s")  # torch 2.13's 58 calls at W = 8
    np.testing.assert_allclose(eager.t_host_s, host)
    assert np.all(eager.t_s >= host) and np.all(graph.t_s == graph.t_gpu_s)
    assert eager.t_s[1] == graph.t_s[1]  # a large op is GPU-bound: the host hides behind it


@pytest.mark.parametrize("dtype", ["bf16", "fp8", "fp8-dynamic"])
def test_breakdown_terms_sum_to_the_difference(dtype):
    """Every term is computed from its own ops; their sum equals t_tp − t_sp_asynctp (eager and
    graph N)."""
    pred = predict(H100, L70, 4, dtype, N)
    total = sum(pred.breakdown[k] for k in pred.breakdown)
    np.testing.assert_allclose(
        total, pred.t_forward_s("tp") - pred.t_forward_s("sp_asynctp"), rtol=1e-9, atol=1e-12
    )
    assert np.all(pred.breakdown["chunking_s"] <= 0) and np.all(
        pred.breakdown["contention_s"] <= 1e-15
    )


def test_padding_term_is_zero_for_bf16_multiples_of_tp():
    pred = predict(H100, L70, 4, "bf16", np.array([64.0, 1024.0, 8192.0]))
    np.testing.assert_allclose(pred.breakdown["padding_and_other_s"], 0.0, atol=1e-15)
    padded = predict(H100, L70, 4, "bf16", np.array([1025.0]))
    assert padded.breakdown["padding_and_other_s"][0] < 0  # SP pays for 1028 rows


def test_padding_and_monotone_in_link_bandwidth():
    p = predict(H100, L70, 4, "bf16", np.array([4097.0, 4100.0]))
    # 4097 pads to 4100 under SP: every op but attention runs the same 4100 rows; attention works on
    # the step's own tokens (padding rows read no KV and attend no prefix: docs/model.md §5), so
    # only it differs, by its 3 rows
    for o in p.schedules["sp_asynctp"].layer_ops:
        if o.name != "attention":
            assert o.t_s[0] == o.t_s[1], o.name
        else:
            assert o.t_s[0] < o.t_s[1]
    assert p.t_forward_s("sp_asynctp")[0] == pytest.approx(p.t_forward_s("sp_asynctp")[1], rel=1e-4)
    slow = H100.with_values({"asynctp.copy_engine_bw_bytes_per_s": 20e9})
    assert np.all(
        predict(slow, L70, 4, "bf16", N).t_forward_s("sp_asynctp")
        >= predict(H100, L70, 4, "bf16", N).t_forward_s("sp_asynctp")
    )


def test_dtype_modes():
    b, f, d = (
        predict(H100, L70, 8, dt, np.array([8192.0])) for dt in ("bf16", "fp8", "fp8-dynamic")
    )
    names = lambda p: [o.name for o in p.schedules["sp_asynctp"].layer_ops]  # noqa: E731
    assert "fused_all_gather_qkv_gemm" in names(f)
    assert "fused_all_gather_qkv_gemm" not in names(d) and "dynamic_quant" in names(d)
    assert "fused_down_gemm_reduce_scatter" in names(d)
    assert f.t_forward_s("tp")[0] < b.t_forward_s("tp")[0]  # fp8 GEMMs are faster


def test_moe_gets_sp_without_fusion():
    cfg = json.loads(
        json.dumps(
            dict(
                hidden_size=4096,
                intermediate_size=14336,
                num_attention_heads=32,
                num_key_value_heads=8,
                num_hidden_layers=32,
                vocab_size=32000,
                num_local_experts=8,
                num_experts_per_tok=2,
            )
        )
    )
    moe = shape_from_config(cfg, "mixtral-like")
    pred = predict(H100, moe, 4, "bf16", N)
    names = [o.name for o in pred.schedules["sp_asynctp"].layer_ops]
    assert "fused_all_gather_gate_up_gemm" not in names and "moe_experts" in names
    assert any("MoE" in n for n in pred.notes)


def test_cutoff_decision_by_hand():
    """The cutoff minimises the expected forward time: steps with N ≥ c pay (1+margin)·t_on, the
    rest t_off."""
    grid = np.array([4, 8, 12, 16, 20.0])
    off = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    on = np.array([2.0, 1.9, 3.5, 3.0, 4.0])  # loses at 4 and 12, wins elsewhere
    w = np.full(5, 0.2)
    cost = expected_time_by_threshold_s(off, on, w, 0.02)
    # by hand, c = 16: 0.2·(1+2+3) + 0.2·1.02·(3+4)
    assert cost[3] == pytest.approx(0.2 * 6 + 0.2 * 1.02 * 7)
    assert cost[5] == pytest.approx(0.2 * 15)  # never
    assert decide_cutoff(grid, off, on, 0.02, w) == 16
    assert decide_cutoff(grid, off, off, 0.0, w) is None  # a tie goes to the larger c: never
    assert decide_cutoff(grid, off, off * 0.5, 0.02, w) == 4
    # a dip does not decide: winning everywhere but one small loss at 12 still enables from 8
    dip = np.array([2.0, 1.0, 3.05, 2.0, 2.5])
    assert decide_cutoff(grid, off, dip, 0.02, w) == 8
    draws = decide_cutoff(grid, np.vstack([off, off]), np.vstack([on, off]), 0.02, w)
    assert list(draws) == [16, np.inf]
    assert list(token_grid(4, 18)) == [4, 8, 12, 16]


def test_analysis_cutoff_is_the_argmin_and_band_is_deterministic():
    a = analyse(H100, L70, RunConfig(4, "bf16"))
    b = analyse(H100, L70, RunConfig(4, "bf16"))
    assert a.cutoff_band_tokens == b.cutoff_band_tokens
    # that the cutoff is the argmin is checked by brute force in
    # test_cutoff_is_the_argmin_by_brute_force below
    lo, hi = a.cutoff_band_tokens
    assert lo <= a.cutoff_tokens <= (hi if hi is not None else 1e9)
    dv = a.decision_value
    assert dv["saving_vs_never_s"] >= 0 and dv["regret_vs_oracle_s"] >= 0


def test_toml_round_trip_every_builtin():
    import tomllib

    from costmodel.profile import builtin_profile_names

    for name in builtin_profile_names():
        p = load_profile(name)
        q = profile_from_dict(tomllib.loads(dump_profile(profile_to_tree(p))), "roundtrip")
        assert q.values() == p.values() and q.provenance == p.provenance and q.notes == p.notes
        assert (q.identity, q.interconnect) == (p.identity, p.interconnect)
        assert all(prm.source.strip() for prm in p.provenance.values())


def test_import_costmodel_pulls_no_torch_or_scipy():
    """costmodel imports no torch/scipy/vllm/matplotlib, and nothing of calib or integration (the
    layers run one way); every costmodel module is imported, then a whole analysis runs."""
    code = (
        "import sys, pkgutil, importlib, costmodel;"
        "[importlib.import_module(m.name) for m in pkgutil.walk_packages(costmodel.__path__, "
        "'costmodel.')];"
        "from costmodel import RunConfig, analyse, load_model, load_profile;"
        "analyse(load_profile('h100-sxm'), load_model('llama-3.1-8b'), RunConfig(2, 'bf16'), "
        "band=False);"
        "bad=[m for m in sys.modules if m.split('.')[0] in "
        "('torch','scipy','vllm','matplotlib','calib','integration')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_cli_root_imports_every_subcommand_without_torch_or_vllm():
    code = (
        "import sys; from integration.cli import build_parser; ap = build_parser();"
        "cmds = set(ap._subparsers._group_actions[0].choices); print(sorted(cmds));"
        "need = {'whatif','profiles','models','evaluate','vllm-config','calibrate','validate'};"
        "bad=[m for m in sys.modules if m.split('.')[0] in ('torch','scipy','vllm')];"
        "sys.exit(0 if need <= cmds and not bad else 1)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_gathered_gemm_path_equals_reference_formula():
    """Hw.t_gemm composes F.t_gemm_s from its compute and memory parts; it must equal F.t_gemm_s."""
    from costmodel import formulas as F

    hw = ops.Hw(H100, "bf16")
    for arr in (
        np.arange(1, 5000, dtype=float),
        np.arange(1, 5000, dtype=float) / 4,
        np.array([5.0, 1, 300, 64, 65, 129] * 20),
    ):
        for n, k in ((2560, 8192), (8192, 7168), (1280, 8192)):
            ref = F.t_gemm_s(
                arr,
                n,
                k,
                peak_flops_per_s=hw.peak_flops_per_s,
                in_bytes=2,
                w_bytes=2,
                out_bytes=2,
                **hw.gemm,
            )
            np.testing.assert_allclose(hw.t_gemm(arr, n, k), ref, rtol=1e-12)


def test_gpu_check_fit_folds_into_profile(tmp_path):
    """calib/gpu_check.py's fit.json becomes calibrated values of the built-in profile
    (tools/build_profiles.py)."""
    from tools.build_profiles import build_all

    d = tmp_path / "calib" / "data" / "h200-sxm-gpu-check"
    d.mkdir(parents=True)
    d.joinpath("fit.json").write_text(
        json.dumps(
            {
                "provenance": {
                    "device_name": "NVIDIA H200",
                    "torch": "2.11.0",
                    "date": "2026-11-29",
                },
                "params": {
                    "gemm.max_efficiency": {"value": 0.79, "uncertainty_rel": 0.02},
                    "kernels.mem_efficiency": {"value": 0.9, "uncertainty_rel": 0.03},
                    "asynctp.compute_slowdown": {"value": 0.08, "uncertainty_rel": 0.2},
                    "asynctp.stream_concurrency": {"value": 0.85, "uncertainty_rel": 0.1},
                },
            }
        )
    )
    trees = build_all({"h200-sxm": d / "fit.json"})
    p = profile_from_dict(trees["h200-sxm"], "h200-test")
    for key, v in (
        ("gemm.max_efficiency", 0.79),
        ("kernels.mem_efficiency", 0.9),
        ("asynctp.compute_slowdown", 0.08),
    ):
        assert (
            p.value(key) == v
            and p.provenance[key].tier == "calibrated"
            and "NVIDIA H200" in p.provenance[key].source
        )
    assert p.provenance["gemm.max_efficiency"].sigma_rel == 0.02
    # its neighbour keeps its own source
    assert p.provenance["kernels.launch_overhead_s"].tier == "assumed"
    # the H100 takes only what belongs to the shared GH100 die: the two-stream concurrency
    h = profile_from_dict(trees["h100-sxm"], "h100-test")
    assert h.value("asynctp.stream_concurrency") == 0.85
    assert (
        h.provenance["asynctp.stream_concurrency"].tier == "calibrated"
        and "GH100 die" in h.provenance["asynctp.stream_concurrency"].source
    )
    assert (
        h.provenance["gemm.max_efficiency"].tier != "calibrated"
        and h.value("asynctp.compute_slowdown") != 0.08
    )


@settings(max_examples=25, deadline=None)
@given(factor=st.floats(1.05, 20.0), tp=st.sampled_from([2, 4, 8]))
def test_more_bandwidth_never_slows_anything(factor, tp):
    """Monotonicity: scaling every link/collective bandwidth up never makes a schedule slower."""
    keys = {
        k: v * factor
        for k, v in H100.values().items()
        if k.endswith("bus_bw_bytes_per_s") or k == "asynctp.copy_engine_bw_bytes_per_s"
    }
    fast = predict(H100.with_values(keys), L70, tp, "bf16", N)
    base = predict(H100, L70, tp, "bf16", N)
    for s in ("tp", "sp", "sp_asynctp"):
        assert np.all(fast.t_forward_s(s) <= base.t_forward_s(s) * (1 + 1e-12))


@pytest.mark.parametrize("tp,dtype", [(2, "bf16"), (4, "fp8"), (8, "fp8-dynamic")])
def test_sweep_equals_pointwise(tp, dtype):
    """A sweep must equal point-by-point values, sorted or not (no state kept across rows)."""
    sweep = np.arange(1, 3001, dtype=float)
    pick = np.array([0, 1, tp - 1, tp, 999, 1000, 2047, 2999])
    a, b = predict(H100, L70, tp, dtype, sweep), predict(H100, L70, tp, dtype, sweep[pick])
    for s in ("tp", "sp", "sp_asynctp"):
        np.testing.assert_allclose(a.t_forward_s(s)[pick], b.t_forward_s(s), rtol=1e-12)
        np.testing.assert_allclose(
            a.schedules[s].t_layer_s[pick], b.schedules[s].t_layer_s, rtol=1e-12
        )
    for k in a.breakdown:
        np.testing.assert_allclose(a.breakdown[k][pick], b.breakdown[k], rtol=1e-9, atol=1e-15)
    perm = np.random.default_rng(0).permutation(sweep.size)
    c = predict(H100, L70, tp, dtype, sweep[perm])
    for s in ("tp", "sp", "sp_asynctp"):
        np.testing.assert_allclose(c.t_forward_s(s), a.t_forward_s(s)[perm], rtol=1e-12)
    for k in a.breakdown:
        np.testing.assert_allclose(c.breakdown[k], a.breakdown[k][perm], rtol=1e-9, atol=1e-15)


def test_scalar_token_count():
    """A scalar N works and equals the same point inside a sweep."""
    one = predict(H100, L70, 4, "bf16", 1024)
    many = predict(H100, L70, 4, "bf16", np.array([512.0, 1024.0, 2048.0]))
    assert one.speedup_sp_asynctp.shape == (1,)
    np.testing.assert_allclose(one.speedup_sp_asynctp[0], many.speedup_sp_asynctp[1], rtol=1e-12)
    np.testing.assert_allclose(
        one.breakdown["overlap_gain_s"][0], many.breakdown["overlap_gain_s"][1], rtol=1e-9
    )


def test_cutoff_sensitivity_rows_are_single_input_what_ifs():
    """Each sensitivity row equals the cutoff of the profile with only that input scaled by e^(±σ);
    inputs of other TP sizes, or that the model does not read here, never appear."""
    from costmodel.analysis import cutoff_sensitivity, model_inputs

    tp, grid = 2, token_grid(2, 8192)

    def cut(prof):
        p = predict(prof, L70, tp, "bf16", grid)
        return decide_cutoff(grid, p.t_forward_s("tp"), p.t_forward_s("sp_asynctp"), 0.02)

    base = cut(H100)
    rows = cutoff_sensitivity(H100, L70, RunConfig(tp, "bf16"), grid, base)
    assert rows, "something must move the H100 TP 2 cutoff"
    inputs = model_inputs(H100, tp)
    for k in (k for k in inputs if k.startswith("collectives.")):
        impl, entry = k.split(".")[1:3]
        assert entry == f"tp{H100.collective_entry_tp(impl, tp)}"
    for r in rows[:3]:
        prm = H100.provenance[r["quantity"]]
        # it moves
        assert r["cutoff_minus_sigma_tokens"] != base or r["cutoff_plus_sigma_tokens"] != base
        for sign, key in ((-1, "cutoff_minus_sigma_tokens"), (1, "cutoff_plus_sigma_tokens")):
            # by hand: e^(±σ), efficiencies capped at 1
            x = H100.value(r["quantity"]) * np.exp(sign * prm.sigma_rel)
            if r["quantity"].endswith(("efficiency", "concurrency")):
                x = min(x, 1.0)
            assert cut(H100.with_values({r["quantity"]: x}, None, mark_modified=False)) == r[key]


def test_generator_flags_inconsistent_collectives():
    """An all-reduce far slower than its reduce-scatter + all-gather (the old b200 TP2: 168 GB/s
    against 734 GB/s; then 410 us against 166 us at 64 MiB once the reduce-scatter was fitted to the
    GB200 sweep) is flagged; the built-in profiles have none."""
    import copy

    from calib.derive import round_tree
    from tools.build_profiles import build_all, inconsistent_collectives

    trees = build_all()
    assert all(not inconsistent_collectives(n, round_tree(t)) for n, t in trees.items())
    bad = copy.deepcopy(trees["b200"])
    bad["collectives"]["nccl_all_reduce"]["tp2"]["bus_bw_bytes_per_s"] = 168e9
    flagged = inconsistent_collectives("b200", round_tree(bad))
    assert flagged and "b200 tp2" in flagged[0]
    fast = copy.deepcopy(trees["h100-sxm"])  # a busBW above the 450 GB/s NVLink4 link
    fast["collectives"]["nccl_all_gather"]["tp8"]["bus_bw_bytes_per_s"] = 500e9
    assert any(
        "above the link's 450 GB/s" in f
        for f in inconsistent_collectives("h100-sxm", round_tree(fast))
    )


def test_band_draws_of_a_key_do_not_depend_on_the_other_keys():
    """perturbed_values draws each key from its own seeded stream: a collective added to the profile
    (a new implementation's curve) leaves every other key's draws, and so every band, as they were;
    the draws still differ from key to key and have the tier's spread."""
    from costmodel.analysis import perturbed_values

    p = H100
    q = p.with_values(
        {
            "collectives.custom_ag_ipc.tp4.latency_s": 9e-6,
            "collectives.custom_ag_ipc.tp4.bus_bw_bytes_per_s": 3e11,
        },
        new_keys_ok=True,
    )
    a, b = perturbed_values(p, 200, 7), perturbed_values(q, 200, 7)
    assert set(b) - set(a) == {
        "collectives.custom_ag_ipc.tp4.latency_s",
        "collectives.custom_ag_ipc.tp4.bus_bw_bytes_per_s",
    }
    assert all(np.array_equal(a[k], b[k]) for k in a)
    k1, k2 = "gemm.max_efficiency", "memory.hbm_bw_bytes_per_s"
    assert not np.allclose(np.log(a[k1] / p.value(k1)), np.log(a[k2] / p.value(k2)))
    z = np.log(a[k2] / p.value(k2)).ravel() / p.provenance[k2].sigma_rel
    assert abs(z.mean()) < 0.25 and 0.8 < z.std() < 1.2


def test_cutoff_is_the_argmin_by_brute_force():
    """The cutoff against an independent brute force: for every threshold, sum the schedule each N
    would run."""
    from costmodel import RunConfig, analyse, load_profile, predict
    from costmodel.analysis import token_grid

    prof, shape = load_profile("h100-sxm"), load_model("llama-3.1-70b")
    a = analyse(prof, shape, RunConfig(4, "bf16"), band=False)
    grid = token_grid(4, 8192)
    pred = predict(prof, shape, 4, "bf16", grid)
    off, on = pred.t_forward_s("tp"), pred.t_forward_s("sp_asynctp") * 1.02
    costs = []
    for i in range(grid.size + 1):  # threshold grid[i] (i = size: never)
        costs.append(sum(float(off[j]) if j < i else float(on[j]) for j in range(grid.size)))
    best = min(range(len(costs)), key=lambda i: (costs[i], -i))  # ties to the larger threshold
    assert a.cutoff_tokens == (None if best == grid.size else int(grid[best]))


# Qwen3-235B-A22B's published shape
QWEN3_LIKE = {
    "hidden_size": 4096,
    "num_attention_heads": 64,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_hidden_layers": 94,
    "moe_intermediate_size": 1536,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "vocab_size": 151936,
}


def test_sp_padding_rows_route_as_one_token():
    """At TP 8 SP pads 1 token to 8 rows; the 7 padding rows are identical zero rows, routed to one
    token's experts:
    the experts touched are those of 2 tokens (E(1-(1-k/E)^2)), not 8; plain TP's are 1 token's."""
    from costmodel.model import predict
    from costmodel.shapes import shape_from_config

    shape = shape_from_config(QWEN3_LIKE, "qwen3-235b-like")
    prof = load_profile("h100-sxm")
    pred = predict(prof, shape, 8, "bf16", [1.0])
    E, k, H, inter = 128, 8, 4096, 1536 // 8
    for sched, tokens in (("sp", 2), ("tp", 1)):
        o = next(o for o in pred.schedules[sched].layer_ops if o.name == "moe_experts")
        w = F.moe_expert_weight_bytes(tokens, k, E, H, inter, 2.0)
        t_mem = (
            w / (prof.memory.hbm_bw_bytes_per_s * prof.gemm.mem_efficiency)
            + 3 * prof.gemm.launch_overhead_s
        )
        assert float(o.t_s[0]) == pytest.approx(t_mem, rel=1e-9)
    assert float(pred.speedup("sp")[0]) > 0.5  # was 0.394 with the padding routed as 7 more tokens


def test_moe_routing_kernels_by_hand():
    """After the router GEMM vLLM's fused MoE runs top-k, the block alignment, the experts and the
    sum: the three small kernels move these bytes (hand-counted for Qwen3-235B's shape at 64 tokens,
    bf16) at the kernels' HBM rate."""
    from costmodel.model import predict
    from costmodel.shapes import shape_from_config

    shape = shape_from_config(QWEN3_LIKE, "qwen3-235b-like")
    prof = load_profile("h100-sxm")
    ops_ = {o.name: o for o in predict(prof, shape, 8, "bf16", [64.0]).schedules["tp"].layer_ops}
    n, E, k, H = 64, 128, 8, 4096
    # k expert outputs in, their sum out
    want = {
        "moe_topk": n * E * 2 + n * k * 8,  # logits in, fp32 weights + int32 ids out
        "moe_align": 4
        * (n * k + (n * k + E * 63) + (n * k + E * 63) / 64),  # ids in, sorted ids + block map out
        "moe_sum": n * k * H * 2 + n * H * 2,
    }
    names = [o.name for o in predict(prof, shape, 8, "bf16", [64.0]).schedules["tp"].layer_ops]
    assert (
        names.index("moe_topk")
        < names.index("moe_align")
        < names.index("moe_experts")
        < names.index("moe_sum")
    )
    for name, b in want.items():
        t = (
            b / (prof.memory.hbm_bw_bytes_per_s * prof.kernels.mem_efficiency)
            + prof.kernels.launch_overhead_s
        )
        assert float(ops_[name].t_s[0]) == pytest.approx(t, rel=1e-9), name


def test_exposed_rs_pulls_slow_gemm_rs_only():
    """asynctp.rs_step_exposure (a pull waiting on a barrier behind the other stream's GEMM) is
    GEMM+RS's alone:
    raising it slows torch's GEMM+RS and leaves its AG+GEMM exactly as it was (docs/model.md §6)."""
    m = np.array([512.0, 4096.0, 16384.0])
    for name in ("h100-sxm", "b300"):
        prof = load_profile(name)
        hid = prof.with_values({"asynctp.rs_step_exposure": 0.0})
        exp = prof.with_values({"asynctp.rs_step_exposure": 1.0})
        for op, same in (("ag_gemm", True), ("gemm_rs", False)):
            a, b = (
                ops.torch_pair(ops.Hw(p, "bf16"), op, m, 8192, 8192, 4).fused_eager_s
                for p in (hid, exp)
            )
            assert np.array_equal(a, b) if same else (np.all(b >= a) and b[-1] > a[-1])
