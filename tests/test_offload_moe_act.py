"""Fine-grained offload of the experts' fc1 output (ParallelPlan.offload_moe_act; Megatron-Core
--fine-grained-activation-offloading, the Nemotron-3 Ultra presets' fused_group_mlp offload):
docs/formulas.md#mem.offload_moe_act."""

from __future__ import annotations

from itertools import islice
import dataclasses


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import accuracy
from llmplan.cost.activations import dispatched_rows
from llmplan.cost.offload import moe_act_offload_bytes, moe_act_offload_exposed
from llmplan.cost.stages import stage_layers
from llmplan.estimate import estimate_training
from llmplan.specs.registry import builtin_models

M = builtin_models()
ULTRA = "mbridge-26.08-pretrain-nemotron-3-ultra-dgx-{}-256gpu-mxfp8-tp{}pp1cp1ep64vpnagbs256mbs1"


@pytest.mark.parametrize("gpu,tp,threshold", [("gb300", 1, 500_000_000), ("gb200", 2, 350_000_000)])
def test_the_ultra_presets_threshold_picks_fc1s_output_and_not_its_input(row_setup, gpu, tp, threshold):
    # Megatron-Bridge perf_recipes/nemotronh/{gb300,gb200}/nemotronh.py at 067f987d: min_offloaded_tensor_size
    # 500_000_000 on GB300 ("approximates offloading the moe_act input for seq 8192 / MBS 1") and 350_000_000 on
    # GB200; "FC1 output (activation input) is saved and offloaded to cpu". The priced fc1 output must be over
    # the published threshold and fc1's input (the latent-wide dispatched rows) under it.
    m, _, plan = row_setup(ULTRA.format(gpu, tp))
    assert plan.offload_moe_act and plan.recompute_modules == ("moe_act",)
    out_elements = moe_act_offload_bytes(m, plan) / 2
    in_elements = dispatched_rows(m, plan) * m.expert_width
    assert in_elements < threshold < out_elements


def test_offload_moe_act_moves_all_but_one_moe_layer_out_of_hbm(published_runs, row_setup):
    rec = published_runs[ULTRA.format("gb300", 1)]
    m, cluster, plan = row_setup(rec["id"])
    off = plan.model_copy(update={"offload_moe_act": False})
    with_, without = estimate_training(m, cluster, plan).memory, estimate_training(m, cluster, off).memory
    _, n_moe = stage_layers(m, plan, 0)
    moved = (n_moe - 1) * moe_act_offload_bytes(m, plan)  # one micro-batch in flight (pp 1); the margin keeps one
    assert without.activation_parts.offloaded == 0
    # host: each fc1 output (1,845,493,760 B: 2 B x the dispatched rows x f_e) is a fresh pinned tensor that
    # PyTorch's caching host allocator rounds to the next power of two, 2^31 (pytorch/pytorch v2.13.0
    # CachingHostAllocator.h, allocate: PowerOf2Ceil), 49 groups: 105,226,698,752 B (x1.164 the raw bytes)
    assert n_moe - 1 == 49 and moe_act_offload_bytes(m, plan) == pytest.approx(1_845_493_760)
    assert with_.activation_parts.offloaded == pytest.approx(49 * 2**31)
    assert without.activations - with_.activations == pytest.approx(moved)  # HBM (and its fragmentation share)
    assert without.total - with_.total >= moved
    # It ran on 288 GB GB300s (Megatron-Bridge 26.08 performance summary), so it must be predicted to fit
    got = {q: (p, meas) for q, p, meas in accuracy.predict(rec, accuracy.family(rec["id"]))}
    assert got["fits"] == (1.0, 1.0)
    assert not without.fits  # without the offload the preset would not fit as priced


def test_copy_schedule_by_hand():
    # 3 copies of 1.5 s, steps of 1 s, each due one step after its release: released at 1, 2, 3 (+ waits);
    # copy 0 done 2.5 (due 2: 0.5 late), copy 1 released 2.5, done 4.0 (due 3.5: 0.5), copy 2 released 4.0,
    # done 5.5 (due 5.0: 0.5): 1.5 s in all.
    assert moe_act_offload_exposed(1.5, 1.0, 3, 1.0) == pytest.approx(1.5)
    # a shorter window: each copy late by copy - window, the stream never idle behind the compute
    assert moe_act_offload_exposed(1.5, 1.0, 3, 0.5) == pytest.approx(3.0)


@settings(max_examples=60, derandomize=True, deadline=None)
@given(copy=st.floats(0.0, 5.0), step=st.floats(0.1, 5.0), share=st.floats(0.0, 1.0), n=st.integers(1, 60))
def test_copies_within_their_window_are_hidden_and_later_ones_are_not(copy, step, share, n):
    window = step * share
    exposed = moe_act_offload_exposed(copy, step, n, window)
    if copy <= window:
        assert exposed == pytest.approx(0.0, abs=1e-9)
    else:
        assert exposed >= copy - window - 1e-9  # at least the first copy's overrun
        assert exposed <= n * copy + 1e-9      # never more than the copies serialised


def test_ultra_offload_is_hidden_under_the_source_schedule(row_setup):
    # As priced, the GB300 row's 1.85 GB copy per MoE layer fits inside one MoE layer's forward and backward
    # window at the tray's host rate: the step time does not move.
    m, cluster, plan = row_setup(ULTRA.format("gb300", 1))
    on = estimate_training(m, cluster, plan)
    off = estimate_training(m, cluster, plan.model_copy(update={"offload_moe_act": False}))
    assert on.time.exposed["offload"] == 0.0
    assert float(on.time.total) == pytest.approx(float(off.time.total))


def test_a_dense_model_has_nothing_to_offload():
    from llmplan.specs.plan import ParallelPlan
    plan = ParallelPlan(tp=1, pp=1, dp=8, seq_len=4096, offload_moe_act=True)
    assert moe_act_offload_bytes(M["llama-3.1-8b"], plan) == 0.0


def _cluster(system: str, gpus: int):
    from llmplan.specs.plan import ClusterSpec
    from llmplan.specs.registry import builtin_systems
    s = builtin_systems()[system]
    return ClusterSpec(system=s, num_nodes=gpus // s.gpus_per_node)


QWEN = dict(tp=1, pp=1, dp=8, ep=8, seq_len=4096, global_batch=64, recompute="selective",
            recompute_modules=("moe_act",), offload_moe_act=True)


@pytest.mark.parametrize("update,rule", [
    ({"offload_layers": 4, "recompute": "none", "recompute_modules": ()}, "offload_moe_act_layers"),
    ({"recompute_modules": ("moe",)}, "offload_moe_act_recompute"),
])
def test_megatron_core_refuses_what_transformer_config_refuses(update, rule):
    # Megatron-LM transformer_config.py at 2a75ac12c: fine-grained offload not with cpu_offloading, nor inside
    # an MoE layer recomputed whole
    from llmplan.specs.check import check_plan
    from llmplan.specs.plan import ParallelPlan
    m, cluster = M["qwen3-30b-a3b"], _cluster("dgx-h100", 8)
    assert not check_plan(m, ParallelPlan(**QWEN), cluster)
    assert rule in [v.rule for v in check_plan(m, ParallelPlan(**{**QWEN, **update}), cluster)]


def test_exports_write_the_fine_grained_flags_or_refuse(tmp_path, cli):
    import json

    from llmplan.export import render_all
    from llmplan.export.common import CannotExpress
    from llmplan.planfile import load_plan
    path = tmp_path / "plan.json"
    made = cli("estimate", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--ep", "8", "--seq-len", "4096",
               "--global-batch", "64", "--recompute", "selective", "--recompute-modules", "moe_act",
               "--offload-moe-act", "--save", str(path))
    assert made.code == 0, made.err
    assert json.loads(path.read_text())["plan"]["offload_moe_act"] is True
    pf = load_plan(path)
    megatron = "\n".join(render_all(pf, "megatron")[0].values())
    bridge = "\n".join(render_all(pf, "megatron-bridge")[0].values())
    # Megatron-LM docs/user-guide/features/fine_grained_activation_offloading.md and arguments.py (2a75ac12c)
    assert "--fine-grained-activation-offloading" in megatron and "--offload-modules moe_act" in megatron
    assert "NVTE_CPU_OFFLOAD_V1=1" in megatron
    assert "model.fine_grained_activation_offloading=true" in bridge and "model.offload_modules=[moe_act]" in bridge
    no_ep = dataclasses.replace(pf, plan=pf.plan.model_copy(update={"ep": 1}))  # DeepSpeed refuses EP first
    with pytest.raises(CannotExpress, match="fc1 output"):
        render_all(no_ep, "deepspeed")
    titan = dataclasses.replace(no_ep, plan=no_ep.plan.model_copy(update={"recompute": "none",
                                                                          "recompute_modules": ()}))
    with pytest.raises(CannotExpress, match="fc1 output"):
        render_all(titan, "torchtitan")


def test_vectorised_search_agrees_with_the_scalar_estimate():
    # PCIe Gen5 (x86 DGX H100) at 64 GB/s: copies that may outlast their window, on plans of several PP / EP
    import numpy as np

    from llmplan.search.evaluate import evaluate
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    from llmplan.specs.check import check_plan
    m, cluster = M["qwen3-30b-a3b"], _cluster("dgx-h100", 16)
    w = Workload(global_batch=64, seq_len=4096, offload_moe_act=True)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    idx = list(islice((i for i in range(len(plans)) if not check_plan(m, plans.plan(i), cluster)), 30))
    assert idx
    vec = evaluate(m, cluster, plans.take(np.asarray(idx)))
    for j, i in enumerate(idx):
        scalar = estimate_training(m, cluster, plans.plan(i))
        assert float(vec.memory.activation_parts.offloaded[j]) == \
            pytest.approx(float(scalar.memory.activation_parts.offloaded), rel=1e-9)
        assert float(vec.step.total[j]) == pytest.approx(float(scalar.time.total), rel=1e-9)
        # full recompute saves nothing inside the layer: nothing to offload (cost.memory.activation_bytes)
        assert (float(scalar.memory.activation_parts.offloaded) > 0) == (plans.plan(i).recompute != "full")


def test_a_glu_offloads_gate_and_up():
    # SwiGLU experts: fc1 writes 2 f_e columns (gate and up), the activation's saved input (Qwen3-30B-A3B's
    # config.json: moe_intermediate_size 768, 8 of 128 experts per token)
    from llmplan.specs.plan import ParallelPlan
    m = M["qwen3-30b-a3b"]
    assert m.gated_mlp and m.expert_ffn == 768 and m.num_experts_per_tok == 8
    plan = ParallelPlan(tp=1, pp=1, dp=8, ep=8, seq_len=4096, global_batch=64, offload_moe_act=True)
    assert moe_act_offload_bytes(m, plan) == 2 * 4096 * 8 * 2 * 768


@pytest.mark.parametrize("model,flags,text", [
    ("qwen3-30b-a3b", ("--ep", "8", "--global-batch", "64", "--offload-activations-layers", "4"),
     "offload_moe_act with offload_layers (4)"),
    ("qwen3-30b-a3b", ("--ep", "8", "--global-batch", "64", "--recompute", "selective", "--recompute-modules", "moe"),
     "offload_moe_act with recompute module moe"),
    ("llama-3.1-8b", ("--global-batch", "8"), "llama-3.1-8b is dense; drop --offload-moe-act"),
])
def test_cli_refuses_what_megatron_core_refuses_in_one_line(cli, model, flags, text):
    # rules offload_moe_act_layers, offload_moe_act_recompute, moe_switches_dense: exit 2, the fix named
    line = cli("estimate", "--model", model, "--hardware", "dgx-h100", "--nodes", "1", "--offload-moe-act",
               *flags).refusal()
    assert text in line and "drop --" in line, line
