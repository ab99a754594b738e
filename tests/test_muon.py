"""The Muon optimizer (ParallelPlan.optimizer muon; docs/formulas.md#optim.muon_params, #optim.muon_memory,
#optim.muon_ns; docs/validation.md#muon).

Sources: NVIDIA/Megatron-LM at d0b3b7754 (the pin of Megatron-Bridge v0.5.0), megatron/core/optimizer/
emerging_optimizers.py (TensorParallelMuon; _is_nonlinear_or_embedding: the word embedding, the output layer and
every non-2-D parameter go to AdamW), layer_wise_optimizer.py (each data-parallel rank steps the whole parameters it
owns); NVIDIA-NeMo/Emerging-Optimizers v0.2.0 (1effa026), orthogonalized_optimizer.py (one momentum_buffer,
zeros_like the fp32 master) and muon_utils.py (newton_schulz_step: A = X X^T, B = b A + c A A, X = a X + B X)."""

from __future__ import annotations

from itertools import islice

import pytest

from agreement import assert_arrays_agree
from llmplan.cost.muon import muon_params, newton_schulz_flops, newton_schulz_seconds
from llmplan.cost.params import rank_params
from llmplan.estimate import estimate_training
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()
H100 = builtin_systems()["dgx-h100"]
GB300 = builtin_systems()["gb300-nvl72"]


def test_newton_schulz_flops_of_a_2x4_matrix_by_hand():
    # m = 2, n = 4: X X^T is 2 x 4 by 4 x 2, 2*2*2*4 = 32 FLOPs; A A is 2 x 2 by 2 x 2, 2*2*2*2 = 16; B X is 2 x 2
    # by 2 x 4, 2*2*4*2 = 32: 80 a step (the scalings and the additions folded into addmm are not counted), 5 steps
    assert newton_schulz_flops(2, 4) == 5 * (32 + 16 + 32) == 400
    assert newton_schulz_flops(4, 2) == 400  # the tall matrix is transposed first (whitening the smaller side)
    assert newton_schulz_flops(3, 3, steps=1) == 2 * 27 + 2 * 27 + 2 * 27


# Llama 3.1 8B (model_specs: h 4096, 32 heads, 8 KV heads of 128, SwiGLU 14336, 32 layers, vocabulary 128256)
H, A, K, D, F, L = 4096, 32, 8, 128, 14336, 32
LLAMA_LAYER_MATRICES = H * A * D + 2 * H * K * D + A * D * H + 3 * H * F  # q, k, v, o; gate + up (fc1), down


def test_muon_updates_the_layer_matrices_and_adam_the_rest_by_hand():
    m, p = M["llama-3.1-8b"], ParallelPlan(dp=8, zero=1, global_batch=64, optimizer="muon")
    mu, rp = muon_params(m, p, 0), rank_params(m, p, 0)
    assert mu.dense == L * LLAMA_LAYER_MATRICES
    # AdamW keeps the two vocabulary matrices (Megatron pads V to a multiple of 128: 128256 is one) and the norms
    assert rp.dense - mu.dense == 2 * 128256 * H + (2 * L + 1) * H
    assert muon_params(m, p.model_copy(update={"optimizer": "adam"}), 0).total == 0


def test_one_momentum_buffer_instead_of_two_moments_by_hand():
    # Adam: fp32 master + exp_avg + exp_avg_sq, 12 bytes a parameter over the 8 optimizer shards; Muon: master +
    # momentum, 8 bytes, on its matrices: 4 bytes x the matrices / 8 less per GPU
    m, cluster = M["llama-3.1-8b"], ClusterSpec(system=H100, num_nodes=1)
    adam = ParallelPlan(dp=8, zero=1, global_batch=64)
    muon = adam.model_copy(update={"optimizer": "muon"})
    a, b = estimate_training(m, cluster, adam).memory, estimate_training(m, cluster, muon).memory
    assert float(a.optimizer - b.optimizer) == pytest.approx(4 * L * LLAMA_LAYER_MATRICES / 8, rel=1e-12)
    assert float(a.total - b.total) == pytest.approx(float(a.optimizer - b.optimizer) * 1.0, rel=0.1)
    assert float(a.weights) == float(b.weights) and float(a.gradients) == float(b.gradients)
    # the same fp32 master (4 bytes / 8 shards), the moments 8 -> 4 bytes on the matrices
    from llmplan.cost.model_states import optimizer_parts
    pa, pb = optimizer_parts(adam, a.optimizer, a.muon_saving), optimizer_parts(muon, b.optimizer, b.muon_saving)
    assert float(pb.master) == pytest.approx(float(pa.master), rel=1e-12)
    assert float(pa.moments - pb.moments) == pytest.approx(4 * L * LLAMA_LAYER_MATRICES / 8, rel=1e-12)


def test_a_checkpoint_holds_one_moment_less_per_matrix_by_hand():
    from llmplan.cost.goodput import checkpoint_job_bytes, checkpoint_rank_bytes
    m, adam = M["llama-3.1-8b"], ParallelPlan(dp=8, zero=1, global_batch=64)
    muon = adam.model_copy(update={"optimizer": "muon"})
    saved = 4 * L * LLAMA_LAYER_MATRICES  # the fp32 exp_avg_sq Muon does not keep, every matrix once
    assert float(checkpoint_job_bytes(m, adam) - checkpoint_job_bytes(m, muon)) == pytest.approx(saved, rel=1e-12)
    assert float(checkpoint_rank_bytes(m, adam) - checkpoint_rank_bytes(m, muon)) == pytest.approx(saved / 8,
                                                                                                   rel=1e-12)


def test_each_data_parallel_rank_orthogonalises_its_share_and_tp_shards_alone():
    # zero 1: the layer-wise optimizer owns each matrix whole on one of the dp x cp ranks (the mean share priced);
    # zero 0: every rank runs every matrix. Blockwise TP: each rank its 1/t slice of a split matrix, no collective
    m, gpu = M["llama-3.1-8b"], H100.gpu
    zero0 = ParallelPlan(dp=8, zero=0, global_batch=64, optimizer="muon")
    zero1 = zero0.model_copy(update={"zero": 1})
    assert float(newton_schulz_seconds(m, zero0, gpu, 0)) == pytest.approx(8 * float(newton_schulz_seconds(
        m, zero1, gpu, 0)), rel=1e-12)
    assert newton_schulz_seconds(m, zero0.model_copy(update={"optimizer": "adam"}), gpu, 0) == 0.0
    tp2 = zero0.model_copy(update={"tp": 2, "dp": 4})
    assert muon_params(m, tp2, 0).dense == L * LLAMA_LAYER_MATRICES / 2  # GQA 8 KV heads split over 2


def test_kimi_k2_experts_are_orthogonalised_per_expert():
    # Kimi-K2 (MLA, 384 experts of 2048, one shared expert, 7168 wide) at EP 64: 6 experts per rank and MoE layer,
    # each fc1 (2 x 2048 rows x 7168) and fc2 (7168 x 2048) a matrix of its own (TEGroupedMLP weight<i>)
    m = M["kimi-k2"]
    p = ParallelPlan(pp=4, dp=64, ep=64, etp=1, zero=1, global_batch=4096, optimizer="muon", pp_layout=None,
                     pp_layers=(15, 16, 16, 14))
    from llmplan.cost.stages import stage_layers
    n_dense, n_moe = stage_layers(m, p, 1)
    assert float(muon_params(m, p, 1).expert) == n_moe * 6 * 3 * 7168 * 2048
    per_expert = newton_schulz_flops(2 * 2048, 7168) + newton_schulz_flops(7168, 2048)
    assert per_expert == 5 * (4 * 4096**2 * 7168 + 2 * 4096**3) + 5 * (4 * 2048**2 * 7168 + 2 * 2048**3)


def test_vectorised_search_agrees_with_the_scalar_estimate():
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    for name, system in (("qwen3-30b-a3b", GB300), ("llama-3.1-8b", H100)):
        m, cluster = M[name], ClusterSpec(system=system, num_nodes=2)
        w = Workload(global_batch=64, seq_len=4096, optimizer="muon")
        plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
        ok = (i for i in range(len(plans)) if plans.plan(i).dp > 1 and not check_plan(m, plans.plan(i), cluster))
        idx = list(islice(ok, 0, 100, 5))
        assert {plans.plan(i).zero for i in idx} <= {0, 1}
        assert_arrays_agree(m, cluster, plans, idx)


@pytest.mark.parametrize("kw,rule", [
    ({"zero": 3}, "muon_zero"), ({"zero": 2}, "muon_zero"),
    ({"optimizer_moment_dtype": "bf16"}, "muon_states"), ({"param_remainders": True}, "muon_states"),
    ({"dtype": "fp8", "recipe": "mxfp8", "fp8_params": True}, "muon_fp8_params"),
    ({"dp_replicate": 2}, "muon_replicate"), ({"dtype": "fp16"}, "muon_fp16"),
])
def test_check_plan_refuses_what_megatron_muon_does_not_run(kw, rule):
    p = ParallelPlan(**{"dp": 8, "zero": 1, "global_batch": 64, "optimizer": "muon", **kw})
    assert rule in [v.rule for v in check_plan(M["llama-3.1-8b"], p)]
    assert not [v for v in check_plan(M["llama-3.1-8b"], p.model_copy(update={"optimizer": "adam"}))
                if v.rule.startswith("muon")]


def test_check_plan_refuses_an_unpriced_architecture_and_names_the_fix():
    p = ParallelPlan(dp=8, zero=1, global_batch=64, optimizer="muon")
    v = [x for x in check_plan(M["deepseek-v3"], p) if x.rule == "muon_model"]
    assert v and "MTP modules" in v[0].message and "--mtp-layers 0" in v[0].message
    assert not [x for x in check_plan(M["deepseek-v3"], p.model_copy(update={"mtp_layers": 0}))
                if x.rule == "muon_model"]


TRAIN = ("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--global-batch", "64", "--zero", "1")


def test_cli_flag_prices_muon_and_a_plan_without_the_key_reads_as_adam(cli, tmp_path):
    adam, muon = cli(*TRAIN, "--json").json(), cli(*TRAIN, "--optimizer", "muon", "--json").json()
    assert (adam["plan"]["optimizer"], muon["plan"]["optimizer"]) == ("adam", "muon")
    assert muon["memory"]["optimizer"] < adam["memory"]["optimizer"]
    assert muon["time"]["optimizer_s"] > adam["time"]["optimizer_s"]
    path = tmp_path / "plan.json"
    assert cli(*TRAIN, "--save", path).code == 0
    import json
    doc = json.loads(path.read_text())
    del doc["plan"]["optimizer"]
    path.write_text(json.dumps(doc))
    again = cli("estimate", "--plan", path, "--json").json()
    assert again["plan"]["optimizer"] == "adam" and again["memory"]["optimizer"] == adam["memory"]["optimizer"]


def test_cli_refusals(cli):
    assert "--optimizer lion is not an optimizer llmplan prices" in cli(*TRAIN, "--optimizer", "lion").refusal()
    zero3 = cli(*TRAIN[:-1], "3", "--optimizer", "muon").refusal()
    assert "optimizer muon with zero 3" in zero3 and "use --zero 1 (or 0), or --optimizer adam" in zero3
    # Megatron-LM's LayerWiseDistributedOptimizer asserts one distributed-optimizer instance (d98e8a6), and the
    # exports would write --num-distributed-optimizer-instances 2 beside it: refused before any export
    rep = cli(*TRAIN, "--nodes", "2", "--dp-replicate", "2", "--optimizer", "muon").refusal()
    assert "optimizer muon with dp_replicate 2" in rep and "use --dp-replicate 1, or --optimizer adam" in rep
    assert cli(*TRAIN, "--nodes", "2", "--dp-replicate", "2").code == 0
    fp16 = cli(*TRAIN, "--dtype", "fp16", "--optimizer", "muon").refusal()
    assert "optimizer muon with dtype fp16" in fp16 and "use --dtype bf16, or --optimizer adam" in fp16
    infer = cli("estimate", "--mode", "infer", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--optimizer",
                "muon").refusal()
    assert "--optimizer muon applies to training" in infer


def test_search_keeps_the_users_optimizer(cli):
    doc = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--global-batch", "64", "--optimizer",
              "muon", "--top", "5", "--json").json()
    assert doc["plans"] and all(p["plan"]["optimizer"] == "muon" and p["plan"]["zero"] <= 1 for p in doc["plans"])
    adam = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--global-batch", "64", "--top", "5",
               "--json").json()
    assert all(p["plan"]["optimizer"] == "adam" for p in adam["plans"])


def _export(cli, tmp_path, target, *extra):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "plan.json"
    assert cli(*TRAIN, "--optimizer", "muon", *extra, "--save", path, "--force").code == 0
    out = tmp_path / target
    r = cli("export", path, "--to", target, "-o", out)
    text = "\n".join(f.read_text() for f in out.rglob("*") if f.is_file()) if out.exists() else ""
    return r, text


def test_megatron_export_writes_muon_as_priced(cli, tmp_path):
    r, text = _export(cli, tmp_path, "megatron")
    assert r.code == 0, r.err
    for flag in ("--optimizer muon", "--use-distributed-optimizer", "--muon-num-ns-steps 5", "--muon-tp-mode blockwise",
                 "--muon-scalar-optimizer adam"):
        assert flag in text
    assert "--no-use-layer-wise-param-layout" not in text
    r, text = _export(cli, tmp_path / "ar", "megatron", "--grad-reduce", "all-reduce", "--no-overlap-param-gather")
    assert r.code == 0, r.err
    assert "--no-use-layer-wise-param-layout" in text


def test_bridge_export_writes_dist_muon_over_an_all_reducing_ddp(cli, tmp_path):
    r, text = _export(cli, tmp_path, "megatron-bridge", "--grad-reduce", "all-reduce")
    assert r.code == 0, r.err
    for key in ("optimizer.optimizer=dist_muon", "optimizer.muon_num_ns_steps=5", "optimizer.muon_tp_mode=blockwise",
                "ddp.use_distributed_optimizer=false"):
        assert f"'{key}'" in text  # one quoted override a line, as run_recipe.py reads them
    r, _ = _export(cli, tmp_path / "rs", "megatron-bridge")
    assert "Muon over reduce-scattered gradients" in r.refusal()


@pytest.mark.parametrize("target", ["deepspeed", "torchtitan"])
def test_deepspeed_and_torchtitan_refuse_muon(cli, tmp_path, target):
    extra = ("--zero", "0") if target == "deepspeed" else ()
    r, _ = _export(cli, tmp_path, target, *extra)
    msg = r.refusal()
    assert "Muon optimizer" in msg and "--optimizer adam" in msg


def test_the_update_reads_and_writes_one_moment_less_per_matrix_by_hand():
    # compute.optimizer: Adam's memory-bound update reads and writes the fp32 master and both moments; Muon's matrices
    # keep one momentum buffer, so each of the rank's 1/8 share of them moves 2 x 4 bytes less through HBM (the
    # Newton-Schulz GEMMs are priced apart, newton_schulz_seconds)
    from llmplan.cost.compute import optimizer_step_seconds
    m, gpu = M["llama-3.1-8b"], H100.gpu
    adam = ParallelPlan(dp=8, zero=1, global_batch=64)
    muon = adam.model_copy(update={"optimizer": "muon"})
    rp = rank_params(m, adam, 0)
    a = optimizer_step_seconds(rp.total, adam, gpu, rp.expert)
    b = optimizer_step_seconds(rp.total, muon, gpu, rp.expert, muon=muon_params(m, muon, 0))
    assert float(a - b) == pytest.approx(2 * 4 * L * LLAMA_LAYER_MATRICES / 8 / gpu.hbm_achieved_bytes_per_s, rel=1e-12)


def test_newton_schulz_seconds_price_the_by_hand_flops_at_the_gemms_efficiency(monkeypatch):
    # zero 0, tp 1: every rank runs every matrix of Llama 3.1 8B's 32 layers: Q and O (4096 x 4096), K and V
    # (1024 x 4096), fc1 (2 x 14336 x 4096), fc2 (4096 x 14336); at an efficiency of 1 the seconds are their FLOPs
    # (newton_schulz_flops, checked by hand above) over the bf16 rate
    import llmplan.cost.muon as muon
    monkeypatch.setattr(muon, "gemm_shape_efficiency", lambda *a: 1.0)
    m, gpu = M["llama-3.1-8b"], H100.gpu
    plan = ParallelPlan(dp=8, zero=0, global_batch=64, optimizer="muon")
    shapes = [(H, H), (H, H), (K * D, H), (K * D, H), (2 * F, H), (H, F)]
    flops = L * sum(newton_schulz_flops(r, c) for r, c in shapes)
    assert float(newton_schulz_seconds(m, plan, gpu, 0)) == pytest.approx(flops / gpu.sustained_flops("bf16"),
                                                                          rel=1e-12)


def test_vectorised_search_agrees_over_an_all_reducing_ddp_and_in_the_checkpoint():
    # the all-reducing path (grad_reduce all-reduce: the fp32 cast of the owned bf16 gradients, optimizer_copies)
    # and the checkpoint's busiest rank (goodput.checkpoint_rank_bytes, one moment less per Muon matrix) on a MoE
    # model: the search's arrays price them as the one-plan estimate does
    import numpy as np
    from llmplan.cost.goodput import plan_goodput
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    from llmplan.specs.resilience import CheckpointPolicy
    m, cluster = M["mixtral-8x7b"], ClusterSpec(system=H100, num_nodes=2)
    w = Workload(global_batch=64, seq_len=2048, optimizer="muon", grad_reduce="all-reduce", grad_dtype="bf16")
    plans = enumerate_plans(default_space(m, cluster, w, pins={"zero": 1}), cluster, w)
    ok = (i for i in range(len(plans)) if plans.plan(i).dp > 1 and not check_plan(m, plans.plan(i), cluster))
    idx = list(islice(ok, 0, 84, 7))
    assert_arrays_agree(m, cluster, plans, idx)
    policy = CheckpointPolicy(mode="async")
    vec = plan_goodput(m, cluster, plans.take(np.asarray(idx)), np.ones(len(idx)), policy)
    for j, i in enumerate(idx):
        one = plan_goodput(m, cluster, plans.plan(i), 1.0, policy)
        assert float(np.asarray(vec.rank_bytes)[j]) == pytest.approx(float(one.rank_bytes), rel=1e-9)


def test_megatron_export_refuses_muon_over_reduce_scatter_with_expert_biases(cli, tmp_path):
    # NVIDIA/Megatron-LM d98e8a6 megatron/core/optimizer/__init__.py: on the layer-wise + distributed-optimizer path
    # (--use-distributed-optimizer, the default layer-wise param layout) an AdamW group of expert-parallel parameters
    # fails an assert; GPT-OSS's routed experts carry biases (mlp_bias, 1-D: AdamW). The legacy path
    # (--no-use-layer-wise-param-layout, grad_reduce all-reduce) keeps them in the layer-wise optimizer.
    base = ("estimate", "--model", "gpt-oss-20b", "--hardware", "dgx-h100", "--global-batch", "64", "--zero", "1",
            "--ep", "8", "--optimizer", "muon")
    for extra, name in (((), "rs"), (("--grad-reduce", "all-reduce"), "ar")):
        assert cli(*base, *extra, "--save", tmp_path / f"{name}.json").code == 0
    msg = cli("export", tmp_path / "rs.json", "--to", "megatron", "-o", tmp_path / "rs").refusal()
    assert "Muon over reduce-scattered gradients with gpt-oss-20b's expert biases" in msg
    assert "re-plan with --grad-reduce all-reduce" in msg
    assert cli("export", tmp_path / "ar.json", "--to", "megatron", "-o", tmp_path / "ar").code == 0
    assert "--no-use-layer-wise-param-layout" in (tmp_path / "ar" / "megatron_pretrain.sh").read_text()
    # a MoE without expert biases (Qwen3-30B-A3B) exports over the reduce-scatter as before
    q = ("estimate", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--global-batch", "64", "--zero", "1",
         "--ep", "8", "--optimizer", "muon", "--save", tmp_path / "q.json")
    assert cli(*q).code == 0
    assert cli("export", tmp_path / "q.json", "--to", "megatron", "-o", tmp_path / "q").code == 0


def test_search_for_deepspeed_names_the_optimizer_it_refuses(cli):
    # every plan of a Muon search is refused by DeepSpeed whatever else it sets: the walk's one line names Muon (it
    # named context parallelism, the first of the check's rules that a third of the plans met, before)
    msg = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--global-batch", "64", "--optimizer",
              "muon", "--target", "deepspeed").refusal()
    assert "exports to deepspeed" in msg and "the Muon optimizer" in msg and "--optimizer adam" in msg


def test_estimate_and_search_headers_name_muon_within_80_columns(cli):
    est = cli(*TRAIN, "--optimizer", "muon")
    assert est.code == 0, est.err
    assert "optimizer muon" in est.out.split("parameters:")[0]
    assert "optimizer muon" not in cli(*TRAIN).out
    se = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--global-batch", "64", "--optimizer",
             "muon", "--top", "2")
    assert se.code == 0, se.err
    assert "optimizer muon; objective throughput" in " ".join(se.out.split("evaluated")[0].split())
    assert max(len(x) for x in est.out.splitlines() + se.out.splitlines()) <= 80


@pytest.mark.parametrize("hardware,precision,fields", [
    ("dgx-h100", "fp8-tensorwise", ["ddp.fp8_param_gather=false", "model.fp8_param=false"]),
    ("dgx-b200", "mxfp8", ["ddp.fp8_param_gather=false", "model.fp8_param=false",
                           "ddp.reuse_grad_buf_for_mxfp8_param_ag=false",
                           "optimizer.reuse_grad_buf_for_mxfp8_param_ag=false"]),
])
def test_bridge_export_turns_the_presets_weight_gather_off_under_muon(cli, tmp_path, hardware, precision, fields):
    # Muon keeps bf16 weights (check_plan muon_fp8_params); the fp8 presets set fp8_param_gather true
    # (megatron/bridge/training/mixed_precision.py v0.6.0), which the export turns off after the preset, as the
    # Kimi-K2 configs do for MXFP8 (kimi_llm_pretrain.py v0.3.1 - v0.5.0). The tensorwise plan was refused with
    # "re-plan with --fp8-params", which muon_fp8_params refuses in turn.
    path = tmp_path / "plan.json"
    assert cli("estimate", "--model", "llama-3.1-8b", "--hardware", hardware, "--global-batch", "64", "--zero", "1",
               "--optimizer", "muon", "--grad-reduce", "all-reduce", "--precision", precision, "--save",
               path).code == 0
    r = cli("export", path, "--to", "megatron-bridge", "-o", tmp_path / "out")
    assert r.code == 0, r.err
    lines = (tmp_path / "out" / "megatron_bridge_pretrain.sh").read_text().splitlines()
    # written out with the preset's other fields (export.bridge_precision: Hydra refuses a mixed_precision.* key
    # after a preset's name), mixed_precision null so that setup does not put the preset's values back
    at = [i for i, x in enumerate(lines) if x.strip().startswith("'mixed_precision")]
    assert [lines[i].strip() for i in at] == ["'mixed_precision=null'"]
    for field in fields:
        assert [i for i, x in enumerate(lines) if x.strip() == f"'{field}'"][0] > at[0]
    # under Adam the preset's gather must match the plan: the same plan without fp8 weights is refused as before
    assert cli("estimate", "--model", "llama-3.1-8b", "--hardware", hardware, "--global-batch", "64", "--zero", "1",
               "--precision", precision, "--no-fp8-params", "--save", tmp_path / "adam.json").code == 0
    msg = cli("export", tmp_path / "adam.json", "--to", "megatron-bridge", "-o", tmp_path / "a").refusal()
    assert "re-plan with --fp8-params" in msg
