"""The typed hardware profile: parsed once into frozen dataclasses; one function makes new
instances."""

import dataclasses

import numpy as np
import pytest

from costmodel.errors import TpcostError
from costmodel.model import predict
from costmodel.profile import (
    Collective,
    HardwareProfile,
    Provenance,
    builtin_profile_names,
    load_profile,
    profile_from_dict,
    profile_to_tree,
    recording,
    with_overrides,
)
from costmodel.shapes import load_model
from pathlib import Path
from costmodel.profile import VALUE_RANGES, value_range

L70 = load_model("llama-3.1-70b")


@pytest.mark.parametrize("name", builtin_profile_names())
def test_every_number_has_provenance_and_the_types_hold(name):
    """One provenance per number and no number without one; the sections are the schema's classes.
    (The typed values themselves are checked against the TOML text, parsed independently:
    test_typed_profile_equals_the_toml_text.)"""
    p = load_profile(name)
    assert set(p.values()) == set(p.provenance)
    assert all(
        isinstance(c, Collective) for per_tp in p.collectives.values() for c in per_tp.values()
    )
    assert p.interconnect.kind in ("nvswitch", "nvlink-mesh", "pcie", "xgmi", "host")


def test_profile_is_immutable_and_with_values_makes_a_new_one():
    p = load_profile("h100-sxm")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.gemm.max_efficiency = 0.5
    with pytest.raises(TypeError):
        p.collectives["nccl_all_reduce"][4] = Collective(0.0, 1.0)
    q = p.with_values({"gemm.max_efficiency": 0.5})
    assert p.gemm.max_efficiency == pytest.approx(0.8033) and q.gemm.max_efficiency == 0.5
    assert q.provenance["gemm.max_efficiency"] == Provenance("--set by user", "assumed")
    assert p.provenance["gemm.max_efficiency"].tier == "published-measurement"
    assert q.modified == ("gemm.max_efficiency",) and p.modified == ()
    # the band's draws keep each key's provenance and are not marked as --set
    draws = np.array([[0.6], [0.7]])
    b = p.with_values({"gemm.max_efficiency": draws}, None, mark_modified=False)
    assert b.gemm.max_efficiency is draws and b.provenance == p.provenance and b.modified == ()


def test_with_values_refuses_what_the_schema_lacks_and_checks_ranges():
    p = load_profile("h100-sxm")
    with pytest.raises(TpcostError, match="unknown quantity"):
        p.with_values({"gemm.max_efficency": 0.5})
    with pytest.raises(TpcostError, match=r"\(0, 1\]"):
        p.with_values({"gemm.max_efficiency": 1.5})
    # calibration may add a schema key the prior lacks (a collective at a new TP size), with its
    # provenance
    cal = Provenance("calibrated by a test", "calibrated", 0.01)
    q = p.with_values(
        {
            "collectives.nccl_all_reduce.tp16.latency_s": 3e-5,
            "collectives.nccl_all_reduce.tp16.bus_bw_bytes_per_s": 1e11,
        },
        cal,
        mark_modified=False,
        new_keys_ok=True,
        name="h100-cal",
        notes={"calibration.host": "node1"},
    )
    assert q.collectives["nccl_all_reduce"][16] == Collective(3e-5, 1e11) and q.name == "h100-cal"
    assert (
        q.notes["calibration.host"] == "node1"
        and q.provenance["collectives.nccl_all_reduce.tp16.latency_s"] == cal
    )
    with pytest.raises(TpcostError, match="not a table"):
        p.with_values({"collectives.nccl_all_reduce.x16.latency_s": 1e-5}, cal, new_keys_ok=True)
    with pytest.raises(TpcostError, match="needs both"):
        p.with_values({"collectives.nccl_all_reduce.tp16.latency_s": 1e-5}, cal, new_keys_ok=True)
    # what calibration writes loads back to the same profile
    r = profile_from_dict(profile_to_tree(q), "round-trip")
    assert r.values() == q.values() and r.provenance == q.provenance and r.notes == q.notes


def test_a_vllm_limit_changes_the_prediction():
    """A what-if on vLLM's dispatch (a Vllm with a limit) reaches the model: FlashInfer off at 1 MiB
    messages."""
    from costmodel.model import Regime
    from costmodel.vllm_tables import Vllm

    p = load_profile("h100-sxm")
    n = np.array([64.0])  # 1 MiB messages: under vLLM's 2 MiB FlashInfer limit at tp 4
    base = predict(p, L70, 4, "bf16", n).t_forward_s("tp")
    off = predict(
        p, L70, 4, "bf16", n, Regime(vllm=Vllm((0, 31), (("fi_fusion_max_bytes", 0.0),)))
    ).t_forward_s("tp")
    assert off[0] != base[0]
    with pytest.raises(TpcostError, match="not a profile table"):
        with_overrides(p, {"vllm_dispatch.tp4.fi_fusion_max_bytes": 0.0})


def test_recording_sees_only_what_one_query_reads():
    p = load_profile("h100-sxm")
    traced, reads = recording(p)
    pred = predict(traced, L70, 4, "bf16", np.array([512.0, 4096.0]))
    assert np.array_equal(
        pred.t_forward_s("sp_asynctp"),
        predict(p, L70, 4, "bf16", np.array([512.0, 4096.0])).t_forward_s("sp_asynctp"),
    )
    assert "gemm.max_efficiency" in reads and "asynctp.barrier_s" in reads
    assert (
        "collectives.nccl_all_reduce.tp4.latency_s" in reads
        or "collectives.symm_mem_multimem.tp4.latency_s" in reads
    )
    assert not any(".tp8." in k or k.endswith(".tp8") for k in reads)  # another TP size's entries
    assert "compute.peak_flops_per_s.fp8" not in reads  # a bf16 run
    assert all(k in p.leaves() for k in reads)  # every read is a field of the schema
    assert isinstance(p, HardwareProfile) and p.modified == ()


ROOT = Path(__file__).resolve().parents[1]


SRC = (ROOT / "costmodel" / "profiles" / "h100-sxm.toml").read_text()


UNC = "[asynctp._sync.uncertainty_rel]"


def _unc_block(value: str) -> str:
    """h100-sxm.toml with the barrier's fitted sigma replaced by `value` (a TOML value)."""
    assert f"{UNC}\nbarrier_s = " in SRC
    head, tail = SRC.split(UNC, 1)
    rest = tail.split("\n", 2)[2]
    return f"{head}{UNC}\nbarrier_s = {value}\n{rest}"


@pytest.mark.parametrize(
    "name,text,needle",
    [
        ("unc-str", _unc_block('"abc"'), "uncertainty_rel of asynctp.barrier_s must be a number"),
        ("unc-table", _unc_block("{ a = 1 }"), "must be a number"),
        ("unc-nan", _unc_block("nan"), "outside [0, 1]"),
        ("unc-neg", _unc_block("-0.1"), "outside [0, 1]"),
        ("unc-huge", _unc_block("1e6"), "outside [0, 1]"),
        ("unc-bigint", _unc_block("1" + "0" * 400), "beyond the range of a float"),
        (
            "sm-bigint",
            SRC.replace("sm_count = 132", "sm_count = 1" + "0" * 400),
            "identity.sm_count = 1000",
        ),
        (
            "sm-1e308",
            SRC.replace("sm_count = 132", "sm_count = 1e308"),
            "identity.sm_count = 1e+308 is outside its plausible range [1, 4096] SMs",
        ),
        (
            "barrier",
            SRC.replace("barrier_s = ", "barrier_s = 1e308 #", 1),
            "asynctp.barrier_s = 1e+308 is outside its plausible range [0, 0.1] s",
        ),
    ],
)
def test_profile_values_out_of_range_are_one_line(
    tmp_path, capsys, one_line_error, name, text, needle
):
    f = tmp_path / f"{name}.toml"
    f.write_text(text)
    err = one_line_error("whatif", "--gpu", str(f), "--json", needle=needle)
    assert "beyond the range of a float" in err or "outside" in err or "must be a number" in err


def test_every_builtin_and_the_cpu_calibration_lie_inside_the_ranges():
    for name in builtin_profile_names():
        load_profile(name)  # check_params on load: raises when a value leaves its range
    cpu = load_profile(str(ROOT / "calib" / "data" / "cpu-gloo-w2" / "profile.toml"))
    assert cpu.identity.sm_count == 1
    # its widest sigmas are admitted
    assert max(p.uncertainty_rel or 0 for p in cpu.provenance.values()) > 0.47
    # every schema key has a range (value_range raises otherwise)
    for name in builtin_profile_names():
        for key in load_profile(name).values():
            value_range(key)
    assert len(VALUE_RANGES) >= 10


def test_set_error_names_the_typed_key_and_the_si_value(one_line_error):
    err = one_line_error(
        "whatif", "--set", "interconnect.link_bw_bytes_per_s=900", needle="interconnect.link_bw"
    )
    assert "did you mean 900e9" in err and "copy_engine" not in err
    one_line_error("whatif", "--set", "interconnect.latency_s=5", needle="did you mean 5e-6")
    # issue 50 item 14: a value typed with an exponent gets the corrected value, not "9e+15e-6"
    err = one_line_error(
        "whatif", "--set", "interconnect.link_bw_bytes_per_s=9e15", needle="did you mean 9e+12 "
    )
    assert "e+15e" not in err
    # issue 61 item 9: the power of 1000 that lands nearest the built-ins' values (TB/s for HBM),
    # not the first
    one_line_error(
        "whatif", "--set", "memory.hbm_bw_bytes_per_s=9.6", needle="did you mean 9.6e12 "
    )


ROOT = Path(__file__).resolve().parents[1]


def test_typed_profile_equals_the_toml_text():
    """Typed fields against the TOML file parsed independently (tomllib), not against the profile's
    own values()."""
    import tomllib

    from costmodel.profile import load_profile

    t = tomllib.loads((ROOT / "costmodel" / "profiles" / "h100-sxm.toml").read_text())
    p = load_profile("h100-sxm")
    assert p.identity.sm_count == t["identity"]["sm_count"] == 132
    assert p.memory.hbm_bw_bytes_per_s == t["memory"]["hbm_bw_bytes_per_s"] == 3.35e12
    assert p.interconnect.link_bw_bytes_per_s == t["interconnect"]["link_bw_bytes_per_s"]
    assert (
        p.collectives["nccl_all_reduce"][4].bus_bw_bytes_per_s
        == t["collectives"]["nccl_all_reduce"]["tp4"]["bus_bw_bytes_per_s"]
    )
    assert p.asynctp.barrier_s == t["asynctp"]["_sync"]["barrier_s"]


@pytest.mark.parametrize(
    "device,want",
    [
        ("NVIDIA GB200", "gb200-nvl72"),
        ("NVIDIA GB300", "gb300-nvl72"),  # "B200" is not in "GB200" as a word
        ("NVIDIA B200", "b200"),
        ("NVIDIA B300 SXM6 AC", "b300"),
        ("NVIDIA H200", "h200-sxm"),
        ("NVIDIA H20", "h20"),  # nor "H20" in "H200"
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
        ("NVIDIA A800-SXM4-80GB", "a800"),
        ("AMD Instinct MI300X", "mi300x"),
    ],
)
def test_a_device_matches_its_own_profile(device, want):
    """The one matching rule (CLI --gpu auto, the plugin, calib's check): a pattern matches as a
    whole word. A GB200 used to match b200 (its 8-GPU domain, not the NVL72's 72), the first profile
    whose pattern occurred in the name."""
    from costmodel.profile import match_profile

    assert match_profile(device) == want


def test_the_schema_tables_are_read_from_the_typed_profile():
    """Issue 57 item 5: adding a table is one HardwareProfile field and its dataclass; the sections,
    the dotted tables (nested ones included) and the optional tables all follow from the fields'
    types."""
    import dataclasses

    from costmodel import profile_schema as S

    assert S._SECTIONS == tuple(
        f.name
        for f in dataclasses.fields(HardwareProfile)
        if dataclasses.is_dataclass(S._hints(HardwareProfile)[f.name])
    )
    assert S._TABLES["compute.peak_flops_per_s"] is S.PeakFlops and "compute" not in S._TABLES
    assert S._OPTIONAL_TABLES == {"fused_kernel": S.FusedKernel}

    @dataclasses.dataclass(frozen=True)
    class Storage:
        read_bw_bytes_per_s: float

    @dataclasses.dataclass(frozen=True)
    class Io:
        storage: Storage

    grown = dataclasses.make_dataclass(
        "Grown",
        [
            ("io", Io, dataclasses.field(default=None)),
            ("spare", Storage | None, dataclasses.field(default=None)),
        ],
        bases=(HardwareProfile,),
        frozen=True,
        eq=False,
        repr=False,
    )
    S._hints.cache_clear()
    try:
        sections, tables, optional = S._schema_tables(grown)
    finally:
        S._hints.cache_clear()
    assert (
        sections == (*S._SECTIONS, "io") and tables["io.storage"] is Storage and "io" not in tables
    )
    assert optional == {"fused_kernel": S.FusedKernel, "spare": Storage}
