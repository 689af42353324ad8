"""Issue 50 (Hardening IV): a flag or column takes effect or is refused, in every command. Each case
is what a user typed; the refusal is one line, exit 2; where the flag does take effect, the answer
moves."""

import json

import pytest
from conftest import sp_release_flag

from integration.cli import main

KIMI = "data/reference/models/kimi-k3.config.json"
OP_KERNEL = [
    "op",
    "--gpu",
    "b200",
    "--tp",
    "8",
    "--op",
    "gemm_ar",
    "--impl",
    "kernel",
    "--n",
    "7168",
    "--k",
    "1536",
]
OP_TORCH = [
    "op",
    "--gpu",
    "h100-sxm",
    "--tp",
    "8",
    "--op",
    "gemm_rs",
    "--impl",
    "torch",
    "--n",
    "8192",
    "--k",
    "3584",
    "--vllm-version",
    "0.31",
]


def _rows(capsys, argv):
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)["rows"]


def test_op_refuses_a_context_len_column(tmp_path, one_line_error):
    """Item 7: vllm-config --kernel-op refuses a workload's context_len column ("drop the column");
    op did take it silently. Both refuse it now, the same way; the same traffic without the column
    is taken."""
    w = tmp_path / "w.csv"
    w.write_text("num_tokens,count,context_len\n128,10,4096\n2048,3,1\n")
    one_line_error(
        *OP_KERNEL, "--workload", str(w), needle="context_len column has no effect on op"
    )
    one_line_error(
        "vllm-config",
        "--model",
        KIMI,
        "--gpu",
        "b200",
        "--tp",
        "8",
        "--kernel-op",
        "gemm_ar",
        "--workload",
        str(w),
        needle="drop the column",
    )
    w.write_text("num_tokens,count\n128,10\n2048,3\n")
    assert main([*OP_KERNEL, "--workload", str(w)]) == 0


@pytest.mark.parametrize("flag", [["--enforce-eager"], ["--cudagraph-max-tokens", "0"]])
def test_op_kernel_refuses_graph_flags_that_change_nothing(capsys, one_line_error, flag):
    """The single kernel is one launch under graphs or eager: the flags left every row
    byte-identical and are refused; on torch's host-issued pipeline they move the rows above the
    capture size and are taken."""
    one_line_error(*OP_KERNEL, *flag, needle="no effect on gemm_ar (kernel)")
    assert _rows(capsys, [*OP_TORCH, *flag]) != _rows(capsys, OP_TORCH)


def test_op_refuses_vllm_set_limits_its_collective_never_reads(capsys, one_line_error):
    """A --vllm-set limit the op's unfused collective never consults is refused (the FlashInfer
    limit on the kernel's GEMM-AR, custom AR on a reduce-scatter); one it reads moves the rows."""
    one_line_error(
        *OP_KERNEL,
        "--vllm-set",
        "fi_fusion_max_bytes=0",
        needle="--vllm-set fi_fusion_max_bytes: no effect",
    )
    rs = [
        "op",
        "--gpu",
        "b200",
        "--tp",
        "8",
        "--op",
        "gemm_rs",
        "--impl",
        "kernel",
        "--n",
        "7168",
        "--k",
        "1536",
    ]
    one_line_error(*rs, "--vllm-set", "custom_ar_max_bytes=0", needle="never consults that limit")
    assert _rows(capsys, [*OP_KERNEL, "--vllm-set", "custom_ar_max_bytes=0"]) != _rows(
        capsys, OP_KERNEL
    )


def test_draft_hidden_size_takes_effect_or_is_refused(capsys, one_line_error):
    """Item 13: --draft-hidden-size on vLLM 0.31 was accepted and ignored; on 0.32 a draft twice as
    wide printed "agree only below 1 tokens" and "off (decided ...)" beside times where off was
    slower."""
    base = ["vllm-config", "--gpu", "h100-sxm", "--tp", "4", "--model", "llama-3.1-70b"]
    one_line_error(
        *base,
        "--vllm-version",
        "0.31",
        "--draft-hidden-size",
        "9216",
        needle="no effect on vLLM 0.31",
    )
    one_line_error(
        *base,
        "--vllm-version",
        "0.32",
        "--draft-hidden-size",
        "4096",
        needle="not wider than the target",
    )
    one_line_error(
        *base,
        "--vllm-version",
        "0.32",
        "--gpu",
        "mi300x",
        "--draft-hidden-size",
        "9216",
        needle="no FlashInfer fusion",
    )
    assert main([*base, "--vllm-version", "0.32", "--draft-hidden-size", "16384"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["pass_config"] == {"fuse_allreduce_rms": False}
    assert "below 1 tokens" not in err and "agree at no token count: the fusion is off" in err
    line = next(ln for ln in err.splitlines() if "FlashInfer fused all-reduce+RMSNorm off" in ln)
    assert "(capped for the draft model;" in line and "decided" not in line
    # the time printed for the range is the capped range's: off's own
    t = [
        float(x)
        for x in line.split("all-reduce+norm ")[1].replace(" ms", "").replace(",", "").split()
        if x.replace(".", "").isdigit()
    ]
    assert t[0] == t[1], line
    # vLLM's own limit with this draft fuses nothing either (its first range ends beyond it)
    assert t[2] == t[1], line


def test_kernel_path_refuses_draft_where_nothing_is_fused(one_line_error):
    """The kernel path under model-level SP has no all-reduce+RMSNorm to fuse: --draft-hidden-size
    is refused."""
    one_line_error(
        "vllm-config",
        "--model",
        KIMI,
        "--gpu",
        "b200",
        "--tp",
        "8",
        "--kernel-op",
        "gemm_rs",
        "--enable-expert-parallel",
        "--data-parallel-size",
        "2",
        "--vllm-version",
        "0.33",
        "--draft-hidden-size",
        "9216",
        needle="--draft-hidden-size: no effect here (model-level SP",
    )


def test_whatif_and_vllm_config_value_the_same_decided_schedule(capsys):
    """Item 5: at TP 16 on h100-sxm (SP+AsyncTP cannot run; SP alone decided) whatif said "saves
    0.000 ms against never" beside "decided: SP alone from 1168" and vllm-config "saves 13.068 ms":
    both value the decided schedule."""
    import re

    base = ["--gpu", "h100-sxm", "--tp", "16", "--vllm-version", "0.31"]
    assert main(["whatif", *base, "--no-band"]) == 0
    out = capsys.readouterr().out
    decided = re.search(r"decided: (.+?) from (\d+) tokens", out)
    value = re.search(
        r"value of the decision \((.+?), expected forward [\d.]+ ms\): saves ([\d.]+) ms", out
    )
    assert decided and value and value.group(1) == decided.group(1) == "SP alone", out
    assert main(["vllm-config", *base]) == 0
    err = capsys.readouterr().err
    saves = re.search(r"saves ([\d.]+) ms against never", err)
    assert saves and saves.group(1) == value.group(2) and float(saves.group(1)) > 0, err
    assert f"SP alone from {decided.group(2)} tokens" in err


def test_op_names_crossover_and_threshold_marks_steps_and_breaks_down(capsys):
    """Items 8-12 on `op`: the crossover (where the fused op wins for good) and the decided
    threshold as two named numbers; the saving said to be per forward of the op's call sites only;
    the graph-to-eager switch of torch's op noted and marked at its row; wave steps and dispatch
    edges marked where they fall; --at M breaks each arm down with achieved rates and the bound."""
    kern = [
        "op",
        "--gpu",
        "h100-sxm",
        "--tp",
        "8",
        "--op",
        "gemm_rs",
        "--impl",
        "kernel",
        "--n",
        "8192",
        "--k",
        "3584",
    ]
    assert main([*kern, "--json", "--at", "384"]) == 0
    d = json.loads(capsys.readouterr().out)
    rows = {r["m"]: r for r in d["rows"]}
    wins = [m for m, r in rows.items() if m >= d["crossover_m"]]
    assert (
        all(rows[m]["speedup"] > 1 for m in wins)
        and rows[max(m for m in rows if m < d["crossover_m"])]["speedup"] <= 1
    )
    # the zig-zag 128 -> 256 -> 384 is the kernel's second wave: marked at 384, where the waves step
    assert rows[256]["waves"] == 1 and rows[384]["waves"] == 2
    assert {
        "m": 384,
        "what": "waves 1 -> 2 (the kernel's tiles fill one more pass over the SMs)",
    } in d["events"]
    edge = next(e for e in d["events"] if e["what"].startswith("unfused collective"))
    before = max(m for m in rows if m < edge["m"])
    assert rows[before]["unfused_impl"] != rows[edge["m"]]["unfused_impl"]
    b = d["breakdown"]
    assert (
        b["m"] == 384
        and b["fused"]["waves"] == 2
        and b["unfused"]["gemm"]["achieved_flops_per_s"] > 0
    )
    assert b["fused"]["t_s"] == pytest.approx(rows[384]["t_fused_s"]) and b["unfused"][
        "t_s"
    ] == pytest.approx(rows[384]["t_unfused_s"])
    assert main(kern) == 0
    out = capsys.readouterr().out
    assert (
        f"crossover M (the fused op faster at every M from it to the budget): {d['crossover_m']}; "
        "decided "
        f"threshold (least expected time on the workload, premium included): {d['cutoff_tokens']}"
        in out
    )
    # Hopper: vLLM runs no row
    assert "not shipped by vLLM" in out and "vLLM's own rule: none: vLLM" in out
    assert all(not r["vllm_runs_kernel"] for r in d["rows"])
    assert main(OP_TORCH) == 0
    out = capsys.readouterr().out
    assert "note: M > 512 runs eagerly" in out
    eager_row = next(ln for ln in out.splitlines() if "<- eager from here (M > 512" in ln)
    assert eager_row.split()[0] == "640"
    assert (
        "per forward of this op's 1 call(s) only" in out
        and "the rest of the forward is not modelled" in out
    )


def test_whatif_marks_dispatch_edges(capsys):
    """Item 12 on whatif: t_tp falls from 2048 to 2052 tokens at vLLM's symm-mem -> NCCL switch (32
    MiB); the note names the edge where it falls."""
    assert (
        main(["whatif", "--gpu", "h100-sxm", "--tp", "4", "--no-band", "--tokens", "2048", "2052"])
        == 0
    )
    out = capsys.readouterr().out
    assert "symm_mem_multimem up to 2048 tokens, nccl_all_reduce from 2052 (32.1 MiB)" in out


@pytest.mark.parametrize(
    "value,needle",
    [
        ("0", "--at must be in [1"),
        ("x", "is not an integer"),
        ("7", "not a row of this op's sweep"),
    ],
)
def test_op_at_bad_input(one_line_error, value, needle):
    one_line_error(*OP_KERNEL, "--at", value, needle=needle)


def test_kernel_switch_names_crossover_and_threshold_per_site(capsys, tmp_path):
    """Items 8 and 9 on vllm-config --kernel-op: per call site the crossover (where the kernel wins
    for good, the same on any traffic) and the decided threshold (which moves with the traffic) as
    two named numbers; the times said to be the call sites' alone."""
    argv = [
        "vllm-config",
        "--model",
        KIMI,
        "--gpu",
        "b200",
        "--tp",
        "8",
        "--kernel-op",
        "gemm_ar",
        "--json",
    ]
    assert main(argv) == 0
    uniform = json.loads(capsys.readouterr().out)["kernel_switch"]["sites"]
    w = tmp_path / "skewed.csv"
    w.write_text("num_tokens,count\n512,100\n2048,100\n4096,1\n")
    assert main([*argv, "--workload", str(w)]) == 0
    skewed = json.loads(capsys.readouterr().out)["kernel_switch"]["sites"]
    for a, b in zip(uniform, skewed):
        assert a["crossover_tokens"] == b["crossover_tokens"] is not None
        assert a["cutoff_tokens"] >= a["crossover_tokens"]
    assert main(argv[:-1]) == 0
    err = capsys.readouterr().err
    s = uniform[0]
    assert (
        f"crossover M {s['crossover_tokens']} (faster at every M from it), decided threshold "
        f"{s['cutoff_tokens']} (least expected time on this traffic"
    ) in err
    assert "the rest of the forward is not modelled, so they are no share of a step" in err


def test_whatif_states_each_rows_decode_context(capsys, tmp_path):
    """Item 3: with a context_len column, each swept N is priced at a context the output names, and
    where it comes from: the workload's steps that pad to it, or (marked *) the workload's mean
    where none does; the header no longer reads as if seq_len set it."""
    w = tmp_path / "w.csv"
    w.write_text("num_tokens,count,context_len\n8,100,32768\n64,50,16384\n2048,20,1\n8192,5,1\n")
    argv = ["whatif", "--gpu", "h100-sxm", "--tp", "4", "--no-band", "--workload", str(w)]
    assert main([*argv, "--json"]) == 0
    rows = {r["num_tokens"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows[8]["decode_context_len"] == 32768 and rows[8]["decode_context_from"] == "workload"
    assert rows[2048]["decode_context_len"] == 1 and rows[2048]["decode_context_from"] == "workload"
    mean = (100 * 32768 + 50 * 16384 + 25) / 175
    assert rows[128]["decode_context_from"] == "workload mean"
    assert rows[128]["decode_context_len"] == pytest.approx(mean)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert (
        "prefill seq_len 1024, decode context per row from" in out
        and "context_len column (ctx)" in out
    )
    row128 = next(ln for ln in out.splitlines() if ln.split() and ln.split()[0] == "128")
    assert row128.rstrip().endswith(f"{mean:.0f}*")
    assert main(["whatif", "--gpu", "h100-sxm", "--tp", "4", "--no-band", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)["rows"][0]
    assert (r["decode_context_len"], r["decode_context_from"]) == (1024, "context_len")


def test_whatif_sensitivity_heading_says_how_many_move_it(capsys, tmp_path):
    """Item 15: 'top 5' beside one row: the heading says how many inputs move the cutoff, and why
    few do on a workload of a few step sizes."""
    w = tmp_path / "w.csv"
    w.write_text("num_tokens,count\n8,100\n2048,20\n8192,5\n")
    assert (
        main(["whatif", "--gpu", "h100-sxm", "--tp", "4", "--workload", str(w), *sp_release_flag()])
        == 0
    )
    out = capsys.readouterr().out
    head = next(ln for ln in out.splitlines() if ln.startswith("what moves the cutoff"))
    listed = []
    # after the column heading, up to the first other line
    for ln in out.split(head)[1].splitlines()[2:]:
        if not ln.startswith("  "):
            break
        listed.append(ln)
    import re

    m = re.search(r"all (\d+) that move it", head)
    k = int(m.group(1)) if m else 0
    assert m or "none of them moves it" in head
    assert len(listed) == k and "top 5" not in head and "workload's own step sizes" in head


def test_error_lines_name_what_the_user_did(tmp_path, one_line_error):
    """Issue 50: a DeepSeek-V4.1 gemm_ar was refused "with model-level SP" when no SP flag was
    given; the line now says the model has no GEMM-AR site."""
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {
                "architectures": ["DeepseekV41ForCausalLM"],
                "model_type": "deepseek_v41",
                "hidden_size": 7168,
                "num_hidden_layers": 61,
                "o_groups": 8,
                "o_lora_rank": 1024,
                "torch_dtype": "bfloat16",
                "num_attention_heads": 128,
            }
        )
    )
    err = one_line_error(
        "vllm-config",
        "--model",
        str(cfg),
        "--gpu",
        "b200",
        "--tp",
        "8",
        "--kernel-op",
        "gemm_ar",
        needle="has no GEMM-AR call site",
    )
    assert "with model-level SP (" not in err


def test_installed_version_is_named_as_installed():
    """An installed vLLM 0.40 is named as the installed distribution, not as a --vllm-version the
    user never gave."""
    from costmodel.errors import TpcostError
    from costmodel.vllm_tables import resolve

    with pytest.raises(TpcostError) as e:
        resolve(None, ("0.40.0", "the installed distribution vllm 0.40.0"))
    assert str(e.value).startswith(
        "the installed distribution vllm 0.40.0: tpcost has no record of vLLM 0.40"
    )
    assert "--vllm-version" not in str(e.value)


def test_min_confidence_takes_effect_or_is_refused(capsys, one_line_error):
    """Issue 50: --min-confidence (and --draft-hidden-size, --fi-allreduce-fusion-max-size-mb) were
    accepted and ignored on the kernel path. --min-confidence gates only a move of vLLM's fusion
    limit: where the range comes out the same as at the default it is refused, on every command;
    where it moves the range it is taken."""
    one_line_error(
        "vllm-config",
        "--gpu",
        "h100-sxm",
        "--tp",
        "4",
        "--min-confidence",
        "0.5",
        needle="no effect here",
    )
    one_line_error(
        "whatif",
        "--gpu",
        "h100-sxm",
        "--tp",
        "4",
        "--no-band",
        "--min-confidence",
        "0.5",
        needle="no effect here",
    )
    one_line_error(
        "vllm-config",
        "--model",
        KIMI,
        "--gpu",
        "b200",
        "--tp",
        "8",
        "--kernel-op",
        "gemm_ar",
        "--min-confidence",
        "0.3",
        needle="no effect here",
    )
    base = ["vllm-config", "--gpu", "h100-sxm", "--tp", "2", "--model", "llama-3.1-70b"]
    outs = []
    # the default moves vLLM's limit; asking for every draw keeps it
    for extra in (
        [],
        ["--min-confidence", "1"],
    ):
        assert main([*base, *extra]) == 0
        outs.append(json.loads(capsys.readouterr().out)["pass_config"])
    assert outs[0] != outs[1]


def test_vllm_set_limits_take_effect_or_are_refused(capsys, one_line_error):
    """A --vllm-set limit the collective asked about never consults (FlashInfer's fused AR+norm
    limit on a plain all-reduce) is refused by collective, as op and whatif refuse theirs; one that
    moves the answer is taken."""
    one_line_error(
        "collective",
        "--gpu",
        "h100-sxm",
        "--tp",
        "4",
        "--op",
        "all_reduce",
        "--vllm-set",
        "fi_fusion_max_bytes=0",
        needle="--vllm-set fi_fusion_max_bytes: no effect on the all_reduce",
    )
    base = ["collective", "--gpu", "h100-sxm", "--tp", "4", "--op", "all_reduce", "--json"]
    assert main(base) == 0
    a = json.loads(capsys.readouterr().out)["rows"]
    assert main([*base, "--vllm-set", "custom_ar_max_bytes=0"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] != a
    # whatif: a limit the forward's all-reduces never reach at this budget
    one_line_error(
        "whatif",
        "--gpu",
        "h100-sxm",
        "--tp",
        "4",
        "--no-band",
        "--max-num-batched-tokens",
        "64",
        "--vllm-set",
        "symm_mem_max_bytes=0",
        needle="--vllm-set symm_mem_max_bytes: no effect",
    )


def test_kernel_path_fusion_flag_under_model_level_sp_is_refused(capsys, one_line_error):
    """--fi-allreduce-fusion-max-size-mb under model-level SP left the kernel path's answer
    byte-identical: refused; in GEMM-AR mode it moves the emitted range and is taken."""
    sp = [
        "vllm-config",
        "--model",
        KIMI,
        "--gpu",
        "b200",
        "--tp",
        "8",
        "--kernel-op",
        "gemm_rs",
        "--enable-expert-parallel",
        "--data-parallel-size",
        "2",
        "--vllm-version",
        "0.33",
    ]
    one_line_error(
        *sp, "--fi-allreduce-fusion-max-size-mb", "0.5", needle="no effect under model-level SP"
    )
    ar = ["vllm-config", "--model", KIMI, "--gpu", "b200", "--tp", "8", "--kernel-op", "gemm_ar"]
    assert main(ar) == 0
    a = capsys.readouterr().out
    assert main([*ar, "--fi-allreduce-fusion-max-size-mb", "0.5"]) == 0
    assert capsys.readouterr().out != a


@pytest.mark.parametrize(
    "argv",
    [
        ["whatif", "--no-band"],
        ["evaluate", "tests/fixtures/eval_op.csv"],
        ["collective", "--gpu", "h100-sxm", "--tp", "4", "--op", "all_reduce"],
    ],
)
def test_force_alone_is_refused(one_line_error, argv):
    """--force replaces an existing --plot file: given alone it was accepted and ignored by
    whatif."""
    one_line_error(
        *argv, "--force", needle="--force: replaces an existing --plot file; give --plot too"
    )


def test_the_band_names_only_quantities_a_set_can_move(capsys, tmp_path):
    """Issue 61 (band drivers): every quantity whatif and op name as moving the band is one the
    query reads, so `--set` on it takes effect instead of being refused as having no effect (this
    workload's band named fused_kernel.ar_fence_s, which H100 never reads)."""
    w = tmp_path / "w.csv"
    w.write_text("num_tokens,count\n8,100\n2048,20\n8192,5\n")
    runs = [
        ["whatif", "--gpu", "h100-sxm", "--tp", "4", "--workload", str(w), *sp_release_flag()],
        [
            "op",
            "--gpu",
            "b300",
            "--tp",
            "4",
            "--op",
            "ag_gemm",
            "--n",
            "4608",
            "--k",
            "8192",
            "--vllm-version",
            "0.34",
        ],
    ]
    for argv in runs:
        assert main([*argv, "--json"]) == 0
        d = json.loads(capsys.readouterr().out)
        drivers = d.get("cutoff_band_drivers") or []
        assert drivers, argv
        for q in drivers:
            key = q["quantity"] if isinstance(q, dict) else q[0]
            from costmodel import load_profile

            v = load_profile(argv[2]).value(key)
            fast = ["--no-band"] if argv[0] == "whatif" else []
            assert main([*argv, "--json", *fast, "--set", f"{key}={v * 0.9}"]) == 0, key
            capsys.readouterr()
