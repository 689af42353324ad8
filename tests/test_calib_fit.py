"""calib.fit: the one α–β fit and the one rule for a term the data cannot identify, against
hand-worked truths."""

import numpy as np
import pytest

from calib import fit
from costmodel.formulas import MiB


def test_alpha_beta_recovers_a_noise_free_line():
    """Points on t = α + f·S/busBW exactly: the fit returns α and busBW (the least-squares optimum
    is the line)."""
    S = np.array([1e3, 1e5, 1e6, 1e7, 1e8])
    a, bw, f = 12e-6, 400e9, 1.75
    got, res = fit.fit_alpha_beta(S, a + f * S / bw, f)
    assert got["latency_s"]["value"] == pytest.approx(a, rel=1e-4)
    assert got["bus_bw_bytes_per_s"]["value"] == pytest.approx(bw, rel=1e-4)
    assert (
        res["rms_log_residual"] < 1e-5
        and not res["unconstrained_kept_prior"]
        and not res["at_bound"]
    )


def test_latency_below_resolution_goes_to_its_floor_not_to_a_prior():
    """Two large messages whose line passes through the origin or below it: the data say α ≈ 0, so α
    ends on its 1 ns floor (not at the start value, 0.7 x the smallest time) and busBW is the
    slope's."""
    S = np.array([32.0, 64.0]) * MiB
    t = np.array([97e-6, 197e-6])  # slope 100 us per 32 MiB, intercept -3 us
    got, res = fit.fit_alpha_beta(S, t, 1.0)
    assert res["at_bound"] == ["latency_s"] and res["values"]["latency_s"] == pytest.approx(
        1e-9, rel=1e-3
    )
    # least squares on log time through the origin: busBW between the two points' own S/t
    assert S[1] / t[1] < got["bus_bw_bytes_per_s"]["value"] < S[0] / t[0]


def test_an_unidentified_term_keeps_its_prior_and_the_rest_is_refitted():
    """A term the residuals do not depend on is fixed at its prior; the identified one is fitted as
    if alone."""
    x = np.linspace(1.0, 5.0, 9)
    y = 3.0 * x

    out, res = fit.fit_log_space(
        lambda p: np.log(p[0] * x / y), [1.0, 7.0], [1e-3, 1e-3], [1e3, 1e3], ["k", "unused"]
    )
    assert set(out) == {"k"} and out["k"]["value"] == pytest.approx(3.0, rel=1e-6)
    assert res["unconstrained_kept_prior"] == ["unused"] and res["values"][
        "unused"
    ] == pytest.approx(7.0)


def test_correlation_of_collinear_and_independent_parameters():
    """calib.fit.correlation: two parameters whose sum the data pin tightly and one of them only
    loosely trade at nearly −1; a parameter with data of its own is independent of them (0); unit
    diagonal."""
    x_pts = np.linspace(0.0, 1.0, 20)

    # a + b on twenty points, a alone on one point at a tenth of the weight, c its own line
    def resid(
        p,
    ):
        return np.concatenate(
            [p[0] + p[1] - 5.0 + 0.0 * x_pts, [0.1 * (p[0] - 2.0)], p[2] * x_pts - x_pts]
        )

    r, _ = fit.fit_least_squares(resid, [1.0, 1.0, 3.0], loss="linear")
    c = fit.correlation(r)
    assert np.allclose(np.diag(c), 1.0)
    assert c[0, 1] < -0.95
    assert c[0, 2] == pytest.approx(0.0, abs=1e-9) and c[1, 2] == pytest.approx(0.0, abs=1e-9)


def test_worst_unidentified_takes_the_largest_sigma_and_counts_nan():
    assert fit.worst_unidentified({"a": 0.5, "b": 3.0, "c": 2.0}) == "b"
    assert fit.worst_unidentified({"a": 0.5, "b": float("nan"), "c": 2.0}) == "b"
    assert fit.worst_unidentified({"a": 0.5, "b": 1.0}) is None


def _h200_samples(sub=""):
    import json
    from pathlib import Path

    d = (
        Path(__file__).resolve().parents[1]
        / "calib"
        / "data"
        / "h200-sxm-gpu-check"
        / (sub or "run2")
    )
    return [
        json.loads(line) for line in (d / "samples.jsonl").read_text().splitlines() if line.strip()
    ]


def test_a_serialised_interference_run_is_not_fitted():
    """The H200 check's first run (calib/data/h200-sxm-gpu-check/run1-serialised: the copy kernel
    launched first held every SM, so each GEMM ended after the copy alone would) yields no
    compute_slowdown; the committed run (the GEMM's stream at the highest priority) overlaps in
    every row and yields a small one. A synthetic serialised row next to an overlapped one is
    listed, not fitted."""
    bad = fit.fit_interference(_h200_samples("run1-serialised"))
    assert bad[0] == {} and bad[1]["points"] == 0 and len(bad[1]["serialised"]) == 8
    good, res = fit.fit_interference(_h200_samples())
    assert res["serialised"] == [] and res["points"] == 8
    assert 0.0 <= good["asynctp.compute_slowdown"]["value"] < 0.25
    rows = [
        {
            "kind": "interference",
            "name": "a",
            "t_gemm_alone_s": 1.0,
            "t_copy_alone_s": 3.0,
            "median_s": 1.2,
        },
        {
            "kind": "interference",
            "name": "b",
            "t_gemm_alone_s": 1.0,
            "t_copy_alone_s": 3.0,
            "median_s": 3.9,
        },
    ]
    got, res = fit.fit_interference(rows)
    assert res["serialised"] == ["b"] and got["asynctp.compute_slowdown"]["value"] == pytest.approx(
        0.2
    )


def test_the_memory_fit_reads_the_copy_alone():
    """kernels.* come from the one streaming kernel: an eager multi-kernel RMSNorm record, however
    slow, moves nothing; on the committed H200 check the copy fits within 6 % everywhere and its
    efficiency is a plausible HBM fraction."""
    prior = {"memory.hbm_bw_bytes_per_s": 4.8e12}
    recs = _h200_samples()
    p, res = fit.fit_memory(recs, prior)
    slow = recs + [{"kind": "rms_norm", "bytes_moved": 1e6, "median_s": 1.0}]
    assert fit.fit_memory(slow, prior)[0] == p
    assert (
        res["points"] == sum(r["kind"] == "copy" for r in recs)
        and res["max_abs_log_residual"] < 0.06
    )
    assert 0.7 < p["kernels.mem_efficiency"]["value"] < 0.95
