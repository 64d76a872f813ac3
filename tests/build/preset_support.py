"""Helpers shared by the docker, server and vercel preset tests: writing a small app,
running a process with its output collected, and waiting with a deadline."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx

JOB = """\
import asyncio
from haze import define_job


@define_job(name="{name}", timeout="{timeout}")
async def {name}(payload: dict) -> None:
    with open(payload["file"], "a") as f:
        f.write(f"start {{payload['tag']}}\\n")
    await asyncio.sleep(payload.get("seconds", 0))
    with open(payload["file"], "a") as f:
        f.write(f"end {{payload['tag']}}\\n")
"""


def write_app(root: Path, files: Mapping[str, str], *, name: str, timeout: str = "20s") -> Path:
    """An app at ``root``: the given config files (dedented) and a job ``name`` that writes
    ``start TAG``/``end TAG`` lines to ``payload["file"]``, sleeping ``seconds`` between.

    Each test module uses its own job name: the job registry is process-wide, and a
    second app defining the same name in the same pytest process is a DuplicateJobError.
    """
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    job = root / "app" / "job" / f"{name}.py"
    job.parent.mkdir(parents=True, exist_ok=True)
    job.write_text(JOB.format(name=name, timeout=timeout))
    return root


def make_queue_tables(root: Path) -> None:
    """``haze make:queue-tables`` in the app, as its author does once: the jobs-table
    migration lands in ``database/`` (and so in the build)."""
    made = subprocess.run(
        [sys.executable, "-m", "haze.cli", "--root", str(root), "make:queue-tables"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stdout + made.stderr


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without pytest's, haze's or a virtualenv's variables."""
    drop = ("PYTEST", "HAZE_", "VIRTUAL_ENV", "PYTHONPATH", "QUEUE_CONNECTION", "DATABASE_URL")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], bool], timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def lines_of(file: Path) -> list[str]:
    return file.read_text().splitlines() if file.exists() else []


class Proc:
    """A subprocess whose merged stdout/stderr a thread collects."""

    def __init__(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str]) -> None:
        self.argv = list(argv)
        self.proc = subprocess.Popen(
            self.argv,
            cwd=cwd,
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._pump = threading.Thread(target=self._read, daemon=True)
        self._pump.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for_output(self, text: str, timeout: float = 60) -> None:
        if not wait_until(lambda: text in self.output or self.proc.poll() is not None, timeout):
            raise AssertionError(f"{text!r} not seen in {timeout}s: {self.output}")
        if text not in self.output:
            raise AssertionError(f"exited ({self.proc.returncode}) before {text!r}: {self.output}")

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        self._pump.join(timeout=5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._pump.join(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def uvicorn(cwd: Path, target: str, env: Mapping[str, str], probe: str) -> tuple[Proc, str]:
    """``python -m uvicorn TARGET`` in ``cwd``, once ``GET probe`` answers; returns the
    process and its base URL."""
    port = free_port()
    server = Proc(
        [sys.executable, "-m", "uvicorn", target, "--host", "127.0.0.1", "--port", str(port)],
        cwd=cwd,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if server.proc.poll() is not None:
            return True
        try:
            httpx.get(base + probe, timeout=2)
            return True
        except httpx.HTTPError:
            return False

    if not wait_until(up, 60) or server.proc.poll() is not None:
        server.kill()
        raise AssertionError(f"uvicorn did not start: {server.output}")
    return server, base
