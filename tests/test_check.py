"""check_plan: each rule fires with the values and valid alternatives in its message."""

from __future__ import annotations

from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()
H100 = builtin_systems()["dgx-h100"]
A100 = builtin_systems()["dgx-a100"]


def rules(model, cluster=None, **kw):
    return {v.rule: v.message for v in check_plan(M[model], ParallelPlan(**kw), cluster)}


def test_valid_plan_has_no_violations():
    cluster = ClusterSpec(system=H100, num_nodes=8)
    assert rules("llama-3.1-70b", cluster, tp=8, pp=4, dp=2, sp=True, global_batch=64) == {}


def test_tp_must_divide_kv_heads_or_be_a_multiple():
    # 8 KV heads: tp 16 replicates them (allowed); tp 3 is neither.
    assert "tp_kv_heads" not in rules("llama-3.1-70b", tp=16)
    msg = rules("llama-3.1-70b", tp=3)["tp_heads"]
    assert "tp (3) must divide num_attention_heads (64) of llama-3.1-70b" in msg
    assert "valid tp: 1, 2, 4, 8, 16, 32, 64" in msg


def test_kv_rule_message():
    # qwen3-30b-a3b: 32 heads, 4 KV heads; tp 8 is a multiple of 4 (replicated) -> fine.
    assert "tp_kv_heads" not in rules("qwen3-30b-a3b", tp=8)


def test_pp_and_vpp_divide_layers():
    assert "valid pp: 1, 2, 4, 5, 8, 10, 16, 20, 40, 80" in rules("llama-3.1-70b", pp=3)["pp_layers"]
    msg = rules("llama-3.1-70b", pp=4, vpp=3, global_batch=8)["vpp_layers"]
    assert "vpp (3) must divide the 20 layers per pipeline stage" in msg and "valid vpp: 1, 2, 4, 5, 10, 20" in msg
    assert "vpp_needs_pp" in rules("llama-3.1-70b", vpp=2)


def test_ep_rules():
    assert "ep_dense" in rules("llama-3.1-8b", ep=2)
    msg = rules("mixtral-8x7b", ep=3, dp=3, global_batch=3)["ep_experts"]
    assert "ep (3) must divide the 8 experts of mixtral-8x7b; valid ep: 1, 2, 4, 8" in msg
    assert "expert_grid" in rules("mixtral-8x7b", ep=8, dp=2, global_batch=2, etp=1)


def test_batch_sp_cp_context():
    msg = rules("llama-3.1-8b", dp=4, micro_batch=3, global_batch=64)["global_batch"]
    assert "global_batch (64) must be divisible by micro_batch x dp (3 x 4 = 12)" in msg
    assert "valid micro_batch: 1, 2, 4, 8, 16" in msg
    assert "sp_needs_tp" in rules("llama-3.1-8b", sp=True)
    assert "2*cp (8)" in rules("llama-3.1-8b", cp=4, seq_len=4100)["cp_seq"]
    msg = rules("llama-2-7b", seq_len=8192)["seq_len_context"]
    assert "exceeds max_position_embeddings (4096) of llama-2-7b" in msg


def test_cluster_rules():
    cluster = ClusterSpec(system=H100, num_nodes=2)
    msg = rules("llama-3.1-8b", cluster, tp=3)["gpus_model_parallel"]
    assert "must divide the 16 GPUs (2 nodes x 8)" in msg
    assert "dp must be 8" in rules("llama-3.1-8b", cluster, tp=2, dp=4, global_batch=4)["gpus_dp"]
    a100 = ClusterSpec(system=A100, num_nodes=1)
    msg = rules("llama-3.1-8b", a100, dp=8, global_batch=8, dtype="fp8")["dtype_hardware"]
    assert "a100-80gb has no fp8 tensor cores" in msg


def test_every_violation_is_listed():
    out = check_plan(M["llama-3.1-70b"], ParallelPlan(tp=3, pp=3, ep=2, sp=False, global_batch=1))
    assert {v.rule for v in out} >= {"tp_heads", "pp_layers", "ep_dense"}
