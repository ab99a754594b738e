"""Pipeline schedules: one frozen record per schedule, read by step time, memory, check_plan, the report and
the exporters. Adding a schedule is one record here, its formulas in docs/formulas.md#step.schedule, its
drawing order in cost/schedule.py (ORDERS) and its launcher names in export/common.py (LAUNCHER_SCHEDULES).

The bubble of every schedule is written in the shape of the DeepSeek-V3 report's Table 2 (Liu et al. 2024):
(p / pipes - 1) x (F + b·B - w·W), with F a stage's forward, B its whole backward and W its weight-gradient
half, over one micro-batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from llmplan.specs.model import SPEC_CONFIG, Spec


class Schedule(Spec):
    """What a pipeline schedule costs and how it runs; data only (the cost functions read it)."""

    model_config = SPEC_CONFIG

    title: str = Field(min_length=1, max_length=40)
    """Name the report and messages print (the plain schedule's; interleaving is shown apart)."""
    caption: str = Field(min_length=1, max_length=200)
    """How the report's drawing of it reads: what runs in each slot."""
    bubble_pipes: int = Field(ge=1, le=2)
    """Pipelines the ranks' stages form: the bubble's stage count is p / pipes - 1 (DualPipe's two
    directions: p/2 - 1; Table 2)."""
    bubble_backward: float = Field(ge=0, le=4)
    """Backwards B in one bubble slot (Table 2: 1 for 1F1B and ZB1P, 2 for DualPipe's F&B + B)."""
    bubble_weight: float = Field(ge=0, le=4)
    """Weight-gradient halves W the schedule moves into the bubble (Table 2: 0, 2 for ZB1P, 3 for DualPipe)."""
    param_copies: int = Field(ge=1, le=2)
    """Stages each rank holds: 2 pairs stage i with stage pp-1-i (DualPipe, Table 2's 2x parameters), each
    with its own direction's micro-batches in flight: pp - i of stage i, i + 1 of stage pp-1-i, so PP + 1 in
    all on every rank (Table 2; deepseek-ai/DualPipe dualpipe.py DualPipe.step, steps 1-4)."""
    interleaves: bool
    """Whether it runs several virtual stages per rank (vpp > 1)."""
    hides_ep: bool
    """Whether it hides the expert all-to-alls behind the paired micro-batch in full (DeepSeek-V3 §3.2.1)."""
    pp_multiple: int = Field(ge=1, le=8)
    """pp must be a multiple of this (DualPipe pairs stage i with pp-1-i: 2)."""
    pp_multiple_reason: str = ""
    """Why, for check_plan's message."""
    min_microbatches_per_stage: int = Field(default=0, ge=0, le=8)
    """Micro-batches per step must be at least this times pp (DualPipe: 2; 0 for no bound)."""
    microbatch_multiple: int = Field(default=1, ge=1, le=8)
    """Micro-batches per step must be a multiple of this (DualPipe feeds half from each end: 2)."""
    drawing: Literal["1f1b", "zb-h1", "dualpipe"]
    """Which slot order cost.schedule lays out for the report (cost.schedule.ORDERS)."""


SCHEDULES: dict[str, Schedule] = {
    "1f1b": Schedule(
        title="1F1B", caption="1F1B", bubble_pipes=1, bubble_backward=1,
        bubble_weight=0, param_copies=1, interleaves=True, hides_ep=False, pp_multiple=1,
        drawing="1f1b"),
    "zero-bubble": Schedule(
        title="zero-bubble (ZB-H1)",
        caption="zero bubble (ZB-H1): backward split into input (orange) and weight (green) passes; the "
                "weight passes fill the bubble",
        bubble_pipes=1, bubble_backward=1, bubble_weight=2, param_copies=1, interleaves=False,
        hides_ep=False, pp_multiple=1, drawing="zb-h1"),
    "dualpipe": Schedule(
        title="DualPipe",
        caption="DualPipe: micro-batches enter from both ends (darker: from stage 0, lighter: from the last "
                "stage); paired forward and backward, weight passes (green) fill the ends",
        bubble_pipes=2, bubble_backward=2, bubble_weight=3, param_copies=2, interleaves=False,
        hides_ep=True, pp_multiple=2, pp_multiple_reason="DualPipe pairs stage i with stage pp-1-i",
        # Source: deepseek-ai/DualPipe, dualpipe/dualpipe.py DualPipe.step (num_chunks even, >= 2 x ranks)
        min_microbatches_per_stage=2, microbatch_multiple=2, drawing="dualpipe"),
}
"""Every pipeline schedule llmplan prices, by its --pp-schedule name."""

if TYPE_CHECKING:
    ScheduleName = str
else:
    ScheduleName = Literal[tuple(SCHEDULES)]
"""A --pp-schedule name: the registry's keys."""


def schedule_of(plan: Any) -> Schedule:
    """The record of a plan's (or plan array's: one schedule for all) pp_schedule."""
    return SCHEDULES[plan.pp_schedule]
