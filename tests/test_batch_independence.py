"""A plan's price must not depend on which other plans are evaluated beside it.

The vectorised search prices many plans at once (search.evaluate). A reduction over the batch axis (a max over
all plans of a per-plan count used as one loop bound or one divisor) makes a plan's step time depend on its
neighbours. Found: the fine-grained offload's copy walk (cost.step.step_time) took the most MoE layers of any
plan's stage (np.max over the batch) as every plan's number of copies, and the largest stage of any plan for the
attention groups; a Nemotron-3 Ultra plan on GB300 (pp 4, vpp 27, offload_moe_act) priced 0.21 s of exposed
offload alone and 0.39 s beside a pp 2 plan. Each check compares the same code on a batch of one and on a larger
batch (no expected value from the code under test). The same property found the arrays path failing on a
token-drop FP8 MoE workload (quant_padding_bytes read `plan.etp`, which plan arrays hold as etp_resolved)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.search.evaluate import Evaluation, evaluate
from llmplan.search.grid import PlanArrays, Workload, default_space, enumerate_plans
from llmplan.specs.check import check_plan
from llmplan.specs.plan import RECOMPUTE, ClusterSpec
from llmplan.specs.registry import builtin_models, builtin_systems

RTOL = 1e-9
STEP = ("compute", "bubble", "comm_exposed", "optimizer", "overhead", "total")
MEMORY = ("stage", "weights", "gradients", "optimizer", "activations", "other", "total")


def _at(v: Any, j: int) -> float:
    return float(np.asarray(v).ravel()[j]) if np.ndim(v) else float(v)


def priced(ev: Evaluation, j: int) -> dict[str, float]:
    """Plan j's step time (its parts, exposed seconds by axis, overheads) and memory."""
    out = {f"step.{k}": _at(getattr(ev.step, k), j) for k in STEP}
    out.update({f"exposed.{k}": _at(v, j) for k, v in ev.step.exposed.items()})
    out.update({f"overheads.{k}": _at(v, j) for k, v in ev.step.overheads.items()})
    out.update({f"memory.{k}": _at(getattr(ev.memory, k), j) for k in MEMORY})
    return out


def mismatches(alone: dict[str, float], inside: dict[str, float]) -> dict[str, tuple[float, float]]:
    return {k: (alone[k], inside[k]) for k in alone
            if not np.isclose(alone[k], inside[k], rtol=RTOL, atol=0.0, equal_nan=True)}


def arrays_of(w: Workload, axes: list[dict[str, Any]]) -> PlanArrays:
    """Plans of one workload from their axis fields (PlanArrays.axes' names)."""
    col = lambda k, f=lambda v: v: np.asarray([f(a[k]) for a in axes])  # noqa: E731
    return PlanArrays(tp=col("tp"), pp=col("pp"), dp=col("dp"), cp=col("cp"), ep=col("ep"), etp_resolved=col("etp"),
                      vpp=col("vpp"), pp_first=col("pp_first"), pp_last=col("pp_last"), sp=col("sp"),
                      zero=col("zero"), recompute_code=col("recompute", RECOMPUTE.index),
                      micro_batch=col("micro_batch"), w=w)


ULTRA = "mbridge-26.08-pretrain-nemotron-3-ultra-dgx-gb300-256gpu-mxfp8-tp1pp1cp1ep64vpnagbs256mbs1"
AXES = dict(tp=2, pp=4, dp=32, cp=1, ep=2, etp=1, vpp=27, pp_first=0, pp_last=0, sp=False, zero=3,
            recompute="selective", micro_batch=2)


def test_offload_moe_act_plan_is_priced_alike_beside_a_plan_of_fewer_stages(row_setup):
    m, cluster, plan = row_setup(ULTRA)
    w = Workload.of(plan)
    assert w.offload_moe_act  # the record's fine-grained offload of the experts' fc1 output
    target = AXES
    # pp 2: twice the MoE layers a stage, so a longer copy walk (the batch-wide count priced the pp 4 plan by it)
    sibling = {**AXES, "pp": 2, "dp": 4, "cp": 16, "ep": 32, "vpp": 18, "sp": True}
    alone = evaluate(m, cluster, arrays_of(w, [target]))
    pair = evaluate(m, cluster, arrays_of(w, [sibling, target]))
    a, b = priced(alone, 0), priced(pair, 1)
    assert a["exposed.offload"] > 0
    assert not mismatches(a, b)
    assert not mismatches(priced(evaluate(m, cluster, arrays_of(w, [sibling])), 0), priced(pair, 0))


M, S = builtin_models(), builtin_systems()
CASES = {  # (model, system, nodes, workload): dense, MoE, hybrid; offload off, layer offload, fine-grained offload
    "dense": ("llama-3.1-8b", "dgx-h100", 2, dict(global_batch=64, seq_len=4096)),
    "dense-offload": ("llama-3.1-8b", "dgx-h100", 2, dict(global_batch=64, seq_len=4096, offload_layers=4)),
    "dense-offload-attn": ("llama-3.1-8b", "dgx-h100", 2,
                           dict(global_batch=64, seq_len=4096, offload_modules=("qkv_linear", "core_attn"))),
    "moe": ("mixtral-8x7b", "dgx-h100", 4, dict(global_batch=128, seq_len=4096)),
    # expert_fc1 offload besides, so that the drawn plans include ones whose offload is exposed
    "moe-offload": ("qwen3-30b-a3b", "dgx-h100", 4,
                    dict(global_batch=128, seq_len=4096, offload_moe_act=True, recompute_modules=("moe_act",),
                         offload_modules=("expert_fc1",))),
    "moe-capacity-fp8": ("qwen3-30b-a3b", "dgx-h100", 2,  # token drop: quant padding reads etp (was a crash)
                         dict(global_batch=128, seq_len=4096, dtype="fp8", moe_capacity_factor=1.0)),
    "hybrid": ("nemotron-h-8b", "dgx-h100", 2, dict(global_batch=64, seq_len=8192)),
    "hybrid-moe-offload": ("nemotron-3-nano", "dgx-h100", 4,
                           dict(global_batch=128, seq_len=16384, offload_moe_act=True,
                                recompute_modules=("moe_act",), offload_modules=("expert_fc1",))),
}
_POOLS: dict[str, tuple[Any, ClusterSpec, PlanArrays]] = {}


def pool(case: str) -> tuple[Any, ClusterSpec, PlanArrays]:
    """Up to 16 valid plans of a case (pp 1-8, vpp as the grid gives it), drawn at random from the grid."""
    if case not in _POOLS:
        name, system, nodes, fields = CASES[case]
        m, cluster = M[name], ClusterSpec(system=S[system], num_nodes=nodes)
        w = Workload(**fields)
        plans = enumerate_plans(default_space(m, cluster, w, max_pp=8), cluster, w)
        valid: list[int] = []
        for i in np.random.default_rng(7).permutation(len(plans))[:4000]:
            if len(valid) == 16:
                break
            if not check_plan(m, plans.plan(int(i)), cluster):
                valid.append(int(i))
        assert len(valid) >= 4, case
        _POOLS[case] = (m, cluster, plans.take(np.asarray(valid)))
    return _POOLS[case]


@pytest.mark.parametrize("case", sorted(CASES))
@settings(max_examples=12, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(2, 10))
def test_a_plan_is_priced_alike_alone_and_inside_a_random_batch(case, seed, size):
    m, cluster, plans = pool(case)
    rng = np.random.default_rng(seed)
    batch = rng.choice(len(plans), size=min(size, len(plans)), replace=False)
    j = int(rng.integers(len(batch)))
    inside = priced(evaluate(m, cluster, plans.take(batch)), j)
    alone = priced(evaluate(m, cluster, plans.take(batch[j:j + 1])), 0)
    assert not mismatches(alone, inside), (case, plans.axes(int(batch[j])))


@pytest.mark.parametrize("case", ["moe-offload", "hybrid-moe-offload", "dense-offload-attn"])
def test_offload_cases_price_some_exposed_offload(case):
    """The property's offload cases reach the offload walk (else they would not test it)."""
    m, cluster, plans = pool(case)
    assert np.any(np.asarray(evaluate(m, cluster, plans).step.exposed["offload"]) > 0)
