"""The ``database`` driver: jobs in a SQL table (SQLite, libSQL/Turso, D1, PostgreSQL,
MySQL 8 / MariaDB), as the seed's 数据库驱动 section describes.

- Claim: PostgreSQL and MySQL ``SELECT … FOR UPDATE SKIP LOCKED`` then mark the rows
  (``reserved_at``, ``attempts + 1``); SQLite/libSQL/D1 one atomic
  ``UPDATE … WHERE id IN (SELECT … LIMIT n) RETURNING``. Rows are taken in turn order
  (``turn``, then ``id``; ``turns.py``): a row without a tenant group has its due time
  (``available_at``) as its turn, so those are taken in due order, from an index that
  starts at the rows whose turn has come; a group's rows take one turn each, so groups
  are taken round-robin. Both are merged with the rows whose lease ran out. An idle
  worker's wait ends when the first row not due yet comes due.
- Delays and retries go through ``available_at``; ``job.release()`` re-inserts the
  row without using a try.
- A row reserved (or heartbeated) longer ago than ``retry_after`` is reclaimed; a
  worker only deletes or releases a row that still carries its own ``reserved_at``.
- Final failures move to ``failed_jobs`` in the same transaction as the delete.
- While a job runs the worker refreshes ``heartbeat_at`` (lease heartbeats), so a long
  job is not reclaimed while its worker lives: one statement per chunk of (id,
  reserved_at) pairs, whatever claims they came from, each chunk stamped with the time
  it is sent.
- PostgreSQL with autovacuum off: the workers vacuum the jobs table themselves, one at
  a time, when dead rows pile up (``vacuum.py``; ``vacuum: False`` turns it off).

SQL lives beside this package's modules: ``common.sql`` plus one file per dialect.
"""

from __future__ import annotations

from haze.drivers.sql.base import D1_MAX_MESSAGE_SIZE, D1_ROW_LIMIT
from haze.drivers.sql.driver import DatabaseDriver

__all__ = ["D1_MAX_MESSAGE_SIZE", "D1_ROW_LIMIT", "DatabaseDriver"]
