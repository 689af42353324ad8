"""Accuracy IV (#33): decode steps read their KV cache (item 1), SP padding rows route as one token (item 3), the `host` bound only where host time is charged (item 4)."""

import json

import pytest

from costmodel import formulas as F
from costmodel import load_model, load_profile
from integration.cli import main


def _t64(capsys, *extra):
    assert main(["whatif", "--gpu", "h100-sxm", "--model", "llama-3.1-70b", "--tp", "4", "--tokens", "64", "--no-band",
                 "--json", *extra]) == 0
    return next(r for r in json.loads(capsys.readouterr().out)["rows"] if r["num_tokens"] == 64)["t_tp_s"]


def test_kv_read_grows_with_the_context(capsys):
    """64 decodes at context C read 64·C·2·max(1, kv/tp)·d·b per rank and layer, at the attention kernel's
    efficiency of HBM: the step grows by exactly that between C = 512 and 8192 (within 20 %), at least 5 ms."""
    t0, t512, t8k = _t64(capsys), _t64(capsys, "--context-len", "512"), _t64(capsys, "--context-len", "8192")
    assert t0 < t512 < t8k and t8k - t512 >= 5e-3
    prof, shape = load_profile("h100-sxm"), load_model("llama-3.1-70b")
    kv = F.kv_cache_read_bytes(64, 8192 - 512, shape.kv_heads_per_rank(4), shape.head_dim, 2.0) * shape.num_layers
    want = kv / (prof.memory.hbm_bw_bytes_per_s * prof.attention.efficiency)
    assert (t8k - t512) == pytest.approx(want, rel=0.2)


def test_max_num_seqs_bounds_the_decodes(capsys, one_line_error):
    few = _t64(capsys, "--context-len", "8192", "--max-num-seqs", "16")
    many = _t64(capsys, "--context-len", "8192")
    assert few < many  # 16 decodes + 48 prefill tokens read a quarter of the KV
    one_line_error("whatif", "--max-num-seqs", "16", needle="give --context-len too")
    one_line_error("whatif", "--context-len", "0", needle="--context-len must be in")
    one_line_error("vllm-config", "--model", "tests/fixtures/kimi-k3.config.json", "--gpu", "b200", "--tp", "8",
                   "--context-len", "1024", needle="--context-len: no effect")


def test_host_bound_only_when_host_time_is_charged(capsys):
    """Below the capture size graphs replay and no op is host-bound; the same step run eagerly has ops whose host
    issue time exceeds their GPU time."""
    assert main(["whatif", "--ops", "32", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert all(r["bound"] != "host" for rows in d["ops"].values() for r in rows)
    assert main(["whatif", "--ops", "32", "--enforce-eager", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert any(r["bound"] == "host" for rows in d["ops"].values() for r in rows)


QWEN3_LIKE = {"hidden_size": 4096, "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128,
              "num_hidden_layers": 94, "moe_intermediate_size": 1536, "num_experts": 128, "num_experts_per_tok": 8,
              "vocab_size": 151936}  # Qwen3-235B-A22B's published shape


def test_sp_padding_rows_route_as_one_token():
    """At TP 8 SP pads 1 token to 8 rows; the 7 padding rows are identical zero rows, routed to one token's experts:
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
        t_mem = w / (prof.memory.hbm_bw_bytes_per_s * prof.gemm.mem_efficiency) + 3 * prof.gemm.launch_overhead_s
        assert float(o.t_s[0]) == pytest.approx(t_mem, rel=1e-9)
    assert float(pred.speedup("sp")[0]) > 0.5  # was 0.394 with the padding routed as 7 more tokens
