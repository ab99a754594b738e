#!/usr/bin/env bash
# llmplan VERSION export for SGLang (python -m sglang.launch_server; flags checked
#   against SGLang 0.5.23)
# plan: tp 4 pp 1 replicas 2 ep 1, weights fp8, KV fp8
# model: llama-3.1-70b (meta-llama/Llama-3.1-70B config.json;
#   meta-llama/llama-models MODEL_CARD)
# hardware: 1 x dgx-h100 = 8 x h100-sxm
# predicted: 50.0 of 71.0 GiB per GPU; TTFT 50.0 ms, TPOT 20.00 ms, 20,000
#   output tokens/s
set -euo pipefail
# memory fraction 0.89: gives the KV cache the 52.6 GiB per GPU planned with
#   vllm's rule (its fraction 0.9)
# --context-length 2560: the planned input (2048) + output (512) tokens, for
#   which the KV capacity was predicted; llama-3.1-70b accepts up to 131,072:
#   re-plan with longer --input-len / --output-len to serve longer requests
MODEL=${MODEL:-meta-llama/Llama-3.1-70B-Instruct}
# unset SGLANG_PORT: set, SGLang searches its free ports upward from it, probing
#   before it binds (srt/utils/network.py get_open_port; shm_broadcast.py binds
#   in SGLANG_PORT .. + 8), so servers started together pick the same ports, and
#   a search can take a port the script gives a server; unset, the OS picks free
#   ones
unset SGLANG_PORT
python -m sglang.launch_server --model-path "$MODEL" \
    --tp-size 4 \
    --pp-size 1 \
    --dp-size 2 \
    --context-length 2560 \
    --mem-fraction-static 0.89 \
    --max-running-requests 256 \
    --chunked-prefill-size 8192 \
    --page-size 16 \
    --kv-cache-dtype fp8_e4m3 \
    --quantization fp8
