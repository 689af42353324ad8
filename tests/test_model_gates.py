"""vLLM 0.34's hand cutoffs in model code (costmodel/gates.py): each gate named for the model that
reaches it, with vLLM's constant beside tpcost's value; the value is the least expected time on the
traffic (brute force), the activation conditions are read from the code (model-level SP, NVFP4, SM
10.3, the switch), and `op` answers the AG+matmul on raw shapes with vLLM's per-rank rule."""

import copy
import csv
import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from costmodel import load_profile
from costmodel.analysis import expected_time_by_threshold_s
from costmodel.gates import GATE_OPS, decide_gate, gate_arms, model_gates
from costmodel.model import Regime, RunConfig
from costmodel.shapes import load_model_config, read_kernel_model
from costmodel.vllm_tables import RELEASES, Parallel, Vllm
from integration.cli import main

ROOT = Path(__file__).resolve().parents[1]
MINIMAX = ROOT / "data" / "reference" / "models" / "minimax-m3.config.json"
MUSE = ROOT / "tests" / "fixtures" / "muse-spark.config.json"
V034 = Vllm(max(v for v, r in RELEASES.items() if r.model_gates))
SP = ("--enable-expert-parallel", "--moe-backend", "deep_gemm_mega_moe")


def _km(path, edit=None):
    cfg, name, where = load_model_config(str(path))
    if edit:
        cfg = copy.deepcopy(cfg)
        edit(cfg)
    return read_kernel_model(cfg, name, where)


def _run(*argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def _report(path, gpu, tp, *extra):
    rc, out, err = _run(
        "vllm-config",
        "--model",
        str(path),
        "--vllm-version",
        "0.34",
        "--gpu",
        gpu,
        "--tp",
        str(tp),
        *extra,
        "--json",
    )
    assert rc == 0, err
    return json.loads(out), err


def test_minimax_names_its_gate_and_why_vllm_refuses_the_published_checkpoint():
    rep, err = _report(MINIMAX, "gb300-nvl72", 4, *SP, "--kernel-op", "gemm_rs")
    assert rep["vllm_version"] == "0.34" and rep["env"] == {
        "VLLM_ENABLE_GEMM_RS": rep["env"]["VLLM_ENABLE_GEMM_RS"]
    }
    gates = {g["gate"]: g for g in rep["model_gates"]}
    assert set(gates) == {"minimax_m3.gemm_rs", "minimax_m3.finalize_ar"}
    g = gates["minimax_m3.gemm_rs"]
    assert g["constant"] == "_GEMM_RS_MIN_TOKENS" and g["vllm_tokens"] == 1024
    assert [(s["site"], s["n"], s["k"], s["calls_per_forward"]) for s in g["sites"]] == [
        ("o_proj", 6144, 8192 // 4, 60),
        ("down_proj (dense MLP)", 6144, 12288 // 4, 3),
    ]
    assert g["applies"] is False and "NVFP4" in g["why_not"] and "vLLM refuses this" in err
    assert g["tpcost_tokens"] is None or 1 <= g["tpcost_tokens"] <= 8192
    assert "gate minimax_m3.gemm_rs" in err and "vLLM fuses at N >= 1024" in err


def test_an_nvfp4_minimax_checkpoint_reaches_the_gate_and_its_band_holds_the_value():
    """NVFP4 routed experts with attention and dense MLPs left in bf16 (ModelOpt's exclude_modules):
    MegaMoE builds, model-level SP is on, and the kernel binds at o_proj and down_proj; with them
    quantised it binds nowhere."""

    def nvfp4(c, excluded=("*self_attn*", "*.mlp.*")):
        c["text_config"]["quantization_config"] = {
            "quant_method": "modelopt",
            "moe_quant_algo": "NVFP4",
            "exclude_modules": list(excluded),
        }

    km = _km(MINIMAX, nvfp4)
    run = RunConfig(4, "bf16", Regime(vllm=V034), 8192)
    gd, _ = model_gates(
        load_profile("b300"),
        km,
        Parallel(4, enable_expert_parallel=True, moe_backend="deep_gemm_mega_moe"),
        run,
    )
    assert gd.applies is None and gd.saving_s is not None
    lo, hi = gd.band_tokens
    if gd.tpcost_tokens is not None:
        assert (lo or 0) <= gd.tpcost_tokens <= (hi or np.inf)
    # without model-level SP (no MegaMoE) the gate is never reached, and says so
    off, _ = model_gates(load_profile("b300"), km, Parallel(4), run)
    assert off.applies.startswith("model-level SP is off")
    none, _ = model_gates(
        load_profile("b300"),
        _km(MINIMAX, lambda c: nvfp4(c, ())),
        Parallel(4, enable_expert_parallel=True, moe_backend="deep_gemm_mega_moe"),
        run,
    )
    assert (
        none.tpcost_tokens is None
        and "runs it nowhere" in none.applies
        and "can_run" in none.applies
    )


@pytest.mark.parametrize("gpu,tp", [("b300", 4), ("b200", 8), ("gb200-nvl72", 2)])
def test_each_value_is_the_least_expected_time_by_brute_force(gpu, tp):
    """For every derived gate, no other threshold on the step sizes it decides costs less with the
    premium on the fused steps, and the saving is what the expected times at the two thresholds
    say."""
    km = _km(MUSE)
    par = Parallel(tp, enable_expert_parallel=True, moe_backend="deep_gemm_mega_moe")
    prof = load_profile(gpu)
    run = RunConfig(tp, "bf16", Regime(vllm=V034), 4096, 0.02)
    for gd in model_gates(prof, km, par, run):
        if gd.why_not_derived:
            continue
        g = gd.gate
        n = np.arange(1, 4097, dtype=float)
        rng = GATE_OPS[g.op].fused_range
        ok = (
            np.ones(n.shape, dtype=bool)
            if rng == "any"
            else n < gd.sp_floor_tokens
            if rng == "below_sp_floor"
            else n >= gd.sp_floor_tokens
        )
        if g.op == "ag_gemm":
            ok &= n > 1024  # Blackwell's capture size: graphs below, where the fused op cannot run
        if g.align and tp in g.align:
            ok &= n % g.align[tp] == 0
        nf = n[ok]
        f, u = gate_arms(prof, g, gd.sites, nf, run)
        w = np.full(nf.shape, 1.0 / n.size)
        if g.runs_from == "min":
            # index i: fused from nf[i]; last: never
            cost = expected_time_by_threshold_s(u, f, w, run.margin)
            i = (
                nf.size
                if gd.tpcost_tokens is None
                else int(
                    np.flatnonzero((np.ceil(nf / tp) if g.per_rank else nf) >= gd.tpcost_tokens)[0]
                )
            )
        else:
            # index i: fused up to nf[i-1]
            cost = expected_time_by_threshold_s(f * (1 + run.margin), u, w, 0.0)
            # index: fused up to nf[i-1]
            i = int(np.searchsorted(nf, gd.tpcost_tokens, side="right"))
        assert cost[i] <= cost.min() * (1 + 1e-9), (g.key, gd.tpcost_tokens)


def test_muse_spark_gates_act_where_the_code_says():
    rep, err = _report(MUSE, "b300", 4, *SP)
    gates = {g["gate"]: g for g in rep["model_gates"]}
    assert set(gates) == {
        "common.ag_gemm",
        "muse_spark.gemm_rs",
        "muse_spark.oneshot_ar",
        "muse_spark.sp_floor",
        "muse_spark.finalize_ar",
    }
    ag = gates["common.ag_gemm"]
    assert ag["per_rank"] and ag["vllm_tokens"] == 1024 and ag["applies"]
    assert [(s["n"], s["k"], s["calls_per_forward"]) for s in ag["sites"]] == [
        (2 * (128 + 16) * 64 // 4, 8192, 62)
    ]
    assert (
        gates["muse_spark.gemm_rs"]["applies"] and gates["muse_spark.gemm_rs"]["vllm_tokens"] == 512
    )
    assert gates["muse_spark.gemm_rs"]["sites"][0]["k"] == 2048
    floor = gates["muse_spark.sp_floor"]
    assert (
        floor["why_not_derived"] and floor["tpcost_tokens"] is None and floor["vllm_tokens"] == 128
    )
    assert not floor["applies"] and "NVFP4" in floor["why_not"]  # a bf16 checkpoint: threshold 0
    assert "not derived" in err
    # SM 10.0 builds no Muse Spark GEMM-RS; TP 8's floor table entry is 256
    rep, _ = _report(MUSE, "b200", 8, *SP)
    gates = {g["gate"]: g for g in rep["model_gates"]}
    assert (
        not gates["muse_spark.gemm_rs"]["applies"]
        and "SM 10.3" in gates["muse_spark.gemm_rs"]["why_not"]
    )
    assert gates["muse_spark.sp_floor"]["vllm_tokens"] == 256


def test_muse_spark_nvfp4_floor_and_a_quantised_qkv():
    def nvfp4(c):
        c["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4"}

    par = Parallel(8, enable_expert_parallel=True, moe_backend="deep_gemm_mega_moe")
    km = _km(MUSE, nvfp4)
    assert km.sp_floor_tokens(par, V034) == 257 and km.sp_floor_tokens(Parallel(8), V034) == 8
    gates = {
        g.gate.key: g
        for g in model_gates(load_profile("b300"), km, par, RunConfig(8, "bf16", Regime(vllm=V034)))
    }
    assert gates["muse_spark.sp_floor"].applies is None
    # qkv quantised
    assert gates["common.ag_gemm"].applies and "nvfp4" in gates["common.ag_gemm"].applies.lower()

    def excluded(c):
        nvfp4(c)
        c["quantization_config"]["exclude_modules"] = ["*self_attn*"]

    gates = {
        g.gate.key: g
        for g in model_gates(
            load_profile("b300"), _km(MUSE, excluded), par, RunConfig(8, "bf16", Regime(vllm=V034))
        )
    }
    assert gates["common.ag_gemm"].applies is None and gates["common.ag_gemm"].sites


def test_a_release_without_gates_says_so_and_kernel_op_is_refused_for_muse_spark():
    rc, _, err = _run(
        "vllm-config",
        "--model",
        str(MINIMAX),
        "--vllm-version",
        "0.33",
        "--gpu",
        "b300",
        "--tp",
        "4",
        *SP,
        "--kernel-op",
        "gemm_rs",
    )
    assert rc == 0 and "vLLM 0.33 has no hand cutoff in minimax_m3's code" in err
    rc, _, err = _run(
        "vllm-config",
        "--model",
        str(MUSE),
        "--vllm-version",
        "0.34",
        "--gpu",
        "b300",
        "--tp",
        "4",
        *SP,
        "--kernel-op",
        "gemm_rs",
    )
    assert rc == 2 and err.count("\n") == 1 and "Muse Spark does not call" in err
    rc, _, err = _run(
        "vllm-config",
        "--model",
        str(MUSE),
        "--gpu",
        "b300",
        "--tp",
        "4",
        "--json",
        "--format",
        "args",
    )
    assert rc == 2 and err.count("\n") == 1 and "--json" in err


def test_op_answers_the_model_level_ag_matmul_per_rank():
    rc, out, err = _run(
        "op",
        "--gpu",
        "h200-sxm",
        "--tp",
        "8",
        "--op",
        "ag_gemm",
        "--impl",
        "torch",
        "--n",
        "2304",
        "--k",
        "8192",
        "--vllm-version",
        "0.34",
        "--json",
    )
    assert rc == 0, err
    d = json.loads(out)
    assert d["baseline"] == "vllm_sp" and d["vllm_rule_tokens"] == 1024 * 8
    runs = {r["m"]: r["vllm_runs_kernel"] for r in d["rows"]}
    assert not runs[8064] and runs[8192]  # ceil(M/8) >= 1024
    if d["cutoff_tokens"] is not None:
        assert d["cutoff_tokens_per_rank"] == -(-d["cutoff_tokens"] // 8)
    # 0.31's compile-pass AsyncTP: the NCCL arm and the SP table, no per-rank value
    rc, out, _ = _run(
        "op",
        "--gpu",
        "h200-sxm",
        "--tp",
        "8",
        "--op",
        "ag_gemm",
        "--impl",
        "torch",
        "--n",
        "2304",
        "--k",
        "8192",
        "--vllm-version",
        "0.31",
        "--json",
    )
    d31 = json.loads(out)
    assert d31["baseline"] == "nccl" and d31["cutoff_tokens_per_rank"] is None
    assert "sp_min_token_num" in d31["vllm_rule"] or "SP table" in d31["vllm_rule"]
    # 0.33 runs no torch fused op at all
    rc, out, _ = _run(
        "op",
        "--gpu",
        "h200-sxm",
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
        "0.33",
        "--json",
    )
    d33 = json.loads(out)
    assert d33["vllm_rule_tokens"] is None and not any(r["vllm_runs_kernel"] for r in d33["rows"])


def test_the_plugin_logs_one_line_per_gate():
    from integration.vllm_plugin import plugin_gate_lines

    km = _km(MUSE)
    gates = model_gates(
        load_profile("b300"),
        km,
        Parallel(4, enable_expert_parallel=True, moe_backend="deep_gemm_mega_moe"),
        RunConfig(4, "bf16", Regime(vllm=V034)),
    )
    lines = plugin_gate_lines(gates)
    assert len(lines) == len(gates) == 5
    for gd, line in zip(gates, lines):
        assert (
            gd.constant in line and f"= {gd.vllm_tokens}" in line and "left as vLLM has it" in line
        )
        assert ("saving" in line) == (gd.why_not_derived is None)


def test_a_gate_with_no_eligible_step_says_why():
    km = _km(MUSE)
    par = Parallel(4, enable_expert_parallel=True, moe_backend="deep_gemm_mega_moe")
    # every step under graphs
    run = RunConfig(4, "bf16", Regime(vllm=V034, cudagraph_max_tokens=8192), 8192)
    ag = next(g for g in V034.release.gates_of("muse_spark") if g.op == "ag_gemm")
    gd = decide_gate(load_profile("b300"), ag, km.call_sites("ag_gemm", par, V034), run, 4)
    assert gd.tpcost_tokens is None and gd.applies and "no step size" in gd.applies


@pytest.mark.parametrize(
    "edit,needle",
    [
        (lambda c: c.pop("num_key_value_heads"), "num_key_value_heads"),
        (lambda c: c.update(head_dim="64"), "head_dim"),
        (lambda c: c.update(num_attention_heads=129, head_dim=63), "not divisible by tp=4"),
        (
            lambda c: c.update(
                quantization_config={
                    "quant_method": "modelopt",
                    "quant_algo": "NVFP4",
                    "exclude_modules": ["re:("],
                }
            ),
            "not a regular expression",
        ),
    ],
)
def test_a_malformed_muse_spark_config_is_one_line_and_exit_2(tmp_path, edit, needle):
    cfg = json.loads(MUSE.read_text())
    edit(cfg)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    rc, out, err = _run(
        "vllm-config",
        "--model",
        str(p),
        "--vllm-version",
        "0.34",
        "--gpu",
        "b300",
        "--tp",
        "4",
        *SP,
    )
    assert rc == 2 and out == "" and err.count("\n") == 1 and needle in err, err


def test_the_largest_budget_decides_every_gate_in_bounded_memory():
    """A 2^20-token budget: the values on the full grid, the band's draws on at most BAND_GRID_MAX
    step sizes (each a block's weight): every derived gate answers with a band, within the plugin's
    memory (a 2^20 x 200 array per arm would be 1.6 GB)."""
    import resource

    km = _km(MUSE)
    par = Parallel(8, enable_expert_parallel=True, moe_backend="deep_gemm_mega_moe")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    gates = model_gates(
        load_profile("b300"), km, par, RunConfig(8, "bf16", Regime(vllm=V034), 2**20)
    )
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 1_500_000  # Linux reports KiB
    for gd in gates:
        assert gd.why_not_derived or gd.band_tokens is not None


def test_the_committed_gate_table_is_current():
    """benchmarks/results/vllm_thresholds.json's model_gates (rendered into docs/vllm-thresholds.md)
    are what benchmarks/vllm_thresholds.py computes now, and its all-gather check too."""
    from benchmarks import vllm_thresholds as VT

    committed = json.loads((ROOT / "benchmarks" / "results" / "vllm_thresholds.json").read_text())
    assert json.loads(json.dumps(VT.gates_matrix())) == committed["model_gates"]
    assert json.loads(json.dumps(VT.all_gather_check())) == committed["all_gather_check"]


def test_published_torch_rows_are_scored_against_the_sp_table_whatever_the_release():
    """A released torch-op row (NCCL arm) stands for vLLM's compile-pass AsyncTP: `evaluate` and the
    accuracy benchmark score it against the newest SP table at every resolved release, while `op`
    answers 0.34's own use."""
    from costmodel.op_analysis import vllm_rule

    prof = load_profile("h100-sxm")
    v31 = Vllm(max(v for v, r in RELEASES.items() if r.sp_passes))
    m = np.arange(128.0, 8193.0, 128.0)
    for op, n, k in (("ag_gemm", 2304, 8192), ("gemm_rs", 8192, 3584)):
        old = vllm_rule(prof, op, "torch", 8, n, k, v31)
        new = vllm_rule(prof, op, "torch", 8, n, k, V034)
        assert new[:2] == old[:2] and "sp_min_token_num" in new[0]
        assert np.array_equal(new[2](m), old[2](m))


def test_vllm_config_lists_every_gate_of_the_family(capsys):
    """Issue 60: the report carries every gate-named constant of the model family's code under
    gate_inventory, each with its kind and status; the text names the communication gates tpcost
    does not price, with why."""
    import json as _json

    argv = [
        "vllm-config",
        "--model",
        str(ROOT / "data/reference/models/minimax-m3.config.json"),
        "--vllm-version",
        "0.34",
        "--gpu",
        "gb300-nvl72",
        "--tp",
        "4",
        "--enable-expert-parallel",
        "--moe-backend",
        "deep_gemm_mega_moe",
        "--kernel-op",
        "gemm_rs",
    ]
    assert main([*argv, "--json"]) == 0
    inv = _json.loads(capsys.readouterr().out)["gate_inventory"]
    names = {g["name"]: g for g in inv}
    assert names["_GEMM_RS_MIN_TOKENS"]["status"].startswith("priced")
    assert names["FUSED_MOE_FINALIZE_MAX_TOKENS"]["status"].startswith(
        "priced: model gate minimax_m3.finalize_ar"
    )
    assert all(g["where"].startswith("vllm/models/minimax_m3/") and g["status"] for g in inv)
    assert main(argv) == 0
    # both comm gates priced: the finalize is a model gate, not an "other" gate
    err = capsys.readouterr().err
    assert (
        "gate minimax_m3.finalize_ar (FUSED_MOE_FINALIZE_MAX_TOKENS" in err
        and "other gates" not in err
    )
    muse = [
        "vllm-config",
        "--model",
        str(MUSE),
        "--vllm-version",
        "0.34",
        "--gpu",
        "gb300-nvl72",
        "--tp",
        "4",
        "--enable-expert-parallel",
    ]
    assert main(muse) == 0
    err = capsys.readouterr().err
    other = err[err.index("other gates") :]
    assert "_SHARDED_PROJECTION_MAX_TOKENS = 256" in other and "not modelled" in other
    assert "_FUSED_ALL_REDUCE_MAX_TOKENS" not in other and "gate muse_spark.finalize_ar" in err


def _b300_ag_cutoff(capsys, *extra):
    assert (
        main(
            [
                "op",
                "--gpu",
                "b300",
                "--tp",
                "4",
                "--op",
                "ag_gemm",
                "--n",
                "4608",
                "--k",
                "8192",
                "--vllm-version",
                "0.34",
                "--json",
                *extra,
            ]
        )
        == 0
    )
    d = json.loads(capsys.readouterr().out)
    return d["cutoff_tokens"], {r["m"]: r["speedup"] for r in d["rows"]}


def test_b300_ag_matmul_agrees_in_sign_with_vllms_measurement_and_moves_with_the_host(capsys):
    """vLLM 0.34 measured torch's AG+matmul paying from 1024 rows per rank (M 4096) on B300 TP 4, K
    8192 (issue 62). The fused op wins at M 4096 at Muse Spark's shape (no GEMM+RS-fitted slowdown
    on the AG pipeline), and the cutoff follows the host's issue time per torch call: within 2x of
    vLLM's M 4096 at the hosts the released eager sweeps fitted (docs/model.md "vLLM's AG+matmul
    gate on B300"), earlier on the built-in assumed 3 us host."""
    cut, s = _b300_ag_cutoff(capsys)
    assert s[4096] > 1.0 and cut is not None and cut < 4096
    # PT_ISSUE179770's B300 host: its fastest fused GEMM+RS (W = 8, 58 torch calls) bounds the time
    # per call
    from costmodel import formulas as F

    rows = [
        r
        for r in csv.DictReader(open(ROOT / "data" / "reference" / "fused_ops.csv"))
        if r["source_id"] == "PT_ISSUE179770"
    ]
    bound_s = min(float(r["overlap_value"]) for r in rows) * 1e-3 / F.host_ops_gemm_rs(8)
    assert 4.1e-6 < bound_s < 4.3e-6
    c, _ = _b300_ag_cutoff(capsys, "--set", f"asynctp.host_op_s={bound_s:.3g}")
    assert c is not None and 2048 <= c <= 4096
    for host in ("1.013e-5", "1.207e-5"):  # KRAKEN_PR19's H100 host, the GB200 matrix's Grace host
        c, _ = _b300_ag_cutoff(capsys, "--set", f"asynctp.host_op_s={host}")
        assert c is not None and 2048 <= c <= 8192 and c > cut
