"""Single-device microbenchmarks shared by `tpcost calibrate` (every rank) and calib/gpu_check.py.

Each function yields sample records (dicts, written as JSONL): kind, shape, dtype, timing. The same
code runs on CUDA and on CPU; only the dtype set and the stream handling differ by backend."""

from __future__ import annotations

import contextlib

import torch

from .timing import Timer


def gemm_dtypes(device: str) -> list[str]:
    """bf16 (+ fp8 where torch._scaled_mm runs: sm89+) on CUDA; fp32 on CPU (bf16 matmul is ~0.3
    GFLOP/s there)."""
    if not device.startswith("cuda"):
        return ["fp32"]
    major, minor = torch.cuda.get_device_capability()
    return ["bf16", "fp8"] if (major, minor) >= (8, 9) else ["bf16"]


def make_gemm(m, n, k, dtype, device):
    """A closure running C = A @ B for A[m,k], B[k,n] in `dtype` (fp8: per-tensor scaled, bf16
    out)."""
    if dtype == "fp8":
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()  # column-major B
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    a = torch.randn(m, k, device=device, dtype=dt)
    b = torch.randn(k, n, device=device, dtype=dt)
    return lambda: a @ b


def _streams(device):
    if device.startswith("cuda"):
        return torch.cuda.current_stream(), torch.cuda.Stream()
    return None, None


def _on(stream):
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def bench_gemms(timer: Timer, shapes, ms, device, dtypes=None, kind="gemm"):
    """GEMM sweep over M for each per-rank (n, k) shape; `kind` names the records ("gemm_holdout":
    timed, not fitted)."""
    for dtype in dtypes or gemm_dtypes(device):
        for name, n, k in shapes:
            for m in ms:
                try:
                    fn = make_gemm(m, n, k, dtype, device)
                    t = timer(fn).as_dict()
                except (
                    RuntimeError,
                    ValueError,
                ) as e:  # e.g. a shape an fp8 kernel rejects: recorded, not fatal
                    yield {
                        "kind": "gemm_error",
                        "name": name,
                        "m": m,
                        "n": n,
                        "k": k,
                        "dtype": dtype,
                        "error": str(e).splitlines()[0][:200],
                    }
                    continue
                yield {"kind": kind, "name": name, "m": m, "n": n, "k": k, "dtype": dtype, **t}


def bench_sm_budget(timer: Timer, shapes, ms, carveouts, device):
    """The bf16 GEMM with `s` SMs withheld from it (torch._C._set_sm_carveout_experimental: cuBLAS's
    SM count target, what torch's fused float8 ops set beside a communication kernel), on cuBLAS and
    on cuBLASLt: the SM budget a communicating kernel leaves its GEMM. CUDA only; the carveout is
    reset after each shape."""
    setter = getattr(torch._C, "_set_sm_carveout_experimental", None)
    if not device.startswith("cuda") or setter is None:
        return
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    default = torch.backends.cuda.preferred_blas_library()
    try:
        for lib in ("cublas", "cublaslt"):
            try:
                torch.backends.cuda.preferred_blas_library(lib)
            except RuntimeError as e:  # a build without cuBLASLt: recorded, not fatal
                yield {
                    "kind": "gemm_sm_budget_error",
                    "blas": lib,
                    "error": str(e).splitlines()[0][:200],
                }
                continue
            for name, n, k in shapes:
                for m in ms:
                    g = make_gemm(m, n, k, "bf16", device)
                    for s in carveouts:
                        setter(s or None)
                        try:
                            t = timer(g).as_dict()
                        finally:
                            setter(None)
                        yield {
                            "kind": "gemm_sm_budget",
                            "blas": lib,
                            "name": name,
                            "m": m,
                            "n": n,
                            "k": k,
                            "dtype": "bf16",
                            "sm_carveout": s,
                            "sm_count": sms,
                            **t,
                        }
    finally:
        torch.backends.cuda.preferred_blas_library(default)


def bench_chunked(timer: Timer, shapes, ms, worlds, device, dtype):
    """The GEMM split in W row chunks: on one stream, and alternating over two streams (as torch's
    fused ops do), against the whole GEMM. On CPU the two-stream variant is the one-stream one."""
    s0, s1 = _streams(device)
    for name, n, k in shapes:
        for m in ms:
            for w in worlds:
                if m % w:
                    continue
                chunks = [make_gemm(m // w, n, k, dtype, device) for _ in range(w)]

                def one_stream():
                    for c in chunks:
                        c()

                def two_streams():
                    if s1 is None:
                        return one_stream()
                    s1.wait_stream(s0)
                    for i, c in enumerate(chunks):
                        with _on(s1 if i % 2 else s0):
                            c()
                    s0.wait_stream(s1)

                for variant, fn in (("one_stream", one_stream), ("two_streams", two_streams)):
                    yield {
                        "kind": "chunked_gemm",
                        "variant": variant,
                        "name": name,
                        "m": m,
                        "n": n,
                        "k": k,
                        "world": w,
                        "dtype": dtype,
                        **timer(fn).as_dict(),
                    }


def bench_memory(timer: Timer, sizes_bytes, device, hidden=8192, worlds=(2, 4, 8)):
    """Memory-bound kernels: copy, RMSNorm, and the W-way partial sum of GEMM+RS."""
    dt = torch.bfloat16 if device.startswith("cuda") else torch.float32
    esz = torch.tensor([], dtype=dt).element_size()
    for nbytes in sizes_bytes:
        numel = max(hidden, nbytes // esz // hidden * hidden)
        rows = numel // hidden
        src = torch.randn(numel, device=device, dtype=dt)
        dst = torch.empty_like(src)
        yield {
            "kind": "copy",
            "bytes_moved": 2 * numel * esz,
            "rows": rows,
            "hidden": hidden,
            **timer(lambda: dst.copy_(src)).as_dict(),
        }
        x = src.view(rows, hidden)
        w = torch.ones(hidden, device=device, dtype=dt)
        yield {
            "kind": "rms_norm",
            "bytes_moved": 2 * numel * esz,
            "rows": rows,
            "hidden": hidden,
            **timer(lambda: torch.nn.functional.rms_norm(x, (hidden,), w, 1e-6)).as_dict(),
        }
        for W in worlds:
            if rows % W == 0 and rows >= W:
                part = src.view(W, rows // W, hidden)
                yield {
                    "kind": "partial_sum",
                    "world": W,
                    "bytes_moved": numel * esz * (1 + 1 / W),
                    "rows": rows,
                    "hidden": hidden,
                    **timer(lambda: part.sum(0)).as_dict(),
                }


def bench_interference(timer: Timer, shapes, m, device, dtype, reps=30):
    """GEMM alone vs the same GEMM timed (CUDA events on its own stream) while a device-to-device
    copy, sized to outlast it, runs on another stream: the HBM contention a pull causes (not
    NVLink). The GEMM's stream has the highest priority: an SM copy kernel launched first would
    otherwise hold every SM until its CTAs are all dispatched and the GEMM would run after it
    (serialised; seen on an H200, calib/data/h200-sxm-gpu-check), where a copy-engine pull takes no
    SM at all."""
    s0, s1 = _streams(device)
    if s1 is None:
        return
    from .timing import summary

    # (least, greatest): greatest first
    hi = torch.cuda.Stream(priority=torch.cuda.Stream.priority_range()[1])
    for name, n, k in shapes:
        g = make_gemm(m, n, k, dtype, device)
        alone = timer(g)
        copy_bytes = int(min(8 << 30, max(64 << 20, 3 * alone.median_s * 4e12)))
        src = torch.empty(copy_bytes // 2, device=device, dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        t_copy = timer(lambda: dst.copy_(src))
        samples = []
        for _ in range(reps):
            torch.cuda.synchronize()
            timer.flush_buf.zero_()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s1.wait_stream(s0)
            hi.wait_stream(s0)
            with torch.cuda.stream(s1):
                dst.copy_(src)
            with torch.cuda.stream(hi):
                e0.record(hi)
                g()
                e1.record(hi)
            torch.cuda.synchronize()
            samples.append(e0.elapsed_time(e1) * 1e-3)
        both = summary(samples)
        src = dst = None  # free the copy buffers before the next shape allocates its own
        yield {
            "kind": "interference",
            "name": name,
            "m": m,
            "n": n,
            "k": k,
            "dtype": dtype,
            "t_gemm_alone_s": alone.median_s,
            "t_copy_alone_s": t_copy.median_s,
            "copy_bytes": copy_bytes,
            "gemm_stream_priority": "highest",
            **both.as_dict(),
        }


def bench_host_issue(device, calls=200, repeats=15):
    """The host's issue time per torch call (asynctp.host_op_s: what torch's Python AsyncTP loop
    pays per call when vLLM runs eagerly) and, on CUDA, the host time of one CUDA-graph replay of
    the same calls (what graph mode pays instead). Host wall time around `calls` tiny kernel
    launches with no synchronisation inside, median over `repeats`; on CUDA the GPU is given a long
    kernel first so the launch queue never waits on it."""
    import time

    x = torch.zeros(16, device=device)
    eager, replay = [], []
    graph = None
    if device.startswith("cuda"):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                for _ in range(calls):
                    x.add_(1.0)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                x.add_(1.0)
    busy = torch.randn(4096, 4096, device=device) if device.startswith("cuda") else None
    for _ in range(repeats):
        if busy is not None:
            busy @ busy  # keeps the GPU busy while the host issues
        t0 = time.perf_counter()
        for _ in range(calls):
            x.add_(1.0)
        eager.append((time.perf_counter() - t0) / calls)
        if graph is not None:
            t0 = time.perf_counter()
            graph.replay()
            replay.append(time.perf_counter() - t0)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    eager.sort()
    rec = {
        "kind": "host_issue",
        "calls": calls,
        "median_s": eager[len(eager) // 2],
        "p10_s": eager[len(eager) // 10],
        "p90_s": eager[(9 * len(eager)) // 10],
        "reps": repeats,
    }
    if replay:
        replay.sort()
        rec["graph_replay_median_s"] = replay[len(replay) // 2]
    yield rec
