"""Hardware profiles: versioned TOML, every numeric value with its source and provenance tier.

Schema (version 1). A profile is a tree of TOML tables. Every table that holds numeric leaves
also holds `source` (URL, `../shared/reference` source_id, or calibration provenance) and `tier`
(one of TIERS); the numeric leaves of that table share them. A sub-table whose name starts with
`_` only groups values that share a source: its leaves belong to the parent table
(`[gemm._tile] tile_m = 128` is `gemm.tile_m`). An optional sub-table
`uncertainty_rel` gives a fitted relative 1-sigma per leaf (calibrated values). String leaves
(`kind`, `vendor`, ...) are attributes, not parameters. Keys are flattened with dots:
`collectives.nccl_all_reduce.tp4.latency_s`.

Required sections: identity, compute.peak_flops_per_s, memory, kernels, gemm, attention,
interconnect, collectives, vllm_dispatch, asynctp (see docs/model.md for each quantity).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import math
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any
from collections.abc import Mapping

from .errors import TpcostError
from .io import read_text

SCHEMA_VERSION = 1
TIERS = ("assumed", "datasheet", "published-measurement", "calibrated")
# Relative 1-sigma of a parameter by provenance tier, used by the cutoff band (docs/model.md §7).
SIGMA_REL_BY_TIER = {"assumed": 0.30, "datasheet": 0.15, "published-measurement": 0.10, "calibrated": 0.05}
# Tables whose values are code constants (vLLM's dispatch tables) or shapes: never perturbed.
UNPERTURBED_PREFIXES = ("vllm_dispatch.", "identity.", "gemm.tile_", "interconnect.domain_size")

REQUIRED_PARAMS = (
    "identity.sm_count",
    "compute.peak_flops_per_s.bf16",
    "compute.peak_flops_per_s.fp8",
    "compute.peak_flops_per_s.fp32",
    "memory.hbm_bw_bytes_per_s",
    "kernels.mem_efficiency",
    "kernels.launch_overhead_s",
    "gemm.tile_m",
    "gemm.tile_n",
    "gemm.max_efficiency",
    "gemm.mem_efficiency",
    "gemm.launch_overhead_s",
    "attention.efficiency",
    "interconnect.link_bw_bytes_per_s",
    "interconnect.latency_s",
    "interconnect.domain_size",
    "interconnect.internode_bw_bytes_per_s",
    "interconnect.internode_latency_s",
    "asynctp.barrier_s",
    "asynctp.copy_engine_bw_bytes_per_s",
    "asynctp.copy_latency_s",
    "asynctp.compute_slowdown",
    "asynctp.stream_concurrency",
    "asynctp.host_op_s",
)
# Quantities added after schema 1 was first written: a profile without them gets this value (tier assumed).
OPTIONAL_DEFAULTS = {
    "asynctp.host_op_s": (3e-6, "default (not in this profile): one eager torch call ~3 us on a server CPU, the "
                                "built-in profiles' assumption (docs/model.md §6)"),
}
REQUIRED_COLLECTIVES = ("nccl_all_gather", "nccl_reduce_scatter", "nccl_all_reduce")
# Ranges a value must lie in to be physical (checked on load and after every override; docs/model.md §7).
UNIT_INTERVAL_OPEN = ("gemm.max_efficiency", "gemm.mem_efficiency", "kernels.mem_efficiency", "attention.efficiency")
UNIT_INTERVAL_CLOSED = ("asynctp.stream_concurrency",)
# relative slowdown σ of a GEMM while pulls run (g_eff = g_c·(1 + σ·f)): >= 0; above 10 (11x slower) is no GPU's
# behaviour (a 2-core CPU sharing its cores with gloo's threads measured 1.3)
SLOWDOWN_RANGE = {"asynctp.compute_slowdown": (0.0, 10.0)}
INTEGER_PARAMS = ("identity.sm_count", "gemm.tile_m", "gemm.tile_n", "interconnect.domain_size")
# may be 0: latencies and fixed costs (an ideal part), the two fractions above
MAY_BE_ZERO_SUFFIXES = ("latency_s", "launch_overhead_s", "barrier_s", "host_op_s", "setup_s")
INTERCONNECT_KINDS = ("nvswitch", "nvlink-mesh", "pcie", "xgmi", "host")


_READS: set | None = None  # keys read through HardwareProfile.v/dispatch while recording_reads() is active


@contextlib.contextmanager
def recording_reads():
    """Collect the parameter keys the model reads inside the block (how --set finds keys with no effect)."""
    global _READS
    outer, _READS = _READS, set()
    try:
        yield _READS
    finally:
        _READS = outer


@dataclasses.dataclass(frozen=True)
class Param:
    """One numeric profile value with where it came from."""

    value: Any  # float, or a numpy array of Monte Carlo draws
    source: str
    tier: str
    uncertainty_rel: float | None = None

    @property
    def sigma_rel(self) -> float:
        """The fit's own relative sigma where one was recorded (calibrated or fitted values), else the tier's."""
        if self.uncertainty_rel is not None and self.tier in ("calibrated", "published-measurement"):
            return float(self.uncertainty_rel)
        return SIGMA_REL_BY_TIER[self.tier]


@dataclasses.dataclass(frozen=True)
class HardwareProfile:
    """A GPU (or CPU host) described as data; `params` maps dotted keys to Param."""

    name: str
    origin: str  # "built-in:<name>" or a file path
    params: Mapping[str, Param]
    attrs: Mapping[str, str]  # string leaves: identity.vendor, interconnect.kind, ...
    raw: Mapping[str, Any]  # the parsed TOML tree (round-trips through dump_profile)
    modified: tuple[str, ...] = ()  # keys changed by --set

    def v(self, key: str):
        """Value of parameter `key` (float, or array of draws)."""
        if _READS is not None:
            _READS.add(key)
        try:
            return self.params[key].value
        except KeyError:
            raise TpcostError(f"profile {self.name!r} has no quantity {key!r}") from None

    def get(self, key: str, default=None):
        p = self.params.get(key)
        return default if p is None else p.value

    @property
    def kind(self) -> str:
        return self.attrs.get("interconnect.kind", "")

    def collective(self, impl: str, tp: int) -> tuple[Any, Any]:
        """(latency_s, bus_bw_bytes_per_s) of collective `impl` at TP size `tp`.

        Uses the entry for `tp` if present, else the nearest listed TP size (larger preferred);
        beyond the interconnect domain the internode link caps the bandwidth and adds latency."""
        pick = self.collective_entry_tp(impl, tp)
        lat = self.v(f"collectives.{impl}.tp{pick}.latency_s")
        bw = self.v(f"collectives.{impl}.tp{pick}.bus_bw_bytes_per_s")
        if tp > self.v("interconnect.domain_size"):
            import numpy as np

            bw = np.minimum(bw, self.v("interconnect.internode_bw_bytes_per_s"))
            lat = lat + self.v("interconnect.internode_latency_s")
        return lat, bw

    def collective_entry_tp(self, impl: str, tp: int) -> int:
        """The TP size whose `collectives.<impl>` entry serves `tp`: tp itself, else the nearest (larger preferred)."""
        tps = self.collective_tps(impl)
        if not tps:
            raise TpcostError(f"profile {self.name!r} has no collective {impl!r}")
        return tp if tp in tps else min(tps, key=lambda t: (abs(t - tp), -t))

    def collective_tps(self, impl: str) -> list[int]:
        return self._collective_index.get(impl, [])

    @functools.cached_property
    def _collective_index(self) -> dict[str, list[int]]:
        """impl -> sorted TP sizes with an entry (from keys collectives.<impl>.tp<W>.<field>), built once."""
        out: dict[str, set[int]] = {}
        for k in self.params:
            parts = k.split(".")
            if len(parts) == 4 and parts[0] == "collectives" and parts[2].startswith("tp"):
                out.setdefault(parts[1], set()).add(int(parts[2][2:]))
        return {impl: sorted(tps) for impl, tps in out.items()}

    def has_collective(self, impl: str) -> bool:
        return bool(self.collective_tps(impl))

    def dispatch(self, tp: int) -> dict[str, Any]:
        """vLLM's implementation-switch limits for `tp` (bytes) and string choices, from vllm_dispatch
        (read from the parameters, so that --set on them takes effect)."""
        pre = f"vllm_dispatch.tp{tp}."
        out: dict[str, Any] = {k[len(pre):]: p.value for k, p in self.params.items() if k.startswith(pre)}
        if _READS is not None:
            _READS.update(pre + k for k in out)
        out.update({k[len(pre):]: v for k, v in self.attrs.items() if k.startswith(pre)})
        return out

    @property
    def tier(self) -> str:
        """Lowest provenance tier among the parameters the model uses (the profile's weakest link)."""
        used = [p.tier for k, p in self.params.items() if not k.startswith(UNPERTURBED_PREFIXES)]
        return min(used, key=TIERS.index) if used else "assumed"

    def tier_counts(self) -> dict[str, int]:
        counts = {t: 0 for t in TIERS}
        for p in self.params.values():
            counts[p.tier] += 1
        return counts

    def sources(self) -> list[str]:
        return sorted({p.source for p in self.params.values()})

    def with_values(self, values: Mapping[str, Any], *, source: str = "--set by user",
                    tier: str = "assumed", mark_modified: bool = True) -> HardwareProfile:
        """A copy with some parameter values replaced (used by --set and the Monte Carlo band)."""
        params = dict(self.params)
        for k, v in values.items():
            if k not in params:
                raise TpcostError(
                    f"--set: unknown quantity {k!r} for profile {self.name!r} (see `tpcost profiles --keys {self.name}`)")
            old = params[k]
            params[k] = Param(v, source if mark_modified else old.source,
                              tier if mark_modified else old.tier, old.uncertainty_rel)
        modified = self.modified + tuple(k for k in values if k not in self.modified) if mark_modified else self.modified
        if mark_modified:  # the Monte Carlo band perturbs within the tiers' sigmas; a user's values are checked
            check_params(params, f"profile {self.name!r} after --set")
        return dataclasses.replace(self, params=params, modified=modified)


DERIVED_FROM_LINK = "--set on interconnect.* (derived: rides on the link)"


def with_overrides(profile: HardwareProfile, values: Mapping[str, float],
                   source: str = "--set by user") -> HardwareProfile:
    """--set semantics: plain replacement, except that the link itself carries its dependants along.

    `interconnect.link_bw_bytes_per_s` scales every collective's bus bandwidth and the copy-engine pull
    bandwidth by new/old; `interconnect.latency_s` shifts every collective latency and the pull latency
    by new − old (floored at 0). A dependant also given explicitly keeps the explicit value."""
    derived: dict[str, Any] = {}
    if "interconnect.link_bw_bytes_per_s" in values:
        old = profile.v("interconnect.link_bw_bytes_per_s")
        ratio = values["interconnect.link_bw_bytes_per_s"] / old if old else 1.0
        for k, p in profile.params.items():
            if (k.startswith("collectives.") and k.endswith(".bus_bw_bytes_per_s")) or \
                    k == "asynctp.copy_engine_bw_bytes_per_s":
                derived[k] = p.value * ratio
    if "interconnect.latency_s" in values:
        delta = values["interconnect.latency_s"] - profile.v("interconnect.latency_s")
        for k, p in profile.params.items():
            if (k.startswith("collectives.") and k.endswith(".latency_s")) or k == "asynctp.copy_latency_s":
                derived[k] = max(0.0, p.value + delta)
    derived = {k: v for k, v in derived.items() if k not in values}
    return profile.with_values(derived, source=DERIVED_FROM_LINK).with_values(values, source=source)


def check_params(params: Mapping[str, Param], where: str) -> None:
    """One validation path for every profile value, run on load and after every override: finite; > 0
    unless a latency or fixed cost; efficiencies in (0, 1]; concurrency and slowdown in [0, 1]; counts and
    tile sizes integers >= 1."""
    for k, p in params.items():
        v = p.value
        if hasattr(v, "shape"):  # Monte Carlo draws: checked where they are made
            continue
        fv = float(v)
        if not math.isfinite(fv):
            raise TpcostError(f"{where}: {k} = {v!r} must be finite")
        if k in UNIT_INTERVAL_OPEN:
            if not 0.0 < fv <= 1.0:
                raise TpcostError(f"{where}: {k} = {v:g} is an efficiency and must lie in (0, 1]")
        elif k in UNIT_INTERVAL_CLOSED:
            if not 0.0 <= fv <= 1.0:
                raise TpcostError(f"{where}: {k} = {v:g} is a fraction and must lie in [0, 1]")
        elif k in SLOWDOWN_RANGE:
            lo, hi = SLOWDOWN_RANGE[k]
            if not lo <= fv <= hi:
                raise TpcostError(f"{where}: {k} = {v:g} is a relative slowdown and must lie in [{lo:g}, {hi:g}]")
        elif k in INTEGER_PARAMS:
            if fv < 1 or fv != int(fv):
                raise TpcostError(f"{where}: {k} = {v:g} must be an integer >= 1")
        elif k.startswith("vllm_dispatch."):
            if fv < 0:
                raise TpcostError(f"{where}: {k} = {v:g} is a size limit in bytes and must be >= 0")
        elif k.endswith(MAY_BE_ZERO_SUFFIXES) or k.endswith("_rel"):
            if fv < 0:
                raise TpcostError(f"{where}: {k} = {v:g} must be >= 0")
        elif fv <= 0:
            raise TpcostError(f"{where}: {k} = {v:g} must be > 0")


def _flatten(tree: Mapping[str, Any], path: str, params: dict, attrs: dict, where: str) -> None:
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
        for k, v in numeric.items():
            fv = float(v)
            if not math.isfinite(fv) or fv < 0:
                raise TpcostError(f"{where}: {path}.{k} = {v} must be a finite number >= 0")
            u = unc.get(k)
            params[f"{path}.{k}" if path else k] = Param(fv, src, tier, None if u is None else float(u))
    for k, v in tree.items():
        key = f"{path}.{k}" if path else k
        if isinstance(v, dict):
            if k == "uncertainty_rel":
                continue
            _flatten(v, path if k.startswith("_") else key, params, attrs, where)
        elif isinstance(v, str) and k not in ("source", "tier"):
            attrs[key] = v
        elif isinstance(v, bool) or isinstance(v, list):
            raise TpcostError(f"{where}: {key} has unsupported type {type(v).__name__}")


def profile_from_dict(tree: Mapping[str, Any], origin: str) -> HardwareProfile:
    """Validate a parsed TOML tree and build a HardwareProfile; errors name the file and the key."""
    where = origin
    if tree.get("schema_version") != SCHEMA_VERSION:
        raise TpcostError(f"{where}: schema_version must be {SCHEMA_VERSION}, got {tree.get('schema_version')!r}")
    ident = tree.get("identity")
    if not isinstance(ident, dict) or not isinstance(ident.get("name"), str):
        raise TpcostError(f"{where}: missing [identity] table with a `name`")
    params: dict[str, Param] = {}
    attrs: dict[str, str] = {}
    body = {k: v for k, v in tree.items() if k != "schema_version"}
    _flatten(body, "", params, attrs, where)
    for key, (value, source) in OPTIONAL_DEFAULTS.items():
        if key not in params:  # profiles written before the quantity existed keep loading, and say so
            params[key] = Param(value, source, "assumed")
    missing = [k for k in REQUIRED_PARAMS if k not in params]
    if missing:
        raise TpcostError(f"{where}: missing required quantity {missing[0]}" +
                          (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    kind = attrs.get("interconnect.kind")
    if kind not in INTERCONNECT_KINDS:
        raise TpcostError(f"{where}: interconnect.kind must be one of {', '.join(INTERCONNECT_KINDS)}, got {kind!r}")
    for c in REQUIRED_COLLECTIVES:
        if not any(k.startswith(f"collectives.{c}.tp") for k in params):
            raise TpcostError(f"{where}: missing [collectives.{c}.tpN] entries")
    check_params(params, where)
    return HardwareProfile(name=ident["name"], origin=origin, params=params, attrs=attrs, raw=tree)


def builtin_profile_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("costmodel.profiles").iterdir() if p.name.endswith(".toml"))


@functools.lru_cache(maxsize=32)
def _builtin_tree(name: str) -> Mapping[str, Any]:
    return tomllib.loads(resources.files("costmodel.profiles").joinpath(f"{name}.toml").read_text())


def load_profile(name_or_path: str) -> HardwareProfile:
    """Load a built-in profile by name or a TOML file by path (read with tomllib; never eval/pickle)."""
    names = builtin_profile_names()
    if name_or_path in names:
        return profile_from_dict(copy.deepcopy(_builtin_tree(name_or_path)), f"built-in:{name_or_path}")
    path = Path(name_or_path)
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
    best = depth = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth = max(0, depth - 1)
    headers = [ln.count(".") + 1 for ln in text.splitlines() if ln.lstrip().startswith("[")]
    return max([best, *headers])


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
        try:
            fv = float(val)
        except ValueError:
            raise TpcostError(f"--set {key}: {val!r} is not a number") from None
        if not math.isfinite(fv):
            raise TpcostError(f"--set {key}: value must be a finite number, got {val!r}")
        if key.strip() in out:
            raise TpcostError(f"--set {key.strip()} given twice")
        out[key.strip()] = fv
    return out


def match_profile(device_name: str, capability: str | None = None) -> str | None:
    """The built-in profile for a device: the first whose device_name_patterns occur in its name, else the one
    with the same compute capability ('major.minor'); None if neither matches. The one matching rule (the CLI,
    the vLLM plugin and calib's single-GPU check all use it)."""
    profiles = [load_profile(n) for n in builtin_profile_names()]
    for p in profiles:
        pats = [s for s in p.attrs.get("identity.device_name_patterns", "").split("|") if s]
        if any(s in device_name for s in pats):
            return p.name
    for p in profiles:
        if capability and p.attrs.get("identity.compute_capability") == capability:
            return p.name
    return None


def _local_device():
    """(device name, 'major.minor') of GPU 0 via vLLM's platform if importable, else torch; (None, None) if none.
    Imported only when called: `--gpu auto` is the one path of costmodel that asks the machine."""
    try:
        from vllm.platforms import current_platform

        cap = current_platform.get_device_capability()
        if cap is not None:
            return current_platform.get_device_name(), f"{cap.major}.{cap.minor}"
    except Exception:  # noqa: BLE001 - vllm absent or no device
        pass
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            return torch.cuda.get_device_name(0), f"{major}.{minor}"
    except Exception:  # noqa: BLE001
        pass
    return None, None


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
    name, cap = _local_device()
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
    folds back into the same keys (the schema at the top of this module)."""
    tree: dict = {"schema_version": SCHEMA_VERSION}

    def node(path):
        t = tree
        for part in path:
            t = t.setdefault(part, {})
        return t

    groups: dict = {}
    for key, prm in profile.params.items():
        parent, leaf = key.rsplit(".", 1)
        unc = None if prm.uncertainty_rel is None else float(prm.uncertainty_rel)
        groups.setdefault(tuple(parent.split(".")), {}).setdefault((prm.source, prm.tier, unc), {})[leaf] = prm.value
    for path, by_src in groups.items():
        for i, ((src, tier, unc), leaves) in enumerate(sorted(by_src.items(), key=lambda kv: -len(kv[1]))):
            t = node(path if i == 0 else path + (f"_s{i}",))
            t.update({k: float(v) if isinstance(v, float) else v for k, v in leaves.items()})
            t["source"], t["tier"] = src, tier
            if unc is not None:
                t["uncertainty_rel"] = {k: unc for k in leaves}
    for key, val in profile.attrs.items():
        parent, leaf = key.rsplit(".", 1)
        node(tuple(parent.split(".")))[leaf] = val
    if name is not None:
        node(("identity",))["name"] = name
    return tree
