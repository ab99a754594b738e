"""Speculative decoding: the draft's cost per step, the target's verification step of k + 1 tokens per
sequence, the accepted tokens per step, and the draft's weights and KV cache.

Symbols: k draft tokens per sequence per step, alpha the acceptance rate of a draft token given the ones
before it were accepted, E the tokens a sequence gains per step, B concurrent sequences, c context tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from llmplan.cost.breakdown import Breakdown
from llmplan.cost.compute import attended_keys
from llmplan.cost.inference import (Spans, decode_graphs, decode_tpot, kv_bytes_per_seq_gpu, serve_weight_bytes,
                                    step_seconds, weight_bytes_per_param)
from llmplan.cost.params import vocab_shard_params
from llmplan.specs.hardware import SystemSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.serve import ACCEPTANCE, Engine, ServeJob, ServePlan, SpeculativeSpec

def acceptance_of(spec: SpeculativeSpec) -> float:
    """The job's acceptance rate, else the method's published default (ACCEPTANCE); check_serve_plan refuses
    a method without one."""
    return spec.acceptance_rate if spec.acceptance_rate is not None else ACCEPTANCE[spec.method]


def tokens_per_step(alpha: float, k: int) -> float:
    """Expected tokens a sequence gains per verification step with k draft tokens accepted one after another
    with probability alpha each: 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha); 1 at alpha 0
    (only the target's own token), k + 1 at alpha 1.
    Source: Leviathan et al. 2023, Fast Inference from Transformers via Speculative Decoding, eq. (1)."""
    return float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def draft_model(m: ModelSpec, spec: SpeculativeSpec) -> ModelSpec | None:
    """The model the draft runs, one token per sequence per draft step: the target's MTP layers (one
    transformer layer each, MoE when the model is), an EAGLE head (one dense decoder layer of the target's
    shape) unless a draft model is named, nothing for n-gram (host-side lookup). The derived drafts keep the
    target's embedding and output head, which they share; the target's per-layer lists (layer_types,
    mlp_layer_types) do not describe them, so they are dropped (a one-layer draft of a hybrid stack is an
    attention layer with the target's MLP). Derived: docs/formulas.md#infer.speculative"""
    if spec.method == "ngram":
        return None
    if spec.draft is not None:
        return spec.draft
    layers = m.num_nextn_predict_layers if spec.method == "mtp" else 1
    dense = 0 if spec.method == "mtp" else layers  # MTP layers are MoE where the model is; an EAGLE head is dense
    return m.model_copy(update={"num_hidden_layers": layers, "first_k_dense_replace": dense if m.is_moe else 0,
                                "num_nextn_predict_layers": 0, "layer_types": None, "mlp_layer_types": None})


def draft_plan(plan: ServePlan) -> ServePlan:
    """The draft runs on the target's TP (and EP) ranks, in one stage."""
    return plan.model_copy(update={"pp": 1})


def draft_weight_bytes(m: ModelSpec, plan: ServePlan, spec: SpeculativeSpec) -> float:
    """Draft weights per GPU beyond the target's: 0 for MTP (the MTP layers are already counted on the last
    stage, params.rank_params) and n-gram; an EAGLE head's layer and its 2h -> h input projection (3h -> h for
    EAGLE-3; the embedding and output head shared); a named draft model's weights in full.
    Derived: docs/formulas.md#infer.speculative"""
    draft = draft_model(m, spec)
    if draft is None or spec.method == "mtp":
        return 0.0
    total = serve_weight_bytes(draft, draft_plan(plan))
    if spec.draft is not None:
        return total
    shared = vocab_shard_params(m, plan.tp) * 2.0 * (2 - m.tie_word_embeddings)
    fused = 3 if spec.method == "eagle3" else 2  # EAGLE-3 fuses three layers' features, EAGLE one + the token
    fc = fused * m.hidden_size * m.hidden_size / plan.tp * weight_bytes_per_param(plan.weight_dtype,
                                                                                   plan.quant_group_size)
    return total - shared + fc


def speculative_kv_per_seq(m: ModelSpec, plan: ServePlan, spec: SpeculativeSpec, tokens: Any,
                           block_size: int) -> Any:
    """KV bytes one sequence holds on one GPU under speculation: the target's cache for its tokens plus the k
    draft tokens written before verification, and the draft's own cache (its layers) for the same tokens.
    Derived: docs/formulas.md#infer.speculative"""
    held = tokens + spec.num_speculative_tokens
    draft = draft_model(m, spec)
    own = kv_bytes_per_seq_gpu(m, plan, held, block_size)
    return own if draft is None else own + kv_bytes_per_seq_gpu(draft, draft_plan(plan), held, block_size)


def draft_passes(k: int, engine: Engine, gained: float) -> tuple[float, ...]:
    """Tokens per sequence of each of the draft's forward passes in one speculative step of k draft tokens
    (a chain draft, top-k 1) in which a sequence gains `gained` tokens (tokens_per_step). vLLM: its EAGLE / MTP
    proposer (the method llmplan's vLLM export sets, named draft included) runs first over every token the
    target scheduled, k + 1 per sequence under the default padded drafter batch (disable_padded_drafter_batch
    False: rejected drafts stay in as padding), then k - 1 passes of one token. SGLang: k - 1 draft passes of
    one token ("1 token from draft prefill and (#spec steps - 1) tokens here") and, after verification, a
    draft extend over each sequence's accepted tokens + 1 (extend_lens = accept_length + 1: `gained` on
    average; priced unpadded: only SGLang's verification pads to its capture list). TensorRT-LLM: k passes of one token
    (not
    verified). Source: vllm-project/vllm vllm/v1/spec_decode/llm_base_proposer.py
    @00c4f22dae4795e34658bead82fa071e6bb7ae39, SpecDecodeBaseProposer.propose, set_inputs_first_pass
    (net_num_new_slots_per_request 0 with hidden states); vllm/config/speculative.py
    (SpeculativeConfig.disable_padded_drafter_batch = False); sgl-project/sglang
    python/sglang/srt/speculative/eagle_worker.py @00559eacbf0841146db7e27e445d1971e35e6294 (EAGLEWorker.draft_forward,
    forward_draft_extend_after_decode); python/sglang/srt/speculative/eagle_info.py
    @f1f60ea0258f346adb43d2371d03cbc66d9d5ba2, EagleDraftInput.prepare_extend_after_decode."""
    if engine == "vllm":
        return (float(k + 1),) + (1.0,) * (k - 1)
    if engine == "sglang":
        return (gained,) + (1.0,) * (k - 1)
    return (1.0,) * k


def draft_pass_graphs(engine: Engine, queries: float, k: int, graph_sizes: tuple[int, ...] | None,
                      graph_top: int | None) -> dict[str, Any]:
    """decode_tpot's CUDA-graph arguments for one draft pass of `queries` tokens per sequence. vLLM's proposer
    dispatches its passes on its own CudagraphDispatcher, keyed after the capture sizes were fitted to the
    verification (adjust_cudagraph_sizes_for_spec_decode): PIECEWISE graphs of the same token sizes, a pass of
    b x queries tokens padded to the smallest size that holds it and run eagerly above the largest, whose
    ceiling in sequences is the verification's (graph_top, of k + 1 tokens each) x (k + 1) / queries. Other
    engines: unpadded, captured (not verified). Source: vllm-project/vllm
    vllm/v1/spec_decode/llm_base_proposer.py @00c4f22dae4795e34658bead82fa071e6bb7ae39
    (initialize_cudagraph_keys: PIECEWISE, _determine_batch_execution_and_padding: cudagraph_dispatcher.dispatch
    of the pass's tokens); vllm/v1/spec_decode/eagle.py @f7eef1b6987f4780fe8636077682936fe075aa2f
    (EagleProposer.propose: pad_for_cudagraph at or below max_cudagraph_capture_size, NONE above)."""
    if engine != "vllm" or not graph_sizes:
        return {}
    return {"graph_sizes": graph_sizes,
            "graph_top": None if graph_top is None else int(graph_top * (k + 1) // queries)}


DRAFT_PROMPT_ENGINES: tuple[Engine, ...] = ("vllm", "sglang")
"""Engines whose drafter is verified to run over the prompt in its prefill steps (draft_prompt_seconds);
TensorRT-LLM's is not verified here, and not priced."""


def draft_prompt_seconds(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, job: ServeJob,
                         tokens: Any, context: Any, requests: Any) -> Any:
    """The draft's pass over `tokens` prompt tokens of `requests` prompts in one prefill step, each token
    attending to `context` keys on average: the draft's layers over every token (its KV cache for the prompt,
    and for EAGLE / MTP the target's hidden states as input), its output layer and sampler over each request's
    last token only; 0 without speculation or a draft (n-gram), and on TensorRT-LLM (not verified).
    Source: sgl-project/sglang python/sglang/srt/speculative/eagle_worker.py
    @00559eacbf0841146db7e27e445d1971e35e6294, EAGLEWorker.forward_batch_generation (an extend batch runs
    forward_target_extend with CaptureHiddenMode.FULL, "to prefill the KV cache of the draft model", then
    forward_draft_extend over the batch); python/sglang/srt/disaggregation/prefill.py
    @000c2b942308ea5502978be73542016c230dba02, process_batch_result_disagg_prefill (a PD prefill server hands
    that pass's topk_p, topk_index and hidden states to decode); vllm-project/vllm
    vllm/v1/spec_decode/llm_base_proposer.py @00c4f22dae4795e34658bead82fa071e6bb7ae39,
    SpecDecodeBaseProposer.propose (the first pass over every scheduled token, a prefill's included: "to keep
    the drafter KV cache in sync"; logits at token_indices_to_sample, one a request)."""
    spec = job.speculative
    draft = None if spec is None or job.engine not in DRAFT_PROMPT_ENGINES else draft_model(m, spec)
    if draft is None:
        return 0.0
    t = np.asarray(tokens, dtype=float)
    return step_seconds(draft, draft_plan(plan), system, spans, t, t * attended_keys(draft, context), 0.0,
                        engine=job.engine, logit_rows=requests)


@dataclass(frozen=True)
class SpeculativeStep(Breakdown):
    """One speculative step of a replica: k draft steps + one verification step of k + 1 tokens per
    sequence; draft + verify = total seconds, in which each sequence gains tokens_per_step tokens."""

    PARTS: ClassVar[tuple[str, ...]] = ("draft", "verify")

    draft: Any
    verify: Any
    tokens_per_step: float
    acceptance_rate: float


def speculative_step(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, spec: SpeculativeSpec,
                     batch: Any, context: Any, overhead: float, engine: Engine = "vllm",
                     graph_top: int | None = None, graph_sizes: tuple[int, ...] | None = None) -> SpeculativeStep:
    """The draft runs k steps of one token per sequence through draft_model (the same MTP layer again for k
    beyond num_nextn_predict_layers, as vLLM and SGLang do); the target then runs one step of k + 1 tokens
    per sequence (the last token and the k drafts) over the same KV cache, with the engine's host time; both
    on `engine` (its TP all-reduce, cost.serve_step.tp_allreduce_seconds). A verification step of more
    sequences than `graph_top` (cost.serve_step.graph_ceiling: vLLM's captured tokens over k + 1) runs
    without a CUDA graph and pays its launches; one at or below it replays the smallest captured size that
    holds it, its element-wise operators and all-reduces carrying the padded tokens (`graph_sizes`,
    cost.serve_step.graph_padded_tokens: vLLM pads batch x (k + 1) tokens, SGLang the batch to its speculative
    request grid, cost.serve_step.sglang_graph_sizes). The draft's passes (draft_passes:
    vLLM's first over the k + 1 verified tokens per sequence, SGLang's draft extend over the accepted ones,
    k - 1 of one token) pad to the same sizes and run eagerly above them on vLLM (draft_pass_graphs),
    unpadded elsewhere; each samples one row per request (its output layer and sampler: vLLM's logits at
    token_indices_to_sample, SGLang's draft extend pruned to each request's last token).
    Source: vllm-project/vllm vllm/v1/spec_decode/llm_base_proposer.py @00c4f22dae4795e34658bead82fa071e6bb7ae39
    (SpecDecodeBaseProposer.propose: sample_hidden_states = last_hidden_states[token_indices_to_sample]);
    sgl-project/sglang python/sglang/srt/layers/logits_processor.py @009db01a7c0d5460611d543516401eb497641918
    (LogitsProcessor.forward: an extend batch, DRAFT_EXTEND with CaptureHiddenMode.LAST as
    EAGLEWorker.forward_draft_extend_after_decode sets it, keeps each request's last_index).
    Derived: docs/formulas.md#infer.speculative"""
    k = spec.num_speculative_tokens
    draft = draft_model(m, spec)
    alpha = acceptance_of(spec)
    gained = tokens_per_step(alpha, k)
    draft_s: Any = 0.0
    if draft is not None:
        passes = draft_passes(k, engine, gained)
        for q in sorted(set(passes)):
            draft_s = draft_s + passes.count(q) * decode_tpot(
                draft, draft_plan(plan), system, spans, batch, context, queries=q, engine=engine, sample_last=True,
                **draft_pass_graphs(engine, q, k, graph_sizes, graph_top))
    verify = decode_tpot(m, plan, system, spans, batch, context, overhead, queries=k + 1, engine=engine,
                         graph_sizes=graph_sizes, graph_top=graph_top)
    return SpeculativeStep(draft=draft_s, verify=verify, tokens_per_step=gained, acceptance_rate=alpha)


def speculative_tpot(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, job: ServeJob,
                     batch: Any, context: Any, overhead: float) -> Any:
    """Time per output token under speculation: one speculative step over the tokens it yields per sequence.
    Derived: docs/formulas.md#infer.speculative"""
    assert job.speculative is not None  # the caller's branch; not user input
    step = speculative_step(m, plan, system, spans, job.speculative, batch, context, overhead, job.engine,
                            **decode_graphs(job, plan, system, m))
    return step.total / step.tokens_per_step
