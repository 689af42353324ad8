"""Plots; matplotlib is an optional extra, imported only here (docs/model.md §9)."""

from __future__ import annotations

from typing import Any
import numpy as np

from .errors import TpcostError
from .io import savefig_atomic


def pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TpcostError("--plot needs matplotlib: pip install 'tpcost[plot]'") from None
    return plt


def _finish(plt: Any, fig: Any, ax: Any, path: str) -> None:
    """Legend, grid, layout; the figure written atomically and closed."""
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    try:
        savefig_atomic(fig, path, dpi=110)
    finally:
        plt.close(fig)


def whatif_series(a: Any) -> dict:
    """What plot_whatif draws: both speedup curves, the cutoff and its band (§9)."""
    # N on a geometric grid of multiples of tp to 65536, NaN where a schedule cannot run, the token
    # budget and the 1 + margin line.
    from .analysis import curve

    n = np.unique(np.round(np.geomspace(a.run.tp, 65536, 400) / a.run.tp) * a.run.tp)
    pred = curve(a, n)
    return {
        "num_tokens": n,
        "speedup_sp_asynctp": pred.speedup_sp_asynctp,
        "speedup_sp": pred.speedup_sp,
        "cutoff_tokens": a.cutoff_tokens,
        "band": a.cutoff_band_tokens,
        "margin_line": 1.0 + a.run.margin,
        "max_num_batched_tokens": a.run.max_num_batched_tokens,
    }


def plot_whatif(a: Any, path: str) -> None:
    """Speedup vs N for sp and sp_asynctp, the cutoff and its band marked (§9)."""
    plt = pyplot()
    s = whatif_series(a)
    n = s["num_tokens"]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    ax.semilogx(n, s["speedup_sp_asynctp"], label="SP + AsyncTP")
    ax.semilogx(n, s["speedup_sp"], label="SP alone", alpha=0.8)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(
        s["margin_line"], color="k", lw=0.6, ls=":", label=f"1 + margin ({a.run.margin:.0%})"
    )
    if s["band"]:
        lo, hi = s["band"]
        ax.axvspan(lo or a.run.tp, hi or 65536, color="C2", alpha=0.15, label="cutoff band (5-95%)")
    if s["cutoff_tokens"]:
        ax.axvline(s["cutoff_tokens"], color="C2", ls="--", label=f"cutoff {s['cutoff_tokens']}")
    ax.axvline(
        s["max_num_batched_tokens"], color="gray", ls="-.", lw=0.8, label="max_num_batched_tokens"
    )
    ax.set_xlabel("tokens per forward N")
    ax.set_ylabel("speedup vs plain TP (t_tp / t)")
    mod = " (modified)" if a.profile.modified else ""
    ax.set_title(f"{a.shape.name} on {a.profile.name}{mod} x{a.run.tp}, {a.run.dtype}")
    _finish(plt, fig, ax, path)


def plot_collective_log(rows: list[dict], title: str, path: str) -> None:
    """Measured and predicted busBW over message size, vLLM's dispatch changes marked (§4)."""
    # Log axes: NCCL's predicted curve against the log's NCCL run, vLLM's dispatched implementation
    # beside it.
    plt = pyplot()
    size = np.array([r["size_bytes"] for r in rows], dtype=float)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    ax.loglog(
        size,
        [r["busbw_measured_bytes_per_s"] / 1e9 for r in rows],
        "o-",
        label="measured (the log: NCCL)",
    )
    ax.loglog(
        size, [r["busbw_nccl_bytes_per_s"] / 1e9 for r in rows], "s--", label="predicted NCCL"
    )
    ax.loglog(
        size,
        [r["busbw_vllm_bytes_per_s"] / 1e9 for r in rows],
        ":",
        color="gray",
        label="predicted, vLLM's pick",
    )
    for i in range(1, len(rows)):
        if rows[i]["vllm_impl"] != rows[i - 1]["vllm_impl"]:
            ax.axvline(size[i], color="C2", lw=0.8, ls="-.")
            ax.text(
                size[i],
                ax.get_ylim()[0],
                f" {rows[i]['vllm_impl']}",
                rotation=90,
                fontsize=7,
                va="bottom",
            )
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busBW (GB/s, nccl-tests' convention)")
    ax.set_title(title, fontsize=9)
    _finish(plt, fig, ax, path)


def plot_dbo(
    tokens: Any,
    t_off_s: Any,
    t_on_s: Any,
    crossover: int | None,
    threshold: int | None,
    title: str,
    path: str,
) -> None:
    """One phase's step time over tokens per rank, DBO off and on, crossover and threshold (§12)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    ax.plot(tokens, np.asarray(t_off_s) * 1e3, label="DBO off")
    ax.plot(tokens, np.asarray(t_on_s) * 1e3, label="DBO on (two microbatches)")
    if crossover is not None:
        ax.axvline(crossover, color="C2", ls=":", label=f"crossover {crossover}")
    if threshold is not None:
        ax.axvline(threshold, color="C3", ls="--", label=f"decided threshold {threshold}")
    ax.set_xlabel("tokens per DP rank")
    ax.set_ylabel("step time per rank [ms]")
    ax.set_title(title, fontsize=9)
    _finish(plt, fig, ax, path)
