"""docs/formulas.md#comm.tp_edge, docs/validation.md#tp-edge-colls: Megatron-Core's TP collectives outside the
decoder layers, priced on the first / last pipeline stage.

NVIDIA/Megatron-LM at core_v0.14.0 and d98e8a64dd:
- tensor_parallel/layers.py VocabParallelEmbedding.forward: reduce_scatter_to_sequence_parallel_region (SP,
  rope) or reduce_from_tensor_model_parallel_region (all-reduce); mappings.py
  _ReduceScatterToSequenceParallelRegion.backward all-gathers the gradient;
- models/gpt/gpt_model.py output_layer = tensor_parallel.ColumnParallelLinear: with SP an all-gather of the input
  forward, the re-gather and the input-gradient reduce-scatter in backward (async_op=True); without SP the input
  gradient's all-reduce;
- fusions/fused_cross_entropy.py: two all-reduces forward, the max (1 fp32 a token) and the predicted logit and
  exp sum concatenated (2); tensor_parallel/cross_entropy.py (unfused): three of 1 fp32 a token;
- transformer/multi_token_prediction.py: the module's embedding, eh_proj (column-parallel, [s, b, 2h] input),
  gather_from_tensor_model_parallel_region (an all-gather of sbh), scatter_to_sequence_parallel_region (its
  backward an all-gather), and the output head again.

Bytes by hand, DeepSeek-V3 (hidden 7168, one MTP module), seq 4096, micro-batch 1, 8 micro-batches, tp 8:
S = 2 x 4096 x 7168 = 58,720,256 bytes (bf16 sbh); an all-gather or reduce-scatter over 8 ranks sends 7/8 of
its buffer per rank, an all-reduce 2 x 7/8 (nccl-tests doc/PERFORMANCE.md).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmplan.cost.comm import comm_seconds, tp_edge_transfers
from llmplan.cost.memory import candidate_stages
from llmplan.cost.step import step_time
from llmplan.estimate import estimate_training
from llmplan.search.evaluate import evaluate
from llmplan.search.grid import from_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems, resolve_model

S = 2 * 4096 * 7168
T = 4096


class _Span:
    def __init__(self, size):
        self.size = size


def _plan(**kw):
    base = dict(tp=8, pp=4, dp=8, ep=8, etp=1, sp=True, zero=1, micro_batch=1, global_batch=64, seq_len=4096)
    return ParallelPlan(**{**base, **kw})


def _bytes(transfers):
    return sum(float(t.bytes) for t in transfers if t.calls)


def test_deepseek_v3_tp8_sp_bytes_by_hand():
    m = resolve_model("deepseek-v3")
    plan = _plan()
    assert S == 58_720_256 and plan.num_microbatches == 8
    # first stage: the embedding's reduce-scatter forward and its gradient's all-gather, 8 each
    sync, async_ = tp_edge_transfers(m, plan, _Span(8), 0)
    assert _bytes(sync) == pytest.approx(16 * S * 7 / 8) and _bytes(async_) == 0
    assert _bytes(sync) == 822_083_584
    # a middle stage: nothing
    assert _bytes(sum(tp_edge_transfers(m, plan, _Span(8), 1), [])) == 0
    # last stage, 2 heads (output layer, MTP): gathers / reduce-scatters in units of S, synchronous:
    # heads' input 2 x 8, MTP embedding 8 + 8, eh_proj input 8 x 2, its output 8, the split's backward 8 = 64;
    # fused loss: 2 x 8 all-reduces of 4T and 2 x 8 of 8T bytes
    sync, async_ = tp_edge_transfers(m, plan, _Span(8), 3)
    assert _bytes(sync) == pytest.approx(64 * S * 7 / 8 + (16 * 4 * T + 16 * 8 * T) * 2 * 7 / 8)
    assert _bytes(sync) == 3_289_710_592
    # asynchronous: heads' re-gather and reduce-scatter 2 x 8 + 2 x 8, eh_proj's 8 x 2 + 8 x 2 = 64 S
    assert _bytes(async_) == pytest.approx(64 * S * 7 / 8) == 3_288_334_336


def test_deepseek_v3_tp8_without_sp_and_unfused_loss_by_hand():
    m = resolve_model("deepseek-v3")
    plan = _plan(sp=False, fused_loss=False)
    sync, async_ = tp_edge_transfers(m, plan, _Span(8), 0)
    assert _bytes(sync) == pytest.approx(8 * S * 2 * 7 / 8) and _bytes(async_) == 0  # 8 all-reduces forward
    sync, async_ = tp_edge_transfers(m, plan, _Span(8), 3)
    # loss 2 heads x 8 x 3 all-reduces of 4T; MTP embedding all-reduce 8 S; eh_proj output gather 8 S
    assert _bytes(sync) == pytest.approx(48 * 4 * T * 2 * 7 / 8 + 8 * S * 2 * 7 / 8 + 8 * S * 7 / 8)
    # heads' input-gradient all-reduces 16 S, eh_proj's 8 x 2S
    assert _bytes(async_) == pytest.approx(32 * S * 2 * 7 / 8)


def test_pp1_holds_both_ends():
    m = resolve_model("deepseek-v3")
    one = _plan(pp=1, global_batch=16)
    four = _plan(pp=4, global_batch=16)  # 2 micro-batches either way
    both = _bytes(tp_edge_transfers(m, one, _Span(8), 0)[0])
    assert both == pytest.approx(_bytes(tp_edge_transfers(m, four, _Span(8), 0)[0])
                                 + _bytes(tp_edge_transfers(m, four, _Span(8), 3)[0]))


def test_dtensor_tp_is_not_priced_here():
    m = resolve_model("deepseek-v3")
    plan = _plan(tp_impl="dtensor")
    assert _bytes(sum(tp_edge_transfers(m, plan, _Span(8), 3), [])) == 0


MODELS = builtin_models()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(st.sampled_from(sorted(MODELS)), st.integers(1, 8), st.booleans(), st.booleans(), st.sampled_from([1, 2, 4]))
def test_a_degree_one_tp_axis_sends_no_bytes(name, pp, fused, learned, n):
    m = MODELS[name].model_copy(update={"learned_position_embeddings": learned})
    pp = min(pp, m.num_hidden_layers)
    plan = ParallelPlan(tp=1, pp=pp, dp=1, micro_batch=1, global_batch=n, seq_len=1024, fused_loss=fused)
    for stage in {0, pp - 1, min(1, pp - 1)}:
        sync, async_ = tp_edge_transfers(m, plan, _Span(1), stage)
        assert all(float(t.calls) == 0 for t in sync + async_)
        assert _bytes(sync + async_) == 0


def test_exposed_in_tp_on_the_end_stages_and_the_search_agrees():
    """The edge seconds land in exposed["tp"] (the synchronous whole, the heads' backward beside their GEMMs), the
    parts still sum to the total, and the vectorised search prices the same step (pp 1 and pp 4)."""
    m = resolve_model("deepseek-v3")
    cluster = ClusterSpec(system=builtin_systems()["dgx-h800"], num_nodes=32)
    for plan in (_plan(pp=4, pp_first=15, pp_last=14, global_batch=64), _plan(pp=1, dp=32, ep=32, global_batch=256)):
        est = estimate_training(m, cluster, plan)
        secs = comm_seconds(est.comm, cluster.system)
        assert len(secs.tp_edge_stages) == len(candidate_stages(m, plan))
        assert secs.tp_edge_stages[-1][0] > 0 and secs.tp_edge_stages[-1][1] > 0
        without = step_time(m, plan, cluster.system.gpu, replace(secs, tp_edge_stages=()))
        assert est.time.exposed["tp"] > without.exposed["tp"]
        assert est.time.total > without.total
        assert sum(est.time.exposed.values()) == pytest.approx(est.time.comm_exposed)
        vec = evaluate(m, cluster, from_plan(plan))
        assert float(vec.step.total[0]) == pytest.approx(float(est.time.total), rel=1e-9)
        assert float(vec.step.exposed["tp"][0]) == pytest.approx(float(est.time.exposed["tp"]), rel=1e-9)


def test_te_fused_loss_one_all_gather_by_hand():
    """fused_loss_impl te: Transformer Engine's parallel_cross_entropy (TransformerEngine d0067d0d
    transformer_engine/pytorch/triton/cross_entropy.py cross_entropy_forward: m_d_X_y of n_rows * 3 fp32, one
    all_gather_into_tensor over the TP group) in place of the native fused loss's two all-reduces. Last stage of
    DeepSeek-V3 TP8 + SP, 2 heads x 8 micro-batches: 16 all-gathers of a 12 T x 8 byte buffer, a rank sending 7/8
    of it; everything else as the native case (64 S of gathers)."""
    m = resolve_model("deepseek-v3")
    native = tp_edge_transfers(m, _plan(), _Span(8), 3)[0]
    te = tp_edge_transfers(m, _plan(fused_loss_impl="te"), _Span(8), 3)[0]
    assert _bytes(te) == pytest.approx(64 * S * 7 / 8 + 16 * 12 * T * 8 * 7 / 8)
    assert _bytes(te) - 64 * S * 7 / 8 == 5_505_024  # against native's (16 x 4T + 16 x 8T) x 2 x 7/8 = 1,376,256
    assert _bytes(native) - 64 * S * 7 / 8 == 1_376_256
    loss = [(t.collective, float(t.calls)) for t in te if t.calls and t.message < S]
    assert loss == [("all-gather", 16.0)]  # one call a head a micro-batch, no all-reduce left
    # unfused: the impl does not act (three all-reduces of 4T either way)
    unfused = _plan(fused_loss=False)
    assert _bytes(tp_edge_transfers(m, unfused, _Span(8), 3)[0]) == _bytes(
        tp_edge_transfers(m, unfused.model_copy(update={"fused_loss_impl": "te"}), _Span(8), 3)[0])


def test_te_fused_loss_search_agrees_with_estimate():
    m = resolve_model("deepseek-v3")
    cluster = ClusterSpec(system=builtin_systems()["dgx-h800"], num_nodes=32)
    plan = _plan(pp=4, pp_first=15, pp_last=14, global_batch=64, fused_loss_impl="te")
    est = estimate_training(m, cluster, plan)
    vec = evaluate(m, cluster, from_plan(plan))
    assert float(vec.step.total[0]) == pytest.approx(float(est.time.total), rel=1e-9)
    native = estimate_training(m, cluster, plan.model_copy(update={"fused_loss_impl": "native"}))
    assert est.time.exposed["tp"] != native.time.exposed["tp"]
