"""The embeddings' fp32 gradients of NeMo 1.x under Apex DistributedFusedAdam (ParallelPlan.fp32_embedding_grads,
docs/formulas.md#mem.fp32_embedding_grads; docs/validation.md#nemo20b-switches).

Published source: NVIDIA/NeMo @579983fbfc (r2.0.0rc1, NeMo 24.07) megatron_gpt_model.py configure_optimizers reads
with_fp32_embedding_grads (default True) and sets _with_fp32_optimizer on the first stage's word embedding and
learned position embedding and on the last stage's shared_embedding_or_output_weight when the embeddings are tied;
nemo/core/optim/distributed_adam.py init_params_bucket buckets those parameters with grad_sync_dtype torch.float32;
NVIDIA/apex @810ffae374 distributed_fused_adam.py _init_grad_buffer allocates one zeroed buffer per bucket dtypes, in
its grad_sync_dtype. NeMo-Framework-Launcher tag 24.07 conf/training/gpt3/20b.yaml sets no
with_fp32_embedding_grads, make_vocab_size_divisible_by 128 (GPT-2 BPE 50,257 -> 50,432 at TP 2),
max_position_embeddings 2048, hidden 6144; examples/training/gpt/h100/20b_fp8_8node.sh adds grad_sync_dtype=bf16.
"""

from __future__ import annotations

import json
from itertools import islice
from types import SimpleNamespace

import pytest

import accuracy
from agreement import assert_arrays_agree
from llmplan.cost.comm import dp_transfers
from llmplan.cost.memory import training_memory
from llmplan.cost.model_states import fp32_embedding_grad_bytes, kept_grad_shard_bytes
from llmplan.cost.params import rank_params
from llmplan.estimate import estimate_training
from llmplan.export.common import fp32_embedding_grads_refusal
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, MemoryAllowance, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.units import GIB

ROW = "nemo2407-pretrain-gpt3-20b-64gpu-gbs256"


def test_the_gpt3_20b_row_by_hand(row_setup) -> None:
    # word embedding: 50,432 x 6144 / TP 2 = 154,927,104; positions 2048 x 6144 = 12,582,912 (replicated over TP);
    # bf16 buckets elsewhere, so 4 - 2 = 2 B more each: 335,020,032 B
    m, cluster, plan = row_setup(ROW)
    assert plan.fp32_embedding_grads and plan.grad_bytes == 2.0 and plan.pp == 1
    assert float(fp32_embedding_grad_bytes(m, plan, 0)) == 2 * (50_432 * 6144 // 2 + 2048 * 6144) == 335_020_032
    on = training_memory(m, plan, 80 * GIB, MemoryAllowance(), nccl_channels=16, compute_capability=9.0)
    off = training_memory(m, plan.model_copy(update={"fp32_embedding_grads": False}), 80 * GIB, MemoryAllowance(),
                          nccl_channels=16, compute_capability=9.0)
    assert float(on.gradients) - float(off.gradients) == pytest.approx(335_020_032, abs=1.0)
    # a held buffer like the other gradients (Apex's contiguous buckets): the total rises by it alone, no
    # fragmentation allowance on a buffer held all run (docs/formulas.md#mem.fragmentation)
    assert float(on.total) - float(off.total) == pytest.approx(335_020_032, abs=1.0)


def test_the_gpt3_20b_rows_fp32_reduce_scatter_and_shards_by_hand(row_setup) -> None:
    # Apex reduce-scatters each bucket in its grads_bucket dtype (NVIDIA/apex @810ffae374 _start_bucket_grad_sync),
    # fp32 for the embeddings' buckets: the stage-0 rank's dense reduce-scatter moves 2 B more for each of the
    # 154,927,104 + 12,582,912 embedding parameters, 335,020,032 B, over the same DP group; no other collective
    # moves. Its kept shard of those buckets is fp32 too: 335,020,032 / DP 32 = 10,469,376 B more.
    m, _, plan = row_setup(ROW)
    off_plan = plan.model_copy(update={"fp32_embedding_grads": False})
    on, off = dp_transfers(m, plan, 32, 1, 0), dp_transfers(m, off_plan, 32, 1, 0)
    moved = [(a.collective, float(a.calls) * float(a.message) - float(b.calls) * float(b.message))
             for a, b in zip(on, off, strict=True)]
    assert [x for x in moved if x[1] != 0.0] == [("reduce-scatter", 335_020_032.0)]
    assert [a.group for a in on] == [b.group for b in off]
    assert plan.optimizer_shard == 32 and plan.kept_grad_shards
    rp = rank_params(m, plan, 0)
    assert float(kept_grad_shard_bytes(plan, rp, fp32_embedding_grad_bytes(m, plan, 0))) \
        - float(kept_grad_shard_bytes(plan, rp)) == 335_020_032 / 32 == 10_469_376


def test_the_step_pays_the_fp32_reduce_scatter(row_setup) -> None:
    # The row's step with the switch on is no faster than with it off (the extra bytes ride the same group), and
    # its DP seconds are strictly more.
    m, cluster, plan = row_setup(ROW)
    on = estimate_training(m, cluster, plan)
    off = estimate_training(m, cluster, plan.model_copy(update={"fp32_embedding_grads": False}))
    assert float(on.time.total) >= float(off.time.total)
    assert float(on.comm.axes["dp"].seconds) > float(off.comm.axes["dp"].seconds)


def test_stages_of_a_pipeline() -> None:
    # GPT 18.4B (tied, learned positions; vocabulary 51,200, hidden 6144) at tp 2 pp 4: the first stage holds the
    # word embedding's shard and the position table, the last the output layer's copy of the tied word embedding,
    # the middle ones neither; an untied model (Llama 3.1 8B, RoPE) only the first stage's word embedding
    gpt = builtin_models()["gpt-18.4b"]
    plan = ParallelPlan(tp=2, pp=4, dp=2, zero=1, grad_dtype="bf16", fp32_embedding_grads=True, global_batch=8)
    vocab = 51_200 * 6144 // 2
    assert [float(fp32_embedding_grad_bytes(gpt, plan, s)) for s in range(4)] == [
        2.0 * (vocab + 2048 * 6144), 0.0, 0.0, 2.0 * vocab]
    llama = builtin_models()["llama-3.1-8b"]
    assert [float(fp32_embedding_grad_bytes(llama, plan, s)) for s in range(4)] == [
        2.0 * 128_256 * 4096 / 2, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("update,applies", [({}, True), ({"grad_dtype": "fp32"}, False), ({"zero": 2}, False),
                                            ({"zero": 0}, False), ({"grad_reduce": "all-reduce"}, False)])
def test_where_it_acts(update, applies) -> None:
    m = builtin_models()["gpt-18.4b"]
    plan = ParallelPlan(dp=8, zero=1, grad_dtype="bf16", fp32_embedding_grads=True, global_batch=8)
    plan = plan.model_copy(update=update)
    assert (float(fp32_embedding_grad_bytes(m, plan, 0)) > 0) == applies
    rules = {v.rule: v.message for v in check_plan(m, plan)}
    assert ("fp32_embedding_grads_zero" not in rules) == applies
    if not applies:
        assert "or drop --fp32-embedding-grads" in rules["fp32_embedding_grads_zero"]


def test_off_adds_nothing() -> None:
    m = builtin_models()["gpt-18.4b"]
    plan = ParallelPlan(dp=8, zero=1, grad_dtype="bf16", global_batch=8)
    assert float(fp32_embedding_grad_bytes(m, plan, 0)) == 0.0


def test_launchers_refuse_it() -> None:
    what, bad, fix = fp32_embedding_grads_refusal(SimpleNamespace(plan=ParallelPlan(fp32_embedding_grads=True)))
    assert bad and "Apex DistributedFusedAdam" in what and fix == "re-plan with --no-fp32-embedding-grads"
    assert not fp32_embedding_grads_refusal(SimpleNamespace(plan=ParallelPlan()))[1]


def test_the_rows_that_read_it(published_runs) -> None:
    # every nemo2407 row at zero 1 (Apex DistributedFusedAdam, 2-byte gradient buckets), no other family
    on = []
    for rid, rec in published_runs.items():
        fam = accuracy.family(rid)
        if fam not in accuracy.TRAIN_FAMILIES:
            continue
        setup = accuracy.record_setup(rec, fam)
        if setup is not None and setup[2].fp32_embedding_grads:
            on.append(rid)
    assert on and all(r.startswith("nemo2407-") for r in on) and ROW in on


def test_vectorised_search_prices_it_as_the_scalar_estimate() -> None:
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    m, cluster = builtin_models()["gpt-18.4b"], ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=2)
    w = Workload(global_batch=64, seq_len=2048, grad_dtype="bf16", fp32_embedding_grads=True)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    ok = (i for i in range(len(plans)) if plans.plan(i).zero == 1 and not check_plan(m, plans.plan(i), cluster))
    idx = list(islice(ok, 0, 200, 10))
    moved = [i for i in idx if float(estimate_training(m, cluster, plans.plan(i)).memory.total) != float(
        estimate_training(m, cluster, plans.plan(i).model_copy(update={"fp32_embedding_grads": False})).memory.total)]
    assert len(moved) >= 3
    assert_arrays_agree(m, cluster, plans, idx)


FLAG = ("estimate", "--model", "gpt-18.4b", "--hardware", "dgx-h100", "--global-batch", "64", "--zero", "1",
        "--grad-dtype", "bf16", "--fp32-embedding-grads")


def test_every_megatron_export_refuses_the_flag_in_one_line(cli, tmp_path) -> None:
    path = tmp_path / "plan.json"
    assert cli(*FLAG, "--save", path).code == 0
    assert json.loads(path.read_text())["plan"]["fp32_embedding_grads"] is True
    msg = cli("export", path, "--to", "megatron", "-o", tmp_path / "out").refusal()
    assert "fp32_embedding_grads" in msg and "re-plan with --no-fp32-embedding-grads" in msg
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_dualpipe_is_refused_in_one_line(cli) -> None:
    """NeMo 1.x under Apex (the only stack that keeps these fp32 buckets) never ran DualPipe, and the bytes were
    priced for the rank's own stage only, not the mirror stage pp-1-i it also holds under DualPipe. Before: exit 0,
    the first rank priced with stage 0's buckets and without stage pp-1's tied copy."""
    line = cli(*FLAG, "--pp", "2", "--pp-schedule", "dualpipe").refusal()
    assert "(rule fp32_embedding_grads_zero)" in line or "fp32_embedding_grads with" in line, line
    assert "pp_schedule dualpipe" in line and "or drop --fp32-embedding-grads" in line, line
    assert cli(*FLAG, "--pp", "2", "--pp-schedule", "1f1b").code == 0


@pytest.mark.parametrize("target", ["torchtitan", "torchtitan-0.2"])
@pytest.mark.parametrize("flag", ["--fp32-embedding-grads", "--kept-grad-shards"])
def test_torchtitan_refuses_the_apex_switches_as_zero_1(cli, tmp_path, target, flag) -> None:
    """check_plan keeps both Apex switches to zero 1 with grad_reduce reduce-scatter (rules
    fp32_embedding_grads_zero, kept_grad_shards_zero), which torchtitan refuses as ZeRO-1 (FSDP2 shards the
    gradients too) before any later check: its own refusals of the two switches could never be reached and
    were dropped (tidy-68). This pins the path that now refuses them."""
    path = tmp_path / "plan.json"
    assert cli(*FLAG[:-1], flag, "--save", path).code == 0
    msg = cli("export", path, "--to", target, "-o", tmp_path / "out").refusal()
    assert "ZeRO-1 (FSDP2 shards gradients and weights too)" in msg and "--zero 2" in msg, msg
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
