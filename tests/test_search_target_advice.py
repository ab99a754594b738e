"""`search --target NAME` where the target refuses every switch setting the search tries (cli.target
refuse_every_setting): the one line names what refuses the setting nearest to exporting and a fix the search has
not tried already, and re-running the search with that fix finds plans the target writes.

The megatron-bridge case is the reported one: fp8 with --bf16-layers-start 1 tries 8 settings (fp32 / bf16
gradients x weights in bf16 / fp8 x delayed / current scaling). The line used to carry the first setting's reason
only, whose fix names another setting the search had tried and the target refused in turn: --fp8-params (weights in
bf16 against the preset's fp8), then --fp8-scaling current (bf16 layers under delayed scaling), which Megatron-Bridge
refuses as well (its current-scaling preset keeps 1 / 1 layers in bf16; this plan 1 / 0)."""

from __future__ import annotations

import re

import pytest

from llmplan.cli.target import SWITCH_FLAGS

LLAMA_8B = ["search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100"]
CASES = {  # name: (the search's flags, target, words the line must hold, the fix it must name)
    "bridge-fp8-layers": (["--nodes", "2", "--dtype", "fp8", "--bf16-layers-start", "1"], "megatron-bridge",
                          ["8 switch settings", "--grad-dtype fp32 --fp8-params --fp8-scaling current",
                           "1 / 0 layers kept in bf16", "keeps 1 / 1"],
                          "--bf16-layers-start 1 --bf16-layers-end 1"),
    "torchtitan-adam-bf16": (["--nodes", "1", "--optimizer-moment-dtype", "bf16"], "torchtitan",
                             ["2 switch settings", "--grad-dtype fp32", "moments bf16"],
                             "--optimizer-master-dtype fp32 --optimizer-moment-dtype fp32"),
    "deepspeed-cp": (["--nodes", "2", "--cp", "2"], "deepspeed",
                     ["2 switch settings", "--grad-dtype fp32", "context parallelism (cp 2)"], "--cp 1"),
    # no rule refuses a setting whole; Megatron-FSDP's ZeRO-3 (optim_grads_params) is priced without a pipeline only
    "bridge-zero3": (["--nodes", "1", "--zero", "3", "--pp", "2"], "megatron-bridge",
                     ["2 switch settings", "--grad-dtype fp32", "refused most often",
                      "ZeRO-3 (Megatron-FSDP optim_grads_params) under a pipeline (PP 2)"], "--zero 1"),
}


def fixed(args: list[str], fix: str) -> list[str]:
    """`args` with each flag of `fix` ("--flag value ...") set to its value: replaced where `args` pins it."""
    out = list(args)
    for flag, value in re.findall(r"(--[\w-]+) (\S+)", fix):
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_setting_refused_names_a_fix_that_exports(cli, name):
    """The line (one, exit 2) names the nearest setting's reason and its fix, the fix pins no switch the search
    tried (it would lead to another refused setting), and the search with the fix applied keeps plans for the
    target (exit 0) that `export --to` writes (cli.target's walk asks export.refusal for each)."""
    extra, target, words, fix = CASES[name]
    args = [*LLAMA_8B, *extra, "--target", target]
    line = cli(*args).refusal()
    assert line.startswith("error: none of the ") and f"exports to {target}" in line
    for w in words:
        assert w in line, (w, line)
    named = re.search(r"re-plan with (--.+?)(?:,| or |;| \(|$)", line)
    assert named is not None and named.group(1) == fix, line
    tried = {f(v).split()[0] for f in SWITCH_FLAGS.values() for v in (True, False)}
    assert not {f for f in re.findall(r"--[\w-]+", fix)} & tried
    r = cli(*fixed(args, fix), "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["target"] == target and doc["plans"]


def test_fix_of_the_first_setting_alone_is_refused(cli):
    """The reported line's fixes, applied: each search still exports nothing (the reason the old line gave was
    the first setting's, and its fix another setting tried)."""
    args = [*LLAMA_8B, *CASES["bridge-fp8-layers"][0], "--target", "megatron-bridge"]
    for fix in (["--fp8-params"], ["--fp8-params", "--fp8-scaling", "current"]):
        assert "1 / 0 layers kept in bf16" in cli(*args, *fix).refusal()
