"""The fused-op sections of a profile from the committed fits (docs/model.md §6, §6b): torch's
AsyncTP terms from the family fits (calib/reference.py FamilyFit), the FlashInfer GB200 matrix's
NCCL reduce-scatter busBW, vLLM's single kernel from the joint kernel fit (calib/kernel_fit.py), the
model error from the band (calib/band.py), and a single-GPU calibration (calib/gpu_check.sh) folded
in. Tree transforms on copies; calib/assemble.py applies them as a GPU's spec file asks. Nothing is
fitted here."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

from calib import results as CR
from calib.derive import nvls_multimem_efficiency, round_value, sec
from costmodel import vllm_tables as T

HOST_OP = (
    3e-6,
    "assumed: one eager torch call (Python -> dispatcher -> launch) ~3 us on a current server CPU; "
    "the "
    "hosts of the released sweeps fit 3.8 us (PT_ISSUE179770, B300) to 12 us (KRAKEN_PR19 H100, "
    "the GB200 Grace "
    "host): a property of the host, never carried from one source's machine to another",
    "assumed",
)
# signal-pad put + wait (SYMMMEM_RECIPES_PR3: one-shot AR, 2 barriers 10.8 us)
BARRIER_PRIOR = (
    4e-6,
    "fit start",
    "assumed",
)
K_CMD = "python -m calib.kernel_fit, then python tools/build_profiles.py"
# measured on one Hopper part, a property of the GH100 die (132 SMs) that H100 and H800 share
SAME_DIE_KEYS = ("asynctp.stream_concurrency",)


def fit_term(fit: dict, sid: str | None, key: str, what: str) -> tuple:
    """(value, source, tier[, sigma]) of one family-fit term; one the fit could not identify keeps
    its prior, tier assumed, and says so."""
    v, sg = fit["values"][sid][key], fit["sigma_rel"][sid][key]
    over = (
        f"joint least-squares fit over {' + '.join(fit['sources'])} ({fit['n_residuals']} log "
        "residuals, "
        f"{fit['n_params']} terms, rms {fit['rms_log']:.3f}; calib/reference.py FamilyFit)"
    )
    if not math.isfinite(sg):
        return (v, f"assumed: {what}: prior kept, not identified by the {over}", "assumed")
    return (v, f"{what}: {over}", "published-measurement", min(sg, 1.0))


def assumed(term: tuple, why: str) -> tuple:
    """A fitted term carried to a GPU it was not measured on: tier assumed, saying why."""
    return (term[0], f"assumed: {why} ({term[1]})", "assumed")


def term_table(term: tuple, key: str, **extra) -> dict:
    """A sourced table of one term (value, source, tier[, sigma]), σ as its uncertainty_rel."""
    t = sec(term[1], term[2], **{key: term[0]}, **extra)
    if len(term) > 3 and term[3] is not None:
        t["uncertainty_rel"] = {key: round_value(term[3])}
    return t


def nccl_ag_busbw(p: dict, tp: int = 8) -> tuple[float, str]:
    """The NCCL all-gather bus bandwidth of a profile tree at `tp` (or its largest listed TP)."""
    per_tp = p["collectives"]["nccl_all_gather"]
    key = f"tp{tp}" if f"tp{tp}" in per_tp else max(per_tp, key=lambda k: int(k[2:]))
    return per_tp[key]["bus_bw_bytes_per_s"], key


def asynctp_section(p: dict, sync: tuple, host: tuple) -> dict:
    """The [asynctp] tables of a profile tree (docs/model.md §6): `sync` and `host` as terms (value,
    source, tier[, σ]). The copy-engine pull is capped at NCCL's all-gather busBW on the same link:
    no measurement says a single copy engine beats NCCL there."""
    p = copy.deepcopy(p)
    old = p["asynctp"]
    ce_old = old["_copy"]["copy_engine_bw_bytes_per_s"]
    ag_bw, ag_tp = nccl_ag_busbw(p)
    ce = min(ce_old, ag_bw)
    why = (
        "NCCL all-gather busBW at " + ag_tp.upper() + " (no faster than NCCL on the same link)"
        if ce == ag_bw
        else old["_copy"]["source"]
    )
    p["asynctp"] = {
        "_sync": term_table(sync, "barrier_s"),
        "_host": term_table(host, "host_op_s"),
        "_pull": sec(
            f"assumed: copy-engine pull bandwidth = {why}; pull start latency ~3 us",
            "assumed",
            copy_engine_bw_bytes_per_s=ce,
            copy_latency_s=3e-6,
        ),
        "_streams": sec(
            "assumed: two-stream chunk GEMMs recover half of the compute-side tile/wave "
            "quantisation "
            "(memory-bound chunks recover nothing: docs/model.md §6)",
            "assumed",
            stream_concurrency=0.5,
        ),
        "_interference": old["_interference"],
        "_rs_exposure": sec(
            "assumed: every pull of torch's GEMM+RS hides behind a chunk GEMM (no row of this GPU "
            "fits it; docs/model.md §6)",
            "assumed",
            rs_step_exposure=0.0,
        ),
    }
    return p


def with_pull(p: dict, term: tuple) -> dict:
    """The copy-engine pull bandwidth of a fit, replacing asynctp_section's NCCL-capped
    assumption."""
    p["asynctp"]["_pull"] = term_table(term, "copy_engine_bw_bytes_per_s")
    p["asynctp"]["_pull_latency"] = sec(
        "assumed: pull start latency ~3 us", "assumed", copy_latency_s=3e-6
    )
    return p


def with_rs_exposure(p: dict, term: tuple) -> dict:
    """The share of torch GEMM+RS's pulls left exposed by its per-step barriers
    (asynctp.rs_step_exposure) of a fit."""
    p["asynctp"]["_rs_exposure"] = term_table(term, "rs_step_exposure")
    return p


def with_slowdown(p: dict, term: tuple) -> dict:
    """The chunk-GEMM slowdown while pulls run (asynctp.compute_slowdown) of a fit."""
    p["asynctp"]["_interference"] = term_table(term, "compute_slowdown")
    return p


def flashinfer_gb200_rs(p: dict, fit: dict, ar2: dict, note: str | None = None) -> dict:
    """NCCL reduce-scatter (and all-gather: same ring, no reduction) busBW at TP 2/4 from the GB200
    matrix's sequential arm (cuBLAS + reduce_scatter_tensor, the benchmark's overhead fitted apart),
    and the TP 2 all-reduce made with it (calib/reference.py b200_nccl_ar_tp2_fit); `note`: carried
    to another GPU, tier assumed."""
    sid = "FLASHINFER_GB200_GEMMRS_MATRIX"
    for tp in (2, 4):
        key = f"collectives.nccl_reduce_scatter.tp{tp}.bus_bw_bytes_per_s"
        v, src, tier, sg = fit_term(
            fit,
            sid,
            key,
            f"NCCL reduce-scatter busBW at TP{tp} from the sequential arm "
            "(cuBLAS + reduce_scatter_tensor), benchmark overhead fitted apart",
        )
        for impl in ("nccl_reduce_scatter", "nccl_all_gather"):
            old = p["collectives"][impl].get(f"tp{tp}") or p["collectives"][impl]["tp8"]
            why = (
                src
                if impl == "nccl_reduce_scatter"
                else "assumed: all-gather = reduce-scatter (same ring, no reduction): " + src
            )
            t_tier = tier if impl == "nccl_reduce_scatter" else "assumed"
            if note:
                why, t_tier = f"assumed: {note}: " + why, "assumed"
            p["collectives"][impl][f"tp{tp}"] = sec(
                f"busBW: {why}; latency: {old['source']}",
                t_tier,
                latency_s=old["latency_s"],
                bus_bw_bytes_per_s=v,
            )
            if t_tier != "assumed":
                p["collectives"][impl][f"tp{tp}"]["uncertainty_rel"] = {
                    "bus_bw_bytes_per_s": round_value(min(sg, 1.0))
                }
    # at the sizes vLLM sends NCCL (above its 2 MiB custom-AR limit) a ring all-reduce is a
    # reduce-scatter + an all-gather at the same busBW: the large-message point comes from the
    # fitted reduce-scatter
    p["collectives"]["nccl_all_reduce"]["tp2"] = sec(
        ar2["source"] + (f" ({note})" if note else ""),
        "assumed" if note else "published-measurement",
        latency_s=ar2["latency_s"],
        bus_bw_bytes_per_s=ar2["bus_bw_bytes_per_s"],
    )
    return p


def model_error_table(band: dict, what: str, hopper: bool = False) -> dict:
    """A time_scale table: 1 (as modelled), its σ the model's out-of-sample error set by nested
    leave-one-source-out (calib/band.py), so that every band carries it; `hopper`: the single kernel
    on NVLink4, where no released row times it, keeps the assumed tier."""
    per = band["per_source"]
    nested = ", ".join(
        f"{s} {per[s]['coverage']:.0%}"
        for s in band["calibration_sources"]
        if per[s]["coverage"] is not None
    )
    src = (
        f"model error of {what}: the least lognormal sigma at which the 5-95 % band covers "
        f"{band['target']:.0%} of the rows of "
        f"{' + '.join(band['calibration_sources'])} (mean over the sources, each at its "
        "leave-one-source-out "
        "prediction, one run's measured noise beside it where the source times a cell twice; "
        "nested coverage "
        f"{nested}; {CR.BAND_CMD})"
    )
    if hopper:
        return sec(
            f"assumed: no released row times a multimem kernel on Hopper; the SM100 {src} is "
            f"{band['sigma_m']:.2f}, the tier's 0.30 stands",
            "assumed",
            time_scale=1.0,
        )
    return {
        **sec(src, "published-measurement", time_scale=1.0),
        "uncertainty_rel": {"time_scale": round_value(band["sigma_m"])},
    }


def kernel_section(p: dict, kern: dict, band: dict | None, nvlink: str) -> dict:
    """[fused_kernel] of a GPU with NVLink multicast: vLLM's gemm_rs_ar terms from the joint fit;
    NVLink5 hardware terms as fitted; on NVLink4 (Hopper) the multimem rate is NCCL NVLS's measured
    on H200 where the NVLink5 fit sits at B200's (its floor), else the NVLink5 value scaled by their
    ratio, and every term is marked assumed (vLLM ships the kernel on SM100 only;
    costmodel.ops.kernel_shipped). `band` None: no time_scale."""
    over = (
        "joint least-squares fit of the single-kernel family over "
        f"{' + '.join(kern.get('sources', []))} "
        f"({kern['n_rows']} rows, rms of the weighted log residuals {kern['rms_log']}; {K_CMD})"
    )
    out = {}
    for leaf in (
        "fixed_s",
        "ar_fence_s",
        "compute_overhead",
        "exposed_fraction",
        "link_efficiency",
        "multicast_latency_s",
    ):
        key = ("hw:" if leaf in ("link_efficiency", "multicast_latency_s") else "vllm:") + leaf
        v, sg = kern["values"][key], kern["sigma_rel"].get(key)
        if leaf == "link_efficiency" and nvlink == "nvlink4":
            v, why = _hopper_multimem(v, over)
            t = sec(why, "assumed", **{leaf: v})
        elif key in kern.get("design", ()):
            t = sec(
                "assumed: vLLM's design, not fitted (calib/kernel_fit.py DESIGN: "
                "warp-specialised, a wave's "
                f"multimem traffic beside the next wave's GEMM): {over}",
                "assumed",
                **{leaf: v},
            )
        elif sg is None or nvlink == "nvlink4":
            why = (
                "prior kept, not identified by the"
                if sg is None
                else "NVLink5 value carried to Hopper:"
            )
            t = sec(f"assumed: {why} {over}", "assumed", **{leaf: v})
        else:
            t = sec(over, "published-measurement", **{leaf: v})
            t["uncertainty_rel"] = {leaf: round_value(min(sg, 1.0))}
        out[f"_{leaf}"] = t
    out["_inflight_scale"] = sec(T.KERNEL_INFLIGHT_SOURCE, "datasheet", inflight_scale=1.0)
    if band is not None:
        out["_time_scale"] = model_error_table(
            band["kernel"], "the single kernel", hopper=nvlink == "nvlink4"
        )
    p["fused_kernel"] = out
    return p


def _hopper_multimem(eta5: float, over: str) -> tuple[float, str]:
    """(rate, source) of the multimem kernel on NVLink4 from the NVLink5 fit's rate: NCCL NVLS's on
    H200 where the fit sits at B200's NVLS rate (its floor), else scaled by the H200 / B200 NVLS
    ratio."""
    floor5, floor4 = nvls_multimem_efficiency("nvlink5"), nvls_multimem_efficiency("nvlink4")
    at_floor = eta5 <= floor5 * (1 + 1e-3)
    how = (
        "the NVLink5 fit sits at B200's NVLS rate, its floor"
        if at_floor
        else f"the NVLink5 fit's {eta5:.3f} x {floor4 / floor5:.3f}, H200's NVLS rate over B200's"
    )
    p2p = CR.load_p2p_fit()
    eta_p2p, sig_p2p = (
        p2p["values"]["hw:link_efficiency"],
        p2p["sigma_rel"].get("hw:link_efficiency"),
    )
    return (
        floor4 if at_floor else min(1.0, eta5 * floor4 / floor5),
        f"assumed (multimem-specific): NCCL NVLS's multimem rate on H200, {floor4:.3f} of the "
        "NVLink4 peak "
        f"(MLENG_NET_SHARP 8 GPUs 8 GiB: busBW x (W+1)/(2(W-1)) / 450 GB/s), as {how}; the put and "
        "ring kernels "
        f"fitted on Hopper rows move P2P stores over the same links at {eta_p2p:.3f} of the peak "
        "(sigma_rel "
        f"{sig_p2p:.3f}, calib/data/p2p_fit.json), a path multimem's ld_reduce through the switch "
        "does not take: "
        f"{over}",
    )


_CALIBRATED_TARGET = {
    "gemm.max_efficiency": ("gemm", "_efficiency"),
    "gemm.mem_efficiency": ("gemm", "_small_m"),
    "gemm.launch_overhead_s": ("gemm", "_small_m"),
    "kernels.mem_efficiency": ("kernels",),
    "kernels.launch_overhead_s": ("kernels",),
    "asynctp.stream_concurrency": ("asynctp", "_streams"),
    "asynctp.compute_slowdown": ("asynctp", "_interference"),
    # the gpu_check host's own issue time: folded only into the GPU it ran on (keys None), never
    # carried to another profile (SAME_DIE_KEYS leaves it out)
    "asynctp.host_op_s": ("asynctp", "_host"),
}


def calibrated_overrides(
    p: dict, fit_path: Path | None, root: Path, keys=None, note: str = ""
) -> dict:
    """Fold a committed single-GPU calibration (<name>-gpu-check/fit.json) into a profile tree:
    every fitted key, or only `keys` (with `note` saying why they carry over from that GPU). Each
    calibrated value gets its own table so that its neighbours keep their sources."""
    if fit_path is None:
        return p
    fit = json.loads(Path(fit_path).read_text())
    prov = fit["provenance"]
    shown = Path(fit_path).resolve()
    shown = shown.relative_to(root) if shown.is_relative_to(root) else shown
    # calib.gpu_check --combine: the runs' median
    runs = f", {prov['combined']}" if prov.get("combined") else ""
    where = (
        f"calibrated: {shown} ({prov.get('device_name')}, torch {prov.get('torch')}, "
        f"{prov.get('date')}{runs}){note}"
    )
    for key, val in fit["params"].items():
        target = _CALIBRATED_TARGET.get(key)
        if target is None or (keys is not None and key not in keys):
            continue
        section, leaf = key.rsplit(".", 1)
        node = p
        for t in target:
            node = node[t]
        new = sec(where, "calibrated", **{leaf: val["value"]})
        new["uncertainty_rel"] = {leaf: val["uncertainty_rel"]}
        node.pop(leaf, None)
        p[section][f"_calibrated_{leaf}"] = new
    return p
