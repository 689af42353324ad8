"""Timing in the style of triton.testing.do_bench: budgeted warm-up and reps, L2 flush and per-rep
CUDA events on GPU, perf_counter on CPU; for collectives a barrier before each rep and the max
across ranks. Outlier (> median + 6·MAD) and non-finite samples are rejected and counted."""

from __future__ import annotations

import dataclasses
import math
import time

import torch


@dataclasses.dataclass(frozen=True)
class Timing:
    median_s: float
    p10_s: float
    p90_s: float
    reps: int
    rejected: int
    samples_s: tuple[float, ...]

    def as_dict(self):
        return {
            "median_s": self.median_s,
            "p10_s": self.p10_s,
            "p90_s": self.p90_s,
            "reps": self.reps,
            "rejected": self.rejected,
        }


def clean_samples(samples):
    """Drop NaN/inf/negative samples and outliers above median + 6·MAD; returns (kept, rejected
    count)."""
    finite = [s for s in samples if math.isfinite(s) and s >= 0]
    if not finite:
        return [], len(samples)
    srt = sorted(finite)
    med = srt[len(srt) // 2]
    mad = sorted(abs(s - med) for s in srt)[len(srt) // 2]
    limit = med + 6 * max(mad, 0.01 * med)
    kept = [s for s in finite if s <= limit]
    return kept, len(samples) - len(kept)


def summary(samples) -> Timing:
    kept, rejected = clean_samples(samples)
    if not kept:
        raise RuntimeError("every timing sample was rejected (NaN or outlier)")
    s = sorted(kept)
    q = lambda f: s[min(len(s) - 1, int(f * (len(s) - 1) + 0.5))]  # noqa: E731
    return Timing(q(0.5), q(0.1), q(0.9), len(kept), rejected, tuple(kept))


class Timer:
    """Times a callable on one device; `group` set ⇒ collective timing (barrier + max over
    ranks)."""

    def __init__(
        self,
        device: str,
        *,
        warmup_s=0.01,
        rep_s=0.05,
        min_reps=5,
        max_reps=100,
        group=None,
        flush_bytes=256 * 1024 * 1024,
    ):
        self.device = device
        self.cuda = device.startswith("cuda")
        self.warmup_s, self.rep_s, self.min_reps, self.max_reps = (
            warmup_s,
            rep_s,
            min_reps,
            max_reps,
        )
        self.group = group
        self.flush_buf = (
            torch.empty(flush_bytes // 4, dtype=torch.int32, device=device) if self.cuda else None
        )

    def _barrier(self):
        if self.group is not None:
            import torch.distributed as dist

            dist.barrier(group=self.group)
            if self.cuda:
                torch.cuda.synchronize()

    def _once(self, fn) -> float:
        if self.cuda:
            self.flush_buf.zero_()  # flush L2 (not timed)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e-3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def __call__(self, fn) -> Timing:
        # estimate one call, then budget warm-up and reps
        self._barrier()
        fn()
        if self.cuda:
            torch.cuda.synchronize()
        est = max(self._once(fn), 1e-7)
        n_warm = max(1, min(100, int(self.warmup_s / est)))
        n_rep = max(self.min_reps, min(self.max_reps, int(self.rep_s / est)))
        if self.group is not None:  # every rank must run the same number of reps
            import torch.distributed as dist

            t = torch.tensor(
                [n_warm, n_rep], dtype=torch.int64, device=self.device if self.cuda else "cpu"
            )
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
            n_warm, n_rep = int(t[0]), int(t[1])
        for _ in range(n_warm):
            fn()
        samples = []
        for _ in range(n_rep):
            self._barrier()
            samples.append(self._once(fn))
        if self.group is not None:
            import torch.distributed as dist

            t = torch.tensor(
                samples, dtype=torch.float64, device=self.device if self.cuda else "cpu"
            )
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
            samples = t.tolist()
        return summary(samples)
