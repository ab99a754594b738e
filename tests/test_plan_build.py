"""PlanArrays.plan builds the arrays' plans by copying the workload's validated plan (search.grid.PlanBuild):
for plans drawn at random from searches' plan arrays (a dense, an MoE and an MLA model; switches the search
settles set), the plan is the one validation and check_switches.settle build, field for field, with the same
fields recorded as set and the same JSON; where validation refuses a value, the same error."""

from __future__ import annotations

import random

import numpy as np
import pytest
from pydantic import ValidationError

from llmplan.search.grid import PlanArrays, Workload, default_space, enumerate_plans
from llmplan.specs.check_switches import settle
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

CASES = {  # model, system, nodes, workload switches (some that settle puts back on plans without their axis)
    "dense": ("llama-3.1-70b", "dgx-h100", 8, {"tp_comm_overlap": True, "cp_impl": "torch-alltoall",
                                               "zero3_unit": "layer", "pp_blocking_sends": True}),
    "moe": ("qwen3-30b-a3b", "dgx-h100", 2, {"ep_comm_overlap": True, "tp_comm_overlap": True,
                                             "fp32_param_shards": True}),
    "mla": ("deepseek-v3", "dgx-h100", 32, {"pp_schedule": "zero-bubble", "tp_impl": "dtensor"}),
}


def arrays(name: str) -> PlanArrays:
    model, system, nodes, switches = CASES[name]
    m, cluster = builtin_models()[model], ClusterSpec(system=builtin_systems()[system], num_nodes=nodes)
    w = Workload(global_batch=512, seq_len=4096, **switches)
    return enumerate_plans(default_space(m, cluster, w), cluster, w)


def validated(a: PlanArrays, i: int, settled: bool = True) -> ParallelPlan:
    """The plan as it was built before: every field validated, then settled."""
    plan = a.w.plan(**a.axes(i))
    return settle(plan) if settled else plan


@pytest.mark.parametrize("name", sorted(CASES))
def test_built_plan_is_the_validated_plan(name):
    a = arrays(name)
    rng = random.Random(f"build-{name}")
    rows = rng.sample(range(len(a)), 300)
    reset = 0
    for i in rows:
        for settled in (True, False):
            want, got = validated(a, i, settled), a.plan(i, settled)
            assert got == want and got.__dict__ == want.__dict__, (i, settled)
            assert got.model_fields_set == want.model_fields_set
            assert got.model_dump_json() == want.model_dump_json()
        reset += validated(a, i) != validated(a, i, False)
    assert a.memo[("plan_build",)].ok  # the copy built them, not validation
    assert 0 < reset < len(rows)  # settle put switches back on some plans, not all


def test_a_value_validation_refuses_is_refused_alike():
    """grad_reduce all-reduce with ZeRO-2/3 (ParallelPlan's own check): plan(i) raises as validation does, and
    the arrays' other plans are built as validated."""
    m, cluster = builtin_models()["llama-3.1-8b"], ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=1)
    w = Workload(global_batch=64, seq_len=4096, grad_reduce="all-reduce")
    a = enumerate_plans(default_space(m, cluster, w), cluster, w)
    zero = np.asarray(a.zero)
    bad, good = int(np.flatnonzero(zero == 2)[0]), np.flatnonzero(zero == 1)[:40].tolist()
    with pytest.raises(ValidationError):
        validated(a, bad)
    for i in good:  # past the first plans, which are validated alike (VALIDATED_FIRST)
        assert a.plan(i).__dict__ == validated(a, i).__dict__
    with pytest.raises(ValidationError):
        a.plan(bad)
    assert not a.memo[("plan_build",)].ok


def test_parallel_plan_validators_are_the_kinds_the_copy_runs():
    """PlanBuild relies on ParallelPlan's validators being per-field checks (field constraints, 'before' field
    and model validators that read each field alone) and 'after' model checks, which it runs on each plan. A new
    validator changes this list: review PlanBuild (a 'before' model validator must read each field alone)."""
    d = ParallelPlan.__pydantic_decorators__
    assert {k: v.info.mode for k, v in d.model_validators.items() if v.info.mode != "after"} == {
        "_typed_as_written": "before"}
    # reviewed: both read their own field alone (_null_flex_backend_is_the_default maps JSON null to the
    # field's default, docs/validation.md#tidy-70), so PlanBuild's per-column validation covers them
    assert {k: v.info.mode for k, v in d.field_validators.items()} == {
        "_etp_unset": "before", "_null_flex_backend_is_the_default": "before"}
    assert not (d.validators or d.root_validators)
