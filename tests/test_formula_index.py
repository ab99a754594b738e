"""Every `docs/formulas.md#id` that the code or the docs cite names a section of docs/formulas.md (issue 35).

A dangling citation (`docs/formulas.md#step.pipeline`, which no section had) sends a reader of a formula's
source line nowhere; this test fails on the first one that appears. The index itself: one section and one
row per id, no merge-conflict markers, and every test a row names exists.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CITATION = re.compile(r"formulas\.md#([A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*)")
SECTION = re.compile(r"^## ([A-Za-z0-9_.-]+)\s*$", re.MULTILINE)
# docs/formulas.md explains the citation form itself with the placeholder `#id`.
PLACEHOLDERS = {"id"}


def _cited() -> dict[str, list[str]]:
    files = [*sorted((ROOT / "llmplan").rglob("*.py")), *sorted((ROOT / "benchmarks").glob("*.py"))]
    files += [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
    cited: dict[str, list[str]] = {}
    for path in files:
        for match in CITATION.finditer(path.read_text(encoding="utf-8")):
            cited.setdefault(match.group(1), []).append(str(path.relative_to(ROOT)))
    return cited


def test_every_cited_formula_id_has_a_section() -> None:
    sections = set(SECTION.findall((ROOT / "docs" / "formulas.md").read_text(encoding="utf-8")))
    cited = _cited()
    assert len(cited) > 20, "the citation pattern no longer finds the code's source lines"
    dangling = {cid: paths for cid, paths in cited.items() if cid not in sections | PLACEHOLDERS}
    assert not dangling, f"cited ids with no '## id' section in docs/formulas.md: {dangling}"


def test_the_index_table_links_only_to_sections_that_exist() -> None:
    text = (ROOT / "docs" / "formulas.md").read_text(encoding="utf-8")
    sections = set(SECTION.findall(text))
    anchors = set(re.findall(r"\]\(#([A-Za-z0-9_.-]+)\)", text))
    assert anchors, "the index table has no links"
    assert anchors <= sections, f"links to missing sections: {sorted(anchors - sections)}"


INDEX_ROW = re.compile(r"^\| \[([^\]]+)\]\(#([^)]+)\) \|(.*)\| (.*) \|$", re.MULTILINE)


def test_each_id_has_one_section_and_one_index_row() -> None:
    # Hand-resolved merges left two sections under one heading, or a heading with no row, more than once.
    text = (ROOT / "docs" / "formulas.md").read_text(encoding="utf-8")
    sections = SECTION.findall(text)
    rows = INDEX_ROW.findall(text)
    twice = sorted({s for s in sections if sections.count(s) > 1})
    assert not twice, f"duplicate sections: {twice}"
    assert [r for r in rows if r[0] != r[1]] == [], "an index row's text differs from its link"
    ids = [r[0] for r in rows]
    assert len(ids) == len(set(ids)), f"duplicate index rows: {sorted({i for i in ids if ids.count(i) > 1})}"
    assert set(ids) == set(sections), f"sections without a row: {sorted(set(sections) - set(ids))}"


def test_no_merge_conflict_markers() -> None:
    text = (ROOT / "docs" / "formulas.md").read_text(encoding="utf-8")
    markers = re.findall(r"^(?:<{7}|={7}|>{7}|\|{7})(?: .*)?$", text, re.MULTILINE)
    assert not markers, f"merge conflict markers left in docs/formulas.md: {markers}"


def test_the_index_names_tests_that_exist() -> None:
    # `tests/test_x.py::test_a`, `::test_b` (the same file) and `tests/test_x.py::test_c_*` (a prefix).
    text = (ROOT / "docs" / "formulas.md").read_text(encoding="utf-8")
    missing = []
    for rid, _, _, tests in INDEX_ROW.findall(text):
        path = None
        for name in re.findall(r"`([^`]+)`", tests):
            file, _, func = name.partition("::")
            if file:
                if not file.startswith("tests/"):
                    continue
                path = ROOT / file
                if not path.exists():
                    missing.append(f"{rid}: {file}")
                    continue
            if func and path is not None and path.exists():
                pattern = r"^def " + re.escape(func).replace(r"\*", r"\w*") + r"\b"
                if not re.search(pattern, path.read_text(encoding="utf-8"), re.MULTILINE):
                    missing.append(f"{rid}: {path.relative_to(ROOT)}::{func}")
    assert not missing, f"index rows name tests that do not exist: {missing}"
