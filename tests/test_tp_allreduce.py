"""TensorRT-LLM's TP all-reduce: its own kernel up to its workspace, NCCL (NVLink SHARP latency) above it.

Sources: NVIDIA/TensorRT-LLM cpp/tensorrt_llm/thop/allreduceOp.cpp (AllreduceOp::selectImplementation falls
back to NCCL above customAllReduceUtils::getMaxRequiredWorkspaceSize: 16e6 bytes at TP <= 2, 8e6 above);
NVIDIA/nccl src/graph/tuning.cc (NVLS one-node latency 25 us, v2.21.5 - v2.28.3). docs/formulas.md#infer.tp_allreduce
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from llmplan.cost.serve_step import NCCL_NVLS_LATENCY_S, tp_allreduce_seconds
from llmplan.serving import replica_spans
from llmplan.specs.plan import ClusterSpec
from llmplan.specs.registry import builtin_systems
from llmplan.specs.serve import ServePlan

H100 = builtin_systems()["dgx-h100"]


def _span(tp: int):
    plan = ServePlan(tp=tp, weight_dtype="fp8", kv_dtype="fp8")
    return replica_spans(plan, ClusterSpec(system=H100, num_nodes=1, gpus_per_node=tp)).tp


def test_nccl_above_the_workspace_pays_its_nvls_latency() -> None:
    span = _span(8)
    below, above = 8e6, 8e6 + 1
    # Below the 8e6-byte workspace (TP8) TensorRT-LLM's kernel: priced as every other engine's.
    assert tp_allreduce_seconds(H100, span, below, "trtllm") == tp_allreduce_seconds(H100, span, below, "vllm")
    # Above it NCCL: at least its 25 us latency more than the bandwidth term of the same message.
    jump = tp_allreduce_seconds(H100, span, above, "trtllm") - tp_allreduce_seconds(H100, span, below, "trtllm")
    assert jump > 0.5 * NCCL_NVLS_LATENCY_S
    assert tp_allreduce_seconds(H100, span, 16.8e6, "trtllm") > tp_allreduce_seconds(H100, span, 16.8e6, "vllm")


def test_tp2_keeps_its_kernel_to_16e6_bytes() -> None:
    span = _span(2)
    # A 2-GPU group has no NVLink SHARP (NCCL uses it from 5 GPUs up): no NVLS latency to add at any size.
    for S in (4e6, 12e6, 20e6):
        assert tp_allreduce_seconds(H100, span, S, "trtllm") == tp_allreduce_seconds(H100, span, S, "vllm")


@seed(405)
@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=1e3, max_value=1e9), min_size=1, max_size=8))
def test_never_cheaper_than_the_engine_neutral_price_and_vectorised(sizes: list[float]) -> None:
    span = _span(8)
    arr = np.asarray(sizes)
    trt = np.asarray(tp_allreduce_seconds(H100, span, arr, "trtllm"))
    base = np.asarray(tp_allreduce_seconds(H100, span, arr, "vllm"))
    assert np.all(trt >= base)
    assert np.allclose(trt, [tp_allreduce_seconds(H100, span, float(s), "trtllm") for s in sizes])


def test_speculative_step_prices_the_engine_all_reduce() -> None:
    """A speculative step's verification pass is a decode step of k + 1 tokens per sequence on the same engine:
    Llama-3.1-70B at TP8, 128 sequences x 4 tokens x 2·8,192 bytes = 8.4e6 bytes per all-reduce, past TensorRT-LLM's
    8e6-byte workspace, so its verify costs what decode_tpot prices for trtllm, above vLLM's."""
    from llmplan.cost.inference import decode_tpot
    from llmplan.cost.speculative import speculative_step
    from llmplan.specs.registry import resolve_model
    from llmplan.specs.serve import SpeculativeSpec

    m = resolve_model("llama-3.1-70b")
    plan = ServePlan(tp=8, weight_dtype="fp8", kv_dtype="fp8")
    spans = replica_spans(plan, ClusterSpec(system=H100, num_nodes=1, gpus_per_node=8))
    spec = SpeculativeSpec(method="eagle", num_speculative_tokens=3)
    verify = {e: speculative_step(m, plan, H100, spans, spec, 128, 2048, 0.0, e).verify for e in ("vllm", "trtllm")}
    assert verify["trtllm"] == decode_tpot(m, plan, H100, spans, 128, 2048, queries=4, engine="trtllm")
    assert verify["trtllm"] > verify["vllm"]
