"""Left-out residuals for llmplan's prediction intervals, their coverage, the tie resolution, and what
anchoring to one measured run does (docs/validation.md#intervals).

    python benchmarks/intervals.py --write        # refit (leave-one-family-out), write llmplan/data/residuals.json
    python benchmarks/intervals.py --write --reuse-fit   # same, with the fitted constants the file already holds
    python benchmarks/intervals.py                # report from the shipped file (coverage, half-widths, groups)

For every scored training record it runs accuracy.py's prediction with the constants fitted WITHOUT the
record's source (every family of accuracy.SOURCE_GROUPS that holds its family; accuracy.fit_tables + best_fit,
one grid pass for all families; a scored-only family alone in its source takes the all-family fit) and stores r = log(measured rate / predicted rate) (a measured
iteration time counts as 1 / rate) with the record's regime tags (llmplan.intervals.Regime). Memory: the
published peaks (Korthikanti et al. 2022 Table 5 parts, torchtitan's reserved peak); serving: the TensorRT-LLM
records, each model scored with the serving constants fitted without it. The tie resolution is the 0.8
quantile of |r_i - r_j| over pairs of layouts of one job (same model, GPU type and count, global batch,
sequence length and format, one source): the alternatives a search ranks. The quantile pairs: the all-regime
one (`nominal`) and each regime pool's own where its left-out coverage, nested too, allows (`pools`,
llmplan.intervals.choose_pools); the report gives coverage and half-width per pool and per family.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy as acc  # noqa: E402
from runs import load_runs, runs_path  # noqa: E402

from llmplan import intervals as iv  # noqa: E402
from llmplan.errors import LlmplanError  # noqa: E402
from llmplan.estimate import estimate_training  # noqa: E402
from llmplan.intervals import weighted_quantile  # noqa: E402
from llmplan.topology.placement import DEFAULT_ORDER  # noqa: E402
from llmplan.specs.registry import builtin_systems  # noqa: E402

OUT = ROOT / "llmplan" / "data" / iv.DATA
SCORED = tuple(f for f in acc.FAMILIES if f != "trtllm")
COMMAND = "python benchmarks/intervals.py --write"


def lofo_constants(records: list[dict], reuse: dict | None) -> dict[str, dict]:
    """Per family: the constants fitted without every family of its source (accuracy.source_group; a
    scored-only family alone in its source: the all-family fit)."""
    if reuse:
        return reuse
    table, _, jack = acc.fit_tables(records)
    fams = set(acc.TRAIN_FAMILIES)
    full, _ = acc.best_fit(table, fams, jack)
    fits: dict[tuple[str, ...], dict] = {}
    for f in SCORED:
        group = acc.source_group(f)
        if group not in fits:
            fits[group] = acc.best_fit(table, fams - set(group), jack)[0]
    return {**{f: fits[acc.source_group(f)] for f in SCORED}, "_all": full}


def consts_for(rec: dict, consts: dict) -> dict:
    """The fitted constants a record sees: the global ones, and the clock of its own GPU generation only
    (GPUs without a fitted clock keep their profile's)."""
    group = acc.clock_group(rec)
    return {k: v for k, v in consts.items() if not k.startswith("clock_") or k == f"clock_{group}"}


def residual(rec: dict, fam: str, consts: dict | None) -> tuple[float, str] | None:
    """(log(measured rate / predicted rate), quantity) of a training record, or None when it is not scored."""
    try:
        rows = acc.predict(rec, fam, consts)
    except (LlmplanError, ValueError):
        return None
    row = next((x for x in rows if x[0] != "fits"), None)
    if row is None or row[1] <= 0 or row[2] <= 0:
        return None
    q, pred, meas = row
    return (math.log(pred / meas) if q == "iteration s" else math.log(meas / pred)), q


def tags(rec: dict, fam: str) -> dict:
    gpus = rec["hardware"].get("gpus") or 1
    plan = acc.plan_for(rec, fam, gpus)
    system = builtin_systems()[acc.system_for(str(rec["hardware"]["gpu"]))]
    return {"moe": bool(acc.model_for(rec, fam).num_experts), "generation": iv.generation(system.gpu.name),
            "framework": iv.framework(plan), "gpus": int(gpus),
            # not a selection tag (docs/validation.md#intervals: as one it narrowed the 2020-22 families' bands
            # by losing their coverage); the report's current-stack line counts by it
            "stack": "flash" if plan.flash_attention else "no-flash"}


OTHER_STACK = {("narayanan2021", 3): "DeepSpeed ZeRO-3"}
"""(family, ZeRO stage) of rows a source ran on another software stack than the rest of its family: Narayanan
et al. 2021 section 5.2 compares Megatron-LM's PTD-P with DeepSpeed's ZeRO-3 (Table 2)."""


def stack_of(rec: dict, fam: str) -> str:
    """The software stack a record ran on, where its family mixes two (OTHER_STACK), else its family."""
    return OTHER_STACK.get((fam, rec["parallel"].get("zero_stage")), fam)


def job_of(rec: dict, fam: str) -> tuple[str, str]:
    """(job, layout) of a training record: the job is what a search holds fixed (source family and software
    stack, model, GPU type and count, global batch, sequence length, number format), the layout is a hash of the rest of
    the plan (TP, PP, DP, CP, EP, VPP, micro-batch, ZeRO stage, recompute, overlaps, kernels). Records of one
    job with different layouts are the alternatives a search ranks; the tie resolution is measured on them."""
    gpus = rec["hardware"].get("gpus") or 1
    p = acc.plan_for(rec, fam, gpus)
    m = rec["model"]
    job = (f"{stack_of(rec, fam)} | {m.get('name')} L{m.get('layers')} h{m.get('hidden')} | "
           f"{rec['hardware']['gpu']} x{gpus} | gbs {p.global_batch} s {p.seq_len} | {p.dtype}/{p.recipe}")
    fixed = {"global_batch", "seq_len", "dtype", "recipe"}
    layout = json.dumps({k: v for k, v in p.model_dump(mode="json").items() if k not in fixed}, sort_keys=True)
    return job, hashlib.sha256(layout.encode()).hexdigest()[:16]  # compared for equality only (same_job_groups)


def training_residuals(records: list[dict], consts: dict[str, dict]) -> list[dict]:
    out = []
    for rec in records:
        fam = acc.family(rec["id"])
        if fam not in SCORED or fam not in consts:
            continue
        got = residual(rec, fam, consts_for(rec, consts[fam]))
        if got is None:
            continue
        job, layout = job_of(rec, fam)
        source = next((k for k, g in acc.SOURCE_GROUPS.items() if fam in g), fam)
        out.append({"id": rec["id"], "family": fam, "source": source, "r": round(got[0], 5), "quantity": got[1],
                    **tags(rec, fam), "job": job, "layout": layout})
    return out


def memory_residuals(records: list[dict]) -> list[dict]:
    """Peak memory where a source publishes it: Korthikanti Table 5's states + activations, torchtitan's
    reserved peak (an upper bound of the allocated peak, so these lean high)."""
    parts: dict[str, list[float]] = {}
    for rid, _, pred, meas in acc.memory_report(records):
        p = parts.setdefault(rid, [0.0, 0.0])
        p[0] += pred
        p[1] += meas
    out = [{"id": rid, "family": acc.family(rid), "r": round(math.log(m / p), 5), "what": "states + activations"}
           for rid, (p, m) in parts.items()]
    out += [{"id": rid, "family": acc.family(rid), "r": round(math.log(m / p), 5), "what": "reserved peak"}
            for rid, p, m in acc.reserved_report(records)]
    return out


def serving_residuals(records: list[dict]) -> list[dict]:
    """Each TensorRT-LLM record scored with the serving constants fitted without its model (the mean of the
    other models' median |error| over accuracy.SERVE_GRID, as accuracy.serving_report fits them)."""
    recs = [r for r in records if acc.family(r["id"]) == "trtllm"]
    if not recs:
        return []
    grid = [dict(zip(acc.SERVE_GRID, v, strict=True)) for v in itertools.product(*acc.SERVE_GRID.values())]
    table = [(c, acc.serving_errors(records, c)) for c in grid]
    models = sorted({r["model"]["name"] for r in recs})

    def fit_without(left: str) -> list:
        def score(errs: list) -> float:
            return statistics.mean(statistics.median(abs(e) for n, _, e in errs if n == m) for m in models if m != left)
        return min(table, key=lambda ce: score(ce[1]))[1]

    fits = {m: fit_without(m) for m in models}
    out = []
    for i, rec in enumerate(recs):
        name = rec["model"]["name"]
        err = fits[name][i][2]
        out.append({"id": rec["id"], "family": "trtllm", "model": name, "r": round(-math.log(1 + err / 100), 5)})
    return out


def same_job_groups(training: list[dict]) -> dict[str, list[dict]]:
    """The records of each job (job_of) measured in two or more layouts, one record per layout (the first
    by id: a layout re-measured in a later release is the same alternative, not another one)."""
    groups: dict[str, dict[str, dict]] = {}
    for r in sorted(training, key=lambda x: x["id"]):
        if r.get("job"):
            groups.setdefault(r["job"], {}).setdefault(r["layout"], r)
    return {k: list(v.values()) for k, v in sorted(groups.items()) if len(v) >= 2}


def tie_resolution(training: list[dict]) -> dict:
    """The LEVEL quantile of |r_i - r_j| over the pairs of layouts of one job (same_job_groups), every job
    weighted alike (a 26-layout BLOOM search has 325 pairs, a Korthikanti recompute pair one)."""
    groups = same_job_groups(training)
    diffs, weights = [], []
    for recs in groups.values():
        pairs = [abs(a["r"] - b["r"]) for a, b in itertools.combinations(recs, 2)]
        diffs += pairs
        weights += [1 / len(pairs)] * len(pairs)
    if not diffs:
        return {"quantile": iv.LEVEL, "value": 0.0, "pairs": 0, "groups": 0, "weighting": "each job alike"}
    return {"quantile": iv.LEVEL, "value": round(weighted_quantile(diffs, weights, iv.LEVEL), 5),
            "pairs": len(diffs), "groups": len(groups), "weighting": "each job alike",
            "basis": "layouts of one job (same model, GPUs, global batch, sequence, format; one source)"}


def resolutions(training: list[dict]) -> dict:
    """The tie resolution over every job, and over the dense and the MoE jobs apart (search uses the one of
    the plan's model kind)."""
    dense = tie_resolution([r for r in training if not r["moe"]])
    moe = tie_resolution([r for r in training if r["moe"]])
    return {**tie_resolution(training), "dense": dense["value"], "moe": moe["value"],
            "dense_groups": dense["groups"], "moe_groups": moe["groups"]}


def write(records: list[dict], reuse: bool, path: Path) -> dict:
    old = json.loads(path.read_text()) if reuse and path.exists() else None
    consts = lofo_constants(records, old["constants"] if old else None)
    training = training_residuals(records, consts)
    sourced = iv.left_out_sourced(training)
    pools = sourced[iv.MIN_SOURCES]
    nominal = iv.choose_nominal(training, pools)
    doc = {
        "generated_by": COMMAND + (" --reuse-fit" if reuse else ""),
        "runs": len(records),
        "level": iv.LEVEL,
        "nominal": nominal,
        "pool_rule": iv.POOL_RULE,
        "pools": iv.choose_pools(training, default=nominal, sourced=sourced),
        "residual": "log(measured rate / predicted rate), constants fitted without the record's source "
                    "(its family's group in benchmarks/accuracy.py SOURCE_GROUPS)",
        "constants": consts,
        "resolution": resolutions(training),
        "training": training,
        "memory": memory_residuals(records),
        "serving": serving_residuals(records),
    }
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return doc


def nested_coverage(training: list[dict]) -> dict[str, tuple[int, int, float, float]]:
    """Per family: the coverage it gets when the quantile pairs (the all-regime one and the pools' own) are
    themselves chosen without its whole source (every family of its SOURCE_GROUPS group: choose_nominal,
    choose_pools on the other sources' runs, their bands drawn without it too), with those pairs: (inside,
    records, median half-width, the all-regime pair)."""
    sourced = iv.left_out_sourced(training)
    out = {}
    for src in sorted({iv.source_of(r) for r in training}):
        others = [r for r in training if iv.source_of(r) != src]
        without = iv.left_out_sourced(training, without=src)
        nominal = iv.choose_nominal(others, without[iv.MIN_SOURCES])
        chosen = {"nominal": nominal, "pools": iv.choose_pools(others, default=nominal, sourced=without)}
        pair = iv.pair_of(chosen)
        mine = [r for r in training if iv.source_of(r) == src]
        for fam, (inside, n, half) in iv.coverage(mine, pair, iv.merged_pools(mine, chosen, sourced)).items():
            out[fam] = (inside, n, half, nominal)
    return dict(sorted(out.items()))


def _bands(training: list[dict], pools: dict, pair: Callable[[dict], iv.Choice]) -> dict[str, tuple[bool, float]]:
    """Per record: (inside its left-out band, the band's half-width as a fraction of the point)."""
    out = {}
    for r in training:
        b = iv.left_out_band(pools[r["id"]], pair(r))
        out[r["id"]] = (b.lo <= r["r"] <= b.hi, iv.half_width(b))
    return out


def _by_source(training: list[dict], bands: dict[str, tuple[bool, float]]) -> str:
    """Coverage per source (llmplan.intervals.source_of: what each band leaves out) of `training`'s runs, inside
    / runs each, and the mean over sources."""
    by: dict[str, list[bool]] = {}
    for r in training:
        by.setdefault(iv.source_of(r), []).append(bands[r["id"]][0])
    return (", ".join(f"{s} {sum(v)}/{len(v)}" for s, v in sorted(by.items()))
            + f" (mean over sources {100 * statistics.mean(statistics.mean(v) for v in by.values()):.1f}%)")


def _choice_label(info: dict) -> str:
    """A cell's or pool's own choice in pool_report's `own` column: '-' for none, else its pair, '>=' before it
    when it covers 75% or more but is not inside 75-85%, '/fam' when every family is weighted alike, '/<n>s'
    when its bands are drawn from other than MIN_SOURCES sources."""
    q = info.get("nominal")
    if not q:
        return "-"
    sources = info.get("min_sources", iv.MIN_SOURCES)
    return ((">=" if info.get("inside") is False else "") + f"{q:g}"
            + ("/fam" if info.get("weighting") == "family" else "")
            + (f"/{sources}s" if sources != iv.MIN_SOURCES else ""))


def pool_report(training: list[dict], doc: dict, own: dict[str, tuple[bool, float]]) -> None:
    """Per regime pool (llmplan.intervals.POOLS) and cell (a pool on one GPU generation): its choice (its own pair
    and weighting, or the all-regime pair it falls back to), and its left-out coverage and median half-width
    with the choice each run takes (`own`: _bands under the file's choices)."""
    nominal = doc["nominal"]
    print(f"per regime pool and cell (its own pair and weighting where it has {iv.POOL_MIN_FAMILIES}+ families of "
          f"{iv.POOL_MIN_RECORDS}+ runs,\na choice inside 75-85% (else the narrowest covering 75% or more: >=) and the "
          f"nested coverage of that\nchoice 75% or more too; a run takes its cell's, else its pool's, else the "
          f"all-regime {nominal:g} pair;\n/fam: every family weighted alike):")
    print(f"  {'pool / cell':30s} {'fams':>4s} {'runs':>4s} {'own':>9s} {'runs in':>7s} {'fams in':>7s} "
          f"{'median half':>11s}")
    names = [*iv.POOLS, *sorted(k for k in doc["pools"] if "/" in k)]
    for name in names:
        key = iv.cell_of if "/" in name else iv.pool_of
        mine = [r for r in training if key(iv.record_regime(r)) == name]
        if not mine:
            continue
        info = doc["pools"].get(name, {})
        fams: dict[str, list[bool]] = {}
        for r in mine:
            fams.setdefault(r["family"], []).append(own[r["id"]][0])
        print(f"  {name:30s} {info.get('families', 0):4d} {len(mine):4d} {_choice_label(info):>9s} "
              f"{100 * statistics.mean(own[r['id']][0] for r in mine):6.1f}% "
              f"{100 * statistics.mean(statistics.mean(v) for v in fams.values()):6.1f}% "
              f"{100 * statistics.median(own[r['id']][1] for r in mine):10.1f}%")
        if info.get("fallback") == "widened":
            print(f"    {info['why_own']};\n    its {info.get('fallback_from', 'pool')} fallback covers "
                  f"{100 * info['fallback_coverage'][0]:.1f}% of its runs ({100 * info['fallback_coverage'][1]:.1f}% "
                  f"per family): widened until it covers {100 * info['lower']:g}% (rule 6)"
                  + ("" if info.get("nested_ok", True) else "; the widening is not stable leaving a source out"))
        if info.get("why"):
            print(f"    {info['why']}")
            if info.get("fallback_coverage"):
                print(f"    its {info['fallback']} fallback covers {100 * info['fallback_coverage'][0]:.1f}% of its "
                      f"runs ({100 * info['fallback_coverage'][1]:.1f}% per family)")
        elif info.get("nested"):
            print("    nested coverage of its " + ("widened" if info.get("fallback") == "widened" else "own") + f" choice: {100 * info['nested'][0]:.1f}% of runs, "
                  f"{100 * info['nested'][1]:.1f}% per family"
                  + (f", median half-width {100 * info['nested_half']:.1f}%" if "nested_half" in info else ""))


def report(doc: dict, nested: bool = True) -> None:
    training = doc["training"]
    nominal = doc["nominal"]
    print(f"residuals: {len(training)} training, {len(doc['memory'])} memory, {len(doc['serving'])} serving "
          f"records ({doc['generated_by']})")
    sourced = iv.left_out_sourced(training)
    pools = sourced[iv.MIN_SOURCES]
    if doc.get("pool_rule") != iv.POOL_RULE:  # pair and pools of an older rule: choose them now, as --write would
        nominal = iv.choose_nominal(training, pools)
        doc = {**doc, "nominal": nominal, "pools": iv.choose_pools(training, default=nominal, sourced=sourced)}
        print(f"(the file's all-regime pair and regime pools predate rule {iv.POOL_RULE}: chosen now, as --write "
              "would)")
    pair = iv.pair_of(doc)
    chosen_pools = iv.merged_pools(training, doc, sourced)
    bands = _bands(training, chosen_pools, pair)
    print(f"\ncoverage of the {iv.LEVEL:.0%} interval, each family left out in turn (its records' intervals "
          "built\nfrom the other sources' residuals by llmplan.intervals' rule); target 75-85%. Quantile pair "
          "per\ncentral probability tried (the shipped file takes the narrowest inside 75-85% both per record and "
          "per\nfamily, else the narrowest covering 75% or more both ways, else the one nearest 80% over\n"
          "families):")
    for q in iv.NOMINAL_CHOICES:
        cov = iv.coverage(training, q, pools)
        inside, n = sum(c[0] for c in cov.values()), sum(c[1] for c in cov.values())
        print(f"  {q:.3g}: {100 * inside / n:5.1f}% of {n} records, mean over families "
              f"{100 * iv.mean_coverage(cov):5.1f}%" + ("  <- shipped" if q == nominal else ""))
    cov = iv.coverage(training, pair, chosen_pools)
    print(f"with the shipped pairs (the regime pools' own, else {nominal:g}): {100 * iv.per_record(cov):.1f}% of "
          f"{sum(c[1] for c in cov.values())} records, mean over families {100 * iv.mean_coverage(cov):.1f}%")
    pool_report(training, doc, bands)
    print(f"  {'family':16s} {'inside':>7s} {'records':>8s} {'coverage':>9s} {'median half-width':>18s}")
    for fam, (inside, n, half) in cov.items():
        print(f"  {fam:16s} {inside:7d} {n:8d} {100 * inside / n:8.1f}% {100 * half:17.1f}%")
    print("per source (the unit each band leaves out): " + _by_source(training, bands))
    if nested:
        nest = nested_coverage(training)
        inside, n = sum(c[0] for c in nest.values()), sum(c[1] for c in nest.values())
        print(f"nested (the pairs chosen without the source it scores): {100 * inside / n:.1f}% of {n} records, "
              f"mean over families {100 * statistics.mean(c[0] / c[1] for c in nest.values()):.1f}%; all-regime "
              "pairs chosen " + ", ".join(f"{f} {c[3]:g}" for f, c in nest.items()))

    def dense_megatron(r: dict) -> bool:
        return not r["moe"] and r["framework"] == "megatron" and r["generation"] in ("ampere", "hopper")

    for label, keep in (("A100 / H100", lambda r: True),
                        ("A100 / H100, flash-attention stacks (what search plans)",
                         lambda r: r.get("stack", "flash") == "flash"),
                        ("H100-class (Hopper), flash-attention stacks",
                         lambda r: r.get("stack", "flash") == "flash" and r["generation"] == "hopper")):
        chosen = [bands[r["id"]] for r in training if dense_megatron(r) and keep(r)]
        halves, inside = [half for _, half in chosen], [ok for ok, _ in chosen]
        if halves:
            print(f"dense Megatron-style training on {label} ({len(halves)} records, "
                  f"{len({r['family'] for r in training if dense_megatron(r) and keep(r)})} families, each left "
                  f"out): median half-width {100 * statistics.median(halves):.1f}% (target <= 12%), coverage "
                  f"{100 * statistics.mean(inside):.1f}%; per source "
                  + _by_source([r for r in training if dense_megatron(r) and keep(r)], bands))
    res = doc["resolution"]
    print(f"\ntie resolution: {res['quantile']} quantile of |r_i - r_j| over {res['pairs']} pairs of layouts in "
          f"{res['groups']} jobs measured in two or more layouts (each job alike): "
          f"{100 * (math.exp(res['value']) - 1):.1f}% "
          f"(log {res['value']:.4f})" + "".join(f"; {k} jobs only {100 * (math.exp(res[k]) - 1):.1f}%"
                                                 f" ({res.get(k + '_groups', '?')} jobs)"
                                                 for k in ("dense", "moe") if k in res))
    for name, data in (("memory", doc["memory"]), ("serving", doc["serving"])):
        if len(data) >= 2:
            lo, hi = np.quantile([r["r"] for r in data], [0.1, 0.9])
            print(f"{name}: {len(data)} residuals, 10th / 90th percentile of measured / predicted "
                  f"x{math.exp(lo):.3f} .. x{math.exp(hi):.3f}")


def anchor_groups(records: list[dict]) -> dict[str, list[dict]]:
    """Runs measured on one cluster with one software stack: accuracy.ranking_groups (Narayanan Table 2 split
    into Megatron-LM's PTD-P rows and DeepSpeed's ZeRO-3 rows, Korthikanti Table 5, MPT scans, torchtitan
    tables) and, for families it does not group, one group per family, GPU and model (a source's
    table of layouts for one model on one machine type)."""
    groups: dict[str, list[dict]] = {}
    for name, recs in acc.ranking_groups(records).items():  # one software stack per group (OTHER_STACK)
        for r in recs:
            stack = stack_of(r, acc.family(r["id"]))
            groups.setdefault(name + ("" if stack == acc.family(r["id"]) else f" ({stack})"), []).append(r)
    grouped = {r["id"] for recs in groups.values() for r in recs}
    for r in records:
        fam = acc.family(r["id"])
        if r["id"] in grouped or fam not in acc.TRAIN_FAMILIES or fam in ("mpt", "narayanan2021", "korthikanti2022",
                                                                          "torchtitan"):
            continue
        key = f"{fam} {r.get('hardware', {}).get('gpu')} {r.get('model', {}).get('name')}"
        groups.setdefault(key, []).append(r)
    return {k: v for k, v in groups.items() if len(v) >= 2}


def _rate(rec: dict, fam: str) -> tuple[float, float] | None:
    """(predicted, measured) rate of a record on the systems acc.builtin_systems gives now."""
    try:
        rows = acc.predict(rec, fam)
    except (LlmplanError, ValueError):
        return None
    row = next((x for x in rows if x[0] != "fits"), None)
    if row is None:
        return None
    q, pred, meas = row
    return (1 / pred, 1 / meas) if q == "iteration s" else (pred, meas)


def calibration_report(records: list[dict], only: str | None = None,
                       exclude: str | None = None) -> list[tuple[str, int, float, float, int]]:
    """Per group: calibrate on each run in turn as `llmplan calibrate --plan --step-time` does
    (llmplan.calibrate.anchored_system on the run's plan and measured step), predict the others with the
    calibrated profile, and compare their median |error| with the shipped profile's. Returns (group, runs,
    median over anchors of the others' median |error| before, after, anchors that improved it)."""
    from llmplan.calibrate import anchored_system

    shipped = builtin_systems()
    out = []
    for name, recs in sorted(anchor_groups(records).items()):
        if only and not any(w.lower() in name.lower() for w in only.split(",")):
            continue
        if exclude and any(w.lower() in name.lower() for w in exclude.split(",")):
            continue
        fam = acc.family(recs[0]["id"])
        rates = {r["id"]: _rate(r, fam) for r in recs}
        recs = [r for r in recs if rates[r["id"]]]
        if len(recs) < 2:
            continue
        befores, afters, better = [], [], 0
        for a in recs:
            pred, meas = rates[a["id"]]
            sysname = acc.record_system(a)
            base = shipped[sysname]
            system = base
            if a["hardware"].get("power_limit_w"):
                system = system.model_copy(update={"gpu": system.gpu.at_power_limit(a["hardware"]["power_limit_w"])})
            gpus = a["hardware"].get("gpus") or 1
            cluster = acc.cluster_of(system, gpus)
            plan = acc.plan_for(a, fam, gpus)
            step = float(estimate_training(acc.model_for(a, fam), cluster, plan).time.total)
            try:
                anchor = anchored_system(acc.model_for(a, fam), cluster, plan, None, DEFAULT_ORDER, step * pred / meas)
            except (LlmplanError, ValueError):  # outside what the profile's bounds can reproduce
                continue
            # the same moves on the uncapped shipped system (ratios for rates, the overhead as set)
            gpu_upd, sys_upd = {}, {}
            for key, before, after in anchor.changes:
                field = key.removeprefix("gpu.")
                target = gpu_upd if key.startswith("gpu.") else sys_upd
                ref = getattr(base.gpu if key.startswith("gpu.") else base, field)
                target[field] = after if field == "step_overhead_s" else ref * after / before
            calibrated = base.model_copy(update={**sys_upd, "gpu": base.gpu.model_copy(update=gpu_upd)})
            others = [r for r in recs if r is not a]
            before_err = [abs(100 * (rates[r["id"]][0] / rates[r["id"]][1] - 1)) for r in others]
            saved = acc.builtin_systems
            acc.builtin_systems = (lambda sysname=sysname, calibrated=calibrated:  # type: ignore[assignment]
                                   {**shipped, sysname: calibrated})
            try:
                after_rates = [_rate(r, fam) for r in others]
            finally:
                acc.builtin_systems = saved
            after_err = [abs(100 * (p / m - 1)) for p, m in (x for x in after_rates if x)]
            if not after_err:
                continue
            befores.append(statistics.median(before_err))
            afters.append(statistics.median(after_err))
            better += afters[-1] < befores[-1]
        if befores:
            out.append((name, len(recs), statistics.median(befores), statistics.median(afters), better))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, default=None, help=f"published runs (default {runs_path()})")
    ap.add_argument("--write", action="store_true", help=f"recompute and write {OUT.relative_to(ROOT)}")
    ap.add_argument("--reuse-fit", action="store_true",
                    help="with --write: reuse the fitted constants the file holds (skips the grid fit)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--calibration", action="store_true",
                    help="also: calibrate on one run of each group measured on one cluster, predict the rest")
    ap.add_argument("--groups", default=None, metavar="TEXT",
                    help="with --calibration: only the groups whose name contains one of TEXT's comma-separated "
                         "words (e.g. narayanan2021,bloom)")
    ap.add_argument("--exclude", default=None, metavar="TEXT",
                    help="with --calibration: leave out the groups whose name contains one of these words")
    ap.add_argument("--no-report", action="store_true", help="skip the coverage report (with --calibration)")
    args = ap.parse_args(argv)
    if args.write:
        doc = write(load_runs(args.runs), args.reuse_fit, args.out)
        print(f"wrote {args.out}")
    else:
        doc = json.loads(args.out.read_text(encoding="utf-8"))
    if not args.no_report:
        report(doc)
    if args.calibration:
        rows = calibration_report(load_runs(args.runs), args.groups, args.exclude)
        print("\nanchoring to one measured run (`llmplan calibrate --plan --step-time`, shipped profiles): per group")
        print("measured on one cluster, each run in turn the anchor; the other runs' median |error| before and after")
        print("(median over anchors), and how many anchors lowered it:")
        print(f"  {'group':44s} {'runs':>4s} {'before':>7s} {'after':>7s} {'anchors better':>15s}")
        for name, n, b, a, better in rows:
            print(f"  {name[:44]:44s} {n:4d} {b:6.1f}% {a:6.1f}% {better:9d} of {n}")
        if rows:
            print(f"  median over groups: before {statistics.median(r[2] for r in rows):.1f}%, after "
                  f"{statistics.median(r[3] for r in rows):.1f}%; improved in {sum(r[3] < r[2] for r in rows)} of "
                  f"{len(rows)} groups")
    return 0


if __name__ == "__main__":
    sys.exit(main())
