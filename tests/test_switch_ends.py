"""The newer plan and model switches end to end, as a user meets them: a plan file round-trips them, a switch
that would do nothing is refused in one line with exit 2, and every export writes it or refuses it in one line
(cp_comm_overlap, tp_overlap_sms, tp_overlap_margin_sms, pp_blocking_sends, pp_unbatched_sends, norm_kernel,
ModelSpec.parallel_block). The real command throughout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from exported import unwrapped

from llmplan.planfile import load_plan

PLANS = Path(__file__).parent / "data" / "plans"


def edited(tmp_path: Path, case: str, model: dict | None = None, **plan: object) -> Path:
    """A shipped plan file with some plan (and model) fields changed."""
    doc = json.loads((PLANS / f"{case}.json").read_text())
    doc["plan"].update(plan)
    doc["model"].update(model or {})
    path = tmp_path / f"{case}-edited.json"
    path.write_text(json.dumps(doc))
    return path


def one_line(r) -> str:
    assert r.code == 2, r.out + r.err
    assert "Traceback" not in r.err + r.out
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert len(lines) == 1, r.err
    return lines[0]


def test_a_saved_plan_round_trips_the_new_switches(cli, tmp_path):
    """estimate --save writes each switch; the file read back holds the same values (the plan-file-only
    tp_overlap_sms / tp_overlap_margin_sms set in its JSON, as the megatron export's note tells the user)."""
    saved = tmp_path / "p.json"
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "2", "--tp", "8", "--sp",
            "--tp-comm-overlap", "--pp", "2", "--global-batch", "64", "--pp-blocking-sends", "--pp-unbatched-sends",
            "--norm-kernel", "two-pass", "--save", saved)
    assert r.code == 0, r.err
    doc = json.loads(saved.read_text())
    assert doc["plan"]["pp_blocking_sends"] and doc["plan"]["pp_unbatched_sends"]
    assert doc["plan"]["norm_kernel"] == "two-pass"
    doc["plan"].update(tp_overlap_sms=[1, 16, 8, 16], tp_overlap_margin_sms=[0, 16, 16, 16])
    saved.write_text(json.dumps(doc))
    plan = load_plan(saved).plan
    assert plan.tp_overlap_sms == (1, 16, 8, 16) and plan.tp_overlap_margin_sms == (0, 16, 16, 16)
    assert plan.pp_blocking_sends and plan.pp_unbatched_sends and plan.norm_kernel == "two-pass"
    ring = tmp_path / "ring.json"
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "2", "--tp", "8",
            "--cp", "2", "--cp-impl", "torch-allgather", "--no-cp-comm-overlap", "--save", ring)
    assert r.code == 0, r.err
    assert load_plan(ring).plan.cp_comm_overlap is False


def test_pp_unbatched_sends_with_another_schedule_is_refused(cli):
    """DeepSpeed's pipeline engine runs 1F1B only: on zero-bubble or DualPipe the switch would price transfers no
    launcher makes (cost.step.pp_exposed_per_step reads it on any non-interleaved schedule)."""
    line = one_line(cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "4", "--tp", "8",
                        "--pp", "4", "--global-batch", "64", "--pp-schedule", "zero-bubble", "--pp-unbatched-sends"))
    assert line == ("error: the plan breaks a rule: pp_unbatched_sends with pp 4, vpp 1, pp_schedule zero-bubble: it "
                    "serialises the sends of a non-interleaved 1F1B schedule (DeepSpeed's pipeline engine), so it "
                    "acts only with pp > 1, vpp 1 and pp_schedule 1f1b; use --pp 2 or more with --vpp 1 and "
                    "--pp-schedule 1f1b, or drop --pp-unbatched-sends")


@pytest.mark.parametrize("flags,text", [
    (("--pp", "1", "--pp-blocking-sends"),
     "error: the plan breaks a rule: pp_blocking_sends with pp 1: it makes the sends between pipeline stages wait, "
     "so it acts only with pp > 1; use --pp 2 or more or drop --pp-blocking-sends"),
    (("--cp", "2", "--no-cp-comm-overlap"),
     "error: the plan breaks a rule: cp_comm_overlap off with cp 2 and cp_impl te: it says whether PyTorch's "
     "context-parallel ring waits for its transfers where it issues them, so it acts only with cp > 1 and cp_impl "
     "torch-allgather or torch-alltoall; set those or drop --no-cp-comm-overlap"),
    (("--norm-kernel", "bogus"), "error: --norm-kernel bogus is not a norm kernel: it must be one of "
                                 "fused-one-pass, two-pass; give --norm-kernel with one of them"),
])
def test_a_switch_that_does_nothing_is_one_line(cli, flags, text):
    line = one_line(cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "4", "--tp", "8",
                        *flags))
    assert line == text


def test_tp_overlap_sms_without_the_overlap_is_refused(cli, tmp_path):
    """dense_train: tp 8, sp, no tp_comm_overlap: userbuffer SMs would change nothing."""
    for field in ("tp_overlap_sms", "tp_overlap_margin_sms"):
        line = one_line(cli("export", edited(tmp_path, "dense_train", **{field: [0, 16, 16, 16]}), "--to", "megatron",
                            "-o", tmp_path / "out"))
        assert ("the plan no longer passes its rules: tp_overlap_sms / tp_overlap_margin_sms with tp_comm_overlap "
                "off, tp 8, sp on, tp_impl megatron: they set the SMs Transformer Engine's userbuffers take from the "
                "overlapped TP GEMMs, so they act only with tp_comm_overlap, tp > 1, sp and tp_impl megatron; set "
                "those (--tp-comm-overlap) or remove them from the plan file.") in line, line


@pytest.mark.parametrize("case,target", [
    ("dense_train", "megatron"), ("dense_train", "megatron-bridge"), ("dense_train", "torchrun"),
    ("fsdp_train", "torchtitan"), ("fsdp_train", "torchtitan-0.2"),
])
def test_parallel_block_is_refused_by_the_serial_launchers(cli, tmp_path, case, target):
    """Megatron-LM at d98e8a6 has no flag for the parallel block (tests/data/launchers/megatron-lm.json);
    Megatron-Core's and torchtitan's layers run attention then the MLP."""
    line = one_line(cli("export", edited(tmp_path, case, model={"parallel_block": True}), "--to", target,
                        "-o", tmp_path / "out"))
    assert "cannot express this plan: the parallel transformer block" in line
    assert line.endswith("set parallel_block false in the model spec, or export to deepspeed (its model code is "
                         "yours)")


def test_parallel_block_on_a_moe_spec_file_is_one_line(cli, tmp_path):
    doc = json.loads((PLANS / "moe_train.json").read_text())["model"]
    spec = tmp_path / "moe.json"
    spec.write_text(json.dumps({**doc, "parallel_block": True}))
    line = one_line(cli("estimate", "--model", spec, "--hardware", "dgx-h100", "--nodes", "2"))
    assert f"parallel_block is set on a MoE or hybrid model (num_experts {doc['num_experts']})" in line
    assert line.endswith("set parallel_block false or leave it out")


@pytest.mark.parametrize("case,changes,target,needle", [
    ("dense_train", {"pp_unbatched_sends": True, "vpp": 1, "pp_layers": None}, "megatron",
     "1F1B pipeline transfers one at a time"),
    ("dense_train", {"pp_unbatched_sends": True, "vpp": 1, "pp_layers": None}, "megatron-bridge",
     "1F1B pipeline transfers one at a time"),
    ("dense_train", {"norm_kernel": "two-pass"}, "torchrun", "a norm backward in two passes"),
    ("dense_train", {"softmax_kernel": "eager-fp32", "flash_attention": False}, "megatron",
     "an attention softmax as fp32 PyTorch ops"),
    ("dense_train", {"softmax_kernel": "eager-fp32", "flash_attention": False}, "megatron-bridge",
     "an attention softmax as fp32 PyTorch ops"),
    ("dense_train", {"softmax_kernel": "eager-fp32", "flash_attention": False}, "torchrun",
     "an attention softmax as fp32 PyTorch ops"),
    ("dense_train", {"softmax_kernel": "eager", "flash_attention": False}, "megatron",
     "an eager attention softmax (softmax_kernel eager"),
    ("dense_train", {"softmax_kernel": "eager", "flash_attention": False}, "torchrun",
     "an eager attention softmax (softmax_kernel eager"),
    # cp_comm_overlap and cp_kv_repeated act on PyTorch's ring only, which Megatron-Core never runs
    ("dense_train", {"cp": 2, "dp": 1, "cp_impl": "torch-allgather", "cp_comm_overlap": False}, "megatron",
     "PyTorch's context-parallel ring (cp_impl torch-allgather, cp 2; "),
    ("dense_train", {"cp": 2, "dp": 1, "cp_impl": "torch-alltoall"}, "megatron-bridge",
     "PyTorch's context-parallel ring (cp_impl torch-alltoall, cp 2; "),
])
def test_the_export_refusals_are_one_line(cli, tmp_path, case, changes, target, needle):
    line = one_line(cli("export", edited(tmp_path, case, **changes), "--to", target, "-o", tmp_path / "out"))
    assert "cannot express this plan: " + needle in line, line


@pytest.mark.parametrize("target", ["torchtitan", "torchtitan-0.2"])
@pytest.mark.parametrize("overlap,fused,says", [
    (True, True, "re-plan with --no-cp-comm-overlap to price it"),
    (False, False, "re-plan with --cp-comm-overlap"),
    (False, True, None),
])
def test_torchtitan_says_where_the_cp_transfers_run_otherwise(cli, tmp_path, target, overlap, fused, says):
    """torchtitan compiles the blocks where the plan prices fused kernels (compiled_components): compiled, the
    CP transfers wait where issued (docs/formulas.md#step.cp_compiled), eager they overlap; a plan priced the
    other way is written with a header note naming the flag that prices it."""
    saved = tmp_path / "cp.json"
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "2", "--tp", "2", "--cp", "2",
            "--dp", "4", "--zero", "3", "--tp-impl", "dtensor", "--cp-impl", "torch-allgather",
            "--cp-comm-overlap" if overlap else "--no-cp-comm-overlap", "--save", saved)
    assert r.code == 0, r.err
    doc = json.loads(saved.read_text())
    doc["plan"]["fused_kernels"] = fused
    saved.write_text(json.dumps(doc))
    r = cli("export", saved, "--to", target, "-o", tmp_path / "out")
    assert r.code == 0, r.err
    header = "".join(unwrapped(p.read_text()) for p in (tmp_path / "out").iterdir())
    notes = [x for x in header.splitlines() if x.startswith("# note:") and "cp_comm_overlap" in x]
    assert (notes == []) if says is None else (len(notes) == 1 and notes[0].endswith(says)), notes


@pytest.mark.parametrize("sms,margin,noted", [
    ([1, 16, 8, 16], [0, 16, 16, 16], True),  # a config's SMs: the script runs TE's defaults instead
    (None, [0, 4, 0, 0], True),  # a config's margins
    ([1, 16, 16, 16], [0, 16, 16, 16], False),  # TE 2.x's initialize_ub defaults: what the script runs
])
def test_megatron_notes_userbuffer_sms_it_does_not_pass(cli, tmp_path, sms, margin, noted):
    """The Megatron-LM script writes no --tp-comm-overlap-cfg: a plan priced at other userbuffer SMs or margins
    is written with a note that says so and how to price what runs (the plan-file-only switches' export)."""
    saved = tmp_path / "ub.json"
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "2", "--tp", "8", "--pp", "2",
            "--global-batch", "64", "--tp-comm-overlap", "--save", saved)
    assert r.code == 0, r.err
    doc = json.loads(saved.read_text())
    doc["plan"].update(tp_overlap_sms=sms, tp_overlap_margin_sms=margin)
    saved.write_text(json.dumps(doc))
    r = cli("export", saved, "--to", "megatron", "-o", tmp_path / "out")
    assert r.code == 0, r.err
    notes = [x for x in unwrapped((tmp_path / "out" / "megatron_pretrain.sh").read_text()).splitlines()
             if x.startswith("# note: priced with the plan's own userbuffer SMs")]
    assert len(notes) == int(noted), notes


def test_a_switch_on_by_default_asks_for_something_when_turned_off(cli):
    """cp_comm_overlap is on by default: --cp-comm-overlap asks for nothing (it had been refused as
    'cp_comm_overlap off' on a plan without CP), and a search with --no-cp-comm-overlap that no plan can use is
    refused (it had run silently)."""
    base = ("--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1")
    assert cli("estimate", *base, "--tp", "8", "--cp-comm-overlap").code == 0
    line = one_line(cli("search", *base, "--cp", "1", "--no-cp-comm-overlap"))
    assert line.startswith("error: --no-cp-comm-overlap: none of the ") \
        and "plans left by the rules can use it: cp_comm_overlap off with cp 1 " \
        "and cp_impl te:" in line and line.endswith("drop --no-cp-comm-overlap (or unpin the axis it needs)"), line


@pytest.mark.parametrize("unbatched", [False, True])
def test_deepspeed_notes_a_pipeline_priced_with_paired_exchanges(cli, tmp_path, unbatched):
    """DeepSpeed's pipeline engine always sends one transfer at a time (TrainSchedule): a plan priced with
    Megatron's paired exchanges is written with a note naming --pp-unbatched-sends; one priced unbatched, without."""
    saved = tmp_path / "ds.json"
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "2", "--pp", "2", "--dp", "8",
            "--zero", "1", "--global-batch", "64", "--grad-accumulation", "add", "--grad-dtype", "bf16",
            "--no-overlap-param-gather",  # DeepSpeed gathers after the step (its export refuses the overlap here)
            *(["--pp-unbatched-sends"] if unbatched else []), "--save", saved)
    assert r.code == 0, r.err
    r = cli("export", saved, "--to", "deepspeed", "-o", tmp_path / "out")
    assert r.code == 0, r.err
    notes = [x for x in unwrapped((tmp_path / "out" / "deepspeed_launch.sh").read_text()).splitlines()
             if x.startswith("# note:") and "pp_unbatched_sends" in x]
    assert notes == ([] if unbatched else [
        "# note: priced with 1F1B's sends and receives paired into batched exchanges (pp_unbatched_sends false); "
        "DeepSpeed's pipeline engine runs them one at a time, so this runs slower than priced: re-plan with "
        "--pp-unbatched-sends to price it"])
