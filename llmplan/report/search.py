"""`llmplan search` (training): ranked plans, the Pareto front, what was pruned, why #1 wins."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table

from llmplan.cost.budget import run_budget
from llmplan.estimate import TrainingEstimate
from llmplan.report.common import (CAPPED, ReportTable, SCHEMA, capped_note, capped_text, fabric_names,
                                   flex_backend_shown, gib, power_text)
from llmplan.advice import advice_json
from llmplan.intervals import best_published_mfu, training_interval
from llmplan.report.training import advice_table, estimate_json, memory_risk, split_text, tp_overlap_note
from llmplan.search.grid import Workload
from llmplan.search.filtered import ROW_CHECKS, Side, Sides, Walk
from llmplan.search.run import DomainChoice, SearchResult, SwitchChoice, explain
from llmplan.search.hybrid import HybridChoice
from llmplan.search.ties import TIE_POOL
from llmplan.search.variants import Variants
from llmplan.specs.layout import format_layout
from llmplan.topology.placement import place
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.units import DAY, GIB



def plan_cells(p: ParallelPlan) -> list[str]:
    etp = f"/{p.etp_resolved}" if p.ep > 1 else ""
    uneven = "*" if (p.pp_first or p.pp_last or p.pp_layers) else ""
    return [str(p.tp), f"{p.pp}{uneven}", str(p.dp), str(p.cp), f"{p.ep}{etp}", f"{p.vpp}{'^' if p.pp_layout else ''}",
            "on" if p.sp else "off",
            str(p.zero), p.recompute, str(p.micro_batch)]


PLAN_HEAD = ["tp", "pp", "dp", "cp", "ep", "vpp", "sp", "zero", "recompute", "mb"]


def mfu_cell(e: TrainingEstimate) -> str:
    """MFU with its interval: '56.4 (49-56)' (percent; the interval's bounds to the nearest point); '66.8
    (61-65!)' where the interval stops at the best published MFU below the point (capped_note)."""
    iv = training_interval(e)
    lo, hi = iv["mfu"]
    mark = CAPPED if iv["point_above_ceiling"] else ""
    return f"{100 * float(e.throughput.mfu):.1f} ({100 * lo:.0f}-{100 * hi:.0f}{mark})"


def ranked_table(title: str, rows: list[TrainingEstimate], equivalents: list[int] | None = None,
                 wide: bool = False, tied_with: list[list[int]] | None = None,
                 variants: list[Variants] | None = None) -> Table:
    """The ranked plans: by default one plan string per row (fits 80 columns); wide: a column per degree.
    MFU carries its 80% interval (llmplan.intervals); '=' marks plans tied with another shown one."""
    t = ReportTable(title=title)
    plan_head = PLAN_HEAD if wide else ["plan"]
    tail = ["mem GiB", "headroom", "step s", "tokens/s", "MFU % (80%)", "bottleneck"] if wide else \
        ["GiB", "step s", "tok/s", "MFU % (80%)", "bound"]
    for col in ["#", *plan_head, *tail]:
        t.add_column(col, justify="left" if col in ("recompute", "bottleneck", "bound", "plan") else "right")
    for i, e in enumerate(rows, 1):
        m, tp = e.memory, e.throughput
        same = equivalents[i - 1] if equivalents and i <= len(equivalents) else 0
        tie = "=" if tied_with and i <= len(tied_with) and tied_with[i - 1] else ""
        rank = f"{i}{tie}" + (f" +{same}" if same else "")
        plan = plan_cells(e.plan) if wide else [plan_label(e.plan) + _marks(e)]
        nums = [gib(m.total), gib(m.headroom)] if wide else [gib(m.total)]
        t.add_row(rank, *plan, *nums, f"{float(e.time.total):,.3f}", f"{float(tp.tokens_per_s):,.0f}",
                  mfu_cell(e), e.bottleneck)
    notes = []
    uneven = [f"#{i} {split_text(e.stage_layers)}" for i, e in enumerate(rows, 1)
              if len(set(e.stage_layers)) > 1 and e.plan.pp_layout is None]
    if uneven:
        notes.append("* uneven pipeline stages (layers, first to last): " + ", ".join(uneven))
    laid = [f"#{i} {split_text([c.count('t') for c in e.plan.pp_layout])} (--pp-layout "
            f"\"{format_layout(e.plan.pp_layout)}\")" for i, e in enumerate(rows, 1) if e.plan.pp_layout is not None]
    if laid:
        notes.append("^ balanced pipeline layout, virtual chunks' layers in model order: " + ", ".join(laid))
    if equivalents and any(equivalents):
        notes.append("+N: N more plans with the same predicted throughput and memory, or the same layout at a "
                     "higher ZeRO stage (the one shown is preferred: smaller cp, lower ZeRO stage, fewer stages, "
                     "smaller micro-batch and TP)")
    if variants and any(v.count for v in variants):
        notes.append(variants_note(variants))
    if any(training_interval(e)["point_above_ceiling"] for e in rows):
        notes.append(capped_note("MFU interval"))
    if tp_note := next((n for e in rows if (n := tp_overlap_note(e.model, e.plan))), None):
        notes.append(tp_note)
    if tied_with and any(tied_with):
        ties = [f"#{i}" for i, w in enumerate(tied_with, 1) if w]
        notes.append(f"=: tied ({', '.join(ties)}): predicted within the model's resolution of another shown "
                     f"plan; among the best {TIE_POOL} layouts a more robust plan is ranked above a faster one it "
                     f"is tied with (only then; --explain says why)")
    t.caption = "\n".join(notes) or None
    return t


def spans(xs: tuple[int, ...]) -> str:
    """'2-6, 8, 10' for (2, 3, 4, 5, 6, 8, 10)."""
    out: list[str] = []
    for x in xs:
        if out and out[-1].split("-")[-1] == str(x - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{x}"
        else:
            out.append(str(x))
    return ", ".join(out)


def variants_note(variants: list[Variants]) -> str:
    """Each row is the best plan of its layout; how many other plans of it are within the resolution, with
    their interleave degrees and micro-batches where those differ: '... #1 3, #2 33 (vpp 3-6, 8, 10)'."""
    parts = []
    for i, v in enumerate(variants, 1):
        if v.near:
            what = [f"{k} {spans(xs)}" for k, xs in (("vpp", v.vpp), ("mb", v.micro_batch)) if len(xs) > 1]
            parts.append(f"#{i} {v.near}" + (f" ({'; '.join(what)})" if what else ""))
    head = ("one row per layout (tp pp dp cp ep, interleaved or not): its best plan or a more robust one tied "
            "with it; ")
    if not parts:  # no resolution (the headroom objective), or none near
        return head + f"{sum(v.count for v in variants):,} other plans of these layouts (vpp, mb, recompute, sp, ZeRO)"
    return head + "its other plans (vpp, mb, recompute, sp, ZeRO) within the resolution: " + ", ".join(parts)


def _marks(e: TrainingEstimate) -> str:
    """'^' after a plan with a pipeline layout, '*' after one with uneven stages otherwise."""
    if e.plan.pp_layout is not None:
        return "^"
    return "*" if len(set(e.stage_layers)) > 1 else ""


def plan_label(p: ParallelPlan) -> str:
    """The plan in one short string: degrees above 1, ZeRO stage, recompute, micro-batch."""
    ep = f" ep{p.ep}" + (f"/etp{p.etp_resolved}" if p.etp_resolved != p.tp else "") if p.ep > 1 else ""
    return (f"tp{p.tp}" + (" sp" if p.sp and p.tp > 1 else "") + f" pp{p.pp} dp{p.dp}"
            + (f" cp{p.cp}" if p.cp > 1 else "") + ep + (f" vpp{p.vpp}" if p.vpp > 1 else "")
            + (" layout" if p.pp_layout is not None else "") + f" zero{p.zero} {p.recompute} mb{p.micro_batch}")


def explain_line(a: TrainingEstimate, b: TrainingEstimate, what: str) -> str:
    """One line: a's throughput against b's and the three largest step-time differences."""
    d = explain(a, b)
    parts = sorted(((k, v) for k, v in d.items() if k.endswith("_s") and k != "step_s" and abs(v) > 1e-9),
                   key=lambda kv: -abs(kv[1]))[:3]
    why = ", ".join(f"{k[:-2].replace('exposed_', 'exposed ')} {v:+.3g} s" for k, v in parts)
    return (f"#1 vs {what} ({plan_label(b.plan)}): {d['throughput_ratio']:.2f}x the throughput"
            + (f"; {why}" if why else "") + f"; memory {d['memory_bytes'] / GIB:+.1f} GiB")


def without_cp(res: SearchResult) -> TrainingEstimate | None:
    """The search's best plan without context parallelism, where #1 runs CP (SearchResult.without_cp)."""
    if not res.ranked or res.without_cp is None or res.ranked[0].plan.cp == 1:
        return None
    return res.without_cp


def without_cp_line(a: TrainingEstimate, b: TrainingEstimate) -> str:
    """Why #1 runs context parallelism: explain_line against the best plan without it, and, where that plan
    recomputes more or halves its micro-batch count per pipeline, what CP buys: its s/cp activations let #1
    skip the recompute, and its dp / cp replicas run cp times the micro-batches each (a smaller bubble)."""
    why = []
    if a.plan.recompute != b.plan.recompute:
        why.append(f"without CP the best plan recomputes {b.plan.recompute}, #1 {a.plan.recompute}")
    if a.plan.num_microbatches > b.plan.num_microbatches and a.plan.pp > 1:
        why.append(f"#1 runs {a.plan.num_microbatches} micro-batches per pipeline, it {b.plan.num_microbatches}")
    return explain_line(a, b, "best without CP") + (f" ({'; '.join(why)})" if why else "")


def with_ep(res: SearchResult) -> TrainingEstimate | None:
    """The search's best plan with expert parallelism, where #1 runs an MoE model at ep 1 (SearchResult.with_ep)."""
    if not res.ranked or res.with_ep is None or res.ranked[0].plan.ep > 1:
        return None
    return res.with_ep


def moved_gb(e: TrainingEstimate, axis: str) -> str:
    """'812 GB (dp 790)': the bus bytes one GPU moves per step over all axes, and over `axis`, in GB."""
    a = e.comm.axes.get(axis)
    return f"{e.comm.bytes / 1e9:,.0f} GB ({axis} {(a.bytes if a is not None else 0.0) / 1e9:,.0f})"


def with_ep_line(a: TrainingEstimate, b: TrainingEstimate, resolution: float | None = None,
                 rule: str | None = None) -> str:
    """Why #1 runs an MoE model without expert parallelism: explain_line against the best plan with it, the
    bytes each GPU moves per step (every expert's weights gathered and its gradients reduced over dp at ep 1,
    ZeRO-3 each micro-batch; tokens sent to the experts' ranks with EP), and, where #1 is the slower of the two
    but within the model's resolution, the tie rule that put #1 first (`rule`, search.ties: the rule against the
    plan ranked next, which need not be this one)."""
    zero = f"ZeRO-{a.plan.zero} " if a.plan.zero else ""
    gap = math.log(float(b.throughput.tokens_per_s) / float(a.throughput.tokens_per_s))
    tied = (f"; tied within {log_percent(resolution):.0f}%, #1 first: {rule or 'the tie rule'}"
            if resolution is not None and 0 < gap <= resolution else "")
    return (explain_line(a, b, "best with EP") + f" (per GPU per step #1's {zero}moves {moved_gb(a, 'dp')}, "
            f"it {moved_gb(b, 'ep')}{tied})")


def wide_ep(res: SearchResult) -> TrainingEstimate | None:
    """The search's best plan with a smaller TP and a wider EP than #1, where #1 runs TP beside an EP group inside
    one NVLink domain (SearchResult.wide_ep)."""
    return res.wide_ep if res.ranked else None


def wide_ep_line(a: TrainingEstimate, b: TrainingEstimate, cluster: ClusterSpec) -> str:
    """Why #1 runs TP beside an EP group inside one NVLink domain, not the published MoE runs' kind (less TP, a
    wider EP): explain_line against the best such plan, where each EP group runs, how the wider one's all-to-alls
    were priced (the dispatcher; overlapped or not: the published wide-EP runs use DeepEP and hide the all-to-alls
    behind compute, and the flags that price that), and, where they differ, the recompute and the micro-batches
    per pipeline (the bubble)."""
    up, down = fabric_names(cluster.system)
    q = b.plan
    mine, its = place(a.plan.degrees, cluster)["ep"], place(q.degrees, cluster)["ep"]
    overlap = ("overlapped by DualPipe" if q.pp_schedule == "dualpipe"
               else "overlapped" if q.ep_comm_overlap else "not overlapped")
    why = [f"#1's ep {a.plan.ep} on {mine.describe(up, down)}, its ep {q.ep} on {its.describe(up, down)}, "
           f"{q.moe_dispatcher} dispatch {overlap}"]
    flags = [f for f, on in (("--moe-dispatcher deepep", q.moe_dispatcher == "alltoall"),
                             ("--ep-comm-overlap", not q.ep_comm_overlap and q.pp_schedule != "dualpipe")) if on]
    domain, span = cluster.system.domain_gpus, q.etp_resolved * q.ep  # an EP group's consecutive ranks
    if its.uses_nic and cluster.system.gpus_per_node < domain and span <= domain and domain % span:
        why.append(f"{span} does not divide the {domain}-GPU NVLink domain: some groups straddle two "
                   f"(--domain-gpus {1 << (domain.bit_length() - 1)})")
    if its.uses_nic and flags:
        why.append(f"the published wide-EP runs dispatch with DeepEP, some overlapped: {', '.join(flags)}")
    if a.plan.recompute != q.recompute:
        why.append(f"it recomputes {q.recompute}, #1 {a.plan.recompute}")
    if a.plan.num_microbatches != q.num_microbatches and a.plan.pp > 1:
        why.append(f"#1 runs {a.plan.num_microbatches} micro-batches per pipeline, it {q.num_microbatches}")
    return explain_line(a, b, "best with wider EP") + f" ({'; '.join(why)})"


def usual(res: SearchResult) -> TrainingEstimate | None:
    """The best plan of the kind the published recipes run, where #1 differs from it on a structural axis
    (SearchResult.usual)."""
    return res.usual if res.ranked else None


def dp_calls(e: TrainingEstimate) -> float:
    """Data-parallel collectives one GPU issues per step (every call of the dp axis's transfers)."""
    a = e.comm.axes.get("dp")
    return float(sum(float(t.calls) for t in a.transfers)) if a is not None else 0.0


def usual_why(a: TrainingEstimate, b: TrainingEstimate, cluster: ClusterSpec) -> list[str]:
    """Why #1's unusual layout stands against the usual one (usual_line), as short clauses: for a sharded #1
    without a pipeline across NVLink domains, what it moves and how often against the usual plan's once-a-step
    reduction; for a narrow EP group, where each EP group runs; and the micro-batches per pipeline."""
    up, down = fabric_names(cluster.system)
    p, q = a.plan, b.plan
    mine, its = place(p.degrees, cluster), place(q.degrees, cluster)
    why = []
    if p.zero >= 2 and p.pp == 1 and mine["dpcp"].uses_nic:
        what = "weights and gradients" if p.zero == 3 else "gradients"
        why.append(f"#1 shards its {what} every micro-batch (ZeRO-{p.zero}, no pipeline) over dp x cp "
                   f"{p.dp * p.cp:,} on {mine['dpcp'].domains} NVLink domains: {dp_calls(a):,.0f} DP calls a "
                   f"step, {moved_gb(a, 'dp')}, {float(a.time.exposed['dp']):.3g} s exposed; it, ZeRO-{q.zero} "
                   f"pp {q.pp}, {dp_calls(b):,.0f} calls, {moved_gb(b, 'dp')}")
    if p.ep != q.ep and p.ep > 1:
        why.append(f"#1's ep {p.ep} on {mine['ep'].describe(up, down)}, its ep {q.ep} on "
                   f"{its['ep'].describe(up, down)}")
    if a.plan.num_microbatches != q.num_microbatches and q.pp > 1:
        why.append(f"#1 runs {p.num_microbatches} micro-batches per pipeline, it {q.num_microbatches}")
    return why


def usual_line(a: TrainingEstimate, b: TrainingEstimate, cluster: ClusterSpec) -> str:
    """Why #1 runs a layout the published recipes do not (ZeRO-3 without a pipeline over NVLink domains, or an
    EP group narrower than its domain): explain_line against the best plan of the usual kind, and usual_why."""
    why = usual_why(a, b, cluster)
    return explain_line(a, b, "best usual layout") + (f" ({'; '.join(why)})" if why else "")


def explain_table(a: TrainingEstimate, b: TrainingEstimate, what: str) -> Table:
    t = ReportTable(title=f"Why #1 ({plan_label(a.plan)}) beats {what} ({plan_label(b.plan)})")
    t.add_column("part")
    t.add_column("#1 s", justify="right")
    t.add_column(f"{what} s", justify="right")
    t.add_column("difference", justify="right")
    rows = [("compute", a.time.compute, b.time.compute), ("bubble", a.time.bubble, b.time.bubble),
            *((f"exposed {k}", a.time.exposed[k], b.time.exposed[k]) for k in a.time.exposed),
            ("optimizer", a.time.optimizer, b.time.optimizer), ("step", a.time.total, b.time.total)]
    for name, x, y in rows:
        if float(x) or float(y):
            t.add_row(name, f"{float(x):,.3f}", f"{float(y):,.3f}", f"{float(x - y):+,.3f}")
    t.add_row("memory GiB", gib(a.memory.total), gib(b.memory.total),
              f"{float(a.memory.total - b.memory.total) / GIB:+,.2f}")
    return t


def pruned_table(res: SearchResult) -> Table:
    t = ReportTable(title=f"Pruned: {res.considered - res.feasible:,} of {res.considered:,} plans")
    t.add_column("rule")
    t.add_column("plans cut", justify="right")
    t.add_column("example")
    for p in res.pruned:
        t.add_row(p.rule, f"{p.count:,}", p.example)
    return t


def budget_json(e: TrainingEstimate, train_tokens: float) -> dict[str, Any]:
    share = float(e.goodput.useful) if e.goodput is not None else 1.0
    run = run_budget(train_tokens, float(e.throughput.tokens_per_s), share, e.cluster.num_gpus)
    seconds, wall = run.seconds, run.effective_seconds  # wall: failures, checkpoints and restarts (cost.goodput)
    lo, hi = training_interval(e)["tokens_per_s"]
    days = [train_tokens / hi / DAY, train_tokens / lo / DAY]
    return {"train_tokens": train_tokens, "time_to_train_s": seconds, "time_to_train_days": seconds / DAY,
            "gpu_hours": run.gpu_hours, "goodput": share, "effective_time_to_train_s": wall,
            "effective_time_to_train_days": wall / DAY, "effective_gpu_hours": run.effective_gpu_hours,
            "time_to_train_days_interval": days, "gpu_hours_interval": [d * 24 * e.cluster.num_gpus for d in days],
            "effective_time_to_train_days_interval": [d / share if share > 0 else float("inf") for d in days]}


def log_percent(x: float) -> float:
    """A |log| ratio of two rates (a tie resolution, two plans' gap) as the percent one exceeds the other."""
    return 100 * (math.exp(x) - 1)


TIE_POOL_RULE = (f"ties are decided among the {TIE_POOL} best layouts (same tp, pp, dp, cp, ep, interleaved or "
                 "not; each placed by its best plan), whatever --top is; rows below them follow in predicted order")


def target_json(target: str | None, dropped: int, walk: Walk | None = None,
                sides: Sides | None = None, walks: tuple[tuple[Workload, ClusterSpec, Walk], ...] = (),
                shown: int | None = None) -> dict[str, Any]:
    """The keys a targeted search adds to its JSON (none without --target): the target, the better-ranked plans
    dropped as not exportable and, for a training search, what its walk over the plans did (search.filtered),
    every walk the command ran (one per switch setting and NVLink-domain share searched: `target_walks`, the
    one at position `shown` marked: SearchResult.walk_index) and how the Pareto front, the comparisons and the
    rows' counts were kept to accepted plans (sides)."""
    if not target:
        return {}
    return {"target": target, "not_exportable": dropped,
            **({"target_walk": walk_json(walk)} if walk is not None else {}),
            **({"target_walks": [{**walk_held(w, c), "shown": i == shown, **walk_json(k)}
                                  for i, (w, c, k) in enumerate(walks)]}
               if walks else {}),
            **({"target_sides": sides_json(sides)} if sides is not None else {})}


def walk_held(w: Workload, cluster: ClusterSpec) -> dict[str, Any]:
    """What one search of a targeted command held, as `target_walks` names it: the switches the command tries in
    turn and the NVLink-domain share (its GPUs)."""
    return {"grad_dtype": w.grad_dtype, "fp8_params": w.fp8_params, "fp8_scaling": w.fp8_scaling,
            "domain_gpus": cluster.system.domain_gpus, "gpus": cluster.num_gpus}


def walk_json(walk: Walk) -> dict[str, Any]:
    """What one walk over the plans did (search.filtered.Walk)."""
    return {"checked": walk.checked, "refused": walk.refused, "other_plan_of_layout": list(walk.other_plan),
            "complete": walk.complete, "limit": walk.limit, "walk_s": walk.seconds, "passed": walk.passed}


def side_json(s: Side | None) -> dict[str, Any] | None:
    return None if s is None else {"status": s.status, "checked": s.checked, "complete": s.complete,
                                   "refused_every": s.refused_every}


def sides_json(s: Sides) -> dict[str, Any]:
    """What `target_sides` holds: each side output's walk over accepted plans (search.filtered.Sides)."""
    return {"pareto": {"checked": s.pareto_checked, "complete": s.pareto_complete},
            "conventional": side_json(s.conventional), "without_cp": side_json(s.without_cp),
            "with_ep": side_json(s.with_ep), "counts_checked": s.recount_checked,
            "counts_limit_per_row": ROW_CHECKS, "counts_upper_bound": list(s.upper_bound), "sides_s": s.seconds}


def refused_sides_json(s: Sides | None) -> dict[str, None]:
    """With a target: the comparison keys set to null where the target accepts no plan for them (the conventional
    plan refused; no plan without CP, or with EP, accepted), so that no refused plan stands there."""
    if s is None:
        return {}
    return {k: None for k, side in (("conventional", s.conventional), ("without_cp", s.without_cp),
                                    ("with_ep", s.with_ep)) if side is not None and side.status != "accepted"}


def missing_side_line(target: str, what: str, s: Side | None) -> str | None:
    """'no plan without CP that torchtitan accepts' (of the plans asked, where the walk stopped early), or,
    for the conventional plan, that the target refuses it, or that it refuses every plan of the comparison (none
    asked); None where the comparison shows an accepted plan."""
    if s is None or s.status == "accepted":
        return None
    if s.refused_plan is not None:
        return f"{what} ({plan_label(s.refused_plan)}): {target} refuses it; not compared"
    if s.refused_every is not None:
        return f"no plan {what} that {target} accepts, none asked: it refuses every one ({s.refused_every})"
    return f"no plan {what} that {target} accepts" + ("" if s.complete else f" (of the first {s.checked:,} asked)")


def exports_json(exports: dict[str, str | None] | None) -> dict[str, Any]:
    """Without --target (SearchResult.exports): the targets whose export writes #1, in export.TARGETS order, and the
    refusal of each other one; {} where not asked."""
    if exports is None:
        return {}
    return {"best_exports_to": [t for t, why in exports.items() if why is None],
            "best_refusals": {t: why for t, why in exports.items() if why is not None}}


def exports_lines(exports: dict[str, str | None] | None) -> list[str]:
    """The table's note on which targets write #1 (exports_json); with none, each target's refusal, so that an
    unexportable #1 is never shown without saying so."""
    if exports is None:
        return []
    ok = [t for t, why in exports.items() if why is None]
    if ok:
        no = [t for t in exports if t not in ok]
        return [f"#1 exports to {', '.join(ok)}" + (f"; not to {', '.join(no)} (search --target NAME for the best "
                                                     "plan NAME writes)" if no else "")]
    return ["#1 exports to no target; search --target NAME for the best plan NAME writes:",
            *(f"  {why}" for why in dict.fromkeys(exports.values()) if why)]  # torchrun / slurm: a wrapped one's


def target_lines(target: str, dropped: int, walk: Walk | None = None, sides: Sides | None = None,
                 unit: str = "plans") -> list[str]:
    """'target torchtitan: 12 better-ranked plans dropped as not exportable', then which rows show another plan
    of their layout than the untargeted search and, when it stopped early, where the walk stopped (`unit`: what
    it walks, plans or serving layouts); then that the side outputs hold accepted plans only (sides)."""
    out = [f"target {target}: {dropped:,} better-ranked plan{'s' if dropped != 1 else ''} dropped as not "
           "exportable"]
    if walk is not None and walk.other_plan:
        rows = f"row{'s' if len(walk.other_plan) > 1 else ''} {spans(walk.other_plan)}"
        out.append(f"  {rows}: another plan of the layout (a better one is refused)")
    if walk is not None and not walk.complete:
        out.append(f"  the walk stopped after asking about {walk.checked:,} {unit} (at most {walk.limit:,})")
        out.append(f"    {walk.refused:,} of them refused")  # lines of their own: 80 columns
        if walk.passed:
            out.append(f"    passed over {walk.passed:,} that {target} refuses whole")
    if sides is not None:
        out.append(f"  +N, variants, Pareto front, comparisons: plans {target} accepts only")
        if not sides.pareto_complete:
            out.append(f"  the Pareto front's walk stopped after asking about {sides.pareto_checked:,} plans")
        if sides.upper_bound:
            out.append(f"  +N and variants of #{spans(sides.upper_bound)}: upper bounds (at most {ROW_CHECKS} "
                       "plans of a layout asked)")
    return out


def ties_json(res: SearchResult) -> dict[str, Any]:
    """The tie resolution and, for each adjacent tied pair, the rule that ranked the upper one first."""
    return {"resolution": res.resolution, "pool": TIE_POOL, "pool_rule": TIE_POOL_RULE,
            "resolution_percent": log_percent(res.resolution) if res.resolution is not None else None,
            "decided": [{"upper": n.upper, "lower": n.lower, "apart_percent": log_percent(n.apart),
                         "rule": n.rule, "lower_shown": n.lower <= len(res.ranked)} for n in res.tie_notes],
            "fastest_above_first_percent": fastest_above_first(res)}


def fastest_above_first(res: SearchResult) -> float | None:
    """How much faster (%, by the objective's score) the fastest plan the shown search found is than the #1 shown,
    which the tie rules put above it (search.ties); None where #1 is the fastest or ties are not resolved."""
    from llmplan.search.layouts import score

    if res.resolution is None or not res.ranked:
        return None
    first = score(res.ranked[0], res.objective)
    if first <= 0 or res.top_score <= first * (1 + 1e-6):
        return None
    return log_percent(math.log(res.top_score / first))


def faster_tied_line(res: SearchResult) -> str | None:
    """Where the rows shown leave out the faster plan the tie rules put #1 above (--top 1, say): that it exists and
    how much faster it is, so that --top does not hide the choice (the table's = marks and caption say it where
    #1 is tied with another row shown)."""
    pct = fastest_above_first(res)
    if pct is None or (len(res.ranked) > 1 and any(res.tied_with[:1])):
        return None
    v = res.variants[0] if res.variants else None
    pct_res = log_percent(res.resolution or 0.0)
    if v is not None and v.best >= res.top_score * (1 - 1e-6):  # search.variants.robust_pick chose within the layout
        return (f"tie: a plan of #1's layout {pct:.1f}% faster than #1, within the model's resolution "
                f"({pct_res:.1f}%), is ranked below it: #1 is the layout's more robust plan (memory tier, lower ZeRO "
                "stage, less recompute)")
    return (f"tie: a plan {pct:.1f}% faster than #1, within the model's resolution ({pct_res:.1f}%), is ranked below "
            f"it by the tie rules; --top {TIE_POOL} --explain shows the tied rows and the rules that decided")


def variant_json(v: Variants) -> dict[str, Any]:
    return {"count": v.count, "within_resolution": v.near, "vpp": list(v.vpp), "micro_batch": list(v.micro_batch),
            "farthest_within_percent": log_percent(v.worst), "layout_best_score": v.best}


def tie_lines(res: SearchResult) -> list[str]:
    """'#1 and #2 are tied (0.1% apart, resolution 11.0%); #1 preferred: fewer parallel axes (3 vs 4)',
    after the rule that bounds the pool the ties are decided in."""
    if res.resolution is None:
        return []
    pct = log_percent(res.resolution)
    shown = len(res.ranked)
    return [TIE_POOL_RULE] * bool(res.tie_notes) + [
        f"#{n.upper} and #{n.lower}{' (not shown)' if n.lower > shown else ''} are tied ({log_percent(n.apart):.1f}% "
        f"apart, resolution {pct:.1f}%); #{n.upper} preferred: {n.rule}" for n in res.tie_notes]


def search_json(res: SearchResult, w: Workload, cluster: ClusterSpec, model: ModelSpec,
                train_tokens: float, advice: list | None = None) -> dict[str, Any]:
    return {
        "schema": SCHEMA, "mode": "train", "model": model.name, "hardware": cluster.system.name,
        "nodes": cluster.num_nodes, "gpus": cluster.num_gpus, "objective": res.objective,
        "workload": {"global_batch": w.global_batch, "seq_len": w.seq_len, "dtype": w.dtype},
        "considered": res.considered, "feasible": res.feasible,
        "pruned": {p.rule: p.count for p in res.pruned},
        "pruned_examples": {p.rule: p.example for p in res.pruned},
        "search_s": res.seconds,
        "warnings": [w for w in (ceiling_warning(res.ranked[0], cluster),) if w] if res.ranked else [],
        "plans": [{"rank": i, **estimate_json(e), "budget": budget_json(e, train_tokens),
                   "equivalent": res.equivalents[i - 1] if i <= len(res.equivalents) else 0,
                   "tied_with": res.tied_with[i - 1] if i <= len(res.tied_with) else [],
                   **({"variants": variant_json(res.variants[i - 1])} if i <= len(res.variants) else {})}
                  for i, e in enumerate(res.ranked, 1)],
        "ties": ties_json(res),
        **({"conventional": estimate_json(res.conventional)} if res.conventional else {}),
        **({"without_cp": estimate_json(without)} if (without := without_cp(res)) is not None else {}),
        **({"with_ep": estimate_json(ep_best)} if (ep_best := with_ep(res)) is not None else {}),
        **({"wide_ep": estimate_json(wider)} if (wider := wide_ep(res)) is not None else {}),
        **({"usual_layout": estimate_json(usual_e), "usual_layout_why": usual_why(res.ranked[0], usual_e, cluster)}
           if (usual_e := usual(res)) is not None else {}),
        **({"advice": advice_json(advice)} if advice is not None else {}),
        **({"explain": {**({"vs_second": explain(res.ranked[0], res.ranked[1])} if len(res.ranked) > 1 else {}),
                        **({"vs_conventional": explain(res.ranked[0], res.conventional)} if res.conventional else {}),
                        **({"vs_without_cp": explain(res.ranked[0], without)} if without is not None else {}),
                        **({"vs_with_ep": explain(res.ranked[0], ep_best)} if ep_best is not None else {}),
                        **({"vs_wide_ep": explain(res.ranked[0], wider)} if wider is not None else {}),
                        **({"vs_usual_layout": explain(res.ranked[0], usual_e)} if usual_e is not None else {})}}
           if res.ranked else {}),
        "pareto": [estimate_json(e) for e in res.pareto],
        **({"domain": domain_json(res.domain)} if res.domain is not None else {}),
        **({"switches": switches_json(res.switches)} if res.switches is not None else {}),
        **({"hybrid_sharding": hybrid_json(res.hybrid)} if res.hybrid is not None else {}),
        **({"closest": estimate_json(res.closest), "suggestions": res.suggestions} if res.closest else {}),
        **refused_sides_json(res.sides),
        **target_json(res.target, res.not_exportable, res.walk, res.sides, res.walks, res.walk_index),
        **exports_json(res.exports),
    }


def ceiling_warning(e: TrainingEstimate, cluster: ClusterSpec) -> str | None:
    """A warning when the plan's predicted MFU is above the best published on its GPU in the plan's format
    (bf16; fp8 and fp4 against the bf16 peak, as MFU is reported)."""
    gpu, fmt = cluster.system.gpu, e.plan.dtype
    best = best_published_mfu(gpu, fmt)
    mfu = float(e.throughput.mfu)
    if best is None or mfu <= best:
        return None
    lo, hi = training_interval(e)["mfu"]
    return (f"predicted MFU {100 * mfu:.1f}% is above the best published {fmt} MFU on {gpu.name} "
            f"({100 * best:.1f}%): likely a modelling artefact until measured; read it as an upper bound. Its 80% "
            f"interval is capped there: {100 * lo:.1f}-{100 * hi:.1f}%")


def interval_line(e: TrainingEstimate) -> str:
    """#1's 80% interval on step time, tokens/s and memory, and what it rests on."""
    iv = training_interval(e)
    (slo, shi), (tlo, thi) = iv["step_s"], iv["tokens_per_s"]
    mem = iv["memory_bytes"]
    memory = f", memory {mem[0] / GIB:,.1f}-{mem[1] / GIB:,.1f} GiB{memory_risk(e, mem)}" if mem else ""
    return (f"80% interval of #1: step {slo:,.2f}-{shi:,.2f} s, {tlo:,.0f}-{thi:,.0f} tok/s{capped_text(iv)}"
            f"{memory}; from {iv['summary']}")


def placement_line(e: TrainingEstimate, cluster: ClusterSpec) -> str:
    """Which of the best plan's axes stay on the scale-up fabric (NVLink domain) and which cross the
    network: the reason TP / EP / CP sit where they do."""
    spans = place(e.plan.degrees, cluster, e.order)  # in the order it was priced in (--axis-order)
    domain = cluster.system.domain_gpus
    inside = [f"{a} {spans[a].size}" for a in ("tp", "cp", "ep", "pp", "dpcp")
              if spans[a].size > 1 and not spans[a].uses_nic]
    across = [f"{a} {spans[a].size}" for a in ("tp", "cp", "ep", "pp", "dpcp") if spans[a].uses_nic]
    where = f"one {domain}-GPU NVLink domain" if domain > cluster.system.gpus_per_node else "one node's NVLink"
    return (f"placement: {', '.join(inside) or 'no axis'} inside {where}; "
            f"{', '.join(across) or 'none'} across the network").replace("dpcp", "dp x cp")


def domain_line(d: DomainChoice) -> str:
    """Which share of each NVLink domain the shown plans use, against the other one tried."""
    other = d.full if d.used != d.full else min(d.gpus)
    rate = lambda n: f"{d.tokens_per_s[n]:,.0f} tok/s" if d.tokens_per_s[n] > 0 else "no plan"
    return (f"domain: {d.used} of each {d.full}-GPU NVLink domain ({d.gpus[d.used]:,} GPUs, "
            f"{rate(d.used)}) beats {other} of {d.full} ({d.gpus[other]:,} GPUs, {rate(other)}); "
            "--domain-gpus pins it")


def domain_json(d: DomainChoice) -> dict[str, Any]:
    return {"domain_gpus": d.full, "used_per_domain": d.used,
            "tried": [{"per_domain": k, "gpus": d.gpus[k], "tokens_per_s": d.tokens_per_s[k]} for k in sorted(d.gpus)]}


def switches_line(s: SwitchChoice) -> str:
    """Which memory switches the shown plans use, out of those tried."""
    on = [f"gradient buffers {s.chosen['grad_dtype']}",
          f"low-precision primary weights {'on' if s.chosen['fp8_params'] else 'off'}"]
    flags = ["--grad-dtype", "--fp8-params"]
    if "fp8_scaling" in s.chosen:  # tried under a target (search.run.switch_variants)
        on.append(f"fp8 {s.chosen['fp8_scaling']} scaling")
        flags.append("--fp8-scaling")
    if "softmax_kernel" in s.chosen:  # tried without fused attention under a target (search.run.switch_variants)
        on.append(f"softmax kernel {s.chosen['softmax_kernel']}")
        flags.append("--softmax-kernel")
    if "moe_dispatcher" in s.chosen:  # tried on MoE plans with ep > 1 (search.run.dispatcher_variants)
        on.append(f"MoE dispatcher {dispatcher_text(s.chosen)}")
        flags += ["--moe-dispatcher", "--moe-flex-backend"]
    if "ep_comm_overlap" in s.chosen:  # tried on MoE plans with ep > 1 (search.run.ep_overlap_variants)
        on.append(f"EP comm overlap {'on' if s.chosen['ep_comm_overlap'] else 'off'}")
        flags.append("--ep-comm-overlap")
    if "cp_comm_type" in s.chosen:  # tried where CP's masks allow several (search.variants.cp_comm_settings)
        size = f" (a2a level {s.chosen.get('cp_a2a_size')})" if s.chosen["cp_comm_type"] == "a2a+p2p" else ""
        on.append(f"CP comm {s.chosen['cp_comm_type']}{size}")
        flags += ["--cp-comm-type", "--cp-a2a-size"]
    if "tp_comm_overlap" in s.chosen:  # tried where the overlap prices slower (cli.search, step.ub_loses)
        on.append(f"TP comm overlap {'on' if s.chosen['tp_comm_overlap'] else 'off'}")
        flags.append("--tp-comm-overlap")
    if "megatron_fsdp" in s.chosen:  # on where only Megatron runs the setting's ZeRO-2 / 3 (cli.search as_run)
        on.append(f"ZeRO-2/3 as Megatron-FSDP {'on' if s.chosen['megatron_fsdp'] else 'off'}")
        flags.append("--megatron-fsdp")
    pins = f"{' / '.join(flags)} pin them"
    return f"switches: {', '.join(on)} (best of {len(s.tried)} settings tried; {pins})"


def dispatcher_text(setting: dict[str, Any]) -> str:
    """A dispatcher setting in Megatron's words: alltoall, or the flex dispatcher with its backend."""
    if setting["moe_dispatcher"] != "deepep":
        return str(setting["moe_dispatcher"])
    backend = setting['moe_flex_backend']
    return f"flex/{backend} (--moe-dispatcher deepep --moe-flex-backend {backend})"


def hybrid_line(h: HybridChoice) -> str:
    """What the hybrid-sharding pass (search.hybrid) priced on the shown setting's rows and what #1 runs."""
    done = [t for t in h.tried if t.outcome != "dp hidden"]
    rows = len({t.rank for t in done})
    priced = f"{len(done)} variant{'s' if len(done) != 1 else ''} priced on {rows} row{'s' if rows != 1 else ''}"
    if not done:
        return ("hybrid sharding: not priced (the exposed data-parallel time it could save is within the tie "
                "resolution, or would not bring a row level with #1); --dp-replicate pins it")
    if h.first is not None:
        r, outer = h.first
        across = " (optimizer sharded across the replicas)" if outer else ""
        return f"hybrid sharding: #1 runs dp-replicate {r}{across} ({priced}); --dp-replicate 1 turns it off"
    fit = [t for t in done if t.tokens_per_s > 0]
    if not fit:
        return f"hybrid sharding: {priced}, none fits; --dp-replicate pins it"
    b = max(fit, key=lambda t: t.tokens_per_s / t.row_tokens_per_s)
    return (f"hybrid sharding: {priced}, none shown; best #{b.rank} at dp-replicate {b.dp_replicate}"
            f"{' (optimizer across)' if b.dp_outer_optimizer else ''}, "
            f"{100 * (b.tokens_per_s / b.row_tokens_per_s - 1):+.1f}% "
            f"({b.outcome}); --dp-replicate pins it")


def hybrid_json(h: HybridChoice) -> dict[str, Any]:
    return {"first": None if h.first is None else {"dp_replicate": h.first[0], "dp_outer_optimizer": h.first[1]},
            "tried": [{"rank": t.rank, "dp_replicate": t.dp_replicate, "dp_outer_optimizer": t.dp_outer_optimizer,
                       "tokens_per_s": t.tokens_per_s, "row_tokens_per_s": t.row_tokens_per_s, "outcome": t.outcome}
                      for t in h.tried]}


def switches_json(s: SwitchChoice) -> dict[str, Any]:
    return {**flex_backend_shown(s.chosen),
            "tried": [{**flex_backend_shown(v), "score": score} for v, score in s.tried]}


def search_view(console: Console, res: SearchResult, w: Workload, cluster: ClusterSpec, model: ModelSpec,
                train_tokens: float, full_explain: bool = False, advice: list | None = None,
                wide: bool = False) -> None:
    console.print(f"[bold]{model.name}[/] on {cluster.num_nodes} x {cluster.system.name} ({cluster.num_gpus} GPUs"
                  f"{power_text(cluster)}): "
                  f"global batch {w.global_batch:,} x {w.seq_len:,} tokens, {w.dtype}"
                  f"{', optimizer muon' if w.optimizer == 'muon' else ''}; objective {res.objective}")
    console.print(f"evaluated {res.considered:,} plans in {res.seconds:.2f} s; {res.feasible:,} fit")
    if res.ranked:
        console.print(ranked_table("Best plans", res.ranked, res.equivalents, wide, res.tied_with, res.variants))
        if (tie := faster_tied_line(res)) is not None:
            console.print(tie)
        b = budget_json(res.ranked[0], train_tokens)
        (dlo, dhi), (hlo, hhi) = b["time_to_train_days_interval"], b["gpu_hours_interval"]
        cap = capped_text(training_interval(res.ranked[0]))  # the point is faster than its capped interval
        console.print(f"best plan: {train_tokens / 1e12:g}T tokens in {b['time_to_train_days']:,.1f} days "
                      f"({dlo:,.1f}-{dhi:,.1f}{cap}), {b['gpu_hours']:,.0f} GPU-hours ({hlo:,.0f}-{hhi:,.0f}; 80% "
                      "intervals)")
        (elo, ehi) = b["effective_time_to_train_days_interval"]
        console.print(f"  at {100 * b['goodput']:.1f}% goodput ({res.ranked[0].checkpoint.mode} checkpoints): "
                      f"{b['effective_time_to_train_days']:,.1f} days ({elo:,.1f}-{ehi:,.1f}{cap})", highlight=False)
        console.print(interval_line(res.ranked[0]))
        best = res.ranked[0]
        console.print(placement_line(best, cluster))
        if res.domain is not None:
            console.print(domain_line(res.domain))
        if res.switches is not None:
            console.print(switches_line(res.switches))
        if res.hybrid is not None:
            console.print(hybrid_line(res.hybrid), highlight=False)
        warning = ceiling_warning(best, cluster)
        if warning:
            console.print(f"[yellow]warning:[/] {warning}")
        if res.conventional is not None and res.conventional.plan != best.plan:
            console.print(explain_line(best, res.conventional, "conventional"))
        without = without_cp(res)
        if without is not None:
            console.print(without_cp_line(best, without))
        ep_best = with_ep(res)
        if ep_best is not None:
            console.print(with_ep_line(best, ep_best, res.resolution,
                                       next((f"{n.rule}, against #{n.lower}" for n in res.tie_notes
                                             if n.upper == 1), None)))
        wider = wide_ep(res)
        if wider is not None:
            console.print(wide_ep_line(best, wider, cluster))
        usual_e = usual(res)
        if usual_e is not None:
            console.print(usual_line(best, usual_e, cluster))
        if res.sides is not None and res.target is not None:  # a comparison with no plan the target accepts
            for what, side in (("conventional plan", res.sides.conventional), ("without CP", res.sides.without_cp),
                               ("with EP", res.sides.with_ep)):
                line = missing_side_line(res.target, what, side)
                if line:
                    console.print(line, highlight=False)
        if full_explain:
            for line in tie_lines(res):
                console.print(line)
            if len(res.ranked) > 1:
                console.print(explain_table(best, res.ranked[1], "#2"))
            if res.conventional is not None:
                console.print(explain_table(best, res.conventional, "conventional"))
            if without is not None:
                console.print(explain_table(best, without, "best without CP"))
            if ep_best is not None:
                console.print(explain_table(best, ep_best, "best with EP"))
            if wider is not None:
                console.print(explain_table(best, wider, "best with wider EP"))
            if usual_e is not None:
                console.print(explain_table(best, usual_e, "best usual layout"))
            if advice:
                console.print(advice_table(advice, float(best.throughput.tokens_per_s)))
        console.print(ranked_table("Pareto front: throughput vs memory headroom (plans within 2x of the best)",
                                   res.pareto, wide=wide))
    console.print(pruned_table(res))
    if res.closest is not None:
        e = res.closest
        cells = " ".join(f"{h} {c}" for h, c in zip(PLAN_HEAD, plan_cells(e.plan), strict=True))
        console.print(f"[bold red]NO PLAN FITS[/]. Closest: {cells} "
                      f"needs {gib(e.memory.total)} of {gib(e.memory.capacity)} GiB per GPU.")
        console.print("It would fit with: " + "; ".join(res.suggestions))
    if res.target is not None:
        for line in target_lines(res.target, res.not_exportable, res.walk, res.sides):
            console.print(line, highlight=False)
    for line in exports_lines(res.exports):
        console.print(line, highlight=False)


def search_points(res: SearchResult) -> dict[str, Any]:
    """What a saved search keeps for `llmplan report`'s scatter: a sample of the plans that fit, the Pareto
    front and #1 (tokens/s and headroom bytes)."""
    def point(e: TrainingEstimate) -> dict[str, Any]:
        return {"plan": plan_label(e.plan), "tokens_per_s": float(e.throughput.tokens_per_s),
                "headroom": float(e.memory.headroom)}

    return {"cloud": [[float(t), float(h)] for t, h in res.cloud], "pareto": [point(e) for e in res.pareto],
            **({"best": point(res.ranked[0])} if res.ranked else {})}

