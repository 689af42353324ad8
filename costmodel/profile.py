"""Hardware profiles, the public API (docs/profiles.md): one versioned TOML file per GPU, parsed once into frozen
typed dataclasses; every number keeps its source and tier. Its jobs, one module each: profile_schema (the tables
and the typed profile; adding a table is one dataclass and one HardwareProfile field), profile_ranges (plausible
ranges and the one value check), profile_load (TOML in and out, the built-ins, `--gpu auto`) and
profile_overrides (--set, and the recording copy that says what one model call read)."""

from __future__ import annotations

from .profile_load import (MAX_TOML_DEPTH, builtin_profile_names, detect_profile,
                           detect_profile_name, dump_profile, load_profile, match_profile,
                           profile_from_dict, profile_to_tree)
from .profile_overrides import (DERIVED_FROM_LINK, parse_set, recording, with_overrides)
from .profile_ranges import (INTEGER_PARAMS, NO_DISPATCH_TABLE, UNCERTAINTY_RANGE, VALUE_RANGES,
                             ValueRange, check_params, check_uncertainty, value_range)
from .profile_schema import (AsyncTP, Attention, Collective, Compute, FusedKernel, Gemm,
                             HardwareProfile, INTERCONNECT_KINDS, Identity, Interconnect, Kernels,
                             MEASURED_IMPLS, MEASURED_MAX_POINTS, MEASURED_TABLE, MeasuredCurve,
                             Memory, NOTES_TABLE, Num, OPTIONAL_DEFAULTS, OPTIONAL_TABLE_DEFAULTS,
                             PeakFlops, Provenance, REPLACED_KEYS, REQUIRED_COLLECTIVES,
                             REQUIRED_PARAMS, SCHEMA_VERSION, SIGMA_REL_BY_TIER, TIERS,
                             UNPERTURBED_PREFIXES, USER_SET)

__all__ = [
    "AsyncTP", "Attention", "Collective", "Compute", "DERIVED_FROM_LINK", "FusedKernel", "Gemm",
    "HardwareProfile", "INTEGER_PARAMS", "INTERCONNECT_KINDS", "Identity", "Interconnect",
    "Kernels", "MAX_TOML_DEPTH", "MEASURED_IMPLS", "MEASURED_MAX_POINTS", "MEASURED_TABLE",
    "MeasuredCurve", "Memory", "NOTES_TABLE", "NO_DISPATCH_TABLE", "Num", "OPTIONAL_DEFAULTS",
    "OPTIONAL_TABLE_DEFAULTS", "PeakFlops", "Provenance", "REPLACED_KEYS", "REQUIRED_COLLECTIVES",
    "REQUIRED_PARAMS", "SCHEMA_VERSION", "SIGMA_REL_BY_TIER", "TIERS", "UNCERTAINTY_RANGE",
    "UNPERTURBED_PREFIXES", "USER_SET", "VALUE_RANGES", "ValueRange", "builtin_profile_names",
    "check_params", "check_uncertainty", "detect_profile", "detect_profile_name", "dump_profile",
    "load_profile", "match_profile", "parse_set", "profile_from_dict", "profile_to_tree",
    "recording", "value_range", "with_overrides",
]
