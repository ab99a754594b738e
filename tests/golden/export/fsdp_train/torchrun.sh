#!/usr/bin/env bash
# llmplan VERSION export for torchrun (wrapping torchtitan)
# plan: tp 1 pp 1 dp 16 cp 1 ep 1 vpp 1 sp off zero 3 recompute full micro-batch
#   2 global batch 256 seq 8192 bf16
# model: llama-3.1-8b (meta-llama/Llama-3.1-8B config.json;
#   meta-llama/llama-models MODEL_CARD)
# hardware: 2 x dgx-h100 = 16 x h100-sxm
# predicted: 40.0 of 80.0 GiB per GPU; step 5.000 s, MFU 40.0%, 400,000 tokens/s
set -euo pipefail
# run this on every node (same MASTER_ADDR / MASTER_PORT / JOB_ID everywhere)
NNODES=${NNODES:-2}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-29500}
JOB_ID=${JOB_ID:-llmplan}
TORCHTITAN_ARGS=(
    --module llama3 --config llama3_8b
    # tokenizer: python scripts/download_hf_assets.py --repo_id
    #   meta-llama/Llama-3.1-8B-Instruct --assets tokenizer
    --hf-assets-path ./assets/hf/Llama-3.1-8B-Instruct
    --dump-folder ./outputs
    # or a dataset registered in torchtitan/hf_datasets
    --dataloader.dataset c4
    --training.local-batch-size 2
    --training.global-batch-size 256
    --training.seq-len 8192
    --training.steps 1000
    --training.max-norm 1.0
    --training.mixed-precision-param bfloat16
    --training.mixed-precision-reduce float32
    --parallelism.data-parallel-replicate-degree 1
    --parallelism.data-parallel-shard-degree 16
    --parallelism.fsdp-reshard-after-forward default
    --parallelism.tensor-parallel-degree 1
    --parallelism.enable-sequence-parallel
    --parallelism.pipeline-parallel-degree 1
    --parallelism.context-parallel-degree 1
    --parallelism.expert-parallel-degree 1
    --compile.enable --compile.components model,loss
    --compile.no-enable-async-tensor-parallel
    activation-checkpoint:full   # subcommand: keep it last
)
torchrun --nnodes "$NNODES" --nproc-per-node "$GPUS_PER_NODE" \
    --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \
    --rdzv-id "$JOB_ID" \
    -m torchtitan.train "${TORCHTITAN_ARGS[@]}"
