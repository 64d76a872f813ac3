"""The ``Driver`` protocol: the nine calls every queue backend implements.

Everything else (retries, backoff, chains, batches, unique locks, middleware,
callbacks) lives in the queue manager above this line, once, for every driver.

One message's life through a driver::

    enqueue / enqueue_many  →  reserve  →  (manager runs the job)
                                        →  ack            success (or skipped)
                                        →  release        retry (consume_attempt=True)
                                                          or job.release() (False)
                                        →  fail           final failure: into failed jobs
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from haze._base.errors import BackendUnavailableError, HazeError
from haze._base.message import FailedJob, Message, decode
from haze.contracts.failed import FailedJobStore

__all__ = [
    "AcksInClaim",
    "Advises",
    "Backlog",
    "BatchConsumer",
    "CappedDelay",
    "Concurrent",
    "ConnectionAware",
    "DeclaresOptions",
    "DelayStep",
    "DispatchOnly",
    "Driver",
    "FailedJob",
    "FailedJobStore",
    "GroupBacklog",
    "HeldLeases",
    "IdlePolling",
    "Interruptible",
    "JobLookup",
    "JobRecord",
    "KeepsMessages",
    "KnowsQueued",
    "LeaseBudget",
    "Leased",
    "LocalQueue",
    "MaxDelay",
    "Message",
    "QueueCounts",
    "QueueInspector",
    "QueueNameRules",
    "Reserved",
    "RunningJob",
    "UncountedQueues",
    "unavailable",
]


@dataclass(slots=True)
class Reserved:
    """A message a worker has claimed.

    ``attempt`` is the 1-based attempt number of this run (crash restarts count).
    ``message`` is None when the body could not be decoded; ``error`` then says why.
    ``token`` is private to the driver (row id + reserved_at, a BullMQ lock, a receipt).
    """

    message: Message | None
    attempt: int
    body: str
    queue: str
    token: Any = None
    error: BaseException | None = None
    #: Set when ack/release/fail found another worker owning the job (its lease expired).
    lease_lost: bool = False
    #: Set by a worker that completes jobs in batches (``BatchConsumer``): the manager
    #: hands the finished job to it instead of awaiting ``driver.ack``; the worker
    #: flushes it with others and reports a lost lease then.
    ack_later: Callable[[Reserved], None] | None = field(default=None, repr=False)
    #: Set by a worker: when ``driver.ack`` raises (whatever the error), the manager
    #: hands the job and the error to it instead of raising; the worker keeps the ack
    #: and sends it again until it is recorded or the driver says the lease is gone.
    ack_failed: Callable[[Reserved, Exception], None] | None = field(default=None, repr=False)
    #: Set by the engine when it handed the ack to the worker (``ack_later``, or
    #: ``ack_failed`` after the driver's ack raised): not recorded yet.
    ack_pending: bool = False
    #: Work that must wait until the job's ack is recorded (deleting its offloaded
    #: payload: a redelivery must still find it). The engine awaits it after a direct
    #: ack; a worker that keeps the ack awaits it once it recorded the ack.
    after_ack: Callable[[], Awaitable[None]] | None = field(default=None, repr=False)

    @classmethod
    def delivered(
        cls,
        body: str,
        deliveries: int,
        token: Any,
        error: BaseException | None = None,
        *,
        queue: str = "default",
    ) -> Reserved:
        """A message body a platform delivered for the ``deliveries``-th time (1-based).

        The attempt is the envelope's ``attempts`` offset (tries used before a re-send)
        plus ``deliveries``, at least 1. A body that does not decode (or ``error``: known
        bad already) becomes a ``Reserved`` with the error, which the manager fails;
        ``queue`` is its queue then.

        >>> job = Reserved.delivered('{"v":1,"id":"a1","job":"ping","payload":null,'
        ...                          '"attempts":2,"queue":"mail"}', 3, token="t")
        >>> job.attempt, job.queue, Reserved.delivered("oops", 1, None).message
        (5, 'mail', None)
        """
        message = None
        if error is None:
            try:
                message = decode(body)
            except Exception as e:
                error = e
        if message is None:
            return cls(None, max(1, deliveries), body, queue, token, error)
        return cls(message, max(1, message.attempts + deliveries), body, message.queue, token)


@runtime_checkable
class Driver(Protocol):
    """A queue backend. Methods never run job code; the manager does."""

    name: str
    #: Messages are consumed by other processes (redis, database, sqs, cloudflare).
    remote: bool
    #: The dispatching process also runs the jobs, so plain-function callbacks work.
    local_callbacks: bool
    #: Runs the job inside dispatch() (sync): the manager executes it inline.
    inline: bool
    #: Largest JSON body in bytes, None = no limit.
    max_message_size: int | None
    #: Errors that mean "the backend cannot be reached" rather than a bug: a worker logs
    #: them once per outage and waits, and dispatch raises ``BackendUnavailableError``
    #: (``()`` for in-process drivers, which have no backend to lose).
    outage_errors: tuple[type[BaseException], ...]

    @property
    def failed(self) -> FailedJobStore:
        """Where this connection keeps final failures."""

    async def enqueue(self, body: str, message: Message, delay: float) -> None:
        """Queue one message, available after ``delay`` seconds."""

    async def enqueue_many(self, items: Sequence[tuple[str, Message, float]]) -> None:
        """Queue several messages with the backend's batch primitive.

        When some are queued and others not, raise ``DispatchIncompleteError`` naming
        each message not queued (``failed``: id -> why). Any other exception means that
        none of them was queued: a batch then counts them all as not sent."""

    async def reserve(self, queues: Sequence[str], wait: float) -> Reserved | None:
        """Claim the next available message, queues in priority order; wait up to ``wait``s."""

    async def ack(self, job: Reserved) -> bool:
        """The job is done: remove it.

        ack, release and fail return True when this worker still held the job, and False
        when it no longer did (its lease expired and another worker took the job over;
        nothing was changed). A driver that cannot tell returns True.
        """

    async def release(self, job: Reserved, delay: float, *, consume_attempt: bool) -> bool:
        """Put the job back, available after ``delay``.

        ``consume_attempt`` is True for a retry and False for ``job.release()``, which
        must not count as an attempt.
        """

    async def fail(self, job: Reserved, failed: FailedJob) -> bool:
        """Final failure: remove the job and keep it in ``failed``."""

    async def size(self, queue: str) -> int:
        """Messages waiting (ready and delayed) on ``queue``."""

    async def purge(self, queue: str) -> int:
        """Delete waiting messages on ``queue``; returns how many."""

    async def close(self) -> None:
        """Release connections; called when the app stops."""


# -- optional capabilities: each is checked once (isinstance) when a worker or consumer
# starts, never probed by name, so a misspelt method is a type error and not a silently
# disabled feature.


@runtime_checkable
class DeclaresOptions(Protocol):
    """A driver or store class that names the config options it takes.

    Every driver and store class declares its own (built in, or added through the
    ``haze.drivers``/``haze.stores`` entry points or ``register_driver``/``register_store``):
    the options beyond ``driver`` and, for a queue driver that workers consume,
    ``max_message_size``, ``concurrency`` and ``queues``. Each maps to its kind (``"str"``,
    ``"int"``, ``"bool"``, ``"duration"``, ``"names"``, ``"queues"``, ``"ident"``, ``"dict"``).
    A class that declares nothing takes the common options only; the app refuses any
    other key when it starts, naming the known ones. An option left out (or ``None``) is
    absent from the checked options: the class keeps its own default.

    >>> class MyDriver:
    ...     options: ClassVar[Mapping[str, str]] = {"url": "str", "retry_after": "duration"}
    """

    options: ClassVar[Mapping[str, str]]


@runtime_checkable
class Interruptible(Protocol):
    """A driver whose claim waits on the backend: ``interrupt`` ends them from outside.

    A worker that stops calls it instead of cancelling its claims, since a claim cut
    midway could leave a job claimed by nobody until ``retry_after``.
    """

    def interrupt(self) -> None:
        """End the idle waits of claims in progress now (the worker is stopping)."""


@runtime_checkable
class Leased(Protocol):
    """A driver whose claims expire unless renewed (a database row's heartbeat, a BullMQ
    lock, an SQS visibility timeout): consumers renew the lease of their running jobs
    every ``heartbeat_interval`` seconds, so a long job is not handed to another worker.
    """

    #: Seconds between two renewals; well inside the lease (``retry_after``).
    heartbeat_interval: float

    async def heartbeat(self, jobs: Sequence[Reserved]) -> None:
        """Renew the lease of ``jobs`` (all claimed by this consumer and still running)."""


@runtime_checkable
class HeldLeases(Protocol):
    """A ``Leased`` driver whose claim can meet a lease its own consumer let lapse
    without dying: an event loop starved past the lease (a handler blocking it, a
    loaded machine) renews nothing, so the consumer's running jobs look like a dead
    worker's to its own next claim. Told which jobs the consumer renews, the driver
    passes such a claim's lease to the run that holds the job (its renewals and its
    ack use it) instead of handing the job out a second time.

    >>> stop = driver.hold_leases(lambda: running_jobs)  # doctest: +SKIP
    """

    def hold_leases(self, renewing: Callable[[], Iterable[Reserved]]) -> Callable[[], None]:
        """Count the jobs ``renewing()`` returns (a consumer's renewal set, read when a
        claim may have met one) as running until the returned call is made."""


@runtime_checkable
class LeaseBudget(Protocol):
    """A ``Leased`` driver that can tell a starting worker its concurrency is more
    running jobs than one heartbeat round renews within the heartbeat interval on a
    typical server (their leases would run out and the jobs run twice).
    """

    def lease_warning(self, concurrency: int) -> str | None:
        """One line naming the concurrency and the lease (``retry_after``) when
        ``concurrency`` leases are too many to renew in time, else None."""


@runtime_checkable
class ConnectionAware(Protocol):
    """A driver that keeps state tied to its connection (jobs fetched ahead, blocking
    waits): told when a worker sees the backend go away, so the next claim asks the
    server again instead of trusting a connection that may have died half-open."""

    def connection_lost(self) -> None:
        """The backend was seen unreachable: drop what the lost connection held."""


@runtime_checkable
class LocalQueue(Protocol):
    """An in-process queue (``memory``): a claim can be answered without waiting, and
    consumers say when they stop so ``Queue.idle()`` waiters can be woken."""

    def reserve_nowait(self, queues: Sequence[str] | None = None) -> Reserved | None:
        """The next ready message of ``queues`` (None: every queue), or None at once."""

    def check_idle(self) -> None:
        """A consumer stopped: wake ``idle()`` waiters if nothing is left."""


@runtime_checkable
class KeepsMessages(Protocol):
    """An in-process queue (``memory``) that can keep a plain dispatched ``Message`` (no
    chain, batch, lock, meta or encryption: immutable fields besides the payload) and
    copy only its payload through JSON at the claim, instead of decoding and checking
    the whole body again."""

    def keep_next(self, message: Message, body: str, payload: str) -> None:
        """The next ``enqueue`` of this very ``message`` with this very ``body`` (its
        whole body, as every driver gets it) may keep the message: the dispatcher checked
        that it is plain and wrote its payload's JSON as ``payload``."""

    def keep(self, message: Message, payload: Any, delay: float) -> bool:
        """Queue this plain ``message`` with no body written: ``payload`` is the
        dispatcher's own copy of its payload, what a JSON round trip would give (checked
        JSON-safe and within the size limit), never handed to a job as it is. False: not
        kept (the dispatcher then encodes the body and calls ``enqueue``)."""


@runtime_checkable
class Concurrent(Protocol):
    """A driver configured with how many jobs one consumer runs at once (the
    connection's ``concurrency`` option): the default of workers and batch handlers."""

    concurrency: int


@runtime_checkable
class IdlePolling(Protocol):
    """A driver that polls its backend when idle, configured with the pace: the first
    idle wait (``sleep``) doubling up to ``max_sleep`` (seconds)."""

    sleep: float
    max_sleep: float


@runtime_checkable
class DispatchOnly(Protocol):
    """A connection that only dispatches (``failover``, over other connections): nothing
    is claimed under its name, so a worker pointed at it refuses to start."""

    def no_consumer(self) -> HazeError:
        """The error for a worker pointed at this connection, saying what to run instead."""


@runtime_checkable
class Backlog(Protocol):
    """A queue held in this process's memory (``memory``): ``Queue.idle()`` waits for it
    to drain, and the app says what it loses when it stops with jobs left."""

    def pending(self) -> int:
        """Queued + delayed + running."""

    def waiting(self) -> int:
        """Queued + delayed (what is lost if the process exits now)."""

    async def wait_idle(self) -> None:
        """Return once ``pending()`` is 0."""


@runtime_checkable
class CappedDelay(Protocol):
    """A backend that holds a retry or release for a bounded time (Cloudflare Queues: 12
    hours): a longer backoff is capped, with a warning, before the retry line names the
    wait, so the line says what the backend will do."""

    def cap_delay(self, delay: float) -> float:
        """``delay``, or the longest the backend holds (warning that it was capped)."""


@runtime_checkable
class MaxDelay(Protocol):
    """A backend that holds one message's delay for a bounded time (Cloudflare Queues:
    12 hours, SQS: 15 minutes). A workflow's longer sleep is queued in hops of at most
    ``max_delay`` seconds, each re-delayed when it arrives early."""

    max_delay: float


@runtime_checkable
class DelayStep(Protocol):
    """A backend whose delays come in steps (whole seconds on SQS and Cloudflare): a
    retry's wait is reported rounded up to it, as the backend applies it."""

    delay_step: float


@runtime_checkable
class BatchConsumer(Interruptible, Protocol):
    """A driver that claims several jobs in one statement and completes several in one.

    A worker whose driver implements it fills all its free slots with one
    ``reserve_many`` and buffers acks, sending them with ``ack_many`` every few
    milliseconds and before its next claim (the database driver does).

    >>> isinstance(app.driver("database"), BatchConsumer)  # doctest: +SKIP
    True
    """

    async def reserve_many(
        self, queues: Sequence[str], limit: int, wait: float
    ) -> builtins.list[Reserved]:
        """Claim up to ``limit`` messages, queues in priority order; wait up to ``wait``s
        for the first one (an empty list when none came)."""

    async def ack_many(self, jobs: Sequence[Reserved]) -> builtins.list[bool]:
        """``ack`` for several jobs at once, one bool per job in order (True: this worker
        still held it and it is removed; False: its lease had passed to another worker)."""

    def interrupt(self) -> None:
        """End a ``reserve_many`` wait now (a slot is free again, or the worker stops)."""


@runtime_checkable
class Advises(Protocol):
    """A driver that can tell a starting worker about a backend setting that will hurt.

    ``haze queue:work`` prints each line as a warning under its start line (the
    database driver: PostgreSQL with autovacuum off for the jobs table).
    """

    async def advice(self) -> builtins.list[str]:
        """One line per problem found (none: an empty list). Never raises: a backend it
        cannot ask is the worker's own outage to report."""


@runtime_checkable
class QueueNameRules(Protocol):
    """A driver with a rule of its own for queue names, beyond 1 to 255 characters
    without a comma (redis: no ``:``, which separates the parts of its keys).

    A worker asks it about its queues before it starts, so a name the driver would
    refuse at every claim is one clear error instead of a worker that looks stuck.
    """

    def check_queue(self, queue: str) -> None:
        """Raise ``ValueError`` (one line, naming the rule) when ``queue`` cannot be a
        queue of this driver."""


@runtime_checkable
class AcksInClaim(BatchConsumer, Protocol):
    """A ``BatchConsumer`` whose buffered acks can ride in its next claim.

    A busy worker sends them with the claim that refills its slots instead of in a
    flush of their own: one round trip and one commit for both (the database driver on
    PostgreSQL; its other dialects run the two one after the other).
    """

    async def ack_and_claim(
        self, jobs: Sequence[Reserved], queue: str, limit: int
    ) -> tuple[builtins.list[bool], builtins.list[Reserved]]:
        """``ack_many(jobs)`` (one bool per job, in order), then claim up to ``limit``
        ready messages of ``queue`` without waiting (an empty list when none is). It arms
        the wake-up first: a dispatch or ``interrupt()`` from then on ends the wait of a
        ``reserve_many(..., first_claimed=True)`` that follows."""

    async def reserve_many(
        self, queues: Sequence[str], limit: int, wait: float, *, first_claimed: bool = False
    ) -> builtins.list[Reserved]:
        """``BatchConsumer.reserve_many``; ``first_claimed``: ``ack_and_claim`` just found
        ``queues[0]`` empty, so it is not claimed again before the wait, and the wake-up
        that call armed is kept (not cleared)."""


@runtime_checkable
class UncountedQueues(Protocol):
    """A backend whose API tells no queue depth (Vercel Queues): its ``size`` raises
    ``QueueCountUnavailableError``, and ``queue_check``, ``queue:monitor`` and the
    dashboard print ``counts_note`` instead of a number."""

    #: One line: what the backend does not tell, and where to look instead.
    counts_note: str

    async def probe(self, queue: str) -> None:
        """A round trip to the backend that changes nothing; raises what keeps it from
        answering (``queue_check`` has no count to read that would tell)."""


@dataclass(slots=True)
class QueueCounts:
    """How many jobs one queue holds, by state. None: the backend cannot tell."""

    ready: int | None
    delayed: int | None
    running: int | None
    #: When the oldest ready job became ready (epoch seconds): dispatched, due after its
    #: delay or backoff, or its dead worker's lease ran out. None: nothing is ready, or
    #: the backend cannot tell (SQS keeps that age only as a CloudWatch metric).
    oldest_ready_at: float | None = None
    #: When the next delayed job comes due (epoch seconds). None: nothing is delayed, or
    #: the backend cannot tell.
    next_delayed_at: float | None = None

    def oldest_ready_age(self, now: float) -> float | None:
        """Seconds the oldest ready job has waited at ``now`` (None: see ``oldest_ready_at``).

        >>> QueueCounts(1, 0, 0, oldest_ready_at=100.0).oldest_ready_age(112.0)
        12.0
        """
        if self.oldest_ready_at is None:
            return None
        return max(0.0, now - self.oldest_ready_at)


@dataclass(slots=True)
class RunningJob:
    """A job a worker has claimed and not settled yet."""

    id: str
    name: str
    queue: str
    attempt: int
    #: When this attempt was claimed (epoch seconds); None when the backend does not say.
    started_at: float | None


@runtime_checkable
class QueueInspector(Protocol):
    """A driver that can count a queue's jobs by state (``haze queue:stats``, ``queue:top``,
    the dashboard). Drivers without it only answer ``size``.

    >>> isinstance(app.driver("redis"), QueueInspector)  # doctest: +SKIP
    True
    """

    async def counts(self, queue: str) -> QueueCounts:
        """Ready, delayed and running jobs on ``queue`` (None where it cannot tell)."""

    async def running(self, queue: str, limit: int = 50) -> builtins.list[RunningJob] | None:
        """Up to ``limit`` claimed jobs of ``queue``, oldest claim first; None when the
        backend cannot list them."""


@runtime_checkable
class GroupBacklog(Protocol):
    """A driver that takes a queue's tenant groups in turn and can count each group's
    queued jobs (the dashboard's backlog per group).
    """

    async def group_backlog(self, queue: str, limit: int = 20) -> builtins.list[tuple[str, int]]:
        """The ``limit`` groups of ``queue`` with the most queued (unclaimed) jobs, and
        how many each has, largest first."""


@dataclass(slots=True)
class JobRecord:
    """A job a driver still holds, found by its id (``JobLookup.find_job``)."""

    id: str
    name: str
    queue: str
    #: ``ready``, ``delayed``, ``running``, or ``done`` (a finished job the backend keeps).
    state: str
    #: Attempts started so far (0 before the first).
    attempts: int
    #: The stored envelope (``haze._base.message.decode`` reads it).
    body: str
    #: When a delayed job comes due, or when a done job finished (epoch seconds).
    at: float | None = None


@runtime_checkable
class JobLookup(Protocol):
    """A driver that can find a job it holds by the job's id, in any state it keeps
    (the dashboard's job lookup). Drivers without it (SQS and Cloudflare Queues list no
    message by id) are not asked; the page says so.

    >>> isinstance(app.driver("redis"), JobLookup)  # doctest: +SKIP
    True
    """

    async def find_job(self, job_id: str, queues: Sequence[str]) -> JobRecord | None:
        """The job whose full id is ``job_id`` on one of ``queues``; None when this
        driver holds no such job now (never run, finished and deleted, or failed: the
        failed-job store has those)."""


@runtime_checkable
class KnowsQueued(Protocol):
    """A driver that can tell whether a job whose send lost its reply is queued: a batch
    asks it before it counts such a job as failed (without it: counted as failed once
    the batch's other jobs have ended)."""

    async def holds_job(self, job_id: str) -> bool | None:
        """True: the job is queued, delayed or running here; False: it is not (never
        queued, or already ran and removed); None: not an id this driver can look up.
        Raises when the backend gives no answer."""


def unavailable(driver: Driver, error: BaseException) -> BackendUnavailableError | None:
    """``error`` as a one-line ``BackendUnavailableError`` when it says ``driver``'s backend
    cannot be reached (None for any other error, which is not the backend's absence).

    Example: ``except Exception as e: raise (unavailable(driver, e) or e) from None``.
    """
    if isinstance(error, BackendUnavailableError):
        return error
    if not isinstance(error, driver.outage_errors) and not (
        driver.remote and isinstance(error, OSError)
    ):
        return None
    reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return BackendUnavailableError(
        f"queue connection {driver.name!r} is unavailable ({type(error).__name__}: {reason}); "
        "check that its server is running and reachable, and the connection's settings"
    )
