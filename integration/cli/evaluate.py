"""`tpcost evaluate`: score the model against measured overlap CSVs (op- or model-level)."""

from __future__ import annotations

import dataclasses

from costmodel.errors import TpcostError
from costmodel.evaluate import evaluate_files, plot_evaluation, summarise
from costmodel.io import JSON_SCHEMA_VERSION, dumps_json

from .common import VERSION_HELP, add_regime_args, check_plot_args, cudagraph_arg, vllm_version_arg


LABEL_MAX = 110  # the row column's widest (a terminal); longer labels keep their tail


def cmd_evaluate(args) -> int:
    check_plot_args(args, protect=tuple(args.files))
    vllm = vllm_version_arg(args)
    scored, skipped = evaluate_files(
        args.files, vllm, cudagraph_max_tokens=cudagraph_arg(args), band=args.band
    )
    if not scored:  # scoring nothing is no result: say why every row was skipped
        reasons = sorted({sk["reason"] for sk in skipped})
        raise TpcostError(
            f"nothing to score: all {len(skipped)} row(s) skipped ("
            + "; ".join(reasons[:3])
            + (f"; and {len(reasons) - 3} other reasons" if len(reasons) > 3 else "")
            + ")"
        )
    summ = summarise(scored, skipped)
    if args.plot and scored:
        plot_evaluation(scored, args.plot)
    if args.json:
        summ["rows"] = [
            {**dataclasses.asdict(s), "abs_error": s.abs_error, "tie": s.tie} for s in scored
        ]
        print(
            dumps_json(
                {
                    "schema_version": JSON_SCHEMA_VERSION,
                    "vllm_version": vllm.label,
                    "vllm_version_source": vllm.source,
                    **summ,
                },
                indent=2,
            )
        )
        return 0
    print(f"tpcost evaluate: {len(scored)} rows scored; {vllm.describe()}")
    width = min(max([len(s.label) for s in scored] + [3]), LABEL_MAX)
    print(
        f"{'row':{width}s} {'s meas':>7s} {'s pred':>7s} {'meas':>5s} {'pred':>5s} {'|err|':>6s} "
        f"{'regret%':>8s} {'vLLM':>5s}"
    )
    yn = lambda b: "on" if b else "off"  # noqa: E731
    # a label too long keeps its tail, where the rows differ (N, scope, baseline); --json has it
    # whole
    for s in scored:
        lab = s.label if len(s.label) <= width else "…" + s.label[-(width - 1) :]
        print(
            f"{lab:{width}s} {s.s_measured:7.3f} {s.s_predicted:7.3f} {yn(s.verdict_measured):>5s} "
            f"{yn(s.verdict_predicted):>5s} {s.abs_error:6.3f} {s.regret_pct:8.2f} "
            f"{yn(s.vllm_verdict):>5s}"
        )
    f = lambda v, fmt: "n/a" if v is None else format(v, fmt)  # noqa: E731
    print(f"\nrows scored {summ['rows_scored']}, skipped {summ['rows_skipped']}")
    for sk in skipped:
        print(f"  skipped {sk['where']}: {sk['reason']}")
    v = summ["vllm_rule"]
    print(f"{'':24s} {'tpcost':>10s} {'vLLM rule':>15s}")
    print(
        f"{'verdict accuracy':24s} {f(summ['verdict_accuracy'], '10.1%')} "
        f"{f(v['verdict_accuracy'], '15.1%')}"
    )
    print(
        f"{'mean regret [%]':24s} {f(summ['mean_regret_pct'], '10.2f')} "
        f"{f(v['mean_regret_pct'], '15.2f')}"
    )
    print(
        f"{'max regret [%]':24s} {f(summ['max_regret_pct'], '10.2f')} "
        f"{f(v['max_regret_pct'], '15.2f')}"
    )
    print(
        f"{'median |speedup error|':24s} {f(summ['median_abs_speedup_error'], '10.3f')} "
        f"{'(no speedup)':>15s}"
    )
    print(f"{'p90 |speedup error|':24s} {f(summ['p90_abs_speedup_error'], '10.3f')}")
    bc = summ["band_coverage"]
    if bc["rows"]:
        print(
            f"{'band covers measured':24s} {bc['covered']:10.1%}  (5-95 % over the profile's "
            f"draws; {bc['rows']} op rows)"
        )
    return 0


def register(sub):
    p = sub.add_parser(
        "evaluate", help="score the model against measured overlap CSVs (op- or model-level)"
    )
    p.add_argument(
        "files",
        nargs="+",
        metavar="FILE.csv",
        help='op-level or model-level CSVs (their columns: docs/commands.md, "CSV formats")',
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument(
        "--plot", metavar="FILE.png", help="also write measured vs predicted speedups to this PNG"
    )
    p.add_argument("--force", action="store_true", help="replace an existing --plot file")
    add_regime_args(p)
    p.add_argument(
        "--band",
        action="store_true",
        help="also the 5-95 %% band of each op row's predicted speedup over "
        "the profile's Monte Carlo draws, and how often it covers the measurement",
    )
    p.add_argument(
        "--vllm-version",
        metavar="X.Y",
        help="whose dispatched collective a baseline_impl=vllm row uses; " + VERSION_HELP,
    )
    p.set_defaults(func=cmd_evaluate)
