#!/usr/bin/env bash
# llmplan VERSION export for vLLM (vllm serve; flags checked against vLLM 0.33.0)
# plan: tp 4 pp 1 replicas 2 ep 1, weights fp8, KV fp8
# model: llama-3.1-70b (meta-llama/Llama-3.1-70B config.json;
#   meta-llama/llama-models MODEL_CARD)
# hardware: 1 x dgx-h100 = 8 x h100-sxm
# predicted: 50.0 of 71.0 GiB per GPU; TTFT 50.0 ms, TPOT 20.00 ms, 20,000
#   output tokens/s
set -euo pipefail
# --max-model-len 2560: the planned input (2048) + output (512) tokens, for
#   which the KV capacity was predicted; llama-3.1-70b accepts up to 131,072:
#   re-plan with longer --input-len / --output-len to serve longer requests
MODEL=${MODEL:-meta-llama/Llama-3.1-70B-Instruct}
# unset VLLM_PORT: set, vLLM searches each server's free ports (its DP master
#   ports among them) upward from it, probing by bind and close
#   (vllm-project/vllm @aedcda89, vllm/foundation/utilities/network_utils.py
#   _get_open_port, get_open_ports_list), so servers started together pick the
#   same ports, and a search can take a port the script gives a server; unset,
#   the OS picks free ones
unset VLLM_PORT
vllm serve "$MODEL" \
    --tensor-parallel-size 4 \
    --pipeline-parallel-size 1 \
    --data-parallel-size 2 \
    --max-model-len 2560 \
    --gpu-memory-utilization 0.9 \
    --max-num-seqs 256 \
    --max-num-batched-tokens 8192 \
    --block-size 16 \
    --kv-cache-dtype fp8 \
    --quantization fp8 \
    --enable-prefix-caching \
    --enable-chunked-prefill
