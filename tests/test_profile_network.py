"""Issue 58 item 3: the network between NVLink domains is profile data by name
(interconnect.network), replacing the scalar inter-node fields: TP beyond a domain is capped by the
network's NICs at their RDMA efficiency, EP answers default to the same network, and a profile of
the old schema is refused in one line."""

import json
from pathlib import Path

import numpy as np
import pytest

from costmodel import load_model, load_profile, predict
from costmodel.errors import TpcostError
from costmodel.network import builtin_network_names, load_network
from costmodel.profile import builtin_profile_names
from integration.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("gpu", builtin_profile_names())
def test_every_profile_names_a_network_and_tp_beyond_its_domain_is_capped_by_it(gpu):
    p = load_profile(gpu)
    net = p.network()
    assert p.interconnect.network in builtin_network_names() and net.name == p.interconnect.network
    dom = int(p.interconnect.domain_size)
    lat_in, bw_in = p.collective("nccl_all_reduce", dom)
    lat_out, bw_out = p.collective("nccl_all_reduce", 2 * dom)
    cap = net.line_rate_per_gpu_bytes_per_s * net.rdma_efficiency
    assert bw_out == pytest.approx(
        min(
            p.collective("nccl_all_reduce", p.collective_entry_tp("nccl_all_reduce", 2 * dom))[1],
            cap,
        )
    )
    assert bw_out <= cap and lat_out >= net.rdma_latency_s
    assert lat_in <= lat_out or bw_in >= bw_out


def test_the_networks_the_profiles_name():
    by = {g: load_profile(g).interconnect.network for g in builtin_profile_names()}
    assert (
        by["h20"] == "roce-200g"
        and by["h800"] == "ib-cx7-400g"
        and by["gb300-nvl72"] == "ib-cx8-800g"
    )
    assert by["a100-sxm-80gb"] == "ib-hdr-200g"
    hdr, cx8 = load_network("ib-hdr-200g"), load_network("ib-cx8-800g")
    assert hdr.line_rate_per_gpu_bytes_per_s == 25e9 and cx8.line_rate_per_gpu_bytes_per_s == 100e9
    fit = json.loads((ROOT / "calib" / "data" / "ep_fit.json").read_text())
    for net in (hdr, cx8):  # no released row: the fitted networks' common mean
        for k, v in fit["common_mean"].items():
            assert getattr(net, k) == pytest.approx(v, rel=1e-3), (net.name, k)


def test_an_old_profile_with_internode_numbers_is_refused_in_one_line(tmp_path, capsys):
    text = (ROOT / "costmodel" / "profiles" / "h100-sxm.toml").read_text()
    old = text.replace(
        'network = "ib-cx7-400g"\n', "internode_bw_bytes_per_s = 50e9\ninternode_latency_s = 5e-6\n"
    )
    assert old != text
    f = tmp_path / "old.toml"
    f.write_text(old)
    with pytest.raises(TpcostError, match="replaced by interconnect.network"):
        load_profile(str(f))
    assert (
        main(["whatif", "--gpu", str(f), "--model", "llama-3.1-70b", "--tp", "8", "--no-band"]) == 2
    )
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "internode_bw_bytes_per_s: replaced by interconnect.network" in err
    )


def test_a_profile_without_a_network_refuses_tp_beyond_its_domain(tmp_path):
    text = (
        (ROOT / "costmodel" / "profiles" / "h100-sxm.toml")
        .read_text()
        .replace('network = "ib-cx7-400g"\n', "")
    )
    f = tmp_path / "nonet.toml"
    f.write_text(text)
    p = load_profile(str(f))
    assert p.collective("nccl_all_reduce", 8)  # inside the domain: nothing to ask
    with pytest.raises(TpcostError, match="names no network"):
        p.collective("nccl_all_reduce", 16)


def test_a_faster_network_never_slows_tp_across_domains():
    p = load_profile("h100-sxm")
    m = load_model("llama-3.1-405b")
    grid = np.array([64.0, 1024, 8192])
    slow = predict(p.with_network("ib-hdr-200g"), m, 16, "bf16", grid)
    fast = predict(p.with_network("ib-cx8-800g"), m, 16, "bf16", grid)
    for sched in ("tp", "sp"):
        assert np.all(fast.t_forward_s(sched) <= slow.t_forward_s(sched) * (1 + 1e-12))
    assert np.any(fast.t_forward_s("tp") < slow.t_forward_s("tp"))


def test_whatif_network_takes_effect_beyond_the_domain_or_is_refused(capsys):
    base = ["whatif", "--gpu", "h100-sxm", "--model", "llama-3.1-405b", "--no-band", "--json"]
    assert main([*base, "--tp", "16"]) == 0
    own = json.loads(capsys.readouterr().out)
    assert main([*base, "--tp", "16", "--network", "ib-cx8-800g"]) == 0
    other = json.loads(capsys.readouterr().out)
    assert other != own
    assert main([*base[:-1], "--tp", "16", "--network", "ib-cx8-800g"]) == 0
    assert "cross network ib-cx8-800g" in capsys.readouterr().out
    for argv, needle in (
        ([*base, "--tp", "8", "--network", "ib-cx8-800g"], "no effect at tp=8"),
        ([*base, "--tp", "16", "--network", "no-such-net"], "unknown network"),
    ):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert not out and err.count("\n") == 1 and needle in err, err


def test_ep_defaults_to_the_profiles_network(capsys):
    argv = [
        "ep",
        "--model",
        "deepseek-v3",
        "--gpu",
        "h20",
        "--enable-expert-parallel",
        "--data-parallel-size",
        "16",
        "--all2all-backend",
        "deepep_low_latency",
        "--json",
    ]
    assert main(argv) == 0
    assert "roce-200g" in capsys.readouterr().out
