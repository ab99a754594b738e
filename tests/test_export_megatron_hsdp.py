"""Megatron-FSDP hybrid sharding (HSDP: ParallelPlan.dp_replicate, dp_outer_optimizer) exported to Megatron-LM and
Megatron-Bridge (export.megatron.fsdp_pairs / outer_dp_strategy, export.bridge.fsdp_overrides).

Read at NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553 (the parser recorded in
tests/data/launchers/megatron-lm.json): megatron/training/arguments.py `--num-distributed-optimizer-instances`
(int, default 1) and `--outer-dp-sharding-strategy` (choices no_shard, optim; "The "optim" option is only supported
when --data-parallel-sharding-strategy is "optim_grads_params""); megatron/core/distributed/fsdp/
mcore_fsdp_adapter.py _init_dist_index: `enable_hsdp = self.ddp_config.num_distributed_optimizer_instances > 1`,
the shard group the partial (intra-instance) DP x CP group, the outer group the inter-instance one;
megatron_fsdp/param_and_grad_buffer.py raises NotImplementedError "[Megatron-FSDP] Optimizer fully-sharded HFSDP is
only supported with full-sharding on DP-Shard." for outer "optim" without optim_grads_params. Megatron-Bridge
067f987d perf_recipes/deepseek/gb300/deepseek_v3.py deepseek_v3_pretrain_128gpu_gb300_fp8mx_hsdp_config sets
cfg.ddp.outer_dp_sharding_strategy = "optim" and cfg.ddp.num_distributed_optimizer_instances = 4 (the fields of
Megatron-Core's DistributedDataParallelConfig, recorded in tests/data/launchers/megatron-bridge.json)."""

from __future__ import annotations

import dataclasses

import pytest

from llmplan.export import render_all
from llmplan.export.common import CannotExpress
from llmplan.export.megatron import fsdp_zero2_refusals
from llmplan.planfile import load_plan
from tests.test_export import parse_megatron
from tests.test_export_bridge import PLANS, SCRIPT, assert_recorded_fields_of_their_type, hydra_applied, overrides

HSDP = {"zero": 3, "pp": 1, "vpp": 1, "dp": 8, "megatron_fsdp": True, "overlap_param_gather": True,
        "dp_replicate": 2}
"""llama-3.1-70b tp 8 x dp 8 (tests/data/plans/dense_train.json) as Megatron-FSDP ZeRO-3 in 2 replicas of 4."""


def hsdp_plan(**changes):
    pf = load_plan(PLANS / "dense_train.json")
    return dataclasses.replace(pf, plan=pf.plan.model_copy(update={**HSDP, **changes}))


@pytest.mark.parametrize("outer", [True, False])
def test_megatron_writes_the_instances_and_the_outer_strategy(outer):
    files = render_all(hsdp_plan(dp_outer_optimizer=outer), "megatron")[0]
    ns, _ = parse_megatron(files["megatron_pretrain.sh"])  # every flag parses with d98e8a6's own parser
    assert ns.use_megatron_fsdp and ns.data_parallel_sharding_strategy == "optim_grads_params"
    assert ns.num_distributed_optimizer_instances == "2"
    assert ns.outer_dp_sharding_strategy == ("optim" if outer else "no_shard")


def test_megatron_writes_no_outer_strategy_without_replicas():
    ns, _ = parse_megatron(render_all(hsdp_plan(dp_replicate=1), "megatron")[0]["megatron_pretrain.sh"])
    assert ns.outer_dp_sharding_strategy is None and ns.num_distributed_optimizer_instances is None


def test_zero2_hsdp_replicates_the_optimizer():
    # optim_grads with no_shard outer: param_and_grad_buffer.py guards only the outer "optim" strategy
    ns, _ = parse_megatron(render_all(hsdp_plan(zero=2), "megatron")[0]["megatron_pretrain.sh"])
    assert (ns.data_parallel_sharding_strategy, ns.outer_dp_sharding_strategy) == ("optim_grads", "no_shard")


def test_the_outer_optimizer_below_zero3_is_refused_with_megatron_fsdps_own_words():
    # check_plan's dp_outer_optimizer rule refuses this plan before any export; the export's rule says why too
    what, has, fix = fsdp_zero2_refusals(hsdp_plan(zero=2, dp_outer_optimizer=True))["hybrid"]
    assert has and "Optimizer fully-sharded HFSDP is only supported with full-sharding on DP-Shard" in what
    assert "--zero 3" in fix
    assert not fsdp_zero2_refusals(hsdp_plan(dp_outer_optimizer=True))["hybrid"][1]


@pytest.mark.parametrize("as_dataclass", [True, False])
@pytest.mark.parametrize("outer", [True, False])
def test_bridge_writes_the_ddp_fields(outer, as_dataclass):
    args = overrides(render_all(hsdp_plan(dp_outer_optimizer=outer), "megatron-bridge")[0][SCRIPT])
    assert_recorded_fields_of_their_type(args)
    assert "ddp.num_distributed_optimizer_instances=2" in args
    assert f"ddp.outer_dp_sharding_strategy={'optim' if outer else 'no_shard'}" in args
    ddp = hydra_applied(args, as_dataclass)["ddp"]
    assert ddp["use_megatron_fsdp"] and ddp["data_parallel_sharding_strategy"] == "optim_grads_params"
    assert ddp["num_distributed_optimizer_instances"] == 2
    assert ddp["outer_dp_sharding_strategy"] == ("optim" if outer else "no_shard")


def test_bridge_refuses_the_outer_optimizer_below_zero3():
    with pytest.raises(CannotExpress, match="Optimizer fully-sharded HFSDP"):
        render_all(hsdp_plan(zero=2, dp_outer_optimizer=True), "megatron-bridge")


JZ = ["search", "--model", "llama-3.1-8b", "--hardware", "jean-zay-a100", "--nodes", "8", "--global-batch", "512",
      "--seq-len", "2048", "--zero", "3", "--megatron-fsdp", "--pp", "1", "--tp", "1", "--grad-dtype", "fp32",
      "--micro-batch", "1", "--top", "1"]
"""tests/test_hsdp_search.py's winning case (ZeRO-3 over 8 Omni-Path nodes, 8 micro-batches a step) as Megatron-FSDP:
before this export wrote HSDP, its optimizer-across variant was "not exported" and #1 stayed plain ZeRO-3."""


def test_an_untargeted_search_whose_first_is_megatron_fsdp_hsdp_exports_to_megatron(cli, tmp_path):
    saved = tmp_path / "plan.json"
    r = cli(*JZ, "--json", "--save", saved)
    assert r.code == 0, r.err
    doc = r.json()
    first = doc["plans"][0]["plan"]
    assert (first["megatron_fsdp"], first["dp_replicate"], first["dp_outer_optimizer"]) == (True, 8, True)
    assert doc["hybrid_sharding"]["first"] == {"dp_replicate": 8, "dp_outer_optimizer": True}
    assert {"megatron", "megatron-bridge"} <= set(doc["best_exports_to"])
    out = cli("export", saved, "--to", "megatron", "-o", tmp_path / "out")
    assert out.code == 0, out.err
    ns, _ = parse_megatron((tmp_path / "out" / "megatron_pretrain.sh").read_text())
    assert ns.use_megatron_fsdp and ns.data_parallel_sharding_strategy == "optim_grads_params"
    assert (ns.num_distributed_optimizer_instances, ns.outer_dp_sharding_strategy) == ("8", "optim")
