"""`tpcost ep`: an MoE model under DP attention + expert parallelism: the step per rank over tokens
per rank, the all-to-all per call (--a2a), and dual-batch overlap decided (--dbo). `whatif
--enable-expert-parallel` lands here."""

from __future__ import annotations

import numpy as np

from costmodel.errors import TpcostError
from costmodel.io import JSON_SCHEMA_VERSION, dumps_json

from costmodel.defaults import DEFAULT_CONTEXT_LEN, DEFAULT_SEQ_LEN
from costmodel.vllm_tables import ep_rules

from .common import BadInputs, bounded_int, fraction

DEFAULT_EP_GPU = "h200-sxm"
DEFAULT_EP_MODEL = "deepseek-v3"
DEFAULT_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
# Flags whose effect depends on the query: each given one is priced again at its default, and
# refused where the answer is the same (a flag takes effect or is refused).
_CHECKED = (
    "--network",
    "--phase",
    "--context-len",
    "--seq-len",
    "--max-num-batched-tokens",
    "--imbalance",
    "--dbo-comm-sms",
    "--margin",
    "--workload",
    "--num-speculative-tokens",
    "--dp-token-spread",
)
# --shared-stream is a question of its own (an answer is printed whenever it is given), not a
# modifier


def register(sub) -> None:
    from costmodel.all2all import BACKENDS

    p = sub.add_parser(
        "ep", help="MoE under DP attention + expert parallelism: step, all-to-all, DBO"
    )
    p.add_argument(
        "--gpu",
        default=DEFAULT_EP_GPU,
        help=f"GPU profile name or .toml (default {DEFAULT_EP_GPU})",
    )
    p.add_argument(
        "--model",
        default=DEFAULT_EP_MODEL,
        help="MoE model: built-in, config.json, or cached Hugging Face id (default "
        f"{DEFAULT_EP_MODEL})",
    )
    p.add_argument(
        "--data-parallel-size",
        type=bounded_int("--data-parallel-size", 1, 1024, "EP groups beyond it"),
        default=16,
        help="DP ranks = EP size with TP 1 (default 16)",
    )
    p.add_argument(
        "--data-parallel-size-local",
        type=bounded_int("--data-parallel-size-local", 1, 72, "GPUs per node"),
        help="DP ranks per node (default: the GPU's NVLink domain, capped at the DP size)",
    )
    p.add_argument(
        "--nnodes",
        type=bounded_int("--nnodes", 1, 128, "nodes"),
        help="nodes (vLLM's --nnodes; must equal DP / DP-local)",
    )
    p.add_argument(
        "--enable-expert-parallel", action="store_true", help="vLLM's switch; required here"
    )
    p.add_argument(
        "--all2all-backend",
        default="allgather_reducescatter",
        choices=sorted(BACKENDS),
        metavar="BACKEND",
        help="vLLM 0.34's --all2all-backend (default allgather_reducescatter, vLLM's)",
    )
    p.add_argument(
        "--network", help="built-in network name or a network .toml (default: the GPU's built-in)"
    )
    p.add_argument(
        "--phase",
        choices=("decode", "prefill"),
        help="uniform decode steps, or prefill steps (default decode)",
    )
    p.add_argument(
        "--context-len",
        type=bounded_int("--context-len", 1, 2**24, "context"),
        help=f"KV tokens each decode reads (default {DEFAULT_CONTEXT_LEN})",
    )
    p.add_argument(
        "--seq-len",
        type=bounded_int("--seq-len", 1, 2**24, "sequence"),
        help=f"prefill sequence length (default {DEFAULT_SEQ_LEN})",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=bounded_int("--max-num-batched-tokens", 1, 2**20, "tokens"),
        help="per rank; default as vLLM 0.34 sets it (256 with deepep_low_latency / nixl_ep under "
        "EP, "
        "else 2048)",
    )
    p.add_argument(
        "--imbalance",
        type=fraction("--imbalance", 1.0, 64.0),
        help="hot expert rank's load / the mean, in [1, 64) (default 1: balanced; EPLB narrows it)",
    )
    p.add_argument(
        "--dp-token-spread",
        type=fraction("--dp-token-spread", 1.0, 64.0),
        metavar="R",
        help="with --dbo: a step's largest DP rank's tokens over its smallest's (vLLM's vote reads "
        "the "
        "smallest, the step runs at the largest; default 1: every rank alike)",
    )
    p.add_argument(
        "--dbo-comm-sms",
        type=bounded_int("--dbo-comm-sms", 1, 256, "SMs"),
        help=f"VLLM_DBO_COMM_SMS for deepep_high_throughput (default {ep_rules().comm_sms})",
    )
    p.add_argument(
        "--tokens",
        type=bounded_int("--tokens", 1, 2**20, "tokens"),
        nargs="+",
        help="tokens per rank to tabulate (default 1 .. 4096)",
    )
    p.add_argument("--a2a", action="store_true", help="print the dispatch/combine per call only")
    p.add_argument(
        "--dbo",
        action="store_true",
        help="decide dual-batch overlap: both thresholds and the saving",
    )
    p.add_argument(
        "--shared-stream",
        action="store_true",
        help="decide VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD (the shared experts on vLLM's aux "
        "stream "
        "at or below it) for a backend whose combine does not already hide them",
    )
    p.add_argument(
        "--at",
        type=bounded_int("--at", 2, 2**20, "tokens"),
        help="break one step down, DBO off and on",
    )
    p.add_argument(
        "--ops",
        type=bounded_int("--ops", 1, 2**20, "tokens"),
        metavar="N",
        help="every op of a step at N tokens per rank: count, time, TFLOP/s or GB/s, the bound it "
        "hits",
    )
    p.add_argument(
        "--margin", type=fraction("--margin"), default=None, help="risk premium on the DBO side"
    )
    p.add_argument(
        "--num-speculative-tokens",
        type=bounded_int("--num-speculative-tokens", 1, 64, "draft tokens"),
        metavar="K",
        help="with --dbo: vLLM's speculative decoding (the thresholds are at least 2 x (1+K))",
    )
    p.add_argument(
        "--workload",
        metavar="FILE",
        help="the traffic --dbo decides for: a CSV num_tokens,count[,phase] "
        "(tokens per DP rank; phase decode|mixed splits the two thresholds' traffic) or a /metrics "
        "scrape "
        "(default: uniform over 1..budget)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output (SI units)")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="with --dbo: the step time over tokens per rank, DBO off and "
        "on, for --phase, with its crossover and decided threshold",
    )
    p.add_argument("--force", action="store_true", help="replace an existing --plot file")
    p.set_defaults(func=cmd_ep)


def setup_from_args(args, phase: str | None = None):
    """The EPSetup the flags describe, every refusal one line."""
    from costmodel.all2all import backend
    from costmodel.defaults import DEFAULT_DP_TOKEN_SPREAD
    from costmodel.ep_step import BATCHED_DP_BUDGET, DEFAULT_BUDGET, EPSetup, check_setup
    from costmodel.moe import load_moe_model
    from costmodel.network import load_network
    from costmodel.profile import load_profile

    if not args.enable_expert_parallel:
        raise TpcostError(
            "ep prices vLLM's expert parallelism: add --enable-expert-parallel (without it vLLM "
            "shards the experts by TP and runs no all-to-all)"
        )
    bad = BadInputs()  # the bad names of the call, all in the one line
    prof = bad.attempt(lambda: load_profile(args.gpu))
    shape = bad.attempt(lambda: load_moe_model(args.model))
    b = bad.attempt(lambda: backend(args.all2all_backend))
    bad.raise_any()
    if b.predict is None:
        raise TpcostError(b.refusal)
    dom = int(prof.interconnect.domain_size)
    dp = args.data_parallel_size
    local = args.data_parallel_size_local or min(dp, dom)
    if local > dom:
        raise TpcostError(
            f"--data-parallel-size-local {local}: {prof.name} has {dom} GPUs per NVLink domain"
        )
    if dp % local:
        raise TpcostError(
            f"--data-parallel-size {dp} is not a multiple of --data-parallel-size-local {local}"
        )
    if args.nnodes is not None and args.nnodes * local != dp:
        raise TpcostError(
            f"--nnodes {args.nnodes} x --data-parallel-size-local {local} != --data-parallel-size "
            f"{dp}"
        )
    net = load_network(args.network) if args.network else prof.network()
    budget = args.max_num_batched_tokens or (BATCHED_DP_BUDGET if b.batched_dp else DEFAULT_BUDGET)
    sms = ep_rules().comm_sms if args.dbo_comm_sms is None else args.dbo_comm_sms
    s = EPSetup(
        prof=prof,
        shape=shape,
        ep=dp,
        gpus_per_node=local,
        backend=args.all2all_backend,
        network=net,
        decode=(phase or args.phase or "decode") == "decode",
        context_len=args.context_len or DEFAULT_CONTEXT_LEN,
        seq_len=args.seq_len or DEFAULT_SEQ_LEN,
        budget_tokens=budget,
        imbalance=1.0 if args.imbalance is None else args.imbalance,
        comm_sms=sms,
        dp_token_spread=DEFAULT_DP_TOKEN_SPREAD
        if getattr(args, "dp_token_spread", None) is None
        else args.dp_token_spread,
    )
    check_setup(s)
    if sms >= prof.identity.sm_count:
        raise TpcostError(
            f"--dbo-comm-sms {sms} leaves no SM of {prof.identity.sm_count} to DeepGEMM"
        )
    return s


def a2a_rows(s, tokens) -> list[dict]:
    """Per tokens per rank: one dispatch and one combine call (s), their bytes and the bound."""
    from costmodel.ep_step import a2a

    T = np.asarray(tokens, dtype=float)
    x = a2a(s, T)
    out = []
    for i, t in enumerate(T):
        d, c = float(x.t_dispatch_s[i]), float(x.t_combine_s[i])
        rd, nd = (
            float(np.asarray(x.rdma_dispatch_bytes)[i]),
            float(np.asarray(x.nvl_dispatch_bytes)[i]),
        )
        out.append(
            {
                "tokens_per_rank": int(t),
                "t_dispatch_s": d,
                "t_combine_s": c,
                "rdma_dispatch_bytes": rd,
                "nvl_dispatch_bytes": nd,
                "rdma_combine_bytes": float(np.asarray(x.rdma_combine_bytes)[i]),
                "nvl_combine_bytes": float(np.asarray(x.nvl_combine_bytes)[i]),
                "bound_dispatch": x.bound_dispatch,
                "bound_combine": x.bound_combine,
            }
        )
    return out


def step_rows(s, tokens) -> list[dict]:
    """Per tokens per rank: the step's named terms (s), DBO on beside it where the backend
    microbatches."""
    from costmodel.all2all import backend
    from costmodel.ep_step import a2a, dbo_step, step

    T = np.asarray(tokens, dtype=float)
    st = step(s, T)
    per_call = a2a(s, np.minimum(T, s.budget_tokens) if backend(s.backend).batched_dp else T)
    on = dbo_step(s, np.maximum(T, 2)).t_step_s if backend(s.backend).microbatches else None
    rows = []
    for i, t in enumerate(T):
        r = {
            "tokens_per_rank": int(t),
            "t_step_s": float(st.t_step_s[i]),
            "t_gpu_s": float(st.t_gpu_s[i]),
            "t_host_s": float(st.t_host_s[i]),
            "t_attention_s": float(st.t_attention_s[i]),
            "t_dense_s": float(st.t_dense_s[i]),
            "t_experts_s": float(st.t_experts_s[i]),
            "t_shared_s": float(st.t_shared_s[i]),
            "t_router_s": float(st.t_router_s[i]),
            "t_norms_s": float(st.t_norms_s[i]),
            "t_lm_head_s": float(st.t_lm_head_s[i]),
            "t_dispatch_step_s": float(st.t_dispatch_s[i]),
            "t_combine_step_s": float(st.t_combine_s[i]),
            "t_dispatch_s": float(per_call.t_dispatch_s[i]),
            "t_combine_s": float(per_call.t_combine_s[i]),
            "a2a_calls_per_layer": int(np.asarray(st.per_call.calls)[i]),
            "active_local_experts": float(np.asarray(st.per_call.active_experts)[i]),
            "t_step_dbo_s": None if on is None or t < 2 else float(on[i]),
        }
        rows.append(r)
    return rows


def _header(s) -> dict:
    from costmodel.moe import MLA_CITE, weight_bytes_per_rank

    return {
        "gpu": s.prof.name,
        "model": s.shape.name,
        "ep": s.ep,
        "nodes": s.nodes,
        "gpus_per_node": s.gpus_per_node,
        "all2all_backend": s.backend,
        "network": s.network.name,
        "phase": "decode" if s.decode else "prefill",
        "context_len": s.context_len,
        "seq_len": s.seq_len,
        "max_num_batched_tokens": s.budget_tokens,
        "imbalance": s.imbalance,
        "dp_token_spread": s.dp_token_spread,
        "weight_bytes_per_rank": weight_bytes_per_rank(s.shape, s.ep),
        "cuda_graphs": s.graphs,
        "attention": ("MLA: " + MLA_CITE) if s.shape.mla else "GQA",
    }


def _body(args) -> tuple[object, dict]:
    """The setup and the answer the flags ask for (everything but the header)."""
    from .common import load_workload_arg

    s = setup_from_args(args)
    if args.workload and not (args.dbo or args.shared_stream):
        raise TpcostError(
            "--workload: read only by --dbo and --shared-stream (the traffic the thresholds are "
            "decided "
            "for)"
        )
    args.workload_obj = load_workload_arg(args)
    out: dict = {}
    if args.ops:
        from costmodel.ep_step import ops_at

        out["ops"] = {"tokens_per_rank": args.ops, "ops": ops_at(s, args.ops)}
    elif args.a2a:
        out["a2a"] = a2a_rows(s, args.tokens or list(DEFAULT_TOKENS))
    elif args.at:
        out["at"] = at_breakdown(s, args.at)
    else:
        out["rows"] = step_rows(s, args.tokens or list(DEFAULT_TOKENS))
    if args.dbo:
        from integration.dbo import decide_dbo

        out["dbo"] = decide_dbo(args, s)
    if args.shared_stream:
        out["shared_stream"] = decide_shared_stream(args, s)
    return s, out


def decide_shared_stream(args, s) -> dict:
    """The aux-stream threshold of the shared experts for this setup and traffic, vLLM's default
    beside it."""
    import dataclasses

    from costmodel.defaults import DEFAULT_MARGIN
    from costmodel.ep_step import COLLECTIVE_SLOWDOWN_BESIDE_GEMM, EP, shared_stream_threshold
    from integration.dbo import phase_weights

    w, what = phase_weights(
        getattr(args, "workload_obj", None), "decode" if s.decode else "prefill", s.budget_tokens
    )
    margin = DEFAULT_MARGIN if args.margin is None else args.margin
    r = shared_stream_threshold(s, s.budget_tokens, margin, w)
    env = "VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD"
    where = (
        "at every size"
        if r.threshold_tokens >= r.t_max
        else f"up to {r.threshold_tokens} tokens"
        if r.threshold_tokens
        else "at no size"
    )
    return {
        **dataclasses.asdict(r),
        "env": {env: r.threshold_tokens},
        "traffic": what,
        "why": (
            "the shared experts hide behind the NCCL all-gather and reduce-scatter on the aux "
            "stream; each "
            f"collective runs {100 * COLLECTIVE_SLOWDOWN_BESIDE_GEMM:.0f} % slower while they "
            "share its SMs "
            f"(VLLM_PR53556); the aux stream pays {where} on this traffic, the premium "
            f"{margin:.0%} on its "
            "side"
        ),
        "cite": EP.shared_stream_cite,
    }


def _refuse_inert(args, body: dict) -> None:
    """Refuse each given flag of _CHECKED whose answer equals the one at its default, naming every
    such flag."""
    import argparse

    inert = []
    for flag in _CHECKED:
        dest = flag[2:].replace("-", "_")
        if getattr(args, dest) is None:
            continue
        if _body(argparse.Namespace(**{**vars(args), dest: None}))[1] == body:
            inert.append(f"{flag} {getattr(args, dest)}")
    if inert:
        raise TpcostError(
            f"{'; '.join(inert)}: no effect on this query (the answer is the same at the default; "
            "see docs/cli.md for where each takes effect)"
        )


def cmd_ep(args) -> int:
    if args.a2a and (args.dbo or args.at):
        raise TpcostError("--a2a prints the all-to-all alone: drop --dbo / --at")
    if args.ops and (args.a2a or args.at or args.dbo or args.tokens or args.plot is not None):
        raise TpcostError(
            "--ops lists one step's ops: drop --a2a / --at / --dbo / --tokens / --plot"
        )
    if args.at and args.tokens:
        raise TpcostError("--at breaks one step down: drop --tokens")
    from .common import check_plot_args

    check_plot_args(args, protect=tuple(x for x in (args.network, args.model, args.workload) if x))
    if args.plot is not None and not args.dbo:
        raise TpcostError("--plot draws DBO off and on with its thresholds: give --dbo too")
    s, body = _body(args)
    if args.ops and args.ops > s.budget_tokens:
        raise TpcostError(f"--ops {args.ops}: above the token budget of {s.budget_tokens} per rank")
    if args.at and args.at > s.budget_tokens:
        raise TpcostError(
            f"--at {args.at}: above the token budget of {s.budget_tokens} per rank (vLLM never "
            "runs "
            "such a step; raise --max-num-batched-tokens)"
        )
    _refuse_inert(args, body)
    out = {"schema_version": JSON_SCHEMA_VERSION, "setup": _header(s), **body}
    if args.plot is not None:
        _plot(s, out["dbo"], args.plot)
    if args.json:
        print(dumps_json(out, indent=2))
        return 0
    _render(out)
    return 0


def _plot(s, dbo: dict, path: str) -> None:
    """--plot: the setup's phase, DBO off and on over 2..budget tokens per rank, with the decision's
    two numbers."""
    from costmodel.all2all import backend
    from costmodel.ep_step import dbo_step, step
    from costmodel.plot import plot_dbo

    if not backend(s.backend).microbatches:
        raise TpcostError(
            f"--plot: {s.backend} cannot microbatch in vLLM 0.34: there is no DBO curve to draw"
        )
    T = np.arange(2, s.budget_tokens + 1, dtype=float)
    ph = dbo["phases"]["decode" if s.decode else "prefill"]
    plot_dbo(
        T,
        step(s, T).t_step_s,
        dbo_step(s, T).t_step_s,
        ph["crossover_tokens"],
        ph["threshold_tokens"],
        f"{s.shape.name} on {s.prof.name}, EP {s.ep} ({s.nodes} node(s)), {s.backend}, "
        f"{'decode' if s.decode else 'prefill'}",
        path,
    )


def at_breakdown(s, n: int) -> dict:
    """One step of n tokens per rank: DBO off and on, each microbatch's compute and comm, the
    exposed part, and the doubled weight reads (s)."""
    from costmodel.all2all import backend
    from costmodel.ep_step import dbo_step, step

    st = step(s, np.array([float(n)]))
    out = {
        "tokens_per_rank": n,
        "off": {
            "t_step_s": float(st.t_step_s[0]),
            "t_exposed_comm_s": float(st.t_exposed_comm_s[0]),
        },
    }
    if backend(s.backend).microbatches:
        d = dbo_step(s, np.array([float(n)]))
        out["on"] = {
            "t_step_s": float(d.t_step_s[0]),
            "t_compute_a_s": float(d.t_compute_s[0][0]),
            "t_compute_b_s": float(d.t_compute_s[1][0]),
            "t_comm_a_s": float(d.t_comm_s[0][0]),
            "t_comm_b_s": float(d.t_comm_s[1][0]),
            "t_exposed_comm_s": float(d.t_exposed_comm_s[0]),
            "t_doubled_s": float(d.t_doubled_s[0]),
            "t_host_s": float(d.t_host_s[0]),
        }
    return out


def _render(out: dict) -> None:
    h = out["setup"]
    print(
        f"{h['model']} on {h['gpu']}: EP {h['ep']} over {h['nodes']} node(s) of "
        f"{h['gpus_per_node']}, "
        f"{h['all2all_backend']}, network {h['network']}, {h['phase']} "
        f"(budget {h['max_num_batched_tokens']} tokens per rank; weights "
        f"{h['weight_bytes_per_rank'] / 1e9:.1f} GB "
        f"per GPU; {'CUDA graphs' if h['cuda_graphs'] else 'eager'})"
    )
    if "a2a" in out:
        print(
            f"{'tokens':>7} {'dispatch us':>12} {'combine us':>11} {'RDMA MB':>8} "
            f"{'NVLink MB':>10}  bound"
        )
        for r in out["a2a"]:
            print(
                f"{r['tokens_per_rank']:>7} {r['t_dispatch_s'] * 1e6:>12.1f} "
                f"{r['t_combine_s'] * 1e6:>11.1f} "
                f"{r['rdma_dispatch_bytes'] / 1e6:>8.2f} {r['nvl_dispatch_bytes'] / 1e6:>10.2f}  "
                f"{r['bound_dispatch']} / {r['bound_combine']}"
            )
    if "rows" in out:
        print(
            f"{'tokens':>7} {'step ms':>9} {'attn':>8} {'dense':>7} {'experts':>8} "
            f"{'disp+comb':>10} "
            f"{'per call us':>12} {'DBO on ms':>10}"
        )
        for r in out["rows"]:
            on = "-" if r["t_step_dbo_s"] is None else f"{r['t_step_dbo_s'] * 1e3:.3f}"
            print(
                f"{r['tokens_per_rank']:>7} {r['t_step_s'] * 1e3:>9.3f} "
                f"{r['t_attention_s'] * 1e3:>8.3f} "
                f"{r['t_dense_s'] * 1e3:>7.3f} {r['t_experts_s'] * 1e3:>8.3f} "
                f"{(r['t_dispatch_step_s'] + r['t_combine_step_s']) * 1e3:>10.3f} "
                f"{(r['t_dispatch_s'] + r['t_combine_s']) * 1e6:>12.1f} {on:>10}"
            )
    if "ops" in out:
        o = out["ops"]
        print(f"every op at {o['tokens_per_rank']} tokens per rank (times per call):")
        print(f"{'op':44s} {'x/step':>6} {'us':>9} {'TFLOP/s':>8} {'GB/s':>8}  bound")
        for r in o["ops"]:
            print(
                f"{r['op']:44s} {r['count_per_step']:>6} {r['t_s'] * 1e6:>9.1f} "
                f"{r['achieved_tflops']:>8.1f} "
                f"{r['achieved_gbps']:>8.0f}  {r['bound']}"
            )
    if "at" in out:
        a = out["at"]
        print(
            f"at {a['tokens_per_rank']} tokens per rank: DBO off {a['off']['t_step_s'] * 1e3:.3f} "
            "ms "
            f"(all-to-all exposed {a['off']['t_exposed_comm_s'] * 1e3:.3f} ms)"
        )
        if "on" in a:
            o = a["on"]
            print(
                f"  DBO on {o['t_step_s'] * 1e3:.3f} ms: compute {o['t_compute_a_s'] * 1e3:.3f} + "
                f"{o['t_compute_b_s'] * 1e3:.3f} ms, comm {o['t_comm_a_s'] * 1e3:.3f} + "
                f"{o['t_comm_b_s'] * 1e3:.3f} "
                f"ms, exposed {o['t_exposed_comm_s'] * 1e3:.3f} ms, doubled weight reads and "
                "launches "
                f"{o['t_doubled_s'] * 1e3:.3f} ms"
            )
    if "dbo" in out:
        from integration.dbo import render_dbo

        render_dbo(out["dbo"])
    if "shared_stream" in out:
        r = out["shared_stream"]
        print(
            "shared experts' aux stream: "
            f"VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD={r['threshold_tokens']} "
            f"(vLLM's default {r['vllm_threshold_tokens']}); saves {r['saving_s'] * 1e3:.3f} ms "
            "per step of "
            f"{r['mean_step_s'] * 1e3:.3f} ms against none, {r['saving_vs_vllm_s'] * 1e3:+.3f} ms "
            "against vLLM's "
            f"default (the premium on the aux side can make it negative)"
        )
        print(f"  {r['why']}")
