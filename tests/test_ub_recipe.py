"""Rule tp_comm_overlap_recipe: Transformer Engine's userbuffers all-gather only per-tensor fp8 and MXFP8 tensors.
NVIDIA/TransformerEngine transformer_engine/pytorch/module/base.py fill_userbuffers_buffer_for_all_gather (v2.5,
v2.8, v2.14, v2.16.1, v2.17.1): Float8Quantizer / Float8CurrentScalingQuantizer and MXFP8Quantizer branches, then
raise ValueError("Unsupported quantizer for Userbuffers ..."), so Megatron-Core's --tp-comm-overlap with
sequence parallelism cannot run NVFP4 or blockwise fp8 (Float8BlockQuantizer)."""

from __future__ import annotations

import pytest

from llmplan.specs.check import check_plan
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

M = builtin_models()["llama-3.1-8b"]


def _names(**kw) -> set[str]:
    plan = ParallelPlan(**{"tp": 2, "sp": True, "tp_comm_overlap": True, "global_batch": 8, "seq_len": 4096, **kw})
    return {v.rule for v in check_plan(M, plan)}


@pytest.mark.parametrize("dtype, recipe", [("fp4", "nvfp4"), ("fp8", "blockwise")])
def test_refused(dtype, recipe):
    assert "tp_comm_overlap_recipe" in _names(dtype=dtype, recipe=recipe)


@pytest.mark.parametrize("kw", [{"dtype": "fp8", "recipe": "mxfp8"}, {"dtype": "fp8", "recipe": "tensorwise"},
                                {"dtype": "bf16"}, {"dtype": "fp4", "recipe": "nvfp4", "tp_comm_overlap": False},
                                {"dtype": "fp4", "recipe": "nvfp4", "sp": False, "tp_comm_overlap": False},
                                {"dtype": "fp4", "recipe": "nvfp4", "tp": 1, "sp": False}])
def test_kept(kw):
    assert "tp_comm_overlap_recipe" not in _names(**kw)


def test_message_says_what_and_fix():
    plan = ParallelPlan(tp=2, sp=True, tp_comm_overlap=True, global_batch=8, seq_len=4096, dtype="fp4", recipe="nvfp4")
    msg = next(v.message for v in check_plan(M, plan) if v.rule == "tp_comm_overlap_recipe")
    assert "nvfp4" in msg and "tp 2" in msg and "--no-tp-comm-overlap" in msg and "Unsupported quantizer" in msg
