"""The Megatron exports run what llmplan prices: Python's garbage collection aligned across ranks (--manual-gc) and
no dense causal mask built by the data loader where the attention kernel ignores it
(--no-create-attention-mask-in-dataloader). llmplan prices neither an unaligned collection nor the mask's host
stacking, pinning, copy and TP broadcast (docs/validation.md#megatron-r08-defaults).

Flag names: NVIDIA/Megatron-LM megatron/training/arguments.py and megatron/training/config/training_config.py at
d98e8a64dd, parsed with the flags its parser defines (tests/data/launchers/megatron-lm.json); NVIDIA's own
examples/llama/train_llama3_8b_h100_fp8.sh at that commit sets both. Megatron-Bridge's keys: TrainingConfig
manual_gc / manual_gc_interval and GPTDatasetConfig.create_attention_mask, recorded in
tests/data/launchers/megatron-bridge.json (Megatron-Bridge 0.6.2)."""

from __future__ import annotations

import dataclasses

import pytest

from test_export import PLANS, parse_megatron, recorded_parser
from test_export_bridge import assert_recorded_fields_of_their_type, overrides, script

from llmplan.export import render_all
from llmplan.planfile import load_plan

CASES = ["dense_train", "moe_train", "uneven_train", "layout_train"]


def megatron_script(case: str, **changes) -> str:
    pf = load_plan(PLANS / f"{case}.json")
    if changes:
        pf = dataclasses.replace(pf, plan=pf.plan.model_copy(update=changes))
    return render_all(pf, "megatron")[0]["megatron_pretrain.sh"]


def test_the_recorded_parser_defines_the_flags_as_switches_and_a_value():
    # Megatron-LM at d98e8a6: --manual-gc and --no-create-attention-mask-in-dataloader take no value,
    # --manual-gc-interval takes one (an int; 0 never collects during training).
    _, rec = recorded_parser("megatron-lm")
    flags = rec["flags"]
    assert flags["--manual-gc"]["takes"] == "switch"
    assert flags["--no-create-attention-mask-in-dataloader"]["takes"] == "switch"
    assert flags["--manual-gc-interval"]["takes"] == "value"


@pytest.mark.parametrize("case", CASES)
def test_megatron_script_aligns_gc_and_drops_the_loader_mask(case):
    ns, _ = parse_megatron(megatron_script(case))  # an unknown flag or a switch given a value fails here
    assert ns.manual_gc is True
    assert int(ns.manual_gc_interval) == 100  # Megatron-Bridge's pretrain recipes' interval (common.py)
    assert ns.no_create_attention_mask_in_dataloader is True


def test_the_flash_attn_kernel_drops_the_loader_mask_too():
    # --attention-backend flash (the flash-attn package): causal, it reads no mask either
    ns, _ = parse_megatron(megatron_script("dense_train", attention_kernel="flash2"))
    assert ns.attention_backend == "AttnBackend.flash"
    assert ns.no_create_attention_mask_in_dataloader is True and ns.manual_gc is True


def test_unfused_attention_keeps_the_loader_mask():
    # Transformer Engine's unfused attention (softmax_kernel te) builds an s x s causal mask on the GPU in every
    # layer and ORs the loader's into it (priced: cost.elementwise.te_mask_bytes); the export keeps the loader's.
    ns, _ = parse_megatron(megatron_script("dense_train", flash_attention=False, softmax_kernel="te",
                                           seq_len=16384))
    assert ns.attention_backend == "AttnBackend.unfused"
    assert ns.no_create_attention_mask_in_dataloader is False
    assert ns.manual_gc is True and int(ns.manual_gc_interval) == 100


@pytest.mark.parametrize("target", ["torchrun", "slurm"])
def test_wrapped_megatron_carries_the_flags(target):
    files, _ = render_all(load_plan(PLANS / "dense_train.json"), target)
    text = "\n".join(files.values())
    assert "--no-create-attention-mask-in-dataloader" in text
    assert "--manual-gc --manual-gc-interval 100" in text


@pytest.mark.parametrize("case", ["dense_train", "deepseek_train"])
def test_bridge_overrides_align_gc_and_drop_the_loader_mask(case):
    args = overrides(script(case))
    assert_recorded_fields_of_their_type(args)  # each key a recorded field, each value of its type
    assert {"train.manual_gc=true", "train.manual_gc_interval=100", "dataset.create_attention_mask=false"} \
        <= set(args)
