"""Multi-rank benchmarks: collectives, point-to-point pulls, barriers, and the AsyncTP ops — torch's
fused symm_mem ops on CUDA, and on CPU a reference implementation of the same two algorithms in
torch.distributed (same steps and order; pulls as async p2p overlapped with the chunk GEMMs, since
gloo runs transfers on its own threads; final reduction). Same code for both backends otherwise."""

from __future__ import annotations

import torch
import torch.distributed as dist

from costmodel import vllm_tables

from .microbench import make_gemm
from .timing import Timer

# torch 2.13 renamed the flat-tensor collectives (all_gather_into_tensor → all_gather_single,
# reduce_scatter_tensor → reduce_scatter_single; same signatures) and deprecates the old names;
# older torch has only those.
all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def act_dtype(device: str):
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def bench_collectives(timer: Timer, sizes_bytes, device, world):
    """all_gather_into_tensor (output size S), reduce_scatter_tensor (input size S), all_reduce
    (size S); on torch ≥ 2.13 under their new names all_gather_single / reduce_scatter_single."""
    dt = act_dtype(device)
    esz = torch.tensor([], dtype=dt).element_size()
    for S in sizes_bytes:
        numel = max(world, (S // esz) // world * world)
        full = torch.randn(numel, device=device, dtype=dt)
        shard = torch.randn(numel // world, device=device, dtype=dt)
        ops = {
            "all_gather": lambda: all_gather_flat(full, shard),
            "reduce_scatter": lambda: reduce_scatter_flat(shard, full),
            "all_reduce": lambda: dist.all_reduce(full),
        }
        for impl, fn in ops.items():
            yield {
                "kind": "collective",
                "impl": impl,
                "world": world,
                "msg_bytes": numel * esz,
                **timer(fn).as_dict(),
            }


def pull_pairs(rank, world, step, send, recv):
    """The transfers of AsyncTP step s: rank r pulls from (r+s) mod W, i.e. sends to (r−s) mod W."""
    return [
        dist.P2POp(dist.isend, send, (rank - step) % world),
        dist.P2POp(dist.irecv, recv, (rank + step) % world),
    ]


def bench_p2p(timer: Timer, sizes_bytes, device, rank, world):
    """One pull (step 1 of the ring) per size: latency + bandwidth of the transfer AsyncTP uses."""
    dt = act_dtype(device)
    esz = torch.tensor([], dtype=dt).element_size()
    for S in sizes_bytes:
        a = torch.randn(max(1, S // esz), device=device, dtype=dt)
        b = torch.empty_like(a)

        def pull():
            for w in dist.batch_isend_irecv(pull_pairs(rank, world, 1, a, b)):
                w.wait()

        yield {"kind": "p2p", "world": world, "msg_bytes": a.numel() * esz, **timer(pull).as_dict()}


def bench_barrier(timer: Timer, device):
    """dist.barrier (host-coordinated), and on CUDA torch's symmetric-memory barrier, the one
    AsyncTP's fused ops run: issued eagerly and replayed from a CUDA graph (the GPU-side cost alone;
    docs/model.md §6)."""
    yield {"kind": "barrier", **timer(lambda: dist.barrier()).as_dict()}
    if device.startswith("cuda"):
        yield from _symm_mem_barriers(timer)


def _symm_mem_barriers(timer: Timer, per_graph: int = 16):
    """{"kind": "symm_barrier", "mode": "eager" | "graph"} records (the graph's time per barrier);
    nothing, with a record saying why, where torch's symmetric memory is not available here."""
    try:
        import torch.distributed._symmetric_memory as symm_mem

        group = dist.group.WORLD.group_name
        buf = symm_mem.empty(1024, device=f"cuda:{torch.cuda.current_device()}")
        hdl = symm_mem.rendezvous(buf, group)
        yield {
            "kind": "symm_barrier",
            "mode": "eager",
            **timer(lambda: hdl.barrier(channel=0)).as_dict(),
        }
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                hdl.barrier(channel=0)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(per_graph):
                hdl.barrier(channel=0)
        t = timer(graph.replay).as_dict()
        yield {
            "kind": "symm_barrier",
            "mode": "graph",
            "per_graph": per_graph,
            **{k: (v / per_graph if k.endswith("_s") else v) for k, v in t.items()},
        }
    except Exception as e:  # an old torch, or a platform without multicast: say so and keep going
        yield {"kind": "symm_barrier_unavailable", "reason": f"{type(e).__name__}: {e}"[:200]}


def bench_comm_interference(timer: Timer, shapes, m, device, rank, world, dtype):
    """CPU: GEMM alone vs while a large pull is in flight (gloo's transfer threads share the
    cores)."""
    if device.startswith("cuda") or world < 2:
        return
    a = torch.randn(8 << 20, device=device)
    b = torch.empty_like(a)
    for name, n, k in shapes:
        g = make_gemm(m, n, k, dtype, device)
        alone = timer(g)
        samples = []
        import time

        for _ in range(max(5, timer.min_reps)):
            dist.barrier()
            works = dist.batch_isend_irecv(pull_pairs(rank, world, 1, a, b))
            t0 = time.perf_counter()
            g()
            samples.append(time.perf_counter() - t0)
            for w in works:
                w.wait()
        t = torch.tensor(samples, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        from .timing import summary

        both = summary(t.tolist())
        yield {
            "kind": "interference",
            "name": name,
            "m": m,
            "n": n,
            "k": k,
            "dtype": dtype,
            "t_gemm_alone_s": alone.median_s,
            **both.as_dict(),
        }


# ------------------------------------------------------------------ AsyncTP ops (reference + CUDA
# fused)


def ag_gemm_reference(shard, B, rank, world, gathered):
    """torch's _pipelined_all_gather_and_consume on torch.distributed: barrier; local copy; barrier;
    local chunk GEMM; for s=1..W−1 pull shard (rank+s) mod W (async, overlapping the previous
    chunk's GEMM) then its GEMM; second local copy (return_A); barrier. Returns (A_gathered,
    A_gathered @ B)."""
    m = shard.shape[0]
    out = torch.empty(m * world, B.shape[1], dtype=shard.dtype, device=shard.device)
    dist.barrier()
    buf = shard.clone()  # local copy into the "symmetric" buffer
    dist.barrier()
    chunks = gathered.view(world, m, -1)
    pending = (
        dist.batch_isend_irecv(pull_pairs(rank, world, 1, buf, chunks[(rank + 1) % world]))
        if world > 1
        else []
    )
    torch.matmul(shard, B, out=out[rank * m : (rank + 1) * m])
    for s in range(1, world):
        src = (rank + s) % world
        for w in pending:
            w.wait()
        pending = (
            dist.batch_isend_irecv(
                pull_pairs(rank, world, s + 1, buf, chunks[(rank + s + 1) % world])
            )
            if s + 1 < world
            else []
        )
        torch.matmul(chunks[src], B, out=out[src * m : (src + 1) * m])
    chunks[rank].copy_(shard)  # return_A: second local copy
    dist.barrier()
    return gathered, out


def gemm_rs_reference(A, B, rank, world):
    """torch's _pipelined_produce_and_all2all + reduction on torch.distributed: barrier; for
    s=1..W−1 the GEMM of the chunk for rank (rank+s) into one of two buffers, then a pull of rank
    (rank−s)'s chunk into the stacked output (async, overlapping the next GEMM); the local chunk's
    GEMM last; barrier; sum of W partials."""
    m = A.shape[0] // world
    n = B.shape[1]
    stacked = torch.empty(world, m, n, dtype=A.dtype, device=A.device)
    bufs = [torch.empty(m, n, dtype=A.dtype, device=A.device) for _ in range(2)]
    dist.barrier()
    pending = [[], []]
    for s in range(1, world):
        dst = (rank + s) % world
        b = bufs[s % 2]
        for w in pending[s % 2]:  # double buffer: wait until its previous send is done
            w.wait()
        torch.matmul(A[dst * m : (dst + 1) * m], B, out=b)
        # my chunk for `dst` goes to dst; I pull the chunk rank−s made for me: send to (r+s), recv
        # from (r−s)
        ops = [
            dist.P2POp(dist.isend, b, dst),
            dist.P2POp(dist.irecv, stacked[s], (rank - s) % world),
        ]
        pending[s % 2] = dist.batch_isend_irecv(ops)
    torch.matmul(A[rank * m : (rank + 1) * m], B, out=stacked[0])
    for ws in pending:
        for w in ws:
            w.wait()
    dist.barrier()
    return stacked.sum(0)


class AsyncTPOps:
    """ag_gemm(shard, B) and gemm_rs(A, B): torch's fused symm_mem ops on CUDA, the references on
    CPU."""

    def __init__(self, device, rank, world):
        self.device, self.rank, self.world = device, rank, world
        self.cuda = device.startswith("cuda")
        self.kind = "reference"
        if self.cuda:
            import torch.distributed._symmetric_memory as symm_mem  # registers torch.ops.symm_mem

            self.group_name = dist.group.WORLD.group_name
            enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
            # torch 2.13: registers the group's store for symmetric memory (idempotent)
            if enable is not None:
                enable(self.group_name)
            self.kind = "symm_mem"

    def ag_gemm(self, shard, B, gathered):
        """(A gathered, A @ B)."""
        if self.cuda:
            a, outs = torch.ops.symm_mem.fused_all_gather_matmul(
                shard, [B], gather_dim=0, group_name=self.group_name
            )
            return a, outs[0]
        return ag_gemm_reference(shard, B, self.rank, self.world, gathered)

    def gemm_rs(self, A, B):
        if self.cuda:
            return torch.ops.symm_mem.fused_matmul_reduce_scatter(
                A, B, "sum", scatter_dim=0, group_name=self.group_name
            )
        return gemm_rs_reference(A, B, self.rank, self.world)


def bench_fused_ops(timer: Timer, ops: AsyncTPOps, shapes, ms, device, rank, world, dtype_name):
    """Fused (or reference) vs sequential (NCCL/gloo collective + whole GEMM), op-level schema
    rows."""
    dt = act_dtype(device)
    for name, op, n, k in shapes:
        for m in ms:
            if m % world:
                continue
            if op == "ag_gemm":
                shard = torch.randn(m // world, k, device=device, dtype=dt)
                B = torch.randn(k, n, device=device, dtype=dt)
                full = torch.empty(m, k, device=device, dtype=dt)

                def seq():
                    all_gather_flat(full, shard)
                    return full @ B

                fused = lambda: ops.ag_gemm(shard, B, full)  # noqa: E731
            else:
                A = torch.randn(m, k, device=device, dtype=dt)
                B = torch.randn(k, n, device=device, dtype=dt)
                part = torch.empty(m // world, n, device=device, dtype=dt)

                def seq():
                    reduce_scatter_flat(part, A @ B)
                    return part

                fused = lambda: ops.gemm_rs(A, B)  # noqa: E731
            t_seq, t_fused = timer(seq), timer(fused)
            yield {
                "kind": "fused_op",
                "op": op,
                "name": name,
                "impl": ops.kind,
                "world": world,
                "m": m,
                "n": n,
                "k": k,
                "dtype": dtype_name,
                "baseline_s": t_seq.median_s,
                "overlap_s": t_fused.median_s,
                "baseline": t_seq.as_dict(),
                "overlap": t_fused.as_dict(),
            }


# ------------------------------------------------------------------ vLLM's own all-reduce
# implementations (CUDA)


def bench_vllm_all_reduce(timer: Timer, sizes_bytes, device, world, hidden=8192):
    """vLLM's FlashInferAllReduce (0.33 on), CustomAllreduce and SymmMemCommunicator (as
    CudaCommunicator builds them: on a gloo CPU group), each over the sizes its own `should_*`
    accepts, and CustomAllreduce's model-level-SP reduce-scatter and all-gather
    (_vllm_sp_collectives); records name the kernel vLLM runs at that size (FlashInfer's by vLLM's
    one-shot limit, costmodel.vllm_tables). Needs a CUDA build of vLLM; anything that fails is
    recorded as skipped, never fatal."""
    if not device.startswith("cuda"):
        return
    try:
        from vllm.distributed.device_communicators.custom_all_reduce import CustomAllreduce
        from vllm.distributed.device_communicators.symm_mem import SymmMemCommunicator
    except Exception as e:
        yield {
            "kind": "skipped",
            "what": "vllm all-reduce implementations",
            "why": f"{type(e).__name__}: {e}"[:200],
        }
        return
    cpu_group = dist.new_group(backend="gloo")  # collective: every rank creates it
    dev = torch.device(device)
    comms = {}
    makers = [
        ("custom_ar", lambda: CustomAllreduce(group=cpu_group, device=dev)),
        ("symm_mem", lambda: SymmMemCommunicator(group=cpu_group, device=dev)),
    ]
    # vLLM >= 0.33's standalone FlashInfer all-reduce (CudaCommunicator.fi_ar_comm), first in its
    # dispatch
    try:
        from vllm.distributed.device_communicators.flashinfer_all_reduce import FlashInferAllReduce

        makers.insert(0, ("flashinfer", lambda: FlashInferAllReduce(group=cpu_group, device=dev)))
    except Exception as e:
        yield {
            "kind": "skipped",
            "what": "vllm flashinfer all-reduce",
            "why": f"{type(e).__name__}: {e}"[:200],
        }
    for name, make in makers:
        try:
            c = make()
            if not c.disabled:
                comms[name] = c
            else:
                yield {
                    "kind": "skipped",
                    "what": f"vllm {name}",
                    "why": "disabled on this device/world size",
                }
        except Exception as e:
            yield {
                "kind": "skipped",
                "what": f"vllm {name}",
                "why": f"{type(e).__name__}: {e}"[:200],
            }
    for S in sizes_bytes:
        x = torch.randn(max(1, S // (2 * hidden)), hidden, device=dev, dtype=torch.bfloat16)
        nbytes = x.numel() * 2
        for name, c in comms.items():
            if name == "custom_ar":
                yield from _vllm_sp_collectives(timer, c, x, world, dev)
            ok = {
                "custom_ar": lambda: c.should_custom_ar(x),
                "symm_mem": lambda: c.should_use_symm_mem(x),
                "flashinfer": lambda: c.should_use_fi_ar(x),
            }[name]()
            if not _all_agree(ok, dev):
                continue
            # its Lamport one-shot / two-shot kernel without the norm: the fused curve's
            if name == "flashinfer":
                cap = "{}.{}".format(*torch.cuda.get_device_capability(dev))
                one_max = vllm_tables.dispatch_limits(vllm_tables.Vllm(), cap, world).get(
                    "fi_oneshot_max_bytes"
                )
                one = one_max is None or nbytes <= one_max
                impl = "flashinfer_ar_rmsnorm" if one else "flashinfer_ar_rmsnorm_twoshot"
                fn = lambda c=c: c.all_reduce(x)  # noqa: E731
            elif name == "custom_ar":
                one = nbytes < vllm_tables.custom_ar_1stage_max_bytes(world)
                impl = "custom_ar_1stage" if one else "custom_ar_2stage"
                fn = lambda c=c: c.custom_all_reduce(x)  # noqa: E731
            else:
                multimem = world in multimem_world_sizes(c)
                impl = "symm_mem_multimem" if multimem else "symm_mem_two_shot"
                fn = lambda c=c: c.all_reduce(x)  # noqa: E731
            yield {
                "kind": "collective",
                "impl": impl,
                "op": "all_reduce",
                "world": world,
                "msg_bytes": nbytes,
                **timer(fn).as_dict(),
            }


def _all_agree(ok: bool, dev) -> bool:
    """Whether every rank takes the branch (they must all take the same one)."""
    ok_t = torch.tensor([1 if ok else 0], device=dev)
    dist.all_reduce(ok_t, op=dist.ReduceOp.MIN)
    return bool(ok_t.item())


def _vllm_sp_collectives(timer: Timer, comm, x, world, dev):
    """vLLM's model-level-SP reduce-scatter of x and all-gather of its shard (sp_reduce_scatter /
    sp_all_gather) where its CustomAllreduce takes them, each named as the profiles name its backend
    (costmodel.vllm_tables custom_rs_backend / custom_ag_backend); sizes as nccl-tests counts them
    (the unreduced input, the gathered output). Releases without the custom reduce-scatter record
    nothing."""
    multicast = bool(getattr(comm, "mnnvl_multicast_ptr", 0))
    if x.shape[0] % world == 0 and _all_agree(
        bool(getattr(comm, "should_custom_reduce_scatter", lambda _: False)(x)), dev
    ):
        multimem = bool(getattr(comm, "should_mnnvl_multimem_reduce_scatter", lambda _: False)(x))
        impl = (
            "custom_rs_multimem"
            if multimem
            else ("custom_rs_lamport" if multicast else "custom_rs_ipc")
        )
        yield {
            "kind": "collective",
            "impl": impl,
            "op": "reduce_scatter",
            "world": world,
            "msg_bytes": x.numel() * x.element_size(),
            **timer(lambda: comm.custom_reduce_scatter(x)).as_dict(),
        }
    shard = x[: max(1, x.shape[0] // world)].contiguous()
    if _all_agree(bool(getattr(comm, "should_custom_all_gather", lambda _: False)(shard)), dev):
        impl = "custom_ag_lamport" if multicast else "custom_ag_ipc"
        yield {
            "kind": "collective",
            "impl": impl,
            "op": "all_gather",
            "world": world,
            "msg_bytes": shard.numel() * shard.element_size() * world,
            **timer(lambda: comm.custom_all_gather(shard)).as_dict(),
        }


def multimem_world_sizes(comm) -> list[int]:
    """The world sizes at which vLLM's SymmMemCommunicator runs the multimem all-reduce on this GPU:
    the one adapter to vLLM's private `_WORLD_SIZES_MULTIMEM`, with costmodel.vllm_tables' copy of
    it (and its citation) as the fallback when a vLLM release renames or drops it."""
    table = getattr(type(comm), "_WORLD_SIZES_MULTIMEM", None)
    if not isinstance(table, dict):
        table = vllm_tables.Vllm().table("_WORLD_SIZES_MULTIMEM")[0]
    return list(table.get(getattr(comm, "device_capability", None), []))


# ------------------------------------------------------------------ vLLM 0.33's single-kernel
# GEMM+RS / GEMM+AR (SM100)

# vLLM >= 0.33 (present from 0.31)
GEMM_RS_AR = "vllm.model_executor.kernels.linear.cute_dsl.gemm_rs_ar"
# Kimi-K3's hidden size: the N of every call site of the kernel (costmodel.vllm_tables)
KIMI_K3_N = 7168


def kernel_ms(world: int, max_m: int = 32768) -> list[int]:
    """The M the calibration times the kernel at: vLLM's gate (M >= 128) and below it, powers of two
    to max_m, each rounded down to a multiple of the world size (vLLM pads to one)."""
    ms, m = [], 16
    while m <= max_m:
        ms.append(max(world, m // world * world))
        m *= 2
    return sorted(set(ms))


def bench_vllm_gemm_rs_ar(timer: Timer, ms, device, rank, world, n: int = KIMI_K3_N, ks=None):
    """vLLM's gemm_rs_ar (GemmRsAr.apply, both modes) against the path it replaces: the GEMM, then
    the collective vLLM dispatches (GEMM-AR: tensor_model_parallel_all_reduce; GEMM-RS:
    sp_reduce_scatter, model-level SP), per M; records of kind "fused_kernel"
    (calib.kernel_fit.fit_records folds them into [fused_kernel]). K per rank: Kimi-K3's call sites,
    6144/W and 12288/W. Needs vLLM >= 0.33 on an SM100-family GPU with NVLink multicast; anything
    else is one skipped record, never fatal. The kernel reads `linear.weight` (and `scheme` /
    `quant_method` for its dtype):
    the bf16 weight is handed to it as such an object."""
    import types

    if not device.startswith("cuda"):
        return
    if torch.cuda.get_device_capability()[0] != 10:
        yield {
            "kind": "skipped",
            "what": "vllm gemm_rs_ar",
            "why": "vLLM runs it on the SM100 family only",
        }
        return
    try:
        import importlib

        mod = importlib.import_module(GEMM_RS_AR)
        from vllm.distributed import parallel_state as ps
        from vllm.distributed import tensor_model_parallel_all_reduce
        from vllm.models.common.ops.sequence_parallel import sp_reduce_scatter

        if not ps.model_parallel_is_initialized():
            ps.init_distributed_environment(
                world, rank, "env://", rank % torch.cuda.device_count(), "nccl"
            )
            ps.initialize_model_parallel(tensor_model_parallel_size=world)
    except Exception as e:
        yield {
            "kind": "skipped",
            "what": "vllm gemm_rs_ar",
            "why": f"{type(e).__name__}: {e}"[:200],
        }
        return
    dev = torch.device(device)
    ks = ks or sorted({6144 // world, 12288 // world} - {0})
    for op, all_reduce in (("gemm_rs", False), ("gemm_ar", True)):
        try:
            kern = mod.GemmRsAr(max_M=max(ms), N=n, all_reduce=all_reduce)
        except Exception as e:
            yield {
                "kind": "skipped",
                "what": f"vllm gemm_rs_ar {op}",
                "why": f"{type(e).__name__}: {e}"[:200],
            }
            continue
        collective = tensor_model_parallel_all_reduce if all_reduce else sp_reduce_scatter
        for k in ks:
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5
            linear = types.SimpleNamespace(weight=w, quant_method=None)
            for m in ms:
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                t_fused = timer(lambda x=x, kern=kern, linear=linear: kern.apply(x, linear))
                t_seq = timer(
                    lambda x=x, w=w, coll=collective: coll(torch.nn.functional.linear(x, w))
                )
                yield {
                    "kind": "fused_kernel",
                    "op": op,
                    "world": world,
                    "m": m,
                    "n": n,
                    "k": k,
                    "unfused_impl": "vllm",
                    "fused_s": t_fused.median_s,
                    "baseline_s": t_seq.median_s,
                    "fused": t_fused.as_dict(),
                    "baseline": t_seq.as_dict(),
                }
        del kern  # its symmetric workspace (max M × N bf16) before the other mode's
