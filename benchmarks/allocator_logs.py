"""The caching allocator's measured reserve at the peak, from published training logs (issue 32;
docs/validation.md#allocator-logs).

Reads `benchmarks/data/allocator_logs.yaml` (max allocated and max reserved as Megatron-LM, Megatron-Bridge,
NeMo 2 and DeepSpeed print them, each record with its source) and prints, per stack, the distribution of
(max reserved - max allocated) / max allocated, one value a record (at its rank with the largest max allocated,
the rank nearest to an OOM), beside the two flat fractions of llmplan's tensors that the binding fit records
allow (docs/validation.md#allocator-reserve): NeMo 24.07's GPT-3 20B ran, so it needs the allowance under its
threshold; BLOOM's dp32 tp2 pp6 attempt ran out of memory, so it needs it above its own.

Reserved over allocated is an upper bound on what decides an OOM: when cudaMalloc fails PyTorch's caching
allocator frees its cached unsplit segments and retries, so only the free pieces of partly used segments
(`inactive_split_bytes`, printed by Megatron-Bridge as mem-max-inactive-gigabytes) stand between allocated and
capacity. Analysis only: nothing in llmplan reads this file.

    PYTHONPATH=$PWD python benchmarks/allocator_logs.py [--no-thresholds]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from llmplan.specs.allowance import MemoryAllowance

DATA = Path(__file__).resolve().parent / "data" / "allocator_logs.yaml"
STACKS = ("megatron-core", "megatron-legacy", "megatron-deepspeed", "deepspeed")
UNIT_BYTES = {"MiB": 2**20, "GiB": 2**30, "GB": 1e9, "B": 1.0}
NEAR_CAPACITY_GIB = 40.0
"""Records whose peak allocation reaches this are the ones sized like the fit records (64-192 GiB GPUs)."""
BINDING = {
    "nemo2407-pretrain-gpt3-20b-64gpu-gbs256": "ran",
    "bloom-prequel-gbs-and-tp-variations-L72h14336a64-dp32tp2pp6mbs1gbs2048z1": "OOM",
}


@dataclass(frozen=True)
class Measured:
    id: str
    stack: str
    kind: str
    after_iterations: int
    max_allocated_gib: float  # at the rank with the largest max allocated
    reserve: float  # (max reserved - max allocated) / max allocated at that rank
    inactive: float | None  # max inactive split / max allocated at that rank, where printed
    excluded: str | None


def load(path: Path = DATA) -> list[dict]:
    return list(yaml.safe_load(path.read_text()))


def measure(rec: dict) -> Measured:
    """One record's reserve, read at its rank with the largest max allocated."""
    lines = rec["lines"]
    i = max(range(len(lines)), key=lambda k: lines[k][2])
    max_alloc, max_res = lines[i][2], lines[i][4]
    inactive = rec.get("max_inactive")
    return Measured(rec["id"], rec["stack"], rec["kind"], rec["after_iterations"],
                    max_alloc * UNIT_BYTES[rec["unit"]] / 2**30, max_res / max_alloc - 1,
                    None if inactive is None else inactive[i] / max_alloc, rec.get("excluded"))


@dataclass(frozen=True)
class Spread:
    n: int
    median: float
    low: float
    high: float


def spread(values: list[float]) -> Spread | None:
    return Spread(len(values), statistics.median(values), min(values), max(values)) if values else None


def summarise(ms: list[Measured], min_iterations: int = 1,
              min_gib: float = 0.0) -> dict[str, Spread | None]:
    """Per stack, the spread of the included records' reserve fractions."""
    kept = [m for m in ms if m.excluded is None and m.after_iterations >= min_iterations
            and m.max_allocated_gib >= min_gib]
    return {s: spread([m.reserve for m in kept if m.stack == s]) for s in STACKS}


def thresholds() -> dict[str, float]:
    """Per binding fit record, the fraction of llmplan's allowance base (the churned tensors since
    docs/validation.md#split-allowance) at which it sits exactly at capacity."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import allocator_reserve as R

    out = {}
    for r in R.rows(frozenset(BINDING)):
        # r.frag is the shipped allowance's bytes, its default fraction of this (docs/formulas.md#mem.other)
        base = r.frag / MemoryAllowance().fragmentation
        out[r.id] = (r.capacity - (r.total - r.frag)) / base
    return out


def fmt(s: Spread | None) -> str:
    if s is None:
        return "n=0"
    return f"n={s.n:2d}  median {100 * s.median:5.1f}%  range {100 * s.low:5.1f}% .. {100 * s.high:5.1f}%"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-thresholds", action="store_true", help="skip pricing the two binding fit records")
    args = ap.parse_args()
    ms = [measure(r) for r in load()]
    kept = [m for m in ms if m.excluded is None]
    print(f"{len(ms)} records, {len(kept)} used ({len(ms) - len(kept)} excluded); "
          f"by source: {sum(m.kind == 'url' for m in kept)} url, {sum(m.kind == 'repo' for m in kept)} repo, "
          f"{sum(m.kind == 'index' for m in kept)} index-only")
    print("(max reserved - max allocated) / max allocated, one value a record:")
    for title, it, gib in (("all", 1, 0.0), (">= 2 iterations", 2, 0.0),
                           (f">= 2 iterations, peak >= {NEAR_CAPACITY_GIB:.0f} GiB", 2, NEAR_CAPACITY_GIB)):
        print(f"  {title}:")
        for stack, s in summarise(ms, it, gib).items():
            print(f"    {stack:19s} {fmt(s)}")
    print("  per record (stack, iterations, peak GiB, reserve, inactive split where printed):")
    for m in sorted(kept, key=lambda m: (m.stack, m.reserve)):
        ina = "" if m.inactive is None else f"  inactive {100 * m.inactive:5.1f}%"
        print(f"    {m.stack:19s} {m.after_iterations:4d} it {m.max_allocated_gib:6.1f} GiB "
              f"{100 * m.reserve:6.1f}%{ina}  {m.id}")
    if not args.no_thresholds:
        print("flat fraction of llmplan's tensors at which each binding fit record sits at capacity:")
        for rid, f in thresholds().items():
            need = "under" if BINDING[rid] == "ran" else "over"
            print(f"  {BINDING[rid]:3s} {rid}: needs the allowance {need} {100 * f:.2f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
