"""The inputs operators bring: a memory check, a profile for new hardware, MoE expert reads."""

import json

import numpy as np
import pytest
from conftest import sp_release_flag

from costmodel import formulas as F
from costmodel import load_model, load_profile
from costmodel.profile import builtin_profile_names, profile_from_dict, profile_to_tree
from integration.cli import main


def test_expected_experts_touched_by_hand():
    # E = 8, k = 2: one token touches 2; many tokens touch all 8; N·k << E gives ≈ N·k
    assert F.expected_experts_touched(1, 2, 8) == pytest.approx(2.0)
    assert F.expected_experts_touched(1000, 2, 8) == pytest.approx(8.0)
    assert F.expected_experts_touched(3, 1, 256) == pytest.approx(256 * (1 - (255 / 256) ** 3))
    assert F.expected_experts_touched(3, 1, 256) < 3.0


def test_weights_that_do_not_fit_are_noted(capsys):
    assert (
        main(["whatif", "--model", "llama-3.1-405b", "--tp", "2", "--no-band", "--tokens", "1024"])
        == 0
    )
    out = capsys.readouterr().out
    assert "llama-3.1-405b does not fit" in out and "80 GB" in out
    assert main(["whatif", "--model", "llama-3.1-405b", "--tp", "2", "--no-band", "--json"]) == 0
    mem = json.loads(capsys.readouterr().out)["memory"]
    assert mem["fits"] is False and mem["weights_per_gpu_bytes"] > 4e11
    assert main(["whatif", "--model", "llama-3.1-8b", "--tp", "2", "--no-band", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["memory"]["fits"] is True
    # by hand: llama-3.1-8b has ~8.03e9 parameters; at tp 1 in bf16 that is ~16 GB
    from costmodel.layer import LayerSpec

    assert LayerSpec.build(
        load_model("llama-3.1-8b"), 1, "bf16"
    ).params_per_rank() == pytest.approx(8.03e9, rel=0.01)


@pytest.mark.parametrize("name", builtin_profile_names())
def test_every_builtin_has_a_capacity_and_round_trips(name):
    p = load_profile(name)
    assert (
        p.value("memory.hbm_capacity_bytes") > 1e10
        and p.provenance["memory.hbm_capacity_bytes"].tier == "datasheet"
    )
    q = profile_from_dict(profile_to_tree(p), "round-trip")
    assert q.values() == p.values() and q.provenance == p.provenance


def test_new_profile_from_builtin_with_faster_link(tmp_path, capsys):
    out = tmp_path / "h100-nvl5.toml"
    assert (
        main(
            [
                "profiles",
                "--new",
                "h100-nvl5",
                "--from",
                "h100-sxm",
                "--set",
                "interconnect.link_bw_bytes_per_s=900e9",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    capsys.readouterr()
    p, base = load_profile(str(out)), load_profile("h100-sxm")
    assert p.name == "h100-nvl5" and p.value("interconnect.link_bw_bytes_per_s") == 900e9
    assert p.provenance["interconnect.link_bw_bytes_per_s"].tier == "assumed"
    k = "collectives.nccl_all_reduce.tp4.bus_bw_bytes_per_s"
    # rides on the link
    assert p.value(k) == pytest.approx(2 * base.value(k)) and p.provenance[k].tier == "assumed"
    # untouched
    assert (
        p.provenance["gemm.max_efficiency"].source == base.provenance["gemm.max_efficiency"].source
    )
    cut = {}
    for gpu in ("h100-sxm", str(out)):
        assert main(["whatif", "--gpu", gpu, "--no-band", "--json", *sp_release_flag()]) == 0
        cut[gpu] = json.loads(capsys.readouterr().out)["cutoff_tokens"]
    assert cut["h100-sxm"] != cut[str(out)]
    rc = main(["profiles", "--new", "again", "--from", "h100-sxm", "--out", str(out)])
    assert rc == 2 and "--force" in capsys.readouterr().err
    rc = main(
        [
            "profiles",
            "--new",
            "bad",
            "--from",
            "h100-sxm",
            "--set",
            "gemm.max_efficiency=3",
            "--out",
            str(tmp_path / "bad.toml"),
        ]
    )
    assert rc == 2 and not (tmp_path / "bad.toml").exists()


def test_moe_reads_fewer_experts_at_small_n():
    cfg = dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_hidden_layers=32,
        vocab_size=32000,
        num_local_experts=64,
        num_experts_per_tok=2,
        moe_intermediate_size=1408,
    )
    from costmodel import predict
    from costmodel.shapes import shape_from_config

    moe = shape_from_config(cfg, "moe-64")
    pred = predict(load_profile("h100-sxm"), moe, 2, "bf16", np.array([4.0, 16.0, 4096.0]))
    t = next(o.t_s for o in pred.schedules["tp"].layer_ops if o.name == "moe_experts")
    assert t[0] < t[1] < t[2]
