"""Questionnaire tab: answers -> FP16/BF16/FP32 with reasons and a generated training loop.

The questions come from `troubleshooter/data/questions.yaml` (via `questionnaire.questions()`),
so the page shows exactly what `ask` asks; this module maps them to controls and back.
"""
from __future__ import annotations

import re

from ..bounded import load_json
from ..errors import UserError
from . import common, recipe
from .server import SETTINGS

UNKNOWN = "don't know"


def _q():
    from .. import questionnaire

    return questionnaire


def _as_dict(q) -> dict:
    return q if isinstance(q, dict) else {k: getattr(q, k) for k in dir(q) if not k.startswith("_")}


def questions() -> list[dict]:
    return [_as_dict(q) for q in _q().questions()]


def control_kind(q: dict) -> str:
    """Which control shows this question: text, log, choice, list, number, int, bool, tristate."""
    kind = q.get("type")
    if kind == "text" and q.get("multiline"):
        return "log"
    if kind == "bool" and q.get("default") is None:
        return "tristate"  # yes / no / don't know: "not answered" must stay possible
    return kind


_CLI_HINTS = re.compile(r"\s*\((?:[^()]*comma-separated|[^()]*empty line|empty:)[^()]*\)")


def label(q: dict) -> str:
    """The question's prompt without hints meant for the terminal (how to type a list or end a log)."""
    return _CLI_HINTS.sub("", str(q.get("prompt") or q["key"])).strip()


def choice_labels(q: dict) -> list[tuple[str, str]]:
    helps = q.get("choice_help") or {}
    return [(f"{c}: {helps[c]}" if c in helps else str(c), c) for c in q.get("choices") or []]


def _convert(q: dict, value):
    kind = control_kind(q)
    if value is None or value == "" or value == []:
        return [] if kind == "list" else None
    if kind == "tristate":
        return None if value == UNKNOWN else value == "yes"
    if kind == "bool":
        return bool(value)
    if kind == "int":
        if float(value) != int(value):
            raise UserError(f"{q['key']}: expected a whole number, not {value}")
        return int(value)
    if kind == "number":
        return _number(value, q["key"])
    if kind in ("text", "log"):
        text = str(value).strip()
        if kind == "log":
            common.check_text_size(text, SETTINGS.max_file_bytes, "the pasted log")
        return text or None
    return value


def _number(value, what: str) -> float:
    """Optional numbers are typed into a textbox (a number control cannot be left empty)."""
    try:
        return float(str(value).strip())
    except ValueError:
        raise UserError(f"{what}: expected a number, not {value!r}") from None


def answers_from_controls(*values) -> dict:
    """Control values in `questions()` order -> the answers dict `decide` takes (unanswered left out)."""
    answers = {}
    for q, value in zip(questions(), values):
        converted = _convert(q, value)
        if converted is not None and converted != []:
            answers[q["key"]] = converted
        elif control_kind(q) == "list":
            answers[q["key"]] = []
    return answers


_LABEL = {"bf16": "BF16 (autocast, no loss scaling)", "fp16": "FP16 with GradScaler", "fp32": "stay in FP32"}


def decision_markdown(d: dict) -> str:
    """The recommendation as Markdown. Every text in it may repeat what the user typed (the GPU
    answer is quoted in the device line and the reasons), so each is escaped: a GPU answer of
    `[click](http://...)` or `<img ...>` shows as typed, never as a link or markup."""
    esc = common.md_escape
    precision = str(d.get("precision", "?"))
    lines = [f"## Recommendation: {esc(_LABEL.get(precision, precision.upper()))}"]
    if d.get("device"):
        lines.append(f"*for {esc(d['device'])}*")
    if d.get("gpu_detected"):
        lines.append(f"*The GPU question was left empty, so this is for the server's own device "
                     f"({esc(d['gpu_detected'])}). Type your GPU (e.g. A100) if you train elsewhere.*")
    lines += ["", "**Why:**"]
    by_answer = d.get("reasons_by_answer")
    if by_answer:
        lines += [f"- {esc(r['reason'])} *({esc(r['answer'])})*" for r in by_answer]
    else:
        lines += [f"- {esc(r)}" for r in d.get("reasons") or []]
    warnings = d.get("warnings") or []
    if warnings:
        lines += ["", "**Watch out:**"] + [f"- {esc(w)}" for w in warnings]
    if d.get("symptoms_from_log"):
        lines += ["", "Symptoms read from the pasted log: " + esc(", ".join(map(str, d["symptoms_from_log"])))]
    if d.get("fp8"):
        lines += ["", "**FP8 (optional, on top of bf16):**"] + [f"- {t}" for t in d["fp8"]["advice"]]
    settings = d.get("framework_settings")
    if settings:
        lines += ["", f"**{settings['framework']} settings** (`{settings['file']}`):", "",
                  f"```{settings['format']}", settings["text"].rstrip("\n"), "```"]
    return "\n".join(lines) + "\n"


def gpu_answer(cap: dict) -> str:
    """The GPU answer for a detected device: `questionnaire.gpu_answer_from_device` with its
    compute capability and memory (so a GPU missing from the name table is still judged on its
    own facts) where that function exists; the device name otherwise; "cpu" for a CPU."""
    kind = cap.get("kind") or cap.get("device")
    if kind == "cpu":
        return "cpu"
    name = str(cap.get("name") or "")
    from_device = getattr(_q(), "gpu_answer_from_device", None)
    cc = _capability_tuple(cap.get("compute_capability"))
    if from_device is not None and cc is not None:
        vendor = "nvidia" if str(kind).startswith("cuda") else str(kind)
        return from_device(name, cc, cap.get("memory_gb"), vendor=vendor)
    return name or "detect"


def _capability_tuple(value) -> tuple[int, int] | None:
    """"8.6" / [8, 6] / (8, 6) -> (8, 6)."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        parts = value
    elif isinstance(value, str) and value.count(".") == 1:
        parts = value.split(".")
    else:
        return None
    try:
        return int(parts[0]), int(parts[1])
    except (TypeError, ValueError):
        return None


def _fill_detected(answers: dict) -> tuple[dict, str | None]:
    """`gpu` empty or 'detect' -> this server's device, from the worker-run capability probe
    (deciding it in the server process would create a CUDA context there). Returns the answers
    and the filled-in answer (None when the user gave one), so the page can say so."""
    answers = dict(answers)
    if str(answers.get("gpu") or "detect").strip().lower() != "detect":
        return answers, None
    from .check import capability

    cap = capability("auto")
    answers["gpu"] = gpu_answer(cap)
    if answers["gpu"] == "cpu":
        native = (cap.get("bf16") or {}).get("native") if isinstance(cap.get("bf16"), dict) else None
        if answers.get("cpu_bf16") is None and native is not None:
            answers["cpu_bf16"] = bool(native)
    return answers, answers["gpu"]


def recommend(answers: dict) -> dict:
    """`decide(answers).to_dict()` (the `ask --format json` object); UserError on bad answers.
    An empty GPU answer means this server's device, and the result says so in `gpu_detected`."""
    filled, detected = _fill_detected(answers)
    d = _q().decide(filled).to_dict()
    if detected is not None:
        d["gpu_detected"] = detected
    return d


def _decision_options(d: dict) -> dict:
    return dict(d.get("recipe_options") or {})


def recommend_with_loop(answers: dict) -> tuple[dict, str, str]:
    """(decision JSON, the generated training loop, its train_amp.py download)."""
    d = recommend(answers)
    code, path = recipe.render(_decision_options(d))
    return d, code, path


def ui_recommend(*values) -> tuple:
    """The Recommend button: (recommendation, code, train_amp.py, *recipe-builder control values)."""
    d, code, path = recommend_with_loop(answers_from_controls(*values))
    heading, _, rest = decision_markdown(d).partition("\n")
    shown = f"{heading}\n*{common.stamp()}, for the answers on the left*\n{rest}"
    return (common.for_page(shown), code, path, *recipe.controls_from_options(_decision_options(d)))


def ui_detect() -> tuple[str, str]:
    """The "detect my GPU" button: (hardware answer with the device's own capability, the capability line)."""
    from .check import capability

    cap = capability("auto")
    answer = gpu_answer(cap)
    summary = cap.get("summary") or cap.get("name") or answer
    rec = cap.get("recommended_precision")
    return answer, (f"Detected on the server: **{common.md_escape(summary)}**"
                    + (f" — capability check suggests **{rec}**" if rec else ""))


def explain(text: str) -> dict:
    text = common.check_text_size(text, SETTINGS.max_file_bytes, "the pasted log")
    if not text.strip():
        raise UserError("paste an error message or a training log to explain")
    from ..explain import explain_log

    report = explain_log(text)
    return {"report": report.to_dict(), "markdown": report.to_markdown(), "symptoms": list(report.symptoms)}


def ui_explain(text: str, symptoms) -> tuple[str, list]:
    """The Explain button: (explanation, symptoms with the ones found added)."""
    r = explain(text)
    chosen = list(symptoms or [])
    chosen += [s for s in r["symptoms"] if s not in chosen]
    return r["markdown"], chosen


def parse_answers(answers) -> dict:
    if isinstance(answers, dict):
        return answers
    if answers is None or not str(answers).strip():
        raise UserError('answers must be a JSON object, e.g. {"gpu": "A100", "symptoms": ["nan_loss"]}')
    try:
        value = load_json(str(answers), "answers")
    except ValueError as exc:
        raise UserError(f'answers must be a JSON object, e.g. {{"gpu": "A100"}}: {exc}') from None
    if not isinstance(value, dict):
        raise UserError('answers must be a JSON object, e.g. {"gpu": "A100"}')
    return value
