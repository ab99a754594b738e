"""CUDA_DEVICE_MAX_CONNECTIONS as a plan field (ParallelPlan.cuda_max_connections): the EP overlap's hidden share at
one hardware queue (cost.moe.overlap_queues, Megatron-LM PR 6311), the flag, the JSON key, and the Megatron-LM /
Megatron-Bridge exports (docs/validation.md#cuda-connections)."""

from __future__ import annotations

import dataclasses
import re

import pytest

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


@pytest.mark.parametrize("rid,queues", [
    # v0.1.0rc4 CommOverlapConfig: Hopper, TP 2 with the EP overlap -> unset, CUDA's default 8
    ("mbridge-25.09-pretrain-deepseekv3-dropless-dgx-h100-1024gpu-fp8-tp2pp8cp1ep64vp4gbs8192mbs1", 8),
    # v0.2.0 ... v0.4.2 PerfEnvPlugin: Hopper, alltoall, TP 2 with moe_a2a_overlap -> 8 (not 1)
    ("mbridge-25.11-pretrain-qwen3-235b-a22b-dgx-h100-256gpu-fp8cs-tp2pp8cp1ep32vp4gbs2048mbs1", 8),
    ("mbridge-26.04.01-pretrain-qwen3-235b-a22b-dgx-h100-256gpu-fp8-tp2pp8cp1ep32vp4gbs8192mbs1", 8),
    # Blackwell -> 32 (perf_plugins.py v0.5.0; perf_recipes/deepseek/gb200/deepseek_v3.py env_vars at v0.6.0)
    ("mbridge-26.06-pretrain-deepseekv3-dgx-gb200-256gpu-mxfp8-tp1pp4cp1ep64vp4gbs4096mbs1", 32),
    ("mbridge-26.08-pretrain-deepseekv3-dgx-gb200-256gpu-mxfp8-tp1pp4cp1ep64vp4gbs4096mbs1", 32),
])
def test_bridge_rows_carry_the_queues_their_launcher_set(row_plan, rid, queues):
    plan = row_plan(rid)
    assert plan.ep_comm_overlap and plan.cuda_max_connections == queues


def test_no_bridge_row_ran_the_ep_overlap_on_one_queue(published_runs, acc):
    # so the one-queue factor moves no scored row (docs/validation.md#cuda-connections)
    plans = [out[2] for r in published_runs.values() if (out := acc.record_setup(r, acc.family(r["id"])))]
    overlapped = [p for p in plans if p.ep_comm_overlap]
    assert overlapped and all(p.cuda_max_connections != 1 for p in overlapped)


def test_tp_overlap_on_hopper_takes_the_one_queue(cli, tmp_path):
    # TE's userbuffer TP overlap before Blackwell wants CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron-Bridge v0.1.0rc4
    # training/comm_overlap.py); the EP overlap wants more (Megatron-LM: "1 or 32"). Unset beside it, the export
    # writes 1 and the EP overlap is priced at one queue (the same step as --cuda-max-connections 1); a count above
    # 1 given beside it is refused (llmplan prices the TP overlap the same at any count)
    base = ("estimate", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--nodes", "2", "--tp", "2", "--ep",
            "8", "--sp", "--tp-comm-overlap", "--ep-comm-overlap", "--recompute", "selective", "--global-batch",
            "256")
    steps = {}
    for name, extra in (("unset", ()), ("one", ("--cuda-max-connections", "1")),
                        ("eight", ("--cuda-max-connections", "8"))):
        path = tmp_path / f"{name}.json"
        r = cli(*base, *extra, "--save", path, "--json")
        assert r.code == 0, r.err
        steps[name] = r.json()["time"]["step_s"]
        out = cli("export", path, "--to", "megatron", "-o", tmp_path / name)
        if name == "eight":
            line = out.refusal()
            assert "CUDA_DEVICE_MAX_CONNECTIONS 8 beside TP 2's userbuffer overlap on h100" in line
            assert "--cuda-max-connections 1" in line and "--no-tp-comm-overlap" in line
            continue
        assert out.code == 0, out.err
        text = "\n".join(f.read_text() for f in (tmp_path / name).glob("*.sh"))
        assert re.findall(r"export CUDA_DEVICE_MAX_CONNECTIONS=(\d+)", text) == ["1"]
    assert steps["unset"] == pytest.approx(steps["one"], rel=1e-12) and steps["eight"] < steps["one"]
    # without the TP overlap the unset count is more than one queue: 32 written, the overlap priced in full
    path = tmp_path / "no_ub.json"
    r = cli(*[a for a in base if a != "--tp-comm-overlap"], "--no-tp-comm-overlap", "--save", path, "--json")
    assert r.code == 0, r.err
    assert cli("export", path, "--to", "megatron", "-o", tmp_path / "no_ub").code == 0
    text = "\n".join(f.read_text() for f in (tmp_path / "no_ub").glob("*.sh"))
    assert re.findall(r"export CUDA_DEVICE_MAX_CONNECTIONS=(\d+)", text) == ["32"]
    # Blackwell: the TP overlap takes no queue rule; unset is priced as more than one queue
    b200 = [("dgx-b200" if a == "dgx-h100" else a) for a in base]
    unset, one = (cli(*b200, *extra, "--json").json()["time"]["step_s"] for extra in ((), ("--cuda-max-connections", "1")))
    assert unset < one


@pytest.mark.parametrize("flag, value, words", [
    ("--cuda-max-connections", "0", "must be from 1 to 32"),
    ("--cuda-max-connections", "64", "must be from 1 to 32"),
    ("--mxfp8-modules", "bogus", "not a module llmplan can run in MXFP8"),
])
def test_bad_values_of_the_new_switches_are_one_line_and_exit_2(cli, flag, value, words):
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", flag, value)
    assert r.code == 2 and words in r.err and "Traceback" not in r.err, r.err
    assert len(r.err.strip().splitlines()) == 1, r.err
