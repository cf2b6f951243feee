"""Paste an error or a log: recognise what PyTorch prints around AMP, and say cause and fix.

Users arrive with a message, not a diagnosis. The messages live as data in
`data/log_patterns.yaml` (torch, generic) and `data/log_patterns_frameworks.yaml` (accelerate,
Lightning, DeepSpeed, HF Trainer, FSDP, FP8 libraries): regex -> cause, fix, rule id, implied
symptom. The fix depends on the situation the pasted text shows (LoRA, inference, a resumed run,
the framework, frames inside a library with a known bug, the GPU named): `explain_context` reads
it and a pattern's `contexts:` entries pick the fix for it. Two things need numbers rather than
regexes and are read here: a loss scale that keeps falling, and a loss that does not go down. The
symptoms found feed the questionnaire (`decide(answers | {"log": text})`). Pure Python: no torch.
"""
from __future__ import annotations

import bisect
import math
import re
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from importlib import resources

import yaml

from . import explain_context

MAX_CHARS = 5_000_000  # longer logs: the last 5 MB (where the error is) are read
TAIL_CHARS = 200_000  # plain-language readings and the situation: the end of a long log


@dataclass
class LogMatch:
    id: str
    title: str
    severity: str  # error | warning | info
    cause: str
    fix: str
    rule: str | None  # lint (AMP1xx) or check (AMP2xx) rule that catches it
    symptom: str | None  # questionnaire symptom it implies
    line: int  # first line (1-based) where it was seen
    text: str  # that line, trimmed
    count: int = 1
    amp: bool = True  # False: recognised so as to say "not an AMP problem" (no rule, no symptom)
    context: list[str] = field(default_factory=list)  # the situation read from the text that chose this fix
    library_bug: dict | None = None  # {library, summary, url, fixed_in} when a known library bug causes it

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ExplainReport:
    matches: list[LogMatch]
    truncated: bool = False

    @property
    def symptoms(self) -> list[str]:
        """Questionnaire symptom keys the log shows (nan_loss, no_convergence, slow, oom)."""
        return sorted({m.symptom for m in self.matches if m.symptom})

    @property
    def rules(self) -> list[str]:
        return sorted({m.rule for m in self.matches if m.rule})

    @property
    def verdict(self) -> str:
        """'amp' (an AMP message was recognised), 'not an AMP problem', or 'nothing recognised'."""
        if any(m.amp for m in self.matches):
            return "amp"
        return "not an AMP problem" if self.matches else "nothing recognised"

    def to_dict(self) -> dict:
        return {"matches": [m.to_dict() for m in self.matches], "symptoms": self.symptoms,
                "rules": self.rules, "truncated": self.truncated, "verdict": self.verdict,
                "amp_related": self.verdict == "amp"}

    def to_markdown(self) -> str:
        if not self.matches:
            return ("Nothing recognised. Paste the full error (with the lines above the traceback) or a "
                    "training log with loss / loss-scale values.")
        out = []
        for m in self.matches:
            seen = f"line {m.line}" + (f", {m.count} times" if m.count > 1 else "")
            rule = f" · rule `{m.rule}`" if m.rule else ""
            bug = (f"**Library bug.** {_bug_line(m.library_bug)}\n\n" if m.library_bug else "")
            out.append(f"### {m.title}\n*{m.severity}* · {seen}{rule}\n\n> `{m.text}`\n\n"
                       f"**Cause.** {m.cause}\n\n{bug}**Fix.** {m.fix}\n")
        if self.symptoms:
            out.append("Symptoms for the questionnaire: " + ", ".join(f"`{s}`" for s in self.symptoms))
        return "\n".join(out)

    def to_text(self) -> str:
        if not self.matches:
            return self.to_markdown()
        out = []
        for m in self.matches:
            seen = f"line {m.line}" + (f", {m.count}x" if m.count > 1 else "")
            rule = f" [{m.rule}]" if m.rule else ""
            bug = f"\n  bug:   {_bug_line(m.library_bug)}" if m.library_bug else ""
            out.append(f"{m.severity}: {m.title}{rule} ({seen})\n  {m.text}\n  cause: {m.cause}{bug}\n  fix:   {m.fix}")
        if self.symptoms:
            out.append("symptoms: " + ", ".join(self.symptoms))
        return "\n\n".join(out)


def _bug_line(bug: dict) -> str:
    fixed = f" Fixed in {bug['fixed_in']}." if bug.get("fixed_in") else " No released fix known."
    return f"{bug['summary']} ({bug['url']}).{fixed}"


PATTERN_FILES = ("log_patterns.yaml", "log_patterns_frameworks.yaml")
# `{AMP}` in a pattern's regex: a word that names mixed precision, in the ways people write it
# ('mixed precision', 'mixed_precision', 'AMP', 'autocast', fp16/bf16/float16/bfloat16 also inside
# identifiers such as train_fp16.sh or downcast_bf16, 'half()' / 'half precision', '16-bit', Lightning's
# '16-mixed' / 'bf16-true', GradScaler, a loss scale).
AMP_TERMS = (r"(?:mix(?:ed)?[-_ ]?precision|(?<![\w/\\.-])amp(?![\w/\\.-])|autocast|(?<![a-z0-9])(?:fp16|float16|bf16"
             r"|bfloat16)(?![a-z0-9])|\bhalf(?:\(\)|[-_ ]precision)|16[- ]?bit(?= (?:precision|training|mixed|float))"
             r"|\b(?:16|bf16|32|64)-(?:mixed|true)\b|gradscaler|loss[- ]scal\w*)")


@lru_cache(maxsize=1)
def patterns() -> list[dict]:
    entries = []
    for name in PATTERN_FILES:
        text = resources.files("troubleshooter.data").joinpath(name).read_text(encoding="utf-8")
        entries += yaml.safe_load(text)["patterns"]
    for e in entries:
        # One regex per entry, run over the whole text: a few C-level passes even for a 5 MB log.
        e["_regex"] = re.compile("|".join(f"(?:{rx})" for rx in e["match"]).replace("{AMP}", AMP_TERMS),
                                 re.IGNORECASE | re.MULTILINE)
        # `unless`: a hit whose line also matches one of these is not this message (an fp32 cuBLAS call).
        e["_unless"] = (re.compile("|".join(f"(?:{rx})" for rx in e["unless"]), re.IGNORECASE)
                        if e.get("unless") else None)
    return entries


def _fill(text: str, groups: list) -> str:
    """Replace {1}, {2} ... by the regex groups that matched (empty when absent)."""
    return re.sub(r"\{(\d)\}", lambda m: groups[int(m.group(1)) - 1] if int(m.group(1)) <= len(groups) else "", text)


_NUMBER = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|nan|inf)"
# "loss scale", "loss_scale", "grad scale", or a bare "scale" (our recipes' logs); not "lr_scale",
# "img_scale" or "scale_factor": other scales that fall on purpose are not the loss scale.
# apex prints "loss scaler 0 reducing loss scale to 512.0": the 0 is the scaler's index, not a scale.
_SCALE = re.compile(r"(?:(?<![\w])(?:loss|grad)[ _-]?|(?<![\w-]))scale(?:r(?![ \t]+\d+[ \t]+reducing))?['\"]?[ \t]*"
                    r"(?:[=:]|to)?[ \t]*" + _NUMBER
                    + r"(?![\w.])", re.IGNORECASE)
_LOSS = re.compile(r"(?<!\w)(?<!val )(?<!eval )(?:train[ _])?loss['\"]?[ \t]*[=:]?[ \t]*(?:tensor\([ \t]*)?"
                   + _NUMBER + r"(?![\w.])", re.IGNORECASE)


def _series(text: str, starts: list[int], regex: re.Pattern) -> list[tuple[int, float]]:
    """(line number, value) of the first match of `regex` on each line."""
    out: dict[int, float] = {}
    for m in regex.finditer(text):
        line = bisect.bisect_right(starts, m.start())
        if line not in out:
            try:
                out[line] = float(m.group(1))
            except ValueError:
                pass
    return sorted(out.items())


def _line_text(text: str, starts: list[int], line: int) -> str:
    begin = starts[line - 1]
    end = text.find("\n", begin)
    return text[begin:end if end >= 0 else len(text)].strip()[:300]


def _scale_trend(text: str, starts: list[int]) -> LogMatch | None:
    """A loss scale that keeps falling: the scaler keeps finding inf/NaN gradients and skips steps."""
    values = [(i, v) for i, v in _series(text, starts, _SCALE) if math.isfinite(v)]
    if len(values) < 3:
        return None
    drops = [k for k, ((_, a), (_, b)) in enumerate(zip(values, values[1:]), 1) if b < a]
    first, last = values[0][1], values[-1][1]
    # A loss scale is a power of two that starts high (2^16 in torch, up to 2^32 in DeepSpeed); a
    # bare "scale" with other values (0.75, a multi-scale augmentation) is something else.
    if not all(v > 0 and math.log2(v).is_integer() for _, v in values) or max(v for _, v in values) < 8:
        return None
    # A normal fp16 start halves the scale a few times, then holds it (65536 -> 8192 in 3 skips while
    # the loss falls): only a scale that is still falling in the last third of the log is a problem.
    still_falling = bool(drops) and drops[-1] > 2 * len(values) // 3 and last < first
    # DeepSpeed starts at up to 2^32 and halves for a few dozen steps to find its level: a scale still
    # at or above torch's own starting value (2^16) is calibrating, not failing.
    if last >= 65536:
        return None
    if not ((len(drops) >= 3 and last <= first / 8 and still_falling) or (last < 1 <= first)):
        return None
    line = values[0][0]
    return LogMatch(
        "loss-scale-falling", f"The loss scale keeps falling ({first:g} -> {last:g} over {len(values)} readings)",
        "error" if last < 1 else "warning",
        "Each halving of the loss scale is an optimizer step the GradScaler skipped because the gradients held "
        "inf/NaN. A scale that keeps falling (towards 1 or 0) means most steps are skipped: the model overflows "
        "float16 at any scale (often an overflow in the forward pass), so it stops learning.",
        "Find the overflowing layer with `python -m troubleshooter check` (skip rate, NaN localisation); "
        "compute unstable parts in float32; on Ampere or newer GPUs train in bf16 (no loss scale at all).",
        "AMP204", "no_convergence", line, _line_text(text, starts, line), len(values))


def _loss_trend(text: str, starts: list[int]) -> LogMatch | None:
    """A training loss that does not go down over the log."""
    values = [(i, v) for i, v in _series(text, starts, _LOSS) if math.isfinite(v)]
    if len(values) < 6:
        return None
    third = len(values) // 3
    head = sum(v for _, v in values[:third]) / third
    tail = sum(v for _, v in values[-third:]) / third
    if tail < 0.98 * head:
        return None
    line = values[0][0]
    return LogMatch(
        "loss-not-decreasing", f"The loss is not going down ({head:.4g} at the start, {tail:.4g} at the end)",
        "warning",
        "Under fp16 the usual causes are skipped steps (a falling loss scale), an LR schedule that advances on "
        "skipped steps, gradients that underflow to zero, or clipping scaled gradients (clip before unscale_).",
        "Check the skip rate and gradient underflow with `python -m troubleshooter check`, lint the script "
        "(`python -m troubleshooter lint train.py`: AMP101, AMP107, AMP108), or start from a generated recipe.",
        None, "no_convergence", line, _line_text(text, starts, line), len(values))


def _full_line(text: str, starts: list[int], line: int) -> str:
    begin = starts[line - 1]
    end = text.find("\n", begin)
    return text[begin:end if end >= 0 else len(text)]


def _situated(p: dict, groups: list, ctx: explain_context.Context, text: str) -> dict:
    """The pattern's fields for the situation the text shows: a `contexts:` entry, a known library bug."""
    fields = {k: p.get(k) for k in ("title", "severity", "cause", "fix", "rule", "symptom")}
    fields["amp"] = p.get("amp", True)
    chosen = explain_context.pick(p.get("contexts"), ctx, text)
    if chosen:
        fields.update({k: v for k, v in chosen.items() if k in fields})
    bug = explain_context.library_bug(p["id"], text) if fields["amp"] else None
    if bug:
        fields["cause"] = bug["cause"]
        fields["fix"] = bug["fix"]
        fields["rule"] = None  # the user's code is not what a lint rule would flag
    gpu = ctx.gpu_label or "this GPU"
    for k in ("title", "cause", "fix"):
        fields[k] = _fill(fields[k], groups).replace("{gpu}", gpu)
    fields["context"] = sorted(set(chosen.get("when") or []) if chosen else set())
    fields["library_bug"] = ({k: bug[k] for k in ("library", "summary", "url", "fixed_in")} if bug else None)
    return fields


def explain_log(text: str) -> ExplainReport:
    """Every recognised message in `text`, in order of first appearance, with the cause and the fix for
    the situation the text shows (explain_context)."""
    truncated = len(text) > MAX_CHARS
    if truncated:
        text = text[-MAX_CHARS:]
    starts = [0] + [m.end() for m in re.finditer("\n", text)]  # offset of each line's first character
    lower = text.lower()
    tail = lower[-TAIL_CHARS:]
    matches = []
    ctx = None
    for p in patterns():
        # Plain-language readings are for what people write, not for 5 MB logs: the last 200 kB only.
        plain = p["id"].startswith("plain-")
        if not any(k in (tail if plain else lower) for k in p["keys"]):
            continue
        found = list(p["_regex"].finditer(text, max(0, len(text) - TAIL_CHARS) if plain else 0))
        if p["_unless"] is not None:
            found = [m for m in found
                     if not p["_unless"].search(_full_line(text, starts, bisect.bisect_right(starts, m.start())))]
        if not found:
            continue
        ctx = ctx or explain_context.read_context(text)
        first = found[0]
        groups = [g for g in first.groups() if g is not None]
        line = bisect.bisect_right(starts, first.start())
        lines_hit = len({bisect.bisect_right(starts, m.start()) for m in found})
        f = _situated(p, groups, ctx, text)
        matches.append(LogMatch(p["id"], f["title"], f["severity"], f["cause"], f["fix"], f["rule"], f["symptom"],
                                line, _line_text(text, starts, line), lines_hit, f["amp"], f["context"],
                                f["library_bug"]))
    matches.sort(key=lambda m: m.line)
    matches += [m for m in (_scale_trend(text, starts), _loss_trend(text, starts)) if m]
    return ExplainReport(_drop_shadowed(matches), truncated)


def _drop_shadowed(matches: list[LogMatch]) -> list[LogMatch]:
    """A line a specific pattern explained is not also reported by the plain-language fallbacks, and a
    pattern's `shadows:` (a more general reading of the same message) go when it matched. When the only
    AMP readings are plain-language fallbacks and a specific non-AMP error was recognised, that error
    is the answer (a traceback through torch/amp is no AMP problem by itself)."""
    specific = {m.line for m in matches if not m.id.startswith("plain-")}
    by_id = {p["id"]: p for p in patterns()}
    shadowed = {s for m in matches for s in (by_id.get(m.id, {}).get("shadows") or ())}
    kept = [m for m in matches if not (m.id.startswith("plain-") and m.line in specific) and m.id not in shadowed]
    if any(not m.amp for m in kept) and all(m.id.startswith("plain-") for m in kept if m.amp):
        kept = [m for m in kept if not m.id.startswith("plain-")]
    return kept
