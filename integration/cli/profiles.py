"""`tpcost profiles` (list, --keys, --new) and `tpcost models`."""

from __future__ import annotations

from typing import Any

from costmodel.errors import TpcostError
from costmodel.io import JSON_SCHEMA_VERSION, dumps_json


def _new_profile(args) -> int:
    """profiles --new NAME --from PROFILE [--set ...] --out FILE: a profile for new hardware."""
    from costmodel.io import atomic_write_text, check_output_path
    from costmodel.profile import (
        dump_profile,
        load_profile,
        parse_set,
        profile_from_dict,
        profile_to_tree,
        with_overrides,
    )

    if not args.source:
        raise TpcostError("profiles --new needs --from PROFILE (a built-in name or a .toml path)")
    if not args.out:
        raise TpcostError("profiles --new needs --out FILE.toml")
    if not args.new.strip() or any(c in args.new for c in "\n\r\"'"):
        raise TpcostError(f"profiles --new: {args.new!r} is not a usable profile name")
    out = check_output_path(args.out, args.force, "--out", protect=(args.source,))
    if out.suffix != ".toml":
        raise TpcostError(f"--out {out}: a profile is a .toml file")
    base = load_profile(args.source)
    overrides = parse_set(args.set)
    prof = with_overrides(
        base, overrides, source=f"--set when `tpcost profiles --new {args.new}` made this profile"
    )
    tree = profile_to_tree(prof, name=args.new)
    tree["identity"]["display_name"] = f"{args.new} (from {base.name})"
    profile_from_dict(tree, str(out))  # validates before writing
    text = (
        f"# Written by `tpcost profiles --new {args.new} --from {args.source}`"
        + (" " + " ".join(f"--set {x}" for x in args.set) if args.set else "")
        + ".\n"
        "# Values given with --set and the ones derived from them are tier `assumed`; all others "
        "keep their source.\n" + dump_profile(tree)
    )
    atomic_write_text(out, text)
    derived = [k for k in prof.modified if k not in overrides]
    print(
        f"wrote {out}: {args.new} from {base.name}; set {len(overrides)} value(s)"
        + (f", {len(derived)} derived from them (they ride on the link)" if derived else "")
        + f"; use it with `tpcost whatif --gpu {out}`"
    )
    return 0


def cmd_profiles(args) -> int:
    from costmodel.profile import builtin_profile_names, load_profile

    if args.new is not None:
        return _new_profile(args)
    for flag, given in (
        ("--from", args.source),
        ("--set", args.set),
        ("--out", args.out),
        ("--force", args.force),
    ):
        if given:
            raise TpcostError(
                f"profiles {flag}: only --new NAME reads it (profiles --new NAME --from PROFILE "
                "[--set ...] --out FILE.toml)"
            )

    if args.keys is not None:  # a built-in (its name as every --gpu takes it) or a profile file
        p = load_profile(args.keys)
        items = sorted(p.values().items())
        if args.json:
            print(
                dumps_json(
                    {
                        "schema_version": JSON_SCHEMA_VERSION,
                        "profile": p.name,
                        "keys": [
                            {
                                "key": k,
                                "value": v,
                                "tier": p.provenance[k].tier,
                                "sigma_rel": p.provenance[k].sigma_rel,
                                "source": p.provenance[k].source,
                            }
                            for k, v in items
                        ],
                    },
                    indent=2,
                )
            )
            return 0
        for k, value in items:
            prm = p.provenance[k]
            print(f"{k} = {value:g}  [{prm.tier}] {prm.source}")
        return 0
    rows: list[dict[str, Any]] = []
    for name in builtin_profile_names():
        p = load_profile(name)
        rows.append(
            {
                "name": name,
                "display_name": p.identity.display_name,
                "compute_capability": p.identity.compute_capability,
                "interconnect": p.kind,
                "tier": p.tier,
                "tier_counts": p.tier_counts(),
            }
        )
    if args.json:
        print(dumps_json({"schema_version": JSON_SCHEMA_VERSION, "profiles": rows}, indent=2))
        return 0
    print(
        f"{'name':14s} {'device':40s} {'cc':5s} {'interconnect':12s} {'weakest tier':22s} values "
        "by tier"
    )
    for r in rows:
        counts = ", ".join(f"{k} {v}" for k, v in r["tier_counts"].items() if v)
        print(
            f"{r['name']:14s} {r['display_name']:40s} {r['compute_capability']:5s} "
            f"{r['interconnect']:12s} {r['tier']:22s} {counts}"
        )
    return 0


def cmd_models(args) -> int:
    from costmodel.moe import load_moe_model
    from costmodel.shapes import (
        builtin_model_config,
        builtin_model_names,
        builtin_ep_model_names,
        load_model,
    )

    rows = []
    for name in builtin_model_names():
        s = load_model(name)
        rows.append(
            {
                "name": name,
                "source": builtin_model_config(name).get("_name_or_path"),
                "hidden": s.hidden,
                "intermediate": s.intermediate,
                "heads": s.num_heads,
                "kv_heads": s.num_kv_heads,
                "head_dim": s.head_dim,
                "layers": s.num_layers,
                "vocab": s.vocab,
                "moe": s.is_moe,
                "priced_by": "whatif",
            }
        )
    for name in sorted(set(builtin_ep_model_names()) - set(builtin_model_names())):
        m = load_moe_model(name)
        rows.append(
            {
                "name": name,
                "source": builtin_model_config(name).get("_name_or_path"),
                "hidden": m.hidden,
                "intermediate": m.dense_intermediate,
                "heads": m.num_heads,
                "kv_heads": m.num_kv_heads,
                "head_dim": m.head_dim,
                "layers": m.num_layers,
                "vocab": m.vocab,
                "moe": True,
                "priced_by": "ep",
            }
        )
    if args.json:
        print(dumps_json({"schema_version": JSON_SCHEMA_VERSION, "models": rows}, indent=2))
        return 0
    print(
        f"{'name':16s} {'hidden':>6s} {'inter':>6s} {'heads':>5s} {'kv':>3s} {'hd':>4s} "
        f"{'layers':>6s} {'vocab':>7s}  config from"
    )
    for r in rows:
        print(
            f"{r['name']:16s} {r['hidden']:6d} {r['intermediate']:6d} {r['heads']:5d} "
            f"{r['kv_heads']:3d} "
            f"{r['head_dim']:4d} {r['layers']:6d} {r['vocab']:7d}  "
            f"https://huggingface.co/{r['source']}"
            + ("  (MLA: tpcost ep)" if r["priced_by"] == "ep" else "")
        )
    return 0


def register(sub) -> None:
    """Add `profiles` and `models` to the CLI root's subparsers."""
    p = sub.add_parser("profiles", help="list built-in GPU profiles with provenance")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument(
        "--keys", metavar="NAME", help="list every quantity of one profile with its source"
    )
    p.add_argument(
        "--new",
        metavar="NAME",
        help="write a new profile NAME from --from plus --set overrides to --out",
    )
    p.add_argument(
        "--from",
        dest="source",
        metavar="PROFILE",
        help="the profile --new starts from (built-in or .toml)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="QUANTITY=VALUE",
        help="with --new: override one quantity (the link's dependants are rescaled as whatif's "
        "--set does)",
    )
    p.add_argument("--out", metavar="FILE.toml", help="with --new: where to write the profile")
    p.add_argument("--force", action="store_true", help="with --new: replace an existing --out")
    p.set_defaults(func=cmd_profiles)
    m = sub.add_parser("models", help="list built-in model shapes")
    m.add_argument("--json", action="store_true", help="print JSON instead of the table")
    m.set_defaults(func=cmd_models)
