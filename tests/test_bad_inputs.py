"""Bad input in every subcommand: one line on stderr and exit 2, or a correct answer; never a
traceback, a NaN in JSON, or a lost file."""

import json
import os

import pytest
from conftest import need

from integration.cli import main

H = "hardware,tp,op,dtype,m,n,k,baseline_us,overlap_us,source,impl\n"
ROW = "h100-sxm,8,gemm_rs,bf16,4096,8192,3584,500,450,x,torch\n"
LLAMA = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "vocab_size": 128256,
}


def _run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _strict_json(text):
    def bad(c):
        raise AssertionError(f"{c} in JSON output")

    return json.loads(text, parse_constant=bad)


@pytest.mark.parametrize(
    "content,needle",
    [
        (b"\xff\xfe{not utf8", "not UTF-8"),
        (b"\x00\x01\x02binary", "binary"),
        (b"[" * 5000 + b"]" * 5000, "nested deeper"),
        (b"[1, 2, 3]", "JSON object"),
        (b'"just a string"', "JSON object"),
        (b"{not json", "malformed JSON"),
        (b'{"hidden_size": NaN}', "malformed JSON"),
    ],
)
def test_bad_config_files(tmp_path, capsys, content, needle, one_line_error):
    f = tmp_path / "config.json"
    f.write_bytes(content)
    one_line_error("whatif", "--model", str(f), needle=needle)


@pytest.mark.parametrize(
    "patch,needle",
    [
        ({"head_dim": 0}, "head_dim"),
        ({"num_key_value_heads": 64}, "num_key_value_heads"),
        ({"num_key_value_heads": 5}, "num_key_value_heads"),
        ({"hidden_size": 4100, "num_attention_heads": 32}, "not an integer"),
        ({"num_local_experts": 8, "num_experts_per_tok": -2}, "num_experts_per_tok"),
        ({"num_local_experts": 8, "num_experts_per_tok": 9}, "num_experts_per_tok"),
        ({"num_local_experts": 8, "num_experts_per_tok": 0}, "num_experts_per_tok"),
        ({"hidden_size": -4096}, "hidden_size"),
        ({"num_hidden_layers": 10**9}, "num_hidden_layers"),
        ({"vocab_size": 2.5}, "vocab_size"),
        (
            {"q_lora_rank": 1536, "kv_lora_rank": 512, "first_k_dense_replace": 3},
            "q_lora_rank, kv_lora_rank, first_k_dense_replace",
        ),
    ],
)
def test_config_meaning_is_checked(tmp_path, capsys, patch, needle, one_line_error):
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**LLAMA, **patch}))
    one_line_error("whatif", "--model", str(f), "--tp", "2", needle=needle)


def test_bad_profile_files_and_values(tmp_path, capsys, one_line_error):
    base = tmp_path.parent / "h.toml"
    src = open(
        os.path.join(os.path.dirname(__file__), "..", "costmodel", "profiles", "h100-sxm.toml")
    ).read()
    cases = {
        "binary.toml": (b"\x00\x00", "binary"),
        "latin1.toml": ("name = 'caf\xe9'".encode("latin-1"), "not UTF-8"),
        "deep.toml": (("a = " + "[" * 3000 + "]" * 3000).encode(), "nested"),
        "eff.toml": (
            src.replace("max_efficiency = 0.8033", "max_efficiency = 1.7").encode(),
            "(0, 1]",
        ),
        "sm.toml": (src.replace("sm_count = 132", "sm_count = 131.5").encode(), "integer"),
        "bw.toml": (
            src.replace(
                "hbm_bw_bytes_per_s = 3350000000000.0", "hbm_bw_bytes_per_s = 0.0"
            ).encode(),
            "memory.hbm_bw_bytes_per_s = 0 is outside its plausible range [1e+08, 1e+14] bytes/s",
        ),
        "inf.toml": (
            src.replace(
                "hbm_bw_bytes_per_s = 3350000000000.0", "hbm_bw_bytes_per_s = inf"
            ).encode(),
            "finite",
        ),
        # the schema: a misspelt quantity, a table it does not have, a string where a number belongs
        "typo.toml": (
            src.replace("max_efficiency = 0.8033", "max_efficency = 0.8033").encode(),
            "gemm.max_efficency is not a quantity of the schema",
        ),
        "table.toml": (
            src.replace("[attention]", "[atention]").encode(),
            "[atention] is not a table",
        ),
        "str.toml": (
            src.replace("sm_count = 132", 'sm_count = "132"').encode(),
            "identity.sm_count must be a number",
        ),
        "kind.toml": (
            src.replace('kind = "nvswitch"', "kind = 3").encode(),
            "interconnect.kind must be a string",
        ),
        "half.toml": (
            (
                src
                + '\n[collectives.nccl_all_reduce.tp16]\nlatency_s = 1e-5\nsource = "x"\ntier = '
                '"assumed"\n'
            ).encode(),
            "[collectives.nccl_all_reduce.tp16] needs both",
        ),
    }
    for name, (content, needle) in cases.items():
        f = tmp_path / name
        f.write_bytes(content)
        one_line_error("whatif", "--gpu", str(f), "--no-band", needle=needle)
    assert not base.exists()


@pytest.mark.parametrize(
    "item,needle",
    [
        ("gemm.max_efficiency=1.5", "(0, 1]"),
        ("memory.hbm_bw_bytes_per_s=0", "plausible range [1e+08, 1e+14]"),
        ("memory.hbm_bw_bytes_per_s=-1e12", "plausible range [1e+08, 1e+14]"),
        ("identity.sm_count=100.5", "integer"),
        ("gemm.tile_m=0", "gemm.tile_m = 0 is outside its plausible range [1, 1024]"),
        ("asynctp.stream_concurrency=2", "[0, 1]"),
        ("memory.hbm_bw_bytes_per_s=inf", "finite"),
        ("memory.hbm_bw_bytes_per_s=nan", "finite"),
        ("memory.hbm_bw_bytes_per_s=1e400", "finite"),
        ("compute.peak_flops_per_s.fp8=1e15", "no effect"),  # bf16 run: the fp8 peak is never read
        ("collectives.nccl_all_reduce.tp8.latency_s=1e-5", "not the entry used at tp=4"),
        ("vllm_dispatch.tp8.symm_mem_max_bytes=1", "use --vllm-set"),
        (
            "interconnect.domain_size=0",
            "interconnect.domain_size = 0 is outside its plausible range",
        ),
        (
            "asynctp.barrier_s=1e308",
            "asynctp.barrier_s = 1e+308 is outside its plausible range [0, 0.1] s",
        ),
        (
            "identity.sm_count=1e308",
            "identity.sm_count = 1e+308 is outside its plausible range [1, 4096]",
        ),
        ("interconnect.link_bw_bytes_per_s=1e308", "outside its plausible range [1e+06, 1e+14]"),
    ],
)
def test_bad_set_values(capsys, item, needle, one_line_error):
    one_line_error("whatif", "--no-band", "--set", item, needle=needle)


def test_set_twice_and_dispatch_keys_take_effect(capsys, one_line_error):
    one_line_error(
        "whatif",
        "--set",
        "gemm.max_efficiency=0.7",
        "--set",
        "gemm.max_efficiency=0.6",
        needle="given twice",
    )
    rc, out, _ = _run(
        capsys, "whatif", "--no-band", "--json", "--vllm-set", "fi_fusion_max_bytes=0"
    )
    rc0, out0, _ = _run(capsys, "whatif", "--no-band", "--json")
    assert rc == rc0 == 0
    t = {r["num_tokens"]: r["t_tp_s"] for r in json.loads(out)["rows"]}
    t0 = {r["num_tokens"]: r["t_tp_s"] for r in json.loads(out0)["rows"]}
    assert t[64] != t0[64]  # FlashInfer off: the dispatch key changed the prediction


@pytest.mark.parametrize(
    "argv,needle",
    [
        (
            ["whatif", "--max-num-batched-tokens", str(10**12)],
            "--max-num-batched-tokens must be in",
        ),
        (["whatif", "--tokens", str(10**7)], "token count must be in"),
        (["whatif", "--seq-len", str(2**25)], "--seq-len must be in"),
        (["whatif", "--margin", "nan"], "--margin"),
        (["whatif", "--margin", "1.5"], "--margin"),
        (["whatif", "--tp", "100000"], "--tp must be in"),
        (["vllm-config", "--max-num-batched-tokens", "0"], "--max-num-batched-tokens"),
        (["whatif", "--ops", "0"], "token count"),
    ],
)
def test_bounded_work(capsys, argv, needle, one_line_error):
    one_line_error(*argv, needle=needle)


@pytest.mark.parametrize(
    "text,needle",
    [
        (H.replace("tp,", "tp,tp,", 1) + ROW, "duplicate column 'tp'"),
        (H + ROW.strip() + ",extra\n", "12 cells for 11 columns"),
        (H + ROW.replace(",8,", ",8.5,", 1), "tp '8.5' is not a positive integer"),
        (
            H + ROW.replace(",8,", ",８,", 1),
            "tp '８' is not a positive integer",
        ),  # a non-ASCII digit
        (H + ROW.replace(",4096,", ",nan,", 1), "m 'nan'"),
        (H + ROW.replace(",4096,", ",inf,", 1), "m 'inf'"),
        (H + ROW.replace(",4096,", ",1e400,", 1), "m '1e400'"),
        (H + ROW.replace(",500,", ",nan,", 1), "finite time"),
        (H, "no data rows"),
        (H + '"unterminated,1\n', "malformed CSV"),
    ],
)
def test_bad_csv_cells_name_file_and_line(tmp_path, capsys, text, needle, one_line_error):
    f = tmp_path / "ops.csv"
    f.write_text(text)
    err = one_line_error("evaluate", str(f), needle=needle)
    if "cells" in needle or "integer" in needle or "m '" in needle:
        assert f"{f}:2" in err


def test_csv_bom_is_accepted_and_header_only_files_are_skipped(tmp_path, capsys):
    f = tmp_path / "bom.csv"
    f.write_bytes(b"\xef\xbb\xbf" + (H + ROW).encode())
    empty = tmp_path / "header.csv"
    empty.write_text(H)
    rc, out, err = _run(capsys, "evaluate", str(f), str(empty), "--json")
    assert rc == 0, err
    d = _strict_json(out)
    assert d["rows_scored"] == 1 and any("only a header" in s["reason"] for s in d["skipped"])


def test_unplaceable_rows_are_skipped_with_reason(tmp_path, capsys):
    f = tmp_path / "ops.csv"
    f.write_text(
        H
        + ROW
        + ROW.replace("h100-sxm", "no-such-gpu")
        + ROW.replace(",4096,", ",4097,", 1)
        + ROW.replace(",8,", ",16,", 1)
    )
    rc, out, _ = _run(capsys, "evaluate", str(f), "--json")
    d = _strict_json(out)
    reasons = " | ".join(s["reason"] for s in d["skipped"])
    assert (
        rc == 0
        and d["rows_scored"] == 1
        and "unknown GPU profile" in reasons
        and "not divisible" in reasons
    )
    assert "not available at tp=16" in reasons


def test_json_is_valid_where_the_model_has_infinities(capsys):
    for argv in (
        ["whatif", "--tp", "16", "--json"],
        ["whatif", "--tp", "16", "--ops", "4096", "--json"],
        ["vllm-config", "--tp", "16", "--gpu", "h100-sxm"],
        ["profiles", "--json"],
        ["models", "--json"],
    ):
        rc, out, err = _run(capsys, *argv)
        assert rc == 0, err
        _strict_json(out)


def test_outputs_are_never_overwritten_without_force(tmp_path, capsys, one_line_error):
    png = tmp_path / "w.png"
    png.write_bytes(b"precious")
    one_line_error("whatif", "--no-band", "--plot", str(png), needle="--force")
    assert png.read_bytes() == b"precious"
    one_line_error("whatif", "--no-band", "--plot", str(tmp_path), needle="directory")
    rc, _, _ = _run(capsys, "whatif", "--no-band", "--plot", str(png), "--force")
    assert rc == 0 and png.read_bytes()[:4] == b"\x89PNG" and not list(tmp_path.glob(".*tmp*"))
    csv = tmp_path / "ops.csv"
    csv.write_text(H + ROW)
    one_line_error("evaluate", str(csv), "--plot", str(csv), needle="input of this command")
    assert csv.read_text() == H + ROW


def test_calibrate_and_validate_check_arguments_before_starting(
    tmp_path, capsys, monkeypatch, one_line_error
):
    need("torch")
    prof = tmp_path / "p.toml"
    one_line_error(
        "calibrate", "--device", "cpu", "--nproc", "64", "--out", str(prof), needle="--nproc"
    )
    one_line_error(
        "calibrate", "--device", "cpu", "--budget-s", "nan", "--out", str(prof), needle="--budget-s"
    )
    one_line_error("calibrate", "--device", "cpu", "--out", str(tmp_path / "p.txt"), needle=".toml")
    prof.with_suffix(".samples.jsonl").write_text('{"kind": "gemm"}\n')
    one_line_error("calibrate", "--device", "cpu", "--out", str(prof), needle="--force")
    monkeypatch.setenv("TPCOST_CALIB_TIMEOUT_S", "soon")
    one_line_error(
        "calibrate",
        "--device",
        "cpu",
        "--out",
        str(tmp_path / "q.toml"),
        needle="TPCOST_CALIB_TIMEOUT_S",
    )
    monkeypatch.delenv("TPCOST_CALIB_TIMEOUT_S")
    mine = tmp_path / "mine.toml"
    mine.write_text(
        open(
            os.path.join(os.path.dirname(__file__), "..", "costmodel", "profiles", "h100-sxm.toml")
        ).read()
    )
    before = mine.read_text()
    one_line_error(
        "validate",
        "--gpu",
        str(mine),
        "--model",
        "llama-3.1-8b",
        "--device",
        "cpu",
        "--out",
        str(mine),
        needle="validate --out",
    )
    one_line_error(
        "validate",
        "--gpu",
        str(mine),
        "--model",
        "llama-3.1-8b",
        "--device",
        "cpu",
        "--nproc",
        "3",
        "--out",
        str(tmp_path / "v.csv"),
        needle="divisible",
    )
    one_line_error(
        "validate",
        "--gpu",
        str(mine),
        "--model",
        "llama-3.1-8b",
        "--device",
        "cpu",
        "--seq-len",
        "0",
        "--out",
        str(tmp_path / "v.csv"),
        needle="validate --seq-len",
    )
    assert mine.read_text() == before


def test_tpcost_profile_env_is_checked(capsys, monkeypatch, one_line_error):
    monkeypatch.setenv("TPCOST_PROFILE", "no-such-gpu")
    one_line_error("vllm-config", "--gpu", "auto", needle="TPCOST_PROFILE='no-such-gpu'")


def test_tpcost_profile_env_says_it_does_not_act_without_gpu_auto(capsys, monkeypatch):
    """Set for the plugin, TPCOST_PROFILE is not read by a command given another --gpu: one note
    says so, and the answer is the one without the variable."""
    from integration.cli import main

    args = ["whatif", "--gpu", "h100-sxm", "--tokens", "1024", "--json"]
    assert main(args) == 0
    plain = capsys.readouterr()
    monkeypatch.setenv("TPCOST_PROFILE", "b200")
    assert main(args) == 0
    noted = capsys.readouterr()
    assert noted.out == plain.out and "TPCOST_PROFILE" not in plain.err
    assert (
        noted.err.strip()
        == "tpcost: note: TPCOST_PROFILE is read with --gpu auto only; this run uses --gpu h100-sxm"
    )


def test_version_and_help_on_every_option(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("tpcost ")
    from integration.cli import build_parser

    ap = build_parser()
    for name, sub in ap._subparsers._group_actions[0].choices.items():
        for action in sub._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{name} {action.option_strings} has no help text"


@pytest.mark.parametrize(
    "argv,needles",
    [
        (
            ("op", "--tp", "x", "--op", "zz", "--n", "-1", "--k", "y"),
            ("--tp", "'zz'", "--n must be", "--k: 'y'"),
        ),
        (("op", "--tp", "4", "--n", "x"), ("--n: 'x'", "required: --op, --k")),
        (("whatif", "--tp", "3x", "--bogus"), ("'3x'", "unrecognized arguments: --bogus")),
        (
            (
                "op",
                "--tp",
                "4",
                "--op",
                "gemm_ar",
                "--impl",
                "kernel",
                "--n",
                "1",
                "--k",
                "1",
                "--kernel-sm-share",
                "2",
                "--margin",
                "5",
                "--m",
                "0",
                "7",
            ),
            ("--kernel-sm-share", "--margin", "--m must be"),
        ),
    ],
)
def test_every_bad_flag_of_a_call_in_one_line(argv, needles, one_line_error):
    """Issue 61 item 2: every refused value of a call is named in the one error line, not only the
    first."""
    err = one_line_error(*argv)
    for n in needles:
        assert n in err, (n, err)
    assert err.count("; ") >= len(needles) - 1


def test_capture_size_moves_where_vllm_runs_the_model_level_ag_matmul(capsys):
    """vLLM 0.34's sp_all_gather_matmul never runs while a CUDA graph is captured
    (can_sp_all_gather_matmul:
    not torch.cuda.is_current_stream_capturing()): a capture size above its gate moves vLLM's rows,
    so the flag takes effect (it was refused as "no effect"); one below vLLM's default still changes
    nothing, and is refused."""
    import json

    from integration.cli import main

    base = [
        "op",
        "--op",
        "ag_gemm",
        "--impl",
        "torch",
        "--vllm-version",
        "0.34",
        "--gpu",
        "b300",
        "--tp",
        "4",
        "--n",
        "8192",
        "--k",
        "8192",
        "--m",
        "4096",
        "8192",
        "12288",
        "--json",
    ]
    assert main(base) == 0
    default = {r["m"]: r["vllm_runs_kernel"] for r in json.loads(capsys.readouterr().out)["rows"]}
    assert default[4096] and default[8192] and default[12288]
    assert main([*base, "--cudagraph-max-tokens", "8192"]) == 0
    d = json.loads(capsys.readouterr().out)
    runs = {r["m"]: r["vllm_runs_kernel"] for r in d["rows"]}
    assert not runs[4096] and not runs[8192] and runs[12288]
    assert d["vllm_rule_tokens"] == 8193
    assert main([*base, "--cudagraph-max-tokens", "512"]) == 2
    assert "no effect" in capsys.readouterr().err


def test_set_on_the_0_34_gate_path_takes_effect_or_is_refused(capsys):
    """--set on a model whose 0.34 gates tpcost prices (MiniMax-M3) ran the gates' band on the
    recording copy of the profile and ended in a traceback (exit 1). A key the gates read now moves
    the answer; one nothing reads is one line, exit 2."""
    from pathlib import Path

    from integration.cli import main

    cfg = (
        Path(__file__).resolve().parents[1]
        / "data"
        / "reference"
        / "models"
        / "minimax-m3.config.json"
    )
    base = [
        "vllm-config",
        "--gpu",
        "b200",
        "--model",
        str(cfg),
        "--tp",
        "4",
        "--vllm-version",
        "0.34",
    ]
    assert main(base) == 0
    plain = capsys.readouterr().err
    assert main([*base, "--set", "memory.hbm_bw_bytes_per_s=4e12"]) == 0
    slow = capsys.readouterr().err
    assert "MODIFIED by --set" in slow and "MODIFIED" not in plain
    gate = [ln for ln in slow.splitlines() if "gate minimax_m3.finalize_ar" in ln]
    assert gate and gate != [ln for ln in plain.splitlines() if "gate minimax_m3.finalize_ar" in ln]
    assert main([*base, "--set", "asynctp.barrier_s=1e-5"]) == 2
    err = capsys.readouterr().err
    assert "no effect" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"num_key_value_heads": 3}, "num_key_value_heads 3 must divide num_attention_heads 64"),
        ({"num_key_value_heads": 128}, "num_key_value_heads 128 must divide"),
        ({"moe_layer_freq": [2] * 62}, "moe_layer_freq must be a list of 0 / 1 per layer"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
        (
            {"num_attention_heads": 48, "num_key_value_heads": 6},
            "6 KV heads do not split over TP 4",
        ),
    ],
)
def test_mutated_gate_model_configs_are_refused(tmp_path, capsys, change, needle):
    """Mutations of MiniMax-M3's config that vLLM refuses before it builds the model: one line, exit
    2."""
    import json
    from pathlib import Path

    from integration.cli import main

    cfg = json.loads(
        (
            Path(__file__).resolve().parents[1]
            / "data"
            / "reference"
            / "models"
            / "minimax-m3.config.json"
        ).read_text()
    )
    (cfg.get("text_config") or cfg).update(change)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert (
        main(
            [
                "vllm-config",
                "--gpu",
                "b200",
                "--model",
                str(path),
                "--tp",
                "4",
                "--vllm-version",
                "0.34",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


@pytest.mark.parametrize("cmd", ["whatif", "vllm-config"])
def test_every_bad_name_of_a_call_is_in_the_one_line(one_line_error, cmd):
    """Issue 61 item 2: a call with a bad GPU, a bad model and a bad dtype names all three in its
    one error line, not the first alone."""
    err = one_line_error(
        cmd,
        "--gpu",
        "H100-sxmm",
        "--model",
        "Llama-3.1-70X",
        "--dtype",
        "fp9",
        "--tp",
        "4",
        needle="unknown GPU profile 'H100-sxmm'",
    )
    assert "unknown model 'Llama-3.1-70X'" in err and "unknown dtype 'fp9'" in err
    err = one_line_error(
        cmd, "--gpu", "h100-sxm", "--model", "Llama-3.1-70X", needle="unknown model"
    )
    assert "GPU profile" not in err


def test_ep_names_every_bad_name_at_once(one_line_error):
    """The same for `tpcost ep`: a bad GPU and a bad model in the one line."""
    err = one_line_error(
        "ep",
        "--gpu",
        "H100x",
        "--model",
        "nope2",
        "--enable-expert-parallel",
        "--data-parallel-size",
        "8",
        needle="unknown GPU profile 'H100x'",
    )
    assert "unknown model 'nope2'" in err
