"""CUDA_DEVICE_MAX_CONNECTIONS as a plan field (ParallelPlan.cuda_max_connections): the EP overlap's hidden share at
one hardware queue (cost.moe.overlap_queues, Megatron-LM PR 6311), the flag, the JSON key, and the Megatron-LM /
Megatron-Bridge exports (docs/validation.md#cuda-connections)."""

from __future__ import annotations

import dataclasses
import re

from llmplan.export import render_all
from llmplan.planfile import load_plan
from tests.test_export_bridge_epov import PLANS, dsv3


def queues(pf, target: str) -> list[int]:
    """The values the export's scripts give CUDA_DEVICE_MAX_CONNECTIONS."""
    text = "\n".join(render_all(pf, target)[0].values())
    return [int(x) for x in re.findall(r"export CUDA_DEVICE_MAX_CONNECTIONS=(\d+)", text)]


def edited(case: str, **changes):
    pf = load_plan(PLANS / f"{case}.json")
    return dataclasses.replace(pf, plan=pf.plan.model_copy(update=changes))


def test_flag_reaches_the_plan_and_one_queue_prices_the_overlap_slower(cli):
    base = ("estimate", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--nodes", "2", "--ep", "8",
            "--ep-comm-overlap", "--recompute", "selective", "--global-batch", "256", "--json")
    one, default = cli(*base, "--cuda-max-connections", "1"), cli(*base)
    assert one.code == 0 and default.code == 0, one.err + default.err
    assert one.json()["plan"]["cuda_max_connections"] == 1 and default.json()["plan"]["cuda_max_connections"] is None
    # PR 6311: one queue hides about half of what 32 hide, so the step is longer, never longer than no overlap
    off = cli(*[a for a in base if a != "--ep-comm-overlap"], "--cuda-max-connections", "1")
    t = [r.json()["time"]["step_s"] for r in (default, one, off)]
    assert t[0] < t[1] < t[2]


def test_megatron_export_writes_the_queues_the_plan_prices():
    # moe_train: TP 2, EP 8 on H100. Without the overlap Megatron-LM asserts 1 with TP > 1 before Blackwell
    # (arguments.py at core_v0.14.0 ... v0.16.0); with it Megatron-Core wants > 1 (moe README at core_v0.16.0)
    assert queues(edited("moe_train"), "megatron") == [1]
    overlap = dict(ep_comm_overlap=True, pp=1, recompute="selective")
    assert queues(edited("moe_train", **overlap), "megatron") == [32]
    assert queues(edited("moe_train", **overlap, cuda_max_connections=1), "megatron") == [1]


def test_megatron_export_refuses_queues_megatron_lm_asserts_against(cli, tmp_path):
    # TP 2 without the EP overlap on H100 (compute capability 9.0): Megatron-LM asserts 1 (arguments.py
    # validate_args at core_v0.14.0 ... v0.16.0); the plan file keeps 8, the export refuses it in one line
    path = tmp_path / "p.json"
    assert cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--tp", "2", "--dp", "4",
               "--cuda-max-connections", "8", "--save", path).code == 0
    line = cli("export", path, "--to", "megatron", "-o", tmp_path / "out").refusal()
    assert "CUDA_DEVICE_MAX_CONNECTIONS 8 with TP 2" in line and "--cuda-max-connections 1" in line
    assert cli("export", path, "--to", "megatron-bridge", "-o", tmp_path / "bridge").code == 0


def test_bridge_export_writes_the_plans_queue_count():
    assert queues(dsv3(cuda_max_connections=1), "megatron-bridge") == [1]
    assert queues(dsv3(), "megatron-bridge") == [8]  # the performance presets' H100 value under the overlap
