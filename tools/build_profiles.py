"""Write the built-in hardware profiles costmodel/profiles/*.toml from the GPU specs
(calib/gpus/*.toml) and the committed fits (calib/data), through calib/assemble.py.

    python tools/build_profiles.py            # rewrite the TOML files
    python tools/build_profiles.py --check    # exit 1 if a file differs (tests run this)
    python tools/build_profiles.py --refit    # rerun every fit first (components, families,
    kernels, band), once each

Values come from datasheets (URL, in the spec files), from the committed fits to data/reference
(source_id named), from this project's GPU runs committed as calib/data/<profile>-gpu-check (every
committed one, or those --gpu-check names; provenance named), or are assumed (derivation named).
Tier per docs/model.md §7. Adding a GPU is one spec file (docs/profiles.md); the builder holds no
GPU of its own.
"""

from __future__ import annotations

import argparse
import math
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from costmodel.errors import TpcostError  # noqa: E402
from costmodel.io import atomic_write_text  # noqa: E402
from costmodel.profile import dump_profile, profile_from_dict  # noqa: E402
from costmodel import formulas as F  # noqa: E402
from calib import assemble as A  # noqa: E402  (the generic assembler: specs + committed fits, no fitting code)

CHECK_REL_TOL = 1e-3  # values are written with 4 significant digits
OUT = ROOT / "costmodel" / "profiles"
# each reads only those before it (p2p_fit: Hopper's put/ring kernels, not in the profiles yet)
REFIT = ("calib.components", "calib.reference", "calib.kernel_fit", "calib.p2p_fit", "calib.band")
# these read the built profiles: written before the first of them
READ_BUILT = (
    "calib.p2p_fit",
    "calib.band",
)


def build_all(gpu_checks=None, specs=None) -> dict:
    """Every profile tree of the specs (default: calib/gpus); the committed single-GPU calibrations
    `gpu_checks` names (profile name -> fit.json) are folded in, nothing else."""
    return A.Assembler(specs or A.load_specs(), A.committed_fits(gpu_checks)).profiles()


def same_values(a, b, rel=CHECK_REL_TOL, path=""):
    """First difference between two parsed profile trees ('' if none): numbers compare with a
    relative tolerance, everything else exactly."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}{k}: only in {'the file' if k in a else 'the generator'}"
            d = same_values(a[k], b[k], rel, f"{path}{k}.")
            if d:
                return d
        return ""
    num = (int, float)
    if (
        isinstance(a, num)
        and isinstance(b, num)
        and not isinstance(a, bool)
        and not isinstance(b, bool)
    ):
        return (
            ""
            if math.isclose(a, b, rel_tol=rel, abs_tol=0.0)
            else f"{path[:-1]}: file {a!r}, generator {b!r}"
        )
    return "" if a == b else f"{path[:-1]}: file {a!r}, generator {b!r}"


CONSISTENCY_MSG_BYTES = 64 * F.MiB  # a message where every collective is bandwidth-bound
# t_AR / (t_RS + t_AG): an all-reduce is a reduce-scatter and an all-gather
CONSISTENCY_BAND = (
    0.5,
    1.5,
)


def inconsistent_collectives(name, tree) -> list[str]:
    """NCCL entries at one TP whose all-reduce is far slower or faster than its reduce-scatter +
    all-gather at 64 MiB (outside CONSISTENCY_BAND): a fit to latency-bound points, or an assumption
    contradicting a fit; and any collective whose bus bandwidth exceeds the link's (busBW is at most
    the per-GPU link bandwidth: nccl-tests' convention; NVLS all-reduce up to 2(W-1)/(W+1) x it)."""
    prof = profile_from_dict(tree, name)
    out = []
    link = prof.interconnect.link_bw_bytes_per_s
    for impl, per_tp in prof.collectives.items():
        for tp, c in per_tp.items():
            # NVLS all-reduce reduces in the switch: each GPU sends S and receives S instead of the
            # ring's 2(W-1)/W·S each way, so its busBW may reach 2(W-1)/(W+1) x the link
            # (docs/model.md §3)
            nvls = impl.startswith("nccl_all_reduce") and prof.kind == "nvswitch" and tp >= 4
            cap = link * (2.0 * (tp - 1) / (tp + 1) if nvls else 1.0)
            if c.bus_bw_bytes_per_s > cap * (1 + 1e-9):
                out.append(
                    f"{name} {impl} tp{tp}: busBW {c.bus_bw_bytes_per_s / 1e9:.0f} GB/s above the "
                    "link's "
                    f"{link / 1e9:.0f} GB/s (lower collectives.{impl}.tp{tp}.bus_bw_bytes_per_s, "
                    "or raise "
                    "interconnect.link_bw_bytes_per_s, in the spec)"
                )
    s = float(CONSISTENCY_MSG_BYTES)
    for tp in prof.collective_tps("nccl_all_reduce"):
        if tp not in prof.collective_tps("nccl_reduce_scatter") or tp not in prof.collective_tps(
            "nccl_all_gather"
        ):
            continue
        ar = F.t_all_reduce_s(s, *prof.collective("nccl_all_reduce", tp), tp)
        rs = F.t_reduce_scatter_s(s, *prof.collective("nccl_reduce_scatter", tp), tp)
        ag = F.t_all_gather_s(s, *prof.collective("nccl_all_gather", tp), tp)
        ratio = float(ar / (rs + ag))
        if not CONSISTENCY_BAND[0] <= ratio <= CONSISTENCY_BAND[1]:
            which = (
                "nccl_all_reduce"
                if ratio < CONSISTENCY_BAND[0]
                else "nccl_reduce_scatter / nccl_all_gather"
            )
            out.append(
                f"{name} tp{tp}: all-reduce {ar * 1e6:.0f} us vs reduce-scatter + all-gather "
                f"{(rs + ag) * 1e6:.0f} us at 64 MiB (ratio {ratio:.2f}, outside "
                f"{CONSISTENCY_BAND[0]:g}-"
                f"{CONSISTENCY_BAND[1]:g}): the spec's {which} tp{tp} bus_bw_bytes_per_s (or its "
                "scale_collectives) is the one to change"
            )
    return out


def range_line(prof) -> str:
    """One line: every quantity of `prof` lies inside its plausible range, and the dimensioned one
    closest to an edge (in decades, log10 of value/edge; 0 = on it)."""
    from costmodel.profile import value_range

    def margin(key, v):
        r = value_range(key)
        lo = math.inf if r.lo <= 0 or v <= 0 else math.log10(v / r.lo)
        return min(lo, math.log10(r.hi / v) if v > 0 else math.inf)

    # all checked on load; the edge reported among the dimensioned ones (fractions sit near 1)
    vals = prof.values()
    key = min((k for k in vals if value_range(k).unit), key=lambda k: margin(k, vals[k]))
    r = value_range(key)
    return (
        f"{prof.name:14s} {len(vals):3d} quantities inside their ranges; closest to an edge: {key} "
        "= "
        f"{vals[key]:g} in {r.text()} ({margin(key, vals[key]):.2f} decades)"
    )


def gpu_check_args(dirs) -> dict:
    """--gpu-check DIR ... as profile name -> fit.json: each a <profile>-gpu-check folder of a
    built-in profile whose fit.json git tracks (committed data only: an untracked result never
    changes a built-in profile)."""
    import subprocess

    out = {}
    for d in dirs:
        path = Path(d).resolve()
        name = path.name.removesuffix("-gpu-check")
        fit = path / "fit.json"
        if not path.name.endswith("-gpu-check") or not (OUT / f"{name}.toml").exists():
            raise ValueError(f"--gpu-check {d}: expected calib/data/<built-in profile>-gpu-check")
        if not fit.exists():
            raise ValueError(f"--gpu-check {d}: no fit.json (run calib/gpu_check.sh first)")
        tracked = (
            subprocess.run(
                ["git", "-C", str(ROOT), "ls-files", "--error-unmatch", str(fit)],
                capture_output=True,
            ).returncode
            == 0
        )
        if not tracked:
            raise ValueError(
                f"--gpu-check {d}: {fit.name} is not committed (commit it with its provenance "
                "first)"
            )
        out[name] = fit
    return out


def committed_gpu_checks() -> list[Path]:
    """Every calib/data/<built-in profile>-gpu-check folder whose fit.json git tracks: what the
    shipped profiles fold."""
    import subprocess

    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "calib/data/*-gpu-check/fit.json"],
        capture_output=True,
        text=True,
    ).stdout.split()
    return sorted(
        (ROOT / f).parent
        for f in out
        if (OUT / f"{Path(f).parent.name.removesuffix('-gpu-check')}.toml").exists()
    )


def write_profiles(checks: dict, specs: dict, out: Path, check: bool) -> list[str]:
    """Assemble every spec's profile and write it to `out` (atomically), or with `check` compare it
    with the file there; the problems found (stale files, inconsistent collectives)."""
    bad, texts = [], {}
    for name, tree in build_all(checks, specs).items():
        spec = Path(specs[name]["_path"]).resolve()
        spec = spec.relative_to(ROOT) if spec.is_relative_to(ROOT) else spec
        text = (
            f"# Generated by tools/build_profiles.py from {spec}, data/reference (source_id) and "
            "calib/data.\n"
            "# Do not edit by hand: change the spec and rerun the builder.\n" + dump_profile(tree)
        )
        try:  # validates, the plausible ranges included (docs/profiles.md)
            prof = profile_from_dict(tree, name)
        except TpcostError as e:
            raise A.SpecError(
                f"{specs[name]['_path']}: the profile it builds is refused: {e}"
            ) from None
        if prof.name != name:
            raise A.SpecError(
                f"{specs[name]['_path']}: the profile it builds is named {prof.name!r} (its "
                f'parent\'s): give it its own, a [[step]] update = "identity" with name = "{name}"'
            )
        bad += [f"inconsistent collectives: {x}" for x in inconsistent_collectives(name, tree)]
        path = out / f"{name}.toml"
        if check:
            print(range_line(prof))
            diff = (
                same_values(tomllib.loads(path.read_text()), tomllib.loads(text))
                if path.exists()
                else "missing"
            )
            if diff:
                bad.append(f"out of date: {name} ({diff}) (run python tools/build_profiles.py)")
        else:
            texts[path] = text
    if texts and not bad:  # a failed build writes nothing (issue 61)
        out.mkdir(parents=True, exist_ok=True)
        for path, text in texts.items():
            atomic_write_text(path, text)
    if check and out == OUT:
        bad += [
            f"no spec: {p.name} (calib/gpus/{p.stem}.toml is gone: delete the profile)"
            for p in sorted(out.glob("*.toml"))
            if p.stem not in specs
        ]
    return bad


def refit(checks: dict) -> int:
    """Every fit once, in the order each reads the ones before it; the P2P kernel fit and the band
    read built profiles, so they are written before them (and again after, with the band's model
    error)."""
    import importlib

    written = False
    for mod in REFIT:
        if mod in READ_BUILT and not written:
            write_profiles(checks, A.load_specs(), OUT, False)
            written = True
        print(f"build_profiles: python -m {mod}", flush=True)
        rc = importlib.import_module(mod).main([])
        if rc:
            return rc
    return 0


def main(argv=None) -> int:
    from costmodel.io import doc_summary

    ap = argparse.ArgumentParser(description=doc_summary(__doc__))  # the whole first sentence
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if a file's parsed values differ from the generator's (relative tolerance "
        f"{CHECK_REL_TOL:g})",
    )
    mode.add_argument(
        "--refit",
        action="store_true",
        help=f"rerun every fit first, once each ({', '.join(REFIT)}), then write the profiles",
    )
    ap.add_argument(
        "--gpu-check",
        action="append",
        default=[],
        metavar="DIR",
        help="fold only these committed single-GPU calibrations (calib/data/<profile>-gpu-check, "
        "with "
        "its fit.json) into their profiles (default: every committed one; an untracked result is "
        "never folded)",
    )
    ap.add_argument(
        "--spec-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="GPU specs from DIR too (*.toml, docs/profiles.md), beside calib/gpus; with --out",
    )
    ap.add_argument(
        "--out",
        metavar="DIR",
        help="write (or --check) the profiles in DIR, not costmodel/profiles",
    )
    args = ap.parse_args(argv)
    try:
        if args.spec_dir and not args.out:
            raise ValueError(
                "--spec-dir needs --out DIR: the built-in profiles are built from calib/gpus alone"
            )
        if args.out and args.refit:
            raise ValueError("--refit writes the built-in profiles; --out cannot take it elsewhere")
        for d in args.spec_dir:
            if not Path(d).is_dir():
                raise ValueError(f"{d}: not a directory")
        if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
            raise ValueError(f"--out {args.out}: not a directory")
        if args.check and args.out and not Path(args.out).is_dir():
            raise ValueError(f"--out {args.out}: no such directory to check")
        checks = gpu_check_args(args.gpu_check or committed_gpu_checks())
        specs = A.load_specs([A.SPECS, *args.spec_dir])
    except (ValueError, TpcostError) as e:
        print(f"build_profiles: error: {e}", file=sys.stderr)
        return 2
    try:
        if args.refit and refit(checks):
            return 1
        bad = write_profiles(checks, specs, Path(args.out) if args.out else OUT, args.check)
    except A.SpecError as e:
        print(f"build_profiles: error: {e}", file=sys.stderr)
        return 2
    except TpcostError as e:  # --check: the committed state fails its check (1); a build: bad input
        print(f"build_profiles: error: {e}", file=sys.stderr)
        return 1 if args.check else 2
    # a build that would write inconsistent profiles: one line, nothing written
    if bad and not args.check:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        print(f"build_profiles: error: {bad[0]}{more}", file=sys.stderr)
        return 2
    if bad:  # --check: every stale profile, one per line
        print("\n".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
