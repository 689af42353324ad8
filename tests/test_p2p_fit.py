"""calib/p2p_fit.py: Hopper's put/ring kernels without multimem (issue 49 item 2), fitted on their
released rows."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calib import p2p_fit as P


def test_the_rows_are_read_as_their_sources_say():
    """TRITONDIST's mM_nN_kK: M global, N (AG+GEMM) or K (GEMM+RS) the full weight dimension sharded
    by 8; PR 166's K the full K; JAX's 1024-row shards at N = K = 4096."""
    rows = P.read_rows()
    assert {r.kernel for r in rows} == {"triton-distributed", "flux", "tdist-pr166", "jax-ring"}
    ag = next(r for r in rows if r.kernel == "flux" and r.op == "ag_gemm")
    assert (ag.gpu, ag.tp, ag.m, ag.n, ag.k, ag.speedup) == (
        "h800",
        8,
        8192,
        11008 // 8,
        4096,
        1.16,
    )
    rs = next(r for r in rows if r.kernel == "triton-distributed" and r.op == "gemm_rs")
    assert (rs.m, rs.n, rs.k, rs.speedup) == (8192, 4096, 11008 // 8, 1.05)
    pr = [r for r in rows if r.kernel == "tdist-pr166"]
    assert [(r.tp, r.k) for r in pr[:3]] == [(2, 4096), (4, 2048), (8, 1024)]
    assert pr[0].speedup == pytest.approx(0.275 / 0.259)
    assert [(r.tp, r.m) for r in rows if r.kernel == "jax-ring"] == [
        (2, 2048),
        (4, 4096),
        (8, 8192),
    ]


def test_the_kernel_time_is_bounded_by_its_parts():
    """t never below max(g', L) (the overlap bound) and never above c + g' + L (serial), at any
    exposure."""
    rows = P.read_rows()
    hw = {"link_efficiency": 0.8, "step_latency_s": 3e-6}
    for r in rows:
        g = float(P._hw(r.gpu).t_gemm(float(r.m), r.n, r.k)) * 1.1  # g' at φ 0.1
        for alpha in (0.0, 0.5, 1.0):
            kern = {"fixed_s": 1e-5, "compute_overhead": 0.1, "exposed_fraction": alpha}
            t = P.fused_s(r, hw, kern)
            overlapped = P.fused_s(r, hw, {**kern, "fixed_s": 0.0, "exposed_fraction": 0.0})  # P
            serial = P.fused_s(r, hw, {**kern, "fixed_s": 0.0, "exposed_fraction": 1.0})  # g' + L
            assert overlapped >= g * (1 - 1e-12) and serial >= overlapped
            assert 1e-5 + overlapped * (1 - 1e-12) <= t <= (1e-5 + serial) * (1 + 1e-12)
            # the overlap bound: never faster than (g' + L) / max(g', L) over the serial sum
            assert serial / overlapped <= serial / max(g, serial - g) * (1 + 1e-12)


def test_the_committed_fit_is_current():
    """python -m calib.p2p_fit reproduces calib/data/p2p_fit.json: the shared NVLink4 efficiency,
    each kernel's scores in-sample and left out."""
    committed = json.loads(P.OUT.read_text())
    fresh = json.loads(json.dumps(P.run()))
    assert fresh["values"] == pytest.approx(committed["values"], rel=1e-3)
    assert 0.6 < fresh["values"]["hw:link_efficiency"] <= 1.0
    for part in ("in_sample", "leave_one_kernel_out", "hardware_held_out"):
        for k, e in committed[part].items():
            assert fresh[part][k]["median_abs_speedup_error"] == pytest.approx(
                e["median_abs_speedup_error"], abs=1e-4
            )
            assert fresh[part][k]["median_signed_log_error"] == pytest.approx(
                e["median_signed_log_error"], abs=1e-4
            )


def test_a_left_out_kernel_is_predicted_from_the_others_spread():
    """Left out, a kernel's own terms come from the other kernels' fitted terms of its op (the
    spread, never its own rows), and its nominal is the median of those draws: refitting with its
    rows changed leaves it where it was."""
    rows = P.read_rows()
    a = P.leave_one_kernel_out(rows, "flux", draws=50)
    moved = [
        P.P2pRow(r.source, r.line, r.kernel, r.op, r.gpu, r.tp, r.m, r.n, r.k, r.speedup * 2)
        if r.kernel == "flux"
        else r
        for r in rows
    ]
    b = P.leave_one_kernel_out(moved, "flux", draws=50)
    pa = np.array([p["speedup_predicted"] for p in a["per_row"]])
    pb = np.array([p["speedup_predicted"] for p in b["per_row"]])
    assert np.array_equal(pa, pb) and a["trained_on"] == [
        "jax-ring",
        "tdist-pr166",
        "triton-distributed",
    ]
    lo, hi = a["spread"]["gemm_rs:fixed_s"]
    assert lo < hi


def test_held_out_hardware_comes_from_the_other_kernels_alone():
    """With the hardware held out, η and λ are the other kernels' fit, whatever the kernel's own
    rows say (its rows doubled leave them unchanged), and the kernel's own terms are fitted on its
    rows (doubled rows move its prediction up)."""
    rows = P.read_rows()
    a = P.hardware_held_out(rows, "flux")
    moved = [
        P.P2pRow(r.source, r.line, r.kernel, r.op, r.gpu, r.tp, r.m, r.n, r.k, r.speedup * 2)
        if r.kernel == "flux"
        else r
        for r in rows
    ]
    b = P.hardware_held_out(moved, "flux")
    others = P.fit([r for r in rows if r.kernel != "flux"])["values"]
    assert (
        a["hardware"]
        == b["hardware"]
        == {k: float(f"{others[k]:.4g}") for k in ("hw:link_efficiency", "hw:step_latency_s")}
    )
    pa = np.array([p["speedup_predicted"] for p in a["per_row"]])
    pb = np.array([p["speedup_predicted"] for p in b["per_row"]])
    assert np.median(pb) > np.median(pa) + 0.1 and a["hardware_from"] == [
        "jax-ring",
        "tdist-pr166",
        "triton-distributed",
    ]


def test_the_released_baselines_are_set_beside_the_profiles():
    """Where a source times its baseline (PR 166 in ms, JAX in us), the score sets it beside the
    profile's GEMM then NCCL; ratio rows (TRITONDIST) have none."""
    rows = P.read_rows()
    jax = [r for r in rows if r.kernel == "jax-ring"]
    assert [r.baseline_s for r in jax] == pytest.approx([147e-6, 290e-6, 565e-6])
    s = P.score(jax, [1.0] * 3)
    assert s["baseline_over_profile"] == [round(r.baseline_s / P.baseline_s(r), 3) for r in jax]
    assert (
        P.score([r for r in rows if r.kernel == "flux"], [1.0] * 12)["baseline_over_profile"]
        is None
    )
