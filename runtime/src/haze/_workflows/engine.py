"""haze's own workflow engine: a run is a job whose ``handle()`` replays the workflow.

Each delivery of a run's message replays the handler from the top. A step with a kept
result returns it at once; the first step without one runs and keeps its result
(insert-if-absent). ``sleep`` and ``wait_for_event`` end the attempt (the ``Suspend``
signal) after enqueueing the resume as a delayed message, so no worker slot is held; a
delay past the driver's ``max_delay`` (``MaxDelay``: Cloudflare Queues 12 h, SQS 15
min) arrives early and is delayed again, in hops.

One resume chain per suspension point: the resume message carries the position it
resumes (``wake``) and the id of the message that queued it (``by``); the key
``wake:<position>`` names the message that owns the chain. A replay that reaches a
sleep it does not own (a duplicate delivery) ends without queueing anything, so
duplicates die out instead of multiplying.

A replay reads its run once when it begins (``WorkflowStateStore.kept``: input, final
and display states, every kept step), so a replayed step costs no I/O, and the final
state is read again only where the run suspends. A new step writes nothing before its
call: its first try's result is kept with its name, position and one attempt in ONE
insert-if-absent write (``keep_step``: one statement on SQL, one ``SET NX`` on Redis).
Only a failed try writes more: the name at its position (``mark``), the attempt count
(then one count per further try), the result apart (``keep_result``) and, for good,
the failure. The name at a position is checked against what the replay read and, for
a position it did not see, against what the write finds kept there.

Crash windows (the process dies between two writes):
- step, first try: call -> one write (name + position + result + attempt). Dying
  before the write leaves nothing of the step: redelivery runs it again (at least
  once), and the write is insert-if-absent, so a result is recorded exactly once and
  every replay returns that one. While its first try runs, the step is not in
  ``Workflow.status`` (nothing is kept of it yet).
- step, a try failed: name marked -> try counted -> (call -> count)* -> result kept /
  failure kept. Dying between the mark and the count loses that try's count (attempts
  one short); dying after a call and before the keep runs the step again, and the
  redelivery goes on counting (its mark was read) and keeps the result once.
- cancel during a replay: the final state was read when the replay began, so steps
  already under way go on until the run suspends (read again there) or ends; their
  results are kept but the run stays cancelled (the final state is added once).
- sleep/wait: end kept -> chain owner kept -> state -> resume queued -> message acked.
  Dying anywhere before the ack redelivers this message (same id, so it still owns the
  chain) and it queues the resume again: at worst one duplicate resume, which finds
  the chain owned by another message and ends.
- start: message queued -> run record added. A message whose record is missing adds
  it itself (the message carries the input), so no window loses a run. Each start
  message carries a token and replays the run only if its token is the one kept
  (insert-if-absent) for the run, so concurrent starts of one id run it once.
- event: payload kept (first wins) -> resume queued. The resume replays the run only
  while it waits for that event (else the run finds the kept event at its wait); a
  wait re-reads the event after recording "waiting", so of the resume and the wait at
  least one sees the other: no event is left unread, and an early event does not
  replay a busy run beside itself. Dying before the resume is queued leaves the event
  kept for the wait, or (the run already waiting) for a repeat of ``send_event``.
- dispatch: job queued (with a once key) -> its id kept. Dying between the two queues
  a second copy on the next replay; each copy claims the key (insert-if-absent in the
  batches store, kept as long as batches are) before it runs, so one copy runs.
- end: result kept as the final state (added once) -> message acked.
- dispatch: job queued -> its id kept. Dying between them queues it again on the
  replay (once per run except in that window).
- event: payload kept (first wins) -> resume queued. Dying between them leaves the
  event kept and the run as it was; ``send_event`` again queues the resume.
- failure: final ``failed`` kept -> the workflow's ``failed()``; the engine's failed
  claim reruns the handler if the worker dies first, so ``failed()`` runs at least once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from haze._base.crypto import sealed_error
from haze._base.describe import error_line
from haze._base.errors import ConfigError, WorkflowError
from haze._workflows.run import nondeterminism
from haze.contracts.driver import MaxDelay
from haze.contracts.workflow import HasWorkflowState, KeptRun, StepRetry, WorkflowStateStore

if TYPE_CHECKING:
    from haze._jobs.context import JobContext

__all__ = ["Stopped", "StoreEngine", "Suspend", "now", "set_clock", "workflow_state"]

log = logging.getLogger("haze")

_clock: Callable[[], float] = time.time


def now() -> float:
    """The workflows' clock (epoch seconds): ``time.time`` unless a test set one."""
    return _clock()


def set_clock(clock: Callable[[], float] | None) -> None:
    """Make sleeps and waits measure time with ``clock`` (None: the real clock again).

    >>> # t = [time.time()]; set_clock(lambda: t[0]); t[0] += 2 * 86400  # two days on
    """
    global _clock
    _clock = clock if clock is not None else time.time


class Suspend(BaseException):
    """Ends this attempt of a run: its resume is queued (or owned by another delivery).
    A ``BaseException`` so that ``except Exception`` in a workflow never swallows it."""


class Stopped(BaseException):
    """The run was cancelled (or finished elsewhere): this replay ends quietly."""


def workflow_state(store: object) -> WorkflowStateStore:
    """The run state kept in ``store``; a ``ConfigError`` for a store that cannot keep
    it atomically (a KV store)."""
    if isinstance(store, HasWorkflowState) and getattr(store, "atomic", False):
        return store.workflow_state()
    name = getattr(store, "name", type(store).__name__)
    raise ConfigError(
        f'workflows keep their runs in the queue store, but store "{name}" is not atomic '
        "(a KV store could record a step twice); set store= to a redis, database or "
        "memory store in config/queue.py"
    )


#: Resume: (delay, wake position, owner message id) -> queued.
Resume = Callable[[float, int, str], Awaitable[None]]
#: One try of a step inside its span: (step, position, try, attempt) -> attempt(try).
Traced = Callable[[str, int, int, Callable[[int], Awaitable[str]]], Awaitable[str]]


class StoreEngine:
    """The ``StepEngine`` of one replay of one run, over a ``WorkflowStateStore``."""

    def __init__(
        self,
        state: WorkflowStateStore,
        run_id: str,
        *,
        message_id: str,
        resume: Resume,
        inline: bool = False,
        wake: int | None = None,
        by: str | None = None,
        encrypted: bool = False,
        traced: Traced | None = None,
        kept: KeptRun | None = None,
        workflow: str = "",
    ) -> None:
        self.state = state
        self.run_id = run_id
        self.message_id = message_id
        self.resume = resume
        #: a driver that runs jobs as they are dispatched (sync): sleeps are skipped
        self.inline = inline
        self.wake = wake
        self.by = by
        #: an encrypted workflow: its errors are logged by type only
        self.encrypted = encrypted
        #: runs each try of a step inside its OpenTelemetry span (None: telemetry off)
        self.traced = traced
        self.where = f'workflow "{workflow}" (run {run_id})'
        #: what this replay read once at its start (``WorkflowStateStore.kept``)
        self._kept = kept
        self._running = False
        #: the errors of steps that failed for good, to tell them from a crash's
        self._gave_up: list[BaseException] = []

    def gave_up(self, error: BaseException) -> bool:
        """True when ``error`` is a step's final failure or a broken rule: replaying the
        run again (the workflow's own tries) would end the same way."""
        return isinstance(error, WorkflowError) or any(error is e for e in self._gave_up)

    async def _load(self) -> KeptRun:
        if self._kept is None:
            self._kept = await self.state.kept(self.run_id)
        return self._kept

    async def _live(self) -> None:
        """Before doing anything new: stop when the run had finished (was cancelled) when
        this replay began; a cancel during the replay stops it at its next suspension
        (where the final state is read again), and a result it keeps is ignored."""
        kept = await self._load()
        if kept.final is not None:
            raise Stopped
        if not self._running:
            self._running = True
            if kept.state not in (None, "running"):  # no state kept reads as running
                await self.state.set_state(self.run_id, "running", now())

    async def mark(self, position: int, name: str, kind: str) -> str:
        known = (await self._load()).marks.get(position)
        if known is not None:
            return known[0]
        if kind == "step":
            return name  # a new step keeps its name with its result, in one write (step)
        return await self.state.mark(self.run_id, position, name, kind, now())

    async def _cached(self, name: str) -> str | None:
        """The result this replay read at its start, else the one kept since then."""
        kept = (await self._load()).results.get(name)
        return kept if kept is not None else await self.state.result(self.run_id, name)

    async def step(
        self,
        name: str,
        position: int,
        attempt: Callable[[int], Awaitable[str]],
        retry: StepRetry,
    ) -> str:
        loaded = await self._load()
        kept = loaded.results.get(name)
        if kept is not None:
            return kept
        # a position marked with no result: an earlier try failed, so its attempts are
        # counted apart; else nothing is written before the first try ends
        counted = position in loaded.marks
        if counted and (kept := await self.state.result(self.run_id, name)) is not None:
            return kept
        await self._live()
        for n in range(1, retry.tries + 1):
            if n > 1:
                await asyncio.sleep(retry.delay(n - 1))
            began = now()
            if counted:
                await self.state.started(self.run_id, name, began)
            try:
                text = await self._try(name, position, n, attempt)
            except Exception as e:
                if not counted:
                    counted = True
                    await self._count_first(name, position, began)
                if isinstance(e, WorkflowError) or n >= retry.tries:
                    await self.state.step_failed(self.run_id, name, error_line(e), now())
                    self._gave_up.append(e)
                    raise
                shown = sealed_error(e) if self.encrypted else e
                log.info(
                    'workflow run %s: step "%s" failed (%s); retrying', self.run_id, name, shown
                )
                continue
            if counted:
                return await self.state.keep_result(self.run_id, name, text, now())
            return await self._keep_first(name, position, text, began)
        raise AssertionError("unreachable: the last try raises or returns")

    async def _try(
        self, name: str, position: int, n: int, attempt: Callable[[int], Awaitable[str]]
    ) -> str:
        if self.traced is None:
            return await attempt(n)
        return await self.traced(name, position, n, attempt)

    async def _count_first(self, name: str, position: int, began: float) -> None:
        """The first try of a new step failed: keep its name at its position (checked)
        and count that try."""
        kept = await self.state.mark(self.run_id, position, name, "step", began)
        if kept != name:
            raise nondeterminism(self.where, position, kept, name)
        await self.state.started(self.run_id, name, began)

    async def _keep_first(self, name: str, position: int, text: str, began: float) -> str:
        """The first try of a new step succeeded: keep its name, position, result and
        one attempt in one write; another delivery's record there wins."""
        kept_name, kept = await self.state.keep_step(
            self.run_id, position, name, text, began, now()
        )
        if kept_name != name:
            raise nondeterminism(self.where, position, kept_name, name)
        if kept is None:  # another delivery marked it (a failed try): the result goes apart
            kept = await self.state.keep_result(self.run_id, name, text, now())
        return kept

    async def sleep(self, name: str, position: int, seconds: float) -> None:
        if await self._cached(name) is not None:
            return
        until = float(await self.state.keep(self.run_id, f"until:{name}", repr(now() + seconds)))
        if self.inline or now() >= until:
            await self._live()
            await self.state.keep_result(self.run_id, name, "null", now())
            return
        await self._suspend(position, until, "sleeping", None)

    async def wait_for_event(self, name: str, position: int, timeout: float | None) -> str | None:
        kept = await self._cached(name)
        if kept is not None:
            return kept
        event = await self.state.event(self.run_id, name)
        if event is not None:
            await self._live()
            return await self.state.keep_result(self.run_id, name, event, now())
        until = None
        if timeout is not None:
            end = await self.state.keep(self.run_id, f"until:{name}", repr(now() + timeout))
            until = float(end)
            if now() >= until:
                await self._live()
                return await self.state.keep_result(self.run_id, name, "null", now())
        await self._suspend(position, until, "waiting", name)
        # _suspend returns only when the event came while the wait was being recorded
        # (its resume found no wait yet and ended): go on with it here
        await self.state.set_state(self.run_id, "running", now())
        event = await self.state.event(self.run_id, name)
        return await self.state.keep_result(self.run_id, name, event or "null", now())

    async def _suspend(
        self, position: int, until: float | None, state: str, event: str | None
    ) -> None:
        """Queue the resume of the wait at ``position`` (when this delivery owns its
        chain) and end the attempt."""
        key, mine = f"wake:{position}", self.message_id
        if self.wake == position and self.by is not None and self.by != mine:
            await self.state.replace(self.run_id, key, self.by, mine)  # the next hop
        if await self.state.keep(self.run_id, key, mine) != mine:
            raise Suspend  # another delivery owns this wait's resume
        if await self.state.final_state(self.run_id) is not None:
            raise Stopped
        await self.state.set_state(self.run_id, state, now(), until, event)
        if event is not None and await self.state.event(self.run_id, event) is not None:
            return  # the event's resume read the state before the write above
        # sync has no delayed messages (it would run the resume now, forever): there a
        # wait ends only by its event
        if until is not None and not self.inline:
            await self.resume(max(0.0, until - now()), position, mine)
        raise Suspend

    async def gather(self, branches: Sequence[Callable[[], Awaitable[Any]]]) -> list[Any]:
        results = await asyncio.gather(*(b() for b in branches), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        # a real failure first; else a stop; else a suspend (the other branches have
        # kept their results, and the resume replays the gather)
        for kind in (Exception, Stopped, BaseException):
            for e in errors:
                if isinstance(e, kind):
                    raise e
        return list(results)

    async def dispatch_once(
        self, name: str, position: int, send: Callable[[], Awaitable[str]]
    ) -> str:
        kept = await self._cached(name)
        if kept is None:
            await self._live()
            job_id = await send()
            kept = await self.state.keep_result(self.run_id, name, json.dumps(job_id), now())
        return str(json.loads(kept))


def hop(driver: object, delay: float) -> float:
    """The part of ``delay`` one message can wait on ``driver`` (its ``max_delay``)."""
    if isinstance(driver, MaxDelay):
        return min(delay, driver.max_delay)
    return delay


def context_state(ctx: JobContext) -> WorkflowStateStore:
    return workflow_state(ctx.app.manager.state_store())
