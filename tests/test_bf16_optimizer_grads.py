"""DeepSpeed's BF16_Optimizer keeps the bf16 param.grad beside its fp32 flat gradient
(docs/formulas.md#mem.bf16_optimizer_grads).

deepspeedai/DeepSpeed deepspeed/runtime/bf16_optimizer.py at 56c522386 (2022-04-19, "bf16+pipeline
parallelism"): `fp32_groups_gradients_flat` is a zeroed fp32 copy of the whole flat bf16 weights (not sharded),
`update_hp_grads(clear_lp_grads=False)` adds `lp.grad.to(fp32)` into it and leaves `lp.grad`, and
deepspeed/runtime/pipe/engine.py `_exec_backward_pass` calls `clear_lp_grads()` only before the next backward.
So a rank holds 2 (bf16 weights) + 4 (fp32 gradients) + 2 (bf16 gradients) bytes a parameter, plus its
partition of the fp32 master and moments. BigScience's chronicle of the optimizer (bigscience-workshop/bigscience
train/tr11-176B-ml/chronicles-prequel.md, 'Rebalancing layers', 2022-02-28): "The additional memory usage is
4bytes x params and it's not sharded across gpus" -- against the fp16 ZeRO-1 runs' 2-byte gradients, 4 more
bytes a parameter: the fp32 gradient (2 more than a 16-bit one) and the kept bf16 one (2).
"""

from __future__ import annotations

import pytest

from llmplan.cost.memory import stage_memory, training_memory
from llmplan.cost.model_states import bf16_optimizer
from llmplan.specs.allowance import MemoryAllowance
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

FINAL = "bloom-176b-final-run"


def test_which_plans_run_the_bf16_optimizer() -> None:
    bf16_opt = ParallelPlan(dp=8, zero=1, grad_reduce="all-reduce", grad_dtype="fp32", grad_accumulation="cast-add")
    assert bool(bf16_optimizer(bf16_opt))
    # torchtitan's DDP (ZeRO 0: fp32 parameters under autocast, no bf16 param.grad kept)
    assert not bf16_optimizer(ParallelPlan(dp=8, zero=0, grad_dtype="fp32", grad_accumulation="cast-add"))
    # DeepSpeed's fp16 ZeRO-1 (16-bit gradients, autograd's add) and Megatron's distributed optimizer
    assert not bf16_optimizer(ParallelPlan(dp=8, zero=1, grad_reduce="all-reduce", dtype="fp16", grad_dtype="bf16",
                                           grad_accumulation="add"))
    assert not bf16_optimizer(ParallelPlan(dp=8, zero=1, grad_dtype="fp32"))


def test_bloom_final_run_first_stage_holds_both_gradients(published_runs, acc) -> None:
    # BLOOM's final run (train/tr11-176B-ml/README.md): 70 layers, h 14,336, vocabulary 250,880, TP4 PP12 DP8,
    # 'type:transformer|embedding' (72 slots, 6 a stage): stage 0 holds the tied embedding and 5 layers.
    # By hand, per TP rank: a layer 12h^2/4 weights + the column-parallel biases (3h + 4h)/4 + the row-parallel
    # biases h + h + two LayerNorms 4h = 3h^2 + 7.75h; the embedding V h / 4 (its LayerNorm's 2h = 28,672 are
    # not in llmplan's count, docs/validation.md#bloom-oom-audit).
    h, v = 14336, 250880
    params = 5 * (3 * h * h + 7.75 * h) + v * h / 4
    assert params == 3_982_522_880
    m, cluster, plan = acc.record_setup(published_runs[FINAL], "bloom", None)
    assert bool(bf16_optimizer(plan))
    mem = stage_memory(m, plan, 0, MemoryAllowance(), cluster.system.gpu.hbm_bytes)
    assert float(mem.params_on_rank) == params
    # fp32 flat gradient (4 B) + the kept bf16 param.grad (2 B), both unsharded; tolerance: exact
    assert float(mem.gradients) == 6 * params
    # the fp32 master and Adam's two moments, sharded over DP 8 (12 B / 8)
    assert float(mem.optimizer) == pytest.approx(12 * params / 8, rel=1e-12)


# The 02-28 'Rebalancing layers' verdicts (17 layouts fit, the DP16 TP4 PP6 attempts do not) are checked once, with
# both mechanisms priced: tests/test_reduce_dtype.py::test_rebalancing_layers_tp4_pp6_attempts_do_not_fit.


def test_vectorised_search_prices_the_bf16_gradients_as_the_scalar_estimate() -> None:
    import dataclasses
    from itertools import islice

    import numpy as np

    from llmplan.search.evaluate import evaluate_memory
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    from llmplan.specs.check import check_plan
    from llmplan.specs.plan import ClusterSpec
    from llmplan.specs.registry import builtin_systems

    m, cluster = builtin_models()["llama-3.1-8b"], ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=1)
    gpu = cluster.system.gpu
    w = Workload(global_batch=64, seq_len=2048, grad_dtype="fp32", grad_reduce="all-reduce",
                 grad_accumulation="cast-add", overlap_grad_reduce=False)  # check_switches bf16_optimizer_overlap
    space = dataclasses.replace(default_space(m, cluster, w), zero=(0, 1))
    plans = enumerate_plans(space, cluster, w)
    ok = (i for i in range(len(plans)) if not check_plan(m, plans.plan(i), cluster))
    idx = list(islice(ok, 0, 400, 7))
    arr = evaluate_memory(m, cluster, plans.take(np.asarray(idx)))
    kinds = set()
    for j, i in enumerate(idx):
        p = plans.plan(i)
        kinds.add(bool(bf16_optimizer(p)))
        one = training_memory(m, p, gpu.hbm_bytes, None, gpu.fp8_tn_only, gpu.nccl_sms, gpu.compute_capability)
        for f in ("gradients", "total"):
            got = np.broadcast_to(getattr(arr, f), (len(idx),))[j]
            assert float(got) == pytest.approx(float(getattr(one, f)), rel=1e-9), (f, i)
        if bool(bf16_optimizer(p)):  # 4 + 2 bytes a parameter of the rank (ZeRO 1 keeps them whole)
            assert float(one.gradients) == pytest.approx(6 * float(one.params_on_rank), rel=1e-12)
    assert kinds == {True, False}


def test_muon_plans_do_not_run_the_bf16_optimizer() -> None:
    # BF16_Optimizer wraps an Adam-family optimizer; a Muon plan with the same switches is Megatron's layer-wise
    # optimizer: no kept bf16 param.grad, no bf16 reduction copy. Tolerance: exact
    from llmplan.cost.model_states import bf16_reduction, lp_grad_bytes
    from llmplan.cost.params import RankParams

    switches = dict(dp=8, zero=1, grad_reduce="all-reduce", grad_dtype="fp32", grad_accumulation="cast-add",
                    grad_reduce_dtype="bf16")
    adam, muon = ParallelPlan(**switches), ParallelPlan(**switches, optimizer="muon")
    rp = RankParams(dense=1.5e9, expert=0.0)
    assert float(lp_grad_bytes(adam, rp)) == 3e9 and bool(bf16_reduction(adam))
    assert not bf16_optimizer(muon) and not bf16_reduction(muon)
    assert float(lp_grad_bytes(muon, rp)) == 0.0
