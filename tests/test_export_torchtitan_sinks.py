"""ParallelPlan.sink_fusion reaches the torchtitan export as a header note: torchtitan's gpt_oss attention runs
flex_attention with return_lse and then scales its output by sigmoid(lse - sinks) (pytorch/torchtitan
torchtitan/models/gpt_oss/model/model.py, Attention.forward), i.e. the sinks after the kernel, which a plan
priced with sink_fusion true (the default) does not price."""

from __future__ import annotations

import json
from pathlib import Path

from exported import unwrapped


def gpt_oss_plan(cli, tmp_path: Path, name: str, **fields: object) -> Path:
    (tmp_path / name).mkdir(parents=True, exist_ok=True)
    path = tmp_path / name / "plan.json"
    made = cli("estimate", "--model", "gpt-oss-120b", "--hardware", "dgx-h100", "--ep", "8", "--etp", "1",
               "--global-batch", "64", "--save", path)
    assert made.code == 0, made.err
    doc = json.loads(path.read_text())
    doc["plan"].update(fields)
    path.write_text(json.dumps(doc))
    return path


def test_torchtitan_notes_the_sinks_it_applies_after_the_kernel(cli, tmp_path):
    for fused in (True, False):
        out = tmp_path / f"tt-{fused}"
        r = cli("export", gpt_oss_plan(cli, tmp_path, f"p-{fused}", sink_fusion=fused), "--to", "torchtitan",
                "-o", out)
        assert r.code == 0, r.err
        header = [x for x in unwrapped((out / "torchtitan_train.sh").read_text()).splitlines() if x.startswith("#")]
        noted = [x for x in header if "sink_fusion" in x]
        assert len(noted) == (1 if fused else 0), header
        if fused:
            assert "set sink_fusion false in the plan" in noted[0]
