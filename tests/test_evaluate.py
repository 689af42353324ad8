"""tpcost evaluate on small hand-made CSVs with hand-computed summaries."""

import json
from pathlib import Path

import numpy as np
from costmodel.vllm_tables import Vllm
import pytest

from integration.cli import main
import shutil

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
    # decode-sized N off, N = 8192 on
    assert pred[0] is False and pred[1] is True and pred[3] is False
    meas = [o < b for b, o in times]
    assert d["verdict_accuracy"] == pytest.approx(sum(p == m for p, m in zip(pred, meas)) / 5)
    regret = [100 * ((o if p else b) - min(b, o)) / min(b, o) for p, (b, o) in zip(pred, times)]
    assert d["mean_regret_pct"] == pytest.approx(sum(regret) / 5)
    assert d["max_regret_pct"] == pytest.approx(max(regret))
    # vLLM 0.31 (sm90, hidden 8192, tp 8 -> 8 MiB*8/(8192*2) = 4096 tokens): off,on,on,off,off ->
    # 2/5
    assert d["vllm_rule"]["verdict_accuracy"] == pytest.approx(0.4)
    assert d["vllm_rule"]["mean_regret_pct"] == pytest.approx((25 + 2 * 100 / 9) / 5)
    assert d["vllm_rule"]["max_regret_pct"] == pytest.approx(25)
    reasons = " | ".join(s["reason"] for s in d["skipped"])
    assert (
        "unknown GPU profile" in reasons
        and "not divisible by tp=3" in reasons
        and "missing baseline_us" in reasons
    )
    # errors are |s_hat - s| with s = baseline/overlap
    r0 = d["rows"][0]
    assert r0["s_measured"] == pytest.approx(0.5) and r0["abs_error"] == pytest.approx(
        abs(r0["s_predicted"] - 0.5)
    )


def test_op_level_summary_by_hand(capsys):
    d = run_json(capsys, FIX / "eval_op.csv")
    assert d["rows_scored"] == 4 and d["rows_skipped"] == 1  # fp8-dynamic ag_gemm does not fuse
    # predicted: off, on, on, off ; measured: off, on, off, off -> 3/4; regret only row 3: 10 %
    assert d["verdict_accuracy"] == pytest.approx(0.75)
    assert d["mean_regret_pct"] == pytest.approx(10 / 4) and d["max_regret_pct"] == pytest.approx(
        10
    )
    # vLLM: hidden = k (ag_gemm) or n (gemm_rs) = 8192, m >= 4096 -> off, on, on, off: same verdicts
    assert d["vllm_rule"]["verdict_accuracy"] == pytest.approx(0.75)


def test_table_and_plot(tmp_path, capsys):
    png = tmp_path / "e.png"
    rc = main(
        ["evaluate", str(FIX / "eval_model.csv"), str(FIX / "eval_op.csv"), "--plot", str(png)]
    )
    out, _ = capsys.readouterr()
    assert rc == 0 and "vLLM rule" in out and png.stat().st_size > 1000


@pytest.mark.parametrize(
    "text,needle",
    [
        ("", "empty file"),
        (
            "hardware,tp,model,dtype,num_tokens,baseline_us,overlap_us,scope\n",
            "missing column 'source'",
        ),
        (
            "hardware,tp,model,dtype,num_tokens,baseline_us,overlap_us,scope,source,extra\n",
            "unknown column 'extra'",
        ),
        (
            "hardware,tp,model,dtype,num_tokens,baseline_us,overlap_us,scope,source\nh100-sxm,8,llama-3.1-70b,bf16,1,abc,1,layer,x\n",
            "not a number",
        ),
        (
            "hardware,tp,model,dtype,num_tokens,baseline_us,overlap_us,scope,source\nh100-sxm,8,llama-3.1-70b,bf16,1,0,1,layer,x\n",
            "> 0",
        ),
        (
            "hardware,tp,model,dtype,num_tokens,baseline_us,overlap_us,scope,source\nh100-sxm,8,llama-3.1-70b,bf16,1,-3,1,layer,x\n",
            "> 0",
        ),
        (
            "a,b\n1,2\n",
            "cannot tell the schema; an op CSV has "
            "hardware,tp,op,dtype,m,n,k,baseline_us,overlap_us,source",
        ),
        (
            "hardware,tp,op,dtype,m,n,k,baseline_us,overlap_us,source,harness_us\nh100-sxm,4,gemm_rs,bf16,4096,8192,3584,"
            "500,450,x,-1\n",
            "harness_us must be a finite time >= 0",
        ),
        (
            "hardware,tp,op,dtype,m,n,k,baseline_us,overlap_us,source,harness_us\nh100-sxm,4,gemm_rs,bf16,4096,8192,3584,"
            "500,450,x,lots\n",
            "harness_us 'lots' is not a number",
        ),
    ],
)
def test_bad_csv_exit_2(tmp_path, one_line_error, text, needle):
    f = tmp_path / "bad.csv"
    f.write_text(text)
    one_line_error("evaluate", str(f), needle=needle)


def test_band_coverage_of_op_rows(tmp_path, capsys):
    """--band: each op row gets the 5-95 % of its predicted speedup over the profile's draws, which
    holds the point prediction, and the summary counts how often the measured speedup falls
    inside."""
    import json

    from integration.cli import main

    f = tmp_path / "ops.csv"
    # a 10x speedup no band holds
    f.write_text(
        "hardware,tp,op,dtype,m,n,k,baseline_us,overlap_us,source,impl\n"
        "h100-sxm,8,gemm_rs,bf16,512,4096,14336,133.653,613.784,x,torch\n"
        "h100-sxm,8,gemm_rs,bf16,2048,4096,14336,422.704,755.246,x,torch\n"
        "h100-sxm,8,gemm_rs,bf16,2048,4096,14336,422.704,40.0,x,torch\n"
    )
    assert main(["evaluate", str(f), "--band", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    for r in d["rows"]:
        assert r["band_lo"] <= r["s_predicted"] <= r["band_hi"]
    assert d["band_coverage"]["rows"] == 3 and d["band_coverage"]["covered"] <= 2 / 3
    assert main(["evaluate", str(f)]) == 0 and "band covers" not in capsys.readouterr().out


def test_evaluate_with_every_row_skipped_is_an_error(tmp_path, capsys, one_line_error):
    f = tmp_path / "ops.csv"
    f.write_text(
        "source,hardware,op,dtype,tp,m,n,k,baseline_us,overlap_us,impl\n"
        "x,no-such-gpu,gemm_rs,bf16,4,4096,8192,2048,100,90,torch\n"
        "x,no-such-gpu,gemm_rs,bf16,4,8192,8192,2048,200,180,torch\n"
    )
    one_line_error(
        "evaluate",
        str(f),
        "--json",
        needle="nothing to score: all 2 row(s) skipped (unknown GPU profile",
    )
    g = tmp_path / "partial.csv"  # a partial skip stays a report, exit 0
    g.write_text(f.read_text() + "x,h100-sxm,gemm_rs,bf16,4,8192,8192,2048,200,180,torch\n")
    assert main(["evaluate", str(g), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["rows_scored"] == 1 and d["rows_skipped"] == 2


ROOT = Path(__file__).resolve().parents[1]


def test_evaluate_resolves_paths_beside_the_csv(tmp_path, capsys, monkeypatch):
    """An ops CSV naming its profile by a path relative to itself (as calibrate writes it) scores
    from any working directory; the repo's committed CPU run too."""
    d = tmp_path / "run"
    d.mkdir()
    shutil.copy(ROOT / "costmodel" / "profiles" / "h100-sxm.toml", d / "node.toml")
    from costmodel.evaluate import op_csv_header

    (d / "ops.csv").write_text(
        op_csv_header() + "\nnode.toml,8,gemm_rs,bf16,4096,8192,3584,500,450,x,torch\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["evaluate", str(d / "ops.csv"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows_scored"] == 1
    monkeypatch.chdir(ROOT)
    assert main(["evaluate", "calib/data/cpu-gloo-w2/validate.csv", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows_skipped"] == 0


def test_evaluate_labels_keep_their_distinguishing_tail(tmp_path, capsys):
    from costmodel.evaluate import model_csv_header

    deep = tmp_path / ("a-very-long-directory-name-" * 3)
    deep.mkdir()
    shutil.copy(ROOT / "costmodel" / "profiles" / "h100-sxm.toml", deep / "h100-node-profile.toml")
    prof = str(deep / "h100-node-profile.toml")
    rows = [f"{prof},4,llama-3.1-70b,bf16,{n},1000,900,forward,x" for n in (2048, 4096)]
    f = tmp_path / "m.csv"
    f.write_text(model_csv_header() + "\n" + "\n".join(rows) + "\n")
    assert main(["evaluate", str(f)]) == 0
    out = capsys.readouterr().out
    assert "N=2048" in out and "N=4096" in out


def test_harness_time_is_added_to_both_arms():
    """A row's harness_us (a benchmark's own floor on both arms) enters as (unfused + h) / (fused +
    h)."""
    from costmodel import load_profile, ops
    from costmodel.evaluate import predict_op_row

    prof = load_profile("h100-sxm")
    row = {
        "op": "gemm_rs",
        "dtype": "bf16",
        "tp": 4,
        "m": 4096,
        "n": 8192,
        "k": 3584,
        "impl": "torch",
    }
    p = ops.torch_pair(ops.Hw(prof, "bf16"), "gemm_rs", 4096.0, 8192, 3584, 4)
    u, f = float(np.ravel(p.unfused_s)[0]), float(np.ravel(p.fused_eager_s)[0])
    assert predict_op_row(prof, row, Vllm())[0] == pytest.approx(u / f, rel=1e-12)
    assert predict_op_row(prof, {**row, "harness_us": 100.0}, Vllm())[0] == pytest.approx(
        (u + 1e-4) / (f + 1e-4), rel=1e-12
    )


def test_op_and_evaluate_read_one_registry_of_fused_ops():
    """Issue 48 item 2: one registry (costmodel.fused_ops) holds each fused op's formats and
    eligibility: `op` refuses exactly the combinations `evaluate` skips, with the same reason, on
    every built-in GPU, TP and format; the release fields each op depends on are the vLLM home's."""
    import dataclasses

    from costmodel import fused_ops
    from costmodel.errors import TpcostError
    from costmodel.evaluate import predict_op_row
    from costmodel.op_analysis import check_combination
    from costmodel.profile import builtin_profile_names, load_profile
    from costmodel.vllm_tables import Release, Vllm

    fields = {f.name for f in dataclasses.fields(Release)}
    for k in fused_ops.REGISTRY.values():
        assert set(k.vllm_fields) <= fields, k
    checked = 0
    for name in builtin_profile_names():
        prof = load_profile(name)
        for op, impl in [(o, i) for o in fused_ops.op_names() for i in fused_ops.impl_names()]:
            for tp in (2, 4, 8, 16):
                for dtype in fused_ops.dtype_names():
                    row = {
                        "op": op,
                        "dtype": dtype,
                        "tp": tp,
                        "m": 1024,
                        "n": 7168,
                        "k": 1536,
                        "impl": impl,
                    }
                    try:
                        check_combination(prof, op, impl, tp, dtype, 7168)
                        refused = None
                    except TpcostError as e:
                        refused = str(e)
                    try:
                        predict_op_row(prof, row, Vllm())
                        skipped = None
                    except Exception as e:  # evaluate's skip of a row (a reason, one line)
                        skipped = str(e)
                    assert (refused is None) == (skipped is None), (
                        name,
                        op,
                        impl,
                        tp,
                        dtype,
                        refused,
                        skipped,
                    )
                    if refused is not None:
                        assert refused.endswith(skipped), (refused, skipped)
                    checked += 1
    assert checked > 1000


def test_no_second_table_of_fused_ops():
    """Issue 48 item 2: the fused ops are listed once, in costmodel/fused_ops.py (and vLLM's own
    kernel ops and switches in its release record, costmodel/vllm_tables.py, which the registry
    reads). A literal tuple, list, set or dict anywhere else in the code (costmodel, integration,
    calib, benchmarks, tools) that lists two or more fused ops and nothing else, or pairs an op with
    an impl, is a second table, and fails here: read the registry instead."""
    import ast
    from pathlib import Path

    from costmodel import fused_ops

    root = Path(__file__).resolve().parents[1]
    ops, impls = set(fused_ops.op_names()), set(fused_ops.impl_names())
    homes = {root / "costmodel" / "fused_ops.py", root / "costmodel" / "vllm_tables.py"}
    found = []
    for pkg in ("costmodel", "integration", "calib", "benchmarks", "tools"):
        for path in sorted((root / pkg).rglob("*.py")):
            if path in homes:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                items = (
                    node.keys
                    if isinstance(node, ast.Dict)
                    else node.elts
                    if isinstance(node, (ast.Tuple, ast.List, ast.Set))
                    else None
                )
                if items is None:
                    continue
                strs = [
                    e.value
                    for e in items
                    if isinstance(e, ast.Constant) and isinstance(e.value, str)
                ]
                if len(strs) != len(items) or not strs:
                    continue
                if (len(strs) >= 2 and set(strs) <= ops) or (set(strs) & ops and set(strs) & impls):
                    found.append(f"{path.relative_to(root)}:{node.lineno} {strs}")
    assert not found, found
    # and the registry answers what the second tables did: the collective each op fuses
    assert {(k.op, k.collective) for k in fused_ops.REGISTRY.values()} == {
        ("ag_gemm", "all_gather"),
        ("gemm_rs", "reduce_scatter"),
        ("gemm_ar", "all_reduce"),
    }
