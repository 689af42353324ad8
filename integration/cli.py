"""`tpcost vllm-config`: print exactly what to give vLLM (stdout), and why (stderr)."""

from __future__ import annotations

import json
import sys


def register(sub):
    from costmodel.cli import add_shape_args

    p = sub.add_parser("vllm-config", help="the --compilation-config value for vLLM (SP/AsyncTP pass config)")
    add_shape_args(p, gpu_help="built-in GPU profile, a profile .toml path, or 'auto' (local GPU; $TPCOST_PROFILE overrides)")
    p.add_argument("--format", choices=("json", "args", "python"), default="json")
    p.set_defaults(func=cmd_vllm_config)


def cmd_vllm_config(args) -> int:
    from costmodel.cli import resolve_inputs

    from .recommend import detect_profile_name, explain, recommend

    if args.gpu == "auto":
        args.gpu = detect_profile_name()
    prof, shape = resolve_inputs(args)
    r = recommend(prof, shape, args.tp, args.dtype, args.max_num_batched_tokens, args.margin, args.seq_len)
    cc = {"pass_config": r.pass_config()}
    text = json.dumps(cc, separators=(",", ":"))
    if args.format == "json":
        print(json.dumps(cc))
    elif args.format == "args":
        print(f"--compilation-config '{text}'")
    else:
        print(f"compilation_config={cc!r}")
    for line in explain(r):
        print(line, file=sys.stderr)
    return 0
