"""Each plan switch reaches every export as the launcher's own setting or as a refusal that names it: none is
dropped silently (Megatron-LM arguments.py and Megatron-Core TransformerConfig at d98e8a6; Megatron-Bridge
ConfigContainer overrides of the TransformerConfig fields)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from test_export_torchtitan_sinks import gpt_oss_plan
from exported import unwrapped
from refusal import one_line

ARGS = ("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--global-batch", "64")


def saved(cli: Any, tmp_path: Path, *extra: str, **plan: object) -> Path:
    """A plan file made by the CLI, with `plan` fields then set in its JSON (switches without a flag)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "plan.json"
    made = cli(*ARGS, *extra, "--save", path)
    assert made.code == 0, made.err
    if plan:
        doc = json.loads(path.read_text())
        doc["plan"].update(plan)
        path.write_text(json.dumps(doc))
    return path


def export(cli: Any, plan: Path, target: str, out: Path) -> tuple[int, str, str]:
    """(exit code, the files' text, stderr) of `llmplan export PLAN --to TARGET`."""
    r = cli("export", plan, "--to", target, "-o", out)
    files = "\n".join(unwrapped(f.read_text()) for f in out.rglob("*") if f.is_file()) if out.exists() else ""
    return r.code, files, r.err


def test_bridge_turns_gradient_accumulation_fusion_off_for_add_and_refuses_cast_add(cli, tmp_path):
    # Megatron-Core ModelParallelConfig.gradient_accumulation_fusion (default True in the recipes): off, the DDP
    # hook adds each micro-batch's gradient into main_grad; no Megatron path casts and then adds (DeepSpeed's).
    for mode in ("fused", "add"):
        code, files, err = export(cli, saved(cli, tmp_path / mode, "--grad-accumulation", mode), "megatron-bridge",
                                  tmp_path / f"b-{mode}")
        assert code == 0, err
        assert ("model.gradient_accumulation_fusion=false" in files.lower()) == (mode == "add")
    code, files, err = export(cli, saved(cli, tmp_path / "cast", "--grad-accumulation", "cast-add"),
                              "megatron-bridge", tmp_path / "b-cast")
    assert code == 2 and "grad_accumulation cast-add" in err and "--grad-accumulation" in err
    assert "Traceback" not in err and files == ""


def test_rope_fusion_off_is_written_or_refused(cli, tmp_path):
    # Megatron-LM arguments.py (d98e8a6): --no-rope-fusion stores apply_rope_fusion False, as
    # TransformerConfig.apply_rope_fusion does for Megatron-Bridge; torchtitan compiles the model for fused kernels.
    on, off = saved(cli, tmp_path / "on"), saved(cli, tmp_path / "off", rope_fusion=False)
    for plan, want in ((on, False), (off, True)):
        code, files, err = export(cli, plan, "megatron", plan.parent / "m")
        assert code == 0 and ("--no-rope-fusion" in files) == want, err
        code, files, err = export(cli, plan, "megatron-bridge", plan.parent / "b")
        assert code == 0 and ("model.apply_rope_fusion=false" in files.lower()) == want, err
    code, files, err = export(cli, off, "torchtitan", tmp_path / "t")
    assert code == 2 and "rope_fusion off" in err and "Traceback" not in err and files == ""


def test_fused_loss_is_asked_for_in_the_megatron_export(cli, tmp_path):
    # Megatron-LM's default is the unfused vocab-parallel cross entropy (ModelParallelConfig
    # cross_entropy_loss_fusion False at d98e8a6; --cross-entropy-loss-fusion turns it on): the export asks for the
    # fused loss llmplan priced (docs/formulas.md#compute.loss), and leaves it off for a plan priced unfused.
    # unfused: Megatron-Core's in-place vocab-parallel loss, the implementation the export takes
    on = saved(cli, tmp_path / "on")
    off = saved(cli, tmp_path / "off", fused_loss=False, unfused_loss_impl="vocab-parallel")
    for plan, want in ((on, True), (off, False)):
        code, files, err = export(cli, plan, "megatron", plan.parent / "m")
        assert code == 0 and ("--cross-entropy-loss-fusion" in files) == want, err


def test_fused_loss_impl_reaches_both_megatron_exports(cli, tmp_path):
    # Megatron-Core cross_entropy_fusion_impl (ModelParallelConfig at d98e8a6, default native): Megatron-Bridge
    # takes te (its performance recipes set it: scripts/performance/utils/overrides.py); Megatron-LM's
    # arguments.py at d98e8a6 asserts against te with --cross-entropy-loss-fusion (NVIDIA/Megatron-LM #5115), so
    # that export refuses it in one line and writes nothing.
    native = saved(cli, tmp_path / "n")
    te = saved(cli, tmp_path / "te", "--fused-loss-impl", "te")
    code, files, err = export(cli, native, "megatron", tmp_path / "mn")
    assert code == 0 and "--cross-entropy-fusion-impl native" in files, err
    for plan, want in ((native, "native"), (te, "te")):
        code, files, err = export(cli, plan, "megatron-bridge", plan.parent / "b")
        assert code == 0 and f"model.cross_entropy_fusion_impl={want}" in files, err
    code, files, err = export(cli, te, "megatron", tmp_path / "mt")
    assert code == 2 and "fused_loss_impl te" in err and "--fused-loss-impl native" in err and files == ""
    assert one_line(err)


def test_fused_loss_impl_needs_the_fused_loss(cli, tmp_path):
    # check_plan rule fused_loss_impl_fused: the impl picks which fused loss runs, so it acts only with fused_loss
    r = cli(*ARGS, "--unfused-loss", "--fused-loss-impl", "te")
    assert r.code == 2 and "fused_loss_impl te with fused_loss off" in one_line(r.err)
    r = cli(*ARGS, "--fused-loss-impl", "bogus")
    assert r.code == 2 and "--fused-loss-impl bogus" in r.err and "native, te" in r.err


def test_expert_clamp_and_bias_follow_the_expert_gemm_path(cli, tmp_path):
    # Megatron-Core moe/experts.py (d98e8a6): the clamped GLU and the fc2 bias run inside Transformer Engine's
    # grouped MLP ops on the op-fuser path (use_transformer_engine_op_fuser, NVTE_CUTEDSL_FUSED_GROUPED_MLP=1),
    # which the Megatron exports write for expert_gemm grouped, and eagerly in TEGroupedMLP (per-expert);
    # torchtitan and DeepSpeed have no fused path. GPT-OSS has the clamp (swiglu_limit 7) and the expert biases.
    args = ("--model", "gpt-oss-20b", "--hardware", "dgx-h100")
    path = tmp_path / "plan.json"
    made = cli("estimate", *args, "--global-batch", "64", "--save", path)
    assert made.code == 0, made.err
    eager = json.loads(path.read_text())
    for field in ("glu_clamp_fusion", "expert_bias_fusion"):
        fused = tmp_path / f"{field}.json"
        fused.write_text(json.dumps({**eager, "plan": {**eager["plan"], field: True}}))
        for target in ("torchtitan", "deepspeed"):  # no fused path: refused
            code, files, err = export(cli, fused, target, tmp_path / f"{field}-{target}")
            assert code == 2 and files == "", (target, err)
            assert "glu_clamp_fusion / expert_bias_fusion" in one_line(err), target
        for target in ("megatron", "megatron-bridge"):  # the op-fuser path fuses both: the other one noted
            code, files, err = export(cli, fused, target, tmp_path / f"{field}-{target}")
            assert code == 0 and "note: priced with the experts' clamp / fc2 bias eager" in files, (target, err)
    # both fused with one grouped kernel: the op-fuser path, flag and environment
    both = tmp_path / "both.json"
    both.write_text(json.dumps({**eager, "plan": {**eager["plan"], "glu_clamp_fusion": True,
                                                   "expert_bias_fusion": True}}))
    code, files, err = export(cli, both, "megatron", tmp_path / "both-m")
    assert code == 0 and "--use-transformer-engine-op-fuser" in files, err
    assert "export NVTE_CUTEDSL_FUSED_GROUPED_MLP=1" in files
    # eager clamp and bias: TEGroupedMLP, one GEMM per expert, without the op fuser
    per = tmp_path / "per.json"
    per.write_text(json.dumps({**eager, "plan": {**eager["plan"], "expert_gemm": "per-expert"}}))
    code, files, err = export(cli, per, "megatron", tmp_path / "per-m")
    assert code == 0 and "--moe-grouped-gemm" in files and "op-fuser" not in files and "NVTE_CUTEDSL" not in files
    # eager clamp and bias priced beside one grouped kernel (the defaults a search saves): the op fuser fuses them,
    # so the launch runs a little faster than priced, and the header says so
    code, files, err = export(cli, path, "megatron", tmp_path / "eager")
    assert code == 0 and "--use-transformer-engine-op-fuser" in files, err
    assert "note: priced with the experts' clamp / fc2 bias eager" in files
    # fused beside one GEMM per expert (set in the plan, not a default): TEGroupedMLP applies them eagerly, refused
    fused_per = tmp_path / "fused-per.json"
    fused_per.write_text(json.dumps({**eager, "plan": {**eager["plan"], "expert_gemm": "per-expert",
                                                        "glu_clamp_fusion": True, "expert_bias_fusion": True}}))
    code, files, err = export(cli, fused_per, "megatron", tmp_path / "fused-per")
    assert code == 2 and files == "" and "--expert-gemm grouped" in one_line(err)


def test_grouped_expert_gemms_write_the_op_fuser_or_say_what_runs(cli, tmp_path):
    # Megatron-Core moe/experts.py (d98e8a6) _is_fused_impl_supported: the fused grouped MLP needs expert TP 1;
    # --moe-grouped-gemm alone is TEGroupedMLP (one GEMM per local expert), so a grouped plan writes the op fuser,
    # and one with expert TP exports as TEGroupedMLP with a note naming the flag that prices it.
    base = ("estimate", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--global-batch", "64")
    grouped = tmp_path / "g.json"
    assert cli(*base, "--ep", "8", "--save", grouped).code == 0
    for target in ("megatron", "megatron-bridge"):
        code, files, err = export(cli, grouped, target, tmp_path / f"g-{target}")
        assert code == 0, (target, err)
        assert "NVTE_CUTEDSL_FUSED_GROUPED_MLP=1" in files
        assert ("--use-transformer-engine-op-fuser" if target == "megatron"
                else "model.use_transformer_engine_op_fuser=true") in files
    etp = tmp_path / "etp.json"
    made = cli(*base, "--tp", "2", "--ep", "4", "--etp", "2", "--save", etp)
    assert made.code == 0, made.err
    for target in ("megatron", "megatron-bridge"):
        code, files, err = export(cli, etp, target, tmp_path / f"etp-{target}")
        assert code == 0, (target, err)
        assert "NVTE_CUTEDSL" not in files and "use_transformer_engine_op_fuser=true" not in files
        assert "--use-transformer-engine-op-fuser" not in files
        assert "etp 2" in files and "one GEMM per local expert, as priced" in files, files[:600]


def test_per_expert_gemms_go_to_megatron_and_torchtitan_refuses_them(cli, tmp_path):
    # Megatron-Core (d98e8a6): --moe-grouped-gemm builds TEGroupedMLP on Transformer Engine's GroupedLinear, one
    # GEMM per local expert; torchtitan's GroupedExperts call torch._grouped_mm (use_grouped_mm, a model arg).
    args = ("estimate", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--ep", "8", "--global-batch", "64")
    path = tmp_path / "plan.json"
    made = cli(*args, "--expert-gemm", "per-expert", "--save", path)
    assert made.code == 0, made.err
    code, files, err = export(cli, path, "megatron", tmp_path / "m")
    assert code == 0 and "--moe-grouped-gemm" in files and "--use-transformer-engine-op-fuser" not in files, err
    code, files, err = export(cli, path, "torchtitan", tmp_path / "t")
    assert code == 2 and "expert_gemm per-expert" in err and "--expert-gemm grouped" in err and files == ""
    assert "Traceback" not in err


def test_deepspeed_and_torchtitan_refuse_an_accumulation_they_do_not_run(cli, tmp_path):
    # A plan that names an accumulation the launcher does not run is refused; the default `fused` (what a search
    # saves) exports, and every file's header says what the launcher runs and the flag that prices it.
    # Neither fuses the accumulation into the weight-gradient GEMM. DeepSpeed (runtime/bf16_optimizer.py
    # update_hp_grads) casts bf16 gradients to its fp32 accumulation buffer, then adds (ZeRO-1, fp32 grad_accum);
    # ZeRO-2/3 add the reduced partition. torchtitan: FSDP2 adds each reduce-scattered shard; DDP trains fp32
    # parameters under torch.autocast, so autocast's cast comes before autograd's add.
    sync = {"overlap_param_gather": False}  # DeepSpeed gathers ZeRO-1/2 weights inside the optimizer step
    # BF16_Optimizer reduces after the backward (check_switches bf16_optimizer_overlap)
    cases = [("deepspeed", {"zero": 1, "grad_dtype": "fp32", "grad_reduce": "all-reduce", "overlap_grad_reduce": False,
                            **sync}, "cast-add"),
             ("deepspeed", {"zero": 1, "grad_dtype": "bf16", **sync}, "add"),
             ("deepspeed", {"zero": 2, "grad_dtype": "fp32", **sync}, "add"),
             ("torchtitan", {"zero": 3, "grad_dtype": "fp32"}, "add"),
             ("torchtitan", {"zero": 0, "grad_dtype": "fp32", "overlap_param_gather": False}, "cast-add"),
             ("torchtitan-0.2", {"zero": 2, "grad_dtype": "fp32"}, "add")]
    for k, (target, fields, runs) in enumerate(cases):
        for planned in ("fused", "add", "cast-add"):
            path = saved(cli, tmp_path / f"{k}-{planned}", "--tp", "1", "--pp", "1", "--cp", "1",
                         **fields, grad_accumulation=planned)
            code, files, err = export(cli, path, target, tmp_path / f"{k}-{planned}" / "out")
            if planned == runs:
                assert code == 0, (target, fields, err)
                assert "note: priced with gradient accumulation fused" not in files
            elif planned == "fused":
                assert code == 0, (target, fields, err)
                assert (f"runs {runs} (" in files and f"re-plan with --grad-accumulation {runs} to price it" in files
                        and "note: priced with gradient accumulation fused into the GEMM" in files), files[:400]
            else:
                assert code == 2 and files == "", (target, fields, planned, err)
                assert f"--grad-accumulation {runs}" in one_line(err)
                assert f"gradient accumulation {planned}" in err


def test_torchtitan_refuses_zero3_gathers_per_tensor(cli, tmp_path):
    # torchtitan's FSDP2 (parallelize.py apply_fsdp: fully_shard per transformer block) gathers and reduces one
    # layer at a time; a plan priced with DeepSpeed-2021-style per-tensor collectives (--zero3-unit tensor) does
    # not run as priced there, so it is refused with the flag that re-plans it; DeepSpeed takes it.
    path = saved(cli, tmp_path / "t", "--tp", "1", "--pp", "1", "--cp", "1", "--zero", "3", "--zero3-unit", "tensor")
    code, files, err = export(cli, path, "torchtitan", tmp_path / "t" / "out")
    assert code == 2 and "per tensor" in err and "--zero3-unit layer" in err and files == ""
    assert "Traceback" not in err
    code, _, err = export(cli, path, "deepspeed", tmp_path / "t" / "ds")
    assert code == 0, err
    layer = saved(cli, tmp_path / "l", "--tp", "1", "--pp", "1", "--cp", "1", "--zero", "3")
    code, _, err = export(cli, layer, "torchtitan", tmp_path / "l" / "out")
    assert code == 0, err


def test_embedding_norm_is_refused_by_the_megatron_export(cli, tmp_path):
    # BLOOM's word_embeddings_layernorm is Megatron-DeepSpeed's --embed-layernorm; Megatron-LM's parser at d98e8a6
    # (tests/data/launchers/megatron-lm.json) has no flag for a norm on the embedding output, so a script written
    # without it would train another model: the export names the field and writes nothing.
    path = saved(cli, tmp_path / "p")
    doc = json.loads(path.read_text())
    doc["model"]["embedding_norm"] = True
    path.write_text(json.dumps(doc))
    code, files, err = export(cli, path, "megatron", tmp_path / "m")
    assert code == 2 and "norm on the embedding output" in err and "embedding_norm" in err, err
    assert "Traceback" not in err and files == ""


def test_gpt_oss_fc1_bias_and_sink_switches_reach_the_exports_as_notes(cli, tmp_path):
    # Megatron-Core (TE GroupedLinear with its bias, cuDNN attention with sinks) runs both fused: a plan priced
    # with either unfused says it runs faster than priced; torchtitan adds the experts' fc1 bias after
    # torch._grouped_mm, so a plan priced fused says it runs slower, with the plan setting that prices it.
    def plan(name: str, **fields: object) -> Path:
        return gpt_oss_plan(cli, tmp_path, name, **fields)

    unfused = plan("unfused", expert_fc1_bias_fusion=False, sink_fusion=False)
    code, files, err = export(cli, unfused, "megatron", tmp_path / "unfused" / "out")
    assert code == 0, err
    assert "expert_fc1_bias_fusion false" in files and "sink_fusion false" in files
    fused = plan("fused")
    code, files, err = export(cli, fused, "megatron", tmp_path / "fused" / "out")
    assert code == 0, err
    assert "expert_fc1_bias_fusion" not in files and "sink_fusion" not in files
    code, files, err = export(cli, fused, "torchtitan", tmp_path / "fused" / "tt")
    assert code == 0, err
    assert "set expert_fc1_bias_fusion false in the plan" in files


def test_deepspeed_gathers_zero3_per_tensor_as_priced(cli, tmp_path):
    # DeepSpeed ZeRO-3 (deepspeed/runtime/zero/partitioned_param_coordinator.py at 00a31c99) gathers each module's
    # weights at its hook and prefetches only with stage3_prefetch_bucket_size > 0; it releases those not reused
    # within stage3_max_reuse_distance elements. A plan priced per tensor (--zero3-unit tensor: no prefetch, the
    # recompute forward gathers again) is written with both at 0, with a note of what still differs from 2021.
    tensor = saved(cli, tmp_path / "t", "--tp", "1", "--pp", "1", "--cp", "1", "--zero", "3", "--zero3-unit",
                   "tensor", "--recompute", "full")
    code, files, err = export(cli, tensor, "deepspeed", tmp_path / "t" / "ds")
    assert code == 0, err
    zero = json.loads((tmp_path / "t" / "ds" / "ds_config.json").read_text())["zero_optimization"]
    assert zero["stage"] == 3 and zero["stage3_prefetch_bucket_size"] == 0 and zero["stage3_max_reuse_distance"] == 0
    assert "note: zero3_unit tensor" in files and "faster than priced" in files
    layer = saved(cli, tmp_path / "l", "--tp", "1", "--pp", "1", "--cp", "1", "--zero", "3", "--recompute", "full")
    code, files, err = export(cli, layer, "deepspeed", tmp_path / "l" / "ds")
    zero = json.loads((tmp_path / "l" / "ds" / "ds_config.json").read_text())["zero_optimization"]
    assert code == 0 and zero["stage3_prefetch_bucket_size"] > 0 and "stage3_max_reuse_distance" not in zero, err
    assert "note: zero3_unit tensor" not in files


def test_a_non_interleaved_pipeline_says_megatron_core_synchronises_its_exchanges(cli, tmp_path):
    # Megatron-LM validate_args: no interleaving sets overlap_p2p_comm False and batch_p2p_comm = not
    # overlap_p2p_comm; ModelParallelConfig batch_p2p_sync defaults True (torch.cuda.synchronize after each
    # exchange): what pp_blocking_sends prices (docs/formulas.md#step.pp_blocking)
    needle = "non-interleaved pipeline synchronises the device after each exchange (batch_p2p_comm with batch_p2p_sync)"
    for extra, noted in ((("--pp", "2"), True), (("--pp", "2", "--pp-blocking-sends"), False),
                         (("--pp", "2", "--vpp", "2"), False), ((), False)):
        plan = saved(cli, tmp_path / "-".join(extra or ("none",)), "--tp", "2", *extra)
        for target, name in (("megatron", "Megatron-LM"), ("megatron-bridge", "Megatron-Bridge")):
            code, script, err = export(cli, plan, target, tmp_path / f"{target}{'-'.join(extra)}")
            assert code == 0, err
            assert (f"# note: {name}'s {needle}" in script) is noted, (extra, target)
            assert ("re-plan with --pp-blocking-sends to price it" in script) is noted, (extra, target)
