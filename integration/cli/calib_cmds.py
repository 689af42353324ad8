"""`tpcost calibrate` and `tpcost validate` (calib, and torch, are imported only when they run)."""

from __future__ import annotations

from costmodel.defaults import DEFAULT_MARGIN, DEFAULT_SEQ_LEN

from .common import bounded_int


# a benchmark run's, declared once
DEFAULT_DEVICE, DEFAULT_NPROC, DEFAULT_BUDGET_S = (
    "cuda",
    2,
    480.0,
)


def _common(p, default=True):
    """--device / --nproc; calibrate leaves them None so that a log mode can refuse them (resolved
    in _calibrate)."""
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default=DEFAULT_DEVICE if default else None,
        help="cuda: under torchrun, one rank per GPU; cpu: gloo ranks on this host (default "
        f"{DEFAULT_DEVICE})",
    )
    p.add_argument(
        "--nproc",
        type=int,
        default=DEFAULT_NPROC if default else None,
        help=f"CPU ranks to start when not under torchrun (default {DEFAULT_NPROC})",
    )


def register(sub):
    c = sub.add_parser(
        "calibrate", help="microbenchmark this machine and write a profile (torchrun for GPUs)"
    )
    c.add_argument(
        "--out",
        default="tpcost-calibrated.toml",
        help="profile to write (default tpcost-calibrated.toml)",
    )
    c.add_argument(
        "--budget-s",
        type=float,
        help=f"stop starting new phases after this (default {DEFAULT_BUDGET_S:g})",
    )
    c.add_argument(
        "--models",
        nargs="+",
        help="models whose per-rank shapes size the benchmarks (default: built-in; CPU: cpu-tiny)",
    )
    c.add_argument("--name", help="profile name (default calibrated-<host>-<device>-w<world>)")
    c.add_argument("--force", action="store_true", help="replace an existing --out")
    c.add_argument(
        "--from-nccl-tests",
        nargs="+",
        metavar="FILE",
        default=None,
        help="instead of running benchmarks: fit nccl-tests logs (all_reduce_perf, "
        "all_gather_perf, "
        "reduce_scatter_perf output) into --from's collectives (no torch needed)",
    )
    c.add_argument(
        "--from-deepep",
        nargs="+",
        metavar="FILE",
        default=None,
        help="instead of running benchmarks: read DeepEP test logs (test_low_latency.py, "
        "test_intranode.py, "
        "test_internode.py output) into measured all-to-all calls of --from's network (no torch)",
    )
    c.add_argument(
        "--from",
        dest="source",
        metavar="PROFILE|NETWORK",
        help="with --from-nccl-tests: the profile to start from; with --from-deepep: the network",
    )
    c.add_argument("--gpu", help="with --from-deepep: the GPU profile the logs ran on")
    c.add_argument(
        "--network",
        metavar="NAME|FILE",
        help="a benchmark run: the network its all-to-all calls calibrate (default: the GPU "
        "profile's)",
    )
    for flag, what in (
        ("--num-tokens", "tokens per rank"),
        ("--hidden", "hidden size"),
        ("--num-topk", "top-k"),
        ("--num-experts", "routed experts"),
        ("--ep", "EP size: the test's GPUs in all"),
        ("--gpus-per-node", "GPUs per node (default min(EP, 8))"),
    ):
        c.add_argument(
            flag,
            type=bounded_int(flag, 1, 2**20, "that"),
            metavar="N",
            help=f"with --from-deepep: the test's {what}, where the log has no [config] line",
        )
    c.add_argument(
        "--allow-other-gpu",
        action="store_true",
        help="with --from-nccl-tests: take a log whose GPU is not --from's as intended (the "
        "profile then "
        "records 'measured on' that GPU); without it such a log is refused",
    )
    _common(c, default=False)
    c.set_defaults(func=_calibrate)
    v = sub.add_parser(
        "validate", help="run one layer in the three schedules and compare with the model"
    )
    v.add_argument("--gpu", required=True, help="profile: built-in name or .toml path")
    v.add_argument(
        "--model",
        required=True,
        help="built-in name, config.json path, or cached Hugging Face id org/name",
    )
    v.add_argument(
        "--tokens", nargs="+", type=int, help="token counts N (default: a sweep per device)"
    )
    v.add_argument(
        "--seq-len",
        type=int,
        default=DEFAULT_SEQ_LEN,
        help=f"prefill sequence length (default {DEFAULT_SEQ_LEN})",
    )
    v.add_argument(
        "--margin",
        type=float,
        default=DEFAULT_MARGIN,
        help=f"risk premium of the printed cutoffs (default {DEFAULT_MARGIN:g})",
    )
    v.add_argument(
        "--out",
        default="validate.csv",
        help="CSV in evaluate's model-level schema (default validate.csv)",
    )
    v.add_argument(
        "--force",
        action="store_true",
        help="replace an existing --out (never the profile it reads)",
    )
    _common(v)
    v.set_defaults(func=_validate)


def _need_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        from costmodel.errors import TpcostError

        raise TpcostError("calibrate/validate need torch: pip install 'tpcost[torch]'") from None


def _calibrate(args):
    if args.allow_other_gpu and not args.from_nccl_tests:
        from costmodel.errors import TpcostError

        raise TpcostError(
            "--allow-other-gpu: only --from-nccl-tests reads another GPU's log; a benchmark run "
            "measures "
            "the GPU it runs on"
        )
    from costmodel.errors import TpcostError

    deepep_only = [
        f"--{k.replace('_', '-')}"
        for k in ("gpu", "num_tokens", "hidden", "num_topk", "num_experts", "ep", "gpus_per_node")
        if getattr(args, k) is not None
    ]
    if deepep_only and not args.from_deepep:
        raise TpcostError(f"{', '.join(deepep_only)}: read only with --from-deepep")
    if args.from_deepep and args.from_nccl_tests:
        raise TpcostError(
            "--from-deepep and --from-nccl-tests write different files (a network, a profile): one "
            "of them per call"
        )
    if args.name is not None and not args.name.strip():
        raise TpcostError("--name: give a non-empty name (or leave it out for the default)")
    if args.from_deepep or args.from_nccl_tests:
        bench = [
            flag
            for flag, v in (
                ("--budget-s", args.budget_s),
                ("--models", args.models),
                ("--nproc", args.nproc),
                ("--device", args.device),
                ("--network", args.network),
            )
            if v is not None
        ]
        if bench:
            raise TpcostError(
                f"{', '.join(bench)}: a benchmark run's flags; reading logs runs nothing"
            )
    if args.from_deepep:
        from calib.deepep_logs import run as from_deepep

        return from_deepep(args)
    if args.from_nccl_tests:
        from calib.nccl_tests import run as from_logs

        return from_logs(args)
    if args.source is not None:
        raise TpcostError(
            "--from: read only with --from-nccl-tests or --from-deepep (a benchmark run starts "
            "from the "
            "built-in profile of the GPU it finds)"
        )
    args.device = args.device or DEFAULT_DEVICE
    args.nproc = DEFAULT_NPROC if args.nproc is None else args.nproc
    args.budget_s = DEFAULT_BUDGET_S if args.budget_s is None else args.budget_s
    _need_torch()
    from calib.calibrate import run

    return run(args)


def _validate(args):
    _need_torch()
    from calib.validate import run

    return run(args)
