"""Errors a user can cause. They carry a message meant for people, never a traceback."""


class UserError(Exception):
    """Bad input: unreadable file, bad spec, unknown option. Shown as `error: ...`, exit 2."""

    exit_code = 2

    def __init__(self, message: str, problems: list[str] | None = None):
        self.problems = list(problems or [])
        if self.problems:
            message = message + "\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(message)


class SpecError(UserError):
    """A model spec (YAML, preset or Python file) that cannot be built; lists every problem."""
