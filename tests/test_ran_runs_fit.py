"""Runs a source reports as completed must be predicted to fit: the memory side of issue 32's targets, on the
rows that were called "does not fit" for a wrong capacity or a table layout the release's preset does not run."""

from __future__ import annotations

import pytest

import accuracy


@pytest.mark.parametrize("rid,preset", [
    # 25.11 table: MBS 4 with GA 2 contradicts GBS 512 / DP 16; v0.2.0's H100 preset runs micro-batch 1
    ("mbridge-25.11-pretrain-gpt-oss-120b-dgx-h100-64gpu-bf16-tp1pp4cp1ep8vp1gbs512mbs4", (4, 1, 1)),
    # 26.02.01 table: GB300 Llama 3 70B NVFP4 / MXFP8 rows list layouts no v0.3.x preset runs; PP4 VP5 MBS 1
    ("mbridge-26.02.01-pretrain-llama3-70b-dgx-gb300-64gpu-nvfp4-tp1pp1cp1epnavpnagbs256mbs2", (4, 5, 1)),
    ("mbridge-26.02.01-pretrain-llama3-70b-dgx-gb300-64gpu-mxfp8-tp1pp4cp1epnavpnagbs256mbs2", (4, 5, 1)),
    # capacity: 183359 MiB on a B200 (AWS DLAMI guide), 189471 MiB on a GB200 (NVIDIA ISV-NCP-Validation-Suite)
    ("mbridge-25.11-pretrain-gpt-oss-120b-dgx-b200-64gpu-bf16-tp1pp1cp1ep8vp1gbs512mbs4", None),
    ("mbridge-26.08-pretrain-deepseekv3-dgx-gb200-256gpu-mxfp8-tp1pp4cp1ep64vp4gbs4096mbs1", None),
])
def test_completed_mbridge_runs_are_predicted_to_fit(published_runs, row_plan, rid, preset):
    rec = published_runs[rid]
    fam = accuracy.family(rid)
    plan = row_plan(rid)
    if preset is not None:
        assert (plan.pp, plan.vpp, plan.micro_batch) == preset
    rows = dict((q, (p, m)) for q, p, m in accuracy.predict(rec, fam))
    assert rows["fits"] == (1.0, 1.0)


def test_moe_experts_keep_their_dispatched_rows_quantised():
    # Transformer Engine's GroupedLinear saves the quantised cast of each (token, expert) row for its wgrad GEMM
    # (grouped_linear.py: the inputmats saved with columnwise usage), and Megatron's fused permute keeps only its
    # index map; the router reads the pre-MLP norm's output unquantised. So in fp8 an MoE layer keeps its T.k
    # dispatched rows at 1 byte per element where bf16 keeps 2, its fc2 inputs likewise, and the norm output
    # (the router's input) at 2 bytes in both.
    from llmplan.cost.memory import layer_activation_parts
    from llmplan.specs.plan import ParallelPlan
    from llmplan.specs.registry import builtin_models

    m = builtin_models()["qwen3-30b-a3b"]
    kw = dict(tp=1, dp=8, ep=8, etp=1, seq_len=4096, micro_batch=2, global_batch=16)
    bf16 = layer_activation_parts(m, ParallelPlan(**kw), True)
    fp8 = layer_activation_parts(m, ParallelPlan(**kw, dtype="fp8", recipe="tensorwise"), True)
    T, k, h, f = 4096 * 2, m.num_experts_per_tok, m.hidden_size, m.expert_ffn
    assert float(bf16.mlp - fp8.mlp) == pytest.approx(T * k * h * (2 - 1) + T * k * f * (2 - 1), rel=1e-12)
    assert float(fp8.mlp_input) == float(bf16.mlp_input) == 2 * T * h
