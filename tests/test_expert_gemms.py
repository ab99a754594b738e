"""The routed experts' matmuls are found by what they are, not where they sit in a layer's GEMM list.

A latent MoE (Nemotron-3 Super / Ultra: moe_latent_size) appends its h -> l and l -> h projections after the
router, so a position counted from the list's end lands on the router and the latent projection. These tests
name the expert matmuls from the model's config (rows per local expert T·k·ep/E, the expert width w, f_e) and
check that the grouped-GEMM pricing and the routing imbalance reach exactly those: latent and full-width
experts, with and without shared experts. Architecture: NVIDIA/Megatron-LM
megatron/core/transformer/moe/moe_layer.py (router on the full-width token, fc1_latent_proj before dispatch,
fc2_latent_proj after combine); nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16 config.json.
"""

from __future__ import annotations

import pytest

from llmplan.cost.compute import grouped_gemm_bytes, grouped_gemm_efficiency, layer_flops, layer_gemm_seconds
from llmplan.cost.gemm import layer_gemms
from llmplan.cost.moe import routing_imbalance
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()
GPU = builtin_systems()["dgx-h100"].gpu


def _variants() -> dict[str, ModelSpec]:
    sup = M["nemotron-3-super"]
    return {
        "full width, no shared": M["qwen3-30b-a3b"],
        "full width, shared": M["nemotron-3-nano"],
        "latent, shared": sup,
        "latent, no shared": sup.model_copy(update={"shared_expert_intermediate_size": None, "n_shared_experts": 0}),
    }


def _expert_shapes(m: ModelSpec, plan: ParallelPlan) -> list[tuple[float, float, float]]:
    """(M, N, K) of fc1 and fc2 of one local expert, from the config (tp = etp = 1, no padding)."""
    T = plan.seq_len * plan.micro_batch
    rows = T * m.num_experts_per_tok * plan.ep / m.num_experts
    w = m.moe_latent_size or m.hidden_size  # a latent MoE's experts read and write the latent width
    c = 2 if m.gated_mlp else 1
    return [(rows, c * m.expert_ffn, w), (rows, w, m.expert_ffn)]


@pytest.mark.parametrize("name", list(_variants()))
def test_the_two_expert_matmuls_are_tagged_whatever_follows_them(name: str) -> None:
    m = _variants()[name]
    assert (m.shared_ffn > 0) == ("no shared" not in name)
    plan = ParallelPlan(dp=8, ep=8, seq_len=4096, micro_batch=1, global_batch=8)
    gemms = layer_gemms(m, plan, True)
    experts = [g for g in gemms if g.module == "expert"]
    assert [tuple(float(x) for x in g[1:4]) for g in experts] == _expert_shapes(m, plan)
    routers = [g for g in gemms if g.module == "router"]
    assert len(routers) == 1 and routers[0].N == m.num_experts and routers[0].K == m.hidden_size
    latent = [g for g in gemms if g.module == "latent_proj"]
    assert len(latent) == (2 if m.moe_latent_size else 0)
    assert len([g for g in gemms if g.module == "shared_expert"]) == (2 if m.shared_ffn else 0)


@pytest.mark.parametrize("name", list(_variants()))
def test_routing_imbalance_and_grouping_reach_only_the_expert_matmuls(name: str) -> None:
    # Forced-balanced (random) routing against contiguous: the most-loaded rank computes routing_imbalance x
    # the mean rows of its experts and nothing else, so the forward's extra time is (load - 1) x the two expert
    # matmuls' time, each grouped over the rank's E/ep experts. The shapes come from the config, not the list;
    # at 4,096 tokens the grouped GEMMs are bound by their FLOPs, not by their weights' reads (checked).
    m = _variants()[name]
    plan = ParallelPlan(dp=64, ep=64, seq_len=4096, micro_batch=1, global_batch=64)
    flat = plan.model_copy(update={"moe_routing": "contiguous"})
    load = float(routing_imbalance(m, plan))
    assert load > 1.005
    total = sum(g.flops for g in layer_gemms(m, plan, True))
    scale = float(layer_flops(m, plan, True).gemm) / total / GPU.sustained_flops("bf16")
    experts = [g for g in layer_gemms(m, plan, True) if g.module == "expert"]
    groups = m.num_experts / plan.ep
    extra = 0.0
    for g, (rows, N, K) in zip(experts, _expert_shapes(m, plan)):
        compute = g.flops * load / grouped_gemm_efficiency(GPU, "bf16", rows, N, K, groups) * scale
        assert grouped_gemm_bytes("bf16", rows * load, N, K, groups) / (GPU.hbm_bytes_per_s * GPU.hbm_efficiency) < compute
        extra += compute * (load - 1) / load
    (fwd, _), (fwd0, _) = layer_gemm_seconds(m, plan, GPU, True), layer_gemm_seconds(m, flat, GPU, True)
    assert float(fwd - fwd0) == pytest.approx(extra, rel=1e-9)
