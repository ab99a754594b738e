"""Plan files (`search --save plan.json`): the chosen plan with its model, hardware, workload and
predictions, in one JSON document that export, bench and check read back."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from llmplan import __version__
from llmplan.errors import LlmplanError
from llmplan.estimate import TrainingEstimate
from llmplan.fileio import write_atomic
from llmplan.specs.hardware import SystemSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec, MemoryAllowance, ParallelPlan
from llmplan.specs.check import check_plan, check_serve_plan
from llmplan.specs.registry import build, read_document
from llmplan.specs.serve import ServeJob, ServePlan
from llmplan.topology.placement import parse_order

PLAN_SCHEMA = 1
KIND = "llmplan-plan"


@dataclass(frozen=True)
class PlanFile:
    model: ModelSpec
    cluster: ClusterSpec
    plan: Any
    """ParallelPlan (mode train) or ServePlan (mode infer)."""
    allowance: MemoryAllowance
    axis_order: tuple[str, ...]
    mode: str
    predictions: dict[str, Any]
    path: Path | None = None
    job: ServeJob | None = None
    """The serving workload (mode infer)."""


def spec_ref(ref: str, plan_path: Path) -> str:
    """How a plan file names its model / hardware: a built-in name as given, or a path relative to the plan
    file's folder (so a repository of specs and plans can move as a whole)."""
    if Path(ref).suffix in (".yaml", ".yml", ".json") or "/" in ref:
        return os.path.relpath(Path(ref).resolve(), Path(plan_path).resolve().parent)
    return ref


def plan_document(e: TrainingEstimate, allowance: MemoryAllowance, order: tuple[str, ...],
                  predictions: dict[str, Any], refs: tuple[str, str] | None = None) -> dict[str, Any]:
    c = e.cluster
    return {
        "schema": PLAN_SCHEMA, "kind": KIND, "mode": "train", "llmplan_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **({"model_ref": refs[0], "hardware_ref": refs[1]} if refs else {}),
        "model": e.model.model_dump(mode="json"),
        "hardware": c.system.model_dump(mode="json"),
        "nodes": c.num_nodes, "gpus_per_node": c.gpus_per_node_used,
        "axis_order": "-".join(order),
        "allowance": allowance.model_dump(mode="json"),
        "plan": e.plan.model_dump(mode="json"),
        "predictions": predictions,
    }


def serve_plan_document(e: Any, allowance: MemoryAllowance, predictions: dict[str, Any],
                        refs: tuple[str, str] | None = None) -> dict[str, Any]:
    """An inference plan file: the ServePlan and ServeJob instead of a ParallelPlan."""
    c = e.cluster
    return {
        "schema": PLAN_SCHEMA, "kind": KIND, "mode": "infer", "llmplan_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **({"model_ref": refs[0], "hardware_ref": refs[1]} if refs else {}),
        "model": e.model.model_dump(mode="json"), "hardware": c.system.model_dump(mode="json"),
        "nodes": c.num_nodes, "gpus_per_node": c.gpus_per_node_used,
        "allowance": allowance.model_dump(mode="json"),
        "plan": e.plan.model_dump(mode="json"), "job": e.job.model_dump(mode="json"),
        "predictions": predictions,
    }


def save_plan(path: Path, doc: dict[str, Any], force: bool = False) -> None:
    write_atomic(Path(path), json.dumps(doc, indent=2) + "\n", force=force)


def load_plan(path: Path) -> PlanFile:
    """Read a plan file; any problem (wrong kind, schema, invalid spec or plan) is one clear error."""
    path = Path(path)
    if not path.exists():
        raise LlmplanError(f"plan file {path} does not exist")
    doc = read_document(path)
    if doc.get("kind") != KIND:
        raise LlmplanError(f"{path}: not an llmplan plan file (kind is {doc.get('kind')!r}, expected '{KIND}'); "
                           "create one with `llmplan search ... --save plan.json`")
    if doc.get("schema") != PLAN_SCHEMA:
        raise LlmplanError(f"{path}: plan file schema {doc.get('schema')!r} is not supported (this llmplan reads "
                           f"schema {PLAN_SCHEMA}); re-create it with `llmplan search --save`")
    for key in ("model", "hardware", "nodes", "plan"):
        if key not in doc:
            raise LlmplanError(f"{path}: missing key '{key}'")
    model = build(ModelSpec, doc["model"], f"{path} (model)")
    system = build(SystemSpec, doc["hardware"], f"{path} (hardware)")
    cluster = build(ClusterSpec, {"system": system, "num_nodes": doc["nodes"],
                                  "gpus_per_node": doc.get("gpus_per_node")}, f"{path} (cluster)")
    mode = str(doc.get("mode", "train"))
    allowance = build(MemoryAllowance, doc.get("allowance", {}), f"{path} (allowance)")
    order = parse_order(str(doc.get("axis_order", "tp-cp-ep-dp-pp")))
    if mode == "infer":
        plan = build(ServePlan, doc["plan"], f"{path} (plan)")
        job = build(ServeJob, doc.get("job", {}), f"{path} (job)")
        violations = check_serve_plan(model, plan, job, cluster)
    elif mode == "train":
        plan, job = build(ParallelPlan, doc["plan"], f"{path} (plan)"), None
        violations = check_plan(model, plan, cluster)
    else:
        raise LlmplanError(f"{path}: mode {mode!r} is neither 'train' nor 'infer'")
    if violations:
        raise LlmplanError(f"{path}: the plan no longer passes its rules:\n"
                           + "\n".join(f"  - {v.message}" for v in violations))
    return PlanFile(model, cluster, plan, allowance, order, mode, doc.get("predictions", {}), path, job)
