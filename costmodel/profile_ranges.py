"""Profile values' plausible ranges and the one check every value passes (§17)."""
# Profile values' plausible ranges (costmodel/value_ranges.toml) and the one check every value
# passes: on load, after every --set and on what calibration writes (docs/profiles.md "Plausible
# ranges").

from __future__ import annotations

import dataclasses
import functools
import math
import re
import tomllib
from collections.abc import Mapping
from importlib import resources
from typing import Any

from .errors import TpcostError
from .io import finite_float


NO_DISPATCH_TABLE = (
    "[vllm_dispatch] is not a profile table: profiles hold hardware only, and tpcost derives "
    "vLLM's "
    "dispatch limits from its version (costmodel/vllm_tables.py); delete the section, and use "
    "--vllm-set KEY=BYTES (e.g. custom_ar_max_bytes=4194304) for a what-if on a limit"
)


INTEGER_PARAMS = (
    "identity.sm_count",
    "gemm.tile_m",
    "gemm.tile_n",
    "interconnect.domain_size",
    "interconnect.domain_hosts",
    "interconnect.multicast",
)


@dataclasses.dataclass(frozen=True)
class ValueRange:
    """The plausible range of one profile quantity: lo <= v <= hi, SI (§17)."""

    # lo excluded when lo_open.

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
    """The plausible ranges of every profile quantity (costmodel/value_ranges.toml, the reasons
    there): (dotted-key regular expression, range), first match wins."""
    d = tomllib.loads(
        resources.files("costmodel").joinpath("value_ranges.toml").read_text(encoding="utf-8")
    )
    return tuple(
        (e["key"], ValueRange(e["lo"], e["hi"], e["unit"], e["why"], e.get("lo_open", False)))
        for e in d["range"]
    )


VALUE_RANGES = _value_ranges()


UNCERTAINTY_RANGE = ValueRange(
    0.0, 1.0, "", "a relative 1-sigma; a fit worse than 100 % says nothing"
)


_RANGE_RES = tuple((re.compile(pat), r) for pat, r in VALUE_RANGES)


def value_range(key: str) -> ValueRange:
    """The plausible range of the quantity at dotted `key` (first matching pattern; §17)."""
    # VALUE_RANGES.
    for rx, r in _RANGE_RES:
        if rx.fullmatch(key):
            return r
    raise TpcostError(
        f"{key}: no plausible range defined (a schema field without an entry in VALUE_RANGES)"
    )


_SI_UNITS = (
    ("_bytes_per_s", "bytes/s"),
    ("_flops_per_s", "FLOP/s"),
    ("_bytes", "bytes"),
    ("_s", "s"),
)


@functools.lru_cache(maxsize=256)
def _typical_log10(key: str) -> float | None:
    """The median log10 of `key` over the built-in profiles' files that hold it (what a typed value
    most likely means), read from the TOML as written: a `_`-prefixed sub-table's leaves belong to
    its parent."""

    def leaf(tree: Any, parts: list[str]) -> Any:
        if not isinstance(tree, dict):
            return None
        if len(parts) == 1:
            for k, v in tree.items():
                hit = v if k == parts[0] else leaf(v, parts) if k.startswith("_") else None
                if isinstance(hit, (int, float)) and not isinstance(hit, bool):
                    return hit
            return None
        return leaf(tree.get(parts[0]), parts[1:])

    vals = []
    for f in resources.files("costmodel.profiles").iterdir():
        if f.name.endswith(".toml"):
            v = leaf(tomllib.loads(f.read_text(encoding="utf-8")), key.split("."))
            if v is not None and v > 0:
                vals.append(math.log10(v))
    return sorted(vals)[len(vals) // 2] if vals else None


def _si_hint(key: str, v: float, r: Any) -> str:
    """'; did you mean 900e9 (values are SI: bytes/s)?' where a power of 1000 brings `v` into the
    range."""
    unit = next((u for suffix, u in _SI_UNITS if key.endswith(suffix)), None)
    if unit is None or v == 0:
        return ""
    import math

    fits = [e for e in (3, 6, 9, 12, 15, -3, -6, -9) if r.contains(v * 10.0**e)]
    if not fits:
        return ""
    mid = _typical_log10(key)
    if mid is None:
        lo, hi = max(r.lo, 1e-30), r.hi
        mid = (
            0.5 * (math.log10(lo) + math.log10(hi))
            if math.isfinite(hi) and hi > 0
            else math.log10(lo) + 1
        )
    # 9.6 HBM -> 9.6e12, not 9.6e9
    exp = min(fits, key=lambda e: abs(math.log10(abs(v) * 10.0**e) - mid))
    # 900 -> 900e9; a value typed with its own exponent -> the value itself (9e+09)
    typed = f"{v:g}"
    return (
        f"; did you mean {typed + f'e{exp}' if 'e' not in typed else f'{v * 10.0**exp:g}'} "
        f"(values are SI: {unit})?"
    )


def check_params(values: Mapping[str, Any], where: str) -> None:
    """The one validation of every profile value: finite, plausible, integers where counts (§17)."""
    # Run on load, after every override and on what calibration writes: finite, inside its plausible
    # range (VALUE_RANGES), counts and tile sizes integers.
    for k, v in values.items():
        if k.startswith("vllm_dispatch."):
            raise TpcostError(f"{where}: {k}: {NO_DISPATCH_TABLE}")
        if hasattr(v, "shape"):  # Monte Carlo draws: clipped into the range where they are made
            continue
        fv = finite_float(v, f"{where}: {k}")
        r = value_range(k)
        if not r.contains(fv):
            raise TpcostError(
                f"{where}: {k} = {fv:g} is outside its plausible range {r.text()} ({r.why}; "
                f"docs/profiles.md){_si_hint(k, fv, r)}"
            )
        if k in INTEGER_PARAMS and fv != int(fv):
            raise TpcostError(f"{where}: {k} = {fv:g} must be an integer")


def check_uncertainty(key: str, u: Any, where: str) -> float:
    """A fitted relative 1-sigma: a finite number in [0, 1] (§17)."""
    if isinstance(u, bool) or not isinstance(u, (int, float)):
        raise TpcostError(f"{where}: uncertainty_rel of {key} must be a number, got {u!r}")
    try:
        fu = float(u)
    except OverflowError:
        raise TpcostError(
            f"{where}: uncertainty_rel of {key} = {u} is beyond the range of a float"
        ) from None
    if not (math.isfinite(fu) and UNCERTAINTY_RANGE.contains(fu)):
        raise TpcostError(
            f"{where}: uncertainty_rel of {key} = {fu:g} is outside "
            f"{UNCERTAINTY_RANGE.text().strip()} "
            f"({UNCERTAINTY_RANGE.why})"
        )
    return fu
