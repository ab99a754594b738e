"""torchtitan runs two kernels a plan may not have priced: a complex-arithmetic rotary for Llama 3 and
DeepSeek-V3 (0.3.0 models/common/rope.py ComplexRoPE; v0.2.2 apply_rotary_emb: view_as_complex), which Inductor
runs eager (torch/_inductor/lowering.py: "does not support code generation for complex operators"), and FSDP2's
copy of every all-gather into the parameters (torch.distributed.fsdp foreach_all_gather_copy_out). Both exports
say so in the header, naming the plan field that prices it (ParallelPlan.rope_complex, zero3_copy_out)."""

from __future__ import annotations

import json
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
    assert "set rope_complex true in the plan" in text and "set zero3_copy_out true in the plan" in text
    r = cli("export", _plan(tmp_path, fused_kernels=True, rope_complex=True, zero3_copy_out=True), "--to",
            target, "-o", tmp_path / "b")
    assert r.code == 0, r.err
    text = "".join(f.read_text() for f in (tmp_path / "b").iterdir())
    assert "rope_complex" not in text and "zero3_copy_out" not in text
