"""Architecture IIa: one per-rank layer description, one home per formula, no private names across modules, and
plots checked by what they draw. Expectations are hand values, not the code's own output."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from costmodel.layer import LayerSpec
from costmodel.shapes import load_model
from integration.cli import main

ROOT = Path(__file__).resolve().parents[1]
MOE = str(ROOT / "tests" / "fixtures" / "moe-tiny" / "config.json")
CODE = [p for d in ("costmodel", "calib", "integration", "tools", "benchmarks") for p in (ROOT / d).rglob("*.py")]


def test_llama70b_tp4_slots_by_hand():
    """Llama-3.1-70B: H 8192, 64 heads of 128, 8 KV heads, intermediate 28672; TP 4 (vLLM's sharding)."""
    spec = LayerSpec.build(load_model("llama-3.1-70b"), 4, "fp8")
    got = {s.name: (s.n, s.k, s.fuses) for s in spec.slots}
    assert got == {"qkv": ((16 + 2 * 2) * 128, 8192, "ag_gemm"), "o": (8192, 16 * 128, "gemm_rs"),
                   "gate_up": (2 * 7168, 8192, "ag_gemm"), "down": (8192, 7168, "gemm_rs")}
    assert [s.name for s in spec.slots] == ["qkv", "o", "gate_up", "down"]  # execution order
    assert spec.slot("qkv").in_bytes == 1.0 and spec.slot("o").out_bytes == 2.0  # fp8 in, bf16 partials out
    assert spec.reduce_msg_bytes(64) == 64 * 8192 * 2
    assert LayerSpec.build(load_model("llama-3.1-70b"), 16, "bf16").kv_heads_per_rank == 1  # replicated below 1


def test_moe_fixture_slots_by_hand():
    """Mixtral-style fixture: 8 experts top-2, expert intermediate 14336: router replicated, experts unfused."""
    spec = LayerSpec.build(load_model(MOE), 4, "bf16")
    assert [s.name for s in spec.slots] == ["qkv", "o", "router"]
    assert spec.slot("router").n == 8 and spec.slot("router").fuses is None
    assert spec.intermediate_per_rank == 14336 // 4
    assert ("expert_gate_up", 2 * 3584, 4096, None) in spec.rank_gemms()


def test_validate_refuses_moe_in_one_line(tmp_path, one_line_error):
    one_line_error("validate", "--gpu", "h100-sxm", "--model", MOE, "--device", "cpu", "--nproc", "2",
                   "--out", str(tmp_path / "v.csv"), needle="is MoE (8 experts, top-2); validate times a dense layer")


# Each physics or table that must have one home: (pattern, the files allowed to hold it)
ONE_HOME = [
    (r'"bf16":\s*2\.0', {"costmodel/ops.py"}),  # bytes per dtype: DTYPE_MODES
    (r'"fp8":\s*1\.0', {"costmodel/ops.py"}),
    (r"intermediate\s*//", {"costmodel/layer.py"}),  # per-rank shapes: LayerSpec
    (r"num_heads\s*//", {"costmodel/layer.py"}),
    (r'"all_reduce" if', set()),  # the bus factor branches in formulas.bus_bw_factor only
    (r"4\.0 if dtype", set()),
    (r"internode_bw_bytes_per_s\)", {"costmodel/formulas.py", "costmodel/profile.py"}),  # the domain cap
    (r"rms_norm_bytes\(", {"costmodel/model.py", "costmodel/ops.py", "costmodel/formulas.py"}),  # AR + norm unit
    (r"CUSTOM_ALL_REDUCE_MAX_SIZES\s*=|_FI_ALLREDUCE_ONE_SHOT_MAX_SIZES_MB\s*=|SM90\s*=\s*dict", set()),  # vllm_tables
    (r"def least_squares|from scipy.optimize import least_squares", {"calib/fit.py"}),  # one fitting core
    # vLLM's behaviour: its source cited by line, its constants and switches, in one module
    (r"l\. ?\d{2,}|\.py:\d+", {"costmodel/vllm_tables.py"}),
    (r"(KERNEL_MIN_M|CUDAGRAPH_MAX_TOKENS_\w+|FIRST_WITHOUT_SP|FIRST_WITH_KERNEL|MUSE_SPARK_\w+|SP_MIN_\w+)\s*=",
     {"costmodel/vllm_tables.py"}),
]


def _outside_home(pattern: str, homes: set, files, root) -> set:
    """The files holding `pattern` that are not its home (paths relative to `root`)."""
    rx = re.compile(pattern)
    return {str(p.relative_to(root)) for p in files if rx.search(p.read_text())} - homes


@pytest.mark.parametrize("pattern,homes", ONE_HOME)
def test_one_home(pattern, homes):
    out = _outside_home(pattern, homes, CODE, ROOT)
    assert not out, f"{pattern!r} outside its home {sorted(homes)}: {sorted(out)}"


def test_the_one_home_test_can_fail(tmp_path):
    """A copy of the code with a second home planted for each meaning: the scanner reports every one of them."""
    import shutil

    for d in ("costmodel", "calib", "integration"):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__", "data"))
    planted = {r'"bf16":\s*2\.0': 'b = {"bf16": 2.0}\n', r"l\. ?\d{2,}|\.py:\d+": "# gemm_rs_ar.py l. 982\n",
               r"def least_squares|from scipy.optimize import least_squares": "from scipy.optimize import least_squares\n"}
    (tmp_path / "integration" / "second_home.py").write_text("".join(planted.values()))
    files = [p for d in ("costmodel", "calib", "integration") for p in (tmp_path / d).rglob("*.py")]
    for pattern, homes in ONE_HOME:
        out = _outside_home(pattern, homes, files, tmp_path)
        assert out == ({"integration/second_home.py"} if pattern in planted else set()), pattern


def test_no_private_name_crosses_a_module():
    imp = re.compile(r"^\s*from\s+\S+\s+import\s+.*\b_[a-z]\w*", re.M)
    offenders = [str(p.relative_to(ROOT)) for p in CODE if imp.search(p.read_text())]
    assert not offenders, offenders
    vllm_private = [str(p.relative_to(ROOT)) for p in CODE if re.search(r"\w\._WORLD_SIZES_MULTIMEM", p.read_text())]
    assert not vllm_private, vllm_private  # read through calib.distbench.multimem_world_sizes only


def test_multimem_adapter_reads_vllm_or_falls_back():
    from calib.distbench import multimem_world_sizes

    class Fake:  # a communicator as vLLM's SymmMemCommunicator exposes it
        _WORLD_SIZES_MULTIMEM = {"9.0": [2]}
        device_capability = "9.0"

    class Renamed:  # a release without the table: costmodel.vllm_tables' copy of vLLM's
        device_capability = "9.0"

    assert multimem_world_sizes(Fake()) == [2]
    assert multimem_world_sizes(Renamed()) == [4, 6, 8]


def test_whatif_plot_series_content():
    pytest.importorskip("matplotlib")
    from costmodel import RunConfig, analyse, load_profile
    from costmodel.plot import whatif_series

    a = analyse(load_profile("h100-sxm"), load_model("llama-3.1-70b"), RunConfig(4, "bf16"), band=False)
    s = whatif_series(a)
    n = s["num_tokens"]
    assert n[0] == 4 and n[-1] == 65536 and np.all(n % 4 == 0) and np.all(np.diff(n) > 0)
    assert s["cutoff_tokens"] == a.cutoff_tokens and s["margin_line"] == pytest.approx(1.02)
    # the curve at some of its points is whatif's table row at those N (analyse's own table prediction)
    picks = [int(n[i]) for i in (0, len(n) // 2, len(n) - 2, len(n) - 1)]
    b = analyse(load_profile("h100-sxm"), load_model("llama-3.1-70b"), RunConfig(4, "bf16"), band=False, tokens=picks)
    tab = {int(x): float(v) for x, v in zip(b.table.num_tokens, b.table.speedup_sp_asynctp)}
    for x in picks:
        assert s["speedup_sp_asynctp"][int(np.flatnonzero(n == x)[0])] == pytest.approx(tab[x], rel=1e-12)
    # decode-sized batches lose, long prefills win (the README's sample: 0.2x at small N, > 1 at 65536)
    assert s["speedup_sp_asynctp"][0] < 0.5 and s["speedup_sp_asynctp"][-1] > 1.0


def test_whatif_plot_series_nan_where_no_schedule():
    from costmodel import RunConfig, analyse, load_profile
    from costmodel.plot import whatif_series

    a = analyse(load_profile("h100-sxm"), load_model("llama-3.1-70b"), RunConfig(16, "bf16"), band=False)
    s = whatif_series(a)
    assert np.all(np.isnan(s["speedup_sp_asynctp"])) and np.all(s["speedup_sp"] > 0)


def test_evaluation_series_content(tmp_path, capsys):
    from costmodel.evaluate import evaluate_files, evaluation_series

    f = tmp_path / "ops.csv"
    f.write_text("hardware,tp,op,dtype,m,n,k,baseline_us,overlap_us,source\n"
                 "h100-sxm,8,gemm_rs,bf16,512,4096,14336,133.653,613.784,x\n"
                 "h100-sxm,8,gemm_rs,bf16,65536,8192,28672,1000,500,x\n")
    scored, _ = evaluate_files([str(f)])
    s = evaluation_series(scored)
    assert s["measured"] == pytest.approx([133.653 / 613.784, 2.0])
    assert s["predicted"][0] < 1.0  # KRAKEN_PR19's M = 512 row: a slowdown, predicted so
    assert not s["wrong"][0]


def test_cutoff_is_the_argmin_by_brute_force():
    """The cutoff against an independent brute force: for every threshold, sum the schedule each N would run."""
    from costmodel import RunConfig, analyse, load_profile, predict
    from costmodel.analysis import token_grid

    prof, shape = load_profile("h100-sxm"), load_model("llama-3.1-70b")
    a = analyse(prof, shape, RunConfig(4, "bf16"), band=False)
    grid = token_grid(4, 8192)
    pred = predict(prof, shape, 4, "bf16", grid)
    off, on = pred.t_forward_s("tp"), pred.t_forward_s("sp_asynctp") * 1.02
    costs = []
    for i in range(grid.size + 1):  # threshold grid[i] (i = size: never)
        costs.append(sum(float(off[j]) if j < i else float(on[j]) for j in range(grid.size)))
    best = min(range(len(costs)), key=lambda i: (costs[i], -i))  # ties to the larger threshold
    assert a.cutoff_tokens == (None if best == grid.size else int(grid[best]))


def test_typed_profile_equals_the_toml_text():
    """Typed fields against the TOML file parsed independently (tomllib), not against the profile's own values()."""
    import tomllib

    from costmodel.profile import load_profile

    t = tomllib.loads((ROOT / "costmodel" / "profiles" / "h100-sxm.toml").read_text())
    p = load_profile("h100-sxm")
    assert p.identity.sm_count == t["identity"]["sm_count"] == 132
    assert p.memory.hbm_bw_bytes_per_s == t["memory"]["hbm_bw_bytes_per_s"] == 3.35e12
    assert p.interconnect.link_bw_bytes_per_s == t["interconnect"]["link_bw_bytes_per_s"]
    assert p.collectives["nccl_all_reduce"][4].bus_bw_bytes_per_s == \
        t["collectives"]["nccl_all_reduce"]["tp4"]["bus_bw_bytes_per_s"]
    assert p.asynctp.barrier_s == t["asynctp"]["_sync"]["barrier_s"]


def test_whatif_json_uses_the_layer(capsys):
    """--ops names each GEMM by its slot's shape: the qkv GEMM at N = 64 is 2·64·2560·8192 FLOP (by hand)."""
    assert main(["whatif", "--ops", "64", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    qkv = next(r for r in d["ops"]["tp"] if r["op"] == "qkv_gemm")
    assert qkv["achieved_flops_per_s"] * qkv["t_s"] == pytest.approx(2 * 64 * 2560 * 8192)


def test_cli_lives_in_one_package_and_imports_calib_lazily():
    """No argparse in costmodel; the CLI root imports neither calib nor torch nor vllm (fresh interpreter)."""
    import subprocess
    import sys

    assert not [p for p in (ROOT / "costmodel").rglob("*.py") if "argparse" in p.read_text()]
    code = ("import sys, integration.cli; "
            "print(sorted(m for m in ('calib', 'torch', 'vllm', 'scipy') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert r.stdout.strip() == "[]", r.stdout


def test_every_package_is_shipped():
    """pyproject's package list names every package folder (a non-editable `pip install .` ships only those)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {str(p.parent.relative_to(ROOT)).replace("/", ".") for d in ("costmodel", "calib", "integration")
             for p in (ROOT / d).rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)


def test_no_public_function_takes_more_than_eight_parameters():
    """The run configuration travels typed (model.RunConfig, Regime; recommend.UserChoices; ops.KernelGemm), not as
    loose keywords: no public function or method of costmodel, calib or integration takes more than 8 parameters
    (costmodel/formulas.py is exempt: each argument is a named physical input)."""
    import ast

    over = []
    for p in CODE:
        rel = str(p.relative_to(ROOT))
        if not rel.startswith(("costmodel/", "calib/", "integration/")) or rel == "costmodel/formulas.py":
            continue

        def visit(body, rel=rel):
            for node in body:
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):  # a private class's are private
                    visit(node.body)
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                    a = node.args
                    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
                    n = len(names) - (1 if names[:1] in (["self"], ["cls"]) else 0)
                    if n > 8:
                        over.append(f"{rel}:{node.lineno} {node.name} ({n})")

        visit(ast.parse(p.read_text()).body)
    assert not over, over
