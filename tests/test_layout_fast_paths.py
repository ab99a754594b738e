"""The layout pass's shortcuts give the numbers the plain walks give, bit for bit (issue 39: speed of the loop).

`search` prices its best pipelined shapes with a balanced layout (search.layouts) through the scalar estimate,
whose cost was the schedule simulation and the walk of each stage's order for its activation peak. Both now
run from per-process tables of the order (schedule._steps, memory._order_steps) and a running sum; these tests
hold them to straightforward re-statements of the rules (each stage's passes in stage_order, a pass starting
when its stage is free and its input is done; the activations held after each pass), exactly."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.memory import layout_peak_layers
from llmplan.cost.params import layout_chunk_layers, layout_grid
from llmplan.cost.schedule import makespan, pipeline_schedule, stage_order
from llmplan.specs.layout import balanced_layout
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

M = builtin_models()


def walked_schedule(f: list[float], b: list[float], n: int, v: int, share: list[list[float]]) -> list[tuple]:
    """(stage, kind, micro-batch, chunk, start, end) of every pass, by repeated sweeps over the stages."""
    p = len(f)
    order = [stage_order(p, n, v, i) for i in range(p)]
    end: dict[tuple[str, int, int, int], float] = {}
    free, k, out = [0.0] * p, [0] * p, []
    while any(k[i] < len(order[i]) for i in range(p)):
        progressed = False
        for i in range(p):
            while k[i] < len(order[i]):
                kind, mb, c = order[i][k[i]]
                if kind == "forward":
                    dep = ("forward", i - 1, mb, c) if i > 0 else (("forward", p - 1, mb, c - 1) if c else None)
                else:
                    dep = (("backward", i + 1, mb, c) if i < p - 1 else
                           ("backward", 0, mb, c + 1) if c < v - 1 else ("forward", p - 1, mb, c))
                if dep is not None and dep not in end:
                    break
                start = max(free[i], end[dep] if dep else 0.0)
                free[i] = end[(kind, i, mb, c)] = start + (f[i] if kind == "forward" else b[i]) * share[i][c]
                out.append((i, kind, mb, c, start, free[i]))
                k[i] += 1
                progressed = True
        assert progressed
    return sorted(out, key=lambda s: (s[0], s[4]))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.integers(1, 8), st.integers(1, 4), st.integers(1, 4), st.randoms(use_true_random=False))
def test_schedule_simulation_equals_the_walk(p, v, groups, rnd):
    n = p * groups
    f = [rnd.uniform(0.1, 3.0) for _ in range(p)]
    b = [rnd.uniform(0.1, 6.0) for _ in range(p)]
    raw = [[rnd.uniform(0.1, 1.0) for _ in range(v)] for _ in range(p)]
    share = [[x / sum(row) for x in row] for row in raw]
    walked = walked_schedule(f, b, n, v, share)
    got = [(s.stage, s.kind, s.microbatch, s.chunk, s.start, s.end) for s in pipeline_schedule(f, b, n, v, share)]
    assert got == walked
    assert makespan(f, b, n, v, share) == max(s[5] for s in walked)


def walked_peak(m, plan: ParallelPlan, stage: int, dense_b, moe_b):
    """The activations stage `stage` holds at its peak: each forward in its order adds its chunk's layers,
    each backward frees them."""
    rows = layout_chunk_layers(m, plan)[stage]
    assert len(rows) == len(layout_grid(plan)[stage])
    held = peak = 0.0 * dense_b
    for kind, _, c in stage_order(plan.pp, plan.num_microbatches, len(rows), stage):
        d, e = rows[c]
        held = held + (1 if kind == "forward" else -1) * (d * dense_b + e * moe_b)
        peak = np.maximum(peak, held)
    return peak


def test_layout_activation_peak_equals_the_walk():
    rng = np.random.default_rng(39)
    for name, pp, vpp, groups in [("deepseek-v3", 8, 4, 2), ("deepseek-v3", 16, 3, 1), ("llama-3.1-405b", 16, 3, 3),
                                  ("llama-3.1-405b", 8, 5, 2), ("mixtral-8x7b", 4, 3, 2)]:
        m = M[name]
        layout = balanced_layout(m.num_hidden_layers, pp, vpp, m.num_nextn_predict_layers)
        plan = ParallelPlan(pp=pp, vpp=vpp, global_batch=pp * groups, pp_layout=layout)
        for stage in range(pp):
            dense_b, moe_b = float(rng.uniform(1e6, 1e9)), float(rng.uniform(1e6, 1e9))
            assert float(layout_peak_layers(m, plan, stage, dense_b, moe_b)) == float(walked_peak(
                m, plan, stage, dense_b, moe_b)), (name, pp, vpp, stage)
            arrays = rng.uniform(1e6, 1e9, size=(2, 7))  # a grid of GPU constants: elementwise
            assert np.array_equal(layout_peak_layers(m, plan, stage, arrays[0], arrays[1]),
                                  walked_peak(m, plan, stage, arrays[0], arrays[1]))


def test_stage_layer_list_is_each_stages_count():
    from llmplan.cost.params import stage_layer_count, stage_layer_list
    from llmplan.specs.check import balanced_split

    checked = 0
    for name in ("deepseek-v3", "llama-3.1-405b", "gpt3-175b"):
        m = M[name]
        for pp in range(1, 40):
            for first, last in {(0, 0), balanced_split(m.num_hidden_layers, pp)}:
                if (m.num_hidden_layers - first - last) % max(pp - (first > 0) - (last > 0), 1):
                    continue
                plan = ParallelPlan(pp=pp, pp_first=first, pp_last=last, global_batch=pp * 4)
                assert stage_layer_list(m, plan) == [int(stage_layer_count(m, plan, i)) for i in range(pp)]
                checked += 1
        layout = balanced_layout(m.num_hidden_layers, 8, 3, m.num_nextn_predict_layers)
        plan = ParallelPlan(pp=8, vpp=3, global_batch=32, pp_layout=layout)
        assert stage_layer_list(m, plan) == [int(stage_layer_count(m, plan, i)) for i in range(8)]
    assert checked > 50


def test_a_plans_memo_never_crosses_models_or_gpus():
    """A single plan's memoized parts (cost.memo.memoized) are keyed by the model and GPU they were priced
    with: the same plan object priced on another GPU or model equals a fresh copy's estimate."""
    import json

    from llmplan import report
    from llmplan.estimate import estimate_training
    from llmplan.specs.plan import ClusterSpec
    from llmplan.specs.registry import builtin_systems

    S = builtin_systems()
    plan = ParallelPlan(tp=8, pp=4, dp=2, global_batch=64, seq_len=4096, micro_batch=1, recompute="selective")
    runs = [(M["llama-3.1-70b"], ClusterSpec(system=S["dgx-h100"], num_nodes=8)),
            (M["llama-3.1-70b"], ClusterSpec(system=S["dgx-a100"], num_nodes=8)),
            (M["qwen2.5-72b"], ClusterSpec(system=S["dgx-a100"], num_nodes=8))]
    as_json = lambda e: json.dumps(report.estimate_json(e), sort_keys=True, default=str)
    for m, cluster in runs:
        shared = as_json(estimate_training(m, cluster, plan))
        assert shared == as_json(estimate_training(m, cluster, plan.model_copy(deep=True))), (m.name, cluster)
