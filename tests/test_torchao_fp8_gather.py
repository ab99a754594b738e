"""FSDP2's float8 all-gather of torchao's Float8Linear weights (docs/formulas.md#comm.torchao_fp8_gather).

Derivation, read at pytorch/ao@36027d82d1 and pytorch/torchtitan v0.2.2 (73a0e69):
- torchao/float8/fsdp_utils.py, WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather: with the scale precomputed
  (torchtitan precompute_float8_dynamic_scale_for_fsdp) the rank's fp32 weight shard is cast with
  hp_tensor_and_scale_to_float8 before every gather and only its fp8 data is gathered (1 B a weight; the
  embedding, output layer and norms are no Float8Linear and gather in bf16).
- The cast, eager (FSDP2's hooks are skipped by dynamo): `tensor.to(float32)` of the fp32 shard returns it,
  `* scale` reads 4 and writes 4, the clamp 4 + 4, `.to(float8)` 4 + 1: 21 B a shard element.
- precompute_float8_dynamic_scale_for_fsdp, once a step after the optimizer: torch._foreach_norm(inf) reads every
  fp32 weight shard (4 B an element) and one all-reduce carries one fp32 amax per Float8Linear.
Llama 3.1 8B: one layer's linears 218,103,808 weights (wq, wk, wv, wo, w1, w3, w2), 7 Float8Linears, 32 layers.
"""

from __future__ import annotations

import pytest
from agreement import assert_arrays_agree, valid_sample

from llmplan.cost.comm import (TORCHAO_FP8_GATHER_CAST_BYTES, dp_transfers, torchao_amax_transfers,
                               torchao_fp8_gather_cast_bytes)
from llmplan.search.grid import Workload, default_space, enumerate_plans
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

L8 = builtin_models()["llama-3.1-8b"]
WEIGHTS = 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 3 * 4096 * 14336
LAYERS, DP = 32, 8


def plan(**kw) -> ParallelPlan:
    """torchtitan's Llama 3.1 8B fp8 plan: FSDP over 8 ranks, torchao tensorwise, float8 all-gather, 4 micro-batches."""
    base = {"tp": 1, "pp": 1, "dp": DP, "zero": 3, "seq_len": 8192, "micro_batch": 1, "global_batch": 32,
            "dtype": "fp8", "recipe": "tensorwise", "fp8_scaling": "current", "tp_impl": "dtensor",
            "flash_attention": True, "fp8_params": True}
    return ParallelPlan(**{**base, **kw})


def test_cast_bytes_per_element_by_hand():
    assert TORCHAO_FP8_GATHER_CAST_BYTES == (4 + 4) + (4 + 4) + (4 + 1) == 21


def test_shard_cast_per_gather_by_hand():
    """21 B x the rank's 1/8 shard of 32 layers x 218,103,808 weights = 18,320,719,872 B a gather of the model."""
    got = torchao_fp8_gather_cast_bytes(L8, plan())
    assert got == 21 * LAYERS * WEIGHTS / DP == 18_320_719_872


def test_the_dense_gathers_carry_the_cast_every_gather():
    """ZeRO-3 without a pipeline gathers each layer twice a micro-batch (forward, backward): 2 x 4 micro-batches
    of the whole shard's cast; the gather itself moves 1 B a linear weight (unchanged)."""
    p = plan()
    gathers = [t for t in dp_transfers(L8, p, 8, 8) if t.collective == "all-gather"]
    dense = gathers[0]
    assert dense.calls * dense.copy_bytes == pytest.approx(2 * 4 * 21 * LAYERS * WEIGHTS / DP)
    off = [t for t in dp_transfers(L8, p.model_copy(update={"fp8_params": False}), 8, 8)
           if t.collective == "all-gather"][0]
    assert off.copy_bytes == 0
    assert off.calls == dense.calls


@pytest.mark.parametrize("update", [{"fp8_params": False}, {"tp_impl": "megatron"}, {"dtype": "bf16",
                                    "fp8_params": False}, {"dp": 1, "global_batch": 4}])
def test_no_cast_off_torchao_fp8_gather(update):
    """Without the float8 all-gather, on Transformer Engine's stack (Megatron-FSDP prices its own), in bf16, or
    with nothing sharded (torchtitan enables it only with dp_shard > 1): no shard cast, no amax all-reduce."""
    p = plan(**update)
    assert torchao_fp8_gather_cast_bytes(L8, p) == 0
    (t,) = torchao_amax_transfers(L8, p, 8)
    assert t.calls == 0


def test_precomputed_scale_once_a_step_by_hand():
    """One all-reduce a step of 32 layers x 7 Float8Linears x 4 B = 896 B, after reading every shard (4 B an fp32
    element, 1/8 of 32 x 218,103,808)."""
    (t,) = torchao_amax_transfers(L8, plan(), 8)
    assert (t.collective, t.calls, t.message, t.step_end) == ("all-reduce", 1, 896, True)
    assert t.copy_bytes == 4 * LAYERS * WEIGHTS / DP


def test_a_pipeline_casts_once_a_step():
    """Under a pipeline FSDP keeps the stage gathered over the micro-batches: one gather, one cast a step, of the
    stage's 16 layers."""
    p = plan(pp=2, dp=4, global_batch=32)
    dense = [t for t in dp_transfers(L8, p, 4, 4) if t.collective == "all-gather"][0]
    assert dense.calls * dense.copy_bytes == pytest.approx(21 * 16 * WEIGHTS / 4)


def test_the_search_prices_the_fp8_gather_as_the_scalar_estimate():
    """Plan arrays (tp, pp, micro-batch varying) price the casts and the amax all-reduce as the scalar estimate."""
    cluster = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=2)
    w = Workload(global_batch=64, seq_len=4096, dtype="fp8", recipe="tensorwise", fp8_scaling="current",
                 tp_impl="dtensor", fp8_params=True)
    plans = enumerate_plans(default_space(L8, cluster, w), cluster, w)
    idx = valid_sample(L8, cluster, plans, seed=5, scan=300, n=6, keep=lambda p: p.zero >= 2 and p.zero_shard > 1)
    assert idx
    assert_arrays_agree(L8, cluster, plans, idx)
