"""Plots (matplotlib is an optional extra, imported only here)."""

from __future__ import annotations

import numpy as np

from .errors import TpcostError
from .io import savefig_atomic


def _plt():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TpcostError("--plot needs matplotlib: pip install 'tpcost[plot]'") from None
    return plt


def plot_whatif(a, path: str) -> None:
    """Speedup vs N for sp and sp_asynctp, the cutoff and its band marked."""
    from .model import predict

    plt = _plt()
    n = np.unique(np.round(np.geomspace(a.tp, 65536, 400) / a.tp) * a.tp)
    pred = predict(a.profile, a.shape, a.tp, a.dtype, n, a.seq_len)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    ax.semilogx(n, pred.speedup_sp_asynctp, label="SP + AsyncTP")
    ax.semilogx(n, pred.speedup_sp, label="SP alone", alpha=0.8)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(1.0 + a.margin, color="k", lw=0.6, ls=":", label=f"1 + margin ({a.margin:.0%})")
    if a.cutoff_band_tokens:
        lo, hi = a.cutoff_band_tokens
        ax.axvspan(lo or a.tp, hi or 65536, color="C2", alpha=0.15, label="cutoff band (5-95%)")
    if a.cutoff_tokens:
        ax.axvline(a.cutoff_tokens, color="C2", ls="--", label=f"cutoff {a.cutoff_tokens}")
    ax.axvline(a.max_num_batched_tokens, color="gray", ls="-.", lw=0.8, label="max_num_batched_tokens")
    ax.set_xlabel("tokens per forward N")
    ax.set_ylabel("speedup vs plain TP (t_tp / t)")
    mod = " (modified)" if a.profile.modified else ""
    ax.set_title(f"{a.shape.name} on {a.profile.name}{mod} x{a.tp}, {a.dtype}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    try:
        savefig_atomic(fig, path, dpi=110)
    finally:
        plt.close(fig)
