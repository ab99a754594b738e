"""The search's plan arrays keep a workload's --megatron-fsdp on rows where the switch is inert (a pipeline, or
ZeRO below 2: check_switches' megatron_fsdp_zero); the plan it shows is settled with the switch off. Every cost
reads cost.model_states.megatron_fsdp_acts, so the array row prices what the shown plan prices (a review found
the pipelined ZeRO-2/3 gradient churn read the raw switch: 321.1 GB in the arrays against 328.2 GB shown for
llama-3.1-70b tp1 pp2 dp32 zero2 on 8 DGX H100)."""
import numpy as np
import pytest

from llmplan.cost.model_states import megatron_fsdp_acts
from llmplan.estimate import estimate_training
from llmplan.search.evaluate import evaluate
from llmplan.search.grid import from_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems


@pytest.mark.parametrize("pp, zero", [(2, 2), (2, 3), (4, 3)])
def test_an_inert_megatron_fsdp_switch_prices_the_settled_plan(pp, zero):
    m = builtin_models()["llama-3.1-70b"]
    c = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=8)
    plan = ParallelPlan(tp=1, pp=pp, dp=64 // pp, zero=zero, global_batch=1024, seq_len=4096)
    shown = estimate_training(m, c, plan)
    held = plan.model_copy(update={"megatron_fsdp": True})  # as the search's arrays hold the workload's switch
    assert not bool(megatron_fsdp_acts(held))
    arrays = evaluate(m, c, from_plan(held))
    assert float(arrays.memory.total[0]) == pytest.approx(float(shown.memory.total), rel=1e-9)
    assert float(np.asarray(arrays.step.total).ravel()[0]) == pytest.approx(float(shown.time.total), rel=1e-9)


def test_megatron_fsdp_acts_only_at_zero_2_or_3_without_a_pipeline():
    on = np.array([True] * 4)
    plans = type("P", (), {"megatron_fsdp": on, "zero": np.array([1, 2, 3, 3]), "pp": np.array([1, 1, 1, 2])})
    assert megatron_fsdp_acts(plans).tolist() == [False, True, True, False]
