"""Golden tests on NVIDIA DGX Cloud Benchmarking's bf16 Llama 3.1 runs on H100 (NVIDIA/dgxc-benchmarking
llama3.1/README.md at 85380ffe, release v25.04.01, nvcr.io/nvidia/nemo:25.02.01; records dgxc-2504-*): the only
published bf16 70B-class Megatron runs on 64 H100, the measured side of the 70B reference search's top plan
(docs/validation.md#top70b)."""

from __future__ import annotations

import pytest

R8 = "dgxc-2504-pretrain-llama3.1-8b-h100-8gpu-bf16-tp1pp1cp2mbs1gbs128"
R70 = "dgxc-2504-pretrain-llama3.1-70b-h100-64gpu-bf16-tp4pp4cp2vp5mbs1gbs128"
R405 = "dgxc-2504-pretrain-llama3.1-405b-h100-512gpu-bf16-tp8pp8cp2vp8mbs1gbs256"
# The same 405B job weak-scaled (GBS = GPUs / 2, 64 micro-batches a pipeline): the README's 1,024- and 2,048-GPU
# columns, the published runs nearest the 405B reference search's top plan (docs/validation.md#cp-short)
R405_1K = "dgxc-2504-pretrain-llama3.1-405b-h100-1024gpu-bf16-tp8pp8cp2vp8mbs1gbs512"
R405_2K = "dgxc-2504-pretrain-llama3.1-405b-h100-2048gpu-bf16-tp8pp8cp2vp8mbs1gbs1024"
# (record, the README's step time in s, its tokens/s for all GPUs, its printed MFU)
PRINTED = [(R8, 12.27, 85459, 0.6247), (R70, 14.66, 71526, 0.5432), (R405, 19.78, 106024, 0.5547),
           (R405_1K, 19.84, 211406, 0.5531), (R405_2K, 19.87, 422175, 0.5522)]


@pytest.mark.parametrize("rid, step, tokens, mfu", PRINTED)
def test_records_are_the_printed_rows(published_runs, rid, step, tokens, mfu):
    r = published_runs[rid]
    gpus, par = r["hardware"]["gpus"], r["parallel"]
    assert r["measured"]["iteration_time_s"] == step and r["measured"]["mfu"] == mfu
    assert par["global_batch"] * r["model"]["seq_len"] / step == pytest.approx(tokens, abs=1)  # README's formula
    assert r["measured"]["tokens_per_s_per_gpu"] == pytest.approx(tokens / gpus, abs=0.1)
    assert par["tp"] * par["pp"] * par["cp"] * par["dp"] == gpus


@pytest.mark.parametrize("rid, rel", [(R70, 0.05), (R405, 0.05), (R405_1K, 0.05), (R405_2K, 0.05), (R8, 0.10)])
def test_bf16_llama_step_times(published_runs, acc, rid, rel):
    # Scored, not fitted (accuracy.FAMILIES: dgxc). 70B TP4 PP4 VP5 CP2 and 405B TP8 PP8 VP8 CP2 (no recompute,
    # TP overlap, bf16 gradient reduction) within 5%; the 8B TP1 CP2 row, the H100 profile's best published bf16
    # MFU (62.5%), within 10% (llmplan is slower than it: docs/validation.md#top70b, #cpslow). The 8B row was a
    # strict xfail at -10.0% (9,609 vs 10,682 tok/s/GPU) under the shipped attention_efficiency 0.7 at the H100
    # clock 0.875; -7.9% (9,836) at cuDNN's published 1.0 and the refitted clock 0.825 (docs/validation.md#refit).
    (_, pred, meas), *_ = acc.predict(published_runs[rid], acc.family(rid))
    assert pred == pytest.approx(meas, rel=rel), f"{rid}: {pred:.1f} vs {meas:.1f} tok/s/GPU"


def test_70b_search_at_the_published_workload_is_the_published_mfu(cli, published_runs):
    # At the published run's workload (128 x 8192 tokens, bf16, 64 H100) the search's first plan is predicted
    # within 3 MFU points of the run NVIDIA measured (54.32% as the README counts model FLOPs, = llmplan's count).
    d = cli("search", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "8", "--seq-len", "8192",
            "--global-batch", "128", "--json").json()
    assert d["plans"][0]["throughput"]["mfu"] == pytest.approx(published_runs[R70]["measured"]["mfu"], abs=0.03)
    assert d["warnings"] == []


def test_405b_search_top_layout_at_16k_gpus_stays_below_the_published_2k_run(published_runs, acc):
    # The 405B reference search (16,384 H100, 2,048 x 8,192 tokens) ranks tp8 pp8 dp128 cp2 vpp16 first. DGX
    # Cloud's run of that layout family (tp8 pp8 cp2 vp8 on 2,048 H100, 64 micro-batches a pipeline) measured
    # 55.22% MFU; at 16,384 GPUs the same 16M-token step leaves 16 micro-batches a pipeline, so the pipeline's
    # fill and drain and every once-a-step cost weigh 4x more: the plan must be predicted below the published
    # run, which llmplan prices within 1% (test_bf16_llama_step_times). docs/validation.md#cp-short
    from llmplan.estimate import estimate_training

    rec = published_runs[R405_2K]
    model, cluster, plan = acc.record_setup(rec, acc.family(R405_2K))
    big = acc.cluster_of(cluster.system, 16384)
    top = plan.model_copy(update={"dp": 128, "global_batch": 2048, "vpp": 16})
    mfu = estimate_training(model, big, top).throughput.mfu
    assert 0.45 < mfu < rec["measured"]["mfu"], f"{mfu:.4f}"
