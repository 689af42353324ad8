"""tpcost evaluate on small hand-made CSVs with hand-computed summaries."""

import json
from pathlib import Path

import pytest

from integration.cli import main

FIX = Path(__file__).parent / "fixtures"


def run_json(capsys, *files):
    rc = main(["evaluate", *map(str, files), "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out)


def test_model_level_summary_by_hand(capsys):
    d = run_json(capsys, FIX / "eval_model.csv")
    assert d["rows_scored"] == 5 and d["rows_skipped"] == 3
    # (baseline, overlap) per scored row; measured verdicts off, on, off, on, on (no ties)
    times = [(100, 200), (100, 80), (100, 125), (100, 90), (100, 90)]
    pred = [r["s_predicted"] > 1 for r in d["rows"]]
    assert pred[0] is False and pred[1] is True and pred[3] is False  # decode-sized N off, N = 8192 on
    meas = [o < b for b, o in times]
    assert d["verdict_accuracy"] == pytest.approx(sum(p == m for p, m in zip(pred, meas)) / 5)
    regret = [100 * ((o if p else b) - min(b, o)) / min(b, o) for p, (b, o) in zip(pred, times)]
    assert d["mean_regret_pct"] == pytest.approx(sum(regret) / 5)
    assert d["max_regret_pct"] == pytest.approx(max(regret))
    # vLLM 0.31 (sm90, hidden 8192, tp 8 -> 8 MiB*8/(8192*2) = 4096 tokens): off,on,on,off,off -> 2/5
    assert d["vllm_rule"]["verdict_accuracy"] == pytest.approx(0.4)
    assert d["vllm_rule"]["mean_regret_pct"] == pytest.approx((25 + 2 * 100 / 9) / 5)
    assert d["vllm_rule"]["max_regret_pct"] == pytest.approx(25)
    reasons = " | ".join(s["reason"] for s in d["skipped"])
    assert "unknown GPU profile" in reasons and "not divisible by tp=3" in reasons and "missing baseline_us" in reasons
    # errors are |s_hat - s| with s = baseline/overlap
    r0 = d["rows"][0]
    assert r0["s_measured"] == pytest.approx(0.5) and r0["abs_error"] == pytest.approx(abs(r0["s_predicted"] - 0.5))


def test_op_level_summary_by_hand(capsys):
    d = run_json(capsys, FIX / "eval_op.csv")
    assert d["rows_scored"] == 4 and d["rows_skipped"] == 1  # fp8-dynamic ag_gemm does not fuse
    # predicted: off, on, on, off ; measured: off, on, off, off -> 3/4; regret only row 3: 10 %
    assert d["verdict_accuracy"] == pytest.approx(0.75)
    assert d["mean_regret_pct"] == pytest.approx(10 / 4) and d["max_regret_pct"] == pytest.approx(10)
    # vLLM: hidden = k (ag_gemm) or n (gemm_rs) = 8192, m >= 4096 -> off, on, on, off: same verdicts
    assert d["vllm_rule"]["verdict_accuracy"] == pytest.approx(0.75)


def test_table_and_plot(tmp_path, capsys):
    png = tmp_path / "e.png"
    rc = main(["evaluate", str(FIX / "eval_model.csv"), str(FIX / "eval_op.csv"), "--plot", str(png)])
    out, _ = capsys.readouterr()
    assert rc == 0 and "vLLM rule" in out and png.stat().st_size > 1000


@pytest.mark.parametrize("text,needle", [
    ("", "empty file"),
    ("hardware,tp,model,dtype,num_tokens,baseline_us,overlap_us,scope\n", "missing column 'source'"),
    ("hardware,tp,model,dtype,num_tokens,baseline_us,overlap_us,scope,source,extra\n", "unknown column 'extra'"),
    ("hardware,tp,model,dtype,num_tokens,baseline_us,overlap_us,scope,source\nh100-sxm,8,llama-3.1-70b,bf16,1,abc,1,layer,x\n", "not a number"),
    ("hardware,tp,model,dtype,num_tokens,baseline_us,overlap_us,scope,source\nh100-sxm,8,llama-3.1-70b,bf16,1,0,1,layer,x\n", "> 0"),
    ("hardware,tp,model,dtype,num_tokens,baseline_us,overlap_us,scope,source\nh100-sxm,8,llama-3.1-70b,bf16,1,-3,1,layer,x\n", "> 0"),
    ("a,b\n1,2\n", "cannot tell the schema"),
])
def test_bad_csv_exit_2(tmp_path, one_line_error, text, needle):
    f = tmp_path / "bad.csv"
    f.write_text(text)
    one_line_error("evaluate", str(f), needle=needle)


def test_band_coverage_of_op_rows(tmp_path, capsys):
    """--band: each op row gets the 5-95 % of its predicted speedup over the profile's draws, which holds the point
    prediction, and the summary counts how often the measured speedup falls inside."""
    import json

    from integration.cli import main

    f = tmp_path / "ops.csv"
    f.write_text("hardware,tp,op,dtype,m,n,k,baseline_us,overlap_us,source\n"
                 "h100-sxm,8,gemm_rs,bf16,512,4096,14336,133.653,613.784,x\n"
                 "h100-sxm,8,gemm_rs,bf16,2048,4096,14336,422.704,755.246,x\n"
                 "h100-sxm,8,gemm_rs,bf16,2048,4096,14336,422.704,40.0,x\n")  # a 10x speedup no band holds
    assert main(["evaluate", str(f), "--band", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    for r in d["rows"]:
        assert r["band_lo"] <= r["s_predicted"] <= r["band_hi"]
    assert d["band_coverage"]["rows"] == 3 and d["band_coverage"]["covered"] <= 2 / 3
    assert main(["evaluate", str(f)]) == 0 and "band covers" not in capsys.readouterr().out
