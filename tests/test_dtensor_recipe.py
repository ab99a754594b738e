"""check_plan's dtensor_recipe: low precision on the PyTorch-native stack (tp_impl dtensor) only in torchao's float8
recipes llmplan models (tensorwise, rowwise: cost.quantize.torchao_float8, Float8Linear).

pytorch/torchtitan v0.2.2 (73a0e69) components/quantization/mx.py registers MXLinearConverter and
MXGroupedMMConverter as "quantize.linear.mx" / "quantize.grouped_mm.mx" (torchao's MXLinear and MXFP8 grouped
GEMMs); torchtitan 0.3.0 (PyPI wheel) has MXFP8LinearConverter / MXFP8GroupedExpertsConverter (mx.py) and
NVFP4LinearConverter (nvfp4.py). llmplan prices none of them, and its torchtitan exports write the float8 converters
alone, so such a plan is refused where it is made, not only at export.
"""

from __future__ import annotations

import pytest

from refusal import one_line

B200 = ["--model", "llama-3.1-8b", "--hardware", "dgx-b200", "--nodes", "1", "--tp", "2", "--sp"]


@pytest.mark.parametrize(("precision", "words"), [("mxfp8", "recipe mxfp8 (fp8) with tp_impl dtensor"),
                                                  ("nvfp4", "recipe nvfp4 (fp4) with tp_impl dtensor")])
def test_an_unmodelled_recipe_on_the_pytorch_native_stack_is_refused(cli, precision, words):
    r = cli("estimate", *B200, "--precision", precision, "--tp-impl", "dtensor")
    assert r.code == 2 and "Traceback" not in r.err, r.err
    line = one_line(r.err)
    assert words in line and "quantize.linear.mx" in line, line
    assert "use --tp-impl megatron" in line and "--precision fp8-rowwise / fp8-tensorwise" in line, line


def test_blockwise_is_refused_for_its_own_reason_not_as_an_mx_recipe(cli):
    """Block scaling (1x128 / 128x128 tiles) is no MX recipe: on the PyTorch-native stack it is torchao's prototype
    Float8BlockwiseLinear (pytorch/ao@db46a188 torchao/prototype/blockwise_fp8_training/linear.py), which no
    torchtitan converter runs (components/quantization: float8, mx, nvfp4). The refusal names that, not the MX
    converters."""
    r = cli("estimate", *B200, "--precision", "fp8-blockwise", "--tp-impl", "dtensor")
    assert r.code == 2 and "Traceback" not in r.err, r.err
    line = one_line(r.err)
    assert "recipe blockwise (fp8) with tp_impl dtensor" in line and "Float8BlockwiseLinear" in line, line
    assert "mx" not in line.lower().replace("max", ""), line
    assert "use --tp-impl megatron" in line and "--precision fp8-rowwise / fp8-tensorwise" in line, line


@pytest.mark.parametrize(("precision", "impl"), [("mxfp8", "megatron"), ("fp8-rowwise", "dtensor"),
                                                 ("fp8-tensorwise", "dtensor"), ("bf16", "dtensor")])
def test_the_modelled_stacks_stand(cli, precision, impl):
    r = cli("estimate", *B200, "--precision", precision, "--tp-impl", impl, "--json")
    assert r.code == 0, r.err


def test_a_search_on_that_stack_is_refused_in_one_line(cli):
    r = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-b200", "--nodes", "1", "--precision", "mxfp8",
            "--tp-impl", "dtensor")
    assert r.code == 2 and "Traceback" not in r.err, r.err
    line = one_line(r.err)
    assert "dtensor_recipe" in line or "recipe mxfp8 (fp8) with tp_impl dtensor" in line, line
