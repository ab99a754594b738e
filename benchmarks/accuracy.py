"""Predicted vs measured for every published training run that gives enough configuration.

    python benchmarks/accuracy.py [--runs benchmarks/data/published_runs.yaml] [--family mpt] [--quiet]

For each record it builds the model and plan the source describes, runs the same estimate as
`llmplan estimate` with the default (uncalibrated) hardware profiles, predicts the quantity the source
measured (see benchmarks/data/README.md: Narayanan 2021 TFLOP/s count the recompute pass, i.e. HFU; MPT,
Megatron-Core and NeMo report model FLOPs; Korthikanti Table 5 gives iteration times), and prints the
error per record and the median / max absolute percentage error per family. Nothing here is tuned per
record: assumptions that fill gaps in a record (micro-batch 1 where not given, fused attention for runs
from 2023 on) are listed in ASSUMPTIONS and apply to a whole family. It then reports the ranking within
groups of runs measured on one cluster, memory where a source publishes it, the serving family, the
reference searches' top plans against the best published MFU, and the leave-one-family-out fit.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml
from typing import Any

from llmplan.cost.attention_rate import triton_flash2_ratio
from llmplan.cost.comm import comm_seconds, step_comm, te_default_margin_sms
from llmplan.cost.elementwise import softmax_rows_fit
from llmplan.cost.memory import TrainingMemory, training_memory
from llmplan.cost.operators import operator_uses, with_fallbacks
from llmplan.cost.serve_step import default_graph_sizes
from llmplan.cost.step import StepTime, Throughput, step_time, throughput
from llmplan.errors import LlmplanError, PlanViolationError
from llmplan.estimate import estimate_training
from llmplan.cost.compute import layer_flops, model_flops_per_step
from llmplan.cost.params import padded_vocab, param_counts
from llmplan.specs.check import balanced_split, check_plan
from llmplan.specs.check_switches import settle
from llmplan.specs.model import ModelSpec
from llmplan.specs.hardware import SystemSpec
from llmplan.specs.plan import ClusterSpec, ParallelPlan, trained_model
from llmplan.serving import at_max_load, estimate_serving
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.specs.serve import ServeJob, ServePlan
from llmplan.topology.placement import DEFAULT_ORDER, on_cluster, place

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runs import runs_path  # noqa: E402

DEFAULT_RUNS = runs_path()
TRAIN_FAMILIES = ("narayanan2021", "korthikanti2022", "megatron", "mpt", "nemo2407", "megatron2020", "bridge",
                  "torchtitan", "nemocp", "automodel", "mbridge-dense", "mbridge-moe", "bloom", "megascale", "mtnlg")
FAMILIES = TRAIN_FAMILIES + ("megascale-opt", "bridgecard", "deepseek", "dgxc", "trtllm")
"""Scored, not fitted: dgxc, NVIDIA DGX Cloud Benchmarking's Nemotron-H 56B step times, the only published runs of
a dense Mamba-2 hybrid (no MoE), kept out of the fit so that they test the Mamba-2 pricing out of sample, and its
bf16 Llama 3.1 H100 step times (the H100 profile's best published bf16 MFU is its 8B row); deepseek, one published run on H800, whose GPU has no fitted clock; bridgecard,
Megatron-Bridge verification runs (and the two arms of PR 5094's EP-overlap A/B on the Qwen3-30B-A3B card's recipe), kept out of the fit so that its error stays out of sample (it was the H100
profile's best published bf16 MFU until the DGX Cloud 8B row); megascale-opt, MegaScale's optimised stack (parallel transformer block,
TP / DP overlap and fused operators read as plan and model switches; sliding-window attention, whose window the
paper does not give, not described), reported beside its Megatron-LM baseline (`megascale`) on the same plans:
the gap between the two is software."""
BRIDGE_FAMILIES = ("bridge", "mbridge-dense", "mbridge-moe")
"""Megatron-Bridge performance-recipe rows: the repo's `bridge` records and the `mbridge` tables 25.09-26.08."""
SOURCE_GROUPS = {
    "megatron-bridge": ("bridge", "mbridge-dense", "mbridge-moe", "bridgecard"),
    "nemo-docs": ("nemo2407", "nemocp"),
    "megatron-lm": ("narayanan2021", "korthikanti2022", "megatron2020", "megatron"),
    "megascale": ("megascale", "megascale-opt"),
}
"""Families that share one publisher's measurement pipeline (docs/validation.md#lofo-source), by publisher and
stack, not by error: Megatron-Bridge's performance summaries and model verification cards (NVIDIA-NeMo/
Megatron-Bridge: its scripts/performance recipes); the NeMo docs' performance tables of 24.03-24.07
(NVIDIA/NeMo docs/source/performance: performance_summary.md and performance_long_sequence.md); NVIDIA's
Megatron-LM team's own runs (the Megatron-LM README tables of 2020 and r0.8, Narayanan et al. 2021 and
Korthikanti et al. 2022 on Selene); MegaScale's baseline and optimised stacks (one paper, one cluster). Every
other family is its own source. A left-out fit leaves out the whole group of the family it scores."""


def source_group(fam: str) -> tuple[str, ...]:
    """The families of `fam`'s source (SOURCE_GROUPS), or `fam` alone."""
    return next((g for g in SOURCE_GROUPS.values() if fam in g), (fam,))


MBRIDGE_DENSE_MODELS = ("-llama3-", "-llama3.1-")
"""mbridge rows of dense models (by id); every other mbridge row is a MoE model (mbridge-moe)."""
TRTLLM_MAX_BATCH = 4096  # trtllm-bench runs "max batch up to 8192"; one family-level cap, stated
def trtllm_bench_limits(m: ModelSpec, tp: int, pp: int, isl: int, osl: int, hbm_bytes: float,
                        fraction: float) -> tuple[int, int]:
    """(max_batch_size, max_num_tokens) trtllm-bench throughput picks when neither is given (the perf overview
    gives neither): requests that fit the whole GPUs' memory less the weights (fp8: a byte a parameter, fp8
    KV, at least one KV head per rank) at `fraction`, rounded up (to 32 below 256, 128 below 1024, else
    256; at most 4096 / pp), tokens = requests x (1 + isl / osl) rounded up (at least 2048), then raised to
    isl + max_batch_size (chunked prefill off). Source: NVIDIA/TensorRT-LLM tensorrt_llm/bench/build/tuning.py
    at 04cba882 (calc_engine_setting, finetune_setting); bench/benchmark/utils/general.py at 0171265e
    (get_settings)."""
    gib = float(1 << 30)
    per_token = 2 * m.num_hidden_layers * max(tp, m.kv_heads) * m.d_head / gib  # fp8 KV, GiB a token
    free = (hbm_bytes / gib * tp * pp - param_counts(m).total / gib) * fraction
    bs = min(free / (per_token * (isl + osl)), 4096) / pp
    tokens = min(bs * (1 + isl / osl), 32768)
    step = 32 if bs < 256 else 128 if bs < 1024 else 256
    max_bs = max(64, step * math.ceil(bs / step)) if bs < 256 else step * math.ceil(bs / step)
    step = 256 if tokens < 4096 else 512 if tokens < 8192 else 1024
    max_tokens = max(2048, step * math.ceil(tokens / step)) if tokens < 4096 else step * math.ceil(tokens / step)
    return max_bs, max(max_tokens, isl + max_bs)


TRTLLM_GRAPH_PADDING = True
"""Decode steps padded to the captured CUDA graph sizes (cost.serve_step.default_graph_sizes; docs/validation.md#trtllm-long-decode);
False prices each step at its real batch (the reading before)."""
TRTLLM_ATTENTION_DP = False
"""How the trtllm MoE rows (Qwen3-235B-A22B H100 TP8 EP8) ran attention: TP8, not attention DP. The perf
overview's MoE llm_options.yml (docs/source/performance/perf-overview.md at 00f37686) writes
`enable_attention_dp: true` indented under `cuda_graph_config`; the LLM API of that release types
cuda_graph_config as CudaGraphConfig, a StrictBaseModel (pydantic extra="forbid": fields batch_sizes,
max_batch_size, enable_padding), and trtllm-bench merges the YAML into the LLM arguments as it is
(llmapi/llm_args.py, update_llm_args_with_extra_dict: cuda_graph_config is not in its field_mapping), so that
file fails validation rather than turning attention DP on: the page does not show the flag set where it
takes effect. docs/validation.md#trtllm-qwen3-attention-dp prices both readings."""
ASSUMPTIONS = {
    "narayanan2021": "fp16 with fp16 gradient reduction (TWO_BYTE_GRADS), full recompute, no fused attention "
                     "(2021); Table 1 as the authors' scripts ran it (examples/sc21/run_table_1.sh at 6985e58938: "
                     "micro-batch 16 .. 1, virtual stages 3 / 2 / 2 / 3 on the 76.1B .. 529.6B rows, 2 on the 1T "
                     "row (section 5.1's interleaved schedule, which the script leaves out there) and none on the "
                     "rest, PyTorch DDP overlapped on the PP 1 rows and local DDP after the backward on the rest: "
                     "NARAYANAN_T1), Table 2's PTD-P rows (no script) micro-batch 1 and not interleaved; "
                     "pipeline scatter/gather, every TP collective synchronous (PP_SCATTER_GATHER, SYNC_TP), every pipeline exchange waited for and the device synchronised (PP_BLOCKING_SENDS), each micro-batch's gradient "
                     "added into main_grad by the DDP hook (GRAD_ACCUMULATION add; ZeRO-3 rows not)"
                     "; the ZeRO-3 rows as DeepSpeed stage 3 of 2021 ran them (zero3_unit tensor: one collective per weight "
                     "tensor, gathered again for the recompute), "
                     "the LayerNorm backward in two kernels (TWO_PASS_NORM); "
                     "predicts hardware TFLOP/s (Eq. 3 counts the recompute pass)",
    "korthikanti2022": "no fused attention (2022); Table 3 settings; pipeline scatter/gather without SP (PP_SCATTER_GATHER); every pipeline exchange waited for and the device synchronised (PP_BLOCKING_SENDS); predicts iteration time, and MFU/HFU",
    "megatron": "Megatron-Core r0.8 and examples/llama: fused attention, distributed optimizer, overlap flags "
                "as listed, sequence parallelism with TP (--tp-comm-overlap requires it), 4h GELU MLP where ffn is "
                "not given, the r0.8 GPTs with an untied output layer and learned absolute positions (the table's "
                "model sizes, r0.8's default: MEGATRON_R08_GPT), "
                "fp8 weights and bf16 gradient reduction in the examples/llama fp8 scripts (--fp8-param-gather, "
                "--grad-reduce-in-bf16) and TP overlap on its 70B / 405B rows (NeMo's performance scripts, which its "
                "README says it follows: RECIPE_SETTINGS), micro-batch 1 and no recompute where not given; "
                "the r0.8 scaling runs with PP > 1 interleaved at one layer per virtual stage (the README overlaps "
                "pipeline communication, which r0.8 does only in the interleaved schedule: megatron/training/"
                "arguments.py sets overlap_p2p_comm False without it; one layer is the only virtual-stage size "
                "valid for every PP > 1 row of its table); the PP 1 rows as one micro-batch of the replica's 4 "
                "sequences (r0.8 reduces gradients only in the last micro-batch's backward: four micro-batches "
                "would leave DP traffic exposed that the measured MFU has no room for); Megatron-LM's default NaN "
                "check and 1/dp pre-scaling of the gradient buckets (grad_nan_check, grad_prescale: neither the README "
                "nor the scripts turn them off), "
                "each 1F1B exchange (PP > 1, no interleaving) followed by a device synchronisation (MCORE_1F1B_SYNC), "
                "the TP overlap at its recipe's userbuffer config (ub_config_for) or TE's defaults "
                "(te_default_margin); predicts MFU / model TFLOP/s",
    "mpt": "llm-foundry FSDP = ZeRO-3 over all GPUs with fp32 parameter shards (FSDP mixed precision); "
           "attention the kernel each table ran: attn_impl triton (submit_benchmarks.py default at b2a43a147; "
           "TUTORIAL.md: 'Our training setups typically use triton'), a Triton FlashAttention built by "
           "triton-pre-mlir without Hopper instructions, priced at FA2's rate times its published ratio to FA2 "
           "(Dao 2023 Figure 4, triton_flash2_ratio), and the January 2024 large-scale 1b/3b/7b/70b rows attn_impl "
           "flash with flash-attn 2.4.2, FlashAttention-2 (sweep.py, submit_benchmarks.py at 5e85bd62d; "
           "ran_triton_attention); "
           "bf16 or fp8 as listed; the models as MPTConfig's defaults build them, learned positions and biases "
           "(MPT_BENCHMARK_ARCH: the tables' NumParams, to the parameter); FSDP's gradient reduction in bf16 on the "
           "'MP Mode' PURE rows, fp32 on the DEFAULT ones (mpt_bf16_reduce), "
           "the LayerNorm backward in two kernels (TWO_PASS_NORM); predicts MFU",
    "nemo2407": "NeMo 24.07: fp8, attention FlashAttention-2 (run through NeMo-Framework-Launcher, whose config "
                "sets NVTE_FUSED_ATTN 0 until 2024-08-30: FLASH2_FAMILIES), distributed optimizer (Apex distributed_fused_adam, bf16 "
                "gradient buckets, the embeddings' in fp32) and sequence parallelism with TP, as its performance "
                "recipes set; the Nemotron-4 rows with an output layer of their own and no biases "
                "(NEMO2407_NEMOTRON); the Nemotron-4 340B and SFT rows with their launcher configs' bf16 optimizer states, and the SFT "
                "rows' fp8 weights and virtual stages, and TP overlap where the launcher config sets "
                "ub_tp_comm_overlap (GPT-3 20B, Llama 2 / 3 70B, Nemotron 8B / 22B) and on the GPT-3 175B 512-GPU row "
                "as the MLPerf Training v4.0 config its TFLOP/s links to sets it (RECIPE_SETTINGS); LoRA rows "
                "skipped (PEFT not modelled), "
                "each 1F1B exchange (PP > 1, no interleaving) followed by a device synchronisation (MCORE_1F1B_SYNC), "
                "the TP overlap at its recipe's userbuffer config (ub_config_for) or TE's defaults "
                "(te_default_margin); predicts model TFLOP/s per GPU",
    "megatron2020": "A100 rows only (no V100 profile), on A100 40GB (the records' gpu: the table of 2020-09-11 "
                    "predates the 80GB A100 of 2020-11-16): fp16 with fp16 gradient reduction (TWO_BYTE_GRADS), the "
                    "local batch as one micro-batch (2020's --batch-size, no accumulation), full recompute, no fused "
                    "attention, its softmax as eager ops (EAGER_SOFTMAX), its bias-dropout-add unfused "
                    "and its bias-GeLU's bias added in its own pass (OPT_IN_FUSIONS), no gradient accumulation pass "
                    "(grads set to None, one micro-batch: GRAD_ACCUMULATION), every TP collective synchronous "
                    "(SYNC_TP), "
                    "the LayerNorm backward in two kernels (TWO_PASS_NORM); predicts hardware TFLOP/s",
    "bridge": "Megatron-Bridge performance recipes (NeMo 25.11 / 26.02 tables; dense Llama rows without "
              "activation offload; block recompute where the recipe preset sets recompute_num_layers): the distributed optimizer (Megatron-FSDP where FSDP > 0), "
              "bf16 gradient reduction, fp8 weights for FP8-CS and MXFP8, sequence parallelism and TP overlap with "
              "TP, native fused attention, "
              "each 1F1B exchange (PP > 1, no interleaving) followed by a device synchronisation (MCORE_1F1B_SYNC), "
              "the TP overlap at its recipe's userbuffer config (ub_config_for) or TE's defaults (te_default_margin), "
              "the param-gather overlap off where the preset turns it off (mbridge_param_gather_off), "
              "the param gather overlapped with the optimizer step where the script turns it on "
              "(mbridge_param_gather_optstep), 128 x 2^20-parameter DP buckets where the recipe sets a "
              "CommOverlapConfig and the gradient-reduce overlap is on (bridge_bucket_params; Megatron-Core's "
              "max(40M, 1M x dp) elsewhere: the Nemotron-3 Super presets and GPT-OSS 120B's but GB200 from "
              "26.02.01 and GB300 MXFP8 from 26.06, docs/validation.md#bucket-paths); "
              "predicts tokens/s per GPU (unambiguous: no FLOP "
              "convention); only the H100 rows enter the constant fit (Blackwell profiles are not fitted)",
    "torchtitan": "torchtitan's December 2024 Llama 3.1 benchmarks on H100 96 GB HBM2e at 500 W (hgx-h100-96gb "
                  "with --power-limit 500): FSDP2 = ZeRO-3 with fp32 gradient reduction and fp32 parameter "
                  "shards, PyTorch SDPA = "
                  "FlashAttention-2 (cuDNN attention was opt-in then: pytorch/pytorch#138522, #142132), "
                  "torch.compile = fused kernels (not the loss: eager cross_entropy on fp32 logits, train.py at "
                  "9dec370), its compiled RMSNorm backward in two kernels (Inductor's dx and dweight reductions "
                  "unfused at torch 1963fc8: INDUCTOR_TWO_PASS_NORM), "
                  "eager = the unfused kernels (its RMSNorm, rotary and SwiGLU as PyTorch ops), "
                  "torchao float8 tensorwise, AsyncTP = TP overlap, "
                  "the pipeline rows' FSDP gradient reduce-scatter after each stage's last backward, not beside "
                  "it (torch.distributed.pipelining's stage calls FSDP's post_backward by hand once the last "
                  "backward is over: pytorch/pytorch#134052, #165106), "
                  "context parallelism as SDPA's flash backend (FlashAttention-2) in PyTorch's ring "
                  "(utils.py at 9dec370: sdpa_kernel FLASH_ATTENTION first), traced into each compiled block "
                  "with its K/V and gradient transfers waited for where issued (cp_comm_overlap off), "
                  "sequence parallelism with TP (its norms), FSDP float8 all-gather where the 405B preset sets "
                  "it; the full activation checkpointing rows and the bf16 rows of its op-level selective policy "
                  "(--recompute op; the Float8 op rows are not scored: 9dec370 recomputes float8 matmuls, which "
                  "the op mode does not); predicts tokens/s per GPU; memory is the allocator's reserved peak, "
                  "reported apart",
    "nemocp": "NeMo's long-sequence table (context parallelism, 4k-1M tokens): Llama 2 7B in fp8 on H100 (NeMo "
              "24.03), the 'With CP' layouts; attention FlashAttention-2 (the launcher of the 24.03.01 container "
              "disables cuDNN's fused attention, NVTE_FUSED_ATTN 0: FLASH2_FAMILIES); as nemo2407 otherwise "
              "(distributed optimizer, bf16 gradient buckets, sequence parallelism with TP; micro-batch 1 and no "
              "recompute, which the table does not state), "
              "each 1F1B exchange (PP > 1, no interleaving) followed by a device synchronisation (MCORE_1F1B_SYNC), "
              "the TP overlap at its recipe's userbuffer config (ub_config_for) or TE's defaults (te_default_margin); "
              "predicts model TFLOP/s per GPU",
    "automodel": "NeMo AutoModel's H100 bf16 pre-training table (PyTorch FSDP2 + Transformer Engine): FSDP2 = "
                 "ZeRO-3 with fp32 parameter shards and fp32 gradient reduction (MixedPrecisionPolicy "
                 "reduce_dtype float32), the gradient reduce-scatter in every micro-batch (defer_fsdp_grad_sync "
                 "false), full activation checkpointing as the recipes set, the eager loss (MaskedCrossEntropy: "
                 "on fp32 logits where the recipe upcasts, else priced as the fused loss's one copy); attention "
                 "as the recipe selects it: HF SDPA restricted to the flash backend (= FlashAttention-2) under CP "
                 "(resolve_sdpa_method) in PyTorch's ring, rotate method allgather, on the KV heads (transformers "
                 "passes enable_gqa) and run eagerly, overlapped (a graph break around SDPA: attach_cp_sdpa_hooks, "
                 "context_parallel/utils.py at 36044ad3d), TE DotProductAttention (native fused) where the recipe sets attn te, "
                 "FlexAttention priced as FlashAttention-2 (the nearest modelled kernel); MoE rows with uniform "
                 "routing (the runs' fake balanced gate: token i takes experts i*k .. i*k+k-1), the recipe's EP with "
                 "DeepEP's dispatch (a token once per destination rank: one row under that gate) and exposed "
                 "all-to-alls; the rows whose "
                 "recipe matches the table's batch sizes and whose layout llmplan can describe (Llama 3 70B, "
                 "Qwen3 30B-A3B, GPT-OSS 20B); predicts tokens/s per GPU",
    "bridgecard": "Megatron-Bridge's model verification cards (a recipe run for 50-100 steps, the last 10 "
                  "averaged; PR 5094's EP-overlap A/B on the Qwen3-30B-A3B card's recipe, both arms): the recipe's settings as the bridge family reads them (the distributed optimizer, bf16 "
                  "gradient reduction, overlapped gradient reduce and parameter gather, TE fused attention, the fused "
                  "loss); MoE rows with the recipe's dispatcher (HybridEP read as deepep: a token once per "
                  "destination rank), its forced load balancing as random routing and its EP overlap "
                  "(--ep-comm-overlap), its experts per-expert (TEGroupedMLP: the op fuser off, mbridge_expert_gemm), "
                  "each 1F1B exchange (PP > 1, no interleaving) followed by a device synchronisation "
                  "(MCORE_1F1B_SYNC), the TP overlap at its recipe's userbuffer config (ub_config_for) or TE's "
                  "defaults (te_default_margin); the settings each record names from its recipe at the card's "
                  "commit (recompute modules, pipeline layout, dispatcher SMs, capacity factor, CUDA graphs, DP "
                  "overlap, optimizer dtypes: docs/validation.md#card-rows-2026-12-06); 128 x 2^20-parameter DP "
                  "buckets where the card's recipe sets a CommOverlapConfig and the gradient-reduce overlap is on "
                  "(BRIDGECARD_COMM_OVERLAP, bridge_bucket_params: the Qwen3-30B-A3B, Qwen3-235B-A22B, Lightning and "
                  "GPT-OSS rows), Megatron-Core's max(40M, 1M x dp) elsewhere (docs/validation.md#bucket-paths); "
                  "predicts tokens/s per GPU; "
                  "scored, not fitted",
    "dgxc": "NVIDIA DGX Cloud Benchmarking's Nemotron-H 56B recipe (NeMo 2.0 pretrain_nemotronh_56b.py): the "
            "nemotron-h-56b built-in, fp8 (delayed or current per-tensor scaling) with fp8 parameter gathers, the "
            "distributed optimizer, bf16 gradient reduction, sequence parallelism and TP communication overlap, "
            "CUDA graphs where the launch script sets them; and its Llama 3.1 8B / 70B / 405B bf16 H100 rows "
            "(v25.04.01, NeMo 2.0 pretrain_llama31.py in performance mode: the distributed optimizer, bf16 gradient "
            "reduction, sequence parallelism and TP overlap with TP, no recompute), "
            "each 1F1B exchange (PP > 1, no interleaving) followed by a device synchronisation (MCORE_1F1B_SYNC), the "
            "TP overlap at its recipe's userbuffer config (ub_config_for) or TE's defaults (te_default_margin); "
            "predicts tokens/s per GPU from "
            "the printed step time; scored, not fitted",
    "deepseek": "DeepSeek-V3's pre-training as its technical report gives it (2,048 H800, PP16 EP64 ZeRO-1, "
                "DualPipe, fp8 with block scaling, sequence 4,096, batch 15,360; RMSNorm, MLA up-projections and "
                "the MoE SwiGLU output recomputed, as --recompute-modules layernorm mla_up_proj moe_act; bf16 Adam moments, "
                "§3.3.3, --optimizer-moment-dtype bf16) and its MoE SwiGLU inputs cached in FP8 (§3.3.3, --swiglu-fp8-input), "
                "its dispatches in FP8, combines in BF16 (§3.3.3, --ep-dispatch-fp8): its own DeepEP-style all-to-all "
                "(--moe-dispatcher deepep: a token once per node over InfiniBand, at most 4 nodes with its "
                "group-limited routing) and the model's router (random routing); micro-batch 1, llmplan's balanced "
                "split of 61 layers over 16 stages and no recompute where the report does not say (it recomputes "
                "RMSNorm, the MLA up-projections and the SwiGLU output only); predicts tokens/s per GPU, the report's 180K GPU hours "
                "per trillion tokens; scored, not fitted (no H800 clock is fitted)",
    "mbridge-dense": "Megatron-Bridge performance tables 25.09-26.08 (dense Llama 3 / 3.1 rows): as the bridge family "
                     "reads its recipes (the distributed optimizer, Megatron-FSDP where FSDP > 0, bf16 gradient "
                     "reduction, fp8 weights for FP8 / FP8-CS / MXFP8, sequence parallelism and TP overlap with TP, "
                     "native fused attention), no recompute where the table does not say, the Megatron-FSDP Llama "
                     "presets' activation offload (MBRIDGE_OFFLOAD_LAYERS, --offload-activations-layers); plain 'FP8' read as current "
                     "scaling (the 25.09 footnote), "
                     "each 1F1B exchange (PP > 1, no interleaving) followed by a device synchronisation "
                     "(MCORE_1F1B_SYNC), the TP overlap at its recipe's userbuffer config (ub_config_for) or TE's "
                     "defaults (te_default_margin); predicts tokens/s per GPU (the tables' TFLOP/s halve causal "
                     "attention); only H100 rows enter the constant fit",
    "mbridge-moe": "Megatron-Bridge performance tables 25.09-26.08 (MoE rows: DeepSeek-V3, Qwen3-30B-A3B, Qwen3-235B-A22B, "
                   "GPT-OSS 120B): as mbridge-dense, with expert TP 1 (the recipes' expert_tensor_parallel_size), the "
                   "tables' forced load balancing as random routing, the dispatcher and EP overlap of the release's "
                   "performance presets (mbridge_moe_recipe: HybridEP read as deepep), GB200 / GB300 jobs in the NVLink "
                   "segments Megatron-Bridge's launcher asks for (64 of a rack's 72 GPUs at 256 GPUs), the presets' "
                   "selective recompute modules (MBRIDGE_RECOMPUTE_MODULES), DeepSeek-V3 with "
                   "its MTP layer except the 25.11 'w/o MTP' rows, in its recipes' pipeline layout (mbridge_layout); "
                   "Kimi-K2 (a built-in spec from 2026-12) in its recipe's layout and GB300 preset (hybridep, no EP overlap or CUDA graphs, mla_up_proj recomputed, the Muon optimizer over an all-reducing DDP, bf16 primary weights); "
                   "Nemotron-3 Nano (a built-in hybrid spec from 2026-12: Mamba-2, attention and MoE blocks) in its "
                   "presets (hybridep, no EP overlap, TE CUDA graphs; on H100 the MoE block, norms, attention core "
                   "and activation recomputed); Nemotron-3 Super (a built-in latent-MoE "
                   "hybrid from 2026-12, its MTP module run twice) in the Super presets per release (hybridep, no EP "
                   "overlap, TE CUDA graphs but on B200 MXFP8, moe_act and layernorm recomputed on B200 MXFP8 and "
                   "B300 NVFP4; TP2 without TP communication overlap); Nemotron-3 Ultra (a "
                   "built-in from 2026-12) in its 26.08 preset (Megatron-FSDP as HSDP: ZeRO-3 within each 64-GPU domain, the optimizer across them, hybridep, "
                   "moe_act recomputed, MTP depth 2, no CUDA graphs, the fused grouped MLP, TP2 without TP "
                   "communication overlap, no gradient accumulation fusion (each micro-batch's gradient copied into the "
                   "reduce-scatter's bucket: grad_accumulation copy); its expert fc1 output offloaded to the CPU, "
                   "mbridge_offload_moe_act) "
                   "and Nemotron-3.5 Lightning (the Nano architecture with its MTP module, depth 2) in its GB200 "
                   "MXFP8 preset (hybridep on 16 SMs, TE CUDA graphs); DeepSeek-V4 Flash (a built-in from "
                   "2026-12: compressed attention, hyper-connections, its MTP layer) in its 26.08 presets (hybridep, "
                   "no EP overlap, full-iteration CUDA graphs, mla_up_proj recomputed, bf16 Adam moments), "
                   "each 1F1B exchange (PP > 1, no interleaving) followed by a device synchronisation "
                   "(MCORE_1F1B_SYNC), the TP overlap at its recipe's userbuffer config (ub_config_for) or TE's "
                   "defaults (te_default_margin); predicts "
                   "tokens/s per GPU",
    "bloom": "BLOOM-176B (BigScience, Megatron-DeepSpeed on Jean Zay's A100 80GB, 8 per node): ZeRO-1, full recompute, "
             "DeepSpeed's pipeline sends one transfer at a time (DEEPSPEED_PIPE: pp_unbatched_sends), "
             "no flash attention (2022: fused softmax), "
             "the LayerNorm backward in two kernels (TWO_PASS_NORM), "
             "no sequence parallelism, ALiBi, tied embeddings, no dropout; "
             "the final run accumulates gradients in fp32 (BF16_Optimizer); the prequel's search (02-17 .. 02-26, "
             "before the BF16_Optimizer) keeps 16-bit gradients (DeepSpeed ZeRO-1, stage_1_and_2: all-reduced in "
             "16 bits, the partition flattened and cast to fp32 at the step), Megatron-DeepSpeed's default dropout "
             "(0.1: tr11-200B-ml.slurm sets none) and --embed-layernorm, and the attention softmax as its "
             "Megatron-DeepSpeed ran it (a fused-kernel check sized by the heads per TP rank until 1cb76a64: the fp32 "
             "torch fallback where b x heads/tp misses the block, softmax_kernel eager-fp32, "
             "bigscience_softmax_kernel); DeepSpeed's "
             "pipeline engine: the DP reduction after the schedule and the weight gather in the optimizer step, "
             "neither overlapped, DeepSpeed's partitioned pipeline sends and synchronous TP (PP_SCATTER_GATHER, "
             "SYNC_TP), the bf16 runs' BF16_Optimizer all-reducing the fp32 gradients (grad_reduce "
             "all-reduce) and casting and adding each micro-batch's gradient (GRAD_ACCUMULATION; fp16 runs: autograd's "
             "add); on the jean-zay-a100 profile (4 x 100 Gb/s Omni-Path per node, BLOOM paper Section "
             "3.4.1), not the dgx-a100 one; predicts iteration time; the logged peak memory (nvidia-smi, read as "
             "GiB) in the memory report against nvidia_smi_bytes (the allocator's segments, with ZeRO-1's copies "
             "after the backward beside the backward's; the CUDA context as BigScience measured it); out-of-memory "
             "attempts must be predicted not to fit (the allocated peak)",
    "megascale": "MegaScale (NSDI'24) Megatron-LM baseline rows on A100 (read as 80 GB): the distributed optimizer, "
                 "sequence parallelism with TP, no flash attention with selective recompute (Korthikanti et al. "
                 "2022; the measured 53% MFU leaves no room for full recompute), interleaving as listed, micro-batch "
                 "1, the DP reduction and gather not overlapped (DP overlap is one of the optimisations MegaScale "
                 "adds, Table 3), every pipeline exchange waited for and the device synchronised (Megatron-LM "
                 "285068c8, §6.1: PP_BLOCKING_SENDS); predicts MFU",
    "megascale-opt": "MegaScale's optimised stack on the same plans (Jiang et al. 2024, §3, Table 3): as megascale "
                     "but with the parallel transformer block (§3.1, ModelSpec.parallel_block: one TP pair per "
                     "layer), the TP / SP collectives overlapped with their GEMMs (§3.2, tp_comm_overlap: "
                     "Transformer Engine's methods and default SMs, its chunking not published), the DP reduction "
                     "and gather overlapped (§3.2), FlashAttention-2 and fused LayerNorm / GeLU (§3.3, "
                     "flash_attention, fused_kernels), no recompute; LAMB (§3.1) only as the rows' batch (its "
                     "step priced as Adam's), the pipeline sends as the interleaved schedule overlaps them; "
                     "not described: sliding-window attention (§3.1: no window given), the data pipeline (§3.4); "
                     "predicts MFU; scored, not fitted",
    "mtnlg": "Megatron-Turing NLG 530B (Megatron-DeepSpeed on Selene's A100 80GB): TP8 PP35, full recompute, no "
             "flash attention, micro-batch 1, fp32 gradient accumulation, learned positions; DeepSpeed's pipeline "
             "engine's DP reduction and gather not overlapped (as bloom), its partitioned pipeline sends, one "
             "transfer at a time (DEEPSPEED_PIPE: pp_unbatched_sends) and "
             "synchronous TP (PP_SCATTER_GATHER, SYNC_TP), the fp32 accumulation as BF16_Optimizer casts and adds each "
             "micro-batch's gradient (GRAD_ACCUMULATION cast-add), "
             "the LayerNorm backward in two kernels (TWO_PASS_NORM); predicts iteration time",
    "trtllm": "TensorRT-LLM offline throughput: fp8 weights and fp8 KV cache, 90% of memory for the server, "
              "8192 tokens per engine step, concurrency = KV capacity capped at trtllm-bench's max_batch_size "
              "(trtllm_bench_limits, at most 4096), each decode step padded to the next CUDA graph size kept "
              "(cost.serve_step.trtllm_graph_sizes: the perf overview's list up to min(max_batch_size, max_num_tokens)); EP as listed; "
              "the MoE rows with TP attention, not DP attention (TRTLLM_ATTENTION_DP: the perf overview's "
              "enable_attention_dp sits inside cuda_graph_config, which rejects it), their experts run on the "
              "TP group's replicated tokens and combined by its all-reduce (EngineRule.tp_moe_all_to_all); "
              "predicts output tokens/s of the TP group (median reported per model)",
}


TWO_BYTE_GRADS = ("nemo2407", "narayanan2021", "megatron2020", "bridge", "bridgecard", "nemocp", "mbridge-dense",
                  "mbridge-moe", "dgxc")
"""Families whose gradients are accumulated and reduced in 2 bytes: NeMo's bf16 gradient buckets (NeMo 24.07's
launcher configs set no grad_sync_dtype; its own H100 fp8 GPT-3 20B example, NVIDIA/NeMo-Framework-Launcher tag 24.07
examples/training/gpt/h100/20b_fp8_8node.sh, runs the table's TP 2 / micro-batch 2 with
+training.model.optim.grad_sync_dtype=bf16, as gpt3/175b_fp8.yaml does), and fp16
Megatron-LM up to 2021 (its --accumulate-allreduce-grads-in-fp32 is opt-in and forced for bf16 only:
NVIDIA/Megatron-LM megatron/arguments.py at 50a4b5fa02, the release of Narayanan et al. 2021)."""


NEMO_APEX_REMAINDERS = ("nemo2407",)
"""Families whose distributed optimizer is NeMo 1.x's Apex DistributedFusedAdam with fp32 states beside bf16 weights,
which keeps the fp32 master as 16-bit remainders (2 B, not 4): NeMo r2.0.0rc1 (579983fbfc)
megatron_base_model.py setup_optimization sets store_param_remainders when optim dtype is fp32, the model bf16
(megatron_amp_O2) and fp8_params off; Apex apex/contrib/optimizers/distributed_fused_adam.py at f3f049246e
allocates param_remainders_shard as torch.int16. The launcher configs of the table's pretraining rows
(NeMo-Framework-Launcher 24.07, conf/training/{gpt3,llama,nemotron}/*.yaml) set no optim.dtype, but Nemotron-4
340B (bf16 states: no master) and the SFT rows (fp8_params: a bf16 master) are read from RECIPE_SETTINGS."""
NEMO_APEX_OPTIMIZER = ("nemo2407",)
"""Families whose distributed optimizer is Apex's DistributedFusedAdam (NeMo 1.x's optim.name
distributed_fused_adam, not mcore_distributed_optim: every 24.07 launcher config of the table's rows,
NVIDIA/NeMo-Framework-Launcher tag 24.07 launcher_scripts/conf/training/{gpt3,llama,nemotron}/*.yaml and
conf/peft/llama/sft.yaml, none setting nccl_ub), which keeps each bucket's reduce-scattered gradient shard to the
next step's zero_grad (ParallelPlan.kept_grad_shards; docs/formulas.md#mem.kept_grad_shards)."""


UB_WITHOUT_WGRAD_BUFFERS = ("nemo2407",)
"""Families whose userbuffers TP overlap ran on a Transformer Engine before 2.7, whose initialize_ub registers
no proj / fc2 wgrad all-gather buffers (ParallelPlan.ub_wgrad_buffers False; docs/formulas.md#mem.userbuffers):
NeMo 24.07 ships Transformer Engine 1.8.0.dev0 and Megatron-Core 0.8 (NeMo Framework user guide, "Software
Component Versions", NeMo Framework 24.07 table); NVIDIA/TransformerEngine v1.8 (3ec998e96c)
transformer_engine/pytorch/module/base.py initialize_ub: layers_all_gather_overlap qkv_fprop, qkv_dgrad,
proj_dgrad, fc1_fprop, fc1_dgrad, fc2_dgrad; layers_reduce_scatter_overlap proj_fprop, fc2_fprop, qkv_wgrad,
fc1_wgrad (the same lists at v1.7 ... v2.6; proj_wgrad and fc2_wgrad from 077e26c31, first in v2.7)."""


PP_SCATTER_GATHER = ("narayanan2021", "korthikanti2022", "bloom", "mtnlg")
"""Families whose pipeline sends are split over the TP ranks without SP and all-gathered on receipt
(ParallelPlan.pp_scatter_gather): Megatron-LM 2021-22 (--no-scatter-gather-tensors-in-pipeline opted out:
NVIDIA/Megatron-LM megatron/arguments.py and p2p_communication.py at 50a4b5fa02, Narayanan et al. 2021 §4.1)
and DeepSpeed's pipeline engine (deepspeed/runtime/pipe/engine.py: is_pipe_partitioned = is_model_parallel
since #392, 2020-09; gradients too, is_grad_partitioned, since #1407, 2021-09)."""


FP32_LOGIT_LOSS = {"narayanan2021": "vocab-parallel", "megatron2020": "vocab-parallel",
                   "korthikanti2022": "vocab-parallel", "megascale": "vocab-parallel-copy", "bloom": "vocab-parallel"}
"""Megatron-LM families whose loss ran unfused on fp32 logits (fused_loss off; ParallelPlan.unfused_loss_impl by
the commit): post_language_model_processing calls vocab_parallel_cross_entropy(output.float(), labels) unless
--fp16-lm-cross-entropy (off by default, set by none of the rows' scripts), and the Function's max, subtraction,
exp, sum and division, and its backward scaling, are each a kernel over the fp32 logits. narayanan2021
(megatron/model/gpt_model.py, mpu/cross_entropy.py at 50a4b5fa02 and 6985e58938) and megatron2020 (gpt2_model.py
at d73def35a3) run the in-place Function (sub_ since 57064fd6f2, 2020-03-10), as does korthikanti2022 (the
paper's runs before 2022-05; e36cdd7936, 2022-07, still sub_); megascale's 285068c810 (2023-01) subtracts into a
new fp32 tensor (megatron/core/tensor_parallel/cross_entropy.py from 55817ec9b9, 2022-09-27, until 9634c0e4a3,
2024-06-13). bloom (docs/validation.md#edges-70): bigscience-workshop/Megatron-DeepSpeed's GPTModelPipe (gpt_model.py
at 9f5f5d4c, 497aa1bf, 541b967f) casts the tied head's logits in a pipeline layer of its own (float16_to_fp32:
`.float()`, the 16-bit logits then freed, ToCopyBackward saving nothing) and its CrossEntropy calls
vocab_parallel_cross_entropy(output.contiguous().float(), labels), no-op casts on that fp32 output, so the Function's
sub_, exp(out=) and div_ write into the very tensor the pipeline engine holds as the stage's output (no copy beside
it): unfused, 2 + 4 at the cast, 4 + 2 backward, vocab-parallel. Not mtnlg: the Megatron-DeepSpeed commit MT-NLG ran
(2021) is not established here (microsoft/Megatron-DeepSpeed 070c64bea is 2023)."""

PP_BLOCKING_SENDS = ("narayanan2021", "korthikanti2022", "megascale")
"""Families whose pipeline exchanges all block (ParallelPlan.pp_blocking_sends): Megatron-LM from the interleaved
schedule's batched sends (78cf869fc2, 2021-02) until overlap_p2p_comm (f9283c5a8a, 2023-05-31; the default from
4eeff55d1f, 2023-10-12) waits on every batch_isend_irecv request and then calls torch.cuda.synchronize()
(NVIDIA/Megatron-LM megatron/p2p_communication.py _communicate at 50a4b5fa02, the release of Narayanan et al. 2021,
and at c3e688d3dd, 2022-11, after Korthikanti et al. 2022's sequence parallelism). MegaScale's baseline ran
Megatron-LM 285068c8 (2023-01-11; Jiang et al. 2024 §6.1: "Megatron-LM (commit hash: 285068c8)", interleaved, 6 / 3
chunks), whose megatron/p2p_communication.py _communicate still waits and synchronises; megatron2020's rows have no
pipeline; DeepSpeed's pipeline engine (bloom, mtnlg) runs 1F1B only, whose sends llmplan already waits for, and
its p2p.send / recv are plain blocking calls with no device synchronisation (deepspeed/runtime/pipe/p2p.py)."""
TWO_PASS_NORM = ("megatron2020", "narayanan2021", "bloom", "mtnlg", "mpt")
"""Families whose LayerNorm backward ran in two kernels, the weight and bias gradients' reading dy and x again
(ParallelPlan.norm_kernel two-pass, docs/formulas.md#compute.norm_bytes): megatron2020, Apex's FusedLayerNorm
(NVIDIA/Megatron-LM megatron/mpu/layers.py at d73def35a3, 2020-09; NVIDIA/apex csrc/layer_norm_cuda_kernel.cu at
4ef930c1, cuComputePartGradGammaBeta); narayanan2021, MixedFusedLayerNorm on Megatron-LM's own copy of that
kernel (megatron/model/fused_layer_norm.py and fused_kernels/layer_norm_cuda_kernel.cu at 50a4b5fa02; Apex's
persistent one-pass FastLayerNormFN came in with a2fdcdf061, 2021-11-10); BLOOM, bigscience-workshop/
Megatron-DeepSpeed's MixedFusedLayerNorm, which never took the persistent path (fused_layer_norm.py at 497aa1bf,
2022-03-11, the final run's start; from 908dc9cb, 2022-05, bf16 keeps that kernel and fp16 takes F.layer_norm,
two passes too); MT-NLG, microsoft/Megatron-DeepSpeed's MixedFusedLayerNorm, non-persistent until its merge of
upstream in 2023-07 (9e72d571); MPT, llm-foundry's LPLayerNorm (norm_type low_precision_layernorm, set by
scripts/train/benchmarking/submit_benchmarks.py at b2a43a147 and 5e85bd62d) on torch.nn.functional.layer_norm,
PyTorch's native kernel (layer_norm_kernel.cu: GammaBetaBackwardCUDAKernel after the input gradient's).
korthikanti2022 and megascale ran Megatron-LM after 2021-11 with hidden sizes in persist_ln_hidden_sizes (6144,
12288, 20480, 25600): one pass, the default."""
INDUCTOR_TWO_PASS_NORM = ("torchtitan",)
"""Families whose compiled RMSNorm backward ran as Inductor's two reductions in separate kernels, so a two-pass norm
(ParallelPlan.norm_kernel two-pass, docs/formulas.md#compute.norm_bytes): torchtitan 9dec370 compiles each
TransformerBlock (parallelize_llama.py apply_compile) around its RMSNorm module (norm_type rmsnorm in the 8B, 70B and
405B presets: models/norms.py RMSNorm, plain PyTorch ops); torch 1963fc8 (2024-12-23) lowers its backward to an inner
reduction over h (dx) and an outer reduction over the tokens (dweight) that Inductor cannot fuse, their loop orders
differing, so the dweight kernel reads dy and x again (pytorch/pytorch#165370, 2025-10, "[inductor] generate fused
rms/layer norm bwd", which added the fused mix-order kernel later). NVIDIA/cudnn-frontend's norm harness
(benchmark/norms/results/*/all_models_*.csv at 3929da2ef4, backend torch_compile) times a compiled rms_norm backward
at 1.5-2.6x cuDNN's one-pass kernel on H200, GB200 and GB300 (tests/test_norm_kernel.py). Eager rows (compile false)
run unfused ops (fused_kernels False), which norm_kernel does not touch."""
MCORE_1F1B_SYNC = ("megatron", "nemo2407", "nemocp", "bridge", "bridgecard", "mbridge-dense", "mbridge-moe", "dgxc")
"""Megatron-Core stacks whose 1F1B exchanges (pp > 1, no interleaving) synchronise the device: Megatron-LM forces
overlap_p2p_comm off without interleaving and sets batch_p2p_comm = not overlap_p2p_comm (NVIDIA/Megatron-LM
megatron/training/arguments.py at core_r0.9.0), NeMo 2 / Megatron-Bridge set batch_p2p_comm True for pp > 1, vp 1
(NVIDIA/NeMo nemo/lightning/pytorch/callbacks/megatron_comm_overlap.py, Megatron-Bridge
src/megatron/bridge/training/comm_overlap.py: _get_model_comm_overlap_cfgs), and ModelParallelConfig's batch_p2p_sync
defaults True (core_r0.9.0 p2p_communication._communicate: torch.cuda.synchronize() after the batched exchange):
read as pp_blocking_sends, which with v = 1 adds only the synchronisation (docs/formulas.md#step.pp_blocking)."""


def runs_jit_activation(rec: dict, fam: str) -> bool:
    """Whether a record's stack runs a gated MLP's activation as Megatron-Core's jit_fuser kernels
    (ParallelPlan.jit_activation): the Megatron-Core families (MCORE_1F1B_SYNC; the megatron family's Megatron-Core
    rows), bias_activation_fusion on as Megatron-LM's --bias-swiglu-fusion default and NeMo's / Megatron-Bridge's
    Llama, Qwen and GPT-OSS configs set it, jit_fuser = torch.compile from NVIDIA/Megatron-LM 473225f9a5
    (2024-01-19) on torch >= 2.2. Not set in record_setup: with it the leave-one-family-out fit moves the H100 clock
    and the megatron family's left-out error rises past 10% (docs/validation.md#swiglu-rate); used by
    benchmarks/moe_shares.py --jit-activation (docs/formulas.md#compute.jit_activation)."""
    return fam in MCORE_1F1B_SYNC and (fam != "megatron" or rec["id"].startswith(("megatron-core-",
                                                                                  "megatron-examples-")))


EAGER_SOFTMAX = ("megatron2020",)
"""Families whose attention softmax ran as PyTorch's eager ops (ParallelPlan.softmax_kernel eager,
docs/formulas.md#compute.score_bytes): Megatron-LM's 2020 release, whose --scaled-upper-triang-masked-softmax-fusion
was an opt-in store_true that neither its README commands nor examples/ set (NVIDIA/Megatron-LM megatron/arguments.py
and megatron/model/fused_softmax.py at d73def35a3). From 2021 the fused causal kernel is the default
(--no-masked-softmax-fusion opts out: 50a4b5fa02), and the Megatron-DeepSpeed forks keep it (the other
unfused-attention families: the default, fused)."""
OPT_IN_FUSIONS = ("megatron2020",)
"""Families whose bias-dropout-add and bias-GeLU ran unfused (ParallelPlan.bias_dropout_fusion and
bias_gelu_fusion False, docs/formulas.md#compute.bias_add, #compute.bias_gelu): Megatron-LM of 2020, whose --bias-dropout-fusion and --bias-gelu-fusion were
opt-in store_true flags (added by 51a2e6b0ff, "Various speed optimizations", 2020-09-11) that neither the README
nor examples/*.sh set, at the table's merge 19301985dd and at d73def35a3 (megatron/arguments.py); without them
ParallelTransformerLayer takes get_bias_dropout_add (dropout(x + bias), then residual + out: eager ops) and
ParallelMLP activation_func(x + bias) (megatron/model/transformer.py). On by default only from 9acc895632
(2021-01-06, "Change some arguments to default to on"), the same reading as EAGER_SOFTMAX. The unfused bias-GeLU's
bias add is priced as its own pass (docs/validation.md#m2020-flags, #tidy-69)."""
SYNC_TP = ("megatron2020", "narayanan2021", "bloom", "mtnlg")
"""Families whose TP collectives are all synchronous (ParallelPlan.tp_backward_overlap off): Megatron-LM before
the asynchronous backward all-reduce of 2021-09-02 (NVIDIA/Megatron-LM 3f65246911: the 2020 tables and
50a4b5fa02, the release of Narayanan et al. 2021) and the Megatron-DeepSpeed forks of BLOOM
(bigscience-workshop/Megatron-DeepSpeed megatron/mpu/layers.py: ColumnParallelLinear's backward all-reduce in
copy_to_tensor_model_parallel_region) and MT-NLG (microsoft/Megatron-DeepSpeed, which merged it in 2023-07)."""


GRAD_ACCUMULATION = {"narayanan2021": {"fp16 mixed precision": "add"},
                     "bloom": {"bf16": "cast-add", "fp16": "add"},
                     "mtnlg": {"mixed precision (fp16/bf16)": "cast-add"}}
"""Families whose micro-batch gradients are accumulated outside the weight-gradient GEMM, by the record's
precision (ParallelPlan.grad_accumulation): Megatron-LM at 50a4b5fa02 (Narayanan et al. 2021) adds each
micro-batch's gradient into main_grad in its DDP hook (fp16 main grads; gradient accumulation fusion arrived
2022-02-16, 83b1e42f30); DeepSpeed's BF16_Optimizer under the pipeline engine casts the bf16 gradient to fp32 and
adds it after every backward (bf16_optimizer.py update_hp_grads, pipe/engine.py, v0.6.x; BLOOM's bf16 runs), and
its fp16 ZeRO-1 leaves autograd to add into the fp16 param.grad (BLOOM's fp16 runs). MT-NLG's bf16 run accumulated
in fp32 (cast-add, the only public DeepSpeed code that accumulates so), but its rows are priced at zero 0 with
reduce-scatter, not as BF16_Optimizer plans (cost.model_states.bf16_optimizer holds for the 21 BLOOM bf16 rows
only): no kept bf16 param.grad, no bf16 reduction copy (docs/validation.md#rdt-mend).
megatron2020 is absent on purpose and takes the default, whose price is no pass at all (0 bytes, no fresh
gradient beside the accumulated one): Megatron-LM of 2020 had no micro-batches and no main_grad; backward_step
calls optimizer.zero_grad(set_grads_to_None=True) before loss.backward(), so autograd's AccumulateGrad takes each
weight-gradient GEMM's output as the fp16 param.grad (no add); the local DDP all-reduces those after the backward
and FP16_Optimizer.update_master_grads copies them to fp32 (megatron/training.py, megatron/fp16/fp16.py at
19301985dd and d73def35a3). Not Megatron-LM's gradient accumulation fusion (83b1e42f30, 2022-02), which 'fused'
names: the same price for a different reason (docs/validation.md#m2020-flags)."""

BLOOM_BF16_OPTIMIZER = "bloom-prequel-rebalancing-layers-"
"""BLOOM's prequel rows of 2022-02-28 (chronicles-prequel.md 'Rebalancing layers': "from now on the testing is
happening with BF16 optimizer that was just written to accumulate gradients in fp32 ... The additional memory
usage is 4bytes x params and it's not sharded across gpus"): read as the final run's stack (fp32 gradients,
cast-add, all-reduce), not as the earlier prequel's fp16-style ZeRO-1 (bloom_pre_bf16_optimizer). The rest of the
prequel reading holds for them: the committed tr11-200B-ml.slurm of that day (bigscience c97ce51) sets no dropout
flags, and the fused-softmax check was fixed only on 03-06 (bigscience_softmax_kernel)."""


def bloom_pre_bf16_optimizer(rec: dict) -> bool:
    """Whether a record is one of BLOOM's prequel runs before the BF16_Optimizer (02-17 .. 02-27): 16-bit gradients
    in param.grad, added by autograd (DeepSpeed ZeRO-1, stage_1_and_2 at 2151c787a)."""
    return rec["id"].startswith("bloom-prequel-") and not rec["id"].startswith(BLOOM_BF16_OPTIMIZER)


STEP_END_DP = ("megascale", "bloom", "mtnlg")
"""Families whose data-parallel gradient reduction and weight gather run after the step's last backward, beside
no compute (overlap_grad_reduce and overlap_param_gather off): MegaScale's Megatron-LM baseline ("DP overlap" is
one of the optimisations MegaScale adds, Jiang et al. 2024, Table 3) and DeepSpeed's pipeline engine, whose
TrainSchedule issues ReduceTiedGrads, ReduceGrads and OptimizerStep after the last step's backward
(deepspeed/runtime/pipe/schedule.py), for Megatron-DeepSpeed's BLOOM and MT-NLG."""


def bigscience_softmax_kernel(rec: dict, fam: str, heads: int, tp: int, mb: int) -> str:
    """How BLOOM's prequel runs (2022-02-17 .. 02-26) ran the attention softmax (ParallelPlan.softmax_kernel):
    Megatron's fused causal kernel only where FusedScaleMaskSoftmax.is_kernel_available passes, else its fp32 torch
    fallback. bigscience-workshop/Megatron-DeepSpeed megatron/model/fused_softmax.py from 9f5f5d4c (2021-10-21)
    until 1cb76a64 (2022-03-06, "sync the whole Meg-LM fused_kernels sub-tree") calls
    self.get_batch_per_block(sq, sk, b, np) on a staticmethod declared get_batch_per_block(b, np, sq, sk), which
    passes (b, np, sq, sk) on to the kernel's get_batch_per_block(query_seq_len, key_seq_len, batches, attn_heads):
    the kernel sizes its block by key_seq_len = np, the heads per TP rank, and the causal path needs
    b·np % batches_per_block == 0 (scaled_masked_softmax.h: warp = min(next_pow2(np), 32), 128 / warp warps of 2
    rows while next_pow2 <= 128), and b·np % 4 == 0 as every fused softmax (cost.elementwise.softmax_rows_fit).
    With 64 heads at TP 8 that is 32 rows a block: micro-batches 1 and 2 (8 and 16 rows) fall back, 4 and 8 fuse. The start-up check BigScience relied on (--abort-on-unmet-fused-kernel-
    constraints, initialize.py) tests only heads / tp x mb % 4 ("(HEADS/TP)*MBS % 4 = 0", chronicles-prequel.md
    'NHEADs comparison'), so the fallback ran silently. The final run (from 2022-03-11, after the fix) sizes the
    block by sk = 2048: 4 rows, and every row of this family fuses there; other families fuse."""
    if fam != "bloom" or not rec["id"].startswith("bloom-prequel-"):
        return "fused"
    np_ = heads // tp
    pow2 = 1 << max(np_ - 1, 0).bit_length()
    warp = min(pow2, 32)
    per_block = (128 // warp) * (2 if pow2 <= 128 else 1)
    return "fused" if softmax_rows_fit(mb, np_) and (mb * np_) % per_block == 0 else "eager-fp32"


BY_MODEL = ("trtllm", "mbridge-moe")
"""Families whose errors the report also gives per model (models of one family differ in what they exercise)."""


def family(record_id: str) -> str:
    """The family of a record id: its prefix, with the mbridge rows split into dense and MoE models and
    MegaScale's optimised-stack rows apart from its Megatron-LM baseline."""
    if record_id.startswith("megatron-"):
        return "megatron"
    if record_id.startswith("mbridge-"):
        return "mbridge-dense" if any(m in record_id for m in MBRIDGE_DENSE_MODELS) else "mbridge-moe"
    if record_id.startswith("megascale-"):
        return "megascale-opt" if "-megascale-" in record_id[10:] or record_id.endswith("-all-opts") else "megascale"
    return record_id.split("-")[0]


MBRIDGE_SKIP = (
    ("-sft-", "fine-tuning table (packed variable-length sequences, masked loss): the packing is not stated"),
    # Megatron-Bridge docs/performance-summary.md at 381d0b825 ("26.06.01 perf summary", #4989; kept in
    # performance-summary-archive.md at 4ab94dfad): the table's [^gpt-oss-note] on both GPT-OSS rows, "Performance
    # regression in GPT-OSS 120B pre-training is a known issue (NVIDIA/cudnn-frontend#256). It will be resolved
    # with the next container release." (26.08 measures the same preset at 26.06's rate again.)
    ("mbridge-26.06.01-pretrain-gpt-oss-",
     "a known software regression, footnoted by its table (Megatron-Bridge 26.06.01 performance summary: "
     "NVIDIA/cudnn-frontend#256, the fused grouped dGLU + dbias kernel ~10x slower): the stack as run, not the "
     "recipe"),
    # NVIDIA-NeMo/Megatron-Bridge issue #1998 (erhoo82, 2026-01-20, labels performance, performance/release, open):
    # "[Regression] Low QWEN3 30B B200 and H100 performance with dropless ... the perf in 25.11 is 2X slower than
    # 25.09. We need to fix this in 26.02." The 26.02 rows sit at the 25.11 rate (H100 5,113 / 5,275, B200 9,691 /
    # 9,299 tokens/s per GPU); v0.3.1 (26.02.01) moved both presets to HybridEP (H100 EP16, f29a269f8 / PR #2477;
    # B200 micro-batch 4) and the rate doubled (9,058 and 26,695). docs/validation.md#qwen3-h100-fp8-rows
    *((f"mbridge-{r}-pretrain-qwen3-30b-a3b-dgx-{g}-",
       "a known software regression (Megatron-Bridge issue #1998: Qwen3-30B-A3B dropless on H100 and B200 at 25.11 "
       "2x slower than 25.09's token-drop runs, not fixed at 26.02): the stack as run, not the recipe")
      for r in ("25.11", "26.02") for g in ("h100", "b200")),
    # NVIDIA-NeMo/Megatron-Bridge issue #1705 ("Fix QWEN3 235B B200 MXFP8 performance regression", labels bug,
    # performance, performance/release; QA RCCA 2026-04-23: "RECIPE/CONFIG ... Fixed by disabling EP A2A overlap in
    # config (PR #1760)"); PR #1760 (dingqingy-nv, 2025-12-17, a6e92de5f, in v0.3.0): "performance regression from
    # 25.09. MXFP8 step time improved from 20.1s to 16.9s ... Disable moe_a2a_overlap due to CPU overhead ...
    # Disable VP for mxfp8". v0.2.0's B200 preset (PP8 VP4 EP8, moe_a2a_overlap) is the 25.11 row: 20.05 s a step.
    # The B300 presets ("b300 initial configs" #1721, 5ccbfdfc0, 2026-01-07) copied it before the fix and v0.3.0
    # (26.02) shipped them; PR #2669 / #2706 (6f5e31aab, v0.3.1) "disabling VP and moe_a2a_overlap"; issue #3399
    # (2026-05-12): "On B300 ... moe_a2a_overlap and VP degraded perf". The 26.02.01 B300 row lists 26.02's VP4 at
    # 26.02's rate (2,644 / 2,691). docs/validation.md#qwen3-235b-b300-2602. The host's issue of the paired
    # schedule, counted from Megatron-Core's source, is a fifth of the pair's GPU time on these rows and does not
    # separate them from the H100 rows priced within 4%: not the mechanism (docs/validation.md#ep-overlap-host)
    *((f"mbridge-{r}-pretrain-qwen3-235b-a22b-dgx-{g}-",
       "a known recipe regression (Megatron-Bridge issue #1705 / PR #1760: Qwen3-235B-A22B's B200 preset with "
       "moe_a2a_overlap and VP, 'CPU overhead', step 20.1 s -> 16.9 s once off; the B300 presets kept it until "
       "PR #2669 / #2706): the stack's host overhead as run, which llmplan does not price")
      for r, g in (("25.11", "b200"), ("26.02", "b300"), ("26.02.01", "b300"))),
)
"""mbridge rows llmplan does not score, by id, with the reason (listed, not dropped silently)
(docs/validation.md#gptoss-2606-regression, #qwen3-h100-fp8-rows, #qwen3-235b-b300-2602)."""
MBRIDGE_OFFLOAD_LAYERS = {
    # (model, GPU, precision) -> cpu_offloading_num_layers of the Megatron-FSDP presets (TP 1-2, PP 1, no
    # recompute): scripts/performance/configs/llama/llama3{,1}_workload_base_configs.py at v0.2.0 (25.11),
    # v0.3.0 / v0.3.1 (26.02, 26.02.01), v0.4.0 / v0.4.2 (26.04, 26.04.01) and v0.5.0, the same numbers at each
    ("llama3-70b", "gb300", "bf16"): 30, ("llama3-70b", "gb300", "fp8"): 20,
    ("llama3-70b", "gb200", "bf16"): 20, ("llama3-70b", "gb200", "fp8"): 40, ("llama3-70b", "b200", "fp8"): 5,
    ("llama3.1-405b", "gb300", "bf16"): 40, ("llama3.1-405b", "gb300", "fp8"): 10,
    ("llama3.1-405b", "gb200", "fp8"): 92,
}
"""Layers whose activations the Megatron-Bridge Llama presets offload to host memory (ParallelPlan.offload_layers).
The 25.09 presets (scripts/performance/configs/llama31/llama31_405b_llm_pretrain.yaml and llama3/
llama3_70b_llm_pretrain.yaml at v0.1.0rc3 / v0.1.0rc4) differ: 405B on GB200 offloads 95 layers, 70B FP8 on
B200 recomputes 5 layers instead (recompute_num_layers 5)."""
MBRIDGE_OFFLOAD_2509 = {("llama3.1-405b", "gb200", "fp8"): 95, ("llama3-70b", "b200", "fp8"): 0}


def mbridge_offload_layers(rec: dict) -> int:
    """cpu_offloading_num_layers of an mbridge row's preset: its Megatron-FSDP Llama rows (0 elsewhere)."""
    rid = rec["id"]
    if family(rid) != "mbridge-dense" or not rec["parallel"].get("fsdp") or "-dgx-" not in rid:
        return 0
    model = "llama3.1-405b" if "llama3.1-405b" in rid else "llama3-70b" if "llama3-70b" in rid else ""
    gpu = rid.split("-dgx-")[1].split("-")[0]
    key = (model, gpu, "fp8" if "fp8" in rid else "bf16" if "bf16" in rid else "")
    if rid.startswith("mbridge-25.09-") and key in MBRIDGE_OFFLOAD_2509:
        return MBRIDGE_OFFLOAD_2509[key]
    return MBRIDGE_OFFLOAD_LAYERS.get(key, 0)


def mbridge_fsdp_grad_accumulation(rec: dict, fam: str) -> str | None:
    """ParallelPlan.grad_accumulation of a Megatron-Bridge Megatron-FSDP Llama row: 'copy' where its preset turns
    gradient accumulation fusion off, so Megatron-FSDP copies each micro-batch's weight gradient into the
    sharded buffer's bucket (megatron_fsdp.py _grad_acc, param.main_grad.copy_(param.grad), at every Megatron-LM
    commit these releases pin, 0d8e0714cd .. 2edffadb5). 25.09: scripts/performance/run_script.py at v0.1.0rc4
    (a28844195 "Cherry pick perf 2509": use_megatron_fsdp with Llama 3 8B / 70B sets it False, 405B keeps the
    True set just before); 25.11 - 26.04.01: every Megatron-FSDP Llama 3 config function sets it False after
    the workload's FSDP overrides ("Disabled to avoid functional errors": scripts/performance/configs/llama3/
    llama3_llm_pretrain.py at v0.2.0, configs/llama/llama3_llm_pretrain.py at v0.3.0 - v0.4.2). None elsewhere."""
    rid = rec["id"]
    if fam not in BRIDGE_FAMILIES or not rec["parallel"].get("fsdp") or "llama3" not in rid:
        return None
    if rid.startswith("mbridge-25.09-") and "llama3.1-405b" in rid:
        return None
    return "copy"


def mbridge_megatron_fsdp(par: dict, fam: str) -> bool:
    """ParallelPlan.megatron_fsdp of a Megatron-Bridge row (`par`: its parallel settings with RECIPE_SETTINGS): its
    FSDP is Megatron-FSDP, so its ZeRO-3 (optim_grads_params) is priced as Megatron-FSDP holds and runs it
    (docs/formulas.md#mem.megatron_fsdp, #step.megatron_fsdp_edges). The Llama 3 presets' fsdp rows run it
    (use_megatron_fsdp: the releases of mbridge_fsdp_grad_accumulation), the Nemotron-3 Ultra 26.08 presets
    through _apply_nemotron_3_ultra_fsdp_hsdp (RECIPE_SETTINGS: use_megatron_fsdp, optim_grads_params). Its
    gradient buckets stay in the weights' bf16 (megatron_fsdp_main_grads_dtype None: the family's TWO_BYTE_GRADS).
    check_plan's rule megatron_fsdp_zero would refuse it under a pipeline: settle turns it off there."""
    return fam in BRIDGE_FAMILIES and bool(par.get("fsdp"))


MBRIDGE_OFFLOADED_ACTIVATIONS: tuple[str, ...] = ()
"""Megatron-Bridge rows whose throughput is scored but not their memory, for an offload llmplan does not price:
none. The Nemotron 3.5 Lightning H100 card's recipe offloads the experts' fc1 input to the CPU
(fine_grained_activation_offloading, offload_modules [expert_fc1]: perf_recipes/nemotronh/h100/nemotronh.py at
cba5742e3), read from its record's parallel.offload_modules since docs/validation.md#fc1-offload (it was listed
here before, docs/validation.md#card-rows-2026-12-06). The Nemotron-3 Ultra presets' offload of the expert MLP's
fc1 output is priced (mbridge_offload_moe_act); their parameters and gradients are sharded within 64-GPU domains
(HSDP: RECIPE_SETTINGS, docs/validation.md#hsdp)."""


def mbridge_offload_moe_act(rec: dict) -> bool:
    """Whether an mbridge row's preset offloads the experts' fc1 output (ParallelPlan.offload_moe_act): the
    Nemotron-3 Ultra 26.08 presets (src/megatron/bridge/perf_recipes/nemotronh/{gb300,gb200}/nemotronh.py at
    067f987d: fine_grained_activation_offloading, offload_modules ["fused_group_mlp"], min_offloaded_tensor_size
    500 M elements on GB300 (TP1: fc1's output 180,224 rows x 5120 = 923 M, its input 369 M) and 350 M on GB200
    (TP2 + SP: 461 M and 185 M), "FC1 output (activation input) is saved and offloaded to cpu")."""
    return family(rec["id"]) == "mbridge-moe" and "nemotron-3-ultra" in rec["id"]


DGXC_SKIP = (
    # NVIDIA/dgxc-benchmarking nemotron-h/README.md at 856bfc4d (v25.08, nemo:25.04.01): "Train Step Timing Analysis
    # (iterations 11-44)", 15.714 s mean, 2.989 s std (19%), TFLOPS_per_GPU 957.90 +- 148.67; the same README at
    # 2fc17d4e (v25.08.01) and 8e77d607 (v25.10) moves the window to 35-44 ("the early training steps typically take
    # much longer time") and prints 11.874 +- 0.027 s for the same per-GPU work (TP8, 24 micro-batches of 1).
    ("dgxc-2508-pretrain-nemotron-h-56b-h100-256gpu-",
     "not a steady-state step time: the mean of iterations 11-44, which its README's next releases exclude as "
     "warm-up (std 2.989 s, 19% of the 15.714 s mean; 0.2% over iterations 35-44 at 128 GPUs)"),
)
"""dgxc rows llmplan does not score, by id, with the reason (docs/validation.md#dgxc-warmup-window)."""


def skip_reason(rec: dict) -> str | None:
    """Why a record of a scored family is not scored (None: it is)."""
    rid, fam = rec["id"], family(rec["id"])
    skips = MBRIDGE_SKIP if fam.startswith("mbridge") else DGXC_SKIP if fam == "dgxc" else ()
    for key, why in skips:
        if key in rid:
            return why
    return None


NARAYANAN_T1 = "narayanan2021-t1-"
"""Narayanan et al. 2021's Table 1 rows, read as the authors' artifact scripts ran them (RECIPE_SETTINGS):
NVIDIA/Megatron-LM examples/sc21/run_table_1.sh at 6985e58938 (2021-08-18; added at de7dc40f88, 2021-08-10; the
README there, from 4098d8847d, says "To replicate these results use Megatron-LM commit: 6985e58938"). Per model
(TP, PP, layers, hidden, heads, nodes and global batch as the table), the script's MBS: 16, 16, 16, 8, 4, 2, 2, 1,
1, 1 from 1.7B to 1T; --num-layers-per-virtual-pipeline-stage 5, 5, 3, 1 on the 76.1B, 145.6B, 310.1B and 529.6B
rows (v = 15/5 = 3, 10/5 = 2, 6/3 = 2, 3/1 = 3 virtual stages a rank) and none on the rest. Where the script and
the paper disagree the paper is read: section 5.1, the paragraph above Table 1, says the runs used "the
interleaved pipeline schedule with the scatter/gather optimization enabled", which the 1T row (PP 64, 2 layers a
stage, 512 micro-batches a pipeline, a multiple of 64) allows and the script leaves out; it runs interleaved at
the one size its stages allow, 1 layer a virtual stage (v = 2). The paper describes the measured runs (arXiv
v1, 2021-04-09, beside the release 50a4b5fa02); the script is a recipe written four months later (de7dc40f88,
2021-08-10), read where the paper says nothing. The 39.1B row (PP 2) runs 1F1B: the interleaved schedule needs PP > 2
(megatron/arguments.py at 50a4b5fa02 and 6985e58938). --DDP-impl torch on the four PP 1 rows (PyTorch DDP: the gradient all-reduce
overlapped with the last micro-batch's backward, the others under no_sync: megatron/schedules.py
forward_backward_no_pipelining at 6985e58938) and local on the rest (megatron/model/distributed.py: without
--use-contiguous-buffers-in-ddp one flattened all-reduce per dtype, called by train_step once the schedule has
returned: overlap_grad_reduce off). Every row --activations-checkpoint-method uniform with the default
--activations-checkpoint-num-layers 1 (every layer's input checkpointed: full recompute), and CONFIG.sh's --fp16
--loss-scale 8192, sequence 2048; the scatter/gather and the masked-softmax, bias-GeLU and bias-dropout fusions at
their defaults (on). Every interleaved row's micro-batches are a multiple of PP, as the schedule needs (28, 48, 144,
280, 512 over 4, 8, 16, 35, 64). Table 2 has no script: its PTD-P rows stay micro-batch 1, 1F1B (section 5.2 names no
schedule). docs/validation.md#sc21-rows, #narayanan-interleaved"""

RECIPE_SETTINGS = {
    # NeMo 24.07 (NVIDIA/NeMo-Framework-Launcher tag 24.07): the Nemotron-4 340B config
    # (launcher_scripts/conf/training/nemotron/nemotron_340b.yaml) runs distributed_fused_adam with optim.dtype
    # bf16 and no fp8_params, so NeMo r2.0.0rc1's MegatronBaseModel.setup_optimization stores no master copy
    # (store_params False: the optimizer dtype equals the bf16 model's) and Apex's DistributedFusedAdam keeps
    # both moments in bf16.
    "nemo2407-pretrain-nemotron-340b-128gpu-gbs32": {"optimizer_master_dtype": "none",
                                                     "optimizer_moment_dtype": "bf16"},
    # The SFT rows are the 24.07 examples/peft/llama/h100/{7b_1node,13b_1node,70b_2node}.sh scripts (same TP /
    # PP / GBS as the table): fp8 with fp8_params (so store_params True, the master in optim.dtype) and
    # peft/llama/sft.yaml's optim.dtype bf16, and the virtual stages the table omits (13B: 10, 70B: 20).
    "nemo2407-sft-llama2-7b-8gpu": {"fp8_all_gather": True, "optimizer_master_dtype": "bf16",
                                    "optimizer_moment_dtype": "bf16"},
    "nemo2407-sft-llama2-13b-8gpu": {"fp8_all_gather": True, "optimizer_master_dtype": "bf16",
                                     "optimizer_moment_dtype": "bf16", "vpp": 10},
    "nemo2407-sft-llama2-70b-16gpu": {"fp8_all_gather": True, "optimizer_master_dtype": "bf16",
                                      "optimizer_moment_dtype": "bf16", "vpp": 20},
    # NeMo 24.07's launcher configs (NVIDIA/NeMo-Framework-Launcher tag 24.07, launcher_scripts/conf/training/
    # {gpt3/20b,llama/llama2_70b,llama/llama3_70b,nemotron/nemotron_8b,nemotron/nemotron_22b}.yaml) set
    # ub_tp_comm_overlap true (the 70B ones with tp_overlap/ub_cfg_h100_h8192_tp4_*: ring-exchange all-gathers,
    # pipelined forward reduce-scatters, bulk backward, Transformer Engine's default methods); GPT-3 175B and
    # Nemotron-4 340B set it false.
    **{f"nemo2407-pretrain-{r}": {"tp_comm_overlap": True}
       for r in ("gpt3-20b-64gpu-gbs256", "llama2-70b-64gpu-gbs128", "llama3-70b-64gpu-gbs128",
                 "nemotron-8b-64gpu-gbs256", "nemotron-22b-64gpu-gbs256")},
    # Megatron-LM's examples/llama FP8 table says its configuration follows NeMo's performance scripts
    # (examples/llama/README.md at bf6e99859f, 2025-06-14); those enable Transformer Engine's TP overlap
    # (userbuffers) for the H100 fp8 70B and 405B runs (NVIDIA/NeMo scripts/performance/llm/
    # pretrain_llama3_70b.py and pretrain_llama31_405b.py at ab020f6a72, 2025-06-12: ub_cfg h100 fp8).
    **{f"megatron-examples-fp8-llama3-{m}": {"tp_comm_overlap": True} for m in ("70b-64gpu", "405b-1024gpu")},
    # NeMo 24.07's GPT-3 175B 512-GPU row links its TFLOP/s to mlcommons.org/benchmarks/training: it is the shape of
    # NVIDIA's MLPerf Training v4.0 GPT-3 submission config (mlcommons/training_results_v4.0 @62f111b769,
    # NVIDIA/benchmarks/gpt3/implementations/nemo/config_DGXH100_64x8x128x4x8_mbs2.sh: 64 nodes, TP4 PP8,
    # MICRO_BATCH_SIZE 2, MINIBS 128 = GBS 2048 over DP 16), which sets TP_COMM_OVERLAP=True with
    # conf/tp_overlap/h100tp4mbs2.yaml. The 128-GPU row follows the launcher's gpt3/175b config (overlap off).
    "nemo2407-pretrain-gpt3-175b-512gpu-gbs2048": {"tp_comm_overlap": True},
    # DeepSeek-V3 report §3.3.3, "Low-Precision Optimizer States": BF16 first and second moments of AdamW,
    # FP32 master weights and gradients; "Low-Precision Activation" (2): the MoE SwiGLU inputs cached in FP8;
    # §3.3.3 "Low-Precision Communication": the dispatches in FP8 (1x128 scales), the combines in BF16.
    "deepseek-v3-report-h800-2048gpu-pretrain": {"optimizer_moment_dtype": "bf16", "swiglu_fp8_input": True,
                                                 "ep_dispatch_fp8": True},
    # Megatron-Bridge 26.08 Nemotron-3 Ultra presets (src/megatron/bridge/perf_recipes/nemotronh/common.py at
    # 067f987d, _apply_nemotron_3_ultra_fsdp_hsdp): Megatron-FSDP, optim_grads_params, sharded within each
    # 64-GPU NVLink domain with the optimizer state sharded across domains: num_distributed_optimizer_instances
    # 256 // 64 = 4, outer_dp_sharding_strategy optim (HFSDP); Megatron-LM 2a75ac12c parallel_state.py splits
    # dp x cp and the expert data-parallel group (4 here: EP64 ETP1) into 4 contiguous partial groups each
    # (docs/validation.md#hsdp).
    # The same function sets gradient_accumulation_fusion = False ("incompatible with BF16 FSDP main grads"):
    # Megatron-FSDP then copies each micro-batch's weight gradient into the unsharded bucket it reduce-scatters
    # (megatron_fsdp.py _grad_acc at 2a75ac12c: param.main_grad.copy_(param.grad); grad_accumulation copy).
    **{f"mbridge-26.08-pretrain-nemotron-3-ultra-dgx-{g}-256gpu-mxfp8-tp{t}pp1cp1ep64vpnagbs256mbs1":
       {"fsdp": True, "dp_replicate": 4, "dp_outer_optimizer": True, "grad_accumulation": "copy"}
       for g, t in (("gb300", 1), ("gb200", 2))},
    # Megatron-Bridge's Qwen3-30B-A3B verification card (perf_recipes/qwen/h100/qwen3_moe.py at 3a9559f01,
    # qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config on the default recipe's flex dispatcher, backend hybridep;
    # perf_recipes/_common.py: moe_hybridep_num_sms = 32 for hybridep), as the record's notes say.
    "bridgecard-h100-bf16-qwen3-30b-a3b-16gpu-gbs1024": {"moe_flex_backend": "hybridep", "moe_dispatch_sms": 32},
    # Megatron-Bridge PR 5094's EP-overlap A/B (the same recipe at bridge_commit 8198fd9cd, the overlap toggled;
    # perf_recipes/_common.py there: moe_hybridep_num_sms = 32 for hybridep; docs/validation.md#ep-overlap-pair)
    **{f"bridgecard-h100-bf16-qwen3-30b-a3b-16gpu-gbs1024-ep-overlap-{arm}-pr5094":
       {"moe_flex_backend": "hybridep", "moe_dispatch_sms": 32} for arm in ("off", "on")},
    # Nemotron-3.5 Lightning's GB200 MXFP8 preset (perf_recipes/nemotronh/gb200/nemotronh.py at 067f987d,
    # _build_nemotron_3_5_lightning_gb200_mxfp8): moe_hybridep_num_sms 16.
    "mbridge-26.08-pretrain-nemotron-3-5-lightning-dgx-gb200-8gpu-mxfp8-tp1pp1cp1ep8vpnagbs512mbs2":
        {"moe_dispatch_sms": 16},
    # Megatron-Bridge 26.08 DeepSeek-V4 Flash presets (perf_recipes/deepseek/gb200/deepseek_v4.py at 4ab94dfad;
    # the GB300 one reuses it): the precision-aware optimizer with exp_avg_dtype / exp_avg_sq_dtype bf16 and fp32
    # main parameters and gradients.
    **{f"mbridge-26.08-pretrain-deepseekv4-flash-dgx-{g}-128gpu-mxfp8-tp1pp1cp1ep64vpnagbs2048mbs1":
       {"optimizer_moment_dtype": "bf16"} for g in ("gb300", "gb200")},
    # Narayanan et al. 2021's Table 1 as the authors' scripts ran it (NARAYANAN_T1)
    **{f"{NARAYANAN_T1}{size}": {"micro_batch": mb, "vpp": vpp, "overlap_grad_reduce": ddp == "torch"}
       for size, (mb, vpp, ddp) in {"1.7b": (16, 1, "torch"), "3.6b": (16, 1, "torch"), "7.5b": (16, 1, "torch"),
                                    "18.4b": (8, 1, "torch"), "39.1b": (4, 1, "local"), "76.1b": (2, 3, "local"),
                                    "145.6b": (2, 2, "local"), "310.1b": (1, 2, "local"),
                                    "529.6b": (1, 3, "local"), "1008b": (1, 2, "local")}.items()},
}
"""Settings of the recipe a row ran that its table or report leaves out, by id, with the source."""


MBRIDGE_ERRATA = {
    # The 25.11 table's H100 GPT-OSS row lists MBS 4 with GA 2, which its own GBS 512 over DP 16 contradicts
    # (512 / (16 x 4) = 8); the release's preset (v0.2.0 scripts/performance/configs/gpt_oss/
    # workload_base_configs.py, GPT_OSS_120B_H100_BF16_BASE_CONFIG) runs micro-batch 1, as the 26.02.01 table's
    # H100 row lists.
    "mbridge-25.11-pretrain-gpt-oss-120b-dgx-h100-64gpu-bf16-tp1pp4cp1ep8vp1gbs512mbs4": {"micro_batch": 1},
    # The 25.11 table's B200 GPT-OSS row lists EP 8; the release's preset (v0.2.0 - v0.2.2 workload_base_configs.py,
    # GPT_OSS_120B_B200_BF16_BASE_CONFIG: expert_model_parallel_size 64, micro-batch 4, global batch 512, the
    # row's batch sizes) runs EP 64, as the 26.02 table's B200 EP64 GBS 512 row (the V1 preset) does; its 8,213
    # tokens/s/GPU sits with that row's 8,047, not with the EP8 rows' 13,000-14,000.
    "mbridge-25.11-pretrain-gpt-oss-120b-dgx-b200-64gpu-bf16-tp1pp1cp1ep8vp1gbs512mbs4": {"ep": 64},
    # The 26.02.01 table's GB300 NVFP4 / MXFP8 Llama 3 70B rows list TP1 PP1 MBS 2 (the FP8 Megatron-FSDP row's
    # layout, with FSDP 0) and PP4 MBS 2 without VP; the release's presets (v0.3.1 llama3_workload_base_configs.py,
    # LLAMA3_70B_PRETRAIN_CONFIG_GB300_{NVFP4,FP8_MX}_V2) and the 26.02 and 26.04 tables run PP4 VP5 MBS 1.
    **{f"mbridge-26.02.01-pretrain-llama3-70b-dgx-gb300-64gpu-{p}-tp1pp{pp}cp1epnavpnagbs256mbs2": {
        "pp": 4, "vpp": 5, "dp": 16, "micro_batch": 1} for p, pp in (("nvfp4", 1), ("mxfp8", 4))},
    # The 26.02.01 table's H100 Qwen3-30B-A3B row repeats 26.02's PP2 VP12 EP8; the release's preset (v0.3.1
    # qwen3_workload_base_configs.py, QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1, changed by "Update Qwen3 30B
    # H100 Base Configs with HybridEP", f29a269f8) runs PP1 EP16 with HybridEP and no EP overlap, as the 26.04
    # table lists it; its 9,058 tokens/s per GPU is the 26.04 EP16 rows' 8,901 - 8,960, not 26.02's 5,113.
    "mbridge-26.02.01-pretrain-qwen3-30b-a3b-dgx-h100-16gpu-fp8-tp1pp2cp1ep8vp12gbs1024mbs1": {
        "pp": 1, "vpp": 1, "ep": 16, "dp": 16},
}
"""mbridge rows whose table layout contradicts itself or its release's preset, read as the preset runs them
(the override, by id, with the evidence); every other row as the table lists it."""


BRIDGE_PRECISION = {"fp16": ("fp16", "tensorwise"), "fp8-cs": ("fp8", "tensorwise"), "mxfp8": ("fp8", "mxfp8"), "nvfp4": ("fp4", "nvfp4"),
                    "bf16": ("bf16", "tensorwise"), "fp8-blockwise": ("fp8", "blockwise"),
                    "fp8-mx": ("fp8", "mxfp8")}
"""Megatron-Bridge's precision names: FP8-CS (per-tensor current scaling), FP8-MX (MXFP8), NVFP4, BF16; and fp16,
the records whose precision is exactly that (BLOOM's fp16 prequel rows: docs/validation.md#bridge-grads), priced
in fp16 rather than the bf16 fallback (the same GEMM peak and 2-byte operands; their gradients are set apart)."""


def system_for(gpu: str) -> str | None:
    g = gpu.lower()
    for name, system in (("gb300", "gb300-nvl72"), ("gb200", "gb200-nvl72"), ("b300", "dgx-b300"),
                         ("b200", "dgx-b200")):
        if name in g:
            return system
    if "a100" in g:
        return "dgx-a100-40gb" if "40" in g else "dgx-a100"
    if "h100" in g:
        return "hgx-h100-96gb" if "96gb" in g.replace(" ", "") else "dgx-h100"
    if "h800" in g:
        return "dgx-h800"
    return None


DEEPSPEED_PIPE = ("bloom", "mtnlg")
"""Families trained with DeepSpeed's pipeline engine (Megatron-DeepSpeed) whose plan prices its DP timing and its
1F1B transfers one at a time (pp_unbatched_sends: microsoft/DeepSpeed deepspeed/runtime/pipe/schedule.py
TrainSchedule.steps, each step a RecvActivation + SendGrad or SendActivation + RecvGrad, and p2p.py send / recv,
blocking dist.send / dist.recv at v0.6.0, a two-rank dist.broadcast with async_op forced False at v0.3.13 ..
v0.5.x; the schedule is the same at v0.3.13, v0.5.0 and v0.6.0, which span MT-NLG's and BLOOM's runs)."""

EAGER_MODULE_LOADING = ("megatron2020", "narayanan2021", "korthikanti2022", "bloom", "mtnlg")
"""Families whose runs predate CUDA 11.7 (May 2022, the first release with lazy module loading; PyTorch made it
the default in 1.13, pytorch/pytorch PR #86509): every kernel image sits in the CUDA context
(ParallelPlan.cuda_lazy_loading False, docs/formulas.md#mem.runtime). BLOOM's prequel tables are from February 2022."""


def record_system(rec: dict) -> str | None:
    """The built-in system a record ran on: Jean Zay's A100 partition where the record names it (BLOOM: 4 x 100
    Gb/s Omni-Path per node, not a DGX A100's 8 x 200 Gb/s InfiniBand; hardware_profiles/systems/
    jean-zay-a100.yaml), else the DGX / HGX system of its GPU (system_for)."""
    hw = rec.get("hardware", {})
    if "jean zay" in str(hw.get("interconnect", "")).lower() and "a100" in str(hw.get("gpu", "")).lower():
        return "jean-zay-a100"
    return system_for(str(hw.get("gpu", "")))


MBRIDGE_NAMED_MODELS = {"Nemotron_3_Nano": "nemotron-3-nano", "Nemotron_3_Super": "nemotron-3-super",
                        "Nemotron_3_Ultra": "nemotron-3-ultra", "Nemotron_3_5_Lightning": "nemotron-3.5-lightning",
                        "DeepSeekV4 Flash": "deepseek-v4-flash"}
"""Megatron-Bridge table model names whose rows record no dimensions -> the built-in spec of that model
(Megatron-Bridge Nemotron3NanoProvider: the nemotron-3-nano built-in's pattern and widths; the Super recipe
nemotron_3_super_pretrain_config reads nvidia/NVIDIA-Nemotron-3-Super-120B-A12B, the nemotron-3-super built-in:
latent MoE and its MTP module; the Ultra recipe reads nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16 and the
Lightning presets are the Nano presets with an MTP module, their built-ins; the DeepSeek-V4 Flash presets build
their model from deepseek-ai/DeepSeek-V4-Flash's config.json through AutoBridge, the deepseek-v4-flash built-in
with its MTP layer: recipes/deepseek/gb200/deepseek_v4.py at 4ab94dfad)."""
MBRIDGE_MTP_DEPTH = {"Nemotron_3_Ultra": 2, "Nemotron_3_5_Lightning": 2, "Nemotron_3_Super": 2}
"""MTP depth the recipes train with where it differs from the checkpoint's num_nextn_predict_layers:
Megatron-Bridge recipes/nemotronh/h100/nemotron_3_ultra.py and perf_recipes/nemotronh (Lightning) set
mtp_num_layers 2 with mtp_use_repeated_layer, one module run twice (ModelSpec.mtp_repeated_layer: its weights
counted once, its compute and activations twice);
so does the Super recipe the Super presets start from (recipes/nemotronh/nemotron_3_super.py
nemotron_3_super_pretrain_config at v0.4.0 - v0.5.0, recipes/nemotronh/h100/nemotron_3_super.py at v0.6.0)."""


MPT_BENCHMARK_ARCH = "learned positions, biases"
"""How MPT's benchmark models were built (docs/validation.md#mpt-benchmark-arch): the yamls the tables ran
(scripts/train/yamls/pretrain/mpt-*.yaml at v0.3.0, which submit_benchmarks.py loads) set only d_model, n_heads,
n_layers, expansion_ratio, max_seq_len, vocab_size and attn_impl, so MPTConfig's defaults hold: alibi False,
learned_pos_emb True, no_bias False (llmfoundry/models/mpt/configuration_mpt.py at v0.3.0). The tables' NumParams
column (Composer's n_params log line) equals L(12h^2 + 13h) + Vh + s_max h + 2h, biases and LayerNorm biases and a
max_seq_len x d_model position table included, on all 216 rows (seq_len 512 .. 65,536), to the parameter
(tests/test_mpt_recipe.py): not ALiBi, not bias-free."""


def described(rec: dict) -> bool:
    """Whether the record says which model ran: its dimensions (model.hidden and layers), or a Megatron-Bridge
    table name mapped to a built-in (MBRIDGE_NAMED_MODELS)."""
    md = rec.get("model", {})
    return ("layers" in md and "hidden" in md) or md.get("name") in MBRIDGE_NAMED_MODELS


def model_for(rec: dict, fam: str) -> ModelSpec:
    """The record's model (spec_for), trained with the load balancing its Megatron-Bridge recipe ran
    (mbridge_no_aux_loss: no auxiliary loss, router_aux_loss_coef 0)."""
    m = spec_for(rec, fam)
    return m.model_copy(update={"router_aux_loss_coef": 0.0}) if mbridge_no_aux_loss(rec, fam) and m.is_moe else m


def mbridge_no_aux_loss(rec: dict, fam: str) -> bool:
    """A Megatron-Bridge row whose model bridge trains without an auxiliary loss: GPT-OSS (gpt_oss_bridge.py:
    moe_router_load_balancing_type "none") and DeepSeek-V4 (deepseek_v4_bridge.py: moe_aux_loss_coeff 0.0).
    Source: NVIDIA-NeMo/Megatron-Bridge@067f987 src/megatron/bridge/models/. docs/validation.md#router-fusion"""
    rid = rec["id"]
    return fam in (*BRIDGE_FAMILIES, "bridgecard") and ("gpt-oss" in rid or "deepseekv4" in rid
                                                          or "deepseek-v4" in rid)


def mbridge_router_fusion(rec: dict, fam: str) -> bool:
    """moe_router_fusion of a Megatron-Bridge MoE row, as its recipe set it (Megatron-Core's default False
    elsewhere): the performance presets of DeepSeek-V3/V4, GPT-OSS-120B, Kimi-K2 and Qwen3 set it True
    (scripts/performance/configs/{deepseek,gpt_oss,kimi,qwen}/*_llm_pretrain.py at v0.2.0 ... v0.5.0;
    perf_recipes/deepseek/common.py, deepseek/gb200/deepseek_v4.py, gpt_oss/{b200,b300,gb200}/gpt_oss.py at
    v0.6.0), and so does the Nemotron-3 Ultra preset the 26.08 rows ran (perf_recipes/nemotronh/common.py
    _apply_nemotron_3_ultra_perf_defaults at 4ab94dfad, the rows' docs commit, and v0.6.0:
    docs/validation.md#hybridep-metadata); the Nano and Super presets leave it off
    (recipes/nemotronh/gb200/nemotron_3_nano.py sets False); of the verification cards only the H100
    Qwen3-30B-A3B recipe sets it (recipes/qwen/h100/qwen3_moe.py qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config at
    16846a8da). Source: NVIDIA-NeMo/Megatron-Bridge at those tags. docs/validation.md#router-fusion"""
    rid = rec["id"]
    if fam == "bridgecard":
        return "h100-bf16-qwen3-30b-a3b-16gpu" in rid
    return fam == "mbridge-moe" and any(x in rid for x in ("deepseekv3", "deepseekv4", "gpt-oss-120b", "kimi-k2",
                                                          "qwen3-30b", "qwen3-235b", "nemotron-3-ultra"))


def spec_for(rec: dict, fam: str) -> ModelSpec:
    """The record's model: a built-in with the same layers, width and heads (Llama, GPT-3 shapes), else a
    plain GPT of the record's dimensions (MPT: learned positions and biases, MPT_BENCHMARK_ARCH)."""
    md = rec["model"]
    if not described(rec):  # a record that gives only the model's name (predict skips it)
        raise ValueError(f"{rec['id']}: the record gives no model dimensions (model.hidden, layers, heads, vocab) "
                         f"and its name {md.get('name')!r} is no built-in the accuracy report maps; predict skips "
                         "it (record the dimensions to score it)")
    named = MBRIDGE_NAMED_MODELS.get(md.get("name", ""))
    if named is not None:  # a row without dimensions (model_dims not recorded): the built-in of its name
        m = builtin_models()[named]
        depth = MBRIDGE_MTP_DEPTH.get(md.get("name", ""), m.num_nextn_predict_layers)
        return m.model_copy(update={"max_position_embeddings": max(m.max_position_embeddings, md.get("seq_len", 0)),
                                    "num_nextn_predict_layers": depth,
                                    "mtp_repeated_layer": md.get("name", "") in MBRIDGE_MTP_DEPTH})
    h = md["hidden"]
    # DeepSeek-V3.2 shares DeepSeek-V3's dimensions: a row is V3 (dense MLA) unless named otherwise.
    for m in sorted(builtin_models().values(), key=lambda x: x.is_sparse_attention):
        if (m.num_hidden_layers, m.hidden_size, m.num_attention_heads, m.vocab_size) == \
                (md["layers"], h, md["heads"], md["vocab"]) and m.model_type != "gpt":
            update = {"max_position_embeddings": max(m.max_position_embeddings, md.get("seq_len", 2048))}
            if "-w-o-mtp-" in rec["id"]:  # Megatron-Bridge 25.11: DeepSeek-V3 "w/o MTP" (no MTP layer)
                update["num_nextn_predict_layers"] = 0
            return m.model_copy(update=update)
    if md.get("moe"):
        raise ValueError(f"{rec['id']}: MoE model {md['name']!r} has no built-in spec")
    if fam == "bloom":
        # BLOOM (BigScience tr11): ALiBi, LayerNorm (and one after the embedding), GELU 4h MLP with biases,
        # tied embeddings; no dropout in pre-training (arXiv:2211.05100, Section 3.5: dropout 0.0). The prequel's
        # topology search (02-17 .. 02-26) ran tr11-200B-ml.slurm (bigscience 8aff319 .. 523069f) with
        # --embed-layernorm and no dropout flags: Megatron-DeepSpeed's defaults, 0.1 and 0.1 (arguments.py)
        drop = 0.1 if rec["id"].startswith("bloom-prequel-") else 0.0
        return ModelSpec(
            name=rec["id"], model_type="gpt", hidden_size=h, intermediate_size=md.get("ffn_hidden") or 4 * h,
            num_hidden_layers=md["layers"], num_attention_heads=md["heads"], vocab_size=md["vocab"],
            max_position_embeddings=max(md.get("seq_len", 2048), 2048), tie_word_embeddings=True,
            gated_mlp=False, norm_type="layernorm", learned_position_embeddings=False, attention_bias=True,
            mlp_bias=True, attention_dropout=drop, hidden_dropout=drop, embedding_norm=True)
    mpt = fam == "mpt"
    nemotron = rec["id"].startswith(NEMO2407_NEMOTRON)  # NeMo 24.07's Nemotron-4: untied output layer
    no_dropout = mpt or (fam == "nemo2407" and "-nemotron-" in rec["id"])
    # Megatron-Core r0.8's scaling runs: an output layer of their own and learned absolute positions
    # (MEGATRON_R08_GPT: the README table's model sizes, and r0.8's --position-embedding-type default)
    r08 = rec["id"].startswith(MEGATRON_R08_GPT)
    learned = r08 or rec["id"].startswith(NEMO2407_GPT3) or fam in (
        "narayanan2021", "korthikanti2022", "mpt", "megatron2020", "megascale", "megascale-opt", "mtnlg")
    # MPT's benchmark models (MPT_BENCHMARK_ARCH): learned positions and biases, as MPTConfig's defaults give them
    return ModelSpec(
        name=rec["id"], model_type="gpt", hidden_size=h, intermediate_size=md.get("ffn_hidden") or 4 * h,
        num_hidden_layers=md["layers"], num_attention_heads=md["heads"], vocab_size=md["vocab"],
        num_key_value_heads=md.get("kv_heads"),
        # llm-foundry's position table holds the run's max_seq_len (submit_benchmarks.py sets it per run)
        max_position_embeddings=md.get("seq_len", 2048) if mpt else max(md.get("seq_len", 2048), 2048),
        tie_word_embeddings=not (r08 or nemotron), gated_mlp=False,
        norm_type="layernorm", learned_position_embeddings=learned,
        attention_bias=not nemotron, mlp_bias=not nemotron,  # NEMO2407_NEMOTRON: bias false
        # MegaScale's optimised stack runs the parallel transformer block (Jiang et al. 2024, §3.1 and Table 3,
        # "PTB": 47.7 -> 52.3 MFU): attention and MLP side by side on one norm's output, one TP pair per layer
        parallel_block=fam == "megascale-opt",
        # llm-foundry: no dropout; NeMo 24.07's Nemotron-4 configs set attention and hidden dropout 0.0 (NVIDIA/
        # NeMo-Framework-Launcher launcher_scripts/conf/training/nemotron/nemotron_{8b,340b}.yaml), its GPT-3 ones 0.1
        attention_dropout=0.0 if no_dropout else 0.1, hidden_dropout=0.0 if no_dropout else 0.1,
    )


MEGATRON_R08_GPT = ("megatron-core-r0.8-",)
"""Record id prefixes of the Megatron-LM README's r0.8 scaling GPTs (NVIDIA/Megatron-LM images/model_table.png at
937571cfd4), read with an untied output layer (--untie-embeddings-and-output-weights) and learned absolute
positions (--position-embedding-type learned_absolute, r0.8's default: megatron/training/arguments.py at
core_r0.8.0; the README names no other). Their parameter counts, 12Lh^2 + 13Lh + 2Vh + sh + 2h, round to the
table's model sizes for 7.1B .. 462B (1.7B counts 1.754B); tied (one Vh) they fall 0.6-7% short, with rotary (no
sh) the 32B, 119B and 462B round to 31, 118 and 461 (tests/test_megatron_r08_params.py). The README's text agrees: its GPT-3 has "slightly more
than 175 billion parameters due to larger vocabulary size" (177B: 12Lh^2 + 2Vh)."""


NEMO2407_NEMOTRON = ("nemo2407-pretrain-nemotron-",)
"""Record id prefixes of NeMo 24.07's Nemotron-4 pretraining rows (8B, 22B, 340B), read with an output layer of their own: every
Nemotron config of NVIDIA/NeMo-Framework-Launcher tag 24.07 (8325688d83,
launcher_scripts/conf/training/nemotron/nemotron_{4b,8b,15b,22b,340b}.yaml) sets
share_embeddings_and_output_weights: false, which NeMo r2.0.0rc1 (579983fbfc,
nemo/collections/nlp/models/language_modeling/megatron_gpt_model.py model_provider_func) passes to the
Megatron-Core GPT. The Nemotron-4 340B report (arXiv:2406.11704, section 2.1) counts 9.4B embedding parameters
(2 x 256,000 x 18,432: input and output) and 331.6B others, 341.0B in all (tests/test_nemo_untied.py). Their GPT-3
configs set no share_embeddings_and_output_weights (NeMo's default True: tied); their Llama configs set it false,
as the Llama built-ins they map to are. The same Nemotron configs set bias: false (no linear-layer biases; the
340B report: "no bias terms"). docs/validation.md#nemo-untied"""


NEMO2407_GPT3 = ("nemo2407-pretrain-gpt3-",)
"""Record id prefixes of NeMo 24.07's GPT-3 pretraining rows (5B, 20B, 175B), read with learned absolute position
embeddings (a max_position_embeddings x hidden table, no rotary passes): their configs (NVIDIA/NeMo-Framework-Launcher
launcher_scripts/conf/training/gpt3/{5b,20b,175b}.yaml at tag 24.07, 8325688d83) set no position_embedding_type,
and NeMo r2.0.0rc1 (NeMo 24.07; 579983fbfc) builds the Megatron-Core GPT with
position_embedding_type=cfg.get('position_embedding_type', 'learned_absolute')
(nemo/collections/nlp/models/language_modeling/megatron_gpt_model.py, model_provider_func). Its Llama and
Nemotron configs set rope. docs/validation.md#fit-stability"""


def torchtitan_split(layers: int, pp: int, vpp: int) -> tuple[int, int]:
    """Layers on the first and last pipeline rank under torchtitan's default split at 9dec370
    (torchtitan/parallelisms/pipelining_utils.py, generate_split_points): pp x vpp stages, the first with
    layers // stages, the middle ones one more while the remainder lasts, the last the rest; a rank holds
    stages r, r + pp, ... (loop style)."""
    stages = pp * vpp
    base, extra = divmod(layers, stages)
    sizes = [base] + [base + 1 if i < extra else base for i in range(stages - 2)]
    sizes.append(layers - sum(sizes))
    per_rank = [sum(sizes[r::pp]) for r in range(pp)]
    return per_rank[0], per_rank[-1]


def source_ref(rec: dict) -> tuple[int, ...]:
    """The release a record's source ref opens with, as integers ('26.04.01 NeMo container, ...' -> (26, 4, 1))."""
    return tuple(int(x) for x in rec["source"]["ref"].split()[0].split("."))


def mbridge_nvfp4_params(rec: dict) -> bool:
    """Whether a Megatron-Bridge row keeps NVFP4 primary weights (fp4_param): its Llama NVFP4 presets from
    v0.4.2 (26.04.01). `bf16_with_nvfp4_mixed` sets fp4_param_gather True from v0.4.2 (MixedPrecisionConfig keeps
    fp4_param in sync with it; v0.3.1 / v0.4.0 left it off), scripts/performance/utils/precision.py
    get_precision_config("nvfp4") returns it, and the Llama 3 70B / 3.1 405B config functions
    (configs/llama/llama3_llm_pretrain.py, llama31_llm_pretrain.py at v0.4.2, v0.5.0) do not turn it off, where
    Nemotron-3 Super, DeepSeek-V3 and GPT-OSS's do. The Megatron-LM they pin (2edffadb5, d0b3b7754) builds the
    layers under get_fp4_context(is_init=True) with fp4_param (arguments.py: kw_args['fp4_param'] =
    args.fp4_param_gather). Source: NVIDIA-NeMo/Megatron-Bridge at v0.4.2, v0.5.0
    (src/megatron/bridge/training/mixed_precision.py)."""
    rid = rec["id"]
    return (family(rid) in ("mbridge-dense",) and "nvfp4" in rid and "-llama3" in rid
            and source_ref(rec) >= (26, 4, 1))


def mbridge_muon(rec: dict) -> bool:
    """Whether a Megatron-Bridge row ran the Muon optimizer: the Kimi-K2 rows (26.02.01 - 26.06, v0.3.1 - v0.5.0),
    whose config functions default to optimizer_type "muon" (scripts/performance/configs/kimi/kimi_llm_pretrain.py;
    argument_parser.py --optimizer_type default "muon", "Defaults to muon") and so to
    distributed_muon_with_cosine_annealing (recipes/utils/optimizer_utils.py: optimizer "dist_muon", 5 Newton-Schulz
    steps, muon_tp_mode blockwise, muon_fp32_matmul_prec medium, scalar optimizer adam). recipes/kimi/kimi_k2.py turns
    the distributed optimizer and the param-gather overlap off for it ("Muon needs this to be False"), so Megatron-Core
    (55ac70825, d7288711b, 2edffadb5, d0b3b7754) runs LayerWiseDistributedOptimizer's ping-pong path: DDP all-reduces
    the whole gradient, each data-parallel rank steps the whole parameters it owns and all-gathers them after the
    step (optimizer/__init__.py _get_megatron_emerging_optimizer; layer_wise_optimizer.py allgather_params).
    Source: NVIDIA-NeMo/Megatron-Bridge v0.3.1, v0.4.0, v0.4.2, v0.5.0. docs/validation.md#muon"""
    return "kimi-k2" in rec["id"] and source_ref(rec) >= (26, 2, 1)


def mbridge_grad_reduce_off(rec: dict) -> bool:
    """Whether a Megatron-Bridge row's preset turned the DP gradient reduce-scatter's overlap off
    (ParallelPlan.overlap_grad_reduce False: the distributed optimizer's reduce-scatter after the last backward,
    beside no compute). The 25.09 DeepSeek-V3 H100 preset: scripts/performance/run_script.py at v0.1.0rc4
    (6725f7049) sets `recipe.comm_overlap.overlap_grad_reduce = False` for h100 (True for gb200 / b200), which
    CommOverlapConfig._override_user_cfgs applies over the computed default and setup() copies into the
    DistributedDataParallelConfig (src/megatron/bridge/training/comm_overlap.py at 6725f7049); the parameter gather
    keeps its overlap. docs/validation.md#dsv3-h100-shares"""
    rid = rec["id"]
    return (family(rid) == "mbridge-moe" and rid.startswith("mbridge-25.09-") and "deepseekv3" in rid
            and "h100" in str(rec["hardware"]["gpu"]).lower())


def mbridge_param_gather_off(rec: dict) -> bool:
    """Whether a Megatron-Bridge row's preset turned the distributed optimizer's parameter all-gather overlap off
    (ParallelPlan.overlap_param_gather False: the updated weights gathered after the step, beside no compute).
    (1) 25.11 (v0.2.0 - v0.2.2) MXFP8: scripts/performance/configs/llama3/llama3_llm_pretrain.py (Llama 3 70B
    GB300 / GB200 / B200), llama31/llama31_llm_pretrain.py (Llama 3.1 405B GB300 / GB200 / B200),
    deepseek/deepseek_llm_pretrain.py (DeepSeek-V3 GB300 / GB200, not B200) and qwen3/qwen3_llm_pretrain.py
    (Qwen3-235B-A22B B200 only) set comm_overlap / ddp / optimizer overlap_param_gather = False under
    `if precision == "fp8_mx"` ("keeping this eanbled causes NaN grad norm"); the 8B, Qwen3-30B-A3B and H100
    functions do not. v0.1.0rc4 (25.09) and v0.3.0 - v0.6.0 (26.02 - 26.08) have no such MXFP8 override (their
    NaN note, utils/overrides.py, keeps only overlap_param_gather_with_optimizer_step off for fp8_mx).
    (2) Llama 3.1 405B GB200 NVFP4 V2 (256 GPUs, gbs 1536) from v0.4.2 (26.04.01): disable_param_gather_overlap
    (configs/llama/llama31_llm_pretrain.py v0.4.2 - v0.5.1, "avoid OOM", issue #3714; commit 8339cbb6d);
    perf_recipes/llama/gb200/llama31.py llama31_405b_pretrain_256gpu_gb200_nvfp4_config at v0.6.0.
    Source: NVIDIA-NeMo/Megatron-Bridge at v0.2.0 (7af9601c9), v0.4.2 (c81012934), v0.6.0. docs/validation.md#mxfp8-gather-preset"""
    rid = rec["id"]
    if family(rid) not in BRIDGE_FAMILIES:
        return False
    if bridge_release(rec) == (25, 11) and ("mxfp8" in rid or "fp8mx" in rid):
        llama = ("llama3-70b" in rid or "llama31-405b" in rid or "llama3.1-405b" in rid)
        return ((llama and any(g in rid for g in ("-gb300-", "-gb200-", "-b200-")))
                or ("deepseekv3" in rid and any(g in rid for g in ("-gb300-", "-gb200-")))
                or ("qwen3-235b" in rid and "-b200-" in rid))
    return (rid.startswith("mbridge-") and "llama3.1-405b" in rid and "-gb200-256gpu-nvfp4" in rid
            and "gbs1536" in rid and source_ref(rec) >= (26, 4, 1))


def mbridge_param_gather_optstep(rec: dict, dp: int, pp: int, vpp: int, recipe: str) -> bool:
    """Whether a Megatron-Bridge row's performance script turned on overlap_param_gather_with_optimizer_step
    (optimizer and comm_overlap): with dp > 1, pp > 1 and vp > 1 (dp = GPUs / (tp pp cp), as the scripts compute
    it) in 25.09 (v0.1.0rc4 scripts/performance/run_script.py lines 191-193) and 25.11 (v0.2.0
    scripts/performance/utils/helpers.py lines 267-270, set_user_overrides); from 26.02 (v0.3.0
    utils/overrides.py lines 430-434; v0.4.0 lines 471-477, v0.4.2 480-486, v0.5.0 526-532, v0.6.0 683-689)
    also only where the compute dtype is not fp8_mx or nvfp4 ("causes NaN grad norm for fp8_mx") and, from
    v0.4.0, the optimizer not dist_muon. Megatron-Core needs the parameter-gather overlap with it
    (ParallelPlan.overlap_param_gather: off on the mbridge_param_gather_off and Muon rows, so not set there).
    Source: NVIDIA-NeMo/Megatron-Bridge at v0.1.0rc4, v0.2.0, v0.3.0, v0.4.0, v0.4.2, v0.5.0, v0.6.0.
    docs/validation.md#param-gather-optstep"""
    if family(rec["id"]) not in BRIDGE_FAMILIES or not (dp > 1 and pp > 1 and vpp > 1):
        return False
    return bridge_release(rec) <= (25, 11) or recipe not in ("mxfp8", "nvfp4")


def mbridge_muon_bf16_params(rec: dict) -> bool:
    """Whether a Megatron-Bridge Kimi-K2 row runs without MXFP8 primary weights: from v0.3.1 (26.02.01) to v0.5.0
    (26.06) its config functions turn fp8_param_gather and reuse_grad_buf_for_mxfp8_param_ag off under the Muon
    optimizer (dist_muon, the default optimizer_type of its recipes from v0.3.1; mbridge_muon): "incompatible with
    Muon's LayerWiseDistributedOptimizer", after get_precision_config("fp8_mx") set them (bf16_with_mxfp8_mixed).
    Source: NVIDIA-NeMo/Megatron-Bridge v0.3.1, v0.4.0, v0.4.2, v0.5.0
    scripts/performance/configs/kimi/kimi_llm_pretrain.py (set_kimi_k2_common_configs). docs/validation.md#muon"""
    return mbridge_muon(rec)


def mbridge_ds_b200_v2(rec: dict) -> bool:
    """Whether an mbridge row is DeepSeek-V3's B200 MXFP8 V2 preset of v0.4.2 (26.04.01) / v0.5.0
    (scripts/performance/configs/deepseek/deepseek_workload_base_configs.py: DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2,
    moe_flex_dispatcher_backend deepep, PP8 VP2 EP32, moe_a2a_overlap True (which utils/overrides.py turns into
    overlap_moe_expert_parallel_comm and delay_wgrad_compute), pp_layout "Et*4|(t*4|)*14tmL", TE CUDA graphs of
    attn / moe_router / moe_preprocess, recompute mla_up_proj and mlp); the table's PP8 VP2 EP32 B200 row is it.
    v0.4.0 (26.04) and earlier ran B200 at PP16 EP8 without the overlap."""
    rid = rec["id"]
    return ("deepseekv3" in rid and "-dgx-b200-" in rid and ("mxfp8" in rid or "fp8mx" in rid)
            and "pp8" in rid and "ep32" in rid and "vp2" in rid)


def mbridge_mx_v2(rec: dict) -> bool:
    """Whether a Megatron-Bridge row runs an MXFP8 V2 preset of v0.5.0 (26.06) or later on Blackwell: fp8 MX in
    its id, not H100, and not DeepSeek-V3's B300 row of 26.06, whose v0.5.0 MXFP8 preset is its BF16 V2 one
    (TE graphs of attn / moe_router / moe_preprocess, no EP overlap: DEEPSEEK_V3_PRETRAIN_CONFIG_B300_FP8_MX_V2);
    v0.6.0's B300 recipe runs the full iteration (perf_recipes/deepseek/b300/deepseek_v3.py,
    _enable_deepseek_full_iteration_mxfp8)."""
    rid, gpu = rec["id"], str(rec["hardware"]["gpu"]).lower()
    release = source_ref(rec)[:2]
    return (("mxfp8" in rid or "fp8mx" in rid) and release >= (26, 6) and "h100" not in gpu
            and not ("deepseekv3" in rid and gpu.startswith("b300") and release == (26, 6)))


MBRIDGE_PAGED_STASH_CUDA_FACTOR = 1.2
"""moe_paged_stash_buffer_size_factor_cuda of Megatron-Bridge's full-iteration MXFP8 presets (v0.5.0 / 26.06:
scripts/performance/configs/{deepseek,gpt_oss,qwen}/*_llm_pretrain.py set_full_iter_cg_configs; v0.6.0 / 26.08
at 4ab94dfad: perf_recipes/{deepseek,gpt_oss,qwen}/common.py and deepseek/{gb200,gb300}/deepseek_v4.py), each
with moe_paged_stash True and moe_expert_rank_capacity_factor 1.5 (ParallelPlan.moe_rank_capacity_factor's
default; only the GPT-OSS 20B presets, no validation row, set 1.2 - 7)."""


def mbridge_paged_stash(rec: dict, par: dict) -> float | None:
    """ParallelPlan.moe_paged_stash of a Megatron-Bridge row: the presets turn the paged stash on with the
    full-iteration CUDA graph of a dropless MoE layer (v0.5.0's set_full_iter_cg_configs: "we pad to a fixed
    capacity ... and use MCore PR #4247 paged stashing to recover memory"; v0.6.0's
    _enable_*_full_iteration_mxfp8), so every mbridge-moe row that mbridge_cuda_graphs gives full-iteration;
    None elsewhere (docs/validation.md#paged-stash)."""
    full = (par.get("cuda_graphs") or mbridge_cuda_graphs(rec)) == "full-iteration"
    dropless = par.get("moe_capacity_factor") is None and "-tokendrop-" not in rec["id"]
    return MBRIDGE_PAGED_STASH_CUDA_FACTOR if family(rec["id"]) == "mbridge-moe" and full and dropless else None


def mbridge_connections(rec: dict, fam: str, tp: int, cp: int, pp: int, dp: int) -> int | None:
    """CUDA_DEVICE_MAX_CONNECTIONS a Megatron-Bridge performance row ran at (ParallelPlan.cuda_max_connections;
    None outside the mbridge families). 25.09 (v0.1.0rc4): the scripts set none and CommOverlapConfig's
    _set_num_cuda_device_max_connections (src/megatron/bridge/training/comm_overlap.py at v0.1.0rc4) sets 32 on
    Blackwell with TP or CP > 1 and DP or PP > 1, 1 on Hopper with TP or CP > 1 without the EP overlap, else leaves
    CUDA's default 8. 25.11 ... 26.06.01 (v0.2.0 ... v0.5.x): PerfEnvPlugin._set_num_cuda_device_max_connections
    (scripts/performance/perf_plugins.py) sets 8, 32 with a deepep / hybridep backend, 32 on b200 / gb200 / gb300
    (and b300 from v0.3.0), 1 on Hopper with TP or CP > 1 without the EP overlap (moe_a2a_overlap resolved from the
    preset: --moe_a2a_overlap defaults to None); 26.08 (v0.6.0): the flat recipes' env_vars, the same rule
    (utils/overrides.py; perf_recipes/deepseek/{gb200,gb300,b200,b300}/deepseek_v3.py 32, h100 1 at TP2 without
    the overlap). No Bridge row with the EP overlap ran at 1 (docs/validation.md#cuda-connections)."""
    if not fam.startswith("mbridge"):
        return None
    flex, overlap = mbridge_moe_recipe(rec)
    par = rec["parallel"]
    flex = flex or par.get("moe_dispatcher") == "deepep"
    overlap = overlap or bool(par.get("ep_comm_overlap", False))
    gpu, ref = str(rec["hardware"]["gpu"]).lower(), source_ref(rec)
    blackwell = gpu.startswith(("b200", "gb200", "gb300")) or (gpu.startswith("b300") and ref >= (26, 2))
    split = tp > 1 or cp > 1
    if ref < (25, 11):
        if blackwell or gpu.startswith("b300"):
            return 32 if split and (dp > 1 or pp > 1) else 8
        return 1 if split and not overlap else 8
    if blackwell:
        return 32
    return 1 if split and not overlap else (32 if flex else 8)


def mbridge_moe_recipe(rec: dict) -> tuple[bool, bool]:
    """(flex dispatcher, EP overlap) of an mbridge MoE row, from the Megatron-Bridge performance presets of its
    release (scripts/performance/configs/{deepseek,qwen,gpt_oss}/*workload_base_configs.py at the tags of the
    containers: v0.2.0 = 25.11 ... v0.4.0 = 26.04, v0.5.0 = 26.06, v0.6.0 = 26.08). The flex dispatcher
    (moe_flex_dispatcher_backend hybridep / deepep, priced as --moe-dispatcher deepep: a token once per
    destination rank) for DeepSeek-V3 and Qwen3-30B-A3B everywhere, Qwen3-235B-A22B on GB200 / GB300 (and B300
    from 26.04.01) and GPT-OSS except on H100; the alltoall dispatcher for the rest. moe_a2a_overlap
    (--ep-comm-overlap) for Qwen3-235B on H100, DeepSeek-V3 on H100 at 25.09 (A2A_1F1B) and GPT-OSS bf16 on GB200,
    and from 26.06 for the MXFP8 rows on
    Blackwell (the releases whose MXFP8 presets add it with full-iteration CUDA graphs). Exceptions read from the
    presets: 25.09's token-drop rows run alltoall; the 25.11 and 26.02 presets on x86 left Qwen3 and DeepSeek-V3
    (25.11) B200 without a flex backend (alltoall), ran Qwen3-30B's H100 rows with moe_a2a_overlap (deepep at
    26.02), Qwen3-235B's B200 rows with it at 25.11 and its B300 rows at 26.02 / 26.02.01 (PR #1760, a6e92de5f,
    and 6f5e31aab changed them). (False, False) for other families."""
    if family(rec["id"]) != "mbridge-moe":
        return False, False
    rid, gpu = rec["id"], str(rec["hardware"]["gpu"]).lower()
    mx_overlap = mbridge_mx_v2(rec)
    gb = gpu.startswith("gb")
    ref = source_ref(rec)
    if "-tokendrop-" in rid:  # 25.09 (v0.1.0rc3 / rc4 run_script.py): apply_moe_token_drop needs the alltoall
        return False, False   # dispatcher ("Using token drop, disabling DeepEP"); no EP overlap for these
    if "deepseekv3" in rid:
        # v0.2.0 (25.11) configs/deepseek/workload_base_configs.py: the B200 preset sets no flex backend, so the
        # DeepSeek provider's alltoall dispatcher runs (models/deepseek/deepseek_provider.py); hybridep from v0.3.0
        # v0.4.2 (26.04.01) and v0.5.0: DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2 runs deepep at PP8 VP2 EP32
        # with moe_a2a_overlap=True (mbridge_ds_b200_v2)
        # v0.1.0rc4 (25.09) run_script.py: A2A_1F1B on H100 (overlap_moe_expert_parallel_comm and
        # delay_wgrad_compute True) beside DeepEP; Megatron-Core 0.14 (the release's megatron-core>=0.14.0a0,<0.15)
        # accepts the flex dispatcher with it (transformer_config.py) and schedules DeepEP's dispatch / combine
        # as their own nodes (models/gpt/fine_grained_callables.py, enable_deepep). docs/validation.md#record-fixes
        h100_2509 = ref[:2] == (25, 9) and "h100" in gpu
        return (not (ref[:2] == (25, 11) and gpu.startswith("b200")),
                mx_overlap or mbridge_ds_b200_v2(rec) or h100_2509)
    if "kimi-k2" in rid:  # kimi_workload_base_configs.py (v0.3.1 ... v0.5.0): GB300 hybridep, moe_a2a_overlap False
        return True, False
    if "deepseekv4" in rid:  # perf_recipes/deepseek/gb200/deepseek_v4.py at 4ab94dfad (26.08; GB300 reuses it):
        return True, False   # flex dispatcher, hybridep backend, overlap_moe_expert_parallel_comm False
    if "nemotron-3-nano" in rid:  # nemotronh/nemotron_3_nano_workload_base_configs.py: hybridep on every GPU, no
        return True, False        # moe_a2a_overlap
    if "nemotron-3-super" in rid:  # nemotronh/nemotron_3_workload_base_configs.py (Super): hybridep / deepep on
        return True, False         # every GPU, no moe_a2a_overlap
    if "nemotron-3-ultra" in rid or "nemotron-3-5-lightning" in rid:  # perf_recipes/nemotronh (Bridge 067f987d):
        return True, False  # flex dispatcher, hybridep backend; no moe_a2a_overlap
    early = (25, 11) <= ref < (26, 2, 1)  # v0.2.0 and v0.3.0, before v0.3.1 gave every Qwen3 preset a backend
    if "qwen3-30b" in rid:
        # v0.2.0 / v0.3.0 (configs/qwen3/workload_base_configs.py, configs/qwen/qwen3_workload_base_configs.py):
        # the B200 presets and v0.2.0's H100 ones set no moe_flex_dispatcher_backend, so the Qwen3 MoE provider's
        # alltoall dispatcher runs (models/qwen/qwen_provider.py moe_token_dispatcher_type "alltoall");
        # the H100 presets set moe_a2a_overlap (and deepep at v0.3.0); v0.3.1 on: hybridep, no H100 overlap
        if early and gpu.startswith("b200"):
            return False, mx_overlap
        if early and "h100" in gpu:
            return ref >= (26, 2), True
        return True, mx_overlap
    if "qwen3-235b" in rid:
        # configs/qwen3/workload_base_configs.py (v0.2.0) and configs/qwen/qwen3_workload_base_configs.py: the
        # B200 presets of v0.2.0 (25.11) and the B300 ones of v0.3.0 (26.02, "b300 initial configs" 5ccbfdfc0,
        # copied from B200 before PR #1760) set moe_a2a_overlap at PP8 VP4 EP8; PR #1760 (a6e92de5f, v0.3.0)
        # turned it off on B200, PR #2669 / #2706 (6f5e31aab, v0.3.1) on B300. The 26.02.01 B300 row lists
        # v0.3.0's VP4 at 26.02's rate (2,644 / 2,691): read as that preset (docs/validation.md#qwen3-235b-b300-2602).
        # B300 runs the flex dispatcher with hybridep from v0.4.2 (26.04.01; PR #3490, 6a5c997e7: the config
        # function sets moe_token_dispatcher_type "flex"); v0.3.1 / v0.4.0 hard-code "alltoall" for it
        b300_overlap = gpu.startswith("b300") and ref in ((26, 2), (26, 2, 1))
        return (gb or (gpu.startswith("b300") and ref >= (26, 4, 1)),
                "h100" in gpu or (mx_overlap and gb) or b300_overlap
                or (gpu.startswith("b200") and ref[:2] == (25, 11)))
    if "gpt-oss" in rid:  # gpt_oss_workload_base_configs.py per tag: no preset sets a flex backend or
        # moe_a2a_overlap before v0.4.0 (the provider's alltoall dispatcher); the BF16 V2 presets then give GB200
        # hybridep + moe_a2a_overlap (v0.4.0) or moe_a2a_overlap alone (v0.4.2, v0.5.0), B300 hybridep, B200
        # hybridep at v0.4.0 only, GB300 neither; the GB MXFP8 V2 presets of v0.5.0 hybridep + overlap.
        # The 26.02.01 table (docs/performance-summary.md at cfeddcd94, 2026-03-21) ran B200 / B300 at EP 8, which
        # no v0.3.1 preset sets (EP 64): it ran the V2 presets of "perf optimizations- GPT-OSS 120B" (PR 2906,
        # 7260d6214, 2026-03-23, the v0.4.0 state: B200 / B300 EP 8 + hybridep, GB200 hybridep + moe_a2a_overlap)
        mx = mbridge_mx_v2(rec)  # only read beside GB200 / GB300
        pr2906 = ref in ((26, 2, 1), (26, 4))
        flex = (mx and gb) or ("b300" in gpu and not gb and (ref >= (26, 4) or pr2906)) \
            or (pr2906 and ("gb200" in gpu or gpu.startswith("b200")))
        return flex, (mx_overlap and gb) or ("gb200" in gpu and (ref >= (26, 4) or pr2906) and not mx)
    return False, False


def mbridge_delay_wgrad(rec: dict) -> bool:
    """Whether an mbridge row's preset runs delay_wgrad_compute (ParallelPlan.delay_wgrad): wherever it runs the EP
    overlap (mbridge_moe_recipe). Every release's performance scripts turn both on together: v0.1.0rc3 / rc4
    (25.09) run_script.py (A2A_1F1B: overlap_moe_expert_parallel_comm and delay_wgrad_compute True, else both
    False), v0.2.0 utils/helpers.py set_moe_a2a_overlap_overrides, v0.3.0 ... v0.6.0 utils/overrides.py
    _set_moe_a2a_overlap_overrides (moe_a2a_overlap: overlap_moe_expert_parallel_comm = True, delay_wgrad_compute =
    True), and v0.6.0's perf_recipes set the two together (deepseek/common.py, gpt_oss/common.py, qwen/common.py
    and the per-GPU qwen3_moe.py builders); only the H100 Qwen3-30B-A3B verification-card recipe
    (perf_recipes/qwen/h100/qwen3_moe.py qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config) sets the overlap with
    delay_wgrad_compute False, and it is a bridgecard row, read from its record.
    Source: NVIDIA-NeMo/Megatron-Bridge at v0.1.0rc4, v0.2.0, v0.3.0, v0.3.1, v0.4.0, v0.4.2, v0.5.0, v0.6.0.
    docs/validation.md#delay-wgrad"""
    return mbridge_moe_recipe(rec)[1]


def mbridge_flex_backend(rec: dict) -> str:
    """moe_flex_dispatcher_backend of an mbridge row whose preset runs the flex dispatcher (mbridge_moe_recipe):
    hybridep, as the performance presets set it (scripts/performance/configs/*/..._workload_base_configs.py,
    perf_recipes/*/common.py), except DeepSeek-V3's B200 MXFP8 V2 preset (mbridge_ds_b200_v2: deepep, v0.4.2 /
    v0.5.0; perf_recipes/deepseek/b200/deepseek_v3.py at v0.6.0), Qwen3-30B-A3B's H100 presets of v0.3.0
    (26.02: deepep, before v0.3.1's f29a269f8 "Update Qwen3 30B H100 Base Configs with HybridEP") and
    DeepSeek-V3's 25.09 H100 preset (deepep: run_script.py at v0.1.0rc4, 6725f7049, enable_deepep for h100, which
    deepseek_v3_pretrain_config turns into moe_token_dispatcher_type "flex" + moe_enable_deepep True; the same at
    v0.1.0rc3 and on r0.1.0, 684a68616; Megatron-Bridge issue #1731: the H100 baseline ran DeepEP, OOM with
    HybridEP); deepep (llmplan's default) where the row runs no flex dispatcher.
    Source: NVIDIA-NeMo/Megatron-Bridge scripts/performance/run_script.py @ 6725f7049 (v0.1.0rc4)"""
    if not mbridge_moe_recipe(rec)[0] or mbridge_ds_b200_v2(rec):
        return "deepep"
    if rec["id"].startswith("mbridge-25.09-") and "deepseekv3" in rec["id"]:
        return "deepep"  # 25.09's only flex rows are DeepSeek-V3 on H100 (the token-drop rows run alltoall)
    if "qwen3-30b" in rec["id"] and "h100" in str(rec["hardware"]["gpu"]).lower() and source_ref(rec) == (26, 2):
        return "deepep"
    return "hybridep"


MBRIDGE_RECOMPUTE_MODULES = {
    # (model, release, GPU) -> recompute_modules; release (25, 11) = v0.2.0, (26, 2) = v0.3.0, (26, 4) = v0.4.0,
    # (26, 4, 1) = v0.4.2, (26, 6) = v0.5.0. GPT-OSS 120B: GB200 / B200 / H100 presets (BF16 and their FP8
    # aliases) from v0.3.0; GB300 / B300 set none; at v0.5.0 the MXFP8 V2 presets set [].
    **{("gpt-oss", r, g): ("layernorm", "moe_act") for r in ((26, 2), (26, 4), (26, 4, 1))
       for g in ("gb200", "b200", "h100")},
    # DeepSeek-V3, MXFP8 / BF16 presets of each release.
    # 25.09 H100 (v0.1.0rc4 run_script.py: recompute_modules ["mla_up_proj", "mlp"]; Megatron-Core 0.14's
    # transformer_layer.py applies "mlp" to the dense layers only, as module_recompute_flops prices it)
    ("deepseekv3", (25, 9), "h100"): ("mla_up_proj", "mlp"),
    # 25.09 B200 / GB200 (the token-drop rows; same run_script.py: recompute_modules ["mla_up_proj"] on b200 and on
    # gb200 with use_tokendrop, the default there; recompute_granularity "selective" from
    # configs/deepseek/deepseek_v3_llm_pretrain.yaml and the recipe's default)
    **{("deepseekv3", (25, 9), g): ("mla_up_proj",) for g in ("b200", "gb200")},
    **{("deepseekv3", (25, 11), g): m for g, m in (("gb300", ("moe_act",)), ("gb200", ("mla_up_proj",)),
                                                   ("b200", ("mla_up_proj",)))},
    **{("deepseekv3", (26, 2), g): ("mla_up_proj",) for g in ("gb300", "gb200", "b300", "b200")},
    **{("deepseekv3", r, g): ("mla_up_proj",) for r in ((26, 4), (26, 4, 1)) for g in ("gb300", "b300", "b200")},
    **{("deepseekv3", r, "gb200"): ("mlp",) for r in ((26, 4), (26, 4, 1))},
    ("deepseekv3", (26, 4, 1), "b200"): ("mla_up_proj", "mlp"),
    **{("deepseekv3", (26, 6), g): m for g, m in (("gb200", ("mla_up_proj",)), ("b300", ("mla_up_proj",)),
                                                  ("b200", ("mla_up_proj", "mlp")))},
    # 26.08 GB200 MXFP8 (v0.6.0 perf_recipes/deepseek/gb200/deepseek_v3.py deepseek_v3_pretrain_256gpu_gb200_fp8mx_config:
    # recompute_modules ["mla_up_proj"], kept by _enable_deepseek_full_iteration_mxfp8; granularity "selective" in
    # perf_recipes/deepseek/common.py _deepseek_v3_common); its GB300 MXFP8 recipe sets [] (left out)
    ("deepseekv3", (26, 8), "gb200"): ("mla_up_proj",),
    # Nemotron-3 Super, MXFP8 / NVFP4 presets (scripts/performance/configs/nemotronh/nemotron_3_workload_base_configs.py
    # at v0.4.0, v0.4.2, v0.5.0; perf_recipes/nemotronh/{b200,b300}/nemotronh.py at v0.6.0, the same): B200 MXFP8
    # and B300 NVFP4 recompute moe_act and layernorm; GB300, GB200 (TP2), B300 MXFP8 and B200 NVFP4 (TP2) none
    **{("nemotron-3-super-mxfp8", r, "b200"): ("moe_act", "layernorm") for r in ((26, 4), (26, 4, 1), (26, 6), (26, 8))},
    **{("nemotron-3-super-nvfp4", r, "b300"): ("moe_act", "layernorm") for r in ((26, 4), (26, 4, 1), (26, 6), (26, 8))},
    # Nemotron-3 Nano on H100, FP8 current scaling (nemotron_3_nano_workload_base_configs.py at v0.3.1,
    # nemotron_3_workload_base_configs.py at v0.4.0 - v0.5.0, NEMOTRON_3_NANO_PRETRAIN_CONFIG_H100_FP8_CS_V1;
    # perf_recipes/nemotronh/h100/nemotronh.py at v0.6.0): the whole MoE block, norms, attention core, activation
    **{("nemotron-3-nano", r, "h100"): ("moe", "layernorm", "core_attn", "moe_act")
       for r in ((26, 2), (26, 4), (26, 4, 1), (26, 6), (26, 8))},
    # Nemotron-3 Ultra, 26.08 (src/megatron/bridge/perf_recipes/nemotronh/{gb200,gb300}/nemotronh.py at
    # 067f987d: recompute_modules ["moe_act"], the fc1 output offloaded to the CPU)
    **{("nemotron-3-ultra", (26, 8), g): ("moe_act",) for g in ("gb200", "gb300")},
    # Kimi-K2 on GB300 (scripts/performance/configs/kimi/kimi_workload_base_configs.py, v0.3.1 ... v0.5.0)
    **{("kimi-k2", r, "gb300"): ("mla_up_proj",) for r in ((26, 2), (26, 4), (26, 4, 1), (26, 6))},
    # DeepSeek-V4 Flash, 26.08 (perf_recipes/deepseek/gb200/deepseek_v4.py at 4ab94dfad, which the GB300 preset
    # reuses: recompute_granularity selective, recompute_modules ["mla_up_proj"], the query up-projection)
    **{("deepseekv4", (26, 8), g): ("mla_up_proj",) for g in ("gb200", "gb300")},
}
"""Megatron's selective recompute modules of the Megatron-Bridge performance presets
(scripts/performance/configs/{gpt_oss,deepseek}/*workload_base_configs.py, recompute_modules=, at the tag of
each release's container; the presets' layouts match the table rows). Left out, so no module is recomputed:
GPT-OSS at 25.11 (v0.2.0's set_recompute_overrides sets the modules but not recompute_granularity, which the
GPT-OSS recipe leaves None, so Megatron-Core applies none), DeepSeek-V3 on GB300 at 26.06 and 26.08 (its MXFP8
presets set []), 25.09's Qwen3 token-drop rows (run_script.py at v0.1.0rc4 sets no modules for Qwen3), 26.08 but
DeepSeek-V3 / V4 (v0.6.0 moved the presets to src/megatron/bridge/perf_recipes; the others not read) and Qwen3 (no
preset sets any: qwen3_llm_pretrain.py sets recompute_granularity None)."""


def bridge_bf16_layers(rec: dict, fam: str, dtype: str) -> tuple[int | None, int | None]:
    """(start, end) layers a Megatron-Bridge performance preset keeps in bf16 under its fp8 / fp4 recipe
    (ParallelPlan.bf16_layers_start / _end; (None, None), the recipe's default, for other rows). The performance
    scripts turn the current-scaling preset's 1 / 1 off (scripts/performance/utils/helpers.py, 'Disable BF16
    Transformer layers in the performance config', from 3135dc04 before v0.1.0rc4; utils/precision.py and
    perf_recipes/_common.py _perf_precision at 067f987d); bf16_with_mxfp8_mixed, the subchannel and
    bf16_with_nvfp4_mixed presets keep none (training/mixed_precision.py at 067f987d). Nemotron-3 Super's NVFP4
    presets keep the last 14 (nemotron_3_super_bf16_with_nvfp4_mixed: num_layers_at_end_in_bf16 = 14, start 0,
    from 53d40d1b, v0.4.0; perf_recipes/nemotronh/common.py _nemotron_3_super_nvfp4_precision), GPT-OSS 20B's
    the last 4 (perf_recipes/gpt_oss/common.py _gpt_oss_20b_nvfp4_precision)."""
    if fam not in BRIDGE_FAMILIES or dtype not in ("fp8", "fp4"):
        return None, None
    rid = rec["id"]
    if dtype == "fp4" and "nemotron-3-super" in rid:
        return 0, 14
    if dtype == "fp4" and "gpt-oss-20b" in rid:
        return 0, 4
    return 0, 0


UB_CONFIGS = {
    # Transformer Engine userbuffer configs the H100 rows' recipes pass (each GEMM's num_sm; a ring exchange on
    # copy engines holds 1): Megatron-Bridge src/megatron/bridge/training/comm_overlap.py (v0.2.0 .. 067f987d,
    # the same values) = NeMo nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py (ab020f6a72);
    # NeMo-Framework-Launcher 24.07 launcher_scripts/conf/training/tp_overlap/ub_cfg_h100_*.yaml.
    "userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192": {
        "qkv_dgrad": 4, "fc1_dgrad": 2, "qkv_wgrad": 24, "fc1_wgrad": 4, "proj_fprop": 1, "fc2_fprop": 1},
    "userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192": {
        "qkv_dgrad": 4, "fc1_dgrad": 2, "qkv_wgrad": 24, "fc1_wgrad": 4, "proj_fprop": 24, "fc2_fprop": 16},
    "userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192": {
        "qkv_dgrad": 2, "fc1_dgrad": 2, "qkv_wgrad": 24, "fc1_wgrad": 2, "proj_fprop": 1, "fc2_fprop": 1},
    "userbuffers_bf16_h100_h16384_tp8_cp2_mbs1_seqlen8192": {
        "qkv_dgrad": 2, "fc1_dgrad": 2, "qkv_wgrad": 24, "fc1_wgrad": 2, "proj_fprop": 24, "fc2_fprop": 8},
    "userbuffers_fp8_b200_h8192_tp2_mbs1_seqlen8192": {
        "qkv_dgrad": 4, "fc1_dgrad": 2, "qkv_wgrad": 24, "fc1_wgrad": 4, "proj_fprop": 1, "fc2_fprop": 1},
    "userbuffers_bf16_b200_h8192_tp2_mbs1_seqlen8192": {
        "qkv_dgrad": 16, "fc1_dgrad": 2, "qkv_wgrad": 24, "fc1_wgrad": 4, "proj_fprop": 32, "fc2_fprop": 16},
    "userbuffers_fp8_b200_h16384_tp4_cp2_mbs1_seqlen8192": {
        "qkv_dgrad": 8, "fc1_dgrad": 2, "qkv_wgrad": 32, "fc1_wgrad": 8, "proj_fprop": 1, "fc2_fprop": 1},
    "userbuffers_bf16_b200_h16384_tp4_cp2_mbs1_seqlen8192": {
        "qkv_dgrad": 8, "fc1_dgrad": 2, "qkv_wgrad": 24, "fc1_wgrad": 2, "proj_fprop": 32, "fc2_fprop": 8},
    "ub_cfg_h100_h6144_tp2_mbs2_seqlen2048": {
        "qkv_dgrad": 8, "fc1_dgrad": 4, "qkv_wgrad": 16, "fc1_wgrad": 16, "proj_fprop": 16, "fc2_fprop": 24},
    "ub_cfg_h100_h8192_tp4_mbs1_seqlen4096": {
        "qkv_dgrad": 8, "fc1_dgrad": 2, "qkv_wgrad": 16, "fc1_wgrad": 4, "proj_fprop": 24, "fc2_fprop": 16},
    # MLPerf Training v4.0, NVIDIA GPT-3 (mlcommons/training_results_v4.0 @62f111b769, NVIDIA/benchmarks/gpt3/
    # implementations/nemo/conf/tp_overlap/h100tp4mbs2.yaml: bulk 4 SMs each, proj_fprop pipeline 24, fc2_fprop
    # ring_exchange 1 by default)
    "mlperf_v40_h100tp4mbs2": {
        "qkv_dgrad": 4, "fc1_dgrad": 4, "qkv_wgrad": 4, "fc1_wgrad": 4, "proj_fprop": 24, "fc2_fprop": 1},
}
"""Per-GEMM SMs of the userbuffer configs the H100 and Blackwell recipes name; their four ring-exchange all-gathers
(qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad) take RingExchangeOverlapCfg's num_sm 1 in every one."""
# The launcher's Llama 3 70B config sets the same SMs as NeMo 2's bf16 H100 70B one: one table, two names
UB_CONFIGS["ub_cfg_h100_h8192_tp4_mbs1_seqlen8192"] = UB_CONFIGS["userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192"]


def ub_config_sms(name: str) -> tuple[float, float, float, float]:
    """A userbuffer config's SMs per role, as ParallelPlan.tp_overlap_sms takes them: each role's two GEMMs'
    mean (ring all-gathers, forward reduce-scatters, backward re-gathers, backward reduce-scatters)."""
    c = UB_CONFIGS[name]
    return (1.0, (c["proj_fprop"] + c["fc2_fprop"]) / 2, (c["qkv_dgrad"] + c["fc1_dgrad"]) / 2,
            (c["qkv_wgrad"] + c["fc1_wgrad"]) / 2)


def ub_config_margin(name: str) -> tuple[float, float, float, float]:
    """The SMs set_sm_margin takes per role under a UB_CONFIGS config (ParallelPlan.tp_overlap_margin_sms): every
    one sets it on proj_fprop and fc2_fprop only (the bf16 ones' PipelineOverlapCfg(set_sm_margin=True), the fp8
    ones' RingExchangeOverlapCfg(num_sm=1, set_sm_margin=True); BulkOverlapCfg set_sm_margin=False, the ring
    all-gathers RingExchangeOverlapCfg's default False), in the files UB_CONFIGS cites (Megatron-Bridge passes
    the config whole by asdict; the launcher's yaml sets set_sm_margin: 1 on the pipeline, 0 on the bulk, unset
    (TE 1.8: 0) on the ring exchanges). docs/formulas.md#step.ub_margin"""
    return (0.0, ub_config_sms(name)[1], 0.0, 0.0)


def te_default_margin(rec: dict) -> tuple[float, float, float, float]:
    """tp_overlap_margin_sms for a row whose recipe passes no userbuffer config: Transformer Engine 2.0's and
    later defaults (cost.comm.te_default_margin_sms: set_sm_margin on for pipeline and bulk) where the row's container (record_container)
    is of 2025-03 or later, the release after TE v2.0 (tagged 2025-02-12; DGX Cloud's Nemotron-H 56B runs NeMo
    25.04 / 25.07, whose NeMo v2.3.0 / v2.4.0 requirements/manifest.json pin TE bee4649c (2025-03-18) / TE v2.5,
    both with the v2.0 default; the 25.09+ Megatron-Bridge containers ship TE 2.x, docs/releases/
    software-versions.md); else (0, 0, 0, 0), TE 1.x's default False: NeMo 24.07 ships
    TE 1.8.0.dev0 (NeMo Framework user guide 24.09, Software Component Versions) and the Megatron-Core r0.8 rows
    of 2024 predate TE 2.0 (base.py initialize_ub v1.8: ub_cfg.get("set_sm_margin", 0); v1.9 - v1.13: False)."""
    container = record_container(rec)
    if container and container.split(":")[1] >= "25.03":
        return te_default_margin_sms()
    return (0.0, 0.0, 0.0, 0.0)


def ub_config_for(rec: dict, fam: str, dtype: str, tp: int) -> str | None:
    """The userbuffer config a row's recipe passes to Transformer Engine, None where it passes none (TE's
    defaults: Megatron-LM r0.8's README runs, NeMo 24.07's Nemotron 8B / 22B, the Nemotron-H 56B recipe
    nemotronh_56b.py, tp_comm_overlap=True without a config) or where the row runs no TP overlap.
    Megatron-Bridge's Llama presets pick by GPU and model, whatever the row's TP, the fp8 config for every
    precision but bf16 (scripts/performance/configs/llama3{,1}/*_llm_pretrain.py v0.2.0, configs/llama/ v0.3.0 -
    v0.4.0, perf_recipes/llama/{h100,b200,b300,gb200,gb300}/llama3{,1}.py at 067f987d): H100 userbuffers_*_h100_
    h8192_tp4 (70B) / _h16384_tp8_cp2 (405B), Blackwell userbuffers_*_b200_h8192_tp2 / _h16384_tp4_cp2; NeMo's
    performance scripts (scripts/performance/llm/pretrain_llama3_70b.py / pretrain_llama31_405b.py, which the
    Megatron-LM examples table and DGX Cloud's Llama 3.1 recipes run) the same H100 ones; NeMo-Framework-Launcher
    24.07's GPT-3 20B / Llama 2 70B / Llama 3 70B configs name their ub_cfg."""
    rid, gpu = rec["id"], str(rec.get("hardware", {}).get("gpu", "")).lower()
    if tp == 1:
        return None
    if fam == "nemo2407":
        named = (("gpt3-20b", "ub_cfg_h100_h6144_tp2_mbs2_seqlen2048"),
                 ("llama2-70b", "ub_cfg_h100_h8192_tp4_mbs1_seqlen4096"),
                 ("llama3-70b", "ub_cfg_h100_h8192_tp4_mbs1_seqlen8192"),
                 ("gpt3-175b-512gpu", "mlperf_v40_h100tp4mbs2"))
        return next((cfg for key, cfg in named if rid.startswith(f"nemo2407-pretrain-{key}-")), None)
    stack = fam in ("bridge", "mbridge-dense") or fam == "dgxc" or rid.startswith("megatron-examples-")
    if not stack or "llama" not in rid:
        return None
    chip = "h100" if "h100" in gpu else "b200" if any(b in gpu for b in ("b200", "b300")) else None
    big = "405b" in rid
    size = {"h100": "h16384_tp8_cp2" if big else "h8192_tp4", "b200": "h16384_tp4_cp2" if big else "h8192_tp2"}
    if chip is None or not (big or "70b" in rid):
        return None
    return f"userbuffers_{'bf16' if dtype == 'bf16' else 'fp8'}_{chip}_{size[chip]}_mbs1_seqlen8192"


def mbridge_without_tp_overlap(rec: dict) -> bool:
    """Whether an mbridge row's recipe leaves Transformer Engine's TP communication overlap off at TP > 1: the
    Nemotron-3 Super and Ultra rows (their TP2 GB200 / B200 presets). Their recipes set no comm_overlap
    (Megatron-Bridge recipes/nemotronh/nemotron_3_super.py nemotron_3_super_pretrain_config at v0.4.0, v0.4.2 and
    v0.5.0; recipes/nemotronh/h100/nemotron_3_{super,ultra}.py pretrain configs at v0.6.0 / 067f987d), recipes/
    common.py _pretrain_common gives comm_overlap=None, the v0.4.0 - v0.5.0 performance scripts build a
    CommOverlapConfig only for moe_a2a_overlap (utils/overrides.py _set_moe_a2a_overlap_overrides; False for
    Super) and the v0.6.0 perf_recipes/nemotronh/{gb200,b200}/nemotronh.py Super / Ultra builders set none (the
    Nano ones set comm_overlap.tp_comm_overlap = True): Megatron-Core's TransformerConfig.tp_comm_overlap stays
    at its default, False. The SP collectives then run as cost.exposure.tp_exposed's default path."""
    return family(rec["id"]) == "mbridge-moe" and ("nemotron-3-super" in rec["id"] or "nemotron-3-ultra" in rec["id"])


def mbridge_op_fuser(rec: dict) -> bool:
    """Whether an mbridge GPT-OSS row's preset runs the experts through Megatron-Core's Transformer Engine op
    fuser (use_transformer_engine_op_fuser: fc1, the clamped GLU (ScaledClampedQGeGLU) and fc2 with its bias as
    TE ops): the GB200 / GB300 MXFP8 presets from 26.06 (v0.5.0 gpt_oss_workload_base_configs.py,
    GPT_OSS_120B_PRETRAIN_CONFIG_GB{200,300}_FP8_MX_V2 cutedsl_fused_grouped_mlp, which utils/overrides.py turns
    into the op fuser; v0.6.0 perf_recipes _apply_gpt_oss_120b_full_iter_fp8mx_configs); Megatron-Core at
    v0.5.0's pin (d0b3b775) builds the fused ops from TE 2.14 (TE 2.16 pinned). Not the B300 / B200 presets."""
    if family(rec["id"]) != "mbridge-moe" or "gpt-oss" not in rec["id"]:
        return False
    return mbridge_mx_v2(rec) and str(rec["hardware"]["gpu"]).lower().startswith("gb")


def mbridge_recompute_modules(rec: dict) -> tuple[str, ...]:
    """The recompute_modules of an mbridge MoE row's preset (MBRIDGE_RECOMPUTE_MODULES; () elsewhere)."""
    if family(rec["id"]) != "mbridge-moe":
        return ()
    rid = rec["id"]
    gpu = rid.split("-dgx-")[1].split("-")[0] if "-dgx-" in rid else ""
    ref = source_ref(rec)
    release = ref[:3] if ref[:3] == (26, 4, 1) else ref[:2]
    model = ("gpt-oss" if "gpt-oss-120b" in rid else "deepseekv3" if "deepseekv3" in rid else
             "deepseekv4" if "deepseekv4" in rid else
             "kimi-k2" if "kimi-k2" in rid else
             "nemotron-3-super-" + ("nvfp4" if "nvfp4" in rid else "mxfp8") if "nemotron-3-super" in rid else
             "nemotron-3-ultra" if "nemotron-3-ultra" in rid else
             "nemotron-3-nano" if "nemotron-3-nano" in rid else None)
    return MBRIDGE_RECOMPUTE_MODULES.get((model, release, gpu), ())


def bridge_llama3_8b_graphs(rec: dict) -> bool:
    """Whether a Megatron-Bridge table row of Llama 3 8B ran its preset's full-iteration CUDA graph: the
    LLAMA3_8B_{B200,GB200,GB300,B300}_{BF16,FP8_CS,FP8_MX} presets set cuda_graph_impl "local" with
    cuda_graph_scope "full_iteration" (scripts/performance/configs/llama3/workload_base_configs.py at v0.2.0 =
    25.11, 717c62de; the same in configs/llama/llama3_workload_base_configs.py at 00919dcf); B200 NVFP4 leaves
    the recipe's "none", H100 sets none. The 25.09 rows (v0.1.0rc4's YAML matrix: cuda_graphs true on B200,
    which scripts/performance/utils/helpers.py set_cuda_graph_overrides turns into model.enable_cuda_graph,
    Megatron-Core's per-layer graphs) keep "none": the host's launches are hidden behind the GPU there either
    way (cost.overhead.host_seconds), so no prediction depends on it."""
    rid, gpu = rec["id"], str(rec.get("hardware", {}).get("gpu", "")).lower()
    if family(rid) != "bridge" or "-llama3-8b-" not in rid or bridge_release(rec) < (25, 11):
        return False
    blackwell = gpu.startswith(("b200", "gb200", "gb300", "b300"))
    return blackwell and not (gpu.startswith("b200") and "nvfp4" in rid)


def mbridge_cuda_graphs(rec: dict) -> str:
    """The CUDA graphs of an mbridge MoE row's preset (ParallelPlan.cuda_graphs), at the release tags of
    mbridge_moe_recipe: full-iteration (cuda_graph_impl "full_iteration", with the MoE layers' static
    moe_expert_rank_capacity_factor) for the MXFP8 presets on Blackwell from 26.06, the releases that add the EP
    overlap with it; layers (cuda_graph_impl "transformer_engine", scope attn / moe_router / moe_preprocess) for
    Qwen3-30B-A3B off H100, Qwen3-235B-A22B, DeepSeek-V3 (from 25.11) and GPT-OSS on GB200 / GB300, and GPT-OSS on
    B300 (scripts/performance/configs/*/*workload_base_configs.py at v0.2.0 ... v0.4.0; 25.09: the perf_matrix of
    configs/{qwen3,deepseek}/*_llm_pretrain.yaml at v0.1.0rc4); none for the rest and for
    other families; and the full-iteration graph (cuda_graph_impl "local", cuda_graph_scope "full_iteration") of
    the Llama 3 8B pretrain presets on B200 / GB200 / GB300 / B300 from 25.11 on (bridge_llama3_8b_graphs)."""
    if bridge_llama3_8b_graphs(rec):
        return "full-iteration"
    if family(rec["id"]) != "mbridge-moe" or "kimi-k2" in rec["id"]:  # Kimi-K2's GB300 preset: cuda_graph_scope []
        return "none"
    if "nemotron-3-nano" in rec["id"]:  # the Nano presets (v0.3.1 - v0.6.0) override the recipe's "none": TE graphs
        return "layers"                 # (attn, mamba, moe_router, moe_preprocess; H100 FP8: mamba)
    if "nemotron-3-ultra" in rec["id"]:  # perf_recipes/nemotronh/common.py: cuda_graph_impl "none"
        return "none"
    if "nemotron-3-5-lightning" in rec["id"]:  # the Nano GB200 MXFP8 builder: TE graphs (attn, mamba, moe_router,
        return "layers"                        # moe_preprocess)
    if "nemotron-3-super" in rec["id"]:  # nemotron_3_workload_base_configs.py (v0.4.0 - v0.5.0), perf_recipes: TE graphs
        # (attn, mamba, router / preprocess scopes) but on B200 MXFP8 (cuda_graph_impl none; B200 NVFP4 has them)
        return "none" if "-b200-" in rec["id"] and "nvfp4" not in rec["id"] else "layers"
    rid, gpu = rec["id"], str(rec["hardware"]["gpu"]).lower()
    # v0.5.0's GPT-OSS B300 MXFP8 preset is its BF16 V2 one too (GPT_OSS_120B_PRETRAIN_CONFIG_B300_FP8_MX_V2 =
    # ..._B300_BF16_V2: TE graphs of attn / moe_router / moe_preprocess, no fused grouped MLP; only the GB300 /
    # GB200 FP8_MX_V2 presets set full_iteration, gpt_oss_workload_base_configs.py at fcbb603, v0.5.0)
    oss_b300 = "gpt-oss" in rid and gpu.startswith("b300")
    if mbridge_mx_v2(rec) and not oss_b300:
        return "full-iteration"
    gb = gpu.startswith("gb")
    ref = source_ref(rec)
    # DeepSeek-V3 at 25.09 ran none on GB200 (v0.1.0rc4 configs/deepseek/deepseek_v3_llm_pretrain.yaml perf_matrix:
    # cuda_graphs false for h100, b200 and gb200; the Qwen3 matrices there agree with the rule below)
    ds_graphs = "deepseekv3" in rid and ref >= (25, 11)
    layers = (("qwen3-30b" in rid and "h100" not in gpu) or (("qwen3-235b" in rid or ds_graphs) and gb)
              # GPT-OSS: the GB300 / B300 presets set TE graphs; the GB200 / B200 ones leave the recipe's "none"
              # (gpt_oss_workload_base_configs.py at v0.2.0 - v0.5.0: GB200 sets recompute_modules instead)
              or ("gpt-oss" in rid and ("gb300" in gpu or "b300" in gpu))
              # DeepSeek-V3's B300 V2 preset (PP8, micro-batch 2) from v0.4.2 (26.04.01) to v0.5.0 (26.06)
              or ("deepseekv3" in rid and gpu.startswith("b300") and (26, 4, 1) <= ref < (26, 8))
              or mbridge_ds_b200_v2(rec))  # its B200 MXFP8 V2 preset (PP8 VP2 EP32) at v0.4.2 / v0.5.0
    return "layers" if layers else "none"


def mbridge_expert_gemm(rec: dict) -> str:
    """How an mbridge MoE row's experts run their GEMMs (ParallelPlan.expert_gemm): per-expert (Megatron-Core's
    TEGroupedMLP on Transformer Engine's GroupedLinear, one cuBLASLt GEMM per local expert) unless the preset
    selects TE's fused grouped MLP: cutedsl_fused_grouped_mlp (NVTE_CUTEDSL_FUSED_GROUPED_MLP=1,
    use_transformer_engine_op_fuser) in the MXFP8 full-iteration presets from 26.06 (scripts/performance/configs/
    {qwen,deepseek,gpt_oss}/*workload_base_configs.py and utils/overrides.py at v0.5.0; v0.6.0 perf_recipes
    {qwen,deepseek,gpt_oss}/common.py), grouped there, and the Nemotron-3 Ultra presets (26.08). The bridgecard
    MoE card runs a perf recipe under the same rule: perf_recipes/_common.py _benchmark_common (at the card's
    bridge_commit 3a9559f01) clears use_transformer_engine_op_fuser, which only the full-iteration MXFP8 builder
    sets again (perf_recipes/qwen/common.py _enable_hybridep_full_iteration_mxfp8); the recipe's
    moe_grouped_gemm True then builds TEGroupedMLP: per-expert (docs/validation.md#bridgecard-expert-gemm).
    Other families: grouped (as priced before)."""
    fam = family(rec["id"])
    if fam not in ("mbridge-moe", "bridgecard") or (fam == "bridgecard" and not model_for(rec, fam).is_moe):
        return "grouped"
    if "nemotron-3-ultra" in rec["id"]:
        # v0.6.0 perf_recipes/nemotronh/common.py _apply_nemotron_3_ultra_perf_defaults: use_transformer_engine_op_fuser
        # True after _benchmark_common (which would clear it), use_fused_weighted_squared_relu; the GB200 / GB300
        # builders set NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 and offload "fused_group_mlp", the fused path's own offload;
        # Megatron-LM at v0.6.0's pin (cd4afff) experts.py _is_fused_impl_supported takes the weighted squared ReLU
        return "grouped"
    return "grouped" if mbridge_cuda_graphs(rec) == "full-iteration" else "per-expert"


def mbridge_fp8_attention(rec: dict) -> bool:
    """Whether an mbridge MoE row's preset runs FP8 dot-product attention (ParallelPlan.fp8_attention): the
    MXFP8 full-iteration presets from 26.06 that set fp8_dot_product_attention (scripts/performance/configs/qwen/
    qwen3_workload_base_configs.py at v0.5.0: Qwen3-30B-A3B on GB300 / GB200 / B300, Qwen3-235B-A22B on GB300 /
    GB200; configs/deepseek/deepseek_workload_base_configs.py: DeepSeek-V3 on GB300 only; v0.6.0 (26.08):
    perf_recipes/qwen/common.py _enable_hybridep_full_iteration_mxfp8 for every Qwen3 MXFP8 recipe,
    perf_recipes/deepseek/{gb300,b300}/deepseek_v3.py); GPT-OSS 120B's GB300 / GB200 MXFP8 presets
    (gpt_oss_workload_base_configs.py at v0.5.0, GPT_OSS_120B_PRETRAIN_CONFIG_GB{300,200}_FP8_MX_V2; v0.6.0
    perf_recipes/gpt_oss/common.py _apply_gpt_oss_120b_full_iter_fp8mx_configs), whose sinks and 128-token window
    Transformer Engine 2.16 runs in cuDNN's FP8 kernel on sm100 from cuDNN 9.21 (NeMo 26.06 ships TE 2.16 and
    cuDNN 9.21.1.3: docs/validation.md#gptoss-2606-regression). False elsewhere."""
    if family(rec["id"]) != "mbridge-moe" or mbridge_cuda_graphs(rec) != "full-iteration":
        return False
    rid, gpu = rec["id"], str(rec["hardware"]["gpu"]).lower()
    release = source_ref(rec)[:2]
    if "qwen3-30b" in rid or "qwen3-235b" in rid:
        return True
    if "deepseekv3" in rid:
        return gpu.startswith("gb300") or (gpu.startswith("b300") and release >= (26, 8))
    # TE v2.16 get_attention_backend (attention/dot_product_attention/utils.py) keeps FusedAttention for FP8 with a
    # non-vanilla softmax and a sliding window on sm >= 100 with cuDNN >= 9.21.0, and nvte_get_fused_attn_backend
    # (common/fused_attn/fused_attn.cpp) grants NVTE_FP8 to learnable softmax from cuDNN 9.21 (d <= 128, causal)
    return "gpt-oss-120b" in rid and gpu.startswith("gb")


def mbridge_fp8_output_proj(rec: dict) -> bool:
    """Whether an mbridge MoE row's recipe runs the output layer in MXFP8 (ParallelPlan.fp8_output_proj,
    Megatron-Core's TELMHeadColumnParallelLinear, NVIDIA/Megatron-LM 3f6a2ed844): Megatron-Bridge sets
    cfg.model.fp8_output_proj under the mxfp8 recipe for DeepSeek-V3 and GPT-OSS 120B on GB300 / GB200 from
    v0.5.0 (26.06; fcbb6031 scripts/performance/configs/deepseek/deepseek_llm_pretrain.py
    deepseek_v3_pretrain_config_gb{300,200}, configs/gpt_oss/gpt_oss_llm_pretrain.py
    gpt_oss_120b_pretrain_config_gb{300,200}: `if cfg.mixed_precision.fp8_recipe == "mxfp8"`) and at v0.6.0
    (26.08; 51885cf1 src/megatron/bridge/perf_recipes/deepseek/{gb200,gb300,b300}/deepseek_v3.py
    deepseek_v3_pretrain_256gpu_*_fp8mx_config, perf_recipes/gpt_oss/common.py
    _apply_gpt_oss_120b_full_iter_fp8mx_configs, called by the GB200 / GB300 120B fp8mx recipes); never for
    Qwen3 or the other models. False elsewhere (docs/validation.md#lmhead-fp8)."""
    rid, gpu = rec["id"], str(rec["hardware"]["gpu"]).lower()
    if family(rid) != "mbridge-moe" or "mxfp8" not in rid or source_ref(rec)[:2] < (26, 6):
        return False
    rack = gpu.startswith(("gb200", "gb300"))
    if "deepseekv3" in rid:
        return rack or (gpu.startswith("b300") and source_ref(rec)[:2] >= (26, 8))
    return "gpt-oss-120b" in rid and rack


def nvlink_segment_gpus(rec: dict, system: Any) -> int | None:
    """GPUs of each NVLink domain an mbridge MoE row on a multi-node NVLink system (GB200 / GB300 NVL72) uses:
    Megatron-Bridge's Slurm executor asks for `--segment` = the largest number of 4-GPU nodes <= 18 that
    divides the job's nodes, so 256 GPUs run as 4 segments of 64 (scripts/performance/utils/executors.py,
    slurm_executor). None elsewhere (the whole domain)."""
    if family(rec["id"]) != "mbridge-moe" or system.domain_gpus <= system.gpus_per_node:
        return None
    nodes = max(1, rec["hardware"]["gpus"] // system.gpus_per_node)
    per_domain = system.domain_gpus // system.gpus_per_node
    segment = nodes if nodes <= per_domain else next(s for s in range(per_domain, 0, -1) if nodes % s == 0)
    return segment * system.gpus_per_node


def mbridge_layout(rec: dict, pp: int, vpp: int) -> tuple[str, ...] | None:
    """The pipeline layout of a Megatron-Bridge DeepSeek-V3 row (None for other rows): its recipes set one for
    every PP x VP they run, by the number of chunks (pp x vpp): 4, 8 and 16 from _get_deepseek_v3_pipeline_layout
    (src/megatron/bridge/recipes/deepseek/h100/deepseek_v3.py at 067f987: the embedding with a full chunk, the
    last chunk the remainder with the MTP layer and the loss), 16 at PP2 VP8 from the GB300 presets
    ("Et*4|(t*4|)*14tmL") and 32 from the H100 PP8 VP4 preset ("Et|(tt|)*30mL", perf_recipes/deepseek/).
    No MTP layer in the 25.11 'w/o MTP' rows. Kimi-K2's rows run its recipe's 16-chunk layout."""
    if family(rec["id"]) == "mbridge-moe" and "kimi-k2" in rec["id"] and pp * vpp == 16:
        # Kimi-K2 (61 layers, no MTP): _get_kimi_k2_pipeline_layout (recipes/kimi/kimi_k2.py), PP4 VP4, PP8 VP2,
        # PP16 and PP2 VP8: the embedding with 4 layers, 14 chunks of 4, the last layer with the loss
        return ("Etttt",) + ("tttt",) * 14 + ("tL",)
    if family(rec["id"]) != "mbridge-moe" or "deepseekv3" not in rec["id"] or pp * vpp == 1:
        return None
    tail = ("" if "-w-o-mtp-" in rec["id"] else "m") + "L"
    full = {4: 16, 8: 8, 16: 4}.get(pp * vpp)
    if full is not None:
        n = pp * vpp
        return ("E" + "t" * full,) + ("t" * full,) * (n - 2) + ("t" * (rec["model"]["layers"] - full * (n - 1)) + tail,)
    if pp * vpp == 32:
        return ("Et",) + ("tt",) * 30 + (tail,)
    return None


FLASH2_FAMILIES = ("mpt", "torchtitan", "nemocp", "nemo2407")
"""Families whose runs' attention is priced as FlashAttention-2 (attention_kernel flash2; why for mpt and
torchtitan: ASSUMPTIONS). nemocp: NeMo-Framework-Launcher's launcher_scripts/conf/config.yaml sets
NVTE_FUSED_ATTN: 0 ("Disable cudnn FA until we've tested it more") from 562dcb45 (2024-02-13) through tag
24.07, the 24.05 tag among them, whose default container is nemo:24.03.01.framework; it was removed in
a6490ffe / 04b8d098 (tags 24.09 on). Transformer Engine's DotProductAttention then leaves FusedAttention
(cuDNN) off, although it prefers it on sm90 ("Select FusedAttention on sm90", transformer_engine/pytorch/
attention.py at da30634, the commit NeMo's 24.03 Dockerfile pins; v1.3 and v1.4 alike), and runs the
flash-attn package (<= 2.4.2 by TE's setup.py there): under context parallelism AttnFuncWithCP with
use_fused_attention False, one _flash_attn_varlen_forward call per ring step (docs/validation.md#nemocp-kernel).
nemo2407: NeMo's 24.07 performance summary (NVIDIA/NeMo docs/source/performance/performance_summary.md, commits
164b0097f8 / ccef6aab5a / 9c5c5e9709, 2024-08-14 to 09-09, by the author of NeMo-Framework-Launcher's
enable_vboost, 093e1726, merged 2024-08-20: the runs went through the launcher's sbatch scripts) was measured
while the launcher's main and its 24.07 tag set NVTE_FUSED_ATTN 0 (removed by 48f00494, merged 2024-08-30); its
layouts are the launcher's examples/training scripts'. The last revision (9c5c5e9709), after that merge, moves the
most attention-bound row (Llama 3 8B, 8k, CP2) +2.0% from the first, where FA2 -> cuDNN moves it by about 18%
here: the same kernel throughout (docs/validation.md#nemo2407-kernel)."""


def ran_triton_attention(rec: dict, fam: str) -> bool:
    """The record's run used llm-foundry's attn_impl triton (Triton FlashAttention, priced at FA2's rate times
    triton_flash2_ratio, docs/formulas.md#compute.triton_attention): submit_benchmarks.py defaults --attn_impl
    to triton (b2a43a147, 2023-10, the A100 and H100 BF16 / FP8 tables, and 5e85bd62d); the January 2024
    large-scale H100 table (sweep.py at 5e85bd62d) passes --attn_impl flash for 1b, 3b, 7b and 70b, installed
    as .[gpu-flash2] (flash-attn 2.4.2 by setup.py there: FlashAttention-2), and keeps triton for 13b and 30b."""
    if fam != "mpt":
        return False
    large_scale = "Large Scale" in str(rec.get("source", {}).get("ref", ""))
    return not (large_scale and rec["model"].get("name") in ("MPT-1b", "MPT-3b", "MPT-7b", "MPT-70b"))


ATTENTION_RELEASE_2026 = ("bridge", "mbridge-dense", "mbridge-moe", "bridgecard", "automodel", "dgxc")
"""Families whose stack is of 2025-26 (Megatron-Bridge 25.09-26.08 and its cards, NeMo AutoModel, DGX Cloud
Benchmarking's NeMo 25.04-25.09 containers) and, by id prefix, Megatron-LM's examples/llama rows: under
--attention-releases date or newer read as cuDNN 9.19, the only later Hopper release with a published rate
(cudnn-frontend at df73764, Feb 2026); newer
than the 2025 containers' cuDNN, so an upper bound for them (docs/validation.md#attention-release)."""


CONTAINER_CUDNN: dict[str, tuple[int, int, int]] = {
    # NeMo Framework containers, from Megatron-Bridge's software component versions page
    # (NVIDIA-NeMo/Megatron-Bridge docs/releases/software-versions.md at e49e451ba, 2026-06-22)
    "nemo:25.09": (9, 11, 0), "nemo:25.11": (9, 13, 1), "nemo:26.02": (9, 18, 0), "nemo:26.04": (9, 20, 0),
    "nemo:26.06": (9, 21, 1),
    # NeMo 25.04.01 / 25.07.01 (DGX Cloud Benchmarking): not on that page; inferred: a cuDNN released after 9.4.0
    # (September 2024) and not after NeMo 25.09's 9.11.0, so read at 9.4 either way
    "nemo:25.04": (9, 4, 0), "nemo:25.07": (9, 4, 0),
    # the PyTorch 25.03 container Megatron-LM's examples/llama/README.md runs its FP8 table's script in
    # (PYTORCH_IMAGE, core_r0.12.0): March 2025, after 9.4.0 and before NeMo 25.09's 9.11.0 (inferred)
    "pytorch:25.03": (9, 4, 0),
    # the PyTorch 26.04 container (a Megatron-Bridge verification card): after CUDA DL 26.03's 9.20.0.48, and the
    # base of NeMo 26.06 (9.21.1.3, the same page), so at least 9.20 (inferred)
    "pytorch:26.04": (9, 20, 0),
}
"""The cuDNN (major, minor, patch) each named container ships (docs/validation.md#attention-release), for
--attention-releases container. Patch containers (26.02.01, 26.04.01) are read as their base release's."""
PUBLISHED_RELEASES: tuple[tuple[tuple[int, int, int], str], ...] = (
    ((9, 1, 0), "cudnn-9.1"), ((9, 4, 0), "cudnn-9.4"), ((9, 19, 1), "cudnn-9.19"))
"""The cuDNN versions with a published Hopper SDPA training rate (ATTENTION_RELEASES), oldest first."""


def record_container(rec: dict) -> str | None:
    """The container a record names (CONTAINER_CUDNN's key), or None where its source names none: the
    Megatron-Bridge rows by their table's release in the id ('mbridge-26.02.01-' -> nemo:26.02, 'bridge-2511-'
    -> nemo:25.11), Megatron-LM's examples/llama rows by the README's PYTORCH_IMAGE, DGX Cloud Benchmarking
    rows by their source's nvcr.io/nvidia/nemo tag, others by a nvcr.io/nvidia/pytorch tag in their notes."""
    rid = rec["id"]
    if rid.startswith("megatron-examples"):
        return "pytorch:25.03"
    if rid.startswith(("mbridge-", "bridge-")):
        year, month = bridge_release(rec)
        return f"nemo:{year}.{month:02d}"
    text = str(rec.get("source", "")) + " " + str(rec.get("notes", ""))
    m = re.search(r"nvcr\.io/nvidia/(nemo|pytorch):(\d\d\.\d\d)", text)
    return f"{m.group(1)}:{m.group(2)}" if m else None


def release_for_cudnn(version: tuple[int, int, int] | None) -> str | None:
    """The published release nearest at or before a cuDNN version (PUBLISHED_RELEASES); None before 9.1.0 or
    for an unknown version."""
    if version is None:
        return None
    older = [name for v, name in PUBLISHED_RELEASES if v <= version]
    return older[-1] if older else None


ATTENTION_RELEASE_MODES = ("off", "date", "newer", "container")
"""How the records' stacks are read onto a published attention release (`--attention-releases`,
docs/validation.md#attention-release): off (default), every native-kernel Hopper record on the GPU's fitted
attention_efficiency; date, the 2024 stacks on cuDNN 9.1 and the 2025-26 stacks on 9.19 (the published release
nearest in date); newer, only the 2025-26 stacks on 9.19 and the 2024 ones on the fitted constant. Off by
default: with either reading the dense goldens priced at the shipped H100 clock (tests/test_cp_short.py: the
Bridge 405B CP2 row +8.7%) leave their tolerance (the measured numbers in docs/validation.md; nemocp, +33%
when it was read as cuDNN, is FlashAttention-2: FLASH2_FAMILIES). container: each record on the published
release nearest at or before the cuDNN of the container its source names (CONTAINER_CUDNN), the rest (no
container named, or one older than 9.1) on the fitted constant."""
attention_release_mode = "off"
"""The mode in force (main sets it from --attention-releases; tests and imports see "off")."""


def attention_release_for(rec: dict, fam: str) -> str | None:
    """The cuDNN release whose published attention rate the record's stack runs (ParallelPlan.attention_release)
    under attention_release_mode, by the stack's date (ATTENTION_RELEASE_2026); None with the mode off,
    where the kernel is not cuDNN's (flash2 families, unfused attention) or where the record's GPU has no
    published rate for it (not Hopper)."""
    rid = rec["id"]
    # the one 2024 stack on cuDNN: Megatron-Core r0.8's table, read under date as cuDNN 9.1, the earliest release
    # NVIDIA published a Hopper SDPA training rate for (NVIDIA/cudnn-frontend at b740542, May 2024); NeMo's 2024
    # tables (nemocp, nemo2407) ran FlashAttention-2 through NeMo-Framework-Launcher (FLASH2_FAMILIES)
    old = rid.startswith("megatron-core-r0.8-")
    new = fam in ATTENTION_RELEASE_2026 or rid.startswith("megatron-examples")
    release = (release_for_cudnn(CONTAINER_CUDNN.get(record_container(rec) or ""))
               if attention_release_mode == "container" else
               "cudnn-9.1" if old and attention_release_mode == "date" else
               "cudnn-9.19" if new and attention_release_mode in ("date", "newer") else None)
    name = record_system(rec)
    if release is None or name is None or release not in builtin_systems()[name].gpu.attention_release_efficiency:
        return None
    return release


def mpt_bf16_reduce(rec: dict, fam: str) -> bool:
    """Whether an MPT row's FSDP reduced its gradients in bf16: Composer's mixed_precision PURE sets FSDP's
    reduce_dtype to the autocast dtype (composer/trainer/mosaic_fsdp.py get_mixed_precision at v0.13.x - v0.14.1,
    composer/trainer/mosaic_fsdp_utils.py at v0.16.4 / v0.17.2), DEFAULT to float32 in the Composer 0.16 / 0.17
    of the October 2023 and January 2024 tables (llm-foundry setup.py at b2a43a147: mosaicml >= 0.16.3; at
    5e85bd62d: >= 0.17.2). The table's 'MP Mode' column (fsdp_mixed_precision) says which."""
    return fam == "mpt" and str(rec.get("parallel", {}).get("fsdp_mixed_precision", "")).upper() == "PURE"


MBRIDGE_BUCKET_PARAMS = 128 * 1024 * 1024
"""The DDP bucket Megatron-Bridge's CommOverlapConfig sets with the distributed optimizer and dp > 1
(src/megatron/bridge/training/comm_overlap.py, _get_optimizer_overlap_cfgs: bucket_size = 128 * 1024 * 1024,
line 543 at v0.1.0rc4, 540 at v0.2.0 / v0.3.0, 577 at v0.4.0, 564 at v0.5.0, 577 at v0.6.0 and at every
verification card's commit); applied by setup only under ddp_config.use_distributed_optimizer, and setup runs only
where the recipe set cfg.comm_overlap (config.py runtime_config_update: `if cfg.comm_overlap is not None`; the
recipes' _pretrain_common leaves it None). GPT-OSS 20B's presets set ddp.bucket_size = 768000000
(scripts/performance/configs/gpt_oss/gpt_oss_llm_pretrain.py set_gpt_oss_20b_common_configs line 92 at v0.5.0;
perf_recipes/gpt_oss/common.py _apply_gpt_oss_20b_common_configs line 116 at v0.6.0) with no CommOverlapConfig and
use_megatron_fsdp False, so it is Megatron-Core DDP's bucket there (their data_parallel_sharding_strategy and
fsdp_double_buffer are read only by Megatron-FSDP); no record runs them (GPT-OSS 120B's presets set no bucket_size).
docs/validation.md#bucket-paths"""

BRIDGECARD_COMM_OVERLAP = (
    # recipes/qwen/h100/qwen3_moe.py qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config line 218,
    # CommOverlapConfig(tp_comm_overlap=True), at 3a9559f01 (the card) and 8198fd9cd (PR 5094's two arms)
    "bridgecard-h100-bf16-qwen3-30b-a3b-16gpu-gbs1024",
    "bridgecard-h100-bf16-qwen3-30b-a3b-16gpu-gbs1024-ep-overlap-off-pr5094",
    "bridgecard-h100-bf16-qwen3-30b-a3b-16gpu-gbs1024-ep-overlap-on-pr5094",
    # scripts/performance/configs/qwen/qwen3_llm_pretrain.py qwen3_235b_a22b_pretrain_config_b200 line 191,
    # comm_overlap_config=CommOverlapConfig(tp_comm_overlap=True), at a6e92de5f (PR 1760)
    "bridgecard-b200-bf16-qwen3-235b-a22b-64gpu-gbs1024-ep-overlap-off-pr1760",
    "bridgecard-b200-bf16-qwen3-235b-a22b-64gpu-gbs1024-ep-overlap-on-pr1760",
    # recipes/nemotronh/h100/nemotron_3_nano.py nemotron_3_nano_pretrain_8gpu_h100_bf16_config line 206, the base
    # of both Lightning perf recipes, at cba5742e3 (H100) and 9b0c2dff4 (GB200)
    "bridgecard-h100-bf16-nemotron-3.5-lightning-16gpu-gbs512",
    "bridgecard-gb200-bf16-nemotron-3.5-lightning-8gpu-gbs512",
    # perf_recipes/gpt_oss/gb200/gpt_oss.py gpt_oss_120b_pretrain_64gpu_gb200_bf16_config line 198 at a8038f6d9
    "bridgecard-gb200-bf16-gpt-oss-120b-64gpu-gbs1280",
    # set, but with overlap_grad_reduce False, so Megatron-Core drops the bucket (bridge_bucket_params):
    # recipes/qwen/gb200/qwen35.py line 190 (perf_recipes/qwen/h100/qwen35.py lines 117-118) at 7e4a6d11e;
    # recipes/deepseek/h100/deepseek_v3.py line 228 (perf_recipes/deepseek/h100/deepseek_v3.py line 46) at 79308d0d9
    "bridgecard-h100-bf16-qwen3.5-35b-a3b-16gpu-gbs1024",
    "bridgecard-h100-bf16-deepseek-v3-1024gpu-gbs16384",
)
"""The verification-card rows whose recipe, at the card's commit, sets cfg.comm_overlap (Megatron-Bridge at those
commits; the cards run scripts/training/train.sh --recipe, which sets none). Not set: Qwen3-8B (recipes/qwen/h100/
qwen3.py at 619cc20bd, from _pretrain_common's comm_overlap=None), Nemotron-3 Super on H100 (ffeb5a7ae) and on
GB200 (ae2c24890: perf_recipes/nemotronh/gb200/nemotronh.py from nemotron_3_super_pretrain_8gpu_h100_bf16_config,
_pretrain_common). docs/validation.md#bucket-paths"""


def bridge_comm_overlap(rec: dict, fam: str) -> bool:
    """Whether a Megatron-Bridge row's recipe set cfg.comm_overlap (a CommOverlapConfig, whose setup writes the
    128 x 2^20 bucket). Verification cards: BRIDGECARD_COMM_OVERLAP. Performance tables: every preset but
    (1) Nemotron-3 Super's (26.04-26.08): scripts/performance/configs/nemotronh/nemotron_3_llm_pretrain.py at
    v0.4.0 - v0.5.1 and perf_recipes/nemotronh/{gb300,gb200,b300,b200,h100}/nemotronh.py at v0.6.0 neither set nor
    touch it, and recipes/nemotronh nemotron_3_super_pretrain_config starts from _pretrain_common (None);
    (2) GPT-OSS 120B's, except GB200 from 26.02.01 (gpt_oss_120b_pretrain_config_gb200 line 81 at PR 2906's
    7260d6214, v0.4.0, v0.4.2; line 449 at v0.5.0; perf_recipes/gpt_oss/gb200/gpt_oss.py at v0.6.0) and GB300's
    MXFP8 V2 presets (v0.5.0: moe_a2a_overlap=True, which utils/overrides.py _set_moe_a2a_overlap_overrides turns
    into a CommOverlapConfig, lines 168-170; v0.6.0 perf_recipes/gpt_oss/common.py
    _apply_gpt_oss_120b_full_iter_fp8mx_configs line 47): recipes/gpt_oss/gpt_oss.py leaves it None at v0.2.0 -
    v0.5.0 and the v0.2.0 - v0.3.1 config functions pass none. The scripts create one only for moe_a2a_overlap
    (overrides.py: v0.5.0 lines 168-170, v0.6.0 192-194). docs/validation.md#bucket-paths"""
    rid, gpu = rec["id"], str(rec["hardware"]["gpu"]).lower()
    if fam == "bridgecard":
        return rid in BRIDGECARD_COMM_OVERLAP
    if fam not in BRIDGE_FAMILIES or "nemotron-3-super" in rid:
        return False
    if "gpt-oss" in rid:
        return (gpu.startswith("gb200") and source_ref(rec) >= (26, 2, 1)) or (
            gpu.startswith("gb300") and mbridge_mx_v2(rec))
    return True


BRIDGE_NATIVE_LOSS_MODELS = ("deepseekv4", "glm5", "nemotron-3-ultra")
"""Megatron-Bridge performance recipes that keep Megatron-Core's native fused loss (perf_recipes, at v0.6.0:
_benchmark_common(cfg, cross_entropy_impl="native") in deepseek/*/deepseek_v4.py, glm_moe_dsa/*/glm5.py and,
in nemotronh/common.py, _apply_nemotron_3_ultra_perf_defaults only: its Nano / Super / Lightning defaults and
builders call _benchmark_common(cfg), Transformer Engine's); every other performance recipe sets Transformer
Engine's (scripts/performance/utils/overrides.py at v0.2.2 .. v0.6.0, _set_common_perf_overrides, last in
set_workload_base_configs, which ran the 26.02.01 - 26.06.01 Nemotron-3 rows; _benchmark_common's default:
cross_entropy_fusion_impl "te")."""


def unfused_loss_impl(rec: dict, fam: str) -> str:
    """ParallelPlan.unfused_loss_impl of a row (its memory where the loss runs unfused): Megatron's
    _VocabParallelCrossEntropy, in place on its fp32 copy, on the Megatron-Core r0.8 rows (core_r0.8.0
    megatron/core/tensor_parallel/cross_entropy.py: calculate_logits_max's .float(), `-=`, exp out=, div_; in
    place again since 9634c0e4a3); PyTorch's eager cross_entropy elsewhere (torchtitan, AutoModel's
    MaskedCrossEntropy)."""
    return FP32_LOGIT_LOSS.get(fam, "vocab-parallel" if rec["id"].startswith("megatron-core-r0.8-") else "eager")


def bridge_loss_impl(rec: dict, fam: str) -> str:
    """ParallelPlan.fused_loss_impl of a row: te on Megatron-Bridge's performance recipes (BRIDGE_FAMILIES) but
    those of BRIDGE_NATIVE_LOSS_MODELS, else Megatron-Core's default native (the verification cards run the
    library recipes, which leave it native unless a model's provider sets it)."""
    native = any(x in rec["id"] for x in BRIDGE_NATIVE_LOSS_MODELS)
    return "te" if fam in BRIDGE_FAMILIES and not native else "native"


def bridge_bucket_params(rec: dict, fam: str, zero: int, reduce_ranks: int, overlap_grad_reduce: bool) -> int | None:
    """The record's DDP bucket (plan.dp_bucket_params): Megatron-Bridge's 128 x 2^20 where its recipe set
    cfg.comm_overlap (bridge_comm_overlap), under the distributed optimizer, over more than one data-parallel rank
    and with overlap_grad_reduce on (Megatron-Core's DistributedDataParallel sets bucket_size None without it:
    megatron/core/distributed/distributed_data_parallel.py lines 70-72 at 14346b65a and d12f6c8c9, 66-68 at
    5455f0a01, the cards' Megatron-LM pins); else None, Megatron-Core's default max(40M, 1M x dp)."""
    on = zero == 1 and reduce_ranks > 1 and overlap_grad_reduce and bridge_comm_overlap(rec, fam)
    return MBRIDGE_BUCKET_PARAMS if on else None


def plan_for(rec: dict, fam: str, gpus: int) -> ParallelPlan:
    par = {**rec["parallel"], **MBRIDGE_ERRATA.get(rec["id"], {}), **RECIPE_SETTINGS.get(rec["id"], {})}
    tp, pp = par.get("tp", 1), par.get("pp", 1)
    cp = par.get("cp", 1)
    dp = par.get("dp") or gpus // (tp * pp * cp)
    # MegaScale's Megatron-LM baseline: selective recompute (Korthikanti et al. 2022), the attention-memory
    # saving of Megatron-LM releases without flash attention (its 53% MFU leaves no room for full recompute)
    rc = str(par.get("recompute", "full" if fam in ("narayanan2021", "megatron2020") else
                     "selective" if fam == "megascale" else "none"))
    mbridge = fam in ("mbridge-dense", "mbridge-moe")
    recompute = "selective" if rc.startswith("selective") else ("full" if rc.startswith("full") else
                                                                ("op" if rc.startswith("op") else "none"))
    # the selective recompute modules the record's recipe names (the verification cards: cfg.model.recompute_modules
    # of the recipe at the card's commit), else the preset's (Megatron-Bridge's performance tables)
    modules = tuple(par.get("recompute_modules") or ()) or mbridge_recompute_modules(rec)
    if fam == "deepseek" and "RMSNorm and the MLA up-projections" in rc:
        # DeepSeek-V3 report §3.2.3: "Recomputation of RMSNorm and MLA Up-Projection" in back-propagation,
        # Megatron's layernorm (MLA's input norm, the MoE layers' pre-MLP norm) and mla_up_proj modules
        # ... and §3.3.3, "Low-Precision Storage": the SwiGLU operator's input is cached and its output
        # recomputed in the backward pass, Megatron's moe_act module
        modules = ("layernorm", "mla_up_proj", "moe_act")
    recompute = "selective" if modules else recompute
    precision = str(par.get("precision", "bf16")).lower()
    dtype, recipe = BRIDGE_PRECISION.get(precision, ("fp8" if "fp8" in precision else "bf16", "tensorwise"))
    zero = par.get("zero_stage") or (3 if par.get("fsdp") else 1 if par.get("distributed_optimizer")
                                     or fam in ("nemo2407", "megatron", "nemocp", "megascale", "megascale-opt")
                                     else 0)
    if isinstance(zero, str):
        zero = 3 if "fsdp" in zero.lower() else 1
    sp_default = tp > 1 and fam in ("megatron", "nemo2407", "torchtitan", "nemocp", "mbridge-dense", "mbridge-moe", "dgxc",
                                    "megascale", "megascale-opt")
    gbs = par.get("global_batch")
    # Megatron-LM's 2020 --batch-size was the per-replica batch with no gradient accumulation ("Batch size
    # per model instance (local batch size)", megatron/arguments.py at d73def35a3): one micro-batch of it.
    local = gbs // dp if fam == "megatron2020" and isinstance(gbs, int) and pp == 1 else 1
    if rec["id"].startswith("megatron-core-r0.8-") and pp == 1 and isinstance(gbs, int):
        # One micro-batch of the replica's 4 sequences (ASSUMPTIONS["megatron"]): r0.8 reduces gradients
        # only during the last micro-batch's backward, so 4 micro-batches of 1 would leave most of a
        # 32B TP8 replica's reduce-scatter and gather exposed (0.45 s of a 0.9 s step), which the
        # measured MFU has no room for; one micro-batch of 4 fits without recompute.
        local = gbs // dp
    mb = par.get("micro_batch", local)
    if not isinstance(gbs, int):
        gbs = mb * dp
    layers = rec["model"].get("layers") or model_for(rec, fam).num_hidden_layers
    first, last = balanced_split(layers, pp) if pp <= layers else (0, 0)
    if fam == "torchtitan" and pp > 1:
        first, last = torchtitan_split(layers, pp, par.get("vpp", 1) or 1)
    vpp = par.get("vpp", 1) or 1
    if rec["id"].startswith("megatron-core-r0.8-") and pp > 1 and "vpp" not in par:
        # Interleaved, one layer per virtual stage (ASSUMPTIONS["megatron"]): the README's "pipeline-parallel
        # communication (enabled by default)" overlap exists only in r0.8's interleaved schedule, and 1 is the
        # only --num-layers-per-virtual-pipeline-stage that divides every PP > 1 row's layers per stage
        # (42, 23, 16, 12, 7). Every row has 4 x pp micro-batches, as the schedule's n % pp == 0 rule allows.
        vpp = layers // pp
    # the pipeline layout the record's recipe sets (a verification card's cfg.model.pipeline_model_parallel_layout,
    # one string per virtual stage), else the Megatron-Bridge preset's (mbridge_layout)
    layout = tuple(par["pp_layout"]) if par.get("pp_layout") else mbridge_layout(rec, pp, vpp)
    if layout is not None:
        first = last = 0
    flash2 = fam in FLASH2_FAMILIES or "flash" in str(par.get("attention", ""))
    overlap_grad = par.get("overlap_grad_reduce", fam not in STEP_END_DP and not (fam == "torchtitan" and pp > 1)
                           and not mbridge_grad_reduce_off(rec))
    # the stack-wide switches (tp_impl dtensor for torchtitan, fp32_param_shards for the FSDP stacks, ...) at
    # their defaults on the rows without the axis they act on: the same plan and price (check_switches.settle)
    return settle(ParallelPlan(
        pp_layout=layout,
        recompute_layers=par.get("recompute_layers"), recompute_modules=modules,
        tp=tp, pp=pp, pp_first=first, pp_last=last, dp=dp, cp=cp, ep=par.get("ep", 1), vpp=vpp, sp=bool(par.get("sequence_parallel", sp_default)) and tp > 1,
        zero=zero, recompute=recompute, micro_batch=mb, global_batch=gbs,
        seq_len=rec["model"].get("seq_len", 2048), dtype=dtype, recipe=recipe,
        # BLOOM's prequel (02-17 .. 02-26) ran DeepSpeed's ZeRO-1 (stage_1_and_2.py at 2151c787a), which keeps
        # param.grad in the model's 16-bit dtype and casts only the rank's partition to fp32 at the step
        # (cost.model_states.optimizer_copies); tr11-200B-ml.slurm (bigscience 8aff319 .. 523069f) ran --fp16.
        # The BF16_Optimizer accumulating in fp32 came on 02-28 (chronicles-prequel.md 'Rebalancing layers':
        # "just written ... The additional memory usage is 4bytes x params"): the final run's fp32 gradients.
        # examples/llama's fp8 script reduces gradients in bf16 (--grad-reduce-in-bf16: NVIDIA/Megatron-LM
        # examples/llama/train_llama3_8b_h100_fp8.sh at bf6e99859f), as NeMo's recipes it follows do
        grad_dtype="bf16" if fam in TWO_BYTE_GRADS or (fam == "bloom" and (precision == "fp16"
                                                                      or bloom_pre_bf16_optimizer(rec)))
        or rec["id"].startswith("megatron-examples-fp8") or mpt_bf16_reduce(rec, fam) else "fp32",
        fp8_params=(dtype == "fp8" and (rec["id"].startswith("megatron-examples-fp8") or fam in BRIDGE_FAMILIES
                                        or bool(par.get("fp8_all_gather"))) and not mbridge_muon_bf16_params(rec))
        or mbridge_nvfp4_params(rec),
        flash_attention=fam not in ("narayanan2021", "korthikanti2022", "megatron2020", "bloom", "mtnlg",
                                    "megascale"),
        attention_kernel="flash2" if flash2 else "native",
        attention_release=None if flash2 else attention_release_for(rec, fam),
        # torchtitan 9dec370 train.py: eager cross_entropy on .float() logits; AutoModel's MaskedCrossEntropy
        # with fp32_upcast (on bf16 logits it holds ~6 bytes per logit: priced as the fused loss's 4, the nearest)
        # Megatron-Core r0.8: --cross-entropy-loss-fusion off by default, and not among the README's flags
        fused_loss=fam != "torchtitan" and "fp32 logits" not in str(par.get("loss", ""))
        and not rec["id"].startswith("megatron-core-r0.8-") and fam not in FP32_LOGIT_LOSS,
        fused_loss_impl=bridge_loss_impl(rec, fam),
        unfused_loss_impl=unfused_loss_impl(rec, fam),
        # PyTorch FSDP / FSDP2 mixed precision: the fp32 shard is the master copy (no bf16 shard beside it)
        fp32_param_shards=fam in ("mpt", "torchtitan", "automodel"),
        # Megatron-LM's own training loop with its defaults (core_r0.8.0 .. d98e8a6): every gradient bucket's
        # norm for the NaN check and its 1/dp pre-scaling before the DP reduction; neither the r0.8 README's
        # flags nor the examples/llama scripts turn them off (docs/formulas.md#step.grad_buffer)
        grad_nan_check=fam == "megatron", grad_prescale=fam == "megatron",
        dp_bucket_params=bridge_bucket_params(rec, fam, zero, dp * cp, bool(overlap_grad)),
        # torchtitan without torch.compile runs its norms, rotary and SwiGLU as separate eager kernels
        fused_kernels=not (fam == "torchtitan" and par.get("compile") is False),
        # and its complex rotary (model.py apply_rotary_emb at 9dec370) stays eager under torch.compile too: Inductor
        # runs complex operators as their eager kernels (pytorch/torchtitan#15)
        rope_complex=fam == "torchtitan",
        # FSDP2 (fully_shard) copies every all-gather out into the parameters on the compute stream
        zero3_copy_out=fam in ("torchtitan", "automodel"),
        tp_impl="dtensor" if fam == "torchtitan" else "megatron",  # parallelize_llama.py apply_tp at 9dec370
        # torchtitan 9dec370 runs PyTorch's experimental context_parallel with its default rotate method
        # (config_manager.py: context_parallel_rotate_method "allgather"; utils.py create_context_parallel_ctx)
        # NeMo AutoModel's SDPA CP runs the same ring, rotate method allgather (context_parallel/sharder.py at
        # 36044ad3d: create_context_parallel_ctx(cp_rotate_method="allgather"), cp_utils.py at 2013a4dd6, the
        # commit that added the 70B row); attn te would take TE's own CP (attach_te_context_parallel)
        cp_impl="torch-allgather" if fam == "torchtitan" or (fam == "automodel" and "sdpa" in
                                                               str(par.get("attention", "")).lower()) else "te",
        # torchtitan/models/llama/model.py at 9dec370: repeat_kv before SDPA; AutoModel's Llama calls transformers'
        # sdpa_attention_forward, which passes enable_gqa (no repeat) on CUDA with torch >= 2.5 and no mask
        # (use_gqa_in_sdpa; the CP hooks strip the mask: attach_context_parallel_hooks): the ring moves KV heads
        cp_kv_repeated=fam == "torchtitan",
        # and traces the ring into each block it compiles (parallelize_llama.py apply_compile: fullgraph=True): the
        # functional collectives wait at once under tracing and torch 1963fc8's Inductor keeps that order in
        # training graphs (reorder_for_compute_comm_overlap off, torchtitan sets no reordering): every transfer
        # waited for where issued (docs/formulas.md#step.cp_compiled)
        # AutoModel compiles each layer but its CP SDPA hook wraps the ring in torch._dynamo.disable (a graph break:
        # attach_cp_sdpa_hooks, context_parallel/utils.py at 36044ad3d): the ring runs eagerly, overlapped
        cp_comm_overlap=not (fam == "torchtitan" and par.get("compile") is not False),
        # Megatron-Bridge's Llama 3 / 3.1 NVFP4 presets turn the TP overlap off (scripts/performance/configs/llama/
        # llama3{,1}_llm_pretrain.py v0.3.0 ... v0.5.0: tp_comm_overlap = False if precision == "nvfp4";
        # perf_recipes/llama/*/llama3*.py at 067f987d: tp_comm_overlap False in the NVFP4 builders)
        # MegaScale overlaps the TP / SP all-gathers and reduce-scatters with the adjacent GEMMs, each split into
        # chunks pipelined with the communication (Jiang et al. 2024, §3.2 "Tensor/sequence parallelism"; Table 3
        # "TP overlap", 53.3 -> 55.5): priced as Transformer Engine's userbuffer methods at their default SMs
        tp_comm_overlap=("tp-comm-overlap" in str(par.get("comm_overlap", "")) or bool(par.get("async_tp"))
                         or bool(par.get("tp_comm_overlap")) or fam == "megascale-opt"
                         or mbridge) and tp > 1 and not (fam in BRIDGE_FAMILIES and dtype == "fp4"
                                                         and "llama" in rec["id"])
        and not mbridge_without_tp_overlap(rec),
        # the SMs each TP GEMM's userbuffer overlap holds, as the row's recipe configures it (ub_config_for)
        tp_overlap_sms=ub_config_sms(ub) if (ub := ub_config_for(rec, fam, dtype, tp)) else None,
        # and the SMs set_sm_margin takes from those GEMMs for their whole length (the config's, else TE's default)
        tp_overlap_margin_sms=ub_config_margin(ub) if ub else te_default_margin(rec),
        # Megatron-LM 2021-22 (scatter/gather on by default from 2021-02-16, 72e4230bb5, until the pipeline moved
        # into Megatron-Core in 2023) and DeepSpeed's pipeline engine (is_pipe_partitioned, Megatron-DeepSpeed's
        # BLOOM and MT-NLG) send each TP rank's 1/t of a stage's output and all-gather it after the receive
        pp_scatter_gather=fam in PP_SCATTER_GATHER,
        # Megatron-LM of 2020-21, the Megatron-DeepSpeed forks and llm-foundry run the LayerNorm backward in two
        # kernels (TWO_PASS_NORM), as does torchtitan's compiled RMSNorm under torch 1963fc8's Inductor
        # (INDUCTOR_TWO_PASS_NORM; its eager rows price unfused ops instead)
        norm_kernel="two-pass" if fam in TWO_PASS_NORM or (fam in INDUCTOR_TWO_PASS_NORM and par.get("compile")
                                                            is not False) else "fused-one-pass",
        # Megatron-LM 2021-22 waits on every pipeline exchange and synchronises the device (PP_BLOCKING_SENDS), as
        # Megatron-Core's 1F1B does after each batched exchange (MCORE_1F1B_SYNC)
        pp_blocking_sends=(fam in PP_BLOCKING_SENDS or (fam in MCORE_1F1B_SYNC and vpp == 1)) and pp > 1,
        # DeepSpeed's pipeline engine (BLOOM, MT-NLG) receives and sends one transfer at a time (DEEPSPEED_PIPE)
        pp_unbatched_sends=fam in DEEPSPEED_PIPE and pp > 1 and vpp == 1,
        # Megatron-LM 2020 ran the softmax as eager ops (EAGER_SOFTMAX); BLOOM's prequel ran Megatron-DeepSpeed's
        # fused softmax only where its (mis-sized) block check passed; the rest the fused causal kernel
        softmax_kernel=("eager" if fam in EAGER_SOFTMAX else
                        bigscience_softmax_kernel(rec, fam, model_for(rec, fam).num_attention_heads, tp, mb)),
        # the Table 2 ZeRO-3 rows ran DeepSpeed's stage 3 of 2021 (v0.3.13, 2021-03): one collective per weight
        # tensor, each module's weights released after its forward and fetched again for the recompute
        # (runtime/zero/stage3.py, partition_parameters.py); FSDP stacks gather per layer
        zero3_unit="tensor" if fam == "narayanan2021" and zero == 3 else "layer",
        # Megatron-LM's asynchronous backward TP all-reduce (--async-tensor-model-parallel-allreduce) exists from
        # 2021-09-02 (3f65246911); the 2020 and April-2021 releases and the Megatron-DeepSpeed forks (bigscience's
        # mpu/layers.py at 119a0d2d, microsoft's until f90b8877, 2023-07) run every TP collective synchronously
        tp_backward_overlap=fam not in SYNC_TP,
        # AutoModel's MoE rows: DeepEP (one row per destination rank) and its FakeBalancedGate, which gives token
        # i the experts i*k .. i*k+k-1 (nemo_automodel/components/moe/layers.py at 36044ad3d)
        moe_dispatcher=par.get("moe_dispatcher") or ("deepep" if "DeepEP" in str(par.get("comm_overlap", ""))
                                                     or mbridge_moe_recipe(rec)[0] else "alltoall"),
        ep_comm_overlap=bool(par.get("ep_comm_overlap", False)) or mbridge_moe_recipe(rec)[1],
        # the hardware queues the Bridge launcher gave the row (mbridge_connections; the EP overlap hides half as much
        # at 1: cost.moe.overlap_queues)
        cuda_max_connections=par.get("cuda_max_connections") or mbridge_connections(rec, fam, tp, cp, pp, dp),
        # every Megatron-Bridge performance preset that turns the EP overlap on defers the weight gradients with
        # it (mbridge_delay_wgrad); a verification card's row says what its recipe set (parallel.delay_wgrad)
        delay_wgrad=bool(par.get("delay_wgrad", False)) or mbridge_delay_wgrad(rec),
        # Megatron-Bridge's performance scripts give HybridEP 32 SMs (moe_hybridep_num_sms = 32 in
        # scripts/performance/utils/helpers.py at v0.2.0, utils/overrides.py at v0.3.0 ... v0.6.0, each under
        # `if moe_flex_dispatcher_backend == "hybridep"`); a DeepEP-backend preset sets none (v0.1.0rc4's
        # run_script.py has no SM setting), so Megatron-Core's default runs: moe_deepep_num_sms 20
        # (transformer_config.py at core_v0.14.0, 23e00ed09), llmplan's DEEPEP_NUM_SMS (docs/validation.md#ep-overlap-nodes)
        moe_dispatch_sms=par.get("moe_dispatch_sms") or (32 if mbridge_moe_recipe(rec)[0] and (
            par.get("moe_flex_backend") or mbridge_flex_backend(rec)) == "hybridep" else None),
        moe_flex_backend=par.get("moe_flex_backend") or mbridge_flex_backend(rec),
        cuda_graphs=par.get("cuda_graphs") or mbridge_cuda_graphs(rec),
        # Megatron-Bridge's MoE recipes run the experts without tensor parallelism (expert_tensor_parallel_size 1)
        etp=par.get("etp", 1 if fam == "mbridge-moe" else None),
        pp_schedule=par.get("pp_schedule", "1f1b"),
        moe_router_fusion=bool(par.get("moe_router_fusion", mbridge_router_fusion(rec, fam))),
        moe_routing="contiguous" if "fake balanced gate" in str(par.get("comm_overlap", "")) else "random",
        # MegaScale's Megatron-LM baseline reduces and gathers the DP buckets after the backward, not beside it:
        # "DP overlap" is one of the optimisations MegaScale adds (Jiang et al. 2024, Table 3, +1.2 MFU points)
        # DeepSpeed's pipeline engine (BLOOM, MT-NLG) reduces the gradients in its ReduceGrads instruction after the
        # last backward of the schedule and gathers the updated weights in the optimizer step, neither beside
        # compute (deepspeed/runtime/pipe/schedule.py TrainSchedule; engine.py _exec_reduce_grads)
        # torch.distributed.pipelining (torch 1963fc8, the torchtitan rows' PyTorch) runs every micro-batch's
        # backward with FSDP's gradient sync off and calls post_backward on each FSDP group by hand after the
        # stage's last backward (_PipelineStageBase.backward_maybe_with_nosync: pytorch/pytorch#134052, 2024-08;
        # #165106, 2025-10, moves these reduce-scatters to the step's end because their compute-stream sync
        # blocked the other stages' backwards): the stage's reduction beside no compute
        # a recipe that turns the DP overlap off says so in the record (the Qwen3.5 card's recipe: both False)
        # the 25.09 DeepSeek-V3 H100 preset turns it off (mbridge_grad_reduce_off)
        overlap_grad_reduce=overlap_grad,
        # Megatron-Bridge presets that turn it off (25.11 MXFP8 Llama 70B / 405B, DeepSeek-V3 NVL72, Qwen3-235B
        # B200; 405B GB200 NVFP4 V2 from 26.04.01): mbridge_param_gather_off
        overlap_param_gather=par.get("overlap_param_gather", fam not in STEP_END_DP and not mbridge_muon(rec)
                                     and not mbridge_param_gather_off(rec)),
        # the Megatron-Bridge performance scripts' dp > 1, pp > 1, vp > 1 rule (mbridge_param_gather_optstep),
        # where the parameter-gather overlap it needs is on
        overlap_param_gather_with_optimizer_step=par.get(
            "overlap_param_gather_with_optimizer_step",
            mbridge_param_gather_optstep(rec, dp, pp, vpp, recipe) and par.get(
                "overlap_param_gather", fam not in STEP_END_DP and not mbridge_muon(rec)
                and not mbridge_param_gather_off(rec))),
        # BigScience ran with CUDA_LAUNCH_BLOCKING=1 against NCCL hangs on Jean Zay (tr11-176B-ml.slurm exports it;
        # chronicles-prequel.md 'dealing with JZ hanging': without it, 320 GPUs always hung)
        launch_blocking=fam == "bloom",
        cuda_lazy_loading=fam not in EAGER_MODULE_LOADING,
        # How each micro-batch's gradient joins the accumulated one (GRAD_ACCUMULATION): outside the GEMM for the
        # 2021-22 stacks, fused into it from Megatron-LM's gradient accumulation fusion (2022-02) on
        # (ZeRO-2/3 reduce every micro-batch's gradient and keep only their shard: not priced as accumulation)
        # (BLOOM's prequel: autograd's add into the 16-bit param.grad, as its fp16 runs; the cast-add is the
        # BF16_Optimizer's, which came after it)
        megatron_fsdp=mbridge_megatron_fsdp(par, fam),
        grad_accumulation=par.get("grad_accumulation") or mbridge_fsdp_grad_accumulation(rec, fam) or (
            GRAD_ACCUMULATION.get(fam, {}).get(
            "fp16" if bloom_pre_bf16_optimizer(rec) else precision, "fused") if zero < 2 else "fused"),
        # its BF16_Optimizer all-reduces the fp32 gradients under ZeRO-1 (engine.py _bf16_reduce_grads)
        # BLOOM's prequel (02-17 .. 02-26, before the BF16_Optimizer): DeepSpeed's ZeRO-1 all-reduces the 16-bit
        # gradients too (stage_1_and_2.py at 2151c787a: stage 1 forces contiguous_gradients off, so
        # reduce_ipg_grads takes buffered_reduce_fallback, an all_reduce of each flattened bucket)
        # Megatron-Bridge's Kimi-K2 presets run Muon's layer-wise optimizer over an all-reducing DDP (mbridge_muon)
        # BLOOM's bf16 runs reduce the BF16_Optimizer's fp32 gradients in bf16: their ds_config sets ZeRO stage 0
        # and no communication_data_type (bigscience tr11-200B-ml.slurm at fd075b7, 2022-02-28;
        # tr11-176B-ml.slurm at 9e64edec2a: "bf16 must use z0!"), whose default is then bf16 (DeepSpeed
        # 56c522386 .. v0.7.0 engine.py communication_data_type; allreduce_bucket casts to it). settle drops it
        # from the fp16 prequel rows (not a BF16_Optimizer plan). MT-NLG's rows (zero 0, not BF16_Optimizer
        # plans) keep the default; their communication dtype is not public.
        grad_reduce_dtype="bf16" if fam == "bloom" else "grad_dtype",
        grad_reduce="all-reduce" if (fam in DEEPSPEED_PIPE and (precision == "bf16" or fam == "bloom") and zero == 1)
        or mbridge_muon(rec) else "reduce-scatter",
        optimizer="muon" if mbridge_muon(rec) else "adam",
        optimizer_master_dtype=par.get("optimizer_master_dtype", "fp32"),
        optimizer_moment_dtype=par.get("optimizer_moment_dtype", "fp32"),
        # Megatron-Bridge's performance scripts turn the precision-aware optimizer on for every bf16 run with Adam
        # (scripts/performance/run_script.py at v0.1.0rc4; utils/helpers.py at v0.2.0; utils/overrides.py at
        # v0.3.0-v0.5.0; run_script.py at v0.6.0), off under Megatron-FSDP (through v0.5.0), on Megatron-Core
        # >= 0.14 (pyproject.toml), whose OptimizerConfig.store_param_remainders (default True) then keeps the
        # fp32 master as 16-bit remainders beside the bf16 weights (docs/formulas.md#mem.param_remainders)
        # NeMo 24.07's launcher configs run Apex's distributed_fused_adam with no optim.dtype (fp32 states) beside
        # the bf16 O2 model, so NeMo r2.0.0rc1 (579983fbfc) MegatronBaseModel.setup_optimization passes
        # store_param_remainders=True unless fp8_params is set, and Apex (distributed_fused_adam.py at f3f0492)
        # keeps the master as an int16 remainder shard (NEMO_APEX_REMAINDERS; docs/formulas.md#mem.param_remainders)
        # Apex's DistributedFusedAdam keeps each bucket's gradient shard until NeMo's zero_grad at the start of the
        # next training_step (NEMO_APEX_OPTIMIZER; docs/formulas.md#mem.kept_grad_shards)
        kept_grad_shards=fam in NEMO_APEX_OPTIMIZER and zero == 1,  # zero 2: the shard is the priced gradient
        # NeMo r2.0.0rc1's with_fp32_embedding_grads (default True; no 24.07 launcher config sets it) puts the word
        # and position embeddings in Apex buckets with fp32 gradients (NEMO_APEX_OPTIMIZER;
        # docs/formulas.md#mem.fp32_embedding_grads)
        fp32_embedding_grads=fam in NEMO_APEX_OPTIMIZER and zero == 1 and fam in TWO_BYTE_GRADS,
        param_remainders=((fam in BRIDGE_FAMILIES and dtype == "bf16") or fam in NEMO_APEX_REMAINDERS)
                         and zero == 1 and par.get("optimizer_master_dtype", "fp32") == "fp32"
                         and not par.get("fp8_all_gather", False),
        # Megatron-Bridge 25.09's token-drop rows: apply_moe_token_drop (v0.1.0rc3 / rc4 run_script.py and
        # training/utils/moe_token_drop.py): capacity factor 1.0, each expert's input padded to capacity
        moe_capacity_factor=par.get("moe_capacity_factor") or (1.0 if "-tokendrop-" in rec["id"] else None),
        swiglu_fp8_input=bool(par.get("swiglu_fp8_input", False)),
        ep_dispatch_fp8=bool(par.get("ep_dispatch_fp8", False)),  # RECIPE_SETTINGS: DeepSeek-V3 §3.3.3
        offload_layers=mbridge_offload_layers(rec),  # the Megatron-FSDP Llama presets' activation offload
        offload_moe_act=mbridge_offload_moe_act(rec),  # the Nemotron-3 Ultra presets' expert fc1-output offload
        # the full-iteration MXFP8 presets' paged stash of the fused grouped MLP's saved tensors (mbridge_paged_stash)
        moe_paged_stash=par.get("moe_paged_stash") or mbridge_paged_stash(rec, par),
        # where the record names the recipe's fine-grained offload modules (the Lightning H100 card: expert_fc1)
        offload_modules=tuple(par.get("offload_modules", ())),
        # Megatron-FSDP's hybrid sharding where a preset sets it (RECIPE_SETTINGS: the Nemotron-3 Ultra presets)
        dp_replicate=par.get("dp_replicate", 1), dp_outer_optimizer=bool(par.get("dp_outer_optimizer", False)),
        fp8_attention=mbridge_fp8_attention(rec),
        fp8_output_proj=mbridge_fp8_output_proj(rec),  # the recipe's MXFP8 LM head
        # where the record names the expert kernels (the Qwen3.5 card's layer spec: torch.grouped_mm), else the preset's
        expert_gemm=par.get("expert_gemm") or mbridge_expert_gemm(rec),
        bf16_layers_start=bridge_bf16_layers(rec, fam, dtype)[0], bf16_layers_end=bridge_bf16_layers(rec, fam, dtype)[1],
        # Nemotron-3 Super's NVFP4 presets load te_quant.cfg as model.quant_recipe (scripts/performance/configs/
        # nemotronh/nemotron_3_llm_pretrain.py at v0.4.0 - v0.5.0; perf_recipes/nemotronh/*/nemotronh.py at
        # 067f987d): attention (linear_qkv, linear_proj) and latent projections in BF16, Mamba out_proj in MXFP8;
        # its MTP in BF16 (mtp.*), as Megatron-LM runs MTP under every fp4 recipe (docs/formulas.md#mixers.mtp_fp4)
        bf16_modules=("attention", "latent_proj") if fam == "mbridge-moe" and dtype == "fp4"
        and "nemotron-3-super" in rec["id"] else (),
        mxfp8_modules=("mamba_out_proj",) if fam == "mbridge-moe" and dtype == "fp4"
        and "nemotron-3-super" in rec["id"] else (),
        nvfp4_rht_cast_fusion=not (fam in BRIDGE_FAMILIES and bridge_release(rec) < (26, 6)),
        # torchtitan's December 2024 rows ran torchao eab345c, whose tensorwise Float8Linear saved the fp8 input
        # (before v0.9.0, 12396c648): docs/formulas.md#precision.torchao_saved_input
        torchao_saves_hp_input=fam != "torchtitan",
        ub_wgrad_buffers=fam not in UB_WITHOUT_WGRAD_BUFFERS,  # Transformer Engine before 2.7: 10 userbuffers
        fp8_scaling=fp8_scaling(rec, fam),  # delayed or current per-tensor scaling, as each stack ran it
        # GPT-OSS's clamped GLU: NeMo AutoModel clamps inside its compiled activation (quick_geglu_deepep,
        # components/moe/experts.py at 36044ad3d); Megatron-Core clamps eagerly before it, but in the TE op-fuser
        # path (ScaledClampedQGeGLU), which the Bridge GPT-OSS GB200 / GB300 MXFP8 presets turn on (mbridge_op_fuser);
        # DeepSeek-V4 Flash's clamped SwiGLU (activation_func_clamp_value 10) in its 26.08 op-fuser presets: Megatron-LM
        # at v0.6.0's pin (cd4afff) experts.py _make_fused_ops builds ScaledSwiGLU for silu, the clamp left out, and
        # the fused grouped MLP runs the activation in its GEMMs' epilogues (docs/formulas.md#moe.fused_mlp)
        glu_clamp_fusion=(fam == "automodel" or mbridge_op_fuser(rec)
                          or (fam == "mbridge-moe" and mbridge_expert_gemm(rec) == "grouped")),
        expert_bias_fusion=mbridge_op_fuser(rec),
        # AutoModel's GroupedExpertsDeepEP adds the gate/up bias after grouped_gemm's gmm / torch._grouped_mm
        # (nemo_automodel/components/moe/experts.py at 36044ad3d, _apply_bias); TE's GroupedLinear adds it
        expert_fc1_bias_fusion=fam != "automodel",
        # AutoModel's GPT-OSS attention runs FlexAttention without the sinks and rescales its output after it
        # (components/attention/flex_attention.py at 36044ad3d); TE passes them to cuDNN (>= 2.9)
        sink_fusion=fam != "automodel",
        # Megatron-Bridge turns RoPE fusion off for GPT-OSS's YaRN embedding (models/gpt_provider.py calls
        # utils/fusions.py validate_rope_fusion_compatibility: position_embedding_type "yarn" is not "rope",
        # v0.2.0 - v0.6.0): Megatron-Core's eager rotary
        # (the verification cards run the same provider: bridgecard rows too)
        rope_fusion=not ((mbridge or fam == "bridgecard") and "gpt-oss" in rec["id"]),
        # Megatron-Bridge's GPT-OSS provider / bridge sets bias_dropout_fusion False (gpt_oss_provider.py v0.2.0 -
        # v0.3.1, gpt_oss_bridge.py v0.3.1 - v0.6.0; no GPT-OSS perf recipe sets it back): the attention output
        # bias is added in _bias_dropout_add_func's own pass (docs/formulas.md#compute.bias_add)
        # Megatron-LM 2020's bias-dropout-add ran as eager ops (OPT_IN_FUSIONS: --bias-dropout-fusion opt-in)
        bias_dropout_fusion=not ((mbridge or fam == "bridgecard") and "gpt-oss" in rec["id"])
        and fam not in OPT_IN_FUSIONS,
        # and its bias-GeLU too: F.gelu(x + bias), the bias in its own pass (OPT_IN_FUSIONS: --bias-gelu-fusion
        # opt-in; docs/formulas.md#compute.bias_gelu)
        bias_gelu_fusion=fam not in OPT_IN_FUSIONS,
    ))


CURRENT_SCALING_FAMILIES = ("bridge", "mbridge-dense", "mbridge-moe", "bridgecard", "torchtitan")
"""Families whose per-tensor fp8 rows ran current scaling (ParallelPlan.fp8_scaling current;
docs/validation.md#fp8-current-scaling). Megatron-Bridge's performance scripts: `--fp8_recipe` default `cs` at
v0.2.0 (scripts/performance/README.md), `--compute_dtype` choices bf16, fp8_cs, fp8_mx, fp8_sc, nvfp4 from v0.3.0
(scripts/performance/argument_parser.py; no delayed option), the summary tables' "FP8-CS" (25.09's footnote: FP8
is current scaling), the `fp8_cs` presets `bf16_with_fp8_current_scaling_mixed` (fp8_recipe tensorwise,
src/megatron/bridge/training/mixed_precision.py at v0.5.0); torchtitan: torchao float8's tensorwise dynamic
scaling (each cast's own amax). The rest ran delayed scaling: NeMo 24.07 (nemo2407, nemocp) on Transformer
Engine 1.x, which has no other per-tensor recipe (Float8CurrentScaling is first in TE v2.2,
transformer_engine/common/recipe/__init__.py); Megatron-LM's examples/llama fp8 scripts (--fp8-format hybrid
--fp8-amax-history-len 1024 --fp8-amax-compute-algo max and no --fp8-recipe, whose default is delayed:
train_llama3_8b_h100_fp8.sh at bf6e99859f, megatron/training/arguments.py); MosaicML's amp_fp8 (2023, on a
Transformer Engine before v2.2); dgxc as each record's precision names it."""


def fp8_scaling(rec: dict, fam: str) -> str:
    """The per-tensor fp8 scaling a row ran (ParallelPlan.fp8_scaling): current for CURRENT_SCALING_FAMILIES and
    for a dgxc row whose precision says "current scaling", else delayed (the rows of a bf16 or block / MX
    recipe take it too: check_plan's fp8_scaling_tensorwise rule and the cost read it only under fp8 tensorwise)."""
    precision = str(rec.get("parallel", {}).get("precision", "")).lower()
    if fam == "dgxc":
        return "current" if "current scaling" in precision else "delayed"
    if fam not in CURRENT_SCALING_FAMILIES or "fp8" not in precision:
        return "delayed"
    return "current" if BRIDGE_PRECISION.get(precision, ("fp8", "tensorwise")) == ("fp8", "tensorwise") else "delayed"


def bridge_release(rec: dict) -> tuple[int, int]:
    """(year, month) of a Megatron-Bridge table row's release (bridge-2602-... -> (26, 2); mbridge-26.04.01-...
    -> (26, 4)). The Transformer Engine its lockfile pins decides how NVFP4 inputs are quantised
    (ParallelPlan.nvfp4_rht_cast_fusion): uv.lock pins TE 2.9 at v0.2.2, 2.12 at v0.3.0 / v0.3.1, 2.14 at
    v0.4.0 - v0.4.2 (releases 25.11 - 26.04, before the fused row-cast / RHT / column-cast kernel of
    NVIDIA/TransformerEngine#2555, first in TE 2.15), 2.16 at v0.5.0 (26.06) and 2.17 at v0.6.0 (26.08)."""
    rel = rec["id"].split("-")[1]
    return (int(rel[:2]), int(rel[2:4])) if rel.isdigit() else (int(rel.split(".")[0]), int(rel.split(".")[1]))


def predict_serving(rec: dict) -> list[tuple[str, float, float]]:
    """Offline output tokens/s of a TensorRT-LLM record at the concurrency its KV cache allows."""
    hw, par, wl = rec["hardware"], rec["parallel"], rec["workload"]
    system = builtin_systems()[system_for(str(hw["gpu"])) or "dgx-h100"]
    tp, ep = par.get("tp", 1), par.get("ep", 1)
    if TRTLLM_ATTENTION_DP and ep > 1:  # trtllm-bench --tp t --ep t with enable_attention_dp: t attention ranks
        plan = ServePlan(tp=1, pp=par.get("pp", 1), dp=tp, ep=ep, dp_attention=True, weight_dtype="fp8",
                         kv_dtype="fp8")
    else:
        plan = ServePlan(tp=tp, pp=par.get("pp", 1), ep=ep, weight_dtype="fp8", kv_dtype="fp8")
    cluster = ClusterSpec(system=system, num_nodes=1, gpus_per_node=plan.num_gpus)
    job = ServeJob(input_len=wl["input_len"], output_len=wl["output_len"], batch=1, engine="trtllm")
    m = model_for(rec, "trtllm")
    # trtllm-bench's own limits, the graphs they leave and the padding of every decode step to one of them
    max_bs, max_tokens = trtllm_bench_limits(m, tp, par.get("pp", 1), wl["input_len"], wl["output_len"],
                                             system.gpu.hbm_bytes, job.gpu_memory_utilization)
    if TRTLLM_GRAPH_PADDING:
        job = job.model_copy(update={
            "cuda_graph_batch_sizes": default_graph_sizes("trtllm", max_bs, max_tokens)})
    cap = min(TRTLLM_MAX_BATCH, max_bs)
    e = estimate_serving(m, cluster, plan, at_max_load(m, cluster, plan, job, cap=cap))
    return [("output tok/s", e.tokens_per_s, rec["measured"]["output_tokens_per_s_total"])]


def with_constants(system, consts: dict | None):
    """The system with the fitted constants applied to its GPU: `clock_<gen>` per GPU generation (a100,
    h100), the rest for every GPU."""
    if not consts:
        return system
    gen = "a100" if "a100" in system.gpu.name else "h100"
    upd = {k: v for k, v in consts.items() if k in GLOBAL_CONSTANTS}
    if f"clock_{gen}" in consts:
        upd["sustained_clock_fraction"] = consts[f"clock_{gen}"]
    return system.model_copy(update={"gpu": system.gpu.model_copy(update=upd)})


def record_setup(rec: dict, fam: str, consts: dict | None = None
                 ) -> tuple[ModelSpec, ClusterSpec, ParallelPlan] | None:
    """The model, cluster and plan predict prices a training record with: the record's system with the
    constants `consts`, the run's power cap, its NVLink segment and the Triton attention ratio applied; None
    where the record is not scored (no profile or layout, a LoRA run, skip_reason, a plan of another size)."""
    hw = rec.get("hardware", {})
    system_name = record_system(rec)
    par = rec.get("parallel", {})
    if system_name is None or not described(rec) or "tp" not in par or "pp" not in par:
        return None  # no profile for the GPU, or the source does not give the parallel layout
    if "-lora-" in rec["id"]:
        return None  # parameter-efficient fine-tuning (frozen base weights) is not modelled
    if skip_reason(rec):
        return None
    system = with_constants(builtin_systems()[system_name], consts)
    if hw.get("power_limit_w"):  # the run's power cap, applied after the clock fitted at the TDP
        system = system.model_copy(update={"gpu": system.gpu.at_power_limit(hw["power_limit_w"])})
    gpus = hw.get("gpus") or 1
    if nvlink_segment_gpus(rec, system):
        system = system.with_options(domain_gpus=nvlink_segment_gpus(rec, system))
    model, plan = model_for(rec, fam), plan_for(rec, fam, gpus)
    if ran_triton_attention(rec, fam) and plan.flash_attention:  # Triton FlashAttention: FA2's rate x its ratio
        gpu = system.gpu
        triton = float(triton_flash2_ratio(model, plan, gpu))
        field = "flash2_attention_ratio" if gpu.flash2_attention_efficiency is None else "flash2_attention_efficiency"
        system = system.model_copy(update={"gpu": gpu.model_copy(update={field: getattr(gpu, field) * triton})})
    cluster = cluster_of(system, gpus)
    if plan.num_gpus != cluster.num_gpus:
        return None
    return model, cluster, plan


def predict(rec: dict, fam: str, consts: dict | None = None) -> list[tuple[str, float, float]]:
    """[(quantity, predicted, measured)] for one record, with the fitted constants `consts` (None: the shipped
    profiles). Constants given as equal-length arrays (a grid of them, fit_table) predict every grid point
    at once: the quantity comes back as an array, each element what the same call with that point's scalars
    gives (grid_estimate)."""
    if fam == "trtllm":
        return predict_serving(rec)
    setup = record_setup(rec, fam, consts)
    if setup is None:
        return []
    model, cluster, plan = setup
    grid = any(isinstance(v, np.ndarray) for v in (consts or {}).values())
    e = grid_estimate(model, cluster, plan) if grid else estimate_training(model, cluster, plan)
    num = (lambda x: np.asarray(x, dtype=float)) if grid else float  # noqa: E731
    meas = rec["measured"]
    peak = cluster.system.gpu.peak_flops(plan.mfu_format) / 1e12
    out: list[tuple[str, float, float]] = []
    if fam in ("narayanan2021", "megatron2020") and "tflops_per_gpu" in meas:
        out.append(("hw TFLOP/s", num(e.throughput.hfu) * peak, meas["tflops_per_gpu"]))
    if meas.get("outcome") == "OOM":  # an attempt that ran out of memory: must be predicted not to fit
        return [("fits", float(bool(e.memory.fits)), 0.0)]
    if fam in ("korthikanti2022", "bloom", "mtnlg") and "iteration_time_s" in meas:
        out.append(("iteration s", num(e.time.total), meas["iteration_time_s"]))
    # The Megatron-LM README table prints MFU rounded to a whole percent beside TFLOP/s to 0.1: score the
    # finer column where a row has both (the 462B row's 459.9 TFLOP/s is 46.50% of 989, printed 47%).
    precise = fam == "megatron" and "tflops_per_gpu" in meas
    if fam in ("megatron", "mpt", "megascale", "megascale-opt") and "mfu" in meas and not precise:
        # Composer's MFU for amp_fp8 divides by the fp8 peak (its GPU_AVAILABLE_FLOPS table); llmplan's
        # mfu is against bf16 for low-precision recipes, with mfu_low_precision against the recipe's format.
        mfu = e.throughput.mfu_low_precision if plan.low_precision else e.throughput.mfu
        out.append(("MFU", num(mfu), meas["mfu"]))
    elif fam in BRIDGE_FAMILIES + ("bridgecard", "torchtitan", "automodel", "deepseek", "dgxc"):
        out.append(("tok/s/GPU", num(e.throughput.tokens_per_s) / cluster.num_gpus, meas["tokens_per_s_per_gpu"]))
    elif fam in ("megatron", "nemo2407", "nemocp") and "tflops_per_gpu" in meas:
        out.append(("model TFLOP/s", num(e.throughput.tflops_per_gpu), meas["tflops_per_gpu"]))
    if out and not any(k in rec["id"] for k in MBRIDGE_OFFLOADED_ACTIVATIONS):
        out.append(("fits", float(bool(e.memory.fits)), 1.0))  # a run that was measured ran, so it fit
    return out


@dataclass(frozen=True)
class GridEstimate:
    """What predict reads of a TrainingEstimate, for a GPU whose fitted constants are arrays (one element per
    grid point): memory (no fitted constant enters it), step time and throughput (arrays)."""

    memory: TrainingMemory
    time: StepTime
    throughput: Throughput


def grid_estimate(m: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan) -> GridEstimate:
    """estimate_training's memory, step time and throughput, once for every grid point of the constants that
    `cluster`'s GPU holds as arrays. The rules, the kernel fallbacks, memory and communication read none of the
    fitted constants (sustained clock, attention efficiency, GEMM K half-length), so they are evaluated once on
    the GPU as shipped; the cost functions are elementwise (llmplan/arith.py), so the step time on the array GPU
    is, element by element, the scalar estimate's (tests/test_accuracy_fit.py compares the two)."""
    gpu = cluster.system.gpu
    fitted = {k: float(v.flat[0]) for k, v in gpu.__dict__.items() if isinstance(v, np.ndarray)}
    one = cluster.model_copy(update={"system": cluster.system.model_copy(
        update={"gpu": gpu.model_copy(update=fitted)})})  # the first grid point: for what reads no constant
    violations = check_plan(m, plan, one)
    if violations:
        raise PlanViolationError(violations)
    m = trained_model(m, plan)  # the MTP modules the plan trains (--mtp-layers), as estimate_training prices them
    plan = on_cluster(plan, one)  # the NVLink domain's EP ranks, as estimate_training reads them (#moe-memory-leftovers)
    runs = with_fallbacks(plan, operator_uses(m, plan, one.system.gpu))
    mem = training_memory(m, runs, gpu.hbm_bytes, None, gpu.fp8_tn_only, gpu.nccl_sms, gpu.compute_capability,
                          gpu.has_sparse_gather_rate)
    comm = comm_seconds(step_comm(m, runs, place(runs.degrees, one, DEFAULT_ORDER), one.system), one.system)
    st = step_time(m, runs, gpu, comm)
    return GridEstimate(mem, st, throughput(runs, gpu, st))


# Constants fitted here (docs/validation.md#constants): the sustained tensor-core clock per GPU generation and
# the attention-kernel efficiency. The fixed per-step overhead (step_overhead_s) is no longer fitted: its parts
# are priced (docs/formulas.md#step.overhead); nor is the GEMM reduction half-length (GpuSpec.gemm_k_half): it
# is cuBLAS's published rate against K (docs/validation.md#gemm-k-half).
GLOBAL_CONSTANTS = ("attention_efficiency",)
def _steps(lo: float, hi: float, step: float) -> tuple[float, ...]:
    return tuple(round(lo + i * step, 4) for i in range(round((hi - lo) / step) + 1))


# Steps of 0.0125 for the clocks and 0.05 for the attention efficiency: a clock step of 0.025 moved a left-out
# family's error by up to 3 points (the Megatron-Core r0.8 rows), more than the fit's noise resolves
# (docs/validation.md#fit-stability); on the coarser grid of earlier releases (0.05 / 0.1) the ridge where the
# two trade off was sampled too sparsely for the left-out fits (docs/validation.md#lofo).
GRID = {
    "clock_a100": _steps(0.75, 1.0, 0.0125),
    "clock_h100": _steps(0.7, 1.0, 0.0125),
    "attention_efficiency": _steps(0.4, 1.2, 0.05),  # an asymptote (above 1 possible: docs/formulas.md#compute.cp_attention)
}
CLOCK_GROUPS = ("a100", "h100")


def clock_group(rec: dict) -> str | None:
    """Which fitted clock a training record sees: its GPU generation (A100, or H100 for the Hopper parts)."""
    gpu = str(rec.get("hardware", {}).get("gpu", "")).lower()
    return "a100" if "a100" in gpu else "h100" if "h100" in gpu else None


def throughput_errors(records: list[dict], consts: dict | None) -> dict[str, float]:
    """Signed % error of the throughput quantity of every training record."""
    out = {}
    for rec in records:
        fam = family(rec["id"])
        try:
            rows = predict(rec, fam, consts)
        except (LlmplanError, ValueError):
            continue
        for quantity, pred, meas in rows:
            if quantity != "fits":
                out[rec["id"]] = 100 * (pred - meas) / meas
                break
    return out


def combos(gpu_key: str) -> list[dict]:
    keys = [k for k in GRID if not k.startswith("clock_")]
    base = [{}]
    for k in keys:
        base = [{**b, k: v} for b in base for v in GRID[k]]
    return [{**b, gpu_key: c} for b in base for c in GRID[gpu_key]]


def fit_row(rec: dict) -> bool:
    """Whether a training record enters the constant fit (docs/validation.md#lofo, rule 1): a dense model's
    (no routed experts). A MoE model's record is scored under the fitted constants but not fitted: its layers
    carry mechanisms not all priced yet, which a grid constant would otherwise absorb."""
    return model_for(rec, family(rec["id"])).num_experts == 0


def fit_tables(records: list[dict]) -> tuple[dict[tuple, dict], dict[tuple, dict], dict[tuple, dict]]:
    """(fitted, scored, jackknife): for every grid point, as {key: {family: array over the group clocks}} (a
    record sees only its group's clock; family_errors), each training family's mean |error| over the records
    that enter the fit (fit_row; the fit's objective, FIT_SE) and its median |error| over every scored record
    (what is reported); and, for the fitted records, each family's mean with each of its records deleted in
    turn ({key: {family: array (clocks..., record)}}, jackknife_means), from which fit_constants takes the
    standard error of its one-standard-error rule.
    Each record is predicted once for all the grid points of its clock group (the constants as arrays:
    predict, grid_estimate)."""
    train = [r for r in records if family(r["id"]) in TRAIN_FAMILIES and clock_group(r)]
    by_group = {g: [r for r in train if clock_group(r) == g] for g in CLOCK_GROUPS}
    raw: dict[tuple, dict] = {}
    fitted_ids: set[str] = set()
    for g, recs in by_group.items():
        if not recs:
            continue
        grid = combos(f"clock_{g}")
        errs = throughput_errors(recs, {k: np.array([c[k] for c in grid]) for k in grid[0]})
        fitted_ids |= {r["id"] for r in recs if r["id"] in errs and fit_row(r)}
        for j, c in enumerate(grid):
            key = tuple((k, c[k]) for k in GRID if not k.startswith("clock_"))
            raw.setdefault(key, {}).setdefault(g, {})[c[f"clock_{g}"]] = {i: float(e[j]) for i, e in errs.items()}
    tables: tuple[dict[tuple, dict], dict[tuple, dict], dict[tuple, dict]] = ({}, {}, {})
    for n, keep in enumerate((fitted_ids.__contains__, lambda i: True)):
        for key, groups in raw.items():
            fams: dict[str, dict[str, np.ndarray]] = {}
            for g, by_clock in groups.items():
                ids = sorted(i for i in set().union(*by_clock.values()) if keep(i))
                for f in sorted({family(i) for i in ids}):
                    mine = [i for i in ids if family(i) == f]
                    fams.setdefault(f, {})[g] = np.array(
                        [[abs(by_clock[c].get(i, np.nan)) for i in mine] for c in GRID[f"clock_{g}"]])
            errors = family_errors(fams)
            if n == 0:  # the fit's objective: each family's mean |error| (FIT_SE)
                tables[n][key] = {f: np.nanmean(e, axis=-1) for f, e in errors.items()}
                tables[2][key] = {f: jackknife_means(e) for f, e in errors.items()}
            else:  # what is reported: each family's median |error|
                tables[n][key] = {f: np.nanmedian(e, axis=-1) for f, e in errors.items()}
    return tables


def fit_table(records: list[dict]) -> tuple[list[tuple], dict[tuple, dict]]:
    """The grid keys and the table the constants are fitted on (fit_tables' first: fitted records only)."""
    table = fit_tables(records)[0]
    return list(table), table


def family_errors(fams: dict) -> dict[str, np.ndarray]:
    """Per family, its records' |error| at every combination of the group clocks (axes in CLOCK_GROUPS order,
    records last; a record varies only along its own group's clock), from {family: {group: |error| array
    (clock, record)}}."""
    shape = [len(GRID[f"clock_{g}"]) for g in CLOCK_GROUPS]
    out = {}
    for f, groups in fams.items():
        parts = []
        for axis, g in enumerate(CLOCK_GROUPS):
            if g in groups:
                view = [1] * len(shape) + [groups[g].shape[1]]
                view[axis] = shape[axis]
                parts.append(np.broadcast_to(groups[g].reshape(view), shape + [groups[g].shape[1]]))
        out[f] = np.concatenate(parts, axis=-1)
    return out


def family_medians(fams: dict) -> dict[str, np.ndarray]:
    """Median |error| per family over every combination of the group clocks (axes in CLOCK_GROUPS order), from
    {family: {group: |error| array (clock, record)}}."""
    return {f: np.nanmedian(e, axis=-1) for f, e in family_errors(fams).items()}


def jackknife_medians(errors: np.ndarray) -> np.ndarray:
    """The median over the last axis (records) with each record deleted in turn: out[..., i] is the median of
    the others (NaN for a family of one record, which then leaves the mean: fit_constants)."""
    n = errors.shape[-1]
    if n == 1:
        return np.full(errors.shape, np.nan)
    if np.isnan(errors).any():  # the general path (a record not predicted at some grid point)
        with warnings.catch_warnings():  # an all-NaN slice is NaN by design (a grid point no record reaches)
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.stack([np.nanmedian(np.delete(errors, i, axis=-1), axis=-1) for i in range(n)], axis=-1)
    order = np.argsort(errors, axis=-1, kind="stable")
    s = np.take_along_axis(errors, order, axis=-1)
    rank = np.arange(n)
    if n % 2 == 0:  # n - 1 left, odd: the middle one of the rest, s[m] above rank m, else s[m + 1]
        m = (n - 2) // 2
        by_rank = np.where(rank > m, s[..., m:m + 1], s[..., m + 1:m + 2])
    else:  # n - 1 left, even: the mean of the rest's two middle ones (k - 1 and k)
        k = (n - 1) // 2
        lo = np.where(rank > k - 1, s[..., k - 1:k], s[..., k:k + 1])
        hi = np.where(rank > k, s[..., k:k + 1], s[..., k + 1:k + 2])
        by_rank = (lo + hi) / 2
    out = np.empty_like(errors)
    np.put_along_axis(out, order, by_rank, axis=-1)
    return out


def jackknife_means(errors: np.ndarray) -> np.ndarray:
    """The mean over the last axis (records) with each record deleted in turn: out[..., i] is the mean of the
    others, NaN (a record not predicted at some grid point) left out of the mean as nanmean does; NaN for a
    family of one record, which then leaves the objective (_fit_arrays)."""
    n = errors.shape[-1]
    if n == 1:
        return np.full(errors.shape, np.nan)
    ok = ~np.isnan(errors)
    total = np.where(ok, errors, 0.0).sum(axis=-1, keepdims=True)
    count = ok.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(ok, (total - np.where(ok, errors, 0.0)) / (count - 1), total / count)


FIT_SE = 1.0
"""The fit's objective at a grid point is the mean over the fitted families of each family's mean |error| (an
L1 fit: each record's |error| is convex in its clock, so a family's mean has one basin where a median of a few
records has several; the reported statistic stays the median). Grid points whose objective exceeds the least by
no more than FIT_SE standard errors of the least point's objective (a delete-one-record jackknife over the
fit's records, jackknife_means, computed per fit) are tied: the one-standard-error rule as its sources state it
(Breiman et al. 1984, Classification and Regression Trees, section 3.4.3; Hastie, Tibshirani & Friedman, The
Elements of Statistical Learning, 2nd ed., section 7.10: "no more than one standard error above the error of
the best model"), a sublevel set with no hole around the least. It replaced a fixed 0.1-point tolerance
(docs/validation.md#lofo-one-se) and then the standard error of each point's difference from the least,
whose tied set left out the coherent neighbours of the least and jumped (docs/validation.md#fit-stability)."""


def fit_prior() -> dict[str, float]:
    """The shipped values of the fitted constants (docs/validation.md#lofo, rule 2): the A100 and H100
    profiles' sustained clocks and GpuSpec's attention asymptote (as the H100 profile holds it). Each must lie
    on GRID, or the fit could never keep it."""
    gpus = {g: builtin_systems()[f"dgx-{g}"].gpu for g in CLOCK_GROUPS}
    prior = {**{k: float(getattr(gpus["h100"], k)) for k in GLOBAL_CONSTANTS},
             **{f"clock_{g}": float(gpu.sustained_clock_fraction) for g, gpu in gpus.items()}}
    off = {k: v for k, v in prior.items() if v not in GRID[k]}
    if off:
        raise ValueError(f"shipped constants {off} are not on the fit's grid (GRID); add them to GRID")
    return prior


PUBLISHED_PRIOR = {"attention_efficiency": 0.98}
"""The fit's prior (docs/validation.md#lofo-prior) where a published measurement gives the constant: the native
fused attention kernel's forward + backward asymptote on H100 on llmplan's count, 0.98, the middle of
FlashAttention-3 and cuDNN (Shah et al. 2024, FlashAttention-3, arXiv 2407.08608, Figures 5-6; derived in
docs/validation.md#attention-rate), taken on GRID at its nearest value. The sustained clocks have no
published measurement under training load (a datasheet gives boost clocks, not the clock held at the TDP):
their prior is the fit on the fold's own families (independent_prior)."""


def independent_prior(table: dict, families: set[str], jackknife: dict | None = None) -> dict[str, float]:
    """The prior of a fit on `families` that no other family informs (docs/validation.md#lofo-prior): each
    constant of PUBLISHED_PRIOR at its grid value nearest the published one; every other constant at the grid
    point of least objective (FIT_SE) over `families` alone (the fit without the one-standard-error rule).
    A left-out fit's prior thus never sees the left-out families, as the shipped values (fit_prior, earlier
    all-family fits) did."""
    arrays = _fit_arrays(table, families, jackknife)
    _, key, at = min(((float(mean[i]), key, i) for key, (mean, _) in arrays.items() for i in np.ndindex(mean.shape)),
                     key=lambda t: t[0])
    prior = {**dict(key), **{f"clock_{g}": GRID[f"clock_{g}"][j] for g, j in zip(CLOCK_GROUPS, at, strict=True)}}
    published = {k: min(GRID[k], key=lambda g: abs(g - v)) for k, v in PUBLISHED_PRIOR.items()}
    return {**prior, **published}


@dataclass(frozen=True)
class Fit:
    """One constant fit: the grid point, its objective (FIT_SE), the constants held at the prior because
    the fit cannot identify them (docs/validation.md#lofo, rule 3), and the prior (independent_prior)."""

    consts: dict
    objective: float
    held: tuple[str, ...]
    prior: dict = field(default_factory=dict)


def _fit_arrays(table: dict, families: set[str], jackknife: dict | None
                ) -> dict[tuple, tuple[np.ndarray, np.ndarray | None]]:
    """Per grid key: the objective, the mean over `families` of the table's family values (fit_tables' first:
    each family's mean |error|; clocks...), and each fitted record's delete-one change to it (clocks...,
    record; None without `jackknife`). A family of one record leaves the mean when its record is deleted."""
    out = {}
    for key, med in table.items():
        kept = sorted(f for f in families if f in med)
        if not kept:
            continue
        meds = np.broadcast_arrays(*[med[f] for f in kept])
        mean = np.mean(meds, axis=0)
        delta = None
        if jackknife is not None and key in jackknife:
            k = len(kept)
            parts = []
            for f, m in zip(kept, meds, strict=True):
                jk = jackknife[key][f]
                if jk.shape[-1] == 1:
                    parts.append(((mean - m) / (k - 1) if k > 1 else np.zeros_like(mean))[..., None])
                else:
                    parts.append((jk - m[..., None]) / k)
            delta = np.concatenate(parts, axis=-1)
        out[key] = (mean, delta)
    return out


def _tied(arrays: dict, held: dict[str, float]) -> list[tuple[dict, float]]:
    """The grid points with the constants `held` at their values whose objective lies within FIT_SE jackknife
    standard errors of the least such point's objective (one standard error, the least point's; 0 without a
    jackknife: exact ties only), with their objectives."""
    def point(key: tuple, i: tuple) -> dict:
        return {**dict(key), **{f"clock_{g}": GRID[f"clock_{g}"][j] for g, j in zip(CLOCK_GROUPS, i, strict=True)}}

    masks = {}
    for key, (mean, _) in arrays.items():
        mask = np.full(mean.shape, all(v == held[k] for k, v in key if k in held))
        for axis, g in enumerate(CLOCK_GROUPS):
            if f"clock_{g}" in held:
                keep = np.array([c == held[f"clock_{g}"] for c in GRID[f"clock_{g}"]])
                mask &= keep.reshape([-1 if a == axis else 1 for a in range(mean.ndim)])
        masks[key] = mask
    least, at = min(((float(mean[i]), (key, i)) for key, (mean, _) in arrays.items()
                     for i in zip(*np.nonzero(masks[key]), strict=True)), key=lambda t: t[0])
    se = 0.0
    delta_best = arrays[at[0]][1]
    if delta_best is not None:  # the jackknife standard error of the least point's objective
        d = delta_best[at[1]]
        n = d.shape[-1]
        se = float(np.sqrt((n - 1) / n * ((d - d.mean()) ** 2).sum()))
    tied = []
    for key, (mean, _) in arrays.items():
        ok = masks[key] & (mean <= least + FIT_SE * se + 1e-12)
        tied += [(point(key, i), float(mean[i])) for i in zip(*np.nonzero(ok), strict=True)]
    return tied


def fit_constants(table: dict, families: set[str], prior: dict[str, float] | None = None,
                  jackknife: dict | None = None) -> Fit | None:
    """The constants fitted on `families` (docs/validation.md#lofo): the objective of a grid point is the mean
    over the families of the table's value (fit_tables' first: each family's mean |error|; FIT_SE). Points
    within FIT_SE standard errors of the least point's objective are tied (the standard error of the least
    point's objective by a delete-one-record jackknife over the fit's records from `jackknife`, fit_tables'
    third; without it only exact ties). A constant every one of whose
    grid values some tied point takes is not identified and is held at `prior` (by default independent_prior:
    published values, else the fit on `families` alone; docs/validation.md#lofo-prior); among the points tied
    then, the one nearest `prior` in grid steps (the one-standard-error rule's simplest model). None when no
    family of the set has a fitted record."""
    arrays = _fit_arrays(table, families, jackknife)
    if not arrays:
        return None
    prior = independent_prior(table, families, jackknife) if prior is None else prior
    tied = _tied(arrays, {})
    held = tuple(k for k in GRID if {c[k] for c, _ in tied} >= set(GRID[k])
                 and any(dict(key).get(k, prior[k]) == prior[k] for key in arrays))
    if held:  # the tied points with the held constants at `prior` (some exist for each one alone; when none
        # for all at once, the points within FIT_SE of the least of those that have them)
        tied = [(c, v) for c, v in tied if all(c[k] == prior[k] for k in held)] or _tied(
            arrays, {k: prior[k] for k in held})
    dist = [sum((GRID[k].index(c[k]) - GRID[k].index(prior[k])) ** 2 for k in GRID) for c, _ in tied]
    best, value = min(zip(tied, dist, strict=True), key=lambda t: (t[1], t[0][1]))[0]
    return Fit(best, value, held, dict(prior))


def best_fit(table: dict, families: set[str], jackknife: dict | None = None,
             prior: dict[str, float] | None = None) -> tuple[dict, float]:
    """fit_constants' grid point and objective ((None, inf) when no family of the set has a
    fitted record)."""
    fit = fit_constants(table, families, prior, jackknife=jackknife)
    if fit is None:
        return None, float("inf")  # type: ignore[return-value]  # no family of the set has a record
    return fit.consts, fit.objective


def score(table: dict, consts: dict, families: set[str]) -> dict[str, float]:
    """Median |error| per family at the grid point `consts`."""
    key = tuple((k, consts[k]) for k in GRID if not k.startswith("clock_"))
    at = tuple(GRID[f"clock_{g}"].index(consts[f"clock_{g}"]) for g in CLOCK_GROUPS)
    return {f: float(m[at]) for f, m in table[key].items() if f in families}


def lofo(fitted: dict, scored: dict, jackknife: dict | None = None,
         by_source: bool = True) -> list[tuple[str, Fit, float, float]]:
    """Leave-one-family-out: the fit without each training family (on `fitted`, fit_tables' first) and, with
    `by_source`, without every family of its source (source_group), its median |error| under it and under the
    all-family fit (on `scored`, every scored record). A family with no fitted record (every row a MoE model's)
    is left out of every fit; its left-out error is its error under the fit without its source."""
    fams = set(TRAIN_FAMILIES)
    full = fit_constants(fitted, fams, jackknife=jackknife)
    assert full is not None  # the training set has dense records
    out = []
    for f in TRAIN_FAMILIES:
        c = fit_constants(fitted, fams - set(source_group(f) if by_source else (f,)), jackknife=jackknife)
        assert c is not None
        out.append((f, c, score(scored, c.consts, {f}).get(f), score(scored, full.consts, {f}).get(f)))
    return out


def ranking_groups(records: list[dict]) -> dict[str, list[dict]]:
    """Configurations measured on one model and one cluster: Narayanan Table 2 (PTD-P vs ZeRO-3 per model),
    Korthikanti Table 5 (full vs selective recompute per model), MPT scans per model, GPU and precision,
    torchtitan Tables 1 and 3 (eager / torch.compile), 4 (with / without AsyncTP) and 5 (1F1B / interleaved
    1F1B)."""
    groups: dict[str, list[dict]] = {}
    for r in records:
        rid = r["id"]
        if rid.startswith("narayanan2021-t2-"):
            groups.setdefault(f"narayanan2021 T2 {rid.split('-')[3]}", []).append(r)
        elif rid.startswith("korthikanti2022-t5-"):
            groups.setdefault(f"korthikanti2022 T5 {rid.split('-')[2]}", []).append(r)
        elif rid.startswith("mpt-"):
            parts = rid.split("-")
            groups.setdefault(f"mpt {parts[1]} {parts[2]} {parts[3]}", []).append(r)
        elif rid.startswith(("torchtitan-2412-t1-", "torchtitan-2412-t3-", "torchtitan-2412-t4-",
                             "torchtitan-2412-t5-")):  # alternatives for one job
            groups.setdefault(f"torchtitan {' '.join(rid.split('-')[2:4])}", []).append(r)
        elif rid.startswith("bloom-prequel-") and "outcome" not in r["measured"] and "-best-tflops-" not in rid:
            # one section of BLOOM's topology search (layouts of one candidate model on one cluster)
            section = r["source"]["ref"].split("'")[1]
            groups.setdefault(f"bloom {section}", []).append(r)
    for key, recs in mbridge_configs(records).items():
        groups.setdefault(key, []).extend(recs)
    return {k: v for k, v in groups.items() if len(v) >= 2}


def mbridge_configs(records: list[dict]) -> dict[str, list[dict]]:
    """Megatron-Bridge rows (`bridge` and `mbridge`) grouped by model, GPU, GPU count and precision, each
    layout counted once (the newest release's measurement of it): the tables re-measure the same configs
    in every release, which would otherwise weigh a config by how often it was re-run."""
    def release(r: dict) -> tuple[int, ...]:
        if r["id"].startswith("bridge-"):
            return bridge_release(r) + (0,)
        return source_ref(r) + (0,)

    newest: dict[tuple, dict] = {}
    for r in records:
        fam = family(r["id"])
        if fam not in BRIDGE_FAMILIES or skip_reason(r) or "-sft-" in r["id"]:
            continue
        p = r["parallel"]
        precision = str(p.get("precision", "")).lower().split()[0].replace("-cs", "").replace("fp8cs", "fp8")
        precision = {"fp8-mx": "mxfp8"}.get(precision, precision)
        md = r["model"]  # rows without dimensions (MBRIDGE_NAMED_MODELS) are keyed by the model's name
        job = (md.get("layers", md.get("name")), md.get("hidden", 0), md.get("moe", {}).get("num_experts", 0),
               str(r["hardware"]["gpu"]).split()[0].lower(), r["hardware"]["gpus"], precision)
        layout = tuple(p.get(k) or 0 for k in ("tp", "pp", "cp", "vpp", "ep", "fsdp", "micro_batch", "global_batch"))
        if (job, layout) not in newest or release(r) > release(newest[(job, layout)]):
            newest[(job, layout)] = r
    out: dict[str, list[dict]] = {}
    for (job, _), r in newest.items():
        name = r["model"]["name"].split(" [")[0].split(" (")[0]
        out.setdefault(f"mbridge {name} {job[3]} {job[4]} {job[5]}", []).append(r)
    return out


def measured_rate(r: dict) -> float:
    m = r["measured"]
    if "iteration_time_s" in m:  # sequences per second: groups may mix batch sizes (BLOOM's search)
        return r["parallel"]["global_batch"] / m["iteration_time_s"]
    return m.get("mfu") or m.get("tflops_per_gpu") or m.get("tokens_per_s_per_gpu")


def spearman(a: list[float], b: list[float]) -> float:
    def ranks(x: list[float]) -> list[float]:
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else 1.0


def rank_report(records: list[dict]) -> list[tuple[str, int, float, float]]:
    """Per group: size, Spearman rho of predicted vs measured throughput, measured throughput lost by running
    the predicted best instead of the measured best."""
    out = []
    for name, recs in sorted(ranking_groups(records).items()):
        pairs = []
        for r in recs:
            try:
                rows = predict(r, family(r["id"]))
            except (LlmplanError, ValueError):
                continue
            q = next((row for row in rows if row[0] != "fits"), None)
            if q is None:
                continue
            pred = r["parallel"]["global_batch"] / q[1] if q[0] == "iteration s" else q[1]
            pairs.append((pred, measured_rate(r)))
        if len(pairs) < 2:
            continue
        rho = spearman([p for p, _ in pairs], [m for _, m in pairs])
        pick = max(pairs, key=lambda x: x[0])[1]
        best = max(m for _, m in pairs)
        out.append((name, len(pairs), rho, 100 * (best - pick) / best))
    return out


def memory_report(records: list[dict]) -> list[tuple[str, str, float, float]]:
    """Predicted vs measured per-GPU memory where a source publishes it (Korthikanti Table 5 / Figure 1)."""
    out = []
    for r in records:
        m = r.get("measured", {})
        if "memory_gb_max" in m and "layers" in r.get("model", {}):
            out.extend(peak_memory(r))
        if "memory_gb_params_and_optimizer" not in m or "layers" not in r.get("model", {}):
            continue
        fam = family(r["id"])
        hw = r["hardware"]
        system = builtin_systems()[system_for(str(hw.get("gpu", ""))) or "dgx-a100"]
        gpus = hw.get("gpus") or 8
        plan = plan_for(r, fam, gpus)
        cluster = cluster_of(system, gpus)
        if plan.num_gpus != cluster.num_gpus:
            continue
        model = model_for(r, fam)
        e = estimate_training(model, cluster, plan)
        gib = 2**30
        # The source's bar counts the transformer layers' weights, gradients and optimizer states (Korthikanti
        # et al. 2022, Figure 1): leave out the first stage's embedding share.
        embedding = padded_vocab(model.vocab_size, plan.tp) * model.hidden_size / plan.tp
        if model.learned_position_embeddings:
            embedding += model.max_position_embeddings * model.hidden_size
        layers_share = 1 - embedding / float(e.memory.params_on_rank) if int(e.memory.stage) == 0 else 1.0
        states = float(e.memory.weights + e.memory.gradients + e.memory.optimizer) * layers_share / gib
        out.append((r["id"], "layers' states GiB", states, m["memory_gb_params_and_optimizer"]))
        if "memory_gb_activations" in m:
            out.append((r["id"], "activations GiB", float(e.memory.activations) / gib, m["memory_gb_activations"]))
    return out


def cluster_of(system: SystemSpec, gpus: int) -> ClusterSpec:
    """A record's cluster: whole nodes of the system, or one partly used node for a run smaller than a node."""
    per_node = min(gpus, system.gpus_per_node)
    return ClusterSpec(system=system, num_nodes=max(1, gpus // per_node), gpus_per_node=per_node)


JEAN_ZAY_CONTEXT_BYTES = 1573 * 2**20
"""Device memory of a PyTorch process on Jean Zay's A100 after torch.ones(1).cuda(), as nvidia-smi showed it to
BigScience ("40GB A100 takes 1573MiB for cuda kernels": bigscience-workshop/bigscience
train/tr11-176B-ml/chronicles-prequel.md, 'Possible topologies for 200B')."""


def nvidia_smi_bytes(mem: TrainingMemory) -> float:
    """What nvidia-smi shows of a rank whose allocated peak is `mem`: the CUDA context as the source's stack loads
    it (JEAN_ZAY_CONTEXT_BYTES in place of the priced one) and the caching allocator's reserved segments. PyTorch's
    allocator keeps freed blocks cached and never merges blocks of different segments
    (c10/cuda/CUDACachingAllocator.cpp), so DeepSpeed ZeRO-1's flat copies after the backward (a reduction bucket,
    the partition's flat gradient and its fp32 cast: one tensor each, larger than any per-parameter gradient or
    per-layer activation block the backward freed) take new segments beside the backward's, while memory lasts.
    Derived: docs/formulas.md#mem.optimizer_copies"""
    context = 0.0 if mem.runtime is None else float(mem.runtime.context)
    return float(mem.total) - float(mem.after_backward) + float(mem.optimizer_copies) \
        + JEAN_ZAY_CONTEXT_BYTES - context


def peak_memory(r: dict) -> list[tuple[str, str, float, float]]:
    """[(record, what, predicted, measured)] for a run that logs its peak memory per GPU (BLOOM's prequel
    tables: the largest of the first and last stage as nvidia-smi showed it, read as GiB: 'was quickly getting
    the memory snapshot with ... nvidia-smi', chronicles-prequel.md), predicted as nvidia_smi_bytes."""
    fam, hw = family(r["id"]), r["hardware"]
    system = builtin_systems()[record_system(r) or "dgx-a100"]
    gpus = hw["gpus"]
    cluster = cluster_of(system, gpus)
    plan = plan_for(r, fam, gpus)
    if plan.num_gpus != cluster.num_gpus:
        return []
    e = estimate_training(model_for(r, fam), cluster, plan)
    return [(r["id"], "peak GiB", nvidia_smi_bytes(e.memory) / 2**30, float(r["measured"]["memory_gb_max"]))]


def reserved_report(records: list[dict]) -> list[tuple[str, float, float]]:
    """Predicted peak per GPU against the peak *reserved* by PyTorch's caching allocator where a source logs
    that (torchtitan: reserved_bytes.all.peak). Reserved memory includes freed blocks the allocator keeps
    cached, so it bounds the allocated peak from above: reported apart from the allocated-memory table. The CUDA
    context and NCCL's buffers sit outside the allocator (NCCL allocates its own), so the prediction here leaves
    those runtime parts out (docs/formulas.md#mem.runtime); the cuBLAS workspace is the allocator's."""
    out = []
    for r in records:
        if "max_reserved_gib" not in r.get("measured", {}):
            continue
        fam = family(r["id"])
        hw = r["hardware"]
        system = builtin_systems()[system_for(str(hw["gpu"]))]
        if hw.get("power_limit_w"):
            system = system.model_copy(update={"gpu": system.gpu.at_power_limit(hw["power_limit_w"])})
        gpus = hw["gpus"]
        cluster = ClusterSpec(system=system, num_nodes=max(1, gpus // system.gpus_per_node),
                              gpus_per_node=min(gpus, system.gpus_per_node))
        e = estimate_training(model_for(r, fam), cluster, plan_for(r, fam, gpus))
        rt = e.memory.runtime
        outside = 0.0 if rt is None else float(rt.context + rt.nccl)
        out.append((r["id"], (float(e.memory.total) - outside) / 2**30, r["measured"]["max_reserved_gib"]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    ap.add_argument("--family", action="append")
    ap.add_argument("--quiet", action="store_true", help="only the per-family summary")
    ap.add_argument("--no-fit", action="store_true", help="skip the leave-one-family-out fit (about a second)")
    ap.add_argument("--attention-releases", choices=ATTENTION_RELEASE_MODES, default="off",
                    help="read the stacks' cuDNN releases onto published attention rates (ATTENTION_RELEASE_MODES)")
    args = ap.parse_args(argv)
    global attention_release_mode
    attention_release_mode = args.attention_releases
    records = yaml.safe_load(args.runs.read_text())
    errors: dict[str, list[float]] = {}
    misfit: dict[str, list[str]] = {}
    oom_fit: dict[str, list[str]] = {}
    skipped: dict[str, int] = {}
    reasons: dict[str, dict[str, list[str]]] = {}
    per_model: dict[str, list[float]] = {}
    for rec in records:
        fam = family(rec["id"])
        if fam not in FAMILIES or (args.family and fam not in args.family):
            continue
        why = skip_reason(rec)
        try:
            rows = predict(rec, fam)
        except (LlmplanError, ValueError) as exc:
            rows = []
            why = str(exc).split("\n")[-1].strip(" -")
        if not rows:
            skipped[fam] = skipped.get(fam, 0) + 1
            if why:
                reasons.setdefault(fam, {}).setdefault(why, []).append(rec["id"])
            continue
        for quantity, pred, meas in rows:
            if quantity == "fits":
                if meas and not pred:  # a run that ran, predicted not to fit
                    misfit.setdefault(fam, []).append(rec["id"])
                elif pred and not meas:  # a reported out-of-memory attempt, predicted to fit
                    oom_fit.setdefault(fam, []).append(rec["id"])
                continue
            err = 100 * (pred - meas) / meas
            errors.setdefault(fam, []).append(abs(err))
            if fam in BY_MODEL:
                per_model.setdefault((fam, rec["model"]["name"]), []).append(err)
            if not args.quiet:
                print(f"{rec['id']:58s} {quantity:14s} predicted {pred:10.3f} measured {meas:10.3f} {err:+7.1f}%")
    print()
    print("ran/OOM: runs the source reports as completed that llmplan predicts not to fit; OOM/fits: out-of-memory")
    print("attempts the source reports that llmplan predicts to fit (both should be 0)")
    print(f"{'family':16s} {'records':>7s} {'median |err|':>13s} {'max |err|':>10s} {'ran/OOM':>8s} {'OOM/fits':>8s} "
          f"{'skipped':>8s}")
    for fam in FAMILIES:
        e = errors.get(fam, [])
        if not e and fam not in skipped and fam not in misfit and fam not in oom_fit:
            continue
        med = f"{statistics.median(e):.1f}%" if e else "-"
        mx = f"{max(e):.1f}%" if e else "-"
        print(f"{fam:16s} {len(e):7d} {med:>13s} {mx:>10s} {len(misfit.get(fam, [])):8d} "
              f"{len(oom_fit.get(fam, [])):8d} {skipped.get(fam, 0):8d}")
    for (fam, name), e in sorted(per_model.items()):
        a = [abs(x) for x in e]
        print(f"  {fam} {name:28s} {len(e):3d} records, median |err| {statistics.median(a):.1f}% (signed "
              f"{statistics.median(e):+.1f}%), max {max(a):.1f}%")
    for fam, ids in misfit.items():
        print(f"ran, predicted not to fit ({fam}): {', '.join(ids)}")
    for fam, ids in oom_fit.items():
        print(f"ran out of memory, predicted to fit ({fam}): {', '.join(ids)}")
    print("skipped, with the reason:")
    for fam, by_reason in reasons.items():
        for why, ids in by_reason.items():
            print(f"  {fam} ({len(ids)}): {why}" + ("" if args.quiet else f": {', '.join(ids)}"))
    print("\nassumptions per family:")
    for fam, text in ASSUMPTIONS.items():
        print(f"  {fam}: {text}")
    summary = {"families": {f: round(statistics.median(e), 1) for f, e in errors.items()},
               "ran_predicted_oom": {f: len(v) for f, v in misfit.items()},
               "oom_predicted_fit": {f: len(v) for f, v in oom_fit.items()}}
    if not args.family:
        summary.update(extra_reports(records, args.no_fit))
    print("\nsummary (one line, JSON): median |error| % per family, fit violations per family, memory and ranking")
    print("SUMMARY " + json.dumps(summary, sort_keys=True))
    return 0


def extra_reports(records: list[dict], no_fit: bool) -> dict:
    """The reports after the per-family table; returns the summary's memory and ranking entries."""
    summary: dict = {}
    print("\nranking within groups measured on one model and one cluster (shipped profiles):")
    print(f"  {'group':42s} {'n':>3s} {'spearman':>9s} {'lost by pick':>13s}")
    rows = rank_report(records)
    for name, n, rho, lost in rows:
        print(f"  {name:42s} {n:3d} {rho:9.2f} {lost:12.1f}%")
    if rows:
        print(f"  median rho {statistics.median(r[2] for r in rows):.2f}, median throughput lost by the pick "
              f"{statistics.median(r[3] for r in rows):.1f}%, worst {max(r[3] for r in rows):.1f}%")
        summary["rank_median_rho"] = round(statistics.median(r[2] for r in rows), 2)
    print("\nmemory where the source publishes it (shipped profiles):")
    mem = memory_report(records)
    for rid, what, pred, meas in mem:
        print(f"  {rid:44s} {what:22s} predicted {pred:7.2f} measured {meas:7.2f} {100 * (pred - meas) / meas:+6.1f}%")
    if mem:
        print(f"  median |error| {statistics.median(abs(100 * (p - m) / m) for _, _, p, m in mem):.1f}%")
        peaks = [100 * (p - m) / m for _, what, p, m in mem if what.startswith("peak")]
        if peaks:
            print(f"  published peaks (BLOOM): median |error| {statistics.median(abs(x) for x in peaks):.1f}%, "
                  f"median signed {statistics.median(peaks):+.1f}% ({len(peaks)} runs)")
            summary["memory_peak_median_abs_pct"] = round(statistics.median(abs(x) for x in peaks), 1)
            summary["memory_peak_median_signed_pct"] = round(statistics.median(peaks), 1)
    res = reserved_report(records)
    if res:
        print("\npeak memory against the allocator's reserved peak (an upper bound of the allocated peak):")
        for rid, pred, meas in res:
            print(f"  {rid:52s} predicted {pred:6.1f} GiB reserved {meas:6.1f} GiB {100 * (pred - meas) / meas:+6.1f}%")
        print(f"  median signed {statistics.median(100 * (p - m) / m for _, p, m in res):+.1f}%")
    serving_report(records, no_fit)
    summary.update({f"{k}_median_abs_pct": v for k, v in wide_ep_report().items()})
    print("\nreference searches (`llmplan search`, shipped profiles): the top plan against the best published")
    print("bf16 MFU of its GPU (the profile's best_published_mfu); target: at most 5 points above")
    for name, plan, mfu, best, halved in reference_report():
        delta = 100 * (mfu - best)
        print(f"  {name:31s} {plan:36s} {100 * mfu:5.1f}% vs {100 * best:4.1f}%  {delta:+5.1f} points "
              f"{'(within 5)' if delta <= 5 else '(over)'}  causal attention halved {100 * halved:5.1f}%")
    print("the profiles' best published MFU (against the bf16 peak) from the runs' tokens/s: as llmplan counts")
    print("model FLOPs, and with causal attention halved as Megatron-Bridge counts them:")
    for gpu, fmt, rid, full, halved, best in best_published_report(records):
        print(f"  {gpu:8s} {fmt:4s} {rid:52s} {100 * full:6.1f}% (halved {100 * halved:6.1f}%)  profile "
              f"{100 * best:6.1f}%")
    series = amortisation_report(records)
    if series:
        print("\nthe same run at 576, 24 and 12 micro-batches per pipeline (Megatron-Core r0.8, GPT 177B, TP8 PP6, batch")
        print("1,152 on 96, 2,304 and 4,608 H100; the published regime closest to the reference searches' top plans):")
        for rid, n, pred, meas in series:
            print(f"  {rid:44s} {n:4d} micro-batches  predicted {100 * pred:5.1f}% measured {100 * meas:5.1f}% "
                  f"{100 * (pred - meas) / meas:+6.1f}%")
    same = fp8_layouts_in_bf16(records)
    if same:
        print("\nNVIDIA's fp8 Llama 3 runs on H100 in the reference searches' layouts (TP1 CP2 for 8B; TP4 PP4-8 VPP5")
        print("for 70B): measured MFU against the bf16 peak, llmplan's error on them, and llmplan's MFU for the")
        print("same plan in bf16 (what the reference searches' top plans are):")
        for rid, layout, meas, err, bf16 in same:
            print(f"  {rid:47s} {layout:26s} measured {100 * meas:5.1f}% ({err:+5.1f}%)  in bf16 {100 * bf16:5.1f}%")
    pairs = precision_pairs(records)
    if pairs:
        print("\nthe same run in fp8 and in bf16 (MosaicML H100 tables): fp8 / bf16 throughput, predicted vs measured")
        for rid, pred, meas in pairs:
            print(f"  {rid:44s} predicted {pred:5.2f}x measured {meas:5.2f}x {100 * (pred - meas) / meas:+6.1f}%")
    same = same_plan_across_sources(records)
    if same:
        print("\none plan (model, GPUs, layout, batch, fp8 or not) published by two sources:")
        print("measured tokens/s per GPU and llmplan's signed error (shipped profiles;")
        print("a per-plan mechanism predicts them alike):")
        for key, rows in same:
            print(f"  {key[0]} layers, {key[4]} {key[3]}, tp{key[5]} pp{key[6]} cp{key[7]} vpp{key[8]} "
                  f"gbs {key[10]}{' fp8' if key[11] else ''}:")
            for rid, tok, err in rows:
                print(f"    {rid[:56]:56s} {tok:8.0f} {err:+6.1f}%")
    if no_fit:
        return summary
    print("\nleave-one-family-out: constants fitted on the other training families (grid in GRID), the left-out")
    print("family's median |error| under them, and under the fit on all families; the families of its source")
    print("(SOURCE_GROUPS, docs/validation.md#lofo-source) are left out with it:")
    print("(docs/validation.md#lofo: dense models' records fitted, MoE models' scored only;")
    print("ties (within one jackknife standard error) go to the prior: published values, else the fit on the fold's")
    print("own families, #lofo-prior; a constant no fit identifies is held there)")
    fitted, scored, jackknife = fit_tables(records)
    full = fit_constants(fitted, set(TRAIN_FAMILIES), jackknife=jackknife)
    assert full is not None
    print(f"  all families -> {_fmt_consts(full.consts)}{_fmt_held(full)}; prior {_fmt_consts(full.prior)}")
    summary["lofo"] = {}
    summary["lofo_held"] = {}
    summary["lofo_family"] = {}  # left out alone, its source's other families kept in the fit (optimistic)
    alone = {fam: left for fam, _, left, _ in lofo(fitted, scored, jackknife, by_source=False)}
    for fam, fit, left, inside in lofo(fitted, scored, jackknife):
        mates = [f for f in source_group(fam) if f != fam]
        print(f"  {fam:16s} left out {left if left is not None else float('nan'):6.1f}%  (in the fit "
              f"{inside if inside is not None else float('nan'):5.1f}%)  fitted without it"
              f"{' and ' + ', '.join(mates) if mates else ''}: {_fmt_consts(fit.consts)}{_fmt_held(fit)}"
              + (f"; alone left out {alone[fam]:.1f}%" if mates and alone.get(fam) is not None else "")
              + f"; prior {_fmt_consts(fit.prior)}")
        if left is not None and left == left:
            summary["lofo"][fam] = round(left, 1)
        if fit.held:
            summary["lofo_held"][fam] = list(fit.held)
        if alone.get(fam) is not None and alone[fam] == alone[fam]:
            summary["lofo_family"][fam] = round(alone[fam], 1)
    return summary


REFERENCE_SEARCHES = (
    ("llama-3.1-70b", "dgx-h100", 8, ()),
    ("llama-3.1-8b", "dgx-h100", 1, ()),
    ("gpt3-175b", "dgx-a100", 128, ("--global-batch", "1536")),
    ("llama-3.1-405b", "dgx-h100", 2048, ("--seq-len", "8192", "--global-batch", "2048")),
)
"""The reference searches of the issue "Plan ranking that an expert would trust" (default batch: 4M tokens)."""


BEST_PUBLISHED_RUNS = (
    ("h100-sxm", "bf16", "dgxc-2504-pretrain-llama3.1-8b-h100-8gpu-bf16-tp1pp1cp2mbs1gbs128"),
    ("b200", "fp8", "bridge-2511-b200-fp8-cs-llama31-405b-128gpu-gbs64"),
    ("gb300", "fp8", "bridge-2511-gb300-fp8-cs-llama31-405b-256gpu-gbs1536"),
    ("gb200", "fp4", "bridge-2602-gb200-nvfp4-llama31-405b-256gpu-gbs1536"),
    ("gb300", "fp4", "bridge-2602-gb300-nvfp4-llama31-405b-256gpu-gbs1536"),
)
"""The published run behind a GPU profile's best published MFU per format, where it is a record here (GB200's
fp8 one, NeMo 25.11's 813 tokens/s, was measured again in 26.02 and only the newer row is a record)."""


def causal_share(m: ModelSpec, plan: ParallelPlan) -> float:
    """Model FLOPs with causal attention counted at half (Megatron-Bridge's flop_utils.py, current Megatron-LM)
    over llmplan's count (attention not halved, as Narayanan et al. 2021 Eq. 3 and Megatron-LM r0.8)."""
    full = float(model_flops_per_step(m, plan))
    attention = (m.num_dense_layers * layer_flops(m, plan, False).attention
                 + m.num_moe_layers * layer_flops(m, plan, True).attention)
    attention = 3 * float(attention) * plan.tp * plan.cp * plan.global_batch / plan.micro_batch
    return (full - attention / 2) / full


def best_published_report(records: list[dict]) -> list[tuple[str, str, str, float, float, float]]:
    """(GPU, format, record, its measured MFU as llmplan counts, the same with causal attention halved, the
    profile's best published MFU of that format) for each of BEST_PUBLISHED_RUNS: the measured tokens/s over
    llmplan's model FLOPs, against the bf16 peak."""
    by_id = {r["id"]: r for r in records}
    out = []
    for gpu, fmt, rid in BEST_PUBLISHED_RUNS:
        if rid not in by_id:
            continue
        rec = by_id[rid]
        fam, gpus = family(rid), rec["hardware"]["gpus"]
        plan, m = plan_for(rec, fam, gpus), model_for(rec, fam)
        system = builtin_systems()[system_for(rec["hardware"]["gpu"])]
        flops = float(model_flops_per_step(m, plan)) / (plan.global_batch * plan.seq_len)
        full = rec["measured"]["tokens_per_s_per_gpu"] * flops / system.gpu.peak_flops("bf16")
        best = getattr(system.gpu, "best_published_mfu" + ("" if fmt == "bf16" else f"_{fmt}"))
        out.append((gpu, fmt, rid, full, full * causal_share(m, plan), float(best)))
    return out


def reference_report() -> list[tuple[str, str, float, float, float]]:
    """(search, top plan, its predicted MFU, the GPU's best published bf16 MFU, the top plan's MFU with causal
    attention halved) of each reference search, run as a user runs it: the `llmplan search` command with
    --json (all of them at once, each in its own process, which dies with this one: die_with_parent)."""
    out = []
    procs = []
    try:
        for model, system, nodes, extra in REFERENCE_SEARCHES:
            cmd = [sys.executable, "-m", "llmplan", "search", "--model", model, "--hardware", system,
                   "--nodes", str(nodes), "--json", *extra]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          preexec_fn=die_with_parent(os.getpid())))  # noqa: PLW1509
        results = [p.communicate() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for (model, system, nodes, _extra), proc, (stdout, stderr) in zip(REFERENCE_SEARCHES, procs, results, strict=True):
        if proc.returncode:
            raise subprocess.CalledProcessError(proc.returncode, proc.args, stdout, stderr)
        top = json.loads(stdout)["plans"][0]
        p = top["plan"]
        plan = (f"tp{p['tp']} pp{p['pp']} dp{p['dp']} cp{p['cp']} vpp{p['vpp']} z{p['zero']} {p['recompute']} "
                f"mb{p['micro_batch']}")
        best = builtin_systems()[system].gpu.best_published_mfu
        mfu = float(top["throughput"]["mfu"])
        share = causal_share(builtin_models()[model], ParallelPlan(seq_len=p["seq_len"], global_batch=1))
        out.append((f"{model} on {nodes} {system}", plan, mfu, float(best), mfu * share))
    return out


PR_SET_PDEATHSIG = 1
"""Linux prctl option: the signal a process receives when its parent dies (man 2 prctl)."""
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def die_with_parent(parent: int):
    """A subprocess preexec_fn: the child is sent SIGTERM when `parent` (this process) dies, however it dies
    (a timeout's SIGKILL included), and exits at once if the parent died before the request took effect; on
    systems without prctl the child runs to its end."""
    def setup() -> None:  # between fork and exec: one system call on a library loaded before, no lock taken
        if _LIBC is not None:
            _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(1)
    return setup


AMORTISATION_SERIES = ("megatron-core-r0.8-strong-177b-96gpu", "megatron-core-r0.8-weak-177b",
                       "megatron-core-r0.8-strong-177b-4608gpu")
"""One model, code and layout measured at three batch sizes per pipeline (README text and figure of
Megatron-LM's 'Training Speed and Scalability'): how the per-step costs amortise."""


def amortisation_report(records: list[dict]) -> list[tuple[str, int, float, float]]:
    """(record, micro-batches per pipeline, predicted MFU, measured MFU) of AMORTISATION_SERIES."""
    by_id = {r["id"]: r for r in records}
    out = []
    for rid in AMORTISATION_SERIES:
        if rid not in by_id:
            continue
        rec = by_id[rid]
        par = rec["parallel"]
        rows = [r for r in predict(rec, family(rid)) if r[0] in ("MFU", "model TFLOP/s")]
        if rows:
            scale = 1.0
            if rows[0][0] == "model TFLOP/s":  # scored on the table's finer column: back to MFU for the report
                setup = record_setup(rec, family(rid), None)
                assert setup is not None
                _, cluster, plan = setup
                scale = 1e12 / cluster.system.gpu.peak_flops(plan.mfu_format)
            out.append((rid, par["global_batch"] // par["dp"], rows[0][1] * scale, rows[0][2] * scale))
    return out


FP8_REFERENCE_LAYOUTS = ("megatron-examples-fp8-llama3-8b-8gpu", "nemo2407-pretrain-llama3-8b-8gpu-gbs128",
                         "megatron-examples-fp8-llama3-70b-64gpu", "nemo2407-pretrain-llama3-70b-64gpu-gbs128",
                         "bridge-2602-h100-fp8-cs-llama3-70b-64gpu-gbs256")
"""Published fp8 runs on H100 whose layouts are the 8B and 70B reference searches' top plans (no recompute)."""


def fp8_layouts_in_bf16(records: list[dict]) -> list[tuple[str, str, float, float, float]]:
    """(record, layout, measured MFU against the bf16 peak, llmplan's signed % error, llmplan's MFU for the same
    plan in bf16) of FP8_REFERENCE_LAYOUTS: the bf16 price of a layout NVIDIA measured in fp8."""
    by_id = {r["id"]: r for r in records}
    out = []
    for rid in FP8_REFERENCE_LAYOUTS:
        if rid not in by_id:
            continue
        rec, fam = by_id[rid], family(rid)
        system = builtin_systems()[system_for(str(rec["hardware"]["gpu"])) or "dgx-h100"]
        gpus = rec["hardware"]["gpus"]
        cluster = cluster_of(system, gpus)
        plan = plan_for(rec, fam, gpus)
        e8 = estimate_training(model_for(rec, fam), cluster, plan)
        bf16 = plan.model_copy(update={"dtype": "bf16", "recipe": "tensorwise", "fp8_params": False,
                                     "fp8_scaling": "delayed"})
        eb = estimate_training(model_for(rec, fam), cluster, bf16)
        _, pred, meas = predict(rec, fam)[0]
        layout = f"tp{plan.tp} pp{plan.pp} cp{plan.cp} vpp{plan.vpp} {plan.recompute}"
        out.append((rid, layout, float(e8.throughput.mfu) * meas / pred, 100 * (pred - meas) / meas,
                    float(eb.throughput.mfu)))
    return out


def same_plan_across_sources(records: list[dict]) -> list[tuple[tuple, list[tuple[str, float, float]]]]:
    """Dense training runs of one model on one GPU type and count with the same layout, batch and precision
    class, published by two or more sources (SOURCE_GROUPS): [(key, [(record, measured tokens/s per GPU,
    llmplan's signed % error)])]. Whatever llmplan prices from the plan, it predicts such runs alike, so the
    spread of their errors is what no per-plan mechanism can remove (docs/validation.md#lofo-prior)."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        m, p, hw = r.get("model", {}), r.get("parallel", {}), r.get("hardware", {})
        if family(r["id"]) not in TRAIN_FAMILIES or "layers" not in m or "moe" in m or "tp" not in p:
            continue
        fp8 = "fp8" in str(p.get("precision", "")).lower()
        key = (m["layers"], m.get("hidden"), m.get("seq_len"), clock_group(r), hw.get("gpus"), p["tp"], p.get("pp"),
               p.get("cp") or 1, p.get("vpp") or 1, p.get("micro_batch"), p.get("global_batch"), fp8)
        groups.setdefault(key, []).append(r)
    out = []
    for key, recs in groups.items():
        if len({source_group(family(r["id"])) for r in recs}) < 2:
            continue
        rows = []
        for r in recs:
            got = [(pred, meas) for q, pred, meas in predict(r, family(r["id"])) if q != "fits"]
            if got:
                rows.append((r["id"], float(r["measured"].get("tokens_per_s_per_gpu", float("nan"))),
                             100 * (got[0][0] - got[0][1]) / got[0][1]))
        out.append((key, rows))
    return out


SERVE_GRID = {"SERVE_GEMM_M_HALF": (0.0, 64.0, 128.0, 192.0, 256.0), "SERVE_COLLECTIVE_FLOOR_S": (0.0, 1e-5, 2e-5)}
"""The serving constants (llmplan.cost.serve_step) and the values leave-one-model-out tries."""


def precision_pairs(records: list[dict]) -> list[tuple[str, float, float]]:
    """The same MosaicML H100 run in bf16 and fp8 (model, sequence, GPUs, micro-batch and batch equal): the
    fp8 / bf16 throughput ratio, predicted and measured. Composer's fp8 MFU is against the fp8 peak, its bf16
    MFU against the bf16 peak, so the ratio of tokens/s is the MFU ratio times the ratio of the peaks."""
    by_id = {r["id"]: r for r in records}
    peaks = builtin_systems()["dgx-h100"].gpu
    scale = peaks.peak_flops("fp8") / peaks.peak_flops("bf16")
    out = []
    for rid, r in by_id.items():
        twin = by_id.get(rid.replace("-amp_fp8-", "-amp_bf16-"))
        if not rid.startswith("mpt-h100_80gb-amp_fp8-") or twin is None:
            continue
        (_, p8, m8, *_), (_, p16, m16, *_) = predict(r, "mpt")[0], predict(twin, "mpt")[0]
        out.append((rid.replace("-amp_fp8-", "-"), scale * p8 / p16, scale * m8 / m16))
    return out


def shape(rec: dict) -> str:
    """Workload shape of a serving record: prefill-heavy (input >= 4 x output), decode-heavy (output >= 4 x
    input) or balanced."""
    i, o = rec["workload"]["input_len"], rec["workload"]["output_len"]
    return "prefill-heavy" if i >= 4 * o else "decode-heavy" if o >= 4 * i else "balanced"


def serving_errors(records: list[dict], consts: dict | None = None) -> list[tuple[str, str, float]]:
    """(model, shape, signed % error) of every serving record, with the serving constants `consts`."""
    import llmplan.cost.serve_step as serve_step  # where the serving step reads its constants

    saved = {k: getattr(serve_step, k) for k in SERVE_GRID}
    try:
        for k, v in (consts or {}).items():
            setattr(serve_step, k, v)
        out = []
        for rec in records:
            if family(rec["id"]) == "trtllm":
                (_, pred, meas), = predict_serving(rec)
                out.append((rec["model"]["name"], shape(rec), 100 * (pred - meas) / meas))
        return out
    finally:
        for k, v in saved.items():
            setattr(serve_step, k, v)


def serving_report(records: list[dict], no_fit: bool) -> None:
    rows = serving_errors(records)
    if not rows:
        return
    print("\nserving (TensorRT-LLM family) by workload shape, shipped constants:")
    for sh in ("prefill-heavy", "balanced", "decode-heavy"):
        e = [err for _, s_, err in rows if s_ == sh]
        if e:
            print(f"  {sh:14s} {len(e):3d} records, median |err| {statistics.median(abs(x) for x in e):.1f}%, "
                  f"median signed {statistics.median(e):+.1f}%")
    if no_fit:
        return
    import itertools

    grid = [dict(zip(SERVE_GRID, values, strict=True)) for values in itertools.product(*SERVE_GRID.values())]
    table = [(c, serving_errors(records, c)) for c in grid]
    models = sorted({name for name, _, _ in rows})

    def med(errs: list, kept: list[str]) -> float:
        """Mean over the kept models of each model's median |error|: every model weighs the same, as every
        family does in the training fit (best_fit)."""
        return statistics.mean(statistics.median(abs(e) for name, _, e in errs if name == n) for n in kept)

    best_err = min(med(errs, models) for _, errs in table)
    ties = [c for c, errs in table if med(errs, models) <= best_err + 0.05]
    print("leave-one-model-out (serving constants fitted on the other models, each model weighted alike; the "
          "left-out model's median |error|):")
    print(f"  all models -> {' | '.join(_fmt_consts(c) for c in ties)} (mean of the models' medians {best_err:.1f}%)")
    for left in models:
        others = [n for n in models if n != left]
        consts, errs = min(table, key=lambda ce, others=others: med(ce[1], others))
        print(f"  {left:34s} left out {med(errs, [left]):5.1f}%  (the others in that fit "
              f"{med(errs, others):4.1f}%)  fitted without it: {_fmt_consts(consts)}")
    shipped = {n: statistics.median(abs(e) for name, _, e in rows if name == n) for n in models}
    print(f"  shipped constants: mean of the models' medians {statistics.mean(shipped.values()):.1f}%, worst "
          f"{max(shipped.values()):.1f}% ({max(shipped, key=shipped.get)})")


WIDE_EP_RUNS = Path(__file__).resolve().parent / "data" / "wide_ep_serving.yaml"
"""Published wide-EP disaggregated DeepSeek-V3/R1 pools (family wideep), each with its source URL."""


def predict_wide_ep(rec: dict) -> tuple[float, float, str]:
    """(predicted, measured, quantity) of one wideep record: the pool's phase priced on its own at the
    record's layout and load (`estimate --mode infer --phase ...`); tokens per GPU per second."""
    system = builtin_systems()[rec["system"]]
    cluster = ClusterSpec(system=system, num_nodes=rec["nodes"], gpus_per_node=rec.get("gpus_per_node"))
    par = dict(rec["plan"])
    plan = ServePlan(tp=1, pp=1, dp=par["ep"], **par)
    wl = rec["workload"]
    # The large-scale EP deployments set --mem-fraction-static (sglang#6017's prefill command: 0.85); the records do not
    # state it, so they keep 0.9, llmplan's SGLang default before 2026-12-06: SGLang's own default
    # (cost.serve_memory.sglang_mem_fraction_static) reserves 4.5 MiB per decode-graph request per attention-DP
    # rank, e.g. 0.36 on 48 GB200 ranks, which no such deployment runs (docs/validation.md#sglang-mem-fraction).
    job = ServeJob(input_len=wl["input_len"], output_len=wl["output_len"], engine="sglang",
                   batch=wl["batch"] if isinstance(wl.get("batch"), int) else 1,
                   max_num_batched_tokens=wl.get("tokens_per_batch", 8192), gpu_memory_utilization=0.9)
    m = builtin_models()["deepseek-v3"]
    if wl.get("batch") == "max-load":
        job = at_max_load(m, cluster, plan, job)
    e = estimate_serving(m, cluster, plan, job)
    assert e.phase is not None
    key = "input_tokens_per_s_per_gpu" if plan.phase == "prefill" else "output_tokens_per_s_per_gpu"
    return getattr(e.phase, key), rec["measured"][key], key


def wide_ep_report(path: Path = WIDE_EP_RUNS) -> dict:
    """The wideep family: per record predicted vs measured, median |error| per GPU type; excluded records
    listed with their reason. Returns the summary entries."""
    records = yaml.safe_load(path.read_text())
    print("\nwide-EP disaggregated serving (family wideep, benchmarks/data/wide_ep_serving.yaml; one phase per "
          "pool,\n`estimate --mode infer --phase`, shipped profiles):")
    by_gpu: dict[str, list[float]] = {}
    for rec in records:
        if rec.get("excluded"):
            print(f"  {rec['id']:42s} excluded: {' '.join(rec['excluded'].split())}")
            continue
        pred, meas, key = predict_wide_ep(rec)
        err = 100 * (pred - meas) / meas
        gpu = builtin_systems()[rec["system"]].gpu.name
        by_gpu.setdefault(gpu, []).append(abs(err))
        print(f"  {rec['id']:42s} {key.split('_')[0]:6s} tok/s/GPU predicted {pred:8.0f} measured {meas:8.0f} "
              f"{err:+6.1f}%")
    allerr = [e for errs in by_gpu.values() for e in errs]
    for gpu, errs in by_gpu.items():
        print(f"  {gpu:12s} {len(errs):2d} records, median |err| {statistics.median(errs):.1f}%, max {max(errs):.1f}%")
    if allerr:
        print(f"  all          {len(allerr):2d} records, median |err| {statistics.median(allerr):.1f}%")
    return {"wideep": round(statistics.median(allerr), 1)} if allerr else {}


def _fmt_consts(c: dict) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in c.items())


def _fmt_held(fit: Fit) -> str:
    return f"; held at the prior (not identified): {', '.join(fit.held)}" if fit.held else ""


if __name__ == "__main__":
    sys.exit(main())
