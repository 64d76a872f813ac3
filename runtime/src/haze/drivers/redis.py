"""The ``redis`` driver: haze queues as BullMQ queues, through the ``bullmq`` package.

BullMQ's data model is kept as is, so BullMQ tools (bull-board, Taskforce, a Node
``Queue``) can look at haze queues:

- each haze queue is one BullMQ queue under the key prefix ``prefix`` (default
  ``haze``): ``haze:<queue>:wait``, ``:active``, ``:delayed``, ``:failed``, ...
- each message is one BullMQ job with an auto-increment id, named after the haze
  job, whose ``data`` is the haze envelope (see ``haze.message``)::

      {"v": 1, "id": "8f0c…", "job": "send_invoice", "payload": {"invoice_id": 42},
       "queue": "emails", "ts": 1764433200.12, "connection": "redis",
       "attempts": 0, "tenant": "acme", "chain": [...], "batch_id": "…", ...}

  ``v``, ``id`` (32 hex characters, the id haze returns and logs), ``job`` and
  ``payload`` are required; the rest is written only when set. A Node producer can
  queue a haze job with ``queue.add("send_invoice", {v: 1, id, job: "send_invoice",
  payload: {...}})``. A job whose data is not such an envelope, or names a job this
  app does not define, is moved to the failed set with the reason.

How haze's rules map onto BullMQ:

- Delays use the delayed set. Jobs are created with ``attempts: 1``: BullMQ never
  retries on its own, haze's manager decides (tries, backoff, ``retry_until``).
- ``Reserved.attempt`` = envelope ``attempts`` + ``attemptsMade`` (``atm``) +
  ``stalledCounter`` (``stc``) + 1. A retry moves the job to the delayed set with the
  backoff timestamp (``moveToDelayed``, which counts ``attemptsMade``); a crash
  restart is counted by BullMQ's stalled check (``stc``).
- ``job.release(delay)`` uses BullMQ's ``DelayedError`` machinery: ``moveToDelayed``
  with ``skipAttempt``, so the job keeps its id and no try is used.
- Stalled jobs: claiming sets a lock for ``retry_after`` (default 30s); the worker's
  heartbeat renews the locks of running jobs every ``retry_after / 2``; every
  ``retry_after`` a stalled check (``moveStalledJobsToWait``, shared by all workers
  through BullMQ's stalled-check key) puts back the jobs whose lock expired.
- ``fail()`` moves the job to the failed set (``failedReason`` = the exception line,
  ``stacktrace`` = the traceback). ``Queue.failed()`` reads the failed sets of the
  ``queues`` option; ``Queue.retry()`` re-adds the envelope as a new job.
- Speed: finishing a job (``ack``/``release``/``fail``) fetches the next job of the
  same queue in the same script call (``fetchNext``) and keeps it for the next
  ``reserve``; when that finds the queue empty, the next ``reserve`` waits for its
  marker without claiming first (BullMQ's ``drained``). An idle worker blocks on the
  queues' marker keys (``BZPOPMIN``) on a connection of its own, with the claim of the
  first queue (BullMQ's ``moveToActive``) written behind it in the same write: Redis
  runs the claim the moment the wait returns, so a job that wakes an idle worker is
  claimed with no round trip after its marker. That claim can run long after it was
  written, so it is ``moveToActive`` with a first line that takes the time from the
  server's clock (``_CLAIM_CLOCK``), used only next to the bullmq script whose
  arguments haze builds (same SHA). A stopping worker ends such a wait with
  ``CLIENT UNBLOCK`` and hands back what its claim took. ``enqueue_many`` adds a whole
  group in one ``MULTI`` round trip (``addBulk``). The per-job script calls (add, claim,
  finish) go over a lean connection of their own (``redis_wire``) with their arguments
  built from per-queue templates, checked against bullmq's own builders on first use.
  A plain job (no delay) after a queue's first is added by ``redis_add_job.lua``,
  haze's copy of BullMQ's ``addStandardJob`` for that shape (the same writes, about
  half the server time), used only next to the bullmq script it copies (same SHA);
  tests/drivers/test_redis_lite_add.py compares the two.
- Priority: ``reserve(["high", "default"])`` always tries ``high`` first; a job is
  only prefetched from the highest-priority queue, so a prefetch never jumps it.
  Claims are taken one at a time per process, so jobs start in queue order.
- ``size()`` counts waiting, delayed and active (claimed) jobs, like Laravel's Redis
  queue; ``purge()`` is BullMQ's ``drain`` (waiting and delayed jobs).
- Outages (docs/redis.md): a pooled connection that died with a restart is retried once
  on a fresh one; scripts a restarted Redis forgot are loaded again on ``NOSCRIPT``. The
  worker takes ``outage_errors`` as "Redis is unreachable" (one warning per outage,
  claims retried with backoff) and calls ``connection_lost()``, which drops the jobs
  fetched ahead (their locks expire and the stalled check returns them) and the
  blocking waits.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import itertools
import json
import logging
import math
import time
import uuid
import weakref
from collections import deque
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from haze._kernel.errors import MessageDecodeError, MissingDependencyError
from haze._kernel.message import (
    MAX_MESSAGE_SIZE,
    Message,
    decode,
    envelope_of,
    redis_key_part_error,
)
from haze.contracts.driver import (
    Concurrent,
    ConnectionAware,
    FailedJob,
    Interruptible,
    JobRecord,
    Leased,
    QueueCounts,
    Reserved,
    RunningJob,
)

try:
    import msgpack  # type: ignore[import-untyped]
    import redis.asyncio as aioredis
    from bullmq.redis_connection import RedisConnection, loadScript  # type: ignore[import-untyped]
    from bullmq.scripts import Scripts, raw2NextJobData  # type: ignore[import-untyped]
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import NoScriptError, WatchError
    from redis.exceptions import TimeoutError as RedisTimeoutError
except ImportError as e:  # pragma: no cover - exercised without the extra installed
    raise MissingDependencyError("the redis driver", "redis", "bullmq") from e

from haze.drivers.redis_wire import Wire, encode, wire_for
from haze.stores.redis import new_client, redis_settings

if TYPE_CHECKING:
    from redis.commands.core import AsyncScript

__all__ = ["RedisDriver", "RedisFailedJobs"]

log = logging.getLogger(__name__)

_HERE = Path(__file__).parent
#: BullMQ fails a job that stalled more often than this; haze's manager decides instead
#: (a reclaimed job with no try left is failed without running).
_MAX_STALLED = 1 << 30
_BULK_CHUNK = 1000
_COUNTED = ["wait", "paused", "delayed", "prioritized"]
_ADD_KEYS = ["wait", "paused", "meta", "id", "completed", "delayed", "active", "events", "marker"]
_LITE_KEYS = ["wait", "meta", "id", "active", "events", "marker"]
#: SHA-1 of bullmq's addStandardJob-9.lua that redis_add_job.lua copies: another bullmq
#: release may change what a job add writes, so the copy is used only next to this one
_ADD_STANDARD_SHA = "10f8d228e89ed4f765afc5b3bafb6defbb84e311"
#: SHA-1 of bullmq's moveToActive-11.lua, whose arguments ``_activate`` builds; the claim
#: sent behind a blocking wait (``_CLAIM_CLOCK`` + that script) is used only next to it
_MOVE_TO_ACTIVE_SHA = "d96ca626f1ea141b44a856b312fc636d99aa9ea9"
#: Put in front of moveToActive for the claim written behind a ``BZPOPMIN``: it runs
#: when the wait returns, maybe seconds after haze wrote it, so an empty timestamp
#: (ARGV[2]) is taken from the server's clock, in ms rounded as haze rounds its own
#: (``_now_ms``): the job's ``processedOn`` and the promotion of due delayed jobs are
#: as of the claim, not of the start of the wait.
_CLAIM_CLOCK = (
    "if ARGV[2] == '' then local t = redis.call('TIME') "
    "ARGV[2] = string.format('%d', t[1] * 1000 + math.floor((t[2] + 500) / 1000)) end\n"
)
#: How long after Redis's own timeout a blocking wait gives up on an answer (seconds)
_BLOCK_GRACE = 5.0
_ACTIVATE_KEYS = [
    "wait",
    "active",
    "prioritized",
    "events",
    "stalled",
    "limiter",
    "delayed",
    "paused",
    "meta",
    "pc",
    "marker",
]
_SIZED = [*_COUNTED, "active"]
#: The lists and sets find_job looks through, in redis_find_job.lua's order, and how
#: many jobs of each at most (the script blocks Redis while it runs).
_FIND_KEYS = ("active", "wait", "paused", "prioritized", "delayed", "completed")
_FIND_LIMIT = 2000
_LOCK_ERRORS = {
    -1: "the job no longer exists",
    -2: "its lock expired",
    -3: "it is no longer active",
    -6: "another worker owns its lock",
}


def check_queue(queue: str) -> None:
    if ":" in queue:
        raise ValueError(redis_key_part_error("a queue name", queue))


def _now_ms() -> int:
    return round(time.time() * 1000)


# ----------------------------------------------------------------------------- bullmq glue


class _NewJob:
    """What ``Scripts.addJob`` reads from a ``bullmq.Job``, with the body already JSON."""

    __slots__ = ("id", "name", "opts", "raw", "timestamp")
    data = None
    parent = None
    parentKey = None
    deduplication_id = None
    repeatJobKey = None

    def __init__(self, name: str, raw: str, delay_ms: int, timestamp: int) -> None:
        self.id = ""
        self.name = name
        self.raw = raw
        self.opts: dict[str, Any] = {"attempts": 1}
        if delay_ms:
            self.opts["delay"] = delay_ms
        self.timestamp = timestamp


class _QueueOpts:
    __slots__ = ("opts",)

    def __init__(self, lock_ms: int) -> None:
        self.opts = {"lockDuration": lock_ms}


class _ActiveJob:
    """What ``Scripts.moveToFinishedArgs`` reads from a ``bullmq.Job``."""

    __slots__ = ("id", "queue")
    opts: dict[str, Any] = {}  # noqa: RUF012 - read-only
    attempts = 1
    attemptsMade = 0

    def __init__(self, job_id: str, queue: _QueueOpts) -> None:
        self.id = job_id
        self.queue = queue


class _Scripts(Scripts):  # type: ignore[misc]
    """BullMQ's script helpers; the job body goes in as the JSON haze already encoded.

    ``add_args`` and ``complete_args`` build the same keys and arguments as BullMQ's
    ``addStandardJob`` and ``moveToFinishedArgs`` for the one shape haze uses on every
    job, reusing what does not change from job to job (the key lists, the packed
    options). Each checks its first result against BullMQ's own builder and falls back
    to it for good if they differ (another bullmq release), so the bytes sent are
    BullMQ's either way.
    """

    _ADD_OPTS = msgpack.packb({"attempts": 1})
    #: ``cjson.encode`` of those opts, as addStandardJob stores them (for the lite add)
    _ADD_OPTS_JSON = '{"attempts":1}'

    def __init__(self, prefix: str, queue: str, connection: Any) -> None:
        super().__init__(prefix, queue, connection)
        self._add: list[str] | bool | None = None  # the keys; False: BullMQ's builder
        #: (keys before the job's key, keys after it, opts, keep); False: BullMQ's builder
        self._complete: tuple[list[str], list[str], dict[str, Any], int] | bool | None = None

    def addJobArgs(self, job: Any) -> list[Any]:
        args: list[Any] = super().addJobArgs(job)
        args[1] = job.raw
        return args

    def _add_fast(self, job: _NewJob, keys: list[str]) -> tuple[list[str], list[Any]]:
        head = msgpack.packb(
            [self.keys[""], "", job.name, job.timestamp, None, None, None, None, None],
            use_bin_type=True,
        )
        return keys, [head, job.raw, self._ADD_OPTS, job.timestamp]

    def add_args(self, job: _NewJob) -> tuple[list[str], list[Any]] | None:
        """Keys and args of ``addStandardJob`` (a job with no delay), or None: use
        BullMQ's ``addJob``."""
        keys = self._add
        if keys is False:
            return None
        if not isinstance(keys, list):
            keys = self.getKeys(_ADD_KEYS)
            theirs = (keys, [*self.addJobArgs(job), job.timestamp])
            self._add = keys if self._add_fast(job, keys) == theirs else False
            return theirs
        return self._add_fast(job, keys)

    def complete_args(
        self, job: _ActiveJob, keep: int, token: str, fetch: bool
    ) -> tuple[list[str], list[Any]]:
        """``moveToFinishedArgs`` for a job that completed with no return value."""
        c = self._complete
        if isinstance(c, tuple) and c[3] == keep:
            return self._complete_fast(c, job.id, token, fetch, _now_ms())
        ref: tuple[list[str], list[Any]] = self.moveToFinishedArgs(
            job, None, "returnvalue", keep, "completed", token, fetch
        )
        if c is not False:
            keys, args = ref
            built = (keys[:11], keys[12:], msgpack.unpackb(args[7]), keep)
            same = self._complete_fast(built, job.id, token, fetch, args[1]) == ref
            self._complete = built if same else False
        return ref

    def _complete_fast(
        self,
        c: tuple[list[str], list[str], dict[str, Any], int],
        job_id: str,
        token: str,
        fetch: bool,
        now: int,
    ) -> tuple[list[str], list[Any]]:
        head, tail, opts, _ = c
        packed = msgpack.packb({**opts, "token": token}, use_bin_type=True)
        keys = [*head, self.toKey(job_id), *tail]
        args = [
            job_id,
            now,
            "returnvalue",
            "null",
            "completed",
            "1" if fetch else "",
            self.keys[""],
            packed,
        ]
        return keys, args


class _Collect:
    """A ``client`` for BullMQ script calls that only collects the ``EVALSHA`` commands
    (for ``Wire.execute_many``)."""

    __slots__ = ("commands",)

    def __init__(self) -> None:
        self.commands: list[tuple[Any, ...]] = [("MULTI",)]

    async def evalsha(self, sha: str, numkeys: int, *args: Any) -> None:
        self.commands.append(("EVALSHA", sha, numkeys, *args))


class _Pipe:
    """A ``client`` for BullMQ script calls that queues ``EVALSHA`` on a pipeline.

    redis-py's own pipelines send ``SCRIPT EXISTS`` before every execute; this keeps a
    batch to one round trip. A ``NOSCRIPT`` reply (Redis restarted) is handled by the
    caller: load the scripts and send the failed items again.
    """

    __slots__ = ("pipe",)

    def __init__(self, pipe: Any) -> None:
        self.pipe = pipe

    async def evalsha(self, sha: str, numkeys: int, *args: Any) -> None:
        self.pipe.execute_command("EVALSHA", sha, numkeys, *args)


class _EvalPipe(_Pipe):
    """A ``client`` for BullMQ script calls that queues ``EVAL`` of the script's text on
    a transaction: a ``NOSCRIPT`` reply there would fail that one command and still run
    the others (a retry's removal of the failed record without its job)."""

    __slots__ = ("texts",)

    def __init__(self, pipe: Any, scripts: Iterable[AsyncScript]) -> None:
        super().__init__(pipe)
        self.texts = {script.sha: script.script for script in scripts}

    async def evalsha(self, sha: str, numkeys: int, *args: Any) -> None:
        self.pipe.execute_command("EVAL", self.texts[sha], numkeys, *args)


# ----------------------------------------------------------------------------- per loop state


class _Link:
    """The Redis client, BullMQ scripts and consumer state of one event loop."""

    def __init__(self, driver: RedisDriver) -> None:
        self.client: aioredis.Redis = new_client(driver._url, driver._kwargs)
        #: the per-job script calls (add, claim, finish) go through a lean connection of
        #: their own (see redis_wire); None when it cannot be used (TLS, Unix socket)
        self.wire: Wire | None = wire_for(self.client)
        self.fast: Any = self.wire if self.wire is not None else self.client
        self.connection = RedisConnection(self.client, skipVersionCheck=True)
        self.commands: dict[str, AsyncScript] = self.connection.commands
        self.move_back: AsyncScript = self.client.register_script(
            loadScript("moveJobFromActiveToWait-9.lua")
        )
        self.find_failed: AsyncScript = self.client.register_script(
            (_HERE / "redis_find_failed.lua").read_text()
        )
        self.find_job: AsyncScript = self.client.register_script(
            (_HERE / "redis_find_job.lua").read_text()
        )
        self.forget_failed: AsyncScript = self.client.register_script(
            (_HERE / "redis_forget_failed.lua").read_text()
        )
        #: haze's copy of addStandardJob for the plain job of a single dispatch
        #: (redis_add_job.lua): half the server time per add. Only on the lean
        #: connection, and only next to the BullMQ script it copies.
        self.add_lite: AsyncScript | None = None
        if self.wire is not None and self.commands["addStandardJob"].sha == _ADD_STANDARD_SHA:
            self.add_lite = self.client.register_script((_HERE / "redis_add_job.lua").read_text())
        #: queue -> (wire, script, encoded head) of its lite add; a queue gets one once
        #: BullMQ's own script has added a job with the arguments of haze's template
        #: (add_args), so the lite add stands in for exactly that call
        self.lite_adds: dict[str, tuple[Wire, AsyncScript, bytes]] = {}
        #: one lean connection per list of queues waited on, for BZPOPMIN on their
        #: markers with the claim of the first one behind it (RedisDriver._block)
        self.blockers: dict[tuple[str, ...], Wire | None] = {}
        #: the claim sent behind a wait: bullmq's moveToActive on the server's clock;
        #: None (another bullmq, no lean connection): claim after the wait returns
        self.claim_after_wait = self._claim_script()
        self.claim_loaded = False
        self._claim_heads: dict[str, bytes] = {}
        #: (queue, due) when the last claim of a job on the first queue, with the
        #: finishing of one (fetchNext) or behind a wait, found it empty: the next
        #: reserve waits for a marker without claiming first (BullMQ's ``drained``)
        self.drained: tuple[str, int] | None = None
        self.prefix = driver.prefix
        self._scripts: dict[str, _Scripts] = {}
        #: jobs fetched by ack/release/fail (fetchNext), handed out by the next reserve
        self.prefetched: deque[Reserved] = deque()
        self.fetch_next = False
        self.first: str | None = None
        self.consumed: list[str] = []
        #: (job id, lock token) of the jobs claimed here and not settled yet
        self.open: set[tuple[str, str]] = set()
        self.stop = asyncio.Event()
        self.closing = asyncio.Event()
        self.claiming = asyncio.Lock()
        #: the blocking wait on each list of queues, done with its (woke, known) outcome
        #: (RedisDriver._wait)
        self.waits: dict[tuple[str, ...], asyncio.Future[tuple[bool, int | None]]] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self.stalled_task: asyncio.Task[None] | None = None

    def scripts(self, queue: str) -> _Scripts:
        s = self._scripts.get(queue)
        if s is None:
            check_queue(queue)
            s = self._scripts[queue] = _Scripts(self.prefix, queue, self.connection)
        return s

    async def script(
        self, name: str, keys: list[str], args: list[Any], *, fixed_keys: bool = False
    ) -> Any:
        """Run one of BullMQ's scripts on the lean connection (redis-py without one)."""
        if self.wire is not None:
            return await self.wire.run_script(
                self.commands[name], keys, args, fixed_keys=fixed_keys
            )
        return await self.commands[name](keys=keys, args=args)

    def lite_add(self, s: _Scripts) -> tuple[Wire, AsyncScript, bytes] | None:
        """How to call ``redis_add_job.lua`` on a queue: the encoded head holds its keys,
        prefix and opts; the job's name, JSON body and timestamp follow it. None: no
        lite add (no lean connection, another bullmq, or the template not checked)."""
        if self.add_lite is None or self.wire is None or not isinstance(s._add, list):
            return None
        keys = s.getKeys(_LITE_KEYS)
        head = Wire.script_head(self.add_lite, keys, [s.keys[""], s._ADD_OPTS_JSON], 3)
        return self.wire, self.add_lite, head

    def _claim_script(self) -> AsyncScript | None:
        move_to_active = self.commands["moveToActive"]
        if self.wire is None or move_to_active.sha != _MOVE_TO_ACTIVE_SHA:
            return None
        return self.client.register_script(_CLAIM_CLOCK + str(move_to_active.script))

    def blocker(self, queues: tuple[str, ...]) -> Wire | None:
        """The lean connection that waits on these queues' markers (None: redis-py's)."""
        if queues not in self.blockers:
            self.blockers[queues] = wire_for(self.client, track_id=True)
        return self.blockers[queues]

    def claim_head(self, queue: str) -> bytes:
        """The encoded start of the claim sent behind a wait on ``queue``: its keys, the
        key prefix and an empty timestamp (the server's clock); the options follow."""
        head = self._claim_heads.get(queue)
        if head is None:
            assert self.claim_after_wait is not None
            s = self.scripts(queue)
            head = Wire.script_head(
                self.claim_after_wait, s.getKeys(_ACTIVATE_KEYS), [s.keys[""], ""], 1
            )
            self._claim_heads[queue] = head
        return head

    def take(self, queues: Sequence[str]) -> Reserved | None:
        for job in self.prefetched:
            if job.queue in queues:
                self.prefetched.remove(job)
                return job
        return None

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


# ----------------------------------------------------------------------------- failed jobs


class RedisFailedJobs:
    """Failed jobs = BullMQ's failed sets of the connection's ``queues``.

    ``FailedJob.id`` is the haze message id (``bullmq:<queue>:<job id>`` for a job
    whose data is not a haze envelope). Lookups by haze id scan the failed sets in
    one server-side script (``redis_find_failed.lua``); ids seen by ``list``/``find``
    are remembered, so ``Queue.retry()`` of every failed job stays linear.
    """

    def __init__(self, driver: RedisDriver) -> None:
        self._d = driver
        self._where: dict[str, tuple[str, str]] = {}

    def _queues(self, queue: str | None) -> list[str]:
        if queue:
            return [queue]
        # Failed sets are per queue: a job's own queue must be looked at even when the
        # connection's ``queues`` option does not list it.
        app = self._d.app
        named = app.job_queues(self._d.name) if app is not None else {}
        return list(dict.fromkeys([*self._d.queues, *named]))

    async def record(self, job: FailedJob) -> None:
        """Store a failure that did not come from this driver's ``fail()``."""
        link = self._d._link()
        s = link.scripts(job.queue)
        finished = round(job.failed_at * 1000)
        async with link.client.pipeline(transaction=True) as pipe:
            pipe.hset(
                s.toKey(job.id),
                mapping={
                    "name": job.name,
                    "data": job.body,
                    "opts": '{"attempts":1}',
                    "timestamp": finished,
                    "delay": 0,
                    "priority": 0,
                    "atm": 1,
                    "failedReason": _reason(job.exception),
                    "finishedOn": finished,
                    "stacktrace": json.dumps([job.exception]),
                },
            )
            pipe.zadd(s.keys["failed"], {job.id: finished})
            await pipe.execute()

    async def list(self, queue: str | None = None) -> list[FailedJob]:
        link = self._d._link()
        out: list[FailedJob] = []
        for q in self._queues(queue):
            s = link.scripts(q)
            ids = [str(i) for i in await link.client.zrange(s.keys["failed"], 0, -1)]
            for i in range(0, len(ids), _BULK_CHUNK):
                chunk = ids[i : i + _BULK_CHUNK]
                async with link.client.pipeline(transaction=False) as pipe:
                    for job_id in chunk:
                        pipe.hmget(s.toKey(job_id), *_FAILED_FIELDS)
                    rows = await pipe.execute()
                for job_id, row in zip(chunk, rows, strict=True):
                    if row[1] is not None:
                        out.append(self._record(q, job_id, row))
        out.sort(key=lambda j: j.failed_at)
        # A message id that failed twice (a redelivery, a retried job failing again) has
        # two BullMQ jobs in the failed sets: it is one failed job, its newest record.
        newest = {j.id: j for j in out}
        return [j for j in out if newest[j.id] is j]

    def _record(self, queue: str, job_id: str, row: Sequence[str | None]) -> FailedJob:
        name, data, reason, stack, finished_on = row
        exception = reason or ""
        if stack:
            try:
                frames = json.loads(stack)
                if isinstance(frames, list) and frames:
                    exception = str(frames[-1])
            except (ValueError, RecursionError):
                pass
        job = FailedJob.from_body(
            data or "",
            id=None,
            connection=self._d.name,
            queue=queue,
            exception=exception,
            failed_at=_epoch_ms(finished_on) or 0.0,
            name=name or "<undecodable>",
        )
        if not job.id:  # not a haze envelope: BullMQ's own id
            job.id = f"bullmq:{queue}:{job_id}"
        self._where[job.id] = (queue, job_id)
        return job

    async def _locate(self, id: str) -> tuple[str, str, Sequence[str | None]] | None:
        link = self._d._link()
        candidates: list[tuple[str, str]] = []
        if id.startswith("bullmq:") and id.count(":") >= 2:
            q, job_id = id[len("bullmq:") :].rsplit(":", 1)
            candidates.append((q, job_id))
        elif id in self._where:
            candidates.append(self._where[id])
        for q, job_id in candidates:
            found = await self._failed_row(link, q, job_id)
            if found is not None and (id.startswith("bullmq:") or _envelope_id(found[1]) == id):
                return q, job_id, found
        queues = self._queues(None)
        keys = [link.scripts(q).keys["failed"] for q in queues]
        prefixes = [link.scripts(q).keys[""] for q in queues]
        hit = await link.find_failed(keys=keys, args=[id, *prefixes])
        if not hit:
            self._where.pop(id, None)
            return None
        q, job_id = queues[int(hit[0]) - 1], str(hit[1])
        found = await self._failed_row(link, q, job_id)
        return None if found is None else (q, job_id, found)

    @staticmethod
    async def _failed_row(link: _Link, queue: str, job_id: str) -> Sequence[str | None] | None:
        s = link.scripts(queue)
        async with link.client.pipeline(transaction=False) as pipe:
            pipe.zscore(s.keys["failed"], job_id)
            pipe.hmget(s.toKey(job_id), *_FAILED_FIELDS)
            score, row = await pipe.execute()
        return None if score is None or row[1] is None else row

    async def find(self, id: str) -> FailedJob | None:
        found = await self._locate(id)
        return None if found is None else self._record(*found)

    async def forget(self, id: str) -> bool:
        return await self._remove(id, None) > 0

    async def _remove(self, id: str, up_to: float | None) -> int:
        """Remove every failed BullMQ job of message ``id`` (only those that failed at or
        before ``up_to`` when given, newest first); how many."""
        n = 0
        while (found := await self._locate(id)) is not None:
            q, job_id, row = found
            if up_to is not None and int(row[4] or 0) / 1000 > up_to:
                break  # failed again after the claim: that record stays
            self._where.pop(id, None)
            if not await self._d._link().scripts(q).remove(job_id, False):
                break  # locked (not failed any more): leave it to its worker
            n += 1
        return n

    def _claim_key(self, id: str) -> str:
        # beside BullMQ's queues, under the connection's prefix: a name no queue takes
        return f"{self._d.prefix}:haze-retry-claim:{id}"

    async def claim_retry(self, id: str, token: str, lease: float) -> FailedJob | None:
        found = await self._locate(id)
        if found is None:
            return None
        job = self._record(*found)
        claim = json.dumps({"token": token, "failed_at": job.failed_at})
        link = self._d._link()
        key = self._claim_key(id)
        if not await link.client.set(key, claim, nx=True, px=max(1, round(lease * 1000))):
            return None
        # Another caller may have retried it (and ended its claim) since we found it.
        if await self._failed_row(link, found[0], found[1]) is None:
            await link.client.delete(key)
            return None
        return job

    async def retried(self, id: str, token: str) -> bool:
        # The claim first: every run of a retried job asks, and locating a record that
        # is gone scans the failed sets.
        client = self._d._link().client
        key = self._claim_key(id)
        raw = await client.get(key)
        claim = json.loads(raw) if raw else None
        if not isinstance(claim, dict) or claim.get("token") != token:
            return False
        gone = await self._remove(id, float(claim.get("failed_at") or 0.0)) > 0
        await client.delete(key)
        return gone

    # -- pages (FailedPages): counted with ZCOUNT, read one page of hashes at a time ----

    @staticmethod
    def _scores(since: float | None, until: float | None) -> tuple[str, str]:
        """The failed sets' score range (finishedOn, in ms) for ``since``/``until``."""
        low = "-inf" if since is None else str(math.ceil(since * 1000))
        high = "+inf" if until is None else str(math.floor(until * 1000))
        return low, high

    async def count(
        self, queue: str | None = None, since: float | None = None, until: float | None = None
    ) -> int:
        link = self._d._link()
        low, high = self._scores(since, until)
        async with link.client.pipeline(transaction=False) as pipe:
            for q in self._queues(queue):
                pipe.zcount(link.scripts(q).keys["failed"], low, high)
            return sum(int(n) for n in await pipe.execute())

    async def counts(self) -> dict[str, int]:
        link = self._d._link()
        queues = self._queues(None)
        async with link.client.pipeline(transaction=False) as pipe:
            for q in queues:
                pipe.zcard(link.scripts(q).keys["failed"])
            sizes = await pipe.execute()
        return {q: int(n) for q, n in zip(queues, sizes, strict=True) if int(n)}

    async def page(
        self,
        queue: str | None = None,
        since: float | None = None,
        until: float | None = None,
        *,
        offset: int = 0,
        limit: int = 50,
        text: int | None = None,
    ) -> builtins.list[FailedJob]:
        link = self._d._link()
        low, high = self._scores(since, until)
        queues = self._queues(queue)
        want = max(0, offset) + max(0, limit)
        # The newest `want` ids of each queue's set (ids and scores only), merged.
        async with link.client.pipeline(transaction=False) as pipe:
            for q in queues:
                key = link.scripts(q).keys["failed"]
                pipe.zrevrangebyscore(key, high, low, start=0, num=want, withscores=True)
            ranked = await pipe.execute()
        merged = [
            (score, q, str(i)) for q, rows in zip(queues, ranked, strict=True) for i, score in rows
        ]
        merged.sort(reverse=True)
        chosen = merged[max(0, offset) : want]
        async with link.client.pipeline(transaction=False) as pipe:
            for _, q, job_id in chosen:
                pipe.hmget(link.scripts(q).toKey(job_id), *_FAILED_FIELDS)
            rows = await pipe.execute()
        out: builtins.list[FailedJob] = []
        for (_, q, job_id), row in zip(chosen, rows, strict=True):
            if row[1] is not None:
                job = self._record(q, job_id, row)
                if text is not None and len(job.exception) > text:
                    job.exception = job.exception[:text]
                out.append(job)
        return out

    async def requeue_claimed(self, id: str, token: str, body: str, message: Message) -> bool:
        """Add the BullMQ job and delete the failed record in one ``MULTI``/``EXEC``,
        under a ``WATCH`` of the claim: when the claim changes before ``EXEC`` (its lease
        ended, another caller took it), nothing of it is written and the claim is read
        again."""
        link = self._d._link()
        key = self._claim_key(id)
        queues = self._queues(None)
        s = link.scripts(message.queue)
        for _ in range(_WATCH_TRIES):
            async with link.client.pipeline(transaction=True) as pipe:
                await pipe.watch(key)
                raw = await pipe.get(key)
                claim = json.loads(raw) if raw else None
                if not isinstance(claim, dict) or claim.get("token") != token:
                    return False
                up_to = round(float(claim.get("failed_at") or 0.0) * 1000)
                pipe.multi()  # type: ignore[no-untyped-call]
                await s.addJob(
                    _NewJob(message.job, body, 0, _now_ms()),
                    _EvalPipe(pipe, link.commands.values()),
                )
                failed = [link.scripts(q).keys["failed"] for q in queues]
                prefixes = [link.scripts(q).keys[""] for q in queues]
                pipe.execute_command(
                    "EVAL", link.forget_failed.script, len(failed), *failed, id, up_to, *prefixes
                )
                pipe.delete(key)
                try:
                    results = await pipe.execute(raise_on_error=False)
                except WatchError:
                    continue
            self._where.pop(id, None)
            for r in results:
                if isinstance(r, Exception):
                    raise r
            return True
        return False

    async def flush(self, older_than: float | None = None) -> int:
        link = self._d._link()
        grace = round((older_than or 0) * 1000)
        n = 0
        for q in self._queues(None):
            n += len(await link.scripts(q).cleanJobsInSet("failed", grace, 0))
        self._where.clear()
        return n


_FAILED_FIELDS = ("name", "data", "failedReason", "stacktrace", "finishedOn")
#: How often a retry's transaction is sent again when its claim changed under WATCH.
_WATCH_TRIES = 5
#: How long a job that finished while Redis was unreachable stays marked done: its claim
#: comes back through the stalled check after retry_after, and waits in the queue.
_DONE_KEEP = 86400


def _envelope_id(data: str | None) -> str | None:
    d = envelope_of(data or "")
    return str(d["id"]) if d is not None and "id" in d else None


def _epoch_ms(raw: str | bytes | None) -> float | None:
    """Seconds from a hash's BullMQ timestamp (``finishedOn``, epoch milliseconds); None
    when it holds no count of milliseconds (absent, or edited by hand)."""
    if isinstance(raw, bytes):
        raw = raw.decode("latin-1")
    if raw and len(raw) <= 15 and raw.isascii() and raw.isdigit():  # up to year 33658
        return int(raw) / 1000
    return None


def _reason(exception: str) -> str:
    """BullMQ's ``failedReason``: the exception line (the last line of a traceback)."""
    lines = [ln for ln in exception.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else exception


# ----------------------------------------------------------------------------- the driver


class RedisDriver(Interruptible, Leased, ConnectionAware, Concurrent):
    """A queue connection on Redis with BullMQ's data model; see the module docstring."""

    remote = True
    local_callbacks = False
    inline = False
    #: what the worker treats as "Redis is unreachable" (one warning per outage, retries)
    outage_errors: tuple[type[BaseException], ...] = (RedisConnectionError, RedisTimeoutError)

    def __init__(self, name: str, options: dict[str, Any], app: Any = None):
        self.name = name
        self.app = app
        self.options = options
        self.max_message_size: int | None = options.get("max_message_size") or MAX_MESSAGE_SIZE
        self.concurrency: int = options.get("concurrency") or 1
        self.prefix: str = options.get("prefix") or "haze"
        self.queues: list[str] = list(options.get("queues") or ["default"])
        self.keep_completed: int = options.get("keep_completed") or 1000
        self.keep_failed: int | None = options.get("keep_failed")
        lock = float(options.get("retry_after") or 30.0)
        self.lock_ms = max(1, round(lock * 1000))
        #: the worker renews running jobs' locks this often (BullMQ's lockRenewTime)
        self.heartbeat_interval = lock / 2
        #: how often stalled jobs are looked for (BullMQ's stalledInterval)
        self.stalled_interval = lock
        self._url, self._kwargs, _ = redis_settings(
            app,
            options.get("connection"),
            options.get("url"),
            where=f"connections.{name}.connection",
            source=None if app is None else app.queue_config.source,  # None: built alone
        )
        self._worker_opts = {"lockDuration": self.lock_ms}
        self._queue_opts = _QueueOpts(self.lock_ms)
        self._id = uuid.uuid4().hex
        self._tokens = itertools.count(1)
        self._links: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Link] = (
            weakref.WeakKeyDictionary()
        )
        self._last: tuple[asyncio.AbstractEventLoop, _Link] | None = None
        self.failed = RedisFailedJobs(self)
        #: Jobs that finished while Redis was unreachable (their ack failed), by token:
        #: recorded as done when it answers again (``_record_lost``).
        self._lost: dict[tuple[str, str], Reserved] = {}

    def _link(self) -> _Link:
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last[0] is loop:
            return last[1]
        link = self._links.get(loop)
        if link is None:
            link = self._links[loop] = _Link(self)
        self._last = (loop, link)
        return link

    # -- producer -----------------------------------------------------------------

    async def enqueue(self, body: str, message: Message, delay: float) -> None:
        link = self._link()
        delay_ms = round(delay * 1000) if delay > 0 else 0
        if not delay_ms:
            lite = link.lite_adds.get(message.queue)
            if lite is not None:
                wire, script, head = lite
                # no reply check: addStandardJob's errors are about parents, which a
                # plain job does not have
                await wire.run_head(script, head, (message.job, body, _now_ms()))
                return
        job = _NewJob(message.job, body, delay_ms, _now_ms())
        s = link.scripts(message.queue)
        call = None if delay_ms else s.add_args(job)
        if call is None:
            await s.addJob(job, link.fast)
            return
        result = await link.script("addStandardJob", *call, fixed_keys=True)
        if isinstance(result, int) and result < 0:
            raise s.finishedErrors({"code": result, "parentKey": None, "command": "addJob"})
        lite = link.lite_add(s)
        if lite is not None:
            link.lite_adds[message.queue] = lite

    async def enqueue_many(self, items: Sequence[tuple[str, Message, float]]) -> None:
        """BullMQ's ``addBulk``: each chunk of jobs in one ``MULTI`` round trip."""
        if not items:
            return
        link = self._link()
        now = _now_ms()
        jobs = [
            (m.queue, _NewJob(m.job, body, round(d * 1000) if d > 0 else 0, now))
            for body, m, d in items
        ]
        for i in range(0, len(jobs), _BULK_CHUNK):
            await self._add_chunk(link, jobs[i : i + _BULK_CHUNK])

    async def _add_chunk(self, link: _Link, jobs: list[tuple[str, _NewJob]]) -> None:
        for _ in range(2):
            if link.wire is not None:
                collect = _Collect()
                for queue, job in jobs:
                    await link.scripts(queue).addJob(job, collect)
                collect.commands.append(("EXEC",))
                replies = await link.wire.execute_many(collect.commands)
                for r in replies:
                    if isinstance(r, Exception):  # MULTI refused or EXEC aborted
                        raise r
                results = replies[-1]
            else:
                async with link.client.pipeline(transaction=True) as pipe:
                    proxy = _Pipe(pipe)
                    for queue, job in jobs:
                        await link.scripts(queue).addJob(job, proxy)
                    results = await pipe.execute(raise_on_error=False)
            missing = [
                j for j, r in zip(jobs, results, strict=True) if isinstance(r, NoScriptError)
            ]
            for r in results:
                if isinstance(r, Exception) and not isinstance(r, NoScriptError):
                    raise r
            if not missing:
                return
            for name in ("addStandardJob", "addDelayedJob"):
                script = link.commands[name]
                script.sha = await link.client.script_load(script.script)
            jobs = missing
        raise RuntimeError("Redis did not keep BullMQ's scripts loaded (SCRIPT LOAD failed)")

    # -- consumer -----------------------------------------------------------------

    def _consume(self, link: _Link, queues: Sequence[str]) -> None:
        link.first = queues[0]
        link.fetch_next = True
        if link.stop.is_set():
            link.stop = asyncio.Event()
        for q in queues:
            if q not in link.consumed:
                link.consumed.append(q)
        if link.stalled_task is None or link.stalled_task.done():
            link.stalled_task = asyncio.ensure_future(self._stalled_loop(link))

    def _reserved(self, queue: str, data: dict[str, str], job_id: str, token: str) -> Reserved:
        body = data.get("data") or ""
        try:
            message: Message | None = decode(body)
            error: BaseException | None = None
        except Exception as e:
            message, error = None, e
        base = message.attempts if message is not None else 0
        counts = []
        for field in ("atm" if "atm" in data else "attemptsMade", "stc"):
            raw = data.get(field)
            if raw is None or raw == "" or (raw.isascii() and raw.isdigit()):
                counts.append(int(raw or 0))
                continue
            # A hand-edited hash: the attempt cannot be counted, so the job cannot be run
            # under its tries. It is failed with the reason (its own fields only: it must
            # never look like Redis being unreachable, nor touch another job).
            counts.append(0)
            message, error = (
                None,
                MessageDecodeError(
                    f'BullMQ job {job_id} on {self.name}/{queue}: field "{field}" of its hash '
                    f"is {raw[:40]!r}, not a count of attempts; the job cannot be run under "
                    "its tries and is failed"
                ),
            )
        attempt = base + counts[0] + counts[1] + 1
        return Reserved(message, attempt, body, queue, (str(job_id), token), error)

    async def _claimed(
        self, link: _Link, queue: str, data: dict[str, str], job_id: str, token: str
    ) -> Reserved | None:
        """A job this worker now holds the lock of; counters that are not integers are
        reset first, since BullMQ's scripts ``HINCRBY`` them (failing the job, the stalled
        check) and a script that errors halfway leaves the job in no set at all.

        None: the job had already finished, during an outage that lost its ack (a
        ``_record_lost`` marker names it), and is now completed without running again.
        Only a job on a later attempt can be one: the others cost no extra call."""
        job = self._reserved(queue, data, job_id, token)
        link.open.add(job.token)
        bad: dict[Any, Any] = {
            f: "0"
            for f in ("atm", "stc", "attemptsMade")
            if data.get(f) not in (None, "") and not (data[f].isascii() and data[f].isdigit())
        }
        if bad:
            await link.client.hset(link.scripts(queue).toKey(str(job_id)), mapping=bad)
        if job.attempt > 1 and await self._finished_before(link, job):
            return None
        return job

    async def _finished_before(self, link: _Link, job: Reserved) -> bool:
        """True when ``job`` (just claimed) already finished once while Redis was
        unreachable: it is completed now, unrun."""
        if job.message is None:
            return False
        if not await link.client.exists(self._done_key(link, job.queue, job.message.id)):
            return False
        link.open.discard(job.token)
        keys, args = link.scripts(job.queue).complete_args(
            _ActiveJob(job.token[0], self._queue_opts), self.keep_completed, job.token[1], False
        )
        await link.script("moveToFinished", keys, args)
        log.info(
            "haze redis: job %s on %s/%s already finished while Redis was unreachable: "
            "completed without running it again",
            job.message.id,
            self.name,
            job.queue,
        )
        return True

    def _claim_opts(self) -> tuple[str, bytes]:
        """A new lock token and moveToActive's packed options with it."""
        token = f"{self._id}:{next(self._tokens)}"
        packed = msgpack.packb(
            {"token": token, "lockDuration": self.lock_ms, "limiter": None}, use_bin_type=True
        )
        return token, packed

    async def _activate(self, link: _Link, queue: str) -> tuple[Reserved | None, int]:
        s = link.scripts(queue)
        while True:  # again after a job that had already finished (``_claimed``)
            token, packed = self._claim_opts()
            # bullmq's Scripts.moveToActive, on the lean connection
            args = [s.keys[""], _now_ms(), packed]
            keys = s.getKeys(_ACTIVATE_KEYS)
            raw = await link.script("moveToActive", keys, args, fixed_keys=True)
            data, job_id, _, due = raw2NextJobData(raw)
            if not data:
                return None, int(due or 0)
            job = await self._claimed(link, queue, data, job_id, token)
            if job is not None:
                return job, 0

    async def _claim(
        self, link: _Link, order: Sequence[str], known: int | None = None
    ) -> tuple[Reserved | None, int]:
        """Queues in priority order. One claim at a time per process: jobs start in the
        order they were queued (a later claim cannot overtake an earlier one).

        ``known``: the first queue was just found empty by a claim (its next delayed
        job is due then, 0: none), so it is not asked again.
        """
        due = 0
        async with link.claiming:
            job = link.take(order) if link.prefetched else None
            if job is not None:
                return job, 0
            for i, q in enumerate(order):
                if i == 0 and known is not None:
                    next_due = known
                else:
                    job, next_due = await self._activate(link, q)
                    if job is not None:
                        return job, 0
                if next_due and (not due or next_due < due):
                    due = next_due
        return None, due

    async def reserve(self, queues: Sequence[str], wait: float) -> Reserved | None:
        link = self._link()
        if self._lost:
            await self._record_lost(link)
        order = list(queues) if queues else self.queues
        self._consume(link, order)
        job = link.take(order) if link.prefetched else None
        if job is not None:
            return job
        stop = link.stop
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, wait)
        # The queue was just found empty: wait for a marker without asking it again.
        # Only when this call waits (the claim behind the wait asks it then), and on one
        # queue: claiming a lower queue before that wait could jump a job that came to
        # the first one since.
        drained, link.drained = link.drained, None
        one = drained is not None and order == [drained[0]] and wait > 0
        known = drained[1] if drained is not None and one else None
        owed = known is not None  # the first queue is not asked below: a wait must follow
        while True:
            job, due = await self._claim(link, order, known)
            if job is not None:
                return job
            while True:  # wait for a marker (or a delayed job's due time), then claim again
                remaining = deadline - loop.time()
                if stop.is_set() or (remaining <= 0 and not owed):
                    if known is not None and not stop.is_set():
                        link.drained = (order[0], known)  # the last claim's news still
                    return None
                remaining, owed = max(remaining, 0.001), False
                due_first = False
                if due:
                    until_due = max(0.001, due / 1000 - time.time())
                    if until_due <= remaining:
                        remaining, due_first = until_due, True
                woke, known = await self._wait(link, order, remaining, stop)
                if stop.is_set():
                    return None
                if woke or due_first or known is not None:
                    break

    async def _wait(
        self, link: _Link, queues: list[str], within: float, stop: asyncio.Event
    ) -> tuple[bool, int | None]:
        """Block on the queues' BullMQ markers (``_block``), one wait per list of queues.

        The first slot to wait on these queues runs the wait itself, so the reply that
        ends it resumes that slot from ``data_received`` with no event-loop pass in
        between; the other slots wait for its outcome. It ends on a marker, on its
        timeout (Redis's own) or when ``interrupt`` unblocks it.

        ``(woke, known)``: woke when a marker was popped or a job claimed (claim again:
        a claimed job is in ``link.prefetched``); known when the claim behind the wait
        found the first queue empty: its next delayed job's due time (0: none).
        """
        key = tuple(queues)
        shared = link.waits.get(key)
        if shared is None:
            shared = link.waits[key] = asyncio.get_running_loop().create_future()
            result: tuple[bool, int | None] = (False, None)
            try:
                result = await self._block(link, key, within)
            finally:
                if link.waits.get(key) is shared:
                    del link.waits[key]
                shared.set_result(result)  # the other slots: (False, None) after an error
            return result
        stopper = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait(
                (shared, stopper), timeout=within, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopper.cancel()
        return shared.result() if shared.done() else (False, None)

    async def _block(
        self, link: _Link, queues: tuple[str, ...], within: float
    ) -> tuple[bool, int | None]:
        """``BZPOPMIN`` on the markers, and in the same write the claim of the first
        queue: Redis runs it as soon as the wait returns (a marker, the timeout or
        ``CLIENT UNBLOCK``), so a job that wakes the worker is claimed with no round trip
        after its marker, as BullMQ's worker would claim it after its own ``BZPOPMIN``.
        See ``_wait``."""
        timeout = max(0.001, within)
        markers = [link.scripts(q).keys["marker"] for q in queues]
        wire = link.blocker(queues)
        if wire is None:
            return await self._block_redis_py(link, markers, timeout)
        stop = link.stop
        script = link.claim_after_wait
        commands = [encode("BZPOPMIN", *markers, timeout)]
        token = ""
        if script is not None:
            if not link.claim_loaded:
                script.sha = await wire.script_load(script.script)
                link.claim_loaded = True
                if stop.is_set():
                    return False, None
            token, packed = self._claim_opts()
            commands.append(Wire.script_call(link.claim_head(queues[0]), packed))
        # a server that stopped answering without a reset: give up a little after
        # Redis's own timeout (the calls fail as a lost connection)
        guard = asyncio.get_running_loop().call_later(timeout + _BLOCK_GRACE, wire.close)
        try:
            replies = await wire.pipeline(commands)
        except asyncio.CancelledError:
            wire.close()  # its claim's reply would be dropped: end it with the connection
            raise
        except RedisConnectionError:
            if stop.is_set():  # cut while stopping (Redis unreachable): nothing claimed
                return False, None
            raise
        finally:
            guard.cancel()
        for r in replies:
            if isinstance(r, Exception) and not isinstance(r, NoScriptError):
                raise r
        return await self._claimed_after_wait(link, queues[0], replies, token)

    @staticmethod
    async def _block_redis_py(
        link: _Link, markers: list[str], timeout: float
    ) -> tuple[bool, int | None]:
        """The wait through redis-py (TLS, a Unix socket), with no claim behind it: a
        stop cancels it (redis-py then drops that connection), and a connection gone
        half-open gives up a little after Redis's own timeout."""
        call = asyncio.ensure_future(link.client.bzpopmin(markers, timeout))
        call.add_done_callback(lambda t: t.cancelled() or t.exception())
        stopper = asyncio.ensure_future(link.stop.wait())
        try:
            await asyncio.wait(
                (call, stopper), timeout=timeout + _BLOCK_GRACE, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopper.cancel()
            if not call.done():
                call.cancel()
        if not call.done():
            return False, None
        return bool(call.result()), None  # a connection error reaches the worker

    async def _claimed_after_wait(
        self, link: _Link, queue: str, replies: list[Any], token: str
    ) -> tuple[bool, int | None]:
        """What the claim sent behind a wait took: into ``link.prefetched`` (or back to
        the queue when the worker stopped meanwhile). See ``_wait``."""
        popped = bool(replies[0])
        if len(replies) < 2:
            return popped, None
        if isinstance(replies[1], NoScriptError):  # a restarted Redis: claim as usual
            link.claim_loaded = False
            return True, None
        data, job_id, _, due = raw2NextJobData(replies[1])
        if not data:
            return popped, int(due or 0)
        job = await self._claimed(link, queue, data, job_id, token)
        if job is not None:
            link.prefetched.append(job)
        if not link.fetch_next:  # the worker stopped meanwhile: hand it back
            await self._return_prefetched(link)
        return True, None

    async def _unblock(self, link: _Link) -> int:
        """End the blocking waits in progress with ``CLIENT UNBLOCK`` (from the lean
        connection); how many. Each wait's claim then runs at once and what it takes is
        handed back: cutting the connection instead could leave a job claimed by nobody
        until its lock expires. A ``BZPOPMIN`` can reach Redis after the ``UNBLOCK``
        sent for it (two connections): those are unblocked again, for up to a second."""
        targets = dict(link.waits)
        if link.wire is None:
            return 0
        n = 0
        for _ in range(50):
            live = [k for k, fut in targets.items() if link.waits.get(k) is fut]
            if not live:
                break
            for key in live:
                wire = link.blockers.get(key)
                client_id = wire.client_id if wire is not None else None
                if client_id is not None:
                    n += int(await link.wire.execute("CLIENT", "UNBLOCK", client_id))
            await asyncio.sleep(0.02)
        return n

    def interrupt(self) -> None:
        """The worker is stopping: end idle waits now and hand prefetched jobs back."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        for link_loop, link in list(self._links.items()):
            if link_loop is loop:
                self._interrupt(link)
            elif link_loop.is_running():
                link_loop.call_soon_threadsafe(self._interrupt, link)

    def _interrupt(self, link: _Link) -> None:
        link.fetch_next = False
        link.drained = None
        link.stop.set()
        if link.prefetched:
            link.spawn(self._return_prefetched(link))
        if link.waits:
            link.spawn(self._unblock_quietly(link))

    async def _unblock_quietly(self, link: _Link) -> None:
        try:
            await self._unblock(link)
        except Exception:
            # Redis unreachable, or CLIENT UNBLOCK refused (an ACL): end the waits by
            # closing their connections (what the claim behind one took, if it ran,
            # comes back when its lock expires)
            for key in list(link.waits):
                wire = link.blockers.get(key)
                if wire is not None:
                    wire.close()

    def connection_lost(self) -> None:
        """The worker saw Redis go away: forget what was fetched ahead and end the idle
        waits, so the next claim talks to the server (and says whether it is back).

        A job fetched ahead keeps its lock in Redis; nobody renews it now, so once it
        expires the stalled check puts the job back (after a restart without
        persistence it is gone with the rest of the server's memory). A blocking
        ``BZPOPMIN`` on a connection that died half-open would never return: closing
        that connection ends it (as a lost connection), and the next wait opens a new
        one.
        """
        try:
            link = self._links.get(asyncio.get_running_loop())
        except RuntimeError:  # pragma: no cover - the worker calls it on its loop
            return
        if link is None:
            return
        for job in link.prefetched:
            link.open.discard(job.token)
        link.prefetched.clear()
        link.drained = None
        for wire in link.blockers.values():
            if wire is not None:
                wire.close()

    async def _return_prefetched(self, link: _Link) -> None:
        """Put jobs fetched ahead back at the head of their queue, unchanged."""
        while link.prefetched:
            job = link.prefetched.popleft()
            job_id, token = job.token
            link.open.discard(job.token)
            s = link.scripts(job.queue)
            keys = [
                s.keys[k]
                for k in (
                    "active",
                    "wait",
                    "stalled",
                    "paused",
                    "meta",
                    "limiter",
                    "prioritized",
                    "marker",
                    "events",
                )
            ]
            try:
                await link.move_back(keys=keys, args=[job_id, token, s.toKey(job_id)])
            except Exception as e:
                log.warning(
                    "haze redis: could not hand back job %s on %s: %s (it returns "
                    "when its lock expires)",
                    job_id,
                    job.queue,
                    e,
                )

    async def _settled(
        self, link: _Link, job: Reserved, result: Any, what: str, asked: bool = False
    ) -> bool:
        """Check a finishing script's reply; keep the job it fetched, if any. False when
        the job's lock was no longer this worker's (the manager warns, naming the job).

        ``asked``: moveToFinished was asked for the next job of the first queue; an
        answer without one is BullMQ's ``drained`` (that queue is empty), kept for the
        next reserve when its wait claims (``_Link.drained``)."""
        if isinstance(result, int):
            if result < 0:
                log.debug(
                    "haze redis: %s of job %s on %s/%s skipped: %s (a stalled check gave it "
                    "to another worker)",
                    what,
                    job.token[0],
                    self.name,
                    job.queue,
                    _LOCK_ERRORS.get(result, f"BullMQ error {result}"),
                    extra={
                        "job_id": job.message.id if job.message else None,
                        "attempt": job.attempt,
                    },
                )
                return False
            if asked and link.fetch_next and link.claim_after_wait is not None:
                link.drained = (job.queue, 0)
            return True
        if not result:
            return True
        data, job_id, _, due = raw2NextJobData(result)
        if data:
            fetched = await self._claimed(link, job.queue, data, job_id, job.token[1])
            if fetched is not None:
                link.prefetched.append(fetched)
            if not link.fetch_next:  # the worker stopped meanwhile
                await self._return_prefetched(link)
        elif asked and link.fetch_next and link.claim_after_wait is not None:
            link.drained = (job.queue, int(due or 0))
        return True

    def _fetch(self, link: _Link, job: Reserved) -> bool:
        return link.fetch_next and job.queue == link.first

    async def ack(self, job: Reserved) -> bool:
        link = self._link()
        link.open.discard(job.token)
        job_id, token = job.token
        s = link.scripts(job.queue)
        fetch = self._fetch(link, job)
        keys, args = s.complete_args(
            _ActiveJob(job_id, self._queue_opts), self.keep_completed, token, fetch
        )
        try:
            result = await link.script("moveToFinished", keys, args)
        except (RedisConnectionError, RedisTimeoutError, OSError):
            if job.message is not None:
                self._lost[job.token] = job
            raise
        return await self._settled(link, job, result, "completing", fetch)

    def _done_key(self, link: _Link, queue: str, message_id: str) -> str:
        return f"{link.scripts(queue).keys['']}haze-done:{message_id}"

    async def _record_lost(self, link: _Link) -> None:
        """Record the jobs whose ack was lost to an outage, now that Redis answers: a
        marker per job (its haze id, kept :data:`_DONE_KEEP`) that a later claim of it
        honours (``_claimed``), then the ack again, which completes it where Redis still
        holds it under this worker's lock. Stops at the first outage error (still out);
        a job that fails otherwise is left to run again, as it did without the marker."""
        for token, job in list(self._lost.items()):
            assert job.message is not None
            try:
                await link.client.set(
                    self._done_key(link, job.queue, job.message.id), 1, ex=_DONE_KEEP
                )
                keys, args = link.scripts(job.queue).complete_args(
                    _ActiveJob(token[0], self._queue_opts), self.keep_completed, token[1], False
                )
                await link.script("moveToFinished", keys, args)  # < 0: the lock is gone
            except (RedisConnectionError, RedisTimeoutError, OSError):
                raise
            except Exception as e:  # never a reason to stop claiming
                log.warning(
                    "haze redis: could not record job %s on %s/%s as done (%s: %s); it runs "
                    "again once its lock expires",
                    job.message.id,
                    self.name,
                    job.queue,
                    type(e).__name__,
                    e,
                )
            del self._lost[token]

    async def release(self, job: Reserved, delay: float, *, consume_attempt: bool) -> bool:
        link = self._link()
        link.open.discard(job.token)
        job_id, token = job.token
        s = link.scripts(job.queue)
        fetch = self._fetch(link, job)
        opts = {
            "skipAttempt": not consume_attempt,
            "fetchNext": fetch,
            "workerOpts": self._worker_opts,
        }
        delay_ms = max(0, round(delay * 1000))
        keys, args = s.moveToDelayedArgs(job_id, _now_ms(), token, delay_ms, opts)
        result = await link.commands["moveToDelayed"](keys=keys, args=args, client=link.fast)
        return await self._settled(link, job, result, "releasing")

    async def fail(self, job: Reserved, failed: FailedJob) -> bool:
        link = self._link()
        link.open.discard(job.token)
        job_id, token = job.token
        s = link.scripts(job.queue)
        fields = {"stacktrace": json.dumps([failed.exception])}
        if failed.body and failed.body != job.body:
            fields["data"] = failed.body  # e.g. without the unique lock, or encrypted
        keep: int | bool = self.keep_failed if self.keep_failed is not None else False
        fetch = self._fetch(link, job)
        keys, args = s.moveToFailedArgs(
            _ActiveJob(job_id, self._queue_opts),
            _reason(failed.exception),
            keep,
            token,
            fetch,
            fields,
        )
        result = await link.commands["moveToFinished"](keys=keys, args=args, client=link.fast)
        return await self._settled(link, job, result, "failing", fetch)

    async def heartbeat(self, jobs: Sequence[Reserved]) -> None:
        """Renew the BullMQ locks of running jobs (one script call per queue)."""
        link = self._link()
        by_queue: dict[str, tuple[list[str], list[str]]] = {}
        for job in jobs:
            if isinstance(job.token, tuple):
                ids, tokens = by_queue.setdefault(job.queue, ([], []))
                ids.append(job.token[0])
                tokens.append(job.token[1])
        results = await asyncio.gather(
            *(
                link.scripts(q).extendJobLocks(ids, tokens, self.lock_ms)
                for q, (ids, tokens) in by_queue.items()
            )
        )
        for q, lost in zip(by_queue, results, strict=True):
            tokens_by_id = dict(zip(*by_queue[q], strict=True))
            for job_id in lost or ():
                if (job_id, tokens_by_id.get(job_id)) not in link.open:
                    continue  # it finished while the renewal was on its way
                log.warning(
                    "haze redis: job %s on %s/%s lost its lock; another worker may run it again",
                    job_id,
                    self.name,
                    q,
                )

    async def check_stalled(self, queues: Iterable[str] | None = None) -> list[str]:
        """Run BullMQ's stalled check now; returns the ids of the jobs put back.

        A check marks the active jobs; a later one (after ``stalled_interval``) moves
        those whose lock expired back to ``wait`` and counts the restart (``stc``).
        """
        link = self._link()
        moved: list[str] = []
        for q in list(queues) if queues is not None else list(link.consumed or self.queues):
            ids = await link.scripts(q).moveStalledJobsToWait(_MAX_STALLED, self.lock_ms)
            for job_id in ids or ():
                log.warning(
                    "haze redis: job %s on %s/%s stalled (its worker stopped renewing "
                    "the lock); it is back on the queue",
                    job_id,
                    self.name,
                    q,
                )
                moved.append(str(job_id))
        return moved

    async def _stalled_loop(self, link: _Link) -> None:
        # Ends on ``link.closing`` rather than only on cancellation: redis-py can swallow
        # a cancellation that lands mid-command (redis/redis-py#2028).
        # the first check waits a little: it only marks active jobs, and a worker that
        # is starting has better things to do with its first round trips
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(link.closing.wait(), min(1.0, self.stalled_interval))
        failing = False
        while not link.closing.is_set():
            try:
                await self.check_stalled()
                failing = False
            except asyncio.CancelledError:
                raise
            except Exception as e:
                # once per outage: the worker's own warning says when Redis is back (and
                # an unreachable Redis is the worker's warning to give, not this loop's)
                log.log(
                    logging.DEBUG
                    if failing or isinstance(e, (*self.outage_errors, OSError))
                    else logging.WARNING,
                    "haze redis: stalled-job check on %s failed: %s",
                    self.name,
                    e,
                )
                failing = True
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(link.closing.wait(), self.stalled_interval)

    # -- inspection ---------------------------------------------------------------

    def check_queue(self, queue: str) -> None:
        """A ``:`` is refused (``QueueNameRules``): it separates the parts of the keys."""
        check_queue(queue)

    async def size(self, queue: str) -> int:
        """Jobs waiting, delayed or claimed (active), like Laravel's Redis queue size."""
        counts = await self._link().scripts(queue).getCounts(_SIZED)
        return sum(int(c) for c in counts)

    async def counts(self, queue: str) -> QueueCounts:
        """Ready (wait, paused, prioritized), delayed, and running (active) jobs."""
        link = self._link()
        s = link.scripts(queue)
        c = [int(n) for n in await s.getCounts(_SIZED)]
        ready = c[0] + c[1] + c[3]
        oldest = await self._oldest_ready(link, s) if ready else None
        due = None
        if c[2]:
            first = await link.client.zrange(s.keys["delayed"], 0, 0, withscores=True)
            # BullMQ's score: due ms * 0x1000 + a counter
            due = int(first[0][1]) // 0x1000 / 1000 if first else None
        return QueueCounts(ready, c[2], c[4], oldest, due)

    async def _oldest_ready(self, link: Any, s: Any) -> float | None:
        """When the next job of the wait and paused lists (consumed from the tail: LPUSH
        adds at the head) and of the prioritized set became ready, the oldest of them.

        A job's hash keeps its dispatch ``timestamp`` and the delay it was dispatched
        with (``opts.delay``; BullMQ zeroes ``delay`` on promotion), so that sum is when
        it first came due. A retried job came back after its last attempt started
        (``processedOn``); the backoff it then waited is not kept, so its age counts
        from that start.
        """
        async with link.client.pipeline(transaction=False) as pipe:
            pipe.lindex(s.keys["wait"], -1)
            pipe.lindex(s.keys["paused"], -1)
            pipe.zrange(s.keys["prioritized"], 0, 0)
            wait, paused, prioritized = await pipe.execute()
        ids = [str(i) for i in (wait, paused, *prioritized) if i is not None]
        if not ids:
            return None
        async with link.client.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hmget(s.toKey(job_id), "timestamp", "opts", "processedOn")
            rows = await pipe.execute()
        found: list[float] = []
        for stamp, opts, started in rows:
            if stamp is None:
                continue  # taken by a worker between the two reads
            try:
                delay = json.loads(opts).get("delay") if opts else None
                due = float(stamp) + (float(delay) if isinstance(delay, (int, float)) else 0)
                if started is not None:
                    due = max(due, float(started))
            except (TypeError, ValueError):
                continue  # not a hash haze or BullMQ wrote
            found.append(due / 1000)
        return min(found) if found else None

    async def find_job(self, job_id: str, queues: Sequence[str]) -> JobRecord | None:
        """Look through each queue's active, waiting, prioritized, delayed and completed
        jobs (the first ``_FIND_LIMIT`` of each, completed ones newest first) in one
        script for the job whose envelope carries ``job_id``."""
        link = self._link()
        names = list(dict.fromkeys(queues))
        keys = [link.scripts(q).keys[k] for q in names for k in _FIND_KEYS]
        prefixes = [link.scripts(q).keys[""] for q in names]
        hit = await link.find_job(keys=keys, args=[job_id, _FIND_LIMIT, *prefixes])
        if not hit:
            return None
        queue, bull_id, state = names[int(hit[0]) - 1], str(hit[1]), str(hit[2])
        fields = ("data", "atm", "attemptsMade", "stc", "finishedOn")
        row = await link.client.hmget(link.scripts(queue).toKey(bull_id), *fields)
        if row[0] is None:
            return None  # settled and removed between the two reads
        data = {k: str(v) for k, v in zip(fields[:4], row[:4], strict=True) if v is not None}
        job = self._reserved(queue, data, bull_id, "")
        # Reserved.attempt is the attempt a claim now would start: one more than started,
        # except for the running one.
        started = job.attempt if state == "running" else job.attempt - 1
        at = None
        if state == "delayed" and hit[3]:
            at = int(float(hit[3])) // 0x1000 / 1000  # BullMQ: due ms * 0x1000 + counter
        elif state == "done":
            at = _epoch_ms(row[4])
        name = job.message.job if job.message is not None else "<undecodable>"
        return JobRecord(job_id, name, queue, state, started, str(row[0]), at)

    async def running(self, queue: str, limit: int = 50) -> list[RunningJob] | None:
        """The active list's jobs (a job of a dead worker stays there until the stalled
        check takes it back)."""
        link = self._link()
        s = link.scripts(queue)
        ids = [str(i) for i in await link.client.lrange(s.keys["active"], -limit, -1)]
        if not ids:
            return []
        async with link.client.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hmget(s.toKey(job_id), "data", "processedOn", "atm", "attemptsMade", "stc")
            rows = await pipe.execute()
        jobs = []
        for job_id, (body, started, atm, made, stc) in zip(ids, rows, strict=True):
            if body is None:
                continue  # settled between the two reads
            reserved = self._reserved(
                queue,
                {
                    k: v
                    for k, v in (("data", body), ("atm", atm), ("attemptsMade", made), ("stc", stc))
                    if v is not None
                },
                job_id,
                "",
            )
            message = reserved.message
            jobs.append(
                RunningJob(
                    message.id if message is not None else job_id,
                    message.job if message is not None else "<undecodable>",
                    queue,
                    reserved.attempt,  # the hash is as the claim read it
                    int(started) / 1000 if started and started.isdigit() else None,
                )
            )
        return sorted(jobs, key=lambda j: j.started_at or 0.0)

    async def purge(self, queue: str) -> int:
        """Delete the waiting and delayed jobs (BullMQ's ``drain``); returns how many."""
        link = self._link()
        s = link.scripts(queue)
        async with link.client.pipeline(transaction=True) as pipe:
            proxy: Any = _Pipe(pipe)
            await link.commands["getCounts"](keys=[s.keys[""]], args=_COUNTED, client=proxy)
            await link.commands["drain"](
                keys=s.getKeys(["wait", "paused", "delayed", "prioritized", "repeat"]),
                args=[s.keys[""], "1"],
                client=proxy,
            )
            results = await pipe.execute(raise_on_error=False)
        if any(isinstance(r, NoScriptError) for r in results):
            counts = await s.getCounts(_COUNTED)
            await s.drain(True)
            return sum(int(c) for c in counts)
        for r in results:
            if isinstance(r, Exception):
                raise r
        return sum(int(c) for c in results[0])

    async def close(self) -> None:
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover
            loop = None
        links = list(self._links.items())
        self._links.clear()
        self._last = None
        for link_loop, link in links:
            if link_loop is loop:
                await self._close_link(link)
            elif link_loop.is_running() and not link_loop.is_closed():
                asyncio.run_coroutine_threadsafe(self._close_link(link), link_loop)

    async def _close_link(self, link: _Link) -> None:
        link.fetch_next = False
        link.stop.set()
        link.closing.set()
        waits = [f for f in link.waits.values() if not f.done()]
        with contextlib.suppress(Exception):  # unreachable: the waits are cut below
            unblocked = await asyncio.wait_for(self._unblock(link), 1.0) if waits else 0
            if unblocked:
                await asyncio.wait(waits, timeout=1.0)  # they hand back what they claimed
        for wire in link.blockers.values():
            if wire is not None:
                wire.close()  # a wait still blocked ends as a lost connection
        pending = [t for t in (link.stalled_task,) if t is not None]
        for t in pending:
            t.cancel()
        if link.tasks:
            await asyncio.wait(link.tasks, timeout=5.0)
        try:
            await self._return_prefetched(link)
        finally:
            if pending:  # bounded: a cancellation redis-py swallowed must not hang close()
                await asyncio.wait(pending, timeout=1.0)
            for wire in link.blockers.values():
                if wire is not None:
                    wire.close()
            if link.wire is not None:
                link.wire.close()
            await link.client.aclose()
