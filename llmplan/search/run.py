"""The training search: enumerate -> prune (named rules, counted) -> evaluate (vectorised) -> rank."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Collection, Iterator, Sequence

import numpy as np

from llmplan.cost.goodput import plan_goodput
from llmplan.cost.operators import operator_uses, with_fallbacks
from llmplan.cost.exposure import gathers_on_warmup_chain
from llmplan.cost.params import LAYOUT_AXES
from llmplan.cost.step import step_time, throughput
from llmplan.errors import LlmplanError
from llmplan.estimate import TrainingEstimate, estimate_training
from llmplan.search.evaluate import Evaluation, evaluate, put_tree, screened_memory, take_tree
from llmplan.search.filtered import LayoutPlans, Sides, Walk
from llmplan.search.grid import PlanArrays, Space, Workload, enumerate_plans
from llmplan.search.ties import TIE_POOL
from llmplan.search.variants import (Variants, best_layouts, layout_codes, representative,
                                     variants_of)
from llmplan.specs.check import MTP_RULE, RULES, check_plan, te_comm_types
from llmplan.specs.check_switches import (SWITCH_RULES, SWITCH_USES, SwitchUse, asks_for, fp8_params_allowed,
                                          named_switch_violations, settle)
from llmplan.specs.defaults import min_headroom_bytes
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec, MemoryAllowance, ParallelPlan, trained_model
from llmplan.specs.resilience import CheckpointPolicy
from llmplan.specs.rule import Rule
from llmplan.specs.schedule import schedule_of
from llmplan.topology.placement import DEFAULT_ORDER, on_cluster, place
from llmplan.units import GIB

if TYPE_CHECKING:
    from llmplan.search.hybrid import HybridChoice
    from llmplan.search.layouts import LayoutPins

OBJECTIVES = ("throughput", "time-to-train", "gpu-hours", "headroom")
LAYOUT_RULES = frozenset({"pp_layers", "vpp_layers"})
"""check_plan rules that read only the model and the pipeline layout (pp, vpp, the first and last stage's
layers; params.LAYOUT_AXES): the search evaluates them once per distinct layout, not per plan
(tests/test_search_fast_paths.py checks that this agrees with the rule on every plan)."""
TOP_SORTED = 500
"""Plans the ranking sorts in full (the rest cannot reach the table)."""
MAX_PLANS = 8_000_000
"""Most plans one search holds in memory at once."""
PLAN_BYTES = 500
"""Peak bytes per plan while it is evaluated (measured: 272,160 plans of deepseek-v3 peak at 0.2 GiB with the
interpreter)."""


@dataclass(frozen=True)
class Pruned:
    rule: str
    count: int
    example: str


@dataclass
class SearchResult:
    considered: int
    feasible: int
    pruned: list[Pruned]
    ranked: list[TrainingEstimate]
    pareto: list[TrainingEstimate]
    closest: TrainingEstimate | None = None
    """When nothing fits: the plan that needs the least memory."""
    suggestions: list[str] = field(default_factory=list)
    seconds: float = 0.0
    objective: str = "throughput"
    equivalents: list[int] = field(default_factory=list)
    """Per ranked plan: how many other plans predicted identical (same throughput and memory) it stands for."""
    conventional: TrainingEstimate | None = None
    """The conventional plan (TP inside the node, PP across nodes, DP the rest) for comparison."""
    without_cp: TrainingEstimate | None = None
    """The best plan that fits without context parallelism (cp 1), when the search tried both: what CP buys
    where #1 runs it (report.search shows it only then)."""
    with_ep: TrainingEstimate | None = None
    """The best plan that fits with expert parallelism (ep > 1), when the model is MoE and the search tried
    both: what #1 gives up where it runs ep 1 (report.search shows it only then)."""
    wide_ep: TrainingEstimate | None = None
    """The best plan that fits with a smaller TP and a wider EP than #1, where #1 runs TP beside an EP group
    that stays inside one NVLink domain (wide_ep_index): the published MoE runs' kind, and what it costs here."""
    usual: TrainingEstimate | None = None
    """The best plan that fits of the kind the published recipes run, where #1 differs from it on a structural
    axis (usual_index): ZeRO <= 1 where #1 shards its weights or gradients every micro-batch over more than one
    NVLink domain without a pipeline; a wider EP inside one domain where #1's EP group leaves most of its domain
    to data parallelism. What the unusual #1 wins by, and why (report.search.usual_line)."""
    cloud: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    """(tokens/s, headroom bytes) of up to CLOUD_POINTS plans that fit, spread evenly over the enumeration
    (for the report's scatter)."""
    domain: "DomainChoice | None" = None
    """Set when the search also tried a power-of-two share of each NVLink domain (DomainChoice)."""
    switches: "SwitchChoice | None" = None
    """Set when the search tried more than one setting of the memory switches (SwitchChoice)."""
    tied_with: list[list[int]] = field(default_factory=list)
    """Per ranked plan: the ranks (1-based) whose predicted throughput is inside the model's resolution of it
    (llmplan.search.ties)."""
    tie_notes: list[Any] = field(default_factory=list)
    """For each adjacent tied pair: which robustness rule put the upper one first (ties.TieNote)."""
    resolution: float | None = None
    """The tie resolution used (|log| of a tokens/s ratio); None when ties were not resolved (headroom)."""
    variants: list[Variants] = field(default_factory=list)
    """Per ranked plan: the other plans of its layout (search.variants; each row is its layout's best)."""
    target: str | None = None
    """`search --target`: the launcher the ranked plans were kept for (cli.target); None without it."""
    exports: dict[str, str | None] | None = None
    """Without a target: each training target's answer for #1 (export.exports: None where `export --to` writes it,
    else its refusal), so that an untargeted #1 no target writes is said, not shown silently; None with a target
    (every row exports to it) or where not asked."""
    not_exportable: int = 0
    """With a target: the better-ranked plans dropped because `export --to target` refuses them."""
    refusals: dict[str, int] = field(default_factory=dict)
    """With a target: each refusal message the walk met, and how many plans it refused (above the last row kept
    or not: not_exportable counts the former)."""
    layout_plans: "LayoutPlans | None" = None
    """search(keep_plans=True): every plan that fits, for a caller that looks past a layout's shown plan
    (search.filtered: `search --target`); None otherwise, and once the caller has used it."""
    walk: "Walk | None" = None
    """With a target: what the walk over the plans did (search.filtered.Walk)."""
    walks: "tuple[tuple[Workload, ClusterSpec, Walk], ...]" = ()
    """With a target: every walk the command ran, one per search (switch setting, NVLink-domain share), each with
    the workload and cluster that search held (report.search.walk_held says which of their fields the output
    names); `walk` is the shown result's."""
    walk_index: int | None = None
    """With a target: where this search's own walk (`walk`) stands in the command's list of walks (`walks`, and
    the list cli.search.SettingSearch builds), so that the report marks the shown one by position; None where
    the search kept no walk."""
    sides: "Sides | None" = None
    """With a target: how the Pareto front, the comparisons and the rows' counts were kept to the plans the
    target accepts (search.filtered.Sides)."""
    top_score: float = 0.0
    """The best objective score of any plan that fits, before the tie rules (0 where none fits)."""
    outrun: bool = False
    """search(beat=...): no plan scored above `beat`, and the search stopped before ranking (ranked empty)."""
    tp_overlap_loses: bool = False
    """A plan of the tie pool (the rows ranked before --top cuts them) prices its userbuffer TP overlap slower than
    without it (TrainingEstimate.tp_overlap_gain < 0; cli.search.tp_overlap_loses reads it whatever --top is)."""
    hybrid: "HybridChoice | None" = None
    """Set when the command priced hybrid-sharding variants of the shown setting's rows (search.hybrid; cli.search
    SettingSearch.hybrid_rows): what it tried and whether #1 runs it."""
    pending: "SidePlans | None" = None
    """search(sides=False): the side outputs (pareto, conventional, without_cp, with_ep, wide_ep) not yet priced;
    complete_sides prices them. None once priced, or where the search priced them itself."""


CLOUD_POINTS = 2000


@dataclass(frozen=True)
class SidePlans:
    """The side outputs of one search left unpriced (search(sides=False)): which plans they are, so that a
    command that runs many searches and shows one (cli.search.train_search) prices them for that one only. Holds
    the chosen plans, not the search's plan arrays. complete_sides gives what search(sides=True) gives."""

    price: Callable[[int], TrainingEstimate]
    """The scalar estimate of a plan by its index in the search's plans that fit (kept rows only)."""
    front: tuple[int, ...]
    """The vectorised Pareto front (pareto_front)."""
    without_cp: int | None
    with_ep: int | None
    wide_ep: int | None
    conventional: Callable[[], TrainingEstimate | None]
    usual: int | None = None
    merge: Callable[[list[TrainingEstimate]], list[TrainingEstimate]] | None = None
    """The layout pass's merge of its plans that fit into the front, where it ran (layouts.layout_pass)."""


def pricer(rows: dict[int, Any], estimates: dict[int, TrainingEstimate], m: ModelSpec, cluster: ClusterSpec,
           allowance: MemoryAllowance | None, order: tuple[str, ...],
           checkpoint: CheckpointPolicy | None) -> Callable[[int], TrainingEstimate]:
    """search's scalar estimate of a plan by index, over the `rows` (index: ParallelPlan) kept for it and the
    `estimates` already priced (shared with the ranked rows)."""
    def price(i: int) -> TrainingEstimate:
        if i not in estimates:
            estimates[i] = estimate_training(m, cluster, rows[i], allowance, order, checkpoint)
        return estimates[i]
    return price


def complete_sides(res: SearchResult) -> SearchResult:
    """`res` with its pending side outputs priced (SearchResult.pending), as search(sides=True) prices them."""
    s = res.pending
    if s is None:
        return res
    t0 = time.perf_counter()
    pareto = [s.price(i) for i in s.front]
    at = lambda i: None if i is None else s.price(i)  # noqa: E731
    return dataclasses.replace(res, pareto=s.merge(pareto) if s.merge is not None else pareto,
                               conventional=s.conventional(), without_cp=at(s.without_cp),
                               with_ep=at(s.with_ep), wide_ep=at(s.wide_ep), usual=at(s.usual), pending=None,
                               seconds=res.seconds + time.perf_counter() - t0)


@dataclass(frozen=True)
class SwitchChoice:
    """The search run once per setting of the memory switches that modern recipes set and the user did not
    pin: bf16 gradient buffers (Megatron --grad-reduce-in-bf16, Megatron-Bridge's perf recipes) and primary
    weights kept in the recipe's low-precision format; the setting whose #1 leads under first_setting is shown."""

    chosen: dict[str, Any]
    """grad_dtype and fp8_params of the shown plans."""
    tried: tuple[tuple[dict[str, Any], float], ...]
    """Each setting tried with its best plan's score (tokens/s, or headroom bytes; 0 where nothing fits)."""


def cp_comm_variants(m: ModelSpec, w: Workload, pinned: bool, cp_free: bool) -> list[str]:
    """The cp_comm_type values a search tries: the workload's where the user pinned it, cp_impl is not te or the
    plans have no cp > 1; else p2p where Transformer Engine's ring runs the model's attention, and otherwise
    every comm type that runs it (check.te_comm_types: a2a for sinks and windows, all_gather for windows and
    DSA), each its own search, so a model with ordinary masks searches as before (search_speed) and a windowed
    or sink model is not held to cp 1. The cp 1 plans, alike under every value, are settled to p2p
    (check_switches cp_comm_type_te)."""
    if pinned or w.cp_impl != "te" or not cp_free:
        return [w.cp_comm_type]
    runs = te_comm_types(m)
    return ["p2p"] if "p2p" in runs or not runs else list(runs)


def switch_variants(w: Workload, grad_pinned: bool, params_pinned: bool,
                    try_scalings: bool = False, cp_comm_types: tuple[dict[str, Any], ...] = (),
                    overlap_pinned: bool = False, try_te_softmax: bool = False) -> list[dict[str, Any]]:
    """The settings of grad_dtype and fp8_params a search tries: the pinned value, or both where the
    workload's precision allows it (bf16 gradient buffers with any compute dtype below fp32; low-precision
    primary weights where check_plan's workload rules on fp8_params allow it, check_switches.fp8_params_allowed:
    an fp8 / fp4 recipe other than torchao's rowwise, not under Muon). The plain setting first (it wins ties). With
    `try_scalings` (a launcher target named, --fp8-scaling not given) an fp8 tensorwise workload also tries
    current scaling after delayed: a target that runs only one of them (torchtitan's dynamic scaling) keeps its
    plans, and delayed, cheaper by its amax passes, wins wherever both export. With `try_te_softmax` (a target
    that runs Transformer Engine's unfused attention named, --softmax-kernel not given: export.TE_SOFTMAX_TARGETS)
    a workload without fused attention also tries softmax_kernel te after its own: the Megatron-LM export refuses
    every other unfused softmax (export.EVERY_PLAN), so that search keeps the plans that launcher runs. With more
    than one
    `cp_comm_types` (variants.cp_comm_settings: cp_comm_type, and cp_a2a_size under a2a+p2p) each setting is
    tried under each. A switch that acts under one gradient dtype only keeps the search to it, so that its other
    try, where no plan can use the switch, does not refuse the search (refuse_unused_switches): grad_reduce_dtype
    bf16 to fp32 gradients (check_switches grad_reduce_dtype_bf16_optimizer), fp32_embedding_grads and
    grad_reduce_fp32_sum to bf16 ones (fp32_embedding_grads_zero, grad_reduce_fp32_sum_rs). The fp32 try of a
    workload that asks for DeepSpeed's BF16_Optimizer (bf16, Adam, grad_accumulation cast-add, grad_reduce
    all-reduce) runs with overlap_grad_reduce off unless `overlap_pinned`: its zero-1 plans all-reduce after the
    backward (check_switches bf16_optimizer_overlap)."""
    grads = [w.grad_dtype] if grad_pinned or w.dtype == "fp32" else ["fp32", "bf16"]
    two_byte = bool(w.fp32_embedding_grads) or bool(w.grad_reduce_fp32_sum)
    if len(grads) > 1 and (w.grad_reduce_dtype == "bf16") != two_byte:
        grads = ["fp32"] if w.grad_reduce_dtype == "bf16" else ["bf16"]
    # param_remainders completes bf16 weights: no low-precision primary weights beside it (check_plan)
    allowed = fp8_params_allowed(w.base) and not w.param_remainders
    params = [w.fp8_params] if params_pinned or not allowed else [False, True]
    base = [{"grad_dtype": g, "fp8_params": p} for g in grads for p in params]
    if not overlap_pinned and w.overlap_grad_reduce and w.dtype == "bf16" and w.optimizer == "adam" \
            and w.grad_accumulation == "cast-add" and w.grad_reduce == "all-reduce":
        base = [{**v, "overlap_grad_reduce": False} if v["grad_dtype"] == "fp32" else v for v in base]
    if try_scalings and w.dtype == "fp8" and w.recipe == "tensorwise":
        base = [{**v, "fp8_scaling": sc} for sc in ("delayed", "current") for v in base]
    if try_te_softmax and not w.flash_attention and w.softmax_kernel != "te":
        base = [{**v, "softmax_kernel": k} for k in (w.softmax_kernel, "te") for v in base]
    if len(cp_comm_types) < 2:  # the workload's own, or the one comm type that runs the model (cli.search)
        return base
    return [{**v, **ct} for ct in cp_comm_types for v in base]


DISPATCH_RDMA_FABRICS = ("infiniband", "roce")
"""Scale-out fabrics DeepEP's and HybridEP's internode kernels run on: RDMA through NVSHMEM / IB verbs
(deepseek-ai/DeepEP README at 0297fc8, Requirements: "RDMA network for internode communication"); EFA and
Omni-Path are not among them."""


def dispatcher_variants(m: ModelSpec, cluster: ClusterSpec, w: Workload, pinned: bool,
                        ep_free: bool) -> list[dict[str, Any]]:
    """The MoE dispatchers a search tries beside the workload's (the alltoall default) on an MoE model whose
    plans can run ep > 1, where the user pinned neither --moe-dispatcher nor --moe-flex-backend: Megatron's
    flex dispatcher with the deepep backend and with the hybridep backend, each where its kernels run on the
    system (dispatch_runs). Tried after the memory switches, at the setting that won (cli.search.train_search),
    each its own search over the same plans (the memory, the dispatcher's no part of it, is screened once:
    search's `screens`). The published wide-EP MoE runs (DeepSeek-V3 §3.2, Megatron-Bridge's DeepSeek-V3 /
    Qwen3 / Nemotron-3 recipes) dispatch with one of them (docs/validation.md#search-deepep)."""
    if pinned or not ep_free or not m.is_moe or w.moe_dispatcher != "alltoall":
        return []
    out = []
    for backend in ("deepep", "hybridep"):
        if backend == "deepep" and (w.moe_capacity_factor is not None or w.cuda_graphs == "full-iteration"):
            continue  # check_switches deepep_capacity, cuda_graphs_flex_backend (a full-iteration graph: hybridep)
        if dispatch_runs(cluster):
            out.append({"moe_dispatcher": "deepep", "moe_flex_backend": backend})
    return out


def dispatch_runs(cluster: ClusterSpec) -> bool:
    """Whether DeepEP's and HybridEP's kernels run on the system: an NVIDIA GPU of compute capability 9.0 or
    above (Hopper, Blackwell: SM90 PTX) on an NVSwitch scale-up fabric, and an RDMA scale-out fabric where the
    cluster has more than one NVLink domain. Source: deepseek-ai/DeepEP README at 0297fc8 (Requirements: "Hopper
    (SM90) GPUs, or other architectures with SM90 PTX ISA support", NVLink with full peer access intranode, RDMA
    internode); held for HybridEP too, which ships in DeepEP (csrc/hybrid_ep at 17cfb81, comm.hybridep_prob_share)
    and which Megatron-Bridge runs on H100 (check_switches deepep_capacity)."""
    s = cluster.system
    cc = s.gpu.compute_capability
    if cc is None or cc < 9.0 or s.intra_node_fabric != "nvswitch":
        return False
    one_domain = cluster.num_gpus <= s.domain_gpus
    return one_domain or s.scaleout_fabric in DISPATCH_RDMA_FABRICS


def ep_overlap_variants(m: ModelSpec, w: Workload, pinned: bool, ep_free: bool,
                        axes: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The EP all-to-all overlap a search tries beside the workload's (off by default): Megatron-Core's
    combined-1F1B schedule (--overlap-moe-expert-parallel-comm, ParallelPlan.ep_comm_overlap, priced by
    cost.moe.ep_exposed) on an MoE model whose plans can run ep > 1, where the user named neither
    --ep-comm-overlap nor --no-ep-comm-overlap. Tried after the memory switches and the dispatchers, at the
    setting that won (cli.search.train_search), its own search: the rules that depend on the axes (virtual
    stages with pp > 1, no full recompute) prune its plans there; where a rule refuses it whatever the axes (an
    fp32 model, more than one MTP module, moe in the recompute modules) or the pipeline schedule already hides
    the all-to-alls (DualPipe), nothing is tried; likewise where the pinned `axes` (pp, vpp, recompute: the
    search's pins, None where free) leave no plan it runs on. Megatron-Bridge's DeepSeek-V3 and Qwen3 MoE
    presets set it (moe_a2a_overlap; docs/validation.md#search-ep-overlap)."""
    if pinned or not ep_free or not m.is_moe or w.ep_comm_overlap or schedule_of(w.base).hides_ep:
        return []
    e = next((d for d in range(2, m.num_experts + 1) if m.num_experts % d == 0), 0)
    pin = {k: v for k, v in (axes or {}).items() if k in ("pp", "vpp", "recompute") and v is not None}
    pp = pin.get("pp", 1)
    try:  # a plan the axis-bound rules allow (ep > 1, pp 1 or virtual stages, no recompute) unless pinned otherwise:
        # what the overlap alone breaks there
        off = w.plan(ep=e, dp=e, pp=pp, vpp=pin.get("vpp", 1 if pp == 1 else 2),
                     recompute=pin.get("recompute", "none"))
        on = off.model_copy(update={"ep_comm_overlap": True})
    except ValueError:  # no such plan to read the rules on: the plans' own checks decide
        return [{"ep_comm_overlap": True}]
    before = {v.rule for v in check_plan(m, off)}
    if any(v.rule not in before for v in check_plan(m, on)):
        return []
    return [{"ep_comm_overlap": True}]


def best_score(res: SearchResult) -> tuple[float, float]:
    """(objective score, headroom) of a result's #1 plan, (0, 0) if none fits: what each setting tried reports
    (SwitchChoice.tried); first_setting chooses between searches."""
    if not res.ranked:
        return 0.0, 0.0
    e = res.ranked[0]
    headroom = float(e.memory.headroom)
    return (headroom if res.objective == "headroom" else float(e.throughput.tokens_per_s)), headroom


def first_setting(results: Sequence[SearchResult]) -> int:
    """Index of the search (one per setting tried: memory switches, MoE dispatcher, EP overlap, CP comm type,
    NVLink-domain share) whose #1 the search's own rule puts first when every setting's plans are ordered once:
    the first row of search.ties.resolve over all of them. Open are the #1 plans within the resolution of the
    fastest plan of any setting (its `top_score`: a setting's tie pool is within the resolution of its own
    fastest); the most robust of those (search.ties.robust_first) wins, the faster first among equals, the first
    setting among exact equals. Only a setting's #1 can lead what the command shows: its other plans lost to
    it by the same rule. Without a resolution (the headroom objective) the best score wins, as before
    (docs/validation.md#headroom-tiers)."""
    from llmplan.search.layouts import score as plan_score
    from llmplan.search.ties import robust_first

    scored = [k for k, r in enumerate(results) if r.ranked]
    if not scored:
        return 0
    resolution = results[scored[0]].resolution
    if resolution is None:
        return max(scored, key=lambda k: (best_score(results[k]), -k))
    lead = {k: plan_score(results[k].ranked[0], results[k].objective) for k in scored}
    # the fastest plan of any setting: its top_score (with a target, the plans it kept: their layouts' best)
    top = max([r.top_score for r in results if r.target is None]
              + [max(v.best, plan_score(e, r.objective)) for r in results for e, v in zip(r.ranked, r.variants)]
              + list(lead.values()))
    open_ = sorted((k for k in scored if lead[k] > 0 and math.log(top / lead[k]) <= resolution + 1e-12),
                   key=lambda k: (-lead[k], k))
    if not open_:  # the fastest setting's #1 is always open; kept as a guard
        return max(scored, key=lambda k: (lead[k], -k))
    return open_[robust_first([results[k].ranked[0] for k in open_], list(range(len(open_))))]


def win_floor(*results: SearchResult) -> float:
    """The score a later setting's fastest plan must pass to have a #1 that can win against `results` (the
    settings searched so far) under first_setting: their fastest, less the resolution (a setting none of whose
    plans is within the resolution of the fastest so far cannot lead); the best #1's score without one."""
    return max((best_score(r)[0] if r.resolution is None or r.objective == "headroom"
                else r.top_score * math.exp(-r.resolution)) for r in results)


@dataclass(frozen=True)
class DomainChoice:
    """The search run twice on a cluster whose NVLink domain is not a power of two (72-GPU NVL72 racks): with
    every GPU of each domain, and with the largest power of two of whole nodes in it (64), so that
    power-of-two TP / EP / CP groups tile the domain; the better one is shown."""

    full: int
    """GPUs in one NVLink domain."""
    used: int
    """GPUs per domain the shown plans use (full or the power of two)."""
    gpus: dict[int, int]
    """Cluster GPUs with each per-domain count."""
    tokens_per_s: dict[int, float]
    """Best plan's tokens/s with each per-domain count (0 when nothing fits)."""


def power_of_two_domain(system: Any) -> int | None:
    """The largest power of two of whole nodes' GPUs inside a multi-node NVLink domain that is not itself a
    power of two (64 of a 72-GPU NVL72 rack of 4-GPU trays), else None. Derived: docs/formulas.md#topo.placement"""
    full, gpn = system.domain_gpus, system.gpus_per_node
    if full <= gpn or full & (full - 1) == 0:
        return None
    p = 1 << (full.bit_length() - 1)
    return p if p % gpn == 0 and p > gpn else None


def straddling_space(space: Space, full: int) -> Space | None:
    """The part of `space` a power-of-two share of a `full`-GPU domain can improve: expert-parallel degrees
    that do not divide the domain (EP 16, 32, 64 of a 72-GPU rack). A plan whose EP divides the domain (and
    whose TP, at most 8 in practice, does) tiles the full domain as well and has more GPUs there, so the
    share is not tried for it; None when no such degree is left (dense models)."""
    ep = tuple(e for e in space.ep if e > 1 and full % e)
    return dataclasses.replace(space, ep=ep) if ep else None


def nodes_using(cluster: ClusterSpec, used: int) -> int:
    """Nodes of `cluster` left when each NVLink domain contributes `used` GPUs (whole domains first, then what
    the last, partial domain can give)."""
    gpn = cluster.system.gpus_per_node
    per_full, per_used = cluster.system.domain_gpus // gpn, used // gpn
    domains, rest = divmod(cluster.num_nodes, per_full)
    return domains * per_used + min(rest, per_used)


def objective_score(ev: Evaluation | TrainingEstimate, objective: str, goodput: Any = None) -> np.ndarray:
    """Higher is better (many plans' Evaluation, or one priced plan's TrainingEstimate: both give memory and
    throughput). Time-to-train and GPU-hours rank by the tokens/s that survive failures (throughput x
    goodput, cost.goodput) on a fixed cluster; throughput by tokens/s alone."""
    if objective == "headroom":
        return np.asarray(ev.memory.headroom, dtype=float)
    tokens = np.asarray(ev.throughput.tokens_per_s, dtype=float)
    if objective in ("time-to-train", "gpu-hours") and goodput is not None:
        return tokens * np.asarray(goodput, dtype=float)
    return tokens


def _order(score: np.ndarray, headroom: np.ndarray, plans: PlanArrays) -> np.ndarray:
    """Deterministic ranking: by score (to 4 significant digits: closer predictions are not meaningful), then
    more memory headroom (to 0.1 GiB), then the stated
    preference among equals: smaller cp, fewer shards (lower ZeRO stage), fewer pipeline stages and virtual
    stages, smaller micro-batch, smaller TP (every candidate stays inside the NVLink domain), less recompute,
    smaller ep."""
    rel = np.round(score / max(float(np.max(np.abs(score))), 1e-300), 4)
    # Only the best few hundred predictions are shown or counted as equivalents: sort those (all plans that tie
    # with the last of them included), not the whole space.
    cut = np.flatnonzero(rel >= np.partition(rel, len(rel) - TOP_SORTED)[len(rel) - TOP_SORTED]) \
        if len(rel) > TOP_SORTED else np.arange(len(rel))
    keys = (-score[cut], plans.ep[cut], plans.recompute_code[cut], plans.tp[cut], plans.micro_batch[cut],
            plans.vpp[cut], plans.pp[cut], plans.zero[cut], plans.cp[cut], -np.round(headroom[cut] / GIB, 1),
            -rel[cut])
    return cut[np.lexsort(keys)]


PARETO_WITHIN = 0.5
"""The Pareto front's floor: plans with at least this share of the best throughput (pareto_front)."""


def pareto_front(throughput: np.ndarray, headroom: np.ndarray, limit: int = 12,
                 within: float = PARETO_WITHIN) -> np.ndarray:
    """Indices of plans no other plan beats on both throughput and memory headroom (best throughput first),
    among plans with at least `within` x the best throughput."""
    near = np.flatnonzero(throughput >= within * throughput.max())  # down to the floor (a stable sort of these
    order = near[np.lexsort((-headroom[near], -throughput[near]))]  # alone orders them as a sort of all would)
    h = headroom[order]
    before = np.concatenate(([-np.inf], np.maximum.accumulate(h)[:-1]))  # the most headroom of every faster plan
    out = [int(i) for i in order[h > before]]
    if len(out) > limit:  # keep the ends and an even spread between them
        pick = np.unique(np.linspace(0, len(out) - 1, limit).round().astype(int))
        out = [out[j] for j in pick]
    return np.asarray(out, dtype=int)


class NoPlanLeft(LlmplanError):
    """The rules leave no plan of a search (_pruned: none passes them, or none can use a switch the user named):
    a search on another share of each NVLink domain may still have some (cli.search.share_only)."""

    def __init__(self, message: str, unused: UnusedSwitch | None = None) -> None:
        super().__init__(message)
        self.unused = unused
        """For a switch no plan left can use (refuse_unused_switches): its flags, the count and the reason, so
        that a refusal on two NVLink-domain shares can quote both counts (UnusedSwitch.on_shares)."""


@dataclass(frozen=True)
class UnusedSwitch:
    """A named switch that none of the `plans` left by the rules can use (refuse_unused_switches)."""

    flags: str
    plans: int
    why: str

    def message(self) -> str:
        return f"{self.flags}: none of the {self.plans:,} plans left by the rules can use it: {self.why}"

    def on_shares(self, full: int, share: int, share_plans: int) -> str:
        """The refusal where the search on `full` GPUs of each NVLink domain and the one on `share` GPUs of each
        (which had `share_plans` left by the rules) both refused it: the counts of both searches."""
        return (f"{self.flags}: none of the plans left by the rules can use it ({self.plans:,} on {full} GPUs of "
                f"each NVLink domain, {share_plans:,} on {share} of each): {self.why}")


def switches_break(rule: str, message: str) -> LlmplanError:
    """The one line for a workload whose switches break a check_plan rule whatever the axes (no pin mends it)."""
    return LlmplanError(f"the search's switches break a rule ({rule}): {message}")


def search(m: ModelSpec, cluster: ClusterSpec, space: Space, w: Workload, objective: str = "throughput",
           top: int = 5, allowance: MemoryAllowance | None = None, order: tuple[str, ...] = DEFAULT_ORDER,
           progress: Callable[[str], None] | None = None, min_headroom: float | None = None,
           checkpoint: CheckpointPolicy | None = None, vpp_pin: int | None = None,
           named: Collection[str] | None = None, keep_plans: bool = False,
           screens: dict[Any, Any] | None = None, beat: float | None = None, sides: bool = True) -> SearchResult:
    """Rank every plan of `space` for training `m` on `cluster`; a plan fits when it leaves at least
    `min_headroom` bytes free per GPU (None: the default share of the GPU's memory, as `check` uses). The best
    pipelined shapes also get the balanced layout at the interleave degrees the even split cannot take
    (search.layouts; `vpp_pin`: the pinned --vpp, searched that way where only a layout can take it). `named`:
    the switches the user named (refuse_unused_switches; None: those the workload sets). `keep_plans`: the
    result keeps every plan that fits (SearchResult.layout_plans). `screens`: the memory screens of earlier
    searches of this command, reused by one whose plans and memory inputs are the same and whose workload
    differs only in the MoE dispatcher, which no memory term reads (screen_key); with the screen, the
    communication seconds of every axis but EP, which no other transfer reads (evaluate.comm_seconds_arrays);
    and every search of one space, its enumerated axes (grid.enumerate_plans' reuse).
    `beat`: where no plan that fits scores above it, stop before ranking and return the result with `outrun` set
    and nothing ranked (a setting tried beside earlier ones: `beat` is the fastest plan so far less the model's
    resolution, win_floor, below which no plan of this setting can tie with it; cli.search.train_search).
    `sides` False: the side outputs (Pareto rows, conventional plan, best without CP / with EP, wide-EP row) are
    left unpriced in `pending` (complete_sides prices them: a command that shows one of many searches).
    Its phases, in order: _prepared, _pruned, _screened, _fitting, _evaluated, then _scored_rows, _rows_result
    and _finished."""
    m, space, pins, min_headroom = _prepared(m, cluster, space, w, vpp_pin, min_headroom)
    t0 = time.perf_counter()
    say = progress or (lambda _: None)
    _check_size(space)
    say("enumerating")
    w = runs_on(m, cluster, w)
    plans = enumerate_plans(space, cluster, w, screens)  # the searches of one command share their spaces' axes
    considered = len(plans)
    say("pruning")
    plans, pruned = _pruned(m, plans, cluster, named)
    say("evaluating memory")
    key = screen_key(w, cluster, space, allowance, min_headroom, plans) if screens is not None else None
    screen = _screened(m, cluster, plans, allowance, min_headroom, screens, key)
    if screen.memory is None or not screen.fits.any():  # none screened in, or every one screened in is still too big
        return _nothing_fits(m, cluster, space, plans, screen, considered, pruned, allowance, order, t0, objective,
                             min_headroom)
    plans = _fitting(plans, screen, pruned, cluster, min_headroom)
    say("evaluating step time")
    ev = _evaluated(m, cluster, plans, allowance, order, screen, screens, key)
    plans, ev = sync_gather_choice(m, cluster, plans, ev, named, objective)
    survives = None
    if objective in ("time-to-train", "gpu-hours"):  # the tokens/s that survive failures (cost.goodput)
        survives = plan_goodput(m, cluster, plans.as_plan, ev.step.total, checkpoint).useful
    score = objective_score(ev, objective, survives)
    top_score = float(score.max())
    if beat is not None and top_score <= beat:
        return SearchResult(considered=considered, feasible=len(plans), pruned=pruned, ranked=[], pareto=[],
                            seconds=time.perf_counter() - t0, objective=objective, top_score=top_score, outrun=True)
    ranking = _order(score, np.asarray(ev.memory.headroom, dtype=float), plans)
    say("ranking")
    job = _Job(m, cluster, w, allowance, order, checkpoint, min_headroom)
    rows = _scored_rows(job, plans, ev, score, ranking, objective, max(top, TIE_POOL))
    res = _rows_result(job, rows, considered, pruned, objective, top_score, sides)
    res = _finished(job, rows, res, pins, keep_plans, sides)
    loses = any(e.tp_overlap_gain is not None and e.tp_overlap_gain < 0 for e in res.ranked)
    return dataclasses.replace(shown(res, top), seconds=time.perf_counter() - t0, tp_overlap_loses=loses)


def _prepared(m: ModelSpec, cluster: ClusterSpec, space: Space, w: Workload, vpp_pin: int | None,
              min_headroom: float | None) -> tuple[ModelSpec, Space, LayoutPins, float]:
    """search's first phase: the model as the workload trains it (its MTP modules, refused where a switch breaks
    MTP_RULE), the space with a pinned --vpp's stand-ins (search.layouts.stand_in_space) and their pins, and the
    headroom asked for (None: the default share of the GPU's memory)."""
    from llmplan.search import layouts

    if not MTP_RULE.ok(m, w.base, cluster):  # a workload switch: no pin or axis mends it
        raise switches_break("mtp_layers", MTP_RULE.message(m, w.base, cluster))
    m = trained_model(m, w.base)  # every plan trains the same MTP modules (ParallelPlan.mtp_layers)
    space, pins = layouts.stand_in_space(m, space, vpp_pin)
    if min_headroom is None:
        min_headroom = min_headroom_bytes(None, cluster.system.gpu.hbm_bytes)
    return m, space, pins, min_headroom


def _check_size(space: Space) -> None:
    """Refuse a space of more plans than one search holds in memory (MAX_PLANS)."""
    if space.size > MAX_PLANS:
        raise LlmplanError(f"the search space has {space.size:,} plans, more than the {MAX_PLANS:,} one search "
                           f"evaluates at once (about {MAX_PLANS * PLAN_BYTES / GIB:.0f} GiB); pin an axis "
                           "(--tp, --pp, --cp, --ep, --micro-batch) or bound one (--max-tp, --max-pp, --max-cp)")


def _pruned(m: ModelSpec, plans: PlanArrays, cluster: ClusterSpec,
            named: Collection[str] | None) -> tuple[PlanArrays, list[Pruned]]:
    """The plans check_plan's rules pass (rule_cuts), with each rule's count and first example; refused where
    the workload's switches alone break a rule, or none passes, or a switch named is used by no plan."""
    keep = np.ones(len(plans), dtype=bool)
    pruned: list[Pruned] = []
    for rule, ok in rule_cuts(m, plans, cluster):
        if ok.ndim == 0 and rule in SWITCH_RULES:  # the workload's switches alone break it: no pin or axis mends it
            raise switches_break(rule.name, rule.message(m, plans.plan(0, settled=False), cluster))
        ok = np.broadcast_to(ok, keep.shape)
        cut = keep & ~ok
        n = int(np.count_nonzero(cut))
        if n:
            i = int(np.argmax(cut))
            pruned.append(Pruned(rule.name, n, rule.message(m, plans.plan(i), cluster)))
            keep &= ok
    left = plans.take(np.flatnonzero(keep))
    if not len(left):
        worst = pruned[::-1][:3]  # the rules that cut the last remaining plans come last
        raise NoPlanLeft("no plan passes the rules: " + "; ".join(f"{p.rule} cut {p.count:,} (e.g. {p.example})"
                                                                   for p in worst)
                           + ". Change the pinned options, --global-batch, --seq-len or --nodes")
    refuse_unused_switches(m, left, named, lambda u: _cut_users(m, plans, cluster, u))
    return left, pruned


def _cut_users(m: ModelSpec, plans: PlanArrays, cluster: ClusterSpec, u: SwitchUse) -> str:
    """Why none of the plans the rules leave uses switch `u` where some of `plans` (before the rules) did: the
    rule that alone cuts the most of those (they pass every other rule), else the one that cuts the most, with
    its message on one of them (what, the values, the rule, the fix); "" where no plan used it (a pinned axis).
    Run only on the way to a refusal: the rules are run again on the plans that use the switch."""
    users = np.flatnonzero(np.broadcast_to(np.asarray(u.uses(plans), dtype=bool), (len(plans),)))
    if not len(users):
        return ""
    sub = plans.take(users)
    oks = [(rule, np.broadcast_to(ok, (len(sub),))) for rule, ok in rule_cuts(m, sub, cluster)]
    passed = np.sum([ok for _, ok in oks], axis=0) if oks else np.zeros(len(sub))
    alone = [(int(np.count_nonzero(~ok & (passed == len(oks) - 1))), int(np.count_nonzero(~ok)), k)
             for k, (_, ok) in enumerate(oks)]
    if not alone:
        return ""
    _, n, k = max(alone)
    rule, ok = oks[k]
    return (f"the {len(sub):,} of the {len(plans):,} plans searched that could use it break check rules; rule "
            f"{rule.name} cuts {n:,} of those {len(sub):,}: {rule.message(m, sub.plan(int(np.argmin(ok))), cluster)}")


def _screened(m: ModelSpec, cluster: ClusterSpec, plans: PlanArrays, allowance: MemoryAllowance | None,
              min_headroom: float, screens: dict[Any, Any] | None, key: Any) -> Any:
    """The memory screen of `plans` (evaluate.screened_memory), an earlier search's under the same `key`
    (screen_key) where `screens` holds one, and kept there for the next."""
    screen = screens.get(key) if screens is not None else None
    if screen is None:
        screen = screened_memory(m, cluster, plans, allowance, min_headroom)
        if screens is not None:
            screens[key] = screen
    return screen


def _fitting(plans: PlanArrays, screen: Any, pruned: list[Pruned], cluster: ClusterSpec,
             min_headroom: float) -> PlanArrays:
    """The plans the memory screen lets through; those it cuts counted in `pruned` (with the plan that needs the
    least memory as the example)."""
    capacity = float(cluster.system.gpu.hbm_bytes)
    if screen.least is not None:
        pruned.append(Pruned("memory", int((~screen.fits).sum()), f"{plans.plan(screen.least).describe()} needs "
                             f"{screen.least_total / GIB:.1f} GiB of {capacity / GIB:.1f} GiB per GPU"
                             + (f" (with {min_headroom / GIB:g} GiB headroom required)" if min_headroom else "")))
    return plans.take(np.flatnonzero(screen.fits))


def _evaluated(m: ModelSpec, cluster: ClusterSpec, plans: PlanArrays, allowance: MemoryAllowance | None,
               order: tuple[str, ...], screen: Any, screens: dict[Any, Any] | None, key: Any) -> Evaluation:
    """The vectorised evaluation of the plans that fit, with the communication seconds of every axis but EP
    shared with an earlier search of the same plans (`screens`) and kept there for the next."""
    comm_key = ("comm", key, order) if screens is not None else None  # the same plans: their comm but EP alike
    ev = evaluate(m, cluster, plans, allowance, order, memory=screen.memory,
                  comm=screens.get(comm_key) if screens is not None else None)
    if screens is not None:
        screens.setdefault(comm_key, ev.comm)
    return ev


def sync_gather_choice(m: ModelSpec, cluster: ClusterSpec, plans: PlanArrays, ev: Evaluation,
                       named: Collection[str] | None, objective: str = "throughput") -> tuple[PlanArrays, Evaluation]:
    """The plans and their evaluation with, per plan, the cheaper of the workload's overlapped weight gather and
    the synchronous one (overlap_param_gather False: every stage gathers after its step, all at once) where the
    overlapped one waits on the 1F1B warm-up's chain (gathers_on_warmup_chain: Megatron-Core's later stages are
    one bucket each, so their whole gathers add up along the chain) and the user did not name the switch. The
    synchronous setting is priced on those plans only, with the same memory and communication seconds (no term
    of either reads the switch), and kept where its step is strictly shorter (PlanArrays.gather_sync: the plan
    built, exported and estimated carries it). Ranked by tokens/s, only the plans that could then rank among the
    TOP_SORTED best (_order: no other plan is shown) are priced again: their step less all their exposed DP seconds
    (the synchronous gather's step is no shorter) within 0.1% of the TOP_SORTED-th best plan's tokens/s.
    Derived: docs/formulas.md#step.dp_later_stages"""
    if not plans.w.overlap_param_gather or (named is not None and "overlap_param_gather" in named):
        return plans, ev
    n = len(plans)
    at = np.flatnonzero(np.broadcast_to(np.asarray(gathers_on_warmup_chain(plans.as_plan), dtype=bool), (n,)))
    if objective == "throughput" and n > TOP_SORTED and len(at):
        tokens, total = (np.asarray(x, dtype=float) for x in (ev.throughput.tokens_per_s, ev.step.total))
        cut = np.partition(tokens, n - TOP_SORTED)[n - TOP_SORTED]
        floor = total[at] - np.asarray(ev.step.exposed["dp"], dtype=float)[at]
        at = at[tokens[at] * total[at] / np.maximum(floor, 1e-30) >= cut * (1 - 1e-3)]
    if not len(at) or ev.comm is None:
        return plans, ev
    sub = on_cluster(plans.take(at).model_copy(update={"overlap_param_gather": False}), cluster)
    gpu = cluster.system.gpu
    st = step_time(m, sub.as_plan, gpu, take_tree(ev.comm, at, n))
    better = np.flatnonzero(np.asarray(st.total, dtype=float) < np.asarray(ev.step.total, dtype=float)[at])
    if not len(better):
        return plans, ev
    k = len(at)
    chosen = at[better]
    sync = np.zeros(n, dtype=bool)
    sync[chosen] = True
    plans = dataclasses.replace(plans, gather_sync=sync)
    return plans, dataclasses.replace(
        ev, plans=plans, step=put_tree(ev.step, take_tree(st, better, k), chosen, n),
        throughput=put_tree(ev.throughput, take_tree(throughput(sub.as_plan, gpu, st), better, k), chosen, n))


@dataclass(frozen=True)
class _Job:
    """What one search prices its rows with: the model as trained, the cluster, the workload as it runs there,
    and the search's memory and placement options."""

    m: ModelSpec
    cluster: ClusterSpec
    w: Workload
    allowance: MemoryAllowance | None
    order: tuple[str, ...]
    checkpoint: CheckpointPolicy | None
    min_headroom: float

    def conventional(self) -> TrainingEstimate | None:
        """The conventional plan of the job (conventional_plan)."""
        return conventional_plan(self.m, self.cluster, self.w, self.allowance, self.order, self.min_headroom,
                                 self.checkpoint)


@dataclass
class _Rows:
    """The ranking phase's view of the plans that fit: their ranking, layouts and scores, the rows picked (one per
    layout among the `pool` best), the side outputs' plan indices and the memoised scalar estimate."""

    plans: PlanArrays
    ranking: np.ndarray
    score: np.ndarray
    tokens: np.ndarray
    headroom: np.ndarray
    memory: np.ndarray
    codes: np.ndarray
    layout: np.ndarray
    resolution: float | None
    pool: int
    picked: list[Any]
    counted: list[Any]
    front: np.ndarray
    cp_i: int | None
    ep_i: int | None
    cloud: np.ndarray
    est: Callable[[Any], TrainingEstimate]
    estimates: dict[int, TrainingEstimate]
    side_rows: dict[int, Any] = field(default_factory=dict)
    """sides=False: the plans the pending side outputs price (pending_rows), their pricer's rows."""


def _scored_rows(job: _Job, plans: PlanArrays, ev: Evaluation, score: np.ndarray, ranking: np.ndarray,
                 objective: str, pool: int) -> _Rows:
    """search's ranking phase: one row per layout (its best variant) among the `pool` best layouts, ties resolved
    there whatever --top is, so the rows at any --top are the first rows of one ranking (search.variants,
    search.ties); the vectorised Pareto front, the plans the CP / EP comparisons show and the scatter's cloud."""
    m = job.m
    estimates: dict[int, TrainingEstimate] = {}

    def est(i: Any) -> TrainingEstimate:  # the scalar estimate of a shown plan (ranked and Pareto rows share)
        if int(i) not in estimates:
            estimates[int(i)] = estimate_training(m, job.cluster, plans.plan(int(i)), job.allowance, job.order,
                                                  job.checkpoint)
        return estimates[int(i)]

    tokens = np.asarray(ev.throughput.tokens_per_s, dtype=float)
    front = pareto_front(np.asarray(ev.throughput.tokens_per_s), np.asarray(ev.memory.headroom))
    layout = np.stack([plans.tp, plans.pp, plans.dp, plans.cp, plans.ep, plans.etp_resolved, plans.vpp,
                       plans.pp_first, plans.pp_last, plans.sp, plans.recompute_code, plans.micro_batch], axis=1)
    resolution = None
    if objective != "headroom":  # throughput-like objectives: plans inside the resolution are tied
        from llmplan.intervals import resolution as model_resolution

        resolution = model_resolution(moe=bool(m.num_experts))
    codes = layout_codes(plans)
    headroom = np.asarray(ev.memory.headroom, dtype=float)
    memory = np.asarray(ev.memory.total, dtype=float)
    picked = [representative(i, codes, score, headroom, plans, resolution, memory)
              for i in best_layouts(ranking, codes, score, pool)]
    counted = [variants_of(i, codes, score, memory, layout, plans, resolution) for i in picked]
    sample = np.unique(np.linspace(0, len(plans) - 1, min(CLOUD_POINTS, len(plans))).round().astype(int))
    cloud = np.stack([tokens[sample], headroom[sample]], axis=1)
    cp_i = best_index(plans.cp == 1, plans.cp > 1, score)
    ep_i = best_index(plans.ep > 1, plans.ep == 1, score) if m.is_moe else None
    return _Rows(plans, ranking, score, tokens, headroom, memory, codes, layout, resolution, pool, picked, counted,
                 front, cp_i, ep_i, cloud, est, estimates)


def _rows_result(job: _Job, r: _Rows, considered: int, pruned: list[Pruned], objective: str, top_score: float,
                 sides: bool) -> SearchResult:
    """The result of the ranked rows before the layout pass, with the side outputs priced (`sides`) or pending
    (SidePlans: the rows they price are filled in by _finished's pending_rows)."""
    est, cp_i, ep_i = r.est, r.cp_i, r.ep_i
    return SearchResult(considered=considered, feasible=len(r.plans), pruned=pruned,
                        ranked=[est(i) for i in r.picked], pareto=[est(i) for i in r.front] if sides else [],
                        objective=objective, equivalents=[n for n, _ in r.counted],
                        conventional=job.conventional() if sides else None,
                        without_cp=est(cp_i) if sides and cp_i is not None else None,
                        with_ep=est(ep_i) if sides and ep_i is not None else None,
                        cloud=r.cloud, resolution=r.resolution, variants=[v for _, v in r.counted],
                        top_score=top_score,
                        pending=None if sides else SidePlans(
                            pricer(r.side_rows, r.estimates, job.m, job.cluster, job.allowance, job.order,
                                   job.checkpoint),
                            tuple(int(i) for i in r.front), cp_i, ep_i, None, job.conventional))


def _finished(job: _Job, r: _Rows, res: SearchResult, pins: LayoutPins, keep_plans: bool, sides: bool) -> SearchResult:
    """search's last phase: the layout pass's balanced-layout plans merged into the rows (search.layouts), every
    plan that fits kept where asked (`keep_plans`), the rows ranked with their ties, and the wide-EP row priced
    (`sides`) or left pending with the few plans the pending side outputs price."""
    from llmplan.search import layouts

    fitted: list[TrainingEstimate] = []
    res = layouts.layout_pass(res, pins, job.m, job.cluster, r.plans, r.ranking, job.allowance, job.order,
                              job.checkpoint, job.min_headroom, r.pool, fitted)
    if keep_plans:
        res.layout_plans = LayoutPlans(r.plans, r.ranking, r.codes, r.score, r.headroom, r.memory, r.layout,
                                       r.resolution, r.est,
                                       np.isin(r.plans.pp, list(pins.stand_ins)) if pins.stand_ins else None,
                                       r.tokens, fitted)
    res = layouts.rank(res, r.pool)
    wide_i = wide_ep_index(res.ranked[0], r.plans, r.score, job.cluster, job.order) if res.ranked else None
    usual_i = usual_index(res.ranked[0], r.plans, r.score, job.cluster, job.order) if res.ranked else None
    return dataclasses.replace(res, wide_ep=r.est(wide_i) if sides and wide_i is not None else None,
                               usual=r.est(usual_i) if sides and usual_i is not None else None,
                               pending=pending_rows(res.pending, r.side_rows, r.plans, wide_i, usual_i))


def pending_rows(pending: SidePlans | None, rows: dict[int, Any], plans: PlanArrays,
                 wide_i: int | None, usual_i: int | None = None) -> SidePlans | None:
    """The pending side outputs with the wide-EP and usual-layout rows set, and the plans they price copied out
    of the plan arrays into `rows` (their pricer's), so that the result holds those few plans, not the arrays."""
    if pending is None:
        return None
    p = dataclasses.replace(pending, wide_ep=wide_i, usual=usual_i)
    rows.update({i: plans.plan(i) for i in (*p.front, p.without_cp, p.with_ep, p.wide_ep, p.usual)
                 if i is not None})
    return p


def usual_kind(first: TrainingEstimate, cluster: ClusterSpec, order: tuple[str, ...]) -> str | None:
    """On which structural axis `first` differs from the layouts the published recipes run at scale, or None:
    'zero' where an MoE model shards its weights or gradients every micro-batch (ZeRO 2-3 without a pipeline)
    over a data-parallel group that leaves its NVLink domain (Megatron's MoE recipes run the distributed
    optimizer, ZeRO-1, with a pipeline: NVIDIA-NeMo/Megatron-Bridge perf_recipes, e.g. DeepSeek-V3 GB300 tp1 pp2
    vp8 ep32; a dense model's FSDP / ZeRO-2 across nodes is what the PyTorch-native stacks publish, torchtitan and
    LLM Foundry, so not unusual, review-70c); 'ep' where an
    MoE #1's EP group stays inside a domain it fills a quarter of or less, at tp 1 (the recipes' EP fills
    the domain: EP 32-64 on NVL72, DeepSeek-V3 report arXiv:2412.19437 sec. 3.2: EP 64)."""
    p = first.plan
    spans = place(p.degrees, cluster, order)
    if first.model.is_moe and p.zero >= 2 and p.pp == 1 and spans["dpcp"].uses_nic:
        return "zero"
    domain = cluster.system.domain_gpus
    if p.ep > 1 and p.tp == 1 and not spans["ep"].uses_nic and 4 * p.ep * p.etp_resolved <= domain:
        return "ep"
    return None


def usual_index(first: TrainingEstimate, plans: PlanArrays, score: np.ndarray, cluster: ClusterSpec,
                order: tuple[str, ...]) -> int | None:
    """The index of the best-scoring plan of the usual kind where `first` differs from it (usual_kind): ZeRO <= 1
    ('zero'), or an EP at least twice #1's whose group fits one NVLink domain ('ep'); None otherwise
    (SearchResult.usual)."""
    kind = usual_kind(first, cluster, order)
    if kind is None:
        return None
    if kind == "zero":
        keep = np.asarray(plans.zero) <= 1
    else:
        span = np.asarray(plans.ep) * np.asarray(plans.etp_resolved)
        keep = (np.asarray(plans.ep) >= 2 * first.plan.ep) & (span <= cluster.system.domain_gpus)
    idx = np.flatnonzero(keep)
    if not len(idx):
        return None
    return int(idx[int(np.argmax(np.asarray(score, dtype=float)[idx]))])


DISPATCH_FIELDS = ("moe_dispatcher", "moe_flex_backend")
"""Workload fields no memory term reads (cost.memory and what it calls): searches that differ only in them share
one memory screen (tests/test_search_deepep.py checks the memory alike)."""


def screen_key(w: Workload, cluster: ClusterSpec, space: Space, allowance: MemoryAllowance | None,
               min_headroom: float, plans: PlanArrays) -> tuple[Any, ...]:
    """What a memory screen depends on: the workload but its dispatcher, the cluster, the space, the allowance,
    the headroom and which plans passed the rules (their layout columns)."""
    fields = tuple((k, repr(v)) for k, v in w.fields().items() if k not in DISPATCH_FIELDS)
    cols = b"".join(np.ascontiguousarray(getattr(plans, a)).tobytes()
                    for a in ("tp", "pp", "dp", "cp", "ep", "etp_resolved", "vpp", "micro_batch", "zero",
                              "recompute_code", "sp", "pp_first", "pp_last"))
    return fields, repr(cluster), repr(space), repr(allowance), float(min_headroom), len(plans), hash(cols)


def wide_ep_index(first: TrainingEstimate, plans: PlanArrays, score: np.ndarray, cluster: ClusterSpec,
                  order: tuple[str, ...]) -> int | None:
    """The index of the best-scoring plan with a smaller tp and a larger ep than `first` (the wide-EP side row,
    SearchResult.wide_ep), where `first` runs tp > 1 beside an EP group that stays inside one NVLink domain: the
    layout the published MoE runs avoid (DeepSeek-V3 report, arXiv:2412.19437, sec. 3.2: no TP, EP 64 over 8
    nodes; Megatron-Bridge's DeepSeek-V3 recipes: TP 1-2, EP 32-64), set beside it so the report can say what the
    wider EP costs. None otherwise."""
    p = first.plan
    if p.ep == 1 or p.tp == 1 or place(p.degrees, cluster, order)["ep"].uses_nic:
        return None
    idx = np.flatnonzero((np.asarray(plans.tp) < p.tp) & (np.asarray(plans.ep) > p.ep))
    if not len(idx):
        return None
    return int(idx[int(np.argmax(np.asarray(score, dtype=float)[idx]))])


def best_index(keep: np.ndarray, other: np.ndarray, score: np.ndarray) -> int | None:
    """The index of the best-scoring plan among `keep` (e.g. cp 1), when the plans that fit hold both `keep` and
    `other` ones (e.g. cp > 1); else None (SearchResult.without_cp, with_ep)."""
    idx = np.flatnonzero(np.asarray(keep, dtype=bool))
    if not len(idx) or not np.any(other):
        return None
    return int(idx[int(np.argmax(np.asarray(score, dtype=float)[idx]))])


def rule_cuts(m: ModelSpec, plans: PlanArrays, cluster: ClusterSpec) -> Iterator[tuple[Rule, np.ndarray]]:
    """check_plan's rules the search prunes by (RULES less the switches of SWITCH_USES, which act on some plans
    only and are checked apart), in order, each with its verdict on `plans` (a bool array, or a bool where the
    workload alone decides) where it cuts some of them."""
    held = {u.name for u in SWITCH_USES}
    for rule in (r for r in RULES if r.name not in held):
        ok = plans.on_distinct(LAYOUT_AXES, 0, lambda p, _, r=rule: r.ok(m, p, cluster)) if rule.name in LAYOUT_RULES \
            else rule.ok(m, plans, cluster)
        ok = np.asarray(ok, dtype=bool)
        if not ok.all():  # nothing to cut (most rules on most spaces): no pass over every plan
            yield rule, ok


def any_passes(m: ModelSpec, plans: PlanArrays, cluster: ClusterSpec) -> bool:
    """Whether some of `plans` passes every rule the search prunes by (rule_cuts)."""
    keep = np.ones(len(plans), dtype=bool)
    for _, ok in rule_cuts(m, plans, cluster):
        keep &= ok
    return bool(keep.any())


def refuse_unused_switches(m: ModelSpec, plans: PlanArrays, named: Collection[str] | None = None,
                           cut_by: Callable[[SwitchUse], str] | None = None) -> None:
    """Refuse a switch of SWITCH_USES the user `named` (the default value included; None, a library call: the
    switches the workload sets away from their defaults) that none of the plans left by the rules can use
    (zero3_unit tensor with --zero 1 pinned, ep_comm_overlap with --ep 1), and a named MoE switch on a dense
    model: it would silently do nothing. Where some plans use it, the others keep it and price as without it
    (they show with its default: check_switches.settle). A switch the search turns on itself (tp_comm_overlap
    where sp is on) is not named, and never refused. `cut_by`: for a switch refused, why the rules cut every
    plan that used it (_cut_users; "" where none did), said in place of the axis advice."""
    dense = [v for v in named_switch_violations(m, plans.plan(0, settled=False), named or ())
             if v.rule == "moe_switches_dense"]
    if dense:
        raise switches_break(dense[0].rule, dense[0].message)
    for u in SWITCH_USES:
        if u.moe and not m.is_moe:  # check_plan's moe_switches_dense has refused it already
            continue
        asked = u.given(plans.w) if named is None else any(asks_for(plans.w, f, named) for f in u.fields)
        if asked and not np.any(u.uses(plans)):
            why = cut_by(u) if cut_by is not None else ""
            flags = [f"--{'no-' if ParallelPlan.model_fields[f].default is True else ''}{f.replace('_', '-')}"
                     for f in u.fields if named is None or asks_for(plans.w, f, named)]
            unused = UnusedSwitch(", ".join(flags), len(plans),
                                  why or f"{u.message(plans.plan(0, settled=False))} (or unpin the axis it needs)")
            raise NoPlanLeft(unused.message(), unused)


def shown(res: SearchResult, top: int) -> SearchResult:
    """The result with its first `top` ranked plans, their ties, and the tie notes of the plans shown: also the
    note of the last one shown against the next one, not shown (why #1 is above #2 at --top 1)."""
    return dataclasses.replace(res, ranked=res.ranked[:top], equivalents=res.equivalents[:top],
                               variants=res.variants[:top],
                               tied_with=[[k for k in t if k <= top] for t in res.tied_with[:top]],
                               tie_notes=[n for n in res.tie_notes if n.upper <= top])


def _nothing_fits(m, cluster, space, plans, screen, considered, pruned, allowance, order, t0, objective,
                  min_headroom: float) -> SearchResult:
    i = screen.least  # none fits: the plan that needs the least memory
    closest = estimate_training(m, cluster, plans.plan(i), allowance, order)
    need, cap = screen.least_total, float(cluster.system.gpu.hbm_bytes)
    pruned.append(Pruned("memory", len(plans), f"{plans.plan(i).describe()} needs {need / GIB:.1f} GiB of "
                         f"{cap / GIB:.1f} GiB per GPU"
                         + (f" (with {min_headroom / GIB:g} GiB headroom required)" if min_headroom else "")))
    tips = []  # the headroom asked for, savings the search was not allowed to try (pinned options), more nodes
    free = float(closest.memory.capacity) - need
    if min_headroom > 0 and free >= 0:  # the closest plan fits the GPU; only the headroom asked for refuses it
        tips.append(f"--min-headroom {free / GIB:.1f} or less (the closest plan, {plans.plan(i).describe()}, "
                    f"leaves {free / GIB:.1f} GiB free; {min_headroom / GIB:g} GiB was asked)")
    if "full" not in space.recompute:
        tips.append("full recompute (unpin --recompute)")
    if 3 not in space.zero:
        tips.append("ZeRO-3 (unpin --zero)")
    if 1 not in space.micro_batch:
        tips.append("a micro-batch of 1 (unpin --micro-batch)")
    mem_c = closest.memory
    states = float(mem_c.weights + mem_c.gradients + mem_c.optimizer)
    frag = (allowance or MemoryAllowance()).fragmentation
    fixed = (allowance or MemoryAllowance()).fixed_gib
    runtime = fixed * GIB if fixed is not None else float(mem_c.runtime.total if mem_c.runtime else 0.0)
    # the fragmentation allowance on the activations only: the model states are held buffers
    # (docs/formulas.md#mem.fragmentation)
    room = cap - min_headroom - (1 + frag) * float(mem_c.activations) - runtime
    nodes = int(np.ceil(cluster.num_nodes * states / room)) if room > 0 else 0
    if nodes > cluster.num_nodes:  # model states shrink about linearly with more GPUs (more pp / dp sharding)
        tips.append(f"about {nodes} nodes instead of {cluster.num_nodes} (--nodes)")
    elif room <= 0 and not (min_headroom > 0 and free >= 0):
        tips.append("GPUs with more memory, or a shorter --seq-len (activations alone exceed the capacity)")
    return SearchResult(considered, 0, pruned, [], [], closest, tips, time.perf_counter() - t0, objective)


def runs_on(m: ModelSpec, cluster: ClusterSpec, w: Workload) -> Workload:
    """The workload as it runs on the cluster's GPUs: unfused attention or bf16 GEMMs where the kernels are
    missing (cost.operators), so the search ranks what will run, with the cluster's NVLink domain
    (ParallelPlan.nvlink_domain_ranks, as estimate_training sets it)."""
    base = w.plan()
    runs = on_cluster(with_fallbacks(base, operator_uses(m, base, cluster.system.gpu)), cluster)
    return w if runs is base else Workload.of(runs)


def conventional_plan(m: ModelSpec, cluster: ClusterSpec, w: Workload, allowance: MemoryAllowance | None,
                      order: tuple[str, ...], min_headroom: float,
                      checkpoint: CheckpointPolicy | None = None) -> TrainingEstimate | None:
    """What an experienced team would try first (conventional_layouts orders the tp and pp tried): the fewest
    pipeline stages across nodes that fit (balanced split), DP over the rest with the distributed optimizer,
    sequence parallelism, micro-batch 1, selective recompute (full only when nothing else fits); None when none
    fits. Dense: TP over the node's GPUs (the largest valid degree). MoE, as Megatron-Core's MoE guide
    (Megatron-LM d98e8a64dd megatron/core/transformer/moe/README.md, "Best Practices": guidelines 1 (keep
    TP / EP / PP small), 2 (EP and TP inside the NVLink domain) and 4 (EP over TP for the experts, ETP 1))
    and the recipes built on it run: small TP, the experts over expert parallelism inside one NVLink
    domain with expert TP 1 (conventional_moe_plan), the search's MoE dispatcher. The recipes
    (Megatron-Bridge 067f987df0 src/megatron/bridge/perf_recipes): DeepSeek-V3 tp1 ep32-64 on GB300
    (deepseek/gb300/deepseek_v3.py) and tp2 ep64 on H100 (deepseek/h100); Qwen3-30B-A3B tp1 ep8-16 and
    Qwen3-235B-A22B tp1 ep32 on GB300 / tp2 ep32 on H100 (qwen/*/qwen3_moe.py); GPT-OSS-120B tp1 ep8 on H100
    (gpt_oss/h100/gpt_oss.py); Mixtral-8x7B tp1 pp4 ep8 (NeMo-Framework-Launcher
    examples/training/mixtral/h100/mixtral_8x7b_bf16.sh)."""
    from llmplan.cost.memory import training_memory
    from llmplan.specs.check import balanced_split, valid_tp

    n, node = cluster.num_gpus, cluster.gpus_per_node_used
    tps = [t for t in valid_tp(m, node) if n % t == 0]
    for recompute in ("selective", "full"):
        for tp, pp in conventional_layouts(m, n, tps):
            first, last = balanced_split(m.num_hidden_layers, pp)
            dp = n // (tp * pp)
            plan = w.plan(tp=tp, pp=pp, pp_first=first, pp_last=last, dp=dp, sp=tp > 1, zero=1 if dp > 1 else 0,
                          recompute=recompute, micro_batch=1)
            found = conventional_moe_plan(m, cluster, plan, order) if m.is_moe else settle(plan)
            if found is None or check_plan(m, found, cluster):
                continue
            gpu = cluster.system.gpu
            mem = training_memory(m, found, gpu.hbm_bytes, allowance, gpu.fp8_tn_only, gpu.nccl_sms,
                                  gpu.compute_capability, gpu.has_sparse_gather_rate)
            if float(mem.headroom) >= min_headroom:
                return estimate_training(m, cluster, found, allowance, order, checkpoint)
    return None


def conventional_layouts(m: ModelSpec, n: int, tps: list[int]) -> list[tuple[int, int]]:
    """The (tp, pp) layouts conventional_plan tries, in order, for `n` GPUs and the valid TP degrees `tps`: every
    pipeline depth dividing the GPUs left by TP (up to the layers), fewest first. Dense: at the largest TP only.
    MoE: every TP, the least model parallelism tp x pp first and the smaller TP on a tie (Megatron-Core's MoE
    guideline 1: keep model parallelism small; the recipes' TP 1-2 with EP carrying the experts)."""
    def depths(tp: int) -> list[int]:
        return [p for p in range(1, min(m.num_hidden_layers, n // tp) + 1) if (n // tp) % p == 0]

    if not tps:
        return []
    if not m.is_moe:
        return [(max(tps), p) for p in depths(max(tps))]
    return sorted(((t, p) for t in tps for p in depths(t)), key=lambda tp_pp: (tp_pp[0] * tp_pp[1], tp_pp[0]))


def conventional_moe_plan(m: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                          order: tuple[str, ...]) -> ParallelPlan | None:
    """`plan` (an MoE model's TP / PP / DP layout) with the experts as the MoE recipes place them: expert TP 1
    and the largest EP dividing the experts whose groups stay inside one NVLink domain (placement.place), the
    fewest virtual stages Megatron-Core accepts (vpp 2+ where the EP overlap runs with a pipeline); None when no
    such plan passes check_plan. Source: Megatron-LM d98e8a64dd megatron/core/transformer/moe/README.md
    (guidelines 2 and 4; --expert-tensor-parallel-size 'recommended to set to 1 for fine-grained MoE')"""
    from llmplan.specs.stages import divisors

    for ep in sorted(divisors(m.num_experts), reverse=True):
        for vpp in range(1, 5):
            cand = settle(plan.model_copy(update={"ep": ep, "etp": 1, "vpp": vpp}))
            if (plan.tp * plan.dp) % ep == 0 and place(cand.degrees, cluster, order)["ep"].domains == 1 \
                    and not check_plan(m, cand, cluster):
                return cand
    return None


def explain(a: TrainingEstimate, b: TrainingEstimate) -> dict[str, float]:
    """Why plan a beats plan b: step-time parts of a minus those of b (seconds; negative = a is faster),
    per-axis exposed communication, memory per GPU (bytes) and throughput ratio."""
    ta, tb = a.time, b.time
    out = {"compute_s": float(ta.compute - tb.compute), "bubble_s": float(ta.bubble - tb.bubble),
           **{f"exposed_{k}_s": float(ta.exposed[k] - tb.exposed[k]) for k in ta.exposed},
           "optimizer_s": float(ta.optimizer - tb.optimizer), "step_s": float(ta.total - tb.total),
           "memory_bytes": float(a.memory.total - b.memory.total),
           "throughput_ratio": float(a.throughput.tokens_per_s / b.throughput.tokens_per_s)}
    return out
