"""Predicted vs measured for every published training run that gives enough configuration.

    python benchmarks/accuracy.py [--runs benchmarks/data/published_runs.yaml] [--family mpt] [--quiet]

For each record it builds the model and plan the source describes, runs the same estimate as
`llmplan estimate` with the default (uncalibrated) hardware profiles, predicts the quantity the source
measured (see benchmarks/data/README.md: Narayanan 2021 TFLOP/s count the recompute pass, i.e. HFU; MPT,
Megatron-Core and NeMo report model FLOPs; Korthikanti Table 5 gives iteration times), and prints the
error per record and the median / max absolute percentage error per family. Nothing here is tuned per
record: assumptions that fill gaps in a record (micro-batch 1 where not given, fused attention for runs
from 2023 on) are listed in ASSUMPTIONS and apply to a whole family.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import yaml

from llmplan.errors import LlmplanError
from llmplan.estimate import estimate_training
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.serving import estimate_serving
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.specs.serve import ServeJob, ServePlan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runs import runs_path  # noqa: E402

DEFAULT_RUNS = runs_path()
TRAIN_FAMILIES = ("narayanan2021", "korthikanti2022", "megatron", "mpt", "nemo2407", "megatron2020")
FAMILIES = TRAIN_FAMILIES + ("trtllm",)
TRTLLM_MAX_BATCH = 4096  # trtllm-bench runs "max batch up to 8192"; one family-level cap, stated
ASSUMPTIONS = {
    "narayanan2021": "fp16, full recompute, no fused attention (2021), micro-batch 1 and no interleaving where "
                     "Table 1 does not say; predicts hardware TFLOP/s (Eq. 3 counts the recompute pass)",
    "korthikanti2022": "no fused attention (2022); Table 3 settings; predicts iteration time, and MFU/HFU",
    "megatron": "Megatron-Core r0.8 and examples/llama: fused attention, distributed optimizer, overlap flags "
                "as listed, sequence parallelism with TP (--tp-comm-overlap requires it), 4h GELU MLP where ffn is "
                "not given, fp8 weights in the examples/llama fp8 scripts (--fp8-param-gather), micro-batch 1 and no recompute where not given; predicts MFU / model TFLOP/s",
    "mpt": "llm-foundry FSDP = ZeRO-3 over all GPUs, fused attention, bf16 or fp8 as listed, no biases, "
           "ALiBi; predicts MFU",
    "nemo2407": "NeMo 24.07: fp8, fused attention, distributed optimizer (Apex distributed_fused_adam, bf16 "
                "gradient buckets) and sequence parallelism with TP, as its performance recipes set; LoRA rows skipped (PEFT not modelled); "
                "predicts model TFLOP/s per GPU",
    "megatron2020": "A100 rows only (no V100 profile): fp16, full recompute, no fused attention; predicts "
                    "hardware TFLOP/s",
    "trtllm": "TensorRT-LLM offline throughput: fp8 weights and fp8 KV cache, 90% of memory for the server, "
              f"8192 tokens per engine step, concurrency = KV capacity capped at {TRTLLM_MAX_BATCH}; EP as listed; "
              "predicts output tokens/s of the TP group (median reported per model)",
}


def family(record_id: str) -> str:
    return "megatron" if record_id.startswith("megatron-") else record_id.split("-")[0]


def system_for(gpu: str) -> str | None:
    g = gpu.lower()
    if "a100" in g:
        return "dgx-a100-40gb" if "40" in g else "dgx-a100"
    if "h100" in g:
        return "dgx-h100"
    return None


def model_for(rec: dict, fam: str) -> ModelSpec:
    """The record's model: a built-in with the same layers, width and heads (Llama, GPT-3 shapes), else a
    plain GPT of the record's dimensions (MPT: no biases, ALiBi instead of learned positions)."""
    md = rec["model"]
    h = md["hidden"]
    for m in builtin_models().values():
        if (m.num_hidden_layers, m.hidden_size, m.num_attention_heads, m.vocab_size) == \
                (md["layers"], h, md["heads"], md["vocab"]) and m.model_type != "gpt":
            return m.model_copy(update={"max_position_embeddings": max(m.max_position_embeddings,
                                                                       md.get("seq_len", 2048))})
    mpt = fam == "mpt"
    return ModelSpec(
        name=rec["id"], model_type="gpt", hidden_size=h, intermediate_size=md.get("ffn_hidden") or 4 * h,
        num_hidden_layers=md["layers"], num_attention_heads=md["heads"], vocab_size=md["vocab"],
        num_key_value_heads=md.get("kv_heads"),
        max_position_embeddings=max(md.get("seq_len", 2048), 2048), tie_word_embeddings=True, gated_mlp=False,
        norm_type="layernorm", learned_position_embeddings=not mpt and fam in ("narayanan2021", "korthikanti2022",
                                                                             "megatron2020"),
        attention_bias=not mpt, mlp_bias=not mpt,
        attention_dropout=0.0 if mpt else 0.1, hidden_dropout=0.0 if mpt else 0.1,  # llm-foundry: no dropout
    )


def plan_for(rec: dict, fam: str, gpus: int) -> ParallelPlan:
    par = rec["parallel"]
    tp, pp = par.get("tp", 1), par.get("pp", 1)
    cp = par.get("cp", 1)
    dp = par.get("dp") or gpus // (tp * pp * cp)
    rc = str(par.get("recompute", "full" if fam in ("narayanan2021", "megatron2020") else "none"))
    recompute = "selective" if rc.startswith("selective") else ("full" if rc.startswith("full") else "none")
    precision = str(par.get("precision", "bf16")).lower()
    dtype = "fp8" if "fp8" in precision else "bf16"
    zero = par.get("zero_stage") or (1 if par.get("distributed_optimizer") or fam in ("nemo2407", "megatron") else 0)
    if isinstance(zero, str):
        zero = 1
    sp_default = tp > 1 and fam in ("megatron", "nemo2407")
    mb = par.get("micro_batch", 1)
    gbs = par.get("global_batch")
    if not isinstance(gbs, int):
        gbs = mb * dp
    return ParallelPlan(
        tp=tp, pp=pp, dp=dp, cp=cp, vpp=par.get("vpp", 1) or 1, sp=bool(par.get("sequence_parallel", sp_default)) and tp > 1,
        zero=zero, recompute=recompute, micro_batch=mb, global_batch=gbs,
        seq_len=rec["model"].get("seq_len", 2048), dtype=dtype,
        grad_dtype="bf16" if fam == "nemo2407" else "fp32",
        fp8_params=dtype == "fp8" and rec["id"].startswith("megatron-examples-fp8"),
        flash_attention=fam not in ("narayanan2021", "korthikanti2022", "megatron2020"),
        tp_comm_overlap="tp-comm-overlap" in str(par.get("comm_overlap", "")) and tp > 1,
    )


def predict_serving(rec: dict) -> list[tuple[str, float, float]]:
    """Offline output tokens/s of a TensorRT-LLM record at the concurrency its KV cache allows."""
    hw, par, wl = rec["hardware"], rec["parallel"], rec["workload"]
    system = builtin_systems()[system_for(str(hw["gpu"])) or "dgx-h100"]
    plan = ServePlan(tp=par.get("tp", 1), pp=par.get("pp", 1), ep=par.get("ep", 1), weight_dtype="fp8",
                     kv_dtype="fp8")
    cluster = ClusterSpec(system=system, num_nodes=1, gpus_per_node=plan.gpus_per_replica)
    job = ServeJob(input_len=wl["input_len"], output_len=wl["output_len"], batch=1)
    m = model_for(rec, "trtllm")
    cap = estimate_serving(m, cluster, plan, job).memory.max_concurrent_seqs
    e = estimate_serving(m, cluster, plan, job.model_copy(update={"batch": max(1, min(cap, TRTLLM_MAX_BATCH))}))
    return [("output tok/s", e.tokens_per_s, rec["measured"]["output_tokens_per_s_total"])]


def predict(rec: dict, fam: str) -> list[tuple[str, float, float]]:
    """[(quantity, predicted, measured)] for one record."""
    if fam == "trtllm":
        return predict_serving(rec)
    hw = rec.get("hardware", {})
    system_name = system_for(str(hw.get("gpu", "")))
    par = rec.get("parallel", {})
    if system_name is None or "layers" not in rec.get("model", {}) or "tp" not in par or "pp" not in par:
        return []  # no profile for the GPU, or the source does not give the parallel layout
    if "-lora-" in rec["id"]:
        return []  # parameter-efficient fine-tuning (frozen base weights) is not modelled
    system = builtin_systems()[system_name]
    gpus = hw.get("gpus") or 1
    per_node = min(gpus, system.gpus_per_node)
    cluster = ClusterSpec(system=system, num_nodes=max(1, gpus // per_node), gpus_per_node=per_node)
    plan = plan_for(rec, fam, gpus)
    if plan.num_gpus != cluster.num_gpus:
        return []
    e = estimate_training(model_for(rec, fam), cluster, plan)
    meas = rec["measured"]
    peak = system.gpu.peak_flops(plan.dtype) / 1e12
    out: list[tuple[str, float, float]] = []
    if fam in ("narayanan2021", "megatron2020") and "tflops_per_gpu" in meas:
        out.append(("hw TFLOP/s", float(e.throughput.hfu) * peak, meas["tflops_per_gpu"]))
    if fam == "korthikanti2022" and "iteration_time_s" in meas:
        out.append(("iteration s", float(e.time.total), meas["iteration_time_s"]))
    if fam in ("megatron", "mpt") and "mfu" in meas:
        out.append(("MFU", float(e.throughput.mfu), meas["mfu"]))
    elif fam in ("megatron", "nemo2407") and "tflops_per_gpu" in meas:
        out.append(("model TFLOP/s", float(e.throughput.tflops_per_gpu), meas["tflops_per_gpu"]))
    if out:  # a run that was measured ran, so it fit (memory-only records show what does not fit)
        out.append(("fits", float(bool(e.memory.fits)), 1.0))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    ap.add_argument("--family", action="append")
    ap.add_argument("--quiet", action="store_true", help="only the per-family summary")
    args = ap.parse_args(argv)
    records = yaml.safe_load(args.runs.read_text())
    errors: dict[str, list[float]] = {}
    misfit: dict[str, list[str]] = {}
    skipped: dict[str, int] = {}
    per_model: dict[str, list[float]] = {}
    for rec in records:
        fam = family(rec["id"])
        if fam not in FAMILIES or (args.family and fam not in args.family):
            continue
        try:
            rows = predict(rec, fam)
        except (LlmplanError, ValueError) as exc:
            rows = []
            print(f"  skip {rec['id']}: {exc}", file=sys.stderr)
        if not rows:
            skipped[fam] = skipped.get(fam, 0) + 1
            continue
        for quantity, pred, meas in rows:
            if quantity == "fits":
                if not pred:
                    misfit.setdefault(fam, []).append(rec["id"])
                continue
            err = 100 * (pred - meas) / meas
            errors.setdefault(fam, []).append(abs(err))
            if fam == "trtllm":
                per_model.setdefault(rec["model"]["name"], []).append(abs(err))
            if not args.quiet:
                print(f"{rec['id']:58s} {quantity:14s} predicted {pred:10.3f} measured {meas:10.3f} {err:+7.1f}%")
    print()
    print(f"{'family':16s} {'records':>7s} {'median |err|':>13s} {'max |err|':>10s} {'predicted OOM':>14s} {'skipped':>8s}")
    for fam in FAMILIES:
        e = errors.get(fam, [])
        if not e and fam not in skipped:
            continue
        med = f"{statistics.median(e):.1f}%" if e else "-"
        mx = f"{max(e):.1f}%" if e else "-"
        print(f"{fam:16s} {len(e):7d} {med:>13s} {mx:>10s} {len(misfit.get(fam, [])):14d} {skipped.get(fam, 0):8d}")
    for name, e in per_model.items():
        print(f"  trtllm {name:34s} {len(e):3d} records, median |err| {statistics.median(e):.1f}%, max {max(e):.1f}%")
    for fam, ids in misfit.items():
        print(f"predicted not to fit ({fam}): {', '.join(ids)}")
    print("\nassumptions per family:")
    for fam, text in ASSUMPTIONS.items():
        print(f"  {fam}: {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
