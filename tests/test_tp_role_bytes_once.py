"""A stage's TP userbuffer roles (comm.tp_role_bytes) are priced once per stage and handed to the three costs
that read them (tp_forward_rs_share, tp_overlap_contention, tp_chunk_step_waits), which gave the same bytes
when each priced them again; called alone, each still prices them itself."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from llmplan.cost import comm, step
from llmplan.estimate import estimate_training
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()


def _counting(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Count every call of tp_role_bytes, the step module's (priced once a stage) and the fallbacks in comm."""
    calls: Counter = Counter()
    original = comm.tp_role_bytes

    def counted(where: str) -> Any:
        def f(*args: Any, **kw: Any) -> Any:
            calls[where] += 1
            return original(*args, **kw)
        return f

    monkeypatch.setattr(comm, "tp_role_bytes", counted("comm"))
    monkeypatch.setattr(step, "tp_role_bytes", counted("step"))
    for name in ("tp_overlap_contention", "tp_forward_rs_share", "tp_chunk_step_waits"):
        inner = getattr(step, name)

        def wrapped(*args: Any, _inner: Any = inner, _name: str = name, **kw: Any) -> Any:
            calls[_name] += 1
            return _inner(*args, **kw)
        monkeypatch.setattr(step, name, wrapped)
    return calls


@pytest.mark.parametrize("model,tp,pp", [("llama-3.1-70b", 8, 4), ("qwen3-30b-a3b", 4, 1)])
def test_roles_priced_once_per_stage(monkeypatch: pytest.MonkeyPatch, model: str, tp: int, pp: int) -> None:
    calls = _counting(monkeypatch)
    cluster = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=4)
    plan = ParallelPlan(tp=tp, pp=pp, dp=32 // (tp * pp), sp=True, tp_comm_overlap=True, global_batch=64,
                        seq_len=4096)
    estimate_training(M[model], cluster, plan)
    stages = calls["tp_overlap_contention"]
    assert stages >= 1
    assert calls["tp_forward_rs_share"] == calls["tp_chunk_step_waits"] == stages
    # one pricing a stage, none again inside the three that read it (they were 3 a stage)
    assert calls["step"] == stages
    assert calls["comm"] == 0


def test_roles_passed_or_priced_alike() -> None:
    m, plan, r = M["qwen3-30b-a3b"], ParallelPlan(tp=4, etp=2, ep=4, sp=True, tp_comm_overlap=True), 0.5
    roles = comm.tp_role_bytes(m, plan, r)
    assert comm.tp_forward_rs_share(m, plan, r, roles) == comm.tp_forward_rs_share(m, plan, r)
    assert comm.tp_overlap_contention(m, plan, r, 132, roles) == comm.tp_overlap_contention(m, plan, r, 132)
    assert comm.tp_chunk_step_waits(m, plan, 1e-3, 5e-3, r, roles) == comm.tp_chunk_step_waits(m, plan, 1e-3, 5e-3, r)
