"""benchmarks/ultra_fsdp_units.py (docs/validation.md#ultra-fsdp-units): the probe's FSDP-unit inventory of
Nemotron-3 Ultra, written out by hand from the spec's fields, must add up to what llmplan's own parameter count
(llmplan.cost.params.param_counts, a separate code path) and the model card (nvidia/NVIDIA-Nemotron-3-Ultra-550B-
A55B-BF16: 550B total, 55B active) say; otherwise the per-unit traffic and windows it prints are of another model."""

from __future__ import annotations

import pytest
import ultra_fsdp_units as U  # benchmarks/ is on the path (conftest)

from llmplan.cost.params import param_counts
from llmplan.specs.registry import builtin_models

SMALL_PARTS = 0.001
"""Relative room for what the probe leaves out of a unit: the Mamba conv1d, D, dt bias and A, the norms (llmplan
counts them: about 0.1 B of 549 B)."""


def _inventory():
    m = builtin_models()["nemotron-3-ultra"]
    units = U.unit_params(m)
    n_mamba = sum(t == "mamba" for t in m.layer_types)
    n_attn = sum(t == "full_attention" for t in m.layer_types)
    n_moe = sum(t == "moe" for t in m.mlp_layer_types)
    return m, units, (n_mamba, n_attn, n_moe)


def test_the_pattern_is_the_published_one():
    # Megatron-LM examples/post_training/modelopt/conf/nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16.sh:
    # --num-layers 108, 48 M, 48 E and 12 * in --hybrid-override-pattern
    _, _, counts = _inventory()
    assert counts == (48, 12, 48)


def test_the_units_add_up_to_llmplans_count_and_the_model_card():
    m, units, (n_mamba, n_attn, n_moe) = _inventory()
    embeddings = 2 * m.vocab_size * m.hidden_size  # untied input embedding and output layer
    total = (n_mamba * units["mamba"]["dense"] + n_attn * units["attention"]["dense"]
             + n_moe * (units["moe"]["dense"] + units["moe"]["experts"]) + embeddings)
    p = param_counts(m)
    assert total == pytest.approx(p.total, rel=SMALL_PARTS)
    assert total == pytest.approx(550e9, rel=0.005)  # the card's 550B, printed to two digits


def test_the_active_units_add_up_to_the_model_cards_active_count():
    m, units, (n_mamba, n_attn, n_moe) = _inventory()
    active = (n_mamba * units["mamba"]["active"] + n_attn * units["attention"]["active"]
              + n_moe * units["moe"]["active"] + m.vocab_size * m.hidden_size)  # output layer, no embedding
    p = param_counts(m)
    assert active == pytest.approx(p.active - p.embedding, rel=SMALL_PARTS)
    assert active == pytest.approx(55e9, rel=0.005)
