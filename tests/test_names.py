"""Built-in names as people type them (issue 61): case does not matter, a unique beginning names one
built-in, an ambiguous one is one line naming the candidates; a path is never read as a name;
profiles --keys takes a file."""

from __future__ import annotations

import json

import pytest
from conftest import sp_release_flag

from costmodel.io import match_builtin
from costmodel.errors import TpcostError
from integration.cli import main


@pytest.mark.parametrize(
    "typed,meant",
    [
        ("h100-sxm", "h100-sxm"),
        ("H100-SXM", "h100-sxm"),
        ("h100", "h100-sxm"),
        ("H20", "h20"),
        ("gb300", "gb300-nvl72"),
    ],
)
def test_gpu_names(typed, meant, capsys):
    assert main(["whatif", "--gpu", typed, "--no-band", "--json", "--tokens", "64"]) == 0
    assert json.loads(capsys.readouterr().out)["gpu"] == meant


def test_model_and_network_names(capsys):
    assert (
        main(["whatif", "--model", "Llama-3.1-70B", "--no-band", "--json", "--tokens", "64"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["model"] == "llama-3.1-70b"
    assert (
        main(
            [
                "ep",
                "--enable-expert-parallel",
                "--model",
                "DeepSeek-V3",
                "--network",
                "EFA-P5",
                "--json",
                "--tokens",
                "8",
            ]
        )
        == 0
    )
    s = json.loads(capsys.readouterr().out)["setup"]
    assert s["model"] == "deepseek-v3" and s["network"] == "efa-p5"


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["whatif", "--gpu", "a", "--no-band"], "matches several built-ins: a100-sxm-80gb, a800"),
        (["whatif", "--gpu", "h100.toml", "--no-band"], "h100.toml"),
        (["whatif", "--model", "llama/x.json", "--no-band"], "no such file"),
        (["profiles", "--keys", "nope"], "unknown GPU profile 'nope'"),
    ],
)
def test_ambiguous_or_unknown_is_one_line(argv, msg, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and msg in err, err


def test_match_builtin_rules():
    names = ["h20", "h200-sxm", "h100-sxm"]
    # the exact name wins over a longer one it begins
    assert match_builtin("h20", names, "GPU") == "h20"
    assert match_builtin("H200", names, "GPU") == "h200-sxm"
    assert match_builtin("x.toml", names, "GPU") is None and match_builtin("", names, "GPU") is None
    with pytest.raises(TpcostError, match="several"):
        match_builtin("h", names, "GPU")


def test_profiles_keys_takes_a_file(tmp_path, capsys):
    assert (
        main(["profiles", "--new", "mine", "--from", "h100-sxm", "--out", str(tmp_path / "m.toml")])
        == 0
    )
    capsys.readouterr()
    assert main(["profiles", "--keys", str(tmp_path / "m.toml"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["profile"] == "mine" and any(
        k["key"] == "memory.hbm_bw_bytes_per_s" for k in d["keys"]
    )


def test_op_names_its_overrides(capsys):
    """op --set leaves a trace in its header and JSON, as whatif's does (issue 61)."""
    argv = [
        "op",
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
        "0.31",
        "--set",
        "memory.hbm_bw_bytes_per_s=4e12",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "[MODIFIED by --set: memory.hbm_bw_bytes_per_s]" in out.splitlines()[0]
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["modified"] == ["memory.hbm_bw_bytes_per_s"]
    assert main(argv[:-2] + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["modified"] == []


def test_vllm_config_json_carries_the_saving(capsys):
    """Issue 61 item 3: the report says what the emitted config saves per forward, and as a share of
    it."""
    assert main(["vllm-config", "--gpu", "h100-sxm", "--json", "--vllm-version", "0.31"]) == 0
    s = json.loads(capsys.readouterr().out)["saving"]
    sp = s["sp"]
    assert sp["saving_vs_never_s"] > 0 and 0 < sp["share_of_forward"] < 1
    assert sp["share_of_forward"] == pytest.approx(
        sp["saving_vs_never_s"] / sp["expected_forward_s"]
    )
    assert s["fusion"]["saving_vs_off_s"] >= 0


def test_whatif_prints_the_crossover_beside_the_cutoff(capsys):
    """Issue 61 item 13: the crossover (no premium, any traffic) is named apart from the
    traffic-weighted cutoff."""
    import numpy as np

    argv = [
        "whatif",
        "--no-band",
        *sp_release_flag(),
        "--tp",
        "2",
        "--json",
        "--tokens",
        "512",
        "1024",
        "2048",
        "4096",
        "8192",
    ]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    c = d["crossover_tokens"]
    assert c is not None and c != d["cutoff_tokens"]
    rows = [r for r in d["rows"] if r["num_tokens"] >= c]
    assert rows and all(r["speedup_sp_asynctp"] > 1 for r in rows)
    assert main(["whatif", "--no-band", *sp_release_flag(), "--tp", "2"]) == 0
    assert "crossover (faster than plain TP" in capsys.readouterr().out
    assert np.isfinite(c)


def test_whatif_marks_host_bound_rows(capsys):
    """Issue 61 item 14: the flat stretch of 70B TP 4 SP+AsyncTP is marked host-bound (its eager
    host issue time exceeds its GPU time), in text and JSON; a graph-replayed row never is."""
    argv = ["whatif", "--no-band", "--vllm-version", "0.31", "--tokens", "512", "1024", "1536"]
    assert main([*argv, "--json"]) == 0
    rows = {r["num_tokens"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows[512]["host_bound"] == [] and "sp_asynctp" in rows[1024]["host_bound"]
    # a flat stretch: the host's issue time, whatever the GPU does
    assert "sp_asynctp" in rows[1536]["host_bound"]
    assert rows[1024]["t_sp_asynctp_s"] == pytest.approx(rows[1536]["t_sp_asynctp_s"])
    assert main(argv) == 0
    assert "host-bound: sp_asynctp" in capsys.readouterr().out


def test_the_cutoff_in_mib_per_gpu(capsys):
    """Issue 61 item 12: the cutoff in vLLM #27700's unit, 2 B x hidden x N / tp, in text and
    JSON."""
    assert main(["whatif", "--no-band", "--vllm-version", "0.31", "--json", "--tokens", "64"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["cutoff_mib_per_gpu"] == pytest.approx(d["cutoff_tokens"] * 8192 * 2 / 4 / 2**20)
    assert main(["whatif", "--no-band", "--vllm-version", "0.31", "--tokens", "64"]) == 0
    assert "MiB per GPU" in capsys.readouterr().out
