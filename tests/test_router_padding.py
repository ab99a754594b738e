"""Megatron-Core's routing-map padding for quantisation (ParallelPlan.moe_router_padding, docs/formulas.md#moe.router_padding,
docs/validation.md#fsdp-bits).

NVIDIA/Megatron-LM at cd4afffa6 (the Megatron-Bridge v0.6.0 pin): TransformerConfig.moe_router_padding_for_quantization
(alias moe_router_padding_for_fp8) needs fp8 / fp4; MoEAlltoAllTokenDispatcher.dispatch_preprocess pads the rank's
routing map with moe_utils.pad_routing_map (zeros turned into ones until each expert's count is a multiple of
get_align_size_for_quantization: 16 fp8, 32 MXFP8, 128 NVFP4, 256 on the op-fuser path) before the all-to-all;
_DeepepManager pads the dispatched map; skip_routed_expert_padding then drops TEGroupedMLP's padding copies;
_HybridEPManager never reads the switch.
"""

from __future__ import annotations

import math
import tracemalloc
from types import SimpleNamespace

import numpy as np
import pytest

from llmplan.cost.comm import ep_transfers
from llmplan.cost.elementwise import quant_padding_bytes
from llmplan.cost.gemm import expected_alignment_pad, layer_gemm_seconds, router_padding_align, router_padding_share
from llmplan.export.common import router_padding_refusal
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()


def _plan(**kw):
    base = dict(tp=1, pp=1, dp=64, ep=64, etp=1, micro_batch=1, global_batch=1024, seq_len=4096, dtype="fp8",
                recipe="mxfp8", moe_router_padding=True, expert_gemm="per-expert")  # TEGroupedMLP
    return ParallelPlan(**{**base, **kw})


def test_expected_pad_by_hand():
    # a fixed count n pads to the next multiple: 100 -> 128 (28 rows), 128 -> 0, 250 -> 256 (6) at 32
    assert expected_alignment_pad(100, 0, 32) == 28 and expected_alignment_pad(128, 0, 32) == 0
    assert expected_alignment_pad(250, 0, 32) == 6 and expected_alignment_pad(128, 0, 256) == 128
    # a count spread over many multiples of the alignment: the residue is uniform, (a - 1) / 2
    assert expected_alignment_pad(8192, 8000, 32) == pytest.approx(15.5, rel=1e-3)
    assert expected_alignment_pad(8192, 8000, 16) == pytest.approx(7.5, rel=1e-3)


def _binomial_pad(T: int, p: float, a: int) -> float:
    """E[(-n) mod a] for n ~ Binomial(T, p), the pmf from lgamma, summed to 12 sd above the mean (independent of
    the code under test)."""
    mu, sd = T * p, math.sqrt(T * p * (1 - p))
    total = 0.0
    for n in range(0, min(T, int(mu + 12 * sd + 20)) + 1):
        log_pmf = (math.lgamma(T + 1) - math.lgamma(n + 1) - math.lgamma(T - n + 1) + n * math.log(p)
                   + (T - n) * math.log1p(-p))
        total += math.exp(log_pmf) * ((-n) % a)
    return total


@pytest.mark.parametrize("T,p,a", [(64, 1 / 32, 16), (32, 1 / 32, 16), (64, 1 / 32, 256), (128, 1 / 32, 16),
                                   (520, 1 / 32, 16), (1024, 1 / 32, 32), (2048, 1 / 32, 32), (4096, 1 / 32, 32),
                                   (600, 1 / 32, 256), (8, 1 / 4, 16), (200, 1 / 4, 32), (131072, 1 / 32, 16)])
def test_expected_pad_matches_the_exact_binomial(T, p, a):
    """Before: a normal law clamped at 0 (the count 0 weighted once per clamped integer): DeepSeek-V3's 64 tokens a
    rank (E 256, k 8: Binomial(64, 1/32), mean 2) at 16 gave 6.6 rows against the binomial's 11.9."""
    assert expected_alignment_pad(T * p, T * p * (1 - p), a) == pytest.approx(_binomial_pad(T, p, a), rel=2e-3)


def test_expected_pad_arrays_do_not_grow_with_the_spread():
    """Before: a (2J + 1) x N array, J 6 sd: 12,000 x 2,000 floats for counts of sd 1,000."""
    mean = np.linspace(1.0, 1e6, 2000)
    tracemalloc.start()
    out = expected_alignment_pad(mean, mean * (31 / 32), 16)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert out.shape == (2000,) and peak < 64 * 2000 * 8 * 12
    assert np.allclose(out[mean > 1e4], 7.5, atol=1e-3)


def test_alignment_per_recipe():
    m = M["deepseek-v3"]
    assert router_padding_align(m, _plan()) == 32
    assert router_padding_align(m, _plan(recipe="blockwise")) == 16
    assert router_padding_align(m, _plan(dtype="fp4", recipe="nvfp4")) == 128
    # the op-fuser path (expert_gemm grouped, a GLU, etp 1): 256, whatever the recipe
    assert router_padding_align(m, _plan(expert_gemm="grouped")) == 256
    # random routing at 256: counts of mean 128 all pad to 256, one row more per row: share about 1
    assert router_padding_share(m, _plan(expert_gemm="grouped")) == pytest.approx(1.0, rel=0.01)


def test_share_by_hand_contiguous_routing():
    # DeepSeek-V3 (E 256, k 8), 4,000 tokens a rank, contiguous routing: every count 4000 x 8 / 256 = 125 exactly;
    # alltoall pads all 256 counts of the rank to 128 (3 rows each): 768 rows over 32,000; DeepEP pads the 4 local
    # experts' received counts, 64 x 125 = 8,000 -> 8,000 (aligned): 0
    m = M["deepseek-v3"]
    p = _plan(seq_len=4000, moe_routing="contiguous")
    assert router_padding_share(m, p) == pytest.approx(256 * 3 / 32_000)
    assert router_padding_share(m, p.model_copy(update={"moe_dispatcher": "deepep"})) == pytest.approx(0.0)
    # HybridEP pads in its dispatch and never reads the switch; bf16 / off: nothing
    assert router_padding_share(m, p.model_copy(update={"moe_dispatcher": "deepep", "moe_flex_backend": "hybridep"})) == 0
    assert router_padding_share(m, p.model_copy(update={"moe_router_padding": False})) == 0


def test_share_random_routing_about_half_the_alignment():
    # random routing: 256 counts of mean 128, sd sqrt(4096 x 8/256 x 31/32) = 11.1 (a third of 32): the pad averages
    # close to (32 - 1) / 2 = 15.5 rows, share 256 x 15.5 / 32,768 = 0.121
    m = M["deepseek-v3"]
    assert router_padding_share(m, _plan()) == pytest.approx(256 * 15.5 / 32_768, rel=0.02)


def test_padding_copies_skipped_and_rows_added():
    m = M["deepseek-v3"]
    gpu = builtin_systems()["dgx-b200"].gpu
    on, off = _plan(), _plan(moe_router_padding=False)
    assert quant_padding_bytes(m, on) == 0 and quant_padding_bytes(m, off) > 0
    share = router_padding_share(m, on)
    t_on = layer_gemm_seconds(m, on, gpu, True, only="expert")
    t_off = layer_gemm_seconds(m, off, gpu, True, only="expert")
    # the grouped GEMM's load goes from the imbalance x to (imbalance + share) x the mean rows
    from llmplan.cost.moe import routing_imbalance
    imb = routing_imbalance(m, off)
    assert float(t_on[0]) / float(t_off[0]) == pytest.approx((imb + share) / imb, rel=1e-9)
    # alltoall sends the padded rows; DeepEP pads after the dispatch
    def dispatched(p):
        return max(float(t.message) for t in ep_transfers(m, p, "ep") if t.collective == "all-to-all")
    assert dispatched(on) / dispatched(off) == pytest.approx((imb + share) / imb, rel=1e-9)
    dp_on, dp_off = (p.model_copy(update={"moe_dispatcher": "deepep"}) for p in (on, off))
    assert dispatched(dp_on) == pytest.approx(dispatched(dp_off))


def test_check_plan_needs_fp8_or_fp4_and_an_moe_model():
    cluster = ClusterSpec(system=builtin_systems()["dgx-b200"], num_nodes=8)
    m = M["deepseek-v3"]
    rules = [v.rule for v in check_plan(m, _plan(dtype="bf16", recipe="tensorwise"), cluster)]
    assert "moe_router_padding_quant" in rules
    assert "moe_router_padding_quant" not in [v.rule for v in check_plan(m, _plan(), cluster)]
    dense = ParallelPlan(dp=64, global_batch=1024, seq_len=4096, dtype="fp8", moe_router_padding=True)
    assert "moe_switches_dense" in [v.rule for v in check_plan(M["llama-3.1-8b"], dense, cluster)]


def test_launchers_without_megatron_refuse_it():
    what, bad, fix = router_padding_refusal(SimpleNamespace(plan=_plan(), model=M["deepseek-v3"]))
    assert bad and "moe_router_padding" in what and fix.startswith("re-plan with --no-moe-router-padding")
    assert not router_padding_refusal(SimpleNamespace(plan=_plan(moe_router_padding=False), model=M["deepseek-v3"]))[1]


def test_exports_write_megatrons_flag(cli, tmp_path):
    path = tmp_path / "plan.json"
    args = ("estimate", "--model", "qwen3-30b-a3b", "--hardware", "dgx-b200", "--nodes", "2", "--ep", "8",
            "--precision", "mxfp8", "--fp8-params", "--moe-router-padding", "--save", path)
    assert cli(*args).code == 0
    assert cli("export", path, "--to", "megatron", "-o", tmp_path / "meg").code == 0
    assert "--moe-router-padding-for-quantization" in (tmp_path / "meg" / "megatron_pretrain.sh").read_text()
    assert cli("export", path, "--to", "megatron-bridge", "-o", tmp_path / "br").code == 0
    assert "model.moe_router_padding_for_quantization=true" in (
        tmp_path / "br" / "megatron_bridge_pretrain.sh").read_text()
    msg = cli("export", path, "--to", "torchtitan", "-o", tmp_path / "tt").refusal()
    assert "moe_router_padding" in msg and "re-plan with --no-moe-router-padding" in msg


def test_vectorised_search_prices_it_as_the_scalar_estimate():
    from itertools import islice

    from agreement import assert_arrays_agree
    from llmplan.estimate import estimate_training
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    m, cluster = M["qwen3-30b-a3b"], ClusterSpec(system=builtin_systems()["dgx-b200"], num_nodes=2)
    w = Workload(global_batch=64, seq_len=4096, dtype="fp8", recipe="mxfp8", moe_router_padding=True)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    ok = (i for i in range(len(plans)) if plans.plan(i).ep > 1 and not check_plan(m, plans.plan(i), cluster))
    idx = list(islice(ok, 0, 200, 10))
    moved = [i for i in idx if float(estimate_training(m, cluster, plans.plan(i)).time.total) != float(
        estimate_training(m, cluster, plans.plan(i).model_copy(update={"moe_router_padding": False})).time.total)]
    assert len(moved) >= 3
    assert_arrays_agree(m, cluster, plans, idx)


def test_cli_refuses_it_without_fp8_or_fp4_in_one_line(cli):
    # Megatron-Core (cd4afffa6) refuses moe_router_padding_for_quantization without an fp8 / fp4 recipe
    line = cli("estimate", "--model", "qwen3-30b-a3b", "--hardware", "dgx-b200", "--nodes", "2", "--ep", "8",
               "--moe-router-padding").refusal()
    assert "moe_router_padding with dtype bf16" in line and "drop --moe-router-padding" in line, line
