"""`llmplan check`: guard saved plans against changes to the specs they rely on (`llmplan lock`, planlock.py,
refreshes them).

A plan file records which model and hardware it was planned for (`model_ref`, `hardware_ref`: a built-in
name, or a path relative to the plan file) next to a snapshot of both. `check` re-reads the referenced specs
as they are now, and fails a plan that no longer passes its rules, no longer fits with the required
headroom, or whose predicted step time (or serving throughput) regressed beyond the tolerance. Each finding
names the file, the spec field that changed and its line, for text, JSON, GitHub annotations and JUnit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from llmplan.errors import LlmplanError
from llmplan.fileio import exists, read_text
from llmplan.estimate import TrainingEstimate, estimate_training
from llmplan.hetero import estimate_hetero
from llmplan.planfile import (
    KIND, PlanDocument, PlanFile, current_specs, mend_note, plan_file, plan_violations, read_plan_document,
    saved_pools,
)
from llmplan.serving import estimate_serving
from llmplan.specs.defaults import min_headroom_bytes
from llmplan.specs.hardware import GpuSpec, SystemSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.registry import (
    SPEC_SUFFIXES, load_model_file, load_system_file, read_document, validation_message,
)
from llmplan.units import GIB



def shown_path(path: str | Path) -> str:
    """A file as findings and CI annotations name it: '..' hops folded (os.path.normpath: a plan's
    '../model_specs/x.yaml' read from plans/ is model_specs/x.yaml), relative to the working directory when it
    lies inside it (GitHub resolves an annotation's file from the checkout root, where CI runs)."""
    p = os.path.normpath(str(path))
    if os.path.isabs(p):
        try:
            rel = os.path.relpath(p)
        except ValueError:  # another drive (Windows)
            return p
        if rel != ".." and not rel.startswith(".." + os.sep):
            return rel
    return p


@dataclass
class Finding:
    """One check: what was checked, where, and whether it passed."""

    name: str
    file: str
    ok: bool
    message: str
    line: int | None = None
    field: str | None = None
    details: dict[str, Any] = dc_field(default_factory=dict)

    def __post_init__(self) -> None:
        self.file = shown_path(self.file)


def field_line(path: Path, name: str | None) -> int | None:
    """1-based line of a top-level key in a YAML/JSON file (None when absent or unparsable)."""
    if not name:
        return None
    try:
        node = yaml.compose(read_text(path))
    except (LlmplanError, yaml.YAMLError, RecursionError):
        return None
    if isinstance(node, yaml.MappingNode):
        for key, _ in node.value:
            if key.value == name:
                return key.start_mark.line + 1
    return None


def classify(doc: dict[str, Any]) -> str:
    if doc.get("kind") == KIND:
        return "plan"
    if "tflops" in doc:
        return "gpu"
    if "gpus_per_node" in doc or "base" in doc:
        return "system"
    if "hidden_size" in doc or "n_embd" in doc or "model_type" in doc:
        return "model"
    return "unknown"


def discover(paths: list[Path]) -> list[Path]:
    files: list[Path] = []
    for p in paths:
        if not exists(p):
            raise LlmplanError(f"{p} does not exist; give `llmplan check` existing spec, profile or plan files, or "
                               "folders of them")
        if p.is_dir():
            files += sorted(f for f in p.rglob("*") if f.suffix in SPEC_SUFFIXES and f.is_file())
        else:
            files.append(p)  # a device or a pipe is refused when it is read, as a failed check
    return files


def check_spec(path: Path, param_tolerance: float) -> Finding:
    """Schema, cross-field rules, and the declared parameter count."""
    from llmplan.cost.params import param_counts

    try:
        m = load_model_file(path)
    except LlmplanError as e:
        fld = _field_from_error(str(e))
        return Finding(f"spec {path}", str(path), False, str(e), field_line(path, fld), fld)
    if m.declared_params:
        total = param_counts(m).total
        err = abs(total - m.declared_params) / m.declared_params
        if err > param_tolerance:
            return Finding(f"spec {m.name}", str(path), False,
                           f"computed parameters {total / 1e9:.3f}B differ from declared_params "
                           f"{m.declared_params / 1e9:.3f}B by {100 * err:.2f}% (> {100 * param_tolerance:.2f}%)",
                           field_line(path, "declared_params"), "declared_params")
    return Finding(f"spec {m.name}", str(path), True, "valid")


def check_hardware(path: Path, kind: str) -> Finding:
    try:
        if kind == "gpu":
            GpuSpec.model_validate(read_document(path))
        else:
            load_system_file(path)
    except ValidationError as e:
        msg = validation_message(str(path), e)
        fld = _field_from_error(msg)
        return Finding(f"hardware {path}", str(path), False, msg, field_line(path, fld), fld)
    except LlmplanError as e:
        fld = _field_from_error(str(e))
        return Finding(f"hardware {path}", str(path), False, str(e), field_line(path, fld), fld)
    return Finding(f"hardware {path.stem}", str(path), True, "valid")


def _field_from_error(msg: str) -> str | None:
    if "field '" in msg:
        return msg.split("field '", 1)[1].split("'", 1)[0].split(".")[0]
    return None


def changed_fields(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    keys = set(old) | set(new)
    return {k: (old.get(k), new.get(k)) for k in sorted(keys) if old.get(k) != new.get(k)}


@dataclass(frozen=True)
class SpecChange:
    """How the specs a plan refers to differ from the snapshots in the plan file."""

    because: str
    """' (spec changes: ...)' or ''."""
    where: str
    """The file a finding points at: the changed model spec, else the plan file."""
    line: int | None
    field: str | None
    changes: dict[str, tuple[Any, Any]]


def spec_change(doc: PlanDocument, path: Path, model: ModelSpec, system: SystemSpec,
                model_file: Path | None) -> SpecChange:
    changes = changed_fields(doc.model, model.model_dump(mode="json"))
    changes.pop("source", None)
    changes.update({f"hardware.{k}": v for k, v in changed_fields(doc.hardware, system.model_dump(mode="json")).items()
                    if k != "source"})
    spec_field = next((k for k in changes if not k.startswith("hardware.")), None)
    line = field_line(model_file, spec_field) if model_file and spec_field else None
    describe = "; ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items() if k != "declared_params")
    return SpecChange(f" (spec changes: {describe})" if describe else "", str(model_file or path), line, spec_field,
                      changes)


def check_plan_file(path: Path, min_headroom_gib: float | None, tolerance: float) -> list[Finding]:
    """Re-evaluate one plan file (with its axis order and allowance) against the specs it references, as they
    are now."""
    name = f"plan {path.name}"
    try:
        doc = read_plan_document(path)
        model, system, model_file, _ = current_specs(doc, path)
        pf = plan_file(doc, model, system, path)  # a training plan's model as it trains (its MTP modules)
        sc = spec_change(doc, path, pf.model, system, model_file)
    except LlmplanError as e:
        return [Finding(name, str(path), False, f"cannot be checked: {e}")]
    bad = plan_violations(pf)
    if bad:
        return [Finding(name, sc.where, False, f"{path.name} breaks its rules{sc.because}: "
                        + "; ".join(v.message for v in bad) + ". "
                        + mend_note(pf, " ".join(v.message for v in bad)), sc.line, sc.field)]
    if pf.mode == "infer":
        return [_check_serving(name, pf, doc, sc, min_headroom_gib, tolerance)]
    priced = _reprice(pf)
    if isinstance(priced, str):
        return [Finding(name, sc.where, False, f"{path.name} breaks its rules{sc.because}: {priced}", sc.line,
                        sc.field)]
    est = priced
    head = float(est.memory.headroom) / GIB
    min_headroom_gib = min_headroom_bytes(min_headroom_gib, pf.cluster.system.gpu.hbm_bytes) / GIB
    old_step = doc.predictions.time.step_s
    step = float(est.time.total)
    details = {"memory_gib": float(est.memory.total) / GIB, "headroom_gib": head, "step_s": step,
               "locked_step_s": old_step, "changes": {k: list(v) for k, v in sc.changes.items()}}
    if head < min_headroom_gib:
        verb = "no longer fits" if sc.changes else "does not fit"
        return [Finding(name, sc.where, False, f"{path.name} {verb} with {min_headroom_gib:g} GiB headroom: "
                        f"{float(est.memory.total) / GIB:.1f} of {float(est.memory.capacity) / GIB:.1f} GiB per GPU"
                        f"{sc.because}", sc.line, sc.field, details)]
    if old_step and step > old_step * (1 + tolerance):
        return [Finding(name, sc.where, False, f"{path.name} step time regressed {100 * (step / old_step - 1):.1f}% "
                        f"({old_step:.3f} -> {step:.3f} s, tolerance {100 * tolerance:.0f}%){sc.because}",
                        sc.line, sc.field, details)]
    return [Finding(name, str(path), True, f"fits with {head:.1f} GiB headroom, step {step:.3f} s", details=details)]


def _reprice(pf: PlanFile) -> TrainingEstimate | str:
    """The training estimate of a plan file as its specs are now (a plan over several pools over its pools,
    llmplan.hetero), or why it cannot be priced."""
    try:
        pools = saved_pools(pf)
        if pools is not None:
            return estimate_hetero(pf.model, *pools, pf.allowance, pf.axis_order).estimate
        return estimate_training(pf.model, pf.cluster, pf.plan, pf.allowance, pf.axis_order)
    except LlmplanError as err:
        return str(err)


def _check_serving(name: str, pf: PlanFile, doc: PlanDocument, sc: SpecChange, min_headroom_gib: float | None,
                   tolerance: float) -> Finding:
    # Serving plans are sized by the engine's memory fraction; only an explicit --min-headroom applies.
    min_headroom_gib = min_headroom_gib or 0.0
    job = pf.serve_job
    e = estimate_serving(pf.model, pf.cluster, pf.plan, job, pf.allowance)
    head = (e.memory.capacity - e.memory.total) / GIB
    old = doc.predictions.throughput.tokens_per_s
    if not e.memory.fits or head < min_headroom_gib:
        verb = "no longer fits" if sc.changes else "does not fit"
        return Finding(name, sc.where, False, f"{verb} {job.batch:,} sequences with {min_headroom_gib} GiB "
                       f"headroom{sc.because}", sc.line, sc.field)
    if old and e.tokens_per_s < old * (1 - tolerance):
        return Finding(name, sc.where, False, f"throughput regressed {100 * (1 - e.tokens_per_s / old):.1f}% "
                       f"({old:,.0f} -> {e.tokens_per_s:,.0f} tokens/s){sc.because}", sc.line, sc.field)
    return Finding(name, sc.where, True, f"fits, {e.tokens_per_s:,.0f} tokens/s")


def run_checks(paths: list[Path], plans_dir: Path | None, min_headroom_gib: float | None, tolerance: float,
               param_tolerance: float = 0.01) -> list[Finding]:
    files = discover(paths + ([plans_dir] if plans_dir else []))
    findings: list[Finding] = []
    for f in dict.fromkeys(files):
        try:
            doc = read_document(f)
        except LlmplanError as e:
            findings.append(Finding(f"file {f}", str(f), False, str(e)))
            continue
        kind = classify(doc)
        if kind == "plan":
            findings += check_plan_file(f, min_headroom_gib, tolerance)
        elif kind == "model":
            findings.append(check_spec(f, param_tolerance))
        elif kind in ("gpu", "system"):
            findings.append(check_hardware(f, kind))
    return findings


# --- diff against a git revision --------------------------------------------------------------------------------
