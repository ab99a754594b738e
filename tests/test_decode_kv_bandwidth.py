"""Decode attention's KV-cache reads at their own published share of the HBM peak
(GpuSpec.decode_kv_hbm_efficiency, docs/formulas.md#infer.decode_kv_bandwidth), against FlashMLA's published
number: "The dense MLA decoding kernel achieves up to 3000 GB/s in memory-bound configuration ... on H800 SXM5"
(deepseek-ai/FlashMLA README.md at 9241ae3; docs/20250422-new-kernel-deep-dive.md: "3 TB/s memory bandwidth on
an H800 SXM5 GPU", whose peak it gives as 3.35 TB/s)."""

from __future__ import annotations

import pytest

from llmplan.cost.serve_step import step_compute_parts
from llmplan.serving import replica_spans
from llmplan.specs.plan import ClusterSpec
from llmplan.specs.registry import builtin_gpus, builtin_models, builtin_systems
from llmplan.specs.serve import ServePlan

FLASHMLA_H800_GB_S = 3000.0  # published, H800 SXM5, memory-bound configuration
GPUS = builtin_gpus()


def kv_seconds_per_byte(system: str) -> float:
    """Extra step time per extra KV byte of a memory-bound decode step of DeepSeek-V3 (MLA: 576 16-bit latents
    per token and layer) at TP8, one query per sequence: FlashMLA's memory-bound setting (16 query heads per
    GPU). The pairs stay fixed, so only the KV read moves."""
    m = builtin_models()["deepseek-v3"]
    plan = ServePlan(tp=8)
    sys_spec = builtin_systems()[system]
    cluster = ClusterSpec(system=sys_spec, num_nodes=1, gpus_per_node=8)
    spans = replica_spans(plan, cluster)
    B, c = 128, 4096  # sequences, cached tokens each
    pairs = B * c
    kv = B * c * 576 * 2.0 * m.num_hidden_layers
    t1 = sum(step_compute_parts(m, plan, sys_spec, spans, B, pairs, kv, decode_only=True))
    t2 = sum(step_compute_parts(m, plan, sys_spec, spans, B, pairs, 2 * kv, decode_only=True))
    return float(t2 - t1) / kv


def test_h800_decode_reads_the_kv_cache_at_flashmla_published_bandwidth() -> None:
    # The priced KV-read bandwidth of a decode step on H800 within 1% of the published 3,000 GB/s
    # (0.90 of 3,350 is 3,015).
    achieved = 1 / kv_seconds_per_byte("dgx-h800") / 1e9
    assert achieved == pytest.approx(FLASHMLA_H800_GB_S, rel=0.01)
    # The training kernels' share (compute.hbm_efficiency, 0.8 assumed on Hopper HBM3) is 11% below it.
    assert GPUS["h800"].hbm_achieved_bytes_per_s / 1e9 < 0.9 * FLASHMLA_H800_GB_S


def test_h100_carries_the_h800_value() -> None:
    """The same GH100 die and 3.35 TB/s HBM3."""
    assert GPUS["h100-sxm"].decode_kv_hbm_efficiency == GPUS["h800"].decode_kv_hbm_efficiency
    assert GPUS["h100-sxm"].hbm_gb_per_s == GPUS["h800"].hbm_gb_per_s


def test_the_96gb_h100_does_not_carry_it() -> None:
    """h100-sxm-96gb is the GH100 die on other memory (HBM2e at 2.4 TB/s, torchtitan's Grand Teton H100): the
    H800 / H100 value was measured on 3.35 TB/s HBM3, so it keeps the training share (its profile says why)."""
    gpu = GPUS["h100-sxm-96gb"]
    assert gpu.hbm_gb_per_s != GPUS["h800"].hbm_gb_per_s and gpu.decode_kv_hbm_efficiency is None
    assert gpu.decode_kv_achieved_bytes_per_s == pytest.approx(gpu.hbm_achieved_bytes_per_s, rel=1e-12)


def test_unpublished_gpu_reads_the_kv_cache_at_the_training_share() -> None:
    """H200 (HBM3e, 4.8 TB/s): no decode kernel's bandwidth is published; its KV reads take hbm_efficiency."""
    gpu = GPUS["h200"]
    assert gpu.decode_kv_hbm_efficiency is None
    assert 1 / kv_seconds_per_byte("dgx-h200") == pytest.approx(gpu.hbm_achieved_bytes_per_s, rel=1e-9)


@pytest.mark.parametrize("gpu, expected", [
    ("{decode_kv_hbm_efficiency: 1.2}", ["field 'gpu.decode_kv_hbm_efficiency'", "less than or equal to 1", "1.2"]),
    ("{decode_kv_hbm_efficiency: 0}", ["field 'gpu.decode_kv_hbm_efficiency'", "greater than 0"]),
])
def test_a_bad_decode_kv_share_in_a_hardware_file_is_one_line_and_exit_2(tmp_path, gpu, expected):
    """The real command refuses the field given wrong in a user's hardware file: one line, exit code 2."""
    from test_bad_input_files import llmplan, one_line

    f = tmp_path / "cluster.yaml"
    f.write_text(f"base: dgx-h100\ngpu: {gpu}\n")
    r = llmplan("search", "--mode", "infer", "--model", "llama-3.1-8b", "--hardware", f, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    line = one_line(r.stderr)
    assert line.startswith("error: ") and all(e in line for e in expected), line
