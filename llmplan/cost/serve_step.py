"""Serving engine step: one step's time on one GPU of a pipeline stage (matmuls at their small-M GEMM
efficiency, attention, memory-bound operators, TP all-reduces, the expert exchange) and the engine's host time
per step.

Symbols: t TP, p PP, L layers, T tokens of the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from llmplan.cost.attention_rate import (
    gpu_head_dim_ratio,
    serving_attention_asymptote,
    serving_prefill_asymptote,
)
from llmplan.cost.compute import (
    KERNEL_LAUNCH_S,
    TILE,
    attention_head_dims,
    attention_shapes,
    moe_routing_bytes,
)
from llmplan.cost.mixers import attention_share, dense_mlp_share, recurrent_gemm_shapes
from llmplan.cost.params import expert_params, padded_vocab, vocab_shard_params
from llmplan.cost.serve_memory import (
    ENGINES,
    serve_weight_bytes,
    weight_bytes_per_param,
)
from llmplan.cost.serve_moe import (
    COMBINE_BYTES,
    comm_sm_slowdown,
    deepep_exchange_seconds,
    dispatch_bytes_per_element,
    expert_token_factor,
    overlapped_step,
    redundant_expert_params,
    serve_ep_imbalance,
    tbo_prefill_seconds,
)
from llmplan.specs.hardware import SystemSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.serve import Engine, ServeJob, ServePlan
from llmplan.topology.collectives import collective_coeffs, collective_time
from llmplan.topology.placement import GroupSpan


def eager_launch_seconds(m: ModelSpec, plan: ServePlan) -> float:
    """Host time of one step's kernel launches when it runs without a CUDA graph: one launch per kernel, the
    layer's GEMMs, attention, about six memory-bound kernels (norms, adds, rotary, activation) and the two TP
    all-reduces, for the stage's layers. Derived: docs/formulas.md#infer.step"""
    per_layer = len(layer_linear_shapes(m, plan, m.is_moe)) + 1 + 6 + (2 if plan.tp > 1 else 0)
    return per_layer * m.num_hidden_layers / plan.pp * KERNEL_LAUNCH_S


def step_host_seconds(m: ModelSpec, plan: ServePlan, job: ServeJob) -> float:
    """Host time per engine step: the engine's own (ENGINES) and, without CUDA graphs, its kernel launches
    (eager_launch_seconds). Derived: docs/formulas.md#infer.step"""
    rule = ENGINES[job.engine]
    return rule.step_overhead_s + (0.0 if job.cuda_graphs else eager_launch_seconds(m, plan))


@dataclass(frozen=True)
class GraphHost:
    """What an engine's default CUDA graph capture list reads beyond the job: the GPU's memory (SGLang's
    max_bs), its compute capability (vLLM's platform ceiling, vllm_platform_max_capture) and the model's
    architecture (vLLM's per-model override, VLLM_MODEL_MAX_CAPTURE)."""

    hbm_bytes: float | None = None
    compute_capability: float | None = None
    model_type: str | None = None

    @classmethod
    def of(cls, system: SystemSpec, m: ModelSpec | None = None) -> GraphHost:
        """The host of `system`'s GPU serving `m` (None: a model the default does not depend on)."""
        return cls(system.gpu.hbm_bytes, system.gpu.compute_capability, m.model_type if m is not None else None)


def decode_query_len(job: ServeJob) -> int:
    """Tokens a decode request carries per step in vLLM's capture list: 1 + num_speculative_tokens under
    speculative decoding, else 1 (TensorRT-LLM's and SGLang's lists count requests: 1).
    Source: vllm-project/vllm vllm/config/vllm.py @000fc94b754f66aeb60ef5acf1ea2e94cdc65164,
    VllmConfig.uniform_decode_query_len."""
    if job.engine != "vllm" or job.speculative is None:
        return 1
    return 1 + job.speculative.num_speculative_tokens


def vllm_spec_decode_sizes(sizes: tuple[int, ...], query_len: int) -> tuple[int, ...]:
    """vLLM's captured token sizes once its model runner fits them to speculative decoding (query_len = 1 + k
    > 1, FULL decode graphs: the default cudagraph_mode FULL_AND_PIECEWISE): each size rounded up to a
    multiple of query_len, those then above the largest size dropped, [query_len] when none is left (empty
    where query_len itself is above it: vLLM refuses to start). A uniform decode batch is a whole number of
    requests, so only such sizes replay it. Source: vllm-project/vllm vllm/config/compilation.py
    @ee525ce4fc8c9cfdedbbad878dcb2bccbb3c4b95, CompilationConfig.adjust_cudagraph_sizes_for_spec_decode
    (called by GPUModelRunner under FULL decode graphs, issue 28207); vllm/config/vllm.py @000fc94b
    (_set_cudagraph_sizes: "Dispatch requires an exact multiple of decode_query_len")."""
    if query_len <= 1 or not sizes:
        return sizes
    top = max(sizes)
    rounded = {-(-size // query_len) * query_len for size in sizes}
    kept = tuple(sorted(r for r in rounded if r <= top))
    return kept or ((query_len,) if query_len <= top else ())


def captured_graph_sizes(job: ServeJob, plan: ServePlan | None = None) -> tuple[int, ...] | None:
    """The decode sizes the job's server of `plan` captures of the job's list (decode_graph_sizes; None without
    CUDA graphs): the list itself, but SGLang's runner applies its rule (sglang_runner_sizes) to a user's
    --cuda-graph-sizes as to its default: sizes off the ranks' alignment dropped, the request pool of an
    attention rank (the batch: llmplan's export writes --max-running-requests batch x the attention ranks)
    rounded up to it and added when the list reaches above it, larger sizes dropped; None where none is left
    (SGLang refuses to start; check_serve_plan refuses the plan). vLLM drops a user's sizes above
    max_num_batched_tokens (None where none is left: no graph). The export keeps the user's list as given.
    SGLang without `plan`: the list. Source: sgl-project/sglang v0.5.23 (PyPI wheel), python/sglang/srt/
    model_executor/runner/base_cuda_graph_runner.py, get_batch_sizes_to_capture (cuda_graph_config.decode.bs,
    the user's list where given: arg_groups/cuda_graph_hook.py parse_cuda_graph_config); vllm-project/vllm
    v0.33.0 (PyPI sdist), vllm/config/vllm.py, VllmConfig._set_cudagraph_sizes (a user's
    cudagraph_capture_sizes kept `if i <= max_num_tokens`). Derived: docs/formulas.md#infer.graph_padding"""
    sizes = job.decode_graph_sizes
    if sizes and job.engine == "vllm" and not job.cuda_graph_sizes_default:
        return tuple(b for b in sizes if b <= job.max_num_batched_tokens) or None
    if not sizes or plan is None or job.engine != "sglang" or job.cuda_graph_sizes_default:
        return sizes
    ranks = SglangRanks.of(plan)
    width = sglang_request_width(ranks, draft_tokens_of(job))
    return sglang_runner_sizes(sizes, job.batch, ranks.align, width) or None


def effective_graph_sizes(job: ServeJob, sizes: tuple[int, ...] | None = None,
                          plan: ServePlan | None = None) -> tuple[int, ...] | None:
    """The sizes a decode (under speculation, verification) step of the job pads against: `sizes`, else the
    job's list as its server of `plan` captures it (captured_graph_sizes), fitted to vLLM's speculative
    decoding (vllm_spec_decode_sizes); None without CUDA graphs. Derived: docs/formulas.md#infer.graph_padding"""
    sizes = captured_graph_sizes(job, plan) if sizes is None else sizes
    if not sizes or job.engine != "vllm":
        return sizes
    return vllm_spec_decode_sizes(sizes, decode_query_len(job)) or None


def sglang_default_list_empty(job: ServeJob) -> bool:
    """Whether an SGLang job as its server of the plan runs it (serving.job_for_plan: the default list derived
    for the plan, default_graph_sizes) has CUDA graphs on and the engine's default decode list, of which the
    runner keeps no size (sglang_graph_sizes empty: e.g. a GPU under 20 GiB, max_bs 8, at alignment 16).
    SGLang 0.5.23 then refuses to start (get_batch_sizes_to_capture asserts a non-empty list), so llmplan's
    export turns decode graphs off (--disable-decode-cuda-graph, export.serve.render_sglang) and the decode is
    priced eager, as that server runs it. A user's list that keeps none is refused instead
    (check.sglang_graph_violations). Source: sgl-project/sglang v0.5.23 (PyPI wheel), python/sglang/srt/
    model_executor/runner/base_cuda_graph_runner.py, get_batch_sizes_to_capture (assert len(capture_bs) > 0).
    Derived: docs/formulas.md#infer.graph_padding"""
    return (job.engine == "sglang" and job.cuda_graphs and job.cuda_graph_sizes_default
            and not job.cuda_graph_batch_sizes)


def graph_ceiling(job: ServeJob, plan: ServePlan, host: GraphHost | None = None) -> int | None:
    """The most sequences a decode step may hold and still replay a CUDA graph on the server the job
    describes: the largest captured size (the user's, or for the engine's default list,
    ServeJob.cuda_graph_sizes_default, the default's own ceiling, which a server configured for the batch
    reaches: vLLM min(its platform or model ceiling, max_num_batched_tokens), SGLang's max_bs at its
    server's --tp-size as its runner keeps it (SglangRanks; a user's list too, captured_graph_sizes) unless
    its server for the job's batch leaves that batch eager (sglang_batch_left_eager: then that list's top),
    TensorRT-LLM its list up to max_num_tokens), over decode_query_len (vLLM counts tokens: a speculative
    verification of b requests is b x (1 + k) of them, against the sizes fitted to it, effective_graph_sizes);
    None without graphs; 0 for SGLang's empty default list (sglang_default_list_empty: every step eager).
    Derived: docs/formulas.md#infer.graph_padding"""
    if sglang_default_list_empty(job):
        return 0  # decode graphs off in the export: every decode step runs eager (uncaptured_launch_seconds)
    sizes = captured_graph_sizes(job, plan)
    if sizes and job.cuda_graph_sizes_default and not sglang_batch_left_eager(job, plan, sizes):
        sizes = default_graph_sizes(job.engine, 1 << 24, job.max_num_batched_tokens, plan.tp, host,
                                    draft_tokens_of(job), SglangRanks.of(plan) if job.engine == "sglang" else None)
    sizes = effective_graph_sizes(job, sizes) if sizes else None
    return max(sizes) // decode_query_len(job) if sizes else None


def sglang_batch_left_eager(job: ServeJob, plan: ServePlan, sizes: tuple[int, ...]) -> bool:
    """Whether an SGLang server configured for the job's batch (its default list, `sizes` as derived for it,
    serving.job_for_plan) leaves the batch's decode step (decode_group) above every size it captured. That
    happens only where its default max_bs is cut to --max-running-requests (sglang_decode_max_bs) and the batch
    is off the runner's alignment: the list ends at the batch, which the runner drops, and the pool, rounded up
    to the alignment, is not added since the list does not reach above it. The step runs eager there, and
    graph_ceiling takes the captured list's top, not the default's own. Source: sgl-project/sglang v0.5.23 (PyPI
    wheel), python/sglang/srt/model_executor/runner/base_cuda_graph_runner.py, get_batch_sizes_to_capture
    (`if max(capture_bs) > num_max_requests: capture_bs += [num_max_requests]`).
    Derived: docs/formulas.md#infer.graph_padding"""
    return job.engine == "sglang" and float(decode_group(job.batch, plan.pp)) > max(sizes)


def draft_tokens_of(job: ServeJob) -> int | None:
    """The job's draft tokens per request and step (num_speculative_tokens), None without speculation."""
    return job.speculative.num_speculative_tokens if job.speculative is not None else None


def decode_graphs(job: ServeJob, plan: ServePlan, system: SystemSpec, m: ModelSpec) -> dict[str, Any]:
    """decode_tpot's CUDA-graph arguments for the job's server of `plan` serving `m` on `system`'s GPU: the
    sizes a step pads to (effective_graph_sizes) and the largest batch a graph covers (graph_ceiling)."""
    return {"graph_sizes": effective_graph_sizes(job, plan=plan),
            "graph_top": graph_ceiling(job, plan, GraphHost.of(system, m))}


def decode_group(batch: Any, pp: int) -> Any:
    """Sequences of one pipeline group's decode step: with pp stages the batch splits into pp groups that take
    turns (infer.decode), batch / pp, at least 1. Derived: docs/formulas.md#infer.decode"""
    return np.maximum(np.asarray(batch, dtype=float) / pp, 1.0)


@dataclass(frozen=True)
class DecodeGraphStep:
    """What one decode step (under speculative decoding, the verification step) of a pipeline group runs
    against the server's captured CUDA graph sizes, as decode_tpot prices it."""

    requests: float
    """Sequences of the step before padding (decode_group: batch / pp)."""
    queries: int
    """Tokens each sequence carries: 1, or 1 + k under speculative decoding."""
    tokens: float
    """Tokens the step runs once padded (graph_padded_tokens; unpadded above the largest size)."""
    eager: bool
    """Whether the step runs without a graph (requests above graph_ceiling: uncaptured_launch_seconds)."""


def decode_graph_step(job: ServeJob, plan: ServePlan, system: SystemSpec, m: ModelSpec) -> DecodeGraphStep | None:
    """The job's decode (verification) step of one pipeline group against its captured sizes, by the rules
    decode_tpot applies (decode_group, decode_graphs, graph_padded_tokens, graph_ceiling); None without CUDA
    graphs. Derived: docs/formulas.md#infer.graph_padding"""
    graphs = decode_graphs(job, plan, system, m)
    sizes, top = graphs["graph_sizes"], graphs["graph_top"]
    if not sizes:
        return None
    b, q = float(decode_group(job.batch, plan.pp)), 1 + (draft_tokens_of(job) or 0)
    tokens = float(graph_padded_tokens(b, q, sizes, graph_sizes_count_tokens(job.engine)))
    return DecodeGraphStep(b, q, tokens, top is not None and b > top)


def uncaptured_launch_seconds(m: ModelSpec, plan: ServePlan, batch: Any, ceiling: int | None) -> Any:
    """The launches of a decode step whose batch is above the largest captured CUDA graph size (`ceiling`,
    graph_ceiling): the engine runs it without a graph (eager_launch_seconds); 0 at or below it or without one.
    Source: NVIDIA/TensorRT-LLM tensorrt_llm/_torch/pyexecutor/model_engine.py (_get_padded_batch: no graph
    above the largest size); vllm-project/vllm cudagraph dispatch (none above max_cudagraph_capture_size);
    sgl-project/sglang cuda_graph_runner can_run (batch <= max_bs). Derived: docs/formulas.md#infer.graph_padding"""
    if ceiling is None:
        return 0.0
    over = np.asarray(batch, dtype=float) > ceiling
    out = np.where(over, eager_launch_seconds(m, plan), 0.0)
    return out if np.ndim(batch) else float(out)



@dataclass(frozen=True)
class Spans:
    """Where a replica's TP, PP and EP groups sit."""

    tp: GroupSpan
    pp: GroupSpan
    ep: GroupSpan


def _expert_fraction_touched(m: ModelSpec, tokens: Any) -> Any:
    """Expected fraction of a layer's experts a step's tokens visit (independent top-k routing):
    1 - (1 - k/E)^tokens. Derived: docs/formulas.md#infer.decode"""
    if not m.is_moe:
        return 1.0
    return 1.0 - (1.0 - m.num_experts_per_tok / m.num_experts) ** np.asarray(tokens, dtype=float)


def graph_padded_rows(batch: Any, sizes: tuple[int, ...] | None) -> Any:
    """Rows a decode step of `batch` sequences runs when the engine pads it to a captured CUDA graph: the
    smallest captured size >= batch (dummy generation requests fill the rest), or batch itself above every
    size (no graph: it runs eagerly) or without sizes. Source: NVIDIA/TensorRT-LLM
    tensorrt_llm/_torch/pyexecutor/model_engine.py, _round_up_batch_size / _get_padded_batch."""
    if not sizes:
        return batch
    b = np.asarray(batch, dtype=float)
    s = np.sort(np.asarray(sizes, dtype=float))
    i = np.searchsorted(s, b, side="left")
    out = np.where(i < s.size, s[np.minimum(i, s.size - 1)], b)
    return out if np.ndim(batch) else float(out)


def graph_sizes_count_tokens(engine: Engine) -> bool:
    """Whether the engine's captured CUDA graph sizes count tokens (vLLM's cudagraph_capture_sizes, which a
    step's scheduled token count pads against) rather than requests (TensorRT-LLM's cuda_graph_config
    batch_sizes, SGLang's cuda_graph_bs). Source: vllm-project/vllm vllm/v1/cudagraph_dispatcher.py
    @ae2e8e62cea0f6c030f92234cb863acdc48658cb, CudagraphDispatcher.dispatch(num_tokens, ...)."""
    return engine == "vllm"


def graph_padded_tokens(batch: Any, queries: float, sizes: tuple[int, ...] | None, count_tokens: bool) -> Any:
    """Tokens a decode step of `batch` sequences of `queries` tokens each (speculative verification: 1 + k)
    runs once padded to a captured CUDA graph. Sizes in tokens (`count_tokens`, vLLM): the smallest size >=
    batch x queries (the dispatcher's _bs_to_padded_graph_size table), batch x queries itself above the
    largest (no graph: NONE); sizes in requests (TensorRT-LLM, SGLang): the padded request count
    (graph_padded_rows) times queries, each dummy request carrying as many tokens. Without sizes, unpadded.
    Source: vllm-project/vllm vllm/v1/cudagraph_dispatcher.py @ae2e8e62cea0f6c030f92234cb863acdc48658cb
    (_compute_bs_to_padded_graph_size, _create_padded_batch_descriptor, dispatch); NVIDIA/TensorRT-LLM
    tensorrt_llm/_torch/pyexecutor/model_engine.py (_get_padded_batch). Derived: docs/formulas.md#infer.graph_padding"""
    b = np.asarray(batch, dtype=float)
    out = graph_padded_rows(b * queries, sizes) if count_tokens else graph_padded_rows(b, sizes) * queries
    return out if np.ndim(batch) else float(out)


TRTLLM_GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 2048, 4096, 8192)
"""cuda_graph_config batch_sizes of TensorRT-LLM's perf-overview llm_options.yml, with enable_padding: true (the
dense and the MoE file alike; NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md at 00f37686)."""


def trtllm_graph_sizes(listed: tuple[int, ...], max_bs: int, max_tokens: int) -> tuple[int, ...]:
    """The CUDA graph batch sizes the engine keeps, with padding on: the listed sizes up to min(max_bs,
    max_tokens), then that bound itself when a listed size exceeds it. Source: NVIDIA/TensorRT-LLM
    tensorrt_llm/_torch/pyexecutor/model_engine.py, _filter_cuda_graph_batch_sizes (v1.0-era, no draft tokens)."""
    bound = min(max_bs, max_tokens)
    kept = tuple(b for b in sorted(listed) if b <= bound)
    return kept + ((bound,) if max(listed) > bound and (not kept or kept[-1] != bound) else ())


VLLM_DEFAULT_MAX_CAPTURE = 512
"""vLLM's default ceiling on max_cudagraph_capture_size (default_max_graph_size) off data-center Blackwell.
Source: vllm-project/vllm vllm/config/vllm.py @000fc94b754f66aeb60ef5acf1ea2e94cdc65164,
VllmConfig._set_cudagraph_sizes."""
VLLM_BLACKWELL_MAX_CAPTURE = 1024
"""The same ceiling on a GPU of compute capability 10.x (current_platform.is_device_capability_family(100):
B200, GB200, B300, GB300). Source: as VLLM_DEFAULT_MAX_CAPTURE."""
VLLM_MODEL_MAX_CAPTURE: dict[str, int] = {"gpt_oss": 1024}
"""Models whose vLLM config hook sets max_cudagraph_capture_size itself when the user set neither it nor
cudagraph_capture_sizes (before _set_cudagraph_sizes runs: VllmConfig.__post_init__ calls
try_verify_and_update_config first), by llmplan model_type: GPT-OSS 1024. No other entry of
MODELS_CONFIG_MAP touches the capture sizes. Source: vllm-project/vllm vllm/model_executor/models/config.py
@1936cf3841edb9781b06c50fc4daf4bac9d3b23e, GptOssForCausalLMConfig.verify_and_update_config."""


def vllm_platform_max_capture(compute_capability: float | None) -> int:
    """vLLM's default_max_graph_size on a GPU of `compute_capability` (major.minor; None: unknown or not
    CUDA): 1024 on the 10.x family, else 512. Source: vllm-project/vllm vllm/config/vllm.py @000fc94b,
    VllmConfig._set_cudagraph_sizes; vllm/platforms/interface.py is_device_capability_family (major.minor as
    an integer, floor-divided by 10)."""
    if compute_capability is not None and int(compute_capability) == 10:
        return VLLM_BLACKWELL_MAX_CAPTURE
    return VLLM_DEFAULT_MAX_CAPTURE


def _vllm_grid(cap: int) -> set[int]:
    """[1, 2, 4] up to `cap`, every 8 from 8 below min(cap + 1, 256), every 16 from 256 to cap."""
    return {b for b in (1, 2, 4) if b <= cap} | set(range(8, min(cap + 1, 256), 8)) | set(range(256, cap + 1, 16))


def vllm_graph_sizes(max_num_seqs: int, max_num_batched_tokens: int, platform_max: int = VLLM_DEFAULT_MAX_CAPTURE,
                     query_len: int = 1, model_max: int | None = None) -> tuple[int, ...]:
    """vLLM's default cudagraph_capture_sizes in tokens (balanced mode): the ceiling C = min(2 x max_num_seqs x
    query_len, platform_max) (a model's own max_cudagraph_capture_size `model_max` instead where it sets one),
    then C = min(C, max_num_batched_tokens); [1, 2, 4] up to C, every 8 from 8 to min(C, 248), every 16 from
    256 to C, max_num_batched_tokens when it is <= C, and with query_len = 1 + k > 1 (speculative decoding,
    no model_max) the uniform decode sizes n x query_len <= C for the request counts n (the same grid up to
    min(max_num_seqs, platform_max), and that bound itself); with query_len = 1 (no speculation, no model_max)
    max_num_seqs itself when it is <= C before the token cut (i.e. <= platform_max), so the planned batch is
    captured exactly. A batch at or below the largest size replays the smallest size >= it
    (graph_padded_rows); one above runs eagerly (graph_ceiling).
    Source: vllm-project/vllm v0.33.0 (PyPI sdist vllm-0.33.0.tar.gz), vllm/config/vllm.py,
    VllmConfig._set_cudagraph_sizes (request_counts, uniform_decode_sizes; `elif max_num_seqs <=
    max_cudagraph_capture_size: uniform_decode_sizes = [max_num_seqs]`); the speculative rule also
    @000fc94b754f66aeb60ef5acf1ea2e94cdc65164."""
    uniform: set[int] = set()
    if model_max is not None:
        cap = model_max
    else:
        cap = min(max_num_seqs * query_len * 2, platform_max)
        if query_len > 1:
            top = min(max_num_seqs, platform_max)
            uniform = {n * query_len for n in _vllm_grid(top) | {top} if n * query_len <= cap}
        elif max_num_seqs <= cap:
            uniform = {max_num_seqs}
    cap = min(max_num_batched_tokens, cap)
    sizes = _vllm_grid(cap) | {u for u in uniform if u <= max_num_batched_tokens}
    if max_num_batched_tokens <= cap:
        sizes.add(max_num_batched_tokens)
    return tuple(sorted(sizes))


SGLANG_GRAPH_MAX_BS = ((20, 8, 8), (35, 48, 160), (60, 32, 160), (160, 256, 512))
"""SGLang's default decode cuda_graph max_bs by GPU memory: (below this many GiB of device memory, max_bs at
tp_size < 4, at tp_size >= 4); 512 at 160 GiB and above, 160 when the memory is unknown. Source:
sgl-project/sglang python/sglang/srt/arg_groups/memory_hook.py @a82da8da159ec67038d9357c172fba89ad8af6a3,
handle_gpu_memory_settings (gpu_mem in MiB: 20 x 1024, 35 x 1024, ...; its 60-90 and 90-160 GiB rows agree)."""
SGLANG_LARGE_TP = 4
"""tp_size from which SGLang's default takes the larger max_bs (SGLANG_GRAPH_MAX_BS)."""


def sglang_graph_max_bs(hbm_bytes: float | None, tp: int) -> int:
    """SGLang's default decode CUDA graph max_bs for a GPU of `hbm_bytes` at tensor parallelism `tp`
    (SGLANG_GRAPH_MAX_BS; None: its fallback 160). llmplan's hbm_gib is deviceQuery's total, SGLang's gpu_mem
    nvidia-smi's (slightly more): no listed GPU sits within that gap of a threshold.
    Source: sgl-project/sglang python/sglang/srt/arg_groups/memory_hook.py @a82da8da, handle_gpu_memory_settings."""
    if hbm_bytes is None:
        return 160
    gib = hbm_bytes / 2**30
    for below, small_tp, large_tp in SGLANG_GRAPH_MAX_BS:
        if gib < below:
            return small_tp if tp < SGLANG_LARGE_TP else large_tp
    return 512


def sglang_decode_max_bs(hbm_bytes: float | None, tp_size: int, max_running_requests: int | None = None) -> int:
    """The decode max_bs SGLang resolves when the user gives no list: its default for the GPU's memory and
    --tp-size (sglang_graph_max_bs), cut to --max-running-requests where that is lower (the export writes the
    batch x the attention ranks). The one rule for the default list (default_graph_sizes), its ceiling
    (graph_ceiling) and the CUDA-graph memory reserve (cost.serve_memory.sglang_server_of). Source:
    sgl-project/sglang v0.5.23 (PyPI wheel), python/sglang/srt/arg_groups/memory_hook.py,
    handle_gpu_memory_settings (`decode_max_bs_is_default and cfg.max_running_requests is not None and
    max_bs > cfg.max_running_requests`: max_bs = max_running_requests, before generate_decode_cuda_graph_
    batch_sizes lists the sizes up to it)."""
    max_bs = sglang_graph_max_bs(hbm_bytes, tp_size)
    return max_bs if max_running_requests is None else min(max_bs, max_running_requests)


SGLANG_SPEC_GRAPH_BS = (*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8))
"""SGLang's decode capture sizes under speculative decoding up to 256 (every 16 from 272 to max_bs above it):
less padding at small batches. Source: sgl-project/sglang v0.5.23 (PyPI wheel), python/sglang/srt/arg_groups/
cuda_graph_hook.py, generate_decode_cuda_graph_batch_sizes (its speculative branch)."""


@dataclass(frozen=True)
class SglangRanks:
    """What SGLang's decode capture list reads of the server llmplan's export launches for a plan
    (export.serve.render_sglang): --tp-size, every GPU of the instance (tp x dp under DP attention); the
    attention DP ranks, each with its own request pool (--max-running-requests over --attn-dp-size); the
    alignment its runner keeps captured sizes to (get_cuda_graph_batch_size_alignment: 2 with two-batch
    overlap, times the attention TP size where the decode input is gathered: DP attention or a DeepEP
    all-to-all, utils/common.py require_gathered_buffer); whether two-batch overlap splits each request's rows
    (the alignment then counts requests, not tokens). Source: sgl-project/sglang v0.5.23 (PyPI wheel),
    python/sglang/srt/utils/common.py (require_mlp_tp_gather, require_attn_tp_gather,
    get_cuda_graph_batch_size_alignment: with --moe-dense-tp-size 1 and --enable-dp-lm-head, as exported,
    a gathered input whenever the attention TP size is above 1)."""

    tp_size: int = 1
    attn_dp: int = 1
    align: int = 1
    two_batch: bool = False

    @classmethod
    def of(cls, plan: ServePlan) -> SglangRanks:
        """The ranks of `plan`'s exported SGLang server."""
        dp = plan.attn_dp
        gathered = plan.dp_attention or plan.moe_dispatcher == "deepep"
        return cls(plan.tp * dp, dp, (2 if plan.two_batch_overlap else 1) * (plan.tp if gathered else 1),
                   plan.two_batch_overlap)


def sglang_listed_sizes(max_bs: int, speculative: bool = False) -> tuple[int, ...]:
    """SGLang's default decode capture list up to max_bs (padding on): without speculative decoding 1, 2, 4,
    8, 12, every 8 from 16 to 256, every 16 from 272 to 496, every 32 from 512; with it SGLANG_SPEC_GRAPH_BS
    then every 16 from 272; those <= max_bs, and max_bs itself. Source: sgl-project/sglang v0.5.23 (PyPI
    wheel), python/sglang/srt/arg_groups/cuda_graph_hook.py, generate_decode_cuda_graph_batch_sizes (also
    @399499ca)."""
    if speculative:
        listed = [*SGLANG_SPEC_GRAPH_BS, *range(272, max_bs + 1, 16)]
    else:
        listed = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    return tuple(sorted({b for b in listed if b <= max_bs} | {max_bs}))


def sglang_runner_sizes(listed: tuple[int, ...], pool: int, align: int = 1, width: int = 1) -> tuple[int, ...]:
    """The sizes SGLang's decode runner captures of `listed` for a request pool of `pool` per attention rank:
    the pool rounded up to a multiple of `align` (N), N added when the list reaches above it, then the sizes
    <= N whose tokens (size x `width`, the tokens a request carries: speculative_num_draft_tokens when it
    verifies drafts, else 1) are a multiple of `align`. Empty where none is left (SGLang then refuses to
    start). Source: sgl-project/sglang v0.5.23 (PyPI wheel), python/sglang/srt/model_executor/runner/
    base_cuda_graph_runner.py, get_batch_sizes_to_capture; decode_cuda_graph_runner.py (captured_req_width:
    model_runner.decode_num_tokens_per_req, speculative/spec_info.py: num_draft_tokens for target verify)."""
    top = -(-pool // align) * align
    sizes = set(listed) | ({top} if listed and max(listed) > top else set())
    return tuple(sorted(b for b in sizes if b <= top and b * width % align == 0))


def sglang_graph_sizes(max_bs: int, requests: int | None = None, ranks: SglangRanks | None = None,
                       draft_tokens: int | None = None) -> tuple[int, ...]:
    """SGLang's captured decode sizes for a server whose default max_bs is `max_bs` (sglang_graph_max_bs) and
    whose attention ranks each hold a pool of `requests` (None: a pool of max_bs): the default list
    (sglang_listed_sizes, its speculative grid with `draft_tokens`) as the runner keeps it (sglang_runner_sizes
    at the ranks' alignment, each request carrying draft_tokens + 1 tokens when it verifies, 1 under two-batch
    overlap). llmplan's export sets --max-running-requests to the planned batch x the attention ranks
    (export/serve.py), so each rank captures its planned batch (rounded up to the alignment) when max_bs
    allows it and runs a larger one without a graph. Sizes count requests of one attention rank.
    Derived: docs/formulas.md#infer.graph_padding"""
    ranks = ranks or SglangRanks()
    return sglang_runner_sizes(sglang_listed_sizes(max_bs, draft_tokens is not None),
                               max_bs if requests is None else requests, ranks.align,
                               sglang_request_width(ranks, draft_tokens))


def sglang_request_width(ranks: SglangRanks, draft_tokens: int | None) -> int:
    """The tokens a request carries in SGLang's runner alignment test (captured_req_width): draft_tokens + 1
    when it verifies drafts, else 1; 1 under two-batch overlap (it splits each request's rows). Source:
    sgl-project/sglang v0.5.23 (PyPI wheel), model_executor/runner/base_cuda_graph_runner.py,
    get_batch_sizes_to_capture (alignment_width)."""
    return 1 if draft_tokens is None or ranks.two_batch else draft_tokens + 1


def default_graph_sizes(engine: Engine, max_bs: int, max_tokens: int, tp: int = 1,
                        host: GraphHost | None = None, draft_tokens: int | None = None,
                        ranks: SglangRanks | None = None) -> tuple[int, ...] | None:
    """The captured sizes a decode step pads to when the user gives none; `draft_tokens` the speculative
    num_speculative_tokens (None: no speculation). TensorRT-LLM (PyTorch backend): its perf overview's padded
    list (TRTLLM_GRAPH_BATCH_SIZES) cut to the engine's limits (trtllm_graph_sizes). TensorRT-LLM's own
    CudaGraphConfig leaves enable_padding False (tensorrt_llm/llmapi/llm_args.py), so a server started
    without the perf overview's llm_options runs batches off its list without a graph, which llmplan does not
    price; --cuda-graph-sizes gives the list such a server captures. vLLM: its default capture sizes in tokens
    for max_num_seqs = max_bs on the host's GPU and model, with 1 + draft_tokens tokens per decode request
    (vllm_graph_sizes). SGLang: its default list for the GPU's memory and --tp-size (sglang_graph_max_bs at
    `ranks`' tp_size: the instance's GPUs under DP attention; without `ranks` a plain server of `tp`), as
    its runner keeps it for a pool of max_bs requests per attention rank (sglang_graph_sizes: its speculative
    list with draft_tokens), the default max_bs cut to the server's --max-running-requests, max_bs x the
    attention ranks (sglang_decode_max_bs). Derived: docs/formulas.md#infer.graph_padding"""
    host = host or GraphHost()
    if engine == "trtllm":
        return trtllm_graph_sizes(TRTLLM_GRAPH_BATCH_SIZES, max_bs, max_tokens)
    if engine == "vllm":
        return vllm_graph_sizes(max_bs, max_tokens, vllm_platform_max_capture(host.compute_capability),
                                1 + (draft_tokens or 0), VLLM_MODEL_MAX_CAPTURE.get(host.model_type or ""))
    if engine == "sglang":
        ranks = ranks or SglangRanks(tp_size=tp)
        # None where the runner keeps no size (SGLang would refuse to start; e.g. tp 7 under DeepEP on a small GPU)
        # max_bs cut to --max-running-requests (max_bs x the attention ranks): sglang_decode_max_bs
        return sglang_graph_sizes(sglang_decode_max_bs(host.hbm_bytes, ranks.tp_size, max_bs * ranks.attn_dp),
                                  max_bs, ranks, draft_tokens) or None
    return None


def graph_sizes_at(job: Any, batch: int | None = None, tp: int | None = None,
                   host: GraphHost | None = None, ranks: SglangRanks | None = None) -> tuple[int, ...] | None:
    """The job's captured sizes for a server started at another batch, at tensor
    parallelism `tp` (SGLang: the ranks of the plan's server, `ranks`, where given) on `host` (SGLang's
    default depends on the GPU's memory, --tp-size and the attention ranks, vLLM's on its compute
    capability and the model): where the job carries the engine's default (ServeJob.cuda_graph_sizes_default),
    the default at the new settings; else the user's sizes as given. SGLang without `tp` or `ranks` keeps the
    job's list (serving.job_for_plan derives it for the plan before anything is priced).
    Derived: docs/formulas.md#infer.graph_padding"""
    if not job.cuda_graph_sizes_default or (job.engine == "sglang" and tp is None and ranks is None):
        return job.cuda_graph_batch_sizes
    return default_graph_sizes(job.engine, batch or job.batch, job.max_num_batched_tokens, tp or 1, host,
                               draft_tokens_of(job), ranks)


SERVE_GEMM_M_HALF = 128.0
"""Rows at which a serving GEMM reaches half the efficiency its shape allows (small-M kernels fill their
pipelines poorly beyond what tile quantisation counts); fitted by leave-one-model-out on the TensorRT-LLM
runs (benchmarks/accuracy.py; docs/validation.md#serving): 192 at the H100 clock 0.875, 128 in every fold at
0.825 (docs/validation.md#refit). Training GEMMs (thousands of rows) leave it out."""


def layer_linear_shapes(m: ModelSpec, plan: ServePlan, moe: bool) -> list[tuple[float, str, float, float]]:
    """(weights x tokens factor, row kind, N, K) of each matmul of one layer on one GPU, for `tokens` rows:
    attention projections (MLA's down and up projections), the dense or shared-expert MLP, the router, and
    the routed experts (their rows per expert; split by TP, or whole on EP ranks): an entry's FLOPs are
    2·factor·tokens·N·K. Derived: docs/formulas.md#infer.step"""
    h, t = m.hidden_size, plan.tp
    # A hybrid's average layer (cost.mixers): its share of attention, of each recurrent mixer, of dense MLP.
    out = [(attention_share(m), "tokens", n, k) for k, n in attention_shapes(m, t)]
    out += [(share, "tokens", n, k) for k, n, share in recurrent_gemm_shapes(m, t)]
    c = 2 if m.gated_mlp else 1
    f = m.shared_ffn if moe else m.intermediate_size
    f_share = 1.0 if moe else dense_mlp_share(m)
    if f and f_share:
        out += [(f_share, "tokens", c * f / t, h), (f_share, "tokens", h, f / t)]
    if moe:
        split = plan.etp_resolved  # experts split by TP, or whole experts on each EP rank
        share = m.num_experts_per_tok * split / t  # rows each GPU runs per token, over its experts
        w = m.expert_width  # a latent MoE's experts run at its latent width, between two replicated projections
        out += [(1.0, "tokens", m.num_experts, h),
                (share, "experts", c * m.expert_ffn / split, w), (share, "experts", w, m.expert_ffn / split)]
        if m.moe_latent_size:
            out += [(1.0, "tokens", w, h), (1.0, "tokens", h, w)]
    return out


def serve_gemm_efficiency(gpu: Any, dtype: str, M: Any, N: float, K: float) -> Any:
    """Fraction of peak of one serving GEMM: the best large-GEMM fraction x M / (M + SERVE_GEMM_M_HALF) (few
    rows: small-M kernels pick small tiles, so no 128-row tile padding, but fill their pipelines poorly) x
    N-tile quantisation x K / (K + the format's half-length, GpuSpec.gemm_k_half_for).
    Derived: docs/formulas.md#infer.step"""
    n_fill = N / (np.ceil(N / TILE) * TILE)
    return gpu.max_gemm_fraction(dtype) * M / (M + SERVE_GEMM_M_HALF) * n_fill * K / (K + gpu.gemm_k_half_for(dtype))


def linear_seconds(m: ModelSpec, plan: ServePlan, gpu: Any, dtype: str, tokens: Any,
                   head_rows: Any = None) -> tuple[Any, Any]:
    """(dense, expert) compute time of one GPU's matmuls for `tokens` rows through its share of the layers
    and the output layer (`head_rows` of them where given, else `tokens`), each GEMM at the efficiency of its
    own (M, N, K) (serve_gemm_efficiency); expert GEMMs at their rows per expert: the routed rows over the
    experts they touch (at least one row each), so fewer tokens never make them slower.
    Derived: docs/formulas.md#infer.step"""
    T = np.maximum(np.asarray(tokens, dtype=float), 1.0)
    # When the EP group spans replicas (DP attention, vLLM's DP + EP) the experts see the tokens of all of them
    # (cost.serve_moe.expert_token_factor).
    G = T * expert_token_factor(plan)
    touched = np.maximum(_expert_fraction_touched(m, G) * max(m.num_experts, 1), 1e-12)
    rows = {"tokens": T, "experts": np.maximum(G * m.num_experts_per_tok / touched, 1.0)}
    fmt = {"tokens": dtype, "experts": expert_compute_format(plan, gpu) if plan.expert_dtype else dtype}
    parts = {"tokens": 0.0, "experts": 0.0}
    for layers, moe in ((m.num_dense_layers, False), (m.num_moe_layers, True)):
        for share, kind, N, K in layer_linear_shapes(m, plan, moe) if layers else ():
            eff = serve_gemm_efficiency(gpu, fmt[kind], rows[kind], N, K)
            parts[kind] = parts[kind] + layers * 2 * share * T * N * K / (gpu.sustained_flops(fmt[kind]) * eff)
    V = padded_vocab(m.vocab_size, plan.tp) / plan.tp
    peak = gpu.sustained_flops(dtype)
    H = T if head_rows is None else np.maximum(np.asarray(head_rows, dtype=float), 1.0)
    head = 2 * H * V * m.hidden_size / (peak * serve_gemm_efficiency(gpu, dtype, H, V, m.hidden_size))
    # The busiest EP rank's expert rows set the pace (serve_ep_imbalance; 1 when EP stays inside a replica).
    return (parts["tokens"] + head) / plan.pp, parts["experts"] * serve_ep_imbalance(m, plan, T) / plan.pp


SERVE_FORMATS = {"fp8": "fp8", "mxfp8": "mxfp8", "nvfp4": "fp4"}
"""Weight dtype -> the tensor-core format its GEMMs run in when the GPU has it (activations quantised on the
fly, W8A8 / W4A4); otherwise the weights are dequantised to bf16."""


def serve_compute_format(plan: ServePlan, gpu: Any) -> str:
    """The GEMM format of a serving step: the weights' own where the GPU has those tensor cores, else bf16."""
    fmt = SERVE_FORMATS.get(plan.weight_dtype)
    return fmt if fmt is not None and fmt in gpu.tflops else "bf16"


def expert_compute_format(plan: ServePlan, gpu: Any) -> str:
    """The routed experts' GEMM format: their own dtype's where the GPU has those tensor cores, else bf16."""
    fmt = SERVE_FORMATS.get(plan.expert_dtype_resolved)
    return fmt if fmt is not None and fmt in gpu.tflops else "bf16"


def elementwise_serve_bytes(m: ModelSpec, plan: ServePlan, compute_dtype: str) -> float:
    """HBM bytes per token per layer of a serving step's memory-bound operators on one GPU, in 16 bits: two
    norms (read + write h each) and two residual adds (read 2h, write h), which every TP rank repeats on the
    whole hidden state; the gated activation (read 2f/t, write f/t); with fp8 GEMMs, the cast of each GEMM
    input (read 2, write 1 per element); MoE routing and the permute / unpermute of the k copies.
    Derived: docs/formulas.md#infer.step"""
    h, t = m.hidden_size, plan.tp
    f = (m.num_experts_per_tok * m.expert_ffn + m.shared_ffn) if m.is_moe else m.intermediate_size
    d_v = attention_head_dims(m)[1]
    norms_adds = 2 * (2 * h + 3 * h) * 2.0
    act = (3 if m.gated_mlp else 2) * f / t * 2.0
    cast = 3.0 * (2 * h + m.num_attention_heads * d_v / t + f / t) if compute_dtype in ("fp8", "mxfp8", "fp4") else 0.0
    # MoE: routing and the permutes (moe_routing_bytes), on the MoE layers' share of the layers.
    routing = (m.num_moe_layers / m.num_hidden_layers) * moe_routing_bytes(m) if m.is_moe else 0.0
    return norms_adds + act + cast + routing


def step_seconds(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, tokens: Any,
                 attn_pairs: Any, kv_read: Any, decode_only: bool = False, engine: Engine = "vllm",
                 rows: Any = None, logit_rows: Any = None, tbo_share: float = 0.5) -> Any:
    """One engine step of one pipeline stage on one GPU: `tokens` new tokens, `attn_pairs` (query, key)
    pairs of attention, `kv_read` KV bytes read on this GPU (`decode_only`: a step of decodes alone, which
    DeepEP serves with its low-latency kernels). Time = the step's compute (step_compute_seconds) and its
    expert exchange, one after the other or, with two-batch overlap, overlapped over two half-batches
    (cost.serve_moe.overlapped_step); `engine` picks the TP all-reduce's kernel (tp_allreduce_seconds);
    `rows` (CUDA-graph padding, None: `tokens`) reach the element-wise operators and the all-reduces;
    `logit_rows` (None: those rows) the output layer and the sampler; `tbo_share`: micro-batch A's share of a
    prefill step's tokens under SGLang's two-batch overlap (cost.serve_moe.tbo_split_share), B the rest.
    Derived: docs/formulas.md#infer.step"""
    def parts(share: float) -> tuple[Any, Any, Any]:
        T = np.asarray(tokens, dtype=float) * share
        R = None if rows is None else np.asarray(rows, dtype=float) * share
        H = None if logit_rows is None else np.asarray(logit_rows, dtype=float) * share
        exchange = expert_exchange_seconds(m, plan, system, spans, T, decode_only, engine)
        rest, routed = step_compute_parts(m, plan, system, spans, T, np.asarray(attn_pairs) * share,
                                          np.asarray(kv_read) * share, decode_only, engine, R, H)
        return rest, routed, exchange

    slowdown = comm_sm_slowdown(plan, system.gpu, decode_only)
    if plan.two_batch_overlap and not decode_only and m.is_moe and plan.moe_dispatcher == "deepep":
        # SGLang's prefill (extend) schedule: three stages per MoE layer and micro-batch (serve_moe.tbo_prefill_seconds)
        # micro-batches of whole sequences, A's share `tbo_share` (serve_moe.tbo_split_share)
        a, b_ = parts(tbo_share), parts(1.0 - tbo_share)
        b = dispatch_bytes_per_element(plan, system.gpu)
        return tbo_prefill_seconds(*a, m.num_moe_layers / plan.pp, m.num_dense_layers / plan.pp,
                                   b / (b + COMBINE_BYTES), slowdown, *b_)
    rest, routed, exchange = parts(1.0)
    half = parts(0.5) if plan.two_batch_overlap else (0.0, 0.0, 0.0)
    return overlapped_step(rest + routed, exchange, half[0] + half[1], half[2], plan.two_batch_overlap, slowdown)


def attention_pair_dims(m: ModelSpec, plan: ServePlan, decode_only: bool) -> tuple[float, float]:
    """(query-key, value) width per head of one attention pair: the head's own dims, or for MLA decoding from
    its latent cache the absorbed form, where every head scores against the latent plus the rope key
    (kv_lora_rank + qk_rope_head_dim) and sums the latent values (kv_lora_rank), 3.4x the expanded form's work
    for DeepSeek-V3. Source: DeepSeek-V2 report §2.1 (absorbing W^UK and W^UV at inference); deepseek-ai/FlashMLA
    README (decode on the 576-wide latent cache, 512-wide values). Derived: docs/formulas.md#infer.step"""
    if (mla := m.mla) is not None and decode_only and plan.mla_latent_cache:
        return float(mla.kv_lora_rank + mla.qk_rope_head_dim), float(mla.kv_lora_rank)
    qk, v = attention_head_dims(m)
    return float(qk), float(v)


def expert_exchange_seconds(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, tokens: Any,
                            decode_only: bool, engine: str = "vllm") -> Any:
    """The EP token exchange of a step: with EP each TP rank dispatches its 1/t share of the tokens (the
    attention all-reduce becomes a reduce-scatter + all-gather around the MoE block) to the experts' ranks and
    combines them back, two all-to-alls of the k routed 16-bit copies per MoE layer, waiting on the busiest
    rank (serve_ep_imbalance); with DeepEP, its kernels (cost.serve_moe); none where the engine runs EP inside
    the TP group on the replicated tokens (EngineRule.tp_moe_all_to_all: TensorRT-LLM without DP attention).
    Derived: docs/formulas.md#infer.tp_moe"""
    if plan.ep <= 1 or not m.is_moe:
        return 0.0
    if (not plan.dp_attention and plan.ep <= plan.tp and plan.moe_dispatcher == "alltoall"
            and not ENGINES[engine].tp_moe_all_to_all):
        return 0.0
    if plan.moe_dispatcher == "deepep":
        return deepep_exchange_seconds(m, plan, system, spans.ep, tokens, decode_only)
    act = 2.0 * m.expert_width * np.asarray(tokens, dtype=float) * serve_ep_imbalance(m, plan, tokens)
    layers = m.num_moe_layers / plan.pp
    if not plan.dp_attention and plan.ep > plan.tp:
        # vLLM's DP + EP (its default all2all backend, allgather_reducescatter): every rank gathers the hidden
        # states of all ep / tp replicas in the group, runs its experts on them, and reduce-scatters the outputs
        # back. Source: vLLM docs, Expert Parallel Deployment (backend selection guide).
        gathered = act * expert_token_factor(plan)
        return layers * (_coll(system, "all-gather", gathered, spans.ep)
                         + _coll(system, "reduce-scatter", gathered, spans.ep))
    return 2 * layers * _coll(system, "all-to-all", act * m.num_experts_per_tok / plan.tp, spans.ep)


def step_compute_seconds(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, tokens: Any,
                         attn_pairs: Any, kv_read: Any, decode_only: bool = False, engine: Engine = "vllm") -> Any:
    """A step's work on one GPU beside its expert exchange: max(matmuls, weights read) + max(attention core,
    KV read) + memory-bound operators + the TP all-reduces (2 per layer). Derived: docs/formulas.md#infer.step"""
    rest, routed = step_compute_parts(m, plan, system, spans, tokens, attn_pairs, kv_read, decode_only, engine)
    return rest + routed


def step_compute_parts(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, tokens: Any,
                       attn_pairs: Any, kv_read: Any, decode_only: bool = False,
                       engine: Engine = "vllm", rows: Any = None, logit_rows: Any = None) -> tuple[Any, Any]:
    """(everything but the routed experts, the routed experts' max(GEMMs, weights read)) of
    step_compute_seconds: the parts a two-batch-overlap schedule places apart; the element-wise operators, the
    sampler and the TP all-reduces over `rows` (a CUDA graph's padded batch, infer.graph_padding; None: the
    tokens); the output layer and the sampler over `logit_rows` where given (a pass that samples only each
    request's last token). Derived: docs/formulas.md#infer.step"""
    R = np.asarray(tokens if rows is None else rows, dtype=float)
    S = R if logit_rows is None else np.asarray(logit_rows, dtype=float)
    gpu = system.gpu
    t, p = plan.tp, plan.pp
    compute_dtype = serve_compute_format(plan, gpu)
    L = m.num_hidden_layers
    qk, v = attention_pair_dims(m, plan, decode_only)
    attn_flops = 2 * attn_pairs * m.num_attention_heads * (qk + v) * L / (t * p)
    # Weights read once per step: every matmul weight, but only the looked-up rows of the embedding, and of
    # the experts (EPLB's replicas included) only those the step's tokens touch; with DP attention the tokens
    # of every attention rank reach them (cost.serve_moe.expert_token_factor).
    weights = serve_weight_bytes(m, plan) - vocab_shard_params(m, t) * 2.0 / p
    experts = 0.0
    if m.is_moe:
        wpp = weight_bytes_per_param(plan.expert_dtype_resolved, plan.quant_group_size)
        shards = plan.ep * plan.etp_resolved  # whole experts over EP ranks, or each expert split by TP
        experts = (m.num_moe_layers * m.num_experts * expert_params(m) * wpp / shards / p
                   + redundant_expert_params(m, plan) * wpp)
        weights = weights - experts
        experts = experts * _expert_fraction_touched(m, np.asarray(tokens, dtype=float) * expert_token_factor(plan))
    bandwidth = gpu.hbm_achieved_bytes_per_s
    elementwise = elementwise_serve_bytes(m, plan, compute_dtype) * R * L / p
    # The sampler reads each token's fp32 logits (written by the output layer) for softmax / top-k / top-p.
    elementwise = elementwise + 2 * 4.0 * padded_vocab(m.vocab_size, t) / t * S / p
    # Matmuls and attention are separate kernels: each is bound by its own compute or its own reads (the
    # weights, the touched experts, the KV cache), and they run one after the other.
    dense_s, expert_s = linear_seconds(m, plan, gpu, compute_dtype, tokens, logit_rows)
    routed = np.maximum(expert_s, experts / bandwidth)
    gemm = np.maximum(dense_s, weights / bandwidth)
    head = gpu_head_dim_ratio(m, gpu, gpu.attention_softmax_head_dim) \
        if plan.fused_attention else 1.0
    # The attention kernel streams the KV cache at its own published share of the HBM peak (FlashMLA's decode
    # kernel: 3,000 of 3,350 GB/s on H800), the training kernels' share where none is published.
    # Derived: docs/formulas.md#infer.decode_kv_bandwidth
    # A prefill's attention runs in the engine's prefill kernel at its rate on the step's calls (FA3 varlen for
    # SGLang's MLA prefill on Hopper). Derived: docs/formulas.md#infer.prefill_attention
    asymptote = serving_attention_asymptote(gpu) if decode_only else serving_prefill_asymptote(
        m, gpu, ENGINES[engine].fa3_mla_prefill, m.num_attention_heads / t, tokens, attn_pairs)
    attention = np.maximum(attn_flops / (gpu.sustained_flops("bf16") * asymptote
                                         * gpu.softmax_attention_ratio * head),
                           np.asarray(kv_read, dtype=float) / gpu.decode_kv_achieved_bytes_per_s)
    # Unfused attention writes the scores S, reads them for the softmax, writes P and reads it for P·V: four
    # 16-bit passes over every (query, key) pair of every head, in memory-bound kernels of their own (added,
    # not overlapped with the GEMMs). Source: Dao et al. 2022 (FlashAttention) §2.2.
    scores = 0.0 if plan.fused_attention else 4 * 2.0 * attn_pairs * m.num_attention_heads / t * L / p / bandwidth
    act = 2.0 * m.hidden_size * R
    tp_comm = 2 * (L / p) * tp_allreduce_seconds(system, spans.tp, act, engine)
    return gemm + attention + elementwise / bandwidth + scores + tp_comm, routed


SERVE_COLLECTIVE_FLOOR_S = 2e-5
"""Least time of one collective in a serving step: a kernel that synchronises the group's GPUs (NCCL or the
engines' custom all-reduce), whatever the message size; fitted by leave-one-model-out on the TensorRT-LLM
runs (docs/validation.md#serving): 0 at the H100 clock 0.875 (the latency term of collective_time priced the
small messages of decode), 20 us in every fold at 0.825 (docs/validation.md#refit)."""


NCCL_NVLS_LATENCY_S = 25e-6
"""NCCL's own latency for a one-node NVLink SHARP all-reduce, whatever its size: the NVLS entry of its tuning
model's NVLink hardware latencies (Simple protocol), which NCCL adds to size / bandwidth to pick an algorithm.
Source: NVIDIA/nccl src/graph/tuning.cc, hwLat NVLINK NVLS { 0, 0, 25 } and latency = intraLat for NVLS on
one node, unchanged v2.21.5 - v2.28.3. Derived: docs/formulas.md#infer.tp_allreduce"""


def tp_allreduce_seconds(system: SystemSpec, span: GroupSpan, size: Any, engine: Engine) -> Any:
    """One TP all-reduce of `size` bytes over `span` (the TP group, whose size picks the workspace) in a serving
    step: the engine's own kernel (the collective model, at least SERVE_COLLECTIVE_FLOOR_S) while the message fits
    its workspace (EngineRule.allreduce_workspace_bytes), else NCCL, whose NVLink SHARP all-reduce costs
    NCCL_NVLS_LATENCY_S + size x its bandwidth term (a group without NVLink SHARP: the collective model's NCCL
    price throughout). Derived: docs/formulas.md#infer.tp_allreduce"""
    base = _coll(system, "all-reduce", size, span)
    limits = ENGINES[engine].allreduce_workspace_bytes
    if limits is None:
        return base
    nvls = [c for c in collective_coeffs("all-reduce", span, system) if c.algorithm == "nvls"]
    if not nvls:
        return base
    S = np.asarray(size, dtype=float)
    nccl = NCCL_NVLS_LATENCY_S + S * nvls[0].beta
    out = np.where(S > limits[0 if span.size <= 2 else 1], np.maximum(base, nccl), base)
    return out if np.ndim(size) else float(out)


def stage_hop_seconds(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, tokens: Any) -> Any:
    """Passing a step's `tokens` 16-bit hidden states from one pipeline stage to the next (0 without PP).
    Derived: docs/formulas.md#infer.decode"""
    if plan.pp <= 1:
        return 0.0
    return _coll(system, "send-recv", 2.0 * m.hidden_size * np.asarray(tokens, dtype=float), spans.pp)


def _coll(system: SystemSpec, op: str, size: Any, span: GroupSpan) -> Any:
    sizes = np.atleast_1d(np.asarray(size, dtype=float))
    out = np.array([max(collective_time(op, float(s), span, system).seconds, SERVE_COLLECTIVE_FLOOR_S)
                    if span.size > 1 else 0.0 for s in sizes])
    return out if np.ndim(size) else float(out[0])

