"""calib/band.py: the band's model error (asynctp.time_scale), set by nested
leave-one-source-out."""

import json

import numpy as np
from costmodel.vllm_tables import Vllm
import pytest
from conftest import sp_release_flag

from calib import band as B
from costmodel import load_profile, ops


def _rows(source, n, covered_from):
    """n rows of `source` whose band holds the measured speedup from GRID index `covered_from`
    on."""
    j = np.arange(B.GRID.size)
    return [
        {
            "source": source,
            "line": i,
            "s_measured": 1.0,
            "lo": np.where(j >= covered_from, 0.9, 1.05),
            "hi": np.full(B.GRID.size, 1.2),
            "lo_model": np.full(B.GRID.size, 0.95),
            "hi_model": np.full(B.GRID.size, 1.25),
        }
        for i in range(n)
    ]


def test_sigma_is_the_least_that_covers_the_mean_of_the_sources():
    """Coverage is the mean over sources (a 72-row source does not outvote a 10-row one) and σ_m the
    least GRID point reaching 90 %."""
    rows = _rows("A", 72, 5) + _rows("B", 10, 30)
    assert B.coverage(rows, float(B.GRID[4])) == 0.0
    assert B.coverage(rows, float(B.GRID[5])) == pytest.approx(0.5)
    assert B.sigma_for(rows) == pytest.approx(float(B.GRID[30]))
    # the profile's band, not the scored one
    assert B.sharpness(rows, float(B.GRID[30])) == pytest.approx(0.3)
    assert B.coverage(rows, float(B.GRID[4]), "_model") == 1.0
    # never covered: the grid's end
    assert B.sigma_for(_rows("C", 3, B.GRID.size)) == float(B.GRID[-1])


def test_time_scale_scales_the_fused_op_and_nothing_else():
    """asynctp.time_scale multiplies the fused op's time (GPU, host and tail alike), not its
    sequential arm."""
    prof = load_profile("h100-sxm")
    m = np.array([256.0, 4096.0])
    base = ops.torch_pair(ops.Hw(prof, "bf16"), "gemm_rs", m, 8192, 3584, 8)
    slow = ops.torch_pair(
        ops.Hw(prof.with_values({"asynctp.time_scale": 1.25}), "bf16"), "gemm_rs", m, 8192, 3584, 8
    )
    assert np.allclose(slow.fused_eager_s, 1.25 * base.fused_eager_s)
    assert np.allclose(slow.fused_graph_s, 1.25 * base.fused_graph_s)
    assert np.array_equal(slow.unfused_s, base.unfused_s)


def test_the_profiles_carry_the_committed_model_error_and_it_is_current():
    """Every built-in profile's asynctp.time_scale is 1 with the committed σ_m, and
    calib/data/band_fit.json is what python -m calib.band computes now; the model error widens the
    band."""
    from calib.results import load_band_fit
    from costmodel.profile import builtin_profile_names

    committed = load_band_fit()
    for name in builtin_profile_names():
        p = load_profile(name)
        assert p.value(B.KEY) == 1.0 and p.provenance[B.KEY].sigma_rel == pytest.approx(
            committed["sigma_m"]
        ), name
    res = json.loads(json.dumps(B.run()))
    assert res["sigma_m"] == committed["sigma_m"]
    for sid, e in res["per_source"].items():
        assert e == pytest.approx(committed["per_source"][sid]), sid
        if e["rows"]:
            assert e["sharpness"] > 0
    held = [e for s, e in res["per_source"].items() if s in B.CALIBRATION_SOURCES and e["rows"]]
    assert all(e["coverage"] >= e["coverage_parameters_only"] for e in held)
    assert all(e["coverage"] >= e["coverage_without_run_noise"] for e in held)  # widen only widens
    for part, was in ((res, committed), (res["kernel"], committed["kernel"])):
        assert part["trade_off_sigmas"] == was["trade_off_sigmas"]
        for sid, cov in part["coverage_by_sigma"].items():
            assert cov == pytest.approx(was["coverage_by_sigma"][sid]), sid
            e = part["per_source"][sid]
            assert cov[part["trade_off_sigmas"].index(e["sigma_m"])] == pytest.approx(
                e["coverage"]
            ), sid
    for sid, cov in res["coverage_by_sigma"].items():  # a torch op's band only widens with σ_m
        assert all(a <= b for a, b in zip(cov, cov[1:])), sid
    assert res["kernel"]["sigma_m"] == committed["kernel"]["sigma_m"]
    for sid, e in res["kernel"]["per_source"].items():
        assert e == pytest.approx(committed["kernel"]["per_source"][sid]), sid
    assert [(e["source"], e["fused_arm"]) for e in res["run_noise"]] == [
        (e["source"], e["fused_arm"]) for e in committed["run_noise"]
    ]
    for new, old in zip(res["run_noise"], committed["run_noise"]):
        assert {k: v for k, v in new.items() if k not in ("source", "fused_arm")} == pytest.approx(
            {k: v for k, v in old.items() if k not in ("source", "fused_arm")}, rel=1e-6, abs=1e-9
        )


@pytest.mark.parametrize("value", ["0", "-1", "nan", "11"])
def test_set_time_scale_outside_its_range_is_refused(one_line_error, value):
    one_line_error("whatif", "--set", f"asynctp.time_scale={value}", needle="asynctp.time_scale")


def test_kernel_time_scale_scales_the_kernel_and_the_profiles_carry_its_model_error():
    """fused_kernel.time_scale multiplies the kernel's whole call (GEMM-AR's clone included), not
    the unfused arm; the SM100 profiles carry the committed σ_m, Hopper's (no released row of the
    kernel there) the assumed tier's."""
    from calib.results import load_band_fit

    prof = load_profile("b200")
    m = np.array([128.0, 4096.0])
    g = ops.KernelGemm("gemm_ar", 7168, 1536, 8)
    base = ops.kernel_pair(ops.Hw(prof, "bf16"), g, m, vllm=Vllm())
    slow = ops.kernel_pair(
        ops.Hw(prof.with_values({"fused_kernel.time_scale": 1.5}), "bf16"), g, m, vllm=Vllm()
    )
    assert np.allclose(slow.kernel.t_s, 1.5 * base.kernel.t_s)
    assert np.array_equal(slow.unfused_s, base.unfused_s)
    want = load_band_fit()["kernel"]["sigma_m"]
    for name in ("b200", "b300", "gb200-nvl72", "gb300-nvl72"):
        assert load_profile(name).provenance["fused_kernel.time_scale"].sigma_rel == pytest.approx(
            want
        ), name
    assert load_profile("h100-sxm").provenance["fused_kernel.time_scale"].tier == "assumed"


def test_a_fused_kernel_table_without_time_scale_loads_and_one_without_a_term_is_refused(
    tmp_path, one_line_error
):
    """A [fused_kernel] written before time_scale existed loads with it at 1 (tier assumed, said
    so); one missing a required term is one line naming the terms."""
    import re
    from pathlib import Path

    src = (
        Path(__file__).resolve().parent.parent / "costmodel" / "profiles" / "b200.toml"
    ).read_text()
    old = re.sub(
        r"\[fused_kernel\._time_scale(\.uncertainty_rel)?\]\n(?:[^\[\n][^\n]*\n|\n)*", "", src
    )
    assert "time_scale = 1.0" in src and "fused_kernel._time_scale" not in old
    (tmp_path / "old.toml").write_text(old)
    p = load_profile(str(tmp_path / "old.toml"))
    assert (
        p.value("fused_kernel.time_scale") == 1.0
        and p.provenance["fused_kernel.time_scale"].tier == "assumed"
    )
    (tmp_path / "bad.toml").write_text(old.replace("ar_fence_s = ", "# ar_fence_s = ", 1))
    one_line_error(
        "whatif", "--gpu", str(tmp_path / "bad.toml"), needle="[fused_kernel] needs all of"
    )


@pytest.mark.parametrize("op", ["ag_gemm", "gemm_rs"])
def test_a_fast_model_error_draw_stays_physical(op):
    """At the range's lowest time_scale (0.1) torch's fused op still costs at least the whole
    GEMM."""
    prof = load_profile("h100-sxm").with_values({"asynctp.time_scale": 0.1})
    hw = ops.Hw(prof, "bf16")
    m = np.array([64.0, 1024.0, 16384.0])
    pair = ops.torch_pair(hw, op, m, 8192, 3584, 4)
    assert np.all(pair.fused_graph_s >= hw.t_gemm(m, 8192, 3584)) and np.all(
        pair.fused_eager_s >= pair.fused_graph_s
    )


def _pairs(rng, n, rel, jitter_s):
    """n synthetic cells timed twice: speedup 1.1 at times t log-uniform 0.1-2 ms, each run's ln
    speedup off by N(0, rel² + (jitter/t)²)."""
    t = np.exp(rng.uniform(np.log(1e-4), np.log(2e-3), n))
    sig = np.sqrt(rel**2 + (jitter_s / t) ** 2)
    out = []
    for ti, si in zip(t, sig):
        a, b = np.exp(si * rng.standard_normal(2))
        out.append(((1.1 * ti * a, ti), (1.1 * ti * b, ti)))
    return out


def test_run_noise_fit_recovers_a_relative_part_and_a_jitter():
    """fit_run_noise by maximum likelihood: 3000 synthetic pairs at r 0.03, j 15 us come back within
    15 %; the two-term fit nests the constant one (its ln L at least as high); no pairs, no fit."""
    fit = B.fit_run_noise(_pairs(np.random.default_rng(0), 3000, 0.03, 15e-6))
    assert fit["pairs"] == 3000
    assert fit["relative"] == pytest.approx(0.03, rel=0.15)
    assert fit["jitter_s"] == pytest.approx(15e-6, rel=0.15)
    assert fit["nll"] <= fit["nll_constant"]
    flat = B.fit_run_noise(_pairs(np.random.default_rng(1), 3000, 0.05, 0.0))
    assert flat["relative"] == pytest.approx(0.05, rel=0.1) and flat["jitter_s"] < 3e-6
    assert B.fit_run_noise([]) is None


def test_run_noise_sigma_and_widen_by_hand():
    """σ_run = √(r² + (j/t)²) at t = √(baseline·fused), 0 without a fit; widen adds Z95·σ_run in
    quadrature to the band's half-width in ln about √(lo·hi), and σ_run 0 leaves the band as it
    was."""
    noise = {"relative": 0.03, "jitter_s": 20e-6}
    assert float(B.run_noise_sigma(noise, 4e-4, 1e-4)) == pytest.approx(
        np.hypot(0.03, 20e-6 / 2e-4)
    )
    assert float(B.run_noise_sigma(None, 4e-4, 1e-4)) == 0.0
    lo, hi = np.array([0.9]), np.array([1.2])
    assert np.allclose(B.widen(lo, hi, 0.0), (lo, hi))
    c, h = np.sqrt(0.9 * 1.2), np.log(1.2 / np.sqrt(0.9 * 1.2))
    wl, wh = B.widen(lo, hi, 0.1)
    assert (float(wl[0]), float(wh[0])) == pytest.approx(
        (c * np.exp(-np.hypot(h, B.Z95 * 0.1)), c * np.exp(np.hypot(h, B.Z95 * 0.1)))
    )


def test_replicate_pairs_are_the_flashinfer_dtype_twins():
    """The FlashInfer matrix times each torch-arm cell in bf16 and fp16 (36 pairs, one baseline per
    cell shared with its kernel row); a source timing no cell twice has no run noise, the kernel's
    FlashInfer rows do."""
    pairs = B.replicate_pairs("FLASHINFER_GB200_GEMMRS_MATRIX")
    assert len(pairs) == 36 and all(a != b for a, b in pairs)
    assert B.replicate_pairs("PT_ISSUE179770") == []
    noise = B.run_noise()
    assert set(noise) == {
        ("FLASHINFER_GB200_GEMMRS_MATRIX", "torch"),
        ("FLASHINFER_GB200_GEMMRS_MATRIX", "kernel"),
    }
    assert all(f["pairs"] == 36 for f in noise.values())


def test_the_band_trade_off_holds_the_shipped_whatif_band(capsys):
    """benchmarks/results/accuracy.json's whatif_band_by_sigma: at the profiles' σ_m it is the band
    `tpcost whatif` prints now (the copied profile changes nothing else), and the band only widens
    with σ (never = +inf)."""
    from pathlib import Path

    from integration.cli import main

    acc = json.loads(
        (
            Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "accuracy.json"
        ).read_text()
    )
    trade = acc["whatif_band_by_sigma"]
    at = next(t for t in trade if t["sigma"] == pytest.approx(acc["band_calibration"]["sigma_m"]))
    # the band accuracy.json measured (SP cutoff)
    assert main(["whatif", "--json", *sp_release_flag()]) == 0
    w = json.loads(capsys.readouterr().out)
    assert w["cutoff_band_tokens"] == [at["band_lo_tokens"], at["band_hi_tokens"]]
    assert w["cutoff_tokens"] == at["cutoff_tokens"]
    inf = float("inf")
    for a, b in zip(trade, trade[1:]):
        assert a["sigma"] < b["sigma"] and b["band_lo_tokens"] <= a["band_lo_tokens"]
        assert (b["band_hi_tokens"] or inf) >= (a["band_hi_tokens"] or inf)
