"""``RedisDriver``: the redis driver's parts put together, with adding jobs and closing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from haze._base.message import Message
from haze.contracts.driver import (
    Concurrent,
    ConnectionAware,
    GroupBacklog,
    Interruptible,
    LeaseBudget,
    Leased,
)
from haze.drivers._leases import lease_warning
from haze.drivers._parts import Item, in_parts, outcome_unknown
from haze.drivers.redis.admin import _Inspecting
from haze.drivers.redis.claim import _Claiming
from haze.drivers.redis.link import _Link, _LostAdds
from haze.drivers.redis.scripts import (
    _BULK_CHUNK,
    _Collect,
    _NewJob,
    _now_ms,
    _Pipe,
    group_add_call,
    group_of,
)
from haze.drivers.redis.wire import _NotSent

#: About how many locks one heartbeat renews a second (one script call per queue; measured
#: 50,000-110,000 on two shared cores, the client's packing included)
_RENEWALS_PER_SECOND = 50_000
#: How long an add whose reply was lost is looked up before its outcome is unknown
_LOOKUP_SECONDS = 3.0
#: A job stamped this long before a lost add was added before it (producers' clocks
#: may differ by up to this much)
_LOOKUP_MARGIN_MS = 2_000
#: How many of a queue's newest job ids the lookup reads, at most
_LOOKUP_LIMIT = 100_000


class RedisDriver(
    _Claiming,
    _Inspecting,
    Interruptible,
    LeaseBudget,
    Leased,
    ConnectionAware,
    Concurrent,
    GroupBacklog,
):
    """A queue connection on Redis with BullMQ's data model; see the package docstring."""

    #: the config options it takes besides the common ones (``DeclaresOptions``)
    options: ClassVar[Mapping[str, str]] = {
        "connection": "str",
        "url": "str",
        "prefix": "str",
        "keep_completed": "int",
        "keep_failed": "int",
        "retry_after": "duration",
        "groups": "groups",
    }
    remote = True
    local_callbacks = False
    inline = False

    def lease_warning(self, concurrency: int) -> str | None:
        return lease_warning(
            self.name,
            "Redis",
            concurrency,
            rate=_RENEWALS_PER_SECOND,
            interval=self.heartbeat_interval,
            retry_after=self.lock_ms / 1000,
        )

    # -- producer -----------------------------------------------------------------

    async def enqueue(self, body: str, message: Message, delay: float) -> None:
        sent_at = _now_ms()
        try:
            await self._enqueue(body, message, delay)
        except RedisConnectionError as e:
            if _never_sent(e) or not await self._written(message.queue, [message.id], sent_at, e):
                raise

    async def _written(
        self, queue: str, ids: Sequence[str], sent_at: int, error: BaseException
    ) -> bool:
        """Whether the add of ``ids`` (one job, or one ``MULTI`` of jobs, all written or
        none) whose connection was lost before its reply wrote them, looked up on
        another connection. Redis runs nothing more of a connection it has closed, so
        the answer is final; one that cannot be had within ``_LOOKUP_SECONDS`` raises
        ``DispatchOutcomeUnknownError`` (they may be queued)."""
        link = self._link()
        loop = asyncio.get_running_loop()
        lost = link.lost_adds.get(queue)
        if lost is None:
            lost = link.lost_adds[queue] = _LostAdds(loop)
            # after this turn: the other adds the same dead connection failed join in
            loop.call_soon(self._look_up, link, queue)
        lost.ids.add(ids[-1])
        lost.since = min(lost.since, sent_at)
        final, found = await asyncio.shield(lost.done)
        if ids[-1] in found:
            return True
        if final:
            return False
        raise outcome_unknown(self.name, "Redis add", ids, _LOOKUP_SECONDS, error) from None

    def _look_up(self, link: _Link, queue: str) -> None:
        lost = link.lost_adds.pop(queue)
        task = asyncio.get_running_loop().create_task(self._find_added(link, queue, lost))
        link.tasks.add(task)
        task.add_done_callback(link.tasks.discard)

    async def _find_added(self, link: _Link, queue: str, lost: _LostAdds) -> None:
        s = link.scripts(queue)
        loop = asyncio.get_running_loop()
        end = loop.time() + _LOOKUP_SECONDS
        pause = 0.01
        args = [s.keys[""], lost.since - _LOOKUP_MARGIN_MS, _LOOKUP_LIMIT, *lost.ids]
        while True:
            try:
                reply = await link.find_added(keys=[s.keys["id"]], args=args)
            except (RedisConnectionError, RedisTimeoutError):
                if loop.time() + pause < end:
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, 0.2)
                    continue
                lost.done.set_result((False, set()))
            except BaseException as e:
                lost.done.set_exception(e)
                lost.done.exception()  # its callers may all be gone
                if not isinstance(e, Exception):
                    raise
            else:
                lost.done.set_result((int(reply[0]) == 1, {str(i) for i in reply[1:]}))
            return

    async def _enqueue(self, body: str, message: Message, delay: float) -> None:
        link = self._link()
        delay_ms = round(delay * 1000) if delay > 0 else 0
        group = group_of(message)
        if group is not None:
            job = _NewJob(message.job, body, delay_ms, _now_ms())
            keys, args = group_add_call(link.scripts(message.queue), job, group)
            if link.wire is not None:
                await link.wire.run_script(link.add_group, keys, args, fixed_keys=True)
            else:
                await link.add_group(keys=keys, args=args, client=link.client)
            return
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

        def new(body: str, m: Message, d: float) -> tuple[str, _NewJob]:
            return m.queue, _NewJob(m.job, body, round(d * 1000) if d > 0 else 0, now)

        async def send(part: Sequence[Item]) -> None:
            try:
                if group_of(part[0][1]) is None:
                    await self._add_chunk(link, [new(*item) for item in part])
                else:
                    grouped = [(*new(*item), group_of(item[1]) or "") for item in part]
                    await self._add_grouped(link, grouped)
            except RedisConnectionError as e:
                # one MULTI: all of the part was written, or none; its last job tells
                last = part[-1][1]
                if _never_sent(e) or not await self._written(
                    last.queue, [m.id for _, m, _ in part], now, e
                ):
                    raise

        plain = [item for item in items if group_of(item[1]) is None]
        grouped = [item for item in items if group_of(item[1]) is not None]
        step = _BULK_CHUNK
        parts = [run[i : i + step] for run in (plain, grouped) for i in range(0, len(run), step)]
        # each part is one MULTI: a later one that fails leaves the earlier ones queued
        await in_parts(parts, send, self.name)

    async def _add_grouped(self, link: _Link, jobs: list[tuple[str, _NewJob, str]]) -> None:
        """Jobs of tenant groups, one ``add_group_job.lua`` each, in one ``MULTI``: on
        the lean connection, which never sends it again after a lost reply (redis-py's
        pipeline would, and queue every job twice when the first ``EXEC`` had run)."""
        wire = link.wire
        if wire is None:
            async with link.client.pipeline(transaction=True) as pipe:
                for queue, job, group in jobs:
                    keys, args = group_add_call(link.scripts(queue), job, group)
                    await link.add_group(keys=keys, args=args, client=pipe)
                await pipe.execute()
            return
        script = link.add_group
        for _ in range(2):
            commands: list[tuple[Any, ...]] = [("MULTI",)]
            for queue, job, group in jobs:
                keys, args = group_add_call(link.scripts(queue), job, group)
                commands.append(("EVALSHA", script.sha, len(keys), *keys, *args))
            commands.append(("EXEC",))
            jobs = _unloaded(jobs, _exec_results(await wire.execute_many(commands)))
            if not jobs:
                return
            await link.client.script_load(script.script)  # Redis restarted: load it again
        raise RuntimeError("Redis did not keep haze's add_group_job.lua loaded")

    async def _add_chunk(self, link: _Link, jobs: list[tuple[str, _NewJob]]) -> None:
        for _ in range(2):
            if link.wire is not None:
                collect = _Collect()
                for queue, job in jobs:
                    await link.scripts(queue).addJob(job, collect)
                collect.commands.append(("EXEC",))
                results = _exec_results(await link.wire.execute_many(collect.commands))
            else:
                async with link.client.pipeline(transaction=True) as pipe:
                    proxy = _Pipe(pipe)
                    for queue, job in jobs:
                        await link.scripts(queue).addJob(job, proxy)
                    results = await pipe.execute(raise_on_error=False)
            jobs = _unloaded(jobs, results)
            if not jobs:
                return
            for name in ("addStandardJob", "addDelayedJob"):
                script = link.commands[name]
                script.sha = await link.client.script_load(script.script)
        raise RuntimeError("Redis did not keep BullMQ's scripts loaded (SCRIPT LOAD failed)")

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


_J = TypeVar("_J")


def _exec_results(replies: list[Any]) -> list[Any]:
    """The results of one ``MULTI`` … ``EXEC`` sent on the lean connection."""
    for r in replies:
        if isinstance(r, Exception):  # MULTI refused or EXEC aborted
            raise r
    results: list[Any] = replies[-1]
    return results


def _unloaded(jobs: list[_J], results: Sequence[Any]) -> list[_J]:
    """The jobs whose script Redis no longer had (NOSCRIPT: it restarted), to send again
    once it is loaded; any other error of a result is raised."""
    for r in results:
        if isinstance(r, Exception) and not isinstance(r, NoScriptError):
            raise r
    return [j for j, r in zip(jobs, results, strict=True) if isinstance(r, NoScriptError)]


def _never_sent(error: RedisConnectionError) -> bool:
    """Whether the command never reached Redis: the lean connection says so
    (``_NotSent``); redis-py's own connect failure reads "Error N connecting to ..."."""
    return isinstance(error, _NotSent) or " connecting to " in str(error)
