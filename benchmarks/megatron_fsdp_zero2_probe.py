"""Probe: what Megatron-FSDP's optim_grads (ZeRO-2 as `export --to megatron` writes it) does that llmplan's ZeRO-2
pricing leaves out, for a few ZeRO-2 plans without a pipeline (docs/validation.md#megatron-fsdp-zero2).

Per plan it prints the priced memory and headroom, then
- the unsharded gradient buckets Megatron-FSDP holds in the backward: the FSDP unit being filled and the launched
  ones still queued, GradReducePipeline.wait_for_previous_grad_reduce(suggested_queue_capacity=1e9) freeing a
  bucket only once the queue holds more than 1e9 elements: floor(1e9 / unit) + 2 units (at most the layers), each
  a layer's gradients of the rank at the plan's gradient dtype (NVIDIA/Megatron-LM@d98e8a6 megatron/core/
  distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py _init_fsdp_param_and_grad_buffer: the capacity is
  max(1e9, bucket_size or 1e9) under optim_grads; param_and_grad_buffer.py _bucket_group_gradient_reduce queues the
  bucket's free; docs/validation.md#mfsdp-zero3 corrects the two buckets first read here); llmplan prices none for
  ZeRO-2;
- the reduce-scatter calls: llmplan prices one per micro-batch (cost.comm.dp_transfers), Megatron-FSDP one per
  unit (layer) per micro-batch; the extra calls' latency at the DP group's predicted small-message time.

Run: PYTHONPATH=. python benchmarks/megatron_fsdp_zero2_probe.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

GIB = 2 ** 30
PLANS = [  # (label, estimate arguments): ZeRO-2 plans without a pipeline that fit
    ("llama-3.1-8b 1 x dgx-h100 tp1 dp8", ["--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1",
                                           "--tp", "1", "--pp", "1", "--global-batch", "64", "--seq-len", "4096"]),
    ("llama-3.1-70b 8 x dgx-h100 tp8 dp8", ["--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "8",
                                            "--tp", "8", "--pp", "1", "--global-batch", "512", "--seq-len", "8192",
                                            "--recompute", "full"]),
    ("nemotron-3-super 8 x gb200-nvl72 tp1 ep32", ["--model", "nemotron-3-super", "--hardware", "gb200-nvl72",
                                                   "--nodes", "8", "--tp", "1", "--pp", "1", "--ep", "32"]),
]


def probe(label: str, args: list[str], folder: Path) -> None:
    from llmplan.cost.params import stepped_rank_params
    from llmplan.planfile import load_plan
    from llmplan.topology.collectives import collective_time
    from llmplan.topology.placement import place
    path = folder / "plan.json"
    r = subprocess.run([sys.executable, "-m", "llmplan", "estimate", *args, "--zero", "2", "--micro-batch", "1",
                        "--save", str(path), "--force", "--json"], capture_output=True, text=True)
    if r.returncode not in (0, 3):
        print(f"{label}: {r.stderr.strip()}")
        return
    doc = json.loads(r.stdout)
    pf = load_plan(path)
    p, m = pf.plan, pf.model
    rp = stepped_rank_params(m, p, 0)
    layers = m.num_hidden_layers
    # one decoder layer's gradients of the rank (the FSDP unit; the embedding and output layer are no unit)
    non_unit = (1 if m.tie_word_embeddings else 2) * m.vocab_size * m.hidden_size / p.tp + m.hidden_size
    elements = (float(rp.dense) + float(rp.expert) - non_unit) / layers
    unit = elements * p.grad_bytes
    queued = min(layers, 1e9 // elements + 2)  # units held: the queue's capacity, launched + the one filling
    mem = doc["memory"]
    span = place(p.degrees, pf.cluster, pf.axis_order)["dpcp"]
    alpha = collective_time("reduce-scatter", 1024.0, span, pf.cluster.system).seconds
    extra_calls = (layers - 1) * p.num_microbatches
    print(f"{label}: fits {mem['fits']}, total {mem['total'] / GIB:.1f} of {mem['capacity'] / GIB:.1f} GiB, "
          f"grad dtype {p.grad_dtype}; unsharded buckets ({queued:.0f} units) {queued * unit / GIB:.2f} GiB unpriced; "
          f"reduce-scatter calls per step priced {p.num_microbatches}, Megatron-FSDP {layers * p.num_microbatches} "
          f"(+{extra_calls} x {alpha * 1e6:.1f} us = {extra_calls * alpha * 1e3:.1f} ms, step "
          f"{doc['time']['step_s']:.2f} s; dp comm {doc['comm']['dp']['seconds']:.3f} s)")


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        for label, args in PLANS:
            probe(label, args, Path(d))


if __name__ == "__main__":
    main()
