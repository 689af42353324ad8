"""vllm-config --format serve (issue 61 item 4): everything for `vllm serve` at once, the
environment and the arguments, equal to what the single-purpose formats print; those keep their own
output."""

import json
import shlex
from pathlib import Path

from integration.cli import main

ROOT = Path(__file__).resolve().parents[1]
KIMI = str(ROOT / "data" / "reference" / "models" / "kimi-k3.config.json")


def _out(capsys, *argv):
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def _serve(lines):
    *env, serve = lines.strip().splitlines()
    words = shlex.split(serve)
    assert words[:2] == ["vllm", "serve"]
    return env, words[3:]


def test_serve_holds_the_compilation_config_and_the_tp(capsys):
    base = [
        "vllm-config",
        "--model",
        "llama-3.1-70b",
        "--tp",
        "4",
        "--gpu",
        "h100-sxm",
        "--vllm-version",
        "0.31",
    ]
    cc = json.loads(_out(capsys, *base, "--format", "json"))
    env, words = _serve(_out(capsys, *base, "--format", "serve"))
    assert env == [] and words[:2] == ["--tensor-parallel-size", "4"]
    assert words[2] == "--compilation-config" and json.loads(words[3]) == cc and len(words) == 4


def test_serve_holds_the_kernel_switch_and_its_config(capsys):
    base = ["vllm-config", "--model", KIMI, "--tp", "8", "--gpu", "b200", "--kernel-op", "gemm_ar"]
    env_line = _out(capsys, *base, "--format", "env").strip()
    cc = json.loads(_out(capsys, *base, "--format", "json"))
    env, words = _serve(_out(capsys, *base, "--format", "serve"))
    assert env == [env_line] and json.loads(words[words.index("--compilation-config") + 1]) == cc


def test_serve_holds_the_dbo_arguments_and_the_setup_they_were_priced_in(capsys):
    base = [
        "vllm-config",
        "--model",
        "deepseek-v3",
        "--gpu",
        "h200-sxm",
        "--enable-expert-parallel",
        "--data-parallel-size",
        "16",
        "--all2all-backend",
        "deepep_low_latency",
        "--vllm-version",
        "0.34",
    ]
    args = _out(capsys, *base, "--format", "args").split()
    env, words = _serve(_out(capsys, *base, "--format", "serve"))
    assert env == [] and words[-len(args) :] == args and args[0] == "--enable-dbo"
    assert words[: -len(args)] == [
        "--data-parallel-size",
        "16",
        "--enable-expert-parallel",
        "--all2all-backend",
        "deepep_low_latency",
    ]


def test_serve_names_the_checkpoint_where_the_model_flag_does(capsys, tmp_path):
    ckpt = tmp_path / "my-70b"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(
        (ROOT / "costmodel" / "models" / "llama-3.1-70b.json").read_text()
    )
    lines = _out(
        capsys,
        "vllm-config",
        "--model",
        str(ckpt / "config.json"),
        "--tp",
        "4",
        "--gpu",
        "h100-sxm",
        "--vllm-version",
        "0.31",
        "--format",
        "serve",
    ).splitlines()
    assert lines[0] == f"MODEL={shlex.quote(str(ckpt))}" and lines[1].startswith(
        'vllm serve "${MODEL:?'
    )
