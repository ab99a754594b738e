#!/usr/bin/env bash
# llmplan VERSION export for DeepSpeed launcher
# plan: tp 1 pp 1 dp 16 cp 1 ep 1 vpp 1 sp off zero 3 recompute full micro-batch
#   2 global batch 256 seq 8192 bf16
# model: llama-3.1-8b (meta-llama/Llama-3.1-8B config.json;
#   meta-llama/llama-models MODEL_CARD)
# hardware: 2 x dgx-h100 = 16 x h100-sxm
# predicted: 40.0 of 80.0 GiB per GPU; step 5.000 s, MFU 40.0%, 400,000 tokens/s
set -euo pipefail
# train_batch_size 256 = micro-batch 2 x gradient accumulation 8 x data parallel
#   16
deepspeed --num_nodes 2 --num_gpus 8 --hostfile "${HOSTFILE:-hostfile}" \
    "${TRAIN_SCRIPT:-train.py}" --deepspeed --deepspeed_config ds_config.json
