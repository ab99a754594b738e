"""The 405B reference search's top plan against the published bf16 H100 runs nearest it (not a test).

    python benchmarks/cp_short.py

`llmplan search --model llama-3.1-405b --hardware dgx-h100 --nodes 2048 --global-batch 2048 --seq-len 8192`
(benchmarks/search_speed.py's 405B case: 16,384 H100, 16M tokens a step) ranks tp8 pp8 dp128 cp2 vpp16 first.
Printed, term by term (seconds a step, the most loaded stage):

1. NVIDIA DGX Cloud Benchmarking's bf16 Llama 3.1 405B runs (NVIDIA/dgxc-benchmarking llama3.1/README.md at
   85380ffe, NeMo 25.02: TP8 PP8 CP2 VP8, 512 / 1,024 / 2,048 H100, 64 micro-batches a pipeline), records
   dgxc-2504-*-405b-*, as accuracy.py prices them, with their measured tokens/s as MFU under llmplan's FLOP
   count (the README's own count is 0.9% higher: 55.47 / 55.31 / 55.22%);
2. the same recipe moved toward the search's plan one change at a time (16,384 GPUs at 16M tokens: dp 128,
   16 micro-batches a pipeline; then vpp 16), and the search's own #1 (its default switches);
3. Llama 3's layouts (Dubey et al. 2024, arXiv 2407.21783, Table 4: TP8 CP1 PP16, 8,192 and 16,384 H100,
   16M tokens; 43% and 41% MFU), with NeMo's switches and with the fp32 gradient reduction the paper states
   (its numerical-stability paragraph: gradients reduce-scattered in FP32 across the data-parallel workers in
   FSDP) without TP overlap (the paper names none), then with every TP
   collective synchronous (Megatron-LM overlaps the input-gradient all-gather with the weight-gradient GEMMs
   by default; Meta's stack is not published); V is not published: vpp 8;
   Meta's split, one layer fewer on the first and the last stage (7 + 8 x 14 + 7).
   Both are priced without recompute, as §3.3.2 says the job ran, though llmplan predicts neither fits 80 GB,
   and on the dgx-h100 profile's InfiniBand (Meta ran the 405B job on a 400 Gb/s RoCE fabric)
   (docs/validation.md#llama3-8k-memory).

docs/validation.md#cp-short reads it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy as A  # noqa: E402

from llmplan.estimate import estimate_training  # noqa: E402

RUNS = Path(__file__).resolve().parent / "data" / "published_runs.yaml"
BASE = "dgxc-2504-pretrain-llama3.1-405b-h100-{}gpu-bf16-tp8pp8cp2vp8mbs1gbs{}"
SEARCH = ["search", "--model", "llama-3.1-405b", "--hardware", "dgx-h100", "--nodes", "2048",
          "--global-batch", "2048", "--seq-len", "8192", "--top", "1", "--json"]


def terms(label: str, plan: object, t: object, mfu: float, measured: float | None) -> str:
    ex = t.exposed  # type: ignore[attr-defined]
    meas = f"{measured * 100:5.1f}" if measured else "    -"
    return (f"{label:34s} dp{plan.dp:<4d} n{plan.num_microbatches:<3d} {mfu * 100:5.1f} {meas} "  # type: ignore[attr-defined]
            f"{t.total:6.2f} {t.compute:6.2f} {t.bubble:5.3f} {ex['tp']:5.3f} {ex['pp']:5.3f} "  # type: ignore[attr-defined]
            f"{ex['dp']:5.3f} {ex['cp']:5.3f} {t.overhead:5.3f}")  # type: ignore[attr-defined]


def row(rec: dict, label: str, measured: float | None = None, **change: object) -> str:
    model, cluster, plan = A.record_setup(rec, "dgxc")  # type: ignore[misc]
    if change:
        gpus = int(change.pop("gpus", cluster.num_gpus))  # type: ignore[call-overload]
        if gpus != cluster.num_gpus:
            cluster = A.cluster_of(cluster.system, gpus)
        plan = plan.model_copy(update=change)
        plan = plan.model_copy(update={"dp": gpus // (plan.tp * plan.pp * plan.cp)})
    e = estimate_training(model, cluster, plan)
    if measured is None and not change:  # the record's tokens/s under llmplan's FLOP count
        tokens = rec["measured"]["tokens_per_s_per_gpu"] * cluster.num_gpus
        measured = e.throughput.mfu * tokens / e.throughput.tokens_per_s
    return terms(label, plan, e.time, e.throughput.mfu, measured)


def main() -> None:
    recs = {r["id"]: r for r in yaml.safe_load(RUNS.read_text())}
    head = (f"{'plan':34s} {'dp':5s} {'n':4s} {'MFU':>5s} {'meas':>5s} {'step':>6s} {'comp':>6s} {'bub':>5s} "
            f"{'tp':>5s} {'pp':>5s} {'dp':>5s} {'cp':>5s} {'ovh':>5s}")
    print("1-2. DGX Cloud's 405B bf16 runs (tp8 pp8 cp2 vp8) and the steps to the search's #1; n: micro-batches a")
    print("pipeline; MFU %, predicted and measured; seconds a step")
    print(head)
    for gpus, gbs in ((512, 256), (1024, 512), (2048, 1024)):
        rec = recs[BASE.format(gpus, gbs)]
        print(row(rec, f"dgxc {gpus} GPUs, {gbs} x 8192"))
    r2048 = recs[BASE.format(2048, 1024)]
    print(row(r2048, "  same, vpp 16", vpp=16))
    print(row(r2048, "  16,384 GPUs, 2048 x 8192", gpus=16384, global_batch=2048))
    print(row(r2048, "  16,384 GPUs, 2048 x 8192, vpp 16", gpus=16384, global_batch=2048, vpp=16))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-m", "llmplan", *SEARCH], capture_output=True, text=True, env=env,
                         check=True).stdout
    p = json.loads(out)["plans"][0]
    t, pl = p["time"], p["plan"]
    ex = t["exposed_s"]
    name = f"search #1 tp{pl['tp']} pp{pl['pp']} cp{pl['cp']} vpp{pl['vpp']}"
    n = pl["global_batch"] // (pl["micro_batch"] * pl["dp"])
    print(f"{name:34s} dp{pl['dp']:<4d} n{n:<3d} {p['throughput']['mfu'] * 100:5.1f}     - {t['step_s']:6.2f} "
          f"{t['compute_s']:6.2f} {t['bubble_s']:5.3f} {ex['tp']:5.3f} {ex['pp']:5.3f} {ex['dp']:5.3f} "
          f"{ex['cp']:5.3f} {t['overhead_s']:5.3f}")
    print()
    print("3. Llama 3 Table 4's layouts (tp8 cp1 pp16, 16M tokens; measured 43% / 41%), vpp 8, no recompute")
    print(head)
    for gpus, meas in ((8192, 0.43), (16384, 0.41)):
        meta = dict(gpus=gpus, global_batch=2048, pp=16, cp=1, vpp=8, pp_first=7, pp_last=7)
        print(row(r2048, f"NeMo switches, {gpus:,} GPUs", meas, **meta))
        off = dict(grad_dtype="fp32", tp_comm_overlap=False, tp_overlap_sms=None, tp_overlap_margin_sms=None)
        print(row(r2048, f"  fp32 grads, no TP overlap", meas, **off, **meta))
        print(row(r2048, f"  and every TP collective in line", meas, tp_backward_overlap=False, **off, **meta))


if __name__ == "__main__":
    main()
