"""vLLM as data: one record per release (costmodel/vllm_tables.py RELEASES), one version rule for
every command and the plugin (the flag, else the installed vLLM, else the current release), and no
version literal or gate constant outside the record's home."""

import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest
from conftest import need

from costmodel import vllm_tables as T
from costmodel.errors import TpcostError
from integration.cli import main

ROOT = Path(__file__).resolve().parents[1]
OP = [
    "op",
    "--gpu",
    "b200",
    "--tp",
    "4",
    "--op",
    "gemm_ar",
    "--impl",
    "kernel",
    "--n",
    "7168",
    "--k",
    "1536",
]
WHATIF = ["whatif", "--no-band", "--tokens", "1024"]
VLLM_CONFIG = ["vllm-config", "--gpu", "h100-sxm", "--tp", "4"]


def _json(capsys, *argv):
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _named(capsys):
    """The release each of whatif, op and vllm-config answers for, read from its own output."""
    w = _json(capsys, *WHATIF)["vllm_version"]
    o = _json(capsys, *OP)["vllm_version"]
    assert main(VLLM_CONFIG) == 0
    err = capsys.readouterr().err
    m = re.search(r"config for vLLM (\d+\.\d+) ", err)
    return w, o, m.group(1)


@pytest.fixture
def no_vllm(monkeypatch):
    """A machine without vLLM: the rule falls through to the current release."""
    import integration.recommend as rec

    monkeypatch.setattr(rec, "installed_vllm", lambda: None)


@pytest.fixture
def installed(monkeypatch):
    """Pretend vLLM `text` is the installed distribution."""
    import integration.recommend as rec

    def put(text):
        monkeypatch.setattr(
            rec, "installed_vllm", lambda: (text, f"installed distribution vllm {text}")
        )

    return put


def test_without_vllm_every_command_names_the_current_release(no_vllm, capsys):
    cur = T.current().label
    assert _named(capsys) == (cur, cur, cur)
    assert main(WHATIF) == 0
    out = capsys.readouterr().out
    assert f"vLLM {cur} (the current release" in out.splitlines()[0]
    if not T.current().sp_passes:  # no 0.31 cutoff printed as the decision
        assert (
            "<- cutoff" not in out and "cutoff (SP" not in out and "has no SP/AsyncTP passes" in out
        )


def test_the_installed_version_wins_over_the_default(installed, capsys):
    for r in T.RELEASES.values():
        installed(f"{r.label}.0")
        assert _named(capsys) == (r.label,) * 3
    installed("0.33.0")
    assert main(["vllm-config", "--gpu", "h100-sxm", "--tp", "4", "--vllm-version", "0.31"]) == 0
    # the flag wins over both
    assert "config for vLLM 0.31 (--vllm-version 0.31)" in capsys.readouterr().err


def test_an_unknown_installed_version_is_refused_naming_where_it_came_from(
    installed, one_line_error
):
    installed("0.99.0")
    for argv in (WHATIF, OP, VLLM_CONFIG, ["collective", "--op", "all_reduce", "--tp", "8"]):
        err = one_line_error(*argv, needle="installed distribution vllm 0.99.0")
        assert "no record of vLLM 0.99" in err and "--vllm-version" not in err


def _made_up(monkeypatch) -> T.Release:
    """A release 0.35 that moves the kernel's gate to 256 rows and adds a PassConfig field: one
    record, nothing else."""
    cur = T.current()
    v = (cur.version[0], cur.version[1] + 1)
    rec = dataclasses.replace(
        cur,
        version=v,
        serves_from=v,
        wheel="made up for the test",
        kernel=dataclasses.replace(cur.kernel, min_m=256, should_run="gemm_rs_ar.py:1-2"),
    )
    monkeypatch.setitem(T.RELEASES, v, rec)
    return rec


def test_a_new_record_is_used_by_every_command_with_no_other_change(monkeypatch, no_vllm, capsys):
    rec = _made_up(monkeypatch)
    assert T.current() is rec
    assert _named(capsys) == (rec.label,) * 3  # no flag, no vLLM: the newest record
    op = _json(capsys, *OP, "--vllm-version", rec.label)
    assert op["vllm_version"] == rec.label and op["vllm_rule_tokens"] == 256
    assert [r["vllm_runs_kernel"] for r in op["rows"] if r["m"] in (128, 256)] == [False, True]
    before = T.RELEASES[max(v for v in T.RELEASES if v < rec.version)]
    old = _json(capsys, *OP, "--vllm-version", before.label)
    assert old["vllm_rule_tokens"] == before.kernel.min_m != 256
    # the fused kernel's switch on Kimi-K3: vLLM's rule at the sites is the record's
    kimi = str(ROOT / "tests" / "fixtures" / "kimi-k3.config.json")
    assert (
        main(
            [
                "vllm-config",
                "--model",
                kimi,
                "--gpu",
                "b200",
                "--tp",
                "8",
                "--kernel-op",
                "gemm_ar",
                "--vllm-version",
                rec.label,
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert f"config for vLLM {rec.label} (--vllm-version {rec.label})" in err and "M >= 256" in err
    # the plugin resolves the running vLLM by the same rule
    from integration import vllm_plugin

    need("vllm")
    monkeypatch.setattr(sys.modules["vllm"], "__version__", f"{rec.label}.0", raising=False)
    assert vllm_plugin._vllm_version(rec.sp_passes) == list(rec.version)


def test_the_plugin_refuses_an_unknown_or_disagreeing_version(monkeypatch):
    from integration import vllm_plugin

    need("vllm")
    monkeypatch.setattr(sys.modules["vllm"], "__version__", "0.99.1", raising=False)
    with pytest.raises(
        TpcostError, match="the running vLLM 0.99.1: tpcost has no record of vLLM 0.99"
    ):
        vllm_plugin._vllm_version(False)
    monkeypatch.setattr(sys.modules["vllm"], "__version__", "0.31.0", raising=False)
    assert vllm_plugin._vllm_version(True) == [0, 31]
    # 0.31's record has the passes; this config does not
    with pytest.raises(TpcostError, match="has no SP fields"):
        vllm_plugin._vllm_version(False)


def test_resolve_rule_and_version_parsing():
    assert T.resolve("0.32", ("0.34.0", "installed")).version == (0, 32)
    assert T.resolve(None, ("0.31.0+cpu", "installed x")).source == "installed x"
    assert T.resolve(None, None).version == T.current().version
    assert T.Vllm((0, 20)).release.version == (0, 31)  # 0.31's record answers for 0.13 - 0.30 ...
    # ... without its kernel
    assert T.Vllm((0, 20)).kernel is None and T.Vllm((0, 31)).kernel is not None
    with pytest.raises(TpcostError, match="from vLLM 0.31 on"):
        T.should_run_rule(T.Vllm((0, 20)))
    for bad in ("0.35", "1.0", "0.3"):
        with pytest.raises(TpcostError, match=f"src: tpcost has no record of vLLM {bad}"):
            T.parse_version(bad, "src")
    with pytest.raises(TypeError):
        T.dispatch((0, 31), None, None, 4)  # one shape: a Vllm, never a tuple or None


def test_every_record_is_consistent():
    for v, r in T.RELEASES.items():
        assert r.version == v and r.serves_from <= v
        assert set(r.pass_config_fields) >= {
            "fuse_allreduce_rms",
            "fi_allreduce_fusion_max_size_mb",
        }
        assert r.sp_passes == ("sp_min_token_num" in r.pass_config_fields)
    ranges = sorted((r.serves_from, r.version) for r in T.RELEASES.values())
    # no version answered by two records
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:]))


# versions spelled as tuples or compared, and the gate constants of the records: only
# costmodel/vllm_tables.py
_LITERAL = re.compile(r"\(\s*0\s*,\s*\d+\s*\)|\bversion\s*[<>]=?\s*\(")
_GATES = re.compile(
    r"\b(KERNEL_MIN_M|MUSE_SPARK\w*|FIRST_WITH\w*|OLDEST\w*|LATEST_SUPPORTED|_KERNEL_0\d+|_MUSE_0\d+|"
    r"_TABLES_0\d+)\b|\.min_m\b|\.kernel\.since\b"
)


def test_no_version_literal_or_gate_constant_outside_the_vllm_home():
    home = ROOT / "costmodel" / "vllm_tables.py"
    bad = []
    for d in ("costmodel", "integration", "calib", "tools", "benchmarks"):
        for p in sorted((ROOT / d).rglob("*.py")):
            if p == home:
                continue
            for i, line in enumerate(p.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if _LITERAL.search(code) and "(0, 0)" not in code or _GATES.search(code):
                    bad.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "text,ok",
    [
        ("0.34.0", True),
        ("0.34.0rc1", True),
        ("0.31.0+cpu", True),
        ("0.33.1.dev12+g4ba787ec9", True),
        ("0.34", True),
        ("0.34.x", False),
        ("０.３４", False),
        ("٠.٣٤", False),
        ("0.34.0 beta", False),
        ("v0.34", False),
    ],
)
def test_version_strings_are_pep440_with_ascii_digits(text, ok):
    """Issue 61: '0.34.x' and non-ASCII digits are not read as 0.34."""
    if ok:
        assert T.parse_version(text, "src")[1] in (31, 33, 34)
    else:
        with pytest.raises(TpcostError, match="is not a vLLM version"):
            T.parse_version(text, "src")


def test_an_unclassified_gate_in_a_wheel_is_caught(tmp_path):
    """Issue 60: a made-up wheel tree with one new gate-named constant (and one of the record's
    gone) fails the inventory check; keyword arguments and lower-case names are not constants."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from read_vllm_tables import unclassified_gates

    rec = T.RELEASES[(0, 34)]
    g = next(x for x in rec.gate_inventory if x.scanned)
    f, line = g.where.rsplit(":", 1)
    path = tmp_path / f
    path.parent.mkdir(parents=True)
    path.write_text("\n" * (int(line) - 1) + f"{g.name} = {g.value}\n")
    new_file = tmp_path / "vllm" / "models" / "made_up" / "ops.py"
    new_file.parent.mkdir(parents=True)
    new_file.write_text(
        "x = f(SOFTPLUS_THRESHOLD=20.0,\n)\nlower_max_tokens = 3\n_FUSED_FOO_MAX_TOKENS = 64  # "
        "new\n"
    )
    new, gone = unclassified_gates(str(tmp_path), (g,))
    assert new == ["vllm/models/made_up/ops.py:4 _FUSED_FOO_MAX_TOKENS"] and gone == []
    new, gone = unclassified_gates(str(tmp_path), rec.gate_inventory)
    assert len(gone) == sum(x.scanned for x in rec.gate_inventory) - 1
    for x in rec.gate_inventory:
        assert x.status_line() and (
            x.kind != "comm" or x.status.startswith(("priced", "not modelled"))
        )
