"""Which allowance for the caching allocator's reserve the published fit records allow (issue 32;
docs/validation.md#allocator-reserve).

Every record that says whether a run fit (a run measured: it ran; `outcome: OOM`: it did not) and every BLOOM
peak logged with nvidia-smi is priced once with the shipped allowance and once without fragmentation; the
allowance is then replaced, record by record, by candidate mechanisms (a fraction of the tensors allocated once,
another of the tensors freed and allocated again every micro-batch or step), and the script prints which fit
records each candidate gets wrong and BLOOM's memory median |error| under it. Analysis only: nothing in llmplan
reads this file.

    PYTHONPATH=$PWD python benchmarks/allocator_reserve.py
"""
from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy as A

from llmplan.estimate import estimate_training
from llmplan.specs.allowance import MemoryAllowance

GIB = 2**30
AUTOGRAD_GRADS = ("bloom", "mtnlg")
"""Stacks whose gradients autograd allocates per parameter each step (DeepSpeed's engines under
Megatron-DeepSpeed), read here as churned; Megatron-LM's DDP keeps them in one contiguous buffer allocated at
start (megatron/core/distributed/param_and_grad_buffer.py), read as held."""


@dataclass(frozen=True)
class Row:
    id: str
    fam: str
    kind: str  # "ran", "OOM" or "mem" (a logged peak only)
    total: float
    capacity: float
    frag: float  # the shipped allowance's bytes
    held: float  # weights + optimizer (+ gradients outside AUTOGRAD_GRADS)
    churned: float  # activations + gathered / after-backward bytes (+ gradients in AUTOGRAD_GRADS)
    smi: float | None  # accuracy.nvidia_smi_bytes (BLOOM)
    measured_gib: float | None


def rows(ids: frozenset[str] | None = None) -> list[Row]:
    """The fit records and BLOOM's logged peaks, priced; only the records named in `ids` when given."""
    out = []
    for r in yaml.safe_load(Path(A.DEFAULT_RUNS).read_text()):
        if ids is not None and r["id"] not in ids:
            continue
        fam = A.family(r["id"])
        if fam not in A.FAMILIES or fam == "trtllm":
            continue
        try:
            fits = [q for q in A.predict(r, fam) if q[0] == "fits"]
        except (A.LlmplanError, ValueError):
            continue
        logged = fam == "bloom" and "memory_gb_max" in r.get("measured", {})
        setup = A.record_setup(r, fam, None)
        if setup is None or not (fits or logged):
            continue
        m, c, p = setup
        if logged:  # as accuracy.peak_memory prices it
            c = A.cluster_of(A.builtin_systems()[A.record_system(r) or "dgx-a100"], r["hardware"]["gpus"])
            p = A.plan_for(r, fam, r["hardware"]["gpus"])
        mem = estimate_training(m, c, p).memory
        bare = estimate_training(m, c, p, MemoryAllowance(fragmentation=0.0)).memory
        fixed = 0.0 if mem.runtime is None else float(mem.runtime.total)
        moved = float(mem.gradients) if fam in AUTOGRAD_GRADS else 0.0
        churned = float(mem.activations) + float(bare.other) - fixed - float(mem.after_backward) + moved
        held = float(mem.weights) + float(mem.optimizer) + float(mem.gradients) - moved
        out.append(Row(r["id"], fam, ("ran" if fits[0][2] else "OOM") if fits else "mem", float(mem.total),
                       float(mem.capacity), float(mem.total - bare.total), held, churned,
                       float(A.nvidia_smi_bytes(mem)) if logged else None,
                       float(r["measured"]["memory_gb_max"]) if logged else None))
    return out


def score(rs: list[Row], f_held: float, f_churned: float) -> tuple[list[str], float]:
    """(records the allowance f_held x held + f_churned x churned gets wrong, BLOOM's median |error| %)."""
    wrong, errs = [], []
    for r in rs:
        new = f_held * r.held + f_churned * r.churned
        total = r.total - r.frag + new
        if (r.kind == "ran" and total > r.capacity) or (r.kind == "OOM" and total <= r.capacity):
            wrong.append(f"{r.kind} {r.id} {(total - r.capacity) / GIB:+.2f} GiB")
        if r.smi is not None and r.measured_gib:
            errs.append(abs(100 * ((r.smi - r.frag + new) / GIB - r.measured_gib) / r.measured_gib))
    return wrong, statistics.median(errs)


def main() -> int:
    rs = rows()
    print(f"{len(rs)} records ({sum(r.kind == 'ran' for r in rs)} ran, {sum(r.kind == 'OOM' for r in rs)} OOM)")
    for name, fh, fc in (("before #split-allowance: 5% of all", 0.05, 0.05), ("shipped: 5% churned only", 0.0, 0.05),
                         ("7.5% churned", 0.0, 0.075), ("8.5% churned", 0.0, 0.085), ("10% churned", 0.0, 0.10)):
        wrong, med = score(rs, fh, fc)
        print(f"{name:32s} BLOOM memory median {med:4.1f}%  wrong: {wrong if wrong else 'none'}")
    grid = [(i * 0.0025, j * 0.0025) for i in range(41) for j in range(41)]
    ok = [(fh, fc, score(rs, fh, fc)[1]) for fh, fc in grid if not score(rs, fh, fc)[0]]
    print(f"(held, churned) fractions on a 0.25% grid to 10% with no fit record wrong: {len(ok)}")
    for fh, fc, med in ok:
        print(f"  held {100 * fh:4.2f}%  churned {100 * fc:4.2f}%  BLOOM memory median {med:4.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
