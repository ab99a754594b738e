"""grad_reduce_fp32_sum: Megatron-Core's reduce_scatter_with_fp32_accumulation (docs/formulas.md#comm.fp32_sum,
docs/formulas.md#mem.fp32_sum).

NVIDIA/Megatron-LM d98e8a64dd megatron/core/distributed/reduce_scatter_with_fp32_accumulation.py: the
distributed optimizer's reduce-scatter of a 16-bit bucket runs as `all_to_all_single` into
`torch.empty_like(input_tensor)` (the whole bucket, its dtype), then `torch.sum(view(world, -1), dim=0,
dtype=torch.float32)` (the rank's 1/world of it in fp32) and `output_tensor.copy_` of that sum downcast.
param_and_grad_buffer.py: only under use_distributed_optimizer; each bucket group drains its predecessor before
it allocates (one scratch at a time); distributed_data_parallel.py: bucket_size max(40M, 1M x dp), None without
overlap_grad_reduce; arguments.py: turned off under --accumulate-allreduce-grads-in-fp32.
"""

from __future__ import annotations

import json

import pytest

from llmplan.cost.comm import dp_transfers
from llmplan.cost.memory import stage_memory
from llmplan.specs.allowance import MemoryAllowance
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()["gpt-1.7b"]
CLUSTER = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=2)
# dp 16 of one gradient group: Megatron-Core's bucket max(40M, 1M x 16) = 40,000,000 parameters
PLAN = ParallelPlan(dp=16, zero=1, grad_dtype="bf16", global_batch=64, seq_len=2048, grad_reduce_fp32_sum=True)


def _mem(plan: ParallelPlan):
    return stage_memory(M, plan, 0, MemoryAllowance(), CLUSTER.system.gpu.hbm_bytes)


def test_scratch_by_hand() -> None:
    # overlapped: one 40M-parameter bucket in bf16 (80,000,000 B) and its fp32 sum of 1/16 (10,000,000 B)
    assert float(_mem(PLAN).optimizer_copies) == 40e6 * 2 + 40e6 / 16 * 4
    assert float(_mem(PLAN.model_copy(update={"grad_reduce_fp32_sum": False})).optimizer_copies) == 0.0
    # without the overlap Megatron-Core builds one bucket of the whole buffer (bucket_size None)
    whole = _mem(PLAN.model_copy(update={"overlap_grad_reduce": False}))
    p = float(whole.params_on_rank)
    assert p > 40e6 and float(whole.optimizer_copies) == p * 2 + p / 16 * 4


def test_transfers_by_hand() -> None:
    def dense(plan):
        return {t.collective: t for t in dp_transfers(M, plan, 16, 16, 0)[:4]}
    on, off = dense(PLAN), dense(PLAN.model_copy(update={"grad_reduce_fp32_sum": False}))
    # the reduce-scatter's calls move to an all-to-all of the same buffer: the same bytes on the wire
    assert float(on["reduce-scatter"].calls) == 0 and float(off["all-to-all"].calls) == 0
    assert float(on["all-to-all"].calls) == float(off["reduce-scatter"].calls) > 0
    assert float(on["all-to-all"].message) == float(off["reduce-scatter"].message)
    # around each call: the fp32 sum reads the received bucket (2 B an element) and writes 1/16 of it at 4 B, the
    # copy reads that and writes it at 2 B: message x (1 + (4 + 4 + 2) / 2 / 16)
    msg = float(on["all-to-all"].message)
    assert float(on["all-to-all"].copy_bytes) == pytest.approx(msg * (1 + 10 / 2 / 16), rel=1e-12)
    assert float(on["all-gather"].calls) == float(off["all-gather"].calls)


@pytest.mark.parametrize("update, ok", [
    ({}, True),
    ({"grad_dtype": "fp32"}, False),  # Megatron-LM turns it off under --accumulate-allreduce-grads-in-fp32
    ({"zero": 0}, False),  # no distributed optimizer: Megatron-Core all-reduces
    ({"grad_reduce": "all-reduce"}, False),
    ({"dp": 8, "dp_replicate": 2}, False),  # asserted off with num_distributed_optimizer_instances > 1
    # arguments.py at d98e8a64dd sets use_distributed_optimizer False for Muon (the layer-wise optimizer)
    ({"optimizer": "muon"}, False),
])
def test_check_plan_holds_it_to_the_distributed_optimizer(update, ok) -> None:
    names = [v.rule for v in check_plan(M, PLAN.model_copy(update=update), CLUSTER)]
    assert ("grad_reduce_fp32_sum_rs" not in names) == ok, names


def test_vectorised_search_agrees_with_the_estimate() -> None:
    import dataclasses

    from agreement import assert_arrays_agree, valid_sample
    from llmplan.cost.model_states import fp32_sum_reduction
    from llmplan.search.grid import Workload, default_space, enumerate_plans

    cluster = ClusterSpec(system=builtin_systems()["dgx-a100"], num_nodes=2)
    w = Workload(global_batch=64, seq_len=2048, grad_dtype="bf16", grad_reduce_fp32_sum=True)
    space = dataclasses.replace(default_space(M, cluster, w), zero=(0, 1))
    plans = enumerate_plans(space, cluster, w)
    idx = valid_sample(M, cluster, plans, seed=5, scan=600, n=24, keep=lambda p: bool(fp32_sum_reduction(p)))
    assert len(idx) >= 10
    assert_arrays_agree(M, cluster, plans, idx)


EST = ("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "4", "--zero", "1", "--tp", "2",
       "--pp", "1", "--global-batch", "256", "--seq-len", "4096", "--grad-reduce-fp32-sum")


def test_refused_under_fp32_gradients_in_one_line(cli) -> None:
    r = cli(*EST, "--grad-dtype", "fp32")
    assert r.code == 2 and "Traceback" not in r.err
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert len(" ".join(lines).split("error: ")) == 2 and "grad_reduce_fp32_sum with zero 1" in r.err
    assert "or drop --grad-reduce-fp32-sum" in " ".join(r.err.split())


def test_bad_value_in_a_plan_file_is_one_line(cli, tmp_path) -> None:
    r = cli(*EST, "--grad-dtype", "bf16", "--save", tmp_path / "p.json")
    assert r.code == 0, r.err
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["plan"]["grad_reduce_fp32_sum"] is True
    doc["plan"]["grad_reduce_fp32_sum"] = "maybe"
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    r = cli("export", tmp_path / "bad.json", "--to", "megatron", "-o", tmp_path / "out")
    assert r.code == 2 and "Traceback" not in r.err
    assert " ".join(r.err.split()) == (f"error: {tmp_path / 'bad.json'} (plan): grad_reduce_fp32_sum is the text "
                                       "'maybe'; write true or false without quotes")


def test_costs_more_than_the_ring_and_search_keeps_bf16_gradients(cli) -> None:
    on, off = (json.loads(cli(*a, "--grad-dtype", "bf16", "--json").out)
               for a in (EST, tuple(x for x in EST if x != "--grad-reduce-fp32-sum")))
    assert on["time"]["step_s"] > off["time"]["step_s"]
    # the search's fp32-gradient try has no plan it acts on: kept to bf16 gradients, not refused
    r = cli("search", "-m", "gpt-7.5b", "--hardware", "dgx-a100", "--nodes", "2", "--global-batch", "128",
            "--seq-len", "2048", "--zero", "1", "--top", "1", "--json", "--grad-reduce-fp32-sum")
    assert r.code == 0, r.err
    best = json.loads(r.out)["plans"][0]["plan"]
    assert (best["grad_dtype"], best["grad_reduce_fp32_sum"], best["zero"]) == ("bf16", True, 1)


def _exported(cli, tmp_path, target: str, **plan: object) -> tuple[int, str, str]:
    """Export the estimate's saved plan (with `plan`'s fields changed) to `target`: (exit code, files, stderr)."""
    if not (tmp_path / "p.json").exists():
        r = cli(*EST, "--grad-dtype", "bf16", "--save", tmp_path / "p.json")
        assert r.code == 0, r.err
    doc = json.loads((tmp_path / "p.json").read_text())
    doc["plan"].update(plan)
    n = len(list(tmp_path.glob("q*.json")))
    (tmp_path / f"q{n}.json").write_text(json.dumps(doc))
    out = tmp_path / f"{target}-{n}"
    r = cli("export", tmp_path / f"q{n}.json", "--to", target, "-o", out)
    text = "".join(f.read_text() for f in sorted(out.glob("*")) if f.is_file()) if r.code == 0 else ""
    return r.code, text, " ".join(r.err.split())


def test_exports(cli, tmp_path) -> None:
    code, text, err = _exported(cli, tmp_path, "megatron")
    assert code == 0, err
    assert "--ddp-reduce-scatter-with-fp32-accumulation" in text and "--grad-reduce-in-bf16" in text
    # Megatron-Bridge's bf16 presets reduce in fp32 (grad_reduce_in_fp32 True): an fp16 plan, whose preset does not
    code, text, err = _exported(cli, tmp_path, "megatron-bridge", dtype="fp16")
    assert code == 0, err
    assert "ddp.reduce_scatter_with_fp32_accumulation=true" in text
    code, _, err = _exported(cli, tmp_path, "deepspeed")
    assert err == ("error: deepspeed cannot express this plan: a reduce-scatter of 16-bit gradients summed in fp32 "
                   "by an all-to-all (grad_reduce_fp32_sum: Megatron-Core's reduce_scatter_with_fp32_accumulation; "
                   "this launcher's reduce-scatter sums in the gradients' dtype); re-plan with "
                   "--no-grad-reduce-fp32-sum, or export to megatron or megatron-bridge")


def test_megatron_fp16_gradient_dtype_flags(cli, tmp_path) -> None:
    # NVIDIA/Megatron-LM d98e8a6 validate_args forces fp32 main_grads under --bf16 only: an fp16 plan with fp32
    # gradients names --accumulate-allreduce-grads-in-fp32; --grad-reduce-in-bf16 is never written beside --fp16
    code, text, err = _exported(cli, tmp_path, "megatron", dtype="fp16", grad_dtype="fp32", grad_reduce_fp32_sum=False)
    assert code == 0, err
    assert "--accumulate-allreduce-grads-in-fp32" in text and "--grad-reduce-in-bf16" not in text
    code, text, err = _exported(cli, tmp_path, "megatron", dtype="fp16")
    assert code == 0, err
    assert "--accumulate-allreduce-grads-in-fp32" not in text and "--grad-reduce-in-bf16" not in text


def test_muon_refused_in_one_line_naming_it(cli) -> None:
    from llmplan.cost.model_states import fp32_sum_reduction
    assert not fp32_sum_reduction(PLAN.model_copy(update={"optimizer": "muon"}))
    r = cli(*EST, "--grad-dtype", "bf16", "--optimizer", "muon")
    assert r.code == 2 and "Traceback" not in r.err
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert len(" ".join(lines).split("error: ")) == 2, r.err
    assert "optimizer muon" in r.err and "not Muon" in " ".join(r.err.split())


def test_prescaling_priced_with_the_sum() -> None:
    # reduce_scatter_with_fp32_accumulation asserts op == ReduceOp.SUM (d98e8a64dd), so Megatron-LM's DDP
    # multiplies the buffer by 1/dp first: a read and a write of 2-byte gradients per parameter of the rank
    from llmplan.cost.overhead import grad_buffer_seconds
    gpu = CLUSTER.system.gpu
    on = float(grad_buffer_seconds(PLAN, 1e9, gpu))
    assert on == pytest.approx(2 * 2 * 1e9 / gpu.hbm_achieved_bytes_per_s, rel=1e-12)
    assert float(grad_buffer_seconds(PLAN.model_copy(update={"grad_reduce_fp32_sum": False}), 1e9, gpu)) == 0.0
    assert float(grad_buffer_seconds(PLAN.model_copy(update={"grad_prescale": True}), 1e9, gpu)) == on


def test_json_shows_the_prescaling_that_runs(cli, tmp_path) -> None:
    # Megatron-LM d98e8a64dd reduce_scatter_with_fp32_accumulation.py asserts op == ReduceOp.SUM, so where the
    # fp32 sum acts the buckets are pre-scaled by 1/dp whatever grad_prescale asked: the estimate shows that in
    # the added top-level key grad_prescaled, while the plan's grad_prescale keeps its own value (keys are added,
    # never given a new meaning), and the plan holds only ParallelPlan's fields, so it rebuilds one.
    r = cli(*EST, "--grad-dtype", "bf16", "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    plan = doc["plan"]
    assert plan["grad_reduce_fp32_sum"] is True and doc["grad_prescaled"] is True
    assert plan["grad_prescale"] is False  # as asked (the default)
    assert ParallelPlan(**plan).grad_prescale is False
    r = cli(*EST, "--grad-dtype", "bf16", "--no-grad-reduce-fp32-sum", "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["plan"]["grad_prescale"] is False and doc["grad_prescaled"] is False  # averaged in the collective


@pytest.mark.parametrize("target", ["megatron", "megatron-bridge"])
def test_never_averages_in_the_collective_beside_it(cli, tmp_path, target) -> None:
    # Megatron-LM d98e8a64dd: `assert op == torch.distributed.ReduceOp.SUM`, and average_in_collective makes
    # the op AVG (param_and_grad_buffer.py start_grad_sync): the two flags never together
    dtype = "fp16" if target == "megatron-bridge" else "bf16"
    for prescale in (False, True):
        code, text, err = _exported(cli, tmp_path, target, dtype=dtype, grad_prescale=prescale)
        assert code == 0, err
        if target == "megatron":
            assert "--ddp-reduce-scatter-with-fp32-accumulation" in text
            assert "--ddp-average-in-collective" not in text
        else:
            assert "ddp.reduce_scatter_with_fp32_accumulation=true" in text
            assert "ddp.average_in_collective=true" not in text and "ddp.average_in_collective=false" in text
    # without the switch the average stays where the plan priced it
    code, text, err = _exported(cli, tmp_path, target, dtype=dtype, grad_reduce_fp32_sum=False)
    assert code == 0, err
    assert ("--ddp-average-in-collective" if target == "megatron" else "ddp.average_in_collective=true") in text


def test_interleaved_scratch_by_hand() -> None:
    """NVIDIA/Megatron-LM d98e8a64dd: each model chunk is its own DDP (megatron/training/models/dist_utils.py:
    disable_bucketing = model_chunk_idx > 0; distributed_data_parallel.py: bucket_size None for pp_rank > 0),
    a bucket group drains only its predecessor in its own list, and each list's last group waits for
    finish_grad_sync (finalize_model_grads.py): on stage 0 four whole chunks and chunk 0's last bucket are live
    at once, on a later stage all five chunks."""
    m = builtin_models()["llama-3.1-70b"]
    cluster = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=8)
    plan = ParallelPlan(tp=8, sp=True, pp=4, vpp=5, dp=2, zero=1, grad_dtype="bf16", global_batch=64, seq_len=4096,
                        grad_reduce_fp32_sum=True)
    assert not check_plan(m, plan, cluster)
    # Llama 3.1 70B (hidden 8192, 64 heads / 8 KV heads of 128, FFN 28672, vocab 128256, 80 layers) at TP 8: a
    # layer's q, o (8192 x 8192), k, v (8192 x 1024) and three FFN matrices (8192 x 28672) split 8 ways beside its
    # two norms' 2 x 8192: 106,971,136; stage 0 adds the embedding padded to 129,024 rows (Megatron-LM's
    # --make-vocab-size-divisible-by 128 x TP 8) / 8 x 8192 = 132,120,576
    layer = (8192 * (2 * 8192 + 2 * 1024) + 3 * 8192 * 28672) // 8 + 2 * 8192
    later, first = 20 * layer, 20 * layer + 129024 * 8192 // 8
    mem = [stage_memory(m, plan, s, MemoryAllowance(), cluster.system.gpu.hbm_bytes) for s in (0, 1)]
    assert [float(x.params_on_rank) for x in mem] == [first, later]
    # each live element: 2 B all-to-all output and its fp32 sum of 1/dp = 1/2 at 4 B: 4 B
    bucket = 40e6  # max(40M, 1M x dp 2)
    assert float(mem[0].optimizer_copies) == pytest.approx((4 * first / 5 + bucket) * 4, rel=1e-12)  # ~7.43 GB
    assert float(mem[1].optimizer_copies) == pytest.approx(later * 4, rel=1e-12)  # ~8.56 GB
    # without the overlap every call is dispatched and waited in turn: one whole chunk
    off = stage_memory(m, plan.model_copy(update={"overlap_grad_reduce": False}), 1, MemoryAllowance(),
                       cluster.system.gpu.hbm_bytes)
    assert float(off.optimizer_copies) == pytest.approx(later / 5 * 4, rel=1e-12)


def test_dense_and_expert_scratch_add_up_with_the_overlap() -> None:
    # distributed_data_parallel.py at d98e8a64dd links previous_grad_reduce_bucket_group within the dense and
    # the expert list separately: each list's last group is live to finish_grad_sync, together
    from llmplan.cost.model_states import after_backward_peak
    from llmplan.cost.params import RankParams
    plan = PLAN.model_copy(update={"overlap_grad_reduce": False})
    rp = RankParams(dense=1e9, expert=2e9)
    one = lambda n: n * 2 + n / 16 * 4  # noqa: E731  # a whole buffer, one bucket, dp 16
    states = 1e11  # all gradients: the reduction's peak (states beside the scratch) is the larger
    _, off = after_backward_peak(plan, rp, states, states)
    assert float(off) - states == pytest.approx(max(one(1e9), one(2e9)), rel=1e-9)
    _, on = after_backward_peak(PLAN, rp, states, states)
    assert float(on) - states == pytest.approx(one(40e6) + one(40e6), rel=1e-9)  # a 40M bucket of each list


def test_bridge_bf16_plan_exports_with_the_switch(cli, tmp_path) -> None:
    # a bf16 plan's preset reduces in fp32 (grad_reduce_in_fp32 True): written out with the plan's bf16 reduction,
    # never refused with a fix (--grad-dtype fp32) that the switch's rule (grad_reduce_fp32_sum_rs) then refuses
    code, text, err = _exported(cli, tmp_path, "megatron-bridge", dtype="bf16")
    assert code == 0, err
    assert "ddp.reduce_scatter_with_fp32_accumulation=true" in text
    assert "grad_reduce_in_fp32=false" in text and "ddp.average_in_collective=false" in text


def test_torchtitan_refuses_it_by_zero_1(cli, tmp_path) -> None:
    # the switch acts only at zero 1 (grad_reduce_fp32_sum_rs), which torchtitan's FSDP2 never runs
    code, _, err = _exported(cli, tmp_path, "torchtitan")
    assert err == ("error: torchtitan cannot express this plan: ZeRO-1 (FSDP2 shards gradients and weights too); "
                   "re-plan with --zero 2 (FSDP without resharding after forward) or --zero 3")
    assert code == 2
