"""Megatron-FSDP per plan (docs/validation.md#mfsdp-plan): ZeRO-3 exported as optim_grads_params by a targeted MoE
search, and Transformer Engine's TP overlap beside Megatron-FSDP on Hopper priced and exported at more than one
CUDA work queue.

Sources: NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553 megatron/training/arguments.py
(--data-parallel-sharding-strategy choices no_shard, optim, optim_grads, optim_grads_params; validate_args under
--use-megatron-fsdp asserts CUDA_DEVICE_MAX_CONNECTIONS is not "1"; with TP > 1 before Blackwell it only warns
beside Megatron-FSDP, and asserts nothing about --tp-comm-overlap); NVIDIA/TransformerEngine 64126aa8c (PR #1308,
transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp CommOverlapCore: with
CUDA_DEVICE_MAX_CONNECTIONS > 1 the userbuffer communication is launched ahead of its GEMM by an event on compute
capability 9 only)."""

from __future__ import annotations

import re

MOE = ["search", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--nodes", "1", "--global-batch", "32",
       "--seq-len", "4096", "--pp", "1", "--target", "megatron"]


def test_targeted_moe_search_keeps_zero3_plans_as_megatron_fsdp(cli):
    """--target megatron on an MoE model: ZeRO-3 plans are no longer filtered out (Megatron-LM writes them as
    optim_grads_params); the shown ZeRO-3 row is priced with megatron_fsdp (on main: every row zero 0-2)."""
    r = cli(*MOE, "--top", "3", "--json")
    assert r.code == 0, r.err
    zero3 = [p for p in r.json()["plans"] if p["plan"]["zero"] == 3]
    assert zero3, [p["plan"]["zero"] for p in r.json()["plans"]]
    assert all(p["plan"]["megatron_fsdp"] is True for p in zero3)


def test_targeted_moe_search_pinned_to_zero3_exports_optim_grads_params(cli, tmp_path):
    """Pinned to ZeRO-3, the search's #1 (EP overlap on, deepep) exports to megatron as Megatron-FSDP's
    optim_grads_params with the EP overlap's 32 queues, never the 1 Megatron-FSDP asserts against."""
    saved = tmp_path / "plan.json"
    r = cli(*MOE, "--zero", "3", "--top", "1", "--save", saved, "--json")
    assert r.code == 0, r.err
    p = r.json()["plans"][0]["plan"]
    assert p["zero"] == 3 and p["megatron_fsdp"] is True and p["ep"] > 1, p
    out = cli("export", saved, "--to", "megatron", "-o", tmp_path / "out")
    assert out.code == 0, out.err
    script = (tmp_path / "out" / "megatron_pretrain.sh").read_text()
    assert "--use-megatron-fsdp" in script and "--data-parallel-sharding-strategy optim_grads_params" in script
    assert "--ckpt-format fsdp_dtensor" in script
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" not in script


EST = ["estimate", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--nodes", "2", "--tp", "2", "--pp", "1",
       "--ep", "8", "--sp", "--tp-comm-overlap", "--ep-comm-overlap", "--recompute", "selective", "--global-batch",
       "256", "--zero", "2", "--megatron-fsdp"]


def test_ep_overlap_beside_tp_overlap_under_megatron_fsdp_is_priced_at_many_queues(cli, tmp_path):
    """Megatron-FSDP asserts more than one queue, so beside TE's TP overlap on Hopper the EP overlap is not priced
    at the one queue (cost.moe.overlap_queues): unset prices as 32 does, faster than an explicit 1; the export
    writes 32 (the EP overlap's) and --tp-comm-overlap, and a plan given 32 is not refused for the TP overlap."""
    steps = {}
    for name, extra in (("unset", ()), ("one", ("--cuda-max-connections", "1")),
                        ("many", ("--cuda-max-connections", "32"))):
        path = tmp_path / f"{name}.json"
        r = cli(*EST, *extra, "--save", path, "--json")
        assert r.code in (0, 3), r.err
        steps[name] = r.json()["time"]["step_s"]
        out = cli("export", path, "--to", "megatron", "-o", tmp_path / name)
        if name == "one":
            assert "CUDA_DEVICE_MAX_CONNECTIONS 1 (Megatron-LM asserts it is not 1" in out.refusal()
            continue
        assert out.code == 0, out.err
        text = (tmp_path / name / "megatron_pretrain.sh").read_text()
        assert re.findall(r"export CUDA_DEVICE_MAX_CONNECTIONS=(\d+)", text) == ["32"]
        assert "--tp-comm-overlap" in text and "--use-megatron-fsdp" in text
    assert steps["unset"] == steps["many"] and steps["unset"] < steps["one"], steps


def test_tp_overlap_beside_megatron_fsdp_before_hopper_is_refused(cli, tmp_path):
    """On A100 (compute capability 8.0) TE orders its TP overlap only at one queue, which Megatron-FSDP refuses."""
    path = tmp_path / "plan.json"
    args = [*EST]
    args[args.index("dgx-h100")] = "dgx-a100"
    assert cli(*args, "--save", path).code in (0, 3)
    line = cli("export", path, "--to", "megatron", "-o", tmp_path / "out").refusal()
    assert "ZeRO-2 (Megatron-FSDP optim_grads) beside TP 2's userbuffer overlap on a100-80gb" in line, line
    assert "from Hopper on, compute capability 9" in line and "re-plan with --no-tp-comm-overlap" in line, line
