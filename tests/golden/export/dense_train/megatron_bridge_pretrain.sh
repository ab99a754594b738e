#!/usr/bin/env bash
# llmplan VERSION export for Megatron-Bridge 0.6.2 run_recipe.py (recipe
#   llama31_70b_pretrain_config)
# plan: tp 8 pp 4 dp 2 cp 1 ep 1 vpp 5 sp on zero 1 recompute selective
#   micro-batch 1 global batch 128 seq 8192 bf16
# model: llama-3.1-70b (meta-llama/Llama-3.1-70B config.json;
#   meta-llama/llama-models MODEL_CARD)
# hardware: 8 x dgx-h100 = 64 x h100-sxm
# predicted: 60.0 of 80.0 GiB per GPU; step 10.000 s, MFU 45.0%, 100,000
#   tokens/s
set -euo pipefail

GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NNODES=${NNODES:-8}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}
MEGATRON_BRIDGE=${MEGATRON_BRIDGE:-/opt/Megatron-Bridge}
# real data: --dataset megatron-indexed dataset.data_path=PREFIX
RECIPE=(--recipe llama31_70b_pretrain_config --mode pretrain --dataset mock)
TRAIN=(train.train_iters=${TRAIN_ITERS:-1000})
OVERRIDES=(
    'model.tensor_model_parallel_size=8'
    'model.pipeline_model_parallel_size=4'
    'model.virtual_pipeline_model_parallel_size=5'
    'model.context_parallel_size=1'
    'model.sequence_parallel=true'
    'model.pipeline_model_parallel_layout=null'
    'model.num_layers_in_first_pipeline_stage=null'
    'model.num_layers_in_last_pipeline_stage=null'
    'model.account_for_embedding_in_pipeline_split=false'
    'model.account_for_loss_in_pipeline_split=false'
    'model.overlap_p2p_comm=true'
    'model.batch_p2p_comm=false'
    'model.cuda_graph_impl=none'
    'model.use_te_rng_tracker=false'
    'rng.te_rng_tracker=false'
    'model.recompute_granularity=selective'
    'model.recompute_method=null'
    'model.recompute_num_layers=null'
    'model.recompute_modules=[core_attn]'
    'model.cross_entropy_loss_fusion=true'
    'model.cross_entropy_fusion_impl=native'
    'model.seq_length=8192'
    'dataset.seq_length=8192'
    'train.micro_batch_size=1'
    'train.global_batch_size=128'
    'train.manual_gc=true'
    'train.manual_gc_interval=100'
    'dataset.create_attention_mask=false'
    'ddp.use_distributed_optimizer=true'
    'optimizer.use_distributed_optimizer=true'
    'ddp.use_megatron_fsdp=false'
    'ddp.overlap_grad_reduce=true'
    'ddp.check_for_nan_in_grad=false'
    'ddp.average_in_collective=true'
    'ddp.overlap_param_gather=true'
    'optimizer.use_precision_aware_optimizer=false'
    'optimizer.main_params_dtype=float32'
    'optimizer.main_grads_dtype=float32'
    'optimizer.exp_avg_dtype=float32'
    'optimizer.exp_avg_sq_dtype=float32'
    'comm_overlap=null'
    'mixed_precision=bf16_mixed'
)

torchrun --nproc-per-node "$GPUS_PER_NODE" --nnodes "$NNODES" \
    --node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" \
    --master-port "$MASTER_PORT" \
    "$MEGATRON_BRIDGE/scripts/training/run_recipe.py" "${RECIPE[@]}" \
    "${TRAIN[@]}" "${OVERRIDES[@]}"
