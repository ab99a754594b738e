"""ClusterSpec: how many of which nodes a job runs on."""

from __future__ import annotations

from pydantic import Field, model_validator

from llmplan.specs.hardware import SystemSpec
from llmplan.specs.model import SPEC_CONFIG, Spec

MAX_GPUS = 2_000_000
"""Largest cluster llmplan places ranks on (today's largest training clusters hold a few 100,000 GPUs)."""


class ClusterSpec(Spec):
    """A number of identical nodes of one system."""

    model_config = SPEC_CONFIG

    system: SystemSpec
    """The node shape."""
    num_nodes: int = Field(ge=1, le=1_000_000)
    """Nodes in the job."""
    gpus_per_node: int | None = Field(default=None, ge=1, le=4_096)
    """GPUs used per node; None means all of the node's GPUs."""

    @model_validator(mode="after")
    def _fits_node(self) -> "ClusterSpec":
        g = self.gpus_per_node
        if self.num_gpus > MAX_GPUS:
            raise ValueError(f"{self.num_nodes:,} nodes x {self.gpus_per_node_used} GPUs = {self.num_gpus:,} GPUs is "
                             f"beyond any cluster llmplan plans for (at most {MAX_GPUS:,})")
        if g is not None and g > self.system.gpus_per_node:
            raise ValueError(
                f"gpus_per_node ({g}) exceeds the {self.system.gpus_per_node} GPUs of a {self.system.name} node; "
                f"use {self.system.gpus_per_node} or fewer GPUs per node")
        return self

    @property
    def gpus_per_node_used(self) -> int:
        return self.gpus_per_node or self.system.gpus_per_node

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node_used
