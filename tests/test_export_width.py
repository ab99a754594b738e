"""Exported files fit 80 columns (the brief's output rule) and their readers read them as before: shell
scripts (export.shell_lines) for the largest test plans, every line at most 80 columns and `bash -n` clean, and
the wrap itself checked by running bash on a script before and after it; every other exported file (TOML, YAML,
JSON, the rest) at most 80 columns, parsed by its own parser, TOML and YAML to the same values as before the fit
(export.toml_lines, checked on generated TOML too); and every script `llmplan export` writes, for each target
and wrap, `bash -n` clean."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.export import TARGETS, _render_all, render_all
from llmplan.export.common import CannotExpress
from llmplan.export.launch import WRAPPABLE
from llmplan.export.shell_lines import fit_shell
from llmplan.export.toml_lines import fit_toml
from llmplan.planfile import PlanFile, load_plan

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
              f"    {line}   # {note}\n")
    wrapped = fit_shell(script)
    with tempfile.TemporaryDirectory() as d:
        assert _run(wrapped, Path(d)) == _run(script, Path(d))
    assert all(len(row) <= 80 for row in wrapped.splitlines())


def test_a_long_trailing_comment_on_a_continued_line_moves_above_the_command(tmp_path):
    # The last line of a backslash-continued command keeps its trailing comment where it fits; a longer one went
    # past 80 columns (a comment line there would end the command), so it moves above the command's first line.
    flags = " ".join(f"--flag-{i} {i}" for i in range(12))
    note = "a note on the last flags, long enough that it cannot trail the last line within 80 columns"
    script = (f"#!/usr/bin/env bash\nif true; then\n    printf '[%s]\\n' first \\\n        {flags} --last x   # {note}\n"
              f"    printf '%s\\n' short \\\n        --end 1   # fits\nfi\n")
    wrapped = fit_shell(script)
    rows = wrapped.splitlines()
    assert all(len(row) <= 80 for row in rows), [row for row in rows if len(row) > 80]
    assert _run(wrapped, tmp_path) == _run(script, tmp_path)
    first = rows.index("    printf '[%s]\\n' first \\")
    assert " ".join(r.strip().lstrip("#").strip() for r in rows[2:first]) == note  # above, in the if's indent
    assert all(r.startswith("    #") for r in rows[2:first])
    assert "        --end 1   # fits" in rows  # a comment that fits stays where it was


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


@pytest.fixture(scope="module")
def pools_plan(tmp_path_factory) -> Path:
    """A pipeline over an H100 and an A100 pool, saved by `search --save`: tests/test_hetero.py's saved_plan."""
    from test_hetero import save_stage_split

    return save_stage_split(tmp_path_factory.mktemp("pools"))


def _edited(case: str, **plan) -> PlanFile:
    pf = load_plan(PLANS / f"{case}.json")
    return dataclasses.replace(pf, plan=pf.plan.model_copy(update=plan))


def _other_files(pools_plan: Path) -> dict[str, tuple[str, str]]:
    """{plan/name: (as exported, as rendered before the fit)} of every exported file that is not a shell script,
    for plans that between them write each kind: fsdp_train (torchtitan-0.2's TOML, ds_config.json), the same
    over 4 pipeline stages (the TOML's per-stage module lists) and with eager module loading (.deepspeed_env),
    dense_train with attention kept in bf16 under NVFP4 (te_precision.yaml), a pipeline over two pools
    (pool_ranks.csv), and the MoE and serving plans."""
    plans = {"fsdp_train": load_plan(PLANS / "fsdp_train.json"), "fsdp_pp4": _edited("fsdp_train", pp=4, dp=4),
             "fsdp_eager": _edited("fsdp_train", cuda_lazy_loading=False),
             "dense_bf16": _edited("dense_train", dtype="fp4", recipe="nvfp4", fp8_params=True,
                                   bf16_modules=("attention",)),
             "pools": load_plan(pools_plan), "deepseek_train": load_plan(PLANS / "deepseek_train.json"),
             "serve": load_plan(PLANS / "serve.json")}
    out: dict[str, tuple[str, str]] = {}
    for case, pf in plans.items():
        fitted, raw = render_all(pf, "all")[0], _render_all(pf, "all")[0]
        out.update({f"{case}/{n}": (t, raw[n]) for n, t in fitted.items() if not n.endswith((".sh", ".sbatch"))})
    return out


def test_every_other_exported_file_fits_80_columns_and_parses_to_the_same_values(pools_plan):
    import tomllib

    files = _other_files(pools_plan)
    kinds = {Path(k).suffix or Path(k).name for k in files}
    assert {".toml", ".json", ".yaml", ".deepspeed_env", ".csv"} <= kinds, kinds
    assert {"fsdp_train/torchtitan-v0.2.2.toml", "fsdp_train/ds_config.json"} <= set(files)
    wide = [f"{k}:{n}: {len(line)}" for k, (t, _) in files.items() for n, line in enumerate(t.splitlines(), 1)
            if len(line) > 80]
    assert not wide, wide
    for k, (text, raw) in files.items():
        if k.endswith(".toml"):
            assert tomllib.loads(text) == tomllib.loads(raw), k
        elif k.endswith((".yaml", ".yml")):
            assert yaml.safe_load(text) == yaml.safe_load(raw), k
        elif k.endswith(".json"):
            json.loads(text)
    assert "module_fqns_per_model_part = [" in files["fsdp_pp4/torchtitan-v0.2.2.toml"][0]  # broken over lines


SCALAR = st.one_of(st.integers(-10**6, 10**6).map(str), st.booleans().map(lambda b: str(b).lower()),
                   st.text("ab #'=[],{}.\\\"", max_size=16).map(json.dumps),  # a basic string, with escapes
                   st.text('ab #"=[],{}.', max_size=16).map(lambda t: f"'{t}'"))  # a literal string
VALUE = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=8).map(lambda xs: "[" + ", ".join(xs) + "]"),
                     max_leaves=40)
COMMENT = st.lists(st.text("abc'\"#=[", min_size=1, max_size=12), max_size=20).map(" ".join)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(settings_=st.lists(st.tuples(VALUE, COMMENT), min_size=1, max_size=6))
def test_fitted_toml_sets_the_same_values_in_80_columns(settings_):
    import tomllib

    text = "[section]\n" + "".join(f"key_{i} = {v}" + (f"  # {c}" if c else "") + "\n"
                                   for i, (v, c) in enumerate(settings_))
    fitted = fit_toml(text)
    assert tomllib.loads(fitted) == tomllib.loads(text)
    assert all(len(row) <= 80 for row in fitted.splitlines()), fitted
    if all(len(row) <= 80 for row in text.splitlines()):
        assert fitted == text


def test_toml_the_reader_cannot_follow_is_left_as_written():
    long = "x" * 90
    for text in (f'a = """{long}\n"""  # c\n', f'a = "{long}  # open\n', f"# {long}\n", f'a = "{long}"\n'):
        assert fit_toml(text) == text


EXPORT_PLANS = ("dense_train", "moe_train", "fsdp_train", "serve", "deepseek_train", "uneven_train", "layout_train")
LAUNCHES = [(t, None) for t in TARGETS] + [(t, w) for t in ("torchrun", "slurm") for w in WRAPPABLE]


@pytest.mark.parametrize("target,wrap", LAUNCHES, ids=[f"{t}-{w}" if w else t for t, w in LAUNCHES])
def test_every_script_the_cli_writes_passes_bash_n(cli, tmp_path, pools_plan, target, wrap):
    # --wrap picks a training launcher: a serving plan is refused it (tests/test_export.py)
    plans = [PLANS / f"{case}.json" for case in EXPORT_PLANS if not (wrap and case == "serve")] + [pools_plan]
    written = []
    for plan in plans:
        out = tmp_path / plan.parent.name / plan.stem
        r = cli("export", plan, "--to", target, *(["--wrap", wrap] if wrap else []), "-o", out)
        if r.code == 2 and "cannot express this plan" in r.err:
            continue
        assert r.code == 0, (plan.stem, r.err)
        scripts = [f for f in out.iterdir() if f.suffix in (".sh", ".sbatch") or f.read_text().startswith("#!")]
        # torchtitan-0.2 writes its TOML job config alone: no script of its own
        assert scripts or target == "torchtitan-0.2", (plan.stem, sorted(f.name for f in out.iterdir()))
        for f in scripts:
            r_bash = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True, check=False)
            assert r_bash.returncode == 0, (plan.stem, f.name, r_bash.stderr)
            assert max(len(line) for line in f.read_text().splitlines()) <= 80, (plan.stem, f.name)
        written.append(plan.stem)
    assert written, f"no plan exports to {target}"
    # the pools plan's launchers (torchrun_pools.sh, job.sbatch and what they run) are among those checked
    assert pools_plan.stem in written or target not in ("torchrun", "slurm") or wrap not in (None, "megatron")


def test_quotes_inside_a_quoted_command_substitution_stay_whole(tmp_path):
    # "$(cmd "a b")" is one word: bash reads the $( ) as a command of its own, so the inner quotes nest rather
    # than close the outer ones (export.pools writes "$(dirname "$0")/..."); a break between a and b would
    # put the continuation's indent inside the inner string.
    script = 'echo ' + "x" * 60 + ' "$(echo "a b c d e f g h i j k l m n o p")"\n'
    wrapped = fit_shell(script)
    assert wrapped != script and all(len(row) <= 80 for row in wrapped.splitlines())
    assert _run(wrapped, tmp_path) == _run(script, tmp_path)
