"""Jobs of the robustness tests. Every run appends ``<event> <key> <attempt> <pid> <time>``
to the file named by ``RB_RUNS_FILE`` (O_APPEND: processes never interleave a line)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from haze import JobContext, define_job


def record(event: str, key: Any, attempt: int) -> None:
    line = f"{event} {key} {attempt} {os.getpid()} {time.time():.6f}\n".encode()
    fd = os.open(os.environ["RB_RUNS_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@define_job(name="rb_record", tries=3)
async def rb_record(payload: Any, job: JobContext) -> None:
    """``{"k": key, "sleep": seconds}``: start, (async) sleep, end."""
    key = payload.get("k", "x") if isinstance(payload, dict) else "x"
    record("start", key, job.attempt)
    if isinstance(payload, dict) and payload.get("sleep"):
        await asyncio.sleep(payload["sleep"])
    record("end", key, job.attempt)


@define_job(name="rb_block", tries=3)
async def rb_block(payload: dict[str, Any], job: JobContext) -> None:
    """An async job that blocks the event loop (``time.sleep``) on its first attempt."""
    record("start", payload["k"], job.attempt)
    if job.attempt == 1:
        time.sleep(payload["sleep"])  # noqa: ASYNC251 - blocking the loop is the point
    record("end", payload["k"], job.attempt)


class RbCustomBaseError(BaseException):
    """A BaseException that is neither KeyboardInterrupt nor SystemExit."""


_RAISE = {
    "KeyboardInterrupt": lambda: KeyboardInterrupt("raised by rb_raise"),
    "SystemExit": lambda: SystemExit(3),
    "GeneratorExit": lambda: GeneratorExit("raised by rb_raise"),
    "RbCustomBaseError": lambda: RbCustomBaseError("raised by rb_raise"),
    "CancelledError": lambda: asyncio.CancelledError("raised by rb_raise"),
}


@define_job(name="rb_raise", tries=1)
async def rb_raise(payload: dict[str, Any], job: JobContext) -> None:
    """Raise ``payload["kind"]`` (a BaseException) after ``payload.get("after", 0)`` s."""
    record("start", payload["k"], job.attempt)
    await asyncio.sleep(payload.get("after", 0))
    raise _RAISE[payload["kind"]]()


@define_job(name="rb_raise_sync", tries=1)
def rb_raise_sync(payload: dict[str, Any], job: JobContext) -> None:
    """The same from a plain ``def`` job (it runs in a worker thread)."""
    record("start", payload["k"], job.attempt)
    time.sleep(payload.get("after", 0))
    raise _RAISE[payload["kind"]]()


@define_job(name="rb_raise_timed", tries=1, timeout="30s")
async def rb_raise_timed(payload: dict[str, Any], job: JobContext) -> None:
    """``rb_raise`` with a ``timeout`` (the handler runs in a task of its own then)."""
    record("start", payload["k"], job.attempt)
    await asyncio.sleep(payload.get("after", 0))
    raise _RAISE[payload["kind"]]()
