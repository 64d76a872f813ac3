"""How the database driver claims rows: in due order, one statement per claim, and the
idle wait for a dispatch, a NOTIFY or the next row's due time."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any

from haze._base.message import Message, decode
from haze.connectors import Session
from haze.contracts.driver import Reserved
from haze.drivers.sql.base import _needs_tables
from haze.drivers.sql.vacuum import _Vacuuming


def _others(
    claims: dict[asyncio.Future[None], asyncio.Task[Any] | None],
) -> list[asyncio.Future[None]]:
    """The claims in flight but those of the calling task (its own, still open while it
    settles what came with it, must not wait for itself)."""
    me = asyncio.current_task()
    return [done for done, task in claims.items() if task is not me]


def _branches(
    queue: str, now: float, limit: int, abandoned: float
) -> tuple[str | float | int, ...]:
    """The claim's parameters (its three branches and the merged limit), the same on
    every dialect: rows whose turn has come, groups' rows whose turn lies ahead, lapsed
    leases (``abandoned`` twice: it bounds reserved_at and the lease's end)."""
    return (
        *(queue, now, now, limit, queue, now, now, limit),
        *(queue, abandoned, abandoned, limit, limit),
    )


#: where the lapsed branch's abandoned_before pair ends in ``_branches``: the ack+claim
#: statement puts the ids being acked there
LAPSED_END = 11


class _Claiming(_Vacuuming):
    """Claiming rows and waiting for them."""

    async def _claim(self, queue: str) -> Reserved | None:
        jobs = await self._claim_many(queue, 1)
        return jobs[0] if jobs else None

    async def _claim_many(self, queue: str, limit: int) -> builtins.list[Reserved]:
        """Up to ``limit`` rows of ``queue`` in one claim statement, in due order."""
        self._maybe_vacuum()
        lapsed = self._looks_for_lapsed(queue)
        async with self._claiming(lapsed=lapsed):
            now = time.time()
            token = self._token()
            abandoned = now - self.retry_after if lapsed else 0.0
            sql = self.sql
            rows: builtins.list[tuple[Any, ...]]
            if self.dialect == "mysql":
                rows = await self._mysql_tx(
                    lambda tx: self._mysql_claim(tx, queue, limit, now, abandoned, token)
                )
            else:
                branches = _branches(queue, now, limit, abandoned)
                # PostgreSQL's statement sets the token after its branches, SQLite's before
                params = (
                    (*branches, token, token)
                    if self.dialect == "postgres"
                    else (token, token, *branches)
                )
                rows = await self.db.fetchall(sql["claim_many"], params)
            return await self._claimed(rows, queue, token, lapsed=lapsed)

    def _looks_for_lapsed(self, queue: str) -> bool:
        """Whether this claim of ``queue`` takes over leases that ended (its
        abandoned_before is then ``retry_after`` ago).

        Not when this driver looked for lapsed rows of ``queue`` less than
        ``retry_after / 10`` (at most 1 s) ago: a finished job's dead index entry falls
        in that branch's range once its claim is ``retry_after`` old, and without VACUUM
        a long backlog piles them up; read on every claim they would cost more with
        every job done. A lease that ran out waits that much longer at most."""
        now = time.time()
        if now - self._lapsed_looks.get(queue, 0.0) < min(1.0, self.retry_after / 10):
            return False
        self._lapsed_looks[queue] = now
        return True

    async def _mysql_claim(
        self, tx: Session, queue: str, limit: int, now: float, abandoned: float, token: float
    ) -> builtins.list[tuple[Any, ...]]:
        """The claim on MySQL/MariaDB (no UPDATE … RETURNING): lock, then mark."""
        sql = self.sql
        params = _branches(queue, now, limit, abandoned)
        found = await tx.fetchall(sql["claim_many_select"], params)
        if found:
            ids = [r[0] for r in found]
            marks = ", ".join(["?"] * len(ids))
            await tx.execute(sql["claim_many_mark"].replace("{ids}", marks), (token, token, *ids))
        return [(r[0], r[1], int(r[2]) + 1, token, r[3]) for r in found]

    async def _claimed(
        self, rows: builtins.list[tuple[Any, ...]], queue: str, token: float, *, lapsed: bool
    ) -> builtins.list[Reserved]:
        """``rows`` (id, payload, attempts, reserved_at, turn) in turn order; ``lapsed``:
        the claim looked for lapsed leases."""
        if not rows:
            self._passed_on()
            return []
        rows.sort(key=lambda r: (float(r[4]), int(r[0])))  # RETURNING's order is not the claim's
        rows = await self._fresh(rows, token)
        if lapsed and self._holders and rows:
            rows = await self._adopted(rows, token)
        self._passed_on()
        return [self._reserved(r, queue) for r in rows]

    @contextlib.asynccontextmanager
    async def _claiming(self, *, lapsed: bool) -> AsyncIterator[None]:
        """A claim in flight, from before its statement until its held rows' leases are
        passed to their runs.

        One that takes over lapsed leases runs alone among this driver's claims: another
        one's statement may have returned while the event loop was starved past the
        lease, its rows not yet renewed nor handed out, and taking them over would count
        an attempt that never runs (the other claim drops rows it lost). Claims of
        ready rows run side by side."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        adopted: asyncio.Future[None] = loop.create_future()
        try:
            while self._lapsed_claim is not None:
                await asyncio.wait([self._lapsed_claim])
            if lapsed:
                self._lapsed_claim = done
                while others := _others(self._claims):
                    await asyncio.wait(others)
            self._claims[done] = self._adopting[adopted] = asyncio.current_task()
            yield
        finally:
            self._claims.pop(done, None)
            if self._lapsed_claim is done:
                self._lapsed_claim = None
            done.set_result(None)
            self._passed_on()

    def _passed_on(self) -> None:
        """The calling task's claim has passed its held rows' leases to their runs."""
        me = asyncio.current_task()
        for adopted in [f for f, task in self._adopting.items() if task is me]:
            del self._adopting[adopted]
            adopted.set_result(None)

    async def _claims_done(self) -> None:
        """Once every claim of this driver in flight now has finished.

        A settle whose row is under another lease waits for them before calling the
        lease lost: one of them may have taken the row while the run was held (its
        statement committed, its adoption not yet run), and is about to pass the run
        the lease the settle should go again with."""
        if self._holders and (others := _others(self._adopting)):
            await asyncio.wait(others)

    def hold_leases(self, renewing: Callable[[], Iterable[Reserved]]) -> Callable[[], None]:
        """``HeldLeases``: the jobs ``renewing()`` returns are running in this process."""
        self._holders.append(renewing)
        return functools.partial(self._holders.remove, renewing)

    def _held(self, claimed: set[int]) -> dict[int, Reserved]:
        """Row id -> the job a consumer of this driver is running on it (not one released
        for a retry: that run is over, and its row's next claim is the next attempt; one
        of ``claimed`` is marked taken, so a retry still on its way knows it is done)."""
        held: dict[int, Reserved] = {}
        for renewing in self._holders:
            for job in renewing():
                pair = (int(job.token[0]), job.token[1])
                if pair not in self._released:
                    held[pair[0]] = job
                elif pair[0] in claimed:
                    self._released[pair] = True
        return held

    async def _adopted(
        self, rows: builtins.list[tuple[Any, ...]], token: float
    ) -> builtins.list[tuple[Any, ...]]:
        """The claimed rows less those a consumer of this driver is still running: its
        leases lapsed while its event loop was starved, and a second run would be the
        same job twice in one process. That run takes the claim's lease instead (its
        heartbeats and its ack carry the new reserved_at), and the attempt the claim
        counted is handed back: no run started."""
        held = self._held({int(r[0]) for r in rows})
        mine = [int(r[0]) for r in rows if int(r[0]) in held]
        if not mine:
            return rows
        for chunk in self._chunks(mine, d1=90, other=400):
            stmt = self.sql["adopt"].replace("{ids}", ", ".join(["?"] * len(chunk)))
            await self.db.execute(stmt, [token, *chunk])
        # Only now: a retry sent with the new lease before the attempt went back would
        # clear the lease the statement above matches, and the next run would skip one.
        # A settle sent meanwhile with the old lease waits for this claim (_claims_done).
        for row in rows:
            job = held.get(int(row[0]))
            if job is not None:
                job.token = (job.token[0], row[3])
        return [row for row in rows if int(row[0]) not in held]

    async def _fresh(
        self, rows: builtins.list[tuple[Any, ...]], token: float
    ) -> builtins.list[tuple[Any, ...]]:
        """The claimed rows that are still this claim's.

        A slow claim (pool start-up, a loaded server) wrote a reserved_at/heartbeat_at
        that was already old, so its rows may look abandoned to other workers before the
        first heartbeat: refresh them now, and drop any another worker has taken over
        meanwhile (not ours to run)."""
        if time.time() - token <= self.retry_after / 4:
            return rows
        # One statement for the whole claim (its rows share the token), not one per row:
        # a slow claim of thousands of rows would otherwise outlast the lease it renews.
        ids = [int(r[0]) for r in rows]
        kept: set[int] = set()
        for chunk in self._chunks(ids, d1=90, other=400):
            marks = ", ".join(["?"] * len(chunk))
            stmt = self.sql["heartbeat_many"].replace("{ids}", marks)
            if await self.db.execute(stmt, [time.time(), token, *chunk]) == len(chunk):
                kept.update(chunk)
                continue
            # some were taken over meanwhile: keep only the rows that still carry it
            mine = self.sql["still_mine"].replace("{ids}", marks)
            kept.update(int(r[0]) for r in await self.db.fetchall(mine, [token, *chunk]))
        return [row for row in rows if int(row[0]) in kept]

    def _reserved(self, row: Sequence[Any], queue: str) -> Reserved:
        row_id, body, attempts, reserved_at = row[:4]
        if isinstance(body, (bytes, bytearray)):
            body = body.decode("utf-8", "replace")
        try:
            message: Message | None = decode(body)
            error: BaseException | None = None
        except Exception as e:
            message, error = None, e
        return Reserved(message, int(attempts), body, queue, (row_id, reserved_at), error)

    @_needs_tables
    async def reserve(self, queues: Sequence[str], wait: float) -> Reserved | None:
        # No queues given (Worker(queues=None)): the connection's ``queues``, as queue:work does.
        queues = queues or self.settings.get("queues") or ["default"]
        event = self._wake() if wait > 0 else None
        if event is not None:
            # Cleared before the claims, not after: a dispatch or a stop (interrupt) that
            # happens while they run must still cut the wait short.
            event.clear()
        for q in queues:
            job = await self._claim(q)
            if job is not None:
                return job
        if event is None:
            return None
        await self._idle_wait(event, await self._until_due(queues, wait))
        for q in queues:
            job = await self._claim(q)
            if job is not None:
                return job
        return None

    @_needs_tables
    async def reserve_many(
        self, queues: Sequence[str], limit: int, wait: float, *, first_claimed: bool = False
    ) -> builtins.list[Reserved]:
        """Up to ``limit`` jobs in one claim statement: from the first queue (in priority
        order) that has any; waits like ``reserve`` when none has. ``first_claimed``:
        ``ack_and_claim`` just found the first queue empty, after arming the wake-up."""
        queues = queues or self.settings.get("queues") or ["default"]
        event = self._wake() if wait > 0 else None
        if event is not None and not first_claimed:
            event.clear()  # before the claims: see reserve()
        for q in queues[1:] if first_claimed else queues:
            jobs = await self._claim_many(q, limit)
            if jobs:
                return jobs
        if event is None:
            return []
        await self._idle_wait(event, await self._until_due(queues, wait))
        for q in queues:
            jobs = await self._claim_many(q, limit)
            if jobs:
                return jobs
        return []

    async def _until_due(self, queues: Sequence[str], wait: float) -> float:
        """``wait``, cut to when the first delayed row of ``queues`` comes due: nothing
        wakes a worker then (a NOTIFY comes at dispatch), so it would find the job only
        at its next poll."""
        now = time.time()
        for q in queues:
            row = await self.db.fetchone(self.sql["next_due"], (q,))
            if row is not None and row[0] is not None:
                # not below 10 ms: a due row another claim holds is that claim's
                wait = min(wait, max(float(row[0]) - now, 0.01))
        return wait

    async def _idle_wait(self, event: asyncio.Event, wait: float) -> None:
        """Until a dispatch of this process, a NOTIFY, interrupt() or ``wait`` seconds."""
        waiter = asyncio.ensure_future(event.wait())
        waiters: set[asyncio.Future[Any]] = {waiter}
        if self._notifying is not None:
            listen = self._notifying.listen(f"haze_{self.table}", wait)
            waiters.add(asyncio.ensure_future(listen))
        try:
            await asyncio.wait(waiters, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()

    def interrupt(self) -> None:
        """End an idle wait now (the worker is stopping)."""
        if self._wakeup is not None:
            self._wakeup.set()
