#!/usr/bin/env bash
# llmplan VERSION export for torchrun (wrapping megatron)
# plan: tp 2 pp 2 dp 8 cp 1 ep 8 vpp 1 sp on zero 1 recompute none micro-batch 1
#   global batch 256 seq 4096 bf16
# model: mixtral-8x7b (mistralai/Mixtral-8x7B-v0.1 config.json (HF MixtralConfig
#   defaults))
# hardware: 4 x dgx-h100 = 32 x h100-sxm
# predicted: 60.0 of 80.0 GiB per GPU; step 10.000 s, MFU 45.0%, 100,000
#   tokens/s
set -euo pipefail
# run this on every node (same MASTER_ADDR / MASTER_PORT / JOB_ID everywhere)
NNODES=${NNODES:-4}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-29500}
JOB_ID=${JOB_ID:-llmplan}

# the plan's expert_gemm grouped (Transformer Engine's fused grouped MLP, TE >=
#   2.14)
export NVTE_CUTEDSL_FUSED_GROUPED_MLP=1
MEGATRON_LM=${MEGATRON_LM:-/workspace/Megatron-LM}
# real data: --data-path "$DATA_PATH" --tokenizer-type HuggingFaceTokenizer
#   --tokenizer-model "$TOKENIZER"
DATA_ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size 32000
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
    --max-position-embeddings 32768
    --group-query-attention
    --num-query-groups 8
    --position-embedding-type rope
    --rotary-base 1000000
    --swiglu
    --normalization RMSNorm
    --disable-bias-linear
    --untie-embeddings-and-output-weights
    --attention-dropout 0
    --hidden-dropout 0
    --num-experts 8
    --moe-router-topk 2
    --moe-ffn-hidden-size 14336
    --moe-token-dispatcher-type alltoall
    --moe-grouped-gemm
    --use-transformer-engine-op-fuser
    --moe-router-score-function softmax
    --moe-router-dtype fp32
    --moe-permute-fusion
    --moe-router-load-balancing-type aux_loss
    --moe-aux-loss-coeff 0.02
)
PARALLEL_ARGS=(
    --tensor-model-parallel-size 2
    --pipeline-model-parallel-size 2
    --sequence-parallel
    --context-parallel-size 1
    --expert-model-parallel-size 8
    --expert-tensor-parallel-size 1
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
    --ddp-average-in-collective
    --cross-entropy-loss-fusion
    --cross-entropy-fusion-impl native
    --micro-batch-size 1
    --global-batch-size 256
    --bf16
)
torchrun --nnodes "$NNODES" --nproc-per-node "$GPUS_PER_NODE" \
    --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \
    --rdzv-id "$JOB_ID" \
    "$MEGATRON_LM/pretrain_gpt.py" "${MODEL_ARGS[@]}" "${PARALLEL_ARGS[@]}" \
    "${TRAIN_ARGS[@]}" "${DATA_ARGS[@]}"
