"""Issue 32 (docs/validation.md#tp-grad-sync, docs/formulas.md#comm.tp_grad_sync): Megatron-Core all-reduces over
TP, once a step, the gradients of the parameters every TP rank holds whole.

NVIDIA/Megatron-LM at d98e8a64dd megatron/core/distributed/finalize_model_grads.py: finalize_model_grads runs
finish_grad_sync (the DP reduction), then _allreduce_non_tensor_model_parallel_grads: with TP > 1, every
param with `average_gradients_across_tp_domain` (DeepSeek Sparse Attention's indexer, dsa.py) goes into an AVG
list; every param with `sequence_parallel` set while config.sequence_parallel is on (TE norms' layer_norm_weight,
TELinear "duplicated" such as MLA's linear_q_down_proj / linear_kv_down_proj, the router weight), or named
q_layernorm / k_layernorm under qk_layernorm, into a SUM list; each list is flattened (_flatten_dense_tensors of
main_grad) and all-reduced in one call over the TP group. Without sequence parallelism every TP rank sees every
token, so a duplicated weight's gradient is already equal on all of them and nothing is reduced for it.

DeepSeek-V3 (config.json): hidden 7168, q_lora_rank 1536, kv_lora_rank 512, qk_rope_head_dim 64, 256 routed
experts, 61 layers (first 3 dense), RMSNorm, one MTP module. Per MoE layer, by hand:
  linear_q_down_proj 7168 x 1536 = 11,010,048 and its norm 1,536 (fused into linear_q_up_proj);
  linear_kv_down_proj 7168 x (512 + 64) = 4,128,768 and its norm 512 (fused into linear_kv_up_proj);
  input_layernorm and pre_mlp_layernorm 2 x 7168 = 14,336; router weight 256 x 7168 = 1,835,008
  -> 16,990,208; a dense layer has no router: 15,155,200.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmplan.cost.comm import TP_SYNC_COPIES, comm_seconds, tp_step_end_transfers, tp_synced_params
from llmplan.cost.step import step_time
from llmplan.cost.params import attention_params, attention_params_per_rank, mla_down_params, tp_synced_layer_params
from llmplan.estimate import estimate_training
from llmplan.search.evaluate import evaluate
from llmplan.search.grid import from_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_systems, resolve_model

H, Q_R, KV_R, ROPE, E = 7168, 1536, 512, 64, 256
MOE_LAYER = H * Q_R + Q_R + H * (KV_R + ROPE) + KV_R + 2 * H + E * H
DENSE_LAYER = MOE_LAYER - E * H


def _plan(**kw):
    base = dict(tp=8, pp=1, dp=32, ep=32, etp=1, sp=True, zero=1, micro_batch=1, global_batch=1024, seq_len=4096)
    return ParallelPlan(**{**base, **kw})


def test_deepseek_v3_layers_by_hand():
    m = resolve_model("deepseek-v3")
    assert MOE_LAYER == 16_990_208 and DENSE_LAYER == 15_155_200
    assert mla_down_params(m) == 11_010_048 + 1_536 + 4_128_768 + 512
    dense, moe, qk = tp_synced_layer_params(m)
    assert (dense, moe, qk) == (DENSE_LAYER, MOE_LAYER, 0)


def test_deepseek_v3_tp8_sp_one_fp32_all_reduce_a_step_by_hand():
    """pp 1: 3 dense + 58 MoE layers, the MTP module's layer (a MoE layer) and the final norm, fp32 main_grad."""
    m = resolve_model("deepseek-v3")
    plan = _plan()
    params = 3 * DENSE_LAYER + 59 * MOE_LAYER + H
    assert params == 1_047_895_040
    summed, averaged = tp_synced_params(m, plan, 0)
    assert (float(summed), float(averaged)) == (params, 0)
    live = [t for t in tp_step_end_transfers(m, plan, "tp") if t.calls]
    assert len(live) == 1
    t = live[0]
    assert (t.collective, t.calls, t.step_end) == ("all-reduce", 1, True)
    assert float(t.message) == 4 * params == 4_191_580_160  # grad_dtype fp32: 4 bytes per gradient
    assert float(t.copy_bytes) == TP_SYNC_COPIES * 4 * params
    bf16 = [t for t in tp_step_end_transfers(m, _plan(grad_dtype="bf16"), "tp") if t.calls][0]
    assert float(bf16.message) == 2 * params


@pytest.mark.parametrize("kw", [dict(sp=False), dict(tp=1, dp=256, ep=256), dict(tp_impl="dtensor")])
def test_no_step_end_tp_all_reduce_without_sp_tp_or_megatron(kw):
    """Without SP the duplicated weights' gradients are equal on every TP rank (DeepSeek-V3 has no qk norm or
    indexer); TP 1 has no TP group; PyTorch DTensor TP is not Megatron's finalize_model_grads (not priced)."""
    m = resolve_model("deepseek-v3")
    assert not any(t.calls for t in tp_step_end_transfers(m, _plan(**kw), "tp"))


def test_qk_norms_are_summed_whatever_sp():
    """Qwen3's per-head q/k norms (2 x 128 per layer, 48 layers) are summed over TP with or without SP."""
    m = resolve_model("qwen3-30b-a3b")
    plan = ParallelPlan(tp=4, pp=1, dp=8, ep=8, etp=1, sp=False, zero=1, micro_batch=1, global_batch=256,
                        seq_len=4096)
    summed, averaged = tp_synced_params(m, plan, 0)
    assert (float(summed), float(averaged)) == (48 * 2 * 128, 0)


def test_deepseek_v32_indexer_is_averaged_in_its_own_call():
    """DeepSeek-V3.2's indexer (dsa.py, average_gradients_across_tp_domain): wq_b 1536 x 64·128, wk 7168 x 128,
    k_norm LayerNorm 2 x 128, weights_proj 7168 x 64 = 13,959,424 per layer, 61 layers and the MTP layer, AVG."""
    m = resolve_model("deepseek-v3.2")
    per_layer = 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64
    assert per_layer == 13_959_424
    _, averaged = tp_synced_params(m, _plan(sp=False), 0)
    assert float(averaged) == 62 * per_layer
    live = [t for t in tp_step_end_transfers(m, _plan(sp=False), "tp") if t.calls]
    assert len(live) == 1 and float(live[0].message) == 4 * 62 * per_layer


def test_memory_counts_the_duplicated_mla_weights_whole():
    """Per-GPU parameters: the down-projections and latent norms whole on every TP rank, the rest split by t."""
    m = resolve_model("deepseek-v3")
    down = H * Q_R + Q_R + H * (KV_R + ROPE) + KV_R
    for t in (1, 2, 8):
        assert attention_params_per_rank(m, t) == pytest.approx(down + (attention_params(m) - down) / t, rel=1e-15)


def test_exposed_whole_in_tp_and_the_search_agrees():
    """The step-end all-reduce adds its seconds to the exposed tp part once a step (not per micro-batch), the
    parts still sum to the total, and the vectorised search prices the same step."""
    m = resolve_model("deepseek-v3")
    cluster = ClusterSpec(system=builtin_systems()["dgx-h800"], num_nodes=32)
    plan = _plan()
    est = estimate_training(m, cluster, plan)
    secs = comm_seconds(est.comm, cluster.system)
    assert secs.tp_step_end > 0
    without = step_time(m, plan, cluster.system.gpu, replace(secs, tp_step_end=0.0))
    assert est.time.exposed["tp"] - without.exposed["tp"] == pytest.approx(secs.tp_step_end, rel=1e-9)
    assert est.time.total - without.total == pytest.approx(secs.tp_step_end, rel=1e-9)
    assert sum(est.time.exposed.values()) == pytest.approx(est.time.comm_exposed)
    vec = evaluate(m, cluster, from_plan(plan))
    assert float(vec.step.total[0]) == pytest.approx(float(est.time.total), rel=1e-9)
    assert float(vec.step.exposed["tp"][0]) == pytest.approx(float(est.time.exposed["tp"]), rel=1e-9)


def test_json_reports_the_step_end_seconds_and_marks_the_transfer():
    """Keys added to the comm JSON (never renamed): tp.step_end_seconds and each transfer's step_end."""
    from llmplan.report.training import comm_json

    m = resolve_model("deepseek-v3")
    cluster = ClusterSpec(system=builtin_systems()["dgx-h800"], num_nodes=32)
    est = estimate_training(m, cluster, _plan())
    out = comm_json(est.comm, cluster.system)
    assert out["tp"]["step_end_seconds"] == pytest.approx(comm_seconds(est.comm, cluster.system).tp_step_end)
    ends = [t for t in out["tp"]["transfers"] if t["step_end"]]
    assert len(ends) == 1 and ends[0]["message_bytes"] == 4 * (3 * DENSE_LAYER + 59 * MOE_LAYER + H)
    assert not any(t["step_end"] for t in out["dp"]["transfers"])


@pytest.mark.parametrize("zero, dp_replicate, shard", [(3, 1, 32), (2, 1, 32), (3, 4, 8), (1, 1, 1)])
def test_megatron_fsdp_all_reduces_only_the_local_shard(zero, dp_replicate, shard):
    """Megatron-FSDP (NVIDIA/Megatron-LM finalize_model_grads.py at cd4afffa6, the Megatron-Bridge v0.6.0 pin:
    `grad._local_tensor.data` when use_megatron_fsdp) all-reduces each rank's DP-Shard slice of the TP-synced
    gradients: DeepSeek-V3 TP8 SP, dp 32 -> 1,047,895,040 / 32 under ZeRO 2 / 3, / (32 / 4) as HSDP with 4
    replicas (the shard group is 8 ranks); ZeRO 1 (Megatron-Core's distributed optimizer) the whole."""
    m = resolve_model("deepseek-v3")
    plan = _plan(zero=zero, dp_replicate=dp_replicate)
    summed, _ = tp_synced_params(m, plan, 0)
    assert float(summed) == pytest.approx(1_047_895_040 / shard, rel=1e-12)
    live = [t for t in tp_step_end_transfers(m, plan, "tp") if t.calls]
    assert float(live[0].message) == pytest.approx(4 * 1_047_895_040 / shard, rel=1e-12)


def test_deepspeed_refuses_the_tp_synced_weights_it_reduces_otherwise(cli, tmp_path):
    """DeepSpeed refuses sequence parallelism, so at tp > 1 its plans price a step-end TP all-reduce only for the
    per-head q/k norms (and DeepSeek Sparse Attention's indexer): Megatron-Core's one coalesced call a step (under
    ZeRO-2 Megatron-FSDP's local shard, fsdp_tp_sync_shard). DeepSpeed 0.19.8's AutoTP all-reduces each such
    gradient in a hook of its own every micro-batch (module_inject/auto_tp.py register_replicated_grad_hooks), so
    export --to deepspeed refuses a Qwen3 ZeRO-2 plan at tp 2 in one line (exit 2, no files) and writes Llama's,
    for which nothing is priced (before: both exported, Qwen3's with Megatron-FSDP's bytes)."""
    from pathlib import Path

    from llmplan.planfile import load_plan

    args = ("--hardware", "dgx-h100", "--nodes", "1", "--tp", "2", "--dp", "4", "--zero", "2", "--no-sp",
            "--no-overlap-param-gather", "--unfused-loss", "--unfused-loss-impl", "eager-vocab-parallel",
            "--tp-whole-embedding")  # AutoTP: embed_tokens whole; the loss priced as DeepSpeed's
    for model, synced in (("qwen3-8b", True), ("llama-3.1-8b", False)):
        path = tmp_path / f"{model}.json"
        assert cli("estimate", "--model", model, *args, "--save", path).code == 0
        pf = load_plan(path)
        summed, averaged = tp_synced_params(pf.model, pf.plan, 0)
        assert (float(summed) + float(averaged) > 0) is synced
        r = cli("export", path, "--to", "deepspeed", "-o", tmp_path / model)
        if synced:
            assert r.code == 2, r.out
            line = r.err.strip()
            assert "\n" not in line and "Traceback" not in line
            assert "the per-head q/k norms (qk_norm) at tp 2" in line and "in its own call every micro-batch" in line
            assert "re-plan with --tp 1, or export to megatron" in line and not (tmp_path / model).exists()
        else:
            assert r.code == 0, r.err
    doc = (Path(__file__).parent.parent / "docs" / "formulas.md").read_text()
    section = doc[doc.index("## comm.tp_grad_sync"):]
    section = section[:section.index("\n## ", 1)]
    assert "register_replicated_grad_hooks" in section and "not a DeepSpeed mechanism" not in section
