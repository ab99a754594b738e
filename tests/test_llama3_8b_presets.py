"""Llama 3 8B's Megatron-Bridge pretrain presets as benchmarks/accuracy.py reads them (docs/validation.md#small-dense-blackwell).
Source: NVIDIA-NeMo/Megatron-Bridge scripts/performance/configs/llama3/workload_base_configs.py at v0.2.0 (25.11,
717c62de): LLAMA3_8B_{B200,GB200,GB300}_{BF16,FP8_CS,FP8_MX}_BASE_CONFIG set cuda_graph_impl "local" with
cuda_graph_scope "full_iteration"; the H100 presets set no CUDA graph. The 25.09 rows (v0.1.0rc4's YAML matrix says
only cuda_graphs true / false) keep none."""

import pytest


@pytest.mark.parametrize("rid, graphs", [
    ("bridge-2511-b200-fp8-cs-llama3-8b-8gpu-gbs128", "full-iteration"),
    ("bridge-2511-b200-mxfp8-llama3-8b-8gpu-gbs128", "full-iteration"),
    ("bridge-2511-gb200-fp8-cs-llama3-8b-8gpu-gbs128", "full-iteration"),
    ("bridge-2511-gb300-mxfp8-llama3-8b-8gpu-gbs128", "full-iteration"),
    ("bridge-2511-h100-fp8-cs-llama3-8b-8gpu-gbs128", "none"),
    ("bridge-2511-h100-fp8-cs-llama3-70b-64gpu-gbs128", "none"),
    ("mbridge-25.09-pretrain-llama3-8b-dgx-b200-8gpu-fp8-tp1pp1cp1ep1vpnagbs128mbs2", "none"),
])
def test_llama3_8b_rows_run_their_preset_graph(published_runs, acc, rid, graphs):
    rec = published_runs[rid]
    assert acc.mbridge_cuda_graphs(rec) == graphs
    assert acc.plan_for(rec, acc.family(rid), 8 if "-8gpu" in rid else 64).cuda_graphs == graphs
