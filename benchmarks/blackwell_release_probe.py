"""Probe (prices nothing, changes no profile): the Blackwell training rows of the cuDNN 9.11 / 9.13 containers
(Megatron-Bridge nemo:25.09 / nemo:25.11) re-priced with NVIDIA's published cuDNN SDPA training rate of the
release those containers ship, against the shipped attention asymptote. docs/validation.md#bw-profile.

Published rates: NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/artifacts, bf16, causal, batch 1,
128 query / 8 KV heads, head dim 128, forward and backward TFLOP/s on the script's count (causal pairs, backward
2.5x the forward). B200 and GB300: PyTorch nv25.09, torch.backends.cudnn.version() 91300, backend pyt_cudnn
(sdpa_bf16_benchmark_results_NVIDIA_{B200,GB300}.csv at bb37575d; sample_b200_bf16_run.txt at cb560b92,
sample_gb300_bf16_run.txt at 0b1577c8). GB200: cuDNN backend 9.17.0, backend cudnn_fe
(sdpa_bf16_benchmark_results_NVIDIA_GB200.csv, sample_gb200_bf16_run.txt at d48a60eb): a later release than
the rows ran. Run: PYTHONPATH=. python benchmarks/blackwell_release_probe.py [--all-containers]
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy as A  # noqa: E402

from llmplan.cost.attention_rate import attention_rate_ratio, published_rate_clock  # noqa: E402
from llmplan.estimate import estimate_training  # noqa: E402

PUBLISHED = {  # system: (release, {seq: (forward, backward) TFLOP/s})
    "dgx-b200": ("9.13.0", {8192: (1171.278, 942.509), 16384: (1332.415, 1074.776), 32768: (1419.0, 1108.688)}),
    "gb300-nvl72": ("9.13.0", {8192: (1495.674, 1130.076), 16384: (1702.463, 1267.827),
                               32768: (1795.879, 1319.161)}),
    "gb200-nvl72": ("9.17.0", {8192: (1584.0, 1211.0), 16384: (1668.0, 1304.0), 32768: (1681.0, 1348.0)}),
}
REFERENCE_ROW = {"dgx-b200": "bridge-2511-b200-fp8-cs-llama3-8b-8gpu-gbs128",
                 "gb300-nvl72": "bridge-2511-gb300-mxfp8-llama3-8b-8gpu-gbs128",
                 "gb200-nvl72": "bridge-2511-gb200-fp8-cs-llama3-8b-8gpu-gbs128"}


def asymptotes(records: dict) -> dict[str, float]:
    """Each GPU's published 8k asymptote (llmplan's count 6 / (1/fwd + 2.5/bwd), over the bf16 peak, the rate
    curve at the benchmark's shape divided out: docs/formulas.md#compute.cp_attention), printed at 8k-32k."""
    out: dict[str, float] = {}
    for name, (release, points) in PUBLISHED.items():
        m, c, p = A.record_setup(records[REFERENCE_ROW[name]], "bridge")
        g = c.system.gpu
        peak = g.peak_flops("bf16") / 1e12
        for s, (fwd, bwd) in points.items():
            rate = 6 / (1 / fwd + 2.5 / bwd)
            curve = float(attention_rate_ratio(m, p.model_copy(update={"seq_len": s, "micro_batch": 4, "tp": 1,
                                                                       "cp": 1}), g))
            asym = rate / peak / curve
            out.setdefault(name, asym)
            print(f"{name} cuDNN {release} s={s}: {rate:.0f} TFLOP/s = {rate / peak:.3f} of peak, curve {curve:.3f},"
                  f" asymptote {asym:.3f}, of sustained {asym * published_rate_clock(g):.3f}"
                  f" (shipped {g.attention_efficiency * g.softmax_attention_ratio:.3f})")
    return out


def main(argv: list[str]) -> None:
    records = yaml.safe_load(A.DEFAULT_RUNS.read_text())
    asym = asymptotes({r["id"]: r for r in records})
    errs: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in records:
        fam, name = A.family(r["id"]), A.record_system(r)
        if fam not in A.FAMILIES or fam == "trtllm" or name not in asym:
            continue
        if "--all-containers" not in argv and A.record_container(r) not in ("nemo:25.09", "nemo:25.11"):
            continue
        setup = A.record_setup(r, fam)
        if setup is None or "tokens_per_s_per_gpu" not in r.get("measured", {}):
            continue
        m, c, p = setup
        g = c.system.gpu
        eff = asym[name] * published_rate_clock(g) / g.softmax_attention_ratio  # the published rate, exp included
        c1 = c.model_copy(update={"system": c.system.model_copy(update={
            "gpu": g.model_copy(update={"attention_efficiency": eff})})})
        meas = r["measured"]["tokens_per_s_per_gpu"]
        before, after = (100 * (float(estimate_training(m, cl, p).throughput.tokens_per_s) / c.num_gpus - meas) / meas
                         for cl in (c, c1))
        errs.setdefault((fam, name), []).append((before, after))
        print(f"{fam:13s} {A.record_container(r)!s:10s} {r['id'][:64]:64s} {before:+6.1f} -> {after:+6.1f}%")
    for (fam, name), v in sorted(errs.items()):
        print(f"{fam} {name} ({len(v)}): median signed {statistics.median(a for a, _ in v):+.1f} -> "
              f"{statistics.median(b for _, b in v):+.1f}%")


if __name__ == "__main__":
    main(sys.argv[1:])
