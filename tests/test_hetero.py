"""Issue 37: training on a cluster of several pools (specs.pools, llmplan.hetero, search.hetero)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmplan.cost.comm import comm_seconds, step_comm
from llmplan.cost.hetero import (
    batch_shares,
    cross_pool_reduce_seconds,
    speed_layout,
    speed_split,
)
from llmplan.cost.step import step_time
from llmplan.errors import PlanViolationError
from llmplan.estimate import estimate_training
from llmplan.hetero import estimate_hetero, layer_seconds, replica_plan, stage_plan
from llmplan.search.grid import Workload, default_space
from llmplan.search.hetero import search_pools
from llmplan.search.run import search as run_search
from llmplan.specs.check import check_pools
from llmplan.specs.layout import balanced_layout
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.pools import HeteroPlan, InterPoolFabric, PoolCluster, PoolSpec
from llmplan.specs.registry import builtin_systems, resolve_model
from llmplan.topology.placement import place

H100_BF16_TFLOPS = 989.0
"""H100 SXM dense BF16 peak (NVIDIA H100 Tensor Core GPU datasheet: 1,979 TFLOPS with sparsity)."""
A100_BF16_TFLOPS = 312.0
"""A100 SXM dense BF16 peak (NVIDIA A100 Tensor Core GPU datasheet: 312 TFLOPS, 624 with sparsity)."""

SYSTEMS = builtin_systems()
FAST = InterPoolFabric(gb_per_s=1e5, latency_s=0.0)
"""A fabric faster than any node's own links: the cross-pool sends cost nothing extra."""


def cluster(*pools: tuple[str, int], fabric: InterPoolFabric | None = None) -> PoolCluster:
    return PoolCluster(pools=tuple(PoolSpec(name=f"{s}-{i}", system=SYSTEMS[s], nodes=n)
                                   for i, (s, n) in enumerate(pools)),
                       fabric=fabric or InterPoolFabric(gb_per_s=50, latency_s=1e-5))


def close(a: float, b: float, rel: float = 1e-9) -> bool:
    return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=0.0)


PLANS = [
    ParallelPlan(tp=8, pp=4, dp=2, sp=True, zero=1, recompute="selective", micro_batch=1, global_batch=64,
                 seq_len=4096),
    ParallelPlan(tp=4, pp=2, dp=8, sp=True, zero=1, micro_batch=1, global_batch=128, seq_len=8192),
    ParallelPlan(tp=8, pp=8, dp=1, sp=True, zero=0, recompute="full", micro_batch=2, global_batch=64, seq_len=4096),
    ParallelPlan(tp=8, pp=1, dp=8, sp=True, zero=3, micro_batch=1, global_batch=64, seq_len=4096),
]
"""Several plans of Llama-3.1-70B on 64 H100 (layouts, recompute, ZeRO stages, no pipeline)."""


# --- degenerate cases: one pool is today's prediction -----------------------------------------------------


@pytest.mark.parametrize("plan", PLANS)
def test_one_pool_gives_the_single_system_estimate(plan):
    m = resolve_model("llama-3.1-70b")
    pc = cluster(("dgx-h100", 8))
    want = estimate_training(m, pc.pools[0].cluster, plan)
    for hp in (HeteroPlan(plan=plan, assignment="stages", stage_pools=(0,) * plan.pp),
               HeteroPlan(plan=plan, assignment="replicas", replica_pools=(plan.dp,),
                          replica_batches=(plan.global_batch,))):
        got = estimate_hetero(m, pc, hp).estimate
        for a, b in ((got.time.total, want.time.total), (got.memory.total, want.memory.total),
                     (got.throughput.tokens_per_s, want.throughput.tokens_per_s), (got.throughput.mfu,
                                                                                  want.throughput.mfu)):
            assert close(a, b), (hp.assignment, a, b)


@pytest.mark.parametrize("plan", [p for p in PLANS if p.pp > 1])
def test_per_stage_pricing_with_one_gpu_everywhere_is_the_single_system_step(plan):
    """The per-stage path of step_time (each stage on its own pool's GPU and links) with every stage on the
    same GPU reproduces the single-system step, to 1e-9, on layouts that differ stage to stage."""
    m = resolve_model("llama-3.1-70b")
    c = ClusterSpec(system=SYSTEMS["dgx-h100"], num_nodes=8)
    laid = plan.model_copy(update={"pp_layout": balanced_layout(m.num_hidden_layers, plan.pp, 1)})
    gpu = c.system.gpu
    secs = comm_seconds(step_comm(m, laid, place(laid.degrees, c), c.system), c.system)
    plain = step_time(m, laid, gpu, secs)
    staged = step_time(m, laid, gpu, secs, ((gpu, secs),) * laid.pp)
    assert close(staged.total, plain.total) and close(staged.bubble, plain.bubble)


@pytest.mark.parametrize("plan", [p for p in PLANS if p.pp > 1])
def test_two_identical_pools_split_by_stages_price_as_one(plan):
    """Stages over two pools of the same system, joined by a fabric faster than the nodes' own: exactly the
    single-system estimate of the same layout (speed split of equal speeds)."""
    m = resolve_model("llama-3.1-70b")
    pc = cluster(("dgx-h100", 4), ("dgx-h100", 4), fabric=FAST)
    half = plan.pp // 2
    hp = stage_plan(m, pc, plan, (0,) * half + (1,) * (plan.pp - half))
    want = estimate_training(m, ClusterSpec(system=SYSTEMS["dgx-h100"], num_nodes=8), hp.plan)
    got = estimate_hetero(m, pc, hp)
    assert close(got.estimate.time.total, want.time.total)
    assert close(got.estimate.memory.total, want.memory.total)
    assert close(got.estimate.throughput.mfu, want.throughput.mfu)


def test_search_on_one_pool_is_the_single_system_search():
    m = resolve_model("llama-3.1-70b")
    pc = cluster(("dgx-h100", 8))
    w = Workload(global_batch=256, seq_len=4096)

    def run(cc):
        return run_search(m, cc, default_space(m, cc, w, {}), w, top=5).ranked

    want = run(pc.pools[0].cluster)
    got = search_pools(m, pc, run).ranked
    assert [close(a.estimate.throughput.tokens_per_s, b.throughput.tokens_per_s) for a, b in zip(got, want)] \
        == [True] * len(want)
    assert got[0].estimate.plan == want[0].plan


# --- the 50/50 H100 + A100 target -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mixed_search():
    m = resolve_model("llama-3.1-70b")
    pc = cluster(("dgx-h100", 8), ("dgx-a100", 8))
    w = Workload(global_batch=1024, seq_len=4096)

    def run(cc):
        return run_search(m, cc, default_space(m, cc, w, {}), w, top=8).ranked

    return m, pc, search_pools(m, pc, run, top=40)


def test_best_mixed_plan_is_at_least_as_fast_as_the_h100_pool_alone(mixed_search):
    _, pc, res = mixed_search
    mixed = [h for h in res.ranked if len(h.pools) > 1]
    assert mixed, "no plan spreads over both pools"
    assert float(mixed[0].estimate.throughput.tokens_per_s) >= res.alone[pc.pools[0].name]
    assert {h.hetero.assignment for h in mixed} == {"stages", "replicas"}


def test_stage_split_puts_layers_in_proportion_to_each_pools_layer_speed():
    """Stages over H100 and A100 get each its share of the pipeline's speed as the model prices one layer on each
    (hetero.layer_seconds), within one layer (the embedding and the loss count one layer's slot each, as
    Megatron's accounting flags); Llama-3.1-70B at TP8 PP8, where memory does not bind. That per-layer speed ratio
    lies between the GPUs' published HBM bandwidth ratio (3.35 / 2.04 TB/s) and their dense BF16 peak ratio
    (989 / 312 TFLOP/s, NVIDIA datasheets): a layer mixes GEMMs, attention, memory-bound ops and TP collectives.
    (It was held to the peak ratio alone until FlashAttention-2, A100's native kernel, took its published rate
    and the H100 clock was refitted: docs/validation.md#attention-clock, #refit; the ratio is now 2.7.)"""
    m = resolve_model("llama-3.1-70b")
    pc = cluster(("dgx-h100", 8), ("dgx-a100", 8))
    plan = ParallelPlan(tp=8, pp=8, dp=2, sp=True, zero=1, recompute="selective", micro_batch=1, global_batch=256,
                        seq_len=8192)
    per_layer = {g: layer_seconds(m, plan, pc.pools[g].system) for g in (0, 1)}
    assert 3.35 / 2.04 < per_layer[1] / per_layer[0] < H100_BF16_TFLOPS / A100_BF16_TFLOPS
    for stages in ((0,) * 4 + (1,) * 4, (1,) * 4 + (0,) * 4, (0,) * 2 + (1,) * 4, (0,) * 4 + (1,) * 2):
        hp = stage_plan(m, pc, plan.model_copy(update={"pp": len(stages)}), stages)
        e = estimate_hetero(m, pc, hp)
        assert e.fits
        speed = {g: 1 / t for g, t in per_layer.items()}
        slots = [n + (i == 0) + (i == len(stages) - 1) for i, n in enumerate(e.estimate.stage_layers)]
        total = sum(speed[g] for g in stages)
        for g, k in zip(stages, slots):
            assert abs(k - sum(slots) * speed[g] / total) <= 1.0, (stages, slots)


def test_best_mixed_stage_split_puts_more_layers_on_h100(mixed_search):
    _, _, res = mixed_search
    best = next(h for h in res.ranked if h.hetero.assignment == "stages" and len(h.pools) > 1)
    stages = best.hetero.stage_pools
    h100 = [n for g, n in zip(stages, best.estimate.stage_layers) if g == 0]
    a100 = [n for g, n in zip(stages, best.estimate.stage_layers) if g == 1]
    assert min(h100) > max(a100)


def test_every_plan_says_which_pool_holds_what(mixed_search):
    _, _, res = mixed_search
    for h in res.ranked:
        p = h.hetero.plan
        assert sum(u.gpus for u in h.pools) == p.num_gpus
        assert all(float(u.memory.total) <= float(u.memory.capacity) for u in h.pools)
        if h.hetero.assignment == "replicas" and len(h.pools) > 1:
            assert sum(u.global_batch for u in h.pools) == p.global_batch
            assert sum(u.replicas for u in h.pools) == p.dp
            assert h.cross_pool_s > 0
        else:
            assert sorted(s for u in h.pools for s in u.stages) == list(range(p.pp))


def test_replicas_share_the_batch_by_speed():
    m = resolve_model("llama-3.1-70b")
    pc = cluster(("dgx-h100", 4), ("dgx-a100", 4))
    plan = ParallelPlan(tp=8, pp=4, dp=2, sp=True, zero=1, micro_batch=1, global_batch=256, seq_len=4096)
    hp = replica_plan(m, pc, plan, (1, 1))
    assert hp is not None and hp.replica_batches is not None
    h100, a100 = hp.replica_batches
    ratio = H100_BF16_TFLOPS / A100_BF16_TFLOPS
    assert 0.6 * ratio < h100 / a100 < 1.2 * ratio  # per-sequence time follows the peak, less the fixed costs
    e = estimate_hetero(m, pc, hp)
    steps = [u.step_s for u in e.pools]
    assert max(steps) / min(steps) < 1.1  # balanced: neither pool waits long for the other


# --- the formulas ------------------------------------------------------------------------------------------


def test_speed_split_by_hand():
    assert speed_split(10, [1.0, 1.0, 2.0]) == (4, 4, 2)
    assert speed_split(9, [1.0, 1.0, 1.0]) == (3, 3, 3)
    assert speed_split(10, [1.0, 1.0, 1.0]) == (4, 3, 3)
    assert speed_split(10, [1.0, 3.0], caps=[6, 10]) == (6, 4)
    with pytest.raises(ValueError):
        speed_split(10, [1.0, 1.0], caps=[3, 3])
    assert speed_layout(4, [1.0, 1.0]) == ("Ett", "ttL")


@given(st.integers(1, 200), st.lists(st.floats(0.1, 10.0), min_size=1, max_size=16))
def test_speed_split_keeps_quota_and_sums(slots, seconds):
    got = speed_split(slots, seconds)
    assert sum(got) == slots
    total = sum(1 / t for t in seconds)
    for k, t in zip(got, seconds):
        assert abs(k - slots / t / total) < 1.0 + 1e-9


@given(st.integers(2, 24), st.lists(st.sampled_from([1.0, 1.5, 2.0, 3.17]), min_size=2, max_size=4))
def test_speed_split_is_the_fastest_quota_split(slots, seconds):
    """Among every split that keeps each stage within one slot of its quota, none has a faster slowest stage
    (brute force over the floor / ceiling choices)."""
    import itertools

    got = speed_split(slots, seconds)
    total = sum(1 / t for t in seconds)
    quota = [slots / t / total for t in seconds]
    options = [sorted({math.floor(q + 1e-9), math.ceil(q - 1e-9)}) for q in quota]
    best = min(max(k * t for k, t in zip(ks, seconds)) for ks in itertools.product(*options) if sum(ks) == slots)
    assert math.isclose(max(k * t for k, t in zip(got, seconds)), best)


@given(st.lists(st.tuples(st.integers(1, 8), st.floats(0.5, 50.0)), min_size=1, max_size=4),
       st.integers(1, 64))
def test_batch_shares_are_whole_micro_batches_summing_to_the_batch(pools, groups):
    units = [u for u, _ in pools]
    speeds = [s for _, s in pools]
    batch = groups * math.lcm(*units) * len(units)
    got = batch_shares(batch, units, speeds)
    if got is not None:
        assert sum(got) == batch and all(b % u == 0 and b > 0 for b, u in zip(got, units))


def test_cross_pool_reduction_by_hand():
    fabric = InterPoolFabric(gb_per_s=50, latency_s=1e-5, efficiency=1.0)
    assert cross_pool_reduce_seconds(8e9, [4], fabric) == 0.0
    # two pools, 4 and 2 replicas: the 2-replica pool's 4 GB shard, 2(P-1)/P = 1 of it over 50 GB/s + 2 latencies
    assert math.isclose(cross_pool_reduce_seconds(8e9, [4, 2], fabric), 4e9 / 50e9 + 2e-5)


# --- rules ---------------------------------------------------------------------------------------------------


def test_rules_keep_groups_inside_pools():
    m = resolve_model("mixtral-8x7b")
    pc = cluster(("dgx-h100", 1), ("dgx-a100", 1))
    plan = ParallelPlan(tp=1, pp=1, dp=16, ep=8, micro_batch=1, global_batch=64, seq_len=4096)
    bad = HeteroPlan(plan=plan, assignment="replicas", replica_pools=(12, 4), replica_batches=(48, 16))
    assert {v.rule for v in check_pools(m, bad, pc)} >= {"pool_ep", "pool_gpus"}
    good = HeteroPlan(plan=plan, assignment="replicas", replica_pools=(8, 8), replica_batches=(40, 24))
    assert check_pools(m, good, pc) == []
    l70 = resolve_model("llama-3.1-70b")
    split = HeteroPlan(plan=ParallelPlan(tp=8, pp=3, global_batch=8, seq_len=4096), assignment="stages",
                       stage_pools=(0, 1, 0))
    assert "pool_stages_consecutive" in {v.rule for v in check_pools(l70, split, cluster(("dgx-h100", 2),
                                                                                       ("dgx-a100", 2)))}
    with pytest.raises(PlanViolationError):
        estimate_hetero(l70, pc, HeteroPlan(plan=ParallelPlan(tp=8, pp=4, global_batch=8, seq_len=4096),
                                            assignment="stages", stage_pools=(0, 0, 1, 1)))


# --- the command line ----------------------------------------------------------------------------------------

GOOD = "pools:\n  - {system: dgx-h100, nodes: 4}\n  - {system: dgx-a100, nodes: 4}\nfabric: {gb_per_s: 50}\n"


@pytest.mark.parametrize("text,words", [
    ("pools: dgx-h100\nfabric: {gb_per_s: 50}\n", "give a list of pools"),
    ("pools:\n  - {system: dgx-h100, nodes: 4}\n  - {system: dgx-a100, nodes: 4}\n", "no fabric between the pools"),
    ("pools:\n  - {system: dgx-h999, nodes: 4}\nfabric: {gb_per_s: 50}\n", "dgx-h999"),
    ("pools:\n  - {system: dgx-h100, nodes: 0}\nfabric: {gb_per_s: 50}\n", "nodes"),
    ("pools:\n  - {system: dgx-h100, nodes: 2}\n  - {system: dgx-h100, nodes: 2}\nfabric: {gb_per_s: 50}\n",
     "more than once"),
    ("pools:\n  - {system: dgx-h100, nodes: 2}\nfabric: {gb_per_s: 0}\n", "gb_per_s"),
    ("pools:\n  - nodes: 2\nfabric: {gb_per_s: 5}\n", "each pool is a mapping with `system`"),
    ("pools:\n  - {system: dgx-h100, nodes: 2, gpus: 3}\nfabric: {gb_per_s: 5}\n", "gpus"),
])
def test_bad_pool_files_exit_2_with_one_line(cli, tmp_path: Path, text, words):
    f = tmp_path / "cluster.yaml"
    f.write_text(text)
    r = cli("search", "--model", "llama-3.1-8b", "--hardware", f)
    lines = r.err.strip().splitlines()
    assert r.code == 2 and len(lines) == 1 and "Traceback" not in r.err, r.err
    assert words in lines[0] and str(f) in lines[0]


def test_ring_share_between_pools_is_bounded_by_line_rate(cli, tmp_path: Path):
    """fabric.allreduce_efficiency is a fraction of gb_per_s, as efficiency: above 1 it is refused in one line
    naming the field and its bound (docs/validation.md#late-mend; before, up to 1.5 passed), and 1 itself passes."""
    f = tmp_path / "cluster.yaml"
    f.write_text(GOOD.replace("{gb_per_s: 50}", "{gb_per_s: 50, allreduce_efficiency: 1.2}"))
    r = cli("search", "--model", "llama-3.1-8b", "--hardware", f)
    lines = r.err.strip().splitlines()
    assert r.code == 2 and len(lines) == 1 and "Traceback" not in r.err, r.err
    assert "allreduce_efficiency" in lines[0] and "less than or equal to 1 " in lines[0] and "1.2" in lines[0], lines[0]
    assert InterPoolFabric(gb_per_s=50, allreduce_efficiency=1.0).allreduce_efficiency == 1.0


def test_pool_file_refused_where_one_system_is_needed(cli, tmp_path: Path):
    f = tmp_path / "cluster.yaml"
    f.write_text(GOOD)
    for args in (("estimate", "--model", "llama-3.1-8b", "--hardware", f),
                 ("search", "--model", "llama-3.1-8b", "--hardware", f, "--nodes", "4"),
                 ("search", "--model", "llama-3.1-8b", "--hardware", f, "--objective", "time-to-train"),
                 ("search", "--model", "llama-3.1-8b", "--hardware", f, "--wide")):
        r = cli(*args)
        lines = r.err.strip().splitlines()
        assert r.code == 2 and len(lines) == 1, (args, r.err)


def test_search_json_says_which_pool_holds_what(cli, tmp_path: Path):
    f = tmp_path / "cluster.yaml"
    f.write_text(GOOD)
    r = cli("search", "--model", "llama-3.1-8b", "--hardware", f, "--json", "--top", "20")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["cluster"]["gpus"] == 64 and [p["system"] for p in doc["cluster"]["pools"]] == ["dgx-h100",
                                                                                                  "dgx-a100"]
    for p in doc["plans"]:
        assert {"plan", "memory", "time", "throughput"} <= set(p)  # the single-system keys stay
        pools = p["pools"]
        assert pools["assignment"] in ("single", "stages", "replicas")
        for u in pools["by_pool"]:
            assert {"name", "system", "gpus", "stages", "replicas", "global_batch", "memory", "time"} <= set(u)
            assert {"step_s", "compute_s"} <= set(u["time"]) and "total" in u["memory"]
    assert any(len(p["pools"]["by_pool"]) > 1 for p in doc["plans"])


# --- export -------------------------------------------------------------------------------------------------


def _save_best(folder: Path, *pins: str) -> Path:
    """`search --save` of Llama-3.1-70B on 4 DGX H100 + 4 DGX A100 (GOOD) with the pins given: the plan file."""
    import contextlib
    import io

    from llmplan.cli import main

    (folder / "cluster.yaml").write_text(GOOD)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # not into the output a test using it reads
            main(["search", "--model", "llama-3.1-70b", "--hardware", str(folder / "cluster.yaml"), *pins,
                  "--save", str(folder / "plan.json"), "--json"])
    except SystemExit as e:
        assert not e.code, f"search {' '.join(pins)} exited {e.code}"
    return folder / "plan.json"


def save_stage_split(folder: Path) -> Path:
    """The best pipeline over both pools, saved: TP8 x PP8 is pinned, 64 GPUs, so no pool alone (32 GPUs) holds
    it and no data-parallel replica fits in one pool: the only plans are stage splits over the H100 and A100
    pools, whatever the cost model ranks between pipelines and replicas (unpinned, a replicas plan can rank
    first and the tests below would check its refusal instead). Also tests/test_export_width.py's pools_plan."""
    import json

    path = _save_best(folder, "--tp", "8", "--pp", "8")
    hp = json.loads(path.read_text())["pools"]["plan"]
    assert hp["assignment"] == "stages" and set(hp["stage_pools"]) == {0, 1}, hp
    return path


@pytest.fixture(scope="module")
def saved_plan(tmp_path_factory):
    return save_stage_split(tmp_path_factory.mktemp("pools"))


@pytest.fixture(scope="module")
def saved_replicas_plan(tmp_path_factory):
    """The best plan with data-parallel replicas on both pools, saved: PP1 is pinned, so no pipeline spreads
    over pools; each pool alone (half the GPUs) ranks well below replicas over both (about 30k vs 40k tok/s as
    priced when this was written)."""
    import json

    path = _save_best(tmp_path_factory.mktemp("replicas"), "--pp", "1")
    hp = json.loads(path.read_text())["pools"]["plan"]
    assert hp["assignment"] == "replicas" and len([r for r in hp["replica_pools"] if r]) == 2, hp
    return path


def test_a_pinned_shape_only_pools_together_hold_is_searched(cli, tmp_path: Path):
    """TP8 x PP8 needs all 64 GPUs: each pool's own search has no plan to rank (too few GPUs), which must not
    end the search over pools; a shape no search can hold still exits 2 with the rule."""
    f = tmp_path / "cluster.yaml"
    f.write_text(GOOD)
    r = cli("search", "--model", "llama-3.1-70b", "--hardware", f, "--tp", "8", "--pp", "8", "--json")
    assert r.code == 0, r.err
    plans = r.json()["plans"]
    assert plans and all(p["pools"]["assignment"] == "stages" and len(p["pools"]["by_pool"]) == 2 for p in plans)
    r = cli("search", "--model", "llama-3.1-70b", "--hardware", f, "--tp", "8", "--pp", "16")
    lines = r.err.strip().splitlines()
    assert r.code == 2 and len(lines) == 1 and "no plan passes the rules" in lines[0], r.err


def test_export_maps_each_pool_to_its_block_of_ranks(cli, saved_plan, tmp_path: Path):
    import json

    doc = json.loads(saved_plan.read_text())
    assert doc["pools"]["plan"]["assignment"] == "stages"
    r = cli("export", saved_plan, "--to", "slurm", "-o", tmp_path)
    assert r.code == 0, r.err
    sbatch = (tmp_path / "job.sbatch").read_text()
    assert sbatch.count("#SBATCH hetjob") == 1 and "srun --het-group=0,1 " in sbatch
    assert "NODE_RANK=$SLURM_PROCID" in sbatch
    assert "--pipeline-model-parallel-layout" in (tmp_path / "megatron_pretrain.sh").read_text()
    rows = (tmp_path / "pool_ranks.csv").read_text().splitlines()[1:]
    plan = doc["plan"]
    width = plan["tp"] * plan["cp"] * plan["dp"]
    ranks = []
    for row in rows:
        _, _, _, first_node, _, first, last, stages, _ = row.split(",")
        ranks += list(range(int(first), int(last) + 1))
        a, b = map(int, stages.split("-"))
        assert int(first) == a * width and int(last) == (b + 1) * width - 1 and int(first_node) * 8 == int(first)
    assert ranks == list(range(plan["tp"] * plan["pp"] * plan["cp"] * plan["dp"]))
    r = cli("export", saved_plan, "--to", "torchrun", "-o", tmp_path / "t")
    assert r.code == 0 and "NODE_RANK=$((FIRST + POOL_NODE))" in (tmp_path / "t" / "torchrun_pools.sh").read_text()
    # every script these exports write (and each --wrap's) passes `bash -n` and fits 80 columns:
    # tests/test_export_width.py::test_every_script_the_cli_writes_passes_bash_n, on this same plan (pools_plan)


@pytest.mark.parametrize("target", ["deepspeed", "torchtitan", "megatron-bridge"])
def test_launchers_that_cannot_run_mixed_pools_refuse_with_the_reason(cli, saved_plan, tmp_path: Path, target):
    r = cli("export", saved_plan, "--to", target, "-o", tmp_path)
    lines = r.err.strip().splitlines()
    assert r.code == 2 and len(lines) == 1 and "pools of different GPUs" in lines[0], r.err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("target", ["megatron", "torchrun", "slurm", "deepspeed", "torchtitan", "megatron-bridge"])
def test_replicas_with_unequal_batches_are_refused_everywhere(cli, saved_replicas_plan, tmp_path: Path, target):
    import json

    hp = json.loads(saved_replicas_plan.read_text())["pools"]["plan"]
    assert len(set(hp["replica_batches"])) > 1  # the H100 replicas take the larger share
    r = cli("export", saved_replicas_plan, "--to", target, "-o", tmp_path / "out")
    lines = r.err.strip().splitlines()
    assert r.code == 2 and len(lines) == 1 and "Traceback" not in r.err, r.err
    assert "different shares of the global batch" in lines[0] and "pools of different GPUs" not in lines[0]
    assert ", ".join(str(b) for b in hp["replica_batches"]) in lines[0]
    assert not (tmp_path / "out").exists()


def test_check_reprices_a_plan_over_pools_over_its_pools(cli, saved_plan, tmp_path: Path):
    """`check` re-prices a saved plan over pools with the pools (a single-system re-estimate on the slowest
    pool would report a regression that is not there)."""
    import json
    import shutil

    folder = tmp_path / "plans"
    folder.mkdir()
    shutil.copy(saved_plan, folder / "plan.json")
    r = cli("check", "--plans", folder, "--format", "json")
    doc = json.loads(r.out)
    finding = next(f for f in doc["checks"] if "plan.json" in f["name"])
    assert finding["ok"], finding
    saved = json.loads(saved_plan.read_text())["predictions"]["time"]["step_s"]
    assert close(finding["details"]["step_s"], saved)


def test_cluster_file_of_one_pool_is_the_single_system_search(cli, tmp_path: Path):
    f = tmp_path / "one.yaml"
    f.write_text("pools:\n  - {system: dgx-h100, nodes: 2}\nfabric: {gb_per_s: 50}\n")
    got = cli("search", "--model", "llama-3.1-8b", "--hardware", f, "--json")
    want = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "2", "--json")
    assert got.code == want.code == 0, got.err
    a, b = got.json()["plans"], want.json()["plans"]
    assert [p["plan"] for p in a] == [p["plan"] for p in b]
    assert all(close(x["time"]["step_s"], y["time"]["step_s"]) and close(x["memory"]["total"], y["memory"]["total"])
               for x, y in zip(a, b))


def test_lock_keeps_a_plan_over_pools_and_report_refuses_it(cli, saved_plan, tmp_path: Path):
    import json
    import shutil

    folder = tmp_path / "plans"
    folder.mkdir()
    shutil.copy(saved_plan, folder / "plan.json")
    assert cli("lock", "--plans", folder).code == 0
    doc = json.loads((folder / "plan.json").read_text())
    assert doc["pools"]["plan"]["assignment"] == "stages" and "hardware_ref" not in doc
    assert close(doc["predictions"]["time"]["step_s"],
                 json.loads(saved_plan.read_text())["predictions"]["time"]["step_s"])
    r = cli("report", folder / "plan.json", "-o", tmp_path / "r.html")
    lines = r.err.strip().splitlines()
    assert r.code == 2 and len(lines) == 1 and "runs over the pools" in lines[0]
    assert not (tmp_path / "r.html").exists()
    # bench would time one system's layer against the file's one-system snapshot of a plan over two pools
    r = cli("bench", "--plan", folder / "plan.json")
    lines = r.err.strip().splitlines()
    assert r.code == 2 and len(lines) == 1 and "bench --plan prices a plan on one system" in lines[0]


def test_export_over_pools_refuses_a_rank_order_without_the_pipeline_outermost(cli, saved_plan, tmp_path: Path):
    """A pool's ranks are one block of nodes only when the pipeline stages are the outermost axis."""
    import json

    doc = json.loads(saved_plan.read_text())
    axes = doc["axis_order"].split("-")
    assert axes[-1] == "pp"
    axes[-2], axes[-1] = axes[-1], axes[-2]  # the pipeline one axis in
    doc["axis_order"] = "-".join(axes)
    f = tmp_path / "order.json"
    f.write_text(json.dumps(doc))
    r = cli("export", f, "--to", "megatron", "-o", tmp_path / "out")
    lines = r.err.strip().splitlines()
    assert r.code == 2 and len(lines) == 1 and "Traceback" not in r.err, r.err
    assert "does not put the pipeline stages outermost" in lines[0] and "--axis-order" in lines[0]


def test_export_over_pools_to_torchrun_needs_the_megatron_wrap(cli, saved_plan, tmp_path: Path):
    r = cli("export", saved_plan, "--to", "torchrun", "--wrap", "torchtitan", "-o", tmp_path / "out")
    lines = r.err.strip().splitlines()
    assert r.code == 2 and len(lines) == 1 and "Traceback" not in r.err, r.err
    assert "pools of different GPUs" in lines[0] and "--wrap megatron" in lines[0]


def test_a_saved_plan_with_a_negative_pool_index_exits_2_naming_it(cli, saved_plan, tmp_path: Path):
    import json

    doc = json.loads(saved_plan.read_text())
    pools = doc["pools"]["plan"]["stage_pools"]
    doc["pools"]["plan"]["stage_pools"] = [-1] + pools[1:]
    f = tmp_path / "negative.json"
    f.write_text(json.dumps(doc))
    r = cli("export", f, "--to", "megatron", "-o", tmp_path / "out")
    lines = r.err.strip().splitlines()
    assert r.code == 2 and len(lines) == 1 and "Traceback" not in r.err, r.err
    assert "stage_pools [-1" in lines[0] and "0 or more" in lines[0]


def test_a_pool_where_nothing_fits_alone_says_so(cli, tmp_path):
    # Llama-3.1-70B on 2 DGX H100 + 2 DGX A100: neither pool alone holds a plan; the line read
    # "alone: dgx-h100 0 tok/s, a100 0 tok/s", a throughput of zero rather than no plan.
    f = tmp_path / "cluster.yaml"
    f.write_text("pools:\n  - {system: dgx-h100, nodes: 2}\n  - {system: dgx-a100, nodes: 2, name: a100}\n"
                 "fabric: {gb_per_s: 50, latency_s: 1.0e-5}\n")
    r = cli("search", "--model", "llama-3.1-70b", "--hardware", f, "--top", "1")
    assert r.code == 0, r.err
    assert "alone: dgx-h100 no plan fits, a100 no plan fits" in " ".join(r.out.split())
    assert "0 tok/s" not in r.out


def test_the_cross_pool_reduction_takes_a_set_ring_share():
    """The inter-pool fabric's ring all-reduce share follows the scale-out rule (topology.collectives.ring_share,
    docs/validation.md#ar-mend): allreduce_efficiency where the cluster file sets it, else efficiency. Before, the
    reduction between pools priced every fabric at `efficiency`. Two pools of 4 and 2 replicas: 4 GB over
    50 GB/s x 0.9 = 45 GB/s, 2(P-1)/P = 1, plus 2 latencies."""
    from llmplan.topology.collectives import ring_share

    set_ = InterPoolFabric(gb_per_s=50, latency_s=1e-5, efficiency=0.75, allreduce_efficiency=0.9)
    assert math.isclose(cross_pool_reduce_seconds(8e9, [4, 2], set_), 4e9 / 45e9 + 2e-5)
    unset = InterPoolFabric(gb_per_s=50, latency_s=1e-5, efficiency=0.75)
    assert math.isclose(cross_pool_reduce_seconds(8e9, [4, 2], unset), 4e9 / 37.5e9 + 2e-5)
    assert ring_share(None, 0.75) == 0.75 and ring_share(0.9, 0.75) == 0.9


def test_cross_pool_reduction_sends_the_bf16_copy_under_grad_reduce_dtype():
    """grad_reduce_dtype bf16 (DeepSpeed's BF16_Optimizer, engine.py allreduce_bucket at 56c522386: the fp32
    gradients cast to bf16 for the all-reduce) sends 2 bytes an element between pools as inside them, not the
    fp32 gradients' 4 (comm.reduce_wire_bytes); tolerance 1e-9."""
    from llmplan.cost.hetero import cross_pool_reduce_seconds

    m = resolve_model("gpt-1.7b")
    pc = cluster(("dgx-h100", 1), ("dgx-a100", 1))
    bf16_opt = dict(tp=1, pp=1, dp=16, zero=1, grad_dtype="fp32", grad_reduce="all-reduce",
                    grad_accumulation="cast-add", overlap_grad_reduce=False, micro_batch=1, global_batch=64,
                    seq_len=2048)
    for reduce_dtype, wire in (("bf16", 2.0), ("grad_dtype", 4.0)):
        plan = ParallelPlan(**bf16_opt, grad_reduce_dtype=reduce_dtype)
        hp = HeteroPlan(plan=plan, assignment="replicas", replica_pools=(8, 8), replica_batches=(32, 32))
        got = estimate_hetero(m, pc, hp)
        params = float(got.estimate.memory.params_on_rank)
        assert got.cross_pool_s > 0
        assert close(got.cross_pool_s, cross_pool_reduce_seconds(params * wire, [8, 8], pc.fabric)), reduce_dtype
