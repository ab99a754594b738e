"""torchtitan runs two kernels a plan may not have priced: a complex-arithmetic rotary for Llama 3 and
DeepSeek-V3 (0.3.0 models/common/rope.py ComplexRoPE; v0.2.2 apply_rotary_emb: view_as_complex), which Inductor
runs eager (torch/_inductor/lowering.py: "does not support code generation for complex operators"), and FSDP2's
copy of every all-gather into the parameters (torch.distributed.fsdp foreach_all_gather_copy_out). Both exports
say so in the header, naming the plan field (ParallelPlan.rope_complex, zero3_copy_out) and the estimate / search
flag that prices it (--rope-complex / --rope-real, --zero3-copy-out): following the note clears it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

PLANS = Path(__file__).parent / "data" / "plans"


def _plan(tmp_path: Path, **plan) -> Path:
    doc = json.loads((PLANS / "fsdp_train.json").read_text())  # llama-3.1-8b, ZeRO-3, dp 16
    doc["plan"].update(plan)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("target", ["torchtitan", "torchtitan-0.2"])
def test_torchtitan_exports_note_the_complex_rotary_and_fsdp2_copy_out(cli, tmp_path, target):
    r = cli("export", _plan(tmp_path, fused_kernels=True, rope_complex=False, zero3_copy_out=False), "--to",
            target, "-o", tmp_path / "a")
    assert r.code == 0, r.err
    text = "".join(f.read_text() for f in (tmp_path / "a").iterdir())
    assert "(rope_complex false)" in text and "re-plan with --rope-complex to price it" in text
    assert "(zero3_copy_out false)" in text and "re-plan with --zero3-copy-out to price it" in text
    r = cli("export", _plan(tmp_path, fused_kernels=True, rope_complex=True, zero3_copy_out=True), "--to",
            target, "-o", tmp_path / "b")
    assert r.code == 0, r.err
    text = "".join(f.read_text() for f in (tmp_path / "b").iterdir())
    assert "rope_complex" not in text and "zero3_copy_out" not in text


def test_cli_flags_price_torchtitans_kernels_and_the_export_then_notes_nothing(cli, tmp_path):
    # --rope-complex / --zero3-copy-out set the plan fields the torchtitan exports ask for
    common = ("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--dp", "8", "--zero", "3")
    plain = json.loads(cli(*common, "--json").out)
    r = cli(*common, "--rope-complex", "--zero3-copy-out", "--json", "--save", tmp_path / "tt.json")
    assert r.code == 0, r.err
    titan = json.loads(r.out)
    assert titan["plan"]["rope_complex"] and titan["plan"]["zero3_copy_out"]
    assert titan["time"]["compute_s"] > plain["time"]["compute_s"]  # the eager complex rotary
    assert titan["time"]["overhead_s"] > plain["time"]["overhead_s"]  # the copy-out on the compute stream
    r = cli("export", tmp_path / "tt.json", "--to", "torchtitan", "-o", tmp_path / "out")
    assert r.code == 0, r.err
    text = next((tmp_path / "out").glob("*.sh")).read_text()
    assert "rope_complex" not in text and "zero3_copy_out" not in text


FIX = re.compile(r"re-plan with (--[a-z0-9-]+(?: [a-z0-9-]+)?) to price it")


@pytest.mark.parametrize(("model", "layout", "switch", "flags"), [
    ("llama-3.1-8b", ("--dp", "8"), (), {"--rope-complex", "--zero3-copy-out", "--grad-accumulation add"}),
    ("qwen3-30b-a3b", ("--nodes", "2", "--dp", "16", "--ep", "8"), ("--rope-complex",),
     {"--rope-real", "--zero3-copy-out", "--grad-accumulation add"})])
def test_each_torchtitan_note_names_a_flag_that_clears_it(cli, tmp_path, model, layout, switch, flags):
    # the notes name the flag a user passes (llama3's rotary is complex, qwen3's real): re-planning with the
    # flags the notes name and exporting again leaves no note asking for a re-plan
    common = ("estimate", "--model", model, "--hardware", "dgx-h100", *layout, "--zero", "3", "--json")
    r = cli(*common, *switch, "--save", tmp_path / "a.json")
    assert r.code == 0, r.err
    r = cli("export", tmp_path / "a.json", "--to", "torchtitan", "-o", tmp_path / "a")
    assert r.code == 0, r.err
    named = set(FIX.findall(next((tmp_path / "a").glob("*.sh")).read_text()))
    assert named == flags, named
    r = cli(*common, *(word for flag in sorted(named) for word in flag.split()), "--save", tmp_path / "b.json")
    assert r.code == 0, r.err
    r = cli("export", tmp_path / "b.json", "--to", "torchtitan", "-o", tmp_path / "b")
    assert r.code == 0, r.err
    assert "re-plan with" not in next((tmp_path / "b").glob("*.sh")).read_text()


def test_copy_out_without_zero3_is_refused_in_one_line(cli):
    line = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--dp", "8", "--zero", "1",
               "--zero3-copy-out").refusal()
    assert "zero3_copy_out with zero 1" in line and "drop --zero3-copy-out" in line, line


def test_copy_out_with_the_per_tensor_unit_is_refused_in_one_line(cli):
    line = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--dp", "8", "--zero", "3",
               "--zero3-unit", "tensor", "--zero3-copy-out").refusal()
    assert "zero3_copy_out with zero3_unit tensor" in line, line
    assert "use --zero3-unit layer or drop --zero3-copy-out" in line, line
