#!/usr/bin/env bash
# llmplan VERSION export for Megatron-LM pretrain_gpt.py (flags of main d98e8a6,
#   2026-08, after core_v0.19.0)
# plan: tp 2 pp 3 dp 1 cp 1 ep 1 vpp 1 sp on zero 1 recompute none micro-batch 1
#   global batch 24 seq 4096 bf16
# model: llama-3.1-8b (meta-llama/Llama-3.1-8B config.json;
#   meta-llama/llama-models MODEL_CARD)
# hardware: 1 x dgx-h100 = 6 x h100-sxm
# predicted: 33.7 of 79.6 GiB per GPU; step 1.938 s, MFU 44.0%, 50,735 tokens/s
# note: Megatron-LM's gradient NaN check stays on (its default): one read of the
#   fp32 gradient buffer per step that this plan was priced without; set
#   grad_nan_check: true in the plan file to price it, or add
#   --no-check-for-nan-in-loss-and-grad to skip it
# note: Megatron-LM's non-interleaved pipeline synchronises the device after
#   each exchange (batch_p2p_comm with batch_p2p_sync), which this plan was
#   priced without, so this runs a little slower than priced: re-plan with
#   --pp-blocking-sends to price it
set -euo pipefail

GPUS_PER_NODE=${GPUS_PER_NODE:-6}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}
MEGATRON_LM=${MEGATRON_LM:-/workspace/Megatron-LM}
# real data: --data-path "$DATA_PATH" --tokenizer-type HuggingFaceTokenizer
#   --tokenizer-model "$TOKENIZER"
DATA_ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size 128256
    --no-create-attention-mask-in-dataloader)
TRAIN_ARGS=(--train-iters ${TRAIN_ITERS:-1000} --lr 3.0e-4 --min-lr 3.0e-5
    --lr-decay-style cosine --weight-decay 0.1 --clip-grad 1.0
    --log-interval 10 --manual-gc --manual-gc-interval 100)
# Megatron-LM expects it with TP/CP before Blackwell
export CUDA_DEVICE_MAX_CONNECTIONS=1
MODEL_ARGS=(
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --kv-channels 128
    --seq-length 4096
    --max-position-embeddings 131072
    --group-query-attention
    --num-query-groups 8
    --position-embedding-type rope
    --rotary-base 500000
    --use-rope-scaling
    --rope-scaling-factor 8.0
    --swiglu
    --normalization RMSNorm
    --disable-bias-linear
    --untie-embeddings-and-output-weights
    --attention-dropout 0
    --hidden-dropout 0
)
PARALLEL_ARGS=(
    --tensor-model-parallel-size 2
    --pipeline-model-parallel-size 3
    --pipeline-model-parallel-layout "Et*10|t*11|t*11,L"
    --sequence-parallel
    --context-parallel-size 1
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
    --ddp-average-in-collective
    --cross-entropy-loss-fusion
    --cross-entropy-fusion-impl native
    --micro-batch-size 1
    --global-batch-size 24
    --bf16
)

torchrun --nproc-per-node "$GPUS_PER_NODE" --nnodes "$NNODES" \
    --node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" \
    --master-port "$MASTER_PORT" \
    "$MEGATRON_LM/pretrain_gpt.py" "${MODEL_ARGS[@]}" "${PARALLEL_ARGS[@]}" \
    "${TRAIN_ARGS[@]}" "${DATA_ARGS[@]}"
