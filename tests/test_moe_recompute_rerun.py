"""Selective recompute of `moe` reruns the MoE layer's whole forward in backward (NVIDIA/Megatron-LM
megatron/core/transformer/moe/moe_layer.py, MoELayer.forward: tensor_parallel.checkpoint(custom_forward) when
moe_layer_recompute), its memory-bound kernels too: the alltoall dispatcher's sorts by local expert and the
experts' activations run once more (docs/formulas.md#moe.recompute_rerun). Checked against the one published
Nsight profile of a run with it: NVIDIA-NeMo/Megatron-Bridge branch zhiyul/determinism-debug-tool at 6d780951a,
scripts/performance/perf_leaderboard/analysis_report_det_vs_nondet.md section 4.2 (Nemotron-3 Ultra, rank 0,
16 MoE layers, 3 iterations x 8 micro-batches)."""

from __future__ import annotations

import pytest

from llmplan.cost.compute import ALLTOALL_SORT_BYTES, elementwise_bytes
from llmplan.cost.elementwise import activation_pass_bytes, moe_recompute_bytes
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan

TINY: dict = {"name": "tiny-moe", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
              "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 4096,
              "num_experts": 16, "num_experts_per_tok": 2, "moe_intermediate_size": 128}
# S1 section 4.2, calls over the window: _sort_chunks_by_map_kernel 2,304, _make_chunk_sort_map_kernel 1,536
# (Transformer Engine builds a sort's map in forward only; the backward reuses it); 24 micro-batches x 16 layers
S1_SORTS = 2304 / (24 * 16)
S1_FORWARD_SORTS = 1536 / (24 * 16)


def plan(**kw) -> ParallelPlan:
    return ParallelPlan(**{"seq_len": 4096, "ep": 8, "dp": 8, "recompute": "selective", **kw})


def sorts_priced(m: ModelSpec, p: ParallelPlan) -> float:
    """Sort passes a layer and micro-batch as the stage charges them (three forward-equivalents)."""
    flex = p.model_copy(update={"moe_dispatcher": "deepep"})
    extra = elementwise_bytes(m, p, True) - elementwise_bytes(m, flex, True)
    per_sort = ALLTOALL_SORT_BYTES * m.num_experts_per_tok * m.expert_width * p.seq_len
    return 3 * extra / per_sort


def test_sorts_under_moe_recompute_are_the_profiled_count():
    m = ModelSpec(**TINY)
    assert S1_SORTS == 6 and S1_FORWARD_SORTS == 4  # two forward, two rerun, two backward
    # the experts' activation runs on the same tokens on both dispatchers: only the sorts differ
    assert sorts_priced(m, plan(recompute_modules=("moe",))) == pytest.approx(S1_SORTS)
    assert sorts_priced(m, plan(recompute_modules=("moe_act",))) == pytest.approx(S1_SORTS - S1_FORWARD_SORTS / 2)


def test_rerun_bytes_by_hand():
    m = ModelSpec(**{**TINY, "n_shared_experts": 1})
    p = plan(recompute_modules=("moe",), tp=2, sp=True, dp=4)
    T, k, w, fe = 4096, 2, 256, 128
    # forward's two sorts (read and write every received bf16 copy), the routed (gated: read 2f, write f) and
    # shared activations' one pass, per token of the layer; a third, as the stage charges three times it
    by_hand = (2 * 4 * k * w / 2 + 6 * fe * k / 2 + 6 * m.shared_ffn / 2) / 3
    assert activation_pass_bytes(m) == 6
    assert moe_recompute_bytes(m, p) == pytest.approx(by_hand * T)


def test_rerun_eager_bytes_without_fused_kernels():
    """Without fused_kernels the forward runs a gated MLP's activation as eager silu and product
    (EAGER_SWIGLU_BYTES: forward, read 2 write 2 for silu, read 4 write 2 for the product: 10 a column), and the
    `moe` rerun runs the same forward kernels again: its routed and shared activation bytes are those 10, not the
    fused pass's 6."""
    from llmplan.cost.elementwise import EAGER_SWIGLU_BYTES

    m = ModelSpec(**{**TINY, "n_shared_experts": 1})
    p = plan(recompute_modules=("moe",), tp=2, sp=True, dp=4, fused_kernels=False)
    T, k, w, fe = 4096, 2, 256, 128
    eager = 10
    assert EAGER_SWIGLU_BYTES[0] == eager
    by_hand = (2 * 4 * k * w / 2 + eager * fe * k / 2 + eager * m.shared_ffn / 2) / 3
    assert moe_recompute_bytes(m, p) == pytest.approx(by_hand * T)


def test_nothing_without_moe_recomputed():
    m = ModelSpec(**TINY)
    for modules in ((), ("moe_act",), ("layernorm", "core_attn"), ("shared_experts",)):
        assert moe_recompute_bytes(m, plan(recompute_modules=modules)) == 0.0
    assert moe_recompute_bytes(m, ParallelPlan(ep=8, dp=8)) == 0.0  # no selective recompute
    dense = ModelSpec(**{k: v for k, v in TINY.items()
                         if k not in ("num_experts", "num_experts_per_tok", "moe_intermediate_size")})
    assert moe_recompute_bytes(dense, plan(recompute_modules=("moe",))) == 0.0


def test_stage_pays_it_once_per_moe_layer():
    m = ModelSpec(**TINY)
    with_moe, without = plan(recompute_modules=("moe",)), plan(recompute_modules=("moe_act",))
    a, b = elementwise_bytes(m, with_moe, True), elementwise_bytes(m, without, True)
    assert a > b
    assert elementwise_bytes(m, with_moe, False) == elementwise_bytes(m, without, False)  # dense layers
