"""A rank's side of `torchrun.run_ranks`: the small files the launcher reads while the rank runs.

- `rankN.hello.json` (pid, main thread), written before the real work starts: the launcher stops a
  rank by its own process group and reads its stack for the main thread;
- `rankN.state.json` (steps so far, whether it ended and how, when), rewritten as it goes;
- `rankN.stack`, where faulthandler dumps every thread's Python stack on SIGUSR1. faulthandler runs
  from the C signal handler, so it answers while the rank is blocked inside a collective, where a
  Python signal handler would wait for the collective to return.
"""
from __future__ import annotations

import faulthandler
import json
import os
import signal
import threading
import time


class RankFiles:
    """This process's rank (torchrun's RANK/LOCAL_RANK/WORLD_SIZE) and its files in `folder`."""

    def __init__(self, folder: str):
        self.folder = folder
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self._stack = None

    def path(self, what: str) -> str:
        return os.path.join(self.folder, f"rank{self.rank}.{what}")

    def _write(self, what: str, data: dict) -> None:
        tmp = self.path(what + ".tmp")
        with open(tmp, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, self.path(what))

    def start(self) -> None:
        """Stack dumps first (the launcher's SIGUSR1 must never find them missing: its default action
        kills), then the hello that tells the launcher this rank can be signalled."""
        self._stack = open(self.path("stack"), "w")  # noqa: SIM115 - held for the process's life
        faulthandler.register(signal.SIGUSR1, file=self._stack, all_threads=True, chain=False)
        self._write("hello.json", {"rank": self.rank, "local_rank": self.local_rank, "world_size": self.world_size,
                                   "pid": os.getpid(), "thread": threading.main_thread().ident, "started": time.time()})

    def state(self, steps: int, status: str | None = None) -> None:
        """Steps so far; with `status`, the rank ended (when: the first rank to fail is the cause)."""
        self._write("state.json", {"steps": steps, "final": status is not None, "status": status, "time": time.time()})
