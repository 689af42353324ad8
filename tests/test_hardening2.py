"""Hardening II (issue 18): profile value ranges, null for schedules that cannot run, the band's memory,
evaluate with nothing to score. Each case failed (traceback, or silently accepted) before."""

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from costmodel.analysis import perturbed
from costmodel.model import predict
from costmodel.profile import VALUE_RANGES, builtin_profile_names, load_profile, value_range
from costmodel.shapes import load_model
from integration.cli import main

ROOT = Path(__file__).resolve().parents[1]
SRC = (ROOT / "costmodel" / "profiles" / "h100-sxm.toml").read_text()
UNC = "[asynctp._sync.uncertainty_rel]"


def _unc_block(value: str) -> str:
    """h100-sxm.toml with the barrier's fitted sigma replaced by `value` (a TOML value)."""
    assert f"{UNC}\nbarrier_s = " in SRC
    head, tail = SRC.split(UNC, 1)
    rest = tail.split("\n", 2)[2]
    return f"{head}{UNC}\nbarrier_s = {value}\n{rest}"


@pytest.mark.parametrize("name,text,needle", [
    ("unc-str", _unc_block('"abc"'), "uncertainty_rel of asynctp.barrier_s must be a number"),
    ("unc-table", _unc_block("{ a = 1 }"), "must be a number"),
    ("unc-nan", _unc_block("nan"), "outside [0, 1]"),
    ("unc-neg", _unc_block("-0.1"), "outside [0, 1]"),
    ("unc-huge", _unc_block("1e6"), "outside [0, 1]"),
    ("unc-bigint", _unc_block("1" + "0" * 400), "beyond the range of a float"),
    ("sm-bigint", SRC.replace("sm_count = 132", "sm_count = 1" + "0" * 400), "identity.sm_count = 1000"),
    ("sm-1e308", SRC.replace("sm_count = 132", "sm_count = 1e308"),
     "identity.sm_count = 1e+308 is outside its plausible range [1, 4096] SMs"),
    ("barrier", SRC.replace("barrier_s = ", "barrier_s = 1e308 #", 1),
     "asynctp.barrier_s = 1e+308 is outside its plausible range [0, 0.1] s"),
])
def test_profile_values_out_of_range_are_one_line(tmp_path, capsys, one_line_error, name, text, needle):
    f = tmp_path / f"{name}.toml"
    f.write_text(text)
    err = one_line_error("whatif", "--gpu", str(f), "--json", needle=needle)
    assert "beyond the range of a float" in err or "outside" in err or "must be a number" in err


def test_every_builtin_and_the_cpu_calibration_lie_inside_the_ranges():
    for name in builtin_profile_names():
        load_profile(name)  # check_params on load: raises when a value leaves its range
    cpu = load_profile(str(ROOT / "calib" / "data" / "cpu-gloo-w2" / "profile.toml"))
    assert cpu.identity.sm_count == 1
    assert max(p.uncertainty_rel or 0 for p in cpu.provenance.values()) > 0.47  # its widest sigmas are admitted
    # every schema key has a range (value_range raises otherwise)
    for name in builtin_profile_names():
        for key in load_profile(name).values():
            value_range(key)
    assert len(VALUE_RANGES) >= 10


def test_band_draws_are_clipped_into_the_range_not_refused():
    p = load_profile("h100-sxm").with_values({"asynctp.stream_concurrency": 1.0, "gemm.max_efficiency": 0.99})
    z = np.linspace(-4, 4, 41)
    kappa = perturbed(p, "asynctp.stream_concurrency", z)
    eff = perturbed(p, "gemm.max_efficiency", z)
    assert kappa.max() == 1.0 and kappa.min() < 1.0
    assert eff.max() == 1.0 and eff.min() > 0
    bar = perturbed(p, "asynctp.barrier_s", np.array([1e3]))  # a draw far out is clipped at the top of the range
    assert bar[0] == value_range("asynctp.barrier_s").hi


@pytest.mark.parametrize("band", [True, False])
def test_tp1_has_no_sp_schedules(capsys, band):
    argv = ["whatif", "--tp", "1", "--json", "--model", "llama-3.1-8b"] + ([] if band else ["--no-band"])
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["schema_version"] == 2
    for r in d["rows"]:
        assert r["t_tp_s"] > 0
        for k in ("t_sp_s", "t_sp_asynctp_s", "speedup_sp", "speedup_sp_asynctp", "t_sp_layer_s"):
            assert r[k] is None, (k, r)
    assert d["cutoff_tokens"] is None and d["sp_cutoff_tokens"] is None and d["cutoff_band_tokens"] is None
    assert d["vllm_default_sp_min_token_num"] is None  # vLLM turns SP off at tp 1
    assert "tp >= 2" in d["unavailable"]["sp"]
    assert main([a for a in argv if a != "--json"]) == 0  # the table too
    assert "n/a" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--tp", "16"], ["--tp", "4", "--set", "interconnect.domain_size=2"]])
def test_unavailable_fused_ops_are_null_not_zero(capsys, argv):
    assert main(["whatif", "--no-band", "--json", *argv]) == 0
    d = json.loads(capsys.readouterr().out)
    for r in d["rows"]:
        assert r["speedup_sp_asynctp"] is None and r["t_sp_asynctp_s"] is None
        assert r["speedup_sp"] is not None and r["speedup_sp"] > 0
    assert "symmetric memory cannot span" in d["unavailable"]["sp_asynctp"]


def test_python_api_is_nan_never_zero():
    pred = predict(load_profile("h100-sxm"), load_model("llama-3.1-70b"), 16, "bf16", [64.0, 8192.0])
    assert np.all(np.isnan(pred.speedup_sp_asynctp)) and np.all(pred.speedup_sp > 0)
    pred1 = predict(load_profile("h100-sxm"), load_model("llama-3.1-8b"), 1, "bf16", [64.0])
    assert np.isnan(pred1.speedup_sp[0]) and np.isinf(pred1.t_forward_s("sp")[0])


def test_plot_handles_missing_schedules(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "tp16.png"
    assert main(["whatif", "--tp", "16", "--no-band", "--plot", str(out)]) == 0
    assert out.stat().st_size > 1000


def test_evaluate_with_every_row_skipped_is_an_error(tmp_path, capsys, one_line_error):
    f = tmp_path / "ops.csv"
    f.write_text("source,hardware,op,dtype,tp,m,n,k,baseline_us,overlap_us\n"
                 "x,no-such-gpu,gemm_rs,bf16,4,4096,8192,2048,100,90\n"
                 "x,no-such-gpu,gemm_rs,bf16,4,8192,8192,2048,200,180\n")
    one_line_error("evaluate", str(f), "--json", needle="nothing to score: all 2 row(s) skipped (unknown GPU profile")
    g = tmp_path / "partial.csv"  # a partial skip stays a report, exit 0
    g.write_text(f.read_text() + "x,h100-sxm,gemm_rs,bf16,4,8192,8192,2048,200,180\n")
    assert main(["evaluate", str(g), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["rows_scored"] == 1 and d["rows_skipped"] == 2


def test_memory_error_is_one_line(monkeypatch, capsys, one_line_error):
    import costmodel.analysis as an

    def boom(*a, **k):
        raise MemoryError

    monkeypatch.setattr(an, "analyse", boom)  # our own code raising it: the CLI's handler is what is under test
    one_line_error("whatif", "--no-band", needle="out of memory")


def test_band_on_a_2_20_token_budget_fits_under_rlimit_as_4gib():
    """whatif --max-num-batched-tokens 1048576 with the band, address space limited to 4 GiB (benchmarks time it)."""
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30)); "
            "from integration.cli import main; sys.exit(main(['whatif', '--max-num-batched-tokens', '1048576', "
            "'--json']))")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["cutoff_tokens"] is not None and d["cutoff_band_tokens"] is not None
    assert d["band_resolution_tokens"] == 128  # 262144 multiples of 4, decided every 32nd
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert peak_kib < 2 * 1024 * 1024, peak_kib


def test_band_is_unchanged_below_the_coarsening_point(capsys):
    """Up to BAND_GRID_MAX grid points the band runs on the full grid (resolution = tp)."""
    assert main(["whatif", "--json", "--model", "llama-3.1-8b", "--tp", "2"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["band_resolution_tokens"] == 2
