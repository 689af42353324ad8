"""Against the real vLLM 0.32 (CPU build, its own venv: README test command): no SP/AsyncTP passes
there, so tpcost sets the FlashInfer all-reduce+RMSNorm fusion range. The plugin's value lands in
pass_config in a real create_engine_config(), the compile ranges split there, a user value wins, and
`tpcost vllm-config` for 0.32 emits JSON that vLLM 0.32's CompilationConfig accepts, with no SP key.
Only TPCOST_PROFILE=h100-sxm is set:
on CPU vLLM's own fusion table is empty and fuse_allreduce_rms defaults to False, so the configs
enable it."""

import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from integration.cli import main
from costmodel.vllm_tables import Vllm
from integration.recommend import installed_version

ROOT = Path(__file__).resolve().parents[1]
MODEL = str(ROOT / "tests" / "fixtures" / "llama-h8192-tiny")
VERSION = installed_version()
pytestmark = pytest.mark.skipif(
    VERSION is None or VERSION < (0, 32), reason="needs vLLM >= 0.32 (the second test venv)"
)


def _vllm_config(*argv):
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["vllm-config", "--format", "json", "--gpu", "h100-sxm", *argv]) == 0
    return buf.getvalue().strip()


@pytest.fixture(scope="module")
def scenarios():
    jsons = [
        _vllm_config("--model", "llama-3.1-70b", "--tp", "4"),
        _vllm_config("--model", "llama-3.1-8b", "--tp", "2"),
        _vllm_config("--model", MODEL, "--tp", "4", "--fi-allreduce-fusion-max-size-mb", "12"),
    ]
    env = {
        **os.environ,
        "TPCOST_PROFILE": "h100-sxm",
        "VLLM_PLUGINS": "tpcost",
        "VLLM_LOGGING_LEVEL": "INFO",
    }
    env.pop("TPCOST_DISABLE", None)
    r = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "vllm032_scenarios.py"), MODEL, *jsons],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and line, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(line[0][7:]), r.stdout + r.stderr, jsons


# where tpcost enables the fusion (at TP 2 it never wins on H100)
@pytest.mark.parametrize("tp", [4, 8])
def test_plugin_sets_the_fusion_range_and_ranges_split_there(scenarios, tp):
    from costmodel import load_model, load_profile
    from costmodel.decide import recommend

    res, log, _ = scenarios
    got = res[f"plugin_tp{tp}"]
    assert got["has_sp_fields"] is False
    from costmodel.model import Regime, RunConfig
    from costmodel.decide import UserChoices

    r = recommend(
        load_profile("h100-sxm"),
        load_model(MODEL),
        RunConfig(tp, "bf16", Regime(vllm=Vllm(VERSION))),
        UserChoices(fuse_allreduce_rms=True),
    )
    assert r.fusion.tokens > 0
    assert got["fi_allreduce_fusion_max_size_mb"] == r.fusion.mb
    assert got["fuse_allreduce_rms"] is True and r.fusion.tokens in got["endpoints"]
    # the installed version's tables
    assert f"fused up to {r.fusion.tokens} tokens; vLLM 0.32's tables" in log


def test_user_value_and_fusion_off_are_left_alone(scenarios):
    res, _, _ = scenarios
    assert res["user_value_tp4"]["fi_allreduce_fusion_max_size_mb"] == 12
    # 12 MiB at hidden 8192, bf16: int(12·MiB) // 16384 = 768
    assert 768 in res["user_value_tp4"]["endpoints"]
    assert res["fusion_off_tp4"]["fuse_allreduce_rms"] is False
    assert res["fusion_off_tp4"]["fi_allreduce_fusion_max_size_mb"] is None


def test_vllm_config_json_for_032_is_accepted_and_has_no_sp_key(scenarios):
    res, _, jsons = scenarios
    given = [json.loads(j)["pass_config"] for j in jsons]
    assert res["vllm_config_json_accepted"] == given
    for pc in given:
        assert not {"enable_sp", "fuse_gemm_comms", "sp_min_token_num"} & set(pc)
        assert "fuse_allreduce_rms" in pc
    # the user's value
    assert given[2] == {
        "fuse_allreduce_rms": True,
        "fi_allreduce_fusion_max_size_mb": 12.0,
    }


def test_vllm_config_reads_the_installed_version(capsys):
    assert main(["vllm-config", "--gpu", "h100-sxm", "--tp", "4"]) == 0
    err = capsys.readouterr().err
    assert f"config for vLLM {VERSION[0]}.{VERSION[1]} (installed distribution vllm" in err
    assert "has no SP/AsyncTP passes" in err
