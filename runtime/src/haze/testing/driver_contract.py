"""The driver contract: what every haze queue driver must do, as tests a driver's own
suite inherits (River's ``riverdrivertest``, for haze).

A third-party driver proves itself by subclassing ``DriverContract`` in its tests::

    from typing import Any, ClassVar

    from haze.testing.driver_contract import DriverContract


    class TestMyDriver(DriverContract):
        connection: ClassVar[dict[str, Any]] = {"driver": "mine", "url": "mine://127.0.0.1"}

Each ``test_*`` method builds an ``App`` whose default connection ``"main"`` is that
connection, opens it, and talks to its driver directly: ``enqueue`` → ``reserve`` →
``ack`` / ``release`` / ``fail``, the failed-job store, ``size`` and ``purge``, and each
optional capability (``Leased``, ``Backlog``, ``QueueInspector``, ``LocalQueue``,
``BatchConsumer``, ``Interruptible``) the driver declares. A test of a capability the
driver does not declare is skipped, saying which; nothing is skipped for being slow.
Every test runs its own event loop, so no async pytest plugin is needed.

Hooks a subclass may set or override: ``connection`` (or ``connection_options(tmp_path)``
when it depends on the test's directory), ``app_options(tmp_path)`` (more ``App(...)``
keywords, e.g. a database config), ``queues`` (two queue names the backend accepts),
``lease_options`` (a short lease for the ``Leased`` tests), ``ordered`` (False when the
backend does not keep first-in-first-out order within a queue) and ``patience`` (seconds
a ready message may take to be claimed).

Each test expects both queues and the failed-job store empty, and leaves them so when it
passes; give each test a fresh backend (a key prefix, new tables) if one may fail.

The methods can be called without pytest's runner too: ``TestMyDriver().test_enqueue_many(
tmp_path)`` raises ``AssertionError`` when the driver breaks the contract. A driver's own
extra tests can use the same harness: ``@contract_test(needs=...)`` on an ``async def
test_...(self, d: DriverUnderTest)``, where ``sent = await d.put()`` queues a fresh
message and ``await d.expect(sent, attempt=1)`` claims it back, checks it is intact on
that attempt and acks it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest

from haze._app.app import App
from haze._app.config import define_queue_config
from haze._base.errors import PayloadTooLargeError
from haze._base.message import decode, encode
from haze._jobs.definition import define_job
from haze.contracts.driver import (
    AcksInClaim,
    Advises,
    Backlog,
    BatchConsumer,
    Concurrent,
    DelayStep,
    Driver,
    FailedJobStore,
    IdlePolling,
    Interruptible,
    LeaseBudget,
    Leased,
    LocalQueue,
    QueueInspector,
    UncountedQueues,
)
from haze.testing._driver_harness import (
    CAPABILITIES,
    DriverUnderTest,
    _is_protocol_class,
    _lease_of,
    _main_driver,
    contract_test,
    failure_of,
    same_message,
)

__all__ = [
    "CAPABILITIES",
    "DriverContract",
    "DriverUnderTest",
    "contract_test",
    "failure_of",
    "same_message",
]

#: The job the size-limit test dispatches; it is refused before anything is queued, so
#: it never runs.
_TOO_BIG_NAME = "haze_driver_contract_too_big"


async def _never_runs(payload: Any) -> None:
    """The contract dispatches this job only to see it refused."""


_TOO_BIG = define_job(name=_TOO_BIG_NAME)(_never_runs)


class DriverContract:
    """Subclass it in a driver's test suite; see the module docs for the hooks."""

    #: The options of the connection under test: ``{"driver": "mine", ...}``.
    connection: ClassVar[dict[str, Any]] = {}
    #: Two queue names the backend accepts (a backend that needs its queues created
    #: beforehand creates these).
    queues: ClassVar[tuple[str, str]] = ("contract_a", "contract_b")
    #: Options merged into ``connection`` for the lease tests: a lease short enough to
    #: watch expire.
    lease_options: ClassVar[dict[str, Any]] = {"retry_after": 1}
    #: False when the backend does not keep first-in-first-out order within a queue
    #: (SQS standard queues): the order test is skipped.
    ordered: ClassVar[bool] = True
    #: Seconds a ready message may take to be claimed (a polling backend, an HTTP API).
    patience: ClassVar[float] = 10.0

    def connection_options(self, tmp_path: Path) -> dict[str, Any]:
        """The connection under test; override when it depends on ``tmp_path``."""
        return dict(self.connection)

    def app_options(self, tmp_path: Path) -> dict[str, Any]:
        """More ``App(...)`` keywords (a database config the connection names ...)."""
        return {}

    def make_app(self, tmp_path: Path, extra: dict[str, Any] | None = None) -> App:
        """The App of one test: ``"main"`` is the connection under test, and the lock
        store is in memory so the test needs no cache backend."""
        main = {**self.connection_options(tmp_path), **(extra or {})}
        assert main.get("driver"), (
            f"{type(self).__name__}: set connection = {{'driver': ..., ...}} (the connection "
            "under test) or override connection_options()"
        )
        config = define_queue_config(default="main", connections={"main": main}, store="memory")
        return App(queue=config, **self.app_options(tmp_path))

    async def run_contract(
        self,
        tmp_path: Path,
        body: Callable[[Any, DriverUnderTest], Awaitable[None]],
        *,
        needs: type | None = None,
        lease: bool = False,
    ) -> None:
        """Open the app, check the driver can take the test, run ``body``
        (on an app with ``lease_options`` when ``lease``: opened once the driver is known
        to be ``Leased``, since another driver may not take those options)."""
        app = self.make_app(tmp_path)
        async with app:
            driver = await _main_driver(app)
            if driver.inline:
                pytest.skip(f"{driver.name}: an inline driver runs jobs inside dispatch()")
            if needs is not None and not isinstance(driver, needs):
                pytest.skip(f"{type(driver).__name__} does not declare {needs.__name__}")
            if not lease:
                await self._run_body(app, driver, body)
                return
        app = self.make_app(tmp_path, self.lease_options)
        async with app:
            await self._run_body(app, await _main_driver(app), body)

    async def _run_body(
        self, app: App, driver: Driver, body: Callable[[Any, DriverUnderTest], Awaitable[None]]
    ) -> None:
        # No purge first: SQS allows one purge a minute, and the purge test needs its own.
        await body(
            self, DriverUnderTest(app, driver, self.queues[0], self.queues[1], self.patience)
        )

    # ---------------------------------------------------------------- the protocol

    @contract_test()
    async def test_declares_the_driver_protocol(self, d: DriverUnderTest) -> None:
        """The attributes every driver has, with sane values, and a failed-job store."""
        driver = d.driver
        assert isinstance(driver, Driver), f"{type(driver).__name__} misses Driver members"
        assert driver.name == "main", "a driver is named after its connection"
        assert isinstance(driver.failed, FailedJobStore)
        assert driver.max_message_size is None or driver.max_message_size > 0
        assert isinstance(driver.outage_errors, tuple)
        assert all(issubclass(e, BaseException) for e in driver.outage_errors)
        for flag in (driver.remote, driver.local_callbacks, driver.inline):
            assert isinstance(flag, bool)
        if isinstance(driver, Leased):
            assert driver.heartbeat_interval > 0
        if isinstance(driver, Concurrent):
            assert driver.concurrency >= 1
        if isinstance(driver, DelayStep):
            assert driver.delay_step > 0
        if isinstance(driver, IdlePolling):
            assert 0 < driver.sleep <= driver.max_sleep
        if isinstance(driver, UncountedQueues):
            note = driver.counts_note
            assert isinstance(note, str) and note and "\n" not in note

    @contract_test()
    async def test_declared_capabilities_are_implemented(self, d: DriverUnderTest) -> None:
        """A capability Protocol the driver subclasses has each of its methods defined by
        the driver: a misspelt one would fall back to the Protocol's empty stub."""
        cls = type(d.driver)
        own = [c for c in cls.__mro__ if c not in CAPABILITIES and c not in (Driver, object)]
        own = [c for c in own if not _is_protocol_class(c)]
        for capability in (c for c in CAPABILITIES if c in cls.__mro__):
            for member, value in vars(capability).items():
                if member.startswith("_") or not callable(value):
                    continue
                assert any(member in vars(c) for c in own), (
                    f"{cls.__name__} declares {capability.__name__} but does not define {member}()"
                )

    @contract_test()
    async def test_enqueue_reserve_ack(self, d: DriverUnderTest) -> None:
        """A message comes back intact as attempt 1, and is gone once acked."""
        sent = await d.put(payload={"text": "héllo ✓", "n": [1, 2.5, None, True]})
        await d.expect(sent, attempt=1, why="a first claim")
        await d.nothing()
        await d.size_is(d.queue, 0)

    @contract_test()
    async def test_enqueue_many(self, d: DriverUnderTest) -> None:
        """``enqueue_many`` queues every message (none on an empty list)."""
        await d.driver.enqueue_many([])
        sent = [d.message(payload={"n": i}) for i in range(3)]
        await d.driver.enqueue_many([(encode(m), m, 0.0) for m in sent])
        await d.size_is(d.queue, 3)
        got = [await d.take() for _ in sent]
        assert {j.message.id for j in got if j.message} == {m.id for m in sent}
        await d.ack(*got)
        await d.nothing()

    @contract_test()
    async def test_first_in_first_out_within_a_queue(self, d: DriverUnderTest) -> None:
        """Ready messages of one queue are claimed in the order they were queued."""
        if not self.ordered:
            pytest.skip(f"{type(self).__name__}.ordered is False: the backend keeps no order")
        for sent in [await d.put(payload={"n": i}) for i in range(5)]:
            await d.expect(sent)  # the next claim is the next message queued

    @contract_test()
    async def test_queues_are_isolated_and_claimed_in_priority_order(
        self, d: DriverUnderTest
    ) -> None:
        """A claim reads only the queues it names, the first named first."""
        low = await d.put(d.queue)
        await d.nothing([d.other])
        await d.size_is(d.other, 0)
        high = await d.put(d.other)
        first = await d.expect(high, [d.other, d.queue], ack=False)
        await d.expect(low, [d.other, d.queue])
        await d.ack(first)

    @contract_test()
    async def test_delayed_message_waits_its_delay(self, d: DriverUnderTest) -> None:
        """A delayed message counts in ``size`` at once but is claimed only once due."""
        delay = 2.0
        started = time.monotonic()
        sent = await d.put(delay=delay)
        await d.size_is(d.queue, 1, "size counts delayed messages")
        await d.nothing(wait=0.5)
        await d.expect(sent, within=delay + self.patience)
        waited = time.monotonic() - started
        # Only a lower bound: a slow machine makes the wait longer, never shorter.
        assert waited >= delay - 0.25, f"claimed after {waited:.2f}s, before its {delay}s delay"

    # ---------------------------------------------------------------- settling

    @contract_test()
    async def test_release_consuming_an_attempt(self, d: DriverUnderTest) -> None:
        """A retry (``consume_attempt=True``) puts the same message back as the next attempt."""
        sent = await d.put()
        first = await d.take()
        assert await d.driver.release(first, 0.0, consume_attempt=True) is True
        await d.expect(sent, attempt=2, why="a retried job's next claim")
        await d.nothing()

    @contract_test()
    async def test_release_without_consuming_an_attempt(self, d: DriverUnderTest) -> None:
        """``job.release()`` (``consume_attempt=False``) puts it back as the same attempt."""
        sent = await d.put()
        first = await d.take()
        assert await d.driver.release(first, 0.0, consume_attempt=False) is True
        await d.expect(sent, attempt=1, why="a release is not an attempt")

    @contract_test()
    async def test_release_with_a_delay(self, d: DriverUnderTest) -> None:
        """A released job waits its delay before it can be claimed again."""
        delay = 2.0
        sent = await d.put()
        first = await d.take()
        started = time.monotonic()
        assert await d.driver.release(first, delay, consume_attempt=True) is True
        await d.size_is(d.queue, 1, "a job waiting out its backoff counts in size")
        await d.nothing(wait=0.5)
        await d.expect(sent, within=delay + self.patience)
        waited = time.monotonic() - started
        assert waited >= delay - 0.25, f"claimed after {waited:.2f}s, before its {delay}s delay"

    @contract_test()
    async def test_attempts_count_across_redeliveries(self, d: DriverUnderTest) -> None:
        """Attempts start after the tries the message already used (``Message.attempts``)
        and count every retry, while releases do not count."""
        sent = await d.put(attempts=2)
        for attempt, why, consume in (
            (3, "a message that used 2 tries", True),
            (4, "after a retry", False),
            (4, "after a release", True),
        ):
            job = await d.expect(sent, attempt=attempt, why=why, ack=False)
            await d.driver.release(job, 0.0, consume_attempt=consume)
        await d.expect(sent, attempt=5, why="after another retry")

    @contract_test()
    async def test_fail_keeps_the_job_in_the_failed_store(self, d: DriverUnderTest) -> None:
        """``fail`` removes the job from its queue and keeps it: listed, found, forgotten."""
        sent = await d.put(payload={"invoice": 7})
        job = await d.expect(sent, ack=False)
        assert await d.driver.fail(job, failure_of(job, d.driver)) is True
        await d.nothing()
        await d.size_is(d.queue, 0)
        listed = await d.driver.failed.list(d.queue)
        assert [f.id for f in listed] == [sent.id], f"failed.list({d.queue!r}) is {listed}"
        assert await d.driver.failed.list(d.other) == []
        found = await d.driver.failed.find(sent.id)
        assert found is not None, "failed.find() of a failed job's id"
        assert (found.name, found.queue, found.payload) == (sent.job, d.queue, {"invoice": 7})
        assert "boom" in found.exception
        assert decode(found.body).id == sent.id, "the failed record keeps the whole envelope"
        assert await d.driver.failed.forget(sent.id) is True
        assert await d.driver.failed.find(sent.id) is None
        assert await d.driver.failed.forget(sent.id) is False

    @contract_test()
    async def test_a_failed_job_can_be_retried(self, d: DriverUnderTest) -> None:
        """What ``Queue.retry`` does: the kept envelope queues again, and runs as the same job."""
        sent = await d.put()
        job = await d.expect(sent, ack=False)
        await d.driver.fail(job, failure_of(job, d.driver))
        found = await d.driver.failed.find(sent.id)
        assert found is not None
        await d.driver.enqueue(found.body, decode(found.body), 0.0)
        assert await d.driver.failed.forget(sent.id) is True
        await d.expect(sent)
        assert await d.driver.failed.list(d.queue) == []

    # ---------------------------------------------------------------- sizes

    @contract_test()
    async def test_size_and_purge(self, d: DriverUnderTest) -> None:
        """``size`` counts ready and delayed messages of one queue; ``purge`` deletes them."""
        for _ in range(3):
            await d.put()
        # A backend that counts nothing (Vercel Queues) cannot reach a delayed message
        # before it is due either: its purge takes the ready ones.
        counted = not isinstance(d.driver, UncountedQueues)
        if isinstance(d.driver, UncountedQueues):  # no count, but a round trip
            await d.driver.probe(d.queue)
        else:
            await d.put(delay=60.0)
        kept = await d.put(d.other)
        await d.size_is(d.queue, 4)
        await d.size_is(d.other, 1)
        assert await d.driver.purge(d.queue) == (4 if counted else 3)
        await d.size_is(d.queue, 0)
        await d.nothing()
        await d.expect(kept, [d.other])

    @contract_test()
    async def test_a_body_of_max_message_size_round_trips(self, d: DriverUnderTest) -> None:
        """The driver carries a body as large as the limit it declares (1 MiB without one)."""
        limit = d.driver.max_message_size or 1024 * 1024
        message = d.message(payload="")
        message.payload = "x" * (limit - len(encode(message).encode("utf-8")))
        body = encode(message)
        assert len(body.encode("utf-8")) == limit
        await d.driver.enqueue(body, message, 0.0)
        job = await d.expect(message)
        assert job.body == body, "the body came back changed"

    @contract_test()
    async def test_dispatch_over_max_message_size_is_refused(self, d: DriverUnderTest) -> None:
        """A dispatch over the declared limit raises before anything is queued."""
        limit = d.driver.max_message_size
        if limit is None:
            pytest.skip(f"{type(d.driver).__name__} declares no max_message_size")
        with pytest.raises(PayloadTooLargeError):
            await _TOO_BIG.dispatch("x" * limit, queue=d.queue, connection="main")
        await d.size_is(d.queue, 0)
        await d.nothing()

    # ---------------------------------------------------------------- capabilities

    @contract_test(needs=Leased, lease=True)
    async def test_an_expired_lease_redelivers(self, d: DriverUnderTest) -> None:
        """A claim nobody renews (its worker died) comes back, counted as an attempt."""
        sent = await d.put()
        await d.expect(sent, attempt=1, why="a first claim", ack=False)
        # No heartbeat and no settle: the claim must come back once the lease is over.
        within = self.patience + 5 * _lease_of(d.driver)
        await d.expect(sent, within=within, attempt=2, why="a crashed attempt counts")
        await d.nothing()

    @contract_test(needs=Leased, lease=True)
    async def test_a_heartbeat_keeps_the_lease(self, d: DriverUnderTest) -> None:
        """While its consumer renews the lease, a claim is not handed to anyone else."""
        assert isinstance(d.driver, Leased)
        job = await d.expect(await d.put(), ack=False)
        step = min(d.driver.heartbeat_interval, _lease_of(d.driver)) / 2
        until = time.monotonic() + 3 * _lease_of(d.driver)
        while time.monotonic() < until:
            await d.driver.heartbeat([job])
            await d.nothing(wait=step)
        await d.driver.heartbeat([job])
        assert await d.driver.ack(job) is True, "the consumer still held its renewed claim"
        await d.nothing()

    @contract_test(needs=Backlog)
    async def test_backlog_counts_and_idles(self, d: DriverUnderTest) -> None:
        """``pending`` counts queued, delayed and running jobs; ``waiting`` the first two;
        ``wait_idle`` returns once nothing is pending."""
        assert isinstance(d.driver, Backlog)
        await d.put()
        await d.put(d.other, delay=0.2)
        assert (d.driver.pending(), d.driver.waiting()) == (2, 2)
        job = await d.take()
        assert (d.driver.pending(), d.driver.waiting()) == (2, 1), "a running job is pending"
        await d.driver.ack(job)
        assert d.driver.pending() == 1
        later = await d.take([d.other])
        idle = asyncio.ensure_future(d.driver.wait_idle())
        await asyncio.sleep(0)
        assert not idle.done(), "wait_idle returned while a job was running"
        await d.driver.ack(later)
        await asyncio.wait_for(idle, self.patience)
        assert (d.driver.pending(), d.driver.waiting()) == (0, 0)

    @contract_test(needs=QueueInspector)
    async def test_queue_inspector_counts_by_state(self, d: DriverUnderTest) -> None:
        """``counts`` tells ready, delayed and running apart (None where it cannot tell);
        ``running`` lists the claimed job."""
        assert isinstance(d.driver, QueueInspector)
        sent = await d.put()
        await d.put()
        await d.put(delay=60.0)
        job = await d.expect(sent, ack=False)
        counts = await d.driver.counts(d.queue)
        seen = {"ready": counts.ready, "delayed": counts.delayed, "running": counts.running}
        for state, value in seen.items():
            assert value in (None, 1), f"counts({d.queue!r}).{state} is {value}, expected 1"
        running = await d.driver.running(d.queue)
        if running is not None:
            assert [(r.id, r.name, r.queue, r.attempt) for r in running] == [
                (sent.id, sent.job, d.queue, 1)
            ]
        await d.driver.ack(job)
        empty = await d.driver.counts(d.other)
        assert empty.ready in (None, 0) and empty.running in (None, 0)
        await d.driver.purge(d.queue)

    @contract_test(needs=LocalQueue)
    async def test_local_queue_answers_at_once(self, d: DriverUnderTest) -> None:
        """``reserve_nowait`` claims a ready message without waiting, None when none is."""
        assert isinstance(d.driver, LocalQueue)
        assert d.driver.reserve_nowait([d.queue]) is None
        sent = await d.put()
        job = d.driver.reserve_nowait([d.queue])
        assert job is not None, "reserve_nowait missed a ready message"
        same_message(job, sent)
        await d.driver.ack(job)
        d.driver.check_idle()

    @contract_test(needs=BatchConsumer)
    async def test_batch_consumer_claims_and_acks_several(self, d: DriverUnderTest) -> None:
        """``reserve_many`` claims up to its limit; ``ack_many`` answers one bool per job."""
        assert isinstance(d.driver, BatchConsumer)
        sent = [await d.put(payload={"n": i}) for i in range(3)]
        jobs = await d.driver.reserve_many([d.queue], 2, self.patience)
        assert len(jobs) == 2, f"reserve_many(limit=2) with 3 ready claimed {len(jobs)}"
        assert await d.driver.ack_many(jobs) == [True, True]
        last = await d.take()
        claimed = {j.message.id for j in [*jobs, last] if j.message}
        assert claimed == {m.id for m in sent}
        assert await d.driver.ack_many([last]) == [True]
        assert await d.driver.ack_many([]) == []
        await d.nothing()

    @contract_test(needs=Advises)
    async def test_advice_is_lines_of_text(self, d: DriverUnderTest) -> None:
        """``advice`` answers a list of one-line strings (and does not raise)."""
        assert isinstance(d.driver, Advises)
        lines = await d.driver.advice()
        assert isinstance(lines, list), f"advice() returned {lines!r}"
        assert all(isinstance(x, str) and x and "\n" not in x for x in lines), lines

    @contract_test(needs=LeaseBudget)
    async def test_lease_warning_is_one_line_for_too_many_leases(self, d: DriverUnderTest) -> None:
        """``lease_warning`` lets one worker slot be, and names --concurrency and
        retry_after in one line for more leases than any server renews in time."""
        assert isinstance(d.driver, LeaseBudget)
        assert d.driver.lease_warning(1) is None
        line = d.driver.lease_warning(10**12)
        assert isinstance(line, str) and "\n" not in line, line
        assert "--concurrency" in line and "retry_after" in line, line

    @contract_test(needs=AcksInClaim)
    async def test_acks_ride_in_the_next_claim(self, d: DriverUnderTest) -> None:
        """``ack_and_claim`` acks its jobs (one bool each) and claims up to its limit."""
        assert isinstance(d.driver, AcksInClaim)
        sent = [await d.put(payload={"n": i}) for i in range(4)]
        first = await d.driver.reserve_many([d.queue], 2, self.patience)
        assert len(first) == 2, f"reserve_many(limit=2) with 4 ready claimed {len(first)}"
        owned, rest = await d.driver.ack_and_claim(first, d.queue, 5)
        assert owned == [True, True]
        assert len(rest) == 2, f"ack_and_claim(limit=5) with 2 ready claimed {len(rest)}"
        claimed = {j.message.id for j in [*first, *rest] if j.message}
        assert claimed == {m.id for m in sent}
        assert await d.driver.ack_and_claim(rest, d.queue, 5) == ([True, True], [])
        await d.nothing()

    @contract_test(needs=Interruptible)
    async def test_interrupt_ends_a_waiting_claim(self, d: DriverUnderTest) -> None:
        """``interrupt`` ends a claim waiting on an empty queue, long before its wait."""
        assert isinstance(d.driver, Interruptible)
        wait = 60.0
        claim = asyncio.ensure_future(d.driver.reserve([d.queue], wait))
        started = time.monotonic()
        # Again and again: the claim may not have begun its wait at the first call.
        while not claim.done() and time.monotonic() - started < self.patience:
            d.driver.interrupt()
            await asyncio.wait([claim], timeout=0.1)
        assert claim.done(), f"interrupt() did not end a {wait:g}s claim within {self.patience:g}s"
        got = claim.result()
        assert got is None, f"an interrupted claim on an empty queue returned {got!r}"
