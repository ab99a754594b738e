"""Loading specs: built-in models and hardware shipped with the package, user YAML/JSON specs and raw
Hugging Face config.json files. This is the only module of specs/ that reads files."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from llmplan.errors import MAX_LISTED, LlmplanError, bounded_list, not_one_of, shown
from llmplan.fileio import excerpt, exists, read_document
from llmplan.specs.hardware import REQUIRED_KEYS, GpuSpec, SystemSpec
from llmplan.specs.hf import from_hf_config
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import TUPLE_ITEMS
from llmplan.specs.pools import InterPoolFabric, PoolCluster, PoolSpec


def data_dir(name: str) -> Path:
    """A data folder: inside the installed wheel (llmplan/<name>), or at the top of a source checkout."""
    packaged = Path(str(resources.files("llmplan"))) / name
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / name


SPEC_SUFFIXES = (".yaml", ".yml", ".json")
"""File suffixes of specs, profiles and plan files."""


def validation_message(origin: str, err: ValidationError, cls: type[BaseModel] | None = None,
                       flags: Mapping[str, str] | None = None) -> str:
    """One line per field problem: file, field, what pydantic found; a missing GPU key of REQUIRED_KEYS says
    what it means and a typical value; a key the spec `cls` does not have names its nearest keys. `flags`: the
    command-line flag that set each field (a spec built from options), named instead of the field, with the
    value to give."""
    parts = []
    errors = _tuple_lengths(err.errors())
    for e in errors[:MAX_LISTED]:
        field = ".".join(str(x) for x in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if flags and field in flags and e["type"] in ("literal_error", "enum"):
            parts.append(not_one_of(flags[field], excerpt(e["input"]), expected_values(e)))
            continue
        if flags and field in flags:
            parts.append(f"{flags[field]} {excerpt(e['input'])}: {msg}{_bound_fix(flags[field], e)}")
            continue
        if e["type"] in ("literal_error", "enum") and e["loc"]:
            parts.append(_file_choice(field, e))
            continue
        if e["type"] == "extra_forbidden" and cls is not None and e["loc"]:
            parts.append(f"field '{field}': {msg} (got {excerpt(e['input'])}); "
                         + _extra_key_fix(str(e["loc"][-1]), _keys_at(cls, e["loc"][:-1])))
            continue
        if e["type"] == "tuple_length":
            parts.append(f"field '{field}' takes {msg} (got {excerpt(e['input'])})")
            continue
        if e["type"] == "missing" and e["loc"] and e["loc"][-1] in REQUIRED_KEYS:
            parts.append(f"field '{field}' is missing: {REQUIRED_KEYS[str(e['loc'][-1])]}; add it to the profile")
            continue
        got = f" (got {excerpt(e['input'])})" if e["type"] != "missing" and not isinstance(e["input"], dict) else ""
        parts.append(f"field '{field}': {msg}{got}" if field else msg)
    more = f"; ... ({len(errors) - MAX_LISTED:,} more problems)" if len(errors) > MAX_LISTED else ""
    return f"{origin}: " + "; ".join(parts) + more


def _file_choice(field: str, e: Any) -> str:
    """A spec file's field given a value outside its set (norm_type: rmsnrm), in the words of every enum flag
    (errors.not_one_of): the field, the value, the accepted values and the line to write; an item of a list
    (kernels.1) is replaced; a key of a mapping (pydantic's loc ends in '[key]': tflops: {bf17: 900}) is
    renamed, the field named without the key."""
    loc = e["loc"]
    if loc[-1] == "[key]" and len(loc) >= 2:
        field = ".".join(str(x) for x in loc[:-2]) or field
        fix = f"rename key {shown(loc[-2])} to"
        return not_one_of(f"field '{field}':", loc[-2], expected_values(e), "allowed", fix)
    key = next((str(x) for x in reversed(loc) if not isinstance(x, int)), field)
    give = "replace it with" if isinstance(loc[-1], int) else f"set {key}:"
    return not_one_of(f"field '{field}':", excerpt(e["input"]), expected_values(e), "allowed", give)


def expected_values(e: Any) -> list[str]:
    """The values a Literal or Enum field takes, from pydantic's own listing of them ("'bf16', 'fp16' or 'fp8'")."""
    return re.findall(r"'((?:[^'\\]|\\.)*)'", str((e.get("ctx") or {}).get("expected", "")))


def _bound_fix(flag: str, e: Any) -> str:
    """The value a flag takes, from the bound pydantic reports (ge / gt / le / lt), or ""."""
    ctx = e.get("ctx") or {}
    for key, words in (("ge", "{} or more"), ("gt", "above {}"), ("le", "{} or less"), ("lt", "below {}")):
        if key in ctx:
            return f"; give {flag} " + words.format(ctx[key])
    return "; give a finite number" if e["type"] == "finite_number" else ""


def _keys_at(cls: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys of the spec nested at `loc` inside `cls` (through optional, tuple, list and dict fields), or []
    where the path leaves the specs."""
    here: Any = cls
    for part in loc:
        if isinstance(part, int) or not (isinstance(here, type) and issubclass(here, BaseModel)):
            continue
        field = here.model_fields.get(str(part))
        if field is None:
            return []
        here = _spec_in(field.annotation)
    if not (isinstance(here, type) and issubclass(here, BaseModel)):
        return []
    return sorted({*here.model_fields, *(f.alias for f in here.model_fields.values() if f.alias)})


def _spec_in(annotation: Any) -> Any:
    """The pydantic model an annotation holds (`GpuSpec`, `tuple[PoolSpec, ...]`, `X | None`), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _spec_in(arg)
        if found is not None:
            return found
    return None


def _extra_key_fix(key: str, keys: list[str]) -> str:
    close = difflib.get_close_matches(key, keys, n=3, cutoff=0.7)
    if close:
        return f"did you mean {', '.join(repr(c) for c in close)}?"
    return "remove it"


def _tuple_lengths(errors: list[Any]) -> list[Any]:
    """pydantic's errors with a fixed-length tuple's wrong length as one error (type "tuple_length", msg: how
    many items it takes and what they are, TUPLE_ITEMS): pydantic reports a short tuple as a "Field required"
    at each missing index (field 'tp_overlap_sms.3') and a long one as "at most N items"."""
    out: list[Any] = []
    seen: set[tuple[Any, ...]] = set()
    for e in errors:
        short = e["type"] == "missing" and len(e["loc"]) > 1 and isinstance(e["loc"][-1], int)
        long = e["type"] == "too_long" and (e.get("ctx") or {}).get("field_type") == "Tuple"
        if not (short or long):
            out.append(e)
            continue
        loc = tuple(e["loc"][:-1]) if short else tuple(e["loc"])
        if loc in seen:
            continue
        seen.add(loc)
        n = (max(x["loc"][-1] for x in errors if x["type"] == "missing" and tuple(x["loc"][:-1]) == loc) + 1
             if short else e["ctx"]["max_length"])
        what = TUPLE_ITEMS.get(str(loc[-1]), "items") if loc else "items"
        out.append({"type": "tuple_length", "loc": loc, "msg": f"{n} {what}", "input": e["input"]})
    return out


M = TypeVar("M", bound=BaseModel)


@contextmanager
def reported(origin: str, flags: Mapping[str, str] | None = None) -> Iterator[None]:
    """Build a spec by its constructor (`with reported("plan options"): ParallelPlan(tp=...)`, which a reader
    and a type checker can follow field by field); a ValidationError is one LlmplanError naming `origin` and
    the fields (validation_message): the one path of every spec built from user input."""
    try:
        yield
    except ValidationError as e:
        raise LlmplanError(validation_message(origin, e, flags=flags)) from None


def build(cls: type[M], data: Any, origin: str, flags: Mapping[str, str] | None = None) -> M:
    """`cls` validated from `data`; a validation problem is one LlmplanError naming `origin` and the fields
    (`flags`: the command-line flag of each field, named instead, validation_message)."""
    try:
        built = cls.model_validate(data)
    except ValidationError as e:
        raise LlmplanError(validation_message(origin, e, cls, flags)) from None
    return built


def _yaml_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix in SPEC_SUFFIXES)


@lru_cache(maxsize=None)
def builtin_models() -> dict[str, ModelSpec]:
    """Every model spec shipped in model_specs/, by name."""
    return {m.name: m for m in (load_model_file(p) for p in _yaml_files(data_dir("model_specs")))}


@lru_cache(maxsize=None)
def builtin_gpus() -> dict[str, GpuSpec]:
    folder = data_dir("hardware_profiles") / "gpus"
    return {g.name: g for g in (build(GpuSpec, read_document(p), str(p)) for p in _yaml_files(folder))}


@lru_cache(maxsize=None)
def builtin_systems() -> dict[str, SystemSpec]:
    folder = data_dir("hardware_profiles") / "systems"
    return {s.name: s for s in (load_system_file(p) for p in _yaml_files(folder))}


PATH_FIX = "or give a path to a YAML/JSON file"


def _unknown(kind: str, name: str, known: list[str], fix: str = PATH_FIX, where: str = "") -> LlmplanError:
    """Unknown built-in `name` (in file `where`, if any): the close matches, the built-ins, and `fix` (what
    else the key accepts)."""
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.4)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return LlmplanError(f"{where + ': ' if where else ''}unknown {kind} '{excerpt(name)}'{hint} "
                        f"(built-ins: {bounded_list(sorted(known), 40)}; {fix})")


def _not_a_plan(data: Any, path: Path, what: str) -> None:
    """A saved plan given where a spec is read (`--model plan.json`) is one line that points to --plan, not
    a spec's every missing and extra key."""
    if isinstance(data, dict) and data.get("kind") == "llmplan-plan":
        raise LlmplanError(f"{path} is an llmplan plan file, not {what}; price it with `llmplan estimate --plan "
                           f"{path}` (it names its model and hardware)")


MODEL_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads")
NETWORK_KEYS = frozenset({"nic_efficiency", "nic_gbit_per_s", "scaleout_fabric"})
# Value keys whose *_source key must name where the value was read (SystemSpec._rules, GpuSpec._host_op_sourced).
SYSTEM_SOURCED = {"host_cpu": "host_cpu_source", "host_memory_gb": "host_memory_source",
                  "price_per_gpu_hour": "price_source"}
GPU_SOURCED = {"host_op_factor": "host_op_source"}


def _own_sources(given: Mapping[str, Any], inherited: dict[str, Any], pairs: Mapping[str, str]) -> None:
    """A file on a base that changes a sourced value without giving its source does not inherit the base's
    source (which names the base's value): the source is blanked so the spec's own rule refuses the file."""
    for key, source in pairs.items():
        if key in given and source not in given and given[key] != inherited.get(key):
            inherited[source] = ""
SYSTEM_KEYS = ("gpu", "gpus_per_node", "base", "pools", "intra_node_gb_per_s")


def _other_kind(data: Any, path: Path, keys: tuple[str, ...], what: str, wanted: str, flag: str) -> None:
    """A file of the other kind (a model spec given to --hardware, a system profile to --model) is one line
    naming the keys that show it and the flag that reads it, not the spec's every missing and extra key."""
    found = [k for k in keys if isinstance(data, dict) and k in data]
    if found:
        raise LlmplanError(f"{path} is {what} ({', '.join(found)}), not {wanted}; give it to {flag}")


def load_model_file(path: Path) -> ModelSpec:
    """A llmplan model spec (YAML/JSON with a `name`) or a Hugging Face config.json."""
    data = read_document(path)
    _not_a_plan(data, path, "a model spec")
    if not any(k in data for k in MODEL_KEYS) if isinstance(data, dict) else False:
        _other_kind(data, path, SYSTEM_KEYS, "a hardware profile", "a model spec", "--hardware")
    if "name" not in data and "model_type" not in data:
        raise LlmplanError(f"{path} has neither model_type (a Hugging Face config.json's architecture, e.g. "
                           "\"model_type\": \"llama\") nor name (an llmplan model spec); add the one it is, or give "
                           "the model's own config.json")
    if "name" not in data and "model_type" in data:
        try:
            data = from_hf_config(data, default_name=path.parent.name if path.stem == "config" else path.stem)
        except ValueError as e:
            raise LlmplanError(f"{path}: {e}") from None
    return build(ModelSpec, data, str(path))


def load_system_file(path: Path) -> SystemSpec:
    """A system profile; its `gpu` is a built-in GPU name or an inline GPU mapping. A cluster description
    may start from a built-in system with `base: NAME` and override any key (e.g. nics_per_node,
    oversubscription); a `gpu` mapping without a `name` then overrides keys of the base's GPU (e.g. its
    sustained_clock_fraction). It may not give a node more GPUs than the base node shape has."""
    data = dict(read_document(path))
    _not_a_plan(data, path, "a system profile")
    _other_kind(data, path, MODEL_KEYS, "a model spec", "a system profile", "--model")
    base_name = data.pop("base", None)
    base, base_gpu = None, False
    if base_name is not None:
        systems = builtin_systems()
        if not isinstance(base_name, str):
            raise LlmplanError(f"{path}: base is {excerpt(repr(base_name), 40)}; give the name of one built-in "
                               f"system (e.g. base: dgx-h100; built-ins: {bounded_list(sorted(systems), 40)})")
        if base_name not in systems:
            raise _unknown("base system", base_name, list(systems),
                           "base takes the name of a built-in system only", where=str(path))
        base = systems[base_name]
        base_gpu = "gpu" not in data or (isinstance(data["gpu"], dict) and "name" not in data["gpu"])
        if isinstance(data.get("gpu"), dict) and "name" not in data["gpu"]:
            base_gpu_fields = base.gpu.model_dump()
            _own_sources(data["gpu"], base_gpu_fields, GPU_SOURCED)
            data["gpu"] = {**base_gpu_fields, **data["gpu"]}
        inherited = base.model_dump()
        _own_sources(data, inherited, SYSTEM_SOURCED)
        # The base's ring-collective share was read on the base's network: a file that changes the network
        # without giving its own share falls back to its nic_efficiency (SystemSpec.allreduce_nic_efficiency).
        if "allreduce_nic_efficiency" not in data and NETWORK_KEYS & set(data):
            inherited["allreduce_nic_efficiency"] = None
        data = {**inherited, "name": path.stem, **data}
    gpu = data.get("gpu")
    if isinstance(gpu, str):
        gpus = builtin_gpus()
        if gpu not in gpus:
            raise _unknown("GPU", gpu, list(gpus),
                           "or write the GPU's fields inline as a mapping under gpu:", where=str(path))
        data["gpu"] = gpus[gpu].model_dump()
    system = build(SystemSpec, data, str(path))
    # Checked on the built spec, so that the rule applies to the value as read (a float 16.0 too).
    if base is not None and base_gpu and system.gpus_per_node > base.gpus_per_node:
        raise LlmplanError(f"{path}: gpus_per_node ({system.gpus_per_node}) exceeds the {base.gpus_per_node} GPU "
                           f"slots of a {base_name} node; use at most {base.gpus_per_node} or describe another "
                           f"node shape")
    return system


def looks_like_path(ref: str) -> bool:
    """Whether a --model / --hardware / *_ref value names a file rather than a built-in (the one place this
    is decided)."""
    return Path(ref).suffix in SPEC_SUFFIXES or "/" in ref


def resolve_model(ref: str) -> ModelSpec:
    """--model: a built-in name or a path to a spec / config.json."""
    models = builtin_models()
    if looks_like_path(ref) or (ref not in models and exists(Path(ref))):
        path = Path(ref)
        if not exists(path):
            raise LlmplanError(f"model file {ref} does not exist" + _hub_id_hint(ref, list(models)))
        if path.is_dir():
            inside = path / "config.json"
            raise LlmplanError(f"{ref} is a folder; give the model's config.json (or a spec file) itself"
                               + (f": --model {inside}" if inside.is_file() else f", e.g. --model {inside}"))
        return load_model_file(path)
    if ref not in models:
        raise _unknown("model", ref, list(models))
    return models[ref]


def _hub_id_hint(ref: str, known: list[str]) -> str:
    """For a missing `org/name` without a spec suffix (a Hugging Face Hub id, e.g. meta-llama/Llama-3.1-8B):
    llmplan reads files, not the Hub; where to get the file, and the closest built-in."""
    parts = ref.split("/")
    if len(parts) != 2 or not all(parts) or Path(ref).suffix in SPEC_SUFFIXES:
        return ""
    close = difflib.get_close_matches(parts[1].lower(), known, n=1, cutoff=0.6)
    return ("; a Hugging Face Hub id is not read from the Hub: download its config.json (e.g. `huggingface-cli "
            f"download {ref} config.json`) and give that path" + (f", or use the built-in {close[0]}" if close else ""))


def resolve_system(ref: str) -> SystemSpec:
    """--hardware: a built-in system name or a path to a system profile."""
    if looks_like_path(ref):
        if not exists(Path(ref)):
            raise LlmplanError(f"hardware file {ref} does not exist")
        if is_pool_file(ref):
            one = single_pool(Path(ref))
            if one is not None:
                raise LlmplanError(f"{ref} is a cluster file of one pool (`pools:`), which only `llmplan search` "
                                   f"reads; give its system here: --hardware {one[0]} --nodes {one[1]}")
            raise LlmplanError(f"{ref} lists several pools (`pools:`); only `llmplan search` (training, or "
                               f"--mode infer) plans a cluster of several pools; give one system here, e.g. the "
                               f"pool's system name")
        return load_system_file(Path(ref))
    systems = builtin_systems()
    if ref in systems:
        return systems[ref]
    if ref in builtin_gpus():
        with_gpu = [s.name for s in systems.values() if s.gpu.name == ref]
        raise LlmplanError(f"'{ref}' is a GPU, not a system; --hardware takes a node shape: "
                           f"{', '.join(with_gpu) or ', '.join(sorted(systems))}")
    raise _unknown("hardware", ref, list(systems))


def is_pool_file(ref: str) -> bool:
    """Whether --hardware names a cluster file of several pools (a mapping with a `pools` key)."""
    if not looks_like_path(ref) or not exists(Path(ref)):
        return False
    return "pools" in read_document(Path(ref))


def load_pool_file(path: Path) -> PoolCluster:
    """A cluster of several pools: `pools: [{system: dgx-h100, nodes: 8}, ...]` (each system a built-in name or
    a system file; `name` optional, defaulting to the system's) and `fabric: {gb_per_s, latency_s}` between
    them. Each problem is one line naming the file and the pool."""
    data = dict(read_document(path))
    pools = data.get("pools")
    if not isinstance(pools, list) or not pools:
        raise LlmplanError(f"{path}: pools is {excerpt(repr(pools), 40)}; give a list of pools, e.g. pools: "
                           f"[{{system: dgx-h100, nodes: 8}}, {{system: dgx-a100, nodes: 16}}]")
    built = _pool_entries(path, pools)
    if "fabric" not in data:
        raise LlmplanError(f"{path}: no fabric between the pools; add e.g. fabric: {{gb_per_s: 50, latency_s: "
                           f"1.0e-5}} (bandwidth per GPU across pools, one direction, and latency)")
    return build(PoolCluster, {"name": data.get("name", Path(path).stem), "pools": built,
                               "fabric": data["fabric"], **{k: v for k, v in data.items()
                                                            if k not in ("name", "pools", "fabric")}}, str(path))


def _pool_entries(path: Path, pools: list[Any]) -> list[dict[str, Any]]:
    """Each pool of a cluster file with its system resolved and its name defaulted (the system's)."""
    built = []
    for i, pool in enumerate(pools):
        ref = pool_system_ref(path, i, pool)
        if looks_like_path(ref) and exists(Path(ref)) and is_pool_file(ref):
            raise LlmplanError(f"{path}: pool {i + 1}'s system {pool['system']} is itself a cluster of pools; "
                               f"give one system per pool")
        try:
            system = resolve_system(ref)
        except LlmplanError as e:
            raise LlmplanError(f"{path}: pool {i + 1}: {e}") from None
        built.append({**pool, "system": system, "name": pool.get("name", system.name)})
    return built


def pool_system_ref(path: Path, i: int, pool: Any) -> str:
    """Pool i's `system` as --hardware takes it: a built-in name, or a system file's path (relative to the
    cluster file's folder)."""
    if not isinstance(pool, dict) or not isinstance(pool.get("system"), str):
        raise LlmplanError(f"{path}: pool {i + 1} is {excerpt(repr(pool), 60)}; each pool is a mapping with "
                           f"`system` (a built-in name or a system file) and `nodes`")
    ref = pool["system"]
    if looks_like_path(ref) and not Path(ref).is_absolute():
        ref = str(Path(path).parent / ref)
    return ref


def single_pool(path: Path) -> tuple[str, int] | None:
    """(the system's --hardware reference, nodes) of a cluster file that lists one pool (checked as
    load_pool_file checks it, save that one pool needs no fabric between pools); None when it lists several."""
    data = dict(read_document(path))
    pools = data.get("pools")
    if not (isinstance(pools, list) and len(pools) == 1):
        load_pool_file(path)  # checks the file: one line naming the problem
        return None
    extra = sorted(set(data) - set(PoolCluster.model_fields))
    if extra:
        raise LlmplanError(f"{path}: unknown key(s) {', '.join(extra)}; a cluster file takes "
                           f"{', '.join(PoolCluster.model_fields)}")
    if "fabric" in data:  # unused with one pool, but a wrong one is still a mistake in the file
        build(InterPoolFabric, data["fabric"], f"{path} (fabric)")
    pool = build(PoolSpec, _pool_entries(path, pools)[0], f"{path} (pool 1)")
    return pool_system_ref(path, 0, pools[0]), pool.nodes
