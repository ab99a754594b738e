"""What every record of a plan shares, whatever its kind: the degrees that decide placement (Degrees), what
the cost functions read of a plan (PlanLike), and the quantities derived from its degrees, written once for a
ParallelPlan and for the search's plan arrays (PlanQuantities). specs/plan.py re-exports them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

import numpy as np

from llmplan.arith import maximum, minimum, where

if TYPE_CHECKING:
    from llmplan.specs.plan import ParallelPlan

RECIPE_GEMM_FORMAT = {"tensorwise": "fp8", "rowwise": "fp8", "blockwise": "fp8", "mxfp8": "mxfp8", "nvfp4": "fp4"}
"""The tensor-core format (GpuSpec.tflops key) a recipe's GEMMs run in."""
NVFP4_LAYER_FRACTION = 0.85
"""Share of the transformer layers whose GEMMs run in NVFP4 when the plan pins no bf16 layers (the recipe's
default): the last round(15% x L) stay in bf16. Source: NVIDIA, "Pretraining Large Language Models with NVFP4"
(arXiv 2509.25149, ~16% of the linear layers, the final blocks, kept in BF16) and torchtitan 0.3's
`*_first_85_pct_layers_nvfp4` configs."""


def bf16_layer_counts(plan: Any, num_layers: int) -> tuple[Any, Any]:
    """(layers at the start, layers at the end) of the stack whose GEMMs stay in bf16 under the plan's fp8 /
    fp4 recipe: the plan's bf16_layers_start / bf16_layers_end where pinned, else the recipe's default (NVFP4
    the last round(15% x L), at most one pipeline stage's L // pp, the bound Megatron-Core puts on each count;
    the fp8 recipes none: Megatron-Core's first_last_layers_bf16 is off by default). Python ints for one plan,
    arrays over the search's plans where the default follows their pp.
    (0, 0) without a low-precision recipe. Source: Megatron-LM transformer_config.py (first_last_layers_bf16,
    num_layers_at_start_in_bf16, num_layers_at_end_in_bf16); arXiv 2509.25149 for the NVFP4 default."""
    if plan.dtype not in ("fp8", "fp4"):
        return 0, 0
    start, end = plan.bf16_layers_start, plan.bf16_layers_end
    pinned = start is not None or end is not None  # one pinned: the other is 0, as the launchers read it
    default_end = (0 if pinned or plan.recipe != "nvfp4" else
                   minimum(int(round(num_layers * (1 - NVFP4_LAYER_FRACTION))), num_layers // plan.pp))
    return (0 if start is None else int(start)), (default_end if end is None else int(end))


ETP_SAME_AS_TP = 0
"""The expert tensor-parallel degree that stands for 'as wide as tp' (Megatron's default): in
ParallelPlan.etp and in the search's etp axis alike (an integer, so plan arrays hold it too)."""


def resolve_etp(etp: Any, tp: Any) -> Any:
    """The expert tensor-parallel degree a plan runs: `etp`, or `tp` where etp is ETP_SAME_AS_TP (Python
    numbers or numpy arrays of plans)."""
    return where(etp == ETP_SAME_AS_TP, tp, etp)


@dataclass(frozen=True)
class Degrees:
    """The parallel degrees that decide where a plan's groups sit (all placement needs); training and serving
    plans both give theirs."""

    tp: int
    pp: int
    dp: int
    cp: int = 1
    ep: int = 1
    etp: int = 1
    """Expert tensor-parallel degree (resolved: never 'same as tp')."""
    replicate: int = 1
    """Hybrid-sharding replicas (ParallelPlan.dp_replicate): dp splits into this many contiguous shard groups."""
    cp_a2a: int = 1
    """Ranks of the inner (a2a) level of hierarchical context parallelism (cp_a2a_group): each cp group splits
    into groups of this many consecutive ranks, the ring running across them (1: one level)."""

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.cp * self.dp


def cp_a2a_group(p: Any) -> Any:
    """Ranks of the a2a level of a plan's context parallelism: cp_a2a_size under cp_comm_type a2a+p2p with
    Transformer Engine (cp_impl te) where it divides cp, else 1 (check_plan's cp_hierarchical_sizes refuses the
    rest). Elementwise over plan arrays (cp an array, the switches one value for all plans). Source:
    NVIDIA/Megatron-LM@d98e8a6 megatron/core/parallel_state.py (create_hierarchical_groups: level 0 is
    consecutive ranks of the cp group). Derived: docs/formulas.md#comm.cp_hierarchical"""
    if p.cp_impl != "te" or p.cp_comm_type != "a2a+p2p":  # workload switches: one value for all plans
        return 1
    k = p.cp_a2a_size
    return where(p.cp % k == 0, k, 1)


def cp_ring_size(p: Any) -> Any:
    """Ranks of the p2p K/V ring of a plan's context parallelism: cp / cp_a2a_group (cp but under a2a+p2p).
    Derived: docs/formulas.md#comm.cp_hierarchical"""
    return p.cp // cp_a2a_group(p)


def param_gather_optstep_axes(p: Any) -> Any:
    """Elementwise: the plan has what Megatron-Core runs overlap_param_gather_with_optimizer_step with (the
    distributed optimizer, the parameter-gather overlap, an interleaved pipeline: core_v0.14.0
    megatron/training/arguments.py validate_args). The gradient-reduce overlap is not among them: validate_args
    asks it only through --overlap-param-gather, and Megatron-Core's own get_megatron_optimizer and
    ChainedOptimizer do not read it, so Megatron-Bridge, which never calls validate_args, runs the flag without
    it (perf_recipes/deepseek/h100/deepseek_v3.py at 79308d0d9: overlap_grad_reduce False, then
    _enable_overlap_param_gather_with_optimizer_step). The flag acts only there: its check_plan rule and its
    pricing read this one predicate. Derived: docs/formulas.md#step.dp_optstep_gather"""
    return p.overlap_param_gather & (p.zero == 1) & (p.pp > 1) & (p.vpp > 1)


def param_gather_optstep(p: Any) -> Any:
    """Elementwise: overlap_param_gather_with_optimizer_step set and acting (param_gather_optstep_axes). The
    switch is one value for all plans (a workload field of the search's plan arrays): off, plain False, so the
    callers skip the pricing it gates instead of selecting from an all-False array."""
    if not p.overlap_param_gather_with_optimizer_step:
        return False
    return p.overlap_param_gather_with_optimizer_step & param_gather_optstep_axes(p)


def dp_first_chunk_unbucketed(p: Any) -> Any:
    """Elementwise: Megatron-Core's DDP builds the first model chunk of a plan's ranks as one bucket per
    buffer, as it does every later chunk: without the gradient-reduce overlap (bucket_size None, "Set
    bucket_size to infinity if overlap_grad_reduce is False") or under overlap_param_gather_with_optimizer_step
    (disable_bucketing for every chunk). Both the reduction and the weight gather run per bucket, so neither is
    then cut into buckets. Source: NVIDIA/Megatron-LM 14346b65a (Megatron-Bridge 79308d0d9's pin)
    megatron/core/distributed/distributed_data_parallel.py (DistributedDataParallel.__init__ lines 70-72),
    megatron/training/models/dist_utils.py (disable_bucketing); core_v0.14.0 training/training.py get_model.
    Derived: docs/formulas.md#comm.dp_bucket"""
    return np.logical_not(np.asarray(p.overlap_grad_reduce, dtype=bool)) | np.asarray(param_gather_optstep(p),
                                                                                      dtype=bool)


def megatron_fsdp_acts(plan: Any) -> Any:
    """Whether Megatron-FSDP runs the plan: the switch at ZeRO 2/3 without a pipeline. Elsewhere it is inert
    (check_switches' megatron_fsdp_zero), and a search's plan arrays keep the workload's switch on rows the shown
    plan settles it off on, so a cost reads this, never the raw field. Derived: docs/formulas.md#mem.megatron_fsdp"""
    return plan.megatron_fsdp & (plan.zero >= 2) & (plan.pp == 1)


class PlanLike(Protocol):
    """What the layer-split, parameter and serving cost functions and the shape rules read of a plan, in
    whichever record it comes: a ParallelPlan or a ServePlan (Python numbers) or search.grid.PlanArrays (numpy
    arrays of many plans)."""

    @property
    def tp(self) -> Any: ...

    @property
    def pp(self) -> Any: ...

    @property
    def dp(self) -> Any: ...

    @property
    def ep(self) -> Any: ...

    @property
    def etp_resolved(self) -> Any: ...

    @property
    def vpp(self) -> Any: ...

    @property
    def pp_first(self) -> Any: ...

    @property
    def pp_last(self) -> Any: ...


def has_layout(plan: object) -> TypeGuard[ParallelPlan]:
    """Whether the plan lists its pipeline's virtual chunks (ParallelPlan.pp_layout); plan arrays and serving
    plans never do, so a plan that does is a ParallelPlan (the guard tells the type checker so)."""
    return getattr(plan, "pp_layout", None) is not None


if TYPE_CHECKING:
    class _QuantityInputs(PlanLike):
        """What PlanQuantities' properties read besides PlanLike's, declared for the type checker only:
        ParallelPlan's fields and properties, PlanArrays' arrays and its workload (PlanArrays.__getattr__)."""

        @property
        def cp(self) -> Any: ...

        @property
        def micro_batch(self) -> Any: ...

        @property
        def global_batch(self) -> Any: ...

        @property
        def recompute_code(self) -> Any: ...

        @property
        def recompute_modules(self) -> Any: ...

        @property
        def offload_modules(self) -> Any: ...

        @property
        def offload_moe_act(self) -> Any: ...

        @property
        def moe_capacity_factor(self) -> Any: ...

        @property
        def dtype(self) -> Any: ...

        @property
        def zero(self) -> Any: ...

        @property
        def dp_replicate(self) -> Any: ...

        @property
        def dp_outer_optimizer(self) -> Any: ...

        @property
        def recipe(self) -> Any: ...
else:
    _QuantityInputs = object  # not a base at run time: its empty properties would hide the plans' own values


class PlanQuantities(_QuantityInputs):
    """The quantities derived from a plan's degrees, written once for one ParallelPlan (Python numbers) and
    for search.grid.PlanArrays (numpy arrays of many plans): both provide tp, pp, dp, cp, micro_batch,
    global_batch and recompute_code."""

    @property
    def full(self) -> Any:
        """Full activation recompute."""
        return self.recompute_code == 2

    @property
    def selective(self) -> Any:
        """Selective (attention-core) recompute."""
        return self.recompute_code == 1

    @property
    def op(self) -> Any:
        """Op-level selective checkpointing (torchtitan's per-op policy: every other matmul recomputed)."""
        return self.recompute_code == 3

    def recomputes(self, module: str) -> Any:
        """Whether selective recompute covers Megatron module `module`: the listed recompute_modules, or
        core_attn alone when none are listed (Megatron-Core's default ["core_attn"])."""
        modules = self.recompute_modules or ("core_attn",)
        return self.selective & (module in modules)

    def offloads(self, module: str) -> bool:
        """Whether fine-grained activation offload moves Megatron module `module`'s input: the listed
        offload_modules, and moe_act with offload_moe_act (docs/formulas.md#mem.offload_modules)."""
        return module in self.offload_modules or (module == "moe_act" and bool(self.offload_moe_act))

    @property
    def fine_grained_offload_modules(self) -> tuple[str, ...]:
        """Megatron's offload_modules for the plan: offload_modules, with moe_act first where offload_moe_act
        sets it and the list does not name it (empty: no fine-grained offload)."""
        extra = ("moe_act",) if self.offload_moe_act and "moe_act" not in self.offload_modules else ()
        return (*extra, *self.offload_modules)

    @property
    def num_gpus(self) -> Any:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def sharded_per_microbatch(self) -> Any:
        """ZeRO-2/3 without a pipeline: gradients are reduce-scattered into their shards (and ZeRO-3 weights
        gathered) every micro-batch. Under a pipeline they stay whole until the last micro-batch and are reduced
        once per step (PyTorch pipelining with FSDP2; Megatron's distributed optimizer at any stage), as at ZeRO
        0/1. Derived: docs/formulas.md#comm.dp"""
        return (self.zero >= 2) & (self.pp == 1)

    @property
    def gathered_per_microbatch(self) -> Any:
        """ZeRO-3 without a pipeline: the weights are gathered again every micro-batch (sharded_per_microbatch)."""
        return (self.zero >= 3) & (self.pp == 1)

    @property
    def expert_padding(self) -> float:
        """Factor on the routed tokens each expert computes and receives: the capacity factor when tokens are
        padded to capacity, 1 when dropless."""
        return self.moe_capacity_factor or 1.0

    @property
    def low_precision(self) -> bool:
        """GEMMs in an 8- or 4-bit recipe (the workload's dtype is one value for every plan)."""
        return self.dtype in ("fp8", "fp4")

    @property
    def gemm_format(self) -> str:
        """The tensor-core format of the layers' GEMMs (a GpuSpec.tflops key)."""
        return RECIPE_GEMM_FORMAT[self.recipe] if self.low_precision else self.dtype

    def low_precision_layer_fraction(self, num_layers: int) -> Any:
        """Share of the model's `num_layers` transformer layers whose GEMMs run in the low format: all but
        the bf16 layers at the start and end of the stack (bf16_layer_counts); the average layer mixes both.
        Derived: docs/formulas.md#precision"""
        start, end = bf16_layer_counts(self, num_layers)
        return maximum(0.0, 1.0 - (start + end) / num_layers) if num_layers > 0 else 1.0

    @property
    def mfu_format(self) -> str:
        """The peak MFU is reported against: bf16 for the low-precision recipes (as most tables report),
        else the dtype's own."""
        return "bf16" if self.low_precision else self.dtype

    @property
    def zero_shard(self) -> Any:
        """Ranks that share one replica's gradient/parameter shards: dp x cp (Megatron), over dp_replicate under
        hybrid sharding (Megatron-LM parallel_state.py, intra_partial_data_parallel_size).
        Derived: docs/formulas.md#mem.hsdp"""
        memo = getattr(self, "memo", None)  # plan arrays keep it once (read for every stage and term)
        if memo is not None and "zero_shard" in memo:
            return memo["zero_shard"]
        n = self.dp * self.cp // self.dp_replicate
        if memo is not None:
            memo["zero_shard"] = n
        return n

    @property
    def optimizer_shard(self) -> Any:
        """Ranks that share one replica's optimizer shards: zero_shard, or all of dp x cp where the optimizer is
        sharded across the replicas too (dp_outer_optimizer). Derived: docs/formulas.md#mem.hsdp"""
        return where(self.dp_outer_optimizer, self.dp * self.cp, self.zero_shard)

    @property
    def expert_dp(self) -> Any:
        """Ranks that share one routed expert's optimizer/gradient shards and its checkpoint share: Megatron-Core's
        expert data-parallel group, world / (etp x ep x pp) (parallel_state.py, expt_dp_group)."""
        memo = getattr(self, "memo", None)  # plan arrays keep it once (read for every stage and term)
        if memo is not None and "expert_dp" in memo:
            return memo["expert_dp"]
        n = maximum(1, self.num_gpus // (self.etp_resolved * self.ep * self.pp))
        if memo is not None:
            memo["expert_dp"] = n
        return n

    @property
    def expert_shard(self) -> Any:
        """Ranks that share one routed expert's gradient/parameter shards: expert_dp, over dp_replicate under
        hybrid sharding (parallel_state.py, intra_partial_expert_data_parallel_size).
        Derived: docs/formulas.md#mem.hsdp"""
        return maximum(1, self.expert_dp // self.dp_replicate)

    @property
    def expert_optimizer_shard(self) -> Any:
        """Ranks that share one routed expert's optimizer shards (as optimizer_shard). Derived:
        docs/formulas.md#mem.hsdp"""
        return where(self.dp_outer_optimizer, self.expert_dp, self.expert_shard)

    @property
    def num_microbatches(self) -> Any:
        """Micro-batches per step per replica (gradient-accumulation steps); check_plan ensures it divides."""
        memo = getattr(self, "memo", None)  # plan arrays keep it once
        if memo is not None and "num_microbatches" in memo:
            return memo["num_microbatches"]
        n = maximum(1, self.global_batch // (self.micro_batch * self.dp))
        if memo is not None:
            memo["num_microbatches"] = n
        return n
