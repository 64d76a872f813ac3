"""``RedisDriver``: the redis driver's parts put together, with adding jobs and closing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import ClassVar

from redis.exceptions import NoScriptError

from haze._base.message import Message
from haze.contracts.driver import (
    Concurrent,
    ConnectionAware,
    GroupBacklog,
    Interruptible,
    Leased,
)
from haze.drivers.redis.admin import _Inspecting
from haze.drivers.redis.claim import _Claiming
from haze.drivers.redis.link import _Link
from haze.drivers.redis.scripts import (
    _BULK_CHUNK,
    _Collect,
    _NewJob,
    _now_ms,
    _Pipe,
    group_add_call,
    group_of,
)


class RedisDriver(
    _Claiming, _Inspecting, Interruptible, Leased, ConnectionAware, Concurrent, GroupBacklog
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

    # -- producer -----------------------------------------------------------------

    async def enqueue(self, body: str, message: Message, delay: float) -> None:
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
        jobs = [
            (m.queue, _NewJob(m.job, body, round(d * 1000) if d > 0 else 0, now))
            for body, m, d in items
        ]
        groups = [group_of(m) for _, m, _ in items]
        plain = [j for j, g in zip(jobs, groups, strict=True) if g is None]
        for i in range(0, len(plain), _BULK_CHUNK):
            await self._add_chunk(link, plain[i : i + _BULK_CHUNK])
        grouped = [(q, j, g) for (q, j), g in zip(jobs, groups, strict=True) if g is not None]
        for i in range(0, len(grouped), _BULK_CHUNK):
            await self._add_grouped(link, grouped[i : i + _BULK_CHUNK])

    async def _add_grouped(self, link: _Link, jobs: list[tuple[str, _NewJob, str]]) -> None:
        """Jobs of tenant groups, one ``add_group_job.lua`` each, in one ``MULTI``."""
        async with link.client.pipeline(transaction=True) as pipe:
            for queue, job, group in jobs:
                keys, args = group_add_call(link.scripts(queue), job, group)
                await link.add_group(keys=keys, args=args, client=pipe)
            await pipe.execute()

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
