"""Every `docs/formulas.md#id` that the code or the docs cite names a section of docs/formulas.md (issue 35).

A dangling citation (`docs/formulas.md#step.pipeline`, which no section had) sends a reader of a formula's
source line nowhere; this test fails on the first one that appears.
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
