"""One decision path (costmodel.decide.recommend): whatif and vllm-config agree on the schedule
(SP+AsyncTP, SP alone or neither), its threshold and the fusion range; SP alone is decided where
AsyncTP is off; vLLM's defaults move only past the risk premium and with the confidence asked; MB
values at vLLM's granularity."""

import json

import pytest

from costmodel.shapes import load_model
from integration.cli import main
from costmodel.decide import fusion_mb
from costmodel.formulas import MiB


def _json(capsys, *argv):
    assert main(list(argv)) == 0, argv
    return json.loads(capsys.readouterr().out)


SCHED = {(True, True): "sp_asynctp", (True, False): "sp", (False, False): None}


@pytest.mark.parametrize("model", ["llama-3.1-8b", "llama-3.1-70b"])
@pytest.mark.parametrize("gpu", ["h100-sxm", "b200"])
def test_whatif_and_vllm_config_agree(capsys, model, gpu):
    for tp in (2, 4, 8):
        for dtype in ("bf16", "fp8"):
            common = [
                "--model",
                model,
                "--gpu",
                gpu,
                "--tp",
                str(tp),
                "--dtype",
                dtype,
                "--vllm-version",
                "0.31",
            ]
            pc = _json(capsys, "vllm-config", *common, "--format", "json")["pass_config"]
            w = _json(capsys, "whatif", *common, "--no-band", "--json")
            sched = SCHED[(pc["enable_sp"], pc["fuse_gemm_comms"])]
            assert w["decided_schedule"] == sched, (common, pc, w["decided_schedule"])
            assert w["decided_threshold_tokens"] == pc.get("sp_min_token_num"), common
            own = {"sp_asynctp": w["cutoff_tokens"], "sp": w["sp_cutoff_tokens"], None: None}[sched]
            # the decided schedule's own cutoff, named beside the others
            assert own == pc.get("sp_min_token_num")
            f = w["fusion_range"]
            if f is None:
                assert "fuse_allreduce_rms" not in pc
            else:
                assert pc["fuse_allreduce_rms"] == (f["tokens"] > 0)
                if f["tokens"]:
                    row = load_model(model).hidden * 2
                    assert int(pc["fi_allreduce_fusion_max_size_mb"] * MiB) // row == f["tokens"]


def test_sp_alone_where_asynctp_does_not_pay(capsys):
    """405B fp8 on B200 TP 8: AsyncTP never pays, SP alone does (the issue's case, which emitted
    enable_sp false)."""
    common = [
        "--model",
        "llama-3.1-405b",
        "--gpu",
        "b200",
        "--tp",
        "8",
        "--dtype",
        "fp8",
        "--vllm-version",
        "0.31",
    ]
    w = _json(capsys, "whatif", *common, "--no-band", "--json")
    assert w["cutoff_tokens"] is None and w["sp_cutoff_tokens"] is not None
    pc = _json(capsys, "vllm-config", *common)["pass_config"]
    assert (
        pc["enable_sp"] is True
        and pc["fuse_gemm_comms"] is False
        and pc["sp_min_token_num"] == w["sp_cutoff_tokens"]
    )
    assert main(["whatif", *common, "--no-band"]) == 0
    assert f"decided: SP alone from {w['sp_cutoff_tokens']} tokens" in capsys.readouterr().out


def test_whatif_on_a_version_without_sp(capsys):
    w = _json(capsys, "whatif", "--no-band", "--json", "--vllm-version", "0.33")
    assert w["cutoff_tokens"] is None and w["decided_schedule"] is None and w["sp_passes"] is False
    assert w["fusion_range"]["tokens"] >= 0
    assert main(["whatif", "--no-band", "--vllm-version", "0.33"]) == 0
    out = capsys.readouterr().out
    assert (
        "cutoff (SP+AsyncTP" not in out
        and "no SP threshold to decide" in out
        and "FlashInfer fused" in out
    )


def test_defaults_move_only_when_material_and_confident(capsys, one_line_error):
    """B200 TP 8: fusion off would save 0.018 ms of 32 ms, within the premium: vLLM's 1 MB stands,
    written as vLLM writes it. H100 TP 2 (8B): off saves ~5 ms and helps in 95 % of the draws;
    asking for 100 % keeps vLLM's."""
    pc = _json(capsys, "vllm-config", "--gpu", "b200", "--tp", "8", "--vllm-version", "0.33")[
        "pass_config"
    ]
    assert pc == {"fuse_allreduce_rms": True, "fi_allreduce_fusion_max_size_mb": 1.0}
    base = [
        "vllm-config",
        "--gpu",
        "h100-sxm",
        "--tp",
        "2",
        "--model",
        "llama-3.1-8b",
        "--vllm-version",
        "0.33",
    ]
    assert main(base) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["pass_config"] == {"fuse_allreduce_rms": False}
    assert "better than vLLM's limit in" in cap.err
    pc = _json(capsys, *base, "--min-confidence", "1")["pass_config"]
    assert pc == {"fuse_allreduce_rms": True, "fi_allreduce_fusion_max_size_mb": 64.0}
    one_line_error(*base, "--min-confidence", "1.5", needle="must be a number in [0, 1]")
    one_line_error(*base, "--min-confidence", "nan", needle="must be a number in [0, 1]")


def _digits(x):
    return next(d for d in range(1, 18) if float(f"{x:.{d}g}") == x)


@pytest.mark.parametrize(
    "tokens,hidden,digits",
    [(204, 4096, 2), (2340, 7168, 2), (73, 7168, 1), (1, 8192, 1), (37, 5120, 2), (8191, 16384, 5)],
)
def test_mb_at_vllms_granularity(tokens, hidden, digits):
    """The emitted MB lands on the decided tokens through vLLM's int(mb·MiB) // (hidden·2), with the
    fewest significant digits that do (8191 tokens at hidden 16384 lie in [255.96875, 256) MB: no
    4-digit value lands); vLLM's own value when it lands there."""
    mb = fusion_mb(tokens, hidden, 2.0)
    assert int(mb * MiB) // (hidden * 2) == tokens
    assert _digits(mb) == digits, mb
    lo, hi = tokens * hidden * 2 / MiB, (tokens + 1) * hidden * 2 / MiB
    # no shorter rounding lands
    assert all(
        not (
            lo <= float(f"{v:.{d}g}") < hi
            and int(float(f"{v:.{d}g}") * MiB) // (hidden * 2) == tokens
        )
        for d in range(1, digits)
        for v in (lo, hi, (lo + hi) / 2)
    )
    own = 2.0  # vLLM's 2 MB lands on 2 MiB // 8192 = 256 tokens at hidden 4096
    assert fusion_mb(256, 4096, 2.0, own) == own
    assert fusion_mb(204, 4096, 2.0) == 1.6  # not 1.5937504768371582
