"""The builder's derivations as named, tested functions (tools/build_profiles.py assembles the
profiles from them and the committed fits; tests/test_build_profiles.py tests each): a sourced
table, one profile tree from another, the collectives of a GPU scaled from another's by the link
ratio, one ring's all-reduce, NCCL's regime curves from the committed fit, vLLM's custom
reduce-scatter / all-gather backends from physics, and the NVLS ratio that carries the multimem
efficiency from NVLink5 to NVLink4. Pure tree transforms: no fitting here."""

from __future__ import annotations

import copy

from calib import results as CR
from costmodel import formulas as F
from costmodel import vllm_tables as T

RING = F.RING_LINK_RATIO


def round_value(v):
    return CR.profile_digits(v) if isinstance(v, float) else v


def round_tree(tree):
    """Every float of a profile tree rounded to 4 significant digits (what the TOML files hold), so
    that a different numpy/scipy build, which moves a fit in its 11th digit, writes the same
    file."""
    if isinstance(tree, dict):
        return {k: round_tree(v) for k, v in tree.items()}
    return round_value(tree)


def sec(source, tier, **vals):
    """A sourced table: values (fitted ones rounded to 4 significant digits), source, tier."""
    return {**{k: round_value(v) for k, v in vals.items()}, "source": source, "tier": tier}


def derive(base: dict, changes: dict) -> dict:
    """A profile tree made from another: a copy of `base` in which each dotted table path of
    `changes` ("identity", "interconnect", "asynctp._copy", ...) is replaced by its value, a table,
    or by a function of the old table (the one way one built-in profile is made from another)."""
    p = copy.deepcopy(base)
    for path, new in changes.items():
        *parents, leaf = path.split(".")
        node = p
        for key in parents:
            node = node[key]
        node[leaf] = new(node[leaf]) if callable(new) else new
    return p


def scaled_collectives(base, ratio, why, lat_add=0.0):
    """Collectives of another GPU from the H100 fits: busBW × link-bandwidth ratio (tier
    assumed)."""
    out = {}
    for impl, per_tp in base.items():
        out[impl] = {}
        for tp, e in per_tp.items():
            out[impl][tp] = sec(
                f"assumed: H100 value ({e['source'].split(';')[0]}) with busBW x {ratio:.3g} "
                f"({why})",
                "assumed",
                latency_s=e["latency_s"] + lat_add,
                bus_bw_bytes_per_s=e["bus_bw_bytes_per_s"] * ratio,
            )
    return out


def one_ring(coll: dict) -> dict:
    """An assumed profile's NCCL all-reduce at large messages from the same ring as its all-gather
    and reduce-scatter:
    a ring all-reduce is a reduce-scatter then an all-gather, so at each TP its busBW (nccl-tests'
    convention) is the ring's Simple busBW and t_AR = t_RS + t_AG (docs/model.md §4); the
    all-reduce's own latency stays. Scaling H100's all-reduce fit (to 16 MB) and its 16 GiB ring
    regime by the same link ratio left them disagreeing (issue 47)."""
    ar = coll.get("nccl_all_reduce", {})
    for tp, e in ar.items():
        ring = coll.get("nccl_all_gather", {}).get(tp)
        if ring is not None:
            e["bus_bw_bytes_per_s"] = ring["bus_bw_bytes_per_s"]
            e["source"] += (
                "; busBW = this profile's ring Simple busBW at the same TP (one ring: a ring "
                "all-reduce is "
                "a reduce-scatter then an all-gather)"
            )
    return coll


# MLENG_NET_SHARP, 8 GPUs, 8 GiB all-reduce with NVLS: busBW = 2(W-1)/(W+1) x the multicast rate per
# direction (ld_reduce + st move (1 + 1/W)·S each way): H200 473.1 GB/s over 450, B200 838.0 over
# 900 -> NVLink4 / NVLink5
SHARP_NVLS_BUSBW = {"nvlink4": (473.1e9, 450e9), "nvlink5": (838.0e9, 900e9)}


def nvls_multimem_efficiency(nvlink: str, world: int = 8) -> float:
    """The multimem rate per direction NCCL's NVLS all-reduce reaches, over the link peak
    (MLENG_NET_SHARP, 8 GiB):
    busBW = 2(W−1)/(W+1)·η·link, so η = busBW·(W+1)/(2(W−1)·link) (docs/model.md §6b)."""
    bus, link = SHARP_NVLS_BUSBW[nvlink]
    return bus * (world + 1) / (2 * (world - 1) * link)


def nccl_regimes(p, fit, tier, note=""):
    """TP 8 NCCL all-reduce as NCCL's tuner runs it: the three regime curves of calib/nccl_fit.py
    (lowest latency first; nccl_all_reduce the bandwidth regime), replacing the one alpha-beta curve
    there."""
    p = copy.deepcopy(p)
    per = fit["per_source"]
    errs = "; ".join(
        f"{s} max |busBW err| from 1 MiB {e['max_abs_busbw_err_from_1mib']:.3f}"
        + (f" (harness offset {e['offset_s'] * 1e6:.1f} us)" if e["offset_s"] else "")
        for s, e in per.items()
    )
    for name, v in fit["regimes"].items():
        p["collectives"].setdefault(name, {})["tp8"] = sec(
            f"{note}NCCL all-reduce regime {name} of the joint fit of the lower envelope of three "
            "alpha-beta curves "
            f"(calib/nccl_fit.py) to {', '.join(fit['sources'])}: {errs}",
            tier,
            latency_s=v["latency_s"],
            bus_bw_bytes_per_s=v["bus_bw_bytes_per_s"],
        )
    return p


def custom_reduce_scatter(p):
    """vLLM's custom reduce-scatter backends (model-level SP;
    costmodel.vllm_tables.custom_rs_backend), from physics, tier assumed (no released row times
    them), at each TP the profile has a one-stage custom AR for:
    - Lamport (multicast buffer present): a one-shot push of the (W-1)/W·S foreign slices,
    flag-free; latency the
      lower of the one-stage custom all-reduce's (the same push plus two barriers) and FlashInfer's
      Lamport one-shot AR+RMSNorm's at that TP (the same Lamport push plus the norm): each does at
      least its work; busBW the ring's fraction of the link;
    - multimem (SM100 at W 2/4/8): ld_reduce over the multicast address, each GPU ~S of egress and
    S/W of ingress,
      no better than a ring in bandwidth (its gain is latency): t = α + S/(η·link), η the fused
      kernel's multicast efficiency, i.e. busBW = (W-1)/W·η·link;
    - IPC (fully connected, no multicast): each GPU reads its slice from the W-1 peers, as Lamport;
    and its custom all-gathers (costmodel.vllm_tables.custom_ag_backend), Lamport with the multicast
    buffer, IPC without: each GPU takes in the (W-1)/W·S foreign shards, one shot, at the same
    latency and link fraction."""
    p = copy.deepcopy(p)
    coll, ic = p.get("collectives", {}), p.get("interconnect", {})
    if "custom_ar_1stage" not in coll or ic.get("kind") not in ("nvswitch",):
        return p  # (a tree without them is refused where it loads, naming what it lacks)
    link = ic["link_bw_bytes_per_s"]
    multicast = bool(p["interconnect"].get("multicast", 0))
    cc = p["identity"]["compute_capability"]
    for key, c in coll["custom_ar_1stage"].items():
        w = int(key.removeprefix("tp"))
        lat, lat_src = c["latency_s"], f"custom_ar_1stage tp{w}'s ({c['source'][:60]}...)"
        fi = coll.get("flashinfer_ar_rmsnorm", {}).get(key)
        if multicast and fi is not None and fi["latency_s"] < lat:
            lat, lat_src = (
                fi["latency_s"],
                f"flashinfer_ar_rmsnorm tp{w}'s Lamport one-shot ({fi['source'][:60]}...)",
            )
        one_shot = (
            (
                "custom_rs_lamport" if multicast else "custom_rs_ipc",
                f"one-shot {'Lamport push' if multicast else 'IPC read'} of the (W-1)/W foreign "
                "slices",
            ),
            (
                "custom_ag_lamport" if multicast else "custom_ag_ipc",
                f"one-shot {'Lamport' if multicast else 'IPC'} all-gather, each GPU takes in the "
                "(W-1)/W·S "
                "foreign shards",
            ),
        )
        for name, what in one_shot:
            coll.setdefault(name, {})[key] = sec(
                f"assumed (physics, no released row): {what}; latency = {lat_src}, busBW = {RING} "
                "x "
                f"{link / 1e9:.0f} GB/s (the ring's link fraction)",
                "assumed",
                latency_s=lat,
                bus_bw_bytes_per_s=RING * link,
            )
        # its rate is the fused kernel's multicast efficiency
        if (
            multicast
            and "fused_kernel" in p
            and cc in T.CUSTOM_RS_MULTIMEM_CAPABILITIES
            and w in T.CUSTOM_RS_MULTIMEM_WORLDS
        ):
            eta = p["fused_kernel"]["_link_efficiency"]["link_efficiency"]
            coll.setdefault("custom_rs_multimem", {})[key] = sec(
                "assumed (physics, no released row): multimem.ld_reduce reduce-scatter, ~S egress "
                "per GPU at the "
                f"fused kernel's multicast efficiency {eta:.3f} (calib/kernel_fit.py): busBW = "
                f"(W-1)/W x {eta:.3f} x "
                f"{link / 1e9:.0f} GB/s; latency = custom_ar_1stage tp{w}'s",
                "assumed",
                latency_s=lat,
                bus_bw_bytes_per_s=(w - 1) / w * eta * link,
            )
    return p
