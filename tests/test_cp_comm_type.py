"""Transformer Engine's a2a and all_gather context parallelism (ParallelPlan.cp_comm_type): what check_plan lets
each run, what each sends, that the vectorised search prices them as the scalar estimate does, how the search
tries them and how the Megatron exports say them.

Sources: NVIDIA/TransformerEngine@d0067d0 transformer_engine/pytorch/attention/dot_product_attention/
context_parallel.py (attn_forward_func_with_cp: sliding windows only with a2a / all_gather, a non-vanilla softmax
only with a2a; AttnFuncWithCPAndQKVOA2A: all_to_all_single of q, k, v, out, dout, dq, dk, dv and "requires
num_heads % cp_size == 0"; AttnFuncWithCPAndKVAllGather: gather_along_first_dim of k and v in forward and backward,
reduce_scatter_along_first_dim of dk and dv); DeepSpeed-Ulysses (arXiv 2309.14509, sec. 3: all-to-all of Q, K, V
and of the output); Llama 3 (arXiv 2407.21783, sec. 3.3.2: all-gather of K and V, reduce-scatter of their
gradients); NVIDIA/Megatron-LM@d98e8a6 megatron/training/arguments.py (--cp-comm-type, nargs='+')."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llmplan.cost.comm import cp_transfers, step_comm
from llmplan.estimate import estimate_training
from llmplan.search.grid import Workload, default_space, enumerate_plans
from llmplan.specs.check import check_plan
from llmplan.specs.plan import CP_COMM_TYPES, CP_IMPLS, ClusterSpec, ParallelPlan
from llmplan.specs.registry import resolve_model, resolve_system
from llmplan.topology.placement import DEFAULT_ORDER, place
from tests.agreement import assert_arrays_agree


def _sent(m, plan) -> float:
    """Bytes of the cp axis's calls (whole buffers, nccl-tests convention): calls x message, summed."""
    return float(sum(float(x.calls) * float(x.message) for x in cp_transfers(m, plan, "cp")))


@pytest.mark.parametrize("impl", CP_IMPLS)
@pytest.mark.parametrize("comm", CP_COMM_TYPES)
@pytest.mark.parametrize("name,nodes", [("llama-3.1-8b", 1), ("gpt-oss-120b", 2), ("deepseek-v3", 32)])
def test_degree_one_cp_sends_nothing(name, nodes, comm, impl):
    """Bytes each GPU sends (the bus factor of its group) and seconds of the cp axis, whatever the switches say."""
    m, cluster = resolve_model(name), ClusterSpec(system=resolve_system("dgx-h100"), num_nodes=nodes)
    plan = ParallelPlan(tp=2, cp=1, ep=8 if m.is_moe else 1, etp=1 if m.is_moe else None, pp=1, dp=4 * nodes,
                        seq_len=4096, global_batch=256, micro_batch=1,
                        cp_impl=impl, cp_comm_type=comm, recompute="full")
    cp = step_comm(m, plan, place(plan.degrees, cluster, DEFAULT_ORDER), cluster.system).axes["cp"]  # no check_plan
    assert (cp.bytes, cp.seconds) == (0.0, 0.0)
    if impl == "te":  # Transformer Engine's collectives are not even issued
        assert _sent(m, plan) == 0.0


# Llama 3.1 8B (hidden 4096, 32 heads, 8 KV heads, head 128, 32 layers), seq 8192, cp 2, tp 1, one micro-batch
# of one sequence: each rank holds 4096 tokens. Q and the output: 4096 x 4096 bf16 = 33,554,432 bytes; K and V:
# 4096 x 1024 x 2 = 8,388,608 bytes each.
Q = O = 2 * 4096 * 4096
K = V = 2 * 4096 * 1024
LAYERS = 32


@pytest.mark.parametrize("recompute,passes", [("none", 2), ("full", 3)])
def test_a2a_moves_q_k_v_and_the_output_each_pass(recompute, passes):
    """Ulysses (arXiv 2309.14509 sec. 3): per layer and pass one all-to-all of each of Q, K, V and the output
    (backward: of their gradients); full recompute runs the forward's again."""
    plan = ParallelPlan(tp=1, cp=2, dp=1, seq_len=8192, global_batch=1, micro_batch=1, cp_comm_type="a2a",
                        recompute=recompute)
    assert _sent(resolve_model("llama-3.1-8b"), plan) == LAYERS * passes * (Q + K + V + O)


@pytest.mark.parametrize("recompute,gathers", [("none", 2), ("full", 3)])
def test_all_gather_gathers_k_and_v_and_reduce_scatters_their_gradients(recompute, gathers):
    """Llama 3 (arXiv 2407.21783 sec. 3.3.2) as TE runs it: K and V gathered (cp x the chunk) in forward and again
    in backward, dK and dV reduce-scattered once."""
    plan = ParallelPlan(tp=1, cp=2, dp=1, seq_len=8192, global_batch=1, micro_batch=1, cp_comm_type="all_gather",
                        recompute=recompute)
    assert _sent(resolve_model("llama-3.1-8b"), plan) == LAYERS * (gathers + 1) * 2 * (K + V)


def test_a2a_and_all_gather_are_exposed_whole_and_the_ring_hides():
    m, cluster = resolve_model("llama-3.1-8b"), ClusterSpec(system=resolve_system("dgx-h100"), num_nodes=1)
    for comm in ("p2p", "a2a", "all_gather"):  # a2a+p2p (two levels, cp 4 or more): tests/test_cp_hierarchical.py
        e = estimate_training(m, cluster, ParallelPlan(tp=4, cp=2, dp=1, seq_len=32768, global_batch=8,
                                                       micro_batch=1, cp_comm_type=comm))
        seconds = e.comm.axes["cp"].seconds
        assert seconds > 0
        if comm == "p2p":
            assert e.time.exposed["cp"] < 0.5 * seconds
        else:
            assert e.time.exposed["cp"] == pytest.approx(seconds, rel=1e-12)


GPT_OSS = dict(tp=4, pp=1, cp=2, ep=8, etp=1, dp=2, seq_len=8192, global_batch=16, micro_batch=1)


def test_gpt_oss_120b_cp_passes_under_a2a_and_is_refused_under_p2p():
    m = resolve_model("gpt-oss-120b")
    assert check_plan(m, ParallelPlan(**GPT_OSS, cp_comm_type="a2a")) == []
    refused = check_plan(m, ParallelPlan(**GPT_OSS))
    assert [v.rule for v in refused] == ["cp_attention_mask"]
    assert refused[0].message == (
        "cp_impl te cp_comm_type p2p with cp 2 cannot run gpt-oss-120b's 18 sliding-window layers (window 128) and "
        "attention sinks: Transformer Engine's p2p context parallelism runs only causal or full masks with the plain "
        "softmax; use --cp-comm-type a2a (with --cp-impl te), --cp-impl torch-allgather (FlexAttention's all-gather "
        "of the K/V, which applies any mask) or --cp 1")
    sinks = check_plan(m, ParallelPlan(**GPT_OSS, cp_comm_type="all_gather"))  # windows yes, sinks no
    assert [v.rule for v in sinks] == ["cp_attention_mask"] and "gpt-oss-120b's attention sinks" in sinks[0].message


def test_windows_without_sinks_run_under_a2a_and_all_gather():
    m = resolve_model("gpt-oss-120b").model_copy(update={"attention_sinks": False})
    rules = {c: [v.rule for v in check_plan(m, ParallelPlan(**GPT_OSS, cp_comm_type=c))] for c in CP_COMM_TYPES}
    assert rules == {"p2p": ["cp_attention_mask"], "a2a": [], "all_gather": [],
                     "a2a+p2p": ["cp_attention_mask", "cp_hierarchical_sizes"]}  # its ring level as p2p; cp 2: no levels


def test_chunked_attention_is_refused_under_every_te_comm_type():
    m = resolve_model("llama-4-scout")
    plan = dict(tp=4, pp=1, cp=2, ep=8, etp=1, dp=2, seq_len=8192, global_batch=16, micro_batch=1)
    for comm in CP_COMM_TYPES:
        assert "cp_attention_mask" in [v.rule for v in check_plan(m, ParallelPlan(**plan, cp_comm_type=comm))]


def test_a2a_head_rule_in_one_line(cli):
    r = cli("estimate", "--model", "gpt-oss-120b", "--hardware", "dgx-h100", "--nodes", "2", "--tp", "8", "--cp", "2",
            "--ep", "8", "--etp", "1", "--pp", "1", "--seq-len", "8192", "--global-batch", "16", "--micro-batch", "1",
            "--cp-comm-type", "a2a")
    assert r.code == 2
    assert r.err == (
        "error: the plan breaks a rule: cp_comm_type a2a with cp 2 and tp 8 needs cp to divide each TP rank's query "
        "heads (64/8 = 8) and KV heads (8/8 = 1) of gpt-oss-120b: Transformer Engine's a2a context parallelism "
        "scatters the heads over the CP ranks; use tp 1, 2, 4 at cp 2, or --cp 1\n")


def test_a2a_head_rule_counts_tp_times_cp():
    m = resolve_model("llama-3.1-8b")  # 32 heads, 8 KV heads

    def rules(tp: int, cp: int) -> list[str]:
        return [v.rule for v in check_plan(m, ParallelPlan(tp=tp, cp=cp, dp=1, seq_len=8192, global_batch=8,
                                                           micro_batch=1, cp_comm_type="a2a"))]
    assert "cp_a2a_heads" not in rules(2, 4) + rules(4, 2) + rules(1, 8)
    assert "cp_a2a_heads" in rules(4, 4) and "cp_a2a_heads" in rules(8, 2) and "cp_a2a_heads" in rules(1, 16)


def test_comm_type_without_cp_is_refused(cli):
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--tp", "8",
            "--seq-len", "8192", "--global-batch", "8", "--micro-batch", "1", "--cp-comm-type", "a2a")
    assert r.code == 2 and "cp_comm_type a2a with cp 1 and cp_impl te" in r.err and r.err.count("\n") == 1


@pytest.mark.parametrize("name,system,nodes,comm", [("gpt-oss-120b", "dgx-h100", 2, "a2a"),
                                                    ("llama-3.1-8b", "dgx-h100", 2, "a2a"),
                                                    ("llama-3.1-8b", "dgx-h100", 2, "all_gather"),
                                                    ("deepseek-v3.2", "dgx-h100", 32, "all_gather"),
                                                    ("llama-3.1-8b", "dgx-h100", 2, "p2p"),  # the ring's buffers
                                                    ("llama-2-7b", "dgx-h100", 2, "p2p"),
                                                    ("deepseek-v3", "dgx-h100", 32, "p2p")])
def test_vectorised_search_agrees_with_the_scalar_estimate(name, system, nodes, comm):
    m, cluster = resolve_model(name), ClusterSpec(system=resolve_system(system), num_nodes=nodes)
    w = Workload(global_batch=64, seq_len=16384, cp_comm_type=comm)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    order = np.random.default_rng(11).permutation(len(plans))
    idx = [int(i) for i in order[:3000] if plans.cp[i] > 1 and not check_plan(m, plans.plan(int(i)), cluster)][:8]
    assert len(idx) >= 4
    assert_arrays_agree(m, cluster, plans, idx)


def test_search_tries_a2a_for_gpt_oss_and_exports_it(cli, tmp_path):
    plan = tmp_path / "plan.json"
    r = cli("search", "--model", "gpt-oss-20b", "--hardware", "dgx-h100", "--nodes", "1", "--seq-len", "16384",
            "--global-batch", "16", "--cp", "2", "--no-tp-comm-overlap", "--grad-dtype", "fp32", "--json", "--save", plan)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["plans"] and all(p["plan"]["cp"] == 2 and p["plan"]["cp_comm_type"] == "a2a" for p in doc["plans"])
    assert cli("export", plan, "--to", "megatron", "-o", tmp_path / "mlm").code == 0
    assert "--cp-comm-type a2a" in "\n".join(f.read_text() for f in (tmp_path / "mlm").iterdir())
    assert cli("export", plan, "--to", "megatron-bridge", "-o", tmp_path / "mb").code == 0
    assert "'model.cp_comm_type=a2a'" in "\n".join(f.read_text() for f in (tmp_path / "mb").iterdir())


def test_a_plain_model_searches_the_ring_only():
    """The search adds a comm type only where the ring cannot run the model (search_speed unchanged)."""
    from llmplan.search.run import cp_comm_variants
    plain, oss, dsa = resolve_model("llama-3.1-8b"), resolve_model("gpt-oss-20b"), resolve_model("deepseek-v3.2")
    w = Workload(global_batch=16, seq_len=8192)
    assert cp_comm_variants(plain, w, pinned=False, cp_free=True) == ["p2p"]
    assert cp_comm_variants(oss, w, pinned=False, cp_free=True) == ["a2a"]
    assert cp_comm_variants(dsa, w, pinned=False, cp_free=True) == ["all_gather"]
    windows = oss.model_copy(update={"attention_sinks": False})
    assert cp_comm_variants(windows, w, pinned=False, cp_free=True) == ["a2a", "all_gather"]
    assert cp_comm_variants(oss, w, pinned=True, cp_free=True) == ["p2p"]
    assert cp_comm_variants(oss, w, pinned=False, cp_free=False) == ["p2p"]


def test_an_unknown_cp_comm_type_is_one_line_and_exit_2(cli):
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--cp", "2",
            "--cp-comm-type", "ring")
    assert r.code == 2 and "Traceback" not in r.err
    assert r.err.strip() == ("error: --cp-comm-type ring is not a Transformer Engine CP attention llmplan prices: "
                             "it must be one of p2p, a2a, all_gather, a2a+p2p; give --cp-comm-type with one of them")
