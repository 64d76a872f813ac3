"""How the redis driver claims jobs: in priority order, one claim at a time, and an idle
worker's blocking wait on the queues' markers with the claim written behind it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import msgpack  # type: ignore[import-untyped]
from bullmq.scripts import raw2NextJobData  # type: ignore[import-untyped]
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError

from haze.contracts.driver import Reserved
from haze.drivers.redis.complete import _Finishing
from haze.drivers.redis.link import _Link
from haze.drivers.redis.scripts import _ACTIVATE_KEYS, _now_ms
from haze.drivers.redis.wire import Wire, encode

#: How long after Redis's own timeout a blocking wait gives up on an answer (seconds)
_BLOCK_GRACE = 5.0


class _Claiming(_Finishing):
    """Claiming jobs, waiting for them, and ending those waits when the worker stops."""

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

    def _token(self) -> str:
        return f"{self._id}:{next(self._tokens)}"

    def _claim_opts(self) -> tuple[str, bytes]:
        """A new lock token and moveToActive's packed options with it."""
        token = self._token()
        packed = msgpack.packb(
            {"token": token, "lockDuration": self.lock_ms, "limiter": None}, use_bin_type=True
        )
        return token, packed

    async def _activate(self, link: _Link, queue: str) -> tuple[Reserved | None, int]:
        while True:  # again after a job that had already finished (``_claimed``)
            token, raw = await self._move_to_active(link, queue)
            data, job_id, _, due = raw2NextJobData(raw)
            if not data:
                return None, int(due or 0)
            job = await self._claimed(link, queue, data, job_id, token)
            if job is not None:
                return job, 0

    async def _move_to_active(self, link: _Link, queue: str) -> tuple[str, Any]:
        """One claim on ``queue``: the lite claim, else bullmq's moveToActive (its
        ``Scripts.moveToActive``, on the lean connection when there is one)."""
        lite = link.claim_lite
        if lite is not None:
            assert link.wire is not None
            token = self._token()
            head = link.claim_head(queue)
            return token, await link.wire.run_head(lite, head, (_now_ms(), token, self.lock_ms))
        token, packed = self._claim_opts()
        s = link.scripts(queue)
        args = [s.keys[""], _now_ms(), packed]
        keys = s.getKeys(_ACTIVATE_KEYS)
        return token, await link.script("moveToActive", keys, args, fixed_keys=True)

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
        script = link.claim_lite
        commands = [encode("BZPOPMIN", *markers, timeout)]
        token = ""
        if script is not None:
            if not link.claim_loaded:
                script.sha = await wire.script_load(script.script)
                link.claim_loaded = True
                if stop.is_set():
                    return False, None
            token = self._token()
            # an empty timestamp: the claim runs when the wait returns, on Redis's clock
            head = link.claim_head(queues[0])
            commands.append(Wire.script_call(head, "", token, self.lock_ms))
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
