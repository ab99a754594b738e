"""DeepSpeed: ds_config.json and a launch command (keys: DeepSpeed docs, config-json)."""

from __future__ import annotations

import json

from llmplan.export.common import (header_lines, is_uneven, launch_env_lines, launcher_schedule, need_mode, refuse,
                                   sh_header)
from llmplan.planfile import PlanFile

TARGET = "deepspeed"


def check(pf: PlanFile) -> None:
    need_mode(pf, "train", TARGET)
    p = pf.plan
    if p.tp > 1 and p.zero >= 3:
        raise refuse(TARGET, f"tensor parallelism (AutoTP, tp {p.tp}) with ZeRO stage 3 (DeepSpeed's AutoTP training "
                     "supports ZeRO stages 0-2)", "re-plan with --zero 2 or --tp 1, or export to torchtitan")
    if p.pp > 1 and p.zero >= 2:
        raise refuse(TARGET, f"pipeline parallelism (pp {p.pp}) with ZeRO stage {p.zero} (DeepSpeed's pipeline engine "
                     "refuses ZeRO-2 and ZeRO-3)", "re-plan with --zero 1 or --pp 1, or export to megatron")
    for what, bad, fix in (
        (f"context parallelism (cp {p.cp})", p.cp > 1, "re-plan with --cp 1 or export to megatron / torchtitan"),
        (f"expert parallelism (ep {p.ep}; DeepSpeed-MoE sets it in the model code)", p.ep > 1, "export to megatron"),
        ("Megatron sequence parallelism", p.sp, "re-plan with --no-sp or export to megatron"),
        (f"the {p.pp_schedule} pipeline schedule (DeepSpeed's pipeline engine runs 1F1B)",
         launcher_schedule("deepspeed", p.pp_schedule) is None,
         "re-plan with --pp-schedule 1f1b"),
        (f"{p.dtype} training (Transformer Engine is configured in model code)", p.dtype in ("fp8", "fp4"),
         "export to megatron"),
        (f"interleaved pipeline stages (vpp {p.vpp})", p.vpp > 1, "re-plan with --vpp 1 or export to megatron"),
        (f"optimizer states master {p.optimizer_master_dtype} / moments {p.optimizer_moment_dtype} (this export "
         "writes DeepSpeed's fp32 master and moments; its bf16 section keeps bf16 states only together with bf16 "
         "master weights and gradients, bf16_master_weights_and_grads)",
         p.optimizer_master_dtype != "fp32" or p.optimizer_moment_dtype != "fp32",
         "re-plan with --optimizer-master-dtype fp32 --optimizer-moment-dtype fp32, or export to megatron"),
        ("the fp32 master kept as 16-bit remainders (Megatron-Core's store_param_remainders; DeepSpeed keeps a "
         "whole fp32 master)", p.param_remainders, "re-plan with --no-param-remainders, or export to megatron"),
        ("the SwiGLU input kept in fp8 (Megatron-Core's activation_func_fp8_input_store)", p.swiglu_fp8_input,
         "re-plan with --no-swiglu-fp8-input, or export to megatron-bridge"),
        ("op-level selective checkpointing (torchtitan's per-op policy; DeepSpeed checkpoints whole layers)",
         p.recompute == "op", "re-plan with --recompute full or export to torchtitan"),
        (f"Megatron's per-module recompute ({', '.join(p.recompute_modules)}; DeepSpeed checkpoints whole layers)",
         bool(p.recompute_modules), "re-plan without --recompute-modules or export to megatron"),
        (f"recompute of the first {p.recompute_layers} layers only (DeepSpeed's activation checkpointing is set in "
         "model code)", p.recompute_layers is not None, "re-plan without --recompute-layers or export to megatron"),
        ("uneven pipeline stages (PipelineModule's partition_method is 'uniform', 'parameters' or 'type:REGEX'; "
         "none pins a layer count per stage)", is_uneven(pf),
         "re-plan with a pp that divides the layers, or export to megatron / torchtitan"),
    ):
        if bad:
            raise refuse(TARGET, what, fix)


def config(pf: PlanFile) -> dict:
    p = pf.plan
    zero = {"stage": p.zero, "overlap_comm": p.overlap_grad_reduce, "contiguous_gradients": True,
            "reduce_scatter": p.grad_reduce == "reduce-scatter", "reduce_bucket_size": int(5e8),
            "allgather_bucket_size": int(5e8)}
    if p.zero == 3:
        zero.update({"stage3_prefetch_bucket_size": int(5e7), "stage3_param_persistence_threshold": int(1e5),
                     "stage3_max_live_parameters": int(1e9)})
    cfg = {
        "comment": " | ".join(header_lines(pf, "DeepSpeed (config checked with DeepSpeed 0.19.8)")),
        "train_batch_size": p.global_batch,
        "train_micro_batch_size_per_gpu": p.micro_batch,
        "gradient_accumulation_steps": p.num_microbatches,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": p.dtype == "bf16"},
        "fp16": {"enabled": p.dtype == "fp16"},
        "zero_optimization": zero,
        "steps_per_print": 10,
    }
    if p.recompute != "none":
        cfg["activation_checkpointing"] = {"partition_activations": p.tp > 1, "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False, "number_checkpoints": None,
                                           "synchronize_checkpoint_boundary": False, "profile": False}
    if p.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": p.tp}
    return cfg


def render(pf: PlanFile) -> dict[str, str]:
    check(pf)
    c, p = pf.cluster, pf.plan
    env = launch_env_lines(pf)
    launch = (sh_header(pf, "DeepSpeed launcher") + "set -euo pipefail\n" + "".join(f"{line}\n" for line in env)
              + f"# train_batch_size {p.global_batch} = micro-batch {p.micro_batch} x gradient accumulation "
              f"{p.num_microbatches} x data parallel {p.dp}\n"
              + (f"# pipeline stages ({p.pp}) are set in the training script: PipelineModule(num_stages={p.pp}, "
                 f"partition_method=\"type:<transformer block class>\") splits the {pf.model.num_hidden_layers} "
                 f"layers evenly\n" if p.pp > 1 else "")
              +
              f"deepspeed --num_nodes {c.num_nodes} --num_gpus {c.gpus_per_node_used} --hostfile \"${{HOSTFILE:-hostfile}}\" "
              f"\"${{TRAIN_SCRIPT:-train.py}}\" --deepspeed --deepspeed_config ds_config.json\n")
    files = {"ds_config.json": json.dumps(config(pf), indent=2) + "\n", "deepspeed_launch.sh": launch}
    # DeepSpeed's multi-node runner forwards only NCCL_*, PYTHON*, ... and the lines of ./.deepspeed_env
    # (deepspeed/launcher/runner.py: EXPORT_ENVS, DEEPSPEED_ENVIRONMENT_NAME); it runs from this folder
    if env and c.num_nodes > 1:
        files[".deepspeed_env"] = "CUDA_LAUNCH_BLOCKING=1\n"
    return files
