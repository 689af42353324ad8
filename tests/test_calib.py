"""Calibration job on real torch.distributed (gloo, 2 processes): the CPU loop
calibrate → whatif → validate → evaluate, the reference AsyncTP algorithms, robustness."""

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import need

torch = need("torch")

from integration.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MOE = str(ROOT / "tests" / "fixtures" / "moe-tiny" / "config.json")
TINY = "cpu-tiny"  # built-in: costmodel/models/cpu-tiny.json
# the one-GPU check's EP phases at the CPU fixture's MoE shape (calib/cpu-tiny-moe.json), small
# enough for CI
EP_SMALL = dict(
    ep_model=str(ROOT / "calib" / "cpu-tiny-moe.json"),
    ep_sizes=(2, 4),
    ep_tokens=(4, 8, 32),
    mla_decode=((1, 64), (4, 128)),
    mla_prefill=(32, 64),
)


def test_cpu_loop_calibrate_whatif_validate_evaluate(tmp_path, capsys):
    prof = tmp_path / "cpu.toml"
    assert (
        main(
            ["calibrate", "--device", "cpu", "--nproc", "2", "--budget-s", "20", "--out", str(prof)]
        )
        == 0
    )
    capsys.readouterr()
    samples, ops = prof.with_suffix(".samples.jsonl"), prof.with_suffix(".ops.csv")
    assert prof.exists() and samples.exists() and ops.exists()
    assert not list(tmp_path.glob("*.tmp*"))  # atomic writes leave no temporaries
    from costmodel.profile import load_profile

    p = load_profile(str(prof))
    assert p.kind == "host" and any(x.tier == "calibrated" for x in p.provenance.values())
    assert p.notes["calibration.world_size"] == "2" and "torch" in " ".join(p.notes)
    # an existing profile is only replaced with --force
    before = prof.read_text()
    assert main(["calibrate", "--device", "cpu", "--out", str(prof)]) == 2
    assert "--force" in capsys.readouterr().err and prof.read_text() == before

    assert (
        main(
            [
                "whatif",
                "--gpu",
                str(prof),
                "--model",
                TINY,
                "--tp",
                "2",
                "--dtype",
                "fp32",
                "--max-num-batched-tokens",
                "2048",
                "--json",
            ]
        )
        == 0
    )
    assert "cutoff_tokens" in json.loads(capsys.readouterr().out)

    csv = tmp_path / "validate.csv"
    tokens = ["64", "256", "1024"]
    assert (
        main(
            [
                "validate",
                "--gpu",
                str(prof),
                "--model",
                TINY,
                "--device",
                "cpu",
                "--nproc",
                "2",
                "--tokens",
                *tokens,
                "--out",
                str(csv),
            ]
        )
        == 0
    )
    capsys.readouterr()
    lines = csv.read_text().strip().splitlines()
    assert len(lines) == 1 + len(tokens)

    assert main(["evaluate", str(csv), str(ops), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    n_ops = len(ops.read_text().strip().splitlines()) - 1
    # a prediction for every point; under load the budget may skip the fused-op phase, leaving an
    # ops CSV with only a header, which evaluate reports and skips (the loop still holds together;
    # no budget-limited phase is asserted)
    assert d["rows_scored"] == len(tokens) + n_ops
    assert d["rows_skipped"] == (0 if n_ops else 1)
    assert all(math.isfinite(r["s_predicted"]) and r["s_predicted"] > 0 for r in d["rows"])


def _ref_worker(rank, world, port, q):
    import torch.distributed as dist

    from calib.distbench import (
        ag_gemm_reference,
        all_gather_flat,
        gemm_rs_reference,
        reduce_scatter_flat,
    )

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)
    shard, B = torch.randn(6, 5), torch.ones(5, 3) * 0.5
    full = torch.empty(6 * world, 5)
    a, out = ag_gemm_reference(shard, B, rank, world, full)
    ref_a = torch.empty(6 * world, 5)
    all_gather_flat(ref_a, shard)
    A = torch.randn(4 * world, 5)
    rs = gemm_rs_reference(A, B, rank, world)
    ref_rs = torch.empty(4, 3)
    reduce_scatter_flat(ref_rs, A @ B)
    q.put(
        (
            rank,
            torch.allclose(a, ref_a),
            torch.allclose(out, ref_a @ B, atol=1e-5),
            torch.allclose(rs, ref_rs, atol=1e-5),
        )
    )
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_reference_asynctp_algorithms_match_collectives(world):
    import multiprocessing as mp

    from calib.launch import _free_port

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    ps = [ctx.Process(target=_ref_worker, args=(r, world, port, q)) for r in range(world)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(120)
    res = sorted(q.get(timeout=5) for _ in range(world))
    assert all(all(r[1:]) for r in res), res


def test_clean_samples_rejects_nan_and_outliers():
    from calib.timing import clean_samples

    kept, rejected = clean_samples([1.0, 1.1, 0.9, 1.0, float("nan"), 50.0, float("inf"), -1.0])
    assert rejected == 4 and sorted(kept) == [0.9, 1.0, 1.0, 1.1]


def test_gpu_check_fails_at_once_without_gpu(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    from calib.gpu_check import main as gpu_main

    assert gpu_main([str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no CUDA GPU" in err


H200_CHECK = Path(__file__).resolve().parents[1] / "calib" / "data" / "h200-sxm-gpu-check"


def test_the_committed_h200_fit_is_the_median_of_its_runs(tmp_path):
    """What build_profiles folds into h200-sxm (calib/data/h200-sxm-gpu-check/fit.json) is --combine
    of the committed runs 2-4, recomputed here: each value their median, its sigma at least half
    their spread."""
    from calib.gpu_check import main as gpu_main

    runs = [H200_CHECK / f"run{i}" for i in (2, 3, 4)]
    assert gpu_main([str(tmp_path), *[a for r in runs for a in ("--combine", str(r))]]) == 0
    got = json.loads((tmp_path / "fit.json").read_text())["params"]
    committed = json.loads((H200_CHECK / "fit.json").read_text())
    assert committed["params"] == got and committed["provenance"]["combined"] == "median of 3 runs"
    each = [json.loads((r / "fit.json").read_text())["params"] for r in runs]
    for key, v in got.items():
        vals = sorted(e[key]["value"] for e in each if key in e)
        assert v["value"] == vals[len(vals) // 2] and v["runs"] == len(vals) == 3
        assert v["uncertainty_rel"] >= (vals[-1] - vals[0]) / (2 * v["value"]) - 1e-12


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--combine", "RUN2"], "at least two runs"),
        (["--combine", "RUN2", "--combine", "MISSING"], "no readable fit.json"),
        (["--combine", "RUN2", "--combine", "OTHER"], "different GPUs"),
        (["--combine", "RUN2", "--combine", "RUN3", "--budget-s", "10"], "--combine runs nothing"),
        (["--combine", "RUN2", "--combine", "RUN3", "OUT_MISSING"], "cannot write"),
        (
            ["--combine", "RUN2", "--combine", "LIST"],
            "a provenance table with device_name and a params table",
        ),
        (
            ["--combine", "RUN2", "--combine", "NUMBER"],
            "params.gemm.max_efficiency must be a table",
        ),
        (["--combine", "RUN2", "--combine", "NULL"], "a finite value"),
        (["--combine", "RUN2", "--combine", "NAN"], "a finite value"),
        (["--combine", "RUN2", "--combine", "DEEP"], "no readable fit.json"),
        (["--combine", "RUN2", "--combine", "RUN3", "--force", "EXISTS"], None),
        (["--combine", "RUN2", "--combine", "RUN3", "EXISTS"], "pass --force"),
        (["--force"], "read only with --combine"),
    ],
)
def test_gpu_check_combine_bad_input_is_one_line(tmp_path, capsys, args, needle):
    from calib.gpu_check import main as gpu_main

    base = json.loads((H200_CHECK / "run2" / "fit.json").read_text())
    names = {"RUN2": H200_CHECK / "run2", "RUN3": H200_CHECK / "run3", "MISSING": tmp_path / "nope"}
    bad_params = {
        "LIST": [1, 2],
        "NUMBER": {"gemm.max_efficiency": 5},
        "NULL": {"gemm.max_efficiency": {"value": None, "uncertainty_rel": 0.1}},
        "NAN": {"gemm.max_efficiency": {"value": float("nan"), "uncertainty_rel": 0.1}},
    }
    for tag, fit in (
        (
            "OTHER",
            {**base, "provenance": {**base["provenance"], "device_name": "NVIDIA H100 80GB HBM3"}},
        ),
        *((t, {**base, "params": p}) for t, p in bad_params.items()),
    ):
        (tmp_path / tag).mkdir()
        (tmp_path / tag / "fit.json").write_text(json.dumps(fit))
        names[tag] = tmp_path / tag
    (tmp_path / "DEEP").mkdir()
    (tmp_path / "DEEP" / "fit.json").write_text("[" * 100000 + "]" * 100000)
    names["DEEP"] = tmp_path / "DEEP"
    if "EXISTS" in args:  # an OUT_DIR whose fit.json is there already: replaced only with --force
        args = [a for a in args if a != "EXISTS"]
        out = tmp_path / "out"
        out.mkdir()
        (out / "fit.json").write_text("{}")
        rc = gpu_main([str(out), *[str(names.get(a, a)) for a in args]])
        if needle is None:
            assert rc == 0 and json.loads((out / "fit.json").read_text())["params"]
            return
        assert rc == 2 and (out / "fit.json").read_text() == "{}"
        assert needle in capsys.readouterr().err
        return
    out = tmp_path / "out"
    out.mkdir()
    if "OUT_MISSING" in args:  # the out folder is the positional: one that does not exist
        args, out = args[:-1], tmp_path / "no" / "such"
    assert gpu_main([str(out), *[str(names.get(a, a)) for a in args]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and not (out / "fit.json").exists()


def test_cuda_without_torchrun_is_one_line(capsys, monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(k, raising=False)
    assert main(["calibrate", "--device", "cuda", "--out", "/nonexistent-dir/x.toml"]) == 2
    assert "torchrun --nproc-per-node" in capsys.readouterr().err


def test_hung_rank_times_out_with_clear_message(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TPCOST_CALIB_TEST_HANG_RANK", "1")
    monkeypatch.setenv("TPCOST_CALIB_TIMEOUT_S", "4")
    import importlib

    import calib.launch

    importlib.reload(calib.launch)
    prof = tmp_path / "hang.toml"
    try:
        rc = main(
            ["calibrate", "--device", "cpu", "--nproc", "2", "--budget-s", "20", "--out", str(prof)]
        )
    finally:
        monkeypatch.delenv("TPCOST_CALIB_TIMEOUT_S")
        importlib.reload(calib.launch)
    err = capsys.readouterr().err
    assert rc == 2 and "timed out" in err and err.count("\n") == 1
    assert not prof.exists()  # no half-written profile
    assert prof.with_suffix(".samples.jsonl").exists()  # raw samples kept


def test_gpu_check_pipeline_runs_on_cpu_and_folds_into_a_profile(tmp_path, capsys):
    """calib/gpu_check.py's pipeline (phases → samples.jsonl → fit.json → summary.txt) is the same
    code on CPU with small shapes; its fit.json is what tools/build_profiles.py folds into the
    h200-sxm profile."""
    from calib.gpu_check import CheckSizes, run_check
    from costmodel.profile import profile_from_dict
    from tools.build_profiles import build_all

    out = tmp_path / "calib" / "data" / "h200-sxm-gpu-check"
    shapes = [
        ("tiny_qkv", 96, 128),
        ("tiny_o", 128, 64),
        ("tiny_gate_up", 256, 128),
        ("tiny_down", 128, 128),
    ]
    sizes = CheckSizes(
        shapes=tuple(shapes),
        gemm_rows=(1, 8, 32, 64, 128, 256),
        chunk_rows=(64, 128),
        worlds=(2, 4),
        mem_sizes=(2**16, 2**18),
        holdout_shapes=(("tiny_k", 160, 96),),
        holdout_rows=(1, 16, 64),
        **EP_SMALL,
    )
    assert run_check(out, "cpu", 60.0, sizes) == 0
    recs = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    kinds = {r["kind"] for r in recs}
    assert {"gemm", "chunked_gemm", "copy", "rms_norm", "partial_sum", "gemm_holdout"} <= kinds
    assert "gemm_sm_budget" not in kinds  # cuBLAS's SM carveout: CUDA only
    # the EP step's one-GPU terms at the fixture's shape: one rank's routed experts per EP size, MLA
    # per phase
    assert {(r["ep"], r["tokens_per_rank"]) for r in recs if r["kind"] == "grouped_experts"} == {
        (e, t) for e in EP_SMALL["ep_sizes"] for t in EP_SMALL["ep_tokens"]
    }
    assert {(r["phase"], r["tokens"]) for r in recs if r["kind"] == "mla_attention"} == {
        *(("decode", t) for t, _ in EP_SMALL["mla_decode"]),
        *(("prefill", s) for s in EP_SMALL["mla_prefill"]),
    }
    assert {r["variant"] for r in recs if r["kind"] == "chunked_gemm"} == {
        "one_stream",
        "two_streams",
    }
    assert all(r["median_s"] > 0 for r in recs if "median_s" in r)
    fit = json.loads((out / "fit.json").read_text())
    assert (
        fit["provenance"]["records"] == len(recs)
        and fit["provenance"]["prior_profile"] == "h200-sxm"
    )
    # under load a fit may reject every parameter (it then keeps the priors): the pipeline still
    # holds together
    assert set(fit["fits_by_dtype"]) == {"fp32"}
    fd = fit["fits_by_dtype"]["fp32"]
    if "gemm" in fd["residuals"]:  # the held-out GEMMs are scored against the fit, never part of it
        assert fd["residuals"]["gemm"]["points"] == sum(r["kind"] == "gemm" for r in recs)
        assert fd["gemm_holdout"]["all"]["rows"] == 3 and {
            q["m"] for q in fd["gemm_holdout"]["rows"]
        } == {1, 16, 64}
    assert set(fit["ep_holdout"]) == {"experts EP 2", "experts EP 4", "mla decode", "mla prefill"}
    assert fit["ep_holdout"]["experts EP 2"]["rows"] == len(EP_SMALL["ep_tokens"])
    assert (out / "summary.txt").read_text().startswith("gpu_check on ")
    assert "held-out mla decode" in (out / "summary.txt").read_text()
    capsys.readouterr()
    p = profile_from_dict(build_all({"h200-sxm": out / "fit.json"})["h200-sxm"], "h200-cpu-fold")
    folded = [k for k, v in p.provenance.items() if v.tier == "calibrated"]
    assert set(folded) <= set(fit["params"])
    for k in folded:
        # profiles keep 4 digits
        assert p.value(k) == pytest.approx(fit["params"][k]["value"], rel=1e-3)


def test_gpu_check_without_the_kimi_config_skips_the_held_out_gemms(tmp_path, monkeypatch):
    """An installed package has no data/reference/models: the check sizes no held-out GEMMs, says
    the phase was skipped and why, and runs the rest (importing calib.gpu_check never reads the
    file)."""
    import calib.gpu_check as G

    monkeypatch.setattr(G, "KIMI_K3_CONFIG", tmp_path / "absent.json")
    sizes = G.CheckSizes(
        shapes=(("tiny", 64, 64),),
        gemm_rows=(1, 8, 32, 64),
        chunk_rows=(64,),
        worlds=(2,),
        mem_sizes=(2**16,),
        **EP_SMALL,
    )
    assert sizes.holdout_shapes == ()
    assert G.run_check(tmp_path / "out", "cpu", 60.0, sizes) == 0
    fit = json.loads((tmp_path / "out" / "fit.json").read_text())
    assert any(
        x.startswith("gemm_holdout (no absent.json") for x in fit["provenance"]["skipped_phases"]
    )
    recs = [
        json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()
    ]
    assert (
        "gemm_holdout" not in {r["kind"] for r in recs}
        and fit["fits_by_dtype"]["fp32"]["gemm_holdout"] == {}
    )


def test_gemm_holdout_and_sm_budget_score_the_roofline():
    """The held-out GEMM check and the SM-budget check score the fitted roofline
    (calib.fit.gemm_time_s): rows timed at the model's own times score 0, rows 10 % slower score
    ln(1/1.1); a carveout that never moves the time is reported as not honoured, and the model's
    slowdown on fewer SMs is its roofline on sm_count − s SMs."""
    from calib.fit import check_gemm_holdout, check_sm_budget, gemm_time_s
    from costmodel.profile import load_profile

    prior = load_profile("h200-sxm").values()
    x = (0.75, 0.8, 5e-6)
    fitted = {
        "values": dict(
            zip(
                ("gemm.max_efficiency", "gemm.mem_efficiency", "gemm.launch_overhead_s"),
                x,
                strict=True,
            )
        )
    }
    rows = [
        {
            "kind": "gemm_holdout",
            "dtype": "bf16",
            "name": "s",
            "m": m,
            "n": 7168,
            "k": 1536,
            "median_s": float(gemm_time_s(m, 7168, 1536, x, prior, "bf16"))
            * (1.1 if m > 256 else 1.0),
        }
        for m in (16, 128, 1024, 4096)
    ]
    h = check_gemm_holdout(rows, prior, "bf16", fitted)
    assert h["m_le_256"]["max_abs_log_error"] == pytest.approx(0.0, abs=1e-12)
    assert h["m_gt_256"]["median_log_error"] == pytest.approx(-np.log(1.1))
    assert check_gemm_holdout(rows, prior, "bf16", None) == {}  # no fit: nothing to score

    def budget(lib, s, t):
        return {
            "kind": "gemm_sm_budget",
            "blas": lib,
            "name": "s",
            "m": 8192,
            "n": 7168,
            "k": 4224,
            "dtype": "bf16",
            "sm_carveout": s,
            "sm_count": 132,
            "median_s": t,
        }

    full = float(gemm_time_s(8192, 7168, 4224, x, prior, "bf16", 132))
    recs = [
        budget("a", s, float(gemm_time_s(8192, 7168, 4224, x, prior, "bf16", 132 - s)))
        for s in (0, 16, 66)
    ]
    recs += [budget("b", s, full) for s in (0, 16, 66)]
    b = check_sm_budget(recs, prior, fitted)
    assert b["a"]["honoured"] and b["a"]["slowdown"]["max_abs_log_error"] == pytest.approx(
        0.0, abs=1e-12
    )
    # half the SMs: about twice
    assert [q["model_slowdown"] > 1.5 for q in b["a"]["rows"]] == [
        False,
        True,
    ]
    assert not b["b"]["honoured"]


def test_ctrl_c_keeps_samples_and_writes_no_profile(tmp_path):
    """Ctrl-C (SIGINT to the foreground process group, as a terminal sends it) mid-run: exit 130
    with one line, the raw samples so far kept, no profile and no temporary left."""
    import signal
    import subprocess
    import sys
    import time

    prof = tmp_path / "int.toml"
    samples = prof.with_suffix(".samples.jsonl")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "integration",
            "calibrate",
            "--device",
            "cpu",
            "--nproc",
            "2",
            "--budget-s",
            "120",
            "--out",
            str(prof),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # a terminal's default: a shell's background job (nohup ... &) inherits SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    # the samples stream to `.partial` as they are taken (renamed when the run ends or is
    # interrupted): interrupt once the first are there, mid-run; waiting for the final name raced
    # the end of the run under load
    from calib.calibrate import partial_path

    partial = partial_path(samples)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (partial.exists() and partial.stat().st_size > 0):
        time.sleep(0.1)
    assert partial.exists() and partial.stat().st_size > 0, "no samples streamed within 90 s"
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "tpcost: interrupted" and "Traceback" not in err
    assert not prof.exists() and not list(tmp_path.glob("*.tmp*"))
    assert all(json.loads(line) for line in samples.read_text().splitlines())


def test_vllm_sp_collectives_fit_from_recorded_samples():
    """The calibration job's vLLM reduce-scatter and all-gather records
    (calib.distbench._vllm_sp_collectives, named by their backend) become the same curves the
    profiles hold: the released CPU samples plus records of a custom Lamport reduce-scatter and IPC
    all-gather timed at a known latency and busBW (1 % deterministic ripple) give back
    collectives.custom_rs_lamport.tp2 and custom_ag_ipc.tp2 within 3 %, tier calibrated."""

    from calib.calibrate import build_profile, prior_profile
    from costmodel import formulas as F

    here = (
        Path(__file__).resolve().parents[1]
        / "calib"
        / "data"
        / "cpu-gloo-w2"
        / "profile.samples.jsonl"
    )
    records = [json.loads(line) for line in here.read_text().splitlines() if line.strip()]
    truth = {
        "custom_rs_lamport": ("reduce_scatter", 9e-6, 3.0e11, F.t_reduce_scatter_s),
        "custom_ag_ipc": ("all_gather", 7e-6, 2.5e11, F.t_all_gather_s),
    }
    for impl, (op, lat, bw, t_of) in truth.items():
        for i, s in enumerate(2.0 ** np.arange(14, 25)):
            t = float(t_of(s, lat, bw, 2)) * (1.0 + 0.01 * (-1) ** i)
            records.append(
                {
                    "kind": "collective",
                    "impl": impl,
                    "op": op,
                    "world": 2,
                    "msg_bytes": s,
                    "median_s": t,
                    "p10_s": t,
                    "p90_s": t,
                    "reps": 10,
                    "rejected": 0,
                }
            )
    prov = {
        "host": "test",
        "device_name": "cpu",
        "torch": "x",
        "date": "2026-12-01",
        "backend": "gloo",
    }
    prof, _, _ = build_profile(records, prior_profile("cpu", ""), prov, 2, "fp32", "vllm-sp-fit")
    for impl, (_, lat, bw, _) in truth.items():
        got_lat, got_bw = prof.collective(impl, 2)
        assert got_lat == pytest.approx(lat, rel=0.03) and got_bw == pytest.approx(bw, rel=0.03), (
            impl
        )
        assert prof.provenance[f"collectives.{impl}.tp2.bus_bw_bytes_per_s"].tier == "calibrated"


def test_a_measured_nccl_curve_replaces_the_priors_regimes_at_its_tp():
    """A run that times NCCL's all-gather / reduce-scatter / all-reduce at world 8 on an H100 prior:
    its one curve is that machine's collective, so the prior's regime curves at TP 8 (another
    machine's LL / LL128 fits) are gone from the calibrated profile (they would undercut the
    measurement at small sizes), named in its notes and not listed as kept; the curve the run
    measured is what ops runs at every size."""
    from calib.calibrate import build_profile
    from costmodel import formulas as F
    from costmodel import ops
    from costmodel.profile import load_profile

    prior = load_profile("h100-sxm")
    assert 8 in prior.collective_tps("nccl_all_gather_small") and 8 in prior.collective_tps(
        "nccl_all_reduce_small"
    )
    lat, bw = 30e-6, 300e9
    records = []
    for op, t_of in (
        ("all_gather", F.t_all_gather_s),
        ("reduce_scatter", F.t_reduce_scatter_s),
        ("all_reduce", F.t_all_reduce_s),
    ):
        for s in 4.0 ** np.arange(5, 14):
            t = float(t_of(s, lat, bw, 8))
            records.append(
                {
                    "kind": "collective",
                    "impl": op,
                    "world": 8,
                    "msg_bytes": s,
                    "median_s": t,
                    "p10_s": t,
                    "p90_s": t,
                    "reps": 10,
                    "rejected": 0,
                }
            )
    prov = {
        "host": "test",
        "device_name": "H100",
        "torch": "x",
        "date": "2026-12-02",
        "backend": "nccl",
    }
    prof, kept, _ = build_profile(records, prior, prov, 8, "bf16", "h100-own")
    for impl in (
        "nccl_all_gather_small",
        "nccl_reduce_scatter_small",
        "nccl_all_reduce_small",
        "nccl_all_reduce_mid",
    ):
        assert 8 not in prof.collective_tps(impl) and f"collectives.{impl}.tp8" not in kept
        assert f"collectives.{impl}.tp8" in prof.notes["calibration.regimes_replaced"]
    hw = ops.Hw(prof, "bf16")
    assert float(ops.t_nccl_all_gather_s(hw, 8, 1024.0)) == pytest.approx(
        float(F.t_all_gather_s(1024.0, lat, bw, 8)), rel=0.02
    )
    assert float(ops.t_nccl_all_reduce_s(hw, 8, 1024.0)) == pytest.approx(
        float(F.t_all_reduce_s(1024.0, lat, bw, 8)), rel=0.02
    )
    # the run's points are kept (issue 47 item 1): exact at each timed size, interpolated between
    for impl, op in (
        ("nccl_all_gather", "all_gather"),
        ("nccl_reduce_scatter", "reduce_scatter"),
        ("nccl_all_reduce", "all_reduce"),
    ):
        m = prof.measured[impl][8]
        assert len(m.msg_bytes) == 9 and "medians" in m.source
        t_of = {
            "all_gather": ops.t_nccl_all_gather_s,
            "reduce_scatter": ops.t_nccl_reduce_scatter_s,
            "all_reduce": ops.t_nccl_all_reduce_s,
        }[op]
        assert np.allclose(t_of(hw, 8, np.array(m.msg_bytes)), m.time_s, rtol=1e-12)
    assert load_profile("h100-sxm").measured == {}  # built-in profiles hold fits only


def test_validate_refuses_moe_in_one_line(tmp_path, one_line_error):
    one_line_error(
        "validate",
        "--gpu",
        "h100-sxm",
        "--model",
        MOE,
        "--device",
        "cpu",
        "--nproc",
        "2",
        "--out",
        str(tmp_path / "v.csv"),
        needle="is MoE (8 experts, top-2); validate times a dense layer",
    )


def test_multimem_adapter_reads_vllm_or_falls_back():
    from calib.distbench import multimem_world_sizes

    class Fake:  # a communicator as vLLM's SymmMemCommunicator exposes it
        _WORLD_SIZES_MULTIMEM = {"9.0": [2]}
        device_capability = "9.0"

    class Renamed:  # a release without the table: costmodel.vllm_tables' copy of vLLM's
        device_capability = "9.0"

    assert multimem_world_sizes(Fake()) == [2]
    assert multimem_world_sizes(Renamed()) == [4, 6, 8]
