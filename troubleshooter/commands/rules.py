"""`python -m troubleshooter rules [ID]`: list the lint rules, or explain one."""
from __future__ import annotations

import argparse
import json


def register(subparsers) -> None:
    p = subparsers.add_parser("rules", help="list the lint rules, or explain one (what, why, example, fix)",
                              description="Without ID: the rule catalogue. With ID (e.g. AMP101): what the rule "
                                          "detects, why it matters, a flagged example and what to write instead.")
    p.add_argument("rule", nargs="?", metavar="ID", help="rule id, e.g. AMP101")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(func=run)


def _as_dict(r) -> dict:
    from ..lint.docs import rule_url

    out = {k: getattr(r, k) for k in ("id", "name", "severity", "summary", "why", "example_bad", "example_good", "fix")}
    return {**out, "fixable": r.fixable, "url": rule_url(r.id)}


def run(args: argparse.Namespace) -> int:
    from ..lint import all_rules, get_rule

    if args.rule:
        rule = get_rule(args.rule)
        if args.format == "json":
            print(json.dumps(_as_dict(rule), indent=2))
        else:
            print(f"{rule.explain()}\nThis rule's page: {_as_dict(rule)['url']}")
        return 0
    rules = all_rules()
    if args.format == "json":
        print(json.dumps([_as_dict(r) for r in rules], indent=2))
        return 0
    width = max(len(r.name) for r in rules)
    for r in rules:
        print(f"{r.id}  {r.name:<{width}}  {r.severity:<7}  {r.summary}")
    print("\nExplain one: python -m troubleshooter rules AMP101")
    return 0
