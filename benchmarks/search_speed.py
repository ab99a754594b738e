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
measured 25% on the deepseek case). Each time is the whole `search()` call: enumerate, prune, evaluate
memory and step time, rank, and the scalar re-estimate of the shown plans. A rich progress bar runs on a
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

from llmplan.search.grid import Workload, default_space, enumerate_plans
from llmplan.search.run import search
from llmplan.specs.plan import ClusterSpec
from llmplan.specs.registry import resolve_model, resolve_system

CASES = [
    ("gpt3-175b", "dgx-a100", 128, 1536, 2048),
    ("llama-3.1-405b", "dgx-h100", 2048, 16 * 1024**2 // 8192, 8192),
    ("deepseek-v3", "dgx-h800", 256, 4096, 4096),
    ("llama-3.1-405b", "dgx-h100", 12500, 10000, 8192),  # 100,000 H100 (= 2^5 x 5^5): a batch dp can divide
    ("deepseek-v3", "gb300-nvl72", 576, 4096, 4096, "mxfp8"),  # 32 GB300 NVL72 racks (2,304 GPUs), MXFP8
    ("llama-3.1-405b", "gb200-nvl72", 288, 2048, 8192),  # 16 GB200 NVL72 racks (1,152 GPUs)
]


def run_case(model: str, system: str, nodes: int, gbs: int, seq: int, precision: str, repeat: int) -> dict:
    """One case, best of `repeat` searches, in the calling process (the pool gives each case its own)."""

    from llmplan.specs.plan import PRECISIONS

    m, s = resolve_model(model), resolve_system(system)
    cluster = ClusterSpec(system=s, num_nodes=nodes)
    dtype, recipe = PRECISIONS[precision]
    # The switches `llmplan search` defaults to (--tp-comm-overlap on), so the time is a user's search's.
    w = Workload(global_batch=gbs, seq_len=seq, dtype=dtype, recipe=recipe, tp_comm_overlap=True)
    space = default_space(m, cluster, w)
    best_t, best_cpu, res = float("inf"), float("inf"), None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        res = search(m, cluster, space, w, top=5)
        best_t = min(best_t, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    n = len(enumerate_plans(space, cluster, w))
    p = res.ranked[0].plan if res.ranked else None
    return {
        "gpus": cluster.num_gpus, "plans": n, "feasible": res.feasible, "seconds": best_t, "cpu_seconds": best_cpu,
        "plan": (f"tp{p.tp} pp{p.pp} dp{p.dp} cp{p.cp} ep{p.ep} vpp{p.vpp} z{p.zero} {p.recompute} mb{p.micro_batch}"
                 if p else "none fits"),
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
    args = ap.parse_args()
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
    for col in ("case", "GPUs", "plans", "feasible", "wall s", "plans/s", "CPU s", "plans/CPU-s", "best plan", "MFU",
                "peak GiB"):
        table.add_column(col, justify="left" if col in ("case", "best plan") else "right")
    spawn = multiprocessing.get_context("spawn")
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("searching", total=len(CASES))
        for model, system, nodes, gbs, seq, *rest in CASES:
            precision = rest[0] if rest else "bf16"
            with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
                r = pool.submit(run_case, model, system, nodes, gbs, seq, precision, args.repeat).result()
            bar.advance(task)
            table.add_row(f"{model} / {system}", f"{r['gpus']:,}", f"{r['plans']:,}", f"{r['feasible']:,}",
                          f"{r['seconds']:.2f}", f"{r['plans'] / r['seconds']:,.0f}", f"{r['cpu_seconds']:.2f}",
                          f"{r['plans'] / r['cpu_seconds']:,.0f}", r["plan"], r["mfu"],
                          f"{r['rss_gib']:.2f}")
    console.print(table)
    console.print(targeted_line(args.repeat))


if __name__ == "__main__":
    main()
