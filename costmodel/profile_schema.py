"""The profile schema: versioned TOML into frozen typed dataclasses (docs/model.md §17)."""
# The profile schema: versioned TOML, parsed once into frozen typed dataclasses; every number
# keeps its source and tier.
#
# Schema (version 1). A profile is a tree of TOML tables, one per dataclass below (`[gemm]` is
# `Gemm`, `[collectives.<impl>.tp<W>]` a `Collective`). A profile holds hardware only: vLLM's
# dispatch limits are code of vLLM's, derived per version by costmodel.vllm_tables.dispatch. Every
# table that holds numeric leaves also holds `source` (URL, `../shared/reference` source_id, or
# calibration provenance) and `tier` (one of TIERS); the numeric leaves of that table share them.
# A sub-table whose name starts with `_` only groups values that share a source: its leaves belong
# to the parent table (`[gemm._tile] tile_m = 128` is `gemm.tile_m`). An optional sub-table
# `uncertainty_rel` gives a fitted relative 1-sigma per leaf. String leaves (`kind`, `vendor`,
# ...) are typed fields without provenance; the `[calibration]` table holds free strings (what a
# calibration run measured and kept). An optional `[measured.<impl>.tp<W>]` table holds the points
# of one measured NCCL collective (`msg_bytes`, `time_s`: arrays, sizes increasing; `source`):
# between them the model interpolates the measurement (MeasuredCurve). Keys are dotted paths:
# `collectives.nccl_all_reduce.tp4.latency_s` names
# `profile.collectives["nccl_all_reduce"][4].latency_s`. A key the schema does not have is an
# error.
#
# The model reads the typed fields only. `HardwareProfile.with_values` is the one way to make a
# new profile from another (--set, the Monte Carlo band, calibration); `provenance` maps every
# dotted numeric key to its Provenance. See docs/model.md for each quantity.

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .errors import TpcostError
from .profile_ranges import NO_DISPATCH_TABLE, check_params, check_uncertainty


SCHEMA_VERSION = 1


TIERS = ("assumed", "datasheet", "published-measurement", "calibrated")


# Relative 1-sigma of a parameter by provenance tier, used by the cutoff band (docs/model.md §9).
SIGMA_REL_BY_TIER = {
    "assumed": 0.30,
    "datasheet": 0.15,
    "published-measurement": 0.10,
    "calibrated": 0.05,
}


# Tables whose values are shapes or counts: never perturbed.
UNPERTURBED_PREFIXES = (
    "identity.",
    "gemm.tile_",
    "interconnect.domain_size",
    "interconnect.domain_hosts",
    "interconnect.multicast",
)


Num = Any  # a float, or an array of Monte Carlo draws of shape (D, 1) (the cutoff band)


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Where one numeric value came from (§17)."""

    source: str  # URL, ../shared/reference source_id, or calibration run
    tier: str  # one of TIERS
    uncertainty_rel: float | None = None  # fitted relative 1-sigma, where a fit gave one

    @property
    def sigma_rel(self) -> float:
        """The fit's own relative sigma where recorded, else the tier's (§17)."""
        # Recorded for calibrated or fitted values.
        if self.uncertainty_rel is not None and self.tier in (
            "calibrated",
            "published-measurement",
        ):
            return float(self.uncertainty_rel)
        return SIGMA_REL_BY_TIER[self.tier]


@dataclasses.dataclass(frozen=True)
class Identity:
    """[identity]: which part this is (docs/model.md §1)."""

    name: str  # the profile's name
    # streaming multiprocessors / compute units (count): the GEMM work is spread over them (§2)
    sm_count: Num
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
    """[compute] (§2)."""

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
    # hosts one domain spans (count): an NVL72's 18 trays; 1 where the domain is one host
    domain_hosts: Num = 1
    # the network between domains: a built-in network's name or a network file (costmodel.network)
    network: str = ""
    # 1: the domain's GPUs share an NVLink multicast (NVLS) address space; 0: they do not
    multicast: Num = 0

    def gpus_per_host(self) -> int:
        """GPUs on one host: the domain's share of each of its hosts (§11.5)."""
        return max(1, int(self.domain_size) // max(1, int(self.domain_hosts)))


@dataclasses.dataclass(frozen=True)
class Collective:
    """[collectives.<impl>.tp<W>]: one implementation at W ranks, t = α + factor·S/busBW (§4)."""

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
    # measured / modelled time of a fused op: 1, its σ the model's out-of-sample error (§9)
    time_scale: Num = 1.0
    # share of GEMM+RS's pulls that a step's barrier leaves exposed, in [0, 1] (§6)
    rs_step_exposure: Num = 0.0


@dataclasses.dataclass(frozen=True)
class FusedKernel:
    """[fused_kernel]: the single-kernel fused GEMM+RS/AR's terms on this hardware (§6b)."""

    # [fused_kernel]: a persistent single-kernel fused GEMM + reduce-scatter / all-reduce over an
    # NVLS multicast workspace (vLLM's CuTe `gemm_rs_ar`; docs/model.md §6b), on this hardware.
    # Optional: only profiles whose hardware has NVLink multicast carry the table. Hardware terms:
    # link_efficiency, multicast_latency_s; the kernel's own: the rest (its tiles and bytes in
    # flight are code: costmodel/ops.py).

    fixed_s: Num  # per call: launch, workspace flags and the exit barrier (s)
    # GEMM+AR's extra per call: the system-scope release that flushes its multimem stores (s)
    ar_fence_s: Num
    compute_overhead: (
        Num  # φ: GEMM time lost to the communicating warps and to contention (relative), in [0, 10]
    )
    link_efficiency: (
        Num  # η: achieved / peak unidirectional link bandwidth of multimem traffic, in (0, 1]
    )
    multicast_latency_s: Num  # λ: round trip of one multimem.ld_reduce through the switch (s)
    exposed_fraction: (
        Num  # α: share of the wave overlap the design gives up (0 pipelined, 1 serial), in [0, 1]
    )
    inflight_scale: (
        Num  # bytes a CTA keeps in flight over one RS tile's ld_reduce (vLLM's design: 1)
    )
    # measured / modelled time of the kernel: 1, its σ the model's out-of-sample error (§9)
    time_scale: Num = 1.0


# [measured.<impl>.tp<W>]: the points of a measured collective (MeasuredCurve)
MEASURED_TABLE = "measured"


# what a log measures (nccl-tests)
MEASURED_IMPLS = (
    "nccl_all_reduce",
    "nccl_all_gather",
    "nccl_reduce_scatter",
)


MEASURED_MAX_POINTS = 4096


@dataclasses.dataclass(frozen=True)
class MeasuredCurve:
    """[measured.<impl>.tp<W>]: one collective as a calibration measured it, point by point (§4)."""

    # nccl-tests' sizes and times. The model interpolates between the points (log-log), follows the
    # fitted curve's growth above the largest, and uses the fitted curve below the smallest
    # (ops.measured_or_fitted; docs/profiles.md).

    msg_bytes: tuple[float, ...]  # increasing message sizes (bytes, nccl-tests' size column)
    time_s: tuple[float, ...]  # the measured time at each (s)
    source: str

    @classmethod
    def from_points(cls, points, source: str) -> MeasuredCurve:
        """The curve of (size bytes, time s) pairs in any order, sizes increasing (§4)."""
        # One time per size: a size timed twice keeps the faster.
        best: dict[float, float] = {}
        for size, t in points:
            best[float(size)] = min(float(t), best.get(float(size), float(t)))
        sizes = sorted(best)
        return cls(tuple(sizes), tuple(best[x] for x in sizes), source)


NOTES_TABLE = "calibration"  # free string leaves


@functools.cache
def _field_kinds(cls) -> dict[str, tuple[bool, bool]]:
    """field name -> (is a string, is required) of one schema dataclass."""
    return {
        f.name: (f.type.startswith("str"), f.default is dataclasses.MISSING)
        for f in dataclasses.fields(cls)
    }


def _table_class(parent: str):
    """The dataclass of the table at dotted path `parent`, or None where the schema has no such
    table."""
    cls = _TABLES.get(parent) or _OPTIONAL_TABLES.get(parent)
    if cls is not None:
        return cls
    parts = parent.split(".")
    if len(parts) == 3 and parts[0] == "collectives" and _is_tp(parts[2]):
        return Collective
    return None


def _is_tp(s: str) -> bool:
    return s.startswith("tp") and s[2:].isdigit() and int(s[2:]) >= 1


# Quantities added after schema 1 was first written: a profile without them gets this value (tier
# assumed).
OPTIONAL_DEFAULTS = {
    "asynctp.host_op_s": (
        3e-6,
        "default (not in this profile): one eager torch call ~3 us on a server CPU, the "
        "built-in profiles' assumption (docs/model.md §6)",
    ),
    "asynctp.rs_step_exposure": (
        0.0,
        "default (not in this profile): every pull of torch's GEMM+RS hides behind a "
        "chunk GEMM (docs/model.md §6)",
    ),
    "interconnect.domain_hosts": (
        1,
        "default (not in this profile): the NVLink domain is one host",
    ),
    "interconnect.multicast": (
        0,
        "default (not in this profile): no NVLink multicast (NVLS) in the domain",
    ),
    "asynctp.time_scale": (
        1.0,
        "default (not in this profile): the fused ops as modelled; the tier's σ stands for "
        "the model's error (the built-in profiles carry the calibrated one, calib/band.py)",
    ),
}


# The same for a quantity of an optional table: given where the table is present.
OPTIONAL_TABLE_DEFAULTS = {
    "fused_kernel.time_scale": (
        1.0,
        "default (not in this profile): the kernel as modelled; the tier's σ stands for "
        "the model's error (the built-in profiles carry the calibrated one, calib/band.py)",
    ),
}


# quantities a later schema replaced, with what replaced them (a profile that holds one is refused,
# saying so)
_NETWORK_NOW = (
    "replaced by interconnect.network, a network file's name or path (NICs per GPU, line rate, "
    "RDMA "
    "efficiency and latency, each with its source: costmodel/networks, docs/profiles.md)"
)


REPLACED_KEYS = {
    "interconnect.internode_bw_bytes_per_s": _NETWORK_NOW,
    "interconnect.internode_latency_s": _NETWORK_NOW,
}


REQUIRED_COLLECTIVES = ("nccl_all_gather", "nccl_reduce_scatter", "nccl_all_reduce")


INTERCONNECT_KINDS = ("nvswitch", "nvlink-mesh", "pcie", "xgmi", "host")


USER_SET = Provenance("--set by user", "assumed")


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class HardwareProfile:
    """A GPU (or CPU host) described as typed data (§17)."""

    # Built only by profile_from_dict (a TOML tree) and with_values (a new profile from this one);
    # the model reads the section fields.

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
    # single-kernel fused GEMM+collective, where the hardware has it
    fused_kernel: FusedKernel | None = None
    # impl -> TP size -> a calibration's measured points
    measured: Mapping[str, Mapping[int, MeasuredCurve]] = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )

    def __repr__(self) -> str:
        return (
            f"HardwareProfile({self.name!r}, origin={self.origin!r}, {len(self.provenance)} "
            "quantities)"
        )

    @property
    def name(self) -> str:
        return self.identity.name

    @property
    def kind(self) -> str:
        return self.interconnect.kind

    def leaves(self) -> Mapping[str, Any]:
        """Every field as dotted key -> value, numbers and strings, in schema order (§17)."""
        # None fields left out.
        return self._leaves

    @functools.cached_property
    def _leaves(self) -> Mapping[str, Any]:
        out: dict[str, Any] = {}

        def walk(obj, prefix):
            # a recording copy's section (profile_overrides): its values, unrecorded
            obj = getattr(obj, "_obj", obj)
            for f in dataclasses.fields(obj):
                v = getattr(obj, f.name)
                if dataclasses.is_dataclass(getattr(v, "_obj", v)):
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
        """Every numeric quantity as dotted key -> value (the --set vocabulary; §17)."""
        return {k: v for k, v in self._leaves.items() if k in self.provenance}

    def value(self, key: str) -> Any:
        """The value of numeric quantity `key` (dotted), for --set, the band and reports (§17)."""
        # The model reads fields.
        if key not in self.provenance:
            raise TpcostError(f"profile {self.name!r} has no quantity {key!r}")
        return self._leaves[key]

    def collective(self, impl: str, tp: int) -> tuple[Any, Any]:
        """(latency_s, bus_bw_bytes_per_s) of collective `impl` at TP size `tp` (§4)."""
        # the entry for `tp` if present, else the nearest listed TP size (larger preferred), through
        # formulas.collective_beyond_domain beyond the interconnect domain (the profile's network:
        # its NICs at their RDMA efficiency, one RDMA hop).
        from .formulas import collective_beyond_domain

        c = self.collectives[impl][self.collective_entry_tp(impl, tp)]
        ic = self.interconnect
        if tp <= ic.domain_size:
            return c.latency_s, c.bus_bw_bytes_per_s
        net = self.network()
        return collective_beyond_domain(
            c.latency_s,
            c.bus_bw_bytes_per_s,
            net.line_rate_per_gpu_bytes_per_s * net.rdma_efficiency,
            net.rdma_latency_s,
        )

    def with_network(self, name_or_path: str) -> HardwareProfile:
        """This profile with another network between its domains, checked now (§11.5)."""
        # A built-in name or a network file.
        from .network import load_network

        load_network(name_or_path)
        return dataclasses.replace(
            self, interconnect=dataclasses.replace(self.interconnect, network=name_or_path)
        )

    def network(self):
        """The Network between this GPU's domains, or one line saying there is none (§11.5)."""
        # interconnect.network.
        from .network import load_network

        name = self.interconnect.network
        if not name:
            raise TpcostError(
                f"profile {self.name!r} names no network between its NVLink domains "
                "(interconnect.network): give --network NAME|FILE, or set it in the profile"
            )
        return load_network(name)

    def collective_entry_tp(self, impl: str, tp: int) -> int:
        """The TP size whose `collectives.<impl>` entry serves `tp` (§4)."""
        # tp itself, else the nearest (larger preferred).
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
        """Lowest provenance tier among the parameters the model uses (the weakest link; §17)."""
        used = [
            p.tier for k, p in self.provenance.items() if not k.startswith(UNPERTURBED_PREFIXES)
        ]
        return min(used, key=TIERS.index) if used else "assumed"

    def tier_counts(self) -> dict[str, int]:
        counts = {t: 0 for t in TIERS}
        for p in self.provenance.values():
            counts[p.tier] += 1
        return counts

    def sources(self) -> list[str]:
        return sorted({p.source for p in self.provenance.values()})

    def with_values(
        self,
        values: Mapping[str, Any],
        provenance: Provenance | Mapping[str, Provenance] | None = USER_SET,
        *,
        mark_modified: bool = True,
        new_keys_ok: bool = False,
        name: str | None = None,
        notes: Mapping[str, str] | None = None,
        drop: tuple[str, ...] = (),
        measured: Mapping[str, Mapping[int, MeasuredCurve]] | None = None,
    ) -> HardwareProfile:
        """A new profile with some values replaced: for --set, the band and calibration (§17)."""
        # the one way --set, the Monte Carlo band and calibration make one. `provenance`: of every
        # new value (one Provenance), per key (a mapping), or None to keep each key's own (the
        # band's draws). `mark_modified` records the keys as --set. `new_keys_ok` lets calibration
        # add a schema key the profile lacks (a collective at a new TP size). Plain numbers are
        # range-checked (check_params) every time; draws are checked where they are made. `drop`:
        # tables (dotted prefixes) removed first, values and provenance (calibration: NCCL regime
        # curves the run's own curve replaces; --set: the measured points it replaces). `measured`:
        # measured curves added or replaced (calibration from nccl-tests).
        gone = tuple(d + "." for d in drop)
        leaves = {k: v for k, v in self._leaves.items() if not k.startswith(gone)}
        prov = {k: v for k, v in self.provenance.items() if not k.startswith(gone)}
        for k, v in values.items():
            if k not in prov:
                if not new_keys_ok:
                    raise TpcostError(
                        f"--set: unknown quantity {k!r} for profile {self.name!r} "
                        f"(see `tpcost profiles --keys {self.name}`)"
                    )
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
        modified = (
            self.modified + tuple(k for k in values if k not in self.modified)
            if mark_modified
            else self.modified
        )
        kept = {
            impl: {tp: c for tp, c in per.items() if f"measured.{impl}.tp{tp}." not in gone}
            for impl, per in self.measured.items()
        }
        for impl, per in (measured or {}).items():
            kept.setdefault(impl, {}).update(per)
        return _assemble(
            leaves,
            prov,
            {**self.notes, **(notes or {})},
            self.origin,
            modified,
            {impl: per for impl, per in kept.items() if per},
        )


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The resolved field types of one schema dataclass."""
    return typing.get_type_hints(cls)


def _schema_tables(
    profile_cls: Any = None,
) -> tuple[tuple[str, ...], dict[str, Any], dict[str, Any]]:
    """(the sections, every fixed table by dotted path, the optional ones), read from
    HardwareProfile's typed fields:
    a section is a field whose type is a schema dataclass (`X | None`: optional, all its fields or
    none), and a dataclass-typed field inside one is a sub-table (`compute.peak_flops_per_s`).
    Adding a table is one field there and its dataclass; collectives.<impl>.tp<W> are the patterned
    tables (Collective)."""

    def tables(cls: Any, path: str, out: dict[str, Any]) -> None:
        hints = _hints(cls)
        subs = [f.name for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name])]
        if len(subs) < len(dataclasses.fields(cls)):
            out[path] = cls
        for name in subs:
            tables(hints[name], f"{path}.{name}", out)

    sections: list[str] = []
    fixed: dict[str, Any] = {}
    optional: dict[str, Any] = {}
    for name, hint in _hints(profile_cls or HardwareProfile).items():
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if dataclasses.is_dataclass(hint):
            sections.append(name)
            tables(hint, name, fixed)
        elif (
            len(args) == 1
            and dataclasses.is_dataclass(args[0])
            and type(None) in typing.get_args(hint)
        ):
            tables(args[0], name, optional)
    return tuple(sections), fixed, optional


_SECTIONS, _TABLES, _OPTIONAL_TABLES = _schema_tables()
REQUIRED_PARAMS = tuple(
    f"{path}.{name}"
    for path, cls in _TABLES.items()
    for name, (is_str, req) in _field_kinds(cls).items()
    if req and not is_str
)


def _assemble(
    leaves: Mapping[str, Any],
    provenance: Mapping[str, Provenance],
    notes: Mapping[str, str],
    origin: str,
    modified: tuple[str, ...] = (),
    measured: Mapping[str, Mapping[int, MeasuredCurve]] | None = None,
) -> HardwareProfile:
    """The typed profile of dotted leaves that passed the schema checks (the one constructor)."""

    def build(cls, prefix):
        hints = _hints(cls)
        return cls(
            **{
                f.name: build(hints[f.name], key)
                if dataclasses.is_dataclass(hints[f.name])
                else leaves[key]
                for f in dataclasses.fields(cls)
                if (key := f"{prefix}.{f.name}") in leaves
                or dataclasses.is_dataclass(hints[f.name])
            }
        )

    colls: dict[str, set[int]] = {}
    for key in leaves:
        if key.startswith("collectives."):
            parts = key.split(".")
            colls.setdefault(parts[1], set()).add(int(parts[2][2:]))
    optional: dict[str, Any] = {}
    for sec, cls in _OPTIONAL_TABLES.items():
        have = [f for f in _field_kinds(cls) if f"{sec}.{f}" in leaves]
        need = [f for f, (_, req) in _field_kinds(cls).items() if req]
        if have and not all(f"{sec}.{f}" in leaves for f in need):
            raise TpcostError(f"{origin}: [{sec}] needs all of {', '.join(need)} (or none)")
        optional[sec] = build(cls, sec) if have else None
    try:
        collectives = {
            impl: MappingProxyType(
                {tp: build(Collective, f"collectives.{impl}.tp{tp}") for tp in sorted(tps)}
            )
            for impl, tps in colls.items()
        }
    except TypeError:
        bad = next(
            f"collectives.{i}.tp{t}"
            for i, tps in colls.items()
            for t in tps
            if not all(
                f"collectives.{i}.tp{t}.{f}" in leaves for f in ("latency_s", "bus_bw_bytes_per_s")
            )
        )
        raise TpcostError(
            f"{origin}: [{bad}] needs both latency_s and bus_bw_bytes_per_s"
        ) from None
    hints = _hints(HardwareProfile)
    sections: dict[str, Any] = {sec: build(hints[sec], sec) for sec in _SECTIONS}
    return HardwareProfile(
        origin=origin,
        **sections,
        collectives=MappingProxyType(collectives),
        provenance=MappingProxyType(dict(provenance)),
        notes=MappingProxyType(dict(notes)),
        modified=modified,
        measured=MappingProxyType(
            {i: MappingProxyType(dict(per)) for i, per in (measured or {}).items()}
        ),
        **optional,
    )


def _check_key(key: str, value: Any, where: str) -> None:
    """`key` names a field of the schema, and `value` has that field's type (number or string)."""
    parent, _, leaf = key.rpartition(".")
    cls = _table_class(parent)
    if key.startswith("vllm_dispatch."):
        raise TpcostError(f"{where}: {key}: {NO_DISPATCH_TABLE}")
    if cls is None:
        raise TpcostError(
            f"{where}: [{parent or key}] is not a table of the profile schema "
            f"(version {SCHEMA_VERSION}; see the fields in costmodel/profile_schema.py)"
        )
    kinds = _field_kinds(cls)
    if key in REPLACED_KEYS:
        raise TpcostError(f"{where}: {key}: {REPLACED_KEYS[key]}")
    if leaf not in kinds:
        raise TpcostError(
            f"{where}: {key} is not a quantity of the schema ([{parent}] has: {', '.join(kinds)})"
        )
    if kinds[leaf][0] != isinstance(value, str):
        raise TpcostError(
            f"{where}: {key} must be a {'string' if kinds[leaf][0] else 'number'}, got {value!r}"
        )
