"""The attention kernels' achieved rate: a fused kernel's fraction of peak (its kernel, the head dimension, the
softmax), its rate on a rank's calls against their length and context parallelism (attention_rate_ratio), FP8
attention's speed-up, and the unfused path's unaligned batched matmuls. Split out of cost.compute (issue 35),
which re-exports these names. Works on one ParallelPlan and, elementwise, on plan arrays (see llmplan/arith.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmplan.arith import maximum, where
from llmplan.cost.flops import attention_head_dims, attention_score_flops, window_keys
from llmplan.cost.quantize import bf16_kernel_format
from llmplan.cost.windows import window_key_count
from llmplan.specs.hardware import Fp8AttentionFormat, GpuSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan

ATTENTION_TILE = 128
"""Rows of a fused attention kernel's tile at head dim 128: FlashAttention-3's Hopper forward and backward
(kBlockM = kBlockN = 128, Dao-AILab/flash-attention hopper/tile_size.h) and FlashAttention-2's forward. A
forward CTA owns one query tile of one head (of one sequence) and loops over the key tiles; a backward CTA
owns one key tile and loops over the query tiles. Derived: docs/formulas.md#compute.cp_attention"""

ATTENTION_FIXED_KEYS = {"native": (237.0, 420.0), "flash2": (105.0, 271.0)}
"""(forward, backward) keys' worth of time a fused attention kernel spends per CTA outside its loop over the
other side's tiles (loading its own tile, filling the pipeline, the epilogue: the output and log-sum-exp, or
dK and dV), so that a CTA looping over k keys (queries, in backward) runs at k / (k + k0) of the kernel's rate.
Solved from two published rates on H100 (bf16, head dim 128, batch x sequence = 16k tokens, so the CTA count
is the same at every length) at 512 and 16k tokens, k0 = 512·16384·(1 - r) / (r·16384 - 512) with r their
ratio. FlashAttention-3 (the native kernel on Hopper): forward 430.3 and 620.7 TFLOP/s (pytorch/benchmark PR
#2391, commit ff65cb6), backward 316 and 561 (Shah et al. 2024, FlashAttention-3, Figure 6). FlashAttention-2:
forward 309 and 370, backward 214 and 322 (Shah et al. 2024, Figures 5-6). The same form gives the 1k-8k points
within 5% (tests/test_cp_short.py). Derived: docs/formulas.md#compute.cp_attention"""


ATTENTION_BACKWARD_WEIGHT = 2.0
"""Backward attention time over forward time at one rate, as llmplan prices the fused kernel (backward FLOPs
twice the forward's: stage_compute's attention passes, 3 = 1 + this). The one weight of the backward calls in
attention_rate_ratio, window_rate_ratio and dropout_bench_loop_share, and of the published per-pass FP8 ratios
(fp8_attention_ratio). Derived: docs/formulas.md#compute.time"""


def fixed_keys(plan: ParallelPlan, gpu: GpuSpec) -> tuple[Any, Any]:
    """(forward, backward) ATTENTION_FIXED_KEYS of the plan's fused kernel: FA2's for the flash2 kernel and
    where the GPU's native kernel is FA2 (GpuSpec.native_attention_flash2), else the native kernel's (FA3).
    Derived: docs/formulas.md#compute.cp_attention"""
    fa2 = (plan.attention_kernel == "flash2") | gpu.native_attention_flash2
    return (where(fa2, ATTENTION_FIXED_KEYS["flash2"][0], ATTENTION_FIXED_KEYS["native"][0]),
            where(fa2, ATTENTION_FIXED_KEYS["flash2"][1], ATTENTION_FIXED_KEYS["native"][1]))


def attention_call_seconds(rows: Any, work: Any, longest: Any, sms: int, fixed_keys: float) -> Any:
    """Time of one fused-attention call, in key-tile iterations of one SM: `rows` CTAs (query tiles x heads x
    sequences in forward, key tiles x ... in backward) that together run `work` tile iterations, the longest
    CTA `longest` of them, each CTA fixed_keys / ATTENTION_TILE iterations more (ATTENTION_FIXED_KEYS), one CTA
    per SM at a time. The call takes its share of the SMs' time, rows / sms waves of the mean CTA, but never
    less than its longest CTA: a call of fewer CTAs than SMs leaves SMs idle, and a causal call's last query
    tile sees every key tile. (A partly filled last wave is not charged: Transformer Engine runs successive
    ring steps' attention on two alternating streams, so the next call's CTAs fill it.)
    Source: Dao 2023, FlashAttention-2 §3.2 (one thread block per query block and head; the backward per key
    block); Transformer Engine context_parallel.py (flash_attn_streams). Derived:
    docs/formulas.md#compute.cp_attention"""
    rows = maximum(rows, 1.0)
    fixed = fixed_keys / ATTENTION_TILE
    return maximum(rows / sms * (work / rows + fixed), longest + fixed)


def attention_rate_ratio(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec,
                         keys: tuple[Any, Any] | None = None) -> Any:
    """The fused attention kernel's rate on a rank's calls of one layer over its asymptotic rate
    (GpuSpec.attention_efficiency: one long causal call, the per-CTA fixed work amortised, every SM busy).
    At cp = 1 a rank runs one causal call over s: its diagonal tiles are computed whole (masked) and each CTA
    pays ATTENTION_FIXED_KEYS once, so short sequences run below the asymptote. With context parallelism and
    load balancing (Megatron / Transformer Engine's zigzag, torchtitan's round-robin) each rank holds two
    chunks of c = s/2cp tokens and runs, per layer and pass, one causal call on its own 2c x 2c and cp - 1 ring
    steps on c x 2c halves: steps i <= rank take the first half of the received K/V (queries 2c x keys c),
    the others the second half of the queries (c x 2c). The same tiles as one causal call over s, in short
    calls: fewer keys per CTA (ATTENTION_FIXED_KEYS weighs more) and, once a call has fewer CTAs than the
    GPU has SMs, idle SMs. Rank r runs r calls of the first kind and cp - 1 - r of the second, and every rank
    waits for the slowest at the layer's end: cp - 1 times the slower kind. Forward (CTAs over query tiles)
    once, backward (over key tiles) twice. The asymptote is a rank's share of s^2/2 useful (query, key) pairs
    per head at one tile iteration per SM, no fixed work. k0 is H100's (FA3 for the native kernel, FA2 for
    flash2 and where the native kernel is FA2) on every GPU; `keys` gives another kernel's (forward, backward)
    fixed keys (TRITON_FLASH_ATTENTION). With attention dropout every tile iteration takes dropout_tile_factor
    times as long (the asymptote stays the kernel's without dropout).
    Source: Dao 2023, FlashAttention-2 §3.2 (causal: blocks above the diagonal skipped, the diagonal block
    masked); Transformer Engine attention context_parallel.py (AttnFuncWithCPAndKVP2P: the per-step
    sections); Megatron-LM megatron/training/utils.py get_batch_on_this_cp_rank (2·cp chunks: rank r holds
    chunks r and 2cp - 1 - r). Derived: docs/formulas.md#compute.cp_attention"""
    sms = gpu.sm_count
    H = plan.micro_batch * m.num_attention_heads / plan.tp  # (head, sequence) pairs per call
    n = np.ceil(plan.seq_len / (2 * plan.cp * ATTENTION_TILE))  # tiles per chunk
    k_fwd, k_bwd = fixed_keys(plan, gpu) if keys is None else keys
    x = dropout_tile_factor(m, plan, gpu)  # attention dropout: each tile iteration x as long

    def passes(q: Any, k: Any, tiles: Any, q_loop: Any, k_loop: Any) -> Any:  # forward + backward of one call
        return (attention_call_seconds(q * H, x * tiles * H, x * q_loop, sms, k_fwd)
                + ATTENTION_BACKWARD_WEIGHT
                * attention_call_seconds(k * H, x * tiles * H, x * k_loop, sms, k_bwd))

    halves = maximum(passes(2 * n, n, 2 * n * n, n, 2 * n), passes(n, 2 * n, 2 * n * n, 2 * n, n))
    ring = passes(2 * n, 2 * n, 2 * n * n + n, 2 * n, 2 * n) + (plan.cp - 1) * halves
    N = np.ceil(plan.seq_len / ATTENTION_TILE)
    whole = passes(N, N, N * (N + 1) / 2, N, N)  # one causal call over s
    passes_weight = 1 + ATTENTION_BACKWARD_WEIGHT  # forward + backward
    useful = passes_weight * H * (plan.seq_len / ATTENTION_TILE) ** 2 / 2 / sms  # the asymptote's time, all ranks
    return useful / plan.cp / where(plan.cp > 1, ring, whole)


TRITON_FLASH_ATTENTION = (0.419, 124.0)
"""Triton FlashAttention (Tri Dao's flash_attn_triton.py, the kernel MosaicML llm-foundry's attn_impl triton
runs): (its asymptotic rate over FlashAttention-2's, its per-CTA fixed keys, forward and backward alike, in
ATTENTION_FIXED_KEYS' sense). Solved from the one published comparison of the two on a GPU: Dao 2023,
FlashAttention-2, Figure 4d (A100 80GB SXM4, forward + backward, causal, head dim 128, 16 heads, batch x
sequence = 16k tokens; the same figure is Dao-AILab/flash-attention assets/flash2_a100_fwd_bwd_benchmark.png):
Triton 50 and 80 TFLOP/s at 512 and 16k tokens, FA2 99 and 189. The fixed keys make attention_rate_ratio's
Triton curve over FA2's curve (fixed keys ATTENTION_FIXED_KEYS["flash2"]) go as the published ratio from 512
to 16k (0.505 -> 0.423); the asymptote then gives 80/189 at 16k. The 1k-8k points (0.459, 0.439, 0.428,
0.429) come out within 3.3% (tests/test_triton_attention.py). Derived: docs/formulas.md#compute.triton_attention"""


def triton_flash2_ratio(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec) -> Any:
    """Triton FlashAttention's rate on the plan's calls over FlashAttention-2's (attention_fraction's flash2
    rate times attention_rate_ratio), at cp = 1: its asymptote over FA2's times its length curve (its own
    fixed keys, TRITON_FLASH_ATTENTION) over FA2's, over FA2's head-dimension factor. Triton's published rate
    does not fall with the head dimension where FA2's does (Figure 4c vs 4d at 4k-16k: 76/74, 79/78, 80/80
    TFLOP/s at head dim 64/128), so the ratio carries no head-dimension factor of its own. The ratio to FA2 is
    applied on every GPU: the Triton of 2022-23 (triton-pre-mlir) emits Ampere's mma.sync on Hopper as FA2
    does (no wgmma). Source: Dao 2023, FlashAttention-2, Figure 4c-d (A100). Derived:
    docs/formulas.md#compute.triton_attention"""
    asymptote, k = TRITON_FLASH_ATTENTION
    curve = attention_rate_ratio(m, plan, gpu, (k, k)) / attention_rate_ratio(m, plan, gpu)
    return asymptote * curve / gpu_head_dim_ratio(m, gpu, gpu.flash2_softmax_head_dim)


def window_call_tiles(N: Any, j: Any) -> Any:
    """Key tiles (per head and sequence) a causal sliding-window call of N query tiles computes when a query
    tile's window spans j key tiles: query tile i runs min(i + 1, j) of them, N·j - j(j - 1)/2 in all (j <= N).
    In backward each key tile runs over the same number of query tiles. Derived:
    docs/formulas.md#compute.window_attention"""
    return N * j - j * (j - 1) / 2


def backward_window_tiles(plan: ParallelPlan, N: Any, j: Any) -> Any:
    """Key tiles a windowed call's backward spans per query tile (window_call_tiles' j): the window's j in bf16;
    with FP8 attention (ParallelPlan.fp8_attention) all N, the causal call's tiles: cuDNN's FP8 / MXFP8 SDPA
    backward with a 128-token sliding window on Blackwell skips none of the causal tiles outside the window.
    Its published times grow with s^2 (GB200, cuDNN 9.22, batch 2, 128 heads, d 64: 0.536, 1.731, 6.18, 23.2,
    90.3 ms from 2k to 32k tokens, the causal call's work at about 800 TFLOP/s) where its FP8 forward and its
    bf16 backward grow with s (0.237 ... 3.692 ms). Source: NVIDIA/cudnn-frontend benchmark/
    sdpa_benchmark_training/results/gpt_oss/{gb200,gb300}/gpt_oss_20260424_*.csv at 3929da2 (configs/gpt_oss.py:
    sliding_window_size 128, top_left mask). Derived: docs/formulas.md#compute.fp8_window_backward"""
    return where(plan.fp8_attention, N, j)


def window_rate_ratio(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec) -> Any:
    """A sliding-window layer's fused attention rate over the kernel's asymptote at cp = 1 (the windowed
    counterpart of attention_rate_ratio's causal call). With Transformer Engine's window (w - 1, 0) query q sees
    keys q - w + 1 .. q, so a query tile of T rows spans j = ceil((w - 1)/T) + 1 key tiles (2 at w = 128), the
    tiles at both ends partly masked but computed whole; a forward CTA loops over j key tiles (a backward CTA
    over j query tiles) and pays the kernel's fixed work (ATTENTION_FIXED_KEYS) once, so a short window runs far
    below the asymptote: at w = T about a quarter of it on H100's FA3 constants. The asymptote does the
    s·(w - w²/2s) useful (query, key) pairs per head at one tile iteration per SM. w >= s gives the causal
    call's ratio. Source: Dao 2023, FlashAttention-2 §3.2 (one CTA per query block, blocks outside the mask
    skipped, boundary blocks masked); NVIDIA/TransformerEngine transformer_engine/pytorch/attention/
    dot_product_attention/utils.py at v2.9 (window_size: keys [i - window_size[0], i + window_size[1]]);
    NVIDIA-NeMo/Megatron-Bridge models/gpt_oss/gpt_oss_bridge.py at v0.4.0 (window_size (sliding_window - 1, 0)).
    Derived: docs/formulas.md#compute.window_attention"""
    sms, T = gpu.sm_count, ATTENTION_TILE
    w = float(m.sliding_window or 0)
    s = np.asarray(plan.seq_len, dtype=float)
    H = plan.micro_batch * m.num_attention_heads / plan.tp
    N = np.ceil(s / T)
    j = np.minimum(np.ceil((w - 1) / T) + 1, N)
    k_fwd, k_bwd = fixed_keys(plan, gpu)
    x = dropout_tile_factor(m, plan, gpu)  # attention dropout: each tile iteration x as long
    work = x * window_call_tiles(N, j) * H
    jb = backward_window_tiles(plan, N, j)  # FP8: the backward runs the causal call's tiles
    time = (attention_call_seconds(N * H, work, x * j, sms, k_fwd)
            + ATTENTION_BACKWARD_WEIGHT
            * attention_call_seconds(N * H, x * window_call_tiles(N, jb) * H, x * jb, sms, k_bwd))
    mean_keys = window_key_count(w, s) / 2  # keys a query sees, on average
    return (1 + ATTENTION_BACKWARD_WEIGHT) * H * (s / T) * (mean_keys / T) / sms / time


def layer_attention_rate_ratio(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, attention_flops: Any) -> Any:
    """The rate of one layer's attention FLOPs (layer_flops(...).attention) over the kernel's asymptote: the
    FLOP-weighted harmonic mean of the sliding-window layers' window_rate_ratio over their share of those
    FLOPs (window_keys) and attention_rate_ratio over the rest. With context parallelism every call is priced
    as attention_rate_ratio's ring (a window inside the ring's calls is not modelled). Derived:
    docs/formulas.md#compute.window_attention"""
    full = attention_rate_ratio(m, plan, gpu)
    keys = window_keys(m, plan.seq_len)
    if not np.any(keys):
        return full
    windowed = attention_score_flops(m, plan, keys)
    share = where(plan.cp > 1, 0.0, windowed / maximum(attention_flops, 1.0))
    return 1.0 / ((1.0 - share) / full + share / window_rate_ratio(m, plan, gpu))


def native_attention_asymptote(gpu: GpuSpec, plan: ParallelPlan) -> Any:
    """The native fused kernel's asymptote (attention_fraction's base): the rate published for the plan's
    attention release on this GPU (GpuSpec.attention_release_efficiency: cuDNN 9.1.0 0.95, 9.4.0 0.97, 9.19.1
    1.08 of the peak on the GH100 die, from NVIDIA's own SDPA training benchmark, run at the 700 W limit with the
    application clock at 1980 MHz) read at the clock it was measured at (published_rate_clock), else the GPU's
    fitted attention_efficiency. check_plan refuses a release the GPU lists no rate for. Source:
    NVIDIA/cudnn-frontend benchmark/README.md at b740542 (nvidia-smi -ac 3201,1980; -pl 700) and its results at
    b740542, de355c7 and df73764 (H200, bf16, causal, head dim 128). Derived:
    docs/formulas.md#compute.attention_release"""
    release = plan.attention_release
    if release is None or release not in gpu.attention_release_efficiency:
        return gpu.attention_efficiency
    return gpu.attention_release_efficiency[release] * published_rate_clock(gpu)


def fused_attention_asymptote(gpu: GpuSpec, plan: ParallelPlan) -> Any:
    """The plan's fused kernel's asymptote (llmplan's count, over the peak): FlashAttention-2's own published
    rate (GpuSpec.flash2_attention_efficiency) where the plan runs FA2 or the GPU's native kernel is FA2
    (Ampere), else the native kernel's (native_attention_asymptote: the release's published rate or the fitted
    attention_efficiency). A GPU with no published FA2 rate prices FA2 at flash2_attention_ratio x the native
    asymptote. Source: Dao 2023, FlashAttention-2, Figure 4d (A100); Dao-AILab/flash-attention
    assets/flash2_h100_fwd_bwd_benchmark.png (H100). Derived: docs/formulas.md#compute.flash2_rate"""
    flash2 = plan.attention_kernel == "flash2"
    native = native_attention_asymptote(gpu, plan)
    if gpu.flash2_attention_efficiency is None:
        return native * where(flash2, gpu.flash2_attention_ratio, 1.0)
    return where(flash2 | gpu.native_attention_flash2, flash2_asymptote(gpu), native)


def flash2_asymptote(gpu: GpuSpec) -> float:
    """FlashAttention-2's asymptote against the sustained peak: its published rate
    (GpuSpec.flash2_attention_efficiency) x published_rate_clock; flash2_attention_ratio x attention_efficiency
    where the GPU lists no published FA2 rate. Derived: docs/formulas.md#compute.flash2_rate"""
    if gpu.flash2_attention_efficiency is None:
        return gpu.flash2_attention_ratio * gpu.attention_efficiency
    return gpu.flash2_attention_efficiency * published_rate_clock(gpu)


def serving_attention_asymptote(gpu: GpuSpec) -> float:
    """The fused attention asymptote of a serving engine's prefill (cost.serve_step): the GPU's native kernel,
    FlashAttention-2 at its published rate where that is FA2 (Ampere: flash2_asymptote), else
    attention_efficiency, the one training prices the native kernel at (fused_attention_asymptote). A prefill in
    an engine that runs FA3 takes serving_prefill_asymptote instead. Derived: docs/formulas.md#compute.flash2_rate"""
    return flash2_asymptote(gpu) if gpu.native_attention_flash2 else gpu.attention_efficiency


def prefill_call_ratio(s: Any, prompts: Any, heads: float, sms: int) -> Any:
    """The rate of one FlashAttention-3 varlen forward call over its asymptote, on `prompts` causal prompts of
    `s` tokens each (no cached prefix) with `heads` query heads: one CTA per query tile of ATTENTION_TILE rows,
    head and prompt, looping over the key tiles at and below the diagonal (the diagonal tile whole), each paying
    the forward's fixed keys once (ATTENTION_FIXED_KEYS["native"]); the asymptote does the s^2/2 useful pairs
    per head and prompt at one tile iteration per SM. FA3's Hopper forward runs 128 x 128 tiles at head dims
    (192, 128) as at 128 (Dao-AILab/flash-attention @8a80215, hopper/tile_size.h, tile_size_fwd_sm90). Source:
    Dao 2023, FlashAttention-2 §3.2; Shah et al. 2024 (FlashAttention-3), Figure 5 (the curve it follows,
    tests/test_prefill_attention.py). Derived:
    docs/formulas.md#infer.prefill_attention"""
    n = np.ceil(np.asarray(s, dtype=float) / ATTENTION_TILE)
    calls = np.maximum(np.asarray(prompts, dtype=float), 1.0) * heads  # (prompt, head) pairs in the call
    useful = calls * (np.asarray(s, dtype=float) / ATTENTION_TILE) ** 2 / 2 / sms
    k_fwd = ATTENTION_FIXED_KEYS["native"][0]
    return useful / attention_call_seconds(calls * n, calls * n * (n + 1) / 2, n, sms, k_fwd)


def serving_prefill_asymptote(m: ModelSpec, gpu: GpuSpec, fa3: bool, heads: float, tokens: Any, pairs: Any) -> Any:
    """The fraction of the sustained bf16 peak a serving step's prefill attention runs at, on its causal pairs
    (cost.serve_step counts each prompt's s^2/2): where the engine runs an MLA prefill in FA3 (`fa3`:
    EngineRule.fa3_mla_prefill) and the GPU publishes FA3's forward rate (GpuSpec.fa3_forward_efficiency), that
    rate read at its own clock (published_rate_clock) times prefill_call_ratio on the step's prompts, their
    length the step's mean keys per query x 2 (exact for a batch of uncached prompts); else
    serving_attention_asymptote. The head-dimension and softmax factors stay the caller's.
    Derived: docs/formulas.md#infer.prefill_attention"""
    if not fa3 or m.mla is None or gpu.fa3_forward_efficiency is None:
        return serving_attention_asymptote(gpu)
    T = np.maximum(np.asarray(tokens, dtype=float), 1.0)
    s = np.maximum(2.0 * np.asarray(pairs, dtype=float) / T, 1.0)
    ratio = prefill_call_ratio(s, T / s, heads, gpu.sm_count)
    return gpu.fa3_forward_efficiency * published_rate_clock(gpu) * ratio


def published_rate_clock(gpu: GpuSpec) -> float:
    """What turns a kernel's published absolute rate (over the peak) into its asymptote against the sustained
    peak that every time formula divides by (GpuSpec.sustained_flops): the published benchmark loop runs the
    kernel alone at the vendor's power limit, at the clock that kernel holds there, as a training step's
    calls of it do; so the rate is the kernel's own, not the fitted sustained_clock_fraction (the clock of
    the GEMM-bound step) times it: 1 / sustained_clock_fraction, times the clock a power cap keeps
    (GpuSpec.capped_clock_ratio). The one reading of every published kernel rate: FlashAttention-2's
    (flash2_asymptote), the cuDNN releases' (native_attention_asymptote), the Mamba-2 SSD scan's
    (cost.compute.ssd_scan_seconds). Derived: docs/formulas.md#compute.published_clock"""
    return gpu.capped_clock_ratio / gpu.sustained_clock_fraction


def attention_fraction(gpu: GpuSpec, plan: ParallelPlan, m: ModelSpec) -> Any:
    """Achieved fraction of the sustained peak on the attention-score FLOPs: for a fused kernel the GPU's
    kernel's asymptotic rate (fused_attention_asymptote: FlashAttention-2's published rate when the plan
    runs FA2 or FA2 is the native kernel, else the native kernel's), times the GPU's softmax (exp-rate) ratio,
    times the kernel's rate at the model's head dimension (head_dim_attention_ratio); the calls' length and
    attention dropout's per-pair work enter apart (attention_rate_ratio, dropout_tile_factor). Unfused
    attention runs its score matmuls at unfused_attention_efficiency (its score traffic is priced in
    elementwise_bytes). Source: Shah et al. 2024 (FlashAttention-3), abstract; NVIDIA, "Making Softmax More
    Efficient with NVIDIA Blackwell Ultra". Derived: docs/formulas.md#compute.attention"""
    flash2 = plan.attention_kernel == "flash2"
    d0 = gpu.flash2_softmax_head_dim if flash2 else gpu.attention_softmax_head_dim
    fused = fused_attention_asymptote(gpu, plan) * gpu_head_dim_ratio(m, gpu, d0)
    unfused = gpu.unfused_attention_efficiency * unaligned_bmm_ratio(m, plan, gpu)
    return where(plan.flash_attention, fused, unfused) * gpu.softmax_attention_ratio


FLASH2_DROPOUT_RATIO = 0.728 / 0.695
"""FlashAttention-2's forward + backward time with attention dropout over its time without, bf16, head dim 128:
flash-attn 2.7.4 through Transformer Engine 2.17 (thd, 16 heads, 4 sequences, 4096 tokens) on GB200, 0.728 ms at
dropout 0.1 against 0.695 ms at 0.0, 1.047 (NVIDIA/TransformerEngine PR #3313, 2026-08-05; the same report
gives FA2 +0.024 ms for dropout on B300). FA2 runs the same Ampere-style kernel (mma.sync, the Philox mask made
in its softmax loop) on every GPU, so this one ratio prices it everywhere; the only FA2 dropout rate published.
Derived: docs/formulas.md#compute.attention_dropout"""


DROPOUT_BENCH_CALL = (4, 1024, 16)
"""(sequences, tokens per sequence, heads) of the published dropout measurements (FLASH2_DROPOUT_RATIO,
GpuSpec.attention_dropout_ratio): 4,096 tokens in 4 sequences, 16 heads of 128, Transformer Engine's
DotProductAttention at its default mask, causal (attn_mask_type "causal"; thd: padding_causal), sbhd's batch
of 4 x 1,024 (NVIDIA/TransformerEngine#3312; transformer_engine/pytorch/attention/dot_product_attention/
dot_product_attention.py, 2025: DotProductAttention's attn_mask_type defaults to "causal", qkv_format to "sbhd").
Derived: docs/formulas.md#compute.attention_dropout"""


def dropout_bench_loop_share(gpu: GpuSpec, fa2: Any) -> Any:
    """The share of the published dropout calls' time (DROPOUT_BENCH_CALL, forward + backward) spent in the
    kernel's loop over tiles, where the dropout's per-pair work runs: the causal call's N(N + 1)/2 tile
    iterations per head and sequence (the diagonal tiles whole) over its time with the per-CTA fixed work
    (ATTENTION_FIXED_KEYS: FA2's where `fa2`, else the native kernel's), as attention_rate_ratio prices a
    call. 0.62 for the native (FA3) constants, 0.73 for FA2's; the SM count cancels (many waves).
    Derived: docs/formulas.md#compute.attention_dropout"""
    b, s, a = DROPOUT_BENCH_CALL
    N = float(np.ceil(s / ATTENTION_TILE))
    H, tiles = b * a, N * (N + 1) / 2
    k_fwd = where(fa2, ATTENTION_FIXED_KEYS["flash2"][0], ATTENTION_FIXED_KEYS["native"][0])
    k_bwd = where(fa2, ATTENTION_FIXED_KEYS["flash2"][1], ATTENTION_FIXED_KEYS["native"][1])
    sms = gpu.sm_count
    time = (attention_call_seconds(N * H, tiles * H, N, sms, k_fwd)
            + ATTENTION_BACKWARD_WEIGHT * attention_call_seconds(N * H, tiles * H, N, sms, k_bwd))
    return (1 + ATTENTION_BACKWARD_WEIGHT) * tiles * H / sms / time


def dropout_tile_factor(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec) -> Any:
    """How much longer a fused attention kernel's tile iteration (forward and backward) takes with the model's
    attention dropout, at its head dimension d: 1 without dropout (attention_dropout 0) or without fused
    attention (the unfused path's dropout is HBM traffic: elementwise_bytes). The kernel makes the mask in its
    softmax loop, a Philox draw per (query, key) pair in forward and again in backward (nothing is stored), and
    a select on the probabilities: per-pair work that depends on neither p (p > 0) nor d, beside the softmax's
    (head_dim_attention_ratio's d0); the per-CTA fixed work (ATTENTION_FIXED_KEYS) does not grow. r, the
    published ratio of whole calls at d = 128 (the native kernel's GpuSpec.attention_dropout_ratio;
    FLASH2_DROPOUT_RATIO for FA2 and where none is published), is r - 1 = w·f with f the published calls' loop
    share (dropout_bench_loop_share), so an iteration takes 1 + w longer at d = 128 and, the work counted in
    head dimensions, 1 + w(128 + d0)/(d + d0) at d, d0 the kernel's softmax head dimension on this GPU
    (gpu_head_dim_ratio's). attention_rate_ratio and window_rate_ratio apply it.
    Source: NVIDIA/TransformerEngine#3312 and PR #3313 (cuDNN and FA2, dropout 0.1 vs 0.0); Dao et al. 2022,
    FlashAttention, Appendix B (Algorithms 2 and 4: the pseudo-random state saved in forward, the mask
    regenerated in backward). Derived: docs/formulas.md#compute.attention_dropout"""
    if m.attention_dropout == 0:
        return 1.0
    flash2 = plan.attention_kernel == "flash2"
    fa2_rate = flash2 | gpu.native_attention_flash2 | (gpu.attention_dropout_ratio is None)
    native = gpu.attention_dropout_ratio if gpu.attention_dropout_ratio is not None else FLASH2_DROPOUT_RATIO
    r = where(flash2 | gpu.native_attention_flash2, FLASH2_DROPOUT_RATIO, native)
    w = (r - 1.0) / dropout_bench_loop_share(gpu, fa2_rate)
    d0 = exp_bound_softmax_head_dim(where(flash2, gpu.flash2_softmax_head_dim, gpu.attention_softmax_head_dim), gpu)
    d = mean_head_dim(m)
    return where(plan.flash_attention, 1.0 + w * (128.0 + d0) / (d + d0), 1.0)


CUBLAS_TENSOR_CORE_ALIGN_BYTES = 16
"""cuBLAS's alignment for its tensor-core kernels at full speed: the leading dimensions, the contiguous
extents and the pointers of a GEMM a multiple of 16 bytes (NVIDIA cuBLAS documentation, 2.1.11 "Tensor Core
Usage": "the best performance when using Tensor Cores"; since cuBLAS 11.0 other shapes may still use them, at
a rate it does not give). Derived: docs/formulas.md#compute.unaligned_bmm"""


def unaligned_bmm_ratio(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec) -> float:
    """The unfused attention's score matmuls' rate relative to their tensor-core rate: 1 when the head
    dimension meets cuBLAS's 16-byte alignment, else the GPU's CUDA-core (fp32) peak over its tensor-core peak
    of the compute dtype. Megatron's unfused path (2020-22) runs QK^T, AV and their gradients as batched
    matmuls over heads whose inner or outer extent is the head dimension d, each batch starting d x 3
    elements further into the fused QKV projection (an odd multiple of d), so d x element bytes off a
    multiple of 16 breaks the contiguous extent and every other batch's pointer: BLOOM's 128-head
    h = 13,824 (d = 108) trials. Priced at the rate of a kernel without tensor cores (cuBLAS does not
    document the rate of its unaligned tensor-core paths). NVIDIA GPUs only (cuBLAS); 1 where the profile
    lists no fp32 peak.
    Source: NVIDIA cuBLAS documentation, 2.1.11 "Tensor Core Usage"; NVIDIA/Megatron-LM
    megatron/model/transformer.py ParallelAttention (torch.baddbmm / torch.bmm over [b * np, s, hn]).
    Derived: docs/formulas.md#compute.unaligned_bmm"""
    dtype = bf16_kernel_format(plan)  # low-precision recipes run the unfused scores in bf16
    size = 4 if dtype == "fp32" else 2
    aligned = all(d * size % CUBLAS_TENSOR_CORE_ALIGN_BYTES == 0 for d in attention_head_dims(m))
    if aligned or gpu.vendor != "nvidia" or "fp32" not in gpu.tflops or dtype not in gpu.tflops:
        return 1.0
    return min(1.0, gpu.peak_flops("fp32") / gpu.peak_flops(dtype))


def fp8_attention_ratio(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec) -> Any:
    """Speed of FP8 fused attention (ParallelPlan.fp8_attention) over bf16 at the model's mean head dimension d.
    Where the GPU's profile publishes cuDNN's FP8 kernel for the plan's format (GpuSpec.fp8_attention_points:
    MXFP8 block scales under the mxfp8 recipe, per-tensor scales otherwise, as Transformer Engine 2.16 picks
    them), its forward and backward speed ratios read at d (linear between published head dimensions, held
    beyond them) and weighted as llmplan prices the passes, 1 forward to ATTENTION_BACKWARD_WEIGHT backward:
    (1 + k) / (1/r_fwd + k/r_bwd). Elsewhere the d0 rule: the 4d matmul FLOPs per (query, key) pair at twice
    the tensor rate and the softmax work (d0, attention_softmax_head_dim) as before, (d + d0) / (d / 2 + d0).
    1 without FP8 attention. Source: NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/results at
    3929da2 (cuDNN 9.22 / 9.19.1); TransformerEngine v2.16 dot_product_attention.py (recipe table).
    Derived: docs/formulas.md#compute.fp8_attention"""
    d, d0 = mean_head_dim(m), gpu.attention_softmax_head_dim
    fmt: Fp8AttentionFormat = "mxfp8" if plan.gemm_format == "mxfp8" else "fp8"
    points = sorted(gpu.fp8_attention_points.get(fmt, ()))
    if not points:
        return where(plan.fp8_attention, (d + d0) / (d / 2 + d0), 1.0)
    dims, fwd, bwd = (np.array(col) for col in zip(*points, strict=True))
    r_fwd, r_bwd = float(np.interp(d, dims, fwd)), float(np.interp(d, dims, bwd))
    k = ATTENTION_BACKWARD_WEIGHT
    return where(plan.fp8_attention, (1 + k) / (1 / r_fwd + k / r_bwd), 1.0)


def exp_bound_softmax_head_dim(d0: float, gpu: GpuSpec) -> float:
    """The head dimension at which a fused kernel's per-pair softmax work takes as long as its 4d matmul FLOPs
    on a GPU whose exponentials run slower against its tensor cores than where d0 was measured (H100): the
    softmax's share of a pair's time at d = 128 grows from d0/(128 + d0) until the whole pair takes 1/r as long
    (r = GpuSpec.softmax_attention_ratio), so d0' = (128 + d0)/r - 128 (103 on B200 / GB200 from d0 = 43 and
    r = 1/1.35; d0 where r = 1). At d = 128 the rate is r times H100's, as before; at d = 64 it falls further
    (0.69 of d = 128 on B200 instead of 0.80), at d > 128 less. Check: B200's dense bf16 peak per SM is about 2x
    H100's (2.25 PFLOP/s on 148 SMs against 0.99 on 132, at similar clocks) at the same 16 exp2 per SM and
    clock (CUDA C++ Programming Guide, arithmetic instruction throughput, compute capabilities 9.0 and 10.0),
    so the exponentials alone take d0 to about 2 x 43 = 86. Derived: docs/formulas.md#compute.attention"""
    r = gpu.softmax_attention_ratio
    return (128.0 + d0) / r - 128.0


def head_dim_attention_ratio(m: ModelSpec, d0: float) -> float:
    """A fused attention kernel's rate at the model's head dimension d relative to d = 128 (where
    attention_efficiency is measured). Per (query, key) pair the kernel does 4d matmul FLOPs and a fixed amount
    of softmax work (the exponential on the special-function units, the scale, max and sum), so its rate
    goes as d / (d + d0), d0 the head dimension at which the two take as long. MLA's d is the mean of its
    query-key and value dims. Source: Shah et al. 2024 (FlashAttention-3), Figures 5-6 (H100, 4k tokens:
    head dim 64 runs forward + backward at 0.79x (cuDNN), 0.81x (FA3), 0.89x (FA2) of head dim 128).
    Derived: docs/formulas.md#compute.attention"""
    d = mean_head_dim(m)
    return (d / (d + d0)) / (128 / (128 + d0))


def gpu_head_dim_ratio(m: ModelSpec, gpu: GpuSpec, d0: float) -> float:
    """head_dim_attention_ratio on this GPU: d0, the kernel's softmax head dimension measured on H100
    (GpuSpec.attention_softmax_head_dim, or flash2_softmax_head_dim), moved to the GPU's exponential rate
    (exp_bound_softmax_head_dim). The one head-dimension factor of training (attention_fraction) and serving
    (cost.serve_step). Derived: docs/formulas.md#compute.attention"""
    return head_dim_attention_ratio(m, exp_bound_softmax_head_dim(d0, gpu))


def mean_head_dim(m: ModelSpec) -> float:
    """The head dimension d the fused kernel's rate is priced at: the mean of the query-key and value head
    dimensions (attention_head_dims; they differ under MLA). Derived: docs/formulas.md#compute.attention"""
    qk, v = attention_head_dims(m)
    return (qk + v) / 2
