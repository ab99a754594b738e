"""moe_flex_backend where it means nothing, and a backend pinned alone (docs/validation.md#tidy-70).

Megatron-Core reads --moe-flex-dispatcher-backend only in its flex token dispatcher (MoEFlexTokenDispatcher,
NVIDIA/Megatron-LM d98e8a64dd megatron/core/transformer/moe/token_dispatcher.py; transformer_config.py asserts
--moe-token-dispatcher-type flex for the ncclep backend). So the JSON keeps the key on an alltoall plan but
writes it null, and a search given --moe-flex-backend alone searches the flex dispatcher (llmplan's
--moe-dispatcher deepep) instead of refusing the backend on the default alltoall dispatcher."""

from __future__ import annotations

import pytest

AXES = ("--model", "qwen3-30b-a3b", "--hardware", "gb200-nvl72", "--nodes", "18", "--global-batch", "256",
        "--seq-len", "4096", "--tp", "1", "--cp", "1", "--no-sp", "--recompute", "none", "--zero", "1",
        "--grad-dtype", "bf16", "--no-fp8-params", "--top", "1")
"""A short pinned search on a MoE model (as tests/test_search_pinned_winner.py)."""

ESTIMATE = ("estimate", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--nodes", "2", "--ep", "8")


def test_an_alltoall_plan_writes_the_backend_null_and_rebuilds() -> None:
    from llmplan.report.training import plan_json
    from llmplan.specs.plan import ParallelPlan
    plan = ParallelPlan(ep=8, dp=8, moe_dispatcher="alltoall", moe_flex_backend="hybridep")
    d = plan_json(plan)
    assert "moe_flex_backend" in d and d["moe_flex_backend"] is None
    assert ParallelPlan(**d).moe_flex_backend == "deepep"  # null reads back as the default
    flex = plan.model_copy(update={"moe_dispatcher": "deepep"})
    assert plan_json(flex)["moe_flex_backend"] == "hybridep"


def test_estimate_json_null_on_alltoall_and_the_backend_on_the_flex_dispatcher(cli) -> None:  # noqa: ANN001
    a2a = cli(*ESTIMATE, "--json")
    assert a2a.code == 0, a2a.err
    plan = a2a.json()["plan"]
    assert plan["moe_dispatcher"] == "alltoall" and "moe_flex_backend" in plan and plan["moe_flex_backend"] is None
    flex = cli(*ESTIMATE, "--moe-dispatcher", "deepep", "--moe-flex-backend", "hybridep", "--json")
    assert flex.code == 0, flex.err
    assert flex.json()["plan"]["moe_flex_backend"] == "hybridep"


@pytest.mark.parametrize("backend", ["hybridep", "deepep"])
def test_estimate_of_a_backend_alone_is_refused_with_the_fix(cli, backend: str) -> None:  # noqa: ANN001
    # estimate prices the plan as given: a backend named on the alltoall dispatcher, its default value included
    # (review-70a: deepep alone priced alltoall with exit 0), is one line naming the fix
    r = cli(*ESTIMATE, "--moe-flex-backend", backend)
    assert r.code == 2 and "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert f"moe_flex_backend {backend} with moe_dispatcher alltoall" in r.err
    assert "add --moe-dispatcher deepep" in r.err


@pytest.mark.parametrize("backend", ["hybridep", "deepep"])
def test_a_search_given_a_backend_alone_searches_the_flex_dispatcher(cli, backend: str) -> None:  # noqa: ANN001
    r = cli("search", *AXES, "--moe-flex-backend", backend, "--json")
    assert r.code == 0, r.err  # was exit 2: rule moe_flex_backend_deepep on the default alltoall dispatcher
    plan = r.json()["plans"][0]["plan"]
    assert (plan["moe_dispatcher"], plan["moe_flex_backend"]) == ("deepep", backend)


def test_a_search_pinned_to_alltoall_writes_the_backend_null(cli) -> None:  # noqa: ANN001
    r = cli("search", *AXES, "--moe-dispatcher", "alltoall", "--json")
    assert r.code == 0, r.err
    plan = r.json()["plans"][0]["plan"]
    assert plan["moe_dispatcher"] == "alltoall" and plan["moe_flex_backend"] is None
