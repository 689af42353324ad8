"""The MoE all-to-all as vLLM 0.34 runs it: one registry entry per backend (docs/model.md §11.3)."""
# Each entry carries its predictor or its one-line refusal.

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from . import formulas as F
from .errors import TpcostError
from .network import Network
from .vllm_tables import ep_rules

EP = ep_rules()  # the current release's DP+EP and DBO rules
ALL2ALL_CITE = f"vLLM 0.34 {EP.all2all_backends_cite}, distributed/device_communicators/all2all.py"


@dataclasses.dataclass(frozen=True)
class A2ACall:
    """One dispatch/combine pair's inputs: tokens per rank, MoE shape, EP layout, dtypes (§11.3)."""

    tokens: Any  # tokens this rank dispatches per call (array over a sweep)
    hidden: int
    top_k: int
    num_experts: int
    n_group: int
    topk_group: int
    ep: int
    gpus_per_node: int  # EP ranks that share one NVLink domain
    dispatch_dtype: str  # "fp8" (block-quantised, with scales) or "bf16"
    combine_dtype: str = "bf16"
    imbalance: float = 1.0  # hot rank's receive load / the mean (>= 1)
    # SMs the high-throughput kernels may use (DBO: VLLM_DBO_COMM_SMS, capped)
    comm_sms: int = EP.deepep_sms

    @property
    def nodes(self) -> int:
        return max(1, self.ep // self.gpus_per_node)


# DeepEP's normal kernels move every byte through the SMs they are given. DEEPEP_V2_README's SM100
# intranode EP 8 rows (8K tokens) reach 643 / 675 GB/s (dispatch / combine, logical: the local
# rank's 1/8 included) on 24 SMs and 726 / 740 on 64, so 24 SMs bind: the physical bytes per SM per
# second there (docs/model.md §11.3). One pair, carried to DeepEP V1's normal kernels on every GPU
# (assumed).
HT_BYTES_PER_SM_S = {"dispatch": 643e9 * 7 / 8 / 24, "combine": 675e9 * 7 / 8 / 24}


@dataclasses.dataclass(frozen=True)
class Links:
    """The links an all-to-all may use: NVLink in the domain, the network beyond it (§11.3)."""

    nvlink_bw_bytes_per_s: float
    network: Network
    # (collective, bytes per rank) -> s inside one domain
    nccl_intra: Callable[[str, Any], Any] | None = None


@dataclasses.dataclass(frozen=True)
class A2ATimes:
    """One dispatch and one combine (s), their RDMA and NVLink bytes, each one's bound (§11.3)."""

    t_dispatch_s: Any
    t_combine_s: Any
    rdma_dispatch_bytes: Any
    nvl_dispatch_bytes: Any
    rdma_combine_bytes: Any
    nvl_combine_bytes: Any
    bound_dispatch: str
    bound_combine: str
    holds_sms: int  # SMs the kernel occupies while it runs (0: none)


def _largest(parts: dict[str, Any]) -> Any:
    """The elementwise largest of the terms (s)."""
    vals = list(parts.values())
    out = np.asarray(vals[0], dtype=float)
    for v in vals[1:]:
        out = np.maximum(out, v)
    return out


def _bound(parts: dict[str, Any]) -> str:
    """The name of the largest term (at the sweep's largest token count)."""
    return max(parts, key=lambda k: float(np.max(parts[k])))


def _low_latency(c: A2ACall, links: Links) -> A2ATimes:
    """DeepEP low-latency: one put per (token, expert) copy, RDMA past the node and NVLink inside
    it, no SMs held while waiting; time = α + β·log2(EP) + max(RDMA bytes / (NICs·line·η),
    messages·τ, NVLink bytes / (link·η))."""
    net, T = links.network, np.asarray(c.tokens, dtype=float)
    remote = max(c.ep - c.gpus_per_node, 0) / c.ep
    local = (min(c.gpus_per_node, c.ep) - 1) / c.ep
    copies = T * c.top_k * c.imbalance
    lat = net.ll_latency_s + net.ll_latency_per_log2_ep_s * np.log2(c.ep)
    out = {}
    for phase, dtype, extra in (
        ("dispatch", c.dispatch_dtype, 0.0),
        ("combine", c.combine_dtype, net.ll_combine_extra_s),
    ):
        b = F.a2a_token_bytes(c.hidden, dtype)
        rdma, nvl = copies * remote * b, copies * local * b
        parts = {
            "rdma": F.t_link_bound_s(rdma, net.line_rate_per_gpu_bytes_per_s, net.rdma_efficiency),
            "nic messages": copies * remote * net.msg_overhead_s,
            "nvlink": F.t_link_bound_s(nvl, links.nvlink_bw_bytes_per_s, net.nvl_efficiency),
        }
        t = np.where(T > 0, lat + extra + _largest(parts), 0.0)
        out[phase] = (t, rdma, nvl, _bound(parts))
    return _times(out, holds_sms=0)


def _high_throughput(c: A2ACall, links: Links) -> A2ATimes:
    """DeepEP normal kernels: one RDMA copy per destination node, forwarded over NVLink to the ranks
    inside it; time = α (notify, CPU-blocking) + max(RDMA bytes / (NICs·line·η), NVLink bytes /
    (link·η), all bytes / (SMs·r)) on min(comm_sms, DeepEP's own) SMs, r = HT_BYTES_PER_SM_S."""
    sms = max(1, min(c.comm_sms, EP.deepep_sms))
    net, T = links.network, np.asarray(c.tokens, dtype=float) * c.imbalance
    g = min(c.gpus_per_node, c.ep)
    ranks_hit = F.expected_bins_hit(c.top_k, c.num_experts, c.n_group, c.topk_group, c.ep)
    nodes_hit = (
        F.expected_bins_hit(c.top_k, c.num_experts, c.n_group, c.topk_group, c.nodes)
        if c.nodes > 1
        else 1.0
    )
    out = {}
    for phase, dtype in (("dispatch", c.dispatch_dtype), ("combine", c.combine_dtype)):
        b = F.a2a_token_bytes(c.hidden, dtype)
        rdma = T * nodes_hit * (c.nodes - 1) / c.nodes * b
        nvl = (
            T * ranks_hit * (g - 1) / g * b
            if c.nodes > 1
            else T * ranks_hit * (c.ep - 1) / c.ep * b
        )
        parts = {
            "rdma": F.t_link_bound_s(rdma, net.line_rate_per_gpu_bytes_per_s, net.rdma_efficiency),
            "nvlink": F.t_link_bound_s(nvl, links.nvlink_bw_bytes_per_s, net.nvl_efficiency),
            "sms": F.t_link_bound_s(rdma + nvl, sms * HT_BYTES_PER_SM_S[phase], 1.0),
        }
        t = np.where(T > 0, net.ht_latency_s + _largest(parts), 0.0)
        out[phase] = (t, rdma, nvl, _bound(parts))
    return _times(out, holds_sms=sms)


def _allgather_reducescatter(c: A2ACall, links: Links) -> A2ATimes:
    """vLLM's default: NCCL all-gather of every rank's tokens (bf16) over the EP group, then a
    reduce-scatter of the expert outputs; inside a domain the profile's NCCL curves, across nodes a
    ring whose every step crosses a NIC."""
    net, T = links.network, np.asarray(c.tokens, dtype=float) * c.imbalance
    msg = T * c.hidden * 2.0  # bytes per rank in, and out
    out = {}
    for phase, coll in (("dispatch", "all_gather"), ("combine", "reduce_scatter")):
        ring = (c.ep - 1) * msg  # bytes each rank sends and receives in a ring
        if c.nodes == 1:
            if links.nccl_intra is None:
                raise TpcostError(
                    "allgather_reducescatter inside a node needs the GPU profile's NCCL curves"
                )
            t = links.nccl_intra(coll, msg * c.ep)
            out[phase] = (t, 0.0 * T, ring, "nvlink (NCCL)")
            continue
        lat = (c.ep - 1) * net.rdma_latency_s  # a ring's steps, each one network hop
        parts = {
            "rdma": F.t_link_bound_s(ring, net.line_rate_per_gpu_bytes_per_s, net.rdma_efficiency)
        }
        t = np.where(T > 0, lat + parts["rdma"], 0.0)
        out[phase] = (t, ring, 0.0 * T, "rdma (NCCL ring)")
    return _times(out, holds_sms=0)


def _times(out: dict, holds_sms: int) -> A2ATimes:
    d, c = out["dispatch"], out["combine"]
    return A2ATimes(
        t_dispatch_s=d[0],
        t_combine_s=c[0],
        rdma_dispatch_bytes=d[1],
        nvl_dispatch_bytes=d[2],
        rdma_combine_bytes=c[1],
        nvl_combine_bytes=c[2],
        bound_dispatch=d[3],
        bound_combine=c[3],
        holds_sms=holds_sms,
    )


@dataclasses.dataclass(frozen=True)
class Backend:
    """One `--all2all-backend` value: its predictor, or why it is not priced (§11.3)."""

    name: str
    predict: Callable[[A2ACall, Links], A2ATimes] | None
    refusal: str = ""
    alias_of: str = ""  # vLLM rewrites this value to another backend (EP.aliases_cite)

    @property
    def microbatches(self) -> bool:
        """vLLM 0.34 runs DBO with it on CUDA (EP.dbo_backends_cite; §12)."""
        return self.name in EP.dbo_backends

    @property
    def shared_beside_combine(self) -> bool:
        """The shared experts run while its combine is in flight (EP.shared_overlap_cite; §11.4)."""
        # vLLM 0.34's modular kernel does so where the backend's prepare/finalize is asynchronous.
        return self.name in EP.async_backends

    @property
    def batched_dp(self) -> bool:
        """Its default budget is 256 tokens per rank under EP with DP > 1 (§12)."""
        # EP.batched_dp_cite.
        return self.name in EP.batched_dp_backends


_NOT_PRICED = (
    "not priced: no released timing of this backend on CUDA to fit its terms to "
    "(data/reference/EP_SOURCES.md); run DeepEP-style tests and pass --from-deepep, or pick "
    "deepep_*"
)
BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("deepep_low_latency", _low_latency),
        Backend("deepep_high_throughput", _high_throughput),
        Backend("allgather_reducescatter", _allgather_reducescatter),
        Backend("naive", _allgather_reducescatter, alias_of="allgather_reducescatter"),
        Backend("pplx", _allgather_reducescatter, alias_of="allgather_reducescatter"),
        Backend("nixl_ep", None, "nixl_ep " + _NOT_PRICED),
        Backend(
            "deepep_v2",
            None,
            "deepep_v2 not priced: DeepEP V2's rows give a logical bandwidth (local traffic "
            "included) at one token count each, too few to fit its terms; they are scored as a "
            "transport check",
        ),
        *(
            Backend(n, None, f"{n} {_NOT_PRICED}")
            for n in (
                "mori_high_throughput",
                "mori_low_latency",
                "mori",
                "moonep",
                "flashinfer_all2allv",
                "flashinfer_nvlink_two_sided",
                "flashinfer_nvlink_one_sided",
                "passthrough",
            )
        ),
    )
}


def backend(name: str) -> Backend:
    """The registry entry of a backend vLLM 0.34 lists, or one line naming them (§11.3)."""
    b = BACKENDS.get(name)
    if b is None:
        raise TpcostError(
            f"unknown --all2all-backend {name!r}; vLLM 0.34 lists {', '.join(BACKENDS)} "
            f"({ALL2ALL_CITE})"
        )
    return b


def predict(name: str, call: A2ACall, links: Links) -> A2ATimes:
    """One dispatch and one combine of `call` under backend `name` (s; §11.3)."""
    b = backend(name)
    if b.predict is None:
        raise TpcostError(b.refusal)
    if call.ep > call.gpus_per_node and call.ep % call.gpus_per_node:
        raise TpcostError(
            f"EP {call.ep} across nodes of {call.gpus_per_node} GPUs: vLLM's EP group fills whole "
            "nodes (a multiple of the node size)"
        )
    return measured_times(b, call, links, b.predict(call, links))


def measured_times(b: Backend, call: A2ACall, links: Links, model: A2ATimes) -> A2ATimes:
    """The model's times scaled to the network's measured calls of this backend (§11.5)."""
    # A measurement beats a prior: where the network carries measured calls of this backend at this
    # EP layout, the model's times scaled by measured / model at each measured point, interpolated
    # in ln(tokens) and held flat past the ends; exact at a measured point's own shape (§11.5).
    name = b.alias_of or b.name
    pts = [
        m
        for m in links.network.measured
        if m.backend == name and m.ep == call.ep and m.gpus_per_node == call.gpus_per_node
    ]
    if not pts:
        return model
    T = np.log(np.maximum(np.asarray(call.tokens, dtype=float), 1.0))
    scale = {}
    for q in ("dispatch", "combine"):
        own = [m for m in pts if m.quantity in (q, "total")]
        same = [m for m in own if q == "combine" or m.dispatch_dtype == call.dispatch_dtype]
        # another dtype's measurement still corrects the model where none of this one exists
        use = same or own
        if not use:
            continue
        ratio: dict[int, list[float]] = {}
        for m in use:
            at = dataclasses.replace(
                call,
                tokens=np.array([float(m.tokens_per_rank)]),
                hidden=m.hidden,
                top_k=m.top_k,
                num_experts=m.num_experts,
                n_group=m.n_group,
                topk_group=m.topk_group,
                dispatch_dtype=m.dispatch_dtype,
                imbalance=1.0,
            )
            x = b.predict(at, links)  # type: ignore[misc]
            pred = {"dispatch": x.t_dispatch_s, "combine": x.t_combine_s}.get(m.quantity)
            pred = x.t_dispatch_s + x.t_combine_s if pred is None else pred
            ratio.setdefault(m.tokens_per_rank, []).append(
                float(np.log(m.t_s / float(np.asarray(pred)[0])))
            )
        xs = sorted(ratio)
        scale[q] = np.exp(
            np.interp(T, np.log(np.array(xs, dtype=float)), [float(np.mean(ratio[x])) for x in xs])
        )
    return dataclasses.replace(
        model,
        t_dispatch_s=model.t_dispatch_s * scale.get("dispatch", 1.0),
        t_combine_s=model.t_combine_s * scale.get("combine", 1.0),
        bound_dispatch=model.bound_dispatch + ("+measured" if "dispatch" in scale else ""),
        bound_combine=model.bound_combine + ("+measured" if "combine" in scale else ""),
    )
