"""Hand-computed values per formula, limits, and bounds (hypothesis)."""

import pytest
from hypothesis import given, settings, strategies as st

from costmodel import formulas as F


def test_gemm_flops_and_bytes():
    assert F.gemm_flops(2, 3, 4) == 48
    assert F.gemm_bytes(2, 3, 4, 2, 2, 2) == (8 + 12 + 6) * 2


def test_gemm_compute_stream_k_by_hand():
    # m=256, n=256, k=1024 on 2 SMs: the work 2·256·256·1024 split evenly, 1 TFLOP/s in all
    assert F.t_gemm_compute_s(256, 256, 1024, 1e12, 1.0, 128, 256, 2) == pytest.approx(
        2 * 256 * 256 * 1024 / 1e12
    )
    # 385 rows stay 385 (padding averaged out over the library's tiles), n = 200 pads to 256 (the
    # MMA's 64 columns)
    assert F.t_gemm_compute_s(385, 200, 1024, 1e12, 1.0, 128, 256, 2) == pytest.approx(
        2 * 385 * 256 * 1024 / 1e12
    )
    # 8 rows x 256 columns on 132 SMs: fewer units than SMs, so one SM's 512-deep slice of one 8 x
    # 256 tile sets it
    t = F.t_gemm_compute_s(8, 256, 8192, 1e12, 1.0, 128, 256, 132)
    assert t == pytest.approx(2 * 8 * 256 * 512 / (1e12 / 132))


def test_gemm_has_no_step_above_the_mma_granularity():
    """One more row costs one row's work: the time never jumps by more than 1/m (no wave or tile
    cliff)."""
    import numpy as np

    m = np.arange(512.0, 4097.0)
    t = F.t_gemm_compute_s(m, 8192.0, 8192.0, 989e12, 0.8, 128, 256, 132)
    assert np.all(np.diff(t) >= 0) and np.all(t[1:] / t[:-1] - 1 <= 1.0 / m[:-1] + 1e-12)


def test_gemm_roofline_memory_bound_small_m():
    # m=1: weights 4096x4096x2 B dominate: t = launch + bytes/(bw*eff)
    kw = dict(
        peak_flops_per_s=1e15,
        max_efficiency=1.0,
        mem_efficiency=0.5,
        hbm_bw_bytes_per_s=1e12,
        tile_m=128,
        tile_n=256,
        sm_count=132,
        launch_overhead_s=1e-6,
        in_bytes=2,
        w_bytes=2,
        out_bytes=2,
    )
    t = F.t_gemm_s(1, 4096, 4096, **kw)
    assert t == pytest.approx(1e-6 + (4096 * 2 + 4096 * 4096 * 2 + 4096 * 2) / 0.5e12)


def test_collectives_by_hand():
    assert F.t_all_reduce_s(8e6, 10e-6, 100e9, 4) == pytest.approx(10e-6 + 1.5 * 8e6 / 100e9)
    assert F.t_all_gather_s(8e6, 5e-6, 100e9, 4) == pytest.approx(5e-6 + 0.75 * 8e6 / 100e9)
    assert F.t_reduce_scatter_s(8e6, 5e-6, 100e9, 8) == pytest.approx(5e-6 + 0.875 * 8e6 / 100e9)
    assert F.t_all_reduce_s(8e6, 10e-6, 100e9, 1) == 0.0


def test_memory_kernels_by_hand():
    assert F.rms_norm_bytes(10, 100, 2, 2, fused_add=True) == 10 * 100 * 8
    assert F.rms_norm_bytes(10, 100, 2, 1, fused_add=False) == 10 * 100 * 3
    assert F.silu_mul_bytes(10, 100, 2, 2) == 10 * 100 * 6
    assert F.reduction_bytes(8, 10, 2, 4) == 8 * 10 * 2 * 1.25
    assert F.t_memory_bound_s(1e9, 1e12, 0.5, 1e-6) == pytest.approx(1e-6 + 2e-3)


def test_attention_by_hand():
    # 2048 tokens in sequences of 1024: 2*d*h*N*L
    assert F.attention_flops(2048, 1024, 8, 128) == 2 * 128 * 8 * 2048 * 1024
    assert F.attention_flops(100, 1024, 8, 128) == 2 * 128 * 8 * 100 * 100
    assert F.attention_bytes(10, 8, 2, 128, 2) == 10 * (16 + 4) * 128 * 2


def test_asynctp_pipelines_by_hand():
    # AG: W=4, g=10, g_eff=8, whole=30, p=3, copy=2, b=1 -> 3 + 2 + 0 + max(32, 30, 9+10) = 37
    assert F.t_ag_gemm_gpu_s(4, 10.0, 8.0, 30.0, 3.0, 2.0, 1.0) == 37.0
    # pull-bound: p=20 -> 3 + 2 + max(32, 30, 60+10) = 75
    assert F.t_ag_gemm_gpu_s(4, 10.0, 8.0, 30.0, 20.0, 2.0, 1.0) == 75.0
    # never below the whole GEMM: W·g_eff = 32 < whole 40 -> 3 + 2 + 40
    assert F.t_ag_gemm_gpu_s(4, 10.0, 8.0, 40.0, 3.0, 2.0, 1.0) == 45.0
    # RS: W=4, 2W=8 barriers of 1, reduction 5: 8 + max(32, 30, 10 + 15) + 5 = 45 ; p=20: 8 + 70 + 5
    assert F.t_gemm_rs_gpu_s(4, 10.0, 8.0, 30.0, 5.0, 5.0, 1.0) == 45.0
    assert F.t_gemm_rs_gpu_s(4, 10.0, 8.0, 30.0, 20.0, 5.0, 1.0) == 83.0
    # exposed pulls: ε = 0.5 of the 3 pulls of 5 behind the GEMMs: 8 + max(32 + 7.5, 30, 25) + 5 ; ε
    # = 1: serial
    assert F.t_gemm_rs_gpu_s(4, 10.0, 8.0, 30.0, 5.0, 5.0, 1.0, 0.5) == 52.5
    assert F.t_gemm_rs_gpu_s(4, 10.0, 8.0, 30.0, 5.0, 0.0, 0.0, 1.0) == 4 * 8.0 + 3 * 5.0
    # two streams: compute 10 alone, 16 for both chunks -> (0.5·10 + 0.5·8) = 9 ; memory-bound 12
    # stays 12
    assert F.t_chunk_concurrent_s(1.0, 10.0, 16.0, 0.0, 0.5) == 9.0
    assert F.t_chunk_concurrent_s(12.0, 10.0, 16.0, 0.0, 0.5) == 12.0
    assert F.overlapped_fraction(5.0, 10.0) == 0.5 and F.overlapped_fraction(50.0, 10.0) == 1.0
    assert F.t_pull_s(900.0, 300.0, 100.0, 1.0) == 10.0  # no faster than the link
    assert F.host_ops_gemm_rs(8) == 58 and F.host_ops_ag_gemm(8) == 44
    assert F.t_eager_s(5.0, 3.0, 1.0) == 5.0 and F.t_eager_s(2.0, 3.0, 1.0) == 4.0
    assert F.bus_bw_factor("all_reduce", 4) == 1.5 and F.bus_bw_factor("all_gather", 4) == 0.75


@settings(max_examples=200, deadline=None)
@given(w=st.integers(2, 16), g=st.floats(1e-6, 1e-2), p=st.floats(1e-7, 1e-2))
def test_pipeline_bounded_by_overlap_limit(w, g, p):
    """Per-op overlap speedup ≤ (t_comp + t_comm) / max(t_comp, t_comm) (no concurrency, no
    overheads)."""
    comp, comm = w * g, (w - 1) * p
    for fused in (
        F.t_ag_gemm_gpu_s(w, g, g, comp, p, 0.0, 0.0),
        F.t_gemm_rs_gpu_s(w, g, g, comp, p, 0.0, 0.0),
    ):
        assert fused >= max(comp, comm) * (1 - 1e-12)
        assert (comp + comm) / fused <= (comp + comm) / max(comp, comm) + 1e-12


@settings(max_examples=200, deadline=None)
@given(
    w=st.integers(2, 16),
    g=st.floats(1e-6, 1e-2),
    p=st.floats(1e-7, 1e-2),
    e1=st.floats(0.0, 1.0),
    e2=st.floats(0.0, 1.0),
)
def test_exposed_pulls_only_slow_gemm_rs_and_never_past_serial(w, g, p, e1, e2):
    """More exposed pulls never speed GEMM+RS up, and ε = 1 is the GEMMs and the pulls one after the
    other."""
    lo, hi = sorted((e1, e2))
    t = [F.t_gemm_rs_gpu_s(w, g, g, w * g, p, 0.0, 0.0, e) for e in (lo, hi, 1.0)]
    assert t[0] <= t[1] * (1 + 1e-12) and t[2] == pytest.approx(w * g + (w - 1) * p)


@settings(max_examples=100, deadline=None)
@given(
    m=st.integers(1, 70000),
    n=st.sampled_from([1280, 2560, 8192, 14336]),
    k=st.sampled_from([2048, 8192]),
)
def test_gemm_time_never_below_peak_and_monotone_in_hbm(m, n, k):
    kw = dict(
        peak_flops_per_s=989e12,
        max_efficiency=0.8,
        mem_efficiency=0.85,
        tile_m=128,
        tile_n=256,
        sm_count=132,
        launch_overhead_s=2e-6,
        in_bytes=2,
        w_bytes=2,
        out_bytes=2,
    )
    t = F.t_gemm_s(m, n, k, hbm_bw_bytes_per_s=3.35e12, **kw)
    assert t >= F.gemm_flops(m, n, k) / (989e12 * 0.8)
    assert F.t_gemm_s(m, n, k, hbm_bw_bytes_per_s=6.7e12, **kw) <= t + 1e-15


def _docs_sections() -> set:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "model.md").read_text()
    return set(re.findall(r"^#+ (\d+[a-z]?(?:\.\d+)?)[. ]", text, re.M))


def _public_docstrings(path):
    """(qualified name, docstring) of a module and its public functions, classes and methods."""
    import ast

    out = []

    def walk(node, prefix):
        for n in ast.iter_child_nodes(node):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if n.name.startswith("_"):
                    continue
                doc = ast.get_docstring(n)
                if doc is not None:
                    out.append((f"{path.name}:{prefix}{n.name}", doc))
                if isinstance(n, ast.ClassDef):
                    walk(n, f"{prefix}{n.name}.")

    tree = ast.parse(path.read_text(encoding="utf-8"))
    if ast.get_docstring(tree) is not None:
        out.append((f"{path.name}:<module>", ast.get_docstring(tree)))
    walk(tree, "")
    return out


def _docstring_problems(path, heads) -> tuple[list, int]:
    """(name and what is wrong, for each public docstring of one module that is not one line naming
    a section among `heads`; how many docstrings were checked)."""
    import re

    docs = _public_docstrings(path)
    problems = []
    for name, doc in docs:
        cites = re.findall(r"§(\d+[a-z]?(?:\.\d+)?)", doc)
        if "\n" in doc.strip():
            problems.append((name, "more than one line"))
        elif not cites or not all(c in heads for c in cites):
            problems.append((name, f"cites {cites}"))
    return problems, len(docs)


def test_each_public_costmodel_docstring_is_one_line_pointing_to_its_section():
    """House style (issue 57 item 6): a public costmodel docstring is one line that names the
    docs/model.md section it comes from, and that section exists; the formulas are among them."""
    from pathlib import Path

    heads = _docs_sections()
    root = Path(__file__).resolve().parents[1] / "costmodel"
    checked = {}
    for path in sorted(root.glob("*.py")):
        problems, checked[path.name] = _docstring_problems(path, heads)
        assert not problems, problems
    assert checked.get("formulas.py", 0) >= 50 and sum(checked.values()) >= 400


def test_the_docstring_check_fails_on_a_paragraph_or_a_missing_section(tmp_path):
    """The check above reads what it should: a two-line docstring, and a pointer to a section
    docs/model.md lacks, are both caught; a private name is skipped."""
    mod = tmp_path / "m.py"
    mod.write_text(
        'def a():\n    """One.\n\n    Two."""\n\n\ndef b():\n    """Beyond (§99)."""\n'
        '\n\ndef _c():\n    """Private.\n\n    Skipped."""\n'
    )
    problems, checked = _docstring_problems(mod, _docs_sections())
    assert checked == 2
    assert problems == [("m.py:a", "more than one line"), ("m.py:b", "cites ['99']")]
