"""torchtitan job config, TOML schema of v0.2.2 (the last release with TOML configs; torchtitan v0.2.2 torchtitan/config/job_config.py)."""

from __future__ import annotations

from llmplan.export.common import header_lines, hf_repo, need_mode, refuse, virtual_stage_layers
from llmplan.planfile import PlanFile

TARGET = "torchtitan"
TORCHTITAN_VERSION = "v0.2.2"
FLAVORS = {
    "llama-3.1-8b": ("llama3", "8B"), "llama-3.1-70b": ("llama3", "70B"), "llama-3.1-405b": ("llama3", "405B"),
    "deepseek-v3": ("deepseek_v3", "671B"), "qwen3-30b-a3b": ("qwen3", "30B-A3B"),
    "qwen3-235b-a22b": ("qwen3", "235B-A22B"), "gpt-oss-120b": ("gpt_oss", "120b"),
}


def check(pf: PlanFile) -> None:
    need_mode(pf, "train", TARGET)
    p, m = pf.plan, pf.model
    if m.name not in FLAVORS:
        raise refuse(TARGET, f"torchtitan {TORCHTITAN_VERSION} has no model flavour for {m.name}",
                     f"use one of {', '.join(sorted(FLAVORS))}, or export to megatron")
    if p.zero == 1:
        raise refuse(TARGET, "ZeRO-1 (FSDP2 shards gradients and weights too)",
                     "re-plan with --zero 2 (FSDP without resharding after forward) or --zero 3")
    if p.tp > 1 and not p.sp:
        raise refuse(TARGET, "TP without sequence parallelism (torchtitan always shards norms with TP)",
                     "re-plan with --sp")
    if p.ep > 1 and p.etp_resolved not in (1, p.tp):
        raise refuse(TARGET, f"expert TP {p.etp_resolved} (torchtitan takes 1 or tp)", "re-plan with --etp 1")
    if p.dtype in ("fp16", "fp32"):
        raise refuse(TARGET, f"{p.dtype} training (torchtitan trains in bf16 or float8)", "use --dtype bf16")


def model_parts(pf: PlanFile) -> str:
    """The modules of every virtual pipeline stage in model order, as a TOML list of lists: the embedding
    with the first, the final norm and output with the last. Stating them pins the layout llmplan evaluated
    (torchtitan's own split otherwise weighs the embedding and output as layers)."""
    parts, start = [], 0
    stages = virtual_stage_layers(pf)
    for s, n in enumerate(stages):
        names = (["tok_embeddings"] if s == 0 else []) + [f"layers.{i}" for i in range(start, start + n)]
        parts.append(names + (["norm", "output"] if s == len(stages) - 1 else []))
        start += n
    return "[" + ", ".join("[" + ", ".join(f'"{x}"' for x in part) + "]" for part in parts) + "]"


def toml_text(pf: PlanFile) -> str:
    p, m = pf.plan, pf.model
    name, flavor = FLAVORS[m.name]
    shard = p.dp * 1 if p.zero >= 2 else 1
    replicate = 1 if p.zero >= 2 else p.dp
    local_batch = p.global_batch // p.dp
    schedule = "Interleaved1F1B" if p.vpp > 1 else "1F1B"
    lines = [f"# {line}" for line in header_lines(pf, f"torchtitan {TORCHTITAN_VERSION} (TOML job config)")]
    lines += [
        f"# torchtitan version: {TORCHTITAN_VERSION} (main removed TOML configs on 2026-02-23)",
        "", "[job]", 'dump_folder = "./outputs"', f'description = "llmplan: {m.name}"',
        "", "[model]", f'name = "{name}"', f'flavor = "{flavor}"',
        f'hf_assets_path = "./assets/hf/{hf_repo(m.name).split("/")[-1]}"'
        "  # tokenizer and config: python scripts/download_hf_assets.py --repo_id "
        f"{hf_repo(m.name)} --assets tokenizer",
    ]
    if p.dtype == "fp8":
        lines.append('converters = ["float8"]')
    lines += [
        "", "[training]", 'dataset = "c4"  # or your dataset registered in torchtitan/datasets; dataset_path for local files',
        f"local_batch_size = {local_batch if p.pp > 1 else p.micro_batch}",
        f"global_batch_size = {p.global_batch}", f"seq_len = {p.seq_len}", "max_norm = 1.0", "steps = 1000",
        'mixed_precision_param = "bfloat16"',
        f'mixed_precision_reduce = "{"float32" if p.grad_dtype == "fp32" else "bfloat16"}"',
        "", "[parallelism]", f"data_parallel_replicate_degree = {replicate}",
        f"data_parallel_shard_degree = {shard}",
        f'fsdp_reshard_after_forward = "{"never" if p.zero == 2 else "default"}"',
        f"tensor_parallel_degree = {p.tp}", f"enable_async_tensor_parallel = {str(p.tp_comm_overlap).lower()}",
        f"pipeline_parallel_degree = {p.pp}", f'pipeline_parallel_schedule = "{schedule}"',
        f"pipeline_parallel_microbatch_size = {p.micro_batch}",
    ]
    if p.pp > 1:
        lines.append(f"module_fqns_per_model_part = {model_parts(pf)}")
    lines += [f"context_parallel_degree = {p.cp}", f"expert_parallel_degree = {p.ep}",
              f"expert_tensor_parallel_degree = {p.etp_resolved if p.ep > 1 else 1}",
              "", "[activation_checkpoint]", f'mode = "{p.recompute}"']
    if p.recompute == "selective":
        lines.append('selective_ac_option = "op"')
    return "\n".join(lines) + "\n"


def render(pf: PlanFile) -> dict[str, str]:
    check(pf)
    return {"torchtitan.toml": toml_text(pf)}
