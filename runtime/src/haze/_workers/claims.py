"""How a worker talks to its driver: claims that live through outages, and acks that
are buffered (a batching driver) and sent again until the driver records them.

A claim that fails with one of the driver's outage errors starts an outage: logged
once, claims back off up to ``max_sleep``, and the jobs that ran meanwhile are named on
the "reachable again" line. An ack that fails, on any driver and whatever the error, is
kept and sent again after a short backoff (``ACK_RETRY_MIN`` doubling to
``ACK_RETRY_MAX``) until the driver records it or answers that the lease passed to
another worker; a stopping worker keeps trying for ``ACK_STOP_PATIENCE``.
``Worker`` (``haze._workers.worker``) sets the attributes declared here.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from haze._base.errors import ConfigError, HazeError, QueueTablesMissingError
from haze.contracts.driver import AcksInClaim, BatchConsumer, ConnectionAware, Driver, Reserved

if TYPE_CHECKING:
    from haze._engine.view import EngineApp
    from haze._workers.delivery import Delivery

__all__ = ["ClaimsAndAcks"]

log = logging.getLogger("haze.worker")

_T = TypeVar("_T")

#: A failed ack is sent again after this many seconds, doubling up to ACK_RETRY_MAX
#: while acks keep failing: far inside any lease, so the job does not run again.
ACK_RETRY_MIN = 0.05
ACK_RETRY_MAX = 1.0
#: A stopping worker keeps sending the acks that still fail for this long (seconds).
ACK_STOP_PATIENCE = 2.0


class ClaimsAndAcks:
    """The claim and ack steps of ``Worker``."""

    app: EngineApp
    connection: str
    driver: Driver
    queues: list[str] | None
    max_sleep: float
    stopping: bool
    reached: bool
    leases_lost: int
    outage_error: BaseException | None
    loop: asyncio.AbstractEventLoop | None
    _batch: BatchConsumer | None
    _acks_in_claim: AcksInClaim | None
    _connection_aware: ConnectionAware | None
    _waiting: set[asyncio.Task[Any]]
    _paused: set[str]
    _cut_wait: bool
    _fatal: HazeError | None
    _outage: bool
    _outage_backoff: float
    _outage_since: float
    _outage_errors: tuple[type[BaseException], ...]
    _unrecorded: list[str]
    _acks: list[Reserved]
    _sending: list[Reserved]
    _in_hand: list[Reserved]
    _ready: collections.deque[Reserved]
    _delivery: Delivery
    _ack_retry: float
    _flush_lock: asyncio.Lock | None
    _flush_timer: asyncio.TimerHandle | None
    _flushes: set[asyncio.Task[list[Reserved] | None]]

    def request_stop(self) -> None:
        """Stop claiming (``Worker.request_stop``)."""
        raise NotImplementedError

    async def _claim(self, wait: float) -> Reserved | None:
        """Claim with an interruptible wait (request_stop cancels it)."""
        return await self._guarded_claim(lambda queues: self.driver.reserve(queues, wait), wait)

    async def _claim_many(self, wait: float, limit: int) -> list[Reserved]:
        """Flush the buffered acks, then claim up to ``limit`` jobs in one statement."""
        batch = self._batch
        assert batch is not None

        async def claim(queues: Sequence[str]) -> list[Reserved]:
            self._cut_wait = False
            jobs = await self._flush_acks(claim=(queues[0], limit) if queues else None)
            if jobs:
                return jobs
            # A stop or a freed slot before the folded claim armed the wake-up: its
            # interrupt() was missed, so do not start a wait then.
            cut = self.stopping or self._cut_wait
            if jobs is not None and self._acks_in_claim is not None:
                # The folded claim found the first queue empty: not claimed again before
                # the wait, which a dispatch or interrupt() since the fold still ends.
                return await self._acks_in_claim.reserve_many(
                    queues, limit, 0.0 if cut else wait, first_claimed=True
                )
            return await batch.reserve_many(queues, limit, 0.0 if cut else wait)

        return await self._guarded_claim(claim, wait) or []

    async def _guarded_claim(
        self, call: Callable[[Sequence[str]], Awaitable[_T]], wait: float
    ) -> _T | None:
        task = asyncio.current_task()
        assert task is not None
        self._waiting.add(task)
        began = time.monotonic()
        try:
            queues = self.queues or []
            if self._paused:
                queues = [q for q in queues if q not in self._paused]
                if not queues:
                    await asyncio.sleep(min(wait, 1.0) if wait > 0 else 0.05)
                    return None
            job = await call(queues)
            self.reached = True
        except asyncio.CancelledError:
            if self.stopping:
                task.uncancel()
                return None
            raise
        except (QueueTablesMissingError, ConfigError) as e:
            # Not an outage: waiting cannot create the tables or fix a refused token
            # (libSQL's 401/403). Stop and say what to do.
            self._fatal = e
            self.request_stop()
            return None
        except Exception as e:
            # The backend is down or unreachable: keep the worker alive and retry with
            # backoff; nothing is lost (claimed rows come back after retry_after).
            self._outage_backoff = min(max(self._outage_backoff * 2, 0.1), self.max_sleep)
            self._enter_outage(e)
            await asyncio.sleep(self._outage_backoff)
            return None
        finally:
            self._waiting.discard(task)
        self._answered(began)
        return job

    def _answered(self, began: float) -> None:
        """A call sent at ``began`` (monotonic) succeeded: the end of an outage, if one
        began before it (one already on its way may have been answered just before the
        connection broke, which proves nothing)."""
        if self._outage and began >= self._outage_since:
            self._outage = False
            self.outage_error = None
            self._outage_backoff = 0.0
            log.warning(
                "haze worker: connection %r is reachable again%s",
                self.connection,
                self._unrecorded_note(),
            )

    def _unrecorded_note(self) -> str:
        """The jobs that ran during the outage without their outcome being recorded."""
        ids, self._unrecorded = self._unrecorded, []
        if not ids:
            return ""
        shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        return (
            f"; {len(ids)} job(s) ran during the outage but their outcome could not be "
            f"recorded ({shown}): they run again once their claim expires (retry_after)"
        )

    def _enter_outage(self, e: BaseException) -> None:
        """Log the first failure of an outage (claims, heartbeats and acks all fail at
        once then, and every slot retries: one warning, not one per loop or per job)."""
        if self._outage:
            return
        self._outage = True
        self.outage_error = e
        self._outage_since = time.monotonic()
        log.warning(
            "haze worker: connection %r is unavailable (%s: %s); retrying every %.1fs "
            "up to %.1fs until it is back",
            self.connection,
            type(e).__name__,
            e,
            max(self._outage_backoff, 0.1),
            self.max_sleep,
        )
        if self._connection_aware is not None:
            self._connection_aware.connection_lost()

    def _renewal_set(self) -> list[Reserved]:
        """Every job this worker holds a claim of: running, claimed but not started,
        finished with the ack not recorded yet (buffered or on its way)."""
        return [
            *self._delivery.running(),
            *self._ready,
            *self._in_hand,
            *self._acks,
            *self._sending,
        ]

    def _ack_failed(self, job: Reserved, error: Exception) -> None:
        """The driver's ack of ``job`` raised: keep it, and send it again soon."""
        self._acks.append(job)
        self._acks_kept(1, error)

    def _arm_flush(self, delay: float) -> None:
        if self._flush_timer is None and self.loop is not None:
            self._flush_timer = self.loop.call_later(delay, self._flush_due)

    def _cancel_flush_timer(self) -> None:
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None

    def _flush_due(self) -> None:
        self._flush_timer = None
        if not self._acks or self.loop is None:
            return
        task = self.loop.create_task(self._flush_acks())
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    def _acks_kept(self, n: int, error: Exception) -> None:
        """``n`` acks failed with ``error`` and stay buffered: say so (an outage once),
        and send them again after a backoff (a claim sends them sooner)."""
        self._ack_retry = min(max(self._ack_retry * 2, ACK_RETRY_MIN), ACK_RETRY_MAX)
        if isinstance(error, self._outage_errors):
            self._enter_outage(error)
        else:
            log.warning(
                "haze worker: ack of %d finished job(s) on %r failed (%s: %s); kept, "
                "sending again in %.2fs",
                n,
                self.connection,
                type(error).__name__,
                error,
                self._ack_retry,
            )
        self._arm_flush(self._ack_retry)

    async def _flush_acks(self, claim: tuple[str, int] | None = None) -> list[Reserved] | None:
        """Send the buffered acks (in one statement, for a batching driver) and report
        lost leases.

        ``claim`` (queue, limit): a driver that can (``AcksInClaim``) claims in the same
        statement; the claimed jobs are returned (None: nothing was claimed here).
        An ack that fails, whatever the error, stays buffered and is sent again (by the
        next claim, or after a backoff) until the driver records it or answers that the
        lease passed to another worker: a finished job must not run again.

        One flush at a time (two batched acks of one worker could deadlock on MySQL);
        but a claim never waits for a flush in flight: it returns None at once, the
        caller claims without the acks, and they go with the next flush.
        """
        lock = self._flush_lock
        if lock is None or not self._acks or (claim is not None and lock.locked()):
            return None
        async with lock:
            jobs, self._acks = self._acks, []
            if not jobs:
                return None
            began = time.monotonic()
            self._sending = jobs
            try:
                settled, claimed, error = await self._send_acks(jobs, claim)
            finally:
                self._sending = []
        if error is None:
            self._ack_retry = 0.0
            self._answered(began)
        manager = self.app.manager
        # The jobs claimed with the acks are held (renewed, and left to this worker by
        # its own claims) while the after-ack calls below run: they are in no slot yet.
        self._in_hand = claimed or []
        try:
            for job, ok in settled:
                if not ok:
                    manager.owned(False, job, "completion")
                    self.leases_lost += 1
                elif job.after_ack is not None:
                    after, job.after_ack = job.after_ack, None
                    try:
                        await after()
                    except Exception:
                        log.exception("haze worker: after the ack of job %s", job.token)
        finally:
            self._in_hand = []
        if error is not None:
            self._acks_kept(len(jobs) - len(settled), error)
        return claimed

    async def _send_acks(
        self, jobs: list[Reserved], claim: tuple[str, int] | None
    ) -> tuple[list[tuple[Reserved, bool]], list[Reserved] | None, Exception | None]:
        """(each acked job with whether it was still owned, the claimed jobs or None when
        no claim was made, the error of the acks that failed: those are back in the
        buffer)."""
        batch = self._batch
        if batch is None:
            return await self._each(jobs)
        try:
            if claim is not None and self._acks_in_claim is not None:
                owned, claimed = await self._acks_in_claim.ack_and_claim(jobs, *claim)
            else:
                owned, claimed = await batch.ack_many(jobs), None
        except BaseException as e:
            if not isinstance(e, Exception):  # cancelled: the acks stay buffered
                self._acks[:0] = jobs
                raise
            if isinstance(e, self._outage_errors):
                self._acks[:0] = jobs
                return [], None, e
            # A bug or a refused statement: one ack per job, so it holds no other back.
            log.warning(
                "haze worker: batched ack on %r failed (%s: %s); acking one by one",
                self.connection,
                type(e).__name__,
                e,
            )
            return await self._each(jobs)
        return list(zip(jobs, owned, strict=True)), claimed, None

    async def _each(
        self, jobs: list[Reserved]
    ) -> tuple[list[tuple[Reserved, bool]], None, Exception | None]:
        """``driver.ack`` per job; the ones that raise go back to the buffer."""
        settled: list[tuple[Reserved, bool]] = []
        error: Exception | None = None
        rest = collections.deque(jobs)
        try:
            while rest:
                job = rest[0]
                try:
                    settled.append((job, await self.driver.ack(job)))
                except Exception as e:
                    self._acks.append(job)
                    error = error or e
                rest.popleft()
        finally:
            self._acks.extend(rest)  # cancelled midway: the rest stays buffered
        return settled, None, error

    async def _final_flush(self) -> None:
        """Stopping: send the buffered acks now, and again for a short while those that
        fail (a lost one re-runs its job after ``retry_after``)."""
        self._cancel_flush_timer()
        if self._flushes:
            await asyncio.gather(*self._flushes, return_exceptions=True)
        deadline = time.monotonic() + ACK_STOP_PATIENCE
        while True:
            await self._flush_acks()
            self._cancel_flush_timer()  # this loop sends them again, not a timer
            if not self._acks or time.monotonic() + self._ack_retry >= deadline:
                break
            await asyncio.sleep(self._ack_retry)
        if not self._acks:
            return
        ids = [job.message.id if job.message is not None else str(job.token) for job in self._acks]
        self._acks = []
        if self._outage:
            self._unrecorded.extend(ids)  # told on the "stopped while unavailable" line
            return
        log.warning(
            "haze worker: stopped with the ack of %d finished job(s) on %r not recorded "
            "(%s): they run again once their claim expires (retry_after)",
            len(ids),
            self.connection,
            ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else ""),
        )
