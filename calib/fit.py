"""Fit profile parameters to microbenchmark records with scipy least_squares (soft-L1 loss on log
time).

Each fitted parameter gets a relative 1-sigma from the Jacobian (cov = s²·(JᵀJ)⁻¹); each fit reports
its residuals. Parameters the records cannot constrain are not returned (the prior stands)."""

from __future__ import annotations

import numpy as np
from scipy.optimize import least_squares

from costmodel import formulas as F
from costmodel.ops import dtype_mode


def fit_least_squares(resid, x0, lo=-np.inf, hi=np.inf, **kw):
    """The one least-squares core of calib and tools: soft-L1 (f_scale 0.1) on the residuals,
    bounded, with σ of each parameter from the Jacobian, sqrt(diag(s²·pinv(JᵀJ))), s² the residual
    variance; a parameter the residuals do not move (a flat column) gets σ = inf. Parameters fitted
    as logs make σ relative. Returns (scipy result, σ array)."""
    # a caller may ask for plain least squares (loss="linear")
    kw = {
        "loss": "soft_l1",
        "f_scale": 0.1,
        **kw,
    }
    r = least_squares(resid, x0, bounds=(lo, hi), **kw)
    dof = max(1, r.fun.size - len(x0))
    s2 = float(np.sum(r.fun**2)) / dof
    jtj = r.jac.T @ r.jac
    try:
        sig = np.sqrt(np.clip(np.diag(s2 * np.linalg.pinv(jtj)), 0, None))
    except np.linalg.LinAlgError:
        sig = np.full(len(x0), np.inf)
    flat = np.diag(jtj) <= 1e-12 * max(float(np.max(np.diag(jtj))), 1e-300)
    return r, np.where(flat, np.inf, sig)


def correlation(res) -> np.ndarray:
    """The parameters' correlation matrix at a least-squares solution (scipy result): cov ∝
    pinv(JᵀJ), scaled to unit diagonal; a flat column's row and column are 0 (its own entry 1)."""
    cov = np.linalg.pinv(res.jac.T @ res.jac)
    sd = np.sqrt(np.clip(np.diag(cov), 0, None))
    ok = sd > 0
    out = np.eye(len(sd))
    out[np.ix_(ok, ok)] = cov[np.ix_(ok, ok)] / np.outer(sd[ok], sd[ok])
    return np.clip(out, -1.0, 1.0)


# a term whose fitted relative sigma exceeds this is not identified by the data
IDENTIFIED_SIGMA_REL = 1.0


def worst_unidentified(sigma_by_term: dict):
    """The term the data identify least (largest sigma_rel above IDENTIFIED_SIGMA_REL, NaN as inf,
    the first among equals), or None: the one rule of every fit in calib for a term the data cannot
    pin down (fix it at its prior, refit the rest, ask again)."""
    bad = {
        t: (sg if sg == sg else np.inf)
        for t, sg in sigma_by_term.items()
        if not sg <= IDENTIFIED_SIGMA_REL
    }
    return max(bad, key=lambda t: bad[t]) if bad else None


def fit_free_terms(make_problem, fixed: dict, residuals=None, **kw):
    """calib's one rule over a problem of named terms fitted as logs: least squares over the free
    terms, bounded and started at their priors; the worst unidentified one (worst_unidentified)
    fixed at its prior and the rest refitted until every free term is identified.
    `make_problem(fixed)` builds an object with `terms` {name: (prior, lo, hi)}, `free` (names) and
    `residuals(x)` (or pass `residuals(problem, x)`); `kw` goes to fit_least_squares. Returns (the
    last problem, its scipy result or None where no term is left free, {free term: σ_rel}, the fixed
    terms, the unidentified ones in the order they were fixed)."""
    fixed, unidentified = dict(fixed), []
    resid = residuals or (lambda prob, x: prob.residuals(x))
    while True:
        prob = make_problem(fixed)
        if not prob.free:
            return prob, None, {}, fixed, unidentified
        lo = np.log([prob.terms[k][1] for k in prob.free])
        hi = np.log([prob.terms[k][2] for k in prob.free])
        x0 = np.clip(np.log([prob.terms[k][0] for k in prob.free]), lo + 1e-6, hi - 1e-6)
        res, s = fit_least_squares(lambda x, p=prob: resid(p, x), x0, lo, hi, **kw)
        sig = dict(zip(prob.free, map(float, s)))
        worst = worst_unidentified(sig)
        if worst is None:
            return prob, res, sig, fixed, unidentified
        fixed[worst] = prob.terms[worst][0]
        unidentified.append(worst)


def fit_log_space(resid, x0, lo, hi, names):
    """Fit positive parameters in log space (so that scales do not matter); σ_rel = σ of log(param).
    A parameter the data do not identify (worst_unidentified) is fixed at its prior x0 and the rest
    refitted; one the data drive onto its bound stays there (listed under "at_bound", not returned
    as fitted). Returns ({name: value, uncertainty_rel} of the identified ones, residuals with every
    final value under "values")."""
    floor = 1e-15
    lo_l = np.log(np.maximum(lo, floor))
    hi_l = np.log(np.maximum(hi, floor * 10))
    x0_l = np.clip(np.log(np.maximum(x0, floor)), lo_l + 1e-9, hi_l - 1e-9)
    free = list(range(len(names)))
    while True:

        def sub(z, free=free):
            x = x0_l.copy()
            x[free] = z
            return resid(np.exp(x))

        # a parameter the residuals do not respond to (e.g. a memory term under compute-bound
        # points) gets σ = inf
        r, sd = fit_least_squares(sub, x0_l[free], lo_l[free], hi_l[free])
        # a term the data drive onto its bound (a latency below resolution) is put there by the
        # data: kept, not a prior
        at_bound = {i for i, act in zip(free, r.active_mask) if act}
        worst = worst_unidentified({i: float(e) for i, e in zip(free, sd) if i not in at_bound})
        if worst is None:
            break
        free.remove(worst)
        if not free:
            r, sd, at_bound = None, np.zeros(0), set()
            break
    x = x0_l.copy()
    if r is not None:
        x[free] = r.x
    fun = resid(np.exp(x))
    out = {
        names[i]: {"value": float(np.exp(x[i])), "uncertainty_rel": float(e)}
        for i, e in zip(free, sd)
        if i not in at_bound
    }
    res = {
        "rms_log_residual": float(np.sqrt(np.mean(fun**2))),
        "max_abs_log_residual": float(np.max(np.abs(fun))),
        "points": int(fun.size),
        "unconstrained_kept_prior": [n for i, n in enumerate(names) if i not in free],
        "at_bound": [names[i] for i in sorted(at_bound)],
        "values": {n: float(v) for n, v in zip(names, np.exp(x))},
    }
    return out, res


def gemm_time_s(m, n, k, x, prior, dtype, sm_count=None):
    """The profile's GEMM roofline (formulas.t_gemm_s) at x = (max_efficiency, mem_efficiency,
    launch_overhead_s), on `sm_count` SMs (None: the GPU's; fewer SMs keep each SM's peak and the
    HBM bandwidth) (s)."""
    mode = dtype_mode(dtype)
    b = mode.gemm_in_bytes
    eff, mem_eff, launch = x
    sms = prior["identity.sm_count"]
    peak = prior[f"compute.peak_flops_per_s.{dtype}"] * (
        1.0 if sm_count is None else sm_count / sms
    )
    return F.t_gemm_s(
        m,
        n,
        k,
        peak_flops_per_s=peak,
        max_efficiency=eff,
        mem_efficiency=mem_eff,
        hbm_bw_bytes_per_s=prior["memory.hbm_bw_bytes_per_s"],
        tile_m=prior["gemm.tile_m"],
        tile_n=prior["gemm.tile_n"],
        sm_count=sms if sm_count is None else sm_count,
        launch_overhead_s=launch,
        in_bytes=b,
        w_bytes=b,
        out_bytes=mode.act_bytes,
    )


def _mnkt(rs):
    return (
        *(np.array([r[x] for r in rs], float) for x in ("m", "n", "k")),
        np.array([r["median_s"] for r in rs]),
    )


def fit_gemm(records, prior, dtype):
    """gemm.max_efficiency, gemm.mem_efficiency, gemm.launch_overhead_s from the GEMM sweep of one
    dtype."""
    rs = [r for r in records if r["kind"] == "gemm" and r["dtype"] == dtype]
    if len(rs) < 4:
        return {}, {}
    m, n, k, t = _mnkt(rs)
    return fit_log_space(
        lambda x: np.log(gemm_time_s(m, n, k, x, prior, dtype) / t),
        [0.7, 0.8, 3e-6],
        [0.05, 0.05, 0.0],
        [1.0, 1.0, 1e-3],
        ["gemm.max_efficiency", "gemm.mem_efficiency", "gemm.launch_overhead_s"],
    )


def _fitted_gemm_terms(residuals):
    v = (residuals or {}).get("values", {})
    names = ("gemm.max_efficiency", "gemm.mem_efficiency", "gemm.launch_overhead_s")
    return tuple(v[x] for x in names) if all(x in v for x in names) else None


def log_error_summary(log_err):
    """rows, median signed and absolute ln(pred/meas), and the largest |ln(pred/meas)|."""
    a = np.abs(log_err)
    return {
        "rows": int(log_err.size),
        "median_log_error": float(np.median(log_err)),
        "median_abs_log_error": float(np.median(a)),
        "max_abs_log_error": float(np.max(a)),
    }


def check_gemm_holdout(records, prior, dtype, gemm_residuals):
    """The fitted roofline (fit_gemm's terms) against GEMMs it was not fitted on ("gemm_holdout"
    records: other shapes, small M): ln(pred/meas) per row and their median / |median| / max, by M
    band (M ≤ 256: one wave of few CTAs; above). Out of sample by construction. {} where either is
    missing."""
    x = _fitted_gemm_terms(gemm_residuals)
    rs = [r for r in records if r["kind"] == "gemm_holdout" and r["dtype"] == dtype]
    if x is None or not rs:
        return {}
    m, n, k, t = _mnkt(rs)
    err = np.log(gemm_time_s(m, n, k, x, prior, dtype) / t)
    rows = [
        {
            "name": r["name"],
            "m": r["m"],
            "n": r["n"],
            "k": r["k"],
            "measured_s": r["median_s"],
            "log_error": float(e),
        }
        for r, e in zip(rs, err, strict=True)
    ]
    out = {"all": log_error_summary(err), "rows": rows}
    for band, sel in (("m_le_256", m <= 256), ("m_gt_256", m > 256)):
        if sel.any():
            out[band] = log_error_summary(err[sel])
    return out


def check_sm_budget(records, prior, gemm_residuals):
    """The GEMM on fewer SMs ("gemm_sm_budget" records, bf16): the measured slowdown t(s)/t(0)
    against the roofline's on sm_count − s SMs (gemm_time_s), per cuBLAS library; a library whose
    carveout never moves the time (every ratio within 3 %) is reported as not honouring it. Out of
    sample. {} where either is missing."""
    x = _fitted_gemm_terms(gemm_residuals)
    rs = [r for r in records if r["kind"] == "gemm_sm_budget"]
    if x is None or not rs:
        return {}
    base = {(r["blas"], r["name"], r["m"]): r["median_s"] for r in rs if r["sm_carveout"] == 0}
    out = {}
    for lib in sorted({r["blas"] for r in rs}):
        rows = []
        for r in rs:
            t0 = base.get((lib, r["name"], r["m"]))
            if r["blas"] != lib or not r["sm_carveout"] or t0 is None:
                continue
            full, part = (
                float(gemm_time_s(r["m"], r["n"], r["k"], x, prior, "bf16", sm))
                for sm in (r["sm_count"], r["sm_count"] - r["sm_carveout"])
            )
            rows.append(
                {
                    "name": r["name"],
                    "m": r["m"],
                    "sm_carveout": r["sm_carveout"],
                    "measured_slowdown": r["median_s"] / t0,
                    "model_slowdown": part / full,
                }
            )
        meas = np.array([q["measured_slowdown"] for q in rows])
        err = np.log(np.array([q["model_slowdown"] for q in rows]) / meas) if rows else np.zeros(0)
        out[lib] = {
            "honoured": bool(rows) and bool(np.any(np.abs(meas - 1.0) > 0.03)),
            "rows": rows,
            **({"slowdown": log_error_summary(err)} if rows else {}),
        }
    return out


def fit_memory(records, prior):
    """kernels.mem_efficiency and kernels.launch_overhead_s from the device-to-device copy, one
    streaming kernel. The RMSNorm and partial-sum records are kept, not fitted: torch's eager
    rms_norm is not one fused kernel (a 16 us floor at 1 row against 4 us for the copy on an H200)
    and its W-way sum(0) is a reduction kernel of its own (W = 2 at half the bandwidth of W = 8), so
    neither is the one-pass kernel that kernels.* prices."""
    rs = [r for r in records if r["kind"] == "copy"]
    if len(rs) < 3:
        return {}, {}
    nb = np.array([r["bytes_moved"] for r in rs], float)
    t = np.array([r["median_s"] for r in rs])
    hbm = prior["memory.hbm_bw_bytes_per_s"]
    return fit_log_space(
        lambda x: np.log(F.t_memory_bound_s(nb, hbm, x[0], x[1]) / t),
        [0.7, 3e-6],
        [0.01, 0.0],
        [1.0, 1e-3],
        ["kernels.mem_efficiency", "kernels.launch_overhead_s"],
    )


def fit_concurrency(records, prior=None):
    """asynctp.stream_concurrency κ: two-stream chunk time g_c = max(t_mem, (1−κ)·g + κ·g₂/2)
    (F.t_chunk_concurrent_s with the measured chunk GEMM g and the GEMM of two chunks' rows g₂ as
    the compute parts; t_mem = the chunk's bytes at the prior's HBM bandwidth, the floor two
    memory-bound streams cannot go below)."""
    gem = {(r["name"], r["m"], r["dtype"]): r["median_s"] for r in records if r["kind"] == "gemm"}
    ch = {}
    for r in records:
        if r["kind"] == "chunked_gemm":
            ch.setdefault((r["name"], r["m"], r["world"], r["dtype"]), {})[r["variant"]] = r[
                "median_s"
            ]
    shapes = {
        (r["name"], r["m"], r["dtype"]): (r["n"], r["k"]) for r in records if r["kind"] == "gemm"
    }
    g, gc, g2, tm = [], [], [], []
    for (name, m, w, dt), v in ch.items():
        pair = gem.get((name, 2 * m // w, dt))
        if "one_stream" in v and "two_streams" in v and pair is not None:
            g.append(v["one_stream"] / w)
            gc.append(v["two_streams"] / w)
            g2.append(pair)
            n, k = shapes.get((name, 2 * m // w, dt), (0, 0))
            b = dtype_mode(dt).gemm_in_bytes
            bw = (prior or {}).get("memory.hbm_bw_bytes_per_s", float("inf")) * (prior or {}).get(
                "gemm.mem_efficiency", 1.0
            )
            tm.append(F.gemm_bytes(m / w, n, k, b, b, b) / bw)
    if len(g) < 2:
        return {}, {}
    g, gc, g2, tm = map(np.array, (g, gc, g2, tm))
    return fit_log_space(
        lambda x: np.log(F.t_chunk_concurrent_s(tm, g, g2, 0.0, x[0]) / gc),
        [0.3],
        [0.0],
        [1.0],
        ["asynctp.stream_concurrency"],
    )


def fit_interference(records):
    """asynctp.compute_slowdown σ = median(t_gemm_with_copy / t_gemm_alone) − 1 over the
    interference runs in which the GEMM overlapped the copy: a run whose GEMM ends no earlier than
    the copy alone would (median ≥ t_copy_alone) ran after it, serialised, and measures no
    contention; it is listed, not fitted."""
    rs = [r for r in records if r["kind"] == "interference"]
    ok = [r for r in rs if r["median_s"] < r.get("t_copy_alone_s", np.inf)]
    serial = [r["name"] for r in rs if r not in ok]
    if not ok:
        return {}, ({"points": 0, "serialised": serial} if rs else {})
    ratio = np.array([r["median_s"] / r["t_gemm_alone_s"] for r in ok])
    sig = max(0.0, float(np.median(ratio) - 1.0))
    spread = float(np.std(ratio) / np.sqrt(len(ratio))) if len(ratio) > 1 else 0.5 * sig
    return (
        {
            "asynctp.compute_slowdown": {
                "value": sig,
                "uncertainty_rel": spread / sig if sig else 1.0,
            }
        },
        {"points": len(ok), "ratios": ratio.round(4).tolist(), "serialised": serial},
    )


def fit_alpha_beta(msg_bytes, t_s, factor, names=("latency_s", "bus_bw_bytes_per_s")):
    """The one α–β fit of calib: t = α + factor·S/busBW (s; factor the bus factor of
    formulas.bus_bw_factor, S bytes), soft-L1 on log time with α and busBW in log space
    (fit_log_space). Returns ({name: fit}, residuals)."""
    S, t = np.asarray(msg_bytes, float), np.asarray(t_s, float)
    x0 = [max(float(t.min()) * 0.7, 1e-7), float(np.median(factor * S / t))]
    # latency floor 1 ns, far below any collective: data that put α below resolution drive it onto
    # that bound
    return fit_log_space(
        lambda x: np.log((x[0] + factor * S / x[1]) / t), x0, [1e-9, 1e3], [1.0, 1e14], list(names)
    )


def fit_ring_regimes(msg_bytes, t_s, world):
    """NCCL's ring all-gather / reduce-scatter on `world` ranks as its tuner runs it, two regimes
    (formulas.t_ring_regimes_s): LL (latency α_LL, busBW F.LL_PAYLOAD_FRACTION·β: half of every
    store is the flag) at small messages and Simple (α_S, β) at large ones; α_LL, α_S and β fitted
    by fit_log_space on log time (soft-L1). Returns ({"small": {latency_s, bus_bw_bytes_per_s},
    "large": {...}}, residuals)."""
    S, t = np.asarray(msg_bytes, float), np.asarray(t_s, float)

    def model(x):
        a_ll, a_s, bw = x
        return F.t_ring_regimes_s(S, [a_ll, a_s], [F.LL_PAYLOAD_FRACTION * bw, bw], world)

    factor = float(F.bus_bw_factor("all_gather", world))
    x0 = [
        max(float(t.min()) * 0.7, 1e-7),
        3.0 * max(float(t.min()), 1e-7),
        float(np.max(factor * S / t)),
    ]
    _, res = fit_log_space(
        lambda x: np.log(model(x) / t),
        x0,
        [1e-9, 1e-9, 1e3],
        [1.0, 1.0, 1e14],
        ["small.latency_s", "large.latency_s", "bus_bw_bytes_per_s"],
    )
    v = res["values"]
    bw = v["bus_bw_bytes_per_s"]
    return (
        {
            "small": {
                "latency_s": v["small.latency_s"],
                "bus_bw_bytes_per_s": F.LL_PAYLOAD_FRACTION * bw,
            },
            "large": {"latency_s": v["large.latency_s"], "bus_bw_bytes_per_s": bw},
        },
        res,
    )


def fit_latency_bandwidth(rs, factor, names=("latency_s", "bus_bw_bytes_per_s")):
    """fit_alpha_beta over records with msg_bytes and median_s; ({name: fit}, residuals), {} if < 3
    points."""
    if len(rs) < 3:
        return {}, {}
    return fit_alpha_beta([r["msg_bytes"] for r in rs], [r["median_s"] for r in rs], factor, names)


def fit_collective(records, impl, world):
    """(latency_s, bus_bw_bytes_per_s) of one collective at one world size (nccl-tests busBW
    convention)."""
    rs = [
        r
        for r in records
        if r["kind"] == "collective" and r["impl"] == impl and r["world"] == world
    ]
    if not rs:
        return fit_latency_bandwidth(rs, 1.0)  # nothing measured: the factor does not matter
    return fit_latency_bandwidth(rs, float(F.bus_bw_factor(rs[0].get("op", impl), world)))


def fit_host_issue(records):
    """asynctp.host_op_s: the median host issue time per torch call (bench_host_issue), with its
    p10-p90 spread as the relative sigma; the graph replay's host time is reported beside it
    (residuals)."""
    rs = [r for r in records if r.get("kind") == "host_issue"]
    if not rs:
        return {}, {}
    r = rs[0]
    v = float(r["median_s"])
    rel = min(1.0, max(1e-3, (float(r["p90_s"]) - float(r["p10_s"])) / (2.0 * v))) if v > 0 else 1.0
    extra = {"graph_replay_host_s": r.get("graph_replay_median_s"), "calls": r["calls"]}
    return {"asynctp.host_op_s": {"value": v, "uncertainty_rel": rel}}, extra


def fit_single_device(records, prior, gemm_dtype):
    """All single-device fits; returns (params, residuals)."""
    params, residuals = {}, {}
    for name, (p, r) in (
        ("gemm", fit_gemm(records, prior, gemm_dtype)),
        ("memory", fit_memory(records, prior)),
        ("concurrency", fit_concurrency(records, prior)),
        ("interference", fit_interference(records)),
        ("host_issue", fit_host_issue(records)),
    ):
        params.update(p)
        if r:
            residuals[name] = r
    return params, residuals
