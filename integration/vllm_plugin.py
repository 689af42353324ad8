"""vLLM general plugin (entry point `tpcost` in group `vllm.general_plugins`).

Once loaded, whenever SP/AsyncTP is enabled and `pass_config.sp_min_token_num` is unset, the value comes
from tpcost for the local GPU and this model, set before vLLM computes its own default: the wrapper runs
ahead of `VllmConfig.__post_init__`, where it sees the whole config (hidden, intermediate, heads,
quantisation, tp, max_num_batched_tokens). See docs/vllm-plugin.md for why this hook.

Rules: idempotent (a process may load plugins several times); no effect when SP is off or the user set
a value; TPCOST_DISABLE=1 opts out; never raises into vLLM (any failure: one warning, vLLM's default
stands); on vLLM >= 0.32 (no SP pass) one info line and nothing else.
"""

from __future__ import annotations

import functools
import logging
import os

logger = logging.getLogger("vllm.tpcost")
_MARK = "_tpcost_wrapped"
APPLY_TIMES_S: list[float] = []  # wall time of each _apply call in this process (benchmarks/vllm_plugin_overhead.py)


def register() -> None:
    """Called by vLLM's load_general_plugins in every process that builds or receives a config."""
    try:
        if os.environ.get("TPCOST_DISABLE", "") not in ("", "0"):
            logger.info("tpcost: disabled by TPCOST_DISABLE")
            return
        from vllm.config import VllmConfig
        from vllm.config.compilation import PassConfig

        if "sp_min_token_num" not in getattr(PassConfig, "__dataclass_fields__", {}):
            logger.info("tpcost: this vLLM has no sequence-parallelism pass (removed in 0.32): nothing to tune")
            return
        original = VllmConfig.__post_init__
        if getattr(original, _MARK, False):
            return

        @functools.wraps(original)
        def __post_init__(self, *a, **kw):
            _apply(self)
            return original(self, *a, **kw)

        setattr(__post_init__, _MARK, True)
        VllmConfig.__post_init__ = __post_init__
    except Exception as e:  # noqa: BLE001 - a plugin must never break vLLM
        logger.warning("tpcost: plugin not installed (%s: %s); vLLM's own SP threshold applies", type(e).__name__, e)


def _dtype_mode(model_config) -> str:
    """bf16 | fp8 (static per-tensor activation scales) | fp8-dynamic, from the model's quantisation."""
    q = (getattr(model_config, "quantization", None) or "").lower()
    if "fp8" not in q and "modelopt" not in q and "compressed" not in q:
        return "bf16"
    hf = getattr(model_config, "hf_config", None)
    qc = getattr(hf, "quantization_config", None) or {}
    scheme = str(qc.get("activation_scheme", "dynamic") if isinstance(qc, dict) else "dynamic").lower()
    return "fp8" if scheme == "static" else "fp8-dynamic"


def _apply(cfg) -> None:
    """Set pass_config.sp_min_token_num from tpcost when SP is on and the value is unset. Never raises."""
    import time

    t0 = time.perf_counter()
    try:
        _apply_inner(cfg)
    finally:
        APPLY_TIMES_S.append(time.perf_counter() - t0)


def _apply_inner(cfg) -> None:
    try:
        if os.environ.get("TPCOST_DISABLE", "") not in ("", "0"):
            return
        if os.environ.get("TPCOST_PLUGIN_FAIL_FOR_TEST") == "1":
            raise RuntimeError("injected failure (TPCOST_PLUGIN_FAIL_FOR_TEST=1)")
        pc = cfg.compilation_config.pass_config
        if not (pc.enable_sp or pc.fuse_gemm_comms) or pc.sp_min_token_num is not None:
            return
        tp = cfg.parallel_config.tensor_parallel_size
        if tp <= 1 or cfg.model_config is None:
            return
        from costmodel.profile import load_profile
        from costmodel.shapes import shape_from_config

        from .recommend import detect_profile_name, recommend

        prof = load_profile(detect_profile_name())
        mc = cfg.model_config
        shape = shape_from_config(mc.hf_text_config.to_dict(), str(mc.model))
        max_tokens = cfg.scheduler_config.max_num_batched_tokens or 8192
        workload = None
        if os.environ.get("TPCOST_WORKLOAD"):
            from costmodel.workload import read_workload

            workload = read_workload(os.environ["TPCOST_WORKLOAD"])
        r = recommend(prof, shape, tp, _dtype_mode(mc), int(max_tokens), workload=workload)
        if r.enable:
            pc.sp_min_token_num = r.cutoff_tokens
            logger.info("tpcost: sp_min_token_num=%d (predicted SP+AsyncTP speedup %.3fx at the cutoff, %.3fx at %d "
                        "tokens; %s; profile %s, provenance tier %s)", r.cutoff_tokens, r.speedup_at_cutoff,
                        r.speedup_at_max_tokens, r.max_num_batched_tokens, r.saving_line(), r.profile_name,
                        r.profile_tier)
        else:
            # no gain predicted up to max_num_batched_tokens: SP would only cost (full graphs, padding), so turn it
            # off the way vLLM does when its own table has no value (docs/vllm-plugin.md)
            pc.enable_sp = False
            pc.fuse_gemm_comms = False
            logger.info("tpcost: SP+AsyncTP disabled: never predicted to gain up to %d tokens (%.3fx there; profile %s, "
                        "provenance tier %s); set pass_config.sp_min_token_num to force it", r.max_num_batched_tokens,
                        r.speedup_at_max_tokens, r.profile_name, r.profile_tier)
    except Exception as e:  # noqa: BLE001
        logger.warning("tpcost: could not compute sp_min_token_num (%s: %s); vLLM's default applies",
                       type(e).__name__, e)
