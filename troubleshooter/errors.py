"""Errors a user can cause. They carry a message meant for people, never a traceback.

Every message is bounded (`clip`): hostile input (a spec that expands to megabytes, a value
quoted in full) must not make the error message itself the attack.
"""

MAX_MESSAGE_CHARS = 2000  # the sentence itself
MAX_PROBLEM_CHARS = 400  # one problem line
MAX_PROBLEMS = 40


def clip(text, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`text` cut to `limit` characters, saying how much was left out."""
    text = str(text)
    if len(text) <= limit:
        return text
    return text[:limit] + f"... ({len(text) - limit:,} more characters cut)"


def clip_problems(problems) -> list[str]:
    """At most MAX_PROBLEMS lines of at most MAX_PROBLEM_CHARS each."""
    problems = list(problems)
    out = [clip(p, MAX_PROBLEM_CHARS) for p in problems[:MAX_PROBLEMS]]
    if len(problems) > MAX_PROBLEMS:
        out.append(f"... and {len(problems) - MAX_PROBLEMS} more problems")
    return out


class UserError(Exception):
    """Bad input: unreadable file, bad spec, unknown option. Shown as `error: ...`, exit 2."""

    exit_code = 2

    def __init__(self, message: str, problems: list[str] | None = None):
        self.problems = clip_problems(problems or [])
        message = clip(message)
        if self.problems:
            message = message + "\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(message)


class SpecError(UserError):
    """A model spec (YAML, preset or Python file) that cannot be built; lists every problem."""
