"""Side outputs priced for the shown search only (docs/validation.md#search-speed2): search(sides=False) leaves the
Pareto rows, the conventional plan, the best plans without CP / with EP and the wide-EP row pending, and
complete_sides prices them; the result must equal search(sides=True)'s, field by field, as the JSON prints them.
The cases: a dense search whose layout pass merges balanced-layout plans into the front (llama-3.1-70b on 8 DGX
H100, the README quick start) and an MoE one with EP on and off (qwen3-30b-a3b on 2 DGX H100)."""

from __future__ import annotations

import json

import pytest

from llmplan.report.training import estimate_json
from llmplan.search.grid import PlanArrays, Workload, default_space
from llmplan.search.run import complete_sides, search
from llmplan.specs.plan import ClusterSpec
from llmplan.specs.registry import resolve_model, resolve_system

SIDES = ("pareto", "conventional", "without_cp", "with_ep", "wide_ep")


def as_json(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(as_json(v) for v in value) + "]"
    return json.dumps(estimate_json(value), sort_keys=True, default=str)  # type: ignore[arg-type]


@pytest.mark.parametrize("model,system,nodes", [("llama-3.1-70b", "dgx-h100", 8), ("qwen3-30b-a3b", "dgx-h100", 2)])
def test_pending_sides_price_as_the_eager_ones(model, system, nodes):
    m = resolve_model(model)
    cluster = ClusterSpec(system=resolve_system(system), num_nodes=nodes)
    w = Workload(global_batch=256, seq_len=4096)
    space = default_space(m, cluster, w)
    eager = search(m, cluster, space, w)
    lazy = search(m, cluster, space, w, sides=False)
    assert eager.pending is None and lazy.pending is not None
    assert lazy.pareto == [] and lazy.conventional is None  # nothing priced before complete_sides
    assert [c.cell_contents for c in lazy.pending.price.__closure__ or ()
            if isinstance(c.cell_contents, PlanArrays)] == []  # the pending rows, not the plan arrays, are held
    done = complete_sides(lazy)
    assert done.pending is None
    for name in SIDES:
        assert as_json(getattr(done, name)) == as_json(getattr(eager, name)), name
    assert [as_json(e) for e in done.ranked] == [as_json(e) for e in eager.ranked]
    assert eager.pareto and eager.conventional is not None  # the comparison saw rows
