"""vLLM's hand cutoffs in model code against tpcost's value for each (docs/model.md §15)."""
# vLLM's hand cutoffs in model code (0.34 on: costmodel.vllm_tables.ModelGate) against tpcost's
# value for each.
#
# A gate is a token count at which a model's code switches between a fused GEMM+collective (or a
# fused collective) and the unfused path. For the call sites the gate covers
# (costmodel.shapes.KernelModel), both arms are priced over every step size N = 1 ..
# max_num_batched_tokens with the one predictor of each pair (costmodel.ops):
#
# - "gemm_rs": the single-kernel GEMM+RS (its fused_ops entry) against the GEMM then model-level
#   SP's reduce-scatter;
# - "ag_gemm": torch's fused_all_gather_matmul, issued eagerly (ops.torch_pair, baseline
#   "vllm_sp"), against sp_all_gather then the GEMM; under CUDA-graph capture (N <= the capture
#   size) vLLM cannot run it;
# - "oneshot_ar": FlashInfer's one-shot all-reduce fused with the norms against vLLM's all-reduce
#   then the norm;
# - "finalize_ar": a MoE's top-k finalize fused into a one-shot Lamport all-reduce
#   (ops.ar_tail_pair, docs/model.md §4b) against the finalize kernel, vLLM's all-reduce and what
#   follows it (the norm, MXFP8 quantisation). One GATE_OPS entry per kind carries its sites, its
#   predictor pair and where its fused path can run.
#
# tpcost's value is the threshold minimising the expected time per forward on the workload, the
# fused side paying the risk premium (costmodel.analysis.decide_cutoff / decide_fusion_limit, the
# rule of every other decision), on the step sizes where the gate decides at all (at or above the
# SP floor for the SP gates, below it for the one-shot range, every size for the finalize); its
# band is the 5-95 % of that value over the profile's fixed-seed draws (on at most BAND_GRID_MAX
# step sizes, costmodel.analysis.band_grid). A gate tpcost does not derive (Muse Spark's SP floor,
# the switch between two MoE kernels) is reported with vLLM's value only.

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from . import formulas as F
from . import fused_ops, ops, vllm_tables
from .analysis import (
    BAND_DRAWS,
    BAND_SEED,
    band_edges,
    band_grid,
    decide_cutoff,
    decide_fusion_limit,
    perturbed_values,
)
from .model import RunConfig
from .vllm_tables import NATIVE_MEGA_MOE, ModelGate, Parallel
from .workload import weights_on


@dataclasses.dataclass(frozen=True)
class GateDecision:
    """One of vLLM's model gates at this GPU, TP and traffic, beside tpcost's value (§15)."""

    # Tokens of a step; per rank where the gate counts per rank.

    gate: ModelGate
    tp: int
    vllm_tokens: int | None  # vLLM's constant at this TP (None: the gate has no value here)
    # tpcost's value; None: never (a "min" gate) or not derived; 0: off (a "max" gate)
    tpcost_tokens: int | None
    # 5 % and 95 % of tpcost's value over the draws
    band_tokens: tuple[int | None, int | None] | None
    expected_at_vllm_s: float | None  # per forward on the workload, over the sites the gate covers
    expected_at_tpcost_s: float | None
    sites: tuple = ()  # costmodel.shapes.CallSite: what was priced
    # None: the gate acts in this setup; else why it does not (the value is for its shapes)
    applies: str | None = None
    why_not_derived: str | None = None  # the gate is printed only
    sp_floor_tokens: int = 1  # the fewest tokens of a step that shards the stream in this setup
    multi_node: bool = False  # vLLM's multi-node constant holds (the TP group spans hosts)

    @property
    def constant(self) -> str:
        """The constant that holds vLLM's value here (§15)."""
        # A gate's multi-node one where the TP group spans hosts.
        g = self.gate
        return g.multi_node_constant if self.multi_node else g.constant

    @property
    def saving_s(self) -> float | None:
        if self.expected_at_vllm_s is None or self.expected_at_tpcost_s is None:
            return None
        return self.expected_at_vllm_s - self.expected_at_tpcost_s

    def to_json(self) -> dict:
        g = self.gate
        return {
            "gate": g.key,
            "op": g.op,
            "constant": self.constant,
            "where": g.where,
            "used": g.used,
            "measured_on": g.measured_on,
            "activates": g.activates,
            "exposed": g.exposed,
            "runs_from": g.runs_from,
            "per_rank": g.per_rank,
            "tp": self.tp,
            "vllm_tokens": self.vllm_tokens,
            "tpcost_tokens": self.tpcost_tokens,
            "band_tokens": None if self.band_tokens is None else list(self.band_tokens),
            "expected_at_vllm_s": self.expected_at_vllm_s,
            "expected_at_tpcost_s": self.expected_at_tpcost_s,
            "saving_s": self.saving_s,
            "applies": self.applies is None,
            "why_not": self.applies,
            "why_not_derived": self.why_not_derived,
            "sp_floor_tokens": self.sp_floor_tokens,
            "sites": [s.to_json() for s in self.sites],
        }


def gate_value(gate: ModelGate, tp: int, spans_nodes: bool = False) -> int | None:
    """vLLM's constant at this TP (§15)."""
    # A per-TP table, or one number; its multi-node value where the TP group spans hosts and the
    # gate has one.
    if spans_nodes and gate.multi_node_value is not None:
        return int(gate.multi_node_value)
    v = gate.value
    if isinstance(v, dict):
        return None if tp not in v else int(v[tp])
    return int(v)


def _gemm_rs_arms(profile, s, n: np.ndarray, run: RunConfig) -> tuple[Any, Any]:
    """The release's single-kernel GEMM+RS entry against the GEMM then model-level SP's
    reduce-scatter."""
    vllm = run.regime.vllm
    entry = fused_ops.kernel_entry("gemm_rs", vllm)
    spec = fused_ops.OpSpec("gemm_rs", entry.impl, run.tp, s.n, s.k, s.weights or "bf16", 0, vllm)
    arms = entry.arms(profile, spec, n)
    return arms.fused_s, arms.unfused_s


def _ag_gemm_arms(profile, s, n: np.ndarray, run: RunConfig) -> tuple[Any, Any]:
    """torch's eager fused_all_gather_matmul (its fused_ops entry, model-level SP's baseline)
    against sp_all_gather then the GEMM (every rank's shard padded to ceil(N/tp) rows)."""
    tp = run.tp
    entry = fused_ops.symm_mem_entry("ag_gemm", run.regime.vllm)
    spec = fused_ops.OpSpec(
        "ag_gemm", entry.impl, tp, s.n, s.k, "bf16", 0, run.regime.vllm, baseline="vllm_sp"
    )
    arms = entry.arms(profile, spec, tp * np.ceil(n / tp))
    return arms.fused_s, arms.unfused_s


def _oneshot_ar_arms(profile, s, n: np.ndarray, run: RunConfig) -> tuple[Any, Any]:
    """FlashInfer's one-shot all-reduce + boundary norm against vLLM's all-reduce then the norm."""
    hw = ops.Hw(profile, "bf16")
    lat, bw = profile.collective("flashinfer_ar_rmsnorm", run.tp)
    return (
        F.t_all_reduce_s(n * (s.n * hw.act_bytes), lat, bw, run.tp),
        ops.unfused_all_reduce_norm_s(hw, n, s.n, run.tp, vllm=run.regime.vllm),
    )


def _finalize_ar_arms(profile, s, n: np.ndarray, run: RunConfig) -> tuple[Any, Any]:
    """The MoE finalize fused into a one-shot all-reduce against finalize, all-reduce and the rest
    (ops.ar_tail_pair, docs/model.md §4b)."""
    pair = ops.ar_tail_pair(
        ops.Hw(profile, "bf16"), s.tail, n, run.tp, vllm=run.regime.vllm, cross_host=s.cross_host
    )
    return pair.fused_s, pair.unfused_s


def _gemm_sites(km, gate: ModelGate, par: Parallel, vllm) -> list:
    """The reduce-scatter sites for GEMM-RS, o_proj for the one-shot all-reduce, the fused qkv
    projection for the all-gather + GEMM."""
    if gate.op == "ag_gemm":
        return km.call_sites("ag_gemm", par, vllm)
    sites = km.call_sites("gemm_rs", par, vllm)
    return [s for s in sites if s.name == "o_proj"] if gate.op == "oneshot_ar" else sites


@dataclasses.dataclass(frozen=True)
class GateOp:
    """One kind of model gate: sites, predictor pair, where it runs, the curve it needs (§15)."""

    # the sites it covers, the one predictor pair of a site (fused, unfused seconds per call over
    # step sizes), where its fused path can run, and the profile curve that pair needs.

    sites: Callable[..., list]  # (km, gate, par, vllm)
    # (profile, site, n, run); None: printed, never derived
    arms: Callable[..., tuple[Any, Any]] | None
    fused_range: str  # "from_sp_floor": N >= the SP floor; "below_sp_floor": N < it; "any": every N
    curve: str | None = None  # a collective of the profile the fused arm is priced on
    # (profile, run) -> why the fused arm cannot be priced on this profile (None: it can)
    unpriced: Callable[..., str | None] | None = None


GATE_OPS: dict[str, GateOp] = {
    "gemm_rs": GateOp(
        _gemm_sites,
        _gemm_rs_arms,
        "from_sp_floor",
        unpriced=lambda profile, run: ops.kernel_unpriceable(profile),
    ),
    "ag_gemm": GateOp(_gemm_sites, _ag_gemm_arms, "from_sp_floor"),
    "oneshot_ar": GateOp(_gemm_sites, _oneshot_ar_arms, "below_sp_floor", "flashinfer_ar_rmsnorm"),
    "finalize_ar": GateOp(
        lambda km, gate, par, vllm: km.finalize_sites(par),
        _finalize_ar_arms,
        "any",
        "flashinfer_ar_rmsnorm",
    ),
    "sp_floor": GateOp(lambda km, gate, par, vllm: [], None, "from_sp_floor"),
}


def gate_arms(profile, gate: ModelGate, sites, n: np.ndarray, run: RunConfig) -> tuple[Any, Any]:
    """(fused, unfused) seconds per forward at each step size `n`, summed over `sites` (§15)."""
    # Profile values may be draws of shape (D, 1); the caller passes only the step sizes where the
    # fused path can run.
    arms = GATE_OPS[gate.op].arms
    assert arms is not None, gate.key
    f: Any = 0.0
    u: Any = 0.0
    for s in sites:
        sf, su = arms(profile, s, n, run)
        f, u = f + sf * s.calls_per_forward, u + su * s.calls_per_forward
    f, u = np.broadcast_arrays(np.asarray(f, dtype=float), np.asarray(u, dtype=float))
    return f, u


def _runs(gate: ModelGate, n: np.ndarray, threshold: int | None, tp: int) -> np.ndarray:
    """Where the fused path runs under a threshold (tokens; per rank for a per-rank gate; None:
    never), of the step sizes `n` where it can run."""
    if threshold is None:
        return np.zeros(n.shape, dtype=bool)
    size = np.ceil(n / tp) if gate.per_rank else n
    return size >= threshold if gate.runs_from == "min" else size <= threshold


def _decide(gate: ModelGate, n: np.ndarray, f, u, w, margin: float, tp: int) -> Any:
    """tpcost's threshold (tokens, per rank for a per-rank gate) for arms of shape (n,) or (D,
    n)."""
    if gate.runs_from == "max":
        if np.ndim(f) == 1:
            return decide_fusion_limit(n, f, u, margin, w)
        return np.array(
            [decide_fusion_limit(n, f[i], u[i], margin, w) for i in range(f.shape[0])], dtype=float
        )
    c = decide_cutoff(n, u, f, margin, w)
    if gate.per_rank:
        return (
            None
            if c is None
            else (np.ceil(np.asarray(c, dtype=float) / tp) if np.ndim(c) else int(np.ceil(c / tp)))
        )
    return c


def decide_gate(
    profile,
    gate: ModelGate,
    sites,
    run: RunConfig,
    sp_floor: int,
    applies: str | None = None,
    spans_nodes: bool = False,
) -> GateDecision:
    """vLLM's gate against tpcost's value over `sites` on run's traffic (§15)."""
    # sp_floor: the fewest tokens of a step that shards the stream; spans_nodes: the TP group
    # crosses hosts, where a gate has a multi-node constant.
    gd = _decide_gate(profile, gate, sites, run, sp_floor, applies, spans_nodes)
    return dataclasses.replace(gd, multi_node=spans_nodes and gate.multi_node_value is not None)


def _decide_gate(
    profile,
    gate: ModelGate,
    sites,
    run: RunConfig,
    sp_floor: int,
    applies: str | None,
    spans_nodes: bool,
) -> GateDecision:
    tp = run.tp
    vllm_tok = gate_value(gate, tp, spans_nodes)
    priced = tuple(s for s in sites if s.weights is not None)
    kind = GATE_OPS[gate.op]

    def undecided(why_not_derived: str | None, applies_here: str | None, at=priced) -> GateDecision:
        """vLLM's value alone: tpcost derives none here (why_not_derived), or none pays."""
        return GateDecision(
            gate, tp, vllm_tok, None, None, None, None, at, applies_here, why_not_derived, sp_floor
        )

    if not gate.derived or kind.arms is None:
        return undecided(
            "vLLM's switch between two MoE kernels, which tpcost does not model", applies
        )
    if not priced:
        why = "; ".join(f"{s.name}: {s.refused}" for s in sites) or "no call site"
        return undecided(
            "no call site the fused path takes", applies or f"vLLM runs it nowhere ({why})", ()
        )
    unpriced = kind.unpriced(profile, run) if kind.unpriced else None
    if unpriced:
        return undecided(unpriced, applies or unpriced)
    if kind.curve and not profile.has_collective(kind.curve):
        return undecided(
            f"{profile.name} has no {kind.curve} curve (the one-shot all-reduce the fused path is "
            "priced on)",
            applies,
        )
    n = np.arange(1, run.max_num_batched_tokens + 1, dtype=float)
    w = weights_on(run.workload, n)
    if kind.fused_range == "any":
        can_fuse = np.ones(n.shape, dtype=bool)
    elif kind.fused_range == "below_sp_floor":  # the one-shot range acts below the SP floor only
        can_fuse = n < sp_floor
    else:
        can_fuse = n >= sp_floor
        # can_sp_all_gather_matmul: not while a CUDA graph is being captured
        if gate.op == "ag_gemm":
            cap = vllm_tables.capture_size(
                run.regime.cudagraph_max_tokens, profile.identity.compute_capability
            )
            can_fuse &= vllm_tables.runs_eagerly(n, cap)
        align = vllm_tables.gate_alignment(gate, tp)
        if align:
            can_fuse &= n % align == 0
    if not can_fuse.any():
        return undecided(
            None, applies or "no step size of this budget and regime takes the fused path"
        )
    # only the step sizes where the fused path can run decide: elsewhere both settings run the
    # unfused path (and no premium is paid), whatever the threshold
    nf, wf = n[can_fuse], w[can_fuse]
    f, u = gate_arms(profile, gate, priced, nf, run)
    cut = _decide(gate, nf, f, u, wf, run.margin, tp)
    base = float(np.sum(w[~can_fuse] * gate_arms(profile, gate, priced, n[~can_fuse], run)[1]))

    def expected(threshold):
        return base + float(np.sum(wf * np.where(_runs(gate, nf, threshold, tp), f, u)))

    drawn = profile.with_values(
        perturbed_values(profile, BAND_DRAWS, BAND_SEED), None, mark_modified=False
    )
    # at most BAND_GRID_MAX step sizes for the draws (each a block's weight)
    nb, wb, _ = band_grid(nf, wf)
    fd, ud = gate_arms(drawn, gate, priced, nb, run)
    band = band_edges(_decide(gate, nb, fd, ud, wb, run.margin, tp))
    cut_i = None if cut is None or not np.isfinite(cut) else int(cut)
    return GateDecision(
        gate,
        tp,
        vllm_tok,
        cut_i,
        band,  # type: ignore[arg-type]
        None if vllm_tok is None else expected(vllm_tok),
        expected(cut_i),
        priced,
        applies,
        None,
        sp_floor,
    )


def _why_not(profile, gate: ModelGate, km, par: Parallel, run: RunConfig) -> str | None:
    """Why the gate does not act for this model, setup and GPU (None: it does), read from the code's
    conditions."""
    tp = run.tp
    vllm = run.regime.vllm
    if gate.op in ("gemm_rs", "ag_gemm", "oneshot_ar", "sp_floor") and not km.model_level_sp(par):
        return (
            f"model-level SP is off in this setup (it needs {km.sp_text()}), so "
            "the stream is never sharded and the gate is not reached"
        )
    refused = km.vllm_refuses(par)
    if refused:
        return refused
    cap = profile.identity.compute_capability
    if gate.op == "gemm_rs" and km.family == "muse_spark":
        return vllm_tables.muse_gemm_rs_blocker(vllm, cap, tp, run.max_num_batched_tokens)
    elif gate.op == "gemm_rs":
        why = fused_ops.kernel_entry("gemm_rs", vllm).why_not_served(profile, tp, "bf16", km.hidden)
        if why:
            return why
        lo = gate_value(gate, tp)
        if lo is not None and run.max_num_batched_tokens < lo:
            return (
                f"max_num_batched_tokens {run.max_num_batched_tokens} < {lo}: vLLM refuses the "
                "kernel at init"
            )
    elif gate.op == "ag_gemm":
        why = fused_ops.symm_mem_entry("ag_gemm", vllm).why_not(profile, tp, "bf16")
        if why:
            return why
    elif gate.op == "sp_floor" and km.sp_floor_tokens(par, vllm) <= tp:
        return (
            "the threshold is 0 here (it needs an NVFP4 checkpoint, TP 4/8, DP = PP = 1): SP from "
            "max(tp, 1) = "
            f"{tp} tokens"
        )
    elif gate.op == "finalize_ar":
        return _finalize_ar_blocker(profile, km, par)
    return None


def _finalize_ar_blocker(profile, km, par: Parallel) -> str | None:
    """Why no fused MoE finalize + all-reduce is built for this model and setup (None: it is), read
    from vLLM 0.34's conditions (the gate's `activates`)."""
    cap = profile.identity.compute_capability
    if par.tp <= 1:
        return "TP 1: no all-reduce to fuse"
    if not vllm_tables.sm100_family(cap):
        return (
            "the kernel is built on the SM100 family only (is_device_capability_family(100)); "
            f"here cc {cap or 'n/a'}"
        )
    if not ops.has_multicast(profile):
        return (
            f"the kernel needs NVLink multicast on every TP rank, which {profile.name} does "
            "not have"
        )
    if km.model_level_sp(par):
        return (
            "under model-level SP the MoE output is reduce-scattered, not all-reduced: no "
            "finalize to fuse"
        )
    if km.family == "minimax_m3":
        if par.enable_expert_parallel:
            return (
                "supports_fused_moe_finalize: not under expert parallel "
                "(--enable-expert-parallel is given)"
            )
        if km.model_dtype != "bfloat16":
            return f"supports_fused_moe_finalize: a bf16 model only (this one: {km.model_dtype})"
        algo = km.moe_quant_algo()
        if algo != "NVFP4":
            return (
                "defer_finalize: only TRTLLM-Gen NVFP4 experts stop after GEMM2 (this checkpoint's "
                "routed experts: "
                f"{algo or 'bf16'})"
            )
        if km.qkv_weights() != "mxfp8":
            return (
                "the next layer's qkv_proj must take MXFP8 input (get_input_quant_key == "
                "kMxfp8Dynamic; this "
                f"checkpoint's qkv_proj: {km.qkv_weights() or 'another quantisation'})"
            )
        return None
    if par.moe_backend == NATIVE_MEGA_MOE:
        return (
            "MegaMoE finalizes in its own kernel: the fused all-reduce is the FusedMoE "
            "runner's (replicated tokens)"
        )
    if par.data_parallel_size != 1:
        return f"DP 1 only (replicated tokens; here DP {par.data_parallel_size})"
    if not par.enable_expert_parallel:
        return (
            "it fuses the EP combine's late all-reduce, which exists under EP over the TP group "
            "only (add "
            "--enable-expert-parallel); TP-sharded experts all-reduce before the norm"
        )
    return None


def model_gates(profile, km, par: Parallel, run: RunConfig) -> tuple[GateDecision, ...]:
    """Every model gate of run's release that km's family reaches, decided on its traffic (§15)."""
    # The ones that do not act in this setup too, for the call-site shapes, with the reason.
    vllm = run.regime.vllm
    out = []
    for gate in vllm.release.gates_of(km.family):
        sites = GATE_OPS[gate.op].sites(km, gate, par, vllm)
        out.append(
            decide_gate(
                profile,
                gate,
                sites,
                run,
                km.sp_floor_tokens(par, vllm),
                _why_not(profile, gate, km, par, run),
                par.tp_spans_nodes(),
            )
        )
    return tuple(out)
