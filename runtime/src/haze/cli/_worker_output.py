"""What ``haze queue:work`` prints: one line per job state, in one format.

The queue manager logs each step of a job's life on the ``haze.job`` logger with a
``state`` field (``running``, ``done``, ``retry``, ``released``, ``failed``); this
handler turns those records into artisan-style lines, and formats the job's own log
records and haze's warnings the same way, so a worker's output has one shape::

    2026-12-02 09:14:03 send_invoice ................ a1b2002a RUNNING
    2026-12-02 09:14:03 send_invoice ................ a1b2002a DONE 12ms
    2026-12-02 09:14:04 charge_card ................. a1b2002b RETRY in 10s  ValueError: declined
    2026-12-02 09:14:04 charge_card ................. a1b2002b FAILED  ValueError: declined

``--json`` writes one JSON object per record instead (for log shippers); ``--quiet``
drops the job lines and keeps warnings; ``-v`` adds the job's INFO logs and a failure's
traceback.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from haze._base.describe import error_text, format_error
from haze._base.ids import short_id
from haze.cli._logging import DEFAULT_HANDLER_FLAG

__all__ = ["WorkerOutput", "worker_output"]

_NAME_WIDTH = 32
_STATES = {
    "running": "RUNNING",
    "done": "DONE",
    "retry": "RETRY",
    "released": "RELEASED",
    "failed": "FAILED",
    "cancelled": "CANCELLED",
}
_COLOURS = {
    "running": "\x1b[33m",
    "done": "\x1b[32m",
    "retry": "\x1b[33m",
    "released": "\x1b[36m",
    "failed": "\x1b[1;31m",
    "cancelled": "\x1b[35m",
}
_RESET = "\x1b[0m"


def _stamp(at: float) -> str:
    return _stamp_second(int(at))


@functools.lru_cache(maxsize=4)
def _stamp_second(second: int) -> str:
    # A busy worker writes thousands of lines in the same second: format it once.
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))


def _seconds(value: float) -> str:
    return f"{value:g}s" if value < 60 or value % 60 else f"{value / 60:g}m"


def one_line(error: BaseException) -> str:
    """``ValueError: boom`` on one line, whatever newlines the message holds."""
    text = " ".join(error_text(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class WorkerOutput(logging.Handler):
    """A logging handler on the ``haze`` logger for the length of one ``queue:work``."""

    def __init__(
        self,
        *,
        mode: str = "lines",
        verbose: bool = False,
        out: TextIO | None = None,
        err: TextIO | None = None,
    ) -> None:
        super().__init__(logging.DEBUG)
        self.mode = mode
        self.verbose = verbose
        self.out = out if out is not None else sys.stdout
        self.err = err if err is not None else sys.stderr
        self.colour = mode == "lines" and getattr(self.out, "isatty", lambda: False)()
        #: logger -> the level its records needed to reach the app's root handlers.
        self.forward: dict[str, int] | None = None
        self._unflushed: set[TextIO] = set()

    # -- what the command itself says (banner, signals, summary) ---------------------

    def say(self, message: str, *, level: str = "INFO") -> None:
        """A message of the command: a plain line, or a JSON object with ``--json``."""
        if self.mode == "json":
            self._write_json({"time": time.time(), "level": level, "message": message})
        else:
            self._write(self.out, message)

    # -- log records ----------------------------------------------------------------

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self.mode == "json":
                if self._wanted(record):
                    self._write_json(self._as_dict(record))
                return
            state = getattr(record, "state", None)
            if state is not None:
                if self.mode != "quiet":
                    self._job_line(record, state)
            elif self._wanted(record):
                self._log_line(record)
        except Exception:  # a broken pipe must not take the worker down
            self.handleError(record)
        if self.forward is not None:
            self._forward(record)

    def _forward(self, record: logging.LogRecord) -> None:
        """Hand a record on to the app's own root handlers, if it would have reached them
        before this worker opened haze's loggers (see :func:`worker_output`)."""
        assert self.forward is not None
        job = record.name == "haze.job" or record.name.startswith("haze.job.")
        if record.levelno < self.forward["haze.job" if job else "haze"]:
            return
        for h in logging.getLogger().handlers:
            if record.levelno >= h.level:
                h.handle(record)

    def _wanted(self, record: logging.LogRecord) -> bool:
        if getattr(record, "state", None) is not None:
            return self.mode != "quiet"
        return record.levelno >= (logging.INFO if self.verbose else logging.WARNING)

    def _job_line(self, record: logging.LogRecord, state: str) -> None:
        label = _STATES.get(state, state.upper())
        if self.colour:
            label = f"{_COLOURS.get(state, '')}{label}{_RESET}"
        detail = ""
        if state == "done":
            detail = f" {round(getattr(record, 'elapsed', 0.0) * 1000)}ms"
        elif state in ("retry", "released"):
            detail = f" in {_seconds(float(getattr(record, 'retry_in', 0.0)))}"
        error = getattr(record, "error", None)
        if isinstance(error, BaseException):
            detail += f"  {one_line(error)}"
        elif hasattr(record, "error_text"):  # an encrypted job's: the type only
            detail += f"  {record.__dict__['error_text']}"
        self._write(self.out, f"{self._prefix(record)} {label}{detail}")
        if state == "failed" and self.verbose and record.exc_info and record.exc_info[1]:
            self._write(self.out, format_error(record.exc_info[1]))

    def _log_line(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            if self.verbose:
                message += "\n" + format_error(record.exc_info[1])
            else:
                message += f"  {one_line(record.exc_info[1])}"
        if getattr(record, "job", None) is not None:
            # The job's own logs: on stdout, between its RUNNING and DONE lines.
            self._write(self.out, f"{self._prefix(record)} {record.levelname} {message}")
        else:
            self._write(self.err, f"{_stamp(record.created)} {record.levelname} {message}")

    def _prefix(self, record: logging.LogRecord) -> str:
        name = str(getattr(record, "job", "?"))
        job_id = getattr(record, "job_id", None)
        dots = "." * max(2, _NAME_WIDTH - len(name) - 1)
        shown = short_id(str(job_id)) if job_id is not None else "-"
        return f"{_stamp(record.created)} {name} {dots} {shown}"

    def _as_dict(self, record: logging.LogRecord) -> dict[str, Any]:
        data: dict[str, Any] = {
            "time": record.created,
            # The lifecycle records are DEBUG only so that they cost nothing elsewhere.
            "level": "INFO"
            if record.levelno < logging.INFO and hasattr(record, "state")
            else record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("state", "job", "job_id", "attempt"):
            value = getattr(record, key, None)
            if value is not None:
                data[key] = value
        if "job_id" in data:
            data["short_id"] = short_id(str(data["job_id"]))
        elapsed = getattr(record, "elapsed", None)
        if elapsed is not None:
            data["ms"] = round(elapsed * 1000, 3)
        retry_in = getattr(record, "retry_in", None)
        if retry_in is not None:
            data["retry_in"] = retry_in
        error = getattr(record, "error", None)
        if error is None and record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
        if isinstance(error, BaseException):
            data["exception"] = one_line(error)
        elif hasattr(record, "error_text"):
            data["exception"] = record.__dict__["error_text"]
        if record.exc_info and record.exc_info[1] is not None:
            data["traceback"] = format_error(record.exc_info[1])
        return data

    def _write_json(self, data: dict[str, Any]) -> None:
        self._write(self.out, json.dumps(data, default=str, ensure_ascii=False))

    def _write(self, stream: TextIO, text: str) -> None:
        # Sync handlers log from worker threads: one line is never cut by another.
        self.acquire()
        try:
            stream.write(text + "\n")
            if not self._flush_soon(stream):
                stream.flush()
        finally:
            self.release()

    def _flush_soon(self, stream: TextIO) -> bool:
        """On the event loop's thread, the lines of one loop pass go out in one flush when
        it ends (a worker writes two lines per job; a flush each was a system call each);
        elsewhere (a sync job's thread, no loop) the caller flushes at once."""
        if stream in self._unflushed:
            return True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        self._unflushed.add(stream)
        loop.call_soon(self._flush, stream)
        return True

    def _flush(self, stream: TextIO) -> None:
        self.acquire()
        try:
            self._unflushed.discard(stream)
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing left to tell
            pass
        finally:
            self.release()

    def flush(self) -> None:
        """Send what is still buffered now (the worker is ending)."""
        for stream in list(self._unflushed):
            self._flush(stream)


@contextmanager
def worker_output(handler: WorkerOutput) -> Iterator[WorkerOutput]:
    """Route haze's log records through ``handler`` while a worker runs.

    The job lifecycle records are DEBUG, so ``haze.job`` is opened to DEBUG and the
    handler decides what to show. haze's records stop propagating to the root logger:
    the handler ``haze`` set up there would print the same lines again in another
    format. Handlers an app installed on the root logger itself still receive what they
    received before (the records at the levels haze's loggers had), not the new DEBUG
    lifecycle records.
    """
    haze_log = logging.getLogger("haze")
    job_log = logging.getLogger("haze.job")
    saved = (haze_log.level, job_log.level, haze_log.propagate)
    root = logging.getLogger()
    if haze_log.propagate and not all(
        getattr(h, DEFAULT_HANDLER_FLAG, False) for h in root.handlers
    ):
        handler.forward = {
            "haze.job": job_log.getEffectiveLevel(),
            "haze": haze_log.getEffectiveLevel(),
        }
    haze_log.addHandler(handler)
    haze_log.propagate = False
    if handler.verbose:
        haze_log.setLevel(min(logging.INFO, haze_log.getEffectiveLevel()))
    # --quiet prints no job lines: the DEBUG lifecycle records need not even be made.
    job_log.setLevel(logging.WARNING if handler.mode == "quiet" else logging.DEBUG)
    lean = _lean_records() if handler.forward is None else None
    try:
        yield handler
    finally:
        handler.flush()
        if lean is not None:
            _restore_records(lean)
        haze_log.removeHandler(handler)
        haze_log.setLevel(saved[0])
        job_log.setLevel(saved[1])
        haze_log.propagate = saved[2]
        handler.forward = None


_RECORD_FIELDS = ("logThreads", "logProcesses", "logMultiprocessing", "_srcfile")


def _lean_records() -> dict[str, Any]:
    """Records without the caller's frame, thread and process names, which no line of
    this handler shows: when no handler of the app sees haze's records, the worker stops
    paying for them (the logging module's own optimisation switches, about a third of
    the cost of a job line). Returns what to restore."""
    saved = {name: getattr(logging, name) for name in _RECORD_FIELDS}
    for name in _RECORD_FIELDS:
        setattr(logging, name, None if name == "_srcfile" else False)
    return saved


def _restore_records(saved: dict[str, Any]) -> None:
    for name, value in saved.items():
        setattr(logging, name, value)
