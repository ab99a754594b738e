"""`llmplan check --base REV`: what changed in the model specs since a git revision, and what it did to the
plans that refer to them (memory and step time at REV and now). Git runs with user text only after
`--end-of-options` / `--`, never as an option."""

from __future__ import annotations

import posixpath
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

from llmplan.errors import LlmplanError
from llmplan.estimate import estimate_training
from llmplan.fileio import MAX_INPUT_BYTES, excerpt, parse_document
from llmplan.plancheck import changed_fields, classify
from llmplan.planfile import plan_file, read_plan_document, snapshot_system
from llmplan.specs.check import check_plan
from llmplan.specs.hf import from_hf_config
from llmplan.specs.model import ModelSpec
from llmplan.specs.registry import build, load_model_file, read_document
from llmplan.units import GIB


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
