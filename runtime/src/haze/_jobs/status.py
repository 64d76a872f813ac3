"""Job status records, results, progress and cancellation.

A job defined with ``track=True`` (or ``keep_result="1d"``, or under a queue config with
``track=True``) keeps one record in the app's lock store (``config/queue.py`` ``store``),
under ``haze:status:<id>``, rewritten at each step: ``queued``/``delayed`` at dispatch,
``running`` when an attempt starts, its progress, then ``done``, ``failed`` or
``cancelled``. Untracked jobs write nothing: the dispatch and execution paths only test
a field of the message.

>>> # job_id = await report.dispatch({"month": "2026-11"})
>>> # status = await Queue.wait(job_id, timeout=60)
>>> # status.state, status.result
>>> # ('done', {'rows': 1200})

Cancellation writes a marker (``haze:cancel:<id>``) and a hint (``haze:cancels``, the
time of the latest cancel). An attempt about to start reads the marker when its job is
tracked or while the hint is set (the hint is re-read at most once a second); while jobs
run, each process polls the markers of its running jobs once a second
(``CANCEL_POLL``) and aborts the signal of those cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from haze._base.describe import error_line
from haze._base.errors import JobCancelledError, JobProgressError, UntrackedJobError
from haze.contracts.store import StatusNotifier, Store, Subscription

if TYPE_CHECKING:
    from haze._base.message import Message
    from haze._jobs.context import JobContext

__all__ = [
    "CANCEL_POLL",
    "CANCEL_TTL",
    "FINAL_STATES",
    "RESULT_MAX_BYTES",
    "STATES",
    "JobStatus",
    "StatusHost",
    "check_progress",
]

log = logging.getLogger("haze")

STATES = ("queued", "delayed", "running", "done", "failed", "cancelled")
FINAL_STATES = frozenset({"done", "failed", "cancelled"})

#: How long a tracked job's record lives after its last write when no ``keep_result``
#: is given (seconds). A waiting or running record lives at least this long past its
#: due time.
TRACK_TTL = 86400.0
#: The largest result kept, as UTF-8 JSON (bytes). A larger one is logged and dropped:
#: the job stays ``done`` and the record's ``error`` says why the result is missing.
RESULT_MAX_BYTES = 64 * 1024
#: The largest progress object, as UTF-8 JSON (bytes).
PROGRESS_MAX_BYTES = 1024
#: How long a cancel marker lives: a job first delivered later than this after its
#: cancel runs (long delays: cancel again closer to the time).
CANCEL_TTL = 7 * 86400.0
#: How often a process with running jobs reads their cancel markers (seconds).
CANCEL_POLL = 1.0

#: How often ``Queue.wait`` reads the record when the store notifies (seconds): a
#: safety net for a notification lost with a dropped connection.
_NOTIFIED_POLL = 2.0

HINT_KEY = "haze:cancels"


class StatusHost(Protocol):
    """What the status functions need of the engine (``app.manager`` is one): its state
    store, and this process's waiters and running attempts."""

    def state_store(self) -> Store: ...
    def notify_final(self, job_id: str) -> None:
        """Wake this process's waiters of a job whose record became final."""

    def final_event(self, job_id: str) -> asyncio.Event:
        """The event a final write of ``job_id`` in this process sets."""

    def drop_final_event(self, job_id: str, event: asyncio.Event) -> None: ...
    def cancel_hint(self, on: bool) -> None:
        """A cancel may be outstanding: attempts check their marker before they start."""

    def abort_running(self, job_id: str) -> None:
        """Abort the signal of ``job_id`` when it runs in this process."""

    def open_sealed(self, job_id: str, blob: object) -> dict[str, Any] | None:
        """The ``sealed`` fields of an encrypted job's record, decrypted with the app key;
        None when this process has no key that opens them."""


#: A function that encrypts an encrypted job's record fields (None: a plain job).
Sealer = Callable[[dict[str, Any]], str]


def status_key(job_id: str) -> str:
    return f"haze:status:{job_id}"


def cancel_key(job_id: str) -> str:
    return f"haze:cancel:{job_id}"


def sealed_context(job_id: str) -> str:
    """What an encrypted job's record fields are authenticated with (one job's record)."""
    return f"haze:status:{job_id}"


@dataclass(frozen=True, slots=True)
class JobStatus:
    """A tracked job's status record (``await Queue.status(id)``).

    ``state`` is one of ``queued``, ``delayed``, ``running``, ``done``, ``failed``,
    ``cancelled``. ``attempt`` counts from 1 once an attempt started (0 before).
    ``progress`` is the last ``job.progress(value)``; ``result`` what ``handle()``
    returned (with ``keep_result``); ``error`` the failure (``Type: message``), why a job
    was cancelled, or why its result was not kept; ``updated_at`` epoch seconds.
    ``encrypted``: the job is ``encrypted``, so its progress, result and error are stored
    encrypted; they are None here when this process has no key to read them.

    >>> # st = await Queue.status(job_id)
    >>> # if st is not None and st.final: print(st.state, st.result)
    """

    id: str
    name: str
    state: str
    attempt: int
    progress: int | dict[str, Any] | None
    result: Any
    error: str | None
    updated_at: float
    encrypted: bool = False

    @property
    def final(self) -> bool:
        """True for ``done``, ``failed`` and ``cancelled``: the record changes no more."""
        return self.state in FINAL_STATES

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON data (for an HTTP answer or the dashboard)."""
        return {
            "id": self.id,
            "name": self.name,
            "state": self.state,
            "attempt": self.attempt,
            "progress": self.progress,
            "result": self.result,
            "error": self.error,
            "updated_at": self.updated_at,
            "encrypted": self.encrypted,
        }

    @classmethod
    def from_record(cls, record: Any, opened: dict[str, Any] | None = None) -> JobStatus | None:
        """The status in a stored record; ``opened``: its ``sealed`` fields decrypted."""
        if not isinstance(record, dict) or record.get("state") not in STATES:
            return None
        fields = record if opened is None else {**record, **opened}
        return cls(
            id=str(record.get("id", "")),
            name=str(record.get("name", "")),
            state=record["state"],
            attempt=int(record.get("attempt") or 0),
            progress=fields.get("progress"),
            result=fields.get("result"),
            # a cancel rewrites the record's plain error, which no secret is made of
            error=fields.get("error") or record.get("error"),
            updated_at=float(record.get("updated_at") or 0.0),
            encrypted="sealed" in record,
        )


def check_progress(value: object) -> int | dict[str, Any]:
    """``value`` if it is a valid progress (an int 0–100, or a small JSON object)."""
    if isinstance(value, bool):
        raise JobProgressError(f"job.progress(): expected an int from 0 to 100, got {value!r}")
    if isinstance(value, int):
        if not 0 <= value <= 100:
            raise JobProgressError(f"job.progress(): {value} is outside 0-100")
        return value
    if isinstance(value, dict):
        try:
            size = len(json.dumps(value, allow_nan=False).encode("utf-8"))
        except (TypeError, ValueError) as e:
            raise JobProgressError(f"job.progress(): the object is not JSON ({e})") from None
        if size > PROGRESS_MAX_BYTES:
            raise JobProgressError(
                f"job.progress(): the object is {size} bytes of JSON, over the "
                f"{PROGRESS_MAX_BYTES}-byte limit; keep progress small (counts, a stage name)"
            )
        return value
    raise JobProgressError(
        f"job.progress(): expected an int from 0 to 100 or a JSON object, got {value!r}"
    )


def tracking(job_track: bool | None, job_keep: float | None, app: Any) -> dict[str, float] | None:
    """The ``meta`` fields that mark a message as tracked, or None (untracked).

    The job's ``track``/``keep_result`` win; otherwise the queue config's ``track``
    decides, and its ``keep_result`` applies to every tracked job without its own."""
    if job_track is False:
        return None
    cfg = app.queue_config
    if not (job_track or job_keep is not None or cfg.track):
        return None
    keep = job_keep if job_keep is not None else cfg.keep_result
    if keep is not None:
        return {"track": keep, "keep": keep}
    return {"track": TRACK_TTL}


def _record(
    message: Message, state: str, attempt: int, progress: Any, result: Any, error: str | None
) -> dict[str, Any]:
    return {
        "id": message.id,
        "name": message.job,
        "state": state,
        "attempt": attempt,
        "progress": progress,
        "result": result,
        "error": error,
        "updated_at": time.time(),
    }


async def write(
    manager: StatusHost,
    message: Message,
    state: str,
    *,
    attempt: int = 0,
    progress: Any = None,
    result: Any = None,
    error: str | None = None,
    wait: float = 0.0,
    seal: Sealer | None = None,
) -> None:
    """Write a tracked message's record; a store error is logged, never raised (the job's
    outcome does not depend on its record). ``seal`` (an encrypted job): its progress,
    result and error are stored encrypted, in ``sealed``."""
    meta = message.meta or {}
    ttl = float(meta.get("track") or TRACK_TTL)
    if state not in FINAL_STATES:
        ttl = max(ttl, TRACK_TTL) + wait  # outlive the wait, however short keep_result is
    if seal is None:
        record = _record(message, state, attempt, progress, result, error)
    else:
        record = _record(message, state, attempt, None, None, None)
        record["sealed"] = seal({"progress": progress, "result": result, "error": error})
    try:
        await manager.state_store().put(status_key(message.id), record, ttl)
    except Exception as e:
        log.warning('could not write the status of job "%s" (%s): %s', message.job, message.id, e)
        return
    if state in FINAL_STATES:
        await _announce_final(manager, message.id, state)


def final_channel(job_id: str) -> str:
    return f"haze:final:{job_id}"


async def _announce_final(manager: StatusHost, job_id: str, state: str) -> None:
    """Wake the waiters of a job whose record just became final: in this process, and,
    when the store can push messages, in every other one (an error is logged; their
    slow poll finds the record)."""
    manager.notify_final(job_id)
    store = manager.state_store()
    if isinstance(store, StatusNotifier):
        try:
            await store.notify(final_channel(job_id), state)
        except Exception as e:
            log.warning("could not notify the waiters of job %s (%s); they poll", job_id, e)


def result_for(message: Message, value: Any) -> tuple[Any, str | None]:
    """What the record keeps of ``handle()``'s return value: (result, error)."""
    meta = message.meta or {}
    if "keep" not in meta or value is None:
        return None, None
    try:
        body = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as e:
        why = f"result not kept: handle() returned a value JSON cannot carry ({e})"
    else:
        size = len(body.encode("utf-8"))
        if size <= RESULT_MAX_BYTES:
            return json.loads(body), None
        why = (
            f"result not kept: handle() returned {size} bytes of JSON, over the "
            f"{RESULT_MAX_BYTES}-byte limit; store large results elsewhere and return a key"
        )
    log.error('Job "%s" (%s): %s', message.job, message.id, why)
    return None, why


def error_text(error: BaseException) -> str:
    return error_line(error)[:2000]


async def read(manager: StatusHost, job_id: str, *, decrypt: bool = True) -> JobStatus | None:
    """The record of ``job_id``; an encrypted job's fields are decrypted unless
    ``decrypt`` is False (the dashboard shows them only on request)."""
    if not isinstance(job_id, str) or not job_id:
        raise ValueError(f"Queue.status: expected a job id, got {job_id!r}")
    record = await manager.state_store().get(status_key(job_id))
    opened = None
    if decrypt and isinstance(record, dict) and "sealed" in record:
        opened = manager.open_sealed(job_id, record["sealed"])
    return JobStatus.from_record(record, opened)


async def wait_final(
    manager: StatusHost, job_id: str, timeout: float | None, *, pending_ok: bool = False
) -> JobStatus:
    """Wait until the record is final.

    A store that notifies (``StatusNotifier``: Redis, PostgreSQL) is subscribed to first,
    then the record is read, then re-read on each notification and every
    ``_NOTIFIED_POLL`` seconds. Other stores are polled (10 ms doubling to 500 ms); a
    final write in this process wakes the waiter at once."""
    store = manager.state_store()
    async with contextlib.AsyncExitStack() as stack:
        sub: Subscription | None = None
        if isinstance(store, StatusNotifier):
            try:
                sub = await stack.enter_async_context(store.subscribe(final_channel(job_id)))
            except Exception as e:
                log.debug("Queue.wait: cannot subscribe for job %s (%s); polling", job_id, e)
        return await _wait_loop(manager, job_id, timeout, pending_ok, sub)
    raise AssertionError("unreachable")  # pragma: no cover - the block returns or raises


async def _wait_loop(
    manager: StatusHost,
    job_id: str,
    timeout: float | None,
    pending_ok: bool,
    sub: Subscription | None,
) -> JobStatus:
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    delay = 0.01
    seen = False
    event = manager.final_event(job_id)
    try:
        while True:
            status = await read(manager, job_id)
            if status is not None:
                seen = True
                if status.final:
                    return status
            elif not seen and not pending_ok:
                raise UntrackedJobError(
                    f'job "{job_id}" has no status record: define it with track=True (or '
                    "keep_result=...) to wait for it; or its record expired, or the id is "
                    "not a full job id"
                )
            pause = _NOTIFIED_POLL if sub is not None else delay
            if deadline is not None:
                left = deadline - loop.time()
                if left <= 0:
                    state = status.state if status is not None else "not dispatched yet"
                    raise TimeoutError(
                        f'job "{job_id}" is not finished after {timeout:g}s ({state})'
                    )
                pause = min(pause, left)
            if sub is not None:
                # A final write in this process notifies the store too.
                await sub.receive(pause)
            else:
                try:
                    await asyncio.wait_for(event.wait(), pause)
                except TimeoutError:
                    pass
                if event.is_set():  # a final write in this process: read it now
                    event = manager.final_event(job_id)
                delay = min(delay * 2, 0.5)
    finally:
        manager.drop_final_event(job_id, event)


async def cancel(manager: StatusHost, job_id: str) -> bool:
    """Cancel a job: True when the cancel was recorded, False when its record says it
    already ended. An untracked job's state is unknown here: True."""
    if not isinstance(job_id, str) or not job_id:
        raise ValueError(f"Queue.cancel: expected a job id, got {job_id!r}")
    store = manager.state_store()
    key = status_key(job_id)
    status = JobStatus.from_record(await store.get(key))
    if status is not None and status.final:
        return False
    now = time.time()
    await store.put(cancel_key(job_id), now, CANCEL_TTL)
    await store.put(HINT_KEY, now, CANCEL_TTL)
    manager.cancel_hint(True)
    manager.abort_running(job_id)
    # Read again after the marker: an attempt that starts from now on sees the marker,
    # so a record still waiting can say cancelled (a worker's "running" write that
    # lands after this read is followed by its own marker check).
    record = await store.get(key)
    status = JobStatus.from_record(record)
    if status is not None and status.state in ("queued", "delayed") and isinstance(record, dict):
        record = {**record, "state": "cancelled", "error": "cancelled before it ran"}
        record["updated_at"] = time.time()
        try:
            ttl = await store.ttl(key)
        except Exception:
            ttl = None
        await store.put(key, record, ttl or TRACK_TTL)
        await _announce_final(manager, job_id, "cancelled")
    return True


def cancelled_reason(ctx: JobContext) -> bool:
    signal = ctx._signal
    return signal is not None and isinstance(signal.reason, JobCancelledError)
