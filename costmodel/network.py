"""The network between nodes as data, every number with its source (docs/model.md §11.5)."""
# The network between nodes as data: NICs per GPU, line rate, RDMA efficiency and latency,
# transport (docs/model.md §11).

from __future__ import annotations

import dataclasses
import functools
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from .errors import TpcostError
from .io import finite_float, match_builtin, read_text

TRANSPORTS = ("infiniband", "roce", "efa")
# (key, lower, upper, unit): every number a network file holds, with its plausible range
FIELDS = (
    ("nics_per_gpu", 1, 16, "count"),
    ("nic_line_rate_bytes_per_s", 1e9, 1e12, "bytes/s per NIC"),
    ("rdma_efficiency", 0.05, 1.0, "share of line rate an all-to-all reaches"),
    ("rdma_latency_s", 1e-7, 1e-4, "s: one RDMA hop, NIC to NIC"),
    ("msg_overhead_s", 0.0, 1e-4, "s per RDMA message (the NIC's or proxy's message rate)"),
    ("ll_latency_s", 0.0, 1e-2, "s: a low-latency call's fixed cost"),
    ("ll_latency_per_log2_ep_s", 0.0, 1e-3, "s per doubling of the EP size"),
    ("ll_combine_extra_s", 0.0, 1e-2, "s: the combine's extra fixed cost (its reduction)"),
    ("ht_latency_s", 0.0, 1e-2, "s: a normal call's fixed cost (notify, CPU sync)"),
    ("nvl_efficiency", 0.05, 1.0, "share of the NVLink rate an all-to-all reaches inside a node"),
)


MEASURED_QUANTITIES = ("dispatch", "combine", "total")  # total: one dispatch + one combine
# the calibration job's path where DeepEP does not import (calib.epbench)
TORCH_A2A = "torch_all_to_all_single"
# DeepEP's calls take effect for their backend (all2all.measured_times); torch's are kept as
# measured, and set the network's transport terms through the calibration job's fit, never a
# backend's time directly (§11.5)
MEASURED_BACKENDS = ("deepep_low_latency", "deepep_high_throughput", TORCH_A2A)


@dataclasses.dataclass(frozen=True)
class MeasuredA2A:
    """One measured all-to-all call on this cluster (a DeepEP test log's line), SI (§11.5)."""

    backend: str
    quantity: str  # dispatch | combine | total
    gpu: str  # the GPU profile it was measured on: another GPU's step refuses this network
    ep: int
    gpus_per_node: int
    tokens_per_rank: int
    hidden: int
    top_k: int
    num_experts: int
    # the routing's groups in the test (DeepEP's internode test limits tokens to node groups)
    n_group: int
    topk_group: int
    dispatch_dtype: str
    t_s: float
    source: str


_MEASURED_INTS = (
    ("ep", 2, 4096),
    ("gpus_per_node", 1, 72),
    ("tokens_per_rank", 1, 2**20),
    ("hidden", 1, 2**20),
    ("top_k", 1, 1024),
    ("num_experts", 1, 2**16),
    ("n_group", 1, 2**16),
    ("topk_group", 1, 2**16),
)


def _measured(tree: Any, where: str) -> tuple[MeasuredA2A, ...]:
    """The [[measured]] array of a network file, each entry checked (one line per mistake)."""
    if tree is None:
        return ()
    if not isinstance(tree, list):
        raise TpcostError(f"{where}: measured must be an array of tables ([[measured]])")
    out = []
    for i, m in enumerate(tree):
        at = f"{where}: measured[{i}]"
        if not isinstance(m, dict):
            raise TpcostError(f"{at} must be a table")
        known = {f.name for f in dataclasses.fields(MeasuredA2A)}
        extra, missing = sorted(set(m) - known), sorted(known - set(m))
        if extra or missing:
            raise TpcostError(
                f"{at}: "
                + (
                    f"unknown key(s) {', '.join(extra)}"
                    if extra
                    else f"missing {', '.join(missing)}"
                )
                + f" (it holds {', '.join(sorted(known))})"
            )
        if m["backend"] not in MEASURED_BACKENDS:
            raise TpcostError(
                f"{at}: backend must be one of {', '.join(MEASURED_BACKENDS)}, got {m['backend']!r}"
            )
        if m["quantity"] not in MEASURED_QUANTITIES:
            raise TpcostError(
                f"{at}: quantity must be one of {', '.join(MEASURED_QUANTITIES)}, got "
                f"{m['quantity']!r}"
            )
        if not (isinstance(m["gpu"], str) and m["gpu"].strip()):
            raise TpcostError(f"{at}: gpu must name the GPU profile it was measured on")
        if m["dispatch_dtype"] not in ("fp8", "bf16"):
            raise TpcostError(
                f"{at}: dispatch_dtype must be fp8 or bf16, got {m['dispatch_dtype']!r}"
            )
        for key, lo, hi in _MEASURED_INTS:
            v = m[key]
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise TpcostError(f"{at}: {key} must be an integer in [{lo}, {hi}], got {v!r}")
        t_s = finite_float(m["t_s"], f"{at}: t_s")
        if not 1e-7 <= t_s <= 10.0:
            raise TpcostError(f"{at}: t_s = {t_s:g} is outside its plausible range [1e-07, 10] s")
        if not (isinstance(m["source"], str) and m["source"].strip()):
            raise TpcostError(f"{at}: needs a non-empty source")
        out.append(MeasuredA2A(**{**m, "t_s": t_s}))
    return tuple(out)


def network_toml(net: Network, header: str = "") -> str:
    """The network as a network file's text (tomli_w; what load_network reads back; §11.5)."""
    import tomli_w

    tree: dict = {"name": net.name, "display_name": net.display_name, "transport": net.transport}
    for key, *_ in FIELDS:
        tree[key] = {
            "value": float(getattr(net, key)),
            "source": net.sources[key],
            "tier": net.tiers[key],
            "sigma": float(net.sigmas[key]),
        }
    if net.measured:
        tree["measured"] = [dataclasses.asdict(m) for m in net.measured]
    return header + tomli_w.dumps(tree)


@dataclasses.dataclass(frozen=True)
class Network:
    """One cluster's scale-out network; each number has a source, a tier and a sigma (§11.5)."""

    name: str
    display_name: str
    transport: str
    nics_per_gpu: float
    nic_line_rate_bytes_per_s: float
    rdma_efficiency: float
    rdma_latency_s: float
    msg_overhead_s: float
    ll_latency_s: float
    ll_latency_per_log2_ep_s: float
    ll_combine_extra_s: float
    ht_latency_s: float
    nvl_efficiency: float
    sources: dict[str, str]
    tiers: dict[str, str]
    sigmas: dict[str, float]
    origin: str
    measured: tuple[
        MeasuredA2A, ...
    ] = ()  # this cluster's own timings: they take effect where they apply (§11.5)

    @property
    def line_rate_per_gpu_bytes_per_s(self) -> float:
        """NICs per GPU × line rate (bytes/s): the bound no RDMA transfer beats (§11.5)."""
        return self.nics_per_gpu * self.nic_line_rate_bytes_per_s

    def with_values(self, **kw: Any) -> Network:
        """A copy with some numbers replaced (a fit, a what-if; §11.5)."""
        return dataclasses.replace(self, **kw)

    def drawn(self, draws: int, seed: int) -> dict[str, Any]:
        """Lognormal draws of every number with a sigma, as the profile's band draws are (§11.5)."""
        # Lognormal draws of every number with a sigma (median = its value), clipped into its
        # plausible range, each key from its own stream (seed, crc32 of "network.<key>"), as the
        # profile's band draws are (§11.5).
        import zlib

        import numpy as np

        out = {}
        for key, lo, hi, _ in FIELDS:
            sig, v = self.sigmas.get(key, 0.0), float(getattr(self, key))
            if sig <= 0 or v == 0:
                continue
            z = np.random.default_rng(
                [seed, zlib.crc32(f"network.{key}".encode())]
            ).standard_normal(draws)
            out[key] = np.clip(v * np.exp(sig * z), lo, hi)
        return out


def builtin_network_names() -> list[str]:
    return sorted(
        p.name[:-5]
        for p in resources.files("costmodel.networks").iterdir()
        if p.name.endswith(".toml")
    )


def _value(tree: dict, key: str, lo: float, hi: float, where: str) -> tuple[float, str, str, float]:
    t = tree.get(key)
    if not isinstance(t, dict):
        raise TpcostError(f"{where}: [{key}] must be a table with value, source, tier and sigma")
    extra = sorted(set(t) - {"value", "source", "tier", "sigma"})
    if extra:
        raise TpcostError(
            f"{where}: [{key}] has unknown key(s) {', '.join(extra)} (value, source, tier, sigma)"
        )
    raw = t.get("value")
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise TpcostError(f"{where}: {key}.value must be a number, got {raw!r}")
    v = finite_float(raw, f"{where}: {key}.value")
    if not lo <= v <= hi:
        raise TpcostError(
            f"{where}: {key}.value = {v:g} is outside its plausible range [{lo:g}, {hi:g}]"
        )
    src, tier = t.get("source"), t.get("tier")
    if not (isinstance(src, str) and src.strip()) or not (isinstance(tier, str) and tier.strip()):
        raise TpcostError(f"{where}: {key} needs a non-empty source and tier")
    sig = finite_float(t.get("sigma", 0.0), f"{where}: {key}.sigma", nonneg=True)
    return v, src, tier, sig


def network_from_dict(tree: Any, origin: str) -> Network:
    """Check a parsed network file and build the Network (one line per mistake; §11.5)."""
    if not isinstance(tree, dict):
        raise TpcostError(f"{origin}: a network file holds a TOML table")
    name, disp, transport = (
        tree.get("name"),
        tree.get("display_name", tree.get("name")),
        tree.get("transport"),
    )
    if not (isinstance(name, str) and name.strip()):
        raise TpcostError(f"{origin}: the network needs a non-empty name")
    if transport not in TRANSPORTS:
        raise TpcostError(
            f"{origin}: transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}"
        )
    known = {f[0] for f in FIELDS} | {"name", "display_name", "transport", "measured"}
    extra = sorted(set(tree) - known)
    if extra:
        raise TpcostError(
            f"{origin}: unknown key(s) {', '.join(extra)}; a network holds "
            f"{', '.join(sorted(known))}"
        )
    vals, src, tiers, sig = {}, {}, {}, {}
    for key, lo, hi, _unit in FIELDS:
        vals[key], src[key], tiers[key], sig[key] = _value(tree, key, lo, hi, origin)
    return Network(
        name=name,
        display_name=str(disp),
        transport=transport,
        sources=src,
        tiers=tiers,
        sigmas=sig,
        origin=origin,
        measured=_measured(tree.get("measured"), origin),
        **vals,
    )


@functools.lru_cache(maxsize=32)
def _builtin_network(name: str) -> Network:
    """A built-in network, parsed once per process (the files are part of the package)."""
    text = resources.files("costmodel.networks").joinpath(f"{name}.toml").read_text()
    return _parse(text, f"built-in:{name}")


def load_network(name_or_path: str) -> Network:
    """A built-in network by name, or a TOML file by path (tomllib; never eval; §11.5)."""
    match = (
        name_or_path
        if name_or_path in builtin_network_names()
        else (
            None
            if Path(name_or_path).exists()
            else match_builtin(name_or_path, builtin_network_names(), "network")
        )
    )
    if match is not None:
        return _builtin_network(match)
    p = Path(name_or_path)
    if not p.suffix == ".toml" and not p.exists():
        raise TpcostError(
            f"unknown network {name_or_path!r}; built-in: {', '.join(builtin_network_names())} "
            "(or a path to a network .toml)"
        )
    return _parse(read_text(p, "network file"), str(p))


def _parse(text: str, origin: str) -> Network:
    try:
        tree = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TpcostError(f"{origin}: not valid TOML ({e})") from None
    return network_from_dict(tree, origin)
