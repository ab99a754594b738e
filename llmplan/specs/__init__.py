"""Specs: frozen pydantic models that hold data (they never read files, env or hardware), the registry that
loads them, and check_plan with every plan-vs-model rule (import it from llmplan.specs.check: the rules price
offloaded activations with the cost model, which imports these specs, so the package does not import it)."""

from llmplan.specs.hardware import GpuSpec, SystemSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec, MemoryAllowance, ParallelPlan

__all__ = ["ClusterSpec", "GpuSpec", "MemoryAllowance", "ModelSpec", "ParallelPlan", "SystemSpec"]
