"""Probe (prices nothing, changes no profile): the Llama rows of Megatron-Bridge on B200 / GB200 / GB300 (and the
H100 ones, at the shipped Hopper constants) term by term, the Blackwell rows of the cuDNN 9.11 / 9.13 containers at
NVIDIA's published cuDNN 9.13 SDPA training rate (benchmarks/blackwell_release_probe.py), with what each candidate
term for the larger plans would do at its bound. docs/validation.md#bw-large.

Columns: error shipped -> at the published rate; gap = measured - predicted step (s); per step: GEMM, attention,
memory-bound, bubble, exposed communication by axis, overhead + optimizer; the step's TP / PP / DP traffic before
overlap and how much of it llmplan hides; then three bounds: the one factor on every GEMM that would close the row
(gemm x), the row with every TP / PP / CP / DP transfer exposed (all comm), and the row with a pipeline that gains
nothing from interleaving, (p - 1)(1 - 1/v) micro-batches more bubble (no interleave).
--gb200-913: GB200 at B200's cuDNN 9.13 asymptote of the sustained clock (same die and release) instead of the
9.17 rate NVIDIA published for GB200, a later release than its rows ran.
Run: PYTHONPATH=. python benchmarks/bw_large_probe.py [--gb200-913]
"""
from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy as A  # noqa: E402
import blackwell_release_probe as P  # noqa: E402

from llmplan.cost.attention_rate import published_rate_clock  # noqa: E402
from llmplan.cost.comm import comm_seconds  # noqa: E402
from llmplan.estimate import estimate_training  # noqa: E402

SYSTEMS = ("dgx-b200", "gb200-nvl72", "gb300-nvl72", "dgx-h100")


def row(r: dict, fam: str, asym: dict[str, float]) -> str | None:
    """One row's line: errors, gap, terms at the published rate (the shipped constants where none applies)."""
    setup = A.record_setup(r, fam)
    if setup is None or "tokens_per_s_per_gpu" not in r.get("measured", {}):
        return None
    m, c, p = setup
    g, name = c.system.gpu, A.record_system(r)
    c1, tag = c, "shipped"
    if name in asym and A.record_container(r) in ("nemo:25.09", "nemo:25.11"):
        eff = asym[name] * published_rate_clock(g) / g.softmax_attention_ratio
        c1, tag = c.model_copy(update={"system": c.system.model_copy(update={
            "gpu": g.model_copy(update={"attention_efficiency": eff})})}), "pub"
    meas = r["measured"]["tokens_per_s_per_gpu"]
    e0, e = estimate_training(m, c, p), estimate_training(m, c1, p)
    err0, tok = float(e0.throughput.tokens_per_s) / c.num_gpus, float(e.throughput.tokens_per_s) / c.num_gpus
    t, n = e.time, p.num_microbatches
    T = float(t.total)
    gap = T * tok / meas - T
    cs = comm_seconds(e.comm, c1.system)
    traffic = float(cs.tp + cs.pp + cs.cp + cs.dp_reduce + cs.dp_gather)
    exposed = sum(float(t.exposed[k]) for k in ("tp", "pp", "cp", "dp"))
    gemm = n * float(t.stage.gemm)
    no_ilv = (p.pp - 1) * (1 - 1 / p.vpp) * float(t.stage.total) if p.pp > 1 else 0.0

    def err(extra: float) -> float:
        return 100 * (tok * T / (T + extra) - meas) / meas
    lay = f"tp{p.tp}pp{p.pp}vp{p.vpp}cp{p.cp}dp{p.dp} n{n} z{p.zero} off{p.offload_layers}"
    return (f"{r['id'][:52]:52s} {lay:34s} {100 * (err0 - meas) / meas:+6.1f} -> {err(0):+6.1f}% ({tag:7s}) "
            f"gap {gap:+6.2f}s | gemm {gemm:6.2f} attn {n * float(t.stage.attention):5.2f} mem "
            f"{n * float(t.stage.memory_bound):5.2f} bub {float(t.bubble):5.2f} exp tp/pp/cp/dp "
            f"{'/'.join(f'{float(t.exposed[k]):.2f}' for k in ('tp', 'pp', 'cp', 'dp'))} ovh+opt "
            f"{float(t.overhead + t.optimizer):5.2f} | traffic tp {float(cs.tp):.2f} pp {float(cs.pp):.2f} dp "
            f"{float(cs.dp_reduce + cs.dp_gather):.2f} hidden {traffic - exposed:5.2f} | gemm x {1 + gap / gemm:.2f}"
            f" all comm {err(traffic - exposed):+6.1f}% no interleave {err(no_ilv):+6.1f}%")


def main(argv: list[str]) -> None:
    records = yaml.safe_load(A.DEFAULT_RUNS.read_text())
    with contextlib.redirect_stdout(io.StringIO()):
        asym = P.asymptotes({r["id"]: r for r in records})
    if "--gb200-913" in argv:
        asym["gb200-nvl72"] = asym["dgx-b200"]
    for r in records:
        fam = A.family(r["id"])
        if fam not in ("bridge", "mbridge-dense") or "llama" not in r["id"] or A.record_system(r) not in SYSTEMS:
            continue
        if A.record_container(r) not in ("nemo:25.09", "nemo:25.11"):
            continue
        line = row(r, fam, asym)
        if line:
            print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
