"""Against the real vLLM 0.31 (CPU build): the plugin's value lands in pass_config and equals
`tpcost whatif`'s cutoff, compile ranges split there, vllm-config JSON is accepted by
CompilationConfig, failures and TPCOST_DISABLE leave vLLM's own default. Nothing is patched:
TPCOST_PROFILE=h100-sxm picks the profile (on the CPU platform vLLM's capability is None, so its own
table gives None and disables SP)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import need

from integration.cli import main

vllm = need("vllm")
from integration.recommend import installed_version  # noqa: E402

if (installed_version() or (0, 0)) >= (0, 32):
    pytest.skip(
        "vLLM 0.31 tests (this venv has a later vLLM: tests/test_vllm032.py)",
        allow_module_level=True,
    )
ROOT = Path(__file__).resolve().parents[1]
MODEL = str(ROOT / "tests" / "fixtures" / "llama-h8192-tiny")


def _fusion_flag(got) -> list:
    """vllm-config's flag for the FlashInfer fusion a built vLLM config ended with (its range, or
    off)."""
    mb = got["fi_allreduce_fusion_max_size_mb"]
    mb = 0.0 if got["fuse_allreduce_rms"] is False else mb
    return [] if mb is None else ["--fi-allreduce-fusion-max-size-mb", repr(mb)]


def _config(capsys, tp, model=MODEL, regime=()):
    """`tpcost vllm-config` for vLLM 0.31: its pass_config, and whatif's cutoff for exactly that
    config."""
    assert (
        main(
            [
                "vllm-config",
                "--gpu",
                "h100-sxm",
                "--model",
                model,
                "--tp",
                str(tp),
                "--vllm-version",
                "0.31",
                "--max-num-batched-tokens",
                "8192",
                "--format",
                "json",
                *regime,
            ]
        )
        == 0
    )
    pc = json.loads(capsys.readouterr().out)["pass_config"]
    mb = pc.get(
        "fi_allreduce_fusion_max_size_mb", 0.0 if pc.get("fuse_allreduce_rms") is False else None
    )
    argv = [
        "whatif",
        "--gpu",
        "h100-sxm",
        "--model",
        model,
        "--tp",
        str(tp),
        "--max-num-batched-tokens",
        "8192",
        "--no-band",
        "--json",
        *regime,
    ] + ([] if mb is None else ["--fi-allreduce-fusion-max-size-mb", repr(mb)])
    assert main(argv) == 0
    return pc, json.loads(capsys.readouterr().out)["cutoff_tokens"]


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    assert (
        main(
            [
                "vllm-config",
                "--model",
                "llama-3.1-70b",
                "--tp",
                "4",
                "--gpu",
                "h100-sxm",
                "--format",
                "json",
            ]
        )
        == 0
    )
    env = {
        **os.environ,
        "TPCOST_PROFILE": "h100-sxm",
        "VLLM_PLUGINS": "tpcost",
        "VLLM_LOGGING_LEVEL": "INFO",
        "TPCOST_CACHE_DIR": str(tmp_path_factory.mktemp("plugin-cache")),
    }
    env.pop("TPCOST_DISABLE", None)
    import io
    from contextlib import redirect_stdout

    jsons = []
    for extra in (
        ["--tp", "4", "--gpu", "h100-sxm"],
        ["--tp", "8", "--gpu", "h100-sxm"],
        ["--tp", "8", "--gpu", "b200", "--dtype", "fp8"],
        ["--tp", "8", "--gpu", "mi300x"],
    ):
        buf = io.StringIO()
        with redirect_stdout(buf):
            assert (
                main(["vllm-config", "--model", "llama-3.1-70b", "--format", "json", *extra]) == 0
            )
        jsons.append(buf.getvalue().strip())
    cc_json = jsons[0]
    r = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "vllm_scenarios.py"), MODEL, *jsons],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and line, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(line[0][7:]), r.stdout + r.stderr, cc_json, jsons


@pytest.mark.parametrize("tp", [2, 4])
def test_plugin_value_is_whatif_cutoff_and_ranges_split(scenarios, capsys, tp):
    res, log, _, _ = scenarios
    got = res[f"plugin_tp{tp}"]
    # vLLM's CPU build resolves the unset fusion to off (no CUDA): the cutoff is decided without it,
    # as vllm-config's with the fusion off (item 4 of issue 50: the plugin's log and cutoff follow
    # what vLLM runs)
    assert got["fuse_allreduce_rms"] is False and got["fi_allreduce_fusion_max_size_mb"] is None
    pc, cut = _config(capsys, tp, regime=_fusion_flag(got))
    # vllm-config's cutoff is whatif's for the config it emits
    assert pc.get("sp_min_token_num") == cut
    if cut is None:
        assert got["enable_sp"] is False
    else:
        assert got["enable_sp"] is True and got["fuse_gemm_comms"] is True
        assert got["sp_min_token_num"] == cut
        assert cut - 1 in got["endpoints"]
    assert f"sp_min_token_num={cut} (" in log or cut is None


@pytest.mark.parametrize(
    "key,regime",
    [
        ("enforce_eager_tp4", ["--enforce-eager"]),
        ("capture_2048_tp4", ["--cudagraph-max-tokens", "2048"]),
    ],
)
def test_plugin_reads_the_cudagraph_regime(scenarios, capsys, key, regime):
    """enforce_eager / max_cudagraph_capture_size in vLLM's config decide like vllm-config's flags
    (that the regime moves a prediction is tests/test_decode_regime.py's; for this two-layer fixture
    it leaves the cutoff)."""
    res, _, _, _ = scenarios
    pc, cut = _config(capsys, 4, regime=[*regime, *_fusion_flag(res[key])])
    assert pc.get("sp_min_token_num") == cut
    assert res[key]["sp_min_token_num"] == cut


def test_user_value_and_sp_off_untouched(scenarios):
    res, _, _, _ = scenarios
    assert (
        res["user_value_tp2"]["sp_min_token_num"] == 777
        and 776 in res["user_value_tp2"]["endpoints"]
    )
    assert res["sp_off_tp2"]["enable_sp"] is False and res["sp_off_tp2"]["sp_min_token_num"] is None


def test_injected_failure_and_disable_leave_vllm_default(scenarios):
    res, log, _, _ = scenarios
    for key in ("injected_failure_tp2", "disabled_tp2"):
        # vLLM's own table has no value on this platform: it disables SP ("hidden_size too small")
        assert res[key]["enable_sp"] is False and res[key]["sp_min_token_num"] is None, key
    assert "tpcost: could not compute the pass config (RuntimeError: injected failure" in log


def test_out_of_range_profile_warns_once_and_leaves_vllm_default(scenarios):
    res, log, _, _ = scenarios
    assert res["out_of_range_profile_tp2"]["enable_sp"] is False
    assert res["out_of_range_profile_tp2"]["sp_min_token_num"] is None
    warned = [
        ln
        for ln in log.splitlines()
        if "identity.sm_count = 1e+308 is outside its plausible range" in ln
    ]
    assert len(warned) == 1, warned


def test_vllm_config_json_accepted_by_compilation_config(scenarios, capsys):
    res, _, cc_json, jsons = scenarios
    d = json.loads(cc_json)
    # every emitted pass_config (SP on, a lowered FlashInfer limit, fusion off, SP off) round-trips
    # through vLLM
    assert res["vllm_config_json_accepted"] == [json.loads(j)["pass_config"] for j in jsons]
    assert {k for j in jsons for k in json.loads(j)["pass_config"]} >= {
        "enable_sp",
        "fuse_gemm_comms",
        "sp_min_token_num",
        "fi_allreduce_fusion_max_size_mb",
        "fuse_allreduce_rms",
    }
    pc, cut = _config(capsys, 4, "llama-3.1-70b")
    assert pc == d["pass_config"] and cut == d["pass_config"]["sp_min_token_num"]


def test_gpu_auto_detects_from_platform_name_and_capability(monkeypatch):
    """--gpu auto: patched here are only the platform's get_device_name/get_device_capability (as
    vLLM's own tests mock the capability); TPCOST_PROFILE overrides the detection."""
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    from costmodel.profile import detect_profile_name

    monkeypatch.delenv("TPCOST_PROFILE", raising=False)
    monkeypatch.setattr(
        current_platform, "get_device_capability", lambda device_id=0: DeviceCapability(9, 0)
    )
    monkeypatch.setattr(current_platform, "get_device_name", lambda device_id=0: "NVIDIA H200")
    assert detect_profile_name() == "h200-sxm"
    monkeypatch.setattr(
        current_platform, "get_device_name", lambda device_id=0: "NVIDIA Hopper Engineering Sample"
    )
    # no name match: first profile with compute capability 9.0
    assert detect_profile_name() == "h100-sxm"
    monkeypatch.setenv("TPCOST_PROFILE", "b200")
    assert detect_profile_name() == "b200"


def test_plugin_decision_cache(scenarios):
    """A second config with the same inputs reads the plan back (and says so); a malformed or
    foreign entry is recomputed to the same values; TPCOST_CACHE=0 writes nothing; an unusable
    setting warns once and decides anyway."""
    res, log = scenarios[0], scenarios[1]
    # tp 2 and tp 4 with SP on; enforce_eager and a capture size of 2048 at tp 4 are inputs of their
    # own (the regime is part of the key); the user's own sp_min_token_num and SP off decide nothing
    # on vLLM's CPU build (SP not wanted, and the fusion off as vLLM resolves it), so they store no
    # entry
    assert res["cache_entries"] == 4
    assert res["cached_tp2"] == res["plugin_tp2"] and "(cached decision)" in log
    assert (
        res["after_corruption_tp2"] == res["plugin_tp2"]
        and res["after_corruption_tp4"] == res["plugin_tp4"]
    )
    assert res["cache_off_tp2"] == res["plugin_tp2"] and res["cache_off_wrote"] is False
    assert (
        res["cache_bad_setting_tp2"] == res["plugin_tp2"]
        and res["cache_bad_setting_wrote"] is False
    )
    assert "TPCOST_CACHE='maybe' is not 0 or 1; the decision cache is off" in log
    assert (
        res["cache_dir_is_file_tp2"] == res["plugin_tp2"]
        and "is not a directory; the decision cache is off" in log
    )


def test_plugin_decides_for_the_workload_file(scenarios):
    """TPCOST_WORKLOAD through the real plugin: all traffic at 8192 tokens enables SP at a cutoff
    below the budget (one vLLM realises); all traffic at 64 tokens (where SP+AsyncTP loses) disables
    it; the same path with new bytes is a new decision (the cache keys on the content); a missing
    file warns with its name and leaves vLLM's default."""
    res, log = scenarios[0], scenarios[1]
    large, small = res["workload_large_tp4"], res["workload_small_tp4"]
    assert (
        large["enable_sp"] is True
        and large["sp_min_token_num"] is not None
        and large["sp_min_token_num"] < 8192
    )
    assert small["enable_sp"] is False and small["sp_min_token_num"] is None
    assert res["workload_missing_tp4"]["sp_min_token_num"] is None and "no-such-traffic.csv" in log


def test_emitted_sp_threshold_is_one_vllm_realises(capsys, tmp_path):
    """Every SP configuration vllm-config emits, built by real vLLM 0.31: SP applies on some compile
    range (one starting at or above the threshold, clamped to the budget as SequenceParallelismPass
    does) or compile size exactly when tpcost reports that SP runs. Includes the traffic at the
    budget (1 x5000, 64 x3000, 8192 x200), whose best threshold is below the budget: c = 8192 builds
    ranges [1, 64], [65, 8192] and SP runs nowhere."""
    tp = 4
    cases = {
        "budget": "num_tokens,count\n1,5000\n64,3000\n8192,200\n",
        "large": "num_tokens,count\n8192,1000\n",
        "small": "num_tokens,count\n64,1000\n",
        "mixed": "num_tokens,count\n512,100\n4096,100\n",
    }
    emitted = []
    for name, text in cases.items():
        wl = tmp_path / f"{name}.csv"
        wl.write_text(text)
        assert (
            main(
                [
                    "vllm-config",
                    "--gpu",
                    "h100-sxm",
                    "--model",
                    MODEL,
                    "--tp",
                    str(tp),
                    "--vllm-version",
                    "0.31",
                    "--max-num-batched-tokens",
                    "8192",
                    "--workload",
                    str(wl),
                    "--format",
                    "json",
                ]
            )
            == 0
        )
        emitted.append(capsys.readouterr().out.strip())
    env = {**os.environ, "TPCOST_PROFILE": "h100-sxm"}
    r = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "vllm_sp_ranges.py"), MODEL, str(tp), *emitted],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and line, r.stdout[-3000:] + r.stderr[-3000:]
    built = json.loads(line[0][7:])
    runs_somewhere = []
    for text, b in zip(emitted, built):
        pc = json.loads(text)["pass_config"]
        says_runs = bool(pc["enable_sp"]) and pc.get("sp_min_token_num") is not None
        c = b["sp_min_token_num"]
        vllm_runs = (
            bool(b["enable_sp"])
            and c is not None
            and (
                any(lo >= min(c, b["max_num_batched_tokens"]) for lo, _ in b["ranges"])
                or c in b["compile_sizes"]
            )
        )
        assert says_runs == vllm_runs, (pc, b)
        # never the unrealisable budget itself
        assert c is None or c < b["max_num_batched_tokens"], (
            pc,
            b,
        )
        runs_somewhere.append(vllm_runs)
    assert runs_somewhere[0] and runs_somewhere[1] and not runs_somewhere[2]


def test_plugin_decides_sp_alone_when_asynctp_is_off(scenarios, capsys):
    """{"enable_sp": true, "fuse_gemm_comms": false} and {"enable_sp": true} alone (vLLM 0.31
    resolves an unset fuse_gemm_comms to false): the plugin sets whatif's SP-alone cutoff, leaves
    AsyncTP off, and says "SP alone"."""
    res, log = scenarios[0], scenarios[1]
    argv = [
        "whatif",
        "--gpu",
        "h100-sxm",
        "--model",
        MODEL,
        "--tp",
        "4",
        "--max-num-batched-tokens",
        "8192",
        "--no-band",
        "--json",
    ] + _fusion_flag(res["sp_alone_explicit_tp4"])
    assert main(argv) == 0
    sp_alone = json.loads(capsys.readouterr().out)["sp_cutoff_tokens"]
    for key in ("sp_alone_explicit_tp4", "sp_alone_unset_tp4"):
        got = res[key]
        assert got["fuse_gemm_comms"] is False, key
        if sp_alone is None:
            assert got["enable_sp"] is False and got["sp_min_token_num"] is None, key
        else:
            assert got["enable_sp"] is True and got["sp_min_token_num"] == sp_alone, key
    assert (
        "SP alone, AsyncTP user: fuse_gemm_comms = false" in log or "SP disabled (SP alone" in log
    )
    assert "fuse_gemm_comms unset, which vLLM 0.31 resolves to false" in log


@pytest.mark.parametrize(
    "value,off,warns",
    [
        ("1", True, False),
        ("true", True, False),
        ("YES", True, False),
        ("false", False, False),
        ("0", False, False),
        ("off", False, False),
        ("", False, False),
        ("maybe", False, True),
    ],
)
def test_tpcost_disable_reads_booleans(monkeypatch, value, off, warns):
    from integration.plugin_cache import env_flag

    monkeypatch.setenv("TPCOST_DISABLE", value)
    got, problem = env_flag("TPCOST_DISABLE")
    assert got is off and (problem is not None) is warns


def _plugin_sets_rows() -> list[str]:
    text = (ROOT / "docs" / "vllm-plugin.md").read_text()
    block = text.split("<!-- plugin-sets -->")[1].split("<!-- /plugin-sets -->")[0]
    return [ln.split("|")[1].strip() for ln in block.strip().splitlines()[2:]]


def test_plugin_sets_what_its_doc_says(scenarios, capsys):
    """Issue 50 item 1 and 4: every row of docs/vllm-plugin.md's "What the plugin sets" against the
    config real vLLM 0.31 ends with (each value against vllm-config / whatif for that fusion), and
    the log says what vLLM runs."""
    res, log = scenarios[0], scenarios[1]

    def whatif(got, key):
        assert (
            main(
                [
                    "whatif",
                    "--gpu",
                    "h100-sxm",
                    "--model",
                    MODEL,
                    "--tp",
                    "4",
                    "--max-num-batched-tokens",
                    "8192",
                    "--no-band",
                    "--json",
                    *_fusion_flag(got),
                ]
            )
            == 0
        )
        return json.loads(capsys.readouterr().out)[key]

    def sp(got, key):
        c = whatif(got, key)
        assert (got["enable_sp"], got["sp_min_token_num"]) == (
            (True, c) if c is not None else (False, None)
        ), got

    def nothing(got):
        assert (
            got["enable_sp"] is False
            and got["sp_min_token_num"] is None
            and got["fuse_gemm_comms"] is False
        )
        # CPU: fusion off
        assert got["fuse_allreduce_rms"] is False and got["fi_allreduce_fusion_max_size_mb"] is None

    def fusion_on(got):
        assert (
            main(
                [
                    "vllm-config",
                    "--gpu",
                    "h100-sxm",
                    "--model",
                    MODEL,
                    "--tp",
                    "4",
                    "--vllm-version",
                    "0.31",
                    "--max-num-batched-tokens",
                    "8192",
                    "--format",
                    "json",
                ]
            )
            == 0
        )
        pc = json.loads(capsys.readouterr().out)["pass_config"]
        assert (
            got["fuse_allreduce_rms"] is True
            and got["fi_allreduce_fusion_max_size_mb"] == pc["fi_allreduce_fusion_max_size_mb"]
        )
        assert got["enable_sp"] is False and got["sp_min_token_num"] is None

    def sp_alone(got):
        assert got["fuse_gemm_comms"] is False
        sp(got, "sp_cutoff_tokens")

    def sp_asynctp(got):
        assert got["fuse_gemm_comms"] is True
        sp(got, "cutoff_tokens")

    checks = {
        "nothing": lambda: nothing(res["doc_nothing_tp4"]),
        "`fuse_allreduce_rms: true`": lambda: fusion_on(res["doc_fusion_on_tp4"]),
        "`enable_sp: true`": lambda: sp_alone(res["sp_alone_unset_tp4"]),
        "`enable_sp: true, fuse_gemm_comms: true`": lambda: sp_asynctp(res["plugin_tp4"]),
        "`enable_sp: true, fuse_allreduce_rms: false`": lambda: (
            sp_alone(res["doc_fusion_off_sp_tp4"]),
            res["doc_fusion_off_sp_tp4"]["fi_allreduce_fusion_max_size_mb"] is None
            or pytest.fail("range set"),
        ),
        "`enable_sp: true, fuse_allreduce_rms: true, fi_allreduce_fusion_max_size_mb: X`": lambda: (
            sp_alone(res["doc_user_range_sp_tp4"]),
            res["doc_user_range_sp_tp4"]["fi_allreduce_fusion_max_size_mb"] == 0.5
            or pytest.fail("range changed"),
        ),
        "`enable_sp: true, fuse_gemm_comms: true, sp_min_token_num: C`": lambda: (
            res["user_value_tp2"]["sp_min_token_num"] == 777 or pytest.fail("user's cutoff changed")
        ),
        "`enable_sp: false`": lambda: (
            (
                res["sp_off_tp2"]["enable_sp"] is False
                and res["sp_off_tp2"]["sp_min_token_num"] is None
            )
            or pytest.fail("SP touched")
        ),
    }
    assert _plugin_sets_rows() == list(checks)
    for check in checks.values():
        check()
    # docs/commands.md's sentences are the table's first and third rows, and point to it
    readme = " ".join((ROOT / "docs" / "commands.md").read_text().split())
    assert "With nothing set, SP stays off." in readme and '"What the plugin sets"' in readme
    assert "`enable_sp: true` gets SP alone's cutoff" in readme
    # the fusion-on row and the CPU default decide differently here, so the resolution is what moved
    # the cutoff
    assert (
        "fuse_allreduce_rms unset, which vLLM resolves to false here (O2, "
        "enable_allreduce_rms_fusion" in log
    )
    # said only where the fusion runs (the fuse_allreduce_rms: true rows)
    assert "fi_allreduce_fusion_max_size_mb=" in log
