"""How the database driver settles claimed rows: acks (one or many, and an ack with the
next claim in one statement), release, fail and heartbeats, each only on a row that
still carries this claim's ``reserved_at``."""

from __future__ import annotations

import builtins
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from haze.connectors import Session
from haze.contracts.driver import FailedJob, Reserved
from haze.drivers.sql.base import _ACKS_KEPT, _mysql_retry, _needs_tables
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
        tokens = [job.token for job in jobs]
        pairs = [(int(job.token[0]), job.token[1]) for job in jobs]
        with self._sending_acks(pairs):
            owned = await self._ack_pairs(pairs)
        return await self._moved_acks(jobs, tokens, await self._acked(pairs, owned))

    async def _moved_acks(
        self, jobs: Sequence[Reserved], tokens: builtins.list[Any], owned: builtins.list[bool]
    ) -> builtins.list[bool]:
        """``owned``, with the acks that found their row under a new lease of their own
        run sent again with it: a claim of this driver passed it to the run meanwhile
        (``_adopted``)."""
        if not all(owned):
            await self._claims_done()
        moved = [i for i, ok in enumerate(owned) if not ok and jobs[i].token != tokens[i]]
        if moved:
            again = await self.ack_many([jobs[i] for i in moved])
            for i, ok in zip(moved, again, strict=True):
                owned[i] = ok
        return owned

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
            for chunk in self._chunks(pairs, d1=45, other=400):
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
        for chunk in self._chunks(repeats, d1=90, other=500):
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
        tokens = [job.token for job in jobs]
        pairs = [(int(job.token[0]), job.token[1]) for job in jobs]
        lapsed = self._looks_for_lapsed(queue)
        with self._sending_acks(pairs):
            # the acks that crossed a claim are settled inside this claim: until it
            # returns, the jobs it took are in no renewal set, and a claim taking over
            # lapsed leases meanwhile must wait for it (_claiming)
            async with self._claiming(lapsed=lapsed):
                owned, claimed = await self._ack_and_claim(pairs, queue, limit, lapsed)
                return await self._moved_acks(jobs, tokens, owned), claimed

    async def _ack_and_claim(
        self, pairs: builtins.list[tuple[int, Any]], queue: str, limit: int, lapsed: bool
    ) -> tuple[builtins.list[bool], builtins.list[Reserved]]:
        now = time.time()
        token = self._token()
        abandoned = now - self.retry_after if lapsed else 0.0
        ids = [p[0] for p in pairs]
        if self.dialect == "mysql":

            async def both(tx: Session) -> tuple[set[int], builtins.list[tuple[Any, ...]]]:
                acked = await self._mysql_ack(tx, pairs)
                # the acked rows are deleted in this transaction: the claim cannot see them
                rows = await self._mysql_claim(tx, queue, limit, now, abandoned, token)
                return acked, rows

            acked, rows = await self._mysql_tx(both)
            owned = await self._acked(pairs, acked)
            return owned, await self._claimed(rows, queue, token, lapsed=lapsed)
        branches = _branches(queue, now, limit, abandoned)
        # the lapsed branch skips the rows being acked: their ids follow abandoned_before
        params = (
            *(ids, [p[1] for p in pairs], *branches[:LAPSED_END], ids),
            *(*branches[LAPSED_END:], token, token),
        )
        rows = await self.db.fetchall(self.sql["ack_claim_many"], params)
        acked = {int(r[0]) for r in rows if r[1] is None}
        claimed = [r for r in rows if r[1] is not None]
        owned = await self._acked(pairs, acked)
        return owned, await self._claimed(claimed, queue, token, lapsed=lapsed)

    async def _as_held(self, job: Reserved, settle: Callable[[Any], Awaitable[bool]]) -> bool:
        """``settle(job.token)``, sent again when it found the row under a new lease of
        this very run: a claim of this driver passed it to the run meanwhile
        (``_adopted``)."""
        while True:
            token = job.token
            done = await settle(token)
            if not done:
                await self._claims_done()
            if done or job.token == token:
                return done

    @_needs_tables
    async def ack(self, job: Reserved) -> bool:
        # ack, release and fail match the row by its id and this claim's reserved_at: 0
        # rows means another worker reclaimed it after retry_after (False, nothing
        # changed), unless the row is gone: an earlier try deleted it (True)
        return await self._as_held(job, self._ack_token)

    async def _ack_token(self, token: Any) -> bool:
        row_id, reserved_at = token
        pair = (int(row_id), reserved_at)
        with self._sending_acks([pair]):
            deleted = await self.db.execute(self.sql["ack"], (row_id, reserved_at)) > 0
        [acked] = await self._acked([pair], {pair[0]} if deleted else set())
        return acked

    @_needs_tables
    async def release(self, job: Reserved, delay: float, *, consume_attempt: bool) -> bool:
        if consume_attempt:
            return await self._retry(job, delay)
        return await self._as_held(job, functools.partial(self._reinsert, job, delay))

    async def _retry(self, job: Reserved, delay: float) -> bool:
        """release(consume_attempt=True): the row due again after ``delay``."""
        while True:
            row_id, reserved_at = token = job.token
            pair = (int(row_id), reserved_at)
            # Before the write: once it commits, a claim of the row (this driver's too)
            # is the next attempt, even while this run is still in its renewal set.
            self._note_released(pair)
            due = time.time() + delay
            if await self.db.execute(self.sql["retry"], (due, due, row_id, reserved_at)) > 0:
                return True
            # 0 rows: the lease lapsed, and a claim of this driver took the row: one
            # passing it to this run (go again with its lease), or one that took it as
            # the next attempt (done).
            await self._claims_done()
            if job.token != token:
                continue
            now_under = await self.db.fetchone(self.sql["reserved_of"], (row_id,))
            if now_under is not None and float(now_under[0] or 0) in self._tokens:
                return True
            return self._released.get(pair, False)

    def _note_released(self, pair: tuple[int, Any]) -> None:
        released = self._released
        released[pair] = False
        while len(released) > _ACKS_KEPT:
            del released[next(iter(released))]

    async def _reinsert(self, job: Reserved, delay: float, token: Any) -> bool:
        """release(): a new row with the attempt handed back, only if ``token`` (the
        job's claim) still owns the old one."""
        row_id, reserved_at = token
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
        return await self._as_held(job, functools.partial(self._fail_token, failed))

    async def _fail_token(self, failed: FailedJob, token: Any) -> bool:
        row_id, reserved_at = token
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
        # A statement per chunk of (id, reserved_at) pairs, whatever claims they came
        # from: one per claim token cost a round trip per claim, and a worker fed by a
        # producer claims its jobs a few at a time, so at --concurrency 4,000 a round
        # outlasted retry_after and the worker took its own running jobs over. Each chunk
        # is its own statement (all of its rows or none): a worker that dies between two
        # leaves the rest at their last renewal, and every row it held lapses
        # retry_after after its own, as after any crash.
        pairs = sorted({(int(job.token[0]), job.token[1]) for job in jobs})
        for chunk in self._chunks(pairs, d1=45, other=400, postgres=5000, mysql=500):
            # the time of this chunk's write, not of the round's start: a long round
            # must not write a heartbeat that is already old
            now = time.time()
            if self.dialect == "postgres":
                ids, tokens = [p[0] for p in chunk], [p[1] for p in chunk]
                await self.db.execute(self.sql["heartbeat_pairs"], (now, ids, tokens))
            elif self.dialect == "mysql":
                await _mysql_retry(functools.partial(self._mysql_heartbeat, chunk, now))
            else:
                marks = ", ".join(["(?, ?)"] * len(chunk))
                stmt = self.sql["heartbeat_pairs"].replace("{pairs}", marks)
                await self.db.execute(stmt, [*(v for p in chunk for v in p), now])

    async def _mysql_heartbeat(self, chunk: Sequence[tuple[int, Any]], now: float) -> None:
        by_token: dict[Any, builtins.list[int]] = {}
        for row_id, token in chunk:
            by_token.setdefault(token, []).append(row_id)
        where = " OR ".join(
            f"(reserved_at = ? AND id IN ({', '.join(['?'] * len(ids))}))"
            for ids in by_token.values()
        )
        stmt = (
            self.sql["heartbeat_pairs"]
            .replace("{ids}", ", ".join(["?"] * len(chunk)))
            .replace("{where}", where)
        )
        groups = [v for token, ids in by_token.items() for v in (token, *ids)]
        await self.db.execute(stmt, [now, *(p[0] for p in chunk), *groups])
