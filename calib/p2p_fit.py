"""The Hopper fused GEMM+collective kernels without multimem (issue 49 item 2): put / ring / P2P
designs, fitted as kernels of one family that share the hardware terms of the link they run on.

    python -m calib.p2p_fit [--out calib/data/p2p_fit.json]

Sources (data/reference/fused_ops.csv, FUSED_OPS_SOURCES.md), each a kernel of its own:
- TRITONDIST_README_PLOTS, H800 TP 8: Triton-distributed's and FLUX's AG+GEMM and GEMM+RS against
PyTorch + NCCL, M
  8192, speedups read off the README's bar charts (±0.03). Shape labels mM_nN_kK: M global; N
  (AG+GEMM) or K (GEMM+RS) the full weight dimension, sharded by 8. Read so: AG+GEMM m = M, n = N/8,
  k = K (the gathered A is M·K); GEMM+RS m = M, n = N, k = K/8 (the partial reduced is M·N).
- TDIST_PR166_GEMMRS_H100, H100 TP 2/4/8: Triton-distributed's persistent GEMM+RS ("Before") against
torch.matmul +
  reduce_scatter_tensor; K the full K (per GPU K/W); ms.
- JAX_PALLAS_MGPU_AGMM_H100, H100 TP 2/4/8: Pallas:MGPU's ring all-gather + matmul (TMA sends inside
the GEMM
  pipeline) against NCCL all-gather + cuBLAS, 1024 rows per shard (m = 1024·W), N = K = 4096; us.

The model (docs/model.md §6c): each GPU moves (W−1)/W of the collective's bytes S over its NVLink
peers at a fraction η of the per-direction link peak, in `steps` transfers of a per-step latency λ
(a ring W−1, a put 1):
L = (W−1)/W·S/(η·link) + steps·λ; the GEMM g (the profile's roofline) is slowed by the SMs that
communicate, g' = g·(1+φ); a kernel overlaps them in chunks and gives up a share α of the overlap:
t = c + P + α·(g' + L − P), P = t_wave_pipeline_s(g', L, chunks), chunks W for a ring (one shard a
step), many for a put (tiles: P → max(g', L)). The baseline is the GEMM then NCCL (the profile's
curves). η and λ are the hardware's, shared by every kernel on NVLink4 (H100's 18 links and H800's 8
are one link design: η a fraction of each one's peak); c, φ, α are each kernel's, per op. A term the
rows do not identify keeps its prior (calib/fit.py's one rule). Leave-one-kernel-out: the hardware
terms and the other kernels' terms fitted without the kernel; the kernel's own terms drawn from the
spread of the other kernels' fitted terms of the same op (log-uniform between their least and
largest, or about the prior where fewer than two), and its nominal is the median of those draws, as
calib/kernel_fit.py's."""

from __future__ import annotations

import csv
import dataclasses
import functools
import math
import sys
from pathlib import Path

import numpy as np

from costmodel import ops

from .fit import fit_free_terms
from .results import P2P_CMD, P2P_FIT, run_and_write

ROOT = Path(__file__).resolve().parent.parent
FUSED_CSV = ROOT / "data" / "reference" / "fused_ops.csv"
OUT, COMMAND = P2P_FIT, P2P_CMD  # the committed result (calib/results.py)
PROFILE_OF_GPU = {"H100": "h100-sxm", "H800": "h800"}
SOURCES = ("TRITONDIST_README_PLOTS", "TDIST_PR166_GEMMRS_H100", "JAX_PALLAS_MGPU_AGMM_H100")
# kernel -> its design's transfers per collective: a put reaches every peer at once, a ring W-1 hops
DESIGN_STEPS = {
    "triton-distributed": "put",
    "flux": "put",
    "tdist-pr166": "put",
    "jax-ring": "ring",
}
HARDWARE_PRIOR = {"link_efficiency": (0.8, 0.3, 1.0), "step_latency_s": (3e-6, 1e-7, 5e-5)}
KERNEL_PRIOR = {
    "fixed_s": (10e-6, 1e-7, 5e-4),
    "compute_overhead": (0.1, 1e-3, 2.0),
    "exposed_fraction": (0.2, 1e-3, 1.0),
}
DRAWS, SEED = 400, 0


@dataclasses.dataclass(frozen=True)
class P2pRow:
    """One released cell: the kernel against the GEMM then NCCL (per-rank GEMM m × n × k; s, or a
    speedup alone)."""

    source: str
    line: int
    kernel: str
    op: str  # ag_gemm | gemm_rs
    gpu: str  # built-in profile
    tp: int
    m: int
    n: int
    k: int
    speedup: float  # baseline / fused, as released (a ratio row) or from its two times
    baseline_s: float | None = None  # the released baseline's own time (s; None: a ratio row)


def read_rows(path: Path = FUSED_CSV) -> list[P2pRow]:
    """The Hopper P2P kernel rows of fused_ops.csv under the readings in the module docstring."""
    out = []
    with open(path, newline="", encoding="utf-8-sig") as f:
        for line, r in enumerate(csv.DictReader(f), start=2):
            sid, wl = r["source_id"], r["workload"]
            if sid not in SOURCES:
                continue
            tp, m_pub = int(r["num_gpus"]), int(r["M_or_tokens"].split()[0])
            gpu = PROFILE_OF_GPU[r["gpu"].split()[0]]
            if sid == "TRITONDIST_README_PLOTS":
                kernel = "flux" if "FLUX" in wl else "triton-distributed"
                op = "ag_gemm" if wl.startswith("AllGather") else "gemm_rs"
                n_full, k_full = int(r["N"]), int(r["K"])
                m, n, k = (
                    (m_pub, n_full // tp, k_full)
                    if op == "ag_gemm"
                    else (m_pub, n_full, k_full // tp)
                )
                speedup = float(r["overlap_value"]) / float(r["baseline_value"])
            elif sid == "TDIST_PR166_GEMMRS_H100":
                kernel, op = "tdist-pr166", "gemm_rs"
                m, n, k = m_pub, int(r["N"]), int(r["K"]) // tp
                speedup = float(r["baseline_value"]) / float(r["overlap_value"])
            else:
                kernel, op = "jax-ring", "ag_gemm"
                m, n, k = 1024 * tp, 4096, 4096
                speedup = float(r["baseline_value"]) / float(r["overlap_value"])
            base = None
            if sid != "TRITONDIST_README_PLOTS":
                base = float(r["baseline_value"]) * {"ms": 1e-3, "us": 1e-6}[r["unit"].strip()]
            out.append(P2pRow(sid, line, kernel, op, gpu, tp, m, n, k, speedup, base))
    return out


@functools.cache
def _hw(gpu: str) -> ops.Hw:
    from costmodel.profile import load_profile

    return ops.Hw(load_profile(gpu), "bf16")


def baseline_s(r: P2pRow) -> float:
    """The GEMM then NCCL's collective (the profile's curves, NCCL as its tuner runs it) (s)."""
    hw = _hw(r.gpu)
    g = float(hw.t_gemm(float(r.m), r.n, r.k))
    if r.op == "ag_gemm":
        return g + float(ops.t_nccl_all_gather_s(hw, r.tp, r.m * r.k * hw.act_bytes))
    return g + float(ops.t_nccl_reduce_scatter_s(hw, r.tp, r.m * r.n * hw.act_bytes))


def fused_s(r: P2pRow, hardware: dict, kernel: dict) -> float:
    """The row's kernel at its shape (s): costmodel.ops.t_p2p_fused_s, the model of the module
    docstring."""
    kern = ops.P2pKernel(DESIGN_STEPS[r.kernel] == "ring", **hardware, **kernel)
    return float(np.ravel(ops.t_p2p_fused_s(_hw(r.gpu), kern, r.op, float(r.m), r.n, r.k, r.tp))[0])


def _kernel_key(kernel: str, op: str) -> str:
    return f"{kernel}:{op}"


class _Problem:
    """Free terms (log values) of one fit: the hardware's two and each (kernel, op)'s three."""

    def __init__(self, rows: list[P2pRow], fixed: dict[str, float]):
        self.rows, self.fixed = rows, dict(fixed)
        terms = {f"hw:{k}": v for k, v in HARDWARE_PRIOR.items()}
        for kk in dict.fromkeys(_kernel_key(r.kernel, r.op) for r in rows):
            terms.update({f"{kk}:{k}": v for k, v in KERNEL_PRIOR.items()})
        self.terms = terms
        self.free = [k for k in terms if k not in self.fixed]
        self.base = np.array([baseline_s(r) for r in rows])

    def values(self, x: np.ndarray) -> dict[str, float]:
        return {
            **{k: v[0] for k, v in self.terms.items()},
            **self.fixed,
            **dict(zip(self.free, map(float, np.exp(x)))),
        }

    def predict(self, vals: dict[str, float]) -> np.ndarray:
        """The predicted speedup of every row."""
        hw = {k: vals[f"hw:{k}"] for k in HARDWARE_PRIOR}
        return np.array(
            [
                b
                / fused_s(
                    r, hw, {k: vals[f"{_kernel_key(r.kernel, r.op)}:{k}"] for k in KERNEL_PRIOR}
                )
                for r, b in zip(self.rows, self.base)
            ]
        )

    def residuals(self, x: np.ndarray) -> np.ndarray:
        return np.log(self.predict(self.values(x)) / np.array([r.speedup for r in self.rows]))


def fit(rows: list[P2pRow], fixed: dict[str, float] | None = None) -> dict:
    """Least squares on ln speedup; the worst unidentified term (σ_rel > 1) fixed at its prior and
    the rest refitted."""
    prob, res, sig, fixed, unidentified = fit_free_terms(
        lambda fx: _Problem(rows, fx), fixed or {}, diff_step=1e-3
    )
    vals = prob.values(np.zeros(0) if res is None else res.x)
    return {
        "values": vals,
        "sigma_rel": {**{k: None for k in fixed}, **sig},
        "unidentified": unidentified,
        "problem": prob,
    }


def score(rows: list[P2pRow], pred) -> dict:
    """Median |speedup error|, the signed median ln(pred/meas), verdicts outside ±5 % of 1."""
    meas = np.array([r.speedup for r in rows])
    pred = np.asarray(pred, dtype=float)
    decided = np.abs(meas - 1.0) > 0.05
    right = int(np.sum((pred[decided] > 1.0) == (meas[decided] > 1.0)))
    timed = [r for r in rows if r.baseline_s is not None]
    return {
        "rows": len(rows),
        "median_abs_speedup_error": float(np.median(np.abs(pred - meas))),
        "median_signed_log_error": float(np.median(np.log(pred / meas))),
        "verdicts_outside_5pct": f"{right}/{int(decided.sum())}",
        # the released baseline against the profile's GEMM then NCCL, where the source times it
        # (None: ratios)
        "baseline_over_profile": (
            [round(r.baseline_s / baseline_s(r), 3) for r in timed] if timed else None
        ),
        "per_row": [
            {
                "line": r.line,
                "op": r.op,
                "tp": r.tp,
                "m": r.m,
                "n": r.n,
                "k": r.k,
                "speedup_measured": round(float(s), 4),
                "speedup_predicted": round(float(p), 4),
            }
            for r, s, p in zip(rows, meas, pred)
        ],
    }


@functools.lru_cache(maxsize=8)
def _fit_without(rows: tuple[P2pRow, ...], kernel: str) -> dict:
    """The fit of every kernel but `kernel`: what both held-out lines take their hardware terms from
    (one fit each)."""
    return fit([r for r in rows if r.kernel != kernel])


def leave_one_kernel_out(
    rows: list[P2pRow], kernel: str, draws: int = DRAWS, seed: int = SEED
) -> dict:
    """The hardware terms and the other kernels' fitted without `kernel`; its own terms (per op)
    drawn from the spread of the other kernels' fitted terms of the same op, log-uniform between
    their least and largest (about the prior at σ 0.3 where fewer than two kernels fit that op); its
    nominal the median of the draws."""
    mine = [r for r in rows if r.kernel == kernel]
    others = _fit_without(tuple(rows), kernel)
    vals, rng = others["values"], np.random.default_rng(seed)
    prob = _Problem(mine, {})
    spread = {}
    for op in dict.fromkeys(r.op for r in mine):
        peers = {k.split(":")[0] for k in vals if k.endswith(f":{op}:fixed_s")}
        for term, (prior, _, _) in KERNEL_PRIOR.items():
            seen = [vals[f"{p}:{op}:{term}"] for p in peers]
            spread[(op, term)] = (
                (min(seen), max(seen))
                if len(seen) >= 2
                else (prior * math.exp(-0.3), prior * math.exp(0.3))
            )
    preds = np.empty((draws, len(mine)))
    for d in range(draws):
        v = {f"hw:{k}": vals[f"hw:{k}"] for k in HARDWARE_PRIOR}
        for (op, term), (a, b) in spread.items():
            v[f"{_kernel_key(kernel, op)}:{term}"] = math.exp(rng.uniform(math.log(a), math.log(b)))
        preds[d] = prob.predict(v)
    return {
        **score(mine, np.median(preds, axis=0)),
        "nominal": f"median of {draws} draws (seed {seed})",
        "trained_on": sorted({r.kernel for r in rows if r.kernel != kernel}),
        "spread": {f"{op}:{t}": [float(a), float(b)] for (op, t), (a, b) in spread.items()},
        "band_5_95": [
            [float(a), float(b)]
            for a, b in zip(np.percentile(preds, 5, axis=0), np.percentile(preds, 95, axis=0))
        ],
    }


def hardware_held_out(rows: list[P2pRow], kernel: str) -> dict:
    """The hardware terms (η, λ) fitted on the other kernels alone and held fixed; `kernel`'s own
    terms (c, φ, α per op) fitted on its own rows under calib/fit.py's one rule: whether the
    hardware terms carry from kernel to kernel, which the unseen-kernel line (leave_one_kernel_out)
    cannot separate from how kernels differ."""
    mine = [r for r in rows if r.kernel == kernel]
    others = _fit_without(tuple(rows), kernel)
    hw = {f"hw:{k}": others["values"][f"hw:{k}"] for k in HARDWARE_PRIOR}
    own = fit(mine, fixed=hw)
    return {
        **score(mine, own["problem"].predict(own["values"])),
        "hardware_from": sorted({r.kernel for r in rows if r.kernel != kernel}),
        "hardware": {k: float(f"{v:.4g}") for k, v in hw.items()},
        "own_terms_identified": sorted(
            k for k, v in own["sigma_rel"].items() if v is not None and k not in hw
        ),
    }


def run(path: Path = FUSED_CSV) -> dict:
    rows = read_rows(path)
    full = fit(rows)
    pred = full["problem"].predict(full["values"])
    kernels = list(dict.fromkeys(r.kernel for r in rows))
    in_sample = {
        k: score(
            [r for r in rows if r.kernel == k], [p for r, p in zip(rows, pred) if r.kernel == k]
        )
        for k in kernels
    }
    return {
        "command": COMMAND,
        "data": "data/reference/fused_ops.csv",
        "sources": list(SOURCES),
        "values": {k: float(f"{v:.4g}") for k, v in full["values"].items()},
        "sigma_rel": {
            k: (None if v is None else round(v, 4)) for k, v in full["sigma_rel"].items()
        },
        "unidentified": full["unidentified"],
        "n_rows": len(rows),
        "in_sample": in_sample,
        "leave_one_kernel_out": {k: leave_one_kernel_out(rows, k) for k in kernels},
        "hardware_held_out": {k: hardware_held_out(rows, k) for k in kernels},
    }


def main(argv: list[str] | None = None) -> int:
    res = run_and_write(argv, __doc__, OUT, run)
    print(
        "hardware: "
        + ", ".join(f"{k} {v:.4g}" for k, v in res["values"].items() if k.startswith("hw:"))
        + (f"; unidentified: {', '.join(res['unidentified'])}" if res["unidentified"] else "")
    )
    for k, a in res["in_sample"].items():
        b = res["leave_one_kernel_out"][k]
        print(
            f"{k:20s} {a['rows']:3d} rows  in-sample {a['median_abs_speedup_error']:.3f} "
            f"({a['median_signed_log_error']:+.3f}, {a['verdicts_outside_5pct']})  left out "
            f"{b['median_abs_speedup_error']:.3f} ({b['median_signed_log_error']:+.3f}, "
            f"{b['verdicts_outside_5pct']})"
        )
        h = res["hardware_held_out"][k]
        print(
            f"{'':20s} hardware from {', '.join(h['hardware_from'])}, own terms on its rows: "
            f"{h['median_abs_speedup_error']:.3f} ({h['median_signed_log_error']:+.3f}, "
            f"{h['verdicts_outside_5pct']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
