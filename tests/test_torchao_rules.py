"""torchao's float8 rules (docs/formulas.md#comm.torchao_fp8_gather, docs/validation.md#torchao-rules).

Read at pytorch/ao@36027d82d1 and pytorch/torchtitan v0.2.2 (73a0e69):
- torchao/float8/config.py, Float8LinearConfig.__post_init__: "enable_fsdp_float8_all_gather only supports
  tensorwise scaling granularity" (an assertion); torchtitan components/quantization/float8.py asserts the
  all-gather off with a recipe_name. So fp8_params (read as the float8 all-gather) has no rowwise form: check_plan's
  rule fp8_params_rowwise.
- torchao/prototype/moe_training/tensor.py, TrainingWeightWrapperBaseTensor.fsdp_pre_all_gather: the float8
  grouped-GEMM expert weights gather `self._data.to(mp_policy.param_dtype)`, bf16 (2 B a weight); torchao's
  float8 all-gather is Float8Linear's, and the routed experts are no nn.Linear.
Mixtral 8x7B: 32 MoE layers of 8 experts x 3 x 4096 x 14336 = 1,409,286,144 expert weights (no expert bias).
"""

from __future__ import annotations

import json

import pytest
from agreement import assert_arrays_agree, valid_sample

from llmplan.cost.comm import dp_transfers
from llmplan.cost.model_states import bf16_gathered_params, bf16_kept_params
from llmplan.cost.params import rank_params
from llmplan.search.grid import Workload, default_space, enumerate_plans
from llmplan.search.run import switch_variants
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

MIX = builtin_models()["mixtral-8x7b"]
EXPERTS = 32 * 8 * 3 * 4096 * 14336  # the routed experts' weights, ep 1: each rank gathers all of them
ROWWISE_FIX = "use --precision fp8-tensorwise or drop --fp8-params"


def plan(**kw) -> ParallelPlan:
    """torchtitan's Mixtral fp8 plan: FSDP over 16 ranks, torchao tensorwise, float8 all-gather, 4 micro-batches."""
    base = {"tp": 1, "pp": 1, "dp": 16, "ep": 1, "zero": 3, "seq_len": 4096, "micro_batch": 1, "global_batch": 64,
            "dtype": "fp8", "recipe": "tensorwise", "fp8_scaling": "current", "tp_impl": "dtensor",
            "flash_attention": True, "fp8_params": True}
    return ParallelPlan(**{**base, **kw})


def test_check_plan_refuses_fp8_params_with_rowwise():
    bad = plan(recipe="rowwise")
    (v,) = [v for v in check_plan(MIX, bad) if v.rule == "fp8_params_rowwise"]
    assert "fp8_params with dtype fp8, recipe rowwise" in v.message and v.message.endswith(ROWWISE_FIX)
    assert not [v for v in check_plan(MIX, plan()) if v.rule == "fp8_params_rowwise"]  # tensorwise: the gather
    assert not [v for v in check_plan(MIX, plan(recipe="rowwise", fp8_params=False)) if v.rule == "fp8_params_rowwise"]


def test_estimate_with_rowwise_and_fp8_params_exits_2_in_one_line(cli):
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--zero", "3", "--precision",
            "fp8-rowwise", "--fp8-params")
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and len(lines) == 1 and "Traceback" not in r.err, r.err
    assert "fp8_params with dtype fp8, recipe rowwise" in lines[0] and lines[0].endswith(ROWWISE_FIX), r.err
    ok = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--zero", "3", "--precision",
             "fp8-tensorwise", "--fp8-scaling", "current", "--fp8-params")
    assert ok.code == 0, ok.err


def test_a_pinned_search_refuses_it_with_the_rules_fix(cli):
    r = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--pp", "1", "--cp", "1", "--precision",
            "fp8-rowwise", "--fp8-params")
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and len(lines) == 1, r.err
    assert "(fp8_params_rowwise)" in lines[0] and lines[0].endswith(ROWWISE_FIX), r.err


def test_a_free_search_never_tries_or_returns_it(cli):
    """Unpinned, the search tries fp8_params only where check_plan's fp8_params rules allow it: not with rowwise,
    nor (muon_fp8_params) under Muon, which before stopped the whole search on its own variant."""
    assert [v["fp8_params"] for v in switch_variants(Workload(dtype="fp8", recipe="rowwise"), True, False)] == [False]
    muon = Workload(dtype="fp8", recipe="tensorwise", optimizer="muon")
    assert [v["fp8_params"] for v in switch_variants(muon, True, False)] == [False]
    assert [v["fp8_params"] for v in switch_variants(Workload(dtype="fp8"), True, False)] == [False, True]
    r = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--pp", "1", "--cp", "1", "--precision",
            "fp8-rowwise", "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["switches"]["fp8_params"] is False
    assert {t["fp8_params"] for t in doc["switches"]["tried"]} == {False}
    assert doc["plans"] and all(not p["plan"]["fp8_params"] for p in doc["plans"])


def test_torchao_gathers_the_routed_experts_in_bf16_by_hand():
    """ZeRO-3, no pipeline, 4 micro-batches: 2 gathers each, the experts at 2 B a weight on torchao (1 B where
    Transformer Engine's GroupedLinear holds them in fp8); the dense gather unchanged."""
    def gathers(p):
        return [t.calls * t.message for t in dp_transfers(MIX, p, 16, 16) if t.collective == "all-gather"]

    dense, expert = gathers(plan())
    assert expert == pytest.approx(2 * 4 * 2 * EXPERTS, rel=1e-12)
    te_dense, te_expert = gathers(plan(tp_impl="megatron"))
    assert te_expert == pytest.approx(2 * 4 * 1 * EXPERTS, rel=1e-12)
    assert dense == pytest.approx(te_dense, rel=1e-12)
    assert float(rank_params(MIX, plan(), 0).expert) == EXPERTS


def test_gathered_at_two_bytes_are_the_kept_and_on_torchao_the_experts():
    p = plan()
    kept, wide = bf16_kept_params(MIX, p, 0), bf16_gathered_params(MIX, p, 0)
    assert float(wide.dense) == float(kept.dense)
    assert float(wide.expert) == EXPERTS
    te = plan(tp_impl="megatron")
    assert float(bf16_gathered_params(MIX, te, 0).expert) == float(bf16_kept_params(MIX, te, 0).expert) == 0.0


def test_the_search_prices_the_expert_gather_as_the_scalar_estimate():
    """Plan arrays (tp, pp, ep, micro-batch varying) of a torchao fp8_params MoE workload price memory and step
    as the scalar estimate."""
    cluster = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=2)
    w = Workload(global_batch=64, seq_len=4096, dtype="fp8", recipe="tensorwise", fp8_scaling="current",
                 tp_impl="dtensor", fp8_params=True)
    plans = enumerate_plans(default_space(MIX, cluster, w), cluster, w)
    idx = valid_sample(MIX, cluster, plans, seed=7, scan=400, n=6, keep=lambda p: p.zero >= 3)
    assert idx
    assert_arrays_agree(MIX, cluster, plans, idx)
