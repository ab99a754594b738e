"""The classes of plans an export target refuses whole (export.EVERY_PLAN) beyond DeepSpeed's EP and torchtitan's
bf16 gradient reduction: torchtitan's (both releases) Muon, fp16 / fp32 training, gradient NaN check, Adam states
below fp32, fp32 master kept as remainders, SwiGLU input in fp8, FP8 attention, outer optimizer sharding,
activation and experts' fc1 offload, recompute of the first layers, and 0.3.0's fp8 tensorwise scaling; DeepSpeed's
Muon, context and sequence parallelism, gradient NaN check, fp8 / fp4 training, Adam states below fp32,
remainders, SwiGLU input in fp8, activation and experts' fc1 offload, hybrid sharding, FP8 attention and TP with PP;
Megatron-LM's and Megatron-Bridge's bf16 layers under fp8 delayed scaling and a bf16 / no master; Megatron-LM's FP8
attention; Megatron-Bridge's attention kernel other than native flash, fp8 moments and precision without a
preset (or weights / gradient reduction other than its preset's).

Each rule is the function the target's check calls, so the reason `search --target` gives for the plans it
passes over is the check's own sentence (first test); and a targeted search keeps what the walk that asks about
every plan keeps, with fewer asks (second test), as tests/test_walk_known.py holds for the walk itself."""

from __future__ import annotations

import dataclasses

import pytest

from llmplan.export import EVERY_PLAN, every_plan_mask, every_plan_reason, every_plan_reasons, refusal
from llmplan.search.grid import from_plan

FP8_DELAYED = {"dtype": "fp8", "recipe": "tensorwise", "fp8_scaling": "delayed"}
FP8_CURRENT = {**FP8_DELAYED, "fp8_scaling": "current"}
RULES = {  # (target, EVERY_PLAN key): the plan change that meets the rule, and words of its refusal
    ("torchtitan", "optimizer_dtypes"): ({"optimizer_moment_dtype": "bf16"}, "moments bf16 (torchtitan's AdamW"),
    ("torchtitan-0.2", "optimizer_dtypes"): ({"optimizer_master_dtype": "bf16"}, "optimizer states master bf16"),
    ("torchtitan", "param_remainders"): ({"param_remainders": True}, "kept as 16-bit remainders"),
    ("torchtitan-0.2", "param_remainders"): ({"param_remainders": True}, "kept as 16-bit remainders"),
    ("torchtitan", "fp8_attention"): ({"fp8_attention": True}, "FP8 dot-product attention"),
    ("torchtitan-0.2", "fp8_attention"): ({"fp8_attention": True}, "FP8 dot-product attention"),
    ("deepspeed", "cp"): ({"cp": 2, "dp": 4}, "context parallelism (cp 2)"),
    ("megatron", "bf16_layers"): ({**FP8_DELAYED, "bf16_layers_start": 1}, "layers kept in bf16 under fp8 delayed"),
    ("megatron-bridge", "bf16_layers"): ({**FP8_DELAYED, "fp8_params": True, "bf16_layers_end": 2},
                                         "layers kept in bf16 under fp8 delayed"),
    ("megatron-bridge", "precision"): (FP8_DELAYED, "weights not kept in fp8"),
    ("megatron-bridge", "preset_layers"): ({**FP8_CURRENT, "fp8_params": True},
                                           "0 / 0 layers kept in bf16 at the start / end with fp8 tensorwise"),
    ("torchtitan", "fp8_recipe"): (FP8_CURRENT, "fp8 tensorwise scaling (torchtitan 0.3.0's float8 config functions "
                                   "use rowwise scaling); re-plan with --precision fp8-rowwise"),
    ("torchtitan", "dtype"): ({"dtype": "fp16"}, "fp16 training (torchtitan trains in bf16 or float8)"),
    ("torchtitan-0.2", "dtype"): ({"dtype": "fp32"}, "fp32 training (torchtitan trains in bf16 or float8)"),
    ("deepspeed", "sp"): ({"tp": 2, "dp": 4, "sp": True}, "Megatron sequence parallelism"),
    ("deepspeed", "dtype"): (FP8_CURRENT, "fp8 training (Transformer Engine is configured in model code)"),
    ("deepspeed", "optimizer_dtypes"): ({"optimizer_moment_dtype": "bf16"}, "moments bf16 (this export writes"),
    ("deepspeed", "param_remainders"): ({"param_remainders": True}, "DeepSpeed keeps a whole fp32 master"),
    ("deepspeed", "offload_layers"): ({"offload_layers": 2}, "activation offload of 2 layers"),
    ("deepspeed", "dp_replicate"): ({"dp_replicate": 2}, "hybrid sharding over 2 replicas"),
    ("deepspeed", "offload_moe_act"): ({"offload_moe_act": True}, "offload of the experts' fc1 output"),
    ("deepspeed", "moe_paged_stash"): ({"moe_paged_stash": 1.2}, "paged stash of the experts' saved tensors"),
    ("torchtitan", "moe_paged_stash"): ({"moe_paged_stash": 1.2}, "this export writes no saved-tensor hooks"),
    ("deepspeed", "offload_modules"): ({"offload_modules": ("core_attn", "attn_proj")},
                                       "fine-grained activation offload of core_attn, attn_proj"),
    ("deepspeed", "fp8_attention"): ({"fp8_attention": True}, "FP8 dot-product attention (Transformer Engine's"),
    ("deepspeed", "tp_pp"): ({"tp": 2, "pp": 2, "dp": 2},
                             "tensor parallelism (AutoTP, tp 2) with pipeline parallelism (pp 2)"),
    ("torchtitan", "optimizer"): ({"optimizer": "muon"}, "the Muon optimizer (torchtitan's optimizer.name"),
    ("torchtitan-0.2", "grad_checks"): ({"grad_nan_check": True}, "gradient NaN check or 1/dp pre-scaling"),
    ("torchtitan", "swiglu_fp8_input"): ({"swiglu_fp8_input": True}, "the SwiGLU input kept in fp8"),
    ("torchtitan", "dp_outer_optimizer"): ({"dp_outer_optimizer": True}, "across the hybrid-sharding replicas"),
    ("torchtitan-0.2", "offload_moe_act"): ({"offload_moe_act": True}, "this export writes no offload hooks"),
    ("torchtitan-0.2", "offload_modules"): ({"offload_modules": ("core_attn",)},
                                            "fine-grained activation offload of core_attn"),
    ("torchtitan", "offload_layers"): ({"offload_layers": 2}, "activation offload of 2 layers"),
    ("torchtitan", "recompute_layers"): ({"recompute_layers": 2}, "full recompute of the first 2 layers"),
    ("deepspeed", "optimizer"): ({"optimizer": "muon"}, "DeepSpeed's applies it in its ZeRO optimizer"),
    ("deepspeed", "grad_checks"): ({"grad_prescale": True}, "gradient NaN check or 1/dp pre-scaling"),
    ("deepspeed", "swiglu_fp8_input"): ({"swiglu_fp8_input": True}, "the SwiGLU input kept in fp8"),
    ("torchtitan", "jit_activation"): ({"jit_activation": True}, "Megatron-Core's jit_fuser kernel"),
    ("torchtitan-0.2", "jit_activation"): ({"jit_activation": True}, "Megatron-Core's jit_fuser kernel"),
    ("deepspeed", "jit_activation"): ({"jit_activation": True}, "Megatron-Core's jit_fuser kernel"),
    ("megatron", "fp8_attention"): ({"fp8_attention": True}, "FP8 dot-product attention (Megatron-Core's"),
    ("megatron", "master_dtype"): ({"optimizer_master_dtype": "bf16"}, "optimizer master weights bf16 (Megatron-LM's"),
    ("megatron-bridge", "attention_kernel"): ({"attention_kernel": "flash2"}, "the flash2 attention kernel"),
    ("megatron-bridge", "master_dtype"): ({"optimizer_master_dtype": "none"}, "optimizer master weights none"),
    ("megatron-bridge", "fp8_moments"): ({"optimizer_moment_dtype": "fp8"}, "fp8 Adam moments"),
    # the unfused loss priced as another implementation than the launcher runs (export.common.UNFUSED_LOSS_RUNS):
    # Megatron-Core's in-place vocab_parallel_cross_entropy, or PyTorch's eager cross_entropy
    ("megatron", "unfused_loss_impl"): ({"fused_loss": False}, "unfused_loss_impl eager (fused_loss off), but "
                                        "this launcher runs vocab-parallel"),
    ("megatron-bridge", "unfused_loss_impl"): ({"fused_loss": False, "unfused_loss_impl": "vocab-parallel-copy"},
                                               "re-plan with --unfused-loss-impl vocab-parallel"),
    ("torchtitan", "unfused_loss_impl"): ({"fused_loss": False, "unfused_loss_impl": "vocab-parallel"},
                                          "this launcher runs eager"),
    ("torchtitan-0.2", "unfused_loss_impl"): ({"fused_loss": False, "unfused_loss_impl": "vocab-parallel"},
                                              "re-plan with --unfused-loss-impl eager"),
    ("deepspeed", "unfused_loss_impl"): ({"fused_loss": False, "unfused_loss_impl": "vocab-parallel"},
                                         "this launcher runs eager"),
}


@pytest.fixture(scope="module")
def accepted(tmp_path_factory):
    """`estimate --save` of Llama-3.1-8B on one DGX H100, data parallel over 8 GPUs with ZeRO 0: a plan every
    training target but DeepSpeed writes (BASE; asserted), so that a change below meets the one rule it is made for."""
    import contextlib
    import io

    from llmplan.cli import main
    from llmplan.planfile import load_plan

    path = tmp_path_factory.mktemp("every") / "plan.json"
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            main(["estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--tp", "1",
                  "--zero", "0", "--global-batch", "64", "--seq-len", "4096", "--save", str(path), "--json"])
    except SystemExit as e:
        assert not e.code
    return load_plan(path)


BASE = {"deepspeed": {"zero": 1, "grad_reduce": "all-reduce", "overlap_param_gather": False}}
"""A target's change to that plan for a plan it writes: DeepSpeed reduces fp32 gradients with ZeRO 1 (its
BF16_Optimizer), not without ZeRO, and gathers the weights inside the optimizer step (the synchronous gather)."""


@pytest.mark.parametrize("target, key", sorted(RULES))
def test_up_front_reason_is_the_checks_reason(accepted, target, key):
    """The plan changed to meet one rule: the export's refusal (its check) and the reason search --target gives
    up front for the plans it passes over (every_plan_reason, every_plan_mask on the plan's arrays) are the same
    sentence, and that rule is the one that says it."""
    change, words = RULES[(target, key)]
    base = dataclasses.replace(accepted, plan=accepted.plan.model_copy(update=BASE.get(target, {})))
    assert refusal(base, target) is None
    p = base.plan.model_copy(update=change)
    why = refusal(dataclasses.replace(base, plan=p), target)
    assert why is not None and words in why
    assert every_plan_reason(p, target) == why
    assert bool(every_plan_mask(from_plan(p), target)[0])
    rule = EVERY_PLAN[target][key]
    assert [r for r in EVERY_PLAN[target].values() if r(p)[1]][0] is rule
    assert not rule(base.plan)[1] and not every_plan_mask(from_plan(base.plan), target)[0]


SEARCHES = {  # (target, the workload switches of a search of Llama-3.1-8B on 1 DGX H100 that meet its rule)
    "torchtitan": ("torchtitan", {"optimizer_moment_dtype": "bf16"}),
    "torchtitan-remainders": ("torchtitan", {"param_remainders": True}),
    "torchtitan-0.2": ("torchtitan-0.2", {**FP8_CURRENT, "fp8_attention": True}),
    "deepspeed": ("deepspeed", {}),
    "megatron": ("megatron", {**FP8_DELAYED, "bf16_layers_start": 1}),
    "megatron-bridge": ("megatron-bridge", {**FP8_DELAYED, "fp8_params": True, "bf16_layers_end": 2}),
    "megatron-bridge-layers": ("megatron-bridge", {**FP8_CURRENT, "fp8_params": True}),
    "megatron-bridge-precision": ("megatron-bridge", FP8_DELAYED),
    "torchtitan-tensorwise": ("torchtitan", FP8_CURRENT),
    "torchtitan-fp16": ("torchtitan", {"dtype": "fp16"}),
    "deepspeed-fp8": ("deepspeed", FP8_CURRENT),
    "deepspeed-moments": ("deepspeed", {"optimizer_moment_dtype": "bf16"}),
    "torchtitan-muon": ("torchtitan", {"optimizer": "muon"}),
    "deepspeed-nan-check": ("deepspeed", {"grad_nan_check": True}),
    "megatron-master": ("megatron", {"optimizer_master_dtype": "bf16"}),
}


@pytest.mark.parametrize("name", sorted(SEARCHES))
def test_passing_over_the_class_keeps_the_search(name, monkeypatch):
    """keep_training (search --target's walk) with the rules against the walk that asks about every plan, no
    limit: the same rows kept (none where the search's switches are refused whole) and the same plans dropped
    above the last row, every plan passed over one the full walk asked about and found refused, fewer plans
    asked, and the plans passed over counted under the rule's words (the check's, first test)."""
    import llmplan.cli.target as cli_target
    from llmplan.planfile import plan_document
    from llmplan.report.training import estimate_json
    from llmplan.search import filtered
    from llmplan.search.grid import Workload, default_space
    from llmplan.search.run import search
    from llmplan.specs.plan import ClusterSpec, MemoryAllowance
    from llmplan.specs.registry import builtin_models, builtin_systems
    from llmplan.topology.placement import DEFAULT_ORDER

    m, cluster = builtin_models()["llama-3.1-8b"], ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=1)
    target, switches = SEARCHES[name]
    w = Workload(global_batch=64, seq_len=4096, **switches)
    doc_of = lambda e: plan_document(e, MemoryAllowance(), DEFAULT_ORDER, estimate_json(e))  # noqa: E731

    def kept():
        res = search(m, cluster, default_space(m, cluster, w, {}), w, top=5, keep_plans=True)
        return cli_target.keep_training(res, target, doc_of, 5)

    new = kept()
    with monkeypatch.context() as mp:
        mp.setattr(cli_target, "keep_accepted", lambda res, refused, top, known=None:
                   filtered.keep_accepted(res, refused, top, checks=10**6))
        old = kept()
    a, b = new.walk, old.walk
    assert a is not None and b is not None
    assert [e.plan for e in new.ranked] == [e.plan for e in old.ranked]
    assert (new.not_exportable, a.other_plan, a.complete) == (old.not_exportable, b.other_plan, b.complete)
    assert a.passed > 0 and b.passed == 0 and a.checked < b.checked
    assert (a.checked + a.passed, a.refused + a.passed) == (b.checked, b.refused)
    assert sum(new.refusals.values()) == sum(old.refusals.values())
    lp = new.layout_plans
    reasons = every_plan_reasons(lp.plans, target, a.passed_plans, lp.plan)
    assert sum(reasons.values()) == a.passed and all(new.refusals[k] >= n for k, n in reasons.items())
    first = {next(k for k, r in EVERY_PLAN[target].items() if r(lp.plan(i))[1]) for i in a.passed_plans}
    assert len(reasons) == len(first) and every_plan_reason(lp.plan(a.passed_plans[0]), target) in reasons
    if switches:  # the search's switches refused whole: no row, every plan passed over but the rows
        assert not new.ranked and a.checked <= 5


def test_plans_passed_over_are_counted_by_the_rule_that_refuses_each_first():
    """DeepSpeed refuses every plan with CP, every plan with EP, every plan with SP and every plan with both TP and
    PP, in that order in its check: over the plans of an MoE search marked by those rules, every_plan_reasons counts
    those with CP under CP's words, those with EP without CP under EP's, those with SP alone under SP's and the rest
    (TP with PP) under that rule's, not all of them under the first plan's rule."""
    import numpy as np

    from llmplan.search.grid import Workload, default_space, enumerate_plans
    from llmplan.specs.plan import ClusterSpec
    from llmplan.specs.registry import builtin_models, builtin_systems

    m, cluster = builtin_models()["qwen3-30b-a3b"], ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=2)
    w = Workload(global_batch=256, seq_len=4096)
    a = enumerate_plans(default_space(m, cluster, w), cluster, w)
    idx = np.flatnonzero(every_plan_mask(a, "deepspeed"))
    cp, ep, sp = np.asarray(a.cp)[idx] > 1, np.asarray(a.ep)[idx] > 1, np.asarray(a.sp)[idx]
    tp_pp = (np.asarray(a.tp)[idx] > 1) & (np.asarray(a.pp)[idx] > 1)  # AutoTP under the pipeline engine, last
    assert cp.any() and (ep & ~cp).any() and (sp & ~cp & ~ep).any() and (cp | ep | sp | tp_pp).all()
    reasons = every_plan_reasons(a, "deepspeed", idx.tolist(), a.plan)
    by_rule = {("context" if "context parallelism" in k else "expert" if "expert parallelism" in k else
                "sequence" if "sequence parallelism" in k else "autotp" if "with pipeline parallelism" in k else k): n
               for k, n in reasons.items()}
    expected = {"context": int(cp.sum()), "expert": int((ep & ~cp).sum()), "sequence": int((sp & ~cp & ~ep).sum()),
                "autotp": int((tp_pp & ~cp & ~ep & ~sp).sum())}
    assert by_rule == {k: n for k, n in expected.items() if n}
    for why in reasons:
        assert why.startswith("deepspeed cannot express this plan: ")


def test_blocks_are_every_rule_that_refuses_all_the_plans(accepted):
    """export.every_plan_blocks (what search --target names when every switch setting is refused): each rule that
    refuses every plan of the arrays, not only the first one each plan meets (every_plan_reason), in the check's
    order and words; a rule that refuses some of the plans only (DeepSpeed's CP over cp 1 and cp 2) is not one."""
    import numpy as np

    from llmplan.export import every_plan_blocks
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    from llmplan.specs.plan import ClusterSpec
    from llmplan.specs.registry import builtin_models, builtin_systems

    p = accepted.plan.model_copy(update={**FP8_DELAYED, "bf16_layers_start": 1})
    blocks = every_plan_blocks(from_plan(p), "megatron-bridge", lambda i: p)
    whats = [w for w, _ in blocks]
    assert len(blocks) == 3 and "weights not kept in fp8" in whats[0] and "under fp8 delayed" in whats[1]
    assert "1 / 0 layers kept in bf16" in whats[2] and "re-plan with --fp8-params" in blocks[0][1]
    first = every_plan_reason(p, "megatron-bridge")
    assert first == refusal(dataclasses.replace(accepted, plan=p), "megatron-bridge")
    assert first is not None and whats[0] in first and whats[1] not in first
    m, cluster = builtin_models()["llama-3.1-8b"], ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=2)
    w = Workload(global_batch=64, seq_len=4096)
    a = enumerate_plans(default_space(m, cluster, w), cluster, w)
    cp = np.asarray(a.cp)
    assert (cp > 1).any() and (cp == 1).any()
    assert every_plan_blocks(a, "deepspeed", a.plan) == []
    both = a.take(np.flatnonzero(cp > 1))
    words = [w for w, _ in every_plan_blocks(both, "deepspeed", both.plan)]
    assert words == [f"context parallelism (cp {both.plan(0).cp})"]


def test_jit_activation_refusal_names_both_gated_kernels():
    """jit_activation is allowed any gated MLP (check_plan rule jit_activation), GeGLU (GPT-OSS's quick GeGLU)
    as well as SwiGLU: the refusal, worded on the plan alone, names both of Megatron-Core's jit_fuser kernels
    (fusions/fused_bias_swiglu.py bias_swiglu_impl, fused_bias_geglu.py bias_geglu_impl), not SwiGLU's alone."""
    from llmplan.export.common import jit_activation_refusal
    from llmplan.specs.plan import ParallelPlan

    what, bad, _ = jit_activation_refusal(ParallelPlan(jit_activation=True))
    assert bad and "GeGLU" in what and "SwiGLU" in what and "bias_geglu_impl" in what


def test_a_targeted_search_prices_the_unfused_loss_its_launcher_runs(cli, tmp_path):
    # --unfused-loss with no --unfused-loss-impl: the untargeted search prices PyTorch's eager loss (the plan's
    # default), which Megatron-LM refuses (it runs Megatron-Core's in-place vocab_parallel_cross_entropy) in one
    # line naming the fix; --target megatron prices vocab-parallel (export.common.UNFUSED_LOSS_RUNS) and exports
    import json

    common = ("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--unfused-loss",
              "--global-batch", "64", "--seq-len", "4096")
    plain, targeted = tmp_path / "plain.json", tmp_path / "targeted.json"
    assert cli(*common, "--save", plain).code == 0
    assert json.loads(plain.read_text())["plan"]["unfused_loss_impl"] == "eager"
    r = cli("export", plain, "--to", "megatron", "-o", tmp_path / "plain")
    assert r.code == 2 and "re-plan with --unfused-loss-impl vocab-parallel" in r.err, r.err
    assert cli(*common, "--target", "megatron", "--save", targeted).code == 0
    assert json.loads(targeted.read_text())["plan"]["unfused_loss_impl"] == "vocab-parallel"
    assert cli("export", targeted, "--to", "megatron", "-o", tmp_path / "targeted").code == 0
