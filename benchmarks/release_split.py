"""The 2024-vs-2025 software-stack split on H100, per --attention-releases mode (docs/validation.md#attention-release).

    python benchmarks/release_split.py [off|date|newer ...]

For each family's H100 training records (Megatron-LM's rows split into Megatron-Core r0.8 and the examples/llama
ones), the sustained H100 clock at which the family's median signed throughput error is zero, interpolated over
0.70-0.95 at attention_efficiency 0.75 (records that read no release), gemm_k_half 128 and A100 clock 0.825: a
stack that runs faster than llmplan prices it wants a higher clock. nan: no zero crossing on that range."""

from __future__ import annotations

import statistics
import sys

import numpy as np
import yaml

import accuracy as A

CLOCKS = tuple(round(0.7 + 0.025 * i, 3) for i in range(11))


def group(record_id: str) -> str:
    f = A.family(record_id)
    if f == "megatron":
        return "megatron-r0.8" if record_id.startswith("megatron-core-r0.8") else "megatron-examples"
    return f


def zero_clocks(records: list[dict], mode: str) -> dict[str, float]:
    A.attention_release_mode = mode
    medians: dict[str, list[float]] = {}
    for c in CLOCKS:
        errors = A.throughput_errors(records, {"attention_efficiency": 0.75, "gemm_k_half": 128.0,
                                               "clock_h100": c, "clock_a100": 0.825})
        by: dict[str, list[float]] = {}
        for rid, e in errors.items():
            by.setdefault(group(rid), []).append(e)
        for g, v in by.items():
            medians.setdefault(g, []).append(statistics.median(v))
    return {g: float(np.interp(0.0, m, CLOCKS)) if m[0] <= 0 <= m[-1] else float("nan")
            for g, m in sorted(medians.items()) if len(m) == len(CLOCKS)}


def main(argv: list[str]) -> int:
    records = yaml.safe_load(A.DEFAULT_RUNS.read_text())
    h100 = [r for r in records if A.clock_group(r) == "h100"
            and A.family(r["id"]) in A.TRAIN_FAMILIES + ("bridgecard", "dgxc")]
    for mode in argv or list(A.ATTENTION_RELEASE_MODES):
        print(f"{mode}: " + ", ".join(f"{g} {z:.3f}" for g, z in zero_clocks(h100, mode).items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
