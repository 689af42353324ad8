"""README.md: its commands name what they need, and the serve form stops when tpcost fails."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from integration.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _readme_block(name):
    text = (ROOT / "README.md").read_text()
    m = re.search(rf"<!-- {name} -->\n```bash\n(.*?)```\n<!-- /{name} -->", text, re.S)
    assert m, name
    return m.group(1)


def _readme_and_commands():
    return (ROOT / "README.md").read_text() + (ROOT / "docs" / "commands.md").read_text()


def _prose_sentences(text: str) -> list[str]:
    """The README's sentences: fenced blocks and HTML comments out, each table cell one sentence."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    parts = []
    for para in re.split(r"\n\s*\n", text):
        if para.lstrip().startswith("|"):
            parts += [c for line in para.splitlines() for c in line.split("|") if c.strip(" -")]
        else:
            parts += re.split(r"(?<=[.!?])\s+", " ".join(para.split()))
    return [p.strip() for p in parts if p.strip()]


def test_readme_reads_in_five_minutes():
    """Issue 57 item 6: at most 120 lines, and no sentence over 25 words (the test-command block
    exempt)."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 120
    long = [s for s in _prose_sentences(text) if len(s.split()) > 25]
    assert not long, long
    assert _prose_sentences("One two.\n\n```\nx y z\n```\nThree four five. Six.") == [
        "One two.",
        "Three four five.",
        "Six.",
    ]
    assert any(len(s.split()) > 25 for s in _prose_sentences("word " * 26 + "end."))


def test_readme_serve_form_runs_as_typed(tmp_path):
    """Issue 50 item 2: the README's serve form, run by bash with a stand-in `vllm` that records its
    arguments, on a host with no GPU. The real tpcost hands vLLM the JSON; a failing tpcost (a
    stand-in that exits 2) never reaches vLLM, leaves the shell running (typed at a prompt, the next
    command runs) and gives the form tpcost's status."""
    block = _readme_block("serve-form")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "vllm").write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path}/vllm-args\n")
    (bindir / "vllm").chmod(0o755)
    path = f"{bindir}:{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    assert shutil.which("tpcost", path=path), (
        "the tpcost entry point is installed beside this python"
    )
    env = {k: v for k, v in os.environ.items() if k != "TPCOST_PROFILE"}
    good = subprocess.run(
        ["bash", "-c", block],
        env={**env, "PATH": path},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert good.returncode == 0, good.stderr
    args = (tmp_path / "vllm-args").read_text().splitlines()
    assert args[-2] == "--compilation-config" and "pass_config" in json.loads(args[-1])
    (tmp_path / "vllm-args").unlink()
    failing = tmp_path / "failing"
    failing.mkdir()
    (failing / "tpcost").write_text(
        "#!/bin/sh\necho 'tpcost: error: stand-in failure' >&2\nexit 2\n"
    )
    (failing / "tpcost").chmod(0o755)
    bad = subprocess.run(
        ["bash", "-c", block + "\necho status $?; echo shell-still-open"],
        env={**env, "PATH": f"{failing}:{path}"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert not (tmp_path / "vllm-args").exists(), bad.stderr
    assert bad.stdout.splitlines() == ["status 2", "shell-still-open"], bad.stdout + bad.stderr


def test_readme_model_paths_ship_and_a_missing_one_says_so(capsys):
    """Issue 50 item 6: every config.json path the README and docs/commands.md pass to --model is in
    the repository, and a path that does not exist gets "no such file", not "unknown model"."""
    text = _readme_and_commands()
    paths = set(re.findall(r"--model ([\w./-]+\.json)", text))
    assert paths and all((ROOT / p).is_file() for p in paths), paths
    assert main(["whatif", "--model", "kimi-k3/config.json", "--tp", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no such file" in err and "unknown model" not in err


def test_readme_commands_name_what_they_need():
    text = _readme_and_commands()
    for line in text.splitlines():
        if "tpcost validate" in line and line.strip().startswith("torchrun"):
            assert "--model" in line, line
    # docs' CPU model
    assert main(["whatif", "--model", "cpu-tiny", "--tp", "2", "--no-band", "--dtype", "fp32"]) == 0
