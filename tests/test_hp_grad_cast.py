"""DeepSpeed BF16_Optimizer's fp32 copy of the largest bf16 gradient after each micro-batch's backward
(docs/formulas.md#mem.hp_grad_cast): update_hp_grads runs `hp_grad.add_(lp.grad.to(fp32))` parameter by
parameter (deepspeedai/DeepSpeed deepspeed/runtime/bf16_optimizer.py at 15293139f and 56c522386), once the
micro-batch's recompute working set and layer activations are freed. Expected values by hand from the shapes."""

from __future__ import annotations

from plans import plan_of

from llmplan.cost.model_states import hp_grad_cast_bytes
from llmplan.specs.model import ModelSpec


def _gpt(h: int = 1024, f: int = 4096, vocab: int = 32768, gated: bool = False) -> ModelSpec:
    return ModelSpec(name="t", model_type="gpt", hidden_size=h, intermediate_size=f, num_hidden_layers=9,
                     num_attention_heads=16, vocab_size=vocab, max_position_embeddings=2048,
                     tie_word_embeddings=True, gated_mlp=gated, norm_type="layernorm")


# BF16_Optimizer: bf16 weights, fp32 gradients cast and added, ZeRO 1, all-reduce
_plan = plan_of(dict(tp=2, pp=3, dp=4, zero=1, global_batch=64, recompute="full", dtype="bf16", grad_dtype="fp32",
                     grad_accumulation="cast-add", grad_reduce="all-reduce"))


def test_the_largest_gradient_of_each_stage_in_fp32() -> None:
    m, p = _gpt(), _plan()
    emb = 4 * 16_384 * 1_024  # V/t x h = 32,768/2 x 1,024 on each TP rank, 4 bytes
    fc2 = 4 * 4_096 * 1_024 // 2  # f x h / t, 4 bytes
    for stage in (0, 2):  # the word embedding, the tied output weight
        assert hp_grad_cast_bytes(m, p, stage, working=2e6, per_microbatch=1e6) == emb - 3e6
    assert hp_grad_cast_bytes(m, p, 1, working=2e6, per_microbatch=1e6) == fc2 - 3e6
    # freed bytes larger than the copy leave nothing above the backward's peak
    assert hp_grad_cast_bytes(m, p, 1, working=1e9, per_microbatch=0.0) == 0.0


def test_a_layer_weight_larger_than_the_vocabulary_shard() -> None:
    """update_hp_grads walks every parameter of the rank, so on the first and last stages a layer weight larger
    than the embedding shard is the largest copy (gpt-1t's shape: f 102,400 > V 51,200 at h 25,600)."""
    p = _plan()
    m = _gpt(h=1024, f=8192, vocab=4096)
    fc = 4 * 8_192 * 1_024 // 2  # f x h / t = 4,194,304 > V/t x h = 2,048 x 1,024 = 2,097,152; 4 bytes
    for stage in (0, 1, 2):
        assert hp_grad_cast_bytes(m, p, stage, working=0.0, per_microbatch=0.0) == fc


def test_gated_mlp_fuses_gate_and_up() -> None:
    """Megatron-DeepSpeed (ae6277f5 megatron/model/transformer.py ParallelMLP) builds dense_h_to_4h with
    2 x ffn_hidden_size outputs under glu_activation: one 2f x h / t parameter."""
    p = _plan()
    m = _gpt(h=1024, f=4096, vocab=4096, gated=True)
    fused = 4 * 2 * 4_096 * 1_024 // 2  # 2f x h / t, 4 bytes
    for stage in (0, 1, 2):
        assert hp_grad_cast_bytes(m, p, stage, working=0.0, per_microbatch=0.0) == fused
    # a vocabulary shard above the fused weight still wins on the first and last stages
    big = _gpt(h=1024, f=4096, vocab=65_536, gated=True)
    emb = 4 * 32_768 * 1_024
    assert hp_grad_cast_bytes(big, p, 0, working=0.0, per_microbatch=0.0) == emb
    assert hp_grad_cast_bytes(big, p, 1, working=0.0, per_microbatch=0.0) == fused


def test_nothing_outside_the_bf16_optimizer() -> None:
    m = _gpt()
    for p in (_plan(grad_dtype="bf16"), _plan(grad_accumulation="add"), _plan(grad_accumulation="fused"),
              _plan(dtype="fp16")):
        assert hp_grad_cast_bytes(m, p, 0, working=0.0, per_microbatch=0.0) == 0.0


def test_bloom_206b_first_stage_moment(published_runs, acc):
    # BigScience chronicles-prequel.md 'Rebalancing layers' (2022-02-28): 82 layers, h 14,336, 128 heads,
    # vocabulary 250,880, DP8 TP4 PP12, micro-batch 2, BF16_Optimizer, 'type:transformer|embedding' (84 slots:
    # stage 0 = embedding + 6 layers). After a micro-batch's backward on stage 0 (DeepSpeed's TrainSchedule: 12
    # micro-batches in flight) the rank holds the other 11 micro-batches' 6 layer inputs (2sbh each), the 12
    # embedding norms' inputs and dropout masks (3sbh each), and the fp32 copy of the embedding's bf16 gradient
    # (250,880/4 x 14,336 x 4 bytes).
    from llmplan.estimate import estimate_training

    rec = published_runs["bloom-prequel-rebalancing-layers-L82h14336a128-dp8tp4pp12mbs2gbs2048z1"]
    m, cluster, p = acc.record_setup(rec, "bloom", None)
    mem = estimate_training(m, cluster, p).memory
    sbh = 2048 * 2 * 14_336
    moment = 11 * 6 * 2 * sbh + 12 * 3 * sbh + 4 * 62_720 * 14_336
    assert int(mem.stage) == 0
    assert float(mem.activations + mem.fresh_grad) == moment
