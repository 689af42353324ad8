"""tools/build_profiles.py assembles the built-in profiles from datasheet values and committed fit
results; a GPU check's data enters only when committed and named with --gpu-check."""

from __future__ import annotations

import json

import pytest

from costmodel.formulas import GiB, MiB
from tools import build_profiles as B


@pytest.mark.parametrize(
    "make,needle",
    [
        (lambda p: p / "nothing-here", "expected calib/data/<built-in profile>-gpu-check"),
        (lambda p: p / "h200-sxm-gpu-check", "no fit.json"),
    ],
)
def test_gpu_check_bad_dirs_exit_2(tmp_path, capsys, make, needle):
    d = make(tmp_path)
    d.mkdir()
    assert B.main(["--check", "--gpu-check", str(d)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err


def test_an_untracked_gpu_check_is_refused(tmp_path, capsys):
    """A fit.json git does not track never changes a built-in profile, even when named."""
    d = tmp_path / "h200-sxm-gpu-check"
    d.mkdir()
    (d / "fit.json").write_text(json.dumps({"provenance": {}, "params": {}}))
    assert B.main(["--check", "--gpu-check", str(d)]) == 2
    assert "is not committed" in capsys.readouterr().err


def test_nothing_is_folded_unless_named():
    """Without --gpu-check no profile value is calibrated (the built-ins hold published data and
    datasheets)."""
    from costmodel.profile import profile_from_dict

    for name, tree in B.build_all().items():
        p = profile_from_dict(tree, name)
        assert not [k for k, v in p.provenance.items() if v.tier == "calibrated"], name


def test_the_builder_imports_no_fitting_code():
    """The builder reads the assembler (calib.assemble), which reads the spec files (calib.specs),
    committed results (calib.results), the named fits' tables (calib.tables), the fused-op sections
    (calib.sections) and the derivations (calib.derive): tree transforms
    on committed results, nothing else from calib: no scipy, no refit (--refit imports the fits only
    when asked)."""
    import ast

    from calib import assemble as A
    from calib import derive as D
    from calib import sections as S
    from calib import specs as SP
    from calib import tables as T

    modules = (
        "calib",
        "calib.results",
        "calib.derive",
        "calib.tables",
        "calib.sections",
        "calib.specs",
    )
    for path, allowed in (
        (B.__file__, ("calib", "calib.assemble")),
        (A.__file__, modules),
        (SP.__file__, ("calib", "calib.results", "calib.derive", "calib.tables")),
        (T.__file__, ("calib", "calib.derive")),
        (S.__file__, ("calib", "calib.results", "calib.derive")),
        (D.__file__, ("calib", "calib.results")),
    ):
        tree = ast.parse(open(path).read())
        mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        calib = {
            f"{n.module}.{a.name}" if n.module == "calib" else n.module
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("calib")
            for a in n.names
        }
        calib |= {m for m in mods if m.startswith("calib.")}
        assert calib <= set(allowed), (path, calib)
        assert not {m for m in mods if m.split(".")[0] in ("scipy", "numpy")}, path


def test_datasheet_values_other_than_the_fits_inputs_are_refused(monkeypatch, capsys):
    """A GEMM fit ran at a GPU's peak, HBM bandwidth and SM count: a builder whose datasheet differs
    is refused in one line naming the command that refits."""
    from calib import results as CR

    comps = CR.load_components()
    comps["inputs"]["H100"] = {**comps["inputs"]["H100"], "sm_count": 114}
    monkeypatch.setattr(CR, "load_components", lambda: comps)
    assert B.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "H100 datasheet values" in err
        and "python -m calib.components" in err
    )


# (profile, impl, source_id, metric, message bytes or None for a 16 GiB busBW row, row filter,
# relative tolerance)
PUBLISHED = [
    # NCCL's ring all-gather / reduce-scatter: LL and Simple regimes (calib.fit.fit_ring_regimes,
    # #29)
    ("h100-sxm", "nccl_all_gather", "MEGATRON_PR5596", "allgather_time", 2 * MiB, "2 MiB", 0.10),
    ("h100-sxm", "nccl_all_gather", "MEGATRON_PR5596", "allgather_time", 32 * MiB, "32 MiB", 0.10),
    (
        "h100-sxm",
        "nccl_all_gather",
        "MEGATRON_PR5596",
        "allgather_time",
        128 * MiB,
        "128 MiB",
        0.10,
    ),
    (
        "h100-sxm",
        "nccl_reduce_scatter",
        "MEGATRON_PR5596",
        "reducescatter_time",
        2 * MiB,
        "2 MiB",
        0.05,
    ),
    (
        "h100-sxm",
        "nccl_reduce_scatter",
        "MEGATRON_PR5596",
        "reducescatter_time",
        8 * MiB,
        "8 MiB",
        0.05,
    ),
    (
        "h100-sxm",
        "nccl_reduce_scatter",
        "MEGATRON_PR5596",
        "reducescatter_time",
        32 * MiB,
        "32 MiB",
        0.05,
    ),
    (
        "h100-sxm",
        "nccl_all_reduce",
        "TD_ISSUE57",
        "allreduce_time_nccl",
        16e6,
        "payload 16MB",
        0.10,
    ),
    ("b200", "nccl_all_reduce", "MLENG_NET_README", "all_reduce_peak_busbw", None, "", 0.15),
    ("b200", "nccl_all_gather", "MLENG_NET_README", "all_gather_peak_busbw", None, "", 0.01),
    (
        "b200",
        "nccl_reduce_scatter",
        "MLENG_NET_README",
        "reduce_scatter_peak_busbw",
        None,
        "",
        0.01,
    ),
    (
        "b200",
        "nccl_all_gather",
        "MLENG_NET_README",
        "all_gather_latency_median",
        1024,
        "1KiB",
        0.01,
    ),
    (
        "b200",
        "nccl_reduce_scatter",
        "MLENG_NET_README",
        "reduce_scatter_latency_median",
        1024,
        "1KiB",
        0.01,
    ),
]


@pytest.mark.parametrize("name,impl,sid,metric,size,needle,tol", PUBLISHED)
def test_builtin_curves_reproduce_the_rows_they_were_fitted_to(
    name, impl, sid, metric, size, needle, tol
):
    """An independent truth for the assembled profiles: each built-in NCCL all-gather and
    reduce-scatter as the model runs it (the lower envelope of its regime curves, read from the
    TOML), and each all-reduce curve, gives the published measurement it stands for (a wrong fit, a
    wrong unit or a wrong assembly step fails here)."""
    from calib.reference import rows
    from costmodel import formulas as F
    from costmodel import ops
    from costmodel.profile import load_profile

    r = next(
        r
        for r in rows(sid, metric=metric, gpu=lambda g: g.startswith(name[:4].upper()))
        if needle in r["notes"]
    )
    prof = load_profile(name)
    hw = ops.Hw(prof, "bf16")
    op = impl.removeprefix("nccl_")

    # the curve fitted to the row; H100's regimes are H200's (assumed), scored as
    def all_reduce_curve(hw, w, S):
        # out-of-sample in docs/accuracy.md
        return F.t_all_reduce_s(S, *prof.collective(impl, w), w)

    t_fn = {
        "all_reduce": all_reduce_curve,
        "all_gather": ops.t_nccl_all_gather_s,
        "reduce_scatter": ops.t_nccl_reduce_scatter_s,
    }[op]
    if size is None:  # a busBW at 16 GiB (GB/s): nccl-tests' busBW = factor * S / t
        S = 16 * GiB
        got = float(F.bus_bw_factor(op, 8)) * S / float(t_fn(hw, 8, S)) / 1e9
    else:
        got = float(t_fn(hw, 8, float(size))) * 1e6
    assert got == pytest.approx(float(r["baseline_value"]), rel=tol), (got, r["baseline_value"])


def test_the_committed_tomls_are_the_assembly_of_the_committed_fits(capsys):
    """What catches a hand-edited TOML or a fit committed without rebuilding: --check assembles from
    the committed results and compares (the fits themselves are checked against the released rows in
    test_calib_reference.py and above)."""
    assert B.main(["--check"]) == 0, capsys.readouterr().out


def test_the_builders_derivations_are_named_and_hold_their_physics():
    """calib/derive.py (issue 48 item 1, in part): the derivations the builder applies, each tested
    on its own."""
    import copy

    from calib import derive as D

    t = D.sec("src", "assumed", latency_s=1.234567e-5, bus_bw_bytes_per_s=3e11)
    assert t == {
        "latency_s": 1.235e-05,
        "bus_bw_bytes_per_s": 3e11,
        "source": "src",
        "tier": "assumed",
    }
    base = {"interconnect": {"link": 1.0}, "gemm": {"x": 2.0}}
    d = D.derive(base, {"interconnect.link": 3.0, "gemm": lambda g: {**g, "x": g["x"] * 2}})
    assert d == {"interconnect": {"link": 3.0}, "gemm": {"x": 4.0}} and base["gemm"]["x"] == 2.0
    coll = {
        "nccl_all_reduce": {
            "tp8": D.sec("a; b", "assumed", latency_s=2e-5, bus_bw_bytes_per_s=1e11)
        }
    }
    sc = D.scaled_collectives(coll, 2.0, "why", lat_add=1e-6)
    assert sc["nccl_all_reduce"]["tp8"]["bus_bw_bytes_per_s"] == 2e11
    assert sc["nccl_all_reduce"]["tp8"]["latency_s"] == pytest.approx(2.1e-5)
    ring = copy.deepcopy(sc)
    ring["nccl_all_gather"] = {
        "tp8": D.sec("g", "assumed", latency_s=1e-5, bus_bw_bytes_per_s=1.5e11)
    }
    D.one_ring(ring)  # a ring all-reduce is a reduce-scatter then an all-gather: the ring's busBW
    assert ring["nccl_all_reduce"]["tp8"]["bus_bw_bytes_per_s"] == 1.5e11
    assert ring["nccl_all_reduce"]["tp8"]["latency_s"] == sc["nccl_all_reduce"]["tp8"]["latency_s"]
    # MLENG_NET_SHARP's NVLS multimem rates: B200's is the kernel fit's floor, read from the
    # reference rows there
    from calib.kernel_fit import ETA_NVLS

    assert D.nvls_multimem_efficiency("nvlink5") == pytest.approx(ETA_NVLS, rel=1e-9)
    assert 0.9 < D.nvls_multimem_efficiency("nvlink4") / ETA_NVLS < 1.2
    # the custom reduce-scatter backends from physics: never below the one-stage custom AR's latency
    # or a faster Lamport one-shot's, at the ring's link fraction
    tree = {
        "identity": {"compute_capability": "10.0"},
        "interconnect": {"kind": "nvswitch", "link_bw_bytes_per_s": 900e9, "multicast": 1},
        "fused_kernel": {"_link_efficiency": {"link_efficiency": 0.6}},
        "collectives": {
            "custom_ar_1stage": {
                "tp8": D.sec("ar", "assumed", latency_s=9e-6, bus_bw_bytes_per_s=1e11)
            },
            "flashinfer_ar_rmsnorm": {
                "tp8": D.sec("fi", "assumed", latency_s=7e-6, bus_bw_bytes_per_s=1e11)
            },
        },
    }
    out = D.custom_reduce_scatter(tree)
    rs = out["collectives"]["custom_rs_lamport"]["tp8"]
    assert rs["latency_s"] == 7e-6 and rs["bus_bw_bytes_per_s"] == pytest.approx(
        D.RING * 900e9, rel=1e-3
    )
    assert out["collectives"]["custom_ag_lamport"]["tp8"]["latency_s"] == 7e-6
    mm = out["collectives"]["custom_rs_multimem"]["tp8"]  # (W-1)/W x eta x link
    assert mm["bus_bw_bytes_per_s"] == pytest.approx(7 / 8 * 0.6 * 900e9, rel=1e-3)
    # a copy: the input tree is left as it was
    assert "custom_rs_lamport" not in tree["collectives"]


def test_a_gpu_is_one_spec_file(tmp_path, capsys):
    """Issue 48: a GPU with datasheet values is one spec file and no code. A made-up Hopper part
    (half the H100's SMs and HBM bandwidth, the H800's link) built from a spec alone, through the
    builder's own CLI: its profile loads, holds the spec's values, carries the inherited fits marked
    as such, and the model prices it."""
    import tomllib

    from costmodel import formulas as F
    from costmodel import ops
    from costmodel.profile import profile_from_dict

    specs, out = tmp_path / "specs", tmp_path / "out"
    specs.mkdir()
    out.mkdir()
    (specs / "h50.toml").write_text("""
name = "h50"
inherits = "h100-sxm"

[[step]]
update = "identity"
[step.values]
name = "h50"
display_name = "Made-up H50"
device_name_patterns = "H50"
sm_count = 66
source = "a made-up datasheet"

[[step]]
set = "memory"
[step.table]
hbm_bw_bytes_per_s = 1.675e12
source = "a made-up datasheet"
tier = "datasheet"

[[step]]
update = "interconnect"
[step.values]
link_bw_bytes_per_s = 200e9
source = "a made-up link"

[[step]]
scale_collectives = "h100-sxm"
keep = ["nccl_all_reduce", "nccl_all_gather", "nccl_reduce_scatter"]
why = "the made-up link over NVLink4"

[[step]]
one_ring = true

[[step]]
ring_pull = true

[fused]
family = "hopper"
terms = ["sync"]
carried = "= the H100 fit"

[capacity]
hbm_capacity_bytes = 40e9
source = "a made-up datasheet"
""")
    assert B.main(["--spec-dir", str(specs), "--out", str(out)]) == 0, capsys.readouterr()
    prof = profile_from_dict(tomllib.loads((out / "h50.toml").read_text()), "h50")
    assert prof.identity.sm_count == 66 and prof.memory.hbm_bw_bytes_per_s == 1.675e12
    assert prof.interconnect.link_bw_bytes_per_s == 200e9 and prof.memory.hbm_capacity_bytes == 40e9
    h100 = profile_from_dict(tomllib.loads((out / "h100-sxm.toml").read_text()), "h100-sxm")
    lat, bw = prof.collective("nccl_all_gather", 8)
    assert bw == pytest.approx(h100.collective("nccl_all_gather", 8)[1] * 200 / 450, rel=1e-3)
    # the H100 fit, carried and saying so
    assert prof.provenance["asynctp.barrier_s"].tier == "assumed"
    assert "= the H100 fit" in prof.provenance["asynctp.barrier_s"].source
    assert set(prof.collectives) == {"nccl_all_reduce", "nccl_all_gather", "nccl_reduce_scatter"}
    t = float(ops.t_nccl_all_gather_s(ops.Hw(prof, "bf16"), 8, 64 * F.MiB))
    # the slower link costs
    assert t > float(ops.t_nccl_all_gather_s(ops.Hw(h100, "bf16"), 8, 64 * F.MiB))
    # and checks as current
    assert B.main(["--check", "--spec-dir", str(specs), "--out", str(out)]) == 0


BAD_SPECS = [
    ('name = "other"', "name must be the file's stem"),
    ('name = "x"\ncolour = 1', "unknown keys ['colour']"),
    (
        'name = "x"\ninherits = "h100-sxm"\n[[step]]\nset = "memory"\nupdate = "memory"',
        "exactly one of",
    ),
    (
        'name = "x"\ninherits = "h100-sxm"\n[[step]]\nscale_collectives = "h100-sxm"',
        "needs ['why']",
    ),
    ('name = "x"\ninherits = "nothing"', "no GPU spec 'nothing'"),
    ('name = "x"\ninherits = "x"', "inherits from itself"),
    ('name = "x"\ninherits = "h100-sxm"\n[[step]]\nfit = "made_up"', "no named fit 'made_up'"),
    (
        'name = "x"\ninherits = "h100-sxm"\n[[step]]\nupdate = "nowhere.table"\nvalues = {a = 1}',
        "cannot apply it",
    ),
    (
        'name = "x"\ninherits = "h100-sxm"\n[[step]]\nset = "gemm._efficiency"\n'
        'table = {max_efficiency = {fit = ["no", "such"]}, source = "s", tier = "assumed"}',
        "no component fit no/such",
    ),
    (
        'name = "x"\ninherits = "h100-sxm"\n[[step]]\nset = "memory"\n'
        'table = {hbm_bw_bytes_per_s = -1.0, source = "s", tier = "datasheet"}',
        "the profile it builds is refused",
    ),
    ('name = "x"\ninherits = "h100-sxm"\nfit_inputs = "Z9"', "names no GEMM fit"),
    ('name = "x"\ninherits = "h100-sxm"\n[fused]\nfamily = "ampere"', "[fused]: cannot apply it"),
    ('name = "x"\n[[step', "not a readable TOML spec"),
    ('name = "x"\ninherits = "h100-sxm"\nfused = 3', "fused must be a table"),
    (
        'name = "x"\ninherits = "h100-sxm"\n[capacity]\nhbm_capacity_bytes = "lots"\nsource = "s"',
        "[capacity] holds",
    ),
    ('name = "x"\ninherits = "h100-sxm"\n[capacity]\nhbm_capacity_bytes = 1e9', "[capacity] holds"),
    # issue 61's spec-file class: the network it names, the multicast flag's values, its identity,
    # collectives faster than its link, a spec with no [interconnect]
    (
        'name = "x"\ninherits = "h100-sxm"\n[[step]]\nupdate = "identity"\n'
        'values = {name = "x", compute_capability = "abc"}',
        "identity.compute_capability must be 'major.minor'",
    ),
    ('name = "x"\ninherits = "h100-sxm"', "is named 'h100-sxm' (its parent's)"),
    (
        'name = "x"\ninherits = "h100-sxm"\n[[step]]\nupdate = "identity"\nvalues = {name = "x"}\n'
        '[[step]]\nupdate = "interconnect"\nvalues = {link_bw_bytes_per_s = 50e9}',
        "above the link's 50 GB/s",
    ),
    (
        'name = "x"\ninherits = "h100-sxm"\n[[step]]\nupdate = "identity"\nvalues = {name = "x"}\n'
        '[[step]]\ndrop = "interconnect"',
        "missing required quantity interconnect.",
    ),
    (
        'name = "x"\ninherits = "h100-sxm"\n[[step]]\nupdate = "interconnect"\n'
        'values = {network = "ib-nope"}',
        "interconnect.network: unknown network 'ib-nope'",
    ),
    (
        'name = "x"\ninherits = "h100-sxm"\n[[step]]\nupdate = "interconnect"\n'
        "values = {multicast = 2}",
        "interconnect.multicast = 2 is outside its plausible range [0, 1]",
    ),
    (
        'name = "x"\ninherits = "h100-sxm"\n[[step]]\nupdate = "interconnect"\n'
        'values = {multicast = "yes"}',
        "interconnect.multicast must be a number",
    ),
]


@pytest.mark.parametrize("text,needle", BAD_SPECS)
def test_a_bad_spec_is_one_line_and_exit_2(tmp_path, capsys, text, needle):
    specs, out = tmp_path / "specs", tmp_path / "out"
    specs.mkdir()
    out.mkdir()
    (specs / "x.toml").write_text(text + "\n")
    assert B.main(["--spec-dir", str(specs), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err
    assert not (out / "x.toml").exists()


def test_a_spec_named_like_a_builtin_is_refused(tmp_path, capsys):
    """Issue 61: a spec directory adds GPUs; one named like a built-in would change every profile
    that inherits from it, so it is one line, exit 2, and nothing written."""
    from calib import assemble as A

    specs, out = tmp_path / "specs", tmp_path / "out"
    specs.mkdir()
    text = (A.SPECS / "h100-sxm.toml").read_text()
    (specs / "h100-sxm.toml").write_text(text.replace("NVIDIA H100 SXM5 80GB", "Mine"))
    assert B.main(["--spec-dir", str(specs), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a GPU named 'h100-sxm' is already specified" in err, err
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--spec-dir", "."], "--spec-dir needs --out"),
        (
            ["--out", __file__],
            "not a directory",
        ),  # a missing --out is made (issue 61); a file is not one
        (["--refit", "--out", "."], "--refit writes the built-in profiles"),
    ],
)
def test_builder_flag_misuse_is_one_line_and_exit_2(capsys, argv, needle):
    assert B.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err


def _code_lines(src: str) -> int:
    """Lines of code of a module: not blank, not a comment, not inside a docstring."""
    import ast

    docs: set[int] = set()
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for n in ast.walk(ast.parse(src)):
        if isinstance(n, kinds) and ast.get_docstring(n, clean=False) is not None:
            docs.update(range(n.body[0].lineno, n.body[0].end_lineno + 1))
    return sum(
        1
        for i, line in enumerate(src.splitlines(), 1)
        if line.strip() and not line.strip().startswith("#") and i not in docs
    )


def test_the_builtin_profiles_are_their_specs():
    """Every built-in profile has its spec and every spec its profile; the builder holds no GPU of
    its own (issue 48: under 300 lines, no per-GPU function), nor does the assembler. Lines of code
    are counted without docstrings, comments and blank lines: at 100 columns (issue 57) the
    formatter puts a long call's arguments one per line."""
    import ast

    from calib import assemble as A
    from costmodel.profile import builtin_profile_names

    assert sorted(A.load_specs()) == sorted(builtin_profile_names())
    for mod in (B, A):
        src = open(mod.__file__).read()
        assert _code_lines(src) < 300, mod.__file__
        funcs = {n.name for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef)}
        gpus = {n.replace("-", "_").split("_")[0] for n in builtin_profile_names()}
        assert not {f for f in funcs if f.split("_")[0] in gpus}, funcs


def test_the_family_fits_start_trees_come_from_the_specs():
    """calib writes the start trees it needs itself (issue 48): the family fit is checked against
    the specs' trees, and a spec change that moves a start tree makes the committed fit stale, in
    one line naming the refit."""
    from calib import assemble as A
    from calib import results as CR
    from costmodel.errors import TpcostError

    trees = A.family_trees()
    assert set(trees) == {"hopper", "blackwell"} and set(trees["blackwell"]) == {
        "b300",
        "gb200-nvl72",
    }
    CR.load_family_result(trees)  # current
    trees["hopper"]["h100-sxm"]["asynctp"]["_host"]["host_op_s"] = 5e-6
    with pytest.raises(TpcostError, match="calib.reference"):
        CR.load_family_result(trees)


def test_a_failed_build_writes_nothing_and_out_is_made(tmp_path, monkeypatch, capsys):
    """Issue 61 item 6: a build with an inconsistent profile is one line naming the value to change,
    exit 2, and leaves OUT empty; a good build creates a missing --out; --help keeps its whole first
    sentence."""
    specs, out = tmp_path / "specs", tmp_path / "new" / "out"
    specs.mkdir()
    monkeypatch.setattr(
        B,
        "inconsistent_collectives",
        lambda name, tree: (
            [f"{name} tp8: ratio 0.43: the spec's nccl_all_reduce tp8 ... to change"]
            if name == "h100-sxm"
            else []
        ),
    )
    assert B.main(["--spec-dir", str(specs), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "to change" in err and not out.exists()
    monkeypatch.undo()
    assert B.main(["--spec-dir", str(specs), "--out", str(out)]) == 0
    assert (out / "h100-sxm.toml").exists()
    with pytest.raises(SystemExit):
        B.main(["--help"])
    assert "the committed fits (calib/data)" in " ".join(capsys.readouterr().out.split())
