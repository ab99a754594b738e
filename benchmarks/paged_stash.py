"""Megatron-Core's paged stash on Megatron-Bridge's full-iteration MXFP8 rows (docs/validation.md#paged-stash):
per row that accuracy.py runs with ParallelPlan.moe_paged_stash, the predicted peak memory per GPU (GiB) with the
stash off and on, the capacity, and the stash's copies a micro-batch (the marked rows, to the pool and back, read and
write each way) against the copy bandwidth: the time the side stream needs, which the source overlaps with the
next layer (PipelinePreScheduleFunction waits only at the next layer's grouped MLP), so it is not priced; then
per layer and micro-batch (ms) the copies, the attention and the exposed EP time.

    python benchmarks/paged_stash.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import accuracy as A
import hybrid_gap as H

from llmplan.cost.activations import dispatched_rows, paged_stash_row_bytes
from llmplan.estimate import estimate_training


def main() -> int:
    print(f"{'row':30s} {'off':>5s} {'on':>5s} {'cap':>5s} {'cp/mb':>5s} {'cp/l':>5s} {'at/l':>5s} {'ep/l':>5s}")
    for rec in yaml.safe_load(A.DEFAULT_RUNS.read_text()):
        fam = A.family(rec["id"])
        if fam != "mbridge-moe":
            continue
        setup = A.record_setup(rec, fam)
        if setup is None or setup[2].moe_paged_stash is None:
            continue
        m, cluster, plan = setup
        on = estimate_training(m, cluster, plan).memory
        off = estimate_training(m, cluster, plan.model_copy(update={"moe_paged_stash": None})).memory
        layers = (m.num_hidden_layers + m.num_nextn_predict_layers) / plan.pp
        copied = 4 * layers * dispatched_rows(m, plan) * paged_stash_row_bytes(m, plan)
        copy_ms = 1e3 * copied / cluster.system.gpu.copy_achieved_bytes_per_s
        _, parts = H.terms(m, cluster, plan)
        mb = plan.num_microbatches
        per_layer = (copy_ms / layers, parts.get("attention", 0.0) / mb / layers, parts.get("ep", 0.0) / mb / layers)
        release, gpu = rec["id"].split("-")[1], str(rec["hardware"]["gpu"]).split()[0].lower()
        label = f"{m.name[:16]} {gpu} {release}"
        print(f"{label:30s} {off.total / 2**30:5.0f} {on.total / 2**30:5.0f} {on.capacity / 2**30:5.0f} "
              f"{copy_ms:5.1f} " + " ".join(f"{x:5.2f}" for x in per_layer))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
