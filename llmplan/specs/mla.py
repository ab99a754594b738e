"""MLA: multi-head latent attention's dimensions as ints (ModelSpec.mla)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MLA:
    """Multi-head latent attention's dimensions as ints (ModelSpec.mla, present only on an MLA model): the
    optional ModelSpec fields narrowed once, so cost functions read ints. Names as in Hugging Face's
    DeepseekV3Config."""

    q_lora_rank: int | None
    """Rank of the compressed query; None: queries are not compressed (full h -> a * qk_head_dim)."""
    kv_lora_rank: int
    """Rank of the compressed key/value latent."""
    qk_nope_head_dim: int
    """Per-head query/key dimension without rotary embedding."""
    qk_rope_head_dim: int
    """Per-head query/key dimension with rotary embedding (the key part is shared by all heads)."""
    v_head_dim: int
    """Per-head value dimension."""

    @property
    def qk_head_dim(self) -> int:
        """Per-head query/key dimension: nope + rope."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def q_rank(self) -> int:
        """The query latent's width, 0 when queries are not compressed."""
        return self.q_lora_rank or 0
