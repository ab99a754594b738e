"""check_plan's cp_fused_attention rule: context parallelism with flash attention off is refused. Megatron-Core's
unfused attention core asserts it runs without CP (NVIDIA/Megatron-LM@d98e8a64dd
megatron/core/transformer/dot_product_attention.py, DotProductAttention.__init__: `context_parallel_size == 1`,
"Context parallelism is only supported by TEDotProductAttention!"), and PyTorch's context-parallel ring replaces
only the flash, memory-efficient and cuDNN SDPA kernels (pytorch/pytorch v2.13
torch/distributed/tensor/experimental/_context_parallel/_attention.py), so no launcher runs the unfused scores of a
1/cp sequence shard that such a plan would price (fused_softmax_fits would read s/cp as the key length)."""

from __future__ import annotations

import numpy as np

from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import resolve_model, resolve_system

PLAN = ("--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--tp", "2", "--cp", "2", "--pp", "1",
        "--seq-len", "8192", "--global-batch", "16", "--micro-batch", "1")


def test_cli_refuses_cp_without_fused_attention(cli):
    r = cli("estimate", *PLAN, "--no-flash-attention")
    assert r.code == 2
    assert r.err == (
        "error: the plan breaks a rule: cp 2 with flash_attention off: context parallelism runs only inside a fused "
        "attention kernel (Megatron-Core's unfused DotProductAttention asserts context_parallel_size == 1, 'only "
        "supported by TEDotProductAttention'; PyTorch's ring replaces only the fused SDPA kernels); use "
        "--flash-attention or --cp 1\n")


def test_fused_attention_or_cp1_pass(cli):
    assert cli("estimate", *PLAN).code == 0
    cp1 = list(PLAN)
    cp1[cp1.index("--cp") + 1] = "1"
    assert cli("estimate", *cp1, "--no-flash-attention").code == 0


def test_every_cp_implementation_is_refused_unfused():
    m = resolve_model("llama-3.1-8b")
    base = dict(tp=2, pp=1, dp=2, cp=2, seq_len=8192, global_batch=16, micro_batch=1, flash_attention=False)
    for impl in ("te", "torch-alltoall", "torch-allgather"):
        rules = [v.rule for v in check_plan(m, ParallelPlan(**base, cp_impl=impl))]
        assert rules.count("cp_fused_attention") == 1, (impl, rules)


def test_search_proposes_no_cp_without_fused_attention():
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    from llmplan.search.run import rule_cuts, search
    m, cluster = resolve_model("llama-3.1-8b"), ClusterSpec(system=resolve_system("dgx-h100"), num_nodes=1)
    w = Workload(global_batch=16, seq_len=16384, flash_attention=False)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    cuts = {r.name: ok for r, ok in rule_cuts(m, plans, cluster)}
    assert np.array_equal(cuts["cp_fused_attention"], np.asarray(plans.cp) == 1)  # the search's arrays: the rule
    res = search(m, cluster, default_space(m, cluster, w), w, top=5)
    assert {x.rule: x.count for x in res.pruned}["cp_fused_attention"] > 0
    assert res.ranked and all(e.plan.cp == 1 for e in res.ranked)
