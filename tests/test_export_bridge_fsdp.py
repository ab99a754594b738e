"""ZeRO-2 exported to Megatron-Bridge as Megatron-FSDP's optim_grads through its DDP config
(export.bridge.fsdp_overrides), and the ZeRO-2 plans it refuses (fsdp_zero2_rules).

Read at NVIDIA-NeMo/Megatron-Bridge v0.6.0 (51885cf1) src/megatron/bridge/training/config.py:
ConfigContainer.validate calls _validate_and_apply_megatron_fsdp_configs when ddp.use_megatron_fsdp is set, which
sets the distributed optimizer on both configs, turns ddp.average_in_collective off unless
ddp.disable_symmetric_registration is set, asserts ckpt_format fsdp_dtensor when a run saves or loads and
`os.getenv("CUDA_DEVICE_MAX_CONNECTIONS") != "1"`. The DDP fields are those of Megatron-LM cd4afffa6's
DistributedDataParallelConfig, recorded in tests/data/launchers/megatron-bridge.json (data_parallel_sharding_strategy,
megatron_fsdp_main_params_dtype / main_grads_dtype / grad_comm_dtype, disable_symmetric_registration)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from llmplan.export import render_all
from llmplan.export.common import CannotExpress
from llmplan.planfile import load_plan
from tests.test_export_bridge import (PLANS, SCRIPT, assert_recorded_fields_of_their_type, hydra_applied,
                                      overrides)

ZERO2 = {"zero": 2, "pp": 1, "vpp": 1, "dp": 8, "megatron_fsdp": True}  # llama-3.1-70b, tp 8 x dp 8, no pipeline,
# priced as Megatron-FSDP holds it (the export refuses a ZeRO-2 plan priced without it)


def bridge_script(**changes) -> tuple[object, str]:
    pf = load_plan(PLANS / "dense_train.json")
    pf = dataclasses.replace(pf, plan=pf.plan.model_copy(update={**ZERO2, **changes}))
    return pf, render_all(pf, "megatron-bridge")[0][SCRIPT]


@pytest.mark.parametrize("as_dataclass", [True, False])
def test_zero2_is_megatron_fsdp_optim_grads_in_the_ddp_config(as_dataclass):
    pf, text = bridge_script()
    args = overrides(text)
    assert_recorded_fields_of_their_type(args)  # every key a field of its section, every value of its type
    cfg = hydra_applied(args, as_dataclass)  # applied as Megatron-Bridge applies them
    ddp, p = cfg["ddp"], pf.plan
    assert ddp["use_megatron_fsdp"] and ddp["data_parallel_sharding_strategy"] == "optim_grads"
    assert ddp["use_distributed_optimizer"] and cfg["optimizer"]["use_distributed_optimizer"]
    assert ddp["overlap_grad_reduce"] and ddp["overlap_param_gather"] == p.overlap_param_gather
    # the plan's fp32 gradients and master (Megatron-FSDP's main_grads_dtype None would keep bf16 gradients)
    assert (ddp["megatron_fsdp_main_grads_dtype"], ddp["megatron_fsdp_grad_comm_dtype"]) == ("float32", "float32")
    assert ddp["megatron_fsdp_main_params_dtype"] == "float32"
    assert cfg["checkpoint"]["ckpt_format"] == "fsdp_dtensor"
    # averaged in the collective as priced (grad_prescale off): kept on past Megatron-Bridge's FSDP validation
    assert ddp["average_in_collective"] and ddp["disable_symmetric_registration"]
    assert re.search(r"^unset CUDA_DEVICE_MAX_CONNECTIONS\b", text, re.M)
    assert not re.search(r"^export CUDA_DEVICE_MAX_CONNECTIONS=1\b", text, re.M)


@pytest.mark.parametrize("as_dataclass", [True, False])
def test_zero3_is_megatron_fsdp_optim_grads_params_in_the_ddp_config(as_dataclass):
    """ZeRO-3 priced with megatron_fsdp: DistributedDataParallelConfig.data_parallel_sharding_strategy
    optim_grads_params (Megatron-LM cd4afffa6 distributed_data_parallel_config.py: 'no_shard', 'optim', 'optim_grads',
    'optim_grads_params'; megatron_fsdp.py at cd4afffa6 turns overlap_param_gather on for it), the rest as ZeRO-2."""
    _, text = bridge_script(zero=3)
    args = overrides(text)
    assert_recorded_fields_of_their_type(args)
    assert "ddp.data_parallel_sharding_strategy=optim_grads_params" in args
    cfg = hydra_applied(args, as_dataclass)
    ddp = cfg["ddp"]
    assert ddp["use_megatron_fsdp"] and ddp["data_parallel_sharding_strategy"] == "optim_grads_params"
    assert ddp["use_distributed_optimizer"] and cfg["optimizer"]["use_distributed_optimizer"]
    assert ddp["overlap_grad_reduce"] and ddp["overlap_param_gather"] is True
    assert cfg["checkpoint"]["ckpt_format"] == "fsdp_dtensor"
    assert re.search(r"^unset CUDA_DEVICE_MAX_CONNECTIONS\b", text, re.M)


def test_zero2_prescaled_and_copied():
    _, text = bridge_script(grad_prescale=True, grad_accumulation="copy")
    cfg = hydra_applied(overrides(text), True)
    ddp = cfg["ddp"]
    assert not ddp["average_in_collective"] and ddp["disable_symmetric_registration"] is None  # not written
    # Megatron-FSDP copies each micro-batch's gradient into its bucket with the fusion off (_grad_acc)
    assert cfg["model"]["gradient_accumulation_fusion"] is False


def test_zero1_keeps_megatron_cores_ddp():
    pf = load_plan(PLANS / "dense_train.json")
    cfg = hydra_applied(overrides(render_all(pf, "megatron-bridge")[0][SCRIPT]), True)
    assert cfg["ddp"]["use_megatron_fsdp"] is False and cfg["ddp"]["data_parallel_sharding_strategy"] is None
    assert cfg["checkpoint"]["ckpt_format"] is None


@pytest.mark.parametrize("changes, needle", [
    ({"pp": 4, "vpp": 5, "dp": 2}, r"ZeRO-2 \(Megatron-FSDP optim_grads\) under a pipeline \(PP 4\)"),
    ({"overlap_grad_reduce": False}, "without the overlapped gradient reduction"),
    ({"grad_accumulation": "add"}, "with grad_accumulation add"),
    ({"cuda_max_connections": 1}, "Megatron-Bridge asserts it is not 1"),
    ({"zero": 3, "overlap_param_gather": False},
     r"ZeRO-3 \(Megatron-FSDP optim_grads_params\) without the overlapped weight gather"),
    ({"zero": 3, "megatron_fsdp": False}, r"priced without megatron_fsdp \(zero 3, megatron_fsdp False"),
    ({"zero": 3, "pp": 4, "vpp": 5, "dp": 2}, r"ZeRO-3 \(Megatron-FSDP optim_grads_params\) under a pipeline"),
    ({"megatron_fsdp": False}, r"priced without megatron_fsdp \(zero 2, megatron_fsdp False.*--megatron-fsdp"),
])
def test_zero2_refusals(changes, needle):
    pf = load_plan(PLANS / "dense_train.json")
    pf = dataclasses.replace(pf, plan=pf.plan.model_copy(update={**ZERO2, **changes}))
    with pytest.raises(CannotExpress, match=needle):
        render_all(pf, "megatron-bridge")


def test_cli_writes_a_zero2_plan(cli, tmp_path):
    plan = tmp_path / "plan.json"
    assert cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--tp", "1",
               "--pp", "1", "--micro-batch", "1", "--global-batch", "64", "--seq-len", "4096", "--zero", "2",
               "--megatron-fsdp", "--save", plan).code in (0, 3)
    r = cli("export", plan, "--to", "megatron-bridge", "-o", tmp_path / "out")
    assert r.code == 0, r.err
    args = overrides((tmp_path / "out" / SCRIPT).read_text())
    assert "ddp.use_megatron_fsdp=true" in args and "ddp.data_parallel_sharding_strategy=optim_grads" in args
