"""vLLM 0.31's own SP threshold table, reproduced to compare tpcost's cutoff with vLLM's default (whatif,
evaluate's "vLLM 0.31 rule"). vLLM's all-reduce dispatch and FlashInfer fusion limits are in
costmodel/vllm_tables.py (derived per version, GPU and TP by its `dispatch`).

Sources (vLLM v0.31.0):
- vllm/compilation/passes/fusion/sequence_parallelism.py: SP_MIN_HIDDEN_SIZE, SP_MIN_PER_GPU_SIZE_MB,
  get_sequence_parallelism_threshold (XPU: hidden >= 4096 and 8 MiB).
"""

from __future__ import annotations

from .formulas import MiB
SP_MIN_HIDDEN_SIZE = {90: 8192, 100: 8192}
SP_MIN_PER_GPU_SIZE_MB = {90: 8.0, 100: 32.0}


def capability_bucket(vendor: str, compute_capability: str) -> int | None:
    """vLLM's device-capability key: major*10+minor on CUDA, Blackwell family (10.x) collapsed to 100."""
    if vendor != "nvidia":
        return None
    try:
        major, minor = (int(x) for x in compute_capability.split("."))
    except ValueError:
        return None
    return 100 if major == 10 else major * 10 + minor


def vllm_sp_min_token_num(vendor: str, compute_capability: str, hidden_size: int, tp_size: int,
                          element_size: int = 2) -> int | None:
    """vLLM 0.31 get_sequence_parallelism_threshold: floor(MB·tp·MiB/(hidden·elem)), None = SP off (always at
    tp 1: VllmConfig.__post_init__, "Sequence Parallelism requires TP>1, disabling")."""
    if tp_size < 2:
        return None
    if vendor == "intel":
        min_hidden, mb = 4096, 8.0
    else:
        cap = capability_bucket(vendor, compute_capability)
        if cap not in SP_MIN_HIDDEN_SIZE:
            return None
        min_hidden, mb = SP_MIN_HIDDEN_SIZE[cap], SP_MIN_PER_GPU_SIZE_MB[cap]
    if hidden_size < min_hidden:
        return None
    return int((mb * MiB * tp_size) // (hidden_size * element_size))
