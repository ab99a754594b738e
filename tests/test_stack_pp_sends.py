"""Which stacks' pipeline sends block, synchronise the device or run one at a time, as benchmarks/accuracy.py reads
them (docs/formulas.md#step.pp_blocking, #step.pp_unbatched): MegaScale's Megatron-LM baseline (285068c8, 2023-01,
before overlap_p2p_comm), Megatron-Core's 1F1B (batch_p2p_comm with batch_p2p_sync), DeepSpeed's pipeline engine."""

from __future__ import annotations

import pytest

from llmplan.cost.moe import EAGER_OP_HOST_S, HOST_SYNC_S
from llmplan.estimate import estimate_training


def _mfu(acc, rec: dict, fam: str, gpus: int, **update: object) -> float:
    system = acc.builtin_systems()[acc.record_system(rec)]
    plan = acc.plan_for(rec, fam, gpus).model_copy(update=update)
    return float(estimate_training(acc.model_for(rec, fam), acc.cluster_of(system, gpus), plan).throughput.mfu)


def test_megascale_baseline_blocks_within_table_3s_pp_overlap_step(acc, published_runs) -> None:
    # Jiang et al. 2024 (arXiv:2402.15627) §6.1: the baseline is "Megatron-LM (commit hash: 285068c8)", interleaved
    # (6 chunks at 175B); its p2p_communication._communicate waits and synchronises (overlap_p2p_comm came
    # 2023-05-31). Table 3 (175B, 256 GPUs) credits MegaScale's PP overlap with 55.5 -> 58.0% MFU: letting the
    # baseline's sends overlap must gain MFU, and not more than that whole step.
    rec = published_runs["megascale-t2-175b-megatron-lm-256gpu"]
    assert acc.plan_for(rec, "megascale", 256).pp_blocking_sends
    opt = published_runs["megascale-t2-175b-megascale-256gpu"]
    assert not acc.plan_for(opt, "megascale-opt", 256).pp_blocking_sends
    blocking = _mfu(acc, rec, "megascale", 256)
    overlapped = _mfu(acc, rec, "megascale", 256, pp_blocking_sends=False)
    assert 0 < overlapped - blocking <= 0.025, (blocking, overlapped)


def test_megatron_core_1f1b_rows_synchronise_after_each_exchange(acc, published_runs) -> None:
    # Megatron-LM core_r0.9.0 arguments.py turns overlap_p2p_comm off without interleaving and sets batch_p2p_comm
    # = not overlap_p2p_comm; NeMo 2 / Megatron-Bridge set batch_p2p_comm for pp > 1, vp 1; batch_p2p_sync
    # defaults True (p2p_communication._communicate: torch.cuda.synchronize()). torchtitan's and DeepSpeed's
    # pipelines do not synchronise.
    seen = {"sync": 0, "torchtitan": 0, "deepspeed": 0}
    for rid, rec in published_runs.items():
        fam = acc.family(rid)
        if fam not in acc.FAMILIES or acc.skip_reason(rec) is not None or not acc.predict(rec, fam):
            continue
        plan = acc.plan_for(rec, fam, int(rec["hardware"]["gpus"]))
        if plan.pp == 1 or plan.vpp > 1:
            continue
        if fam in acc.MCORE_1F1B_SYNC:
            assert plan.pp_blocking_sends and not plan.pp_unbatched_sends, rid
            seen["sync"] += 1
        elif fam == "torchtitan":
            assert not plan.pp_blocking_sends and not plan.pp_unbatched_sends, rid
            seen["torchtitan"] += 1
        elif fam in ("bloom", "mtnlg"):
            assert plan.pp_unbatched_sends and not plan.pp_blocking_sends, rid
            seen["deepspeed"] += 1
    assert all(seen.values()), seen


def test_a_1f1b_synchronisation_is_one_host_wait_per_exchange(acc, published_runs) -> None:
    # 1F1B's 2(n + p - 1) exchanges each end in torch.cuda.synchronize(): the GPU idles for the host's wake-up and
    # its next launch (step.host_sync), and nothing else of the step changes (1F1B's sends already block).
    rid = next(r for r, rec in published_runs.items() if acc.family(r) in acc.MCORE_1F1B_SYNC
               and acc.skip_reason(rec) is None and acc.predict(rec, acc.family(r))
               and acc.plan_for(rec, acc.family(r), int(rec["hardware"]["gpus"])).pp > 1
               and acc.plan_for(rec, acc.family(r), int(rec["hardware"]["gpus"])).vpp == 1)
    rec, fam = published_runs[rid], acc.family(rid)
    gpus = int(rec["hardware"]["gpus"])
    system = acc.builtin_systems()[acc.record_system(rec)]
    plan, model, cluster = acc.plan_for(rec, fam, gpus), acc.model_for(rec, fam), acc.cluster_of(system, gpus)
    on = estimate_training(model, cluster, plan)
    off = estimate_training(model, cluster, plan.model_copy(update={"pp_blocking_sends": False}))
    n, p = plan.num_microbatches, plan.pp
    waits = 2 * (n + p - 1) * (HOST_SYNC_S + EAGER_OP_HOST_S * system.gpu.host_op_factor)
    assert float(on.time.overheads["pp_sync"]) == pytest.approx(waits), rid
    assert float(on.time.total - off.time.total) == pytest.approx(waits), rid
