"""The MoE router as one explicit switch (ParallelPlan.moe_router_fusion) with the spec's auxiliary loss: its
launches (cost.kernels.router_kernels), its torch.topk calls (cost.moe_kernels.router_topk_calls) and what the
Megatron exports write. Expected counts are read along NVIDIA/Megatron-LM at d98e8a6
(megatron/core/transformer/moe/router.py TopKRouter.routing; moe_utils.py topk_routing_with_score_function,
compute_routing_scores_for_aux_loss, switch_load_balancing_loss_func, get_tokens_per_expert_and_token_count,
MoEAuxLossAutoScaler, RouterGatingLinearFunction) and NVIDIA/TransformerEngine pytorch/router.py at d0067d0.
docs/formulas.md#moe.router_fusion"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from llmplan.cost.kernels import Kernels, aux_loss_on, router_kernels
from llmplan.cost.moe_kernels import moe_kernel_calls, router_topk_calls
from llmplan.estimate import estimate_training
from llmplan.export import render_all
from llmplan.planfile import load_plan
from llmplan.search.evaluate import evaluate
from llmplan.search.grid import from_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

PLANS = Path(__file__).parent / "data" / "plans"
GATING = Kernels(1, 7)  # the gating GEMM; backward RouterGatingLinearFunction's 6 and the weight's main_grad add


def _plan(**update) -> ParallelPlan:
    plan = ParallelPlan(tp=2, pp=1, dp=4, ep=8, etp=1, micro_batch=1, global_batch=64, seq_len=8192, sp=True)
    return plan.model_copy(update=update)


def _model(coef):
    return builtin_models()["qwen3-30b-a3b"].model_copy(update={"router_aux_loss_coef": coef})


@pytest.mark.parametrize("fused,coef,expected", [
    # fused: fused_topk_with_score_function forward / backward
    (True, 0.0, GATING + Kernels(1, 1)),
    # fused + aux: fused scores (1 / 1), routing_map.sum (1), fused_moe_aux_loss (1 / 1), two tracker updates (2);
    # backward the auto-scaler's ones_like and product (2) and the sum of the logits' two gradients (1)
    (True, 1e-3, GATING + Kernels(1, 1) + Kernels(1 + 1 + 1 + 2, 1 + 1 + 2 + 1)),
    # eager: torch.topk, softmax, probs zeros_like + scatter, map zeros_like + .int() + scatter + .bool(); backward
    # the scatter's gather, the softmax's backward, torch.topk's zeros + scatter
    (False, 0.0, GATING + Kernels(1 + 1 + 2 + 4, 1 + 1 + 2)),
    # eager + aux: softmax, torch.topk, map (4), counts (1), loss (sum, mul, sum, scale: 4), trackers (2); backward
    # the auto-scaler (2), the two products' backwards (2), the softmax's backward (1), the logits' gradient sum (1)
    (False, 1e-3, GATING + Kernels(8, 4) + Kernels(1 + 1 + 4 + 1 + 4 + 2, 2 + 2 + 1 + 1)),
])
def test_router_launches_fused_and_eager_from_the_source(fused, coef, expected):
    assert router_kernels(_model(coef), _plan(moe_router_fusion=fused)) == expected


def test_the_fused_router_with_aux_loss_keeps_the_published_count():
    # cost.kernels.ROUTER (7, 13), the count every MoE layer was priced with before the switch
    assert router_kernels(_model(1e-3), _plan(moe_router_fusion=True)) == Kernels(7, 13)


def test_topk_calls_follow_the_switch_and_the_aux_loss():
    assert router_topk_calls(_model(1e-3), _plan()) == 2         # routing + aux-loss scores
    assert router_topk_calls(_model(0.0), _plan()) == 1          # no aux loss: routing only
    assert router_topk_calls(_model(None), _plan()) == 2         # no coefficient: exported with the default, on
    assert router_topk_calls(_model(1e-3), _plan(moe_router_fusion=True)) == 0
    m = builtin_models()["nemotron-3-ultra"]  # 4,096 tokens a rank x 512 experts: PyTorch's multi-block top-k
    assert router_topk_calls(m, _plan()) == 3  # group_limited_topk (n_group 1, topk_group 1): two, the aux loss one
    assert moe_kernel_calls(m, _plan())["topk_pass"] == 12
    assert moe_kernel_calls(m, _plan(moe_router_fusion=True))["topk_pass"] == 0
    assert moe_kernel_calls(m.model_copy(update={"router_aux_loss_coef": 0.0}), _plan())["topk_pass"] == 8


def test_the_switch_moves_the_step_time_and_vector_matches_scalar():
    m = builtin_models()["qwen3-30b-a3b"]
    cluster = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=1)
    times = {}
    for fused in (False, True):
        plan = _plan(moe_router_fusion=fused, tp=1, sp=False, dp=8, global_batch=64, seq_len=4096)
        scalar = estimate_training(m, cluster, plan)
        vec = evaluate(m, cluster, from_plan(plan))
        assert float(vec.step.total[0]) == pytest.approx(float(scalar.time.total), rel=1e-9)
        assert float(vec.memory.total[0]) == pytest.approx(float(scalar.memory.total), rel=1e-9)
        times[fused] = float(scalar.time.total)
    assert times[True] < times[False]


def _pf(**plan):
    pf = load_plan(PLANS / "moe_train.json")
    return dataclasses.replace(pf, plan=pf.plan.model_copy(update=plan))


@pytest.mark.parametrize("fused", [False, True])
def test_megatron_export_writes_the_priced_fusion(fused):
    script = render_all(_pf(moe_router_fusion=fused), "megatron")[0]["megatron_pretrain.sh"]
    assert ("--moe-router-fusion" in script) == fused
    assert "--moe-router-dtype fp32" in script


@pytest.mark.parametrize("fused,coef", [(False, 1e-3), (True, 1e-3), (False, 0.0)])
def test_bridge_overrides_write_the_priced_router(fused, coef):
    from llmplan.export.bridge import overrides
    pf = _pf(moe_router_fusion=fused)
    pf = dataclasses.replace(pf, model=builtin_models()["qwen3-30b-a3b"].model_copy(
        update={"router_aux_loss_coef": coef}))
    out = dict(overrides(pf))
    assert out["model.moe_router_fusion"] is fused and out["model.moe_router_dtype"] == "fp32"
    assert out["model.moe_router_load_balancing_type"] == ("aux_loss" if coef else "none")
    assert out["model.moe_aux_loss_coeff"] == coef
    assert aux_loss_on(pf.model) == (coef != 0)


def test_host_ops_of_the_router_follow_the_switch():
    from llmplan.cost.kernels import router_host_ops
    # MOE_CYCLE_HOST_OPS counts the fused router with its loss (7 forward kernels): eager adds 22 - 7, a fused
    # router without the loss issues 2 - 7
    assert router_host_ops(_model(1e-3), _plan(moe_router_fusion=True)) == 0
    assert router_host_ops(_model(1e-3), _plan()) == 15
    assert router_host_ops(_model(0.0), _plan(moe_router_fusion=True)) == -5


def test_cli_carries_the_switch_and_refuses_it_on_a_dense_model(cli):
    args = ("estimate", "--hardware", "dgx-h100", "--nodes", "2", "--global-batch", "256", "--json")
    on = cli(*args, "--model", "qwen3-30b-a3b", "--ep", "8", "--moe-router-fusion")
    assert on.code == 0, on.err
    assert on.json()["plan"]["moe_router_fusion"] is True
    off = cli(*args, "--model", "qwen3-30b-a3b", "--ep", "8")
    assert off.code == 0 and off.json()["plan"]["moe_router_fusion"] is False
    dense = cli(*args, "--model", "llama-3.1-8b", "--moe-router-fusion")
    assert dense.code == 2 and "moe_router_fusion" in dense.err and "Traceback" not in dense.err


def test_torchtitan_refuses_the_fused_router():
    # torchtitan's MoE router runs torch.topk eagerly: a plan priced with TE's fused router cannot be its run
    from llmplan.export.common import CannotExpress
    with pytest.raises(CannotExpress, match="moe_router_fusion"):
        render_all(_pf(moe_router_fusion=True, zero=3), "torchtitan")
