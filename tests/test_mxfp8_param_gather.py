"""Megatron-Core's distributed-optimizer gather of MXFP8 weights staged through bf16 (docs/formulas.md
#comm.param_gather_bytes, #step.mxfp8_param_unstage; docs/validation.md#mxfp8-param-gather).

Sources: NVIDIA/Megatron-LM megatron/core/distributed/param_and_grad_buffer.py at 0d8e0714cd (the pin of
Megatron-Bridge v0.2.0) .. 2a75ac12c (the pin of 067f987d): with use_distributed_optimizer and any MXFP8
parameter a bucket's param_data is the bf16 view of a buffer shared with the gradients ("Create a shared buffer
for param AG and grad RS"); optimizer/distrib_optimizer.py _copy_main_params_to_param_buffer copies the fp32
master shard into it; after the gather each weight is cast into its MXFP8 tensor ("The parameters are cast from
bf16 to MXFP8 during copy") and the bf16 slice zeroed (bucket.param_data.zero_()). Non-MXFP8 fp8 parameters
use a uint8 param buffer (param_dtype torch.uint8: one byte); NVFP4 its packed rowwise bytes (nvfp4_packed_numel,
from d0b3b7754)."""

from __future__ import annotations

from itertools import islice

import pytest

from agreement import assert_arrays_agree
from llmplan.cost.comm import dp_transfers, param_gather_bytes
from llmplan.cost.model_states import low_precision_weight_cache, low_precision_weights
from llmplan.cost.overhead import mxfp8_param_unstage_seconds
from llmplan.estimate import estimate_training
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()
GB200 = builtin_systems()["gb200-nvl72"]
GPT_OSS_B300 = "mbridge-26.06-pretrain-gpt-oss-120b-dgx-b300-64gpu-mxfp8-tp1pp1cp1ep8vpnagbs1280mbs4"


def plan(**kw) -> ParallelPlan:
    base = {"dp": 8, "zero": 1, "global_batch": 64, "dtype": "fp8", "recipe": "mxfp8", "fp8_params": True}
    return ParallelPlan(**{**base, **kw})


@pytest.mark.parametrize("kw,expected", [
    ({}, 2.0),  # MXFP8, distributed optimizer: the bf16 view of the shared buffer
    ({"zero": 3}, 1.0),  # Megatron-FSDP gathers the MXFP8 rowwise / columnwise data (outer_weight_copies)
    ({"recipe": "tensorwise"}, 1.0),  # per-tensor fp8 (current / delayed scaling): the uint8 param buffer
    ({"recipe": "blockwise"}, 1.0),
    ({"dtype": "fp4", "recipe": "nvfp4"}, 0.5),  # packed E2M1 rowwise bytes; the scales are not gathered
    ({"fp8_params": False}, 2.0),  # bf16 weights, the recipe's copies a cache
])
def test_gather_bytes_per_weight_by_recipe(kw, expected):
    assert float(param_gather_bytes(plan(**kw))) == expected


def test_the_zero1_gather_moves_twice_the_mxfp8_weight_bytes():
    # the all-gather message of a ZeRO-1 MXFP8 plan is 2 bytes a weight: its tensorwise twin's GEMM weights x 2,
    # the bf16-kept parameters (embedding, output layer, norms: 2 x 128256 x 4096 + 65 x 4096) at 2 in both
    # (docs/formulas.md#mem.fp8_param_bf16_parts); the reduce-scatter unchanged
    m = M["llama-3.1-8b"]

    def gathers(p: ParallelPlan) -> tuple[float, float]:
        out = dp_transfers(m, p, "dpcp", "edp")
        ag = sum(float(t.calls * t.message) for t in out if t.collective == "all-gather")
        rs = sum(float(t.calls * t.message) for t in out if t.collective == "reduce-scatter")
        return ag, rs
    (ag, rs), (ag1, rs1) = gathers(plan()), gathers(plan(recipe="tensorwise"))
    kept = 2 * 128256 * 4096 + 65 * 4096
    assert ag - 2 * kept == pytest.approx(2 * (ag1 - 2 * kept)) and rs == pytest.approx(rs1)


def test_unstage_seconds_by_hand():
    # per low-precision weight: read bf16 (2), write the MXFP8 rowwise and columnwise copies (1 + 1/32 each,
    # OCP MX spec: an E8M0 scale per 32), zero the bf16 slice (2) = 6.0625 bytes, at the achieved HBM rate
    p, gpu = plan(), GB200.gpu
    assert float(mxfp8_param_unstage_seconds(p, 1e9, gpu)) == pytest.approx(6.0625e9 / gpu.hbm_achieved_bytes_per_s)
    assert float(mxfp8_param_unstage_seconds(plan(zero=3), 1e9, gpu)) == 0.0
    assert float(mxfp8_param_unstage_seconds(plan(recipe="tensorwise"), 1e9, gpu)) == 0.0


def test_memory_charges_the_mxfp8_tensor_and_no_gather_buffer():
    # the gather writes into the gradient buffer (shared_buffer), so a linear weight costs its MXFP8 tensor
    # (rowwise + columnwise, 2 x (1 + 1/32) bytes) and its gradient, no separate parameter buffer
    m, p = M["llama-3.1-8b"], plan()
    weights = low_precision_weights(m, p, 0)
    per_weight = p.weight_bytes + float(low_precision_weight_cache(m, p, 0, fp8_tn_only=False)) / weights
    assert per_weight == pytest.approx(2 * (1 + 1 / 32))


def test_the_gpt_oss_b300_row_stages_its_gather_and_pays_the_cast(row_setup):
    # Megatron-Bridge 26.06 GPT-OSS 120B on B300 (bf16_with_mxfp8_mixed: fp8_param_gather and
    # reuse_grad_buf_for_mxfp8_param_ag, training/mixed_precision.py at v0.5.0), distributed optimizer
    m, c, p = row_setup(GPT_OSS_B300)
    assert (p.zero, p.recipe, p.fp8_params) == (1, "mxfp8", True)
    e = estimate_training(m, c, p)
    hand = 6.0625 * float(low_precision_weights(m, p, 0)) / c.system.gpu.hbm_achieved_bytes_per_s
    assert float(e.time.overheads["mxfp8_param_unstage"]) == pytest.approx(hand)
    assert hand > 0.01  # about 18 ms on a 3.9 s step


def test_vectorised_search_agrees_with_the_scalar_estimate():
    # the search's arrays (search.evaluate) and the one-plan estimate price the staged gather and the cast alike
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    m, cluster = M["qwen3-30b-a3b"], ClusterSpec(system=GB200, num_nodes=4)
    w = Workload(global_batch=64, seq_len=4096, dtype="fp8", recipe="mxfp8", fp8_params=True)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    ok = (i for i in range(len(plans)) if plans.plan(i).zero == 1 and plans.plan(i).dp > 1
          and not check_plan(m, plans.plan(i), cluster))
    idx = list(islice(ok, 20))
    assert_arrays_agree(m, cluster, plans, idx)
    assert all(float(estimate_training(m, cluster, plans.plan(i)).time.overheads["mxfp8_param_unstage"]) > 0
               for i in idx)
