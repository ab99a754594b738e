"""A norm backward in two kernels (ParallelPlan.norm_kernel two-pass, cost.elementwise.TWO_PASS_NORM_BYTES,
docs/formulas.md#compute.norm_bytes): Apex FusedLayerNorm, Megatron-LM's 2020-21 fused_kernels copy of it and
PyTorch's native layer_norm / rms_norm compute the input gradient in one kernel (read dy and x, write dx) and the
weight gradient in a second that reads dy and x again: 10 bytes an element backward against the one-pass 6.

Golden: NVIDIA's cuDNN norm harness publishes, per shape, cuDNN's one-pass kernel and PyTorch's native RMSNorm
(the `pytorch` backend: FusedRmsNormBackward0, the two kernels of aten/src/ATen/native/cuda/layer_norm_kernel.cu)
on the same GPU (NVIDIA/cudnn-frontend benchmark/norms/results/<gpu>/all_models_<stamp>.csv at 3929da2ef4,
bf16). A kernel that moves 10/6 the bytes at no better bandwidth takes at least 10/6 the time, so the published
backward ratio bounds the count from above; the forward, one pass in both, stays below it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from cudnn_norm_rows import ROUNDING, ROWS
from llmplan.cost.elementwise import FUSED_NORM_BYTES, TWO_PASS_NORM_BYTES, elementwise_bytes
from llmplan.cost.mixers import norms_per_layer
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan

TWO_BACKENDS = {gpu: tuple(r for r in ROWS[gpu] if r.torch_bwd_ms is not None) for gpu in ("gb200", "h200")}
"""The rms_norm rows with N and C >= 4096 of the CSVs read with both backends (tests/cudnn_norm_rows.py)."""


@pytest.mark.parametrize("gpu", sorted(TWO_BACKENDS))
def test_published_two_pass_backward_takes_at_least_its_bytes_ratio(gpu: str) -> None:
    """PyTorch's two-kernel backward over cuDNN's one-pass backward is at least TWO_PASS / FUSED (10 / 6) on every
    row (the times' rounding given to the ratio); the forward, one kernel in both, is below that on every row, so
    the rows do tell the passes apart. A count of more than 2x the one-pass bytes (12) would fail the H200
    mixtral-8x7b row (1.97x)."""
    ratio = TWO_PASS_NORM_BYTES[1] / FUSED_NORM_BYTES[1]
    backward = []
    for r in TWO_BACKENDS[gpu]:
        name, cudnn_fwd, cudnn_bwd, torch_fwd, torch_bwd = (r.shape, r.cudnn_fwd_ms, r.cudnn_bwd_ms,
                                                            r.torch_fwd_ms, r.torch_bwd_ms)
        assert torch_fwd is not None and torch_bwd is not None
        high = (torch_bwd + ROUNDING) / (cudnn_bwd - ROUNDING)
        assert high >= ratio, (gpu, name, torch_bwd / cudnn_bwd)
        assert (torch_fwd - ROUNDING) / (cudnn_fwd + ROUNDING) < ratio, (gpu, name)
        backward.append(torch_bwd / cudnn_bwd)
    assert min(backward) < 2 * ratio  # not so far above that the bytes could not be the cause


# (shape, N, C, cuDNN bwd ms, torch_compile bwd ms): the same CSVs' rms_norm rows with N and C >= 4096, backend
# cudnn and torch_compile (torch.compile of torch.nn.functional.rms_norm, benchmark_single_norm.py at 3929da2ef4; the
# image is nvcr.io/nvidia/pytorch:25.12-py3, benchmark/norms/Dockerfile).
COMPILED = {
    "h200": (  # h200/all_models_20260227_035147.csv
        ("llama3-8b", 16384, 4096, 0.106, 0.236), ("llama3-70b", 8192, 8192, 0.114, 0.236),
        ("llama31-405b", 4096, 16384, 0.118, 0.177), ("llama4-e16", 8192, 5120, 0.069, 0.156),
        ("mixtral-8x7b", 8192, 4096, 0.058, 0.118), ("mixtral-8x22b", 4096, 6144, 0.049, 0.087),
        ("nemotronh-56b", 4096, 8192, 0.061, 0.117), ("qwen3-235b", 8192, 5120, 0.069, 0.156),
    ),
    "gb200": (  # gb200/all_models_20260226_180237.csv
        ("llama3-8b", 16384, 4096, 0.065, 0.155), ("llama3-70b", 8192, 8192, 0.077, 0.163),
        ("llama31-405b", 4096, 16384, 0.084, 0.127), ("llama4-e16", 8192, 5120, 0.051, 0.128),
        ("mixtral-8x7b", 8192, 4096, 0.036, 0.083), ("mixtral-8x22b", 4096, 6144, 0.036, 0.072),
        ("nemotronh-56b", 4096, 8192, 0.041, 0.086), ("qwen3-235b", 8192, 5120, 0.050, 0.128),
    ),
    "gb300": (  # gb300/all_models_20260226_190305.csv
        ("llama3-8b", 16384, 4096, 0.066, 0.149), ("llama3-70b", 8192, 8192, 0.074, 0.160),
        ("llama31-405b", 4096, 16384, 0.082, 0.125), ("llama4-e16", 8192, 5120, 0.050, 0.124),
        ("mixtral-8x7b", 8192, 4096, 0.036, 0.079), ("mixtral-8x22b", 4096, 6144, 0.035, 0.071),
        ("nemotronh-56b", 4096, 8192, 0.041, 0.084), ("qwen3-235b", 8192, 5120, 0.050, 0.124),
    ),
}
HBM_BYTES_PER_S = {"h200": 4.8e12, "gb200": 8.0e12, "gb300": 8.0e12}
"""Peak HBM bandwidth per GPU as NVIDIA publishes it: H200 4.8 TB/s (H200 Tensor Core GPU datasheet); GB200 NVL72
and GB300 NVL72 576 TB/s over 72 GPUs, 8 TB/s each (the NVL72 product pages' specification tables)."""


@pytest.mark.parametrize("gpu", sorted(COMPILED))
def test_published_compiled_backward_is_at_least_the_two_pass_floor(gpu: str) -> None:
    """torch.compile's (Inductor's) RMSNorm backward moves at least the two-pass bytes (TWO_PASS_NORM_BYTES[1] per
    bf16 element: dx's kernel reads dy and x and writes dx, the dweight reduction's reads dy and x again), so no row
    can beat those bytes at the GPU's peak HBM bandwidth: every published time sits at or above that floor. A count
    of 13 bytes or more would put the H200 llama31-405b row (0.177 ms) under its floor. And on every row it takes
    more than 4 / 3 of cuDNN's one-pass time (1.50-2.56x), so it is not that one pass at cuDNN's bandwidth.
    The harness's torch (NGC 25.12) may already carry pytorch/pytorch#165370's fused mix-order kernel for some
    shapes; torchtitan's rows ran torch 1963fc8 (2024-12), before it (benchmarks/accuracy.py INDUCTOR_TWO_PASS_NORM)."""
    per_element = TWO_PASS_NORM_BYTES[1]  # bytes per bf16 element, as the harness runs it
    for name, n, c, cudnn_bwd, compiled_bwd in COMPILED[gpu]:
        floor_ms = per_element * n * c / HBM_BYTES_PER_S[gpu] * 1e3
        assert compiled_bwd + ROUNDING >= floor_ms, (gpu, name, compiled_bwd, floor_ms)
        assert (compiled_bwd - ROUNDING) / (cudnn_bwd + ROUNDING) > (FUSED_NORM_BYTES[1] + 2) / FUSED_NORM_BYTES[1], (
            gpu, name)


def test_two_pass_reads_dy_and_x_again() -> None:
    # forward one pass either way; backward the one-pass kernel's 6 and a second read of dy and x (2 + 2)
    assert TWO_PASS_NORM_BYTES[0] == FUSED_NORM_BYTES[0]
    assert TWO_PASS_NORM_BYTES[1] == FUSED_NORM_BYTES[1] + 2 + 2


DENSE: dict = {"name": "tiny", "intermediate_size": 512, "num_hidden_layers": 2, "vocab_size": 1000,
               "max_position_embeddings": 8192, "num_attention_heads": 8, "num_key_value_heads": 8}


@seed(32)
@settings(max_examples=40, deadline=None)
@given(h=st.sampled_from([512, 1024, 2048]), s=st.sampled_from([512, 1024, 4096]), b=st.integers(1, 4),
       t=st.sampled_from([1, 2, 4]), sp=st.booleans(), norm=st.sampled_from(["layernorm", "rmsnorm"]),
       parallel=st.booleans())
def test_two_pass_adds_four_bytes_an_element_per_norm_backward(h, s, b, t, sp, norm, parallel) -> None:
    """Whatever the width, sequence, micro-batch, TP and SP, two-pass adds 4 bytes per element of each norm's
    h-wide input to the backward (in elementwise_bytes' forward-equivalent units, 4 / 3), norms_per_layer of
    them a layer, each over the sequence shard with SP; without fused kernels the switch changes nothing."""
    m = ModelSpec(**DENSE, hidden_size=h, norm_type=norm, parallel_block=parallel)
    plan = ParallelPlan(seq_len=s, micro_batch=b, tp=t, sp=sp and t > 1)
    two = plan.model_copy(update={"norm_kernel": "two-pass"})
    extra = elementwise_bytes(m, two, False) - elementwise_bytes(m, plan, False)
    shard = t if plan.sp else 1
    assert extra * 3 == pytest.approx(4 * s * b * h / shard * norms_per_layer(m))
    eager = {"fused_kernels": False}
    assert (elementwise_bytes(m, two.model_copy(update=eager), False)
            == elementwise_bytes(m, plan.model_copy(update=eager), False))


def test_the_flag_reaches_the_plan_and_an_unknown_kernel_is_one_line(cli) -> None:
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--norm-kernel", "two-pass")
    assert r.code == 0, r.err
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--norm-kernel", "apex")
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and len(lines) == 1 and "Traceback" not in r.err, r.err
    assert "--norm-kernel apex" in lines[0] and "fused-one-pass" in lines[0] and "two-pass" in lines[0]


def test_two_pass_prices_a_longer_step_on_the_cli(cli) -> None:
    base = ("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--json")
    one = json.loads(cli(*base).out)
    two = json.loads(cli(*base, "--norm-kernel", "two-pass").out)
    assert two["plan"]["norm_kernel"] == "two-pass" and one["plan"]["norm_kernel"] == "fused-one-pass"
    assert two["time"]["compute_s"] > one["time"]["compute_s"]


@pytest.mark.parametrize("target", ["megatron", "megatron-bridge", "torchtitan"])
def test_one_pass_launchers_refuse_a_two_pass_plan(cli, tmp_path, target) -> None:
    args = ["estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--dp", "8", "--norm-kernel", "two-pass"]
    if target == "torchtitan":
        args += ["--zero", "3"]
    assert cli(*args, "--save", tmp_path / "p.json").code == 0
    r = cli("export", tmp_path / "p.json", "--to", target, "-o", tmp_path / "out")
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and len(lines) == 1, r.err
    assert "norm_kernel two-pass" in lines[0] and "--norm-kernel fused-one-pass" in lines[0], lines[0]
