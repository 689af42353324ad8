"""DBO decided for vLLM 0.34: both thresholds, the saving, and the arguments to paste (docs/model.md
§12)."""

from __future__ import annotations

import dataclasses

from costmodel.defaults import DEFAULT_MARGIN

from costmodel.vllm_tables import ep_rules

EP = ep_rules()
VLLM_DBO = EP.dbo_thresholds
UBATCHES = EP.ubatches


def phase_weights(w, phase: str, budget: int):
    """(the traffic's weights over 1..budget tokens per rank for one phase, what they are): a
    workload's rows of that phase (decode: its uniform-decode rows; prefill: every other step,
    vLLM's 'mixed'), the whole workload where it has no phase column, uniform without one or where
    the workload counts no step of that phase."""
    import numpy as np

    from costmodel.workload import grid_weights, phase_workload

    if w is None:
        return None, "uniform over 1..budget"
    pw = phase_workload(w, "decode" if phase == "decode" else "mixed")
    if pw is None:
        return None, f"uniform over 1..budget ({w.name} counts no {phase} step)"
    return grid_weights(pw, np.arange(1, budget + 1, dtype=float)), pw.name


def _band_json(band) -> dict:
    """A phase's threshold band as JSON: its edges (None: never), the share of draws that never pay,
    the drivers."""
    from costmodel.analysis import band_drivers_json

    return {
        "lo_tokens": band[0],
        "hi_tokens": band[1],
        "never_share": band.never_share,
        "drivers": band_drivers_json(band),
    }


def decide_dbo(args, s, band: bool = True) -> dict:
    """The DBO decision for the setup: per phase the threshold, crossover and saving; the vLLM
    arguments; why."""
    from costmodel.all2all import backend
    from costmodel.ep_step import dbo_band, dbo_threshold

    b = backend(s.backend)
    if not b.microbatches:
        return {
            "enable": False,
            "decode_token_threshold": None,
            "prefill_token_threshold": None,
            "saving_s": 0.0,
            "band": None,
            "why": "vLLM 0.34 runs DBO on CUDA only with deepep_low_latency, "
            f"deepep_high_throughput or nixl_ep ({EP.dbo_backends_cite}); {s.backend} cannot "
            "microbatch",
            "vllm_args": [],
        }
    margin = DEFAULT_MARGIN if args.margin is None else args.margin
    phases, bands = {}, {}
    traffic = {
        ph: phase_weights(getattr(args, "workload_obj", None), ph, s.budget_tokens)
        for ph in ("decode", "prefill")
    }
    for phase in ("decode", "prefill"):
        ps = dataclasses.replace(s, decode=phase == "decode")
        w, _ = traffic[phase]
        phases[phase] = dbo_threshold(ps, s.budget_tokens, margin, w)
        if band:
            bands[phase] = _band_json(dbo_band(ps, s.budget_tokens, margin, weights=w))
    d, p = phases["decode"], phases["prefill"]
    enable = d.threshold_tokens is not None or p.threshold_tokens is not None
    never = s.budget_tokens + 1  # a threshold above the budget: that phase never microbatches
    k = getattr(args, "num_speculative_tokens", None) or 0
    # vLLM raises both thresholds to this under speculative decoding (EP.spec_decode_cite)
    floor = UBATCHES * (1 + k)
    dt = max(d.threshold_tokens or never, floor)
    pt = max(p.threshold_tokens or never, floor)
    why = []
    for name, ph in phases.items():
        if ph.threshold_tokens is None:
            d_s = ph.t_on_at_max_s - ph.t_off_at_max_s
            why.append(
                f"{name}: DBO never pays up to {ph.t_max} tokens per rank (the doubled weight "
                "reads and "
                f"per-call costs exceed the hidden all-to-all): at {ph.t_max} tokens it costs "
                f"{d_s * 1e3:+.3f} ms per step ({100 * d_s / ph.t_off_at_max_s:+.1f} %)"
            )
        else:
            why.append(
                f"{name}: pays from {ph.threshold_tokens} tokens per rank, saving "
                f"{ph.saving_s * 1e3:.3f} ms per step ({100 * ph.saving_s / ph.mean_step_s:.1f} "
                "%), "
                f"{ph.saving_vs_vllm_s * 1e3:.3f} ms against DBO on at vLLM's "
                f"{ph.vllm_threshold_tokens}"
            )
    if k and floor > min(d.threshold_tokens or never, p.threshold_tokens or never):
        why.append(
            f"with {k} speculative tokens vLLM raises a threshold below {floor} (microbatches x "
            "the decode "
            f"query length) to {floor} ({EP.spec_decode_cite}): emitted as {floor}"
        )
    if s.budget_tokens < VLLM_DBO["prefill"]:
        why.append(
            f"vLLM's prefill threshold {VLLM_DBO['prefill']} is above the budget of "
            f"{s.budget_tokens} tokens "
            "per rank: at vLLM's default it never triggers"
        )
    out = {
        "enable": enable,
        "decode_token_threshold": dt if enable else None,
        "prefill_token_threshold": pt if enable else None,
        "saving_s": d.saving_s + 0.0 if enable else 0.0,
        "saving_share": (d.saving_s / d.mean_step_s) if enable else 0.0,
        "phases": {k: dataclasses.asdict(v) for k, v in phases.items()},
        "vllm_defaults": dict(VLLM_DBO),
        "band": bands or None,
        "band_why": (
            "each threshold's 5-95 % over 100 draws of the GPU profile's and the network's numbers "
            "the "
            "step reads, each at its sigma"
            if band
            else "not drawn here"
        ),
        "why": "; ".join(why),
        "traffic": {ph: what for ph, (_, what) in traffic.items()},
        "assumes": (
            "every DP rank at the same token count (the DP vote's minimum equals its maximum: a "
            "workload's "
            "num_tokens is tokens per DP rank; a /metrics scrape holds neither the split nor the "
            "ranks' "
            "spread; --dp-token-spread R states it)"
            if s.dp_token_spread == 1.0
            else f"a step's largest DP rank at {s.dp_token_spread:g} x its smallest "
            "(--dp-token-spread): the "
            "workload's num_tokens and the thresholds count the smallest rank's tokens, which "
            "vLLM's vote "
            "compares, and each step is priced at the largest's, which every rank pads to"
        ),
        "dp_token_spread": s.dp_token_spread,
    }
    out["vllm_args"] = (
        [
            "--enable-dbo",
            "--dbo-decode-token-threshold",
            str(dt),
            "--dbo-prefill-token-threshold",
            str(pt),
        ]
        if enable
        else []
    )
    out["comm_sms"] = (
        _comm_sms(s, phases, traffic, margin)
        if enable and s.backend == "deepep_high_throughput"
        else None
    )
    return out


def _comm_sms(s, phases: dict, traffic: dict, margin: float) -> dict:
    """VLLM_DBO_COMM_SMS per phase where DBO runs (costmodel.ep_step.comm_sms_choice): a what-if
    with its saving; the environment variable takes one value for both phases."""
    from costmodel.ep_step import comm_sms_choice

    out = {}
    for phase, ph in phases.items():
        if ph.threshold_tokens is None:
            continue
        c = comm_sms_choice(
            dataclasses.replace(s, decode=phase == "decode"),
            s.budget_tokens,
            margin,
            ph.threshold_tokens,
            traffic[phase][0],
        )
        out[phase] = {
            "sms": c.sms,
            "vllm_sms": c.vllm_sms,
            "saving_s": c.saving_s,
            "mean_step_s": c.mean_step_s,
            "bound": c.bound,
            "step_s_by_sms": {str(k): v for k, v in c.step_s_by_sms.items()},
        }
    return {
        "env": "VLLM_DBO_COMM_SMS",
        "phases": out,
        "cite": EP.sm_control_cite,
        "deepep_sms": EP.deepep_sms,
        "assumes": "DeepEP's normal kernels move every byte through their SMs at "
        "DEEPEP_V2_README's SM100 rate "
        "per SM (one pair of rows: 24 and 64 SMs), carried to every GPU",
    }


def render_dbo(d: dict) -> None:
    """The decision as text, vLLM's defaults beside it."""
    if not d["enable"]:
        print(f"DBO: keep it off. {d['why']}")
        return
    print(
        f"DBO: turn it on. decode threshold {d['decode_token_threshold']} (vLLM "
        f"{d['vllm_defaults']['decode']}), "
        f"prefill threshold {d['prefill_token_threshold']} (vLLM {d['vllm_defaults']['prefill']})"
    )
    for k, ph in d["phases"].items():
        bd = (d["band"] or {}).get(k)
        band = (
            ""
            if bd is None
            else (
                f", band [{bd['lo_tokens'] or 'never'}, {bd['hi_tokens'] or 'never'}]"
                + (f" (never in {bd['never_share']:.0%} of the draws)" if bd["never_share"] else "")
            )
        )
        print(
            f"  {k}: crossover {ph['crossover_tokens']}, threshold {ph['threshold_tokens']}{band}, "
            "saving "
            f"{ph['saving_s'] * 1e3:.3f} ms per step of {ph['mean_step_s'] * 1e3:.3f} ms"
        )
        if bd and bd["drivers"]:
            print(
                "    what moves it: "
                + ", ".join(f"{x['quantity']} {x['rank_correlation']:+.2f}" for x in bd["drivers"])
            )
    print(f"  {d['why']}")
    cs = d.get("comm_sms")
    for k, c in ((cs or {}).get("phases") or {}).items():
        keep = c["sms"] == c["vllm_sms"]
        print(
            f"  {cs['env']} ({k}): {'keep' if keep else 'set'} {c['sms']} (vLLM {c['vllm_sms']}; "
            "DeepEP runs on "
            f"min(S, {cs['deepep_sms']}) SMs, DeepGEMM on the others), saving "
            f"{c['saving_s'] * 1e3:.3f} ms per step "
            f"of {c['mean_step_s'] * 1e3:.3f} ms; the dispatch is {c['bound']}-bound there"
        )
    if cs and cs["phases"]:
        print(f"    assumes: {cs['assumes']}")
    print("  vllm serve ... " + " ".join(d["vllm_args"]))
