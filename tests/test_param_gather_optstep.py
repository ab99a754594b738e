"""Megatron-Core's --overlap-param-gather-with-optimizer-step (ParallelPlan.overlap_param_gather_with_optimizer_step;
docs/formulas.md#step.dp_optstep_gather, docs/validation.md#param-gather-optstep).

Sources:
- NVIDIA/Megatron-LM core_v0.14.0: megatron/training/arguments.py validate_args (asserts the distributed optimizer,
  --overlap-param-gather, a virtual pipeline size); megatron/core/optimizer/__init__.py get_megatron_optimizer (the
  first model chunk's optimizer apart, stepped first); optimizer/optimizer.py ChainedOptimizer.step_with_ready_grads
  (start_param_sync(force_dispatch=True) of that chunk right after its step); training/training.py get_model
  (disable_bucketing for every chunk under the flag).
- NVIDIA-NeMo/Megatron-Bridge: v0.1.0rc4 scripts/performance/run_script.py lines 191-193 and v0.2.0
  scripts/performance/utils/helpers.py lines 267-270 (`if dp > 1 and pp > 1 and vp > 1`); v0.3.0
  scripts/performance/utils/overrides.py lines 430-434 (`and compute_dtype not in ("fp8_mx", "nvfp4")`).
Hand values below are computed in the docstrings, not by the code under test; tolerance 1e-12 (exact arithmetic).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from llmplan.cost.comm import dp_step_calls
from llmplan.cost.exposure import optstep_gather_exposed
from llmplan.export import bridge, megatron
from llmplan.planfile import load_plan
from llmplan.specs.check import check_plan

PLANS = Path(__file__).parent / "data" / "plans"


def _dense(**update):
    """tests/data/plans/dense_train.json (pp 4, vpp 5, zero 1, dp 2, both overlaps on) with `update` on its plan."""
    pf = load_plan(PLANS / "dense_train.json")
    return dataclasses.replace(pf, plan=pf.plan.model_copy(update=update))


def test_first_chunk_gather_hides_behind_the_other_chunks_step():
    """vpp 5: the first chunk is 1/5 of the gather, beside 4/5 of the step. Gather 1.0 s, step 0.5 s, kappa 0.1:
    0.2 s beside a 0.4 s window -> 0 + 0.1 x 0.2 = 0.02 s. Gather 5.0 s, step 0.5 s: 1.0 s beside 0.4 s ->
    0.6 + 0.1 x 0.4 = 0.64 s."""
    plan = _dense(overlap_param_gather_with_optimizer_step=True).plan
    assert optstep_gather_exposed(plan, 1.0, 0.5, 0.1) == pytest.approx(0.02, abs=1e-12)
    assert optstep_gather_exposed(plan, 5.0, 0.5, 0.1) == pytest.approx(0.64, abs=1e-12)


def test_first_chunk_is_one_bucket_under_the_flag():
    """get_model's disable_bucketing: 5 chunks, one collective each (5 calls), where without the flag the first
    chunk of 1e9 parameters is cut into ceil(2e8 / 4e7) = 5 buckets of 40M (dp 2: max(40M, 2M)) -> 5 + 4 = 9."""
    off, on = _dense().plan, _dense(overlap_param_gather_with_optimizer_step=True).plan
    assert int(dp_step_calls(off, 1e9, True)) == 9
    assert int(dp_step_calls(on, 1e9, False)) == 5


def test_check_plan_refuses_it_without_an_interleaved_pipeline():
    ok = _dense(overlap_param_gather_with_optimizer_step=True)
    assert not [v for v in check_plan(ok.model, ok.plan) if v.rule == "param_gather_optstep_interleaved"]
    for update in ({"vpp": 1}, {"overlap_param_gather": False}):
        bad = _dense(overlap_param_gather_with_optimizer_step=True, **update)
        found = [v for v in check_plan(bad.model, bad.plan) if v.rule == "param_gather_optstep_interleaved"]
        assert found and "interleaved pipeline" in found[0].message, update


def test_exports_write_the_flag_only_when_set():
    assert "--overlap-param-gather-with-optimizer-step" not in megatron.parallel_flags(_dense())
    on = _dense(overlap_param_gather_with_optimizer_step=True)
    assert "--overlap-param-gather-with-optimizer-step" in megatron.parallel_flags(on)
    assert ("optimizer.overlap_param_gather_with_optimizer_step", True) in bridge.overrides(on)
    assert not [k for k, _ in bridge.overrides(_dense()) if "with_optimizer_step" in k]


ON = [
    # 25.09 (v0.1.0rc4 run_script.py): dp 2, pp 8, vp 8
    "mbridge-25.09-pretrain-llama3.1-405b-dgx-b200-128gpu-fp8-tp4pp8cp2ep1vp8gbs64mbs1",
    # 25.11 (v0.2.0 helpers.py): FP8-CS, dp 2
    "bridge-2511-b200-fp8-cs-llama31-405b-128gpu-gbs64",
    # 26.02 (v0.3.0 overrides.py): FP8-CS
    "bridge-2602-gb300-fp8-cs-llama31-405b-256gpu-gbs1536",
    "mbridge-26.06-pretrain-llama3.1-405b-dgx-gb300-256gpu-fp8-tp4pp8cp1epnavp4gbs1536mbs1",
]
OFF = [
    # from v0.3.0 not for fp8_mx / nvfp4
    "bridge-2602-gb300-mxfp8-llama31-405b-256gpu-gbs1536",
    "mbridge-26.06-pretrain-llama3.1-405b-dgx-gb300-256gpu-mxfp8-tp2pp8cp2epnavp4gbs1536mbs1",
    "mbridge-26.06-pretrain-llama3.1-405b-dgx-gb300-256gpu-nvfp4-tp4pp8cp1epnavp4gbs1536mbs1",
    # 25.11 MXFP8 preset with the param-gather overlap off (mbridge_param_gather_off), which the flag needs
    "mbridge-25.11-pretrain-deepseekv3-w-o-mtp-dgx-gb300-256gpu-fp8mx-tp1pp2cp1ep32vp4gbs4096mbs1",
    # pp 1
    "mbridge-25.11-pretrain-qwen3-30b-a3b-dgx-gb300-8gpu-fp8mx-tp1pp1cp1ep8vp1gbs512mbs4",
]


@pytest.mark.parametrize("rid", ON)
def test_rows_whose_script_sets_it(rid, row_plan):
    assert row_plan(rid).overlap_param_gather_with_optimizer_step is True


@pytest.mark.parametrize("rid", OFF)
def test_rows_whose_script_does_not(rid, row_plan):
    assert row_plan(rid).overlap_param_gather_with_optimizer_step is False


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-30b-a3b"])
def test_vectorised_search_agrees_with_the_scalar_estimate_under_the_flag(name):
    """With the flag on (a workload field: one value for the search's plans), the plan arrays price what
    estimate_training prices for each plan alone: the interleaved ZeRO-1 plans the flag acts on (first chunk one
    bucket, its gather beside the step), the plans check_plan keeps, and, unchecked, plans it does not act on
    (vpp 1, zero 0) in the same arrays (the elementwise selection, not only the all-on or all-off arrays)."""
    from agreement import assert_arrays_agree, valid_sample
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    from llmplan.specs.plan import ClusterSpec
    from llmplan.specs.quantities import param_gather_optstep
    from llmplan.specs.registry import builtin_models, builtin_systems

    m, cluster = builtin_models()[name], ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=2)
    w = Workload(global_batch=64, seq_len=4096, overlap_param_gather_with_optimizer_step=True)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    acting = valid_sample(m, cluster, plans, seed=0, scan=4000, n=6, keep=lambda p: bool(param_gather_optstep(p)))
    assert len(acting) == 6
    idle = [i for i in range(len(plans)) if plans.plan(i).vpp == 1 and plans.plan(i).zero == 0][:3]
    assert len(idle) == 3
    assert_arrays_agree(m, cluster, plans, acting + idle)
