"""The vectorised search prices the switches of torchtitan and FSDP2 (ParallelPlan.rope_complex,
ParallelPlan.zero3_copy_out) and a model's attention dropout (ModelSpec.attention_dropout) as the scalar
estimate does, on random plans (the search's premise: docs/formulas.md#compute.eager_ops,
#step.zero3_copy_out, #compute.attention_dropout); and check_plan refuses those switches, in one line, where
they would do nothing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmplan.estimate import estimate_training
from llmplan.search.evaluate import evaluate
from llmplan.search.grid import Workload, default_space, enumerate_plans
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()
S = builtin_systems()
CASES = [("llama-3.1-8b", "dgx-h100", 2), ("mixtral-8x7b", "dgx-h100", 4), ("qwen3-30b-a3b", "gb200-nvl72", 4)]


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(CASES), dropout=st.sampled_from([0.0, 0.1]), compiled=st.booleans(),
       rope_complex=st.booleans(), copy_out=st.booleans(), flash=st.booleans(),
       kernel=st.sampled_from(["native", "flash2"]), seed=st.integers(0, 2**16))
def test_random_plans_with_the_switches_agree_with_the_scalar_estimate(case, dropout, compiled, rope_complex,
                                                                       copy_out, flash, kernel, seed):
    name, system, nodes = case
    m = M[name].model_copy(update={"attention_dropout": dropout})
    cluster = ClusterSpec(system=S[system], num_nodes=nodes)
    w = Workload(global_batch=256, seq_len=4096, fused_kernels=compiled, rope_complex=rope_complex and compiled,
                 zero3_copy_out=copy_out, flash_attention=flash, attention_kernel=kernel if flash else "native")
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    order = np.random.default_rng(seed).permutation(len(plans))
    valid = [int(i) for i in order[:400] if not check_plan(m, plans.plan(int(i)), cluster)]
    idx = [i for i in valid if plans.zero[i] == 3][:4] + [i for i in valid if plans.zero[i] < 3][:4]
    assert any(plans.zero[i] == 3 for i in idx) and any(plans.zero[i] < 3 for i in idx)
    vec = evaluate(m, cluster, plans.take(np.asarray(idx)))  # the workload's switches as held, zero < 3 included
    for j, i in enumerate(idx):
        scalar = estimate_training(m, cluster, plans.plan(i))  # settled: the switches that do nothing dropped
        assert float(vec.step.total[j]) == pytest.approx(float(scalar.time.total), rel=1e-9)
        assert float(vec.step.overhead[j]) == pytest.approx(float(scalar.time.overhead), rel=1e-9, abs=1e-12)
        assert float(vec.memory.total[j]) == pytest.approx(float(scalar.memory.total), rel=1e-9)


PLAN = dict(dp=8, micro_batch=1, global_batch=16, seq_len=4096)


@pytest.mark.parametrize("fields,rule,needle", [
    ({"zero": 1, "zero3_copy_out": True}, "zero3_copy_out_zero", "zero3_copy_out with zero 1"),
    ({"zero": 3, "fused_kernels": False, "rope_complex": True}, "rope_complex_fused",
     "rope_complex with fused_kernels or rope_fusion off"),
    ({"zero": 3, "rope_fusion": False, "rope_complex": True}, "rope_complex_fused",
     "rope_complex with fused_kernels or rope_fusion off"),
    ({"zero": 3, "zero3_unit": "tensor", "zero3_copy_out": True}, "zero3_copy_out_unit", "zero3_unit tensor"),
])
def test_check_plan_refuses_a_switch_that_would_do_nothing(fields, rule, needle):
    m, cluster = M["llama-3.1-8b"], ClusterSpec(system=S["dgx-h100"], num_nodes=1)
    found = [v for v in check_plan(m, ParallelPlan(**PLAN, **fields), cluster) if v.rule == rule]
    assert len(found) == 1 and needle in found[0].message and "\n" not in found[0].message
    assert not check_plan(m, ParallelPlan(**PLAN, zero=3, zero3_copy_out=True, rope_complex=True), cluster)


@pytest.mark.parametrize("update,needle", [({"zero3_copy_out": True}, "zero3_copy_out with zero 1"),
                                           ({"fused_kernels": False, "rope_complex": True}, "rope_complex with")])
def test_a_plan_file_with_such_a_switch_exits_2_in_one_line(cli, tmp_path, update, needle):
    import json
    from pathlib import Path

    doc = json.loads((Path(__file__).parent / "data" / "plans" / "dense_train.json").read_text())
    assert doc["plan"]["zero"] == 1
    doc["plan"].update(update)
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(doc))
    line = cli("export", p, "--to", "torchtitan", "-o", tmp_path / "out").refusal()
    assert needle in line and "drop --" in line and not (tmp_path / "out").exists(), line
