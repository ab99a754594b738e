"""What to change next: the few single changes to a plan with the highest predicted return for its bottleneck,
each evaluated by the same cost model and given as the flags that make it (`estimate` text and `"advice"` in
JSON; `search --explain`). Training: compute-, memory-, communication- and pipeline-bound changes; serving:
TTFT-, TPOT- and capacity-bound ones."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations, product
from typing import Any

from llmplan.cost.attention_rate import fused_attention_asymptote
from llmplan.errors import LlmplanError
from llmplan.estimate import TrainingEstimate, estimate_training, with_checkpoint
from llmplan.serving import ServeEstimate, estimate_serving, largest_fitting
from llmplan.specs.check import balanced_split, check_plan, check_serve_plan
from llmplan.specs.check_switches import unused_switches
from llmplan.specs.defaults import min_headroom_bytes
from llmplan.units import GIB

COMMUNICATION = ("tp", "pp", "dp", "cp", "ep")
COMPUTE = ("compute", "attention", "memory-bound", "optimizer", "overhead")
MAX_ITEMS = 5


@dataclass(frozen=True)
class Advice:
    """One single change and what the cost model predicts with it."""

    change: str
    """What to change and why, in words."""
    flags: tuple[str, ...]
    """The command-line flags that make the change (add them to the same command)."""
    predicted: dict[str, float]
    """Predicted step_s / tokens_per_s / mfu / memory_gib (training) or ttft_s / tpot_s / tokens_per_s /
    max_concurrent_seqs (serving) with the change."""
    gain: float
    """Relative throughput change (0.1 = 10% more tokens/s); for a plan that does not fit, memory saved."""


def _flag(name: str, value: Any) -> tuple[str, ...]:
    if value is True:
        return (f"--{name}",)
    if value is False:
        return (f"--no-{name}",)
    return (f"--{name}", str(value))


def training_candidates(e: TrainingEstimate) -> list[tuple[str, dict[str, Any]]]:
    """(reason, field changes) for the plan's bottleneck kind; every other kind's memory savers when the plan
    does not fit or keeps little headroom."""
    p, node = e.plan, e.cluster.gpus_per_node_used
    kind, out = e.bottleneck, []
    tight = float(e.memory.headroom) < min_headroom_bytes(None, float(e.memory.capacity))
    if tight:
        out += [("full recompute frees the layers' activations", {"recompute": "full"}),
                # with fused attention the scores are never stored: selective recompute would free nothing
                ("selective recompute drops the attention scores", {"recompute": "selective"})
                if not p.flash_attention else None,
                ("a fused (compiled) loss keeps one fp32 copy of the logits, not three", {"fused_loss": True})
                if not p.fused_loss else None,
                ("sequence parallelism splits norm and dropout activations over TP", {"sp": True}),
                ("more TP ranks split the weights and the activations", {"tp": p.tp * 2, "dp": p.dp // 2, "sp": True})
                if p.tp * 2 <= node and p.dp % 2 == 0 else None,
                (f"ZeRO stage {min(p.zero + 1, 3)} shards more model state over DP", {"zero": min(p.zero + 1, 3)}),
                ("more pipeline stages hold fewer layers each", _more_pp(e)),
                ("context parallelism splits the sequence", {"cp": p.cp * 2, "dp": p.dp // 2}),
                ("a smaller micro-batch keeps fewer activations", {"micro_batch": max(p.micro_batch // 2, 1)})]
    if kind in COMPUTE:
        out += [("a larger micro-batch runs larger GEMMs", {"micro_batch": p.micro_batch * 2}),
                ("selective recompute instead of full saves a forward pass", {"recompute": "selective"}),
                ("no recompute saves the attention recompute", {"recompute": "none"}),
                ("fewer TP ranks run larger GEMMs", {"tp": p.tp // 2, "dp": p.dp * 2, "sp": p.tp // 2 > 1 and p.sp})]
        if "fp8" in e.cluster.system.gpu.tflops and p.dtype == "bf16":
            out.append(("fp8 GEMMs run at twice the bf16 peak", {"dtype": "fp8"}))
        gpu = e.cluster.system.gpu
        if p.attention_kernel == "flash2" and p.flash_attention and float(fused_attention_asymptote(gpu, p)) < float(
                fused_attention_asymptote(gpu, p.model_copy(update={"attention_kernel": "native"}))):
            out.append(("the GPU's native attention kernel (cuDNN / FlashAttention-3) outruns FlashAttention-2",
                        {"attention_kernel": "native"}))
    step = float(e.time.total)
    if kind in COMMUNICATION or float(e.time.comm_exposed) >= 0.1 * step:
        out += [("overlap TP communication with the GEMMs", {"tp_comm_overlap": True, "sp": True}),
                ("overlap the gradient reduction with backward", {"overlap_grad_reduce": True}),
                ("overlap the weight all-gather with forward", {"overlap_param_gather": True}),
                ("reduce gradients in bf16 (half the DP bytes)", {"grad_dtype": "bf16"}),
                ("overlap the expert all-to-alls with another micro-batch", {"ep_comm_overlap": True}),
                ("DeepEP sends a token once per EP rank, not once per expert", {"moe_dispatcher": "deepep"})
                if p.ep > 1 and p.moe_dispatcher == "alltoall" and p.moe_capacity_factor is None else None,
                ("TP inside the node", {"tp": node, "dp": p.dp * p.tp // node}) if p.tp > node else None,
                ("EP within the NVLink domain", {"ep": max(p.ep // 2, 1)}) if p.ep > node else None]
    if kind in ("bubble", "pp") or float(e.time.bubble) >= 0.1 * step:
        out += [("more micro-batches amortise the bubble", {"micro_batch": max(p.micro_batch // 2, 1)}),
                ("interleaving (twice the virtual stages) shortens the bubble", {"vpp": p.vpp * 2}),
                ("an uneven split lightens the stages with the embedding and the loss", _uneven(e))]
    return [(why, change) for item in out if item for why, change in [item] if change]


def _more_pp(e: TrainingEstimate) -> dict[str, Any]:
    p, m = e.plan, e.model
    pp = p.pp * 2
    if pp > m.num_hidden_layers or p.dp % 2:
        return {}
    first, last = balanced_split(m.num_hidden_layers, pp)
    return {"pp": pp, "dp": p.dp // 2, "pp_first": first, "pp_last": last, "pp_layers": None, "pp_layout": None}


def _uneven(e: TrainingEstimate) -> dict[str, Any]:
    p, m = e.plan, e.model
    if p.pp < 2 or p.pp_first or p.pp_last or p.pp_layers or p.pp_layout:
        return {}
    L = m.num_hidden_layers + 2
    if L % p.pp:
        return {}
    per = L // p.pp  # the embedding and the loss counted as a layer each (Megatron's accounting flags)
    return {"pp_first": per - 1, "pp_last": per - 1}


def _training_flags(change: dict[str, Any], base: Any) -> tuple[str, ...]:
    names = {"pp_first": "pp-first-layers", "pp_last": "pp-last-layers", "micro_batch": "micro-batch",
             "tp_comm_overlap": "tp-comm-overlap", "overlap_grad_reduce": "overlap-grad-reduce",
             "overlap_param_gather": "overlap-param-gather", "grad_dtype": "grad-dtype",
             "ep_comm_overlap": "ep-comm-overlap", "attention_kernel": "attention-kernel", "fused_loss": "fused-loss",
             "moe_dispatcher": "moe-dispatcher"}
    out: tuple[str, ...] = ()
    for k, v in change.items():
        if k in ("pp_layers", "pp_layout"):
            continue
        out += _flag(names.get(k, k), v)
    if {"micro_batch", "dp", "tp", "cp", "pp"} & set(change):  # the CLI's default global batch follows them
        out += ("--global-batch", str(base.global_batch))
    return out


def advise_training(e: TrainingEstimate, allowance: Any = None, order: tuple[str, ...] | None = None) -> list[Advice]:
    """The best few single changes for a training plan, by predicted gain. For a plan that does not fit, only
    changes that make it fit: single ones, else a layout and memory savers together (fitting_combination), on
    these GPUs or, failing that, on more nodes."""
    order = order if order is not None else _default_order()
    base_tps, base_mem = float(e.throughput.tokens_per_s), float(e.memory.total)
    fits = float(e.memory.headroom) >= 0
    items = []
    for why, change in training_candidates(e):
        changed = _changed(e, change, allowance, order)
        if changed is None:
            continue
        new, reset = changed
        if reset:
            why += f" (and drop {', '.join('--' + k.replace('_', '-') for k in reset)}, which would do nothing then)"
        new_fits = float(new.memory.headroom) >= 0
        if not new_fits:  # a change is advised only where the plan fits with it
            continue
        gain = (float(new.throughput.tokens_per_s) / base_tps - 1) if fits \
            else (base_mem - float(new.memory.total)) / base_mem
        if gain <= 1e-6:  # no faster (a plan that fits) or frees no memory (one that does not)
            continue
        items.append(Advice(why, _training_flags(change, e.plan), _training_numbers(new), gain))
    if not fits and not items:
        combined = fitting_combination(e, allowance, order)
        if combined is not None:
            items.append(combined)
    return _with_goodput(_best(items), goodput_advice(e))


def _changed(e: TrainingEstimate, change: dict[str, Any], allowance: Any, order: tuple[str, ...],
             cluster: Any = None) -> tuple[TrainingEstimate, dict[str, Any]] | None:
    """(estimate, switches reset) of e's plan with `change` (on `cluster`, default e's), the switches it leaves without
    their axis dropped (unused_switches); None when the changed plan is not valid or not new."""
    cluster = cluster if cluster is not None else e.cluster
    try:
        plan = e.plan.model_copy(update=change)
        plan = type(e.plan).model_validate(plan.model_dump())
    except ValueError:
        return None
    reset = unused_switches(plan)  # a switch the change leaves without its axis (tp_impl at tp 1) goes too
    if reset:
        plan = plan.model_copy(update=reset)
    if (plan == e.plan and cluster is e.cluster) or check_plan(e.model, plan, cluster):
        return None
    try:
        return estimate_training(e.model, cluster, plan, allowance, order), reset
    except LlmplanError:
        return None


RECOMPUTE_STRENGTH = {"none": 0, "op": 1, "selective": 1, "full": 2}
"""How much of the activations each recompute mode drops, for ordering; full drops the most."""


def saver_axes(p: Any) -> list[list[dict[str, Any]]]:
    """The memory savers fitting_combination combines, one list per axis, weakest level first (at most one level
    of an axis is taken): stronger recompute (selective only with unfused attention, where it drops the scores),
    a fused loss, sequence parallelism (with TP), each higher ZeRO stage, a bf16 gradient buffer (16-bit training),
    each halving of the micro-batch."""
    rec = [r for r in (("full",) if p.flash_attention else ("selective", "full"))
           if RECOMPUTE_STRENGTH[r] > RECOMPUTE_STRENGTH[p.recompute]]
    axes: list[list[dict[str, Any]]] = [
        [{"recompute": r} for r in rec], [] if p.fused_loss else [{"fused_loss": True}],
        [] if p.sp or p.tp == 1 else [{"sp": True}], [{"zero": z} for z in range(p.zero + 1, 4)],
        [{"grad_dtype": "bf16"}] if p.grad_dtype == "fp32" and p.dtype != "fp32" else [],
        [{"micro_batch": p.micro_batch >> i} for i in range(1, p.micro_batch.bit_length())]]
    return [a for a in axes if a]


def _doublings(start: int, limit: int) -> list[int]:
    return [start << i for i in range(max(limit, start).bit_length()) if start << i <= max(limit, start)]


def layouts(e: TrainingEstimate, cluster: Any) -> list[dict[str, Any]]:
    """TP (within a node), PP (at most the layers) and CP, each the plan's times a power of 2, whose product
    divides the cluster's GPUs, dp the rest; fewest axes changed first, then fewest GPUs per model replica. A
    new PP splits the layers evenly (balanced_split); a plan with its own layer split keeps its PP."""
    p, m, n = e.plan, e.model, cluster.num_gpus
    out = []
    for tp in _doublings(p.tp, cluster.gpus_per_node_used):
        for pp in _doublings(p.pp, 0 if p.pp_layers or p.pp_layout else m.num_hidden_layers):
            for cp in _doublings(p.cp, n):
                if n % (tp * pp * cp) == 0:
                    split = dict(zip(("pp_first", "pp_last"), balanced_split(m.num_hidden_layers, pp))) \
                        if pp != p.pp else {}
                    out.append({"tp": tp, "pp": pp, "cp": cp, "dp": n // (tp * pp * cp), **split})
    return sorted(out, key=lambda c: (sum(c[k] != getattr(p, k) for k in ("tp", "pp", "cp")),
                                      c["tp"] * c["pp"] * c["cp"]))


def fewest_savers(axes: list[list[dict[str, Any]]], run: Any, valid: Any) -> Any:
    """The fitting (result, score) of the fewest savers (an empty choice first), the largest score
    among those of as many; `run(choice)` gives (result, score) for a list of saver levels, None where it does
    not fit or is not valid, `valid(choice)` whether it is a valid plan. Memory only falls as a saver is added
    or strengthened, so where the strongest valid level of every axis (taken axis by axis) does not fit, none
    does: one evaluation instead of all."""
    strongest: list[dict[str, Any]] = []
    for axis in axes:
        strongest += next(([lv] for lv in reversed(axis) if valid([*strongest, lv])), [])
    if run(strongest) is None:
        return None
    for k in range(len(axes) + 1):
        found = [r for combo in combinations(axes, k) for choice in product(*combo) if (r := run(list(choice)))]
        if found:
            return max(found, key=lambda r: r[1])
    return None


def fitting_combination(e: TrainingEstimate, allowance: Any, order: tuple[str, ...]) -> Advice | None:
    """For a plan that no single change makes fit: on e's GPUs, else on 2, 4, 8 or 16 times the nodes, each
    layout (layouts) with the fewest memory savers (saver_axes) that make it fit (fewest_savers), and of these the
    fastest; as one Advice of all its flags. None when nothing fits on any of these clusters. Exhaustive over
    these options but for the one-evaluation bound of fewest_savers."""
    for k in (1, 2, 4, 8, 16):
        cluster = e.cluster if k == 1 else e.cluster.model_copy(update={"num_nodes": e.cluster.num_nodes * k})
        found = []
        for layout in layouts(e, cluster):
            change_of, axes = _combined_change(e.plan, layout), saver_axes(e.plan.model_copy(update=layout))
            found.append(fewest_savers(axes, lambda ch: _fitting(e, change_of(ch), allowance, order, cluster),
                                       lambda ch: _valid(e, change_of(ch), cluster)))
        fits = [f for f in found if f is not None]
        if fits:
            return _combination_advice(e, cluster, *max(fits, key=lambda f: f[1])[0])
    return None


def _combined_change(p: Any, layout: dict[str, Any]) -> Any:
    """choice -> the fields a layout and a list of saver levels change in plan p (unchanged ones left out)."""
    def change(choice: list[dict[str, Any]]) -> dict[str, Any]:
        merged = {**layout, **{k: v for level in choice for k, v in level.items()}}
        return {k: v for k, v in merged.items() if getattr(p, k) != v}
    return change


def _valid(e: TrainingEstimate, change: dict[str, Any], cluster: Any) -> bool:
    try:
        plan = type(e.plan).model_validate(e.plan.model_copy(update=change).model_dump())
    except ValueError:
        return False
    return not check_plan(e.model, plan.model_copy(update=unused_switches(plan)), cluster)


def _fitting(e: TrainingEstimate, change: dict[str, Any], allowance: Any, order: tuple[str, ...],
             cluster: Any) -> Any:
    """((estimate, change), tokens/s) where e's plan with `change` on `cluster` is valid and fits, else None."""
    got = _changed(e, change, allowance, order, cluster)
    if got is None or float(got[0].memory.headroom) < 0:
        return None
    return (got[0], change), float(got[0].throughput.tokens_per_s)


def _combination_advice(e: TrainingEstimate, cluster: Any, new: TrainingEstimate, change: dict[str, Any]) -> Advice:
    c = e.cluster
    nodes = ("--nodes", str(cluster.num_nodes)) if cluster is not c else ()
    why = ("together these fit" if cluster is c else f"on {cluster.num_nodes} nodes ({cluster.num_gpus} GPUs "
           f"instead of {c.num_gpus}) these fit (llmplan search --nodes {cluster.num_nodes} ranks all that do)")
    return Advice(f"no single change fits; {why}", (*nodes, *_training_flags(change, e.plan)),
                  _training_numbers(new), (float(e.memory.total) - float(new.memory.total)) / float(e.memory.total))


def goodput_advice(e: TrainingEstimate) -> list[Advice]:
    """Checkpointing changes that raise goodput (cost.goodput): asynchronous checkpoints (training waits only for
    the copy to host memory), in-memory checkpoints on a peer node, the optimal interval instead of a set one.
    gain: the relative change of goodput, which is that of the tokens/s that survive failures."""
    if e.goodput is None or float(e.memory.headroom) < 0:  # a plan that does not fit needs memory first
        return []
    c, base = e.checkpoint, float(e.goodput.useful)
    cands: list[tuple[str, dict[str, Any]]] = []
    if c.mode == "sync":
        cands.append(("asynchronous checkpointing", {"mode": "async"}))
    if c.mode != "memory" and e.cluster.system.nics_per_node and e.cluster.num_nodes > 1:
        cands.append(("in-memory checkpoints on a peer node", {"mode": "memory"}))
    if c.interval_s is not None:
        best = with_checkpoint(e, c.model_copy(update={"interval_s": None}))  # the same plan: its step reused
        if best.goodput is not None:
            cands.append(("the optimal checkpoint interval (Daly 2006)",
                          {"interval_s": float(f"{float(best.goodput.interval_s):.3g}")}))
    items = []
    for why, change in cands:
        new = with_checkpoint(e, c.model_copy(update=change))
        if new.goodput is None:
            continue
        share = float(new.goodput.useful)
        gain = share / base - 1 if base > 0 else float(share > 0)
        if gain <= 1e-6:
            continue
        flags = (("--checkpoint", change["mode"]) if "mode" in change else
                 ("--checkpoint-interval", f"{change['interval_s']:g}"))
        items.append(Advice(f"{why}: goodput {100 * base:.1f}% -> {100 * share:.1f}%", flags,
                            {**_training_numbers(new), "goodput": share,
                             "effective_tokens_per_s": float(new.throughput.tokens_per_s) * share}, gain))
    return _best(items)


def _with_goodput(items: list[Advice], goodput: list[Advice]) -> list[Advice]:
    """The best few changes, by gain; the best checkpointing change always among them when it gains at all."""
    merged = sorted([*items, *goodput], key=lambda a: -a.gain)[:MAX_ITEMS]
    if not goodput or goodput[0] in merged:
        return merged
    return sorted([*merged[:MAX_ITEMS - 1], goodput[0]], key=lambda a: -a.gain)


def _default_order() -> tuple[str, ...]:
    from llmplan.topology.placement import DEFAULT_ORDER

    return DEFAULT_ORDER


def _training_numbers(e: TrainingEstimate) -> dict[str, float]:
    return {"step_s": float(e.time.total), "tokens_per_s": float(e.throughput.tokens_per_s),
            "mfu": float(e.throughput.mfu), "memory_gib": float(e.memory.total) / GIB,
            "fits": float(bool(e.memory.fits))}


def _best(items: list[Advice]) -> list[Advice]:
    seen, out = set(), []
    for a in sorted(items, key=lambda a: -a.gain):
        if a.flags not in seen:
            seen.add(a.flags)
            out.append(a)
    return out[:MAX_ITEMS]


def serving_bound(e: ServeEstimate) -> str:
    """capacity (the KV cache holds fewer sequences than asked), ttft or tpot (the SLO it misses, or the larger
    share of a request's time)."""
    if e.memory.max_concurrent_seqs < e.job.batch:
        return "capacity"
    t = e.timing
    if e.job.ttft_slo_s is not None and float(t.ttft) > e.job.ttft_slo_s:
        return "ttft"
    if e.job.tpot_slo_s is not None and float(t.tpot) > e.job.tpot_slo_s:
        return "tpot"
    return "ttft" if float(t.ttft) > float(t.tpot) * e.job.output_len else "tpot"


def advise_serving(e: ServeEstimate, allowance: Any = None) -> list[Advice]:
    """The best few single changes for a serving plan, the cheapest first: those on the same GPUs (a larger
    batch where the SLOs allow one, chunked prefill and prefix caching for TTFT, an fp8 KV cache), by predicted
    gain, then those that need more GPUs (more TP, more replicas), by gain. For a plan that does not fit, only
    changes that make it fit, ranked by throughput against the plan at the batch that fits (largest_fitting)."""
    p, j = e.plan, e.job
    bound = serving_bound(e)
    fits = bool(e.memory.fits)
    fitting = None if fits else largest_fitting(e, allowance)
    cands: list[tuple[str, dict, dict]] = []
    if bound != "ttft" and e.slo_batch and e.slo_batch > j.batch:  # printed with the SLOs: the cheapest change
        cands.append((f"the SLOs allow {e.slo_batch:,} concurrent sequences per replica (now {j.batch:,}): a "
                      "larger batch on the same GPUs", {}, {"batch": e.slo_batch}))
    cands += [
        ("more TP ranks split the weights and the KV cache", {"tp": p.tp * 2}, {}),
        ("an fp8 KV cache holds twice the tokens", {"kv_dtype": "fp8"} if p.kv_dtype != "fp8" else {}, {}),
    ]
    if bound == "ttft":
        chunks = {"max_num_batched_tokens": j.max_num_batched_tokens * 2, "max_num_batched_tokens_default": False}
        cands += [("larger prefill chunks (max_num_batched_tokens)", {}, chunks),
                  ("prefix caching skips shared prompt tokens", {},
                   {"prefix_hit_rate": min(0.9, j.prefix_hit_rate + 0.5)})]
    if fitting is not None:
        cands.append((f"a batch of {fitting.job.batch:,} per replica is the most the KV cache holds", {},
                      {"batch": fitting.job.batch}))
    if not fits:
        cands += _fitting_serving_candidates(e, allowance)
    cands.append(("more replicas serve more requests", {"dp": p.dp * 2}, {}))
    base = fitting.tokens_per_s if fitting is not None else e.tokens_per_s
    items = []
    for why, plan_change, job_change in cands:
        if not plan_change and not job_change:
            continue
        # estimate_serving derives the engine's default capture list again for the changed job (job_for_plan)
        plan, job = p.model_copy(update=plan_change), j.model_copy(update=job_change)
        try:
            plan, job = type(p).model_validate(plan.model_dump()), type(j).model_validate(job.model_dump())
            cluster = _cluster_for(e, plan)
            if check_serve_plan(e.model, plan, job, cluster):
                continue
            new = estimate_serving(e.model, cluster, plan, job, allowance)
        except (LlmplanError, ValueError):
            continue
        if not fits and not new.memory.fits:
            continue  # a plan that does not fit is advised only changes that make it fit
        if not fits:  # against what the plan achieves at the batch that fits (none: the memory it saves)
            gain = (new.tokens_per_s / base - 1 if fitting is not None
                    else float(e.memory.total - new.memory.total) / float(e.memory.total))
        else:
            gain = new.tokens_per_s / base - 1 if bound != "ttft" else float(e.timing.ttft) / float(new.timing.ttft) - 1
            if gain <= 1e-6:
                continue
        flags = sum((_flag(k.replace("_", "-"), v) for k, v in {**plan_change, **job_change}.items()), ())
        if job_change.get("batch", 0) > j.batch and (not new.memory.fits or (
                j.tpot_slo_s is not None and float(new.timing.tpot) > j.tpot_slo_s) or (
                j.ttft_slo_s is not None and float(new.timing.ttft) > j.ttft_slo_s)):
            continue  # a larger batch is advised only where it fits and keeps the SLOs
        if cluster is not e.cluster:  # the change needs another number of GPUs
            flags = ("--nodes", str(cluster.num_nodes), "--gpus-per-node", str(cluster.gpus_per_node_used),
                     *(() if "dp" in plan_change else ("--dp", str(plan.dp))), *flags)
            why += f" ({plan.num_gpus} GPUs instead of {p.num_gpus})"
        items.append(Advice(f"{bound}-bound: {why}", flags, {
            "ttft_s": float(new.timing.ttft), "tpot_s": float(new.timing.tpot), "tokens_per_s": new.tokens_per_s,
            "max_concurrent_seqs": float(new.memory.max_concurrent_seqs), "gpus": float(plan.num_gpus),
            "tokens_per_s_per_gpu": new.tokens_per_s / plan.num_gpus, "fits": float(bool(new.memory.fits))}, gain))
    return sorted(_best(items), key=lambda a: a.predicted["gpus"] > p.num_gpus)  # stable: by gain within each


def _fitting_serving_candidates(e: ServeEstimate, allowance: Any) -> list[tuple[str, dict, dict]]:
    """Changes that make a serving plan that does not fit fit: the fewest TP ranks within a node that hold the
    whole batch (same replicas, more GPUs), and an fp8 KV cache at the batch it holds (same GPUs)."""
    p, j = e.plan, e.job
    out: list[tuple[str, dict, dict]] = []
    tp = p.tp * 4  # tp * 2 is priced among the ordinary candidates
    while tp <= e.cluster.system.gpus_per_node:
        try:
            plan = type(p).model_validate(p.model_copy(update={"tp": tp}).model_dump())
            cluster = _cluster_for(e, plan)
            if not check_serve_plan(e.model, plan, j, cluster) and \
                    estimate_serving(e.model, cluster, plan, j, allowance).memory.fits:
                out.append((f"tp {tp} holds all {j.batch:,} sequences' KV cache", {"tp": tp}, {}))
                break
        except (LlmplanError, ValueError):
            pass
        tp *= 2
    if p.kv_dtype != "fp8":
        try:
            plan = type(p).model_validate(p.model_copy(update={"kv_dtype": "fp8"}).model_dump())
            fp8 = estimate_serving(e.model, e.cluster, plan, j, allowance)
            held = largest_fitting(fp8, allowance)
            if held is not None:
                out.append((f"an fp8 KV cache holds {held.job.batch:,} sequences per replica", {"kv_dtype": "fp8"},
                            {"batch": held.job.batch}))
        except (LlmplanError, ValueError):
            pass
    return out


def _cluster_for(e: ServeEstimate, plan: Any) -> Any:
    """The cluster a changed serving plan needs (more GPUs for more TP or replicas, in whole nodes)."""
    from llmplan.specs.plan import ClusterSpec

    per_node = e.cluster.gpus_per_node_used
    n = plan.num_gpus
    if n == e.cluster.num_gpus:
        return e.cluster
    nodes = max(1, -(-n // per_node))
    return ClusterSpec(system=e.cluster.system, num_nodes=nodes, gpus_per_node=min(per_node, n))



def advice_json(items: list[Advice]) -> list[dict[str, Any]]:
    return [{"change": a.change, "flags": list(a.flags), "predicted": a.predicted, "gain": a.gain} for a in items]
