"""The loss as the 2020-2023 Megatron-LM families ran it: vocab_parallel_cross_entropy(output.float(), labels)
(--fp16-lm-cross-entropy off by default), each step of _VocabParallelCrossEntropy a kernel over the fp32 logits,
priced unfused (fused_loss off), with the memory of the Function at each family's commit (unfused_loss_impl).
Sources: NVIDIA/Megatron-LM megatron/model/gpt_model.py and megatron/mpu/cross_entropy.py at 50a4b5fa02 and
6985e58938 (Narayanan et al. 2021), megatron/model/gpt2_model.py at d73def35a3 (2020), e36cdd7936 (2022-07,
still sub_), megatron/core/tensor_parallel/cross_entropy.py at 285068c810 (MegaScale's baseline: the max
subtracted into a new tensor, from 55817ec9b9). BLOOM's Megatron-DeepSpeed (bigscience-workshop/Megatron-DeepSpeed
megatron/model/gpt_model.py at 9f5f5d4c, 497aa1bf and 541b967f): GPTModelPipe's specs cast the tied head's logits
with float16_to_fp32 (`.float()`) in a pipeline layer, and its CrossEntropy's vocab_parallel_cross_entropy(output.
contiguous().float(), labels) works in place (mpu/cross_entropy.py sub_, exp out=, div_) on that fp32 output, which
the pipeline engine holds as the stage's output: the same Function, unfused, one fp32 copy.
docs/validation.md#legacy-loss, #edges-70."""

from __future__ import annotations

import pytest

# family -> (a row, the loss implementation its commit runs)
ROWS = {"narayanan2021": ("narayanan2021-t1-1.7b", "vocab-parallel"),
        "megatron2020": (None, "vocab-parallel"),
        "korthikanti2022": (None, "vocab-parallel"),
        "megascale": (None, "vocab-parallel-copy"),
        "bloom": (None, "vocab-parallel")}


def _first(published_runs, acc, fam):
    return next(r for rid, r in published_runs.items() if acc.family(rid) == fam)


@pytest.mark.parametrize("fam", sorted(ROWS))
def test_legacy_megatron_rows_run_the_unfused_loss_on_fp32_logits(published_runs, acc, fam):
    rid, impl = ROWS[fam]
    rec = published_runs[rid] if rid else _first(published_runs, acc, fam)
    plan = acc.plan_for(rec, fam, rec["hardware"]["gpus"])
    assert (plan.fused_loss, plan.unfused_loss_impl) == (False, impl), rec["id"]


def test_zero3_rows_keep_their_fit_with_megatrons_in_place_loss(published_runs, acc):
    # Narayanan et al. 2021, Table 2: ZeRO-3 529.6B ran on 640 GPUs (micro-batch 4, TP 1) and ran out of memory on
    # 560. Megatron's in-place loss holds 6 bytes a logit at its peak; PyTorch's eager one (12) would read the run
    # that ran as not fitting (79.21 GiB against 79.15, docs/validation.md#nar-mbs).
    ran = published_runs["narayanan2021-t2-zero3-529.6b-640gpu"]
    oom = published_runs["narayanan2021-t2-zero3-529.6b-560gpu-oom"]
    assert [pred for q, pred, _ in acc.predict(ran, "narayanan2021") if q == "fits"] == [True]
    assert [pred for q, pred, _ in acc.predict(oom, "narayanan2021") if q == "fits"] == [False]
