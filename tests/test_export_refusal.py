"""export.refusal (the checks alone, what `search --target` asks) agrees with the full render `export` runs:
for many valid plans drawn at random across models and every target, the same answer, accepted or refused, and
the same refusal text. The render is the oracle: a plan is refused exactly when render_all raises CannotExpress,
and the reason is its message."""

from __future__ import annotations

import dataclasses
import random
import typing

import pytest

from llmplan.export import EVERY_PLAN, SERVE_TARGETS, TRAIN_TARGETS, every_plan_refusal, refusal, render_all
from llmplan.export.common import CannotExpress
from llmplan.export.megatron import connections_refusal
from llmplan.planfile import load_plan
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ParallelPlan

TRAIN_FILES = {  # estimate --save of each: a dense, an MoE, a hybrid (Mamba) and an MLA MoE model
    "dense": ["--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "2", "--tp", "2", "--pp", "2"],
    "moe": ["--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--nodes", "2", "--tp", "2", "--ep", "8"],
    "hybrid": ["--model", "nemotron-3-super", "--hardware", "gb200-nvl72", "--nodes", "8", "--precision", "nvfp4"],
    "mla": ["--model", "deepseek-v3", "--hardware", "dgx-h100", "--nodes", "32", "--pp", "8", "--pp-first-layers", "7", "--pp-last-layers", "6", "--ep", "32"],
}
SKIP = {"tp", "pp", "dp", "cp", "ep", "global_batch", "seq_len", "pp_layers", "pp_layout", "tp_overlap_sms",
        "tp_overlap_margin_sms"}
"""Fields the draw leaves as saved (the layout; tuples of numbers) or sets below (degrees)."""
MODULE_RECIPES = {"mxfp8_modules": ("mamba_out_proj",), "bf16_modules": ("attention",)}
"""Megatron-Bridge's module recipes (modules in their own format under NVFP4), set on purpose on the NVFP4
hybrid's plans (module_recipe_plans) rather than left to the draw."""


def full_render(pf, target: str) -> str | None:
    """The oracle: the CannotExpress message of the full render, or None where it writes the files."""
    try:
        render_all(pf, target)
    except CannotExpress as e:
        return str(e)
    return None


def choices(name: str, annotation) -> list:
    """The values the draw tries for one plan field: each literal, both booleans, a few small integers; an optional
    integer unset, 1 or 8; a tuple of literals empty or holding its first or its last literal."""
    args = typing.get_args(annotation)
    if annotation is bool:
        return [False, True]
    if typing.get_origin(annotation) is tuple and len(args) == 2 and args[1] is Ellipsis \
            and typing.get_origin(args[0]) is typing.Literal:
        literals = typing.get_args(args[0])
        return [(), *dict.fromkeys([(literals[0],), (literals[-1],)])]
    if typing.get_origin(annotation) is typing.Union and args == (int, type(None)):
        return [None, 1, 8]
    if typing.get_origin(annotation) is typing.Literal:
        return list(args)
    if typing.get_origin(annotation) is typing.Union and args and typing.get_origin(args[0]) is typing.Literal:
        return [None, *typing.get_args(args[0])]
    if annotation is int and name in ("zero",):
        return [0, 1, 2, 3]
    if annotation is int and name in ("vpp", "micro_batch", "etp", "dp_replicate"):
        return [1, 2]
    return []


DRAW_RATE = 0.04
"""The chance each drawn field is set on a drawn plan (about 3 of the 83 fields the draw takes in 2026-12)."""


def draw_fields() -> dict[str, list]:
    """The plan fields the draw sets and the values it tries for each (choices), SKIP left out."""
    fields = {k: choices(k, f.annotation) for k, f in ParallelPlan.model_fields.items() if k not in SKIP}
    return {k: v for k, v in fields.items() if v}


def keyed(seed: str, i: int, key: str) -> random.Random:
    """The random stream of one draw decision: plan attempt `i`, field (or 'layout') `key`. Each decision has its own
    stream, so a field added to ParallelPlan (or a value added to one field's choices) changes only the plans that
    draw that field: the other fields' draws, and the plans that do not draw it, stay as they were. (One stream over
    `sorted(fields)` used to reshuffle every plan whenever a field was added, which moved the module-recipe and
    queue-count rules in and out of the draw: ad2d0aa1, f47eec20, a4106bc2.)"""
    return random.Random(f"{seed}/{i}/{key}")


def drawn_plan(pf, seed: str, i: int, fields: dict[str, list]) -> ParallelPlan | None:
    """Attempt `i` of the draw: the saved plan with each field set with chance DRAW_RATE to one of its values, and
    the tensor / data / expert degrees reshuffled over the same GPUs; None where ParallelPlan rejects the mix."""
    base, gpus = pf.plan, pf.cluster.num_gpus
    update = {}
    for k, values in fields.items():
        r = keyed(seed, i, k)
        if r.random() < DRAW_RATE:
            update[k] = r.choice(values)
    r = keyed(seed, i, "layout")
    tp = r.choice([t for t in (1, 2, 4, 8) if gpus % (t * base.pp * base.cp) == 0])
    update.update(tp=tp, dp=gpus // (tp * base.pp * base.cp), sp=tp > 1 and r.random() < 0.7)
    if base.ep > 1:
        update["ep"] = r.choice([e for e in (1, 2, 4, 8, 16, 32) if e <= base.ep])
    try:
        return ParallelPlan.model_validate({**base.model_dump(), **update})
    except ValueError:
        return None


def drawn_plans(pf, seed: str, n: int, tries: int = 4000, fields: dict[str, list] | None = None) -> list[ParallelPlan]:
    """Up to `n` plans check_plan accepts, other than the saved one, from attempts 0, 1, ... of the draw (drawn_plan)."""
    fields = draw_fields() if fields is None else fields
    out: list[ParallelPlan] = []
    for i in range(tries):
        if len(out) == n:
            break
        p = drawn_plan(pf, seed, i, fields)
        if p is not None and p != pf.plan and not check_plan(pf.model, p, pf.cluster):
            out.append(p)
    return out


def module_recipe_plans(pf, drawn: list[ParallelPlan]) -> list[ParallelPlan]:
    """For each module recipe (MODULE_RECIPES), the saved plan and the first three drawn plans with it set, those
    check_plan accepts: the rules Megatron-Bridge's module recipes meet, on plans the test chooses."""
    out = []
    for field, value in MODULE_RECIPES.items():
        with_it = [p.model_copy(update={field: value}) for p in [pf.plan, *drawn[:3]]]
        out += [p for p in with_it if not check_plan(pf.model, p, pf.cluster)]
    return out


def tp2_variant(pf) -> ParallelPlan:
    """The saved plan at TP 2 with sequence parallelism, the data degree taking up the rest of the GPUs."""
    p = pf.plan
    return ParallelPlan.model_validate({**p.model_dump(), "tp": 2, "sp": True,
                                        "dp": pf.cluster.num_gpus // (2 * p.pp * p.cp)})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The plan files `estimate --save` writes for TRAIN_FILES and one serving plan, loaded as export loads them."""
    from llmplan.cli import main

    folder = tmp_path_factory.mktemp("plans")
    out = {}
    for name, args in [*TRAIN_FILES.items(),
                       ("serve", ["--mode", "infer", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100",
                                  "--nodes", "1", "--tp", "4", "--dp", "2"])]:
        path = folder / f"{name}.json"
        with pytest.raises(SystemExit) as e:
            main(["estimate", *args, "--save", str(path), "--force", "--json"])
        assert e.value.code in (0, None)
        out[name] = load_plan(path)
    return out


@pytest.mark.parametrize("name", sorted(TRAIN_FILES))
def test_refusal_agrees_with_the_render_on_random_training_plans(saved, name):
    """Every training target, on the saved plan and on up to 60 valid plans drawn from it: refusal (the checks)
    and the full render give the same answer and the same text. The draw meets both outcomes for each file."""
    pf = saved[name]
    # 80 on the hybrid file, whose plans fail check_plan more often (its module recipes are chosen below)
    plans = [pf.plan, *drawn_plans(pf, f"refusal-{name}", 80 if name == "hybrid" else 60)]
    assert len(plans) > 20
    if name == "hybrid":  # Megatron-Bridge's module recipes on the NVFP4 hybrid, chosen, not drawn
        chosen = module_recipe_plans(pf, plans[1:])
        assert {f for f in MODULE_RECIPES for p in chosen if getattr(p, f)} == set(MODULE_RECIPES), chosen
        plans += chosen
    else:  # Megatron-LM's queue assert (an optional integer): CUDA_DEVICE_MAX_CONNECTIONS chosen, not drawn, on the
        # saved plan, its TP 2 variant (the assert needs TP or CP > 1; the MLA file saves TP 1) and two drawn plans
        queues = [p.model_copy(update={"cuda_max_connections": v}) for v in (1, 8)
                  for p in [pf.plan, tp2_variant(pf), *plans[1:3]]]
        queues = [p for p in queues if not check_plan(pf.model, p, pf.cluster)]
        # the chosen plans meet the rule whatever the draw gives
        assert any(connections_refusal(dataclasses.replace(pf, plan=p))[1] for p in queues), queues
        plans += queues
    seen = set()
    for p in plans:
        one = dataclasses.replace(pf, plan=p)
        for target in TRAIN_TARGETS:
            want = full_render(one, target)
            assert refusal(one, target) == want, (target, p)
            seen.add(want is None)
    assert seen == {True, False}


def test_refusal_agrees_with_the_render_on_serving_plans(saved):
    """vLLM's one plan rule (ep = tp x dp) and SGLang's none, and both refuse a training plan: the same text."""
    pf = saved["serve"]
    seen = set()
    for ep in (1, 2, 4, 8):
        one = dataclasses.replace(pf, plan=pf.plan.model_copy(update={"ep": ep}))
        for target in SERVE_TARGETS:
            want = full_render(one, target)
            assert refusal(one, target) == want, (target, ep)
            seen.add(want is None)
    train = saved["dense"]
    for target in (*SERVE_TARGETS, *TRAIN_TARGETS):
        other = train if target in SERVE_TARGETS else pf
        assert refusal(other, target) == full_render(other, target) is not None
    assert seen == {True, False}


def test_every_plan_refusal_holds_for_every_drawn_plan(saved):
    """Where a target says it refuses every plan with EP (EVERY_PLAN), the full render refuses every drawn MoE
    plan with EP, in those words wherever no earlier rule of its check is met (and the draw meets such a plan);
    every other target says nothing of the kind."""
    pf = saved["moe"]
    plans = [p for p in drawn_plans(pf, "every-plan", 80) if p.ep > 1]
    assert len(plans) > 20 and {t for t, rules in EVERY_PLAN.items() if "ep" in rules} == {"deepspeed"}
    worded = 0
    for p in plans:
        why = every_plan_refusal(p, "deepspeed", "ep", p.ep)
        got = full_render(dataclasses.replace(pf, plan=p), "deepspeed")
        assert why is not None and got is not None
        worded += got == why
        assert all(every_plan_refusal(p, t, "ep", p.ep) is None for t in TRAIN_TARGETS if t != "deepspeed")
    assert worded
    assert every_plan_refusal(pf.plan, "deepspeed", "ep", 1) is None


def test_every_plan_mask_agrees_with_refusal(saved):
    """export.every_plan_mask (EVERY_PLAN's rules on the plan arrays, what `search --target` passes over) marks a
    plan exactly where its rule, called on that one plan, says so; every plan marked is refused (`refusal`), and
    the draw meets plans marked and not. On drawn plans one at a time (from_plan) and on random rows of the
    search's arrays of the MoE file at once."""
    import numpy as np

    from llmplan.export import every_plan_mask
    from llmplan.search.grid import Workload, default_space, enumerate_plans, from_plan

    for name in sorted(TRAIN_FILES):
        pf = saved[name]
        for p in drawn_plans(pf, f"mask-{name}", 30):
            for target in TRAIN_TARGETS:
                marked = bool(every_plan_mask(from_plan(p), target)[0])
                assert marked == any(rule(p)[1] for rule in EVERY_PLAN.get(target, {}).values()), (target, p)
                assert not marked or refusal(dataclasses.replace(pf, plan=p), target) is not None
    pf = saved["moe"]
    w = Workload.of(pf.plan)
    a = enumerate_plans(default_space(pf.model, pf.cluster, w), pf.cluster, w)
    rows = [i for i in random.Random("mask-arrays").sample(range(len(a)), 3000)
            if not check_plan(pf.model, a.plan(i), pf.cluster)][:200]
    assert len(rows) > 50
    for target in TRAIN_TARGETS:
        mask = every_plan_mask(a, target)
        for i in rows:
            p = a.plan(i)
            assert bool(mask[i]) == any(rule(p)[1] for rule in EVERY_PLAN.get(target, {}).values()), (target, i)
            assert not mask[i] or refusal(dataclasses.replace(pf, plan=p), target) is not None
    assert len({bool(x) for x in np.asarray(every_plan_mask(a, "deepspeed"))[rows]}) == 2
    for target in ("torchtitan", "torchtitan-0.2"):  # a workload switch it refuses whole: every plan, or none
        bf16 = dataclasses.replace(a, w=Workload(**{**w.fields(), "grad_dtype": "bf16"}), memo={})
        assert every_plan_mask(bf16, target).all() and not every_plan_mask(a, target).any()
        p = bf16.plan(rows[0])
        assert "bf16 gradient reduction" in str(refusal(dataclasses.replace(pf, plan=p), target))


def test_megatron_refuses_the_param_gather_overlap_without_the_reduce_overlap(saved):
    """Megatron-LM's validate_args asserts --overlap-grad-reduce beside --overlap-param-gather (arguments.py at
    core_v0.14.0), so the export used to drop the gather flag (and the optimizer-step one) while the plan priced the
    gather overlapped: now a one-line refusal with the rule and both fixes, an EVERY_PLAN rule of megatron."""
    pf = saved["dense"]
    off = pf.plan.model_copy(update={"zero": 1, "overlap_grad_reduce": False, "overlap_param_gather": True})
    assert not check_plan(pf.model, off, pf.cluster)
    one = dataclasses.replace(pf, plan=off)
    why = refusal(one, "megatron")
    assert why is not None and "\n" not in why
    assert "--overlap-grad-reduce" in why and "--no-overlap-param-gather" in why
    assert why == full_render(one, "megatron") and "param_gather" in EVERY_PLAN["megatron"]
    # either fix exports, and the script then says what was priced
    for fix in ({"overlap_grad_reduce": True}, {"overlap_param_gather": False}):
        fixed = dataclasses.replace(pf, plan=off.model_copy(update=fix))
        assert refusal(fixed, "megatron") is None
        text = "\n".join(render_all(fixed, "megatron")[0].values())
        assert ("--overlap-param-gather" in text) == fix.get("overlap_grad_reduce", False)


@pytest.mark.parametrize("field, value, words", [("mxfp8_modules", ("mamba_out_proj",), "modules run in MXFP8 under NVFP4"),
                                                 ("bf16_modules", ("attention",), "modules kept in bf16")])
def test_bridge_module_recipes_are_every_plan_rules(saved, field, value, words):
    """Megatron-Bridge refuses a plan with modules in their own format whatever else it sets (a RecipeConfig no
    override holds): EVERY_PLAN rules, so `search --target megatron-bridge` passes over such plans."""
    from llmplan.export import every_plan_mask, every_plan_reason
    from llmplan.search.grid import from_plan

    base = saved["hybrid"].plan.model_copy(update={"fp8_params": True})  # weights in fp4, as the NVFP4 preset
    assert every_plan_reason(base, "megatron-bridge") is None
    p = base.model_copy(update={field: value})
    assert bool(every_plan_mask(from_plan(p), "megatron-bridge")[0])
    assert words in str(every_plan_reason(p, "megatron-bridge"))


def test_a_field_added_to_the_draw_leaves_the_other_plans_as_they_were(saved):
    """The draw keys each decision by (seed, attempt, field) (keyed): a field added to the plan, here one the plan
    model rejects, changes only the attempts that draw it; the rest give the same plans, so the rules the test
    meets do not come and go with unrelated fields. It does change some (the new field is drawn)."""
    pf, fields = saved["dense"], draw_fields()
    grown = {**fields, "a_field_added_later": [True]}
    changed = 0
    for i in range(200):
        before, after = drawn_plan(pf, "grown", i, fields), drawn_plan(pf, "grown", i, grown)
        if keyed("grown", i, "a_field_added_later").random() < DRAW_RATE:
            changed += after is None  # extra="forbid": the plan model refuses the unknown field
        else:
            assert before == after, i
    assert changed
