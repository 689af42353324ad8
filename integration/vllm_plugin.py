"""vLLM general plugin (entry point `tpcost` in group `vllm.general_plugins`).

Once loaded, the wrapper runs ahead of `VllmConfig.__post_init__`, where it sees the whole config
(hidden, intermediate, heads, quantisation, tp, max_num_batched_tokens) and sets, for the local GPU
and this model:
- the FlashInfer all-reduce+RMSNorm fusion range (`pass_config.fi_allreduce_fusion_max_size_mb`)
when the
  user left it unset and did not turn the fusion off, on every version;
- on vLLM <= 0.31, also `pass_config.sp_min_token_num` whenever SP/AsyncTP is enabled and it is
unset,
  computed with the fusion range vLLM will actually run (the user's own, or the one set here);
- on vLLM 0.34, when the user turned dual-batch overlap on (`enable_dbo`) and left a threshold at
vLLM's default
  (ParallelConfig does not track what was set, so a value equal to the default counts as unset),
  that threshold from tpcost's decision for the DP+EP setup; it never turns DBO on by itself;
- for a model vLLM runs its fused GEMM+RS/AR kernel in (Kimi-K3, DeepSeek-V4.1; vLLM >= 0.31), the
switch of the
  mode its workers bind (VLLM_KIMI_K3_GEMM_AR or VLLM_ENABLE_GEMM_RS) in `os.environ`, when the user
  left it unset:
  the config is built in the engine's process before the workers spawn, and vLLM's envs are read
  (then cached) only there and in the workers, so they inherit it.
See docs/vllm-plugin.md for why this hook.

Rules: idempotent (a process may load plugins several times); a user value always wins;
TPCOST_DISABLE=1 opts out; TPCOST_WORKLOAD=FILE decides for that traffic; never raises into vLLM
(any failure: one warning, vLLM's default stands); one log line. Each decision is cached by its
inputs (integration/plugin_cache.py), so a later start reads it back without importing the cost
model.
"""

from __future__ import annotations

import functools
import logging
import os

logger = logging.getLogger("vllm.tpcost")
_MARK = "_tpcost_wrapped"
APPLY_TIMES_S: list[float] = []
_SET_HERE: dict[
    str, str
    # the kernel switches this process set (an explicit user value is never overwritten)  # wall
    # time of each _apply call in this process (benchmarks/vllm_plugin_overhead.py)
] = {}


def register() -> None:
    """Called by vLLM's load_general_plugins in every process that builds or receives a config."""
    try:
        from .plugin_cache import env_flag

        off, problem = env_flag("TPCOST_DISABLE")
        if problem:
            logger.warning("tpcost: %s", problem)
        if off:
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
        logger.warning(
            "tpcost: plugin not installed (%s: %s); vLLM's own SP threshold applies",
            type(e).__name__,
            e,
        )


def _dtype_mode(model_config) -> str:
    """bf16 | fp8 (static per-tensor activation scales) | fp8-dynamic, from the model's
    quantisation."""
    q = (getattr(model_config, "quantization", None) or "").lower()
    if "fp8" not in q and "modelopt" not in q and "compressed" not in q:
        return "bf16"
    hf = getattr(model_config, "hf_config", None)
    qc = getattr(hf, "quantization_config", None) or {}
    scheme = str(
        qc.get("activation_scheme", "dynamic") if isinstance(qc, dict) else "dynamic"
    ).lower()
    return "fp8" if scheme == "static" else "fp8-dynamic"


def _apply(cfg) -> None:
    """Set the pass-config values tpcost decides (fusion range; sp_min_token_num on <= 0.31). Never
    raises."""
    import time

    t0 = time.perf_counter()
    try:
        _apply_inner(cfg)
    finally:
        APPLY_TIMES_S.append(time.perf_counter() - t0)


def _apply_inner(cfg) -> None:
    try:
        from .plugin_cache import env_flag

        if env_flag("TPCOST_DISABLE")[0]:
            return
        if os.environ.get("TPCOST_PLUGIN_FAIL_FOR_TEST") == "1":
            raise RuntimeError("injected failure (TPCOST_PLUGIN_FAIL_FOR_TEST=1)")
        pc = cfg.compilation_config.pass_config
        has_sp = hasattr(pc, "sp_min_token_num")  # vLLM <= 0.31
        _apply_dbo(cfg, has_sp)
        if _kernel_family(cfg) is not None:
            _apply_kernel_model(cfg, has_sp)
            return
        want_sp = (
            has_sp and bool(pc.enable_sp or pc.fuse_gemm_comms) and pc.sp_min_token_num is None
        )
        fuse, fuse_why = resolved_fuse_allreduce_rms(cfg)
        want_fi = fuse is not False and pc.fi_allreduce_fusion_max_size_mb is None
        tp = cfg.parallel_config.tensor_parallel_size
        if tp <= 1 or cfg.model_config is None or not (want_sp or want_fi):
            return
        from costmodel.defaults import DEFAULT_BUDGET_TOKENS

        mc = cfg.model_config
        hf = mc.hf_text_config.to_dict()
        inputs = {
            "hf_text_config": hf,
            "model": str(mc.model),
            "tp": tp,
            "dtype": _dtype_mode(mc),
            "max_tokens": int(cfg.scheduler_config.max_num_batched_tokens or DEFAULT_BUDGET_TOKENS),
            "has_sp": has_sp,
            "want_sp": want_sp,
            "want_fi": want_fi,
            "fuse_allreduce_rms": fuse,
            "fuse_why": fuse_why,
            "fi_allreduce_fusion_max_size_mb": pc.fi_allreduce_fusion_max_size_mb,
            "cudagraph_max_tokens": _cudagraph_max_tokens(cfg),
            "vllm_version": _vllm_version(has_sp),
            "asynctp": _asynctp(pc) if want_sp else None,
        }
        plan, hit = _cached_plan(inputs, _plan)
        for attr, value in plan["set"]:
            setattr(pc, attr, value)
        _log_plan(plan, hit)
    except Exception as e:
        logger.warning(
            "tpcost: could not compute the pass config (%s: %s); vLLM's defaults apply",
            type(e).__name__,
            e,
        )


_DBO_FIELDS = {"decode": "dbo_decode_token_threshold", "prefill": "dbo_prefill_token_threshold"}


def _apply_dbo(cfg, has_sp: bool) -> None:
    """Where the user turned DBO on: each threshold left at vLLM's default, from tpcost's decision
    (one log line per value: vLLM's, tpcost's and the saving). A failure is one warning and vLLM's
    thresholds stand."""
    par = cfg.parallel_config
    if getattr(par, "enable_dbo", False) is not True or cfg.model_config is None:
        return
    try:
        from costmodel.vllm_tables import RELEASES

        version = tuple(_vllm_version(has_sp))
        rules = RELEASES[version].ep
        if rules is None:
            logger.info(
                "tpcost: DBO thresholds left as vLLM %d.%d has them (tpcost has read its DP+EP "
                "rules for "
                "another release only)",
                *version,
            )
            return
        unset = [
            ph for ph, attr in _DBO_FIELDS.items() if getattr(par, attr) == rules.dbo_thresholds[ph]
        ]
        if not unset:
            return
        inputs = {
            "hf_text_config": cfg.model_config.hf_text_config.to_dict(),
            "model": str(cfg.model_config.model),
            "tp": par.tensor_parallel_size,
            "dp": par.data_parallel_size,
            "dp_local": getattr(par, "data_parallel_size_local", None),
            "expert_parallel": bool(par.enable_expert_parallel),
            "backend": par.all2all_backend,
            "max_tokens": cfg.scheduler_config.max_num_batched_tokens,
            "unset": unset,
            "network": os.environ.get("TPCOST_NETWORK"),
            "vllm_version": list(version),
            "num_speculative_tokens": int(
                getattr(getattr(cfg, "speculative_config", None), "num_speculative_tokens", 0) or 0
            ),
        }
        plan, hit = _cached_plan(inputs, _dbo_plan)
        for attr, value in plan["set"]:
            setattr(par, attr, value)
        for line in plan["said"]:
            logger.info("tpcost: %s%s", line, " (cached decision)" if hit else "")
    except Exception as e:
        logger.warning(
            "tpcost: could not decide the DBO thresholds (%s: %s); vLLM's thresholds apply",
            type(e).__name__,
            e,
        )


def dbo_setup(inputs: dict, prof):
    """The EP step's setup (costmodel.ep_step.EPSetup) for what vLLM's ParallelConfig holds; one
    TpcostError for a setup the step does not price."""
    from costmodel.all2all import backend
    from costmodel.ep_step import BATCHED_DP_BUDGET, DEFAULT_BUDGET, EPSetup, check_setup
    from costmodel.errors import TpcostError
    from costmodel.moe import moe_shape_from_config
    from costmodel.network import load_network

    if inputs["tp"] != 1 or not inputs["expert_parallel"]:
        raise TpcostError(
            "tpcost prices DBO under DP attention + expert parallelism with TP 1 per rank "
            f"(here TP {inputs['tp']}, expert parallel {inputs['expert_parallel']})"
        )
    shape = moe_shape_from_config(inputs["hf_text_config"], inputs["model"])
    b = backend(inputs["backend"])
    if b.predict is None:
        raise TpcostError(b.refusal)
    dom, dp = int(prof.interconnect.domain_size), inputs["dp"]
    local = (
        inputs["dp_local"] if inputs["dp_local"] and 1 <= inputs["dp_local"] <= dp else min(dp, dom)
    )
    net = load_network(inputs["network"]) if inputs["network"] else prof.network()
    budget = inputs["max_tokens"] or (BATCHED_DP_BUDGET if b.batched_dp else DEFAULT_BUDGET)
    s = EPSetup(
        prof=prof,
        shape=shape,
        ep=dp,
        gpus_per_node=local,
        backend=inputs["backend"],
        network=net,
        budget_tokens=int(budget),
    )
    check_setup(s)
    return s


def _dbo_plan(inputs: dict) -> dict:
    """What to set on the parallel config for DBO and what to say (a JSON-able plan;
    plugin_cache)."""
    import argparse

    from costmodel.profile import detect_profile

    from .dbo import decide_dbo

    s = dbo_setup(inputs, detect_profile())
    # the band is for people, not the engine
    d = decide_dbo(
        argparse.Namespace(
            margin=None, num_speculative_tokens=inputs.get("num_speculative_tokens")
        ),
        s,
        band=False,
    )
    sets, said = [], []
    for ph in inputs["unset"]:
        x = d["phases"][ph]
        # never pays: no step of the budget microbatches
        value = d[f"{ph}_token_threshold"] or s.budget_tokens + 1
        sets.append((_DBO_FIELDS[ph], value))
        what = (
            f"saves {x['saving_s'] * 1e3:.3f} ms per step "
            f"({100 * x['saving_s'] / x['mean_step_s']:.1f} %), "
            f"{x['saving_vs_vllm_s'] * 1e3:.3f} ms against vLLM's"
            if x["threshold_tokens"] is not None
            else "DBO never pays here within the budget, so no step microbatches; set the "
            "threshold to force it"
        )
        said.append(
            f"{_DBO_FIELDS[ph]}={value} (vLLM's default {x['vllm_threshold_tokens']}, left unset; "
            f"{what}; "
            f"{s.shape.name}, EP {s.ep} over {s.nodes} node(s), {s.backend}, network "
            f"{s.network.name})"
        )
    return {"set": sets, "said": said, "profile_name": s.prof.name, "profile_tier": s.prof.tier}


def resolved_fuse_allreduce_rms(cfg) -> tuple[bool | None, str]:
    """(pass_config.fuse_allreduce_rms as vLLM will run it, why): the user's value; else the default
    vLLM's `__post_init__` applies to an unset field at the config's optimization level
    (config/vllm.py OPTIMIZATION_LEVEL_TO_CONFIG: False at O0/O1, `enable_allreduce_rms_fusion(cfg)`
    at O2/O3: TP > 1, CUDA, FlashInfer installed, SM 9.0 or the 10.x family), evaluated with vLLM's
    own function before vLLM does; (None, ...) where this vLLM has no such table."""
    pc = cfg.compilation_config.pass_config
    if pc.fuse_allreduce_rms is not None:
        return bool(
            pc.fuse_allreduce_rms
        ), f"user: fuse_allreduce_rms = {str(bool(pc.fuse_allreduce_rms)).lower()}"
    try:
        from vllm.config.vllm import OPTIMIZATION_LEVEL_TO_CONFIG

        level = cfg.optimization_level
        default = OPTIMIZATION_LEVEL_TO_CONFIG[level]["compilation_config"]["pass_config"][
            "fuse_allreduce_rms"
        ]
        on = bool(default(cfg) if callable(default) else default)
    except Exception:  # a vLLM without the table: the fusion as the user left it, unresolved
        return None, "fuse_allreduce_rms unset; vLLM's default not readable here"
    how = "enable_allreduce_rms_fusion" if callable(default) else "its default"
    return on, (
        f"fuse_allreduce_rms unset, which vLLM resolves to {str(on).lower()} here "
        f"({getattr(level, 'name', level)}, "
        f"{how}{'' if on else ': not TP > 1 on SM 9.0 / 10.x with FlashInfer'})"
    )


def _log_plan(plan: dict, hit: bool) -> None:
    """The one log line of what a plan set and said, and from which profile."""
    if plan["said"]:
        logger.info(
            "tpcost: %s; profile %s, provenance tier %s%s",
            "; ".join(plan["said"]),
            plan["profile_name"],
            plan["profile_tier"],
            " (cached decision)" if hit else "",
        )


def _cached_plan(inputs: dict, make) -> tuple[dict, bool]:
    """(the plan for `inputs`, whether it came from the decision cache): the cached one, else
    `make(inputs)`, stored for the next start (a warning where the cache directory cannot be
    written)."""
    from . import plugin_cache

    problem = plugin_cache.setting_problem()
    if problem:
        logger.warning("tpcost: %s", problem)
    cache = plugin_cache.cache_dir()
    key = plugin_cache.decision_key(inputs)
    plan = plugin_cache.load(cache, key)
    if plan is not None:
        return plan, True
    plan = make(inputs)
    if not plugin_cache.store(cache, key, plan) and cache is not None:
        logger.warning(
            "tpcost: decision cache not written (%s is not a writable directory); the next start "
            "decides again",
            cache,
        )
    return plan, False


def _asynctp(pc) -> list:
    """[AsyncTP on?, who chose] from the user's pass config, read before vLLM resolves it:
    fuse_gemm_comms as set, and unset resolves to False at every optimisation level of vLLM 0.31
    (config/vllm.py IS_DENSE = False)."""
    if pc.fuse_gemm_comms is True:
        return [True, "user: fuse_gemm_comms = true"]
    if pc.fuse_gemm_comms is False:
        return [False, "user: fuse_gemm_comms = false"]
    return [False, "fuse_gemm_comms unset, which vLLM 0.31 resolves to false"]


def _vllm_version(has_sp: bool) -> list[int]:
    """The running vLLM's (major, minor), by the one version rule (costmodel.vllm_tables.resolve) on
    its `__version__`; a version tpcost has no record of, or whose record disagrees with the
    PassConfig in hand (SP fields or none), is refused (TpcostError: the plugin's one warning, and
    vLLM's defaults stand)."""
    import sys

    from costmodel.errors import TpcostError
    from costmodel.vllm_tables import resolve

    # the plugin runs inside vLLM: its version is already loaded, no metadata scan
    mod = sys.modules.get("vllm")
    text = getattr(mod, "__version__", None) if mod is not None else None
    if not isinstance(text, str):
        raise TpcostError(
            "the running vLLM has no __version__ string; tpcost answers only for a release it has "
            "a "
            "record of"
        )
    v = resolve(None, (text, f"the running vLLM {text}"))
    if v.sp_passes != has_sp:
        raise TpcostError(
            f"the running vLLM {text}: its PassConfig {'has' if has_sp else 'has no'} SP fields, "
            "but "
            f"tpcost's record of vLLM {v.label} says {'no ' if not v.sp_passes else ''}SP passes; "
            "not "
            "answering for another release"
        )
    return list(v.version)


def _vllm_of(inputs: dict):
    """The plan inputs' vLLM (a JSON list in the decision cache's key) as a
    costmodel.vllm_tables.Vllm."""
    from costmodel.vllm_tables import Vllm

    v = inputs["vllm_version"]
    return Vllm((int(v[0]), int(v[1])), source=f"the running vLLM {v[0]}.{v[1]}")


def _cudagraph_max_tokens(cfg) -> int | None:
    """The regime the user asked vLLM for: 0 when every step runs eagerly (enforce_eager, or
    cudagraph_mode NONE), the user's max_cudagraph_capture_size, else None (vLLM's default for the
    GPU: 512, 1024 on datacenter Blackwell). Read before VllmConfig.__post_init__, so only what the
    user set counts, never what a platform without graphs (the CPU build) resolves it to."""
    cc = cfg.compilation_config
    mode = getattr(cc, "cudagraph_mode", None)
    if getattr(cfg.model_config, "enforce_eager", False) or (
        mode is not None and getattr(mode, "name", "") == "NONE"
    ):
        return 0
    size = getattr(cc, "max_cudagraph_capture_size", None)
    return int(size) if size is not None else None


def _workload_from_env():
    """TPCOST_WORKLOAD's traffic, parsed (None: the uniform default)."""
    if not os.environ.get("TPCOST_WORKLOAD"):
        return None
    from costmodel.workload import read_workload

    return read_workload(os.environ["TPCOST_WORKLOAD"])


def _fusion_plan(inputs: dict, f) -> tuple[list, list[str]]:
    """(pass-config fields to set, what to say) for a decided FlashInfer fusion range `f`
    (costmodel.decide.FusionRange). Decided, or vLLM's own limit kept: set explicitly either way
    (the same compile ranges; vLLM's CPU build cannot compute its default, whose pass module needs
    CUDA ops); a user's value is left alone."""
    sets: list = []
    said: list[str] = []
    why = inputs.get("fuse_why", "")
    # vLLM turns it off itself: say so
    if inputs["fuse_allreduce_rms"] is False and not why.startswith("user"):
        said.append(f"FlashInfer all-reduce+RMSNorm fusion off ({why}); decided without it")
    if not inputs["want_fi"] or f is None or f.why.startswith("user"):
        return sets, said
    if f.tokens == 0:
        if not why.startswith("user"):
            sets.append(("fuse_allreduce_rms", False))
            said.append("fuse_allreduce_rms=False (the fused all-reduce+RMSNorm never wins here)")
    else:
        sets.append(("fi_allreduce_fusion_max_size_mb", f.mb))
        v = _vllm_of(inputs)
        kept = "; vLLM's own limit kept" if f.why.startswith("kept") else ""
        said.append(
            f"fi_allreduce_fusion_max_size_mb={f.mb:.6g} (fused up to {f.tokens} tokens; "
            f"vLLM {v.label}'s tables{kept})"
        )
    return sets, said


def _plan(inputs: dict) -> dict:
    """What to set on the pass config and what to say, from the cost model (a JSON-able plan;
    plugin_cache)."""
    from costmodel.profile import detect_profile
    from costmodel.shapes import shape_from_config

    from costmodel.model import DecodeRegime, Regime, RunConfig

    from costmodel.decide import UserChoices, recommend

    prof = detect_profile()
    shape = shape_from_config(inputs["hf_text_config"], inputs["model"])
    workload = _workload_from_env()
    asynctp, choice = inputs.get("asynctp") or [None, "decided"]
    from costmodel.analysis import token_grid
    from costmodel.workload import decode_regime

    # tpcost's stated decode default, as whatif and vllm-config use it, or the workload's own
    # contexts
    decode = decode_regime(
        workload, token_grid(inputs["tp"], inputs["max_tokens"]), DecodeRegime().max_num_seqs
    )
    regime = Regime(
        cudagraph_max_tokens=inputs.get("cudagraph_max_tokens"),
        vllm=_vllm_of(inputs),
        decode=decode or DecodeRegime(),
    )
    user = UserChoices(
        inputs["fuse_allreduce_rms"], inputs["fi_allreduce_fusion_max_size_mb"], asynctp, choice
    )
    r = recommend(
        prof,
        shape,
        RunConfig(inputs["tp"], inputs["dtype"], regime, inputs["max_tokens"], workload=workload),
        user,
    )
    sets, said = _fusion_plan(inputs, r.fusion)
    if inputs["want_sp"]:
        if r.enable:
            sets.append(("sp_min_token_num", r.cutoff_tokens))
            said.append(
                f"sp_min_token_num={r.cutoff_tokens} ({r.schedule_name}, AsyncTP {choice}; "
                "predicted speedup "
                f"{r.speedup_at_cutoff:.3f}x at the cutoff, {r.speedup_at_max_tokens:.3f}x at "
                f"{r.max_num_batched_tokens} tokens; {r.saving_line()})"
            )
        else:
            # no gain predicted below max_num_batched_tokens: SP would only cost (full graphs,
            # padding), so turn it off the way vLLM does when its own table has no value
            # (docs/vllm-plugin.md)
            sets += [("enable_sp", False), ("fuse_gemm_comms", False)]
            what = (
                "SP alone"
                if asynctp is False
                else "SP+AsyncTP"
                if asynctp
                else "SP+AsyncTP nor SP alone"
            )
            said.append(
                f"SP disabled ({what}, AsyncTP {choice}): no threshold below "
                f"{r.max_num_batched_tokens} "
                f"tokens is predicted to gain; set pass_config.sp_min_token_num to force it"
            )
    return {
        "set": sets,
        "said": said,
        "profile_name": r.profile_name,
        "profile_tier": r.profile_tier,
    }


def _kernel_family(cfg) -> str | None:
    """costmodel.shapes.kernel_family of the model in `cfg` (None: not a model that runs the fused
    kernel)."""
    mc = cfg.model_config
    if mc is None:
        return None
    from costmodel.shapes import kernel_family

    hf = getattr(mc, "hf_config", None)
    return kernel_family(
        {
            "model_type": getattr(hf, "model_type", None),
            "architectures": list(getattr(mc, "architectures", None) or ()),
            "text_config": {"model_type": getattr(mc.hf_text_config, "model_type", None)},
        }
    )


def kernel_parallel(parallel_config, kernel_config) -> dict:
    """costmodel.vllm_tables.Parallel's fields from vLLM's ParallelConfig and KernelConfig (and the
    environment's VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT), as vLLM's model code reads them."""
    from costmodel.vllm_tables import SHARD_SP_SHARED_EXPERT_ENV

    return {
        "tp": int(parallel_config.tensor_parallel_size),
        "pipeline_parallel_size": int(parallel_config.pipeline_parallel_size),
        "data_parallel_size": int(parallel_config.data_parallel_size),
        "enable_expert_parallel": bool(parallel_config.enable_expert_parallel),
        "moe_backend": str(getattr(kernel_config, "moe_backend", "auto") or "auto"),
        "all2all_backend": str(getattr(parallel_config, "all2all_backend", "") or ""),
        "shard_sp_shared_expert": os.environ.get(SHARD_SP_SHARED_EXPERT_ENV, "0") not in ("", "0"),
        "nnodes": int(getattr(parallel_config, "nnodes", 1) or 1),
    }


def _apply_kernel_model(cfg, has_sp: bool) -> None:
    """A model that runs vLLM's fused GEMM+RS/AR: the fusion range (when unset) and the switch of
    the mode its workers bind (when unset in the environment); an explicit user value stands."""
    from costmodel.vllm_tables import SWITCHES, Parallel

    pc = cfg.compilation_config.pass_config
    par = kernel_parallel(cfg.parallel_config, getattr(cfg, "kernel_config", None))
    if par["tp"] <= 1:
        return
    from costmodel.defaults import DEFAULT_BUDGET_TOKENS

    mc = cfg.model_config
    text = mc.hf_text_config.to_dict()
    outer = {
        "model_type": getattr(mc.hf_config, "model_type", None),
        "architectures": list(mc.architectures or ()),
        "dtype": str(mc.dtype).replace("torch.", ""),
        "text_config": text,
    }
    text["dtype"] = outer["dtype"]  # what vLLM runs (--dtype), not the checkpoint's
    from costmodel.shapes import read_kernel_model

    km = read_kernel_model(outer, str(mc.model))
    op = km.mode(Parallel(**par))
    user_env = None if op is None else os.environ.get(SWITCHES[op].env)
    if op is not None and user_env is not None and _SET_HERE.get(SWITCHES[op].env) == user_env:
        user_env = None  # this process's own earlier decision, not the user's
    fuse, fuse_why = resolved_fuse_allreduce_rms(cfg)
    want_fi = fuse is not False and pc.fi_allreduce_fusion_max_size_mb is None
    version = _vllm_version(has_sp)
    gated = bool(_vllm_of({"vllm_version": version}).release.gates_of(km.family))
    if not want_fi and (op is None or user_env is not None) and not gated:
        if user_env is not None:
            logger.info("tpcost: %s=%s set by the user; kept", SWITCHES[op].env, user_env)
        return
    inputs = {
        "kernel_model": outer,
        "model": str(mc.model),
        "parallel": par,
        "op": op if user_env is None else None,
        "max_tokens": int(cfg.scheduler_config.max_num_batched_tokens or DEFAULT_BUDGET_TOKENS),
        "want_fi": want_fi,
        "fuse_allreduce_rms": fuse,
        "fuse_why": fuse_why,
        "fi_allreduce_fusion_max_size_mb": pc.fi_allreduce_fusion_max_size_mb,
        "vllm_version": version,
    }
    plan, hit = _cached_plan(inputs, _kernel_plan)
    for attr, value in plan["set"]:
        setattr(pc, attr, value)
    for env, value in plan.get("env", []):
        # set before the workers spawn
        if env not in os.environ or _SET_HERE.get(env) == os.environ[env]:
            os.environ[env] = _SET_HERE[env] = value
    if user_env is not None:
        plan["said"].append(f"{SWITCHES[op].env}={user_env} set by the user; kept")
    _log_plan(plan, hit)
    # one line per hand cutoff in the model's code: reported, never patched
    for line in plan.get("gates", []):
        logger.info("%s", line)


def _kernel_plan(inputs: dict) -> dict:
    """The plan for a kernel model (costmodel.decide.kernel_model_config, vllm-config's decision
    path)."""
    from costmodel.errors import TpcostError
    from costmodel.shapes import read_kernel_model
    from costmodel.vllm_tables import Parallel
    from costmodel.profile import detect_profile

    from costmodel.model import Regime, RunConfig

    from costmodel.decide import UserChoices, kernel_model_config

    prof = detect_profile()
    km = read_kernel_model(inputs["kernel_model"], inputs["model"])
    par = Parallel(**inputs["parallel"])
    run = RunConfig(
        par.tp,
        "bf16",
        Regime(vllm=_vllm_of(inputs)),
        inputs["max_tokens"],
        workload=_workload_from_env(),
    )
    user = UserChoices(inputs["fuse_allreduce_rms"], inputs["fi_allreduce_fusion_max_size_mb"])
    said: list[str] = []
    try:
        d = kernel_model_config(prof, km, par, inputs["op"], run, user)
    except (
        TpcostError
    ) as e:  # the switch has no effect here: say why, and still decide the fusion range
        said.append(str(e))
        d = kernel_model_config(prof, km, par, None, run, user)
    sets, fusion_said = _fusion_plan(inputs, d.fusion)
    said += fusion_said
    env = []
    ks = d.switch
    if ks is not None:
        env.append((ks.env, str(int(ks.set_on))))
        said.append(
            f"{ks.env}={int(ks.set_on)} (vLLM's default {int(ks.vllm_default_on)}; expected "
            f"{ks.expected_on_s * 1e3:.3f} ms per forward with the kernel, "
            f"{ks.expected_off_s * 1e3:.3f} ms "
            f"without; mode {d.mode}, {len(ks.sites)} call sites)"
        )
    return {
        "set": sets,
        "env": env,
        "said": said,
        "profile_name": prof.name,
        "profile_tier": prof.tier,
        "gates": plugin_gate_lines(d.gates),
    }


def plugin_gate_lines(gates) -> list[str]:
    """One log line per model gate (costmodel.gates.GateDecision): vLLM's value, tpcost's, the
    saving on this traffic, and that the plugin leaves it (a module constant in the spawned workers:
    not patched)."""
    from .recommend import gate_tokens

    out = []
    for gd in gates:
        g = gd.gate
        unit = " per rank" if g.per_rank else ""
        if gd.why_not_derived:
            mine = f"tpcost's: not derived ({gd.why_not_derived})"
        else:
            mine = f"tpcost's {gate_tokens(g, gd.tpcost_tokens)}{unit}" + (
                ""
                if gd.saving_s is None
                else f", saving {gd.saving_s * 1e3:.3f} ms per forward on this traffic"
            )
        out.append(
            f"tpcost: {g.key}: vLLM's {gd.constant} = "
            f"{'-' if gd.vllm_tokens is None else gd.vllm_tokens}{unit}, "
            f"{mine}; {'acts here' if gd.applies is None else 'not reached here: ' + gd.applies}; "
            "left as vLLM "
            "has it (a module constant in the workers; tpcost sets only what vLLM exposes)"
        )
    return out
