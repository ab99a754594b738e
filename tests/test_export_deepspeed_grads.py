"""`llmplan export --to deepspeed` keeps the plan's gradient dtype and reduction as DeepSpeed would run them.

DeepSpeed 0.19.8 picks its optimizer wrapper from (model dtype, data_types.grad_accum_dtype, ZeRO stage,
pipeline engine) in deepspeed/runtime/engine.py DeepSpeedEngine._do_optimizer_sanity_check (github.com/
deepspeedai/DeepSpeed): bf16 + fp32 accumulation + ZeRO-1 runs BF16_Optimizer, which all-reduces the whole
fp32 gradient; other ZeRO stages keep gradients in grad_accum_dtype; without ZeRO the two dtypes must match,
and bf16 under the pipeline engine runs BF16_Optimizer (ZeRO-1's sharded master). Each case runs the real CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from refusal import targeted_search_exports

HERE = Path(__file__).parent
BASE = HERE / "data" / "plans" / "fsdp_train.json"  # bf16, tp 1, pp 1, dp 16, ZeRO-3, fp32 gradients


def plan_file(tmp_path: Path, **plan: object) -> Path:
    doc = json.loads(BASE.read_text())
    doc["plan"].update(plan)
    # DeepSpeed gathers ZeRO-1/2 weights inside the optimizer step (deepspeed.overlapped_gather_refusal): the
    # synchronous gather unless a case names the switch
    if "overlap_param_gather" not in plan:
        doc["plan"]["overlap_param_gather"] = False
    # and AutoTP keeps the untied embedding whole on each TP rank (deepspeed.split_embedding_refusal)
    if "tp_whole_embedding" not in plan:
        doc["plan"]["tp_whole_embedding"] = True
    # and an unfused loss priced as DeepSpeed's (export.common.UNFUSED_LOSS_RUNS: eager at tp 1, its own above)
    if "unfused_loss_impl" not in plan and not doc["plan"].get("fused_loss", True):
        doc["plan"]["unfused_loss_impl"] = "eager-vocab-parallel"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    return path


PIPE = {"pp": 2, "dp": 8}
CAST = {"grad_accumulation": "cast-add"}
# DeepSpeed's BF16_Optimizer all-reduces after the backward (check_switches bf16_optimizer_overlap)
BF16_OPT = {**CAST, "overlap_grad_reduce": False}


@pytest.mark.parametrize("plan,grad,reduce_scatter,optimizer", [
    # bf16 + fp32 accumulation + ZeRO-1: BF16_Optimizer, the whole fp32 gradient all-reduced in fp32
    # (and casts each micro-batch's bf16 gradient to fp32 before adding it: update_hp_grads, cast-add)
    ({"zero": 1, "grad_dtype": "fp32", "grad_reduce": "all-reduce", **BF16_OPT}, "fp32", False, "BF16_Optimizer"),
    ({"zero": 1, "grad_dtype": "fp32", "grad_reduce": "all-reduce", **PIPE, **BF16_OPT}, "fp32", False,
     "BF16_Optimizer"),
    # bf16 gradients with ZeRO-1: the ZeRO optimizer, reduce-scatter or all-reduce as planned
    ({"zero": 1, "grad_dtype": "bf16"}, "bf16", True, "ZeRO"),
    ({"zero": 1, "grad_dtype": "bf16", "grad_reduce": "all-reduce"}, "bf16", False, "ZeRO"),
    # ZeRO-2/3 keep a gradient partition in grad_accum_dtype
    ({"zero": 2, "grad_dtype": "fp32"}, "fp32", True, "ZeRO"),
    ({"zero": 3, "grad_dtype": "fp32"}, "fp32", True, "ZeRO"),
    ({"zero": 3, "grad_dtype": "bf16"}, "bf16", True, "ZeRO"),
    # no ZeRO, bf16 gradients, no pipeline: DDP_BFLOAT16
    ({"zero": 0, "grad_dtype": "bf16"}, "bf16", True, "DDP_BFLOAT16"),
    # fp16 with fp32 accumulation under ZeRO-1: the ZeRO optimizer's fp32 grad_accum buffers
    ({"zero": 1, "dtype": "fp16", "grad_dtype": "fp32", **CAST}, "fp32", True, "ZeRO"),
    ({"zero": 1, "dtype": "fp16", "grad_dtype": "bf16"}, "fp16", True, "ZeRO"),
])
def test_deepspeed_writes_the_gradient_dtype(cli, tmp_path, plan, grad, reduce_scatter, optimizer):
    r = cli("export", plan_file(tmp_path, **plan), "--to", "deepspeed", "-o", tmp_path / "out")
    assert r.code == 0, r.err
    cfg = json.loads((tmp_path / "out" / "ds_config.json").read_text())
    assert cfg["data_types"] == {"grad_accum_dtype": grad}
    assert cfg["communication_data_type"] == grad  # engine.allreduce_bucket casts to it (default: model dtype)
    assert cfg["zero_optimization"]["stage"] == plan["zero"]
    assert cfg["zero_optimization"]["reduce_scatter"] is reduce_scatter
    # the wrapper DeepSpeed's rule picks (engine.py _do_optimizer_sanity_check), restated from the config
    model = "bf16" if cfg["bf16"]["enabled"] else "fp16"
    zero = cfg["zero_optimization"]["stage"]
    picked = ("BF16_Optimizer" if zero == 1 and model == "bf16" and grad == "fp32" else "ZeRO") if zero else (
        "DDP_BFLOAT16" if model == grad == "bf16" and plan.get("pp", 1) == 1 else "other")
    assert picked == optimizer
    if optimizer == "BF16_Optimizer":  # it reduces after the backward: overlap_comm off, as priced
        assert cfg["zero_optimization"]["overlap_comm"] is False


def test_deepspeed_fp32_training_keeps_the_defaults(cli, tmp_path):
    r = cli("export", plan_file(tmp_path, zero=2, dtype="fp32"), "--to", "deepspeed", "-o", tmp_path / "out")
    assert r.code == 0, r.err
    cfg = json.loads((tmp_path / "out" / "ds_config.json").read_text())
    assert "data_types" not in cfg and "communication_data_type" not in cfg
    assert not cfg["bf16"]["enabled"] and not cfg["fp16"]["enabled"]


@pytest.mark.parametrize("plan,needles", [
    ({"zero": 1, "grad_dtype": "fp32", "grad_reduce": "reduce-scatter"},
     ["ZeRO-1 fp32 gradients reduce-scattered", "grad_reduce reduce-scatter", "BF16_Optimizer",
      "--grad-reduce all-reduce", "--grad-dtype bf16"]),
    ({"zero": 1, "grad_dtype": "fp32", **PIPE}, ["ZeRO-1 fp32 gradients reduce-scattered", "--grad-reduce all-reduce"]),
    ({"zero": 0, "grad_dtype": "fp32"},
     ["fp32 gradients with bf16 weights and ZeRO stage 0", "unsupported mix", "--grad-dtype bf16"]),
    ({"zero": 0, "dtype": "fp16", "grad_dtype": "fp32"}, ["fp32 gradients with fp16 weights", "--grad-dtype bf16"]),
    ({"zero": 0, "grad_dtype": "bf16", **PIPE},
     ["ZeRO stage 0 with bf16 under the pipeline engine (pp 2, dp 8", "BF16_Optimizer",
      "--zero 1 --grad-reduce all-reduce"]),
])
def test_deepspeed_refuses_gradients_it_runs_otherwise(cli, tmp_path, plan, needles):
    r = cli("export", plan_file(tmp_path, **plan), "--to", "deepspeed", "-o", tmp_path / "out")
    assert r.code == 2, r.out
    line = r.err.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "runtime/engine.py _do_optimizer_sanity_check" in line
    for needle in needles:
        assert needle in line, line
    assert not (tmp_path / "out").exists()


def test_bf16_pipeline_at_dp_1_is_refused(cli, tmp_path):
    # deepspeedai/DeepSpeed edaa72212 runtime/engine.py _do_optimizer_sanity_check: bf16 weights and bf16
    # gradient accumulation under a PipelineModule return BFLOAT16 whatever the DP size; BF16_Optimizer keeps its
    # bf16 flat gradient beside each param.grad (4 B a parameter, 2 priced), so dp 1 is refused as dp > 1 is
    common = ("-m", "gpt-1.7b", "--hardware", "dgx-a100", "--nodes", "1", "--gpus-per-node", "2", "--pp", "2",
              "--dp", "1", "--grad-dtype", "bf16")
    r = cli("estimate", *common, "--zero", "0", "--save", tmp_path / "z0.json")
    assert r.code == 0, r.err
    r = cli("export", tmp_path / "z0.json", "--to", "deepspeed", "-o", tmp_path / "out")
    assert r.code == 2 and "Traceback" not in r.err
    line = " ".join(r.err.split())
    assert ("ZeRO stage 0 with bf16 under the pipeline engine (pp 2, dp 1; DeepSpeed 0.19.8 runtime/engine.py "
            "_do_optimizer_sanity_check: this runs BF16_Optimizer, whose bf16 flat gradient sits beside the kept "
            "bf16 param.grad, 4 bytes a parameter where 2 are priced); re-plan with --zero 1 --grad-reduce "
            "all-reduce") in line, line
    assert not (tmp_path / "out").exists()
    # the fix it names exports (DeepSpeed's ZeRO-1 optimizer: bf16 weights and gradients)
    r = cli("estimate", *common, "--zero", "1", "--grad-reduce", "all-reduce", "--save", tmp_path / "z1.json")
    assert r.code == 0, r.err
    r = cli("export", tmp_path / "z1.json", "--to", "deepspeed", "-o", tmp_path / "out")
    assert r.code == 0, r.err


def test_search_then_export_deepspeed(cli, tmp_path):
    # The search tries fp32 and bf16 gradients; a ZeRO-1 plan with pinned fp32 gradients reduce-scatters by
    # default, which DeepSpeed runs as BF16_Optimizer's all-reduce: refused, and the fix the line names works.
    common = ("--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--zero", "1", "--tp", "1", "--pp", "1",
              "--cp", "1", "--no-overlap-param-gather")
    plan = tmp_path / "p.json"
    assert cli("search", *common, "--save", plan).code == 0
    # the default accumulation is Megatron's, fused into the GEMM; DeepSpeed's autograd adds: the search's plan
    # exports, its files saying so with the flag that prices it
    r = cli("export", plan, "--to", "deepspeed", "-o", tmp_path / "a0")
    assert r.code == 0, r.err
    assert "re-plan with --grad-accumulation add to price it" in (tmp_path / "a0" / "ds_config.json").read_text()
    assert cli("search", *common, "--grad-accumulation", "add", "--save", plan, "--force").code == 0
    assert cli("export", plan, "--to", "deepspeed", "-o", tmp_path / "a").code == 0
    assert cli("search", *common, "--grad-dtype", "fp32", "--save", plan, "--force").code == 0
    r = cli("export", plan, "--to", "deepspeed", "-o", tmp_path / "b")
    assert r.code == 2 and "--grad-reduce all-reduce" in r.err
    assert cli("search", *common, "--grad-dtype", "fp32", "--grad-reduce", "all-reduce", "--save", plan,
               "--force").code == 0
    r = cli("export", plan, "--to", "deepspeed", "-o", tmp_path / "c0")
    assert r.code == 0 and "runs cast-add" in (tmp_path / "c0" / "ds_config.json").read_text()  # BF16_Optimizer
    assert cli("search", *common, "--grad-dtype", "fp32", "--grad-reduce", "all-reduce", "--grad-accumulation",
               "add", "--save", plan, "--force").code == 0
    r = cli("export", plan, "--to", "deepspeed", "-o", tmp_path / "c1")
    assert r.code == 2 and "--grad-accumulation cast-add" in r.err  # named otherwise than it runs: refused
    # BF16_Optimizer keeps the bf16 param.grad beside the fp32 one (docs/formulas.md#mem.bf16_optimizer_grads):
    # 8B parameters at 2 + 4 + 2 + 12/8 bytes are 71 GiB of states on a TP1 rank and nothing fits, so this
    # search takes the 1.7B GPT of Narayanan et al. 2021 (16 GB of states)
    small = tuple("gpt-1.7b" if k and common[k - 1] == "--model" else a for k, a in enumerate(common))
    assert cli("search", *small, "--grad-dtype", "fp32", "--grad-reduce", "all-reduce", "--grad-accumulation",
               "cast-add", "--save", plan, "--force").code == 0
    assert cli("export", plan, "--to", "deepspeed", "-o", tmp_path / "c").code == 0
    cfg = json.loads((tmp_path / "c" / "ds_config.json").read_text())
    assert cfg["data_types"] == {"grad_accum_dtype": "fp32"} and cfg["zero_optimization"]["reduce_scatter"] is False


def test_deepspeed_refuses_the_overlapped_gather_under_its_pipeline(cli, tmp_path):
    # DeepSpeed 0.19.8's pipeline engine gathers ZeRO-1 weights after the optimizer step, every stage at once
    # (runtime/bf16_optimizer.py BF16_Optimizer.step -> update_lp_params -> all_gather_dp_groups), not on the
    # 1F1B warm-up's chain llmplan prices for the overlapped gather: refused in one line naming the flag, and the
    # plan re-planned with it exports
    doc = json.loads(BASE.read_text())
    doc["plan"].update({"zero": 1, "grad_dtype": "bf16", **PIPE, "overlap_param_gather": True})
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    r = cli("export", path, "--to", "deepspeed", "-o", tmp_path / "out")
    assert r.code == 2, r.out
    line = r.err.strip()
    assert "\n" not in line and "overlap_param_gather" in line and "re-plan with --no-overlap-param-gather" in line
    assert not (tmp_path / "out").exists()
    r = cli("export", plan_file(tmp_path, zero=1, grad_dtype="bf16", **PIPE), "--to", "deepspeed", "-o",
            tmp_path / "ok")
    assert r.code == 0, r.err


def test_search_targeting_deepspeed_prices_the_synchronous_gather(cli, tmp_path):
    # the reviewer's case: llama-3.1-8b on 2 DGX-H100, pp 4, ZeRO-1 all-reduced: with the overlapped gather named
    # the #1 carries it and deepspeed refuses it; --target deepspeed searches the synchronous gather and its #1
    # exports
    common = ("--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "2", "--pp", "4", "--vpp", "1",
              "--zero", "1", "--grad-reduce", "all-reduce")
    plain, targeted = tmp_path / "p.json", tmp_path / "t.json"
    assert cli("search", *common, "--overlap-param-gather", "--save", plain).code == 0
    assert json.loads(plain.read_text())["plan"]["overlap_param_gather"] is True
    r = cli("export", plain, "--to", "deepspeed", "-o", tmp_path / "a")
    assert r.code == 2 and "--no-overlap-param-gather" in r.err
    r = cli("search", *common, "--target", "deepspeed", "--save", targeted)
    assert r.code == 0, r.err
    assert json.loads(targeted.read_text())["plan"]["overlap_param_gather"] is False
    r = cli("export", targeted, "--to", "deepspeed", "-o", tmp_path / "b")
    assert r.code == 0, r.err


def test_deepspeed_refuses_the_overlapped_gather_without_a_pipeline(cli, tmp_path):
    # pp 1: DeepSpeed 0.19.8's ZeRO-1/2 optimizer gathers the updated weights inside step() (runtime/zero/
    # stage_1_and_2.py DeepSpeedZeroOptimizer.step -> all_gather_dp_groups, one all_gather_into_tensor per group),
    # not behind the first forward as overlap_param_gather is priced: one line, exit 2, no files; ZeRO-3 (its own
    # per-module gathers) and the synchronous gather export
    for zero, grads in ((1, "bf16"), (2, "fp32")):
        r = cli("export", plan_file(tmp_path, zero=zero, grad_dtype=grads, overlap_param_gather=True), "--to",
                "deepspeed", "-o", tmp_path / f"out{zero}")
        assert r.code == 2, r.out
        line = r.err.strip()
        assert "\n" not in line and "Traceback" not in line
        assert f"overlapped behind the first forward (overlap_param_gather, ZeRO-{zero}, dp 16" in line
        assert "re-plan with --no-overlap-param-gather, or search with --target deepspeed" in line
        assert not (tmp_path / f"out{zero}").exists()
        assert cli("export", plan_file(tmp_path, zero=zero, grad_dtype=grads), "--to", "deepspeed", "-o",
                   tmp_path / f"ok{zero}").code == 0
    assert cli("export", plan_file(tmp_path, zero=3, overlap_param_gather=True), "--to", "deepspeed", "-o",
               tmp_path / "z3").code == 0


def test_search_targeting_deepspeed_without_a_pipeline_exports(cli, tmp_path):
    # pp 1, ZeRO-1: the untargeted search's #1 overlaps the gather and deepspeed refuses it; --target deepspeed
    # searches the synchronous gather (export.SYNC_GATHER_TARGETS) and its #1 exports
    common = ("--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--pp", "1", "--tp", "1", "--zero", "1")
    targeted_search_exports(cli, tmp_path, common, "overlap_param_gather", True, False, "--no-overlap-param-gather")


def test_deepspeed_refuses_the_fused_loss_at_tp(cli, tmp_path):
    # at tp > 1 the export writes vocab_parallel_lm_head, so DeepSpeed 0.19.8 runs its own vocabulary-parallel
    # loss (sequence/cross_entropy.py _VocabParallelCrossEntropy: three all-reduces of one fp32 a token, kernel by
    # kernel), llmplan's unfused loss: either fused loss is refused in one line (exit 2, no files), the unfused
    # loss exports with the head kept vocabulary-parallel, and tp 1 (the training script's own loss) is unchanged
    for impl, priced in (("native", "two all-reduces"), ("te", "one all-gather")):
        r = cli("export", plan_file(tmp_path, zero=2, tp=2, dp=8, fused_loss=True, fused_loss_impl=impl), "--to",
                "deepspeed", "-o", tmp_path / impl)
        assert r.code == 2, r.out
        line = r.err.strip()
        assert "\n" not in line and f"fused cross entropy at tp 2 (fused_loss, fused_loss_impl {impl}" in line
        assert priced in line and "re-plan with --unfused-loss" in line
        assert not (tmp_path / impl).exists()
    r = cli("export", plan_file(tmp_path, zero=2, tp=2, dp=8, fused_loss=False), "--to", "deepspeed", "-o",
            tmp_path / "u")
    assert r.code == 0, r.err
    cfg = json.loads((tmp_path / "u" / "ds_config.json").read_text())
    assert cfg["tensor_parallel"] == {"autotp_size": 2, "vocab_parallel_lm_head": True,
                                      "vocab_parallel_ce_backend": "torch"}
    r = cli("export", plan_file(tmp_path, zero=2, tp=1, fused_loss=True, fused_loss_impl="te"), "--to",
            "deepspeed", "-o", tmp_path / "t1")
    assert r.code == 0, r.err
    assert "tensor_parallel" not in json.loads((tmp_path / "t1" / "ds_config.json").read_text())


def test_deepspeed_tensor_parallel_section_is_what_deepspeed_parses(tmp_path):
    # the written tensor_parallel section parses as DeepSpeed 0.19.8's TPTrainingConfig (extra keys refused there
    # would otherwise surface only at launch)
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.tensor_parallel.config import get_tensor_parallel_config
    from llmplan.export import render_all
    from llmplan.planfile import load_plan

    pf = load_plan(plan_file(tmp_path, zero=2, tp=2, dp=8, fused_loss=False))
    tp = get_tensor_parallel_config(json.loads(render_all(pf, "deepspeed")[0]["ds_config.json"]))
    assert tp.autotp_size == 2 and tp.vocab_parallel_lm_head is True and tp.vocab_parallel_ce_backend == "torch"


def test_search_targeting_deepspeed_searches_the_unfused_loss_at_tp(cli, tmp_path):
    # tp 2 pinned: the untargeted #1 prices Megatron-Core's fused loss, which deepspeed refuses (one line naming
    # --unfused-loss); --target deepspeed searches the unfused loss (export.UNFUSED_LOSS_TARGETS) and its #1
    # exports with the head vocabulary-parallel; --fused-loss named is kept, and none of its plans exports
    common = ("--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--tp", "2", "--pp", "1", "--no-sp",
              "--no-overlap-param-gather")
    targeted_search_exports(cli, tmp_path, common, "fused_loss", True, False, "re-plan with --unfused-loss")
    cfg = json.loads((tmp_path / "targeted" / "ds_config.json").read_text())
    assert cfg["tensor_parallel"]["vocab_parallel_lm_head"] is True
    r = cli("search", *common, "--fused-loss", "--target", "deepspeed")
    assert r.code == 2 and "none of the" in r.err and "the fused cross entropy at tp 2" in r.err
