"""Chunk-by-chunk gradient lifetime under sharded gradients with an interleaved pipeline
(docs/formulas.md#mem.grad_lifetime): properties of the schedule walk (seeded hypothesis), the plan-array path
against the one-plan path, and which plans it leaves as they were."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from llmplan.cost.grad_lifetime import (
    _counts,
    _layer_bytes,
    _walk,
    chunk_bytes,
    chunk_gradient_peak,
    equal_chunk_peak,
    kind_chunk_peak,
    pipelined_gradient_bytes,
)
from llmplan.cost.memory import training_memory
from llmplan.cost.params import rank_params
from llmplan.cost.stages import interleaved_chunk_layers, stage_layers
from llmplan.search.grid import PlanArrays, from_plan
from llmplan.specs.layout import parse_layout
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models
from llmplan.units import GIB

M = builtin_models()


@seed(32)
@settings(max_examples=60, deadline=None)
@given(p=st.integers(2, 8), groups=st.integers(1, 3), v=st.integers(1, 4), data=st.data())
def test_walk_bounds(p, groups, v, data):
    # Bounds that hold for any chunk sizes: the rank's joint peak adds at least the gradients of the chunk whose
    # backward comes first (the activations peak just before it: warm-up forwards only add) and at most every
    # chunk's gradients; with one chunk (vpp 1) exactly its gradients, as when they are counted whole.
    n = p * groups
    i = data.draw(st.integers(0, p - 1))
    size = st.floats(0.0, 10.0, allow_nan=False)
    act = np.asarray(data.draw(st.lists(size, min_size=v, max_size=v)))
    grad = np.asarray(data.draw(st.lists(size, min_size=v, max_size=v)))
    sign, chunk, live = _walk(p, n, v, i)
    extra = float(chunk_gradient_peak(sign, chunk, live, act, grad))
    first = int(chunk[np.flatnonzero(sign < 0)[0]])
    assert grad[first] - 1e-9 <= extra <= grad.sum() + 1e-9
    if v == 1:
        assert extra == pytest.approx(grad.sum(), abs=1e-9)
    # more gradient bytes never lower the peak
    assert float(chunk_gradient_peak(sign, chunk, live, act, 2 * grad)) >= extra - 1e-9


@seed(33)
@settings(max_examples=60, deadline=None)
@given(p=st.integers(2, 8), groups=st.integers(1, 3), v=st.integers(2, 4), data=st.data())
def test_equal_chunks_by_counts_match_the_walk(p, groups, v, data):
    # The plan-array path counts held forwards and live chunks; it must equal walking v equal chunks with the
    # embedding's gradients on chunk 0 and the output layer's on chunk v - 1.
    n = p * groups
    i = data.draw(st.integers(0, p - 1))
    a, g, first, last = (data.draw(st.floats(0.0, 10.0, allow_nan=False)) for _ in range(4))
    grad = np.full(v, g)
    grad[0] += first
    grad[-1] += last
    walked = float(chunk_gradient_peak(*_walk(p, n, v, i), np.full(v, a), grad))
    assert float(equal_chunk_peak(_counts(p, n, v, i), a, g, first, last)) == pytest.approx(walked, abs=1e-9)


@seed(34)
@settings(max_examples=80, deadline=None)
@given(p=st.integers(2, 8), n=st.integers(1, 30), v=st.integers(2, 5), data=st.data())
def test_chunks_of_unlike_kinds_in_closed_form_match_the_walk(p, n, v, data):
    # Chunks that differ in layer kind (kind_chunk_peak: the walk's rows of held forwards and live gradients that
    # no other row bounds, once per shape, summed by kind) must equal the step-by-step walk for any layer counts
    # and bytes, micro-batches that do not fill the last group of p included.
    i = data.draw(st.integers(0, p - 1))
    count = st.floats(0.0, 4.0, allow_nan=False)
    dense = tuple(data.draw(st.lists(count, min_size=v, max_size=v)))
    moe = tuple(data.draw(st.lists(count, min_size=v, max_size=v)))
    act_d, act_e, param_d, param_e, first, last = (data.draw(st.floats(0.0, 10.0, allow_nan=False)) for _ in range(6))
    grad_b = data.draw(st.sampled_from([2.0, 4.0, 40.0]))
    d, e = np.asarray(dense), np.asarray(moe)
    grad = (d * param_d + e * param_e) * grad_b
    grad[0] += first
    grad[-1] += last
    walked = float(chunk_gradient_peak(*_walk(p, n, v, i), d * act_d + e * act_e, grad))
    closed = kind_chunk_peak((p, n, v, i), dense, moe, (act_d, act_e, param_d, param_e, grad_b), first, last)
    assert float(closed) == pytest.approx(walked, rel=1e-12, abs=1e-9)


def test_all_forwards_first_holds_one_chunk():
    # Narayanan et al. 2021's interleaved order with n = pp: every forward in the warm-up, then each chunk's n
    # backwards in a row, last chunk first. Activations at a chunk forward's 1 unit and gradients at most what
    # n of them free: the peak adds only the last chunk's gradients (its first backward at the activation peak).
    p, v = 4, 3
    sign, chunk, live = _walk(p, p, v, 1)
    act, grad = np.ones(v), np.asarray([0.5, 2.0, 3.0])
    assert float(chunk_gradient_peak(sign, chunk, live, act, grad)) == pytest.approx(3.0)


def _plan(**kw) -> ParallelPlan:
    base = {"tp": 8, "pp": 16, "vpp": 8, "dp": 128, "sp": True, "zero": 2, "seq_len": 8192, "global_batch": 2048,
            "grad_dtype": "fp32", "recompute": "none"}
    return ParallelPlan(**{**base, **kw})


@pytest.mark.parametrize("kw", [{}, {"zero": 3}, {"pp_first": 7, "pp_last": 7}, {"dp": 64},
                                {"pp": 8, "vpp": 2, "dp": 128, "global_batch": 1024}])
def test_plan_arrays_agree_with_one_plan(kw):
    m = M["llama-3.1-405b"]
    plan = _plan(**kw)
    one = training_memory(m, plan, 80 * GIB)
    many = training_memory(m, from_plan(plan), 80 * GIB)
    assert float(many.total[0]) == pytest.approx(float(one.total), rel=1e-12)
    assert float(many.gradients[0]) == pytest.approx(float(one.gradients), rel=1e-12)


def test_mixed_pipeline_shapes_in_one_array_agree_with_each_plan():
    # The plan-array path walks each distinct (pp, micro-batches, vpp, stage) once: plans of several shapes, one
    # with the mechanism off (ZeRO-1), side by side must each get what they get alone.
    m = M["llama-3.1-405b"]
    plans = [_plan(), _plan(zero=1), _plan(dp=64), _plan(pp=8, vpp=2), _plan(zero=3, vpp=4), _plan(pp=8, vpp=4)]
    arrays = [from_plan(p) for p in plans]
    fields = [f.name for f in dataclasses.fields(PlanArrays) if np.ndim(getattr(arrays[0], f.name)) == 1]
    stacked = PlanArrays(**{f: np.concatenate([getattr(a, f) for a in arrays]) for f in fields}, w=arrays[0].w)
    many = training_memory(m, stacked, 80 * GIB)
    for k, plan in enumerate(plans):
        one = training_memory(m, plan, 80 * GIB)
        assert float(many.gradients[k]) == pytest.approx(float(one.gradients), rel=1e-12), plan
        assert float(many.total[k]) == pytest.approx(float(one.total), rel=1e-12), plan
    # Per stage, at 40 bytes per gradient so that the gradients weigh on where the peak falls: then it depends on
    # the stage's warm-up (pp 16's last stages), and a walk of the wrong stage shows.
    g = 40.0
    for stage in (0, 3, stacked.pp - 4):
        rp = rank_params(m, stacked, stage)
        got = pipelined_gradient_bytes(m, stacked, stage, rp.total * g, g)
        for k, plan in enumerate(plans):
            at = int(np.broadcast_to(stage, len(plans))[k])
            rp1 = rank_params(m, plan, at)
            want = pipelined_gradient_bytes(m, plan, at, rp1.total * g, g)
            assert float(got[k]) == float(want), (plan, at)


@pytest.mark.parametrize("kw", [{"zero": 1}, {"vpp": 1, "pp": 16}, {"pp_schedule": "zero-bubble", "vpp": 1}])
def test_whole_gradients_where_the_mechanism_is_off(kw):
    # Megatron's distributed optimizer (ZeRO-1) keeps a persistent gradient buffer; one chunk per rank (vpp 1)
    # has its gradients live from the first backward, where the activation peak stands.
    m = M["llama-3.1-405b"]
    plan = _plan(**kw)
    mem = training_memory(m, plan, 80 * GIB)
    rp = rank_params(m, plan, int(mem.stage))
    assert float(mem.gradients) == pytest.approx(float(rp.total) * 4.0, rel=1e-12)


# DeepSeek-V3 (config.json: hidden 7168, 256 routed experts and one shared of moe_intermediate_size 2048, dense
# intermediate_size 18432, first_k_dense_replace 3, vocab 129280): a MoE layer's parameters beyond a dense one's
# on a TP 2, EP 8 rank are its 32 routed experts (3 x 7168 x 2048 each, expert-TP 1), its shared expert and the
# router (256 x 7168, its bias), less the dense MLP (3 x 7168 x 18432 split by TP); attention and norms are alike.
DSV3 = M["deepseek-v3"]
MOE_MINUS_DENSE_TP2_EP8 = (32 * 3 * 7168 * 2048 + 3 * 7168 * 2048 / 2 + 256 * 7168 + 256 - 3 * 7168 * 18432 / 2)
EMBEDDING_TP2 = 129280 * 7168 / 2  # 129280 = 505 x 128 x 2: no padding


def test_moe_chunk_carries_the_moe_layers_gradients():
    # Megatron-LM's documented layout "Et*3|(tt|)*29,m|L" at PP 16, VPP 2 (docs/user-guide/features/
    # pipeline_parallel_layout.md, d98e8a6): rank 0's chunk 0 holds the embedding and the three dense layers, its
    # chunk 1 two MoE layers. By hand: chunk 1's gradient less 2/3 of chunk 0's layers' is two MoE layers less two
    # dense ones. One mean layer per stage (the old split) gave 0 here and the larger gradient to chunk 0.
    plan = ParallelPlan(tp=2, pp=16, vpp=2, dp=8, ep=8, etp=1, sp=True, zero=2, global_batch=256, grad_dtype="fp32",
                        recompute="none", pp_layout=parse_layout("Et*3|(tt|)*29,m|L"))
    _, grad = chunk_bytes(DSV3, plan, 0, 4.0)
    layers0 = float(grad[0]) / 4.0 - EMBEDDING_TP2
    assert float(grad[1]) > float(grad[0])
    assert float(grad[1]) / 4.0 - 2 / 3 * layers0 == pytest.approx(2 * MOE_MINUS_DENSE_TP2_EP8, rel=1e-6)
    # the chunks' parts still sum to the rank's gradients
    rp = rank_params(DSV3, plan, 0)
    assert float(grad.sum()) == pytest.approx(float(rp.total) * 4.0, rel=1e-12)
    # n = pp micro-batches: every forward precedes the first backward, chunk 1's, at the activation peak, and chunk
    # 0's come after chunk 1's reduce-scatter: the peak adds chunk 1's gradients (the MoE layers'), not chunk 0's
    fewer = plan.model_copy(update={"global_batch": 128})
    assert float(pipelined_gradient_bytes(DSV3, fewer, 0, rp.total * 4.0, 4.0)) == pytest.approx(
        float(grad[1]), rel=1e-12)


def test_interleaved_chunks_without_a_layout_split_by_layer_kind():
    # A 64-layer DeepSeek-V3 at PP 8, VPP 2 (Megatron's interleaving: rank 0's chunk 0 is layers 0-3, three of them
    # dense, its chunk 1 layers 32-35): chunk 1 carries one more MoE layer's gradient less a dense one's.
    m = DSV3.model_copy(update={"num_hidden_layers": 64})
    plan = ParallelPlan(tp=2, pp=8, vpp=2, dp=8, ep=8, etp=1, sp=True, zero=2, global_batch=256, grad_dtype="fp32",
                        recompute="none")
    dense, moe = interleaved_chunk_layers(m, plan, 0)
    assert dense.tolist() == [3, 0] and moe.tolist() == [1, 4]
    for i in range(plan.pp):
        d, e = interleaved_chunk_layers(m, plan, i)
        assert (float(d.sum()), float(e.sum())) == tuple(float(x) for x in stage_layers(m, plan, i))
    _, grad = _layer_bytes(m, plan, dense, moe, 1.0)
    assert float(grad[1] - grad[0]) == pytest.approx(3 * MOE_MINUS_DENSE_TP2_EP8, rel=1e-6)
    # torchtitan's 405B split at PP 8, VPP 2 (15 layers on the first and last rank: 7 + 8, 8 + 7): the chunks still
    # hold every layer of the stage (a mean of 7.5 each), not 2 x 7
    llama = M["llama-3.1-405b"]
    uneven = _plan(pp=8, vpp=2, pp_first=15, pp_last=15)
    for i in range(uneven.pp):
        d, e = interleaved_chunk_layers(llama, uneven, i)
        assert float(d.sum() + e.sum()) == float(sum(stage_layers(llama, uneven, i)))


MIXED = [(DSV3.model_copy(update={"num_hidden_layers": 64}), {"tp": 2, "pp": 8, "vpp": 2, "ep": 8, "etp": 1}),
         (M["nemotron-3-super"], {"tp": 4, "pp": 4, "vpp": 2, "ep": 8})]


@pytest.mark.parametrize("k", range(len(MIXED)))
def test_mixed_dense_and_moe_chunks_agree_between_arrays_and_one_plan(k):
    # Chunks that differ in layer kind (DeepSeek's first dense layers, Nemotron-3's hybrid MoE pattern and MTP
    # module) go through kind_chunk_peak on both paths, the same rows and additions: the same bits; per stage, at
    # 40 bytes per gradient, as above.
    m, kw = MIXED[k]
    plans = [_plan(**kw, dp=8, global_batch=256), _plan(**kw, dp=8, global_batch=256, zero=3),
             _plan(**kw, dp=8, global_batch=512), _plan(**kw, dp=8, global_batch=256, zero=1)]
    arrays = [from_plan(p) for p in plans]
    fields = [f.name for f in dataclasses.fields(PlanArrays) if np.ndim(getattr(arrays[0], f.name)) == 1]
    stacked = PlanArrays(**{f: np.concatenate([getattr(a, f) for a in arrays]) for f in fields}, w=arrays[0].w)
    many = training_memory(m, stacked, 80 * GIB)
    g = 40.0
    for stage in range(kw["pp"]):
        rp = rank_params(m, stacked, stage)
        got = pipelined_gradient_bytes(m, stacked, stage, rp.total * g, g)
        for j, plan in enumerate(plans):
            rp1 = rank_params(m, plan, stage)
            want = pipelined_gradient_bytes(m, plan, stage, rp1.total * g, g)
            assert float(got[j]) == float(want), (plan, stage)
    for j, plan in enumerate(plans):
        one = training_memory(m, plan, 80 * GIB)
        assert float(many.gradients[j]) == pytest.approx(float(one.gradients), rel=1e-12), plan
        assert float(many.total[j]) == pytest.approx(float(one.total), rel=1e-12), plan
