"""The search skips an fp8_params setting it tried itself where check_plan's rules cut it from every plan.

cli.search.SettingSearch.keeps_fp8_params asks search.run.any_passes (the rules the search prunes by, on the space
as the search enumerates it) instead of catching the search's error. The rule that cuts it here is
torchao_fp8_params_gather (pytorch/ao@36027d82d1 torchao/float8/fsdp_utils.py: torchao keeps fp8 weights only in
FSDP2's float8 all-gather, which pytorch/torchtitan v0.2.2 components/quantization/float8.py turns on only with
dp_shard_enabled): fp8_params on torchao's per-tensor Float8Linear needs zero >= 2 over more than one shard rank.
The JSON of each search below is the same as on main f10a4ab7 (the try / except), search_s aside.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from refusal import one_line

TORCHAO = ["--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--precision", "fp8-tensorwise",
           "--tp-impl", "dtensor"]


def _search(cli, *flags) -> dict:
    r = cli("search", *TORCHAO, *flags, "--top", "5", "--json")
    assert r.code == 0, r.err
    return json.loads(r.out)


@pytest.mark.parametrize("pins", [["--zero", "1"], ["--pp", "8", "--zero", "3"]])
def test_a_self_tried_fp8_params_cut_from_every_plan_leaves_the_plain_setting(cli, pins):
    out = _search(cli, *pins)
    assert out["plans"] and not any(p["plan"]["fp8_params"] for p in out["plans"])
    tried = out["switches"]["tried"]  # both gradient dtypes searched: the skip does not end the settings' loop
    assert {t["grad_dtype"] for t in tried} == {"fp32", "bf16"} and not any(t["fp8_params"] for t in tried)


def test_without_pins_the_search_tries_and_keeps_fp8_params(cli):
    tried = _search(cli)["switches"]["tried"]
    assert {(t["grad_dtype"], t["fp8_params"]) for t in tried} == {("fp32", False), ("fp32", True), ("bf16", False),
                                                                   ("bf16", True)}


def test_the_check_reads_the_plans_the_other_rules_leave():
    """pp 8 on 8 GPUs: the torchao rule alone leaves plans (cp 2, zero 3: two shard ranks), but tp x pp x cp must
    divide the 8 GPUs (gpus_model_parallel), so no plan keeps fp8_params: a check of that rule alone over the
    space would search the setting and stop on 'no plan passes the rules'."""
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    from llmplan.search.run import any_passes, runs_on
    from llmplan.specs.check import RULES
    from llmplan.specs.plan import ClusterSpec
    from llmplan.specs.registry import builtin_systems, resolve_model
    m = resolve_model("llama-3.1-8b")
    cluster = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=1)
    w = Workload(global_batch=1024, seq_len=4096, dtype="fp8", recipe="tensorwise", tp_impl="dtensor",
                 fp8_params=True)
    plans = enumerate_plans(default_space(m, cluster, w, {"pp": 8, "zero": 3}), cluster, runs_on(m, cluster, w))
    rule = next(r for r in RULES if r.name == "torchao_fp8_params_gather")
    assert np.any(rule.ok(m, plans, cluster)) and not any_passes(m, plans, cluster)
    free = enumerate_plans(default_space(m, cluster, w, {}), cluster, runs_on(m, cluster, w))
    assert any_passes(m, free, cluster)


def test_a_pinned_fp8_params_cut_from_every_plan_is_still_refused(cli):
    r = cli("search", *TORCHAO, "--zero", "1", "--fp8-params")
    assert r.code == 2 and "Traceback" not in r.err, r.err
    assert "torchao_fp8_params_gather" in one_line(r.err) or "torchao keeps fp8 weights only" in one_line(r.err)
