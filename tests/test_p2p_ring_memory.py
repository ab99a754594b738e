"""Transient memory of Transformer Engine's p2p K/V ring (cp_impl te, cp_comm_type p2p, cp > 1):
ActivationBytes.cp_workspace, docs/formulas.md#mem.cp_comm.

Expected values worked by hand from NVIDIA/TransformerEngine@d0067d0da6 transformer_engine/pytorch/attention/
dot_product_attention/context_parallel.py, AttnFuncWithCPAndKVP2P (bf16, causal, 2cp chunks, sbhd):
- forward: p2p_comm_buffers[0] = torch.cat((k.view(-1), v.view(-1))) and p2p_comm_buffers[i + 1] =
  torch.empty_like(p2p_comm_buffers[i]) for i < cp - 1, all in a list held to the end: cp(K + V). out_per_step[i]
  and softmax_lse_per_step[i] (lists held to the end): step i <= rank runs all of q (cp_p2p_fwd_prepare_qkv
  "diagonal" / "lower-triangle"), a later step its second half only ("upper-triangle"); rank cp - 1 runs every
  step on all of q: cp(O + L), L the fp32 softmax statistics (one per query head and token).
- backward: two torch.empty((2, *kv.shape)) send/receive buffers (4(K + V), the returned dk, dv a view of one
  K + V of them), dq_buffer = torch.empty_like(q) (the returned dq), the last (diagonal) step's dq_, dk_, dv_
  from fused_attn_bwd over all of q and k, v (Q + K + V; the previous step's are dropped: dq_, dk_, dv_ = None
  before each step) and softmax_lse_[..., 1, :].contiguous() on ranks < cp - 1 (L/2): Q + 4(K + V) + L/2.
- the workspace: the larger pass.
Llama 3.1 8B (32 heads, 8 KV heads, head 128), seq 8192, tp 1, one sequence a micro-batch:
  cp 2: 4096 tokens a rank: Q = O = 32 MiB, K = V = 8 MiB, L = 4096 x 32 x 4 B = 0.5 MiB;
        forward 2 x (8 + 8 + 32 + 0.5) = 97 MiB, backward 32 + 64 + 0.25 = 96.25 MiB -> 97 MiB.
  cp 4: 2048 tokens: Q = O = 16 MiB, K = V = 4 MiB, L = 0.25 MiB;
        forward 4 x (4 + 4 + 16 + 0.25) = 97 MiB, backward 16 + 32 + 0.125 = 48.125 MiB -> 97 MiB.
Llama 2 7B (32 heads, MHA, head 128), seq 8192, cp 2: Q = K = V = O = 32 MiB, L = 0.5 MiB;
        forward 2 x (32 + 32 + 32 + 0.5) = 193 MiB, backward 32 + 256 + 0.25 = 288.25 MiB -> 288.25 MiB.
Tolerance: exact up to float rounding (rel 1e-12)."""

from __future__ import annotations

import pytest

from llmplan.cost.activations import cp_comm_workspace_bytes
from llmplan.cost.memory import training_memory
from llmplan.estimate import estimate_training
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import resolve_model, resolve_system

MIB = 2 ** 20
CLUSTER = ClusterSpec(system=resolve_system("dgx-h100"), num_nodes=1)


def _plan(cp: int, **kw) -> ParallelPlan:
    return ParallelPlan(**{**dict(tp=1, cp=cp, dp=8 // cp, seq_len=8192, global_batch=8, micro_batch=1,
                                  recompute="selective"), **kw})


@pytest.mark.parametrize("cp,expected", [(2, 97 * MIB), (4, 97 * MIB)])
def test_llama31_8b_ring_buffers_worked_by_hand(cp, expected):
    """GQA: the forward's cp K/V buffers and cp per-step outputs are the larger pass at cp 2 and cp 4."""
    mem = estimate_training(resolve_model("llama-3.1-8b"), CLUSTER, _plan(cp)).memory
    assert mem.activation_parts.cp_workspace == pytest.approx(expected, rel=1e-12)


def test_mha_backward_is_the_larger_pass():
    """MHA (K = V = Q): the backward's dK/dV ring pair outweighs the forward's per-step outputs at cp 2."""
    mem = estimate_training(resolve_model("llama-2-7b"), CLUSTER, _plan(2)).memory
    assert mem.activation_parts.cp_workspace == pytest.approx(288.25 * MIB, rel=1e-12)


def test_seq_scales_the_ring_buffers():
    """Every term is per token: twice the sequence, twice the bytes (Llama 3.1 8B, cp 2: 2 x 97 MiB)."""
    mem = estimate_training(resolve_model("llama-3.1-8b"), CLUSTER, _plan(2, seq_len=16384)).memory
    assert mem.activation_parts.cp_workspace == pytest.approx(194 * MIB, rel=1e-12)


@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-2-7b", "deepseek-v3"])
def test_degree_one_adds_nothing(name):
    plan = ParallelPlan(tp=8, cp=1, dp=1, pp=1, seq_len=4096, global_batch=8, micro_batch=1, recompute="none")
    assert cp_comm_workspace_bytes(resolve_model(name), plan) == 0.0


@pytest.mark.parametrize("impl", ["torch-allgather", "torch-alltoall"])
def test_torch_cp_adds_nothing(impl):
    """PyTorch's context parallelism (cp_impl torch-allgather, torch-alltoall) is not TE's ring: none of these."""
    plan = _plan(2, cp_impl=impl)
    assert training_memory(resolve_model("llama-3.1-8b"), plan, 80 * 2 ** 30).activation_parts.cp_workspace == 0.0


def test_parts_still_sum():
    mem = estimate_training(resolve_model("llama-3.1-8b"), CLUSTER, _plan(4)).memory
    a = mem.activation_parts
    assert a.cp_workspace > 0
    assert a.total == a.layers + a.recompute_working + a.embedding + a.output + a.cp_workspace
    assert mem.activations == a.total
    assert mem.total == pytest.approx(mem.weights + mem.gradients + mem.optimizer + mem.activations + mem.other,
                                      rel=1e-15)
