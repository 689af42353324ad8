"""costmodel.layer: the per-rank layer's slots by hand, and whatif's JSON reads them."""

import json
from pathlib import Path

import pytest

from costmodel.layer import LayerSpec
from costmodel.shapes import load_model
from integration.cli import main

ROOT = Path(__file__).resolve().parents[1]


MOE = str(ROOT / "tests" / "fixtures" / "moe-tiny" / "config.json")


def test_llama70b_tp4_slots_by_hand():
    """Llama-3.1-70B: H 8192, 64 heads of 128, 8 KV heads, intermediate 28672; TP 4 (vLLM's
    sharding)."""
    spec = LayerSpec.build(load_model("llama-3.1-70b"), 4, "fp8")
    got = {s.name: (s.n, s.k, s.fuses) for s in spec.slots}
    assert got == {
        "qkv": ((16 + 2 * 2) * 128, 8192, "ag_gemm"),
        "o": (8192, 16 * 128, "gemm_rs"),
        "gate_up": (2 * 7168, 8192, "ag_gemm"),
        "down": (8192, 7168, "gemm_rs"),
    }
    assert [s.name for s in spec.slots] == ["qkv", "o", "gate_up", "down"]  # execution order
    # fp8 in, bf16 partials out
    assert spec.slot("qkv").in_bytes == 1.0 and spec.slot("o").out_bytes == 2.0
    assert spec.reduce_msg_bytes(64) == 64 * 8192 * 2
    # replicated below 1
    assert LayerSpec.build(load_model("llama-3.1-70b"), 16, "bf16").kv_heads_per_rank == 1


def test_moe_fixture_slots_by_hand():
    """Mixtral-style fixture: 8 experts top-2, expert intermediate 14336: router replicated, experts
    unfused."""
    spec = LayerSpec.build(load_model(MOE), 4, "bf16")
    assert [s.name for s in spec.slots] == ["qkv", "o", "router"]
    assert spec.slot("router").n == 8 and spec.slot("router").fuses is None
    assert spec.intermediate_per_rank == 14336 // 4
    assert ("expert_gate_up", 2 * 3584, 4096, None) in spec.rank_gemms()


def test_whatif_json_uses_the_layer(capsys):
    """--ops names each GEMM by its slot's shape: the qkv GEMM at N = 64 is 2·64·2560·8192 FLOP (by
    hand)."""
    assert main(["whatif", "--ops", "64", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    qkv = next(r for r in d["ops"]["tp"] if r["op"] == "qkv_gemm")
    assert qkv["achieved_flops_per_s"] * qkv["t_s"] == pytest.approx(2 * 64 * 2560 * 8192)
