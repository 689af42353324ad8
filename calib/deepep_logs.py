"""DeepEP's own test logs (tests/test_low_latency.py, test_intranode.py, test_internode.py) read
into measured all-to-all calls of a network file: `tpcost calibrate --from-deepep LOG ... --from
NETWORK --out FILE.toml`.

The line shapes, with their version-to-version variants, are in data/reference/DEEPEP_LOGS.md. A log
is one test run: its shape comes from its `[config]` line, else from the flags (`--num-tokens`,
`--hidden`, `--num-topk`, `--num-experts`, `--ep`). Per-rank lines are averaged over the ranks. A
time is taken as printed; a line that prints only a bandwidth is turned into a time with the bytes
DeepEP divides by (calib.ep_fit.logical_bytes), so the point reproduces the printed bandwidth
exactly. Every malformed result line, and every log with none, is one line.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np

from costmodel.errors import TpcostError
from costmodel.io import read_text
from costmodel.network import MeasuredA2A

_NUM = r"([0-9]+(?:\.[0-9]+)?)"
CONFIG = re.compile(
    r"\[config\]\s*num_tokens=(\d+)\s*,\s*hidden=(\d+)\s*,\s*num_topk=(\d+)\s*,\s*num_experts=(\d+)"
)
LL_TOTAL = re.compile(
    rf"^\[rank (\d+)\] Dispatch \+ combine bandwidth: {_NUM} GB/s, avg_t={_NUM} us"
    rf"(?:, min_t={_NUM} us, max_t={_NUM} us)?\s*$"
)
LL_SPLIT = re.compile(
    rf"^\[rank (\d+)\] Dispatch bandwidth: {_NUM} GB/s, avg_t={_NUM} us \| "
    rf"Combine bandwidth: {_NUM} GB/s, avg_t={_NUM} us\s*$"
)
LL_HOOK = re.compile(
    rf"^\[rank (\d+)\] Dispatch send/recv time: {_NUM} \+ {_NUM} us \| "
    rf"Combine send/recv time: {_NUM} \+ {_NUM} us\s*$"
)
BEST = re.compile(
    rf"^\[tuning\] Best (dispatch \((FP8|BF16)\)|combine): SMs \d+, NVL chunk \d+"
    rf"(, RDMA chunk \d+)?[:,] (?:{_NUM} \+ {_NUM} us, )?{_NUM} GB/s \((NVL|RDMA)\)"
    rf"(?:, {_NUM} GB/s \(NVL\))?(?:, (?:avg_)?t: {_NUM} us)?\s*$"
)


@dataclasses.dataclass(frozen=True)
class Shape:
    """The test's shape: tokens per rank, hidden, top-k, experts, EP size and GPUs per node."""

    num_tokens: int
    hidden: int
    num_topk: int
    num_experts: int
    ep: int
    gpus_per_node: int


@dataclasses.dataclass(frozen=True)
class Logged:
    """One result a log prints: what it measures, the time or bandwidth, and where it stands."""

    backend: str
    quantity: str  # dispatch | combine | total
    dtype: str  # the dispatch's (fp8 / bf16)
    t_s: float | None
    gbps: float | None
    intranode: bool
    line: int
    text: str


def _rank_line(ln: str, at: str, i: int, ll: dict, ranks: set) -> None:
    """One low-latency per-rank line into `ll` (quantity -> [(line, s, text)]); other per-rank lines
    pass."""
    found = next(
        (
            (kind, m)
            for kind, rx in (("split", LL_SPLIT), ("total", LL_TOTAL), ("hook", LL_HOOK))
            if (m := rx.match(ln))
        ),
        None,
    )
    if found is None:
        if "bandwidth" in ln or "send/recv" in ln:
            raise TpcostError(
                f"{at}: a DeepEP low-latency result line tpcost cannot read: {ln[:90]!r} "
                "(data/reference/DEEPEP_LOGS.md lists the shapes it reads)"
            )
        return  # DeepEP's other per-rank lines (correctness checks, progress)
    kind, m = found
    ranks.add(int(m.group(1)))
    g = [float(x) for x in m.groups()[1:] if x is not None]
    if kind == "split":
        ll.setdefault("dispatch", []).append((i, g[1] * 1e-6, ln))
        ll.setdefault("combine", []).append((i, g[3] * 1e-6, ln))
    elif kind == "total":
        ll.setdefault("total", []).append((i, g[1] * 1e-6, ln))
    else:  # the receive hook: kernel times only (the send returns at once, the receive runs later)
        ll.setdefault("hook_dispatch", []).append((i, (g[0] + g[1]) * 1e-6, ln))


def _best_line(ln: str, at: str, i: int) -> Logged:
    """One `[tuning] Best ...` line of test_intranode.py / test_internode.py."""
    m = BEST.match(ln)
    if not m:
        raise TpcostError(
            f"{at}: a DeepEP tuning result tpcost cannot read: {ln[:90]!r} "
            "(data/reference/DEEPEP_LOGS.md lists the shapes it reads)"
        )
    what, dtype, rdma_chunk, notify, transmit, gbps, link, _nvl, t_us = m.groups()
    internode = bool(rdma_chunk) or link == "RDMA"
    t = float(t_us) * 1e-6 if t_us else (float(notify) + float(transmit)) * 1e-6 if notify else None
    return Logged(
        "deepep_high_throughput",
        "combine" if what == "combine" else "dispatch",
        (dtype or "bf16").lower(),
        t,
        float(gbps),
        not internode,
        i,
        ln,
    )


def parse(text: str, origin: str) -> tuple[list[Logged], tuple[int, ...] | None, int]:
    """(the results of one DeepEP log, its [config] shape if printed, the ranks that printed
    low-latency lines)."""
    config, ranks, out = None, set(), []
    ll: dict[str, list[tuple[int, float, str]]] = {}
    for i, raw in enumerate(text.splitlines(), 1):
        ln = raw.strip()
        at = f"{origin}:{i}"
        if ln.startswith("[config]"):
            m = CONFIG.search(ln)
            if not m:
                raise TpcostError(
                    f"{at}: a [config] line tpcost cannot read: {ln[:80]!r} (expected num_tokens=, "
                    "hidden=, num_topk=, num_experts=)"
                )
            config = tuple(int(g) for g in m.groups())
        elif ln.startswith("[rank"):
            _rank_line(ln, at, i, ll, ranks)
        elif ln.startswith("[tuning] Best"):
            out.append(_best_line(ln, at, i))
    if "hook_dispatch" in ll and not ({"dispatch", "total"} & set(ll)):
        raise TpcostError(
            f"{origin}:{ll['hook_dispatch'][0][0]}: send/recv times with the receive hook time the "
            "kernels, not the transfer between them (it overlaps other work): give the log's "
            "'Dispatch bandwidth: ... avg_t=' lines (the test without the hook)"
        )
    for q in ("dispatch", "combine", "total"):
        rows = ll.get(q)
        if rows:
            t = float(np.mean([r[1] for r in rows]))
            out.append(
                Logged(
                    "deepep_low_latency",
                    q,
                    "fp8",
                    t,
                    None,
                    False,
                    rows[0][0],
                    f"mean over {len(rows)} rank(s) of: {rows[0][2]}",
                )
            )
    if not out:
        raise TpcostError(
            f"{origin}: no DeepEP result line (the [rank N] ... avg_t= lines of "
            "test_low_latency.py, "
            "the [tuning] Best ... lines of test_intranode.py / test_internode.py)"
        )
    return out, config, len(ranks)


def _shape(config, ranks: int, flags: dict, origin: str, backend: str) -> Shape:
    """The log's shape: its [config] line, else the flags; EP from --ep, else the ranks a
    low-latency log printed."""
    if config is not None:
        for key, v in zip(("num_tokens", "hidden", "num_topk", "num_experts"), config, strict=True):
            if flags.get(key) is not None and flags[key] != v:
                raise TpcostError(
                    f"{origin}: its [config] line says {key}={v}, the flag "
                    f"--{key.replace('_', '-')} "
                    f"says {flags[key]}: drop the flag"
                )
        nt, h, k, e = config
    else:
        missing = [
            f"--{k.replace('_', '-')}"
            for k in ("num_tokens", "hidden", "num_topk", "num_experts")
            if flags.get(k) is None
        ]
        if missing:
            raise TpcostError(
                f"{origin}: no [config] line, so give the test's shape: {', '.join(missing)} "
                "(DeepEP's "
                "defaults or the flags it ran with)"
            )
        nt, h, k, e = (flags[x] for x in ("num_tokens", "hidden", "num_topk", "num_experts"))
    ep = flags.get("ep") or (ranks if backend == "deepep_low_latency" and ranks >= 2 else None)
    if ep is None:
        raise TpcostError(
            f"{origin}: give --ep (the test's GPUs in all; a tuning log prints rank 0 only)"
        )
    gpn = flags.get("gpus_per_node") or min(ep, 8)
    if ep % gpn and ep > gpn:
        raise TpcostError(
            f"{origin}: EP {ep} does not fill whole nodes of {gpn} GPUs (--gpus-per-node)"
        )
    if k > e or e % ep:
        raise TpcostError(
            f"{origin}: top-{k} of {e} experts over EP {ep}: not a shape DeepEP's test runs"
        )
    return Shape(nt, h, k, e, ep, gpn)


def measured_points(paths: list[str], flags: dict, links, gpu: str) -> list[MeasuredA2A]:
    """Every result of every log as a measured call (the network file's [[measured]]), each checked
    against the bottleneck link at line rate: a point faster than that is a wrong shape or network,
    refused in one line."""
    from costmodel.all2all import A2ACall, backend

    from .ep_fit import logical_bytes

    out = []
    for path in paths:
        text = read_text(Path(path), "DeepEP log")
        logged, config, ranks = parse(text, path)
        for lg in logged:
            sh = _shape(config, ranks, flags, path, lg.backend)
            if lg.intranode and sh.ep > sh.gpus_per_node:
                raise TpcostError(
                    f"{path}:{lg.line}: an intranode (NVL) result, but --ep {sh.ep} spans "
                    f"{sh.ep // sh.gpus_per_node} nodes"
                )
            nodes = max(1, sh.ep // sh.gpus_per_node)
            ng, tg = (
                (nodes, min(nodes, 4))
                if lg.backend == "deepep_high_throughput" and nodes > 1
                else (1, 1)
            )
            call = A2ACall(
                tokens=np.array([float(sh.num_tokens)]),
                hidden=sh.hidden,
                top_k=sh.num_topk,
                num_experts=sh.num_experts,
                n_group=ng,
                topk_group=tg,
                ep=sh.ep,
                gpus_per_node=sh.gpus_per_node,
                dispatch_dtype=lg.dtype,
            )
            dt = lg.dtype if lg.quantity == "dispatch" else "bf16"
            t = (
                lg.t_s
                if lg.t_s is not None
                else logical_bytes(lg.backend, call, dt, lg.intranode) / (lg.gbps * 1e9)
            )
            x = backend(lg.backend).predict(call, links)  # type: ignore[misc]
            floor = _line_rate_floor(x, lg.quantity, links)
            if t < floor * (1 - 1e-9):
                raise TpcostError(
                    f"{path}:{lg.line}: {t * 1e6:.1f} us beats the bottleneck link at line rate "
                    f"({floor * 1e6:.1f} us for these bytes): a wrong shape (--num-tokens, --ep) "
                    "or "
                    "network (--from)"
                )
            out.append(
                MeasuredA2A(
                    backend=lg.backend,
                    quantity=lg.quantity,
                    gpu=gpu,
                    ep=sh.ep,
                    gpus_per_node=sh.gpus_per_node,
                    tokens_per_rank=sh.num_tokens,
                    hidden=sh.hidden,
                    top_k=sh.num_topk,
                    num_experts=sh.num_experts,
                    n_group=ng,
                    topk_group=tg,
                    dispatch_dtype=lg.dtype,
                    t_s=float(f"{t:.6g}"),
                    source=f"DeepEP log {Path(path).name}:{lg.line}: {lg.text[:120]}",
                )
            )
    return out


def _line_rate_floor(x, quantity: str, links) -> float:
    """The time the call's bytes take at line rate on its bottleneck link (s): RDMA at the NICs,
    NVLink inside."""

    def one(rdma, nvl):
        r = float(np.asarray(rdma).ravel()[0]) / links.network.line_rate_per_gpu_bytes_per_s
        n = float(np.asarray(nvl).ravel()[0]) / links.nvlink_bw_bytes_per_s
        return max(r, n)

    d = one(x.rdma_dispatch_bytes, x.nvl_dispatch_bytes)
    c = one(x.rdma_combine_bytes, x.nvl_combine_bytes)
    return {"dispatch": d, "combine": c}.get(quantity, d + c)


FLAGS = ("num_tokens", "hidden", "num_topk", "num_experts", "ep", "gpus_per_node")


def run(args) -> int:
    """Read every log into measured calls on --from's network and write --out (atomically, never
    over an input)."""
    from costmodel.all2all import Links
    from costmodel.io import atomic_write_text, check_output_path
    from costmodel.network import load_network, network_from_dict, network_toml
    from costmodel.profile import load_profile

    if not args.source or not args.gpu:
        raise TpcostError(
            "calibrate --from-deepep needs --from NETWORK (a built-in network or a network .toml) "
            "and "
            "--gpu PROFILE (the GPU the logs ran on)"
        )
    out = Path(args.out)
    if out.suffix != ".toml":
        raise TpcostError(f"--out {out}: a network is a .toml file")
    check_output_path(out, args.force, "--out", protect=(args.source, *args.from_deepep))
    base, prof = load_network(args.source), load_profile(args.gpu)
    links = Links(nvlink_bw_bytes_per_s=float(prof.interconnect.link_bw_bytes_per_s), network=base)
    pts = measured_points(args.from_deepep, {k: getattr(args, k) for k in FLAGS}, links, prof.name)
    kept = tuple(
        m
        for m in base.measured
        if (m.backend, m.quantity, m.ep, m.tokens_per_rank)
        not in {(p.backend, p.quantity, p.ep, p.tokens_per_rank) for p in pts}
    )
    name = args.name or f"{base.name}-measured"
    net = dataclasses.replace(base, name=name, measured=kept + tuple(pts))
    text = network_toml(
        net, f"# Written by tpcost calibrate --from-deepep (prior: {base.name}; GPU {prof.name}).\n"
    )
    import tomllib

    network_from_dict(tomllib.loads(text), str(out))  # what is written loads back
    atomic_write_text(out, text)
    print(
        f"tpcost calibrate --from-deepep: wrote {out} ({name}) from {base.name}, {len(pts)} "
        "measured call(s) on "
        f"{prof.name}"
    )
    for m in pts:
        print(
            f"  {m.backend} {m.quantity} EP {m.ep} ({m.gpus_per_node} per node), "
            f"{m.tokens_per_rank} tokens per "
            f"rank, hidden {m.hidden}, top-{m.top_k} of {m.num_experts}: {m.t_s * 1e6:.2f} us"
        )
    print(f"  use it: tpcost ep --gpu {prof.name} --network {out} ...")
    return 0
