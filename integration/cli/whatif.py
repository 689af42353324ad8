"""`tpcost whatif`: speedups, the cutoff, its band and the breakdown for one (GPU, model, TP,
dtype)."""

from __future__ import annotations

import math

from costmodel.errors import TpcostError
from costmodel.io import JSON_SCHEMA_VERSION, dumps_json

from .common import (
    add_shape_args,
    add_vllm_args,
    check_min_confidence,
    check_overrides_read,
    check_plot_args,
    fi_max_bytes_arg,
    load_workload_arg,
    refuse_unused_limits,
    regime_arg,
    resolve_inputs,
    run_config_arg,
    tokens_arg,
    traced,
    user_choices_arg,
)

SENSITIVITY_SHOWN = 5


def _fmt_ms(x):
    return f"{x * 1e3:10.3f}"


def cmd_whatif(args) -> int:
    """tpcost whatif: the answer (_answer), then --plot, then JSON or the text report (_render)."""
    check_plot_args(args)
    _refuse_sweep_flags_with_ops(args)
    prof, overrides, shape, vllm = resolve_inputs(args)
    if args.network is not None:
        dom = int(prof.interconnect.domain_size)
        if args.tp <= dom:
            raise TpcostError(
                f"--network: no effect at tp={args.tp}: the TP group stays inside one NVLink "
                "domain "
                f"({dom} GPUs on {prof.name}); it prices TP beyond it"
            )
        prof = prof.with_network(args.network)
    if args.ops is not None:
        return _print_ops(prof, overrides, shape, vllm, args)
    r, out = _answer(args, prof, overrides, shape, vllm)
    if args.plot:
        from costmodel.plot import plot_whatif

        plot_whatif(r.analysis, args.plot)
    if args.json:
        print(dumps_json({"schema_version": JSON_SCHEMA_VERSION, **out}, indent=2))
        return 0
    _render(args, prof, shape, r, out)
    return 0


def _refuse_sweep_flags_with_ops(args) -> None:
    """--ops replaces the sweep by one token count: the sweep's flags are refused beside it."""
    if args.ops is None:
        return
    from costmodel.errors import TpcostError

    from costmodel.decide import MIN_CONFIDENCE

    for flag, given in (
        ("--plot", args.plot),
        ("--workload", args.workload),
        ("--tokens", args.tokens),
        ("--no-band", args.no_band),
        ("--min-confidence", args.min_confidence != MIN_CONFIDENCE),
    ):
        if given:
            raise TpcostError(
                f"whatif --ops {args.ops}: {flag} belongs to the sweep, which --ops replaces by "
                "one "
                "token count"
            )


def _answer(args, prof, overrides, shape, vllm):
    """(the recommendation, its JSON): vllm-config's decision path, so the same answer, with the
    fusion range, the release and the band's measured coverage beside the analysis. The one model
    call also says which --set keys it read."""
    from costmodel.analysis import analysis_json

    from costmodel.decide import decide_fusion, recommend

    run = run_config_arg(args, vllm, load_workload_arg(args))
    refuse_unused_limits(
        vllm,
        lambda v: _forward_times(prof, shape, run, v),
        f"{shape.name} at tp={args.tp} up to {args.max_num_batched_tokens} tokens",
    )
    model_prof, reads = traced(prof, overrides)
    r = recommend(
        model_prof,
        shape,
        run,
        user_choices_arg(args),
        band=not args.no_band,
        tokens=args.tokens,
        min_confidence=args.min_confidence,
    )
    check_overrides_read(prof, overrides, reads, shape, args)
    check_min_confidence(
        args,
        r.fusion,
        lambda p: decide_fusion(prof, shape, run, user_choices_arg(args), min_confidence=p),
    )
    out = analysis_json(r.analysis)
    if out.get("cutoff_band_tokens") is not None:
        out["band_measured_coverage"] = band_coverage()
    f = r.fusion
    out["fusion_range"] = (
        None
        if f is None
        else {
            "tokens": f.tokens,
            "mb": f.mb,
            "why": f.why,
            "vllm_default_tokens": f.vllm_default_tokens,
            "confidence": f.confidence,
        }
    )
    out["vllm_version"], out["vllm_version_source"] = vllm.label, vllm.source
    if not r.has_sp:  # a release without the SP pass: no SP threshold to show
        out.update(
            cutoff_tokens=None,
            sp_cutoff_tokens=None,
            cutoff_band_tokens=None,
            decided_schedule=None,
            decided_threshold_tokens=None,
            sp_passes=False,
        )
    return r, out


def _render(args, prof, shape, r, out) -> None:
    """The text report, section by section."""
    from integration.recommend import fusion_lines

    a, vllm = r.analysis, r.vllm
    _header_and_table(args, prof, shape, r, out)
    for line in fusion_lines(r.fusion, prof.name, args.tp):
        print(line.removeprefix("tpcost: "))
    if not r.has_sp:
        print(
            f"\nvLLM {vllm.label} has no SP/AsyncTP passes for this model "
            f"({vllm.release.sp_passes_cite}): no SP "
            "threshold to decide, and what it decides instead is the FlashInfer fusion range "
            "above; the SP columns are "
            "the schedules a release with the passes would run (--vllm-version "
            + sp_release_label()
            + ")"
        )
        _notes_and_provenance(a, prof)
        return
    for sched, why in a.table.unavailable.items():
        print(f"\n{sched}: {why}")
    _cutoff_lines(args, r)
    _sensitivity_lines(args, a)
    _value_line(r)
    if a.breakdown_at_cutoff:
        print(
            "\nbreakdown at the cutoff, per forward [ms] (every term: positive = SP+AsyncTP saves; "
            "they sum to "
            "t_tp - t_sp+async):"
        )
        for k, v in a.breakdown_at_cutoff.items():
            print(f"  {k[:-2]:24s} {v * 1e3:+9.3f}")
    _notes_and_provenance(a, prof)


def _header_and_table(args, prof, shape, r, out) -> None:
    """The header (what was asked, the decode context, --set) and the table over N."""
    from costmodel.profile import DERIVED_FROM_LINK

    a = r.analysis
    given = [k for k in prof.modified if prof.provenance[k].source != DERIVED_FROM_LINK]
    n_derived = len(prof.modified) - len(given)
    mod = (
        (
            f"  [MODIFIED by --set: {', '.join(given)}"
            + (f" (+{n_derived} quantities that ride on the link)" if n_derived else "")
            + "]"
        )
        if prof.modified
        else ""
    )
    dec = a.run.regime.decode
    per_row = dec is not None and bool(dec.context_grid)
    ctx = (
        "every token prefill (--context-len 0)"
        if dec is None
        else f"decode context per row from {a.workload}'s context_len column (ctx)"
        if per_row
        else f"decodes read {dec.context_len:g} tokens of KV each (--context-len), up to "
        f"{dec.max_num_seqs} per step"
    )
    print(
        f"tpcost whatif: {shape.name} on {prof.name} x{args.tp}, {args.dtype}, prefill seq_len "
        f"{args.seq_len}, {ctx}; "
        f"{r.vllm.describe()}{mod}"
    )
    if args.tp > int(prof.interconnect.domain_size):
        print(
            f"  TP spans {-(-args.tp // int(prof.interconnect.domain_size))} NVLink domains: the "
            "collectives cross "
            f"network {prof.interconnect.network} (--network)"
        )
    print(
        f"{'N tokens':>9} {'t_tp [ms]':>10} {'t_sp [ms]':>10} {'t_sp+async [ms]':>16} "
        f"{'speedup sp':>11} {'speedup sp+async':>17}" + (f" {'ctx':>8}" if per_row else "")
    )

    def cell(x, fmt):
        return "n/a" if x is None else fmt(x)

    for row in out["rows"]:
        mark = "  <- cutoff" if r.has_sp and row["num_tokens"] == a.cutoff_tokens else ""
        if row["host_bound"]:
            mark += "  host-bound: " + ", ".join(row["host_bound"])
        c = (
            f" {row['decode_context_len']:7.0f}"
            + ("*" if row["decode_context_from"] == "workload mean" else " ")
            if per_row
            else ""
        )
        print(
            f"{row['num_tokens']:9d} {_fmt_ms(row['t_tp_s'])} {cell(row['t_sp_s'], _fmt_ms):>10} "
            f"{cell(row['t_sp_asynctp_s'], _fmt_ms):>16} "
            f"{cell(row['speedup_sp'], '{:.3f}'.format):>11} "
            f"{cell(row['speedup_sp_asynctp'], '{:.3f}'.format):>17}{c}{mark}"
        )
    print(
        "(times per forward pass; speedup = t_tp / t_schedule"
        + (
            "; host-bound: the eager step waits on the host's issue time, so it stays flat over N"
            if any(row["host_bound"] for row in out["rows"])
            else ""
        )
        + ")"
    )
    if per_row:
        print(
            "(ctx: the KV context each decode of that row is priced at, the count-weighted mean "
            f"of {a.workload}'s "
            "steps that pad to it; * no step of the workload pads there, so the workload's mean "
            "context over all "
            f"its steps, {dec.context_len:.0f}; such a row carries no weight in the decision)"
        )


def _never(x) -> str:
    return "never" if x is None else str(x)


def _cutoff_lines(args, r) -> None:
    """Each schedule's cutoff with its band, the decided schedule and vLLM's own default."""
    from costmodel.analysis import band_drivers_text

    a, vllm = r.analysis, r.vllm
    band = a.cutoff_band_tokens
    band_s = "" if band is None else f"  band (5-95%): {band.text()}"
    if band is not None and a.band_resolution_tokens != args.tp:
        band_s += f" (band and sensitivity decided every {a.band_resolution_tokens} tokens)"
    cut = (
        f"{a.cutoff_tokens} ({a.cutoff_mib():.1f} MiB per GPU: the residual stream x N / tp)"
        if a.cutoff_tokens is not None
        else "never (null)"
    )
    print(
        f"\ncutoff (SP+AsyncTP; the threshold minimising the expected forward time over N <= "
        f"{args.max_num_batched_tokens}, {a.workload}, risk premium {args.margin:.0%}): "
        f"{cut}{band_s}"
    )
    if band_drivers_text(band):
        print(band_drivers_text(band))
    if band is not None:
        cov = band_coverage()
        print(
            "  the band's measured coverage of released op rows, each source held out: "
            + ", ".join(f"{sid} {c['covered']:.0%} of {c['rows']}" for sid, c in cov.items())
            + " (docs/accuracy.md)"
        )
    if a.cutoff_by_spread:
        print(
            "  the same decision with each histogram bucket spread otherwise: "
            + ", ".join(f"{k} {_never(v)}" for k, v in a.cutoff_by_spread.items())
        )
    print(
        "cutoff (SP alone): "
        f"{a.sp_cutoff_tokens if a.sp_cutoff_tokens is not None else 'never (null)'}"
    )
    print(
        f"crossover (faster than plain TP at every N from here to {args.max_num_batched_tokens}, "
        "no premium, any "
        f"traffic): SP+AsyncTP {_never(a.crossover('sp_asynctp'))}, SP alone "
        f"{_never(a.crossover('sp'))}"
    )
    print(
        f"decided: {r.schedule_name}"
        + (f" from {r.cutoff_tokens} tokens" if r.cutoff_tokens is not None else "")
        + " (the schedule with the least expected forward time at its own cutoff, premium "
        "included; what "
        "vllm-config emits)"
    )
    vd = a.vllm_default_tokens
    why_off = (
        "SP off (vLLM turns SP off at tp 1)"
        if args.tp < 2
        else "SP off (its table covers sm90/sm100 with hidden >= 8192 and XPU with hidden >= 4096)"
    )
    print(
        f"vLLM {vllm.label}'s own default here: "
        + (f"sp_min_token_num {vd}" if vd is not None else why_off)
    )


def _sensitivity_lines(args, a) -> None:
    """The inputs that move the cutoff, largest first, and how many there are (none: said so)."""
    if a.sensitivity is None:  # not drawn (--no-band)
        return
    k = len(a.sensitivity)
    few = (
        "; on this traffic the cutoff can sit only at the workload's own step sizes, so few inputs "
        "move it at all"
        if args.workload
        else ""
    )
    shown = (
        f"the {SENSITIVITY_SHOWN} that move it most of {k}"
        if k > SENSITIVITY_SHOWN
        else f"all {k} that move it" + few
        if k
        else "none of them moves it" + few
    )
    print(
        "\nwhat moves the cutoff (each input alone scaled by e^-s and e^+s, s = its tier's sigma; "
        f"{shown})" + (":" if k else "")
    )
    if not k:
        return
    print(f"  {'quantity':56s} {'tier':22s} {'x e^-s':>7s} {'x e^+s':>7s}")
    for row in a.sensitivity[:SENSITIVITY_SHOWN]:
        print(
            f"  {row['quantity']:56s} {row['tier']:22s} "
            f"{_never(row['cutoff_minus_sigma_tokens']):>7s} "
            f"{_never(row['cutoff_plus_sigma_tokens']):>7s}"
        )


def _value_line(r) -> None:
    """The decided schedule's value on the workload, as vllm-config reports it (issue 50 item 5)."""
    dv = r.decision_value
    if not dv:
        return
    ms = lambda x: f"{x * 1e3:.3f} ms"  # noqa: E731
    line = (
        f"value of the decision ({r.schedule_name}, expected forward "
        f"{ms(dv['expected_forward_s'])}): saves "
        f"{ms(dv['saving_vs_never_s'])} ({dv['saving_vs_never_rel']:.1%}) against never"
    )
    if "saving_vs_vllm_default_s" in dv:
        v = dv["saving_vs_vllm_default_s"]
        line += (
            f", {ms(v)} against vLLM's default"
            if v is not None
            else ", and vLLM's default would enable an op that cannot run here"
        )
    oc = dv["oracle_cutoff_tokens"]
    line += (
        f"; regret against the best threshold in hindsight ({_never(oc)}): "
        f"{ms(dv['regret_vs_oracle_s'])}"
    )
    print(line)


def _forward_times(prof, shape, run, vllm) -> list:
    """Every schedule's forward time over the cutoff's grid for the vLLM `vllm` (what a --vllm-set
    limit must move)."""
    import dataclasses

    from costmodel.analysis import token_grid
    from costmodel.model import predict

    regime = dataclasses.replace(run.regime, vllm=vllm)
    pred = predict(
        prof, shape, run.tp, run.dtype, token_grid(run.tp, run.max_num_batched_tokens), regime
    )
    return [pred.t_forward_s(s).tolist() for s in pred.schedules]


def _notes_and_provenance(a, prof) -> None:
    for n in a.table.notes:
        print(f"note: {n}")
    if a.memory and a.memory.get("note"):
        print(f"note: {a.memory['note']}")
    from costmodel.analysis import calibration_note, provenance_line

    cal = calibration_note(prof, a.run.tp)
    if cal:
        print(f"note: {cal}")

    print("\n" + provenance_line(prof))


def _print_ops(prof, overrides, shape, vllm, args) -> int:
    """whatif --ops N: every op of each schedule at N, with the formula that times it."""
    from costmodel.analysis import ops_view
    from costmodel.model import predict

    model_prof, reads = traced(prof, overrides)
    pred = predict(
        model_prof,
        shape,
        args.tp,
        args.dtype,
        [float(args.ops)],
        regime_arg(args, vllm, fi_max_bytes_arg(args), load_workload_arg(args)),
    )
    check_overrides_read(prof, overrides, reads, shape, args)
    view = ops_view(pred)
    if args.json:
        print(
            dumps_json(
                {
                    "schema_version": JSON_SCHEMA_VERSION,
                    "gpu": prof.name,
                    "model": shape.name,
                    "tp": args.tp,
                    "dtype": args.dtype,
                    "num_tokens": args.ops,
                    "vllm_version": vllm.label,
                    "vllm_version_source": vllm.source,
                    "notes": list(pred.notes),
                    "t_forward_s": {s: float(pred.t_forward_s(s)[0]) for s in pred.schedules},
                    "ops": view,
                },
                indent=2,
            )
        )
        return 0
    print(
        f"tpcost whatif --ops {args.ops}: {shape.name} on {prof.name} x{args.tp}, {args.dtype}; "
        f"{vllm.describe()}"
    )
    for name, rows in view.items():
        t = float(pred.t_forward_s(name)[0])
        print(f"\n[{name}]  t_forward {t * 1e3:.3f} ms")
        print(
            f"  {'op':32s} {'calls':>6s} {'t/call [us]':>12s} {'TFLOP/s':>8s} {'HBM GB/s':>9s} "
            f"{'bus GB/s':>9s} "
            f"{'bound':>8s}  formula"
        )
        for r in rows:
            f = lambda x, sc: "" if x is None else f"{x / sc:.1f}"  # noqa: E731
            t_us = "n/a" if not math.isfinite(r["t_s"]) else f"{r['t_s'] * 1e6:.2f}"
            print(
                f"  {r['op'][:32]:32s} {r['calls_per_forward']:6d} {t_us:>12s} "
                f"{f(r['achieved_flops_per_s'], 1e12):>8s} "
                f"{f(r['achieved_hbm_bytes_per_s'], 1e9):>9s} "
                f"{f(r['achieved_bus_bytes_per_s'], 1e9):>9s} "
                f"{r['bound'] or '':>8s}  {r['formula']} ({r['docs']})"
            )
    for n in pred.notes:
        print(f"note: {n}")
    return 0


def register(sub) -> None:
    """Add `whatif` to the CLI root's subparsers."""
    w = sub.add_parser(
        "whatif", help="predict speedups and the cutoff for one (GPU, model, TP, dtype)"
    )
    add_shape_args(w)
    w.add_argument("--json", action="store_true", help="print JSON instead of the table")
    w.add_argument("--plot", metavar="FILE.png", help="also write the speedup curve to this PNG")
    w.add_argument("--force", action="store_true", help="replace an existing --plot file")
    w.add_argument(
        "--no-band",
        action="store_true",
        help="skip the Monte Carlo cutoff band and the sensitivity table",
    )
    w.add_argument(
        "--ops",
        type=tokens_arg,
        metavar="N",
        help="instead of the sweep: every op of each schedule at N tokens with its time, achieved "
        "rate, bound "
        "and formula",
    )
    add_vllm_args(
        w,
        "its dispatch tables time the all-reduces; a release without the SP passes decides only "
        "the fusion "
        "range",
    )
    w.add_argument(
        "--tokens",
        type=tokens_arg,
        nargs="+",
        metavar="N",
        help="token counts for the table (default: powers of two to 65536, plus the cutoff)",
    )
    w.add_argument(
        "--network",
        metavar="NAME|FILE",
        help="the network between NVLink domains, for TP beyond one "
        "(a built-in network or a network .toml; default: the profile's interconnect.network)",
    )
    w.set_defaults(func=cmd_whatif)


def sp_release_label() -> str:
    """The newest release with the compile-time SP passes (costmodel.vllm_tables.RELEASES)."""
    from costmodel.vllm_tables import newest_sp_release

    return newest_sp_release().label


def band_coverage() -> dict:
    """source -> {rows, covered}: how often the band covered each released source's measured op
    speedups, the source held out (calib/band.py; integration/band_coverage.json, rendered from
    benchmarks/results/accuracy.json by tools/render_docs.py)."""
    import json
    from importlib import resources

    return json.loads(resources.files("integration").joinpath("band_coverage.json").read_text())[
        "sources"
    ]
