"""check_plan's rules for the newer switches reach the command line as one line and exit code 2, naming the
values, the rule and the flag that fixes it."""

from __future__ import annotations

import json

import pytest
from test_hybrid import DEEPSEEK_V4_FLASH_CONFIG

ARGS = ("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-b200", "--global-batch", "64")


@pytest.mark.parametrize("extra, needles", [
    # Transformer Engine's FP8 dot-product attention is its fused (cuDNN) attention under an fp8 recipe
    (("--precision", "mxfp8", "--no-flash-attention", "--fp8-attention"),
     ("fp8_attention with dtype fp8 and unfused attention", "drop --fp8-attention")),
    (("--fp8-attention",), ("fp8_attention with dtype bf16", "use an fp8 --precision")),
    # Megatron-Bridge's DeepSeek-V4 recipes recompute "mhc", the hyper-connections a plain model lacks
    (("--recompute", "selective", "--recompute-modules", "mhc"),
     ("recompute_modules mhc", "mhc: hyper-connections", "drop them from --recompute-modules")),
    # values outside the switches' choices: named with the choices
    (("--grad-accumulation", "foo"), ("--grad-accumulation foo", "it must be one of fused, add, cast-add, copy",
                                      "give --grad-accumulation")),
    (("--expert-gemm", "foo"), ("--expert-gemm foo", "it must be one of grouped, per-expert")),
])
def test_bad_switch_combinations_exit_2_with_one_line(cli, extra, needles):
    bad = cli(*ARGS, *extra)
    assert bad.code == 2 and "Traceback" not in bad.err, bad.err
    for needle in needles:
        assert needle in bad.err, bad.err


def test_offload_wait_is_one_row_of_the_step_table(cli):
    out = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--seq-len", "8192", "--tp", "2",
              "--global-batch", "8", "--offload-activations-layers", "16")
    assert out.code == 0, out.err
    row = next(line for line in out.out.splitlines() if "offload copies" in line)
    assert "waiting for offload copies" in row and "mem.offload" in row and len(row) <= 80


@pytest.mark.parametrize("ratios, needle", [([8] * 44, "compress_ratios holds 8,"), ([[4]] * 44, "holds [4],"),
                                            ([True] * 44, "holds True,")])
def test_deepseek_v4_config_with_unknown_ratios_exits_2(cli, tmp_path, ratios, needle):
    # transformers configuration_deepseek_v4.py maps compress_ratios 0 / 4 / 128 to the layer kinds, nothing else
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**DEEPSEEK_V4_FLASH_CONFIG, "compress_ratios": ratios}))
    r = cli("estimate", "--model", path, "--hardware", "dgx-h100", "--tp", "1", "--ep", "8")
    assert r.code == 2 and needle in r.err and "must be 0 (sliding window)" in r.err and "Traceback" not in r.err


@pytest.mark.parametrize("extra", [{"compress_rates": {"compressed_sparse_attention": "x"}},
                                   {"compress_rate_hca": "x"}])
def test_deepseek_v4_config_with_a_textual_rate_names_the_field(cli, tmp_path, extra):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**DEEPSEEK_V4_FLASH_CONFIG, **extra}))
    r = cli("estimate", "--model", path, "--hardware", "dgx-h100", "--tp", "1", "--ep", "8")
    assert "compress_rate_" in r.refusal()
