"""Two memory edges of issue 32 (docs/validation.md#memory-edges): PyTorch's cuBLAS workspaces, one per (handle,
stream) that runs its GEMMs, the forward thread's and autograd's device thread's (docs/formulas.md#mem.runtime);
and the gradient shards Apex's DistributedFusedAdam keeps from the backward's reduce-scatters to the next
zero_grad (ParallelPlan.kept_grad_shards, docs/formulas.md#mem.kept_grad_shards).

Published numbers: pytorch/pytorch aten/src/ATen/cuda/CublasHandlePool.cpp @26a39059 parseChosenWorkspaceSize
(4096 * 8 * 1024 = 33,554,432 B on compute capability 9.0; :4096:2:16:8 = 4096 KiB x 2 + 16 KiB x 8 = 8,519,680 B
elsewhere), setWorkspaceForHandle (a workspace per (handle, stream) key); DeviceThreadHandles.h (a handle per host
thread); torch/csrc/autograd/engine.cpp (a CUDA device's backward on a thread of its own). NVIDIA/apex
apex/contrib/optimizers/distributed_fused_adam.py @f3f049246e: _start_bucket_grad_sync allocates sync_grads_shard
as torch.empty([bucket_size // distributed_size], grad dtype), none when distributed_size is 1 (the bucket itself);
zero_grad clears the buckets."""

from __future__ import annotations

import json
from itertools import islice
from types import SimpleNamespace

import pytest

import accuracy
from agreement import assert_arrays_agree
from llmplan.cost.memory import training_memory
from llmplan.cost.model_states import kept_grad_shard_bytes
from llmplan.cost.params import RankParams
from llmplan.cost.runtime_memory import CUBLAS_TRAINING_HANDLES, pytorch_cublas_bytes, runtime_bytes
from llmplan.export.common import kept_grad_shards_refusal
from llmplan.specs.check import check_plan
from llmplan.estimate import estimate_training
from llmplan.specs.plan import ClusterSpec, MemoryAllowance, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.units import GIB

MIB = 2**20


def test_two_pytorch_cublas_workspaces_by_hand() -> None:
    # the Python thread's handle runs the forward's GEMMs, autograd's CUDA device thread's handle the backward's:
    # two (handle, stream) keys on the compute stream, each with its own workspace
    assert CUBLAS_TRAINING_HANDLES == 2
    assert pytorch_cublas_bytes(9.0) == 2 * 33_554_432 == 64 * MIB  # H100 / H200
    assert pytorch_cublas_bytes(8.0) == 2 * (4096 * 1024 * 2 + 16 * 1024 * 8) == 17_039_360  # A100
    plan = ParallelPlan(tp=8, sp=True, global_batch=1)
    assert float(runtime_bytes(plan, 0, 16, True, 0.0, 9.0).cublas) == 67_108_864


def test_kept_grad_shards_by_hand() -> None:
    # 1e9 dense parameters over dp 8, 2e8 routed-expert parameters over an expert data-parallel group of
    # world / (etp x ep x pp) = 8 / (1 x 4 x 1) = 2, bf16 gradients: 1e9 x 2 / 8 + 2e8 x 2 / 2 = 4.5e8 B
    rp = RankParams(dense=1e9, expert=2e8)
    plan = ParallelPlan(dp=8, ep=4, zero=1, grad_dtype="bf16", kept_grad_shards=True, global_batch=8)
    assert float(kept_grad_shard_bytes(plan, rp)) == 2.5e8 + 2e8
    # fp32 gradients: twice that; off, or one optimizer rank (the shard is the bucket itself): none
    assert float(kept_grad_shard_bytes(plan.model_copy(update={"grad_dtype": "fp32"}), rp)) == 9.0e8
    assert float(kept_grad_shard_bytes(plan.model_copy(update={"kept_grad_shards": False}), rp)) == 0.0
    one = ParallelPlan(dp=1, zero=1, grad_dtype="bf16", kept_grad_shards=True, global_batch=8)
    assert float(kept_grad_shard_bytes(one, RankParams(dense=1e9, expert=0.0))) == 0.0


def _llama_70b_dp2(zero: int) -> tuple:
    """(model, plan, memory without kept_grad_shards, with it): Llama 3.1 70B at tp 8, dp 2, full recompute,
    sequence 1024, bf16 gradients, ZeRO stage `zero`."""
    m = builtin_models()["llama-3.1-70b"]
    base = ParallelPlan(tp=8, sp=True, dp=2, zero=zero, grad_dtype="bf16", recompute="full", seq_len=1024,
                        global_batch=16)
    off = training_memory(m, base, 80 * GIB, MemoryAllowance(), nccl_channels=16)
    on = training_memory(m, base.model_copy(update={"kept_grad_shards": True}), 80 * GIB, MemoryAllowance(),
                         nccl_channels=16)
    return m, base, off, on


def test_the_shards_raise_the_after_backward_peak_only_past_the_activations() -> None:
    # Llama 3.1 70B at tp 8, dp 2, full recompute, sequence 1024: the rank's 8.8e9 parameters' bf16 gradient
    # shards (8.8 GB over dp 2) exceed its activations, so the peak after the backward is the states beside the
    # shards: the total rises by the shards less the activations
    m, base, off, on = _llama_70b_dp2(zero=1)
    shards = float(off.params_on_rank) * 2.0 / 2  # bf16 gradients over the two optimizer ranks
    assert shards > float(off.activations)
    assert float(on.total) - float(off.total) == pytest.approx(shards - float(off.activations), rel=1e-9)
    assert float(on.after_backward) == pytest.approx(shards - float(off.activations), rel=1e-9)
    # at micro-batch 8 without recompute the activations dwarf the shards: no change
    big = base.model_copy(update={"recompute": "none", "micro_batch": 8})
    assert float(training_memory(m, big.model_copy(update={"kept_grad_shards": True}), 80 * GIB, MemoryAllowance(),
                                 nccl_channels=16).total) == float(training_memory(m, big, 80 * GIB,
                                                                                   MemoryAllowance(),
                                                                                   nccl_channels=16).total)


@pytest.mark.parametrize("update,applies", [({"zero": 0}, False), ({"zero": 1}, True), ({"zero": 2}, False),
                                            ({"zero": 3}, False),
                                            ({"zero": 1, "grad_reduce": "all-reduce"}, False)])
def test_check_plan_needs_a_reduce_scattering_distributed_optimizer(update, applies) -> None:
    m = builtin_models()["llama-3.1-8b"]
    rules = {v.rule: v.message for v in check_plan(m, ParallelPlan(dp=8, global_batch=8, kept_grad_shards=True,
                                                                   **update))}
    assert ("kept_grad_shards_zero" not in rules) == applies
    if not applies:
        # the fix names both conditions: zero 1 alone does not help a plan that all-reduces at zero 1
        assert "use --zero 1 with --grad-reduce reduce-scatter, or drop --kept-grad-shards" \
            in rules["kept_grad_shards_zero"]


def test_launchers_refuse_it() -> None:
    what, bad, fix = kept_grad_shards_refusal(SimpleNamespace(plan=ParallelPlan(zero=1, kept_grad_shards=True)))
    assert bad and "Apex DistributedFusedAdam" in what and fix == "re-plan with --no-kept-grad-shards"
    assert not kept_grad_shards_refusal(SimpleNamespace(plan=ParallelPlan(zero=1)))[1]


def test_nemo_rows_run_apex_distributed_adam(row_setup) -> None:
    # NeMo-Framework-Launcher 24.07 gpt3/20b.yaml: optim.name distributed_fused_adam, no nccl_ub; TP2, dp 32,
    # bf16 gradient buckets (TWO_BYTE_GRADS): the rank's parameters x 2 B / 32 kept, 0.59 GiB, under its 14.3 GiB
    # of activations, so its peak does not move
    m, cluster, plan = row_setup("nemo2407-pretrain-gpt3-20b-64gpu-gbs256")
    assert plan.kept_grad_shards and plan.optimizer_shard == 32 and plan.grad_bytes == 2.0
    mem = training_memory(m, plan, 80 * GIB, MemoryAllowance(), nccl_channels=16, compute_capability=9.0)
    assert float(mem.params_on_rank) * 2.0 / 32 / GIB == pytest.approx(0.589, abs=0.001)
    assert float(mem.after_backward) == 0.0
    assert "nemo2407" in accuracy.NEMO_APEX_OPTIMIZER


def test_vectorised_search_prices_the_kept_shards_as_the_scalar_estimate() -> None:
    # kept_grad_shards is a workload field: the search's plan arrays carry it (search.grid.WORKLOAD_FIELDS) and
    # price it through the same kept_grad_shard_bytes; at sequence 1024 with bf16 gradients some of the zero 1 / 2
    # plans' peaks are set by the shards (checked below), so a search that dropped them would disagree there
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    m, cluster = builtin_models()["llama-3.1-70b"], ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=2)
    w = Workload(global_batch=64, seq_len=1024, grad_dtype="bf16", kept_grad_shards=True)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    ok = (i for i in range(len(plans)) if plans.plan(i).zero in (1, 2) and not check_plan(m, plans.plan(i), cluster))
    idx = list(islice(ok, 0, 275, 11))
    moved = [i for i in idx if float(estimate_training(m, cluster, plans.plan(i)).memory.total) != float(
        estimate_training(m, cluster, plans.plan(i).model_copy(update={"kept_grad_shards": False})).memory.total)]
    assert len(moved) >= 3
    assert_arrays_agree(m, cluster, plans, idx)


def test_under_zero_2_the_kept_shard_is_the_gradient_shard_already_priced() -> None:
    # Apex's _finish_bucket_grad_sync (distributed_fused_adam.py @f3f049246e) keeps the reduce-scattered shard as
    # grads_shard and drops the full bucket (grads_bucket = None) unless a contiguous gradient buffer holds it:
    # the ZeRO-1 layout (full gradient buffer, priced, beside the kept shard) or the ZeRO-2 one, whose priced
    # gradients are that shard alone (model_state_bytes: grad bytes x parameters / the shards). Under zero 2 the
    # switch adds nothing, so check_plan refuses it there and the pricing leaves it out. Llama 3.1 70B, tp 8, dp 2,
    # full recompute: the shard (8.8 GB) exceeds the activations, so a second copy would show in the peak.
    m, base, off, on = _llama_70b_dp2(zero=2)
    assert float(off.gradients) == pytest.approx(float(off.params_on_rank) * 2.0 / 2, rel=1e-12)  # the shard
    assert float(on.total) == float(off.total)
    assert "kept_grad_shards_zero" in [v.rule for v in check_plan(m, base.model_copy(
        update={"kept_grad_shards": True}))]
KEPT = ("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--global-batch", "64",
        "--kept-grad-shards")


@pytest.mark.parametrize("target,zero", [("megatron", "1"), ("megatron-bridge", "1"), ("deepspeed", "1"),
                                         ("torchrun", "1"), ("slurm", "1")])
def test_every_training_export_refuses_the_flag_in_one_line(cli, tmp_path, target, zero) -> None:
    # the CLI's own path: flag -> plan file -> each export's refusal checks (torchtitan is left out: the switch acts
    # only at zero 1, check_plan kept_grad_shards_zero, which torchtitan refuses first as ZeRO-1;
    # torchrun and slurm wrap the first training target that writes the plan, here none)
    path = tmp_path / "plan.json"
    assert cli(*KEPT, "--zero", zero, "--save", path).code == 0
    assert json.loads(path.read_text())["plan"]["kept_grad_shards"] is True
    msg = cli("export", path, "--to", target, "-o", tmp_path / "out").refusal()
    assert "gradient shards kept to the next zero_grad" in msg and "re-plan with --no-kept-grad-shards" in msg
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_cli_refuses_the_flag_where_it_does_not_act(cli) -> None:
    msg = cli(*KEPT, "--zero", "1", "--grad-reduce", "all-reduce").refusal()
    assert "kept_grad_shards with zero 1, grad_reduce all-reduce" in msg and "--grad-reduce reduce-scatter" in msg
    infer = cli("estimate", "--mode", "infer", "--model", "llama-3.1-8b", "--hardware", "dgx-h100",
                "--kept-grad-shards").refusal()
    assert infer == "error: --kept-grad-shards applies to training, not to --mode infer; drop it"
