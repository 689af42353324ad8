"""The single-kernel fused GEMM+RS / GEMM+AR family (docs/model.md §6b) and `tpcost op`."""

import dataclasses
import json
from pathlib import Path

import numpy as np
from costmodel.vllm_tables import Vllm
import pytest
from conftest import need

from costmodel import formulas as F
from costmodel import ops
from costmodel.profile import builtin_profile_names, load_profile
from integration.cli import main

WITH_KERNEL = [n for n in builtin_profile_names() if load_profile(n).fused_kernel is not None]
WITHOUT = [n for n in builtin_profile_names() if n not in WITH_KERNEL]
# the kernel GEMM+AR at Kimi-K3's o_proj shape on b200, TP 4
OP_AR_TP4 = "op --gpu b200 --tp 4 --op gemm_ar --impl kernel --n 7168 --k 1536".split()
M = np.unique(np.round(np.geomspace(1, 65536, 120)))


def test_which_profiles_have_it():
    """Every GPU with NVLink multicast over NVSwitch (NVLS): the SM100 family, where vLLM ships the
    kernel, and Hopper, where it does not."""
    assert sorted(WITH_KERNEL) == [
        "b200",
        "b300",
        "gb200-nvl72",
        "gb300-nvl72",
        "h100-sxm",
        "h20",
        "h200-sxm",
        "h800",
    ]
    shipped = [n for n in WITH_KERNEL if ops.kernel_shipped(load_profile(n)) is None]
    assert sorted(shipped) == ["b200", "b300", "gb200-nvl72", "gb300-nvl72"]


@pytest.mark.parametrize("name", WITH_KERNEL)
@pytest.mark.parametrize("op", ["gemm_rs", "gemm_ar"])
@pytest.mark.parametrize("time_scale", [1.0, 0.1])
def test_bounds(name, op, time_scale):
    """Never faster than the whole GEMM nor than its bytes over the link's peak, also where the
    model error draws the kernel at a tenth of its modelled time; finite and positive; may beat GEMM
    + NCCL by more than 2x (unlike torch's pipelined ops), so no such bound is asserted."""
    p = load_profile(name).with_values({"fused_kernel.time_scale": time_scale})
    hw = ops.Hw(p, "bf16")
    for tp in (2, 4, 8):
        for n, k in ((7168, 1536), (2048, 4096), (8192, 28672 // tp)):
            t = ops.fused_kernel(hw, op, M, n, k, tp).t_s
            assert np.all(np.isfinite(t)) and np.all(t > 0)
            assert np.all(t >= hw.t_gemm(M, n, k))
            # the bytes per rank, written out: ld_reduce reads every rank's m·n·2 partial (the
            # issuer's own included) and returns m·n·2/W; GEMM+AR's multimem.st sends m·n·2/W and
            # receives m·n·2
            s = M * n * 2.0
            egress = s + s / tp if op == "gemm_ar" else s
            ingress = s / tp + s if op == "gemm_ar" else s / tp
            peak = p.interconnect.link_bw_bytes_per_s  # unidirectional
            assert np.all(t >= egress / peak) and np.all(t >= ingress / peak)


@pytest.mark.parametrize("name", WITH_KERNEL)
def test_one_wave_cannot_overlap(name):
    """All of M in one wave: the kernel pays its GEMM and its traffic in series; over many waves it
    tends to the longer of the two (formulas.t_wave_pipeline_s), and never below either."""
    g, L = 3e-6, 5e-6
    assert F.t_wave_pipeline_s(g, L, 1.0) == pytest.approx(g + L)
    many = F.t_wave_pipeline_s(g * 1000, L * 1000, 1000.0)
    assert many == pytest.approx(max(g, L) * 1000, rel=2e-3)
    w = np.arange(1.0, 50.0)
    pipe = F.t_wave_pipeline_s(g, L, w)
    assert (
        np.all(pipe >= max(g, L) - 1e-18)
        and np.all(pipe <= g + L + 1e-18)
        and np.all(np.diff(pipe) <= 0)
    )
    # the overlap bound of the standards: (t_comp + t_comm) / max(t_comp, t_comm)
    assert np.all((g + L) / pipe <= (g + L) / max(g, L) + 1e-12)


def test_multicast_bandwidth_follows_littles_law():
    """Few CTAs with little in flight cannot fill the link: C·q/λ until η·link caps it."""
    bw = F.multicast_bw_bytes_per_s(np.array([1.0, 8.0, 56.0, 148.0]), 32768.0, 2e-6, 900e9, 0.75)
    assert bw[0] == pytest.approx(32768.0 / 2e-6) and bw[1] == pytest.approx(8 * 32768.0 / 2e-6)
    assert bw[-1] == pytest.approx(0.75 * 900e9) and np.all(np.diff(bw) >= 0)


def test_mxfp8_op_and_evaluate_agree(capsys, tmp_path):
    """One predictor for the pair (ops.kernel_pair): `tpcost op --dtype mxfp8` and `tpcost evaluate`
    give the same speedup for the same row."""
    assert (
        main(
            [
                "op",
                "--gpu",
                "b200",
                "--tp",
                "4",
                "--op",
                "gemm_rs",
                "--impl",
                "kernel",
                "--n",
                "7168",
                "--k",
                "1536",
                "--dtype",
                "mxfp8",
                "--json",
            ]
        )
        == 0
    )
    row = next(r for r in json.loads(capsys.readouterr().out)["rows"] if r["m"] == 2048)
    f = tmp_path / "k.csv"
    f.write_text(
        "hardware,tp,op,dtype,m,n,k,baseline_us,overlap_us,source,impl,baseline_impl\n"
        "b200,4,gemm_rs,mxfp8,2048,7168,1536,100,100,x,kernel,vllm\n"
    )
    assert main(["evaluate", str(f), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["rows"][0]["s_predicted"] == pytest.approx(row["speedup"], rel=1e-9)


@pytest.mark.parametrize("name", WITHOUT)
def test_others_refuse(name, one_line_error):
    why = ops.kernel_available(load_profile(name), 4)
    assert why and "multicast" in why
    one_line_error(
        "op",
        "--gpu",
        name,
        "--tp",
        "4",
        "--op",
        "gemm_rs",
        "--impl",
        "kernel",
        "--n",
        "7168",
        "--k",
        "1536",
        needle="no single-kernel fused GEMM+collective",
    )


@pytest.mark.parametrize("op", ["gemm_rs", "gemm_ar"])
def test_op_json_for_b200_tp4(capsys, op):
    assert (
        main(
            [
                "op",
                "--gpu",
                "b200",
                "--tp",
                "4",
                "--op",
                op,
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
    d = json.loads(capsys.readouterr().out)
    assert d["vllm_rule_tokens"] == 128
    assert d["cutoff_tokens"] is None or (
        isinstance(d["cutoff_tokens"], int) and d["cutoff_tokens"] % 128 == 0
    )
    ms = [r["m"] for r in d["rows"]]
    assert ms == sorted(ms) and ms[:8] == [1, 2, 4, 8, 16, 32, 64, 128] and ms[-1] == 8192
    assert all(m % 128 == 0 for m in ms[7:])
    assert d["answer"] in ("never", "always", "cutoff") and len(d["cutoff_band_tokens"]) == 2
    for r in d["rows"]:
        assert set(r) == {
            "m",
            "t_fused_s",
            "t_unfused_s",
            "speedup",
            "vllm_runs_kernel",
            "unfused_impl",
            "waves",
        }
        assert r["vllm_runs_kernel"] == (r["m"] >= 128)
        assert r["speedup"] == pytest.approx(r["t_unfused_s"] / r["t_fused_s"])


def test_muse_spark_rule_on_b300(capsys):
    """Muse Spark's own GEMM+RS gate ships from 0.33 (models/muse_spark): its rule there,
    gemm_rs_ar's before."""
    argv = [
        "op",
        "--gpu",
        "b300",
        "--tp",
        "8",
        "--op",
        "gemm_rs",
        "--impl",
        "kernel",
        "--n",
        "8192",
        "--k",
        "1024",
        "--m",
        "640",
        "--json",
    ]
    for ver in ("0.33", "0.34"):
        assert main([*argv, "--vllm-version", ver]) == 0
        d = json.loads(capsys.readouterr().out)
        assert d["vllm_rule_tokens"] == 512 and "Muse Spark" in d["vllm_rule"]
        runs = {r["m"]: r["vllm_runs_kernel"] for r in d["rows"]}
        assert runs[256] is False and runs[512] is True and runs[640] is False and runs[768] is True
    assert main([*argv, "--vllm-version", "0.31"]) == 0
    assert json.loads(capsys.readouterr().out)["vllm_rule_tokens"] == 128


def test_cutoff_follows_the_rule_and_the_workload(capsys, tmp_path):
    """All traffic at one M: the cutoff is that M or below when the kernel wins there, never when it
    loses."""
    base = [
        "op",
        "--gpu",
        "gb200-nvl72",
        "--tp",
        "4",
        "--op",
        "gemm_rs",
        "--impl",
        "kernel",
        "--n",
        "2048",
        "--k",
        "1024",
        "--json",
    ]
    assert main(base) == 0
    rows = {r["m"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    for m in (128, 8192):
        wl = tmp_path / f"w{m}.csv"
        wl.write_text(f"num_tokens,count\n{m},100\n")
        assert main(base + ["--workload", str(wl)]) == 0
        cut = json.loads(capsys.readouterr().out)["cutoff_tokens"]
        if rows[m]["speedup"] > 1.02:
            assert cut is not None and cut <= m
        elif rows[m]["speedup"] < 1.0:
            assert cut is None or cut > m


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--op", "gemm_ar", "--impl", "torch"], "torch has no fused GEMM+all-reduce"),
        (["--op", "ag_gemm", "--impl", "kernel"], "fuses GEMM+RS and GEMM+AR only"),
        (["--op", "gemm_rs", "--impl", "kernel", "--gpu", "b200", "--n", "7000"], "N % 128 == 0"),
        (["--op", "gemm_rs", "--impl", "kernel", "--gpu", "b200", "--tp", "3"], "128 % tp == 0"),
        (
            ["--op", "gemm_rs", "--impl", "torch", "--dtype", "mxfp8"],
            "mxfp8 is the single kernel's",
        ),
        (
            ["--op", "gemm_ar", "--impl", "kernel", "--gpu", "b200", "--dtype", "fp8"],
            "the switch has no effect",
        ),
        (["--op", "gemm_rs", "--impl", "kernel", "--gpu", "b200", "--n", "-4"], "--n must be in"),
        (
            [
                "--op",
                "gemm_rs",
                "--impl",
                "kernel",
                "--gpu",
                "b200",
                "--max-num-batched-tokens",
                "64",
            ],
            "must be in [128",
        ),
        (["--op", "gemm_rs", "--impl", "torch", "--m", "130"], "multiple of tp"),
        (
            [
                "--op",
                "gemm_rs",
                "--impl",
                "kernel",
                "--gpu",
                "b200",
                "--set",
                "fused_kernel.link_efficiency=2",
            ],
            "outside its plausible range (0, 1]",
        ),
        (
            ["--op", "gemm_rs", "--impl", "kernel", "--gpu", "b200", "--workload", "/no/such.csv"],
            "/no/such.csv",
        ),
    ],
)
def test_op_bad_input(one_line_error, argv, needle):
    base = {"--gpu": "h100-sxm", "--tp": "4", "--n": "7168", "--k": "1536"}
    args = list(argv)
    for flag, v in base.items():
        if flag not in args:
            args += [flag, v]
    one_line_error("op", *args, needle=needle)


def test_evaluate_kernel_columns(tmp_path, capsys, one_line_error):
    f = tmp_path / "k.csv"
    head = "hardware,tp,op,dtype,m,n,k,baseline_us,overlap_us,source,impl,baseline_impl\n"
    # two: refused, never guessed
    f.write_text(
        head + "gb200-nvl72,4,gemm_rs,bf16,2048,2048,1024,231,134,x,kernel,nccl\n"
        "b200,4,gemm_ar,bf16,4096,7168,1536,300,280,x,kernel,vllm\n"
        "h100-sxm,8,gemm_rs,bf16,4096,8192,2048,300,280,x,torch,\n"
        "h100-sxm,8,ag_gemm,bf16,4096,8192,2048,300,280,x,,\n"  # one implementation: torch's
        "h100-sxm,8,gemm_rs,bf16,4096,8192,2048,300,280,x,,\n"
    )
    assert main(["evaluate", str(f), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["rows_scored"] == 4 and d["skipped"][0]["reason"].startswith(
        "impl is empty, and gemm_rs has 2"
    )
    labels = [r["label"] for r in d["rows"]]
    assert sum(" kernel " in x for x in labels) == 2
    g = tmp_path / "bad.csv"
    g.write_text(head + "b200,4,gemm_rs,bf16,2048,2048,1024,231,134,x,cute,nccl\n")
    one_line_error("evaluate", str(g), needle="impl must be one of torch, kernel")
    g.write_text(head + "b200,4,gemm_rs,bf16,2048,2048,1024,231,134,x,kernel,lamport\n")
    one_line_error("evaluate", str(g), needle="baseline_impl must be one of nccl, vllm")


def test_evaluate_and_op_share_the_default_baseline(tmp_path, capsys):
    """Issue 61 item 16: a kernel row with no baseline_impl is priced against the arm `op` prices
    (vLLM's dispatched all-reduce), so both give one speedup at one shape; baseline_impl nccl still
    asks NCCL's."""
    assert main([*OP_AR_TP4, "--json"]) == 0
    s_op = next(r["speedup"] for r in json.loads(capsys.readouterr().out)["rows"] if r["m"] == 512)
    f = tmp_path / "k.csv"
    head = "hardware,tp,op,dtype,m,n,k,baseline_us,overlap_us,source,impl,baseline_impl\n"
    f.write_text(
        head + "b200,4,gemm_ar,bf16,512,7168,1536,100,100,x,kernel,\n"
        "b200,4,gemm_ar,bf16,512,7168,1536,100,100,x,kernel,nccl\n"
    )
    assert main(["evaluate", str(f), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert (
        rows[0]["s_predicted"] == pytest.approx(s_op, rel=1e-12)
        and rows[1]["s_predicted"] != rows[0]["s_predicted"]
    )


def test_op_measured_rows_against_vllms_arm(tmp_path, capsys, one_line_error):
    """Issue 61 item 17: `op --measured` sets an author's measured kernel times against the unfused
    arm vLLM dispatches at each M (the same arm the op's rows price) and gives their crossover."""
    f = tmp_path / "mine.csv"
    head = "hardware,tp,op,dtype,m,n,k,baseline_us,overlap_us,source,impl\n"
    f.write_text(
        head + "b200,4,gemm_ar,bf16,4096,7168,1536,150,100,mine,kernel\n"
        "b200,4,gemm_ar,bf16,128,7168,1536,40,60,mine,kernel\n"
        "b200,4,gemm_ar,bf16,1024,7168,1536,60,50,mine,kernel\n"
        "b200,4,gemm_ar,bf16,1024,7168,2048,60,50,other-shape,kernel\n"
    )
    argv = OP_AR_TP4
    assert main([*argv, "--measured", str(f), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    unfused = {r["m"]: r["t_unfused_s"] for r in d["rows"]}
    meas = d["measured"]
    assert [r["m"] for r in meas["rows"]] == [128, 1024, 4096]  # its shape only, in M order
    for r in meas["rows"]:
        assert r["t_unfused_vllm_s"] == pytest.approx(unfused[r["m"]], rel=1e-12)
        assert r["speedup_vs_vllm"] == pytest.approx(
            r["t_unfused_vllm_s"] / r["t_fused_measured_s"], rel=1e-12
        )
        assert r["speedup_vs_own_baseline"] == pytest.approx(
            r["t_baseline_measured_s"] / r["t_fused_measured_s"]
        )
    wins = [r["speedup_vs_vllm"] > 1 for r in meas["rows"]]
    assert wins == [False, True, True] and meas["crossover_m_vs_vllm"] == 1024
    assert main([*argv, "--measured", str(f)]) == 0
    assert (
        "crossover against vLLM's dispatch (faster at every measured M from it): M = 1024"
        in capsys.readouterr().out
    )
    one_line_error(
        *argv[:-1], "1024", "--measured", str(f), needle="no row of gemm_ar tp 4 n 7168 k 1024 bf16"
    )
    one_line_error(
        *[("h200-sxm" if x == "b200" else x) for x in argv],
        "--measured",
        str(f),
        needle="rows measured on b200, asked about h200-sxm",
    )
    one_line_error(
        *argv,
        "--measured",
        str(Path(__file__).parent / "fixtures" / "eval_model.csv"),
        needle="model-level CSV",
    )
    one_line_error(*argv, "--measured", str(tmp_path / "none.csv"), needle="none.csv")


SM100 = ("b200", "b300", "gb200-nvl72", "gb300-nvl72")


@pytest.mark.parametrize("gpu", SM100)
@pytest.mark.parametrize("op", ["gemm_ar", "gemm_rs"])
def test_op_answers_at_kimi_k3_sites(capsys, gpu, op):
    """Every SM100 profile x TP {2, 4, 8} x Kimi-K3's call sites (n 7168, k 12288/tp and 6144/tp)
    gets an answer against vLLM's dispatched unfused path: never, always, or a cutoff with its band,
    below which no row gains more than the risk premium and from which on every row gains."""
    for tp in (2, 4, 8):
        for k_total in (12288, 6144):
            assert (
                main(
                    [
                        "op",
                        "--gpu",
                        gpu,
                        "--tp",
                        str(tp),
                        "--op",
                        op,
                        "--impl",
                        "kernel",
                        "--n",
                        "7168",
                        "--k",
                        str(k_total // tp),
                        "--vllm-version",
                        "0.33",
                        "--json",
                    ]
                )
                == 0
            )
            d = json.loads(capsys.readouterr().out)
            assert d["answer"] in ("never", "always", "cutoff")
            lo, hi = d["cutoff_band_tokens"]
            assert lo is None or hi is None or lo <= hi
            rows = d["rows"]
            m = np.array([r["m"] for r in rows], dtype=float)
            f = np.array([r["t_fused_s"] for r in rows])
            u = np.array([r["t_unfused_s"] for r in rows])
            grid = m  # uniform over the op's grid (1..64, then the multiples of 128)
            # brute force: the expected time of "fused when M >= c" (fused side x 1.02) for every c,
            # and never
            cost = {int(c): float(np.mean(np.where(grid >= c, f * 1.02, u))) for c in grid}
            cost[None] = float(np.mean(u))
            best = min(cost.values())
            c = d["cutoff_tokens"]
            assert cost[c] <= best * (1 + 1e-12)
            if d["answer"] == "cutoff" and len(d["fused_wins_m_ranges"]) == 1:
                # one crossing (no dispatch edge of vLLM's unfused all-reduce in between): from the
                # cutoff on every row wins; below it no start would pay the premium over the rows up
                # to the cutoff (a lone row may beat 2 % where the wave count makes the next ones
                # lose it: B300 TP 4 k 1536 at M = 384)
                assert all(r["speedup"] > 1.0 for r in rows if r["m"] >= c)
                below = m < c
                gain = np.where(below, u - 1.02 * f, 0.0)
                assert all(gain[i:].sum() <= 1e-12 * u.sum() for i in np.flatnonzero(below)), (
                    gpu,
                    tp,
                    k_total,
                )


def test_calibration_fits_the_kernel_terms_from_recorded_timings():
    """Timings of vLLM's kernel made by the model itself at known terms (fixed 20 us, fence 10 us,
    eta 0.68) on a B200 TP 8, GEMM-RS and GEMM-AR over M: calib.kernel_fit.fit_records recovers
    them, and calibrate folds them into the profile as calibrated values."""
    from calib.calibrate import build_profile
    from calib.kernel_fit import fit_records
    from costmodel import load_profile, ops
    from costmodel import formulas as F

    truth = {
        "fused_kernel.fixed_s": 20e-6,
        "fused_kernel.ar_fence_s": 10e-6,
        "fused_kernel.link_efficiency": 0.68,
    }
    prof = load_profile("b200")
    hw = ops.Hw(prof.with_values(truth), "bf16")
    recs = []
    for op in ("gemm_rs", "gemm_ar"):
        for m in (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768):
            n, k, tp = 7168, 768, 8
            lat, bw = prof.collective(
                "nccl_all_reduce" if op == "gemm_ar" else "nccl_reduce_scatter", tp
            )
            coll = (F.t_all_reduce_s if op == "gemm_ar" else F.t_reduce_scatter_s)(
                m * n * 2.0, lat, bw, tp
            )
            fused = float(
                ops.kernel_pair(hw, ops.KernelGemm(op, n, k, tp), float(m), vllm=Vllm()).fused_s[0]
            )
            recs.append(
                {
                    "kind": "fused_kernel",
                    "op": op,
                    "m": m,
                    "n": n,
                    "k": k,
                    "world": tp,
                    "fused_s": fused,
                    "baseline_s": float(hw.t_gemm(float(m), n, k)) + float(coll),
                }
            )
    got, res = fit_records(prof, recs)
    assert res["rows"] == 18
    for key, want in truth.items():
        assert got[key]["value"] == pytest.approx(want, rel=0.05), key
    prov = {"host": "h", "device_name": "B200", "torch": "t", "date": "d", "backend": "nccl"}
    out, _, residuals = build_profile(recs, prof, prov, 8, "bf16", "b200-calibrated")
    assert out.value("fused_kernel.link_efficiency") == pytest.approx(0.68, rel=0.05)
    assert (
        out.provenance["fused_kernel.link_efficiency"].tier == "calibrated"
        and "fused_kernel" in residuals
    )


def test_kernel_fit_terms_follow_the_harness_and_the_forced_protocols():
    """vLLM's two sources ran one benchmark: one harness offset on both; a forced NCCL protocol
    (RING_LL, LDMC) has its own latency term, NCCL's own choice (the FlashInfer matrix) the
    profile's."""
    from calib import kernel_fit as K

    prob = K._Problem(K.read_rows(), {})
    assert {k for k in prob.terms if k.endswith(":offset_s")} == {
        "vllm-bench:offset_s",
        f"{K.FI_RS}:offset_s",
    }
    assert {k for k in prob.terms if k.endswith(":latency_s")} == {
        f"{K.VLLM_RS}:RING_LL:tp8:latency_s",
        f"{K.VLLM_RS}:LDMC:tp8:latency_s",
        f"{K.VLLM_AR}:LDMC:tp8:latency_s",
    }


def test_committed_kernel_fit_is_current():
    """calib/data/kernel_fit.json is what python -m calib.kernel_fit fits from data/reference now
    (the joint fit's values within 1e-3, the same terms left unidentified, the same code-path
    noise)."""
    from calib import kernel_fit as K
    from calib.results import load_kernel_fit

    committed = load_kernel_fit()
    rows = K.read_rows()
    fit = K._fit(rows)
    for key, v in fit["values"].items():
        assert committed["values"][key] == pytest.approx(v, rel=1e-3), key
    assert committed["unidentified"] == fit["unidentified"]
    noise = K.code_path_noise(rows, fit["problem"].predict(fit["values"]))
    assert committed["code_path_noise"] == noise
    assert set(committed["correlation"]) == set(fit["correlation"])
    for term, partners in fit["correlation"].items():
        assert committed["correlation"][term] == pytest.approx(partners, abs=2e-3), term


def test_the_rows_pin_the_switch_round_trip_only_against_the_baselines_own_latency():
    """What the released rows pin of the multimem round trip λ (issue 49 item 4): its fitted
    partners are the sources' forced-protocol NCCL latencies (λ up with them) and the shared harness
    offset (λ down): its strongest partners are those, each |corr| > 0.7, so the rows fix the
    kernel's small-M time against the baseline's, not λ alone: its σ_rel stays near 1 and the
    profiles' band carries it."""
    from calib.results import load_kernel_fit

    k = load_kernel_fit()
    lam = k["correlation"]["hw:multicast_latency_s"]
    top = sorted(lam.items(), key=lambda t: -abs(t[1]))[:3]
    assert all(t.endswith((":latency_s", ":offset_s")) and abs(c) > 0.7 for t, c in top)
    assert (
        any(t.endswith(":latency_s") and c > 0 for t, c in top) and lam["vllm-bench:offset_s"] < 0
    )
    assert k["sigma_rel"]["hw:multicast_latency_s"] > 0.5


def test_replicate_noise_by_hand():
    """Two cells timed twice: rms ln(a/b)/√2 per arm and of the speedup, and the verdict flips, as
    counted by hand; a cell timed once has no pair."""
    from calib import kernel_fit as K

    def row(m, base_us, fused_us):
        return K.KernelRow(
            "S", 2, "gemm_rs", 4, m, 2048, 1024, "nccl", base_us * 1e-6, fused_us * 1e-6
        )

    rows = [row(1, 100, 90), row(1, 120, 96), row(2, 100, 90), row(2, 90, 100), row(3, 50, 50)]
    e = K.replicate_noise(rows)["S"]
    base = [np.log(100 / 120), np.log(100 / 90)]
    fused = [np.log(90 / 96), np.log(90 / 100)]
    spd = [np.log((100 / 90) / (120 / 96)), np.log((100 / 90) / (90 / 100))]
    for key, v in (("baseline_rms_log", base), ("fused_rms_log", fused), ("speedup_rms_log", spd)):
        assert e[key] == pytest.approx(np.sqrt(np.mean(np.square(v)) / 2), abs=1e-4), key
    # 1.111 vs 1.25 agree; 1.111 vs 0.9 do not
    assert e["pairs"] == 2 and e["verdict_flips"] == "1/2"


def test_code_path_noise_by_hand():
    """Rows of one grid (⌈m/128⌉ equal) scatter about the model: σ pooled about each path's mean by
    hand; a path under 4 rows is not one; a decided row settles its verdict only at |ln s| ≥ 1.645σ,
    and is scored there."""
    from calib import kernel_fit as K

    def row(m, speedup):
        return K.KernelRow("S", 2, "gemm_ar", 8, m, 7168, 1536, "LDMC", speedup * 50e-6, 50e-6)

    meas = {16: 0.80, 32: 0.93, 64: 1.10, 96: 1.02, 128: 0.97, 256: 1.30, 384: 1.0}
    rows = [row(m, s) for m, s in meas.items()]
    pred = [(1.0 * 50e-6, 50e-6)] * len(rows)  # the model: speedup 1 everywhere
    # one path (1 M-tile); 256 and 384 are paths of 1 row
    e = np.log([meas[m] for m in (16, 32, 64, 96, 128)])
    sigma = np.sqrt(np.sum((e - e.mean()) ** 2) / (len(e) - 1))
    got = K.code_path_noise(rows, pred)["S"]
    assert (
        got["rows"] == 5
        and got["paths"] == 1
        and got["sigma_log"] == pytest.approx(sigma, abs=1e-4)
    )
    # 1.02, 0.97 and 1.0 are inside ±5 %
    assert [d["m"] for d in got["decided"]] == [
        16,
        32,
        64,
        256,
    ]
    for d in got["decided"]:
        assert d["z"] == pytest.approx(np.log(meas[d["m"]]) / sigma, abs=0.01)
        assert d["right"] == (meas[d["m"]] < 1.0)  # predicted 1.0 is "not faster"
    assert [d["m"] for d in got["decided"] if abs(d["z"]) >= 1.645] == [16, 256]
    assert got["settled"] == "1/2"  # right at 0.80, wrong at 1.30
    # 3 rows make no path of 4: no σ, the source is left out
    assert K.code_path_noise(rows[:3], pred[:3]) == {}


def test_a_held_out_world_size_never_enters_the_fit():
    """Leave-one-world-size-out: the held-out rows' fused times do not move their own predictions
    (only their baseline arm fits their NCCL busBW); the in-sample score is the full fit's."""
    from calib import kernel_fit as K

    rows = [
        r
        for r in K.read_rows()
        if r.source == K.FI_RS and r.m in (4096, 65536) and r.k in (1024, 2048, 4096)
    ]
    full = K._fit(rows)
    pred = full["problem"].predict(full["values"])
    a = K.leave_one_world_size_out(rows, K.FI_RS, pred)
    slow = [r if r.tp == 2 else dataclasses.replace(r, fused_s=3 * r.fused_s) for r in rows]
    b = K.leave_one_world_size_out(slow, K.FI_RS, pred)
    assert set(a) == {"tp2", "tp4"} and a["tp4"]["trained_on_tp"] == [2]
    pa = [p["fused_predicted_s"] for p in a["tp4"]["held_out"]["per_row"]]
    pb = [p["fused_predicted_s"] for p in b["tp4"]["held_out"]["per_row"]]
    assert pa == pytest.approx(pb, rel=1e-9)
    assert [p["fused_measured_s"] for p in b["tp4"]["held_out"]["per_row"]] == pytest.approx(
        [3 * x for x in (r.fused_s for r in rows if r.tp == 4)]
    )
    # tp4's fused rows fit tp2's terms
    assert a["tp2"]["held_out"]["per_row"] != b["tp2"]["held_out"]["per_row"]


def test_held_out_draws_centre_on_the_prediction_and_draw_only_what_it_does_not_know():
    """The band's draws of a held-out source (vLLM's two sources, PR 53053 held out): reproducible
    by seed; the median speedup of each row within 5 % of the prediction at the central terms
    (lognormal draws about the fitted values), and the leave-one-source-out nominal is that median
    itself (issue 49); the draws move it (the terms it does not know), and the kernel never below
    its GEMM."""
    from calib import kernel_fit as K

    rows = [r for r in K.read_rows() if r.source in (K.VLLM_RS, K.VLLM_AR)]
    a = K.held_out_draws(rows, K.VLLM_AR, 40, 3)
    b = K.held_out_draws(rows, K.VLLM_AR, 40, 3)
    assert np.array_equal(a["fused_s"], b["fused_s"]) and np.array_equal(a["seq_s"], b["seq_s"])
    speedup = a["seq_s"] / a["fused_s"]
    central = np.array([seq / fused for seq, fused in a["central"]])
    assert np.allclose(np.median(speedup, axis=0), central, rtol=0.05)
    loo = K.leave_one_out(rows, K.VLLM_AR, 40, 3)
    nominal = np.array([p["speedup_predicted"] for p in loo["per_row"]])
    assert np.allclose(nominal, np.median(speedup, axis=0), rtol=1e-3)  # 4 digits in per_row
    assert loo["nominal"] == "median of 40 draws (seed 3)"
    assert np.all(np.ptp(a["fused_s"], axis=0) > 0.01 * np.median(a["fused_s"], axis=0))
    hw = ops.Hw(load_profile(K.PROFILE_OF[K.VLLM_AR]), "bf16")
    gemm = np.array([float(hw.t_gemm(float(r.m), r.n, r.k)[()]) for r in a["rows"]])
    assert np.all(a["fused_s"] - a["offset_s"] >= gemm * (1 - 1e-12))


@pytest.mark.parametrize("world", [2, 4, 6, 8])
def test_calibration_times_the_kernel_at_ms_vllm_can_run(world):
    """The M the calibration job times gemm_rs_ar at: multiples of the world size (vLLM pads to it),
    below and above vLLM's gate (M >= 128), up to 32768; on a CPU device the phase records
    nothing."""
    need("torch")
    from calib.distbench import bench_vllm_gemm_rs_ar, kernel_ms

    ms = kernel_ms(world)
    assert all(m % world == 0 for m in ms) and ms == sorted(set(ms))
    assert min(ms) < 128 <= max(ms) and 32768 - world < max(ms) <= 32768
    assert list(bench_vllm_gemm_rs_ar(None, ms, "cpu", 0, world)) == []


def test_muse_spark_rule_follows_its_shape_not_the_profile(tmp_path, capsys):
    """Issue 61 item 8: on SM 10.3 Muse Spark's own gate decides only its o_proj's shape (N 8192, K
    8192/TP per rank); any other GEMM+RS there is gemm_rs_ar's should_run (M >= 128), on b300 and on
    a profile derived from it alike."""
    assert (
        main(
            [
                "profiles",
                "--new",
                "mine",
                "--from",
                "b300",
                "--set",
                "memory.hbm_bw_bytes_per_s=6e12",
                "--out",
                str(tmp_path / "mine.toml"),
            ]
        )
        == 0
    )
    capsys.readouterr()
    for gpu in ("b300", str(tmp_path / "mine.toml")):
        base = [
            "op",
            "--gpu",
            gpu,
            "--op",
            "gemm_rs",
            "--impl",
            "kernel",
            "--vllm-version",
            "0.34",
            "--json",
        ]
        assert main([*base, "--tp", "8", "--n", "8192", "--k", "2048"]) == 0
        assert json.loads(capsys.readouterr().out)["vllm_rule_tokens"] == 128
        assert main([*base, "--tp", "4", "--n", "8192", "--k", "2048"]) == 0
        assert json.loads(capsys.readouterr().out)["vllm_rule_tokens"] == 512


def test_sm_share_slows_the_kernels_gemm_and_is_checked():
    """SMs held back from the kernel (ops.sm_share_hw): its GEMM never gets faster, its CTAs never
    more, the unfused arm is untouched, share 1 is the kernel as it was, and a share outside (0, 1]
    is refused."""
    import numpy as np

    from costmodel import load_profile, ops
    from costmodel.errors import TpcostError
    from costmodel.vllm_tables import Vllm

    hw = ops.Hw(load_profile("b200"), "bf16")
    m = np.array([256.0, 2048.0, 8192.0])
    pairs = {
        s: ops.kernel_pair(hw, ops.KernelGemm("gemm_ar", 7168, 8192, 4, sm_share=s), m, vllm=Vllm())
        for s in (1.0, 0.75, 0.5)
    }
    assert np.array_equal(
        pairs[1.0].fused_s,
        ops.kernel_pair(hw, ops.KernelGemm("gemm_ar", 7168, 8192, 4), m, vllm=Vllm()).fused_s,
    )
    for a, b in ((1.0, 0.75), (0.75, 0.5)):
        assert np.all(pairs[b].kernel.t_gemm_s >= pairs[a].kernel.t_gemm_s)
        assert np.all(pairs[b].kernel.ctas <= pairs[a].kernel.ctas)
        assert np.array_equal(pairs[b].unfused_s, pairs[a].unfused_s)
    # GEMM-bound at K 8192 and M 8192: half the SMs, about twice the kernel's time
    assert pairs[0.5].fused_s[-1] > 1.5 * pairs[1.0].fused_s[-1]
    for bad in (0.0, 1.5, -1.0):
        with pytest.raises(TpcostError, match="SM share"):
            ops.kernel_pair(
                hw, ops.KernelGemm("gemm_ar", 7168, 8192, 4, sm_share=bad), m, vllm=Vllm()
            )


@pytest.mark.parametrize(
    "value,needle", [("0", "(0, 1]"), ("1.5", "(0, 1]"), ("nan", "(0, 1]"), ("x", "not a number")]
)
def test_op_kernel_sm_share_bad_values(value, needle, one_line_error):
    one_line_error(
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
        "--kernel-sm-share",
        value,
        needle=needle,
    )


def test_op_kernel_sm_share_is_refused_for_torch(one_line_error):
    one_line_error(
        "op",
        "--gpu",
        "b200",
        "--tp",
        "4",
        "--op",
        "gemm_rs",
        "--n",
        "7168",
        "--k",
        "1536",
        "--kernel-sm-share",
        "0.5",
        needle="does not run on a share of the SMs",
    )


def test_op_kernel_sm_share_takes_effect(capsys):
    """--kernel-sm-share prices the kernel as ops.kernel_pair does on that share, says so, and
    leaves the unfused arm."""
    import numpy as np

    from costmodel import load_profile, ops
    from costmodel.vllm_tables import Vllm

    base = [
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
        "8192",
        "--vllm-version",
        "0.34",
        "--json",
    ]
    assert main(base) == 0
    full = json.loads(capsys.readouterr().out)
    assert main(base + ["--kernel-sm-share", "0.5"]) == 0
    half = json.loads(capsys.readouterr().out)
    assert full["kernel_sm_share"] == 1.0 and half["kernel_sm_share"] == 0.5
    m = np.array([float(r["m"]) for r in half["rows"]])
    want = ops.kernel_pair(
        ops.Hw(load_profile("b200"), "bf16"),
        ops.KernelGemm("gemm_ar", 7168, 8192, 8, sm_share=0.5),
        m,
        vllm=Vllm(),
    )
    assert np.allclose([r["t_fused_s"] for r in half["rows"]], want.fused_s, rtol=1e-12)
    assert [r["t_unfused_s"] for r in half["rows"]] == [r["t_unfused_s"] for r in full["rows"]]
    assert half["rows"][-1]["t_fused_s"] > full["rows"][-1]["t_fused_s"]
    assert any("on 74 of the 148 SMs" in n for n in half["notes"])
