"""The one rule every breakdown keeps: its parts sum to its total."""

from __future__ import annotations

from typing import Any, ClassVar


class Breakdown:
    """Mixin for frozen breakdown dataclasses: `total` is the sum of the fields named in PARTS (elementwise
    when the parts are arrays). Fields outside PARTS (a stage index, a capacity) are context, not parts."""

    PARTS: ClassVar[tuple[str, ...]]

    @property
    def total(self) -> Any:
        return sum(getattr(self, name) for name in self.PARTS)
