"""The committed results of calib's fits (calib/data/*.json): where they live, the command that
makes each, and their readers. tools/build_profiles.py assembles the built-in profiles from these
and the datasheets; it imports this module and no fitting code.

    python -m calib.components        # component_fits.json   (GEMM, collective and kernel-time
    fits, readings) python -m calib.reference         # family_fit.json       (the joint fused-op
    fits per GPU family, from the
                                      #                        start trees calib/assemble.py builds
                                      from the specs)
    python -m calib.kernel_fit        # kernel_fit.json       (the single-kernel GEMM+RS/AR joint
    fit) python -m calib.p2p_fit           # p2p_fit.json          (Hopper's put/ring kernels:
    NVLink4 P2P terms) python -m calib.band              # band_fit.json         (the model error,
    nested leave-one-source-out) python tools/build_profiles.py    # the profiles; --refit runs the
    fits above first, in this order
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from costmodel.errors import TpcostError

DATA = Path(__file__).resolve().parent / "data"
COMPONENT_FITS = DATA / "component_fits.json"
COMPONENT_CMD = "python -m calib.components"
FAMILY_FIT = DATA / "family_fit.json"
# refits FAMILY_FIT from the specs' start trees (calib.assemble)
FAMILY_CMD = "python -m calib.reference"
KERNEL_FIT = DATA / "kernel_fit.json"
KERNEL_CMD = "python -m calib.kernel_fit"
# the Hopper put/ring kernels (calib/p2p_fit.py): NVLink4's P2P efficiency
P2P_FIT = DATA / "p2p_fit.json"
P2P_CMD = "python -m calib.p2p_fit"
BAND_FIT = DATA / "band_fit.json"
BAND_CMD = "python -m calib.band"
SHARED_KEY = "*"  # the GPU-side (shared) terms' key in the family JSON (None in a fit's dicts)
REBUILD = "python tools/build_profiles.py"


def profile_digits(v: float) -> float:
    """v at the 4 significant digits the built-in profiles hold (tools/build_profiles.py writes them
    so)."""
    return float(f"{v:.4g}")


def _read(path: Path, cmd: str) -> dict:
    if not path.exists():
        raise TpcostError(f"{path} is missing: run {cmd}")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise TpcostError(f"{path}: not readable JSON ({e}): run {cmd}") from None


def load_components() -> dict:
    """The committed component fits: name -> entry (values, source, tier, ...) as calib.components
    wrote them."""
    return _read(COMPONENT_FITS, COMPONENT_CMD)["fits"]


def load_kernel_fit() -> dict:
    """The committed single-kernel joint fit (calib/kernel_fit.py)."""
    return _read(KERNEL_FIT, KERNEL_CMD)


def load_p2p_fit() -> dict:
    """The committed fit of Hopper's put/ring kernels (calib/p2p_fit.py)."""
    return _read(P2P_FIT, P2P_CMD)


def load_band_fit() -> dict:
    """The committed model error of the band (calib/band.py: nested leave-one-source-out)."""
    return _read(BAND_FIT, BAND_CMD)


def trees_digest(trees: dict) -> str:
    """sha256 of the start trees (which trees a committed fit was made from)."""
    return hashlib.sha256(json.dumps(trees, sort_keys=True).encode()).hexdigest()


def fit_to_json(fit: dict) -> dict:
    """A FamilyFit result as strict JSON: the shared terms under SHARED_KEY, an unidentified term's
    sigma null."""

    def keyed(d: dict) -> dict:
        return {SHARED_KEY if k is None else k: v for k, v in d.items()}

    sig = {
        sid: {k: (None if not math.isfinite(s) else s) for k, s in per.items()}
        for sid, per in fit["sigma_rel"].items()
    }
    return {**fit, "values": keyed(fit["values"]), "sigma_rel": keyed(sig)}


def fit_from_json(d: dict) -> dict:
    """fit_to_json's inverse."""

    def keyed(x: dict) -> dict:
        return {None if k == SHARED_KEY else k: v for k, v in x.items()}

    sig = {
        sid: {k: (float("inf") if s is None else s) for k, s in per.items()}
        for sid, per in d["sigma_rel"].items()
    }
    return {**d, "values": keyed(d["values"]), "sigma_rel": keyed(sig)}


def load_family_result(trees: dict | None = None) -> dict:
    """The committed family-fit file (FAMILY_FIT) as JSON; with `trees`, one clear error where it
    was fitted to other start trees."""
    d = _read(FAMILY_FIT, FAMILY_CMD)
    if trees is not None and d.get("trees_sha256") != trees_digest(trees):
        raise TpcostError(
            f"{FAMILY_FIT.name} was fitted to other start trees than the GPU specs give: run "
            f"{FAMILY_CMD}, then {REBUILD} (or {REBUILD} --refit)"
        )
    return d


def load_family_fits(trees: dict | None = None) -> dict:
    """The committed family fits (family -> FamilyFit result), checked against `trees` as
    load_family_result."""
    return {family: fit_from_json(f) for family, f in load_family_result(trees)["fits"].items()}


def run_and_write(argv: list[str] | None, doc: str, out: Path, run) -> dict:
    """A fit's command line: `--out PATH` (default `out`), run() once, its JSON written atomically
    (strict: no NaN); returns the result for the caller to print."""
    import argparse

    from costmodel.io import atomic_write_text, doc_summary, dumps_json

    ap = argparse.ArgumentParser(description=doc_summary(doc))
    ap.add_argument(
        "--out", type=Path, default=out, help="where the fit's JSON goes (default: %(default)s)"
    )
    args = ap.parse_args(argv)
    res = run()
    atomic_write_text(args.out, dumps_json(res) + "\n")
    return res
