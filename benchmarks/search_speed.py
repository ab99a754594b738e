"""Search speed: plans evaluated per second and wall time of three large searches (not a test).

    python benchmarks/search_speed.py [--repeat 3]

Cases: gpt3-175b on 1024 A100 (128 x dgx-a100, global batch 1536, seq 2048); llama-3.1-405b on 16384 H100
(2048 x dgx-h100, seq 8192, 16M tokens per batch); deepseek-v3 on 2048 H800 with EP (256 x dgx-h800, seq
4096, global batch 4096); llama-3.1-405b on 100,000 H100 (12,500 x dgx-h100, seq 8192, global batch 10,000:
16M tokens, 2,048 sequences, leaves no valid dp on 2^5 x 5^5 GPUs), every axis free; deepseek-v3 in MXFP8 on
32 GB300 NVL72 racks (576 x gb300-nvl72 trays) and llama-3.1-405b on 16 GB200 NVL72 racks (288 trays). Targets:
under 3 s each for the first three and the NVL72 cases, under 10 s and 4 GiB for the fourth, at least 10^6
plans/s. Since
uneven pipeline stages (every pp that divides the GPUs, with the balanced split, and every interleave the
layout allows) the spaces are 138,240 / 77,760 / 498,960 / 112,320 plans (they were 311,040 / 207,360 /
544,320 with a fixed vpp grid of 1-8 and pp limited to divisors of the layers). The peak resident memory
of each case is printed beside it. Each case runs in a fresh process, as one `llmplan search` command
does (a process that has already run a large search allocates the next one's arrays more slowly, which
measured 25% on the deepseek case). Each time is the whole search: enumerate, prune, evaluate
memory and step time, rank, and the scalar re-estimate of the shown plans, for every search `llmplan search`
runs (cli.search.train_search: the memory switch settings, the MoE dispatchers and, on NVL72 racks, both
NVLink-domain shares; `searches` counts them, plans/s counts each search's plans), so the best plan is the one
the command shows (docs/validation.md#search-deepep). `--pin-dispatcher` times it as `--moe-dispatcher alltoall`
does (the MoE dispatcher not searched). A rich progress bar runs on a
terminal. Beside the wall time, the CPU time of the search process (time.process_time, best of the repeats):
on a machine other jobs share, wall time counts their turns too.

Then one targeted search, the whole command as a user runs it (`llmplan search ... --target torchtitan --json`
in a fresh process: import, search, the walk over the plans that fit, the side outputs, the JSON): its wall and
CPU seconds (the child process's user + system time), best of the repeats, and what its walk did
(`target_walk`). `--targeted-only` runs that line alone.
"""

from __future__ import annotations

import argparse
import multiprocessing
import json
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from llmplan.search.grid import default_space, enumerate_plans
from llmplan.specs.registry import resolve_model

CASES = [
    ("gpt3-175b", "dgx-a100", 128, 1536, 2048),
    ("llama-3.1-405b", "dgx-h100", 2048, 16 * 1024**2 // 8192, 8192),
    ("deepseek-v3", "dgx-h800", 256, 4096, 4096),
    ("llama-3.1-405b", "dgx-h100", 12500, 10000, 8192),  # 100,000 H100 (= 2^5 x 5^5): a batch dp can divide
    ("deepseek-v3", "gb300-nvl72", 576, 4096, 4096, "mxfp8"),  # 32 GB300 NVL72 racks (2,304 GPUs), MXFP8
    ("llama-3.1-405b", "gb200-nvl72", 288, 2048, 8192),  # 16 GB200 NVL72 racks (1,152 GPUs)
]


def options(model: str, system: str, nodes: int, gbs: int, seq: int, precision: str, pin_dispatcher: bool) -> dict:
    """The option groups `llmplan search --model M --hardware S --nodes N --global-batch B --seq-len L
    [--precision P] --top 5` builds: every other option at its command-line default (cli.options)."""
    from llmplan.cli import options as opt
    from llmplan.specs import options as so

    def group(cls: type, flags: object, **given: object) -> object:
        defaults = {k: o.default for k, o in flags.options.items() if o.default is not ...}  # type: ignore[attr-defined]
        return cls(**{**defaults, **given})

    return dict(c=group(so.ClusterOptions, opt.CLUSTER, model=model, hardware=system, nodes=nodes),
                pins=group(so.SearchPins, opt.SEARCH_PINS, global_batch=gbs),
                goal=group(so.SearchGoal, opt.SEARCH_GOAL, top=5),
                s=group(so.SwitchOptions, opt.SEARCH_SWITCHES, seq_len=seq,
                        precision=None if precision == "bf16" else precision),
                split=group(so.PipelineSplitOptions, opt.PIPELINE_SPLIT), memory=group(so.MemoryOptions, opt.MEMORY),
                checkpoints=group(so.CheckpointOptions, opt.CHECKPOINTS),
                output=so.OutputOptions(json_mode=True, save=None, force=False),
                named=frozenset({"model", "hardware", "nodes", "global_batch", "seq_len", "top"}
                                | ({"precision"} if precision != "bf16" else set())
                                | ({"moe_dispatcher"} if pin_dispatcher else set())))


def run_case(model: str, system: str, nodes: int, gbs: int, seq: int, precision: str, repeat: int,
             pin_dispatcher: bool = False) -> dict:
    """One case, best of `repeat` searches, in the calling process (the pool gives each case its own): the
    search `llmplan search` runs (cli.search.train_search: every switch setting, MoE dispatcher and NVLink-domain
    share it tries), so the best plan is the one a user sees."""
    from llmplan.cli.search import train_search

    best_t, best_cpu, ts = float("inf"), float("inf"), None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        ts = train_search(**options(model, system, nodes, gbs, seq, precision, pin_dispatcher))
        best_t = min(best_t, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    assert ts is not None
    res, cluster, w = ts.result, ts.cluster, ts.workload
    m = resolve_model(model)
    n = len(enumerate_plans(default_space(m, cluster, w), cluster, w))
    p = res.ranked[0].plan if res.ranked else None
    tried = [t for t, _ in res.switches.tried] if res.switches else [{}]
    dispatched = sum(1 for t in tried if t.get("moe_dispatcher", w.moe_dispatcher) != tried[0].get(
        "moe_dispatcher", w.moe_dispatcher) or t.get("ep_comm_overlap"))  # the dispatchers and the EP overlap
    # tried after the memory settings, on one share
    searches = (len(tried) - dispatched) * (1 if res.domain is None else 2) + dispatched
    dispatch = "" if p is None or p.ep == 1 else f" {p.moe_dispatcher}" + (
        f"/{p.moe_flex_backend}" if p.moe_dispatcher == "deepep" else "")
    return {
        "gpus": cluster.num_gpus, "plans": n, "feasible": res.feasible, "seconds": best_t, "cpu_seconds": best_cpu,
        "searches": searches,
        "plan": (f"tp{p.tp} pp{p.pp} dp{p.dp} cp{p.cp} ep{p.ep} vpp{p.vpp} z{p.zero} {p.recompute} mb{p.micro_batch}"
                 f"{dispatch}" if p else "none fits"),
        "mfu": f"{100 * float(res.ranked[0].throughput.mfu):.1f}%" if res.ranked else "-",
        "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


TARGETED = ["--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "8", "--target", "torchtitan"]
"""The targeted search timed (search.filtered's walk: docs/validation.md#walk-fast)."""


def run_targeted(repeat: int) -> dict:
    """`llmplan search TARGETED --json` in a fresh process, `repeat` times: least wall and CPU seconds."""
    best_t, best_cpu, doc = float("inf"), float("inf"), {}
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "llmplan", "search", *TARGETED, "--json"], check=True,
                             capture_output=True, text=True).stdout
        best_t = min(best_t, time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        best_cpu = min(best_cpu, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        doc = json.loads(out)
    return {"seconds": best_t, "cpu_seconds": best_cpu, "walk": doc.get("target_walk", {})}


def targeted_line(repeat: int) -> str:
    r = run_targeted(repeat)
    w = r["walk"]
    return (f"targeted: llmplan search {' '.join(TARGETED)}: wall {r['seconds']:.2f} s, CPU {r['cpu_seconds']:.2f} s "
            f"(best of {repeat}; whole command); its walk asked {w.get('checked', 0):,} plans, passed over "
            f"{w.get('passed', 0):,}, {w.get('walk_s', 0.0):.3f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--targeted-only", action="store_true", help="time the targeted search alone")
    ap.add_argument("--pin-dispatcher", action="store_true",
                    help="as `llmplan search --moe-dispatcher alltoall`: the MoE dispatcher not searched")
    ap.add_argument("--only", default=None, metavar="MODEL",
                    help="time only the cases of this model (e.g. deepseek-v3: the MoE rows)")
    args = ap.parse_args()
    cases = [c for c in CASES if args.only is None or c[0] == args.only]
    console = Console()
    if args.targeted_only:
        console.print(targeted_line(args.repeat))
        return
    if not console.is_terminal:
        console.width = max(console.width, 160)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    table = Table(title=f"llmplan search speed (best of {args.repeat}, each case in a fresh process; "
                  f"{os.cpu_count()} CPUs visible, numpy single-threaded ops; load average {load:.1f} at the start: "
                  "on a shared machine the CPU seconds are the steadier measure)")
    for col in ("case", "GPUs", "plans", "searches", "feasible", "wall s", "plans/s", "CPU s", "plans/CPU-s", "best plan", "MFU",
                "peak GiB"):
        table.add_column(col, justify="left" if col in ("case", "best plan") else "right")
    spawn = multiprocessing.get_context("spawn")
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("searching", total=len(cases))
        for model, system, nodes, gbs, seq, *rest in cases:
            precision = rest[0] if rest else "bf16"
            with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
                r = pool.submit(run_case, model, system, nodes, gbs, seq, precision, args.repeat,
                                args.pin_dispatcher).result()
            bar.advance(task)
            table.add_row(f"{model} / {system}", f"{r['gpus']:,}", f"{r['plans']:,}", str(r["searches"]),
                          f"{r['feasible']:,}",
                          f"{r['seconds']:.2f}", f"{r['plans'] * r['searches'] / r['seconds']:,.0f}",
                          f"{r['cpu_seconds']:.2f}", f"{r['plans'] * r['searches'] / r['cpu_seconds']:,.0f}", r["plan"], r["mfu"],
                          f"{r['rss_gib']:.2f}")
    console.print(table)
    console.print(targeted_line(args.repeat))


if __name__ == "__main__":
    main()
