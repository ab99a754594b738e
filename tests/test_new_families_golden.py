"""Golden tests from the validation families of issue 32: Megatron-Bridge's performance tables (25.09-26.08,
records mbridge-*), BigScience's BLOOM-176B topology search (bloom-*), MegaScale (megascale-*) and MT-NLG
(mtnlg-*). Each test names its record and source; the record holds the published numbers (benchmarks/data).
Predictions run through benchmarks/accuracy.py, the same mapping from a record to a model, system and plan as
the accuracy report uses."""

from __future__ import annotations

import pytest

from llmplan.cost.compute import model_flops_per_step
from llmplan.specs.registry import builtin_systems
from llmplan.units import GIB


def _throughput(acc, rec: dict) -> tuple[float, float]:
    rows = acc.predict(rec, acc.family(rec["id"]))
    (_, pred, meas), *_ = rows
    return pred, meas


def test_the_four_families_are_shipped_and_mbridge_keeps_no_twin_of_a_bridge_record(published_runs, acc):
    fams: dict[str, int] = {}
    for rid in published_runs:
        f = rid.split("-")[0]
        fams[f] = fams.get(f, 0) + 1
    # 273 mbridge rows published, 20 of them already here as bridge-* records (same release, GPU, precision
    # and layout, same measured values); 55 bloom and the 20 rows of chronicles-prequel.md's 'Rebalancing
    # layers' tables (2022-02-28: 17 logged peaks, 3 OOM attempts), 24 megascale, 3 mtnlg (benchmarks/data/README.md).
    assert (fams["mbridge"], fams["bloom"], fams["megascale"], fams["mtnlg"]) == (253, 75, 24, 3)
    def key(rid: str, r: dict) -> tuple:
        release = (rid.split("-")[1][:2] + "." + rid.split("-")[1][2:] if rid.startswith("bridge-")
                   else r["source"]["ref"].split()[0])
        return (release, r["hardware"]["gpu"].split()[0].lower(), r["hardware"]["gpus"],
                r["parallel"]["global_batch"], r["measured"]["tokens_per_s_per_gpu"])

    bridge = {key(rid, r) for rid, r in published_runs.items() if rid.startswith("bridge-")}
    twins = [rid for rid, r in published_runs.items() if rid.startswith("mbridge-") and key(rid, r) in bridge]
    assert twins == []


def test_mbridge_rows_split_into_dense_and_moe_families(acc):
    assert acc.family("mbridge-26.04-pretrain-llama3.1-405b-dgx-gb300-256gpu-mxfp8-tp2pp8cp2epnavp4gbs1536mbs1") \
        == "mbridge-dense"
    assert acc.family("mbridge-26.04-pretrain-qwen3-30b-a3b-dgx-h100-16gpu-fp8-tp1pp1cp1ep16vpnagbs1024mbs1") \
        == "mbridge-moe"
    assert acc.family("megascale-t2-175b-megascale-12288gpu") == "megascale-opt"
    assert acc.family("megascale-t2-175b-megatron-lm-12288gpu") == "megascale"


def test_ranking_counts_each_megatron_bridge_config_once(published_runs, acc):
    # The tables re-measure the same layout in most releases: a ranking group holds each layout once.
    groups = acc.mbridge_configs(list(published_runs.values()))
    for name, recs in groups.items():
        layouts = [tuple(r["parallel"].get(k) or 0 for k in ("tp", "pp", "cp", "vpp", "ep", "fsdp", "micro_batch",
                                                             "global_batch")) for r in recs]
        assert len(layouts) == len(set(layouts)), name
    assert sum(len(v) for v in groups.values()) < sum(1 for rid in published_runs if "bridge-" in rid) / 2


def test_no_mbridge_row_is_skipped_for_its_architecture(published_runs, acc):
    # Every Nemotron-3 row is scored since the built-ins of issue 40 (Nano, Super, Ultra, 3.5 Lightning), and the
    # two DeepSeek-V4 Flash rows since the deepseek-v4-flash built-in (issue 40's target: 0 rows skipped for
    # architecture); the rows still skipped say why, for a recipe setting, not a model.
    nemotron = [r for rid, r in published_runs.items() if rid.startswith("mbridge-") and "nemotron" in rid]
    assert nemotron and all(acc.skip_reason(r) is None for r in nemotron)
    assert sum("nemotron-3-super" in r["id"] for r in nemotron) == 30
    deepseek_v4 = [r for rid, r in published_runs.items() if rid.startswith("mbridge-") and "deepseekv4" in rid]
    assert len(deepseek_v4) == 2 and all(acc.skip_reason(r) is None for r in deepseek_v4)
    reasons = {acc.skip_reason(r) for rid, r in published_runs.items() if rid.startswith("mbridge-")} - {None}
    assert reasons and all("architecture" not in why and "DeepSeek-V4" not in why for why in reasons)


def test_deepseek_v4_flash_rows_are_scored_with_the_published_flop_count(published_runs, acc):
    # Megatron-Bridge 26.08 table: DeepSeek-V4 Flash on 128 GB300 and 128 GB200 (TP1 PP1 EP64, MXFP8, micro-batch
    # 1, batch 2,048 x 4,096): 8,224 and 7,776 tokens/s per GPU at 748 and 706 model TFLOP/s per GPU, so 90.95 and
    # 90.79 GFLOP per token as Megatron-Bridge counts them (training/utils/flop_utils.py dsv4_hybrid). llmplan's
    # count (compressed attention, the CSA indexers, hyper-connection projections, the MTP layer) within 1.5% of
    # both. Both runs fit and are predicted to. Throughput measured at this commit: +51.9% and +54.5%, the
    # over-prediction of the family's other full-iteration-graph MXFP8 MoE rows (GPT-OSS 120B +50.6% median):
    # bounded at 60% here so that a change which moves them is seen.
    rows = [r for rid, r in published_runs.items() if "deepseekv4-flash" in rid]
    assert len(rows) == 2
    for r in rows:
        meas, plan = r["measured"], acc.plan_for(r, "mbridge-moe", r["hardware"]["gpus"])
        per_token = model_flops_per_step(acc.model_for(r, "mbridge-moe"), plan) / (plan.global_batch * plan.seq_len)
        published = meas["tflops_per_gpu"] * 1e12 / meas["tokens_per_s_per_gpu"]
        assert per_token == pytest.approx(published, rel=0.015), r["id"]
        got = {q: (p, m) for q, p, m in acc.predict(r, "mbridge-moe")}
        p, m = got["tok/s/GPU"]
        assert abs(p / m - 1) < 0.60, (r["id"], p, m)
        assert got["fits"] == (1.0, 1.0)


def test_nemotron_3_ultra_and_lightning_rows_are_scored_within_the_moe_rows_error(published_runs, acc):
    # Megatron-Bridge 26.08 table: Nemotron-3 Ultra on 256 GB300 (TP1 EP64) and 256 GB200 (TP2 EP64), MXFP8,
    # 3,552 and 2,528 tokens/s per GPU; Nemotron-3.5 Lightning on 8 GB200 (EP8, micro-batch 2), 28,672. Measured
    # at this commit: +26.6%, +43.7%, +22.7%, each within 50%, about the family's median error (37.8%, the Nano
    # rows' 43.6%). All three runs ran, so each must be predicted to fit; Ultra's with its presets' offload of
    # the expert MLP's fc1 output to the CPU (ParallelPlan.offload_moe_act, docs/validation.md#ultra-offload).
    # Ultra GB200 is +55.8% since its presets' hybrid sharding is priced (the experts' collectives no longer
    # cross the four NVLink domains each micro-batch: docs/validation.md#hsdp), so Ultra is bounded at 60%, as
    # DeepSeek-V4 Flash above, to see a change that moves it.
    rows = {rid: r for rid, r in published_runs.items() if "nemotron-3-ultra" in rid or "nemotron-3-5-lightning" in rid}
    assert len(rows) == 3
    for rid, r in rows.items():
        got = {q: (p, m) for q, p, m in acc.predict(r, "mbridge-moe")}
        p, m = got["tok/s/GPU"]
        assert abs(p / m - 1) < (0.60 if "ultra" in rid else 0.50), (rid, p, m)
        assert got["fits"] == (1.0, 1.0), rid


def test_kimi_k2_rows_are_scored_within_the_moe_rows_error(published_runs, acc):
    # Megatron-Bridge's Kimi-K2 rows (256 GB300, PP4 VP4 EP64, MXFP8; performance tables 26.02.01-26.06): scored
    # since the kimi-k2 built-in, each within 30% of its measured tokens/s per GPU, about the median error of
    # the family's MoE rows (issue 40's target: "the Kimi-K2 rows within the same error as the other MoE rows")
    kimi = [r for rid, r in published_runs.items() if "kimi-k2" in rid]
    assert len(kimi) == 4 and all(acc.skip_reason(r) is None for r in kimi)
    for r in kimi:
        rows = {q: (p, m) for q, p, m in acc.predict(r, "mbridge-moe")}
        p, m = rows["tok/s/GPU"]
        assert abs(p / m - 1) < 0.30, (r["id"], p, m)
        assert rows["fits"] == (1.0, 1.0), r["id"]  # a run that ran is predicted to fit


def test_nemotron_3_nano_rows_are_scored_like_the_small_expert_moe_rows(published_runs, acc):
    # Megatron-Bridge's 20 Nemotron-3 Nano rows (performance tables 26.02.01-26.08; 23 Mamba-2, 23 MoE and 6
    # attention blocks): all predicted to fit, as they ran; tokens/s per GPU within 65% of the measured, the
    # over-prediction the other small-expert MoE rows show (Qwen3-30B-A3B, GPT-OSS 120B: docs/validation.md
    # #hybrid); the model FLOPs per token within 3% of the table's TFLOP/s over tokens/s (22.3 G on H100).
    nano = [r for rid, r in published_runs.items() if "nemotron-3-nano" in rid]
    assert len(nano) == 20
    for r in nano:
        rows = {q: (p, m) for q, p, m in acc.predict(r, "mbridge-moe")}
        p, m = rows["tok/s/GPU"]
        assert abs(p / m - 1) < 0.65, (r["id"], p, m)
        assert rows["fits"] == (1.0, 1.0), r["id"]
        meas, plan = r["measured"], acc.plan_for(r, "mbridge-moe", r["hardware"]["gpus"])
        per_token = model_flops_per_step(acc.model_for(r, "mbridge-moe"), plan) / (plan.global_batch * plan.seq_len)
        published = meas["tflops_per_gpu"] * 1e12 / meas["tokens_per_s_per_gpu"]
        assert per_token == pytest.approx(published, rel=0.03), r["id"]


# A small-expert MoE row: Qwen3-30B-A3B (128 experts of FFN 768, top-8) on 16 H100, EP16, FP8, micro-batch 1,
# batch 1,024 x 4,096: 8,901 tokens/s per GPU (Megatron-Bridge performance summary, NeMo 26.04 container).
# Tolerance 15%: issue 32's target for the MoE rows of mbridge.
SMALL_EXPERT = "mbridge-26.04-pretrain-qwen3-30b-a3b-dgx-h100-16gpu-fp8-tp1pp1cp1ep16vpnagbs1024mbs1"
# A large-expert row: GPT-OSS 120B (128 experts of FFN 2,880, top-4) on 64 H100, TP1 PP4 EP8, bf16, batch 1,280:
# 5,810 tokens/s per GPU (same table).
LARGE_EXPERT = "mbridge-26.04-pretrain-gpt-oss-120b-dgx-h100-64gpu-bf16-tp1pp4cp1ep8vpnagbs1280mbs1"


@pytest.mark.xfail(strict=True, reason="predicted 11,177 tokens/s per GPU against 8,901 (+25.6%; +29.3% before the "
                   "routed experts' casts were counted on the k permuted rows, docs/validation.md#kcast) with the "
                   "recipe's HybridEP dispatch at the H100 clock 0.825 (docs/validation.md#refit): the 26.04 stack "
                   "without full-iteration CUDA graphs (docs/validation.md#moe-mechanisms)")
def test_small_expert_moe_row_within_15_percent(published_runs, acc):
    pred, meas = _throughput(acc, published_runs[SMALL_EXPERT])
    assert meas == 8901
    assert pred == pytest.approx(meas, rel=0.15)


def test_large_expert_moe_row_within_15_percent(published_runs, acc):
    # Inside again since the later stages' whole weight gathers wait on the 1F1B warm-up's chain
    # (docs/formulas.md#step.dp_later_stages): 6,590 tokens/s per GPU against 5,810 (+13.4%; +16.2% before, an
    # xfail since the MoE routing and permutes were priced by their kernels' passes, docs/validation.md#routing-passes).
    # GPT-OSS stays over-predicted on every GPU and release (docs/validation.md#moe-mechanisms).
    pred, meas = _throughput(acc, published_runs[LARGE_EXPERT])
    assert meas == 5810
    assert pred == pytest.approx(meas, rel=0.15)


def test_dense_mbridge_row_within_10_percent(published_runs, acc):
    # Llama 3.1 405B on 256 GB300, TP2 PP8 CP2 VP4, MXFP8, batch 1,536 x 8,192: 968 tokens/s per GPU
    # (Megatron-Bridge performance summary, NeMo 26.04). Tolerance 10%: issue 32's per-family target.
    pred, meas = _throughput(
        acc, published_runs["mbridge-26.04-pretrain-llama3.1-405b-dgx-gb300-256gpu-mxfp8-tp2pp8cp2epnavp4gbs1536mbs1"])
    assert meas == 968
    assert pred == pytest.approx(meas, rel=0.10)


def _bloom_estimate(acc, rec: dict):
    from llmplan.estimate import estimate_training
    from llmplan.specs.plan import ClusterSpec

    system = builtin_systems()[acc.record_system(rec)]
    gpus = rec["hardware"]["gpus"]
    cluster = ClusterSpec(system=system, num_nodes=gpus // 8, gpus_per_node=8)
    return estimate_training(acc.model_for(rec, "bloom"), cluster, acc.plan_for(rec, "bloom", gpus))


def test_bloom_out_of_memory_attempt_is_predicted_not_to_fit(published_runs, acc):
    # BigScience chronicles-prequel.md, 'gbs-and-tp-variations' (February 2022): the 72-layer, 14,336-wide
    # candidate at TP2 PP6 DP32, micro-batch 2, ZeRO-1, full recompute on 384 A100 80GB ran out of memory.
    rec = published_runs["bloom-prequel-gbs-and-tp-variations-L72h14336a64-dp32tp2pp6mbs2gbs2048z1"]
    assert rec["measured"]["outcome"] == "OOM"
    e = _bloom_estimate(acc, rec)
    assert not e.memory.fits
    assert float(e.memory.total) > 80 * GIB


def test_bloom_out_of_memory_attempt_at_micro_batch_1_is_predicted_not_to_fit(published_runs, acc):
    # Same table: the same layout at micro-batch 1 also ran out of memory.
    rec = published_runs["bloom-prequel-gbs-and-tp-variations-L72h14336a64-dp32tp2pp6mbs1gbs2048z1"]
    assert rec["measured"]["outcome"] == "OOM"
    assert not _bloom_estimate(acc, rec).memory.fits


def test_bloom_published_peak_below_capacity_within_10_percent(published_runs, acc):
    # Same section: TP8 PP6 DP8, micro-batch 4 ran with a logged peak of 55 GB per GPU, an nvidia-smi snapshot
    # ('was quickly getting the memory snapshot with ... nvidia-smi'), read as GiB and compared with what
    # nvidia-smi shows (the allocator's segments and the context: accuracy.nvidia_smi_bytes). Tolerance 10%:
    # issue 32's memory target.
    rec = published_runs["bloom-prequel-gbs-and-tp-variations-L72h14336a64-dp8tp8pp6mbs4gbs2048z1"]
    assert rec["measured"]["memory_gb_max"] == 55
    e = _bloom_estimate(acc, rec)
    assert e.memory.fits
    assert acc.nvidia_smi_bytes(e.memory) / GIB == pytest.approx(55, rel=0.10)


@pytest.mark.parametrize("mb, logged", [(1, 65), (2, 76)])
def test_bloom_wide_data_parallel_layouts_that_ran_fit(published_runs, acc, mb, logged):
    # chronicles-prequel.md 'GBS Variations' (2022-02-25): TP8 PP2 DP24 ran at micro-batch 1 and 2 with logged
    # peaks of 65 and 76 GB (nvidia-smi). 11.5B parameters per GPU: with the gradients in 16 bits, as DeepSpeed's
    # ZeRO-1 kept them (stage_1_and_2.py), they fit an 80 GB A100; read as fp32 gradients they did not (80.8 and
    # 85.3 GiB). Tolerance 15% on the nvidia-smi view (issue 32's 10% is a median target; these are snapshots).
    rec = published_runs[f"bloom-prequel-gbs-and-tp-variations-L72h14336a64-dp24tp8pp2mbs{mb}gbs2016z1"]
    assert rec["measured"]["memory_gb_max"] == logged
    e = _bloom_estimate(acc, rec)
    assert e.memory.fits
    assert acc.nvidia_smi_bytes(e.memory) / GIB == pytest.approx(logged, rel=0.15)


def test_bloom_single_replica_peak_holds_zero1s_step_copies(published_runs, acc):
    # chronicles-prequel.md 'Best TFLOPs', fp16 (2022-02-17): the 20B model (8 layers, hidden 14,400) at TP8
    # PP1 on one node, one data-parallel rank, logged 67 GB. With DP 1 ZeRO-1's step flattens and casts the
    # whole gradient (2 + 4 bytes per parameter, stage_1_and_2.py step) after the backward: without those
    # copies the prediction is about 48 GiB. Tolerance 10%.
    rec = published_runs["bloom-prequel-best-tflops-fp16-20b-8gpu"]
    assert rec["measured"]["memory_gb_max"] == 67
    e = _bloom_estimate(acc, rec)
    assert e.memory.fits
    assert acc.nvidia_smi_bytes(e.memory) / GIB == pytest.approx(67, rel=0.10)


def test_bloom_runs_on_jean_zay_omni_path(published_runs, acc):
    # BLOOM paper (arXiv:2211.05100) Section 3.4.1 and bigscience train/tr11-176B-ml/README.md: 8 A100 80GB per
    # node, 4 Omni-Path 100 Gb/s links per node (a DGX A100 has 8 x 200 Gb/s InfiniBand); BigScience's NCCL log on
    # that partition lists the 4 ports (experiments/bandwidth/all_reduce_bench-a100-n4.txt: hfi1_0 .. hfi1_3).
    rec = published_runs["bloom-176b-final-run"]
    system = builtin_systems()[acc.record_system(rec)]
    assert (system.name, system.gpus_per_node, system.nics_per_node, system.nic_gbit_per_s) == \
        ("jean-zay-a100", 8, 4, 100)
    assert acc.record_system(published_runs["mtnlg-530b-2240gpu"]) == "dgx-a100"


def test_bloom_final_run_iteration_time_within_10_percent(published_runs, acc):
    # bigscience train/tr11-176B-ml/README.md, first-epoch log line: 104.7 s per iteration (TP4 PP12 DP8,
    # micro-batch 2, global batch 2048, bf16, 384 A100 80GB on Jean Zay). Tolerance 10%: issue 32's target.
    pred, meas = _throughput(acc, published_runs["bloom-176b-final-run"])
    assert meas == 104.7
    assert pred == pytest.approx(meas, rel=0.10)


def test_bloom_wide_data_parallel_layout_within_10_percent(published_runs, acc):
    # chronicles-prequel.md 'GBS Variations' (2022-02-25): TP8 PP2 DP24, micro-batch 2 ran at 136.13 s per
    # iteration, the slowest DP of the section's 48-node layouts: its 11B parameters per GPU are all-reduced
    # (in 16 bits: DeepSpeed's ZeRO-1 before the BF16_Optimizer) over 24 nodes of 4 x 100 Gb/s Omni-Path after
    # the pipeline's last backward. Tolerance 10%.
    pred, meas = _throughput(
        acc, published_runs["bloom-prequel-gbs-and-tp-variations-L72h14336a64-dp24tp8pp2mbs2gbs2016z1"])
    assert meas == 136.13
    assert pred == pytest.approx(meas, rel=0.10)


def test_bloom_launch_blocking_costs_no_more_than_bigscience_measured(acc):
    # chronicles-prequel.md 'dealing with JZ hanging' (2022-02): the 200B candidate (80 layers, hidden 14,400,
    # 96 heads) at TP8 PP10 on 80 A100s, global batch 512, ran at 97.20 TFLOP/s asynchronous and 91.04 with
    # CUDA_LAUNCH_BLOCKING=1 (6.8% longer; at 160 GPUs the two were within 0.2%). The launches' share of that,
    # which launch_blocking prices, must be positive and no more than the measured slowdown, which also holds
    # the overlaps blocking removes.
    from llmplan.estimate import estimate_training
    from llmplan.specs.plan import ClusterSpec, ParallelPlan

    rec = {"id": "bloom-prequel-hanging-200b", "model": {"layers": 80, "hidden": 14400, "heads": 96,
                                                          "vocab": 250880, "seq_len": 2048}}
    model = acc.model_for(rec, "bloom")
    cluster = ClusterSpec(system=builtin_systems()["jean-zay-a100"], num_nodes=10, gpus_per_node=8)
    times = []
    for blocking in (False, True):
        plan = ParallelPlan(tp=8, pp=10, dp=1, micro_batch=1, global_batch=512, seq_len=2048, zero=1,
                            recompute="full", sp=False, flash_attention=False, launch_blocking=blocking)
        times.append(float(estimate_training(model, cluster, plan).time.total))
    assert 0 < times[1] / times[0] - 1 <= 97.20 / 91.04 - 1
