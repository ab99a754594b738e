"""The options several commands share (typer needs them per command; they are defined once here), with
their defaults taken from the specs."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, get_args, get_origin, get_type_hints

import typer
from pydantic import BaseModel
from typer.core import TyperCommand

from llmplan.specs.defaults import DEFAULT_SEQ_LEN, SERVE_RUNTIME_GIB
from llmplan.specs.options import ClusterOptions, MemoryOptions, MoeServingOptions, OutputOptions, ServingOptions
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
                                   help="MoE: pad experts to this capacity factor, dropping the excess "
                                   "(default: dropless).")
PP_SCHEDULE = typer.Option(_plan("pp_schedule"), "--pp-schedule",
                           help="Pipeline schedule: 1f1b (interleaved with --vpp) | zero-bubble | dualpipe.")
PRECISION = typer.Option(None, "--precision",
                         help="Training recipe: bf16 | fp8-tensorwise | fp8-rowwise | fp8-blockwise | mxfp8 | nvfp4.")
GRAD_DTYPE = typer.Option(_plan("grad_dtype"), "--grad-dtype", help="Gradient buffer dtype: fp32 (Megatron) | bf16.")
OPTIMIZER_MASTER_DTYPE = typer.Option(_plan("optimizer_master_dtype"), "--optimizer-master-dtype",
                                      help="Adam master weights: fp32 | fp16 | bf16 | none (the model's own).")
OPTIMIZER = typer.Option(_plan("optimizer"), "--optimizer",
                         help="adam | muon (Megatron-LM's Muon on the hidden weight matrices, AdamW on the rest: one "
                              "momentum buffer, 5 Newton-Schulz steps; search keeps it, never tries the other).")
OPTIMIZER_MOMENT_DTYPE = typer.Option(_plan("optimizer_moment_dtype"), "--optimizer-moment-dtype",
                                      help="Adam moments: fp32 | bf16 | fp16 | fp8 (DeepSeek-V3: bf16).")
PARAM_REMAINDERS = typer.Option(_plan("param_remainders"), "--param-remainders/--no-param-remainders",
                                help="Keep Adam's fp32 master as 16-bit remainders beside bf16 weights "
                                     "(Megatron-Core store_param_remainders: 2 B/param, not 4).")
KEPT_GRAD_SHARDS = typer.Option(_plan("kept_grad_shards"), "--kept-grad-shards/--no-kept-grad-shards",
                                help="Each bucket's reduce-scattered gradient shard is a new tensor kept until the "
                                     "next zero_grad (Apex DistributedFusedAdam, NeMo 1.x).")
FP32_EMBEDDING_GRADS = typer.Option(_plan("fp32_embedding_grads"), "--fp32-embedding-grads/--no-fp32-embedding-grads",
                                    help="The embeddings' gradients stay fp32 whatever --grad-dtype (NeMo 1.x "
                                         "with_fp32_embedding_grads under Apex DistributedFusedAdam).")
FP8_PARAMS = typer.Option(_plan("fp8_params"), "--fp8-params/--no-fp8-params", help="With fp8, keep weights in fp8.")
FLASH_ATTENTION = typer.Option(_plan("flash_attention"), "--flash-attention/--no-flash-attention",
                               help="Fused attention (no s x s scores).")
RECOMPUTE_LAYERS = typer.Option(None, "--recompute-layers", min=1,
                                help="With --recompute full: recompute only the first N layers of each virtual "
                                     "pipeline chunk (Megatron's block method).")
OFFLOAD_LAYERS = typer.Option(_plan("offload_layers"), "--offload-activations-layers", min=0, max=1 << 16,
                              help="Copy the saved activations of the first N layers to host memory and back, "
                                   "beside compute (Megatron --cpu-offloading-num-layers; pp 1, no recompute).")
MTP_LAYERS = typer.Option(None, "--mtp-layers", min=0, max=16,
                          help="Multi-token-prediction modules to train (Megatron --mtp-num-layers): 0 trains "
                               "without the model's MTP module; at most its num_nextn_predict_layers (default: "
                               "all of them).")
INDEXER_LOSS = typer.Option(None, "--indexer-loss",
                            help="DeepSeek Sparse Attention's indexer training (Megatron dsa_indexer_loss_coeff, "
                                 "dsa_indexer_use_sparse_loss): off (coefficient 0) | dense | sparse (KL over the "
                                 "selected keys); default: the model's recipe.")
MOE_PAGED_STASH = typer.Option(None, "--moe-paged-stash", min=1.0, max=4.0,
                               help="MoE, full-iteration graphs: page the fused grouped MLP's saved tensors into a "
                                    "device pool of this factor x the average rows (Megatron --moe-paged-stash, "
                                    "--moe-paged-stash-buffer-size-factor-cuda; default: off).")
MOE_RANK_CAPACITY_FACTOR = typer.Option(None, "--moe-rank-capacity-factor", min=1.0, max=64.0,
                                        help="MoE, full-iteration graphs: the static per-rank budget, tokens x "
                                             "topk x this (Megatron --moe-expert-rank-capacity-factor; default: "
                                             "1.5).")
OFFLOAD_MOE_ACT = typer.Option(_plan("offload_moe_act"), "--offload-moe-act/--no-offload-moe-act",
                               help="Copy each MoE layer's expert fc1 output to host memory and back, beside "
                                    "compute (Megatron --fine-grained-activation-offloading --offload-modules "
                                    "moe_act).")
DP_REPLICATE = typer.Option(_plan("dp_replicate"), "--dp-replicate", min=1, max=10_000_000,
                            help="Hybrid sharding: split dp x cp into N replicas that each shard the ZeRO states "
                                 "(Megatron --num-distributed-optimizer-instances; torchtitan "
                                 "data_parallel_replicate_degree).")
DP_OUTER_OPTIMIZER = typer.Option(_plan("dp_outer_optimizer"), "--dp-outer-optimizer/--no-dp-outer-optimizer",
                                  help="With --dp-replicate and ZeRO-3: shard the optimizer states across the "
                                       "replicas too (Megatron-FSDP --outer-dp-sharding-strategy optim).")
OFFLOAD_MODULES = typer.Option(None, "--offload-modules",
                               help="Copy these modules' saved inputs to host memory and back, beside compute, "
                                    "comma-separated (Megatron --fine-grained-activation-offloading --offload-modules: "
                                    "attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act).")
RECOMPUTE_MODULES = typer.Option(None, "--recompute-modules",
                                 help="With --recompute selective: the Megatron modules to recompute, comma-separated "
                                      "(core_attn, layernorm, mla_up_proj, mlp, moe, moe_act, shared_experts, mhc; "
                                      "default core_attn).")
ATTENTION_KERNEL = typer.Option(_plan("attention_kernel"), "--attention-kernel",
                                help="Fused attention kernel: native (cuDNN / FlashAttention-3 on Hopper+) | flash2.")
ATTENTION_RELEASE = typer.Option(
    None,
    "--attention-release",
    help="The cuDNN release running native fused attention, where the stack names "
    "it: cudnn-9.1 | cudnn-9.4 | cudnn-9.19 (its published rate on the GPU; default: the "
    "GPU's attention_efficiency).",
)
FUSED_LOSS = typer.Option(_plan("fused_loss"), "--fused-loss/--unfused-loss",
                          help="Loss on one fp32 copy of the logits (Megatron, a compiled loss) or PyTorch's eager "
                               "cross_entropy on fp32 logits (three copies at its backward).")
TP_WHOLE_EMBEDDING = typer.Option(_plan("tp_whole_embedding"), "--tp-whole-embedding/--vocab-parallel-embedding",
                                  help="At tp > 1, every TP rank holds an untied input embedding whole (DeepSpeed's "
                                       "AutoTP training) or its vocabulary shard (Megatron).")
FUSED_LOSS_IMPL = typer.Option(_plan("fused_loss_impl"), "--fused-loss-impl",
                               help="With --fused-loss on Megatron-Core: native (Megatron-Core's fused loss, two "
                                    "TP all-reduces) | te (Transformer Engine's parallel cross entropy, one TP "
                                    "all-gather; Megatron-Bridge's performance recipes).")
UNFUSED_LOSS_IMPL = typer.Option(_plan("unfused_loss_impl"), "--unfused-loss-impl",
                                 help="With --unfused-loss, for its memory: eager (PyTorch's cross_entropy, three "
                                      "fp32 copies) | vocab-parallel (Megatron's, in place on one fp32 copy) | "
                                      "vocab-parallel-copy (Megatron-LM 2022-09 .. 2024-06: two fp32 copies) | "
                                      "eager-vocab-parallel (DeepSpeed AutoTP's with a vocabulary-parallel head: eager at tp "
                                      "1; at tp > 1 its own Function, 14 bytes a logit, nothing in place).")
TP_IMPL = typer.Option(_plan("tp_impl"), "--tp-impl",
                       help="How TP+SP keeps the linears' inputs: megatron (saves the sequence shard, re-gathers "
                            "in backward) | dtensor (PyTorch DTensor / torchtitan: saves the gathered input).")
CP_IMPL = typer.Option(_plan("cp_impl"), "--cp-impl",
                       help="Which CP ring: te (Transformer Engine, Megatron) | torch-allgather | torch-alltoall "
                            "(PyTorch context_parallel, torchtitan: K/V after repeat_kv, fp32 K/V gradients).")
CP_COMM_TYPE = typer.Option(_plan("cp_comm_type"), "--cp-comm-type",
                            help="Transformer Engine's CP attention (--cp-impl te): p2p (the K/V ring) | a2a "
                                 "(Ulysses: heads scattered; runs windows and sinks) | all_gather (whole K/V "
                                 "gathered; runs windows) | a2a+p2p (a2a inside groups of --cp-a2a-size ranks, "
                                 "the ring across them).")
CP_A2A_SIZE = typer.Option(_plan("cp_a2a_size"), "--cp-a2a-size", min=1,
                           help="Ranks of the a2a level of --cp-comm-type a2a+p2p (Megatron "
                                "--hierarchical-context-parallel-sizes SIZE CP/SIZE): 1 < SIZE < cp, dividing cp.")
CP_KV_REPEATED = typer.Option(_plan("cp_kv_repeated"), "--cp-kv-repeated/--cp-kv-heads",
                              help="PyTorch's CP ring moves K/V repeated to the query heads (the model's repeat_kv "
                                   "before SDPA, torchtitan 2024) or at the KV heads (enable_gqa).")
CP_COMM_OVERLAP = typer.Option(_plan("cp_comm_overlap"), "--cp-comm-overlap/--no-cp-comm-overlap",
                               help="PyTorch's CP ring runs its transfers beside the attention calls (eager); "
                                    "off: each is waited for where issued (the ring under torch.compile, 2024).")
OVERLAP_GRAD_REDUCE = typer.Option(_plan("overlap_grad_reduce"), "--overlap-grad-reduce/--no-overlap-grad-reduce",
                      help="Hide the DP gradient reduction behind the backward pass.")
GRAD_REDUCE = typer.Option(_plan("grad_reduce"), "--grad-reduce",
                           help="ZeRO-1's DP gradient reduction: reduce-scatter (Megatron's distributed optimizer) "
                                "| all-reduce (DeepSpeed's BF16_Optimizer under its pipeline engine).")
GRAD_REDUCE_DTYPE = typer.Option(_plan("grad_reduce_dtype"), "--grad-reduce-dtype",
                                 help="Dtype the DP gradient reduction sends: grad_dtype (the gradients' own) | bf16 "
                                      "(fp32 gradients cast to a bf16 copy for the all-reduce: DeepSpeed's "
                                      "BF16_Optimizer at its default communication_data_type).")
GRAD_REDUCE_FP32_SUM = typer.Option(_plan("grad_reduce_fp32_sum"), "--grad-reduce-fp32-sum/--no-grad-reduce-fp32-sum",
                                    help="ZeRO-1's reduce-scatter of 16-bit gradients summed in fp32: an all-to-all "
                                         "and a local fp32 sum (Megatron-Core's "
                                         "reduce_scatter_with_fp32_accumulation).")
GRAD_ACCUMULATION = typer.Option(_plan("grad_accumulation"), "--grad-accumulation",
                                 help="How micro-batch gradients are accumulated: fused (in the weight-gradient "
                                      "GEMM) | add (Megatron-LM before 2022-02, autograd) | cast-add (DeepSpeed's "
                                      "BF16_Optimizer) | copy (Megatron-FSDP without the fusion: each gradient "
                                      "copied into the reduce-scatter's bucket; zero 2/3).")
ZERO3_UNIT = typer.Option(_plan("zero3_unit"), "--zero3-unit",
                          help="What one ZeRO-3 collective carries: layer (FSDP units) | tensor (each weight "
                               "on its own, gathered again for a recompute forward: DeepSpeed stage 3, 2021).")
ROPE_COMPLEX = typer.Option(_plan("rope_complex"), "--rope-complex/--rope-real",
                            help="The rotary is complex arithmetic (torchtitan's Llama 3 and DeepSeek-V3), which "
                                 "torch.compile runs eager, or real (cos/sin), which it fuses.")
BIAS_DROPOUT_FUSION = typer.Option(None, "--bias-dropout-fusion/--no-bias-dropout-fusion",
                                   help="Add the output biases and the hidden dropout in Megatron-Core's fused "
                                        "bias-dropout-add, or each in its own pass (default: fused, but unfused "
                                        "for a model with expert biases, GPT-OSS: Megatron-Core's TEGroupedMLP "
                                        "refuses the fusion with biases).")
ZERO3_COPY_OUT = typer.Option(_plan("zero3_copy_out"), "--zero3-copy-out/--no-zero3-copy-out",
                              help="ZeRO-3 as PyTorch FSDP2 runs it: each all-gather copied into the parameters "
                                   "on the compute stream (torchtitan, AutoModel), or written in place.")
PP_BLOCKING_SENDS = typer.Option(_plan("pp_blocking_sends"), "--pp-blocking-sends/--no-pp-blocking-sends",
                                 help="Pipeline sends waited for where issued and the device synchronised "
                                      "(Megatron-LM 2021-02 .. 2023-05), or overlapped (overlap_p2p_comm).")
NORM_KERNEL = typer.Option(_plan("norm_kernel"), "--norm-kernel",
                           help="A fused norm's backward: fused-one-pass (Transformer Engine, Apex's persistent "
                                "norm) | two-pass (Apex FusedLayerNorm, F.layer_norm: dy and x read again).")
PP_UNBATCHED_SENDS = typer.Option(_plan("pp_unbatched_sends"), "--pp-unbatched-sends/--no-pp-unbatched-sends",
                                  help="1F1B pipeline transfers one at a time on the stage's stream (DeepSpeed's "
                                       "pipeline engine), or paired into batched exchanges (Megatron).")
FP8_SCALING = typer.Option(_plan("fp8_scaling"), "--fp8-scaling",
                           help="The per-tensor fp8 recipe's scale: delayed (amax history; Megatron-LM's default "
                                "--fp8-recipe) | current (an amax pass before each cast: Transformer Engine "
                                "current scaling, torchao float8 tensorwise).")
SOFTMAX_KERNEL = typer.Option(_plan("softmax_kernel"), "--softmax-kernel",
                              help="An unfused attention's softmax: fused (Megatron's causal scale-mask-softmax "
                                   "kernel) | eager (masked_fill_ and torch softmax in 16 bits, Megatron-LM 2020) | "
                                   "eager-fp32 (Megatron's fp32 fallback: cast, scale, mask, softmax, cast back) | "
                                   "te (Transformer Engine's unfused attention, what Megatron-LM's "
                                   "--attention-backend unfused runs: a mask built per layer, whole-row kernel).")
LAUNCH_BLOCKING = typer.Option(_plan("launch_blocking"), "--launch-blocking/--no-launch-blocking",
                               help="CUDA_LAUNCH_BLOCKING=1: every launch waits for its kernel (the GPU idles "
                                    "while the host launches the next).")
OVERLAP_PARAM_GATHER = typer.Option(_plan("overlap_param_gather"), "--overlap-param-gather/--no-overlap-param-gather",
                      help="Hide the ZeRO/distributed-optimizer weight gather behind forward.")
TP_COMM_OVERLAP = typer.Option(_plan("tp_comm_overlap"), "--tp-comm-overlap/--no-tp-comm-overlap",
                               help="Overlap TP comm with GEMMs (needs sp).")
TP_BACKWARD_OVERLAP = typer.Option(_plan("tp_backward_overlap"), "--tp-backward-overlap/--no-tp-backward-overlap",
                                   help="Run the input gradients' TP collectives beside the weight-gradient GEMMs "
                                        "(Megatron-LM since 2021-09); off: all TP collectives synchronous.")
PP_SCATTER_GATHER = typer.Option(_plan("pp_scatter_gather"), "--pp-scatter-gather/--no-pp-scatter-gather",
                                 help="Without sp: send 1/tp of a stage's output per TP rank and all-gather it "
                                      "(Megatron-LM 2021-22, DeepSpeed's pipeline engine).")
FP32_PARAM_SHARDS = typer.Option(_plan("fp32_param_shards"), "--fp32-param-shards/--no-fp32-param-shards",
                                 help="ZeRO-3: keep only fp32 parameter shards, gathered in bf16 (PyTorch FSDP / "
                                      "FSDP2, torchtitan), not bf16 shards beside an fp32 master (DeepSpeed).")
MEGATRON_FSDP = typer.Option(_plan("megatron_fsdp"), "--megatron-fsdp/--no-megatron-fsdp",
                             help="ZeRO-2 / 3 without a pipeline as Megatron-FSDP runs them: its queued unsharded "
                                  "gradient buckets and, at ZeRO-3, its deeper prefetch and the embedding and output "
                                  "layer kept gathered (Megatron-LM / Megatron-Bridge), not DeepSpeed's / FSDP's.")
SWIGLU_FP8_INPUT = typer.Option(_plan("swiglu_fp8_input"), "--swiglu-fp8-input/--no-swiglu-fp8-input",
                                help="Keep the SwiGLU input for backward in fp8 (Megatron-Core "
                                     "activation_func_fp8_input_store, a Megatron-Bridge override; "
                                     "DeepSeek-V3's MoE SwiGLU inputs).")
FP8_ATTENTION = typer.Option(_plan("fp8_attention"), "--fp8-attention/--no-fp8-attention",
                             help="Run the fused attention's matmuls in FP8 under an fp8 --precision (Transformer "
                                  "Engine FP8 dot-product attention, Megatron-Bridge "
                                  "mixed_precision.fp8_dot_product_attention).")
FP8_OUTPUT_PROJ = typer.Option(_plan("fp8_output_proj"), "--fp8-output-proj/--no-fp8-output-proj",
                               help="Run the output layer's GEMMs in MXFP8 under --precision mxfp8 "
                                    "(Megatron-Core fp8_output_proj; Megatron-Bridge model.fp8_output_proj).")
TRAIN_CUDA_GRAPHS = typer.Option(_plan("cuda_graphs"), "--train-cuda-graphs",
                                 help="Training: CUDA graphs of the step: none | layers (Transformer Engine's "
                                      "per-layer graphs of the attention and the MoE router, a dense layer's MLP; "
                                      "Megatron-Core cuda_graph_impl transformer_engine) | full-iteration (one "
                                      "graph of the forward-backward; cuda_graph_impl full_iteration). Serving's "
                                      "decode graphs: --cuda-graphs/--no-cuda-graphs with --mode infer.")
EP_COMM_OVERLAP = typer.Option(_plan("ep_comm_overlap"), "--ep-comm-overlap/--no-ep-comm-overlap",
                       help="Overlap EP all-to-alls with another micro-batch (Megatron/DeepEP-style).")
DELAY_WGRAD = typer.Option(_plan("delay_wgrad"), "--delay-wgrad/--no-delay-wgrad",
                           help="With --ep-comm-overlap, defer the weight-gradient GEMMs so the backward all-to-alls "
                                "run beside them (Megatron --delay-wgrad-compute).")
MOE_DISPATCHER = typer.Option(_plan("moe_dispatcher"), "--moe-dispatcher",
                              help="MoE token dispatch: alltoall (every routed copy travels) | deepep (a token once "
                                   "per destination EP rank: DeepEP, Megatron's flex dispatcher).")
EXPERT_GEMM = typer.Option(_plan("expert_gemm"), "--expert-gemm",
                           help="MoE expert matmuls: grouped (one kernel over the local experts) | per-expert "
                                "(Transformer Engine's GroupedLinear, Megatron-Core's TEGroupedMLP: one GEMM per "
                                "local expert).")
MOE_ROUTING = typer.Option(_plan("moe_routing"), "--moe-routing",
                           help="How tokens spread over experts, for deepep's volume: random (a balanced router) | "
                                "contiguous (k consecutive experts: NeMo AutoModel's benchmark gate).")
MOE_DISPATCH_SMS = typer.Option(None, "--moe-dispatch-sms", min=1, max=1024,
                                help="SMs of deepep's dispatch / combine kernels (Megatron "
                                     "moe_flex_dispatcher_num_sms; default 20).")
CUDA_MAX_CONNECTIONS = typer.Option(None, "--cuda-max-connections", min=1, max=32,
                                    help="CUDA_DEVICE_MAX_CONNECTIONS (hardware queues, CUDA's default 8); at 1 the "
                                         "EP overlap hides about half as much (Megatron-LM PR 6311).")
MOE_FLEX_BACKEND = typer.Option(_plan("moe_flex_backend"), "--moe-flex-backend",
                                help="Kernels of --moe-dispatcher deepep (Megatron moe_flex_dispatcher_backend): "
                                     "deepep (DeepEP's normal kernels) | hybridep (Hybrid-EP, TMA).")
EP_DISPATCH_FP8 = typer.Option(_plan("ep_dispatch_fp8"), "--ep-dispatch-fp8/--no-ep-dispatch-fp8",
                               help="Send the EP dispatch in FP8 + a scale per 128 (DeepSeek-V3, DeepEP); "
                                    "combine bf16. Needs --precision fp8-* and --moe-dispatcher deepep.")
MOE_ROUTER_FUSION = typer.Option(_plan("moe_router_fusion"), "--moe-router-fusion/--no-moe-router-fusion",
                                 help="Run the MoE router in Transformer Engine's fused kernels (Megatron "
                                      "moe_router_fusion; default off, Megatron-Core's default: eager top-k "
                                      "and auxiliary loss).")
MOE_ROUTER_PADDING = typer.Option(_plan("moe_router_padding"), "--moe-router-padding/--no-moe-router-padding",
                                  help="Pad each expert's token count to the fp8 / fp4 GEMM alignment in the "
                                       "routing map (Megatron --moe-router-padding-for-quantization): extra rows "
                                       "computed, no padding copies in the grouped MLP. Needs --precision fp8-* / "
                                       "mxfp8 / nvfp4 on an MoE model.")
BF16_LAYERS_START = typer.Option(None, "--bf16-layers-start", min=0, max=1 << 16,
                                 help="With --precision fp8-* / mxfp8 / nvfp4: layers at the start of the stack "
                                      "kept in bf16 (Megatron --num-layers-at-start-in-bf16; default: the "
                                      "recipe's, NVFP4 the last 15%, fp8 none).")
BF16_LAYERS_END = typer.Option(None, "--bf16-layers-end", min=0, max=1 << 16,
                               help="Layers at the end of the stack kept in bf16 (Megatron "
                                    "--num-layers-at-end-in-bf16); one of the two given: the other is 0.")
BF16_MODULES = typer.Option(None, "--bf16-modules",
                            help="With --precision fp8-* / mxfp8 / nvfp4: modules kept in bf16 in every layer, "
                                 "comma-separated (attention, latent_proj; Megatron --te-precision-config-file).")
MXFP8_MODULES = typer.Option(None, "--mxfp8-modules",
                             help="With --precision nvfp4: modules run in MXFP8 in every NVFP4 layer, "
                                  "comma-separated (mamba_out_proj; Megatron --te-precision-config-file).")
OVERHEAD_GIB = typer.Option(MemoryAllowance().fixed_gib, "--overhead-gib",
                           help="Fixed per-GPU runtime allowance in GiB (CUDA context, NCCL, workspaces); "
                                f"default: priced from the plan (training), {SERVE_RUNTIME_GIB:g} (serving).")
FRAGMENTATION = typer.Option(MemoryAllowance().fragmentation, "--fragmentation",
                       help="Training: allocator fragmentation allowance, fraction of the tensors "
                            "freed and reallocated each step (activations, gathered buffers); held buffers "
                            "get none. Serving does not use it (the engine's KV pool is allocated once).")
INPUT_LEN = typer.Option(_job("input_len"), "--input-len", min=1, help="Inference: prompt tokens per request.")
OUTPUT_LEN = typer.Option(_job("output_len"), "--output-len", min=1, help="Inference: generated tokens per request.")
KV_DTYPE = typer.Option(ServePlan.model_fields["kv_dtype"].default, "--kv-dtype",
                        help="Inference: KV-cache dtype bf16 | fp16 | fp8.")
TTFT_SLO = typer.Option(None, "--ttft-slo", help="Inference: time-to-first-token objective, seconds.")
TPOT_SLO = typer.Option(None, "--tpot-slo", help="Inference: time-per-output-token objective, seconds.")
PREFIX_HIT_RATE = typer.Option(_job("prefix_hit_rate"), "--prefix-hit-rate",
                               help="Inference: fraction of each prompt in the prefix cache.")
GPU_MEMORY_UTILIZATION = typer.Option(None, "--gpu-memory-utilization", "--memory-fraction",
                                      help="Inference: the engine's memory fraction (vLLM --gpu-memory-utilization, "
                                      "TensorRT-LLM free_gpu_memory_fraction, SGLang --mem-fraction-static; "
                                      "default: vLLM 0.92, TensorRT-LLM 0.9, SGLang its own rule from the GPU's "
                                      "memory, TP, chunked prefill and CUDA graphs).")
ENGINE = typer.Option(_job("engine"), "--engine",
                      help="Inference: vllm | trtllm | sglang, whose rules size the KV cache and admit sequences.")
CUDA_GRAPHS = typer.Option(_job("cuda_graphs"), "--cuda-graphs/--no-cuda-graphs",
                           help="Inference: decode steps replay CUDA graphs (off: vLLM --enforce-eager; "
                                "training's graphs: --train-cuda-graphs).")
CUDA_GRAPH_SIZES = typer.Option(None, "--cuda-graph-sizes",
                                help="Inference: batch sizes the engine keeps decode CUDA graphs for, padding "
                                     "each decode step to the next one (1,2,4,...; default: trtllm the perf "
                                     "overview's list cut to --batch / --max-batch and --max-num-batched-"
                                     "tokens, vllm / sglang none).")
BLOCK_SIZE = typer.Option(_job("block_size"), "--block-size", min=1, help="Inference: tokens per KV block.")
SPECULATIVE = typer.Option(None, "--speculative",
                           help="Inference: speculative decoding mtp | eagle | eagle3 | ngram (MTP layers, an "
                                "EAGLE head or --draft-model, prompt lookup).")
SPEC_TOKENS = typer.Option(None, "--spec-tokens", min=1, max=64,
                           help="Inference: draft tokens per sequence per step (k) with --speculative.")
ACCEPTANCE = typer.Option(None, "--acceptance", min=0.0, max=1.0,
                          help="Inference: acceptance rate of a draft token (0-1; default: the method's "
                               "published one: mtp 0.85, eagle 0.75; eagle3 and ngram have none).")
DRAFT_MODEL = typer.Option(None, "--draft-model",
                           help="Inference: draft model (built-in name or config path) for --speculative eagle(3) "
                                "(default: a one-layer EAGLE head of the target's shape).")
INPUT_LEN_DIST = typer.Option(None, "--input-len-dist",
                              help="Inference: prompt lengths as a distribution: lognormal:mean=M,sigma=S | "
                                   "sharegpt | lmsys-chat | rag-long | a histogram file (length,weight lines).")
OUTPUT_LEN_DIST = typer.Option(None, "--output-len-dist",
                               help="Inference: output lengths as a distribution (as --input-len-dist).")
MAX_NUM_BATCHED_TOKENS = typer.Option(None, "--max-num-batched-tokens", min=1,
                                      help="Inference: tokens per engine step (SGLang --chunked-prefill-size); "
                                      "default: vLLM and TensorRT-LLM 8192, SGLang its own default for the GPU's "
                                      "memory (2048 below 20 GiB, 4096 below 60, 8192, 16384 from 160).")
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
SAVE = typer.Option(None, "--save", help="Write the plan (search: the best) to this plan file (for export, check).")
FORCE = typer.Option(False, "--force", help="Overwrite --save's file if it exists.")


@dataclass(frozen=True)
class Flags:
    """The flags of one option group (specs.options): the typer option of each of its fields, by field name,
    and the help section they are listed under."""

    panel: str
    options: dict[str, Any]


CLUSTER = Flags("Cluster", {"model": MODEL, "hardware": HARDWARE, "nodes": NODES, "gpus_per_node": GPUS_PER_NODE,
                            "power_limit": POWER_LIMIT, "domain_gpus": DOMAIN_GPUS})
ESTIMATE_CLUSTER = Flags("Cluster", {
    **CLUSTER.options,
    "model": typer.Option("", "--model", "-m", show_default=False,
                          help="Built-in model name or path to a spec / config.json (required without --plan)."),
    "hardware": typer.Option("", "--hardware", show_default=False,
                             help="Built-in system name or path to a system profile (required without --plan).")})
"""estimate's cluster flags: --model and --hardware come from the plan file with --plan."""
PLAN_FILE = typer.Option(None, "--plan", rich_help_panel="Cluster",
                         help="Price a saved plan file (search / estimate --save) as saved: its model, hardware, "
                              "plan and, over pools, its pinned stage / replica assignment (no other flag).")
MEMORY = Flags("Memory allowance", {"overhead_gib": OVERHEAD_GIB, "fragmentation": FRAGMENTATION})
CHECKPOINTS = Flags("Goodput (training)", {"checkpoint": CHECKPOINT, "checkpoint_interval": CHECKPOINT_INTERVAL,
                                           "failure_rate": FAILURE_RATE})
OUTPUT = Flags("Output", {"json_mode": JSON, "save": SAVE, "force": FORCE})
SWITCHES = Flags("Training switches", {
    "seq_len": SEQ_LEN, "dtype": DTYPE, "precision": PRECISION, "moe_capacity_factor": MOE_CAPACITY_FACTOR,
    "pp_schedule": PP_SCHEDULE, "flash_attention": FLASH_ATTENTION, "attention_kernel": ATTENTION_KERNEL,
    "attention_release": ATTENTION_RELEASE,
    "fused_loss": FUSED_LOSS, "fused_loss_impl": FUSED_LOSS_IMPL, "unfused_loss_impl": UNFUSED_LOSS_IMPL, "tp_whole_embedding": TP_WHOLE_EMBEDDING,
    "tp_impl": TP_IMPL, "cp_impl": CP_IMPL, "cp_comm_type": CP_COMM_TYPE,
    "cp_a2a_size": CP_A2A_SIZE, "cp_kv_repeated": CP_KV_REPEATED,
    "cp_comm_overlap": CP_COMM_OVERLAP,
    "recompute_layers": RECOMPUTE_LAYERS,
    "recompute_modules": RECOMPUTE_MODULES, "offload_layers": OFFLOAD_LAYERS, "mtp_layers": MTP_LAYERS,
    "indexer_loss": INDEXER_LOSS,
    "offload_moe_act": OFFLOAD_MOE_ACT, "moe_paged_stash": MOE_PAGED_STASH,
    "moe_rank_capacity_factor": MOE_RANK_CAPACITY_FACTOR, "offload_modules": OFFLOAD_MODULES,
    "dp_replicate": DP_REPLICATE,
    "dp_outer_optimizer": DP_OUTER_OPTIMIZER,
    "overlap_grad_reduce": OVERLAP_GRAD_REDUCE,
    "overlap_param_gather": OVERLAP_PARAM_GATHER, "tp_comm_overlap": TP_COMM_OVERLAP,
    "pp_scatter_gather": PP_SCATTER_GATHER, "tp_backward_overlap": TP_BACKWARD_OVERLAP,
    "ep_comm_overlap": EP_COMM_OVERLAP, "delay_wgrad": DELAY_WGRAD, "moe_dispatcher": MOE_DISPATCHER,
    "moe_routing": MOE_ROUTING,
    "expert_gemm": EXPERT_GEMM,
    "moe_dispatch_sms": MOE_DISPATCH_SMS, "cuda_max_connections": CUDA_MAX_CONNECTIONS,
    "moe_flex_backend": MOE_FLEX_BACKEND, "ep_dispatch_fp8": EP_DISPATCH_FP8, "moe_router_fusion": MOE_ROUTER_FUSION,
    "moe_router_padding": MOE_ROUTER_PADDING, "fp32_param_shards": FP32_PARAM_SHARDS,
    "megatron_fsdp": MEGATRON_FSDP,
    "bf16_layers_start": BF16_LAYERS_START, "bf16_layers_end": BF16_LAYERS_END, "bf16_modules": BF16_MODULES,
    "mxfp8_modules": MXFP8_MODULES,
    "swiglu_fp8_input": SWIGLU_FP8_INPUT, "fp8_attention": FP8_ATTENTION, "fp8_output_proj": FP8_OUTPUT_PROJ,
    "train_cuda_graphs": TRAIN_CUDA_GRAPHS,
    "grad_dtype": GRAD_DTYPE,
    "fp8_params": FP8_PARAMS,
    "optimizer": OPTIMIZER,
    "optimizer_master_dtype": OPTIMIZER_MASTER_DTYPE, "optimizer_moment_dtype": OPTIMIZER_MOMENT_DTYPE,
    "param_remainders": PARAM_REMAINDERS, "kept_grad_shards": KEPT_GRAD_SHARDS,
    "fp32_embedding_grads": FP32_EMBEDDING_GRADS, "grad_reduce": GRAD_REDUCE, "grad_accumulation": GRAD_ACCUMULATION,
    "grad_reduce_dtype": GRAD_REDUCE_DTYPE, "grad_reduce_fp32_sum": GRAD_REDUCE_FP32_SUM,
    "launch_blocking": LAUNCH_BLOCKING, "zero3_unit": ZERO3_UNIT, "rope_complex": ROPE_COMPLEX,
    "bias_dropout_fusion": BIAS_DROPOUT_FUSION,
    "zero3_copy_out": ZERO3_COPY_OUT, "pp_blocking_sends": PP_BLOCKING_SENDS, "norm_kernel": NORM_KERNEL,
    "softmax_kernel": SOFTMAX_KERNEL,
    "fp8_scaling": FP8_SCALING,
    "pp_unbatched_sends": PP_UNBATCHED_SENDS,
    "axis_order": AXIS_ORDER})
SEARCH_SWITCHES = Flags(SWITCHES.panel, {
    **SWITCHES.options,
    "grad_dtype": typer.Option(None, "--grad-dtype", help="Pin the gradient buffer dtype: fp32 | bf16 (default: "
                                                          "both tried, the better shown)."),
    "fp8_params": typer.Option(None, "--fp8-params/--no-fp8-params",
                               help="Pin primary weights in the fp8 / NVFP4 recipe's format (default: both tried "
                                    "where the recipe allows)."),
    "cp_comm_type": typer.Option(None, "--cp-comm-type",
                                 help="Pin Transformer Engine's CP attention: p2p | a2a | all_gather | a2a+p2p "
                                      "(default: p2p; where the model's masks rule the ring out, those TE runs them "
                                      "with are tried too; a2a+p2p too where cp can span NVLink domains, its a2a "
                                      "level the in-domain share; the better shown)."),
    "cp_a2a_size": typer.Option(None, "--cp-a2a-size", min=1,
                                help="Pin the a2a level of --cp-comm-type a2a+p2p (default: each in-domain share "
                                     "tried)."),
    "tp_comm_overlap": typer.Option(True, "--tp-comm-overlap/--no-tp-comm-overlap",
                                    help="Overlap TP comm with GEMMs where sp is on (default on, as Megatron-Bridge "
                                         "/ NeMo performance recipes set it, and searched again without it where a "
                                         "ranked plan prices it slower; off for MLA models, which Megatron-Core "
                                         "runs without it; naming it pins it)."),
    "ep_comm_overlap": typer.Option(_plan("ep_comm_overlap"), "--ep-comm-overlap/--no-ep-comm-overlap",
                                    show_default=False,
                                    help="Pin the EP all-to-all overlap with another micro-batch (default: tried "
                                         "both ways on MoE models where check_plan allows it, the better shown).")})
PIPELINE_SPLIT = Flags("Pipeline split", {"pp_first": PP_FIRST_LAYERS, "pp_last": PP_LAST_LAYERS,
                                          "embedding_in_split": EMBEDDING_IN_SPLIT, "loss_in_split": LOSS_IN_SPLIT})
PLAN = Flags("Plan", {
    "tp": typer.Option(1, "--tp", min=1, help="Tensor-parallel degree."),
    "pp": typer.Option(1, "--pp", min=1, help="Pipeline-parallel stages."),
    "dp": typer.Option(None, "--dp", min=1, help="Data-parallel degree (default: GPUs / (tp*pp*cp))."),
    "cp": typer.Option(1, "--cp", min=1, help="Context-parallel degree."),
    "ep": typer.Option(1, "--ep", min=1, help="Expert-parallel degree."),
    "etp": typer.Option(None, "--etp", min=1, help="Expert tensor-parallel degree (default: tp)."),
    "vpp": typer.Option(None, "--vpp", min=1, help="Virtual pipeline stages per rank (interleaved schedule; "
                                                   "default 1, or a --pp-layout's chunks / pp)."),
    "pp_layers": typer.Option(None, "--pp-layers", help="Layers of every pipeline stage, e.g. 7,8,8,...,7 (uneven "
                                                        "split)."),
    "pp_layout": PP_LAYOUT,
    "sp": typer.Option(None, "--sp/--no-sp", help="Sequence parallelism (default: on when tp > 1)."),
    "zero": typer.Option(0, "--zero", help="ZeRO stage 0-3 (1 = Megatron distributed optimizer)."),
    "recompute": typer.Option("none", "--recompute", help="none | selective | full | op (torchtitan's per-op "
                                                          "policy)."),
    "micro_batch": typer.Option(1, "--micro-batch", min=1, help="Sequences per micro-batch."),
    "global_batch": typer.Option(None, "--global-batch", min=1, help="Sequences per step (default: micro-batch x "
                                                                     "dp)."),
})
SEARCH_PINS = Flags("Search space", {
    "tp": typer.Option(None, "--tp", min=1, help="Pin the tensor-parallel degree."),
    "pp": typer.Option(None, "--pp", min=1, help="Pin the pipeline stages."),
    "cp": typer.Option(None, "--cp", min=1, help="Pin the context-parallel degree."),
    "ep": typer.Option(None, "--ep", min=1, help="Pin the expert-parallel degree."),
    "etp": typer.Option(None, "--etp", min=1, help="Pin the expert tensor-parallel degree (e.g. 1)."),
    "vpp": typer.Option(None, "--vpp", min=1, help="Pin the virtual pipeline stages."),
    "sp": typer.Option(None, "--sp/--no-sp", help="Pin sequence parallelism on or off."),
    "zero": typer.Option(None, "--zero", help="Pin the ZeRO stage."),
    "recompute": typer.Option(None, "--recompute", help="Pin recompute: none | selective | full | op (torchtitan's "
                                                        "per-op policy; searched only when pinned)."),
    "micro_batch": typer.Option(None, "--micro-batch", min=1, help="Pin the micro-batch."),
    "max_tp": typer.Option(None, "--max-tp", min=1, help="Largest TP to try (default: the NVLink domain)."),
    "max_pp": typer.Option(None, "--max-pp", min=1, help="Largest PP to try."),
    "max_cp": typer.Option(None, "--max-cp", min=1, help="Largest CP to try (default 32)."),
    "no_cp": typer.Option(False, "--no-cp", help="Do not use context parallelism."),
    "global_batch": typer.Option(None, "--global-batch", min=1, help="Sequences per step."),
    "batch_tokens": typer.Option(None, "--batch-tokens", help="Tokens per step instead of --global-batch (e.g. "
                                                              "16M); default 4M."),
})
SEARCH_GOAL = Flags("Ranking", {
    "objective": typer.Option("throughput", "--objective", help="throughput | time-to-train | gpu-hours | headroom "
                                                                "| cost (comparing systems: no headroom)."),
    "train_tokens": typer.Option("1T", "--train-tokens", help="Token budget for time-to-train / gpu-hours."),
    "top": typer.Option(5, "--top", min=1, help="How many plans to show."),
    "min_headroom": typer.Option(None, "--min-headroom", min=0.0,
                                 help="Training: GiB each plan must leave free per GPU beyond the allowance."),
    "wide": typer.Option(False, "--wide", help="Tables with a column per degree (wider than 80 columns)."),
    "explain_opt": typer.Option(False, "--explain", help="Why #1 beats #2 and the conventional plan, part by part."),
    "budget_gpus": typer.Option(None, "--budget-gpus", min=1,
                                help="Training: GPUs to rent on each system of --hardware A,B,C (whole nodes "
                                     "within it), instead of --nodes; ranks the systems by the objective."),
    "price": typer.Option(None, "--price", help="Training: US dollars per GPU-hour, SYSTEM=USD,... (default: "
                                                "the profile's cited price, if any); prices the run."),
})
SERVING = Flags("Serving (--mode infer)", {
    "input_len": INPUT_LEN, "output_len": OUTPUT_LEN, "kv_dtype": KV_DTYPE, "ttft_slo": TTFT_SLO,
    "tpot_slo": TPOT_SLO, "prefix_hit_rate": PREFIX_HIT_RATE, "gpu_memory_utilization": GPU_MEMORY_UTILIZATION,
    "block_size": BLOCK_SIZE, "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS, "engine": ENGINE,
    "cuda_graphs": CUDA_GRAPHS, "cuda_graph_sizes": CUDA_GRAPH_SIZES, "speculative": SPECULATIVE,
    "spec_tokens": SPEC_TOKENS, "acceptance": ACCEPTANCE,
    "draft_model": DRAFT_MODEL, "input_len_dist": INPUT_LEN_DIST, "output_len_dist": OUTPUT_LEN_DIST})
MODE = typer.Option("train", "--mode", help="train | infer.", rich_help_panel=CLUSTER.panel)



def _serve_plan(field: str):
    return ServePlan.model_fields[field].default


MOE_SERVING = Flags("Phases and MoE serving (--mode infer)", {
    "phase": typer.Option(_serve_plan("phase"), "--phase",
                          help="Inference: both (co-located) | prefill | decode (one pool of a disaggregated "
                               "deployment, priced on its own: prefill at --max-num-batched-tokens prompt tokens "
                               "per batch, decode at --batch sequences per replica; search: up to --max-batch)."),
    "dp_attention": typer.Option(_serve_plan("dp_attention"), "--dp-attention/--no-dp-attention",
                                 help="Inference, MoE: attention and dense layers whole on every GPU, routed "
                                      "experts over --ep (= the GPUs; --tp 1)."),
    "two_batch_overlap": typer.Option(_serve_plan("two_batch_overlap"), "--two-batch-overlap/--no-two-batch-overlap",
                                      help="Inference, MoE: overlap one micro-batch's dispatch/combine with the "
                                           "other's compute."),
    "redundant_experts": typer.Option(_serve_plan("redundant_experts"), "--redundant-experts", min=0,
                                      help="Inference, MoE: extra expert replicas (EPLB) spread over the EP ranks."),
    "ep_imbalance": typer.Option(_serve_plan("ep_imbalance"), "--ep-imbalance", min=1.0,
                                 help="Inference, MoE with --dp-attention or --ep above --tp: busiest EP rank's "
                                      "expert load over the mean (default: measured with EPLB, SGLang on H100)."),
    "expert_dtype": typer.Option(None, "--expert-dtype",
                                 help="Inference, MoE: routed experts' weight dtype when it differs from --dtype "
                                      "(fp8, nvfp4...)."),
})


SERVING_ONLY = (frozenset(ServingOptions.model_fields) | frozenset(MoeServingOptions.model_fields)
                | {"batch", "max_load", "max_batch", "request_rate", "disaggregated"})
"""Options only the serving paths (--mode infer) read: given in training mode they are an error."""
SERVING_READS = (frozenset(ClusterOptions.model_fields) | frozenset(MemoryOptions.model_fields)
                 | frozenset(OutputOptions.model_fields) | {"tp", "pp", "ep", "dtype", "mode", "moe_dispatcher"}
                 | SERVING_ONLY)
"""Options the serving paths of estimate and search read (each command adds its own: estimate --dp, search
--objective and --top; --moe-dispatcher is shared with training, alltoall | deepep in serving); any other option
given with --mode infer is a training option, and an error."""
SERVING_INSTEAD = {
    "precision": "serving weights take --dtype: bf16, fp8, mxfp8, nvfp4, int8, int4",
    "global_batch": "concurrent sequences are --batch (estimate) or --max-batch (search)",
    "micro_batch": "concurrent sequences are --batch (estimate) or --max-batch (search)",
    "seq_len": "request lengths are --input-len and --output-len",
    "train_cuda_graphs": "serving's decode graphs are --cuda-graphs / --no-cuda-graphs",
}
"""What to give instead of a training option in --mode infer, where serving has a counterpart."""


def grouped(fn: Callable) -> Callable:
    """Let a typer command take typed option groups: a parameter annotated `Annotated[Group, flags]` (Group a
    specs.options model, flags its Flags) is shown to typer as one option per field, listed under the group's
    help section, and reaches the command as one Group built from those options. Other parameters pass as
    they are."""
    hints = get_type_hints(fn, include_extras=True)
    groups: dict[str, tuple[type[BaseModel], Flags]] = {}
    params: list[inspect.Parameter] = []
    for p in inspect.signature(fn).parameters.values():
        hint = hints.get(p.name, p.annotation)
        if get_origin(hint) is not Annotated or not isinstance(get_args(hint)[1], Flags):
            params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hint))
            continue
        model, flags = get_args(hint)[0], get_args(hint)[1]
        if set(model.model_fields) != set(flags.options):
            raise TypeError(f"{fn.__name__}: {model.__name__}'s fields and its flags differ: "
                            f"{sorted(set(model.model_fields) ^ set(flags.options))}")
        groups[p.name] = (model, flags)
        for field, option in flags.options.items():
            if option.rich_help_panel is None:
                option.rich_help_panel = flags.panel
            params.append(inspect.Parameter(field, inspect.Parameter.KEYWORD_ONLY, default=option,
                                            annotation=model.model_fields[field].annotation))
    names = [p.name for p in params]
    if len(names) != len(set(names)):
        raise TypeError(f"{fn.__name__}: two option groups share a field: {names}")

    @functools.wraps(fn)
    def command(**given: Any) -> Any:
        typed = {name: model(**{f: given.pop(f) for f in model.model_fields}) for name, (model, _) in groups.items()}
        return fn(**given, **typed)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]  # read by inspect and typer
    command.__annotations__ = {p.name: p.annotation for p in params}
    del command.__wrapped__  # typer reads the signature above, not fn's
    return command


class SectionedCommand(TyperCommand):
    """A command whose --help lists its options in sections, one per option group (Flags.panel), in click's
    plain layout: it wraps help text to the terminal and never cuts an option name (rich's tables cut
    `--account-for-embedding-in-pipeline-split` to fit 80 columns)."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                sections.setdefault(getattr(param, "rich_help_panel", None) or "Options", []).append(record)
        for name, records in sections.items():
            with formatter.section(name):
                formatter.write_dl(records)
