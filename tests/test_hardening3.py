"""Hardening III: what a new user stumbles on, and bad input on the surfaces added last round. Every case through
`main([...])` (or the README's own text), one class of mechanism per test."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from integration.cli import main

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "nccl-tests"


def _readme_block(name):
    text = (ROOT / "README.md").read_text()
    m = re.search(rf"<!-- {name} -->\n```bash\n(.*?)```\n<!-- /{name} -->", text, re.S)
    assert m, name
    return m.group(1)


def test_readme_serve_form_stops_when_tpcost_fails(tmp_path):
    """The README's `cc=$(tpcost vllm-config ...) || exit 1; vllm serve ... "$cc"`, run by bash with a stand-in
    `vllm` that records its arguments: a failing tpcost never reaches vLLM; a working one hands it the JSON."""
    block = _readme_block("serve-form")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "vllm").write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path}/vllm-args\n")
    (bindir / "vllm").chmod(0o755)
    path = f"{bindir}:{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    assert shutil.which("tpcost", path=path), "the tpcost entry point is installed beside this python"
    bad = subprocess.run(["bash", "-c", block], env={**os.environ, "PATH": path, "TPCOST_PROFILE": "no-such-gpu"},
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and not (tmp_path / "vllm-args").exists(), bad.stderr
    good = subprocess.run(["bash", "-c", block], env={**os.environ, "PATH": path, "TPCOST_PROFILE": "h100-sxm"},
                          capture_output=True, text=True, timeout=120)
    assert good.returncode == 0, good.stderr
    args = (tmp_path / "vllm-args").read_text().splitlines()
    assert args[-2] == "--compilation-config" and "pass_config" in json.loads(args[-1])


def test_readme_commands_name_what_they_need():
    text = (ROOT / "README.md").read_text()
    for line in text.splitlines():
        if "tpcost validate" in line and line.strip().startswith("torchrun"):
            assert "--model" in line, line
    assert main(["whatif", "--model", "cpu-tiny", "--tp", "2", "--no-band", "--dtype", "fp32"]) == 0  # docs' CPU model


def test_set_error_names_the_typed_key_and_the_si_value(one_line_error):
    err = one_line_error("whatif", "--set", "interconnect.link_bw_bytes_per_s=900", needle="interconnect.link_bw")
    assert "did you mean 900e9" in err and "copy_engine" not in err
    one_line_error("whatif", "--set", "interconnect.latency_s=5", needle="did you mean 5e-6")


def _config(tmp_path, drop, name):
    cfg = json.loads((ROOT / "costmodel" / "models" / "llama-3.1-8b.json").read_text())
    for k in drop:
        cfg.pop(k, None)
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def test_config_fields_missing(tmp_path, one_line_error, capsys):
    one_line_error("whatif", "--model", _config(tmp_path, ["intermediate_size"], "a"),
                   needle="config.json has no 'intermediate_size'")
    m = _config(tmp_path, ["num_key_value_heads", "head_dim"], "b")
    assert main(["whatif", "--model", m, "--no-band"]) == 0
    out = capsys.readouterr().out
    assert "no num_key_value_heads; taken as Hugging Face does: num_key_value_heads = num_attention_heads = 32" in out
    assert "no head_dim; taken as Hugging Face does: head_dim = hidden_size / num_attention_heads = 128" in out


def test_evaluate_resolves_paths_beside_the_csv(tmp_path, capsys, monkeypatch):
    """An ops CSV naming its profile by a path relative to itself (as calibrate writes it) scores from any
    working directory; the repo's committed CPU run too."""
    d = tmp_path / "run"
    d.mkdir()
    shutil.copy(ROOT / "costmodel" / "profiles" / "h100-sxm.toml", d / "node.toml")
    from costmodel.evaluate import op_csv_header

    (d / "ops.csv").write_text(op_csv_header() + "\nnode.toml,8,gemm_rs,bf16,4096,8192,3584,500,450,x\n")
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


@pytest.mark.parametrize("v,needle", [("0.40", "supports vLLM 0.13 - 0.33"), ("", "expected MAJOR.MINOR"),
                                      ("-0.31", "expected MAJOR.MINOR"), ("0.12", "supports vLLM 0.13 - 0.33")])
def test_unsupported_vllm_versions(one_line_error, v, needle):
    for cmd in (["whatif", "--no-band"], ["vllm-config", "--gpu", "h100-sxm"]):
        one_line_error(*cmd, "--vllm-version", v, needle=needle)
    text = (ROOT / "docs" / "vllm.md").read_text()
    assert "Supported: vLLM 0.13 – 0.33" in text  # the docs say what the code refuses outside


@pytest.mark.parametrize("value,off,warns", [("1", True, False), ("true", True, False), ("YES", True, False),
                                             ("false", False, False), ("0", False, False), ("off", False, False),
                                             ("", False, False), ("maybe", False, True)])
def test_tpcost_disable_reads_booleans(monkeypatch, value, off, warns):
    from integration.plugin_cache import env_flag

    monkeypatch.setenv("TPCOST_DISABLE", value)
    got, problem = env_flag("TPCOST_DISABLE")
    assert got is off and (problem is not None) is warns


@pytest.mark.parametrize("text,needle", [
    ("num_tokens,count\n²,3\n", "num_tokens '²' is not a positive integer"),
    ("num_tokens,count\n64,1e308\n128,1e308\n", "sum to more than a float holds"),
])
def test_workload_counts_and_digits(tmp_path, one_line_error, text, needle):
    f = tmp_path / "w.csv"
    f.write_text(text)
    for cmd in (["whatif", "--no-band"], ["vllm-config", "--gpu", "h100-sxm"],
                ["op", "--tp", "4", "--op", "gemm_rs", "--n", "8192", "--k", "1024"]):
        one_line_error(*cmd, "--workload", str(f), needle=needle)


def test_workload_prometheus_overflow_and_devices(tmp_path, one_line_error):
    f = tmp_path / "m.txt"
    f.write_text("# HELP vllm:iteration_tokens_total x\n" +
                 'vllm:iteration_tokens_total_bucket{le="8.0",engine="0"} 1e308\n' +
                 'vllm:iteration_tokens_total_bucket{le="8.0",engine="1"} 1e308\n')
    one_line_error("whatif", "--no-band", "--workload", str(f), needle="sum to more than a float holds")
    if os.path.exists("/dev/zero"):
        one_line_error("whatif", "--no-band", "--workload", "/dev/zero", needle="workload /dev/zero")


def _log(name):
    return (FIX / name).read_text()


def _calib(tmp_path, *texts, gpu="h100-sxm"):
    files = []
    for i, t in enumerate(texts):
        f = tmp_path / f"log{i}.txt"
        f.write_text(t)
        files.append(str(f))
    return ["calibrate", "--from-nccl-tests", *files, "--from", gpu, "--out", str(tmp_path / "out.toml")]


def test_nccl_tests_failed_or_thin_or_foreign_logs(tmp_path, one_line_error):
    good = _log("all_reduce_perf_new.txt")
    rows = [ln for ln in good.splitlines() if ln.strip() and ln.split()[0].isdigit()]
    wrong = good.replace(rows[3], rows[3][:rows[3].rindex("0")] + "7")  # the in-place #wrong of one size: 7
    one_line_error(*_calib(tmp_path, wrong), needle="nccl-tests counted 7 wrong values")
    failed = good.replace("# Out of bounds values : 0 OK", "# Out of bounds values : 3 FAILED")
    one_line_error(*_calib(tmp_path, failed), needle="nccl-tests marked this run failed")
    one_size = good.replace("\n".join(rows), "\n".join([rows[5]] * 6))
    one_line_error(*_calib(tmp_path, one_size), needle="of 1 message size(s)")
    one_line_error(*_calib(tmp_path, good, good), needle="give one log per collective and rank count")
    fast = good
    for r in rows:  # every time / 10: a busBW 10x the H100's link
        t = r.split()[5]
        fast = fast.replace(r, r.replace(t, f"{float(t) / 10:.2f}", 1))
    one_line_error(*_calib(tmp_path, fast), needle="above 1.5x h100-sxm's link")
    two_hosts = good.replace("Rank  2 Group  0 Pid  41023 on   gpu-node-07", "Rank  2 Group  0 Pid  41023 on   gpu-node-08")
    one_line_error(*_calib(tmp_path, two_hosts), needle="run on 2 hosts, outside one NVLink domain")


def test_flags_that_would_be_ignored_are_refused(tmp_path, one_line_error, capsys):
    one_line_error("whatif", "--ops", "64", "--plot", str(tmp_path / "p.png"), needle="--plot belongs to the sweep")
    one_line_error("whatif", "--ops", "64", "--workload", "/etc/hostname", needle="--workload belongs to the sweep")
    one_line_error("op", "--tp", "4", "--op", "gemm_rs", "--n", "8192", "--k", "1024", "--set",
                   "attention.efficiency=0.5", needle="--set attention.efficiency: no effect on gemm_rs")
    one_line_error("op", "--gpu", "b200", "--tp", "4", "--op", "gemm_rs", "--impl", "kernel", "--n", "8192", "--k",
                   "1024", "--set", "asynctp.barrier_s=1e-6", needle="--set asynctp.barrier_s: no effect")
    assert main(["op", "--tp", "4", "--op", "gemm_rs", "--n", "8192", "--k", "1024", "--set",
                 "asynctp.barrier_s=1e-6"]) == 0  # the torch op reads it
    capsys.readouterr()
    one_line_error("profiles", "--from", "b200", "--set", "compute.sm_count=100", "--out", str(tmp_path / "x.toml"),
                   needle="only --new NAME reads it")
    assert not (tmp_path / "x.toml").exists()
    assert main(["profiles", "--keys", "b200", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["profile"] == "b200" and any(k["key"] == "gemm.max_efficiency" for k in d["keys"])


def test_minor(one_line_error, tmp_path, capsys):
    err = one_line_error("op", "--tp", "6", "--op", "gemm_rs", "--n", "8192", "--k", "1024", needle="--tp 6")
    assert "--m" not in err
    from costmodel.evaluate import op_csv_header

    f = tmp_path / "ops.csv"
    f.write_text(op_csv_header() + "\nh100-sxm,4.0,gemm_rs,bf16,4096,8192,3584,500,450,x\n")
    assert main(["evaluate", str(f), "--json"]) == 0  # an integral float, as pandas writes it
    assert json.loads(capsys.readouterr().out)["rows_scored"] == 1
