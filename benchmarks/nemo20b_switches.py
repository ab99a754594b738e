"""NeMo 24.07's GPT-3 20B fp8 row, part by part, and the one NCCL what-if of docs/validation.md#nemo20b-switches
(issue 32). Analysis only: nothing in llmplan reads this file.

Prints the row's memory as benchmarks/accuracy.py prices it (weights with the fp8 weight cache, gradients with the
embeddings' fp32 buckets, optimizer, activations by part, runtime by part, the fragmentation allowance), then the
binding fit records (the 20B row, BLOOM's out-of-memory attempt, narayanan2021's ZeRO-3 pair) with and without the
what-if that a two-rank NCCL communicator holds one connection a channel instead of three (ring and tree share the
(channel, peer) connection: NVIDIA/nccl v2.20.3-1 src/transport.cc ncclTransportP2pConnect skips a peer already
connected on the channel, and init.cc connects rings, then trees, on connIndex 0).

    PYTHONPATH=$PWD python benchmarks/nemo20b_switches.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy as A

from llmplan.cost.model_states import fp32_embedding_grad_bytes, low_precision_weight_cache
from llmplan.cost.runtime_memory import NCCL_CONNECTION_BYTES, TREE_CONNECTIONS
from llmplan.estimate import estimate_training
from llmplan.specs.allowance import MemoryAllowance

GIB = 2**30
ROW = "nemo2407-pretrain-gpt3-20b-64gpu-gbs256"
BINDING = (ROW, "bloom-prequel-gbs-and-tp-variations-L72h14336a64-dp32tp2pp6mbs1gbs2048z1",
           "narayanan2021-t2-zero3-529.6b-640gpu", "narayanan2021-t2-zero3-529.6b-560gpu-oom")


def two_rank_communicators(plan, stage: int) -> int:
    """The communicators of nccl_communicators (cost.runtime_memory) that have two ranks: TP, CP, EP or DP x CP
    groups of two, the pipeline's send / recv pairs and the tied embedding group (first and last stage)."""
    piped, ends = plan.pp > 1, stage in (0, plan.pp - 1)
    p2p = (1 if ends or plan.pp == 2 else 2) if piped else 0
    return (plan.tp == 2) + (plan.cp == 2) + (plan.ep == 2) + (plan.dp * plan.cp == 2) + p2p + int(piped and ends)


def main() -> int:
    runs = {r["id"]: r for r in yaml.safe_load(Path(A.DEFAULT_RUNS).read_text())}
    m, c, p = A.record_setup(runs[ROW], A.family(ROW), None)
    mem = estimate_training(m, c, p).memory
    bare = estimate_training(m, c, p, MemoryAllowance(fragmentation=0.0)).memory
    cache = float(low_precision_weight_cache(m, p, mem.stage))
    emb32 = float(fp32_embedding_grad_bytes(m, p, mem.stage))
    rt = mem.runtime
    print(f"{ROW} (stage {mem.stage}), GiB; capacity {float(mem.capacity) / GIB:.2f}")
    for name, v in (("weights (bf16)", float(mem.weights) - cache), ("fp8 weight cache", cache),
                    ("gradients (bf16 buffer)", float(mem.gradients) - emb32), ("embeddings' fp32 grads", emb32),
                    ("optimizer", mem.optimizer), ("activations: layers", mem.activation_parts.layers),
                    ("activations: output", mem.activation_parts.output),
                    ("activations: embedding", mem.activation_parts.embedding),
                    ("CUDA context", rt.context), ("cuBLAS / TE workspaces", rt.cublas),
                    (f"NCCL ({int(rt.communicators)} communicators)", rt.nccl), ("userbuffers", rt.userbuffers),
                    ("fragmentation (5% of churned tensors)", float(mem.total) - float(bare.total)),
                    ("total", mem.total)):
        print(f"  {name:32s} {float(v) / GIB:7.3f}")
    print("binding fit records: total - capacity (GiB), as priced / with two-rank communicators at one connection")
    for rid in BINDING:
        fam = A.family(rid)
        fits = [q for q in A.predict(runs[rid], fam) if q[0] == "fits"]
        m, c, p = A.record_setup(runs[rid], fam, None)
        mem = estimate_training(m, c, p).memory
        cut = two_rank_communicators(p, int(mem.stage)) * TREE_CONNECTIONS * c.system.gpu.nccl_sms \
            * NCCL_CONNECTION_BYTES
        over = (float(mem.total) - float(mem.capacity)) / GIB
        kind = ("ran" if fits[0][2] else "OOM") if fits else "?"
        print(f"  {kind:3s} {rid:72s} {over:+6.2f}  {over - cut / GIB:+6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
