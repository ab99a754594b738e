"""DeepSpeed ZeRO-1's gradient copies after the backward (docs/formulas.md#mem.optimizer_copies) and the
embedding norm's saved input (docs/formulas.md#mem.activations)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plans import plan_of

from llmplan.cost.memory import activation_bytes, training_memory
from llmplan.cost.model_states import REDUCE_BUCKET_ELEMENTS, optimizer_copies
from llmplan.cost.params import rank_params
from llmplan.specs.hf import from_hf_config
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models
from llmplan.specs.allowance import MemoryAllowance
from llmplan.units import GIB


_zero1 = plan_of(dict(tp=8, pp=1, dp=8, zero=1, global_batch=64, grad_dtype="bf16", grad_reduce="all-reduce",
                      recompute="full"))


def test_bucket_default_is_deepspeeds() -> None:
    # microsoft/DeepSpeed deepspeed/runtime/zero/constants.py at 2151c787a:
    # ZERO_OPTIMIZATION_REDUCE_BUCKET_SIZE_DEFAULT = 500000000 (elements).
    assert REDUCE_BUCKET_ELEMENTS == 500_000_000


def test_copies_follow_stage_1_and_2s_step() -> None:
    # stage_1_and_2.py at 2151c787a: allreduce_bucket flattens a bucket (<= 5e8 elements) of 16-bit gradients;
    # step() flattens the rank's partition of them (2 bytes x P/d) and casts that to fp32 (4 bytes x P/d).
    n, d = 3e9, 8
    c = optimizer_copies(_zero1(dp=d), n, d)
    assert (c.bucket, c.flat, c.cast) == (5e8 * 2, n / d * 2, n / d * 4)
    small = optimizer_copies(_zero1(dp=d), 1e8, d)
    assert small.bucket == 1e8 * 2  # a rank with fewer parameters than a bucket flattens them all once


def test_no_copies_where_the_gradients_are_the_masters_dtype_or_reduce_scattered() -> None:
    # BF16_Optimizer (fp32 gradients: the partition is a view of them) and Megatron's distributed optimizer
    # (reduce-scatter into its own buffer) make none of these copies.
    assert optimizer_copies(_zero1(grad_dtype="fp32"), 3e9, 8).total == 0
    assert optimizer_copies(_zero1(grad_reduce="reduce-scatter"), 3e9, 8).total == 0


@settings(max_examples=20, deadline=None, derandomize=True)
@given(dp=st.sampled_from([1, 2, 4, 8, 16]), mb=st.sampled_from([1, 2, 4]))
def test_allocated_peak_is_the_largest_phase(dp: int, mb: int) -> None:
    # The copies come after the backward, when the activations are freed: the allocated peak is the largest of
    # the backward's (W + G + O + A), the reduction's (W + G + O + bucket) and the step's (W + O + the
    # partition's gradients + flat + cast), never their sum; the backward's parts stay as they were.
    m = builtin_models()["llama-3.1-8b"]
    plan = _zero1(tp=1, dp=dp, micro_batch=mb, global_batch=dp * mb * 4)
    off = training_memory(m, plan.model_copy(update={"grad_reduce": "reduce-scatter"}), 80 * GIB)
    on = training_memory(m, plan, 80 * GIB)
    n = float(rank_params(m, plan, 0).total)
    w, g, o, a = (float(x) for x in (off.weights, off.gradients, off.optimizer, off.activations))
    step = w + o + n * 2 / dp + n * 2 / dp + n * 4 / dp
    reduce = w + g + o + min(5e8, n) * 2
    assert float(on.after_backward) == max(0.0, max(step, reduce) - (w + g + o + a))
    # beyond that, DeepSpeed's param.grad is freed at each step and reallocated (stage_1_and_2.py
    # free_grad_in_param_list), so its gradients carry the fragmentation fraction that Megatron's held buffer
    # does not (docs/formulas.md#mem.fragmentation)
    frag = MemoryAllowance().fragmentation
    assert float(on.total) - float(on.after_backward) == pytest.approx(float(off.total) + frag * g, rel=1e-12)
    assert float(on.optimizer_copies) == min(5e8, n) * 2 + n * 6 / dp


def test_embedding_norm_keeps_its_input_on_the_first_stage() -> None:
    # Megatron-DeepSpeed VocabParallelEmbedding at 99c8fe07: with --embed-layernorm, self.norm (a LayerNorm)
    # runs on the embedding output and keeps its 2-byte input, beside the dropout's 1-byte mask.
    m = builtin_models()["llama-3.1-8b"]
    plan = ParallelPlan(tp=1, pp=4, dp=1, global_batch=8, recompute="full")
    plain = activation_bytes(m, plan, 0)
    normed = activation_bytes(m.model_copy(update={"embedding_norm": True}), plan, 0)
    assert float(normed.embedding) == 3 * float(plain.embedding) > 0
    assert float(activation_bytes(m.model_copy(update={"embedding_norm": True}), plan, 3).embedding) == 0


def test_bloom_config_has_the_embedding_norm() -> None:
    # Hugging Face transformers BloomModel: word_embeddings_layernorm after word_embeddings.
    cfg = {"model_type": "bloom", "hidden_size": 1024, "n_layer": 24, "n_head": 16, "vocab_size": 250880,
           "seq_length": 2048}
    assert ModelSpec(**from_hf_config(cfg, "bloom-560m")).embedding_norm


def test_cli_json_reports_the_copies_and_the_after_backward_excess_in_bytes(cli) -> None:
    # stage_1_and_2.py at 2151c787a, one data-parallel rank (d = 1) of P parameters with bf16 gradients and an
    # fp32 master: a bucket of min(5e8, P) x 2 bytes, the flat partition P x 2 and its cast P x 4; none with
    # Megatron's reduce-scatter. after_backward is the part of `other` the copies add over the backward's peak.
    args = ("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--tp", "8", "--dp", "1", "--zero",
            "1", "--grad-dtype", "bf16", "--recompute", "full", "--global-batch", "8", "--json")
    runs = {how: cli(*args, "--grad-reduce", how) for how in ("all-reduce", "reduce-scatter")}
    assert all(r.code == 0 for r in runs.values()), [r.err for r in runs.values()]
    on, off = (json.loads(runs[how].out) for how in ("all-reduce", "reduce-scatter"))
    n = on["params"]["per_gpu"]
    assert on["memory"]["optimizer_copies"] == min(REDUCE_BUCKET_ELEMENTS, n) * 2 + n * 6
    assert 0 < on["memory"]["after_backward"] < on["memory"]["other"]
    assert off["memory"]["optimizer_copies"] == off["memory"]["after_backward"] == 0
