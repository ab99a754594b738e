"""Cluster graph, rank placement, collective cost and per-axis communication volume."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.comm import dp_step_calls, dp_transfers, pp_transfers, step_comm, tp_transfers, transfer_seconds
from llmplan.cost.params import rank_params
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.topology.collectives import bus_factor, collective_coeffs, collective_time, group_links
from llmplan.topology.graph import build_graph
from llmplan.topology.placement import place, rank_grid, span_of_ranks
from llmplan.units import GIB

SYS = builtin_systems()
M = builtin_models()


def span(system: str, n: int, per_node: int | None = None):
    s = SYS[system]
    per_node = per_node or min(n, s.gpus_per_node)
    return span_of_ranks(list(range(n)), ClusterSpec(system=s, num_nodes=n // per_node, gpus_per_node=per_node))


# nccl-tests busbw measurements in ml-engineering network/README.md (nccl-tests / all_reduce_bench busbw, large messages). Tolerance 15% (issue #3).
NCCL_MEASURED = [
    ("dgx-a100", 8, "all-reduce", 16 * GIB, True, 234.9),
    ("dgx-h200", 8, "all-reduce", 16 * GIB, True, 482.3),
    ("dgx-h200", 8, "all-reduce", 16 * GIB, False, 367.6),
    ("dgx-h200", 8, "all-gather", 16 * GIB, True, 361.4),
    ("dgx-h200", 8, "reduce-scatter", 16 * GIB, True, 362.9),
    ("dgx-b200", 8, "all-reduce", 8 * GIB, True, 838.0),
    ("dgx-b200", 8, "all-reduce", 8 * GIB, False, 682.2),
    ("dgx-b200", 32, "all-reduce", 16 * GIB, True, 381.8),  # 4 nodes, 8 x 400 Gb/s per node
    ("mi300x-8", 8, "all-reduce", 4 * GIB, True, 312.9),
    ("mi300x-8", 2, "all-reduce", 4 * GIB, True, 47.7),
]


@pytest.mark.parametrize("system,n,op,size,nvls,busbw", NCCL_MEASURED)
def test_busbw_matches_nccl_tests(system, n, op, size, nvls, busbw):
    ct = collective_time(op, size, span(system, n), SYS[system], nvls=nvls)
    assert ct.busbw / 1e9 == pytest.approx(busbw, rel=0.15)


def test_ring_allreduce_volume_is_hand_derived():
    """Ring all-reduce of S over n ranks sends 2(n-1)/n·S per rank; all-gather/reduce-scatter (n-1)/n·S."""
    for n in (2, 4, 8, 64):
        assert bus_factor("all-reduce", n) == pytest.approx(2 * (n - 1) / n)
        assert bus_factor("all-gather", n) == bus_factor("reduce-scatter", n) == pytest.approx((n - 1) / n)
    assert bus_factor("all-reduce", 1) == 0


def test_tp_volume_per_step():
    """TP without SP: 4 all-reduces of 2sbh bytes per layer and micro-batch (6 with full recompute); with SP the
    boundary tensor is already split and Megatron re-gathers the saved shards. Pipeline scatter/gather's gathers
    (off by default, Megatron-Core's behaviour) are tested in test_pp_scatter_gather_volume."""
    m = M["llama-3.1-70b"]
    plan = ParallelPlan(tp=8, pp=4, dp=2, global_batch=16, seq_len=4096, sp=False)
    spans = place(plan.degrees, ClusterSpec(system=SYS["dgx-h100"], num_nodes=8))
    s, b, h, L, mbs, t = 4096, 1, 8192, 80 // 4, 8, 8
    expected = mbs * L * 4 * (2 * (t - 1) / t) * (2 * s * b * h)
    assert sum(x.bytes for x in tp_transfers(m, plan, spans["tp"])) == pytest.approx(expected)
    flat = plan.model_copy(update={"pp": 1, "dp": 8})  # no pipeline (2 micro-batches, 80 layers)
    assert sum(x.bytes for x in tp_transfers(m, flat, spans["tp"])) == pytest.approx(
        2 * 80 * 4 * (2 * (t - 1) / t) * (2 * s * b * h))
    sp_plan = plan.model_copy(update={"sp": True})
    regather = mbs * L * 2 * ((t - 1) / t) * (2 * s * b * h)  # Megatron re-gathers the 2 saved shards in backward
    assert sum(x.bytes for x in tp_transfers(m, sp_plan, spans["tp"])) == pytest.approx(expected + regather)
    full = plan.model_copy(update={"recompute": "full"})
    assert sum(x.bytes for x in tp_transfers(m, full, spans["tp"])) == pytest.approx(expected * 6 / 4)


def test_dp_volume_per_step():
    """ZeRO-0: all-reduce of the gradients (fp32: 4 B/param); ZeRO-1: reduce-scatter + all-gather (bf16)."""
    m = M["llama-3.1-8b"]
    cluster = ClusterSpec(system=SYS["dgx-h100"], num_nodes=2)
    plan = ParallelPlan(tp=2, dp=8, global_batch=8)
    spans = place(plan.degrees, cluster)
    P, n = rank_params(m, plan, 0).dense, 8
    zero0 = sum(x.bytes for x in dp_transfers(m, plan, spans["dpcp"], spans["edp"]))
    assert zero0 == pytest.approx(4 * P * 2 * (n - 1) / n)
    z1 = plan.model_copy(update={"zero": 1})
    zero1 = sum(x.bytes for x in dp_transfers(m, z1, spans["dpcp"], spans["edp"]))
    assert zero1 == pytest.approx((4 * P + 2 * P) * (n - 1) / n)
    # DeepSpeed's BF16_Optimizer under its pipeline engine: all-reduce of the fp32 gradients, then the gather
    # (microsoft/DeepSpeed runtime/pipe/engine.py _bf16_reduce_grads; bf16_optimizer.py update_lp_params)
    # (its pipeline engine reduces and gathers after the last backward, beside no compute: no overlap, no buckets)
    whole = plan.model_copy(update={"zero": 1, "grad_reduce": "all-reduce", "overlap_grad_reduce": False,
                                    "overlap_param_gather": False})
    calls = {x.collective: x.calls for x in dp_transfers(m, whole, spans["dpcp"], spans["edp"])[:3]}
    assert calls == {"all-reduce": 1, "reduce-scatter": 0, "all-gather": 1}
    zero1_whole = sum(x.bytes for x in dp_transfers(m, whole, spans["dpcp"], spans["edp"]))
    assert zero1_whole == pytest.approx((2 * 4 * P + 2 * P) * (n - 1) / n)


def test_grad_reduce_all_reduce_needs_zero_below_2():
    with pytest.raises(ValueError, match="ZeRO-2/3 keep only their gradient shard"):
        ParallelPlan(tp=2, dp=8, global_batch=8, zero=2, grad_reduce="all-reduce")


def test_zero3_under_a_pipeline_gathers_and_reduces_once_per_step():
    """ZeRO-3 alone: 2 all-gathers and 1 reduce-scatter per micro-batch; under a pipeline the stage stays
    gathered and its gradients unsharded until the last micro-batch (PyTorch pipelining with FSDP2), so one
    of each per step, as ZeRO-1."""
    m = M["llama-3.1-8b"]
    cluster = ClusterSpec(system=SYS["dgx-h100"], num_nodes=2)
    for pp, gathers, reduces in ((1, 2 * 4, 4), (2, 1, 1)):
        plan = ParallelPlan(tp=2, pp=pp, dp=8 // pp, zero=3, micro_batch=1, global_batch=4 * (8 // pp))
        assert plan.num_microbatches == 4
        spans = place(plan.degrees, cluster)
        calls = {x.collective: x.calls for x in dp_transfers(m, plan, spans["dpcp"], spans["edp"])[:3]}
        assert (calls["all-gather"], calls["reduce-scatter"], calls["all-reduce"]) == (gathers, reduces, 0)


def test_tp8_stays_on_nvlink_tp16_crosses_nics():
    m = M["llama-3.1-70b"]
    cluster = ClusterSpec(system=SYS["dgx-h100"], num_nodes=4)
    tp8 = ParallelPlan(tp=8, dp=4, global_batch=4)
    tp16 = ParallelPlan(tp=16, dp=2, global_batch=2)
    s8, s16 = place(tp8.degrees, cluster)["tp"], place(tp16.degrees, cluster)["tp"]
    assert not s8.uses_nic and s8.nodes == 1 and s8.gpus_per_nic == 0
    assert s16.uses_nic and s16.nodes == 2 and s16.per_node == 8
    S = 64 * 1024**2
    t16 = collective_time("all-reduce", S, s16, SYS["dgx-h100"])
    t8 = collective_time("all-reduce", S, s8, SYS["dgx-h100"])
    assert t8.algorithm == "nvls" and t16.algorithm in ("hierarchical", "tree")
    assert t16.seconds > 1.2 * t8.seconds
    c8 = step_comm(m, tp8, place(tp8.degrees, cluster), SYS["dgx-h100"]).axes["tp"]
    c16 = step_comm(m, tp16, place(tp16.degrees, cluster), SYS["dgx-h100"]).axes["tp"]
    assert c16.seconds > c8.seconds


def test_megatron_rank_order():
    """tp innermost (contiguous ranks), then cp, dp, pp outermost."""
    plan = ParallelPlan(tp=2, cp=2, dp=2, pp=2, global_batch=2)
    grid = rank_grid(plan.degrees)
    assert grid["tp"][0].tolist() == [0, 1]
    assert grid["cp"][0].tolist() == [0, 2]
    assert grid["dp"][0].tolist() == [0, 4]
    assert grid["pp"][0].tolist() == [0, 8]
    assert sorted(grid["dpcp"][0].tolist()) == [0, 2, 4, 6]
    other = rank_grid(plan.degrees, ("dp", "tp", "cp", "pp"))
    assert other["dp"][0].tolist() == [0, 1] and other["tp"][0].tolist() == [0, 2]


def test_pcie_box_is_bounded_by_pcie():
    """8 x L40S has no NVLink: an 8-GPU all-reduce runs at the PCIe rate x ring efficiency."""
    s = SYS["l40s-8"]
    ct = collective_time("all-reduce", GIB, span("l40s-8", 8), s)
    assert ct.busbw == pytest.approx(31.5e9 * s.ring_efficiency, rel=0.02)
    assert ct.busbw < 0.1 * collective_time("all-reduce", GIB, span("dgx-h100", 8), SYS["dgx-h100"]).busbw


def test_nvl72_domain_spans_trays_without_nics():
    s = SYS["gb200-nvl72"]
    sp72 = span_of_ranks(list(range(72)), ClusterSpec(system=s, num_nodes=18))
    assert sp72.nodes == 18 and not sp72.uses_nic
    sp144 = span_of_ranks(list(range(144)), ClusterSpec(system=s, num_nodes=36))
    assert sp144.uses_nic and sp144.domains == 2


def test_oversubscribed_spine_costs_more():
    base = SYS["dgx-h100"]
    tight = base.model_copy(update={"oversubscription": 2.0})
    n_nodes = 64  # two leaf groups of 32 nodes
    cluster = ClusterSpec(system=base, num_nodes=n_nodes)
    sp = span_of_ranks(list(range(0, 8 * n_nodes, 8)), cluster)  # one GPU per node, crosses the spine
    assert sp.leaves == 2
    t1 = collective_time("all-reduce", GIB, sp, base).seconds
    t2 = collective_time("all-reduce", GIB, sp, tight).seconds
    assert t2 > 1.8 * t1


def test_graph_edges_carry_bandwidth_and_latency():
    g = build_graph(SYS["dgx-h100"], 2)
    for _, _, e in g.edges(data=True):
        assert e["bw"] > 0 and e["latency"] >= 0 and e["sharers"] >= 1


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(SYS)), st.sampled_from(["all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                                                      "send-recv", "broadcast"]),
       st.integers(1, 6), st.floats(1e3, 1e10), st.floats(1.01, 10))
def test_time_is_monotone_in_size(system, op, nodes, size, factor):
    s = SYS[system]
    sp = span_of_ranks(list(range(nodes * s.gpus_per_node)), ClusterSpec(system=s, num_nodes=nodes))
    assert collective_time(op, size * factor, sp, s).seconds >= collective_time(op, size, sp, s).seconds


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.sampled_from(["all-gather", "reduce-scatter"]), st.integers(48, 280), st.integers(2, 4),
       st.floats(2e5, 8e6), st.floats(1.5, 8.0))
def test_ring_busbw_is_set_by_the_per_rank_chunk(op, nodes, mult, chunk, shrink):
    """NCCL's ring moves S/N a step and pays a latency a step (tuning.cc), so at 48-1,120 DGX A100 nodes the bus
    bandwidth follows the per-rank chunk, not N, and falls as the chunk shrinks. docs/validation.md#zero3-2021
    (per-rank chunk size): the ZeRO-3 rows would need a 46 GB/s plateau, which no chunk curve gives."""
    s = SYS["dgx-a100"]

    def busbw(n_nodes: int, c: float) -> float:
        n = n_nodes * s.gpus_per_node
        sp = span_of_ranks(list(range(n)), ClusterSpec(system=s, num_nodes=n_nodes))
        return collective_time(op, c * n, sp, s).busbw

    assert busbw(nodes * mult, chunk) == pytest.approx(busbw(nodes, chunk), rel=0.01)
    assert busbw(nodes, chunk / shrink) < busbw(nodes, chunk)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["dgx-a100", "dgx-h100", "dgx-b200", "mi300x-8", "dgx-h800"]),
       st.integers(2, 64), st.floats(1e3, 1e10), st.sampled_from(["all-reduce", "all-gather", "reduce-scatter"]))
def test_hierarchical_never_slower_than_flat_ring(system, nodes, size, op):
    s = SYS[system]
    sp = span_of_ranks(list(range(nodes * s.gpus_per_node)), ClusterSpec(system=s, num_nodes=nodes))
    hier = collective_time(op, size, sp, s, algorithm="hierarchical").seconds
    ring = collective_time(op, size, sp, s, algorithm="ring").seconds
    assert hier <= ring * (1 + 1e-9)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(M)), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]))
def test_axis_of_size_one_sends_nothing(name, nodes, pp):
    m = M[name]
    if m.num_hidden_layers % pp:
        pp = 1
    cluster = ClusterSpec(system=SYS["dgx-h100"], num_nodes=nodes)
    plan = ParallelPlan(tp=1, pp=pp, dp=8 * nodes // pp, global_batch=8 * nodes // pp, seq_len=1024)
    comm = step_comm(m, plan, place(plan.degrees, cluster), SYS["dgx-h100"])
    for axis in ("tp", "cp", "ep") + (("pp",) if pp == 1 else ()):
        assert comm.axes[axis].bytes == 0 and comm.axes[axis].seconds == 0
    assert comm.bytes == pytest.approx(sum(a.bytes for a in comm.axes.values()))


CLUSTER_OK = "base: dgx-h100\nnics_per_node: 4\noversubscription: 2.0\n"


@pytest.mark.parametrize("text,needle", [
    ("base: mi300x-8\nintra_node_links: [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6]]\n",
     "GPU 7 of node 0 is not connected to GPU 0"),
    ("base: dgx-h100\nnic_gbit_per_s: 0\n", "nic_gbit_per_s"),
    ("base: dgx-h100\nintra_node_gb_per_s: 0\n", "field 'intra_node_gb_per_s': Input should be greater than 0"),
    ("base: dgx-h100\ngpus_per_node: 16\n", "gpus_per_node (16) exceeds the 8 GPU slots of a dgx-h100 node"),
    ("base: dgx-h100\nintra_node_links: [[0, 9]]\n", "intra_node_links pair (0, 9)"),
    ("base: dgx-h1000\n", "unknown base system 'dgx-h1000'"),
    ("base: dgx-h100\ngpus_per_node: 16\ngpu:\n  step_overhead_s: 0.1\n",
     "gpus_per_node (16) exceeds the 8 GPU slots of a dgx-h100 node"),
    ("base: dgx-h100\ngpu:\n  sustained_clock_fraction: 1.5\n",
     "field 'gpu.sustained_clock_fraction': Input should be less than or equal to 1"),
])
def test_bad_cluster_yaml_exits_2(cli, tmp_path, text, needle):
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    r = cli("collective", "--hardware", path, "--gpus", "16")
    assert r.code == 2, r.out
    assert needle in r.err and "Traceback" not in r.err


@pytest.mark.parametrize("text,fix", [
    ("base: dgx-h1000\n", "base takes the name of a built-in system only"),
    ("base: dgx-h100\ngpu: h1000\n", "or write the GPU's fields inline as a mapping under gpu:"),
])
def test_unknown_name_in_cluster_yaml_offers_what_the_key_takes(cli, tmp_path, text, fix):
    # A file's `base:` and `gpu:` keys take a built-in name (or, for gpu, an inline mapping), never a path:
    # the refusal must not suggest one.
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    line = cli("collective", "--hardware", path, "--gpus", "16").refusal()
    assert fix in line and "give a path" not in line and str(path) in line


def test_cluster_yaml_with_fewer_nics(cli, tmp_path):
    path = tmp_path / "half-nics.yaml"
    path.write_text(CLUSTER_OK)
    full = cli("collective", "--hardware", "dgx-h100", "--gpus", "16", "--size", "4GiB", "--json").json()
    half = cli("collective", "--hardware", path, "--gpus", "16", "--size", "4GiB", "--json").json()
    # 2 nodes: NCCL's tree puts S/g on each GPU's NIC (tuning.cc: bwIntra at nNodes <= 2). Full NICs leave it
    # NVLink-bound (2(g-1)/g S over 450 GB/s x 0.80); half the NICs (25 GB/s a GPU x 0.925) make the network
    # pace it: 1 / (8 x 25e9 x 0.925) against 1.75 / 360e9, 1.112x (latencies are microseconds of ~20 ms).
    assert half["time_s"] / full["time_s"] == pytest.approx((1 / (8 * 25e9 * 0.925)) / (1.75 / 360e9), rel=0.01)


def test_cluster_yaml_overrides_keys_of_its_base_gpu(cli, tmp_path):
    # `gpu:` without a name under `base:` changes only the keys it gives: a fleet that measured its H100s
    # sustaining 0.8 of the peak instead of the fitted fraction predicts a compute-bound plan slower by about
    # that ratio, and keeps the base GPU otherwise.
    from llmplan.specs.registry import builtin_systems, load_system_file

    path = tmp_path / "my-h100.yaml"
    path.write_text("base: dgx-h100\ngpu:\n  sustained_clock_fraction: 0.8\n")
    mine, base = load_system_file(path).gpu, builtin_systems()["dgx-h100"].gpu
    assert mine.sustained_clock_fraction == 0.8
    assert mine.model_copy(update={"sustained_clock_fraction": base.sustained_clock_fraction}) == base
    args = ("estimate", "--model", "llama-3.1-8b", "--tp", "1", "--dp", "8", "--zero", "2", "--json")
    slow = cli(*args, "--hardware", path).json()["throughput"]["mfu"]
    fast = cli(*args, "--hardware", "dgx-h100").json()["throughput"]["mfu"]
    assert 1.02 < fast / slow < base.sustained_clock_fraction / 0.8


def test_collective_cli_json(cli):
    r = cli("collective", "--op", "all-reduce", "--size", "1GiB", "--gpus", "16", "--hardware", "dgx-h100", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert set(doc) >= {"time_s", "algbw_gbps", "busbw_gbps"}
    assert doc["busbw_gbps"] == pytest.approx(doc["algbw_gbps"] * 2 * 15 / 16)
    assert "over 2 nodes" in doc["group"]
    r = cli("collective", "--op", "all-reduce", "--size", "1GiB", "--gpus", "8", "--hardware", "dgx-h100")
    assert "busbw" in r.out


@pytest.mark.parametrize("system", ["dgx-h100", "dgx-b200", "mi300x-8"])
def test_two_node_ring_stripes_its_channels_over_every_nic_of_the_node(cli, system):
    # NCCL builds one ring per channel and each ring leaves the node through a different GPU's NIC, so the data
    # of a 2-node ring all-reduce crosses on all of a node's NICs (NVIDIA/nccl issues #43 and #601; Hu et al.
    # 2025, "Demystifying NCCL"): its busbw is bounded by the node's aggregate NIC rate x its all-reduce share and by
    # the per-GPU scale-up rate, not by one NIC (37.5 GB/s on dgx-h100 before the fix).
    s = SYS[system]
    n = 2 * s.gpus_per_node
    r = cli("collective", "--op", "all-reduce", "--size", "4GiB", "--gpus", str(n), "--hardware", system,
            "--algorithm", "ring", "--json")
    assert r.code == 0, r.err
    busbw = r.json()["busbw_gbps"] * 1e9
    one_nic = s.nic_bytes_per_s * (s.allreduce_nic_efficiency or s.nic_efficiency)  # the all-reduce share
    node_nics = s.nics_per_node * one_nic
    assert busbw <= node_nics * (1 + 1e-9)
    assert busbw > 4 * one_nic
    # at 4 GiB the ring's 2(n-1) network latencies are under 1% of the time: it runs at the slower bound
    scale_up = collective_time("all-reduce", 4 * GIB, span(system, s.gpus_per_node), s, nvls=False).busbw
    assert busbw == pytest.approx(min(node_nics, scale_up), rel=0.01)


@pytest.mark.parametrize("args,needle", [
    (["--op", "all-reduse", "--hardware", "dgx-h100"], "--op all-reduse is not a collective"),
    (["--size", "12 parsecs", "--hardware", "dgx-h100"], "size '12 parsecs' is not a positive size"),
    (["--gpus", "12", "--gpus-per-node", "8", "--hardware", "dgx-h100"], "must be a multiple of --gpus-per-node"),
    (["--gpus", "2", "--gpus-per-node", "2", "--hardware", "dgx-h100", "--algorithm", "magic"], "--algorithm magic"),
])
def test_collective_bad_input(cli, args, needle):
    r = cli("collective", *args)
    assert r.code == 2 and needle in r.err


def test_estimate_has_comm_part(cli):
    r = cli("estimate", "--model", "mixtral-8x7b", "--hardware", "dgx-h100", "--nodes", "4", "--tp", "2",
            "--ep", "8", "--etp", "1", "--cp", "2", "--seq-len", "8192", "--global-batch", "32", "--json")
    assert r.code == 0, r.err
    comm = r.json()["comm"]
    # an MoE model adds the router's auxiliary-loss token counts (docs/formulas.md#comm.aux_loss_counts):
    # Mixtral's aux_loss all-reduces them over the tp x cp group (4 ranks here)
    assert set(comm) == {"tp", "pp", "dp", "cp", "ep", "router"}
    for axis in ("tp", "dp", "cp", "ep", "router"):
        assert comm[axis]["bytes"] > 0 and comm[axis]["seconds"] > 0, axis
    assert comm["pp"]["bytes"] == 0
    assert comm["ep"]["collective"] == "all-to-all"
    assert comm["router"]["collective"] == "all-reduce" and comm["router"]["transfers"][0]["group_size"] == 4
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--axis-order", "tp-pp")
    assert r.code == 2 and "axis order 'tp-pp'" in r.err


def test_pp_scatter_gather_volume():
    """Pipeline scatter/gather without SP (Narayanan et al. 2021 §4.1): each TP rank sends 2sbh/t per
    micro-batch and direction instead of 2sbh, and the receiving stage all-gathers the 2sbh over TP (2 per
    micro-batch); with SP the sends are already split and the switch adds nothing."""
    m = M["llama-3.1-70b"]
    plan = ParallelPlan(tp=8, pp=4, dp=2, global_batch=16, seq_len=4096, sp=False)
    spans = place(plan.degrees, ClusterSpec(system=SYS["dgx-a100"], num_nodes=8))
    s, b, h, mbs, t = 4096, 1, 8192, 8, 8
    whole = [(x.calls, x.message) for x in pp_transfers(m, plan, spans["pp"])]
    assert whole == [(2 * mbs, 2 * s * b * h)]
    sg = plan.model_copy(update={"pp_scatter_gather": True})
    assert [(x.calls, x.message) for x in pp_transfers(m, sg, spans["pp"])] == [(2 * mbs, 2 * s * b * h / t)]
    added = sum(x.bytes for x in tp_transfers(m, sg, spans["tp"])) - sum(x.bytes for x in tp_transfers(m, plan, spans["tp"]))
    assert added == pytest.approx(2 * mbs * (t - 1) / t * (2 * s * b * h))
    sp = plan.model_copy(update={"sp": True})
    for f, g in ((pp_transfers, "pp"), (tp_transfers, "tp")):
        assert (sum(x.bytes for x in f(m, sp.model_copy(update={"pp_scatter_gather": True}), spans[g]))
                == sum(x.bytes for x in f(m, sp, spans[g])))
    # one stage's slice crosses its own network card: the send over InfiniBand takes about 1/t of the time
    pp_s = {p.pp_scatter_gather: step_comm(m, p, spans, SYS["dgx-a100"]).axes["pp"].seconds for p in (plan, sg)}
    assert pp_s[True] < pp_s[False] / 4


def test_stack_generation_switches_on_the_cli(cli):
    """--pp-scatter-gather and --no-tp-backward-overlap reach the plan (JSON keys) and the comm breakdown: the
    pipeline sends shrink t-fold, the TP axis gains the receivers' all-gathers."""
    args = ("estimate", "--model", "gpt3-175b", "--hardware", "dgx-a100", "--nodes", "16", "--tp", "8", "--pp", "8",
            "--no-sp", "--recompute", "full", "--global-batch", "512", "--seq-len", "2048", "--json")
    base, new = cli(*args), cli(*args, "--pp-scatter-gather", "--no-tp-backward-overlap")
    assert base.code == 0 and new.code == 0, new.err
    assert (base.json()["plan"]["pp_scatter_gather"], new.json()["plan"]["pp_scatter_gather"]) == (False, True)
    assert new.json()["plan"]["tp_backward_overlap"] is False
    assert new.json()["comm"]["pp"]["bytes"] == pytest.approx(base.json()["comm"]["pp"]["bytes"] / 8)
    assert new.json()["comm"]["tp"]["bytes"] > base.json()["comm"]["tp"]["bytes"]


def test_more_nics_than_gpus_gives_each_gpu_its_nics(cli, tmp_path):
    # AWS p5en: 16 x 200 Gb/s EFA for 8 H200 (two NICs per GPU, 3,200 Gb/s a node). Each GPU owns two NICs on
    # its rail, so 16 x 200 Gb/s carries what 8 x 400 Gb/s does; it used to divide by zero (0 GPUs per rail).
    from llmplan.topology.graph import path_share

    dgx = builtin_systems()["dgx-h100"]
    p5 = dgx.model_copy(update={"name": "p5en-like", "nics_per_node": 16, "nic_gbit_per_s": 200})
    for system in (dgx, p5):
        g = build_graph(system, 2)
        assert path_share(g, ("gpu", 0, 0), ("gpu", 1, 0)).bw > 0
    g8, g16 = build_graph(dgx, 2), build_graph(p5, 2)
    assert path_share(g16, ("gpu", 0, 3), ("gpu", 1, 3)).bw == pytest.approx(
        path_share(g8, ("gpu", 0, 3), ("gpu", 1, 3)).bw)
    path = tmp_path / "p5en.yaml"
    path.write_text("base: dgx-h100\nname: p5en-like\nnics_per_node: 16\nnic_gbit_per_s: 200\n")
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", path, "--nodes", "2", "--dp", "16")
    assert r.code == 0, r.err


def test_dp_reduction_pays_one_ring_latency_per_bucket():
    """Megatron-Core cuts the first model chunk's gradients into buckets of max(40M, 1M x dp) parameters when it
    overlaps, one NCCL call each (training.py get_model, bucket_size; later chunks one bucket, disable_bucketing),
    and issues one call per chunk without the overlap: the same bytes, one ring latency per call
    (docs/formulas.md#comm.dp_bucket)."""
    m = M["llama-3.1-70b"]
    cluster = ClusterSpec(system=SYS["dgx-h100"], num_nodes=48)
    plan = ParallelPlan(tp=8, dp=48, zero=1, global_batch=48)
    spans = place(plan.degrees, cluster)
    P = rank_params(m, plan, 0).dense
    bucket = max(40e6, 1e6 * 48)
    sync = plan.model_copy(update={"overlap_grad_reduce": False, "overlap_param_gather": False})
    rs = {p: next(x for x in dp_transfers(m, p, spans["dpcp"], spans["edp"]) if x.collective == "reduce-scatter")
          for p in (plan, sync)}
    assert rs[plan].calls == math.ceil(P / bucket) > 100 and rs[sync].calls == 1
    assert rs[plan].bytes == pytest.approx(rs[sync].bytes)  # the same bytes, in more calls
    alpha = min(collective_coeffs("reduce-scatter", spans["dpcp"], SYS["dgx-h100"]),
                key=lambda c: c.seconds(rs[plan].message)).alpha
    hop = group_links(SYS["dgx-h100"], spans["dpcp"]).inter_alpha  # 48 nodes span two leaves: via the spine
    assert alpha == pytest.approx(47 * hop)  # one GPU per node in the ring: 47 network steps
    extra = transfer_seconds(rs[plan], SYS["dgx-h100"]) - transfer_seconds(rs[sync], SYS["dgx-h100"])
    assert extra == pytest.approx((rs[plan].calls - 1) * alpha)
    # interleaved over v chunks: the first chunk in buckets, each later one a call of its own
    inter = ParallelPlan(tp=8, pp=2, vpp=5, dp=24, zero=1, global_batch=48)
    params = rank_params(m, inter, 0).dense
    calls = dp_step_calls(inter, params, True)
    assert calls == math.ceil(params / 5 / max(40e6, 24e6)) + 4
    assert dp_step_calls(inter, params, False) == 5


# NVIDIA GTC 2025 session S72583 (NCCL), slides 12-13, "NCCL Tests ... Bus Bandwidth in GB/s, 32 GPUs" on DGX H100
# (NVLink 4 + 8 x 400 Gb/s RDMA): Alltoall 48, Allreduce without SHARP 370 (reproduced in stas00/ml-engineering at
# 744d01e1, network/images/all-to-all-bw-2025.png and all-reduce-bw-2025.png). Message size and NCCL version are not
# given on the slides; taken as the large-message rate. docs/validation.md#h100-ib-rates.
H100_IB_PUBLISHED = [
    ("all-to-all", 4 * GIB, 48.0, 0.05),  # the reading that sets dgx-h100's nic_efficiency (0.743 of 50 GB/s)
    ("all-reduce", 16 * GIB, 370.0, 0.10),  # NVLink-bound at 4 nodes in both the slide and comm.collective
]


@pytest.mark.parametrize("op,size,busbw,tol", H100_IB_PUBLISHED)
def test_dgx_h100_four_nodes_against_nvidias_published_nccl_tests(op, size, busbw, tol):
    ct = collective_time(op, size, span("dgx-h100", 32), SYS["dgx-h100"])
    assert ct.busbw / 1e9 == pytest.approx(busbw, rel=tol)


def test_dgx_h100_alltoall_reading_by_hand():
    """nccl-tests' alltoall busbw is algbw (n-1)/n (NVIDIA/nccl-tests issue 130); (n-g)/n of a GPU's send buffer
    leaves the node, so 48 GB/s at n = 32, g = 8 puts 48 (32/31)(24/32) = 37.2 GB/s a GPU on the NIC, 0.74 of the
    CX7's 400 Gb/s; the profile's nic_efficiency is that reading to two places."""
    n, g, nic = 32, 8, 400e9 / 8
    share = 48e9 * n / (n - 1) * (n - g) / n / nic
    assert share == pytest.approx(0.743, abs=0.001)
    assert SYS["dgx-h100"].nic_efficiency == pytest.approx(share, abs=0.01)


# Published DGX H100 all-reduce busbw at 16 GiB over many nodes (8 GPUs and 8 x 400 Gb/s NDR a node), both flat:
# Fernandez et al. 2024 (arXiv 2411.13055), "NCCL Tests Scaling Performance", 4 to 512 nodes, ~355 at 4 and ~345
# at 512 (read off the plot, +-10 GB/s; reproduced in stas00/ml-engineering at 744d01e1,
# network/images/nccl-all-reduce-scan.png); NVIDIA GTC 2024 S62129 slide 35, ALGO=NVLSTree, 32 to 8,192 GPUs,
# ~365-380 at every size (ml-engineering network/images/nccl-all-reduce-scan-nvlstree.png). None of these readings
# sets a constant (dgx-h100's all-reduce share is the 32-GPU 370 of GTC 2025 S72583). docs/validation.md#ar-shape.
AR_SCALE_PUBLISHED = [(4, 355.0), (512, 345.0), (1024, 370.0)]


@pytest.mark.parametrize("nodes,busbw", AR_SCALE_PUBLISHED)
def test_dgx_h100_allreduce_over_many_nodes_against_published_curves(nodes, busbw):
    ct = collective_time("all-reduce", 16 * GIB, span("dgx-h100", 8 * nodes), SYS["dgx-h100"])
    assert ct.busbw / 1e9 == pytest.approx(busbw, rel=0.10)  # +-10 GB/s plot reading and the 345-380 spread


def test_dgx_h100_allreduce_busbw_does_not_fall_with_the_node_count():
    """Both published curves stay within ~6% from 4 to 512 (1,024) nodes; the hierarchical form's 2(k-1)/k of S/g
    on each NIC ran 387 -> 300 GB/s (-22%) before NCCL's ring / tree traffic replaced it."""
    bw = [collective_time("all-reduce", 16 * GIB, span("dgx-h100", 8 * k), SYS["dgx-h100"]).busbw
          for k in (4, 8, 16, 32, 64, 128, 256, 512)]
    assert max(bw) / min(bw) < 1.06


def test_allreduce_across_nodes_prices_nccls_ring_and_tree_by_hand():
    """Per byte of buffer, NCCL's ring puts 2(n-1)/n / g on each GPU's NIC and its double binary tree 2 / g for
    k > 2 (S/g at k = 2; tuning.cc v2.21.5-1: tree algbw = busBw x .5, bwIntra at nNodes <= 2); the hierarchical
    form's 2(k-1)/k / g is priced only when asked for."""
    s = SYS["dgx-h100"]
    B = s.nic_bytes_per_s * s.allreduce_nic_efficiency  # one GPU's NIC (one NIC a GPU on dgx-h100)
    for k in (2, 3, 16):
        sp = span("dgx-h100", 8 * k)
        c = {x.algorithm: x for x in collective_coeffs("all-reduce", sp, s)}
        assert set(c) == {"ring", "tree"}
        assert c["ring"].beta == pytest.approx(2 * (8 * k - 1) / (8 * k) / (8 * B))
        nvlink = 2 * 7 / 8 / (s.intra_node_bytes_per_s * s.ring_efficiency)  # the intra-node phases
        assert c["tree"].beta == pytest.approx(max((1 if k == 2 else 2) / 8 / B, nvlink))
        (h,) = collective_coeffs("all-reduce", sp, s, "hierarchical")
        assert h.algorithm == "hierarchical"
        assert h.beta == pytest.approx(max(2 * (k - 1) / k / 8 / B, nvlink))


# Multi-node ring all-gather / reduce-scatter against the all-reduce on the same hardware
# (docs/validation.md#ar-readings). Readings, 4 nodes x 8 H100 each:
# - Voltage Park / AI@GT benchmark suite (aigatech/vpbenchmarking README, NCCL 2.24.3+cuda12.6, 4 bare-metal nodes,
#   8 x H100 SXM5 a node, "3.2 Tbps InfiniBand"): AllReduce 330.93, AllGather 323.53 GB/s busbw over 32 GPUs, so
#   all-gather / all-reduce = 0.978 on one cluster (the NIC count cancels). Tolerance 5%: two single readings.
# - NVIDIA/nccl issue #1229 (2024-03-16, an H100 cluster): reduce-scatter busbw 360 GB/s at 4 nodes (size and
#   NCCL version not stated). Tolerance 5% (the reading is given to two figures).
VP_ALLGATHER_OVER_ALLREDUCE = 323.53 / 330.93


def test_ring_allgather_across_nodes_reaches_the_allreduce_busbw_on_the_same_hardware():
    """NCCL prices every ring collective at busBw = nChannels x bwInter (v2.21.5-1 tuning.cc), and the one
    published same-cluster pair agrees (0.978): the ring all-gather rides the all-reduce's NIC share. At
    nic_efficiency (0.75, the all-to-all's share) it came out 0.83 of the all-reduce on dgx-h100."""
    ag = collective_time("all-gather", 16 * GIB, span("dgx-h100", 32), SYS["dgx-h100"])
    ar = collective_time("all-reduce", 16 * GIB, span("dgx-h100", 32), SYS["dgx-h100"])
    assert ag.busbw / ar.busbw == pytest.approx(VP_ALLGATHER_OVER_ALLREDUCE, rel=0.05)


def test_dgx_h100_reduce_scatter_over_4_nodes_against_nccl_issue_1229():
    rs = collective_time("reduce-scatter", 16 * GIB, span("dgx-h100", 32), SYS["dgx-h100"])
    assert rs.algorithm == "ring"
    assert rs.busbw / 1e9 == pytest.approx(360.0, rel=0.05)  # 299 at nic_efficiency 0.75


def test_dgx_a100_40gb_allreduce_over_4_nodes_against_nvidias_reading():
    """DGX A100 (8 x 200 Gb/s HDR): 192 GB/s all-reduce busbw, NVIDIA GTC 2025 S72583 slide 12 (32 GPUs) and
    NVIDIA's NCCL maintainer in NVIDIA/nccl issue #812 ("we measure 192GB/s AllReduce BusBW"); the 40 GB DGX A100
    has the same network. Tolerance 5% (one reading)."""
    ar = collective_time("all-reduce", 16 * GIB, span("dgx-a100-40gb", 32), SYS["dgx-a100-40gb"])
    assert ar.busbw / 1e9 == pytest.approx(192.0, rel=0.05)  # 150 at nic_efficiency 0.75
