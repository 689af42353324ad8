"""NCCL all-reduce as NCCL's tuner runs it (#29): the lower envelope of per-regime α–β curves,
fitted to the released 8-GPU sweeps (calib/nccl_fit.py) and folded into the built-in profiles; what
it changes in the decisions."""

import json

import numpy as np
from costmodel.vllm_tables import Vllm
import pytest

from calib.nccl_fit import REGIMES, SWEEPS, fit_regimes, loso, sweep
from costmodel import formulas as F
from costmodel.formulas import GiB, KiB, MiB
from costmodel import ops
from costmodel.profile import load_profile
from integration.cli import main


def test_regimes_are_the_lower_envelope():
    """min over the curves: never above any one of them, equal to one of them at every size, finite
    and positive; with one curve it is that curve (the profiles without regime entries predict as
    before)."""
    S = np.geomspace(1e3, 2e10, 200)
    lat, bw = [17e-6, 38e-6, 72e-6], [206e9, 370e9, 476e9]
    t = F.t_all_reduce_regimes_s(S, lat, bw, 8)
    each = np.array([F.t_all_reduce_s(S, a, b, 8) for a, b in zip(lat, bw)])
    assert np.all(t <= each + 1e-18) and np.all(np.isclose(t, each.min(axis=0)))
    assert np.all(np.isfinite(t)) and np.all(t > 0)
    assert np.array_equal(F.t_all_reduce_regimes_s(S, lat[:1], bw[:1], 8), each[0])


def test_ring_regimes_are_the_lower_envelope():
    """An all-gather / reduce-scatter over its regimes: the min of its α + (W−1)/W·S/busBW curves;
    one curve is that curve (a profile without regime entries predicts as before)."""
    S = np.geomspace(1e3, 2e10, 200)
    lat, bw = [9e-6, 41e-6], [183e9, 365e9]
    t = F.t_ring_regimes_s(S, lat, bw, 8)
    each = np.array([F.t_all_gather_s(S, a, b, 8) for a, b in zip(lat, bw)])
    assert np.all(np.isclose(t, each.min(axis=0))) and np.all(np.isfinite(t)) and np.all(t > 0)
    assert np.array_equal(F.t_ring_regimes_s(S, lat[:1], bw[:1], 8), each[0])


def test_fit_ring_regimes_recovers_known_regimes():
    """Times made from known LL and Simple regimes (LL at F.LL_PAYLOAD_FRACTION of the Simple busBW)
    come back, and the LL regime carries that fraction of the busBW."""
    from calib.fit import fit_ring_regimes

    a_ll, a_s, bw = 10e-6, 45e-6, 380e9
    S = np.array([1024.0, 2 * MiB, 8 * MiB, 32 * MiB, 128 * MiB, 16 * GiB])
    t = F.t_ring_regimes_s(S, [a_ll, a_s], [F.LL_PAYLOAD_FRACTION * bw, bw], 8)
    reg, res = fit_ring_regimes(S, t, 8)
    assert reg["small"]["latency_s"] == pytest.approx(a_ll, rel=1e-3)
    assert reg["large"]["latency_s"] == pytest.approx(a_s, rel=1e-3)
    assert reg["large"]["bus_bw_bytes_per_s"] == pytest.approx(bw, rel=1e-3)
    assert reg["small"]["bus_bw_bytes_per_s"] == pytest.approx(F.LL_PAYLOAD_FRACTION * bw, rel=1e-3)
    assert res["rms_log_residual"] < 1e-4


@pytest.mark.parametrize("profile", ["h100-sxm", "h200-sxm", "b200", "gb200-nvl72", "h800", "l40s"])
def test_nccl_rs_and_ag_run_their_ll_regime_at_small_messages(profile):
    """The built-in ring all-gather and reduce-scatter at TP 8 have two regimes: below the crossover
    the LL curve (lower latency, half the busBW), above it the Simple curve; the envelope is what
    ops runs."""
    hw = ops.Hw(load_profile(profile), "bf16")
    for impl, t_fn in (
        ("nccl_all_gather", ops.t_nccl_all_gather_s),
        ("nccl_reduce_scatter", ops.t_nccl_reduce_scatter_s),
    ):
        lat, bw = ops.nccl_curves(hw, impl, 8)
        assert (
            len(lat) == 2
            and lat[1] < lat[0]
            and bw[1] == pytest.approx(F.LL_PAYLOAD_FRACTION * bw[0], rel=1e-3)
        )
        assert float(t_fn(hw, 8, 1024.0)) == pytest.approx(
            float(F.t_all_gather_s(1024.0, lat[1], bw[1], 8))
        )
        big = 16.0 * GiB
        assert float(t_fn(hw, 8, big)) == pytest.approx(
            float(F.t_all_gather_s(big, lat[0], bw[0], 8))
        )


@pytest.mark.parametrize(
    "gpu,source", [("h200", "MLENG_AR_8xH200_NCCL2277"), ("b200", "MLENG_AR_8xB200_P6")]
)
def test_in_sample_busbw_within_15pct_from_1mib(gpu, source):
    fit = fit_regimes(SWEEPS[gpu])
    e = fit["per_source"][source]
    assert e["max_abs_busbw_err_from_1mib"] <= 0.15, e
    lat = [fit["regimes"][r]["latency_s"] for r in REGIMES]
    assert lat == sorted(lat)  # small-message regime first


@pytest.mark.parametrize("gpu,profile", [("h200", "h200-sxm"), ("b200", "b200")])
def test_profiles_carry_the_fit(gpu, profile):
    """The built-in profile predicts each sweep (plus the harness offset of a torch-timed one) as
    the fit does."""
    fit = fit_regimes(SWEEPS[gpu])
    hw = ops.Hw(load_profile(profile), "bf16")
    for src in SWEEPS[gpu]:
        S, t = sweep(src)
        pred = ops.t_nccl_all_reduce_s(hw, 8, S) + fit["per_source"][src]["offset_s"]
        err = t / pred - 1.0
        big = S >= MiB
        # 4-digit rounding
        assert (
            np.max(np.abs(err[big])) <= fit["per_source"][src]["max_abs_busbw_err_from_1mib"] + 0.01
        )


def test_b200_small_all_reduce_is_nccls_not_the_harness_floor():
    """#47 item 6: B200 TP 8's small NCCL all-reduce comes from MLENG_NET_README's 1 KiB latency
    (29.7 us, the derivation its all-gather and reduce-scatter come from), not MLENG_AR_8xB200_P6's
    ~48 us harness floor, which the joint fit takes as that sweep's offset; the all-reduce then
    costs what the README's own ratio to the reduce-scatter says (29.7 / 20.5 us), not 2.25x."""
    hw = ops.Hw(load_profile("b200"), "bf16")
    S = np.array([1024.0, 8 * 1024.0, 64 * 1024.0])
    ar = ops.t_nccl_all_reduce_s(hw, 8, S)
    assert float(ar[0]) == pytest.approx(29.7e-6, rel=0.05)
    rs = ops.t_nccl_reduce_scatter_s(hw, 8, S)
    assert np.all(ar / rs <= 1.05 * 29.7 / 20.5), ar / rs
    fit = fit_regimes(SWEEPS["b200"])
    assert (
        fit["sources"][0] == "MLENG_NET_README"
        and fit["per_source"]["MLENG_NET_README"]["offset_s"] == 0.0
    )
    S6, t6 = sweep("MLENG_AR_8xB200_P6")
    floor = float(t6[S6 == 32 * 1024.0][0])
    # most of the floor
    assert 10e-6 <= fit["per_source"]["MLENG_AR_8xB200_P6"]["offset_s"] <= floor - 25e-6
    assert (
        "MLENG_NET_README"
        in load_profile("b200").provenance["collectives.nccl_all_reduce_small.tp8.latency_s"].source
    )


def test_loso_is_reported():
    out = loso(SWEEPS["h200"])
    assert set(out) == set(SWEEPS["h200"]) and all(
        v["max_abs_busbw_err_from_1mib"] >= 0 for v in out.values()
    )


def test_done_when_points(capsys):
    """H100 TP 8: 128 MiB NCCL all-reduce in 450-700 us (was 964); B200 TP 8: FlashInfer's fused
    one-shot all-reduce + norm at 1 MiB in 7-15 us (was ~33); the 405B fp8 32-token step no slower
    than the 64-token one."""
    h = ops.Hw(load_profile("h100-sxm"), "bf16")
    assert 450e-6 <= float(ops.t_nccl_all_reduce_s(h, 8, np.array([128 * MiB]))[0]) <= 700e-6
    b = ops.Hw(load_profile("b200"), "bf16")
    ar = ops.all_reduce_dispatch(b, np.array([2.0**20]), 8, True, fi_max_bytes=np.inf, vllm=Vllm())
    assert ar.impl_per_size[0] == "flashinfer_ar_rmsnorm" and 7e-6 <= float(ar.t_s[0]) <= 15e-6
    assert (
        main(
            [
                "whatif",
                "--gpu",
                "b200",
                "--model",
                "llama-3.1-405b",
                "--tp",
                "8",
                "--dtype",
                "fp8",
                "--no-band",
                "--tokens",
                "32",
                "64",
                "--json",
            ]
        )
        == 0
    )
    t = {r["num_tokens"]: r["t_tp_s"] for r in json.loads(capsys.readouterr().out)["rows"]}
    assert t[32] <= t[64]


@pytest.mark.parametrize(
    "size,tp,cc,multicast,fully,want",
    [
        (8 * MiB, 8, "10.0", True, True, "custom_rs_lamport"),
        (16 * MiB, 8, "10.0", True, True, "custom_rs_lamport"),
        (32 * MiB, 8, "10.0", True, True, "custom_rs_multimem"),
        (64 * MiB, 4, "10.3", True, True, "custom_rs_multimem"),
        (65 * MiB, 8, "10.0", True, True, None),
        (32 * MiB, 6, "10.0", True, True, None),  # multimem only at W 2, 4, 8
        (32 * MiB, 8, "9.0", True, True, None),  # Hopper: Lamport only
        (8 * MiB, 8, "9.0", True, True, "custom_rs_lamport"),
        (8 * MiB, 8, "8.0", False, True, "custom_rs_ipc"),  # A100: no multicast, fully connected
        (8 * MiB, 4, "8.9", False, False, None),  # 4 PCIe GPUs: not fully connected
        (8 * MiB, 16, "10.0", True, True, None),
    ],
)
def test_vllm_custom_reduce_scatter_rule(size, tp, cc, multicast, fully, want):
    from costmodel.vllm_tables import custom_rs_backend

    assert custom_rs_backend(size, tp, cc, multicast, fully) == want


def test_model_level_sp_reaches_the_custom_reduce_scatter(capsys):
    """`op --impl kernel`'s unfused GEMM+RS arm and Kimi-K3's SP mode run vLLM's sp_reduce_scatter
    (Lamport, then multimem, then NCCL on B200 TP 8); the compile-pass SP of vLLM <= 0.31 (`--impl
    torch`) keeps NCCL."""
    assert (
        main(
            [
                "op",
                "--gpu",
                "b200",
                "--tp",
                "8",
                "--op",
                "gemm_rs",
                "--impl",
                "kernel",
                "--n",
                "7168",
                "--k",
                "1536",
                "--json",
            ]
        )
        == 0
    )
    rows = {r["m"]: r["unfused_impl"] for r in json.loads(capsys.readouterr().out)["rows"]}
    assert (
        rows[512] == "custom_rs_lamport"
        and rows[2048] == "custom_rs_multimem"
        and rows[8192] == "nccl_reduce_scatter"
    )
    assert (
        main(
            [
                "op",
                "--gpu",
                "b200",
                "--tp",
                "8",
                "--op",
                "gemm_rs",
                "--impl",
                "torch",
                "--n",
                "7168",
                "--k",
                "1536",
                "--json",
            ]
        )
        == 0
    )
    assert {r["unfused_impl"] for r in json.loads(capsys.readouterr().out)["rows"]} == {
        "nccl_reduce_scatter"
    }
    hw = ops.Hw(load_profile("b200"), "bf16")
    msg = np.array([512 * 7168 * 2.0])
    t, impl = ops.reduce_scatter_dispatch(hw, msg, 8, model_level_sp=True)
    lat, bw = load_profile("b200").collective("custom_rs_lamport", 8)
    assert impl[0] == "custom_rs_lamport" and t[0] == pytest.approx(
        float(F.t_reduce_scatter_s(msg[0], lat, bw, 8))
    )
    t_nccl, impl_nccl = ops.reduce_scatter_dispatch(hw, msg, 8, model_level_sp=False)
    assert impl_nccl[0] == "nccl_reduce_scatter" and t_nccl[0] == pytest.approx(
        float(ops.t_nccl_reduce_scatter_s(hw, 8, msg)[0])
    )
    pair = ops.kernel_pair(
        hw, ops.KernelGemm("gemm_rs", 7168, 1536, 8), msg / (7168 * 2), vllm=Vllm()
    )
    assert pair.unfused_s[0] == pytest.approx(
        float(hw.t_gemm(msg / (7168 * 2), 7168, 1536)[0]) + t[0]
    )


@pytest.mark.parametrize(
    "shard,tp,multicast,fully,want",
    [
        (
            2 * MiB,
            8,
            True,
            True,
            "custom_ag_lamport",
        ),  # _DEFAULT_MNNVL_ALL_GATHER_MAX_SIZES[8] = 2 MiB, inclusive
        (2 * MiB + 16, 8, True, True, None),
        (8 * MiB, 2, True, True, "custom_ag_lamport"),  # 8 MiB at W = 2
        (4 * MiB + 16, 4, True, False, None),
        (2 * MiB, 8, False, True, "custom_ag_ipc"),  # the legacy 2 MiB one, fully connected
        (2 * MiB, 4, False, False, None),  # PCIe beyond 2 GPUs: NCCL
        (1000, 8, True, True, None),  # not a multiple of 16 bytes
        (MiB, 16, True, True, None),  # 16 ranks span MNNVL: not modelled
    ],
)
def test_vllm_custom_all_gather_rule(shard, tp, multicast, fully, want):
    """should_custom_all_gather (custom_all_reduce.py), hand-read: the limit is on the per-rank
    input shard."""
    from costmodel.vllm_tables import custom_ag_backend

    assert custom_ag_backend(shard, tp, multicast, fully) == want


def test_model_level_sp_reaches_the_custom_all_gather(capsys):
    """`collective --op all_gather --model-level-sp` on H100 TP 8: the Lamport all-gather up to 2
    MiB shards (16 MiB gathered), NCCL above; its time is the curve's; without model-level SP NCCL
    at every size."""
    hw = ops.Hw(load_profile("h100-sxm"), "bf16")
    msg = np.array([8 * MiB, 16 * MiB, 32 * MiB], dtype=float)  # gathered bytes
    t, impl = ops.all_gather_dispatch(hw, msg, 8, model_level_sp=True)
    assert list(impl) == ["custom_ag_lamport", "custom_ag_lamport", "nccl_all_gather"]
    lat, bw = load_profile("h100-sxm").collective("custom_ag_lamport", 8)
    assert t[0] == pytest.approx(float(F.t_all_gather_s(msg[0], lat, bw, 8)))
    assert t[2] == pytest.approx(float(ops.t_nccl_all_gather_s(hw, 8, msg[2:])[0]))
    assert set(ops.all_gather_dispatch(hw, msg, 8, model_level_sp=False)[1]) == {"nccl_all_gather"}
    assert (
        main(
            [
                "collective",
                "--gpu",
                "h100-sxm",
                "--tp",
                "8",
                "--op",
                "all_gather",
                "--model-level-sp",
                "--sizes",
                "8388608",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["rows"][0]["vllm_impl"] == "custom_ag_lamport"


def test_collective_command(capsys, tmp_path, one_line_error):
    """`tpcost collective`: nccl-tests-shaped rows of vLLM's pick and NCCL's own; against an
    nccl-tests log (the calibrate reader) predicted beside measured at the log's sizes."""
    assert (
        main(["collective", "--gpu", "h200-sxm", "--tp", "8", "--op", "all_reduce", "--json"]) == 0
    )
    d = json.loads(capsys.readouterr().out)
    rows = {r["size_bytes"]: r for r in d["rows"]}
    hw = ops.Hw(load_profile("h200-sxm"), "bf16")
    for s in (MiB, GiB):
        assert rows[s]["t_nccl_s"] == pytest.approx(
            float(ops.t_nccl_all_reduce_s(hw, 8, np.array([float(s)]))[0])
        )
        assert rows[s]["busbw_nccl_bytes_per_s"] == pytest.approx(1.75 * s / rows[s]["t_nccl_s"])
    assert (
        rows[GiB]["vllm_impl"] == "nccl_all_reduce" and rows[KiB]["vllm_impl"] == "custom_ar_1stage"
    )
    from pathlib import Path

    log = str(Path(__file__).parent / "fixtures" / "nccl-tests" / "all_reduce_perf_new.txt")
    assert main(["collective", "--gpu", "h100-sxm", "--log", log, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["op"] == "all_reduce" and d["tp"] == 4 and len(d["rows"]) == 11
    assert all(
        r["nccl_pred_over_measured"] == pytest.approx(r["t_nccl_s"] / r["t_measured_s"])
        for r in d["rows"]
    )
    assert (
        main(
            [
                "collective",
                "--gpu",
                "b200",
                "--tp",
                "8",
                "--op",
                "reduce_scatter",
                "--model-level-sp",
                "--sizes",
                "1048576",
            ]
        )
        == 0
    )
    assert "custom_rs_lamport" in capsys.readouterr().out
    one_line_error("collective", "--gpu", "h100-sxm", needle="needs --op and --tp")
    one_line_error("collective", "--tp", "1", "--op", "all_reduce", needle="at least 2 ranks")
    one_line_error(
        "collective",
        "--gpu",
        "h100-sxm",
        "--log",
        log,
        "--tp",
        "8",
        needle="is all_reduce on 4 ranks",
    )
    one_line_error(
        "collective",
        "--gpu",
        "h100-sxm",
        "--log",
        log,
        "--sizes",
        "1024",
        needle="the sizes are the log's",
    )
    one_line_error(
        "collective",
        "--tp",
        "8",
        "--op",
        "all_reduce",
        "--model-level-sp",
        needle="dispatches the same way",
    )
    one_line_error(
        "collective", "--tp", "8", "--op", "all_reduce", "--sizes", "0", needle="--sizes must be in"
    )
    bad = tmp_path / "x.txt"
    bad.write_text("not a log\n")
    one_line_error("collective", "--log", str(bad), needle="not nccl-tests output")


def test_every_collective_a_profile_times_is_one_registry_entry():
    """Issue 57 item 1 for collectives: each implementation vLLM's dispatch can pick, and each one a
    built-in profile times, is one ops.COLLECTIVE_IMPLS entry (NCCL's regime curves ride on NCCL's);
    the entry's time is its α-β curve, NCCL's its regime curves."""
    import numpy as np

    from costmodel import formulas as F
    from costmodel import ops, vllm_tables
    from costmodel.profile import builtin_profile_names, load_profile

    picked = {"nccl_all_reduce", "quick_reduce", "custom_ar_1stage", "custom_ar_2stage"}
    picked |= {"flashinfer_ar_rmsnorm", "flashinfer_ar_rmsnorm_twoshot"}
    picked |= {f"symm_mem_{a}" for a in vllm_tables.SYMM_MEM_ALGOS}
    for s in (1e3, 1e5, 1e7, 1e9):
        for tp in (2, 4, 8):
            for mc, fc in ((True, True), (False, True), (False, False)):
                picked.add(
                    vllm_tables.custom_rs_backend(s, tp, "10.0", mc, fc) or "nccl_reduce_scatter"
                )
                picked.add(vllm_tables.custom_ag_backend(s / tp, tp, mc, fc) or "nccl_all_gather")
    assert picked <= set(ops.COLLECTIVE_IMPLS), picked - set(ops.COLLECTIVE_IMPLS)
    regimes = tuple(ops.NCCL_REGIMES)
    for name in builtin_profile_names():
        p = load_profile(name)
        for impl in p.collectives:
            base = next((impl.removesuffix(r) for r in regimes if impl.endswith(r)), impl)
            assert base in ops.COLLECTIVE_IMPLS, (name, impl)
    hw = ops.Hw(load_profile("b200"), "bf16")
    S = np.array([1e4, 1e6, 1e8])
    lat, bw = hw.p.collective("custom_rs_lamport", 4)
    got = ops.COLLECTIVE_IMPLS["custom_rs_lamport"].t_s(hw, 4, S)
    assert np.allclose(got, F.t_reduce_scatter_s(S, lat, bw, 4), rtol=1e-12)
    nccl = ops.COLLECTIVE_KINDS["all_reduce"].t_nccl_s(hw, 4, S)
    assert np.allclose(nccl, ops.t_nccl_all_reduce_s(hw, 4, S), rtol=1e-12)


def test_the_dispatch_prices_each_pick_through_its_entry(monkeypatch, capsys):
    """A changed entry changes `tpcost collective` where vLLM picks it, and nowhere else."""
    import dataclasses
    import json

    from costmodel import ops
    from integration.cli import main

    argv = ["collective", "--gpu", "h100-sxm", "--tp", "4", "--op", "all_reduce", "--json"]
    assert main(argv) == 0
    before = json.loads(capsys.readouterr().out)["rows"]

    @dataclasses.dataclass(frozen=True)
    class Slower(ops.CollectiveImpl):
        def t_s(self, hw, tp, msg_bytes):
            return 3.0 * super().t_s(hw, tp, msg_bytes)

    monkeypatch.setitem(
        ops.COLLECTIVE_IMPLS, "custom_ar_1stage", Slower("custom_ar_1stage", "all_reduce")
    )
    assert main(argv) == 0
    after = json.loads(capsys.readouterr().out)["rows"]
    assert any(r["vllm_impl"] == "custom_ar_1stage" for r in before)
    for b, a in zip(before, after):
        want = 3.0 if b["vllm_impl"] == "custom_ar_1stage" else 1.0
        assert a["t_vllm_s"] == pytest.approx(want * b["t_vllm_s"], rel=1e-12)
        assert a["t_nccl_s"] == b["t_nccl_s"]
