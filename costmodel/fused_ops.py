"""The one registry of fused GEMM+collective ops, one entry per (op, impl) (docs/model.md §6d)."""
# The one registry of fused GEMM+collective ops (docs/model.md §6, §6b): one entry per (op, impl),
# carrying its callables. Each entry holds its weight formats, its eligibility on a GPU and shape,
# its predictor pair (the fused arm and the unfused arm vLLM dispatches), vLLM's rule for it, its
# notes and its `--at` breakdown. `tpcost op`, `tpcost evaluate` (and the benchmarks and fits that
# score through it), the model's layer (costmodel.layer) and the CLI's choices call through the
# entry; nothing outside this file tests which implementation it holds.
#
# A new implementation is one subclass of FusedOpKind (its `arms` at least) and one `register()`
# call.
#
# The defaults are what each input means, declared here once: a published row measured its fused
# op eagerly (a Python loop per call, as in the benchmarks) against the unfused arm `op` prices
# (NCCL for torch's ops, vLLM's dispatched collective for the single kernel) unless its
# `baseline_impl` column says otherwise; `op` asks about vLLM's own dispatch, under CUDA graphs
# below vLLM's capture size. vLLM's gates and the release fields each op depends on are read from
# the vLLM home (costmodel.vllm_tables), never restated here.

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from . import ops, vllm_tables
from .defaults import DEFAULT_KERNEL_SM_SHARE
from .errors import TpcostError
from .profile import HardwareProfile
from .vllm_tables import Vllm

# torch's pipelined symm-mem ops take the model's dtype modes (bf16, static and dynamic fp8, and
# fp32 on a CPU run)
TORCH_DTYPES = ("bf16", "fp8", "fp8-dynamic", "fp32")
# a published row's implementation where its impl cell is empty, and `op --impl`'s default
DEFAULT_IMPL = "torch"
SMALL_M = tuple(float(2**i) for i in range(7))  # 1, 2, ..., 64: decode rows below one M tile


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One fused op and its regime: what an entry's arms need besides profile and rows (§6d)."""

    op: str
    impl: str
    tp: int
    n: int
    k: int
    dtype: str
    cudagraph_max_tokens: (
        int  # torch's pipelined ops pay host issue time above it (0: every row eager)
    )
    vllm: Vllm = dataclasses.field(default_factory=Vllm)
    # torch's ops: "nccl", or "vllm_sp" (model-level SP's collective; issued eagerly)
    baseline: str = "nccl"
    # the fused kernel's share of the SMs (ops.sm_share_hw)
    sm_share: float = DEFAULT_KERNEL_SM_SHARE
    # a model's GEMM+AR call site: vLLM's residual-add RMSNorm follows (both arms)
    norm_after: bool = False
    # FlashInfer's AR+norm fusion limit for the unfused arm (None: vLLM's table)
    fi_max_bytes: float | None = None


class Rule(NamedTuple):
    """vLLM's own rule for one fused op on one shape (docs/model.md §9)."""

    text: str  # how vLLM decides, in words, with its cite
    tokens: int | None  # the threshold in tokens (None: no threshold, runs never or by shape)
    runs: Callable[[Any], Any]  # rows -> bool array: where vLLM runs the fused op
    baseline: str  # the unfused arm `op` prices against it: "nccl" or "vllm_sp"


class Arms(NamedTuple):
    """One call of the fused op and of its unfused arm over rows (s; values may be draws; §6d)."""

    fused_s: Any
    unfused_s: Any
    unfused_name: str  # the collective the unfused arm runs, in words
    unfused_impls: Any  # its implementation per row (str array)
    waves: Any  # the kernel's waves per row, or None


def _never(m: Any) -> Any:
    return np.zeros(np.shape(m), dtype=bool)


@dataclasses.dataclass(frozen=True)
class FusedOpKind:
    """One fused op in one implementation, as tpcost models it (§6d)."""

    # Subclasses give `arms` (the predictor pair) and override what differs: eligibility, vLLM's
    # rule, the rows it runs at, notes and the breakdown.

    op: str  # ag_gemm | gemm_rs | gemm_ar
    impl: str  # torch | kernel | ...
    collective: str  # the collective it fuses: all_gather | reduce_scatter | all_reduce
    dtypes: tuple[str, ...]  # weight formats it takes
    help: str  # one line for `--impl`'s help
    vllm_fields: tuple[str, ...] = ()  # the vllm_tables.Release fields its dispatch in vLLM reads
    small_rows: tuple[float, ...] = ()  # rows below one M tile `op` also sweeps (decode steps)
    # a published row: the fused op issued per call (its benchmark's loop)
    published_regime: str = "eager"
    # a row's baseline_impl where empty: the arm `op` prices against (nccl | vllm)
    published_baseline: str = "nccl"
    query_regime: str = "graph"  # `op`: CUDA graphs below vLLM's capture size, eager above
    takes_sm_share: bool = False  # it can run on a share of the SMs (op's --kernel-sm-share)

    def why_not(
        self, profile: HardwareProfile, tp: int, dtype: str, n: int | None = None
    ) -> str | None:
        """None if this op can run on `profile` at `tp`, `dtype` and N, else why not (§6d)."""
        if dtype not in self.dtypes:
            return f"{self.op} ({self.impl}) takes {', '.join(self.dtypes)}, not {dtype}"
        return "tp must be >= 2 for a collective" if tp < 2 else None

    def check_rows(self, m: np.ndarray, extra_m: Any, tp: int, step: int) -> None:
        """One clear error where the op cannot run at some of rows `m` (§6d)."""
        # `extra_m`: the rows the user asked.

    def rule(
        self,
        profile: HardwareProfile,
        tp: int,
        n: int,
        k: int,
        vllm: Vllm,
        capture_tokens: int | None = None,
    ) -> Rule:
        """vLLM's own use of this op on these shapes in `vllm` (`tpcost op`; §6d)."""
        # `capture_tokens`: vLLM's largest CUDA-graph capture size, where the rule depends on it.
        return Rule(
            f"none: vLLM {vllm.label} does not run {self.op} ({self.impl})", None, _never, "nccl"
        )

    def published_rule(self, profile: HardwareProfile, tp: int, n: int, k: int, vllm: Vllm) -> Rule:
        """vLLM's rule a published row of this op is scored against (`tpcost evaluate`; §6d)."""
        return self.rule(profile, tp, n, k, vllm)

    def arms(self, profile: HardwareProfile, spec: OpSpec, m: Any) -> Arms:
        """The predictor pair over rows `m` (§6d)."""
        raise NotImplementedError(f"{type(self).__name__}.arms")

    def notes(self, profile: HardwareProfile, spec: OpSpec, m: np.ndarray) -> list[str]:
        """What the reader of `tpcost op` should know about this op's arms (§6d)."""
        return []

    def event(self, spec: OpSpec, m_prev: int, m: int) -> str | None:
        """What changes between rows m_prev and m on the host side (None: nothing; §6d)."""
        return None

    def why_not_served(self, profile: HardwareProfile, tp: int, dtype: str, n: int) -> str | None:
        """None if vLLM can serve this op at a model's call site here, else why not (§6d)."""
        # Why vLLM's switch has no effect.
        return self.why_not(profile, tp, dtype, n)

    def pipelined(self, hw: ops.Hw, rows: Any, n: int, k: int, tp: int, eager: bool) -> ops.FusedOp:
        """The op's parts in a layer slot under vLLM <= 0.31's AsyncTP (§6)."""
        raise TpcostError(f"{self.op} ({self.impl}) has no pipelined form for a layer slot")

    def fused_breakdown(self, hw: ops.Hw, spec: OpSpec, rows: np.ndarray, t_fused_s: float) -> dict:
        """The fused arm of one call at `rows`, part by part (`tpcost op --at`; §6d)."""
        return {"t_s": t_fused_s, "bound": "fused op"}

    def breakdown_text(self, fused: Mapping[str, Any]) -> str:
        """fused_breakdown in one line (§6d)."""
        return f"fused {fused['t_s'] * 1e6:.2f} us"

    def published_speedup(
        self,
        prof: HardwareProfile,
        row: Mapping[str, Any],
        vllm: Vllm,
        eager: bool,
        harness_s: float,
    ) -> tuple[np.ndarray, int]:
        """(speedup of every draw, hidden size vLLM's rule sees) of one published row (§16)."""
        # Its benchmark's own time `harness_s` on both arms.
        spec = OpSpec(
            self.op,
            self.impl,
            row["tp"],
            row["n"],
            row["k"],
            row["dtype"],
            0 if eager else 2**31,
            vllm,
        )
        a = self.arms(prof, spec, float(row["m"]))
        return np.ravel((a.unfused_s + harness_s) / (a.fused_s + harness_s)), row["n"]


def _us(x: float) -> str:
    return f"{x * 1e6:.2f} us"


@dataclasses.dataclass(frozen=True)
class TorchPipelined(FusedOpKind):
    """torch's pipelined symmetric-memory op: ops.torch_pair (§6)."""

    # vLLM <= 0.31's AsyncTP; 0.34's model-level SP.

    def why_not(self, profile, tp, dtype, n=None):
        if dtype not in self.dtypes:
            if dtype == "mxfp8":
                return (
                    "mxfp8 is the single kernel's weight format; torch's fused ops take bf16 or fp8"
                )
            return (
                f"dtype {dtype!r} is out of scope (modelled: {', '.join(self.dtypes)}; torch's "
                "NVFP4 native "
                "path is a different kernel, docs/model.md §6)"
            )
        if tp < 2:
            return "tp must be >= 2 for a collective"
        if self.op == "ag_gemm" and not ops.dtype_mode(dtype).ag_gemm_fuses:
            return "ag_gemm does not fuse with per-token (dynamic) fp8 in vLLM 0.31"
        return ops.fused_ops_available(profile, tp)

    def check_rows(self, m, extra_m, tp, step):
        if np.any(m % tp):
            bad = [int(x) for x in extra_m if x % tp]
            if bad:
                raise TpcostError(
                    f"--m {bad[0]}: torch's fused ops split M into tp={tp} chunks; every M must be "
                    "a "
                    "multiple of tp"
                )
            raise TpcostError(
                f"--tp {tp}: torch's fused ops split M into tp chunks, and M runs over the "
                "multiples of "
                f"{step}, which {tp} does not divide; use a tp that divides {step}"
            )

    def rule(self, profile, tp, n, k, vllm, capture_tokens=None):
        hidden = n if self.op == "gemm_rs" else k  # the scattered N or the gathered K
        ident = profile.identity
        return Rule(
            *vllm_tables.torch_op_rule(
                vllm, self.op, ident.vendor, ident.compute_capability, hidden, tp, capture_tokens
            )
        )

    def published_rule(self, profile, tp, n, k, vllm):
        """The SP table of the newest release with the SP passes (§6d)."""
        # The dispatch the rows' NCCL arm stands for.
        return self.rule(profile, tp, n, k, Vllm(vllm_tables.newest_sp_release().version))

    def arms(self, profile, spec, m):
        hw = ops.Hw(profile, spec.dtype)
        p = ops.torch_pair(hw, spec.op, m, spec.n, spec.k, spec.tp, baseline=spec.baseline)
        if spec.baseline == "vllm_sp":
            return Arms(p.fused_eager_s, p.unfused_s, "vLLM's sp_all_gather", p.unfused_impls, None)
        name = "NCCL all-gather" if spec.op == "ag_gemm" else "NCCL reduce-scatter"
        fused = np.where(
            vllm_tables.runs_eagerly(m, spec.cudagraph_max_tokens), p.fused_eager_s, p.fused_graph_s
        )
        return Arms(fused, p.unfused_s, name, np.full(np.shape(m), p.unfused_impl), None)

    def notes(self, profile, spec, m):
        out = []
        if spec.baseline == "vllm_sp":
            out.append(
                "model-level SP (vLLM >= 0.34's sp_all_gather_matmul): issued eagerly at every M "
                "(vLLM cannot "
                "run it while a CUDA graph is captured, so it runs only above the capture size or "
                "with "
                "--enforce-eager); unfused arm: sp_all_gather (vLLM's custom all-gather where the "
                "profile "
                "times it, else NCCL), then the GEMM; vLLM's constant counts rows per rank, "
                "ceil(M/tp)"
            )
        elif spec.op == "gemm_rs":
            out.append(
                "unfused arm: the GEMM, then NCCL reduce-scatter (vLLM <= 0.31's compile-pass SP "
                "calls the "
                "generic reduce_scatter, which goes to NCCL)"
            )
        cap = spec.cudagraph_max_tokens
        if spec.baseline == "nccl" and m[-1] > cap:
            out.append(
                f"M > {cap} runs eagerly (vLLM's largest CUDA-graph capture size; "
                "--cudagraph-max-tokens, "
                "--enforce-eager): torch's Python pipeline pays the host's issue time per call "
                "there, so the "
                "fused time jumps at the first eager row; below, graphs replay with no host cost"
            )
        return out

    def event(self, spec, m_prev, m):
        cap = spec.cudagraph_max_tokens
        if spec.baseline == "nccl" and m_prev <= cap < m:
            return (
                f"eager from here (M > {cap}, vLLM's largest CUDA-graph capture size): torch's "
                "pipeline pays the "
                "host's issue time per call"
            )
        return None

    def pipelined(self, hw, rows, n, k, tp, eager):
        """ops.fused_ag_gemm (gathered input at the all-gather width) or ops.fused_gemm_rs (§6)."""
        if self.op == "ag_gemm":
            return ops.fused_ag_gemm(hw, rows, n, k, tp, hw.mode.ag_bytes, eager)
        return ops.fused_gemm_rs(hw, rows, n, k, tp, eager)

    def fused_breakdown(self, hw, spec, rows, t_fused_s):
        eager = (
            bool(vllm_tables.runs_eagerly(rows, spec.cudagraph_max_tokens)[0])
            or spec.baseline == "vllm_sp"
        )
        fo = self.pipelined(hw, rows, spec.n, spec.k, spec.tp, eager)
        n, k = spec.n, spec.k
        parts = {
            "t_chunk_gemms_contended_s": _one(fo.t_chunks_contended_s),
            "t_pulls_s": _one(fo.t_pulls_s),
            "t_barriers_s": _one(fo.t_sync_s),
            "t_copies_reduction_s": _one(fo.t_memory_s),
        }
        bound = {
            "t_chunk_gemms_contended_s": "chunk GEMMs",
            "t_pulls_s": "pulls",
            "t_barriers_s": "barriers",
            "t_copies_reduction_s": "copies / reduction",
        }[max(parts, key=lambda p: parts[p])]
        host = _one(fo.t_host_s)
        return {
            "t_s": t_fused_s,
            "t_gpu_s": _one(fo.t_gpu_s),
            "t_host_s": host,
            "eager": eager,
            "t_gemm_whole_s": _one(hw.t_gemm(rows, n, k)),
            "t_chunk_gemms_alone_s": _one(fo.t_chunks_s),
            **parts,
            "bound": "host issue" if host + _one(fo.t_tail_s) > _one(fo.t_gpu_s) else bound,
        }

    def breakdown_text(self, f):
        parts = ", ".join(
            f"{name} {_us(f[k])}"
            for name, k in (
                ("chunk GEMMs (contended)", "t_chunk_gemms_contended_s"),
                ("pulls", "t_pulls_s"),
                ("barriers", "t_barriers_s"),
                ("copies / reduction", "t_copies_reduction_s"),
            )
        )
        return (
            f"fused {_us(f['t_s'])} (bound: {f['bound']}; "
            f"{'eager' if f['eager'] else 'CUDA-graph replay'}): GPU "
            f"{_us(f['t_gpu_s'])}, host issue {_us(f['t_host_s'])}; whole GEMM "
            f"{_us(f['t_gemm_whole_s'])}, chunk "
            f"GEMMs alone {_us(f['t_chunk_gemms_alone_s'])}; {parts}"
        )

    def published_speedup(self, prof, row, vllm, eager, harness_s):
        """The base's speedup against NCCL at an M the tp chunks divide (§16)."""
        # vLLM's SP table reads the gathered K (ag_gemm) or the scattered N as the hidden size.
        if row["m"] % row["tp"]:
            raise TpcostError(f"m={row['m']} not divisible by tp={row['tp']}")
        s, _ = super().published_speedup(prof, row, vllm, eager, harness_s)
        return s, row["k"] if self.op == "ag_gemm" else row["n"]


def _one(x: Any) -> float:
    """The one row of an array, as a float."""
    return float(np.asarray(x).ravel()[0])


@dataclasses.dataclass(frozen=True)
class SingleKernel(FusedOpKind):
    """vLLM's single-kernel fused GEMM+RS/AR over NVLink multicast: ops.kernel_pair (§6b)."""

    # gemm_rs_ar, the SM100 family.

    def why_not(self, profile, tp, dtype, n=None):
        if dtype not in self.dtypes:
            return (
                vllm_tables.CAN_RUN_FP8
                if dtype == "fp8"
                else super().why_not(profile, tp, dtype, n)
            )
        return ops.kernel_available(profile, tp, dtype, n)

    def why_not_served(self, profile, tp, dtype, n):
        """Where the kernel cannot run, or vLLM does not ship it on this GPU (§6b)."""
        # ops.kernel_shipped.
        return self.why_not(profile, tp, dtype, n) or ops.kernel_shipped(profile)

    def rule(self, profile, tp, n, k, vllm, capture_tokens=None):
        cc = profile.identity.compute_capability
        if not vllm_tables.kernel_ships_on(cc):
            return Rule(
                f"none: vLLM {vllm.label} does not run gemm_rs_ar on {profile.name} (SM100 family "
                "only), so no row runs it and no saving is priced against a rule",
                None,
                _never,
                "nccl",
            )
        return Rule(*vllm_tables.kernel_rule(vllm, self.op, cc, tp, n, k), "nccl")

    def published_rule(self, profile, tp, n, k, vllm):
        return Rule(
            *vllm_tables.kernel_rule(vllm, self.op, profile.identity.compute_capability, tp, n, k),
            "nccl",
        )

    def arms(self, profile, spec, m):
        hw = ops.Hw(profile, "fp8" if spec.dtype == "mxfp8" else spec.dtype)
        gemm = ops.KernelGemm(
            spec.op, spec.n, spec.k, spec.tp, spec.dtype, spec.norm_after, spec.sm_share
        )
        pair = ops.kernel_pair(hw, gemm, m, vllm=spec.vllm, fi_max_bytes=spec.fi_max_bytes)
        name = (
            "vLLM's model-level-SP reduce-scatter"
            if spec.op == "gemm_rs"
            else "vLLM's dispatched all-reduce"
        )
        waves = np.broadcast_to(pair.kernel.waves, np.shape(m))
        return Arms(
            pair.fused_s,
            pair.unfused_s,
            name,
            pair.unfused_impls,
            waves if waves.ndim == 1 else None,
        )

    def notes(self, profile, spec, m):
        out = []
        if spec.dtype == "mxfp8":
            out.append(
                "mxfp8: the fused kernel adds its activation-quantise kernel (m·k·(2+1) bytes)"
            )
        shipped = ops.kernel_shipped(profile)
        if shipped:
            out.append(shipped)
        if spec.op == "gemm_rs":
            out.append(
                "unfused arm: the GEMM, then the reduce-scatter model-level SP runs (vLLM's custom "
                "backends: "
                "Lamport up to 16 MiB, multimem to 64 MiB on SM100, else NCCL; their curves are "
                "physics, tier "
                "assumed: no released row times them)"
            )
        sms = int(profile.identity.sm_count)
        held = int(ops.sm_share_hw(ops.Hw(profile, "bf16"), spec.sm_share).gemm["sm_count"])
        on = (
            f"alone on all {sms} SMs (no concurrent work)"
            if spec.sm_share == DEFAULT_KERNEL_SM_SHARE
            else f"on {held} of the {sms} "
            f"SMs (--kernel-sm-share {spec.sm_share:g}; the rest held back)"
        )
        out.append(
            f"setting: the kernel {on}, at TP {spec.tp}, against the unfused arm named above with "
            "no norm after it; how the crossover moves "
            "with SMs held back, a norm after the all-reduce and the GPU count: "
            "docs/vllm-thresholds.md "
            '"GEMM-AR settings"'
        )
        return out

    def fused_breakdown(self, hw, spec, rows, t_fused_s):
        kern = ops.fused_kernel(hw, spec.op, rows, spec.n, spec.k, spec.tp, spec.sm_share)
        t_comm = _one(kern.t_comm_s)
        return {
            "t_s": t_fused_s,
            "t_gemm_whole_s": _one(kern.t_gemm_s),
            "t_comm_s": t_comm,
            "waves": int(_one(kern.waves)),
            "ctas": int(_one(kern.ctas)),
            "tiles": int(_one(kern.tiles)),
            "multicast_bw_bytes_per_s": _one(kern.multicast_bw_bytes_per_s),
            "egress_bytes": _one(kern.egress_bytes),
            "t_fixed_s": _one(kern.t_fixed_s),
            "t_copy_s": _one(kern.t_copy_s),
            "bound": "multimem traffic" if t_comm > _one(kern.t_gemm_s) else "GEMM",
        }

    def breakdown_text(self, f):
        return (
            f"fused {_us(f['t_s'])} (bound: {f['bound']}): GEMM alone {_us(f['t_gemm_whole_s'])}, "
            "multimem "
            f"traffic {_us(f['t_comm_s'])} ({f['egress_bytes'] / 1e6:.3g} MB egress at "
            f"{f['multicast_bw_bytes_per_s'] / 1e9:.1f} GB/s), {f['tiles']} tiles on {f['ctas']} "
            "CTAs in "
            f"{f['waves']} wave(s), fixed {_us(f['t_fixed_s'])}, copy {_us(f['t_copy_s'])}"
        )

    def published_speedup(self, prof, row, vllm, eager, harness_s):
        op, dtype, n = row["op"], row["dtype"], row["n"]
        hw = ops.Hw(prof, "fp8" if dtype == "mxfp8" else "bf16")
        baseline = row.get("baseline_impl") or self.published_baseline
        pair = ops.kernel_pair(
            hw,
            ops.KernelGemm(op, n, row["k"], row["tp"], dtype),
            float(row["m"]),
            baseline=baseline,
            vllm=vllm,
        )
        return np.ravel((pair.unfused_s + harness_s) / (pair.fused_s + harness_s)), n


REGISTRY: dict[tuple[str, str], FusedOpKind] = {}


def register(k: FusedOpKind) -> FusedOpKind:
    """Add one (op, impl) to the registry; every command reads it from then on (§6d)."""
    REGISTRY[(k.op, k.impl)] = k
    return k


_TORCH_HELP = (
    "torch's pipelined symm-mem op (vLLM <= 0.31; with --vllm-version 0.34 --op "
    "ag_gemm, model level)"
)
_KERNEL_HELP = "the single-kernel fused GEMM+RS/AR (vLLM's gemm_rs_ar from 0.31, SM100 family)"
for _op, _coll, _fields in (
    ("ag_gemm", "all_gather", ("sp_passes", "model_gates")),
    ("gemm_rs", "reduce_scatter", ("sp_passes",)),
):
    register(TorchPipelined(_op, "torch", _coll, TORCH_DTYPES, _TORCH_HELP, _fields))
for _op in vllm_tables.KERNEL_OPS:
    register(
        SingleKernel(
            _op,
            "kernel",
            {"gemm_rs": "reduce_scatter", "gemm_ar": "all_reduce"}[_op],
            vllm_tables.KERNEL_DTYPES,
            _KERNEL_HELP,
            ("kernel", "muse_spark_gemm_rs"),
            SMALL_M,
            published_baseline="vllm",
            takes_sm_share=True,
        )
    )
# a layer's slot (layer)
TORCH_FUSES = tuple(op for (op, _), k in REGISTRY.items() if isinstance(k, TorchPipelined))


def op_names() -> tuple[str, ...]:
    """Every registered op: ag_gemm, gemm_rs, gemm_ar (§6d)."""
    return tuple(dict.fromkeys(op for op, _ in REGISTRY))


def impl_names() -> tuple[str, ...]:
    """Every registered implementation: torch, kernel, ... (§6d)."""
    return tuple(dict.fromkeys(impl for _, impl in REGISTRY))


def dtype_names() -> tuple[str, ...]:
    """Every weight format some registered op takes (§6d)."""
    return tuple(dict.fromkeys(d for k in REGISTRY.values() for d in k.dtypes))


def impl_help() -> str:
    """`--impl`'s help: each implementation in one line (§6d)."""
    seen = {impl: k.help for (_, impl), k in REGISTRY.items()}
    return "; ".join(f"{impl}: {h}" for impl, h in seen.items())


def kernel_entry(op: str, vllm: Vllm) -> FusedOpKind:
    """The entry that prices `vllm`'s single kernel for op (KernelGate.impl; docs/model.md §6b)."""
    k = vllm.release.kernel
    return kind(op, k.impl if k is not None else "kernel")


def symm_mem_entry(op: str, vllm: Vllm) -> FusedOpKind:
    """The entry that prices torch's symm-mem op `vllm` runs for op (§6)."""
    # Release.symm_mem_impl.
    return kind(op, vllm.release.symm_mem_impl)


_NOT_REGISTERED = {
    (
        "gemm_ar",
        "torch",
    ): "torch has no fused GEMM+all-reduce (its pipelined ops are all-gather+GEMM "
    "and GEMM+reduce-scatter); use --impl kernel",
    ("ag_gemm", "kernel"): "vLLM 0.33's single kernel fuses GEMM+RS and GEMM+AR only",
}


def kind(op: str, impl: str) -> FusedOpKind:
    """The registered (op, impl), or one clear error for a combination that does not exist (§6d)."""
    if op not in op_names():
        raise TpcostError(f"op {op!r}: one of {', '.join(op_names())}")
    if impl not in impl_names():
        raise TpcostError(f"impl {impl!r}: one of {', '.join(impl_names())}")
    k = REGISTRY.get((op, impl))
    if k is None:
        raise TpcostError(_NOT_REGISTERED.get((op, impl), f"no fused {op} in {impl}"))
    return k
