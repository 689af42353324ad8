"""Hardware profiles: versioned TOML, parsed once into frozen typed dataclasses; every number keeps its source and tier.

Schema (version 1). A profile is a tree of TOML tables, one per dataclass below (`[gemm]` is `Gemm`,
`[collectives.<impl>.tp<W>]` a `Collective`). A profile holds hardware only: vLLM's dispatch limits are code of
vLLM's, derived per version by costmodel.vllm_tables.dispatch. Every table that holds
numeric leaves also holds `source` (URL, `../shared/reference` source_id, or calibration provenance) and
`tier` (one of TIERS); the numeric leaves of that table share them. A sub-table whose name starts with `_`
only groups values that share a source: its leaves belong to the parent table (`[gemm._tile] tile_m = 128`
is `gemm.tile_m`). An optional sub-table `uncertainty_rel` gives a fitted relative 1-sigma per leaf. String
leaves (`kind`, `vendor`, ...) are typed fields without provenance; the `[calibration]` table holds free
strings (what a calibration run measured and kept). An optional `[measured.<impl>.tp<W>]` table holds the points of
one measured NCCL collective (`msg_bytes`, `time_s`: arrays, sizes increasing; `source`): between them the model
interpolates the measurement (MeasuredCurve). Keys are dotted paths: `collectives.nccl_all_reduce.tp4.latency_s`
names `profile.collectives["nccl_all_reduce"][4].latency_s`. A key the schema does not have is an error.

The model reads the typed fields only. `HardwareProfile.with_values` is the one way to make a new profile from
another (--set, the Monte Carlo band, calibration); `provenance` maps every dotted numeric key to its Provenance.
See docs/model.md for each quantity.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import tomllib
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any
from collections.abc import Mapping

from .errors import TpcostError
from .io import finite_float, match_builtin, read_text

SCHEMA_VERSION = 1
TIERS = ("assumed", "datasheet", "published-measurement", "calibrated")
# Relative 1-sigma of a parameter by provenance tier, used by the cutoff band (docs/model.md §9).
SIGMA_REL_BY_TIER = {"assumed": 0.30, "datasheet": 0.15, "published-measurement": 0.10, "calibrated": 0.05}
# Tables whose values are shapes or counts: never perturbed.
UNPERTURBED_PREFIXES = ("identity.", "gemm.tile_", "interconnect.domain_size", "interconnect.domain_hosts",
                        "interconnect.multicast")
NO_DISPATCH_TABLE = ("[vllm_dispatch] is not a profile table: profiles hold hardware only, and tpcost derives vLLM's "
                     "dispatch limits from its version (costmodel/vllm_tables.py); delete the section, and use "
                     "--vllm-set KEY=BYTES (e.g. custom_ar_max_bytes=4194304) for a what-if on a limit")

Num = Any  # a float, or an array of Monte Carlo draws of shape (D, 1) (the cutoff band)


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Where one numeric value came from."""

    source: str  # URL, ../shared/reference source_id, or calibration run
    tier: str  # one of TIERS
    uncertainty_rel: float | None = None  # fitted relative 1-sigma, where a fit gave one

    @property
    def sigma_rel(self) -> float:
        """The fit's own relative sigma where one was recorded (calibrated or fitted values), else the tier's."""
        if self.uncertainty_rel is not None and self.tier in ("calibrated", "published-measurement"):
            return float(self.uncertainty_rel)
        return SIGMA_REL_BY_TIER[self.tier]


@dataclasses.dataclass(frozen=True)
class Identity:
    """[identity]: which part this is (docs/model.md §1)."""

    name: str  # the profile's name
    sm_count: Num  # streaming multiprocessors / compute units (count): the GEMM work is spread over them (§2)
    display_name: str = ""
    vendor: str = ""  # nvidia | amd | cpu
    compute_capability: str = ""  # "major.minor" as torch reports it
    device_name_patterns: str = ""  # "|"-separated substrings of the device name (match_profile)


@dataclasses.dataclass(frozen=True)
class PeakFlops:
    """[compute.peak_flops_per_s]: dense tensor-core peak per GEMM dtype (FLOP/s, §2)."""

    bf16: Num
    fp8: Num
    fp32: Num


@dataclasses.dataclass(frozen=True)
class Compute:
    """[compute]."""

    peak_flops_per_s: PeakFlops


@dataclasses.dataclass(frozen=True)
class Memory:
    """[memory]: HBM (§3)."""

    hbm_bw_bytes_per_s: Num  # peak HBM bandwidth (bytes/s)
    hbm_capacity_bytes: Num | None = None  # HBM per GPU (bytes): the memory-fit check


@dataclasses.dataclass(frozen=True)
class Kernels:
    """[kernels]: memory-bound kernels (norms, activations, copies, §3)."""

    mem_efficiency: Num  # achieved / peak HBM bandwidth, in (0, 1]
    launch_overhead_s: Num  # fixed cost per kernel (s)


@dataclasses.dataclass(frozen=True)
class Gemm:
    """[gemm]: the GEMM roofline under a stream-K library kernel (§2)."""

    tile_m: Num  # output tile rows (count)
    tile_n: Num  # output tile columns (count)
    max_efficiency: Num  # best achieved / peak FLOP/s, in (0, 1]
    mem_efficiency: Num  # achieved / peak HBM bandwidth of memory-bound GEMMs, in (0, 1]
    launch_overhead_s: Num  # fixed cost per GEMM (s)


@dataclasses.dataclass(frozen=True)
class Attention:
    """[attention]: prefill attention (§5)."""

    efficiency: Num  # achieved / peak FLOP/s, in (0, 1]


@dataclasses.dataclass(frozen=True)
class Interconnect:
    """[interconnect]: the scale-up link and what lies beyond its domain (§4)."""

    kind: str  # one of INTERCONNECT_KINDS
    link_bw_bytes_per_s: Num  # unidirectional bandwidth per GPU (bytes/s)
    latency_s: Num  # one link hop (s)
    domain_size: Num  # GPUs that share the link (count): symmetric memory cannot span more
    domain_hosts: Num = 1  # hosts one domain spans (count): an NVL72's 18 trays; 1 where the domain is one host
    network: str = ""  # the network between domains: a built-in network's name or a network file (costmodel.network)
    multicast: Num = 0  # 1: the domain's GPUs share an NVLink multicast (NVLS) address space; 0: they do not

    def gpus_per_host(self) -> int:
        """GPUs on one host: the domain's share of each of its hosts."""
        return max(1, int(self.domain_size) // max(1, int(self.domain_hosts)))


@dataclasses.dataclass(frozen=True)
class Collective:
    """[collectives.<impl>.tp<W>]: one collective implementation at W ranks, as t = α + factor·S/busBW (§4)."""

    latency_s: Num  # α (s)
    bus_bw_bytes_per_s: Num  # nccl-tests bus bandwidth (bytes/s)


@dataclasses.dataclass(frozen=True)
class AsyncTP:
    """[asynctp]: torch's fused AG+GEMM / GEMM+RS pipelines (§6)."""

    barrier_s: Num  # one symmetric-memory barrier (s)
    copy_engine_bw_bytes_per_s: Num  # one peer pull (bytes/s)
    copy_latency_s: Num  # start of one pull (s)
    compute_slowdown: Num  # relative GEMM slowdown σ while pulls run, in [0, 10]
    stream_concurrency: Num  # fraction κ of compute quantisation two streams recover, in [0, 1]
    host_op_s: Num  # one eager torch call (s)
    time_scale: Num = 1.0  # measured / modelled time of a fused op: 1, its σ the model's out-of-sample error (§9)
    rs_step_exposure: Num = 0.0  # share of GEMM+RS's pulls that a step's barrier leaves exposed, in [0, 1] (§6)


@dataclasses.dataclass(frozen=True)
class FusedKernel:
    """[fused_kernel]: a persistent single-kernel fused GEMM + reduce-scatter / all-reduce over an NVLS multicast
    workspace (vLLM's CuTe `gemm_rs_ar`; docs/model.md §6b), on this hardware. Optional: only profiles whose
    hardware has NVLink multicast carry the table. Hardware terms: link_efficiency, multicast_latency_s; the
    kernel's own: the rest (its tiles and bytes in flight are code: costmodel/ops.py)."""

    fixed_s: Num  # per call: launch, workspace flags and the exit barrier (s)
    ar_fence_s: Num  # GEMM+AR's extra per call: the system-scope release that flushes its multimem stores (s)
    compute_overhead: Num  # φ: GEMM time lost to the communicating warps and to contention (relative), in [0, 10]
    link_efficiency: Num  # η: achieved / peak unidirectional link bandwidth of multimem traffic, in (0, 1]
    multicast_latency_s: Num  # λ: round trip of one multimem.ld_reduce through the switch (s)
    exposed_fraction: Num  # α: share of the wave overlap the design gives up (0 pipelined, 1 serial), in [0, 1]
    inflight_scale: Num  # bytes a CTA keeps in flight over one RS tile's ld_reduce (vLLM's design: 1)
    time_scale: Num = 1.0  # measured / modelled time of the kernel: 1, its σ the model's out-of-sample error (§9)


MEASURED_TABLE = "measured"  # [measured.<impl>.tp<W>]: the points of a measured collective (MeasuredCurve)
MEASURED_IMPLS = ("nccl_all_reduce", "nccl_all_gather", "nccl_reduce_scatter")  # what a log measures (nccl-tests)
MEASURED_MAX_POINTS = 4096


@dataclasses.dataclass(frozen=True)
class MeasuredCurve:
    """[measured.<impl>.tp<W>]: one collective as a calibration measured it, point by point (nccl-tests' sizes and
    times). The model interpolates between the points (log-log), follows the fitted curve's growth above the
    largest, and uses the fitted curve below the smallest (ops.measured_or_fitted; docs/profiles.md)."""

    msg_bytes: tuple[float, ...]  # increasing message sizes (bytes, nccl-tests' size column)
    time_s: tuple[float, ...]  # the measured time at each (s)
    source: str

    @classmethod
    def from_points(cls, points, source: str) -> MeasuredCurve:
        """The curve of (size bytes, time s) pairs in any order: one time per size (a size timed twice: the faster),
        sizes increasing."""
        best: dict[float, float] = {}
        for size, t in points:
            best[float(size)] = min(float(t), best.get(float(size), float(t)))
        sizes = sorted(best)
        return cls(tuple(sizes), tuple(best[x] for x in sizes), source)


# fixed tables: dotted path -> dataclass; patterned ones: collectives.<impl>.tp<W>
_TABLES = {"identity": Identity, "compute.peak_flops_per_s": PeakFlops, "memory": Memory, "kernels": Kernels,
           "gemm": Gemm, "attention": Attention, "interconnect": Interconnect, "asynctp": AsyncTP}
_SECTIONS = ("identity", "compute", "memory", "kernels", "gemm", "attention", "interconnect", "asynctp")
_OPTIONAL_TABLES = {"fused_kernel": FusedKernel}  # present in some profiles only; all fields or none
NOTES_TABLE = "calibration"  # free string leaves


@functools.cache
def _field_kinds(cls) -> dict[str, tuple[bool, bool]]:
    """field name -> (is a string, is required) of one schema dataclass."""
    return {f.name: (f.type.startswith("str"), f.default is dataclasses.MISSING) for f in dataclasses.fields(cls)}


def _table_class(parent: str):
    """The dataclass of the table at dotted path `parent`, or None where the schema has no such table."""
    cls = _TABLES.get(parent) or _OPTIONAL_TABLES.get(parent)
    if cls is not None:
        return cls
    parts = parent.split(".")
    if len(parts) == 3 and parts[0] == "collectives" and _is_tp(parts[2]):
        return Collective
    return None


def _is_tp(s: str) -> bool:
    return s.startswith("tp") and s[2:].isdigit() and int(s[2:]) >= 1


REQUIRED_PARAMS = tuple(f"{path}.{name}" for path, cls in _TABLES.items()
                        for name, (is_str, req) in _field_kinds(cls).items() if req and not is_str)
# Quantities added after schema 1 was first written: a profile without them gets this value (tier assumed).
OPTIONAL_DEFAULTS = {
    "asynctp.host_op_s": (3e-6, "default (not in this profile): one eager torch call ~3 us on a server CPU, the "
                                "built-in profiles' assumption (docs/model.md §6)"),
    "asynctp.rs_step_exposure": (0.0, "default (not in this profile): every pull of torch's GEMM+RS hides behind a "
                                      "chunk GEMM (docs/model.md §6)"),
    "interconnect.domain_hosts": (1, "default (not in this profile): the NVLink domain is one host"),
    "interconnect.multicast": (0, "default (not in this profile): no NVLink multicast (NVLS) in the domain"),
    "asynctp.time_scale": (1.0, "default (not in this profile): the fused ops as modelled; the tier's σ stands for "
                                "the model's error (the built-in profiles carry the calibrated one, calib/band.py)"),
}
# The same for a quantity of an optional table: given where the table is present.
OPTIONAL_TABLE_DEFAULTS = {
    "fused_kernel.time_scale": (1.0, "default (not in this profile): the kernel as modelled; the tier's σ stands for "
                                     "the model's error (the built-in profiles carry the calibrated one, calib/band.py)"),
}
# quantities a later schema replaced, with what replaced them (a profile that holds one is refused, saying so)
_NETWORK_NOW = ("replaced by interconnect.network, a network file's name or path (NICs per GPU, line rate, RDMA "
                "efficiency and latency, each with its source: costmodel/networks, docs/profiles.md)")
REPLACED_KEYS = {"interconnect.internode_bw_bytes_per_s": _NETWORK_NOW, "interconnect.internode_latency_s": _NETWORK_NOW}
REQUIRED_COLLECTIVES = ("nccl_all_gather", "nccl_reduce_scatter", "nccl_all_reduce")
INTEGER_PARAMS = ("identity.sm_count", "gemm.tile_m", "gemm.tile_n", "interconnect.domain_size",
                  "interconnect.domain_hosts", "interconnect.multicast")


@dataclasses.dataclass(frozen=True)
class ValueRange:
    """The plausible range of one profile quantity: lo <= v <= hi (lo excluded when lo_open), in SI units."""

    lo: float
    hi: float
    unit: str
    why: str
    lo_open: bool = False

    def contains(self, v: float) -> bool:
        return (v > self.lo if self.lo_open else v >= self.lo) and v <= self.hi

    def text(self) -> str:
        return f"{'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}] {self.unit}".rstrip()


def _value_ranges() -> tuple[tuple[str, ValueRange], ...]:
    """The plausible ranges of every profile quantity (costmodel/value_ranges.toml, the reasons there): (dotted-key
    regular expression, range), first match wins."""
    d = tomllib.loads(resources.files("costmodel").joinpath("value_ranges.toml").read_text(encoding="utf-8"))
    return tuple((e["key"], ValueRange(e["lo"], e["hi"], e["unit"], e["why"], e.get("lo_open", False)))
                 for e in d["range"])


VALUE_RANGES = _value_ranges()
UNCERTAINTY_RANGE = ValueRange(0.0, 1.0, "", "a relative 1-sigma; a fit worse than 100 % says nothing")
_RANGE_RES = tuple((re.compile(pat), r) for pat, r in VALUE_RANGES)


def value_range(key: str) -> ValueRange:
    """The plausible range of the quantity at dotted `key` (first matching VALUE_RANGES pattern)."""
    for rx, r in _RANGE_RES:
        if rx.fullmatch(key):
            return r
    raise TpcostError(f"{key}: no plausible range defined (a schema field without an entry in VALUE_RANGES)")


INTERCONNECT_KINDS = ("nvswitch", "nvlink-mesh", "pcie", "xgmi", "host")
DERIVED_FROM_LINK = "--set on interconnect.* (derived: rides on the link)"
USER_SET = Provenance("--set by user", "assumed")


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class HardwareProfile:
    """A GPU (or CPU host) described as typed data. Built only by profile_from_dict (a TOML tree) and
    with_values (a new profile from this one); the model reads the section fields."""

    origin: str  # "built-in:<name>" or a file path
    identity: Identity
    compute: Compute
    memory: Memory
    kernels: Kernels
    gemm: Gemm
    attention: Attention
    interconnect: Interconnect
    collectives: Mapping[str, Mapping[int, Collective]]  # impl -> TP size -> α, busBW
    asynctp: AsyncTP
    provenance: Mapping[str, Provenance]  # every numeric dotted key -> where its value came from
    notes: Mapping[str, str]  # [calibration] strings, dotted
    modified: tuple[str, ...] = ()  # keys changed by --set
    fused_kernel: FusedKernel | None = None  # single-kernel fused GEMM+collective, where the hardware has it
    measured: Mapping[str, Mapping[int, MeasuredCurve]] = dataclasses.field(
        default_factory=lambda: MappingProxyType({}))  # impl -> TP size -> a calibration's measured points

    def __repr__(self) -> str:
        return f"HardwareProfile({self.name!r}, origin={self.origin!r}, {len(self.provenance)} quantities)"

    @property
    def name(self) -> str:
        return self.identity.name

    @property
    def kind(self) -> str:
        return self.interconnect.kind

    def leaves(self) -> Mapping[str, Any]:
        """Every field as dotted key -> value, numbers and strings (None fields left out), in schema order."""
        return self._leaves

    @functools.cached_property
    def _leaves(self) -> Mapping[str, Any]:
        out: dict[str, Any] = {}

        def walk(obj, prefix):
            obj = obj._obj if isinstance(obj, _Recorder) else obj  # a recording copy's leaves: the values, unrecorded
            for f in dataclasses.fields(obj):
                v = getattr(obj, f.name)
                if dataclasses.is_dataclass(v) or isinstance(v, _Recorder):
                    walk(v, f"{prefix}.{f.name}")
                elif v is not None:
                    out[f"{prefix}.{f.name}"] = v

        for sec in _SECTIONS + tuple(_OPTIONAL_TABLES):
            if getattr(self, sec) is not None:
                walk(getattr(self, sec), sec)
        for impl, per_tp in self.collectives.items():
            for tp, c in per_tp.items():
                walk(c, f"collectives.{impl}.tp{tp}")
        return MappingProxyType(out)

    def values(self) -> dict[str, Any]:
        """Every numeric quantity as dotted key -> value (the --set / calibration vocabulary)."""
        return {k: v for k, v in self._leaves.items() if k in self.provenance}

    def value(self, key: str) -> Any:
        """The value of numeric quantity `key` (dotted) — for --set, the band and reports; the model reads fields."""
        if key not in self.provenance:
            raise TpcostError(f"profile {self.name!r} has no quantity {key!r}")
        return self._leaves[key]

    def collective(self, impl: str, tp: int) -> tuple[Any, Any]:
        """(latency_s, bus_bw_bytes_per_s) of collective `impl` at TP size `tp`: the entry for `tp` if present, else
        the nearest listed TP size (larger preferred), through formulas.collective_beyond_domain beyond the
        interconnect domain (the profile's network: its NICs at their RDMA efficiency, one RDMA hop)."""
        from .formulas import collective_beyond_domain

        c = self.collectives[impl][self.collective_entry_tp(impl, tp)]
        ic = self.interconnect
        if tp <= ic.domain_size:
            return c.latency_s, c.bus_bw_bytes_per_s
        net = self.network()
        return collective_beyond_domain(c.latency_s, c.bus_bw_bytes_per_s,
                                        net.line_rate_per_gpu_bytes_per_s * net.rdma_efficiency, net.rdma_latency_s)

    def with_network(self, name_or_path: str) -> HardwareProfile:
        """This profile with another network between its domains (a built-in name or a network file, checked now)."""
        from .network import load_network

        load_network(name_or_path)
        return dataclasses.replace(self, interconnect=dataclasses.replace(self.interconnect, network=name_or_path))

    def network(self):
        """The costmodel.network.Network between this GPU's domains (interconnect.network), or one line saying there
        is none."""
        from .network import load_network

        name = self.interconnect.network
        if not name:
            raise TpcostError(f"profile {self.name!r} names no network between its NVLink domains "
                              "(interconnect.network): give --network NAME|FILE, or set it in the profile")
        return load_network(name)

    def collective_entry_tp(self, impl: str, tp: int) -> int:
        """The TP size whose `collectives.<impl>` entry serves `tp`: tp itself, else the nearest (larger preferred)."""
        tps = self.collective_tps(impl)
        if not tps:
            raise TpcostError(f"profile {self.name!r} has no collective {impl!r}")
        return tp if tp in tps else min(tps, key=lambda t: (abs(t - tp), -t))

    def collective_tps(self, impl: str) -> list[int]:
        return list(self.collectives.get(impl, ()))

    def has_collective(self, impl: str) -> bool:
        return impl in self.collectives

    @property
    def tier(self) -> str:
        """Lowest provenance tier among the parameters the model uses (the profile's weakest link)."""
        used = [p.tier for k, p in self.provenance.items() if not k.startswith(UNPERTURBED_PREFIXES)]
        return min(used, key=TIERS.index) if used else "assumed"

    def tier_counts(self) -> dict[str, int]:
        counts = {t: 0 for t in TIERS}
        for p in self.provenance.values():
            counts[p.tier] += 1
        return counts

    def sources(self) -> list[str]:
        return sorted({p.source for p in self.provenance.values()})

    def with_values(self, values: Mapping[str, Any], provenance: Provenance | Mapping[str, Provenance] | None = USER_SET,
                    *, mark_modified: bool = True, new_keys_ok: bool = False, name: str | None = None,
                    notes: Mapping[str, str] | None = None, drop: tuple[str, ...] = (),
                    measured: Mapping[str, Mapping[int, MeasuredCurve]] | None = None) -> HardwareProfile:
        """A new profile with some values replaced: the one way --set, the Monte Carlo band and calibration make one.

        `provenance`: of every new value (one Provenance), per key (a mapping), or None to keep each key's own (the
        band's draws). `mark_modified` records the keys as --set. `new_keys_ok` lets calibration add a schema key
        the profile lacks (a collective at a new TP size). Plain numbers are range-checked (check_params) every time;
        draws are checked where they are made. `drop`: tables (dotted prefixes) removed first, values and provenance
        (calibration: NCCL regime curves the run's own curve replaces; --set: the measured points it replaces).
        `measured`: measured curves added or replaced (calibration from nccl-tests)."""
        gone = tuple(d + "." for d in drop)
        leaves = {k: v for k, v in self._leaves.items() if not k.startswith(gone)}
        prov = {k: v for k, v in self.provenance.items() if not k.startswith(gone)}
        for k, v in values.items():
            if k not in prov:
                if not new_keys_ok:
                    raise TpcostError(f"--set: unknown quantity {k!r} for profile {self.name!r} "
                                      f"(see `tpcost profiles --keys {self.name}`)")
                _check_key(k, v, "calibration")
            leaves[k] = v
            if provenance is None:
                if k not in prov:
                    raise TpcostError(f"{k}: a new quantity needs its provenance")
            elif isinstance(provenance, Provenance):
                prov[k] = provenance
            else:
                prov[k] = provenance[k]
        where = f"profile {self.name!r} after --set" if mark_modified else f"profile {self.name!r}"
        check_params({k: leaves[k] for k in values}, where)
        for k in values:
            if prov[k].uncertainty_rel is not None:
                check_uncertainty(k, prov[k].uncertainty_rel, where)
        if name is not None:
            leaves["identity.name"] = name
        modified = self.modified + tuple(k for k in values if k not in self.modified) if mark_modified else self.modified
        kept = {impl: {tp: c for tp, c in per.items() if f"measured.{impl}.tp{tp}." not in gone}
                for impl, per in self.measured.items()}
        for impl, per in (measured or {}).items():
            kept.setdefault(impl, {}).update(per)
        return _assemble(leaves, prov, {**self.notes, **(notes or {})}, self.origin, modified,
                         {impl: per for impl, per in kept.items() if per})


def _assemble(leaves: Mapping[str, Any], provenance: Mapping[str, Provenance], notes: Mapping[str, str], origin: str,
              modified: tuple[str, ...] = (), measured: Mapping[str, Mapping[int, MeasuredCurve]] | None = None
              ) -> HardwareProfile:
    """The typed profile of dotted leaves that passed the schema checks (the one constructor)."""
    def build(cls, prefix):
        return cls(**{f: leaves[key] for f in _field_kinds(cls) if (key := f"{prefix}.{f}") in leaves})

    colls: dict[str, set[int]] = {}
    for key in leaves:
        if key.startswith("collectives."):
            parts = key.split(".")
            colls.setdefault(parts[1], set()).add(int(parts[2][2:]))
    optional = {}
    for sec, cls in _OPTIONAL_TABLES.items():
        have = [f for f in _field_kinds(cls) if f"{sec}.{f}" in leaves]
        need = [f for f, (_, req) in _field_kinds(cls).items() if req]
        if have and not all(f"{sec}.{f}" in leaves for f in need):
            raise TpcostError(f"{origin}: [{sec}] needs all of {', '.join(need)} (or none)")
        optional[sec] = build(cls, sec) if have else None
    try:
        collectives = {impl: MappingProxyType({tp: build(Collective, f"collectives.{impl}.tp{tp}") for tp in sorted(tps)})
                       for impl, tps in colls.items()}
    except TypeError:
        bad = next(f"collectives.{i}.tp{t}" for i, tps in colls.items() for t in tps
                   if not all(f"collectives.{i}.tp{t}.{f}" in leaves for f in ("latency_s", "bus_bw_bytes_per_s")))
        raise TpcostError(f"{origin}: [{bad}] needs both latency_s and bus_bw_bytes_per_s") from None
    return HardwareProfile(
        origin=origin, identity=build(Identity, "identity"),
        compute=Compute(build(PeakFlops, "compute.peak_flops_per_s")), memory=build(Memory, "memory"),
        kernels=build(Kernels, "kernels"), gemm=build(Gemm, "gemm"), attention=build(Attention, "attention"),
        interconnect=build(Interconnect, "interconnect"), collectives=MappingProxyType(collectives),
        asynctp=build(AsyncTP, "asynctp"), provenance=MappingProxyType(dict(provenance)),
        notes=MappingProxyType(dict(notes)), modified=modified,
        measured=MappingProxyType({i: MappingProxyType(dict(per)) for i, per in (measured or {}).items()}), **optional)


class _Recorder:
    """Stands in for one section of a profile and records the dotted keys read through it."""

    __slots__ = ("_obj", "_path", "_reads")

    def __init__(self, obj, path: str, reads: tuple[set, ...]):
        self._obj, self._path, self._reads = obj, path, reads  # reads: one set per recording that wraps it

    def __getattr__(self, name):
        v = getattr(self._obj, name)
        key = f"{self._path}.{name}"
        if dataclasses.is_dataclass(v):
            return _Recorder(v, key, self._reads)
        if v is not None:  # a field the profile leaves empty is nothing --set could change
            for r in self._reads:
                r.add(key)
        return v


def recording(profile: HardwareProfile) -> tuple[HardwareProfile, set[str]]:
    """(a copy of `profile` that records reads, the set it records into): what the model reads for one query,
    which is how --set finds keys with no effect. The copy is for that one prediction only."""
    reads: set[str] = set()

    def rec(obj, path) -> Any:  # a _Recorder stands in for the section it wraps (duck-typed)
        if isinstance(obj, _Recorder):  # a recording of a recording: each records every read
            return _Recorder(obj._obj, path, (*obj._reads, reads))
        return _Recorder(obj, path, (reads,))

    traced = dataclasses.replace(
        profile, **{s: rec(getattr(profile, s), s) for s in _SECTIONS + tuple(_OPTIONAL_TABLES)
                    if getattr(profile, s) is not None},
        collectives={impl: {tp: rec(c, f"collectives.{impl}.tp{tp}") for tp, c in per.items()}
                     for impl, per in profile.collectives.items()})
    return traced, reads


def with_overrides(profile: HardwareProfile, values: Mapping[str, float],
                   source: str = "--set by user") -> HardwareProfile:
    """--set semantics: plain replacement, except that the link itself carries its dependants along.

    `interconnect.link_bw_bytes_per_s` scales every collective's bus bandwidth and the copy-engine pull
    bandwidth by new/old; `interconnect.latency_s` shifts every collective latency and the pull latency
    by new − old (floored at 0). A dependant also given explicitly keeps the explicit value."""
    for k in values:  # an unknown key is named as such, before any range is looked up for it
        if k.startswith(f"{MEASURED_TABLE}."):
            raise TpcostError(f"--set {k}: measured points are a calibration's log, not a quantity; a --set on "
                              f"[collectives.{'.'.join(k.split('.')[1:3])}] is the what-if on them (it drops them)")
        if k not in profile.provenance and not k.startswith("vllm_dispatch."):
            raise TpcostError(f"--set: unknown quantity {k!r} for profile {profile.name!r} "
                              f"(see `tpcost profiles --keys {profile.name}`)")
    check_params(values, source)  # the keys as typed first: an error names what the user wrote, not a dependant
    derived: dict[str, Any] = {}
    current = profile.values()
    if "interconnect.link_bw_bytes_per_s" in values:
        old = profile.interconnect.link_bw_bytes_per_s
        ratio = values["interconnect.link_bw_bytes_per_s"] / old if old else 1.0
        for k, v in current.items():
            if (k.startswith("collectives.") and k.endswith(".bus_bw_bytes_per_s")) or \
                    k == "asynctp.copy_engine_bw_bytes_per_s":
                derived[k] = v * ratio
    if "interconnect.latency_s" in values:
        delta = values["interconnect.latency_s"] - profile.interconnect.latency_s
        for k, v in current.items():
            if (k.startswith("collectives.") and k.endswith(".latency_s")) or k == "asynctp.copy_latency_s":
                derived[k] = max(0.0, v + delta)
    derived = {k: v for k, v in derived.items() if k not in values}
    # a what-if on a measured collective (or on the link it rides) replaces the measurement: its points go
    link = any(k.startswith("interconnect.") and k != "interconnect.multicast" for k in values)
    drop = tuple(f"measured.{impl}.tp{tp}" for impl, per in profile.measured.items() for tp in per
                 if link or any(k.startswith(f"collectives.{impl}.tp{tp}.") for k in values))
    return profile.with_values(derived, Provenance(DERIVED_FROM_LINK, "assumed"), drop=drop).with_values(
        values, Provenance(source, "assumed"))


_SI_UNITS = (("_bytes_per_s", "bytes/s"), ("_flops_per_s", "FLOP/s"), ("_bytes", "bytes"), ("_s", "s"))


@functools.lru_cache(maxsize=256)
def _typical_log10(key: str) -> float | None:
    """The median log10 of `key` over the built-in profiles that hold it (what a typed value most likely means)."""
    import math

    vals = []
    for name in builtin_profile_names():
        try:
            v = _builtin_profile(name).values().get(key)
        except TpcostError:
            continue
        if v is not None and v > 0:
            vals.append(math.log10(v))
    return sorted(vals)[len(vals) // 2] if vals else None


def _si_hint(key: str, v: float, r: Any) -> str:
    """'; did you mean 900e9 (values are SI: bytes/s)?' where a power of 1000 brings `v` into the range."""
    unit = next((u for suffix, u in _SI_UNITS if key.endswith(suffix)), None)
    if unit is None or v == 0:
        return ""
    import math

    fits = [e for e in (3, 6, 9, 12, 15, -3, -6, -9) if r.contains(v * 10.0 ** e)]
    if not fits:
        return ""
    mid = _typical_log10(key)
    if mid is None:
        lo, hi = max(r.lo, 1e-30), r.hi
        mid = 0.5 * (math.log10(lo) + math.log10(hi)) if math.isfinite(hi) and hi > 0 else math.log10(lo) + 1
    exp = min(fits, key=lambda e: abs(math.log10(abs(v) * 10.0 ** e) - mid))  # 9.6 HBM -> 9.6e12, not 9.6e9
    typed = f"{v:g}"  # 900 -> 900e9; a value typed with its own exponent -> the value itself (9e+09)
    return f"; did you mean {typed + f'e{exp}' if 'e' not in typed else f'{v * 10.0 ** exp:g}'} (values are SI: {unit})?"


def check_params(values: Mapping[str, Any], where: str) -> None:
    """One validation path for every profile value, run on load, after every override and on what calibration
    writes: finite, inside its plausible range (VALUE_RANGES), counts and tile sizes integers."""
    for k, v in values.items():
        if k.startswith("vllm_dispatch."):
            raise TpcostError(f"{where}: {k}: {NO_DISPATCH_TABLE}")
        if hasattr(v, "shape"):  # Monte Carlo draws: clipped into the range where they are made
            continue
        fv = finite_float(v, f"{where}: {k}")
        r = value_range(k)
        if not r.contains(fv):
            raise TpcostError(f"{where}: {k} = {fv:g} is outside its plausible range {r.text()} ({r.why}; "
                              f"docs/profiles.md){_si_hint(k, fv, r)}")
        if k in INTEGER_PARAMS and fv != int(fv):
            raise TpcostError(f"{where}: {k} = {fv:g} must be an integer")


def check_uncertainty(key: str, u: Any, where: str) -> float:
    """A fitted relative 1-sigma: a finite number in [0, 1]."""
    if isinstance(u, bool) or not isinstance(u, (int, float)):
        raise TpcostError(f"{where}: uncertainty_rel of {key} must be a number, got {u!r}")
    try:
        fu = float(u)
    except OverflowError:
        raise TpcostError(f"{where}: uncertainty_rel of {key} = {u} is beyond the range of a float") from None
    if not (math.isfinite(fu) and UNCERTAINTY_RANGE.contains(fu)):
        raise TpcostError(f"{where}: uncertainty_rel of {key} = {fu:g} is outside {UNCERTAINTY_RANGE.text().strip()} "
                          f"({UNCERTAINTY_RANGE.why})")
    return fu


def _check_key(key: str, value: Any, where: str) -> None:
    """`key` names a field of the schema, and `value` has that field's type (number or string)."""
    parent, _, leaf = key.rpartition(".")
    cls = _table_class(parent)
    if key.startswith("vllm_dispatch."):
        raise TpcostError(f"{where}: {key}: {NO_DISPATCH_TABLE}")
    if cls is None:
        raise TpcostError(f"{where}: [{parent or key}] is not a table of the profile schema "
                          f"(version {SCHEMA_VERSION}; see the fields in costmodel/profile.py)")
    kinds = _field_kinds(cls)
    if key in REPLACED_KEYS:
        raise TpcostError(f"{where}: {key}: {REPLACED_KEYS[key]}")
    if leaf not in kinds:
        raise TpcostError(f"{where}: {key} is not a quantity of the schema ([{parent}] has: {', '.join(kinds)})")
    if kinds[leaf][0] != isinstance(value, str):
        raise TpcostError(f"{where}: {key} must be a {'string' if kinds[leaf][0] else 'number'}, got {value!r}")


def _measured(tree: Any, where: str) -> dict[str, dict[int, MeasuredCurve]]:
    """The [measured.<impl>.tp<W>] tables of a profile tree, checked: one-line errors naming the table."""
    out: dict[str, dict[int, MeasuredCurve]] = {}
    if not isinstance(tree, dict):
        raise TpcostError(f"{where}: [{MEASURED_TABLE}] must be a table of [{MEASURED_TABLE}.<impl>.tp<W>] tables")
    for impl, per in tree.items():
        if impl not in MEASURED_IMPLS or not isinstance(per, dict):
            raise TpcostError(f"{where}: [{MEASURED_TABLE}.{impl}]: a measured curve is one of "
                              f"{', '.join(MEASURED_IMPLS)} (what nccl-tests measures)")
        for tpk, t in per.items():
            name = f"[{MEASURED_TABLE}.{impl}.{tpk}]"
            if not _is_tp(tpk) or not isinstance(t, dict) or set(t) != {"msg_bytes", "time_s", "source"}:
                raise TpcostError(f"{where}: {name} must be a tp<W> table of msg_bytes, time_s and source")
            S, T, src = t["msg_bytes"], t["time_s"], t["source"]
            if not (isinstance(S, list) and isinstance(T, list) and 3 <= len(S) == len(T) <= MEASURED_MAX_POINTS):
                raise TpcostError(f"{where}: {name} msg_bytes and time_s must be arrays of the same length, 3 to "
                                  f"{MEASURED_MAX_POINTS} points")
            if not isinstance(src, str) or not src.strip():
                raise TpcostError(f"{where}: {name} needs a source string")
            if any(isinstance(x, bool) or not isinstance(x, int | float) for x in (*S, *T)):
                raise TpcostError(f"{where}: {name} msg_bytes and time_s hold numbers (not strings or booleans)")
            sizes = [finite_float(x, f"{where}: {name} msg_bytes", nonneg=True) for x in S]
            times = [finite_float(x, f"{where}: {name} time_s", nonneg=True) for x in T]
            if any(b <= a for a, b in zip(sizes, sizes[1:])) or sizes[0] <= 0 or min(times) <= 0:
                raise TpcostError(f"{where}: {name} needs sizes > 0 in increasing order and times > 0")
            out.setdefault(impl, {})[int(tpk[2:])] = MeasuredCurve(tuple(sizes), tuple(times), src)
    return out


def _flatten(tree: Mapping[str, Any], path: str, leaves: dict, prov: dict, notes: dict,  # noqa: C901
             where: str) -> None:  # (the schema walk: a branch per kind of TOML value, each a one-line error)
    if path == NOTES_TABLE:
        for k, v in tree.items():
            if not isinstance(v, str):
                raise TpcostError(f"{where}: [{NOTES_TABLE}] holds strings only; {NOTES_TABLE}.{k} is not one")
            notes[f"{path}.{k}"] = v
        return
    numeric = {k: v for k, v in tree.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if numeric:
        src, tier = tree.get("source"), tree.get("tier")
        if not isinstance(src, str) or not src.strip():
            raise TpcostError(f"{where}: table [{path}] has numbers but no `source` string")
        if tier not in TIERS:
            raise TpcostError(f"{where}: table [{path}] tier must be one of {', '.join(TIERS)}, got {tier!r}")
        unc = tree.get("uncertainty_rel", {})
        if not isinstance(unc, dict):
            raise TpcostError(f"{where}: [{path}.uncertainty_rel] must be a table")
        for k in unc:
            if k not in numeric:
                raise TpcostError(f"{where}: [{path}.uncertainty_rel] names {k!r}, which is not a number of [{path}]")
        for k, v in numeric.items():
            fv = finite_float(v, f"{where}: {path}.{k}", nonneg=True)
            u = unc.get(k)
            key = f"{path}.{k}" if path else k
            _check_key(key, fv, where)
            leaves[key] = fv
            prov[key] = Provenance(src, tier, None if u is None else check_uncertainty(key, u, where))
    for k, v in tree.items():
        key = f"{path}.{k}" if path else k
        if isinstance(v, dict):
            if k == "uncertainty_rel":
                continue
            _flatten(v, path if k.startswith("_") else key, leaves, prov, notes, where)
        elif isinstance(v, str) and k not in ("source", "tier"):
            _check_key(key, v, where)
            leaves[key] = v
        elif isinstance(v, bool) or isinstance(v, list):
            raise TpcostError(f"{where}: {key} has unsupported type {type(v).__name__}")


def _check_multicast_stated(leaves: Mapping[str, Any], where: str) -> None:
    """A profile with [fused_kernel] says whether its domain has NVLink multicast (never inferred from the table)."""
    if "interconnect.multicast" not in leaves and any(k.startswith("fused_kernel.") for k in leaves):
        raise TpcostError(f"{where}: [fused_kernel] models a kernel over NVLink multicast, and [interconnect] does "
                          "not say whether the domain has it: add multicast = 1 (or 0) to [interconnect]")


def profile_from_dict(tree: Mapping[str, Any], origin: str) -> HardwareProfile:
    """Validate a parsed TOML tree and build the typed profile; errors name the file and the key."""
    where = origin
    if tree.get("schema_version") != SCHEMA_VERSION:
        raise TpcostError(f"{where}: schema_version must be {SCHEMA_VERSION}, got {tree.get('schema_version')!r}")
    ident = tree.get("identity")
    if not isinstance(ident, dict) or not isinstance(ident.get("name"), str):
        raise TpcostError(f"{where}: missing [identity] table with a `name`")
    leaves: dict[str, Any] = {}
    prov: dict[str, Provenance] = {}
    notes: dict[str, str] = {}
    body = {k: v for k, v in tree.items() if k not in ("schema_version", MEASURED_TABLE)}
    if "vllm_dispatch" in body:
        raise TpcostError(f"{where}: {NO_DISPATCH_TABLE}")
    _flatten(body, "", leaves, prov, notes, where)
    measured = _measured(tree.get(MEASURED_TABLE, {}), where)
    _check_multicast_stated(leaves, where)
    for key, (value, source) in OPTIONAL_DEFAULTS.items():
        if key not in leaves:  # profiles written before the quantity existed keep loading, and say so
            leaves[key], prov[key] = value, Provenance(source, "assumed")
    for key, (value, source) in OPTIONAL_TABLE_DEFAULTS.items():
        table = key.rsplit(".", 1)[0] + "."
        if key not in leaves and any(k.startswith(table) for k in leaves):
            leaves[key], prov[key] = value, Provenance(source, "assumed")
    missing = [k for k in REQUIRED_PARAMS if k not in leaves]
    if missing:
        raise TpcostError(f"{where}: missing required quantity {missing[0]}" +
                          (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    kind = leaves.get("interconnect.kind")
    if kind not in INTERCONNECT_KINDS:
        raise TpcostError(f"{where}: interconnect.kind must be one of {', '.join(INTERCONNECT_KINDS)}, got {kind!r}")
    for c in REQUIRED_COLLECTIVES:
        if not any(k.startswith(f"collectives.{c}.tp") for k in leaves):
            raise TpcostError(f"{where}: missing [collectives.{c}.tpN] entries")
    check_params({k: leaves[k] for k in prov}, where)
    for impl, per in measured.items():
        for tp in per:
            if f"collectives.{impl}.tp{tp}.latency_s" not in leaves:
                raise TpcostError(f"{where}: [{MEASURED_TABLE}.{impl}.tp{tp}] has no fitted curve "
                                  f"[collectives.{impl}.tp{tp}] beside it (the model extends the points with it)")
    return _assemble(leaves, prov, notes, origin, measured=measured)


def builtin_profile_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("costmodel.profiles").iterdir() if p.name.endswith(".toml"))


@functools.lru_cache(maxsize=32)
def _builtin_profile(name: str) -> HardwareProfile:
    """A built-in profile, parsed once per process (profiles are immutable)."""
    tree = tomllib.loads(resources.files("costmodel.profiles").joinpath(f"{name}.toml").read_text())
    return profile_from_dict(tree, f"built-in:{name}")


def load_profile(name_or_path: str) -> HardwareProfile:
    """Load a built-in profile by name or a TOML file by path (read with tomllib; never eval/pickle)."""
    names = builtin_profile_names()
    if name_or_path in names:
        return _builtin_profile(name_or_path)
    path = Path(name_or_path)
    if not path.exists():
        match = match_builtin(name_or_path, names, "GPU profile")
        if match is not None:
            return _builtin_profile(match)
    if not path.suffix == ".toml" and not path.exists():
        raise TpcostError(f"unknown GPU profile {name_or_path!r}; built-in: {', '.join(names)} (or a path to a .toml)")
    text = read_text(path, "profile")
    origin = str(path)
    if _toml_depth(text) > MAX_TOML_DEPTH:
        raise TpcostError(f"{origin}: tables or arrays nested deeper than {MAX_TOML_DEPTH} levels")
    try:
        tree = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TpcostError(f"{origin}: malformed TOML: {e}") from None
    except RecursionError:
        raise TpcostError(f"{origin}: TOML nested too deeply") from None
    return profile_from_dict(tree, origin)


MAX_TOML_DEPTH = 32


def _toml_depth(text: str) -> int:
    """A cheap upper bound on TOML nesting: dotted table-header depth and inline bracket depth."""
    from .io import bracket_depth

    headers = [ln.count(".") + 1 for ln in text.splitlines() if ln.lstrip().startswith("[")]
    return max([bracket_depth(text, json_strings=False), *headers])


def dump_profile(tree: Mapping[str, Any]) -> str:
    """TOML text of a profile tree (tomli_w is imported here only: writing is not on the config path)."""
    import tomli_w

    return tomli_w.dumps(dict(tree), multiline_strings=False)


def parse_set(items: list[str]) -> dict[str, float]:
    """Parse --set QUANTITY=VALUE items (plain floats only; no eval)."""
    out = {}
    for item in items:
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise TpcostError(f"--set expects QUANTITY=VALUE, got {item!r}")
        if key.strip().startswith("vllm_dispatch."):
            raise TpcostError(f"--set {key.strip()}: {NO_DISPATCH_TABLE}")
        fv = finite_float(val, f"--set {key}")
        if key.strip() in out:
            raise TpcostError(f"--set {key.strip()} given twice")
        out[key.strip()] = fv
    return out


def match_profile(device_name: str, capability: str | None = None) -> str | None:
    """The built-in profile for a device: the first with one of its device_name_patterns in the name as a whole word
    (no letter or digit either side: "B200" is not in "NVIDIA GB200", nor "H20" in "NVIDIA H200"), else the one with
    the same compute capability ('major.minor'); None if neither matches. The one matching rule (the CLI, the vLLM
    plugin and calib's single-GPU check all use it)."""
    import re

    profiles = [load_profile(n) for n in builtin_profile_names()]
    for p in profiles:
        pats = [s for s in p.identity.device_name_patterns.split("|") if s]
        if any(re.search(rf"(?<![A-Za-z0-9]){re.escape(s)}(?![A-Za-z0-9])", device_name) for s in pats):
            return p.name
    for p in profiles:
        if capability and p.identity.compute_capability == capability:
            return p.name
    return None


def _env_profile() -> tuple[str, HardwareProfile] | None:
    """($TPCOST_PROFILE, its profile loaded) when the variable is set; errors name the variable."""
    import os

    env = os.environ.get("TPCOST_PROFILE")
    if not env:
        return None
    try:
        return env, load_profile(env)
    except TpcostError as e:
        raise TpcostError(f"TPCOST_PROFILE={env!r}: {e}") from None


def detect_profile() -> HardwareProfile:
    """`--gpu auto`, loaded once: $TPCOST_PROFILE (a built-in name or a .toml path), else the built-in profile
    matching the local GPU; one clear error without a GPU."""
    env = _env_profile()
    return env[1] if env else load_profile(detect_profile_name())


def detect_profile_name() -> str:
    """`--gpu auto` as a --gpu value: $TPCOST_PROFILE (checked), else the built-in profile matching the local
    GPU; one clear error without a GPU."""
    env = _env_profile()
    if env:
        return env[0]
    from .device import local_device

    name, cap = local_device()
    if name is None:
        raise TpcostError("--gpu auto: no GPU visible here; pass --gpu NAME or set TPCOST_PROFILE")
    found = match_profile(name, cap)
    if found is None:
        raise TpcostError(f"--gpu auto: no built-in profile for {name!r} (cc {cap}); run `tpcost calibrate` and set "
                          "TPCOST_PROFILE")
    return found


def profile_to_tree(profile: HardwareProfile, name: str | None = None) -> dict:
    """A TOML tree of `profile` as it stands (after any --set): every value with its own source and tier. Values of
    one table that share (source, tier, σ) stay together; the others go to `_`-prefixed sub-tables, which the loader
    folds back into the same keys (the schema at the top of this module); each is named after the values it holds
    (`[collectives.nccl_all_reduce.tp8._latency_s]`), so the file speaks the public schema, never a counter."""
    tree: dict = {"schema_version": SCHEMA_VERSION}

    def node(path):
        t = tree
        for part in path:
            t = t.setdefault(part, {})
        return t

    groups: dict = {}
    for key, val in profile.leaves().items():
        parent, leaf = key.rsplit(".", 1)
        prm = profile.provenance.get(key)
        if prm is None:  # a string field
            node(tuple(parent.split(".")))[leaf] = val
            continue
        unc = None if prm.uncertainty_rel is None else float(prm.uncertainty_rel)
        groups.setdefault(tuple(parent.split(".")), {}).setdefault((prm.source, prm.tier, unc), {})[leaf] = val
    for path, by_src in groups.items():
        for i, ((src, tier, unc), leaves) in enumerate(sorted(by_src.items(), key=lambda kv: -len(kv[1]))):
            t = node(path if i == 0 else path + ("_" + "_".join(sorted(leaves)),))
            t.update({k: float(v) for k, v in leaves.items()})
            t["source"], t["tier"] = src, tier
            if unc is not None:
                t["uncertainty_rel"] = {k: unc for k in leaves}
    for key, val in profile.notes.items():
        parent, leaf = key.rsplit(".", 1)
        node(tuple(parent.split(".")))[leaf] = val
    for impl, per in profile.measured.items():
        for tp, c in per.items():
            node((MEASURED_TABLE, impl, f"tp{tp}")).update(msg_bytes=list(c.msg_bytes), time_s=list(c.time_s),
                                                           source=c.source)
    if name is not None:
        node(("identity",))["name"] = name
    return tree
