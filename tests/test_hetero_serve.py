"""Issue 37: serving on a cluster of several pools (search.hetero_serve): prefill and decode on pools of their
own, and co-located replicas of different shapes on different pools sized to one SLO and request rate."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmplan.cost.hetero import cross_pool_kv_seconds
from llmplan.search.disagg import search_disaggregated
from llmplan.search.hetero_serve import (
    INTER_POOL,
    rate_shares,
    search_colocated_pools,
    search_disaggregated_pools,
)
from llmplan.search.serve import search_serving
from llmplan.specs.pools import InterPoolFabric, PoolCluster, PoolSpec
from llmplan.specs.registry import builtin_systems, resolve_model
from llmplan.specs.serve import ServeJob

SYSTEMS = builtin_systems()
FABRIC = InterPoolFabric(gb_per_s=50, latency_s=1e-5)
JOB = ServeJob(input_len=2048, output_len=256, batch=256, tpot_slo_s=0.05, ttft_slo_s=2.0)


def cluster(*pools: tuple[str, int], fabric: InterPoolFabric = FABRIC) -> PoolCluster:
    return PoolCluster(pools=tuple(PoolSpec(name=f"{s}-{i}", system=SYSTEMS[s], nodes=n)
                                   for i, (s, n) in enumerate(pools)), fabric=fabric)


def layout(pool) -> tuple:
    p = pool.estimate.plan
    return (p.tp, p.ep, p.dp, p.dp_attention, p.redundant_experts, pool.instances, pool.estimate.job.batch)


# --- degenerate cases: one pool is today's search ---------------------------------------------------------


@pytest.mark.parametrize("model,system,nodes,rate", [
    ("llama-3.1-70b", "dgx-h100", 2, None),
    ("llama-3.1-70b", "dgx-h100", 2, 6.0),
    ("llama-3.1-8b", "dgx-a100", 1, None),
    ("mixtral-8x7b", "dgx-h100", 2, None),
])
def test_one_pool_disaggregated_is_the_single_system_search(model, system, nodes, rate):
    m = resolve_model(model)
    pc = cluster((system, nodes))
    job = JOB.model_copy(update={"request_rate": rate})
    want = search_disaggregated(m, pc.pools[0].cluster, job, "bf16", "bf16", 10, rate)
    got = search_disaggregated_pools(m, pc, job, "bf16", "bf16", 10, rate)
    assert want.plans, "the case must have splits to compare"
    assert len(got.plans) == len(want.plans) and got.considered == want.considered
    for g, w in zip(got.plans, want.plans):
        assert (g.prefill_pool, g.decode_pool) == (0, 0)
        s = g.split
        assert layout(s.prefill) == layout(w.prefill) and layout(s.decode) == layout(w.decode)
        assert s.kv_link == w.kv_link
        for a, b in ((s.requests_per_s, w.requests_per_s), (s.kv_seconds, w.kv_seconds), (s.ttft_s, w.ttft_s),
                     (s.tpot_s, w.tpot_s), (s.kv_bytes_per_request, w.kv_bytes_per_request)):
            assert a == pytest.approx(b, rel=1e-9, abs=0)


@pytest.mark.parametrize("model,system,nodes", [("llama-3.1-70b", "dgx-h100", 2), ("llama-3.1-8b", "dgx-a100", 1)])
def test_one_pool_colocated_is_the_single_system_search(model, system, nodes):
    m = resolve_model(model)
    pc = cluster((system, nodes))
    want = search_serving(m, pc.pools[0].cluster, JOB, "bf16", "bf16").ranked[0]
    got = search_colocated_pools(m, pc, JOB, "bf16", "bf16")
    (share,) = got.shares
    assert share.estimate.plan == want.plan and share.estimate.job == want.job
    assert got.tokens_per_s == pytest.approx(want.tokens_per_s, rel=1e-9, abs=0)


def test_a_one_pool_file_gives_exactly_the_system_s_json(cli, tmp_path: Path):
    f = tmp_path / "one.yaml"
    f.write_text("pools:\n  - {system: dgx-h100, nodes: 2}\nfabric: {gb_per_s: 50}\n")
    base = ("search", "--mode", "infer", "--model", "llama-3.1-70b", "--tpot-slo", "0.05", "--json")
    for extra in ((), ("--disaggregated",), ("--objective", "min-gpus", "--request-rate", "3")):
        a = cli(*base, *extra, "--hardware", f)
        b = cli(*base, *extra, "--hardware", "dgx-h100", "--nodes", "2")
        assert a.code == b.code == 0, (extra, a.err, b.err)
        da, db = a.json(), b.json()
        da.pop("search_s"), db.pop("search_s")
        assert da == db, extra


# --- prefill on H100, decode on A100 -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def h100_a100():
    m = resolve_model("llama-3.1-70b")
    pc = cluster(("dgx-h100", 1), ("dgx-a100", 1))
    return m, pc, search_disaggregated_pools(m, pc, JOB, "bf16", "bf16", top=1000)


def test_h100_prefill_a100_decode_sustains_the_better_single_pool_s_rate(h100_a100):
    """The split over both pools sustains at least the request rate of the better pool serving both phases
    alone. Not a tautology: the split's rate is the smaller of H100 prefill and A100 decode (each on its own
    pool), against the best P:D of one pool; it holds because an A100 node decodes more requests/s than one
    pool's best P:D split serves end to end. "Same GPUs" is read as the cluster's GPUs: all 16 GPUs of one type
    would be a different cluster."""
    m, pc, res = h100_a100
    alone = max(x.max_requests_per_s for x in res.plans if x.prefill_pool == x.decode_pool)
    cross = [x for x in res.plans if (x.prefill_pool, x.decode_pool) == (0, 1)]
    assert cross, "no H100-prefill / A100-decode split meets the SLOs"
    assert max(x.max_requests_per_s for x in cross) >= alone
    # and sized to that rate, the search over pools serves it with an H100-prefill / A100-decode split
    job = JOB.model_copy(update={"request_rate": alone})
    sized = search_disaggregated_pools(m, pc, job, "bf16", "bf16", top=1000, request_rate=alone)
    assert any((x.prefill_pool, x.decode_pool) == (0, 1) for x in sized.plans)


def test_each_phase_stays_on_its_pool_and_the_kv_crosses_the_fabric(h100_a100):
    _, pc, res = h100_a100
    for x in res.plans:
        s = x.split
        assert s.prefill.estimate.cluster.system == pc.pools[x.prefill_pool].system
        assert s.decode.estimate.cluster.system == pc.pools[x.decode_pool].system
        if x.prefill_pool == x.decode_pool:
            assert s.gpus <= pc.pools[x.prefill_pool].num_gpus and s.kv_link != INTER_POOL
        else:
            assert s.prefill.gpus <= pc.pools[x.prefill_pool].num_gpus
            assert s.decode.gpus <= pc.pools[x.decode_pool].num_gpus
            assert s.kv_link == INTER_POOL
        assert s.ttft_s <= JOB.ttft_slo_s and s.tpot_s <= JOB.tpot_slo_s  # type: ignore[operator]


def test_cross_pool_kv_transfer_of_llama_70b_from_its_published_shape():
    """Llama-3.1-70B (meta-llama/Llama-3.1-70B config.json: 80 layers, 8 KV heads, head dim 128): a bf16 K and V
    per layer per token is 2 x 80 x 8 x 128 x 2 B = 327,680 B; 2,048 prompt tokens are 640 MiB. From a TP2
    prefill instance each of 2 ranks sends half over 50 GB/s x 0.75 per GPU, plus 10 us: 8.96 ms."""
    size = 2 * 80 * 8 * 128 * 2 * 2048
    assert cross_pool_kv_seconds(size, 2, FABRIC) == pytest.approx(size / 2 / 37.5e9 + 1e-5, rel=1e-12)
    assert size / 2**20 == 640


@given(gb=st.floats(1, 400), lat=st.floats(0, 1e-3), shards=st.integers(1, 8))
def test_kv_transfer_is_slower_over_a_thinner_fabric(gb, lat, shards):
    thin = InterPoolFabric(gb_per_s=gb, latency_s=lat)
    thick = InterPoolFabric(gb_per_s=gb * 2, latency_s=lat)
    assert cross_pool_kv_seconds(1e9, shards, thin) > cross_pool_kv_seconds(1e9, shards, thick) >= lat


# --- co-located replicas of different shapes -----------------------------------------------------------------


@given(rate=st.floats(0.01, 1e4), caps=st.lists(st.floats(0.1, 1e3), min_size=1, max_size=6))
def test_rate_shares_sum_to_the_rate_and_load_every_pool_alike(rate, caps):
    shares = rate_shares(rate, caps)
    assert math.isclose(sum(shares), rate, rel_tol=1e-9)
    loads = [s / c for s, c in zip(shares, caps)]
    assert max(loads) - min(loads) <= 1e-9 * max(loads)


def test_colocated_over_pools_sizes_each_pool_to_its_share():
    m = resolve_model("llama-3.1-70b")
    pc = cluster(("dgx-h100", 1), ("dgx-a100", 1))
    full = search_colocated_pools(m, pc, JOB, "bf16", "bf16")
    assert len(full.shares) == 2
    assert full.shares[0].estimate.cluster.system.gpu.name != full.shares[1].estimate.cluster.system.gpu.name
    rate = full.capacity_requests_per_s / 2
    half = search_colocated_pools(m, pc, JOB.model_copy(update={"request_rate": rate}), "bf16", "bf16", rate)
    assert sum(s.requests_per_s for s in half.shares) == pytest.approx(rate, rel=1e-9)
    for s in half.shares:
        per_replica = s.estimate.tokens_per_s / s.estimate.plan.dp / s.estimate.job.output_len
        assert s.estimate.plan.dp * per_replica >= s.requests_per_s * (1 - 1e-9)  # enough replicas for the share
        assert s.estimate.memory.fits and float(s.estimate.timing.tpot) <= JOB.tpot_slo_s  # type: ignore[operator]
    over = search_colocated_pools(m, pc, JOB, "bf16", "bf16", full.capacity_requests_per_s * 1.01)
    assert not over.shares


# --- the command line ----------------------------------------------------------------------------------------

TWO = "pools:\n  - {system: dgx-h100, nodes: 1, name: h100}\n  - {system: dgx-a100, nodes: 1}\nfabric: {gb_per_s: 50}\n"
BASE = ("search", "--mode", "infer", "--model", "llama-3.1-70b", "--tpot-slo", "0.05", "--ttft-slo", "2")


def test_disaggregated_json_says_which_pool_holds_each_phase(cli, tmp_path: Path):
    f = tmp_path / "c.yaml"
    f.write_text(TWO)
    r = cli(*BASE, "--disaggregated", "--hardware", f, "--json", "--top", "50")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["gpus"] == 16 and [p["name"] for p in doc["cluster"]["pools"]] == ["h100", "dgx-a100"]
    for p in doc["plans"]:
        assert {"prefill", "decode", "kv_transfer", "pd_ratio", "requests_per_s", "ttft_s", "tpot_s"} <= set(p)
        for phase in ("prefill", "decode"):
            assert {"pool", "pool_index", "system", "tp", "instances", "gpus"} <= set(p[phase])
        apart = p["prefill"]["pool"] != p["decode"]["pool"]
        assert p["kv_transfer"]["crosses_pools"] == apart and (p["kv_transfer"]["link"] == INTER_POOL) == apart
    assert any(p["kv_transfer"]["crosses_pools"] for p in doc["plans"])
    assert doc["winner"] in ("disaggregated", "co-located") and doc["colocated"]["by_pool"]
    text = cli(*BASE, "--disaggregated", "--hardware", f)
    assert text.code == 0 and max(len(x) for x in text.out.splitlines()) <= 80 and "dgx-a100 tp" in text.out


def test_colocated_json_per_pool(cli, tmp_path: Path):
    f = tmp_path / "c.yaml"
    f.write_text(TWO)
    r = cli(*BASE, "--hardware", f, "--json", "--request-rate", "4")
    assert r.code == 0, r.err
    doc = r.json()
    assert [u["pool"] for u in doc["by_pool"]] == ["h100", "dgx-a100"]
    assert sum(u["requests_per_s"] for u in doc["by_pool"]) == pytest.approx(4, rel=1e-9)
    for u in doc["by_pool"]:
        assert {"plan", "memory", "tpot_s"} <= set(u["estimate"]) and u["replicas"] >= 1
    text = cli(*BASE, "--hardware", f, "--request-rate", "4")
    assert text.code == 0 and max(len(x) for x in text.out.splitlines()) <= 80


@pytest.mark.parametrize("extra,words", [
    (("--nodes", "2"), "drop --nodes"),
    (("--objective", "min-gpus"), "drop --objective"),
    (("--disaggregated", "--tp", "2"), "drop the pins"),
    (("--save", "PLAN"), "--save"),
    (("--request-rate", "-1"), "request"),
])
def test_bad_serving_options_over_pools_exit_2_with_one_line(cli, tmp_path: Path, extra, words):
    f = tmp_path / "c.yaml"
    f.write_text(TWO)
    extra = tuple(str(tmp_path / "p.json") if x == "PLAN" else x for x in extra)
    assert words in cli(*BASE, "--hardware", f, *extra).refusal()


def test_a_rate_beyond_the_pools_exits_3_saying_what_they_sustain(cli, tmp_path: Path):
    f = tmp_path / "c.yaml"
    f.write_text(TWO)
    r = cli(*BASE, "--hardware", f, "--request-rate", "1000")
    assert "sustain" in r.refusal(code=3)
