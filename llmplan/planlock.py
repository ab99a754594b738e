"""`llmplan lock`: refresh every saved plan in a folder with the predictions of the specs as they are now, and
plan the model specs that have no plan there yet. The report layer formats the predictions a plan file
stores (Predictions); the command line parses the options and prints the outcome."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmplan.errors import LlmplanError
from llmplan.estimate import TrainingEstimate, estimate_training
from llmplan.hetero import HeteroEstimate, estimate_hetero
from llmplan.planfile import (load_plan, plan_document, read_plan_document, save_plan, saved_pools,
                              save_refs, serve_plan_document, spec_ref)
from llmplan.plancheck import discover
from llmplan.search.grid import Workload, default_space
from llmplan.search.run import search as run_search
from llmplan.serving import ServeEstimate, estimate_serving
from llmplan.specs.defaults import DEFAULT_BATCH_TOKENS, default_seq_len, global_batch_from_tokens
from llmplan.specs.plan import ClusterSpec, MemoryAllowance
from llmplan.specs.registry import resolve_model
from llmplan.topology.placement import DEFAULT_ORDER


@dataclass(frozen=True)
class Predictions:
    """The JSON documents a plan file stores as its predictions, one per kind of estimate (the report layer's
    estimate_json, serve_json and hetero_json: the library formats no output)."""

    training: Callable[[TrainingEstimate], dict[str, Any]]
    serving: Callable[[ServeEstimate], dict[str, Any]]
    pools: Callable[[HeteroEstimate], dict[str, Any]]


@dataclass(frozen=True)
class NewPlans:
    """How to plan a model spec that has no plan yet: the hardware reference as given (--hardware), the cluster
    it builds (called once per spec, so a bad reference fails only when it is needed) and the workload."""

    hardware: str
    nodes: int
    cluster: Callable[[], ClusterSpec]
    global_batch: int | None = None
    seq_len: int | None = None


@dataclass
class LockResult:
    """The plan files written and the failures, each a line naming the file or spec."""

    written: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def refreshed_document(pf_path: Path, predictions: Predictions) -> dict[str, Any]:
    """The plan file at `pf_path` re-priced on the specs it refers to as they are now (LlmplanError if it no
    longer loads or passes its rules); a plan over pools is re-priced over them and keeps its pools."""
    pf = load_plan(pf_path, current=True)
    doc = pf.document
    refs = (doc.model_ref, doc.hardware_ref)
    if pf.mode == "infer":
        se = estimate_serving(pf.model, pf.cluster, pf.plan, pf.serve_job, pf.allowance)
        new = serve_plan_document(se, pf.allowance, predictions.serving(se), refs if refs[0] else None)
    elif (pools := saved_pools(pf)) is not None:
        h = estimate_hetero(pf.model, *pools, pf.allowance, pf.axis_order)
        new = {**plan_document(h.estimate, pf.allowance, pf.axis_order, predictions.pools(h)),
               **({"model_ref": refs[0]} if refs[0] else {}),  # no hardware_ref: the snapshot stands
               "pools": {"cluster": pools[0].model_dump(mode="json"), "plan": pools[1].model_dump(mode="json")}}
    else:
        e = estimate_training(pf.model, pf.cluster, pf.plan, pf.allowance, pf.axis_order)
        new = plan_document(e, pf.allowance, pf.axis_order, predictions.training(e), refs if refs[0] else None)
    if doc.hardware_options:
        new = {**new, "hardware_options": doc.hardware_options}
    return new


def lock(plans: Path, specs: list[Path], predictions: Predictions, new_plans: NewPlans | None) -> LockResult:
    """Refresh every plan file in `plans` (a failure is recorded, not raised) and, with `new_plans`, save the
    best plan of each spec in `specs` that no plan there refers to (without it, such a spec is a failure)."""
    result = LockResult()
    for pf_path in sorted(plans.glob("*.json")):
        try:
            save_plan(pf_path, refreshed_document(pf_path, predictions), force=True)
            result.written.append(str(pf_path))
        except LlmplanError as exc:
            result.failed.append(f"{pf_path}: {exc}")
    locked = set()
    for path in plans.glob("*.json"):
        try:
            locked.add(read_plan_document(path).model_ref)
        except LlmplanError:
            pass  # already recorded in result.failed above
    for spec in discover(specs):
        if spec_ref(str(spec), plans / "x.json") in locked:
            continue
        if new_plans is None:
            result.failed.append(f"{spec}: no plan in {plans}; give --hardware and --nodes to create one")
            continue
        _plan_new(spec, plans, predictions, new_plans, result)
    return result


def _plan_new(spec: Path, plans: Path, predictions: Predictions, new: NewPlans, result: LockResult) -> None:
    """Search the best plan of `spec` on the new-plan cluster and save it in `plans`."""
    m = resolve_model(str(spec))
    cluster = new.cluster()
    seq = new.seq_len or default_seq_len(m)
    w = Workload(global_batch=new.global_batch or global_batch_from_tokens(DEFAULT_BATCH_TOKENS, seq), seq_len=seq)
    res = run_search(m, cluster, default_space(m, cluster, w), w, top=1, sides=False)  # reads the ranked rows only
    if not res.ranked:
        result.failed.append(f"{spec}: no plan fits on {new.nodes} x {cluster.system.name}")
        return
    target = plans / f"{m.name}.{cluster.system.name}.plan.json"
    best = res.ranked[0]
    save_plan(target, plan_document(best, MemoryAllowance(), DEFAULT_ORDER, predictions.training(best),
                                    save_refs(str(spec), new.hardware, target)), force=True)
    result.written.append(str(target))
