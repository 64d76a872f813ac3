"""Testing helpers: ``Queue.fake()`` records dispatches instead of queueing them.

>>> fake = Queue.fake()
>>> # await send_invoice.dispatch({"invoice_id": 1})
>>> # fake.assert_dispatched(send_invoice, lambda p: p["invoice_id"] > 0)
>>> # await fake.drain()          # runs them through the real pipeline
>>> Queue.restore()

With pytest, use the ``queue_fake`` fixture (installed with haze), which fakes and
restores around each test.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from haze.drivers.memory import MemoryDriver
from haze.stores.memory import MemoryStore

if TYPE_CHECKING:
    from haze._jobs.definition import JobDefinition
    from haze._kernel.message import Message
    from haze._orchestration.batches import Batch, PendingBatch
    from haze._orchestration.chains import PendingChain

__all__ = ["FakeQueue", "RecordedJob"]

_active_fake: FakeQueue | None = None


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


class _FakeDriver(MemoryDriver):
    """Runs drained jobs with every delay and backoff ignored."""

    def _push(self, queue: str, body: str, used: int, delay: float) -> None:
        super()._push(queue, body, used, 0.0)


def _name_of(job: object) -> str:
    from haze._jobs.definition import JobDefinition, PendingDispatch

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
        self._drivers: dict[str, _FakeDriver] = {}

    # -- recording (called by the manager) -----------------------------------------

    def record(self, job: JobDefinition[Any], message: Message, delay: float) -> None:
        self.dispatched.append(RecordedJob(job, message, delay))

    def record_skipped(self, job: JobDefinition[Any], message: Message) -> None:
        self.skipped.append(RecordedJob(job, message))

    def record_chain(self, chain: PendingChain, links: list[dict[str, Any]], chain_id: str) -> None:
        self.chains.append(links)

    def record_batch(self, pending: PendingBatch, spec: dict[str, Any]) -> Batch:
        import time

        from haze._kernel.message import new_id
        from haze._orchestration.batches import Batch

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
        from haze._jobs.definition import PendingDispatch

        expected: list[tuple[str, Any, bool]] = []
        for j in jobs:
            if isinstance(j, PendingDispatch):
                expected.append((j.job.name, j.job.to_wire(j.payload), True))
            else:
                expected.append((_name_of(j), None, False))

        def plain(link: dict[str, Any]) -> Any:
            if "enc" not in link:
                return link.get("payload")
            from haze._app.app import use_app
            from haze._kernel.crypto import unseal_link

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

    # -- running ---------------------------------------------------------------------

    def _driver(self, connection: str) -> _FakeDriver:
        d = self._drivers.get(connection)
        if d is None:
            d = self._drivers[connection] = _FakeDriver(connection, {})
        return d

    @property
    def failed(self) -> list[Any]:
        """Jobs that failed for good during ``drain()``."""
        out: list[Any] = []
        for d in self._drivers.values():
            out.extend(d.failed._jobs.values())
        return out

    async def drain(self) -> int:
        """Run the recorded jobs in dispatch order through the real pipeline (middleware,
        release, retries; delays ignored). Jobs they dispatch are recorded, not run: call
        ``drain()`` again to go on. Returns the number of attempts run."""
        from haze._app.app import use_app
        from haze._kernel.message import encode

        manager = use_app().manager
        todo = [r for r in self.dispatched if not r.drained]
        for r in todo:
            r.drained = True
            d = self._driver(r.connection or manager.app.queue_config.default)
            d._push(r.message.queue, encode(r.message), r.message.attempts, 0.0)
        runs = 0
        progress = True
        while progress:
            progress = False
            for d in list(self._drivers.values()):
                job = d.reserve_nowait(None)
                while job is not None:
                    progress = True
                    runs += 1
                    await manager.process(job, d)
                    job = d.reserve_nowait(None)
        return runs


def install() -> FakeQueue:
    global _active_fake
    _active_fake = FakeQueue()
    return _active_fake


def uninstall() -> None:
    global _active_fake
    _active_fake = None
