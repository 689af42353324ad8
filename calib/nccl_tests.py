"""`tpcost calibrate --from-nccl-tests FILE ... --from PROFILE --out OUT.toml`: a profile from
nccl-tests logs.

Operators who own a cluster have usually run nccl-tests (`all_reduce_perf`, `all_gather_perf`,
`reduce_scatter_perf`): a measured table of their own nodes. This reads the standard text output (no
torch):

- the `# nThread … nGpus … minBytes … maxBytes …` header;
- the `#  Rank  N Group  G Pid  P on HOST device  D [0x..] NAME` lines (rank count, host count, GPU
name);
- the table, in both layouts: older releases print `size count type redop time algbw busbw error`
per
  out-of-place / in-place half, newer ones `size count type redop root time algbw busbw #wrong`. An
  NCCL version line may be absent.

Which collective a log holds is read from the table itself: `redop` none is an all-gather; with a
reduction, count·elem = size is an all-reduce and count·elem·ranks = size a reduce-scatter. Each
log's latency and bus bandwidth are fitted (calib.fit.fit_latency_bandwidth, the nccl-tests busBW
convention, out-of-place times) into `collectives.nccl_<op>.tp<ranks>` of the `--from` profile, tier
`calibrated`, with provenance from the header; every other value keeps its prior, and the profile
says which. The log's own collective replaces the prior's at its rank count: the prior's NCCL regime
curves of that collective and TP (costmodel.ops.NCCL_REGIMES, another machine's) are dropped, never
left to undercut the measurement. A log must name the GPU `--from` describes (its
device_name_patterns), unless `--allow-other-gpu` says it is intended; the source then says
"measured on".
"""

from __future__ import annotations

import re
from pathlib import Path

from costmodel.errors import TpcostError

ELEM_BYTES = {
    "int8": 1,
    "uint8": 1,
    "char": 1,
    "half": 2,
    "float16": 2,
    "bfloat16": 2,
    "bf16": 2,
    "float": 4,
    "float32": 4,
    "int32": 4,
    "uint32": 4,
    "int": 4,
    "double": 8,
    "float64": 8,
    "int64": 8,
    "uint64": 8,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "f8e4m3": 1,
    "f8e5m2": 1,
}
_RANK = re.compile(
    r"^#\s*Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+\[[^\]]*\]\s+(.+?)\s*$"
)
_HEADER = re.compile(r"^#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes\s+(\d+)\s+maxBytes\s+(\d+)")
_GRAPH = re.compile(r"\bgraph:\s*(\d+)")
# a fitted busBW below half the prior's: NVLS off or links degraded (the other priors stay)
BUSBW_DEGRADED = 0.5
_VERSION = re.compile(r"NCCL version\s+([\d.]+)")


_OUT_OF_BOUNDS = re.compile(r"Out of bounds values\s*:\s*(\d+)")
# NVLS all-reduce measures up to ~1.07x the per-direction link (MLENG_AR_8xH200 at 16 GiB)
BUSBW_OVER_LINK_MAX = 1.5


# '1M', '4KiB', '2GB': a size with its unit, not bytes
_SUFFIXED = re.compile(r"^\d+(\.\d+)?[KMGTkmgt]i?[Bb]?$")
MIN_TIME_US = 0.1  # 100 ns: below a kernel launch; a smaller time is a corrupted row


def parse_nccl_tests(text: str, where: str) -> dict:  # noqa: C901 (one pass over the log; a branch per line kind)
    """{op, ranks, hosts, gpu, nccl, rows: [(size_bytes, time_s)]} of one nccl-tests log; one-line
    errors."""
    header, graph = None, None
    ranks, hosts, gpus = set(), set(), set()
    rows, nccl = [], None
    layout = None
    for i, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip()
        if not line.strip():
            continue
        m = _HEADER.match(line)
        if m:
            header = tuple(int(x) for x in m.groups())
            g = _GRAPH.search(line)
            graph = None if g is None else int(g.group(1)) > 0
            continue
        m = _RANK.match(line)
        if m:
            ranks.add(int(m.group(1)))
            hosts.add(m.group(4))
            gpus.add(m.group(6))
            continue
        m = _VERSION.search(line)
        if m:
            nccl = m.group(1)
        m = _OUT_OF_BOUNDS.search(line)
        if m and (int(m.group(1)) or "FAILED" in line.upper()):
            raise TpcostError(
                f"{where}:{i}: nccl-tests marked this run failed ({line.strip().lstrip('# ')}); a "
                "failed "
                "run is not a calibration"
            )
        if line.lstrip().startswith("#"):
            low = line.lower()
            if "redop" in low and "time" in low:
                layout = "root" if " root " in f" {low} " else "old"
            continue
        cells = line.split()
        if not cells[0].isdigit():  # NCCL's version line, MPI or driver chatter: not a table row
            if layout is not None and _SUFFIXED.match(cells[0]) and len(cells) >= 8:
                raise TpcostError(
                    f"{where}:{i}: size {cells[0]!r} is printed with a unit; nccl-tests prints "
                    "sizes in "
                    "bytes (give the log as nccl-tests wrote it)"
                )
            continue
        if layout is None:
            raise TpcostError(
                f"{where}:{i}: a data row before the table header (is this nccl-tests output?)"
            )
        need = 13 if layout == "root" else 12
        if len(cells) < need - 4:  # at least the out-of-place half
            raise TpcostError(
                f"{where}:{i}: {len(cells)} cells; expected the {layout} nccl-tests layout"
            )
        try:
            size, count = int(cells[0]), int(cells[1])
            dtype, redop = cells[2].lower(), cells[3].lower()
            t_us = float(cells[5] if layout == "root" else cells[4])
        except ValueError:
            raise TpcostError(f"{where}:{i}: size, count or time is not a number") from None
        if not (size > 0 and count > 0 and t_us > 0 and t_us < 1e9):
            raise TpcostError(f"{where}:{i}: size, count and time must be positive")
        if t_us < MIN_TIME_US:
            raise TpcostError(
                f"{where}:{i}: time {cells[5] if layout == 'root' else cells[4]} us is below "
                f"{MIN_TIME_US * 1e3:g} ns; no collective call is that fast (a corrupted log?)"
            )
        if dtype not in ELEM_BYTES:
            raise TpcostError(f"{where}:{i}: unknown data type {cells[2]!r}")
        # the #wrong columns of both halves: nccl-tests' own check of the results
        if layout == "root":
            wrong = [c for c in (cells[8:9] + cells[12:13]) if c.isdigit() and int(c) > 0]
            if wrong:
                raise TpcostError(
                    f"{where}:{i}: nccl-tests counted {wrong[0]} wrong values at size {size}; a "
                    "failed "
                    "run is not a calibration"
                )
        rows.append((size, count, ELEM_BYTES[dtype], redop, t_us * 1e-6))
    if header is None:
        raise TpcostError(
            f"{where}: no '# nThread ... nGpus ... minBytes ... maxBytes' header: not nccl-tests "
            "output"
        )
    if not ranks:
        raise TpcostError(f"{where}: no '#  Rank ... device ...' lines: cannot tell the rank count")
    sizes = {r[0] for r in rows}
    if len(sizes) < 3:
        raise TpcostError(
            f"{where}: {len(rows)} data rows of {len(sizes)} message size(s); the fit needs at "
            "least 3 "
            "distinct sizes to separate latency from bandwidth"
        )
    world = len(ranks)
    ops = set()
    for size, count, elem, redop, _ in rows:
        if redop in ("none", "-"):
            ops.add("all_gather")
        elif count * elem == size:
            ops.add("all_reduce")
        elif count * elem * world == size:
            ops.add("reduce_scatter")
        else:
            raise TpcostError(
                f"{where}: size {size} and count {count} match no all-reduce, all-gather or "
                f"reduce-scatter on {world} ranks (a broadcast or alltoall log?)"
            )
    if len(ops) != 1:
        raise TpcostError(
            f"{where}: rows of several collectives ({', '.join(sorted(ops))}) in one log"
        )
    return {
        "op": ops.pop(),
        "ranks": world,
        "hosts": len(hosts),
        "gpu": sorted(gpus)[0] if gpus else "unknown",
        "nccl": nccl,
        "rows": [(float(r[0]), r[4]) for r in rows],
        "file": where,
        "graph": graph,
    }


REGIME_MIN_SIZES = 8  # a log identifies NCCL's protocol regimes with at least this many sizes ...
# ... spanning this ratio of largest to smallest (LL at KiB, Simple at tens of MiB)
REGIME_MIN_SPAN = 4096
LINE_RMS_ENOUGH = 0.05  # one α-β line within this rms log residual: the log shows no regimes to fit
# the regime envelope is kept only where its rms log residual is below this share of the line's
REGIME_GAIN = 0.7


def fit_log_regimes(log: dict, line_rms: float) -> tuple[dict, float] | None:
    """NCCL's regime curves of one log where its sizes identify them ({suffix: (latency s, busBW
    B/s)}: "_small", "_mid" and "" for an all-reduce, calib.nccl_fit; "_small" (LL) and "" (Simple)
    for a ring all-gather or reduce-scatter, calib.fit.fit_ring_regimes) and the rms log residual;
    None where one line is all they pin down:
    too few sizes or too narrow a span, the one line (rms `line_rms`) already within
    LINE_RMS_ENOUGH, or an envelope that does not beat it by REGIME_GAIN."""
    import numpy as np

    S = np.array([s for s, _ in log["rows"]], dtype=float)
    t = np.array([x for _, x in log["rows"]], dtype=float)
    if (
        len(set(S.tolist())) < REGIME_MIN_SIZES
        or S.max() / S.min() < REGIME_MIN_SPAN
        or line_rms <= LINE_RMS_ENOUGH
    ):
        return None
    if log["op"] == "all_reduce":
        from calib.nccl_fit import fit_regime_curves

        lat, bw, _, _, _, rms = fit_regime_curves([(S, t)], log["ranks"])
        curves = {
            "_small": (float(lat[0]), float(bw[0])),
            "_mid": (float(lat[1]), float(bw[1])),
            "": (float(lat[2]), float(bw[2])),
        }
    else:
        from calib.fit import fit_ring_regimes

        reg, res = fit_ring_regimes(S, t, log["ranks"])
        curves = {
            "_small": (reg["small"]["latency_s"], reg["small"]["bus_bw_bytes_per_s"]),
            "": (reg["large"]["latency_s"], reg["large"]["bus_bw_bytes_per_s"]),
        }
        rms = float(res["rms_log_residual"])
    return (curves, rms) if rms < REGIME_GAIN * line_rms else None


def check_logs(base, logs: list[dict], allow_other_gpu: bool) -> None:
    """The logs describe the machine `base` claims: its GPU (unless allow_other_gpu; the log then
    records 'measured on'), one log per collective and rank count, ranks inside one NVLink
    domain."""
    pats = [x for x in base.identity.device_name_patterns.split("|") if x]
    for log in logs:
        other = log["gpu"] != "unknown" and pats and not any(x in log["gpu"] for x in pats)
        log["measured_on"] = (
            f"; measured on {log['gpu']}, not {base.name}'s GPU (--allow-other-gpu)"
            if other
            else ""
        )
        if other and not allow_other_gpu:
            raise TpcostError(
                f"{log['file']}: measured on {log['gpu']}, but --from {base.name} is a "
                f"{base.identity.display_name or base.name}; give that GPU's profile, or "
                "--allow-other-gpu "
                "if a profile of another GPU is intended"
            )
    if allow_other_gpu and not any(log["measured_on"] for log in logs):
        raise TpcostError(
            f"--allow-other-gpu: no effect (every log ran on {base.name}'s GPU, or does not say "
            "which)"
        )
    seen: dict[tuple, str] = {}
    for log in logs:
        key = (log["op"], log["ranks"])
        if key in seen:
            raise TpcostError(
                f"{log['file']} and {seen[key]} are both nccl_{log['op']} on {log['ranks']} ranks: "
                "give "
                "one log per collective and rank count (the profile holds one entry each)"
            )
        seen[key] = log["file"]
        check_one_domain(base, log)


def check_one_domain(base, log: dict) -> None:
    """Refuse a log whose ranks run on several hosts outside one NVLink domain of `base`: tpcost's
    tp curves are collectives inside one domain (calibrate and collective --log alike)."""
    domain = int(base.interconnect.domain_size)
    if log["hosts"] > 1 and (log["ranks"] > domain or domain <= 8):
        raise TpcostError(
            f"{log['file']}: its {log['ranks']} ranks run on {log['hosts']} hosts, outside one "
            "NVLink "
            f"domain of {base.name} ({domain} GPUs): tpcost's tp entries are collectives inside "
            "one "
            "domain"
        )


def fit_log(base, log: dict, values: dict, provs: dict, fitted: list, warnings: list) -> None:
    """One log's curves into `values` / `provs` (the α-β line, or NCCL's regime curves where its
    sizes identify them), each (table, latency, busBW fit) into `fitted`, a warning where its busBW
    is far below the prior's."""
    from calib.fit import fit_latency_bandwidth
    from costmodel import formulas as F
    from costmodel.profile import Provenance

    factor = float(F.bus_bw_factor(log["op"], log["ranks"]))
    recs = [{"msg_bytes": s, "median_s": t} for s, t in log["rows"]]
    params, res = fit_latency_bandwidth(recs, factor)
    lat, bw = params.get("latency_s"), params.get("bus_bw_bytes_per_s")
    if bw is None:
        raise TpcostError(
            f"{log['file']}: the sizes do not pin down a bus bandwidth (no large messages?)"
        )
    link = float(base.interconnect.link_bw_bytes_per_s)
    if bw["value"] > BUSBW_OVER_LINK_MAX * link:
        raise TpcostError(
            f"{log['file']}: fitted busBW {bw['value'] / 1e9:.0f} GB/s is above "
            f"{BUSBW_OVER_LINK_MAX:g}x "
            f"{base.name}'s link ({link / 1e9:.0f} GB/s per direction; NVLS in-switch reduction "
            "reaches ~1.1x): a log of other hardware, or the wrong --from"
        )
    regime = {
        True: "timed under CUDA graphs (graph: 1)",
        False: "timed eagerly (graph: 0): its latency holds one "
        "launch per call, which vLLM's graph replay does not pay",
        None: "graph mode not printed",
    }[log["graph"]]
    source = (
        f"calibrated: nccl-tests {Path(log['file']).name} ({log['gpu']}, {log['ranks']} ranks on "
        f"{log['hosts']} host(s), NCCL {log['nccl'] or 'version not printed'}, {regime}); "
        "alpha-beta fit, "
        f"rms log residual {res.get('rms_log_residual', 0):.3f} over {len(recs)} "
        f"sizes{log['measured_on']}"
    )
    # latency not pinned down (only large messages): keep the prior's, said in the source
    if lat is None:
        lat = {
            "value": float(base.collective(f"nccl_{log['op']}", log["ranks"])[0]),
            "uncertainty_rel": None,
        }
        source += "; latency kept from the prior (not pinned down)"
    # one curve (the α-β line), or NCCL's regime curves where the sizes identify them (the line then
    # not written)
    curves = {
        "": (lat["value"], bw["value"], lat["uncertainty_rel"], bw["uncertainty_rel"], source)
    }
    regimes = fit_log_regimes(log, float(res.get("rms_log_residual", 0.0)))
    if regimes is not None:
        fits, rms = regimes
        curves = {
            suffix: (
                r_lat,
                r_bw,
                None,
                None,
                source.replace(
                    "alpha-beta fit",
                    f"NCCL regime curve nccl_{log['op']}{suffix} of the lower-envelope fit",
                )
                + f" (envelope rms log residual {rms:.3f})",
            )
            for suffix, (r_lat, r_bw) in fits.items()
        }
    for suffix, (c_lat, c_bw, s_lat, s_bw, src) in curves.items():
        table = f"collectives.nccl_{log['op']}{suffix}.tp{log['ranks']}"
        for leaf, v, sig in (("latency_s", c_lat, s_lat), ("bus_bw_bytes_per_s", c_bw, s_bw)):
            values[f"{table}.{leaf}"] = v
            provs[f"{table}.{leaf}"] = Provenance(
                src, "calibrated", None if sig is None else min(float(sig), 1.0)
            )
        fitted.append((table, c_lat, {"value": c_bw, "uncertainty_rel": s_bw or 0.0}))
    prior_bw = (
        float(base.collective(f"nccl_{log['op']}", log["ranks"])[1])
        if log["ranks"] in base.collective_tps(f"nccl_{log['op']}")
        else None
    )
    if prior_bw and bw["value"] < BUSBW_DEGRADED * prior_bw:
        warnings.append(
            f"  warning: {log['file']}: busBW {bw['value'] / 1e9:.0f} GB/s is below half the "
            "prior's "
            f"{prior_bw / 1e9:.0f} GB/s (NVLS off, or degraded links?): vLLM's custom all-reduce, "
            "symm-mem and FlashInfer curves on the same links keep their (uncalibrated) priors"
        )


def measured_curve(log: dict):
    """The log's points as the profile's [measured.<impl>.tp<W>]
    (costmodel.profile.MeasuredCurve.from_points)."""
    from costmodel.profile import MeasuredCurve

    return MeasuredCurve.from_points(
        log["rows"],
        f"calibrated: nccl-tests {Path(log['file']).name} ({log['gpu']}, "
        f"{log['ranks']} ranks), as logged",
    )


def run(args) -> int:
    """Fit every log into the --from profile and write --out (atomically, never over an input)."""
    from costmodel.io import atomic_write_text, check_output_path, read_text
    from costmodel.profile import (
        Provenance,
        dump_profile,
        load_profile,
        profile_from_dict,
        profile_to_tree,
    )

    if not args.source:
        raise TpcostError(
            "calibrate --from-nccl-tests needs --from PROFILE (a built-in name or a .toml path)"
        )
    out = Path(args.out)
    if out.suffix != ".toml":
        raise TpcostError(f"--out {out}: a profile is a .toml file")
    check_output_path(out, args.force, "--out", protect=(args.source, *args.from_nccl_tests))
    base = load_profile(args.source)
    logs = [parse_nccl_tests(read_text(f, "nccl-tests log"), str(f)) for f in args.from_nccl_tests]
    check_logs(base, logs, bool(getattr(args, "allow_other_gpu", False)))
    values: dict[str, float] = {}
    provs: dict[str, Provenance] = {}
    fitted = []
    warnings: list[str] = []
    measured: dict = {}
    for log in logs:
        fit_log(base, log, values, provs, fitted, warnings)
        measured.setdefault(f"nccl_{log['op']}", {})[log["ranks"]] = measured_curve(log)
    from costmodel.ops import NCCL_REGIMES

    # the measured curve is this machine's collective at this TP: the prior's regime curves of it go
    written = {t for t, _, _ in fitted}
    replaced = [
        f"collectives.nccl_{log['op']}{r}.tp{log['ranks']}"
        for log in logs
        for r in NCCL_REGIMES
        if log["ranks"] in base.collective_tps(f"nccl_{log['op']}{r}")
        and f"collectives.nccl_{log['op']}{r}.tp{log['ranks']}" not in written
    ]
    kept = sorted({k.rsplit(".", 1)[0] for k in base.provenance} - written - set(replaced))
    notes = {
        "calibration.from_nccl_tests": ", ".join(Path(f).name for f in args.from_nccl_tests),
        "calibration.prior_profile": base.name,
        "calibration.not_measured_kept_prior": ", ".join(kept),
    }
    if replaced:
        notes["calibration.regimes_replaced"] = ", ".join(replaced)
    prof = base.with_values(
        values,
        provs,
        mark_modified=False,
        new_keys_ok=True,
        name=args.name or f"{base.name}-nccl-tests",
        notes=notes,
        drop=tuple(replaced),
        measured=measured,
    )
    tree = profile_to_tree(prof)
    profile_from_dict(tree, str(out))  # what is written loads back
    atomic_write_text(
        out,
        f"# Written by tpcost calibrate --from-nccl-tests (prior: {base.name}).\n"
        + dump_profile(tree),
    )
    print(f"tpcost calibrate --from-nccl-tests: wrote {out} from {base.name}")
    for key, lat_s, bw in fitted:
        print(
            f"  {key}: latency {lat_s * 1e6:.2f} us, busBW {bw['value'] / 1e9:.1f} GB/s"
            + (f" (±{100 * bw['uncertainty_rel']:.1f}%)" if bw["uncertainty_rel"] else "")
        )
    for impl, per in measured.items():
        for tp, c in per.items():
            print(
                f"  [measured.{impl}.tp{tp}]: the log's {len(c.msg_bytes)} points; between "
                f"{c.msg_bytes[0]:.0f} and {c.msg_bytes[-1]:.0f} bytes the model interpolates "
                "them, above it extends "
                f"the last point along the fitted curve, below it uses the fitted curve"
            )
    for w in warnings:
        print(w)
    eager = [Path(log["file"]).name for log in logs if log["graph"] is False]
    if eager:
        print(
            f"  {', '.join(eager)}: timed eagerly (graph: 0); its small-message times may hold a "
            "kernel launch that "
            "vLLM's CUDA-graph replay does not pay, and tpcost takes no launch out (no released "
            "measurement sizes "
            "it): run nccl-tests with -G 1 (CUDA graphs) to calibrate vLLM's graph regime; the "
            "source records which"
        )
    regime_tables = [t for t in sorted(written) if any(f"{r}.tp" in t for r in NCCL_REGIMES)]
    if regime_tables:
        print(
            "  the logged sizes identify NCCL's protocol regimes: fitted "
            f"{', '.join(regime_tables)} beside the "
            "bandwidth curve"
        )
    if replaced:
        print(
            "  the prior's regime curves of the measured collectives dropped (another machine's): "
            f"{', '.join(replaced)}"
        )
    print(
        f"  every other value keeps its prior from {base.name} ({len(kept)} tables); use it with "
        f"`tpcost whatif --gpu {out}`"
    )
    return 0
