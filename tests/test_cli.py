"""CLI in process: main([...]) -> exit code; bad input gives one line on stderr and exit 2."""

import json

import pytest
from conftest import sp_release_flag

from integration.cli import main
from pathlib import Path


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_whatif_default_table(capsys):
    rc, out, err = run(capsys, "whatif", "--no-band", *sp_release_flag())
    assert rc == 0 and "cutoff (SP+AsyncTP" in out and "llama-3.1-70b on h100-sxm x4" in out


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_whatif_json_fields(capsys, tp):
    rc, out, _ = run(
        capsys, "whatif", "--gpu", "h100-sxm", "--model", "llama-3.1-70b", "--tp", str(tp), "--json"
    )
    d = json.loads(out)
    assert rc == 0
    for key in (
        "cutoff_tokens",
        "cutoff_band_tokens",
        "sp_cutoff_tokens",
        "provenance",
        "rows",
        "cutoff_sensitivity",
        "vllm_default_sp_min_token_num",
    ):
        assert key in d
    # vLLM 0.31's H100 rule, hidden 8192
    assert d["vllm_default_sp_min_token_num"] == {2: 1024, 4: 2048, 8: 4096}[tp]
    for r in d["cutoff_sensitivity"]:
        assert set(r) >= {
            "quantity",
            "tier",
            "sigma_rel",
            "cutoff_minus_sigma_tokens",
            "cutoff_plus_sigma_tokens",
        }
    assert set(d["provenance"]) >= {"tier", "profile", "sources"}
    r = d["rows"][0]
    assert set(r) >= {
        "num_tokens",
        "t_tp_s",
        "t_sp_s",
        "t_sp_asynctp_s",
        "speedup_sp",
        "speedup_sp_asynctp",
    }
    assert d["cutoff_tokens"] is None or d["cutoff_tokens"] % tp == 0


def test_tokens_choose_the_rows(capsys):
    rc, out, _ = run(
        capsys, "whatif", "--no-band", "--json", "--tokens", "100", "3000", *sp_release_flag()
    )
    d = json.loads(out)
    assert rc == 0 and {r["num_tokens"] for r in d["rows"]} == {100, 3000, d["cutoff_tokens"]}


def test_set_marks_profile_modified(capsys):
    rc, out, _ = run(
        capsys,
        "whatif",
        "--no-band",
        "--json",
        "--set",
        "gemm.max_efficiency=0.7",
        "--set",
        "asynctp.copy_engine_bw_bytes_per_s=734e9",
    )
    d = json.loads(out)
    assert rc == 0 and d["provenance"]["modified"] == [
        "gemm.max_efficiency",
        "asynctp.copy_engine_bw_bytes_per_s",
    ]
    assert d["provenance"]["tier"] == "assumed"


def test_faster_link_scales_what_rides_on_it(capsys):
    """--set interconnect.link_bw_bytes_per_s=2x scales every collective busBW and the pull
    bandwidth by 2."""
    from costmodel import load_profile
    from costmodel.profile import with_overrides

    p = load_profile("h100-sxm")
    q = with_overrides(
        p, {"interconnect.link_bw_bytes_per_s": 900e9, "asynctp.copy_engine_bw_bytes_per_s": 1e12}
    )
    k = "collectives.nccl_all_reduce.tp4.bus_bw_bytes_per_s"
    assert q.value(k) == pytest.approx(2 * p.value(k))
    assert q.value("asynctp.copy_engine_bw_bytes_per_s") == 1e12  # explicit value wins
    lat = with_overrides(p, {"interconnect.latency_s": p.value("interconnect.latency_s") + 1e-6})
    assert lat.value("collectives.nccl_all_gather.tp8.latency_s") == pytest.approx(
        p.value("collectives.nccl_all_gather.tp8.latency_s") + 1e-6
    )
    rc, out, _ = run(
        capsys, "whatif", "--no-band", "--set", "interconnect.link_bw_bytes_per_s=900e9"
    )
    assert rc == 0 and "MODIFIED by --set: interconnect.link_bw_bytes_per_s (+" in out


def test_plot(tmp_path, capsys):
    png = tmp_path / "w.png"
    rc, _, _ = run(capsys, "whatif", "--no-band", "--plot", str(png))
    assert rc == 0 and png.stat().st_size > 1000


def test_profiles_and_models(capsys):
    rc, out, _ = run(capsys, "profiles", "--json")
    d = json.loads(out)
    assert d["schema_version"] == 2
    names = {p["name"] for p in d["profiles"]}
    assert names == {
        "h100-sxm",
        "h200-sxm",
        "h800",
        "h20",
        "b200",
        "b300",
        "gb200-nvl72",
        "gb300-nvl72",
        "a100-sxm-80gb",
        "a800",
        "l40s",
        "mi300x",
    }
    rc, out, _ = run(capsys, "models", "--json")
    from costmodel.shapes import all_builtin_model_names

    assert {m["name"] for m in json.loads(out)["models"]} == set(all_builtin_model_names())
    assert {"llama-3.1-70b", "cpu-tiny", "deepseek-v3"} <= set(all_builtin_model_names())
    rc, out, _ = run(capsys, "profiles", "--keys", "h100-sxm")
    assert rc == 0 and "gemm.max_efficiency" in out and "MLENG_MAMF" in out


def _bad(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "noh.json").write_text(json.dumps({"num_attention_heads": 8}))
    (tmp_path / "bad.toml").write_text("schema_version = 1\n[identity\n")
    (tmp_path / "empty.toml").write_text("schema_version = 1\n[identity]\nname='x'\n")
    return [
        ["whatif", "--gpu", "nonexistent-gpu"],
        ["whatif", "--model", "nonexistent-model"],
        ["whatif", "--model", str(tmp_path / "bad.json")],
        ["whatif", "--model", str(tmp_path / "noh.json")],
        ["whatif", "--gpu", str(tmp_path / "bad.toml")],
        ["whatif", "--gpu", str(tmp_path / "empty.toml")],
        ["whatif", "--tp", "0"],
        ["whatif", "--tp", "3"],
        ["whatif", "--tp", "-1"],
        ["whatif", "--tp", "two"],
        ["whatif", "--dtype", "int4"],
        ["whatif", "--max-num-batched-tokens", "0"],
        ["whatif", "--seq-len", "0"],
        ["whatif", "--set", "nope=1"],
        ["whatif", "--set", "gemm.max_efficiency=abc"],
        ["whatif", "--margin", "-1"],
        ["whatif", "--tokens", "0"],
        ["whatif", "--tokens", "-5", "64"],
        ["whatif", "--model", "llama-3.1-8b", "--tp", "64"],
        ["frobnicate"],
    ]


def test_bad_inputs_exit_2_one_line(tmp_path, capsys):
    for argv in _bad(tmp_path):
        rc, out, err = run(capsys, *argv)
        assert rc == 2, argv
        assert err.count("\n") == 1 and err.startswith("tpcost: error:"), (argv, err)
        assert "Traceback" not in err


def test_memory_error_is_one_line(monkeypatch, capsys, one_line_error):
    import costmodel.analysis as an

    def boom(*a, **k):
        raise MemoryError

    # our own code raising it: the CLI's handler is what is under test
    monkeypatch.setattr(an, "analyse", boom)
    one_line_error("whatif", "--no-band", needle="out of memory")


ROOT = Path(__file__).resolve().parents[1]


def test_flags_that_would_be_ignored_are_refused(tmp_path, one_line_error, capsys):
    one_line_error(
        "whatif",
        "--ops",
        "64",
        "--plot",
        str(tmp_path / "p.png"),
        needle="--plot belongs to the sweep",
    )
    one_line_error(
        "whatif",
        "--ops",
        "64",
        "--workload",
        "/etc/hostname",
        needle="--workload belongs to the sweep",
    )
    one_line_error(
        "op",
        "--tp",
        "4",
        "--op",
        "gemm_rs",
        "--n",
        "8192",
        "--k",
        "1024",
        "--set",
        "attention.efficiency=0.5",
        needle="--set attention.efficiency: no effect on gemm_rs",
    )
    one_line_error(
        "op",
        "--gpu",
        "b200",
        "--tp",
        "4",
        "--op",
        "gemm_rs",
        "--impl",
        "kernel",
        "--n",
        "8192",
        "--k",
        "1024",
        "--set",
        "asynctp.barrier_s=1e-6",
        needle="--set asynctp.barrier_s: no effect",
    )
    # the torch op reads it
    assert (
        main(
            [
                "op",
                "--tp",
                "4",
                "--op",
                "gemm_rs",
                "--n",
                "8192",
                "--k",
                "1024",
                "--set",
                "asynctp.barrier_s=1e-6",
            ]
        )
        == 0
    )
    capsys.readouterr()
    one_line_error(
        "profiles",
        "--from",
        "b200",
        "--set",
        "compute.sm_count=100",
        "--out",
        str(tmp_path / "x.toml"),
        needle="only --new NAME reads it",
    )
    assert not (tmp_path / "x.toml").exists()
    assert main(["profiles", "--keys", "b200", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["profile"] == "b200" and any(k["key"] == "gemm.max_efficiency" for k in d["keys"])


def test_minor(one_line_error, tmp_path, capsys):
    err = one_line_error(
        "op", "--tp", "6", "--op", "gemm_rs", "--n", "8192", "--k", "1024", needle="--tp 6"
    )
    assert "--m" not in err
    from costmodel.evaluate import op_csv_header

    f = tmp_path / "ops.csv"
    f.write_text(op_csv_header() + "\nh100-sxm,4.0,gemm_rs,bf16,4096,8192,3584,500,450,x,torch\n")
    assert main(["evaluate", str(f), "--json"]) == 0  # an integral float, as pandas writes it
    assert json.loads(capsys.readouterr().out)["rows_scored"] == 1
