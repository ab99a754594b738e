"""`llmplan calibrate`: turn `llmplan bench --out results.json` measurements into a hardware profile whose
GEMM efficiency table and collective efficiencies replace the defaults (docs/formulas.md#compute.gemm,
#comm.links). estimate and search say that the profile is calibrated, and from when and where."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from llmplan.errors import LlmplanError
from llmplan.fileio import write_atomic
from llmplan.specs.hardware import SystemSpec
from llmplan.topology.collectives import NVLS_MIN_GPUS, bus_factor

LARGE_MESSAGE = 64 * 2**20  # bus bandwidth saturates above ~64 MiB-1 GiB (nccl-tests busbw measurements in ml-engineering network/README.md)


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
