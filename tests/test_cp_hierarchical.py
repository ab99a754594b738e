"""Transformer Engine's hierarchical a2a+p2p context parallelism (ParallelPlan.cp_comm_type a2a+p2p, cp_a2a_size):
what it sends and over which ranks, how much is exposed, its buffers, what check_plan refuses (one line, exit 2),
that the vectorised search prices it as the scalar estimate does, where the search tries it, and how the exports
say it (docs/formulas.md#comm.cp_hierarchical).

Sources: NVIDIA/TransformerEngine@d0067d0 transformer_engine/pytorch/attention/dot_product_attention/
context_parallel.py (AttnFuncWithCPAndKVP2P with cp_group = [cp_group_a2a, cp_group]: flash_attn_a2a_communicate of
[q, k, v] and out over the a2a group, the K/V ring over the other; attn_forward_func_with_cp: sliding windows only
with a2a / all_gather, a non-vanilla softmax only with a2a); NVIDIA/Megatron-LM@d98e8a6 megatron/core/parallel_state.py
(create_hierarchical_groups: level 0 consecutive ranks of the CP group), megatron/training/arguments.py
(context_parallel_size == prod(hierarchical_context_parallel_sizes)), tests/functional_tests/test_cases/gpt/
gpt3_mcore_te_tp1_pp2_cp4_a2a_p2p_nondeterministic/model_config.yaml (--cp-comm-type a2a+p2p,
--hierarchical-context-parallel-sizes 2 2); NVIDIA-NeMo/Megatron-Bridge@067f987 hybrid-context-parallel SKILL.mdx
(cfg.model.hierarchical_context_parallel_sizes = [2, 2]). Llama 3.1 8B's shape (32 layers, 32 query heads, 8 KV
heads of 128): its Hugging Face config.json."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import one_train_search

from llmplan.cost.activations import cp_comm_workspace_bytes, p2p_ring_workspace_bytes
from llmplan.cost.comm import cp_transfers, step_comm
from llmplan.cost.exposure import cp_exposed
from llmplan.search.grid import Workload, default_space, enumerate_plans
from llmplan.search.variants import in_domain_shares
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import resolve_model, resolve_system
from llmplan.topology.placement import DEFAULT_ORDER, place
from tests.agreement import assert_arrays_agree

LLAMA = "llama-3.1-8b"
# tp 2, cp 16 = an a2a level of 4 (one NVLink domain with tp 2: 8 GPUs) x a ring of 4 across the 4 nodes
PLAN = dict(tp=2, cp=16, dp=1, pp=1, seq_len=131072, global_batch=8, micro_batch=1)
ARGS = ["--model", LLAMA, "--hardware", "dgx-h100", "--nodes", "4", "--tp", "2", "--cp", "16", "--seq-len", "131072",
        "--global-batch", "8"]


def _cluster(nodes: int = 4) -> ClusterSpec:
    return ClusterSpec(system=resolve_system("dgx-h100"), num_nodes=nodes)


def _hier(**kw) -> ParallelPlan:
    return ParallelPlan(**{**PLAN, "cp_comm_type": "a2a+p2p", "cp_a2a_size": 4, **kw})


def test_bytes_by_hand():
    """Per micro-batch and layer (8 micro-batches x 32 layers = 256 passes), no recompute: the a2a level's 4
    all-to-alls a pass over (2 + 0) passes, half of Q/O's and half of K/V's width; the ring's (3 + 0)(R - 1)
    sends of the plain ring's K/V chunk, R = 16 / 4."""
    m = resolve_model(LLAMA)
    qo_a2a, kv_a2a, ring = cp_transfers(m, _hier(), "cp", "cp_a2a", "cp_ring")
    tokens = 131072 // 16  # a rank's s/cp tokens, bf16
    q = 2 * tokens * (32 // 2) * 128  # its TP rank's 16 query heads of 128 (Q and O alike)
    kv = 2 * tokens * (8 // 2) * 128  # its 4 KV heads (K and V alike)
    assert (qo_a2a.collective, qo_a2a.group, qo_a2a.calls, qo_a2a.message) == ("all-to-all", "cp_a2a", 256 * 4, q)
    assert (kv_a2a.collective, kv_a2a.group, kv_a2a.calls, kv_a2a.message) == ("all-to-all", "cp_a2a", 256 * 4, kv)
    assert (ring.collective, ring.group, ring.calls, ring.message) == ("send-recv", "cp_ring", 256 * 3 * 3, 2 * kv)
    assert qo_a2a.te_cp and kv_a2a.te_cp and not ring.te_cp
    # the plain ring: 3 (cp - 1) sends of the same chunk over all 16 ranks
    (plain,) = cp_transfers(m, ParallelPlan(**PLAN), "cp")
    assert (plain.calls, plain.message) == (256 * 3 * 15, 2 * kv)
    # full recompute: one more pass of each (2 + 1 a2a, 3 + 1 ring)
    qo_r, _, ring_r = cp_transfers(m, _hier(recompute="full"), "cp", "cp_a2a", "cp_ring")
    assert (qo_r.calls, ring_r.calls) == (256 * 2 * 3, 256 * 4 * 3)


def test_the_levels_sit_where_megatron_puts_them():
    """The a2a level: 4 consecutive CP ranks (8 GPUs with tp 2: one node's NVLink); the ring: 4 ranks 4 apart,
    one per node. The bytes a GPU sends: all-to-all (k - 1)/k of each buffer, the ring's sends whole."""
    m, cluster = resolve_model(LLAMA), _cluster()
    spans = place(_hier().degrees, cluster, DEFAULT_ORDER)
    assert (spans["cp_a2a"].size, spans["cp_a2a"].nodes, spans["cp_a2a"].uses_nic) == (4, 1, False)
    assert (spans["cp_ring"].size, spans["cp_ring"].nodes, spans["cp_ring"].uses_nic) == (4, 4, True)
    cp = step_comm(m, _hier(), spans, cluster.system).axes["cp"]
    q, kv = 2 * 8192 * 16 * 128, 2 * 8192 * 4 * 128
    assert cp.bytes == pytest.approx(1024 * (q + kv) * 3 / 4 + 2304 * 2 * kv, rel=1e-12)


def test_the_a2a_level_is_exposed_whole_and_the_ring_hides_behind_its_calls():
    plan, kappa = _hier(), 0.2
    cp, a2a, attention = 3.0, 1.0, 8.0
    # ring 4 (16 / 4): its 2 s of sends hide, forward's 2/3 s behind 3/4 of the forward's 8/3 s of attention,
    # backward's 4/3 s behind all of the backward's 16/3 s; only the contention share (kappa) is added
    assert cp_exposed(plan, cp, attention, kappa, 0, a2a) == pytest.approx(1.0 + 0.2 * 2.0, rel=1e-12)
    # attention 0.8 s: forward 2/3 s of sends beside 0.8/3 x 3/4 = 0.2 s, backward 4/3 s beside 1.6/3 s
    hand = 1.0 + (2 / 3 - 0.2) + 0.2 * 0.2 + (4 / 3 - 1.6 / 3) + 0.2 * 1.6 / 3
    assert cp_exposed(plan, cp, 0.8, kappa, 0, a2a) == pytest.approx(hand, rel=1e-12)


def test_estimate_splits_the_seconds_by_kind(cli):
    r = cli("estimate", *ARGS, "--cp-comm-type", "a2a+p2p", "--cp-a2a-size", "4", "--json")
    assert r.code == 0, r.err
    cp = json.loads(r.out)["comm"]["cp"]
    kinds = cp["seconds_by_kind"]
    assert kinds["cp_a2a"] > 0 and kinds["cp_ring"] > 0 and kinds["cp_allgather"] == 0
    assert kinds["cp_a2a"] + kinds["cp_ring"] == pytest.approx(cp["seconds"], rel=1e-9)


def test_workspace_is_the_larger_of_the_a2a_copies_and_the_ring_at_its_own_size():
    """The a2a level's send and received copies of Q, K, V (2(Q + K + V)); the ring's buffers at R = 4 ranks:
    forward R(K + V + O + L), backward Q + 4(K + V) + L/2 (mem.cp_comm's p2p terms at R)."""
    m = resolve_model(LLAMA)
    tokens = 8192
    Q = O = 2 * tokens * 16 * 128
    K = V = 2 * tokens * 4 * 128
    L = 4 * tokens * 16
    ring = max(4 * (K + V + O + L), Q + 4 * (K + V) + L / 2)
    assert p2p_ring_workspace_bytes(m, _hier(), 4) == pytest.approx(ring, rel=1e-12)
    assert cp_comm_workspace_bytes(m, _hier()) == pytest.approx(max(2 * (Q + K + V), ring), rel=1e-12)
    # the plain ring holds all 16 ranks' K/V chunks at its peak: more than the two-level one
    assert cp_comm_workspace_bytes(m, ParallelPlan(**PLAN)) > cp_comm_workspace_bytes(m, _hier())


@pytest.mark.parametrize("extra,rule,needle", [
    (["--cp-comm-type", "a2a+p2p", "--cp-a2a-size", "3"], "cp_hierarchical_sizes",
     "cp_comm_type a2a+p2p with cp 16 and cp_a2a_size 3 needs 1 < cp_a2a_size < cp, dividing cp"),
    (["--cp-comm-type", "a2a+p2p", "--cp-a2a-size", "16"], "cp_hierarchical_sizes", "use --cp-a2a-size 2, 4, or"),  # 8 splits no 4 KV heads
    (["--cp-comm-type", "a2a+p2p"], "cp_hierarchical_sizes", "cp_a2a_size 1 needs 1 < cp_a2a_size < cp"),
    # 8 KV heads over tp 2: 4 a TP rank, which an a2a level of 8 cannot split
    (["--cp-comm-type", "a2a+p2p", "--cp-a2a-size", "8"], "cp_a2a_heads",
     "needs cp_a2a_size to divide each TP rank's query heads (32/2 = 16) and KV heads (8/2 = 4)"),
    (["--cp-a2a-size", "4"], "cp_a2a_size_hierarchical", "cp_a2a_size 4 with cp 16, cp_impl te and cp_comm_type p2p"),
])
def test_check_plan_errors_are_one_line_and_exit_2(cli, extra, rule, needle):
    r = cli("estimate", *ARGS, *extra)
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and "Traceback" not in r.err + r.out
    assert len(lines) == 1 and needle in lines[0], r.err
    args = dict(cp_comm_type="a2a+p2p") if "--cp-comm-type" in extra else {}
    size = int(extra[extra.index("--cp-a2a-size") + 1]) if "--cp-a2a-size" in extra else 1
    assert [v.rule for v in check_plan(resolve_model(LLAMA), ParallelPlan(**PLAN, **args, cp_a2a_size=size))] == [rule]


def test_sinks_and_windows_are_refused_as_under_p2p(cli):
    """GPT-OSS's learnable softmax offset runs only under a2a, its windows only under a2a or all_gather: the ring
    level of a2a+p2p runs neither (attn_forward_func_with_cp)."""
    r = cli("estimate", "--model", "gpt-oss-20b", "--hardware", "dgx-h100", "--nodes", "2", "--tp", "2", "--cp", "8",
            "--ep", "8", "--etp", "1", "--seq-len", "16384", "--global-batch", "16", "--cp-comm-type", "a2a+p2p",
            "--cp-a2a-size", "4")
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and len(lines) == 1, r.err
    assert "cp_comm_type a2a+p2p with cp 8 cannot run gpt-oss-20b's" in lines[0]
    assert "causal or full masks with the plain softmax" in lines[0] and "--cp-comm-type a2a" in lines[0]


@pytest.mark.parametrize("size", [2, 4, 8])
def test_vectorised_search_agrees_with_the_scalar_estimate(size):
    m, cluster = resolve_model(LLAMA), _cluster()
    w = Workload(global_batch=64, seq_len=16384, cp_comm_type="a2a+p2p", cp_a2a_size=size)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    order = np.random.default_rng(5).permutation(len(plans))
    idx = [int(i) for i in order[:6000] if plans.cp[i] > size and not check_plan(m, plans.plan(int(i)), cluster)][:8]
    assert len(idx) >= 4
    assert_arrays_agree(m, cluster, plans, idx)


def test_the_search_tries_the_in_domain_shares_only_across_domains():
    m = resolve_model(LLAMA)
    # tp 1, 2, 4 (8) beside 8, 4, 2 (1) CP ranks in an 8-GPU NVLink domain; a ring of 2 needs cp 2k <= 32
    assert in_domain_shares(m, _cluster(4), None, None, None) == [8, 4, 2]
    assert in_domain_shares(m, _cluster(4), 2, None, None) == [4]
    assert in_domain_shares(m, _cluster(4), None, None, 8) == [4, 2]
    assert in_domain_shares(m, _cluster(1), None, None, None) == []  # one domain: no CP group crosses the network


def test_search_ranks_it_and_exports_it(cli, tmp_path):
    plan = tmp_path / "plan.json"
    r = cli("search", "--model", LLAMA, "--hardware", "dgx-h100", "--nodes", "4", "--seq-len", "131072",
            "--global-batch", "64", "--grad-dtype", "fp32", "--json", "--save", plan)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    # the ring under the memory setting (one: --grad-dtype), then a2a+p2p at each in-domain share; once those are
    # searched the ring's setting names its comm type too
    tried = [(t.get("cp_comm_type"), t.get("cp_a2a_size")) for t in doc["switches"]["tried"]]
    assert tried == [("p2p", None), ("a2a+p2p", 8), ("a2a+p2p", 4), ("a2a+p2p", 2)]
    best = doc["plans"][0]["plan"]
    assert best["cp_comm_type"] == doc["switches"]["cp_comm_type"]
    pinned = cli("search", "--model", LLAMA, "--hardware", "dgx-h100", "--nodes", "4", "--seq-len", "131072",
                 "--global-batch", "64", "--grad-dtype", "fp32", "--cp-comm-type", "p2p", "--json")
    assert all(p["plan"]["cp_comm_type"] == "p2p" for p in json.loads(pinned.out)["plans"])


def test_exports_say_it_or_refuse_it(cli, tmp_path):
    plan = tmp_path / "plan.json"
    assert cli("estimate", *ARGS, "--cp-comm-type", "a2a+p2p", "--cp-a2a-size", "4", "--save", plan).code == 0
    assert cli("export", plan, "--to", "megatron", "-o", tmp_path / "mlm").code == 0
    text = "\n".join(f.read_text() for f in (tmp_path / "mlm").iterdir())
    assert "--cp-comm-type a2a+p2p\n" in text and "--hierarchical-context-parallel-sizes 4 4\n" in text
    assert cli("export", plan, "--to", "megatron-bridge", "-o", tmp_path / "mb").code == 0
    text = "\n".join(f.read_text() for f in (tmp_path / "mb").iterdir())
    assert "'model.cp_comm_type=a2a+p2p'" in text and "'model.hierarchical_context_parallel_sizes=[4,4]'" in text
    for target in ("torchtitan", "deepspeed"):
        r = cli("export", plan, "--to", target, "-o", tmp_path / target)
        lines = [x for x in r.err.splitlines() if x.strip()]
        assert r.code == 2 and len(lines) == 1 and "a2a+p2p" in lines[0], r.err
    # a plain ring writes neither level
    ring = tmp_path / "ring.json"
    assert cli("estimate", *ARGS, "--save", ring).code == 0
    assert cli("export", ring, "--to", "megatron", "-o", tmp_path / "r1").code == 0
    assert cli("export", ring, "--to", "megatron-bridge", "-o", tmp_path / "r2").code == 0
    text = "\n".join(f.read_text() for d in ("r1", "r2") for f in (tmp_path / d).iterdir())
    assert "hierarchical" not in text


def test_pool_search_tries_the_comm_types_the_masks_allow(cli, tmp_path):
    """GPT-OSS's sinks run only under a2a: the search over pools, pinned to cp 4, finds a2a plans (it tried
    the ring only, and every cp 4 plan broke cp_attention_mask)."""
    pools = tmp_path / "pools.yaml"
    pools.write_text("pools:\n  - {system: dgx-h100, nodes: 1}\n  - {system: dgx-a100, nodes: 1}\n"
                     "fabric: {gb_per_s: 50}\n")
    r = cli("search", "--model", "gpt-oss-20b", "--hardware", pools, "--seq-len", "32768", "--global-batch", "16",
            "--cp", "4", "--top", "2", "--json")
    assert r.code == 0, r.err
    plans = json.loads(r.out)["plans"]
    assert plans and all(p["plan"]["cp"] == 4 and p["plan"]["cp_comm_type"] == "a2a" for p in plans)


def test_a_pinned_cp_tries_the_a2a_sizes_that_divide_it(cli):
    # review finding: --cp 4 with tp 2 on two DGX H100 nodes left the in-domain share 4 alone, which
    # cp_hierarchical_sizes refuses (1 < size < cp): the search exited 2 though a2a+p2p at size 2 is valid
    out = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "2", "--seq-len", "8192",
              "--cp-comm-type", "a2a+p2p", "--cp", "4", "--tp", "2", "--json").json()
    plan = out["plans"][0]["plan"]
    assert (plan["cp"], plan["cp_comm_type"], plan["cp_a2a_size"]) == (4, "a2a+p2p", 2)


def test_the_switches_line_names_the_cp_comm_type_chosen(cli):
    # review finding: the text output named no CP comm type; the JSON did (switches.cp_comm_type)
    args = ("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "2", "--seq-len", "131072",
            "--global-batch", "32")
    with one_train_search():  # the JSON renders the text's search result: one search, not two
        text = " ".join(cli(*args).out.split())
        chosen = cli(*args, "--json").json()["switches"]
    size = f" (a2a level {chosen['cp_a2a_size']})" if chosen["cp_comm_type"] == "a2a+p2p" else ""
    assert f"CP comm {chosen['cp_comm_type']}{size}" in text and "--cp-comm-type" in text


def test_an_a2a_size_no_cp_on_the_cluster_can_hold_is_refused_by_name(cli):
    # review finding: --cp-a2a-size 16 on 16 GPUs left every plan at cp 1 and the error blamed cp 1
    r = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "2", "--seq-len", "8192",
            "--cp-comm-type", "a2a+p2p", "--cp-a2a-size", "16")
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and len(lines) == 1, r.err
    assert "--cp-a2a-size 16 needs cp of at least 32" in r.err and "use --cp-a2a-size 8 or less" in r.err
