"""`tpcost evaluate`: score predictions against measured overlap data (verdict accuracy, regret, error),
side by side with vLLM 0.31's own sp_min_token_num rule on the same rows."""

from __future__ import annotations

import csv
import dataclasses
import json
import math

import numpy as np

from .errors import TpcostError
from .io import savefig_atomic

OP_COLUMNS = ("hardware", "tp", "op", "dtype", "m", "n", "k", "baseline_us", "overlap_us", "source")
MODEL_COLUMNS = ("hardware", "tp", "model", "dtype", "num_tokens", "baseline_us", "overlap_us", "scope", "source")


@dataclasses.dataclass(frozen=True)
class Scored:
    file: str
    line: int
    label: str
    s_measured: float
    s_predicted: float
    verdict_measured: bool
    verdict_predicted: bool
    regret_pct: float
    vllm_verdict: bool
    vllm_regret_pct: float

    @property
    def abs_error(self) -> float:
        return abs(self.s_predicted - self.s_measured)


def _regret(choose_overlap: bool, base: float, over: float) -> float:
    """100·(time of the chosen schedule − time of the better one)/time of the better one (%)."""
    best = min(base, over)
    return 100.0 * ((over if choose_overlap else base) - best) / best


def read_rows(path: str):
    """(schema, rows with line numbers). Whole-file problems raise TpcostError (exit 2)."""
    try:
        with open(path, newline="") as f:
            text = f.read()
    except OSError as e:
        raise TpcostError(f"cannot read {path}: {e.strerror}") from None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise TpcostError(f"{path}: empty file (expected a header row)")
    reader = csv.DictReader(lines)
    header = [h.strip() for h in (reader.fieldnames or [])]
    schema = "model" if "model" in header else "op" if "op" in header else None
    if schema is None:
        raise TpcostError(f"{path}: header has neither an 'op' nor a 'model' column: cannot tell the schema")
    cols = OP_COLUMNS if schema == "op" else MODEL_COLUMNS
    for h in header:
        if h not in cols:
            raise TpcostError(f"{path}: unknown column {h!r} for the {schema}-level schema ({','.join(cols)})")
    for c in cols:
        if c not in header:
            raise TpcostError(f"{path}: missing column {c!r} for the {schema}-level schema")
    rows = []
    for i, r in enumerate(reader, start=2):
        r = {k.strip(): (v or "").strip() for k, v in r.items() if k is not None}
        for c in ("baseline_us", "overlap_us"):
            if r[c] == "":
                continue
            try:
                v = float(r[c])
            except ValueError:
                raise TpcostError(f"{path}:{i}: {c} {r[c]!r} is not a number") from None
            if not math.isfinite(v) or v <= 0:
                raise TpcostError(f"{path}:{i}: {c} must be a time > 0 us, got {r[c]}")
        for c in ("tp", "m", "n", "k", "num_tokens"):
            if c in r and r[c] != "":
                try:
                    float(r[c])
                except ValueError:
                    raise TpcostError(f"{path}:{i}: {c} {r[c]!r} is not a number") from None
        rows.append((i, r))
    if not rows:
        raise TpcostError(f"{path}: no data rows")
    return schema, rows


class _Skip(Exception):
    pass


def _int(r, c):
    if r.get(c, "") == "":
        raise _Skip(f"missing {c}")
    v = float(r[c])
    if v != int(v) or v <= 0:
        raise _Skip(f"{c} must be a positive integer, got {r[c]}")
    return int(v)


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


def _predict_op(prof, r):
    """(predicted speedup, hidden size vLLM's rule sees, tokens) for an op-level row."""
    from .model import _ag, _fused_ag_gemm, _fused_gemm_rs, _Hw, _rs

    tp, m, n, k = _int(r, "tp"), _int(r, "m"), _int(r, "n"), _int(r, "k")
    dtype, op = r["dtype"], r["op"]
    from .shapes import DTYPES

    if dtype not in DTYPES:
        raise _Skip(f"unknown dtype {dtype!r}")
    if tp < 2:
        raise _Skip("tp must be >= 2 for a collective")
    if m % tp:
        raise _Skip(f"m={m} not divisible by tp={tp}")
    hw = _Hw(prof, dtype)
    if op == "ag_gemm":
        if dtype == "fp8-dynamic":
            raise _Skip("ag_gemm does not fuse with per-token (dynamic) fp8 in vLLM 0.31")
        a_bytes = 1.0 if dtype == "fp8" else hw.act_bytes
        base = _ag(hw, tp, m * k * a_bytes) + hw.t_gemm(m, n, k)
        over, _ = _fused_ag_gemm(hw, float(m), n, k, tp, a_bytes)
        hidden = k
    elif op == "gemm_rs":
        base = hw.t_gemm(m, n, k) + _rs(hw, tp, m * n * hw.act_bytes)
        over, _ = _fused_gemm_rs(hw, float(m), n, k, tp)
        hidden = n
    else:
        raise _Skip(f"unknown op {op!r} (ag_gemm | gemm_rs)")
    return float(base / over), hidden, m


def _predict_model(prof, r, models):
    from .model import predict
    from .shapes import load_model

    tp, n_tok = _int(r, "tp"), _int(r, "num_tokens")
    if r["scope"] not in ("layer", "forward"):
        raise _Skip(f"scope must be layer or forward, got {r['scope']!r}")
    if r["model"] not in models:
        try:
            models[r["model"]] = load_model(r["model"])
        except TpcostError as e:
            models[r["model"]] = e
    shape = models[r["model"]]
    if isinstance(shape, TpcostError):
        raise _Skip(str(shape))
    try:
        pred = predict(prof, shape, tp, r["dtype"], np.array([float(n_tok)]))
    except TpcostError as e:
        raise _Skip(str(e)) from None
    attr = "t_layer_s" if r["scope"] == "layer" else "t_forward_s"
    s = getattr(pred.schedules["tp"], attr) / getattr(pred.schedules["sp_asynctp"], attr)
    return float(np.asarray(s).ravel()[0]), shape.hidden, n_tok


def evaluate_files(paths):
    from .vllm_rules import vllm_sp_min_token_num

    scored, skipped = [], []
    profiles, models = {}, {}
    for path in paths:
        schema, rows = read_rows(path)
        for line, r in rows:
            where = f"{path}:{line}"
            try:
                if r["baseline_us"] == "" or r["overlap_us"] == "":
                    raise _Skip("missing baseline_us or overlap_us")
                if r["hardware"] == "":
                    raise _Skip("missing hardware")
                prof = _profile(profiles, r["hardware"])
                if schema == "op":
                    s_hat, hidden, tokens = _predict_op(prof, r)
                    label = f"{r['hardware']} tp{r['tp']} {r['op']} {r['dtype']} m={r['m']} n={r['n']} k={r['k']}"
                else:
                    s_hat, hidden, tokens = _predict_model(prof, r, models)
                    label = f"{r['hardware']} tp{r['tp']} {r['model']} {r['dtype']} N={r['num_tokens']} {r['scope']}"
            except _Skip as e:
                skipped.append({"where": where, "reason": str(e)})
                continue
            base, over = float(r["baseline_us"]), float(r["overlap_us"])
            thr = vllm_sp_min_token_num(prof.attrs.get("identity.vendor", ""),
                                        prof.attrs.get("identity.compute_capability", ""), hidden, int(r["tp"]), 2)
            v_vllm = thr is not None and tokens >= thr
            v_pred = s_hat > 1.0
            scored.append(Scored(path, line, label, base / over, s_hat, over < base, v_pred,
                                 _regret(v_pred, base, over), v_vllm, _regret(v_vllm, base, over)))
    return scored, skipped


def summarise(scored, skipped) -> dict:
    if scored:
        err = np.array([s.abs_error for s in scored])
        reg = np.array([s.regret_pct for s in scored])
        vreg = np.array([s.vllm_regret_pct for s in scored])
        acc = float(np.mean([s.verdict_predicted == s.verdict_measured for s in scored]))
        vacc = float(np.mean([s.vllm_verdict == s.verdict_measured for s in scored]))
        out = {"verdict_accuracy": acc, "median_abs_speedup_error": float(np.median(err)),
               "p90_abs_speedup_error": float(np.percentile(err, 90)), "mean_regret_pct": float(reg.mean()),
               "max_regret_pct": float(reg.max()),
               "vllm_rule": {"verdict_accuracy": vacc, "mean_regret_pct": float(vreg.mean()),
                             "max_regret_pct": float(vreg.max())}}
    else:
        out = {k: None for k in ("verdict_accuracy", "median_abs_speedup_error", "p90_abs_speedup_error",
                                 "mean_regret_pct", "max_regret_pct")}
        out["vllm_rule"] = {"verdict_accuracy": None, "mean_regret_pct": None, "max_regret_pct": None}
    out.update(rows_scored=len(scored), rows_skipped=len(skipped), skipped=skipped)
    return out


def plot_evaluation(scored, path):
    from .plot import _plt

    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    s = np.array([x.s_measured for x in scored])
    p = np.array([x.s_predicted for x in scored])
    wrong = np.array([x.verdict_measured != x.verdict_predicted for x in scored], dtype=bool)
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


def cmd_evaluate(args) -> int:
    scored, skipped = evaluate_files(args.files)
    summ = summarise(scored, skipped)
    if args.plot and scored:
        plot_evaluation(scored, args.plot)
    if args.json:
        summ["rows"] = [{**dataclasses.asdict(s), "abs_error": s.abs_error} for s in scored]
        print(json.dumps(summ, indent=2))
        return 0
    print(f"{'row':60s} {'s meas':>7s} {'s pred':>7s} {'meas':>5s} {'pred':>5s} {'|err|':>6s} {'regret%':>8s} {'vLLM':>5s}")
    yn = lambda b: "on" if b else "off"  # noqa: E731
    for s in scored:
        print(f"{s.label[:60]:60s} {s.s_measured:7.3f} {s.s_predicted:7.3f} {yn(s.verdict_measured):>5s} "
              f"{yn(s.verdict_predicted):>5s} {s.abs_error:6.3f} {s.regret_pct:8.2f} {yn(s.vllm_verdict):>5s}")
    f = lambda v, fmt: "n/a" if v is None else format(v, fmt)  # noqa: E731
    print(f"\nrows scored {summ['rows_scored']}, skipped {summ['rows_skipped']}")
    for sk in skipped:
        print(f"  skipped {sk['where']}: {sk['reason']}")
    v = summ["vllm_rule"]
    print(f"{'':24s} {'tpcost':>10s} {'vLLM 0.31 rule':>15s}")
    print(f"{'verdict accuracy':24s} {f(summ['verdict_accuracy'], '10.1%')} {f(v['verdict_accuracy'], '15.1%')}")
    print(f"{'mean regret [%]':24s} {f(summ['mean_regret_pct'], '10.2f')} {f(v['mean_regret_pct'], '15.2f')}")
    print(f"{'max regret [%]':24s} {f(summ['max_regret_pct'], '10.2f')} {f(v['max_regret_pct'], '15.2f')}")
    print(f"{'median |speedup error|':24s} {f(summ['median_abs_speedup_error'], '10.3f')} {'(no speedup)':>15s}")
    print(f"{'p90 |speedup error|':24s} {f(summ['p90_abs_speedup_error'], '10.3f')}")
    return 0


def register(sub):
    p = sub.add_parser("evaluate", help="score the model against measured overlap CSVs (op- or model-level)")
    p.add_argument("files", nargs="+", metavar="FILE.csv")
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", metavar="FILE.png")
    p.set_defaults(func=cmd_evaluate)
