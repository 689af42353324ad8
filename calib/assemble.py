"""The generic assembler of the built-in hardware profiles: one spec file per GPU
(calib/gpus/<name>.toml: datasheet values with their sources, what it inherits, and the named fits
that supply each measured table) applied over the committed fit results. docs/profiles.md describes
the spec format, with H20 as the worked example.

    base(name)     the GPU's hardware tables: its parent's tree, then its [[step]]s in order
    start_tree     base with torch's AsyncTP terms at their priors: the family fits' start trees
    (calib/reference.py) profile(name)  base, then its [fused] section from the family, kernel and
    band fits, then the common finish

A step is one of: `set` a sourced table at a dotted path (`{fit = [...]}` reads a committed
component fit; `{name}` in a source is replaced by that value of the table), `update` keys of a
table (`source_prefix` / `source_suffix` edit its source), `fit` a named fit (calib/tables.py),
`scale_collectives` from another GPU by the link ratio, `one_ring`, `ring_pull`, `carry` (another
GPU's values, marked assumed) and `drop`."""

from __future__ import annotations

import copy

from calib import results as CR
from calib import sections as S
from calib.derive import (
    RING,
    custom_reduce_scatter,
    nccl_regimes,
    one_ring,
    round_tree,
    scaled_collectives,
    sec,
)
from calib.specs import FAMILY_TERMS, ROOT, SPECS, SpecError, at_path, load_specs, table
from calib.tables import NAMED, Fits
from costmodel.errors import TpcostError
from costmodel.profile import SCHEMA_VERSION

__all__ = ["Assembler", "SPECS", "SpecError", "committed_fits", "family_trees", "load_specs"]


class Assembler:
    """The built-in profile trees from `specs` and the committed results `fits` (each stage
    cached)."""

    def __init__(self, specs: dict[str, dict], fits: Fits):
        self.specs, self.fits, self._building = specs, fits, []
        self._bases: dict[str, dict] = {}
        self._fused_trees: dict[str, dict] = {}

    def spec(self, name: str) -> dict:
        if name not in self.specs:
            by = f"{self.specs[self._building[-1]]['_path']}: " if self._building else ""
            raise SpecError(f"{by}no GPU spec {name!r} (calib/gpus/{name}.toml)")
        if name in self._building:
            raise SpecError(
                f"{self.specs[name]['_path']}: inherits from itself "
                f"({' -> '.join(self._building + [name])})"
            )
        return self.specs[name]

    def base(self, name: str) -> dict:
        if name not in self._bases:
            spec = self.spec(name)
            self._building.append(name)
            try:
                self._bases[name] = self._base(spec)
            finally:
                self._building.pop()
        return self._bases[name]

    def _base(self, spec: dict) -> dict:
        name, parent = spec["name"], spec.get("inherits")
        if parent is None:
            tree = {"schema_version": SCHEMA_VERSION}
        elif spec.get("inherit_stage", "base") == "fused":
            tree = copy.deepcopy(self.fused(parent))
        else:
            tree = copy.deepcopy(self.base(parent))
        for i, step in enumerate(spec.get("step", [])):
            where = f"{spec['_path']} step {i + 1}"
            try:
                tree = self._step(tree, step, where)
            except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as e:
                raise SpecError(f"{where}: cannot apply it ({type(e).__name__}: {e})") from None
        if "fit_inputs" in spec:
            self._check_inputs(tree, spec["fit_inputs"], name)
        return tree

    def _step(self, tree: dict, step: dict, where: str) -> dict:
        fits = self.fits
        if "set" in step:
            node, leaf = at_path(tree, step["set"], create=True)
            node[leaf] = table(step.get("table", {}), fits, where)
        elif "update" in step:
            node, leaf = at_path(tree, step["update"])
            vals = table({**node[leaf], **step.get("values", {})}, fits, where)
            pre, suf = vals.pop("source_prefix", ""), vals.pop("source_suffix", "")
            new = {**node[leaf], **vals}
            if pre or suf:
                new["source"] = pre + new["source"] + suf
            node[leaf] = new
        elif "fit" in step:
            if step["fit"] not in NAMED:
                raise SpecError(
                    f"{where}: no named fit {step['fit']!r} (calib/tables.py: {', '.join(NAMED)})"
                )
            tree = NAMED[step["fit"]](tree, fits)
        elif "scale_collectives" in step:
            src = self.base(step["scale_collectives"])
            link = tree["interconnect"]["link_bw_bytes_per_s"]
            ratio = step.get("ratio", link / src["interconnect"]["link_bw_bytes_per_s"])
            keep = step.get("keep", list(src["collectives"]))
            tree["collectives"] = scaled_collectives(
                {k: v for k, v in src["collectives"].items() if k in keep}, ratio, step["why"]
            )
        elif "one_ring" in step:
            tree["collectives"] = one_ring(tree["collectives"])
        elif "ring_pull" in step:
            link = (
                tree["interconnect"]["link_bw_bytes_per_s"]
                if step["ring_pull"] is True
                else step["ring_pull"]
            )
            why = step.get("why", "the H100's ring busBW/link ratio")
            tree["asynctp"]["_copy"] = sec(
                f"assumed: copy-engine pull at {RING} x {link / 1e9:.0f} GB/s per peer ({why})",
                "assumed",
                copy_engine_bw_bytes_per_s=RING * link,
            )
        elif "carry" in step:
            for path in step["carry"]:
                node, leaf = at_path(tree, path)
                tables = (
                    [node[leaf]]
                    if "tier" in node[leaf]
                    else [e for per in node[leaf].values() for e in per.values()]
                )
                for t in tables:
                    if t["tier"] != "assumed":
                        t["source"], t["tier"] = step["prefix"] + t["source"], "assumed"
        else:
            node, leaf = at_path(tree, step["drop"])
            node.pop(leaf, None)
        return tree

    def _check_inputs(self, tree: dict, key: str, name: str) -> None:
        """Refuse datasheet values other than those the committed GEMM fit of `key` ran at."""
        if key not in self.fits.comps["inputs"]:
            raise SpecError(
                f"{self.specs[name]['_path']}: fit_inputs {key!r} names no GEMM fit "
                "(calib/components.py "
                f"FIT_INPUTS: {', '.join(self.fits.comps['inputs'])})"
            )
        want = self.fits.comps["inputs"][key]
        try:
            got = {
                "peak_bf16_flops_per_s": tree["compute"]["peak_flops_per_s"]["bf16"],
                "hbm_bw_bytes_per_s": tree["memory"]["hbm_bw_bytes_per_s"],
                "sm_count": tree["identity"]["sm_count"],
            }
        except KeyError as e:
            raise SpecError(
                f"{self.specs[name]['_path']}: fit_inputs needs the datasheet value {e}"
            ) from None
        if got != want:
            raise TpcostError(
                f"{key} datasheet values {got} differ from those {CR.COMPONENT_FITS.name} was "
                "fitted at "
                f"({want}): update calib/components.py FIT_INPUTS and run {CR.COMPONENT_CMD}"
            )

    def start_tree(self, name: str) -> dict:
        """`name`'s base with torch's AsyncTP terms at their priors: a family fit's start tree."""
        return S.asynctp_section(self.base(name), S.BARRIER_PRIOR, S.HOST_OP)

    def family_trees(self) -> dict:
        """Every family fit's start trees: family -> {GPU: start tree} of the specs with [fused]
        start = true."""
        out: dict = {}
        for name, spec in self.specs.items():
            f = spec.get("fused", {})
            if f.get("start"):
                out.setdefault(f["family"], {})[name] = self.start_tree(name)
        return out

    def fused(self, name: str) -> dict:
        """base, then the [fused] section; without the family fits (their own start trees) the base
        alone."""
        if name not in self._fused_trees:
            tree = copy.deepcopy(self.base(name))
            f = self.specs[name].get("fused")
            try:
                self._fused_trees[name] = (
                    tree if f is None or self.fits.family is None else self._fused(tree, f)
                )
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise SpecError(
                    f"{self.specs[name]['_path']} [fused]: cannot apply it ({type(e).__name__}: "
                    f"{e})"
                ) from None
        return self._fused_trees[name]

    def _fused(self, tree: dict, f: dict) -> dict:
        fits = self.fits
        for fit in f.get("fits", []):
            if fit not in NAMED:
                raise KeyError(f"no named fit {fit!r}")
            tree = NAMED[fit](tree, fits)
        fam = CR.fit_from_json(fits.family["fits"][f["family"]])
        terms = {t: S.fit_term(fam, None, *FAMILY_TERMS[t]) for t in f.get("terms", ["sync"])}
        if "carried" in f:
            terms = {t: S.assumed(v, f["carried"]) for t, v in terms.items()}
        host = (
            S.fit_term(
                fam,
                f["host"],
                "asynctp.host_op_s",
                f"the {f['host']} host's issue time per torch call",
            )
            if "host" in f
            else S.HOST_OP
        )
        tree = S.asynctp_section(tree, terms["sync"], host)
        if "pull" in terms:
            tree = S.with_pull(tree, terms["pull"])
        if "slowdown" in terms:
            tree = S.with_slowdown(tree, terms["slowdown"])
        if "rs_exposure" in terms:
            tree = S.with_rs_exposure(tree, terms["rs_exposure"])
        if "gb200_rs" in f:
            note = f["gb200_rs"] if isinstance(f["gb200_rs"], str) else None
            tree = S.flashinfer_gb200_rs(
                tree, fam, fits.family["with"]["b200_nccl_all_reduce_tp2"], note
            )
        if "nccl_regimes" in f:
            r = f["nccl_regimes"]
            tree = nccl_regimes(
                tree, fits.comps["nccl_regimes"][r["fit"]], r["tier"], r.get("note", "")
            )
        if "calibrated" in f:
            c = f["calibrated"]
            tree = S.calibrated_overrides(
                tree, fits.gpu_checks.get(c["from"]), ROOT, c.get("keys"), c.get("note", "")
            )
        if "nvlink" in f and fits.kernel is not None:
            tree = S.kernel_section(tree, fits.kernel, fits.band, f["nvlink"])
        return tree

    def profile(self, name: str) -> dict:
        """The profile tree of `name`: fused, vLLM's custom RS/AG backends, the model error, the HBM
        capacity."""
        tree = custom_reduce_scatter(self.fused(name))
        if self.fits.band is not None:
            tree["asynctp"]["_time_scale"] = S.model_error_table(
                self.fits.band, "torch's fused ops"
            )
        cap = self.spec(name).get("capacity")
        if cap is not None:
            tree["memory"]["_capacity"] = sec(
                cap["source"], "datasheet", hbm_capacity_bytes=cap["hbm_capacity_bytes"]
            )
        return round_tree(tree)

    def profiles(self) -> dict[str, dict]:
        return {name: self.profile(name) for name in self.specs}


def committed_fits(gpu_checks: dict | None = None, kernel: bool = True, band: bool = True) -> Fits:
    """Fits from calib/data: the component fits, the family fits (refused if made from other start
    trees than these specs give), and the kernel fit and band unless left out (the fits that
    themselves read profiles)."""
    comps = CR.load_components()
    start = Assembler(load_specs(), Fits(comps)).family_trees()
    family = CR.load_family_result(start)
    return Fits(
        comps,
        family,
        CR.load_kernel_fit() if kernel else None,
        CR.load_band_fit() if band else None,
        gpu_checks or {},
    )


def family_trees() -> dict:
    """The family fits' start trees from the specs and the committed component fits
    (calib/reference.py)."""
    return Assembler(load_specs(), Fits(CR.load_components())).family_trees()
