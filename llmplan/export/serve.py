"""vLLM and SGLang serve commands for inference plans (flags: vLLM and SGLang engine-argument documentation)."""

from __future__ import annotations

import math

from llmplan.export.common import as_flags, hf_repo, need_mode, refuse, sh_header
from llmplan.planfile import PlanFile
from llmplan.units import GIB


def _model_var(pf: PlanFile) -> str:
    return f'MODEL=${{MODEL:-{hf_repo(pf.model.name)}}}'


def context_note(pf: PlanFile, flag: str) -> str:
    """Where the context limit comes from, said in the file."""
    j, m = pf.serve_job, pf.model
    return (f"# {flag} {j.context}: the planned input ({j.input_len}) + output ({j.output_len}) tokens, for which the "
            f"KV capacity was predicted; {m.name} accepts up to {m.max_position_embeddings:,}: re-plan with longer "
            "--input-len / --output-len to serve longer requests\n")


def memory_fraction(pf: PlanFile, engine: str) -> tuple[float, str]:
    """The `engine`'s memory fraction that gives the KV cache the bytes the plan was predicted with, and a
    comment line when it differs from the planned engine's (whose fraction means something else):
    vLLM (weights + activations + other + KV) / HBM, SGLang (weights + KV) / HBM, rounded down.
    Derived: docs/formulas.md#infer.capacity"""
    j = pf.serve_job
    mem = pf.predictions.get("memory", {})
    if j.engine == engine or not all(k in mem for k in ("weights", "activations", "other", "kv_available")):
        return j.gpu_memory_utilization, ""
    hbm = pf.cluster.system.gpu.hbm_bytes
    used = mem["weights"] + mem["kv_available"] + (mem["activations"] + mem["other"] if engine == "vllm" else 0.0)
    fraction = math.floor(1000 * used / hbm) / 1000
    return fraction, (f"# memory fraction {fraction}: gives the KV cache the {mem['kv_available'] / GIB:.1f} GiB per "
                      f"GPU planned with {j.engine}'s rule (its fraction {j.gpu_memory_utilization:g})\n")


def recurrent_state_dtype(pf: PlanFile) -> str | None:
    """The recurrent-state dtype the serving memory was predicted with (bf16: cost.inference
    recurrent_state_per_seq_gpu) for a model with Mamba-2 / Gated DeltaNet layers, written out so that the
    engine's own default (SGLang: float32) does not double the state; None for a transformer."""
    m = pf.model
    return "bfloat16" if m.count_layers("mamba") or m.count_layers("linear_attention") else None


def render_vllm(pf: PlanFile) -> dict[str, str]:
    need_mode(pf, "infer", "vllm")
    p, j = pf.plan, pf.serve_job
    fraction, fraction_note = memory_fraction(pf, "vllm")
    if p.ep > 1 and p.ep != p.tp * p.dp:
        raise refuse("vllm", f"ep {p.ep} (vLLM's --enable-expert-parallel makes EP = tp x dp = {p.tp * p.dp})",
                     f"re-plan with --ep {p.tp * p.dp} or --ep 1")
    flags = as_flags([
        ("--tensor-parallel-size", p.tp), ("--pipeline-parallel-size", p.pp), ("--data-parallel-size", p.dp),
        ("--enable-expert-parallel", p.ep > 1), ("--max-model-len", j.context),
        ("--gpu-memory-utilization", fraction), ("--max-num-seqs", j.batch),
        ("--max-num-batched-tokens", j.max_num_batched_tokens), ("--block-size", j.block_size),
        ("--kv-cache-dtype", "fp8" if p.kv_dtype == "fp8" else "auto"),
        ("--quantization", "fp8" if p.weight_dtype == "fp8" else None),
        ("--enable-prefix-caching", True), ("--enable-chunked-prefill", True),
        ("--mamba-ssm-cache-dtype", recurrent_state_dtype(pf)), ("--mamba-cache-dtype", recurrent_state_dtype(pf)),
    ])
    note = ("# int4/int8 weights: point MODEL at a pre-quantised (AWQ/GPTQ) checkpoint; vLLM reads its "
            "quantisation from the checkpoint\n" if p.weight_dtype in ("int4", "int8") else "")
    if p.weight_dtype in ("mxfp8", "nvfp4"):
        note += (f"# {p.weight_dtype} weights: point MODEL at a pre-quantised {p.weight_dtype} checkpoint (e.g. "
                 "NVIDIA ModelOpt); vLLM reads its quantisation from the checkpoint\n")
    text = (sh_header(pf, "vLLM (vllm serve; flags checked against vLLM 0.33.0)") + "set -euo pipefail\n" + note
            + fraction_note + context_note(pf, "--max-model-len")
            + _model_var(pf) + "\n"
            + 'vllm serve "$MODEL" \\\n' + " \\\n".join(f"    {f}" for f in flags) + "\n")
    return {"vllm_serve.sh": text}


def render_sglang(pf: PlanFile) -> dict[str, str]:
    need_mode(pf, "infer", "sglang")
    p, j = pf.plan, pf.serve_job
    fraction, fraction_note = memory_fraction(pf, "sglang")
    note = fraction_note
    if p.weight_dtype in ("int4", "int8", "mxfp8", "nvfp4"):
        note += f"# {p.weight_dtype} weights: point MODEL at a pre-quantised checkpoint\n"
    flags = as_flags([
        ("--tp-size", p.tp), ("--pp-size", p.pp), ("--dp-size", p.dp), ("--ep-size", p.ep if p.ep > 1 else None),
        ("--context-length", j.context), ("--mem-fraction-static", fraction),
        ("--max-running-requests", j.batch), ("--chunked-prefill-size", j.max_num_batched_tokens),
        ("--page-size", j.block_size), ("--kv-cache-dtype", "fp8_e4m3" if p.kv_dtype == "fp8" else "auto"),
        ("--quantization", "fp8" if p.weight_dtype == "fp8" else None),
        ("--mamba-ssm-dtype", recurrent_state_dtype(pf)),
    ])
    text = (sh_header(pf, "SGLang (python -m sglang.launch_server; flags checked against SGLang 0.5.23)") + "set -euo pipefail\n" + note
            + context_note(pf, "--context-length") + _model_var(pf)
            + "\n" + 'python -m sglang.launch_server --model-path "$MODEL" \\\n'
            + " \\\n".join(f"    {f}" for f in flags) + "\n")
    return {"sglang_serve.sh": text}
