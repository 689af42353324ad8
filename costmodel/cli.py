"""`tpcost` command line: whatif, profiles, models, evaluate, vllm-config, calibrate, validate."""

from __future__ import annotations

import argparse
import math
from typing import Any

from .errors import TpcostError
from .io import JSON_SCHEMA_VERSION, dumps_json


DEFAULT_GPU, DEFAULT_MODEL, DEFAULT_TP, DEFAULT_DTYPE = "h100-sxm", "llama-3.1-70b", 4, "bf16"
SENSITIVITY_SHOWN = 5


MAX_TOKENS = 2**20  # vLLM's largest useful token budget is ~1e5; the arrays of 2^20 points take ~100 MB
MAX_SEQ_LEN = 2**24  # 16 M tokens: beyond any context window served today
MAX_TP = 4096


def bounded_int(name, lo, hi, why):
    """argparse type: an integer in [lo, hi], with the reason for the bound in the error."""
    def parse(s):
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: {s!r} is not an integer") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{name} must be in [{lo}, {hi}] ({why}), got {v}")
        return v
    return parse


def fraction(name, lo=0.0, hi=1.0):
    """argparse type: a finite float in [lo, hi)."""
    def parse(s):
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: {s!r} is not a number") from None
        if not (math.isfinite(v) and lo <= v < hi):
            raise argparse.ArgumentTypeError(f"{name} must be a finite number in [{lo:g}, {hi:g}), got {s}")
        return v
    return parse


_tokens = bounded_int("token count", 1, MAX_TOKENS, f"at most 2^20 = {MAX_TOKENS} points fit a sweep in memory")


def add_shape_args(p, gpu_help="built-in GPU profile name, a profile .toml path, or 'auto' (the local GPU; "
                                "$TPCOST_PROFILE overrides)", default_gpu=DEFAULT_GPU):
    p.add_argument("--gpu", default=default_gpu, help=f"{gpu_help} (default {default_gpu})")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"built-in model name or a config.json path (default {DEFAULT_MODEL})")
    p.add_argument("--tp", type=bounded_int("--tp", 1, MAX_TP, "tensor-parallel sizes beyond that are not built"),
                   default=DEFAULT_TP, help=f"tensor-parallel size (default {DEFAULT_TP})")
    p.add_argument("--dtype", default=DEFAULT_DTYPE, help="bf16 | fp8 | fp8-dynamic | fp32 (CPU runs) (default bf16)")
    p.add_argument("--seq-len", type=bounded_int("--seq-len", 1, MAX_SEQ_LEN, "16 M tokens, beyond any context window"),
                   default=1024, help="prefill sequence length (default 1024)")
    p.add_argument("--max-num-batched-tokens", type=bounded_int("--max-num-batched-tokens", 1, MAX_TOKENS,
                   "the cutoff search evaluates every multiple of tp up to it"), default=8192,
                   help="vLLM's token budget (default 8192)")
    p.add_argument("--margin", type=fraction("--margin"), default=0.02,
                   help="risk premium on the overlapped schedule's time in the cutoff decision, in [0, 1) (default 0.02)")
    p.add_argument("--fi-allreduce-fusion-max-size-mb", type=fraction("--fi-allreduce-fusion-max-size-mb", 0.0, 1e6),
                   metavar="MB", help="vLLM's PassConfig value to predict with (0: fuse_allreduce_rms off; default: "
                   "vllm-config decides it, whatif uses vLLM's own table)")
    p.add_argument("--workload", metavar="FILE", help="your traffic: a scrape of vLLM's /metrics "
                   "(vllm:iteration_tokens_total) or a CSV num_tokens,count (default: uniform over the multiples of tp)")
    p.add_argument("--set", action="append", default=[], metavar="QUANTITY=VALUE",
                   help="override one profile quantity, e.g. interconnect.link_bw_bytes_per_s=900e9")
    add_regime_args(p)


def add_regime_args(p) -> None:
    """--cudagraph-max-tokens / --enforce-eager: which steps replay CUDA graphs (no host cost) and which run eagerly."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--cudagraph-max-tokens", type=bounded_int("--cudagraph-max-tokens", 0, MAX_TOKENS,
                   "vLLM's capture sizes stay within the token budget"), metavar="N",
                   help="vLLM's largest CUDA-graph capture size (max_cudagraph_capture_size): steps of more tokens run "
                        "eagerly and pay the host's issue time (default: vLLM's own, 512; 1024 on datacenter Blackwell)")
    g.add_argument("--enforce-eager", action="store_true",
                   help="vLLM's --enforce-eager: every step runs eagerly (no CUDA graphs)")


def vllm_version_arg(args) -> tuple[int, int] | None:
    """whatif --vllm-version X.Y as (major, minor); None: vLLM <= 0.31 (the version with the SP schedules)."""
    v = getattr(args, "vllm_version", None)
    if not v:
        return None
    from .vllm_tables import parse_version

    return parse_version(v)


def cudagraph_arg(args) -> int | None:
    """The CUDA-graph capture limit the prediction uses: 0 under --enforce-eager, None for vLLM's default."""
    if getattr(args, "enforce_eager", False):
        return 0
    return getattr(args, "cudagraph_max_tokens", None)


def resolve_inputs(args):
    from .profile import load_profile, parse_set, with_overrides
    from .shapes import check_dtype, load_model

    if args.gpu == "auto":
        from .profile import detect_profile_name

        args.gpu = detect_profile_name()
    prof = load_profile(args.gpu)
    overrides = parse_set(args.set)
    shape = load_model(args.model)
    check_dtype(args.dtype)
    shape.check_tp(args.tp)
    if overrides:
        prof = with_overrides(prof, overrides)
        check_overrides_take_effect(prof, overrides, shape, args)
    return prof, shape


def fi_max_bytes_arg(args):
    """--fi-allreduce-fusion-max-size-mb as vLLM converts it (int(MB·MiB) bytes); None when not given."""
    mb = getattr(args, "fi_allreduce_fusion_max_size_mb", None)
    return None if mb is None else float(int(mb * 1024 * 1024))


def load_workload_arg(args):
    """The --workload file, parsed (None: the uniform default)."""
    if not getattr(args, "workload", None):
        return None
    from .workload import read_workload

    return read_workload(args.workload)


def check_overrides_take_effect(prof, overrides, shape, args) -> None:
    """Refuse a --set key the model does not read for this (model, tp, dtype): it would be marked
    MODIFIED while changing nothing. The reads are recorded over the sweep the command evaluates."""
    import numpy as np

    from .model import predict
    from .profile import DERIVED_FROM_LINK, recording

    grid = np.arange(args.tp, args.max_num_batched_tokens + args.tp, args.tp, dtype=float)
    traced, reads = recording(prof)
    predict(traced, shape, args.tp, args.dtype, grid, seq_len=args.seq_len, cudagraph_max_tokens=cudagraph_arg(args))
    rides_on_link = any(prof.provenance[k].source == DERIVED_FROM_LINK for k in reads if k in prof.provenance)
    for key in overrides:
        if key in ("interconnect.link_bw_bytes_per_s", "interconnect.latency_s") and rides_on_link:
            continue  # its dependants (collectives, pulls) were read
        if key not in reads:
            why = "the model does not read it"
            if key.startswith(("collectives.", "vllm_dispatch.")):
                why = f"it is not the entry used at tp={args.tp}"
            raise TpcostError(f"--set {key}: no effect for {shape.name} at tp={args.tp}, {args.dtype} ({why})")


def _fmt_ms(x):
    return f"{x * 1e3:10.3f}"


def cmd_whatif(args) -> int:  # noqa: C901 (the text report, section by section)
    from .analysis import analyse, analysis_json

    if args.plot:
        from .io import check_output_path

        check_output_path(args.plot, args.force, "--plot")
    prof, shape = resolve_inputs(args)
    if args.ops is not None:
        return _print_ops(prof, shape, args)
    a = analyse(prof, shape, args.tp, args.dtype, seq_len=args.seq_len,
                max_num_batched_tokens=args.max_num_batched_tokens, margin=args.margin, band=not args.no_band,
                tokens=args.tokens, workload=load_workload_arg(args), fi_max_bytes=fi_max_bytes_arg(args),
                cudagraph_max_tokens=cudagraph_arg(args), vllm_version=vllm_version_arg(args))
    out = analysis_json(a)
    if args.plot:
        from .plot import plot_whatif

        plot_whatif(a, args.plot)
    if args.json:
        print(dumps_json({"schema_version": JSON_SCHEMA_VERSION, **out}, indent=2))
        return 0
    from .profile import DERIVED_FROM_LINK

    given = [k for k in prof.modified if prof.provenance[k].source != DERIVED_FROM_LINK]
    n_derived = len(prof.modified) - len(given)
    mod = (f"  [MODIFIED by --set: {', '.join(given)}" + (f" (+{n_derived} quantities that ride on the link)"
           if n_derived else "") + "]") if prof.modified else ""
    print(f"tpcost whatif: {shape.name} on {prof.name} x{args.tp}, {args.dtype}, seq_len {args.seq_len}{mod}")
    print(f"{'N tokens':>9} {'t_tp [ms]':>10} {'t_sp [ms]':>10} {'t_sp+async [ms]':>16} {'speedup sp':>11} {'speedup sp+async':>17}")
    def cell(x, fmt):
        return "n/a" if x is None else fmt(x)

    for r in out["rows"]:
        mark = "  <- cutoff" if r["num_tokens"] == a.cutoff_tokens else ""
        print(f"{r['num_tokens']:9d} {_fmt_ms(r['t_tp_s'])} {cell(r['t_sp_s'], _fmt_ms):>10} "
              f"{cell(r['t_sp_asynctp_s'], _fmt_ms):>16} {cell(r['speedup_sp'], '{:.3f}'.format):>11} "
              f"{cell(r['speedup_sp_asynctp'], '{:.3f}'.format):>17}{mark}")
    print("(times per forward pass; speedup = t_tp / t_schedule)")
    for sched, why in a.table.unavailable.items():
        print(f"\n{sched}: {why}")
    band = a.cutoff_band_tokens
    band_s = "" if band is None else f"  band (5-95%): [{band[0]}, {band[1] if band[1] is not None else 'never'}]"
    if band is not None and a.band_resolution_tokens != args.tp:
        band_s += f" (band and sensitivity decided every {a.band_resolution_tokens} tokens)"
    cut = a.cutoff_tokens if a.cutoff_tokens is not None else "never (null)"
    print(f"\ncutoff (SP+AsyncTP; the threshold minimising the expected forward time over N <= "
          f"{args.max_num_batched_tokens}, {a.workload}, risk premium {args.margin:.0%}): {cut}{band_s}")
    if a.cutoff_by_spread:
        never = lambda x: "never" if x is None else str(x)  # noqa: E731
        print("  the same decision with each histogram bucket spread otherwise: " +
              ", ".join(f"{k} {never(v)}" for k, v in a.cutoff_by_spread.items()))
    print(f"cutoff (SP alone): {a.sp_cutoff_tokens if a.sp_cutoff_tokens is not None else 'never (null)'}")
    vd = a.vllm_default_tokens
    why_off = ("SP off (vLLM turns SP off at tp 1)" if args.tp < 2 else
               "SP off (its table covers sm90/sm100 with hidden >= 8192 and XPU with hidden >= 4096)")
    print("vLLM 0.31's own default here: " + (f"sp_min_token_num {vd}" if vd is not None else why_off))
    if a.sensitivity:
        never = lambda x: "never" if x is None else str(x)  # noqa: E731
        print(f"\nwhat moves the cutoff (each input alone scaled by e^-s and e^+s, s = its tier's sigma; top {SENSITIVITY_SHOWN}):")
        print(f"  {'quantity':56s} {'tier':22s} {'x e^-s':>7s} {'x e^+s':>7s}")
        for r in a.sensitivity[:SENSITIVITY_SHOWN]:
            print(f"  {r['quantity']:56s} {r['tier']:22s} {never(r['cutoff_minus_sigma_tokens']):>7s} "
                  f"{never(r['cutoff_plus_sigma_tokens']):>7s}")
    dv = a.decision_value
    if dv:
        ms = lambda x: f"{x * 1e3:.3f} ms"  # noqa: E731
        line = (f"value of the decision (expected forward {ms(dv['expected_forward_s'])}): saves "
                f"{ms(dv['saving_vs_never_s'])} ({dv['saving_vs_never_rel']:.1%}) against never")
        if "saving_vs_vllm_default_s" in dv:
            v = dv["saving_vs_vllm_default_s"]
            line += (f", {ms(v)} against vLLM's default" if v is not None else
                     ", and vLLM's default would enable an op that cannot run here")
        oc = dv["oracle_cutoff_tokens"]
        line += f"; regret against the best threshold in hindsight ({'never' if oc is None else oc}): {ms(dv['regret_vs_oracle_s'])}"
        print(line)
    if a.breakdown_at_cutoff:
        print("\nbreakdown at the cutoff, per forward [ms] (every term: positive = SP+AsyncTP saves; they sum to "
              "t_tp - t_sp+async):")
        for k, v in a.breakdown_at_cutoff.items():
            print(f"  {k[:-2]:24s} {v * 1e3:+9.3f}")
    for n in a.table.notes:
        print(f"note: {n}")
    if a.memory and a.memory.get("note"):
        print(f"note: {a.memory['note']}")
    pv = out["provenance"]
    counts = ", ".join(f"{k} {v}" for k, v in pv["tier_counts"].items() if v)
    print(f"\nprovenance: profile {pv['profile']} ({pv['origin']}), weakest tier used: {pv['tier']}; values by tier: {counts}")
    return 0


def _print_ops(prof, shape, args) -> int:
    """whatif --ops N: every op of each schedule at N, with the formula that times it."""
    from .analysis import ops_view
    from .model import predict

    pred = predict(prof, shape, args.tp, args.dtype, [float(args.ops)], seq_len=args.seq_len,
                   fi_max_bytes=fi_max_bytes_arg(args), cudagraph_max_tokens=cudagraph_arg(args),
                   vllm_version=vllm_version_arg(args))
    view = ops_view(pred)
    if args.json:
        print(dumps_json({"schema_version": JSON_SCHEMA_VERSION, "gpu": prof.name, "model": shape.name, "tp": args.tp,
                          "dtype": args.dtype, "num_tokens": args.ops, "notes": list(pred.notes),
                          "t_forward_s": {s: float(pred.t_forward_s(s)[0]) for s in pred.schedules}, "ops": view},
                         indent=2))
        return 0
    print(f"tpcost whatif --ops {args.ops}: {shape.name} on {prof.name} x{args.tp}, {args.dtype}")
    for name, rows in view.items():
        t = float(pred.t_forward_s(name)[0])
        print(f"\n[{name}]  t_forward {t * 1e3:.3f} ms")
        print(f"  {'op':32s} {'calls':>6s} {'t/call [us]':>12s} {'TFLOP/s':>8s} {'HBM GB/s':>9s} {'bus GB/s':>9s} "
              f"{'bound':>8s}  formula")
        for r in rows:
            f = lambda x, sc: "" if x is None else f"{x / sc:.1f}"  # noqa: E731
            t_us = "n/a" if not math.isfinite(r["t_s"]) else f"{r['t_s'] * 1e6:.2f}"
            print(f"  {r['op'][:32]:32s} {r['calls_per_forward']:6d} {t_us:>12s} {f(r['achieved_flops_per_s'], 1e12):>8s} "
                  f"{f(r['achieved_hbm_bytes_per_s'], 1e9):>9s} {f(r['achieved_bus_bytes_per_s'], 1e9):>9s} "
                  f"{r['bound'] or '':>8s}  {r['formula']} ({r['docs']})")
    for n in pred.notes:
        print(f"note: {n}")
    return 0


def _new_profile(args) -> int:
    """profiles --new NAME --from PROFILE [--set ...] --out FILE: a profile for new hardware."""
    from .io import atomic_write_text, check_output_path
    from .profile import dump_profile, load_profile, parse_set, profile_from_dict, profile_to_tree, with_overrides

    if not args.source:
        raise TpcostError("profiles --new needs --from PROFILE (a built-in name or a .toml path)")
    if not args.out:
        raise TpcostError("profiles --new needs --out FILE.toml")
    if not args.new.strip() or any(c in args.new for c in "\n\r\"'"):
        raise TpcostError(f"profiles --new: {args.new!r} is not a usable profile name")
    out = check_output_path(args.out, args.force, "--out", protect=(args.source,))
    if out.suffix != ".toml":
        raise TpcostError(f"--out {out}: a profile is a .toml file")
    base = load_profile(args.source)
    overrides = parse_set(args.set)
    prof = with_overrides(base, overrides, source=f"--set when `tpcost profiles --new {args.new}` made this profile")
    tree = profile_to_tree(prof, name=args.new)
    tree["identity"]["display_name"] = f"{args.new} (from {base.name})"
    profile_from_dict(tree, str(out))  # validates before writing
    text = (f"# Written by `tpcost profiles --new {args.new} --from {args.source}`"
            + (" " + " ".join(f"--set {x}" for x in args.set) if args.set else "") + ".\n"
            "# Values given with --set and the ones derived from them are tier `assumed`; all others keep their source.\n"
            + dump_profile(tree))
    atomic_write_text(out, text)
    derived = [k for k in prof.modified if k not in overrides]
    print(f"wrote {out}: {args.new} from {base.name}; set {len(overrides)} value(s)"
          + (f", {len(derived)} derived from them (they ride on the link)" if derived else "")
          + f"; use it with `tpcost whatif --gpu {out}`")
    return 0


def cmd_profiles(args) -> int:
    from .profile import builtin_profile_names, load_profile

    if args.new is not None:
        return _new_profile(args)

    rows: list[dict[str, Any]] = []
    for name in builtin_profile_names():
        p = load_profile(name)
        rows.append({"name": name, "display_name": p.identity.display_name,
                     "compute_capability": p.identity.compute_capability,
                     "interconnect": p.kind, "tier": p.tier, "tier_counts": p.tier_counts()})
        if args.keys == name:
            for k, value in sorted(p.values().items()):
                prm = p.provenance[k]
                print(f"{k} = {value:g}  [{prm.tier}] {prm.source}")
            return 0
    if args.keys:
        raise TpcostError(f"unknown GPU profile {args.keys!r}; built-in: {', '.join(r['name'] for r in rows)}")
    if args.json:
        print(dumps_json({"schema_version": JSON_SCHEMA_VERSION, "profiles": rows}, indent=2))
        return 0
    print(f"{'name':14s} {'device':40s} {'cc':5s} {'interconnect':12s} {'weakest tier':22s} values by tier")
    for r in rows:
        counts = ", ".join(f"{k} {v}" for k, v in r["tier_counts"].items() if v)
        print(f"{r['name']:14s} {r['display_name']:40s} {r['compute_capability']:5s} {r['interconnect']:12s} {r['tier']:22s} {counts}")
    return 0


def cmd_models(args) -> int:
    from .shapes import builtin_model_config, builtin_model_names, load_model

    rows = []
    for name in builtin_model_names():
        s = load_model(name)
        rows.append({"name": name, "source": builtin_model_config(name).get("_name_or_path"), "hidden": s.hidden,
                     "intermediate": s.intermediate, "heads": s.num_heads, "kv_heads": s.num_kv_heads,
                     "head_dim": s.head_dim, "layers": s.num_layers, "vocab": s.vocab, "moe": s.is_moe})
    if args.json:
        print(dumps_json({"schema_version": JSON_SCHEMA_VERSION, "models": rows}, indent=2))
        return 0
    print(f"{'name':16s} {'hidden':>6s} {'inter':>6s} {'heads':>5s} {'kv':>3s} {'hd':>4s} {'layers':>6s} {'vocab':>7s}  config from")
    for r in rows:
        print(f"{r['name']:16s} {r['hidden']:6d} {r['intermediate']:6d} {r['heads']:5d} {r['kv_heads']:3d} "
              f"{r['head_dim']:4d} {r['layers']:6d} {r['vocab']:7d}  https://huggingface.co/{r['source']}")
    return 0


def cmd_op(args) -> int:
    """tpcost op: one fused GEMM+collective against vLLM's unfused path over M, and its cutoff."""
    from .op_analysis import analyse_op
    from .profile import load_profile, parse_set, with_overrides

    if args.gpu == "auto":
        from .profile import detect_profile_name

        args.gpu = detect_profile_name()
    prof = load_profile(args.gpu)
    if args.set:
        prof = with_overrides(prof, parse_set(args.set))
    a = analyse_op(prof, args.op, args.impl, args.tp, args.n, args.k, args.dtype,
                   calls_per_forward=args.calls_per_forward, max_num_batched_tokens=args.max_num_batched_tokens,
                   margin=args.margin, workload=load_workload_arg(args), extra_m=args.m or (),
                   vllm_version=vllm_version_arg(args), cudagraph_max_tokens=cudagraph_arg(args))
    out = a.to_json()
    if args.json:
        print(dumps_json({"schema_version": JSON_SCHEMA_VERSION, **out}, indent=2))
        return 0
    print(f"tpcost op: {args.op} ({args.impl}) on {prof.name} x{args.tp}, n={args.n} k={args.k} per rank, {args.dtype}, "
          f"{args.calls_per_forward} call(s) per forward; unfused: GEMM + {a.unfused_impl}")
    print(f"{'M':>7} {'t_fused [us]':>13} {'t_unfused [us]':>15} {'speedup':>8} {'vLLM runs it':>13}")
    shown = set(int(x) for x in (args.m or ())) | {128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536}
    for r in out["rows"]:
        if r["m"] in shown or r["m"] == a.cutoff_tokens:
            mark = "  <- cutoff" if r["m"] == a.cutoff_tokens else ""
            print(f"{r['m']:7d} {r['t_fused_s'] * 1e6:13.2f} {r['t_unfused_s'] * 1e6:15.2f} {r['speedup']:8.3f} "
                  f"{'yes' if r['vllm_runs_kernel'] else 'no':>13}{mark}")
    never = "never (null)"
    print(f"\ncutoff (fused when M >= c; the c minimising the expected time over M <= {args.max_num_batched_tokens}, "
          f"risk premium {args.margin:.0%}): {a.cutoff_tokens if a.cutoff_tokens is not None else never}")
    print(f"vLLM's own rule: {a.vllm_rule}")
    wins = a.wins_m_ranges()
    print("the fused op is faster at M in " + (", ".join(f"[{lo}, {hi}]" for lo, hi in wins) if wins else "no row"))
    dv = a.decision_value
    if dv.get("saving_vs_vllm_default_s") is not None:
        print(f"expected saving of tpcost's cutoff against vLLM's rule: {dv['saving_vs_vllm_default_s'] * 1e6:.2f} us "
              "per forward on the workload")
    for n in a.notes:
        print(f"note: {n}")
    return 0


def register(sub) -> None:
    """Add whatif, op, profiles and models to the CLI root's subparsers."""
    w = sub.add_parser("whatif", help="predict speedups and the cutoff for one (GPU, model, TP, dtype)")
    add_shape_args(w)
    w.add_argument("--json", action="store_true", help="print JSON instead of the table")
    w.add_argument("--plot", metavar="FILE.png", help="also write the speedup curve to this PNG")
    w.add_argument("--force", action="store_true", help="replace an existing --plot file")
    w.add_argument("--no-band", action="store_true", help="skip the Monte Carlo cutoff band and the sensitivity table")
    w.add_argument("--ops", type=_tokens, metavar="N",
                   help="instead of the sweep: every op of each schedule at N tokens with its time, achieved rate, bound "
                        "and formula")
    w.add_argument("--vllm-version", metavar="X.Y", help="whose all-reduce dispatch tables the plain-TP arm uses "
                   "(default 0.31, the last version with the SP passes; costmodel/vllm_tables.py)")
    w.add_argument("--tokens", type=_tokens, nargs="+", metavar="N",
                   help="token counts for the table (default: powers of two to 65536, plus the cutoff)")
    w.set_defaults(func=cmd_whatif)
    o = sub.add_parser("op", help="one fused GEMM+collective against vLLM's unfused path over M, and its cutoff")
    o.add_argument("--gpu", default=DEFAULT_GPU, help=f"built-in GPU profile, a .toml path, or 'auto' (default {DEFAULT_GPU})")
    o.add_argument("--tp", type=bounded_int("--tp", 2, 64, "a collective needs 2 ranks; fused ops stay in one domain"),
                   required=True, help="tensor-parallel size")
    o.add_argument("--op", required=True, choices=("ag_gemm", "gemm_rs", "gemm_ar"), help="the fused operation")
    o.add_argument("--impl", default="torch", choices=("torch", "kernel"),
                   help="torch: torch's pipelined symm-mem op (vLLM <= 0.31); kernel: the single-kernel fused "
                        "GEMM+RS/AR (vLLM 0.33's gemm_rs_ar, SM100 family) (default torch)")
    o.add_argument("--n", type=bounded_int("--n", 1, 2**20, "a GEMM width"), required=True, help="GEMM N per rank")
    o.add_argument("--k", type=bounded_int("--k", 1, 2**20, "a GEMM depth"), required=True, help="GEMM K per rank")
    o.add_argument("--dtype", default="bf16", choices=("bf16", "fp8", "mxfp8"), help="weights (default bf16)")
    o.add_argument("--calls-per-forward", type=bounded_int("--calls-per-forward", 1, 10**6, "calls of one slot"),
                   default=1, metavar="C", help="how often the slot runs per forward (layers x slots; default 1)")
    o.add_argument("--m", type=bounded_int("--m", 1, MAX_TOKENS, "rows"), nargs="+", metavar="M",
                   help="extra rows to show beside the multiples of 128")
    o.add_argument("--max-num-batched-tokens", type=bounded_int("--max-num-batched-tokens", 128, MAX_TOKENS,
                   "M runs over the multiples of 128 up to it"), default=8192, help="vLLM's token budget (default 8192)")
    o.add_argument("--margin", type=fraction("--margin"), default=0.02, help="risk premium on the fused side (default 0.02)")
    o.add_argument("--workload", metavar="FILE", help="your traffic (as whatif's --workload)")
    o.add_argument("--vllm-version", metavar="X.Y", help="whose dispatch tables the unfused all-reduce uses")
    o.add_argument("--set", action="append", default=[], metavar="QUANTITY=VALUE", help="override one profile quantity")
    add_regime_args(o)
    o.add_argument("--json", action="store_true", help="print JSON instead of the table")
    o.set_defaults(func=cmd_op)
    p = sub.add_parser("profiles", help="list built-in GPU profiles with provenance")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--keys", metavar="NAME", help="list every quantity of one profile with its source")
    p.add_argument("--new", metavar="NAME", help="write a new profile NAME from --from plus --set overrides to --out")
    p.add_argument("--from", dest="source", metavar="PROFILE", help="the profile --new starts from (built-in or .toml)")
    p.add_argument("--set", action="append", default=[], metavar="QUANTITY=VALUE",
                   help="with --new: override one quantity (the link's dependants are rescaled as whatif's --set does)")
    p.add_argument("--out", metavar="FILE.toml", help="with --new: where to write the profile")
    p.add_argument("--force", action="store_true", help="with --new: replace an existing --out")
    p.set_defaults(func=cmd_profiles)
    m = sub.add_parser("models", help="list built-in model shapes")
    m.add_argument("--json", action="store_true", help="print JSON instead of the table")
    m.set_defaults(func=cmd_models)
