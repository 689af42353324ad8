"""vLLM general plugin (entry point `tpcost` in group `vllm.general_plugins`).

Once loaded, the wrapper runs ahead of `VllmConfig.__post_init__`, where it sees the whole config (hidden,
intermediate, heads, quantisation, tp, max_num_batched_tokens) and sets, for the local GPU and this model:
- the FlashInfer all-reduce+RMSNorm fusion range (`pass_config.fi_allreduce_fusion_max_size_mb`) when the
  user left it unset and did not turn the fusion off, on every version;
- on vLLM <= 0.31, also `pass_config.sp_min_token_num` whenever SP/AsyncTP is enabled and it is unset,
  computed with the fusion range vLLM will actually run (the user's own, or the one set here).
See docs/vllm-plugin.md for why this hook.

Rules: idempotent (a process may load plugins several times); a user value always wins; TPCOST_DISABLE=1
opts out; TPCOST_WORKLOAD=FILE decides for that traffic; never raises into vLLM (any failure: one warning,
vLLM's default stands); one log line. Each decision is cached by its inputs (integration/plugin_cache.py), so a
later start reads it back without importing the cost model.
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

        original = VllmConfig.__post_init__
        if getattr(original, _MARK, False):
            return

        @functools.wraps(original)
        def __post_init__(self, *a, **kw):
            _apply(self)
            return original(self, *a, **kw)

        setattr(__post_init__, _MARK, True)
        VllmConfig.__post_init__ = __post_init__
    except Exception as e:
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
    """Set the pass-config values tpcost decides (fusion range; sp_min_token_num on <= 0.31). Never raises."""
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
        has_sp = hasattr(pc, "sp_min_token_num")  # vLLM <= 0.31
        want_sp = has_sp and bool(pc.enable_sp or pc.fuse_gemm_comms) and pc.sp_min_token_num is None
        want_fi = pc.fuse_allreduce_rms is not False and pc.fi_allreduce_fusion_max_size_mb is None
        tp = cfg.parallel_config.tensor_parallel_size
        if tp <= 1 or cfg.model_config is None or not (want_sp or want_fi):
            return
        mc = cfg.model_config
        hf = mc.hf_text_config.to_dict()
        inputs = {"hf_text_config": hf, "model": str(mc.model), "tp": tp, "dtype": _dtype_mode(mc),
                  "max_tokens": int(cfg.scheduler_config.max_num_batched_tokens or 8192), "has_sp": has_sp,
                  "want_sp": want_sp, "want_fi": want_fi, "fuse_allreduce_rms": pc.fuse_allreduce_rms,
                  "fi_allreduce_fusion_max_size_mb": pc.fi_allreduce_fusion_max_size_mb,
                  "cudagraph_max_tokens": _cudagraph_max_tokens(cfg), "vllm_version": _vllm_version(has_sp)}
        from . import plugin_cache

        problem = plugin_cache.setting_problem()
        if problem:
            logger.warning("tpcost: %s", problem)
        cache = plugin_cache.cache_dir()
        key = plugin_cache.decision_key(inputs)
        plan = plugin_cache.load(cache, key)
        hit = plan is not None
        if not hit:
            plan = _plan(inputs)
            if not plugin_cache.store(cache, key, plan) and cache is not None:
                logger.warning("tpcost: decision cache not written (%s is not a writable directory); the next start "
                               "decides again", cache)
        for attr, value in plan["set"]:
            setattr(pc, attr, value)
        if plan["said"]:
            logger.info("tpcost: %s; profile %s, provenance tier %s%s", "; ".join(plan["said"]), plan["profile_name"],
                        plan["profile_tier"], " (cached decision)" if hit else "")
    except Exception as e:
        logger.warning("tpcost: could not compute the pass config (%s: %s); vLLM's defaults apply",
                       type(e).__name__, e)


def _vllm_version(has_sp: bool) -> list[int]:
    """The running vLLM's (major, minor): the installed distribution, else what its PassConfig says (SP fields:
    <= 0.31; none: 0.32); its dispatch tables are the ones the decision uses (costmodel/vllm_tables.py)."""
    import sys

    v = None
    mod = sys.modules.get("vllm")  # the plugin runs inside vLLM: its version is already loaded, no metadata scan
    if mod is not None and isinstance(getattr(mod, "__version__", None), str):
        from costmodel.errors import TpcostError
        from costmodel.vllm_tables import parse_version

        try:
            v = parse_version(mod.__version__)
        except TpcostError:
            v = None
    if v is None or (v > (0, 31)) == has_sp:  # a version that disagrees with the config in hand loses
        v = (0, 31) if has_sp else (0, 32)
    return list(v)


def _cudagraph_max_tokens(cfg) -> int | None:
    """The regime the user asked vLLM for: 0 when every step runs eagerly (enforce_eager, or cudagraph_mode NONE),
    the user's max_cudagraph_capture_size, else None (vLLM's default for the GPU: 512, 1024 on datacenter
    Blackwell). Read before VllmConfig.__post_init__, so only what the user set counts, never what a platform
    without graphs (the CPU build) resolves it to."""
    cc = cfg.compilation_config
    mode = getattr(cc, "cudagraph_mode", None)
    if getattr(cfg.model_config, "enforce_eager", False) or (mode is not None and getattr(mode, "name", "") == "NONE"):
        return 0
    size = getattr(cc, "max_cudagraph_capture_size", None)
    return int(size) if size is not None else None


def _plan(inputs: dict) -> dict:
    """What to set on the pass config and what to say, from the cost model (a JSON-able plan; plugin_cache)."""
    from costmodel.profile import detect_profile
    from costmodel.shapes import shape_from_config

    from .recommend import recommend

    prof = detect_profile()
    shape = shape_from_config(inputs["hf_text_config"], inputs["model"])
    workload = None
    if os.environ.get("TPCOST_WORKLOAD"):
        from costmodel.workload import read_workload

        workload = read_workload(os.environ["TPCOST_WORKLOAD"])
    r = recommend(prof, shape, inputs["tp"], inputs["dtype"], inputs["max_tokens"], workload=workload,
                  vllm_version=tuple(inputs["vllm_version"]),
                  user_fuse_allreduce_rms=inputs["fuse_allreduce_rms"],
                  user_fi_max_mb=inputs["fi_allreduce_fusion_max_size_mb"],
                  cudagraph_max_tokens=inputs.get("cudagraph_max_tokens"))
    sets, said = [], []
    if inputs["want_fi"] and r.fusion is not None and r.fusion.why == "decided":
        if r.fusion.tokens == 0:
            if inputs["fuse_allreduce_rms"] is None:
                sets.append(("fuse_allreduce_rms", False))
                said.append("fuse_allreduce_rms=False (the fused all-reduce+RMSNorm never wins here)")
        else:
            sets.append(("fi_allreduce_fusion_max_size_mb", r.fusion.mb))
            v = inputs["vllm_version"]
            said.append(f"fi_allreduce_fusion_max_size_mb={r.fusion.mb:.6g} (fused up to {r.fusion.tokens} tokens; "
                        f"vLLM {v[0]}.{v[1]}'s tables)")
    if inputs["want_sp"]:
        if r.enable:
            sets.append(("sp_min_token_num", r.cutoff_tokens))
            said.append(f"sp_min_token_num={r.cutoff_tokens} (predicted SP+AsyncTP speedup {r.speedup_at_cutoff:.3f}x "
                        f"at the cutoff, {r.speedup_at_max_tokens:.3f}x at {r.max_num_batched_tokens} tokens; "
                        f"{r.saving_line()})")
        else:
            # no gain predicted up to max_num_batched_tokens: SP would only cost (full graphs, padding), so turn
            # it off the way vLLM does when its own table has no value (docs/vllm-plugin.md)
            sets += [("enable_sp", False), ("fuse_gemm_comms", False)]
            said.append(f"SP+AsyncTP disabled: never predicted to gain up to {r.max_num_batched_tokens} tokens "
                        f"({r.speedup_at_max_tokens:.3f}x there); set pass_config.sp_min_token_num to force it")
    return {"set": sets, "said": said, "profile_name": r.profile_name, "profile_tier": r.profile_tier}
