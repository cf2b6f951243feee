"""Render a LintReport as JUnit XML, the test report CI systems (GitLab, Jenkins, Azure) display.

As ruff does: one <testsuite> per file, one <testcase> per finding (classname = the file,
name = rule and place), a <failure> for each error or warning. Info findings do not fail the lint
(exit status 0), so they are passing test cases with the note in <system-out>. An input that could
not be linted is a test case with an <error>. With nothing to report, one passing test case says so.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from itertools import groupby

from .docs import rule_url
from .engine import LintReport

TOOL = "amp-troubleshooter"
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")  # characters XML 1.0 cannot hold


def _xml(text: str) -> str:
    return _NOT_XML.sub("\ufffd", text)


def _suite(parent: ET.Element, name: str, cases: list[tuple[dict, str | None, dict | None]]) -> tuple[int, int]:
    """cases: (testcase attributes, text for <system-out>, failure/error element spec)."""
    failures = sum(1 for *_, bad in cases if bad and bad["tag"] == "failure")
    errors = sum(1 for *_, bad in cases if bad and bad["tag"] == "error")
    suite = ET.SubElement(parent, "testsuite", name=_xml(name), tests=str(len(cases)), failures=str(failures),
                          errors=str(errors), skipped="0")
    for attrs, out, bad in cases:
        case = ET.SubElement(suite, "testcase", {k: _xml(v) for k, v in attrs.items()})
        if bad:
            el = ET.SubElement(case, bad["tag"], message=_xml(bad["message"]), type=bad["type"])
            el.text = _xml(bad["text"])
        if out:
            ET.SubElement(case, "system-out").text = _xml(out)
    return failures, errors


def to_junit(report: LintReport) -> ET.Element:
    root = ET.Element("testsuites", name=TOOL)
    total = failures = errors = 0
    items = [(f.location.path or "-", "f", f) for f in report.findings] + [(e.path or "-", "e", e) for e in report.errors]
    items.sort(key=lambda t: t[0])
    for path, group in groupby(items, key=lambda t: t[0]):
        cases = []
        for _, kind, item in group:
            if kind == "e":
                where = f" (cell {item.cell})" if item.cell is not None else ""
                cases.append(({"name": "input could not be linted", "classname": path, "file": path},
                              None, {"tag": "error", "type": "input-error", "message": item.message,
                                     "text": f"{path}{where}: {item.message}"}))
                continue
            loc = item.location
            place = (f"cell {loc.cell} line {loc.line}" if loc.cell is not None else f"line {loc.line}") + \
                f" column {loc.column}"
            text = (f"{path}:{f'cell {loc.cell}:' if loc.cell is not None else ''}{loc.line}:{loc.column}: "
                    f"{item.message}\nfix: {item.suggestion}\ndocs: {rule_url(item.rule)}")
            attrs = {"name": f"{item.rule} {item.name} ({place})", "classname": path, "file": path}
            if loc.cell is None and loc.line:
                attrs["line"] = str(loc.line)
            if item.severity.value == "info":
                cases.append((attrs, f"info: {text}", None))
            else:
                cases.append((attrs, None, {"tag": "failure", "type": item.severity.value,
                                            "message": f"{item.rule} {item.message}", "text": text}))
        f, e = _suite(root, path, cases)
        total, failures, errors = total + len(cases), failures + f, errors + e
    if not items:
        _suite(root, TOOL, [({"name": "no mixed-precision problems found", "classname": TOOL}, None, None)])
        total = 1
    root.set("tests", str(total))
    root.set("failures", str(failures))
    root.set("errors", str(errors))
    return root


def format_junit(report: LintReport) -> str:
    tree = to_junit(report)
    ET.indent(tree)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(tree, encoding="unicode") + "\n"
