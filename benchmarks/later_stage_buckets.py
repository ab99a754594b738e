"""Probe: Megatron-Core builds the DDP of every pipeline stage after the first unbucketed, and what that does to
the DP tail llmplan prices (docs/validation.md#later-stage-buckets).

NVIDIA/Megatron-LM d98e8a64dd megatron/core/distributed/distributed_data_parallel.py (__init__: "Turn off
bucketing if we are on a pipeline stage that is not the first ... if disable_bucketing or pp_rank > 0:
self.bucket_size = None"): on stage j > 0 each model chunk's gradients are one bucket (per buffer), reduced once
the chunk's last backward is done, and its weights one gather. When that gather is dispatched:
- interleaved (vpp > 1): align_param_gather (Megatron-LM's default, arguments.py --no-align-param-gather; Megatron-
  Bridge's CommOverlapConfig for pp > 1, vp > 1) dispatches chunks 0 and 1 at the schedule's start on every stage
  (pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving: config.param_sync_func[0], [1]),
  so stage j has the j chunk-forwards of the warm-up before its first forward;
- 1F1B (vpp 1): align_param_gather is forced off (arguments.py), so the first forward pre-hook dispatches the
  gather (param_and_grad_buffer.py finish_param_sync: "If current bucket's param AG has not been dispatched,
  dispatch it now") after the stage received its input (schedules.py: recv_forward, then forward_step): the
  whole gather waits, on the warm-up's chain.
The reduction: stage j's last backward ends j chunk-backwards before stage 0's (the cool-down), so its one
reduction has that much idle time before the pipeline is drained.

Per scored record with pp > 1, ZeRO-1 and both DP overlaps, this prints, per candidate stage: the rank's step
reduction R and gather G (seconds), the per-micro-batch forward f and backward b of the stage, the tail at the
bucket share (dp_exposed_per_step: the stage's exposed reduce + gather, first bucket share b_j; what llmplan priced
on every stage before docs/formulas.md#step.dp_later_stages) and the unbucketed mechanism's:
reduce max(0, R/v - j b/v) and gather max(0, G/v - j f/v) (interleaved) or G (1F1B, on the chain). It changes
nothing; run: PYTHONPATH=$PWD python benchmarks/later_stage_buckets.py [id-substring]."""

from __future__ import annotations

import sys
from dataclasses import replace

import accuracy as A
from runs import load_runs

from llmplan.cost.comm import comm_seconds
from llmplan.cost.exposure import bucket_share, dp_exposed_per_step
from llmplan.cost.params import stepped_rank_params, word_embedding_on_rank
from llmplan.cost.step import stage_comm, stage_times
from llmplan.estimate import estimate_training


def rows(needle: str = "") -> None:
    for rec in load_runs():
        fam = A.family(rec["id"])
        if fam not in A.TRAIN_FAMILIES or needle not in rec["id"]:
            continue
        setup = A.record_setup(rec, fam)
        if setup is None:
            continue
        m, cluster, plan = setup
        if plan.pp < 2 or plan.zero != 1 or not (plan.overlap_grad_reduce and plan.overlap_param_gather):
            continue
        est = estimate_training(m, cluster, plan)
        gpu = cluster.system.gpu
        secs = comm_seconds(est.comm, cluster.system)
        v, kappa = plan.vpp, gpu.contention
        priced_tail = mech_tail = 0.0
        chain = 0.0
        for j, (stage, sc, _, _) in enumerate(stage_times(m, plan, gpu)):
            c = stage_comm(secs, j)
            p_i = stepped_rank_params(m, plan, stage).total
            emb = word_embedding_on_rank(m, plan, stage)
            red = float(dp_exposed_per_step(plan, replace(c, dp_gather=0.0), sc, kappa, p_i, emb))
            gat = float(dp_exposed_per_step(plan, replace(c, dp_reduce=0.0), sc, kappa, p_i, emb))
            f, b = float(sc.forward), float(sc.total - sc.forward)
            R, G, s = float(c.dp_reduce), float(c.dp_gather), float(bucket_share(plan, p_i, emb))
            if int(stage) == 0:
                m_red, m_gat = red, gat
            else:
                m_red = max(0.0, R / v - int(stage) * b / v)
                m_gat = max(0.0, G / v - int(stage) * f / v) if v > 1 else G
            if v == 1 and int(stage) > 0:
                chain += G  # 1F1B: each later stage's whole gather on the warm-up chain
            priced_tail = max(priced_tail, red + gat)
            mech_tail = max(mech_tail, m_red + (m_gat if v > 1 or int(stage) == 0 else 0.0))
            print(f"  stage {int(stage):2d}: R {R*1e3:7.1f} G {G*1e3:7.1f} ms  f {f*1e3:6.1f} b {b*1e3:6.1f} ms  "
                  f"share {s:.3f}  bucket-share reduce {red*1e3:6.1f} gather {gat*1e3:6.1f}  "
                  f"unbucketed reduce {m_red*1e3:6.1f} gather {m_gat*1e3:6.1f}")
        step = float(est.time.total)
        extra = mech_tail + chain - priced_tail
        print(f"{rec['id']}: pp {plan.pp} vpp {v} step {step*1e3:.0f} ms; tail at the bucket share {priced_tail*1e3:.1f} ms, "
              f"unbucketed {mech_tail*1e3:.1f} ms + 1F1B gather chain {chain*1e3:.1f} ms: step "
              f"{extra/step*100:+.1f}%")


if __name__ == "__main__":
    rows(sys.argv[1] if len(sys.argv) > 1 else "")
