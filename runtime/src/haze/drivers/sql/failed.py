"""The database driver's failed jobs: its own ``failed_jobs`` table."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from haze._base.message import Message, retry_claim_of
from haze._failed import SqlFailedJobs
from haze.connectors import Session
from haze.drivers.sql.turns import group_of

if TYPE_CHECKING:
    from haze.connectors import Connector
    from haze.drivers.sql.base import _DatabaseBase


class _QueueFailedJobs(SqlFailedJobs):
    """The driver's own ``failed_jobs`` table, beside its jobs table in one database: a
    retry inserts the job and deletes the record in one transaction
    (``RetriesAtomically``). D1 has no transactions: there the two statements run one
    after the other (the job first, so a crash between them never loses it)."""

    def __init__(self, driver: _DatabaseBase) -> None:
        super().__init__(
            lambda: driver.db, table=driver.failed_table, error=driver._tables_missing_for
        )
        self._driver = driver

    async def requeue_claimed(self, id: str, token: str, body: str, message: Message) -> bool:
        found = await self.find(id)
        held = retry_claim_of(found.body) if found is not None else None
        if found is None or held is None or held[0] != token:
            return False
        d = self._driver
        sql = d.sql
        now = time.time()
        group = group_of(message)

        async def step(tx: Session) -> bool:
            turn = await d._turn(tx, message.queue, group, now)
            job = (message.queue, body, message.attempts, now, now, group, turn)
            if d.dialect == "d1":
                await tx.execute(sql["enqueue"], job)
                await tx.execute(sql["failed_forget_body"], (id, found.body))
                return True
            # The record only goes while it still holds this claim; the job only with it.
            if await tx.execute(sql["failed_forget_body"], (id, found.body)) == 0:
                return False
            await tx.execute(sql["enqueue"], job)
            return True

        async def run(db: Connector, _: dict[str, str]) -> bool:
            if d.dialect == "mysql":
                return await d._mysql_tx(step)
            async with db.transaction(immediate=True) as tx:
                return await step(tx)

        done = await self._call(run)
        if done:
            d._notify(message.queue)
        return done
