"""torchao's fp8_params only where FSDP2's float8 all-gather runs (docs/formulas.md#mem.torchao_fp8_shard).

pytorch/ao@36027d82d1 torchao/float8/fsdp_utils.py: WeightWithDynamicFloat8CastTensor wraps the original-precision
weight and casts it to float8 only in fsdp_pre_all_gather; float8_linear.py casts the weight every forward and
backward unless tensor_already_casted_to_fp8. pytorch/torchtitan v0.2.2 (73a0e69) components/quantization/float8.py
turns the gather on only with dp_shard_enabled. So fp8_params on torchao's Float8Linear (fp8 tensorwise, tp_impl
dtensor) is check_plan's refusal below zero 2 or on one shard rank, and where it runs the stored shard stays bf16.
"""

from __future__ import annotations

import json

import pytest

from refusal import one_line

TORCHAO = ["--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--precision", "fp8-tensorwise",
           "--tp-impl", "dtensor", "--tp", "1"]
LLAMA_8B_PARAMS = 8_030_261_248  # meta-llama/Llama-3.1-8B model card / safetensors index: 8.03B parameters


@pytest.mark.parametrize(("axes", "values"), [(["--zero", "1"], "at zero 1 over 8 shard ranks"),
                                              (["--zero", "3", "--dp", "1", "--pp", "8"], "at zero 3 over 1 shard rank:")])
def test_fp8_params_without_the_float8_all_gather_is_refused(cli, axes, values):
    r = cli("estimate", *TORCHAO, *axes, "--fp8-params")
    assert r.code == 2 and "Traceback" not in r.err, r.err
    line = one_line(r.err)
    assert "fp8_params with torchao's Float8Linear (fp8 tensorwise, tp_impl dtensor) " + values in line, line
    assert "torchao keeps fp8 weights only in FSDP2's float8 all-gather" in line, line
    assert "use --zero 3 with dp or cp > 1, or drop --fp8-params" in line, line


def test_the_megatron_stack_keeps_fp8_params_at_zero_1(cli):
    """Transformer Engine's fp8 primary weights (Megatron --fp8-param-gather) need no FSDP: not this rule's."""
    r = cli("estimate", *[a if a != "dtensor" else "megatron" for a in TORCHAO], "--zero", "1", "--fp8-params", "--json")
    assert r.code == 0, r.err


def _weights(cli, *flags) -> float:
    r = cli("estimate", *TORCHAO, "--zero", "3", *flags, "--json")
    assert r.code == 0, r.err
    return json.loads(r.out)["memory"]["weights"]


def test_the_zero3_shard_stays_bf16_under_the_float8_all_gather(cli):
    """By hand: 2 B x 8,030,261,248 weights / 8 shard ranks = 2,007,565,312 B, fp8_params or not (before this,
    1 B a Float8Linear weight: 1,135,150,080 B)."""
    by_hand = 2 * LLAMA_8B_PARAMS / 8
    assert _weights(cli, "--fp8-params") == pytest.approx(by_hand, rel=1e-12)
    assert _weights(cli, "--no-fp8-params") == pytest.approx(by_hand, rel=1e-12)


def _plans(cli, *flags) -> list[dict]:
    r = cli("search", *TORCHAO[:-2], *flags, "--top", "40", "--json")
    assert r.code == 0, r.err
    return [p["plan"] for p in json.loads(r.out)["plans"]]


def test_the_search_never_returns_the_refused_combination(cli):
    plans = _plans(cli)
    assert plans and all(p["zero"] >= 2 and p["dp"] * p["cp"] // p["dp_replicate"] > 1
                         for p in plans if p["fp8_params"])
    pinned = _plans(cli, "--zero", "1")  # every fp8_params plan cut: the search keeps the plain setting
    assert pinned and not any(p["fp8_params"] for p in pinned)
