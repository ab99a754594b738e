"""The search tries the MoE dispatchers the system runs (issue 32: switches modern recipes set are tried, and the
output says which won; docs/validation.md#search-deepep).

DeepSeek-V3 ran DeepEP (arXiv:2412.19437 sec. 3.2.2); Megatron-Bridge's DeepSeek-V3 / Qwen3 / Nemotron-3 recipes
run the flex dispatcher with the deepep or hybridep backend. `llmplan search` tried only the alltoall dispatcher
unless told otherwise (docs/validation.md#dsv3-layout)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from llmplan.search.evaluate import comm_seconds_arrays, evaluate_memory
from llmplan.search.grid import Workload, default_space, enumerate_plans
from llmplan.search.run import dispatch_runs, dispatcher_variants
from llmplan.specs.plan import ClusterSpec
from llmplan.specs.registry import resolve_model, resolve_system
from llmplan.topology.placement import on_cluster

DSV3_H100 = ("--model", "deepseek-v3", "--hardware", "dgx-h100", "--nodes", "64", "--global-batch", "1024",
             "--seq-len", "4096")
FLEX = [{"moe_dispatcher": "deepep", "moe_flex_backend": "deepep"},
        {"moe_dispatcher": "deepep", "moe_flex_backend": "hybridep"}]


def cluster(system: str, nodes: int = 4) -> ClusterSpec:
    return ClusterSpec(system=resolve_system(system), num_nodes=nodes)


def test_dispatchers_tried_follow_the_hardware_the_model_and_the_pins():
    moe, dense, w = resolve_model("deepseek-v3"), resolve_model("llama-3.1-8b"), Workload()
    for system in ("dgx-h800", "dgx-h100", "dgx-b200", "gb200-nvl72"):  # SM90 / SM100, NVSwitch, InfiniBand
        assert dispatcher_variants(moe, cluster(system), w, False, True) == FLEX, system
    assert not dispatch_runs(cluster("dgx-a100"))  # SM80: DeepEP's internode kernels need SM90
    assert dispatcher_variants(moe, cluster("dgx-a100"), w, False, True) == []
    assert dispatcher_variants(dense, cluster("dgx-h100"), w, False, True) == []
    assert dispatcher_variants(moe, cluster("dgx-h100"), w, True, True) == []  # --moe-dispatcher named
    assert dispatcher_variants(moe, cluster("dgx-h100"), w, False, False) == []  # --ep 1
    # Megatron's flex dispatcher with the deepep backend does not pad to capacity (check_switches deepep_capacity)
    padded = Workload(moe_capacity_factor=1.0)
    assert dispatcher_variants(moe, cluster("dgx-h100"), padded, False, True) == FLEX[1:]
    # nor does it run inside a full-iteration CUDA graph (check_switches cuda_graphs_flex_backend)
    graphed = Workload(cuda_graphs="full-iteration")
    assert dispatcher_variants(moe, cluster("dgx-h100"), graphed, False, True) == FLEX[1:]


def test_the_dispatcher_leaves_every_plans_memory_alike():
    # the searches of one command share a memory screen across dispatchers (search.run.screen_key)
    m = resolve_model("qwen3-30b-a3b")
    c = cluster("dgx-h100", 4)
    w = Workload(global_batch=256, seq_len=4096)
    plans = enumerate_plans(default_space(m, c, w), c, w)
    plans = plans.take(np.flatnonzero(np.asarray(plans.ep) > 1)[:4000])
    base = evaluate_memory(m, c, plans)
    for d in FLEX:
        wd = Workload(**{**w.fields(), **d})
        other = evaluate_memory(m, c, enumerate_plans(default_space(m, c, wd), c, wd).take(
            np.flatnonzero(np.asarray(enumerate_plans(default_space(m, c, wd), c, wd).ep) > 1)[:4000]))
        assert np.array_equal(np.asarray(base.total), np.asarray(other.total)), d


def alike(a, b) -> bool:
    """Equal value for value: arrays elementwise, tuples and dataclasses field by field."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        return len(a) == len(b) and all(alike(x, y) for x, y in zip(a, b))
    if hasattr(a, "__dataclass_fields__"):
        return all(alike(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


@pytest.mark.parametrize("system, nodes", [("dgx-h100", 4), ("gb200-nvl72", 32)])
def test_the_dispatcher_moves_only_the_ep_all_to_all_of_the_comm_seconds(system, nodes):
    # the searches of one command that share a memory screen reuse every axis's seconds but EP's (search.run
    # search's comm_key): priced from another dispatcher's, they are the seconds priced from scratch
    m, c = resolve_model("qwen3-30b-a3b"), cluster(system, nodes)
    w = Workload(global_batch=256, seq_len=4096)
    plans = enumerate_plans(default_space(m, c, w), c, w)
    plans = plans.take(np.flatnonzero(np.asarray(plans.ep) > 1)[:4000])
    base = comm_seconds_arrays(m, c, on_cluster(plans, c))
    for d in FLEX:
        flex = on_cluster(plans.model_copy(d), c)
        scratch, reused = comm_seconds_arrays(m, c, flex), comm_seconds_arrays(m, c, flex, known=base)
        assert alike(scratch, reused), d
        assert not alike(scratch.ep, base.ep), d  # the dispatcher does move the EP all-to-all


@pytest.fixture(scope="module")
def dsv3_h100(tmp_path_factory):
    """`llmplan search` of DeepSeek-V3 on 64 DGX H100 (512 GPUs), batch 1,024 x 4,096, ZeRO 1, saved and in
    JSON."""
    from llmplan.cli import main

    path = tmp_path_factory.mktemp("deepep") / "plan.yaml"
    import contextlib
    import io
    import json

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit) as done:
        # ZeRO 1 (Megatron's distributed optimizer): the saved #1 exports to megatron whatever else wins (with
        # the EP overlap tried, a ZeRO-2 layout can, which megatron refuses)
        main(["search", *DSV3_H100, "--zero", "1", "--json", "--save", str(path)])
    assert done.value.code in (0, None)
    return json.loads(buf.getvalue()), path


def test_deepseek_v3_search_on_h100_tries_deepep_and_says_it_chose_it(dsv3_h100):
    doc, _ = dsv3_h100
    s = doc["switches"]
    tried = [(t["moe_dispatcher"], t["moe_flex_backend"]) for t in s["tried"]]  # null on alltoall (no backend)
    assert ("alltoall", None) in tried and ("deepep", "deepep") in tried and ("deepep", "hybridep") in tried
    first = doc["plans"][0]["plan"]
    assert first["ep"] > 1
    assert (first["moe_dispatcher"], first["moe_flex_backend"]) == (s["moe_dispatcher"], s["moe_flex_backend"])
    # DeepEP sends a token once per destination rank where alltoall sends every routed copy (8 for DeepSeek-V3):
    # the flex dispatcher wins here, by more than the model's resolution over the alltoall setting
    assert s["moe_dispatcher"] == "deepep"
    score = {(t["grad_dtype"], t["moe_dispatcher"], t["moe_flex_backend"]): t["score"] for t in s["tried"]}
    chosen = score[(s["grad_dtype"], "deepep", s["moe_flex_backend"])]
    assert chosen == max(score.values())
    assert chosen > 1.05 * score[(s["grad_dtype"], "alltoall", None)]


def test_the_text_output_names_the_dispatcher(cli):
    # --zero 1, as the dsv3_h100 search: how the table names the dispatcher chosen does not depend on the ZeRO
    # stages searched, and the pinned search takes about half the CPU of the free one (3.4 against 6.9 s)
    r = cli("search", *DSV3_H100, "--zero", "1", "--top", "1")
    assert r.code == 0, r.err
    text = " ".join(r.out.split())
    # the flex backend the search chose (deepep up to main 9b6560c8; hybridep since the TP edge collectives,
    # docs/validation.md#tp-edge-colls, moved the best layout), named with the flags that pin it
    assert re.search(r"MoE dispatcher flex/(deepep|hybridep) \(--moe-dispatcher deepep --moe-flex-backend \1\)", text)
    assert "--moe-dispatcher / --moe-flex-backend" in text and "pin them" in text


def test_a_pinned_dispatcher_is_not_searched(cli):
    # --zero 1 as above: a pinned dispatcher is not searched whatever ZeRO stages are
    r = cli("search", *DSV3_H100, "--zero", "1", "--moe-dispatcher", "alltoall", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert all("moe_dispatcher" not in t for t in doc["switches"]["tried"])
    assert doc["plans"][0]["plan"]["moe_dispatcher"] == "alltoall"


def test_the_saved_plan_exports_the_dispatcher_it_was_ranked_with(dsv3_h100, cli, tmp_path):
    doc, path = dsv3_h100
    backend = doc["switches"]["moe_flex_backend"]
    r = cli("export", str(path), "--to", "megatron", "--out", str(tmp_path))
    assert r.code == 0, r.err
    text = "\n".join(p.read_text() for p in tmp_path.iterdir() if p.is_file())
    # Megatron-LM's flex token dispatcher and its backend (arguments.py: --moe-token-dispatcher-type flex,
    # --moe-flex-dispatcher-backend deepep|hybridep)
    assert "--moe-token-dispatcher-type flex" in text
    assert f"--moe-flex-dispatcher-backend {backend}" in text
    again = cli("estimate", "--plan", str(path), "--json")
    assert again.code == 0, again.err
    plan = again.json()["plan"]
    assert (plan["moe_dispatcher"], plan["moe_flex_backend"]) == ("deepep", backend)
