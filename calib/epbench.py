"""The expert-parallel benchmarks (docs/model.md §11): the MoE all-to-all of the calibration job,
and the routed experts' grouped GEMMs and MLA attention that one GPU can time (calibration job and
calib/gpu_check.py).

The all-to-all runs DeepEP's kernels where `deep_ep` imports on CUDA, else torch's
`all_to_all_single` (NCCL on CUDA, gloo on CPU), and every record names which. Routing is balanced:
uniform top-k under the model's group limit (n_group / topk_group), seeded per rank, as the model
assumes by default."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from costmodel import formulas as F
from costmodel.network import TORCH_A2A

if TYPE_CHECKING:
    from .timing import Timer

# tokens per rank per call
EP_TOKENS = {
    "cuda": (1, 8, 32, 128, 256, 1024, 4096),
    "cpu": (1, 8, 32, 128),
}
# MLA at DeepSeek-V3's shape: decode (tokens, context) absorbed; prefill one sequence of S tokens,
# not absorbed
MLA_DECODE = ((1, 4096), (16, 4096), (64, 4096), (128, 4096), (16, 16384), (64, 16384), (64, 1024))
MLA_PREFILL = (512, 1024, 2048, 4096)


def route(
    tokens: int, num_experts: int, top_k: int, n_group: int, topk_group: int, seed
) -> np.ndarray:
    """(tokens, top_k) expert ids: top_k distinct experts drawn uniformly inside topk_group of
    n_group groups."""
    rng = np.random.default_rng(seed)
    per = num_experts // n_group
    groups = np.argsort(rng.random((tokens, n_group)), axis=1)[:, :topk_group]
    allowed = np.zeros((tokens, num_experts), dtype=bool)
    for j in range(topk_group):
        idx = groups[:, j : j + 1] * per + np.arange(per)[None, :]
        np.put_along_axis(allowed, idx, True, axis=1)
    score = np.where(allowed, rng.random((tokens, num_experts)), -1.0)
    return np.argsort(-score, axis=1)[:, :top_k]


def _dest_counts(experts: np.ndarray, local: int, world: int) -> np.ndarray:
    """Tokens this rank sends to each rank: one copy per (token, destination rank), as DeepEP's
    normal kernels."""
    ranks = experts // local
    return np.array([int((ranks == r).any(axis=1).sum()) for r in range(world)], dtype=np.int64)


def _torch_a2a(timer: Timer, shape, tokens, device, rank, world, gpus_per_node, dispatch_dtype):
    """dispatch then combine as two all_to_all_single calls (counts exchanged beforehand,
    untimed)."""
    import torch
    import torch.distributed as dist

    local, node = shape.num_experts // world, rank // gpus_per_node
    tb_d = int(round(F.a2a_token_bytes(shape.hidden, dispatch_dtype)))
    tb_c = int(round(F.a2a_token_bytes(shape.hidden, "bf16")))
    for T in tokens:
        send = _dest_counts(
            route(T, shape.num_experts, shape.top_k, shape.n_group, shape.topk_group, (T, rank)),
            local,
            world,
        )
        # NCCL moves device tensors only
        recv = torch.empty(world, dtype=torch.int64, device=device)
        dist.all_to_all_single(recv, torch.from_numpy(send).to(device))
        s_l, r_l = send.tolist(), recv.tolist()
        for quantity, tb, out_n, in_n in (
            ("dispatch", tb_d, r_l, s_l),
            ("combine", tb_c, s_l, r_l),
        ):
            inp = torch.zeros(sum(in_n) * tb, dtype=torch.uint8, device=device)
            out = torch.empty(sum(out_n) * tb, dtype=torch.uint8, device=device)
            o_sp, i_sp = [c * tb for c in out_n], [c * tb for c in in_n]
            t = timer(
                lambda out=out, inp=inp, o=o_sp, i=i_sp: dist.all_to_all_single(out, inp, o, i)
            )
            yield {
                "kind": "ep_all2all",
                "impl": TORCH_A2A,
                "quantity": quantity,
                "ep": world,
                "gpus_per_node": gpus_per_node,
                "tokens_per_rank": int(T),
                "hidden": shape.hidden,
                "top_k": shape.top_k,
                "num_experts": shape.num_experts,
                "n_group": shape.n_group,
                "topk_group": shape.topk_group,
                "dispatch_dtype": dispatch_dtype if quantity == "dispatch" else "bf16",
                "send_bytes": sum(i_sp),
                "send_remote_bytes": sum(i_sp) - i_sp[rank],
                "send_offnode_bytes": sum(
                    b for r, b in enumerate(i_sp) if r // gpus_per_node != node
                ),
                **t.as_dict(),
            }


def _deepep(timer: Timer, shape, tokens, device, rank, world, gpus_per_node):
    """DeepEP's low-latency (fp8 dispatch, up to 256 tokens per rank) and normal (bf16) kernels, as
    vLLM 0.34 calls them. Anything DeepEP refuses is one skipped record."""
    import torch
    import torch.distributed as dist

    import deep_ep

    group = dist.group.WORLD
    dev = torch.device(device)
    base = {
        "kind": "ep_all2all",
        "ep": world,
        "gpus_per_node": gpus_per_node,
        "hidden": shape.hidden,
        "top_k": shape.top_k,
        "num_experts": shape.num_experts,
        "n_group": shape.n_group,
        "topk_group": shape.topk_group,
    }

    def inputs(T):
        idx = route(T, shape.num_experts, shape.top_k, shape.n_group, shape.topk_group, (T, rank))
        return (
            torch.randn(T, shape.hidden, device=dev, dtype=torch.bfloat16),
            torch.from_numpy(idx).to(dev),
            torch.ones(T, shape.top_k, device=dev, dtype=torch.float32),
        )

    # vLLM's max_num_batched_tokens per rank under DeepEP low-latency
    # (costmodel.vllm_tables.EpRules)
    cap = 256
    try:
        rdma = deep_ep.Buffer.get_low_latency_rdma_size_hint(
            cap, shape.hidden, world, shape.num_experts
        )
        buf = deep_ep.Buffer(
            group, 0, rdma, low_latency_mode=True, num_qps_per_rank=shape.num_experts // world
        )
        for T in (t for t in tokens if t <= cap):
            x, idx, w = inputs(T)
            recv, _cnt, handle, _ev, _hook = buf.low_latency_dispatch(
                x, idx, cap, shape.num_experts, use_fp8=True
            )
            y = torch.randn(recv[0].shape, device=dev, dtype=torch.bfloat16)
            for q, fn in (
                (
                    "dispatch",
                    lambda x=x, idx=idx: buf.low_latency_dispatch(
                        x, idx, cap, shape.num_experts, use_fp8=True
                    ),
                ),
                (
                    "combine",
                    lambda y=y, idx=idx, w=w, h=handle: buf.low_latency_combine(y, idx, w, h),
                ),
            ):
                yield {
                    **base,
                    "impl": "deepep_low_latency",
                    "quantity": q,
                    "tokens_per_rank": int(T),
                    "dispatch_dtype": "fp8" if q == "dispatch" else "bf16",
                    **timer(fn).as_dict(),
                }
        del buf
    except Exception as e:  # a DeepEP build or platform that refuses: say so, keep going
        yield {
            "kind": "skipped",
            "what": "deepep_low_latency",
            "why": f"{type(e).__name__}: {e}"[:200],
        }
    try:
        buf = deep_ep.Buffer(group, int(1e9), int(1e9) if world > gpus_per_node else 0)
        for T in tokens:
            x, idx, w = inputs(T)
            per_rank, per_rdma, in_rank, per_expert, _ev = buf.get_dispatch_layout(
                idx, shape.num_experts
            )
            kw = dict(
                topk_idx=idx,
                topk_weights=w,
                num_tokens_per_rank=per_rank,
                num_tokens_per_rdma_rank=per_rdma,
                is_token_in_rank=in_rank,
                num_tokens_per_expert=per_expert,
            )
            rx, _ri, rw, _n, handle, _ev = buf.dispatch(x, **kw)
            for q, fn in (
                ("dispatch", lambda x=x, kw=kw: buf.dispatch(x, **kw)),
                ("combine", lambda rx=rx, h=handle, rw=rw: buf.combine(rx, h, topk_weights=rw)),
            ):
                yield {
                    **base,
                    "impl": "deepep_high_throughput",
                    "quantity": q,
                    "tokens_per_rank": int(T),
                    "dispatch_dtype": "bf16",
                    **timer(fn).as_dict(),
                }
    except Exception as e:
        yield {
            "kind": "skipped",
            "what": "deepep_high_throughput",
            "why": f"{type(e).__name__}: {e}"[:200],
        }


def bench_ep_all2all(timer: Timer, shape, tokens, device, rank, world, gpus_per_node):
    """The dispatch and combine at the step's tokens per rank: DeepEP where it imports (CUDA), else
    torch's all_to_all_single with DeepEP normal kernels' layout (fp8 + scales out for an fp8
    checkpoint, bf16 back)."""

    if shape.num_experts % world:
        yield {
            "kind": "skipped",
            "what": "ep_all2all",
            "why": f"{shape.num_experts} experts over {world} ranks",
        }
        return
    if device.startswith("cuda"):
        try:
            import deep_ep  # noqa: F401
        except ImportError:
            pass
        else:
            yield from _deepep(timer, shape, tokens, device, rank, world, gpus_per_node)
            return
    dd = "fp8" if shape.weight_bytes == 1 and device.startswith("cuda") else "bf16"
    yield from _torch_a2a(timer, shape, tokens, device, rank, world, gpus_per_node, dd)


# ------------------------------------------------------------------ one GPU: the routed experts and
# MLA


def local_rows(shape, ep: int, tokens_per_rank: int, seed=0) -> np.ndarray:
    """Rows each of rank 0's E/EP experts receives when every one of the EP ranks routes
    tokens_per_rank tokens."""
    local = shape.num_experts // ep
    ex = route(
        tokens_per_rank * ep, shape.num_experts, shape.top_k, shape.n_group, shape.topk_group, seed
    )
    return np.bincount(ex[ex < local].ravel(), minlength=local)


def _grouped(x, w, rows, grouped: bool):
    """out[e] = x[e] @ w[e]^T over the experts' row blocks: torch._grouped_mm where it runs, else
    one matmul each."""
    import torch

    if grouped:
        offs = torch.tensor(np.cumsum(rows), dtype=torch.int32, device=x.device)
        return lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
    starts = np.concatenate([[0], np.cumsum(rows)])
    live = [(int(starts[e]), int(starts[e + 1]), e) for e in range(len(rows)) if rows[e]]

    def loop():
        for a, b, e in live:
            torch.matmul(x[a:b], w[e].t())

    return loop


def bench_grouped_experts(timer: Timer, shape, ep: int, tokens, device, dtype: str):
    """The routed experts of one EP rank (E/EP of them), gate_up then down, at each tokens per rank:
    the rows the balanced routing gives rank 0; records hold the rows per expert, the active count
    and the implementation."""
    import torch

    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    local = shape.num_experts // ep
    H, I = shape.hidden, shape.moe_intermediate
    w13 = torch.randn(local, 2 * I, H, device=device, dtype=dt) / H**0.5
    w2 = torch.randn(local, H, I, device=device, dtype=dt) / I**0.5
    grouped = device.startswith("cuda") and dt == torch.bfloat16 and hasattr(torch, "_grouped_mm")
    for T in tokens:
        rows = local_rows(shape, ep, T)
        n = int(rows.sum())
        if n == 0:
            continue
        x, h = (
            torch.randn(n, H, device=device, dtype=dt),
            torch.randn(n, I, device=device, dtype=dt),
        )
        impl = "torch._grouped_mm" if grouped else "torch.matmul per expert"
        try:
            up, down = _grouped(x, w13, rows, grouped), _grouped(h, w2, rows, grouped)
            up(), down()
        except (
            RuntimeError,
            TypeError,
        ) as e:  # a torch whose _grouped_mm refuses this GPU: one matmul each
            if not grouped:
                raise
            impl = f"torch.matmul per expert ({type(e).__name__} from torch._grouped_mm)"
            up, down = _grouped(x, w13, rows, False), _grouped(h, w2, rows, False)
        t = timer(lambda up=up, down=down: (up(), down()))
        yield {
            "kind": "grouped_experts",
            "model": shape.name,
            "ep": ep,
            "tokens_per_rank": int(T),
            "total_tokens": int(T * ep),
            "local_experts": local,
            "active_experts": int((rows > 0).sum()),
            "max_rows": int(rows.max()),
            "rows": int(n),
            "hidden": H,
            "moe_intermediate": I,
            "dtype": dtype,
            "impl": impl,
            **t.as_dict(),
        }


def bench_mla(timer: Timer, shape, device, decode=MLA_DECODE, prefill=MLA_PREFILL):
    """MLA's attention core as vLLM 0.34 runs it: decode absorbed (MQA of N heads over the latent
    cache, K of L+R, V its first L), prefill not absorbed (causal MHA, K of P+R, V of V): torch's
    SDPA where it takes the shapes, else matmul + softmax (named in the record)."""
    import torch

    sdpa = torch.nn.functional.scaled_dot_product_attention
    dt = torch.bfloat16 if device.startswith("cuda") else torch.float32
    N, L, R, P, V = (
        shape.num_heads,
        shape.kv_lora_rank,
        shape.qk_rope,
        shape.qk_nope,
        shape.v_head_dim,
    )
    for t, ctx in decode:
        q = torch.randn(t, N, 1, L + R, device=device, dtype=dt)
        kv = torch.randn(t, 1, ctx, L + R, device=device, dtype=dt)
        v = kv[..., :L]
        impl, fn = "sdpa", lambda q=q, kv=kv, v=v: sdpa(q, kv, v, enable_gqa=True)
        try:
            fn()
        except (RuntimeError, TypeError):
            impl = "matmul+softmax"
            fn = lambda q=q, kv=kv, v=v: torch.softmax(q @ kv.transpose(-2, -1), -1) @ v  # noqa: E731
        yield {
            "kind": "mla_attention",
            "phase": "decode",
            "tokens": t,
            "context_len": ctx,
            "heads": N,
            "impl": impl,
            **timer(fn).as_dict(),
        }
        del q, kv, v
    for S in prefill:
        q = torch.randn(1, N, S, P + R, device=device, dtype=dt)
        k = torch.randn(1, N, S, P + R, device=device, dtype=dt)
        v = torch.randn(1, N, S, V, device=device, dtype=dt)
        try:
            t_ = timer(lambda q=q, k=k, v=v: sdpa(q, k, v, is_causal=True))
        except RuntimeError as e:  # out of memory on a GPU whose SDPA falls back to the math kernel
            yield {
                "kind": "mla_error",
                "phase": "prefill",
                "tokens": S,
                "error": str(e).splitlines()[0][:200],
            }
            continue
        yield {
            "kind": "mla_attention",
            "phase": "prefill",
            "tokens": S,
            "context_len": S,
            "heads": N,
            "impl": "sdpa",
            **t_.as_dict(),
        }
        del q, k, v


def holdout(records, prof, shape) -> dict:
    """The EP records against the model, never fitted: ln(pred/meas) per group ("experts EP e", "mla
    decode", "mla prefill"), the experts priced as bf16 weights (what was timed), the MLA core at
    the record's phase."""
    import dataclasses

    from costmodel import moe as M
    from costmodel.ops import Hw

    from .fit import log_error_summary

    hw = Hw(prof, "bf16")
    bf16 = dataclasses.replace(shape, weight_bytes=2.0)
    errs: dict[str, list[float]] = {}
    for r in records:
        if r["kind"] == "grouped_experts" and r.get("model") == shape.name:
            pred = float(
                np.asarray(M.t_experts_s(hw, bf16, np.array([r["total_tokens"]]), r["ep"])[0])[0]
            )
            errs.setdefault(f"experts EP {r['ep']}", []).append(np.log(pred / r["median_s"]))
        elif r["kind"] == "mla_attention":
            ph = M.Phase(
                decode=r["phase"] == "decode",
                context_len=r["context_len"],
                seq_len=r["context_len"],
            )
            pred = float(np.asarray(M.t_mla_core_s(hw, shape, np.array([r["tokens"]]), ph))[0])
            errs.setdefault(f"mla {r['phase']}", []).append(np.log(pred / r["median_s"]))
    return {k: log_error_summary(np.array(v)) for k, v in errs.items()}


def network_from_run(base, records, gpu: str, nvlink_bw_bytes_per_s: float, source: str):
    """(the network `base` with the run's all-to-all calls as [[measured]] and, from torch's calls,
    the transport terms they measure, notes): across nodes t = rdma_latency + off-node bytes /
    (NICs·rate·rdma_efficiency), inside one node t = c + remote bytes / (NVLink·nvl_efficiency),
    least squares over the tokens (§11.5). A fit outside a term's plausible range keeps the prior,
    and says so."""
    import dataclasses

    from costmodel.network import FIELDS, MeasuredA2A

    a2a = [r for r in records if r["kind"] == "ep_all2all"]
    pts = tuple(
        MeasuredA2A(
            backend=r["impl"],
            quantity=r["quantity"],
            gpu=gpu,
            ep=r["ep"],
            gpus_per_node=min(r["gpus_per_node"], r["ep"]),
            tokens_per_rank=r["tokens_per_rank"],
            hidden=r["hidden"],
            top_k=r["top_k"],
            num_experts=r["num_experts"],
            n_group=r["n_group"],
            topk_group=r["topk_group"],
            dispatch_dtype=r["dispatch_dtype"],
            t_s=float(f"{max(r['median_s'], 1e-7):.6g}"),
            source=f"{source} ({r['impl']})",
        )
        for r in a2a
    )
    keys = {(p.backend, p.quantity, p.ep, p.tokens_per_rank) for p in pts}
    kept = tuple(
        m for m in base.measured if (m.backend, m.quantity, m.ep, m.tokens_per_rank) not in keys
    )
    net = dataclasses.replace(base, measured=kept + pts)
    torch_rows = [r for r in a2a if r["impl"] == TORCH_A2A]
    if not torch_rows:
        return net, []
    across = torch_rows[0]["ep"] > torch_rows[0]["gpus_per_node"]
    col = "send_offnode_bytes" if across else "send_remote_bytes"
    rate = base.line_rate_per_gpu_bytes_per_s if across else nvlink_bw_bytes_per_s
    x = np.array([r[col] / rate for r in torch_rows], dtype=float)
    t = np.array([r["median_s"] for r in torch_rows], dtype=float)
    if np.ptp(x) <= 0:
        return net, ["transport terms kept: the run's calls all moved the same bytes"]
    (slope, icpt), *_ = np.linalg.lstsq(np.stack([x, np.ones_like(x)], 1), t, rcond=None)
    resid = t - (slope * x + icpt)
    sig = float(np.sqrt(np.mean((resid / t) ** 2)))
    ranges = {k: (lo, hi) for k, lo, hi, _ in FIELDS}
    fit = (
        {"rdma_efficiency": 1 / slope if slope > 0 else -1.0, "rdma_latency_s": icpt}
        if across
        else {"nvl_efficiency": 1 / slope if slope > 0 else -1.0}
    )
    notes, vals = [], {}
    for key, v in fit.items():
        lo, hi = ranges[key]
        if lo <= v <= hi:
            vals[key] = float(f"{v:.6g}")
        else:
            notes.append(
                f"{key} kept at the prior: the fit gives {v:.3g}, outside [{lo:g}, {hi:g}]"
            )
    if vals:
        what = "off-node bytes over the NICs" if across else "remote bytes over NVLink"
        src = f"{source}: {TORCH_A2A} over {len(torch_rows)} calls, {what} (least squares)"
        net = dataclasses.replace(
            net,
            **vals,
            sources={**net.sources, **{k: src for k in vals}},
            tiers={**net.tiers, **{k: "calibrated" for k in vals}},
            sigmas={**net.sigmas, **{k: max(sig, 1e-3) for k in vals}},
        )
    return net, notes
