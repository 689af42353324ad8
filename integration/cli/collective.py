"""`tpcost collective`: an nccl-tests-shaped table of one collective on one GPU x TP, as vLLM
dispatches it, and (--log) the profile's prediction beside a measured nccl-tests run."""

from __future__ import annotations

from costmodel.errors import TpcostError
from costmodel.io import JSON_SCHEMA_VERSION, dumps_json

from .common import (
    DEFAULT_GPU,
    add_vllm_args,
    bounded_int,
    check_plot_args,
    refuse_unused_limits,
    resolve_profile,
    vllm_arg,
)

# 1 KiB .. 16 GiB, x4 (nccl-tests -b 1K -e 16G -f 4)
DEFAULT_SIZES = [float(2**e) for e in range(10, 35, 2)]


def _rows(prof, op: str, tp: int, sizes, model_level_sp: bool, version) -> list[dict]:
    """Per size: vLLM's pick and its time, and NCCL's own (s), with algbw and busbw as nccl-tests
    reports them."""
    import numpy as np

    from costmodel import formulas as F
    from costmodel import ops

    hw = ops.Hw(prof, "bf16")
    S = np.asarray(sizes, dtype=float)
    kind = ops.COLLECTIVE_KINDS[op]
    t_vllm, impl = kind.dispatch(hw, S, tp, model_level_sp, version)
    t_nccl = kind.t_nccl_s(hw, tp, S)
    factor = float(F.bus_bw_factor(op, tp))
    return [
        {
            "size_bytes": int(s),
            "vllm_impl": str(i),
            "t_vllm_s": float(tv),
            "t_nccl_s": float(tn),
            "algbw_vllm_bytes_per_s": float(s / tv),
            "busbw_vllm_bytes_per_s": float(factor * s / tv),
            "busbw_nccl_bytes_per_s": float(factor * s / tn),
        }
        for s, i, tv, tn in zip(
            S, impl, np.broadcast_to(t_vllm, S.shape), np.broadcast_to(t_nccl, S.shape)
        )
    ]


def _what(args, prof) -> tuple[str, int, list, dict | None]:
    """(op, tp, sizes, measured size -> time or None): the log's (a log from hosts outside one
    NVLink domain of `prof` refused, as calibrate refuses it), or the flags'."""
    if not args.log:
        if args.op is None or args.tp is None:
            raise TpcostError(
                "collective needs --op and --tp (or --log FILE, an nccl-tests log, for both)"
            )
        return (
            args.op,
            args.tp,
            [float(s) for s in args.sizes] if args.sizes else DEFAULT_SIZES,
            None,
        )
    from calib.nccl_tests import parse_nccl_tests
    from costmodel.io import read_text

    log = parse_nccl_tests(read_text(args.log, "nccl-tests log"), args.log)
    from calib.nccl_tests import check_one_domain

    check_one_domain(prof, log)
    for flag, given, got in (("--op", args.op, log["op"]), ("--tp", args.tp, log["ranks"])):
        if given is not None and given != got:
            raise TpcostError(
                f"{flag} {given}: the log {args.log} is {log['op']} on {log['ranks']} ranks"
            )
    if args.sizes:
        raise TpcostError("--sizes: with --log the sizes are the log's")
    measured = dict(log["rows"])
    return log["op"], log["ranks"], sorted(measured), measured


def _verdict(rows: list[dict]) -> dict:
    """The median and worst |NCCL pred/meas - 1| over the logged sizes."""
    import numpy as np

    err = np.abs(np.array([r["nccl_pred_over_measured"] for r in rows]) - 1.0)
    return {
        "median_abs_rel_error": float(np.median(err)),
        "worst_abs_rel_error": float(err.max()),
        "worst_size_bytes": int(rows[int(np.argmax(err))]["size_bytes"]),
        "sizes": len(rows),
    }


def cmd_collective(args) -> int:
    from pathlib import Path

    from costmodel.analysis import provenance_line

    if args.plot and not args.log:
        raise TpcostError("--plot: draws the profile against a measured log; give --log FILE too")
    check_plot_args(args, protect=(args.log,) if args.log else ())
    prof, _ = resolve_profile(args)  # collective has no --set
    op, tp, sizes, measured = _what(args, prof)
    if args.model_level_sp and op == "all_reduce":
        raise TpcostError(
            "--model-level-sp: vLLM's model-level-SP backends are its reduce-scatter and "
            "all-gather; "
            "the all-reduce dispatches the same way with or without it"
        )
    if tp < 2:
        raise TpcostError(f"--tp {tp}: a collective needs at least 2 ranks")
    if args.vllm_set and op != "all_reduce":
        raise TpcostError(
            f"--vllm-set: vLLM's dispatch limits choose among all-reduce implementations; {op} has "
            "none"
        )
    version = vllm_arg(args, prof, tp)
    rows = _rows(prof, op, tp, sizes, bool(args.model_level_sp), version)
    refuse_unused_limits(
        version,
        lambda v: _rows(prof, op, tp, sizes, bool(args.model_level_sp), v),
        f"the {op} at tp={tp} over these sizes",
        rows,
    )
    if measured is not None:
        from costmodel import formulas as F

        factor = float(F.bus_bw_factor(op, tp))
        for r in rows:
            t = measured[float(r["size_bytes"])]
            r.update(
                t_measured_s=t,
                busbw_measured_bytes_per_s=factor * r["size_bytes"] / t,
                nccl_pred_over_measured=r["t_nccl_s"] / t,
            )
    verdict = None if measured is None else _verdict(rows)
    if args.plot:
        from costmodel.plot import plot_collective_log

        plot_collective_log(
            rows, f"{op} on {prof.name} x{tp} against {Path(args.log).name}", args.plot
        )
    if args.json:
        print(
            dumps_json(
                {
                    "schema_version": JSON_SCHEMA_VERSION,
                    "gpu": prof.name,
                    "op": op,
                    "tp": tp,
                    "vllm_version": version.label,
                    "vllm_version_source": version.source,
                    "model_level_sp": bool(args.model_level_sp),
                    "log": args.log,
                    "verdict": verdict,
                    "rows": rows,
                },
                indent=2,
            )
        )
        return 0
    print(
        f"tpcost collective: {op} on {prof.name} x{tp}"
        + (" (model-level SP)" if args.model_level_sp else "")
        + (f", against {args.log}" if args.log else "")
        + f"; {version.describe()}"
    )
    if verdict is not None:
        print(
            f"verdict: the profile's NCCL {op} is off the log by a median "
            f"{verdict['median_abs_rel_error']:.1%} "
            f"(|pred/meas - 1| over {verdict['sizes']} sizes), worst "
            f"{verdict['worst_abs_rel_error']:.1%} at "
            f"{verdict['worst_size_bytes']} B"
            + (
                "; calibrate from it: tpcost calibrate --from-nccl-tests "
                f"{args.log} --from {prof.name} --out FILE.toml"
                if verdict["worst_abs_rel_error"] > 0.10
                else ""
            )
        )
    head = (
        f"{'size [B]':>12s} {'vLLM runs':>20s} {'vLLM [us]':>10s} {'algbw [GB/s]':>12s} "
        f"{'busbw [GB/s]':>12s} "
        f"{'NCCL [us]':>10s} {'NCCL busbw':>10s}"
    )
    if measured is not None:
        head += f" {'measured [us]':>13s} {'meas. busbw':>11s} {'NCCL pred/meas':>14s}"
    print(head)
    for r in rows:
        line = (
            f"{r['size_bytes']:12d} {r['vllm_impl']:>20s} {r['t_vllm_s'] * 1e6:10.2f} "
            f"{r['algbw_vllm_bytes_per_s'] / 1e9:12.1f} {r['busbw_vllm_bytes_per_s'] / 1e9:12.1f} "
            f"{r['t_nccl_s'] * 1e6:10.2f} {r['busbw_nccl_bytes_per_s'] / 1e9:10.1f}"
        )
        if measured is not None:
            line += (
                f" {r['t_measured_s'] * 1e6:13.2f} {r['busbw_measured_bytes_per_s'] / 1e9:11.1f} "
                f"{r['nccl_pred_over_measured']:14.3f}"
            )
        print(line)
    print(
        "(busbw: nccl-tests' convention; 'vLLM runs' is what its dispatch picks at that size"
        + ("; the measured log is NCCL's own" if measured is not None else "")
        + ")"
    )
    print(provenance_line(prof))
    return 0


def register(sub) -> None:
    """Add `collective` to the CLI root's subparsers."""
    from costmodel import ops

    c = sub.add_parser(
        "collective",
        help="one collective on one GPU x TP as vLLM dispatches it (nccl-tests-shaped), "
        "or the profile against an nccl-tests log",
    )
    c.add_argument(
        "--gpu",
        default=DEFAULT_GPU,
        help=f"built-in GPU profile, a .toml path, or 'auto' (default {DEFAULT_GPU})",
    )
    c.add_argument(
        "--op", choices=tuple(ops.COLLECTIVE_KINDS), help="the collective (default: the log's)"
    )
    c.add_argument(
        "--tp", type=bounded_int("--tp", 1, 4096, "ranks"), help="ranks (default: the log's)"
    )
    c.add_argument(
        "--sizes",
        type=bounded_int("--sizes", 1, 2**40, "message bytes up to 1 TiB"),
        nargs="+",
        metavar="BYTES",
        help="message sizes in bytes (default 1 KiB .. 16 GiB, x4)",
    )
    c.add_argument(
        "--plot",
        metavar="FILE.png",
        help="with --log: draw measured and predicted busBW over size, vLLM's "
        "dispatch edges marked",
    )
    c.add_argument("--force", action="store_true", help="replace an existing --plot file")
    c.add_argument(
        "--log",
        metavar="FILE",
        help="an nccl-tests log (all_reduce_perf, reduce_scatter_perf, "
        "all_gather_perf): predicted beside measured at its sizes",
    )
    c.add_argument(
        "--model-level-sp",
        action="store_true",
        help="reduce-scatter / all-gather as model-level SP runs them (vLLM's custom backends "
        "before NCCL)",
    )
    add_vllm_args(c, "whose all-reduce dispatch tables")
    c.add_argument("--json", action="store_true", help="print JSON instead of the table")
    c.set_defaults(func=cmd_collective)
