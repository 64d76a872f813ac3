"""haze's own upgrades of tables it created in an earlier version, run by ``db:migrate``.

MySQL/MariaDB tables created before the binary collation compare text case-, accent-
and trailing-space-insensitively (the server's default collation), and the oldest keep
``VARCHAR(191)`` queue columns. :func:`upgrade_tables` finds haze's tables on the
database by their columns (the jobs and failed-jobs tables of any name, and the
``database`` store's tables) and converts each one that needs it, in ONE ``ALTER TABLE``
per table: the server applies it whole or not at all, so a crash leaves each table
either upgraded or as it was, and the next ``db:migrate`` finishes the rest. An
``ALTER`` rebuilds the table and holds writes to it until done: run it while the
workers are stopped, or expect a pause as long as the copy takes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from haze._base.errors import ConfigError

if TYPE_CHECKING:
    from haze.connectors import Connector

__all__ = ["upgrade_tables"]

#: Columns that name a haze table's kind (a subset: later versions may add columns).
_KINDS = {
    "jobs": {"queue", "payload", "attempts", "reserved_at", "available_at"},
    "failed": {"uuid", "connection", "queue", "payload", "exception", "failed_at"},
}
#: The store's table is matched on its exact columns: a user's cache table may share some.
_STORE = {"key", "value", "expires_at"}
#: The binary NO PAD collation of each server, in order of preference.
_COLLATIONS = ("utf8mb4_nopad_bin", "utf8mb4_0900_bin")
_QUEUE_WIDTH = 255

_COLUMNS = (
    "SELECT TABLE_NAME, COLUMN_NAME, COLLATION_NAME, CHARACTER_MAXIMUM_LENGTH "
    "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()"
)


async def _target_collation(db: Connector) -> str:
    marks = ", ".join("?" * len(_COLLATIONS))
    rows = await db.fetchall(
        f"SELECT COLLATION_NAME FROM information_schema.COLLATIONS "
        f"WHERE COLLATION_NAME IN ({marks})",
        _COLLATIONS,
    )
    found = {str(r[0]) for r in rows}
    target = next((c for c in _COLLATIONS if c in found), None)
    if target is None:
        raise ConfigError(
            "this MySQL server has no binary NO PAD collation (utf8mb4_nopad_bin on MariaDB "
            "10.2+, utf8mb4_0900_bin on MySQL 8): haze needs MariaDB 10.6+ or MySQL 8"
        )
    return target


def _alter(table: str, columns: dict[str, tuple[str | None, int | None]], target: str) -> str:
    """The one ALTER that upgrades ``table``, or "" when it needs nothing."""
    convert = any(coll is not None and coll != target for coll, _ in columns.values())
    narrow = "queue" in columns and (columns["queue"][1] or 0) < _QUEUE_WIDTH
    if not (convert or narrow):
        return ""
    parts = [f"CONVERT TO CHARACTER SET utf8mb4 COLLATE {target}"]
    if narrow:
        parts.append(
            f"MODIFY queue VARCHAR({_QUEUE_WIDTH}) CHARACTER SET utf8mb4 COLLATE {target} NOT NULL"
        )
    return f"ALTER TABLE `{table}` " + ", ".join(parts)


async def upgrade_tables(db: Connector) -> list[str]:
    """Upgrade haze's tables on ``db`` (MySQL/MariaDB only); returns those it changed."""
    if db.dialect != "mysql":
        return []
    tables: dict[str, dict[str, tuple[str | None, int | None]]] = {}
    for table, column, collation, width in await db.fetchall(_COLUMNS):
        tables.setdefault(str(table), {})[str(column)] = (
            None if collation is None else str(collation),
            None if width is None else int(width),
        )
    target = await _target_collation(db)
    upgraded = []
    for table, columns in sorted(tables.items()):
        names = set(columns)
        if names != _STORE and not any(kind <= names for kind in _KINDS.values()):
            continue
        statement = _alter(table, columns, target)
        if statement:
            await db.execute(statement)
            upgraded.append(table)
    return upgraded
