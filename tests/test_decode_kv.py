"""Decode steps read their KV cache (#33 item 1) and the `host` bound only where host time is charged (item 4)."""

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
