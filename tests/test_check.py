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


def test_training_tp_must_divide_kv_heads():
    # Megatron's num_query_groups rule: 8 KV heads, tp 16 is refused for training, with the valid degrees.
    msg = rules("llama-3.1-70b", tp=16)["tp_kv_heads"]
    assert "tp (16) must divide num_key_value_heads (8) of llama-3.1-70b" in msg and "valid tp: 1, 2, 4, 8" in msg
    msg = rules("llama-3.1-70b", tp=3)["tp_heads"]
    assert "tp (3) must divide num_attention_heads (64) of llama-3.1-70b" in msg
    assert "valid tp: 1, 2, 4, 8" in msg


def test_serving_may_replicate_kv_heads():
    from llmplan.specs.check import check_serve_plan
    from llmplan.specs.serve import ServeJob, ServePlan

    v = check_serve_plan(M["llama-3.1-70b"], ServePlan(tp=16), ServeJob())
    assert not [x for x in v if x.rule.startswith("tp_")]
    v = check_serve_plan(M["llama-3.1-70b"], ServePlan(tp=32), ServeJob())
    assert not [x for x in v if x.rule.startswith("tp_")]


def test_serving_rules_speak_of_serving():
    """A serving plan's violations name its own knobs (replicas, an even split), never a training flag or cp."""
    from llmplan.specs.check import check_serve_plan
    from llmplan.specs.serve import ServeJob, ServePlan

    cluster = ClusterSpec(system=H100, num_nodes=2)
    v = {x.rule: x.message for x in check_serve_plan(M["llama-3.1-70b"], ServePlan(tp=8, pp=3), ServeJob(), cluster)}
    assert "pp (3) must divide num_hidden_layers (80) of llama-3.1-70b" in v["pp_layers"]
    assert "tp x pp (8 x 3 = 24) must divide the 16 GPUs (2 nodes x 8)" in v["gpus_model_parallel"]
    v = {x.rule: x.message for x in check_serve_plan(M["llama-3.1-70b"], ServePlan(tp=4, dp=2), ServeJob(), cluster)}
    assert "tp x pp x replicas (4 x 2 = 8) must equal the 16 GPUs; --dp (replicas) must be 4" in v["gpus_dp"]
    v = check_serve_plan(M["llama-3.1-8b"], ServePlan(tp=3, pp=5, ep=2), ServeJob(), cluster)
    assert {x.rule for x in v} >= {"tp_heads", "pp_layers", "ep_dense", "gpus_model_parallel"}
    for x in v:
        assert "cp" not in x.message.split() and "--pp-first-layers" not in x.message and "--etp" not in x.message


def test_even_pp_and_vpp():
    assert rules("llama-3.1-70b", pp=4, vpp=5, global_batch=8) == {}
    msg = rules("llama-3.1-70b", pp=4, vpp=3, global_batch=8)["vpp_layers"]
    assert "vpp (3) must divide the layers of every pipeline stage" in msg and "valid vpp: 1, 2, 4, 5, 10, 20" in msg
    assert "vpp_needs_pp" in rules("llama-3.1-70b", vpp=2)


def test_uneven_pp_needs_a_split_and_names_one():
    # 126 layers over 16 stages: refused as an even split, with the balanced split as the example.
    msg = rules("llama-3.1-405b", pp=16, global_batch=16)["pp_layers"]
    assert "pp (16) does not divide num_hidden_layers (126)" in msg
    assert "--pp-first-layers 7 --pp-last-layers 7 (8 on each of the other 14 stages)" in msg
    assert rules("llama-3.1-405b", pp=16, pp_first=7, pp_last=7, global_batch=16) == {}
    assert rules("llama-3.1-405b", pp=3, pp_layers=(40, 40, 46), global_batch=16) == {}


def test_explicit_layout_interleaves_like_first_last_pins():
    # Llama 3 405B as Meta split it (Dubey et al. 2024 §3.3.2: one layer fewer on the first and the last
    # stage): --pp-layers 7,8,...,8,7 interleaves exactly as --pp-first-layers 7 --pp-last-layers 7 does, the
    # embedding and the loss taking the short stages' free slot.
    meta = (7,) + (8,) * 14 + (7,)
    for v in (2, 4, 8):
        assert rules("llama-3.1-405b", pp=16, pp_layers=meta, vpp=v, global_batch=32) == {}
        assert rules("llama-3.1-405b", pp=16, pp_first=7, pp_last=7, vpp=v, global_batch=32) == {}
    msg = rules("llama-3.1-405b", pp=16, pp_layers=meta, vpp=3, global_batch=32)["vpp_layers"]
    assert "valid vpp: 1, 2, 4, 8" in msg
    # A middle stage that v does not divide is refused.
    assert "vpp_layers" in rules("llama-3.1-405b", pp=3, pp_layers=(40, 43, 43), vpp=2, global_batch=32)


def test_bad_layouts_name_the_rule():
    # Does not sum to the layers; a zero-layer stage; more stages than layers; pins that leave an uneven rest.
    msg = rules("llama-3.1-405b", pp=3, pp_layers=(40, 40, 40))["pp_layers"]
    assert "must sum to num_hidden_layers (126)" in msg and "they sum to 120" in msg
    msg = rules("llama-3.1-405b", pp=3, pp_layers=(0, 80, 46))["pp_layers"]
    assert "a stage has no layer" in msg
    msg = rules("llama-3.1-8b", pp=33)["pp_layers"]
    assert "pp (33) exceeds num_hidden_layers (32)" in msg
    msg = rules("llama-3.1-405b", pp=16, pp_first=6, pp_last=7, global_batch=16)["pp_layers"]
    assert "leave 113 of the 126 layers" in msg and "--pp-first-layers 7 --pp-last-layers 7" in msg


def test_interleaving_needs_as_many_microbatches_as_stages():
    # Megatron-Core's interleaved schedule: whole groups of p micro-batches (schedules.py at d98e8a6 raises on a
    # partial last group). 4 and 8 micro-batches over 4 stages pass; 2 and 6 do not.
    assert "vpp_microbatches" not in rules("llama-3.1-70b", pp=4, vpp=2, global_batch=4)
    assert "vpp_microbatches" not in rules("llama-3.1-70b", pp=4, vpp=2, global_batch=8)
    msg = rules("llama-3.1-70b", pp=4, vpp=2, global_batch=2)["vpp_microbatches"]
    assert "whole number of groups of pp (4) micro-batches" in msg and "gives 2" in msg
    assert "gives 6" in rules("llama-3.1-70b", pp=4, vpp=2, global_batch=6)["vpp_microbatches"]
    # Any interleave the layout allows: 126 layers, pp 18, vpp 7 (one layer per virtual stage).
    assert rules("llama-3.1-405b", pp=18, vpp=7, global_batch=18) == {}
    assert "valid vpp: 1, 7" in rules("llama-3.1-405b", pp=18, vpp=2, global_batch=18)["vpp_layers"]


def test_ep_rules():
    assert "ep_dense" in rules("llama-3.1-8b", ep=2)
    msg = rules("mixtral-8x7b", ep=3, dp=3, global_batch=3)["ep_experts"]
    assert "ep (3) must divide the 8 experts of mixtral-8x7b; valid ep: 1, 2, 4, 8" in msg
    assert "expert_grid" in rules("mixtral-8x7b", ep=8, dp=2, global_batch=2, etp=1)
    # The default expert TP (= tp) is named, with the --etp 1 most MoE recipes use.
    msg = rules("mixtral-8x7b", tp=8, ep=8, dp=1, global_batch=1)["expert_grid"]
    assert "defaults to tp (Megatron)" in msg and "--etp 1" in msg


def test_batch_sp_cp_context():
    msg = rules("llama-3.1-8b", dp=4, micro_batch=3, global_batch=64)["global_batch"]
    assert "global_batch (64) must be divisible by micro_batch x dp (3 x 4 = 12)" in msg
    assert "valid micro_batch: 1, 2, 4, 8, 16" in msg
    assert "sp_needs_tp" in rules("llama-3.1-8b", sp=True)
    assert "2*cp (8)" in rules("llama-3.1-8b", cp=4, seq_len=4100)["cp_seq"]
    # RoPE models train past max_position_embeddings by scaling RoPE (context extension, issue 39); learned
    # absolute positions (GPT-3: 2048, Brown et al. 2020) have no row past it
    assert "seq_len_context" not in rules("llama-2-7b", seq_len=8192)
    msg = rules("gpt3-175b", seq_len=4096)["seq_len_context"]
    assert "exceeds max_position_embeddings (2048) of gpt3-175b" in msg


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


def test_recompute_layers_needs_full_recompute(cli):
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--tp", "1", "--dp", "8",
            "--recompute", "selective", "--recompute-layers", "4")
    assert r.code == 2
    assert "recompute_layers (4) recomputes whole layers" in r.err and "use --recompute full" in r.err


def test_op_checkpointing_is_for_dense_bf16_layers(cli):
    # The op policy is priced by the order of a dense layer's matmuls (wq, wk, wv, wo, w1, w3, w2), and
    # torchtitan's releases disagree on low-precision matmul outputs (v0.2.2 recomputes them, 0.3.0 saves them).
    assert "recompute_op" in rules("mixtral-8x7b", ep=8, dp=8, recompute="op")
    assert "deepseek-v3 has expert layers" in rules("deepseek-v3", recompute="op")["recompute_op"]
    assert "v0.2.2 recomputes them" in rules("llama-3.1-8b", dtype="fp8", recompute="op")["recompute_op_dtype"]
    assert rules("llama-3.1-8b", ClusterSpec(system=H100, num_nodes=1), dp=8, global_batch=8, recompute="op") == {}
    r = cli("estimate", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--ep", "8", "--recompute", "op")
    assert r.code == 2 and "recompute op" in r.err and "use --recompute full, selective or none" in r.err
    assert "Traceback" not in r.err


def test_megatron_only_expert_limits_are_not_plan_rules():
    # Megatron-Core's "Bias in Moe is only supported when ETP==1" (NVIDIA/Megatron-LM d98e8a6
    # transformer_config.py) and its MoE layer's ValueError at tp > 1 without sp in training (moe_layer.py) are
    # limits of that launcher, refused by the Megatron exports (export.common.megatron_expert_refusals;
    # tests/test_moe_tp_launchers.py): DeepSpeed's AutoTP and torchtitan run these plans, and a DeepSpeed plan
    # carries tp_impl megatron, so check_plan passes them whatever their tp_impl
    assert rules("gpt-oss-20b", tp=2, ep=4, dp=4, sp=True, global_batch=8, etp=2) == {}
    assert rules("gpt-oss-20b", tp=2, ep=1, dp=4, sp=False, global_batch=8) == {}  # etp = tp = 2, no sp
    assert rules("qwen3-30b-a3b", tp=2, ep=8, dp=4, etp=1, sp=False, global_batch=8) == {}
