"""A repeated MTP layer (ModelSpec.mtp_repeated_layer, Megatron-Core mtp_use_repeated_layer): one module's weights
run at every MTP depth, so the weight-proportional counts hold one module while compute and activations run per
depth (docs/formulas.md#params.rank, docs/validation.md#mtp-repeat).

Sources: NVIDIA/Megatron-LM@d98e8a64dd megatron/core/transformer/multi_token_prediction.py
(MultiTokenPredictionBlock._build_layers: one MultiTokenPredictionLayer under mtp_use_repeated_layer, applied
mtp_num_layers times); megatron/training/training.py (mtp_moe_layers = 1 if mtp_use_repeated_layer else
mtp_num_layers); NVIDIA-NeMo/Megatron-Bridge@067f987 recipes/nemotronh/h100/nemotron_3_ultra.py (mtp_num_layers 2,
mtp_use_repeated_layer True), models/nemotronh/nemotron_h_bridge.py. Every expected value below is computed from
the dimensions by hand."""

from __future__ import annotations

from itertools import islice

import pytest
from pydantic import ValidationError

from agreement import assert_arrays_agree
from llmplan.cost.params import mtp_module_params, mtp_params, param_counts, rank_params
from llmplan.cost.stages import mtp_weight_sets
from llmplan.estimate import estimate_training
from llmplan.specs.check import check_plan
from llmplan.specs.hf import from_hf_config
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec, ParallelPlan, trained_model
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()
# h 64, 4 heads of 16 (no GQA), gated MLP of 128, RMSNorm, 2 MTP depths
TINY = ModelSpec(name="tiny-mtp", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, vocab_size=1024, max_position_embeddings=4096, num_nextn_predict_layers=2)
REP = TINY.model_copy(update={"mtp_repeated_layer": True})
# one module: q, k, v, o of 64 x 64; gate, up, down of 64 x 128; eh_proj 128 -> 64; enorm, hnorm, two pre-norms and
# the final norm of 64
ATTN, MLP, PROJ, NORMS = 4 * 64 * 64, 3 * 64 * 128, 2 * 64 * 64, 5 * 64
MODULE = ATTN + MLP + PROJ + NORMS


def test_one_module_by_hand():
    assert MODULE == 49_472 and mtp_module_params(TINY) == MODULE
    assert (mtp_weight_sets(TINY), mtp_weight_sets(REP)) == (2, 1)
    assert (mtp_params(TINY), mtp_params(REP)) == (2 * MODULE, MODULE)
    assert param_counts(TINY) == param_counts(REP)  # the published count leaves MTP out either way


@pytest.mark.parametrize("tp,per_rank", [(1, MODULE), (2, (ATTN + MLP + PROJ) / 2 + NORMS)])
def test_a_rank_holds_one_module_fewer(tp, per_rank):
    # TP splits the projections (attention, MLP, eh_proj); the five norms stay whole on every rank
    plan = ParallelPlan(tp=tp, dp=1, global_batch=8)
    assert float(rank_params(TINY, plan, 0).total - rank_params(REP, plan, 0).total) == per_rank


def test_memory_counts_one_module_and_activations_and_flops_every_depth():
    # ZeRO-1 over 8: bf16 weights 2 B, fp32 gradients 4 B, Adam's master and moments 12 B / 8 a parameter
    c = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=1)
    plan = ParallelPlan(tp=1, dp=8, global_batch=8, zero=1)
    a, b = estimate_training(TINY, c, plan), estimate_training(REP, c, plan)
    assert a.memory.params_on_rank - b.memory.params_on_rank == MODULE
    assert a.memory.weights - b.memory.weights == pytest.approx(2 * MODULE)
    assert a.memory.gradients - b.memory.gradients == pytest.approx(4 * MODULE)
    assert a.memory.optimizer - b.memory.optimizer == pytest.approx(12 * MODULE / 8)
    assert a.memory.activations == b.memory.activations
    assert a.time.compute == pytest.approx(b.time.compute, rel=1e-12)


def test_pipelined_and_moe_ranks():
    # DeepSeek-V3 at depth 2 on the last of 4 stages: the repeated depth drops one module's weights there, and only
    # there; at depth 1 repeating changes nothing
    v3 = M["deepseek-v3"]
    two, rep = (v3.model_copy(update={"num_nextn_predict_layers": 2, "mtp_repeated_layer": r}) for r in (False, True))
    plan = ParallelPlan(tp=1, pp=4, ep=8, dp=8, global_batch=64)
    last = rank_params(two, plan, 3)
    drop = rank_params(two, plan, 3).total - rank_params(rep, plan, 3).total
    one = rank_params(v3, plan, 3).total - rank_params(v3.model_copy(update={"num_nextn_predict_layers": 0}),
                                                        plan, 3).total
    assert drop == pytest.approx(one, rel=1e-12) and last.total > 0
    assert rank_params(two, plan, 0).total == rank_params(rep, plan, 0).total
    one_rep = v3.model_copy(update={"mtp_repeated_layer": True})
    assert rank_params(one_rep, plan, 3).total == rank_params(v3, plan, 3).total


def test_vectorised_search_agrees_with_the_scalar_estimate():
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    m = M["qwen3-30b-a3b"].model_copy(update={"num_nextn_predict_layers": 2, "mtp_repeated_layer": True})
    cluster = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=2)
    w = Workload(global_batch=64, seq_len=4096)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    idx = list(islice((i for i in range(len(plans)) if not check_plan(m, plans.plan(i), cluster)), 25))
    assert_arrays_agree(m, cluster, plans, idx)


def test_nemotron_3_ultra_card_and_checkpoint_hold_with_the_recipe_depth():
    # Model card (nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16): 550B total, MTP left out; the checkpoint with its
    # one MTP module is 561B on the Hugging Face model page. The built-in spec holds that module, repeated as
    # Megatron-Bridge runs it; the recipe's depth 2 (mtp_num_layers 2, mtp_use_repeated_layer) keeps 561B, while
    # two separate modules would make 572B. Tolerance: 0.5% against 550B, the page's rounding (+-0.5B) for 561B.
    m = M["nemotron-3-ultra"]
    assert m.num_nextn_predict_layers == 1 and m.mtp_repeated_layer
    depth2 = m.model_copy(update={"num_nextn_predict_layers": 2})
    for x in (m, depth2):
        p = param_counts(x)
        assert p.total == pytest.approx(550e9, rel=0.005)
        assert round((p.total + mtp_params(x)) / 1e9) == 561
    separate = depth2.model_copy(update={"mtp_repeated_layer": False})
    assert round((param_counts(separate).total + mtp_params(separate)) / 1e9) == 572


def test_repeated_without_mtp_is_refused_and_dropped_with_the_modules():
    with pytest.raises(ValidationError, match="mtp_repeated_layer is set but num_nextn_predict_layers is 0"):
        ModelSpec(**{**TINY.model_dump(), "num_nextn_predict_layers": 0, "mtp_repeated_layer": True})
    plan = ParallelPlan(tp=1, dp=8, global_batch=8, mtp_layers=0)
    assert not trained_model(REP, plan).mtp_repeated_layer


def test_hf_nemotron_h_config_reads_the_bridge_key():
    from test_latent_moe import SUPER_CONFIG
    assert ModelSpec(**from_hf_config(SUPER_CONFIG, "super")).mtp_repeated_layer  # the Bridge's default
    off = ModelSpec(**from_hf_config({**SUPER_CONFIG, "mtp_use_repeated_layer": False}, "super"))
    assert not off.mtp_repeated_layer
    none = ModelSpec(**from_hf_config({**SUPER_CONFIG, "num_nextn_predict_layers": 0}, "super"))
    assert not none.mtp_repeated_layer
