"""The options several commands share (typer needs them per command; they are defined once here), with
their defaults taken from the specs."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

import typer

from llmplan.specs.defaults import DEFAULT_SEQ_LEN
from llmplan.specs.plan import MemoryAllowance, ParallelPlan
from llmplan.specs.resilience import CheckpointPolicy
from llmplan.specs.serve import ServeJob, ServePlan
from llmplan.topology.placement import DEFAULT_ORDER


def _plan(field: str):
    return ParallelPlan.model_fields[field].default


def _job(field: str):
    return ServeJob.model_fields[field].default

JSON = typer.Option(False, "--json", help="Print one JSON document (schema 1) instead of tables.")
MODEL = typer.Option(..., "--model", "-m", help="Built-in model name or path to a spec / config.json.")
HARDWARE = typer.Option(..., "--hardware", help="Built-in system name or path to a system profile.")
NODES = typer.Option(1, "--nodes", min=1, help="Number of nodes.")
GPUS_PER_NODE = typer.Option(None, "--gpus-per-node", min=1, help="GPUs used per node (default: all).")
SEQ_LEN = typer.Option(None, "--seq-len", min=1, help=f"Sequence length (default: min({DEFAULT_SEQ_LEN}, context)).")
DTYPE = typer.Option(_plan("dtype"), "--dtype", help="bf16 | fp16 | fp8 | fp4 | fp32.")
MOE_CAPACITY_FACTOR = typer.Option(None, "--moe-capacity-factor", min=0.01,
                                   help="MoE: pad experts to this capacity factor, dropping the excess (default: dropless).")
PP_SCHEDULE = typer.Option(_plan("pp_schedule"), "--pp-schedule",
                           help="Pipeline schedule: 1f1b (interleaved with --vpp) | zero-bubble | dualpipe.")
PRECISION = typer.Option(None, "--precision",
                         help="Training recipe: bf16 | fp8-tensorwise | fp8-rowwise | fp8-blockwise | mxfp8 | nvfp4.")
GRAD_DTYPE = typer.Option(_plan("grad_dtype"), "--grad-dtype", help="Gradient buffer dtype: fp32 (Megatron) | bf16.")
FP8_PARAMS = typer.Option(_plan("fp8_params"), "--fp8-params/--no-fp8-params", help="With fp8, keep weights in fp8.")
FLASH_ATTENTION = typer.Option(_plan("flash_attention"), "--flash-attention/--no-flash-attention", help="Fused attention (no s x s scores).")
RECOMPUTE_LAYERS = typer.Option(None, "--recompute-layers", min=1,
                                help="With --recompute full: recompute only the first N layers of each virtual "
                                     "pipeline chunk (Megatron's block method).")
RECOMPUTE_MODULES = typer.Option(None, "--recompute-modules",
                                 help="With --recompute selective: the Megatron modules to recompute, comma-separated "
                                      "(core_attn, layernorm, mla_up_proj, mlp, moe, moe_act, shared_experts; "
                                      "default core_attn).")
ATTENTION_KERNEL = typer.Option(_plan("attention_kernel"), "--attention-kernel",
                                help="Fused attention kernel: native (cuDNN / FlashAttention-3 on Hopper+) | flash2.")
FUSED_LOSS = typer.Option(_plan("fused_loss"), "--fused-loss/--unfused-loss",
                          help="Loss on one fp32 copy of the logits (Megatron, a compiled loss) or PyTorch's eager "
                               "cross_entropy on fp32 logits (three copies at its backward).")
TP_IMPL = typer.Option(_plan("tp_impl"), "--tp-impl",
                       help="How TP+SP keeps the linears' inputs: megatron (saves the sequence shard, re-gathers "
                            "in backward) | dtensor (PyTorch DTensor / torchtitan: saves the gathered input).")
OVERLAP_GRAD_REDUCE = typer.Option(_plan("overlap_grad_reduce"), "--overlap-grad-reduce/--no-overlap-grad-reduce",
                      help="Hide the DP gradient reduction behind the backward pass.")
OVERLAP_PARAM_GATHER = typer.Option(_plan("overlap_param_gather"), "--overlap-param-gather/--no-overlap-param-gather",
                      help="Hide the ZeRO/distributed-optimizer weight gather behind forward.")
TP_COMM_OVERLAP = typer.Option(_plan("tp_comm_overlap"), "--tp-comm-overlap/--no-tp-comm-overlap", help="Overlap TP comm with GEMMs (needs sp).")
FP32_PARAM_SHARDS = typer.Option(_plan("fp32_param_shards"), "--fp32-param-shards/--no-fp32-param-shards",
                                 help="ZeRO-3: keep only fp32 parameter shards, gathered in bf16 (PyTorch FSDP / "
                                      "FSDP2, torchtitan), not bf16 shards beside an fp32 master (DeepSpeed).")
EP_COMM_OVERLAP = typer.Option(_plan("ep_comm_overlap"), "--ep-comm-overlap/--no-ep-comm-overlap",
                       help="Overlap EP all-to-alls with another micro-batch (Megatron/DeepEP-style).")
MOE_DISPATCHER = typer.Option(_plan("moe_dispatcher"), "--moe-dispatcher",
                              help="MoE token dispatch: alltoall (every routed copy travels) | deepep (a token once "
                                   "per destination EP rank: DeepEP, Megatron's flex dispatcher).")
MOE_ROUTING = typer.Option(_plan("moe_routing"), "--moe-routing",
                           help="How tokens spread over experts, for deepep's volume: random (a balanced router) | "
                                "contiguous (k consecutive experts: NeMo AutoModel's benchmark gate).")
OVERHEAD_GIB = typer.Option(MemoryAllowance().fixed_gib, "--overhead-gib",
                           help="Fixed per-GPU runtime allowance (CUDA context, NCCL, workspaces).")
FRAGMENTATION = typer.Option(MemoryAllowance().fragmentation, "--fragmentation",
                       help="Allocator fragmentation allowance, fraction of tensor memory.")
INPUT_LEN = typer.Option(_job("input_len"), "--input-len", min=1, help="Inference: prompt tokens per request.")
OUTPUT_LEN = typer.Option(_job("output_len"), "--output-len", min=1, help="Inference: generated tokens per request.")
KV_DTYPE = typer.Option(ServePlan.model_fields["kv_dtype"].default, "--kv-dtype", help="Inference: KV-cache dtype bf16 | fp16 | fp8.")
TTFT_SLO = typer.Option(None, "--ttft-slo", help="Inference: time-to-first-token objective, seconds.")
TPOT_SLO = typer.Option(None, "--tpot-slo", help="Inference: time-per-output-token objective, seconds.")
PREFIX_HIT_RATE = typer.Option(_job("prefix_hit_rate"), "--prefix-hit-rate", help="Inference: fraction of each prompt in the prefix cache.")
GPU_MEMORY_UTILIZATION = typer.Option(_job("gpu_memory_utilization"), "--gpu-memory-utilization", "--memory-fraction",
                                      help="Inference: the engine's memory fraction (vLLM --gpu-memory-utilization, "
                                      "TensorRT-LLM free_gpu_memory_fraction, SGLang --mem-fraction-static).")
ENGINE = typer.Option(_job("engine"), "--engine",
                      help="Inference: vllm | trtllm | sglang, whose rules size the KV cache and admit sequences.")
CUDA_GRAPHS = typer.Option(_job("cuda_graphs"), "--cuda-graphs/--no-cuda-graphs",
                           help="Inference: decode steps replay CUDA graphs (off: vLLM --enforce-eager).")
BLOCK_SIZE = typer.Option(_job("block_size"), "--block-size", min=1, help="Inference: tokens per KV block.")
MAX_NUM_BATCHED_TOKENS = typer.Option(_job("max_num_batched_tokens"), "--max-num-batched-tokens", min=1, help="Inference: tokens per engine step.")
PP_FIRST_LAYERS = typer.Option(0, "--pp-first-layers", "--decoder-first-pipeline-num-layers", min=0,
                          help="Layers on the first pipeline stage (0: an even share).")
PP_LAST_LAYERS = typer.Option(0, "--pp-last-layers", "--decoder-last-pipeline-num-layers", min=0,
                         help="Layers on the last pipeline stage (0: an even share).")
PP_LAYOUT = typer.Option(None, "--pp-layout", "--pipeline-model-parallel-layout",
                         help="Megatron's layout of every virtual chunk, e.g. \"Et|(tt|)*30mL\" (E embedding, t "
                              "layer, m MTP, L loss, | between chunks; sets vpp = chunks / pp), or balanced "
                              "(for --pp x --vpp).")
EMBEDDING_IN_SPLIT = typer.Option(False, "--account-for-embedding-in-pipeline-split",
                                 help="Count the embedding as a layer of the first stage (Megatron).")
LOSS_IN_SPLIT = typer.Option(False, "--account-for-loss-in-pipeline-split",
                            help="Count the loss as a layer of the last stage (Megatron).")
AXIS_ORDER = typer.Option("-".join(DEFAULT_ORDER), "--axis-order",
                        help="Rank placement, innermost axis first (Megatron: tp-cp-ep-dp-pp).")


# Option groups several commands take, as (name, type, option): `with_options` adds them to a command's
# signature, so that each group is written once; the command receives them in **options.
CLUSTER = [("model", str, MODEL), ("hardware", str, HARDWARE), ("nodes", int, NODES),
           ("gpus_per_node", Optional[int], GPUS_PER_NODE)]
TRAINING_SWITCHES = [("seq_len", Optional[int], SEQ_LEN), ("dtype", str, DTYPE), ("precision", Optional[str], PRECISION),
                     ("moe_capacity_factor", Optional[float], MOE_CAPACITY_FACTOR), ("pp_schedule", str, PP_SCHEDULE),
                     ("flash_attention", bool, FLASH_ATTENTION),
                     ("attention_kernel", str, ATTENTION_KERNEL), ("fused_loss", bool, FUSED_LOSS), ("tp_impl", str, TP_IMPL),
                     ("recompute_layers", Optional[int], RECOMPUTE_LAYERS),
                     ("recompute_modules", Optional[str], RECOMPUTE_MODULES),
                     ("overlap_grad_reduce", bool, OVERLAP_GRAD_REDUCE),
                     ("overlap_param_gather", bool, OVERLAP_PARAM_GATHER), ("ep_comm_overlap", bool, EP_COMM_OVERLAP),
                     ("moe_dispatcher", str, MOE_DISPATCHER), ("moe_routing", str, MOE_ROUTING),
                     ("fp32_param_shards", bool, FP32_PARAM_SHARDS)]
STATE_SWITCHES = [("grad_dtype", str, GRAD_DTYPE), ("fp8_params", bool, FP8_PARAMS)]
"""estimate takes these as given; search declares its own (unpinned: it tries both)."""
PIPELINE_SPLIT = [("pp_first", int, PP_FIRST_LAYERS), ("pp_last", int, PP_LAST_LAYERS),
                  ("embedding_in_split", bool, EMBEDDING_IN_SPLIT), ("loss_in_split", bool, LOSS_IN_SPLIT)]
SERVING = [("input_len", int, INPUT_LEN), ("output_len", int, OUTPUT_LEN), ("kv_dtype", str, KV_DTYPE),
           ("ttft_slo", Optional[float], TTFT_SLO), ("tpot_slo", Optional[float], TPOT_SLO),
           ("prefix_hit_rate", float, PREFIX_HIT_RATE), ("gpu_memory_utilization", float, GPU_MEMORY_UTILIZATION),
           ("block_size", int, BLOCK_SIZE), ("max_num_batched_tokens", int, MAX_NUM_BATCHED_TOKENS),
           ("engine", str, ENGINE), ("cuda_graphs", bool, CUDA_GRAPHS)]
DOMAIN_GPUS = typer.Option(None, "--domain-gpus", min=1,
                           help="Use this many GPUs of each NVLink domain (e.g. 64 of a 72-GPU rack), whole nodes.")
POWER_LIMIT = typer.Option(None, "--power-limit", min=1,
                           help="Board power limit per GPU, W, below the profile's (clock scales as its cube root).")
CHECKPOINT = typer.Option(CheckpointPolicy.model_fields["mode"].default, "--checkpoint",
                          help="Checkpointing: sync (training waits for the write) | async (waits for the copy to "
                               "host memory) | memory (copies to a peer node's memory). Prices goodput.")
CHECKPOINT_INTERVAL = typer.Option(None, "--checkpoint-interval",
                                   help="Seconds of training between checkpoints (default: the optimal, Daly 2006).")
FAILURE_RATE = typer.Option(None, "--failure-rate",
                            help="Job-interrupting failures per GPU-hour, all causes (default: the hardware "
                                 "profile's per-GPU, per-node and per-NIC rates, from Llama 3's 16K-GPU run).")
RESILIENCE = [("checkpoint", str, CHECKPOINT), ("checkpoint_interval", Optional[float], CHECKPOINT_INTERVAL),
              ("failure_rate", Optional[float], FAILURE_RATE)]
RUNTIME = [("power_limit", Optional[float], POWER_LIMIT), ("domain_gpus", Optional[int], DOMAIN_GPUS), ("overhead_gib", float, OVERHEAD_GIB), ("fragmentation", float, FRAGMENTATION),
           ("axis_order", str, AXIS_ORDER), ("json_mode", bool, JSON)]


SERVING_ONLY = frozenset({name for name, _, _ in SERVING} | {"batch", "max_load", "max_batch", "request_rate"})
"""Options only the serving paths (--mode infer) read: given in training mode they are an error."""
SERVING_READS = frozenset({name for name, _, _ in CLUSTER} | {"tp", "pp", "ep", "dtype", "power_limit", "domain_gpus",
                           "overhead_gib", "fragmentation", "json_mode", "save", "force", "mode"}) | SERVING_ONLY
"""Options the serving paths of estimate and search read (each command adds its own: estimate --dp, search
--objective and --top); any other option given with --mode infer is a training option, and an error."""
SERVING_INSTEAD = {
    "precision": "serving weights take --dtype: bf16, fp8, mxfp8, nvfp4, int8, int4",
    "global_batch": "concurrent sequences are --batch (estimate) or --max-batch (search)",
    "micro_batch": "concurrent sequences are --batch (estimate) or --max-batch (search)",
    "seq_len": "request lengths are --input-len and --output-len",
}
"""What to give instead of a training option in --mode infer, where serving has a counterpart."""


def with_options(*groups: list[tuple[str, Any, Any]], lead: list[tuple[str, Any, Any]] = CLUSTER) -> Callable:
    """Add option groups to a typer command: they join its signature (typer reads it; `lead` first, so
    --model and --hardware head the help) and reach the function as keyword arguments."""
    def param(name: str, kind: Any, option: Any) -> inspect.Parameter:
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind)

    def decorate(fn: Callable) -> Callable:
        sig = inspect.signature(fn)
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in sig.parameters.values()
               if p.kind is not inspect.Parameter.VAR_KEYWORD]
        first = [param(*spec) for spec in lead]
        rest = [param(*spec) for group in groups for spec in group]
        fn.__signature__ = sig.replace(parameters=[*first, *own, *rest])  # type: ignore[attr-defined]
        return fn
    return decorate
