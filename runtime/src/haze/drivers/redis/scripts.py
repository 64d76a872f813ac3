"""BullMQ's script helpers as the redis driver calls them: the job shapes BullMQ's
argument builders read, the per-queue argument templates, and the clients that collect
script calls into one round trip."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgpack  # type: ignore[import-untyped]
from bullmq.scripts import Scripts  # type: ignore[import-untyped]

from haze._base.message import Message, redis_key_part_error

if TYPE_CHECKING:
    from redis.commands.core import AsyncScript

#: BullMQ fails a job that stalled more often than this; haze's manager decides instead
#: (a reclaimed job with no try left is failed without running).
_MAX_STALLED = 1 << 30
_BULK_CHUNK = 1000
_COUNTED = ["wait", "paused", "delayed", "prioritized"]
_ADD_KEYS = ["wait", "paused", "meta", "id", "completed", "delayed", "active", "events", "marker"]
_LITE_KEYS = ["wait", "meta", "id", "active", "events", "marker"]
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
#: add_group_job.lua's BullMQ keys; the queue's two haze keys follow them
_GROUP_KEYS = ["prioritized", "delayed", "meta", "id", "active", "events", "marker", "pc"]
#: the jobs group_backlog.lua looks at per set (it blocks Redis while it runs)
_BACKLOG_SCAN = 10_000
#: The lists and sets find_job looks through, in find_job.lua's order, and how
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


def group_of(message: Message) -> str | None:
    """The tenant group a message was dispatched in (``meta.group``), if any."""
    group = message.meta.get("group") if message.meta else None
    return group if isinstance(group, str) else None


def group_add_call(s: _Scripts, job: _NewJob, group: str) -> tuple[list[str], list[Any]]:
    """Keys and args of ``add_group_job.lua`` for a job of ``group`` on ``s``'s queue."""
    keys = [*s.getKeys(_GROUP_KEYS), s.keys[""] + "haze-groups", s.keys[""] + "haze-turn"]
    opts = json.dumps(job.opts, separators=(",", ":"))
    delay = job.opts.get("delay", 0)
    return keys, [s.keys[""], opts, job.name, job.raw, job.timestamp, delay, group]


def _now_ms() -> int:
    return round(time.time() * 1000)


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
