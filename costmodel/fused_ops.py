"""The one registry of fused GEMM+collective ops (docs/model.md §6, §6b): for each (op, impl) its weight formats, its
eligibility on a GPU and shape, its predictor pair and its defaults. `tpcost op`, `tpcost evaluate` (and the
benchmarks and fits that score through it), the model's layer (costmodel.layer) and the CLI's choices read it.

The defaults are what each input means, declared here once: a published row measured its fused op eagerly (a
Python loop per call, as in the benchmarks) against NCCL unless its columns say otherwise (evaluate's
`baseline_impl`); `op` asks about vLLM's own dispatch, under CUDA graphs below vLLM's capture size. vLLM's gates and
the release fields each op depends on are read from the vLLM home (costmodel.vllm_tables), never restated here.
"""

from __future__ import annotations

import dataclasses

from . import ops, vllm_tables
from .errors import TpcostError
from .profile import HardwareProfile

# torch's pipelined symm-mem ops take the model's dtype modes (bf16, static and dynamic fp8, and fp32 on a CPU run)
TORCH_DTYPES = ("bf16", "fp8", "fp8-dynamic", "fp32")


@dataclasses.dataclass(frozen=True)
class FusedOpKind:
    """One fused op as tpcost models it."""

    op: str  # ag_gemm | gemm_rs | gemm_ar
    impl: str  # torch | kernel
    collective: str  # the collective it fuses: all_gather | reduce_scatter | all_reduce
    dtypes: tuple[str, ...]  # weight formats it takes
    predictor: str  # the one predictor of its fused/unfused pair (costmodel.ops)
    vllm_fields: tuple[str, ...]  # the vllm_tables.Release fields its dispatch in vLLM reads
    published_regime: str = "eager"  # a published row: the fused op issued per call (its benchmark's loop)
    published_baseline: str = "nccl"  # ... against the GEMM then NCCL
    query_regime: str = "graph"  # `op`: CUDA graphs below vLLM's capture size, eager above

    def why_not(self, profile: HardwareProfile, tp: int, dtype: str, n: int | None = None) -> str | None:
        """None if this op can run on `profile` at `tp`, `dtype` and (the kernel) N, else why not (one line)."""
        if dtype not in self.dtypes:
            if self.impl == "torch" and dtype == "mxfp8":
                return "mxfp8 is the single kernel's weight format; torch's fused ops take bf16 or fp8"
            if self.impl == "kernel" and dtype == "fp8":
                return vllm_tables.CAN_RUN_FP8
            if self.impl == "torch":
                return (f"dtype {dtype!r} is out of scope (modelled: {', '.join(self.dtypes)}; torch's NVFP4 native "
                        "path is a different kernel, docs/model.md §6)")
            return f"{self.op} ({self.impl}) takes {', '.join(self.dtypes)}, not {dtype}"
        if self.impl == "kernel":
            return ops.kernel_available(profile, tp, dtype, n)
        if tp < 2:
            return "tp must be >= 2 for a collective"
        if self.op == "ag_gemm" and not ops.dtype_mode(dtype).ag_gemm_fuses:
            return "ag_gemm does not fuse with per-token (dynamic) fp8 in vLLM 0.31"
        return ops.fused_ops_available(profile, tp)


REGISTRY: dict[tuple[str, str], FusedOpKind] = {(k.op, k.impl): k for k in (
    FusedOpKind("ag_gemm", "torch", "all_gather", TORCH_DTYPES, "ops.torch_pair", ("sp_passes", "model_gates")),
    FusedOpKind("gemm_rs", "torch", "reduce_scatter", TORCH_DTYPES, "ops.torch_pair", ("sp_passes",)),
    *(FusedOpKind(op, "kernel", {"gemm_rs": "reduce_scatter", "gemm_ar": "all_reduce"}[op], vllm_tables.KERNEL_DTYPES,
                  "ops.kernel_pair", ("kernel", "muse_spark_gemm_rs"))
      for op in vllm_tables.KERNEL_OPS),
)}
OPS = tuple(dict.fromkeys(op for op, _ in REGISTRY))  # ag_gemm, gemm_rs, gemm_ar
IMPLS = tuple(dict.fromkeys(impl for _, impl in REGISTRY))  # torch, kernel
DTYPES = tuple(dict.fromkeys(d for k in REGISTRY.values() for d in k.dtypes))  # every format some op takes
TORCH_FUSES = tuple(op for op, impl in REGISTRY if impl == "torch")  # what a layer's slot can fuse (costmodel.layer)

_NOT_REGISTERED = {("gemm_ar", "torch"): "torch has no fused GEMM+all-reduce (its pipelined ops are all-gather+GEMM "
                                         "and GEMM+reduce-scatter); use --impl kernel",
                   ("ag_gemm", "kernel"): "vLLM 0.33's single kernel fuses GEMM+RS and GEMM+AR only"}


def kind(op: str, impl: str) -> FusedOpKind:
    """The registered (op, impl), or one clear error for a combination that does not exist."""
    if op not in OPS:
        raise TpcostError(f"op {op!r}: one of {', '.join(OPS)}")
    if impl not in IMPLS:
        raise TpcostError(f"impl {impl!r}: one of {', '.join(IMPLS)}")
    k = REGISTRY.get((op, impl))
    if k is None:
        raise TpcostError(_NOT_REGISTERED.get((op, impl), f"no fused {op} in {impl}"))
    return k
