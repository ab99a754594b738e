"""The one rule every breakdown keeps: its parts sum to its total."""

from __future__ import annotations

from typing import Any, ClassVar


class Breakdown:
    """Mixin for frozen breakdown dataclasses: `total` is the sum of the fields named in PARTS (elementwise
    when the parts are arrays). Fields outside PARTS (a stage index, a capacity) are context, not parts."""

    PARTS: ClassVar[tuple[str, ...]]

    @property
    def total(self) -> Any:
        # From the first part, not from 0: the same sums (0 + x is x) without a pass over 0 + arrays.
        parts = [getattr(self, name) for name in self.PARTS]
        out = parts[0]
        for p in parts[1:]:
            out = out + p
        return out
