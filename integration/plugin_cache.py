"""The vLLM plugin's decision cache: the same inputs give the same pass-config plan, so a process
that has seen them before reads the plan back instead of importing the cost model
(docs/vllm-plugin.md, "Cost at config time").

The key is a SHA-256 over everything the decision reads: tpcost's own code and built-in profiles
(name, size and mtime of every file, so an edit or reinstall misses), the profile (TPCOST_PROFILE's
text when it is a file, else the built-in name, or the local GPU's name and compute capability), the
model's HF text config, tp, the dtype mode, vLLM's token budget and version range, the user's own
pass-config values, and the workload file's bytes. Entries live in $TPCOST_CACHE_DIR (default
$XDG_CACHE_HOME/tpcost, else ~/.cache/tpcost), one JSON file per key, written atomically;
TPCOST_CACHE=0 turns the cache off. A missing, unreadable or malformed entry is recomputed; nothing
here ever raises into vLLM (the plugin catches and warns).

A lookup imports only the standard library and costmodel.device (nothing of the model); a store,
which follows a miss that has loaded the model anyway, writes through costmodel.io.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from importlib.util import find_spec
from pathlib import Path

CACHE_FORMAT = 1
_OWN_PACKAGES = ("costmodel", "costmodel.profiles", "integration")


_ON, _OFF = ("1", "on", "true", "yes", ""), ("0", "off", "false", "no")


def env_flag(name: str) -> tuple[bool, str | None]:
    """(is it set true, one line when the value is not a boolean) for a TPCOST_* on/off variable:
    1/on/true/yes and 0/off/false/no/empty, any case; anything else reads as unset (false) and is
    said."""
    raw = os.environ.get(name)
    v = (raw or "").strip().lower()
    if v in _OFF or v == "":
        return False, None
    if v in _ON:
        return True, None
    return False, f"{name}={raw!r} is not 0/1, on/off, true/false or yes/no; read as unset"


def setting_problem() -> str | None:
    """One line on a TPCOST_CACHE / TPCOST_CACHE_DIR value that cannot be meant (the cache is then
    off), else None."""
    v = os.environ.get("TPCOST_CACHE", "1").strip().lower()
    if v not in _ON + _OFF:
        return (
            f"TPCOST_CACHE={os.environ['TPCOST_CACHE']!r} is not 0 or 1; the decision cache is off"
        )
    d = os.environ.get("TPCOST_CACHE_DIR")
    if d is not None and (not d.strip() or os.path.exists(d) and not os.path.isdir(d)):
        return f"TPCOST_CACHE_DIR={d!r} is not a directory; the decision cache is off"
    return None


def cache_dir() -> Path | None:
    """Where entries live, or None when TPCOST_CACHE=0 (or a setting is unusable:
    setting_problem)."""
    if os.environ.get("TPCOST_CACHE", "1").strip().lower() not in _ON or setting_problem():
        return None
    d = os.environ.get("TPCOST_CACHE_DIR")
    if not d:
        d = os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
            "tpcost",
        )
    return Path(d)


@functools.cache
def code_fingerprint() -> str:
    """Name, size and mtime of every .py and .toml file of tpcost's packages (a stat each; none of
    the model is imported: costmodel's __init__ is lazy). Once per process: the code it describes is
    the code already loaded."""
    h = hashlib.sha256()
    for pkg in _OWN_PACKAGES:
        spec = find_spec(pkg)
        for root in (spec.submodule_search_locations or []) if spec else []:
            for e in sorted(os.scandir(root), key=lambda e: e.name):
                if e.is_file() and e.name.endswith((".py", ".toml")):
                    st = e.stat()
                    h.update(f"{pkg}/{e.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()


def _file_digest(path: str) -> str | None:
    """SHA-256 of a file's bytes; None where it cannot be read (the decision then reports the file
    itself)."""
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def profile_identity() -> dict:
    """What names the profile the plugin would load: TPCOST_PROFILE (a file's text digest, or a
    built-in name), else the local GPU (its built-in profile is chosen from these, and the built-in
    files are in the fingerprint)."""
    env = os.environ.get("TPCOST_PROFILE")
    if env:
        return {"tpcost_profile": env, "digest": _file_digest(env) if os.path.isfile(env) else None}
    from costmodel.device import local_device

    name, cap = local_device()
    return {"device_name": name, "capability": cap}


def decision_key(inputs: dict) -> str:
    """SHA-256 of the decision's inputs (JSON-able), tpcost's code and the profile and workload they
    name."""
    wl, nw = os.environ.get("TPCOST_WORKLOAD"), os.environ.get("TPCOST_NETWORK")
    full = {
        "format": CACHE_FORMAT,
        "code": code_fingerprint(),
        "profile": profile_identity(),
        "workload": None if not wl else {"path": wl, "digest": _file_digest(wl)},
        "network_file": {"path": nw, "digest": _file_digest(nw)}
        if nw and os.path.isfile(nw)
        else None,
        **inputs,
    }
    return hashlib.sha256(json.dumps(full, sort_keys=True, default=str).encode()).hexdigest()


def load(d: Path | None, key: str) -> dict | None:
    """The cached plan for `key` in cache directory `d` (cache_dir()), or None (off, absent,
    unreadable or not a plan)."""
    if d is None:
        return None
    try:
        plan = json.loads((d / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    return plan if _is_plan(plan) else None


PLAN_ATTRS = {
    "fuse_allreduce_rms": (bool,),
    "fi_allreduce_fusion_max_size_mb": (int, float),
    "sp_min_token_num": (int,),
    "enable_sp": (bool,),
    "fuse_gemm_comms": (bool,),
    "dbo_decode_token_threshold": (int,),
    "dbo_prefill_token_threshold": (int,),
}


# costmodel.vllm_tables.SWITCHES (not imported here)
PLAN_ENV = (
    "VLLM_KIMI_K3_GEMM_AR",
    "VLLM_ENABLE_GEMM_RS",
)


def _is_plan(plan) -> bool:
    """A plan sets only the pass-config fields the plugin decides, to values of their type, and says
    strings (its log lines, the model gates' included)."""
    if (
        not isinstance(plan, dict)
        or not isinstance(plan.get("set"), list)
        or not isinstance(plan.get("said"), list)
    ):
        return False
    for entry in plan["set"]:
        if not (isinstance(entry, (list, tuple)) and len(entry) == 2 and entry[0] in PLAN_ATTRS):
            return False
        attr, value = entry
        if isinstance(value, bool) != (PLAN_ATTRS[attr] == (bool,)) or not isinstance(
            value, PLAN_ATTRS[attr]
        ):
            return False
    env = plan.get("env", [])
    if not isinstance(env, list) or not all(
        isinstance(e, (list, tuple)) and len(e) == 2 and e[0] in PLAN_ENV and e[1] in ("0", "1")
        for e in env
    ):
        return False
    gates = plan.get("gates", [])
    return (
        all(isinstance(x, str) for x in plan["said"])
        and isinstance(gates, list)
        and all(isinstance(x, str) for x in gates)
        and all(isinstance(plan.get(k), str) for k in ("profile_name", "profile_tier"))
    )


def store(d: Path | None, key: str, plan: dict) -> bool:
    """Write the plan for `key` into `d` atomically (costmodel.io's temporary file + rename; only a
    miss gets here, and it has imported costmodel already); False where it cannot."""
    if d is None:
        return False
    from costmodel.errors import TpcostError
    from costmodel.io import atomic_write_text, dumps_json

    try:
        d.mkdir(parents=True, exist_ok=True)
        atomic_write_text(d / f"{key}.json", dumps_json(plan))
        return True
    except (OSError, TpcostError):
        return False
