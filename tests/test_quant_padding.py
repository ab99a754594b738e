"""TEGroupedMLP's quantisation padding in fp8 / fp4 recipes: Megatron-Core pads each local expert's rows to the
GEMM alignment (Transformer Engine's Fp8Padding) and unpads the output, and the backward runs the inverses, unless
every count is aligned already (router padding, HybridEP's dispatch, an aligned capacity). NVIDIA/Megatron-LM
megatron/core/transformer/moe/experts.py TEGroupedMLP.forward at 0d8e0714 / b0cc2706 / d0b3b775,
moe_utils.py skip_routed_expert_padding at d0b3b775; NVIDIA/TransformerEngine pytorch/module/fp8_padding.py
(docs/formulas.md#moe.quant_padding). Expected bytes are counted by hand from the kernel (each row read and
written once, bf16) and the model dimensions."""

from __future__ import annotations

import pytest

from llmplan.cost import elementwise as E
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

DSV3 = builtin_models()["deepseek-v3"]
TINY: dict = {"name": "tiny-moe", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
              "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 4096,
              "num_experts": 16, "num_experts_per_tok": 2, "moe_intermediate_size": 128}


def _plan(**kw) -> ParallelPlan:
    base = dict(ep=8, dp=8, seq_len=4096, micro_batch=1, dtype="fp8", recipe="mxfp8", expert_gemm="per-expert",
                moe_dispatcher="alltoall")
    return ParallelPlan(**{**base, **kw})


def test_one_pass_reads_and_writes_every_routed_row_once():
    assert E.QUANT_PADDING_BYTES == 2 + 2  # bf16 rows into the padded buffer (fused_multi_row_padding)


def test_dropless_deepseek_v3_pads_and_unpads_each_way():
    # k 8, expert width 7168 (config_671B.json): pad the input and unpad the output forward, the inverses
    # backward: 4 passes x 4 bytes x 8 x 7168 a token, charged in forward-equivalent units (a third)
    hand = 4 * 4 * 8 * 7168 / 3
    assert float(E.quant_padding_bytes(DSV3, _plan())) == pytest.approx(hand, rel=1e-12)
    assert float(E.quant_padding_bytes(DSV3, _plan(moe_dispatcher="deepep", moe_flex_backend="deepep"))) \
        == pytest.approx(hand, rel=1e-12)


def test_the_layer_carries_the_padding(monkeypatch):
    plan = _plan()
    with_pad = float(E.elementwise_bytes(DSV3, plan, True))
    monkeypatch.setattr(E, "QUANT_PADDING_BYTES", 0.0)
    without = float(E.elementwise_bytes(DSV3, plan, True))
    assert with_pad - without == pytest.approx(4 * 4 * 8 * 7168 / 3 * 4096, rel=1e-9)


def test_moe_recompute_reruns_the_forward_pair(monkeypatch):
    plan = _plan(recompute="selective", recompute_modules=("moe",))
    with_pad = float(E.moe_recompute_bytes(DSV3, plan))
    monkeypatch.setattr(E, "QUANT_PADDING_BYTES", 0.0)
    assert with_pad - float(E.moe_recompute_bytes(DSV3, plan)) == pytest.approx(2 * 4 * 8 * 7168 / 3 * 4096, rel=1e-9)


def test_aligned_counts_skip_it():
    assert E.quant_padding_bytes(DSV3, _plan(dtype="bf16", recipe="tensorwise")) == 0.0
    assert E.quant_padding_bytes(DSV3, _plan(moe_dispatcher="deepep", moe_flex_backend="hybridep")) == 0.0
    assert E.quant_padding_bytes(DSV3, _plan(expert_gemm="grouped", recipe="blockwise")) == 0.0  # not Megatron's
    # the op-fuser's fused grouped MLP (MXFP8) pads as TEGroupedMLP does (experts.py at d0b3b775)
    assert float(E.quant_padding_bytes(DSV3, _plan(expert_gemm="grouped"))) == pytest.approx(4 * 4 * 8 * 7168 / 3)
    # capacity 1.0: ceil(4096 x 8 / 256) = 128 rows from each of 8 source ranks, 1024 an expert: aligned to 32
    assert E.quant_padding_bytes(DSV3, _plan(moe_capacity_factor=1.0)) == 0.0


def test_an_unaligned_capacity_pads_the_padded_rows():
    # 500 tokens x top-2 / 16 experts = 62.5 -> 63 from each of 2 source ranks, 126 an expert: not a multiple of 16
    m = ModelSpec(**TINY)
    plan = _plan(ep=2, dp=2, seq_len=500, recipe="tensorwise", moe_capacity_factor=1.0)
    assert float(E.quant_padding_bytes(m, plan)) == pytest.approx(4 * 4 * 2 * 256 / 3, rel=1e-12)
    assert E.quant_padding_bytes(m, plan.model_copy(update={"seq_len": 512})) == 0.0  # 64 x 2 = 128


def test_the_variant_rows_pay_it_where_their_dispatcher_does(row_plan, row_setup):
    # 25.11 B200 w/ MTP: alltoall, dropless, MXFP8 (v0.2.0 DEEPSEEK_V3_B200_BASE_CONFIG: no flex backend);
    # 25.09 H100: flex + DeepEP (run_script.py at v0.1.0rc4); 26.02 B200: hybridep; 25.09 token-drop: capacity 1.0
    pads = {"mbridge-25.11-pretrain-deepseekv3-w-mtp-dgx-b200-256gpu-fp8mx-tp1pp16cp1ep8vp1gbs2048mbs1": True,
            "mbridge-25.09-pretrain-deepseekv3-dropless-dgx-h100-1024gpu-fp8-tp2pp8cp1ep64vp4gbs8192mbs1": True,
            "mbridge-26.02-pretrain-deepseekv3-dgx-b200-256gpu-mxfp8-tp1pp16cp1ep8vpnagbs4096mbs1": False,
            "mbridge-25.09-pretrain-deepseekv3-tokendrop-dgx-b200-256gpu-fp8-tp1pp16cp1ep8vp1gbs2048mbs1": False}
    for rid, expected in pads.items():
        m, _, plan = row_setup(rid)
        assert (float(E.quant_padding_bytes(m, plan)) > 0) is expected, rid


def test_the_copies_by_hand_once_for_their_four_users():
    """expert_copy_bytes: the sort by local expert and the padding on the T / t_sp tokens of the layer, the one
    expression expert_node_bytes, alltoall_sort_layer_bytes, moe_recompute_bytes and expert_node_seconds price.
    DeepSeek-V3 (k 8, width 7168) at ep 8 (32 local experts, alltoall), tp 2 with SP, T = 4096: two sorts each
    way of 4 bytes an element (4 x 4 x 8 x 7168 / 3) plus 4 padding passes of 4 bytes (the same), on 2048 tokens."""
    plan = _plan(tp=2, sp=True, dp=4)
    hand = (4 * 4 * 8 * 7168 / 3 + 4 * 4 * 8 * 7168 / 3) * 4096 / 2
    assert float(E.expert_copy_bytes(DSV3, plan)) == pytest.approx(hand, rel=1e-12)
    assert float(E.alltoall_sort_layer_bytes(DSV3, plan)) == pytest.approx(hand, rel=1e-12)
    rerun = _plan(tp=2, sp=True, dp=4, recompute="selective", recompute_modules=("moe",))
    # the rerun's forward half of the copies (the rest of moe_recompute_bytes is the experts' activation)
    assert float(E.alltoall_sort_layer_bytes(DSV3, rerun)) == pytest.approx(1.5 * hand, rel=1e-12)
    assert float(E.expert_copy_bytes(DSV3, plan, 3 / 2)) == pytest.approx(hand / 4096 * 1.5, rel=1e-12)


def test_expert_tp_multiplies_the_rows_each_expert_receives():
    """Megatron-Core's alltoall dispatcher padded to capacity hands each local expert capacity x tp_size x ep_size
    rows, tp_size the expert-TP group's (it all-gathers the received rows over expert TP before the sort):
    NVIDIA/Megatron-LM core_v0.14.0 megatron/core/transformer/moe/token_dispatcher.py
    MoEAlltoAllTokenDispatcher.preprocess (num_tokens_per_local_expert = capacity * tp_size * ep_size; tp_group
    = model_comm_pgs.expt_tp) and dispatch_postprocess (gather_from_sequence_parallel_region over tp_group);
    moe_utils.py get_capacity (ceil(num_tokens / num_experts x capacity_factor)).
    By hand: DeepSeek-V3 (k 8, 256 experts) at tp 2 with SP, seq 720: 360 tokens a rank, capacity
    ceil(360 x 8 / 256) = ceil(11.25) = 12; ep 2: 24 rows from the EP ranks, not a multiple of 16, but etp 2
    (the default, = tp) gathers 48, a multiple of 16: no padding. At etp 1: 24 rows, padded (4 passes x 4 B x 8 x
    7168 / 3 a token)."""
    plan = _plan(tp=2, sp=True, ep=2, dp=2, seq_len=720, recipe="tensorwise", moe_capacity_factor=1.0)
    assert plan.etp_resolved == 2
    assert E.quant_padding_bytes(DSV3, plan) == 0.0
    one = plan.model_copy(update={"etp": 1})
    assert float(E.quant_padding_bytes(DSV3, one)) == pytest.approx(4 * 4 * 8 * 7168 / 3, rel=1e-12)
