"""tpcost's cutoffs vs the thresholds vLLM's maintainers derived from their H100/B200 measurements
(VLLM_SP_THRESH in data/reference/components.csv). The model's parameters come from datasheets and
component measurements; none is fitted to these thresholds.

    python benchmarks/vllm_thresholds.py [--json benchmarks/results/vllm_thresholds.json]
"""

import argparse
import csv
import json
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
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
