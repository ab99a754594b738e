#!/usr/bin/env bash
# llmplan VERSION export for Megatron-Bridge 0.6.2 run_recipe.py (recipe
#   deepseek_v3_pretrain_config)
# plan: tp 2 pp 8 dp 16 cp 1 ep 32 vpp 1 sp on zero 1 recompute full micro-batch
#   1 global batch 512 seq 4096 bf16
# model: deepseek-v3 (deepseek-ai/DeepSeek-V3
#   inference/configs/config_671B.json, config.json and README (671B total, 37B
#   active; MTP layer excluded; n_expert_groups 8, n_limited_groups 4 = HF
#   n_group, topk_group; score_func sigmoid, route_scale 2.5, topk_method
#   noaux_tc = expert bias))
# hardware: 32 x dgx-h800 = 256 x h800
# predicted: 60.2 of 79.6 GiB per GPU; step 16.634 s, MFU 14.0%, 126,073
#   tokens/s
# note: Megatron-Bridge's non-interleaved pipeline synchronises the device after
#   each exchange (batch_p2p_comm with batch_p2p_sync), which this plan was
#   priced without, so this runs a little slower than priced: re-plan with
#   --pp-blocking-sends to price it
set -euo pipefail

GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NNODES=${NNODES:-32}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}
# the plan's expert_gemm grouped (Transformer Engine's fused grouped MLP, TE >=
#   2.14)
export NVTE_CUTEDSL_FUSED_GROUPED_MLP=1
MEGATRON_BRIDGE=${MEGATRON_BRIDGE:-/opt/Megatron-Bridge}
# real data: --dataset megatron-indexed dataset.data_path=PREFIX
RECIPE=(--recipe deepseek_v3_pretrain_config --mode pretrain --dataset mock)
TRAIN=(train.train_iters=${TRAIN_ITERS:-1000})
OVERRIDES=(
    'model.tensor_model_parallel_size=2'
    'model.pipeline_model_parallel_size=8'
    'model.virtual_pipeline_model_parallel_size=null'
    'model.context_parallel_size=1'
    'model.sequence_parallel=true'
    'model.pipeline_model_parallel_layout=null'
    'model.num_layers_in_first_pipeline_stage=7'
    'model.num_layers_in_last_pipeline_stage=6'
    'model.account_for_embedding_in_pipeline_split=false'
    'model.account_for_loss_in_pipeline_split=false'
    'model.expert_model_parallel_size=32'
    'model.expert_tensor_parallel_size=1'
    'model.moe_token_dispatcher_type=alltoall'
    'model.moe_flex_dispatcher_backend=null'
    'model.moe_expert_capacity_factor=null'
    'model.moe_pad_expert_input_to_capacity=false'
    'model.use_transformer_engine_op_fuser=true'
    'model.moe_router_fusion=false'
    'model.moe_router_dtype=fp32'
    'model.moe_router_padding_for_quantization=false'
    'model.moe_router_load_balancing_type=seq_aux_loss'
    'model.moe_aux_loss_coeff=0.001'
    'model.overlap_moe_expert_parallel_comm=false'
    'model.delay_wgrad_compute=false'
    'model.mtp_num_layers=1'
    'model.mtp_use_repeated_layer=false'
    'model.cuda_graph_impl=none'
    'model.use_te_rng_tracker=false'
    'rng.te_rng_tracker=false'
    'model.recompute_granularity=full'
    'model.recompute_method=uniform'
    'model.recompute_num_layers=1'
    'model.recompute_modules=null'
    'model.cross_entropy_loss_fusion=true'
    'model.cross_entropy_fusion_impl=native'
    'model.seq_length=4096'
    'dataset.seq_length=4096'
    'train.micro_batch_size=1'
    'train.global_batch_size=512'
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
