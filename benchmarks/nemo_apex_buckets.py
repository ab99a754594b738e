"""NeMo 24.07's GPT-3 20B fp8 row: the buffers Apex's distributed Adam really allocates under NeMo's bucketing,
against the model states llmplan prices (docs/validation.md#nemo-fp8-mem, issue 32). Analysis only: nothing in
llmplan reads this file.

Sources (NVIDIA/NeMo r2.0.0rc1 579983fbfc `Dockerfile.ci` pins, matching the NeMo 24.07 table's versions: Apex
810ffae374, Transformer Engine 7d576ed = 1.8.0.dev0, Megatron-Core 338af51, an ancestor of core_r0.8.0):

* NeMo `megatron_gpt_model.py` `configure_optimizers`: one parameter list a Transformer layer (its parameters
  without `_disable_overlap_grad_sync`, i.e. all but the sequence-parallel ones), the list reversed (last layer
  first), and every other parameter (embeddings, layer norms, row-parallel biases, final norm) appended to the
  first layer's list; `megatron_base_model.py` then calls `init_params_bucket` once a list.
* NeMo `core/optim/distributed_adam.py` `init_params_bucket`: the `_with_fp32_optimizer` parameters (word and
  position embeddings) first, as their own Apex call with `grad_sync_dtype=torch.float32`, then the rest.
* Apex `contrib/optimizers/distributed_fused_adam.py`: every bucket holds `default_shard_size x dp` elements
  (`bucket_cap_mb` MiB of the optimizer's grad_sync dtype over dp, floored to 128 B), `init_params_bucket`
  marks every existing bucket full, `_init_param_state` starts a bucket at `contiguous_buffer_offset +
  bucket_size` of the bucket `last_bucket_id()` returns (the last one with the same dtypes; bucket 0, whatever
  its dtypes, when no later bucket has them: `while bucket_id > 0`, still so at Apex 6424da3b), and
  `init_param_buffer` / `_init_grad_buffer` allocate one buffer a dtypes of `max(offset + bucket_size)`
  elements; each bucket keeps fp32 `exp_avg`, `exp_avg_sq` and an int16 `param_remainders_shard` of
  `shard_size` elements.

    PYTHONPATH=$PWD python benchmarks/nemo_apex_buckets.py [--grid]

`--grid` (about a minute) reruns benchmarks/allocator_reserve.py's grid of two allowance fractions (tensors
allocated once / freed and allocated again) over every fit record with this row's model states as Apex holds them.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy as A  # noqa: E402
import allocator_reserve as R  # noqa: E402

from llmplan.cost.model_states import fp32_embedding_grad_bytes, low_precision_weight_cache  # noqa: E402
from llmplan.estimate import estimate_training  # noqa: E402
from llmplan.specs.allowance import MemoryAllowance  # noqa: E402

GIB = 2**30
ROW = "nemo2407-pretrain-gpt3-20b-64gpu-gbs256"
BUCKET_CAP_MB = 220  # NeMo-Framework-Launcher 24.07 conf/training/gpt3/20b.yaml optim.bucket_cap_mb
NORMAL, FP32 = "bf16 grads", "fp32 grads"  # the two dtypes keys of the row's buckets (param sync bf16 in both)


@dataclass
class Bucket:
    key: str
    offset: int
    size: int
    filled: int = 0
    open: bool = True


def bucket_elements(cap_mb: float, grad_sync_bytes: int, dp: int) -> int:
    """Apex's bucket size in elements: cap_mb MiB of grad_sync elements, the dp shard floored to 128 B."""
    align = 128 // grad_sync_bytes
    shard = int(1024 * 1024 * cap_mb / grad_sync_bytes / dp) // align * align
    return max(shard, align) * dp


def apex_layout(calls: list[list[tuple[int, str]]], size: int, align: int) -> list[Bucket]:
    """The buckets Apex 810ffae374 builds for NeMo's init_params_bucket calls, each a list of (numel, dtypes
    key); NeMo's override splits a call into its fp32-grad parameters, then the rest, as separate Apex calls."""
    buckets: list[Bucket] = []

    def last(key: str) -> int:
        i = len(buckets) - 1
        while i > 0:  # Apex's last_bucket_id(): stops at bucket 0 whatever its dtypes
            if buckets[i].key == key:
                break
            i -= 1
        return i

    for call in calls:
        for key in (FP32, NORMAL):
            params = [n for n, k in call if k == key]
            if not params:
                continue
            for b in buckets:
                b.open = False
            for numel in params:
                start = 0
                if last(key) < 0:
                    buckets.append(Bucket(key, 0, size))
                while start < numel:
                    b = buckets[last(key)]
                    at = -(-b.filled // align) * align
                    frag = min(numel - start, b.size - at)
                    if frag <= 0 or not b.open:
                        buckets.append(Bucket(key, b.offset + b.size, size))
                        continue
                    b.filled = at + frag
                    start += frag
    return buckets


def gpt_calls(layers: int, h: int, ffn: int, tp: int, vocab_shard: int, positions: int
              ) -> list[list[tuple[int, str]]]:
    """NeMo's bucket lists for a Megatron-Core GPT with Transformer Engine layers, tied embeddings, learned
    positions, sequence parallelism and biases: per layer QKV / proj / fc1 / fc2 weights and the QKV and fc1
    biases (column-parallel); the two norms' weights and biases and the proj / fc2 biases are sequence-parallel
    (TE 7d576ed sets `sequence_parallel` on them), so they go to the first layer's list with the embeddings."""
    layer = [(3 * h // tp * h, NORMAL), (3 * h // tp, NORMAL), (h * h // tp, NORMAL),
             (ffn // tp * h, NORMAL), (ffn // tp, NORMAL), (h * ffn // tp, NORMAL)]
    sp = [(h, NORMAL)] * 6 * layers + [(h, NORMAL)] * 2
    first = layer + [(vocab_shard * h, FP32), (positions * h, FP32)] + sp
    return [layer] * (layers - 1) + [first]


def main() -> int:
    runs = {r["id"]: r for r in yaml.safe_load(Path(A.DEFAULT_RUNS).read_text())}
    m, c, p = A.record_setup(runs[ROW], A.family(ROW), None)
    mem = estimate_training(m, c, p).memory
    bare = estimate_training(m, c, p, MemoryAllowance(fragmentation=0.0)).memory
    tp, dp, h = p.tp, p.dp * p.cp, m.hidden_size
    vocab_shard = -(-m.vocab_size // (128 * tp)) * 128  # make_vocab_size_divisible_by 128 x TP, split over TP
    size = bucket_elements(BUCKET_CAP_MB, 2, dp)
    buckets = apex_layout(gpt_calls(m.num_hidden_layers, h, m.intermediate_size, tp, vocab_shard,
                                    m.max_position_embeddings), size, 64)
    filled = {k: sum(b.filled for b in buckets if b.key == k) for k in (NORMAL, FP32)}
    buffer = {k: max(b.offset + b.size for b in buckets if b.key == k) for k in (NORMAL, FP32)}
    count = {k: sum(b.key == k for b in buckets) for k in (NORMAL, FP32)}
    real = {"weights (bf16 param buffers)": 2 * (buffer[NORMAL] + buffer[FP32]),
            "gradients (grad buffers)": 2 * buffer[NORMAL] + 4 * buffer[FP32],
            "optimizer (shards)": len(buckets) * (size // dp) * (4 + 4 + 2)}
    cache = float(low_precision_weight_cache(m, p, mem.stage))
    priced = {"weights (bf16 param buffers)": float(mem.weights) - cache,
              "gradients (grad buffers)": float(mem.gradients), "optimizer (shards)": float(mem.optimizer)}
    print(f"{ROW}\n  Apex buckets of {size:,} elements ({BUCKET_CAP_MB} MiB of bf16), "
          f"shard {size // dp:,}")
    for k in (NORMAL, FP32):
        print(f"  {k}: {count[k]} buckets, {filled[k]:,} parameters,\n    buffer {buffer[k]:,} elements")
    print(f"  fp32-grad embedding parameters as llmplan counts them: "
          f"{float(fp32_embedding_grad_bytes(m, p, mem.stage)) / 2:,.0f}")
    print(f"{'model state, GiB':32s} {'llmplan':>8s} {'Apex':>8s} {'diff':>7s}")
    for k in real:
        print(f"  {k:30s} {priced[k] / GIB:8.3f} {real[k] / GIB:8.3f} {(real[k] - priced[k]) / GIB:+7.3f}")
    extra = sum(real.values()) - sum(priced.values())
    tensors = float(bare.total) - float(mem.runtime.total) + extra
    room = float(mem.capacity) - tensors - float(mem.runtime.total)
    print(f"tensors with Apex's buffers {tensors / GIB:.2f} GiB (priced {(tensors - extra) / GIB:.2f}),\n"
          f"runtime {float(mem.runtime.total) / GIB:.2f}, capacity {float(mem.capacity) / GIB:.2f}: "
          f"room for the allocator {room / GIB:.2f} GiB,\n"
          f"  {100 * room / tensors:.1f}% of the tensors, {100 * room / float(mem.activations):.1f}% of the "
          f"activations ({float(mem.activations) / GIB:.2f} GiB);\n"
          f"  the shipped allowance (5% of the churned tensors): {(float(mem.total) - float(bare.total)) / GIB:.2f}"
          f" GiB;\n  total with Apex's buffers (held: no allowance) {(float(mem.total) + extra) / GIB:.2f}")
    if "--grid" in sys.argv:  # allocator_reserve's (held, churned) grid with the row's held bytes so raised
        rs = [replace(r, held=r.held + extra, total=r.total + extra)  # held buffers: no shipped allowance
              if r.id == ROW else r for r in R.rows()]
        grid = [(i * 0.0025, j * 0.0025) for i in range(41) for j in range(41)]
        ok = [(fh, fc) for fh, fc in grid if not R.score(rs, fh, fc)[0]]
        print(f"(held, churned) fractions, 0.25% grid to 10%, no fit record wrong\n"
              f"  (this row's Apex buffers held): {len(ok)} {ok}")
        for fh, fc in ((0.0, 0.05), (0.0, 0.055)):
            print(f"  held {100 * fh:.2f}% churned {100 * fc:.2f}%: wrong")
            for w in R.score(rs, fh, fc)[0]:
                print(f"    {w}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
