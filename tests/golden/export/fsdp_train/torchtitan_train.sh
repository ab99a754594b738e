#!/usr/bin/env bash
# llmplan VERSION export for torchtitan 0.3.0 (config_registry + command-line
#   overrides)
# plan: tp 1 pp 1 dp 16 cp 1 ep 1 vpp 1 sp off zero 3 recompute full micro-batch
#   2 global batch 256 seq 8192 bf16
# model: llama-3.1-8b (meta-llama/Llama-3.1-8B config.json;
#   meta-llama/llama-models MODEL_CARD)
# hardware: 2 x dgx-h100 = 16 x h100-sxm
# predicted: 40.0 of 80.0 GiB per GPU; step 5.000 s, MFU 40.0%, 400,000 tokens/s
# note: priced with the rotary compiled (rope_complex false); torchtitan's
#   llama3 rotary is complex arithmetic, which torch.compile runs eager, so this
#   runs slower than priced: re-plan with --rope-complex to price it
# note: priced without FSDP2's copy-out (zero3_copy_out false); fully_shard
#   copies every all-gather into the parameters on the compute stream, so this
#   runs slower than priced: re-plan with --zero3-copy-out to price it
set -euo pipefail

GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NNODES=${NNODES:-2}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-29500}
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

torchrun --nproc-per-node "$GPUS_PER_NODE" --nnodes "$NNODES" \
    --node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" \
    --master-port "$MASTER_PORT" \
    -m torchtitan.train "${TORCHTITAN_ARGS[@]}"
