"""Kernels per layer and micro-batch of the legacy Megatron layer (megatron/model/transformer.py's
ParallelTransformerLayer, no Transformer Engine: Megatron-LM 2020-2023, the Megatron-DeepSpeed forks of BLOOM and
MT-NLG), against a count made by hand, launch by launch, from the source at named commits
(docs/validation.md#legacy-kernels): benchmarks/legacy_layer.py's legacy_layer_kernels."""

from __future__ import annotations

import legacy_layer as L  # benchmarks/ (tests/conftest.py puts it on the path)
from llmplan.cost import kernels as K
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan


def _gpt(learned: bool, dropout: float) -> ModelSpec:
    """A GPT layer as the legacy stacks build it: LayerNorm, biases on every linear, a 4h GELU MLP."""
    return ModelSpec(name="legacy-gpt", model_type="gpt", hidden_size=14336, intermediate_size=4 * 14336,
                     num_hidden_layers=72, num_attention_heads=64, vocab_size=250880, max_position_embeddings=2048,
                     gated_mlp=False, norm_type="layernorm", learned_position_embeddings=learned,
                     attention_bias=True, mlp_bias=True, attention_dropout=dropout, hidden_dropout=dropout)


def test_bloom_prequel_layer_against_the_hand_count():
    """bigscience-workshop/Megatron-DeepSpeed at 541b967f (2022-02-17), megatron/model/transformer.py, mpu/layers.py,
    model/fused_bias_gelu.py; TP8, ALiBi, dropout 0.1 (the prequel's defaults), Apex's two-pass LayerNorm, autograd's
    add into the 16-bit param.grad. Forward: input_layernorm 1, query_key_value F.linear with bias 2, the ALiBi
    copy and baddbmm 2, the fused softmax 1, attention dropout 1, bmm 1, permute().contiguous() 1, dense 1 and its
    all-reduce 1, bias_dropout_add 1, post_attention_layernorm 1, dense_h_to_4h 1, bias_gelu 1, dense_4h_to_h 1 and
    its all-reduce 1, bias_dropout_add 1: 18. Backward: per bias-dropout-add the dropout's, the bias sum and the
    residual gradients' add (3 x 2); dense_4h_to_h 2, bias_gelu_back and its bias sum 2, dense_h_to_4h 2 and its
    all-reduce 1, the two norms 3 x 2, dense 2, bmm 2, dropout 1, softmax 1, baddbmm 2, the split's concatenation 1,
    query_key_value 2 + its bias sum 1 + its all-reduce 1: 32; the 12 parameters' adds: 44. The Megatron-Core
    count at tp > 1 without sp (17, 25: test_kernel_count's hand count) misses 19 backward launches."""
    m = _gpt(learned=False, dropout=0.1)
    plan = ParallelPlan(tp=8, pp=12, dp=4, grad_accumulation="add", norm_kernel="two-pass", flash_attention=False)
    assert L.legacy_layer_kernels(m, plan) == K.Kernels(18, 44)
    mcore = K.layer_kernels(m, plan, "full_attention", "dense")
    assert L.legacy_layer_kernels(m, plan).bwd - mcore.bwd == 19


def test_bloom_final_run_layer_without_dropout_and_with_the_bf16_optimizer():
    """BLOOM-176B's final run: TP4, no dropout (arXiv:2211.05100 §3.5), DeepSpeed's BF16_Optimizer casting and
    adding every parameter's gradient after each pipeline backward (deepspeedai/DeepSpeed bf16_optimizer.py
    update_hp_grads, pipe/engine.py at 56c522386): forward 18 less the attention dropout, 17; backward 32 less the
    three dropouts, 29, plus 2 x 12: 53."""
    m = _gpt(learned=False, dropout=0.0)
    plan = ParallelPlan(tp=4, pp=12, dp=8, grad_accumulation="cast-add", norm_kernel="two-pass",
                        flash_attention=False)
    assert L.legacy_layer_kernels(m, plan) == K.Kernels(17, 53)


def test_megatron_lm_2022_sequence_parallel_layer():
    """NVIDIA/Megatron-LM at 285068c810 (2023-01; MegaScale's baseline, and the 2022 code of Korthikanti et al.):
    learned positions (no ALiBi copy), sequence parallelism, gradient accumulation fusion, the persistent one-pass
    LayerNorm. Forward 18 - 1 (no ALiBi) - 2 all-reduces + 2 x (all-gather, reduce-scatter) = 19; backward 32 - 2
    (one-pass norms) - 2 all-reduces + 2 x 3 (LinearWithGradAccumulationAndAsyncCommunication's all-gather of its
    input again and reduce-scatter of its input gradient, the row-parallel output gradient's all-gather) = 34, plus
    main_grad.add_ of the 4 biases and 4 norm parameters: 42."""
    m = _gpt(learned=True, dropout=0.1)
    plan = ParallelPlan(tp=8, pp=8, dp=2, sp=True, flash_attention=False)
    assert L.legacy_layer_kernels(m, plan) == K.Kernels(19, 42)
    no_sp = L.legacy_layer_kernels(m, plan.model_copy(update={"sp": False}))
    assert (no_sp.fwd, no_sp.bwd) == (17, 38)


def test_unfused_bias_dropout_add_and_one_rank():
    """Megatron-LM at d73def35a3 (2020-09): --bias-dropout-fusion opt-in, so x + bias, dropout and the residual
    add run as three kernels per block (2 more forward per block, 4 a layer); one rank, no collectives."""
    m = _gpt(learned=True, dropout=0.1)
    fused = L.legacy_layer_kernels(m, ParallelPlan(flash_attention=False, norm_kernel="two-pass"))
    unfused = L.legacy_layer_kernels(m, ParallelPlan(flash_attention=False, norm_kernel="two-pass",
                                                     bias_dropout_fusion=False))
    assert (fused.fwd, fused.bwd) == (15, 38)
    assert (unfused.fwd - fused.fwd, unfused.bwd - fused.bwd) == (4, 0)


def test_unfused_bias_gelu_adds_its_bias_add_kernel():
    """Megatron-LM at 19301985dd (2020-09-11): --bias-gelu-fusion opt-in, so ParallelMLP runs
    activation_func(intermediate_parallel + bias_parallel): the add, then F.gelu (one more forward kernel); backward
    gelu's backward and the bias gradient's sum, as bias_gelu_back and its sum (no more)."""
    m = _gpt(learned=True, dropout=0.1)
    fused = L.legacy_layer_kernels(m, ParallelPlan(flash_attention=False, norm_kernel="two-pass"))
    unfused = L.legacy_layer_kernels(m, ParallelPlan(flash_attention=False, norm_kernel="two-pass",
                                                     bias_gelu_fusion=False))
    assert (unfused.fwd - fused.fwd, unfused.bwd - fused.bwd) == (1, 0)
