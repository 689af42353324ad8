"""One MoE step per DP rank under DP attention + EP, and its DBO schedule (§11.4, §12)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from . import formulas as F
from . import moe as M
from .all2all import A2ACall, A2ATimes, Links, backend, predict
from .defaults import DEFAULT_DP_TOKEN_SPREAD
from .errors import TpcostError
from .network import Network
from .ops import Hw, sm_share_hw
from .profile import HardwareProfile
from .vllm_tables import ep_rules

EP = ep_rules()  # the current release's DP+EP and DBO rules (vllm_tables.EpRules)
BATCHED_DP_BUDGET = EP.batched_dp_budget
DEFAULT_BUDGET = EP.default_budget
UBATCH_IDS = range(EP.ubatches)  # the microbatches, in vLLM's order

# torch ops one eager layer issues (MLA ~14, the MoE block ~10): host issue count (assumed)
OPS_PER_LAYER = 24
# one DBO yield: a Python thread switch on the host (assumed, sigma 1.0 relative)
THREAD_HANDOFF_S = 5e-6
DBO_CITE = f"vLLM 0.34 {EP.dbo_rule_cite}, {EP.split_cite}; yields {EP.yields_cite}"
__all__ = [
    "BATCHED_DP_BUDGET",
    "DEFAULT_BUDGET",
    "EPSetup",
    "step",
    "dbo_step",
    "dbo_threshold",
    "check_setup",
]


@dataclasses.dataclass(frozen=True)
class EPSetup:
    """One EP deployment: GPU, model, EP size, nodes, backend, network, step kind (§11.4)."""

    prof: HardwareProfile
    shape: M.MoEShape
    ep: int
    gpus_per_node: int
    backend: str
    network: Network
    decode: bool = True
    context_len: int = 1024
    seq_len: int = 1024
    # max_num_batched_tokens per rank: also the LL dispatch capacity
    budget_tokens: int = DEFAULT_BUDGET
    imbalance: float = 1.0
    comm_sms: int = EP.comm_sms
    dtype: str = "fp8"
    # a step's largest DP rank's tokens / its smallest's (§12)
    dp_token_spread: float = DEFAULT_DP_TOKEN_SPREAD
    # VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD (§11.4)
    shared_stream_tokens: int = EP.shared_stream_tokens

    @property
    def nodes(self) -> int:
        return max(1, self.ep // self.gpus_per_node)

    @property
    def graphs(self) -> bool:
        """Whether the step replays a full CUDA graph (low-latency decode; §11.4)."""
        # DP > 1 forces graphs off for high-throughput (EP.graphs_off_cite); prefill steps run
        # eagerly.
        return self.decode and backend(self.backend).batched_dp


def check_setup(s: EPSetup) -> None:
    """One line for what vLLM (or the step) cannot run (§11.4)."""
    other = sorted({m.gpu for m in s.network.measured} - {s.prof.name})
    if other:
        raise TpcostError(
            f"network {s.network.name} ({s.network.origin}) holds all-to-all calls measured on "
            f"{', '.join(other)}, not {s.prof.name}: give that GPU, or a network without them"
        )
    if s.ep < 2:
        raise TpcostError(
            "expert parallelism over DP needs --data-parallel-size >= 2 (at DP 1 vLLM runs no "
            "all-to-all)"
        )
    s.shape.check_ep(s.ep)
    dom = int(s.prof.interconnect.domain_size)
    if s.ep > dom and s.gpus_per_node != dom:
        raise TpcostError(
            f"{s.prof.name} has {dom} GPUs per NVLink domain; --data-parallel-size-local must be "
            f"{dom} "
            "when EP spans nodes"
        )
    if s.ep > s.gpus_per_node and s.ep % s.gpus_per_node:
        raise TpcostError(f"EP {s.ep} does not fill whole nodes of {s.gpus_per_node} GPUs")
    M.check_memory(s.shape, s.ep, s.prof.name, s.prof.memory.hbm_capacity_bytes)


def _links(s: EPSetup, hw: Hw) -> Links:
    from .ops import t_nccl_all_gather_s, t_nccl_reduce_scatter_s

    tp = min(s.ep, 8)

    def intra(coll: str, total_bytes: Any) -> Any:
        fn = t_nccl_all_gather_s if coll == "all_gather" else t_nccl_reduce_scatter_s
        return fn(hw, tp, total_bytes)

    return Links(float(s.prof.interconnect.link_bw_bytes_per_s), s.network, intra)


def a2a(s: EPSetup, tokens: Any, hw: Hw | None = None, comm_sms: int | None = None) -> A2ATimes:
    """One dispatch and one combine of `tokens` per rank under the setup's backend (s; §11.3)."""
    # `comm_sms`: the SMs DBO gives the high-throughput kernels (VLLM_DBO_COMM_SMS); None: DeepEP's
    # own.
    hw = hw or Hw(s.prof, s.dtype)
    sh = s.shape
    # fp8_dispatch
    dd = "fp8" if sh.weight_bytes == 1 and s.backend.startswith("deepep") else "bf16"
    call = A2ACall(
        tokens=tokens,
        hidden=sh.hidden,
        top_k=sh.top_k,
        num_experts=sh.num_experts,
        n_group=sh.n_group,
        topk_group=sh.topk_group,
        ep=s.ep,
        gpus_per_node=min(s.gpus_per_node, s.ep),
        dispatch_dtype=dd,
        imbalance=s.imbalance,
        comm_sms=EP.deepep_sms if comm_sms is None else comm_sms,
    )
    return predict(s.backend, call, _links(s, hw))


@dataclasses.dataclass(frozen=True)
class Block:
    """One microbatch's per-layer times (s): pre, dispatch, experts, combine (§12)."""

    t_attention_s: Any
    t_dense_s: Any  # a dense layer's MLP
    t_router_s: Any
    t_shared_s: Any
    t_shared_beside_s: (
        Any  # the shared experts while the combine holds its SMs (high-throughput: comm_sms)
    )
    t_norms_s: Any
    t_experts_s: Any
    t_dispatch_s: Any  # all the layer's dispatch calls together
    t_combine_s: Any
    calls: Any  # all-to-all calls per layer (the capacity splits a step)
    active_experts: Any
    a2a: A2ATimes


def block(
    s: EPSetup,
    tokens: Any,
    sm_share: float = 1.0,
    hw: Hw | None = None,
    comm_sms: int | None = None,
) -> Block:
    """Every per-layer term for `tokens` per rank (s; `comm_sms` as in a2a; §11.4)."""
    hw = hw or Hw(s.prof, s.dtype)
    sh = s.shape
    t = np.asarray(tokens, dtype=float)
    ph = M.Phase(decode=s.decode, context_len=s.context_len, seq_len=s.seq_len)
    if backend(
        s.backend
    ).batched_dp:  # the low-latency buffer holds budget_tokens per call: more tokens, more calls
        cap = float(s.budget_tokens)
        full = np.floor(t / cap)
        rest = t - full * cap
        x_cap = a2a(s, np.array([cap]), hw, comm_sms)
        x = a2a(s, rest, hw, comm_sms)
        disp = x.t_dispatch_s + full * x_cap.t_dispatch_s[0]
        comb = x.t_combine_s + full * x_cap.t_combine_s[0]
    else:
        full, rest = 0 * t, t
        x = a2a(s, t, hw, comm_sms)
        disp, comb = x.t_dispatch_s, x.t_combine_s
    experts, active = M.t_experts_s(hw, sh, t * s.ep, s.ep, s.imbalance, sm_share)
    shared = (
        M.t_mlp_s(hw, t, sh.hidden, sh.moe_intermediate * sh.n_shared, sh.weight_bytes)
        if sh.n_shared
        else 0 * t
    )
    held = (
        (EP.deepep_sms if comm_sms is None else comm_sms)
        if s.backend == "deepep_high_throughput"
        else 0
    )
    beside = (
        M.t_mlp_s(
            sm_share_hw(hw, 1.0 - held / hw.gemm["sm_count"]),
            t,
            sh.hidden,
            sh.moe_intermediate * sh.n_shared,
            sh.weight_bytes,
        )
        if sh.n_shared and held
        else shared
    )
    return Block(
        t_attention_s=M.t_attention_s(hw, sh, t, ph),
        t_dense_s=M.t_mlp_s(hw, t, sh.hidden, sh.dense_intermediate, sh.weight_bytes),
        t_router_s=hw.t_gemm(t, sh.num_experts, sh.hidden, fp8_ok=False),
        t_shared_s=shared,
        t_shared_beside_s=beside,
        t_norms_s=M.t_norms_s(hw, t, sh.hidden),
        t_experts_s=experts,
        t_dispatch_s=disp,
        t_combine_s=comb,
        calls=full + (rest > 0),
        active_experts=active,
        a2a=x,
    )


def _lm_head_s(s: EPSetup, hw: Hw, t: Any) -> Any:
    """lm_head on the step's last tokens (decode: every token; prefill: one per sequence) and
    sampling (s)."""
    rows = t if s.decode else np.ceil(t / s.seq_len)
    return hw.t_gemm(rows, s.shape.vocab, s.shape.hidden, fp8_ok=False) + hw.t_mem(
        rows * s.shape.vocab * 4.0
    )


def _host_s(s: EPSetup, hw: Hw, microbatches: int, eager: bool = False) -> float:
    """Eager host issue time of a step: ops × the profile's per-op host cost, per microbatch, plus
    DBO's hand-offs (0 under graph replay unless `eager`: a microbatched step the DP vote sends
    eager)."""
    if s.graphs and not eager:
        return 0.0
    yields = (
        2 * s.shape.moe_layers * (3 if s.backend == "deepep_high_throughput" else 2)
        if microbatches > 1
        else 0
    )
    return (
        microbatches * s.shape.num_layers * OPS_PER_LAYER * float(hw.p.asynctp.host_op_s)
        + yields * THREAD_HANDOFF_S
    )


@dataclasses.dataclass(frozen=True)
class Step:
    """A step per rank (s): its terms summed over layers, and the critical path (§11.4)."""

    tokens: Any
    t_step_s: Any
    t_gpu_s: Any
    t_host_s: Any
    t_attention_s: Any
    t_dense_s: Any
    t_experts_s: Any
    t_shared_s: Any
    t_router_s: Any
    t_norms_s: Any
    t_dispatch_s: Any  # summed over the MoE layers
    t_combine_s: Any
    t_lm_head_s: Any
    t_exposed_comm_s: Any  # communication the schedule does not hide
    per_call: Block


# An SM-driven all-gather beside a GEMM: VLLM_PR53556_NVLS_GATHER_B200 (8 B200s, 4096 rows per rank)
# times vLLM's SP gather alone at 719.214 us and beside the routed down-projection at 843.550 us:
# +17.3 % while a GEMM shares the SMs (one measurement, carried to NCCL's collectives on every GPU:
# assumed)
COLLECTIVE_SLOWDOWN_BESIDE_GEMM = 843.550 / 719.214 - 1.0
AUX_STREAM_EVENTS = 2  # the record / wait pair that joins the aux stream to the main one


def moe_layer_s(s: EPSetup, b: Block, tokens: Any, shared_stream_tokens: Any = None) -> Any:
    """One MoE layer as vLLM 0.34 runs it, shared experts included (s; §11.4)."""
    # router, dispatch, experts, combine and the shared experts. An asynchronous backend runs the
    # shared experts beside its combine (modular kernel, EP.shared_overlap_cite); otherwise they run
    # on the aux stream from before the router at or below `shared_stream_tokens` (vLLM's
    # VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD, EP.shared_stream_cite; default the setup's), else
    # in series.
    main = b.t_router_s + b.t_dispatch_s + b.t_experts_s
    if backend(s.backend).shared_beside_combine:
        return main + np.maximum(b.t_combine_s, b.t_shared_beside_s)
    serial = main + b.t_combine_s + b.t_shared_s
    if not s.shape.n_shared:  # no shared experts: nothing for the aux stream to run
        return serial
    theta = s.shared_stream_tokens if shared_stream_tokens is None else shared_stream_tokens
    events = AUX_STREAM_EVENTS * float(s.prof.kernels.launch_overhead_s)
    aux = F.t_aux_stream_s(
        main + b.t_combine_s,
        b.t_shared_s,
        b.t_dispatch_s + b.t_combine_s,
        COLLECTIVE_SLOWDOWN_BESIDE_GEMM,
        events,
    )
    return np.where(np.asarray(tokens) <= theta, aux, serial)


def step(s: EPSetup, tokens: Any) -> Step:
    """The step without microbatches: layers in order, each all-to-all exposed (s; §11.4)."""
    # But for the shared experts beside an asynchronous backend's combine.
    hw = Hw(s.prof, s.dtype)
    t = np.asarray(tokens, dtype=float)
    b = block(s, t, hw=hw)
    Ld, Lm = s.shape.first_dense, s.shape.moe_layers
    attn = s.shape.num_layers * b.t_attention_s
    norms = s.shape.num_layers * b.t_norms_s
    lm = _lm_head_s(s, hw, t)
    moe = Lm * moe_layer_s(s, b, t)
    gpu = attn + norms + Ld * b.t_dense_s + moe + lm
    # what the compute does not cover
    comm = moe - Lm * (b.t_router_s + b.t_experts_s + b.t_shared_s)
    host = _host_s(s, hw, 1)
    return Step(
        tokens=t,
        t_step_s=np.maximum(gpu, host),
        t_gpu_s=gpu,
        t_host_s=host + 0 * t,
        t_attention_s=attn,
        t_dense_s=Ld * b.t_dense_s,
        t_experts_s=Lm * b.t_experts_s,
        t_shared_s=Lm * b.t_shared_s,
        t_router_s=Lm * b.t_router_s,
        t_norms_s=norms,
        t_dispatch_s=Lm * b.t_dispatch_s,
        t_combine_s=Lm * b.t_combine_s,
        t_lm_head_s=lm,
        t_exposed_comm_s=comm,
        per_call=b,
    )


def timeline(
    pre: list,
    disp: list,
    exp: list,
    comb: list,
    dense: list,
    n_dense: int,
    n_moe: int,
    post: list | None = None,
) -> tuple:
    """Two microbatches on one compute and one comm stream in vLLM's yield order (s; §12)."""
    # Two microbatches on one compute and one comm stream in vLLM's yield order (§12): per MoE layer
    # the compute stream runs pre_a, pre_b, experts_a (+ post_a), experts_b (+ post_b) and the comm
    # stream dispatch_a, dispatch_b, combine_a, combine_b; experts wait for their dispatch, a
    # combine for its experts (not its post: the shared experts run beside it), the next layer's pre
    # for the combine. Returns (end, compute busy, comm busy).
    post = post or [0.0, 0.0]
    comp = comm = 0.0 * pre[0]
    ready = [comp, comp]  # when each microbatch may run its next compute
    for _ in range(n_dense):
        for u in UBATCH_IDS:
            comp = np.maximum(comp, ready[u]) + dense[u]
            ready[u] = comp
    for _ in range(n_moe):
        d_end: list[Any] = [comp, comp]
        for u in UBATCH_IDS:
            comp = np.maximum(comp, ready[u]) + pre[u]
            comm = np.maximum(comm, comp) + disp[u]
            d_end[u] = comm
        c_start: list[Any] = [comp, comp]
        for u in UBATCH_IDS:
            comp = np.maximum(comp, d_end[u]) + exp[u]
            c_start[u] = comp
            comp = comp + post[u]
        for u in UBATCH_IDS:
            comm = np.maximum(comm, c_start[u]) + comb[u]
            ready[u] = comm
    # the last post may outlast its combine
    return (
        np.maximum(np.maximum(ready[0], ready[1]), comp),
        comp,
        comm,
    )


@dataclasses.dataclass(frozen=True)
class DboStep:
    """The microbatched step (s): end, each microbatch's compute and comm, what is exposed (§12)."""

    # Also the weight reads and per-call costs the split doubles.

    tokens: Any
    t_step_s: Any
    t_gpu_s: Any
    t_host_s: Any
    t_compute_s: tuple  # per microbatch, summed over layers
    t_comm_s: tuple
    t_exposed_comm_s: Any
    t_doubled_s: (
        Any  # Σ compute(a) + compute(b) − compute(whole): weights read twice, launches twice
    )
    blocks: tuple


def dbo_step(s: EPSetup, tokens: Any, zero_comm: bool = False, eager: Any = False) -> DboStep:
    """The step as DBO runs it: split at the midpoint, two microbatches on the timeline (s; §12)."""
    # `eager` (per row): issued eagerly although the setup replays graphs (the DP vote's fallback,
    # dbo_threshold).
    b = backend(s.backend)
    if not b.microbatches:
        raise TpcostError(
            f"vLLM 0.34 runs DBO on CUDA only with deepep_low_latency, deepep_high_throughput or "
            f"nixl_ep, not {s.backend} ({EP.dbo_backends_cite})"
        )
    hw = Hw(s.prof, s.dtype)
    t = np.asarray(tokens, dtype=float)
    ta = np.floor(t / 2)
    tb = t - ta
    share = (
        (hw.gemm["sm_count"] - s.comm_sms) / hw.gemm["sm_count"]
        if s.backend == "deepep_high_throughput"
        else 1.0
    )
    sms = s.comm_sms if s.backend == "deepep_high_throughput" else None
    blocks = (block(s, ta, share, hw, sms), block(s, tb, share, hw, sms))
    z = 0.0 if zero_comm else 1.0
    # the shared experts after the experts, during the combine, else before
    beside = b.shared_beside_combine
    pre = [
        x.t_attention_s + x.t_norms_s + x.t_router_s + (0.0 if beside else x.t_shared_s)
        for x in blocks
    ]
    post = [x.t_shared_beside_s if beside else 0.0 * x.t_shared_s for x in blocks]
    dense = [x.t_attention_s + x.t_norms_s + x.t_dense_s for x in blocks]
    end, _, _ = timeline(
        pre,
        [z * x.t_dispatch_s for x in blocks],
        [x.t_experts_s for x in blocks],
        [z * x.t_combine_s for x in blocks],
        dense,
        s.shape.first_dense,
        s.shape.moe_layers,
        post,
    )
    lm = _lm_head_s(s, hw, t)
    gpu = end + lm
    Ld, Lm = s.shape.first_dense, s.shape.moe_layers
    comp = tuple(
        Ld * d + Lm * (p + x.t_experts_s + q) for d, p, x, q in zip(dense, pre, blocks, post)
    )
    comm = tuple(z * Lm * (x.t_dispatch_s + x.t_combine_s) for x in blocks)
    whole = step(s, t)
    whole_comp = whole.t_gpu_s - whole.t_exposed_comm_s - whole.t_lm_head_s
    host = np.where(eager, _host_s(s, hw, 2, eager=True), _host_s(s, hw, 2)) + 0 * t
    return DboStep(
        tokens=t,
        t_step_s=np.maximum(gpu, host),
        t_gpu_s=gpu,
        t_host_s=host,
        t_compute_s=comp,
        t_comm_s=comm,
        t_exposed_comm_s=end - comp[0] - comp[1],
        t_doubled_s=comp[0] + comp[1] - whole_comp,
        blocks=blocks,
    )


@dataclasses.dataclass(frozen=True)
class DboThreshold:
    """One phase's DBO threshold: least expected step time over 1..t_max tokens per rank (§12)."""

    threshold_tokens: int | None  # None: DBO never pays on this traffic
    crossover_tokens: int | None  # from here on DBO is faster at every size (no premium)
    saving_s: float  # mean step time saved per step on the traffic
    mean_step_s: float  # mean step time without DBO on the traffic
    t_max: int
    vllm_threshold_tokens: (
        int  # vLLM's default for this phase (EP.dbo_thresholds), printed beside, never fitted
    )
    saving_vs_vllm_s: float  # mean step time saved against DBO on at vLLM's default threshold
    t_off_at_max_s: float  # the largest step (t_max tokens per rank) without DBO
    t_on_at_max_s: float  # and microbatched: how much DBO wins or loses where it matters most


def dp_step_tokens(s: EPSetup, smallest: Any, t_max: int) -> Any:
    """Tokens every DP rank's step runs at when the smallest holds `smallest` (§12)."""
    # The largest rank's, ceil(spread · smallest), at most the budget t_max (the ranks pad to it).
    return np.minimum(
        np.ceil(s.dp_token_spread * np.asarray(smallest, dtype=float) - 1e-9), float(t_max)
    )


def dbo_threshold(s: EPSetup, t_max: int, margin: float, weights: Any = None) -> DboThreshold:
    """vLLM's DBO rule priced over 1..t_max tokens per rank, weighted by the traffic (§12)."""
    # vLLM's rule (microbatch from `threshold` tokens, EP.dbo_rule_cite) priced over 1..t_max tokens
    # per rank, weighted by the traffic (`weights` over 1..t_max, sum 1; default uniform). The
    # traffic's count is the step's smallest DP rank's, which vLLM's vote compares with the
    # threshold; the step runs at the largest rank's (dp_step_tokens). The premium `margin` rides on
    # the DBO side (§12).
    T = np.arange(1, t_max + 1, dtype=float)
    w = np.full(t_max, 1.0 / t_max) if weights is None else np.asarray(weights, dtype=float)
    Tm = dp_step_tokens(s, T, t_max)
    off = step(s, Tm).t_step_s
    # a rank with an empty second microbatch (the largest over twice the smallest) runs the step
    # eagerly (EP.dp_vote_eager_cite): where graphs would replay, the host issue time comes back
    eager = s.graphs & (Tm > 2 * T)
    on = np.where(T >= 2, dbo_step(s, np.maximum(Tm, 2), eager=eager).t_step_s, np.inf)
    # cost of threshold θ: Σ_{T<θ} w·off + Σ_{T>=θ} w·on·(1+margin); θ = t_max+1 is "never" (a
    # 1-token step cannot split: it is never microbatched, whatever its weight)
    pref_off = np.concatenate([[0.0], np.cumsum(w * off)])
    on_m = np.where(np.isfinite(on), w * np.where(np.isfinite(on), on, 0.0) * (1 + margin), np.inf)
    suf_on = np.concatenate([np.cumsum(on_m[::-1])[::-1], [0.0]])
    cost = pref_off + suf_on  # index i: θ = i + 1
    faster = on < off
    cross = None
    if faster[-1]:
        j = t_max - int(np.argmin(faster[::-1])) if not faster.all() else 0
        cross = int(T[j]) if j < t_max else None
    # a traffic with no steps between two counts leaves every threshold between them at the same
    # cost: of those, the one nearest the crossover (where DBO starts to be faster), so a step size
    # the traffic did not show is still decided by the physics
    tied = np.flatnonzero(cost <= cost.min() * (1 + 1e-12))
    i = int(tied[np.argmin(np.abs(tied + 1 - (cross or t_max + 1)))])
    theta = i + 1 if i < t_max else None
    chosen = np.where(T >= (theta or t_max + 1), on, off)
    v = EP.dbo_thresholds["decode" if s.decode else "prefill"]
    at_vllm = np.where(T >= v, on, off)
    return DboThreshold(
        threshold_tokens=theta,
        crossover_tokens=cross,
        saving_s=float(np.sum(w * (off - chosen))),
        mean_step_s=float(np.sum(w * off)),
        t_max=t_max,
        vllm_threshold_tokens=v,
        saving_vs_vllm_s=float(np.sum(w * (at_vllm - chosen))),
        t_off_at_max_s=float(off[-1]),
        t_on_at_max_s=float(on[-1]),
    )


@dataclasses.dataclass(frozen=True)
class CommSmsChoice:
    """VLLM_DBO_COMM_SMS under DBO: least expected microbatched step over the traffic (§12)."""

    # VLLM_DBO_COMM_SMS for the high-throughput backend under DBO: the SMs DeepEP's kernels run on
    # (at most its own), the rest to DeepGEMM; the least expected microbatched step over the traffic
    # where DBO runs (§12).

    sms: int  # tpcost's value
    vllm_sms: int  # vLLM's default (EP.comm_sms)
    saving_s: float  # mean step time saved per step on the traffic against vLLM's default
    mean_step_s: (
        float  # mean step time at vLLM's default (the steps below the threshold unmicrobatched)
    )
    step_s_by_sms: dict  # SMs -> mean step time (s)
    # what bounds the dispatch at tpcost's value (rdma, nvlink, sms), at the traffic's largest step
    bound: str
    threshold_tokens: int  # DBO runs from it (the phase's decided threshold)


# step sizes comm_sms_choice prices each candidate on (blocks of the traffic beyond)
COMM_SMS_GRID = 256


def comm_sms_choice(
    s: EPSetup, t_max: int, margin: float, threshold: int, weights: Any = None
) -> CommSmsChoice:
    """VLLM_DBO_COMM_SMS decided on the traffic for DBO from `threshold` tokens per rank (§12)."""
    # VLLM_DBO_COMM_SMS decided on the traffic (`weights` over 1..t_max, default uniform) for DBO
    # from `threshold` tokens per rank: each candidate prices both microbatches' all-to-alls on
    # min(S, DeepEP's own) SMs and the DeepGEMM work on the other SM - S (EP.sm_control_cite);
    # leaving vLLM's default must beat it by the premium.
    if s.backend != "deepep_high_throughput":
        raise TpcostError(
            "VLLM_DBO_COMM_SMS sets the SMs of deepep_high_throughput's kernels under DBO only "
            "(the "
            f"other backends report 0 SMs used: {EP.sm_control_cite}); not {s.backend}"
        )
    T = np.arange(1, t_max + 1, dtype=float)
    w = np.full(t_max, 1.0 / t_max) if weights is None else np.asarray(weights, dtype=float)
    Tm = dp_step_tokens(s, T, t_max)
    on = T >= max(threshold, 2)
    off = float(np.sum(w[~on] * step(s, Tm[~on]).t_step_s)) if (~on).any() else 0.0
    sm = int(s.prof.identity.sm_count)
    cands = sorted(
        {*range(1, EP.deepep_sms + 1), *(x for x in (24, 32, 48) if x < sm), EP.comm_sms}
    )
    # the microbatched steps on at most COMM_SMS_GRID sizes, each carrying its block's weight
    tn, wn = Tm[on], w[on]
    k = max(1, -(-tn.size // COMM_SMS_GRID))
    tn, wn = (tn[::k], np.add.reduceat(wn, np.arange(0, wn.size, k))) if tn.size else (tn, wn)
    by = {}
    for c in cands:
        cs = dataclasses.replace(s, comm_sms=c)
        by[c] = (
            off + float(np.sum(wn * dbo_step(cs, np.maximum(tn, 2)).t_step_s)) if tn.size else off
        )
    v = EP.comm_sms
    best = min(by, key=lambda k: (by[k], abs(k - v)))
    pick = best if by[best] * (1 + margin) < by[v] else v
    bound = a2a(s, np.array([float(Tm[-1]) / 2]), comm_sms=pick).bound_dispatch
    return CommSmsChoice(
        sms=pick,
        vllm_sms=v,
        saving_s=by[v] - by[pick],
        mean_step_s=by[v],
        step_s_by_sms=by,
        bound=bound,
        threshold_tokens=int(max(threshold, 2)),
    )


@dataclasses.dataclass(frozen=True)
class SharedStreamThreshold:
    """The shared experts' aux-stream threshold over 1..t_max tokens per rank (§11.4)."""

    # VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD: the aux stream at or below it, in series above.

    threshold_tokens: int  # 0: never on the aux stream; t_max: at every size
    saving_s: float  # mean step time saved per step against the shared experts always in series
    saving_vs_vllm_s: float  # and against vLLM's default threshold
    mean_step_s: float  # mean step time with them in series
    vllm_threshold_tokens: int
    t_max: int


def shared_stream_threshold(
    s: EPSetup, t_max: int, margin: float, weights: Any = None
) -> SharedStreamThreshold:
    """The aux-stream threshold of the shared experts decided on the traffic (§11.4)."""
    # The least expected step time over the traffic (`weights` over 1..t_max; default uniform) of
    # vLLM's rule "aux stream at or below θ", the premium on the aux side (§11.4). Only where the
    # rule applies: a backend whose shared experts are not already beside its combine.
    if backend(s.backend).shared_beside_combine:
        raise TpcostError(
            f"{s.backend}: vLLM 0.34's modular kernel runs the shared experts beside the combine "
            "at "
            f"every size, before the aux-stream threshold is read ({EP.shared_overlap_cite}): "
            "VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD gates nothing here"
        )
    if not s.shape.n_shared:
        raise TpcostError(
            f"{s.shape.name} has no shared experts: VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD "
            "gates "
            "nothing"
        )
    T = np.arange(1, t_max + 1, dtype=float)
    w = np.full(t_max, 1.0 / t_max) if weights is None else np.asarray(weights, dtype=float)
    b = block(s, T)
    Lm = s.shape.moe_layers
    base = step(dataclasses.replace(s, shared_stream_tokens=0), T)
    serial = base.t_step_s
    gpu_aux = base.t_gpu_s + Lm * (moe_layer_s(s, b, T, t_max) - moe_layer_s(s, b, T, 0))
    aux = np.maximum(gpu_aux, base.t_host_s)
    # cost of θ: Σ_{T<=θ} w·aux·(1+margin) + Σ_{T>θ} w·serial; θ = 0 is "never"
    pref = np.concatenate([[0.0], np.cumsum(w * aux * (1 + margin))])
    suf = np.concatenate([np.cumsum((w * serial)[::-1])[::-1], [0.0]])
    theta = int(np.argmin(pref + suf))
    chosen = np.where(T <= theta, aux, serial)
    v = EP.shared_stream_tokens
    at_vllm = np.where(T <= v, aux, serial)
    return SharedStreamThreshold(
        threshold_tokens=theta,
        saving_s=float(np.sum(w * (serial - chosen))),
        saving_vs_vllm_s=float(np.sum(w * (at_vllm - chosen))),
        mean_step_s=float(np.sum(w * serial)),
        vllm_threshold_tokens=v,
        t_max=t_max,
    )


def dbo_band(
    s: EPSetup, t_max: int, margin: float, draws: int = 100, seed: int = 0, weights: Any = None
) -> Any:
    """The 5-95 % band of the DBO threshold over Monte Carlo draws of GPU and network (§12)."""
    # The 5-95 % band of the DBO threshold over a fixed-seed Monte Carlo of the GPU profile's and
    # the network's numbers (each at its sigma; analysis.band_edges reads it: None = never, with the
    # share that never pays and the quantities that move it most) (§12).
    from .analysis import band_edges, perturbed_values
    from .profile import recording

    # only what the step reads is drawn, so only that can move the band
    traced, reads = recording(s.prof)
    dbo_step(dataclasses.replace(s, prof=traced), np.array([2.0, float(t_max)]))
    step(dataclasses.replace(s, prof=traced), np.array([1.0, float(t_max)]))
    prof_draws = {k: v for k, v in perturbed_values(s.prof, draws, seed).items() if k in reads}
    probe = np.array([2.0, float(t_max)])

    def times(x: EPSetup) -> np.ndarray:
        return np.concatenate([step(x, probe).t_step_s, dbo_step(x, probe).t_step_s])

    base = times(s)  # a network number the step does not read (another backend's) is not drawn
    net_draws = {
        k: v
        for k, v in s.network.drawn(draws, seed).items()
        if not np.array_equal(
            times(
                dataclasses.replace(
                    s, network=s.network.with_values(**{k: 1.5 * getattr(s.network, k)})
                )
            ),
            base,
        )
    }
    cuts = np.empty(draws)
    for i in range(draws):
        prof = s.prof.with_values(
            {k: float(v[i, 0]) for k, v in prof_draws.items()}, None, mark_modified=False
        )
        net = s.network.with_values(**{k: float(v[i]) for k, v in net_draws.items()})
        th = dbo_threshold(
            dataclasses.replace(s, prof=prof, network=net), t_max, margin, weights
        ).threshold_tokens
        cuts[i] = np.inf if th is None else th
    named = {
        **{k: v[:, 0] for k, v in prof_draws.items()},
        **{f"network.{k}": v for k, v in net_draws.items()},
    }
    return band_edges(cuts, named)


def _gemms_work(
    t: float, mats: list[tuple[int, int, float]], act_bytes: float
) -> tuple[float, float]:
    """(FLOPs, bytes) of GEMMs on t rows: each (n, k, bytes per weight element) reads its weights
    once, its input and output rows once."""
    flops = sum(2.0 * t * n * k for n, k, _ in mats)
    byts = sum(n * k * wb + t * (n + k) * act_bytes for n, k, wb in mats)
    return flops, byts


def _attention_work(s: EPSetup, t: float) -> tuple[float, float]:
    """(FLOPs, bytes) of one layer's attention at t tokens per rank, in the form vLLM runs it
    (moe.t_attention_s)."""
    sh, wb, a = s.shape, s.shape.weight_bytes, 2.0
    if not sh.mla:
        mats = [
            ((sh.num_heads + 2 * sh.num_kv_heads) * sh.head_dim, sh.hidden, wb),
            (sh.hidden, sh.num_heads * sh.head_dim, wb),
        ]
        qk = v = sh.head_dim
        kv = 2 * sh.num_kv_heads * sh.head_dim
    else:
        N, L, R, P, V = sh.num_heads, sh.kv_lora_rank, sh.qk_rope, sh.qk_nope, sh.v_head_dim
        q = (
            [(sh.q_lora_rank, sh.hidden, wb), (N * (P + R), sh.q_lora_rank, wb)]
            if sh.q_lora_rank
            else [(N * (P + R), sh.hidden, wb)]
        )
        mats = [*q, (L + R, sh.hidden, wb), (sh.hidden, N * V, wb)]
        if s.decode:
            # the absorbed W_UK / W_UV, batched per head (bf16)
            mats += [
                (N * L, P, a),
                (N * V, L, a),
            ]
            qk, v, kv = L + R, L, L + R
        else:
            mats += [(N * (P + V), L, wb)]
            qk, v, kv = P + R, V, L + R
    flops, byts = _gemms_work(t, mats, a)
    if s.decode:
        flops += 2.0 * t * sh.num_heads * s.context_len * (qk + v)
        byts += t * s.context_len * kv * a
    else:
        flops += 2.0 * t * sh.num_heads * (s.seq_len + 1) / 2 * (qk + v)
        byts += t * kv * a * 2
    return flops, byts


def ops_at(s: EPSetup, n: int) -> list[dict]:
    """Every op of a step at n tokens per rank: time, FLOPs, bytes, rate, bound, count (§11.4)."""
    # Times from the step's own terms.
    hw = Hw(s.prof, s.dtype)
    sh, t = s.shape, float(n)
    b = block(s, np.array([t]), hw=hw)
    wb, a = sh.weight_bytes, 2.0
    peak_w, peak_a = float(hw._peak_flops(wb == 1)), float(hw.peak_act_flops_per_s)
    bw = float(hw.hbm_bw_bytes_per_s)
    T_all = t * s.ep
    pairs = T_all * min(s.imbalance * sh.top_k / sh.num_experts, 1.0) * (sh.num_experts // s.ep)
    act = float(b.active_experts[0])
    moe_w = 3 * sh.hidden * sh.moe_intermediate
    rows = [
        (
            "attention",
            sh.num_layers,
            b.t_attention_s,
            *_attention_work(s, t),
            peak_a,
            "moe.t_attention_s",
        ),
        (
            "dense MLP",
            sh.first_dense,
            b.t_dense_s,
            *_gemms_work(
                t,
                [
                    (2 * sh.dense_intermediate, sh.hidden, wb),
                    (sh.hidden, sh.dense_intermediate, wb),
                ],
                a,
            ),
            peak_w,
            "moe.t_mlp_s",
        ),
        (
            "router",
            sh.moe_layers,
            b.t_router_s,
            *_gemms_work(t, [(sh.num_experts, sh.hidden, a)], a),
            peak_a,
            "ops.Hw.t_gemm",
        ),
        (
            "shared experts",
            sh.moe_layers if sh.n_shared else 0,
            b.t_shared_s,
            *_gemms_work(
                t,
                [
                    (2 * sh.moe_intermediate * sh.n_shared, sh.hidden, wb),
                    (sh.hidden, sh.moe_intermediate * sh.n_shared, wb),
                ],
                a,
            ),
            peak_w,
            "moe.t_mlp_s",
        ),
        (
            "routed experts (grouped)",
            sh.moe_layers,
            b.t_experts_s,
            2.0 * pairs * moe_w,
            act * moe_w * wb + pairs * 2 * sh.hidden * a,
            peak_w,
            "moe.t_experts_s",
        ),
        (
            "norms",
            sh.num_layers,
            b.t_norms_s,
            0.0,
            2 * t * sh.hidden * a * 3.0,
            peak_a,
            "moe.t_norms_s",
        ),
    ]
    out = []
    for name, count, ts, flops, byts, peak, fn in rows:
        ts = float(np.asarray(ts).ravel()[0])
        if count == 0 or ts <= 0:
            continue
        bound = "compute" if flops / peak > byts / bw else "memory"
        out.append(
            {
                "op": name,
                "count_per_step": int(count),
                "t_s": ts,
                "flops": flops,
                "bytes": byts,
                "achieved_tflops": flops / ts / 1e12,
                "achieved_gbps": byts / ts / 1e9,
                "bound": bound,
                "formula": fn,
            }
        )
    x = b.a2a
    for q, ts, r, v, bound in (
        ("dispatch", b.t_dispatch_s, x.rdma_dispatch_bytes, x.nvl_dispatch_bytes, x.bound_dispatch),
        ("combine", b.t_combine_s, x.rdma_combine_bytes, x.nvl_combine_bytes, x.bound_combine),
    ):
        ts = float(np.asarray(ts).ravel()[0])
        byts = float(np.asarray(r).ravel()[0]) + float(np.asarray(v).ravel()[0])
        out.append(
            {
                "op": f"{q} ({s.backend}, {int(b.calls[0])} call(s))",
                "count_per_step": sh.moe_layers,
                "t_s": ts,
                "flops": 0.0,
                "bytes": byts,
                "achieved_tflops": 0.0,
                "achieved_gbps": byts / ts / 1e9,
                "bound": bound,
                "formula": "all2all.predict",
            }
        )
    serial = b.t_router_s + b.t_dispatch_s + b.t_experts_s + b.t_combine_s + b.t_shared_s
    hid = float(np.asarray(moe_layer_s(s, b, np.array([t])) - serial).ravel()[0])
    if hid:  # negative: what the shared experts' overlap takes off the layer (§11.4)
        how = (
            "beside the combine"
            if backend(s.backend).shared_beside_combine
            else "on the aux stream"
        )
        out.append(
            {
                "op": f"shared experts {how} (overlap)",
                "count_per_step": sh.moe_layers,
                "t_s": hid,
                "flops": 0.0,
                "bytes": 0.0,
                "achieved_tflops": 0.0,
                "achieved_gbps": 0.0,
                "bound": "overlap",
                "formula": "ep_step.moe_layer_s",
            }
        )
    lm = float(np.asarray(_lm_head_s(s, hw, np.array([t]))).ravel()[0])
    rows_lm = t if s.decode else float(np.ceil(t / s.seq_len))
    f_lm, b_lm = _gemms_work(rows_lm, [(sh.vocab, sh.hidden, a)], a)
    out.append(
        {
            "op": "lm_head + sampling",
            "count_per_step": 1,
            "t_s": lm,
            "flops": f_lm,
            "bytes": b_lm,
            "achieved_tflops": f_lm / lm / 1e12,
            "achieved_gbps": b_lm / lm / 1e9,
            "bound": "compute" if f_lm / peak_a > b_lm / bw else "memory",
            "formula": "ep_step._lm_head_s",
        }
    )
    return out
