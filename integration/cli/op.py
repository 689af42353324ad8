"""`tpcost op`: one fused GEMM+collective against vLLM's unfused path over M, and its cutoff."""

from __future__ import annotations

from costmodel.errors import TpcostError
from costmodel.io import JSON_SCHEMA_VERSION, dumps_json

from costmodel.defaults import DEFAULT_BUDGET_TOKENS, DEFAULT_KERNEL_SM_SHARE, DEFAULT_MARGIN

from .common import (
    DEFAULT_GPU,
    MAX_TOKENS,
    add_regime_args,
    add_vllm_args,
    bounded_int,
    cudagraph_arg,
    first_unread,
    fraction,
    load_workload_arg,
    refuse_unused_limits,
    resolve_profile,
    traced,
    vllm_arg,
)


def cmd_op(args) -> int:
    """tpcost op: one fused GEMM+collective against vLLM's unfused path over M, and its cutoff."""
    from costmodel.analysis import band_drivers_text, provenance_line
    from costmodel.model import Regime, RunConfig
    from costmodel.op_analysis import M_STEP, OpQuery, analyse_op

    prof, overrides = resolve_profile(args)
    query = OpQuery(args.op, args.impl, args.n, args.k, args.kernel_sm_share)
    regime = Regime(cudagraph_max_tokens=cudagraph_arg(args), vllm=vllm_arg(args, prof, args.tp))
    run = RunConfig(
        args.tp,
        args.dtype,
        regime,
        args.max_num_batched_tokens,
        args.margin,
        load_workload_arg(args),
    )
    kw = dict(calls_per_forward=args.calls_per_forward, extra_m=args.m or ())
    model_prof, reads = traced(prof, overrides)
    # the one model call: the answer, and the keys it read
    a = analyse_op(model_prof, query, run, **kw)
    key = first_unread(prof, overrides, reads)
    if key is not None:
        raise TpcostError(
            f"--set {key}: no effect on {args.op} ({args.impl}) at tp={args.tp} (the op does "
            "not read it)"
        )
    out = a.to_json()
    check_op_inputs_take_effect(args, prof, query, run, kw, out["rows"])
    _add_extras(args, prof, a, out)
    if args.json:
        from costmodel.analysis import provenance

        pv = provenance(prof)
        print(
            dumps_json(
                {
                    "schema_version": JSON_SCHEMA_VERSION,
                    **out,
                    "modified": pv["modified"],
                    "provenance": {k: pv[k] for k in ("profile", "origin", "tier", "tier_counts")},
                },
                indent=2,
            )
        )
        return 0
    print(
        f"tpcost op: {args.op} ({args.impl}) on {prof.name} x{args.tp}, n={args.n} k={args.k} per "
        f"rank, {args.dtype}, "
        f"{args.calls_per_forward} call(s) per forward; unfused: GEMM + {a.unfused_impl}; "
        f"{regime.vllm.describe()}"
        + (f"  [MODIFIED by --set: {', '.join(prof.modified)}]" if prof.modified else "")
    )
    print(provenance_line(prof))
    kernel = a.waves_per_m is not None  # the op has waves to show
    print(
        f"{'M':>7} {'t_fused [us]':>13} {'t_unfused [us]':>15} {'speedup':>8} {'vLLM runs it':>13}"
        + (f" {'waves':>5}" if kernel else "")
        + "  unfused collective"
    )
    events: dict[int, list[str]] = {}
    for (
        m,
        what,
    ) in a.events():  # a wave step past the 4th moves the time by < 1/4: the JSON lists them all
        if not (what.startswith("waves ") and int(what.split()[3]) > 4):
            events.setdefault(m, []).append(what)
    marks = [(a.cutoff_tokens, "cutoff"), (a.crossover_m, "crossover")]
    shown = (
        set(int(x) for x in (args.m or ()))
        | {1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536}
        | set(events)
        | {m for m, _ in marks if m is not None}
    )
    for r in out["rows"]:
        if r["m"] in shown:
            said = [x for m, x in marks if m == r["m"]] + events.get(r["m"], [])
            mark = ("  <- " + "; ".join(said)) if said else ""
            print(
                f"{r['m']:7d} {r['t_fused_s'] * 1e6:13.2f} {r['t_unfused_s'] * 1e6:15.2f} "
                f"{r['speedup']:8.3f} "
                f"{'yes' if r['vllm_runs_kernel'] else 'no':>13}"
                + (f" {r['waves']:5d}" if kernel else "")
                + f"  {r['unfused_impl']}{mark}"
            )
    print(
        "(rows trimmed to powers of two, --m, the cutoff, the crossover and the steps marked "
        f"(wave steps to 4 waves): {len(out['rows'])} "
        f"rows in all, every multiple of {M_STEP}{_small_rows_text(a, ' and')}; --json lists them)"
    )
    never = "never (null)"
    band = a.cutoff_band
    band_s = "" if band is None else f" (5-95 % band over the profile's uncertainty: {band.text()})"
    print(
        "\ncutoff (fused when M >= c; the c minimising the expected time over M <= "
        f"{args.max_num_batched_tokens}, "
        f"risk premium {args.margin:.0%}): "
        f"{a.cutoff_tokens if a.cutoff_tokens is not None else never} "
        f"[{a.answer}]{band_s}"
        + (
            ""
            if a.cutoff_per_rank is None
            else f"; per rank (vLLM's unit here): ceil(c/{args.tp}) = {a.cutoff_per_rank} rows"
        )
    )
    if band_drivers_text(band):
        print(band_drivers_text(band))
    print(f"vLLM's own rule: {a.vllm_rule}")
    wins = a.wins_m_ranges()
    print(
        "the fused op is faster at M in "
        + (", ".join(f"[{lo}, {hi}]" for lo, hi in wins) if wins else "no row")
    )
    never_ = lambda x: "none" if x is None else str(x)  # noqa: E731
    print(
        "crossover M (the fused op faster at every M from it to the budget): "
        f"{never_(a.crossover_m)}; decided "
        "threshold (least expected time on the workload, premium included): "
        f"{never_(a.cutoff_tokens)}"
    )
    dv = a.decision_value
    if dv.get("saving_vs_vllm_default_s") is not None:
        print(
            "expected saving of tpcost's cutoff against vLLM's rule: "
            f"{dv['saving_vs_vllm_default_s'] * 1e6:.2f} us "
            f"per forward of this op's {args.calls_per_forward} call(s) only "
            "(--calls-per-forward), on the "
            "workload; the rest of the forward is not modelled here, so this is not a share of a "
            "step"
        )
    if args.at is not None:
        _print_breakdown(out["breakdown"], a.kind)
    if args.measured is not None:
        _print_measured(out["measured"])
    for n in a.notes:
        print(f"note: {n}")
    return 0


def _add_extras(args, prof, a, out: dict) -> None:
    """`--at` (each arm part by part) and `--measured` (the author's rows against vLLM's arm) into
    `out`."""
    from costmodel.op_analysis import M_STEP

    if args.at is not None:
        from costmodel.op_analysis import op_breakdown

        if args.at not in set(int(x) for x in a.m):
            raise TpcostError(
                f"--at {args.at}: not a row of this op's sweep (the multiples of {M_STEP} up to "
                f"--max-num-batched-tokens{_small_rows_text(a, ',')}, or one given by --m)"
            )
        out["breakdown"] = op_breakdown(prof, a.spec, args.at)
    if args.measured is not None:
        from costmodel.op_analysis import measured_against_vllm

        out["measured"] = measured_against_vllm(prof, a.spec, args.measured)


def check_op_inputs_take_effect(args, prof, query, run, kw, base_rows) -> None:
    """Refuse what `op` would accept and ignore (issue 50: a flag takes effect or is refused): a
    workload's context_len column (a GEMM + collective reads no KV cache), a CUDA-graph flag that
    leaves every row as it is (the single kernel is one launch either way), and a --vllm-set limit
    the op's unfused collective never consults. Each is judged by the rows with it (`base_rows`, the
    answer's) and without it (no band)."""
    import dataclasses

    from costmodel.op_analysis import analyse_op

    w = run.workload
    if w is not None and w.contexts:
        raise TpcostError(
            f"{w.name}: its context_len column has no effect on op (a GEMM + collective does not "
            "read "
            "the KV cache); drop the column"
        )

    def rows(r):
        return analyse_op(prof, query, r, with_band=False, **kw).to_json()["rows"]

    if run.regime.cudagraph_max_tokens is not None:
        default = dataclasses.replace(
            run, regime=dataclasses.replace(run.regime, cudagraph_max_tokens=None)
        )
        if rows(default) == base_rows:
            flag = (
                "--enforce-eager"
                if args.enforce_eager
                else f"--cudagraph-max-tokens {args.cudagraph_max_tokens}"
            )
            raise TpcostError(
                f"{flag}: no effect on {args.op} ({args.impl}) here (every row is the same under "
                "vLLM's "
                "default capture size: the op issues no host-side pipeline that graphs would hide)"
            )
    refuse_unused_limits(
        run.regime.vllm,
        lambda v: rows(dataclasses.replace(run, regime=dataclasses.replace(run.regime, vllm=v))),
        f"{args.op} ({args.impl}) at tp={args.tp}",
        base_rows,
    )


def _print_measured(d: dict) -> None:
    """`op --measured`: the author's kernel, as measured, against the unfused arm vLLM dispatches
    (the model's)."""
    us = lambda x: f"{x * 1e6:.2f}"  # noqa: E731
    print(
        f"\nyour measured rows ({d['file']}) against vLLM's unfused arm (GEMM + "
        f"{d['unfused_vllm']}, the model's):"
    )
    print(
        f"{'M':>7} {'fused meas. [us]':>16} {'vLLM unfused [us]':>17} {'speedup vs vLLM':>15} "
        f"{'vs your baseline':>16}"
    )
    for r in d["rows"]:
        print(
            f"{r['m']:7d} {us(r['t_fused_measured_s']):>16} {us(r['t_unfused_vllm_s']):>17} "
            f"{r['speedup_vs_vllm']:15.3f} {r['speedup_vs_own_baseline']:16.3f}"
        )
    c = d["crossover_m_vs_vllm"]
    print(
        "crossover against vLLM's dispatch (faster at every measured M from it): "
        + ("none (slower at the largest measured M)" if c is None else f"M = {c}")
    )


def _small_rows_text(a, sep: str) -> str:
    """The rows below one M tile the op's sweep also runs, in words, after `sep` ('' where none)."""
    small = [int(x) for x in a.kind.small_rows]
    return f"{sep} the powers of two to {small[-1]}" if small else ""


def _print_breakdown(b: dict, kind) -> None:
    """`op --at M`: each arm part by part, with the rates and the bound that explain it."""
    us = lambda x: f"{x * 1e6:.2f} us"  # noqa: E731
    u, f = b["unfused"], b["fused"]
    g, c = u["gemm"], u["collective"]
    print(f"\nat M = {b['m']}, per call:")
    print(
        f"  unfused {us(u['t_s'])} (bound: {u['bound']}): GEMM {us(g['t_s'])} at "
        f"{g['achieved_flops_per_s'] / 1e12:.1f} TFLOP/s ({g['bound']}-bound: compute "
        f"{us(g['t_compute_s'])}, HBM "
        f"{us(g['t_hbm_s'])}); {c['impl']} {us(c['t_s'])} of {c['msg_bytes'] / 1e6:.3g} MB"
        + (
            ""
            if c["achieved_bus_bytes_per_s"] is None
            else f" at {c['achieved_bus_bytes_per_s'] / 1e9:.1f} GB/s bus"
        )
    )
    print("  " + kind.breakdown_text(f))


def register(sub) -> None:
    """Add `op` to the CLI root's subparsers."""
    from costmodel.fused_ops import DEFAULT_IMPL, dtype_names, impl_help, impl_names, op_names

    o = sub.add_parser(
        "op", help="one fused GEMM+collective against vLLM's unfused path over M, and its cutoff"
    )
    o.add_argument(
        "--gpu",
        default=DEFAULT_GPU,
        help=f"built-in GPU profile, a .toml path, or 'auto' (default {DEFAULT_GPU})",
    )
    o.add_argument(
        "--tp",
        type=bounded_int("--tp", 2, 64, "a collective needs 2 ranks; fused ops stay in one domain"),
        required=True,
        help="tensor-parallel size",
    )
    o.add_argument("--op", required=True, choices=op_names(), help="the fused operation")
    o.add_argument(
        "--impl",
        default=DEFAULT_IMPL,
        choices=impl_names(),
        help=f"{impl_help()} (default {DEFAULT_IMPL})",
    )
    o.add_argument(
        "--n",
        type=bounded_int("--n", 1, 2**20, "a GEMM width"),
        required=True,
        help="GEMM N per rank",
    )
    o.add_argument(
        "--k",
        type=bounded_int("--k", 1, 2**20, "a GEMM depth"),
        required=True,
        help="GEMM K per rank",
    )
    o.add_argument(
        "--dtype",
        default="bf16",
        choices=dtype_names(),
        help="weights (default bf16; which op takes which: costmodel.fused_ops)",
    )
    o.add_argument(
        "--calls-per-forward",
        type=bounded_int("--calls-per-forward", 1, 10**6, "calls of one slot"),
        default=1,
        metavar="C",
        help="how often the slot runs per forward (layers x slots; default 1)",
    )
    o.add_argument(
        "--m",
        type=bounded_int("--m", 1, MAX_TOKENS, "rows"),
        nargs="+",
        metavar="M",
        help="extra rows to show beside the multiples of 128",
    )
    o.add_argument(
        "--max-num-batched-tokens",
        type=bounded_int(
            "--max-num-batched-tokens", 128, MAX_TOKENS, "M runs over the multiples of 128 up to it"
        ),
        default=DEFAULT_BUDGET_TOKENS,
        help=f"vLLM's token budget (default {DEFAULT_BUDGET_TOKENS})",
    )
    o.add_argument(
        "--margin",
        type=fraction("--margin"),
        default=DEFAULT_MARGIN,
        help=f"risk premium on the fused side (default {DEFAULT_MARGIN:g})",
    )
    o.add_argument(
        "--kernel-sm-share",
        type=fraction("--kernel-sm-share", 0.0, 1.0, "(]"),
        default=DEFAULT_KERNEL_SM_SHARE,
        metavar="S",
        help="the single kernel's share of the SMs, in (0, 1]; the rest held back for concurrent "
        "work "
        f"(--impl kernel; default {DEFAULT_KERNEL_SM_SHARE:g}: all of them)",
    )
    o.add_argument("--workload", metavar="FILE", help="your traffic (as whatif's --workload)")
    o.add_argument(
        "--at",
        type=bounded_int("--at", 1, MAX_TOKENS, "rows"),
        metavar="M",
        help="also break each arm down at this M: its parts, achieved TFLOP/s and GB/s, the bound "
        "it hits",
    )
    o.add_argument(
        "--measured",
        metavar="FILE.csv",
        help="your kernel's measured rows (evaluate's op CSV) of this "
        "shape, each against the unfused arm vLLM dispatches at its M, and their crossover",
    )
    add_vllm_args(
        o, "its dispatch tables time the unfused all-reduce, and its rule gates the kernel"
    )
    o.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="QUANTITY=VALUE",
        help="override one profile quantity",
    )
    add_regime_args(o)
    o.add_argument("--json", action="store_true", help="print JSON instead of the table")
    o.set_defaults(func=cmd_op)
