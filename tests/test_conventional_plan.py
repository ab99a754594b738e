"""The search's conventional plan (search.run.conventional_plan, docs/validation.md#conv-ep): dense models keep TP
over the node; an MoE model runs what the MoE recipes run first, expert parallelism inside one NVLink domain with
expert TP 1 (Megatron-LM d98e8a64dd megatron/core/transformer/moe/README.md, "Best Practices", guidelines 1, 2
and 4), not ep 1 with every rank holding every expert."""

from __future__ import annotations

import pytest

from llmplan.cost.memory import training_memory
from llmplan.search.grid import Workload
from llmplan.search.run import conventional_layouts, conventional_moe_plan, conventional_plan
from llmplan.specs.check import balanced_split, check_plan, valid_tp
from llmplan.specs.defaults import min_headroom_bytes
from llmplan.specs.plan import ClusterSpec
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.specs.stages import divisors
from llmplan.topology.placement import DEFAULT_ORDER, place

M, S = builtin_models(), builtin_systems()


def _conventional(model: str, system: str, nodes: int, **fields):
    m, cluster = M[model], ClusterSpec(system=S[system], num_nodes=nodes)
    w = Workload(global_batch=1024, seq_len=4096, **fields)
    headroom = min_headroom_bytes(None, cluster.system.gpu.hbm_bytes)
    return m, cluster, w, headroom, conventional_plan(m, cluster, w, None, DEFAULT_ORDER, headroom)


def _fits(m, cluster, plan, headroom) -> bool:
    gpu = cluster.system.gpu
    mem = training_memory(m, plan, gpu.hbm_bytes, None, gpu.fp8_tn_only, gpu.nccl_sms, gpu.compute_capability,
                          gpu.sparse_gather_efficiency is not None)
    return float(mem.headroom) >= headroom


@pytest.mark.parametrize("model,system,nodes,fields", [
    ("qwen3-30b-a3b", "dgx-h100", 4, {}),
    ("mixtral-8x7b", "dgx-h100", 2, {}),
    ("mixtral-8x7b", "dgx-h100", 2, {"ep_comm_overlap": True}),  # pp > 1 then needs vpp >= 2 (Megatron-Core)
    ("qwen3-30b-a3b", "gb200-nvl72", 16, {}),  # 64 GPUs in one 72-GPU NVLink domain of 4-GPU trays
])
def test_moe_conventional_plan_runs_ep_inside_one_nvlink_domain_at_expert_tp_1(model, system, nodes, fields):
    m, cluster, w, headroom, e = _conventional(model, system, nodes, **fields)
    assert e is not None
    p = e.plan
    assert p.ep > 1 and p.etp_resolved == 1 and m.num_experts % p.ep == 0
    assert place(p.degrees, cluster, DEFAULT_ORDER)["ep"].domains == 1  # the EP all-to-all stays on NVLink
    assert not check_plan(m, p, cluster) and _fits(m, cluster, p, headroom)
    for wider in (e for e in divisors(m.num_experts) if e > p.ep):  # the largest EP that stays in the domain
        q = p.model_copy(update={"ep": wider})
        assert (p.tp * p.dp) % wider or place(q.degrees, cluster, DEFAULT_ORDER)["ep"].domains > 1 \
            or check_plan(m, q, cluster)
    # ... and it is the first layout of the rule that does: every layout tried before it at the same recompute
    # either has no valid in-domain EP plan or does not fit
    n, tps = cluster.num_gpus, [t for t in valid_tp(m, cluster.gpus_per_node_used) if cluster.num_gpus % t == 0]
    for tp, pp in conventional_layouts(m, n, tps):
        if (tp, pp) == (p.tp, p.pp):
            break
        first, last = balanced_split(m.num_hidden_layers, pp)
        dp = n // (tp * pp)
        before = conventional_moe_plan(m, cluster, w.plan(
            tp=tp, pp=pp, pp_first=first, pp_last=last, dp=dp, sp=tp > 1, zero=1 if dp > 1 else 0,
            recompute=p.recompute, micro_batch=1), DEFAULT_ORDER)
        assert before is None or not _fits(m, cluster, before, headroom)
    else:
        pytest.fail("the conventional plan's layout is not one conventional_layouts tries")


def test_qwen3_30b_a3b_conventional_plan_is_the_recipes_kind():
    # 128 experts on 8-GPU DGX H100 NVLink domains: the largest EP dividing 128 inside a domain is 8; the least
    # model parallelism, tp 1 pp 1, fits (about 5.1 B weights a GPU: 1.5 B attention and embeddings on every
    # rank plus 1/8 of the 29.0 B expert weights, 48 x 128 x 3 x 2048 x 768). Megatron-Bridge 067f987df0 perf_recipes
    # qwen/h100/qwen3_moe.py runs this model at tp 1 pp 1 ep 8-16, etp 1.
    _, _, _, _, e = _conventional("qwen3-30b-a3b", "dgx-h100", 4)
    p = e.plan
    assert (p.tp, p.pp, p.dp, p.ep, p.etp_resolved, p.zero, p.micro_batch) == (1, 1, 32, 8, 1, 1, 1)
    assert p.recompute == "selective"


def test_dense_conventional_plan_is_unchanged():
    # llama-3.1-70b on 8 x DGX H100: TP over the node (64 heads, 8 KV heads: tp 8), one stage fits at ZeRO-1
    # over dp 8, sequence parallel, selective, mb 1 -- the plan the dense rule always gave (main 519be21f)
    m, cluster, _, _, e = _conventional("llama-3.1-70b", "dgx-h100", 8)
    p = e.plan
    assert (p.tp, p.pp, p.dp, p.cp, p.ep, p.vpp, p.zero, p.sp, p.micro_batch) == (8, 1, 8, 1, 1, 1, 1, True, 1)
    assert p.recompute == "selective" and p.etp_resolved == 8
    assert conventional_layouts(m, 64, [1, 2, 4, 8]) == [(8, 1), (8, 2), (8, 4), (8, 8)]


def test_moe_layouts_least_model_parallelism_first():
    # guideline 1 (keep TP / EP / PP small): tp x pp ascending, the smaller TP on a tie
    m = M["mixtral-8x7b"]
    assert conventional_layouts(m, 16, [1, 2, 4, 8])[:5] == [(1, 1), (1, 2), (2, 1), (1, 4), (2, 2)]
    assert conventional_layouts(m, 16, []) == []
