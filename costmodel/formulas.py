"""One small pure function per formula, SI, vectorised over tokens and draws (docs/model.md §2)."""
# Numpy-vectorised over token counts and over Monte Carlo draws: any argument may be an array,
# shapes broadcast. Each function's docstring names its section of docs/model.md.

from __future__ import annotations

import numpy as np

Arr = float | np.ndarray  # a number, or a numpy array of them: every formula broadcasts over arrays
# binary byte units (the one home; vLLM's tables and messages are in them)
KiB, MiB, GiB = (
    1024,
    1024**2,
    1024**3,
)
# NCCL ring all-reduce busBW / per-direction link on H100 (NCCL_ISSUE1455): a ring's link share
RING_LINK_RATIO = 0.816
# NCCL's LL protocol: each 8-byte store carries 4 bytes of data and a 4-byte flag
LL_PAYLOAD_FRACTION = 0.5

# --------------------------------------------------------------------------- GEMM (docs §2)

SPLIT_K_MIN_DEPTH = 512.0  # smallest K slice a stream-K kernel gives one SM (elements)


def gemm_flops(m: Arr, n: Arr, k: Arr) -> Arr:
    """FLOP of C[m,n] = A[m,k] @ B[k,n]: 2·m·n·k (FLOP; docs/model.md §2)."""
    return m * (2.0 * n * k)


def gemm_bytes(m: Arr, n: Arr, k: Arr, in_bytes: Arr, w_bytes: Arr, out_bytes: Arr) -> Arr:
    """HBM bytes of one GEMM, each operand once: m·k·b_in + k·n·b_w + m·n·b_out (§2)."""
    return m * (k * in_bytes + n * out_bytes) + k * n * w_bytes


# rows: whole rows. The finest a kernel pads is 8 (skinny GEMMs run swap-AB: rows as the MMA's N,
# which steps by 8), and the library's choice among its tile shapes averages that padding out:
# measured curves show no steps
GEMM_ROW_STEP = 1.0
GEMM_COL_STEP = 64.0  # columns: the MMA's smallest M extent (64-row wgmma / tcgen05 tiles)


def padded(x: Arr, step: Arr) -> Arr:
    """x rounded up to a multiple of step: ⌈x/step⌉·step (unit of x; docs/model.md §2)."""
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
    """Stream-K compute time: 2·⌈m⌉·⌈n⌉₆₄·k over the SMs, ≥ one 512-deep tile slice (s; §2)."""
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
    """Roofline GEMM: launch + max(compute, bytes/(HBM·eff)) (s; 0 at m = 0; docs/model.md §2)."""
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
    """Memory-bound kernel: launch + bytes/(HBM·efficiency) (s; docs/model.md §3)."""
    return launch_overhead_s + bytes_moved / (hbm_bw_bytes_per_s * mem_efficiency)


def rms_norm_bytes(
    rows: Arr, hidden: Arr, act_bytes: Arr, out_bytes: Arr, fused_add: bool = True
) -> Arr:
    """(Fused-add) RMSNorm bytes: rows·H·(b·(1+r) + b_out + b·r) (bytes; docs/model.md §3)."""
    r = 1.0 if fused_add else 0.0
    return rows * (hidden * (act_bytes * (1.0 + 2.0 * r) + out_bytes))


def silu_mul_bytes(rows: Arr, intermediate_per_rank: Arr, act_bytes: Arr, out_bytes: Arr) -> Arr:
    """SiluAndMul bytes: read rows·2I/tp·b, write rows·I/tp·b_out (bytes; docs/model.md §3)."""
    return rows * (intermediate_per_rank * (2.0 * act_bytes + out_bytes))


def reduction_bytes(rows: Arr, n: Arr, out_bytes: Arr, world: Arr) -> Arr:
    """Sum of W partials [W, rows/W, n]: read rows·n·b, write rows·n·b/W (bytes; §6)."""
    return rows * (n * out_bytes * (1.0 + 1.0 / world))


# --------------------------------------------------------------------------- collectives (§4)


def t_all_reduce_s(msg_bytes: Arr, latency_s: Arr, bus_bw_bytes_per_s: Arr, world: Arr) -> Arr:
    """All-reduce: α + 2(W−1)/W·S/busBW (s; nccl-tests' bus convention; docs/model.md §4)."""
    return (latency_s + msg_bytes * (2.0 * (world - 1) / world / bus_bw_bytes_per_s)) * (
        np.asarray(world) > 1
    )


def t_all_reduce_regimes_s(
    msg_bytes: Arr, latencies_s: list, bus_bws_bytes_per_s: list, world: Arr
) -> Arr:
    """NCCL's tuner: min over regimes p of α_p + 2(W−1)/W·S/busBW_p (s; docs/model.md §4)."""
    times = [
        t_all_reduce_s(msg_bytes, a, b, world) for a, b in zip(latencies_s, bus_bws_bytes_per_s)
    ]
    return np.minimum.reduce(np.broadcast_arrays(*times))


def t_all_gather_s(msg_bytes: Arr, latency_s: Arr, bus_bw_bytes_per_s: Arr, world: Arr) -> Arr:
    """All-gather of S gathered bytes: α + (W−1)/W·S/busBW (s; docs/model.md §4)."""
    return (latency_s + msg_bytes * ((world - 1) / world / bus_bw_bytes_per_s)) * (
        np.asarray(world) > 1
    )


def t_reduce_scatter_s(msg_bytes: Arr, latency_s: Arr, bus_bw_bytes_per_s: Arr, world: Arr) -> Arr:
    """Reduce-scatter of S unreduced bytes: α + (W−1)/W·S/busBW (s; docs/model.md §4)."""
    return t_all_gather_s(msg_bytes, latency_s, bus_bw_bytes_per_s, world)


def t_ring_regimes_s(
    msg_bytes: Arr, latencies_s: list, bus_bws_bytes_per_s: list, world: Arr
) -> Arr:
    """NCCL's tuner on a ring AG or RS: min over p of α_p + (W−1)/W·S/busBW_p (s; §4)."""
    times = [
        t_all_gather_s(msg_bytes, a, b, world) for a, b in zip(latencies_s, bus_bws_bytes_per_s)
    ]
    return np.minimum.reduce(np.broadcast_arrays(*times))


def expected_experts_touched(tokens: Arr, top_k: Arr, num_experts: Arr) -> Arr:
    """Distinct experts N·k uniform picks touch: E·(1 − (1 − k/E)^N) (count; §8)."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def weight_bytes_per_gpu(params_per_gpu: Arr, bytes_per_param: Arr) -> Arr:
    """Weight memory of one rank: its parameters · bytes each (bytes; docs/model.md §8b)."""
    return params_per_gpu * bytes_per_param


# --------------------------------------------------------------------------- attention (§5)


def attention_flops(tokens: Arr, seq_len: Arr, heads_per_rank: Arr, head_dim: Arr) -> Arr:
    """Causal prefill attention: 2·d·h·N·min(N, L) for sequences of L (FLOP; §5)."""
    return tokens * np.minimum(tokens, seq_len) * (2.0 * head_dim * heads_per_rank)


def attention_bytes(
    tokens: Arr, heads_per_rank: Arr, kv_heads_per_rank: Arr, head_dim: Arr, act_bytes: Arr
) -> Arr:
    """FlashAttention bytes, Q, K, V read and O written once: N·(2h + 2kv)·d·b (§5)."""
    return tokens * ((2.0 * heads_per_rank + 2.0 * kv_heads_per_rank) * head_dim * act_bytes)


def decode_attention_flops(seqs: Arr, context_len: Arr, heads_per_rank: Arr, head_dim: Arr) -> Arr:
    """Decode attention, one query per sequence over C: 4·d·h·B·C (FLOP; §5)."""
    return seqs * context_len * (4.0 * head_dim * heads_per_rank)


def kv_cache_read_bytes(
    seqs: Arr, context_len: Arr, kv_heads_per_rank: Arr, head_dim: Arr, kv_bytes: Arr
) -> Arr:
    """KV bytes a decode step reads per rank and layer: B·C·2·max(1, kv/tp)·d·b (§5)."""
    return seqs * context_len * (2.0 * kv_heads_per_rank * head_dim * kv_bytes)


# --------------------------------------------------------------------------- AsyncTP (§6)


COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


def bus_bw_factor(collective: str, world: Arr) -> Arr:
    """nccl-tests bus factor: all_reduce 2(W−1)/W, all_gather / reduce_scatter (W−1)/W (§4)."""
    if collective not in COLLECTIVES:
        raise ValueError(
            f"bus_bw_factor: unknown collective {collective!r} (one of {', '.join(COLLECTIVES)})"
        )
    f = (np.asarray(world, dtype=float) - 1.0) / world
    return 2.0 * f if collective == "all_reduce" else f


def t_link_s(total_bytes: Arr, world: Arr, link_bw_bytes_per_s: Arr) -> Arr:
    """Least link time for a rank's gather/scatter share: (W−1)/W·S / link peak (s; §6)."""
    return total_bytes * ((world - 1.0) / world / link_bw_bytes_per_s)


def t_pull_s(
    chunk_bytes: Arr, copy_engine_bw_bytes_per_s: Arr, link_bw_bytes_per_s: Arr, copy_latency_s: Arr
) -> Arr:
    """Copy-engine pull of one chunk: latency + bytes/min(copy engine, link) (s; §6)."""
    return copy_latency_s + chunk_bytes / np.minimum(
        copy_engine_bw_bytes_per_s, link_bw_bytes_per_s
    )


def t_chunk_concurrent_s(
    t_mem_s: Arr, t_comp_s: Arr, t_pair_comp_s: Arr, launch_s: Arr, stream_concurrency: Arr
) -> Arr:
    """Chunk GEMM on two streams: launch + max(t_mem, (1−κ)·t_comp + κ·t_comp2/2) (s; §6)."""
    comp = (1.0 - stream_concurrency) * t_comp_s + stream_concurrency * 0.5 * t_pair_comp_s
    return launch_s + np.maximum(t_mem_s, comp)


def overlapped_fraction(t_comm_total_s: Arr, t_comp_total_s: Arr) -> Arr:
    """Share of GEMM time with pulls in flight: min(1, Σpull/ΣGEMM) (docs/model.md §6)."""
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
    """AG+GEMM on the GPU: barriers + copies + max(W·g_eff, t_whole, (W−1)·p + g) (s; §6)."""
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
    """GEMM+RS on the GPU: 2W·b + max(W·g_eff + ε(W−1)p, t_whole, g + (W−1)p) + t_red (§6)."""
    pipe = np.maximum(
        np.maximum(world * t_chunk_eff_s + exposure * (world - 1) * t_pull_s_, t_whole_s),
        t_chunk_s + (world - 1) * t_pull_s_,
    )
    return 2.0 * world * barrier_s + pipe + t_reduction_s


def host_ops_ag_gemm(world: Arr) -> Arr:
    """Host-issued torch calls of fused_all_gather_matmul: 4(W−1) + 16 (count; §6)."""
    return 4.0 * (world - 1) + 16.0


def host_ops_gemm_rs(world: Arr) -> Arr:
    """Host-issued torch calls of fused_matmul_reduce_scatter: 6(W−1) + 16 (count; §6)."""
    return 6.0 * (world - 1) + 16.0


def t_eager_s(t_gpu_s: Arr, t_host_s: Arr, t_tail_s: Arr) -> Arr:
    """An eager op: max(GPU time, host issue + GPU work after the last issue) (s; §6)."""
    return np.maximum(t_gpu_s, t_host_s + t_tail_s)


def kernel_tiles(m: Arr, n: Arr, tile_m: Arr, tile_n: Arr) -> Arr:
    """Output tiles of a persistent kernel: ⌈m/tile_m⌉·⌈n/tile_n⌉ (count; docs/model.md §6b)."""
    return np.ceil(np.maximum(m, 1.0) / tile_m) * np.ceil(n / tile_n)


def kernel_waves(tiles: Arr, sm_count: Arr) -> Arr:
    """Waves of a persistent kernel, one CTA per SM: ⌈tiles/SMs⌉ (count; docs/model.md §6b)."""
    return np.ceil(tiles / sm_count)


def kernel_egress_bytes(m: Arr, n: Arr, out_bytes: Arr, world: Arr, all_reduce: bool) -> Arr:
    """Bytes one rank sends into the switch: m·n·b, + m·n·b/W for GEMM+AR (§6b)."""
    s = m * n * out_bytes
    return s + s / world if all_reduce else s


def kernel_ingress_bytes(m: Arr, n: Arr, out_bytes: Arr, world: Arr, all_reduce: bool) -> Arr:
    """Bytes one rank receives: m·n·b/W, + m·n·b for GEMM+AR's multimem.st (§6b)."""
    s = m * n * out_bytes
    return s / world + s if all_reduce else s / world


def kernel_inflight_bytes(m: Arr, tile_m: Arr, tile_n: Arr, out_bytes: Arr) -> Arr:
    """Egress one CTA keeps in flight: min(m, BM)·BN·b (bytes; docs/model.md §6b)."""
    return np.minimum(m, tile_m) * tile_n * out_bytes


def multicast_bw_bytes_per_s(
    ctas: Arr,
    inflight_bytes_per_cta: Arr,
    latency_s: Arr,
    link_bw_bytes_per_s: Arr,
    link_efficiency: Arr,
) -> Arr:
    """Multicast rate: min(η·link, CTAs·bytes in flight / round trip) (bytes/s; §6b)."""
    # λ = 0 (its documented bound): no latency limit, the link's η·peak alone
    with np.errstate(divide="ignore"):
        little = np.divide(ctas * inflight_bytes_per_cta, latency_s)
    return np.minimum(link_efficiency * link_bw_bytes_per_s, little)


def t_wave_pipeline_s(t_comp_s: Arr, t_comm_s: Arr, waves: Arr) -> Arr:
    """w waves, comm beside the next compute: g/w + (w−1)·max(g, L)/w + L/w (s; §6b)."""
    return (t_comp_s + t_comm_s + (waves - 1.0) * np.maximum(t_comp_s, t_comm_s)) / waves


def t_fused_kernel_s(
    t_gemm_s: Arr,
    t_link_s: Arr,
    waves: Arr,
    fixed_s: Arr,
    compute_overhead: Arr,
    exposed_fraction: Arr,
) -> Arr:
    """Single-kernel GEMM+collective: c + P + α·(g' + L − P), g' = g·(1+φ) (s; §6b)."""
    g = t_gemm_s * (1.0 + compute_overhead)
    pipe = t_wave_pipeline_s(g, t_link_s, waves)
    return fixed_s + pipe + exposed_fraction * (g + t_link_s - pipe)


def collective_beyond_domain(
    latency_s: Arr, bus_bw_bytes_per_s: Arr, network_bw_bytes_per_s: Arr, network_latency_s: Arr
) -> tuple[Arr, Arr]:
    """(α + α_net, min(busBW, net busBW)) of a collective across domains (§4, §11.5)."""
    return latency_s + network_latency_s, np.minimum(bus_bw_bytes_per_s, network_bw_bytes_per_s)


def dynamic_quant_bytes(n: Arr, hidden: Arr, act_bytes: Arr) -> Arr:
    """Per-token fp8 quantisation after a bf16 all-gather: n·H·(b+1) (bytes; §7)."""
    return n * (hidden * (act_bytes + 1.0))


def embedding_bytes(n: Arr, hidden: Arr, act_bytes: Arr) -> Arr:
    """Embedding lookup: n rows of H read and written: n·2H·b (bytes; docs/model.md §3)."""
    return n * (2.0 * hidden * act_bytes)


def logits_bytes(n_seqs: Arr, vocab: Arr) -> Arr:
    """fp32 logits of each sequence's last token over the vocab shards: n_seqs·V·4 (§1)."""
    return n_seqs * vocab * 4.0


# rows per expert block of vLLM's fused_moe (moe_align_block_size pads each expert to it)
MOE_ALIGN_BLOCK_M = 64


def moe_topk_bytes(n: Arr, num_experts: Arr, top_k: Arr, act_bytes: Arr) -> Arr:
    """Router top-k (topk_softmax): n·E logits read, n·k weights and ids written (§8)."""
    return n * (num_experts * act_bytes + top_k * 8.0)


def moe_align_bytes(n: Arr, top_k: Arr, num_experts: Arr, block_m: Arr = MOE_ALIGN_BLOCK_M) -> Arr:
    """moe_align_block_size: 4·(n·k + s + s/block), s = n·k + E·(block−1) (bytes; §8)."""
    sorted_ids = n * top_k + num_experts * (block_m - 1.0)
    return 4.0 * (n * top_k + sorted_ids + sorted_ids / block_m)


def moe_sum_bytes(n: Arr, top_k: Arr, hidden: Arr, act_bytes: Arr) -> Arr:
    """moe_sum: k weighted outputs read, their sum written: n·H·b·(k + 1) (bytes; §8)."""
    return n * hidden * act_bytes * (top_k + 1.0)


def moe_finalize_bytes(
    n: Arr, routed_rows: Arr, hidden: Arr, act_bytes: Arr, out_bytes: Arr
) -> Arr:
    """MoE top-k finalize: n·(ρ·(H·b + 8) + H·b_out) (bytes; docs/model.md §4b)."""
    return n * (routed_rows * (hidden * act_bytes + 8.0) + hidden * out_bytes)


def add_bytes(n: Arr, hidden: Arr, act_bytes: Arr) -> Arr:
    """a + b of two n×H tensors: 2·n·H·b read, n·H·b written (bytes; docs/model.md §4b)."""
    return n * (3.0 * hidden * act_bytes)


MXFP8_BLOCK = 32  # elements per UE8M0 scale (OCP MX)


def mxfp8_quant_bytes(n: Arr, hidden: Arr, act_bytes: Arr) -> Arr:
    """MXFP8 quantisation: n·H·b read, n·H E4M3 and swizzled UE8M0 scales written (§4b)."""
    scales = padded(n, 128.0) * padded(hidden / MXFP8_BLOCK, 4.0)
    return n * (hidden * (act_bytes + 1.0)) + scales


def moe_expert_weight_bytes(
    n: Arr, top_k: Arr, num_experts: Arr, hidden: Arr, inter_rank: Arr, w_bytes: Arr
) -> Arr:
    """Expert weights n tokens stream: E(1−(1−k/E)^n)·3·H·I·b (bytes; §8)."""
    return expected_experts_touched(n, top_k, num_experts) * (3 * hidden * inter_rank * w_bytes)


def t_interp_log_s(msg_bytes: Arr, measured_bytes: Arr, measured_s: Arr) -> Arr:
    """Measured times interpolated linearly in log size and log time (s; docs/model.md §4)."""
    return np.exp(np.interp(np.log(msg_bytes), np.log(measured_bytes), np.log(measured_s)))


# --------------------------------------------------------------------------- expert parallelism
# (§11)


def p_bin_empty(
    k: int, num_experts: int, n_group: int, topk_group: int, bin_experts: int, first: int = 0
) -> float:
    """P(a token's top-k misses a bin of experts) under group-limited routing (§11.1)."""
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
    """Expected distinct bins (ranks or nodes) one token's top-k reaches (count; §11.1)."""
    size = num_experts // bins
    return sum(
        1.0 - p_bin_empty(k, num_experts, n_group, topk_group, size, i * size) for i in range(bins)
    )


def expected_active_experts(
    total_tokens: Arr, k: int, num_experts: int, local_experts: int, imbalance: Arr = 1.0
) -> Arr:
    """Local experts hit by all ranks' tokens: E_loc·(1 − (1 − ι·k/E)^T) (§11.1)."""
    p = np.minimum(imbalance * k / num_experts, 1.0)
    return local_experts * (1.0 - (1.0 - p) ** np.asarray(total_tokens, dtype=float))


def expected_row_tiles(total_tokens: Arr, p_hit: Arr, tile_m: int) -> Arr:
    """E[⌈M/tile_m⌉] for M ~ Binomial(T, p): Σ_j P(M > j·tile_m) (tiles; §11.2)."""
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
    """Bytes one token copy carries: fp8 + an fp32 scale per 128, or 2·H for bf16 (§11.3)."""
    return hidden + hidden / 128 * 4 if dtype == "fp8" else 2.0 * hidden


def t_aux_stream_s(main_s: Arr, shared_s: Arr, window_s: Arr, slowdown: Arr, events_s: Arr) -> Arr:
    """A MoE layer with its shared experts on vLLM's aux stream (s; docs/model.md §11.4)."""
    return (
        main_s
        + np.maximum(0.0, shared_s - window_s)
        + slowdown * np.minimum(shared_s, window_s)
        + events_s
    )


def t_link_bound_s(nbytes: Arr, bw_bytes_per_s: Arr, efficiency: Arr) -> Arr:
    """Bytes over one link at its achievable rate: bytes / (bw·η) (s; docs/model.md §11.3)."""
    return nbytes / (bw_bytes_per_s * efficiency)


def mib_per_gpu(tokens: Arr, hidden: int, elem_bytes: float, tp: int) -> Arr:
    """A step's residual-stream message per GPU: b·H·N/tp (MiB; docs/model.md §9)."""
    return np.asarray(tokens, dtype=float) * hidden * elem_bytes / tp / 2**20
