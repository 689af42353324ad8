"""The GPU spec files (calib/gpus/<name>.toml, docs/profiles.md): their format, checked on load, and
the values they write into a profile tree (a committed component fit by `{fit = [...]}`, a source
filled in from its table's values). calib/assemble.py applies them."""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path

from calib import results as CR
from calib.derive import sec
from calib.tables import Fits
from costmodel.errors import TpcostError

SPECS = Path(__file__).resolve().parent / "gpus"
ROOT = SPECS.parents[1]
# step kind -> (keys it needs, keys it may have)
STEP_KEYS = {
    "set": ({"table"}, set()),
    "update": ({"values"}, set()),
    "fit": (set(), set()),
    "scale_collectives": ({"why"}, {"keep", "ratio"}),
    "one_ring": (set(), set()),
    "ring_pull": (set(), {"why"}),
    "carry": ({"prefix"}, set()),
    "drop": (set(), set()),
}
STEP_KINDS = tuple(STEP_KEYS)
SPEC_KEYS = {"name", "inherits", "inherit_stage", "fit_inputs", "step", "fused", "capacity"}
FUSED_KEYS = {
    "family",
    "start",
    "host",
    "terms",
    "carried",
    "fits",
    "gb200_rs",
    "nvlink",
    "nccl_regimes",
    "calibrated",
}
FAMILY_TERMS = {
    "sync": ("asynctp.barrier_s", "per-barrier GPU cost"),
    "pull": ("asynctp.copy_engine_bw_bytes_per_s", "copy-engine pull bandwidth"),
    "slowdown": ("asynctp.compute_slowdown", "chunk-GEMM slowdown while pulls run"),
    "rs_exposure": (
        "asynctp.rs_step_exposure",
        "share of GEMM+RS's pulls its per-step barriers leave exposed",
    ),
}
_TEMPLATE = re.compile(r"\{(\w+)(?:\*(\w+))?(:[^{}]*)?\}")


class SpecError(TpcostError):
    """A GPU spec the assembler cannot apply: the file and the step named (exit 2 in
    tools/build_profiles.py)."""


def bad(path: Path, what: str) -> SpecError:
    return SpecError(f"{path}: {what}")


def load_spec(path: Path) -> dict:
    """One GPU spec file, its keys checked (the steps' are checked where they are applied)."""
    try:
        spec = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise bad(path, f"not a readable TOML spec ({e})") from None
    unknown = set(spec) - SPEC_KEYS
    if unknown or not isinstance(spec.get("name"), str) or spec["name"] != path.stem:
        raise bad(
            path,
            f"unknown keys {sorted(unknown)}"
            if unknown
            else f"name must be the file's stem {path.stem!r}",
        )
    for key in ("fused", "capacity"):
        if not isinstance(spec.get(key, {}), dict):
            raise bad(path, f"{key} must be a table ([{key}])")
    if set(spec.get("fused", {})) - FUSED_KEYS:
        raise bad(path, f"unknown [fused] keys {sorted(set(spec['fused']) - FUSED_KEYS)}")
    cap = spec.get("capacity")
    if cap is not None and (
        set(cap) != {"hbm_capacity_bytes", "source"}
        or not isinstance(cap["source"], str)
        or isinstance(cap["hbm_capacity_bytes"], bool)
        or not isinstance(cap["hbm_capacity_bytes"], (int, float))
    ):
        raise bad(
            path,
            "[capacity] holds hbm_capacity_bytes (a number) and source (a string), nothing else",
        )
    steps = spec.get("step", [])
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        raise bad(path, "step must be an array of tables ([[step]])")
    for i, step in enumerate(steps):
        kinds = [k for k in STEP_KINDS if k in step]
        if len(kinds) != 1:
            raise bad(
                path,
                f"step {i + 1} must have exactly one of {', '.join(STEP_KINDS)} (has "
                f"{kinds or 'none'})",
            )
        need, may = STEP_KEYS[kinds[0]]
        if need - set(step) or set(step) - need - may - {kinds[0]}:
            raise bad(
                path,
                f"step {i + 1} ({kinds[0]}) takes {sorted(need | may) or 'no other keys'} "
                f"(needs {sorted(need) or 'none'}), has {sorted(set(step) - {kinds[0]})}",
            )
    for key in ("inherits", "inherit_stage", "fit_inputs"):
        if key in spec and not isinstance(spec[key], str):
            raise bad(path, f"{key} must be a string")
    if spec.get("inherit_stage", "base") not in ("base", "fused"):
        raise bad(path, "inherit_stage must be 'base' or 'fused'")
    return {**spec, "_path": path}


def load_specs(dirs=(SPECS,)) -> dict[str, dict]:
    """Every spec under `dirs`; a name given twice is refused (a spec directory adds GPUs: one that
    replaced a built-in would silently change every profile that inherits from it)."""
    out: dict[str, dict] = {}
    for d in dirs:
        for path in sorted(Path(d).glob("*.toml")):
            if path.stem in out:
                raise bad(
                    path,
                    f"a GPU named {path.stem!r} is already specified ({out[path.stem]['_path']}): "
                    "give the new GPU its own name (the file's stem and its name =)",
                )
            out[path.stem] = load_spec(path)
    return out


def at_path(tree: dict, path: str, create: bool = False):
    *parents, leaf = path.split(".")
    for key in parents:
        tree = tree.setdefault(key, {}) if create else tree[key]
    return tree, leaf


def resolve(v, fits: Fits, where: str):
    """A spec value: `{fit = [key, ...]}` is that committed component fit; anything else is
    itself."""
    if isinstance(v, dict) and set(v) == {"fit"}:
        node = fits.comps
        for key in v["fit"]:
            if not isinstance(node, dict) or key not in node:
                raise SpecError(
                    f"{where}: no component fit {'/'.join(v['fit'])} in {CR.COMPONENT_FITS.name} "
                    f"(run {CR.COMPONENT_CMD})"
                )
            node = node[key]
        return node
    return v


def _fill(text: str, vals: dict, where: str) -> str:
    """{key}, {key:.3f} or {key*other:.1f} (a product of two) in a source replaced by those values
    of the table."""

    def sub(m):
        names = [n for n in m.group(1, 2) if n]
        if any(n not in vals for n in names):
            raise SpecError(f"{where}: source names {m.group(0)}, which the table does not hold")
        try:
            v = vals[names[0]] * vals[names[1]] if len(names) == 2 else vals[names[0]]
            return format(v, (m.group(3) or ":")[1:])
        except (TypeError, ValueError) as e:
            raise SpecError(f"{where}: source's {m.group(0)}: {e}") from None

    return _TEMPLATE.sub(sub, text)


def table(raw: dict, fits: Fits, where: str) -> dict:
    """A sourced table from a spec: values resolved, the source filled in; keys starting with _ only
    fill it."""
    if set(raw) == {"fit"}:
        return copy.deepcopy(resolve(raw, fits, where))
    vals = {k: resolve(v, fits, where) for k, v in raw.items()}
    for k in ("source", "source_prefix", "source_suffix"):
        if isinstance(vals.get(k), str):
            vals[k] = _fill(vals[k], vals, where)
    vals = {k: v for k, v in vals.items() if not k.startswith("_")}
    if "tier" in vals:
        source, tier = vals.pop("source", ""), vals.pop("tier")
        extra = {k: vals.pop(k) for k in ("uncertainty_rel", "kind") if k in vals}
        return {
            **({"kind": extra.pop("kind")} if "kind" in extra else {}),
            **sec(source, tier, **vals),
            **extra,
        }
    return vals
