"""ParallelPlan.megatron_fsdp: ZeRO-2 / ZeRO-3 memory as Megatron-FSDP holds it (docs/formulas.md#mem.megatron_fsdp).

Expected values by hand from NVIDIA/Megatron-LM d98e8a64dd megatron/core/distributed/fsdp/ (the same at cd4afffa6):
the FSDP units are the decoder layers (mcore_fsdp_adapter.py); suggested_communication_unit_size = max(1e9, 2 x
the mean unit) at optim_grads_params and 1e9 at optim_grads (megatron_fsdp.py _init_fsdp_param_and_grad_buffer);
the all-gather prefetch asks for further units until half that many elements (param_and_grad_buffer.py
AllGatherPipeline.all_gather_params); the non-unit bucket is never released in the step (reset with
preserve_non_fsdp_units); a launched unit's unsharded gradient bucket is freed only once the queue holds more than
the capacity (GradReducePipeline.wait_for_previous_grad_reduce)."""

from __future__ import annotations

import math

import pytest

from llmplan.estimate import estimate_training
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()
H100 = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=1)

# Llama 3.1 8B by hand (config.json: h 4096, 32 layers, 32 heads of 128, 8 KV heads, ffn 14336, vocab 128256,
# untied): a decoder layer's parameters and the non-unit ones (embedding, output layer, final norm) at TP 1
H, F, V, L = 4096, 14336, 128256, 32
UNIT = H * (H + 2 * 8 * 128) + H * H + 3 * H * F + 2 * H  # QKV, output projection, SwiGLU MLP, two norms
ENDS = 2 * V * H + H
TOTAL = L * UNIT + ENDS
# the default allowance: 5% of the churned tensors, the gathered and queued buffers among them
# (docs/formulas.md#mem.fragmentation)
FRAGMENTATION = 1.05


def plan(zero: int, on: bool, **kw) -> ParallelPlan:
    return ParallelPlan(tp=1, pp=1, dp=8, zero=zero, micro_batch=1, global_batch=64, seq_len=4096,
                        megatron_fsdp=on, **kw)


def other(zero: int, on: bool) -> float:
    p = plan(zero, on)
    assert not check_plan(M["llama-3.1-8b"], p, H100)
    return float(estimate_training(M["llama-3.1-8b"], H100, p).memory.other)


def test_zero2_holds_the_queued_unsharded_gradient_buckets():
    # capacity 1e9 elements: floor(1e9 / 218,112,000) = 4 launched units kept, one more launched, one filling
    queued = (math.floor(1e9 / UNIT) + 2) * UNIT
    assert queued == 6 * UNIT
    assert other(2, True) - other(2, False) == pytest.approx(FRAGMENTATION * queued * 4, rel=1e-3)  # fp32 gradients


def test_zero3_holds_its_prefetch_the_non_unit_weights_and_the_queue():
    # prefetch max(5e8, u) = 5e8: ceil(5e8 / u) = 3 units ahead of the one in use, and the embedding and output
    # layer whole; llmplan's default ZeRO-3 holds two average layers (TOTAL / L each, under the 1e9 cap)
    gathered = (1 + math.ceil(5e8 / UNIT)) * UNIT + ENDS
    default = 2 * TOTAL / L
    queued = (math.floor(max(1e9, 2 * UNIT) / UNIT) + 2) * UNIT
    expected = FRAGMENTATION * ((gathered - default) * 2 + queued * 4)  # bf16 weights, fp32 gradients
    assert other(3, True) - other(3, False) == pytest.approx(expected, rel=1e-3)
    assert expected / 2 ** 30 == pytest.approx(7.9, abs=0.1)


@pytest.mark.parametrize("zero, pp, words", [(1, 1, "megatron_fsdp with zero 1, pp 1"),
                                             (2, 2, "megatron_fsdp with zero 2, pp 2")])
def test_without_sharded_gradients_or_with_a_pipeline_it_is_refused(cli, zero, pp, words):
    line = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--tp", "1",
               "--pp", str(pp), "--zero", str(zero), "--global-batch", "64", "--megatron-fsdp").refusal()
    assert words in line and "drop --megatron-fsdp" in line, line


@pytest.mark.parametrize("name, nodes", [("llama-3.1-8b", 2), ("mixtral-8x7b", 4)])
def test_vectorised_search_prices_it_as_the_scalar_estimate(name, nodes):
    from itertools import islice

    from agreement import assert_arrays_agree
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    m = M[name]
    cluster = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=nodes)
    w = Workload(global_batch=64, seq_len=4096, megatron_fsdp=True)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    ok = (i for i in range(len(plans)) if plans.plan(i).zero >= 2 and plans.plan(i).pp == 1
          and not check_plan(m, plans.plan(i), cluster))
    idx = list(islice(ok, 0, 300, 10))
    moved = [i for i in idx if float(estimate_training(m, cluster, plans.plan(i)).memory.total) != float(
        estimate_training(m, cluster, plans.plan(i).model_copy(update={"megatron_fsdp": False})).memory.total)]
    assert len(moved) >= 3 and len(moved) == len(idx)
    assert_arrays_agree(m, cluster, plans, idx)


def test_only_megatron_launchers_write_it(cli, tmp_path):
    path = tmp_path / "plan.json"
    assert cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--tp", "1",
               "--pp", "1", "--zero", "2", "--global-batch", "64", "--megatron-fsdp", "--save", path).code in (0, 3)
    assert cli("export", path, "--to", "megatron", "-o", tmp_path / "meg").code == 0
    assert "--use-megatron-fsdp" in (tmp_path / "meg" / "megatron_pretrain.sh").read_text()
    assert cli("export", path, "--to", "megatron-bridge", "-o", tmp_path / "br").code == 0
    for target in ("deepspeed", "torchtitan"):
        line = cli("export", path, "--to", target, "-o", tmp_path / target).refusal()
        assert "megatron_fsdp" in line and "--no-megatron-fsdp" in line, line


def _follow(fix: str, target: str) -> list[tuple[str, dict[str, str | None]]]:
    """(target, flags) for each option a refusal's fix names: 're-plan with FLAGS' (on the same target, '--zero 1 or
    0' read as one option per stage) and 'export to A / B [with FLAGS]'."""
    out: list[tuple[str, dict[str, str | None]]] = []
    for option in fix.removeprefix("re-plan with ").split(", or "):
        to, _, flags = option.partition(" with ") if option.startswith("export to ") else ("", "", option)
        words = flags.split()
        stages = [w for i, w in enumerate(words) if i and words[i - 1] in ("--zero", "or") and w.isdigit()]
        rest = {w: None for w in words if w.startswith("--") and w != "--zero"}
        for stage in stages or [None]:
            named = {**rest, **({"--zero": stage} if stage else {})}
            for t in (to.removeprefix("export to ").split(" / ") if to else [target]):
                out.append((t, named))
    return out


def test_refusals_of_a_zero3_megatron_fsdp_plan_name_fixes_that_export(cli, tmp_path):
    # a ZeRO-3 plan priced with megatron_fsdp: Megatron-LM / Megatron-Bridge write it (optim_grads_params),
    # DeepSpeed / torchtitan shard their own way and refuse it; each refusal's fix must lead somewhere that
    # exports, never back to a target refusing the same plan (review: deepspeed -> megatron -> deepspeed)
    base = {"--model": "llama-3.1-8b", "--hardware": "dgx-h100", "--nodes": "1", "--tp": "1", "--pp": "1",
            "--zero": "3", "--global-batch": "64", "--megatron-fsdp": None}

    def saved(flags: dict[str, str | None], name: str):
        args = {**base, **flags}
        if "--no-megatron-fsdp" in args:
            del args["--megatron-fsdp"]
        path = tmp_path / f"{name}.json"
        words = [w for k, v in args.items() for w in ((k,) if v is None else (k, v))]
        assert cli("estimate", *words, "--save", path).code in (0, 3)
        return path

    plan = saved({}, "zero3")
    for target in ("megatron", "megatron-bridge"):
        assert cli("export", plan, "--to", target, "-o", tmp_path / target).code == 0, target
    followed = 0
    for target in ("deepspeed", "torchtitan"):
        line = cli("export", plan, "--to", target, "-o", tmp_path / target).refusal()
        fix = line.rsplit("; ", 1)[1]
        for i, (to, flags) in enumerate(_follow(fix, target)):
            again = saved(flags, f"{target}-{i}")
            result = cli("export", again, "--to", to, "-o", tmp_path / f"{target}-{i}-{to}")
            assert result.code == 0, (line, to, flags, result.err)
            followed += 1
    assert followed >= 4


def test_per_tensor_units_are_refused_with_it(cli):
    # Megatron-FSDP's units are decoder layers (fsdp_unit_modules, mcore_fsdp_adapter.py at d98e8a64dd): it never
    # gathers one weight at a time, so the per-tensor unit (DeepSpeed's ZeRO-3 of 2021) cannot be priced beside it
    args = ("--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--global-batch", "64",
            "--zero3-unit", "tensor")
    line = cli("estimate", *args, "--tp", "1", "--pp", "1", "--zero", "3", "--megatron-fsdp").refusal()
    assert "megatron_fsdp with zero3_unit tensor" in line and "drop --megatron-fsdp" in line, line
    assert cli("estimate", *args, "--tp", "1", "--pp", "1", "--zero", "3").code in (0, 3)  # either alone is fine
    line = cli("search", *args, "--megatron-fsdp").refusal()
    assert "megatron_fsdp_unit" in line and "--zero3-unit layer" in line, line
    # a Megatron target turns the switch on by itself: the line says to drop the unit, not a flag never named
    line = cli("search", *args, "--target", "megatron").refusal()
    assert "--zero3-unit tensor with --target megatron" in line and "drop --zero3-unit" in line, line


@pytest.mark.parametrize("unit, units", [(2e8, 4), (6e8, 2), (1.2e9, 2), (5e8, 2), (4.99e8, 3)])
def test_prefetch_counts_past_the_unit_in_use(unit, units):
    # all_gather_params (param_and_grad_buffer.py at d98e8a64dd, cd4afffa6) subtracts the unit in use's own size
    # (base_all_gather_size) before comparing with S = C // 2, C = max(1e9, 2u); it adds a unit while the prefetched
    # sum is below S: u = 2e8, S = 5e8: 0, 2e8, 4e8 < S, 6e8 stops -> 3 ahead + 1; u = 6e8, S = 6e8: 0 < S, 6e8 stops
    # -> 1 ahead + 1; u = 4.99e8, S = 5e8: 0, 4.99e8 < S, 9.98e8 stops -> 2 ahead + 1
    from llmplan.cost.memory import megatron_fsdp_held_params
    weights, _ = megatron_fsdp_held_params(unit, 7.0, 32, 3)
    assert float(weights) == pytest.approx(units * unit + 7.0)
    assert float(megatron_fsdp_held_params(unit, 7.0, 2, 3)[0]) == pytest.approx(2 * unit + 7.0)  # at most L
