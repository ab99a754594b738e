"""Keys a causal sliding-window query sees: one formula for the FLOP counts of sliding-window layers
(cost.flops), of the compressed-attention layers' windows (cost.compressed) and of the useful work a windowed
kernel's rate is measured against (cost.attention_rate.window_rate_ratio)."""

from __future__ import annotations

from typing import Any

import numpy as np


def window_key_count(w: Any, s: Any) -> Any:
    """Keys per query counted for a causal sliding window of w keys over s tokens, the same multiple of what
    its kernel computes as a full causal layer's s: query i sees min(i, w) keys, on average w - w²/(2s) for
    w < s, so 2w - w²/s (s when w >= s). Derived: docs/formulas.md#compute.flops"""
    return np.where(w < s, 2.0 * w - w * w / s, s)
