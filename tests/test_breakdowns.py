"""Every breakdown (a Breakdown subclass) names its parts as real fields, and its total is their sum, on
estimates of dense and MoE training and of serving."""

from __future__ import annotations

import dataclasses

import pytest

from llmplan.cost.breakdown import Breakdown
from llmplan.cost.compute import layer_flops
from llmplan.cost.memory import layer_activation_parts, model_state_bytes
from llmplan.cost.model_states import optimizer_copies, optimizer_parts
from llmplan.cost.params import rank_params
from llmplan.estimate import estimate_training
from llmplan.serving import estimate_serving
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.specs.serve import ServeJob, ServePlan, SpeculativeSpec

M, S = builtin_models(), builtin_systems()


def instances() -> list[Breakdown]:
    out: list[Breakdown] = []
    cluster = ClusterSpec(system=S["dgx-h100"], num_nodes=2)
    for name, plan in (("llama-3.1-70b", ParallelPlan(tp=8, pp=2, dp=1, sp=True, zero=1, global_batch=8)),
                       ("mixtral-8x7b", ParallelPlan(tp=2, pp=1, dp=8, ep=8, etp=1, sp=True, global_batch=16)),
                       # Transformer Engine's a2a context parallelism: its saved output and buffers as parts
                       ("llama-3.1-8b", ParallelPlan(tp=2, cp=2, dp=4, sp=True, seq_len=16384, global_batch=8,
                                                     cp_comm_type="a2a"))):
        e = estimate_training(M[name], cluster, plan)
        out += [e.params, e.memory, e.memory.activation_parts, e.time, e.time.stage, e.goodput,
                layer_flops(M[name], plan, M[name].is_moe), layer_activation_parts(M[name], plan, M[name].is_moe)]
        out += [rank_params(M[name], plan, 0), model_state_bytes(1e9, 8, 1, 2, 4),
                optimizer_parts(plan, e.memory.optimizer)]
        assert e.memory.runtime is not None  # priced by default (no --overhead-gib)
        out.append(e.memory.runtime)
    # DeepSpeed ZeRO-1's copies after the backward (16-bit gradients all-reduced, fp32 master)
    out.append(optimizer_copies(ParallelPlan(dp=8, zero=1, grad_reduce="all-reduce", grad_dtype="bf16"), 1e9, 8))
    one = ClusterSpec(system=S["dgx-h100"], num_nodes=1)
    out.append(estimate_serving(M["llama-3.1-8b"], one, ServePlan(tp=8), ServeJob()).memory)
    spec = SpeculativeSpec(method="eagle", num_speculative_tokens=3)
    speculative = estimate_serving(M["llama-3.1-8b"], one, ServePlan(tp=8), ServeJob(speculative=spec)).speculative
    assert speculative is not None
    out.append(speculative.step)
    return out


def test_every_breakdown_class_is_covered():
    seen = {type(x) for x in instances()}
    assert set(Breakdown.__subclasses__()) <= seen


@pytest.mark.parametrize("obj", instances(), ids=lambda o: type(o).__name__)
def test_parts_are_fields_and_none_is_negative(obj):
    # `total` is the sum of PARTS by construction (Breakdown); what can go wrong is a part that is not a real
    # field or that goes negative (a subtraction in a formula), which a sum would hide.
    names = {f.name for f in dataclasses.fields(obj)}
    assert set(obj.PARTS) <= names and obj.PARTS
    assert all(float(getattr(obj, p)) >= 0 for p in obj.PARTS)
    assert float(obj.total) > 0
