"""`llmplan report`: one self-contained HTML page of a saved plan, with matplotlib figures inlined as SVG.

Each figure is a <figure id=...> whose data-values attribute holds, as JSON, the numbers it plots (bytes and
seconds, as in the plan's JSON), so that a test or a tool can check the picture against the prediction.
matplotlib is an optional dependency (`pip install 'llmplan[report]'`).
"""

from __future__ import annotations

import html
import io
import json
from typing import Any

from llmplan.cost.schedule import ORDERS
from llmplan.cost.step import layout_chunk_shares
from llmplan.errors import LlmplanError
from llmplan.estimate import ScalePoint, StageView, TrainingEstimate
from llmplan.report.common import counted
from llmplan.report.search import plan_label
from llmplan.specs.schedule import SCHEDULES, Schedule, schedule_of
from llmplan.units import GIB

MEMORY_PARTS = ("weights", "gradients", "optimizer", "activations", "other")
COLORS = {"weights": "#4c72b0", "gradients": "#55a868", "optimizer": "#c44e52", "activations": "#8172b2",
          "other": "#999999", "kv_cache": "#dd8452", "forward": "#4c72b0", "backward": "#dd8452",
          "backward-input": "#dd8452", "backward-weight": "#55a868"}


def _figure(width: float, height: float) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise LlmplanError("llmplan report draws with matplotlib, which is not installed; "
                           "pip install 'llmplan[report]'") from None
    return Figure(figsize=(width, height), layout="constrained")


def _svg(fig: Any) -> str:
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "llmplan"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog and doctype: the SVG sits inside HTML


MAX_DRAWN_STAGES = 48
"""Most pipeline stages a figure draws one by one (bars, schedule rows): beyond it the memory figure draws the
stages as stacked areas and the schedule draws evenly spaced stages, first and last included, so that a
pp 1000 plan is a readable picture drawn in seconds, not 1,000 rows of bars."""
MAX_SCHEDULE_SLOTS = 20_000
"""Most forward/backward slots the schedule figure simulates (2 x stages x chunks per micro-batch): fewer
micro-batches are drawn when the pipeline is deep, and the figure's data says how many."""


def drawn_stages(p: int) -> list[int]:
    """The stages a figure draws: all of them up to MAX_DRAWN_STAGES, else evenly spaced ones, first and last
    included."""
    if p <= MAX_DRAWN_STAGES:
        return list(range(p))
    return sorted({round(k * (p - 1) / (MAX_DRAWN_STAGES - 1)) for k in range(MAX_DRAWN_STAGES)})


def memory_figure(stages: list[StageView], capacity: float) -> tuple[Any, dict]:
    """Memory per GPU of every pipeline stage, stacked by part, against the GPU's capacity (stacked areas when
    there are more stages than MAX_DRAWN_STAGES bars)."""
    fig = _figure(7.5, 3.2)
    ax = fig.add_subplot()
    x = list(range(len(stages)))
    parts = {part: [float(getattr(s.memory, part)) / GIB for s in stages] for part in MEMORY_PARTS}
    if len(stages) <= MAX_DRAWN_STAGES:
        bottom = [0.0] * len(stages)
        for part, vals in parts.items():
            ax.bar(x, vals, bottom=bottom, color=COLORS[part], label=part)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ax.set_xticks(x, [f"{s.stage}\n{s.layers}L" for s in stages] if len(stages) <= 16
                      else [str(s.stage) for s in stages])
    else:
        ax.stackplot(x, *parts.values(), colors=[COLORS[p] for p in parts], labels=list(parts), step="mid")
    ax.axhline(capacity / GIB, color="black", linestyle="--", linewidth=1, label="capacity")
    ax.set_xlabel("pipeline stage (layers)")
    ax.set_ylabel("GiB per GPU")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    data = {"capacity": capacity,
            "stages": [{"stage": s.stage, "layers": s.layers, **{p: float(getattr(s.memory, p)) for p in MEMORY_PARTS},
                        "total": float(s.memory.total)} for s in stages]}
    return fig, data


def schedule_figure(stages: list[StageView], microbatches: int, vpp: int,
                    chunk_share: list[list[float]] | None = None, schedule: Schedule = SCHEDULES["1f1b"]
                    ) -> tuple[Any, dict]:
    """The pipeline schedule of one step as it runs (schedule.drawing's slot order: 1F1B, ZB-H1's split
    backward, DualPipe's two directions), drawn for its first micro-batches (two rounds of p where
    MAX_SCHEDULE_SLOTS allows, fewer in a deep pipeline; DualPipe at least its 2p) and for drawn_stages'
    stages; chunk_share: each stage's split of its time over its chunks (a custom pipeline layout's)."""
    p = len(stages)
    shown = min(microbatches, max(2 * p, 4))
    if vpp > 1 and shown % p:  # interleaving groups micro-batches by p
        shown = min(microbatches, shown + p - shown % p)
    shown = max(1, min(shown, MAX_SCHEDULE_SLOTS // (2 * p * vpp)))
    slots = ORDERS[schedule.drawing]([s.forward_s for s in stages], [s.backward_s for s in stages], shown, vpp,
                                     chunk_share)
    shown = len({s.microbatch for s in slots})
    rows = drawn_stages(p)
    row_of = {stage: r for r, stage in enumerate(rows)}
    fig = _figure(7.5, min(0.3 * len(rows), 6.0) + 1.2)
    ax = fig.add_subplot()
    groups: dict[tuple[str, int, int], list[tuple[float, float]]] = {}  # one bar collection per kind, chunk, row
    busy = [0.0] * p
    for s in slots:
        busy[s.stage] += s.end - s.start
        if s.stage in row_of:
            groups.setdefault((s.kind, s.chunk, row_of[s.stage]), []).append((s.start, s.end - s.start))
    chunks = max(vpp, 1 + max(s.chunk for s in slots))  # DualPipe: its two directions
    for (kind, chunk, row), bars in groups.items():
        shade = 1.0 - 0.5 * chunk / max(chunks - 1, 1)
        ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=COLORS[kind], alpha=shade, edgecolor="white",
                       linewidth=0.3, rasterized=len(slots) > 400)  # many slots: a bitmap inside the SVG
    if len(slots) <= 160:
        for s in slots:
            ax.text((s.start + s.end) / 2, row_of[s.stage], str(s.microbatch + 1), ha="center", va="center",
                    fontsize=6, color="white")
    makespan = max(s.end for s in slots)
    ax.set_yticks(range(len(rows)), [f"stage {i}" for i in rows] if len(rows) <= 16 else [str(i) for i in rows])
    ax.invert_yaxis()
    split = any(s.kind == "backward-weight" for s in slots)
    ax.set_xlabel("seconds (forward blue, backward orange" + (", weight green" if split else "")
                  + (", lighter: later chunks" if vpp > 1 else ", lighter: reverse pipe" if chunks > 1 else "")
                  + ("; gaps: bubble)" if split else "; gaps are the bubble)"))
    ax.set_xlim(0, makespan)
    data = {"microbatches": microbatches, "microbatches_shown": shown, "vpp": vpp, "makespan_s": makespan,
            "drawing": schedule.drawing,
            "stages_shown": len(rows), "stages": p,
            "bubble_s": [makespan - b for b in busy], "forward_s": [s.forward_s for s in stages],
            "backward_s": [s.backward_s for s in stages]}
    return fig, data


def step_figure(e: TrainingEstimate) -> tuple[Any, dict]:
    """Step time by part: compute, pipeline bubble, exposed communication per axis, optimizer, overhead."""
    t = e.time
    parts = {"compute": t.compute, "bubble": t.bubble, **{f"exposed {k}": v for k, v in t.exposed.items()},
             "optimizer": t.optimizer, "overhead": t.overhead}
    parts = {k: float(v) for k, v in parts.items()}
    fig = _figure(7.5, 2.8)
    ax = fig.add_subplot()
    names = list(parts)
    ax.barh(names, [parts[k] for k in names], color=["#4c72b0", "#999999"] + ["#c44e52"] * len(t.exposed)
            + ["#55a868", "#8172b2"])
    ax.invert_yaxis()
    ax.set_xlabel(f"seconds per step (total {float(t.total):.3f} s)")
    return fig, {"parts_s": parts, "step_s": float(t.total)}


def comm_figure(e: TrainingEstimate) -> tuple[Any, dict]:
    """Bytes each GPU sends per step on every parallel axis, and their time before overlap."""
    data = {k: {"bytes": float(v.bytes), "seconds": float(v.seconds)} for k, v in e.comm.axes.items()}
    fig = _figure(7.5, 2.6)
    left, right = fig.subplots(1, 2)
    names = list(data)
    left.bar(names, [data[k]["bytes"] / GIB for k in names], color="#4c72b0")
    left.set_ylabel("GiB sent per GPU per step")
    right.bar(names, [data[k]["seconds"] for k in names], color="#c44e52")
    right.set_ylabel("seconds (before overlap)")
    return fig, {"axes": data}


def goodput_figure(points: list[ScalePoint], gpus: int) -> tuple[Any, dict]:
    """Goodput and the tokens/s that survive failures against the GPU count (data parallelism scaled): where
    adding GPUs stops paying."""
    fig = _figure(7.5, 3.2)
    left = fig.add_subplot()
    x = [p.gpus for p in points]
    left.plot(x, [100 * p.goodput for p in points], "o-", color="#c44e52", label="goodput")
    left.set_xscale("log", base=2)
    left.set_xlabel("GPUs (data parallelism scaled; the dashed line: this plan)")
    left.set_ylabel("goodput, % of wall-clock time", color="#c44e52")
    left.axvline(gpus, color="black", linestyle="--", linewidth=1)
    right = left.twinx()
    right.plot(x, [p.tokens_per_s for p in points], ":", color="#4c72b0", label="tokens/s without failures")
    right.plot(x, [p.effective_tokens_per_s for p in points], "s-", color="#4c72b0", markersize=4,
               label="tokens/s x goodput")
    right.set_ylabel("tokens/s", color="#4c72b0")
    right.legend(fontsize=8, loc="center left")
    data = {"plan_gpus": gpus, "points": [{"gpus": p.gpus, "goodput": p.goodput, "tokens_per_s": p.tokens_per_s,
                                           "effective_tokens_per_s": p.effective_tokens_per_s,
                                           "mtbf_s": p.mtbf_s if p.mtbf_s != float("inf") else None}
                                          for p in points]}
    return fig, data


def scatter_figure(points: dict) -> tuple[Any, dict]:
    """Throughput against memory headroom of the search's feasible plans, the Pareto front marked."""
    fig = _figure(7.5, 3.4)
    ax = fig.add_subplot()
    cloud = points.get("cloud", [])
    if cloud:
        ax.scatter([h / GIB for _, h in cloud], [t for t, _ in cloud], s=6, color="#bbbbbb", label="plans that fit",
                   rasterized=len(cloud) > 500)
    front = points.get("pareto", [])
    ax.plot([p["headroom"] / GIB for p in front], [p["tokens_per_s"] for p in front], "o-", color="#c44e52",
            markersize=4, label="Pareto front")
    best = points.get("best")
    if best:
        ax.scatter([best["headroom"] / GIB], [best["tokens_per_s"]], marker="*", s=120, color="black", label="#1",
                   zorder=3)
    ax.set_xlabel("memory headroom per GPU, GiB")
    ax.set_ylabel("tokens/s")
    ax.legend(fontsize=8)
    return fig, points


def load_figure(curve: list, batch: int, ttft_slo: float | None, tpot_slo: float | None,
                slo_batch: int | None) -> tuple[Any, dict]:
    """Throughput per GPU against concurrency per replica (left) and against TPOT (right), from 1 sequence to
    what the KV cache admits: the SLO lines dashed (the SLOs' largest concurrency on the left, the TPOT SLO on
    the right), the points that miss an SLO hollow, the plan's own batch a star."""
    fig = _figure(7.5, 3.2)
    left, right = fig.subplots(1, 2, sharey=True)
    x = [p.concurrency for p in curve]
    y = [p.tokens_per_s_per_gpu for p in curve]
    tpot_ms = [1e3 * p.tpot_s for p in curve]
    ok = [p.meets_slos for p in curve]
    slos = ttft_slo is not None or tpot_slo is not None
    for ax, xs in ((left, x), (right, tpot_ms)):
        ax.plot(xs, y, "-", color="#4c72b0", linewidth=1)
        ax.scatter([a for a, k in zip(xs, ok, strict=True) if k], [b for b, k in zip(y, ok, strict=True) if k],
                   s=10, color="#4c72b0",
                   label="meets the SLOs" if slos and ax is left else None)
        if not all(ok):
            ax.scatter([a for a, k in zip(xs, ok, strict=True) if not k],
                       [b for b, k in zip(y, ok, strict=True) if not k], s=10,
                       facecolors="none", edgecolors="#c44e52", label="misses an SLO" if ax is left else None)
    here = next((p for p in curve if p.concurrency == batch), None)
    if here is not None:
        left.scatter([here.concurrency], [here.tokens_per_s_per_gpu], marker="*", s=120, color="black", zorder=3,
                     label=f"this plan ({batch})")
        right.scatter([1e3 * here.tpot_s], [here.tokens_per_s_per_gpu], marker="*", s=120, color="black", zorder=3)
    if slo_batch:
        left.axvline(slo_batch, color="black", linestyle="--", linewidth=1, label=f"SLO limit ({slo_batch})")
    if tpot_slo is not None:
        right.axvline(1e3 * tpot_slo, color="black", linestyle="--", linewidth=1, label="TPOT SLO")
    left.set_xscale("log", base=2)
    left.set_xlabel("concurrent sequences per replica")
    left.set_ylabel("output tokens/s per GPU")
    right.set_xlabel("TPOT, ms")
    left.legend(fontsize=7, loc="upper left")
    if tpot_slo is not None:
        right.legend(fontsize=7, loc="lower right")
    data = {"batch": batch, "ttft_slo_s": ttft_slo, "tpot_slo_s": tpot_slo, "slo_batch": slo_batch,
            "points": [{"concurrency": p.concurrency, "ttft_s": p.ttft_s, "tpot_s": p.tpot_s,
                        "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu, "meets_slos": p.meets_slos} for p in curve]}
    return fig, data


def _section(fid: str, title: str, fig: Any, data: dict, caption: str) -> str:
    values = html.escape(json.dumps(data, allow_nan=False), quote=True)
    return (f'<figure id="{fid}" data-values="{values}">\n<h2>{html.escape(title)}</h2>\n{_svg(fig)}\n'
            f"<figcaption>{html.escape(caption)}</figcaption>\n</figure>\n")


def training_report(e: TrainingEstimate, stages: list[StageView], search_points: dict | None = None,
                    scaling: list[ScalePoint] | None = None) -> str:
    """The HTML page of a training plan: memory per stage, schedule, step parts, communication, and the
    search's throughput/headroom scatter when the plan came from a search."""
    p = e.plan
    share = layout_chunk_shares(e.model, p, e.cluster.system.gpu)[0] if p.pp_layout is not None else None
    schedule = schedule_figure(stages, int(p.num_microbatches), p.vpp, share, schedule_of(p))
    sections = [
        _section("memory", "Memory per GPU, by pipeline stage", *memory_figure(stages, float(e.memory.capacity)),
                 f"Most-loaded stage {int(e.memory.stage)}: {float(e.memory.total) / GIB:.2f} of "
                 f"{float(e.memory.capacity) / GIB:.2f} GiB."),
        _section("schedule", "Pipeline schedule", *schedule,
                 f"{p.pp} stages, {counted(int(p.num_microbatches), 'micro-batch', 'micro-batches')} per step ("
                 + (f"the first {schedule[1]['microbatches_shown']} drawn"
                    if schedule[1]["microbatches_shown"] <= p.num_microbatches else
                    f"drawn with {schedule[1]['microbatches_shown']}, the fewest {schedule_of(p).title} runs")
                 + (f"; {schedule[1]['stages_shown']} of the {p.pp} stages drawn, evenly spaced" if
                    schedule[1]["stages_shown"] < p.pp else "") + "), "
                 f"{'interleaved over ' + str(p.vpp) + ' chunks' if p.vpp > 1 else schedule_of(p).caption}; "
                 "point-to-point "
                 "transfers not drawn."),
        _section("step", "Step time by part", *step_figure(e),
                 f"{float(e.throughput.tokens_per_s):,.0f} tokens/s, MFU {100 * float(e.throughput.mfu):.1f}%, "
                 f"bottleneck {e.bottleneck}."),
        _section("comm", "Communication per axis", *comm_figure(e),
                 "What each GPU sends per step and how long it takes on its links; the step model hides part of it."),
    ]
    if scaling and e.goodput is not None:
        best = max(scaling, key=lambda p: p.effective_tokens_per_s)
        sections.append(_section("goodput", "Goodput against GPU count", *goodput_figure(scaling, e.cluster.num_gpus),
                                 f"{100 * float(e.goodput.useful):.1f}% goodput at {e.cluster.num_gpus:,} GPUs "
                                 f"({e.checkpoint.mode} checkpoints); of the scales drawn, {best.gpus:,} GPUs train "
                                 "the most tokens per second after failures, checkpoints and restarts."))
    if search_points:
        sections.append(_section("pareto", "Throughput vs memory headroom (search)", *scatter_figure(search_points),
                                 "Every plan the search kept (a sample when there are many), its Pareto front, "
                                 "and #1."))
    title = (f"{e.model.name} on {e.cluster.num_nodes} x {e.cluster.system.name}: {plan_label(p)}"
             f" optimizer {p.optimizer}")  # the switches the plan is priced with; Muon changes memory and step
    return _page(title, sections)


def serving_report(e: Any, curve: list | None = None) -> str:
    """The HTML page of a serving plan: memory per GPU by part, the latencies against the SLOs, and with its
    load curve (serving.load_curve) the throughput per GPU against concurrency and against TPOT."""
    mem, t, p, j = e.memory, e.timing, e.plan, e.job
    parts = {k: float(getattr(mem, k)) for k in ("weights", "kv_cache", "activations", "other")}
    fig = _figure(7.5, 1.8)
    ax = fig.add_subplot()
    left = 0.0
    for k, v in parts.items():
        ax.barh(["GPU"], [v / GIB], left=[left], color=COLORS.get(k, "#999999"), label=k.replace("_", " "))
        left += v / GIB
    ax.axvline(float(mem.capacity) / GIB, color="black", linestyle="--", linewidth=1, label="capacity")
    ax.set_xlabel("GiB per GPU")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    memory = {**parts, "total": float(mem.total), "capacity": float(mem.capacity)}
    lat = {"ttft_s": float(t.ttft), "tpot_s": float(t.tpot), "e2e_s": float(t.e2e)}
    fig2 = _figure(7.5, 2.2)
    ax2 = fig2.add_subplot()
    ax2.barh(["TTFT", "TPOT", "end to end"], list(lat.values()), color=["#4c72b0", "#dd8452", "#999999"])
    for y, slo in ((0, j.ttft_slo_s), (1, j.tpot_slo_s)):
        if slo is not None:
            ax2.plot([slo, slo], [y - 0.4, y + 0.4], color="black", linestyle="--")
    ax2.set_xscale("log")
    ax2.set_xlabel("seconds (dashed: SLO)")
    ax2.invert_yaxis()
    sections = [
        _section("memory", "Memory per GPU", fig, memory, f"{j.batch:,} concurrent sequences per replica; the KV cache "
                 f"holds {mem.max_concurrent_seqs:,} sequences of {j.context:,} tokens."),
        _section("latency", "Latency", fig2, {**lat, "ttft_slo_s": j.ttft_slo_s, "tpot_slo_s": j.tpot_slo_s},
                 f"{e.tokens_per_s:,.0f} output tokens/s over {p.dp} replica(s)."),
    ]
    if curve:
        slo = (f"; the SLOs allow up to {e.slo_batch:,} per replica, "
               f"{e.slo_tokens_per_s / p.num_gpus:,.0f} tokens/s per GPU" if e.slo_batch else
               "; no concurrency meets the SLOs" if e.slo_batch == 0 else "")
        sections.append(_section(
            "load", "Throughput per GPU against concurrency and TPOT",
            *load_figure(curve, j.batch, j.ttft_slo_s, j.tpot_slo_s, e.slo_batch),
            f"From 1 to {curve[-1].concurrency:,} concurrent sequences per replica (what the KV cache admits); "
            f"this plan runs {j.batch:,} at {e.tokens_per_s / p.num_gpus:,.0f} tokens/s per GPU{slo}."))
    return _page(f"{e.model.name} serving on {e.cluster.num_nodes} x {e.cluster.system.name}: {p.describe()}",
                 sections)


def _page(title: str, sections: list[str]) -> str:
    style = ("body{font-family:sans-serif;max-width:60em;margin:2em auto;color:#222}"
             "figure{margin:2em 0}svg{max-width:100%;height:auto}figcaption{color:#555}")
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{html.escape(title)}"
            f"</title>\n<style>{style}</style>\n</head>\n<body>\n<h1>{html.escape(title)}</h1>\n"
            + "".join(sections) + "<p>Made by llmplan report.</p>\n</body>\n</html>\n")
