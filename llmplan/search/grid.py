"""Enumerating candidate plans as numpy arrays (one element per plan).

PlanArrays carries the same attribute names as ParallelPlan, as arrays, so the cost functions and the
check_plan rules evaluate every plan at once.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field, fields
from typing import Any, Callable, cast

import numpy as np

from llmplan.cost.params import ALL_BUT_ZERO, LAYOUT_AXES
from llmplan.specs.check import divisors
from llmplan.specs.check_switches import SWITCH_USES, settle
from llmplan.specs.rule import as_bool
from llmplan.specs.stages import balanced_split, pinned_split, vpp_fits
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ETP_SAME_AS_TP, RECOMPUTE, ClusterSpec, ParallelPlan, PlanQuantities, resolve_etp

SEARCHED_RECOMPUTE = ("none", "selective", "full")
"""Recompute modes a search tries unless --recompute pins one: op-level checkpointing (torchtitan's policy)
runs only when asked for, as its plans export to torchtitan alone."""


AXES = frozenset({"tp", "pp", "dp", "cp", "ep", "etp", "vpp", "pp_first", "pp_last", "pp_layers", "sp", "zero",
                   "recompute", "micro_batch"})
"""ParallelPlan fields the search varies; every other field is the workload it holds fixed."""
WORKLOAD_FIELDS = frozenset(ParallelPlan.model_fields) - AXES


class Workload:
    """What the search holds fixed: the training job and the launcher switches, kept as a ParallelPlan (whose
    axis fields are placeholders), so that their names, defaults and validation exist once."""

    __slots__ = ("base",)

    def __init__(self, **fields: Any) -> None:
        unknown = set(fields) - WORKLOAD_FIELDS
        if unknown:
            raise TypeError(f"not workload fields: {sorted(unknown)}")
        object.__setattr__(self, "base", ParallelPlan(**fields))

    def __getattr__(self, name: str) -> Any:
        if name in WORKLOAD_FIELDS:
            return getattr(self.base, name)
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Workload is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Workload) and self.fields() == other.fields()

    def __repr__(self) -> str:
        return f"Workload({', '.join(f'{k}={v!r}' for k, v in self.fields().items())})"

    def fields(self) -> dict[str, Any]:
        return {k: getattr(self.base, k) for k in sorted(WORKLOAD_FIELDS)}

    @classmethod
    def of(cls, plan: ParallelPlan) -> "Workload":
        """The fixed part of a plan."""
        return cls(**{k: getattr(plan, k) for k in WORKLOAD_FIELDS})

    def plan(self, **axes: Any) -> ParallelPlan:
        """A ParallelPlan with this workload and the given axis values."""
        return ParallelPlan(**self.fields(), **axes)


BYTES_PER_ELEMENT = frozenset({"weight_bytes", "grad_bytes", "reduce_bytes", "optimizer_bytes", "master_bytes"})


@dataclass(frozen=True)
class Space:
    """The values each plan axis may take; a pinned axis has one value."""

    tp: tuple[int, ...]
    pipeline: tuple[tuple[int, int, int, int], ...]
    """Pipeline layouts (pp, vpp, pp_first, pp_last): stages, virtual stages, and the first / last stage's
    layers (0: an even share)."""
    cp: tuple[int, ...]
    ep: tuple[int, ...]
    etp: tuple[int, ...]
    """Expert tensor-parallel degrees; ETP_SAME_AS_TP (0) stands for 'equal to tp' (Megatron's default)."""
    sp: tuple[bool, ...]
    zero: tuple[int, ...]
    recompute: tuple[str, ...]
    micro_batch: tuple[int, ...]

    @property
    def size(self) -> int:
        return int(np.prod([len(getattr(self, f.name)) for f in fields(self)]))


def pipeline_layouts(L: int, n_gpus: int, max_pp: int, pins: dict[str, Any]) -> tuple[tuple[int, int, int, int], ...]:
    """Every pipeline layout worth trying: each stage count that divides the GPUs (up to max_pp and the
    layers), split evenly when it divides the layers and otherwise by the balanced uneven split
    (check.balanced_split), each with every interleave that divides all its stages' layers."""
    out = []
    pps = [pins["pp"]] if "pp" in pins else [p for p in range(1, min(max_pp, n_gpus, L) + 1) if n_gpus % p == 0]
    for p in pps:
        if "pp_first" in pins or "pp_last" in pins:
            first, last = pins.get("pp_first", 0), pins.get("pp_last", 0)
        else:
            first, last = balanced_split(L, p) if p <= L else (0, 0)
        (f, mid, l), middle = pinned_split(L, p, first, last)
        vpps = [pins["vpp"]] if "vpp" in pins else (
            [v for v in range(1, max(f, mid, l) + 1) if vpp_fits(f, mid, l, middle, v)] if p > 1 else [1])
        out += [(p, v, first, last) for v in vpps]
    return tuple(out)


def _two_levels(w: Workload, cp: int) -> bool:
    """Whether a cp degree is worth enumerating under the workload's context parallelism: every one but, under
    Transformer Engine's a2a+p2p, those check_plan's cp_hierarchical_sizes refuses whatever the other axes (cp
    not above cp_a2a_size, or not a multiple of it); cp 1, where it does nothing, stays (settled to p2p)."""
    k = w.cp_a2a_size
    return cp == 1 or w.cp_impl != "te" or w.cp_comm_type != "a2a+p2p" or (cp > k > 1 and cp % k == 0)


def _a2a_level_in_domain(w: Workload, cluster: ClusterSpec, tps: tuple[int, ...]) -> tuple[int, ...]:
    """The TP degrees worth enumerating under Transformer Engine's a2a+p2p: those whose in-domain share of CP ranks
    is its a2a level (cp_a2a_size = 2^floor(log2(domain / tp)), search.variants.in_domain_shares), so that the
    a2a level fills one NVLink domain beside its TP ranks and each share's search enumerates its own TP degrees
    (where none is, every one); every one under the other comm types. A pinned --tp overrides it."""
    k, domain = w.cp_a2a_size, min(cluster.system.domain_gpus, cluster.num_gpus)
    if w.cp_impl != "te" or w.cp_comm_type != "a2a+p2p" or k < 2:
        return tps
    own = tuple(t for t in tps if domain // t >= 2 and 1 << int(math.log2(domain // t)) == k)
    return own or tps


def default_space(m: ModelSpec, cluster: ClusterSpec, w: Workload, pins: dict[str, Any] | None = None,
                  max_tp: int | None = None, max_pp: int | None = None, max_cp: int | None = None) -> Space:
    """Every value worth trying; rules prune the invalid combinations (and are counted)."""
    n = cluster.num_gpus
    pins = {k: v for k, v in (pins or {}).items() if v is not None}
    max_tp = max_tp or cluster.system.domain_gpus
    max_cp = max_cp or 32
    values: dict[str, tuple[Any, ...]] = {
        "tp": _a2a_level_in_domain(
            w, cluster, tuple(t for t in divisors(m.num_attention_heads) if t <= min(max_tp, n))
        ),
        "pipeline": pipeline_layouts(m.num_hidden_layers, n, max_pp or n, pins),
        "cp": tuple(c for c in (1, 2, 4, 8, 16, 32) if c <= min(max_cp, n) and _two_levels(w, c)),
        "ep": tuple(e for e in divisors(m.num_experts) if e <= n) if m.is_moe else (1,),
        "etp": (1, ETP_SAME_AS_TP) if m.is_moe else (ETP_SAME_AS_TP,),
        "sp": (False, True),
        "zero": (0, 1, 2, 3),
        "recompute": SEARCHED_RECOMPUTE,
        "micro_batch": tuple(b for b in (1, 2, 4, 8, 16) if b <= w.global_batch),
    }
    for key, value in pins.items():
        if key in values:
            values[key] = (value,)
    return Space(**values)


@dataclass(frozen=True)
class PlanArrays(PlanQuantities):
    """Many plans at once: the ParallelPlan attributes the cost functions read, as arrays (the derived ones
    come from PlanQuantities, as for ParallelPlan)."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp_resolved: np.ndarray
    vpp: np.ndarray
    pp_first: np.ndarray
    pp_last: np.ndarray
    sp: np.ndarray
    zero: np.ndarray
    recompute_code: np.ndarray
    micro_batch: np.ndarray
    w: Workload
    memo: dict = field(default_factory=dict, compare=False, repr=False)
    """Results the cost functions reuse within one evaluation (cost.memo.memoized); a new PlanArrays
    (take) starts empty."""
    gather_sync: np.ndarray | None = None
    """Per plan, where the search chose the synchronous weight gather (overlap_param_gather False) over the
    workload's overlapped one because it prices cheaper (search.run.sync_gather_choice); None: none chosen. The
    cost functions read the workload's value: a plan's choice reaches them through `plan` (the scalar estimate)
    and the search's evaluation of those plans with the workload's gather off."""
    pp_layers = None  # explicit per-stage lists exist for single plans only

    def __len__(self) -> int:
        return int(self.tp.shape[0])

    # Same names and meanings as ParallelPlan's fields and properties: the workload's fields and the bytes
    # per element they imply come from the Workload; the rest are arrays.
    def __getattr__(self, name: str) -> Any:
        if name in WORKLOAD_FIELDS:
            return getattr(self.w, name)
        if name in BYTES_PER_ELEMENT:
            return getattr(self.w.base, name)
        raise AttributeError(name)

    def on_distinct(self, columns: tuple[str, ...], stage: Any, f: Any) -> Any:
        """f(plans, stage) computed once per distinct row of `columns` and gathered back to every plan (a
        frozen breakdown or a tuple of arrays). Used for quantities that depend on a few axes only (the layers
        and parameters of a stage); falls back to f on every plan when `stage` is not a function of those
        columns."""
        key = ("distinct", columns)
        if key not in self.memo:
            rep, inv = distinct_rows(np.stack([getattr(self, c) for c in columns], axis=1))
            self.memo[key] = (self.take(rep), rep, inv)
        sub, rep, inv = self.memo[key]
        if np.ndim(stage):
            stage = np.asarray(stage)
            sub_stage = stage[rep]
            if not np.array_equal(sub_stage[inv], stage):
                return f(self, stage)
        else:
            sub_stage = stage
        return _gather(f(sub, sub_stage), inv)

    def seed_distinct(self, columns: tuple[str, ...], group: np.ndarray) -> None:
        """Record a grouping of the plans whose members are equal in `columns` (a group index per plan, known
        from how the plans were built), so that on_distinct(columns, ...) needs no search for distinct rows."""
        n = len(group)
        rep_of = np.full(int(group.max()) + 1 if n else 0, n, dtype=np.int64)
        rep_of[group] = np.arange(n)  # some member of each group
        used = np.flatnonzero(rep_of < n)
        slot = np.zeros(len(rep_of), dtype=np.int64)
        slot[used] = np.arange(len(used))
        rep = rep_of[used]
        self.memo[("distinct", columns)] = (self.take(rep), rep, slot[group])

    def model_copy(self, update: dict[str, Any]) -> "PlanArrays":
        """These plans with workload fields replaced (ParallelPlan.model_copy's name and meaning; the axes stay
        arrays). The memo starts empty: what it holds was computed under the old workload."""
        unknown = set(update) - WORKLOAD_FIELDS
        if unknown:
            raise TypeError(f"not workload fields: {sorted(unknown)}")
        return PlanArrays(**{f.name: getattr(self, f.name) for f in fields(self)
                             if f.name not in ("w", "memo", "gather_sync")},
                          w=Workload(**{**self.w.fields(), **update}),
                          gather_sync=None if "overlap_param_gather" in update else self.gather_sync)

    def take(self, idx: np.ndarray) -> "PlanArrays":
        """The plans at `idx`. The distinct-row groupings (on_distinct) carry over: a subset's rows map to the
        same distinct rows, so only the mapping is re-indexed (distinct rows no plan uses any more are
        harmless: their results are never gathered; when they are most of them, they are dropped, so that
        nothing is computed for them)."""
        out = PlanArrays(**{f.name: getattr(self, f.name)[idx] for f in fields(self)
                            if f.name not in ("w", "memo", "gather_sync")},
                         w=self.w, gather_sync=None if self.gather_sync is None else self.gather_sync[idx])
        idx = np.asarray(idx)
        for key, (sub, _, inv) in ((k, v) for k, v in self.memo.items() if isinstance(k, tuple) and k[0] == "distinct"):
            new_inv = inv[idx]
            present = np.zeros(len(sub), dtype=bool)
            present[new_inv] = True
            if 2 * int(present.sum()) < len(sub):  # most distinct rows unused (the rules cut their plans): drop them
                used = np.flatnonzero(present)
                slot = np.cumsum(present) - 1
                sub, new_inv = sub.take(used), slot[new_inv]
            rep = np.zeros(len(sub), dtype=np.int64)
            rep[new_inv] = np.arange(len(idx))  # a representative of each distinct row among the subset
            out.memo[key] = (sub, rep, new_inv)
        return out

    @property
    def as_plan(self) -> ParallelPlan:
        """These plans, typed as the ParallelPlan the cost functions declare: they read a plan only through
        the attributes PlanArrays gives as arrays (and PlanQuantities derives alike), so the same functions
        price one plan or many (the vectorised search's premise). A typing view only: the object is self."""
        return cast(ParallelPlan, self)

    def axes(self, i: int) -> dict[str, Any]:
        """The i-th plan's axis fields, as ParallelPlan takes them (Python ints, bools and strings)."""
        return dict(
            tp=int(self.tp[i]), pp=int(self.pp[i]), dp=int(self.dp[i]), cp=int(self.cp[i]), ep=int(self.ep[i]),
            etp=int(self.etp_resolved[i]), vpp=int(self.vpp[i]), pp_first=int(self.pp_first[i]),
            pp_last=int(self.pp_last[i]), sp=bool(self.sp[i]), zero=int(self.zero[i]),
            recompute=RECOMPUTE[int(self.recompute_code[i])], micro_batch=int(self.micro_batch[i]))

    def plan(self, i: int, settled: bool = True) -> ParallelPlan:
        """The i-th plan as a ParallelPlan (for display, export and the scalar cross-check), with the workload's
        switches that do nothing on it at their defaults (check_switches.settle; settled False: as held).
        Built by `built` where it can (about 8 us, against 60 for validation and settle): the same plan, field
        for field (tests/test_plan_build.py); else validated, as before."""
        axes = self.axes(i)
        plan = self.built(i, axes, settled)
        if plan is None:
            plan = self.w.plan(**axes)
            plan = settle(plan) if settled else plan
        if self.gather_sync is not None and self.gather_sync[i]:  # the search's choice (gather_sync)
            plan = plan.model_copy(update={"overlap_param_gather": False})
        return plan

    def built(self, i: int, axes: dict[str, Any], settled: bool) -> ParallelPlan | None:
        """Plan i copied from the workload's validated plan with its axes in place, and settled from the arrays,
        where that is the plan validation would build: ParallelPlan's field checks are per field, so each value
        of each axis column is validated once, in a whole plan (PlanBuild); its model checks, which read several
        fields, run on each plan (PlanBuild.after). None where a check fails, or the model has a validator of
        another kind: the caller validates, and meets the same error."""
        pb = self.memo.get(("plan_build",), 0)
        if isinstance(pb, int):  # the first plans of these arrays are validated (a few rows need no PlanBuild)
            if pb < VALIDATED_FIRST:
                self.memo[("plan_build",)] = pb + 1
                return None
            pb = self.memo[("plan_build",)] = PlanBuild.of(self)
        if not pb.ok:
            return None
        update = {**axes, **pb.reset(i)} if settled and pb.resets else axes
        plan = self.w.base.model_copy(update=update)
        object.__setattr__(plan, "__pydantic_fields_set__", set(pb.fields_set))
        try:
            for check in pb.after:
                check(plan)
        except (ValueError, AssertionError):  # what pydantic turns into a ValidationError
            return None
        return plan


@dataclass(frozen=True)
class PlanBuild:
    """What PlanArrays.built needs to build the arrays' plans without validating each: whether every value of
    every axis column passed ParallelPlan's validation in some whole plan (ok), the fields a validated plan
    records as set, its model checks run after the fields (pydantic 'after' model validators), and settle's
    resets as arrays (each switch of SWITCH_USES the workload sets, with the plans whose axes it acts on)."""

    ok: bool
    fields_set: frozenset[str] = frozenset()
    after: tuple[Callable[[ParallelPlan], Any], ...] = ()
    resets: tuple[tuple[np.ndarray, dict[str, Any]], ...] = ()
    unused: np.ndarray | None = None
    """Per plan, which of `resets` act on nothing there (bit k: resets[k]'s switch): settle's resets."""
    by_unused: dict[int, dict[str, Any]] = field(default_factory=dict)

    def reset(self, i: int) -> dict[str, Any]:
        """The switches settle puts back to their defaults on plan i (check_switches.unused_switches)."""
        assert self.unused is not None
        bits = int(self.unused[i])
        if bits not in self.by_unused:
            self.by_unused[bits] = {f: v for k, (_, reset) in enumerate(self.resets) if bits >> k & 1
                                    for f, v in reset.items()}
        return self.by_unused[bits]

    @classmethod
    def of(cls, a: "PlanArrays") -> "PlanBuild":
        decorators = ParallelPlan.__pydantic_decorators__
        known = ({"before", "after"} >= {d.info.mode for d in decorators.model_validators.values()}
                 and all(d.info.mode == "before" for d in decorators.field_validators.values())
                 and not (decorators.validators or decorators.root_validators))
        if not known or len(a) == 0 or any(f not in WORKLOAD_FIELDS for u in SWITCH_USES for f in u.fields):
            return cls(False)
        checked = None
        columns = {c: np.asarray(getattr(a, c)) for c in PLAN_COLUMNS}
        seen: dict[str, set] = {c: set() for c in PLAN_COLUMNS}
        for column, values in columns.items():
            _, first = np.unique(values, return_index=True)
            for row in first.tolist():  # each value in some whole plan (field checks are per field)
                if values[row].item() in seen[column]:
                    continue
                try:
                    checked = a.w.plan(**a.axes(row))
                except ValueError:  # pydantic's ValidationError is one
                    return cls(False)
                for c, v in columns.items():  # the row's values of the other columns are validated too
                    seen[c].add(v[row].item())
        assert checked is not None
        after = tuple(d.func for d in decorators.model_validators.values() if d.info.mode == "after")
        n = len(a)
        resets = tuple((np.broadcast_to(as_bool(u.uses(a)), (n,)), {f: ParallelPlan.model_fields[f].default
                                                                    for f in u.fields})
                       for u in SWITCH_USES if u.given(a.w.base))
        unused = np.zeros(n, dtype=np.int64)
        for k, (uses, _) in enumerate(resets):
            unused |= (~uses).astype(np.int64) << k
        return cls(True, frozenset(checked.model_fields_set), after, resets, unused)


VALIDATED_FIRST = 32
"""Plans of one PlanArrays built by validation before PlanBuild is made for the rest: where a caller builds a
few (the ranked rows), that costs less than validating each value of each column."""
PLAN_COLUMNS = ("tp", "pp", "dp", "cp", "ep", "etp_resolved", "vpp", "pp_first", "pp_last", "sp", "zero",
                "recompute_code", "micro_batch")
"""The PlanArrays columns PlanArrays.axes reads, one per axis field of ParallelPlan."""


def distinct_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One representative row index per distinct row of a non-negative integer matrix, and each row's index
    among the distinct rows. Each column is first coded densely through a lookup table (plan degrees are
    small numbers), so no sort is needed: linear time, unlike np.unique(axis=0)."""
    n = len(rows)
    codes = np.zeros(n, dtype=np.int64)
    radix = 1
    for col in rows.T:
        present = np.zeros(int(col.max()) + 1, dtype=np.int64)
        present[col] = 1
        dense = np.cumsum(present) - 1
        codes += dense[col] * radix
        radix *= int(dense[-1]) + 1
    if radix > 1 << 26:  # too many combinations for a lookup table
        _, rep, inv = np.unique(codes, return_index=True, return_inverse=True)
        return rep, inv.ravel()
    rep_of = np.full(radix, n, dtype=np.int64)
    rep_of[codes] = np.arange(n)  # some row of each code (rows with one code are equal: any one will do)
    used = np.flatnonzero(rep_of < n)
    slot = np.zeros(radix, dtype=np.int64)
    slot[used] = np.arange(len(used))
    return rep_of[used], slot[codes]


def _gather(value: Any, inv: np.ndarray) -> Any:
    """Every plan's element of a result computed on distinct rows: arrays indexed by `inv`; a tuple or
    frozen dataclass field by field; scalars unchanged."""
    if isinstance(value, np.ndarray) and value.ndim:
        return value[inv]
    if isinstance(value, tuple):
        return tuple(_gather(v, inv) for v in value)
    if hasattr(value, "__dataclass_fields__"):
        return type(value)(**{f.name: _gather(getattr(value, f.name), inv) for f in fields(value)})
    return value


def enumerate_plans(space: Space, cluster: ClusterSpec, w: Workload, reuse: dict | None = None) -> PlanArrays:
    """The cartesian product of the space; dp is derived as GPUs // (tp x pp x cp) (rules check it divides).
    `reuse`: a dict of earlier enumerations (by the space and the GPUs, all they read), whose axes a search of
    the same space under another workload takes as they are (its own memo, seeded alike)."""
    key = ("enumerated", repr(space), cluster.num_gpus)
    axes, groups = reuse[key] if reuse is not None and key in reuse else _product(space, cluster.num_gpus)
    if reuse is not None:
        reuse[key] = axes, groups
    plans = PlanArrays(**axes, w=w)
    for columns, group in groups.items():
        plans.seed_distinct(columns, group)
    return plans


def _product(space: Space, gpus: int) -> tuple[dict[str, np.ndarray], dict[tuple[str, ...], np.ndarray]]:
    """enumerate_plans' axes (PlanArrays' fields) and the groupings it seeds."""
    layouts = np.asarray(space.pipeline, dtype=np.int64).reshape(-1, 4)
    axes = [np.asarray(space.tp), np.arange(len(layouts)), np.asarray(space.cp), np.asarray(space.ep),
            np.asarray(space.etp),
            np.asarray(space.sp, dtype=bool), np.asarray(space.zero),
            np.asarray([RECOMPUTE.index(r) for r in space.recompute]), np.asarray(space.micro_batch)]
    grids = np.meshgrid(*axes, indexing="ij")
    cols = [g.ravel() for g in grids]
    tp, lay, cp, ep, etp, sp, zero, rc, mb = cols
    # Groups of plans known to be equal in the columns a cost function depends on (on_distinct), from each
    # plan's place in the product: the pipeline layout (params.LAYOUT_AXES), with tp, ep and etp (rank_params),
    # and every axis but the ZeRO stage (params.ALL_BUT_ZERO).
    dims = [len(a) for a in axes]
    groups = {LAYOUT_AXES: lay,
              LAYOUT_AXES + ("tp", "ep", "etp_resolved"): _combination(dims, (0, 1, 3, 4)),
              ALL_BUT_ZERO: _combination(dims, tuple(k for k in range(len(dims)) if k != 6))}
    if ETP_SAME_AS_TP in space.etp and len(space.etp) > 1:  # etp 'tp' equal to another listed degree: once
        keep = (etp != ETP_SAME_AS_TP) | ~np.isin(tp, [e for e in space.etp if e != ETP_SAME_AS_TP])
        tp, lay, cp, ep, etp, sp, zero, rc, mb = (c[keep] for c in (tp, lay, cp, ep, etp, sp, zero, rc, mb))
        groups = {k: g[keep] for k, g in groups.items()}
    pp, vpp, first, last = (layouts[lay, j] for j in range(4))
    dp = np.maximum(1, gpus // (tp * pp * cp))
    axes_of = dict(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp_resolved=resolve_etp(etp, tp), vpp=vpp, pp_first=first,
                   pp_last=last, sp=sp, zero=zero, recompute_code=rc, micro_batch=mb)
    for a in (*axes_of.values(), *groups.values()):  # shared by every search that reuses this enumeration
        a.setflags(write=False)
    return axes_of, groups


def _combination(dims: list[int], kept: tuple[int, ...]) -> np.ndarray:
    """For every element of the product of axes of lengths `dims` (C order, as np.meshgrid with indexing 'ij'
    ravels it), the index of its combination of the `kept` axes."""
    shape = [d if k in kept else 1 for k, d in enumerate(dims)]
    return np.broadcast_to(np.arange(int(np.prod(shape))).reshape(shape), dims).ravel()


def from_plan(plan: ParallelPlan) -> PlanArrays:
    """One ParallelPlan as a PlanArrays of length 1 (tests compare both paths with it)."""
    w = Workload.of(plan)
    a = lambda v: np.asarray([v])  # noqa: E731
    return PlanArrays(tp=a(plan.tp), pp=a(plan.pp), dp=a(plan.dp), cp=a(plan.cp), ep=a(plan.ep),
                      etp_resolved=a(plan.etp_resolved), vpp=a(plan.vpp), pp_first=a(plan.pp_first),
                      pp_last=a(plan.pp_last), sp=a(plan.sp), zero=a(plan.zero),
                      recompute_code=a(plan.recompute_code), micro_batch=a(plan.micro_batch), w=w)
