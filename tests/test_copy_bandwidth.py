"""The MoE sort-by-local-expert copy priced at a streaming copy's published HBM bandwidth
(GpuSpec.copy_hbm_efficiency, docs/formulas.md#compute.copy_bandwidth), not at the norm kernels' share.

Published rates: meta-pytorch/KernelAgent oink/README.md at a3001c70f5 (GB300, STREAM-like triad, 7,140 GB/s of
8,000); Azure/AI-benchmarking-guide Azure_Results/ND_H100_v5_results.md and ND_H200_v5_results.md at 8fd0c6e1bd
(BabelStream copy, 2.90 TB/s of 3.35 and 4.01 of 4.8)."""
import pytest

from llmplan.cost.compute import layer_seconds, memory_seconds
from llmplan.cost.elementwise import alltoall_sort_bytes, alltoall_sort_layer_bytes
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_gpus, builtin_models

G = builtin_gpus()
M = builtin_models()


@pytest.mark.parametrize("gpu, published", [("gb300", 7140 / 8000), ("h100-sxm", 2.90 / 3.35), ("h200", 4.01 / 4.8)])
def test_profiles_carry_the_published_copy_share(gpu, published):
    assert G[gpu].copy_hbm_efficiency == pytest.approx(published, abs=0.005)
    assert G[gpu].copy_hbm_efficiency > G[gpu].hbm_efficiency  # a copy outruns the norms' read-modify-write


def test_same_die_profiles_share_it_and_unpublished_ones_keep_the_norm_share():
    assert G["b300"].copy_hbm_efficiency == G["gb300"].copy_hbm_efficiency
    assert G["h800"].copy_hbm_efficiency == G["h100-sxm"].copy_hbm_efficiency
    gb200 = G["gb200"]  # no STREAM-like run of the B200 die is published
    assert gb200.copy_hbm_efficiency is None
    assert gb200.copy_achieved_bytes_per_s == gb200.hbm_achieved_bytes_per_s


def test_memory_seconds_by_hand():
    gpu = G["gb300"]
    total, copies = 10e9, 4e9
    expected = 6e9 / (8000e9 * 0.68) + 4e9 / (8000e9 * 0.89)
    assert memory_seconds(total, copies, gpu) == pytest.approx(expected, rel=1e-12)


def test_the_layer_prices_only_the_sort_at_the_copy_rate():
    m, gpu = M["qwen3-235b-a22b"], G["gb300"]
    plan = ParallelPlan(dp=8, ep=8, seq_len=4096, micro_batch=1)  # alltoall, 16 local experts: two sorts each way
    plain = gpu.model_copy(update={"copy_hbm_efficiency": None})
    sorts = alltoall_sort_layer_bytes(m, plan)
    assert sorts == pytest.approx(alltoall_sort_bytes(m, plan) * 4096)
    saved = layer_seconds(m, plan, plain, True)[2] - layer_seconds(m, plan, gpu, True)[2]
    assert saved == pytest.approx(sorts / gpu.hbm_achieved_bytes_per_s - sorts / gpu.copy_achieved_bytes_per_s,
                                  rel=1e-9)
    assert saved > 0


def test_the_moe_rerun_adds_the_forward_half_and_other_dispatchers_no_sort():
    m = M["qwen3-235b-a22b"]
    base = ParallelPlan(dp=8, ep=8, seq_len=4096)
    rerun = ParallelPlan(dp=8, ep=8, seq_len=4096, recompute="selective", recompute_modules=("moe",))
    assert alltoall_sort_layer_bytes(m, rerun) == pytest.approx(1.5 * alltoall_sort_layer_bytes(m, base))
    flex = ParallelPlan(dp=8, ep=8, seq_len=4096, moe_dispatcher="deepep", moe_flex_backend="hybridep")
    assert alltoall_sort_layer_bytes(m, flex) == 0.0
