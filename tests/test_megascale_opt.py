"""MegaScale's optimised stack (Jiang et al. 2024, "MegaScale: Scaling Large Language Model Training to More Than
10,000 GPUs", NSDI'24, arXiv:2402.15627) read as llmplan switches (ASSUMPTIONS["megascale-opt"] in
benchmarks/accuracy.py), the parallel transformer block's TP traffic (docs/formulas.md#comm.tp), and the
accuracy report's handling of a record without model dimensions."""

from __future__ import annotations

from statistics import median

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from llmplan.cost.comm import tp_transfers
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan


def _gpt(**kw: object) -> ModelSpec:
    base: dict = {"name": "g", "model_type": "gpt", "hidden_size": 4096, "intermediate_size": 16384,
                  "num_hidden_layers": 8, "num_attention_heads": 32, "vocab_size": 32000,
                  "max_position_embeddings": 4096, "gated_mlp": False, "norm_type": "layernorm"}
    return ModelSpec(**{**base, **kw})


@seed(32)
@settings(max_examples=40, deadline=None)
@given(tp=st.sampled_from([2, 4, 8]), sp=st.booleans(), recompute=st.sampled_from(["none", "full", "selective"]),
       mb=st.integers(1, 4))
def test_parallel_block_halves_every_tp_collective(tp: int, sp: bool, recompute: str, mb: int) -> None:
    # One norm's output feeds attention and MLP, their outputs are summed: one column- / row-parallel pair of
    # collectives per layer instead of two (MegaScale §3.1), in every pass, with or without SP.
    plan = ParallelPlan(tp=tp, sp=sp, recompute=recompute, micro_batch=mb, global_batch=mb * 4, seq_len=2048)
    serial = tp_transfers(_gpt(), plan, "tp")
    parallel = tp_transfers(_gpt(parallel_block=True), plan, "tp")
    for a, b in zip(serial, parallel, strict=True):
        assert (b.collective, b.message) == (a.collective, a.message)
        assert float(b.calls) == pytest.approx(float(a.calls) / 2)


def test_parallel_block_is_refused_on_a_moe_model() -> None:
    with pytest.raises(ValueError, match="parallel_block"):
        _gpt(parallel_block=True, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=1024)


def test_megascale_opt_reads_the_papers_switches(published_runs, acc) -> None:
    # §3.1 parallel transformer block, §3.2 TP / SP and DP communication overlapped, §3.3 FlashAttention-2 and
    # fused operators; the Megatron-LM baseline on the same plan has none of the first three.
    rec = published_runs["megascale-t2-175b-megascale-12288gpu"]
    base = published_runs["megascale-t2-175b-megatron-lm-12288gpu"]
    plan, model = acc.plan_for(rec, "megascale-opt", 12288), acc.model_for(rec, "megascale-opt")
    assert model.parallel_block and plan.tp_comm_overlap and plan.sp
    assert plan.overlap_grad_reduce and plan.overlap_param_gather and plan.flash_attention and plan.fused_kernels
    b_plan, b_model = acc.plan_for(base, "megascale", 12288), acc.model_for(base, "megascale")
    assert not (b_model.parallel_block or b_plan.tp_comm_overlap or b_plan.overlap_grad_reduce)


def test_megascale_opt_rows_within_five_percent_median(published_runs, acc) -> None:
    # Jiang et al. 2024, Table 2 (175B, 256-12,288 GPUs: 65.3% .. 55.2% MFU) and Table 3 (all optimisations,
    # 65.3%): the 9 optimised-stack 175B rows' median |error| within 5% (read without the parallel transformer
    # block and TP overlap it was 7.0%). The 530B rows are held to their speedup over Megatron-LM below: on
    # that model the baseline rows themselves run 10-12% fast (family megascale), so the optimised ones do too
    # (docs/formulas.md#compute.gemm_chunks).
    errs = []
    for rid, rec in published_runs.items():
        if acc.family(rid) != "megascale-opt" or "530b" in rid:
            continue
        (_, pred, meas), *_ = acc.predict(rec, "megascale-opt")
        errs.append(abs(pred / meas - 1))
    assert len(errs) == 9
    assert median(errs) <= 0.05


def test_megascale_530b_speedup_over_megatron_lm(published_runs, acc) -> None:
    # Jiang et al. 2024, Figure 9 (530B on 2,240 / 4,480 / 11,200 A100s, the same plans): MegaScale 54.3 / 54.1 /
    # 54.3% MFU against Megatron-LM's 49.2 / 48.8 / 48.2%, a speedup of 1.10-1.13. llmplan's ratio of the two
    # stacks on each plan within 5% of it (with each TP-overlap chunk priced at its own waves it was 1.01).
    for n in (2240, 4480, 11200):
        (_, opt, opt_meas), *_ = acc.predict(published_runs[f"megascale-fig9-530b-megascale-{n}gpu"], "megascale-opt")
        (_, base, base_meas), *_ = acc.predict(published_runs[f"megascale-fig9-530b-megatron-lm-{n}gpu"], "megascale")
        assert abs((opt / base) / (opt_meas / base_meas) - 1) <= 0.05


def test_a_record_without_model_dimensions_is_refused_in_one_line(published_runs, acc) -> None:
    # A row that gives only the model's name (as NeMo 24.07's Nemotron-22B row did before its dimensions were
    # recorded from its launcher config): plan_for used to fail with KeyError 'hidden' (model_for, reached for the
    # layer count); predict skips the row.
    src = published_runs["nemo2407-pretrain-nemotron-22b-64gpu-gbs256"]
    rec = {**src, "model": {k: v for k, v in src["model"].items() if k in ("name", "params_b", "seq_len")}}
    assert acc.described(src)
    assert not acc.described(rec)
    with pytest.raises(ValueError, match="no model dimensions"):
        acc.plan_for(rec, "nemo2407", 64)
    assert acc.predict(rec, "nemo2407") == []


def test_tp_overlap_gains_what_table_3_measures(published_runs, acc) -> None:
    # Jiang et al. 2024, Table 3 (175B, 256 GPUs): "+TP overlap" 53.3 -> 55.5% MFU, after the parallel
    # transformer block and sliding-window attention. On the optimised stack's 256-GPU plan, turning the overlap
    # off must cost MFU (it cost -0.5 points while each ring-exchange chunk paid its own waves:
    # docs/formulas.md#compute.gemm_chunks).
    from llmplan.estimate import estimate_training
    from llmplan.specs.check_switches import settle

    rec = published_runs["megascale-t2-175b-megascale-256gpu"]
    system = acc.builtin_systems()[acc.record_system(rec)]
    cluster, model = acc.cluster_of(system, 256), acc.model_for(rec, "megascale-opt")
    plan = acc.plan_for(rec, "megascale-opt", 256)
    on = float(estimate_training(model, cluster, plan).throughput.mfu)
    # settle: the userbuffer SMs the row's plan sets act only with the overlap (rule tp_overlap_sms_ub)
    off_plan = settle(plan.model_copy(update={"tp_comm_overlap": False}))
    off = float(estimate_training(model, cluster, off_plan).throughput.mfu)
    assert on > off
