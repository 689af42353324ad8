"""Render the generated tables in docs/*.md from their single sources (code tables,
benchmarks/results/*.json).

Each generated block sits between `<!-- generated:NAME -->` and `<!-- /generated:NAME -->`;
everything outside the markers is hand-written and kept. `python tools/render_docs.py` rewrites the
blocks (atomically); `--check` exits 1 when a committed block differs from what this script renders
(tests/test_docs.py runs it).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from costmodel.formulas import MiB  # noqa: E402
from costmodel.io import atomic_write_text  # noqa: E402


def value_ranges_table() -> str:
    """The plausible range of every profile quantity (costmodel.profile.VALUE_RANGES), first match
    wins."""
    from costmodel.profile import UNCERTAINTY_RANGE, VALUE_RANGES

    lines = ["| quantity (dotted key, regular expression) | range | why |", "|---|---|---|"]
    for pat, r in VALUE_RANGES:
        cell = pat.replace("|", "\\|")  # a pipe inside a table cell
        lines.append(f"| `{cell}` | {r.text()} | {r.why} |")
    lines.append(
        f"| `<table>.uncertainty_rel.<key>` | {UNCERTAINTY_RANGE.text().strip()} | "
        f"{UNCERTAINTY_RANGE.why} |"
    )
    return "\n".join(lines)


RESULTS = ROOT / "benchmarks" / "results"


def _load(name: str) -> dict:
    import json

    return json.loads((RESULTS / name).read_text())


def _n(v, fmt: str) -> str:
    return "n/a" if v is None else format(v, fmt)


def accuracy_table() -> str:
    """benchmarks/results/accuracy.json: every fused-op source per family, in-sample and
    leave-one-source-out."""
    d = _load("accuracy.json")
    lines = [
        "| family | source | sample | rows | median \\|speedup err\\| | bias: median ln(pred/meas) "
        "| p90 "
        "| verdicts | vLLM 0.31 rule | mean regret % | vLLM regret % | right where measured < 0.9 "
        "| decode meas / pred [s] |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for fam, f in d["families"].items():
        for sid, res in f["sources"].items():
            # a scored-only source has no in-sample line
            for label, r in (
                (lb, res[key])
                for lb, key in (
                    ("in-sample", "in_sample"),
                    ("leave-one-source-out", "leave_one_source_out"),
                )
                if key in res
            ):
                v = r.get("vllm_rule", {})
                dec = (
                    f"{r['decode_measured_s']:.1f} / {r['decode_predicted_s']:.1f}"
                    if "decode_measured_s" in r
                    else ""
                )
                lines.append(
                    f"| {fam} | {sid} | {label} | {r['rows']} | "
                    f"{_n(r.get('median_abs_speedup_error'), '.3f')} "
                    f"| {_n(r.get('median_signed_log_error'), '+.3f')} "
                    f"| {_n(r.get('p90_abs_speedup_error'), '.3f')} | "
                    f"{_n(r.get('verdict_accuracy'), '.1%')} "
                    f"| {_n(v.get('verdict_accuracy'), '.1%')} | "
                    f"{_n(r.get('mean_regret_pct'), '.2f')} "
                    f"| {_n(v.get('mean_regret_pct'), '.2f')} "
                    f"| {r.get('verdicts_right_where_measured_below_0_9', '')} | {dec} |"
                )
    kern = d["kernel"]
    for sid in kern["sources"]:
        for part, label in (
            ("in_sample", "in-sample"),
            ("leave_one_source_out", "leave-one-source-out"),
        ):
            k = kern[part][sid]
            lines.append(
                f"| single kernel | {sid} | {label} | {k['rows']} | "
                f"{_n(k['median_abs_speedup_error'], '.3f')} "
                f"| {_n(k.get('median_signed_log_error'), '+.3f')} "
                f"| | {k['verdicts_outside_5pct']} outside ±5 % | | | | | |"
            )
            c = k.get("at_central_terms")
            # the held-out nominal is its draws' median; the prediction at the central terms beside
            # it
            if c:
                lines.append(
                    f"| single kernel | {sid} | {label}, at the central terms | {k['rows']} "
                    f"| {_n(c['median_abs_speedup_error'], '.3f')} | "
                    f"{_n(c.get('median_signed_log_error'), '+.3f')} "
                    f"| | {c['verdicts_outside_5pct']} outside ±5 % | | | | | |"
                )
        for tp, e in kern.get("leave_one_world_size_out", {}).get(sid, {}).items():
            w, others = tp[2:], ", ".join(map(str, e["trained_on_tp"]))
            for part, label in (
                ("in_sample", f"in-sample, world size {w}"),
                ("held_out", f"world size {w} held out (fitted on {others})"),
            ):
                k = e[part]
                lines.append(
                    f"| single kernel | {sid} | {label} | {k['rows']} "
                    f"| {_n(k['median_abs_speedup_error'], '.3f')} "
                    f"| {_n(k.get('median_signed_log_error'), '+.3f')} | | "
                    f"{k['verdicts_outside_5pct']} "
                    "outside ±5 % | | | | | |"
                )
    for src, t in d["evaluated"].items():
        v = t["vllm_rule"]
        lines.append(
            f"| {'hopper' if src.startswith('META') else 'cpu'} | {src} | out-of-sample | "
            f"{t['rows_scored']} "
            f"| {t['median_abs_speedup_error']:.3f} | "
            f"{_n(t.get('median_signed_log_error'), '+.3f')} "
            f"| {t['p90_abs_speedup_error']:.3f} "
            f"| {t['verdict_accuracy']:.1%} | {v['verdict_accuracy']:.1%} | "
            f"{t['mean_regret_pct']:.2f} "
            f"| {v['mean_regret_pct']:.2f} | | |"
        )
    return "\n".join(lines)


def band_coverage_table() -> str:
    """benchmarks/results/accuracy.json: how often the band covers the measured speedup, per
    source."""
    d = _load("accuracy.json")
    lines = ["| source | op rows | band covers the measured speedup |", "|---|---|---|"]
    for src, c in d["band_coverage"].items():
        lines.append(f"| {src} | {c['rows']} | {_n(c['covered'], '.1%')} |")
    return "\n".join(lines)


def band_calibration_table() -> str:
    """benchmarks/results/accuracy.json: the band's model error by nested leave-one-source-out
    (calib/band.py)."""
    d = _load("accuracy.json")["band_calibration"]
    lines = []
    for part in (d, d["kernel"]):
        lines += [
            f"model error σ_m of `{part['key']}` over {', '.join(part['calibration_sources'])}: "
            f"**{part['sigma_m']:.3f}** (coverage of them all at it "
            f"{_n(part['coverage_all_calibrating'], '.1%')}, "
            f"target {d['target']:.0%})",
            "",
            "| source | op rows | scored | σ_m used | coverage | without the run noise | "
            "parameters alone (σ_m 0, run noise kept) | "
            "median run noise σ | median band width (speedup) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for src, c in part["per_source"].items():
            lines.append(
                f"| {src} | {c['rows']} | {c['sample']} | {c['sigma_m']:.3f} | "
                f"{_n(c['coverage'], '.1%')} | "
                f"{_n(c['coverage_without_run_noise'], '.1%')} | "
                f"{_n(c['coverage_parameters_only'], '.1%')} | "
                f"{_n(c['run_noise_sigma_median'], '.3f')} | {_n(c['sharpness'], '.3f')} |"
            )
        lines.append("")
    lines += [
        "Run noise (`fit_run_noise`, maximum likelihood over a source's cells timed twice; σ of "
        "one run's ln speedup "
        "at t = √(baseline·fused)):",
        "",
        "| source | fused arm | pairs | σ² = r² + (j/t)²: r | j (µs) | ln L | constant σ | its ln "
        "L |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {e['source']} | {e['fused_arm']} | {e['pairs']} | {e['relative']:.4f} | "
        f"{e['jitter_s'] * 1e6:.1f} | "
        f"{-e['nll']:.2f} | {e['sigma_constant']:.4f} | {-e['nll_constant']:.2f} |"
        for e in d["run_noise"]
    ]
    return "\n".join(lines)


# twice the default whatif's hi/lo at 6337905 (band 1780-5764): the bound set for it
BAND_RATIO_BOUND = 2 * 5764 / 1780


def band_trade_off_table() -> str:
    """benchmarks/results/accuracy.json: the default whatif's band at each σ of asynctp.time_scale
    beside each source's held-out coverage at that σ (calib/band.py's coverage_by_sigma, the run
    noise kept)."""
    d = _load("accuracy.json")
    cal = d["band_calibration"]
    sig = cal["trade_off_sigmas"]
    srcs = list(cal["coverage_by_sigma"])
    lines = [
        "| σ of asynctp.time_scale | default whatif band (tokens) | hi/lo | within 2× the 6337905 "
        "ratio (≤ "
        f"{BAND_RATIO_BOUND:.2f}) | "
        + " | ".join(f"{s} ({cal['per_source'][s]['rows']} rows)" for s in srcs)
        + " | mean of the calibrating sources |",
        "|---" * (5 + len(srcs)) + "|",
    ]
    for t in d["whatif_band_by_sigma"]:
        j = min(range(len(sig)), key=lambda i: abs(sig[i] - t["sigma"]))
        covs = [cal["coverage_by_sigma"][s][j] for s in srcs]
        mean = sum(c for s, c in zip(srcs, covs) if s in cal["calibration_sources"]) / len(
            cal["calibration_sources"]
        )
        hi = "never" if t["band_hi_tokens"] is None else t["band_hi_tokens"]
        ratio = t["hi_over_lo"]
        mark = " (the profiles')" if abs(t["sigma"] - cal["sigma_m"]) < 1e-9 else ""
        lines.append(
            f"| {t['sigma']:.2f}{mark} | {t['band_lo_tokens']}–{hi} | {_n(ratio, '.2f')} | "
            f"{'yes' if ratio is not None and ratio <= BAND_RATIO_BOUND else 'no'} | "
            + " | ".join(_n(c, ".1%") for c in covs)
            + f" | {mean:.1%} |"
        )
    return "\n".join(lines)


def speed_table() -> str:
    """benchmarks/results/costmodel_speed.json: the model's speed on this repository's CPU
    machine."""
    d = _load("costmodel_speed.json")
    rows = [
        (
            "`import costmodel` + `analyse`, `load_model`, `load_profile` (fresh process; neither "
            "torch nor scipy)",
            d["import_costmodel_s_median"],
            "ms",
        ),
        (
            "first `analyse()` incl. loading profile and model, no band",
            d["first_cutoff_s_median"],
            "ms",
        ),
        (
            "`analyse()` on the config-time grid (2048 multiples of tp <= 8192), no band",
            d["analyse_no_band_s"],
            "ms",
        ),
        (
            "`analyse()` on the config-time grid, with the band (200 draws) and the sensitivity "
            "table",
            d["analyse_with_band_s"],
            "ms",
        ),
        (
            "`predict()` full sweep N = 1…65536 (reported, not targeted)",
            d["sweep_1_65536_no_band_s"],
            "ms",
        ),
        (
            "`evaluate` on 100 000 model-level rows (grouped: one prediction per group)",
            d["evaluate_100000_model_rows_s"],
            "s",
        ),
    ]
    lines = [
        f"machine: {d['machine']}",
        "",
        "| measurement (llama-3.1-70b, h100-sxm, TP 4, bf16) | median |",
        "|---|---|",
    ]
    for what, v, unit in rows:
        lines.append(
            f"| {what} | {v * 1e3:.1f} ms |" if unit == "ms" else f"| {what} | {v:.2f} s |"
        )
    return "\n".join(lines)


def plugin_table() -> str:
    """benchmarks/results/vllm_plugin_overhead.json: the vLLM plugin's own time inside a cold config
    build."""
    d = _load("vllm_plugin_overhead.json")
    return "\n".join(
        [
            f"{len(d['rounds'])} rounds; a cold config build without the plugin: "
            f"{d['median_without_config_s']:.2f} s (median)",
            "",
            "| start | plugin, in process (median) | of a cold config build |",
            "|---|---|---|",
            "| later starts with the same inputs (decision cache hit) | "
            f"{d['median_hit_plugin_s'] * 1e3:.2f} ms "
            f"| {d['median_hit_fraction_of_config']:.2%} |",
            f"| first start (cache miss: import the model, load the profile, decide, store) "
            f"| {d['median_miss_plugin_s'] * 1e3:.1f} ms | "
            f"{d['median_miss_fraction_of_config']:.2%} |",
            "",
            "paired cold-process cross-check, median ratio with the plugin (cache hit) against "
            "without: "
            f"{d['median_ratio_hit_vs_without']:.2f}",
        ]
    )


def fits_table() -> str:
    """benchmarks/results/accuracy.json: every term of each family's joint fit, with its sigma."""
    d = _load("accuracy.json")
    lines = ["| family | term | of | value | σ (relative) |", "|---|---|---|---|---|"]
    for fam, f in d["families"].items():
        fit = f["fit"]
        for sid, kv in fit["values"].items():
            for key, val in kv.items():
                sg = fit["sigma_rel"].get(sid, {}).get(key)
                sg_s = (
                    "not identified: prior kept"
                    if sg is None or sg == float("inf")
                    else f"{sg:.2f}"
                )
                who = "GPU (shared)" if sid in (None, "None", "null") else sid
                lines.append(f"| {fam} | `{key}` | {who} | {val:.4g} | {sg_s} |")
        lines.append(
            f"| {fam} | rms log residual | {len(fit['sources'])} sources, {fit['n_residuals']} "
            "residuals "
            f"| {fit['rms_log']:.3f} | |"
        )
    kf = d["kernel"]
    for key, val in kf["values"].items():
        if not key.startswith(("hw:", "vllm:", "flashinfer:", "vllm-bench:")):
            continue
        sg = kf["sigma_rel"].get(key)
        sg_s = "not identified: prior kept" if sg is None else f"{sg:.2f}"
        who = {
            "hw": "GPU (NVLink5 multicast, shared)",
            "vllm": "vLLM's gemm_rs_ar",
            "flashinfer": "FlashInfer's CuTe",
            "vllm-bench": "vLLM's kernel benchmark (both arms of PR 52079 and PR 53053)",
        }
        lines.append(
            f"| single kernel | `{key.split(':', 1)[1]}` | {who[key.split(':')[0]]} | {val:.4g} | "
            f"{sg_s} |"
        )
    lines.append(
        "| single kernel | rms weighted log residual (speedup × w, arms' mean) | "
        f"{len(kf['sources'])} sources, {kf['n_rows']} rows "
        f"| {kf['rms_log']:.3f} | |"
    )
    return "\n".join(lines)


def sp_cutoffs_table() -> str:
    """benchmarks/results/vllm_thresholds.json: tpcost's SP+AsyncTP cutoff beside vLLM 0.31's
    table."""
    from costmodel import formulas as F
    from costmodel.shapes import load_model

    d = _load("vllm_thresholds.json")
    lines = [
        "| GPU | model | TP | vLLM 0.31 `sp_min_token_num` | tpcost cutoff | MiB per GPU | band "
        "5–95 % | ratio "
        "| token budget |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in d["sp_cutoffs"]:
        band = r["band"] or [None, None]
        vllm = r["vllm_threshold"] if r["vllm_threshold"] is not None else "SP off (hidden < 8192)"
        cut = r["cutoff_tokens"] if r["cutoff_tokens"] is not None else "never"
        mib = "-"
        if r["cutoff_tokens"] is not None:
            hidden = load_model(r["model"]).hidden
            mib = f"{float(F.mib_per_gpu(r['cutoff_tokens'], hidden, 2.0, r['tp'])):.1f}"
        lines.append(
            f"| {r['gpu']} | {r['model']} | {r['tp']} | {vllm} | {cut} | {mib} "
            f"| [{'never' if band[0] is None else band[0]}, "
            f"{'never' if band[1] is None else band[1]}] "
            f"| {_n(r.get('ratio'), '.2f')} | {r.get('max_num_batched_tokens', 8192)} |"
        )
    return "\n".join(lines)


def fusion_ranges_table() -> str:
    """benchmarks/results/vllm_thresholds.json: tpcost's FlashInfer fusion range beside vLLM's
    table, per release."""
    d = _load("vllm_thresholds.json")
    labels = list(d["fusion_ranges"][0]["releases"]) if d["fusion_ranges"] else []
    head = (
        "| GPU | hidden | TP | "
        + " | ".join(
            f"vLLM {v}'s limit [tokens] | tpcost ({v} tables) | saves vs vLLM {v} [ms/forward]"
            for v in labels
        )
        + " |"
    )
    lines = [head, "|---|---|---|" + "---|---|---|" * len(labels)]
    for r in d["fusion_ranges"]:
        cells = []
        for v in labels:
            x = r["releases"].get(v)
            cells += (
                [
                    str(x["vllm_tokens"]),
                    str(x["tpcost_tokens"]),
                    f"{x['saving_vs_vllm_s_per_forward'] * 1e3:.3f}",
                ]
                if x
                else ["n/a"] * 3
            )
        lines.append(f"| {r['gpu']} | {r['hidden']} | {r['tp']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def transcript(*argv: str, keep=None) -> str:
    """A fenced transcript of `tpcost ARGV` run in process (stdout, then stderr), `keep` lines of it
    or all."""
    import contextlib
    import io

    from integration.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    if rc != 0:
        raise SystemExit(f"render_docs: tpcost {' '.join(argv)} exited {rc}: {err.getvalue()}")
    lines = (out.getvalue() + err.getvalue()).rstrip("\n").splitlines()
    if keep is not None:
        lines = [ln for i, ln in enumerate(lines) if keep(i, ln)]
    return "```\n$ tpcost " + " ".join(argv) + "\n" + "\n".join(lines) + "\n```"


def _no_vllm_installed(fn):
    """`fn` run as on a fresh machine: no vLLM distribution found, so the one version rule gives the
    current release (the README's sample is what its install command prints, whatever this machine
    has)."""
    import integration.recommend as rec

    saved = rec.installed_vllm
    rec.installed_vllm = lambda: None
    try:
        return fn()
    finally:
        rec.installed_vllm = saved


def _whatif_sample() -> str:
    shown = ("1 ", "64 ", "512 ", "2048 ", "8192 ", "65536 ")
    return _no_vllm_installed(
        lambda: transcript(
            "whatif",
            "--no-band",
            keep=lambda i, ln: (
                i < 2
                or ln.lstrip().startswith(shown)
                or "<- cutoff" in ln
                or ln.startswith(
                    ("(times", "cutoff", "vLLM ", "value of", "FlashInfer", "  the schedules")
                )
            ),
        )
    )


def _whatif_sample_sp() -> str:
    """The same what-if for the newest release with the SP passes (its SP+AsyncTP cutoff)."""
    from integration.cli.whatif import sp_release_label

    shown = ("1 ", "64 ", "512 ", "2048 ", "8192 ", "65536 ")
    return transcript(
        "whatif",
        "--no-band",
        "--vllm-version",
        sp_release_label(),
        keep=lambda i, ln: (
            i < 2
            or ln.lstrip().startswith(shown)
            or "<- cutoff" in ln
            or ln.startswith(("(times", "cutoff", "vLLM ", "value of", "decided"))
        ),
    )


def kernel_cutoffs_table() -> str:
    """benchmarks/results/vllm_thresholds.json: tpcost's per-site answer for Kimi-K3 beside vLLM's
    rule."""
    d = _load("vllm_thresholds.json")
    rule = "/".join(str(m) for m in sorted({r["vllm_rule_tokens"] for r in d["kernel_cutoffs"]}))
    lines = [
        "| GPU | TP | mode | call site | k | × / fwd | vLLM's rule | tpcost's cutoff | switch "
        "(vLLM's default) | "
        f"saves vs vLLM [ms/fwd] | at M = {rule}: waves · multicast GB/s · bound · unfused · "
        "speedup | "
        f"kernel faster at M ({rule}-8192) | unfused arm from M |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in d["kernel_cutoffs"]:
        cut = "never" if r["cutoff_tokens"] is None else str(r["cutoff_tokens"])
        t = r["terms_at_vllm_rule"]
        sw = f"{r['switch_env']}={int(r['switch_set_on'])} ({int(r['switch_vllm_default_on'])})"
        lines.append(
            f"| {r['gpu']} | {r['tp']} | {r['op']} | {r['site']} | {r['k']} | "
            f"{r['calls_per_forward']} "
            f"| M ≥ {r['vllm_rule_tokens']} | {cut} | {sw} | "
            f"{r['switch_saving_vs_vllm_s_per_forward'] * 1e3:.3f} "
            f"| {t['waves']} · {t['multicast_gb_per_s']:.0f} · {t['bound']} · {t['unfused_impl']} "
            "· "
            f"{t['speedup']:.3f} | "
            f"{', '.join(f'{a}-{b}' for a, b in r['kernel_faster_at_m']) or 'nowhere'} "
            f"| {', '.join(f'{i} {m}' for m, i in r['unfused_impl_from_m'])} |"
        )
    return "\n".join(lines)


def held_out_lines_table() -> str:
    """benchmarks/results/accuracy.json: every held-out line, its bias, the in-sample one and its
    data limit."""
    d = _load("accuracy.json")
    lines = [
        "| family | left out | source / kernel | rows | bias held out | bias in-sample | terms "
        "fitted on it "
        "| within ±0.05, or the data limit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for ln in d["leave_one_out"]:
        rows = ln["rows"] or "decode"
        lines.append(
            f"| {ln['family']} | {ln['split']} | {ln['source']} | {rows} "
            f"| {_n(ln['median_signed_log_error'], '+.3f')} | "
            f"{_n(ln['in_sample_signed_log_error'], '+.3f')} "
            f"| {', '.join(ln['terms_fitted_on_held_out']) or 'none'} "
            f"| {'yes' if ln['within_bias_limit'] else ln['data_limit'] or 'NO DATA LIMIT NAMED'} |"
        )
    return "\n".join(lines)


def gemm_ar_settings_table() -> str:
    """benchmarks/results/vllm_thresholds.json: the GEMM-AR kernel's crossover per setting, with its
    terms there."""
    d = _load("vllm_thresholds.json")
    lines = [
        "| setting | GPU | TP | n, k | kernel's SMs | crossover M | at it: bound · waves · GEMM / "
        "traffic [µs] · "
        "kernel / unfused [µs] · unfused all-reduce |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in d["gemm_ar_settings"]:
        cross = "never" if s["crossover_m"] is None else str(s["crossover_m"])
        lines.append(
            f"| {s['setting']} | {s['gpu']} | {s['tp']} | {s['n']}, {s['k']} | {s['sm_share']:.3g} "
            f"| {cross} "
            f"| {s['bound']} · {s['waves']} · {s['t_gemm_us']:.1f} / {s['t_comm_us']:.1f} · "
            f"{s['t_fused_us']:.1f} / {s['t_unfused_us']:.1f} · {s['unfused_impl']} |"
        )
    return "\n".join(lines)


def _site_shape(s: dict) -> str:
    """A gate's site as the table shows it: a GEMM's (n, k per rank), or a finalize's hidden and
    routed rows."""
    if "n" in s:
        return f"{s['n']}, {s['k']}"
    return f"H {s['hidden']}, {s['routed_rows']:g} routed rows" + (
        " + shared" if s["shared_row"] else ""
    )


def model_gates_table() -> str:
    """benchmarks/results/vllm_thresholds.json: vLLM 0.34's hand cutoffs in model code beside
    tpcost's values."""
    d = _load("vllm_thresholds.json")
    lines = [
        "| GPU | TP | gate | call sites (n, k per rank) × / fwd | vLLM | tpcost | band 5-95 % | "
        "saves vs vLLM "
        "[ms/fwd] | acts in this setup | terms at vLLM's constant |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def tok(x, g):
        return (
            ("never" if g.get("runs_from", "min") == "min" else "off")
            if x is None
            else ("off" if g.get("runs_from") == "max" and x == 0 else str(x))
        )

    def terms(t):
        if "t_oneshot_us" in t:
            return (
                f"N {t['n']}: one-shot AR {t['t_oneshot_us']:.1f} + tail {t['t_tail_us']:.1f} µs "
                "fused · unfused "
                f"finalize {t['t_finalize_us']:.1f} + add {t['t_add_us']:.1f} + "
                f"{t['unfused_impl']} "
                f"{t['t_all_reduce_us']:.1f} + norm {t['t_norm_us']:.1f} + quant "
                f"{t['t_quant_us']:.1f} µs · "
                f"speedup {t['speedup']:.3f}"
            )
        if "waves" in t:
            return (
                f"M {t['m']}: {t['waves']} wave(s) · {t['multicast_gb_per_s']:.0f} GB/s multicast "
                f"· {t['bound']}"
                f" · fixed {t['fixed_us']:.1f} µs · unfused {t['unfused_impl']} · speedup "
                f"{t['speedup']:.3f}"
            )
        return (
            f"M {t['m']}: GEMM {t['t_gemm_whole_us']:.0f} µs whole, chunks "
            f"{t['t_chunk_gemms_us']:.0f} µs · pulls "
            f"{t['t_pulls_us']:.0f} µs · host {t['t_host_us']:.0f} µs · unfused "
            f"{t['unfused_impl']} "
            f"{t['t_unfused_collective_us']:.0f} µs · speedup "
            f"{t['speedup']:.3f}"
        )

    for r in d["model_gates"]:
        unit = "/rank" if r["gate"] == "common.ag_gemm" else ""
        nodes = " (2 trays)" if r.get("constant", "").startswith("_MULTI_NODE") else ""
        sites = (
            "; ".join(
                f"{s['site']} ({_site_shape(s)}) ×{s['calls_per_forward']}" for s in r["sites"]
            )
            if "sites" in r
            else f"{r['site']} ({r['n']}, {r['k']}) (`tpcost op`)"
        )
        band = r.get("band_tokens")
        bs = "-" if band is None else f"[{tok(band[0], r)}, {tok(band[1], r)}]"
        sv = r.get("saving_s")
        acts = (
            "op value"
            if r.get("as") == "op"
            else ("yes" if r["applies"] else f"no: {r['why_not']}")
        )
        t = "; ".join(f"{k}: {terms(v)}" for k, v in (r.get("terms_at_vllm") or {}).items()) or "-"
        lines.append(
            f"| {r['gpu']} | {r['tp']}{nodes} | {r['gate']} | {sites} | {r['vllm_tokens']}{unit} | "
            f"{tok(r['tpcost_tokens'], r)}{unit} | {bs} | "
            f"{'-' if sv is None else f'{sv * 1e3:.3f}'} | {acts} "
            f"| {t} |"
        )
    return "\n".join(lines)


def all_gather_check_table() -> str:
    """benchmarks/results/vllm_thresholds.json: the all-gather arms against the released all-gather
    rows."""
    d = _load("vllm_thresholds.json")["all_gather_check"]
    lines = [
        "| source | GPU | size | NCCL measured / predicted | the other path | measured / predicted "
        "|",
        "|---|---|---|---|---|---|",
    ]
    for c in d:
        size = f"{c['size_bytes'] / MiB:.2f} MiB" + (
            f" ({c['tokens']} tokens)" if "tokens" in c else ""
        )
        lines.append(
            f"| {c['source']} | {c['gpu']} | {size} | {c['nccl_measured']:.1f} / "
            f"{c['nccl_predicted']:.1f} "
            f"{c['unit']} | {c['other']} | {c['other_measured']:.1f} / {c['other_predicted']:.1f} "
            f"{c['unit']} |"
        )
    return "\n".join(lines)


def collectives_table() -> str:
    """benchmarks/results/accuracy.json: the NCCL all-reduce regime fit per released sweep."""
    d = _load("accuracy.json")["collectives"]
    lines = [
        "| sweep | GPU | harness offset [µs] | in-sample max / median busBW error (1 MiB-16 GiB) | "
        "leave-one-source-out max / median |",
        "|---|---|---|---|---|",
    ]
    for src, c in d.items():
        lo = (
            "n/a (one sweep of this GPU)"
            if c["loso_max"] is None
            else f"{c['loso_max']:.3f} / {c['loso_median']:.3f}"
        )
        lines.append(
            f"| {src} | {c['gpu']} | {c['offset_s'] * 1e6:.1f} | {c['in_sample_max']:.3f} / "
            f"{c['in_sample_median']:.3f} | {lo} |"
        )
    return "\n".join(lines)


def collective_impls_table() -> str:
    """benchmarks/results/accuracy.json: each released all-reduce timing against the profile's curve
    for its implementation."""
    d = _load("accuracy.json")["collective_impls"]
    lines = [
        "| source | GPU | TP | implementation | sample | rows | median / max \\|pred/meas − 1\\| "
        "of the time "
        "| leave-one-source-out median (from) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in d.values():
        tp = f"{c['tp']}" + ("" if c["entry_tp"] == c["tp"] else f" (curve at {c['entry_tp']})")
        lo = (
            "n/a"
            if c["loso_median_rel_time_error"] is None
            else f"{c['loso_median_rel_time_error']:.3f} ({', '.join(c['loso_from'])})"
        )
        lines.append(
            f"| {c['source']} | {c['gpu']} | {tp} | {c['impl']} | {c['sample']} | {c['rows']} | "
            f"{c['median_rel_time_error']:.3f} / {c['max_rel_time_error']:.3f} | {lo} |"
        )
    return "\n".join(lines)


def decode_identifiability_table() -> str:
    """benchmarks/results/accuracy.json: the per-barrier cost against the Hopper fit without
    VLLM_PR28672."""
    d = _load("accuracy.json")["families"]["hopper"]["decode_identifiability"]
    lo, hi = d["interval_barrier_s"]
    dlo, dhi = d["interval_decode_s"]
    ends = d["interval_at_grid_end"]
    low = " (the grid's lowest point: the rows allow less too)" if ends["low"] else ""
    high = " (the grid's highest point: the rows allow more too)" if ends["high"] else ""
    lines = [
        f"Fitted without {d['left_out']} (from {', '.join(d['from'])}, {d['n_residuals']} "
        f"residuals, {d['n_terms']} "
        f"terms): barrier {d['best']['barrier_s'] * 1e6:.2f} µs, decode "
        f"{d['best']['decode_s']:.1f} s against "
        f"{d['measured_decode_s']:.1f} s measured; likelihood-ratio interval (Σr² within s² = "
        f"{d['residual_variance']:.4f} of the least) barrier {lo * 1e6:.2f}{low} – "
        f"{hi * 1e6:.2f}{high} µs, "
        f"decode {dlo:.1f} – {dhi:.1f} s.",
        "",
        "| barrier held at [µs] | KRAKEN_PR19 host per torch call [µs] | rms log | decode "
        "predicted [s] | in the interval |",
        "|---|---|---|---|---|",
    ]
    for p in d["points"]:
        host = f"{p['host_op_s'] * 1e6:.2f}" + (
            "" if p["host_identified"] else " (prior: not identified)"
        )
        inside = p["sum_sq"] - d["best"]["sum_sq"] <= d["residual_variance"]
        lines.append(
            f"| {p['barrier_s'] * 1e6:.2f} | {host} | {p['rms_log']:.4f} | {p['decode_s']:.1f} "
            f"| {'yes' if inside else 'no'} |"
        )
    return "\n".join(lines)


def replicate_noise_table() -> str:
    """benchmarks/results/accuracy.json: the noise of the single-kernel cells a source times
    twice."""
    d = _load("accuracy.json")["kernel"]["replicate_noise"]
    lines = [
        "| source | pairs | rms ln(a/b)/√2: baseline arm | fused arm | speedup | verdict flips "
        "within a pair |",
        "|---|---|---|---|---|---|",
    ]
    for sid, e in d.items():
        lines.append(
            f"| {sid} | {e['pairs']} | {e['baseline_rms_log']:.3f} | {e['fused_rms_log']:.3f} "
            f"| {e['speedup_rms_log']:.3f} | {e['verdict_flips']} |"
        )
    return "\n".join(lines)


def code_path_noise_table() -> str:
    """benchmarks/results/accuracy.json: the scatter of a source's kernel rows that run one code
    path, and the verdicts that scatter lets the source settle."""
    d = _load("accuracy.json")["kernel"]["code_path_noise"]
    lines = [
        "| source | rows on a shared path | paths | σ of ln(measured/predicted) | z = ln s / σ of "
        "each row "
        "outside ±5 % | verdicts settled (abs(z) ≥ 1.645): model right |",
        "|---|---|---|---|---|---|",
    ]
    for sid, e in d.items():
        z = ", ".join(
            f"M {r['m']}: {r['z']:+.2f}" + ("" if r["right"] else " (model wrong)")
            for r in e["decided"]
        )
        lines.append(
            f"| {sid} | {e['rows']} | {e['paths']} | {e['sigma_log']:.3f} | {z} | {e['settled']} |"
        )
    return "\n".join(lines)


def p2p_kernels_table() -> str:
    """benchmarks/results/accuracy.json: the Hopper put/ring kernels (calib/p2p_fit.py), in-sample
    and left out."""
    d = _load("accuracy.json")["p2p_kernels"]
    v, sg = d["values"], d["sigma_rel"]
    lines = [
        f"NVLink4 P2P efficiency η shared by the kernels: **{v['hw:link_efficiency']:.3f}** "
        f"(σ_rel {_n(sg.get('hw:link_efficiency'), '.3f')}); per-step latency "
        f"{v['hw:step_latency_s'] * 1e6:.1f} µs "
        f"({'prior kept' if sg.get('hw:step_latency_s') is None else 'fitted'})",
        "",
        "| kernel | rows | in-sample median \\|speedup err\\| (bias) | hardware held out, own "
        "terms on its rows "
        "(bias) | left out, own terms from its peers (bias) | verdicts left out | released "
        "baseline / profile's |",
        "|---|---|---|---|---|---|---|",
    ]
    for k, a in d["in_sample"].items():
        b, h = d["leave_one_kernel_out"][k], d["hardware_held_out"][k]
        base = a.get("baseline_over_profile")
        lines.append(
            f"| {k} | {a['rows']} | {a['median_abs_speedup_error']:.3f} "
            f"({a['median_signed_log_error']:+.3f}) "
            f"| {h['median_abs_speedup_error']:.3f} ({h['median_signed_log_error']:+.3f}) "
            f"| {b['median_abs_speedup_error']:.3f} ({b['median_signed_log_error']:+.3f}) "
            f"| {b['verdicts_outside_5pct']} | "
            + (f"{min(base):.2f}-{max(base):.2f}" if base else "n/a (ratios)")
            + " |"
        )
    return "\n".join(lines)


def dbo_thresholds_table() -> str:
    """benchmarks/results/dbo_thresholds.json: tpcost's DBO thresholds beside vLLM 0.34's 32 /
    512."""
    d = _load("dbo_thresholds.json")
    v = d["vllm_defaults"]
    lines = [
        f"| GPU | EP (nodes) | backend | budget | decode threshold [band] (vLLM {v['decode']}) | "
        "saving | "
        f"prefill threshold [band] (vLLM {v['prefill']}) | saving |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in d["cells"]:
        head = f"| {c['gpu']} | {c['ep']}"
        if "refused" in c:
            lines.append(f"{head} | {c['all2all_backend']} | refused: {c['refused']} | | | | |")
            continue
        cells = []
        for ph in ("decode", "prefill"):
            x = c["phases"][ph]
            b = x["band"]
            thr = (
                "never" if x["threshold_tokens"] is None else str(x["threshold_tokens"])
            ) + f" [{b['lo_tokens'] or 'never'}, {b['hi_tokens'] or 'never'}]"
            save = (
                ""
                if x["threshold_tokens"] is None
                else f"{100 * x['saving_s'] / x['mean_step_s']:.1f} %"
            )
            cells += [thr, save]
        lines.append(
            f"{head} ({c['nodes']}) | {c['all2all_backend']} | {c['max_num_batched_tokens']} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def ep_fit_table() -> str:
    """calib/data/ep_fit.json: the all-to-all fit per released source, in-sample and
    leave-one-source-out."""
    import json

    d = json.loads((ROOT / "calib" / "data" / "ep_fit.json").read_text())
    lines = [
        "| source | rows | in-sample median \\|ln(pred/meas)\\| | bias | held out median \\|ln\\| "
        "| bias |",
        "|---|---|---|---|---|---|",
    ]
    for sid, r in d["in_sample"].items():
        h = d["leave_one_source_out"].get(sid)
        out = f"{h['median_abs_ln']:.3f} | {h['bias']:+.3f}" if h else "n/a | n/a"
        lines.append(
            f"| {sid} | {len(r['rows'])} | {r['median_abs_ln']:.3f} | {r['bias']:+.3f} | {out} |"
        )
    return "\n".join(lines)


def gate_inventory_table() -> str:
    """costmodel.vllm_tables: every gate on a communication path in vLLM 0.34's model code, and the
    count by kind."""
    from collections import Counter

    from costmodel.vllm_tables import GATE_KINDS, current

    inv = current().gate_inventory  # the current release's (0.34's)
    lines = [
        "| constant | where | value | unit | switches | measured on | exposed | tpcost |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for g in inv:
        if g.kind == "comm":
            lines.append(
                f"| `{g.name}` | {g.where} | {g.value} | {g.unit} | {g.what} | {g.measured or '-'} "
                "| "
                f"{g.exposed} | {g.status} |"
            )
    n = Counter(g.kind for g in inv)
    lines += [
        "",
        "Every gate-named constant, by kind: "
        + "; ".join(f"{GATE_KINDS[k]}: {n[k]}" for k in GATE_KINDS)
        + f" ({len(inv)} in all; `vllm-config --json` lists a model family's under "
        "`gate_inventory`).",
    ]
    return "\n".join(lines)


def _vllm_config_transcript(version: str) -> str:
    """vllm-config for docs/vllm.md's example setup (Llama-3.1-70B, H100, TP 4) at one release."""
    argv = "--model llama-3.1-70b --tp 4 --gpu h100-sxm --vllm-version".split()
    return transcript("vllm-config", *argv, version)


BLOCKS = {
    ("../README.md", "whatif-sample"): _whatif_sample,
    ("commands.md", "whatif-sample-sp"): _whatif_sample_sp,
    ("vllm-thresholds.md", "kernel-cutoffs"): kernel_cutoffs_table,
    ("vllm-thresholds.md", "model-gates-034"): model_gates_table,
    ("vllm-thresholds.md", "gemm-ar-settings"): gemm_ar_settings_table,
    ("vllm-thresholds.md", "all-gather-check"): all_gather_check_table,
    ("vllm.md", "vllm-config-031"): lambda: _vllm_config_transcript("0.31"),
    ("vllm.md", "vllm-config-032"): lambda: _vllm_config_transcript("0.32"),
    ("vllm.md", "vllm-config-034"): lambda: _vllm_config_transcript("0.34"),
    ("profiles.md", "value-ranges"): value_ranges_table,
    ("accuracy.md", "accuracy"): accuracy_table,
    ("accuracy.md", "fits"): fits_table,
    ("accuracy.md", "band-coverage"): band_coverage_table,
    ("accuracy.md", "band-calibration"): band_calibration_table,
    ("accuracy.md", "band-trade-off"): band_trade_off_table,
    ("vllm-thresholds.md", "sp-cutoffs"): sp_cutoffs_table,
    ("speed.md", "costmodel-speed"): speed_table,
    ("speed.md", "plugin-overhead"): plugin_table,
    ("vllm-thresholds.md", "fusion-ranges"): fusion_ranges_table,
    ("accuracy.md", "collectives"): collectives_table,
    ("accuracy.md", "collective-impls"): collective_impls_table,
    ("accuracy.md", "replicate-noise"): replicate_noise_table,
    ("accuracy.md", "code-path-noise"): code_path_noise_table,
    ("accuracy.md", "decode-identifiability"): decode_identifiability_table,
    ("accuracy.md", "p2p-kernels"): p2p_kernels_table,
    ("accuracy.md", "held-out-lines"): held_out_lines_table,
    ("accuracy.md", "ep-fit"): ep_fit_table,
    ("vllm-thresholds.md", "dbo-thresholds"): dbo_thresholds_table,
    ("vllm-thresholds.md", "gate-inventory-034"): gate_inventory_table,
}


def render(text: str, name: str, body: str) -> str:
    """`text` with the block `name` replaced by `body`; the markers must exist."""
    pat = re.compile(
        rf"(<!-- generated:{re.escape(name)} -->\n).*?(<!-- /generated:{re.escape(name)} -->)", re.S
    )
    if not pat.search(text):
        raise SystemExit(f"render_docs: no <!-- generated:{name} --> block")
    return pat.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)


def rendered(docs: Path = ROOT / "docs") -> dict[Path, tuple[str, str]]:
    """path -> (committed text, rendered text) for every doc with generated blocks."""
    out: dict[Path, tuple[str, str]] = {}
    for (fname, name), fn in BLOCKS.items():
        path = docs / fname
        old = out[path][1] if path in out else path.read_text()
        out[path] = (out[path][0] if path in out else old, render(old, name, fn()))
    return out


# what whatif states beside its band (package data)
BAND_COVERAGE = ROOT / "integration" / "band_coverage.json"


def band_coverage_json() -> str:
    """The measured coverage of the band per source (benchmarks/results/accuracy.json), as whatif
    reads it."""
    from costmodel.io import dumps_json

    # the calibrating sources; the scored-only are another path
    band = _load("accuracy.json")["band_calibration"]
    cov = {
        sid: {"rows": c["rows"], "covered": c["coverage"]}
        for sid, c in band["per_source"].items()
        if sid in band["calibration_sources"] and c["rows"]
    }
    return (
        dumps_json(
            {
                "what": "share of each released source's op rows whose measured speedup lies "
                "inside the 5-95 % "
                "band (the profile's Monte Carlo draws with the model error asynctp.time_scale), "
                "the source held "
                "out: centred on its leave-one-source-out prediction, the model error set without "
                "it, one "
                "run's measured noise beside it where the source times a cell twice "
                "(calib/band.py); written by tools/render_docs.py from "
                "benchmarks/results/accuracy.json",
                "excluded": band["scored_only"],
                "sources": cov,
            },
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )


def main(argv=None) -> int:
    from costmodel.io import doc_summary

    ap = argparse.ArgumentParser(description=doc_summary(__doc__))
    ap.add_argument(
        "--check", action="store_true", help="exit 1 if a committed generated block is stale"
    )
    args = ap.parse_args(argv)
    stale = []
    cov = band_coverage_json()
    if not BAND_COVERAGE.exists() or BAND_COVERAGE.read_text() != cov:
        if args.check:
            stale.append(str(BAND_COVERAGE.relative_to(ROOT)))
        else:
            atomic_write_text(BAND_COVERAGE, cov)
    for path, (old, new) in rendered().items():
        if old != new:
            if args.check:
                stale.append(str(path.relative_to(ROOT)))
            else:
                atomic_write_text(path, new)
    if stale:
        print("stale generated docs: " + ", ".join(stale) + " (run python tools/render_docs.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
