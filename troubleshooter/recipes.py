"""Render the recipe library (`troubleshooter/recipes_data/`) into a training script for a chosen set of options.

The template is a runnable Python file. Optional code sits between marker comments:

    # [option: clip]          kept when the condition holds (also: `not x`, `x=value`, `x!=value`)
    ...
    # [else]                  optional
    ...
    # [end]

Lines of a block that is off in the template as checked in are "dormant": written `#| code`, so
the file itself runs as one complete variant. Rendering drops the markers and the blocks whose
condition is false, wakes the dormant lines that are kept, and writes each option's value into
its config line (`GRAD_CLIP = 1.0`). That is the whole renderer: no template language.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib import resources

import yaml

from .errors import UserError

# Package data, so an installed wheel renders recipes from any folder.
RECIPES_DIR = resources.files("troubleshooter") / "recipes_data"

_MARKER = re.compile(r"^\s*# \[(?:option: (?P<cond>[^\]]+)|(?P<word>else|end))\]\s*$")
_DORMANT = re.compile(r"^(\s*)#\| ?")
_COND = re.compile(r"^(?P<neg>not\s+)?(?P<name>\w+)(?:\s*(?P<op>!=|=)\s*(?P<value>[\w.-]+))?$")


@lru_cache(maxsize=1)
def _metadata() -> dict:
    return yaml.safe_load((RECIPES_DIR / "options.yaml").read_text(encoding="utf-8"))


def _special(model: str | None = None, task: str | None = None) -> tuple[str, dict] | None:
    """(the selecting option, its template entry) when a task (inference) or a model (gan) has its own
    template (task_templates / model_templates in options.yaml); None for the main template."""
    meta = _metadata()
    if task in meta.get("task_templates", {}):
        return "task", meta["task_templates"][task]
    if model in meta.get("model_templates", {}):
        return "model", meta["model_templates"][model]
    return None


@lru_cache(maxsize=None)
def _template_text(model: str | None = None, task: str | None = None) -> str:
    """The template for these options: the main one, or a task's or a model's own."""
    special = _special(model, task)
    return (RECIPES_DIR / (special[1]["template"] if special else _metadata()["template"])).read_text(encoding="utf-8")


def recipe_options() -> list[dict]:
    """The options, their flags, choices, defaults and what each adds (for `--list` and the UI)."""
    keys = ("name", "flag", "type", "choices", "default", "optional", "min", "exclusive_min", "help", "adds")
    return [{k: opt[k] for k in keys if k in opt} for opt in _metadata()["options"]]


def default_options() -> dict:
    return {opt["name"]: opt["default"] for opt in _metadata()["options"]}


def as_written_options() -> dict:
    """The options the template file itself runs with, as checked in."""
    return dict(_metadata()["as_written"])


def _check_value(opt: dict, value):
    """Return (normalised value, problem or None) for one option."""
    name, kind = opt["flag"], opt["type"]
    if value is None:
        return (None, None) if opt.get("optional") else (opt["default"], None)
    if kind == "bool":
        if isinstance(value, bool):
            return value, None
        return value, f"{name}: expected true or false, got {value!r}"
    if kind == "choice":
        text = str(value).strip().lower()
        if text not in opt["choices"]:
            return value, f"{name}: {value!r} is not one of {', '.join(opt['choices'])}"
        return text, None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value, f"{name}: expected a number, got {value!r}"
    if kind == "int":
        if float(value) != int(value):
            return value, f"{name}: expected a whole number, got {value!r}"
        value = int(value)
    else:
        value = float(value)
    if "min" in opt and value < opt["min"]:
        return value, f"{name}: must be >= {opt['min']}, got {value}"
    if "exclusive_min" in opt and value <= opt["exclusive_min"]:
        return value, f"{name}: must be > {opt['exclusive_min']}, got {value} (leave it out to turn it off)"
    return value, None


def normalize_options(**options) -> dict:
    """Fill in defaults, validate every option and combination; UserError lists every problem."""
    meta = _metadata()
    known = {opt["name"]: opt for opt in meta["options"]}
    problems = []
    for key in options:
        if key.replace("-", "_") not in known:
            problems.append(f"unknown option {key!r}: choose from {', '.join(known)}")
    given = {k.replace("-", "_"): v for k, v in options.items()}
    result = {}
    for name, opt in known.items():
        value, problem = _check_value(opt, given.get(name))
        result[name] = value
        if problem:
            problems.append(problem)
    for rule in meta["constraints"]:  # combinations too, alongside bad values: every problem at once
        if all(result.get(k) == v for k, v in rule["when"].items()):
            problems.append(rule["message"])
    special = _special(result.get("model"), result.get("task"))
    if special:
        selector, spec = special
        for name, opt in known.items():
            if name not in spec["options"] and result[name] != opt["default"] and name in given:
                problems.append(f"{opt['flag']} is not available with --{selector} {result[selector]} (it takes "
                                f"{', '.join(known[n]['flag'] for n in spec['options'] if n != selector)})")
    if problems:
        raise UserError("cannot build this recipe:", problems)
    return result


def _context(options: dict) -> dict:
    """Option values plus the facts the template branches on."""
    ctx = dict(options)
    ctx["scaler"] = options["precision"] in ("fp16", "auto")  # a GradScaler exists in the script
    ctx["grad_norm"] = bool(options.get("clip")) or bool(options.get("nan_guard"))  # the norm is measured
    ctx["streak"] = ctx["scaler"] or bool(options.get("nan_guard"))  # dropped steps are counted and bounded
    return ctx


def _condition(text: str, ctx: dict, lineno: int) -> bool:
    m = _COND.match(text.strip())
    if not m or m.group("name") not in ctx:
        raise ValueError(f"template line {lineno}: bad option condition {text!r}")
    value = ctx[m.group("name")]
    if m.group("op"):
        result = str(value).lower() == m.group("value").lower()
        result = result if m.group("op") == "=" else not result
    else:
        result = value not in (None, False, 0, "none")
    return not result if m.group("neg") else result


def render_template(text: str, ctx: dict) -> str:
    """Keep the blocks whose condition holds, drop the markers, wake dormant `#|` lines."""
    out: list[str] = []
    stack: list[tuple[bool, bool]] = []  # (enclosing block active, this block's condition)
    active = True
    for lineno, line in enumerate(text.splitlines(), 1):
        m = _MARKER.match(line)
        if not m:
            if active:
                out.append(_DORMANT.sub(r"\1", line, count=1))
            continue
        word = m.group("word")
        if word is None:
            cond = _condition(m.group("cond"), ctx, lineno)
            stack.append((active, cond))
            active = active and cond
        elif not stack:
            raise ValueError(f"template line {lineno}: [{word}] without [option: ...]")
        elif word == "else":
            outer, cond = stack[-1]
            stack[-1] = (outer, not cond)
            active = outer and not cond
        else:
            active = stack.pop()[0]
    if stack:
        raise ValueError("template: [option: ...] block not closed with [end]")
    rendered = re.sub(r"\n{4,}", "\n\n\n", "\n".join(out).strip("\n") + "\n")
    return rendered


def _literal(value) -> str:
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _set_config(text: str, variable: str, value) -> str:
    """Write `value` into the line `VARIABLE = ...  # comment`, keeping the comment's column."""
    pattern = re.compile(rf"^({re.escape(variable)} = )(\S+ *)", re.MULTILINE)
    if value is None or not pattern.search(text):
        return text
    literal = _literal(value)
    return pattern.sub(lambda m: m.group(1) + literal.ljust(len(m.group(2)) - 1) + " ", text, count=1)


def recipe_command(options: dict) -> str:
    """The `recipe` command line that produces these options (shown in the generated docstring)."""
    parts = ["python -m troubleshooter recipe"]
    for opt in _metadata()["options"]:
        value = options.get(opt["name"])
        if value == opt["default"] or value is None:
            continue
        if opt["type"] == "bool":
            parts.append(opt["flag"] if value else "")
        else:
            parts.append(f"{opt['flag']} {value}")
    return " ".join(p for p in parts if p)


def render_recipe(**options) -> str:
    """The training script for these options (defaults for those left out); UserError on bad ones."""
    opts = normalize_options(**options)
    text = render_template(_template_text(opts["model"], opts["task"]), _context(opts))
    for opt in _metadata()["options"]:
        if "config" in opt:
            text = _set_config(text, opt["config"], opts[opt["name"]])
    return re.sub(r"^Regenerate: .*$", "Regenerate: " + recipe_command(opts), text, count=1, flags=re.MULTILINE)
