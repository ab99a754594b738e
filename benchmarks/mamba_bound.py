"""How much of the Nemotron-3 rows' error the Mamba-2 mixer can hold, bounded by the dense hybrid's published
step times (records dgxc-*, Nemotron-H 56B; docs/validation.md#mamba-dense-hybrid).

Prints, per Mamba-2 layer and micro-batch (forward and backward), the time llmplan prices for the mixer's scan
and traffic (the step with that cost at x1 minus x0) beside what the row leaves unplaced (measured minus
predicted step, over its micro-batches and Mamba-2 layers); then the median signed tokens/s error per model
when llmplan's whole Mamba-2 cost (cost.mixers.mamba_scan_flops, mamba_scan_backward_flops and
mamba_memory_bytes) is scaled by k. The
scaling is an experiment on the shipped functions, not a pricing. Last, per model and GPU, the k each row
would need for its predicted step to equal the measured one (1 + unplaced / the Mamba-2 cost priced in its step):
one k across GPUs, releases and micro-batch sizes is what a mis-priced kernel would give; a spread is not.

    python benchmarks/mamba_bound.py
"""

from __future__ import annotations

import statistics
from typing import Any
from unittest import mock

import accuracy as A
import llmplan.cost.mixers as mixers
from runs import load_runs

ROWS = ("dgxc-2510-pretrain-nemotron-h-56b-gb200-128gpu-fp8-tp4pp1mbs2gbs384",
        "mbridge-26.06-pretrain-nemotron-3-nano-dgx-gb200-8gpu-mxfp8-tp1pp1cp1ep8vpnagbs512mbs2",
        "dgxc-2508-pretrain-nemotron-h-56b-h100-128gpu-fp8-tp8pp1mbs1gbs384",
        "mbridge-26.06-pretrain-nemotron-3-nano-dgx-h100-16gpu-fp8-tp1pp1cp1ep8vpnagbs1024mbs1")
GROUPS = (("nano", "mbridge-", "nemotron-3-nano"), ("super", "mbridge-", "nemotron-3-super"),
          ("56b", "dgxc-", "nemotron-h-56b"), ("deepseek-v3", "mbridge-", "deepseekv3"), ("qwen3", "mbridge-", "qwen3"))
"""(name, id prefix, id part) of the rows whose median error is printed."""
SCAN, BACKWARD, TRAFFIC = mixers.mamba_scan_flops, mixers.mamba_scan_backward_flops, mixers.mamba_memory_bytes


def scaled(k: float) -> Any:
    """Patch the Mamba-2 scan FLOPs and traffic to k times the shipped functions."""
    return mock.patch.multiple(mixers, mamba_scan_flops=lambda m: k * SCAN(m),
                               mamba_scan_backward_flops=lambda m: k * BACKWARD(m),
                               mamba_memory_bytes=lambda m, b=1: k * TRAFFIC(m, b))


def step(rec: dict) -> tuple[float, int, int, float]:
    """(predicted step s, micro-batches per step, Mamba-2 layers, measured step s) of a tokens/s record, from
    accuracy.predict's tokens/s (the step moves global batch x sequence tokens over all GPUs)."""
    fam, gpus = A.family(rec["id"]), rec["hardware"]["gpus"]
    plan = A.plan_for(rec, fam, gpus)
    pred, meas = next((p, m) for quantity, p, m in A.predict(rec, fam) if quantity == "tok/s/GPU")
    tokens = plan.global_batch * plan.seq_len
    return (tokens / (pred * gpus), plan.global_batch // (plan.dp * plan.micro_batch),
            A.model_for(rec, fam).count_layers("mamba"), tokens / (meas * gpus))


def priced_and_unplaced(rec: dict) -> tuple[float, float, int, int]:
    """(the Mamba-2 cost priced in the step s, what the row leaves unplaced s = measured - predicted step,
    micro-batches per step, Mamba-2 layers) of a tokens/s record."""
    with scaled(0.0):
        without, *_ = step(rec)
    pred, n_mb, layers, measured = step(rec)
    return pred - without, measured - pred, n_mb, layers


def group(rid: str) -> str | None:
    return next((name for name, prefix, part in GROUPS if rid.startswith(prefix) and part in rid), None)


def main() -> None:
    runs = {r["id"]: r for r in load_runs()}
    print("per Mamba-2 layer and micro-batch, fwd+bwd: priced | unplaced")
    for rid in ROWS:
        priced, unplaced, n_mb, layers = priced_and_unplaced(runs[rid])
        print(f"  {rid[:64]:64s} {priced / n_mb / layers * 1e3:6.2f} ms | {unplaced / n_mb / layers * 1e3:+6.2f} ms")
    for k in (1.0, 2.0, 4.0, 8.0):
        errors: dict[str, list[float]] = {}
        with scaled(k):
            for rid, rec in runs.items():
                g = group(rid)
                for quantity, pred, meas in A.predict(rec, A.family(rid)) if g else ():
                    if quantity == "tok/s/GPU":
                        errors.setdefault(g or "", []).append((pred / meas - 1) * 100)
        print(f"k={k:g}: " + ", ".join(f"{g} {statistics.median(v):+.1f}% ({len(v)})" for g, v in errors.items()))
    print("k that closes each row (1 + unplaced / Mamba-2 cost priced), median [min, max] (rows), per model and GPU:")
    needed: dict[tuple[str, str, int], list[float]] = {}
    for rid, rec in runs.items():
        g = group(rid)
        if g not in ("nano", "super", "56b") or not any(q == "tok/s/GPU" for q, *_ in A.predict(rec, A.family(rid))):
            continue
        priced, unplaced, _, _ = priced_and_unplaced(rec)
        key = (g, rec["hardware"]["gpu"].split()[0], A.plan_for(rec, A.family(rid), rec["hardware"]["gpus"]).tp)
        needed.setdefault(key, []).append(1 + unplaced / priced)
    for (g, gpu, tp), v in sorted(needed.items()):
        print(f"  {g:6s} {gpu:6s} TP{tp}  {statistics.median(v):4.1f} [{min(v):4.1f}, {max(v):4.1f}] ({len(v)})")


if __name__ == "__main__":
    main()
