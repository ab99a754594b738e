"""Megatron-FSDP's cast of the fp32 master shards into MXFP8 weights after the optimizer step, a host loop
(docs/formulas.md#step.mxfp8_master_cast): per MXFP8 weight 3 shard slices in copy_main_weights_to_model_weights
(NVIDIA/Megatron-LM megatron_fsdp/param_and_grad_buffer.py at cd4afffa6) and, in Transformer Engine's
_cast_master_weights_to_fp8_mxfp8_scaling (transformer_engine/pytorch/tensor/utils.py at v2.17.1), 2 slices and
2 reshapes of the packed amaxes, the partial-amax call and the partial-cast call. Counted by hand here."""

from __future__ import annotations

import pytest

from llmplan.cost.moe import EAGER_OP_HOST_S
from llmplan.cost.overhead import MXFP8_MASTER_CAST_HOST_OPS, mxfp8_master_cast_seconds, mxfp8_weight_tensors
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

M = builtin_models()
ULTRA = M["nemotron-3-ultra"]
GB300 = "mbridge-26.08-pretrain-nemotron-3-ultra-dgx-gb300-256gpu-mxfp8-tp1pp1cp1ep64vpnagbs256mbs1"
SUPER = "mbridge-26.08-pretrain-nemotron-3-super-dgx-gb300-64gpu-mxfp8-tp1pp1cp1ep64vpnagbs512mbs1"


def plan(**kw) -> ParallelPlan:
    base = dict(ep=64, dp=256, zero=3, micro_batch=1, global_batch=256, seq_len=8192, dtype="fp8", recipe="mxfp8",
                fp8_params=True)
    return ParallelPlan(**{**base, **kw})


def test_ops_per_weight_counted_from_the_code():
    # get_item x 3 (model, transpose, main buffer); amax slice x 2, reshape x 2, partial amax; partial cast
    assert MXFP8_MASTER_CAST_HOST_OPS == 3 + 4 + 1 + 1


def test_ultra_weights_by_hand():
    # Megatron-LM's Ultra script (examples/post_training/modelopt/conf/nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16.sh):
    # 48 Mamba-2 and 12 attention mixers (in / out, QKV / proj: 2 each); 48 latent-MoE layers of 512 experts, at
    # EP64 8 local experts x (fc1, fc2) + shared fc1 / fc2 + latent down / up; one MTP module (eh_proj, attention,
    # MoE) held once under mtp_use_repeated_layer
    assert mxfp8_weight_tensors(ULTRA, plan()) == pytest.approx(2 * 60 + 48 * (16 + 2 + 2) + (1 + 2 + 20))
    assert mxfp8_weight_tensors(ULTRA, plan(ep=32, dp=128)) == pytest.approx(2 * 60 + 48 * (32 + 4) + (1 + 2 + 36))
    # a dense model: attention and MLP, 2 each a layer; even over the stages
    llama = M["llama-3.1-8b"]
    assert mxfp8_weight_tensors(llama, plan(ep=1, pp=2, dp=128)) == pytest.approx(32 * 4 / 2)


def test_seconds_by_hand_and_only_under_megatron_fsdp_mxfp8_weights():
    p = plan()
    host = 1103 * 9 * EAGER_OP_HOST_S * 2.75
    assert float(mxfp8_master_cast_seconds(ULTRA, p, 0.01, 2.75)) == pytest.approx(host - 0.01)
    assert float(mxfp8_master_cast_seconds(ULTRA, p, 1.0, 2.75)) == 0.0  # hidden behind a longer optimizer step
    assert float(mxfp8_master_cast_seconds(ULTRA, plan(zero=1), 0.0, 2.75)) == 0.0  # ZeRO-1: cast after gather
    assert float(mxfp8_master_cast_seconds(ULTRA, plan(fp8_params=False), 0.0, 2.75)) == 0.0
    assert float(mxfp8_master_cast_seconds(ULTRA, plan(recipe="tensorwise"), 0.0, 2.75)) == 0.0


def test_the_ultra_row_pays_it_and_the_super_row_does_not(acc, published_runs):
    from llmplan.estimate import estimate_training
    got = {}
    for rid in (GB300, SUPER):
        m, cluster, p = acc.record_setup(published_runs[rid], acc.family(rid))
        e = estimate_training(m, cluster, p)
        got[rid] = (float(e.time.overheads["mxfp8_master_cast"]), float(e.time.optimizer))
    cast, opt = got[GB300]
    host = 1103 * 9 * EAGER_OP_HOST_S * 2.75  # Grace's host_op_factor
    assert host - opt <= cast < host  # less the optimizer step's GPU time queued before the loop
    assert cast > 0.15
    assert got[SUPER][0] == 0.0  # Megatron-Core's distributed optimizer (ZeRO-1)
