"""The regime of a plan or a validation record (docs/validation.md#intervals): the tags a prediction interval's
records are selected by (dense or MoE, GPU generation, framework family, scale) and the regime pools and cells
(POOLS, cell_of) whose own quantile pair is calibrated on left-out coverage (llmplan.intervals.conformal)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

TAGS = ("moe", "generation", "framework", "scale")
"""The regime tags, in the order the basis names them."""
RELAX_ORDER = ("scale", "framework", "generation", "moe")
"""The order the regime tags are dropped in when too few records match."""
UNCOVERED = ("generation", "moe")
"""Tags whose loss means that no validation family covers the plan's regime."""


@dataclass(frozen=True)
class Regime:
    moe: bool
    generation: str
    framework: str
    gpus: int
    flash: bool = True
    """Flash attention (the plan's flash_attention): not a selection tag, it picks the regime pool (POOLS)."""

    @property
    def scale(self) -> str:
        return scale_bucket(self.gpus)

    def tag(self, name: str) -> Any:
        return getattr(self, name)

    def describe(self, tags: Iterable[str]) -> str:
        words = {"moe": "MoE" if self.moe else "dense", "generation": self.generation,
                 "framework": f"{self.framework}-style", "scale": f"{self.scale} GPUs"}
        return ", ".join(words[t] for t in TAGS if t in tags)


def scale_bucket(gpus: int) -> str:
    return "<=64" if gpus <= 64 else "<=512" if gpus <= 512 else ">512"


def generation(gpu_name: str) -> str:
    """The GPU's generation from its profile name (a100 -> ampere, h100/h200/h800/h20 -> hopper, b200 ... ->
    blackwell); other GPUs keep their name (no validation record shares it)."""
    g = gpu_name.lower()
    if g.startswith("a100"):
        return "ampere"
    if g.startswith(("h100", "h200", "h800", "h20")):
        return "hopper"
    if g.startswith(("b200", "b300", "gb200", "gb300")):
        return "blackwell"
    return g


def framework(plan: Any) -> str:
    """'fsdp' for plans priced as the sharded data-parallel stacks run them (PyTorch FSDP's fp32 parameter shards,
    DTensor TP, or gradients / weights sharded over the data-parallel group, ZeRO-2 or 3, which Megatron-style
    stacks do not run: their distributed optimizer is ZeRO-1), else 'megatron'. ZeRO counts as well as the
    fp32-shard flag, since check_switches.settle clears that flag below ZeRO-3 (llm-foundry's SHARD_GRAD_OP)."""
    return "fsdp" if getattr(plan, "fp32_param_shards", False) or getattr(plan, "tp_impl", "") == "dtensor" \
        or getattr(plan, "zero", 0) >= 2 else "megatron"


def regime_of(model: Any, plan: Any, cluster: Any) -> Regime:
    return Regime(moe=bool(model.num_experts), generation=generation(cluster.system.gpu.name),
                  framework=framework(plan), gpus=int(cluster.num_gpus),
                  flash=bool(getattr(plan, "flash_attention", True)))


def source_of(record: dict[str, Any]) -> str:
    """The source a residual's family shares with others (its `source` key: benchmarks/accuracy.py
    SOURCE_GROUPS, docs/validation.md#lofo-source), else its family."""
    return str(record.get("source", record["family"]))


def record_regime(rec: dict[str, Any]) -> Regime:
    return Regime(moe=bool(rec["moe"]), generation=rec["generation"], framework=rec["framework"],
                  gpus=int(rec["gpus"]), flash=rec.get("stack", "flash") == "flash")


POOLS = {"dense-megatron": "dense Megatron-style with flash attention",
         "dense-megatron-noflash": "dense Megatron-style without flash attention (the 2020-22 stacks)",
         "dense-fsdp": "dense FSDP-style", "moe": "MoE"}
"""The regime pools whose quantile pair is calibrated on their own left-out coverage (Mondrian conformal
prediction: Vovk, Gammerman and Shafer, Algorithmic Learning in a Random World, 2005, ch. 4), by what a plan
has: experts, the framework family its flags imply, flash attention."""


def pool_of(regime: Regime) -> str:
    """The regime pool (POOLS) of a plan or a record."""
    if regime.moe:
        return "moe"
    if regime.framework == "fsdp":
        return "dense-fsdp"
    return "dense-megatron" if regime.flash else "dense-megatron-noflash"


def cell_of(regime: Regime) -> str:
    """The regime cell of a plan or a record: its pool (POOLS) on its GPU generation ("dense-megatron/hopper").
    A cell's own choice comes before its pool's (nominal_of): the generation is one of the regime tags the
    band's runs already share, so a cell's runs are scored on bands drawn from runs like themselves."""
    return f"{pool_of(regime)}/{regime.generation}"


def describe_key(key: str) -> str:
    """A pool or cell key in words ("dense Megatron-style with flash attention on hopper")."""
    pool, _, gen = key.partition("/")
    return POOLS[pool] + (f" on {gen}" if gen else "")
