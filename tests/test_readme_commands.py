"""README.md's commands run as written and print what the README quotes from them (the new-user walkthrough
found the goodput example's "7.0 days" reproduced only with a flag the README did not give, and the quick
start's MFU, days and tie figures stale). The quotes are read from the README, the numbers from the run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
QUICK = ["search", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "8"]


def flat(text: str) -> str:
    return " ".join(text.split())


def bash_commands() -> list[tuple[list[str], str]]:
    """(argv after `llmplan`, the README text right after the block) for each llmplan command in a bash block."""
    found = []
    for m in re.finditer(r"```bash\n(.*?)```\n(.{0,400})", README, re.S):
        cmd = m.group(1).replace("\\\n", " ")
        for line in cmd.splitlines():
            part = line.split("&&")[-1].strip()
            if part.startswith("llmplan "):
                found.append((shlex.split(part)[1:], m.group(2)))
    return found


COMMANDS = bash_commands()


def test_the_readme_has_its_examples():
    assert len(COMMANDS) >= 4 and any("--tp-comm-overlap" in argv for argv, _ in COMMANDS)


@pytest.mark.parametrize("argv,after", COMMANDS, ids=[" ".join(a[:3]) for a, _ in COMMANDS])
def test_every_readme_command_runs_and_prints_what_follows_it(cli, argv, after):
    r = cli(*argv)
    assert r.code == 0, r.err[-600:]
    quote = re.match(r"\s*prints `([^`]*)`", after)
    if quote:  # "prints `...`" under a block quotes its output
        assert flat(quote.group(1)) in flat(r.out), (quote.group(1), r.out[:2000])


def test_goodput_without_the_overlap_is_the_number_the_readme_gives(cli):
    argv = next(a for a, _ in COMMANDS if "--tp-comm-overlap" in a)
    days = re.search(r"\((\d+\.\d) days without\s+`--tp-comm-overlap`", README).group(1)
    r = cli(*[a for a in argv if a != "--tp-comm-overlap"])
    assert r.code == 0 and f"1T tokens in {days} days" in r.out, r.out[:2000]


def test_quick_start_figures_are_what_the_quick_start_prints(cli):
    r = cli(*QUICK, "--explain")
    assert r.code == 0, r.err
    out = flat(r.out)
    mfu = re.search(r"the MFU column reads `([^`]*)`", README).group(1)
    days = re.search(r"time-to-train shows its range \(`([^`]*)`\)", README).group(1)
    tie = flat(re.search(r"`--explain` prints which rule decided \(`([^`]*)`\)", README, re.S).group(1))
    row1 = next(ln for ln in r.out.splitlines() if ln.lstrip().startswith("1"))
    assert mfu in row1, (mfu, row1)
    assert f"1T tokens in {days}" in out, (days, out[:3000])
    assert tie in out, (tie, out[-3000:])
