"""Narayanan et al. 2021 Table 2's ZeRO-3 rows against the data-parallel mechanisms issue 32 names
(docs/validation.md#zero3-2021-scale).

Part 1, per row: the step time the measurement implies (Eq. 3's hardware FLOPs per GPU over the measured
TFLOP/s), llmplan's step and its compute and exposed dp parts, the ZeRO-3 bytes a GPU moves per step (all-gathers
and reduce-scatters, as dp_transfers counts them) and that traffic over the implied step: the per-GPU rate at
which the step would be spent on the network alone.

Part 2: the rows' signed errors under what-ifs, none of them shipped: NCCL 2.7-2.9's own ring latencies for the
Simple protocol alone (src/graph/tuning.cc hwLat: 3.4 us per NVLink step, 9.6 us per network step, no base;
shipped since docs/validation.md#nccl-latency: v2.21.5's base + step latencies with the protocol its tuner
picks), every ring step at the network's 9.6 us, the gathers and reductions not overlapped,
the reduction's traffic doubled (DeepSpeed v0.3.13-v0.4.0's all-reduce fallback without contiguous_gradients),
and the ring's network bandwidth cut to 1/4 and 1/8 of the 8 NICs' (no source: a probe of shape only).

Nothing here changes a prediction: `python benchmarks/zero3_scale.py` (about 10 s).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import accuracy as A
from runs import load_runs

import llmplan.topology.collectives as C

FAMILY = "narayanan2021"


def zero3_rows() -> list[dict]:
    """The family's ZeRO-3 rows that ran (not the out-of-memory attempt)."""
    return [r for r in load_runs() if "-zero3-" in r["id"] and "tflops_per_gpu" in r.get("measured", {})]


@contextmanager
def links(scale: Callable[[C.Links], C.Links] | None) -> Iterator[None]:
    """Price collectives with group_links' answer passed through `scale` (None: as shipped)."""
    orig = C.group_links
    if scale is not None:
        C.group_links = lambda system, span, nvls=True: scale(orig(system, span, nvls))  # type: ignore[assignment]
    try:
        yield
    finally:
        C.group_links = orig


def error(rec: dict, plan_update: dict[str, Any] | None = None, system_update: dict[str, Any] | None = None) -> float:
    """Signed % error of the row's hardware TFLOP/s with the plan / system fields overridden."""
    model, cluster, plan = A.record_setup(rec, FAMILY)  # type: ignore[misc]
    if plan_update:
        plan = plan.model_copy(update=plan_update)
    if system_update:
        cluster = cluster.model_copy(update={"system": cluster.system.model_copy(update=system_update)})
    e = A.estimate_training(model, cluster, plan)
    peak = cluster.system.gpu.peak_flops(plan.mfu_format) / 1e12
    return 100 * (float(e.throughput.hfu) * peak / rec["measured"]["tflops_per_gpu"] - 1)


def breakdown(rec: dict) -> tuple[float, float, float, float, float]:
    """(implied step s, predicted step s, predicted compute s, predicted exposed dp s, ZeRO-3 bytes per GPU)."""
    model, cluster, plan = A.record_setup(rec, FAMILY)  # type: ignore[misc]
    e = A.estimate_training(model, cluster, plan)
    implied = float(e.time.hardware_flops) / cluster.num_gpus / (rec["measured"]["tflops_per_gpu"] * 1e12)
    runs = A.with_fallbacks(plan, A.operator_uses(model, plan, cluster.system.gpu))
    comm = A.step_comm(model, runs, A.place(runs.degrees, cluster, A.DEFAULT_ORDER), cluster.system)
    moved = sum(float(t.calls * t.message) for t in comm.axes["dp"].transfers)
    return implied, float(e.time.total), float(e.time.compute), float(e.time.exposed["dp"]), moved


def short(rec: dict) -> str:
    return rec["id"].removeprefix("narayanan2021-t2-zero3-")


def label(rec: dict) -> str:
    """'175/1536': the model's billions of parameters, rounded, and the GPUs."""
    return f"{round(rec['model']['params_b'])}/{rec['hardware']['gpus']}"


def main() -> int:
    rows = zero3_rows()
    print("row              implied s  pred s  compute  dp exp  TB/GPU  TB/implied s")
    for r in rows:
        implied, pred, comp, dp, moved = breakdown(r)
        print(f"{short(r):16s} {implied:9.1f} {pred:7.1f} {comp:8.1f} {dp:7.1f} {moved / 1e12:7.2f}"
              f" {moved / implied / 1e9:8.1f} GB/s")
    no_overlap = {"overlap_param_gather": False, "overlap_grad_reduce": False}
    variants: list[tuple[str, Any, dict | None, dict | None]] = [
        ("as shipped", None, None, None),
        ("NCCL Simple ring lat", lambda L: dataclasses.replace(L, nccl=False, intra_alpha=3.4e-6, inter_alpha=9.6e-6),
         None, None),
        ("every ring step 9.6us", lambda L: dataclasses.replace(L, nccl=False, intra_alpha=9.6e-6, inter_alpha=9.6e-6),
         None, None),
        ("no dp overlap", None, no_overlap, None),
        ("Simple lat + no overlap",
         lambda L: dataclasses.replace(L, nccl=False, intra_alpha=3.4e-6, inter_alpha=9.6e-6), no_overlap, None),
        ("reduce traffic x2", None, {"grad_dtype": "fp32"}, None),
        ("ring net bw / 4 (probe)", lambda L: dataclasses.replace(L, inter_bw=L.inter_bw / 4, ring_inter_bw=L.ring_inter_bw / 4), None, None),
        ("ring net bw / 8 (probe)", lambda L: dataclasses.replace(L, inter_bw=L.inter_bw / 8, ring_inter_bw=L.ring_inter_bw / 8), None, None),
    ]
    print("\nsigned error of hw TFLOP/s (model B / GPUs)")
    print(f"{'':25s}" + "".join(f"{label(r):>9s}" for r in rows))
    for name, scale, plan_update, system_update in variants:
        with links(scale):
            errs = [error(r, plan_update, system_update) for r in rows]
        print(f"{name:25s}" + "".join(f"{x:+8.0f}%" for x in errs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
