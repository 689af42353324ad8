"""Fits of profile parameters to the published measurements in data/reference/components.csv and
fused_ops.csv (copies of ../shared/reference; sources in data/reference/SOURCES.md,
FUSED_OPS_SOURCES.md).

calib/components.py runs the component fits (committed as calib/data/component_fits.json); `python
-m calib.reference` runs the joint fused-op fits per GPU family from the start trees
calib/assemble.py builds from the GPU specs (committed as calib/data/family_fit.json).
tools/build_profiles.py assembles the profiles from both (calib/results.py). Each fit returns values
plus a `source` string naming the source_ids and row selection.
"""

from __future__ import annotations

import csv
import functools
import re
from pathlib import Path

import numpy as np

from calib import fit as fitting
from calib.fit import fit_least_squares, worst_unidentified  # the one fitting core and rule
from calib.assemble import family_trees
from calib.results import FAMILY_CMD, FAMILY_FIT, fit_to_json, profile_digits, trees_digest
from costmodel import formulas as F

CSV = Path(__file__).resolve().parents[1] / "data" / "reference" / "components.csv"
_UNITS = {
    "B": 1,
    "KB": 1024,
    "KIB": 1024,
    "MB": 1024**2,
    "MIB": 1024**2,
    "GB": 1024**3,
    "GIB": 1024**3,
}


def rows(source_id=None, **eq):
    out = []
    with open(CSV, newline="") as f:
        for r in csv.DictReader(f):
            if source_id and r["source_id"] != source_id:
                continue
            if all((r[k] == v) if not callable(v) else v(r[k]) for k, v in eq.items()):
                out.append(r)
    return out


def size_in_notes(text: str) -> float:
    """First 'payload 32KiB' / 'message 0.5 MB' / '= 8 KiB' size in a notes string, in bytes (binary
    units)."""
    m = re.search(
        r"(?:payload|message|buffer|=)\s*(\d+(?:\.\d+)?)\s*(GiB|MiB|KiB|GB|MB|KB|B)\b", text
    )
    if not m:
        raise ValueError(f"no size in {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2).upper()]


def fit_alpha_beta(msg_bytes, t_s, factor):
    """calib.fit.fit_alpha_beta's (α s, busBW B/s, rms log error) of t = α + factor·S/busBW."""
    _, res = fitting.fit_alpha_beta(msg_bytes, t_s, factor)
    return res["values"]["latency_s"], res["values"]["bus_bw_bytes_per_s"], res["rms_log_residual"]


def ar_factor(w):
    return float(F.bus_bw_factor("all_reduce", w))


def ag_factor(w):
    return float(F.bus_bw_factor("all_gather", w))


def _ms(v):
    return float(v) * 1e-3


def fit_vllm_bench(
    source_id, world, metric, gpu_match="H100", hidden=8192, extra_points=(), max_bytes=None
):
    """AR fit to vLLM benchmark_device_communicators rows (ms, message = tokens·hidden·2), over the
    messages up to `max_bytes` (None: all)."""
    rs = rows(source_id, num_gpus=str(world), metric=metric, gpu=lambda g: g.startswith(gpu_match))
    S = [
        float(r["M_or_tokens"]) * hidden * 2 if r["M_or_tokens"] else size_in_notes(r["notes"])
        for r in rs
    ]
    t = [_ms(r["baseline_value"]) for r in rs]
    if max_bytes is not None:
        S, t = [s for s in S if s <= max_bytes], [x for s, x in zip(S, t) if s <= max_bytes]
    for s_, t_ in extra_points:
        S.append(s_)
        t.append(t_)
    a, bw, err = fit_alpha_beta(S, t, ar_factor(world))
    return dict(latency_s=a, bus_bw_bytes_per_s=bw, rms_rel_err=err, n=len(S))


def b300_vllm_ar_fits() -> dict:
    """B300 TP 6 curves of vLLM's own all-reduce implementations from VLLM_PR37756 (vLLM's
    benchmark_device_communicators), each over the messages vLLM can dispatch it at TP 6 on sm103:
    custom AR below its limit, torch symm-mem up to its own (costmodel.vllm_tables.dispatch_limits).
    impl -> fit."""
    from costmodel.vllm_tables import Vllm, dispatch_limits

    lim = dispatch_limits(Vllm(), "10.3", 6)
    ca, sm = lim["custom_ar_max_bytes"] - 1, lim["symm_mem_max_bytes"]
    spec = {
        "custom_ar_1stage": ("allreduce_time_custom_allreduce_1stage", ca),
        "custom_ar_2stage": ("allreduce_time_custom_allreduce_2stage", ca),
        "symm_mem_multimem": ("allreduce_time_torch_symm_mem_multimem", sm),
        "symm_mem_two_shot": ("allreduce_time_torch_symm_mem_two_shot", sm),
    }
    out = {}
    for impl, (metric, top) in spec.items():
        f = fit_vllm_bench("VLLM_PR37756", 6, metric, gpu_match="B300", max_bytes=top)
        f["source"] = (
            f"VLLM_PR37756 B300 WS=6 {metric} 16 KiB-{top / F.MiB:.0f} MiB (the sizes vLLM "
            "dispatches it); "
            f"fit rms rel err {f['rms_rel_err']:.3f} over {f['n']} points (calib/reference.py)"
        )
        out[impl] = f
    return out


def asymptote_point(busbw_gb_s, world, size=2 * 1024**3, factor=None):
    """A (size, time) point standing for a measured large-message bus bandwidth."""
    factor = ar_factor(world) if factor is None else factor
    return size, factor * size / (busbw_gb_s * 1e9)


def h100_collectives():
    """H100 SXM collective fits. Returns {impl: {tpN: dict(values..., source=...)}}."""
    out: dict[str, dict[str, dict]] = {}

    link = 450e9  # NVLink4 per direction

    def put(impl, w, fit, source):
        bw = fit["bus_bw_bytes_per_s"]
        # only NVLS/multimem reduces in the switch
        if "multimem" not in impl and bw > F.RING_LINK_RATIO * link:
            bw = F.RING_LINK_RATIO * link
            source += (
                f" (fitted busBW {fit['bus_bw_bytes_per_s'] / 1e9:.0f} GB/s capped at "
                f"{F.RING_LINK_RATIO} x 450 GB/s link, NCCL_ISSUE1455 ring/link ratio)"
            )
        out.setdefault(impl, {})[f"tp{w}"] = dict(
            latency_s=fit["latency_s"],
            bus_bw_bytes_per_s=bw,
            source=f"{source}; fit rms rel err {fit['rms_rel_err']:.3f} over {fit['n']} points "
            "(calib/reference.py)",
            tier="published-measurement",
        )

    ring = rows("NCCL_ISSUE1455")
    ring_bw = {int(r["num_gpus"]): float(r["baseline_value"]) for r in ring}
    # NCCL all-reduce
    for w in (4, 6):
        f = fit_vllm_bench(
            "VLLM_PR24111",
            w,
            "allreduce_time_pynccl",
            extra_points=[asymptote_point(ring_bw.get(w, 367.0), w)],
        )
        put(
            "nccl_all_reduce",
            w,
            f,
            f"VLLM_PR24111 pynccl TP{w} 0.5-4 MB + NCCL_ISSUE1455 TP{w} large-message busBW",
        )
    td = [r for r in rows("TD_ISSUE57") if "2MB" not in r["notes"].split(";")[0]]
    S = [size_in_notes(r["notes"]) for r in td] + [asymptote_point(ring_bw[8], 8)[0]]
    t = [float(r["baseline_value"]) * 1e-6 for r in td] + [asymptote_point(ring_bw[8], 8)[1]]
    a, bw, err = fit_alpha_beta(S, t, ar_factor(8))
    put(
        "nccl_all_reduce",
        8,
        dict(latency_s=a, bus_bw_bytes_per_s=bw, rms_rel_err=err, n=len(S)),
        "TD_ISSUE57 8xH100 NCCL all-reduce 128 B-16 MB (2 MB outlier dropped) + NCCL_ISSUE1455 TP8 "
        "busBW",
    )
    # TP2: only the large-message ring busBW is published; latency taken from the TP4 fit
    out["nccl_all_reduce"]["tp2"] = dict(
        latency_s=out["nccl_all_reduce"]["tp4"]["latency_s"],
        bus_bw_bytes_per_s=ring_bw[2] * 1e9,
        source="NCCL_ISSUE1455 TP2 ring busBW; latency = TP4 fit (no TP2 small-message data)",
        tier="published-measurement",
    )
    # AG / RS TP8: NCCL's LL and Simple ring regimes (calib.fit.fit_ring_regimes) over Megatron's
    # 2-128 MiB points and the ring's 16 GiB busBW (NCCLTESTS_ISSUE326: the all-gather's; a ring
    # reduce-scatter moves the same bytes per step); TP2/4 one curve from the ring busBW with the LL
    # regime's (small-message) latency
    ring16 = float(rows("NCCLTESTS_ISSUE326")[0]["baseline_value"])
    for metric, impl in (
        ("allgather_time", "nccl_all_gather"),
        ("reducescatter_time", "nccl_reduce_scatter"),
    ):
        rs = rows("MEGATRON_PR5596", metric=metric)
        S = [size_in_notes(r["notes"]) for r in rs] + [16 * 1024.0**3]
        t = [float(r["baseline_value"]) * 1e-6 for r in rs] + [
            ag_factor(8) * 16 * 1024**3 / (ring16 * 1e9)
        ]
        reg, res = fitting.fit_ring_regimes(S, t, 8)
        src = (
            "NCCL {} regime of the two-regime ring fit (LL at half the Simple busBW, "
            "calib.fit.fit_ring_regimes) "
            f"to MEGATRON_PR5596 8xH100 NCCL {metric} 2-128 MiB + NCCLTESTS_ISSUE326 8xH100 ring "
            f"busBW {ring16:.0f} "
            f"GB/s at 16 GiB"
        )
        err = res["rms_log_residual"]
        put(impl, 8, dict(reg["large"], rms_rel_err=err, n=len(S)), src.format("Simple"))
        put(impl + "_small", 8, dict(reg["small"], rms_rel_err=err, n=len(S)), src.format("LL"))
        a = reg["small"]["latency_s"]
        for w in (2, 4):
            out[impl][f"tp{w}"] = dict(
                latency_s=a,
                bus_bw_bytes_per_s=ring_bw[w] * 1e9,
                source="latency = the MEGATRON_PR5596 TP8 fit's LL regime; busBW = NCCL_ISSUE1455 "
                f"TP{w} ring busBW (a ring AR is RS+AG: same busBW)",
                tier="published-measurement",
            )
    # vLLM custom AR and torch symm-mem (TP4, TP6 measured)
    for impl, metric in (
        ("custom_ar_1stage", "allreduce_time_custom_allreduce_1stage"),
        ("custom_ar_2stage", "allreduce_time_custom_allreduce_2stage"),
        ("symm_mem_multimem", "allreduce_time_torch_symm_mem_multimem"),
        ("symm_mem_two_shot", "allreduce_time_torch_symm_mem_two_shot"),
    ):
        for w in (4, 6):
            f = fit_vllm_bench("VLLM_PR24111", w, metric)
            put(impl, w, f, f"VLLM_PR24111 {metric} TP{w} 0.5-4 MB")
    # TP8 small-message latencies (symm-mem-recipes, 8 GPUs), bandwidth from the TP6 fit
    for impl, metric in (
        ("symm_mem_multimem", "allreduce_time_torch_symm_mem_multimem"),
        ("symm_mem_two_shot", "allreduce_time_torch_symm_mem_2shot"),
        ("custom_ar_1stage", "allreduce_time_triton_1shot"),
    ):
        rs = rows("SYMMMEM_RECIPES_PR3", metric=metric)
        lat = float(np.median([float(r["baseline_value"]) for r in rs])) * 1e-6
        out[impl]["tp8"] = dict(
            latency_s=lat,
            bus_bw_bytes_per_s=out[impl]["tp6"]["bus_bw_bytes_per_s"],
            source=f"latency = median of SYMMMEM_RECIPES_PR3 {metric} 8-256 KiB (8 GPUs); busBW = "
            "TP6 fit",
            tier="published-measurement",
        )
    # VLLM_PR42324 SM9.0 sweep 0.5-128 MiB (world size not in the excerpt; multimem => 6 or 8, used
    # for TP8)
    for impl, metric in (
        ("symm_mem_multimem", "allreduce_time_torch_symm_mem_multimem"),
        ("symm_mem_two_shot", "allreduce_time_torch_symm_mem_two_shot"),
    ):
        rs = rows("VLLM_PR42324", metric=metric, gpu=lambda g: g.startswith("SM 9.0"))
        small = rows("SYMMMEM_RECIPES_PR3", metric=metric.replace("two_shot", "2shot"))
        S = [size_in_notes(r["notes"]) for r in rs] + [size_in_notes(r["notes"]) for r in small]
        t = [_ms(r["baseline_value"]) for r in rs] + [
            float(r["baseline_value"]) * 1e-6 for r in small
        ]
        a, bw, err = fit_alpha_beta(S, t, ar_factor(8))
        put(
            impl,
            8,
            dict(latency_s=a, bus_bw_bytes_per_s=bw, rms_rel_err=err, n=len(S)),
            f"VLLM_PR42324 SM9.0 {metric} 0.5-128 MiB (world size presumed 8) + "
            "SYMMMEM_RECIPES_PR3 8-GPU 8-256 KiB",
        )
    out["custom_ar_2stage"]["tp8"] = dict(
        out["custom_ar_2stage"]["tp6"],
        source="= TP6 fit (no TP8 data; vLLM uses custom AR only < 256 KiB at TP8)",
    )
    # TP2: vLLM PR22086 'standard' AR+RMSNorm (custom AR 1-stage at TP2) and FlashInfer fused
    # one-shot
    pr = rows("VLLM_PR22086")
    S = [float(r["M_or_tokens"]) * 8192 * 2 for r in pr]
    a, bw, err = fit_alpha_beta(S, [_ms(r["baseline_value"]) for r in pr], ar_factor(2))
    put(
        "custom_ar_1stage",
        2,
        dict(latency_s=a, bus_bw_bytes_per_s=bw, rms_rel_err=err, n=len(S)),
        "VLLM_PR22086 H100 TP2 standard AR+RMSNorm 0.5-2 MB",
    )
    # FlashInfer fused AR+RMSNorm at TP2: the H100 points stop at 2 MB (they alone give ~80 GB/s, an
    # early kernel); vLLM runs it to 64 MB. Bandwidth from the B300 32/64 MiB points scaled to
    # NVLink4, latency from the H100 points at that bandwidth.
    out["flashinfer_ar_rmsnorm"], out["flashinfer_ar_rmsnorm_twoshot"] = {}, {}
    for key, b300 in fi_tp2_b300().items():
        bw = b300["bus_bw_bytes_per_s"] * link / B300_LINK_BW
        pts = [
            (
                s_,
                _ms(r["overlap_value"])
                if key == "flashinfer_ar_rmsnorm"
                else _twoshot_s(r["notes"]),
            )
            for s_, r in zip(S, pr)
        ]
        pts = [(s_, t) for s_, t in pts if t is not None]
        lat = float(np.median([max(0.0, t - s_ / bw) for s_, t in pts]))
        out[key]["tp2"] = dict(
            latency_s=lat,
            bus_bw_bytes_per_s=bw,
            tier="assumed",
            source=(
                f"assumed: busBW = {b300['source']} x {link / 1e9:.0f}/{B300_LINK_BW / 1e9:.0f} "
                "GB/s link ratio; latency = median "
                f"of VLLM_PR22086 H100 TP2 0.5-2 MB points less S/busBW ({len(pts)} points; those "
                "points alone give "
                f"{fit_alpha_beta(*zip(*pts), ar_factor(2))[1] / 1e9:.0f} GB/s, an early kernel at "
                "small sizes)"
            ),
        )
    for impl in ("custom_ar_2stage", "symm_mem_two_shot", "symm_mem_multimem"):
        e = out[impl]["tp4"]
        out[impl]["tp2"] = dict(
            e,
            bus_bw_bytes_per_s=min(e["bus_bw_bytes_per_s"], F.RING_LINK_RATIO * link),
            source=e["source"]
            + f"; used for TP2 (no TP2 data), busBW capped at {F.RING_LINK_RATIO} x 450 GB/s link "
            "(NCCL_ISSUE1455 ring/link ratio)",
        )
    # FlashInfer fused AR+RMSNorm: TP4/TP8 one-shot ~ custom AR 1-stage + a norm; two-shot ~
    # symm-mem two-shot
    for w in (4, 8):
        out["flashinfer_ar_rmsnorm"][f"tp{w}"] = dict(
            out["custom_ar_1stage"][f"tp{w}"],
            tier="assumed",
            source="assumed: = custom AR 1-stage fit at this TP ("
            + out["custom_ar_1stage"][f"tp{w}"]["source"].split(";")[0]
            + "); the one-shot kernels do the same reads",
        )
    for w in (4, 8):
        out["flashinfer_ar_rmsnorm_twoshot"][f"tp{w}"] = dict(
            out["symm_mem_two_shot"][f"tp{w}"],
            tier="assumed",
            source="assumed: = torch symm-mem two-shot at this TP ("
            + out["symm_mem_two_shot"][f"tp{w}"]["source"].split(";")[0]
            + ")",
        )
    return out


B300_LINK_BW = 900e9  # NVLink5 per direction (https://www.nvidia.com/en-us/data-center/nvlink/)


def _twoshot_s(notes):
    """The 'twoshot=0.079' (ms) figure in a benchmark_fused_collective row's notes, in s (None if
    absent)."""
    m = re.search(r"twoshot=([\d.]+)", notes)
    return float(m.group(1)) * 1e-3 if m else None


def fi_tp2_b300():
    """FlashInfer fused AR+RMSNorm one-shot and two-shot at TP2 fitted to VLLM_PR37756 B300 32/64
    MiB rows."""
    pr = rows("VLLM_PR37756", metric="allreduce_rmsnorm_time", num_gpus="2")
    S = [float(r["M_or_tokens"]) * float(r["hidden_size"]) * 2 for r in pr]
    out = {}
    for key, times, what in (
        ("flashinfer_ar_rmsnorm", [_ms(r["overlap_value"]) for r in pr], "one-shot"),
        ("flashinfer_ar_rmsnorm_twoshot", [_twoshot_s(r["notes"]) for r in pr], "two-shot"),
    ):
        a, bw, err = fit_alpha_beta(S, times, ar_factor(2))
        out[key] = dict(
            latency_s=a,
            bus_bw_bytes_per_s=bw,
            rms_rel_err=err,
            n=len(S),
            source=f"VLLM_PR37756 B300 TP2 FlashInfer fused AR+RMSNorm {what} 32/64 MiB fit "
            f"({bw / 1e9:.0f} GB/s, rms rel err {err:.3f})",
        )
    return out


def gemm_fit(gpu_prefix, source_ids, hbm_bw, peak_bf16, max_eff, sm_count, tile_m=128, tile_n=256):
    """Fit gemm.mem_efficiency and gemm.launch_overhead_s to published bf16 small-M GEMM TFLOP/s
    rows."""
    rs = [
        r
        for s in source_ids
        for r in rows(s)
        if r["gpu"].startswith(gpu_prefix) and r["dtype"] == "torch-bf16"
    ]
    M = np.array([float(r["M_or_tokens"]) for r in rs])
    N = np.array([float(r["N"]) for r in rs])
    K = np.array([float(r["K"]) for r in rs])
    t = F.gemm_flops(M, N, K) / (np.array([float(r["baseline_value"]) for r in rs]) * 1e12)

    def model(x):
        mem_eff, launch = x
        return F.t_gemm_s(
            M,
            N,
            K,
            peak_flops_per_s=peak_bf16,
            max_efficiency=max_eff,
            mem_efficiency=mem_eff,
            hbm_bw_bytes_per_s=hbm_bw,
            tile_m=tile_m,
            tile_n=tile_n,
            sm_count=sm_count,
            launch_overhead_s=launch,
            in_bytes=2,
            w_bytes=2,
            out_bytes=2,
        )

    r, _ = fit_least_squares(lambda x: np.log(model(x) / t), [0.85, 2e-6], [0.3, 0.0], [1.0, 2e-5])
    rms = float(np.sqrt(np.mean(r.fun**2)))
    return dict(
        mem_efficiency=float(r.x[0]),
        launch_overhead_s=float(r.x[1]),
        rms_rel_err=rms,
        n=len(rs),
        source=f"fit to {'+'.join(source_ids)} {gpu_prefix} torch-bf16 rows (M=1..256), rms rel "
        f"err {rms:.3f} over {len(rs)} points (calib/reference.py)",
    )


def mamf_efficiency(gpu_label, dtype):
    """Best-shape achieved / theoretical TFLOP/s from MLENG_MAMF."""
    for r in rows("MLENG_MAMF"):
        if r["gpu"] == gpu_label and r["dtype"].startswith(dtype):
            return float(r["overlap_value"]) / float(r["baseline_value"])
    raise KeyError((gpu_label, dtype))


def asynctp_slowdown_h100(peak_bf16, max_eff):
    """GEMM slowdown while a copy-engine transfer runs, from PT_PR172714 (8192³ fp16 matmul + 64 MiB
    AG, 8xH100).

    t_mm = 2·8192³/(peak·eff); t_ag = t_seq − t_mm; σ = t_overlap_CE / max(t_mm, t_ag) − 1."""
    r = rows("PT_PR172714")[0]
    t_seq = _ms(r["baseline_value"])
    t_ce = float(re.search(r"copy-engine.*?:\s*([\d.]+)\s*ms", r["notes"]).group(1)) * 1e-3
    t_mm = F.gemm_flops(8192, 8192, 8192) / (peak_bf16 * max_eff)
    t_ag = t_seq - t_mm
    return max(0.0, t_ce / max(t_mm, t_ag) - 1.0)


# --------------------------------------------------------------------------- fused AsyncTP ops

FUSED_CSV = CSV.with_name("fused_ops.csv")
# gpu column -> built-in profile
FUSED_HARDWARE = {
    "H100": "h100-sxm",
    "B300": "b300",
    "GB200": "gb200-nvl72",
}
# dtype column -> tpcost dtype mode; fp16 runs the same tensor-core rate and bytes as bf16 (scored
# as bf16, said so)
FUSED_DTYPES = {
    "bf16": "bf16",
    "fp8 (scaled_mm)": "fp8",
    "fp16": "bf16",
    "bf16 (assumed; not stated in data file)": "bf16",
}


# the released Hopper kernels without multimem (issue 49 item 2: their own byte paths, not fitted
# yet)
HOPPER_P2P_KERNELS = {
    "TDIST_PR166_GEMMRS_H100": "Triton-distributed's persistent GEMM+RS, H100",
    "JAX_PALLAS_MGPU_AGMM_H100": "JAX Pallas:MGPU ring collective matmul, H100",
    "TRITONDIST_README_PLOTS": "Triton-distributed's and FLUX's AG+GEMM and GEMM+RS, H800, "
    "speedups "
    "read off the README's plots (±0.03)",
}


def _row_semantics(r: dict) -> tuple[str, int | None, str]:
    """(impl, per-rank k, how read) of one fused_ops.csv row: which fused arm it times and the
    GEMM's per-rank contraction size k (the README of each source; docs/model.md §6 "Reading the
    released sweeps")."""
    # PR 53053: "768 or 1536 (not stated)", read by calib/kernel_fit.py
    k = int(r["K"]) if r["K"].isdigit() else None
    impl = "kernel" if "CuTe" in r["workload"] else "torch"
    if r["source_id"] in HOPPER_P2P_KERNELS:
        return (
            "other_kernel",
            k,
            (
                "a Hopper single-kernel design without multimem (put/ring/P2P: "
                f"{HOPPER_P2P_KERNELS[r['source_id']]}): not one of the modelled kernels yet "
                "(issue 49)"
            ),
        )
    # x[M, K/ws] @ w[K/ws, 2048]: K is the global size
    if r["source_id"] == "FLASHINFER_GB200_GEMMRS_MATRIX":
        return (
            impl,
            k // int(r["num_gpus"]),
            "K/ws per rank (x[M, K/ws] @ w[K/ws, 2048]); M global, M/ws out per rank",
        )
    if r["source_id"] == "META_AH_H100_ASYNCTP":
        if int(r["N"]) > int(r["K"]):  # K = hidden, N = intermediate: the converter's "FFN" block
            return "ffn_block", k, META_FFN_WHY
        n, w = int(r["N"]), int(r["num_gpus"])
        t_fused = float(r["overlap_value"]) * {"ms": 1e-3, "us": 1e-6}[r["unit"]]
        floor = pipelined_weight_floor_s(w, k, n, 2.0, _h100_hbm_bytes_per_s())
        # W chunk GEMMs each stream the weight: the pipelined op cannot be this fast
        if t_fused < floor:
            return (
                "native_path",
                k,
                (
                    f"META_AH_H100_ASYNCTP m={r['M_or_tokens']} k={k} n={n}: fused "
                    f"{t_fused * 1e6:.0f} us is below the "
                    f"pipelined op's {w} weight reads ({w} x {k * n * 2 / 1e6:.0f} MB at the "
                    "datasheet "
                    f"{_h100_hbm_bytes_per_s() / 1e12:.2f} TB/s = {floor * 1e6:.0f} us): torch's "
                    "native one-GEMM path, "
                    "not the op vLLM 0.31 runs"
                ),
            )
        return (
            impl,
            k,
            (
                "m = gathered (global) rows, padded to a multiple of W where fewer (an all-gather "
                "over W "
                "ranks carries W equal shards, as vLLM's SP pads); k, n the per-rank GEMM's own "
                "sizes (its "
                "weight k·n·2 bytes over HBM is the m = 1 time; a per-rank K_shard reading would "
                "need 15 TB/s)"
            ),
        )
    return impl, k, "as published"


def pipelined_weight_floor_s(
    world: int, k: int, n: int, w_bytes: float, hbm_bytes_per_s: float
) -> float:
    """The least time of torch's pipelined AG+GEMM: its W chunk GEMMs each stream the k·n weight
    from HBM, W·k·n·b / HBM (s; docs/model.md §6 "Reading the released sweeps")."""
    return world * k * n * w_bytes / hbm_bytes_per_s


@functools.lru_cache(maxsize=1)
def _h100_hbm_bytes_per_s() -> float:
    from costmodel.profile import load_profile

    # the datasheet's (NVIDIA H100 SXM5)
    return float(load_profile("h100-sxm").memory.hbm_bw_bytes_per_s)


# docs/model.md §6 "Reading the released sweeps"
META_FFN_WHY = (
    "META_AH_H100_ASYNCTP 'FFN' block (K = hidden, N = intermediate): the op pair it times is not "
    "in the "
    "index, and no single AG+MM fits its sequential arm (m = 4096, k = 8192, n = 28672 in 13.2 ms: "
    "146 "
    "TFLOP/s for one GEMM of global m, above the H100's peak for local m): not scored"
)


def excluded_fused_rows() -> list[dict]:
    """Rows of fused_ops.csv no model here scores, with the reason (reported by
    benchmarks/accuracy.py)."""
    out = []
    with open(FUSED_CSV, newline="", encoding="utf-8-sig") as f:
        for line, r in enumerate(csv.DictReader(f), start=2):
            impl, _, why = _row_semantics(r)
            if impl in ("ffn_block", "other_kernel", "native_path"):
                out.append({"source": r["source_id"], "line": line, "reason": why})
    return out


def fused_op_rows(source_id=None, impl: str | None = "torch"):
    """The published fused-op timings of data/reference/fused_ops.csv (a copy of
    ../shared/reference; sources in FUSED_OPS_SOURCES.md) as dicts: hardware, tp, op, impl, dtype,
    m, n, k (per rank), baseline_s, overlap_s, source, line, dtype_as_published. `impl`: "torch"
    (torch's pipelined symm-mem ops), "kernel" (single-kernel fused GEMM+collective), None for both.
    Rows without N and K (the NVFP4 native path) come back with n = k = None and dtype 'nvfp4'."""
    out = []
    with open(FUSED_CSV, newline="", encoding="utf-8-sig") as f:
        for line, r in enumerate(csv.DictReader(f), start=2):
            if source_id and r["source_id"] != source_id:
                continue
            row_impl, k, _ = _row_semantics(r)
            if impl is not None and row_impl != impl:
                continue
            scale = {"ms": 1e-3, "us": 1e-6}[r["unit"]]
            gpu = next((v for key, v in FUSED_HARDWARE.items() if r["gpu"].startswith(key)), None)
            wl = r["workload"]
            op = (
                "gemm_rs"
                if ("ReduceScatter" in wl or "reduce-scatter" in wl or wl.startswith("gemm_rs"))
                else "ag_gemm"
            )
            m, tp = int(r["M_or_tokens"]), int(r["num_gpus"])
            # fewer rows than ranks: padded to W (_row_semantics)
            if r["source_id"] == "META_AH_H100_ASYNCTP":
                m = -(-m // tp) * tp
            out.append(
                dict(
                    hardware=gpu or r["gpu"],
                    tp=tp,
                    op=op,
                    impl=row_impl,
                    dtype=FUSED_DTYPES.get(r["dtype"], r["dtype"]),
                    dtype_as_published=r["dtype"],
                    m=m,
                    m_as_published=int(r["M_or_tokens"]),
                    n=int(r["N"]) if r["N"] else None,
                    k=k,
                    baseline_s=float(r["baseline_value"]) * scale,
                    overlap_s=float(r["overlap_value"]) * scale,
                    source=r["source_id"],
                    line=line,
                )
            )
    return out


def predict_fused_row(profile, r):
    """(predicted sequential s, predicted fused s issued eagerly, as the benchmarks run it) for one
    fused-op row (costmodel.ops.torch_pair, the predictor tpcost op and evaluate use)."""
    from costmodel import ops

    p = ops.torch_pair(ops.Hw(profile, r["dtype"]), r["op"], float(r["m"]), r["n"], r["k"], r["tp"])
    return p.unfused_s, p.fused_eager_s


def fit_fused_param(tree, rows, key, name, arm="fused"):
    """Least squares (log residuals of the fused time, or of the sequential arm's with
    arm="sequential"; soft-L1) of one profile parameter `key` to fused-op rows, the profile tree
    giving every other value. Returns value, sigma_rel (from the Jacobian), rms and a source."""
    from costmodel.profile import profile_from_dict

    base = profile_from_dict(tree, f"fit:{name}")
    rows = [r for r in rows if r["n"] and r["k"]]
    meas = np.array([r["overlap_s" if arm == "fused" else "baseline_s"] for r in rows])

    def one(prof, r):
        seq, f = predict_fused_row(prof, r)
        return float(np.asarray(f if arm == "fused" else seq).ravel()[0])

    def resid(x):
        prof = base.with_values({key: float(np.exp(x[0]))}, None, mark_modified=False)
        return np.log(np.array([one(prof, r) for r in rows]) / meas)

    from costmodel.profile import value_range

    # the search stays inside the quantity's plausible range (docs/profiles.md)
    rng = value_range(key)
    lo, hi = np.log(max(rng.lo, 1e-9)), np.log(rng.hi) - 1e-9
    x0 = np.clip(np.log([max(base.value(key), 1e-7)]), lo + 1e-6, hi - 1e-6)
    r, sig = fit_least_squares(resid, x0, [lo], [hi], x_scale=1.0, diff_step=1e-3)
    sigma = float(sig[0])
    rms = float(np.sqrt(np.mean(r.fun**2)))
    src = rows[0]["source"]
    ms = sorted({r_["m"] for r_ in rows})
    return dict(
        value=float(np.exp(r.x[0])),
        sigma_rel=sigma,
        rms_log=rms,
        n=len(rows),
        source=(
            f"least-squares fit to the {arm} arm of {src} ({len(rows)} {rows[0]['op']} "
            f"{rows[0]['dtype']} rows, "
            f"M={ms[0]}..{ms[-1]}): rms log residual {rms:.3f}, sigma_rel {sigma:.2f} "
            "(calib/reference.py fit_fused_param)"
        ),
    )


# --------------------------------------------------------------------------------------------------
# One joint fit per GPU family across every released source (docs/model.md §6 "Joint fits"):
# GPU-side terms (barriers, copy-engine pulls, NCCL curves) are shared by the family's sources; the
# host's issue time per torch call and a benchmark's own overhead are per source (a property of that
# source's machine and harness), refitted on each source and never written into another source's
# profile.

E2E_CSV = CSV.with_name("end_to_end.csv")
# vllm bench latency: output 1024 tokens = 1 prefill + 1023 decode steps
PR28672_DECODE_STEPS = 1023
PR28672_SETUP = dict(profile="h100-sxm", model="llama-3.1-70b", tp=4, dtype="fp8", num_tokens=64.0)


def pr28672_measured_decode_s() -> float:
    """VLLM_PR28672: SP+AsyncTP at every size (before) minus thresholded (after); the 4 prefill
    steps run SP+AsyncTP in both runs, so the difference is 1023 graph-replayed decode steps of 64
    tokens (s)."""
    with open(E2E_CSV, newline="", encoding="utf-8-sig") as f:
        r = next(x for x in csv.DictReader(f) if x["source_id"] == "VLLM_PR28672")
    return float(r["baseline_value"]) - float(r["overlap_value"])


def pr28672_predicted_decode_s(profile) -> float:
    """1023 · (t_sp_asynctp(64) − t_tp(64)) for PR #28672's setup (Llama-3.3-70B = Llama-3.1-70B's
    shape, static fp8, TP 4, decode under CUDA-graph replay: vLLM's default capture size 512 > 64)
    (s)."""
    from costmodel.model import predict
    from costmodel.shapes import load_model

    s = PR28672_SETUP
    pred = predict(profile, load_model(s["model"]), s["tp"], s["dtype"], [s["num_tokens"]])
    d = pred.t_forward_s("sp_asynctp") - pred.t_forward_s("tp")
    return PR28672_DECODE_STEPS * float(np.ravel(d)[0])


class FamilyFit:
    """A joint least-squares fit (log residuals, soft-L1) of shared GPU-side terms and per-source
    terms.

    `sources`: source_id -> dict(profile=name, rows=fused-op rows or None, decode=True for PR
    #28672's run, host=True to fit that source's host_op_s, offset=True to fit an additive benchmark
    overhead on both arms, baseline_keys=[collective keys the source's sequential arm fits]).
    `shared`: GPU-side keys fitted on every source of the family (each value written into every
    source's profile)."""

    def __init__(self, family: str, sources: dict, shared: tuple[str, ...], trees: dict):
        from costmodel.profile import profile_from_dict

        self.family, self.sources, self.shared = family, sources, shared
        self.base = {name: profile_from_dict(t, f"fit:{name}") for name, t in trees.items()}
        self.names: list[tuple[str, str | None]] = [(k, None) for k in shared]
        for sid, s in sources.items():
            if s.get("host"):
                self.names.append(("asynctp.host_op_s", sid))
            if s.get("offset"):
                self.names.append(("offset_s", sid))
            for k in s.get("baseline_keys", ()):
                self.names.append((k, sid))

    def _x0(self):
        x = []
        for key, sid in self.names:
            if key == "offset_s":
                x.append(np.log(50e-6))
                continue
            prof = self.base[self.sources[sid]["profile"] if sid else next(iter(self.base))]
            x.append(np.log(max(prof.value(key), 1e-8)))
        return np.array(x)

    def _bounds(self):
        from costmodel.profile import value_range

        lo, hi = [], []
        for key, _ in self.names:
            r = value_range(key) if key != "offset_s" else None
            lo.append(np.log(max(r.lo, 1e-9)) if r else np.log(1e-7))
            hi.append(np.log(r.hi) if r else np.log(1e-2))
        return np.array(lo), np.array(hi)

    def values(self, x) -> dict:
        """(source_id or None) -> {key: value} of the parameter vector x (log space)."""
        out: dict = {}
        for (key, sid), v in zip(self.names, np.exp(x)):
            out.setdefault(sid, {})[key] = float(v)
        return out

    def profile_for(self, sid, vals):
        s = self.sources[sid]
        own = {k: v for k, v in vals.get(sid, {}).items() if k != "offset_s"}
        return self.base[s["profile"]].with_values(
            {**vals.get(None, {}), **own}, None, mark_modified=False
        )

    def row_predictions(self, sid, vals) -> list[dict]:
        """Per measured row of one source: measured and predicted times of each arm (s), the
        benchmark offset included on both arms where the source has one (what that harness adds to
        every op it times)."""
        s = self.sources[sid]
        prof = self.profile_for(sid, vals)
        off = vals.get(sid, {}).get("offset_s", 0.0)
        out = []
        if s.get("decode"):
            out.append(
                {
                    "arm": "decode",
                    "measured_s": pr28672_measured_decode_s(),
                    "predicted_s": pr28672_predicted_decode_s(prof),
                }
            )
        for r in s.get("rows") or ():
            seq, f = predict_fused_row(prof, r)
            out.append(
                {
                    "arm": "op",
                    "row": r,
                    "fused_measured_s": r["overlap_s"],
                    "seq_measured_s": r["baseline_s"],
                    "fused_predicted_s": float(np.ravel(f)[0]) + off,
                    "seq_predicted_s": float(np.ravel(seq)[0]) + off,
                    "offset_s": off,
                }
            )
        return out

    def residuals(self, x):
        """Log residuals of every source: its decode cost, each row's fused arm, and its sequential
        arm where the source fits something from it (its NCCL curve or its harness offset)."""
        vals = self.values(x)
        res = []
        for sid, s in self.sources.items():
            with_seq = bool(s.get("baseline_keys") or s.get("offset"))
            for r in self.row_predictions(sid, vals):
                if r["arm"] == "decode":
                    res.append(np.log(r["predicted_s"] / r["measured_s"]))
                    continue
                res.append(np.log(r["fused_predicted_s"] / r["fused_measured_s"]))
                if with_seq:
                    res.append(np.log(r["seq_predicted_s"] / r["seq_measured_s"]))
        return np.array(res)

    # max(GPU, host + tail) is flat in the host term until it binds: multi-start
    HOST_STARTS_S = (
        3e-6,
        1e-5,
        3e-5,
    )

    def fit(self) -> dict:
        """The fit; a term the data cannot identify (sigma_rel > calib.fit.IDENTIFIED_SIGMA_REL) is
        fixed at its prior and the others refitted, and listed under "unidentified" (it stays
        `assumed` in the profiles)."""
        res = self._fit_once()
        fixed = []
        while True:
            worst = worst_unidentified(
                {(key, sid): res["sigma_rel"][sid][key] for key, sid in self.names}
            )
            if worst is None:
                break
            fixed.append(worst)
            self.names = [n for n in self.names if n != worst]
            res = self._fit_once()
        for key, sid in fixed:
            prior = self._prior(key, sid)
            res["values"].setdefault(sid, {})[key] = prior
            res["sigma_rel"].setdefault(sid, {})[key] = float("inf")
        res["unidentified"] = [f"{sid + ': ' if sid else ''}{key}" for key, sid in fixed]
        return res

    def _prior(self, key, sid):
        if key == "offset_s":  # a harness overhead the data cannot fix: none
            return 0.0
        prof = self.base[self.sources[sid]["profile"] if sid else next(iter(self.base))]
        return float(prof.value(key))

    def _fit_once(self) -> dict:
        if not self.names:  # everything fixed: nothing to fit, the residuals at the priors
            fun = self.residuals(np.array([]))
            return {
                "values": {},
                "sigma_rel": {},
                "rms_log": float(np.sqrt(np.mean(fun**2))),
                "n_residuals": int(fun.size),
                "n_params": 0,
                "sources": sorted(self.sources),
            }
        lo, hi = self._bounds()
        best = None
        for h0 in self.HOST_STARTS_S:
            x0 = self._x0()
            for i, (key, _) in enumerate(self.names):
                if key == "asynctp.host_op_s":
                    x0[i] = np.log(h0)
            x0 = np.clip(x0, lo + 1e-6, hi - 1e-6)
            r, sig = fit_least_squares(self.residuals, x0, lo, hi, diff_step=1e-3)
            if best is None or r.cost < best[0].cost - 1e-12:
                best = (r, sig)
        r, sig = best
        vals = self.values(r.x)
        sigmas = {}
        for (key, sid), sg in zip(self.names, sig):
            sigmas.setdefault(sid, {})[key] = float(sg)  # log-space sigma = relative sigma
        return {
            "values": vals,
            "sigma_rel": sigmas,
            "rms_log": float(np.sqrt(np.mean(r.fun**2))),
            "n_residuals": int(r.fun.size),
            "n_params": int(x0.size),
            "sources": sorted(self.sources),
        }


def family_sources(family: str) -> dict:
    """The released sources of one GPU family and what each fits (docs/model.md §6 "Joint fits")."""
    if family == "hopper":
        # KRAKEN's harness adds its own overhead to both arms it times (as the GB200 matrix's): its
        # offset_s
        return {
            "KRAKEN_PR19": dict(
                profile="h100-sxm", rows=fused_op_rows("KRAKEN_PR19"), host=True, offset=True
            ),
            "VLLM_PR28672": dict(profile="h100-sxm", decode=True),
        }
    if family == "blackwell":
        fi = fused_op_rows("FLASHINFER_GB200_GEMMRS_MATRIX")
        return {
            "PT_ISSUE179770": dict(profile="b300", rows=fused_op_rows("PT_ISSUE179770"), host=True),
            "FLASHINFER_GB200_GEMMRS_MATRIX": dict(
                profile="gb200-nvl72",
                rows=fi,
                host=True,
                offset=True,
                baseline_keys=(
                    "collectives.nccl_reduce_scatter.tp2.bus_bw_bytes_per_s",
                    "collectives.nccl_reduce_scatter.tp4.bus_bw_bytes_per_s",
                ),
            ),
        }
    raise ValueError(family)


def scored_only_sources(family: str) -> dict:
    """Released sources scored against a family's fit but never in it (their fused arm is partly
    another path), with the per-source terms the leave-one-source-out rule refits on them
    (docs/model.md §6)."""
    # the pipelined rows under the reading of _row_semantics; own host and harness
    if family == "hopper":
        return {
            "META_AH_H100_ASYNCTP": dict(
                profile="h100-sxm",
                rows=fused_op_rows("META_AH_H100_ASYNCTP"),
                host=True,
                offset=True,
            )
        }
    return {}


FAMILY_SHARED = {
    "hopper": ("asynctp.barrier_s",),
    "blackwell": (
        "asynctp.barrier_s",
        "asynctp.copy_engine_bw_bytes_per_s",
        "asynctp.rs_step_exposure",
    ),
}


def fit_family(family: str, trees: dict, leave_out: str | None = None) -> dict:
    """The joint fit of one family over its sources (without `leave_out`: its GPU-side terms come
    from the others)."""
    srcs = {k: v for k, v in family_sources(family).items() if k != leave_out}
    return FamilyFit(family, srcs, FAMILY_SHARED[family], trees).fit()


# what decides PR 28672's graph-mode decode difference (docs/accuracy.md)
DECODE_TERM = "asynctp.barrier_s"
# 1 ... 32 us (an NVLink round trip and up), 4 an octave
DECODE_GRID_S = tuple(1e-6 * 2.0 ** (i / 4) for i in range(21))


def decode_identifiability(trees: dict, grid_s=DECODE_GRID_S) -> dict:
    """Whether the Hopper sources other than VLLM_PR28672 identify what decides its decode
    difference, the per-barrier GPU cost: at each barrier on `grid_s`, the fit without PR 28672 with
    the barrier held there (KRAKEN_PR19's host issue time refitted; unidentified: its prior), its
    rms log residual and the decode difference it predicts; the unconstrained fit without PR 28672;
    and the likelihood-ratio interval (Σr² within one residual variance s² = Σr²_min / (n − p) of
    the least) of the barrier and of the decode (s; docs/accuracy.md)."""
    from costmodel.profile import profile_from_dict, profile_to_tree

    srcs = {k: v for k, v in family_sources("hopper").items() if k != "VLLM_PR28672"}
    problem = FamilyFit("hopper", srcs, FAMILY_SHARED["hopper"], trees)
    # before any is found unidentified: the terms the rows are asked to fix
    n_terms = len(problem.names)
    free = problem.fit()
    shared = tuple(k for k in FAMILY_SHARED["hopper"] if k != DECODE_TERM)

    def at(b: float) -> dict:
        fixed = {
            n: profile_to_tree(
                profile_from_dict(t, f"fit:{n}").with_values(
                    {DECODE_TERM: b}, None, mark_modified=False
                )
            )
            for n, t in trees.items()
        }
        fit = FamilyFit("hopper", srcs, shared, fixed).fit()
        gpu = {**fit["values"].get(None, {}), DECODE_TERM: b}
        prof = profile_from_dict(fixed[PR28672_SETUP["profile"]], "fit").with_values(
            gpu, None, mark_modified=False
        )
        return {
            "barrier_s": b,
            "host_op_s": fit["values"]["KRAKEN_PR19"]["asynctp.host_op_s"],
            "host_identified": not fit["unidentified"],
            "rms_log": fit["rms_log"],
            "sum_sq": fit["rms_log"] ** 2 * fit["n_residuals"],
            "decode_s": pr28672_predicted_decode_s(prof),
        }

    points = [at(float(b)) for b in grid_s]
    best = at(free["values"][None][DECODE_TERM])
    s2 = best["sum_sq"] / max(1, free["n_residuals"] - n_terms)
    inside = [p for p in [*points, best] if p["sum_sq"] - best["sum_sq"] <= s2]
    return {
        "term": DECODE_TERM,
        "left_out": "VLLM_PR28672",
        "from": sorted(srcs),
        "points": points,
        "best": best,
        "n_residuals": free["n_residuals"],
        "n_terms": n_terms,
        "residual_variance": s2,
        "interval_barrier_s": [
            min(p["barrier_s"] for p in inside),
            max(p["barrier_s"] for p in inside),
        ],
        "interval_decode_s": [
            min(p["decode_s"] for p in inside),
            max(p["decode_s"] for p in inside),
        ],
        "interval_at_grid_end": {
            "low": any(p["barrier_s"] == grid_s[0] for p in inside),
            "high": any(p["barrier_s"] == grid_s[-1] for p in inside),
        },
        "measured_decode_s": pr28672_measured_decode_s(),
    }


def source_rows(
    family: str,
    trees: dict,
    sid: str,
    fit: dict,
    refit_own: bool = False,
    fitted_out: list | None = None,
) -> list[dict]:
    """Row predictions of source `sid` (a family's source, or one scored only) with the GPU-side
    terms of `fit`. `refit_own`: its per-source terms (host,
    benchmark offset, its own collective curve) refitted on its own rows with those GPU-side terms
    fixed (the leave-one-source-out rule: a host is never carried from one source's machine to
    another). `fitted_out`: the per-source terms that refit identified are appended to it."""
    from costmodel.profile import profile_from_dict, profile_to_tree

    src = {**family_sources(family), **scored_only_sources(family)}[sid]
    shared = fit["values"].get(None, {})
    vals = {None: shared, sid: fit["values"].get(sid, {})}
    own = FamilyFit(family, {sid: src}, (), trees)
    if refit_own and own.names:
        name = src["profile"]
        fixed = profile_from_dict(trees[name], f"fit:{name}").with_values(
            shared, None, mark_modified=False
        )
        own_fit = FamilyFit(family, {sid: src}, (), {name: profile_to_tree(fixed)}).fit()
        vals[sid] = own_fit["values"].get(sid, {})
        if fitted_out is not None:
            fitted_out.extend(
                k for k, sg in own_fit["sigma_rel"].get(sid, {}).items() if np.isfinite(sg)
            )
    return own.row_predictions(sid, vals)


# ---------------------------------------------------------------- the committed family fits
B300_RS_LATENCY = "collectives.nccl_reduce_scatter.tp8.latency_s"
B300_RS_SOURCE = "PT_ISSUE179770"


def b300_rs_latency_fit(b300_tree: dict) -> dict:
    """The B300's own NCCL reduce-scatter latency at 1-12 MiB: the sequential arm of PT_ISSUE179770
    (scaled_mm + NCCL reduce-scatter) fitted with the rest of the B300 start tree fixed (its busBW
    stays the 16 GiB value)."""
    return fit_fused_param(
        b300_tree, fused_op_rows(B300_RS_SOURCE), B300_RS_LATENCY, "b300", arm="sequential"
    )


def start_trees(raw: dict | None = None) -> tuple[dict, dict]:
    """The family fits' start trees: the specs' (calib.assemble.family_trees, or `raw`) with the
    B300's reduce-scatter latency fitted first and written in (rounded as the profile holds it).
    Returns (trees, that fit)."""
    import copy

    trees = copy.deepcopy(family_trees() if raw is None else raw)
    rs = b300_rs_latency_fit(trees["blackwell"]["b300"])
    trees["blackwell"]["b300"]["collectives"]["nccl_reduce_scatter"]["tp8"]["latency_s"] = (
        profile_digits(rs["value"])
    )
    return trees, rs


def b200_nccl_ar_tp2_fit(blackwell: dict) -> dict:
    """TP2 NCCL all-reduce: VLLM_PR42324's pynccl points stop at 2 MiB; at the sizes vLLM sends NCCL
    (above its 2 MiB custom-AR limit) a ring all-reduce is a reduce-scatter + an all-gather at the
    same busBW, so a 2 GiB point at the TP2 reduce-scatter busBW the Blackwell family fit takes from
    FLASHINFER_GB200_GEMMRS_MATRIX's sequential arm."""
    bw2 = blackwell["values"]["FLASHINFER_GB200_GEMMRS_MATRIX"][
        "collectives.nccl_reduce_scatter.tp2.bus_bw_bytes_per_s"
    ]
    ar2 = fit_vllm_bench(
        "VLLM_PR42324",
        2,
        "allreduce_time_pynccl",
        gpu_match="B200",
        extra_points=[asymptote_point(bw2 / 1e9, 2)],
    )
    ar2["source"] = (
        f"VLLM_PR42324 B200 WS=2 allreduce_time_pynccl (0.5-2 MiB) plus a 2 GiB point at the TP2 "
        "reduce-scatter busBW fitted to FLASHINFER_GB200_GEMMRS_MATRIX's sequential arm; rms rel "
        "err "
        f"{ar2['rms_rel_err']:.3f} over {ar2['n']} points"
    )
    return ar2


def fit_families(raw: dict | None = None) -> tuple[dict, dict]:
    """Every family's joint fit from its start trees (family -> FamilyFit result), and the fits made
    with them (name -> fit: the B300 reduce-scatter latency before, the B200 TP2 all-reduce
    after)."""
    trees, rs = start_trees(raw)
    fits = {family: fit_family(family, per) for family, per in trees.items()}
    return fits, {
        "b300_nccl_rs_latency": rs,
        "b200_nccl_all_reduce_tp2": b200_nccl_ar_tp2_fit(fits["blackwell"]),
    }


def main(argv: list[str] | None = None) -> int:
    """Refit every family from the committed start trees and write FAMILY_FIT (atomically)."""
    import argparse

    from costmodel.io import doc_summary

    argparse.ArgumentParser(
        prog="python -m calib.reference", description=doc_summary(__doc__)
    ).parse_args(argv)
    import json

    from costmodel.io import atomic_write_text, dumps_json

    raw = family_trees()
    fits, made = fit_families(raw)
    out = {
        "command": FAMILY_CMD,
        "trees": "calib/gpus (calib.assemble.family_trees)",
        "trees_sha256": trees_digest(raw),
        "fits": {f: fit_to_json(v) for f, v in fits.items()},
        "with": made,
    }
    json.loads(dumps_json(out))  # strict JSON: no NaN, no inf
    atomic_write_text(FAMILY_FIT, dumps_json(out, indent=1) + "\n")
    for family, fit in fits.items():
        print(
            f"{family}: {fit['n_params']} terms over {' + '.join(fit['sources'])}, rms log "
            f"{fit['rms_log']:.4f}"
            + (f"; unidentified: {', '.join(fit['unidentified'])}" if fit["unidentified"] else "")
        )
    print(f"wrote {FAMILY_FIT}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
