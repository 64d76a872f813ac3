"""Queue events (Laravel's ``Queue::before/after/failing/looping``, plus ``worker_idle``,
``queue_busy`` and ``progress``).

>>> from haze import Queue
>>> @Queue.on("failing")
... def report(job, error): ...

Listeners may be sync or async. A failing listener is logged and never breaks a job.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from haze._engine.hooks import Outcome, Run

if TYPE_CHECKING:
    from haze._jobs.definition import JobDefinition

__all__ = ["EVENTS", "AfterEvent", "Events", "events"]

log = logging.getLogger("haze")

#: event -> listener arguments
EVENTS = {
    "before": "(job: JobContext)",
    "after": "(job: JobContext)",
    "failing": "(job: JobContext, error: BaseException)",
    "looping": "(connection: str, queues: list[str] | None)",
    "worker_idle": "(connection: str, queues: list[str] | None)",
    "queue_busy": "(connection: str, queue: str, size: int)",
    "progress": "(job: JobContext, value: int | dict)",
}


class Events:
    """Listener lists per event; an empty list costs nothing on the hot path."""

    def __init__(self) -> None:
        self.before: list[Callable[..., Any]] = []
        self.after: list[Callable[..., Any]] = []
        self.failing: list[Callable[..., Any]] = []
        self.looping: list[Callable[..., Any]] = []
        self.worker_idle: list[Callable[..., Any]] = []
        self.queue_busy: list[Callable[..., Any]] = []
        self.progress: list[Callable[..., Any]] = []

    def on(self, event: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        _check_event(event, "Queue.on")
        if not callable(fn):
            raise TypeError(f"Queue.on({event!r}): expected a callable, got {fn!r}")
        getattr(self, event).append(fn)
        return fn

    def off(self, event: str, fn: Callable[..., Any] | None = None) -> None:
        """Remove ``fn`` from ``event``'s listeners (every listener when None)."""
        _check_event(event, "Queue.off")
        listeners: list[Callable[..., Any]] = getattr(self, event)
        if fn is None:
            listeners.clear()
        elif fn in listeners:
            listeners.remove(fn)

    async def emit(self, event: str, *args: Any) -> None:
        for fn in list(getattr(self, event)):
            try:
                result = fn(*args)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("queue event listener %r for %r failed", fn, event)


def _check_event(event: object, call: str) -> None:
    if not isinstance(event, str) or event not in EVENTS:
        raise ValueError(f"{call}: unknown queue event {event!r}; events: {', '.join(EVENTS)}")


#: Process-wide queue events (``Queue.on``): listeners registered at import time work
#: for every app.
events = Events()


class AfterEvent:
    """Outcome hook: the ``after`` event of a job that succeeded, once the queue has it."""

    def __init__(self, events: Events) -> None:
        self.events = events

    def wants(self, run: Run) -> bool:
        return run.outcome == Outcome.SUCCESS and bool(self.events.after)

    def quiet_for(self, job: JobDefinition[Any]) -> bool:
        return True  # its listeners are read at every claim of the short path

    async def settling(self, run: Run) -> None:
        return None

    async def settled(self, run: Run) -> None:
        if run.outcome == Outcome.SUCCESS and self.events.after:
            await self.events.emit("after", run.ctx)
