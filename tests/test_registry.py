"""The fused-op registry carries its callables (issue 57 item 1): a made-up implementation is one
entry plus its predictor, and `tpcost op`, `tpcost evaluate`, `tpcost vllm-config` and `tpcost
whatif` use it with no other file touched; nothing outside the registry tests which implementation
it holds; costmodel has no import circle."""

import ast
import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

from costmodel import fused_ops, ops
from integration.cli import main

ROOT = Path(__file__).resolve().parents[1]
T_FIXED_S = 7e-6


@dataclasses.dataclass(frozen=True)
class MadeUp(fused_ops.FusedOpKind):
    """A made-up GEMM+RS or GEMM+AR: the GEMM and NCCL's collective overlapped whole, 10 % slower,
    plus a fixed cost."""

    def arms(self, profile, spec, m):
        hw = ops.Hw(profile, spec.dtype)
        gemm = hw.t_gemm(m, spec.n, spec.k)
        t_coll = {
            "reduce_scatter": ops.t_nccl_reduce_scatter_s,
            "all_reduce": ops.t_nccl_all_reduce_s,
        }
        c = t_coll[self.collective](
            hw, spec.tp, np.asarray(m, dtype=float) * (spec.n * hw.act_bytes)
        )
        return fused_ops.Arms(
            np.maximum(gemm, c) * 1.1 + T_FIXED_S,
            gemm + c,
            f"NCCL {self.collective}",
            np.full(np.shape(m), f"nccl_{self.collective}"),
            None,
        )


@pytest.fixture
def made_up(monkeypatch):
    k = MadeUp(
        "gemm_rs",
        "made_up",
        "reduce_scatter",
        ("bf16",),
        "a made-up overlap (tests/test_registry.py)",
    )
    monkeypatch.setitem(fused_ops.REGISTRY, ("gemm_rs", "made_up"), k)
    return k


def _predicted(k, tp, m, n, kk):
    from costmodel.profile import load_profile

    spec = fused_ops.OpSpec("gemm_rs", "made_up", tp, n, kk, "bf16", 0)
    return k.arms(load_profile("h100-sxm"), spec, np.asarray(m, dtype=float))


def test_op_prices_a_made_up_implementation(made_up, capsys):
    argv = [
        "op",
        "--gpu",
        "h100-sxm",
        "--tp",
        "4",
        "--op",
        "gemm_rs",
        "--impl",
        "made_up",
        "--n",
        "8192",
        "--k",
        "2048",
        "--calls-per-forward",
        "3",
        "--at",
        "256",
    ]
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    m = np.array([r["m"] for r in d["rows"]], dtype=float)
    assert m[0] == 128 and np.all(m % 128 == 0)  # no small rows: the entry declares none
    a = _predicted(made_up, 4, m, 8192, 2048)
    assert [r["t_fused_s"] for r in d["rows"]] == pytest.approx(list(3 * a.fused_s), rel=1e-12)
    assert [r["t_unfused_s"] for r in d["rows"]] == pytest.approx(list(3 * a.unfused_s), rel=1e-12)
    assert (
        d["impl"] == "made_up"
        and d["vllm_rule_tokens"] is None
        and "does not run gemm_rs (made_up)" in d["vllm_rule"]
    )
    assert not any(r["vllm_runs_kernel"] for r in d["rows"])
    wins = a.unfused_s > a.fused_s
    assert d["cutoff_tokens"] is None or wins[m == d["cutoff_tokens"]][0]
    assert d["breakdown"]["fused"] == {
        "t_s": pytest.approx(
            float(_predicted(made_up, 4, [256.0], 8192, 2048).fused_s[0]), rel=1e-12
        ),
        "bound": "fused op",
    }
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert (
        "op: gemm_rs (made_up)" in out
        and "\n  fused " in out
        and "vLLM runs it  unfused collective" in out
    )


def test_evaluate_scores_a_made_up_implementation(made_up, tmp_path, capsys):
    csv = tmp_path / "rows.csv"
    csv.write_text(
        "hardware,tp,op,impl,dtype,m,n,k,baseline_us,overlap_us,source\n"
        "h100-sxm,8,gemm_rs,made_up,bf16,4096,8192,3584,500,450,hand-made\n"
    )
    assert main(["evaluate", str(csv), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    a = _predicted(made_up, 8, [4096.0], 8192, 3584)
    assert row["s_predicted"] == pytest.approx(float(a.unfused_s[0] / a.fused_s[0]), rel=1e-12)
    assert " made_up " in row["label"]


def test_vllm_config_prices_a_made_up_kernel_of_a_release(monkeypatch, capsys):
    """A release whose kernel record names the made-up entry: vllm-config's switch prices every call
    site through it (the expected times per forward are the entry's arms under the release's own
    rule)."""
    from costmodel import vllm_tables as T
    from costmodel.defaults import DEFAULT_BUDGET_TOKENS
    from costmodel.workload import weights_on

    op = "gemm_ar"
    k = MadeUp(op, "made_up", "all_reduce", ("bf16",), "a made-up kernel (tests/test_registry.py)")
    monkeypatch.setitem(fused_ops.REGISTRY, (op, "made_up"), k)
    cur = T.current()
    v = (cur.version[0], cur.version[1] + 1)
    monkeypatch.setitem(
        T.RELEASES,
        v,
        dataclasses.replace(
            cur,
            version=v,
            serves_from=v,
            wheel="made up for the test",
            kernel=dataclasses.replace(cur.kernel, impl="made_up"),
        ),
    )
    argv = [
        "vllm-config",
        "--model",
        str(ROOT / "data/reference/models/kimi-k3.config.json"),
        "--gpu",
        "b200",
        "--tp",
        "8",
        "--kernel-op",
        op,
        "--vllm-version",
        f"{v[0]}.{v[1]}",
        "--json",
    ]
    assert main(argv) == 0
    ks = json.loads(capsys.readouterr().out)["kernel_switch"]
    from costmodel.profile import load_profile

    prof = load_profile("b200")
    n_tok = np.arange(1, DEFAULT_BUDGET_TOKENS + 1, dtype=float)
    w = weights_on(None, n_tok)
    runs = n_tok >= cur.kernel.min_m
    assert ks["sites"]
    for site in ks["sites"]:
        spec = fused_ops.OpSpec(op, "made_up", 8, site["n"], site["k"], "bf16", 0)
        a = k.arms(prof, spec, n_tok)
        calls = site["calls_per_forward"]
        assert site["expected_off_s"] == pytest.approx(
            float(np.sum(w * a.unfused_s)) * calls, rel=1e-9
        )
        assert site["expected_on_s"] == pytest.approx(
            float(np.sum(w * np.where(runs, a.fused_s, a.unfused_s))) * calls, rel=1e-9
        )
    monkeypatch.delitem(fused_ops.REGISTRY, (op, "made_up"))
    # the release names an entry nobody registered: one line, never torch's or the kernel's
    assert main(argv) == 2


def test_a_made_up_implementation_keeps_the_bad_input_contract(made_up, one_line_error, tmp_path):
    one_line_error(
        "op",
        "--gpu",
        "h100-sxm",
        "--tp",
        "4",
        "--op",
        "gemm_rs",
        "--impl",
        "made_up",
        "--n",
        "8192",
        "--k",
        "2048",
        "--dtype",
        "fp8",
        needle="gemm_rs (made_up) takes bf16, not fp8",
    )
    one_line_error(
        "op",
        "--gpu",
        "h100-sxm",
        "--tp",
        "4",
        "--op",
        "ag_gemm",
        "--impl",
        "made_up",
        "--n",
        "8192",
        "--k",
        "2048",
        needle="no fused ag_gemm in made_up",
    )


def test_unregistered_implementation_is_refused(one_line_error, tmp_path):
    one_line_error(
        "op",
        "--gpu",
        "h100-sxm",
        "--tp",
        "4",
        "--op",
        "gemm_rs",
        "--impl",
        "made_up",
        "--n",
        "8192",
        "--k",
        "2048",
        needle="--impl",
    )
    csv = tmp_path / "rows.csv"
    csv.write_text(
        "hardware,tp,op,impl,dtype,m,n,k,baseline_us,overlap_us,source\n"
        "h100-sxm,8,gemm_rs,made_up,bf16,4096,8192,3584,500,450,hand-made\n"
    )
    one_line_error("evaluate", str(csv), needle="impl must be one of torch, kernel")


_DISPATCH = re.compile(
    r"""impl\w*\s*[!=]=\s*["'](torch|kernel)["']|["'](torch|kernel)["']\s*[!=]=\s*\w*impl"""
    r"""|isinstance\([^)]*\b(TorchPipelined|SingleKernel)\b"""
)


def _dispatch_sites(text: str) -> list[str]:
    return [m.group(0) for m in _DISPATCH.finditer(text)]


def test_no_implementation_test_outside_the_registry():
    found = []
    for pkg in ("costmodel", "integration", "calib", "benchmarks", "tools"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path != ROOT / "costmodel" / "fused_ops.py":
                found += [
                    f"{path.relative_to(ROOT)}: {s}" for s in _dispatch_sites(path.read_text())
                ]
    assert not found, found
    assert _dispatch_sites('if spec.impl == "kernel":') and _dispatch_sites(
        "isinstance(k, fused_ops.SingleKernel)"
    )


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle of `graph` (module -> the modules it imports), each once, by depth-first
    search."""
    out, seen = [], set()
    for start in sorted(graph):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for dep in sorted(graph.get(node, ())):
                if dep == start and frozenset(path) not in seen:
                    seen.add(frozenset(path))
                    out.append(path + [start])
                elif dep not in path and dep > start:
                    stack.append((dep, path + [dep]))
    return out


def test_costmodel_has_no_import_circle():
    """Imports inside functions count: a lazy import is still a circle."""
    mods = {p.stem for p in (ROOT / "costmodel").glob("*.py")}
    graph = {}
    for p in (ROOT / "costmodel").glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("costmodel."):
                deps.add(node.module.split(".")[1])
        graph[p.stem] = deps & mods - {p.stem}
    assert not _cycles(graph), _cycles(graph)
    assert _cycles({"fused_ops": {"ops"}, "ops": {"fused_ops"}}) == [
        ["fused_ops", "ops", "fused_ops"]
    ]


def test_whatif_prices_the_asynctp_slots_through_the_release_entry(monkeypatch, capsys):
    """The layer's AsyncTP slots (vLLM <= 0.31) are priced by the entry the release names
    (Release.symm_mem_impl): a made-up release naming a made-up pipelined op moves whatif's
    SP+AsyncTP column by exactly that op's extra GPU time, and no other column."""
    from costmodel import vllm_tables as T

    extra_s = 50e-6

    @dataclasses.dataclass(frozen=True)
    class Slower(fused_ops.TorchPipelined):
        def pipelined(self, hw, rows, n, k, tp, eager):
            f = super().pipelined(hw, rows, n, k, tp, eager)
            return dataclasses.replace(f, t_gpu_s=f.t_gpu_s + extra_s, t_s=f.t_s + extra_s)

    for op in ("ag_gemm", "gemm_rs"):
        base = fused_ops.kind(op, "torch")
        monkeypatch.setitem(
            fused_ops.REGISTRY,
            (op, "slower"),
            Slower(op, "slower", base.collective, base.dtypes, "x"),
        )
    sp = T.newest_sp_release()
    v = (sp.version[0], 99)
    monkeypatch.setitem(
        T.RELEASES,
        v,
        dataclasses.replace(
            sp, version=v, serves_from=v, symm_mem_impl="slower", ep=T.current().ep
        ),  # the newest record: it carries the current EP rules too
    )
    argv = ["whatif", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--tp", "4", "--json"]
    argv += ["--no-band", "--tokens", "256"]  # below the capture size: graph replay, no host cost
    rows = {}
    for label in (sp.label, f"{v[0]}.{v[1]}"):
        assert main([*argv, "--vllm-version", label]) == 0
        rows[label] = json.loads(capsys.readouterr().out)["rows"][0]
    a, b = rows[sp.label], rows[f"{v[0]}.{v[1]}"]
    assert b["t_tp_s"] == a["t_tp_s"] and b["t_sp_s"] == a["t_sp_s"]
    layers = 32  # llama-3.1-8b: qkv and gate_up fuse AG+GEMM, o and down GEMM+RS: 4 slots a layer
    assert b["t_sp_asynctp_s"] - a["t_sp_asynctp_s"] == pytest.approx(
        4 * layers * extra_s, rel=1e-6
    )
