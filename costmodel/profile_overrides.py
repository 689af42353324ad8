"""What-ifs on a profile: --set and the recording copy of one model call (§17)."""
# What-ifs on a profile: --set (parse_set, with_overrides: the link carries its dependants) and
# the recording copy that says which keys one model call read, so a key with no effect is refused
# (docs/profiles.md).

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .errors import TpcostError
from .io import finite_float
from .profile_ranges import NO_DISPATCH_TABLE, check_params
from .profile_schema import _SECTIONS, _OPTIONAL_TABLES, MEASURED_TABLE, HardwareProfile, Provenance


DERIVED_FROM_LINK = "--set on interconnect.* (derived: rides on the link)"


class _Recorder:
    """Stands in for one section of a profile and records the dotted keys read through it."""

    __slots__ = ("_obj", "_path", "_reads")

    def __init__(self, obj, path: str, reads: tuple[set, ...]):
        # reads: one set per recording that wraps it
        self._obj, self._path, self._reads = (
            obj,
            path,
            reads,
        )

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
    """(a copy of `profile` that records reads, the set it records into), for one query (§17)."""
    # What the model reads for one query is how --set finds keys with no effect. The copy is for
    # that one prediction only.
    reads: set[str] = set()

    def rec(obj, path) -> Any:  # a _Recorder stands in for the section it wraps (duck-typed)
        if isinstance(obj, _Recorder):  # a recording of a recording: each records every read
            return _Recorder(obj._obj, path, (*obj._reads, reads))
        return _Recorder(obj, path, (reads,))

    traced = dataclasses.replace(
        profile,
        **{
            s: rec(getattr(profile, s), s)
            for s in _SECTIONS + tuple(_OPTIONAL_TABLES)
            if getattr(profile, s) is not None
        },
        collectives={
            impl: {tp: rec(c, f"collectives.{impl}.tp{tp}") for tp, c in per.items()}
            for impl, per in profile.collectives.items()
        },
    )
    return traced, reads


def with_overrides(
    profile: HardwareProfile, values: Mapping[str, float], source: str = "--set by user"
) -> HardwareProfile:
    """--set: plain replacement, but the link carries its dependants along (§17)."""
    # --set semantics: plain replacement, except that the link itself carries its dependants along.
    # `interconnect.link_bw_bytes_per_s` scales every collective's bus bandwidth and the copy-engine
    # pull bandwidth by new/old; `interconnect.latency_s` shifts every collective latency and the
    # pull latency by new − old (floored at 0). A dependant also given explicitly keeps the explicit
    # value.
    for k in values:  # an unknown key is named as such, before any range is looked up for it
        if k.startswith(f"{MEASURED_TABLE}."):
            raise TpcostError(
                f"--set {k}: measured points are a calibration's log, not a quantity; a --set on "
                f"[collectives.{'.'.join(k.split('.')[1:3])}] is the what-if on them (it drops "
                "them)"
            )
        if k not in profile.provenance and not k.startswith("vllm_dispatch."):
            raise TpcostError(
                f"--set: unknown quantity {k!r} for profile {profile.name!r} "
                f"(see `tpcost profiles --keys {profile.name}`)"
            )
    # the keys as typed first: an error names what the user wrote, not a dependant
    check_params(values, source)
    derived: dict[str, Any] = {}
    current = profile.values()
    if "interconnect.link_bw_bytes_per_s" in values:
        old = profile.interconnect.link_bw_bytes_per_s
        ratio = values["interconnect.link_bw_bytes_per_s"] / old if old else 1.0
        for k, v in current.items():
            if (
                k.startswith("collectives.") and k.endswith(".bus_bw_bytes_per_s")
            ) or k == "asynctp.copy_engine_bw_bytes_per_s":
                derived[k] = v * ratio
    if "interconnect.latency_s" in values:
        delta = values["interconnect.latency_s"] - profile.interconnect.latency_s
        for k, v in current.items():
            if (
                k.startswith("collectives.") and k.endswith(".latency_s")
            ) or k == "asynctp.copy_latency_s":
                derived[k] = max(0.0, v + delta)
    derived = {k: v for k, v in derived.items() if k not in values}
    # a what-if on a measured collective (or on the link it rides) replaces the measurement: its
    # points go
    link = any(k.startswith("interconnect.") and k != "interconnect.multicast" for k in values)
    drop = tuple(
        f"measured.{impl}.tp{tp}"
        for impl, per in profile.measured.items()
        for tp in per
        if link or any(k.startswith(f"collectives.{impl}.tp{tp}.") for k in values)
    )
    return profile.with_values(
        derived, Provenance(DERIVED_FROM_LINK, "assumed"), drop=drop
    ).with_values(values, Provenance(source, "assumed"))


def parse_set(items: list[str]) -> dict[str, float]:
    """Parse --set QUANTITY=VALUE items (plain floats only; no eval; §17)."""
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
