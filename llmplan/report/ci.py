"""`llmplan check`: text, JSON, GitHub annotations and JUnit."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from llmplan.plancheck import Finding
from llmplan.report.common import ReportTable, SCHEMA



def check_json(findings: list[Finding], diff: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {"schema": SCHEMA, "passed": sum(f.ok for f in findings), "failed": sum(not f.ok for f in findings),
            "checks": [{"name": f.name, "file": f.file, "line": f.line, "field": f.field, "ok": f.ok,
                        "message": f.message, **({"details": f.details} if f.details else {})} for f in findings],
            **({"diff": diff} if diff is not None else {})}


def check_github(findings: list[Finding]) -> str:
    """GitHub Actions workflow commands: one ::error per failed check, pointing at the spec field."""
    def esc(s: str) -> str:
        return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")

    lines = []
    for f in findings:
        if f.ok:
            continue
        loc = f"file={f.file}" + (f",line={f.line}" if f.line else "")
        lines.append(f"::error {loc},title=llmplan check: {esc(f.name)}::{esc(f.message)}")
    lines.append(f"llmplan check: {sum(f.ok for f in findings)} passed, {sum(not f.ok for f in findings)} failed")
    return "\n".join(lines)


def check_junit(findings: list[Finding]) -> str:
    import xml.etree.ElementTree as ET

    suite = ET.Element("testsuite", name="llmplan check", tests=str(len(findings)),
                       failures=str(sum(not f.ok for f in findings)), errors="0")
    for f in findings:
        case = ET.SubElement(suite, "testcase", {"line": str(f.line)} if f.line else {}, classname="llmplan.check",
                             name=f.name, file=f.file)
        if not f.ok:
            fail = ET.SubElement(case, "failure", message=f.message)
            fail.text = f.message + (f"\nfield: {f.field}" if f.field else "")
    suites = ET.Element("testsuites")
    suites.append(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode")


def check_view(console: Console, findings: list[Finding], diff: list[dict[str, Any]] | None) -> None:
    t = ReportTable(title="llmplan check")
    for col in ("check", "result", "where", "message"):
        t.add_column(col)
    for f in findings:
        where = f.file + (f":{f.line}" if f.line else "")
        t.add_row(f.name, "[green]pass[/]" if f.ok else "[bold red]FAIL[/]", where, f.message)
    console.print(t)
    for d in diff or []:
        if d["status"] == "added":
            console.print(f"{d['file']}: new since the base revision")
            continue
        if d["status"] == "skipped":
            console.print(f"{d['file']}: {d['message']}")
            continue
        a, b = d["params"]
        console.print(f"[bold]{d['file']}[/] changed: " + "; ".join(f"{k} {v[0]!r} -> {v[1]!r}"
                                                                   for k, v in d["fields"].items())
                      + f"; parameters {a / 1e9:.2f}B -> {b / 1e9:.2f}B")
        for row in d["plans"]:
            def fmt(x: dict) -> str:
                return "invalid" if not x.get("valid") else f"{x['memory_gib']:.1f} GiB, step {x['step_s']:.3f} s"
            console.print(f"  {row['plan']}: {fmt(row['base'])} -> {fmt(row['now'])}")
    console.print(f"{sum(f.ok for f in findings)} passed, {sum(not f.ok for f in findings)} failed")
