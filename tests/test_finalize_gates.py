"""Issue 60: vLLM 0.34's fused MoE finalize + all-reduce gates (MiniMax-M3's
FUSED_MOE_FINALIZE_MAX_TOKENS, Muse Spark's _FUSED_ALL_REDUCE_MAX_TOKENS and its two-node constant),
priced by ops.ar_tail_pair (docs/model.md §4b):
the bytes as vLLM's kernels move them, the physics no arm may break, where each gate acts as the
code says, and --nnodes's bad input."""

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from costmodel import formulas as F
from costmodel import load_profile, ops
from costmodel.gates import model_gates
from costmodel.model import Regime, RunConfig
from costmodel.profile import builtin_profile_names
from costmodel.shapes import ArTail, load_model_config, read_kernel_model
from costmodel.vllm_tables import RELEASES, Parallel, Vllm
from integration.cli import main

ROOT = Path(__file__).resolve().parents[1]
MINIMAX = ROOT / "data" / "reference" / "models" / "minimax-m3.config.json"
MUSE = ROOT / "tests" / "fixtures" / "muse-spark.config.json"
V034 = Vllm(max(v for v, r in RELEASES.items() if r.model_gates))
N = np.array([1.0, 2, 8, 32, 33, 128, 256, 257, 1024, 4096, 8192])
TAILS = (ArTail(6144, 4.0, True, True, True, 2), ArTail(8192, 2.0, False, False, False, 1))


def _km(path, edit=None):
    cfg, name, where = load_model_config(str(path))
    if edit:
        cfg = copy.deepcopy(cfg)
        edit(cfg)
    return read_kernel_model(cfg, name, where)


def _fin(profile, km, par, budget=8192):
    (gd,) = [
        g
        for g in model_gates(profile, km, par, RunConfig(par.tp, "bf16", Regime(vllm=V034), budget))
        if g.gate.op == "finalize_ar"
    ]
    return gd


def _nvfp4_mxfp8(c):
    """NVFP4 routed experts (TRTLLM-Gen) and MXFP8 attention: the checkpoint MiniMax-M3's deferred
    finalize needs."""
    c["text_config"]["quantization_config"] = {"quant_method": "mxfp8", "moe_quant_algo": "NVFP4"}


def test_the_bytes_are_vllms():
    """The MXFP8 scales are the 128x4 swizzled layout (finalize_allreduce_norm.mxfp8_scale_numel):
    rows padded to 128, scale columns H/32 padded to 4; a finalize reads each route's row with its
    fp32 weight and int32 index."""
    assert F.mxfp8_quant_bytes(1, 6144, 2.0) == 6144 * 3 + 128 * 192  # 192 blocks of 32 per row
    # 130 blocks -> 132 columns
    assert F.mxfp8_quant_bytes(129, 4160, 2.0) == 129 * 4160 * 3 + 256 * 132
    assert F.moe_finalize_bytes(3, 4, 6144, 2.0, 2.0) == 3 * (4 * (6144 * 2 + 8) + 6144 * 2)
    assert F.add_bytes(5, 8, 2.0) == 5 * 8 * 6


@pytest.mark.parametrize(
    "prof",
    [p for p in builtin_profile_names() if load_profile(p).has_collective("flashinfer_ar_rmsnorm")],
)
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_both_arms_obey_physics(prof, tp):
    """Finite and positive; the fused kernel never beats its own one-shot all-reduce, nor a transfer
    its link at line rate; a faster link never slows either arm; the terms add up to each arm."""
    p = load_profile(prof)
    hw = ops.Hw(p, "bf16")
    link = p.value("interconnect.link_bw_bytes_per_s")
    fast = ops.Hw(p.with_values({"interconnect.link_bw_bytes_per_s": 2 * link}), "bf16")
    for tail in TAILS:
        for cross in (False, True):
            a = ops.ar_tail_pair(hw, tail, N, tp, vllm=V034, cross_host=cross)
            for t in (a.fused_s, a.unfused_s):
                assert np.all(np.isfinite(t)) and np.all(t > 0)
            assert np.all(a.fused_s >= a.t_oneshot_s)
            # the all-reduce's bytes
            line = F.t_link_s(N * tail.hidden * 2.0 * 2 * (tp - 1) / tp, tp, link)
            assert np.all(a.fused_s >= line * (1 - 1e-9)) and np.all(
                a.unfused_s >= line * (1 - 1e-9)
            )
            assert np.allclose(a.fused_s, a.t_oneshot_s + a.t_tail_s)
            assert np.allclose(
                a.unfused_s,
                a.t_finalize_s + a.t_add_s + a.t_all_reduce_s + a.t_norm_s + a.t_quant_s,
            )
            b = ops.ar_tail_pair(fast, tail, N, tp, vllm=V034, cross_host=cross)
            assert np.all(b.fused_s <= a.fused_s * (1 + 1e-12)) and np.all(
                b.unfused_s <= a.unfused_s * (1 + 1e-12)
            )


def test_across_hosts_the_unfused_arm_loses_the_ipc_custom_all_reduce():
    """An NVL72's TP group over two trays: vLLM's custom all-reduce steps aside (mnnvl_only), so no
    size of the unfused arm runs it; the sizes that did not run it are priced as before, and the
    fused kernel is the same."""
    hw = ops.Hw(load_profile("gb300-nvl72"), "bf16")
    one = ops.ar_tail_pair(hw, TAILS[1], N, 8, vllm=V034)
    two = ops.ar_tail_pair(hw, TAILS[1], N, 8, vllm=V034, cross_host=True)
    ca = np.char.startswith(one.unfused_impl.astype(str), "custom_ar")
    assert ca.any() and not np.char.startswith(two.unfused_impl.astype(str), "custom_ar").any()
    assert np.array_equal(two.unfused_s[~ca], one.unfused_s[~ca]) and np.array_equal(
        two.fused_s, one.fused_s
    )


def test_minimax_reaches_its_gate_only_as_the_code_says():
    """The shipped checkpoint (bf16 experts) never defers its finalize; an NVFP4 + MXFP8 one does at
    TP > 1 without EP on the SM100 family with multicast; the value is priced for the shapes either
    way."""
    b200 = load_profile("b200")
    shipped = _fin(b200, _km(MINIMAX), Parallel(4))
    assert (
        shipped.vllm_tokens == 32
        and "TRTLLM-Gen NVFP4" in shipped.applies
        and shipped.tpcost_tokens
    )
    km = _km(MINIMAX, _nvfp4_mxfp8)
    gd = _fin(b200, km, Parallel(4))
    assert gd.applies is None and gd.constant == "FUSED_MOE_FINALIZE_MAX_TOKENS"
    (site,) = gd.sites
    # the last layer keeps its own finalize
    assert site.calls_per_forward == km.num_moe_layers() - 1
    assert site.tail == ArTail(6144, 4.0, True, True, True, 2)
    lo, hi = gd.band_tokens
    assert (lo or 0) <= gd.tpcost_tokens <= (hi or np.inf)
    assert "expert parallel" in _fin(b200, km, Parallel(4, enable_expert_parallel=True)).applies
    assert "SM100" in _fin(load_profile("h100-sxm"), km, Parallel(4)).applies
    assert "TP 1" in _fin(b200, km, Parallel(1)).applies
    bf16_qkv = _km(
        MINIMAX,
        lambda c: c["text_config"].update(
            quantization_config={"quant_method": "modelopt", "moe_quant_algo": "NVFP4"}
        ),
    )
    assert "MXFP8" in _fin(b200, bf16_qkv, Parallel(4)).applies


def test_muse_sparks_fused_range_shrinks_from_tp4_to_tp8():
    """A one-shot all-reduce brings (W-1)·S into each GPU: Muse Spark's fused range falls from TP 4
    to TP 8 on every SM100 profile, as vLLM's comment measured on GB300 ("TP4 gains up to 256
    tokens, two-node TP8 only to 128"). Not a law: MiniMax-M3's unfused arm changes implementation
    with TP too (B300 TP 8: multimem + a separate norm)."""
    for gpu in ("b200", "b300", "gb200-nvl72", "gb300-nvl72"):
        prof = load_profile(gpu)
        four = _fin(prof, _km(MUSE), Parallel(4, enable_expert_parallel=True)).tpcost_tokens
        eight = _fin(prof, _km(MUSE), Parallel(8, enable_expert_parallel=True)).tpcost_tokens
        assert eight < four, (gpu, four, eight)


def test_muse_spark_takes_its_multi_node_constant_where_the_tp_group_spans_trays(capsys):
    km = _km(MUSE)
    gb300 = load_profile("gb300-nvl72")
    one = _fin(gb300, km, Parallel(8, enable_expert_parallel=True))
    two = _fin(gb300, km, Parallel(8, enable_expert_parallel=True, nnodes=2))
    assert (one.vllm_tokens, one.constant, one.multi_node) == (
        256,
        "_FUSED_ALL_REDUCE_MAX_TOKENS",
        False,
    )
    assert (two.vllm_tokens, two.constant, two.multi_node) == (
        128,
        "_MULTI_NODE_FUSED_ALL_REDUCE_MAX_TOKENS",
        True,
    )
    assert two.sites[0].cross_host and not one.sites[0].cross_host
    assert two.tpcost_tokens <= one.tpcost_tokens  # the unfused arm only loses a path across trays
    # 8 / EP 4
    assert (
        _fin(gb300, km, Parallel(4, enable_expert_parallel=True)).sites[0].tail.routed_rows == 2.0
    )
    for par, why in (
        (Parallel(4), "--enable-expert-parallel"),
        (
            Parallel(4, enable_expert_parallel=True, moe_backend="deep_gemm_mega_moe"),
            "model-level SP",
        ),
        (Parallel(4, data_parallel_size=2, enable_expert_parallel=True), "DP 1 only"),
    ):
        assert why in _fin(gb300, km, par).applies, (par, why)
    argv = [
        "vllm-config",
        "--model",
        str(MUSE),
        "--gpu",
        "gb300-nvl72",
        "--tp",
        "8",
        "--vllm-version",
        "0.34",
        "--enable-expert-parallel",
        "--nnodes",
        "2",
        "--json",
    ]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    (g,) = [g for g in json.loads(out)["model_gates"] if g["op"] == "finalize_ar"]
    assert (
        g["constant"] == "_MULTI_NODE_FUSED_ALL_REDUCE_MAX_TOKENS"
        and g["vllm_tokens"] == 128
        and g["applies"]
    )
    assert g["sites"][0]["routed_rows"] == 1.0 and "NaN" not in out
    assert "vLLM fuses at N <= 128 (the TP group spans hosts)" in err


@pytest.mark.parametrize(
    "extra,needle",
    [
        (("--nnodes", "0"), "--nnodes must be in [1, 4096]"),
        (("--nnodes", "two"), "--nnodes"),
        (("--nnodes", "3"), "do not split evenly over the hosts"),
        (("--nnodes", "2", "--gpu", "b300"), "outside b300's NVLink domain"),
        (
            ("--tp", "4", "--data-parallel-size", "32", "--nnodes", "4"),
            "a gb300-nvl72 host holds 4",
        ),
    ],
)
def test_nnodes_bad_input_is_one_line(capsys, extra, needle):
    argv = [
        "vllm-config",
        "--model",
        str(MUSE),
        "--gpu",
        "gb300-nvl72",
        "--tp",
        "8",
        "--vllm-version",
        "0.34",
        "--enable-expert-parallel",
        *extra,
    ]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert not out and err.count("\n") == 1 and needle in err and "Traceback" not in err, err


def test_nnodes_is_refused_where_nothing_reads_it(capsys):
    assert (
        main(
            [
                "vllm-config",
                "--model",
                "llama-3.1-70b",
                "--gpu",
                "b200",
                "--tp",
                "8",
                "--nnodes",
                "2",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--nnodes: read only for" in err


def test_deepseek_v41s_mhc_overlap_is_named_with_why_it_is_not_priced(capsys):
    """No DeepSeek-V4.1 config with hc_mult ships: the fixture
    (tests/fixtures/deepseek-v41.SOURCE.md) is shaped as vLLM 0.34 reads one, and vllm-config names
    MHC_OVERLAP_MAX_TOKENS with its one-line reason."""
    argv = [
        "vllm-config",
        "--model",
        str(ROOT / "tests" / "fixtures" / "deepseek-v41.config.json"),
        "--gpu",
        "gb200-nvl72",
        "--tp",
        "4",
        "--vllm-version",
        "0.34",
    ]
    assert main([*argv, "--json"]) == 0
    inv = {g["name"]: g for g in json.loads(capsys.readouterr().out)["gate_inventory"]}
    mhc = inv["MHC_OVERLAP_MAX_TOKENS"]
    assert mhc["value"] == "16" and mhc["measured"] == "GB200 TP4 (FlashInfer)"
    assert mhc["status"].startswith("not modelled") and "second stream" in mhc["status"]
    assert main(argv) == 0
    line = next(
        x for x in capsys.readouterr().err.splitlines() if "MHC_OVERLAP_MAX_TOKENS = 16" in x
    )
    assert "not modelled" in line and "hc_mult" in line
