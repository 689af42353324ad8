"""`tpcost calibrate --from-deepep`: DeepEP's own test logs (fixtures in the shapes of
data/reference/DEEPEP_LOGS.md) read into measured calls of a network file, reproduced exactly at
their own shape, followed by `tpcost ep`."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from calib.deepep_logs import parse
from calib.ep_fit import logical_bytes
from costmodel.all2all import A2ACall, Links, predict
from costmodel.network import load_network
from costmodel.profile import load_profile
from integration.cli import main

FIX = Path(__file__).resolve().parent / "fixtures" / "deepep"
BASE = ["calibrate", "--from", "ib-cx7-400g", "--gpu", "h200-sxm"]
SHAPE = ["--num-tokens", "128", "--hidden", "7168", "--num-topk", "8", "--num-experts", "256"]


def _write(tmp_path, logs, *extra, name="net.toml"):
    out = tmp_path / name
    assert (
        main([*BASE, "--from-deepep", *(str(FIX / f) for f in logs), "--out", str(out), *extra])
        == 0
    )
    return load_network(str(out))


def _links(net):
    return Links(
        nvlink_bw_bytes_per_s=float(load_profile("h200-sxm").interconnect.link_bw_bytes_per_s),
        network=net,
    )


def _at(m):
    return A2ACall(
        tokens=np.array([float(m.tokens_per_rank)]),
        hidden=m.hidden,
        top_k=m.top_k,
        num_experts=m.num_experts,
        n_group=m.n_group,
        topk_group=m.topk_group,
        ep=m.ep,
        gpus_per_node=m.gpus_per_node,
        dispatch_dtype=m.dispatch_dtype,
    )


@pytest.mark.parametrize(
    "logs,extra,n",
    [
        (["low_latency_ep16.log"], [], 2),
        (["low_latency_total.log"], [*SHAPE, "--ep", "16"], 1),
        (["low_latency_hook.log"], ["--ep", "16"], 2),
        (["intranode.log"], ["--ep", "8"], 2),
        (["internode.log"], ["--ep", "16"], 2),
    ],
)
def test_each_logged_point_is_reproduced_exactly(tmp_path, capsys, logs, extra, n):
    """At its own shape each measured call is predicted as logged (time), and a line that printed
    only a bandwidth gives back that bandwidth in DeepEP's own metric."""
    net = _write(tmp_path, logs, *extra)
    capsys.readouterr()
    assert len(net.measured) == n
    for m in net.measured:
        x = predict(m.backend, _at(m), _links(net))
        got = {"dispatch": x.t_dispatch_s, "combine": x.t_combine_s}.get(
            m.quantity, x.t_dispatch_s + x.t_combine_s
        )
        assert float(np.asarray(got)[0]) == pytest.approx(m.t_s, rel=1e-9), m
    text = (FIX / logs[0]).read_text()
    for lg in parse(text, logs[0])[0]:
        if lg.t_s is None:  # printed as a bandwidth: the point gives it back
            m = next(p for p in net.measured if p.quantity == lg.quantity)
            dt = lg.dtype if lg.quantity == "dispatch" else "bf16"
            assert logical_bytes(
                m.backend, _at(m), dt, lg.intranode
            ) / m.t_s / 1e9 == pytest.approx(lg.gbps, 1e-5)


def test_low_latency_times_are_the_mean_over_ranks(tmp_path, capsys):
    net = _write(tmp_path, ["low_latency_ep16.log"])
    d = next(m for m in net.measured if m.quantity == "dispatch")
    ranks = [118.40] * 16
    ranks[1], ranks[2] = 118.80, 118.00
    assert (
        d.t_s == pytest.approx(np.mean(ranks) * 1e-6, rel=1e-6)
        and d.ep == 16
        and d.gpus_per_node == 8
    )


def test_ep_follows_the_measured_dispatch(tmp_path, capsys):
    """`tpcost ep` on the written network: DeepSeek-V3's dispatch is the model's scaled by measured
    / model at the logged point (its routing differs from the test's), exactly the logged time where
    the shapes agree, and held flat past the one measured size."""
    net_path = tmp_path / "net.toml"
    _write(tmp_path, ["low_latency_ep16.log"])
    capsys.readouterr()
    argv = [
        "ep",
        "--enable-expert-parallel",
        "--gpu",
        "h200-sxm",
        "--data-parallel-size",
        "16",
        "--all2all-backend",
        "deepep_low_latency",
        "--a2a",
        "--json",
        "--tokens",
        "16",
        "128",
    ]
    assert main(argv) == 0
    before = json.loads(capsys.readouterr().out)["a2a"]
    assert main([*argv, "--network", str(net_path)]) == 0
    after = json.loads(capsys.readouterr().out)["a2a"]
    net = load_network(str(net_path))
    d = next(m for m in net.measured if m.quantity == "dispatch")
    x = predict(d.backend, _at(d), _links(load_network("ib-cx7-400g")))
    ratio = d.t_s / float(np.asarray(x.t_dispatch_s)[0])
    for b, a in zip(before, after, strict=True):
        assert a["t_dispatch_s"] == pytest.approx(b["t_dispatch_s"] * ratio, rel=1e-9)
        assert a["bound_dispatch"].endswith("+measured")


def test_a_measured_network_refuses_another_gpu(tmp_path, capsys):
    _write(tmp_path, ["low_latency_ep16.log"])
    assert (
        main(
            [
                "ep",
                "--enable-expert-parallel",
                "--gpu",
                "b200",
                "--network",
                str(tmp_path / "net.toml"),
            ]
        )
        == 2
    )
    assert "measured on h200-sxm, not b200" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,msg",
    [
        ([*BASE, "--from-deepep", str(FIX / "malformed.log")], "cannot read"),
        (
            [*BASE, "--from-deepep", str(FIX / "low_latency_hook_only.log"), "--ep", "16"],
            "not the transfer",
        ),
        (
            [*BASE, "--from-deepep", str(FIX / "low_latency_total.log"), "--ep", "16"],
            "no [config] line",
        ),
        (
            [*BASE, "--from-deepep", str(FIX / "low_latency_ep16.log"), "--num-tokens", "64"],
            "drop the flag",
        ),
        ([*BASE, "--from-deepep", str(FIX / "internode.log")], "give --ep"),
        ([*BASE, "--from-deepep", str(FIX / "intranode.log"), "--ep", "16"], "intranode"),
        (
            [
                *BASE,
                "--from-deepep",
                str(FIX / "low_latency_total.log"),
                *SHAPE[:1],
                "4096",
                *SHAPE[2:],
                "--ep",
                "16",
            ],
            "beats the bottleneck link",
        ),
        (
            [
                *BASE,
                "--from-deepep",
                str(FIX / "low_latency_ep16.log"),
                "--from-nccl-tests",
                "x.txt",
            ],
            "one of them",
        ),
        (
            ["calibrate", "--gpu", "h200-sxm", "--from-nccl-tests", "x.txt"],
            "only with --from-deepep",
        ),
        (
            [
                "calibrate",
                "--from-deepep",
                str(FIX / "low_latency_ep16.log"),
                "--from",
                "ib-cx7-400g",
            ],
            "--gpu PROFILE",
        ),
        ([*BASE, "--from-deepep", str(FIX / "nope.log")], "nope.log"),
        ([*BASE, "--from-deepep", str(Path(__file__))], "no DeepEP result line"),
        (
            [*BASE, "--from-deepep", str(FIX / "low_latency_ep16.log"), "--out", "x.json"],
            "a network is a .toml",
        ),
        (
            [
                "calibrate",
                "--from",
                "nope",
                "--gpu",
                "h200-sxm",
                "--from-deepep",
                str(FIX / "low_latency_ep16.log"),
            ],
            "unknown network",
        ),
    ],
)
def test_from_deepep_bad_input_is_one_line_and_writes_nothing(
    tmp_path, monkeypatch, capsys, argv, msg
):
    monkeypatch.chdir(tmp_path)
    assert main([*argv] + ([] if "--out" in argv else ["--out", "o.toml"])) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and msg in err, err
    assert not (tmp_path / "o.toml").exists()


def test_from_deepep_never_overwrites_without_force(tmp_path, capsys):
    out = tmp_path / "net.toml"
    out.write_text("keep")
    args = [*BASE, "--from-deepep", str(FIX / "low_latency_ep16.log"), "--out", str(out)]
    assert main(args) == 2 and out.read_text() == "keep"
    assert main([*args, "--force"]) == 0 and load_network(str(out)).measured


@pytest.mark.parametrize(
    "edit,msg",
    [
        (lambda m: m.update(backend="pplx"), "backend must be"),
        (lambda m: m.update(t_s=1e3), "outside its plausible range"),
        (lambda m: m.update(color="red"), "unknown key"),
        (lambda m: m.pop("gpu"), "missing gpu"),
        (lambda m: m.update(ep=True), "ep must be an integer"),
    ],
)
def test_measured_section_bad_input(tmp_path, capsys, edit, msg):
    import tomli_w

    _write(tmp_path, ["low_latency_ep16.log"])
    capsys.readouterr()
    tree = tomllib.loads((tmp_path / "net.toml").read_text())
    edit(tree["measured"][0])
    bad = tmp_path / "bad.toml"
    bad.write_text(tomli_w.dumps(tree))
    assert main(["ep", "--enable-expert-parallel", "--network", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and msg in err, err


@pytest.mark.parametrize(
    "argv,msg",
    [
        (
            [
                "--from-deepep",
                str(FIX / "low_latency_ep16.log"),
                "--from",
                "ib-cx7-400g",
                "--gpu",
                "h200-sxm",
                "--budget-s",
                "10",
                "--nproc",
                "4",
            ],
            "--budget-s, --nproc: a benchmark run's flags",
        ),
        (
            [
                "--from-nccl-tests",
                "x.txt",
                "--from",
                "h100-sxm",
                "--device",
                "cpu",
                "--models",
                "llama-3.1-70b",
            ],
            "--models, --device: a benchmark run's flags",
        ),
        (["--device", "cpu", "--from", "h100-sxm"], "--from: read only with"),
        (
            [
                "--from-deepep",
                str(FIX / "low_latency_ep16.log"),
                "--from",
                "ib-cx7-400g",
                "--gpu",
                "h200-sxm",
                "--name",
                " ",
            ],
            "--name: give a non-empty name",
        ),
    ],
)
def test_calibrate_refuses_flags_a_mode_does_not_read(tmp_path, capsys, argv, msg):
    assert main(["calibrate", *argv, "--out", str(tmp_path / "o.toml")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and msg in err, err
    assert not (tmp_path / "o.toml").exists()
