"""The redis driver's settings and what its parts share: the link of each event loop
and the reading of a claimed BullMQ job into a ``Reserved``."""

from __future__ import annotations

import asyncio
import itertools
import uuid
import weakref
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from haze._base.errors import MessageDecodeError
from haze._base.message import MAX_MESSAGE_SIZE, Message, decode
from haze.contracts.driver import Reserved
from haze.drivers.context import DriverContext
from haze.drivers.redis.failed import RedisFailedJobs
from haze.drivers.redis.link import _Link
from haze.drivers.redis.scripts import _QueueOpts
from haze.stores.redis import redis_settings


class _RedisBase:
    """The state every part of ``RedisDriver`` reads; see the package docstring."""

    #: what the worker treats as "Redis is unreachable" (one warning per outage, retries)
    outage_errors: tuple[type[BaseException], ...] = (RedisConnectionError, RedisTimeoutError)

    def __init__(self, name: str, options: dict[str, Any], context: DriverContext | None = None):
        self.name = name
        #: what the app handed it (None: built alone, as the tests and fuzzers do)
        self.context = context
        self.max_message_size: int | None = options.get("max_message_size") or MAX_MESSAGE_SIZE
        self.concurrency: int = options.get("concurrency") or 1
        self.prefix: str = options.get("prefix") or "haze"
        self.queues: list[str] = list(options.get("queues") or ["default"])
        self.keep_completed: int = options.get("keep_completed") or 1000
        self.keep_failed: int | None = options.get("keep_failed")
        lock = float(options.get("retry_after") or 30.0)
        self.lock_ms = max(1, round(lock * 1000))
        #: the worker renews running jobs' locks this often (BullMQ's lockRenewTime; its
        #: default is a half: a third lets a round run a whole interval late, as a busy
        #: event loop with thousands of running jobs does, and still renew in time)
        self.heartbeat_interval = lock / 3
        #: how often stalled jobs are looked for (BullMQ's stalledInterval)
        self.stalled_interval = lock
        self._url, self._kwargs, _ = redis_settings(
            context,
            options.get("connection"),
            options.get("url"),
            where=f"connections.{name}.connection",
            source=None if context is None else context.source,  # None: built alone
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
