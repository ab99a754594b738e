"""What three run settings the Megatron-LM r0.8 README does not state would do to the megatron family's rows at its
left-out fold's constants (docs/validation.md#megatron-r08-defaults). A probe: nothing here is priced by llmplan.

Each column rescales a row's signed error (predicted / measured - 1, + = predicted faster) by the ratio of llmplan's
predicted step to that step with one thing added, on the eleven r0.8 rows only (the examples/llama rows turn the
first two off in their script and are left as they are):

- `mask`: Megatron-LM core_r0.8.0's data loader builds a [1, s, s] bool causal mask per sequence
  (`megatron/core/datasets/gpt_dataset.py`, `create_attention_mask` True unless `--no-create-attention-mask-in-
  dataloader`), and `get_batch_on_this_tp_rank` (`megatron/training/utils.py`) copies it to the GPU on the
  current stream (`.cuda(non_blocking=True)` from the pinned batch) and broadcasts it to the TP group, on the first
  and last pipeline stage, every micro-batch: mb x s^2 bytes at the system's host link rate plus, with TP, at its
  NVLink rate; priced here on the critical (last) stage only;
- `gc 1.5%`: the step made 1.5% longer, the one published figure found for Python's automatic garbage collector
  against a scheduled one (pytorch/torchtitan PR #148: "on 512 GPU FSDP ... a perf boost of ~1.5% per iter"); the
  r0.8 runs had no `--manual-gc` (off by default), the examples/llama scripts set it;
- `selective`: selective recompute of the attention core (`--recompute-activations`), a reading, not a source:
  the README names no recompute, and llmplan fits every r0.8 row in memory without it.

    PYTHONPATH=$PWD python benchmarks/megatron_r08_defaults.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import benchmarks.accuracy as A  # noqa: E402
from benchmarks.megatron_rows import FOLD, records  # noqa: E402
from llmplan.estimate import estimate_training  # noqa: E402

GC_SHARE = 0.015  # pytorch/torchtitan PR #148 (2024-03-15): ~1.5% per iteration on 512 GPUs, FSDP


def mask_seconds(plan, system) -> float:
    """Seconds a step of the last stage spends moving the data loader's attention masks (module docstring)."""
    per_mb = plan.micro_batch * plan.seq_len ** 2  # bytes of [mb, 1, s, s] bool
    rate = 1 / system.host_bytes_per_s + (1 / (system.intra_node_gb_per_s * 1e9) if plan.tp > 1 else 0.0)
    return plan.global_batch // (plan.micro_batch * plan.dp) * per_mb * rate


def main() -> int:
    names = ("fold", "mask", "gc 1.5%", "mask + gc", "selective")
    rows = {}
    print("row | step s | mask ms | " + " | ".join(names))
    for rec in records():
        m, cluster, plan = A.record_setup(rec, "megatron", FOLD)
        t = float(estimate_training(m, cluster, plan).time.total)
        _, pred, meas = A.predict(rec, "megatron", FOLD)[0]
        err = pred / meas - 1
        r08 = rec["id"].startswith("megatron-core-r0.8-")
        mask = mask_seconds(plan, cluster.system) if r08 else 0.0
        gc = GC_SHARE * t if r08 else 0.0
        sel = plan.model_copy(update={"recompute": "selective", "recompute_modules": ("core_attn",)})
        t_sel = float(estimate_training(m, cluster, sel).time.total) if r08 else t
        moved = [100 * ((1 + err) * t / t2 - 1) for t2 in (t, t + mask, t + gc, t + mask + gc, t_sel)]
        rows[rec["id"]] = moved
        print(f"{rec['id'].removeprefix('megatron-')} | {t:.3f} | {1e3 * mask:.2f} | "
              + " | ".join(f"{v:+.2f}" for v in moved))
    for i, n in enumerate(names):
        print(f"fold median |error|, {n}: {statistics.median(abs(v[i]) for v in rows.values()):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
