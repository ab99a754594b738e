"""Hybrid sharding in `search` (search.hybrid; docs/validation.md#hsdp-search): the tie pool's rows whose ZeRO group
spans more than one NVLink domain are priced with their shard groups kept inside one domain and replicated across
(ParallelPlan.dp_replicate, Megatron-LM num_distributed_optimizer_instances / torchtitan's HSDP), and a variant
that is faster and written by some target takes its row.

The cases run on Jean Zay's A100 partition (hardware_profiles/systems/jean-zay-a100.yaml: 8 GPUs per node on NVLink,
4 x 100 Gb/s Omni-Path links per node (BLOOM, arXiv:2211.05100, Section 3.4.1)), where ZeRO-3 over 8 nodes gathers every
weight over a slow network in each micro-batch: with 8 micro-batches a step (micro-batch 1, 64 data-parallel
ranks, global batch 512) the per-node shard groups move that traffic onto NVLink and, under Megatron-FSDP, leave one gradient
reduction across the nodes a step; with one micro-batch a step (micro-batch 8) there is nothing to amortise and the
replicas' extra traffic loses. PyTorch FSDP2's HSDP (torchtitan) all-reduces across the nodes in every backward
(docs/formulas.md#step.hsdp_outer), so accumulation does not amortise it."""

from __future__ import annotations

from llmplan.search.hybrid import replica_counts
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_systems

JZ = ["search", "--model", "llama-3.1-8b", "--hardware", "jean-zay-a100", "--nodes", "8", "--global-batch", "512",
      "--seq-len", "2048", "--zero", "3", "--no-megatron-fsdp", "--pp", "1", "--tp", "1", "--grad-dtype", "fp32"]
"""ZeRO-3 as FSDP2 (torchtitan writes its HSDP: fp32 gradient reduction, no Megatron-FSDP), tp 1 pp 1."""


def test_replica_counts_keep_a_shard_group_at_least_one_domain_wide():
    gb300 = ClusterSpec(system=builtin_systems()["gb300-nvl72"].with_options(domain_gpus=64), num_nodes=512)  # 2,048 GPUs
    p = ParallelPlan(tp=1, dp=2048, ep=16, zero=3, global_batch=4096)
    # 2,048 GPUs over 32 domains of 64: at most 32 replicas (one domain per shard group), dividing dp and edp 128
    assert replica_counts(p, gb300) == [32, 16, 8, 4]
    assert replica_counts(p.model_copy(update={"zero": 0}), gb300) == []  # nothing sharded
    h100 = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=1)
    assert replica_counts(ParallelPlan(dp=8, zero=3, global_batch=8), h100) == []  # one NVLink domain already
    # tp 8 fills a node: one dp rank per domain, no shard group of two ranks left inside a domain but r < dp
    jz = ClusterSpec(system=builtin_systems()["jean-zay-a100"], num_nodes=16)
    assert replica_counts(ParallelPlan(tp=8, dp=16, zero=1, global_batch=16), jz) == [8, 4, 2]


def test_hybrid_sharding_wins_where_zero3_gathers_cross_the_network_every_micro_batch(cli, tmp_path):
    # Megatron-FSDP: the replicas reduce once a step, in the last micro-batch (docs/formulas.md#step.hsdp_outer)
    mf = [a if a != "--no-megatron-fsdp" else "--megatron-fsdp" for a in JZ]
    r = cli(*mf, "--micro-batch", "1", "--top", "3", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    first = doc["plans"][0]
    # the shard group is one node (8 GPUs, its NVLink domain), replicated over the 8 nodes
    assert first["plan"]["dp_replicate"] == 8, first["plan"]
    h = doc["hybrid_sharding"]
    assert h["first"] is not None and h["first"]["dp_replicate"] == 8
    shown = [t for t in h["tried"] if t["outcome"] == "shown"]
    assert shown and all(t["tokens_per_s"] > t["row_tokens_per_s"] for t in shown)
    assert "megatron" in doc["best_exports_to"]
    one = cli(*mf, "--micro-batch", "1", "--top", "1")  # the same #1 at --top 1, and the line says so
    assert one.code == 0, one.err
    assert "hybrid sharding: #1 runs dp-replicate 8" in one.out


def unreplicated_first_row(cli, micro_batch: str) -> dict:
    """The Jean Zay search at `micro_batch`: #1 keeps one replica, no hybrid-sharding variant is first, and the
    variant tried on #1 without the outer optimizer (returned)."""
    r = cli(*JZ, "--micro-batch", micro_batch, "--top", "1", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["plans"][0]["plan"]["dp_replicate"] == 1
    h = doc["hybrid_sharding"]
    assert h["first"] is None
    row1 = [t for t in h["tried"] if t["rank"] == 1 and not t["dp_outer_optimizer"]]
    assert row1
    return row1[0]


def test_fsdp2_hybrid_sharding_gains_nothing_from_accumulation(cli):
    # FSDP2's HSDP (torchtitan) all-reduces across the replicas in every backward (pytorch/pytorch 002a76fbf
    # _fsdp_param_group.py post_backward -> foreach_reduce with all_reduce_grads True; torchtitan 1fdf90d never
    # turns it off between micro-batches): its cross-node fp32 all-reduce of the 1/8 shard every micro-batch
    # moves about the network bytes ZeRO-3's gathers and reduce-scatter over 64 ranks do, so 8 micro-batches a
    # step leave it no faster than one does, and it does not take #1
    row1 = unreplicated_first_row(cli, "1")
    assert row1["outcome"] != "shown"
    assert row1["tokens_per_s"] < 1.05 * row1["row_tokens_per_s"]


def test_a_torchtitan_hsdp_plan_exports_its_mesh(cli, tmp_path):
    saved = tmp_path / "plan.json"
    r = cli(*JZ, "--micro-batch", "1", "--top", "1", "--dp-replicate", "8", "--save", saved)
    assert r.code == 0, r.err
    out = cli("export", saved, "--to", "torchtitan", "-o", tmp_path / "out")
    assert out.code == 0, out.err
    text = "\n".join(f.read_text() for f in (tmp_path / "out").iterdir() if f.is_file())
    assert "--parallelism.data-parallel-replicate-degree 8" in text  # 8 replicas of 8-rank shard groups
    assert "--parallelism.data-parallel-shard-degree 8" in text


def test_hybrid_sharding_tried_and_loses_at_one_micro_batch_a_step(cli):
    row1 = unreplicated_first_row(cli, "8")
    assert row1["outcome"] == "slower" and row1["tokens_per_s"] < row1["row_tokens_per_s"]


def test_a_named_dp_replicate_is_not_varied(cli):
    r = cli(*JZ, "--micro-batch", "8", "--top", "1", "--dp-replicate", "1", "--json")
    assert r.code == 0, r.err
    assert "hybrid_sharding" not in r.json()
