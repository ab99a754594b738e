"""Uneven pipeline stages (issue 12): the production layouts that do not split evenly are accepted, fit, and
reach the search; the most-loaded stage is found by evaluating every stage; bad layouts are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmplan.cost.memory import activation_bytes, inflight_microbatches, layer_activation_bytes, stage_memory
from llmplan.cost.params import attention_params_per_rank, mlp_params, norm_params, padded_vocab, rank_params
from llmplan.estimate import estimate_training
from llmplan.search.grid import Workload, default_space, pipeline_layouts
from llmplan.search.run import search
from llmplan.specs.check import balanced_split
from llmplan.specs.plan import ClusterSpec, MemoryAllowance, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems, resolve_model
from llmplan.units import GIB

M = builtin_models()
S = builtin_systems()
BLOOM = Path(__file__).parent / "data" / "hf" / "bloom-176b.config.json"  # bigscience/bloom config.json


def test_llama3_405b_pp16_is_accepted_and_fits(cli):
    # Llama 3 paper (Dubey et al. 2024, Table 4 and §3.3.2): TP8 PP16 on 16,384 H100, seq 8192, 16M tokens
    # per step (2,048 sequences), first and last stage one layer lighter (7 + 8 x 14 + 7 = 126). The paper states
    # it pre-trained at 8K "without activation checkpointing" (§3.3.2) with its own pipeline schedule (N tunable);
    # under plain 1F1B, 15 micro-batches of 8 layers in flight need 84 GiB, so this split recomputes in full
    # (tests/test_llama3_8k_memory.py: the no-recompute fit is an open xfail).
    r = cli("estimate", "--model", "llama-3.1-405b", "--hardware", "dgx-h100", "--nodes", "2048", "--tp", "8",
            "--pp", "16", "--pp-first-layers", "7", "--pp-last-layers", "7", "--seq-len", "8192",
            "--global-batch", "2048", "--zero", "1", "--recompute", "full", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["stage_layers"] == [7] + [8] * 14 + [7]
    assert doc["memory"]["fits"] and doc["plan"]["dp"] == 128


def test_deepseek_v3_pp16_ep64_is_accepted(cli):
    # DeepSeek-V3 technical report (arXiv:2412.19437 §3.2): PP16, EP64 (over 8 nodes), ZeRO-1, 2,048 H800.
    r = cli("estimate", "--model", "deepseek-v3", "--hardware", "dgx-h800", "--nodes", "256", "--pp", "16",
            "--pp-first-layers", "3", "--pp-last-layers", "2", "--ep", "64", "--etp", "1", "--zero", "1",
            "--recompute", "full", "--seq-len", "4096", "--global-batch", "4096", "--json")
    assert r.code == 0, r.err
    assert r.json()["stage_layers"] == [3] + [4] * 14 + [2]


def test_bloom_176b_tp4_pp12_from_config_json(cli):
    # BLOOM (Le Scao et al. 2022, §3.4): TP4 PP12 DP8 on 48 nodes of 8 A100 80GB, ZeRO-1, the embedding and
    # the loss counted as pipeline layers (Megatron-DeepSpeed), micro-batch 2, global batch 2048, seq 2048.
    r = cli("estimate", "--model", BLOOM, "--hardware", "dgx-a100", "--nodes", "48", "--tp", "4", "--pp", "12",
            "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split", "--zero", "1",
            "--micro-batch", "2", "--global-batch", "2048", "--seq-len", "2048", "--recompute", "full", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["stage_layers"] == [5] + [6] * 10 + [5]
    assert doc["params"]["total"] == pytest.approx(176.2e9, rel=0.005)  # "176B parameters", model card
    assert doc["memory"]["fits"]


def test_search_finds_the_pp16_plan_for_405b():
    m, cluster = M["llama-3.1-405b"], ClusterSpec(system=S["dgx-h100"], num_nodes=2048)
    w = Workload(global_batch=2048, seq_len=8192)
    space = default_space(m, cluster, w)
    assert (16, 1, 7, 7) in space.pipeline  # the balanced uneven split is enumerated, not rejected
    assert (18, 7, 0, 0) not in space.pipeline  # 18 does not divide 16,384 GPUs
    res = search(m, cluster, default_space(m, cluster, w, {"pp": 16, "tp": 8}), w, top=3)
    assert res.ranked and all(e.plan.pp == 16 and e.stage_layers == (7,) + (8,) * 14 + (7,) for e in res.ranked)


def test_interleaving_any_count_the_layout_allows():
    # 126 layers on 18 stages of 7: vpp 7 (one layer per virtual stage) is tried, 2 is not.
    layouts = pipeline_layouts(126, 18 * 8, 18, {"pp": 18})
    assert {v for _, v, _, _ in layouts} == {1, 7}


@pytest.mark.parametrize("L,p,expected", [(126, 16, (7, 7)), (61, 16, (3, 2)), (70, 12, (5, 5)), (94, 8, (11, 11)),
                                          (80, 8, (0, 0)), (7, 2, (4, 3))])
def test_balanced_split(L, p, expected):
    first, last = balanced_split(L, p)
    assert (first, last) == expected
    if first:
        middle = (L - first - last) // (p - 2) if p > 2 else 0
        assert first + last + middle * (p - 2) == L and max(first, last) <= max(middle, first)


def test_most_loaded_stage_is_the_sum_of_its_layers():
    # An explicit list: the heaviest stage's parameters are its layers' parameters (plus the embedding on
    # stage 0, the output layer on the last), and the estimate reports the stage with the most memory.
    m = M["llama-3.1-8b"]
    plan = ParallelPlan(tp=2, pp=3, dp=1, pp_layers=(6, 14, 12), global_batch=8, sp=True, zero=1)
    t, h = 2, m.hidden_size
    per_layer = attention_params_per_rank(m, t) + mlp_params(m, m.intermediate_size) / t + 2 * norm_params(m)
    V = padded_vocab(m.vocab_size, t)
    assert rank_params(m, plan, 1).dense == pytest.approx(14 * per_layer)
    assert rank_params(m, plan, 0).dense == pytest.approx(6 * per_layer + V * h / t)
    assert rank_params(m, plan, 2).dense == pytest.approx(12 * per_layer + V * h / t + norm_params(m))
    act = activation_bytes(m, plan, 1)
    assert act.layers == pytest.approx(inflight_microbatches(plan, 1) * 14 * layer_activation_bytes(m, plan, False))
    cap = 80 * GIB
    # on the H100 (compute capability 9.0: PyTorch's 32 MiB cuBLAS workspace, docs/formulas.md#mem.runtime)
    stages = [stage_memory(m, plan, i, MemoryAllowance(), cap, compute_capability=9.0) for i in range(3)]
    e = estimate_training(m, ClusterSpec(system=S["dgx-h100"], num_nodes=1, gpus_per_node=6), plan)
    assert float(e.memory.total) == pytest.approx(max(float(s.total) for s in stages))
    assert int(e.memory.stage) == max(range(3), key=lambda i: float(stages[i].total))


def test_uneven_pipeline_is_paced_by_its_slowest_stage():
    # 1F1B over stages of unequal time: n micro-batches at the slowest stage's pace plus one pass through
    # the others. Each stage's time is built here from its own layers (stage_compute), independently of
    # the step-time code's choice of candidate stages.
    from llmplan.cost.compute import stage_compute
    from llmplan.cost.params import stage_layers

    m, gpu = M["llama-3.1-8b"], S["dgx-h100"].gpu
    cluster = ClusterSpec(system=S["dgx-h100"], num_nodes=1, gpus_per_node=3)
    times = {}
    for layers in [(6, 14, 12), (10, 11, 11)]:
        plan = ParallelPlan(pp=3, dp=1, pp_layers=layers, global_batch=8, tp_comm_overlap=False)
        t = [float(stage_compute(m, plan, gpu, *stage_layers(m, plan, i), i == 2).total) for i in range(3)]
        e = estimate_training(m, cluster, plan)
        assert float(e.time.compute) == pytest.approx(8 * max(t), rel=1e-9)
        assert float(e.time.bubble) == pytest.approx(sum(t) - max(t), rel=1e-9)
        times[layers] = float(e.time.total)
    assert times[(10, 11, 11)] < times[(6, 14, 12)]


@pytest.mark.parametrize("args,needle", [
    (["--pp", "3", "--pp-layers", "10,10,10"], "must sum to num_hidden_layers (32)"),
    (["--pp", "3", "--pp-layers", "0,16,16"], "a stage has no layer"),
    (["--pp", "33"], "pp (33) exceeds num_hidden_layers (32)"),
    (["--pp", "3", "--pp-layers", "10,22"], "--pp-layers lists 2 stage(s) but --pp is 3"),
    (["--pp", "3", "--pp-layers", "10,x,11"], "give one whole number of layers per stage"),
    (["--pp", "3"], "--pp-first-layers 11 --pp-last-layers 10 (11 on each of the other 1 stages)"),
    (["--pp", "4", "--pp-first-layers", "7"], "for example pp 4 splits the 32 layers evenly"),
])
def test_bad_layouts_exit_2_naming_the_rule(cli, args, needle):
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "33", "--global-batch", "64",
            *args)
    assert r.code == 2 and needle in r.err, r.err
    assert "Traceback" not in r.err


def test_account_for_embedding_needs_a_divisible_count(cli):
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--pp", "4",
            "--account-for-embedding-in-pipeline-split")
    assert r.code == 2 and "pp (4) must divide num_hidden_layers + 1 (33)" in r.err and "valid pp: 3, 11" in r.err


def test_old_plan_files_still_load():
    # Schema-1 plan files written before uneven stages have no pp_first / pp_last / pp_layers keys.
    from llmplan.planfile import load_plan

    pf = load_plan(Path(__file__).parent / "data" / "plans" / "dense_train.json")
    assert pf.plan.pp_first == 0 and pf.plan.pp_layers is None


def test_bloom_spec_from_config(tmp_path):
    m = resolve_model(str(BLOOM))
    assert (m.num_hidden_layers, m.num_attention_heads, m.hidden_size, m.tie_word_embeddings) == (70, 112, 14336, True)


def test_mtp_module_sits_on_the_last_stage():
    # DeepSeek-V3 (arXiv:2412.19437 §2.2): one multi-token-prediction module, a full MoE layer with a 2h -> h
    # projection, on the last stage; the published 671B excludes it.
    from llmplan.cost.params import param_counts

    m = M["deepseek-v3"]
    assert m.num_nextn_predict_layers == 1
    assert param_counts(m).total == pytest.approx(671e9, rel=0.005)
    no_mtp = m.model_copy(update={"num_nextn_predict_layers": 0})
    plan = ParallelPlan(pp=16, pp_first=3, pp_last=2, dp=8, ep=8, etp=1, global_batch=64, seq_len=4096)
    last, first = rank_params(m, plan, 15), rank_params(m, plan, 0)
    last0 = rank_params(no_mtp, plan, 15)
    per_moe_layer = (rank_params(m, plan, 1).total) / 4  # a middle stage holds 4 MoE layers
    assert last.total - last0.total == pytest.approx(per_moe_layer + 2 * m.hidden_size**2, rel=0.01)
    assert first.total == rank_params(no_mtp, plan, 0).total


def test_interleaving_with_the_embedding_and_loss_counted(tmp_path):
    # Megatron-LM's Llama 3 405B example: PP8 with 8 virtual stages over 126 layers works because the embedding
    # and the loss count as layers ((126 + 2) / 8 = 16 per stage, 2 per virtual stage); the first and last
    # stages hold 15 layers, their outer virtual stage one layer and the embedding / the loss.
    import json

    from llmplan.export import megatron
    from llmplan.planfile import load_plan

    m = M["llama-3.1-405b"]
    plan = ParallelPlan(tp=8, pp=8, pp_first=15, pp_last=15, vpp=8, dp=2, global_batch=64, seq_len=8192, sp=True,
                        zero=1, recompute="full")
    assert (8, 8, 15, 15) in pipeline_layouts(126, 128, 8, {"pp": 8})
    cluster = ClusterSpec(system=S["dgx-h100"], num_nodes=16)
    e = estimate_training(m, cluster, plan)
    assert e.stage_layers == (15,) + (16,) * 6 + (15,)
    doc = json.loads((Path(__file__).parent / "data" / "plans" / "uneven_train.json").read_text())
    doc.update(nodes=16, model_ref=None)
    doc["plan"].update(pp=8, pp_first=15, pp_last=15, vpp=8, dp=2, global_batch=64, recompute="full")
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    flags = " ".join(megatron.parallel_flags(load_plan(path)))
    layout = flags.split("--pipeline-model-parallel-layout ")[1].split()[0].strip('"')
    stages = layout.split("|")
    assert len(stages) == 64 and stages[0] == "Et" and stages[-1] == "t,L"
    assert sum(int(x.split("*")[1].split(",")[0]) if "*" in x else x.count("t") for x in stages) == 126
