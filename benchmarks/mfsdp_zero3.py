"""Probe: Megatron-FSDP's ZeRO-3 (optim_grads_params) and ZeRO-2 (optim_grads) against llmplan's ZeRO-2 / ZeRO-3
pricing, unit by unit (docs/validation.md#mfsdp-zero3). No cost function is changed by it.

Read at NVIDIA/Megatron-LM d98e8a64dd (the same lines at cd4afffa6, Megatron-Bridge v0.6.0's pin),
megatron/core/distributed/fsdp/:
- mcore_fsdp_adapter.py: the FSDP units are TransformerLayer, MoETransformerLayer, MambaLayer (the decoder
  layers); the embedding, the final norm and the output layer are no unit.
- src/megatron_fsdp/megatron_fsdp.py _init_fsdp_param_and_grad_buffer: suggested_communication_unit_size
  = max(1e9, 2 x the units' mean elements) under optim_grads_params (max(1e9, bucket_size or 1e9) otherwise);
  the reduce-scatter queue holds that many elements, the all-gather prefetch half of it.
- param_and_grad_buffer.py AllGatherPipeline.all_gather_params: a unit's hook gathers its own buckets, then adds
  the next units (forward or backward order) while the prefetched elements are under the prefetch size;
  release_bucket frees a unit after its forward (post-forward hook) and after its backward; non-unit buckets are
  never released in the step (reset(preserve_non_fsdp_units=True): PRESERVED, gathered again once a step).
- GradReducePipeline.wait_for_previous_grad_reduce(suggested_queue_capacity=...): a unit's unsharded gradient
  bucket is freed only when the queue of launched reduce-scatters holds more than the capacity, so up to
  floor(C / unit) + 1 launched units plus the one being filled stay allocated, at the gradient's dtype.

Per plan it prints, in elements of the rank (TP- and EP-sharded, before DP sharding):
- unit: a decoder layer's mean; non-unit: embedding + output layer + final norm;
- gathered weights: llmplan's ZeRO-3 `live` (docs/formulas.md#mem.other: max(u, min(2u, 1e9)), u the stage's
  parameters over its layers) against Megatron-FSDP's unit + ceil(S / unit) prefetched units + the non-unit
  parameters kept whole;
- unsharded gradients: llmplan none (ZeRO-2 / ZeRO-3 without a pipeline, no fp32 shards) against Megatron-FSDP's
  queue (floor(C / unit) + 2 units, at most the layers);
- per micro-batch exposed collectives Megatron-FSDP adds to llmplan's (first unit's gather, last unit's
  reduce-scatter): the last unit's backward gather (released after its forward, no hook before it prefetches
  it) and the non-unit bucket's reduce-scatter (its gradients are ready when the embedding's backward ends) less
  the 1/L of the step's reduce-scatter llmplan already exposes; at llmplan's collective times over the DP group.

Run: PYTHONPATH=. python benchmarks/mfsdp_zero3.py
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

GIB = 2 ** 30
PREFETCH_FLOOR, QUEUE_FLOOR = 5e8, 1e9  # megatron_fsdp.py: max(1e9, 2 x mean unit); prefetch = half of it
PLANS = [  # (label, estimate arguments, ZeRO stage)
    ("llama-3.1-8b 1 x dgx-h100 tp1 dp8", ["--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1",
                                           "--tp", "1", "--pp", "1", "--global-batch", "64", "--seq-len", "4096"]),
    ("llama-3.1-70b 8 x dgx-h100 tp8 dp8", ["--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "8",
                                            "--tp", "8", "--pp", "1", "--global-batch", "512", "--seq-len", "8192",
                                            "--recompute", "full"]),
    # the Megatron-Bridge 25.09 Llama 3 8B H100 row's layout (Megatron-FSDP, 16 micro-batches a step)
    ("llama-3.1-8b 1 x dgx-h100 tp1 dp8 gbs128 s8192", ["--model", "llama-3.1-8b", "--hardware", "dgx-h100",
                                                        "--nodes", "1", "--tp", "1", "--pp", "1", "--global-batch",
                                                        "128", "--seq-len", "8192", "--recompute", "full"]),
    # the Megatron-Bridge Llama 3 70B GB200 rows' layout (TP1, DP64, micro-batch 2)
    ("llama-3.1-70b 16 x gb200-nvl72 tp1 dp64", ["--model", "llama-3.1-70b", "--hardware", "gb200-nvl72",
                                                 "--nodes", "16", "--tp", "1", "--pp", "1", "--global-batch", "256",
                                                 "--micro-batch", "2", "--seq-len", "8192", "--recompute", "full"]),
]


def probe(label: str, args: list[str], zero: int, folder: Path) -> None:
    from llmplan.cost.model_states import stored_weight_bytes
    from llmplan.cost.params import stepped_rank_params
    from llmplan.planfile import load_plan
    from llmplan.topology.collectives import collective_time
    from llmplan.topology.placement import place
    path = folder / "plan.json"
    mb = [] if "--micro-batch" in args else ["--micro-batch", "1"]
    r = subprocess.run([sys.executable, "-m", "llmplan", "estimate", *args, *mb, "--zero", str(zero),
                        "--save", str(path), "--force", "--json"], capture_output=True, text=True)
    if r.returncode not in (0, 3):
        print(f"{label} zero {zero}: {r.stderr.strip()}")
        return
    doc = json.loads(r.stdout)
    pf = load_plan(path)
    p, m = pf.plan, pf.model
    rp = stepped_rank_params(m, p, 0)
    total, layers = float(rp.dense) + float(rp.expert), m.num_hidden_layers
    embeds = 1 if m.tie_word_embeddings else 2
    non_unit = embeds * m.vocab_size * m.hidden_size / p.tp + m.hidden_size
    unit = (total - non_unit) / layers
    w_b, g_b = float(stored_weight_bytes(p)), float(p.grad_bytes)
    prefetch = max(PREFETCH_FLOOR, unit) if zero == 3 else PREFETCH_FLOOR
    capacity = max(QUEUE_FLOOR, 2 * unit) if zero == 3 else QUEUE_FLOOR
    u_avg = total / layers
    live_llmplan = max(u_avg, min(2 * u_avg, 1e9)) if zero == 3 else 0.0
    ahead = min(layers - 1, math.ceil(prefetch / unit))
    live_mfsdp = (1 + ahead) * unit + non_unit if zero == 3 else 0.0
    queued = min(layers, math.floor(capacity / unit) + 2) * unit
    mem = doc["memory"]
    span = place(p.degrees, pf.cluster, pf.axis_order)["dpcp"]
    system = pf.cluster.system
    n = p.num_microbatches
    rs_step = n * collective_time("reduce-scatter", total * g_b, span, system).seconds
    exposed = n * (collective_time("reduce-scatter", non_unit * g_b, span, system).seconds
                   + (collective_time("all-gather", unit * w_b, span, system).seconds if zero == 3 else 0.0)) \
        - rs_step / layers
    print(f"{label}, zero {zero} (grads {p.grad_dtype}): priced {mem['total'] / GIB:.1f} / {mem['capacity'] / GIB:.1f}"
          f" GiB; unit {unit / 1e6:.0f} M, non-unit {non_unit / 1e6:.0f} M elements; prefetch {ahead} units; "
          f"gathered llmplan {live_llmplan * w_b / GIB:.2f} GiB vs Megatron-FSDP {live_mfsdp * w_b / GIB:.2f} GiB; "
          f"unsharded gradients llmplan 0 vs {queued / unit:.0f} units {queued * g_b / GIB:.2f} GiB; "
          f"extra exposed {exposed * 1e3:+.1f} ms a step of {doc['time']['step_s']:.2f} s ({n} micro-batches)")


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        for label, args in PLANS:
            for zero in (2, 3):
                probe(label, args, zero, Path(d))


if __name__ == "__main__":
    main()
