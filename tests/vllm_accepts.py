"""Shared by the vLLM scenario scripts (run by the tests in a fresh process, each in its own
venv)."""

import json

from vllm.config import CompilationConfig


def accepted(texts):
    """Each `tpcost vllm-config --format json` output handed to vLLM's own CompilationConfig: what
    it kept."""
    out = []
    for text in texts:
        given = json.loads(text)["pass_config"]
        pc = CompilationConfig(**json.loads(text)).pass_config
        out.append({k: getattr(pc, k) for k in given})
    return out
