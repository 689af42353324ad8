"""costmodel.plot: what the figures draw (series content), missing schedules drawn as gaps."""

from pathlib import Path

import numpy as np
from costmodel.vllm_tables import Vllm
import pytest

from costmodel.shapes import load_model
from integration.cli import main


def test_plot_handles_missing_schedules(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "tp16.png"
    assert main(["whatif", "--tp", "16", "--no-band", "--plot", str(out)]) == 0
    assert out.stat().st_size > 1000


ROOT = Path(__file__).resolve().parents[1]


def test_whatif_plot_series_content():
    pytest.importorskip("matplotlib")
    from costmodel import RunConfig, analyse, load_profile
    from costmodel.plot import whatif_series

    a = analyse(
        load_profile("h100-sxm"), load_model("llama-3.1-70b"), RunConfig(4, "bf16"), band=False
    )
    s = whatif_series(a)
    n = s["num_tokens"]
    assert n[0] == 4 and n[-1] == 65536 and np.all(n % 4 == 0) and np.all(np.diff(n) > 0)
    assert s["cutoff_tokens"] == a.cutoff_tokens and s["margin_line"] == pytest.approx(1.02)
    # the curve at some of its points is whatif's table row at those N (analyse's own table
    # prediction)
    picks = [int(n[i]) for i in (0, len(n) // 2, len(n) - 2, len(n) - 1)]
    b = analyse(
        load_profile("h100-sxm"),
        load_model("llama-3.1-70b"),
        RunConfig(4, "bf16"),
        band=False,
        tokens=picks,
    )
    tab = {int(x): float(v) for x, v in zip(b.table.num_tokens, b.table.speedup_sp_asynctp)}
    for x in picks:
        assert s["speedup_sp_asynctp"][int(np.flatnonzero(n == x)[0])] == pytest.approx(
            tab[x], rel=1e-12
        )
    # decode-sized batches lose, long prefills win (the README's sample: 0.2x at small N, > 1 at
    # 65536)
    assert s["speedup_sp_asynctp"][0] < 0.5 and s["speedup_sp_asynctp"][-1] > 1.0


def test_whatif_plot_series_nan_where_no_schedule():
    from costmodel import RunConfig, analyse, load_profile
    from costmodel.plot import whatif_series

    a = analyse(
        load_profile("h100-sxm"), load_model("llama-3.1-70b"), RunConfig(16, "bf16"), band=False
    )
    s = whatif_series(a)
    assert np.all(np.isnan(s["speedup_sp_asynctp"])) and np.all(s["speedup_sp"] > 0)


def test_evaluation_series_content(tmp_path, capsys):
    from costmodel.evaluate import evaluate_files, evaluation_series

    f = tmp_path / "ops.csv"
    f.write_text(
        "hardware,tp,op,dtype,m,n,k,baseline_us,overlap_us,source,impl\n"
        "h100-sxm,8,gemm_rs,bf16,512,4096,14336,133.653,613.784,x,torch\n"
        "h100-sxm,8,gemm_rs,bf16,65536,8192,28672,1000,500,x,torch\n"
    )
    scored, _ = evaluate_files([str(f)], Vllm())
    s = evaluation_series(scored)
    assert s["measured"] == pytest.approx([133.653 / 613.784, 2.0])
    assert s["predicted"][0] < 1.0  # KRAKEN_PR19's M = 512 row: a slowdown, predicted so
    assert not s["wrong"][0]
