"""How the database driver claims rows: in due order, one statement per claim, and the
idle wait for a dispatch, a NOTIFY or the next row's due time."""

from __future__ import annotations

import asyncio
import builtins
import time
from collections.abc import Sequence
from typing import Any

from haze._base.message import Message, decode
from haze.connectors import Session
from haze.contracts.driver import Reserved
from haze.drivers.sql.base import _needs_tables
from haze.drivers.sql.vacuum import _Vacuuming


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
        now = time.time()
        token = self._token()
        abandoned = self._abandoned(queue, now)
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
        return await self._claimed(rows, queue, token)

    def _abandoned(self, queue: str, now: float) -> float:
        """The claim's abandoned_before: leases that ended before it are taken over.

        0 (none) when this driver looked for lapsed rows of ``queue`` less than
        ``retry_after / 10`` (at most 1 s) ago: a finished job's dead index entry falls
        in that branch's range once its claim is ``retry_after`` old, and without VACUUM
        a long backlog piles them up; read on every claim they would cost more with
        every job done. A lease that ran out waits that much longer at most."""
        if now - self._lapsed_looks.get(queue, 0.0) < min(1.0, self.retry_after / 10):
            return 0.0
        self._lapsed_looks[queue] = now
        return now - self.retry_after

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
        self, rows: builtins.list[tuple[Any, ...]], queue: str, token: float
    ) -> builtins.list[Reserved]:
        """``rows`` (id, payload, attempts, reserved_at, turn) in turn order."""
        if not rows:
            return []
        rows.sort(key=lambda r: (float(r[4]), int(r[0])))  # RETURNING's order is not the claim's
        return [self._reserved(r, queue) for r in await self._fresh(rows, token)]

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
        kept = []
        for row in rows:
            if await self.db.execute(self.sql["heartbeat"], (time.time(), row[0], row[3])):
                kept.append(row)
        return kept

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
