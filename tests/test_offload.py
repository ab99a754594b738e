"""Activation offload to host memory (ParallelPlan.offload_layers, Megatron --cpu-offloading-num-layers):
what leaves HBM, what the copies over the host link cost, Megatron-Core's rules, the CLI, the exports, and the
Megatron-FSDP Llama rows of the Megatron-Bridge tables that run with it (docs/formulas.md#mem.offload).

No published peak memory of an offloading run was found (the Megatron-Bridge tables give throughput only), so
the memory side is checked by properties and by the rows that ran being predicted to fit."""

from __future__ import annotations

from itertools import islice
import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import accuracy
from llmplan.cost.memory import training_memory
from llmplan.cost.offload import offload_exposed
from llmplan.estimate import estimate_training
from llmplan.export import render_all
from llmplan.export.common import CannotExpress
from llmplan.planfile import load_plan
from llmplan.search.evaluate import evaluate
from llmplan.search.grid import Workload, default_space, enumerate_plans
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.units import GB

M = builtin_models()
S = builtin_systems()
FSDP_70B = dict(tp=1, pp=1, dp=64, zero=3, micro_batch=2, global_batch=256, seq_len=8192, dtype="fp8",
                fp8_params=True, grad_dtype="bf16")
"""Megatron-Bridge's Llama 3 70B FP8 Megatron-FSDP preset on 64 GB200 / GB300 (llama3_workload_base_configs.py)."""


class _Stack:
    """A model of L identical layers, for the copy schedule alone."""

    def __init__(self, layers: int) -> None:
        self.num_hidden_layers = layers


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "qwen3-30b-a3b"]), st.integers(0, 200))
def test_offload_moves_activations_to_host_and_the_parts_still_sum(name, n):
    m = M[name]
    n = n % m.num_hidden_layers
    plan = ParallelPlan(dp=8, global_batch=16, micro_batch=2, seq_len=4096, zero=3, offload_layers=n)
    base = training_memory(m, plan.model_copy(update={"offload_layers": 0}), 192 * GB)
    mem = training_memory(m, plan, 192 * GB)
    a, a0 = mem.activation_parts, base.activation_parts
    assert float(a.layers + a.recompute_working + a.embedding + a.output) == pytest.approx(float(mem.activations))
    assert float(mem.weights + mem.gradients + mem.optimizer + mem.activations + mem.other) == \
        pytest.approx(float(mem.total))
    # nothing is lost: what leaves HBM is in host memory, N of the L layers' share
    assert float(a.layers + a.offloaded) == pytest.approx(float(a0.layers))
    assert float(a.offloaded) == pytest.approx(float(a0.layers) * n / m.num_hidden_layers)
    assert (mem.total <= base.total) and (n == 0 or mem.total < base.total)


def test_transformer_engine_schedule_examples():
    # TE docs/features/other_optimizations/cpu_offloading/cpu_offloading.rst, Figure 3: 2 of 5 layers offloaded
    # overlap fully when a copy takes no longer than a layer's compute; num_layers = model_layers - 1 leaves one
    # set on the GPU, "compute and transfers cannot overlap": every copy but the last waits in full.
    five = _Stack(5)
    assert offload_exposed(five, ParallelPlan(offload_layers=2), 1.0, 5.0) == 0.0
    assert offload_exposed(five, ParallelPlan(offload_layers=4), 0.1, 5.0) == pytest.approx(4 * 0.1)
    # bandwidth-bound: 3 copies of 2 s behind 5 layers of 1 s: copy 0 is due when layer 2 starts (t = 2) and ends
    # at 3; the queue then runs copies back to back, the last ending at 7 against its due time 4: 3 s late
    assert offload_exposed(five, ParallelPlan(offload_layers=3), 2.0, 5.0) == pytest.approx(3.0)
    assert offload_exposed(five, ParallelPlan(offload_layers=0), 9.0, 5.0) == 0.0


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 96), st.integers(1, 95), st.floats(0.0, 4.0), st.floats(0.0, 4.0))
def test_exposed_copy_time_is_monotone_and_bounded(layers, n, c1, c2):
    stack, plan = _Stack(layers), ParallelPlan(offload_layers=n % (layers - 1) + 1 if layers > 2 else 1)
    lo, hi = sorted((c1, c2))
    a, b = offload_exposed(stack, plan, lo, float(layers)), offload_exposed(stack, plan, hi, float(layers))
    assert 0.0 <= a <= b + 1e-12  # a slower link never waits less
    assert b <= plan.offload_layers * hi + 1e-9  # never more than all copies done serially
    # elementwise on arrays, as the search evaluates it
    both = offload_exposed(stack, plan, np.array([lo, hi]), np.array([float(layers)] * 2))
    assert both == pytest.approx([a, b])


def test_host_rate_is_the_link_or_the_share_of_host_memory():
    # NVLink-C2C 900 GB/s both ways per GPU link (TE cpu_offloading docs) but two Grace CPUs' 512 GB/s LPDDR5X
    # shared by a tray's 4 GPUs; PCIe Gen5 x16, 128 GB/s both ways, on x86 DGX nodes
    assert S["gb200-nvl72"].host_bytes_per_s == pytest.approx(min(450, 2 * 512 / 4) * GB)
    assert S["dgx-h100"].host_bytes_per_s == pytest.approx(64 * GB)
    assert S["dgx-b200"].host_bytes_per_s == pytest.approx(64 * GB)


def test_pcie_exposes_copies_that_c2c_hides():
    # 70B, 40 of 80 layers offloaded: about 3.4 GiB a layer per micro-batch; at 256 GB/s a copy takes less than a
    # layer's forward, at 64 GB/s (PCIe Gen5) it takes about four times more
    m, plan = M["llama-3.1-70b"], ParallelPlan(**{**FSDP_70B, "offload_layers": 40})
    grace = estimate_training(m, ClusterSpec(system=S["gb200-nvl72"], num_nodes=16), plan)
    pcie = estimate_training(m, ClusterSpec(system=S["dgx-b200"], num_nodes=8), plan)
    assert float(grace.time.exposed["offload"]) == 0.0
    assert float(pcie.time.exposed["offload"]) > 0.1 * float(pcie.time.total)
    assert float(grace.time.comm_exposed) == pytest.approx(sum(float(v) for v in grace.time.exposed.values()))


@pytest.mark.parametrize("update,rule", [({"offload_layers": 80}, "offload_layers"),
                                         ({"pp": 2, "dp": 32}, "offload_pp"),
                                         ({"recompute": "full"}, "offload_recompute"),
                                         ({"cuda_graphs": "layers"}, "offload_cuda_graphs")])
def test_megatron_core_rules(update, rule):
    # Megatron-Core TransformerConfig.__post_init__: cpu_offloading_num_layers < num_layers, no pipeline
    # parallelism, no activation recompute, no CUDA graphs but the full-iteration one
    plan = ParallelPlan(**{**FSDP_70B, "offload_layers": 40, **update})
    cluster = ClusterSpec(system=S["gb200-nvl72"], num_nodes=16)
    assert rule in [v.rule for v in check_plan(M["llama-3.1-70b"], plan, cluster)]
    assert not check_plan(M["llama-3.1-70b"], ParallelPlan(**{**FSDP_70B, "offload_layers": 40}), cluster)


def test_vectorised_search_agrees_with_the_scalar_estimate():
    m, cluster = M["llama-3.1-8b"], ClusterSpec(system=S["dgx-h100"], num_nodes=1)
    w = Workload(global_batch=64, seq_len=8192, offload_layers=12)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    idx = list(islice((i for i in range(len(plans)) if not check_plan(m, plans.plan(i), cluster)), 25))
    assert idx and all(plans.plan(i).pp == 1 for i in idx)
    vec = evaluate(m, cluster, plans.take(np.asarray(idx)))
    for j, i in enumerate(idx):
        scalar = estimate_training(m, cluster, plans.plan(i))
        assert float(vec.memory.total[j]) == pytest.approx(float(scalar.memory.total), rel=1e-9)
        assert float(vec.memory.activation_parts.offloaded[j]) == \
            pytest.approx(float(scalar.memory.activation_parts.offloaded), rel=1e-9)
        assert float(vec.step.total[j]) == pytest.approx(float(scalar.time.total), rel=1e-9)


ARGS = ("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--seq-len", "8192", "--global-batch", "8",
        "--json")


def test_cli_accepts_the_flag_and_reports_host_bytes(cli):
    off, on = cli(*ARGS), cli(*ARGS, "--offload-activations-layers", "16")
    assert off.code == 0 and on.code == 0, on.err
    a, b = off.json(), on.json()
    assert a["plan"]["offload_layers"] == 0 and b["plan"]["offload_layers"] == 16
    assert b["memory"]["offloaded_to_host"] == pytest.approx(a["memory"]["activation_parts"]["layers"] / 2)
    assert b["memory"]["activations"] < a["memory"]["activations"]
    assert "offload" in b["time"]["exposed_s"] and a["time"]["exposed_s"]["offload"] == 0.0
    text = cli(*ARGS[:-1], "--offload-activations-layers", "16")
    assert text.code == 0 and "host: 16 offloaded layers" in text.out


@pytest.mark.parametrize("extra,needle", [(("--offload-activations-layers", "32"), "offload_layers (32) must be below"),
                                          (("--offload-activations-layers", "8", "--pp", "2"), "offload_layers (8) with pp 2"),
                                          (("--offload-activations-layers", "8", "--recompute", "full"), "recompute full"),
                                          (("--offload-activations-layers", "-1"), "--offload-activations-layers"),
                                          (("--offload-activations-layers", "x"), "--offload-activations-layers")])
def test_cli_bad_values_exit_2_with_one_clear_line(cli, extra, needle):
    bad = cli(*ARGS, *extra)
    assert bad.code == 2 and needle in bad.err and "Traceback" not in bad.err


def test_exports_write_the_launchers_flags_or_refuse(tmp_path, cli):
    path = tmp_path / "plan.json"
    made = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--zero", "1", "--seq-len", "8192",
               "--global-batch", "64", "--offload-activations-layers", "8", "--save", str(path))
    assert made.code == 0, made.err
    assert json.loads(path.read_text())["plan"]["offload_layers"] == 8
    pf = load_plan(path)
    megatron = "\n".join(render_all(pf, "megatron")[0].values())
    bridge = "\n".join(render_all(pf, "megatron-bridge")[0].values())
    assert "--cpu-offloading-num-layers 8" in megatron  # Megatron-LM arguments.py (TransformerConfig field)
    assert "model.cpu_offloading=true" in bridge and "model.cpu_offloading_num_layers=8" in bridge
    with pytest.raises(CannotExpress, match="activation offload"):
        render_all(pf, "deepspeed")
    zero3 = dataclasses.replace(pf, plan=pf.plan.model_copy(update={"zero": 3}))
    with pytest.raises(CannotExpress, match="activation offload"):
        render_all(zero3, "torchtitan")


def test_megatron_fsdp_llama_rows_are_scored_and_fit(published_runs, row_plan):
    # The Megatron-FSDP rows of the Megatron-Bridge tables ran with their presets' cpu_offloading_num_layers
    # (llama3{,1}_workload_base_configs.py: 70B FP8 20 on GB300, 40 on GB200; 25.09's 405B yaml: 95): each is
    # scored, reads the preset's layer count, and (it ran) fits.
    rows = {rid: r for rid, r in published_runs.items() if accuracy.mbridge_offload_layers(r)}
    assert len(rows) >= 12
    for rid, rec in rows.items():
        assert accuracy.skip_reason(rec) is None
        plan = row_plan(rid)
        gpu = rid.split("-dgx-")[1].split("-")[0]
        want = 95 if "405b" in rid else {"gb300": 20, "gb200": 40}[gpu]
        assert plan.offload_layers == want and plan.pp == 1 and plan.recompute == "none"
        got = {q: (p, m) for q, p, m in accuracy.predict(rec, accuracy.family(rid))}
        assert got["fits"] == (1.0, 1.0), rid
