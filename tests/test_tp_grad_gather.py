"""The output gradient's sequence-parallel all-gather moves two quantised copies under MXFP8 / NVFP4 / blockwise
fp8 with Megatron-Core TP (docs/formulas.md#comm.tp).

Source: NVIDIA/TransformerEngine v2.16.1 transformer_engine/pytorch/module/linear.py (_Linear.backward:
grad_output_quantizer.set_usage(rowwise=True, columnwise=True) before grad_output_preprocess), module/base.py
(grad_output_preprocess: gather_along_first_dim(grad_output, tp_group, quantizer=quantizer)), distributed.py
(_all_gather_mxfp8 gathers the rowwise data and scales, then the columnwise ones, for each usage the quantizer
asks for); module/layernorm_linear.py forward (set_usage(rowwise=True, columnwise=False) before its gather).
The byte counts below are by hand: an MXFP8 copy is 1 byte and an E8M0 scale per 32 elements (OCP Microscaling
spec), an NVFP4 copy half a byte and an E4M3 scale per 16 elements.
"""

from __future__ import annotations

import pytest

from llmplan.cost.comm import tp_transfers
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan

M = ModelSpec(name="t", num_hidden_layers=4, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
              intermediate_size=14336, vocab_size=32000, max_position_embeddings=8192)
BASE = ParallelPlan(tp=2, sp=True, dp=1, recompute="none", seq_len=4096, micro_batch=1, global_batch=1)


def _gathered(plan: ParallelPlan) -> float:
    """All-gathered bytes a step, in units of s·b·h."""
    sbh = plan.seq_len * plan.micro_batch * M.hidden_size
    return sum(float(t.calls) * float(t.message) for t in tp_transfers(M, plan, None)
               if t.collective == "all-gather") / sbh


def test_bf16_gathers_six_per_layer():
    # 2 forward input gathers, 2 output-gradient gathers, 2 re-gathers a layer, 2 bytes each
    assert _gathered(BASE) == pytest.approx(4 * 6 * 2.0)


def test_mxfp8_output_gradient_gathers_two_copies():
    got = _gathered(BASE.model_copy(update={"dtype": "fp8", "recipe": "mxfp8"}))
    one = 1 + 1 / 32
    assert got == pytest.approx(4 * (4 * one + 2 * 2 * one))  # 8.25 per layer, not 6.1875


def test_nvfp4_output_gradient_gathers_two_copies():
    plan = BASE.model_copy(update={"dtype": "fp4", "recipe": "nvfp4", "bf16_layers_start": 0, "bf16_layers_end": 0})
    one = 0.5 + 1 / 16
    assert _gathered(plan) == pytest.approx(4 * (4 * one + 2 * 2 * one))


def test_per_tensor_fp8_gathers_rowwise_only():
    # Float8Quantizer / Float8CurrentScalingQuantizer.supports_only_rowwise_all_gather: one byte each
    assert _gathered(BASE.model_copy(update={"dtype": "fp8", "recipe": "tensorwise"})) == pytest.approx(4 * 6 * 1.0)


def test_dtensor_unchanged():
    # torchao's Float8RowwiseParallel casts the output gradient to one e5m2 copy; DTensor sends no re-gather
    plan = BASE.model_copy(update={"dtype": "fp8", "recipe": "tensorwise", "tp_impl": "dtensor"})
    assert _gathered(plan) == pytest.approx(4 * 4 * 1.0)


def test_no_sp_no_gathers():
    assert _gathered(BASE.model_copy(update={"sp": False, "dtype": "fp8", "recipe": "mxfp8"})) == 0


def test_mxfp8_columnwise_copy_holds_the_bulk_sms_under_userbuffers():
    # TE v2.16.1 linear.py (ub_overlap_ag and MXFP8Quantizer): the output gradient's columnwise copy is gathered
    # by bulk_overlap_ag_with_external_gemm beside the dgrad GEMM, the proj_wgrad / fc2_wgrad userbuffers at the
    # bulk methods' 16 SMs (module/base.py get_default_config: num_sm 1 only for ring_exchange), not on the
    # ring's 1 SM. Per two pairs, r 0, one copy q: ring 2q forward + 2q rowwise output gradients at 1 SM; forward
    # reduce-scatters 2 x 2 bytes at the fp8 configs' 1 SM with its margin (0 held); re-gathers 2q + columnwise
    # copies 2q at 16; backward reduce-scatters 2 x 2 bytes at 16 (TUNED_UB_MARGIN: no margin on the bulk roles).
    from llmplan.cost.comm import TE_PIPELINE_SPLITS, tp_overlap_contention
    plan = BASE.model_copy(update={"dtype": "fp8", "recipe": "mxfp8", "tp_comm_overlap": True})
    q, n, sms = 1 + 1 / 32, TE_PIPELINE_SPLITS, 132
    spans = (4 * q, 4 * (1 - 1 / n), 4 * q, 4.0)
    held = 4 * q * 1 + 0 + 4 * q * 16 + 4.0 * 16
    assert float(tp_overlap_contention(M, plan, 0.0, sms)) == pytest.approx(held / sum(spans) / sms)
