"""How much of the Nemotron-3 rows' error the Mamba-2 mixer can hold, bounded by the dense hybrid's published
step times (records dgxc-*, Nemotron-H 56B; docs/validation.md#mamba-dense-hybrid).

Prints, per Mamba-2 layer and micro-batch (forward and backward), the time llmplan prices for the mixer's scan
and traffic (the step with that cost at x1 minus x0) beside what the row leaves unplaced (measured minus
predicted step, over its micro-batches and Mamba-2 layers); then the median signed tokens/s error per model
when llmplan's whole Mamba-2 cost (cost.mixers.mamba_scan_flops, mamba_scan_backward_flops and
mamba_memory_bytes) is scaled by k. The
scaling is an experiment on the shipped functions, not a pricing. Last, per model and GPU, the k each row
would need for its predicted step to equal the measured one (1 + unplaced / the Mamba-2 cost priced in its step):
one k across GPUs, releases and micro-batch sizes is what a mis-priced kernel would give; a spread is not.
Then the same k for a pure Mamba-2 model on A100, H200 and GB200 from the one published cross-GPU measurement
(state-spaces/mamba issue 904, 2026-04-06: Mamba-2 at 102.5 / 239.2 / 360.4 TFLOP/s, d_model 2048, 48 layers,
4 x 4,096 tokens, bf16; its FLOP count unstated, so only the ratios are used): with the A100 mixer taken at k_A
(1.0, 1.1, 1.2), the H200 and GB200 k that make llmplan's step ratios equal the measured ones
(docs/validation.md#nano-per-token).

    python benchmarks/mamba_bound.py
"""

from __future__ import annotations

import statistics
from typing import Any
from unittest import mock

import accuracy as A
from runs import load_runs

from llmplan.cost import mixers
from llmplan.estimate import estimate_training
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

ROWS = ("dgxc-2510-pretrain-nemotron-h-56b-gb200-128gpu-fp8-tp4pp1mbs2gbs384",
        "mbridge-26.06-pretrain-nemotron-3-nano-dgx-gb200-8gpu-mxfp8-tp1pp1cp1ep8vpnagbs512mbs2",
        "dgxc-2508-pretrain-nemotron-h-56b-h100-128gpu-fp8-tp8pp1mbs1gbs384",
        "mbridge-26.06-pretrain-nemotron-3-nano-dgx-h100-16gpu-fp8-tp1pp1cp1ep8vpnagbs1024mbs1")
GROUPS = (("nano", "mbridge-", "nemotron-3-nano"), ("super", "mbridge-", "nemotron-3-super"),
          ("56b", "dgxc-", "nemotron-h-56b"), ("deepseek-v3", "mbridge-", "deepseekv3"), ("qwen3", "mbridge-", "qwen3"))
"""(name, id prefix, id part) of the rows whose median error is printed."""
SCAN, BACKWARD, TRAFFIC = mixers.mamba_scan_flops, mixers.mamba_scan_backward_flops, mixers.mamba_memory_bytes


def scaled(k: float) -> Any:
    """Patch the Mamba-2 scan FLOPs and traffic to k times the shipped functions."""
    return mock.patch.multiple(mixers, mamba_scan_flops=lambda m: k * SCAN(m),
                               mamba_scan_backward_flops=lambda m: k * BACKWARD(m),
                               mamba_memory_bytes=lambda m, b=1: k * TRAFFIC(m, b))


def step(rec: dict) -> tuple[float, int, int, float]:
    """(predicted step s, micro-batches per step, Mamba-2 layers, measured step s) of a tokens/s record, from
    accuracy.predict's tokens/s (the step moves global batch x sequence tokens over all GPUs)."""
    fam, gpus = A.family(rec["id"]), rec["hardware"]["gpus"]
    plan = A.plan_for(rec, fam, gpus)
    pred, meas = next((p, m) for quantity, p, m in A.predict(rec, fam) if quantity == "tok/s/GPU")
    tokens = plan.global_batch * plan.seq_len
    return (tokens / (pred * gpus), plan.global_batch // (plan.dp * plan.micro_batch),
            A.model_for(rec, fam).count_layers("mamba"), tokens / (meas * gpus))


def priced_and_unplaced(rec: dict) -> tuple[float, float, int, int]:
    """(the Mamba-2 cost priced in the step s, what the row leaves unplaced s = measured - predicted step,
    micro-batches per step, Mamba-2 layers) of a tokens/s record."""
    with scaled(0.0):
        without, *_ = step(rec)
    pred, n_mb, layers, measured = step(rec)
    return pred - without, measured - pred, n_mb, layers


ISSUE_904_TFLOPS = {"dgx-a100": 102.5, "dgx-h200": 239.2, "gb200-nvl72": 360.4}
"""state-spaces/mamba issue 904, 'Training throughput' table, Mamba2 TFLOP/s (same model and batch on each GPU)."""


def mamba2_1b3() -> ModelSpec:
    """mamba_ssm's MambaLMHeadModel at d_model 2048, 48 Mamba2 layers (expand 2, headdim 64, d_state 128, one
    group, chunk 256, no MLP, tied embeddings, vocabulary 50,288): issue 904's model (as tests/test_mamba2_blackwell.py)."""
    nano = builtin_models()["nemotron-3-nano"].model_dump(exclude_defaults=True)
    for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
              "n_group", "topk_group", "scoring_func", "routed_scaling_factor", "expert_bias", "declared_params"):
        nano.pop(k, None)
    nano.update(name="mamba2-1.3b", hidden_size=2048, num_hidden_layers=48, layer_types=("mamba",) * 48,
                mlp_layer_types=("none",) * 48, mamba_num_heads=64, mamba_head_dim=64, ssm_state_size=128,
                n_groups=1, mamba_chunk_size=256, vocab_size=50288, num_attention_heads=16, num_key_value_heads=16,
                head_dim=128, tie_word_embeddings=True)
    return ModelSpec(**nano)


def issue904_split() -> dict[str, tuple[float, float]]:
    """(step without the Mamba-2 cost s, the Mamba-2 cost s) of issue 904's model on one GPU of each system."""
    plan = ParallelPlan(tp=1, pp=1, dp=1, seq_len=4096, micro_batch=4, global_batch=4, dtype="bf16", recompute="none")
    out = {}
    for system in ISSUE_904_TFLOPS:
        cluster = ClusterSpec(system=builtin_systems()[system], num_nodes=1, gpus_per_node=1)
        with scaled(0.0):
            rest = float(estimate_training(mamba2_1b3(), cluster, plan).time.total)
        out[system] = (rest, float(estimate_training(mamba2_1b3(), cluster, plan).time.total) - rest)
    return out


def group(rid: str) -> str | None:
    return next((name for name, prefix, part in GROUPS if rid.startswith(prefix) and part in rid), None)


def main() -> None:
    runs = {r["id"]: r for r in load_runs()}
    print("per Mamba-2 layer and micro-batch, fwd+bwd, ms: priced | unplaced  row")
    for rid in ROWS:
        priced, unplaced, n_mb, layers = priced_and_unplaced(runs[rid])
        print(f"  {priced / n_mb / layers * 1e3:6.2f} | {unplaced / n_mb / layers * 1e3:+6.2f}  "
              f"{rid.replace('-pretrain-', '-')[:59]}")
    errors: dict[float, dict[str, list[float]]] = {}
    for k in (1.0, 2.0, 4.0, 8.0):
        with scaled(k):
            for rid, rec in runs.items():
                g = group(rid)
                for quantity, pred, meas in A.predict(rec, A.family(rid)) if g else ():
                    if quantity == "tok/s/GPU":
                        errors.setdefault(k, {}).setdefault(g or "", []).append((pred / meas - 1) * 100)
    print("median signed tokens/s error %, the Mamba-2 cost scaled by k:")
    names = list(errors[1.0])
    print(f"{'k':>4s}" + "".join(f"{g:>12s}" for g in names))
    for k, by_group in errors.items():
        print(f"{k:4g}" + "".join(f"{statistics.median(by_group[g]):+12.1f}" for g in names))
    print(f"{'rows':>4s}" + "".join(f"{len(errors[1.0][g]):12d}" for g in names))
    print("k that closes each row (1 + unplaced / Mamba-2 cost priced), per model and")
    print("GPU: median [min, max] (rows)")
    needed: dict[tuple[str, str, int], list[float]] = {}
    for rid, rec in runs.items():
        g = group(rid)
        if g not in ("nano", "super", "56b") or not any(q == "tok/s/GPU" for q, *_ in A.predict(rec, A.family(rid))):
            continue
        priced, unplaced, _, _ = priced_and_unplaced(rec)
        key = (g, rec["hardware"]["gpu"].split()[0], A.plan_for(rec, A.family(rid), rec["hardware"]["gpus"]).tp)
        needed.setdefault(key, []).append(1 + unplaced / priced)
    for (g, gpu, tp), v in sorted(needed.items()):
        print(f"  {g:6s} {gpu:6s} TP{tp}  {statistics.median(v):4.1f} [{min(v):4.1f}, {max(v):4.1f}] ({len(v)})")
    split = issue904_split()
    print("issue 904's Mamba-2 1.3B on A100 / H200 / GB200, ms:")
    print("  rest " + " / ".join(f"{r * 1e3:.0f}" for r, _ in split.values()) + ", Mamba-2 "
          + " / ".join(f"{mb * 1e3:.0f}" for _, mb in split.values()))
    (ra, ma), (rh, mh), (rg, mg) = split.values()
    tf_a, tf_h, tf_g = ISSUE_904_TFLOPS.values()
    for k_a in (1.0, 1.1, 1.2):
        t_h = (ra + k_a * ma) * tf_a / tf_h  # the H200 step the measured A100 / H200 ratio implies
        t_g = t_h * tf_h / tf_g
        print(f"  k_A100 {k_a:.1f}: k_H200 {(t_h - rh) / mh:.2f}, k_GB200 {(t_g - rg) / mg:.2f};"
              f" mixer ms {k_a * ma * 1e3:.0f} / {(t_h - rh) * 1e3:.0f} / {(t_g - rg) * 1e3:.0f}")


if __name__ == "__main__":
    main()
