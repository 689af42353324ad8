"""Every component fit and reading behind the built-in profiles, made once from data/reference and
committed as calib/data/component_fits.json (calib.results), which the GPU specs name (calib/gpus,
calib/assemble.py):

    python -m calib.components      # refit and write component_fits.json (a few seconds)

Each entry is the fit's values, its error and the rows it used (calib/reference.py holds the fits;
calib/fit.py the one alpha-beta fit and the one rule for an unidentified term). The datasheet
numbers a fit needs (a GEMM fit's peak, HBM bandwidth and SM count) are recorded beside it under
"inputs"; the builder refuses a profile whose datasheet values differ from them.
tests/test_calib_reference.py refits and compares (the staleness test).
"""

from __future__ import annotations

import sys

from calib import reference as R
from calib.fit import fit_ring_regimes
from calib.nccl_fit import SWEEPS, fit_regimes, readme_points
from calib.results import COMPONENT_CMD, COMPONENT_FITS
from costmodel import formulas as F

# datasheet values the GEMM fits run at (a spec's fit_inputs: the assembler refuses a spec whose
# datasheet differs)
FIT_INPUTS = {
    "H100": {"peak_bf16_flops_per_s": 989.4e12, "hbm_bw_bytes_per_s": 3.35e12, "sm_count": 132},
    "B200": {"peak_bf16_flops_per_s": 2250e12, "hbm_bw_bytes_per_s": 8e12, "sm_count": 148},
}
MAMF = {
    "H100 SXM (H200 same)": "bf16",
    "H200 SXM": "fp8",
    "B200 SXM": "bf16",
    "GB200": "bf16",
    "A100 SXM": "bf16",
}
GEMM_SOURCES = {"H100": ["VLLM_PR49363"], "B200": ["VLLM_PR20071", "VLLM_PR19566", "VLLM_PR18778"]}
MAMF_LABEL = {"H100": "H100 SXM (H200 same)", "B200": "B200 SXM"}


def _ab(S, t, factor, **extra) -> dict:
    a, bw, err = R.fit_alpha_beta(S, t, factor)
    return {"latency_s": a, "bus_bw_bytes_per_s": bw, "rms_rel_err": err, **extra}


def h200_collectives() -> dict:
    """8xH200 NCCL all-reduce (MLENG_NET_README latencies + MLENG_NET_SHARP's 16 GiB ring point),
    the SHARP all-gather / reduce-scatter busBW and the TP 4 / 6 ring busBW caps."""
    lat_rows = R.rows("MLENG_NET_README", metric="allreduce_latency_median", gpu="H200 SXM")
    S = [R.size_in_notes(r["notes"]) for r in lat_rows]
    t = [float(r["baseline_value"]) * 1e-6 for r in lat_rows]
    sharp = R.rows("MLENG_NET_SHARP", gpu="H200 SXM")
    ring8 = float(next(r for r in sharp if "Ring, NVLS off" in r["workload"])["baseline_value"])
    s_, t_ = R.asymptote_point(ring8, 8, size=16 * 1024**3)
    out = {"nccl_all_reduce_tp8": _ab(S + [s_], t + [t_], R.ar_factor(8))}
    for key in ("all_gather", "reduce_scatter"):
        r = next(r for r in sharp if key in r["workload"])
        out[f"sharp_{key}_tp8_bus_bw_bytes_per_s"] = float(r["baseline_value"]) * 1e9
    for w in (4, 6):
        r = next(
            r
            for r in R.rows("MLENG_NET_SHARP", gpu="H200 SXM", metric="allreduce_busbw")
            if r["num_gpus"] == str(w)
        )
        out[f"sharp_ring_tp{w}"] = r["baseline_value"]  # GB/s as printed
    return out


def b200_collectives() -> dict:
    """8xB200 NCCL from MLENG_NET_README (1 KiB latency, half-peak payload, 16 GiB busBW: one
    alpha-beta for the all-reduce, NCCL's LL and Simple ring regimes for the all-gather and
    reduce-scatter), the TP 2 stock NCCL reduce-scatter (NCCL_PR2307), VLLM_PR42324's TP 2
    all-reduces, TRTLLM_PR14534's one-shot AR+RMSNorm and the SGLANG_PR7621 B200 TP 8 decode-size
    kernel time."""
    out: dict = {"readme": {}}
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        S, t, meta = readme_points("B200", op)
        f, impl = float(F.bus_bw_factor(op, 8)), f"nccl_{op}"
        # its TP 8 curves are the sweep's regimes (nccl_fit); this one stands for GB200
        if op == "all_reduce":
            out["readme"][impl] = _ab(S, t, f, **meta)
            continue
        # ring all-gather / reduce-scatter: LL and Simple, three points
        reg, res = fit_ring_regimes(S, t, 8)
        out["readme"][impl] = {**reg["large"], "rms_rel_err": res["rms_log_residual"], **meta}
        out["readme"][impl + "_small"] = {
            **reg["small"],
            "rms_rel_err": res["rms_log_residual"],
            **meta,
        }
    stock = next(r for r in R.rows("NCCL_PR2307") if "default vs tuned" in r["workload"])
    t4 = float(stock["baseline_value"]) * 1e-6
    out["vllm_pr42324_tp2"] = {
        metric: R.fit_vllm_bench("VLLM_PR42324", 2, metric, gpu_match="B200")
        for metric in (
            "allreduce_time_pynccl",
            "allreduce_time_torch_symm_mem_multimem",
            "allreduce_time_torch_symm_mem_two_shot",
        )
    }
    lat2 = out["vllm_pr42324_tp2"]["allreduce_time_pynccl"]["latency_s"]
    out["nccl_rs_tp2"] = {
        "stock_4mib_us": stock["baseline_value"],
        "latency_s": lat2,
        "bus_bw_bytes_per_s": float(F.bus_bw_factor("all_gather", 2)) * 4 * F.MiB / (t4 - lat2),
    }
    out["sglang_fi_oneshot_us"] = next(iter(R.rows("SGLANG_PR7621")))["overlap_value"]
    tr = R.rows("TRTLLM_PR14534", metric="fused_ar_rmsnorm_time_oneshot")
    fit = _ab(
        [float(r["M_or_tokens"]) * float(r["hidden_size"]) * 2 for r in tr],
        [float(r["baseline_value"]) * 1e-6 for r in tr],
        R.ar_factor(4),
    )
    # its intercept is the kernel's latency plus the benchmark's own floor: flat ~38 us from 1 to
    # 256 tokens, where NCCL's own small all-reduce on a GB200 NVL72 takes 8 us (NCCLTESTS_ISSUE333)
    # and the kernel 8.7 us on a B200 (SGLANG_PR7621): the harness is the intercept less the
    # kernel's measured latency
    fit["harness_s"] = fit["latency_s"] - float(out["sglang_fi_oneshot_us"]) * 1e-6
    out["trtllm_oneshot_tp4"] = fit
    return out


def component_fits() -> dict:
    """Every component entry the profile builder reads (name -> entry)."""
    mamf = {f"{g}/{d}": R.mamf_efficiency(g, d) for g, d in MAMF.items()}
    gemm = {}
    for gpu, inp in FIT_INPUTS.items():
        eff = mamf[f"{MAMF_LABEL[gpu]}/bf16"]
        gemm[gpu] = R.gemm_fit(
            gpu,
            GEMM_SOURCES[gpu],
            inp["hbm_bw_bytes_per_s"],
            inp["peak_bf16_flops_per_s"],
            eff,
            inp["sm_count"],
        )
    h = FIT_INPUTS["H100"]
    return {
        "inputs": FIT_INPUTS,
        "mamf_efficiency": mamf,
        "gemm_small_m": gemm,
        "h100_compute_slowdown": R.asynctp_slowdown_h100(
            h["peak_bf16_flops_per_s"], mamf["H100 SXM (H200 same)/bf16"]
        ),
        "h100_collectives": R.h100_collectives(),
        "h200_collectives": h200_collectives(),
        "b200_collectives": b200_collectives(),
        "fi_tp2_b300": R.fi_tp2_b300(),
        "b300_vllm_ar": R.b300_vllm_ar_fits(),
        "gb200_nccl_ar_tp4_latency_us": R.rows("NCCLTESTS_ISSUE333")[0]["baseline_value"],
        "nccl_regimes": {gpu: fit_regimes(SWEEPS[gpu]) for gpu in ("h200", "b200")},
    }


def main(argv: list[str] | None = None) -> int:
    """Refit every component and write COMPONENT_FITS (atomically, strict JSON)."""
    import argparse

    from costmodel.io import doc_summary

    argparse.ArgumentParser(
        prog="python -m calib.components", description=doc_summary(__doc__)
    ).parse_args(argv)
    import json

    from costmodel.io import atomic_write_text, dumps_json

    out = {
        "command": COMPONENT_CMD,
        "data": "data/reference/components.csv",
        "fits": component_fits(),
    }
    text = dumps_json(out, indent=1) + "\n"  # insertion order: the profiles list entries in it
    json.loads(text)
    atomic_write_text(COMPONENT_FITS, text)
    print(f"wrote {COMPONENT_FITS} ({len(out['fits'])} groups)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
