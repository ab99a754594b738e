"""Activation memory of Transformer Engine's a2a and all_gather context parallelism (ParallelPlan.cp_comm_type):
what each saves for backward beyond p2p (LayerActivationParts.cp_a2a_out) and the transient buffers of one
layer's collectives (ActivationBytes.cp_workspace), and the cp seconds by kind (CommSeconds.cp_a2a,
cp_allgather apart from cp_mixers). docs/formulas.md#mem.cp_comm.

Expected values worked by hand from NVIDIA/TransformerEngine@d0067d0da6 transformer_engine/pytorch/attention/
dot_product_attention/context_parallel.py:
- AttnFuncWithCPAndQKVOA2A.forward saves (q_part, k_part, v_part, out_part), the post-all-to-all tensors (all s
  tokens of heads/cp: the bytes of the rank's s/cp tokens of all heads), and returns out_ = the reverse
  all-to-all of out_part, a second tensor the output projection keeps: one more output per attention layer.
  flash_attn_a2a_communicate holds, beside the caller's q, k, v (backward: dq, dk, dv), a contiguous send copy
  and a received copy of each: 2(Q + K + V).
- AttnFuncWithCPAndKVAllGather.forward saves (q, k, v, out_f16) with the rank's own k, v and returns out_f16:
  nothing more. Its backward holds the gathered k_ag, v_ag (cp(K + V)), dk, dv zeros of k_shape[0] * cp_size
  (cp(K + V)), the two steps' dk/dv pieces over the causal K/V range of chunks rank and 2cp-1-rank
  ((rank+1) + (2cp-rank) chunks of 2cp: (cp + 1/2)(K + V)) and the index_select copy of dk before the
  reduce-scatter (cp K).
Llama 3.1 8B (32 heads, 8 KV heads, head 128, 32 layers), seq 8192, cp 2, tp 1, one sequence a micro-batch,
pp 1 (one micro-batch in flight): each rank's 4096 tokens; Q = O = 4096 x 4096 x 2 B = 32 MiB, K = V =
4096 x 1024 x 2 B = 8 MiB. Tolerance: exact up to float rounding (rel 1e-12)."""

from __future__ import annotations

import numpy as np
import pytest

from llmplan.cost.activations import layer_activation_parts
from llmplan.cost.memory import training_memory
from llmplan.estimate import estimate_training
from llmplan.specs.plan import CP_COMM_TYPES, CP_IMPLS, ClusterSpec, ParallelPlan
from llmplan.specs.registry import resolve_model, resolve_system

MIB = 2 ** 20
Q = O = 32 * MIB
K = V = 8 * MIB
LAYERS = 32
CLUSTER = ClusterSpec(system=resolve_system("dgx-h100"), num_nodes=1)
LLAMA = resolve_model("llama-3.1-8b")


def _mem(comm: str, recompute: str, cp: int = 2, m=LLAMA, **kw):
    plan = ParallelPlan(tp=1, cp=cp, dp=8 // cp, seq_len=8192, global_batch=8, micro_batch=1, cp_comm_type=comm,
                        recompute=recompute, **kw)
    return estimate_training(m, CLUSTER, plan).memory


@pytest.mark.parametrize("recompute,stored,working", [("none", LAYERS * O, 0.0), ("selective", 0.0, 0.0),
                                                      ("full", 0.0, O)])
def test_a2a_keeps_one_more_output_per_layer_where_the_core_keeps_its_tensors(recompute, stored, working):
    """none: out_part beside the projection's input in each of 32 layers; selective (core_attn, Megatron's
    default) checkpoints the core and drops it; full keeps the layer inputs only and rebuilds it in the working
    set of the layer under backward."""
    a2a, p2p = _mem("a2a", recompute).activation_parts, _mem("p2p", recompute).activation_parts
    assert a2a.layers - p2p.layers == pytest.approx(stored, rel=1e-12, abs=0)
    assert a2a.recompute_working - p2p.recompute_working == pytest.approx(working, rel=1e-12, abs=0)
    assert a2a.cp_workspace == pytest.approx(2 * (Q + K + V), rel=1e-12)  # 96 MiB, every mode
    assert p2p.cp_workspace == 97 * MIB  # the p2p ring's own buffers (tests/test_p2p_ring_memory.py)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_all_gather_saves_its_own_chunk_and_holds_the_gathered_kv_and_their_gradients(recompute):
    ag, p2p = _mem("all_gather", recompute).activation_parts, _mem("p2p", recompute).activation_parts
    assert (ag.layers, ag.recompute_working) == (p2p.layers, p2p.recompute_working)
    cp = 2
    assert ag.cp_workspace == pytest.approx(cp * (K + V) + cp * (K + V) + (cp + 0.5) * (K + V) + cp * K, rel=1e-12)
    assert ag.cp_workspace == 120 * MIB


@pytest.mark.parametrize("comm", CP_COMM_TYPES)
def test_memory_parts_still_sum_to_the_total(comm):
    mem = _mem(comm, "none", **({"cp": 4, "cp_a2a_size": 2} if comm == "a2a+p2p" else {}))  # two levels of 2
    a = mem.activation_parts
    assert a.total == a.layers + a.recompute_working + a.embedding + a.output + a.cp_workspace
    assert mem.activations == a.total
    assert mem.total == pytest.approx(mem.weights + mem.gradients + mem.optimizer + mem.activations + mem.other,
                                      rel=1e-15)


def test_a2a_costs_more_memory_than_p2p_and_all_gather_more_at_large_cp():
    """The totals move by the parts above and their fragmentation share only."""
    p2p, a2a = _mem("p2p", "none"), _mem("a2a", "none")
    assert a2a.total > p2p.total
    ring = 97 * MIB  # p2p's own ring buffers, cp 2 (tests/test_p2p_ring_memory.py)
    assert a2a.activations - p2p.activations == pytest.approx(LAYERS * O + 2 * (Q + K + V) - ring, rel=1e-12)


@pytest.mark.parametrize("comm", CP_COMM_TYPES)
@pytest.mark.parametrize("name", ["llama-3.1-8b", "deepseek-v3", "nemotron-h-8b"])
def test_degree_one_adds_nothing(comm, name):
    """cp 1 (no check_plan: the switch alone): the memory of p2p, to the byte."""
    m = resolve_model(name)
    plan = dict(tp=8, cp=1, dp=1, pp=1, seq_len=4096, global_batch=8, micro_batch=1, recompute="none")
    if m.is_moe:
        plan.update(ep=8, etp=1, dp=8, pp=1)
    base = training_memory(m, ParallelPlan(**plan), 80 * 2 ** 30)  # no check_plan: it refuses the switch at cp 1
    other = training_memory(m, ParallelPlan(**plan, cp_comm_type=comm), 80 * 2 ** 30)
    assert other.total == base.total and other.activation_parts.cp_workspace == 0.0
    assert layer_activation_parts(m, ParallelPlan(**plan, cp_comm_type=comm), m.is_moe).cp_a2a_out == 0.0


def test_torch_cp_adds_nothing():
    """PyTorch's context parallelism (cp_impl torch-*): none of TE's buffers; TE's p2p: tests/test_p2p_ring_memory.py."""
    for impl in (i for i in CP_IMPLS if i != "te"):
        plan = ParallelPlan(tp=1, cp=2, dp=4, seq_len=8192, global_batch=8, micro_batch=1, cp_impl=impl,
                            cp_comm_type="p2p" if impl == "te" else "a2a", recompute="none")
        mem = training_memory(LLAMA, plan, 80 * 2 ** 30)  # no check_plan: torch CP with a2a is refused
        assert mem.activation_parts.cp_workspace == 0.0
        assert layer_activation_parts(LLAMA, plan, False).cp_a2a_out == 0.0


def test_cp_seconds_by_kind():
    """TE's a2a all-to-alls are their own kind, not the mixers' (a plain model has none); all_gather's likewise;
    a hybrid under p2p keeps its mixers' all-to-alls in cp_mixers."""
    from llmplan.cost.comm import comm_seconds
    from llmplan.estimate import estimate_training as est

    def secs(m, comm, tp=1):
        plan = ParallelPlan(tp=tp, cp=2, dp=8 // (2 * tp), seq_len=8192, global_batch=8, micro_batch=1,
                            cp_comm_type=comm)
        e = est(m, CLUSTER, plan)
        return comm_seconds(e.comm, CLUSTER.system)
    a2a, ag = secs(LLAMA, "a2a"), secs(LLAMA, "all_gather")
    assert (a2a.cp_mixers, a2a.cp_allgather) == (0.0, 0.0) and a2a.cp_a2a == pytest.approx(a2a.cp, rel=1e-12)
    assert (ag.cp_mixers, ag.cp_a2a) == (0.0, 0.0) and ag.cp_allgather == pytest.approx(ag.cp, rel=1e-12)
    hybrid = secs(resolve_model("nemotron-h-8b"), "p2p")
    assert hybrid.cp_mixers > 0 and (hybrid.cp_a2a, hybrid.cp_allgather) == (0.0, 0.0)
    assert np.isfinite(hybrid.cp)


def test_json_names_the_parts(cli):
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--tp", "2", "--cp", "2",
            "--dp", "2", "--seq-len", "16384", "--global-batch", "8", "--micro-batch", "1", "--cp-comm-type", "a2a",
            "--json")
    assert r.code == 0, r.err
    doc = r.json()
    # tp 2: Q = O = 8192 tokens x 2048 x 2 B = 32 MiB, K = V = 8192 x 512 x 2 B = 8 MiB
    assert doc["memory"]["activation_parts"]["cp_workspace"] == 2 * (Q + K + V)
    kinds = doc["comm"]["cp"]["seconds_by_kind"]
    assert set(kinds) == {"cp_ring", "cp_mixers", "cp_a2a", "cp_allgather"}
    assert kinds["cp_a2a"] == pytest.approx(doc["comm"]["cp"]["seconds"], rel=1e-12) and kinds["cp_mixers"] == 0.0
