"""Fit each network's all-to-all terms to the released DeepEP rows (data/reference/ep_all2all.csv),
score them leave-one-source-out, and write the built-in network files (docs/model.md §11.3,
docs/accuracy.md).

    python -m calib.ep_fit            # fit, score, print
    python -m calib.ep_fit --write    # ... and rewrite costmodel/networks/*.toml and
    calib/data/ep_fit.json
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
from pathlib import Path

import numpy as np

from costmodel import formulas as F
from costmodel.all2all import A2ACall, Links, predict
from costmodel.network import FIELDS, Network, load_network
from costmodel.profile import load_profile

ROOT = Path(__file__).resolve().parent.parent
CSV = ROOT / "data" / "reference" / "ep_all2all.csv"
NET_DIR = ROOT / "costmodel" / "networks"
OUT_JSON = ROOT / "calib" / "data" / "ep_fit.json"
FITTED = (
    "rdma_efficiency",
    "msg_overhead_s",
    "ll_latency_s",
    "ll_latency_per_log2_ep_s",
    "ll_combine_extra_s",
    "nvl_efficiency",
)
# Not fitted: every normal-kernel row is timed at one token count (4096 or 8192), so its fixed cost
# and its bandwidth are not separable there; ht_latency_s stays the assumed value in the network
# file. log-space spread of a term between networks (the hierarchical prior: a network no row covers
# takes the mean)
SIGMA_BETWEEN = {
    "rdma_efficiency": 0.5,
    "msg_overhead_s": 2.0,
    "ll_latency_s": 1.0,
    "ll_latency_per_log2_ep_s": 1.0,
    "ll_combine_extra_s": 1.5,
    "nvl_efficiency": 0.5,
}
# the fit's start, whatever the files hold now
PRIOR = {
    "rdma_efficiency": 0.8,
    "msg_overhead_s": 2e-9,
    "ll_latency_s": 3e-5,
    "ll_latency_per_log2_ep_s": 3e-6,
    "ll_combine_extra_s": 1e-5,
    "nvl_efficiency": 0.7,
}
SIGMA_ROW = 0.1  # a row's own log-error scale (run-to-run and harness spread)
# source_id -> (GPU profile, network); rows of other backends (UCCL, DeepEP V2) are kept out with
# their reason
SOURCES = {
    "DEEPEP_V1_README": ("h800", "ib-cx7-400g"),
    "DEEPEP_ISSUE28": ("h800", "ib-cx7-400g"),
    "DEEPEP_ISSUE155": ("h100-sxm", "ib-cx7-400g"),
    "AWSLABS_EP_B200": ("b200", "efa-p6-b200"),
    "AWSLABS_EP_H100": ("h100-sxm", "efa-p5"),
    "DEEPEP_ISSUE303": ("h20", "roce-200g"),
    "DEEPEP_ISSUE138": ("h20", "roce-200g"),
}
# networks no released row covers, built from their datasheets: their fitted terms take the
# networks' common mean (written after the fit, never part of it)
DATASHEET_NETWORKS = ("ib-hdr-200g", "ib-cx8-800g")
EXCLUDED = {
    "DEEPEP_ISSUE183": "its reporter calls the result abnormal (DeepEP issue #183)",
    "DEEPEP_V2_README": "DeepEP V2 (deepep_v2) is not priced; its logical bandwidth is a transport "
    "check",
}
# DeepEP tests/test_low_latency.py defaults
LL_DEFAULT = dict(tokens=128, hidden=7168, topk=8, experts=288)
# tests/test_intranode.py, test_internode.py
HT_DEFAULT = dict(tokens=4096, hidden=7168, topk=8, experts=256)


@dataclasses.dataclass(frozen=True)
class Row:
    """One released value as a time: which call, which quantity (dispatch, combine, total) and its
    measured seconds."""

    source: str
    gpu: str
    network: str
    backend: str
    call: A2ACall
    quantity: str
    measured_s: float
    what: str


def _backend(text: str) -> str | None:
    t = text.lower()
    if "uccl" in t or "v2" in t:
        return None
    return "deepep_low_latency" if ("low-latency" in t or " ll" in t) else "deepep_high_throughput"


def _num(v: str) -> float | None:
    return float(v) if v.strip() else None


def read_rows(path: Path = CSV) -> tuple[list[Row], list[str]]:
    """The rows the fit uses, and one line per row left out with its reason."""
    rows, skipped = [], []
    with open(path, newline="") as f:
        for i, r in enumerate(csv.DictReader(f), start=2):
            sid = r["source_id"]
            if sid in EXCLUDED:
                skipped.append(f"{sid} line {i}: {EXCLUDED[sid]}")
                continue
            be = _backend(r["backend"])
            if be is None:
                skipped.append(
                    f"{sid} line {i}: {r['backend']} is not a backend vLLM 0.34 runs under that "
                    "name "
                    "(a transport check only)"
                )
                continue
            rows.extend(_rows_of(sid, r, be))
    return rows, skipped


def _rows_of(sid: str, r: dict, be: str) -> list[Row]:
    gpu, net = SOURCES[sid]
    d = LL_DEFAULT if be == "deepep_low_latency" else HT_DEFAULT
    T = int(_num(r["tokens_per_rank"]) or d["tokens"])
    H = int(_num(r["hidden"]) or d["hidden"])
    k = int(_num(r["topk"]) or d["topk"])
    E = int(_num(r["num_experts"]) or d["experts"])
    ep = int(r["ep"])
    nodes = ep // 8 if ep > 8 else 1
    intranode = (
        "intranode" in r["metric_note"].lower()
        or "(intranode)" in r["backend"]
        or "nvlink" in r["network"].lower()
        and ep <= 8
    )
    note = r["metric_note"]
    dd = r["dispatch_dtype"] or (
        "bf16"
        if "bf16" in note and "fp8" not in note.split("bf16")[-1]
        else ("fp8" if be == "deepep_low_latency" else "bf16")
    )
    # DeepEP's internode test limits each token to min(nodes, 4) node groups; the others route
    # freely
    ng, tg = (nodes, min(nodes, 4)) if (be == "deepep_high_throughput" and nodes > 1) else (1, 1)
    call = A2ACall(
        tokens=T,
        hidden=H,
        top_k=k,
        num_experts=E,
        n_group=ng,
        topk_group=tg,
        ep=ep,
        gpus_per_node=8,
        dispatch_dtype=dd,
        combine_dtype=r["combine_dtype"] or "bf16",
    )
    out = []
    for q, dt in (("dispatch", dd), ("combine", "bf16")):
        us, gbps = _num(r[f"{q}_us"]), _num(r[f"{q}_GBps"])
        if us is not None:
            out.append(Row(sid, gpu, net, be, call, q, us * 1e-6, f"{q} {us:g} us"))
        elif gbps is not None:
            out.append(
                Row(
                    sid,
                    gpu,
                    net,
                    be,
                    call,
                    q,
                    logical_bytes(be, call, dt, intranode) / (gbps * 1e9),
                    f"{q} {gbps:g} GB/s",
                )
            )
    tot = _num(r["total_us"])
    if tot is not None:
        out.append(
            Row(sid, gpu, net, be, call, "total", tot * 1e-6, f"dispatch+combine {tot:g} us")
        )
    return out


def logical_bytes(be: str, call: A2ACall, dtype: str, intranode: bool) -> float:
    """The bytes per rank DeepEP's tests divide by the time to print a bandwidth: low-latency, every
    token-expert pair; normal inside a node, one copy per destination rank; across nodes, one per
    destination node (RDMA)."""
    T, H, k, E = (
        float(np.asarray(call.tokens).ravel()[0]),
        call.hidden,
        call.top_k,
        call.num_experts,
    )
    b = F.a2a_token_bytes(H, dtype)
    if be == "deepep_low_latency":
        return T * k * b
    if intranode or call.nodes == 1:
        return float(T * F.expected_bins_hit(k, E, 1, 1, call.ep) * b)
    return float(T * F.expected_bins_hit(k, E, call.n_group, call.topk_group, call.nodes) * b)


def _predict_row(row: Row, net: Network) -> float:
    prof = load_profile(row.gpu)
    links = Links(nvlink_bw_bytes_per_s=float(prof.interconnect.link_bw_bytes_per_s), network=net)
    t = predict(row.backend, row.call, links)
    v = {"dispatch": t.t_dispatch_s, "combine": t.t_combine_s}.get(row.quantity)
    return float(v if v is not None else t.t_dispatch_s + t.t_combine_s)


def _pack(nets: dict[str, Network], names: list[str]) -> np.ndarray:
    x = [math.log(max(getattr(nets[n], f), 1e-12)) for n in names for f in FITTED]
    return np.array(
        x
        + [
            math.log(max(float(np.median([getattr(nets[n], f) for n in names])), 1e-12))
            for f in FITTED
        ]
    )


def _unpack(
    x: np.ndarray, base: dict[str, Network], names: list[str]
) -> tuple[dict[str, Network], np.ndarray]:
    nets, j = dict(base), 0
    for n in names:
        vals = {}
        for f in FITTED:
            vals[f] = float(np.exp(x[j]))
            j += 1
        vals["rdma_efficiency"] = min(vals["rdma_efficiency"], 1.0)
        vals["nvl_efficiency"] = min(vals["nvl_efficiency"], 1.0)
        nets[n] = base[n].with_values(**vals)
    return nets, x[j:]


def fit(rows: list[Row], base: dict[str, Network]) -> tuple[dict[str, Network], dict[str, float]]:
    """Every network's terms by least squares in log space, each tied to the networks' common mean
    (so a network with no rows takes that mean) (§11.3)."""
    from calib.fit import fit_least_squares

    names = sorted(base)

    def resid(x):
        nets, mu = _unpack(x, base, names)
        r = [
            (math.log(_predict_row(w, nets[w.network])) - math.log(w.measured_s)) / SIGMA_ROW
            for w in rows
        ]
        j = 0
        for _n in names:
            for i, f in enumerate(FITTED):
                r.append((x[j] - mu[i]) / SIGMA_BETWEEN[f])
                j += 1
        return np.array(r)

    sol, _sigma = fit_least_squares(resid, _pack(base, names), loss="linear", max_nfev=4000)
    nets, mu = _unpack(sol.x, base, names)
    return nets, {f: float(np.exp(m)) for f, m in zip(FITTED, mu)}


def score(rows: list[Row], nets: dict[str, Network]) -> dict:
    """Median |ln(pred/meas)| and the signed median per source, with each row's ratio."""
    out: dict[str, dict] = {}
    for w in rows:
        e = math.log(_predict_row(w, nets[w.network]) / w.measured_s)
        out.setdefault(w.source, {"rows": []})["rows"].append(
            {"what": f"{w.backend} EP {w.call.ep} {w.what}", "ln_pred_over_meas": round(e, 4)}
        )
    for s in out.values():
        es = [r["ln_pred_over_meas"] for r in s["rows"]]
        s["median_abs_ln"] = round(float(np.median(np.abs(es))), 4)
        s["bias"] = round(float(np.median(es)), 4)
    return out


def leave_one_source_out(rows: list[Row], base: dict[str, Network]) -> dict:
    """Each source scored by a fit made without its rows."""
    out = {}
    for sid in sorted({w.source for w in rows}):
        nets, _ = fit([w for w in rows if w.source != sid], base)
        out[sid] = score([w for w in rows if w.source == sid], nets)[sid]
        out[sid]["network_rows_left"] = sum(
            1 for w in rows if w.source != sid and w.network == SOURCES[sid][1]
        )
    return out


def write_network(net: Network, path: Path, mu: dict[str, float], n_rows: int) -> None:
    """One network file: the datasheet values as they were, the fitted ones with the fit as their
    source."""
    import tomli_w

    tree: dict = {"name": net.name, "display_name": net.display_name, "transport": net.transport}
    for key, *_ in FIELDS:
        v = getattr(net, key)
        if key in FITTED:
            src = (
                f"fit to {n_rows} rows of data/reference/ep_all2all.csv on this network "
                "(calib/ep_fit.py)"
                if n_rows
                else f"no released row on this network: the networks' common mean {mu[key]:.4g} "
                "(calib/ep_fit.py)"
            )
            tier = "published-measurement" if n_rows else "assumed"
            sig = 0.15 if n_rows else SIGMA_BETWEEN[key] / 2
        else:
            src, tier, sig = net.sources[key], net.tiers[key], net.sigmas[key]
        tree[key] = {"value": float(f"{v:.4g}"), "source": src, "tier": tier, "sigma": sig}
    text = (
        "# Generated by calib/ep_fit.py --write (datasheet values kept, fitted values rewritten).\n"
    )
    path.write_text(text + tomli_w.dumps(tree))


def main(argv=None) -> int:
    from costmodel.io import doc_summary

    ap = argparse.ArgumentParser(prog="python -m calib.ep_fit", description=doc_summary(__doc__))
    ap.add_argument(
        "--write", action="store_true", help="rewrite the built-in network files and ep_fit.json"
    )
    args = ap.parse_args(argv)
    rows, skipped = read_rows()
    base = {
        n: load_network(str(NET_DIR / f"{n}.toml")).with_values(**PRIOR)
        for n in sorted({v[1] for v in SOURCES.values()})
    }
    nets, mu = fit(rows, base)
    ins = score(rows, nets)
    loo = leave_one_source_out(rows, base)
    result = {
        "command": "python -m calib.ep_fit --write",
        "rows": len(rows),
        "skipped": skipped,
        "networks": {
            n: {f: float(f"{getattr(v, f):.4g}") for f in FITTED} for n, v in nets.items()
        },
        "common_mean": {f: float(f"{v:.4g}") for f, v in mu.items()},
        "in_sample": ins,
        "leave_one_source_out": loo,
    }
    for sid in sorted(ins):
        print(
            f"{sid:18s} in-sample |ln| {ins[sid]['median_abs_ln']:.3f} bias "
            f"{ins[sid]['bias']:+.3f}   "
            f"held out |ln| {loo[sid]['median_abs_ln']:.3f} bias {loo[sid]['bias']:+.3f}"
        )
    if args.write:
        for n, v in nets.items():
            write_network(v, NET_DIR / f"{n}.toml", mu, sum(1 for w in rows if w.network == n))
        write_datasheet_networks(mu)
        OUT_JSON.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def write_datasheet_networks(mu: dict[str, float]) -> None:
    """The networks no released row covers: their datasheet values as they are, the fitted terms at
    the fitted networks' common mean (they stay out of the fit, so they cannot move it)."""
    for n in DATASHEET_NETWORKS:
        write_network(
            load_network(str(NET_DIR / f"{n}.toml")).with_values(**mu), NET_DIR / f"{n}.toml", mu, 0
        )


if __name__ == "__main__":
    raise SystemExit(main())
