"""BLOOM's TP2 PP6 DP32 micro-batch-1 out-of-memory attempt (chronicles-prequel.md 'gbs-and-tp-variations',
2022-02-25), itemised against the code it ran, beside llmplan's breakdown (issue 32;
docs/validation.md#bloom-oom-audit). Analysis only: nothing in llmplan reads this file.

What ran (bigscience-workshop/bigscience f658243, train/tr11-200B-ml/tr11-200B-ml.slurm): `--fp16`, ZeRO stage 1
with DeepSpeed's default buckets (no reduce/allgather_bucket_size in the ds_config), `--checkpoint-activations
--deepspeed-activation-checkpointing` (no --partition-activations), `--embed-layernorm`, the default dropouts;
Megatron-DeepSpeed of the day (bigscience-workshop/Megatron-DeepSpeed ae6277f5, 2022-02-21: GPTModelPipe with
partition_method 'type:transformer', tied EmbeddingPipe on the first and last stage, float16_to_fp32 after the
logits, mpu.vocab_parallel_cross_entropy in fp32) and DeepSpeed master (microsoft/DeepSpeed 2151c787a, 0.6.0:
stage_1_and_2.py, pipe/engine.py, pipe/schedule.py). Every byte below is read from those lines; the model's
shapes from the record.

    PYTHONPATH=$PWD python benchmarks/bloom_oom_audit.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy as A  # noqa: E402

from llmplan.cost.memory import stage_memory  # noqa: E402
from llmplan.estimate import estimate_training  # noqa: E402
from llmplan.specs.allowance import MemoryAllowance  # noqa: E402

GIB = 2**30
ROW = "bloom-prequel-gbs-and-tp-variations-L72h14336a64-dp32tp2pp6mbs1gbs2048z1"
REDUCE_BUCKET = 500_000_000  # DeepSpeed constants.py ZERO_OPTIMIZATION_REDUCE_BUCKET_SIZE_DEFAULT at 2151c787a


def held(L: int, h: int, f: int, V: int, s: int, b: int, t: int, p: int, dp: int) -> dict[str, dict[str, float]]:
    """What a rank of the first and of the last stage holds, by moment, in bytes (fp16 model, ZeRO-1)."""
    layer = 3 * h * h // t + 3 * h // t + h * h // t + h + h * f // t + f // t + f * h // t + h + 4 * h
    emb = V // t * h  # VocabParallelEmbedding's shard (250,880 is a multiple of 128 x t)
    n_first, n_last = L // p * layer + emb + 2 * h, L // p * layer + emb + 2 * h  # + embed norm / final norm
    sbh = s * b * h
    ckpt = 2 * sbh  # a checkpointed layer's fp16 input (CheckpointFunction saves its input)
    inflight = p  # TrainSchedule stage 0: forwards at even steps 0..2(p-1), first backward at step 2p-1
    def states(n: int) -> dict[str, float]:
        return {"fp16 weights (bit16_groups_flat)": 2 * n, "fp16 param.grad (autograd, the whole step)": 2 * n,
                "fp32 master, exp_avg, exp_avg_sq (1/dp)": 12 * n / dp}

    first = {**states(n_first),
             "5 other micro-batches' layer inputs (x 12 x 2sbh)": (inflight - 1) * (L // p) * ckpt,
             "embedding norm inputs, dropout masks (6 x 3sbh)": inflight * 3 * sbh,
             "stage outputs kept, partitioned (6 x 2sbh/t)": inflight * ckpt / t,
             "its output and output gradient, rebuilt (2 x 2sbh)": 2 * ckpt,
             "received-gradient buffer (2sbh/t)": ckpt / t,
             "fresh embedding gradient (V/t x h zeros, fp16)": 2 * emb}
    logits = s * b * V // t
    last = {**states(n_last),
            "its 12 layer inputs (12 x 2sbh)": (L // p) * ckpt,
            "final norm and output layer inputs (2 x 2sbh)": 2 * ckpt,
            "previous micro-batch's fp32 logits (pipe buffer)": 4 * logits,
            "fp32 logits, softmax, gradient (in place)": 4 * logits,
            "fp16 logit gradient (float16_to_fp32 backward)": 2 * logits,
            "fresh output-weight gradient (V/t x h, fp16)": 2 * emb}
    after = {**states(n_first), "bucket: the embedding's gradient alone, flattened":
             2 * max(REDUCE_BUCKET, emb)}
    return {"first stage, embedding backward": first, "last stage, output-layer backward": last,
            "first stage, after the backward (reduction)": after}


def main() -> int:
    rec = {r["id"]: r for r in yaml.safe_load(Path(A.DEFAULT_RUNS).read_text())}[ROW]
    m, c, p = A.record_setup(rec, "bloom", None)
    e = estimate_training(m, c, p)
    cap = float(e.memory.capacity)
    print(f"{ROW}\n  capacity {cap / GIB:.2f} GiB; llmplan: stage {int(e.memory.stage)}, "
          f"total {float(e.memory.total) / GIB:.2f} GiB")
    for st in (0, p.pp - 1):
        mem = stage_memory(m, p, st, MemoryAllowance(), cap)
        a = mem.activation_parts
        rt = mem.runtime
        print(f"  llmplan stage {st}: weights {float(mem.weights) / 1e9:.3f} GB, gradients "
              f"{float(mem.gradients) / 1e9:.3f}, optimizer {float(mem.optimizer) / 1e9:.3f},\n"
              f"    activations {float(mem.activations) / 1e9:.3f}\n      (layers {float(a.layers) / 1e9:.3f}, working "
              f"{float(a.recompute_working) / 1e9:.3f}, embedding {float(a.embedding) / 1e9:.3f}, output "
              f"{float(a.output) / 1e9:.3f}),\n    fresh gradient {float(mem.fresh_grad) / 1e9:.3f}, runtime "
              f"{float(rt.total) / 1e9:.3f},\n    allowance "
              f"{float(mem.other - rt.total - mem.fresh_grad - mem.after_backward) / 1e9:.3f}, total "
              f"{float(mem.total) / 1e9:.3f} GB")
    md = rec["model"]
    moments = held(md["layers"], md["hidden"], md["ffn_hidden"], md["vocab"], md["seq_len"], 1, p.tp, p.pp, p.dp)
    runtime = float(e.memory.runtime.total)
    for name, items in moments.items():
        print(f"{name} (bytes):")
        for k, v in items.items():
            print(f"  {k:54s} {v:16,.0f}")
        tot = sum(items.values())
        print(f"  {'tensors':54s} {tot:16,.0f}\n  with llmplan's runtime ({runtime / 1e9:.2f} GB): "
              f"{(tot + runtime) / GIB:.2f} GiB;\n  room for the allocator {(cap - tot - runtime) / GIB:.2f} GiB "
              f"({100 * (cap - tot - runtime) / tot:.1f}% of the tensors)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
