"""Megatron-Core's paged stash of the fused grouped MLP's saved tensors (ParallelPlan.moe_paged_stash;
docs/formulas.md#mem.paged_stash, docs/validation.md#paged-stash).

Source: NVIDIA/Megatron-LM megatron/core/transformer/moe/paged_stash.py at 1e23526adc: on_save_for_backward pages
the tensors that carry `grouped_tensor_scale_inv`; allocate_stash_buffers sizes one device pool per (dtype,
hidden) at moe_paged_stash_buffer_size_factor_cuda x the peak of the average rows in flight (max_num_tokens //
moe_expert_rank_capacity_factor, moe/experts.py _fused_forward); TransformerConfig.__post_init__ asserts the rank
capacity factor and refuses cpu_offloading and the experts' fine-grained offloads. NVIDIA/TransformerEngine
pytorch/ops/fused/grouped_mlp.py at d0067d0da marks fc1's input, fc1's output (activation_in, bf16), the
probabilities (scales) and fc2's input (mark_grouped_tensor; columnwise data and scales for the MXFP8 ones).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from test_export import PLANS, parse_megatron

from llmplan.cost.activations import layer_activation_parts
from llmplan.export import render_all
from llmplan.planfile import load_plan
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

MXFP8 = 1 + 1 / 32  # one E4M3 byte and an E8M0 scale per 32 elements (OCP Microscaling spec v1.0)


def _plan(**kw: object) -> ParallelPlan:
    base: dict[str, object] = {"dp": 8, "ep": 8, "seq_len": 4096, "micro_batch": 1, "global_batch": 64,
                               "dtype": "fp8", "recipe": "mxfp8", "expert_gemm": "grouped",
                               "cuda_graphs": "full-iteration", "moe_dispatcher": "deepep",
                               "moe_flex_backend": "hybridep"}
    base.update(kw)
    return ParallelPlan(**base)  # type: ignore[arg-type]


def test_the_page_pool_holds_the_marked_rows_at_the_preset_factor_by_hand():
    # Qwen3-30B-A3B (h 2,048, k 8, f_e 768, SwiGLU), one rank, T = 4,096 tokens, every layer MXFP8 on the fused
    # grouped MLP. Marked per (token, expert) row: fc1's input columnwise (h MXFP8), fc1's bf16 output (2 f_e x 2
    # bytes), the fp32 probability (4), fc2's input columnwise (f_e MXFP8). The pool is 1.2 x the average rows
    # (Megatron-Bridge's presets: moe_paged_stash_buffer_size_factor_cuda 1.2), the dynamic saving already 1 x.
    m = builtin_models()["qwen3-30b-a3b"]
    rows = 4096 * 8
    hand = 0.2 * rows * (2048 * MXFP8 + 2 * 768 * 2 + 4 + 768 * MXFP8)
    on = float(layer_activation_parts(m, _plan(moe_paged_stash=1.2), True).mlp)
    off = float(layer_activation_parts(m, _plan(cuda_graphs="none"), True).mlp)  # dynamic sizes: 1 x the rows
    assert on - off == pytest.approx(hand)
    # a factor of 1.0 sizes the pool at the average rows: no headroom
    assert float(layer_activation_parts(m, _plan(moe_paged_stash=1.0), True).mlp) == pytest.approx(off)


def test_without_the_stash_the_budget_pads_every_routed_row():
    # HybridEP's dispatch output under the static budget has T x topk x factor rows (setup_metadata), and the
    # experts' saved tensors take that shape. BF16 Qwen3-30B-A3B, T = 4,096, k 8: per (token, expert) row the
    # dispatched input (2 h bytes) and the SwiGLU's saved fc1 output and product (2 x 2 f_e + 2 f_e bytes)
    m = builtin_models()["qwen3-30b-a3b"]
    rows, row = 4096 * 8, 2 * 2048 + 6 * 768
    bf16 = {"dtype": "bf16", "recipe": "tensorwise"}
    dynamic = float(layer_activation_parts(m, _plan(cuda_graphs="none", **bf16), True).mlp)
    budget = float(layer_activation_parts(m, _plan(**bf16), True).mlp)
    assert budget - dynamic == pytest.approx(0.5 * rows * row)  # the default factor 1.5
    wide = float(layer_activation_parts(m, _plan(moe_rank_capacity_factor=2.0, **bf16), True).mlp)
    assert wide - dynamic == pytest.approx(1.0 * rows * row)
    # a capacity factor (drop and pad) sets no budget: its own padding only
    drop = {"cuda_graphs": "full-iteration", "moe_capacity_factor": 1.0, **bf16}
    assert float(layer_activation_parts(m, _plan(**drop), True).mlp) == pytest.approx(dynamic)
    # the stash on MXFP8 keeps the used rows (and its pool) below the padded layer it replaces
    on = float(layer_activation_parts(m, _plan(moe_paged_stash=1.2), True).mlp)
    assert on < float(layer_activation_parts(m, _plan(), True).mlp)


def test_no_pool_off_the_fused_mxfp8_grouped_mlp():
    # the stash context is opened in TEGroupedMLP._fused_forward only: BF16 experts page nothing
    m = builtin_models()["qwen3-30b-a3b"]
    on = _plan(dtype="bf16", recipe="tensorwise", moe_paged_stash=1.2)
    assert float(layer_activation_parts(m, on, True).mlp) == pytest.approx(
        float(layer_activation_parts(m, on.model_copy(update={"moe_paged_stash": None}), True).mlp))


def _messages(plan: ParallelPlan) -> list[str]:
    return [v.message for v in check_plan(builtin_models()["qwen3-30b-a3b"], plan) if "paged stash" in v.message]


def test_check_plan_asks_for_the_static_budget_of_a_full_iteration_graph():
    assert _messages(_plan(moe_paged_stash=1.2)) == []
    msgs = _messages(_plan(moe_paged_stash=1.2, cuda_graphs="none"))
    assert len(msgs) == 1
    assert "moe_paged_stash (1.2) with cuda_graphs none" in msgs[0]
    assert "static per-rank budget" in msgs[0] and "--train-cuda-graphs full-iteration" in msgs[0]


def test_check_plan_refuses_the_stash_beside_an_offload_of_the_experts_tensors():
    msgs = _messages(_plan(moe_paged_stash=1.2, offload_moe_act=True))
    assert len(msgs) == 1 and "offload_moe_act True" in msgs[0] and "drop those offloads" in msgs[0]


def test_check_plan_refuses_the_stash_beside_offload_modules_moe_act():
    # TransformerConfig.__post_init__ (1e23526adc): offload_modules must not include expert_fc1, moe_act or
    # fused_group_mlp with moe_paged_stash; moe_act listed in offload_modules (not offload_moe_act) counts too
    for mod in ("moe_act", "expert_fc1"):
        msgs = _messages(_plan(moe_paged_stash=1.2, offload_modules=(mod,)))
        assert len(msgs) == 1 and f"offload_modules ({mod})" in msgs[0], msgs
    assert _messages(_plan(moe_paged_stash=1.2, offload_modules=("core_attn",))) == []


def _stash_cli_args() -> tuple[str, ...]:
    return ("estimate", "-m", "mixtral-8x7b", "--hardware", "dgx-h100", "--nodes", "4", "--tp", "2", "--pp", "2",
            "--dp", "8", "--ep", "8", "--global-batch", "256", "--moe-dispatcher", "deepep",
            "--moe-flex-backend", "hybridep")


def test_the_cli_refusal_names_a_route_that_works(cli, tmp_path):
    # the advice names training's CUDA-graph flag (--train-cuda-graphs; --cuda-graphs is the serving boolean) and
    # the plan file's key; following either (the flag, or a plan file with cuda_graphs full-iteration) prices it
    r = cli(*_stash_cli_args(), "--moe-paged-stash", "1.2")
    assert r.code == 2 and "Traceback" not in r.err and "--train-cuda-graphs full-iteration" in r.err, r.err
    assert "--cuda-graphs full-iteration" not in r.err and "breaks a rule:" in r.err, r.err
    flag = cli(*_stash_cli_args(), "--moe-paged-stash", "1.2", "--train-cuda-graphs", "full-iteration")
    assert flag.code == 0, flag.err
    doc = json.loads((PLANS / "moe_train.json").read_text())
    doc["plan"].update({"cuda_graphs": "full-iteration", "moe_dispatcher": "deepep", "moe_flex_backend": "hybridep",
                        "moe_paged_stash": 1.2})
    f = tmp_path / "stash.json"
    f.write_text(json.dumps(doc))
    ok = cli("estimate", "--plan", f)
    assert ok.code == 0, ok.err


def test_a_rank_capacity_below_one_is_refused_in_one_line(cli):
    # a budget below the average rows makes HybridEP drop tokens; llmplan prices a dropless layer
    r = cli(*_stash_cli_args(), "--moe-rank-capacity-factor", "0.5")
    assert r.code == 2 and "Traceback" not in r.err and "0.5" in r.err and len(r.err.strip().splitlines()) <= 3
    with pytest.raises(ValueError, match="moe_rank_capacity_factor"):
        _plan(moe_rank_capacity_factor=0.9)
    assert _plan(moe_rank_capacity_factor=1.0).moe_rank_capacity_factor == 1.0


def test_megatron_export_writes_the_stash_and_its_pool_factor():
    pf = load_plan(PLANS / "moe_train.json")
    graphs = {"cuda_graphs": "full-iteration", "moe_dispatcher": "deepep", "moe_flex_backend": "hybridep",
              "dtype": "fp8", "recipe": "mxfp8", "expert_gemm": "grouped"}

    def parsed(**kw: object):
        plan = pf.plan.model_copy(update={**graphs, **kw})
        return parse_megatron(render_all(dataclasses.replace(pf, plan=plan), "megatron")[0]["megatron_pretrain.sh"])[0]

    ns = parsed(moe_paged_stash=1.2)  # an unknown flag or a switch given a value fails in the recorded parser
    assert ns.moe_paged_stash is True
    assert float(ns.moe_paged_stash_buffer_size_factor_cuda) == 1.2
    assert float(ns.moe_expert_rank_capacity_factor) == 1.5  # the budget the stash needs
    off = parsed()
    assert not off.moe_paged_stash and off.moe_paged_stash_buffer_size_factor_cuda is None


def test_one_layer_at_the_budgets_rows_sits_beside_the_pool():
    # pp 1, one micro-batch in flight, 48 MoE layers: the stage's activations grow by the pool's headroom on each
    # layer and by one layer's marked tensors at the budget's rows (1.5 x by default: the padded originals until
    # the next layer's wait, the reloaded copy in backward)
    from llmplan.cost.memory import activation_bytes
    m = builtin_models()["qwen3-30b-a3b"]
    rows, row = 4096 * 8, 2048 * MXFP8 + 2 * 768 * 2 + 4 + 768 * MXFP8
    off = float(activation_bytes(m, _plan(cuda_graphs="none"), 0).layers)  # dynamic sizes: 1 x the rows
    on = float(activation_bytes(m, _plan(moe_paged_stash=1.2), 0).layers)
    assert on - off == pytest.approx(48 * 0.2 * rows * row + 1.5 * rows * row)
    wide = float(activation_bytes(m, _plan(moe_paged_stash=1.2, moe_rank_capacity_factor=5.0), 0).layers)
    assert wide - on == pytest.approx(3.5 * rows * row)


def test_rank_capacity_is_exported_and_refused_outside_the_graph():
    pf = load_plan(PLANS / "moe_train.json")
    plan = pf.plan.model_copy(update={"cuda_graphs": "full-iteration", "moe_dispatcher": "deepep",
                                      "moe_flex_backend": "hybridep", "moe_rank_capacity_factor": 1.2})
    ns = parse_megatron(render_all(dataclasses.replace(pf, plan=plan), "megatron")[0]["megatron_pretrain.sh"])[0]
    assert float(ns.moe_expert_rank_capacity_factor) == 1.2
    msgs = [v.message for v in check_plan(builtin_models()["qwen3-30b-a3b"],
                                          _plan(moe_rank_capacity_factor=1.2, cuda_graphs="none"))]
    assert any("moe_rank_capacity_factor (1.2) with cuda_graphs none" in x for x in msgs)


def _transient(**kw: object) -> float:
    from llmplan.cost.memory import activation_bytes
    return float(activation_bytes(builtin_models()["qwen3-30b-a3b"], _plan(moe_paged_stash=1.2, **kw), 0)
                 .stash_transient)


def test_the_transient_is_one_whole_layer_and_not_doubled_by_recompute():
    # Qwen3-30B-A3B at T = 4,096, k 8: one MoE layer's marked tensors at the 1.5 x budget's rows
    rows, row = 4096 * 8, 2048 * MXFP8 + 2 * 768 * 2 + 4 + 768 * MXFP8
    assert _transient() == pytest.approx(1.5 * rows * row)
    # half the layers in bf16 (bf16_layers_start 24 of 48): the fused MXFP8 layers still page one whole layer
    assert _transient(bf16_layers_start=24) == pytest.approx(1.5 * rows * row)
    # full recompute / selective moe: the rebuilt layer's working set holds its marked tensors at 1 x the rows,
    # the budget pads 0.5 x more
    assert _transient(recompute="full") == pytest.approx(0.5 * rows * row)
    assert _transient(recompute="selective", recompute_modules=("moe",)) == pytest.approx(0.5 * rows * row)
    assert _transient(recompute="selective", recompute_modules=("core_attn",)) == pytest.approx(1.5 * rows * row)


def test_a_rank_with_two_stages_holds_one_transient():
    # DualPipe: stages i and pp-1-i on one rank, one MoE layer runs at a time
    from llmplan.cost.memory import activation_bytes, paired_activations
    m = builtin_models()["qwen3-30b-a3b"]
    a = activation_bytes(m, _plan(moe_paged_stash=1.2), 0)
    both = paired_activations(a, a)
    assert float(both.layers) == pytest.approx(2 * float(a.layers) - float(a.stash_transient))
    assert float(both.stash_transient) == pytest.approx(float(a.stash_transient))


@pytest.mark.parametrize("value", ["0", "-1", "nan", "4.5"])
def test_a_pool_factor_out_of_range_is_one_line(cli, value):
    # --moe-paged-stash takes Megatron's buffer-size factor, 1 to 4 (the presets use 1.2)
    r = cli(*_stash_cli_args(), "--moe-paged-stash", value)
    assert r.code == 2 and "Traceback" not in r.err and "moe-paged-stash" in r.err, r.err
    assert len(r.err.strip().splitlines()) <= 3, r.err
