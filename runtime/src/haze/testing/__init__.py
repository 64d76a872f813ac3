"""Testing helpers: ``Queue.fake()`` records dispatches instead of queueing them.

>>> fake = Queue.fake()
>>> # await send_invoice.dispatch({"invoice_id": 1})
>>> # fake.assert_dispatched(send_invoice, lambda p: p["invoice_id"] > 0)
>>> # await fake.drain()          # runs them through the real pipeline
>>> Queue.restore()

With pytest, use the ``queue_fake`` fixture (installed with haze), which fakes and
restores around each test.

The fake is a recorder set on an App (``app.recorder``, a ``DispatchRecorder``): the
engine records on it instead of queueing, per app, so two apps can each have their own
fake. ``Queue.fake()`` sets it on the current app; made before any app is current (a
fixture that runs before the test's app is entered), it goes on the implicit default
app and on each app entered until ``Queue.restore()``.
"""

from __future__ import annotations

import inspect
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from haze._app.app import App, use_app
from haze._base import current
from haze._base.crypto import unseal_link
from haze._base.message import Message, decode, encode, new_id
from haze._failed.memory import MemoryFailedJobs
from haze._jobs.definition import JobDefinition, PendingDispatch
from haze._orchestration.batches import Batch, PendingBatch
from haze._orchestration.chains import PendingChain
from haze._workers.delivery import Delivery
from haze._workflows.api import Workflow
from haze._workflows.engine import set_clock
from haze.contracts.driver import Driver, FailedJob, Reserved
from haze.contracts.workflow import WorkflowStatus
from haze.stores.memory import MemoryStore

__all__ = ["FakeQueue", "RecordedJob", "WorkflowClock", "run_workflow"]

#: The fake ``Queue.fake()`` made last (None after ``Queue.restore()``). Bookkeeping
#: for tests and the pytest plugin: the engine reads ``App.recorder``, never this.
_active_fake: FakeQueue | None = None
#: Every fake ``Queue.fake()`` made since the last ``Queue.restore()``.
_installed: list[FakeQueue] = []
#: The fake made while no app was current: it also fakes each app entered later.
_pending: FakeQueue | None = None


@dataclass
class RecordedJob:
    """One recorded dispatch."""

    job: JobDefinition[Any]
    message: Message
    delay: float = 0.0
    drained: bool = False

    @property
    def name(self) -> str:
        return self.job.name

    @property
    def payload(self) -> Any:
        return self.job.from_wire(self.message.payload)

    @property
    def queue(self) -> str:
        return self.message.queue

    @property
    def connection(self) -> str | None:
        return self.message.connection


@dataclass
class RecordedBatch:
    """A batch recorded by the fake: ``name``, ``jobs`` (pending dispatches or chains)."""

    batch: Batch
    pending: PendingBatch
    spec: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def name(self) -> str | None:
        return self.pending.batch_name

    @property
    def jobs(self) -> list[Any]:
        return self.pending.jobs

    @property
    def id(self) -> str:
        return self.batch.id


class _DrainQueue(Driver):
    """The queue ``drain()`` runs one connection's recorded jobs from: a ``Driver`` whose
    every delay and backoff is ignored, so a retry or a release runs again at once."""

    remote = False
    local_callbacks = True
    inline = False
    max_message_size: int | None = None
    outage_errors: tuple[type[BaseException], ...] = ()

    def __init__(self, name: str) -> None:
        self.name = name
        #: (queue, body, attempts used): what ``reserve`` hands out next, in order.
        self._ready: deque[tuple[str, str, int]] = deque()
        self._failed = MemoryFailedJobs()

    @property
    def failed(self) -> MemoryFailedJobs:
        return self._failed

    def push(self, queue: str, body: str, used: int) -> None:
        self._ready.append((queue, body, used))

    def reserve_nowait(self) -> Reserved | None:
        if not self._ready:
            return None
        queue, body, used = self._ready.popleft()
        try:
            message: Message | None = decode(body)
            error: BaseException | None = None
        except Exception as e:
            message, error = None, e
        return Reserved(message, used + 1, body, queue, time.time(), error)

    async def enqueue(self, body: str, message: Message, delay: float) -> None:
        self.push(message.queue, body, message.attempts)

    async def enqueue_many(self, items: Sequence[tuple[str, Message, float]]) -> None:
        for body, message, _ in items:
            self.push(message.queue, body, message.attempts)

    async def reserve(self, queues: Sequence[str], wait: float) -> Reserved | None:
        return self.reserve_nowait()

    async def ack(self, job: Reserved) -> bool:
        return True

    async def release(self, job: Reserved, delay: float, *, consume_attempt: bool) -> bool:
        self.push(job.queue, job.body, job.attempt if consume_attempt else job.attempt - 1)
        return True

    async def fail(self, job: Reserved, failed: FailedJob) -> bool:
        await self._failed.record(failed)
        return True

    async def size(self, queue: str) -> int:
        return sum(1 for q, _, _ in self._ready if q == queue)

    async def purge(self, queue: str) -> int:
        n = await self.size(queue)
        self._ready = deque(item for item in self._ready if item[0] != queue)
        return n

    async def close(self) -> None:
        self._ready.clear()


def _name_of(job: object) -> str:
    if isinstance(job, str):
        return job
    if isinstance(job, JobDefinition):
        return job.name
    if isinstance(job, PendingDispatch):
        return job.job.name
    raise TypeError(f"expected a job, a job name or job.with_(...), got {job!r}")


def _matches(predicate: Callable[..., Any] | None, payload: Any, extra: Any = None) -> bool:
    if predicate is None:
        return True
    try:
        n = len(inspect.signature(predicate).parameters)
    except (TypeError, ValueError):
        n = 1
    return bool(predicate(payload, extra) if n >= 2 else predicate(payload))


class FakeQueue:
    """The fake installed by ``Queue.fake()``; every assertion raises ``AssertionError``."""

    def __init__(self) -> None:
        self.store = MemoryStore("fake")
        self.dispatched: list[RecordedJob] = []
        self.skipped: list[RecordedJob] = []
        self.batches: list[RecordedBatch] = []
        self.chains: list[list[dict[str, Any]]] = []
        self._queues: dict[str, _DrainQueue] = {}
        self._failed: list[FailedJob] = []
        #: The apps this fake is set on (``app.recorder``).
        self._apps: list[App] = []

    # -- recording (called by the manager) -----------------------------------------

    def record(self, job: JobDefinition[Any], message: Message, delay: float) -> None:
        self.dispatched.append(RecordedJob(job, message, delay))

    def record_skipped(self, job: JobDefinition[Any], message: Message) -> None:
        self.skipped.append(RecordedJob(job, message))

    def record_chain(self, chain: PendingChain, links: list[dict[str, Any]], chain_id: str) -> None:
        self.chains.append(links)

    def record_batch(self, pending: PendingBatch, spec: dict[str, Any]) -> Batch:
        n = sum(len(j) if isinstance(j, list) else 1 for j in pending.jobs)
        batch = Batch(
            id=new_id(),
            name=pending.batch_name,
            total=n,
            pending=n,
            created_at=time.time(),
            jobs=list(pending.jobs),
        )
        self.batches.append(RecordedBatch(batch, pending, spec))
        return batch

    # -- assertions ----------------------------------------------------------------

    def recorded(
        self, job: object, predicate: Callable[..., Any] | None = None
    ) -> list[RecordedJob]:
        """Recorded dispatches of ``job`` whose payload matches ``predicate``."""
        name = _name_of(job)
        return [r for r in self.dispatched if r.name == name and _matches(predicate, r.payload, r)]

    def assert_dispatched(
        self, job: object, predicate: Callable[..., Any] | None = None, *, times: int | None = None
    ) -> None:
        found = self.recorded(job, predicate)
        name = _name_of(job)
        if times is not None and len(found) != times:
            raise AssertionError(
                f'expected job "{name}" to be dispatched {times} time(s), it was {len(found)}'
            )
        if not found:
            others = sorted({r.name for r in self.dispatched}) or ["nothing"]
            what = "matching the predicate " if predicate else ""
            raise AssertionError(
                f'expected job "{name}" to be dispatched {what}but it was not '
                f"(dispatched: {', '.join(others)})"
            )

    def assert_not_dispatched(
        self, job: object, predicate: Callable[..., Any] | None = None
    ) -> None:
        found = self.recorded(job, predicate)
        if found:
            raise AssertionError(
                f'expected job "{_name_of(job)}" not to be dispatched, but it was '
                f"{len(found)} time(s)"
            )

    def assert_count(self, n: int) -> None:
        if len(self.dispatched) != n:
            raise AssertionError(f"expected {n} dispatched job(s), got {len(self.dispatched)}")

    def assert_nothing_dispatched(self) -> None:
        self.assert_count(0)

    def assert_chained(self, jobs: Sequence[object]) -> None:
        """A chain of these jobs was dispatched (names; ``with_(...)`` also compares payload)."""
        expected: list[tuple[str, Any, bool]] = []
        for j in jobs:
            if isinstance(j, PendingDispatch):
                expected.append((j.job.name, j.job.to_wire(j.payload), True))
            else:
                expected.append((_name_of(j), None, False))

        def plain(link: dict[str, Any]) -> Any:
            if "enc" not in link:
                return link.get("payload")
            return unseal_link(use_app(), link)  # an encrypted job's link

        def same(links: list[dict[str, Any]]) -> bool:
            if len(links) != len(expected):
                return False
            for link, (name, payload, check) in zip(links, expected, strict=True):
                if link.get("job") != name or (check and plain(link) != payload):
                    return False
            return True

        if not any(same(c) for c in self.chains):
            seen = [[link.get("job", "<batch>") for link in c] for c in self.chains] or "none"
            raise AssertionError(
                f"expected a chain {[e[0] for e in expected]} to be dispatched; chains: {seen}"
            )

    def assert_batched(self, predicate: Callable[[RecordedBatch], Any]) -> None:
        if not any(predicate(b) for b in self.batches):
            raise AssertionError(
                f"expected a batch matching the predicate; {len(self.batches)} batch(es) recorded"
            )

    def assert_batch_count(self, n: int) -> None:
        if len(self.batches) != n:
            raise AssertionError(f"expected {n} batch(es), got {len(self.batches)}")

    def assert_nothing_batched(self) -> None:
        if self.batches:
            raise AssertionError(f"expected no batch, got {len(self.batches)}")

    def assert_pushed_unique(
        self, job: object, predicate: Callable[..., Any] | None = None
    ) -> None:
        """The unique job was queued exactly once (holding its lock)."""
        found = self.recorded(job, predicate)
        name = _name_of(job)
        if len(found) != 1:
            raise AssertionError(
                f'expected unique job "{name}" to be queued exactly once, it was {len(found)} '
                "time(s)"
            )
        if found[0].message.unique is None:
            raise AssertionError(f'job "{name}" was queued, but not as a unique job')

    def assert_skipped(self, job: object, predicate: Callable[..., Any] | None = None) -> None:
        """A duplicate dispatch of the unique job was skipped."""
        name = _name_of(job)
        if not any(r.name == name and _matches(predicate, r.payload, r) for r in self.skipped):
            raise AssertionError(f'expected a dispatch of unique job "{name}" to be skipped')

    # -- installing -----------------------------------------------------------------

    def install(self, app: App) -> None:
        """Record ``app``'s dispatches on this fake (until :meth:`uninstall`)."""
        app.recorder = self
        if app not in self._apps:
            self._apps.append(app)

    def uninstall(self) -> None:
        """Give the apps this fake is set on back their real connections."""
        for app in self._apps:
            if app.recorder is self:
                app.recorder = None
        self._apps.clear()

    def _adopt(self, app: object) -> None:
        # An app entered after a Queue.fake() that found no current app: fake it too,
        # unless a fake of its own is set already.
        if isinstance(app, App) and app.recorder is None:
            self.install(app)

    def _app(self) -> App:
        """The app to drain through: the current one, if this fake is set on it."""
        app = use_app()
        if app.recorder is not self:
            mine = [a for a in self._apps if a.recorder is self]
            if mine:
                return mine[-1]
        return app

    # -- running ---------------------------------------------------------------------

    def _queue(self, connection: str) -> _DrainQueue:
        q = self._queues.get(connection)
        if q is None:
            q = self._queues[connection] = _DrainQueue(connection)
        return q

    @property
    def failed(self) -> list[FailedJob]:
        """Jobs that failed for good during ``drain()``."""
        return list(self._failed)

    async def drain(self) -> int:
        """Run the recorded jobs in dispatch order through the real pipeline (middleware,
        release, retries; delays ignored). Jobs they dispatch are recorded, not run: call
        ``drain()`` again to go on. Returns the number of attempts run."""
        manager = self._app().manager
        default = manager.app.queue_config.default
        for r in self.dispatched:
            if not r.drained:
                r.drained = True
                q = self._queue(r.connection or default)
                q.push(r.message.queue, encode(r.message), r.message.attempts)
        deliveries = {name: Delivery(manager, name) for name in self._queues}
        runs = 0
        progress = True
        while progress:
            progress = False
            for name, q in list(self._queues.items()):
                job = q.reserve_nowait()
                while job is not None:
                    progress = True
                    runs += 1
                    await deliveries[name].run(job, q)
                    job = q.reserve_nowait()
        self._failed = [job for q in self._queues.values() for job in await q.failed.list()]
        return runs


def install() -> FakeQueue:
    """``Queue.fake()``: a new fake on the current app, replacing any fake it had. With
    no app current (a fixture faked before the test entered its app), the fake is set
    on the implicit default app and on every app entered until ``Queue.restore()``."""
    global _active_fake, _pending
    fake = FakeQueue()
    app = current.explicit_app()
    if app is not None:
        fake.install(cast(App, app))
    else:
        if _pending is not None:
            current.remove_enter_hook(_pending._adopt)
        _pending = fake
        current.add_enter_hook(fake._adopt)
        fake.install(cast(App, current.default_app()))
    _installed.append(fake)
    _active_fake = fake
    return fake


def uninstall() -> None:
    """``Queue.restore()``: every app faked since the last restore queues for real again."""
    global _active_fake, _pending
    if _pending is not None:
        current.remove_enter_hook(_pending._adopt)
        _pending = None
    for fake in _installed:
        fake.uninstall()
    _installed.clear()
    _active_fake = None


# --------------------------------------------------------------------------- workflows


class WorkflowClock:
    """The time a workflow test runs on: sleeps and waits move it forward at once.

    >>> clock = WorkflowClock(start=0)
    >>> clock.advance(2 * 86400)
    >>> clock.now(), clock.slept
    (172800.0, 172800.0)
    """

    def __init__(self, start: float | None = None) -> None:
        # whole seconds, so that "resume_at - now" adds up to exactly what was slept
        self._now = float(int(time.time()) if start is None else start)
        #: Seconds skipped so far (the sleeps and the waits that timed out).
        self.slept = 0.0

    def now(self) -> float:
        """The current time on this clock (epoch seconds)."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward."""
        if seconds > 0:
            self._now += seconds
            self.slept += seconds


async def run_workflow(
    wf: Workflow,
    /,
    *,
    events: dict[str, Any] | None = None,
    clock: WorkflowClock | None = None,
    id: str | None = None,
    max_rounds: int = 10_000,
    **input: Any,
) -> WorkflowStatus:
    """Run ``wf`` to its end inside a test and return its final ``WorkflowStatus``.

    The run goes through the real engine on the current app's fake queue (made here
    when the app has none). Sleeps do not wait: ``clock`` (a :class:`WorkflowClock`,
    one is made when not given) jumps to each resume. ``events`` are delivered when
    the run first waits for each; a wait whose event is not given times out. Jobs the
    run dispatches run too, and stay recorded on the fake (``assert_dispatched``). A run that
    could never end (it waits, without a timeout, for an event not given) raises
    ``AssertionError`` naming the wait.

    >>> # status = await run_workflow(payment, order_id="A-1", events={"paid": {}})
    >>> # assert status.state == "done" and status.steps[0].name == "intent"
    """
    app = use_app()
    fake = app.recorder if isinstance(app.recorder, FakeQueue) else None
    made = fake is None
    if fake is None:
        fake = FakeQueue()
        fake.install(app)
    clock = clock if clock is not None else WorkflowClock()
    set_clock(clock.now)
    try:
        rid = await Workflow.start(wf, id=id, **input)
        return await _run_to_end(fake, rid, wf.name, dict(events or {}), clock, max_rounds)
    finally:
        set_clock(None)
        if made:
            fake.uninstall()


async def _run_to_end(
    fake: FakeQueue,
    rid: str,
    name: str,
    events: dict[str, Any],
    clock: WorkflowClock,
    max_rounds: int,
) -> WorkflowStatus:
    for _ in range(max_rounds):
        ran = await fake.drain()
        st = await Workflow.status(rid)
        if st is None:
            raise AssertionError(f'the run {rid} of workflow "{name}" was not recorded')
        if st.finished:
            while await fake.drain():  # the jobs it dispatched run too, as on a worker
                pass
            return st
        if st.state == "waiting" and st.waiting_for in events:
            await Workflow.send_event(rid, st.waiting_for, events.pop(st.waiting_for))
            continue
        if st.resume_at is not None and st.resume_at > clock.now():
            clock.advance(st.resume_at - clock.now())
            continue
        if not ran:
            what = f'event "{st.waiting_for}"' if st.waiting_for else "nothing"
            raise AssertionError(
                f'the run {rid} of workflow "{name}" is {st.state}, waiting for {what} with '
                "no timeout, and nothing is left to run: give the event in events={...}"
            )
    raise AssertionError(f'the run {rid} of workflow "{name}" did not end in {max_rounds} rounds')
