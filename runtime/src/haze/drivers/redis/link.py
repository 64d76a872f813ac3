"""The redis driver's state on one event loop (``_Link``): its clients, BullMQ's
scripts, haze's own scripts and what its consumer holds."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
from bullmq.redis_connection import RedisConnection, loadScript  # type: ignore[import-untyped]

from haze.contracts.driver import Reserved
from haze.drivers.redis.scripts import _ACTIVATE_KEYS, _LITE_KEYS, _Scripts, check_queue
from haze.drivers.redis.wire import Wire, wire_for
from haze.stores.redis import new_client

if TYPE_CHECKING:
    from redis.commands.core import AsyncScript

    from haze.drivers.redis.base import _RedisBase

_HERE = Path(__file__).parent
#: SHA-1 of bullmq's addStandardJob-9.lua that add_job.lua copies: another bullmq
#: release may change what a job add writes, so the copy is used only next to this one
_ADD_STANDARD_SHA = "10f8d228e89ed4f765afc5b3bafb6defbb84e311"
#: SHA-1 of bullmq's moveToActive-11.lua that claim_job.lua copies: another bullmq
#: release may change what a claim writes, so the copy is used only next to this one
_MOVE_TO_ACTIVE_SHA = "d96ca626f1ea141b44a856b312fc636d99aa9ea9"
#: SHA-1 of claim_job.lua as tests/drivers/test_redis_lite_claim.py last compared it
#: with moveToActive: a copy that differs (edited, not re-checked) is not used
_CLAIM_JOB_SHA = "6d61eada9a589dde01e274f119a66eab317208ff"


class _LostAdds:
    """The adds of one queue whose reply was lost in one loop turn (most often all those
    of one dead connection), looked up together by one ``find_added.lua`` call."""

    __slots__ = ("done", "ids", "since")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.ids: set[str] = set()
        #: the earliest of their send times (ms)
        self.since = 1 << 62
        #: (whether the ids not found were not written, the ids found)
        self.done: asyncio.Future[tuple[bool, set[str]]] = loop.create_future()


class _Link:
    """The Redis client, BullMQ scripts and consumer state of one event loop."""

    def __init__(self, driver: _RedisBase) -> None:
        self.client: aioredis.Redis = new_client(driver._url, driver._kwargs)
        #: the per-job script calls (add, claim, finish) go through a lean connection of
        #: their own (see wire.py); None when it cannot be used (TLS, Unix socket)
        self.wire: Wire | None = wire_for(self.client)
        self.fast: Any = self.wire if self.wire is not None else self.client
        self.connection = RedisConnection(self.client, skipVersionCheck=True)
        self.commands: dict[str, AsyncScript] = self.connection.commands
        self.move_back: AsyncScript = self.client.register_script(
            loadScript("moveJobFromActiveToWait-9.lua")
        )
        self.find_failed = self._own("find_failed.lua")
        self.find_job = self._own("find_job.lua")
        #: whether an add whose reply was lost wrote its job (RedisDriver._written)
        self.find_added = self._own("find_added.lua")
        self.lost_adds: dict[str, _LostAdds] = {}
        self.forget_failed = self._own("forget_failed.lua")
        self.one_failed = self._own("one_failed.lua")
        #: haze's add of a tenant group's job, and the count of each group's backlog
        self.add_group = self._own("add_group_job.lua")
        self.group_backlog = self._own("group_backlog.lua")
        #: haze's copy of addStandardJob for the plain job of a single dispatch
        #: (add_job.lua): half the server time per add. Only on the lean
        #: connection, and only next to the BullMQ script it copies.
        self.add_lite: AsyncScript | None = None
        if self.wire is not None and self.commands["addStandardJob"].sha == _ADD_STANDARD_SHA:
            self.add_lite = self.client.register_script((_HERE / "add_job.lua").read_text())
        #: queue -> (wire, script, encoded head) of its lite add; a queue gets one once
        #: BullMQ's own script has added a job with the arguments of haze's template
        #: (add_args), so the lite add stands in for exactly that call
        self.lite_adds: dict[str, tuple[Wire, AsyncScript, bytes]] = {}
        #: one lean connection per list of queues waited on, for BZPOPMIN on their
        #: markers with the claim of the first one behind it (RedisDriver._block)
        self.blockers: dict[tuple[str, ...], Wire | None] = {}
        #: haze's moveToActive (claim_job.lua) for every claim, also behind a wait; None
        #: (another bullmq, no lean connection): BullMQ's, and no claim behind a wait
        self.claim_lite = self._claim_script()
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

    def _own(self, name: str) -> AsyncScript:
        """One of haze's own Lua scripts of this package, registered on the client."""
        return self.client.register_script((_HERE / name).read_text())

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
        """How to call ``add_job.lua`` on a queue: the encoded head holds its keys,
        prefix and opts; the job's name, JSON body and timestamp follow it. None: no
        lite add (no lean connection, another bullmq, or the template not checked)."""
        if self.add_lite is None or self.wire is None or not isinstance(s._add, list):
            return None
        keys = s.getKeys(_LITE_KEYS)
        head = Wire.script_head(self.add_lite, keys, [s.keys[""], s._ADD_OPTS_JSON], 3)
        return self.wire, self.add_lite, head

    def _claim_script(self) -> AsyncScript | None:
        if self.wire is None or self.commands["moveToActive"].sha != _MOVE_TO_ACTIVE_SHA:
            return None
        script = self.client.register_script((_HERE / "claim_job.lua").read_text())
        return script if script.sha == _CLAIM_JOB_SHA else None

    def blocker(self, queues: tuple[str, ...]) -> Wire | None:
        """The lean connection that waits on these queues' markers (None: redis-py's)."""
        if queues not in self.blockers:
            self.blockers[queues] = wire_for(self.client, track_id=True)
        return self.blockers[queues]

    def claim_head(self, queue: str) -> bytes:
        """The encoded start of a lite claim on ``queue``: its keys and the key prefix;
        the timestamp ('': the server's clock), the lock token and its duration follow."""
        head = self._claim_heads.get(queue)
        if head is None:
            assert self.claim_lite is not None
            s = self.scripts(queue)
            head = Wire.script_head(self.claim_lite, s.getKeys(_ACTIVATE_KEYS), [s.keys[""]], 3)
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
