"""Helpers of the CLI tests that run ``haze`` in child processes: an app on a SQLite
``database`` connection, and a child's stdout read line by line."""

from __future__ import annotations

import queue
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from typing import IO

from haze._base.sqlfiles import queue_schema

__all__ = ["Lines", "db_root"]


def db_root(root: Path) -> Path:
    """An app on a SQLite ``database`` connection with its tables."""
    (root / "config").mkdir(parents=True, exist_ok=True)
    (root / "config" / "database.py").write_text(
        "from haze import define_database_config\n"
        "config = define_database_config(default='main', connections={'main': "
        f"{{'url': 'sqlite:///{root}/q.db'}}}})\n"
    )
    (root / "config" / "queue.py").write_text(
        "from haze import define_queue_config\n"
        "config = define_queue_config(default='db', connections={'db': "
        "{'driver': 'database', 'sleep': '50ms', 'max_sleep': '100ms'}})\n"
    )
    with sqlite3.connect(root / "q.db") as c:
        for statement in queue_schema("sqlite"):
            c.execute(statement)
    return root


class Lines:
    """Stdout lines of a child, read by a thread (select() cannot see Python's buffer)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, args=(proc.stdout,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put(line)
        self.lines.put("")

    def wait_for(self, text: str, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if not line:
                break
            self.seen.append(line)
            if text in line:
                return
        if self.proc.poll() is None:
            self.proc.kill()
        raise AssertionError(f"{text!r} not printed; got {self.seen!r}")

    def finish(self, timeout: float = 10) -> tuple[str, str]:
        """Wait for the exit; returns (all stdout, stderr)."""
        assert self.proc.stderr is not None
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        while (line := self.lines.get(timeout=5)) != "":
            self.seen.append(line)
        return "".join(self.seen), self.proc.stderr.read()
