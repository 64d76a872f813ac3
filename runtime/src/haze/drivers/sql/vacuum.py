"""The database driver's own VACUUM of its jobs table, when autovacuum never will.

Every finished job leaves a dead row and dead index entries; a claim starts at the head
of the due index and steps over the dead entries until VACUUM removes them, so with
autovacuum off a backlog gets slower with every job done. A worker then vacuums the
table itself, as autovacuum would with the table's own settings: it looks at most every
``VACUUM_CHECK_SECONDS`` (one small statement), vacuums once ``VACUUM_DEAD_ROWS`` dead
rows piled up, in the background on a connection of its own (never in a transaction),
and one process at a time (the connector's advisory lock). ``vacuum: False`` on the
queue connection turns it off."""

from __future__ import annotations

import asyncio
import logging
import time

from haze.connectors import Vacuuming
from haze.drivers.sql.base import _DatabaseBase

log = logging.getLogger("haze.drivers")

#: dead rows that make a VACUUM worth it (the jobs table's autovacuum threshold)
VACUUM_DEAD_ROWS = 5000
#: seconds between two looks at the table's dead rows, per driver (autovacuum's naptime)
VACUUM_CHECK_SECONDS = 10.0


class _Vacuuming(_DatabaseBase):
    """Keeping the jobs table vacuumed when the server will not."""

    def _maybe_vacuum(self) -> None:
        """From the claim path: start a background look when one is due (cheap
        otherwise: two attribute reads and a clock)."""
        if not self._vacuum_on or self._vacuum_task is not None:
            return
        now = time.monotonic()
        if now - self._vacuum_checked < VACUUM_CHECK_SECONDS:
            return
        if self._vacuum_checked == float("-inf") and not isinstance(self._db, Vacuuming):
            self._vacuum_on = False  # SQLite, MySQL, ...: no task, now or later
            return
        self._vacuum_checked = now
        self._vacuum_task = asyncio.get_running_loop().create_task(self._vacuum_soon())

    async def _vacuum_soon(self) -> None:
        try:
            await self.maintain()
        except self.outage_errors:
            pass  # the worker's claims report an outage, once; the next look tries again
        except Exception as e:
            log.warning("VACUUM of %r failed: %s", self.table, e)
        finally:
            self._vacuum_task = None

    async def maintain(self) -> bool:
        """Vacuum the jobs table now if autovacuum never will and enough dead rows piled
        up, unless another process is vacuuming it; True when this call vacuumed."""
        db = self.db
        if not self._vacuum_on or not isinstance(db, Vacuuming):
            self._vacuum_on = False  # SQLite, MySQL, ...: nothing to do, ever
            return False
        row = await db.fetchone(self.sql["vacuum_due"], (self.table,))
        if row is None or int(row[0]) < VACUUM_DEAD_ROWS or not await db.vacuum(self.table):
            return False
        if not self._vacuum_said:
            self._vacuum_said = True
            log.info(
                "autovacuum is off for %r: this worker runs VACUUM on it once %s dead rows "
                "piled up (at most every %g s; the queue connection's vacuum: False turns "
                "this off)",
                self.table,
                f"{VACUUM_DEAD_ROWS:,}",
                VACUUM_CHECK_SECONDS,
            )
        return True
