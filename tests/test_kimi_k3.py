"""The operator's answer on the model that runs vLLM's fused GEMM+RS/AR kernel: Kimi-K3's call sites
read from its config.json (tests/fixtures/kimi-k3.config.json, see kimi-k3.SOURCE.md), `vllm-config
--kernel-op`, and the plugin setting the switch on real vLLM 0.31 (the CPU build) before the workers
spawn."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import need

from costmodel import ops
from costmodel.shapes import read_kernel_model
from costmodel.vllm_tables import Parallel, Vllm
from costmodel.profile import load_profile
from costmodel.shapes import load_model_config
from costmodel.workload import read_workload
from integration.cli import main

FIX = Path(__file__).parent / "fixtures"
KIMI = str(FIX / "kimi-k3.config.json")
BASE = [
    "vllm-config",
    "--model",
    KIMI,
    "--gpu",
    "b200",
    "--vllm-version",
    "0.33",
    "--kernel-op",
    "gemm_ar",
]


def _kimi():
    cfg, name, where = load_model_config(KIMI)
    return read_kernel_model(cfg, name, where)


def _variant(tmp_path, edit, name="variant"):
    cfg = json.loads(Path(KIMI).read_text())
    edit(cfg)
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def test_call_sites_as_vllm_builds_them():
    """GEMM-AR without SP: o_proj in all 93 layers (24 MLA + 69 KDA, K 12288/tp) and the dense layer
    0's down_proj (K 33792/tp); the shared experts never all-reduce. GEMM-RS under SP: o_proj, plus
    the shared experts (K 6144/tp) and the dense MLP only when sharded; 0.33 lets DeepEP v2 shard
    the shared experts, 0.31 only MegaMoE."""
    need("vllm")
    from vllm.transformers_utils.configs.kimi_linear import KimiLinearConfig

    km = _kimi()
    assert (km.name, km.family, km.hidden, km.num_layers, km.num_moe_layers()) == (
        "kimi-k3",
        "kimi_k3",
        7168,
        93,
        92,
    )
    text = json.loads(Path(KIMI).read_text())["text_config"]
    # vLLM's own layer rule
    n_kda = sum(KimiLinearConfig(**text).is_kda_layer(i) for i in range(93))
    ar = {
        s.name: (s.n, s.k, s.calls_per_forward, s.weights, s.norm_after)
        for s in km.call_sites("gemm_ar", Parallel(8), Vllm((0, 33)))
    }
    assert ar == {
        "o_proj (MLA)": (7168, 1536, 93 - n_kda, "bf16", True),
        "o_proj (KDA)": (7168, 1536, n_kda, "bf16", True),
        "down_proj (dense MLP)": (7168, 4224, 1, "bf16", True),
    }
    sp = Parallel(4, enable_expert_parallel=True, data_parallel_size=2)
    assert km.mode(sp) == "gemm_rs" and km.mode(Parallel(4)) == "gemm_ar"
    assert [s.name for s in km.call_sites("gemm_rs", sp, Vllm((0, 33)))] == [
        "o_proj (MLA)",
        "o_proj (KDA)",
    ]
    deepep = Parallel(
        4,
        enable_expert_parallel=True,
        data_parallel_size=2,
        all2all_backend="deepep_v2",
        shard_sp_shared_expert=True,
    )
    rs33 = {s.name: s.k for s in km.call_sites("gemm_rs", deepep, Vllm((0, 33)))}
    assert (
        rs33["shared_experts.down_proj"] == 6144 // 4
        and rs33["down_proj (dense MLP)"] == 33792 // 4
    )
    assert "shared_experts.down_proj" not in {
        s.name for s in km.call_sites("gemm_rs", deepep, Vllm((0, 31)))
    }
    for not_sp in (
        Parallel(8, enable_expert_parallel=True),
        Parallel(8, data_parallel_size=2),
        Parallel(
            8,
            pipeline_parallel_size=2,
            enable_expert_parallel=True,
            moe_backend="deep_gemm_mega_moe",
        ),
    ):
        assert km.mode(not_sp) == "gemm_ar"
    assert (
        km.mode(Parallel(8, enable_expert_parallel=True, moe_backend="deep_gemm_mega_moe"))
        == "gemm_rs"
    )


def test_whatif_refuses_naming_vllm_config(one_line_error, capsys):
    one_line_error("whatif", "--model", KIMI, needle="vllm-config --model")
    # without --kernel-op: the fusion range only, and how to ask more
    assert main(BASE[:-2] + ["--tp", "8"]) == 0
    cap = capsys.readouterr()
    assert set(json.loads(cap.out)["pass_config"]) <= {
        "fuse_allreduce_rms",
        "fi_allreduce_fusion_max_size_mb",
    }
    assert "add --kernel-op gemm_ar" in cap.err


def _env_run(capsys, *extra):
    assert main(BASE + ["--tp", "8", "--format", "env", *extra]) == 0
    cap = capsys.readouterr()
    return cap.out, cap.err


def test_format_env_prints_the_switch_and_the_saving(capsys, tmp_path):
    """stdout is one eval-able line; stderr has the expected times, the saving against vLLM's
    default and each call site; with --workload the decision follows the traffic."""
    out, err = _env_run(capsys)
    assert out in ("export VLLM_KIMI_K3_GEMM_AR=0\n", "export VLLM_KIMI_K3_GEMM_AR=1\n")
    assert (
        "per forward against vLLM's default" in err and "o_proj (KDA) x69" in err and "x24" in err
    )
    assert "setting: the kernel on every SM" in err  # the setting the answer assumes (issue 62)
    decided = {}
    for m in (64, 256, 8192):
        wl = tmp_path / f"w{m}.csv"
        wl.write_text(f"num_tokens,count\n{m},1000\n")
        out, err = _env_run(capsys, "--workload", str(wl))
        decided[m] = out.strip()[-1]
    # below vLLM's M >= 128 the switch changes nothing: vLLM's default stands; above, the model's
    # verdict at that M
    assert decided[64] == "1"
    hw = ops.Hw(load_profile("b200"), "bf16")
    for m in (256, 8192):
        wins = [
            ops.kernel_pair(
                hw,
                ops.KernelGemm("gemm_ar", 7168, k, 8, norm_after=True),
                [m],
                vllm=Vllm((0, 33)),
                fi_max_bytes=0.0,
            )
            for k in (1536, 4224)
        ]
        on = sum(float(p.fused_s[0]) * c for p, c in zip(wins, (93, 1)))
        off = sum(float(p.unfused_s[0]) * c for p, c in zip(wins, (93, 1)))
        # moves only past the premium
        assert decided[m] == ("0" if off * 1.02 < on else "1"), (
            m,
            on,
            off,
        )
    # the kernel loses at 256 rows and wins at 8192 here
    assert decided[256] == "0" and decided[8192] == "1"


def test_switch_agrees_with_tpcost_op_per_site(capsys, tmp_path):
    """At one M, each site's on - off is `tpcost op`'s fused - unfused x calls where FlashInfer's
    fusion does not reach (TP 8: vLLM's range ends at 73 tokens); the norm both arms run cancels."""
    wl = tmp_path / "w.csv"
    wl.write_text("num_tokens,count\n2048,10\n")
    from costmodel.model import Regime, RunConfig
    from costmodel.decide import UserChoices, kernel_model_config

    run = RunConfig(8, "bf16", Regime(vllm=Vllm((0, 33))), workload=read_workload(str(wl)))
    d = kernel_model_config(
        load_profile("b200"), _kimi(), Parallel(8), "gemm_ar", run, UserChoices(fi_max_mb=1.0)
    )
    assert d.fusion.tokens == 73
    for sd in d.switch.sites:
        assert (
            main(
                [
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
                    str(sd.site.k),
                    "--vllm-version",
                    "0.33",
                    "--json",
                    "--m",
                    "2048",
                ]
            )
            == 0
        )
        row = next(r for r in json.loads(capsys.readouterr().out)["rows"] if r["m"] == 2048)
        want = (row["t_fused_s"] - row["t_unfused_s"]) * sd.site.calls_per_forward
        assert np.isclose(sd.expected_on_s - sd.expected_off_s, want, rtol=1e-9, atol=1e-15)


def test_gemm_rs_needs_the_parallel_setup(capsys, one_line_error):
    rs = BASE[:-1] + ["gemm_rs", "--tp", "8"]
    one_line_error(*rs, needle="give the parallel setup")
    one_line_error(
        *rs, "--enable-expert-parallel", needle="which this parallel setup does not give"
    )
    one_line_error(
        *BASE,
        "--tp",
        "8",
        "--enable-expert-parallel",
        "--data-parallel-size",
        "2",
        needle="binds the kernel to GEMM-RS",
    )
    assert (
        main(rs + ["--enable-expert-parallel", "--data-parallel-size", "2", "--format", "env"]) == 0
    )
    cap = capsys.readouterr()
    assert cap.out.startswith("export VLLM_ENABLE_GEMM_RS=") and "(vLLM's default 0" in cap.err
    assert "nothing to fuse" in cap.err  # model-level SP: no all-reduce for FlashInfer's range
    assert (
        main(
            rs
            + [
                "--enable-expert-parallel",
                "--moe-backend",
                "deep_gemm_mega_moe",
                "--shard-sp-shared-expert",
            ]
        )
        == 0
    )
    assert "shared_experts.down_proj x92" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--tp", "8", "--dtype", "fp8"], "--dtype: no effect"),
        (["--tp", "8", "--seq-len", "4096"], "--seq-len: no effect"),
        (["--tp", "8", "--enforce-eager"], "--enforce-eager: no effect"),
        (["--tp", "8", "--cudagraph-max-tokens", "256"], "--cudagraph-max-tokens: no effect"),
        (["--tp", "8", "--shard-sp-shared-expert"], "give --kernel-op gemm_rs"),
        (["--tp", "1"], "needs 1 < tp <= 16"),
        (["--tp", "3"], "not divisible by tp=3"),
        (["--tp", "8", "--set", "asynctp.host_op_s=5e-6"], "--set asynctp.host_op_s: no effect"),
        (["--tp", "8", "--gpu", "h100-sxm"], "not shipped by vLLM on this GPU"),
        (["--tp", "8", "--vllm-version", "0.30"], "gemm_rs_ar ships from vLLM 0.31 on"),
    ],
)
def test_kernel_model_bad_input(one_line_error, argv, needle):
    one_line_error(*BASE, *argv, needle=needle)


@pytest.mark.parametrize(
    "key,value", [("interconnect.link_bw_bytes_per_s", 2e11), ("interconnect.latency_s", 2e-5)]
)
def test_kernel_model_takes_a_link_key_by_the_rule_every_command_uses(capsys, key, value):
    """A --set on the link is read through what it carries (the unfused arm's collectives), by the
    one rule of whatif, op and vllm-config (first_unread): the switch's expected off time moves."""
    assert main([*BASE, "--tp", "8", "--json"]) == 0
    base = json.loads(capsys.readouterr().out)["kernel_switch"]["expected_off_s"]
    assert main([*BASE, "--tp", "8", "--json", "--set", f"{key}={value}"]) == 0
    moved = json.loads(capsys.readouterr().out)["kernel_switch"]["expected_off_s"]
    assert moved != pytest.approx(base, rel=1e-6)


def test_other_models_refuse_the_kernel_flags(one_line_error):
    one_line_error(
        "vllm-config",
        "--model",
        "llama-3.1-70b",
        "--gpu",
        "b200",
        "--vllm-version",
        "0.33",
        "--kernel-op",
        "gemm_ar",
        needle="the switch has no effect for llama-3.1-70b",
    )
    one_line_error(
        "vllm-config",
        "--model",
        "llama-3.1-70b",
        "--gpu",
        "b200",
        "--vllm-version",
        "0.33",
        "--data-parallel-size",
        "2",
        needle="--data-parallel-size: read only for a model whose code gates a fused op",
    )
    one_line_error("vllm-config", "--gpu", "b200", "--format", "env", needle="give --kernel-op too")


def test_configs_the_kernel_does_not_take(tmp_path, one_line_error, capsys):
    """A float16 model: no effect, one line. A quantised attention: o_proj keeps the unfused path,
    and the dense MLP still decides; an MXFP8 attention is what can_run takes."""
    fp16 = _variant(tmp_path, lambda c: c["text_config"].update(dtype="float16"), "fp16")
    one_line_error(*BASE[:2], fp16, *BASE[3:], "--tp", "8", needle="the model dtype is float16")

    def quant(fmt):
        def edit(c):
            q = c["text_config"]["quantization_config"]
            q["format"] = fmt
            q["ignore"] = [x for x in q["ignore"] if "self_attn" not in x]

        return edit

    fp8 = _variant(tmp_path, quant("float-quantized"), "fp8")
    assert main([*BASE[:2], fp8, *BASE[3:], "--tp", "8"]) == 0
    err = capsys.readouterr().err
    assert (
        "o_proj (MLA) x24: vLLM keeps the unfused path (compressed-tensors float-quantized" in err
    )
    assert "down_proj (dense MLP) x1 (n 7168, k 4224, bf16)" in err
    mx = _variant(tmp_path, quant("mxfp8-quantized"), "mx")
    assert main([*BASE[:2], mx, *BASE[3:], "--tp", "8"]) == 0
    assert "o_proj (KDA) x69 (n 7168, k 1536, mxfp8)" in capsys.readouterr().err
    broken = _variant(
        tmp_path, lambda c: c["text_config"]["quantization_config"].update(ignore=["re:("]), "re"
    )
    one_line_error(*BASE[:2], broken, *BASE[3:], "--tp", "8", needle="is not a regular expression")
    no_heads = _variant(tmp_path, lambda c: c["text_config"].pop("v_head_dim"), "nohead")
    one_line_error(
        *BASE[:2], no_heads, *BASE[3:], "--tp", "8", needle="needs a positive integer 'v_head_dim'"
    )


SCENARIO = r"""
import json, os, sys
from vllm.engine.arg_utils import EngineArgs
def build(**kw):
    args = EngineArgs(model=sys.argv[1], tensor_parallel_size=8, skip_tokenizer_init=True,
                      load_format="dummy", max_num_batched_tokens=8192, max_model_len=8192,
                      enable_prefix_caching=False, **kw)
    args.create_engine_config()
    return {k: os.environ.get(k) for k in ("VLLM_KIMI_K3_GEMM_AR", "VLLM_ENABLE_GEMM_RS")}
out = {"unset": build()}
out["again"] = build()  # idempotent: this process's own value is not mistaken for the user's
os.environ["VLLM_KIMI_K3_GEMM_AR"] = sys.argv[2]
out["user"] = build()
out["sp"] = build(enable_expert_parallel=True, data_parallel_size=2)
print("RESULT " + json.dumps(out))
"""


def test_plugin_sets_the_switch_when_unset_and_keeps_the_users(tmp_path, capsys):
    """Real vLLM 0.31 (EngineArgs -> VllmConfig, the plugin through its entry point): the switch set
    in os.environ to vllm-config's decision when unset, an explicit user value kept (whichever it
    is), GEMM-RS's switch under model-level SP."""
    need("vllm")
    model = tmp_path / "kimi"
    model.mkdir()
    (model / "config.json").write_text(Path(KIMI).read_text())
    assert (
        main(
            [
                "vllm-config",
                "--model",
                str(model),
                "--gpu",
                "b200",
                "--tp",
                "8",
                "--vllm-version",
                "0.31",
                "--kernel-op",
                "gemm_ar",
                "--format",
                "env",
            ]
        )
        == 0
    )
    want = capsys.readouterr().out.strip()[-1]
    assert (
        main(
            [
                "vllm-config",
                "--model",
                str(model),
                "--gpu",
                "b200",
                "--tp",
                "8",
                "--vllm-version",
                "0.31",
                "--kernel-op",
                "gemm_rs",
                "--enable-expert-parallel",
                "--data-parallel-size",
                "2",
                "--format",
                "env",
            ]
        )
        == 0
    )
    want_rs = capsys.readouterr().out.strip()[-1]
    user = "0" if want == "1" else "1"  # the opposite of the decision: it must survive
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("VLLM_KIMI_K3", "VLLM_ENABLE_GEMM_RS"))
    }
    env.update(TPCOST_PROFILE="b200", TPCOST_CACHE_DIR=str(tmp_path / "cache"))
    p = subprocess.run(
        [sys.executable, "-c", SCENARIO, str(model), user],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(next(x for x in p.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert out["unset"] == {"VLLM_KIMI_K3_GEMM_AR": want, "VLLM_ENABLE_GEMM_RS": None}
    assert out["again"] == out["unset"]
    assert out["user"]["VLLM_KIMI_K3_GEMM_AR"] == user
    assert out["sp"] == {"VLLM_KIMI_K3_GEMM_AR": user, "VLLM_ENABLE_GEMM_RS": want_rs}
    log = p.stdout + p.stderr
    assert "set by the user; kept" in log and "VLLM_KIMI_K3_GEMM_AR=" + want in log


def test_plan_cache_rejects_foreign_env():
    from integration import plugin_cache

    base = {"set": [], "said": [], "profile_name": "b200", "profile_tier": "assumed"}
    assert plugin_cache._is_plan({**base, "env": [["VLLM_KIMI_K3_GEMM_AR", "0"]]})
    for bad in ([["LD_PRELOAD", "x"]], [["VLLM_KIMI_K3_GEMM_AR", "yes"]], "VLLM_KIMI_K3_GEMM_AR=1"):
        assert not plugin_cache._is_plan({**base, "env": copy.deepcopy(bad)})


def test_a_workload_context_column_is_refused_for_the_kernel_decision(tmp_path):
    """The one decision path of a kernel model (vllm-config and the plugin) refuses a context_len
    column: the kernel's call sites read no KV cache, so the column would be accepted and
    ignored."""
    from costmodel.errors import TpcostError
    from costmodel.model import Regime, RunConfig
    from costmodel.decide import kernel_model_config

    wl = tmp_path / "w.csv"
    wl.write_text("num_tokens,count,context_len\n2048,10,4096\n")
    run = RunConfig(8, "bf16", Regime(vllm=Vllm((0, 33))), workload=read_workload(str(wl)))
    with pytest.raises(TpcostError, match="context_len column has no effect"):
        kernel_model_config(load_profile("b200"), _kimi(), Parallel(8), "gemm_ar", run)


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (
            lambda c: c.update(num_hidden_layers=10**12),
            "num_hidden_layers = 1000000000000 is above 4096",
        ),
        (lambda c: c.update(hidden_size="7168"), "needs a positive integer 'hidden_size'"),
        (lambda c: c.update(num_shared_experts="2"), "'num_shared_experts' must be an integer"),
        (
            lambda c: c.update(num_shared_experts=-2),
            "'num_shared_experts' must be an integer in [0",
        ),
        (
            lambda c: c.update(first_k_dense_replace=[1]),
            "'first_k_dense_replace' must be an integer",
        ),
        (lambda c: c.update(moe_layer_freq=0), "'moe_layer_freq' must be an integer in [1"),
        (lambda c: c.update(linear_attn_config=5), "linear_attn_config must be an object"),
        (
            lambda c: c.update(num_attention_heads=100),
            "num_attention_heads = 100 is not divisible by tp=8",
        ),
        (lambda c: c.update(v_head_dim=2**30), "v_head_dim = 1073741824 is above"),
        (
            lambda c: c.update(quantization_config={"quant_method": "mxfp8", "ignore": 5}),
            "quantization_config.ignore must be a list of module names",
        ),
        (lambda c: c.update(quantization_config=[1, 2]), "quantization_config must be an object"),
        (
            lambda c: c["linear_attn_config"].update(use_full_rank_gate="yes"),
            "use_full_rank_gate must be true or false",
        ),
    ],
)
def test_mutated_kimi_configs_one_line(tmp_path, one_line_error, mutate, needle):
    """Issue 50, the kernel path's config reader: field types checked, whatif's caps applied (an
    unbounded layer count never ended), a derived shape below zero refused (num_shared_experts -2
    priced K -6144), a head count TP does not divide refused as vLLM refuses it. Each in one line,
    through every mode that reads the field."""
    cfg = json.loads(Path(KIMI).read_text())
    text = cfg.get("text_config", cfg)
    mutate(text)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    one_line_error(
        "vllm-config",
        "--model",
        str(p),
        "--gpu",
        "b200",
        "--tp",
        "8",
        "--kernel-op",
        "gemm_rs",
        "--enable-expert-parallel",
        "--data-parallel-size",
        "2",
        "--shard-sp-shared-expert",
        "--vllm-version",
        "0.33",
        needle=needle,
    )
