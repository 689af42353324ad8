"""Single-GPU check (issue #5 §5): what one GPU can measure of the profile, in ≤ 8 minutes on an
H200.

    python -m calib.gpu_check OUT_DIR [--budget-s 360]      (or: bash calib/gpu_check.sh OUT_DIR)
    python -m calib.gpu_check OUT_DIR --combine RUN_DIR --combine RUN_DIR ...   (no GPU: the runs'
    median)

Measures the GEMM sweep (bf16, fp8 via torch._scaled_mm), the same GEMMs split in W row chunks on
one and on two streams, memory-bound kernels (copy, RMSNorm, W-way partial sum) and copy/compute
interference (a device-to-device copy on another stream: HBM contention, not NVLink); then the EP
step's one-GPU terms at DeepSeek-V3's shapes, held out: one rank's routed experts (grouped GEMMs, EP
8/16/32) and MLA attention (decode absorbed, prefill not). Writes
OUT_DIR/samples.jsonl (raw records), OUT_DIR/fit.json (fitted parameters with uncertainties,
residuals and provenance) and OUT_DIR/summary.txt. Without a GPU it fails at once with one line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from .epbench import EP_TOKENS, MLA_DECODE, MLA_PREFILL


def _shapes():
    """Per-rank GEMM shapes (name, n, k) of Llama-3.1-70B: every slot at TP 4, qkv and down at TP 8
    (LayerSpec)."""
    from costmodel.layer import LayerSpec
    from costmodel.shapes import load_model

    out = []
    for tp, keep in ((4, ("qkv", "o", "gate_up", "down")), (8, ("qkv", "down"))):
        spec = LayerSpec.build(load_model("llama-3.1-70b"), tp, "bf16")
        out += [(f"70b_tp{tp}_{s.name}", s.n, s.k) for s in spec.slots if s.name in keep]
    return out


def _kernel_shapes():
    """Per-rank GEMM shapes (name, n, k) where vLLM's single kernel replaces GEMM + all-reduce:
    Kimi-K3's gemm_ar call sites at TP 8 (costmodel.shapes.KernelModel.call_sites, the current
    release), one per distinct (n, k). Timed and never fitted: the held-out GEMM check, at the
    kernel's small M. Read from the repository's copy of the config (data/reference/models): none
    where that is absent (an installed package), and the phase is listed as skipped."""
    from costmodel.shapes import read_kernel_model
    from costmodel.vllm_tables import Parallel, Vllm

    path = KIMI_K3_CONFIG
    if not path.is_file():
        return ()
    km = read_kernel_model(json.loads(path.read_text(encoding="utf-8")), "kimi-k3", str(path))
    seen: dict = {}
    for site in km.call_sites("gemm_ar", Parallel(8), Vllm()):
        seen.setdefault((site.n, site.k), f"k3_tp8_{site.name.split()[0]}")
    return tuple((name, n, k) for (n, k), name in seen.items())


SHAPES = _shapes()
KIMI_K3_CONFIG = (
    Path(__file__).resolve().parent.parent / "data" / "reference" / "models" / "kimi-k3.config.json"
)
GEMM_ROWS = [1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
# M/W from 32 to 4096 rows: the small-chunk regime (64-512 rows, weights far larger than L2) where
# every chunk re-streams its weights and two streams can only recover compute quantisation
# (docs/model.md §6)
CHUNK_ROWS = [256, 512, 1024, 2048, 4096, 8192]
WORLDS = [2, 4, 8]
MEM_SIZES = [2**p for p in range(10, 29, 2)]  # 1 KiB .. 256 MiB
# the single kernel's small-M regime (issue 49 item 3: one wave of few CTAs) and a few large M
# beside it
HOLDOUT_ROWS = [1, 8, 16, 32, 48, 64, 80, 96, 128, 192, 256, 512, 1024, 4096]
SM_CARVEOUTS = [0, 8, 16, 32, 66]  # SMs withheld from the GEMM (0: all); 66 = half an H100/H200
SM_BUDGET_ROWS = [64, 1024, 8192]
# the EP step's one-GPU terms (issue #58): DeepSeek-V3's routed experts on one rank at EP 8 / 16 /
# 32, decode and prefill tokens per rank, and its MLA attention core (calib.epbench); timed and held
# out, never fitted
EP_MODEL, EP_SIZES = "deepseek-v3", (8, 16, 32)


@dataclasses.dataclass(frozen=True)
class CheckSizes:
    """What the check times: GEMM shapes (name, n, k), their rows, the chunked GEMMs' rows and world
    sizes, the memory sizes (bytes), the interference GEMM's rows, the held-out GEMMs (shapes, rows:
    timed, never fitted) and the SM-budget GEMMs (SMs withheld, rows). The defaults are the GPU
    check's; tests pass small ones."""

    shapes: tuple = tuple(SHAPES)
    gemm_rows: tuple = tuple(GEMM_ROWS)
    chunk_rows: tuple = tuple(CHUNK_ROWS)
    worlds: tuple = tuple(WORLDS)
    mem_sizes: tuple = tuple(MEM_SIZES)
    interference_m: int = 4096
    # read when a check is sized
    holdout_shapes: tuple = dataclasses.field(default_factory=_kernel_shapes)
    holdout_rows: tuple = tuple(HOLDOUT_ROWS)
    sm_carveouts: tuple = tuple(SM_CARVEOUTS)
    sm_budget_rows: tuple = tuple(SM_BUDGET_ROWS)
    ep_model: str = EP_MODEL
    ep_sizes: tuple = EP_SIZES
    ep_tokens: tuple = EP_TOKENS["cuda"]
    mla_decode: tuple = MLA_DECODE
    mla_prefill: tuple = MLA_PREFILL


def provenance(device_name=None):
    import datetime
    import platform
    import subprocess

    import torch

    import costmodel

    prov = {
        "host": platform.node(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "tpcost": costmodel.__version__,
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        prov.update(
            device_name=p.name,
            compute_capability=f"{p.major}.{p.minor}",
            sm_count=p.multi_processor_count,
            cuda=torch.version.cuda,
            memory_bytes=p.total_memory,
        )
        try:
            prov["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            pass
        try:
            prov["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            prov["driver"] = "unknown"
    else:
        prov.update(device_name=device_name or platform.processor() or "cpu")
    return prov


def prior_for(device_name: str, capability: str | None = None):
    """The built-in profile matching this GPU (costmodel.profile.match_profile; h200-sxm if none
    matches)."""
    from costmodel.profile import load_profile, match_profile

    return load_profile(match_profile(device_name, capability) or "h200-sxm")


def main(argv=None) -> int:
    from costmodel.io import doc_summary

    ap = argparse.ArgumentParser(prog="calib.gpu_check", description=doc_summary(__doc__))
    ap.add_argument("out_dir")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="stop starting new benchmarks after this (s; 360)",
    )
    ap.add_argument(
        "--combine",
        action="append",
        default=[],
        metavar="RUN_DIR",
        help="write OUT_DIR/fit.json as the median of these runs' fit.json (same GPU; no GPU "
        "needed)",
    )
    ap.add_argument(
        "--force", action="store_true", help="with --combine: replace an existing OUT_DIR/fit.json"
    )
    args = ap.parse_args(argv)
    if args.combine:
        if args.budget_s is not None:
            print(
                "gpu_check: error: --budget-s times a run; --combine runs nothing", file=sys.stderr
            )
            return 2
        if (Path(args.out_dir) / "fit.json").exists() and not args.force:
            print(
                f"gpu_check: error: {Path(args.out_dir) / 'fit.json'} exists: pass --force to "
                "replace it",
                file=sys.stderr,
            )
            return 2
    elif args.force:
        print(
            "gpu_check: error: --force: read only with --combine (a run writes a new OUT_DIR)",
            file=sys.stderr,
        )
        return 2
    if args.combine:
        try:
            fit = combine_runs([Path(d) for d in args.combine], Path(args.out_dir))
        except ValueError as e:
            print(f"gpu_check: error: {e}", file=sys.stderr)
            return 2
        from costmodel.errors import TpcostError
        from costmodel.io import atomic_write_text

        try:
            atomic_write_text(Path(args.out_dir) / "fit.json", json.dumps(fit, indent=2) + "\n")
        except TpcostError as e:  # costmodel.io's one line: cannot write PATH: why
            print(f"gpu_check: error: {e}", file=sys.stderr)
            return 2
        for k, v in fit["params"].items():
            print(
                f"  {k} = {v['value']:.4g} (±{100 * v['uncertainty_rel']:.1f}%, {v['runs']} runs)"
            )
        return 0
    try:
        import torch
    except ImportError:
        print(
            "gpu_check: error: torch is not installed (pip install 'tpcost[torch]')",
            file=sys.stderr,
        )
        return 2
    if not torch.cuda.is_available():
        print(
            "gpu_check: error: no CUDA GPU visible (torch.cuda.is_available() is False); run it on "
            "a GPU node",
            file=sys.stderr,
        )
        return 2
    return run_check(Path(args.out_dir), "cuda", 360.0 if args.budget_s is None else args.budget_s)


def _check_run(d: Path, prov, params) -> None:
    """One run's fit.json as the check writes it: a provenance table naming the GPU, and per
    parameter a finite value and a finite relative sigma >= 0 (ValueError, one line, naming the
    first that is not)."""
    import math

    def num(x) -> bool:
        return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)

    if (
        not isinstance(prov, dict)
        or not isinstance(prov.get("device_name"), str)
        or not isinstance(params, dict)
    ):
        raise ValueError(
            f"--combine {d}: fit.json needs a provenance table with device_name and a params table"
        )
    for key, v in params.items():
        if not (
            isinstance(v, dict)
            and num(v.get("value"))
            and num(v.get("uncertainty_rel"))
            and v["uncertainty_rel"] >= 0
        ):
            raise ValueError(
                f"--combine {d}: params.{key} must be a table with a finite value and a finite "
                f"uncertainty_rel >= 0, got {str(v)[:60]}"
            )


def combine_runs(run_dirs: list[Path], out_dir: Path) -> dict:
    """One fit.json from several runs of the check on one GPU model: each parameter the median of
    the runs that fit it, its relative σ the larger of the runs' median fitted σ and half their
    spread over the median (run-to-run variation is part of what a calibrated value does not know).
    Raises ValueError, in one line, on a missing or unreadable fit.json, fewer than two runs, or
    runs of different GPUs."""
    import numpy as np

    if len(run_dirs) < 2:
        raise ValueError("--combine needs at least two runs")
    runs = []
    for d in run_dirs:
        try:
            f = json.loads((d / "fit.json").read_text(encoding="utf-8"))
            prov, params = f["provenance"], f["params"]
            name = prov["device_name"]
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
            raise ValueError(
                f"--combine {d}: no readable fit.json of a gpu check ({type(e).__name__})"
            ) from None
        _check_run(d, prov, params)
        runs.append((d, prov, params, name))
    names = {r[3] for r in runs}
    if len(names) != 1:
        raise ValueError(f"--combine: runs of different GPUs ({', '.join(sorted(names))})")
    params = {}
    for key in dict.fromkeys(k for r in runs for k in r[2]):  # the runs' own order
        vals = np.array([r[2][key]["value"] for r in runs if key in r[2]], float)
        sig = np.array([r[2][key]["uncertainty_rel"] for r in runs if key in r[2]], float)
        med = float(np.median(vals))
        spread = float((vals.max() - vals.min()) / (2.0 * med)) if med > 0 else 0.0
        params[key] = {
            "value": med,
            "uncertainty_rel": max(float(np.median(sig)), spread),
            "runs": int(vals.size),
            "run_values": vals.tolist(),
        }
    dates = sorted(str(r[1].get("date")) for r in runs)
    first = runs[0][1]
    rel = [
        str(d.resolve().relative_to(out_dir.resolve()))
        if d.resolve().is_relative_to(out_dir.resolve())
        else str(d)
        for d, *_ in runs
    ]
    return {
        "provenance": {
            "device_name": first["device_name"],
            "torch": ", ".join(sorted({r[1]["torch"] for r in runs})),
            "date": f"{dates[0]} .. {dates[-1]}" if dates[0] != dates[-1] else dates[0],
            "combined": f"median of {len(runs)} runs",
            "runs": dict(zip(rel, (r[1] for r in runs), strict=True)),
        },
        "params": params,
    }


def _ep_phases(timer, shape, sizes: CheckSizes, device: str) -> list:
    """The EP step's one-GPU phases: one rank's routed experts at each EP size that splits them,
    then MLA."""
    from .epbench import bench_grouped_experts, bench_mla

    dtype = "bf16" if device.startswith("cuda") else "fp32"
    return [
        *(
            (
                f"ep_experts_ep{e}",
                (
                    lambda e=e: bench_grouped_experts(
                        timer, shape, e, sizes.ep_tokens, device, dtype
                    )
                ),
            )
            for e in sizes.ep_sizes
            if shape.num_experts % e == 0
        ),
        ("mla", lambda: bench_mla(timer, shape, device, sizes.mla_decode, sizes.mla_prefill)),
    ]


def _ep_lines(model: str, ep_holdout: dict) -> list[str]:
    return [
        f"  [{model}] held-out {group}: {v['rows']} rows, median ln(pred/meas) "
        f"{v['median_log_error']:+.3f}, "
        f"median |.| {v['median_abs_log_error']:.3f}, max {v['max_abs_log_error']:.3f}"
        for group, v in ep_holdout.items()
    ]


def run_check(out: Path, device: str, budget_s: float, sizes: CheckSizes | None = None) -> int:
    """The check itself, on `device`; the CLI runs it on CUDA. The sizes are a parameter so that the
    tests can run the same pipeline on CPU with small shapes (there the interference phase yields
    nothing)."""
    sizes = CheckSizes() if sizes is None else sizes
    shapes, gemm_rows, chunk_rows = (
        list(sizes.shapes),
        list(sizes.gemm_rows),
        list(sizes.chunk_rows),
    )
    worlds, mem_sizes, interference_m = (
        list(sizes.worlds),
        list(sizes.mem_sizes),
        sizes.interference_m,
    )
    from costmodel.moe import load_moe_model

    from .epbench import holdout
    from .fit import check_gemm_holdout, check_sm_budget, fit_single_device
    from .microbench import (
        bench_chunked,
        bench_gemms,
        bench_host_issue,
        bench_interference,
        bench_memory,
        bench_sm_budget,
        gemm_dtypes,
    )
    from .timing import Timer

    out.mkdir(parents=True, exist_ok=True)
    prov = provenance()
    prior = prior_for(prov["device_name"])
    t0 = time.perf_counter()
    timer = Timer(device, warmup_s=0.01, rep_s=0.04, min_reps=5, max_reps=50)
    records, skipped = [], []
    dtypes = gemm_dtypes(device)
    phases = [
        (
            "host_issue",
            lambda: bench_host_issue(device),
        ),  # first: cheap, and the one host-side quantity
        ("gemm", lambda: bench_gemms(timer, shapes, gemm_rows, device, dtypes)),
        ("memory", lambda: bench_memory(timer, mem_sizes, device)),
        *[
            (
                f"chunked_{d}",
                (lambda d=d: bench_chunked(timer, shapes[:4], chunk_rows, worlds, device, d)),
            )
            for d in dtypes
        ],
        *[
            (
                f"interference_{d}",
                (lambda d=d: bench_interference(timer, shapes[:4], interference_m, device, d)),
            )
            for d in dtypes
        ],
    ]
    if sizes.holdout_shapes:
        phases.append(
            (
                "gemm_holdout",
                lambda: bench_gemms(
                    timer,
                    list(sizes.holdout_shapes),
                    list(sizes.holdout_rows),
                    device,
                    dtypes,
                    kind="gemm_holdout",
                ),
            )
        )
    else:
        skipped.append(
            f"gemm_holdout (no {KIMI_K3_CONFIG.name}: the repository's data/reference/models)"
        )
    phases.append(
        (
            "sm_budget",
            lambda: bench_sm_budget(
                timer,
                list(sizes.holdout_shapes) + shapes[:1],
                list(sizes.sm_budget_rows),
                list(sizes.sm_carveouts),
                device,
            ),
        )
    )
    ep_shape = load_moe_model(sizes.ep_model)
    phases += _ep_phases(timer, ep_shape, sizes, device)
    with open(out / "samples.jsonl", "w") as f:
        for name, gen in phases:
            if time.perf_counter() - t0 > budget_s:
                skipped.append(name)
                continue
            print(f"[{time.perf_counter() - t0:6.1f}s] {name}", flush=True)
            for rec in gen():
                rec = {k: v for k, v in rec.items() if k != "samples_s"}
                records.append(rec)
                f.write(json.dumps(rec) + "\n")
                f.flush()
                if time.perf_counter() - t0 > budget_s:
                    skipped.append(f"{name} (partial)")
                    break
    prior_vals = prior.values()
    fits = {}
    for d in dtypes:
        params, residuals = fit_single_device(records, prior_vals, d)
        fits[d] = {
            "params": params,
            "residuals": residuals,
            "gemm_holdout": check_gemm_holdout(records, prior_vals, d, residuals.get("gemm")),
        }
        if d == "bf16":
            fits[d]["sm_budget"] = check_sm_budget(records, prior_vals, residuals.get("gemm"))
    result = {
        "provenance": {
            **prov,
            "prior_profile": prior.name,
            "wall_s": round(time.perf_counter() - t0, 1),
            "skipped_phases": skipped,
            "records": len(records),
        },
        # profile parameters come from the first GEMM dtype's fit (bf16 on GPU): the model keeps one
        # GEMM efficiency per GPU
        "params": fits[dtypes[0]]["params"],
        "fits_by_dtype": fits,
        "ep_holdout": holdout(records, prior, ep_shape),
    }
    (out / "fit.json").write_text(json.dumps(result, indent=2))
    lines = [
        f"gpu_check on {prov['device_name']} (cc {prov.get('compute_capability', 'n/a')}, torch "
        f"{prov['torch']}, "
        f"driver {prov.get('driver', 'n/a')}), {len(records)} records in "
        f"{result['provenance']['wall_s']} s"
    ]
    for d, fd in fits.items():
        for k, v in fd["params"].items():
            lines.append(f"  [{d}] {k} = {v['value']:.4g} (±{100 * v['uncertainty_rel']:.1f}%)")
        for k, v in fd["residuals"].items():
            lines.append(f"  [{d}] fit {k}: {json.dumps(v)[:160]}")
        for band, v in fd["gemm_holdout"].items():
            if band != "rows":
                lines.append(
                    f"  [{d}] held-out GEMMs {band}: {v['rows']} rows, median ln(pred/meas) "
                    f"{v['median_log_error']:+.3f}, median |.| {v['median_abs_log_error']:.3f}, "
                    f"max {v['max_abs_log_error']:.3f}"
                )
        for lib, v in fd.get("sm_budget", {}).items():
            sd = v.get("slowdown")
            lines.append(
                f"  [{d}] SM budget on {lib}: carveout honoured {v['honoured']}"
                + (
                    f", slowdown ln(model/meas) median {sd['median_log_error']:+.3f}, max |.| "
                    f"{sd['max_abs_log_error']:.3f} over {sd['rows']} rows"
                    if sd
                    else ""
                )
            )
    lines += _ep_lines(ep_shape.name, result["ep_holdout"])
    if skipped:
        lines.append(f"  skipped (budget): {', '.join(skipped)}")
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
