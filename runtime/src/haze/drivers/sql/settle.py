"""How the database driver settles claimed rows: acks (one or many, and an ack with the
next claim in one statement), release, fail and heartbeats, each only on a row that
still carries this claim's ``reserved_at``."""

from __future__ import annotations

import builtins
import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

from haze.connectors import Session
from haze.contracts.driver import FailedJob, Reserved
from haze.drivers.sql.base import _ACKS_KEPT, _needs_tables
from haze.drivers.sql.claim import LAPSED_END, _branches, _Claiming
from haze.drivers.sql.turns import group_of


class _Settling(_Claiming):
    """Settling claimed rows."""

    async def _mysql_ack(self, tx: Session, pairs: builtins.list[tuple[int, Any]]) -> set[int]:
        """The batched ack on MySQL/MariaDB (no DELETE … RETURNING): lock the rows still
        owned, then delete them. Grouped by token (a claim's rows share one), compared by
        the server as the single ack does: a DOUBLE read back as text need not equal the
        float sent."""
        by_token: dict[Any, builtins.list[int]] = {}
        for row_id, token in pairs:
            by_token.setdefault(token, []).append(row_id)
        where = " OR ".join(
            f"(reserved_at = ? AND id IN ({', '.join(['?'] * len(ids))}))"
            for ids in by_token.values()
        )
        params = [v for token, ids in by_token.items() for v in (token, *ids)]
        select = self.sql["ack_many_select"].replace("{where}", where)
        found = {int(r[0]) for r in await tx.fetchall(select, params)}
        if found:
            marks = ", ".join(["?"] * len(found))
            await tx.execute(self.sql["ack_many_delete"].replace("{ids}", marks), list(found))
        return found

    @_needs_tables
    async def ack_many(self, jobs: Sequence[Reserved]) -> builtins.list[bool]:
        """Delete the rows of several finished jobs in one statement and one commit.

        One bool per job, as ``ack`` returns: False where another worker had taken the
        row over (the row is there with a reserved_at that is no longer this claim's),
        and nothing was deleted."""
        if not jobs:
            return []
        pairs = [(int(job.token[0]), job.token[1]) for job in jobs]
        with self._sending_acks(pairs):
            owned = await self._ack_pairs(pairs)
        return await self._acked(pairs, owned)

    async def _ack_pairs(self, pairs: builtins.list[tuple[int, Any]]) -> set[int]:
        """The ids of ``pairs`` (row id, reserved_at) whose rows this call deleted."""
        owned: set[int] = set()
        sql = self.sql
        if self.dialect == "postgres":
            ids = [p[0] for p in pairs]
            rows = await self.db.fetchall(sql["ack_many"], (ids, [p[1] for p in pairs]))
            owned = {int(r[0]) for r in rows}
        elif self.dialect == "mysql":
            owned = await self._mysql_tx(lambda tx: self._mysql_ack(tx, pairs))
        else:
            per = 45 if self.dialect == "d1" else 400  # D1: at most 100 bound values a statement
            for i in range(0, len(pairs), per):
                chunk = pairs[i : i + per]
                stmt = sql["ack_many"].replace("{pairs}", ", ".join(["(?, ?)"] * len(chunk)))
                rows = await self.db.fetchall(stmt, [v for p in chunk for v in p])
                owned.update(int(r[0]) for r in rows)
        return owned

    @contextlib.contextmanager
    def _sending_acks(self, pairs: builtins.list[tuple[int, Any]]) -> Iterator[None]:
        """Remember ``pairs`` as sent when the ack raises: it may have committed before
        its answer was lost, so the ack sent again may find the rows gone."""
        try:
            yield
        except BaseException:
            self._remember_acks(pairs)
            raise

    def _remember_acks(self, pairs: builtins.list[tuple[int, Any]]) -> None:
        sent = self._acks_sent
        for pair in pairs:
            sent.pop(pair, None)
            sent[pair] = None
        while len(sent) > _ACKS_KEPT:
            del sent[next(iter(sent))]

    async def _acked(
        self, pairs: builtins.list[tuple[int, Any]], deleted: set[int]
    ) -> builtins.list[bool]:
        """One bool per claim, as ``ack`` returns: False for a lost lease. A row this call
        did not delete is one, unless this driver had acked that claim before (the row
        is gone: done): then only a row still there, under another claim, is one."""
        repeats = [i for i, t in pairs if i not in deleted and (i, t) in self._acks_sent]
        there: set[int] = set()
        per = 90 if self.dialect == "d1" else 500  # D1: at most 100 bound values a statement
        for n in range(0, len(repeats), per):
            chunk = repeats[n : n + per]
            stmt = self.sql["still_there"].replace("{ids}", ", ".join(["?"] * len(chunk)))
            there.update(int(r[0]) for r in await self.db.fetchall(stmt, chunk))
        self._remember_acks([p for p in pairs if p[0] in deleted])
        gone = set(repeats) - there
        return [i in deleted or i in gone for i, _ in pairs]

    @_needs_tables
    async def ack_and_claim(
        self, jobs: Sequence[Reserved], queue: str, limit: int
    ) -> tuple[builtins.list[bool], builtins.list[Reserved]]:
        """``ack_many(jobs)``, then claim up to ``limit`` ready jobs of ``queue`` without
        waiting. On PostgreSQL both are one statement and one commit; on MySQL/MariaDB one
        transaction (one commit); elsewhere they run one after the other.

        The wake-up is armed before either: a dispatch of this process or ``interrupt()``
        during them ends the wait of ``reserve_many(..., first_claimed=True)`` (and
        PostgreSQL's listener keeps a NOTIFY that arrives meanwhile)."""
        self._wake().clear()
        if self.dialect not in ("postgres", "mysql") or not jobs:
            owned = await self.ack_many(jobs)
            return owned, await self._claim_many(queue, limit)
        pairs = [(int(job.token[0]), job.token[1]) for job in jobs]
        with self._sending_acks(pairs):
            return await self._ack_and_claim(pairs, queue, limit)

    async def _ack_and_claim(
        self, pairs: builtins.list[tuple[int, Any]], queue: str, limit: int
    ) -> tuple[builtins.list[bool], builtins.list[Reserved]]:
        now = time.time()
        token = self._token()
        abandoned = self._abandoned(queue, now)
        ids = [p[0] for p in pairs]
        if self.dialect == "mysql":

            async def both(tx: Session) -> tuple[set[int], builtins.list[tuple[Any, ...]]]:
                acked = await self._mysql_ack(tx, pairs)
                # the acked rows are deleted in this transaction: the claim cannot see them
                rows = await self._mysql_claim(tx, queue, limit, now, abandoned, token)
                return acked, rows

            acked, rows = await self._mysql_tx(both)
            return await self._acked(pairs, acked), await self._claimed(rows, queue, token)
        branches = _branches(queue, now, limit, abandoned)
        # the lapsed branch skips the rows being acked: their ids follow abandoned_before
        params = (
            *(ids, [p[1] for p in pairs], *branches[:LAPSED_END], ids),
            *(*branches[LAPSED_END:], token, token),
        )
        rows = await self.db.fetchall(self.sql["ack_claim_many"], params)
        acked = {int(r[0]) for r in rows if r[1] is None}
        claimed = [r for r in rows if r[1] is not None]
        return await self._acked(pairs, acked), await self._claimed(claimed, queue, token)

    @_needs_tables
    async def ack(self, job: Reserved) -> bool:
        # ack, release and fail match the row by its id and this claim's reserved_at: 0
        # rows means another worker reclaimed it after retry_after (False, nothing
        # changed), unless the row is gone: an earlier try deleted it (True)
        row_id, reserved_at = job.token
        pair = (int(row_id), reserved_at)
        with self._sending_acks([pair]):
            deleted = await self.db.execute(self.sql["ack"], (row_id, reserved_at)) > 0
        [acked] = await self._acked([pair], {pair[0]} if deleted else set())
        return acked

    @_needs_tables
    async def release(self, job: Reserved, delay: float, *, consume_attempt: bool) -> bool:
        row_id, reserved_at = job.token
        if consume_attempt:
            due = time.time() + delay
            return await self.db.execute(self.sql["retry"], (due, due, row_id, reserved_at)) > 0
        # release(): a new row with the attempt handed back, only if we still own the old one.
        now = time.time()
        async with self.db.transaction(immediate=True) as tx:
            if await tx.execute(self.sql["ack"], (row_id, reserved_at)) == 0:
                return False
            # A group's released row goes behind the group's others: a group over its
            # limit does not keep the head of the queue.
            group = group_of(job.message)
            turn = await self._turn(tx, job.queue, group, now + delay)
            row = (job.queue, job.body, max(0, job.attempt - 1), now + delay, now, group, turn)
            await tx.execute(self.sql["enqueue"], row)
        self._notify(job.queue)
        return True

    @_needs_tables
    async def fail(self, job: Reserved, failed: FailedJob) -> bool:
        row_id, reserved_at = job.token
        async with self.db.transaction(immediate=True) as tx:
            if await tx.execute(self.sql["ack"], (row_id, reserved_at)) == 0:
                return False  # another worker reclaimed the row; it owns the outcome now
            # A repeated message id (a redelivery, a copied row, a retried job failing
            # again) replaces its earlier record: uuid is unique.
            await tx.execute(self.sql["failed_forget"], (failed.id,))
            await tx.execute(
                self.sql["failed_insert"],
                (
                    failed.id,
                    failed.connection,
                    failed.queue,
                    failed.body,
                    failed.exception,
                    failed.failed_at,
                ),
            )
        return True

    async def heartbeat(self, jobs: Sequence[Reserved]) -> None:
        """Refresh ``heartbeat_at`` of running jobs so they are not reclaimed."""
        # One statement per claim token (and per chunk of ids), not one per job: a
        # heartbeat that costs a round trip per job outlasts retry_after with enough
        # running jobs, and the worker then takes its own running jobs over.
        now = time.time()
        by_token: dict[Any, builtins.list[int]] = {}
        for job in jobs:
            row_id, reserved_at = job.token
            by_token.setdefault(reserved_at, []).append(int(row_id))
        per = 90 if self.dialect == "d1" else 400  # D1: at most 100 bound values a statement
        for reserved_at, ids in by_token.items():
            for i in range(0, len(ids), per):
                chunk = ids[i : i + per]
                stmt = self.sql["heartbeat_many"].replace("{ids}", ", ".join(["?"] * len(chunk)))
                await self.db.execute(stmt, [now, reserved_at, *chunk])
