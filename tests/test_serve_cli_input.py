"""`estimate --mode infer`: a bad serving deployment option is refused in one line naming the field, the value
and the allowed values, exit 2, no traceback (llmplan.cli.estimate.estimate_infer builds the ServePlan)."""

from __future__ import annotations

import pytest

BASE = ("estimate", "--mode", "infer", "--model", "llama-3.1-8b", "--hardware", "dgx-h100")


@pytest.mark.parametrize("flag,value,allowed", [
    ("--phase", "bogus", "both, prefill, decode"),
    ("--moe-dispatcher", "nope", "alltoall, deepep"),
    ("--expert-dtype", "fp9", "mxfp8, nvfp4"),
])
def test_a_bad_deployment_choice_exits_2_with_one_line(cli, flag, value, allowed):
    r = cli(*BASE, flag, value)
    lines = r.err.strip().splitlines()
    assert r.code == 2 and len(lines) == 1 and "Traceback" not in r.err, r.err
    field = flag.removeprefix("--").replace("-", "_")
    assert (f"'{field}'" in lines[0] or f"{flag} {value}:" in lines[0]) and value in lines[0] and allowed in lines[0]
    assert f"; give {flag} " in lines[0], lines[0]


def test_a_prefill_pool_defaults_to_one_batch_of_prompts(cli):
    """--phase prefill without --batch: ceil(max_num_batched_tokens / input_len) sequences, not 64."""
    r = cli(*BASE, "--phase", "prefill", "--input-len", "3000", "--max-num-batched-tokens", "8192", "--json")
    assert r.code == 0, r.err
    assert r.json()["workload"]["batch"] == 3
