"""NVIDIA's published cuDNN norm benchmark rows, written once for the tests that read them (test_norm_bytes,
test_norm_kernel): NVIDIA/cudnn-frontend benchmark/norms/results/<gpu>/all_models_<stamp>.csv at 3929da2ef4
(bf16, cuDNN Frontend 1.19), measured by benchmark/norms/benchmark_single_norm.py, whose GB/s is the bytes it
counts over the median time (compute_bandwidth_bytes). The rows: every rms_norm shape with N and C >= 4096 and
GPT-3 175B's LayerNorm (with bias) at 1,024 tokens; times rounded to the microsecond (ROUNDING)."""

from __future__ import annotations

from typing import NamedTuple


class Row(NamedTuple):
    """One shape of one CSV: the cudnn backend's times and GB/s, and the pytorch backend's times (native
    layer_norm / rms_norm, FusedRmsNormBackward0) where the test reads them (None: not transcribed here)."""

    shape: str
    n: int
    """N, tokens (rows of the normalised tensor)."""
    c: int
    """C, hidden size (the normalised width)."""
    cudnn_fwd_ms: float
    cudnn_bwd_ms: float
    cudnn_fwd_gb_s: float
    cudnn_bwd_gb_s: float
    torch_fwd_ms: float | None
    torch_bwd_ms: float | None


ROUNDING = 0.0005
"""The CSV's times are rounded to the microsecond: half of it either way, in ms."""

CSV = {"gb200": "gb200/all_models_20260226_180237.csv", "gb300": "gb300/all_models_20260226_190305.csv",
       "h200": "h200/all_models_20260227_035147.csv"}
"""Which results file each GPU's rows come from."""

ROWS: dict[str, tuple[Row, ...]] = {
    "gb200": (
        Row("llama3-8b", 16384, 4096, 0.042, 0.065, 6424.6, 6187.3, 0.050, 0.178),
        Row("llama3-70b", 8192, 8192, 0.045, 0.077, 5997.4, 5200.5, 0.054, 0.177),
        Row("llama31-405b", 4096, 16384, 0.044, 0.084, 6119.7, 4787.2, 0.071, 0.198),
        Row("llama4-e16", 8192, 5120, 0.028, 0.051, 5986.8, 4950.7, 0.037, 0.129),
        Row("gpt3-175b", 1024, 12288, 0.013, 0.053, 3758.4, 1413.4, None, None),
        Row("mixtral-8x7b", 8192, 4096, 0.023, 0.036, 5843.7, 5633.7, 0.029, 0.096),
        Row("mixtral-8x22b", 4096, 6144, 0.017, 0.036, 5848.7, 4184.4, 0.025, 0.078),
        Row("nemotronh-56b", 4096, 8192, 0.023, 0.041, 5934.0, 4885.9, 0.032, 0.095),
        Row("qwen3-235b", 8192, 5120, 0.028, 0.050, 6000.5, 5051.7, 0.037, 0.129),
    ),
    "gb300": (
        Row("llama3-8b", 16384, 4096, 0.042, 0.066, 6459.5, 6133.5, None, None),
        Row("llama3-70b", 8192, 8192, 0.045, 0.074, 5962.9, 5467.3, None, None),
        Row("llama31-405b", 4096, 16384, 0.044, 0.082, 6079.4, 4896.8, None, None),
        Row("llama4-e16", 8192, 5120, 0.028, 0.050, 5979.9, 5058.6, None, None),
        Row("gpt3-175b", 1024, 12288, 0.013, 0.052, 3775.9, 1467.0, None, None),
        Row("mixtral-8x7b", 8192, 4096, 0.022, 0.036, 5968.1, 5534.3, None, None),
        Row("mixtral-8x22b", 4096, 6144, 0.017, 0.035, 5959.5, 4338.2, None, None),
        Row("nemotronh-56b", 4096, 8192, 0.022, 0.041, 5976.0, 4908.6, None, None),
        Row("qwen3-235b", 8192, 5120, 0.027, 0.050, 6105.0, 5071.9, None, None),
    ),
    "h200": (
        Row("llama3-8b", 16384, 4096, 0.072, 0.106, 3708.1, 3801.0, 0.080, 0.223),
        Row("llama3-70b", 8192, 8192, 0.071, 0.114, 3770.9, 3526.2, 0.102, 0.260),
        Row("llama31-405b", 4096, 16384, 0.070, 0.118, 3845.2, 3420.0, 0.112, 0.261),
        Row("llama4-e16", 8192, 5120, 0.045, 0.069, 3762.0, 3658.5, 0.054, 0.172),
        Row("gpt3-175b", 1024, 12288, 0.016, 0.080, 3227.0, 945.9, None, None),
        Row("mixtral-8x7b", 8192, 4096, 0.035, 0.058, 3790.3, 3499.9, 0.043, 0.114),
        Row("mixtral-8x22b", 4096, 6144, 0.029, 0.049, 3461.6, 3086.8, 0.036, 0.104),
        Row("nemotronh-56b", 4096, 8192, 0.041, 0.061, 3311.3, 3279.2, 0.053, 0.132),
        Row("qwen3-235b", 8192, 5120, 0.045, 0.069, 3770.2, 3631.5, 0.054, 0.172),
    ),
}
