"""Megatron-LM's mixed-precision optimizer runs fp32 passes of its own over the rank's optimizer shard
(docs/formulas.md#compute.optimizer_fp32_passes): NVIDIA/Megatron-LM 6985e58938 megatron/optimizer/optimizer.py
Float16OptimizerWithFloat16Params.step: `_copy_model_grads_to_main_grads` (`main_param.grad =
model_param.grad.float()`), `_unscale_main_grads_and_check_for_nan` with a grad scaler
(`torch._amp_foreach_non_finite_check_and_unscale_` over the fp32 grads), clip_grad_norm_fp32 and Adam on the fp32
grads, `_copy_main_params_to_model_params` (a multi-tensor copy from the fp32 master to the 16-bit weights).
Expected bytes per parameter are written out by hand from those calls:

* fp16, 2-byte gradients (Narayanan et al. 2021's runs): cast 2 + 4, unscale 4 + 4, norm 4, clipping 4 + 4,
  Adam reads the gradient 4 and the master and two moments 12 and writes those 12, the copy reads the master 4
  and writes the fp16 weight 2: 6 + 8 + 4 + 8 + 28 + 6 = 60 (llmplan's single update: 34).
* bf16, fp32 gradients (Megatron-Core r0.8's default --accumulate-allreduce-grads-in-fp32): no cast
  (`.float()` of an fp32 tensor is itself), no scaler: 4 + 8 + 28 + 6 = 46 (was 42).
* bf16, 2-byte gradients (--grad-reduce-in-bf16): 6 + 4 + 8 + 28 + 6 = 52 (was 34).
"""

from __future__ import annotations

import pytest

from llmplan.cost.compute import optimizer_step_seconds
from llmplan.export.deepspeed import grad_checks_refusal as deepspeed_refusal
from llmplan.export.torchtitan import grad_checks_refusal as torchtitan_refusal
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

A100 = builtin_systems()["dgx-a100"].gpu
PARAMS = 1_650_000_000  # any count: about the 1.7B Table 1 row's parameters per GPU (TP 1)


def plan(**kw) -> ParallelPlan:
    base = {"dp": 8, "zero": 0, "micro_batch": 1, "global_batch": 8, "seq_len": 2048}
    return ParallelPlan(**{**base, **kw})


@pytest.mark.parametrize("dtype, grad_dtype, off, on", [
    ("fp16", "bf16", 34, 60),  # grad_dtype bf16 = 2-byte gradients (fp16 ones under dtype fp16)
    ("bf16", "fp32", 42, 46),
    ("bf16", "bf16", 34, 52),
])
def test_bytes_per_parameter_by_hand(dtype, grad_dtype, off, on):
    bw = A100.hbm_achieved_bytes_per_s
    without = optimizer_step_seconds(PARAMS, plan(dtype=dtype, grad_dtype=grad_dtype), A100)
    with_passes = optimizer_step_seconds(PARAMS, plan(dtype=dtype, grad_dtype=grad_dtype,
                                                      optimizer_fp32_passes=True), A100)
    assert without == pytest.approx(PARAMS * off / bw, rel=1e-12)
    assert with_passes == pytest.approx(PARAMS * on / bw, rel=1e-12)


def test_the_distributed_optimizer_runs_them_on_its_shard():
    """zero 1 over dp 8: the same 46 bytes on an eighth of the parameters."""
    p = plan(zero=1, optimizer_fp32_passes=True)
    assert optimizer_step_seconds(PARAMS, p, A100) == pytest.approx(
        PARAMS / 8 * 46 / A100.hbm_achieved_bytes_per_s, rel=1e-12)


@pytest.mark.parametrize("kw, words", [
    ({"dtype": "fp32"}, "dtype fp32"),
    ({"optimizer_moment_dtype": "bf16"}, "optimizer_moment_dtype bf16"),
    ({"megatron_fsdp": True, "zero": 3}, "megatron_fsdp"),
])
def test_the_plan_refuses_them_where_megatron_does_not_run_them(kw, words):
    with pytest.raises(ValueError) as err:
        plan(optimizer_fp32_passes=True, **kw)
    text = str(err.value)
    assert words in text and "set optimizer_fp32_passes false" in text


def test_check_plan_refuses_them_with_zero_2_or_3():
    m = builtin_models()["llama-3.1-8b"]
    cluster = ClusterSpec(system=builtin_systems()["dgx-a100"], num_nodes=1, gpus_per_node=8)
    bad = [v.rule for v in check_plan(m, plan(zero=3, optimizer_fp32_passes=True), cluster)]
    assert "optimizer_fp32_passes_zero" in bad
    good = [v.rule for v in check_plan(m, plan(zero=1, optimizer_fp32_passes=True), cluster)]
    assert "optimizer_fp32_passes_zero" not in good


@pytest.mark.parametrize("refusal", [deepspeed_refusal, torchtitan_refusal])
def test_deepspeed_and_torchtitan_refuse_them(refusal):
    what, refused, fix = refusal(plan(optimizer_fp32_passes=True))
    assert refused and "optimizer_fp32_passes" in what and "NaN check" not in what
    assert fix == "set optimizer_fp32_passes false, or export to megatron"
    assert not refusal(plan())[1]
