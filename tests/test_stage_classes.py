"""Stages of one class (cost.memory.stage_class) are priced once: an explicit stage list must cost exactly what
pricing every stage by itself costs. The reference is the same code with the classes switched off (every stage
its own class, as before the classes), compared on the whole JSON output, so a stage property the class misses
(one that makes two stages of a class cost differently) fails here."""

from __future__ import annotations

import random

import pytest

import llmplan.cost.memory as memory

# (model, nodes, extra options): dense, MoE with leading dense layers, MoE placed by mlp_layer_types, a hybrid
# stack (mixer kinds by position), many micro-batches (in-flight counts differ stage by stage), ZeRO-1/3, block
# recompute, activation offload, the zero-bubble schedule.
CASES = [
    ("llama-3.1-70b", 8, ("--global-batch", "256")),
    ("llama-3.1-70b", 8, ("--zero", "3", "--global-batch", "64", "--recompute", "full", "--recompute-layers", "2")),
    ("llama-3.1-70b", 8, ("--zero", "1", "--global-batch", "128", "--pp-schedule", "zero-bubble")),
    ("deepseek-v3", 64, ("--ep", "8", "--global-batch", "512")),
    ("llama-4-maverick", 16, ("--ep", "8", "--global-batch", "256")),
    ("nemotron-h-56b", 8, ("--global-batch", "128", "--recompute", "selective")),
    ("qwen3-next-80b-a3b", 8, ("--ep", "8", "--global-batch", "128")),
]


def stage_list(layers: int, pp: int, rng: random.Random) -> list[int]:
    """pp stage layer counts summing to `layers`: an even split with a few layers moved between stages, so
    that most stages repeat a class and some do not."""
    out = [layers // pp + (i < layers % pp) for i in range(pp)]
    for _ in range(3):
        a, b = rng.randrange(pp), rng.randrange(pp)
        if out[a] > 1:
            out[a] -= 1
            out[b] += 1
    return out


LAYERS = {"llama-3.1-70b": 80, "deepseek-v3": 61, "llama-4-maverick": 48, "nemotron-h-56b": 118,
          "qwen3-next-80b-a3b": 48}


@pytest.mark.parametrize("name,nodes,extra", CASES)
def test_stage_classes_price_as_every_stage_alone(cli, monkeypatch, name, nodes, extra):
    rng = random.Random(f"{name}{extra}")
    pp = 8
    layers = stage_list(LAYERS[name], pp, rng)
    args = ("estimate", "--model", name, "--hardware", "dgx-h100", "--nodes", str(nodes), "--pp", str(pp),
            "--pp-layers", ",".join(map(str, layers)), *extra, "--json")
    classed = cli(*args)
    assert classed.code == 0, classed.err
    assert memory.stage_classes(*_model_plan(name, layers)) is not None  # the classes are on for this plan
    monkeypatch.setattr(memory, "stage_classes", lambda m, plan: None)
    alone = cli(*args)
    assert alone.code == 0, alone.err
    assert classed.out == alone.out


def _model_plan(name: str, layers: list[int]):
    from llmplan.specs.plan import ParallelPlan
    from llmplan.specs.registry import builtin_models

    return builtin_models()[name], ParallelPlan(pp=len(layers), pp_layers=tuple(layers))
