"""Named fits: the measured tables of the built-in profiles, one function per released source (or
pair of sources), each turning a committed fit result (calib/data, read through calib/results.py)
into the sourced tables it supplies. A GPU's spec file (calib/gpus/<name>.toml) names them in its
steps; calib/assemble.py applies them in order. Each is a pure tree transform `fit(tree, ctx) ->
tree` on a copy; nothing is fitted here (the fits are calib.components, calib.reference,
calib.kernel_fit and calib.band, each committed with its command)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from collections.abc import Callable

from calib.derive import one_ring, round_value, scaled_collectives, sec
from costmodel import formulas as F


@dataclass(frozen=True)
class Fits:
    """The committed results a step may read: component fits (always), the family fits (None while
    the family fits' own start trees are built), the single-kernel fit and the band (None while the
    fits that read profiles run)."""

    comps: dict
    family: dict | None = None
    kernel: dict | None = None
    band: dict | None = None
    gpu_checks: dict = field(default_factory=dict)


NAMED: dict[str, Callable[[dict, Fits], dict]] = {}


def named(fn):
    NAMED[fn.__name__] = fn
    return fn


@named
def mleng_h200_collectives(p: dict, fits: Fits) -> dict:
    """8xH200 NCCL: all-reduce α-β (MLENG_NET_README latency + MLENG_NET_SHARP 16 GiB busBW);
    SHARP's all-gather and reduce-scatter busBW at 16 GiB (Simple, and LL at its payload share) on
    the H100 latency; the all-reduce busBW at TP 4/6 capped at SHARP's ring."""
    p = copy.deepcopy(p)
    h2 = fits.comps["h200_collectives"]
    a, bw, err = (
        h2["nccl_all_reduce_tp8"][k] for k in ("latency_s", "bus_bw_bytes_per_s", "rms_rel_err")
    )
    p["collectives"]["nccl_all_reduce"]["tp8"] = sec(
        "MLENG_NET_README 8xH200 NCCL all-reduce median latency 8 B-1 MiB + MLENG_NET_SHARP 16 "
        "GiB ring busBW; fit rms "
        f"rel err {err:.3f} (calib/reference.py)",
        "published-measurement",
        latency_s=a,
        bus_bw_bytes_per_s=bw,
    )
    for impl, key in (("nccl_all_gather", "all_gather"), ("nccl_reduce_scatter", "reduce_scatter")):
        bw = h2[f"sharp_{key}_tp8_bus_bw_bytes_per_s"]
        # Simple, and LL at its share
        for name, share in (
            (impl, 1.0),
            (impl + "_small", F.LL_PAYLOAD_FRACTION),
        ):
            e = p["collectives"][name]["tp8"]
            p["collectives"][name]["tp8"] = sec(
                f"latency: {e['source'].split(';')[0]} (H100); busBW: "
                f"{'' if share == 1 else f'{share} x '}"
                f"MLENG_NET_SHARP 8xH200 {key} 16 GiB",
                "published-measurement",
                latency_s=e["latency_s"],
                bus_bw_bytes_per_s=share * bw,
            )
    for w in (4, 6):
        ring = h2[f"sharp_ring_tp{w}"]
        e = p["collectives"]["nccl_all_reduce"][f"tp{w}"]
        e["bus_bw_bytes_per_s"] = min(e["bus_bw_bytes_per_s"], float(ring) * 1e9)
        e["source"] += f"; busBW capped at MLENG_NET_SHARP 8GiB H200 TP{w} ring {ring} GB/s"
    return p


H800_NVLS_AR_BUSBW = 215e9  # NCCL_ISSUE1374: 8 x H800 NCCL all-reduce (NVLS) busBW
H100_NVLS_AR_BUSBW = 480e9  # NCCL_ISSUE1455: 8 x H100 NCCL all-reduce (NVLS) busBW


@named
def nccl_issue1374_h800(p: dict, fits: Fits) -> dict:
    """H800: the collectives of the tree (H100's) scaled by the H800/H100 NVLS all-reduce busBW
    ratio, the all-reduce from the same ring as the all-gather and reduce-scatter (one_ring), and at
    TP 8 NCCL_ISSUE1374's own all-reduce."""
    p = copy.deepcopy(p)
    coll = one_ring(
        scaled_collectives(
            p["collectives"],
            H800_NVLS_AR_BUSBW / H100_NVLS_AR_BUSBW,
            "NCCL_ISSUE1374 8xH800 NVLS busBW 215 vs NCCL_ISSUE1455 8xH100 480 GB/s",
        )
    )
    e = coll["nccl_all_reduce"]["tp8"]
    coll["nccl_all_reduce"]["tp8"] = sec(
        "busBW: NCCL_ISSUE1374 8xH800 NCCL all-reduce busBW 215 GB/s (NVLS, measured on "
        "H800); latency: " + e["source"].split(" with busBW")[0] + " (tier: the "
        "latency's)",
        "assumed",
        latency_s=e["latency_s"],
        bus_bw_bytes_per_s=H800_NVLS_AR_BUSBW,
    )
    p["collectives"] = coll
    return p


@named
def mleng_net_readme_b200(p: dict, fits: Fits) -> dict:
    """8xB200 NCCL at TP 8 (MLENG_NET_README): the all-reduce α-β and the ring all-gather /
    reduce-scatter's two regimes (LL at half the Simple busBW), each through its 1 KiB latency,
    half-peak payload and 16 GiB busBW."""
    p = copy.deepcopy(p)
    for impl, f in fits.comps["b200_collectives"]["readme"].items():
        how = (
            "alpha-beta fit"
            if impl == "nccl_all_reduce"
            else f"NCCL {'LL' if impl.endswith('_small') else 'Simple'} regime of the two-regime "
            "ring fit (LL at half the "
            "Simple busBW, calib.fit.fit_ring_regimes)"
        )
        p["collectives"].setdefault(impl, {})["tp8"] = sec(
            f"MLENG_NET_README 8xB200: {how} to the 1 KiB median latency {f['latency_us']} us, "
            "half of the 16 GiB busBW "
            f"{f['busbw_gb_s']} GB/s at its half-peak payload {f['half_peak_bytes'] / F.MiB:.0f} "
            "MiB, and that busBW at "
            f"16 GiB; rms log err {f['rms_rel_err']:.3f} (calib/components.py)",
            "published-measurement",
            latency_s=f["latency_s"],
            bus_bw_bytes_per_s=f["bus_bw_bytes_per_s"],
        )
    return p


@named
def b200_tp2(p: dict, fits: Fits) -> dict:
    """B200 TP 2: NCCL_PR2307's stock reduce-scatter at 4 MiB (all-gather assumed the same ring) on
    the TP 2 all-reduce latency, and VLLM_PR42324's pynccl and torch symm-mem all-reduce fits. The
    prototype's tuned 1-16 MiB rows are not the NCCL vLLM runs."""
    p = copy.deepcopy(p)
    bc, coll = fits.comps["b200_collectives"], p["collectives"]
    rs2 = bc["nccl_rs_tp2"]
    for impl in ("nccl_reduce_scatter", "nccl_all_gather"):
        coll[impl]["tp2"] = sec(
            f"NCCL_PR2307 B200 TP2 stock reduce-scatter 4 MiB {rs2['stock_4mib_us']} us, latency "
            "from the "
            "VLLM_PR42324 TP2 all-reduce fit"
            + (
                ""
                if impl == "nccl_reduce_scatter"
                else "; all-gather assumed = reduce-scatter (same ring, no reduction)"
            ),
            "published-measurement" if impl == "nccl_reduce_scatter" else "assumed",
            latency_s=rs2["latency_s"],
            bus_bw_bytes_per_s=rs2["bus_bw_bytes_per_s"],
        )
    for impl, metric in (
        ("nccl_all_reduce", "allreduce_time_pynccl"),
        ("symm_mem_multimem", "allreduce_time_torch_symm_mem_multimem"),
        ("symm_mem_two_shot", "allreduce_time_torch_symm_mem_two_shot"),
    ):
        f = bc["vllm_pr42324_tp2"][metric]
        coll[impl]["tp2"] = sec(
            f"VLLM_PR42324 B200 WS=2 {metric}; fit rms rel err {f['rms_rel_err']:.3f} over "
            f"{f['n']} points",
            "published-measurement",
            latency_s=f["latency_s"],
            bus_bw_bytes_per_s=f["bus_bw_bytes_per_s"],
        )
    return p


def fi_oneshot_latency(fits: Fits) -> tuple[float, str]:
    """FlashInfer's one-shot AR+RMSNorm latency on NVLink5: SGLANG_PR7621's B200 TP 8 decode-size
    kernel time (s, and the number as published in us)."""
    us = fits.comps["b200_collectives"]["sglang_fi_oneshot_us"]
    return float(us) * 1e-6, us


def _fi_tp2(p: dict, fits: Fits, own: bool) -> dict:
    """FlashInfer's fused AR+RMSNorm one-shot and two-shot at TP 2 from the B300 large-message rows
    (calib/reference.py fi_tp2_b300): the B300's own measurement (`own`), or assumed for another
    NVLink5 GPU."""
    p = copy.deepcopy(p)
    fi2, (lat_s, _) = fits.comps["fi_tp2_b300"], fi_oneshot_latency(fits)
    one, two = fi2["flashinfer_ar_rmsnorm"], fi2["flashinfer_ar_rmsnorm_twoshot"]
    lat = "latency: SGLANG_PR7621's B200 kernel time (fi_oneshot_latency)"
    via = "(a B300, which has B200's NVLink5)"
    tier, pre1, pre2 = (
        ("published-measurement", "busBW: ", "")
        if own
        else ("assumed", "assumed: busBW = ", "assumed: = ")
    )
    coll = p["collectives"]
    coll["flashinfer_ar_rmsnorm"]["tp2"] = sec(
        f"{pre1}{one['source']}{'' if own else ' ' + via}; {lat}",
        tier,
        latency_s=lat_s,
        bus_bw_bytes_per_s=one["bus_bw_bytes_per_s"],
    )
    coll["flashinfer_ar_rmsnorm_twoshot"]["tp2"] = sec(
        f"{pre2}{two['source']}{'' if own else ' ' + via}",
        tier,
        latency_s=two["latency_s"],
        bus_bw_bytes_per_s=two["bus_bw_bytes_per_s"],
    )
    return p


@named
def flashinfer_ar_rmsnorm_nvlink5(p: dict, fits: Fits) -> dict:
    """FlashInfer's fused AR+RMSNorm on an NVLink5 GPU: latency SGLANG_PR7621's B200 TP 8 kernel,
    busBW TRTLLM_PR14534's GB200 4-rank one-shot fit (TP 2/4/8); at TP 2 up to vLLM's 64 MB limit
    the B300's large-message rows (assumed)."""
    p = copy.deepcopy(p)
    a, us = fi_oneshot_latency(fits)
    bw, err, harness = (
        fits.comps["b200_collectives"]["trtllm_oneshot_tp4"][k]
        for k in ("bus_bw_bytes_per_s", "rms_rel_err", "harness_s")
    )
    for w in (2, 4, 8):
        lamport = "" if w == 8 else f"; the one-shot Lamport kernel at TP{w} assumed no slower"
        p["collectives"]["flashinfer_ar_rmsnorm"][f"tp{w}"] = sec(
            f"latency: SGLANG_PR7621 B200 TP8 decode-size fused AR+RMSNorm kernel {us} us (message "
            "size not stated, "
            f"taken as latency{lamport}); busBW: "
            f"TRTLLM_PR14534 GB200 4-rank one-shot fit (rms rel err {err:.3f}), whose intercept "
            "holds its benchmark's "
            f"{harness * 1e6:.1f} us floor beside the kernel's latency (NCCL's own small "
            "all-reduce on a GB200 NVL72 is "
            f"8 us, NCCLTESTS_ISSUE333); used for TP{w}",
            "published-measurement" if w == 8 else "assumed",
            latency_s=a,
            bus_bw_bytes_per_s=bw,
        )
    return _fi_tp2(p, fits, own=False)


@named
def flashinfer_b300_tp2(p: dict, fits: Fits) -> dict:
    """The B300's own FlashInfer AR+RMSNorm rows at TP 2 (one-shot and two-shot, up to vLLM's 64 MB
    limit)."""
    return _fi_tp2(p, fits, own=True)


@named
def vllm_pr37756_b300(p: dict, fits: Fits) -> dict:
    """B300's vLLM all-reduce implementations: TP 6 fitted to VLLM_PR37756; at the other TPs the
    tree's values scaled by that fit's ratio to the TP 6 value, latency and busBW each (same GPU and
    switch; tier assumed)."""
    p = copy.deepcopy(p)
    for impl, f in fits.comps["b300_vllm_ar"].items():
        per = p["collectives"][impl]
        old = per["tp6"]
        ra, rb = (
            f["latency_s"] / old["latency_s"],
            f["bus_bw_bytes_per_s"] / old["bus_bw_bytes_per_s"],
        )
        for key, e in per.items():
            if key == "tp6":
                per[key] = sec(
                    f["source"],
                    "published-measurement",
                    latency_s=f["latency_s"],
                    bus_bw_bytes_per_s=f["bus_bw_bytes_per_s"],
                )
            else:
                per[key] = sec(
                    f"assumed: {e['source']}; latency x {ra:.3g} and busBW x {rb:.3g}, the B300 "
                    "TP6 fit's "
                    "ratio to that assumption (VLLM_PR37756)",
                    "assumed",
                    latency_s=e["latency_s"] * ra,
                    bus_bw_bytes_per_s=e["bus_bw_bytes_per_s"] * rb,
                )
    return p


@named
def nccltests_issue333_gb200(p: dict, fits: Fits) -> dict:
    """GB200 NVL72's 4-GPU NCCL all-reduce latency at <= 1 KB (NCCLTESTS_ISSUE333); its busBW stays
    the tree's."""
    p = copy.deepcopy(p)
    lat_us = fits.comps["gb200_nccl_ar_tp4_latency_us"]
    e = p["collectives"]["nccl_all_reduce"]["tp4"]
    p["collectives"]["nccl_all_reduce"]["tp4"] = sec(
        f"latency: NCCLTESTS_ISSUE333 GB200 4-GPU all-reduce {lat_us} us at <=1 KB; busBW: "
        f"{e['source']}",
        "published-measurement",
        latency_s=float(lat_us) * 1e-6,
        bus_bw_bytes_per_s=e["bus_bw_bytes_per_s"],
    )
    return p


@named
def pt_issue179770_b300_rs_latency(p: dict, fits: Fits) -> dict:
    """The B300's own NCCL reduce-scatter latency at 1-12 MiB, fitted to the sequential arm of
    PT_ISSUE179770 (scaled_mm + NCCL RS) with its family's start tree (calib/reference.py
    b300_rs_latency_fit, committed with the family fits); the busBW stays the 16 GiB value. Needs
    the family fits: skipped while their start trees are built."""
    if fits.family is None:
        return p
    p = copy.deepcopy(p)
    rs, fit = (
        p["collectives"]["nccl_reduce_scatter"]["tp8"],
        fits.family["with"]["b300_nccl_rs_latency"],
    )
    p["collectives"]["nccl_reduce_scatter"]["tp8"] = sec(
        f"latency: {fit['source']} (1-12 MiB messages); busBW: {rs['source']}",
        "published-measurement",
        latency_s=fit["value"],
        bus_bw_bytes_per_s=rs["bus_bw_bytes_per_s"],
    )
    p["collectives"]["nccl_reduce_scatter"]["tp8"]["uncertainty_rel"] = {
        "latency_s": round_value(fit["sigma_rel"])
    }
    return p
