"""Host memory capacity under activation offload (SystemSpec.host_memory_gb, host_memory_usable_fraction,
check_plan rule offload_host_memory, docs/formulas.md#mem.host): the profiles' figures and their sources, the rule
at its boundary, the search's vectorised rule against the scalar one, the memory report and the CLI."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from llmplan.cost.memory import training_memory
from llmplan.cost.offload import host_offload_bytes
from llmplan.search.grid import Workload, default_space, enumerate_plans
from llmplan.specs.check import RULES, check_plan
from llmplan.specs.hardware import SystemSpec
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.units import GB

M = builtin_models()
S = builtin_systems()
PROFILES = Path(__file__).resolve().parents[1] / "hardware_profiles" / "systems"
FSDP_70B = dict(tp=1, pp=1, dp=64, zero=3, micro_batch=2, global_batch=256, seq_len=8192, dtype="fp8",
                fp8_params=True, grad_dtype="bf16")
"""Megatron-Bridge's Llama 3 70B FP8 Megatron-FSDP preset on 64 GB200 (llama3_workload_base_configs.py)."""
NO_PUBLIC_FIGURE = {"hgx-h100-96gb", "hgx-h20"}
"""Built-in systems whose host memory no public source was found for (docs/formulas.md#mem.host)."""


def test_every_builtin_system_states_its_host_memory_and_where_it_is_from():
    for name, s in S.items():
        if name in NO_PUBLIC_FIGURE:
            assert s.host_memory_gb is None and s.host_usable_bytes is None
            continue
        assert s.host_memory_gb is not None and s.host_memory_source.strip(), name
        assert 0 < s.host_memory_usable_fraction <= 1


def test_published_host_memory_figures():
    # NVIDIA DGX BasePOD RA (DGX H100 / H200: 2 TB DDR5); DGX B200 User Guide (2 TB); DGX A100 datasheet (640 GB
    # system 2 TB, 320 GB system 1 TB); GB200 / GB300 NVL72: 2 Grace per tray, up to 480 GB LPDDR5X each (17 TB
    # over 36 Grace); BLOOM's Jean Zay nodes: "CPU memory: 512GB per node"
    want = {"dgx-h100": 2000, "dgx-h200": 2000, "dgx-b200": 2000, "dgx-a100": 2000, "dgx-a100-40gb": 1000,
            "gb200-nvl72": 2 * 480, "gb300-nvl72": 2 * 480, "jean-zay-a100": 512}
    for name, gb in want.items():
        assert S[name].host_memory_gb == gb, name
    assert 36 * 480 / 1000 == pytest.approx(17, abs=0.3)  # the rack figure the per-Grace one is read against


def test_schema_rejects_a_figure_without_source_and_fractions_out_of_range():
    base = S["dgx-h100"].model_dump()
    with pytest.raises(ValidationError, match="host_memory_source"):
        SystemSpec(**{**base, "host_memory_gb": 1000.0, "host_memory_source": ""})
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValidationError, match="host_memory_usable_fraction"):
            SystemSpec(**{**base, "host_memory_usable_fraction": bad})
    with pytest.raises(ValidationError, match="host_memory_gb"):
        SystemSpec(**{**base, "host_memory_gb": -1.0})
    s = SystemSpec(**{**base, "host_memory_gb": 1000.0, "host_memory_usable_fraction": 0.5})
    assert s.host_usable_bytes == pytest.approx(500 * GB)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "qwen3-30b-a3b"]), st.integers(1, 200),
       st.sampled_from([1, 2]), st.sampled_from([1, 2, 4]))
def test_host_bytes_are_the_offloaded_activations_of_the_memory_breakdown(name, n, b, t):
    m = M[name]
    plan = ParallelPlan(tp=t, dp=8, global_batch=16 * b, micro_batch=b, seq_len=4096, zero=3,
                        offload_layers=n % (m.num_hidden_layers - 1) + 1)
    mem = training_memory(m, plan, 192 * GB)
    assert float(host_offload_bytes(m, plan)) == pytest.approx(float(mem.activation_parts.offloaded), rel=1e-12)


def _with_host(system: SystemSpec, usable_bytes: float) -> SystemSpec:
    return system.model_copy(update={"host_memory_gb": usable_bytes / GB, "host_memory_usable_fraction": 1.0,
                                     "host_memory_source": "test"})


def test_rule_at_the_boundary():
    # usable host memory between G.N.T and G.(N+1).T: N layers keep the rule, N + 1 break it, and the message names N
    m, n = M["llama-3.1-70b"], 30
    plan = ParallelPlan(**{**FSDP_70B, "offload_layers": n})
    g = S["gb200-nvl72"].gpus_per_node
    per_layer = float(host_offload_bytes(m, plan)) / n
    system = _with_host(S["gb200-nvl72"], (n + 0.5) * per_layer * g)
    cluster = ClusterSpec(system=system, num_nodes=16)
    assert "offload_host_memory" not in [v.rule for v in check_plan(m, plan, cluster)]
    over = check_plan(m, plan.model_copy(update={"offload_layers": n + 1}), cluster)
    assert [v.rule for v in over] == ["offload_host_memory"]
    msg = over[0].message
    assert f"offload at most {n} layers" in msg and "exceed host memory" in msg and "per node" in msg
    # exactly full is still within
    exact = ClusterSpec(system=_with_host(S["gb200-nvl72"], n * per_layer * g * (1 + 1e-12)), num_nodes=16)
    assert not check_plan(m, plan, exact)


def test_a_node_used_in_part_gives_each_gpu_a_larger_share():
    m = M["llama-3.1-70b"]
    plan = ParallelPlan(**{**FSDP_70B, "dp": 32, "offload_layers": 60})
    full = ClusterSpec(system=S["gb200-nvl72"], num_nodes=8)
    half = ClusterSpec(system=S["gb200-nvl72"], num_nodes=16, gpus_per_node=2)
    assert "offload_host_memory" in [v.rule for v in check_plan(m, plan, full)]
    assert not check_plan(m, plan, half)


def test_unknown_host_memory_is_not_checked():
    m = M["llama-3.1-70b"]
    plan = ParallelPlan(**{**FSDP_70B, "offload_layers": 79})
    unknown = S["gb200-nvl72"].model_copy(update={"host_memory_gb": None})
    assert not check_plan(m, plan, ClusterSpec(system=unknown, num_nodes=16))


def test_the_published_offloading_runs_keep_the_rule():
    # They ran: Megatron-Bridge 25.09's Llama 3.1 405B preset (95 of 126 layers offloaded, tp 2, mbs 1, 8K, 128
    # GB200) and the 70B presets (40 layers on GB200, 20 on GB300; mbs 2, 8K, 64 GPUs)
    p405 = ParallelPlan(**{**FSDP_70B, "tp": 2, "dp": 64, "micro_batch": 1, "global_batch": 64, "offload_layers": 95})
    assert not check_plan(M["llama-3.1-405b"], p405, ClusterSpec(system=S["gb200-nvl72"], num_nodes=32))
    for system, n in (("gb200-nvl72", 40), ("gb300-nvl72", 20)):
        plan = ParallelPlan(**{**FSDP_70B, "offload_layers": n})
        assert not check_plan(M["llama-3.1-70b"], plan, ClusterSpec(system=S[system], num_nodes=16))


def test_search_rule_agrees_with_the_scalar_check():
    m = M["llama-3.1-70b"]
    system = _with_host(S["dgx-h100"], 300 * GB)
    cluster = ClusterSpec(system=system, num_nodes=2)
    w = Workload(global_batch=64, seq_len=8192, offload_layers=40)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    rule = next(r for r in RULES if r.name == "offload_host_memory")
    ok = np.broadcast_to(np.asarray(rule.ok(m, plans, cluster), dtype=bool), (len(plans),))
    assert ok.any() and (~ok).any()
    for i in np.linspace(0, len(plans) - 1, 40).round().astype(int):
        scalar = "offload_host_memory" not in [v.rule for v in check_plan(m, plans.plan(int(i)), cluster)]
        assert bool(ok[i]) == scalar


ARGS = ("estimate", "--model", "llama-3.1-70b", "--hardware", "gb200-nvl72", "--nodes", "16", "--zero", "3",
        "--micro-batch", "2", "--global-batch", "256", "--seq-len", "8192", "--dtype", "fp8", "--recompute", "none")


def test_cli_refuses_offload_beyond_host_memory_and_its_fix_runs(cli):
    # 78 of Llama 70B's 80 layers on a GB200 tray (2 x 480 GB for 4 GPUs): refused in one line, exit 2
    bad = cli(*ARGS, "--offload-activations-layers", "78")
    assert bad.code == 2 and "Traceback" not in bad.err
    assert "offloaded activations" in bad.err and "exceed host memory (960 GB per gb200-nvl72 node, 90% usable" in bad.err
    most = int(bad.err.split("offload at most ")[1].split(" layers")[0])
    assert 0 < most < 78
    assert cli(*ARGS, "--offload-activations-layers", str(most), "--json").code == 0
    assert cli(*ARGS, "--offload-activations-layers", str(most + 1), "--json").code == 2


def test_cli_reports_host_bytes_against_host_capacity(cli):
    out = cli(*ARGS, "--offload-activations-layers", "40", "--json")
    assert out.code == 0, out.err
    mem = out.json()["memory"]
    host = mem["host"]
    assert host["offloaded_per_node"] == pytest.approx(4 * mem["offloaded_to_host"])
    assert host["usable_per_node"] == pytest.approx(0.9 * 960e9) and host["host_memory_gb"] == 960
    assert host["fits"] is True
    text = cli(*ARGS, "--offload-activations-layers", "40")
    assert text.code == 0
    assert "GiB offloaded per node (4 GPUs) of" in text.out and "(960 GB x 90%)" in text.out
    assert max(len(line) for line in text.out.splitlines()) <= 80


def test_a_profile_can_change_the_usable_share(cli, tmp_path):
    # the allowance is a stated default: a --hardware file with host_memory_usable_fraction 0.5 refuses what 0.9 takes
    text = (PROFILES / "gb200-nvl72.yaml").read_text().replace("name: gb200-nvl72", "name: gb200-tight")
    path = tmp_path / "gb200-tight.yaml"
    path.write_text(text + "host_memory_usable_fraction: 0.5\n")
    args = [a if a != "gb200-nvl72" else str(path) for a in ARGS]
    assert cli(*ARGS, "--offload-activations-layers", "40", "--json").code == 0
    assert cli(*args, "--offload-activations-layers", "20", "--json").code == 0
    tight = cli(*args, "--offload-activations-layers", "40")
    assert tight.code == 2 and "50% usable" in tight.err
    assert math.isfinite(float(tight.err.split("GiB per GPU")[0].rsplit("(", 1)[1]))


def test_pipeline_plans_get_one_violation_not_two():
    # offload with pp > 1 is refused by offload_pp; the host rule does not add a second line about the same plan
    plan = ParallelPlan(**{**FSDP_70B, "pp": 2, "dp": 32, "offload_layers": 79})
    rules = [v.rule for v in check_plan(M["llama-3.1-70b"], plan, ClusterSpec(system=S["gb200-nvl72"], num_nodes=16))]
    assert "offload_pp" in rules and "offload_host_memory" not in rules


def test_pinned_block_bytes_rounds_to_the_next_power_of_two():
    # pytorch/pytorch v2.13.0 aten/src/ATen/core/CachingHostAllocator.h (allocate: roundSize =
    # c10::llvm::PowerOf2Ceil(size)): a request of exactly 2^k takes 2^k, one byte more 2^(k+1); elementwise
    import numpy as np
    from llmplan.cost.offload import pinned_block_bytes
    assert pinned_block_bytes(0) == 0 and pinned_block_bytes(1) == 1 and pinned_block_bytes(3) == 4
    assert pinned_block_bytes(2**30) == 2**30 and pinned_block_bytes(2**30 + 1) == 2**31
    assert list(pinned_block_bytes(np.array([0.0, 5.0, 1_845_493_760.0]))) == [0, 8, 2**31]
