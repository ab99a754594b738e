"""A switch the user sets never silently does nothing: a switch that acts only on a plan axis (ZeRO-3, TP with
sequence parallelism, pipeline stages, expert parallelism) or a model feature (expert layers) is refused in one
line with exit code 2 where the plan lacks it (check_switches: SWITCH_USES, moe_switches_dense, ...), and the
search keeps the plans without the axis, priced as without the switch, refusing only when none can use it."""

from __future__ import annotations

import pytest

from llmplan.cost.comm import comm_seconds, step_comm
from llmplan.cost.memory import training_memory
from llmplan.cost.step import step_time
from llmplan.search.grid import Workload, default_space
from llmplan.search.run import search
from llmplan.specs.check import check_plan
from llmplan.specs.check_switches import SWITCH_USES, settle
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.topology.placement import place

DENSE = ("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--global-batch", "64")
MOE = ("estimate", "--model", "mixtral-8x7b", "--hardware", "dgx-h100", "--nodes", "2", "--tp", "2",
       "--global-batch", "64")


@pytest.mark.parametrize("args, needles", [
    # what is wrong and the values; the rule; the fix
    ((*DENSE, "--zero", "1", "--zero3-unit", "tensor"),
     ("zero3_unit tensor with zero 1", "only ZeRO-3 gathers the weights", "use --zero 3 or drop --zero3-unit")),
    # named at its default: still asks for something the plan does not do
    ((*DENSE, "--zero", "2", "--zero3-unit", "layer"),
     ("zero3_unit layer with zero 2", "use --zero 3 or drop --zero3-unit")),
    ((*DENSE, "--expert-gemm", "per-expert"),
     ("expert_gemm per-expert", "mixture-of-experts layers, and llama-3.1-8b is dense", "drop --expert-gemm")),
    ((*DENSE, "--expert-gemm", "grouped"), ("expert_gemm grouped", "is dense", "drop --expert-gemm")),
    ((*DENSE, "--moe-dispatcher", "deepep", "--ep-comm-overlap"),
     ("moe_dispatcher deepep, ep_comm_overlap", "is dense", "drop --moe-dispatcher, --ep-comm-overlap")),
    ((*DENSE, "--moe-capacity-factor", "1.25"), ("moe_capacity_factor 1.25", "is dense")),
    ((*MOE, "--ep-comm-overlap"), ("ep_comm_overlap with ep 1", "raise --ep or drop --ep-comm-overlap")),
    ((*MOE, "--moe-routing", "contiguous"), ("moe_routing contiguous with ep 1", "drop --moe-routing")),
    ((*MOE, "--ep", "8", "--moe-dispatch-sms", "24"),
     ("moe_dispatch_sms 24 with moe_dispatcher alltoall", "add --moe-dispatcher deepep or drop --moe-dispatch-sms")),
    ((*DENSE, "--no-flash-attention", "--attention-kernel", "flash2"),
     ("attention_kernel flash2 with unfused attention", "use --flash-attention or drop --attention-kernel")),
    ((*DENSE, "--dtype", "fp32", "--grad-dtype", "bf16"),
     ("grad_dtype bf16 with dtype fp32", "drop --grad-dtype")),
    ((*DENSE, "--fp8-params"), ("fp8_params with dtype bf16", "give an fp8 or fp4 --precision, or drop --fp8-params")),
    ((*DENSE, "--zero", "1", "--fp32-param-shards"),
     ("fp32_param_shards with zero 1 and dtype bf16", "drop --fp32-param-shards")),
    ((*DENSE, "--zero", "3", "--dtype", "fp32", "--fp32-param-shards"),
     ("fp32_param_shards with zero 3 and dtype fp32",)),
    ((*DENSE, "--tp-impl", "dtensor"), ("tp_impl dtensor with tp 1 and sp off", "drop --tp-impl")),
    ((*DENSE, "--tp-comm-overlap"), ("tp_comm_overlap with tp 1 and sp off", "drop --tp-comm-overlap")),
    ((*DENSE, "--pp-schedule", "zero-bubble"),
     ("pp_schedule zero-bubble with pp 1", "use --pp 2 or more or drop --pp-schedule")),
    ((*DENSE, "--tp", "2", "--pp", "2", "--pp-scatter-gather"),
     ("pp_scatter_gather with tp 2, pp 2, sp on", "drop --pp-scatter-gather")),
])
def test_switch_without_what_it_acts_on_exits_2_with_one_line(cli, args, needles):
    r = cli(*args)
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and len(lines) == 1 and "Traceback" not in r.err, r.err
    assert "the plan breaks a rule:" in lines[0]
    for needle in needles:
        assert needle in lines[0], r.err


@pytest.mark.parametrize("args", [
    (*DENSE, "--zero", "3", "--zero3-unit", "tensor", "--fp32-param-shards"),
    (*DENSE, "--no-ep-comm-overlap"),  # a switch turned off asks for nothing
    (*DENSE, "--tp", "2", "--tp-impl", "dtensor"),
    (*MOE, "--ep", "8", "--ep-comm-overlap", "--moe-routing", "contiguous"),
])
def test_switch_with_what_it_acts_on_runs(cli, args):
    r = cli(*args)
    assert r.code == 0, r.err


M, SYSTEMS = builtin_models(), builtin_systems()
ON = {"overlap_param_gather_with_optimizer_step": True, "zero3_unit": "tensor", "fp32_param_shards": True, "tp_impl": "dtensor", "tp_comm_overlap": True,
      "pp_scatter_gather": True,
      "pp_schedule": "zero-bubble", "ep_comm_overlap": True, "moe_routing": "contiguous",
      "cp_impl": "torch-allgather", "cp_comm_type": "a2a", "cp_a2a_size": 4, "cp_kv_repeated": True, "cp_comm_overlap": False, "rope_complex": True, "zero3_copy_out": True,
      "pp_blocking_sends": True, "norm_kernel": "two-pass", "pp_unbatched_sends": True, "softmax_kernel": "eager-fp32", "fp8_scaling": "current",
      "tp_overlap_sms": (8.0, 8.0, 8.0, 8.0), "tp_overlap_margin_sms": (0.0, 16.0, 16.0, 16.0),
      "kept_grad_shards": True, "fp32_embedding_grads": True, "moe_router_padding": True, "delay_wgrad": True,
      "torchao_saves_hp_input": False, "fused_loss_impl": "te", "unfused_loss_impl": "vocab-parallel",
      "jit_activation": True, "megatron_fsdp": True, "grad_reduce_dtype": "bf16", "grad_reduce_fp32_sum": True,
      "moe_flex_backend": "hybridep"}
"""A value away from the default for every field of SWITCH_USES."""
BASES = [("llama-3.1-8b", 2, dict(tp=1, pp=1, dp=16, zero=1)), ("llama-3.1-8b", 2, dict(tp=2, pp=2, dp=4, sp=True)),
         ("llama-3.1-8b", 2, dict(tp=2, pp=1, dp=8, sp=False, zero=2)), ("llama-3.1-8b", 2, dict(tp=1, pp=2, dp=8)),
         ("mixtral-8x7b", 2, dict(tp=2, pp=2, dp=4, ep=1, sp=True, zero=1, recompute="full")),
         ("mixtral-8x7b", 2, dict(tp=1, pp=1, dp=16, ep=1, zero=3)),
         ("mixtral-8x7b", 2, dict(tp=1, pp=1, dp=16, ep=2, etp=2, zero=1)),
         ("llama-3.1-8b", 2, dict(tp=1, pp=1, dp=16, zero=1, fused_kernels=False))]  # eager: rope_complex idle


def _priced(m, cluster, plan):
    gpu = cluster.system.gpu
    mem = training_memory(m, plan, gpu.hbm_bytes, None, gpu.fp8_tn_only, gpu.nccl_sms)
    comm = step_comm(m, plan, place(plan.degrees, cluster), cluster.system)
    step = step_time(m, plan, gpu, comm_seconds(comm, cluster.system))
    return float(mem.total), float(step.total)


@pytest.mark.parametrize("use", SWITCH_USES, ids=lambda u: u.name)
@pytest.mark.parametrize("model, nodes, axes", BASES)
def test_a_switch_without_its_axis_prices_as_without_it(use, model, nodes, axes):
    """What makes the refusal and the search's settling right: on a plan without the axis the switch changes
    neither memory nor step time (the rule's predicate agrees with the cost model)."""
    m, cluster = M[model], ClusterSpec(system=SYSTEMS["dgx-h100"], num_nodes=nodes)
    plan = ParallelPlan(global_batch=64, seq_len=4096, **axes)
    on = plan.model_copy(update={f: ON[f] for f in use.fields})
    if bool(use.uses(on)):
        pytest.skip("the plan has the axis")
    assert _priced(m, cluster, on) == _priced(m, cluster, plan)
    assert settle(on) == plan and not check_plan(m, plan, cluster)
    rule = "moe_switches_dense" if use.moe and not m.is_moe else use.name
    assert [v.rule for v in check_plan(m, on, cluster)] == [rule]


def test_search_keeps_plans_without_the_axis_and_shows_them_settled():
    """--zero3-unit tensor in a search: ZeRO 0-2 plans stay (priced as they run) and show zero3_unit layer;
    the ZeRO-3 plans gather per tensor."""
    m, cluster = M["llama-3.1-8b"], ClusterSpec(system=SYSTEMS["dgx-h100"], num_nodes=1)
    w = Workload(global_batch=256, seq_len=4096, zero3_unit="tensor")
    res = search(m, cluster, default_space(m, cluster, w, {"tp": 1, "pp": 1, "cp": 1}), w, top=10)
    zeros = {e.plan.zero for e in res.ranked + res.pareto}
    assert zeros - {3}, zeros
    for e in res.ranked + res.pareto:
        assert e.plan.zero3_unit == ("tensor" if e.plan.zero == 3 else "layer")


@pytest.mark.parametrize("args, needles", [
    (("--zero", "1", "--zero3-unit", "tensor"),
     ("error: --zero3-unit: none of the", "plans left by the rules can use it", "zero3_unit tensor with zero 1")),
    (("--zero", "2", "--zero3-unit", "layer"), ("zero3_unit layer with zero 2",)),
    (("--tp", "1", "--tp-impl", "dtensor"), ("tp_impl dtensor with tp 1",)),
    (("--tp", "1", "--tp-comm-overlap"), ("tp_comm_overlap with tp 1",)),
    (("--expert-gemm", "per-expert"), ("moe_switches_dense", "llama-3.1-8b is dense")),
    (("--expert-gemm", "grouped"), ("expert_gemm grouped", "llama-3.1-8b is dense")),
])
def test_search_says_when_no_plan_can_use_a_switch(cli, args, needles):
    r = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--pp", "1", "--cp", "1", *args)
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and len(lines) == 1 and "Traceback" not in r.err, r.err
    for needle in needles:
        assert needle in lines[0], r.err


def test_advice_drops_a_switch_its_change_leaves_without_its_axis(monkeypatch):
    """A DTensor-TP plan advised to halve TP to 1: the changed plan is priced without tp_impl (which would do
    nothing at tp 1, and which check_plan refuses there) and the advice says to drop --tp-impl."""
    import llmplan.advice as advice
    from llmplan.estimate import estimate_training

    m, cluster = M["llama-3.1-8b"], ClusterSpec(system=SYSTEMS["dgx-h100"], num_nodes=1)
    plan = ParallelPlan(tp=2, dp=4, sp=True, tp_impl="dtensor", zero=2, global_batch=64, seq_len=4096)
    change = {"tp": 1, "dp": 8, "sp": False}
    monkeypatch.setattr(advice, "training_candidates", lambda e: [("fewer TP ranks run larger GEMMs", change)])
    items = [a for a in advice.advise_training(estimate_training(m, cluster, plan)) if "TP ranks" in a.change]
    want = estimate_training(m, cluster, plan.model_copy(update={**change, "tp_impl": "megatron"}))
    assert len(items) == 1 and "drop --tp-impl" in items[0].change, items
    assert items[0].predicted["tokens_per_s"] == pytest.approx(float(want.throughput.tokens_per_s))


def test_search_turns_tp_comm_overlap_on_where_sp_is_and_never_refuses_its_own_default(cli):
    """search's default --tp-comm-overlap (on where sp is, as Megatron-Bridge recipes set it) is not the user's:
    with tp pinned to 1 no plan uses it and the search runs."""
    r = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--tp", "1", "--pp", "1", "--cp", "1",
            "--json")
    assert r.code == 0, r.err
    assert r.json()["plans"] and all(not row["plan"]["tp_comm_overlap"] for row in r.json()["plans"])


@pytest.mark.parametrize("args, needle", [
    (("--tp", "2", "--max-tp", "4"), "--max-tp 4 bounds a free --tp, but --tp 2 pins it; drop one of them"),
    (("--pp", "1", "--max-pp", "2"), "--max-pp 2 bounds a free --pp, but --pp 1 pins it"),
    (("--cp", "2", "--max-cp", "4"), "--max-cp 4 bounds a free --cp, but --cp 2 pins it"),
    (("--no-cp", "--max-cp", "4"), "--max-cp 4 bounds a free --cp, but --no-cp pins it"),
    (("--no-cp", "--cp", "2"), "--no-cp and --cp 2 both set the context-parallel degree; give one of them"),
    (("--global-batch", "64", "--batch-tokens", "1M"), "--global-batch 64 and --batch-tokens 1M both set the batch"),
])
def test_search_options_that_would_ignore_each_other_exit_2(cli, args, needle):
    r = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", *args)
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and len(lines) == 1 and needle in lines[0], r.err


def test_export_wrap_without_a_wrapping_launch_exits_2(cli, tmp_path):
    """--wrap picks what torchrun / slurm launch; with --to deepspeed it would be ignored."""
    plan = tmp_path / "p.json"
    assert cli(*DENSE, "--save", plan).code == 0
    r = cli("export", plan, "--to", "deepspeed", "--wrap", "megatron", "-o", tmp_path / "out")
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and len(lines) == 1, r.err
    assert "--wrap megatron picks the training target" in lines[0]
    assert "--to deepspeed writes no such launch" in lines[0]
    assert not (tmp_path / "out").exists()
    assert cli("export", plan, "--to", "torchrun", "--wrap", "megatron", "-o", tmp_path / "tr").code == 0
