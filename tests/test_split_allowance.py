"""The fragmentation allowance on churned tensors only (docs/formulas.md#mem.fragmentation).

PyTorch's caching allocator gives an allocation of 10 MiB or more a segment of its own rounded up to 2 MiB
(pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp at 001074d25084: kMinLargeAlloc 10485760, kRoundLarge
2097152, get_allocation_size), so the buffers held all run (weights, Megatron's contiguous gradient buffer,
optimizer states) carry no allowance; `--fragmentation` (5%) is a fraction of the tensors freed and allocated
again: activations, fresh weight gradients, gathered ZeRO-3 buffers, and the gradients DeepSpeed's ZeRO-1/2
frees at each step (microsoft/DeepSpeed deepspeed/runtime/zero/stage_1_and_2.py at 2151c787a, step:
free_grad_in_param_list).
"""

from __future__ import annotations

import pytest

from llmplan.cost.memory import churned_bytes, training_memory
from llmplan.cost.model_states import churned_gradients
from llmplan.specs.allowance import MemoryAllowance
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models
from llmplan.units import GIB

NEMO_20B = "nemo2407-pretrain-gpt3-20b-64gpu-gbs256"
BLOOM_OOM = "bloom-prequel-gbs-and-tp-variations-L72h14336a64-dp32tp2pp6mbs1gbs2048z1"


def test_hand_computed_held_and_churned() -> None:
    # By hand: 10 GiB of activations, 0.5 GiB of fresh gradients, no gathered buffers, a 4 GiB gradient that
    # DeepSpeed frees at each step: churned 14.5 GiB, 5% of it 0.725 GiB. The held 20 GiB of weights and
    # optimizer states add nothing (a flat 5% of every tensor, the old rule, gave 0.05 x 34.5 = 1.725 GiB).
    assert churned_bytes(10 * GIB, 0.5 * GIB, 0.0, 4 * GIB) == 14.5 * GIB
    assert 0.05 * churned_bytes(10 * GIB, 0.5 * GIB, 0.0, 4 * GIB) == pytest.approx(0.725 * GIB)
    # Megatron's contiguous buffer (held): the same rank's gradients leave the base, 0.05 x 10.5 GiB
    assert 0.05 * churned_bytes(10 * GIB, 0.5 * GIB, 0.0, 0.0) == pytest.approx(0.525 * GIB)


def test_which_gradients_churn() -> None:
    # stage_1_and_2.py's path (all-reduce, 16-bit gradients under an fp32 master) churns; Megatron's
    # distributed optimizer (reduce-scatter into its buffer) and BF16_Optimizer's fp32 gradients do not.
    ds = ParallelPlan(dp=8, zero=1, grad_reduce="all-reduce", dtype="fp16", grad_dtype="bf16")
    assert ds.grad_bytes < ds.master_bytes and bool(churned_gradients(ds))
    assert not churned_gradients(ParallelPlan(dp=8, zero=1))
    assert not churned_gradients(ParallelPlan(dp=8, zero=1, grad_reduce="all-reduce", grad_dtype="fp32"))
    assert not churned_gradients(ParallelPlan(dp=8, zero=0, grad_reduce="all-reduce", grad_dtype="bf16"))
    # ZeRO-2/3 under a pipeline runs only on FSDP2 (PyTorch pipelining), which frees the stage's unsharded
    # gradients after each reduce-scatter (review of split-allowance); Megatron-FSDP and pp 1 are not that path.
    assert bool(churned_gradients(ParallelPlan(pp=2, dp=4, zero=2)))
    assert bool(churned_gradients(ParallelPlan(pp=2, dp=4, zero=3)))
    assert not churned_gradients(ParallelPlan(pp=2, dp=4, zero=1))
    assert not churned_gradients(ParallelPlan(pp=1, dp=8, zero=2))


def test_pipelined_zero2_gradients_get_the_allowance() -> None:
    # The reviewer's case: llama-3.1-8b pp 2 dp 4 ZeRO-2 with fp32 gradients -- the stage's whole gradients are
    # churned beside the activations, so 5% of them joins the allowance.
    m = builtin_models()["llama-3.1-8b"]
    p = ParallelPlan(pp=2, dp=4, zero=2, grad_dtype="fp32", seq_len=4096, micro_batch=1, global_batch=64)
    mem = training_memory(m, p, 80 * GIB, MemoryAllowance(fragmentation=0.05))
    assert float(mem.gradients) > 10 * GIB
    assert float(mem.churned) == pytest.approx(float(mem.activations + mem.fresh_grad + mem.gradients))


@pytest.mark.parametrize("deepspeed", [False, True])
def test_only_churned_bytes_scale_with_the_fraction(deepspeed: bool) -> None:
    # Raising --fragmentation from 5% to 15% moves the total by 10% of the activations (+ fresh gradients,
    # + DeepSpeed's per-step gradients), never by the held weights and optimizer states.
    m = builtin_models()["llama-3.1-8b"]
    kw = dict(dp=8, zero=1, recompute="selective", seq_len=4096, micro_batch=1, global_batch=64)
    if deepspeed:
        kw.update(grad_reduce="all-reduce", grad_dtype="bf16")
    p = ParallelPlan(**kw)
    lo = training_memory(m, p, 80 * GIB, MemoryAllowance(fragmentation=0.05))
    hi = training_memory(m, p, 80 * GIB, MemoryAllowance(fragmentation=0.15))
    base = float(lo.activations + lo.fresh_grad) + (float(lo.gradients) if deepspeed else 0.0)
    assert float(lo.churned) == pytest.approx(base)
    assert float(lo.fragmentation) == pytest.approx(0.05 * base)
    assert float(hi.total - lo.total) == pytest.approx(0.10 * base)
    assert hi.weights == lo.weights and hi.optimizer == lo.optimizer and hi.gradients == lo.gradients


def _memory(acc, published_runs, rid: str):
    from llmplan.estimate import estimate_training

    rec = published_runs[rid]
    m, c, p = acc.record_setup(rec, acc.family(rid), None)
    return estimate_training(m, c, p).memory


def test_nemo_2407_gpt3_20b_fp8_fits(published_runs, acc) -> None:
    # NVIDIA/NeMo docs/source/performance/performance_summary.md (NeMo 24.07, DGX-H100, FP8), Pretraining
    # table: GPT3-20B on 64 GPUs, TP2 PP1 DP32, micro-batch 2, global batch 256 ran (5,851 tokens/s/GPU).
    # With 5% of every tensor it was priced 0.78 GiB over 79.2 GiB; its held model states (Apex/Megatron
    # buffers) now carry none. Tolerance: the verdict, with at least 1 GiB to spare (the split's priced
    # margin is 1.86 GiB, docs/validation.md#split-allowance).
    mem = _memory(acc, published_runs, NEMO_20B)
    assert mem.fits
    assert float(mem.headroom) > 1.0 * GIB


def test_bloom_tp2_pp6_dp32_attempt_does_not_fit(published_runs, acc) -> None:
    # bigscience-workshop/bigscience train/tr11-176B-ml/chronicles-prequel.md, 'GBS Variations' (2022-02-25):
    # 72 layers, h 14,336, TP2 PP6 DP32, micro-batch 1, ZeRO-1: OOM. DeepSpeed's fp16 ZeRO-1 frees every
    # param.grad at the step, so its 30.9 GiB of gradients churn and carry the 5% with the activations.
    # Tolerance: the verdict only (the priced excess is 0.29 GiB, docs/validation.md#split-allowance).
    mem = _memory(acc, published_runs, BLOOM_OOM)
    assert bool(churned_gradients(acc.record_setup(published_runs[BLOOM_OOM], "bloom", None)[2]))
    assert not mem.fits


def test_vectorised_search_prices_the_allowance_as_the_scalar_estimate() -> None:
    # the search's plan arrays go through the same stage_memory: churned bytes, the allowance and the totals
    # agree plan by plan, DeepSpeed's per-step gradients (grad_reduce all-reduce, fp16) and Megatron's alike
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
    for w in (Workload(global_batch=64, seq_len=2048),
              Workload(global_batch=64, seq_len=2048, grad_dtype="bf16", grad_reduce="all-reduce")):
        space = dataclasses.replace(default_space(m, cluster, w), zero=(1,))  # all-reduce: zero 0 or 1
        plans = enumerate_plans(space, cluster, w)
        ok = (i for i in range(len(plans)) if not check_plan(m, plans.plan(i), cluster))
        idx = list(islice(ok, 0, 400, 9))
        arr = evaluate_memory(m, cluster, plans.take(np.asarray(idx)))
        assert idx
        for j, i in enumerate(idx):
            one = training_memory(m, plans.plan(i), gpu.hbm_bytes, None, gpu.fp8_tn_only, gpu.nccl_sms,
                                  gpu.compute_capability)
            for f in ("churned", "fragmentation", "total"):
                got = np.broadcast_to(getattr(arr, f), (len(idx),))[j]
                assert float(got) == pytest.approx(float(getattr(one, f)), rel=1e-9), (f, i)
