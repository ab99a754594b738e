"""Per-tensor fp8 scaling, delayed or current (ParallelPlan.fp8_scaling; docs/formulas.md#precision.fp8_scaling).
Transformer Engine's Float8CurrentScalingQuantizer::quantize_impl (transformer_engine/pytorch/csrc/quantizer.cpp
at v2.8) runs nvte_compute_amax_with_config over the bf16 input, then the scale, then the cast: one more read of
2 bytes an element, except where a fused norm wrote the input with its amax (quantize_with_amax,
csrc/extensions/normalization.cpp: the QKV and fc1 inputs of Megatron-Core's TE LayerNorm linears). Delayed
scaling (DelayedScaling) takes the scale from the amax history, the cast writing the new amax as a side output."""

from __future__ import annotations

from itertools import islice

import numpy as np
import pytest

from llmplan.cost.compute import fp8_cast_bytes
from llmplan.estimate import estimate_training
from llmplan.export import render_all
from llmplan.export.common import CannotExpress
from llmplan.planfile import load_plan
from llmplan.search.evaluate import evaluate
from llmplan.search.grid import Workload, default_space, enumerate_plans
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M, S = builtin_models(), builtin_systems()
PROJ = 4  # linear_proj's backward re-quantisation under save_original_input: read 2 + amax 2


def _extra_per_token(model: str, **plan) -> float:
    """Bytes per token and layer over the step (3 passes) that current scaling adds to the casts. Beside the amax
    reads, current scaling is where Megatron-Core sets save_original_input on the output projection (attention.py
    at d98e8a64dd): backward reads its input again (2 bytes) with a second amax read (2), PROJ bytes an element
    (docs/formulas.md#precision.save_original_input)."""
    base = ParallelPlan(dtype="fp8", recipe="tensorwise", seq_len=8192, micro_batch=1, global_batch=64, **plan)
    cur = base.model_copy(update={"fp8_scaling": "current"})
    m = M[model]
    return float(fp8_cast_bytes(m, cur, False) - fp8_cast_bytes(m, base, False)) * 3 / 8192


def test_golden_llama3_70b_tp4_sp():
    # Llama 3 70B (h 8192, 64 heads x 128, 8 KV heads, SwiGLU f 28672), TP4 with sequence parallelism. Inputs read
    # by an amax kernel, elements per token: forward, the output projection's input 64·128/4 = 2048 and fc2's
    # 28672/4 = 7168 (QKV and fc1 take the norm's amax); backward, the output gradients of QKV (64 + 2·8)·128/4 =
    # 2560 and fc1 2·28672/4 = 14336 (column-parallel: each rank its own, no amax all-reduce), and of the output
    # projection and fc2, cast on the rank's sequence shard before TP gathers them, 8192/4 each (linear.py
    # _customize_quantizers_float8_current_scaling: row-parallel grad_output with_amax_reduction under SP).
    elements = 2048 + 7168 + 2560 + 14336 + 2 * 2048
    assert elements == 30208
    assert _extra_per_token("llama-3.1-70b", tp=4, sp=True, dp=2) == pytest.approx(2 * elements + PROJ * 2048,
                                                                                    rel=1e-12)


def test_golden_llama3_8b_tp1():
    # Llama 3 8B (h 4096, 32 x 128, 8 KV, f 14336), TP1: forward 4096 + 14336; backward QKV (32 + 16)·128 = 6144,
    # fc1 2·14336 = 28672, output projection and fc2 4096 each: 61,440 elements, 2 bytes each.
    assert _extra_per_token("llama-3.1-8b", tp=1, dp=8) == pytest.approx(2 * (4096 + 14336 + 6144 + 28672 + 8192)
                                                                      + PROJ * 4096)


def test_golden_mixtral_moe_count():
    # Mixtral 8x7B (h 4096, 32 x 128 query heads, 8 KV heads, top-2 of f_e 14336, SwiGLU), TP1: every cast but the
    # QKV input (the norm's) reads its input once more (2 bytes). Attention: the output projection's input 4096,
    # its output gradient 4096 and QKV's (32 + 2·8)·128 = 6144; the routed experts on the k = 2 permuted rows of
    # each token (docs/formulas.md#moe.expert_casts): fc1's input 2·4096 and fc2's output gradient 2·4096, fc2's
    # input 2·14336 and fc1's output gradient 2·2·14336.
    m = M["mixtral-8x7b"]
    base = ParallelPlan(dtype="fp8", recipe="tensorwise", seq_len=8192, global_batch=64, dp=8)
    cur = base.model_copy(update={"fp8_scaling": "current"})
    extra = float(fp8_cast_bytes(m, cur, True) - fp8_cast_bytes(m, base, True)) * 3 / 8192
    assert extra == pytest.approx(2 * (4096 + 4096 + 6144 + 2 * 2 * 4096 + 3 * 2 * 14336) + PROJ * 4096)


@pytest.mark.parametrize("dtype,recipe", [("fp8", "mxfp8"), ("fp8", "blockwise"), ("fp8", "rowwise"),
                                          ("fp4", "nvfp4"), ("bf16", "tensorwise")])
def test_only_fp8_tensorwise_reads_the_switch(dtype, recipe):
    m, cluster = M["llama-3.1-70b"], ClusterSpec(system=S["dgx-b200"], num_nodes=2)
    base = ParallelPlan(dtype=dtype, recipe=recipe, tp=4, sp=True, dp=4, seq_len=8192, global_batch=64)
    cur = base.model_copy(update={"fp8_scaling": "current"})
    assert fp8_cast_bytes(m, cur, False) == fp8_cast_bytes(m, base, False)
    assert [v.rule for v in check_plan(m, cur, cluster)] == ["fp8_scaling_tensorwise"]
    assert not check_plan(m, base, cluster)


def test_the_search_prices_the_switch_as_the_scalar_estimate():
    m, cluster = M["llama-3.1-70b"], ClusterSpec(system=S["dgx-h100"], num_nodes=4)
    w = Workload(global_batch=64, seq_len=8192, dtype="fp8", recipe="tensorwise", fp8_scaling="current")
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    ok = (i for i in np.random.default_rng(3).permutation(len(plans)) if not check_plan(m, plans.plan(int(i)), cluster))
    idx = np.asarray(list(islice(ok, 12)))
    assert any(plans.plan(int(i)).tp > 1 and plans.plan(int(i)).sp for i in idx)
    vec = evaluate(m, cluster, plans.take(idx))
    for j, i in enumerate(idx):
        plan = plans.plan(int(i))
        assert plan.fp8_scaling == "current"
        assert float(vec.step.total[j]) == pytest.approx(float(estimate_training(m, cluster, plan).time.total),
                                                         rel=1e-9)
        delayed = plan.model_copy(update={"fp8_scaling": "delayed"})
        assert estimate_training(m, cluster, plan).time.total > estimate_training(m, cluster, delayed).time.total


ARGS = ("estimate", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "8", "--tp", "4", "--pp", "4")


def test_cli_switch(cli):
    delayed = cli(*ARGS, "--precision", "fp8-tensorwise", "--json")
    current = cli(*ARGS, "--precision", "fp8-tensorwise", "--fp8-scaling", "current", "--json")
    assert delayed.code == 0 and current.code == 0, current.err
    assert delayed.json()["plan"]["fp8_scaling"] == "delayed" and current.json()["plan"]["fp8_scaling"] == "current"
    assert current.json()["time"]["step_s"] > delayed.json()["time"]["step_s"]
    r = cli(*ARGS, "--precision", "fp8-tensorwise", "--fp8-scaling", "dynamic")
    assert r.code == 2
    assert r.err.strip() == ("error: --fp8-scaling dynamic is not a per-tensor fp8 scaling: it must be one of delayed, "
                            "current; give --fp8-scaling with one of them")
    r = cli(*ARGS, "--fp8-scaling", "current")  # bf16: check_plan's rule, one line
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and len(lines) == 1 and "fp8_scaling current with dtype bf16" in lines[0], r.err


def _plan_file(**changes):
    from pathlib import Path
    pf = load_plan(Path(__file__).parent / "data" / "plans" / "dense_train.json")  # llama-3.1-70b, tp8 pp4
    import dataclasses
    return dataclasses.replace(pf, plan=pf.plan.model_copy(update=changes))


def test_exports_write_the_scaling():
    from test_export import parse_megatron
    # Megatron-LM --fp8-recipe: 'tensorwise' is per-tensor current scaling (TransformerConfig.fp8_recipe docstring)
    ns, _ = parse_megatron(render_all(_plan_file(dtype="fp8", fp8_scaling="current"), "megatron")[0]
                           ["megatron_pretrain.sh"])
    assert ns.fp8_recipe == "tensorwise" and ns.fp8_format == "hybrid"
    # delayed: not written, Megatron-Core's TransformerConfig.fp8_recipe defaults to "delayed" (d98e8a6)
    ns, _ = parse_megatron(render_all(_plan_file(dtype="fp8"), "megatron")[0]["megatron_pretrain.sh"])
    assert ns.fp8_recipe is None and ns.fp8_format == "hybrid"
    # Megatron-Core: "Delayed scaling does not support first / last layer in BF16."
    with pytest.raises(CannotExpress, match="--fp8-scaling current"):
        render_all(_plan_file(dtype="fp8", bf16_layers_start=1, bf16_layers_end=1), "megatron")
    # torchtitan's float8 converter: torchao dynamic (current) scaling only
    with pytest.raises(CannotExpress, match="--fp8-scaling current"):
        render_all(_plan_file(dtype="fp8", tp_impl="dtensor", zero=2, recompute="full"), "torchtitan-0.2")
    # torchtitan 0.3.0 refuses per-tensor fp8 whole, delayed or current: its refusal names the recipe that works
    with pytest.raises(CannotExpress, match="--precision fp8-rowwise"):
        render_all(_plan_file(dtype="fp8", tp_impl="dtensor", zero=2, recompute="full"), "torchtitan")
    # Megatron-Bridge: bf16 layers under delayed scaling name the scaling that keeps them
    with pytest.raises(CannotExpress, match="--fp8-scaling current"):
        render_all(_plan_file(dtype="fp8", fp8_params=True, bf16_layers_start=1, bf16_layers_end=1),
                   "megatron-bridge")
    # torchtitan v0.2.2 registers the converter as "quantize.linear.float8" (73a0e69, components/quantization/
    # float8.py) and turns float8 TP on only for the old name "float8": current scaling at tp 1 is written, at tp 8
    # refused (docs/validation.md#torchao-fsdp)
    with pytest.raises(CannotExpress, match="float8 tensor parallelism"):
        render_all(_plan_file(dtype="fp8", tp_impl="dtensor", zero=2, recompute="full", fp8_scaling="current"),
                   "torchtitan-0.2")
    toml = render_all(_plan_file(dtype="fp8", tp=1, tp_impl="dtensor", zero=2, recompute="full",
                                 fp8_scaling="current"), "torchtitan-0.2")
    assert 'converters = ["quantize.linear.float8"]' in toml[0]["torchtitan-v0.2.2.toml"]


@pytest.mark.parametrize("rid,scaling", [
    ("bridge-2602-h100-fp8-cs-llama3-70b-64gpu-gbs256", "current"),
    ("mbridge-26.04-pretrain-llama3-70b-dgx-h100-64gpu-fp8-tp4pp8cp1epnavp5gbs256mbs1", "current"),
    ("torchtitan-2412-t4-llama31-70b-256gpu-2d", "current"),
    ("dgxc-2510-pretrain-nemotron-h-56b-gb200-128gpu-fp8-tp4pp1mbs2gbs384", "current"),
    ("dgxc-2508-pretrain-nemotron-h-56b-h100-128gpu-fp8-tp8pp1mbs1gbs384", "delayed"),
    ("nemo2407-pretrain-gpt3-20b-64gpu-gbs256", "delayed"),
    ("megatron-examples-fp8-llama3-70b-64gpu", "delayed"),
    ("mpt-h100_80gb-amp_fp8-3b-s8192-g8-mbs3-gbs144", "delayed"),
])
def test_validation_rows_read_as_their_stacks_ran(row_setup, rid, scaling):
    plan = row_setup(rid)[2]
    assert plan.dtype == "fp8" and plan.recipe == "tensorwise" and plan.fp8_scaling == scaling


def test_a_plan_file_from_before_the_field_reads_as_current_scaling(tmp_path):
    # Files written before fp8_scaling existed were exported as current scaling by every target (Megatron-LM
    # --fp8-recipe tensorwise, torchtitan's dynamic float8): loaded, they keep meaning what they ran.
    import json
    from pathlib import Path
    doc = json.loads((Path(__file__).parent / "data" / "plans" / "dense_train.json").read_text())
    doc["plan"]["dtype"] = "fp8"
    doc["plan"].pop("fp8_scaling", None)
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    assert load_plan(old).plan.fp8_scaling == "current"
    doc["plan"]["fp8_scaling"] = "delayed"  # a file that says delayed is read as delayed
    new = tmp_path / "new.json"
    new.write_text(json.dumps(doc))
    assert load_plan(new).plan.fp8_scaling == "delayed"
