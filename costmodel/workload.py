"""The operator's traffic: how often each step size occurs (docs/model.md §14)."""
# The operator's traffic: how often each token count per engine step occurs (docs/model.md §9).
#
# Two inputs:
# - a Prometheus text exposition scraped from vLLM's `/metrics`: the cumulative buckets of
#   `vllm:iteration_tokens_total` (tokens per engine step, vllm/v1/metrics/loggers.py), summed
#   over engines and every other label;
# - a CSV `num_tokens,count`, optionally with a third column `context_len`: the KV context of
#   those steps' decodes (decode_regime; docs/model.md §5).
#
# The decision is taken on the multiples of tp (SP pads a step of N tokens to ⌈N/tp⌉·tp), so every
# count lands on the grid point of its padded size. A histogram bucket (lo, hi] is spread over the
# grid points inside it: uniformly by default; "upper" puts it all at hi, "lower" all at the first
# point above lo.

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import numpy as np

from .errors import TpcostError
from .io import finite_float, read_text

METRIC = "vllm:iteration_tokens_total"
MAX_CONTEXT_LEN = 2**24  # 16 M tokens: beyond any context window served today
# tokens of one step (or a finite bucket bound): ~1e12, beyond any token budget by 10^6
MAX_STEP_TOKENS = 2**40
SPREADS = ("uniform", "upper", "lower")
# a workload's phase column: vLLM's uniform-decode steps, and every other step
PHASES = (
    "decode",
    "mixed",
)
_SAMPLE = re.compile(
    r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$"
)
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')


@dataclasses.dataclass(frozen=True)
class Workload:
    """Counts of engine steps: histogram `buckets` (lo, hi, count) or `points` (n, count) (§14)."""

    name: str
    buckets: tuple[tuple[float, float, float], ...] = ()
    points: tuple[tuple[int, float], ...] = ()
    contexts: tuple[
        tuple[int, float, int], ...
    ] = ()  # (num_tokens, count, context_len) rows of a CSV that has them
    phases: tuple[
        tuple[int, float, str], ...
    ] = ()  # (tokens per DP rank, count, decode|mixed): tpcost ep's DBO

    @property
    def total(self) -> float:
        return sum(c for *_, c in self.buckets) + sum(c for _, c in self.points)


def _labels(text: str, where: str) -> dict[str, str]:
    out, pos = {}, 0
    text = text.strip()
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if not m:
            raise TpcostError(f"{where}: malformed labels {{{text}}}")
        out[m.group(1)] = m.group(2)
        pos = m.end()
    return out


def parse_prometheus(text: str, where: str) -> Workload:
    """The `vllm:iteration_tokens_total` histogram of a /metrics scrape, all labels summed (§14)."""
    cum: dict[float, float] = {}
    for i, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise TpcostError(f"{where}:{i}: not a Prometheus sample line")
        if m.group("name") != METRIC + "_bucket":
            continue
        labels = _labels(m.group("labels") or "", f"{where}:{i}")
        if "le" not in labels:
            raise TpcostError(f"{where}:{i}: {METRIC}_bucket without an le label")
        try:
            le = math.inf if labels["le"] in ("+Inf", "Inf", "inf") else float(labels["le"])
            v = float(m.group("value"))
        except ValueError:
            raise TpcostError(f"{where}:{i}: bucket bound or count is not a number") from None
        if not (math.isfinite(v) and v >= 0) or not (le > 0):
            raise TpcostError(f"{where}:{i}: bucket counts must be finite and >= 0, bounds > 0")
        if math.isfinite(le) and le > MAX_STEP_TOKENS:
            raise TpcostError(
                f"{where}:{i}: bucket bound le={labels['le']} is above 2^40 tokens (no step is "
                "that "
                'large; the last bucket is le="+Inf")'
            )
        cum[le] = cum.get(le, 0.0) + v
        if not math.isfinite(cum[le]):
            raise TpcostError(f"{where}:{i}: the bucket counts sum to more than a float holds")
    if not cum:
        raise TpcostError(f"{where}: no {METRIC}_bucket samples (scrape vLLM's /metrics endpoint)")
    bounds = sorted(cum)
    counts = [cum[b] for b in bounds]
    if any(b < a - 1e-9 * max(1.0, a) for a, b in zip(counts, counts[1:])):
        raise TpcostError(
            f"{where}: {METRIC} buckets are not cumulative (a count decreases with le)"
        )
    buckets, lo, prev = [], 0.0, 0.0
    for b, c in zip(bounds, counts):
        if c - prev > 0:
            buckets.append((lo, b, c - prev))
        lo, prev = b, c
    if not buckets:
        raise TpcostError(f"{where}: {METRIC} has no observations yet")
    return Workload(name=f"{where} ({METRIC}, {prev:.0f} steps)", buckets=tuple(buckets))


def parse_csv(text: str, where: str) -> Workload:
    """A CSV with a header `num_tokens,count` (counts may be fractions: weights; §14)."""
    import csv

    rows = [r for r in csv.reader(text.splitlines()) if any(c.strip() for c in r)]
    header = [c.strip() for c in rows[0]] if rows else []
    if header not in (
        ["num_tokens", "count"],
        ["num_tokens", "count", "context_len"],
        ["num_tokens", "count", "phase"],
    ):
        raise TpcostError(
            f"{where}: expected a header 'num_tokens,count', 'num_tokens,count,context_len' or "
            "'num_tokens,count,phase'"
        )
    pts: dict[int, float] = {}
    ctx: list[tuple[int, float, int]] = []
    phs: list[tuple[int, float, str]] = []
    for i, r in enumerate(rows[1:], start=2):
        if len(r) != len(header):
            raise TpcostError(f"{where}:{i}: expected {len(header)} cells, got {len(r)}")
        n, c = r[0].strip(), r[1].strip()
        if not (n.isascii() and n.isdigit()):
            raise TpcostError(f"{where}:{i}: num_tokens {n[:20]!r} is not a positive integer")
        # the length first: int() refuses over 4300 digits
        if len(n) > 13 or int(n) > MAX_STEP_TOKENS:
            raise TpcostError(
                f"{where}:{i}: num_tokens {n[:20]}{'...' if len(n) > 20 else ''} is above 2^40 "
                "tokens "
                "(no step is that large)"
            )
        if int(n) < 1:
            raise TpcostError(f"{where}:{i}: num_tokens {n!r} is not a positive integer")
        cv = finite_float(c, f"{where}:{i}: count", nonneg=True)
        pts[int(n)] = pts.get(int(n), 0.0) + cv
        if header[-1] == "phase":
            ph = r[2].strip()
            if ph not in PHASES:
                raise TpcostError(
                    f"{where}:{i}: phase {ph[:20]!r} is not one of {', '.join(PHASES)} (a uniform "
                    "decode "
                    "step, or one with prefill tokens)"
                )
            phs.append((int(n), cv, ph))
        elif len(header) == 3:
            k = r[2].strip()
            if not (k.isascii() and k.isdigit()) or not 1 <= int(k) <= MAX_CONTEXT_LEN:
                raise TpcostError(
                    f"{where}:{i}: context_len {k!r} is not an integer in [1, {MAX_CONTEXT_LEN}]"
                )
            ctx.append((int(n), cv, int(k)))
    if not math.isfinite(sum(pts.values())):
        raise TpcostError(
            f"{where}: the counts sum to more than a float holds; scale them down (only their "
            "ratios "
            "matter)"
        )
    if sum(pts.values()) <= 0:
        raise TpcostError(f"{where}: no steps counted")
    cols = ",".join(header)
    return Workload(
        name=f"{where} ({cols}, {sum(pts.values()):g} steps)",
        points=tuple(sorted(pts.items())),
        contexts=tuple(ctx),
        phases=tuple(phs),
    )


def phase_workload(w: Workload, phase: str) -> Workload | None:
    """The steps of one phase of a workload with a phase column (None: it counts none; §14)."""
    # A workload without one is the same traffic for both phases.
    if not w.phases:
        return w
    pts: dict[int, float] = {}
    for n, c, ph in w.phases:
        if ph == phase:
            pts[n] = pts.get(n, 0.0) + c
    if sum(pts.values()) <= 0:
        return None
    return Workload(name=f"{w.name}, {phase} rows", points=tuple(sorted(pts.items())))


def read_workload(path: str) -> Workload:
    """A workload file: a Prometheus scrape or a num_tokens,count CSV (§14)."""
    text = read_text(path, "workload")
    if METRIC in text or text.lstrip().startswith("#"):
        return parse_prometheus(text, str(path))
    return parse_csv(text, str(path))


def uniform_workload(grid: np.ndarray) -> np.ndarray:
    """The default workload: every grid point equally likely (sum 1; §9)."""
    # The grid: the multiples of tp up to the budget.
    return np.full(np.shape(grid), 1.0 / np.size(grid))


def weights_on(w: Workload | None, grid: np.ndarray, spread: str = "uniform") -> np.ndarray:
    """The traffic a decision is weighted by, on a sorted grid (sum 1; §9)."""
    # The workload's (grid_weights), or without one the default, uniform over the grid (the one home
    # of that fallback).
    return uniform_workload(grid) if w is None else grid_weights(w, grid, spread)


def grid_weights(w: Workload, grid: np.ndarray, spread: str = "uniform") -> np.ndarray:
    """The workload as weights on a sorted grid of token counts (sum 1; §14)."""
    # a step of n tokens counts at the first grid point >= n (the padded step on a grid of multiples
    # of tp); a point of n tokens above the grid's top (the budget) is what vLLM runs as ceil(n /
    # budget) chunked steps: floor(n / budget) at the top and the rest where it lands (chunked_note
    # says so); histogram buckets above the top count at the top (vLLM's own histogram never records
    # a step above the budget). A histogram bucket (lo, hi] is spread over the token counts inside
    # it ("uniform"), or put at its top ("upper") or bottom ("lower") grid point.
    if spread not in SPREADS:
        raise TpcostError(f"unknown spread {spread!r}; one of {', '.join(SPREADS)}")
    grid = np.asarray(grid, dtype=float)
    out = np.zeros(grid.size)
    top = grid.size - 1
    edges = np.floor(grid)  # grid point j takes the token counts in (edges[j-1], edges[j]]

    def index(n):
        return int(min(top, np.searchsorted(grid, n, side="left")))

    for n, c in w.points:
        for at, cnt in _steps_on_grid(n, c, grid):
            out[at] += cnt
    for lo, hi, c in w.buckets:
        hi_eff = min(hi, grid[-1])
        lo_eff = min(lo, grid[-1] - 1)
        first, last = index(math.floor(lo_eff) + 1), index(hi_eff)
        if spread == "upper":
            out[last] += c
        elif spread == "lower":
            out[first] += c
        else:  # the integers in (lo, hi], each at its grid point
            a, b = math.floor(lo_eff), math.floor(hi_eff)
            below = np.concatenate([[-np.inf], edges[:-1]])
            counts = np.clip(np.minimum(b, edges) - np.maximum(a, below), 0.0, None)
            out += c * counts / max(counts.sum(), 1.0)
    total = out.sum()
    if total <= 0:
        raise TpcostError(f"{w.name}: no steps within the grid")
    return out / total


def _steps_on_grid(n: int, count: float, grid: np.ndarray) -> list[tuple[int, float]]:
    """Where `count` steps of n tokens land on a sorted grid, (index, count) pairs: at the first
    point >= n; above the grid's top (the budget) as the ceil(n / budget) chunked steps vLLM runs,
    floor(n / budget) at the top and the rest where it lands."""
    top, budget = grid.size - 1, float(grid[-1])
    full, rest = divmod(float(n), budget) if n > budget else (0.0, float(n))
    out = [(top, count * full)] if full else []
    if rest:
        out.append((min(top, int(np.searchsorted(grid, rest, side="left"))), count))
    return out


def chunked_note(w: Workload, budget: int) -> str | None:
    """One line on the workload's steps above the token budget (§14)."""
    # grid_weights weights them as chunked steps.
    above = sum(c for n, c in w.points if n > budget)
    if not above:
        return None
    return (
        f"{above:g} of {w.total:g} steps exceed max_num_batched_tokens {budget}: each counted as "
        f"the ceil(n/{budget}) "
        "chunked steps vLLM runs"
    )


def decode_regime(w: Workload | None, grid: np.ndarray, max_num_seqs: int) -> Any:
    """The decode regime a workload's context_len column states, or None (§14)."""
    # The decode regime a workload with a context_len column states (costmodel.model.DecodeRegime),
    # or None where it has none: on each point of the sorted grid the count-weighted mean context of
    # the steps that count there (grid_weights' mapping: the first point >= n, a step above the top
    # as its chunks), the workload's mean context at every other point. The KV read is linear in the
    # context, so the mean gives each point's expected time.
    from .model import DecodeRegime

    if w is None or not w.contexts:
        return None
    grid = np.asarray(grid, dtype=float)
    num, den = np.zeros(grid.size), np.zeros(grid.size)
    for n, c, k in w.contexts:
        for at, cnt in _steps_on_grid(n, c, grid):
            num[at] += cnt * k
            den[at] += cnt
    if den.sum() <= 0:
        raise TpcostError(f"{w.name}: the rows with a context_len count no steps")
    mean = float(num.sum() / den.sum())
    vals = np.where(den > 0, num / np.where(den > 0, den, 1.0), mean)
    return DecodeRegime(
        mean,
        max_num_seqs,
        tuple(float(g) for g in grid),
        tuple(float(v) for v in vals),
        tuple(bool(d > 0) for d in den),
    )
