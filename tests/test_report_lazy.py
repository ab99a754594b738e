"""llmplan.report loads its submodules on first use (PEP 562 __getattr__, `_HOME` says where each name lives);
the static `__all__` (what linters and `from llmplan.report import *` read) and the TYPE_CHECKING imports list the
same names by hand. Every name listed must resolve, from the module `_HOME` names, and the two lists agree."""

from __future__ import annotations

import importlib

import llmplan.report as report


def test_every_exported_name_resolves_from_its_home_module():
    assert set(report.__all__) == set(report._HOME)
    for name in report.__all__:
        home = importlib.import_module(f"llmplan.report.{report._HOME[name]}")
        assert getattr(report, name) is getattr(home, name), name
