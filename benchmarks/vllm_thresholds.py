"""tpcost's cutoffs vs the thresholds vLLM's maintainers derived from their H100/B200 measurements
(VLLM_SP_THRESH in data/reference/components.csv), the FlashInfer fusion range vs vLLM's table per GPU x TP
x hidden, and the fused AR+RMSNorm model against the published fused-kernel timings (VLLM_PR22086,
VLLM_PR37756, TRTLLM_PR14534). The model's parameters come from datasheets and component measurements;
none is fitted to these thresholds.

    python benchmarks/vllm_thresholds.py [--json benchmarks/results/vllm_thresholds.json]
"""

import argparse
import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main():
    from costmodel import analyse, load_model, load_profile

    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    with open(ROOT / "data/reference/components.csv", newline="") as f:
        ref = [r for r in csv.DictReader(f) if r["source_id"] == "VLLM_SP_THRESH" and
               (r["gpu"].startswith("H100") or (r["gpu"].startswith("B200") and r["baseline_value"] == "32"))]
    print(f"{'gpu':9s} {'model':15s} {'tp':>3s} {'vLLM':>6s} {'tpcost':>7s} {'band 5-95%':>16s} {'ratio':>6s} {'within 2x':>9s} "
          f"{'max tokens':>10s}")
    for r in ref:
        tp, thr = int(r["num_gpus"]), int(r["M_or_tokens"])
        gpu = "h100-sxm" if r["gpu"].startswith("H100") else "b200"
        max_tokens = 8192 if 2 * thr <= 8192 else 32768  # room above vLLM's threshold for the cutoff to land
        an = analyse(load_profile(gpu), load_model("llama-3.1-70b"), tp, "bf16", max_num_batched_tokens=max_tokens)
        cut = an.cutoff_tokens
        ratio = None if cut is None else cut / thr
        ok = ratio is not None and 0.5 <= ratio <= 2.0
        band = an.cutoff_band_tokens
        rows.append({"gpu": gpu, "model": "llama-3.1-70b", "tp": tp, "vllm_threshold": thr, "cutoff_tokens": cut,
                     "band": list(band), "ratio": ratio, "within_2x": ok, "max_num_batched_tokens": max_tokens})
        print(f"{gpu:9s} {'llama-3.1-70b':15s} {tp:3d} {thr:6d} {str(cut):>7s} {str(list(band)):>16s} "
              f"{(f'{ratio:.2f}' if ratio else '-'):>6s} {'yes' if ok else 'NO':>9s} {max_tokens:10d}")
    print("\nllama-3.1-8b (hidden 4096; vLLM: SP off below hidden 8192):")
    for tp in (2, 4, 8):
        an = analyse(load_profile("h100-sxm"), load_model("llama-3.1-8b"), tp, "bf16")
        rows.append({"gpu": "h100-sxm", "model": "llama-3.1-8b", "tp": tp, "vllm_threshold": None,
                     "cutoff_tokens": an.cutoff_tokens, "band": list(an.cutoff_band_tokens)})
        s8k = float(an.table.speedup_sp_asynctp[list(an.table.num_tokens).index(8192.0)])
        print(f"  tp {tp}: cutoff {an.cutoff_tokens}, band {list(an.cutoff_band_tokens)}, speedup at 8192 tokens {s8k:.3f}")
    fusion = main_fusion()
    kernel = main_kernel()
    if a.json:
        from costmodel.io import atomic_write_text, dumps_json

        atomic_write_text(a.json, dumps_json({"schema_version": 2, "sp_cutoffs": rows, **fusion,
                                              "kernel_cutoffs": kernel}, indent=2) + "\n")


# vLLM 0.33's single kernel at Kimi-K3's call-site shapes: N = hidden 7168, K per rank = 12288/tp (o_proj) and
# 6144/tp (the shared experts, GEMM-RS only under model-level SP), on every SM100 profile at TP 2, 4, 8
KERNEL_GPUS = ("b200", "b300", "gb200-nvl72", "gb300-nvl72")
KERNEL_SITES = (("o_proj", 12288), ("shared_experts", 6144))


def kernel_matrix() -> list[dict]:
    """Every (GPU, TP, op, call site): the answer (cutoff with its band, never or always) and the named terms that
    explain it at M = 128 (vLLM's rule) and at the cutoff: waves, multicast bandwidth, the unfused collective."""
    import numpy as np

    from costmodel import load_profile, ops
    from costmodel.op_analysis import analyse_op

    out = []
    for gpu in KERNEL_GPUS:
        prof = load_profile(gpu)
        for tp in (2, 4, 8):
            for op in ("gemm_ar", "gemm_rs"):
                for site, k_total in KERNEL_SITES:
                    n, k = 7168, k_total // tp
                    a = analyse_op(prof, op, "kernel", tp, n, k, vllm_version=(0, 33))
                    at = {}
                    for label, m in (("m128", 128), ("cutoff", a.cutoff_tokens)):
                        if m is None:
                            continue
                        kop = ops.fused_kernel(ops.Hw(prof, "bf16"), op, np.array([float(m)]), n, k, tp)
                        i = int(np.flatnonzero(a.m == m)[0])
                        at[label] = {"m": int(m), "waves": int(kop.waves[0]), "ctas": int(kop.ctas[0]),
                                     "multicast_gb_per_s": round(float(kop.multicast_bw_bytes_per_s[0]) / 1e9, 1),
                                     "bound": str(kop.bound[0]), "unfused_impl": str(a.unfused_impl_per_m[i]),
                                     "speedup": round(float(a.t_unfused_s[i] / a.t_fused_s[i]), 3)}
                    sv = a.decision_value.get("saving_vs_vllm_default_s")
                    out.append({"gpu": gpu, "tp": tp, "op": op, "site": site, "n": n, "k": k,
                                "vllm_rule_tokens": a.vllm_rule_tokens, "answer": a.answer,
                                "cutoff_tokens": a.cutoff_tokens, "cutoff_band_tokens": list(a.cutoff_band or ()),
                                "fused_wins_m_ranges": a.wins_m_ranges(), "saving_vs_vllm_s_per_call": sv,
                                "terms": at})
    return out


def main_kernel():
    """tpcost's answer for vLLM 0.33's single-kernel fused GEMM+RS/AR beside vLLM's hand constant (M >= 128)."""
    print("\nsingle-kernel fused GEMM+collective (vLLM 0.33) at Kimi-K3's call sites, uniform workload over "
          "M = 1..64 and 128..8192, 2 % premium:")
    print(f"  {'gpu':12s} {'tp':>3s} {'op':8s} {'site':15s} {'k':>5s} {'answer':>7s} {'cutoff':>7s} {'band':>12s} "
          f"{'waves@128':>9s} {'mc GB/s@128':>11s} {'unfused@128':>20s} {'saves [us/call]':>15s}")
    out = kernel_matrix()
    for r in out:
        t = r["terms"]["m128"]
        band = "..".join("never" if b is None else str(b) for b in r["cutoff_band_tokens"])
        print(f"  {r['gpu']:12s} {r['tp']:3d} {r['op']:8s} {r['site']:15s} {r['k']:5d} {r['answer']:>7s} "
              f"{str(r['cutoff_tokens']) if r['cutoff_tokens'] is not None else 'never':>7s} {band:>12s} "
              f"{t['waves']:9d} {t['multicast_gb_per_s']:11.0f} {t['unfused_impl']:>20s} "
              f"{(r['saving_vs_vllm_s_per_call'] or 0.0) * 1e6:15.2f}")
    return out


# ------------------------------------------------------------------ issue: the FlashInfer fusion range (vLLM >= 0.32)

FI_GPUS = ("h100-sxm", "h200-sxm", "b200", "b300")
FI_MODELS = ("llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b")  # hidden 4096, 8192, 16384


def fusion_ranges():
    """tpcost's fusion range (tokens, uniform workload, 2 % premium) beside vLLM's table, per GPU x TP x hidden."""
    from costmodel import load_model, load_profile
    from integration.recommend import decide_fusion

    out = []
    for gpu in FI_GPUS:
        prof = load_profile(gpu)
        for model in FI_MODELS:
            shape = load_model(model)
            for tp in (2, 4, 8):
                row = {"gpu": gpu, "hidden": shape.hidden, "tp": tp, "model": model}
                for ver in ((0, 31), (0, 33)):  # each version's own tables (costmodel/vllm_tables.py)
                    f = decide_fusion(prof, shape, tp, "bf16", 8192, 0.02, vllm_version=ver)
                    if f is None:
                        continue
                    tag = f"{ver[0]}.{ver[1]}".replace(".", "")
                    row.update({f"vllm_{tag}_tokens": f.vllm_default_tokens, f"tpcost_{tag}_tokens": f.tokens,
                                f"saving_vs_vllm_{tag}_s_per_forward": f.value["vllm_default_s"] - f.value["expected_s"]})
                if "vllm_031_tokens" in row:
                    out.append(row)
    return out


def fused_kernel_check():
    """The fused AR+RMSNorm model against the published fused-kernel timings: median |relative error| per source."""
    import statistics

    import numpy as np

    from costmodel import formulas as F
    from costmodel import load_profile, ops

    with open(ROOT / "data/reference/components.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    gpu_of = {"H100": "h100-sxm", "B300": "b300", "GB200": "gb200-nvl72"}
    res = {}
    for r in rows:
        if r["source_id"] not in ("VLLM_PR22086", "VLLM_PR37756", "TRTLLM_PR14534"):
            continue
        if not ("fused" in r["workload"].lower() and r["hidden_size"] and r["M_or_tokens"]):
            continue
        prof = load_profile(next(v for k, v in gpu_of.items() if r["gpu"].startswith(k)))
        tp, n, h = int(r["num_gpus"]), float(r["M_or_tokens"]), float(r["hidden_size"])
        hw = ops.Hw(prof, "bf16")
        msg = n * h * 2.0
        scale = 1e-3 if r["unit"] == "ms" else 1e-6
        cases = []
        if r["source_id"] == "TRTLLM_PR14534":
            impl = "flashinfer_ar_rmsnorm_twoshot" if "TWOSHOT" in r["workload"] else "flashinfer_ar_rmsnorm"
            cases.append((impl, float(r["baseline_value"]) * scale, "in-sample" if impl == "flashinfer_ar_rmsnorm"
                          else "out-of-sample"))
        else:
            cases.append(("flashinfer_ar_rmsnorm", float(r["overlap_value"]) * scale, "in-sample"))
            cases.append(("standard", float(r["baseline_value"]) * scale, "out-of-sample"))
        for impl, meas, sample in cases:
            if impl == "standard":  # vLLM's next all-reduce + the RMSNorm kernel
                pred = float(ops.unfused_all_reduce_norm_s(hw, np.array([n]), int(h), tp)[0])
            else:
                if not prof.has_collective(impl):
                    continue
                lat, bw = prof.collective(impl, tp)
                pred = float(F.t_all_reduce_s(msg, lat, bw, tp))
            key = (r["source_id"], impl, sample)
            res.setdefault(key, []).append(abs(pred - meas) / meas)
    return [{"source": k[0], "kernel": k[1], "sample": k[2], "rows": len(v), "median_abs_rel_err": statistics.median(v),
             "max_abs_rel_err": max(v)} for k, v in sorted(res.items())]


def main_fusion(json_path=None):
    fr = fusion_ranges()
    print("\nFlashInfer fused all-reduce+RMSNorm range (tokens; vLLM >= 0.32 fi_allreduce_fusion_max_size_mb), "
          "uniform workload to 8192 tokens, 2 % premium:")
    print(f"  {'gpu':9s} {'hidden':>6s} {'tp':>3s} {'vLLM 0.31':>9s} {'tpcost':>7s} {'vLLM 0.33':>9s} {'tpcost':>7s} "
          f"{'saves vs vLLM 0.33 [ms/fwd]':>28s}")
    for r in fr:
        print(f"  {r['gpu']:9s} {r['hidden']:6d} {r['tp']:3d} {r['vllm_031_tokens']:9d} {r['tpcost_031_tokens']:7d} "
              f"{r.get('vllm_033_tokens', 0):9d} {r.get('tpcost_033_tokens', 0):7d} "
              f"{r.get('saving_vs_vllm_033_s_per_forward', 0.0) * 1e3:28.3f}")
    chk = fused_kernel_check()
    print("\nfused-kernel model against the published fused AR+RMSNorm timings:")
    print(f"  {'source':15s} {'kernel':30s} {'sample':14s} {'rows':>4s} {'median |rel err|':>17s} {'max':>6s}")
    for c in chk:
        print(f"  {c['source']:15s} {c['kernel']:30s} {c['sample']:14s} {c['rows']:4d} {c['median_abs_rel_err']:17.2f} "
              f"{c['max_abs_rel_err']:6.2f}")
    return {"fusion_ranges": fr, "fused_kernel_check": chk}


if __name__ == "__main__":
    main()
