"""Exported shell scripts fit 80 columns (the brief's output rule) and bash reads them as before
(export.shell_lines): every launcher's script for the largest test plans, every line at most 80 columns and
`bash -n` clean; and the wrap itself checked by running bash on a script before and after it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.export import render_all
from llmplan.export.common import CannotExpress
from llmplan.export.launch import WRAPPABLE
from llmplan.export.shell_lines import fit_shell
from llmplan.planfile import load_plan

PLANS = Path(__file__).parent / "data" / "plans"
# uneven_train: Llama-3.1-405B on 2048 nodes (four-digit node counts, the longest layouts); deepseek_train:
# DeepSeek-V3 with EP and MoE switches (the most flags); fsdp_train: the DeepSpeed and torchtitan scripts.
BIG = ("uneven_train", "deepseek_train", "fsdp_train")


def _scripts(case: str) -> dict[str, str]:
    pf = load_plan(PLANS / f"{case}.json")
    out: dict[str, str] = {}
    for target, wrap in [("all", None)] + [(t, w) for t in ("torchrun", "slurm") for w in WRAPPABLE]:
        try:
            files, _ = render_all(pf, target, wrap)
        except CannotExpress:
            continue
        out.update({f"{target}/{wrap}/{n}": t for n, t in files.items() if n.endswith((".sh", ".sbatch"))})
    return out


@pytest.mark.parametrize("case", BIG)
def test_every_line_of_every_launcher_script_fits_80_columns(case, tmp_path):
    scripts = _scripts(case)
    assert any("torchrun" in k for k in scripts) and any(k.endswith(".sbatch") for k in scripts)
    wide = [f"{k}:{n}: {len(line)}" for k, t in scripts.items() for n, line in enumerate(t.splitlines(), 1)
            if len(line) > 80]
    assert not wide, wide
    for k, text in scripts.items():
        f = tmp_path / "s.sh"
        f.write_text(text)
        r = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
        assert r.returncode == 0, (k, r.stderr)


def _run(script: str, tmp_path: Path) -> str:
    f = tmp_path / "run.sh"
    f.write_text(script)
    r = subprocess.run(["bash", str(f)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    return r.stdout


WORD = st.one_of(st.from_regex(r"--[a-z][a-z-]{0,24}", fullmatch=True), st.from_regex(r"[a-z0-9./:,=]{1,30}",
                 fullmatch=True), st.from_regex(r'"[a-z ]{0,12}"', fullmatch=True),
                 st.from_regex(r"'[a-z #]{0,12}'", fullmatch=True), st.just("${UNSET:-a b  c}"), st.just('"$X"'))


@settings(max_examples=25, deadline=None, derandomize=True)
@given(words=st.lists(WORD, min_size=1, max_size=30), note=st.text("abc ()'#", max_size=60))
def test_wrapped_script_gives_bash_the_same_words(words, note):
    # A command (printf over the words, one per line) and an array of the same words with a trailing note:
    # bash must print the same arguments before and after the wrap, and every line fits where its words do.
    import tempfile

    line = " ".join(words)
    script = (f"#!/usr/bin/env bash\nX='p  q'\nprintf '[%s]\\n' {line} \"$X\"\n"
              f"ARR=({line})   # {note}\nprintf '<%s>\\n' \"${{ARR[@]}}\"\n    printf '%s\\n' {line} \\\n"
              f"    {line}\n")
    wrapped = fit_shell(script)
    with tempfile.TemporaryDirectory() as d:
        assert _run(wrapped, Path(d)) == _run(script, Path(d))
    assert all(len(row) <= 80 for row in wrapped.splitlines())


def test_case_patterns_and_long_if_lines(tmp_path):
    # export.pools' torchrun_pools.sh: a `case` (its patterns close a ')' nothing opened) and a long `if` line
    long = " ".join(f"w{i}" for i in range(30))
    script = (f'#!/usr/bin/env bash\nP=b\ncase "${{P:?set P to a pool}}" in\n    a) echo {long} ;;\n'
              f'    b) echo {long} ;;   # the second pool\nesac\nif [ 1 -ge 0 ]; then echo "x" {long} >&2; fi\n')
    wrapped = fit_shell(script)
    assert wrapped != script and all(len(row) <= 80 for row in wrapped.splitlines())
    r0 = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    r1 = subprocess.run(["bash", "-c", wrapped], capture_output=True, text=True)
    assert (r1.returncode, r1.stdout, r1.stderr) == (r0.returncode, r0.stdout, r0.stderr)


def test_what_the_lexer_cannot_follow_is_left_as_written():
    long = " ".join(["word"] * 30)
    backquoted = f'echo "`echo "{long}"`"\n'  # its inner quotes nest, as $( )'s do: left to bash
    for script in (f"cat <<EOF\n{long}\nEOF\n", f'echo "{long}\n{long}"\n', f"echo $(echo {long}\n", backquoted,
                   f"echo `echo {long}`\n"):
        assert fit_shell(script) == script
    one = "echo " + "z" * 100 + "\n"  # one word longer than a line: nothing to break
    assert fit_shell(one) == one


def test_quotes_inside_a_quoted_command_substitution_stay_whole(tmp_path):
    # "$(cmd "a b")" is one word: bash reads the $( ) as a command of its own, so the inner quotes nest rather
    # than close the outer ones (export.pools writes "$(dirname "$0")/..."); a break between a and b would
    # put the continuation's indent inside the inner string.
    script = 'echo ' + "x" * 60 + ' "$(echo "a b c d e f g h i j k l m n o p")"\n'
    wrapped = fit_shell(script)
    assert wrapped != script and all(len(row) <= 80 for row in wrapped.splitlines())
    assert _run(wrapped, tmp_path) == _run(script, tmp_path)
