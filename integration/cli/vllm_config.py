"""`tpcost vllm-config`: the --compilation-config value for vLLM (and, on 0.33, its fused-kernel
switch)."""

from __future__ import annotations

import dataclasses
import json
import sys

from costmodel.defaults import DEFAULT_SEQ_LEN
from costmodel.io import dumps_json
from costmodel.vllm_tables import SWITCHES

from .common import (
    BadInputs,
    VERSION_HELP,
    add_shape_args,
    bounded_int,
    check_min_confidence,
    check_overrides_read,
    first_unread,
    fraction,
    load_workload_arg,
    resolve_inputs,
    resolve_profile,
    run_config_arg,
    traced,
    user_choices_arg,
    vllm_version_arg,
)


def register(sub) -> None:
    p = sub.add_parser(
        "vllm-config", help="the --compilation-config value for vLLM (SP/AsyncTP pass config)"
    )
    add_shape_args(p, default_gpu="auto")
    p.add_argument(
        "--format",
        choices=("json", "args", "python", "env", "serve"),
        default="json",
        help="json: the value alone; args: a vllm serve flag; python: a keyword argument; env: the "
        "kernel's "
        "switch; serve: everything at once, the environment and the vllm serve command line "
        "(default json)",
    )
    p.add_argument(
        "--vllm-version", metavar="X.Y", help="the vLLM the config is for; " + VERSION_HELP
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print a JSON report instead of the value: the compilation config, the kernel switch, "
        "the "
        "vLLM release and, for a model whose code gates a fused op (vLLM >= 0.34), every gate "
        "under "
        "model_gates",
    )
    p.add_argument(
        "--kernel-op",
        choices=tuple(SWITCHES),
        help="for a model vLLM runs its fused GEMM+RS/AR kernel in (Kimi-K3, DeepSeek-V4.1; vLLM "
        ">= 0.31): "
        "also decide the kernel's switch for this traffic (gemm_ar: VLLM_KIMI_K3_GEMM_AR, on by "
        "default; gemm_rs: VLLM_ENABLE_GEMM_RS, off by default, model-level SP only)",
    )
    g = p.add_argument_group(
        "the parallel setup as vLLM names it (decides model-level SP, hence the kernel's mode)"
    )
    g.add_argument(
        "--enable-expert-parallel",
        action="store_true",
        default=None,
        help="vLLM's --enable-expert-parallel",
    )
    g.add_argument(
        "--data-parallel-size",
        type=bounded_int("--data-parallel-size", 1, 4096, "a DP size"),
        metavar="N",
        help="vLLM's --data-parallel-size (default 1; > 1 with expert parallel turns model-level "
        "SP on)",
    )
    g.add_argument(
        "--pipeline-parallel-size",
        type=bounded_int("--pipeline-parallel-size", 1, 4096, "a PP size"),
        metavar="N",
        help="vLLM's --pipeline-parallel-size (default 1; > 1 keeps model-level SP off)",
    )
    g.add_argument(
        "--moe-backend",
        metavar="NAME",
        help="vLLM's --moe-backend (deep_gemm_mega_moe turns model-level "
        "SP on with expert parallel)",
    )
    g.add_argument(
        "--all2all-backend",
        metavar="NAME",
        help="vLLM's --all2all-backend (0.33: deepep_v2 lets the shared experts shard under SP)",
    )
    g.add_argument(
        "--data-parallel-size-local",
        type=bounded_int("--data-parallel-size-local", 1, 72, "GPUs per node"),
        metavar="N",
        help="vLLM's --data-parallel-size-local: DP ranks per node, for dual-batch overlap "
        "across nodes (default: the GPU's NVLink domain)",
    )
    g.add_argument(
        "--nnodes",
        type=bounded_int("--nnodes", 1, 4096, "a host count"),
        metavar="N",
        help="vLLM's --nnodes: the hosts the ranks sit on (a TP group that spans them takes a "
        "model's "
        "multi-node constants; dual-batch overlap: the DP ranks' hosts)",
    )
    g.add_argument(
        "--network",
        metavar="NAME|FILE",
        help="the NICs between nodes, for dual-batch overlap (a built-in "
        "network or a network .toml; default: the GPU's built-in)",
    )
    g.add_argument(
        "--shard-sp-shared-expert",
        action="store_true",
        default=None,
        help="vLLM's VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT=1 (under SP: the shared experts and dense "
        "MLP "
        "reduce-scatter through the kernel)",
    )
    p.add_argument(
        "--dp-token-spread",
        type=fraction("--dp-token-spread", 1.0, 64.0),
        metavar="R",
        help="dual-batch overlap: a step's largest DP rank's tokens over its smallest's (vLLM's "
        "vote "
        "reads the smallest, the step runs at the largest; default 1: every rank alike)",
    )
    p.add_argument(
        "--num-speculative-tokens",
        type=bounded_int("--num-speculative-tokens", 1, 64, "draft tokens"),
        metavar="K",
        help="dual-batch overlap under speculative decoding: vLLM raises both thresholds to at "
        "least 2 x (1+K)",
    )
    p.add_argument(
        "--draft-hidden-size",
        type=bounded_int("--draft-hidden-size", 1, 2**20, "a hidden size"),
        metavar="H",
        help="speculative decoding: the draft model's hidden size (vLLM >= 0.32 sizes the fused "
        "all-reduce "
        "workspace by the wider of the two; the emitted range makes its two limits agree)",
    )
    p.set_defaults(func=cmd_vllm_config)


PARALLEL_FLAGS = (
    "enable_expert_parallel",
    "data_parallel_size",
    "pipeline_parallel_size",
    "moe_backend",
    "all2all_backend",
    "shard_sp_shared_expert",
    "data_parallel_size_local",
    "network",
    "nnodes",
)
# read only by the DP+EP path (dual-batch overlap)
DBO_FLAGS = (
    "data_parallel_size_local",
    "network",
    "dp_token_spread",
)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _model_config(args):
    """(config, name, where) of --model; where it is bad, with the other bad names of the call (the
    GPU, the dtype) in the one error line."""
    from costmodel.shapes import check_dtype, load_model_config

    bad = BadInputs()
    found = bad.attempt(lambda: load_model_config(args.model))
    if found is None:
        bad.attempt(lambda: resolve_profile(args))
        bad.attempt(lambda: check_dtype(args.dtype))
        bad.raise_any()
    return found


def cmd_vllm_config(args) -> int:
    from costmodel.decide import decide_fusion, recommend
    from integration.recommend import explain

    from costmodel.errors import TpcostError
    from costmodel.shapes import kernel_family

    if args.format == "env" and not args.kernel_op:
        raise TpcostError(
            "--format env prints the fused kernel's switch (export VLLM_...=0|1); give --kernel-op "
            "too "
            "(dual-batch overlap is set by arguments: --format args)"
        )
    if args.json and args.format != "json":
        raise TpcostError(
            f"--json prints a report; --format {args.format} prints the value: give one of them"
        )
    vllm = vllm_version_arg(args)
    cfg, name, where = _model_config(args)
    if kernel_family(cfg):
        given = [_flag(f) for f in DBO_FLAGS if getattr(args, f) is not None]
        if args.num_speculative_tokens is not None:
            given.append("--num-speculative-tokens")
        if given:
            raise TpcostError(
                f"{', '.join(given)}: read only for dual-batch overlap of an MoE model without "
                "vLLM's "
                f"fused GEMM+RS/AR kernel; {name} runs the kernel (tpcost ep prices any MoE step)"
            )
        return kernel_model_config(args, cfg, name, where, vllm)
    if args.enable_expert_parallel:
        return ep_model_config(args, vllm)
    if args.num_speculative_tokens is not None:
        raise TpcostError(
            "--num-speculative-tokens: read only for dual-batch overlap (an MoE model with "
            "--enable-expert-parallel); the fusion range's draft is --draft-hidden-size"
        )
    if args.kernel_op:
        raise TpcostError(
            f"--kernel-op: the switch has no effect for {name}: vLLM binds its fused GEMM+RS/AR "
            "kernel "
            "only in Kimi-K3 / Kimi-Linear and DeepSeek-V4.1 (give such a config.json; for a "
            "what-if on "
            "any GEMM shape: tpcost op --impl kernel)"
        )
    given = [f for f in PARALLEL_FLAGS if getattr(args, f) is not None]
    if given and any(k in cfg for k in ("n_routed_experts", "num_experts", "num_local_experts")):
        raise TpcostError(
            f"{', '.join(_flag(f) for f in given)}: for {name} (MoE) these decide dual-batch "
            "overlap "
            "under DP+EP: add --enable-expert-parallel (without it vLLM shards the experts by TP "
            "and "
            "runs no all-to-all)"
        )
    if given:
        raise TpcostError(
            f"{_flag(given[0])}: read only for a model whose code gates a fused op (Kimi-K3, "
            "DeepSeek-V4.1, MiniMax-M3, Muse Spark: the kernel's mode, the gates' multi-node "
            "constants) "
            "or for an MoE model under --enable-expert-parallel"
        )
    prof, overrides, shape, _ = resolve_inputs(args, vllm)
    workload = load_workload_arg(args)
    run, user = run_config_arg(args, vllm, workload), user_choices_arg(args)
    model_prof, reads = traced(prof, overrides)
    r = recommend(model_prof, shape, run, user, min_confidence=args.min_confidence)
    check_overrides_read(prof, overrides, reads, shape, args)
    check_min_confidence(
        args, r.fusion, lambda p: decide_fusion(prof, shape, run, user, min_confidence=p)
    )
    _emit(args, {"pass_config": r.pass_config()}, None, vllm, saving=_saving_json(r))
    print(f"tpcost: config for {vllm.describe()}", file=sys.stderr)
    dom = int(prof.interconnect.domain_size)
    if args.tp > dom:
        print(
            f"tpcost: TP {args.tp} spans {-(-args.tp // dom)} NVLink domains of {dom} "
            f"({prof.name}): no fused TP op "
            "runs across nodes (FlashInfer's all-reduce+RMSNorm, the symmetric-memory ops and the "
            "GEMM+RS/AR kernel "
            "need one domain), so nothing fused is set; tpcost prices the TP collectives across "
            "nodes only over "
            "the profile's one inter-node link (no NICs or RDMA); an MoE model across nodes runs "
            "DP attention + EP "
            "instead: tpcost ep",
            file=sys.stderr,
        )
    for line in explain(r):
        print(line, file=sys.stderr)
    return 0


def _saving_json(r) -> dict:
    """What the emitted config saves per forward on the traffic, in s and as a share of the forward
    (issue 61): the SP threshold against never (and vLLM's default), and the fusion range against
    off and vLLM's limit."""
    out: dict = {"sp": None, "fusion": None}
    dv = r.decision_value or {}
    if r.has_sp and dv:
        fwd = dv.get("expected_forward_s")
        out["sp"] = {
            "expected_forward_s": fwd,
            "saving_vs_never_s": dv.get("saving_vs_never_s"),
            "saving_vs_vllm_default_s": dv.get("saving_vs_vllm_default_s"),
            "share_of_forward": (dv["saving_vs_never_s"] / fwd)
            if fwd and dv.get("saving_vs_never_s") is not None
            else None,
        }
    f = r.fusion
    if f is not None and f.value:
        v = f.value
        out["fusion"] = {
            "all_reduce_norm_per_forward_s": v["expected_s"],
            "saving_vs_off_s": v["off_s"] - v["expected_s"],
            "saving_vs_vllm_default_s": v["vllm_default_s"] - v["expected_s"],
        }
    return out


def _emit(args, cc: dict, switch, vllm=None, gates=None, saving=None, inventory=None) -> None:
    """The compilation config (and, with --format env, the kernel's switch) on stdout; with --json
    the report."""
    text = json.dumps(cc, separators=(",", ":"))
    if args.json:
        from costmodel.io import JSON_SCHEMA_VERSION

        print(
            dumps_json(
                {
                    "schema_version": JSON_SCHEMA_VERSION,
                    "vllm_version": vllm.label,
                    "vllm_version_source": vllm.source,
                    "compilation_config": cc,
                    "env": {} if switch is None else {switch.env: int(switch.set_on)},
                    "kernel_switch": None if switch is None else switch.to_json(),
                    "model_gates": None if gates is None else [g.to_json() for g in gates],
                    "saving": saving,
                    "gate_inventory": inventory,
                },
                indent=2,
            )
        )
    elif args.format == "serve":
        env = {} if switch is None else {switch.env: int(switch.set_on)}
        print(
            "\n".join(
                serve_lines(
                    args,
                    env,
                    ["--compilation-config", f"'{text}'"],
                    ["--tensor-parallel-size", str(args.tp)],
                )
            )
        )
    elif args.format == "env":  # eval "$(tpcost vllm-config ... --format env)"
        print(f"export {switch.env}={int(switch.set_on)}")
        print(f"tpcost: --compilation-config '{text}'", file=sys.stderr)
    elif args.format == "json":
        print(dumps_json(cc))
    elif args.format == "args":
        print(f"--compilation-config '{text}'")
    else:
        print(f"compilation_config={cc!r}")


def serve_lines(args, env: dict, decided: list[str], parallel: list[str]) -> list[str]:
    """--format serve: the environment (export lines) and one `vllm serve` line with the parallel
    setup tpcost priced and what it decided; the checkpoint is $MODEL, set from --model where that
    names one (a hub id or a directory)."""
    import shlex
    from pathlib import Path

    lines = [f"export {k}={v}" for k, v in env.items()]
    model = args.model or ""
    where = Path(model)
    if where.name == "config.json":
        lines.append(f"MODEL={shlex.quote(str(where.parent))}")
    # a checkpoint directory or a hub id
    elif where.is_dir() or (model.count("/") == 1 and not where.exists()):
        lines.append(f"MODEL={shlex.quote(model)}")
    return [
        *lines,
        " ".join(['vllm serve "${MODEL:?set MODEL to the checkpoint}"', *parallel, *decided]),
    ]


def _kernel_parallel_args(args, km, name):
    """The parallel setup of a kernel model's vllm-config, refusing in one line the flags only a
    forward reads."""
    from costmodel.errors import TpcostError
    from costmodel.vllm_tables import Parallel

    for flag, bad in (
        ("--dtype", args.dtype != "bf16"),
        ("--seq-len", args.seq_len != DEFAULT_SEQ_LEN),
        ("--cudagraph-max-tokens", args.cudagraph_max_tokens is not None),
        ("--enforce-eager", args.enforce_eager),
        ("--context-len", args.context_len is not None),
        ("--max-num-seqs", args.max_num_seqs is not None),
    ):
        if bad:
            why = {
                "--dtype": "each call site's weights come from the config's quantization_config",
                "--seq-len": "the kernel's call sites do not depend on it",
                "--context-len": "the kernel's call sites do not read the KV cache",
                "--max-num-seqs": "the kernel's call sites do not read the KV cache",
            }.get(
                flag,
                "the kernel and the fusion range are priced as GPU time, the same under graphs or "
                "eager",
            )
            raise TpcostError(
                f"{flag}: no effect for {name} ({why}); tpcost reads its fused-kernel call sites, "
                "not a "
                "forward"
            )
    if args.kernel_op == "gemm_rs" and args.enable_expert_parallel is None:
        raise TpcostError(
            "--kernel-op gemm_rs runs only under model-level SP: give the parallel setup vLLM is "
            "launched "
            "with (--enable-expert-parallel with --data-parallel-size N or --moe-backend "
            "deep_gemm_mega_moe)"
        )
    if args.shard_sp_shared_expert and args.kernel_op != "gemm_rs":
        raise TpcostError(
            "--shard-sp-shared-expert: only GEMM-RS under model-level SP reads it; give "
            "--kernel-op gemm_rs"
        )
    if args.tp < 2:
        raise TpcostError(
            f"--tp {args.tp}: the fused kernel needs 1 < tp <= 16 (gemm_rs_ar "
            "maybe_init_gemm_rs_ar)"
        )
    if km.hidden % args.tp:
        raise TpcostError(f"hidden size {km.hidden} of {name} is not divisible by tp={args.tp}")
    km.check_tp(args.tp)
    return Parallel(
        args.tp,
        args.pipeline_parallel_size or 1,
        args.data_parallel_size or 1,
        bool(args.enable_expert_parallel),
        args.moe_backend or "auto",
        args.all2all_backend or "",
        bool(args.shard_sp_shared_expert),
        args.nnodes or 1,
    )


def check_hosts(par, prof) -> None:
    """Refuse --nnodes that the GPU's hosts cannot hold, or that takes the TP group out of its
    NVLink domain."""
    from costmodel.errors import TpcostError

    world = par.tp * par.pipeline_parallel_size * par.data_parallel_size
    if par.nnodes == 1:
        return
    if world % par.nnodes:
        raise TpcostError(
            f"--nnodes {par.nnodes}: {world} ranks (TP x PP x DP) do not split evenly over the "
            "hosts"
        )
    per_host, ic = world // par.nnodes, prof.interconnect
    if per_host > ic.gpus_per_host():
        raise TpcostError(
            f"--nnodes {par.nnodes}: {per_host} GPUs on each host; a {prof.name} host holds "
            f"{ic.gpus_per_host()}"
        )
    if par.tp_spans_nodes() and (int(ic.domain_hosts) == 1 or par.tp > int(ic.domain_size)):
        raise TpcostError(
            f"--nnodes {par.nnodes}: TP {par.tp} spans hosts of {per_host} GPUs, outside "
            f"{prof.name}'s "
            f"NVLink domain ({int(ic.domain_size)} GPUs on {int(ic.domain_hosts)} host(s)): no "
            "fused TP "
            "op runs there"
        )


def _inventory_lines(inventory, prof, family: str, vllm) -> list[str]:
    """The gates of the family's code on a communication path or a second stream that tpcost does
    not price, for this GPU's platform (vLLM's amd/ or nvidia/ code), each with why; the JSON's
    gate_inventory holds every kind."""
    amd = prof.kind == "xgmi"
    shown = [
        g
        for g in inventory
        if g.kind in ("comm", "compute_stream")
        and not g.priced
        and (("/amd/" in g.where) == amd if ("/amd/" in g.where or "/nvidia/" in g.where) else True)
    ]
    if not shown:
        return []
    return [
        f"tpcost: the other gates on a communication path or a second stream in {family}'s code "
        "for this GPU "
        f"(vLLM {vllm.label}; --json: gate_inventory, every kind and platform):"
    ] + [f"tpcost:   {g.name} = {g.value} ({g.where}): {g.what}; {g.status_line()}" for g in shown]


def kernel_model_config(args, cfg, name, where, vllm) -> int:
    """vllm-config for a model that runs vLLM's fused kernel: the fusion range and (--kernel-op) the
    switch, from its call sites (costmodel.vllm_tables); its forward is not modelled, so the flags
    only a forward reads are refused."""
    from costmodel.errors import TpcostError
    from costmodel.shapes import check_kv_heads_split, read_kernel_model
    from costmodel.model import Regime, RunConfig

    from costmodel.shapes import FORWARD_PARTS
    from costmodel.vllm_tables import RELEASES
    from costmodel.decide import kernel_model_config as decide
    from integration.recommend import fusion_lines, gate_lines, kernel_switch_lines

    km = read_kernel_model(cfg, name, where)
    par = _kernel_parallel_args(args, km, name)
    check_kv_heads_split(km, par.tp, where)
    if km.mode(par) == "gemm_rs" and args.fi_allreduce_fusion_max_size_mb is not None:
        raise TpcostError(
            "--fi-allreduce-fusion-max-size-mb: no effect under model-level SP (the all-reduces "
            "become "
            "reduce-scatter / all-gather: no all-reduce+RMSNorm to fuse)"
        )
    prof, overrides = resolve_profile(args)
    check_hosts(par, prof)
    workload = load_workload_arg(args)
    run = RunConfig(
        par.tp, "bf16", Regime(vllm=vllm), args.max_num_batched_tokens, args.margin, workload
    )
    user = user_choices_arg(args)
    model_prof, reads = traced(prof, overrides)
    d = decide(model_prof, km, par, args.kernel_op, run, user, min_confidence=args.min_confidence)
    check_min_confidence(
        args,
        d.fusion,
        lambda p: decide(prof, km, par, args.kernel_op, run, user, min_confidence=p).fusion,
    )
    key = first_unread(prof, overrides, reads)
    if key is not None:
        raise TpcostError(
            f"--set {key}: no effect for {name} at tp={args.tp} (the fused kernel and the fusion "
            "range do not read it)"
        )
    inventory = vllm.release.inventory_of(km.family)
    _emit(
        args,
        {"pass_config": d.pass_config()},
        d.switch,
        vllm,
        d.gates,
        inventory=[dataclasses.asdict(g) | {"status": g.status_line()} for g in inventory],
    )
    err = lambda line: print(line, file=sys.stderr)  # noqa: E731
    err(f"tpcost: config for {vllm.describe()}")
    err(
        f"tpcost: {name} ({km.family}): tpcost reads its fused-op call sites from config.json; its "
        "forward "
        f"({FORWARD_PARTS[km.family]}) is not modelled, so no SP threshold is decided and vLLM's "
        "own stands"
    )
    if d.mode == "gemm_rs":
        err(
            "tpcost: model-level SP: the all-reduces become reduce-scatter / all-gather; the "
            "FlashInfer all-reduce+"
            "RMSNorm range has nothing to fuse and is left to vLLM"
        )
    else:
        for line in fusion_lines(d.fusion, prof.name, args.tp):
            err(line)
    refused = km.vllm_refuses(par)
    if refused:
        err(
            f"tpcost: {refused}; what follows is for this model's call-site shapes on a checkpoint "
            "vLLM builds"
        )
    if d.switch is not None:
        for line in kernel_switch_lines(d.switch):
            err(line)
    elif km.family != "muse_spark":
        err(
            f"tpcost: add --kernel-op {d.mode or 'gemm_rs'} to decide the fused kernel's switch "
            "for this traffic"
        )
    gl = gate_lines(d.gates)
    if gl:
        err(
            f"tpcost: vLLM {vllm.label}'s hand cutoffs in {km.family}'s code, each beside tpcost's "
            "value for this GPU, TP "
            "and traffic (decided as every cutoff: the least expected time, premium included):"
        )
    elif any(r.gates_of(km.family) for r in RELEASES.values()):
        err(
            f"tpcost: vLLM {vllm.label} has no hand cutoff in {km.family}'s code (its gates: "
            + ", ".join(
                sorted(
                    {
                        f"{g.key} from {r.label}"
                        for r in RELEASES.values()
                        for g in r.gates_of(km.family)
                    }
                )
            )
            + ")"
        )
    for line in gl:
        err(line)
    for line in _inventory_lines(inventory, prof, km.family, vllm):
        err(line)
    err(
        f"tpcost: profile {prof.name} ({prof.origin}), weakest provenance tier {prof.tier}"
        + (", MODIFIED by --set" if prof.modified else "")
    )
    return 0


def ep_model_config(args, vllm) -> int:
    """vllm-config for an MoE model under DP attention + expert parallelism: vLLM 0.34's dual-batch
    overlap arguments (--enable-dbo and both thresholds) or that DBO stays off, and why; the step is
    tpcost ep's."""
    import argparse

    from costmodel.defaults import DEFAULT_BUDGET_TOKENS
    from costmodel.errors import TpcostError
    from costmodel.vllm_tables import current
    from integration.dbo import decide_dbo
    from costmodel.decide import MIN_CONFIDENCE

    from .common import DEFAULT_DTYPE, DEFAULT_TP
    from .ep import setup_from_args

    if vllm.release.ep is None:
        raise TpcostError(
            f"dual-batch overlap: tpcost has read DP+EP and DBO rules for vLLM {current().label} "
            "only, "
            f"not {vllm.label} (--vllm-version {current().label})"
        )
    if (args.data_parallel_size or 1) < 2:
        raise TpcostError(
            f"--enable-expert-parallel with --data-parallel-size {args.data_parallel_size or 1}: "
            "vLLM "
            f"builds no microbatch runner at DP 1 ({vllm.release.ep.dp_one_cite}): DBO stays off"
        )
    if (args.pipeline_parallel_size or 1) > 1:
        raise TpcostError(
            f"--pipeline-parallel-size > 1: vLLM {vllm.label} refuses DBO with pipeline "
            "parallelism "
            f"({vllm.release.ep.unsupported_cite})"
        )
    unread = [
        flag
        for flag, bad in (
            ("--tp", args.tp != DEFAULT_TP),
            ("--dtype", args.dtype != DEFAULT_DTYPE),
            ("--fi-allreduce-fusion-max-size-mb", args.fi_allreduce_fusion_max_size_mb is not None),
            ("--min-confidence", args.min_confidence != MIN_CONFIDENCE),
            ("--workload", args.workload is not None),
            ("--set", bool(args.set)),
            ("--max-num-seqs", args.max_num_seqs is not None),
            ("--cudagraph-max-tokens", args.cudagraph_max_tokens is not None),
            ("--enforce-eager", args.enforce_eager),
            ("--moe-backend", args.moe_backend is not None),
            ("--shard-sp-shared-expert", bool(args.shard_sp_shared_expert)),
            ("--draft-hidden-size", args.draft_hidden_size is not None),
        )
        if bad
    ]
    if unread:
        raise TpcostError(
            f"{', '.join(unread)}: not read by the DP+EP step (attention per DP rank at TP 1, the "
            "checkpoint's formats, uniform traffic over 1..budget tokens, graphs as vLLM sets them "
            "per "
            "backend; docs/model.md §11-12)"
        )
    ns = argparse.Namespace(
        gpu=args.gpu,
        model=args.model,
        data_parallel_size=args.data_parallel_size,
        data_parallel_size_local=args.data_parallel_size_local,
        nnodes=args.nnodes,
        enable_expert_parallel=True,
        all2all_backend=args.all2all_backend or "allgather_reducescatter",
        network=args.network,
        phase=None,
        context_len=args.context_len or None,
        seq_len=args.seq_len,
        max_num_batched_tokens=None
        if args.max_num_batched_tokens == DEFAULT_BUDGET_TOKENS
        else args.max_num_batched_tokens,
        imbalance=None,
        dbo_comm_sms=None,
        margin=args.margin,
        num_speculative_tokens=args.num_speculative_tokens,
        dp_token_spread=args.dp_token_spread,
    )
    s = setup_from_args(ns)
    d = decide_dbo(ns, s)
    kw = (
        {
            "enable_dbo": True,
            "dbo_decode_token_threshold": d["decode_token_threshold"],
            "dbo_prefill_token_threshold": d["prefill_token_threshold"],
        }
        if d["enable"]
        else {}
    )
    if args.json:
        from costmodel.io import JSON_SCHEMA_VERSION

        print(
            dumps_json(
                {
                    "schema_version": JSON_SCHEMA_VERSION,
                    "vllm_version": vllm.label,
                    "vllm_version_source": vllm.source,
                    "compilation_config": {},
                    "env": {},
                    "kernel_switch": None,
                    "model_gates": None,
                    "parallel_config": kw,
                    "dbo": d,
                },
                indent=2,
            )
        )
    elif args.format == "args":
        print(" ".join(d["vllm_args"]))
    elif args.format == "serve":  # DBO leaves the compilation config as it is
        print(
            "\n".join(
                serve_lines(
                    args,
                    {},
                    list(d["vllm_args"]),
                    [
                        "--data-parallel-size",
                        str(args.data_parallel_size),
                        "--enable-expert-parallel",
                        "--all2all-backend",
                        s.backend,
                    ],
                )
            )
        )
    elif args.format == "python":
        print(", ".join(f"{k}={v!r}" for k, v in kw.items()))
    else:  # json: the --compilation-config value, which DBO does not touch
        print(dumps_json({}))
    err = lambda line: print(line, file=sys.stderr)  # noqa: E731
    err(f"tpcost: config for {vllm.describe()}")
    err(
        f"tpcost: {s.shape.name} on {s.prof.name}: EP {s.ep} over {s.nodes} node(s), {s.backend}, "
        "network "
        f"{s.network.name}, budget {s.budget_tokens} tokens per rank"
    )
    if d["enable"]:
        err(
            f"tpcost: dual-batch overlap pays: {' '.join(d['vllm_args'])} (vLLM's defaults: decode "
            f"{d['vllm_defaults']['decode']}, prefill {d['vllm_defaults']['prefill']}, DBO off)"
        )
        if args.format == "json":
            err(
                "tpcost: DBO is set by vllm serve arguments, not the compilation config: --format "
                "args prints them"
            )
    else:
        err("tpcost: dual-batch overlap: keep it off")
    err(f"tpcost: {d['why']}")
    err(f"tpcost: assumes {d['assumes']}")
    cs = d.get("comm_sms") or {}
    for phase, c in (cs.get("phases") or {}).items():
        err(
            f"tpcost: what-if {cs['env']}={c['sms']} ({phase}; vLLM's {c['vllm_sms']}): saves "
            f"{c['saving_s'] * 1e3:.3f} "
            f"ms per step of {c['mean_step_s'] * 1e3:.3f} ms on the traffic, the dispatch "
            f"{c['bound']}-bound there; "
            f"reported, not emitted (it rests on one pair of rows: {cs['assumes']})"
        )
    return 0
