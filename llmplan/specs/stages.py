"""The pipeline-stage arithmetic of a plan and the predicates and messages of check_plan's pipeline rules
(the uneven split, virtual stages, the schedule's micro-batches and pp multiple, a pp_layout's Megatron-LM
rules). The rules themselves are in specs/check_pipeline.py and their order in specs/check.py (RULES), which
re-exports these names.
Each predicate is arithmetic only, so it holds for one ParallelPlan and, elementwise, for plan arrays."""

from __future__ import annotations

from typing import Any

from llmplan.arith import maximum, where
from llmplan.errors import LlmplanError, bounded_list
from llmplan.specs.layout import balanced_layout, format_layout
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan, has_layout
from llmplan.specs.schedule import SCHEDULES, schedule_of


def divisors(n: int) -> list[int]:
    """The divisors of n in increasing order, in O(sqrt n)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def balanced_split(L: int, p: int) -> tuple[int, int]:
    """(first, last) stage layers of the balanced uneven split of L layers over p stages: every middle stage
    holds ceil(L/p) layers and the first and last stages, which carry the embedding and the loss, share the
    rest (the last one the fewer); (0, 0) when p divides L. Callers keep p <= L.
    Derived: docs/formulas.md#pipeline.split"""
    if L % p == 0 or p == 1:
        return 0, 0
    if p == 2:
        return L - L // 2, L // 2
    mid = -(-L // p)
    rest = L - (p - 2) * mid
    if rest < 2:  # ceil leaves too little for the ends: middle stages take floor(L/p), the ends the surplus
        mid = L // p
        rest = L - (p - 2) * mid
    return rest - rest // 2, rest // 2


def accounted_split(m: ModelSpec, pp: int, embedding: bool, loss: bool) -> tuple[int, int]:
    """(first, last) stage layers under Megatron's --account-for-embedding-in-pipeline-split /
    --account-for-loss-in-pipeline-split: the embedding and the loss each count as one layer, the L + e + l
    units split evenly over pp stages, and the stage carrying each gives up one transformer layer.
    Source: Megatron-LM arguments.py (validate_args requires pp to divide the accounted layers)."""
    L = m.num_hidden_layers
    units = L + int(embedding) + int(loss)
    if not (embedding or loss):
        return 0, 0
    if pp < 2 or units % pp:
        valid = [p for p in divisors(units) if 1 < p <= L]
        counted = " and ".join(x for x, on in (("the embedding", embedding), ("the loss", loss)) if on)
        raise LlmplanError(f"with {counted} counted as layers, pp ({pp}) must divide num_hidden_layers + "
                           f"{units - L} ({units}) of {m.name}; valid pp: {bounded_list(valid)}")
    per = units // pp
    return (per - 1 if embedding else 0), (per - 1 if loss else 0)


def split_text(m: ModelSpec, p: int) -> str:
    """A valid way to give the layers of `m` to p stages, as flags (for error messages)."""
    L = m.num_hidden_layers
    if p > L:
        return f"use at most {L} stages"
    f, l = balanced_split(L, p)
    if not f:
        return f"pp {p} splits the {L} layers evenly"
    middle = (L - f - l) // (p - 2) if p > 2 else 0
    rest = f" ({middle} on each of the other {p - 2} stages)" if p > 2 else ""
    return f"--pp-first-layers {f} --pp-last-layers {l}{rest}"


def split_ok(m: ModelSpec, p: Any) -> Any:
    """The stage layer counts add up to the layers, with at least one layer on every stage."""
    L = m.num_hidden_layers
    if has_layout(p):
        return True  # rule pp_layout holds a layout's own rules
    if getattr(p, "pp_layers", None) is not None:
        return sum(p.pp_layers) == L and min(p.pp_layers) >= 1
    f, l = p.pp_first, p.pp_last
    middle = pinned_split(L, p.pp, f, l)[1]
    rest = L - f - l
    pinned_ok = ((f == 0) & (l == 0)) | (p.pp > 1)
    return pinned_ok & (p.pp <= L) & (rest >= middle) & (
        ((middle == 0) & (rest == 0)) | ((middle > 0) & (rest % (middle + (middle == 0)) == 0)))


def split_message(m: ModelSpec, p: ParallelPlan) -> str:
    L = m.num_hidden_layers
    if p.pp > L:
        return (f"pp ({p.pp}) exceeds num_hidden_layers ({L}) of {m.name}: a stage needs at least one layer; "
                f"use pp <= {L}")
    example = split_text(m, p.pp)
    if p.pp_layers is not None:
        got = bounded_list(p.pp_layers, sep="+")
        why = ("a stage has no layer" if min(p.pp_layers) < 1 else f"they sum to {sum(p.pp_layers)}")
        return (f"--pp-layers {bounded_list(p.pp_layers, sep=',')}: the {p.pp} stage layer counts ({got}) must "
                f"sum to num_hidden_layers ({L}) of {m.name} with at least 1 layer per stage, but {why}; "
                f"for example {example}")
    if (p.pp_first or p.pp_last) and p.pp == 1:
        return "--pp-first-layers / --pp-last-layers need pp > 1; drop them or raise --pp"
    if p.pp_first or p.pp_last:
        middle = p.pp - (p.pp_first > 0) - (p.pp_last > 0)
        return (f"pp_first {p.pp_first} and pp_last {p.pp_last} leave {L - p.pp_first - p.pp_last} of the {L} "
                f"layers of {m.name} for {middle} other stage(s), which must share them evenly (at least one "
                f"each); for example {example}")
    return (f"pp ({p.pp}) does not divide num_hidden_layers ({L}) of {m.name}: give an uneven split, for example "
            f"{example}, --pp-layers with one count per stage, or (estimate) --pp-layout balanced; even "
            f"splits: pp in {bounded_list(divisors(L))}")


def pinned_split(L: int, pp: Any, first: Any, last: Any) -> tuple[tuple[Any, Any, Any], Any]:
    """((first, middle, last) stage layer counts, number of middle stages) of L layers over pp stages with the
    first and last stage pinned to `first` and `last` layers (0 pins nothing); the other stages share the rest
    evenly. Arithmetic only: one plan's numbers or, elementwise, plan arrays.
    Source: Megatron-LM arguments.py (--decoder-first/last-pipeline-num-layers; validate_args checks that the
    remaining layers divide the remaining stages)."""
    middle = pp - where(first > 0, 1, 0) - where(last > 0, 1, 0)
    mid = (L - first - last) // maximum(middle, 1)
    return (where(first > 0, first, mid), mid, where(last > 0, last, mid)), middle


def stage_counts(m: ModelSpec, p: Any) -> tuple[tuple[Any, Any, Any], Any]:
    """(first, middle, last) stage layer counts of a plan's first/last split, and the number of middle stages."""
    return pinned_split(m.num_hidden_layers, p.pp, p.pp_first, p.pp_last)


def vpp_fits(first: Any, mid: Any, last: Any, middle: Any, v: Any) -> Any:
    """Whether v virtual stages split every stage: the middle stages evenly; the first and last evenly or one
    layer short, the embedding / the loss taking that slot in their outer virtual stage (Megatron's
    --account-for-embedding/loss-in-pipeline-split with interleaving)."""
    def end(x: Any) -> Any:
        return (x % v == 0) | ((x + 1) % v == 0)
    return end(first) & end(last) & ((middle == 0) | (mid % v == 0))


def vpp_ok(m: ModelSpec, p: Any) -> Any:
    if has_layout(p):
        return True  # the layout sets every chunk (rule pp_layout: its chunks are pp x vpp)
    if getattr(p, "pp_layers", None) is not None:
        counts = p.pp_layers
        return (all(n % p.vpp == 0 for n in counts[1:-1]) and bool(vpp_fits(counts[0], counts[0], counts[-1], 0, p.vpp))
                if len(counts) > 1 else counts[0] % p.vpp == 0)
    (first, mid, last), middle = stage_counts(m, p)
    return vpp_fits(first, mid, last, middle, p.vpp)


def interleaving_schedules() -> str:
    """The --pp-schedule names that interleave (for the fix of a non-interleaving schedule with vpp > 1)."""
    return " or ".join(name for name, s in SCHEDULES.items() if s.interleaves)


def schedule_microbatches_ok(p: ParallelPlan) -> Any:
    """Micro-batches per step meet the schedule's floor (a multiple of pp) and multiple (DualPipe: even, >= 2 pp)."""
    s, n = schedule_of(p), p.num_microbatches
    return (n >= s.min_microbatches_per_stage * p.pp) & (n % s.microbatch_multiple == 0)


def schedule_microbatches_message(p: ParallelPlan) -> str:
    """The step has too few or an odd number of micro-batches for its schedule: the values and the fix."""
    s, n = schedule_of(p), p.num_microbatches
    least = max(s.min_microbatches_per_stage * p.pp, s.microbatch_multiple)
    even = "an even number of " if s.microbatch_multiple == 2 else ""
    return (f"the {s.title} schedule needs {even}micro-batches per step, at least "
            f"{s.min_microbatches_per_stage} x pp ({p.pp}) = {least}; global_batch / (micro_batch x dp) = "
            f"{p.global_batch} / ({p.micro_batch} x {p.dp}) gives {n}: make it "
            f"{even.replace(' of ', '')}{' ' if even else ''}{least} or more with --global-batch or --micro-batch")


def pp_multiple_message(p: ParallelPlan) -> str:
    """pp is not a multiple of what the plan's schedule needs: why, and the nearest valid pp either side."""
    k = schedule_of(p).pp_multiple
    below, above = p.pp - p.pp % k, p.pp + k - p.pp % k
    need = "even" if k == 2 else f"a multiple of {k}"
    return (f"{schedule_of(p).pp_multiple_reason}, so pp ({p.pp}) must be {need}; valid pp: "
            f"{max(below, k)}, {above}")


def vpp_message(m: ModelSpec, p: ParallelPlan) -> str:
    if p.pp_layers is not None:
        counts = sorted(set(p.pp_layers))
    else:
        (first, mid, last), middle = stage_counts(m, p)
        counts = sorted({first, last} | ({mid} if middle else set()))
    valid = [v for v in range(1, max(counts) + 1) if vpp_ok(m, p.model_copy(update={"vpp": v}))]
    return (f"vpp ({p.vpp}) must divide the layers of every pipeline stage of {m.name} (the first and last may be "
            f"one short, for the embedding and the loss) ({bounded_list(counts)} layers per stage with "
            f"pp {p.pp}); valid vpp: {bounded_list(valid)}, or place every chunk: estimate --pp-layout balanced "
            f"(here \"{format_layout(balanced_layout(m.num_hidden_layers, p.pp, p.vpp, m.num_nextn_predict_layers))}"
            f"\")")


def no_interleave_fix(p: Any) -> str:
    """How to run the plan without virtual stages: --vpp 1, or with a pp_layout (whose chunks set vpp) a layout
    of one chunk per stage."""
    if has_layout(p):
        return f"give a --pp-layout of pp ({p.pp}) chunks, one per stage"
    return "--vpp 1"


def layout_problem(m: ModelSpec, p: Any) -> str | None:
    """The first of Megatron-LM's rules a pp_layout breaks, as one line (None: it keeps them all).
    Source: Megatron-LM megatron/training/arguments.py (chunks divisible by pp) and PipelineParallelLayerLayout
    .validate_layer_layout (megatron/core/transformer/pipeline_parallel_layer_layout.py at d98e8a6)."""
    chunks = getattr(p, "pp_layout", None)
    if chunks is None:
        return None
    n, pp, v = len(chunks), p.pp, p.vpp
    flat = "".join(chunks)
    t, mtp, mtp_want = flat.count("t"), flat.count("m"), m.num_nextn_predict_layers
    head = f"pp_layout ({n} chunks, pp {pp}, vpp {v})"
    with_m = [k for k, c in enumerate(chunks) if "m" in c]
    fix = None
    if n != pp * v:
        fix = (f"has {n} chunks but pp x vpp is {pp} x {v} = {pp * v} (chunk k runs on rank k mod pp); "
               + (f"use --vpp {n // pp}" if n % pp == 0 else f"give a multiple of {pp} chunks"))
    elif not flat.startswith("E") or flat.count("E") != 1:
        fix = f"must begin with the embedding E and hold it once (it holds {flat.count('E')}); e.g. start it with 'Et'"
    elif not flat.endswith("L") or flat.count("L") != 1:
        fix = f"must end with the loss L and hold it once (it holds {flat.count('L')}); e.g. end it with 'tL'"
    elif t != m.num_hidden_layers:
        fix = (f"holds {t} transformer layers (t) but {m.name} has num_hidden_layers {m.num_hidden_layers}; "
               f"{'add' if t < m.num_hidden_layers else 'remove'} {abs(m.num_hidden_layers - t)} t")
    elif mtp != mtp_want:
        fix = (f"holds {mtp} MTP layers (m) but {m.name} trains {mtp_want} (num_nextn_predict_layers, or "
               "--mtp-layers); "
               + (f"put {'m' * mtp_want} before the final L" if mtp_want else "drop the m symbols"))
    elif mtp and "t" in flat[flat.index("m"):]:
        fix = "places a transformer layer (t) after an MTP layer (m); MTP layers follow every decoder layer"
    elif mtp and (len(with_m) > 1 or with_m[0] // pp != v - 1):
        fix = (f"puts MTP layers in chunk(s) {', '.join(map(str, with_m))}; Megatron-LM wants all of them in one "
               f"chunk that is its rank's last (chunk index >= {(v - 1) * pp})")
    return f"{head} {fix}" if fix else None
