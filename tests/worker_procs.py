"""Worker processes for the fault tests (``tests/database``, ``tests/drivers``).

A fault test starts real ``haze queue:work`` processes, kills them, and counts what their
jobs did: each job appends one line per start and end (``<event> <key> <attempt> <pid>
<time>``) to a runs file opened with O_APPEND, so runs are counted across processes,
kills and restarts. :class:`WorkerProcs` holds the processes (stdout and stderr in files
of their own) and reads that file; each backend's harness adds its app and environment.
"""

from __future__ import annotations

import asyncio
import collections
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


class WorkerProcs:
    """The worker processes of one test, and the runs file their jobs write."""

    def __init__(self, tmp: Path, app_root: Path) -> None:
        self.tmp = tmp
        self.app_root = app_root
        self.runs_file = tmp / "runs.txt"
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(
        self, connection: str, queues: str, args: Sequence[str], env: Mapping[str, str]
    ) -> subprocess.Popen[bytes]:
        """``haze --root <app_root> queue:work --connection C --queue Q *args``."""
        n = len(self.procs)
        cmd = [sys.executable, "-m", "haze.cli", "--root", str(self.app_root), "queue:work"]
        cmd += ["--connection", connection, "--queue", queues, *args]
        with (
            open(self.tmp / f"worker-{n}.out", "wb") as out,
            open(self.tmp / f"worker-{n}.err", "wb") as err,
        ):
            p = subprocess.Popen(
                cmd, env=dict(env), stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=self.tmp
            )
        p.n = n  # type: ignore[attr-defined]
        self.procs.append(p)
        return p

    def out(self, p: subprocess.Popen[bytes]) -> str:
        return (self.tmp / f"worker-{p.n}.out").read_text(errors="replace")  # type: ignore[attr-defined]

    def err(self, p: subprocess.Popen[bytes]) -> str:
        return (self.tmp / f"worker-{p.n}.err").read_text(errors="replace")  # type: ignore[attr-defined]

    def log(self, p: subprocess.Popen[bytes]) -> str:
        return f"--- stdout of worker {p.pid}\n{self.out(p)}--- stderr\n{self.err(p)}"

    async def wait_ready(self, p: subprocess.Popen[bytes], within: float = 60) -> None:
        """Until the worker printed its banner (its signal handlers are installed then)."""
        deadline = time.monotonic() + within
        while "Working connection" not in self.out(p):
            if p.poll() is not None:
                raise AssertionError(f"worker exited with {p.returncode}:\n{self.log(p)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker did not start:\n{self.log(p)}")
            await asyncio.sleep(0.05)

    async def wait_exit(self, p: subprocess.Popen[bytes], within: float = 60) -> int:
        deadline = time.monotonic() + within
        while p.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {p.pid} did not exit:\n{self.log(p)}")
            await asyncio.sleep(0.05)
        return p.returncode

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)

    # -- what ran ------------------------------------------------------------------

    def events(self) -> list[tuple[str, str, int, int, float]]:
        if not self.runs_file.exists():
            return []
        out = []
        for line in self.runs_file.read_text().splitlines():
            event, key, attempt, pid, at = line.split()
            out.append((event, key, int(attempt), int(pid), float(at)))
        return out

    def counts(self, event: str) -> collections.Counter[str]:
        return collections.Counter(k for e, k, *_ in self.events() if e == event)

    async def wait_ended(
        self, keys: set[str], within: float, procs: list[subprocess.Popen[bytes]] | None = None
    ) -> None:
        deadline = time.monotonic() + within
        while not keys <= set(self.counts("end")):
            for p in procs or []:
                assert p.poll() is None, f"worker {p.pid} exited:\n{self.log(p)}"
            if time.monotonic() > deadline:
                missing = keys - set(self.counts("end"))
                raise TimeoutError(
                    f"{len(missing)} jobs never finished, e.g. {sorted(missing)[:5]}"
                )
            await asyncio.sleep(0.1)
