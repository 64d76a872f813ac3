"""The ``memory`` driver: an in-process queue with timers for delays and backoff.

Consumed by the same process (``concurrency`` consumers, default 1); everything it
holds is lost when the process exits. Runs under Pyodide: no threads, only the
event loop's timers.
"""

from __future__ import annotations

import asyncio
import builtins
import heapq
import itertools
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from haze._base.json_text import copy_tree
from haze._base.message import MAX_MESSAGE_SIZE, Message, decode, decode_payload, encode
from haze._failed import QueueFailedJobs
from haze.contracts.driver import (
    Backlog,
    Concurrent,
    FailedJob,
    JobRecord,
    KeepsMessages,
    LocalQueue,
    QueueCounts,
    Reserved,
    RunningJob,
)
from haze.contracts.plain import PlainClaim, PlainQueue
from haze.drivers.context import DriverContext

__all__ = ["MemoryDriver"]

_monotonic = time.monotonic
get_running_loop = asyncio.get_running_loop
_time = time.time

#: A plain message kept as dispatched: its body, then the fields of its ``Message`` in
#: order, with its payload's JSON in place of the payload; or, kept through ``keep``,
#: no body (None: written only when something reads it) and the dispatcher's private
#: copy of the payload, copied again for every claim. Last, whether that copy is flat
#: (a dict or list of scalars: its ``.copy()`` is a full copy).
Kept = tuple[str | None, str, str, Any, str, str | None, float, int, str | None, bool]
#: What a queue holds: a body, or a kept message.
Item = str | Kept


class _KeptClaim(Reserved):
    """The claim of a kept message (queued again as it is on a release). Its body is
    written on first read (a failed job's record, a lookup): a job that succeeds never
    has one."""

    __slots__ = ("_text", "kept")

    kept: Kept
    _text: str | None

    @property
    def body(self) -> str:
        text = self._text
        if text is None:
            text = _kept_body(self.kept)
            self._text = text
        return text

    @body.setter
    def body(self, value: str) -> None:
        # None (from _claim_kept): written on first read
        self._text = value


def _kept_body(kept: Kept) -> str:
    body, mid, job, payload, queue, conn, ts, attempts, tenant, _ = kept
    if body is None:
        # encode() reads the payload and never changes it: the kept copy stays pristine
        body = encode(Message(mid, job, payload, queue, conn, ts, attempts, tenant))
    return body


def _body(item: Item) -> str:
    return item if isinstance(item, str) else _kept_body(item)


def _item(job: Reserved) -> Item:
    """What a claim was queued as (to queue it again)."""
    return job.kept if isinstance(job, _KeptClaim) else job.body


class MemoryDriver(LocalQueue, Backlog, Concurrent, KeepsMessages, PlainQueue):
    """In-process queues. ``queues`` (optional) sets the priority order of the consumers."""

    #: the config options it takes besides the common ones (``DeclaresOptions``)
    options: ClassVar[Mapping[str, str]] = {}
    remote = False
    local_callbacks = True
    inline = False
    #: in-process: there is no backend to become unreachable
    outage_errors: tuple[type[BaseException], ...] = ()

    def __init__(self, name: str, options: dict[str, Any], context: DriverContext | None = None):
        self.name = name
        self.max_message_size: int | None = options.get("max_message_size") or MAX_MESSAGE_SIZE
        self.concurrency: int = options.get("concurrency") or 1
        self.priority: list[str] = list(options.get("queues") or [])
        self.failed = QueueFailedJobs(lambda body, m: self._push(m.queue, body, m.attempts, 0))
        #: queue -> (body or kept message, attempts used, when it became ready: epoch s)
        self._ready: dict[str, deque[tuple[Item, int, float]]] = {}
        self._ready_count = 0
        self._delayed: list[tuple[float, int, str, Item, int]] = []
        self._seq = itertools.count()
        self._running = 0
        #: id(claim) -> claim (its token: when it was claimed): what ``running()`` lists
        self._active: dict[int, Reserved] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        #: whether ``_wakeup`` is set (its ``is_set()`` without a frame, on every push):
        #: only ``reserve`` clears it
        self._woken = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._idle_waiters: list[asyncio.Future[None]] = []
        #: (message, body, its payload's JSON): the next enqueue of both keeps it
        self._next: tuple[Message, str, str] | None = None
        #: The plain claim running on the short path (at most one: it runs to its end
        #: or becomes a ``Reserved`` before the loop runs anything else)
        self._plain: PlainClaim | None = None

    # -------------------------------------------------------------- loop binding

    def _bind(self) -> asyncio.Event:
        """Bind timers and the wake-up event to the running loop (tests switch loops)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop or self._wakeup is None:
            self._loop = loop
            self._wakeup = asyncio.Event()
            self._woken = False
            self._timer = None
            self._idle_waiters = []
            # Messages reserved on a dead loop will never be settled.
            self._running = 0
            self._active.clear()
            self._plain = None
            if self._delayed:
                self._arm_timer()
        return self._wakeup

    # -------------------------------------------------------------- producer side

    async def enqueue(self, body: str, message: Message, delay: float) -> None:
        kept = self._next
        if kept is not None and kept[0] is message and kept[1] is body:
            self._next = None
            # The payload is copied back out of its JSON at every claim; its other fields
            # are immutable, and nothing changes them after dispatch.
            m = message
            item = (
                body,
                m.id,
                m.job,
                kept[2],
                m.queue,
                m.connection,
                m.ts,
                m.attempts,
                m.tenant,
                False,
            )
            self._push(m.queue, item, m.attempts, delay)
            return
        self._push(message.queue, body, message.attempts, delay)

    async def enqueue_many(self, items: Sequence[tuple[str, Message, float]]) -> None:
        for body, message, delay in items:
            self._push(message.queue, body, message.attempts, delay)

    def keep_next(self, message: Message, body: str, payload: str) -> None:
        # Checked by identity in enqueue: a wrapper that changes the body (or sends
        # another message first) gets it decoded, as before.
        self._next = (message, body, payload)

    def keep(self, message: Message, payload: Any, delay: float) -> bool:
        if "enqueue" in self.__dict__:
            # A wrapper around this driver's enqueue (instrumentation, a test double) is
            # handed every body, so nothing is queued past it.
            return False
        m = message
        item = (
            None,
            m.id,
            m.job,
            payload,
            m.queue,
            m.connection,
            m.ts,
            m.attempts,
            m.tenant,
            False,
        )
        self._push(m.queue, item, m.attempts, delay)
        return True

    def keep_plain(
        self, mid: str, job: str, payload: Any, queue: str, tenant: str | None, flat: bool
    ) -> bool:
        if "enqueue" in self.__dict__:
            return False  # as in keep(): a wrapper sees every body
        # _push, without its two frames: one plain job after another comes here
        loop = get_running_loop()
        wakeup = self._wakeup
        if loop is not self._loop or wakeup is None:
            wakeup = self._bind()
        now = _time()
        q = self._ready.get(queue)
        if q is None:
            q = self._ready[queue] = deque()
        q.append(((None, mid, job, payload, queue, self.name, now, 0, tenant, flat), 0, now))
        self._ready_count += 1
        if not self._woken:
            self._woken = True
            wakeup.set()
        return True

    def _push(self, queue: str, body: Item, used: int, delay: float) -> None:
        wakeup = self._bind()
        if delay > 0:
            heapq.heappush(
                self._delayed, (_monotonic() + delay, next(self._seq), queue, body, used)
            )
            self._arm_timer()
            return
        q = self._ready.get(queue)
        if q is None:
            q = self._ready[queue] = deque()
        q.append((body, used, time.time()))
        self._ready_count += 1
        if not self._woken:
            self._woken = True
            wakeup.set()

    def _arm_timer(self) -> None:
        if not self._delayed or self._loop is None:
            return
        due = self._delayed[0][0]
        if self._timer is not None:
            if self._timer_at <= due:
                return
            self._timer.cancel()
        self._timer_at = due
        # call_later, not call_at: Pyodide's WebLoop raises "Can't schedule in the past"
        # when a call_at deadline computed from time() has already slipped by.
        self._timer = self._loop.call_later(max(0.0, due - _monotonic()), self._promote)

    def _promote(self) -> None:
        self._timer = None
        now = _monotonic()
        wall = time.time()
        moved = False
        while self._delayed and self._delayed[0][0] <= now:
            due, _, queue, body, used = heapq.heappop(self._delayed)
            q = self._ready.get(queue)
            if q is None:
                q = self._ready[queue] = deque()
            # Ready since it was due, not since the (possibly late) timer fired.
            q.append((body, used, wall - (now - due)))
            self._ready_count += 1
            moved = True
        if moved and self._wakeup is not None:
            self._woken = True
            self._wakeup.set()
        self._arm_timer()

    # -------------------------------------------------------------- consumer side

    def _order(self, queues: Sequence[str] | None) -> Sequence[str]:
        if queues:
            return queues
        if not self.priority:
            return list(self._ready)
        rest = [q for q in self._ready if q not in self.priority]
        return [*self.priority, *rest]

    def reserve_nowait(self, queues: Sequence[str] | None = None) -> Reserved | None:
        if not self._ready_count:
            return None
        for name in self._order(queues):
            q = self._ready.get(name)
            if q:
                body, used, _ = q.popleft()
                self._ready_count -= 1
                self._running += 1
                if body.__class__ is not str:
                    job = self._claim_kept(body, used + 1, name)  # type: ignore[arg-type]
                    self._active[id(job)] = job
                    return job
                try:
                    message: Message | None = decode(body)
                    error: BaseException | None = None
                except Exception as e:
                    message, error = None, e
                job = Reserved(message, used + 1, body, name, _time(), error)
                self._active[id(job)] = job
                return job
        return None

    @staticmethod
    def _claim_kept(kept: Kept, attempt: int, queue: str) -> Reserved:
        """A fresh message for the job: the kept fields and a new copy of the payload,
        which is what decoding its body gives (a copy that fails, fails as that does)."""
        body, mid, job_name, payload, mq, conn, ts, attempts, tenant, flat = kept
        if body is None:
            # the copy the dispatcher checked: a fresh one per claim, no JSON involved
            data = payload.copy() if flat else copy_tree(payload)
            message = Message(mid, job_name, data, mq, conn, ts, attempts, tenant)
            job = _KeptClaim(message, attempt, None, queue, _time())  # type: ignore[arg-type]
            job.kept = kept
            return job
        try:
            data = decode_payload(payload)
        except Exception:
            try:
                decode(body)
            except Exception as e:
                return Reserved(None, attempt, body, queue, _time(), e)
            raise
        message = Message(mid, job_name, data, mq, conn, ts, attempts, tenant)
        job = _KeptClaim(message, attempt, body, queue, _time())
        job.kept = kept
        return job

    def claim_plain(
        self, queues: list[str] | None, ended: bool = False
    ) -> PlainClaim | Reserved | None:
        if ended:  # plain_done() of the claim before, without its frame
            self._plain = None
            running = self._running = self._running - 1
            if not self._ready_count:
                if running <= 0:
                    self._running = 0
                    if self._idle_waiters and not self._delayed:
                        self._wake_idle()
                return None
        elif not self._ready_count:
            return None
        ready = self._ready
        for name in queues or self.priority or ready:
            q = ready.get(name)
            if q:
                item = q[0][0]
                if item.__class__ is str or item[0] is not None:
                    return self.reserve_nowait(queues)
                used = q.popleft()[1]
                self._ready_count -= 1
                self._running += 1
                claim: PlainClaim = (item, used + 1, name)  # type: ignore[assignment]
                self._plain = claim
                return claim
        return self.reserve_nowait(queues)  # the rest, after the priority queues

    def plain_claim(self, claim: PlainClaim, payload: Any = None) -> Reserved:
        kept, attempt, queue = claim
        if self._plain is claim:
            self._plain = None
        if payload is None:
            job = self._claim_kept(kept, attempt, queue)
        else:
            _, mid, name, _, mq, conn, ts, attempts, tenant, _ = kept
            message = Message(mid, name, payload, mq, conn, ts, attempts, tenant)
            job = _KeptClaim(message, attempt, None, queue, _time())  # type: ignore[arg-type]
            job.kept = kept
        self._active[id(job)] = job
        return job

    def plain_done(self) -> None:
        self._plain = None
        running = self._running = self._running - 1
        if running <= 0:
            self._running = 0
            if self._idle_waiters and not self._ready_count and not self._delayed:
                self._wake_idle()

    def _claims(self) -> builtins.list[Reserved]:
        """The running claims, the one on the short path too (as its ``Reserved``)."""
        claims = list(self._active.values())
        if self._plain is not None:
            kept, attempt, queue = self._plain
            claims.append(self._claim_kept(kept, attempt, queue))
        return claims

    async def reserve(self, queues: Sequence[str] | None, wait: float) -> Reserved | None:
        got = self.reserve_nowait(queues)
        if got is not None or wait <= 0:
            return got
        wakeup = self._bind()
        wakeup.clear()
        self._woken = False
        try:
            await asyncio.wait_for(wakeup.wait(), wait)
        except TimeoutError:
            return None
        return self.reserve_nowait(queues)

    def _settled(self, job: Reserved) -> None:
        self._active.pop(id(job), None)
        self._running -= 1
        if self._running <= 0:
            self._running = 0
            if self._idle_waiters and self.pending() == 0:
                self._wake_idle()

    # An in-process queue hands a job to one consumer and never takes it back: the
    # consumer always still owns it (True).

    async def ack(self, job: Reserved) -> bool:
        self._settled(job)
        return True

    async def release(self, job: Reserved, delay: float, *, consume_attempt: bool) -> bool:
        used = job.attempt if consume_attempt else job.attempt - 1
        self._push(job.queue, _item(job), used, delay)
        self._settled(job)
        return True

    async def fail(self, job: Reserved, failed: FailedJob) -> bool:
        await self.failed.record(failed)
        self._settled(job)
        return True

    # -------------------------------------------------------------- inspection

    async def size(self, queue: str) -> int:
        q = self._ready.get(queue)
        return (len(q) if q else 0) + sum(1 for d in self._delayed if d[2] == queue)

    async def counts(self, queue: str) -> QueueCounts:
        q = self._ready.get(queue)
        delayed = sum(1 for d in self._delayed if d[2] == queue)
        running = sum(1 for job in self._claims() if job.queue == queue)
        soonest = min((d[0] for d in self._delayed if d[2] == queue), default=None)
        # the heap keeps monotonic times; the counts speak epoch seconds
        due = None if soonest is None else time.time() + soonest - _monotonic()
        # Ready jobs are consumed in order, so the head has waited longest.
        return QueueCounts(len(q) if q else 0, delayed, running, q[0][2] if q else None, due)

    async def running(self, queue: str, limit: int = 50) -> builtins.list[RunningJob] | None:
        jobs = [
            RunningJob(
                job.message.id if job.message else "?",
                job.message.job if job.message else "?",
                job.queue,
                job.attempt,
                job.token,
            )
            for job in self._claims()
            if job.queue == queue
        ]
        return sorted(jobs, key=lambda j: j.started_at or 0.0)[:limit]

    async def find_job(self, job_id: str, queues: Sequence[str]) -> JobRecord | None:
        """A running, ready or delayed job of this process (finished ones are not kept)."""
        needle = f'"id":"{job_id}"'
        now, clock = time.time(), _monotonic()
        found: list[tuple[str, str, str, int, float | None]] = [
            ("running", job.queue, job.body, job.attempt, None) for job in self._claims()
        ]
        for queue, ready in self._ready.items():
            found += [("ready", queue, _body(item), used, None) for item, used, _ in ready]
        found += [
            ("delayed", q, _body(item), used, now + due - clock)
            for due, _, q, item, used in self._delayed
        ]
        for state, queue, body, attempts, at in found:
            if needle not in body or (queues and queue not in queues):
                continue
            message = decode(body)
            if message.id == job_id:
                return JobRecord(job_id, message.job, queue, state, attempts, body, at)
        return None

    async def purge(self, queue: str) -> int:
        q = self._ready.pop(queue, None)
        n = len(q) if q else 0
        self._ready_count -= n
        before = len(self._delayed)
        self._delayed = [d for d in self._delayed if d[2] != queue]
        heapq.heapify(self._delayed)
        n += before - len(self._delayed)
        if self._idle_waiters and self.pending() == 0:
            self._wake_idle()
        return n

    def pending(self) -> int:
        """Queued + delayed + running: what ``Queue.idle()`` waits for."""
        return self._ready_count + len(self._delayed) + self._running

    def waiting(self) -> int:
        """Queued + delayed (what is lost if the process exits now)."""
        return self._ready_count + len(self._delayed)

    async def wait_idle(self) -> None:
        self._bind()
        if self.pending() == 0:
            return
        assert self._loop is not None
        fut: asyncio.Future[None] = self._loop.create_future()
        self._idle_waiters.append(fut)
        await fut

    def _wake_idle(self) -> None:
        waiters, self._idle_waiters = self._idle_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def check_idle(self) -> None:
        """Called by consumers after they stop: wake idle() waiters if nothing is left."""
        if self._idle_waiters and self.pending() == 0:
            self._wake_idle()

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
