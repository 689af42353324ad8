"""Write the built-in hardware profiles costmodel/profiles/*.toml (single source of their numbers).

    python tools/build_profiles.py            # rewrite the TOML files
    python tools/build_profiles.py --check    # exit 1 if a file differs (tests run this)

Values come from datasheets (URL), from the committed fits to data/reference (calib/data/component_fits.json,
family_fit.json, kernel_fit.json, read through calib/results.py; source_id named), from this project's GPU runs
committed as calib/data/<profile>-gpu-check (every committed one, or those --gpu-check names; provenance named), or
are assumed (derivation named). Tier per docs/model.md
§7. The builder fits nothing: the chain that refits is in docs/profiles.md.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from costmodel.errors import TpcostError  # noqa: E402
from costmodel.io import atomic_write_text  # noqa: E402
from costmodel.profile import SCHEMA_VERSION, dump_profile, profile_from_dict  # noqa: E402
from costmodel import formulas as F  # noqa: E402
from costmodel import vllm_tables as T  # noqa: E402
from calib import results as CR  # noqa: E402  (committed fit results only: no fitting code)
from calib.derive import (RING, SHARP_NVLS_RATIO, round_value, custom_reduce_scatter, derive, nccl_regimes,  # noqa: E402
                          one_ring, scaled_collectives, sec)

C: dict = {}  # calib/data/component_fits.json (python -m calib.components), read by main before anything is built


def fit_inputs(gpu: str, peak_bf16: float, hbm: float, sms: int) -> None:
    """Refuse datasheet values other than those the committed GEMM fit of `gpu` ran at."""
    want = C["inputs"][gpu]
    got = {"peak_bf16_flops_per_s": peak_bf16, "hbm_bw_bytes_per_s": hbm, "sm_count": sms}
    if got != want:
        raise TpcostError(f"{gpu} datasheet values {got} differ from those {CR.COMPONENT_FITS.name} was fitted at "
                          f"({want}): update calib/components.py FIT_INPUTS and run {CR.COMPONENT_CMD}")

MiB = F.MiB
CHECK_REL_TOL = 1e-3  # values are written with 4 significant digits
OUT = ROOT / "costmodel" / "profiles"
NV_H100 = "https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM5 datasheet, dense)"
NV_H200 = "https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM datasheet, dense)"
NV_B200 = "https://www.nvidia.com/en-us/data-center/hgx/ (HGX B200 datasheet, per GPU, dense)"
NV_GB200 = "https://www.nvidia.com/en-us/data-center/gb200-nvl72/ (GB200 NVL72 datasheet, per GPU, dense)"
NV_GB300 = "https://www.nvidia.com/en-us/data-center/gb300-nvl72/ (GB300 NVL72 datasheet, per GPU)"
NV_A100 = "https://www.nvidia.com/en-us/data-center/a100/ (A100 SXM4 80GB datasheet, dense)"
NV_L40S = "https://www.nvidia.com/en-us/data-center/l40s/ (L40S datasheet, dense)"
AMD_MI300X = "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html (MI300X datasheet, dense)"
ASSUMED_KERNELS = "assumed: memory-bound kernels reach ~85% of HBM peak (STREAM-like copy fraction; the H200 device copy in .library KINDS.md moved 4.3 of 4.8 TB/s = 0.90), CUDA-graph kernel gap ~2 us"
FA3 = "https://arxiv.org/abs/2407.08608 (FlashAttention-3: 500-660 TFLOP/s causal bf16 fwd at 1k-2k seq on H100 = 0.5-0.67 of 989 TFLOP/s; 0.55 taken)"


def h100():
    peak = 989.4e12
    fit_inputs("H100", peak, 3.35e12, 132)
    eff = C["mamf_efficiency"]["H100 SXM (H200 same)/bf16"]
    g = C["gemm_small_m"]["H100"]
    coll = copy.deepcopy(C["h100_collectives"])
    sigma = C["h100_compute_slowdown"]
    return {
        "schema_version": SCHEMA_VERSION,
        "identity": {"name": "h100-sxm", "display_name": "NVIDIA H100 SXM5 80GB", "vendor": "nvidia",
                     "compute_capability": "9.0", "device_name_patterns": "H100 80GB HBM3|H100 SXM|H100",
                     **sec(NV_H100, "datasheet", sm_count=132)},
        "compute": {"peak_flops_per_s": sec(NV_H100, "datasheet", bf16=peak, fp8=1978.9e12, fp32=66.9e12)},
        "memory": sec(NV_H100, "datasheet", hbm_bw_bytes_per_s=3.35e12),
        "kernels": sec(ASSUMED_KERNELS, "assumed", mem_efficiency=0.85, launch_overhead_s=2e-6),
        "gemm": {
            "_tile": sec("assumed: CUTLASS/cuBLAS Hopper warp-specialised 128x256 output tile (64-row tiles for small M)",
                        "assumed", tile_m=128, tile_n=256),
            "_efficiency": sec(f"MLENG_MAMF H100 SXM bf16 best-shape {eff * peak / 1e12:.1f}/989 TFLOP/s",
                              "published-measurement", max_efficiency=eff),
            "_small_m": sec(g["source"], "published-measurement", mem_efficiency=g["mem_efficiency"],
                           launch_overhead_s=g["launch_overhead_s"]),
        },
        "attention": sec(FA3, "published-measurement", efficiency=0.55),
        "interconnect": {"kind": "nvswitch", **sec("https://www.nvidia.com/en-us/data-center/nvlink/ (NVLink4: 900 GB/s bidirectional per GPU, 8 GPUs per HGX NVSwitch domain; 400 Gb/s ConnectX-7 per GPU beyond)",
                                                   "datasheet", link_bw_bytes_per_s=450e9, latency_s=1e-6, domain_size=8,
                                                   internode_bw_bytes_per_s=50e9, internode_latency_s=5e-6)},
        "collectives": coll,
        "asynctp": {
            "_sync": sec("assumed: symm-mem barrier = signal-pad put + wait ~4 us (SYMMMEM_RECIPES_PR3: a Triton one-shot all-reduce, 2 barriers + launch, takes 10.8 us at 8 KiB); CE pull start ~3 us; two-stream GEMM concurrency recovers half of the wave-quantisation loss",
                        "assumed", barrier_s=4e-6, copy_latency_s=3e-6, stream_concurrency=0.5),
            "_copy": sec("assumed: copy-engine pull over NVLink4 at the measured NCCL ring busBW (NCCL_ISSUE1455: 367 GB/s of 450)",
                        "assumed", copy_engine_bw_bytes_per_s=367e9),
            "_interference": sec("PT_PR172714 8xH100 8192^3 matmul + 64 MiB all-gather: sequential 2.96 ms, copy-engine overlapped 1.77 ms; sigma = t_ce/max(t_mm, t_ag) - 1 with t_mm at MAMF efficiency (calib/reference.py)",
                                "published-measurement", compute_slowdown=sigma),
        },
    }


def h200(h):
    eff8 = C["mamf_efficiency"]["H200 SXM/fp8"]
    p = derive(h, {
        "identity": lambda t: {**t, "name": "h200-sxm", "display_name": "NVIDIA H200 SXM 141GB",
                               "device_name_patterns": "H200", "source": NV_H200},
        "compute.peak_flops_per_s": lambda t: {**t, "source": NV_H200},
        "memory": sec(NV_H200, "datasheet", hbm_bw_bytes_per_s=4.8e12),
        "gemm._efficiency": lambda t: {**t, "source": t["source"] + " (MLENG_MAMF: H200 same as H100 for bf16)"},
        "gemm._small_m": lambda t: {**t, "source": "H100 fit applied to H200 (same SM; HBM3e bandwidth from "
                                                   "datasheet): " + t["source"]},
        "attention": lambda t: {**t, "source": FA3 + " (H100; H200 has the same SMs)"}})
    # H200-specific collective measurements (8 GPUs)
    h2 = C["h200_collectives"]
    a, bw, err = (h2["nccl_all_reduce_tp8"][k] for k in ("latency_s", "bus_bw_bytes_per_s", "rms_rel_err"))
    p["collectives"]["nccl_all_reduce"]["tp8"] = sec(
        f"MLENG_NET_README 8xH200 NCCL all-reduce median latency 8 B-1 MiB + MLENG_NET_SHARP 16 GiB ring busBW; fit rms rel err {err:.3f} (calib/reference.py)",
        "published-measurement", latency_s=a, bus_bw_bytes_per_s=bw)
    for impl, key in (("nccl_all_gather", "all_gather"), ("nccl_reduce_scatter", "reduce_scatter")):
        bw = h2[f"sharp_{key}_tp8_bus_bw_bytes_per_s"]
        for name, share in ((impl, 1.0), (impl + "_small", F.LL_PAYLOAD_FRACTION)):  # Simple, and LL at its share
            e = p["collectives"][name]["tp8"]
            p["collectives"][name]["tp8"] = sec(
                f"latency: {e['source'].split(';')[0]} (H100); busBW: {'' if share == 1 else f'{share} x '}"
                f"MLENG_NET_SHARP 8xH200 {key} 16 GiB", "published-measurement", latency_s=e["latency_s"],
                bus_bw_bytes_per_s=share * bw)
    for w in (4, 6):
        ring = h2[f"sharp_ring_tp{w}"]
        e = p["collectives"]["nccl_all_reduce"][f"tp{w}"]
        e["bus_bw_bytes_per_s"] = min(e["bus_bw_bytes_per_s"], float(ring) * 1e9)
        e["source"] += f"; busBW capped at MLENG_NET_SHARP 8GiB H200 TP{w} ring {ring} GB/s"
    p["gemm"]["_efficiency"]["source"] += f"; fp8: MLENG_MAMF H200 {eff8:.3f} of peak (not used: one efficiency per GPU)"
    return p


H800_NVLS_AR_BUSBW = 215e9  # NCCL_ISSUE1374: 8 x H800 NCCL all-reduce (NVLS) busBW, GB/s


def _h800_collectives(h, ratio):
    """H100's collectives scaled by the H800/H100 NVLS ratio, the all-reduce from the same ring as the all-gather and
    reduce-scatter (one_ring), but at TP 8, where NCCL_ISSUE1374 measured the H800's own all-reduce: that."""
    coll = one_ring(scaled_collectives(h["collectives"], ratio,
                                       "NCCL_ISSUE1374 8xH800 NVLS busBW 215 vs NCCL_ISSUE1455 8xH100 480 GB/s"))
    e = coll["nccl_all_reduce"]["tp8"]
    coll["nccl_all_reduce"]["tp8"] = sec("busBW: NCCL_ISSUE1374 8xH800 NCCL all-reduce busBW 215 GB/s (NVLS, measured on "
                                         "H800); latency: " + e["source"].split(" with busBW")[0] + " (tier: the "
                                         "latency's)", "assumed", latency_s=e["latency_s"],
                                         bus_bw_bytes_per_s=H800_NVLS_AR_BUSBW)
    return coll


def h800(h):
    ratio = H800_NVLS_AR_BUSBW / 480e9  # NCCL_ISSUE1374 H800 NVLS AR busBW vs NCCL_ISSUE1455 H100 NVLS TP8
    return derive(h, {
        "identity": lambda t: {**t, "name": "h800", "display_name": "NVIDIA H800 SXM5 80GB", "device_name_patterns": "H800",
                               "source": NV_H100 + "; H800 = H100 SXM with NVLink cut to 400 GB/s bidirectional"},
        "interconnect": lambda t: {**t, "link_bw_bytes_per_s": 200e9, "source": "H800 NVLink 400 GB/s bidirectional = "
                                   "200 GB/s per direction (issue #2; NCCL_ISSUE1374)"},
        "collectives": _h800_collectives(h, ratio),
        "asynctp._copy": sec(f"assumed: CE pull at {RING} x 200 GB/s link (H100 ring busBW/link ratio)", "assumed",
                             copy_engine_bw_bytes_per_s=RING * 200e9)})


def b200():
    peak = 2250e12
    fit_inputs("B200", peak, 8e12, 148)
    eff = C["mamf_efficiency"]["B200 SXM/bf16"]
    g = C["gemm_small_m"]["B200"]
    bc = C["b200_collectives"]
    h = h100()
    coll = scaled_collectives(h["collectives"], 2.0, "NVLink5 900 vs NVLink4 450 GB/s per direction")
    for impl, f in bc["readme"].items():
        how = ("alpha-beta fit" if impl == "nccl_all_reduce" else
               f"NCCL {'LL' if impl.endswith('_small') else 'Simple'} regime of the two-regime ring fit (LL at half the "
               "Simple busBW, calib.fit.fit_ring_regimes)")
        coll.setdefault(impl, {})["tp8"] = sec(
            f"MLENG_NET_README 8xB200: {how} to the 1 KiB median latency {f['latency_us']} us, half of the 16 GiB busBW "
            f"{f['busbw_gb_s']} GB/s at its half-peak payload {f['half_peak_bytes'] / F.MiB:.0f} MiB, and that busBW at "
            f"16 GiB; rms log err {f['rms_rel_err']:.3f} (calib/components.py)",
            "published-measurement", latency_s=f["latency_s"], bus_bw_bytes_per_s=f["bus_bw_bytes_per_s"])
    # TP2 reduce-scatter / all-gather: stock NCCL at 4 MiB (NCCL_PR2307 'default' 29.4 us) with the TP2 all-reduce
    # latency; the prototype's tuned 1-16 MiB rows are not the NCCL vLLM runs
    rs2 = bc["nccl_rs_tp2"]
    for impl in ("nccl_reduce_scatter", "nccl_all_gather"):
        coll[impl]["tp2"] = sec(f"NCCL_PR2307 B200 TP2 stock reduce-scatter 4 MiB {rs2['stock_4mib_us']} us, latency from the "
                                "VLLM_PR42324 TP2 all-reduce fit" + ("" if impl == "nccl_reduce_scatter" else
                                "; all-gather assumed = reduce-scatter (same ring, no reduction)"),
                                "published-measurement" if impl == "nccl_reduce_scatter" else "assumed",
                                latency_s=rs2["latency_s"], bus_bw_bytes_per_s=rs2["bus_bw_bytes_per_s"])
    for impl, metric in (("nccl_all_reduce", "allreduce_time_pynccl"), ("symm_mem_multimem", "allreduce_time_torch_symm_mem_multimem"),
                         ("symm_mem_two_shot", "allreduce_time_torch_symm_mem_two_shot")):
        f = bc["vllm_pr42324_tp2"][metric]
        coll[impl]["tp2"] = sec(f"VLLM_PR42324 B200 WS=2 {metric}; fit rms rel err {f['rms_rel_err']:.3f} over {f['n']} points",
                                "published-measurement", latency_s=f["latency_s"], bus_bw_bytes_per_s=f["bus_bw_bytes_per_s"])
    a, us = fi_oneshot_latency()
    bw, err, harness = (bc["trtllm_oneshot_tp4"][k] for k in ("bus_bw_bytes_per_s", "rms_rel_err", "harness_s"))
    for w in (2, 4, 8):
        coll["flashinfer_ar_rmsnorm"][f"tp{w}"] = sec(
            f"latency: SGLANG_PR7621 B200 TP8 decode-size fused AR+RMSNorm kernel {us} us (message size not stated, "
            f"taken as latency{'' if w == 8 else f'; the one-shot Lamport kernel at TP{w} assumed no slower'}); busBW: "
            f"TRTLLM_PR14534 GB200 4-rank one-shot fit (rms rel err {err:.3f}), whose intercept holds its benchmark's "
            f"{harness * 1e6:.1f} us floor beside the kernel's latency (NCCL's own small all-reduce on a GB200 NVL72 is "
            f"8 us, NCCLTESTS_ISSUE333); used for TP{w}",
            "published-measurement" if w == 8 else "assumed", latency_s=a, bus_bw_bytes_per_s=bw)
    # TP2 up to vLLM's 64 MB limit: the B300 (same NVLink5) large-message points
    for impl, e in fi_tp2_entries(a, own=False).items():
        coll[impl]["tp2"] = e
    return {
        "schema_version": SCHEMA_VERSION,
        "identity": {"name": "b200", "display_name": "NVIDIA B200 (HGX, 8 GPUs)", "vendor": "nvidia",
                     "compute_capability": "10.0", "device_name_patterns": "B200",
                     **sec(NV_B200 + "; 148 SMs (NVIDIA Blackwell architecture technical brief)", "datasheet", sm_count=148)},
        "compute": {"peak_flops_per_s": {**sec(NV_B200 + "; fp32 non-tensor 75 TFLOP/s assumed", "datasheet",
                                                bf16=peak, fp8=4500e12, fp32=75e12)}},
        "memory": sec(NV_B200, "datasheet", hbm_bw_bytes_per_s=8e12),
        "kernels": sec(ASSUMED_KERNELS, "assumed", mem_efficiency=0.85, launch_overhead_s=2e-6),
        "gemm": {
            "_tile": sec("assumed: 128x256 output tile per SM (CUTLASS SM100 1-SM tile)", "assumed", tile_m=128, tile_n=256),
            "_efficiency": sec(f"MLENG_MAMF B200 SXM bf16 best-shape {eff * peak / 1e12:.0f}/2250 TFLOP/s",
                              "published-measurement", max_efficiency=eff),
            "_small_m": sec(g["source"], "published-measurement", mem_efficiency=g["mem_efficiency"],
                           launch_overhead_s=g["launch_overhead_s"]),
        },
        "attention": sec("assumed: as H100 FlashAttention-3 fraction (" + FA3 + ")", "assumed", efficiency=0.55),
        "interconnect": {"kind": "nvswitch", **sec("https://www.nvidia.com/en-us/data-center/nvlink/ (NVLink5: 1.8 TB/s bidirectional per GPU; 8-GPU HGX domain; 400 Gb/s NIC per GPU)",
                                                   "datasheet", link_bw_bytes_per_s=900e9, latency_s=1e-6, domain_size=8,
                                                   internode_bw_bytes_per_s=50e9, internode_latency_s=5e-6)},
        "collectives": coll,
        "asynctp": {
            "_sync": h["asynctp"]["_sync"],
            "_copy": sec(f"assumed: copy-engine pull at {RING} x 900 GB/s (H100 ring busBW/link ratio)", "assumed",
                        copy_engine_bw_bytes_per_s=RING * 900e9),
            "_interference": {**h["asynctp"]["_interference"], "source": "H100 value: " + h["asynctp"]["_interference"]["source"],
                             "tier": "assumed"},
        },
    }


NV_B300 = ("https://www.nvidia.com/en-us/data-center/hgx/ (HGX B300 datasheet, per GPU, dense: 2.25 PFLOP/s bf16, "
           "4.5 PFLOP/s fp8, 288 GB HBM3e at 8 TB/s, NVLink5 1.8 TB/s bidirectional); Blackwell Ultra: 160 SMs, "
           "compute capability 10.3 (vLLM's tables list sm_103 on their own)")


def fi_tp2_entries(latency_s: float, own: bool) -> dict:
    """FlashInfer's fused AR+RMSNorm one-shot and two-shot at TP 2 from the B300 large-message rows
    (calib/reference.py fi_tp2_b300): the B300's own measurement (`own`), or assumed for another NVLink5 GPU; the
    one-shot's latency is `latency_s` (fi_oneshot_latency: the kernel's measured latency on NVLink5)."""
    fi2 = C["fi_tp2_b300"]
    one, two = fi2["flashinfer_ar_rmsnorm"], fi2["flashinfer_ar_rmsnorm_twoshot"]
    lat = "latency: SGLANG_PR7621's B200 kernel time (fi_oneshot_latency)"
    if own:
        return {"flashinfer_ar_rmsnorm": sec(f"busBW: {one['source']}; {lat}", "published-measurement",
                                             latency_s=latency_s, bus_bw_bytes_per_s=one["bus_bw_bytes_per_s"]),
                "flashinfer_ar_rmsnorm_twoshot": sec(two["source"], "published-measurement", latency_s=two["latency_s"],
                                                     bus_bw_bytes_per_s=two["bus_bw_bytes_per_s"])}
    via = "(a B300, which has B200's NVLink5)"
    return {"flashinfer_ar_rmsnorm": sec(f"assumed: busBW = {one['source']} {via}; {lat}", "assumed",
                                         latency_s=latency_s, bus_bw_bytes_per_s=one["bus_bw_bytes_per_s"]),
            "flashinfer_ar_rmsnorm_twoshot": sec(f"assumed: = {two['source']} {via}", "assumed",
                                                 latency_s=two["latency_s"], bus_bw_bytes_per_s=two["bus_bw_bytes_per_s"])}


def b300_base():
    """B300 (Blackwell Ultra, HGX 8-GPU): the B200 profile's structure with B300's datasheet numbers. Its
    GEMM and collective fits stay B200's (same SM100 family and NVLink5) and say so; the start tree of the fit of
    its own reduce-scatter latency (b300)."""
    p = copy.deepcopy(b200())
    p["identity"].update(name="b300", display_name="NVIDIA B300 (HGX, 8 GPUs)", compute_capability="10.3",
                         device_name_patterns="B300", sm_count=160, source=NV_B300)
    p["compute"]["peak_flops_per_s"] = sec(NV_B300 + "; fp32 non-tensor assumed as B200", "datasheet",
                                           bf16=2250e12, fp8=4500e12, fp32=75e12)
    p["memory"] = sec(NV_B300, "datasheet", hbm_bw_bytes_per_s=8e12)
    for part in ("_efficiency", "_small_m"):
        p["gemm"][part]["source"] = "B200 value (same SM100 tensor cores): " + p["gemm"][part]["source"]
        p["gemm"][part]["tier"] = "assumed"
    for per_tp in p["collectives"].values():
        for e in per_tp.values():
            if e["tier"] != "assumed":
                e["source"] = "B200 value (same NVLink5/NVSwitch): " + e["source"]
                e["tier"] = "assumed"
    for impl, e in fi_tp2_entries(p["collectives"]["flashinfer_ar_rmsnorm"]["tp2"]["latency_s"], own=True).items():
        p["collectives"][impl]["tp2"] = e  # the B300's own TP 2 rows
    p["collectives"] = b300_vllm_ar(p["collectives"])
    # its reduce-scatter at 1-12 MiB is its own measurement (b300: PT_ISSUE179770's sequential arm), slower than
    # the B200's LL regime there: one curve, no LL regime carried over
    p["collectives"].pop("nccl_reduce_scatter_small", None)
    return p


def b300(family: dict):
    """The B300 profile tree: b300_base with its own NCCL reduce-scatter latency at 1-12 MiB, fitted to the
    sequential arm of PT_ISSUE179770 (scaled_mm + NCCL RS) from that start tree (calib/reference.py
    b300_rs_latency_fit, committed with the family fits in `family`); the busBW stays the 16 GiB value. The B200
    fit's 1 KiB latency is far below NCCL's mid-size cost."""
    p = b300_base()
    rs = p["collectives"]["nccl_reduce_scatter"]["tp8"]
    fit = family["with"]["b300_nccl_rs_latency"]
    p["collectives"]["nccl_reduce_scatter"]["tp8"] = sec(
        f"latency: {fit['source']} (1-12 MiB messages); busBW: {rs['source']}", "published-measurement",
        latency_s=fit["value"], bus_bw_bytes_per_s=rs["bus_bw_bytes_per_s"])
    p["collectives"]["nccl_reduce_scatter"]["tp8"]["uncertainty_rel"] = {"latency_s": round_value(fit["sigma_rel"])}
    return p


def b300_vllm_ar(coll):
    """B300's vLLM all-reduce implementations: TP 6 fitted to VLLM_PR37756 (calib/reference.py b300_vllm_ar_fits);
    at the other TPs the assumed values scaled by that fit's ratio to the TP 6 assumption, latency and busBW each
    (same GPU and switch: what the B300 measurement corrects at TP 6 it corrects at every TP; tier assumed)."""
    coll = copy.deepcopy(coll)
    for impl, f in C["b300_vllm_ar"].items():
        per = coll[impl]
        old = per["tp6"]
        ra, rb = f["latency_s"] / old["latency_s"], f["bus_bw_bytes_per_s"] / old["bus_bw_bytes_per_s"]
        for key, e in per.items():
            if key == "tp6":
                per[key] = sec(f["source"], "published-measurement", latency_s=f["latency_s"],
                               bus_bw_bytes_per_s=f["bus_bw_bytes_per_s"])
            else:
                per[key] = sec(f"assumed: {e['source']}; latency x {ra:.3g} and busBW x {rb:.3g}, the B300 TP6 fit's "
                               "ratio to that assumption (VLLM_PR37756)", "assumed",
                               latency_s=e["latency_s"] * ra, bus_bw_bytes_per_s=e["bus_bw_bytes_per_s"] * rb)
    return coll


def gb200(b):
    peak = 2500e12
    eff = C["mamf_efficiency"]["GB200/bf16"]
    lat_us = C["gb200_nccl_ar_tp4_latency_us"]
    return derive(b, {
        "identity": lambda t: {**t, "name": "gb200-nvl72", "display_name": "NVIDIA GB200 NVL72 (per Blackwell GPU)",
                               "device_name_patterns": "GB200", "source": NV_GB200 + "; SM count assumed = B200"},
        "compute.peak_flops_per_s": sec(NV_GB200 + "; fp32 assumed as B200", "datasheet", bf16=peak, fp8=5000e12,
                                        fp32=75e12),
        "gemm._efficiency": sec(f"MLENG_MAMF GB200 bf16 best-shape {eff * peak / 1e12:.0f}/2500 TFLOP/s",
                                "published-measurement", max_efficiency=eff),
        "interconnect": lambda t: {**t, "domain_size": 72, "internode_bw_bytes_per_s": 100e9,
                                   "source": "https://www.nvidia.com/en-us/data-center/gb200-nvl72/ (72-GPU NVLink5 "
                                             "domain, 1.8 TB/s bidirectional per GPU; 800 Gb/s NIC per GPU beyond)"},
        "collectives.nccl_all_reduce.tp4": lambda e: sec(
            f"latency: NCCLTESTS_ISSUE333 GB200 4-GPU all-reduce {lat_us} us at <=1 KB; busBW: "
            f"{e['source']}", "published-measurement", latency_s=float(lat_us) * 1e-6,
            bus_bw_bytes_per_s=e["bus_bw_bytes_per_s"])})


@dataclasses.dataclass(frozen=True)
class OtherGpu:
    """A GPU outside the fitted families, by its datasheet (`src`) and its link (`link_src`): everything else is the
    H100's fits, scaled by the link or assumed, and each value says so."""

    name: str
    display: str
    cc: str  # compute capability
    sms: int
    peak_bf16: float
    peak_fp8: float
    peak_fp32: float
    hbm: float  # bytes/s
    link: float  # bytes/s per direction
    kind: str  # interconnect kind
    domain: int
    inter_bw: float  # bytes/s per GPU beyond the domain
    src: str
    link_src: str
    eff: float  # GEMM max efficiency
    eff_src: str
    attn: float  # attention efficiency
    patterns: str
    coll_why: str  # why the H100 collectives scale by link / 450 GB/s
    tile: tuple = (128, 256)


def pre_hopper(g: OtherGpu) -> dict:
    """The profile tree of an OtherGpu."""
    name, display, cc, sms, link, kind, domain = g.name, g.display, g.cc, g.sms, g.link, g.kind, g.domain
    peak_bf16, fp8, fp32, hbm, inter_bw, src, link_src = g.peak_bf16, g.peak_fp8, g.peak_fp32, g.hbm, g.inter_bw, g.src, g.link_src
    eff, eff_src, attn, patterns, coll_why, tile = g.eff, g.eff_src, g.attn, g.patterns, g.coll_why, g.tile
    h = h100()
    ratio = link / 450e9
    coll = one_ring(scaled_collectives({k: v for k, v in h["collectives"].items()
                                        if k in ("nccl_all_reduce", "nccl_all_gather", "nccl_reduce_scatter",
                                                 "nccl_all_gather_small", "nccl_reduce_scatter_small",  # ring regimes
                                                 "custom_ar_1stage", "custom_ar_2stage")}, ratio, coll_why))
    return {
        "schema_version": SCHEMA_VERSION,
        "identity": {"name": name, "display_name": display, "vendor": "amd" if kind == "xgmi" else "nvidia",
                     "compute_capability": cc, "device_name_patterns": patterns, **sec(src, "datasheet", sm_count=sms)},
        "compute": {"peak_flops_per_s": sec(src, "datasheet", bf16=peak_bf16, fp8=fp8, fp32=fp32)},
        "memory": sec(src, "datasheet", hbm_bw_bytes_per_s=hbm),
        "kernels": sec(ASSUMED_KERNELS, "assumed", mem_efficiency=0.85, launch_overhead_s=2e-6),
        "gemm": {
            "_tile": sec(f"assumed: {tile[0]}x{tile[1]} output tile", "assumed", tile_m=tile[0], tile_n=tile[1]),
            "_efficiency": sec(eff_src, "published-measurement" if "MLENG" in eff_src else "assumed", max_efficiency=eff),
            "_small_m": sec("assumed: H100 small-M fit values (VLLM_PR49363) for weight streaming", "assumed",
                           mem_efficiency=0.86, launch_overhead_s=3e-6),
        },
        "attention": sec(f"assumed: {attn} of bf16 peak for causal FlashAttention at 1k tokens", "assumed", efficiency=attn),
        "interconnect": {"kind": kind, **sec(link_src, "datasheet", link_bw_bytes_per_s=link, latency_s=2e-6,
                                             domain_size=domain, internode_bw_bytes_per_s=inter_bw, internode_latency_s=5e-6)},
        "collectives": coll,
        "asynctp": {
            "_sync": h["asynctp"]["_sync"],
            "_copy": sec(f"assumed: copy-engine pull at {RING} x {link / 1e9:.0f} GB/s per peer (H100 ring busBW/link ratio)",
                        "assumed", copy_engine_bw_bytes_per_s=RING * link),
            "_interference": {**h["asynctp"]["_interference"], "source": "H100 value: " + h["asynctp"]["_interference"]["source"],
                             "tier": "assumed"},
        },
    }


def a100(name="a100-sxm-80gb", link=300e9, display="NVIDIA A100 SXM4 80GB", patterns="A100"):
    return pre_hopper(OtherGpu(
        name, display, "8.0", 108, 312e12, 312e12, 19.5e12, 2.039e12, link, "nvswitch", 8, 25e9,
        src=NV_A100 + "; no FP8 tensor cores: fp8 runs weight-only (Marlin W8A16) at the bf16 peak",
        link_src=f"NVLink3: {2 * link / 1e9:.0f} GB/s bidirectional per GPU, 8-GPU NVSwitch; 200 Gb/s HDR NIC per GPU",
        eff=C["mamf_efficiency"]["A100 SXM/bf16"], eff_src="MLENG_MAMF A100 SXM bf16 best-shape 271.2/312 TFLOP/s",
        attn=0.5, patterns=patterns, coll_why=f"NVLink3 {link / 1e9:.0f} vs NVLink4 450 GB/s per direction"))


def a800():
    return derive(a100("a800", 200e9, "NVIDIA A800 SXM4 80GB", "A800"), {
        "identity": lambda t: {**t, "source": t["source"] + "; A800 = A100 with NVLink cut to 400 GB/s bidirectional"}})


def l40s():
    return pre_hopper(OtherGpu(
        "l40s", "NVIDIA L40S (PCIe, no NVLink)", "8.9", 142, 362.05e12, 733e12, 91.6e12, 864e9, 32e9, "pcie", 8, 25e9,
        src=NV_L40S, link_src="PCIe Gen4 x16: 32 GB/s per direction, no NVLink; GPUs talk through the host's PCIe switch",
        eff=0.7, eff_src="assumed: 0.70 of dense bf16 peak (Ada, no MAMF entry)", attn=0.45, patterns="L40S",
        coll_why="PCIe Gen4 x16 32 vs NVLink4 450 GB/s per direction", tile=(128, 128)))


def mi300x():
    p = pre_hopper(OtherGpu(
        "mi300x", "AMD Instinct MI300X", "9.4", 304, 1307.4e12, 2614.9e12, 163.4e12, 5.3e12, 448e9, "xgmi", 8, 50e9,
        src=AMD_MI300X + " (304 CUs)",
        link_src="AMD Infinity Fabric: 7 xGMI links x 64 GB/s per direction to the 7 peers (fully connected mesh)",
        eff=0.55, eff_src="assumed: 0.55 of dense bf16 peak (hipBLASLt large-GEMM fraction reported ~0.5-0.6)", attn=0.4,
        patterns="MI300X", coll_why="xGMI aggregate 448 vs NVLink4 450 GB/s per direction"))
    return derive(p, {"asynctp._copy": sec(f"assumed: a pull from ONE peer uses one xGMI link: {RING} x 64 GB/s",
                                           "assumed", copy_engine_bw_bytes_per_s=RING * 64e9)})


# measured on one Hopper part, a property of the GH100 die (132 SMs) that H100 and H800 share
SAME_DIE_KEYS = {"asynctp.stream_concurrency"}


def calibrated_overrides(p, name, gpu_checks, keys=None, note=""):
    """Fold a single-GPU calibration result named on the command line (gpu_checks: profile name -> its
    <name>-gpu-check/fit.json) into a profile: every fitted key, or only `keys` (with `note` saying why they carry
    over from that GPU). Nothing is read that the command line does not name."""
    fit_path = (gpu_checks or {}).get(name)
    if fit_path is None:
        return p
    fit = json.loads(Path(fit_path).read_text())
    prov = fit["provenance"]
    shown = Path(fit_path).resolve()
    shown = shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else shown
    where = (f"calibrated: {shown} ({prov.get('device_name')}, torch {prov.get('torch')}, "
             f"{prov.get('date')}){note}")
    for key, val in fit["params"].items():
        if keys is not None and key not in keys:
            continue
        section, leaf = key.rsplit(".", 1)
        target = {"gemm.max_efficiency": ("gemm", "_efficiency"), "gemm.mem_efficiency": ("gemm", "_small_m"),
                  "gemm.launch_overhead_s": ("gemm", "_small_m"), "kernels.mem_efficiency": ("kernels",),
                  "kernels.launch_overhead_s": ("kernels",), "asynctp.stream_concurrency": ("asynctp", "_streams"),
                  "asynctp.compute_slowdown": ("asynctp", "_interference"),
                  # the gpu_check host's own issue time: folded only into the GPU it ran on (keys=None), never
                  # carried to another profile (SAME_DIE_KEYS leaves it out)
                  "asynctp.host_op_s": ("asynctp", "_host")}.get(key)
        if target is None:
            continue
        node = p
        for t in target:
            node = node[t]
        # a calibrated value gets its own table so its neighbours keep their sources
        new = sec(where, "calibrated", **{leaf: val["value"]})
        new["uncertainty_rel"] = {leaf: val["uncertainty_rel"]}
        node.pop(leaf, None)
        p[section][f"_calibrated_{leaf}"] = new
    return p


def nccl_ag_busbw(p, tp=8):
    """The NCCL all-gather bus bandwidth of a profile tree at `tp` (or its largest listed TP)."""
    per_tp = p["collectives"]["nccl_all_gather"]
    key = f"tp{tp}" if f"tp{tp}" in per_tp else max(per_tp, key=lambda k: int(k[2:]))
    return per_tp[key]["bus_bw_bytes_per_s"], key


def asynctp_section(p, sync, host, streams=None):
    """The [asynctp] tables of a profile tree (docs/model.md §6): `sync` = (barrier_s, source, tier), `host` =
    (host_op_s, source, tier). The copy-engine pull is capped at NCCL's all-gather busBW on the same link: no
    measurement says a single copy engine beats NCCL there (each value says where it comes from)."""
    old = p["asynctp"]
    ce_old = old["_copy"]["copy_engine_bw_bytes_per_s"]
    ag_bw, ag_tp = nccl_ag_busbw(p)
    ce = min(ce_old, ag_bw)
    why = ("NCCL all-gather busBW at " + ag_tp.upper() + " (no faster than NCCL on the same link)" if ce == ag_bw
           else old["_copy"]["source"])
    def table(spec, key):
        t = sec(spec[1], spec[2], **{key: spec[0]})
        if len(spec) > 3 and spec[3] is not None:
            t["uncertainty_rel"] = {key: round_value(spec[3])}
        return t

    out = {
        "_sync": table(sync, "barrier_s"),
        "_host": table(host, "host_op_s"),
        "_pull": sec(f"assumed: copy-engine pull bandwidth = {why}; pull start latency ~3 us", "assumed",
                     copy_engine_bw_bytes_per_s=ce, copy_latency_s=3e-6),
        "_streams": streams or sec("assumed: two-stream chunk GEMMs recover half of the compute-side tile/wave "
                                   "quantisation (memory-bound chunks recover nothing: docs/model.md §6)", "assumed",
                                   stream_concurrency=0.5),
        "_interference": old["_interference"],
    }
    p["asynctp"] = out
    return p


HOST_OP = (3e-6, "assumed: one eager torch call (Python -> dispatcher -> launch) ~3 us on a current server CPU; the "
           "hosts of the released sweeps fit 3.8 us (PT_ISSUE179770, B300) to 12 us (KRAKEN_PR19 H100, the GB200 Grace "
           "host): a property of the host, never carried from one source's machine to another", "assumed")
BARRIER_PRIOR_S = 4e-6  # fit start: signal-pad put + wait (SYMMMEM_RECIPES_PR3: one-shot AR with 2 barriers 10.8 us)


def family_trees() -> dict:
    """The profile trees the family fits start from (the fitted terms at their priors), per family; written to
    calib/data/family_fit_trees.json (calib.results.FAMILY_TREES) beside the profiles, where calib/reference.py
    and benchmarks/accuracy.py read them (the B300's reduce-scatter latency is fitted there first)."""
    pri = (BARRIER_PRIOR_S, "fit start", "assumed")
    return {"hopper": {"h100-sxm": asynctp_section(h100(), pri, HOST_OP)},
            "blackwell": {"b300": asynctp_section(b300_base(), pri, HOST_OP),
                          "gb200-nvl72": asynctp_section(gb200(b200()), pri, HOST_OP)}}


def asynctp_fits():
    """The joint fits of the fused-op terms per GPU family (calib/reference.py FamilyFit; docs/model.md §6):
    Hopper over KRAKEN_PR19 (eager GEMM+RS) and VLLM_PR28672 (graph-mode decode: the GPU side alone); Blackwell over
    PT_ISSUE179770 (B300 fp8) and FLASHINFER_GB200_GEMMRS_MATRIX (GB200, torch's fused arm, with its baseline arm
    fitting the NCCL reduce-scatter busBW at TP 2/4 and the benchmark's own overhead). The barrier (and on Blackwell
    the copy-engine pull bandwidth) is shared by a family's sources; host_op_s is each source's own host. Read from
    the committed result (calib/data/family_fit.json, `python -m calib.reference`), refused where it was fitted to
    other start trees than these."""
    fam = CR.load_family_result(family_trees())
    fits = {f: CR.fit_from_json(v) for f, v in fam["fits"].items()}
    return {"hopper": fits["hopper"], "blackwell": fits["blackwell"], "kernel": CR.load_kernel_fit(), "family": fam}


def kernel_section(p, kern, nvlink: str):
    """[fused_kernel] of a GPU with NVLink multicast: vLLM's gemm_rs_ar terms from the joint fit (calib/kernel_fit.py,
    committed in calib/data/kernel_fit.json); NVLink5 hardware terms as fitted, NVLink4 (Hopper) ones scaled by the
    NVLS/peak ratio MLENG_NET_SHARP measures on H200 against B200 and marked assumed (vLLM ships the kernel on SM100
    only; costmodel.ops.kernel_shipped)."""
    over = (f"joint least-squares fit of the single-kernel family over {' + '.join(kern.get('sources', []))} "
            f"({kern['n_rows']} rows, rms of the weighted log residuals {kern['rms_log']}; {K_CMD})")
    out = {}
    for leaf in ("fixed_s", "ar_fence_s", "compute_overhead", "exposed_fraction", "link_efficiency",
                 "multicast_latency_s"):
        key = ("hw:" if leaf in ("link_efficiency", "multicast_latency_s") else "vllm:") + leaf
        v, sg = kern["values"][key], kern["sigma_rel"].get(key)
        if leaf == "link_efficiency" and nvlink == "nvlink4":
            v = min(1.0, v * SHARP_NVLS_RATIO)
            t = sec(f"assumed: the NVLink5 value x {SHARP_NVLS_RATIO:.3f}, MLENG_NET_SHARP's NVLS busBW/peak on H200 "
                    f"over B200 (same multimem reduction, NVLink4 switch): {over}", "assumed", **{leaf: v})
        elif key in kern.get("design", ()):
            t = sec(f"assumed: vLLM's design, not fitted (calib/kernel_fit.py DESIGN: warp-specialised, a wave's "
                    f"multimem traffic beside the next wave's GEMM): {over}", "assumed", **{leaf: v})
        elif sg is None or nvlink == "nvlink4":
            why = "prior kept, not identified by the" if sg is None else "NVLink5 value carried to Hopper:"
            t = sec(f"assumed: {why} {over}", "assumed", **{leaf: v})
        else:
            t = sec(over, "published-measurement", **{leaf: v})
            t["uncertainty_rel"] = {leaf: round_value(min(sg, 1.0))}
        out[f"_{leaf}"] = t
    out["_inflight_scale"] = sec(T.KERNEL_INFLIGHT_SOURCE, "datasheet", inflight_scale=1.0)
    out["_time_scale"] = model_error_table(CR.load_band_fit()["kernel"], "the single kernel",
                                           hopper=nvlink == "nvlink4")
    p["fused_kernel"] = out
    return p


K_CMD = "python -m calib.kernel_fit, then python tools/build_profiles.py"


def gb300(b3):
    """GB300 NVL72: B300 silicon (its profile: compute, HBM, GEMM and collective fits) in a 72-GPU NVLink5 domain."""
    return derive(b3, {
        "identity": lambda t: {**t, "name": "gb300-nvl72", "display_name": "NVIDIA GB300 NVL72 (per Blackwell Ultra GPU)",
                               "device_name_patterns": "GB300", "source": NV_GB300 + "; SM count = B300 (same die)"},
        "interconnect": lambda t: {**t, "domain_size": 72, "internode_bw_bytes_per_s": 100e9,
                                   "source": NV_GB300 + " (72-GPU NVLink5 domain, 1.8 TB/s bidirectional per GPU; "
                                             "800 Gb/s NIC per GPU beyond)"}})


def _fit_spec(fit, sid, key, what):
    """(value, source, tier, sigma) of one fitted term for asynctp_section / sec; a term the fit could not identify
    keeps its prior, tier assumed, and says so."""
    v, sg = fit["values"][sid][key], fit["sigma_rel"][sid][key]
    over = (f"joint least-squares fit over {' + '.join(fit['sources'])} ({fit['n_residuals']} log residuals, "
            f"{fit['n_params']} terms, rms {fit['rms_log']:.3f}; calib/reference.py FamilyFit)")
    if not math.isfinite(sg):
        return (v, f"assumed: {what}: prior kept, not identified by the {over}", "assumed")
    return (v, f"{what}: {over}", "published-measurement", min(sg, 1.0))


def _with_slowdown(p, spec):
    """The chunk-GEMM slowdown while pulls run (asynctp.compute_slowdown) of a fit."""
    p["asynctp"]["_interference"] = sec(spec[1], spec[2], compute_slowdown=spec[0])
    if len(spec) > 3 and spec[3] is not None:
        p["asynctp"]["_interference"]["uncertainty_rel"] = {"compute_slowdown": round_value(spec[3])}
    return p


def _assumed(spec, why):
    return (spec[0], f"assumed: {why} ({spec[1]})", "assumed")


def _gb200_rs(p, fit, ar2_fit, tier_note=None):
    """NCCL reduce-scatter (and all-gather: same ring, no reduction) busBW at TP 2/4 from the GB200 baseline arm."""
    sid = "FLASHINFER_GB200_GEMMRS_MATRIX"
    for tp in (2, 4):
        key = f"collectives.nccl_reduce_scatter.tp{tp}.bus_bw_bytes_per_s"
        v, src, tier, sg = _fit_spec(fit, sid, key, f"NCCL reduce-scatter busBW at TP{tp} from the sequential arm "
                                                    "(cuBLAS + reduce_scatter_tensor), benchmark overhead fitted apart")
        for impl in ("nccl_reduce_scatter", "nccl_all_gather"):
            old = p["collectives"][impl].get(f"tp{tp}") or p["collectives"][impl]["tp8"]
            why = src if impl == "nccl_reduce_scatter" else "assumed: all-gather = reduce-scatter (same ring, " \
                                                            "no reduction): " + src
            t_tier = tier if impl == "nccl_reduce_scatter" else "assumed"
            if tier_note:
                why, t_tier = f"assumed: {tier_note}: " + why, "assumed"
            p["collectives"][impl][f"tp{tp}"] = sec(f"busBW: {why}; latency: {old['source']}", t_tier,
                                                    latency_s=old["latency_s"], bus_bw_bytes_per_s=v)
            if t_tier != "assumed":
                p["collectives"][impl][f"tp{tp}"]["uncertainty_rel"] = {"bus_bw_bytes_per_s": round_value(min(sg, 1.0))}
    # TP2 all-reduce: VLLM_PR42324's pynccl points stop at 2 MiB; at the sizes vLLM sends NCCL (above its 2 MiB
    # custom-AR limit) a ring all-reduce is a reduce-scatter + an all-gather at the same busBW: the large-message
    # point comes from the fitted reduce-scatter (so RS + AG and AR agree, CONSISTENCY_BAND)
    ar2 = ar2_fit
    p["collectives"]["nccl_all_reduce"]["tp2"] = sec(
        ar2["source"] + (f" ({tier_note})" if tier_note else ""),
        "assumed" if tier_note else "published-measurement", latency_s=ar2["latency_s"],
        bus_bw_bytes_per_s=ar2["bus_bw_bytes_per_s"])
    return p


def _with_pull(p, spec):
    """The copy-engine pull bandwidth of a fit, replacing asynctp_section's NCCL-capped assumption."""
    v, src, tier = spec[0], spec[1], spec[2]
    p["asynctp"]["_pull"] = sec(src, tier, copy_engine_bw_bytes_per_s=v)
    if len(spec) > 3 and spec[3] is not None:
        p["asynctp"]["_pull"]["uncertainty_rel"] = {"copy_engine_bw_bytes_per_s": round_value(spec[3])}
    p["asynctp"]["_pull_latency"] = sec("assumed: pull start latency ~3 us", "assumed", copy_latency_s=3e-6)
    return p


# HBM capacity per GPU from the datasheets (decimal GB as the datasheets print them)
HBM_CAPACITY = {
    "h100-sxm": (80e9, NV_H100), "h200-sxm": (141e9, NV_H200), "h800": (80e9, NV_H100 + " (H800 SXM5: same 80 GB)"),
    "b200": (180e9, NV_B200 + " (HGX B200: 1.44 TB for 8 GPUs)"), "b300": (288e9, NV_B300),
    "gb200-nvl72": (186e9, NV_GB200 + " (13.4 TB HBM3e for 72 GPUs)"),
    "gb300-nvl72": (288e9, NV_GB300 + " (20.7 TB HBM3e for 72 GPUs)"), "a100-sxm-80gb": (80e9, NV_A100),
    "a800": (80e9, NV_A100 + " (A800 SXM4 80GB)"), "l40s": (48e9, NV_L40S), "mi300x": (192e9, AMD_MI300X),
}


def model_error_table(band: dict, what: str, hopper: bool = False) -> dict:
    """A time_scale table: 1 (as modelled), its σ the model's out-of-sample error set by nested leave-one-source-out
    (calib/band.py, committed in calib/data/band_fit.json), so that every band carries it; `hopper`: the single
    kernel on NVLink4, where no released row times it, keeps the assumed tier."""
    per = band["per_source"]
    nested = ", ".join(f"{s} {per[s]['coverage']:.0%}" for s in band["calibration_sources"] if per[s]["coverage"] is not None)
    src = (f"model error of {what}: the least lognormal sigma at which the 5-95 % band covers {band['target']:.0%} of the rows of "
           f"{' + '.join(band['calibration_sources'])} (mean over the sources, each at its leave-one-source-out "
           f"prediction, one run's measured noise beside it where the source times a cell twice; nested coverage "
           f"{nested}; {CR.BAND_CMD})")
    if hopper:
        return sec(f"assumed: no released row times a multimem kernel on Hopper; the SM100 {src} is "
                   f"{band['sigma_m']:.2f}, the tier's 0.30 stands", "assumed", time_scale=1.0)
    return {**sec(src, "published-measurement", time_scale=1.0), "uncertainty_rel": {"time_scale": round_value(band["sigma_m"])}}


def with_model_error(p):
    """asynctp.time_scale of torch's fused ops (model_error_table)."""
    p["asynctp"]["_time_scale"] = model_error_table(CR.load_band_fit(), "torch's fused ops")
    return p


def with_capacity(name, p):
    cap, src = HBM_CAPACITY[name]
    p["memory"]["_capacity"] = sec(src, "datasheet", hbm_capacity_bytes=cap)
    return p


def fi_oneshot_latency() -> tuple[float, str]:
    """FlashInfer's one-shot AR+RMSNorm latency on NVLink5: SGLANG_PR7621's B200 TP 8 decode-size kernel time, (s,
    the number as published in us)."""
    us = C["b200_collectives"]["sglang_fi_oneshot_us"]
    return float(us) * 1e-6, us


def build_all(gpu_checks=None):
    """Every built-in profile tree; the single-GPU calibration results `gpu_checks` names (profile name -> fit.json,
    from --gpu-check) are folded in, nothing else."""
    if not C:
        C.update(CR.load_components())
    fits = asynctp_fits()
    hop, bw, kern = fits["hopper"], fits["blackwell"], fits["kernel"]
    ar2 = fits["family"]["with"]["b200_nccl_all_reduce_tp2"]
    sync_h100 = _fit_spec(hop, None, "asynctp.barrier_s", "per-barrier GPU cost")
    host_h100 = _fit_spec(hop, "KRAKEN_PR19", "asynctp.host_op_s", "the KRAKEN_PR19 host's issue time per torch call")
    sync_h100_assumed = _assumed(sync_h100, "= the H100 fit")
    sync_bw = _fit_spec(bw, None, "asynctp.barrier_s", "per-barrier GPU cost")
    pull_bw = _fit_spec(bw, None, "asynctp.copy_engine_bw_bytes_per_s", "copy-engine pull bandwidth")
    slow_bw = _fit_spec(bw, None, "asynctp.compute_slowdown", "chunk-GEMM slowdown while pulls run")
    host_b300 = _fit_spec(bw, "PT_ISSUE179770", "asynctp.host_op_s", "the PT_ISSUE179770 (B300) host's issue time")
    host_gb200 = _fit_spec(bw, "FLASHINFER_GB200_GEMMRS_MATRIX", "asynctp.host_op_s",
                           "the FLASHINFER_GB200_GEMMRS_MATRIX (GB200, Grace) host's issue time")
    host_assumed = HOST_OP
    nccl_h200, nccl_b200 = C["nccl_regimes"]["h200"], C["nccl_regimes"]["b200"]
    h = nccl_regimes(asynctp_section(h100(), sync_h100, host_h100), nccl_h200, "assumed",
                     "assumed: the H200 fit (H100 and H200 share NVLink4 and the NVSwitch generation); ")
    h = calibrated_overrides(h, "h200-sxm", gpu_checks, keys=SAME_DIE_KEYS,
                             note="; measured on an H200, which has the H100's GH100 die and 132 SMs")
    fam = "same NVLink5/NVSwitch and SM100 family as the Blackwell fit"
    b = _with_pull(asynctp_section(b200(), _assumed(sync_bw, fam), host_assumed), _assumed(pull_bw, fam))
    b = _with_slowdown(b, _assumed(slow_bw, fam))
    b = _gb200_rs(b, bw, ar2, tier_note="GB200 value carried to B200 (same NVLink5 switch)")
    b = kernel_section(b, kern, "nvlink5")
    b = nccl_regimes(b, nccl_b200, "published-measurement")
    gb = _with_slowdown(_with_pull(asynctp_section(gb200(b200()), sync_bw, host_gb200), pull_bw), slow_bw)
    profiles = {"h100-sxm": h,
                "h200-sxm": calibrated_overrides(nccl_regimes(asynctp_section(h200(h100()), sync_h100_assumed,
                                                                              host_assumed), nccl_h200,
                                                              "published-measurement"), "h200-sxm", gpu_checks),
                "h800": asynctp_section(h800(h100()), sync_h100_assumed, host_assumed),
                "b200": b,
                "b300": kernel_section(_gb200_rs(_with_slowdown(_with_pull(asynctp_section(b300(fits["family"]), sync_bw,
                                                                                           host_b300), pull_bw), slow_bw),
                                                 bw, ar2, tier_note="GB200 value carried to B300 (same NVLink5 switch)"),
                                       kern, "nvlink5"),
                "gb200-nvl72": kernel_section(_gb200_rs(gb, bw, ar2), kern, "nvlink5"),
                "a100-sxm-80gb": asynctp_section(a100(), sync_h100_assumed, host_assumed),
                "a800": asynctp_section(a800(), sync_h100_assumed, host_assumed),
                "l40s": asynctp_section(l40s(), sync_h100_assumed, host_assumed),
                "mi300x": asynctp_section(mi300x(), sync_h100_assumed, host_assumed)}
    profiles["h800"] = calibrated_overrides(profiles["h800"], "h200-sxm", gpu_checks, keys=SAME_DIE_KEYS,
                                            note="; measured on an H200, which has the H100's GH100 die and 132 SMs")
    profiles["gb300-nvl72"] = gb300(profiles["b300"])
    for name in ("h100-sxm", "h200-sxm", "h800"):
        profiles[name] = kernel_section(profiles[name], kern, "nvlink4")
    return {name: with_capacity(name, with_model_error(custom_reduce_scatter(p))) for name, p in profiles.items()}


def round_tree(tree):
    """Every float of a profile tree rounded to 4 significant digits (what the TOML files hold), so that a
    different numpy/scipy build, which moves a fit in its 11th digit, writes the same file."""
    if isinstance(tree, dict):
        return {k: round_tree(v) for k, v in tree.items()}
    return round_value(tree)


def same_values(a, b, rel=CHECK_REL_TOL, path=""):
    """First difference between two parsed profile trees ('' if none): numbers compare with a relative
    tolerance, everything else exactly."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}{k}: only in {'the file' if k in a else 'the generator'}"
            d = same_values(a[k], b[k], rel, f"{path}{k}.")
            if d:
                return d
        return ""
    num = (int, float)
    if isinstance(a, num) and isinstance(b, num) and not isinstance(a, bool) and not isinstance(b, bool):
        return "" if math.isclose(a, b, rel_tol=rel, abs_tol=0.0) else f"{path[:-1]}: file {a!r}, generator {b!r}"
    return "" if a == b else f"{path[:-1]}: file {a!r}, generator {b!r}"


CONSISTENCY_MSG_BYTES = 64 * MiB  # a message where every collective is bandwidth-bound
CONSISTENCY_BAND = (0.5, 1.5)  # t_AR / (t_RS + t_AG): an all-reduce is a reduce-scatter and an all-gather


def inconsistent_collectives(name, tree) -> list[str]:
    """NCCL entries at one TP whose all-reduce is far slower or faster than its reduce-scatter + all-gather at
    64 MiB (outside CONSISTENCY_BAND): a fit to latency-bound points, or an assumption contradicting a fit; and any
    collective whose bus bandwidth exceeds the link's (busBW is at most the per-GPU link bandwidth: nccl-tests'
    convention; NVLS all-reduce up to 2(W-1)/(W+1) x it)."""
    prof = profile_from_dict(tree, name)
    out = []
    link = prof.interconnect.link_bw_bytes_per_s
    for impl, per_tp in prof.collectives.items():
        for tp, c in per_tp.items():
            # NVLS all-reduce reduces in the switch: each GPU sends S and receives S instead of the ring's
            # 2(W-1)/W·S each way, so its busBW may reach 2(W-1)/(W+1) x the link (docs/model.md §3)
            nvls = impl.startswith("nccl_all_reduce") and prof.kind == "nvswitch" and tp >= 4
            cap = link * (2.0 * (tp - 1) / (tp + 1) if nvls else 1.0)
            if c.bus_bw_bytes_per_s > cap * (1 + 1e-9):
                out.append(f"{name} {impl} tp{tp}: busBW {c.bus_bw_bytes_per_s / 1e9:.0f} GB/s above the link's "
                           f"{link / 1e9:.0f} GB/s")
    s = float(CONSISTENCY_MSG_BYTES)
    for tp in prof.collective_tps("nccl_all_reduce"):
        if tp not in prof.collective_tps("nccl_reduce_scatter") or tp not in prof.collective_tps("nccl_all_gather"):
            continue
        ar = F.t_all_reduce_s(s, *prof.collective("nccl_all_reduce", tp), tp)
        rs = F.t_reduce_scatter_s(s, *prof.collective("nccl_reduce_scatter", tp), tp)
        ag = F.t_all_gather_s(s, *prof.collective("nccl_all_gather", tp), tp)
        ratio = float(ar / (rs + ag))
        if not CONSISTENCY_BAND[0] <= ratio <= CONSISTENCY_BAND[1]:
            out.append(f"{name} tp{tp}: all-reduce {ar * 1e6:.0f} us vs reduce-scatter + all-gather "
                       f"{(rs + ag) * 1e6:.0f} us at 64 MiB (ratio {ratio:.2f})")
    return out


def range_line(prof) -> str:
    """One line: every quantity of `prof` lies inside its plausible range, and the dimensioned one closest to an
    edge (in decades, log10 of value/edge; 0 = on it)."""
    from costmodel.profile import value_range

    def margin(key, v):
        r = value_range(key)
        lo = math.inf if r.lo <= 0 or v <= 0 else math.log10(v / r.lo)
        return min(lo, math.log10(r.hi / v) if v > 0 else math.inf)

    vals = prof.values()  # all checked on load; the edge reported among the dimensioned ones (fractions sit near 1)
    key = min((k for k in vals if value_range(k).unit), key=lambda k: margin(k, vals[k]))
    r = value_range(key)
    return (f"{prof.name:14s} {len(vals):3d} quantities inside their ranges; closest to an edge: {key} = "
            f"{vals[key]:g} in {r.text()} ({margin(key, vals[key]):.2f} decades)")


def gpu_check_args(dirs) -> dict:
    """--gpu-check DIR ... as profile name -> fit.json: each a <profile>-gpu-check folder of a built-in profile whose
    fit.json git tracks (committed data only: an untracked result never changes a built-in profile)."""
    import subprocess

    out = {}
    for d in dirs:
        path = Path(d).resolve()
        name = path.name.removesuffix("-gpu-check")
        fit = path / "fit.json"
        if not path.name.endswith("-gpu-check") or not (OUT / f"{name}.toml").exists():
            raise ValueError(f"--gpu-check {d}: expected calib/data/<built-in profile>-gpu-check")
        if not fit.exists():
            raise ValueError(f"--gpu-check {d}: no fit.json (run calib/gpu_check.sh first)")
        tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--error-unmatch", str(fit)],
                                 capture_output=True).returncode == 0
        if not tracked:
            raise ValueError(f"--gpu-check {d}: {fit.name} is not committed (commit it with its provenance first)")
        out[name] = fit
    return out


def committed_gpu_checks() -> list[Path]:
    """Every calib/data/<built-in profile>-gpu-check folder whose fit.json git tracks: what the shipped profiles fold."""
    import subprocess

    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "calib/data/*-gpu-check/fit.json"], capture_output=True,
                         text=True).stdout.split()
    return sorted((ROOT / f).parent for f in out if (OUT / f"{Path(f).parent.name.removesuffix('-gpu-check')}.toml").exists())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help=f"exit 1 if a file's parsed values differ from the generator's (relative tolerance {CHECK_REL_TOL:g})")
    ap.add_argument("--gpu-check", action="append", default=[], metavar="DIR",
                    help="fold only these committed single-GPU calibrations (calib/data/<profile>-gpu-check, with "
                         "its fit.json) into their profiles (default: every committed one; an untracked result is "
                         "never folded)")
    args = ap.parse_args(argv)
    try:
        checks = gpu_check_args(args.gpu_check or committed_gpu_checks())
    except ValueError as e:
        print(f"build_profiles: error: {e}", file=sys.stderr)
        return 2
    bad = []
    try:
        C.update(CR.load_components())
        trees = json.dumps(family_trees(), indent=1, sort_keys=True) + "\n"
    except TpcostError as e:
        print(f"build_profiles: {e}", file=sys.stderr)
        return 1
    if args.check:
        if not CR.FAMILY_TREES.exists() or json.loads(CR.FAMILY_TREES.read_text()) != json.loads(trees):
            bad.append(f"{CR.FAMILY_TREES.relative_to(ROOT)} (the family fits' start trees)")
    else:
        atomic_write_text(CR.FAMILY_TREES, trees)  # first: the family fit is made from them
    try:
        built = build_all(checks)
    except TpcostError as e:
        print(f"build_profiles: {e}", file=sys.stderr)
        return 1
    for name, tree in built.items():
        tree = round_tree(tree)
        bad += [f"inconsistent collectives: {x}" for x in inconsistent_collectives(name, tree)]
        text = "# Generated by tools/build_profiles.py from datasheets, data/reference (source_id) and calib/data.\n" \
               "# Do not edit by hand: change the generator and rerun it.\n" + dump_profile(tree)
        prof = profile_from_dict(tree, name)  # validates, the plausible ranges included (docs/profiles.md)
        if args.check:
            print(range_line(prof))
        path = OUT / f"{name}.toml"
        if args.check:
            diff = same_values(tomllib.loads(path.read_text()), tomllib.loads(text)) if path.exists() else "missing"
            if diff:
                bad.append(f"{name} ({diff})")
        else:
            atomic_write_text(path, text)
    if bad:
        print("\n".join(x if x.startswith("inconsistent") else f"out of date: {x} (run python tools/build_profiles.py)"
                        for x in bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
