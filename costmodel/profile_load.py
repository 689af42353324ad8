"""Profiles in and out: TOML tree to typed profile, built-ins, `--gpu auto`, and back (§17)."""
# Profiles in and out: a TOML tree checked into the typed profile (profile_from_dict), the
# built-ins, a file, the local GPU's (`--gpu auto`, TPCOST_PROFILE), and a profile back to its
# tree (docs/profiles.md).

from __future__ import annotations

import functools
import re
import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from .errors import TpcostError
from .formulas import bus_bw_factor
from .io import finite_float, match_builtin, read_text
from .network import load_network
from .profile_ranges import NO_DISPATCH_TABLE, check_params, check_uncertainty
from .profile_schema import (
    MEASURED_IMPLS,
    MEASURED_MAX_POINTS,
    MEASURED_TABLE,
    NOTES_TABLE,
    OPTIONAL_DEFAULTS,
    OPTIONAL_TABLE_DEFAULTS,
    REQUIRED_COLLECTIVES,
    REQUIRED_PARAMS,
    SCHEMA_VERSION,
    TIERS,
    INTERCONNECT_KINDS,
    HardwareProfile,
    MeasuredCurve,
    Provenance,
    _assemble,
    _check_key,
    _is_tp,
)


def _measured(tree: Any, where: str) -> dict[str, dict[int, MeasuredCurve]]:
    """The [measured.<impl>.tp<W>] tables of a profile tree, checked: one-line errors naming the
    table."""
    out: dict[str, dict[int, MeasuredCurve]] = {}
    if not isinstance(tree, dict):
        raise TpcostError(
            f"{where}: [{MEASURED_TABLE}] must be a table of [{MEASURED_TABLE}.<impl>.tp<W>] tables"
        )
    for impl, per in tree.items():
        if impl not in MEASURED_IMPLS or not isinstance(per, dict):
            raise TpcostError(
                f"{where}: [{MEASURED_TABLE}.{impl}]: a measured curve is one of "
                f"{', '.join(MEASURED_IMPLS)} (what nccl-tests measures)"
            )
        for tpk, t in per.items():
            name = f"[{MEASURED_TABLE}.{impl}.{tpk}]"
            if (
                not _is_tp(tpk)
                or not isinstance(t, dict)
                or set(t) != {"msg_bytes", "time_s", "source"}
            ):
                raise TpcostError(
                    f"{where}: {name} must be a tp<W> table of msg_bytes, time_s and source"
                )
            S, T, src = t["msg_bytes"], t["time_s"], t["source"]
            if not (
                isinstance(S, list)
                and isinstance(T, list)
                and 3 <= len(S) == len(T) <= MEASURED_MAX_POINTS
            ):
                raise TpcostError(
                    f"{where}: {name} msg_bytes and time_s must be arrays of the same length, 3 to "
                    f"{MEASURED_MAX_POINTS} points"
                )
            if not isinstance(src, str) or not src.strip():
                raise TpcostError(f"{where}: {name} needs a source string")
            if any(isinstance(x, bool) or not isinstance(x, int | float) for x in (*S, *T)):
                raise TpcostError(
                    f"{where}: {name} msg_bytes and time_s hold numbers (not strings or booleans)"
                )
            sizes = [finite_float(x, f"{where}: {name} msg_bytes", nonneg=True) for x in S]
            times = [finite_float(x, f"{where}: {name} time_s", nonneg=True) for x in T]
            if any(b <= a for a, b in zip(sizes, sizes[1:])) or sizes[0] <= 0 or min(times) <= 0:
                raise TpcostError(
                    f"{where}: {name} needs sizes > 0 in increasing order and times > 0"
                )
            out.setdefault(impl, {})[int(tpk[2:])] = MeasuredCurve(tuple(sizes), tuple(times), src)
    return out


def _flatten(  # noqa: C901
    tree: Mapping[str, Any],
    path: str,
    leaves: dict,
    prov: dict,
    notes: dict,
    where: str,
) -> None:  # (the schema walk: a branch per kind of TOML value, each a one-line error)
    if path == NOTES_TABLE:
        for k, v in tree.items():
            if not isinstance(v, str):
                raise TpcostError(
                    f"{where}: [{NOTES_TABLE}] holds strings only; {NOTES_TABLE}.{k} is not one"
                )
            notes[f"{path}.{k}"] = v
        return
    numeric = {
        k: v for k, v in tree.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    if numeric:
        src, tier = tree.get("source"), tree.get("tier")
        if not isinstance(src, str) or not src.strip():
            raise TpcostError(f"{where}: table [{path}] has numbers but no `source` string")
        if tier not in TIERS:
            raise TpcostError(
                f"{where}: table [{path}] tier must be one of {', '.join(TIERS)}, got {tier!r}"
            )
        unc = tree.get("uncertainty_rel", {})
        if not isinstance(unc, dict):
            raise TpcostError(f"{where}: [{path}.uncertainty_rel] must be a table")
        for k in unc:
            if k not in numeric:
                raise TpcostError(
                    f"{where}: [{path}.uncertainty_rel] names {k!r}, which is not a number of "
                    f"[{path}]"
                )
        for k, v in numeric.items():
            fv = finite_float(v, f"{where}: {path}.{k}", nonneg=True)
            u = unc.get(k)
            key = f"{path}.{k}" if path else k
            _check_key(key, fv, where)
            leaves[key] = fv
            prov[key] = Provenance(
                src, tier, None if u is None else check_uncertainty(key, u, where)
            )
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
    """A profile with [fused_kernel] says whether its domain has NVLink multicast (never inferred
    from the table)."""
    stated = "interconnect.multicast" in leaves
    has_ic = any(k.startswith("interconnect.") for k in leaves)  # none: refused as missing later
    if has_ic and not stated and any(k.startswith("fused_kernel.") for k in leaves):
        raise TpcostError(
            f"{where}: [fused_kernel] models a kernel over NVLink multicast, and [interconnect] "
            "does not say whether the domain has it: add multicast = 1 (or 0) to [interconnect]"
        )


def profile_from_dict(tree: Mapping[str, Any], origin: str) -> HardwareProfile:
    """Validate a parsed TOML tree and build the typed profile; errors name file and key (§17)."""
    where = origin
    if tree.get("schema_version") != SCHEMA_VERSION:
        raise TpcostError(
            f"{where}: schema_version must be {SCHEMA_VERSION}, got {tree.get('schema_version')!r}"
        )
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
    cc = leaves.get("identity.compute_capability", "")
    if cc and not re.fullmatch(r"\d{1,3}\.\d{1,3}", cc):
        raise TpcostError(
            f"{where}: identity.compute_capability must be 'major.minor' as torch reports it "
            f"(e.g. '9.0', '10.0'; empty where there is none), got {cc!r}"
        )
    for key, (value, source) in OPTIONAL_DEFAULTS.items():
        # profiles written before the quantity existed keep loading, and say so
        if key not in leaves:
            leaves[key], prov[key] = value, Provenance(source, "assumed")
    for key, (value, source) in OPTIONAL_TABLE_DEFAULTS.items():
        table = key.rsplit(".", 1)[0] + "."
        if key not in leaves and any(k.startswith(table) for k in leaves):
            leaves[key], prov[key] = value, Provenance(source, "assumed")
    missing = [k for k in REQUIRED_PARAMS if k not in leaves]
    if missing:
        raise TpcostError(
            f"{where}: missing required quantity {missing[0]}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    kind = leaves.get("interconnect.kind")
    if kind not in INTERCONNECT_KINDS:
        raise TpcostError(
            f"{where}: interconnect.kind must be one of {', '.join(INTERCONNECT_KINDS)}, got "
            f"{kind!r}"
        )
    for c in REQUIRED_COLLECTIVES:
        if not any(k.startswith(f"collectives.{c}.tp") for k in leaves):
            raise TpcostError(f"{where}: missing [collectives.{c}.tpN] entries")
    check_params({k: leaves[k] for k in prov}, where)
    _check_measured_and_network(measured, leaves, where)
    return _assemble(leaves, prov, notes, origin, measured=measured)


def _check_measured_and_network(measured: dict, leaves: Mapping[str, Any], where: str) -> None:
    """Each measured curve has its fitted curve and beats no link; the named network exists."""
    link_bw = leaves["interconnect.link_bw_bytes_per_s"]
    for impl, per in measured.items():
        for tp, curve in per.items():
            if f"collectives.{impl}.tp{tp}.latency_s" not in leaves:
                raise TpcostError(
                    f"{where}: [{MEASURED_TABLE}.{impl}.tp{tp}] has no fitted curve "
                    f"[collectives.{impl}.tp{tp}] beside it (the model extends the points with it)"
                )
            _check_measured_physics(impl, tp, curve, link_bw, where)
    # the network it names exists and reads (costmodel.network)
    if leaves.get("interconnect.network"):
        try:
            load_network(leaves["interconnect.network"])
        except TpcostError as e:
            raise TpcostError(f"{where}: interconnect.network: {e}") from None


MEASURED_MAX_TIME_S = 100.0  # no collective of an nccl-tests sweep runs for minutes
# busBW a measured point may show over the link's line rate: an in-switch (NVLS) all-reduce moves S
# each way per GPU, 2(W-1)/W·S on the bus (docs/profiles.md, nccl-tests section)
_LINE_RATE_SLACK = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0}


def _check_measured_physics(impl: str, tp: int, curve: MeasuredCurve, link_bw: float, where: str):
    """No measured point beats the link at line rate or runs for minutes (one line, naming it)."""
    coll = impl.removeprefix("nccl_")
    name = f"[{MEASURED_TABLE}.{impl}.tp{tp}]"
    for size, t in zip(curve.msg_bytes, curve.time_s):
        if t > MEASURED_MAX_TIME_S:
            raise TpcostError(
                f"{where}: {name} time_s {t:g} s at {size:g} bytes: no collective of a sweep runs "
                f"over {MEASURED_MAX_TIME_S:g} s (values are SI: seconds)"
            )
        bus = float(bus_bw_factor(coll, tp)) * size / t
        if tp > 1 and bus > _LINE_RATE_SLACK[coll] * link_bw * 1.05:
            raise TpcostError(
                f"{where}: {name} {size:g} bytes in {t:g} s is {bus / 1e9:.4g} GB/s of bus "
                f"bandwidth, beyond the link's {link_bw / 1e9:.4g} GB/s line rate"
                + (" (x2 for an in-switch all-reduce)" if coll == "all_reduce" else "")
                + ": no transfer beats its link (values are SI: bytes and seconds)"
            )


def builtin_profile_names() -> list[str]:
    return sorted(
        p.name[:-5]
        for p in resources.files("costmodel.profiles").iterdir()
        if p.name.endswith(".toml")
    )


@functools.lru_cache(maxsize=32)
def _builtin_profile(name: str) -> HardwareProfile:
    """A built-in profile, parsed once per process (profiles are immutable)."""
    tree = tomllib.loads(resources.files("costmodel.profiles").joinpath(f"{name}.toml").read_text())
    return profile_from_dict(tree, f"built-in:{name}")


def load_profile(name_or_path: str) -> HardwareProfile:
    """Load a built-in profile by name or a TOML file by path (tomllib; never eval; §17)."""
    names = builtin_profile_names()
    if name_or_path in names:
        return _builtin_profile(name_or_path)
    path = Path(name_or_path)
    if not path.exists():
        match = match_builtin(name_or_path, names, "GPU profile")
        if match is not None:
            return _builtin_profile(match)
    if not path.suffix == ".toml" and not path.exists():
        raise TpcostError(
            f"unknown GPU profile {name_or_path!r}; built-in: {', '.join(names)} (or a path to a "
            ".toml)"
        )
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
    """TOML text of a profile tree (§17)."""
    # tomli_w is imported here only: writing is not on the config path.
    import tomli_w

    return tomli_w.dumps(dict(tree), multiline_strings=False)


def match_profile(device_name: str, capability: str | None = None) -> str | None:
    """The built-in profile for a device name and capability, None if none matches (§17)."""
    # the first with one of its device_name_patterns in the name as a whole word (no letter or digit
    # either side: "B200" is not in "NVIDIA GB200", nor "H20" in "NVIDIA H200"), else the one with
    # the same compute capability ('major.minor'); None if neither matches. The one matching rule
    # (the CLI, the vLLM plugin and calib's single-GPU check all use it).
    import re

    profiles = [load_profile(n) for n in builtin_profile_names()]
    for p in profiles:
        pats = [s for s in p.identity.device_name_patterns.split("|") if s]
        if any(
            re.search(rf"(?<![A-Za-z0-9]){re.escape(s)}(?![A-Za-z0-9])", device_name) for s in pats
        ):
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
    """`--gpu auto`, loaded once: $TPCOST_PROFILE, else the local GPU's profile (§17)."""
    # $TPCOST_PROFILE: a built-in name or a .toml path; one clear error without a GPU.
    env = _env_profile()
    return env[1] if env else load_profile(detect_profile_name())


def detect_profile_name() -> str:
    """`--gpu auto` as a --gpu value: $TPCOST_PROFILE (checked), else the local GPU's (§17)."""
    # One clear error without a GPU.
    env = _env_profile()
    if env:
        return env[0]
    from .device import local_device

    name, cap = local_device()
    if name is None:
        raise TpcostError("--gpu auto: no GPU visible here; pass --gpu NAME or set TPCOST_PROFILE")
    found = match_profile(name, cap)
    if found is None:
        raise TpcostError(
            f"--gpu auto: no built-in profile for {name!r} (cc {cap}); run `tpcost calibrate` and "
            "set "
            "TPCOST_PROFILE"
        )
    return found


def profile_to_tree(profile: HardwareProfile, name: str | None = None) -> dict:
    """A TOML tree of `profile` as it stands (after any --set), with provenance (§17)."""
    # every value with its own source and tier. Values of one table that share (source, tier, σ)
    # stay together; the others go to `_`-prefixed sub-tables, which the loader folds back into the
    # same keys (the schema at the top of this module); each is named after the values it holds
    # (`[collectives.nccl_all_reduce.tp8._latency_s]`), so the file speaks the public schema, never
    # a counter.
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
        groups.setdefault(tuple(parent.split(".")), {}).setdefault((prm.source, prm.tier, unc), {})[
            leaf
        ] = val
    for path, by_src in groups.items():
        for i, ((src, tier, unc), leaves) in enumerate(
            sorted(by_src.items(), key=lambda kv: -len(kv[1]))
        ):
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
            node((MEASURED_TABLE, impl, f"tp{tp}")).update(
                msg_bytes=list(c.msg_bytes), time_s=list(c.time_s), source=c.source
            )
    if name is not None:
        node(("identity",))["name"] = name
    return tree
