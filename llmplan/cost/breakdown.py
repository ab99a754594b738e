"""The one rule every breakdown keeps: its parts sum to its total."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np


class Breakdown:
    """Mixin for frozen breakdown dataclasses: `total` is the sum of the fields named in PARTS (elementwise
    when the parts are arrays). Fields outside PARTS (a stage index, a capacity) are context, not parts."""

    PARTS: ClassVar[tuple[str, ...]]

    @property
    def total(self) -> Any:
        # From the first part, not from 0: the same sums (0 + x is x) without a pass over 0 + arrays. Summed
        # once per object (the breakdowns are frozen; the search reads a stage's total several times) and
        # kept in the instance's __dict__, which no field, comparison or dataclasses.replace reads
        cached = self.__dict__.get("_total", _UNSET)
        if cached is not _UNSET:
            return cached
        parts = [getattr(self, name) for name in self.PARTS]
        out = parts[0]
        for p in parts[1:]:
            out = out + p
        if isinstance(out, np.ndarray) and len(parts) > 1:
            out.flags.writeable = False  # shared by every reader: an in-place change would reach them all
        self.__dict__["_total"] = out
        return out


_UNSET = object()
"""Breakdown.total not summed yet."""
