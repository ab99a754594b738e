"""An untied input embedding held whole on every TP rank (ParallelPlan.tp_whole_embedding), as DeepSpeed 0.19.8's
training AutoTP holds it: runtime/engine.py converts the model's Hugging Face tp_plan (module_inject/
tp_plan_converter.py: embedding_rowwise becomes a SKIP spec) and module_inject/auto_tp.py _replace_module shards an
nn.Embedding only where a non-SKIP spec matches it; a Llama-style plan names no embed_tokens. A tied embedding is
sharded with the vocabulary-parallel head (_create_vocab_parallel_layer), so the switch leaves it alone.
Priced in the rank's parameters (weights, gradients, optimizer states, DP gradient sync) and without the embedding's
forward TP all-reduce; the DeepSpeed export requires it, the Megatron-style exports refuse it."""

from __future__ import annotations

import json
from pathlib import Path

from agreement import assert_arrays_agree, valid_sample
from refusal import targeted_search_exports
from llmplan.cost.comm import tp_edge_transfers
from llmplan.cost.params import rank_params
from llmplan.estimate import estimate_training
from llmplan.search.grid import Workload, default_space, enumerate_plans
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()
S = builtin_systems()
HERE = Path(__file__).parent
BASE = HERE / "data" / "plans" / "fsdp_train.json"  # llama-3.1-8b (untied), bf16, dgx-h100 x 2


def _plan(**kw: object) -> ParallelPlan:
    return ParallelPlan(**{"tp": 8, "pp": 1, "dp": 2, "global_batch": 32, "seq_len": 4096, "sp": False, **kw})


def test_llama_70b_tp8_parameters_per_rank_by_hand():
    # llama-3.1-70b: h 8192, f 28672, 64 query / 8 kv heads of 128, 80 layers, V 128,256, untied.
    # A layer at tp 8: attention (8192*8192*2 + 2*8192*1024) / 8 = 18,874,368; MLP 3*8192*28672 / 8 = 88,080,384;
    # two norms 16,384 whole: 106,971,136; 80 layers 8,557,690,880. Last stage: final norm 8,192 and the output
    # layer's vocabulary shard, V padded to 128 x 8 (129,024) / 8 x 8192 = 132,120,576.
    layers, head = 8_557_690_880, 8_192 + 132_120_576
    m = M["llama-3.1-70b"]
    split = rank_params(m, _plan(), 0)
    whole = rank_params(m, _plan(tp_whole_embedding=True), 0)
    assert split.dense == layers + head + 132_120_576  # Megatron's vocabulary shard: 0.13 G
    assert whole.dense == layers + head + 128_256 * 8192  # AutoTP's whole embed_tokens: 1,050,673,152 (1.05 G)
    assert whole.dense == 9_740_492_800
    # at tp 1 there is nothing to split: the switch changes nothing
    assert rank_params(m, _plan(tp=1, dp=16), 0).dense == rank_params(m, _plan(tp=1, dp=16,
                                                                               tp_whole_embedding=True), 0).dense


def test_a_tied_embedding_stays_with_the_vocabulary_parallel_head():
    m = M["gpt-1.7b"]
    assert m.tie_word_embeddings
    assert rank_params(m, _plan(), 0).dense == rank_params(m, _plan(tp_whole_embedding=True), 0).dense


def test_memory_holds_the_whole_embedding_its_gradient_and_optimizer_states():
    # ZeRO 0, bf16 weights, fp32 gradients (grad_dtype fp32), fp32 master and two fp32 Adam moments: 2 + 4 + 12 = 18
    # bytes for each parameter; the whole embedding adds V*h - V_pad*h/8 parameters on every rank
    m = M["llama-3.1-70b"]
    c = ClusterSpec(system=S["dgx-h100"], num_nodes=2)
    kw = dict(zero=0, grad_dtype="fp32")
    split = estimate_training(m, c, _plan(**kw)).memory
    whole = estimate_training(m, c, _plan(tp_whole_embedding=True, **kw)).memory
    extra = 128_256 * 8192 - 129_024 * 8192 // 8  # 918,552,576
    assert whole.weights - split.weights == 2 * extra
    assert whole.gradients - split.gradients == 4 * extra
    assert whole.optimizer - split.optimizer == 12 * extra


def test_no_forward_all_reduce_for_an_embedding_each_rank_holds():
    m = M["llama-3.1-70b"]
    def calls(p: ParallelPlan) -> float:
        sync, _ = tp_edge_transfers(m, p, "tp", 0)
        return sum(float(t.calls) for t in sync if t.collective == "all-reduce")

    # unfused loss: three all-reduces a micro-batch for the head; the vocabulary-parallel embedding one more
    mb = 32 // 2
    assert calls(_plan(fused_loss=False)) == 4 * mb
    assert calls(_plan(fused_loss=False, tp_whole_embedding=True)) == 3 * mb


def test_vectorised_search_prices_the_whole_embedding_as_the_scalar_estimate():
    m = M["llama-3.1-8b"]
    cluster = ClusterSpec(system=S["dgx-h100"], num_nodes=2)
    w = Workload(global_batch=256, seq_len=4096, tp_whole_embedding=True, fused_loss=False)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    idx = valid_sample(m, cluster, plans, seed=3, scan=600, n=8, keep=lambda p: p.tp > 1)
    assert any(plans.pp[i] > 1 for i in idx) and any(plans.pp[i] == 1 for i in idx)
    assert_arrays_agree(m, cluster, plans, idx)
    # and the switch moves them: the same plans priced with the embedding split hold less
    for i in idx[:3]:
        p = plans.plan(i)
        split = estimate_training(m, cluster, p.model_copy(update={"tp_whole_embedding": False}))
        assert estimate_training(m, cluster, p).memory.total > split.memory.total


def _plan_file(tmp_path: Path, **plan: object) -> Path:
    doc = json.loads(BASE.read_text())
    doc["plan"].update({"overlap_param_gather": False, "fused_loss": False, **plan})
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    return path


def test_deepspeed_refuses_the_split_embedding_at_tp(cli, tmp_path):
    # the unfused loss at tp 2 priced as DeepSpeed's (export.common.UNFUSED_LOSS_RUNS), so the embedding is what
    # the export meets
    ds = "eager-vocab-parallel"
    r = cli("export", _plan_file(tmp_path, zero=2, tp=2, dp=8, unfused_loss_impl=ds), "--to", "deepspeed", "-o",
            tmp_path / "a")
    assert r.code == 2, r.out
    line = r.err.strip()
    # llama-3.1-8b: V 128,256 x h 4096 = 0.53 G whole, half of it a rank at tp 2 (128,256 is a multiple of 256)
    assert "\n" not in line and "the input embedding split over tp 2 (0.26 G parameters a rank priced" in line
    assert "keeps an untied embed_tokens whole on each rank, 0.53 G" in line
    assert "re-plan with --tp-whole-embedding, or search with --target deepspeed" in line
    assert not (tmp_path / "a").exists()
    r = cli("export", _plan_file(tmp_path, zero=2, tp=2, dp=8, tp_whole_embedding=True, unfused_loss_impl=ds),
            "--to", "deepspeed", "-o", tmp_path / "b")
    assert r.code == 0, r.err
    # Megatron splits it: the same plan is refused there, in one line naming the fix
    # (its unfused loss priced as the one Megatron-Core runs, export.common.UNFUSED_LOSS_RUNS)
    r = cli("export", _plan_file(tmp_path, zero=1, tp=2, dp=8, tp_whole_embedding=True,
                                 unfused_loss_impl="vocab-parallel"), "--to", "megatron", "-o", tmp_path / "c")
    assert r.code == 2 and "\n" not in r.err.strip()
    assert "input embedding priced whole on each of tp 2 ranks" in r.err and "--vocab-parallel-embedding" in r.err
    # tp 1: nothing is split, DeepSpeed exports either way
    r = cli("export", _plan_file(tmp_path, zero=2, tp=1, dp=16), "--to", "deepspeed", "-o", tmp_path / "d")
    assert r.code == 0, r.err


def test_search_targeting_deepspeed_prices_the_whole_embedding(cli, tmp_path):
    # tp 2 pinned: the untargeted #1 splits the embedding and deepspeed refuses it; --target deepspeed searches
    # the whole embedding (export.WHOLE_EMBEDDING_TARGETS), its #1 exports and holds more than the split price
    common = ("--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--tp", "2", "--pp", "1", "--no-sp",
              "--no-overlap-param-gather", "--unfused-loss", "--unfused-loss-impl", "eager-vocab-parallel")
    targeted_search_exports(cli, tmp_path, common, "tp_whole_embedding", False, True,
                            "re-plan with --tp-whole-embedding")
    r = cli("search", *common, "--vocab-parallel-embedding", "--target", "deepspeed")
    assert r.code == 2 and "the input embedding split over tp 2" in r.err


def test_the_splitting_launchers_refuse_the_whole_embedding(cli, tmp_path):
    # Megatron-Bridge (VocabParallelEmbedding) and torchtitan (RowwiseParallel tok_embeddings) split it: one line,
    # exit 2, no files
    for target, extra in (("megatron-bridge", ("--zero", "1")), ("torchtitan", ("--zero", "3", "--tp-impl", "dtensor"))):
        path = tmp_path / f"{target}.json"
        assert cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "2", "--tp", "2",
                   "--dp", "8", "--tp-whole-embedding", *extra, "--save", path).code == 0
        r = cli("export", path, "--to", target, "-o", tmp_path / target)
        line = r.err.strip()
        assert r.code == 2 and "\n" not in line, (target, r.err)
        assert "input embedding priced whole on each of tp 2 ranks" in line
        assert line.endswith("re-plan with --vocab-parallel-embedding") and not (tmp_path / target).exists()
