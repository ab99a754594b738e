"""Fine-grained activation offload, CUDA graphs and selective recompute together: what Megatron-Core's
TransformerConfig / TransformerLayer (NVIDIA/Megatron-LM at d98e8a64dd) demand of the plan's launch, written by the
megatron export or refused by check_plan with one line and exit 2."""

from __future__ import annotations

import json

import pytest

from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()
CLUSTER = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=1)
CAP = "--fine-grained-offloading-max-inflight-offloads"


def _saved(cli, tmp_path, *args: str, **plan_changes: object):
    """A plan file from `llmplan estimate --save`, its plan fields then edited."""
    path = tmp_path / f"plan{len(list(tmp_path.glob('plan*.json')))}.json"
    made = cli("estimate", "--hardware", "dgx-h100", "--save", path, *args)
    assert made.code == 0, made.err
    doc = json.loads(path.read_text())
    doc["plan"].update(plan_changes)
    path.write_text(json.dumps(doc))
    return path


def _megatron(cli, path, out):
    r = cli("export", path, "--to", "megatron", "-o", out)
    return r, "\n".join(p.read_text() for p in sorted(out.glob("*"))) if r.code == 0 else ""


# the flex dispatcher's hybridep backend: the one a full-iteration graph runs (check_plan cuda_graphs_flex_backend)
QWEN = ("--model", "qwen3-30b-a3b", "--ep", "8", "--seq-len", "4096", "--global-batch", "64",
        "--moe-dispatcher", "deepep", "--moe-flex-backend", "hybridep")
QWEN_OFFLOAD = (*QWEN, "--recompute", "none", "--offload-modules", "expert_fc1")


def test_full_iteration_graph_with_fine_grained_offload_writes_the_inflight_cap(cli, tmp_path):
    # transformer_config.py:2967-2975 at d98e8a64dd asserts a non-negative cap with cuda_graph_impl full_iteration;
    # 1 as Megatron-Bridge's GB300 DeepSeek-V3 full-iteration preset (perf_recipes/deepseek/gb300/deepseek_v3.py
    # at 067f987df)
    r, text = _megatron(cli, _saved(cli, tmp_path, *QWEN_OFFLOAD, cuda_graphs="full-iteration"), tmp_path / "a")
    assert r.code == 0, r.err
    assert "--cuda-graph-impl full_iteration" in text and "--offload-modules expert_fc1" in text
    assert f"{CAP} 1" in text


@pytest.mark.parametrize("graphs,modules", [("none", "expert_fc1"), ("layers", "expert_fc1"),
                                            ("full-iteration", None)])
def test_the_cap_is_written_only_where_megatron_asks_for_it(cli, tmp_path, graphs, modules):
    args = QWEN_OFFLOAD if modules else QWEN_OFFLOAD[:-2]
    r, text = _megatron(cli, _saved(cli, tmp_path, *args, cuda_graphs=graphs), tmp_path / "b")
    assert r.code == 0, r.err
    assert CAP not in text and ("--fine-grained-activation-offloading" in text) == bool(modules)


def test_norm_offloads_under_layer_graphs_are_refused_exit_2(cli, tmp_path):
    # transformer_layer.py:1563-1597 at d98e8a64dd: attn_norm off with the attn graph, an MoE layer's mlp_norm off
    # with the attn / moe_router graphs (a warning, no offload): the priced HBM would stay held
    path = _saved(cli, tmp_path, *QWEN_OFFLOAD[:-1], "expert_fc1,attn_norm,mlp_norm", cuda_graphs="layers")
    r = cli("export", path, "--to", "megatron", "-o", tmp_path / "c")
    assert r.code == 2 and "Traceback" not in r.err
    assert "offload_modules attn_norm, mlp_norm with cuda_graphs layers" in r.err
    assert "drop attn_norm, mlp_norm from --offload-modules" in r.err
    full = ParallelPlan(dp=8, ep=8, seq_len=4096, global_batch=64, recompute="none", moe_dispatcher="deepep",
                        offload_modules=("attn_norm", "mlp_norm"), cuda_graphs="full-iteration")
    assert not [v for v in check_plan(M["qwen3-30b-a3b"], full, CLUSTER) if v.rule == "offload_norm_graphs"]


@pytest.mark.parametrize("graphs,modules,named", [
    ("layers", (), "core_attn"),  # Megatron's default recompute module, attention graphed
    ("layers", ("mlp", "layernorm"), "mlp"),  # a dense model's layer graphs capture its MLP
    ("full-iteration", ("core_attn", "mlp"), "core_attn, mlp"),
])
def test_graphed_recompute_with_dropout_is_refused(graphs, modules, named):
    # transformer_config.py:2870-2905 at d98e8a64dd; gpt-1.7b keeps dropout 0.1 (model_specs/gpt-1.7b.yaml)
    m = M["gpt-1.7b"]
    assert m.attention_dropout > 0 and m.hidden_dropout > 0
    plan = ParallelPlan(dp=8, seq_len=2048, global_batch=64, recompute="selective", recompute_modules=modules,
                        cuda_graphs=graphs)
    got = [v.message for v in check_plan(m, plan, CLUSTER) if v.rule == "cuda_graphs_recompute_dropout"]
    assert len(got) == 1 and f"recompute module {named} and dropout" in got[0] and "--recompute-modules" in got[0]
    for ok in (plan.model_copy(update={"cuda_graphs": "none"}), plan.model_copy(update={"recompute": "none",
                                                                                      "recompute_modules": ()})):
        assert not [v for v in check_plan(m, ok, CLUSTER) if v.rule == "cuda_graphs_recompute_dropout"]
    # no dropout, no rule: the same plan on a model without it
    assert not [v for v in check_plan(M["llama-3.1-8b"], plan, CLUSTER) if v.rule == "cuda_graphs_recompute_dropout"]


def test_layer_graphs_leave_an_moe_models_mlp_recompute_alone():
    # cuda_graph_pairs graphs attn moe_router moe_preprocess on an MoE model: its dense MLP is not captured
    m = M["qwen3-30b-a3b"].model_copy(update={"hidden_dropout": 0.1})
    plan = ParallelPlan(dp=8, ep=8, seq_len=4096, global_batch=64, recompute="selective",
                        recompute_modules=("mlp",), cuda_graphs="layers")
    assert not [v for v in check_plan(m, plan, CLUSTER) if v.rule == "cuda_graphs_recompute_dropout"]
    full = plan.model_copy(update={"cuda_graphs": "full-iteration", "moe_dispatcher": "deepep",
                                   "moe_flex_backend": "hybridep"})
    got = [v.message for v in check_plan(m, full, CLUSTER) if v.rule == "cuda_graphs_recompute_dropout"]
    assert len(got) == 1 and "recompute module mlp and dropout" in got[0]


def test_moe_recompute_leaves_the_router_out_of_the_layer_graphs(cli, tmp_path):
    # transformer_config.py:2862-2869 at d98e8a64dd: TE per-layer graphs refuse recompute module moe with moe_router
    # in cuda_graph_modules; the export graphs the attention alone then
    args = (*QWEN, "--recompute", "selective", "--recompute-modules", "moe")
    r, text = _megatron(cli, _saved(cli, tmp_path, *args, cuda_graphs="layers"), tmp_path / "d")
    assert r.code == 0, r.err
    assert "--recompute-modules moe" in text and "--cuda-graph-modules attn" in text and "moe_router" not in text
    r, text = _megatron(cli, _saved(cli, tmp_path, *QWEN, "--recompute", "selective", "--recompute-modules",
                                    "moe_act", cuda_graphs="layers"), tmp_path / "e")
    assert r.code == 0, r.err
    assert "--cuda-graph-modules attn moe_router moe_preprocess" in text


def test_mhc_recompute_with_fine_grained_offload_is_refused():
    # transformer_config.py:2045-2051 at d98e8a64dd: NotImplementedError
    m = M["deepseek-v4-flash"]
    plan = ParallelPlan(dp=8, ep=8, seq_len=4096, global_batch=64, recompute="selective",
                        recompute_modules=("mhc",), offload_moe_act=True)
    got = [v.message for v in check_plan(m, plan, CLUSTER) if v.rule == "offload_modules_mhc"]
    assert len(got) == 1 and "drop mhc from --recompute-modules" in got[0]
    assert not [v for v in check_plan(m, plan.model_copy(update={"offload_moe_act": False}), CLUSTER)
                if v.rule == "offload_modules_mhc"]
