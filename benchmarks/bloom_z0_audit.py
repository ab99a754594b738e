"""BLOOM's ZeRO stage 0 row (chronicles-prequel.md 'zero-stage-compare', 2022-02-21: 72 GB logged, its ZeRO-1
twin 37 GB), its first stage itemised against the DeepSpeed code it ran, beside llmplan's estimate (issue 32;
docs/validation.md#bloom-z0). Analysis only: nothing in llmplan reads this file.

What ran: the chronicle's note under the table, "currently can't test `ZeRO_STAGE=0` on master, or
`ZeRO_STAGE=1` on the special branch". The special branch is DeepSpeed's first bf16 branch
(deepspeedai/DeepSpeed jeffra/bf16-updates fb0dc00f8, 2022-02-18, "bf16 updates"; then 6eb4f1fa9, 2022-02-21
18:12 UTC, "Got bf16 working", on jeffra/bf16-updates-v2): it removes config.py's assert that bf16 needs ZeRO
1-3, and its pipe/engine.py `_exec_reduce_grads` runs bf16 only at stage 0 (`raise NotImplementedError()` at
stage 1). Its BF16_Optimizer (runtime/bf16_optimizer.py) is not the 02-28 one llmplan prices
(cost.model_states.bf16_optimizer, ZeRO-1 partitions of 15293139f / 56c522386): every rank keeps
  - an fp32 clone of every parameter (`p.clone().float().detach()`), the Adam moments on those (12 B, unsharded),
  - an fp32 gradient per parameter (`hp.grad = lp.grad.to(fp32)`, then `hp.grad.add_`; freed at the step by
    clear_hp_grads), 4 B,
  - the bf16 param.grad, left after each backward (`update_hp_grads(clear_lp_grads=False)` in
    _exec_backward_pass) and dropped only by the next backward's clear_lp_grads, 2 B,
  - at 6eb4f1fa9 only: `bf16_groups_flat`, a flat bf16 copy of the parameters, made and kept, the parameters not
    re-pointed into it (the `_unflatten_dense_tensors` line is commented out), 2 B;
and `_bf16_reduce_grads` all-reduces the per-parameter fp32 gradients through engine.buffered_allreduce_fallback
(elements_per_buffer MEMORY_OPT_ALLREDUCE_SIZE = 500,000,000) -> allreduce_no_retain (a bucket is sent once
it passes 500M elements) -> allreduce_bucket: `self.flatten(bucket)` (a new fp32 tensor) and
`.to(communication_data_type)` (bf16 at stage 0 with bf16: engine.communication_data_type), both alive for the
bucket's all-reduce.

    PYTHONPATH=$PWD python benchmarks/bloom_z0_audit.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy as A  # noqa: E402

GIB = 2**30
ROW = "bloom-prequel-zero-stage-compare-L72h14336a64-dp4tp8pp12mbs2gbs2048z0"
BUCKET = 500_000_000  # DeepSpeed engine.py MEMORY_OPT_ALLREDUCE_SIZE at fb0dc00f8 / 6eb4f1fa9


def first_stage(L: int, h: int, f: int, V: int, t: int, p: int) -> tuple[int, list[int]]:
    """(parameters of a first-stage rank, its fp32 gradients in the optimizer's order): Megatron's weight-decay
    group (word embedding, then each layer's qkv, dense, fc1, fc2 weights), then the biases and norms."""
    emb = V // t * h
    weights = [emb]
    for _ in range(L // p):
        weights += [3 * h * h // t, h * h // t, h * f // t, f * h // t]
    small = L // p * (3 * h // t + h + f // t + h + 4 * h)  # biases (qkv, fc1 split; dense, fc2 whole), 2 norms
    return sum(weights) + small, weights + [small]


def buckets(grads: list[int]) -> list[int]:
    """allreduce_no_retain's buckets: gradients appended until their count passes BUCKET, then sent."""
    out, n = [], 0
    for g in grads:
        n += g
        if n > BUCKET:
            out.append(n)
            n = 0
    return out + ([n] if n else [])


def main() -> int:
    recs = {r["id"]: r for r in yaml.safe_load(A.DEFAULT_RUNS.read_text())}
    r = recs[ROW]
    md = r["model"]
    par = r["parallel"]
    n, grads = first_stage(md["layers"], md["hidden"], md["ffn_hidden"], md["vocab"], par["tp"], par["pp"])
    bk = buckets(grads)
    fam = A.family(ROW)
    system = A.builtin_systems()[A.record_system(r) or "dgx-a100"]
    e = A.estimate_training(A.model_for(r, fam), A.cluster_of(system, r["hardware"]["gpus"]),
                            A.plan_for(r, fam, r["hardware"]["gpus"]))
    smi = A.nvidia_smi_bytes(e.memory)
    priced = float(e.memory.weights + e.memory.gradients + e.memory.optimizer)
    print(f"{ROW}\nfirst-stage parameters a rank: {n:,} (llmplan {float(e.memory.params_on_rank):,.0f})")
    print(f"all-reduce buckets (elements): {', '.join(f'{b:,}' for b in bk)}")
    items = [("bf16 weights", 2 * n), ("bf16 param.grad, kept", 2 * n), ("fp32 gradients, per parameter", 4 * n),
             ("fp32 clone + Adam moments (unsharded)", 12 * n)]
    held = sum(b for _, b in items)
    print(f"\n{'held by the rank (bytes)':44s} {'the run':>16s}")
    for what, b in items:
        print(f"{what:44s} {b:16,d}")
    print(f"{'total (fb0dc00f8)':44s} {held:16,d}   llmplan {priced:,.0f}")
    flat = 2 * n
    print(f"{'+ bf16_groups_flat (6eb4f1fa9 only)':44s} {flat:16,d}")
    cast = 6 * max(bk)
    print(f"{'largest bucket: fp32 flatten + bf16 cast':44s} {cast:16,d}")
    print(f"\nnvidia-smi view of stage 0, GiB (logged {r['measured']['memory_gb_max']}):")
    print(f"  llmplan (main)                          {smi / GIB:6.2f}")
    a = smi + (held - priced)
    print(f"  + unpriced held states, fb0dc00f8       {a / GIB:6.2f}")
    print(f"  + the reduction's bucket copies         {(a + cast) / GIB:6.2f}")
    print(f"  + bf16_groups_flat, 6eb4f1fa9           {(a + cast + flat) / GIB:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
