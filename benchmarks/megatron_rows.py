"""The megatron family's rows at its left-out fold's constants, term by term, and how robust its left-out median is
(docs/validation.md#megatron-rows-2).

For each of the family's fourteen records: the plan as read, the signed error (predicted / measured - 1, + =
predicted faster) at the all-family fit's and at the megatron fold's constants, and the step's parts as % of the
predicted step (compute, bubble, optimizer, exposed comm per axis, overheads), with the slowest stage's GEMM /
attention / memory-bound split. Then what the section reads beside them:

- `w` (pipelined rows): one chunk-pass of the stage's backward (a micro-batch's backward / vpp), as % of the step:
  the most that Megatron-LM core_r0.8.0's delay_grad_reduce (on by default) shifts a chunk's gradient reduction
  against what llmplan prices (the chunk's reduction starts after its last backward pass, not bucket by bucket
  inside it);
- `gemm x` (`attn x`, `mem x`): how much slower the step's GEMMs (attention kernels, memory-bound kernels) alone
  would have to run for the row's measured figure, all else as priced;
- `wgrad`: the upper bound of the weight-gradient GEMMs' main_grad read + write (Transformer Engine's fused
  gradient accumulation, fp32 main_grad here, bf16 under --grad-reduce-in-bf16) if none of it overlapped the
  GEMM's main loop, as % of the step;

then the family's median at neighbouring clocks, the r0.8 rows scored on the table's TFLOP/s column instead of its
rounded MFU column, and, per row, the signed move of that row alone that takes the median to 10.0 (and to 10.05,
which the report rounds to 10.1).

    PYTHONPATH=$PWD python benchmarks/megatron_rows.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import benchmarks.accuracy as A  # noqa: E402
from llmplan.estimate import estimate_training  # noqa: E402

# The megatron fold's constants (left out with the megatron-lm group) and the all-family fit's, as
# `accuracy.py --quiet` prints them (docs/validation.md#stable-fit, #megatron-lofo).
FOLD = {"attention_efficiency": 1.0, "clock_a100": 0.8, "clock_h100": 0.8375}
ALL = {"attention_efficiency": 1.0, "clock_a100": 0.825, "clock_h100": 0.8125}


def records() -> list[dict]:
    return [r for r in yaml.safe_load(A.DEFAULT_RUNS.read_text()) if A.family(r["id"]) == "megatron"]


def wgrad_bytes(m, plan) -> float:
    """main_grad bytes one micro-batch's weight-gradient GEMMs read and write on a rank: each decoder weight
    on it read once and written once in the gradient's dtype (plan.grad_bytes)."""
    h, f = m.hidden_size, m.intermediate_size
    kv = (m.num_key_value_heads or m.num_attention_heads) / m.num_attention_heads
    per_layer = (h * h * (2 + 2 * kv) + h * f * (3 if m.gated_mlp else 2)) / plan.tp
    return 2 * plan.grad_bytes * per_layer * m.num_hidden_layers / plan.pp


def row(rec: dict, consts: dict):
    m, cluster, plan = A.record_setup(rec, "megatron", consts)
    e = estimate_training(m, cluster, plan)
    q, pred, meas = A.predict(rec, "megatron", consts)[0]
    return m, cluster, plan, e, 100 * (pred - meas) / meas


def main() -> int:
    recs = records()
    errs = {}
    print("row | GPUs | plan | all | fold | compute (gemm/attn/mem of stage) | bubble | exposed | overheads | "
          "w | gemm x | attn x | mem x | wgrad")
    for rec in recs:
        _, _, _, _, err_all = row(rec, ALL)
        m, cluster, plan, e, err = row(rec, FOLD)
        errs[rec["id"]] = err
        t, st = e.time, e.time.stage
        T = float(t.total)
        pct = lambda x: 100 * float(x) / T  # noqa: E731
        ex = " ".join(f"{k} {pct(v):.1f}" for k, v in t.exposed.items() if float(v))
        ov = " ".join(f"{k} {pct(v):.1f}" for k, v in t.overheads.items() if float(v) and pct(v) >= 0.05)
        s = float(st.total)
        w = (s - float(st.forward)) / plan.vpp
        gemm_step = float(t.compute) * float(st.gemm) / s
        slower = (gemm_step + T * err / 100) / gemm_step
        # the same for the attention and the memory-bound kernels alone
        attn_step, mem_step = (float(t.compute) * float(x) / s for x in (st.attention, st.memory_bound))
        attn_x, mem_x = ((x + T * err / 100) / x for x in (attn_step, mem_step))
        mb = plan.global_batch // (plan.micro_batch * plan.dp)
        wg = wgrad_bytes(m, plan) * mb / cluster.system.gpu.hbm_achieved_bytes_per_s
        print(f"{rec['id'].removeprefix('megatron-')} | {plan.num_gpus} | tp{plan.tp} pp{plan.pp} vpp{plan.vpp} "
              f"cp{plan.cp} dp{plan.dp} {mb}x mb{plan.micro_batch} {plan.dtype} grad {plan.grad_dtype} | "
              f"{err_all:+.2f} | {err:+.2f} | {pct(t.compute):.1f} ({100 * float(st.gemm) / s:.0f}/"
              f"{100 * float(st.attention) / s:.0f}/{100 * float(st.memory_bound) / s:.0f}) | {pct(t.bubble):.1f} | "
              f"{ex} | {ov} | {f'{pct(w):.2f}' if plan.pp > 1 else '-'} | {slower:.3f} | {attn_x:.2f} | {mem_x:.2f} | {pct(wg):.1f}")
    for c in (0.8125, 0.825, 0.8375, 0.85):
        e = A.throughput_errors(recs, {**FOLD, "clock_h100": c})
        s = sorted(e.items(), key=lambda kv: abs(kv[1]))
        print(f"clock_h100 {c}: megatron median |error| {statistics.median(abs(v) for v in e.values()):.3f} "
              f"(7th {s[6][0]} {s[6][1]:+.2f}, 8th {s[7][0]} {s[7][1]:+.2f})")

    # the r0.8 table's rows scored on its per-GPU TFLOP/s column (0.1 TFLOP/s) instead of its MFU column (1%)
    tf = {}
    for rec in recs:
        m, cluster, plan, e, err = row(rec, FOLD)
        meas = rec["measured"]
        if "mfu" in meas and "tflops_per_gpu" in meas:
            mfu = float(e.throughput.mfu_low_precision if plan.low_precision else e.throughput.mfu)
            tf[rec["id"]] = 100 * (mfu * cluster.system.gpu.peak_flops(plan.mfu_format) / 1e12
                                   / meas["tflops_per_gpu"] - 1)
            print(f"  {rec['id']}: on MFU {err:+.2f}, on TFLOP/s {tf[rec['id']]:+.2f}")
    print(f"fold median |error| with those rows scored on TFLOP/s: "
          f"{statistics.median(abs(tf.get(k, v)) for k, v in errs.items()):.3f}")

    def median_with(k: str, d: float) -> float:
        return statistics.median(abs(v + (d if j == k else 0.0)) for j, v in errs.items())

    print("row alone: signed move (points) that takes the fold median to 10.0 / 10.05")
    for k, v in errs.items():
        found = []
        for target in (10.0, 10.05):
            for sgn in (1, -1):
                lo, hi = 0.0, 25.0
                if median_with(k, sgn * hi) < target:
                    continue
                for _ in range(50):
                    mid = (lo + hi) / 2
                    lo, hi = (lo, mid) if median_with(k, sgn * mid) >= target else (mid, hi)
                found.append(f"{sgn * hi:+.3f} -> {target}")
        print(f"  {k}: {v:+.2f}; {'; '.join(found) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
