"""Megatron-LM's passes over the gradient buffer before each data-parallel reduction (docs/formulas.md#step.grad_buffer):
the NaN check's norm of every bucket and the 1/dp pre-scaling, counted from the code, priced per step, read for
the Megatron-Core r0.8 rows, written by the exports or refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from test_switch_cli import edited  # a shipped plan file with some plan keys changed

from llmplan.cost.overhead import grad_buffer_seconds
from llmplan.estimate import estimate_training
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_systems

H100 = builtin_systems()["dgx-h100"]

# NVIDIA/Megatron-LM megatron/core/distributed/param_and_grad_buffer.py at core_r0.8.0, Bucket.start_grad_sync,
# one (reads, writes) of the bucket's gradient buffer per kernel: `self.grad_data.norm(p=2)` under
# check_for_nan_in_grad, and `self.grad_data *= self.gradient_scaling_factor` (1/dp without average_in_collective).
NAN_CHECK_KERNELS = ((1, 0),)
PRESCALE_KERNELS = ((1, 1),)


def passes(kernels: tuple[tuple[int, int], ...]) -> int:
    return sum(r + w for r, w in kernels)


@settings(derandomize=True, max_examples=40, deadline=None)
@given(nan=st.booleans(), prescale=st.booleans(), grad=st.sampled_from(["fp32", "bf16"]),
       params=st.floats(1e8, 1e10), dp=st.sampled_from([2, 8, 48]))
def test_passes_are_counted_from_megatrons_bucket_kernels(nan, prescale, grad, params, dp):
    plan = ParallelPlan(dp=dp, zero=1, grad_dtype=grad, grad_nan_check=nan, grad_prescale=prescale,
                        global_batch=dp)
    n = passes(NAN_CHECK_KERNELS) * nan + passes(PRESCALE_KERNELS) * prescale
    gpu = H100.gpu
    assert grad_buffer_seconds(plan, params, gpu) == pytest.approx(
        n * plan.grad_bytes * params / gpu.hbm_achieved_bytes_per_s)


def test_zero2_without_a_pipeline_checks_every_micro_batchs_reduction():
    # ZeRO-2/3 reduce-scatter after every micro-batch, so the bucket passes run once per micro-batch
    once = ParallelPlan(dp=8, zero=1, grad_nan_check=True, grad_prescale=True, global_batch=32)
    every = once.model_copy(update={"zero": 2})
    assert every.num_microbatches == 4
    gpu = H100.gpu
    assert grad_buffer_seconds(every, 1e9, gpu) == pytest.approx(4 * grad_buffer_seconds(once, 1e9, gpu))


def test_the_passes_join_the_step_overheads():
    from llmplan.specs.cluster import ClusterSpec
    from llmplan.specs.registry import builtin_models

    m = builtin_models()["llama-3.1-8b"]
    off = ParallelPlan(tp=1, dp=8, zero=1, global_batch=64, seq_len=4096)
    on = off.model_copy(update={"grad_nan_check": True, "grad_prescale": True})
    cluster = ClusterSpec(system=H100, num_nodes=1)
    a, b = estimate_training(m, cluster, off), estimate_training(m, cluster, on)
    assert float(a.time.overheads["grad_buffer"]) == 0.0
    added = float(b.time.total - a.time.total)
    assert added == pytest.approx(float(b.time.overheads["grad_buffer"]))
    assert added == pytest.approx(grad_buffer_seconds(on, float(b.memory.params_on_rank), H100.gpu))


def test_megatron_core_r08_smallest_row_pays_the_bucket_passes(acc, published_runs):
    # NVIDIA/Megatron-LM README at core_r0.8.0, 'Training Speed and Scalability' (images/model_table.png): GPT 1.7B
    # on 48 H100 at TP1 PP1 DP48, batch 192: 41% MFU, with Megatron-LM's defaults (the README lists only the
    # overlap flags). 1.75B parameters per rank (untied output layer: MEGATRON_R08_GPT) in fp32 gradients, 12 bytes
    # each (norm read, scale read + write): about 21 GB, 1-3% of a 0.4 s step. Stated tolerance: within 15% of the
    # published MFU.
    rec = published_runs["megatron-core-r0.8-weak-1.7b"]
    plan = acc.plan_for(rec, "megatron", rec["hardware"]["gpus"])
    assert plan.grad_nan_check and plan.grad_prescale and plan.grad_dtype == "fp32"
    # scored on the table's TFLOP/s column (408.8, the 41% MFU column rounded to a whole percent)
    (_, tflops, measured), *_ = acc.predict(rec, "megatron")
    assert measured == 408.8
    assert abs(tflops - measured) / measured < 0.15, tflops
    m, cluster = acc.model_for(rec, "megatron"), acc.cluster_of(H100, 48)
    with_passes = acc.estimate_training(m, cluster, plan)
    without = acc.estimate_training(m, cluster, plan.model_copy(update={"grad_nan_check": False,
                                                                        "grad_prescale": False}))
    share = float(with_passes.time.total - without.time.total) / float(with_passes.time.total)
    assert 0.01 < share < 0.03, share


def test_a_full_iteration_graph_refuses_the_nan_check():
    # Megatron-LM arguments.py (d98e8a6): --cuda-graph-impl full_iteration asserts --no-check-for-nan-in-loss-and-grad
    with pytest.raises(ValidationError, match="grad_nan_check with cuda_graphs full-iteration"):
        ParallelPlan(grad_nan_check=True, cuda_graphs="full-iteration")


def _export(cli, plan: Path, target: str, out: Path) -> tuple[int, str, str]:
    r = cli("export", plan, "--to", target, "-o", out)
    files = "\n".join(f.read_text() for f in out.rglob("*") if f.is_file()) if out.exists() else ""
    return r.code, files, r.err


def test_exports_write_what_the_plan_priced_or_refuse(cli, tmp_path):
    # Megatron-LM arguments.py (d98e8a6): --no-check-for-nan-in-loss-and-grad, --ddp-average-in-collective;
    # Megatron-Bridge DistributedDataParallelConfig.check_for_nan_in_grad / average_in_collective
    (tmp_path / "off").mkdir()
    (tmp_path / "on").mkdir()
    off = edited(tmp_path / "off", "dense_train")
    on = edited(tmp_path / "on", "dense_train", grad_nan_check=True, grad_prescale=True)
    for plan, priced in ((off, False), (on, True)):
        code, files, err = _export(cli, plan, "megatron", plan.parent / "m")
        assert code == 0, err
        # the NaN check, a safety net, stays on in the launch; a plan priced without it says so in the header
        flag_lines = [ln.strip() for ln in files.splitlines() if not ln.lstrip().startswith("#")]
        assert not any(ln.startswith("--no-check-for-nan-in-loss-and-grad") for ln in flag_lines)
        assert ("gradient NaN check stays on" in files) == (not priced)
        assert ("--ddp-average-in-collective" in files) == (not priced)
        code, files, err = _export(cli, plan, "megatron-bridge", plan.parent / "b")
        assert code == 0, err
        assert f"ddp.check_for_nan_in_grad={str(priced).lower()}" in files.lower()
        assert f"ddp.average_in_collective={str(not priced).lower()}" in files.lower()
    fsdp = edited(tmp_path, "fsdp_train", grad_nan_check=True, grad_prescale=True)  # torchtitan needs ZeRO-3
    code, files, err = _export(cli, fsdp, "torchtitan", tmp_path / "t")
    assert code == 2 and "grad_nan_check" in err and "Traceback" not in err and files == ""
