"""A job's RUNNING and DONE lines, written a moment after the fact.

Every job a worker runs logs two lifecycle records on ``haze.job`` (``running``, then
``done``): making one and writing it as a line of ``haze queue:work`` costs about as
much as decoding the job's envelope. Made where they happen, the RUNNING record sat
between the claim and the job's start, and both sat between a job's end and its ack.
``job_lines`` keeps what a record needs (its time, message, fields) and logs it at the
next pass of the event loop: while the job waits on its first ``await``, or while the
ack is on its way to the backend. The record is the same (its ``created`` is the time
of the event, its caller the code that logged it), and the order of lines is kept: the
pending ones are logged before any line of the job's own logger and before any other
lifecycle line (``flush``), and at the latest when the job's run ends.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections import deque
from typing import Any

__all__ = ["JobLines", "job_lines"]

_job_logger = logging.getLogger("haze.job")
_DEBUG = logging.DEBUG

#: (time, file, line, function, message, args, extra)
_Line = tuple[float, str, int, str, str, tuple[Any, ...], dict[str, Any]]


class JobLines:
    """DEBUG records on ``haze.job`` logged at the next pass of the loop (see above)."""

    __slots__ = ("_lines", "_lock", "_scheduled")

    def __init__(self) -> None:
        self._lines: deque[_Line] = deque()
        # a job's own logger flushes from the job's thread (a plain ``def`` handler)
        self._lock = threading.RLock()
        self._scheduled: asyncio.AbstractEventLoop | None = None

    def debug(self, at: float, msg: str, args: tuple[Any, ...], extra: dict[str, Any]) -> None:
        """``logging.getLogger("haze.job").debug(msg, *args, extra=extra)`` as of ``at``
        (a ``time.time()``), logged at the next pass of the running loop. The caller
        checks ``isEnabledFor(DEBUG)`` first, as before a ``debug`` call."""
        caller = sys._getframe(1)
        code = caller.f_code
        self._lines.append((at, code.co_filename, caller.f_lineno, code.co_name, msg, args, extra))
        loop = asyncio.get_running_loop()
        if self._scheduled is not loop:
            self._scheduled = loop
            loop.call_soon(self._pass)

    def _pass(self) -> None:
        self._scheduled = None
        self.flush()

    def flush(self) -> None:
        """Log the pending records now, oldest first."""
        if not self._lines:
            return
        with self._lock:
            lines = self._lines
            while lines:
                try:
                    line = lines.popleft()
                except IndexError:  # pragma: no cover - taken by another thread
                    return
                _log(line)


def _log(line: _Line) -> None:
    at, fn, lno, func, msg, args, extra = line
    record = _job_logger.makeRecord(_job_logger.name, _DEBUG, fn, lno, msg, args, None, func, extra)
    # the time of the event, not of this call (as logging computes them from it)
    shift = record.created - at
    record.created = at
    record.msecs = int((at - int(at)) * 1000) + 0.0
    record.relativeCreated -= shift * 1000
    _job_logger.handle(record)


#: The process's pending lifecycle lines (one ``haze.job`` logger, so one queue).
job_lines = JobLines()
