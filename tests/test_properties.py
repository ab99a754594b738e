"""Property tests of the memory model: the reported stage is the most loaded, sharding never raises what it
shards."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmplan.cost.memory import activation_bytes, stage_memory, training_memory
from llmplan.cost.params import rank_params
from llmplan.specs.check import balanced_split, check_plan, divisors, valid_tp
from llmplan.specs.plan import MemoryAllowance, ParallelPlan
from llmplan.specs.registry import builtin_models
from llmplan.units import GIB

MODELS = builtin_models()
NAMES = sorted(MODELS)


@st.composite
def valid_plans(draw):
    m = MODELS[draw(st.sampled_from(NAMES))]
    tp = draw(st.sampled_from(valid_tp(m, 16)))
    pp = draw(st.integers(1, min(16, m.num_hidden_layers)))
    first, last = balanced_split(m.num_hidden_layers, pp)  # uneven stages when pp does not divide the layers
    counts = {c for c in (first, last, (m.num_hidden_layers - first - last) // max(pp - bool(first) - bool(last), 1)) if c}
    vpp = draw(st.sampled_from([v for v in range(1, 5) if all(c % v == 0 for c in counts)])) if pp > 1 else 1
    ep = draw(st.sampled_from([e for e in divisors(m.num_experts) if e <= 64])) if m.is_moe else 1
    dp = ep * draw(st.sampled_from([1, 2, 4]))
    mb = draw(st.sampled_from([1, 2]))
    seq = draw(st.sampled_from([s for s in (1024, 2048, 4096) if s <= m.max_position_embeddings]))
    n = draw(st.sampled_from([1, 4, 16]))  # micro-batches per step
    plan = ParallelPlan(
        tp=tp, pp=pp, pp_first=first, pp_last=last, dp=dp, ep=ep, etp=1, vpp=vpp, sp=tp > 1 and draw(st.booleans()),
        # selective recompute's default modules hold core_attn, which DeepSeek-V4's attention refuses (rule
        # recompute_core_attn_dsv4)
        zero=draw(st.integers(0, 3)),
        recompute=draw(st.sampled_from(["none", "full"] if m.model_type == "deepseek_v4"
                                       else ["none", "selective", "full"])),
        # interleaving takes whole groups of pp micro-batches (rule vpp_microbatches): the smallest multiple
        micro_batch=mb, global_batch=mb * dp * (-(-n // pp) * pp if vpp > 1 else n),
        seq_len=seq,
        flash_attention=draw(st.booleans()), grad_dtype=draw(st.sampled_from(["fp32", "bf16"])),
    )
    return m, plan


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(valid_plans())
def test_reported_stage_is_the_most_loaded(mp):
    # The memory model evaluates a few candidate stages (first, second, first all-MoE, last); every stage,
    # uneven splits included, must hold no more than the one it reports.
    m, plan = mp
    assert check_plan(m, plan) == []
    mem = training_memory(m, plan, 80 * GIB)
    assert mem.total == max(stage_memory(m, plan, i, MemoryAllowance(), 80 * GIB).total for i in range(plan.pp))
    assert min(mem.weights, mem.gradients, mem.optimizer, mem.activations, mem.other) >= 0


@settings(max_examples=100, deadline=None)
@given(valid_plans())
def test_more_tp_never_raises_weights_per_gpu(mp):
    m, plan = mp
    bigger = [t for t in valid_tp(m, 64) if t > plan.tp]
    for t in bigger:
        wider = plan.model_copy(update={"tp": t, "sp": plan.sp})
        for stage in range(plan.pp):
            assert rank_params(m, wider, stage).dense <= rank_params(m, plan, stage).dense + 1e-6


@settings(max_examples=100, deadline=None)
@given(valid_plans())
def test_more_pp_never_raises_weights_per_gpu(mp):
    m, plan = mp
    for p in [p for p in divisors(m.num_hidden_layers) if p > plan.pp][:3]:
        deeper = plan.model_copy(update={"pp": p, "vpp": 1})
        worst = max(rank_params(m, deeper, i).total for i in range(p))
        assert worst <= max(rank_params(m, plan, i).total for i in range(plan.pp)) + 1e-6


@settings(max_examples=100, deadline=None)
@given(valid_plans(), st.sampled_from([2, 4, 8]))
def test_more_zero_sharding_never_raises_model_states(mp, factor):
    """Growing the ZeRO group (dp) never raises sharded model states; a higher stage never raises them."""
    m, plan = mp
    mem = training_memory(m, plan, 80 * GIB)
    wider = plan.model_copy(update={"dp": plan.dp * factor, "global_batch": plan.global_batch * factor})
    mem2 = training_memory(m, wider, 80 * GIB)
    assert mem2.optimizer <= mem.optimizer * (1 + 1e-12)
    assert mem2.gradients <= mem.gradients * (1 + 1e-12)
    assert mem2.weights <= mem.weights * (1 + 1e-12)
    if plan.zero < 3:  # compare the same rank (the most-loaded stage may move when 'other' changes)
        higher_plan = plan.model_copy(update={"zero": plan.zero + 1})
        for stage in range(plan.pp):
            a = stage_memory(m, plan, stage, MemoryAllowance(), 80 * GIB)
            b = stage_memory(m, higher_plan, stage, MemoryAllowance(), 80 * GIB)
            assert b.weights + b.gradients + b.optimizer <= (a.weights + a.gradients + a.optimizer) * (1 + 1e-12)


@settings(max_examples=60, deadline=None)
@given(valid_plans())
def test_recompute_and_sp_never_raise_layer_activations(mp):
    m, plan = mp
    order = ["none", "selective", "full"]
    acts = [activation_bytes(m, plan.model_copy(update={"recompute": r}), 0).layers for r in order]
    assert acts[0] >= acts[1] >= acts[2]
    if plan.tp > 1:
        on = activation_bytes(m, plan.model_copy(update={"sp": True}), 0).layers
        off = activation_bytes(m, plan.model_copy(update={"sp": False}), 0).layers
        assert on <= off
