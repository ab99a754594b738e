"""Plan files (`search --save plan.json`): the chosen plan with its model, hardware, workload and
predictions, in one JSON document that export, bench and check read back."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from llmplan import __version__
from llmplan.errors import LlmplanError
from llmplan.estimate import TrainingEstimate
from llmplan.fileio import excerpt, exists, write_atomic
from llmplan.report.common import flex_backend_shown
from llmplan.specs.hardware import SystemSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ETP_SAME_AS_TP, PLAN_FILE_ONLY, ClusterSpec, MemoryAllowance, ParallelPlan, trained_model
from llmplan.specs.check import check_plan, check_pools, check_serve_plan
from llmplan.specs.check_switches import unused_switches
from llmplan.specs.defaults import default_bias_dropout_fusion
from llmplan.specs.registry import (build, builtin_gpus, builtin_models, builtin_systems, load_model_file,
                                    load_system_file, looks_like_path, read_document)
from llmplan.specs.pools import HeteroPlan, PoolCluster
from llmplan.specs.serve import ServeJob, ServePlan
from llmplan.topology.placement import DEFAULT_ORDER, parse_order

PLAN_SCHEMA = 1
KIND = "llmplan-plan"
SNAPSHOT_GPU_DEFAULTS: dict[str, float] = {"sustained_clock_fraction": 1.0, "sm_count": 132}
"""What a plan file's hardware snapshot saved before these GPU keys were required (hardware.REQUIRED_KEYS) was
priced at: GpuSpec's defaults of that time, so the plan reproduces its saved predictions and exports. A profile
file gets no such fallback."""


class StepPredictions(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    step_s: Optional[float] = Field(default=None, gt=0, allow_inf_nan=False)
    """Predicted training step time, seconds."""


class RatePredictions(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    tokens_per_s: Optional[float] = Field(default=None, gt=0, allow_inf_nan=False)
    """Predicted tokens per second."""


class Predictions(BaseModel):
    """The predictions stored in a plan file (the estimate's JSON document); the keys check compares are typed."""

    model_config = ConfigDict(extra="allow", frozen=True)
    time: StepPredictions = Field(default_factory=lambda: StepPredictions())
    """Training step time."""
    throughput: RatePredictions = Field(default_factory=lambda: RatePredictions())
    """Throughput."""


class SearchPoint(BaseModel):
    """One plan of a saved search, as the report's scatter draws it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    plan: str = Field(max_length=200)
    """The plan in one string (tp4 sp pp4 dp4 ...)."""
    tokens_per_s: float = Field(ge=0, allow_inf_nan=False)
    """Predicted tokens per second."""
    headroom: float = Field(allow_inf_nan=False)
    """Memory left free per GPU, bytes."""


class SearchPoints(BaseModel):
    """What `search --save` keeps of the search for `llmplan report`: a sample of the plans that fit, the
    Pareto front and #1."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    cloud: list[tuple[float, float]] = Field(default_factory=list, max_length=100_000)
    """(tokens/s, headroom bytes) of plans that fit."""
    pareto: list[SearchPoint] = Field(default_factory=list, max_length=10_000)
    """The Pareto front, best throughput first."""
    best: Optional[SearchPoint] = None
    """The plan ranked first."""


class PlanDocument(BaseModel):
    """A plan file as stored: what `search --save` writes and export, bench, check and lock read. Keys the
    reader does not know (llmplan_version, created, ...) are kept and ignored."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    schema_: Literal[1] = Field(alias="schema")
    """Plan-file schema; 1 (uneven pipeline stages are optional plan keys, so older schema-1 files load)."""
    kind: Literal["llmplan-plan"]
    """Always 'llmplan-plan'."""
    mode: Literal["train", "infer"] = "train"
    """Training plan (ParallelPlan) or serving plan (ServePlan + ServeJob)."""
    model_ref: Optional[str] = Field(default=None, max_length=4096)
    """The model the plan was made for: a built-in name or a path relative to the plan file."""
    hardware_ref: Optional[str] = Field(default=None, max_length=4096)
    """The system the plan was made for: a built-in name or a path relative to the plan file."""
    hardware_options: dict[str, int | float] = Field(default_factory=dict)
    """--power-limit / --domain-gpus the plan was made with: applied to the referenced hardware as it is now
    (SystemSpec.with_options)."""
    model: dict[str, Any]
    """Snapshot of the model spec."""
    hardware: dict[str, Any]
    """Snapshot of the system spec."""
    nodes: int = Field(ge=1, le=1_000_000)
    """Nodes of the cluster."""
    gpus_per_node: Optional[int] = Field(default=None, ge=1, le=4096)
    """GPUs used per node (None: all)."""
    axis_order: str = Field(default="-".join(DEFAULT_ORDER), max_length=64)
    """Rank placement, innermost axis first."""
    allowance: dict[str, Any] = Field(default_factory=dict)
    """The memory allowance the plan was made with."""
    plan: dict[str, Any]
    """The ParallelPlan (train) or ServePlan (infer) fields."""
    job: Optional[dict[str, Any]] = None
    """The serving workload (infer)."""
    predictions: Predictions = Field(default_factory=lambda: Predictions())
    """What llmplan predicted when the plan was saved."""
    search: Optional[SearchPoints] = None
    """The search the plan was chosen from (`search --save`), for the report's scatter."""
    checkpoint: Optional[dict[str, Any]] = None
    """The CheckpointPolicy the plan's goodput was priced with (--checkpoint, --checkpoint-interval,
    --failure-rate); None: the defaults."""

    @model_validator(mode="after")
    def _complete(self) -> "PlanDocument":
        needed = ("tp", "pp", "dp") if self.mode == "train" else ("tp",)
        missing = [k for k in needed if k not in self.plan]
        if missing:
            raise ValueError(f"the plan has no {', '.join(missing)}; a plan file names its parallel degrees")
        if self.mode == "infer" and self.job is None:
            raise ValueError("a serving plan file needs its job (input_len, output_len, batch)")
        return self


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
    document: PlanDocument
    """The file as read."""
    path: Path | None = None
    job: ServeJob | None = None
    """The serving workload (mode infer)."""

    @property
    def serve_job(self) -> ServeJob:
        """The serving workload of a serving plan file (mode infer always holds one)."""
        if self.job is None:
            raise LlmplanError(f"{self.path or 'the plan file'} holds a training plan, not a serving plan")
        return self.job


def spec_ref(ref: str, plan_path: Path) -> str:
    """How a plan file names its model / hardware: a built-in name as given, or a path relative to the plan
    file's folder (so a repository of specs and plans can move as a whole)."""
    if looks_like_path(ref):
        return os.path.relpath(Path(ref).resolve(), Path(plan_path).resolve().parent)
    return ref


def save_refs(model: str, hardware: str, plan_path: Path | None) -> tuple[str, str] | None:
    """(model_ref, hardware_ref) of a plan file saved at `plan_path` (spec_ref of the --model and --hardware
    given); None where no file is saved."""
    return None if plan_path is None else (spec_ref(model, plan_path), spec_ref(hardware, plan_path))


def plan_document(e: TrainingEstimate, allowance: MemoryAllowance, order: tuple[str, ...],
                  predictions: dict[str, Any], refs: tuple[str | None, str | None] | None = None) -> dict[str, Any]:
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
        "plan": flex_backend_shown(_saved_plan(e.model, e.plan).model_dump(mode="json")),
        "checkpoint": e.checkpoint.model_dump(mode="json"),
        "predictions": predictions,
    }


def _saved_plan(model: ModelSpec, plan: ParallelPlan) -> ParallelPlan:
    """The plan as its file keeps it: a dense model's expert TP as ETP_SAME_AS_TP, as `estimate --save` writes
    it (the search's grid fills etp = tp); a hand edit of plan.tp then is not refused for an expert degree the
    model never had (check_plan's dense-etp rule)."""
    if model.is_moe or plan.etp != plan.tp:
        return plan
    return plan.model_copy(update={"etp": ETP_SAME_AS_TP})


def serve_plan_document(e: Any, allowance: MemoryAllowance, predictions: dict[str, Any],
                        refs: tuple[str | None, str | None] | None = None) -> dict[str, Any]:
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
    """Write the plan document as JSON, or as YAML where the name ends .yaml / .yml: PyYAML's dumper writes
    floats its loader reads back (2.0e-05), where JSON's 2e-05 is a string to a YAML 1.1 reader."""
    path = Path(path)
    yaml_file = path.suffix.lower() in (".yaml", ".yml")
    # through JSON first: PyYAML's safe dumper refuses numpy scalars and tuples, which JSON writes as numbers
    # and lists, so both files hold the same plain values
    text = (yaml.safe_dump(json.loads(json.dumps(doc)), sort_keys=False) if yaml_file
            else json.dumps(doc, indent=2) + "\n")
    write_atomic(path, text, force=force)


def read_plan_document(path: Path) -> PlanDocument:
    """Read and type-check a plan file; a missing file, another kind of file, an unknown schema or a field of
    the wrong type is one clear error naming the field."""
    path = Path(path)
    if not exists(path):
        raise LlmplanError(f"plan file {path} does not exist; save one with `llmplan estimate ... --save {path}` "
                           "(or `llmplan search ... --save`)")
    raw = read_document(path)
    if raw.get("kind") != KIND:
        raise LlmplanError(f"{path}: not an llmplan plan file (kind is {raw.get('kind')!r}, expected '{KIND}'); "
                           "create one with `llmplan search ... --save plan.json`")
    if raw.get("schema") != PLAN_SCHEMA:
        raise LlmplanError(f"{path}: plan file schema {raw.get('schema')!r} is not supported (this llmplan reads "
                           f"schema {PLAN_SCHEMA}); re-create it with `llmplan search --save`")
    doc = build(PlanDocument, raw, str(path))
    for kind, ref, table in (("model", doc.model_ref, builtin_models), ("hardware", doc.hardware_ref, builtin_systems)):
        if ref and not looks_like_path(ref) and ref not in table():
            raise LlmplanError(f"{path}: {kind}_ref '{excerpt(ref, 60)}' names no built-in {kind} and no file; "
                               f"re-create the plan with `llmplan search --save` or `estimate --save`")
    return doc


def current_specs(doc: PlanDocument, path: Path) -> tuple[ModelSpec, SystemSpec, Path | None, Path | None]:
    """The model and system a plan file refers to, as they are now (its snapshots when it names none), and
    the spec files they come from (None for built-ins and snapshots)."""
    model, model_file = _resolve_ref(doc.model_ref, path, "model")
    system, system_file = _resolve_ref(doc.hardware_ref, path, "hardware")
    model = model or build(ModelSpec, doc.model, f"{path} (model)")
    options = dict(doc.hardware_options or {})
    if system is not None and system.default_power_limit_w:  # the fleet's default cap unless the plan set one
        options.setdefault("power_limit", system.default_power_limit_w)
    if system is not None and options:
        try:
            system = system.with_options(**options)
        except (TypeError, ValueError) as e:
            raise LlmplanError(f"{path}: hardware_options {doc.hardware_options} no longer apply to "
                               f"{system.name}: {e}") from None
    system = system or snapshot_system(doc, path)
    return model, system, model_file, system_file


def snapshot_system(doc: PlanDocument, path: Path) -> SystemSpec:
    """The hardware a plan file snapshots, with SNAPSHOT_GPU_DEFAULTS for a GPU saved without those keys, and the
    compute capability of an NVIDIA GPU saved without one taken from its hardware profile (profile_capability)."""
    hardware = dict(doc.hardware)
    if isinstance(hardware.get("gpu"), dict):
        hardware["gpu"] = {**SNAPSHOT_GPU_DEFAULTS, **hardware["gpu"]}
        gpu, name = hardware["gpu"], hardware["gpu"].get("name")
        if gpu.get("compute_capability") is None and gpu.get("vendor", "nvidia") == "nvidia" and isinstance(name, str):
            cc = profile_capability(doc, path, name)  # no name: build() below names the missing field
            if cc is not None:
                hardware["gpu"]["compute_capability"] = cc
    return build(SystemSpec, hardware, f"{path} (hardware)")


def profile_capability(doc: PlanDocument, path: Path, gpu: str) -> float | None:
    """The compute capability of the NVIDIA GPU `gpu` whose snapshot has none (a plan saved before the key, or
    from a profile without it): the one the profiles of that GPU name give (the plan's hardware_ref, when it
    still resolves, and the built-in GPU and system profiles), so that the rules reading it (the Hopper
    hardware-queue rules: cost.moe.overlap_queues, the Megatron-LM export's CUDA_DEVICE_MAX_CONNECTIONS) apply
    as they do to the profile. None where no profile names that GPU (priced as a profile without the key).
    Ambiguous input is refused in one line: profiles of that name that disagree, or a hardware_ref whose GPU
    is now another one with a capability."""
    ref_gpu = None
    if doc.hardware_ref:
        try:
            ref_gpu = _resolve_ref(doc.hardware_ref, path, "hardware")[0].gpu
        except LlmplanError:  # the reference is gone: the built-in profiles below, by name
            ref_gpu = None
    found = sorted({g.compute_capability for g in [ref_gpu, *builtin_gpus().values(),
                                                   *(s.gpu for s in builtin_systems().values())]
                    if g is not None and g.name == gpu and g.compute_capability is not None})
    fix = (f"add hardware.gpu.compute_capability to {path} (NVIDIA's table, developer.nvidia.com/cuda-gpus: "
           "H100 9.0, B200 10.0), or re-save the plan")
    if len(found) > 1:
        raise LlmplanError(f"{path}: the hardware snapshot's GPU {gpu} has no compute_capability and the profiles "
                           f"named {gpu} give {', '.join(map(str, found))}: the rules that read it (CUDA queues "
                           f"beside TE's TP overlap before Blackwell) cannot tell which; {fix}")
    if found:
        return found[0]
    if ref_gpu is not None and ref_gpu.compute_capability is not None:
        raise LlmplanError(f"{path}: the hardware snapshot's GPU {gpu} has no compute_capability, and its "
                           f"hardware_ref {doc.hardware_ref} now has GPU {ref_gpu.name} (compute capability "
                           f"{ref_gpu.compute_capability}): llmplan cannot tell which GPU the plan runs on, and the "
                           f"rules that read it (CUDA queues beside TE's TP overlap before Blackwell) depend on it; "
                           f"{fix}")
    return None


def _resolve_ref(ref: str | None, plan_path: Path, kind: str) -> tuple[Any, Path | None]:
    if not ref:
        return None, None
    if looks_like_path(ref):
        candidate = Path(ref) if Path(ref).is_absolute() else plan_path.parent / ref
        if not exists(candidate):
            raise LlmplanError(f"references {kind} file {ref}, which no longer exists")
        return (load_model_file(candidate) if kind == "model" else load_system_file(candidate)), candidate
    table = builtin_models() if kind == "model" else builtin_systems()
    if ref not in table:
        raise LlmplanError(f"references built-in {kind} '{ref}', which no longer exists")
    return table[ref], None


def plan_file(doc: PlanDocument, model: ModelSpec, system: SystemSpec, path: Path | None = None) -> PlanFile:
    """The typed plan of a document, for `model` on `system` (no rule checks: see load_plan)."""
    where = str(path) if path else "plan file"
    cluster = build(ClusterSpec, {"system": system, "num_nodes": doc.nodes, "gpus_per_node": doc.gpus_per_node},
                    f"{where} (cluster)")
    allowance = build(MemoryAllowance, doc.allowance, f"{where} (allowance)")
    order = parse_order(doc.axis_order)
    plan: ServePlan | ParallelPlan
    if doc.mode == "infer":
        plan = build(ServePlan, doc.plan, f"{where} (plan)")
        job: ServeJob | None = build(ServeJob, doc.job or {}, f"{where} (job)")
    else:
        fields = dict(doc.plan)
        per_tensor = fields.get("dtype") == "fp8" and fields.get("recipe", "tensorwise") == "tensorwise"
        if per_tensor and "fp8_scaling" not in fields:
            fields["fp8_scaling"] = "current"  # a file from before the field: every export then ran current scaling
        if "bias_dropout_fusion" not in fields:  # a file without the key: the model's default, as estimate settles
            fields["bias_dropout_fusion"] = default_bias_dropout_fusion(model)
        plan, job = build(ParallelPlan, fields, f"{where} (plan)"), None
        model = trained_model(model, plan)  # the MTP modules it trains: what its estimate and export build
    return PlanFile(model, cluster, plan, allowance, order, doc.mode, doc.predictions.model_dump(), doc, path, job)


def saved_pools(pf: PlanFile) -> tuple[PoolCluster, HeteroPlan] | None:
    """The cluster of several pools and the plan's place on them that `search --hardware cluster.yaml --save`
    recorded (key `pools`), the plan as the file holds it now; None for a plan of one system."""
    extra = (pf.document.model_extra or {}) if pf.document is not None else {}
    raw = extra.get("pools")
    if raw is None or pf.mode != "train":
        return None
    where = str(pf.path or "plan file")
    if not isinstance(raw, dict):
        raise LlmplanError(f"{where}: pools is {excerpt(repr(raw), 40)}; it holds `cluster` and `plan` as "
                           f"`llmplan search --save` writes them; re-create the plan")
    pc = build(PoolCluster, raw.get("cluster") or {}, f"{where} (pools.cluster)")
    hp = build(HeteroPlan, {**(raw.get("plan") or {}), "plan": pf.plan.model_dump()}, f"{where} (pools.plan)")
    check_pinned(pf, pc, hp, where)
    return pc, hp


def pinned_text(hp: HeteroPlan) -> str:
    """The pinned assignment as the file's keys hold it, e.g. 'stage_pools [1, 1, 0, 0]'."""
    if hp.stage_pools is not None:
        return f"stage_pools {list(hp.stage_pools)}"
    return f"replica_pools {list(hp.replica_pools or ())}, replica_batches {list(hp.replica_batches or ())}"


def check_pinned(pf: PlanFile, pc: PoolCluster, hp: HeteroPlan, where: str) -> None:
    """Refuse, in one line, a pinned assignment (pools.plan) that its cluster (pools.cluster) cannot hold
    (check_pools' rules), or one that puts the whole plan on a pool other than the system the file's hardware
    and nodes name (export and bench read those for a plan on one pool): estimate, export, check and lock
    price the assignment as pinned, never a re-derived one."""
    fix = ("edit pools.plan in the file (stage_pools / replica_pools and replica_batches: pool indices into "
           "pools.cluster.pools) or re-create the plan with `llmplan search --hardware CLUSTER.yaml --save`")
    violations = check_pools(pf.model, hp, pc)
    if violations:
        v = violations[0]
        raise LlmplanError(f"{where}: the pinned assignment pools.plan ({pinned_text(hp)}) breaks the rule "
                           f"{v.rule}: {v.message}; {fix}")
    used = hp.pools_used()
    if len(used) == 1:
        pool, c = pc.pools[used[0]], pf.cluster
        if pool.system.name != c.system.name or pf.plan.num_gpus != c.num_gpus:
            raise LlmplanError(f"{where}: the pinned assignment pools.plan ({pinned_text(hp)}) puts the whole "
                               f"plan ({pf.plan.num_gpus} GPUs) on pool {pool.name} ({pool.system.name}), but the "
                               f"file's hardware is {c.num_nodes} x {c.system.name} ({c.num_gpus} GPUs); a plan on "
                               f"one pool is that pool's system with the plan's GPUs; {fix}")


def refuse_mixed_pools(pf: PlanFile, what: str) -> None:
    """Refuse, in one line, a command that prices a plan on one system when the plan spans several pools."""
    saved = saved_pools(pf)
    if saved is not None and len(saved[1].pools_used()) > 1:
        pc, hp = saved
        names = ", ".join(pc.pools[g].name for g in hp.pools_used())
        raise LlmplanError(f"{pf.path or 'the plan file'} runs over the pools {names} of {pc.name}, and {what} "
                           f"prices a plan on one system; `llmplan check` re-prices it over its pools and "
                           f"`search --json` gives each pool's memory and time (pools.by_pool)")


def plan_violations(pf: PlanFile) -> list:
    """The rules the plan breaks for its model on its cluster."""
    if pf.mode == "infer":
        return check_serve_plan(pf.model, pf.plan, pf.serve_job, pf.cluster)
    return check_plan(pf.model, pf.plan, pf.cluster)


def document_plan(doc: dict[str, Any]) -> PlanFile:
    """The plan file `save_plan` would write for `doc`, as `load_plan` reads it back (through JSON, with the
    specs it snapshots), without writing it: what `search --target` asks the export about."""
    raw = json.loads(json.dumps(doc))
    typed = build(PlanDocument, raw, "plan")
    return plan_file(typed, build(ModelSpec, typed.model, "plan (model)"), snapshot_system(typed, Path("plan")))


def load_plan(path: Path, current: bool = False) -> PlanFile:
    """Read a plan file with the specs it snapshots (or, `current`, the specs it refers to as they are now);
    any problem (wrong kind, schema, invalid spec or plan, broken rule) is one clear error."""
    path = Path(path)
    doc = read_plan_document(path)
    if current:
        model, system, _, _ = current_specs(doc, path)
    else:
        model = build(ModelSpec, doc.model, f"{path} (model)")
        system = snapshot_system(doc, path)
    pf = plan_file(doc, model, system, path)
    violations = plan_violations(pf)
    if violations:
        if len(violations) == 1:  # one line, as every bad input
            listed = f" {violations[0].message}. "
        else:
            listed = "".join(f"\n  - {v.message}" for v in violations) + "\n"
        raise LlmplanError(f"{path}: the plan no longer passes its rules:{listed}{mend_note(pf, listed)}")
    return pf


def mend_note(pf: PlanFile, said: str = "") -> str:
    """How to mend a saved plan that a rule refuses, for the end of the refusal: the rules' messages name
    command-line flags, and the file holds plan keys. A switch the plan has no axis for (an older llmplan's
    search held it for every plan it saved) is named with its default, which prices the same (check_switches.
    settle); one with no flag (PLAN_FILE_ONLY) is named as the file's field to edit. `said`: the refusal's
    messages, whose --train-cuda-graphs is named as the key it sets (plan.cuda_graphs)."""
    reset = unused_switches(pf.plan) if pf.mode == "train" else {}
    flagged = {k: v for k, v in reset.items() if k not in PLAN_FILE_ONLY}
    file_only = {k: v for k, v in reset.items() if k in PLAN_FILE_ONLY}
    key = next(iter(flagged), "zero3_unit" if pf.mode == "train" else "tp")
    graphs = "; --train-cuda-graphs is plan.cuda_graphs" if "--train-cuda-graphs" in said else ""

    def edits(keys: dict[str, Any]) -> str:
        return ", ".join(f"{k}: {json.dumps(v)}" for k, v in keys.items())
    return (f"To mend {pf.path or 'the plan file'}: a flag is the plan key of its name (--{key.replace('_', '-')}"
            f" is plan.{key}{graphs}) and dropping it sets its default"
            + (f" ({edits(flagged)} here, which prices the plan the same)" if flagged else "")
            + (f"; {', '.join(file_only)} {'has' if len(file_only) == 1 else 'have'} no flag: edit the plan "
               f"file's field{'s' if len(file_only) > 1 else ''} ({edits(file_only)} here, which prices the plan "
               "the same)" if file_only else "")
            + "; or re-create the plan with `llmplan search --save`")
