"""ParallelPlan builders shared by the cost tests: a file's default plan with a test's fields over it."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from llmplan.specs.plan import ParallelPlan


def plan_of(defaults: Mapping[str, object]) -> Callable[..., ParallelPlan]:
    """A builder of ParallelPlans: `defaults`, with the fields the caller names replacing theirs."""

    def build(**kw: object) -> ParallelPlan:
        return ParallelPlan(**{**defaults, **kw})  # type: ignore[arg-type]

    return build
