"""`search --target NAME`: keep only the ranked plans that `export --to NAME` writes. The search ranks as
without it (deeper: WALK layouts), then each candidate, best first, is turned into the plan file `--save` would
write and handed to export.refusal, the very render `export` runs; the refused ones are dropped until --top
plans are kept. No launcher rule lives here: the export package is the one place that knows them."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Callable, Sequence

from llmplan.errors import LlmplanError
from llmplan.export import refusal, target_mode
from llmplan.planfile import document_plan
from llmplan.search.run import SearchResult

WALK = 40
"""Ranked layouts a targeted search asks for and walks (its --top when larger): how deep it looks for plans
the target accepts."""


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


def keep_training(res: SearchResult, target: str, doc_of: Callable[[Any], dict], top: int) -> SearchResult:
    """The result with only its first `top` ranked plans that `target` exports; ties, tie notes, equivalents
    and variants follow their plans, the ranks renumbered."""
    kept, why = walk(res.ranked, target, doc_of, top)
    rank = {old + 1: new + 1 for new, old in enumerate(kept)}
    pick = lambda xs: [xs[i] for i in kept if i < len(xs)]
    return dataclasses.replace(
        res, ranked=pick(res.ranked), equivalents=pick(res.equivalents), variants=pick(res.variants),
        tied_with=[[rank[k] for k in t if k in rank] for t in pick(res.tied_with)],
        tie_notes=[dataclasses.replace(n, upper=rank[n.upper], lower=rank[n.lower]) for n in res.tie_notes
                   if n.upper in rank and n.lower in rank],
        target=target, not_exportable=sum(why.values()), refusals=dict(why))


def target_json(target: str | None, dropped: int) -> dict[str, Any]:
    """The keys a targeted search adds to its JSON (none without --target)."""
    return {"target": target, "not_exportable": dropped} if target else {}


def target_line(target: str, dropped: int) -> str:
    return (f"target {target}: {dropped} better-ranked plan{'s' if dropped != 1 else ''} dropped as not "
            "exportable")


def refuse_unexportable(target: str, why: dict[str, int] | Counter) -> None:
    """None of the walked plans exports: one line naming the target and the refusal met most often."""
    if not why:
        return
    reason, n = Counter(why).most_common(1)[0]
    raise LlmplanError(f"none of the {sum(why.values())} best plans exports to {target} (most often, {n} of "
                       f"them: {reason})")
