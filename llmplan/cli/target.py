"""`search --target NAME`: keep only the ranked plans that `export --to NAME` writes. A training search walks
every plan that fits, layout by layout (search.filtered: where a layout's shown plan is refused, its other plans
in ranked order), a serving search its ranking (deeper: cli.search.WALK layouts); each candidate, best first, is turned
into
the plan file `--save` would write (asker: the search's file with its plan swapped in) and handed to
export.refusal, the refusal checks `export` runs before it renders; the refused ones are dropped until --top
plans are kept. No launcher rule lives here: the export package is the one place that knows them."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from llmplan.errors import LlmplanError
from llmplan.export import (every_plan_blocks, every_plan_mask, every_plan_reasons, every_plan_refusal, refusal,
                            target_mode)
from llmplan.export.common import refuse
from llmplan.planfile import PlanFile, document_plan
from llmplan.search.filtered import Candidate, Walk, keep_accepted, keep_sides
from llmplan.search.run import SearchResult


def check_target_mode(target: str | None, mode: str) -> None:
    """An unknown target, or one of the other mode (vllm for a training search), is one clear error."""
    if target is None:
        return
    if target_mode(target) != mode:
        kind = "training" if mode == "train" else "serving"
        fix = "drop --mode infer" if mode == "infer" else "add --mode infer"
        raise LlmplanError(f"--target {target} exports {'serving' if kind == 'training' else 'training'} plans "
                           f"and this is a {kind} search; {fix} or pick another target")


def walk(ranked: Sequence[Any], target: str, doc_of: Callable[[Any], dict], top: int) -> tuple[list[int], Counter]:
    """Indices of the first `top` plans of `ranked` the target accepts, and the refusals met before them."""
    kept: list[int] = []
    why: Counter = Counter()
    for i, e in enumerate(ranked):
        if len(kept) == top:
            break
        reason = refusal(document_plan(doc_of(e)), target)
        if reason is None:
            kept.append(i)
        else:
            why[reason] += 1
    return kept, why


def serving_walk(kept: list[int], why: Counter, walked: int, feasible: int, top: int, limit: int,
                 seconds: float) -> Walk:
    """What a serving search's walk did (search.filtered.Walk): the layouts asked about, the refused (and of
    them the ones ranked above the last layout kept), and whether it kept `top` or ran out of the `feasible`
    layouts (False: it stopped at the `walked` ranked ones, the search asked for `limit`: --top or cli.search.WALK,
    the larger)."""
    checked = kept[-1] + 1 if len(kept) == top and kept else walked
    dropped = kept[-1] + 1 - len(kept) if kept else 0  # refused above the last kept layout
    return Walk(checked, sum(why.values()), (), len(kept) == top or walked >= feasible, limit, seconds, dropped)


def asker(target: str, doc_of: Callable[[Any], dict]) -> Callable[[Candidate], str | None]:
    """Why `target` refuses a Candidate (export.refusal), or None: asked with the plan file of a priced plan of
    the same search (the first candidate's `like`) with the candidate's plan in place of its own, so that no
    plan is priced, nor its file written, to be asked about. The file `--save` writes for the plan differs from
    it only in the predictions, which export.refusal does not read (it runs the export's refusal checks, on the
    plan, model, cluster, rank order and mode; tests/test_search_target.py holds the two answers equal)."""
    like: list[PlanFile] = []

    def reason(c: Candidate) -> str | None:
        like[:] = like or [document_plan(doc_of(c.like))]
        return refusal(dataclasses.replace(like[0], plan=c.plan), target)

    return reason


def keep_training(res: SearchResult, target: str, doc_of: Callable[[Any], dict], top: int) -> SearchResult:
    """The result with only the best `top` layouts' plans that `target` exports, one row per layout
    (search.filtered; the search run with keep_plans): not_exportable counts the plans refused above the last
    row kept (Walk.dropped), refusals every refusal the walk met by reason (asker; the plans of a class the
    target refuses whole, export.every_plan_mask, passed over unasked: by the words of the rule that refuses each
    first, export.every_plan_reasons). It keeps the
    search's plans for training_sides, run on the result shown only."""
    why: Counter = Counter()
    reason = asker(target, doc_of)

    def refused(c: Candidate) -> bool:
        r = reason(c)
        if r is not None:
            why[r] += 1
        return r is not None

    lp = res.layout_plans
    kept, walked = keep_accepted(res, refused, top, known=lambda plans: every_plan_mask(plans, target))
    if walked.passed_plans and lp is not None:  # passed over: why the target refuses them, rule by rule
        why.update(every_plan_reasons(lp.plans, target, walked.passed_plans, lp.plan))
    return dataclasses.replace(kept, target=target, not_exportable=walked.dropped, refusals=dict(why),
                               walk=walked, layout_plans=lp)


def training_sides(res: SearchResult, target: str, doc_of: Callable[[Any], dict]) -> SearchResult:
    """The kept result (keep_training) with the Pareto front, the comparisons and the rows' counts kept to the
    plans `target` exports (search.filtered.keep_sides): asked as the walk asks, not counted as dropped; a
    comparison with EP is not walked where the target refuses every plan with EP (export.every_plan_refusal).
    Its plans are let go."""
    reason = asker(target, doc_of)
    asked = lambda c: reason(c) is not None  # noqa: E731
    kept, sides = keep_sides(res, res.layout_plans, asked,
                             every=lambda axis, degree: every_plan_refusal(res.ranked[0].plan, target, axis, degree))
    return dataclasses.replace(kept, sides=sides, layout_plans=None)


def refuse_unexportable(target: str, why: dict[str, int] | Counter) -> None:
    """None of the walked plans of a serving search exports: one line naming the target and the refusal met most
    often (a training search: refuse_every_setting)."""
    if not why:
        return
    reason, n = Counter(why).most_common(1)[0]
    raise LlmplanError(f"none of the {sum(why.values())} best plans exports to {target} (most often, {n} of "
                       f"them: {reason})")


SWITCH_FLAGS: dict[str, Callable[[Any], str]] = {
    "grad_dtype": lambda v: f"--grad-dtype {v}", "fp8_params": lambda v: "--fp8-params" if v else "--no-fp8-params",
    "fp8_scaling": lambda v: f"--fp8-scaling {v}", "moe_dispatcher": lambda v: f"--moe-dispatcher {v}",
    "moe_flex_backend": lambda v: f"--moe-flex-backend {v}",
    "ep_comm_overlap": lambda v: "--ep-comm-overlap" if v else "--no-ep-comm-overlap"}
"""The flag that pins each switch a training search tries more than one setting of (search.run.switch_variants)."""


@dataclass(frozen=True)
class Refused:
    """Why a target refused every plan of one switch setting's search (keep_training kept no row)."""

    setting: dict[str, Any]
    plans: int
    """The plans the walk refused (asked or passed over)."""
    blocks: list[tuple[str, str]]
    """(what, fix) of each rule of the target that refuses every plan of the setting (export.every_plan_blocks)."""
    asked: Counter
    """The refusals of the plans the walk asked about (not passed over as a class the target refuses whole)."""


def refused_setting(setting: dict[str, Any], res: SearchResult, target: str) -> Refused | None:
    """What refused the search `res` of `setting` (keep_training's result, with its plans); None where it kept a
    row or refused nothing (no plan fits)."""
    lp, walked = res.layout_plans, res.walk
    if res.ranked or not res.refusals or lp is None or walked is None:
        return None
    passed = every_plan_reasons(lp.plans, target, walked.passed_plans, lp.plan) if walked.passed_plans else Counter()
    return Refused(setting, sum(res.refusals.values()), every_plan_blocks(lp.plans, target, lp.plan),
                   Counter(res.refusals) - passed or Counter(res.refusals))


def refuse_every_setting(target: str, settings: Sequence[tuple[dict[str, Any], SearchResult]]) -> None:
    """None of the switch settings a targeted training search tried kept a plan: one line naming the setting that
    is nearest to exporting and what to change for it, so that the fix it names is one the search has not tried
    already (the first setting's reason can name another setting, refused in turn). Nearest: the fewest rules that
    refuse all of its plans (export.every_plan_blocks; a setting none refuses whole first, by the refusal met most
    often among its plans asked), the first tried of equals. Returns where a setting kept a row or none was
    refused (nothing fits: the search's own exit)."""
    if any(r.ranked for _, r in settings):
        return
    refused = [x for v, r in settings if (x := refused_setting(v, r, target)) is not None]
    if not refused:
        return
    near = min(refused, key=lambda x: len(x.blocks))  # the first of equals: the search's plain setting first
    if near.blocks:
        how, reason = "refused whole", str(refuse(target, " and ".join(w for w, _ in near.blocks),
                                                  "; ".join(f for _, f in near.blocks)))
    else:  # the plans asked: a class the target refuses whole is one the search passes over
        reason, n = near.asked.most_common(1)[0]
        how = f"most often, {n:,} of them"
    total = sum(x.plans for x in refused)
    if len(settings) == 1:
        raise LlmplanError(f"none of the {total:,} best plans exports to {target} ({how}: {reason})")
    varied = [k for k in SWITCH_FLAGS if len({str(v.get(k)) for v, _ in settings}) > 1]
    flags = " ".join(SWITCH_FLAGS[k](near.setting[k]) for k in varied)
    raise LlmplanError(f"none of the {total:,} best plans of the {len(settings)} switch settings tried exports to "
                       f"{target}; nearest to exporting, {flags} ({near.plans:,} plans), is "
                       f"{how if near.blocks else 'refused ' + how}: {reason}")
