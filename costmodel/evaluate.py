"""`tpcost evaluate`: predictions scored against measured overlap data (docs/model.md §16)."""
# Verdict accuracy, regret and error, side by side with vLLM 0.31's own sp_min_token_num rule on
# the same rows.

from __future__ import annotations

from typing import Any
import csv
from collections.abc import Mapping
import dataclasses
import math

import numpy as np

from . import fused_ops
from .errors import TpcostError
from .io import read_text
from .io import savefig_atomic
from . import vllm_tables
from .defaults import DEFAULT_SEQ_LEN
from .vllm_tables import Vllm

OP_COLUMNS = ("hardware", "tp", "op", "dtype", "m", "n", "k", "baseline_us", "overlap_us", "source")
MODEL_COLUMNS = (
    "hardware",
    "tp",
    "model",
    "dtype",
    "num_tokens",
    "baseline_us",
    "overlap_us",
    "scope",
    "source",
)
# tp (default) | sp; default defaults.DEFAULT_SEQ_LEN
OPTIONAL_MODEL_COLUMNS = (
    "baseline_schedule",
    "seq_len",
)
# impl: torch (default; torch's pipelined symm-mem ops) | kernel (the single-kernel GEMM+RS/AR,
# docs/model.md §6b); baseline_impl: nccl (the GEMM then NCCL) | vllm (the GEMM then vLLM's
# dispatched collective); default the arm `tpcost op` prices against (fused_ops: nccl for torch's
# ops, vllm for the single kernel); harness_us: a benchmark's own time on both arms (>= 0; a
# source's fitted offset, calib/reference.py FamilyFit)
OPTIONAL_OP_COLUMNS = ("impl", "baseline_impl", "harness_us")
# a published row's unfused arm (fused_ops: "nccl" unless its column says)
BASELINE_IMPLS = (
    "nccl",
    "vllm",
)
TIE_BAND = 0.02  # a measured speedup within 2 % of 1 is a tie: either verdict counts as right
INT_LIMITS = {"tp": 4096, "m": 2**24, "n": 2**20, "k": 2**20, "num_tokens": 2**24, "seq_len": 2**24}


def op_csv_header() -> str:
    """The header calibrate writes for its fused-vs-sequential ops (op schema; §16)."""
    return ",".join(OP_COLUMNS + ("impl",))


def schemas_text() -> str:
    """Both schemas' columns in one line, for a header neither fits (§16)."""
    # docs/commands.md "CSV formats".
    return (
        f"an op CSV has {','.join(OP_COLUMNS)} (optional: {','.join(OPTIONAL_OP_COLUMNS)}); a "
        "model CSV has "
        f"{','.join(MODEL_COLUMNS)} (optional: {','.join(OPTIONAL_MODEL_COLUMNS)}); "
        "docs/commands.md, "
        '"CSV formats"'
    )


def model_csv_header() -> str:
    """The header validate writes for its layer timings (the model-level schema; §16)."""
    return ",".join(MODEL_COLUMNS)


@dataclasses.dataclass(frozen=True)
class Scored:
    file: str
    line: int
    label: str
    source: str
    s_measured: float
    s_predicted: float
    verdict_measured: bool
    verdict_predicted: bool
    regret_pct: float
    vllm_verdict: bool
    vllm_regret_pct: float
    # 5th-95th percentile of the predicted speedup over the profile's Monte Carlo draws
    band_lo: float | None = None
    band_hi: float | None = None

    @property
    def covered(self) -> bool | None:
        """Whether the band holds the measured speedup (None: no band computed; §16)."""
        if self.band_lo is None or self.band_hi is None:
            return None
        return self.band_lo <= self.s_measured <= self.band_hi

    @property
    def abs_error(self) -> float:
        return abs(self.s_predicted - self.s_measured)

    @property
    def tie(self) -> bool:
        return abs(self.s_measured - 1.0) <= TIE_BAND

    @property
    def right(self) -> bool:
        return self.tie or self.verdict_predicted == self.verdict_measured

    @property
    def vllm_right(self) -> bool:
        return self.tie or self.vllm_verdict == self.verdict_measured


def score(
    where: tuple[str, int, str, str],
    base_s: float,
    over_s: float,
    s_predicted: float,
    vllm_runs: bool,
    band: tuple[float | None, float | None] = (None, None),
) -> Scored:
    """One measured row scored: the one scoring of evaluate and the accuracy benchmark (§16)."""
    # One measured row scored (the one scoring: tpcost evaluate and benchmarks/accuracy.py): `where`
    # = (path, line, label, source); the measured baseline and overlapped times (any one unit), the
    # predicted speedup, whether vLLM's own rule runs the fused path there; verdicts, ties
    # (TIE_BAND) and regrets follow.
    v_pred = s_predicted > 1.0
    return Scored(
        *where,
        base_s / over_s,
        s_predicted,
        over_s < base_s,
        v_pred,
        _regret(v_pred, base_s, over_s),
        vllm_runs,
        _regret(vllm_runs, base_s, over_s),
        *band,
    )


def _regret(choose_overlap: bool, base: float, over: float) -> float:
    """100·(time of the chosen schedule − time of the better one)/time of the better one (%)."""
    best = min(base, over)
    return 100.0 * ((over if choose_overlap else base) - best) / best


def _int_cell(path, line, col, text):
    """A cell that must hold a positive integer: digits, or an integral decimal as pandas writes it
    (4.0); not NaN, inf, 1e400 or a non-ASCII digit: the int, or exit 2."""
    t = text.strip()
    whole, dot, frac = t.partition(".")
    if dot and whole and frac.strip("0") == "":
        t = whole
    if not (t.isascii() and t.isdigit()):
        raise TpcostError(f"{path}:{line}: {col} {text!r} is not a positive integer")
    v = int(t)
    if v <= 0 or v > INT_LIMITS[col]:
        raise TpcostError(f"{path}:{line}: {col} = {v} must be in [1, {INT_LIMITS[col]}]")
    return v


def _time_cell(path, line, col, text, zero_ok=False):
    try:
        v = float(text)
    except ValueError:
        raise TpcostError(f"{path}:{line}: {col} {text!r} is not a number") from None
    if not math.isfinite(v) or v < 0 or (v == 0 and not zero_ok):
        raise TpcostError(
            f"{path}:{line}: {col} must be a finite time {'>=' if zero_ok else '>'} 0 us, got "
            f"{text}"
        )
    return v


def read_rows(path: str) -> tuple[str, list]:  # noqa: C901 (one pass of per-cell checks, each a one-line error)
    """(schema, rows with line numbers); a malformed cell is exit 2 naming file:line (§16)."""
    # A file with only a header gives (schema, []); the caller reports it.
    text = read_text(path, "CSV")
    lines = text.splitlines()
    numbered = [(i, ln) for i, ln in enumerate(lines, start=1) if ln.strip()]
    if not numbered:
        raise TpcostError(f"{path}: empty file (expected a header row)")
    try:
        parsed = list(csv.reader([ln for _, ln in numbered], strict=True))
    except csv.Error as e:
        raise TpcostError(f"{path}: malformed CSV: {e}") from None
    header = [h.strip() for h in parsed[0]]
    schema = "model" if "model" in header else "op" if "op" in header else None
    if schema is None:
        raise TpcostError(
            f"{path}: header has neither an 'op' nor a 'model' column: cannot tell the schema; "
            + schemas_text()
        )
    cols = OP_COLUMNS if schema == "op" else MODEL_COLUMNS
    allowed = cols + (OPTIONAL_MODEL_COLUMNS if schema == "model" else OPTIONAL_OP_COLUMNS)
    dup = sorted({h for h in header if header.count(h) > 1})
    if dup:
        raise TpcostError(f"{path}:{numbered[0][0]}: duplicate column {dup[0]!r}")
    for h in header:
        if h not in allowed:
            raise TpcostError(
                f"{path}: unknown column {h!r} for the {schema}-level schema ({','.join(allowed)})"
            )
    for c in cols:
        if c not in header:
            raise TpcostError(f"{path}: missing column {c!r} for the {schema}-level schema")
    rows = []
    for (line, _), cells in zip(numbered[1:], parsed[1:]):
        if len(cells) != len(header):
            raise TpcostError(f"{path}:{line}: {len(cells)} cells for {len(header)} columns")
        r = {h: c.strip() for h, c in zip(header, cells)}
        for c in ("baseline_us", "overlap_us"):
            if r[c] != "":
                r[c] = _time_cell(path, line, c, r[c])
        if r.get("harness_us", "") != "":
            r["harness_us"] = _time_cell(path, line, "harness_us", r["harness_us"], zero_ok=True)
        for c in ("tp", "m", "n", "k", "num_tokens", "seq_len"):
            if r.get(c, "") != "":
                r[c] = _int_cell(path, line, c, r[c])
        if schema == "op":
            if r.get("impl", "") not in ("",) + fused_ops.impl_names():
                raise TpcostError(
                    f"{path}:{line}: impl must be one of {', '.join(fused_ops.impl_names())}, got "
                    f"{r['impl']!r}"
                )
            if r.get("baseline_impl", "") not in ("",) + BASELINE_IMPLS:
                raise TpcostError(
                    f"{path}:{line}: baseline_impl must be one of {', '.join(BASELINE_IMPLS)}, "
                    f"got {r['baseline_impl']!r}"
                )
        if schema == "model":
            if r.get("baseline_schedule", "") not in ("", "tp", "sp"):
                raise TpcostError(
                    f"{path}:{line}: baseline_schedule must be tp or sp, got "
                    f"{r['baseline_schedule']!r}"
                )
            if r["scope"] not in ("layer", "forward"):
                raise TpcostError(
                    f"{path}:{line}: scope must be layer or forward, got {r['scope']!r}"
                )
        rows.append((line, r))
    return schema, rows


class _Skip(Exception):
    pass


def _implied_impl(op: str) -> str:
    """The implementation of a row whose impl cell is empty: the op's one registered implementation;
    where the op has several (gemm_rs: torch's and the single kernel), the row is refused, never
    scored as one of them silently."""
    impls = [i for o, i in fused_ops.REGISTRY if o == op]
    if len(impls) > 1:
        raise _Skip(
            f"impl is empty, and {op} has {len(impls)} implementations ({', '.join(impls)}): name "
            "the one the "
            "row timed in an impl column"
        )
    return impls[0] if impls else fused_ops.DEFAULT_IMPL


def _impl_label(r) -> str:
    """' <impl>' in a row's label where the row names an implementation other than the default."""
    impl = r.get("impl") or _implied_impl(r["op"])
    return "" if impl == fused_ops.DEFAULT_IMPL else f" {impl}"


def _need(r, *cols):
    for c in cols:
        if r.get(c, "") == "":
            raise _Skip(f"missing {c}")


def _beside(name: str, csv_path: str) -> str:
    """A relative file path in a CSV cell, resolved against the CSV's own directory when the file is
    there (what calibrate and validate write), else as given (a built-in name, or a path from the
    working directory)."""
    from pathlib import Path

    p = Path(name)
    if p.is_absolute() or not name:
        return name
    cand = Path(csv_path).parent / p
    return str(cand) if cand.exists() else name


def _profile(cache, name):
    from .profile import load_profile

    if name not in cache:
        try:
            cache[name] = load_profile(name)
        except TpcostError as e:
            cache[name] = e
    if isinstance(cache[name], TpcostError):
        raise _Skip(str(cache[name]))
    return cache[name]


def predict_op_row(
    prof: Any, row: Mapping[str, Any], vllm: Vllm, eager: bool = True, all_draws: bool = False
) -> tuple[Any, int]:
    """(predicted speedup, hidden size vLLM's rule sees) of one microbenchmark row (§16)."""
    # (predicted speedup of the fused op over its sequential arm, hidden size vLLM's rule sees) for
    # one microbenchmark row (an op CSV's parsed row: op, dtype, tp, m, n, k, impl, baseline_impl);
    # by default the fused op runs eagerly (a Python loop issued per call, as in the benchmarks),
    # `eager=False` under CUDA-graph replay (no host issue time). impl "kernel": the single-kernel
    # family; baseline_impl "vllm": the GEMM then vLLM's dispatched collective of `vllm`.
    # `all_draws`: the speedup of every Monte Carlo draw of a drawn profile (an array) instead of
    # one float.
    op, dtype, tp = row["op"], row["dtype"], row["tp"]
    n, k = row.get("n") or None, row.get("k") or None
    impl = row.get("impl") or _implied_impl(op)
    h = float(row.get("harness_us") or 0.0) * 1e-6  # the benchmark's own time, on both arms
    try:
        kind = fused_ops.kind(op, impl)
    except TpcostError as e:
        raise _Skip(str(e)) from None
    # the arm `op` prices against
    baseline_impl = row.get("baseline_impl") or kind.published_baseline
    why = kind.why_not(prof, tp, dtype, n)  # the registry's eligibility, the one `op` applies
    if why:
        raise _Skip(why)
    if n is None or k is None:
        raise _Skip(f"missing {'n' if n is None else 'k'}")
    try:
        s_all, hidden = kind.published_speedup(
            prof, {**row, "n": n, "k": k, "baseline_impl": baseline_impl}, vllm, eager, h
        )
    except TpcostError as e:  # a row the op cannot run (the entry says why)
        raise _Skip(str(e)) from None
    return (s_all if all_draws else float(s_all[0])), hidden


def _model_groups(rows, profiles, models, skipped, path):
    """Model-level rows grouped by everything but N, so that each group is one predict() over its
    N."""
    from .shapes import load_model

    groups: dict = {}
    for line, r in rows:
        where = f"{path}:{line}"
        try:
            _need(r, "baseline_us", "overlap_us", "hardware", "tp", "num_tokens", "model", "dtype")
            prof = _profile(profiles, _beside(r["hardware"], path))
            r["model"] = _beside(r["model"], path)
            if r["model"] not in models:
                try:
                    models[r["model"]] = load_model(r["model"])
                except TpcostError as e:
                    models[r["model"]] = e
            shape = models[r["model"]]
            if isinstance(shape, TpcostError):
                raise _Skip(str(shape))
            try:
                shape.check_tp(r["tp"])
                from .shapes import check_dtype

                check_dtype(r["dtype"])
            except TpcostError as e:
                raise _Skip(str(e)) from None
            key = (
                r["hardware"],
                r["model"],
                r["tp"],
                r["dtype"],
                r["scope"],
                r.get("baseline_schedule") or "tp",
                r.get("seq_len") or DEFAULT_SEQ_LEN,
            )
            groups.setdefault(key, (prof, shape, []))[2].append((line, r))
        except _Skip as e:
            skipped.append({"where": where, "reason": str(e)})
    return groups


def evaluate_files(
    paths: list[str],
    vllm: Vllm,
    cudagraph_max_tokens: int | None = None,
    band: bool = False,
    band_sigma: Mapping[str, float] | None = None,
) -> tuple[list[Scored], list[dict]]:
    """Score every row of `paths` (§16)."""
    # `cudagraph_max_tokens`: None keeps each set's own regime (op microbenchmarks eager; model rows
    # vLLM's default capture size), else rows of more tokens run eagerly and the rest replay graphs
    # (0: everything eager). `band`: each op row's 5-95 % band over the profile's draws, the keys
    # `band_sigma` names drawn at its σ instead of their own (calib/band.py: the model error it
    # calibrates, 0 holding it).
    from .model import Regime, predict
    from .vllm_tables import vllm_sp_min_token_num

    scored, skipped = [], []
    profiles: dict = {}
    models: dict = {}
    parsed = [(path, *read_rows(path)) for path in paths]
    if all(not rows for _, _, rows in parsed):
        raise TpcostError(f"{', '.join(paths)}: no data rows (only a header)")

    def vllm_verdict(prof, hidden, tp, tokens):
        thr = vllm_sp_min_token_num(
            prof.identity.vendor, prof.identity.compute_capability, hidden, tp, 2
        )
        return thr is not None and tokens >= thr

    drawn: dict = {}

    def band_of(prof, r, eager):
        """5-95 % of the op row's predicted speedup over the profile's band draws
        (costmodel.analysis)."""
        from .analysis import BAND_DRAWS, BAND_SEED, perturbed_values

        if prof.name not in drawn:
            drawn[prof.name] = prof.with_values(
                perturbed_values(prof, BAND_DRAWS, BAND_SEED, band_sigma), None, mark_modified=False
            )
        s_d, _ = predict_op_row(drawn[prof.name], r, vllm, eager, all_draws=True)
        return float(np.percentile(s_d, 5)), float(np.percentile(s_d, 95))

    def add(path, line, r, label, prof, s_hat, hidden, tokens, bounds=(None, None)):
        base, over = r["baseline_us"], r["overlap_us"]
        if (
            "op" in r
            # an op row: vLLM's own rule for that op and implementation (its SP table, gemm_rs_ar's
            # M >= 128)
        ):
            kind = fused_ops.kind(r["op"], r.get("impl") or _implied_impl(r["op"]))
            runs = kind.published_rule(prof, r["tp"], r["n"], r["k"], vllm).runs
            v_vllm = bool(runs(float(tokens)))
        else:
            v_vllm = vllm_verdict(prof, hidden, r["tp"], tokens)
        scored.append(score((path, line, label, r["source"]), base, over, s_hat, v_vllm, bounds))

    for path, schema, rows in parsed:
        if not rows:
            skipped.append({"where": path, "reason": "only a header: no data rows"})
            continue
        if schema == "op":
            for line, r in rows:
                try:
                    _need(r, "baseline_us", "overlap_us", "hardware", "tp", "m", "op", "dtype")
                    prof = _profile(profiles, _beside(r["hardware"], path))
                    eager = cudagraph_max_tokens is None or bool(
                        vllm_tables.runs_eagerly(r["m"], cudagraph_max_tokens)
                    )
                    s_hat, hidden = predict_op_row(prof, r, vllm, eager)
                except _Skip as e:
                    skipped.append({"where": f"{path}:{line}", "reason": str(e)})
                    continue
                label = (
                    f"{r['hardware']} tp{r['tp']} {r['op']}{_impl_label(r)} "
                    f"{r['dtype']} m={r['m']} n={r['n']} k={r['k']}"
                )
                add(
                    path,
                    line,
                    r,
                    label,
                    prof,
                    s_hat,
                    hidden,
                    r["m"],
                    band_of(prof, r, eager) if band else (None, None),
                )
            continue
        for (hwname, model, tp, dtype, scope, base_sched, seq_len), (
            prof,
            shape,
            members,
        ) in _model_groups(rows, profiles, models, skipped, path).items():
            n_tok = np.array([float(r["num_tokens"]) for _, r in members])
            pred = predict(
                prof, shape, tp, dtype, n_tok, Regime(seq_len, cudagraph_max_tokens, vllm=vllm)
            )
            attr = "t_layer_s" if scope == "layer" else "t_forward_s"
            with np.errstate(invalid="ignore"):
                s_all = np.ravel(
                    getattr(pred.schedules[base_sched], attr)
                    / getattr(pred.schedules["sp_asynctp"], attr)
                )
            for (line, r), s_hat in zip(members, s_all):
                # a schedule that cannot run here: nothing to score
                if not np.isfinite(s_hat) or s_hat <= 0:
                    why = (
                        pred.unavailable.get("sp_asynctp")
                        or pred.unavailable.get(base_sched)
                        or "not predictable"
                    )
                    skipped.append({"where": f"{path}:{line}", "reason": why})
                    continue
                label = (
                    f"{hwname} tp{tp} {model} {dtype} N={r['num_tokens']} {scope} vs {base_sched}"
                )
                add(path, line, r, label, prof, float(s_hat), shape.hidden, r["num_tokens"])
    return scored, skipped


def summarise(scored: list[Scored], skipped: list[dict]) -> dict:
    if scored:
        err = np.array([s.abs_error for s in scored])
        reg = np.array([s.regret_pct for s in scored])
        vreg = np.array([s.vllm_regret_pct for s in scored])
        acc = float(np.mean([s.right for s in scored]))
        vacc = float(np.mean([s.vllm_right for s in scored]))
        # the bias: median of ln(predicted / measured speedup), > 0 where the model predicts the op
        # too good
        bias = float(np.median(np.log([s.s_predicted / s.s_measured for s in scored])))
        out = {
            "verdict_accuracy": acc,
            "median_abs_speedup_error": float(np.median(err)),
            "median_signed_log_error": bias,
            "p90_abs_speedup_error": float(np.percentile(err, 90)),
            "max_abs_speedup_error": float(err.max()),
            "ties": int(sum(s.tie for s in scored)),
            "mean_regret_pct": float(reg.mean()),
            "max_regret_pct": float(reg.max()),
            "vllm_rule": {
                "verdict_accuracy": vacc,
                "mean_regret_pct": float(vreg.mean()),
                "max_regret_pct": float(vreg.max()),
            },
        }
    else:
        out = {
            k: None
            for k in (
                "verdict_accuracy",
                "median_abs_speedup_error",
                "median_signed_log_error",
                "p90_abs_speedup_error",
                "max_abs_speedup_error",
                "ties",
                "mean_regret_pct",
                "max_regret_pct",
            )
        }
        out["vllm_rule"] = {
            "verdict_accuracy": None,
            "mean_regret_pct": None,
            "max_regret_pct": None,
        }
    cov = [s.covered for s in scored if s.covered is not None]
    out["band_coverage"] = {"rows": len(cov), "covered": float(np.mean(cov)) if cov else None}
    out.update(rows_scored=len(scored), rows_skipped=len(skipped), skipped=skipped)
    return out


def evaluation_series(scored: list[Scored]) -> dict:
    """What plot_evaluation draws: measured and predicted speedups, wrong verdicts (§16)."""
    return {
        "measured": np.array([x.s_measured for x in scored]),
        "predicted": np.array([x.s_predicted for x in scored]),
        "wrong": np.array([not x.right for x in scored], dtype=bool),
    }


def plot_evaluation(scored: list[Scored], path: str) -> None:
    from .plot import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    series = evaluation_series(scored)
    s, p, wrong = series["measured"], series["predicted"], series["wrong"]
    ax.scatter(s[~wrong], p[~wrong], s=18, label="verdict right")
    ax.scatter(s[wrong], p[wrong], s=30, marker="x", color="C3", label="verdict wrong")
    lo, hi = min(s.min(), p.min(), 0.9) * 0.95, max(s.max(), p.max(), 1.1) * 1.05
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="predicted = measured")
    ax.axhline(1, color="gray", lw=0.5)
    ax.axvline(1, color="gray", lw=0.5)
    ax.set_xlabel("measured speedup (baseline / overlap)")
    ax.set_ylabel("predicted speedup")
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        savefig_atomic(fig, path, dpi=110)
    finally:
        plt.close(fig)
