"""Which modules torchtitan v0.2.2's float8 grouped-GEMM converter takes with the exported fqns.

pytorch/torchtitan v0.2.2 (73a0e69) components/quantization/float8.py, Float8GroupedMMConverter.convert: its
moe_module_filter_fn returns True where any `target_fqn in cur_fqn` (a substring of the module's FQN), and hands it
to torchao's quantize_; pytorch/ao v0.16.0 (the release beside v0.2.2's pinned nightly, the last with
MoETrainingConfig) torchao/quantization/quant_api.py _replace_with_custom_fn_if_matches_filter walks the modules
top-down and, at the first module that matches, applies the config's handler and does not descend further;
prototype/moe_training/conversion_utils.py _swap_params then wraps every parameter under that module. Module FQNs
of a DeepSeek-V3 MoE layer at v0.2.2: models/deepseek_v3/model/model.py (TransformerBlock.moe, .attention,
layers a ModuleDict keyed by layer id), models/moe/moe.py (MoE.experts, .router with .gate, .reorderer,
.shared_experts: FeedForward with w1, w2, w3). v0.2.2's own DeepSeek configs write fqns = ["experts"]
(models/deepseek_v3/train_configs/deepseek_v3_671b.toml), which takes moe.shared_experts too; llmplan prices the
routed experts' grouped GEMMs alone (the shared expert is a Float8Linear FFN).
"""

from __future__ import annotations

import tomllib

import pytest

from llmplan.export import render_all
from llmplan.planfile import load_plan

MOE_LAYER = ["layers", "layers.3", "layers.3.attention", "layers.3.attention.wq_a", "layers.3.attention.wkv_a",
             "layers.3.attention.wo", "layers.3.moe", "layers.3.moe.router", "layers.3.moe.router.gate",
             "layers.3.moe.reorderer", "layers.3.moe.experts", "layers.3.moe.shared_experts",
             "layers.3.moe.shared_experts.w1", "layers.3.moe.shared_experts.w2", "layers.3.moe.shared_experts.w3",
             "layers.0.feed_forward", "layers.0.feed_forward.w1", "output"]


def converted(fqns: list[str]) -> set[str]:
    """The modules quantize_ hands the handler: matched by torchtitan's substring filter, the first on each path
    from the root (a matched module's children are not visited)."""
    hit = {f for f in MOE_LAYER if any(t in f for t in fqns)}
    return {f for f in hit if not any(f.startswith(h + ".") for h in hit)}


@pytest.fixture(scope="module")
def dsv3_rowwise(tmp_path_factory):
    from conftest import run_cli
    path = tmp_path_factory.mktemp("plans") / "dsv3.json"
    r = run_cli("estimate", "--model", "deepseek-v3", "--hardware", "dgx-h100", "--nodes", "32", "--tp", "1",
                "--ep", "32", "--zero", "3", "--precision", "fp8-rowwise", "--mtp-layers", "0", "--save", str(path))
    assert r.code == 0, r.err
    return load_plan(path)


def test_v022s_own_fqns_take_the_shared_expert_too():
    assert converted(["experts"]) == {"layers.3.moe.experts", "layers.3.moe.shared_experts"}


def test_the_export_converts_the_routed_experts_alone(dsv3_rowwise):
    cfg = tomllib.loads(render_all(dsv3_rowwise, "torchtitan-0.2")[0]["torchtitan-v0.2.2.toml"])
    assert cfg["model"]["converters"] == ["quantize.linear.float8", "quantize.grouped_mm.float8"]
    fqns = cfg["quantize"]["grouped_mm"]["float8"]["fqns"]
    assert converted(fqns) == {"layers.3.moe.experts"}
    # the linear converter's filter (module_filter_fn: skipped where a filter fqn is a substring) keeps the
    # shared expert's linears in Float8Linear and the router gate, output layer in bf16, as priced
    skip = cfg["quantize"]["linear"]["float8"]["filter_fqns"]
    assert not any(s in "layers.3.moe.shared_experts.w1" for s in skip)
    assert all(any(s in f for s in skip) for f in ("layers.3.moe.router.gate", "output"))
