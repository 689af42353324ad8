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


def test_readme_serve_form_stops_when_tpcost_fails(tmp_path):
    """The README's `cc=$(tpcost vllm-config ...) || exit 1; vllm serve ... "$cc"`, run by bash with a stand-in
    `vllm` that records its arguments: a failing tpcost never reaches vLLM; a working one hands it the JSON."""
    block = _readme_block("serve-form")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "vllm").write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path}/vllm-args\n")
    (bindir / "vllm").chmod(0o755)
    path = f"{bindir}:{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    assert shutil.which("tpcost", path=path), "the tpcost entry point is installed beside this python"
    bad = subprocess.run(["bash", "-c", block], env={**os.environ, "PATH": path, "TPCOST_PROFILE": "no-such-gpu"},
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and not (tmp_path / "vllm-args").exists(), bad.stderr
    good = subprocess.run(["bash", "-c", block], env={**os.environ, "PATH": path, "TPCOST_PROFILE": "h100-sxm"},
                          capture_output=True, text=True, timeout=120)
    assert good.returncode == 0, good.stderr
    args = (tmp_path / "vllm-args").read_text().splitlines()
    assert args[-2] == "--compilation-config" and "pass_config" in json.loads(args[-1])


def test_readme_commands_name_what_they_need():
    text = (ROOT / "README.md").read_text()
    for line in text.splitlines():
        if "tpcost validate" in line and line.strip().startswith("torchrun"):
            assert "--model" in line, line
    assert main(["whatif", "--model", "cpu-tiny", "--tp", "2", "--no-band", "--dtype", "fp32"]) == 0  # docs' CPU model
