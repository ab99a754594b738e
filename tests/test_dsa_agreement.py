"""The vectorised search prices the two plan fields added at stop 69 as the one-plan estimate does:
ParallelPlan.indexer_loss (each value, DeepSeek-V3.2 and DeepSeek-V4-Flash, on H100 and GB200, where V4's fused CSA
path is priced) and ParallelPlan.bias_gelu_fusion (GPT-3 175B, a biased GeLU MLP)."""

from __future__ import annotations

import pytest

from llmplan.search.grid import Workload, default_space, enumerate_plans
from llmplan.specs.plan import ClusterSpec
from llmplan.specs.registry import builtin_models, builtin_systems

from agreement import assert_arrays_agree, valid_sample

MODELS, SYSTEMS = builtin_models(), builtin_systems()


@pytest.mark.parametrize("model", ["deepseek-v3.2", "deepseek-v4-flash"])
@pytest.mark.parametrize("system, nodes", [("dgx-h100", 32), ("gb200-nvl72", 8)])
@pytest.mark.parametrize("loss", [None, "off", "dense", "sparse"])
def test_vectorised_search_agrees_on_the_indexer_loss(model, system, nodes, loss):
    m = MODELS[model]
    cluster = ClusterSpec(system=SYSTEMS[system], num_nodes=nodes)
    w = Workload(global_batch=512, seq_len=4096, indexer_loss=loss)
    pins = {"pp": 1} if model == "deepseek-v4-flash" else {"pp": 8}
    plans = enumerate_plans(default_space(m, cluster, w, pins), cluster, w)
    idx = valid_sample(m, cluster, plans, 11, 300, 6)
    assert_arrays_agree(m, cluster, plans, idx)


@pytest.mark.parametrize("fusion", [True, False])
def test_vectorised_search_agrees_on_the_bias_gelu_fusion(fusion):
    m = MODELS["gpt3-175b"]
    cluster = ClusterSpec(system=SYSTEMS["dgx-h100"], num_nodes=16)
    w = Workload(global_batch=512, seq_len=2048, bias_gelu_fusion=fusion)
    plans = enumerate_plans(default_space(m, cluster, w, {"pp": 8}), cluster, w)
    idx = valid_sample(m, cluster, plans, 5, 300, 8)
    assert all(plans.plan(i).bias_gelu_fusion is fusion for i in idx)
    assert_arrays_agree(m, cluster, plans, idx)
