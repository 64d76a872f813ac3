"""The worker loop: claim → run (the consumer core, ``delivery.Delivery``) → repeat. It
never knows which driver it runs: the optional capabilities it uses (lease heartbeats,
interrupting a claim, in-process claims, batch claims) are the Protocols of
``haze.contracts.driver``, checked once when the worker is built.

``concurrency`` slots each run their own claim loop, so a job costs no task creation.
Used by the in-process ``memory`` consumers, ``haze queue:work`` and ``run_in_server``.

A driver that implements ``BatchConsumer`` (the database driver) is used in batches: a
slot that finds nothing claimed fetches for every free slot in one call (one fetch at a
time), and finished jobs' acks are buffered and sent together every
``ACK_FLUSH_INTERVAL``, before the next claim (inside it, for an ``AcksInClaim`` driver:
one round trip and one commit for both; a slot going idle then waits without claiming
that queue again), and when the worker stops. A claim never waits for a flush in flight:
the acks finished meanwhile go with the next flush. A process killed in between loses
at most those acks: the jobs run again after ``retry_after``.

An ack that fails, on any driver and whatever the error, is kept in the same buffer and
sent again after a short backoff (and by the next claim of a batching worker) until the
driver records it or answers that the lease passed to another worker.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from haze._base.errors import ConfigError, HazeError
from haze._engine.control import paused_queues, restart_requested_at
from haze._engine.hooks import Outcome
from haze._engine.plain import PlainRuns
from haze._workers.claims import ClaimsAndAcks
from haze._workers.delivery import Delivery
from haze._workers.presence import Presence
from haze.contracts.driver import (
    AcksInClaim,
    BatchConsumer,
    ConnectionAware,
    DispatchOnly,
    Driver,
    HeldLeases,
    Interruptible,
    LeaseBudget,
    Leased,
    LocalQueue,
    QueueNameRules,
    Reserved,
)
from haze.contracts.plain import PlainQueue

if TYPE_CHECKING:
    from haze._engine.view import EngineApp

__all__ = ["Worker"]

log = logging.getLogger("haze.worker")

#: How long a finished job's ack may wait in a batching worker's buffer (seconds). A
#: crash loses at most the acks of this window (those jobs run again), and it is far
#: shorter than any lease (retry_after).
ACK_FLUSH_INTERVAL = 0.005


def _checked_queues(
    driver: Driver, connection: str, queues: Sequence[str] | None
) -> list[str] | None:
    """``queues`` as a list, each one a name the driver can claim from (else one line)."""
    if not queues:
        return None
    if isinstance(driver, QueueNameRules):
        for queue in queues:
            try:
                driver.check_queue(queue)
            except ValueError as e:
                raise ConfigError(f"connection {connection!r}: {e}") from None
    return list(queues)


class Worker(ClaimsAndAcks):
    """Runs jobs from one connection.

    ``queues`` are taken in priority order (None: every queue, for ``memory``).
    ``once``/``max_jobs``/``max_time``/``stop_when_empty`` stop it like Laravel's worker.
    ``sleep``/``max_sleep``: idle polling starts at ``sleep`` and doubles to ``max_sleep``.
    """

    def __init__(
        self,
        app: EngineApp,
        connection: str,
        queues: Sequence[str] | None = None,
        concurrency: int = 1,
        *,
        once: bool = False,
        max_jobs: int | None = None,
        max_time: float | None = None,
        stop_when_empty: bool = False,
        sleep: float = 1.0,
        max_sleep: float | None = None,
        on_job: Callable[[Reserved, str, float], None] | None = None,
        control: bool = False,
    ) -> None:
        self.app = app
        self.connection = connection
        self.driver: Driver = app.driver(connection)
        if isinstance(self.driver, DispatchOnly):
            raise self.driver.no_consumer()  # it only dispatches: nothing to claim
        self._init_capabilities(self.driver)
        self.queues = _checked_queues(self.driver, connection, queues)
        self.concurrency = max(1, concurrency)
        self.once = once
        self.max_jobs = 1 if once else max_jobs
        self.max_time = max_time
        self.stop_when_empty = stop_when_empty or once
        self.sleep = sleep
        self.max_sleep = max_sleep if max_sleep is not None else sleep * 5
        self.on_job = on_job
        self.processed = 0
        self.leases_lost = 0  # acks/releases/fails that found another owner (lease lost)
        self.stopping = False
        self._busy = 0
        self._claiming = 0  # slots inside a claim: it may return a job (stop_when_empty)
        #: Jobs ended so far: a claim that found nothing proves the queue empty only if
        #: no job ended (and maybe queued a retry or a chain link) while it ran.
        self._ended = 0
        #: set and replaced when a job / the last claim in flight ends (stop_when_empty)
        self._job_ended = asyncio.Event()
        self._claims_settled = asyncio.Event()
        #: remote drivers: one idle slot polls at a time, the others wait for it
        self._idle_gate: asyncio.Lock | None = None
        self._claimed = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._waiting: set[asyncio.Task[Any]] = set()
        #: its slots' loop (an attribute: read at every dispatch to a memory connection)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._started_at = 0.0
        #: Runs the claimed jobs and keeps the running ones (whose leases are renewed).
        self._delivery = Delivery(app.manager, connection)
        self._init_outage(self.driver)
        self.control = control
        self._init_tasks()
        #: a setup error no retry can cure (missing queue tables): run() raises it
        self._fatal: HazeError | None = None
        self._init_batching()
        self._plain = self._plain_runs()

    def _plain_runs(self) -> PlainRuns | None:
        """An in-process queue's short path for plain jobs: not with the limits and the
        callback that count every job one by one."""
        driver = self.driver
        if not isinstance(driver, PlainQueue) or self._local is None:
            return None
        if self.on_job is not None or self.max_jobs is not None or self.max_time is not None:
            return None
        return PlainRuns(self.app.manager.execution, driver, driver)

    def _init_tasks(self) -> None:
        """The state of the control (``control=True``) and heartbeat tasks."""
        #: Queues paused with ``haze queue:pause`` (read from the store by the control task).
        self._paused: set[str] = set()
        self._control_task: asyncio.Task[None] | None = None
        #: This worker's record in the store (``haze.presence``), for ``queue:work``.
        self._presence: Presence | None = None
        self._started_wall = 0.0
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._beating = False
        self._unhold: Callable[[], None] | None = None  # ends the driver's HeldLeases
        self._late_told = float("-inf")

    def _init_outage(self, driver: Driver) -> None:
        self._outage = False
        self._outage_backoff = 0.0
        self._outage_since = 0.0
        #: Whether a claim was ever answered: a worker that stops without one never read
        #: its queues (``queue:work --stop-when-empty``/``--once`` then exit non-zero).
        self.reached = False
        #: What the current outage failed with (None outside one).
        self.outage_error: BaseException | None = None
        #: Jobs that ran while the backend was out, so their outcome was not recorded:
        #: told once, on the "reachable again" line, not one warning per job.
        self._unrecorded: list[str] = []
        #: Errors that mean "the backend is unreachable" rather than a bug: they are
        #: logged once per outage instead of with a traceback per job.
        self._outage_errors: tuple[type[BaseException], ...] = (OSError, *driver.outage_errors)

    def _init_capabilities(self, driver: Driver) -> None:
        """The driver's optional capabilities, checked once (``haze.contracts.driver``)."""
        #: Renews the lease of running jobs (heartbeat task).
        self._leased = driver if isinstance(driver, Leased) else None
        #: Told the renewal set, so its claim does not hand back a job running here.
        self._held = driver if isinstance(driver, HeldLeases) else None
        #: Ends its claims' waits itself on a stop (else the waiting claims are cancelled).
        self._interruptible = driver if isinstance(driver, Interruptible) else None
        #: Told when the backend goes away, to drop what the lost connection held.
        self._connection_aware = driver if isinstance(driver, ConnectionAware) else None
        #: An in-process queue: claims answered at once, told when a slot ends.
        self._local = driver if isinstance(driver, LocalQueue) else None
        #: Drivers that claim and complete in batches: one claim fills every free slot
        #: (the rows wait in ``_ready``), and acks are buffered in ``_acks`` and sent
        #: together every ACK_FLUSH_INTERVAL and before the next claim.
        self._batch = driver if isinstance(driver, BatchConsumer) else None
        #: ... and whose claim can carry the buffered acks (one round trip for both).
        self._acks_in_claim = driver if isinstance(driver, AcksInClaim) else None

    def _init_batching(self) -> None:
        self._ready: collections.deque[Reserved] = collections.deque()
        self._fetch_lock: asyncio.Lock | None = None
        self._fetch_idle = False  # the fetch in progress is an idle wait
        self._cut_wait = False  # a slot freed up during it: end it now
        #: Finished jobs whose ack is still to be sent: buffered by a batching worker, or
        #: kept after a driver's ack raised (any driver), until the ack is recorded.
        self._acks: list[Reserved] = []
        self._sending: list[Reserved] = []  # the acks of the flush in flight
        self._in_hand: list[Reserved] = []  # claimed with them, not yet in a slot
        self._ack_retry = 0.0  # the wait before the next try while acks keep failing
        self._flush_lock: asyncio.Lock | None = None  # one flush at a time
        self._flush_timer: asyncio.TimerHandle | None = None
        self._flushes: set[asyncio.Task[list[Reserved] | None]] = set()

    @property
    def running(self) -> int:
        return self._busy

    @property
    def paused(self) -> set[str]:
        """Queues paused with ``haze queue:pause``, as last read from the store."""
        return self._paused

    def running_jobs(self) -> list[Reserved]:
        """The jobs running now, oldest first."""
        return self._delivery.running()

    def start(self) -> None:
        """Start the slots as tasks on the running loop."""
        self.loop = loop = asyncio.get_running_loop()
        self._started_at = time.monotonic()
        self.stopping = False
        self._idle_gate = (
            asyncio.Lock()
            if self.driver.remote and not self.stop_when_empty and self._batch is None
            else None
        )
        self._fetch_lock = asyncio.Lock()
        self._flush_lock = asyncio.Lock()
        self._tasks = [
            loop.create_task(self._slot(i), name=f"haze-worker-{self.connection}-{i}")
            for i in range(self.concurrency)
        ]
        if self._leased is not None:
            if isinstance(self._leased, LeaseBudget):
                too_many = self._leased.lease_warning(self.concurrency)
                if too_many is not None:
                    log.warning("haze worker: %s", too_many)
            self._beating = True
            self._heartbeat_task = loop.create_task(self._heartbeat(self._leased))
        if self._held is not None:
            self._unhold = self._held.hold_leases(self._renewal_set)
        self._started_wall = time.time()
        if self.control:
            self._control_task = loop.create_task(self._control())

    async def run(self) -> int:
        """Run until stopped (signal, limits, or empty with ``stop_when_empty``)."""
        if not self._tasks:
            self.start()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._final_flush()
        self._stop_heartbeat()
        if self._presence is not None:
            await self._presence.leave()
        if self._unrecorded:  # stopped before the backend came back
            log.warning(
                "haze worker: stopped while connection %r was unavailable%s",
                self.connection,
                self._unrecorded_note(),
            )
        if self._fatal is not None:
            raise self._fatal
        return self.processed

    def _stop_heartbeat(self) -> None:
        self._beating = False
        unhold, self._unhold = self._unhold, None
        if unhold is not None:
            unhold()
        for task in (self._heartbeat_task, self._control_task):
            if task is not None:
                task.cancel()
        self._heartbeat_task = self._control_task = None

    async def _control(self, interval: float = 1.0) -> None:
        """Follow ``queue:restart`` and ``queue:pause``/``continue`` through the queue store."""
        self._presence = presence = Presence(self)
        failures, told = 0, False
        while not self.stopping:
            try:
                restart = await restart_requested_at(self.app)
                if restart is not None and restart >= self._started_wall:
                    log.warning(
                        "haze worker: restart requested (queue:restart); stopping "
                        "after the running jobs"
                    )
                    self.request_stop()
                    return
                self._paused = await paused_queues(self.app, self.connection, self.queues or [])
                failures, told = 0, False
                await presence.beat()
            except Exception as e:
                failures += 1
                # Once per outage, not every second; and not at all while the connection
                # itself is out (the store is usually on the same server, and the worker
                # already said so): only a store that stays down on its own is news.
                if failures >= 2 and not told and not self._outage:
                    told = True
                    log.warning("haze worker: cannot read worker signals from the store: %s", e)
            await asyncio.sleep(interval)

    async def _heartbeat(self, leased: Leased) -> None:
        """Renew the lease of running jobs (database heartbeat, BullMQ lock, SQS visibility)
        so a long job is not handed to another worker while this one lives; the jobs a
        batch claim took and no slot started yet, and finished jobs whose ack is not
        recorded yet, are claimed too."""

        def failed(e: Exception) -> None:
            if isinstance(e, self._outage_errors):
                self._enter_outage(e)
            else:
                log.warning("haze worker: heartbeat on %s failed: %s", self.connection, e)

        await self._delivery.keep_leases(
            float(leased.heartbeat_interval),
            failed,
            alive=lambda: self._beating,
            also=lambda: [(leased, job) for job in (*self._ready, *self._in_hand, *self._acks)],
            late=self._renewed_late,
        )

    def _renewed_late(self, behind: float, leases: int) -> None:
        """A heartbeat round ended more than an interval late: say so (once a minute)."""
        now = time.monotonic()
        if now - self._late_told < 60.0:
            return
        self._late_told = now
        interval = float(self._leased.heartbeat_interval) if self._leased else 0.0
        log.warning(
            "haze worker: the heartbeat renewing %d leases on %r ended %.1fs behind "
            "schedule (it is due every %.1fs): leases may run out and their jobs run "
            "twice; lower --concurrency (%d) or raise the connection's retry_after",
            leases,
            self.connection,
            behind,
            interval,
            self.concurrency,
        )

    def request_stop(self) -> None:
        """Stop claiming; running jobs finish. Slots blocked in a claim are interrupted."""
        if self.stopping:
            return
        self.stopping = True
        if self._interruptible is not None:
            # Remote drivers end their idle wait themselves: cancelling a claim midway
            # could leave a row claimed by nobody until retry_after.
            self._interruptible.interrupt()
            return
        for t in list(self._waiting):
            t.cancel()

    async def stop(self) -> None:
        """Stop claiming and wait for the running jobs."""
        self.request_stop()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._final_flush()
        self._stop_heartbeat()
        if self._presence is not None:  # a clean stop: off the Workers page now
            await self._presence.leave()

    def _limit_reached(self) -> bool:
        if self.max_jobs is not None and self._claimed >= self.max_jobs:
            return True
        return self.max_time is not None and time.monotonic() - self._started_at >= self.max_time

    async def _slot(self, index: int) -> None:
        events = self.app.manager.events
        idle_wait = self.sleep
        idle = False  # this slot's last claim found nothing
        ready = self._ready
        plain, outcomes = self._plain, self._delivery.outcomes
        if plain is not None:
            plain.enter()
        # Rows a batch claim took for this worker run even after a stop: they are claimed.
        while not self.stopping or ready:
            if (self.max_jobs is not None or self.max_time is not None) and self._limit_reached():
                self.request_stop()
                if not ready:
                    break
            if events.looping:
                await events.emit("looping", self.connection, self.queues)
            if plain is not None:
                ran, got = plain.run(self.queues, self)
                if ran:  # that many plain jobs succeeded in that call
                    self._claimed += ran
                    self._ended += ran
                    self.processed += ran
                    outcomes[Outcome.SUCCESS] += ran
                    idle, idle_wait = False, self.sleep
                    if got is None:
                        continue
                if isinstance(got, tuple):  # it suspended or raised: the rest of its run
                    idle, idle_wait = False, self.sleep
                    await self._run(*got)
                    continue
                job = got
            elif self._local is not None:
                job = self._local.reserve_nowait(self.queues)
            else:
                job = None
            if job is None and ready:
                job = ready.popleft()
            idle_told, ended_before = False, self._ended
            if job is None:
                job, idle_told, ended_before = await self._claim_next(idle, idle_wait)
            idle = job is None
            if job is not None:
                idle_wait = self.sleep
                await self._run(job)
                continue
            if self.stopping:
                break
            if events.worker_idle and not idle_told:
                await events.emit("worker_idle", self.connection, self.queues)
            if self.stop_when_empty:
                if await self._drained(ended_before, idle_wait):
                    break
                idle_wait = min(idle_wait * 2, self.max_sleep)
                continue
            idle_wait = min(idle_wait * 2, self.max_sleep)
        if self._local is not None:
            self._local.check_idle()

    async def _claim_next(self, idle: bool, idle_wait: float) -> tuple[Reserved | None, bool, int]:
        """Claim when nothing was at hand: (the job or None, whether ``worker_idle`` was
        told already, the count of ended jobs when the claim began)."""
        events = self.app.manager.events
        idle_told = False
        if events.worker_idle and self._local is not None and not self.stop_when_empty:
            # an in-process queue blocks (up to an hour) until a job arrives: tell
            # listeners it is idle before the wait, not after it
            await events.emit("worker_idle", self.connection, self.queues)
            idle_told = True
            if self.stopping:  # a stop requested during the listener
                return None, idle_told, self._ended
        gate = self._idle_gate if idle else None
        if gate is not None:
            # Idle: poll only when no other idle slot is polling. A slot that just
            # finished a job claims at once; one that finds a job hands the gate on.
            await gate.acquire()
        try:
            if self.stopping:
                return None, idle_told, self._ended
            ended_before = self._ended
            self._claiming += 1
            try:
                wait = 0.0 if self.stop_when_empty else self._wait_for(idle_wait)
                if self._batch is not None:
                    job = await self._fetch(wait, freed=not idle)
                else:
                    job = await self._claim(wait)
            finally:
                self._claiming -= 1
                if not self._claiming:
                    self._claims_settled.set()
                    self._claims_settled = asyncio.Event()
        finally:
            if gate is not None:
                gate.release()
        return job, idle_told, ended_before

    async def _drained(self, ended_before: int, idle_wait: float) -> bool:
        """``stop_when_empty`` and a claim found nothing: True (and stopping) when the
        queues are empty, False when another slot may still bring or queue more."""
        # Wait for the claims still in flight rather than claim again (slots re-claiming
        # in turn would keep _claiming above 0 forever).
        while self._busy == 0 and self._claiming and not self.stopping:
            await self._claims_settled.wait()
        if (
            self._busy == 0
            and self._claiming == 0
            and self._ended == ended_before
            and not self._ready
        ):
            self.request_stop()
            return True
        if self._busy:
            # Another slot's job may queue more (a retry, a chain link) when it ends:
            # wait for that, polling at the idle interval meanwhile, instead of claiming
            # again every few milliseconds from every idle slot while it runs.
            ended = self._job_ended
            try:
                await asyncio.wait_for(ended.wait(), min(idle_wait, self._wait_for(idle_wait)))
            except TimeoutError:
                pass
            return False
        await asyncio.sleep(0.005)  # a job ended during the claim: claim again
        return False

    async def _run(self, job: Reserved, resumed: Awaitable[str] | None = None) -> None:
        """Run a claimed job through the consumer core and count it (``resumed``: the
        rest of a plain job's run, begun on its short path)."""
        self._claimed += 1
        self._busy += 1
        started = time.perf_counter() if self.on_job is not None else 0.0
        if self._batch is not None:
            job.ack_later = self._ack_later
        job.ack_failed = self._ack_failed
        try:
            outcome = await self._delivery.run(
                job, self.driver, leased=self._leased, resumed=resumed
            )
        except Exception as e:  # process() handles job errors itself: a backend error
            if isinstance(e, self._outage_errors):
                self._enter_outage(e)
                self._unrecorded.append(
                    job.message.id if job.message is not None else str(job.token)
                )
            else:  # pragma: no cover - a bug
                log.exception("haze worker: unexpected error while processing a job")
            outcome = "error"
        finally:
            self._busy -= 1
            self._ended += 1
            self._job_ended.set()
            self._job_ended = asyncio.Event()
        self.processed += 1
        if job.lease_lost:
            self.leases_lost += 1
        if self.on_job is not None:
            self.on_job(job, outcome, time.perf_counter() - started)

    # -- batched claims and acks (drivers implementing BatchConsumer) ---------------------

    async def _fetch(self, wait: float, *, freed: bool) -> Reserved | None:
        """One claim for every free slot: this slot's job, the rest into ``_ready``.

        One fetch at a time: the slots that find nothing ready queue on the lock and take
        what it brought. An idle wait in progress is cut short when a slot frees up, so
        that slot does not sit behind it while jobs may be waiting (``freed``: this slot
        just ended a job; idle slots taking turns must not cut each other's waits).
        """
        lock = self._fetch_lock
        assert lock is not None and self._batch is not None
        if freed and lock.locked() and self._fetch_idle:
            self._cut_wait = True
            self._batch.interrupt()
        async with lock:
            if self._ready:
                return self._ready.popleft()
            if self.stopping:
                return None
            limit = self.concurrency - self._busy
            if self.max_jobs is not None:
                limit = min(limit, self.max_jobs - self._claimed)
            if limit <= 0:
                return None
            self._fetch_idle = wait > 0
            try:
                jobs = await self._claim_many(wait, limit)
            finally:
                self._fetch_idle = False
            if not jobs:
                return None
            self._ready.extend(jobs[1:])
            return jobs[0]

    def _ack_later(self, job: Reserved) -> None:
        """The manager finished ``job``: its ack goes out with the next flush."""
        self._acks.append(job)
        self._arm_flush(ACK_FLUSH_INTERVAL)

    def _wait_for(self, idle_wait: float) -> float:
        # In-process queues wake the slot on enqueue, so a long wait costs nothing.
        wait = 3600.0 if not self.driver.remote else idle_wait
        if self.max_time is not None:
            left = self.max_time - (time.monotonic() - self._started_at)
            wait = max(0.0, min(wait, left))
        return wait
