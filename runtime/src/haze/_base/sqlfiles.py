"""Named SQL blocks in ``.sql`` files kept beside the code that runs them.

A file holds blocks introduced by ``-- name: <block>`` lines; ``--`` comment lines
inside a block are dropped.

The queue tables' statements (``jobs`` and ``failed_jobs``) live in
``haze/drivers/sql/``: ``common.sql`` plus one file per dialect. They are read
here, below both the database driver and the failed-job stores that run them, and
``haze make:queue-tables`` that writes their schema.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

__all__ = ["queue_dialect", "queue_schema", "queue_sql", "sql_blocks"]

_BLOCK = re.compile(r"^-- name: (\w+)\s*$", re.M)

#: The queue tables' SQL files (a path, not an import: nothing here loads the driver).
QUEUE_SQL_DIR = Path(__file__).parent.parent / "drivers" / "sql"
_DIALECT_FILE = {
    "sqlite": "sqlite",
    "libsql": "sqlite",
    "d1": "sqlite",
    "postgres": "postgres",
    "mysql": "mysql",
}


def queue_dialect(dialect: str) -> str:
    """The SQL the queue tables use on ``dialect`` (libSQL and D1 speak SQLite's)."""
    return _DIALECT_FILE.get(dialect, dialect)


@cache
def sql_blocks(path: Path) -> dict[str, str]:
    parts = _BLOCK.split(path.read_text())
    out: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [ln for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
        out[name] = "\n".join(lines).strip()
    return out


def queue_sql(dialect: str, jobs: str, failed: str) -> dict[str, str]:
    """Every queue statement for ``dialect`` with the (validated) table names filled in."""
    merged = {
        **sql_blocks(QUEUE_SQL_DIR / "common.sql"),
        **sql_blocks(QUEUE_SQL_DIR / f"{_DIALECT_FILE[dialect]}.sql"),
    }
    return {k: v.format(jobs=jobs, failed=failed) for k, v in merged.items()}


def queue_schema(dialect: str, jobs: str = "jobs", failed: str = "failed_jobs") -> list[str]:
    """The ``CREATE TABLE``/``INDEX`` statements for the queue tables, one per item."""
    text = queue_sql(dialect, jobs, failed)["schema"]
    return [s.strip() for s in text.split(";") if s.strip()]
