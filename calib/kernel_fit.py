"""The joint fit of the single-kernel fused GEMM+RS / GEMM+AR family (docs/model.md §6b) over every
released source.

    python -m calib.kernel_fit [--out calib/data/kernel_fit.json]

Sources (data/reference/fused_ops.csv, FUSED_OPS_SOURCES.md):
- VLLM_PR52079_KIMIK3_GEMMRS: vLLM's gemm_rs_ar (GEMM-RS) against torch GEMM + NCCL reduce-scatter
forced to RING_LL
  and to LDMC. SKU and TP unstated (SM100): read as B200 at TP 8 (K 768 / 1536 are Kimi-K3's 6144/8
  and 12288/8; at TP 4 no call site has K 768), and scored under TP 4 as well (`tp_readings`).
- VLLM_PR53053_K3_GEMMAR_GB300: vLLM's gemm_rs_ar (GEMM-AR) against torch.mm + NCCL LDMC all-reduce,
GB300 TP 8.
  K read as 1536: GEMM-AR's call sites are o_proj (12288/tp) and layer 0's down_proj; the shared
  experts (6144/tp) never all-reduce.
- FLASHINFER_GB200_GEMMRS_MATRIX, the CuTe arm: FlashInfer's single-kernel GEMM+RS on GB200, world
sizes 2 and 4; a
  second kernel of the family with its own kernel terms.

Terms: shared where the hardware is shared (the NVLink5 multicast efficiency and round trip, one
SM100 switch), per kernel (vLLM's: fixed cost, GEMM+AR fence, GEMM slowdown, exposure; FlashInfer's:
its own three), per harness (the offset on both arms: vLLM's two sources ran one benchmark of one
kernel file, PR 52079's benchmarks/kernels/benchmark_gemm_rs*.py grown into PR 53053's
benchmark_kimi_k3_gemm_rs_ar.py, so they share it), per source (the NCCL busBW of its baseline arm,
and where the source forces NCCL's protocol, RING_LL or LDMC, that protocol's latency too: a forced
protocol is not the profile's curve, which is NCCL's own choice). The GEMM, and NCCL's latency under
its own choice, come from the built-in profiles. Per row two residuals, as the replicate noise
weighs them (speedup_weight): its log speedup and its arms' mean log time (one run's arms move
together, so the speedup is known far better than either arm); soft-L1, σ from the Jacobian; a term
the data does not identify (σ_rel > 1) is fixed at its prior, the worst first, and the rest
refitted. A calibration run's own timings (fit_records) are weighed the same way.
Leave-one-source-out: every shared, harness and kernel term fitted without the source; the held-out
source keeps only its own terms (and a harness no other source shares), fitted on its baseline arm
alone, and its nominal is the median of its draws over what it does not know (held_out_draws), not
the prediction at the central terms. Leave-one-world-size-out, for a source that times several world
sizes (FlashInfer's 2 and 4): the same with one world size of it held out, the transfer a prediction
at a world size no row times relies on. Replicate noise: the cells a source times twice
(FlashInfer's bf16 and fp16 rows of one shape) give the floor under the residuals. Code-path noise:
a source's rows that run one grid of the kernel (PR 53053's M ≤ 128) scatter about the model by at
most its run noise, which says which of its verdicts the source itself settles.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import math
import sys
from pathlib import Path

import numpy as np
from costmodel.vllm_tables import Vllm

from costmodel import formulas as F
from costmodel import fused_ops, ops
from costmodel.profile import HardwareProfile, Provenance, profile_from_dict

from .fit import correlation, fit_free_terms
from .results import KERNEL_CMD, KERNEL_FIT, run_and_write

ROOT = Path(__file__).resolve().parent.parent
FUSED_CSV = ROOT / "data" / "reference" / "fused_ops.csv"
OUT, COMMAND = KERNEL_FIT, KERNEL_CMD  # the committed result (calib/results.py)

VLLM_RS, VLLM_AR, FI_RS = (
    "VLLM_PR52079_KIMIK3_GEMMRS",
    "VLLM_PR53053_K3_GEMMAR_GB300",
    "FLASHINFER_GB200_GEMMRS_MATRIX",
)
SOURCES = (VLLM_RS, VLLM_AR, FI_RS)
KERNEL_OF = {VLLM_RS: "vllm", VLLM_AR: "vllm", FI_RS: "flashinfer"}
# one benchmark script lineage (module docstring)
HARNESS_OF = {
    VLLM_RS: "vllm-bench",
    VLLM_AR: "vllm-bench",
}
# NCCL_PROTO/ALGO forced by the source: its latency is the source's own
FORCED_PROTOCOLS = (
    "RING_LL",
    "LDMC",
)
PROFILE_OF = {VLLM_RS: "b200", VLLM_AR: "gb300-nvl72", FI_RS: "gb200-nvl72"}
# the source of a cluster owner's own timings of vLLM's kernel (tpcost calibrate)
CALIBRATION = "calibration"
NVLINK5_BW = 900e9  # bytes/s per direction (https://www.nvidia.com/en-us/data-center/nvlink/)


@functools.cache
def _fit_assembler():
    """The assembler of the GPUs as this fit sees them: specs and the component and family fits, no
    kernel fit or band."""
    from calib.assemble import Assembler, committed_fits, load_specs

    return Assembler(load_specs(), committed_fits(kernel=False, band=False))


@functools.cache
def fit_profile(name: str) -> HardwareProfile:
    """A source's GPU as this fit sees it: assembled from its spec (calib/assemble.py) with the
    component and family fits, before this fit and the band (so a refit reads no profile built from
    an earlier kernel fit)."""
    return profile_from_dict(_fit_assembler().profile(name), name)


def kernel_of(sid: str) -> str:
    """The kernel a source times: the released sources' own, vLLM's for a calibration run."""
    return KERNEL_OF.get(sid, "vllm")


def nvls_link_efficiency(world: int = 8) -> float:
    """The multimem efficiency NCCL's NVLS all-reduce reaches on an NVLink5 switch (MLENG_NET_SHARP,
    B200, 8 GiB at `world` GPUs): busBW = 2(W−1)/(W+1)·η·link (ld_reduce + st move (1 + 1/W)·S each
    way; docs/model.md §6b), so η = busBW·(W+1)/(2(W−1)·link). NCCL drives NVLS from a few channels
    (bounded by its requests in flight), so the switch sustains at least this: the lower bound of
    the shared η."""
    from calib.reference import rows

    r = next(
        r
        for r in rows("MLENG_NET_SHARP", metric="allreduce_busbw", num_gpus=str(world))
        if r["gpu"].startswith("B200")
    )
    return float(r["overlap_value"]) * 1e9 * (world + 1) / (2 * (world - 1) * NVLINK5_BW)


ETA_NVLS = nvls_link_efficiency()
# term -> (prior, lo, hi, what it is); hardware terms are shared by every source, kernel terms by a
# kernel's sources. The priors by mechanism (gemm_rs_ar.py): fixed ≈ the launch (2 µs) + the
# GEMM-done flag written to the peers and the exit barrier's multimem.red + spin (a switch round
# trip λ ≈ 2 µs each) + the prologue (TMEM, mbarriers) ≈ 8 µs; the GEMM+AR fence ≈ one more round
# trip, the system-scope release waiting for its multimem.st acks ≈ 3 µs. Under one harness shared
# by both vLLM sources the data fix only harness + fixed (≈ 33 µs): the split is these priors'.
HARDWARE_PRIOR = {
    "link_efficiency": (
        0.75,
        ETA_NVLS,
        1.0,
        "multimem traffic / unidirectional NVLink5 peak (at least NCCL NVLS's)",
    ),
    "multicast_latency_s": (
        2e-6,
        3e-7,
        1e-5,
        "one multimem.ld_reduce round trip through the switch",
    ),
}
KERNEL_PRIOR = {
    "fixed_s": (8e-6, 1e-7, 2e-4, "launch, flags and exit barrier"),
    "ar_fence_s": (3e-6, 1e-8, 1e-4, "GEMM+AR's system-scope release"),
    "compute_overhead": (0.05, 1e-4, 2.0, "GEMM slowdown beside the communicating warps"),
    "exposed_fraction": (0.05, 1e-4, 1.0, "share of the wave overlap given up"),
    "inflight_scale": (1.0, 1e-3, 64.0, "bytes a CTA keeps in flight over one RS tile's ld_reduce"),
}
# vLLM's bytes in flight are its code (scale 1); FlashInfer's kernel keeps its own number of
# requests in flight
KERNEL_TERMS = {
    "vllm": ("fixed_s", "ar_fence_s"),
    "flashinfer": ("fixed_s", "compute_overhead", "exposed_fraction", "inflight_scale"),
}
# vLLM's kernel by its code, not fitted: warp-specialised, its communication warps beside the MMA
# and epilogue warps (the design, cited in costmodel.vllm_tables), so a wave's multimem traffic
# overlaps the next wave's GEMM (exposure 0); its GEMM slowdown beside the communicating warps is
# the prior (at large M the kernel is link-bound)
DESIGN = {
    "vllm": {
        "exposed_fraction": 0.0,
        "compute_overhead": KERNEL_PRIOR["compute_overhead"][0],
        "inflight_scale": 1.0,
    },
    "flashinfer": {"ar_fence_s": KERNEL_PRIOR["ar_fence_s"][0]},
}
OFFSET_PRIOR = (10e-6, 1e-8, 5e-4)
# a hardware term's fitted partners reported in kernel_fit.json: |correlation| at least this
CORRELATION_SHOWN = 0.3


@dataclasses.dataclass(frozen=True)
class KernelRow:
    """One released single-kernel cell: the fused kernel against its sequential arm (s; k per
    rank)."""

    source: str
    line: int
    op: str  # gemm_rs | gemm_ar
    tp: int
    m: int
    n: int
    k: int
    protocol: str  # the baseline's collective: nccl (its own choice), RING_LL, LDMC
    baseline_s: float
    fused_s: float


def read_rows(path: Path = FUSED_CSV, pr52079_tp: int = 8) -> list[KernelRow]:
    """The single-kernel rows of fused_ops.csv under the readings in the module docstring."""
    out = []
    with open(path, newline="", encoding="utf-8-sig") as f:
        for line, r in enumerate(csv.DictReader(f), start=2):
            sid = r["source_id"]
            if sid not in SOURCES or (sid == FI_RS and "CuTe" not in r["workload"]):
                continue
            scale = {"ms": 1e-3, "us": 1e-6}[r["unit"]]
            if sid == VLLM_RS:
                tp, k, op = pr52079_tp, int(r["K"]), "gemm_rs"
                proto = "RING_LL" if "RING_LL" in r["workload"] else "LDMC"
            elif sid == VLLM_AR:
                tp, k, op, proto = int(r["num_gpus"]), 1536, "gemm_ar", "LDMC"
            else:
                tp = int(r["num_gpus"])
                k, op, proto = int(r["K"]) // tp, "gemm_rs", "nccl"
            out.append(
                KernelRow(
                    sid,
                    line,
                    op,
                    tp,
                    int(r["M_or_tokens"]),
                    int(r["N"]),
                    k,
                    proto,
                    float(r["baseline_value"]) * scale,
                    float(r["overlap_value"]) * scale,
                )
            )
    return out


def _collective(op: str) -> str:
    """The NCCL collective a kernel row's baseline runs: the one the op fuses
    (costmodel.fused_ops)."""
    return "nccl_" + fused_ops.kind(op, "kernel").collective


def _bw_key(r: KernelRow) -> str:
    return f"{r.source}:{r.protocol}:tp{r.tp}:busbw"


def _lat_key(r: KernelRow) -> str | None:
    """The baseline collective's own latency term, where the source forces NCCL's protocol (else the
    profile's)."""
    return f"{r.source}:{r.protocol}:tp{r.tp}:latency_s" if r.protocol in FORCED_PROTOCOLS else None


def _offset_key(sid: str) -> str:
    """The harness offset a source's arms carry: its benchmark's, shared by the sources that ran
    it."""
    return f"{HARNESS_OF.get(sid, sid)}:offset_s"


class _Problem:
    """The parameter vector (log values) of one fit: which terms are free, which fixed, and the row
    predictions."""

    def __init__(
        self, rows: list[KernelRow], fixed: dict[str, float], profiles: dict | None = None
    ):
        self.rows = rows
        self.fixed = dict(fixed)
        self.profiles = profiles or {
            sid: fit_profile(PROFILE_OF[sid]) for sid in {r.source for r in rows}
        }
        terms: dict[str, tuple[float, float, float]] = {}
        for key, (v, lo, hi, _) in HARDWARE_PRIOR.items():
            terms[f"hw:{key}"] = (v, lo, hi)
        for kern in sorted({kernel_of(r.source) for r in rows}):
            for key in KERNEL_TERMS[kern]:
                if key == "ar_fence_s" and not any(
                    r.op == "gemm_ar" and kernel_of(r.source) == kern for r in rows
                ):
                    continue
                v, lo, hi, _ = KERNEL_PRIOR[key]
                terms[f"{kern}:{key}"] = (v, lo, hi)
        for r in rows:
            terms.setdefault(_offset_key(r.source), OFFSET_PRIOR)
            lat, bw = map(float, self.profiles[r.source].collective(_collective(r.op), r.tp))
            terms.setdefault(
                _bw_key(r),
                (bw, 1e10, float(self.profiles[r.source].interconnect.link_bw_bytes_per_s)),
            )
            if _lat_key(r):
                terms.setdefault(_lat_key(r), (lat, 1e-7, 2e-4))
        self.terms = terms
        self.free = [k for k in terms if k not in self.fixed]

    def values(self, x: np.ndarray) -> dict[str, float]:
        return {
            **{k: v[0] for k, v in self.terms.items()},
            **self.fixed,
            **dict(zip(self.free, map(float, np.exp(x)))),
        }

    def kernel_profile(self, sid: str, vals: dict[str, float]) -> HardwareProfile:
        kern = kernel_of(sid)
        kv = {
            f"fused_kernel.{key}": vals.get(
                f"{kern}:{key}", DESIGN[kern].get(key, KERNEL_PRIOR[key][0])
            )
            for key in KERNEL_PRIOR
        }
        kv.update({f"fused_kernel.{key}": vals[f"hw:{key}"] for key in HARDWARE_PRIOR})
        return self.profiles[sid].with_values(
            kv, Provenance("kernel fit", "assumed"), mark_modified=False, new_keys_ok=True
        )

    def predict(self, vals: dict[str, float]) -> list[tuple[float, float]]:
        """(sequential s, fused s) of every row, the source's harness offset on both."""
        profs = {sid: self.kernel_profile(sid, vals) for sid in self.profiles}
        out = []
        for r in self.rows:
            hw = ops.Hw(profs[r.source], "bf16")
            m = float(r.m)
            off = vals[_offset_key(r.source)]
            lat = (
                vals[_lat_key(r)]
                if _lat_key(r)
                else profs[r.source].collective(_collective(r.op), r.tp)[0]
            )
            msg = m * r.n * hw.act_bytes
            t_coll = (F.t_all_reduce_s if r.op == "gemm_ar" else F.t_reduce_scatter_s)(
                msg, lat, vals[_bw_key(r)], r.tp
            )
            seq = off + float(hw.t_gemm(m, r.n, r.k)) + float(t_coll)
            fused = off + float(
                ops.kernel_pair(hw, ops.KernelGemm(r.op, r.n, r.k, r.tp), m, vllm=Vllm()).fused_s[0]
            )
            out.append((seq, fused))
        return out

    def residuals(self, x: np.ndarray, arms: str = "both") -> np.ndarray:
        """Per row, `arms` "both": its log-speedup residual × speedup_weight() and its arms' mean
        log residual (the pair the replicate noise weighs); "baseline": the baseline arm's log
        residual alone."""
        pred = self.predict(self.values(x))
        w = speedup_weight() if arms == "both" else 0.0
        res = []
        for r, (seq, fused) in zip(self.rows, pred):
            rb = math.log(seq / r.baseline_s)
            if arms == "baseline":
                res.append(rb)
                continue
            rf = math.log(fused / r.fused_s)
            res += [w * (rf - rb), 0.5 * (rf + rb)]
        return np.array(res)


def _fit(
    rows: list[KernelRow],
    fixed: dict[str, float] | None = None,
    arms: str = "both",
    profiles: dict | None = None,
) -> dict:
    """Least squares over the free terms; the worst unidentified one (σ_rel > 1) is fixed at its
    prior and the rest refitted until every free term is identified."""
    prob, res, sig, fixed, unidentified = fit_free_terms(
        lambda fx: _Problem(rows, fx, profiles),
        fixed or {},
        lambda p, x: p.residuals(x, arms),
        diff_step=1e-3,
    )
    if res is None:  # every term fixed or unidentified: the rows at the priors
        x = np.zeros(0)
        return {
            "values": prob.values(x),
            "sigma_rel": {k: None for k in fixed},
            "unidentified": unidentified,
            "rms_log": float(np.sqrt(np.mean(prob.residuals(x, arms) ** 2))),
            "problem": prob,
            "correlation": {},
        }
    vals = prob.values(res.x)
    corr = correlation(res)
    partners = {
        k: {
            o: round(float(c), 3)
            for o, c in sorted(zip(prob.free, corr[i]), key=lambda t: -abs(t[1]))
            if o != k and abs(c) >= CORRELATION_SHOWN
        }
        for i, k in enumerate(prob.free)
        if k.startswith("hw:")
    }
    return {
        "values": vals,
        "sigma_rel": {**{k: None for k in fixed}, **sig},
        "unidentified": unidentified,
        "rms_log": float(np.sqrt(np.mean(res.fun**2))),
        "problem": prob,
        "correlation": partners,
    }


def score(rows: list[KernelRow], pred: list[tuple[float, float]]) -> dict:
    """Median |speedup error|, verdicts (right where the measurement is outside ±5 % of 1) and each
    row."""
    per = []
    for r, (seq, fused) in zip(rows, pred):
        s_meas, s_pred = r.baseline_s / r.fused_s, seq / fused
        per.append(
            {
                "line": r.line,
                "m": r.m,
                "k": r.k,
                "tp": r.tp,
                "protocol": r.protocol,
                "speedup_measured": round(s_meas, 4),
                "speedup_predicted": round(s_pred, 4),
                "fused_measured_s": r.fused_s,
                "fused_predicted_s": fused,
            }
        )
    err = [abs(p["speedup_predicted"] - p["speedup_measured"]) for p in per]
    # > 0: predicted too good
    bias = [float(np.log(p["speedup_predicted"] / p["speedup_measured"])) for p in per]
    decided = [p for p in per if abs(p["speedup_measured"] - 1.0) > 0.05]
    right = sum((p["speedup_predicted"] > 1.0) == (p["speedup_measured"] > 1.0) for p in decided)
    return {
        "rows": len(per),
        "median_abs_speedup_error": float(np.median(err)) if err else None,
        "median_signed_log_error": float(np.median(bias)) if bias else None,
        "verdicts_outside_5pct": f"{right}/{len(decided)}",
        "per_row": per,
    }


def _held_out(rows: list[KernelRow], sid: str) -> tuple[list[KernelRow], dict, dict, list[str]]:
    """(`sid`'s rows, the fit without them, `sid`'s own-terms fit on its baseline arm, the kernel
    terms of `sid`'s kernel that no other source fits and that keep their prior)."""
    others = [r for r in rows if r.source != sid]
    mine = [r for r in rows if r.source == sid]
    fit = _fit(others)
    shared = {
        k: v for k, v in fit["values"].items() if not any(k.startswith(s + ":") for s in SOURCES)
    }
    kern = kernel_of(sid)
    prior_kept = [k for k in KERNEL_TERMS[kern] if f"{kern}:{k}" not in shared]
    own = _fit(
        mine,
        fixed={**shared, **{f"{kern}:{k}": KERNEL_PRIOR[k][0] for k in prior_kept}},
        arms="baseline",
    )
    return mine, fit, own, prior_kept


# a held-out source's draws: its nominal (leave_one_out) and its band (calib/band.py)
HELD_OUT_DRAWS, HELD_OUT_SEED = (
    400,
    0,
)


def leave_one_out(
    rows: list[KernelRow], sid: str, draws: int = HELD_OUT_DRAWS, seed: int = HELD_OUT_SEED
) -> dict:
    """Every shared, harness and kernel term fitted without `sid`; `sid` keeps its own terms (offset
    where no other source shares its harness, busBW, a forced protocol's latency), fitted on its
    baseline arm alone. Its nominal is the median of its draws (held_out_draws: what it does not
    know, drawn as a profile's band draws it; a kernel no other source fits gets its terms about
    their priors and an exposure anywhere from wave-pipelined to serial), not the prediction at the
    central terms, which puts an unseen kernel at the best kernel seen (issue 49). The central
    prediction is kept beside it (`at_central_terms`)."""
    d = held_out_draws(rows, sid, draws, seed)
    central = d["central"]
    median = np.median(d["seq_s"] / d["fused_s"], axis=0)
    # the baseline arm as fitted, the median speedup
    pred = [(seq, seq / s) for (seq, _), s in zip(central, median)]
    at_central = score(d["rows"], central)
    return {
        **score(d["rows"], pred),
        "nominal": f"median of {draws} draws (seed {seed})",
        "at_central_terms": {
            k: at_central[k]
            for k in (
                "median_abs_speedup_error",
                "median_signed_log_error",
                "verdicts_outside_5pct",
            )
        },
        "kernel_terms_at_prior": d["prior_kept"],
        "offset_s": d["offset_s"],
    }


def held_out_draws(rows: list[KernelRow], sid: str, draws: int, seed: int) -> dict:
    """Monte Carlo of `sid`'s leave-one-source-out prediction over what it does not know, as a
    profile's band draws its quantities: each switch and kernel term it uses, lognormal at the σ_rel
    of the fit without `sid` (a term that fit leaves unidentified, or one of `sid`'s kernel that no
    other source fits, at the assumed tier's σ about its prior), except a kernel's exposure that
    neither its code (DESIGN) nor another source fixes: uniform on [0, 1], wave-pipelined to serial.
    Design terms are not drawn. Bounds as the fit's. Returns the rows, the draws' (sequential,
    fused) times (s, draws × rows), the prediction at the central terms, the harness offset on both
    arms and the kernel terms kept at their prior. Cached: the nominal and the band share one
    draw."""
    return dict(_held_out_draws(tuple(rows), sid, draws, seed))


@functools.lru_cache(maxsize=16)
def _held_out_draws(rows: tuple[KernelRow, ...], sid: str, draws: int, seed: int) -> dict:
    from costmodel.profile import SIGMA_REL_BY_TIER

    mine, fit, own, prior_kept = _held_out(list(rows), sid)
    kern, rng = kernel_of(sid), np.random.default_rng(seed)
    bounds = {
        **{f"hw:{k}": v for k, v in HARDWARE_PRIOR.items()},
        **{f"{kern}:{k}": v for k, v in KERNEL_PRIOR.items()},
    }
    keys = [k for k in bounds if k in own["values"]]
    seq, fused = np.empty((draws, len(mine))), np.empty((draws, len(mine)))
    for d in range(draws):
        vals = dict(own["values"])
        for key in keys:
            prior, lo, hi, _ = bounds[key]
            if key.split(":", 1)[1] in prior_kept:
                x = (
                    rng.uniform(0.0, 1.0)
                    if key.endswith("exposed_fraction")
                    else prior * math.exp(SIGMA_REL_BY_TIER["assumed"] * rng.standard_normal())
                )
            else:
                sg = fit["sigma_rel"].get(key)
                x = vals[key] * math.exp(
                    (SIGMA_REL_BY_TIER["assumed"] if sg is None else sg) * rng.standard_normal()
                )
            vals[key] = min(max(x, lo), hi)
        p = np.array(own["problem"].predict(vals))
        seq[d], fused[d] = p[:, 0], p[:, 1]
    seq.flags.writeable = fused.flags.writeable = False  # shared by the cache
    return {
        "rows": mine,
        "seq_s": seq,
        "fused_s": fused,
        "offset_s": own["values"][_offset_key(sid)],
        "central": own["problem"].predict(own["values"]),
        "prior_kept": prior_kept,
    }


@functools.lru_cache(maxsize=1)
def speedup_weight() -> float:
    """σ_mean / σ_speedup, the weight of a row's log-speedup residual against its arms' mean log
    residual, from the released cells timed twice (replicate_noise): one run's arms share a state
    (σ_c) beside their own noise (σ_e), so σ_arm² = σ_c² + σ_e², σ_speedup² = 2σ_e², σ_mean² = σ_c²
    + σ_e²/2 = σ_arm² − σ_speedup²/4; the two residuals are independent with these σ's, and weighing
    each by 1/σ is the maximum-likelihood fit (docs/model.md §6b)."""
    e = replicate_noise(read_rows())[FI_RS]
    arm2 = (e["baseline_rms_log"] ** 2 + e["fused_rms_log"] ** 2) / 2.0
    sp2 = e["speedup_rms_log"] ** 2
    return math.sqrt(arm2 - sp2 / 4.0) / math.sqrt(sp2)


def leave_one_world_size_out(
    rows: list[KernelRow], sid: str, in_sample: list[tuple[float, float]]
) -> dict:
    """Transfer across world sizes, for a source that times several (the FlashInfer matrix: 2 and
    4): for each world size W, every term fitted without the source's rows at W (its other world
    sizes and the other sources); the rows at W keep only their own terms (the baseline's NCCL busBW
    at W, a forced protocol's latency), fitted on their baseline arm alone, and are scored beside
    their in-sample score (`in_sample`: the full fit's predictions)."""
    out = {}
    for tp in sorted({r.tp for r in rows if r.source == sid}):
        held = [r.source == sid and r.tp == tp for r in rows]
        test = [r for r, h in zip(rows, held) if h]
        fit = _fit([r for r, h in zip(rows, held) if not h])
        own = {_bw_key(r) for r in test} | {_lat_key(r) for r in test if _lat_key(r)}
        mine = _fit(
            test, fixed={k: v for k, v in fit["values"].items() if k not in own}, arms="baseline"
        )
        out[f"tp{tp}"] = {
            "in_sample": score(test, [p for p, h in zip(in_sample, held) if h]),
            "held_out": score(test, mine["problem"].predict(mine["values"])),
            "trained_on_tp": sorted(
                {r.tp for r, h in zip(rows, held) if not h and r.source == sid}
            ),
        }
    return out


def replicate_cells(rows: list[KernelRow]) -> dict[str, list[tuple[KernelRow, KernelRow]]]:
    """Per source, its cells timed twice (one shape, op, world size and baseline protocol; the
    FlashInfer matrix's bf16 and fp16 rows): the two rows of each."""
    cells: dict = {}
    for r in rows:
        cells.setdefault((r.source, r.op, r.tp, r.m, r.n, r.k, r.protocol), []).append(r)
    out: dict = {}
    for (sid, *_), rs in cells.items():
        if len(rs) == 2:
            out.setdefault(sid, []).append((rs[0], rs[1]))
    return out


def replicate_noise(rows: list[KernelRow]) -> dict:
    """The noise of the cells a source times twice (the FlashInfer matrix's bf16 and fp16 rows of
    one shape: the same tensor-core rate and bytes): per source, rms over the pairs of ln(a/b)/√2 of
    each arm's time and of the speedup, and how many pairs outside ±5 % of 1 disagree on the
    verdict. The floor under a fit's residuals (dimensionless)."""
    out: dict = {}
    for sid, pairs in replicate_cells(rows).items():
        for a, b in pairs:
            sa, sb = a.baseline_s / a.fused_s, b.baseline_s / b.fused_s
            e = out.setdefault(
                sid, {"baseline": [], "fused": [], "speedup": [], "decided": 0, "flips": 0}
            )
            e["baseline"].append(math.log(a.baseline_s / b.baseline_s))
            e["fused"].append(math.log(a.fused_s / b.fused_s))
            e["speedup"].append(math.log(sa / sb))
            if abs(sa - 1.0) > 0.05 and abs(sb - 1.0) > 0.05:
                e["decided"] += 1
                e["flips"] += (sa > 1.0) != (sb > 1.0)
    rms = lambda v: round(float(np.sqrt(np.mean(np.square(v)) / 2.0)), 4)  # noqa: E731
    return {
        sid: {
            "pairs": len(e["speedup"]),
            "baseline_rms_log": rms(e["baseline"]),
            "fused_rms_log": rms(e["fused"]),
            "speedup_rms_log": rms(e["speedup"]),
            "verdict_flips": f"{e['flips']}/{e['decided']}",
        }
        for sid, e in out.items()
    }


def code_path_noise(
    rows: list[KernelRow], pred: list[tuple[float, float]], min_rows: int = 4
) -> dict:
    """Per source, the scatter about the model of its rows that run one code path of the kernel (one
    grid: op, world size, n, k, baseline protocol and ⌈m/BM⌉ M-tiles, BM vLLM's 128), over groups of
    ≥ `min_rows`: e = ln(s_measured/s_predicted), σ = √(Σ_g Σ (e − ē_g)² / (n − G)) (dimensionless;
    a source under 2 degrees of freedom is left out). The model tells such rows apart by their bytes
    alone, so σ is the source's run noise plus what the model misses within a path: an upper bound
    on the noise. Per decided row (outside ±5 % of 1), z = ln s_measured / σ and whether the model's
    verdict is right; |z| ≥ 1.645 (one-sided 5 %) is a verdict the source itself settles."""
    from costmodel.vllm_tables import KERNEL_TILE_M

    out: dict = {}
    for sid in dict.fromkeys(r.source for r in rows):
        mine = [(r, seq / fused) for r, (seq, fused) in zip(rows, pred) if r.source == sid]
        groups: dict = {}
        for r, s_pred in mine:
            key = (r.op, r.tp, r.n, r.k, r.protocol, -(-r.m // KERNEL_TILE_M))
            groups.setdefault(key, []).append(math.log(r.baseline_s / r.fused_s / s_pred))
        big = [np.array(e) for e in groups.values() if len(e) >= min_rows]
        n = sum(len(e) for e in big)
        if n - len(big) < 2:
            continue
        sigma = math.sqrt(sum(float(np.sum((e - e.mean()) ** 2)) for e in big) / (n - len(big)))
        decided = [
            {
                "line": r.line,
                "m": r.m,
                "z": round(math.log(r.baseline_s / r.fused_s) / sigma, 2),
                "right": (s_pred > 1.0) == (r.baseline_s > r.fused_s),
            }
            for r, s_pred in mine
            if abs(r.baseline_s / r.fused_s - 1.0) > 0.05
        ]
        settled = [d for d in decided if abs(d["z"]) >= 1.645]
        out[sid] = {
            "rows": n,
            "paths": len(big),
            "sigma_log": round(sigma, 4),
            "decided": decided,
            "settled": f"{sum(d['right'] for d in settled)}/{len(settled)}",
        }
    return out


def run(path: Path = FUSED_CSV) -> dict:
    """The fit, its in-sample and leave-one-source-out scores, and PR 52079 under both TP readings
    (JSON-ready)."""
    rows = read_rows(path)
    fit = _fit(rows)
    pred = fit["problem"].predict(fit["values"])
    in_sample = {
        sid: score(
            [r for r in rows if r.source == sid], [p for r, p in zip(rows, pred) if r.source == sid]
        )
        for sid in SOURCES
    }
    loso = {sid: leave_one_out(rows, sid) for sid in SOURCES}
    readings = {}
    for tp in (4, 8):
        alt = [r for r in read_rows(path, pr52079_tp=tp) if r.source in (VLLM_RS, VLLM_AR)]
        f = _fit(alt)
        p = [q for r, q in zip(alt, f["problem"].predict(f["values"])) if r.source == VLLM_RS]
        s = score([r for r in alt if r.source == VLLM_RS], p)
        readings[f"tp{tp}"] = {
            "rms_log": round(f["rms_log"], 4),
            "median_abs_speedup_error": s["median_abs_speedup_error"],
            "link_efficiency": round(f["values"]["hw:link_efficiency"], 4),
        }
    if abs(readings["tp4"]["rms_log"] - readings["tp8"]["rms_log"]) < 1e-3:
        preferred = (
            "tp8: the fit cannot tell (the ld_reduce egress is m·n·b at any W and each forced "
            "protocol's "
            "busBW and latency are the source's own terms); Kimi-K3's call sites give K 768 only "
            "at TP 8 (6144/8)"
        )
    else:
        preferred = min(readings, key=lambda k: readings[k]["rms_log"])
    vals = {k: float(f"{v:.4g}") for k, v in fit["values"].items()}
    design = {
        f"{kern}:{k}": v
        for kern, kv in DESIGN.items()
        for k, v in kv.items()
        if f"{kern}:{k}" not in vals
    }
    return {
        "command": COMMAND,
        "data": "data/reference/fused_ops.csv",
        "sources": list(SOURCES),
        "profiles": PROFILE_OF,
        "values": {**vals, **design},
        "sigma_rel": {k: (None if v is None else round(v, 4)) for k, v in fit["sigma_rel"].items()},
        "unidentified": fit["unidentified"],
        "design": sorted(design),
        "rms_log": round(fit["rms_log"], 4),
        "n_rows": len(rows),
        # what the rows pin: each hardware term's free partners it trades against (the fit's
        # correlation)
        "correlation": fit["correlation"],
        "in_sample": in_sample,
        "leave_one_source_out": loso,
        "leave_one_world_size_out": {
            sid: leave_one_world_size_out(rows, sid, pred)
            for sid in SOURCES
            if len({r.tp for r in rows if r.source == sid}) > 1
        },
        "replicate_noise": replicate_noise(rows),
        "code_path_noise": code_path_noise(rows, pred),
        "pr52079_tp_readings": {**readings, "preferred": preferred},
    }


def rows_from_records(records: list[dict]) -> list[KernelRow]:
    """A calibration run's timings of vLLM's gemm_rs_ar (kind "fused_kernel": op, m, n, k per rank,
    world, the kernel's fused_s and its unfused arm's baseline_s, the GEMM plus vLLM's dispatched
    collective) as KernelRows."""
    return [
        KernelRow(
            CALIBRATION,
            i,
            r["op"],
            int(r["world"]),
            int(r["m"]),
            int(r["n"]),
            int(r["k"]),
            f"{r['op']}:{r.get('unfused_impl', 'vllm')}",
            float(r["baseline_s"]),
            float(r["fused_s"]),
        )
        for i, r in enumerate(records)
        if r.get("kind") == "fused_kernel"
    ]


def fit_records(prior: HardwareProfile, records: list[dict]) -> tuple[dict, dict]:
    """The [fused_kernel] terms a calibration run's kernel timings identify, in the prior profile:
    ({key: {value, uncertainty_rel}} of the identified ones, residuals). The unfused collective's
    busBW per op is the run's own term; vLLM's design terms stay (DESIGN); a term the rows do not
    identify keeps the prior's value."""
    rows = rows_from_records(records)
    if len(rows) < 3:
        return {}, {}
    keys = [*(f"hw:{k}" for k in HARDWARE_PRIOR), *(f"vllm:{k}" for k in KERNEL_TERMS["vllm"])]
    # both arms timed by tpcost the same way (calib/timing.py): no harness floor to fit, the offset
    # is 0
    fit = _fit(rows, fixed={_offset_key(CALIBRATION): 0.0}, profiles={CALIBRATION: prior})
    # None: unidentified, prior kept
    out = {
        f"fused_kernel.{k.split(':', 1)[1]}": {"value": fit["values"][k], "uncertainty_rel": sg}
        for k, sg in fit["sigma_rel"].items()
        if k in keys and sg is not None
    }
    return out, {"rows": len(rows), "rms_log": fit["rms_log"], "unidentified": fit["unidentified"]}


def main(argv: list[str] | None = None) -> int:
    res = run_and_write(argv, __doc__, OUT, run)
    for sid in SOURCES:
        a, b = res["in_sample"][sid], res["leave_one_source_out"][sid]
        print(
            f"{sid:32s} {a['rows']:3d} rows  in-sample {a['median_abs_speedup_error']:.3f} "
            f"({a['verdicts_outside_5pct']})"
            f"  leave-one-out {b['median_abs_speedup_error']:.3f} ({b['verdicts_outside_5pct']})"
        )
    for sid, per in res["leave_one_world_size_out"].items():
        for tp, e in per.items():
            a, b = e["in_sample"], e["held_out"]
            print(
                f"{sid:32s} {tp}: in-sample {a['median_abs_speedup_error']:.3f} "
                f"({a['verdicts_outside_5pct']})  "
                f"fitted without {tp} {b['median_abs_speedup_error']:.3f} "
                f"({b['verdicts_outside_5pct']})"
            )
    for sid, e in res["replicate_noise"].items():
        print(
            f"{sid:32s} replicate noise over {e['pairs']} pairs: rms log baseline "
            f"{e['baseline_rms_log']:.3f}, "
            f"fused {e['fused_rms_log']:.3f}, speedup {e['speedup_rms_log']:.3f}; verdict flips "
            f"{e['verdict_flips']}"
        )
    for sid, e in res["code_path_noise"].items():
        print(
            f"{sid:32s} code-path noise over {e['rows']} rows on {e['paths']} path(s): σ "
            f"{e['sigma_log']:.3f}; "
            f"verdicts settled at 1.645σ {e['settled']}; z of each decided row: "
            + ", ".join(f"M {d['m']} {d['z']:+.2f}" for d in e["decided"])
        )
    print("PR 52079 readings:", res["pr52079_tp_readings"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
