"""`llmplan calibrate`: turn `llmplan bench --out results.json` measurements into a hardware profile whose
GEMM efficiency table and collective efficiencies replace the defaults (docs/formulas.md#compute.gemm,
#comm.links), or anchor a profile to one measured run of a saved plan (--plan --step-time: anchored_system).
estimate and search say that the profile is calibrated, and from when and where."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from llmplan.errors import LlmplanError
from llmplan.fileio import write_atomic
from llmplan.specs.hardware import SystemSpec
from llmplan.topology.collectives import NVLS_MIN_GPUS, bus_factor
from llmplan.units import GIB

# bus bandwidth saturates above ~64 MiB-1 GiB (nccl-tests busbw measurements in ml-engineering network/README.md)
LARGE_MESSAGE = 64 * 2**20


def calibrated_system(system: SystemSpec, results: dict[str, Any], source: str) -> SystemSpec:
    """A copy of `system` with the measured GEMM efficiencies and collective efficiencies."""
    if results.get("backend") != "nccl" or not results.get("raw"):
        raise LlmplanError(f"{source} was not measured on GPUs with NCCL (backend {results.get('backend')!r}); "
                           "calibrating a GPU profile from it would be wrong: run `llmplan bench --backend nccl`")
    rank0 = min(results["raw"], key=lambda r: r["rank"])
    peak = system.gpu.peak_flops("bf16")
    table: dict[float, float] = {}
    for g in rank0.get("gemm", []):
        d = float(min(g["m"], g["k"], g["n"]))
        table[d] = max(table.get(d, 0.0), g["tflops"] * 1e12 / peak)
    gpu = system.gpu.model_copy(update={"gemm_efficiency": tuple(sorted(table.items())) or None})
    update: dict[str, Any] = {"gpu": gpu}
    spec = system.intra_node_gb_per_s * 1e9
    ring = nvls = None
    for c in rank0.get("collectives", []):
        if c["bytes"] < LARGE_MESSAGE or c["ranks"] > system.domain_gpus or c["ranks"] < 2:
            continue
        busbw = c["bytes"] * bus_factor(c["op"], c["ranks"]) / c["seconds"]
        if c["op"] == "all-reduce" and system.nvls and c["ranks"] >= NVLS_MIN_GPUS:
            nvls = max(nvls or 0.0, busbw / spec)
        elif c["op"] in ("all-gather", "reduce-scatter", "all-reduce"):
            ring = max(ring or 0.0, busbw / spec)
    if ring:
        update["ring_efficiency" if system.intra_node_fabric not in ("nvlink-mesh", "infinity-fabric")
               else "mesh_efficiency"] = round(min(ring, 1.5), 4)
    if nvls:
        update["nvls_factor"] = round(min(nvls, 2.0), 4)
    curve = attention_head_dims_measured(rank0.get("attention", []))
    if curve:
        update["gpu"] = update["gpu"].model_copy(update=curve)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    update["calibrated"] = (f"llmplan bench on {results.get('host')} ({results.get('device')}), {len(table)} GEMM "
                            f"shapes, {'ring ' + str(update.get('ring_efficiency')) if ring else 'no large ring'}"
                            f"{', NVLS ' + str(update['nvls_factor']) if nvls else ''}"
                            f"{''.join(f', {k} {v:g}' for k, v in curve.items())}; calibrated {when}")
    update["name"] = f"{system.name}-calibrated"
    update["source"] = f"{system.source} | calibrated from {source}"
    return system.model_copy(update=update)


def solve_d0(ratio: float, d1: float, d2: float) -> float | None:
    """The d0 of rate ~ d / (d + d0) that gives rate(d1) / rate(d2) = ratio (docs/formulas.md#compute.attention);
    None when the measured ratio is outside what the curve can give (between 1 and d1/d2)."""
    den = ratio * d2 - d1
    d0 = d1 * d2 * (1 - ratio) / den if den else -1.0
    return round(d0, 1) if 0 <= d0 <= 1024 else None


def attention_head_dims_measured(cases: list[dict[str, Any]]) -> dict[str, float]:
    """GPU fields attention_softmax_head_dim / flash2_softmax_head_dim from `llmplan bench`'s attention pair
    (the model's head dim and the reference one) under each kernel."""
    fields = {"native": "attention_softmax_head_dim", "flash2": "flash2_softmax_head_dim"}
    out: dict[str, float] = {}
    for kernel, name in fields.items():
        ok = [c for c in cases if c.get("kernel") == kernel and not c.get("error") and c["qk"] == c["v"]]
        model = next((c for c in ok if c["name"] == "model"), None)
        ref = next((c for c in ok if c["name"] != "model"), None)
        if model is None or ref is None or model["qk"] == ref["qk"]:
            continue
        rate = lambda c: c["b"] * c["s"] ** 2 * c["a"] * c["qk"] / c["seconds"]  # noqa: E731
        d0 = solve_d0(rate(model) / rate(ref), model["qk"], ref["qk"])
        if d0 is not None:
            out[name] = d0
    return out


def write_profile(system: SystemSpec, out: Path, force: bool) -> None:
    doc = system.model_dump(mode="json")
    doc["gpu"]["gemm_efficiency"] = [list(x) for x in doc["gpu"].get("gemm_efficiency") or []] or None
    write_atomic(out, "# llmplan calibrated hardware profile (use with --hardware " + str(out) + ")\n"
                 + yaml.safe_dump(doc, sort_keys=False, width=200), force=force)


ANCHOR_TOLERANCE = 0.01
"""The calibrated profile reproduces the anchor run's step time to within this fraction."""
COMM_KEYS = ("ring_efficiency", "mesh_efficiency", "nic_efficiency")
"""System keys the communication factor scales (bounded by their fields' limits)."""


@dataclass(frozen=True)
class Anchor:
    """A profile calibrated to one measured run (anchored_system)."""

    system: SystemSpec
    """The calibrated system."""
    changes: list[tuple[str, float, float]]
    """(key, before, after) of every constant that moved; gpu keys as gpu.<key>."""
    predicted_s: float
    """The anchor plan's step time on the profile before calibration."""
    calibrated_s: float
    """Its step time on the calibrated profile."""
    measured_s: float
    """The measured step time."""
    memory: tuple[float, float] | None = None
    """(predicted peak bytes, measured peak bytes) when --memory-gib was given."""
    shares: dict[str, float] | None = None
    """The predicted step's shares (time_shares) the gap was attributed by."""


def _clamp(model: Any, key: str, value: float) -> float:
    """`value` held inside the bounds of field `key` of `model` (ge / gt / le; gt as 1% above it)."""
    lo, hi = -float("inf"), float("inf")
    for m in model.model_fields[key].metadata:
        if getattr(m, "ge", None) is not None:
            lo = max(lo, float(m.ge))
        if getattr(m, "gt", None) is not None:
            lo = max(lo, float(m.gt) + 0.01)
        if getattr(m, "le", None) is not None:
            hi = min(hi, float(m.le))
    return min(hi, max(lo, value))


def scaled_system(system: SystemSpec, clock: float, comm: float | None = None,
                  overhead: float | None = None) -> SystemSpec:
    """The system with its sustained clock times `clock` and its collective efficiencies times `comm` (default
    `clock`; each held inside its field's bounds) and, if given, the GPU's step overhead."""
    gpu = system.gpu
    comm = clock if comm is None else comm
    upd: dict[str, Any] = {"sustained_clock_fraction": _clamp(type(gpu), "sustained_clock_fraction",
                                                              gpu.sustained_clock_fraction * clock)}
    if overhead is not None:
        upd["step_overhead_s"] = overhead
    sys_upd: dict[str, Any] = {"gpu": gpu.model_copy(update=upd)}
    for k in COMM_KEYS:
        sys_upd[k] = _clamp(SystemSpec, k, getattr(system, k) * comm)
    if system.allreduce_nic_efficiency is not None:  # set only where a published all-reduce reading gave it
        sys_upd["allreduce_nic_efficiency"] = _clamp(SystemSpec, "allreduce_nic_efficiency",
                                                     system.allreduce_nic_efficiency * comm)
    return system.model_copy(update=sys_upd)


def time_shares(time: Any) -> dict[str, float]:
    """Shares of a predicted step (StepTime): `clock` for what the sustained clock prices (compute, the
    pipeline bubble it leaves idle, the optimizer), `communication` for the exposed collectives, `overhead`
    for the rest (host launches, stragglers, a measured step overhead). They sum to 1."""
    total = float(time.total)
    clock = float(time.compute) + float(time.bubble) + float(time.optimizer)
    comm = float(time.comm_exposed)
    return {"clock": clock / total, "communication": comm / total, "overhead": 1 - (clock + comm) / total}


def attribution(shares: dict[str, float]) -> tuple[float, float]:
    """(clock weight, communication weight) of the measured gap: each constant moves (in log) in proportion
    to its part of the predicted step, the least change that reproduces the run when every constant is as
    uncertain as the others (minimum-norm solution of d log T = -sum_k share_k d log s_k). A run that is 95%
    compute says almost nothing about the collectives and moves the clock; a communication-bound run moves
    the collective efficiencies (docs/validation.md#intervals)."""
    c, m = shares["clock"], shares["communication"]
    if c + m <= 0:
        return 0.5, 0.5
    return c / (c + m), m / (c + m)


def anchored_system(model: Any, cluster: Any, plan: Any, allowance: Any, order: tuple[str, ...], step_s: float,
                    memory_gib: float | None = None) -> Anchor:
    """The profile that reproduces a measured step time (and peak memory) of `plan`: the sustained clock
    fraction and the collective efficiencies move by factors e^(t w_clock) and e^(t w_comm), the weights the
    constants' shares of the predicted step (attribution), t found by bisection; the step overhead lowered
    when both reach their fields' limits; hbm_reserve_gib = measured - predicted peak for --memory-gib."""
    import math

    from llmplan.estimate import estimate_training

    system = cluster.system

    def estimate(sys_: SystemSpec) -> Any:
        return estimate_training(model, cluster.model_copy(update={"system": sys_}), plan, allowance, order)

    def step(sys_: SystemSpec) -> float:
        return float(estimate(sys_).time.total)

    first = estimate(system)
    before = float(first.time.total)
    shares = time_shares(first.time)
    w_clock, w_comm = attribution(shares)
    reach = 3.0 / max(min(w_clock, w_comm), 0.01)  # t at which both factors pass e^3 (past every field's limit)

    def at(sys_: SystemSpec, t: float, overhead: float | None = None) -> SystemSpec:
        return scaled_system(sys_, math.exp(min(t * w_clock, 50.0)), math.exp(min(t * w_comm, 50.0)), overhead)

    lo, hi = -reach, reach
    if step(at(system, hi)) > step_s:  # faster than the caps allow: lower the overhead too
        fast = at(system, hi)
        need = step(fast) - step_s
        if need >= fast.gpu.step_overhead_s:
            raise LlmplanError(f"measured step {step_s:g} s is faster than llmplan can price this plan with the "
                               f"clock at 100% of peak, collectives at their limits and no step overhead "
                               f"({step(at(system, hi, 0.0)):.4g} s): check --step-time (seconds per "
                               "optimizer step, the whole global batch) and the plan file")
        system = system.model_copy(update={"gpu": system.gpu.model_copy(
            update={"step_overhead_s": fast.gpu.step_overhead_s - need})})
    for _ in range(80):
        mid = (lo + hi) / 2
        if step(at(system, mid)) > step_s:
            lo = mid
        else:
            hi = mid
    new = at(system, hi)
    after = step(new)
    if abs(after / step_s - 1) > ANCHOR_TOLERANCE:
        raise LlmplanError(f"measured step {step_s:g} s is slower than llmplan can price this plan with the "
                           f"clock and collective efficiencies at their lowest ({after:.4g} s): check --step-time "
                           "(seconds per optimizer step, the whole global batch) and the plan file")
    memory = None
    if memory_gib is not None:
        gpu = system.gpu
        if memory_gib > gpu.hbm_gib:
            raise LlmplanError(f"--memory-gib {memory_gib:g}: a measured peak above the {gpu.hbm_gib:g} GiB of one "
                               f"{gpu.name}; give the peak per GPU (e.g. torch.cuda.max_memory_reserved() on the "
                               "busiest rank), not the job's total")
        pred = float(estimate(new).memory.total)
        reserve = memory_gib - pred / GIB
        if not -gpu.hbm_gib <= gpu.hbm_reserve_gib + reserve:  # GpuSpec's rule: the profile would be refused
            raise LlmplanError(f"--memory-gib {memory_gib:g}: llmplan predicts {pred / GIB:.1f} GiB per GPU for "
                               f"this plan, more than one {gpu.name}'s {gpu.hbm_gib:g} GiB above the measured "
                               "peak; check --memory-gib (the busiest rank's peak, GiB) and the plan file")
        new = new.model_copy(update={"gpu": new.gpu.model_copy(
            update={"hbm_reserve_gib": round(system.gpu.hbm_reserve_gib + reserve, 3)})})
        memory = (pred, memory_gib * GIB)
    changes = [(f"gpu.{k}", float(getattr(cluster.system.gpu, k)), float(getattr(new.gpu, k)))
               for k in ("sustained_clock_fraction", "step_overhead_s", "hbm_reserve_gib")]
    changes += [(k, float(getattr(cluster.system, k)), float(getattr(new, k))) for k in COMM_KEYS]
    if cluster.system.allreduce_nic_efficiency is not None and new.allreduce_nic_efficiency is not None:
        changes.append(("allreduce_nic_efficiency", float(cluster.system.allreduce_nic_efficiency),
                        float(new.allreduce_nic_efficiency)))
    changes = [c for c in changes if abs(c[2] - c[1]) > 1e-9]
    return Anchor(new, changes, before, after, step_s, memory, shares)


def anchor_profile_text(anchor: Anchor, base: str | None, note: str) -> str:
    """The calibrated profile as YAML: `base:` and the keys that differ from it (README's custom cluster form)
    when the plan's system is a built-in, else the whole system."""
    new = anchor.system.model_dump(mode="json")
    if base is None:
        new["gpu"]["gemm_efficiency"] = [list(x) for x in new["gpu"].get("gemm_efficiency") or []] or None
        return yaml.safe_dump({**new, "calibrated": note}, sort_keys=False, width=200)
    from llmplan.specs.registry import builtin_systems

    ref = builtin_systems()[base].model_dump(mode="json")
    doc: dict[str, Any] = {"base": base}
    doc.update({k: v for k, v in new.items() if k not in ("gpu", "name", "source", "calibrated") and ref.get(k) != v})
    gpu = {k: v for k, v in new["gpu"].items() if ref["gpu"].get(k) != v and k not in ("name", "source")}
    if gpu:
        doc["gpu"] = gpu
    doc["calibrated"] = note
    return yaml.safe_dump(doc, sort_keys=False, width=200)
