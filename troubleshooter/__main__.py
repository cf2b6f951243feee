"""`python -m troubleshooter ...`"""
import time

_started_at = time.time()  # before the CLI's own imports: a command's --budget counts from here

from .cli import entry  # noqa: E402

entry(started_at=_started_at)
