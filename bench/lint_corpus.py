"""Recall per rule and false findings per severity on the real-code corpus (tests/lint_corpus/).

Each corpus file is a short excerpt of a public training script (its header names the repository
and path); tests/lint_corpus/labels.json lists the pitfalls a reader finds in it (rule + line, and
the code cell for notebooks). A finding that matches no label is a false finding.

    python bench/lint_corpus.py [--json out.json] [--show] [--corpus tests/lint_corpus_frameworks]

tests/lint_corpus_frameworks/ is the framework-managed set (Accelerate, Lightning/Fabric, HF Trainer,
DeepSpeed, FSDP; issue 23): real files from fix commits and clean real files, plus scripts written the
way each framework's docs write them (`origin` in its labels.json); its table adds a line per origin.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CORPUS = ROOT / "tests" / "lint_corpus"
_NAMED_REPO = re.compile(r"\b[\w.-]+/[\w.-]+ [\w./-]+\.py")  # "owner/repo path/file.py"


def _key(rule: str, line: int, cell: int | None) -> tuple:
    return (rule, cell, line)


def evaluate(corpus: Path = CORPUS) -> dict:
    """Lint every corpus file; return labels found/missed and findings that match no label."""
    from troubleshooter.lint import lint_paths

    labels = json.loads((corpus / "labels.json").read_text())
    found, missed, false, unread = [], [], [], []
    for name, entry in sorted(labels.items()):
        report = lint_paths([str(corpus / name)])
        if report.errors:
            unread.append((name, [e.message for e in report.errors]))
        want = {_key(e["rule"], e["line"], e.get("cell")): e for e in entry["expect"]}
        got = {}
        for f in report.findings:
            got.setdefault(_key(f.rule, f.location.line, f.location.cell), f)
        for k in want:
            (found if k in got else missed).append((name, *k))
        for k, f in got.items():
            if k not in want:
                false.append((name, f.rule, f.severity.value, f.location.cell, f.location.line, f.message))
    return {"labels": labels, "found": found, "missed": missed, "false": false, "unread": unread}


def table(result: dict) -> str:
    labelled = Counter(r for e in result["labels"].values() for r in (x["rule"] for x in e["expect"]))
    hit = Counter(f[1] for f in result["found"])
    out = ["| rule | labelled | found | recall |", "| --- | ---: | ---: | ---: |"]
    for rule in sorted(labelled):
        out.append(f"| {rule} | {labelled[rule]} | {hit[rule]} | {hit[rule] / labelled[rule]:.0%} |")
    total, got = sum(labelled.values()), sum(hit.values())
    out.append(f"| all | {total} | {got} | {got / total:.0%} |")
    sev = Counter(f[2] for f in result["false"])
    patterns = {n for n, e in result["labels"].items() if not _NAMED_REPO.search(e["source"])}
    own = [f for f in result["found"] if f[0] not in patterns]
    own_total = sum(len(e["expect"]) for n, e in result["labels"].items() if n not in patterns)
    out.append("")
    out.append(f"excerpts of named public repositories ({len(result['labels']) - len(patterns)} files): "
               f"{len(own)}/{own_total} found; files written for this corpus in real-code shapes "
               f"(issue 10 patterns, notebooks; {len(patterns)} files): {len(result['found']) - len(own)}/{total - own_total}")
    out.append(f"files: {len(result['labels'])}, unreadable: {len(result['unread'])}; false findings: "
               f"error {sev['error']}, warning {sev['warning']}, info {sev['info']}")
    out.append(generalisation_line(result))
    out += origin_lines(result)
    return "\n".join(out)


def origin_lines(result: dict) -> list[str]:
    """Recall and false findings per `origin` label (the framework set: "real" / "docs-style"), and how
    many clean files got a warning or an error."""
    origins = sorted({e["origin"] for e in result["labels"].values() if e.get("origin")})
    out = []
    for o in origins:
        names = {n for n, e in result["labels"].items() if e.get("origin") == o}
        total = sum(len(result["labels"][n]["expect"]) for n in names)
        got = sum(1 for f in result["found"] if f[0] in names)
        sev = Counter(f[2] for f in result["false"] if f[0] in names)
        clean = [n for n in names if not result["labels"][n]["expect"]]
        warned = {f[0] for f in result["false"] if f[0] in clean and f[2] in ("error", "warning")}
        out.append(f"{o} ({len(names)} files, {len(clean)} clean): {got}/{total} found; false findings: error "
                   f"{sev['error']}, warning {sev['warning']}, info {sev['info']}; clean files warned: {len(warned)}")
    return out


def generalisation_line(result: dict) -> str:
    """The files added after the linter was tuned (labels carry "new"): recall and false findings on them alone."""
    new = {n for n, e in result["labels"].items() if e.get("new")}
    if not new:
        return "generalisation set: none"
    total = sum(len(result["labels"][n]["expect"]) for n in new)
    got = sum(1 for f in result["found"] if f[0] in new)
    sev = Counter(f[2] for f in result["false"] if f[0] in new)
    unread = sum(1 for u in result["unread"] if u[0] in new)
    return (f"generalisation set ({len(new)} files added after tuning, labelled before running): {got}/{total} found; "
            f"unreadable {unread}; false findings: error {sev['error']}, warning {sev['warning']}, info {sev['info']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the raw result here")
    ap.add_argument("--show", action="store_true", help="list misses and false findings")
    ap.add_argument("--corpus", default=str(CORPUS), help="a corpus folder with labels.json (default: tests/lint_corpus)")
    args = ap.parse_args()
    result = evaluate(Path(args.corpus))
    print(table(result))
    if args.show:
        for m in result["missed"]:
            print("MISSED", m)
        for f in result["false"]:
            print("FALSE ", f)
        for u in result["unread"]:
            print("UNREAD", u)
    if args.json:
        Path(args.json).write_text(json.dumps({k: v for k, v in result.items() if k != "labels"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
