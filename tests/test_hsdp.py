"""Hybrid sharding (ParallelPlan.dp_replicate / dp_outer_optimizer; Megatron-FSDP HSDP / HFSDP, Megatron-LM
num_distributed_optimizer_instances): docs/formulas.md#mem.hsdp."""

from __future__ import annotations

from itertools import islice
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agreement import assert_arrays_agree
from llmplan.cost.model_states import model_state_bytes
from llmplan.estimate import estimate_training
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()
H100 = builtin_systems()["dgx-h100"]
ULTRA = "mbridge-26.08-pretrain-nemotron-3-ultra-dgx-{}-256gpu-mxfp8-tp{}pp1cp1ep64vpnagbs256mbs1"


def test_model_states_by_hand():
    # 1e9 parameters, ZeRO-3, 2-byte weights and gradients, K = 12: weights and gradients over the partial group
    # of 4, the optimizer over all 8 ranks (outer optim sharding): 0.5 + 0.5 + 1.5 GB
    s = model_state_bytes(1e9, 4, 3, 2.0, 2.0, 12.0, 8)
    assert (s.weights, s.gradients, s.optimizer) == (5e8, 5e8, 1.5e9)
    p = ParallelPlan(dp=8, zero=3, dp_replicate=2, dp_outer_optimizer=True, global_batch=8)
    assert (p.zero_shard, p.optimizer_shard) == (4, 8)
    q = p.model_copy(update={"dp_outer_optimizer": False})
    assert (q.zero_shard, q.optimizer_shard) == (4, 4)


@pytest.mark.parametrize("gpu,tp", [("gb300", 1), ("gb200", 2)])
def test_the_ultra_presets_shard_within_a_64_gpu_domain(row_setup, gpu, tp):
    # Megatron-Bridge perf_recipes/nemotronh/common.py at 067f987d (_apply_nemotron_3_ultra_fsdp_hsdp):
    # num_distributed_optimizer_instances = 256 // 64 = 4, outer_dp_sharding_strategy "optim"; Megatron-LM
    # parallel_state.py at 2a75ac12c: partial groups of dp·cp / 4 ranks, experts of edp / 4 (edp = 256 / EP64 = 4)
    m, c, plan = row_setup(ULTRA.format(gpu, tp))
    assert not check_plan(m, plan, c)
    assert (plan.dp_replicate, plan.dp_outer_optimizer, plan.zero) == (4, True, 3)
    assert plan.zero_shard * tp == 64 and plan.optimizer_shard == 256 // tp
    assert (plan.expert_shard, plan.expert_optimizer_shard) == (1, 4)


def _memory(dp: int, r: int | None, outer: bool, zero: int = 3) -> float:
    hsdp = {} if r is None else {"dp_replicate": r, "dp_outer_optimizer": outer}  # None: plain ZeRO
    plan = ParallelPlan(tp=1, dp=dp, zero=zero, global_batch=dp, seq_len=2048, **hsdp)
    m, c = M["llama-3.1-8b"], ClusterSpec(system=H100, num_nodes=dp // 8)
    assert not check_plan(m, plan, c)
    return estimate_training(m, c, plan).memory


@settings(max_examples=4, deadline=None, derandomize=True)
@given(st.sampled_from([(16, 2), (16, 4), (32, 4), (32, 8)]))
def test_more_shards_never_raise_memory_and_one_replica_is_zero3(case):
    dp, r = case
    plain, one, hybrid, hfsdp = _memory(dp, None, False), _memory(dp, 1, False), _memory(dp, r, False), \
        _memory(dp, r, True)
    assert one.total == plain.total  # one replica sharding over the whole dp group is plain ZeRO-3
    assert _memory(dp, r // 2, False).total < hybrid.total  # fewer replicas, more shards: less per GPU
    assert plain.total < hfsdp.total < hybrid.total  # the whole group shards more than one replica does
    assert hfsdp.optimizer == pytest.approx(plain.optimizer)  # outer optim: the optimizer over all dp ranks
    assert hybrid.weights == pytest.approx(r * plain.weights)


@pytest.mark.parametrize("plan,rule,text", [
    ({"dp": 6, "zero": 3, "dp_replicate": 4, "global_batch": 6}, "dp_replicate_divides", "must divide dp (6)"),
    ({"dp": 8, "zero": 0, "dp_replicate": 2, "global_batch": 8}, "dp_replicate_zero", "zero is 0"),
    ({"dp": 8, "zero": 1, "dp_replicate": 2, "dp_outer_optimizer": True, "global_batch": 8}, "dp_outer_optimizer",
     "use --zero 3 with --dp-replicate > 1"),
])
def test_check_plan_refuses_what_megatron_refuses(plan, rule, text):
    v = [x for x in check_plan(M["llama-3.1-8b"], ParallelPlan(**plan)) if x.rule == rule]
    assert v and text in v[0].message


def test_vectorised_search_agrees_with_the_scalar_estimate():
    # the search's arrays (search.evaluate) and the one-plan estimate price the partial groups and the replicas'
    # collectives alike, memory and step time, on MoE plans of several EP / PP with 2 replicas

    from llmplan.search.grid import Workload, default_space, enumerate_plans
    m, cluster = M["qwen3-30b-a3b"], ClusterSpec(system=H100, num_nodes=4)
    for outer in (False, True):
        w = Workload(global_batch=64, seq_len=4096, dp_replicate=2, dp_outer_optimizer=outer)
        plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
        idx = list(islice((i for i in range(len(plans)) if not check_plan(m, plans.plan(i), cluster)), 25))
        assert_arrays_agree(m, cluster, plans, idx)


def test_the_replicas_reduce_once_a_step_across_domains(row_setup):
    # Ultra GB200 (TP2, EP64, 256 GPUs in 64-GPU domains): the routed experts' shard group is one rank (edp 4 /
    # 4 replicas), so no expert collective within it; across the replicas one reduce-scatter and one all-gather
    # of the rank's whole expert share a step (outer optim sharding), over 4 domains
    from llmplan.cost.comm import dp_transfers
    from llmplan.topology.placement import place
    m, c, plan = row_setup(ULTRA.format("gb200", 2))  # the launcher's 64-GPU NVLink segments
    spans = place(plan.degrees, c)
    assert spans["dpcp_in"].domains == 1 and spans["dpcp_out"].domains == 4 and spans["edp_in"].size == 1
    out = [t for t in dp_transfers(m, plan, spans["dpcp_in"], spans["edp_in"], 0, spans["dpcp_out"],
                                   spans["edp_out"]) if t.group.axis == "edp_out" and t.calls > 0]
    assert sorted(t.collective for t in out) == ["all-gather", "reduce-scatter"]


def test_cli_takes_the_switches_and_refuses_a_replica_count_that_does_not_divide_dp(tmp_path, cli):
    import json

    from llmplan.export import render_all
    from llmplan.export.common import CannotExpress
    from llmplan.planfile import load_plan
    assert "dp_replicate (3) must divide dp (8)" in cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100",
                                                        "--nodes", "1", "--zero", "3", "--global-batch", "8",
                                                        "--dp-replicate", "3").refusal()
    path = tmp_path / "plan.json"
    made = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "2", "--zero", "1",
               "--global-batch", "16", "--dp-replicate", "2", "--save", str(path))
    assert made.code == 0, made.err
    assert json.loads(path.read_text())["plan"]["dp_replicate"] == 2
    pf = load_plan(path)
    # Megatron-LM megatron/training/arguments.py (2a75ac12c): --num-distributed-optimizer-instances
    assert "--num-distributed-optimizer-instances 2" in "\n".join(render_all(pf, "megatron")[0].values())
    with pytest.raises(CannotExpress, match="hybrid sharding"):
        render_all(pf, "deepspeed")


@pytest.mark.parametrize("flags,text", [
    (("--dp-replicate", "2"), "dp_replicate (2) replicates ZeRO shard groups, but zero is 0"),
    (("--zero", "1", "--dp-replicate", "2", "--dp-outer-optimizer"), "but dp_replicate is 2 and zero 1"),
    (("--zero", "3", "--dp-outer-optimizer"), "but dp_replicate is 1 and zero 3"),
])
def test_cli_refuses_hybrid_sharding_without_what_it_shards(cli, flags, text):
    # rules dp_replicate_zero and dp_outer_optimizer: one line naming the values and the fix, exit 2
    line = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1",
               "--global-batch", "8", *flags).refusal()
    assert text in line and ("--dp-replicate 1" in line or "drop --dp-outer-optimizer" in line), line


def test_describe_names_the_replicas_and_the_sharded_optimizer_in_words(tmp_path, cli):
    # The one-line plan (estimate view, export headers, search notes) read "dp-replicate 2 optimizer across
    # recompute ...": the switch is now a phrase, and what carries it still fits 80 columns.
    base = {"dp": 16, "zero": 3, "global_batch": 16}
    assert "dp-replicate" not in ParallelPlan(**base).describe()
    assert ParallelPlan(**base, dp_replicate=2).describe() == (
        "tp 1 pp 1 dp 16 cp 1 ep 1 vpp 1 sp off zero 3 dp-replicate 2 recompute none micro-batch 1")
    assert ParallelPlan(**base, dp_replicate=2, dp_outer_optimizer=True).describe() == (
        "tp 1 pp 1 dp 16 cp 1 ep 1 vpp 1 sp off zero 3 dp-replicate 2 (optimizer sharded across replicas) "
        "recompute none micro-batch 1")
    path = tmp_path / "plan.json"
    made = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "2", "--zero", "3",
               "--global-batch", "16", "--dp-replicate", "2", "--dp-outer-optimizer", "--save", str(path))
    assert made.code == 0, made.err
    assert " ".join(made.out.split()).count("dp-replicate 2 (optimizer sharded across replicas)") == 1
    assert max(map(len, made.out.splitlines())) <= 80
    # the header writer itself (the Megatron exports write this plan: tests/test_export_megatron_hsdp.py)
    from llmplan.export.common import comment_block, header_lines
    from llmplan.planfile import load_plan
    header = comment_block(header_lines(load_plan(path), "any"))
    assert "dp-replicate 2 (optimizer sharded across replicas)" in " ".join(header.replace("#", " ").split())
    assert max(map(len, header.splitlines())) <= 80


def test_mxfp8_weights_cross_the_replicas_twice_a_step(row_setup):
    # Megatron-LM 2a75ac12c, megatron_fsdp.py all_gather_and_wait_parameters_ready: the DP-Outer gather runs while
    # microbatch_count == 0, in the forward (rowwise MXFP8 copy) and in the backward (bwd=True: AllGatherPipeline.
    # get_fsdp_buffer returns the columnwise hfsdp_helper_wtbuf), so an MXFP8 ZeRO-3 plan gathers its shard twice
    # across the replicas a step; with bf16 weights (no transpose buffer) one gather of twice the bytes
    from llmplan.cost.comm import dp_transfers
    from llmplan.topology.placement import place
    m, c, plan = row_setup(ULTRA.format("gb300", 1))
    assert plan.fp8_params and plan.recipe == "mxfp8"
    spans = place(plan.degrees, c)

    def outer_gather(p: ParallelPlan) -> tuple[float, float]:
        (t,) = [t for t in dp_transfers(m, p, spans["dpcp_in"], spans["edp_in"], 0, spans["dpcp_out"],
                                        spans["edp_out"]) if t.group.axis == "edp_out" and t.collective == "all-gather"]
        return t.calls, t.message

    (calls, msg), (calls16, msg16) = outer_gather(plan), outer_gather(plan.model_copy(update={"fp8_params": False}))
    # one call per unit: the MoE layers' expert bucket groups (docs/formulas.md#comm.zero3_unit), counted by hand
    # from the model card's pattern: 48 latent-MoE blocks and the MTP module's MoE (review-70c: the count came
    # from zero3_units, the function under test)
    units = 48 + 1
    assert (calls, calls16) == (2 * units, units) and msg16 == pytest.approx(2 * msg)


def test_mxfp8_block_amax_all_reduce_by_hand():
    # Transformer Engine transformer_engine/pytorch/tensor/utils.py (v2.11 - v2.17.1),
    # _cast_master_weights_to_fp8_mxfp8_scaling: one amax per 32-element block in the master weights' dtype (fp32),
    # for the rowwise and the columnwise scales: 2 x 4 / 32 bytes a weight element
    from llmplan.cost.comm import MXFP8_AMAX_BYTES
    assert MXFP8_AMAX_BYTES == 0.25


# Llama 3.2 1B (meta-llama/Llama-3.2-1B config.json): a tied word embedding, no biases, RMSNorms
LLAMA32_1B = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
              "max_position_embeddings": 131072, "tie_word_embeddings": True}


def test_mxfp8_amax_of_a_tied_model_counts_only_its_linear_weights_by_hand():
    # TE _cast_master_weights_to_fp8_mxfp8_scaling (v2.11 - v2.17.1) packs one amax per 32-element block of every
    # MXFP8 weight, i.e. every parameter TE quantized (reset_parameters: fp8_meta_index, the GEMM weights), not the
    # word embedding (VocabParallelEmbedding, which at pp 1 is also the tied output layer: one tensor) nor the
    # RMSNorms. A layer's GEMM weights: q 2048 x 2048, k and v 2048 x 512 each, o 2048 x 2048, gate / up / down
    # 3 x 2048 x 8192 = 60,817,408; 16 layers 973,078,528; 0.25 bytes each (MXFP8_AMAX_BYTES)
    from llmplan.cost.comm import mxfp8_amax_transfers
    from llmplan.specs.hf import from_hf_config
    from llmplan.specs.model import ModelSpec
    m = ModelSpec(**from_hf_config(LLAMA32_1B, "llama-3.2-1b"))
    layer = 2048 * 2048 + 2 * 2048 * 512 + 2048 * 2048 + 3 * 2048 * 8192
    assert layer == 60_817_408
    kw = dict(dp=8, zero=3, global_batch=64, dtype="fp8", recipe="mxfp8", fp8_params=True, megatron_fsdp=True)
    p = ParallelPlan(**kw)
    dense, expert = [t for t in mxfp8_amax_transfers(m, p, ("dpcp", "dpcp_in"), ("edp", "edp_in")) if t.calls]
    assert dense.group == "dpcp_in" and dense.message == 0.25 * 16 * layer
    assert expert.message == 0.0
    # only Megatron-FSDP (no pipeline: rule megatron_fsdp_zero) casts its master shards so: not DeepSpeed's /
    # FSDP2's ZeRO-3
    for off in (dict(megatron_fsdp=False), dict(pp=2)):
        p = ParallelPlan(**{**kw, **off})
        assert not [t for t in mxfp8_amax_transfers(m, p, ("dpcp", "dpcp_in"), ("edp", "edp_in")) if t.calls]


def test_the_ultra_rows_all_reduce_their_mxfp8_amaxes_once_a_step_exposed(row_setup):
    # Megatron-LM 2a75ac12c param_and_grad_buffer.py copy_main_weights_to_model_weights: fp8_quantize over the main
    # weight buffer's group (HFSDP: DP-Outer x DP-Shard, the whole dp group; the experts' whole edp group). The
    # GB300 rank holds 8 of the 512 experts of each of 49 MoE layers (48 in the stack, one in the MTP module the
    # recipe runs at both depths: mtp_use_repeated_layer, Megatron-LM d98e8a64dd multi_token_prediction.py builds
    # one layer), 2 x 2048 x 5120 weights an expert: 8,220,835,840 expert weights, all of them MXFP8
    from llmplan.cost.comm import comm_seconds, mxfp8_amax_transfers
    from llmplan.topology.placement import place
    m, c, plan = row_setup(ULTRA.format("gb300", 1))
    spans = place(plan.degrees, c)
    out = [t for t in mxfp8_amax_transfers(m, plan, (spans["dpcp"], spans["dpcp_in"]), (spans["edp"],
                                                                                        spans["edp_in"])) if t.calls]
    assert [(t.group.axis, t.group.size) for t in out] == [("dpcp", 256), ("edp", 4)]
    assert out[1].message == pytest.approx(0.25 * 8 * 2 * 2048 * 5120 * 49)
    e = estimate_training(m, c, plan)
    step_end = comm_seconds(e.comm, c.system).dp_step_end
    assert step_end > 0
    # exposed whole, in the dp part of the step; bf16 weight copies (no MXFP8 scales to set) run none of it
    assert e.time.exposed["dp"] >= step_end
    bf16 = plan.model_copy(update={"fp8_params": False})
    assert not [t for t in mxfp8_amax_transfers(m, bf16, (spans["dpcp"], spans["dpcp_in"]),
                                                (spans["edp"], spans["edp_in"])) if t.calls]


def test_vectorised_search_prices_the_amax_all_reduce_as_the_scalar_estimate():
    import numpy as np

    from llmplan.search.evaluate import evaluate
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    m, cluster = M["qwen3-30b-a3b"], ClusterSpec(system=builtin_systems()["gb200-nvl72"], num_nodes=8)
    for outer in (False, True):
        w = Workload(global_batch=64, seq_len=4096, dp_replicate=2, dp_outer_optimizer=outer, dtype="fp8",
                     recipe="mxfp8", fp8_params=True, megatron_fsdp=True)
        plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
        idx = list(islice((i for i in range(len(plans)) if not check_plan(m, plans.plan(i), cluster)
                           and plans.plan(i).zero == 3), 20))
        assert idx
        vec = evaluate(m, cluster, plans.take(np.asarray(idx)))
        casts = []
        for j, i in enumerate(idx):
            scalar = estimate_training(m, cluster, plans.plan(i))
            assert float(vec.step.total[j]) == pytest.approx(float(scalar.time.total), rel=1e-9)
            assert float(vec.step.overheads["mxfp8_master_cast"][j]) == pytest.approx(
                float(scalar.time.overheads["mxfp8_master_cast"]), rel=1e-9, abs=1e-12)
            casts.append(float(scalar.time.overheads["mxfp8_master_cast"]))
        assert max(casts) > 0  # the host loop is priced on these plans (Megatron-FSDP ZeRO-3, MXFP8 weights)
