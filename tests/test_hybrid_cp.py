"""Context parallelism as Megatron-Core runs it, per layer kind (docs/formulas.md#comm.cp, #comm.cp_mixers):
Transformer Engine's p2p ring runs again when selective recompute of core_attn re-calls the attention forward,
only a hybrid's softmax-attention layers ring K/V, its Mamba-2 and Gated DeltaNet layers all-to-all heads
instead (exposed whole), and only its attention layers hold the unfused scores. Expected values are counted by
hand from the sources the docstrings cite (NVIDIA/TransformerEngine at d0067d0da6, context_parallel.py;
NVIDIA/Megatron-LM at d98e8a64dd, attention.py, ssm/mamba_context_parallel.py, ssm/gated_delta_net/)."""

from __future__ import annotations

from itertools import islice

import pytest

from agreement import assert_arrays_agree
from llmplan.cost.comm import cp_mixer_split, cp_transfers, transfer_seconds
from llmplan.cost.elementwise import elementwise_bytes, score_bytes
from llmplan.estimate import estimate_training
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()
H100 = builtin_systems()["dgx-h100"]


def _plan(cp: int, tp: int = 2, recompute: str = "none", modules: tuple[str, ...] = (), **kw) -> ParallelPlan:
    return ParallelPlan(tp=tp, cp=cp, dp=1, seq_len=32768, micro_batch=1, global_batch=1, sp=tp > 1,
                        recompute=recompute, recompute_modules=modules, **kw)  # type: ignore[arg-type]


def test_selective_core_attn_runs_the_te_ring_forward_again():
    # TE AttnFuncWithCPAndKVP2P: forward sends the K/V at steps i < cp - 1 (cp - 1 sends); backward sends K/V at
    # i = 0 .. cp - 2 and dK/dV at i = 1 .. cp - 1 (2(cp - 1)). Megatron's _checkpointed_attention_forward re-calls
    # the core attention (the ring's forward) in backward: cp - 1 more. Llama 3.1 8B: 32 layers, 8 KV heads of
    # 128; tp 2, cp 4, 32768 tokens: one send is 2 bytes x 8192 tokens x (K, V) x 4 heads x 128.
    m = M["llama-3.1-8b"]
    chunk = 2 * 8192 * 2 * 4 * 128
    for plan, sends in ((_plan(4), 3 * 3), (_plan(4, recompute="selective"), 4 * 3),
                        (_plan(4, recompute="selective", modules=("core_attn", "mlp")), 4 * 3),
                        (_plan(4, recompute="selective", modules=("mlp",)), 3 * 3),  # core attention kept
                        (_plan(4, recompute="full"), 4 * 3)):
        (ring,) = cp_transfers(m, plan, "cp")
        assert (ring.collective, ring.calls, ring.message) == ("send-recv", 32 * sends, chunk)


def test_a_hybrids_attention_layers_ring_and_its_mamba_layers_all_to_all():
    # Nemotron-H 8B: 52 layers, 4 attention (8 KV heads of 128), 24 Mamba-2 (128 heads of 64, state 128, 8 groups).
    # tp 2, cp 4, 32768 tokens: 8192 a rank. MambaContextParallel.pre_conv_ssm all-to-alls z, x (HP/t = 4096
    # each), B, C (G/t = 4 groups: one per cp rank, 4 x 128 = 512 each) and dt (H/t = 64); post_conv_ssm y
    # (4096). Each _AllToAll's backward is one all-to-all of the gradient: 2 passes without recompute.
    m = M["nemotron-h-8b"]
    ring, zxy, bc, dt = cp_transfers(m, _plan(4), "cp")
    assert (ring.collective, ring.calls, ring.message) == ("send-recv", 4 * 3 * 3, 2 * 8192 * 2 * 4 * 128)
    assert (zxy.collective, zxy.calls, zxy.message) == ("all-to-all", 24 * 2 * 3, 2 * 8192 * 4096)
    assert (bc.collective, bc.calls, bc.message) == ("all-to-all", 24 * 2 * 2, 2 * 8192 * 512)
    assert (dt.collective, dt.calls, dt.message) == ("all-to-all", 24 * 2 * 1, 2 * 8192 * 64)
    # cp 8: 4 groups a TP rank, fewer than cp, so each is repeated twice (group_repeat_count 2): B and C are
    # 8 x 128 wide. Full recompute runs each layer's forward all-to-alls once more (3 passes).
    ring, zxy, bc, dt = cp_transfers(m, _plan(8, recompute="full"), "cp")
    assert ring.calls == 4 * 4 * 7
    assert (zxy.calls, zxy.message) == (24 * 3 * 3, 2 * 4096 * 4096)
    assert (bc.calls, bc.message) == (24 * 3 * 2, 2 * 4096 * 8 * 128)
    assert (dt.calls, dt.message) == (24 * 3, 2 * 4096 * 64)
    # selective core_attn re-runs the attention layers' ring, not the Mamba layers' all-to-alls
    ring, zxy, _, _ = cp_transfers(m, _plan(4, recompute="selective"), "cp")
    assert (ring.calls, zxy.calls) == (4 * 4 * 3, 24 * 2 * 3)


def test_gated_deltanet_layers_all_to_all_their_projection_and_output():
    # Qwen3-Next 80B-A3B: 48 layers, 12 attention (2 KV heads of 256), 36 Gated DeltaNet (16 key heads of 128,
    # 32 value heads of 128). tp 2, cp 2: a2a_cp_to_hp moves the whole in_proj output, q k v z beta alpha =
    # (2 x 16 x 128 + 2 x 32 x 128 + 2 x 32) / 2 = 6176 wide; a2a_hp_to_cp the gated norm's 32 x 128 / 2 = 2048.
    m = M["qwen3-next-80b-a3b"]
    ring, qkvzba, out = cp_transfers(m, _plan(2, mtp_layers=0), "cp")
    assert (ring.calls, ring.message) == (12 * 3 * 1, 2 * 16384 * 2 * 1 * 256)
    assert (qkvzba.collective, qkvzba.calls, qkvzba.message) == ("all-to-all", 36 * 2, 2 * 16384 * 6176)
    assert (out.collective, out.calls, out.message) == ("all-to-all", 36 * 2, 2 * 16384 * 2048)


def test_no_mixer_all_to_alls_without_context_parallelism():
    ring, *mixers = cp_transfers(M["nemotron-h-8b"], _plan(1), "cp")
    assert ring.calls == 0 and all(x.calls == 0 for x in mixers)


def test_the_mixer_all_to_alls_are_exposed_whole():
    # _AllToAll calls all_to_all_single in line on the compute stream: nothing hides them, unlike the ring
    m, cluster = M["nemotron-h-8b"], ClusterSpec(system=H100, num_nodes=1)
    plan = ParallelPlan(tp=2, cp=4, dp=1, seq_len=32768, micro_batch=1, global_batch=1, sp=True)
    est = estimate_training(m, cluster, plan)
    ring, mixers = cp_mixer_split(est.comm.axes["cp"].transfers)
    a2a = sum(transfer_seconds(x, cluster.system) for x in mixers)
    assert a2a > 0 and est.time.exposed["cp"] >= a2a


def test_vectorised_search_agrees_with_the_scalar_estimate_on_hybrid_cp_plans():
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    for name in ("nemotron-h-8b", "qwen3-next-80b-a3b"):
        m, cluster = M[name], ClusterSpec(system=H100, num_nodes=2)
        w = Workload(global_batch=16, seq_len=16384)
        plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
        idx = list(islice((i for i in range(len(plans)) if plans.plan(i).cp > 1
                           and not check_plan(m, plans.plan(i), cluster)), 0, 60, 4))
        assert_arrays_agree(m, cluster, plans, idx)


def test_unfused_scores_are_a_hybrids_attention_layers_only():
    # without fused attention the softmax (and dropout) over a x s x T / t scores of each attention layer: the
    # average layer of Nemotron-H 8B holds 4/52 of them; Llama 3.1 8B all of them
    for name, share in (("nemotron-h-8b", 4 / 52), ("llama-3.1-8b", 1.0)):
        m = M[name]
        fused = _plan(1, flash_attention=True)
        eager = _plan(1, flash_attention=False)
        T = 32768
        scores = score_bytes(m, eager) * m.num_attention_heads * 32768 * T / 2 * share
        assert elementwise_bytes(m, eager, False) - elementwise_bytes(m, fused, False) == pytest.approx(scores)
