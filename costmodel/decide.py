"""What tpcost decides for vLLM: fusion range, schedule, kernel switch (docs/model.md §9, §15)."""
# What tpcost decides for vLLM (docs/vllm.md): the FlashInfer fusion range, the SP/AsyncTP
# schedule and its threshold (vLLM <= 0.31), and the fused kernel's switch of a kernel model, each
# priced on the workload. The one decision path of `tpcost vllm-config`, `tpcost whatif` and the
# plugin; integration only adapts it to vLLM.

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from .errors import TpcostError
from .formulas import MiB
from .model import Regime, RunConfig
from .vllm_tables import Vllm


# share of the profile's Monte Carlo draws in which moving a vLLM default must help
MIN_CONFIDENCE = 0.8


def fusion_mb(tokens: int, hidden: int, elem_bytes: float, vllm_mb: float | None = None) -> float:
    """The MB value to emit so that vLLM's conversion lands exactly on `tokens` (§9)."""
    # vLLM's own when it lands there, else the shortest decimal (fewest significant digits, at most
    # 4 where one exists) whose vLLM conversion int(mb·MiB) // (hidden·itemsize) lands exactly on
    # `tokens` (config/vllm.py _set_compile_ranges, allreduce_rms_fusion.py).
    row = int(hidden * elem_bytes)

    def lands(mb: float) -> bool:
        return int(mb * MiB) // row == tokens

    if vllm_mb is not None and lands(vllm_mb):
        return float(vllm_mb)
    lo = tokens * row / MiB  # every mb in [lo, (tokens + 1)·row / MiB) lands, up to float rounding
    for digits in range(1, 18):
        q = 10.0 ** (math.floor(math.log10(lo)) - digits + 1) if lo > 0 else 1.0
        for cand in (
            float(f"{math.ceil(lo / q) * q:.{digits}g}"),
            float(f"{math.ceil(lo / q + 1) * q:.{digits}g}"),
        ):
            if lands(cand):
                return cand
    mb = (tokens * row + 0.5) / MiB
    assert lands(mb)
    return mb


@dataclasses.dataclass(frozen=True)
class UserChoices:
    """What the user set in vLLM's own config, which tpcost keeps (None: unset; §9)."""

    fuse_allreduce_rms: bool | None = None  # PassConfig.fuse_allreduce_rms
    fi_max_mb: float | None = None  # PassConfig.fi_allreduce_fusion_max_size_mb
    # None: tpcost chooses SP+AsyncTP, SP alone or neither; False: no AsyncTP; True: both
    asynctp: bool | None = None
    # who chose whether AsyncTP runs: "decided", or the user's / vLLM's setting
    asynctp_choice: str = "decided"
    # a speculative-decoding draft model's width (vLLM >= 0.32)
    draft_hidden_size: int | None = None


@dataclasses.dataclass(frozen=True)
class FusionRange:
    """The FlashInfer fused all-reduce+RMSNorm range decided for one configuration (§9)."""

    tokens: int  # the fused kernel runs for N <= tokens (0: fusion off)
    vllm_default_tokens: int  # vLLM's own limit here (its table: costmodel.vllm_tables.dispatch)
    mb: float | None  # fi_allreduce_fusion_max_size_mb to emit (None: fusion off)
    why: str  # "decided", "kept vLLM's default: ...", "user: ...", ...
    # expected all-reduce+norm time per forward on the workload: at it, off, at vLLM's default
    value: dict
    # share of the profile's draws in which the decided range beats vLLM's
    confidence: float | None = None


@dataclasses.dataclass(frozen=True)
class Recommendation:
    profile_name: str
    profile_tier: str
    profile_origin: str
    modified: bool
    tp: int
    dtype: str
    max_num_batched_tokens: int
    # the decided schedule's threshold (None: neither pays off, or this vLLM has no SP)
    cutoff_tokens: int | None
    speedup_at_cutoff: float | None
    speedup_at_max_tokens: float
    worst_speedup_below_cutoff: float | None
    # None: this GPU has no FlashInfer fusion in vLLM's tables (nothing to tune)
    fusion: FusionRange | None
    interconnect_kind: str = ""
    # why torch's fused ops cannot run at this TP (None: they can)
    asynctp_unavailable: str | None = None
    # costmodel.analysis.decision_value of the decided schedule on the workload
    decision_value: dict | None = None
    workload: str = ""
    vllm: Vllm = dataclasses.field(default_factory=Vllm)  # the vLLM the decision is for
    # "sp_asynctp" | "sp" | None (plain TP): costmodel.analysis.decided_schedule
    schedule: str | None = None
    # who chose whether AsyncTP runs: "decided", or the user's / vLLM's setting
    asynctp_choice: str = "decided"
    # the costmodel.analysis.Analysis the decision was taken on (whatif prints it)
    analysis: Any = None

    @property
    def has_sp(self) -> bool:
        return self.vllm.sp_passes

    def saving_line(self) -> str:
        """The expected saving of this decision on the workload, in one line (§9)."""
        dv = self.decision_value or {}
        if not dv or not self.has_sp:
            return ""
        ms = lambda x: "n/a" if x is None else f"{x * 1e3:.3f} ms"  # noqa: E731
        out = (
            f"expected forward {ms(dv.get('expected_forward_s'))} on {self.workload}: saves "
            f"{ms(dv.get('saving_vs_never_s'))} against never"
        )
        if "saving_vs_vllm_default_s" in dv:
            out += f", {ms(dv['saving_vs_vllm_default_s'])} against vLLM's default"
        return (
            out
            + f", regret {ms(dv.get('regret_vs_oracle_s'))} against the best threshold in hindsight"
        )

    @property
    def enable(self) -> bool:
        return self.has_sp and self.schedule is not None

    @property
    def schedule_name(self) -> str:
        return {"sp_asynctp": "SP+AsyncTP", "sp": "SP alone", None: "neither (plain TP)"}[
            self.schedule
        ]

    def pass_config(self) -> dict:
        """The pass_config for this vLLM: SP/AsyncTP (<= 0.31) and the fusion range (§15)."""
        pc: dict = {}
        if self.has_sp:
            pc = {"enable_sp": self.enable, "fuse_gemm_comms": self.schedule == "sp_asynctp"}
            if self.enable:
                pc["sp_min_token_num"] = self.cutoff_tokens
        if self.fusion is not None:
            pc["fuse_allreduce_rms"] = self.fusion.tokens > 0
            if self.fusion.tokens > 0:
                pc["fi_allreduce_fusion_max_size_mb"] = self.fusion.mb
        unknown = set(pc) - set(self.vllm.release.pass_config_fields)
        # the record's PassConfig schema is the contract (tests hold it against vLLM's own class)
        if unknown:
            raise AssertionError(f"vLLM {self.vllm.label}'s PassConfig has no {sorted(unknown)}")
        return pc


def decide_fusion(
    profile,
    shape,
    run: RunConfig,
    user: UserChoices = UserChoices(),
    units_per_forward: int | None = None,
    min_confidence: float = MIN_CONFIDENCE,
) -> FusionRange | None:
    """The FlashInfer fusion range: the user's, else the one the workload makes fastest (§9)."""
    # the user's when given, else the largest token count up to which the fused all-reduce+RMSNorm
    # beats the next all-reduce + RMSNorm on the workload, by the SP cutoff's rule
    # (costmodel.analysis.decide_fusion_limit), never above vLLM's own limit (FlashInfer's workspace
    # is sized by it: raising it costs HBM on every rank and may exceed the one-shot/two-shot
    # kernels' tuned range). `shape` needs `.hidden`; the all-reduce+norm units per forward default
    # to a dense model's 2·layers + 1. vLLM's own limit moves only when it is worth it: the gain
    # exceeds the risk premium `margin` of the all-reduce+norm time the range controls, and the
    # decided range beats vLLM's in at least `min_confidence` of the profile's draws.
    from . import ops
    from .analysis import decide_fusion_limit, expected_time_by_threshold_s
    from .workload import weights_on

    from . import vllm_tables

    tp, dtype, max_num_batched_tokens, margin, workload = (
        run.tp,
        run.dtype,
        run.max_num_batched_tokens,
        run.margin,
        run.workload,
    )
    user_enabled, user_mb, vllm = user.fuse_allreduce_rms, user.fi_max_mb, run.regime.vllm
    d = vllm_tables.dispatch(vllm, profile.identity, profile.interconnect, tp)
    if d.fi_fusion_max_bytes is None or not profile.has_collective("flashinfer_ar_rmsnorm"):
        return None
    hw = ops.Hw(profile, dtype)
    elem = hw.act_bytes
    row = shape.hidden * elem
    default_tokens = int(d.fi_fusion_max_bytes) // int(row)
    n = np.arange(1, max_num_batched_tokens + 1, dtype=float)
    w = weights_on(workload, n)
    msg = n * row
    t_fused = ops.all_reduce_dispatch(hw, msg, tp, True, fi_max_bytes=np.inf, vllm=vllm).t_s
    t_unfused = ops.unfused_all_reduce_norm_s(hw, n, shape.hidden, tp, vllm=vllm)
    if user_enabled is False:
        tokens, why = 0, "user: fuse_allreduce_rms = false"
    elif user_mb is not None:
        tokens, why = (
            int(user_mb * MiB) // int(row),
            f"user: fi_allreduce_fusion_max_size_mb = {user_mb:g}",
        )
    else:
        tokens = decide_fusion_limit(n, t_fused, t_unfused, margin, w, cap_tokens=default_tokens)
        why = "decided"
    draft_cap = draft_token_cap(shape.hidden, user.draft_hidden_size, vllm)
    if draft_cap is not None and tokens > draft_cap:
        agree = (
            f"agree only below {draft_cap + 1} tokens"
            if draft_cap
            else "agree at no token count: the fusion is off"
        )
        why = (
            f"{why}; capped at {draft_cap} tokens for the draft model (hidden "
            f"{user.draft_hidden_size} > "
            f"{shape.hidden}: vLLM's compile range and its fused pass {agree})"
        )
        tokens = draft_cap
    # what each limit really costs (no premium)
    cost = expected_time_by_threshold_s(t_fused, t_unfused, w, 0.0)
    at = lambda c: float(cost[min(max(c, 0), n.size)])  # noqa: E731  (c tokens fused -> split index c)
    units = 2 * shape.num_layers + 1 if units_per_forward is None else units_per_forward
    confidence = None
    # moving vLLM's default: only when it is worth it
    if why == "decided" and tokens != default_tokens:
        gain, base = at(default_tokens) - at(tokens), at(default_tokens)
        # the draws only where the gain is material (0: any share)
        if gain > margin * base and min_confidence > 0:
            confidence = _fusion_confidence(
                profile, dtype, n, shape.hidden, tp, w, tokens, default_tokens, vllm
            )
        if gain <= margin * base and draft_cap is None:
            why = (
                f"kept vLLM's default: {tokens} tokens would save {units * gain * 1e3:.3f} ms per "
                "forward, within "
                f"the {margin:.0%} risk premium of the {units * base * 1e3:.3f} ms the range "
                "controls"
            )
            tokens = default_tokens
        elif confidence is not None and confidence < min_confidence and draft_cap is None:
            why = (
                f"kept vLLM's default: {tokens} tokens helps in only {confidence:.0%} of the "
                "profile's draws "
                f"(needs {min_confidence:.0%})"
            )
            tokens = default_tokens
    # what vLLM's own limit runs: with a wider draft its first compile range ends beyond the pass's
    # limit, so nothing is fused there (draft_token_cap)
    vllm_runs = default_tokens if draft_cap is None or default_tokens <= draft_cap else 0
    value = {
        "units_per_forward": units,
        "expected_s": units * at(tokens),
        "off_s": units * at(0),
        "vllm_default_s": units * at(vllm_runs),
    }
    vllm_mb = d.fi_fusion_max_bytes / MiB
    draft = user.draft_hidden_size
    mb: float | None
    # the MB from the draft's width
    if draft_cap is not None and draft is not None and tokens and user_mb is None:
        mb = (tokens * draft * elem + 0.5) / MiB  # both limits agree on it
        assert int(mb * MiB) // int(draft * elem) == tokens == int(mb * MiB) // int(row)
    else:
        mb = (
            user_mb
            if user_mb is not None and tokens
            else (fusion_mb(tokens, shape.hidden, elem, vllm_mb) if tokens else None)
        )
    return FusionRange(tokens, default_tokens, mb, why, value, confidence)


def _fusion_confidence(
    profile, dtype: str, n, hidden: int, tp: int, w, tokens: int, default_tokens: int, vllm: Vllm
) -> float:
    """Share of the profile's fixed-seed Monte Carlo draws (costmodel.analysis) in which fusing up
    to `tokens` costs less on the workload than vLLM's `default_tokens`."""
    from . import ops
    from .analysis import BAND_DRAWS, BAND_SEED, expected_time_by_threshold_s, perturbed_values

    prof = profile.with_values(
        perturbed_values(profile, BAND_DRAWS, BAND_SEED), None, mark_modified=False
    )
    hd = ops.Hw(prof, dtype)
    t_f = ops.all_reduce_dispatch(
        hd, n * hidden * hd.act_bytes, tp, True, fi_max_bytes=np.inf, vllm=vllm
    ).t_s
    t_u = ops.unfused_all_reduce_norm_s(hd, n, hidden, tp, vllm=vllm)
    t_f, t_u = np.broadcast_arrays(t_f, t_u)
    cost = expected_time_by_threshold_s(t_f, t_u, w, 0.0)
    # as decide_fusion's at()
    i_default, i_tokens = (min(max(c, 0), n.size) for c in (default_tokens, tokens))
    return float(np.mean(cost[:, i_default] > cost[:, i_tokens]))


def recommend(
    profile,
    shape,
    run: RunConfig,
    user: UserChoices = UserChoices(),
    *,
    band: bool = False,
    tokens: Any = "budget",
    min_confidence: float = MIN_CONFIDENCE,
) -> Recommendation:
    """The one decision path: the fusion range, then (<= 0.31) the schedule and its cutoff (§9)."""
    # the fusion range first, then (vLLM <= 0.31) the schedule and its SP threshold computed with
    # exactly that range, so every number printed belongs to the configuration emitted.
    # `user.asynctp` None: tpcost chooses SP+AsyncTP, SP alone or neither; False: SP alone or
    # neither (AsyncTP off by the user, or by vLLM's resolution of an unset fuse_gemm_comms); True:
    # SP+AsyncTP or neither. `tokens`: the table's token counts ("budget": the budget alone; None:
    # analyse's display default). The fusion range is decided here: run.regime.fi_max_bytes must be
    # unset (the user's value is user.fi_max_mb).
    from .analysis import analyse, decided_schedule
    from . import ops
    from . import fused_ops
    from .errors import TpcostError

    if run.regime.fi_max_bytes is not None:
        raise TpcostError(
            "recommend decides the FlashInfer fusion range: give the user's limit as "
            "UserChoices.fi_max_mb, not run.regime.fi_max_bytes"
        )
    tp, dtype, max_num_batched_tokens, asynctp = (
        run.tp,
        run.dtype,
        run.max_num_batched_tokens,
        user.asynctp,
    )
    vllm = run.regime.vllm
    fusion = decide_fusion(profile, shape, run, user, min_confidence=min_confidence)
    no_fusion_draft(user, fusion, profile.name, tp)
    fi_bytes = (
        None if fusion is None else fusion.tokens * shape.hidden * ops.dtype_mode(dtype).act_bytes
    )
    decided = dataclasses.replace(
        run, regime=dataclasses.replace(run.regime, fi_max_bytes=fi_bytes)
    )
    a = analyse(
        profile,
        shape,
        decided,
        band=band,
        tokens=[max_num_batched_tokens] if tokens == "budget" else tokens,
    )
    sched, cut = decided_schedule(a, asynctp)
    grid = a.grid_tokens
    s: Any = a.grid_speedup_sp if sched == "sp" else a.grid_speedup_sp_asynctp
    at_cut = worst_below = None
    if cut is not None:
        i = int(np.searchsorted(grid, cut))
        at_cut = float(s[i])
        worst_below = float(s[:i].min()) if i > 0 else None
    dv = (
        a.sp_decision_value
        if sched == "sp" or (sched is None and asynctp is False)
        else a.decision_value
    )
    return Recommendation(
        profile.name,
        profile.tier,
        profile.origin,
        bool(profile.modified),
        tp,
        dtype,
        max_num_batched_tokens,
        cut,
        at_cut,
        float(s[-1]),
        worst_below,
        fusion,
        profile.kind,
        fused_ops.symm_mem_entry("gemm_rs", vllm).why_not(profile, tp, dtype),
        dv,
        a.workload,
        vllm,
        sched,
        user.asynctp_choice,
        a,
    )


def draft_token_cap(hidden: int, draft_hidden: int | None, vllm: Vllm) -> int | None:
    """The largest fused token count on which vLLM's limits agree under a wider draft (§9)."""
    # The largest fused token count on which vLLM's two limits agree with a speculative-decoding
    # draft model wider than the target (releases whose fused workspace is sized by the draft:
    # Release.fusion_sized_by_draft), None where no cap applies. Refuses (TpcostError) a draft width
    # that could not change anything. vLLM splits its compile ranges at int(mb·MiB) // (hidden·b)
    # tokens (config/vllm.py _set_compile_ranges) but sizes the fused pass at int(mb·MiB) //
    # (max(hidden, draft)·b) (allreduce_rms_fusion.py _fused_ar_workspace_hidden_dim), and fuses a
    # range only if it ends within the pass's limit: with a wider draft the whole first range is
    # left unfused. Both conversions give the same T only for T < hidden/(draft − hidden); the range
    # is capped there and the MB value taken from the draft's width, so that the two limits agree.
    if draft_hidden is None:
        return None
    if not vllm.release.fusion_sized_by_draft:
        raise TpcostError(
            f"--draft-hidden-size: no effect on vLLM {vllm.label} (its fused all-reduce workspace "
            "is "
            "sized by the target model alone; vLLM >= 0.32 sizes it by the wider of the two)"
        )
    if draft_hidden <= hidden:
        raise TpcostError(
            f"--draft-hidden-size {draft_hidden}: no effect (not wider than the target's hidden "
            "size "
            f"{hidden}; vLLM sizes the fused workspace by the wider of the two)"
        )
    return -(-hidden // (draft_hidden - hidden)) - 1  # the largest T with T·draft < (T + 1)·hidden


def no_fusion_draft(
    user: UserChoices, fusion: FusionRange | None, profile_name: str, tp: int, why: str = ""
) -> None:
    """Refuse --draft-hidden-size where there is no FlashInfer fusion range to size (§9)."""
    if user.draft_hidden_size is not None and fusion is None:
        raise TpcostError(
            "--draft-hidden-size: no effect here "
            f"({why or f'no FlashInfer fusion in vLLM tables for {profile_name} at tp={tp}'}; "
            "only the fusion range reads it)"
        )


@dataclasses.dataclass(frozen=True)
class SiteDecision:
    """One call site of the fused kernel on the workload (s per forward, expected; §15)."""

    site: Any  # costmodel.shapes.CallSite
    # the switch on: the kernel where vLLM's rule (M >= 128) runs it, the unfused path below
    expected_on_s: float
    # the switch off: the GEMM, then vLLM's collective (and the norm, fused where vLLM fuses)
    expected_off_s: float
    # tpcost's own M from which the kernel pays here (None: never; costmodel.analysis)
    cutoff_tokens: int | None
    # the M from which the kernel is faster at every M to the budget (None: not)
    crossover_tokens: int | None = None


@dataclasses.dataclass(frozen=True)
class KernelSwitch:
    """Should vLLM's switch for its fused GEMM+RS/AR kernel be on for this traffic (§15)?"""

    env: str
    vllm_default_on: bool
    set_on: bool
    expected_on_s: float  # per forward over the workload, every site
    expected_off_s: float
    margin: float  # the risk premium a move away from vLLM's default must clear
    sites: tuple[SiteDecision, ...]
    # the FlashInfer AR+norm range the unfused arm was priced with (None: vLLM's table)
    fi_tokens: int | None
    steps_above_budget: (
        float  # share of the workload's steps above max_num_batched_tokens (weighted as chunks)
    )
    # CallSites where can_run refuses the kernel: vLLM keeps the unfused path there
    refused_sites: tuple = ()
    # vLLM's own dispatch of the kernel (costmodel.vllm_tables.gate_rule), e.g. M >= 128
    vllm_rule: str = ""

    @property
    def saving_vs_vllm_default_s(self) -> float:
        """Expected time per forward saved against vLLM's default (0 when they agree; §15)."""
        at = lambda on: self.expected_on_s if on else self.expected_off_s  # noqa: E731
        return at(self.vllm_default_on) - at(self.set_on)

    def to_json(self) -> dict:
        return {
            "env": self.env,
            "vllm_default_on": self.vllm_default_on,
            "set_on": self.set_on,
            "expected_on_s": self.expected_on_s,
            "expected_off_s": self.expected_off_s,
            "saving_vs_vllm_default_s": self.saving_vs_vllm_default_s,
            "margin": self.margin,
            "fi_fusion_tokens": self.fi_tokens,
            "steps_above_budget": self.steps_above_budget,
            "sites": [
                {
                    "site": d.site.name,
                    "n": d.site.n,
                    "k": d.site.k,
                    "calls_per_forward": d.site.calls_per_forward,
                    "weights": d.site.weights,
                    "refused": d.site.refused,
                    "expected_on_s": d.expected_on_s,
                    "expected_off_s": d.expected_off_s,
                    "cutoff_tokens": d.cutoff_tokens,
                    "crossover_tokens": d.crossover_tokens,
                }
                for d in self.sites
            ],
            "refused_sites": [{"site": s.name, "why": s.refused} for s in self.refused_sites],
            "vllm_rule": self.vllm_rule,
        }


def kernel_switch(
    profile, sites, op: str, run: RunConfig, fi_tokens: int | None = None, family: str | None = None
) -> KernelSwitch:
    """The switch of vLLM's fused GEMM+RS/AR kernel, decided on the traffic (§15)."""
    # the expected time per forward with it on (the kernel at every site where vLLM's rule, M >=
    # 128, runs it) against off, over every step of 1 .. max_num_batched_tokens tokens (the
    # release's fused_ops entry, its arms per site). vLLM's default moves only when the other
    # setting is faster by more than the risk premium `margin` on the time the switch controls.
    from . import fused_ops, ops
    from .analysis import crossover_tokens, decide_cutoff
    from .workload import weights_on
    from .vllm_tables import SWITCHES, gate_rule, kernel_missing

    tp, max_num_batched_tokens, margin, workload = (
        run.tp,
        run.max_num_batched_tokens,
        run.margin,
        run.workload,
    )
    vllm = run.regime.vllm
    sw = SWITCHES[op]
    if vllm.kernel is None:
        raise TpcostError(f"{sw.env}: {kernel_missing(vllm)}")
    n_tok = np.arange(1, max_num_batched_tokens + 1, dtype=float)
    w, share = weights_on(workload, n_tok), 0.0
    if workload is not None:
        above = sum(c for n, c in workload.points if n > max_num_batched_tokens) + sum(
            c for lo, _, c in workload.buckets if lo >= max_num_batched_tokens
        )
        share = float(above / workload.total) if workload.total else 0.0
    rule, _, vllm_runs, _ = gate_rule(vllm, family or "", op)
    runs = vllm_runs(n_tok)
    decisions = []
    on = off = 0.0
    entry = fused_ops.kernel_entry(op, vllm)
    for site in sites:
        if site.weights is None:
            continue
        why = entry.why_not_served(profile, tp, site.weights, site.n)
        if why:
            raise TpcostError(f"{sw.env} has no effect here: {why}")
        act_bytes = ops.dtype_mode("fp8" if site.weights == "mxfp8" else "bf16").act_bytes
        fi = None if fi_tokens is None else float(fi_tokens * site.n * act_bytes)
        spec = fused_ops.OpSpec(
            op,
            entry.impl,
            tp,
            site.n,
            site.k,
            site.weights,
            0,
            vllm,
            norm_after=site.norm_after,
            fi_max_bytes=fi,
        )
        pair = entry.arms(profile, spec, n_tok)
        f, u = pair.fused_s * site.calls_per_forward, pair.unfused_s * site.calls_per_forward
        t_on, t_off = float(np.sum(w * np.where(runs, f, u))), float(np.sum(w * u))
        cut = decide_cutoff(n_tok, u, f, margin, w)
        decisions.append(SiteDecision(site, t_on, t_off, cut, crossover_tokens(n_tok, u, f)))
        on, off = on + t_on, off + t_off
    if not decisions:
        raise TpcostError(
            f"{sw.env} has no effect: vLLM binds the kernel at none of these call sites ("
            + "; ".join(f"{s.name}: {s.refused}" for s in sites)
            + ")"
        )
    keep, move = (on, off) if sw.default_on else (off, on)
    set_on = sw.default_on if move * (1.0 + margin) >= keep else not sw.default_on
    return KernelSwitch(
        sw.env,
        sw.default_on,
        set_on,
        on,
        off,
        margin,
        tuple(decisions),
        fi_tokens,
        share,
        tuple(s for s in sites if s.weights is None),
        rule,
    )


@dataclasses.dataclass(frozen=True)
class KernelModelConfig:
    """vllm-config for a model whose switch tpcost answers but whose forward it does not (§15)."""

    # vllm-config and the plugin for a model whose forward tpcost does not model but whose
    # fused-kernel switch it answers (costmodel.vllm_tables): the fusion range first, then the
    # switch priced with exactly that range.

    # None: not in vLLM's tables here, or model-level SP (no all-reduce to fuse)
    fusion: FusionRange | None
    switch: KernelSwitch | None  # None: no --kernel-op asked
    mode: str | None  # the mode the worker binds (gemm_ar | gemm_rs | None)
    # costmodel.gates.GateDecision: the release's hand cutoffs in this model's code
    gates: tuple = ()

    def pass_config(self) -> dict:
        f = self.fusion
        if f is None:
            return {}
        return {
            "fuse_allreduce_rms": f.tokens > 0,
            **({"fi_allreduce_fusion_max_size_mb": f.mb} if f.tokens else {}),
        }


def kernel_model_config(
    profile,
    km,
    par,
    op: str | None,
    run: RunConfig | None = None,
    user: UserChoices = UserChoices(),
    min_confidence: float = MIN_CONFIDENCE,
) -> KernelModelConfig:
    """The one decision path of a kernel model (vllm-config --kernel-op, the plugin; §15)."""
    # The one decision path of a kernel model (vllm-config --kernel-op and the plugin): raises
    # TpcostError, in one line, where the switch has no effect. `run` (None: bf16 at par.tp, the
    # current release) gives the budget, margin, workload and vLLM; its tp must be the parallel
    # setup's.
    from .errors import TpcostError
    from .vllm_tables import SWITCHES, kernel_missing

    run = RunConfig(par.tp, "bf16", Regime()) if run is None else run
    if run.tp != par.tp or run.dtype != "bf16":
        raise TpcostError(
            f"kernel_model_config: the run's tp {run.tp} / dtype {run.dtype} must be the parallel "
            f"setup's tp {par.tp} and the kernel's bf16"
        )
    if run.workload is not None and run.workload.contexts:  # vllm-config and the plugin alike
        raise TpcostError(
            f"{run.workload.name}: its context_len column has no effect for {km.name} (the "
            "kernel's "
            "call sites do not read the KV cache); drop the column"
        )
    vllm = run.regime.vllm
    if op is not None:
        if vllm.kernel is None:
            raise TpcostError(f"{SWITCHES[op].env}: {kernel_missing(vllm)}")
        why = km.switch_problem(op, par)
        if why:
            raise TpcostError(why)
    mode = km.mode(par)
    fusion = None
    if mode != "gemm_rs":
        fusion = decide_fusion(
            profile,
            km,
            run,
            user,
            units_per_forward=km.ar_norm_units_per_forward(),
            min_confidence=min_confidence,
        )
    no_fusion_draft(
        user,
        fusion,
        profile.name,
        par.tp,
        "model-level SP: no all-reduce+RMSNorm to fuse" if mode == "gemm_rs" else "",
    )
    switch = None
    if op is not None:
        sites = km.call_sites(op, par, vllm)
        switch = kernel_switch(
            profile,
            sites,
            op,
            run,
            fi_tokens=None if fusion is None else fusion.tokens,
            family=km.family,
        )
    from .gates import model_gates

    return KernelModelConfig(fusion, switch, mode, model_gates(profile, km, par, run))
