"""CheckThresholds: the limits `check` (and search's --min-headroom) hold plans and specs to, with their ranges
(a NaN tolerance let every regression pass; an infinite one disabled the check without saying so)."""

from __future__ import annotations

from pydantic import Field

from llmplan.specs.model import Spec


class CheckThresholds(Spec):
    """What a re-checked plan or spec may differ by before `check` fails it."""

    tolerance: float = Field(default=0.05, ge=0, le=1)
    """Allowed step-time regression (throughput loss for serving plans) of a re-checked plan, as a fraction
    (0.05 = 5%); at most 1, a plan twice as slow: a larger tolerance would pass any regression."""
    param_tolerance: float = Field(default=0.01, ge=0, le=1)
    """Allowed gap between the computed and the declared parameter count, as a fraction of the declared one
    (0.01 = 1%); at most 1: a larger gap means the dimensions describe another model."""
    min_headroom_gib: float | None = Field(default=None, ge=0, le=65_536)
    """GiB a plan must leave free per GPU (None: the default fraction of its memory); at most 64 TiB, beyond
    any GPU's memory."""
