"""Shared test helpers: running the real CLI and reading the published validation records."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from llmplan.cli import main

VALIDATION = Path(__file__).resolve().parents[2] / "shared" / "validation" / "published_runs.yaml"


class CliResult:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def json(self) -> dict:
        return json.loads(self.out)


@pytest.fixture
def cli(capsys):
    """Run `llmplan ARGS...` in-process through the real entry point; returns exit code, stdout, stderr."""

    def run(*args: str) -> CliResult:
        code = 0
        try:
            main([str(a) for a in args])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


@pytest.fixture(scope="session")
def published_runs() -> dict[str, dict]:
    if not VALIDATION.exists():
        message = f"{VALIDATION} not present (shared/ is laid beside the checkout)"
        if os.environ.get("CI"):
            pytest.fail(message)  # in CI the golden tests must run, never skip silently
        pytest.skip(message)
    return {r["id"]: r for r in yaml.safe_load(VALIDATION.read_text())}
