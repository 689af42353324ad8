"""NVLink multicast is an explicit interconnect field (issue 57 item 1), never inferred from
[fused_kernel]: every reader takes it from `interconnect.multicast`, a what-if on it takes effect,
and a bad value is one line."""

import numpy as np
import pytest

from costmodel import ops
from costmodel.profile import builtin_profile_names, load_profile, with_overrides

KERNEL_OP = [
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
    "4096",
]


@pytest.mark.parametrize("name", builtin_profile_names())
def test_every_profile_states_multicast_and_the_kernel_needs_it(name):
    p = load_profile(name)
    # each spec says it, with its source
    assert p.provenance["interconnect.multicast"].tier != "assumed"
    assert ops.has_multicast(p) == (int(p.interconnect.multicast) == 1)
    if p.fused_kernel is not None:  # the kernel's terms are fitted only where the domain multicasts
        assert ops.has_multicast(p)
    if not ops.has_multicast(p):
        assert "multicast" in ops.kernel_available(p, 4)


def test_a_what_if_without_multicast_turns_the_multicast_backends_off():
    b200 = load_profile("b200")
    off = with_overrides(b200, {"interconnect.multicast": 0})
    assert ops.kernel_available(b200, 4) is None and "multicast" in ops.kernel_available(off, 4)
    msg = np.array([64e3, 1e6, 8e6])
    _, on_impls = ops.reduce_scatter_dispatch(ops.Hw(b200, "bf16"), msg, 4, model_level_sp=True)
    _, off_impls = ops.reduce_scatter_dispatch(ops.Hw(off, "bf16"), msg, 4, model_level_sp=True)
    assert any("lamport" in i or "multimem" in i for i in on_impls)
    assert not any("lamport" in i or "multimem" in i for i in off_impls)
    # the measured collectives ride the same link: a multicast what-if keeps them
    assert off.measured == b200.measured


def test_multicast_flag_takes_effect_or_is_refused(one_line_error):
    from integration.cli import main

    assert main([*KERNEL_OP, "--json"]) == 0
    one_line_error(*KERNEL_OP, "--set", "interconnect.multicast=0", needle="multicast")
    one_line_error(*KERNEL_OP, "--set", "interconnect.multicast=2", needle="interconnect.multicast")
    one_line_error(
        *KERNEL_OP, "--set", "interconnect.multicast=0.5", needle="interconnect.multicast"
    )
    one_line_error(
        "op",
        "--gpu",
        "a100-sxm-80gb",
        "--tp",
        "4",
        "--op",
        "gemm_rs",
        "--impl",
        "kernel",
        "--n",
        "7168",
        "--k",
        "4096",
        "--set",
        "interconnect.multicast=1",
        needle="[fused_kernel]",
    )


def test_a_kernel_profile_without_the_field_is_refused(one_line_error, tmp_path):
    from pathlib import Path

    text = (
        Path(__file__).resolve().parents[1] / "costmodel" / "profiles" / "b200.toml"
    ).read_text()
    assert text.count("\nmulticast = 1\n") == 1
    bad = tmp_path / "old-b200.toml"
    bad.write_text(text.replace("\nmulticast = 1\n", "\n"))
    one_line_error(
        *KERNEL_OP[:2],
        str(bad),
        *KERNEL_OP[3:],
        needle="add multicast = 1 (or 0) to [interconnect]",
    )


def test_a_profile_names_a_network_that_exists(one_line_error, tmp_path):
    """Issue 61 (spec files and profiles): interconnect.network is checked where the profile loads,
    not first where a command crosses the network."""
    from pathlib import Path

    text = (
        Path(__file__).resolve().parents[1] / "costmodel" / "profiles" / "b200.toml"
    ).read_text()
    assert text.count('network = "ib-cx7-400g"') == 1
    bad = tmp_path / "b200-bad-network.toml"
    bad.write_text(text.replace('network = "ib-cx7-400g"', 'network = "ib-nope"'))
    one_line_error(*KERNEL_OP[:2], str(bad), *KERNEL_OP[3:], needle="interconnect.network: unknown")


@pytest.mark.parametrize("gpu", ["a100-sxm-80gb", "l40s"])
def test_the_gates_report_stands_on_a_gpu_without_multicast(gpu, capsys):
    """Issue 61 (0.34 gates): on a GPU without NVLS the gates' report is the answer, each gate
    saying it is not derived and why, never a refusal of the whole command."""
    from pathlib import Path

    from integration.cli import main

    cfg = Path(__file__).resolve().parents[1] / "data/reference/models/minimax-m3.config.json"
    argv = ["vllm-config", "--model", str(cfg), "--vllm-version", "0.34", "--gpu", gpu, "--tp", "4"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "gate minimax_m3.gemm_rs" in err and "not derived: no single-kernel fused" in err
    assert "NVLink multicast" in err
