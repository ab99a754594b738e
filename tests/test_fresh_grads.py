"""Each micro-batch's fresh weight gradient under grad_accumulation add (docs/formulas.md#mem.fresh_grads):
PyTorch's AccumulateGrad adds a new gradient into an existing param.grad (`variable_grad += new_grad`,
torch/csrc/autograd/functions/accumulate_grad.h), so the largest weight's new gradient lives beside what its
moment holds. Expected values by hand from the model's shapes."""

from __future__ import annotations

from plans import plan_of

from llmplan.cost.model_states import fresh_grad_bytes
from llmplan.specs.model import ModelSpec
from llmplan.specs.registry import builtin_systems
from llmplan.units import GIB


def _gpt(h: int = 1024, f: int = 4096, vocab: int = 32768) -> ModelSpec:
    return ModelSpec(name="t", model_type="gpt", hidden_size=h, intermediate_size=f, num_hidden_layers=8,
                     num_attention_heads=16, vocab_size=vocab, max_position_embeddings=2048,
                     tie_word_embeddings=True, gated_mlp=False, norm_type="layernorm")


_plan = plan_of(dict(tp=2, pp=2, dp=4, zero=1, global_batch=64, recompute="full", grad_dtype="bf16",
                     grad_accumulation="add"))


def test_the_three_moments() -> None:
    m, p = _gpt(), _plan()
    # vocabulary 32,768 is a multiple of 128 x 2: V/t x h = 16,384 x 1,024 rows on each TP rank, 2 bytes each
    emb = 2 * 16_384 * 1_024
    fc2 = 2 * 4_096 * 1_024 // 2  # f x h / t, 2 bytes
    # first stage: the embedding's gradient once the micro-batch's layers (1e6) and working set (2e6) are freed
    assert fresh_grad_bytes(m, p, 0, working=2e6, per_microbatch=1e6) == emb - 3e6
    # last stage: the output weight's, before any layer is recomputed (its layers' activations still held)
    assert fresh_grad_bytes(m, p, 1, working=2e6, per_microbatch=1e6) == emb - 2e6
    # a working set larger than the embedding's gradient leaves fc2's, the first one of a layer's backward
    assert fresh_grad_bytes(m, p, 0, working=1e9, per_microbatch=1e6) == fc2


def test_fp32_training_doubles_the_new_gradient() -> None:
    m = _gpt()
    two = fresh_grad_bytes(m, _plan(), 1, working=0.0, per_microbatch=0.0)
    assert fresh_grad_bytes(m, _plan(dtype="fp32", grad_dtype="fp32"), 1, working=0.0, per_microbatch=0.0) == 2 * two


def test_nothing_where_the_gemm_accumulates() -> None:
    for how in ("fused", "cast-add", "copy"):
        p = _plan(grad_accumulation=how, zero=2 if how == "copy" else 1)
        assert fresh_grad_bytes(_gpt(), p, 0, working=0.0, per_microbatch=0.0) == 0.0


def test_bloom_tp2_pp6_dp32_first_stage_peak(published_runs, acc):
    # BigScience chronicles-prequel.md 'gbs-and-tp-variations' (2022-02-25): 72 layers, h 14,336, vocabulary
    # 250,880, TP2 PP6 DP32, micro-batch 1, fp16 ZeRO-1 (tr11-200B-ml.slurm) ran out of memory. At the first
    # stage's embedding backward (DeepSpeed's TrainSchedule: pp - 0 = 6 micro-batches in flight) the rank holds
    # the other 5 micro-batches' 12 layer inputs (2sbh each), the 6 embedding norms' inputs and dropout masks
    # (3sbh each) and the fresh 2 x 250,880/2 x 14,336-byte embedding gradient.
    from llmplan.estimate import estimate_training
    from llmplan.specs.plan import ClusterSpec

    rec = published_runs["bloom-prequel-gbs-and-tp-variations-L72h14336a64-dp32tp2pp6mbs1gbs2048z1"]
    cluster = ClusterSpec(system=builtin_systems()[acc.record_system(rec)], num_nodes=48, gpus_per_node=8)
    mem = estimate_training(acc.model_for(rec, "bloom"), cluster, acc.plan_for(rec, "bloom", 384)).memory
    sbh = 2048 * 14_336
    moment = 5 * 12 * 2 * sbh + 6 * 3 * sbh + 2 * 125_440 * 14_336
    assert int(mem.stage) == 0
    assert float(mem.activations + mem.fresh_grad) == moment
    assert not mem.fits and float(mem.total) > 79 * GIB  # 79.44 GiB of 79.15 (docs/validation.md#split-allowance)


def test_vectorised_search_prices_the_fresh_gradient_as_the_scalar_estimate() -> None:
    # grad_accumulation is a workload field: the search's plan arrays price fresh_grad_bytes through the same
    # function; with a 128k vocabulary the first / last stage's embedding gradient sets some peaks
    from itertools import islice

    from agreement import assert_arrays_agree

    from llmplan.estimate import estimate_training
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    from llmplan.specs.check import check_plan
    from llmplan.specs.plan import ClusterSpec
    from llmplan.specs.registry import builtin_models

    m, cluster = builtin_models()["llama-3.1-8b"], ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=1)
    w = Workload(global_batch=64, seq_len=2048, grad_accumulation="add")
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    ok = (i for i in range(len(plans)) if plans.plan(i).zero < 2 and not check_plan(m, plans.plan(i), cluster))
    idx = list(islice(ok, 0, 300, 7))
    moved = [i for i in idx if float(estimate_training(m, cluster, plans.plan(i)).memory.fresh_grad) > 0]
    assert len(moved) >= 3
    assert_arrays_agree(m, cluster, plans, idx)
