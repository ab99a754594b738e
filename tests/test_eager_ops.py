"""PyTorch eager norms, rotary and SwiGLU (ParallelPlan.fused_kernels False: torchtitan without torch.compile):
their memory-bound traffic counted by hand from the operations, and the price of eager mode against
torch.compile on torchtitan's published Llama 3.1 8B pairs (docs/formulas.md#compute.eager_ops)."""

from __future__ import annotations

import pytest

from llmplan.cost.elementwise import (
    EAGER_COMPLEX_ROPE_BYTES,
    EAGER_RMSNORM_BYTES,
    EAGER_SWIGLU_BYTES,
    elementwise_bytes,
)
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan

DENSE: dict = {"name": "tiny", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
               "max_position_embeddings": 4096}
T = 1024 * 2  # tokens of the plans below


def _plans() -> tuple[ParallelPlan, ParallelPlan]:
    fused = ParallelPlan(seq_len=1024, micro_batch=2)
    return fused, fused.model_copy(update={"fused_kernels": False})


def test_eager_rmsnorm_bytes_counted_from_the_operations():
    # torchtitan norms.py RMSNorm at 9dec370 on a bf16 x, per element (the per-row mean, eps and rsqrt are 1/h).
    # Forward: x.float() (read 2, write 4); pow(2) (4 + 4); mean over the row (read 4); x * rsqrt (4 + 4);
    # type_as (read 4, write 2); * weight (2 + 2).
    fwd = 6 + 8 + 4 + 8 + 6 + 4
    # Backward: mul by the weight: grad * weight (2 + 2) and grad * output summed over tokens (2 + 2 + 2, read 2);
    # _to_copy's gradient to fp32 (2 + 4); mul by the row's rsqrt: grad * rsqrt (4 + 4) and grad * x summed
    # over the row (4 + 4 + 4, read 4); mean_backward's expanded gradient (write 4); pow_backward: self.pow(1)
    # copied (4 + 4), times 2 (4 + 4), times grad (4 + 4 + 4); the two gradients of the fp32 x summed
    # (4 + 4 + 4); x.float()'s gradient cast to bf16 (4 + 2).
    bwd = (4 + 8) + 6 + (8 + 16) + 4 + (8 + 8 + 12) + 12 + 6
    assert EAGER_RMSNORM_BYTES == (fwd, bwd)
    fused, eager = _plans()
    m = ModelSpec(**DENSE)  # a gated MLP (SwiGLU) by default
    # two norms per layer over h = 256; the stage charges three times the forward-equivalent bytes, the fused
    # norm's 4 forward (read x, write y) and 6 backward (read x and dy, write dx) an element
    norms = 2 * T * 256 * ((fwd + bwd) / 3 - (4 + 6) / 3)
    rope = T * 64 * (4 + 2) * (sum(EAGER_COMPLEX_ROPE_BYTES) / 3 - 4)
    act = T * 512 * (sum(EAGER_SWIGLU_BYTES) / 3 - 6)
    assert elementwise_bytes(m, eager, False) - elementwise_bytes(m, fused, False) == pytest.approx(
        norms + rope + act)


def test_eager_complex_rotary_and_swiglu_bytes_counted_from_the_operations():
    # torchtitan model.py apply_rotary_emb at 9dec370, per element of a bf16 q or k: forward .float() (2 + 4),
    # the complex product with freqs_cis (read 4, write 4; one freqs row per position, shared by batch and
    # heads), type_as (4 + 2); backward the cast's gradient (2 + 4), grad * conj(freqs_cis) (4 + 4), the cast
    # back (4 + 2). The views (view_as_complex, view_as_real, flatten) move nothing.
    assert EAGER_COMPLEX_ROPE_BYTES == (6 + 8 + 6, 6 + 8 + 6)
    # FeedForward.forward: F.silu(w1(x)) * w3(x), per element of the f-wide intermediate: forward silu (2 + 2)
    # and the product (2 + 2 + 2); backward the product's two gradients (2 + 2 + 2 each) and silu_backward
    # (2 + 2 + 2). The fused activation: read 2f, write f forward (6), twice that backward.
    assert EAGER_SWIGLU_BYTES == (4 + 6, 6 + 6 + 6)


def test_a_compiled_complex_rotary_moves_its_eager_bytes():
    # torchtitan's apply_rotary_emb (model.py at 9dec370) is complex arithmetic, which Inductor runs as the eager
    # kernels (pytorch/torchtitan#15: "Torchinductor does not support code generation for complex operators"):
    # with fused kernels (torch.compile) and rope_complex the rotary costs what eager's does, the rest stays fused
    fused, eager = _plans()
    compiled = fused.model_copy(update={"rope_complex": True})
    m = ModelSpec(**DENSE)
    rope = T * 64 * (4 + 2) * (sum(EAGER_COMPLEX_ROPE_BYTES) / 3 - 4)
    assert elementwise_bytes(m, compiled, False) - elementwise_bytes(m, fused, False) == pytest.approx(rope)
    # eager already priced the complex rotary: the switch moves nothing there
    assert elementwise_bytes(m, eager.model_copy(update={"rope_complex": True}), False) == pytest.approx(
        elementwise_bytes(m, eager, False))
    # a model without rotary (learned positions) has nothing to move
    learned = ModelSpec(**DENSE, learned_position_embeddings=True)
    assert elementwise_bytes(learned, compiled, False) == pytest.approx(elementwise_bytes(learned, fused, False))


def test_torchtitan_rows_read_the_complex_rotary(acc, published_runs):
    # every torchtitan row ran model.py's complex rotary; other stacks' fused rotaries are real-valued kernels
    rec = published_runs["torchtitan-2412-t1-llama31-8b-8gpu-fsdp-compile"]
    assert acc.plan_for(rec, "torchtitan", 8).rope_complex
    assert not acc.plan_for(rec, "automodel", 8).rope_complex


def test_a_layernorm_model_keeps_three_passes_unfused():
    # PyTorch's LayerNorm is one native kernel even in eager; the unfused fallback's three passes are kept
    fused, eager = _plans()
    ln = ModelSpec(**DENSE, norm_type="layernorm")
    rms = ModelSpec(**DENSE)
    d_ln = elementwise_bytes(ln, eager, False) - elementwise_bytes(ln, fused, False)
    d_rms = elementwise_bytes(rms, eager, False) - elementwise_bytes(rms, fused, False)
    assert d_rms - d_ln == pytest.approx(2 * T * 256 * (sum(EAGER_RMSNORM_BYTES) / 3 - 12))


# torchtitan benchmarks/llama3_h100_202412_torchtitan.md (torch 1963fc8, torchtitan 9dec370), Tables 1 and 3:
# Llama 3.1 8B, FSDP, selective (op) activation checkpointing, bf16, TPS/GPU without and with torch.compile:
# 8 GPUs 5,762 / 6,667; 128 GPUs 5,605 / 6,514.
PAIRS = [("torchtitan-2412-t1-llama31-8b-8gpu-fsdp", 5762, 6667),
         ("torchtitan-2412-t3-llama31-8b-128gpu-fsdp", 5605, 6514)]


@pytest.mark.parametrize("rid, eager_tps, compiled_tps", PAIRS)
def test_torch_compile_speedup_on_torchtitans_published_pairs(acc, published_runs, rid, eager_tps, compiled_tps):
    # what torch.compile gains over eager (1.157x and 1.162x published) within 5%; pricing eager's norms as
    # three fused passes and its SwiGLU as fused gave 1.05x on both
    def tps(r: str) -> float:
        return next(p for q, p, _ in acc.predict(published_runs[r], "torchtitan") if q == "tok/s/GPU")
    assert published_runs[rid]["measured"]["tokens_per_s_per_gpu"] == eager_tps
    assert published_runs[rid + "-compile"]["measured"]["tokens_per_s_per_gpu"] == compiled_tps
    predicted = tps(rid + "-compile") / tps(rid)
    assert predicted == pytest.approx(compiled_tps / eager_tps, rel=0.05)


def test_eager_layers_launch_their_ops_one_by_one():
    # torchtitan 9dec370 TransformerBlock forward as eager ops: 2 RMSNorms x 8 (float, pow, mean, + eps, rsqrt,
    # x * rsqrt, type_as, * weight), wq / wk / wv (3), rotary on q and k x 3 (float, complex product, type_as),
    # repeat_kv on k and v (2), SDPA (1), wo (1), w1, w3, silu, product, w2 (5), two residual adds (2)
    from llmplan.cost.compute import KERNEL_LAUNCH_S
    from llmplan.cost.overhead import EAGER_LAYER_KERNELS, LAYER_KERNELS, host_seconds

    assert EAGER_LAYER_KERNELS == 2 * 8 + 3 + 2 * 3 + 2 + 1 + 1 + 5 + 2
    fused, eager = _plans()
    # a GPU with no work to hide the launches behind (per_mb 0): every launch is waited for; 4 layers, no recompute
    layers = 4
    extra = host_seconds(eager, layers, 0.0, 0.0) - host_seconds(fused, layers, 0.0, 0.0)
    per_layer = (EAGER_LAYER_KERNELS - LAYER_KERNELS) * KERNEL_LAUNCH_S
    assert extra == pytest.approx(per_layer + fused.num_microbatches * per_layer * layers * 3)
    # with a long GPU micro-batch the host stays ahead: only the step's first layer is waited for
    long = host_seconds(eager, layers, 10.0, 0.0) - host_seconds(fused, layers, 10.0, 0.0)
    assert long == pytest.approx(per_layer)
