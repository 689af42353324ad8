"""One small pure function per formula. SI units; numpy-vectorised over token counts (and over
Monte Carlo draws: any argument may be an array, shapes broadcast). Derivations: docs/model.md."""

from __future__ import annotations

import numpy as np

Arr = float | np.ndarray  # a number, or a numpy array of them: every formula broadcasts over arrays
KiB, MiB, GiB = (
    1024,
    1024**2,
    1024**3,
)  # binary byte units (the one home; vLLM's tables and messages are in them)
# NCCL ring all-reduce busBW / per-direction link on H100 (NCCL_ISSUE1455): a ring's link share
RING_LINK_RATIO = 0.816
# NCCL's LL protocol: each 8-byte store carries 4 bytes of data and a 4-byte flag
LL_PAYLOAD_FRACTION = 0.5

# --------------------------------------------------------------------------- GEMM (docs §2)

SPLIT_K_MIN_DEPTH = 512.0  # smallest K slice a stream-K kernel gives one SM (elements)


def gemm_flops(m: Arr, n: Arr, k: Arr) -> Arr:
    """FLOP of C[m,n] = A[m,k] @ B[k,n]: 2·m·n·k (FLOP)."""
    return m * (2.0 * n * k)


def gemm_bytes(m: Arr, n: Arr, k: Arr, in_bytes: Arr, w_bytes: Arr, out_bytes: Arr) -> Arr:
    """HBM traffic of one GEMM: m·k·b_in + k·n·b_w + m·n·b_out (bytes; each operand touched
    once)."""
    return m * (k * in_bytes + n * out_bytes) + k * n * w_bytes


# rows: whole rows. The finest a kernel pads is 8 (skinny GEMMs run swap-AB: rows as the MMA's N,
# which steps by 8), and the library's choice among its tile shapes averages that padding out:
# measured curves show no steps
GEMM_ROW_STEP = 1.0
GEMM_COL_STEP = 64.0  # columns: the MMA's smallest M extent (64-row wgmma / tcgen05 tiles)


def padded(x: Arr, step: Arr) -> Arr:
    """x rounded up to a multiple of step: ⌈x/step⌉·step (same unit as x)."""
    return np.ceil(x / step) * step


def t_gemm_compute_s(
    m: Arr,
    n: Arr,
    k: Arr,
    peak_flops_per_s: Arr,
    max_efficiency: Arr,
    tile_m: Arr,
    tile_n: Arr,
    sm_count: Arr,
) -> Arr:
    """Compute-bound GEMM under a stream-K library kernel: the MMA work 2·⌈m⌉·⌈n⌉₆₄·k spread evenly
    over the SMs, each SM doing at least one 512-deep K slice of one tile (min(⌈m⌉, tile_m) ×
    min(⌈n⌉₆₄, tile_n)) (s)."""
    mr, n64 = padded(m, GEMM_ROW_STEP), padded(n, GEMM_COL_STEP)
    share = np.maximum(
        mr * (2.0 * n64 * k) / sm_count,
        2.0 * np.minimum(mr, tile_m) * np.minimum(n64, tile_n) * np.minimum(k, SPLIT_K_MIN_DEPTH),
    )
    return share / (peak_flops_per_s * max_efficiency / sm_count)


def t_gemm_s(
    m: Arr,
    n: Arr,
    k: Arr,
    *,
    peak_flops_per_s: Arr,
    max_efficiency: Arr,
    mem_efficiency: Arr,
    hbm_bw_bytes_per_s: Arr,
    tile_m: Arr,
    tile_n: Arr,
    sm_count: Arr,
    launch_overhead_s: Arr,
    in_bytes: Arr,
    w_bytes: Arr,
    out_bytes: Arr,
) -> Arr:
    """Roofline GEMM time: launch + max(quantised compute time, bytes/(HBM·eff)) (s); 0 when m =
    0."""
    t_comp = t_gemm_compute_s(m, n, k, peak_flops_per_s, max_efficiency, tile_m, tile_n, sm_count)
    t_mem = gemm_bytes(m, n, k, in_bytes, w_bytes, out_bytes) / (
        hbm_bw_bytes_per_s * mem_efficiency
    )
    return np.where(m > 0, launch_overhead_s + np.maximum(t_comp, t_mem), 0.0)


# --------------------------------------------------------------------------- memory-bound kernels
# (§3)


def t_memory_bound_s(
    bytes_moved: Arr, hbm_bw_bytes_per_s: Arr, mem_efficiency: Arr, launch_overhead_s: Arr
) -> Arr:
    """Memory-bound kernel: launch + bytes/(HBM bandwidth·efficiency) (s)."""
    return launch_overhead_s + bytes_moved / (hbm_bw_bytes_per_s * mem_efficiency)


def rms_norm_bytes(
    rows: Arr, hidden: Arr, act_bytes: Arr, out_bytes: Arr, fused_add: bool = True
) -> Arr:
    """(fused-add) RMSNorm traffic: read x (+ residual), write out (+ residual):
    rows·H·(b·(1+r)+b_out+b·r)."""
    r = 1.0 if fused_add else 0.0
    return rows * (hidden * (act_bytes * (1.0 + 2.0 * r) + out_bytes))


def silu_mul_bytes(rows: Arr, intermediate_per_rank: Arr, act_bytes: Arr, out_bytes: Arr) -> Arr:
    """SiluAndMul traffic: read rows·2I/tp·b, write rows·I/tp·b_out (bytes)."""
    return rows * (intermediate_per_rank * (2.0 * act_bytes + out_bytes))


def reduction_bytes(rows: Arr, n: Arr, out_bytes: Arr, world: Arr) -> Arr:
    """Sum of W partials [W, rows/W, n] → [rows/W, n]: reads rows·n·b, writes rows·n·b/W (bytes)."""
    return rows * (n * out_bytes * (1.0 + 1.0 / world))


# --------------------------------------------------------------------------- collectives (§4)


def t_all_reduce_s(msg_bytes: Arr, latency_s: Arr, bus_bw_bytes_per_s: Arr, world: Arr) -> Arr:
    """All-reduce: α + 2(W−1)/W · S/busBW (s; nccl-tests PERFORMANCE.md bus-bandwidth
    convention)."""
    return (latency_s + msg_bytes * (2.0 * (world - 1) / world / bus_bw_bytes_per_s)) * (
        np.asarray(world) > 1
    )


def t_all_reduce_regimes_s(
    msg_bytes: Arr, latencies_s: list, bus_bws_bytes_per_s: list, world: Arr
) -> Arr:
    """NCCL's tuner: min over its regimes p of α_p + 2(W−1)/W · S/busBW_p (s; docs/model.md §4,
    calib/nccl_fit.py)."""
    times = [
        t_all_reduce_s(msg_bytes, a, b, world) for a, b in zip(latencies_s, bus_bws_bytes_per_s)
    ]
    return np.minimum.reduce(np.broadcast_arrays(*times))


def t_all_gather_s(msg_bytes: Arr, latency_s: Arr, bus_bw_bytes_per_s: Arr, world: Arr) -> Arr:
    """All-gather of an S-byte (gathered output) message: α + (W−1)/W · S/busBW (s; nccl-tests
    convention)."""
    return (latency_s + msg_bytes * ((world - 1) / world / bus_bw_bytes_per_s)) * (
        np.asarray(world) > 1
    )


def t_reduce_scatter_s(msg_bytes: Arr, latency_s: Arr, bus_bw_bytes_per_s: Arr, world: Arr) -> Arr:
    """Reduce-scatter of an S-byte (unreduced input) message: α + (W−1)/W · S/busBW (s; nccl-tests
    convention)."""
    return t_all_gather_s(msg_bytes, latency_s, bus_bw_bytes_per_s, world)


def t_ring_regimes_s(
    msg_bytes: Arr, latencies_s: list, bus_bws_bytes_per_s: list, world: Arr
) -> Arr:
    """NCCL's tuner over a ring all-gather or reduce-scatter: min over its regimes p of α_p +
    (W−1)/W · S/busBW_p (s; docs/model.md §4, calib.fit.fit_ring_regimes)."""
    times = [
        t_all_gather_s(msg_bytes, a, b, world) for a, b in zip(latencies_s, bus_bws_bytes_per_s)
    ]
    return np.minimum.reduce(np.broadcast_arrays(*times))


def expected_experts_touched(tokens: Arr, top_k: Arr, num_experts: Arr) -> Arr:
    """Distinct experts that N·k uniformly routed picks touch: E·(1 − (1 − k/E)^N) (count; docs
    §8)."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def weight_bytes_per_gpu(params_per_gpu: Arr, bytes_per_param: Arr) -> Arr:
    """Weight memory of one rank: parameters on it · bytes per parameter (bytes)."""
    return params_per_gpu * bytes_per_param


# --------------------------------------------------------------------------- attention (§5)


def attention_flops(tokens: Arr, seq_len: Arr, heads_per_rank: Arr, head_dim: Arr) -> Arr:
    """Causal prefill attention FLOP: 4·d·h·Σ L²/2 = 2·d·h·N·min(N, L) for N tokens in sequences of
    L."""
    return tokens * np.minimum(tokens, seq_len) * (2.0 * head_dim * heads_per_rank)


def attention_bytes(
    tokens: Arr, heads_per_rank: Arr, kv_heads_per_rank: Arr, head_dim: Arr, act_bytes: Arr
) -> Arr:
    """FlashAttention traffic: read Q,K,V and write O once: N·(2h + 2kv)·d·b (bytes)."""
    return tokens * ((2.0 * heads_per_rank + 2.0 * kv_heads_per_rank) * head_dim * act_bytes)


def decode_attention_flops(seqs: Arr, context_len: Arr, heads_per_rank: Arr, head_dim: Arr) -> Arr:
    """Decode attention FLOP: one query per sequence against its context: 4·d·h·B·C (QKᵀ and PV)."""
    return seqs * context_len * (4.0 * head_dim * heads_per_rank)


def kv_cache_read_bytes(
    seqs: Arr, context_len: Arr, kv_heads_per_rank: Arr, head_dim: Arr, kv_bytes: Arr
) -> Arr:
    """KV cache a decode step reads per rank and layer: B·C·2·max(1, kv/tp)·d·b (bytes; K and V of
    the context)."""
    return seqs * context_len * (2.0 * kv_heads_per_rank * head_dim * kv_bytes)


# --------------------------------------------------------------------------- AsyncTP (§6)


COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


def bus_bw_factor(collective: str, world: Arr) -> Arr:
    """nccl-tests bus-bandwidth factor: all_reduce 2(W−1)/W; all_gather, reduce_scatter (W−1)/W
    (dimensionless)."""
    if collective not in COLLECTIVES:
        raise ValueError(
            f"bus_bw_factor: unknown collective {collective!r} (one of {', '.join(COLLECTIVES)})"
        )
    f = (np.asarray(world, dtype=float) - 1.0) / world
    return 2.0 * f if collective == "all_reduce" else f


def t_link_s(total_bytes: Arr, world: Arr, link_bw_bytes_per_s: Arr) -> Arr:
    """Least time the link needs for a rank's share of a gather/scatter: (W−1)/W·S / link peak
    (s)."""
    return total_bytes * ((world - 1.0) / world / link_bw_bytes_per_s)


def t_pull_s(
    chunk_bytes: Arr, copy_engine_bw_bytes_per_s: Arr, link_bw_bytes_per_s: Arr, copy_latency_s: Arr
) -> Arr:
    """Copy-engine pull of one peer's chunk: latency + bytes/min(copy-engine bw, link bw) (s); no
    faster than the link."""
    return copy_latency_s + chunk_bytes / np.minimum(
        copy_engine_bw_bytes_per_s, link_bw_bytes_per_s
    )


def t_chunk_concurrent_s(
    t_mem_s: Arr, t_comp_s: Arr, t_pair_comp_s: Arr, launch_s: Arr, stream_concurrency: Arr
) -> Arr:
    """Chunk GEMM on two streams: launch + max(t_mem, (1−κ)·t_comp + κ·t_comp(2 chunks)/2) (s).

    Two streams recover only tile/wave quantisation of compute; two memory-bound chunks share HBM,
    so each still re-streams its whole weight matrix (docs/model.md §6)."""
    comp = (1.0 - stream_concurrency) * t_comp_s + stream_concurrency * 0.5 * t_pair_comp_s
    return launch_s + np.maximum(t_mem_s, comp)


def overlapped_fraction(t_comm_total_s: Arr, t_comp_total_s: Arr) -> Arr:
    """Share of GEMM time that runs while pulls are in flight: min(1, Σpull/ΣGEMM)
    (dimensionless)."""
    return np.minimum(1.0, t_comm_total_s / np.maximum(t_comp_total_s, 1e-30))


def t_ag_gemm_gpu_s(
    world: Arr,
    t_chunk_s: Arr,
    t_chunk_eff_s: Arr,
    t_whole_s: Arr,
    t_pull_s_: Arr,
    t_copy_s: Arr,
    barrier_s: Arr,
) -> Arr:
    """AG+GEMM on the GPU: 3·b + t_copy + max(0, t_copy − g_eff) + max(W·g_eff, t_whole, (W−1)·p +
    g) (s).

    The main loop is compute-bound (never cheaper than the whole GEMM) or pull-bound with the last
    GEMM alone."""
    pipe = np.maximum(
        np.maximum(world * t_chunk_eff_s, t_whole_s), (world - 1) * t_pull_s_ + t_chunk_s
    )
    return 3.0 * barrier_s + t_copy_s + np.maximum(0.0, t_copy_s - t_chunk_eff_s) + pipe


def t_gemm_rs_gpu_s(
    world: Arr,
    t_chunk_s: Arr,
    t_chunk_eff_s: Arr,
    t_whole_s: Arr,
    t_pull_s_: Arr,
    t_reduction_s: Arr,
    barrier_s: Arr,
    exposure: Arr = 0.0,
) -> Arr:
    """GEMM+RS on the GPU: 2W·b + max(W·g_eff + ε·(W−1)·p, t_whole, g + (W−1)·p) + t_red (s).

    The 2 barriers of each step queue behind the other stream's chunk GEMM (a barrier kernel gets no
    SM while a persistent full-occupancy GEMM runs), so they add, and the pull they gate waits with
    them: a share ε of the pulls (asynctp.rs_step_exposure; 0 all hide, 1 none) runs after the GEMMs
    (docs/model.md §6)."""
    pipe = np.maximum(
        np.maximum(world * t_chunk_eff_s + exposure * (world - 1) * t_pull_s_, t_whole_s),
        t_chunk_s + (world - 1) * t_pull_s_,
    )
    return 2.0 * world * barrier_s + pipe + t_reduction_s


def host_ops_ag_gemm(world: Arr) -> Arr:
    """Host-issued torch calls of fused_all_gather_matmul (torch 2.13, return_A): 4(W−1) + 16
    (count; docs §6)."""
    return 4.0 * (world - 1) + 16.0


def host_ops_gemm_rs(world: Arr) -> Arr:
    """Host-issued torch calls of fused_matmul_reduce_scatter (torch 2.13, + reduction): 6(W−1) + 16
    (count; docs §6)."""
    return 6.0 * (world - 1) + 16.0


def t_eager_s(t_gpu_s: Arr, t_host_s: Arr, t_tail_s: Arr) -> Arr:
    """An eagerly issued op: max(GPU time, host issue time + the GPU work left after the last issue)
    (s)."""
    return np.maximum(t_gpu_s, t_host_s + t_tail_s)


def kernel_tiles(m: Arr, n: Arr, tile_m: Arr, tile_n: Arr) -> Arr:
    """Output tiles of a persistent fused kernel: ceil(m/tile_m)·ceil(n/tile_n) (count;
    docs/model.md §6b)."""
    return np.ceil(np.maximum(m, 1.0) / tile_m) * np.ceil(n / tile_n)


def kernel_waves(tiles: Arr, sm_count: Arr) -> Arr:
    """Waves of a persistent kernel with one CTA per SM: ceil(tiles / SMs) (count; docs/model.md
    §6b)."""
    return np.ceil(tiles / sm_count)


def kernel_egress_bytes(m: Arr, n: Arr, out_bytes: Arr, world: Arr, all_reduce: bool) -> Arr:
    """Bytes one rank sends into the switch: m·n·b for the ld_reduce (the switch reads every rank's
    partial, the issuer's own included), + m·n·b/W for GEMM+AR's multimem.st of its reduced rows
    (bytes; docs/model.md §6b)."""
    s = m * n * out_bytes
    return s + s / world if all_reduce else s


def kernel_ingress_bytes(m: Arr, n: Arr, out_bytes: Arr, world: Arr, all_reduce: bool) -> Arr:
    """Bytes one rank receives: m·n·b/W of reduced rows from its ld_reduce, + m·n·b that GEMM+AR's
    multimem.st of every rank writes into it (bytes; docs/model.md §6b)."""
    s = m * n * out_bytes
    return s / world + s if all_reduce else s / world


def kernel_inflight_bytes(m: Arr, tile_m: Arr, tile_n: Arr, out_bytes: Arr) -> Arr:
    """Egress one CTA keeps in flight: its RS tile's ld_reduce of min(m, BM)/W rows × BN from each
    of W ranks, all issued before any store: min(m, BM)·BN·b (bytes; docs/model.md §6b)."""
    return np.minimum(m, tile_m) * tile_n * out_bytes


def multicast_bw_bytes_per_s(
    ctas: Arr,
    inflight_bytes_per_cta: Arr,
    latency_s: Arr,
    link_bw_bytes_per_s: Arr,
    link_efficiency: Arr,
) -> Arr:
    """Multicast bandwidth one rank reaches: min(η·link peak, CTAs·bytes in flight per CTA / round
    trip) (bytes/s; Little's law: the requests outstanding, which grow with the active CTAs, over
    their latency; docs/model.md §6b)."""
    with np.errstate(
        divide="ignore"
    ):  # λ = 0 (its documented bound): no latency limit, the link's η·peak alone
        little = np.divide(ctas * inflight_bytes_per_cta, latency_s)
    return np.minimum(link_efficiency * link_bw_bytes_per_s, little)


def t_wave_pipeline_s(t_comp_s: Arr, t_comm_s: Arr, waves: Arr) -> Arr:
    """Compute and communication of w equal waves, wave i's communication beside wave i+1's compute:
    g/w + (w−1)·max(g, L)/w + L/w (s); one wave is serial (g + L), many waves tend to max(g, L)."""
    return (t_comp_s + t_comm_s + (waves - 1.0) * np.maximum(t_comp_s, t_comm_s)) / waves


def t_fused_kernel_s(
    t_gemm_s: Arr,
    t_link_s: Arr,
    waves: Arr,
    fixed_s: Arr,
    compute_overhead: Arr,
    exposed_fraction: Arr,
) -> Arr:
    """Single-kernel GEMM+collective: c + P + α·(g' + L − P), P = t_wave_pipeline_s(g', L, w), g' =
    g·(1+φ) (s).

    g the whole GEMM, L the communication at the multicast bandwidth, w the waves, φ the GEMM time
    lost to the communicating warps, α the share of the overlap a kernel design gives up (0:
    wave-pipelined, 1: serial), c the per-call launch, fences and exit barrier (docs/model.md §6b).
    Never below max(g, L), never above c + g' + L."""
    g = t_gemm_s * (1.0 + compute_overhead)
    pipe = t_wave_pipeline_s(g, t_link_s, waves)
    return fixed_s + pipe + exposed_fraction * (g + t_link_s - pipe)


def collective_beyond_domain(
    latency_s: Arr, bus_bw_bytes_per_s: Arr, network_bw_bytes_per_s: Arr, network_latency_s: Arr
) -> tuple[Arr, Arr]:
    """(α + α_net, min(busBW, net busBW)) of a collective whose ranks span more than one NVLink
    domain: the network caps the bus bandwidth and adds its latency (s, bytes/s; docs/model.md
    §4)."""
    return latency_s + network_latency_s, np.minimum(bus_bw_bytes_per_s, network_bw_bytes_per_s)


def dynamic_quant_bytes(n: Arr, hidden: Arr, act_bytes: Arr) -> Arr:
    """Per-token fp8 quantisation kernel after a bf16 all-gather: reads n·H·b, writes n·H fp8:
    n·H·(b+1) (bytes)."""
    return n * (hidden * (act_bytes + 1.0))


def embedding_bytes(n: Arr, hidden: Arr, act_bytes: Arr) -> Arr:
    """Embedding lookup: n rows of H gathered and written: n·2H·b (bytes)."""
    return n * (2.0 * hidden * act_bytes)


def logits_bytes(n_seqs: Arr, vocab: Arr) -> Arr:
    """The fp32 logits of the last token of each sequence, gathered over the vocab shards:
    n_seqs·V·4 (bytes)."""
    return n_seqs * vocab * 4.0


# rows per expert block of vLLM's fused_moe (moe_align_block_size pads each expert to it)
MOE_ALIGN_BLOCK_M = 64


def moe_topk_bytes(n: Arr, num_experts: Arr, top_k: Arr, act_bytes: Arr) -> Arr:
    """Router top-k (vLLM's topk_softmax): read n·E logits, write n·k fp32 weights and int32 ids
    (bytes; §8)."""
    return n * (num_experts * act_bytes + top_k * 8.0)


def moe_align_bytes(n: Arr, top_k: Arr, num_experts: Arr, block_m: Arr = MOE_ALIGN_BLOCK_M) -> Arr:
    """moe_align_block_size: read the n·k int32 ids, write them sorted and padded per expert block
    (s = n·k + E·(block−1) slots at most), plus the block → expert map: 4·(n·k + s + s/block)
    (bytes; §8)."""
    sorted_ids = n * top_k + num_experts * (block_m - 1.0)
    return 4.0 * (n * top_k + sorted_ids + sorted_ids / block_m)


def moe_sum_bytes(n: Arr, top_k: Arr, hidden: Arr, act_bytes: Arr) -> Arr:
    """moe_sum: read each token's k weighted expert outputs, write their sum: n·H·b·(k + 1) (bytes;
    §8)."""
    return n * hidden * act_bytes * (top_k + 1.0)


def moe_finalize_bytes(
    n: Arr, routed_rows: Arr, hidden: Arr, act_bytes: Arr, out_bytes: Arr
) -> Arr:
    """MoE top-k finalize: read each token's ρ permuted rows with an fp32 weight and int32 index,
    write the sum:
    n·(ρ·(H·b + 8) + H·b_out) (bytes; §4b)."""
    return n * (routed_rows * (hidden * act_bytes + 8.0) + hidden * out_bytes)


def add_bytes(n: Arr, hidden: Arr, act_bytes: Arr) -> Arr:
    """a + b of two n×H tensors: read 2·n·H·b, write n·H·b (bytes; §4b)."""
    return n * (3.0 * hidden * act_bytes)


MXFP8_BLOCK = 32  # elements per UE8M0 scale (OCP MX)


def mxfp8_quant_bytes(n: Arr, hidden: Arr, act_bytes: Arr) -> Arr:
    """MXFP8 quantisation: read n·H·b, write n·H E4M3 and the 128×4-swizzled UE8M0 scales,
    ⌈n/128⌉·128·⌈H/128⌉·4 (bytes; §4b)."""
    scales = padded(n, 128.0) * padded(hidden / MXFP8_BLOCK, 4.0)
    return n * (hidden * (act_bytes + 1.0)) + scales


def moe_expert_weight_bytes(
    n: Arr, top_k: Arr, num_experts: Arr, hidden: Arr, inter_rank: Arr, w_bytes: Arr
) -> Arr:
    """Expert weights a grouped MoE GEMM streams for n tokens: E(1−(1−k/E)^n) experts × 3·H·I·b
    (bytes; §8)."""
    return expected_experts_touched(n, top_k, num_experts) * (3 * hidden * inter_rank * w_bytes)


def t_interp_log_s(msg_bytes: Arr, measured_bytes: Arr, measured_s: Arr) -> Arr:
    """Measured times interpolated linearly in log size and log time: a power law between
    neighbouring points, exact at each (s; msg_bytes within the measured range; docs/model.md
    §4)."""
    return np.exp(np.interp(np.log(msg_bytes), np.log(measured_bytes), np.log(measured_s)))


# --------------------------------------------------------------------------- expert parallelism
# (§11)


def p_bin_empty(
    k: int, num_experts: int, n_group: int, topk_group: int, bin_experts: int, first: int = 0
) -> float:
    """P(a token's top-k misses the bin of experts [first, first + bin_experts)) under uniform
    group-limited routing:
    the mean over the equally likely group choices S of C(pool − |bin ∩ S|, k) / C(pool, k)
    (§11.1)."""
    from itertools import combinations
    from math import comb

    E, c = num_experts, bin_experts
    if n_group <= 1 or topk_group >= n_group:
        return comb(E - c, k) / comb(E, k)
    g = E // n_group
    pool = topk_group * g  # experts a token may pick from: its topk_group groups
    in_group = [max(0, min(first + c, (j + 1) * g) - max(first, j * g)) for j in range(n_group)]
    choices = list(combinations(range(n_group), topk_group))
    return sum(comb(pool - sum(in_group[j] for j in sel), k) for sel in choices) / (
        len(choices) * comb(pool, k)
    )


def expected_bins_hit(k: int, num_experts: int, n_group: int, topk_group: int, bins: int) -> float:
    """Expected distinct bins (ranks or nodes, E/bins experts each) one token's top-k reaches
    (count; §11.1)."""
    size = num_experts // bins
    return sum(
        1.0 - p_bin_empty(k, num_experts, n_group, topk_group, size, i * size) for i in range(bins)
    )


def expected_active_experts(
    total_tokens: Arr, k: int, num_experts: int, local_experts: int, imbalance: Arr = 1.0
) -> Arr:
    """Local experts that receive at least one of all DP ranks' tokens: E_loc·(1 − (1 − ι·k/E)^T)
    (count; §11.1)."""
    p = np.minimum(imbalance * k / num_experts, 1.0)
    return local_experts * (1.0 - (1.0 - p) ** np.asarray(total_tokens, dtype=float))


def expected_row_tiles(total_tokens: Arr, p_hit: Arr, tile_m: int) -> Arr:
    """E[⌈M/tile_m⌉] for one expert's rows M ~ Binomial(T, p): Σ_j P(M > j·tile_m) (tiles;
    §11.2)."""
    from scipy.stats import binom

    t = np.atleast_1d(np.asarray(total_tokens, dtype=float))
    jmax = int(
        np.max(t) * float(np.max(p_hit)) / tile_m
        + 12 * np.sqrt(np.max(t) * float(np.max(p_hit)) + 1) / tile_m
        + 2
    )
    j = np.arange(0, jmax + 1)[:, None] * tile_m
    out = binom.sf(j, t[None, :], p_hit).sum(axis=0)
    return out if np.ndim(total_tokens) else float(out[0])


def a2a_token_bytes(hidden: int, dtype: str) -> float:
    """Bytes one token copy carries: fp8 with one fp32 scale per 128 elements, or 2·H for bf16
    (bytes; §11.3)."""
    return hidden + hidden / 128 * 4 if dtype == "fp8" else 2.0 * hidden


def t_aux_stream_s(main_s: Arr, shared_s: Arr, window_s: Arr, slowdown: Arr, events_s: Arr) -> Arr:
    """A MoE layer with its shared experts on vLLM's aux stream: the main path, the shared experts'
    part that the collectives' window cannot hold, the collectives slowed by `slowdown` while the
    GEMM runs beside them, and the two events that join the streams (s; docs/model.md §11.4)."""
    return (
        main_s
        + np.maximum(0.0, shared_s - window_s)
        + slowdown * np.minimum(shared_s, window_s)
        + events_s
    )


def t_link_bound_s(nbytes: Arr, bw_bytes_per_s: Arr, efficiency: Arr) -> Arr:
    """Bytes over one link at its achievable rate: bytes / (bw · η) (s; §11.3)."""
    return nbytes / (bw_bytes_per_s * efficiency)


def mib_per_gpu(tokens: Arr, hidden: int, elem_bytes: float, tp: int) -> Arr:
    """A step's residual-stream message per GPU (MiB): elem_bytes · hidden · N / tp, the unit vLLM
    #27700 argued SP thresholds in (docs/model.md §9)."""
    return np.asarray(tokens, dtype=float) * hidden * elem_bytes / tp / 2**20
