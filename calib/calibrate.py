"""`tpcost calibrate`: microbenchmarks on every rank → least-squares fits → a profile in the
built-in schema.

The same code runs on CUDA (NCCL, torch symm_mem fused ops) and CPU (gloo, reference AsyncTP ops);
only the dtype set, sizes and backend-specific ops differ (see PLANS below)."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from costmodel.errors import TpcostError
from costmodel.formulas import KiB

PLANS = {  # what each backend measures; sizes from the models' per-rank shapes
    "cuda": dict(
        gemm_rows=[1, 16, 128, 512, 2048, 8192, 32768],
        chunk_rows=[2048, 8192],
        mem=[4**i * KiB for i in range(10)],
        coll=[4**i * KiB for i in range(10)],
        fused_ms=[1024, 4096, 16384],
        warmup_s=0.01,
        rep_s=0.04,
    ),
    "cpu": dict(
        gemm_rows=[1, 16, 64, 256, 1024, 2048],
        chunk_rows=[512, 2048],
        mem=[4**i * 4 * KiB for i in range(6)],
        coll=[4**i * KiB for i in range(9)],
        fused_ms=[256, 1024, 2048],
        warmup_s=0.005,
        rep_s=0.05,
    ),
}
# built-in (costmodel/models/cpu-tiny.json): the CPU calibration fixture, hidden 512
CPU_MODEL = "cpu-tiny"
# the CPU EP loop's MoE (MLA) fixture
CPU_EP_MODEL = str(Path(__file__).with_name("cpu-tiny-moe.json"))


# the EP phases' model where --models names no MoE one
EP_MODEL = {
    "cuda": "deepseek-v3",
    "cpu": CPU_EP_MODEL,
}


def split_models(models, device: str):
    """(the models the TP phases read, the MoE shape the EP phases run at): a model only the EP step
    reads (MLA, DeepSeek-style) sizes the EP phases alone; with no MoE model among `models`, the
    device's EP_MODEL; with no model the TP path reads, the device's default ones."""
    from costmodel.errors import TpcostError
    from costmodel.moe import load_moe_model
    from costmodel.shapes import load_model

    tp, ep = [], None
    for m in models:
        try:
            shape = load_moe_model(m)
        except TpcostError:
            shape = None
        ep = ep or shape
        try:
            load_model(m)
        except TpcostError:
            if shape is None:
                raise
            continue
        tp.append(m)
    if not tp:  # only EP models named: the TP phases at the device's default
        from costmodel.shapes import builtin_model_names

        tp = [CPU_MODEL] if device == "cpu" else builtin_model_names()
    return tp, ep or load_moe_model(EP_MODEL[device])


def rank_shapes(model_names, world):
    """Per-rank GEMM shapes (name, n, k) and AsyncTP op shapes (name, op, n, k) of the models at
    TP=world, from the one per-rank layer description (costmodel.layer.LayerSpec; an MoE layer: one
    expert's GEMMs, unfused)."""
    from costmodel.layer import LayerSpec
    from costmodel.shapes import load_model

    gemms, fused = {}, {}
    for name in model_names:
        spec = LayerSpec.build(load_model(name), world, "bf16")
        tag = Path(name).stem
        for slot, n, k, fuses in spec.rank_gemms():
            gemms.setdefault((n, k), (f"{tag}_{slot}", n, k))
            if fuses:
                fused.setdefault((fuses, n, k), (f"{tag}_{slot}", fuses, n, k))
    return list(gemms.values()), list(fused.values())


def cpu_prior(host: str) -> dict:
    """Prior for a CPU host whose ranks (one thread each) talk through shared memory; every value
    assumed."""
    a = "assumed prior for a CPU host (one thread per rank); replaced where calibration measures it"
    sec = lambda **v: {**v, "source": a, "tier": "assumed"}  # noqa: E731
    return {
        "schema_version": 1,
        "identity": {
            "name": f"cpu-{host}",
            "display_name": f"CPU host {host} (one thread per rank)",
            "vendor": "cpu",
            "compute_capability": "0.0",
            "device_name_patterns": "",
            **sec(sm_count=1),
        },
        "compute": {"peak_flops_per_s": sec(bf16=1.6e11, fp8=1.6e11, fp32=1.6e11)},
        "memory": sec(hbm_bw_bytes_per_s=5e10),
        "kernels": sec(mem_efficiency=0.5, launch_overhead_s=5e-6),
        "gemm": sec(
            tile_m=8, tile_n=8, max_efficiency=0.5, mem_efficiency=0.5, launch_overhead_s=5e-6
        ),
        "attention": sec(efficiency=0.3),
        "interconnect": {
            "kind": "host",
            **sec(link_bw_bytes_per_s=5e9, latency_s=2e-5, domain_size=64),
        },
        "collectives": {
            c: {"tp2": sec(latency_s=5e-5, bus_bw_bytes_per_s=2e9)}
            for c in ("nccl_all_gather", "nccl_reduce_scatter", "nccl_all_reduce")
        },
        "asynctp": sec(
            barrier_s=5e-5,
            copy_engine_bw_bytes_per_s=2e9,
            copy_latency_s=5e-5,
            compute_slowdown=0.1,
            stream_concurrency=0.0,
        ),
    }


def prior_profile(device: str, device_name: str):
    """The profile calibration starts from: the CPU prior, or the built-in profile matching the
    GPU."""
    if device == "cpu":
        from costmodel.profile import profile_from_dict

        return profile_from_dict(cpu_prior(platform.node() or "host"), "cpu prior")
    from .gpu_check import prior_for

    return prior_for(device_name)


def build_profile(records, prior, prov: dict, world: int, gemm_dtype: str, name: str):
    """Fit everything the records constrain into a new profile made from the prior
    (HardwareProfile.with_values, as --set and the band do; each fitted value gets tier calibrated
    and its own σ); returns (profile, not_measured, residuals)."""
    from costmodel.ops import NCCL_REGIMES
    from costmodel.profile import REQUIRED_PARAMS, Provenance

    from .fit import fit_collective, fit_latency_bandwidth, fit_single_device

    src = (
        f"calibrated by tpcost calibrate on {prov['host']} ({prov['device_name']}, world size "
        f"{world}, "
        f"torch {prov['torch']}, {prov['date']})"
    )
    values: dict[str, float] = {}
    provs: dict[str, Provenance] = {}

    def put(key, value, unc_rel, source):
        values[key] = float(value)
        provs[key] = Provenance(source, "calibrated", float(min(max(unc_rel, 1e-4), 1.0)))

    params, residuals = fit_single_device(records, prior.values(), gemm_dtype)
    for key, v in params.items():
        put(key, v["value"], v["uncertainty_rel"], src)
    # vLLM's own implementations (calib.distbench: its custom AR, symm-mem, custom reduce-scatters
    # and all-gathers): the records that name their collective; NCCL's name it by their impl
    vllm_impls = sorted({r["impl"] for r in records if r["kind"] == "collective" and r.get("op")})
    replaced: list[str] = []
    measured: dict = {}
    for impl, name_ in (
        ("all_gather", "nccl_all_gather"),
        ("reduce_scatter", "nccl_reduce_scatter"),
        ("all_reduce", "nccl_all_reduce"),
        *((i, i) for i in vllm_impls),
    ):
        fits, res = fit_collective(records, impl, world)
        if len(fits) == 2:
            for field, f in fits.items():
                put(
                    f"collectives.{name_}.tp{world}.{field}",
                    f["value"],
                    f["uncertainty_rel"],
                    src + f" ({prov.get('backend')} {impl})",
                )
            residuals[f"collective_{impl}"] = res
            # the run's one curve is this machine's collective at this TP: the prior's NCCL regime
            # curves beside it (another machine's, ops.NCCL_REGIMES) would undercut it at the sizes
            # they win
            replaced += [
                f"collectives.{name_}{r}.tp{world}"
                for r in NCCL_REGIMES
                if world in prior.collective_tps(name_ + r)
            ]
            curve = measured_points(
                records, impl, name_, world, src + f" ({prov.get('backend')} {impl}), medians"
            )
            if (
                curve is not None
                # NCCL's points, interpolated between the sizes the run timed
                # (ops.measured_or_fitted)
            ):
                measured[name_] = {world: curve}
    # vLLM's fused GEMM+RS/AR kernel (gemm_rs_ar), where the run timed it against its unfused arm:
    # its terms
    from .kernel_fit import fit_records as fit_kernel

    kparams, kres = fit_kernel(prior, records)
    for key, v in kparams.items():
        put(
            key,
            v["value"],
            v["uncertainty_rel"],
            src + " (vLLM gemm_rs_ar against its unfused arm)",
        )
    if kres:
        residuals["fused_kernel"] = kres
    p2p = [r for r in records if r["kind"] == "p2p"]
    p2p_fits, res = fit_latency_bandwidth(
        p2p, 1.0, ("asynctp.copy_latency_s", "asynctp.copy_engine_bw_bytes_per_s")
    )
    if res:
        for key, v in p2p_fits.items():
            put(key, v["value"], v["uncertainty_rel"], src + " (one p2p pull, ring step 1)")
        residuals["p2p"] = res
    # the per-barrier GPU cost: torch's symmetric-memory barrier replayed from a CUDA graph where it
    # was measured (no host time in it), else dist.barrier (a host-coordinated upper bound: the CPU
    # runs)
    graph = [r for r in records if r["kind"] == "symm_barrier" and r.get("mode") == "graph"]
    bar = graph or [r for r in records if r["kind"] == "barrier"]
    if bar:
        b = bar[0]
        put(
            "asynctp.barrier_s",
            b["median_s"],
            (b["p90_s"] - b["p10_s"]) / 2 / max(b["median_s"], 1e-12),
            src
            + (" (symmetric-memory barrier, CUDA-graph replay)" if graph else " (dist.barrier)"),
        )
    not_measured = sorted(
        k
        for k in REQUIRED_PARAMS
        if k not in values and not k.startswith(("identity.", "interconnect."))
    )
    # collectives of the prior this run did not measure (vLLM's custom AR, symm-mem, FlashInfer,
    # other TP sizes)
    not_measured += sorted(
        f"collectives.{impl}.tp{tp}"
        for impl, per_tp in prior.collectives.items()
        for tp in per_tp
        if f"collectives.{impl}.tp{tp}.bus_bw_bytes_per_s" not in values
        and f"collectives.{impl}.tp{tp}" not in replaced
    )
    notes = {
        **{f"calibration.{k}": str(v) for k, v in prov.items()},
        "calibration.not_measured_kept_prior": ", ".join(not_measured) or "none",
        "calibration.residuals_json": json.dumps(residuals, separators=(",", ":"))[:4000],
    }
    if replaced:
        notes["calibration.regimes_replaced"] = ", ".join(replaced)
    prof = prior.with_values(
        values,
        provs,
        mark_modified=False,
        new_keys_ok=True,
        name=name,
        notes=notes,
        drop=tuple(replaced),
        measured=measured,
    )
    return prof, not_measured, residuals


def measured_points(records, impl: str, name: str, world: int, source: str):
    """The run's median time per size of one NCCL collective as a costmodel.profile.MeasuredCurve
    (None: not an NCCL collective, or fewer than three sizes)."""
    from costmodel.profile import MEASURED_IMPLS, MeasuredCurve

    if name not in MEASURED_IMPLS:
        return None
    curve = MeasuredCurve.from_points(
        (
            (r["msg_bytes"], r["median_s"])
            for r in records
            if r["kind"] == "collective"
            and r["impl"] == impl
            and r["world"] == world
            and not r.get("op")
            and r["msg_bytes"] > 0
            and r["median_s"] > 0
        ),
        source,
    )
    return curve if len(curve.msg_bytes) >= 3 else None


def side_paths(out: Path):
    """The raw samples, the fused-vs-sequential ops CSV and the network with the run's all-to-all
    calls."""
    return (
        out.with_suffix(".samples.jsonl"),
        out.with_suffix(".ops.csv"),
        out.with_suffix(".network.toml"),
    )


def partial_path(samples: Path) -> Path:
    return samples.with_name(samples.name + ".partial")


def worker(args) -> None:  # noqa: C901 (the phases in their order, each budgeted: one reading of the run)
    """Runs on every rank (under torchrun or spawned)."""
    import torch
    import torch.distributed as dist

    from . import launch
    from .distbench import (
        AsyncTPOps,
        bench_barrier,
        bench_collectives,
        bench_comm_interference,
        bench_fused_ops,
        bench_p2p,
        bench_vllm_all_reduce,
        bench_vllm_gemm_rs_ar,
        kernel_ms,
    )
    from .epbench import EP_TOKENS, bench_ep_all2all, bench_grouped_experts
    from .gpu_check import provenance
    from .microbench import (
        bench_chunked,
        bench_gemms,
        bench_interference,
        bench_memory,
        gemm_dtypes,
    )
    from .timing import Timer

    rank, world, dev = launch.init(args.device)
    t0 = time.perf_counter()
    plan = PLANS[args.device]
    models = args.models or ([CPU_MODEL] if args.device == "cpu" else None)
    if models is None:
        from costmodel.shapes import builtin_model_names

        models = builtin_model_names()
    models, ep = split_models(models, args.device)
    shapes, fused_shapes = rank_shapes(models, world)
    dtypes = gemm_dtypes(dev)
    local = Timer(dev, warmup_s=plan["warmup_s"], rep_s=plan["rep_s"], min_reps=5, max_reps=50)
    coll = Timer(
        dev,
        warmup_s=plan["warmup_s"],
        rep_s=plan["rep_s"],
        min_reps=11,
        max_reps=50,
        group=dist.group.WORLD,
    )
    ops = AsyncTPOps(dev, rank, world) if world > 1 else None
    out = Path(args.out)
    samples_path, ops_path, net_path = side_paths(out)
    # torchrun's ranks per node; spawned: all
    gpn = int(os.environ.get("LOCAL_WORLD_SIZE", world) or world)
    phases = [
        ("gemm", lambda: bench_gemms(local, shapes, plan["gemm_rows"], dev, dtypes)),
        ("memory", lambda: bench_memory(local, plan["mem"], dev, hidden=shapes[0][2])),
        (
            "chunked",
            lambda: bench_chunked(local, shapes, plan["chunk_rows"], [world], dev, dtypes[0]),
        ),
        (
            "interference",
            lambda: bench_interference(local, shapes[:2], plan["chunk_rows"][-1], dev, dtypes[0]),
        ),
    ]
    if world > 1:  # a single rank has nothing to communicate with
        phases += [
            (
                "comm_interference",
                lambda: bench_comm_interference(
                    coll, shapes[:2], plan["chunk_rows"][-1], dev, rank, world, dtypes[0]
                ),
            ),
            ("collectives", lambda: bench_collectives(coll, plan["coll"], dev, world)),
            ("vllm_all_reduce", lambda: bench_vllm_all_reduce(coll, plan["coll"], dev, world)),
            (
                "vllm_gemm_rs_ar",
                lambda: bench_vllm_gemm_rs_ar(coll, kernel_ms(world), dev, rank, world),
            ),
            ("p2p", lambda: bench_p2p(coll, plan["coll"], dev, rank, world)),
            ("barrier", lambda: bench_barrier(coll, dev)),
            (
                "fused_ops",
                lambda: bench_fused_ops(
                    coll, ops, fused_shapes, plan["fused_ms"], dev, rank, world, dtypes[0]
                ),
            ),
        ]
        # the EP step at EP = world: one rank's routed experts, then the dispatch and combine
        phases += [
            (
                "ep_experts",
                lambda: bench_grouped_experts(
                    local,
                    ep,
                    world,
                    EP_TOKENS[args.device],
                    dev,
                    "bf16" if args.device == "cuda" else "fp32",
                ),
            ),
            (
                "ep_all2all",
                lambda: bench_ep_all2all(coll, ep, EP_TOKENS[args.device], dev, rank, world, gpn),
            ),
        ]
    records, skipped = [], []
    bar = None
    partial = partial_path(samples_path)
    if rank == 0:
        samples_path.parent.mkdir(parents=True, exist_ok=True)
        # streamed as taken; renamed to samples_path when the run ends or is interrupted
        fh = open(partial, "w")
        try:
            from tqdm import tqdm

            bar = tqdm(total=len(phases), desc="tpcost calibrate", unit="phase")
        except ImportError:
            bar = None
    flag = torch.zeros(1, device=dev)
    hang = os.environ.get("TPCOST_CALIB_TEST_HANG_RANK")  # test hook: this rank stops answering
    try:
        for name, gen in phases:
            if hang is not None and int(hang) == rank and name == "collectives":
                time.sleep(3600)
            flag.fill_(1.0 if time.perf_counter() - t0 < args.budget_s else 0.0)
            dist.broadcast(flag, 0)  # every rank takes the same decision
            if flag.item() == 0:
                skipped.append(name)
            else:
                for rec in gen():
                    rec.pop("samples_s", None)
                    if rank == 0:
                        records.append(rec)
                        fh.write(json.dumps(rec) + "\n")
                        fh.flush()
            if bar is not None:
                bar.set_postfix_str(name)
                bar.update(1)
    finally:
        if rank == 0:
            fh.close()
            os.replace(partial, samples_path)  # whole: every line a record, also after Ctrl-C
            if bar is not None:
                bar.close()
    dist.barrier()
    if rank != 0:
        return
    prov = {
        **provenance(),
        "world_size": world,
        "backend": "nccl" if args.device == "cuda" else "gloo",
        "budget_s": args.budget_s,
        "wall_s": round(time.perf_counter() - t0, 1),
        "skipped_phases": ",".join(skipped) or "none",
        "models": ",".join(Path(m).stem for m in models),
    }
    if args.device == "cpu":
        prov["device_name"] = f"{platform.processor() or platform.machine()} (1 thread per rank)"
    prior = prior_profile(args.device, prov.get("device_name", ""))
    name = args.name or f"calibrated-{prov['host']}-{args.device}-w{world}"
    prof, not_measured, residuals = build_profile(records, prior, prov, world, dtypes[0], name)
    from costmodel.io import atomic_write_text
    from costmodel.profile import dump_profile, profile_from_dict, profile_to_tree

    tree = profile_to_tree(prof)
    profile_from_dict(tree, str(out))  # what is written loads back
    atomic_write_text(
        out,
        "# Written by tpcost calibrate; raw samples: "
        + samples_path.name
        + "\n"
        + dump_profile(tree),
    )
    from costmodel.evaluate import op_csv_header

    rows = [op_csv_header()]
    for r in records:
        if r["kind"] == "fused_op":
            rows.append(
                f"{os.path.relpath(out, ops_path.parent)},{world},{r['op']},{r['dtype']},"
                f"{r['m']},{r['n']},{r['k']},"
                f"{r['baseline_s'] * 1e6:.3f},{r['overlap_s'] * 1e6:.3f},"
                f"tpcost calibrate {r['impl']} {prov['host']} {prov['date']},torch"
            )
    atomic_write_text(ops_path, "\n".join(rows) + "\n")
    net_lines = ep_holdout_lines(records, prior, ep) + write_ep_network(
        args,
        records,
        prior,
        prof,
        net_path,
        src=f"tpcost calibrate on {prov['host']} "
        f"({prov.get('device_name', '')}, {prov['backend']}, {prov['date']})",
    )
    print(
        f"tpcost calibrate: {len(records)} records in {prov['wall_s']} s on {world} rank(s) "
        f"({prov['backend']})"
    )
    print(f"  profile: {out}\n  raw samples: {samples_path}\n  fused-vs-sequential ops: {ops_path}")
    for line in net_lines:
        print(f"  {line}")
    for k, value in sorted(prof.values().items()):
        p = prof.provenance[k]
        if p.tier == "calibrated":
            print(f"  {k:46s} {value:12.4g}  (±{100 * (p.uncertainty_rel or 0):.1f}%)")
    print(f"  kept prior (not measured): {', '.join(not_measured) or 'none'}")
    if skipped:
        print(f"  skipped for the budget: {', '.join(skipped)}")


def ep_holdout_lines(records, prior, ep) -> list[str]:
    """The run's EP expert GEMMs held out against the prior profile's model, one line per group
    (calib.epbench.holdout); printed whether or not a network is written."""
    from .epbench import holdout

    return [
        f"held out, {ep.name} {group}: {v['rows']} rows, median ln(pred/meas) "
        f"{v['median_log_error']:+.3f}, max |.| {v['max_abs_log_error']:.3f}"
        for group, v in holdout(records, prior, ep).items()
    ]


def write_ep_network(args, records, prior, prof, path: Path, src: str) -> list[str]:
    """The network of this run (--network, else the prior profile's) with its all-to-all calls and
    the transport terms torch's calls measure, written to `path` (calib.epbench.network_from_run);
    lines saying what was written, or why nothing was."""
    from costmodel.io import atomic_write_text
    from costmodel.network import load_network, network_toml

    from .epbench import network_from_run

    if not any(r["kind"] == "ep_all2all" for r in records):
        return [
            "EP all-to-all: not timed (one rank, experts that do not split over the ranks, or the "
            "budget ran out); no network written"
        ]
    name = args.network or prior.interconnect.network
    if not name:
        return [
            "EP all-to-all: timed (raw samples), no network written: give --network NAME|FILE to "
            "start from"
        ]
    net, notes = network_from_run(
        load_network(name), records, prof.name, float(prof.interconnect.link_bw_bytes_per_s), src
    )
    net = net.with_values(name=f"{net.name}-measured", origin=str(path))
    atomic_write_text(
        path,
        network_toml(
            net,
            f"# Written by tpcost calibrate (prior network: {name}; GPU "
            f"{prof.name}); raw samples beside it.\n",
        ),
    )
    cal = [k for k, t in net.tiers.items() if t == "calibrated" and net.sources[k].startswith(src)]
    return [
        f"network: {path} ({len(net.measured)} measured calls; fitted: {', '.join(cal) or 'none'})",
        *notes,
        f"use it: tpcost ep --gpu {args.out} --network {path} ...",
    ]


def run(args) -> int:
    """Check every argument, path and shape before a worker starts, then run the ranks."""
    import math

    from costmodel.io import check_output_path
    from costmodel.shapes import load_model

    from . import launch

    launch.require_launcher(args.device, "calibrate")
    launch.check_environment()
    out = Path(args.out)
    if not (math.isfinite(args.budget_s) and 0 < args.budget_s <= 24 * 3600):
        raise TpcostError(
            f"--budget-s must be a finite number of seconds in (0, 86400], got {args.budget_s}"
        )
    if not out.name.endswith(".toml"):
        raise TpcostError(f"--out {out}: a profile is a .toml file")
    samples, ops_csv, net_file = side_paths(out)
    check_output_path(out, args.force, "--out")
    for side in (samples, ops_csv, net_file):
        check_output_path(side, args.force, "--out's side file")
    if args.network is not None:
        from costmodel.network import load_network

        load_network(args.network)  # a bad network: one line before any worker
    world = args.nproc
    if args.device == "cpu" and not launch.under_torchrun():
        if not 1 <= args.nproc <= max(1, os.cpu_count() or 1) * 4:
            raise TpcostError(
                f"--nproc must be in [1, {max(1, os.cpu_count() or 1) * 4}] (4 ranks per core at "
                "most "
                f"on this {os.cpu_count()}-core machine), got {args.nproc}"
            )
    else:
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    models = args.models or ([CPU_MODEL] if args.device == "cpu" else None)
    from costmodel.shapes import builtin_model_names

    tp_models, ep = split_models(models or builtin_model_names(), args.device)
    for m in tp_models:
        # unknown model or a TP it cannot split: one line, exit 2, before any worker
        load_model(m).check_tp(world)
    try:
        launch.run(
            worker,
            args,
            args.device,
            args.nproc,
            "calibrate",
            wall_timeout_s=args.budget_s * 3 + 300,
        )
    finally:  # a killed or interrupted run: what was streamed is kept under its final name
        partial = partial_path(samples)
        if partial.exists() and (args.force or not samples.exists()):
            os.replace(partial, samples)
    return 0
