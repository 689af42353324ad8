"""NCCL all-reduce as NCCL's tuner runs it: one α–β curve per protocol/algorithm regime, the fastest
taken at each size (formulas.t_all_reduce_regimes_s; docs/model.md §4), fitted jointly to the
released single-node sweeps.

NCCL times every (algorithm, protocol) pair as latency + size / bandwidth and runs the fastest (its
tuning model), so measured time over size is the lower envelope of a few lines: LL at small
messages, LL128 in between, Simple (ring, or NVLS from 5 GPUs on H200 and 6 on B200,
MLENG_NET_SHARP) at large ones. Three regimes are fitted; which protocol each one is, the sweeps do
not say, so the names are by size (`nccl_all_reduce_small`, `_mid`, and the bandwidth regime
`nccl_all_reduce`). A harness that calls NCCL through torch.distributed pays a constant on top
(MLENG_AR_8xH200_NCCL2277's all_reduce_bench.py against NCCL2307's nccl-tests): one latency offset
per source, zero for the reference run (the first of a GPU's sources), which is what the profile
keeps (vLLM calls NCCL through pynccl, under CUDA graphs). On B200 the reference is
MLENG_NET_README's three all-reduce points (its 1 KiB latency, its half-peak payload at half the 16
GiB busBW, and that busBW at 16 GiB), the derivation its all-gather and reduce-scatter curves come
from (calib.components.readme_points), so that MLENG_AR_8xB200_P6's own ~48 us floor at 32 KiB is
its harness's offset, not NCCL's small-message latency.

    python -m calib.nccl_fit        # prints the fits and their in-sample and leave-one-source-out
    errors
"""

from __future__ import annotations

import itertools
import re

import numpy as np

from costmodel import formulas as F

from . import reference
from .fit import fit_least_squares

# small -> large messages
REGIMES = (
    "nccl_all_reduce_small",
    "nccl_all_reduce_mid",
    "nccl_all_reduce",
)
SWEEPS = {
    "h200": (
        "MLENG_AR_8xH200_NCCL2307_NCCLTESTS",
        "MLENG_AR_8xH200_NCCL2277",
    ),  # reference first (offset 0)
    "b200": ("MLENG_NET_README", "MLENG_AR_8xB200_P6"),
}
# three-point sources (readme_points): the GPU whose rows a sweep takes
README_GPU = {"MLENG_NET_README": "B200"}
WORLD = 8
_INIT_LAT = ([15e-6, 30e-6, 70e-6], [45e-6, 60e-6, 120e-6], [45e-6, 80e-6, 200e-6])
_INIT_BW = ([200e9, 320e9, 480e9], [100e9, 400e9, 740e9], [60e9, 300e9, 800e9])


def readme_points(gpu: str, op: str) -> tuple[list[float], list[float], dict]:
    """MLENG_NET_README's three points of one 8-GPU NCCL collective `op` on `gpu` ([1 KiB, half-peak
    payload, 16 GiB] bytes, their times s, the numbers as published): the 1 KiB median latency, half
    the 16 GiB busBW at the half-peak payload, and that busBW at 16 GiB (t = factor·S/busBW)."""
    rows = {r["metric"]: r for r in reference.rows("MLENG_NET_README", gpu=gpu)}
    lat_row, bw_row = rows[f"{op}_latency_median"], rows[f"{op}_peak_busbw"]
    lat, peak_bw = float(lat_row["baseline_value"]) * 1e-6, float(bw_row["baseline_value"]) * 1e9
    half = reference.size_in_notes(bw_row["notes"].replace("half-peak payload", "payload"))
    f = float(F.bus_bw_factor(op, WORLD))
    S = [float(F.KiB), half, 16.0 * F.GiB]
    meta = dict(
        latency_us=lat_row["baseline_value"],
        busbw_gb_s=bw_row["baseline_value"],
        half_peak_bytes=half,
    )
    return S, [lat, f * half / (peak_bw / 2), f * S[2] / peak_bw], meta


def sweep(source_id: str) -> tuple[np.ndarray, np.ndarray]:
    """(message bytes, time s) of one released all-reduce sweep (busBW rows, nccl-tests convention;
    a README_GPU source: its readme_points)."""
    if source_id in README_GPU:
        S_, t_, _ = readme_points(README_GPU[source_id], "all_reduce")
        return np.array(S_), np.array(t_)
    rows = reference.rows(source_id)
    if not rows:
        raise ValueError(f"no rows of {source_id} in {reference.CSV}")
    S = np.array([float(re.match(r"(\d+)", r["M_or_tokens"]).group(1)) for r in rows])  # type: ignore[union-attr]
    bus = np.array([float(r["baseline_value"]) for r in rows]) * 1e9
    return S, float(F.bus_bw_factor("all_reduce", WORLD)) * S / bus


def fit_regime_curves(data: list, world: int = WORLD) -> tuple:
    """The joint soft-L1 fit of log time over sweeps `data` [(message bytes, time s), ...] of NCCL's
    all-reduce on `world` ranks: (the regimes' latencies s and busBWs B/s, small-message regime
    first; each sweep's harness offset s, 0 for the first; model(x, S, i); the sorted parameter
    vector; rms log residual)."""
    P = len(REGIMES)

    def model(x, S, i):
        lat, inv_bw = np.exp(x[:P]), np.exp(x[P : 2 * P])
        t = F.t_all_reduce_regimes_s(S, list(lat), list(1.0 / inv_bw), world)
        return t + (0.0 if i == 0 else np.exp(x[2 * P + i - 1]))

    def resid(x):
        return np.concatenate([np.log(model(x, S, i) / t) for i, (S, t) in enumerate(data)])

    best = None
    for lat0, bw0 in itertools.product(_INIT_LAT, _INIT_BW):
        x0 = np.log(np.concatenate([lat0, 1.0 / np.asarray(bw0), [20e-6] * (len(data) - 1)]))
        # every size counts: the target is the worst one
        r, _ = fit_least_squares(resid, x0, loss="linear")
        if best is None or r.cost < best.cost:
            best = r
    x = best.x
    order = np.argsort(np.exp(x[:P]))  # small-message regime first: the lowest latency
    lat, bw = np.exp(x[:P])[order], 1.0 / np.exp(x[P : 2 * P])[order]
    x_sorted = np.concatenate([np.log(lat), np.log(1.0 / bw), x[2 * P :]])
    offsets = [0.0] + [float(np.exp(v)) for v in x[2 * P :]]
    return lat, bw, offsets, model, x_sorted, float(np.sqrt(np.mean(best.fun**2)))


def fit_regimes(sources: tuple[str, ...]) -> dict:
    """The joint fit of the released sweeps `sources` (fit_regime_curves), with every source's busBW
    error per size."""
    data = [sweep(s) for s in sources]
    lat, bw, offsets, model, x_sorted, rms = fit_regime_curves(data)
    per_source = {}
    for i, (src, (S, t)) in enumerate(zip(sources, data)):
        err = t / model(x_sorted, S, i) - 1.0  # busBW_pred / busBW_meas - 1 = t_meas / t_pred - 1
        big = S >= F.MiB
        per_source[src] = {
            "sizes": S.tolist(),
            "busbw_rel_err": err.tolist(),
            "max_abs_busbw_err_from_1mib": float(np.max(np.abs(err[big]))),
            "median_abs_busbw_err_from_1mib": float(np.median(np.abs(err[big]))),
            "offset_s": offsets[i],
        }
    return {
        "regimes": {
            name: {"latency_s": float(a), "bus_bw_bytes_per_s": float(b)}
            for name, a, b in zip(REGIMES, lat, bw)
        },
        "sources": list(sources),
        "per_source": per_source,
        "rms_log_residual": rms,
    }


def loso(sources: tuple[str, ...]) -> dict:
    """Leave one source out: each held-out sweep predicted by the others' regimes, without its own
    offset (a new harness's constant is unknown in advance)."""
    out = {}
    if len(sources) < 2:
        return out
    for held in sources:
        rest = tuple(s for s in sources if s != held)
        reg = fit_regimes(rest)["regimes"]
        S, t = sweep(held)
        pred = F.t_all_reduce_regimes_s(
            S,
            [reg[n]["latency_s"] for n in REGIMES],
            [reg[n]["bus_bw_bytes_per_s"] for n in REGIMES],
            WORLD,
        )
        err = t / pred - 1.0
        big = S >= F.MiB
        out[held] = {
            "max_abs_busbw_err_from_1mib": float(np.max(np.abs(err[big]))),
            "median_abs_busbw_err_from_1mib": float(np.median(np.abs(err[big]))),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    from costmodel.io import doc_summary

    argparse.ArgumentParser(
        prog="python -m calib.nccl_fit", description=doc_summary(__doc__)
    ).parse_args(argv)
    for gpu, sources in SWEEPS.items():
        fit = fit_regimes(sources)
        print(
            f"{gpu} TP {WORLD}: "
            + ", ".join(
                f"{n} {v['latency_s'] * 1e6:.1f} us / {v['bus_bw_bytes_per_s'] / 1e9:.0f} GB/s"
                for n, v in fit["regimes"].items()
            )
        )
        for src, e in fit["per_source"].items():
            print(
                f"  {src}: in-sample max |busBW err| from 1 MiB "
                f"{e['max_abs_busbw_err_from_1mib']:.3f}, "
                f"harness offset {e['offset_s'] * 1e6:.1f} us"
            )
        for src, e in loso(sources).items():
            print(
                f"  {src}: leave-one-source-out max |busBW err| from 1 MiB "
                f"{e['max_abs_busbw_err_from_1mib']:.3f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
