"""`tpcost validate`: run one layer of a model in the three schedules on this machine, at a sweep of
N, and compare with the model's prediction. Writes `tpcost evaluate`'s model-level CSV (scope
layer).

Schedules (per rank, TP = world size):
  tp          norm → QKV → attention → O → all_reduce → norm → gate_up → SiluMul → down → all_reduce
  sp          norm(N/W) → all_gather → QKV → attention → O → reduce_scatter → norm(N/W) → all_gather
  → gate_up
              → SiluMul → down → reduce_scatter
  sp_asynctp  as sp with AG+QKV, AG+gate_up fused and O+RS, down+RS fused: torch.ops.symm_mem on
  CUDA,
              calib.distbench's reference implementation of the same algorithms on CPU.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from costmodel.errors import TpcostError

DEFAULT_TOKENS = {
    "cuda": [256, 512, 1024, 2048, 4096, 8192, 16384],
    "cpu": [64, 128, 256, 512, 1024, 2048],
}


def _layer_fns(shape, world, rank, dev, seq_len, ops):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as Fn

    from .distbench import all_gather_flat, reduce_scatter_flat

    from costmodel.layer import LayerSpec

    dt = torch.bfloat16 if dev.startswith("cuda") else torch.float32
    # the one per-rank description (dense: run() refuses MoE)
    spec = LayerSpec.build(shape, world, "bf16")
    H, d = spec.hidden, spec.head_dim
    h, kv = spec.heads_per_rank, spec.kv_heads_per_rank
    I = spec.intermediate_per_rank
    g = torch.Generator(device="cpu").manual_seed(rank)
    w = lambda *s: (torch.randn(*s, generator=g) * 0.02).to(device=dev, dtype=dt)  # noqa: E731
    Wqkv, Wo, Wgu, Wd = w(H, (h + 2 * kv) * d), w(h * d, H), w(H, 2 * I), w(I, H)
    norm_w = torch.ones(H, device=dev, dtype=dt)

    def norm(x):
        return Fn.rms_norm(x, (H,), norm_w, 1e-6)

    def attention(qkv):
        n = qkv.shape[0]
        L = min(seq_len, n)
        s = n // L
        q, k, v = qkv[: s * L].split([h * d, kv * d, kv * d], dim=1)
        q = q.view(s, L, h, d).transpose(1, 2)
        k = k.view(s, L, kv, d).transpose(1, 2)
        v = v.view(s, L, kv, d).transpose(1, 2)
        o = Fn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        out = torch.zeros(n, h * d, device=dev, dtype=dt)
        out[: s * L] = o.transpose(1, 2).reshape(s * L, h * d)
        return out

    def silu_mul(x):
        a, b = x.chunk(2, dim=1)
        return Fn.silu(a) * b

    def tp_layer(x):
        y = attention(norm(x) @ Wqkv) @ Wo
        dist.all_reduce(y)
        y = silu_mul(norm(y) @ Wgu) @ Wd
        dist.all_reduce(y)
        return y

    def sp_layer(xs, full):
        all_gather_flat(full, norm(xs))
        y = attention(full @ Wqkv) @ Wo
        ys = torch.empty_like(xs)
        reduce_scatter_flat(ys, y)
        all_gather_flat(full, norm(ys))
        y = silu_mul(full @ Wgu) @ Wd
        reduce_scatter_flat(ys, y)
        return ys

    def spa_layer(xs, full):
        _, qkv = ops.ag_gemm(norm(xs), Wqkv, full)
        ys = ops.gemm_rs(attention(qkv), Wo)
        _, gu = ops.ag_gemm(norm(ys), Wgu, full)
        return ops.gemm_rs(silu_mul(gu), Wd)

    return tp_layer, sp_layer, spa_layer, dt


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    from costmodel.model import Regime, predict
    from costmodel.profile import load_profile
    from costmodel.shapes import load_model

    from . import launch
    from .distbench import AsyncTPOps
    from .timing import Timer

    rank, world, dev = launch.init(args.device)
    shape = load_model(args.model)
    shape.check_tp(world)
    prof = load_profile(args.gpu)
    ops = AsyncTPOps(dev, rank, world)
    tp_layer, sp_layer, spa_layer, dt = _layer_fns(shape, world, rank, dev, args.seq_len, ops)
    timer = Timer(dev, warmup_s=0.005, rep_s=0.05, min_reps=5, max_reps=30, group=dist.group.WORLD)
    dtype = "bf16" if dev.startswith("cuda") else "fp32"
    tokens = args.tokens or DEFAULT_TOKENS[args.device]
    rows = []
    for n in tokens:
        n_pad = -(-n // world) * world
        x = torch.randn(n, shape.hidden, device=dev, dtype=dt)
        xs = torch.randn(n_pad // world, shape.hidden, device=dev, dtype=dt)
        full = torch.empty(n_pad, shape.hidden, device=dev, dtype=dt)
        t = {
            "tp": timer(lambda: tp_layer(x)),
            "sp": timer(lambda: sp_layer(xs, full)),
            "sp_asynctp": timer(lambda: spa_layer(xs, full)),
        }
        pred = predict(
            prof, shape, world, dtype, np.array([float(n)]), Regime(seq_len=args.seq_len)
        )
        p = {s: float(np.asarray(pred.schedules[s].t_layer_s).ravel()[0]) for s in t}
        rows.append(
            {
                "num_tokens": n,
                **{f"t_{s}_s": v.median_s for s, v in t.items()},
                **{f"pred_{s}_s": v for s, v in p.items()},
                "spread": {s: [v.p10_s, v.p90_s] for s, v in t.items()},
            }
        )
    if rank != 0:
        return
    from .gpu_check import provenance

    prov = provenance()
    out = Path(args.out)
    from costmodel.evaluate import model_csv_header

    lines = [model_csv_header()]
    beside = lambda x: os.path.relpath(x, out.parent) if Path(x).exists() else x  # noqa: E731 (evaluate: _beside)
    gpu, model = beside(args.gpu), beside(args.model)
    for r in rows:
        lines.append(
            f"{gpu},{world},{model},{dtype},{r['num_tokens']},{r['t_tp_s'] * 1e6:.3f},"
            f"{r['t_sp_asynctp_s'] * 1e6:.3f},layer,tpcost validate {ops.kind} {prov['host']} "
            f"{prov['date']}"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    from costmodel.io import atomic_write_text

    atomic_write_text(out, "\n".join(lines) + "\n")
    atomic_write_text(
        out.with_suffix(".json"),
        json.dumps({"provenance": prov, "world": world, "rows": rows}, indent=2),
    )
    print(
        f"tpcost validate: {shape.name} layer, tp={world}, {dtype}, AsyncTP ops: {ops.kind}, "
        f"profile {args.gpu}"
    )
    print(
        f"{'N':>6} {'tp [us]':>9} {'sp [us]':>9} {'sp+async [us]':>14} {'sp meas/pred':>14} "
        f"{'sp+async meas/pred':>20}"
    )
    for r in rows:
        sm, sp = r["t_tp_s"] / r["t_sp_s"], r["pred_tp_s"] / r["pred_sp_s"]
        am, ap = r["t_tp_s"] / r["t_sp_asynctp_s"], r["pred_tp_s"] / r["pred_sp_asynctp_s"]
        print(
            f"{r['num_tokens']:6d} {r['t_tp_s'] * 1e6:9.1f} {r['t_sp_s'] * 1e6:9.1f} "
            f"{r['t_sp_asynctp_s'] * 1e6:14.1f} "
            f"{sm:6.3f}/{sp:6.3f} {am:10.3f}/{ap:6.3f}"
        )
    from costmodel.analysis import decide_cutoff

    grid = np.array([r["num_tokens"] for r in rows], float)
    w = np.full(grid.size, 1.0 / grid.size)  # the sweep's points equally weighted

    def cut(off, on):
        return decide_cutoff(
            grid, np.array([r[off] for r in rows]), np.array([r[on] for r in rows]), args.margin, w
        )

    print(
        f"cutoff decision over this sweep (risk premium {args.margin:.0%}): measured "
        f"{cut('t_tp_s', 't_sp_asynctp_s')}, predicted {cut('pred_tp_s', 'pred_sp_asynctp_s')}"
    )
    print(f"wrote {out} (evaluate's model-level schema) and {out.with_suffix('.json')}")


def run(args) -> int:
    """Check every argument and path before a worker starts (errors name validate's own flags)."""
    from costmodel.io import check_output_path
    from costmodel.profile import load_profile
    from costmodel.shapes import load_model

    from . import launch

    launch.require_launcher(args.device, "validate")
    launch.check_environment()
    load_profile(args.gpu)
    shape = load_model(args.model)
    # the layer timed here is a dense MLP; timing router + grouped experts is not built
    if shape.is_moe:
        raise TpcostError(
            f"validate --model {args.model}: {shape.name} is MoE ({shape.num_experts} experts, top-"
            f"{shape.experts_per_token}); validate times a dense layer only (its router and "
            "grouped "
            "experts are not timed), so it would measure the wrong layer"
        )
    if args.device == "cpu" and not launch.under_torchrun():
        if not 1 <= args.nproc <= max(1, os.cpu_count() or 1) * 4:
            raise TpcostError(
                f"validate --nproc must be in [1, {max(1, os.cpu_count() or 1) * 4}], got "
                f"{args.nproc}"
            )
        shape.check_tp(args.nproc)
    if args.tokens and any(not 1 <= t <= 2**20 for t in args.tokens):
        raise TpcostError("validate --tokens: token counts must be in [1, 1048576]")
    if not 1 <= args.seq_len <= 2**24:
        raise TpcostError(f"validate --seq-len must be in [1, 16777216], got {args.seq_len}")
    if not (0 <= args.margin < 1):
        raise TpcostError(f"validate --margin must be in [0, 1), got {args.margin}")
    out = Path(args.out)
    if out.suffix != ".csv":
        raise TpcostError(
            f"validate --out {out}: the timings are a .csv (its JSON side file is {out.stem}.json)"
        )
    check_output_path(out, args.force, "validate --out", protect=(args.gpu, args.model))
    check_output_path(
        out.with_suffix(".json"),
        args.force,
        "validate --out's JSON side file",
        protect=(args.gpu, args.model),
    )
    launch.run(worker, args, args.device, args.nproc, "validate", wall_timeout_s=1800)
    return 0
