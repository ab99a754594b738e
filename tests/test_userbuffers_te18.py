"""Transformer Engine's userbuffers before 2.7 (ParallelPlan.ub_wgrad_buffers False; docs/formulas.md#mem.userbuffers):
initialize_ub registers ten buffers, not twelve, and NeMo 24.07's rows (TE 1.8.0.dev0) are read so."""

from __future__ import annotations

import pytest

from llmplan.cost.memory import stage_memory
from llmplan.cost.runtime_memory import userbuffer_bytes
from llmplan.specs.plan import MemoryAllowance, ParallelPlan
from llmplan.units import GIB


def _plan(**kw) -> ParallelPlan:
    base = dict(tp=2, pp=1, dp=4, sp=True, tp_comm_overlap=True, micro_batch=2, seq_len=2048, global_batch=64)
    return ParallelPlan(**{**base, **kw})


def test_before_te_2_7_six_gather_buffers_and_four_scatter_ones() -> None:
    # NVIDIA/TransformerEngine v1.8 (3ec998e96c) pytorch/module/base.py initialize_ub: layers_all_gather_overlap
    # qkv_fprop, qkv_dgrad, proj_dgrad, fc1_fprop, fc1_dgrad, fc2_dgrad (6; uint8 with fp8: fp8_buf = name in
    # layers_all_gather_overlap), layers_reduce_scatter_overlap proj_fprop, fc2_fprop, qkv_wgrad, fc1_wgrad (4, the
    # bf16 default dtype), each of Megatron's shape (s x b, h). By hand, s 2048, b 2, h 6144: a row is 25,165,824
    # elements; bf16 10 x 2 B = 20 rows, fp8 6 x 1 + 4 x 2 = 14 rows; TE >= 2.7 (077e26c31) adds proj_wgrad and
    # fc2_wgrad to the gathers: 24 and 16 rows.
    h, row = 6144, 2048 * 2 * 6144
    old = _plan(ub_wgrad_buffers=False)
    assert float(userbuffer_bytes(h, old)) == 20 * row
    assert float(userbuffer_bytes(h, old.model_copy(update={"dtype": "fp8"}))) == 14 * row
    assert float(userbuffer_bytes(h, _plan())) == 24 * row
    assert float(userbuffer_bytes(h, _plan(dtype="fp8"))) == 16 * row
    assert float(userbuffer_bytes(h, old.model_copy(update={"tp_comm_overlap": False}))) == 0.0


def test_nemo_2407_rows_read_te_1_8_s_buffers(row_plan) -> None:
    # NeMo Framework user guide, "Software Component Versions": NeMo Framework 24.07 ships Transformer Engine
    # 1.8.0.dev0; every other TP-overlap row keeps the default (TE >= 2.7)
    assert row_plan("nemo2407-pretrain-gpt3-20b-64gpu-gbs256").ub_wgrad_buffers is False
    assert row_plan("nemo2407-pretrain-llama3-70b-64gpu-gbs128").ub_wgrad_buffers is False
    assert row_plan("megatron-examples-fp8-llama3-70b-64gpu").ub_wgrad_buffers is True


def test_nemo_gpt3_20b_userbuffers_golden(row_setup) -> None:
    # NeMo-Framework-Launcher 24.07 launcher_scripts/conf/training/gpt3/20b.yaml: TP 2, SP, micro-batch 2, sequence
    # 2048, hidden 6144, ub_tp_comm_overlap with tp_overlap/ub_cfg_h100_h6144_tp2_mbs2_seqlen2048.yaml (bulk
    # qkv / fc1 dgrad and wgrad, ring-exchange qkv / fc1 fprop and proj / fc2 dgrad, pipelined proj / fc2 fprop:
    # no reduce-scatter moved to the ring exchange, so every buffer is the sample's (4096, 6144)); NeMo's fp8 run
    # initialises them with use_fp8: 6 x 1 B + 4 x 2 B per element, 14 x 4096 x 6144 B = 336 MiB (tolerance: exact)
    m, c, plan = row_setup("nemo2407-pretrain-gpt3-20b-64gpu-gbs256")
    mem = stage_memory(m, plan, 0, MemoryAllowance(), 80 * GIB, nccl_channels=c.system.gpu.nccl_sms)
    assert mem.runtime is not None
    assert float(mem.runtime.userbuffers) == 14 * 4096 * 6144 == 336 * 2**20
    newer = stage_memory(m, plan.model_copy(update={"ub_wgrad_buffers": True}), 0, MemoryAllowance(), 80 * GIB,
                         nccl_channels=c.system.gpu.nccl_sms)
    assert float(newer.total - mem.total) == pytest.approx(2 * 4096 * 6144)  # outside the allocator: no 5% on it
