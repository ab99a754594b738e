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
import posixpath
import subprocess
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from pydantic import ValidationError

from llmplan.errors import LlmplanError
from llmplan.fileio import MAX_INPUT_BYTES, excerpt, exists, parse_document, read_text
from llmplan.estimate import TrainingEstimate, estimate_training
from llmplan.hetero import estimate_hetero
from llmplan.planfile import (
    KIND, PlanDocument, PlanFile, current_specs, plan_file, plan_violations, read_plan_document, saved_pools,
    snapshot_system,
)
from llmplan.serving import estimate_serving
from llmplan.specs.check import check_plan
from llmplan.specs.defaults import min_headroom_bytes
from llmplan.specs.hardware import GpuSpec, SystemSpec
from llmplan.specs.hf import from_hf_config
from llmplan.specs.model import ModelSpec
from llmplan.specs.registry import (
    SPEC_SUFFIXES, build, load_model_file, load_system_file, read_document, validation_message,
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
            raise LlmplanError(f"{p} does not exist")
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
        sc = spec_change(doc, path, model, system, model_file)
        pf = plan_file(doc, model, system, path)
    except LlmplanError as e:
        return [Finding(name, str(path), False, f"cannot be checked: {e}")]
    bad = plan_violations(pf)
    if bad:
        return [Finding(name, sc.where, False, f"{path.name} breaks its rules{sc.because}: "
                        + "; ".join(v.message for v in bad), sc.line, sc.field)]
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
        return Finding(name, sc.where, False, f"{verb} {job.batch} sequences with {min_headroom_gib} GiB "
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


class BaseError(LlmplanError):
    """--base cannot be used: not a revision, no git, or not a git checkout (one clear error for the command)."""


def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run git with user text only after `--end-of-options` / `--` (the callers place them): never as an option."""
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=60)
    except FileNotFoundError:
        raise BaseError("--base needs git, which is not installed") from None
    except subprocess.TimeoutExpired:
        raise BaseError(f"git {args[0]} took over 60 s in {cwd}") from None


def check_base(ref: str) -> None:
    """--base must name a revision, never look like an option (git would take `--output=FILE` as one)."""
    if not ref or ref.startswith("-") or any(c in ref for c in "\0\n\r"):
        raise BaseError(f"--base {excerpt(ref, 60)!r} is not a git revision (it may not be empty or start with "
                           "'-'); give a branch, tag or commit, e.g. --base origin/main")


def _commit(ref: str, top: Path, cache: dict[tuple[str, Path], str]) -> str:
    """The commit id of `ref` in the checkout at `top` (a bad ref is one clear error)."""
    key = (ref, top)
    if key not in cache:
        r = _git(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}"], top)
        sha = r.stdout.decode(errors="replace").strip()
        if r.returncode != 0 or not sha or sha.startswith("-"):
            raise BaseError(f"--base {excerpt(ref, 60)} is not a git revision of {top} (no such commit); give a "
                               "branch, tag or commit (git fetch it first in a shallow CI checkout)")
        cache[key] = sha
    return cache[key]


class NotCompared(LlmplanError):
    """A spec that cannot be compared with its version at the base revision (the reason says why)."""


MAX_LINKS = 8


def git_show(ref: str, path: Path, cache: dict[tuple[str, Path], str] | None = None) -> str | None:
    """The file as of `ref` (None when it did not exist there), following symbolic links committed inside the
    checkout; a bad ref is one clear error, a file that cannot be compared a NotCompared."""
    cache = {} if cache is None else cache
    r = _git(["rev-parse", "--show-toplevel"], path.parent)
    if r.returncode != 0:
        raise BaseError(f"--base needs a git checkout; {path} is not inside one")
    top = Path(r.stdout.decode(errors="replace").strip()).resolve()
    sha = _commit(ref, top, cache)
    try:  # the path as named (a symbolic link is the link, as git stores it), inside the checkout
        rel = PurePosixPath((path.parent.resolve() / path.name).relative_to(top).as_posix())
    except ValueError:
        raise NotCompared(f"{path} is outside the git checkout {top}") from None
    for _ in range(MAX_LINKS):
        r = _git(["ls-tree", "-z", "--full-tree", sha, "--", str(rel)], top)
        if r.returncode != 0:
            raise NotCompared(f"git ls-tree failed: {excerpt(r.stderr.decode(errors='replace').strip(), 120)}")
        entry = r.stdout.split(b"\0", 1)[0].decode(errors="replace")
        if not entry:
            return None
        meta, _, _name = entry.partition("\t")
        mode, kind, oid = (meta.split() + ["", "", ""])[:3]
        if kind != "blob":
            raise NotCompared(f"{rel} is a {kind} at {ref}, not a file")
        blob = _git(["cat-file", "blob", oid], top)
        if blob.returncode != 0:
            raise NotCompared(f"git cannot read {rel} at {ref}")
        if mode != "120000":
            if len(blob.stdout) > MAX_INPUT_BYTES:
                raise NotCompared(f"{rel} at {ref} is over {MAX_INPUT_BYTES // 2**20} MiB")
            try:
                return blob.stdout.decode("utf-8")
            except UnicodeDecodeError:
                raise NotCompared(f"{rel} at {ref} is not UTF-8 text") from None
        target = blob.stdout.decode(errors="replace")
        joined = posixpath.normpath(posixpath.join(str(rel.parent), target))
        if target.startswith("/") or joined == ".." or joined.startswith("../"):
            raise NotCompared(f"{rel} at {ref} is a symbolic link to {excerpt(target, 60)}, outside the checkout")
        rel = PurePosixPath(joined)
    raise NotCompared(f"{rel} at {ref}: more than {MAX_LINKS} symbolic links in a row")


def _model_at_base(doc: dict[str, Any], path: Path, origin: str) -> ModelSpec:
    """A model spec from the document of a spec file at the base revision (as load_model_file reads files)."""
    data = doc
    if "name" not in doc and "model_type" in doc:
        try:
            data = from_hf_config(doc, default_name=path.parent.name if path.stem == "config" else path.stem)
        except (ValueError, TypeError, KeyError, ArithmeticError) as e:
            raise LlmplanError(f"{origin}: {excerpt(str(e), 200)}") from None
    return build(ModelSpec, data, origin)


def diff_against(ref: str, files: list[Path], plan_files: list[Path]) -> list[dict[str, Any]]:
    """Per changed model spec: changed fields, parameter count, and memory / step time of each plan that
    references it, then (at ref) and now. A spec that cannot be compared (invalid at ref or now, outside the
    checkout) is listed with status "skipped" and the reason; its own check reports what is wrong now."""
    from llmplan.cost.params import param_counts

    check_base(ref)
    commits: dict[tuple[str, Path], str] = {}
    out: list[dict[str, Any]] = []
    for f in files:
        try:
            doc = read_document(f)
        except LlmplanError:
            continue  # its check already failed with the reason
        if classify(doc) != "model":
            continue
        try:
            old_text = git_show(ref, f, commits)
            if old_text is None:
                out.append({"file": str(f), "status": "added"})
                continue
            origin = f"{f} at {ref}"
            old_doc = parse_document(old_text, "JSON" if f.suffix == ".json" else "YAML", origin)
            if old_doc == doc:
                continue
            old = _model_at_base(old_doc, f, origin)
            try:
                new = load_model_file(f)
            except LlmplanError as e:
                raise NotCompared(f"invalid now: {e}") from None
        except NotCompared as e:
            out.append({"file": str(f), "status": "skipped", "message": f"not compared with {ref}: {e}"})
            continue
        except BaseError:
            raise  # the revision itself is wrong: one clear error for the whole command
        except LlmplanError as e:
            out.append({"file": str(f), "status": "skipped", "message": f"not compared with {ref}: {e}"})
            continue
        entry: dict[str, Any] = {
            "file": str(f), "status": "changed",
            "fields": {k: list(v) for k, v in changed_fields(old.model_dump(mode="json"),
                                                            new.model_dump(mode="json")).items()},
            "params": [param_counts(old).total, param_counts(new).total], "plans": [],
        }
        for pf in plan_files:
            try:
                row = _plan_row(pf, f, old, new)
            except LlmplanError:
                continue  # the plan's own check reports it
            if row is not None:
                entry["plans"].append(row)
        out.append(entry)
    return out


def _plan_row(pf: Path, spec: Path, old: ModelSpec, new: ModelSpec) -> dict[str, Any] | None:
    """Memory and step time of the plan in `pf` with the model at the base revision and now (None when the
    plan does not refer to `spec`)."""
    pdoc = read_plan_document(pf)
    ref_path = pdoc.model_ref
    if not ref_path or (pf.parent / ref_path).resolve() != spec.resolve() or pdoc.mode == "infer":
        return None
    base_pf = plan_file(pdoc, old, snapshot_system(pdoc, pf), pf)
    cluster, plan = base_pf.cluster, base_pf.plan
    row: dict[str, Any] = {"plan": str(pf)}
    for label, m in (("base", old), ("now", new)):
        if check_plan(m, plan, cluster):
            row[label] = {"valid": False}
            continue
        e = estimate_training(m, cluster, plan, base_pf.allowance, base_pf.axis_order)
        row[label] = {"valid": True, "memory_gib": float(e.memory.total) / GIB, "step_s": float(e.time.total)}
    return row
