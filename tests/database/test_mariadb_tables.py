"""MariaDB's own table rules, on the real server: text compares byte for byte (names that
differ in case, accents or a trailing space stay apart), nothing is cut to a column's
width, and ``db:migrate`` upgrades tables created by older haze versions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from harness import mysql_database
from haze import (
    App,
    Queue,
    define_cache_config,
    define_database_config,
    define_job,
    define_queue_config,
)
from haze._orchestration import scheduling
from haze._orchestration.scheduling import Scheduler, schedule
from haze.connectors.migrations import ensure_queue_tables, migrate
from haze.connectors.mysql import STRICT_SQL_MODE


@pytest.fixture(scope="session")
def mysql_url() -> Iterator[str]:
    yield from mysql_database("dbx_names")


#: The tables as haze created them before (a VARCHAR(191) queue column, the server's
#: default collation, utf8mb4_general_ci on MariaDB).
OLD_DDL = (
    """CREATE TABLE jobs (
        id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
        queue VARCHAR(191) NOT NULL, payload LONGTEXT NOT NULL,
        attempts INT UNSIGNED NOT NULL DEFAULT 0, reserved_at DOUBLE NULL,
        heartbeat_at DOUBLE NULL, available_at DOUBLE NOT NULL, created_at DOUBLE NOT NULL,
        INDEX jobs_queue_idx (queue, reserved_at, available_at)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    """CREATE TABLE failed_jobs (
        id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
        uuid VARCHAR(64) NOT NULL UNIQUE, connection VARCHAR(191) NOT NULL,
        queue VARCHAR(191) NOT NULL, payload LONGTEXT NOT NULL, exception LONGTEXT NOT NULL,
        failed_at DOUBLE NOT NULL, INDEX failed_jobs_failed_at_idx (failed_at)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    """CREATE TABLE haze_cache (
        `key` VARCHAR(191) NOT NULL PRIMARY KEY, value LONGTEXT NOT NULL,
        expires_at DOUBLE NULL
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
)


def _app(url: str, root: Path) -> App:
    return App(
        root=root,
        queue=define_queue_config(
            default="db", connections={"db": {"driver": "database", "connection": "main"}}
        ),
        database=define_database_config(default="main", connections={"main": {"url": url}}),
        cache=define_cache_config(
            default="db", stores={"db": {"driver": "database", "connection": "main"}}
        ),
    )


@pytest.fixture
async def app(mysql_url: str, tmp_path: Path) -> AsyncIterator[App]:
    (tmp_path / "config").mkdir()
    db = _app(mysql_url, tmp_path).database()
    for table in ("jobs", "failed_jobs", "haze_cache", "haze_migrations"):
        await db.execute(f"DROP TABLE IF EXISTS {table}")
    await db.close()
    async with _app(mysql_url, tmp_path) as app:
        yield app


async def _columns(app: App) -> dict[str, tuple[str | None, int | None]]:
    rows = await app.database().fetchall(
        "SELECT CONCAT(TABLE_NAME, '.', COLUMN_NAME), COLLATION_NAME, CHARACTER_MAXIMUM_LENGTH "
        "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
        "AND TABLE_NAME IN ('jobs', 'failed_jobs', 'haze_cache') AND COLLATION_NAME IS NOT NULL"
    )
    return {str(r[0]): (r[1], None if r[2] is None else int(r[2])) for r in rows}


@define_job(name="mt_noop")
async def mt_noop(payload: dict[str, Any]) -> None:
    return None


async def test_db_migrate_upgrades_tables_created_with_the_old_ddl(app: App) -> None:
    db = app.database()
    for stmt in OLD_DDL:
        await db.execute(stmt)
    # a row that must survive the upgrade (written as the old haze did: a dispatch now
    # needs the group columns db:migrate adds)
    await db.execute(
        "INSERT INTO jobs (queue, payload, attempts, available_at, created_at) "
        "VALUES ('Tenant', '{}', 0, 1, 1)"
    )
    await app.store().put("k:Alice", 1)

    result = await migrate(app)
    assert sorted(result.upgraded) == ["failed_jobs", "haze_cache", "jobs"]
    columns = await _columns(app)
    assert {collation for collation, _ in columns.values()} == {"utf8mb4_nopad_bin"}
    assert columns["jobs.queue"][1] == 255
    assert columns["failed_jobs.queue"][1] == 255
    assert await Queue.size("Tenant") == 1
    assert await app.store().get("k:Alice") == 1
    # The upgraded tables keep lookalike names apart.
    for name in ("tenant", "ténant"):
        await mt_noop.dispatch({"n": 2}, queue=name)
    assert [await Queue.size(q) for q in ("Tenant", "tenant", "ténant")] == [1] * 3
    # (a trailing space is refused at dispatch; the NO PAD collation keeps store keys
    # differing in one apart: test_store_contract)
    assert await app.store().add("k:alice", 2, 60) is True
    # Nothing left to do the second time.
    assert (await migrate(app)).upgraded == []


async def test_new_tables_compare_byte_for_byte_and_need_no_upgrade(app: App) -> None:
    await ensure_queue_tables(app)
    await app.store().put("k", 1)
    columns = await _columns(app)
    assert {collation for collation, _ in columns.values()} == {"utf8mb4_nopad_bin"}
    assert (await migrate(app)).upgraded == []


async def test_every_session_is_strict(app: App) -> None:
    row = await app.database().fetchone("SELECT @@SESSION.sql_mode")
    assert row is not None
    assert set(STRICT_SQL_MODE.split(",")) <= set(str(row[0]).split(","))
    await app.database().execute("CREATE TABLE haze_cache (v VARCHAR(3)) ENGINE=Aria")
    with pytest.raises(Exception, match="Data too long"):
        await app.database().execute("INSERT INTO haze_cache (v) VALUES ('abcd')")


LONG_NAME = "s" * 184


async def test_a_schedule_with_a_184_character_name_fires(app: App) -> None:
    await ensure_queue_tables(app)
    fired: list[datetime] = []
    saved = dict(scheduling._registry)
    try:
        sched = schedule(mt_noop.with_({"n": 1}), every="10s", name=LONG_NAME)
        runner = Scheduler(app, schedules=[sched], on_fire=lambda s, at: fired.append(at))
        t0 = datetime(2026, 1, 1, 12, 0, 0, 500000, tzinfo=UTC)
        for i in range(3):
            await runner.step(t0 + timedelta(seconds=10 * i))
    finally:
        scheduling._registry.clear()
        scheduling._registry.update(saved)
    assert len(fired) == 2
    assert await Queue.size("default") == 2


@define_job(name="mt_unique", unique={"key": lambda p: p["key"], "for": "1h"})
async def mt_unique(payload: dict[str, Any]) -> None:
    return None


async def test_a_250_character_unique_key_is_released(app: App) -> None:
    from haze._workers.worker import Worker

    await ensure_queue_tables(app)
    key = "u" * 250
    first = await mt_unique.with_({"key": key}).dispatch()
    assert first.skipped is False
    assert (await mt_unique.with_({"key": key}).dispatch()).skipped is True
    worker = Worker(app, "db", ["default"], stop_when_empty=True, sleep=0.05)
    await asyncio.wait_for(worker.run(), 30)
    assert worker.processed == 1
    again = await mt_unique.with_({"key": key}).dispatch()
    assert again.skipped is False


def test_haze_db_migrate_reports_the_tables_it_upgraded(mysql_url: str, tmp_path: Path) -> None:
    from click.testing import CliRunner
    from haze.cli import get_cli

    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "database.py").write_text(
        "from haze import define_database_config\n"
        f"config = define_database_config(default='main', connections={{'main': {{'url': "
        f"{mysql_url!r}}}}})\n"
    )

    async def old_tables() -> None:
        db = _app(mysql_url, tmp_path).database()
        try:
            for table in ("jobs", "failed_jobs", "haze_cache", "haze_migrations"):
                await db.execute(f"DROP TABLE IF EXISTS {table}")
            await db.execute(OLD_DDL[0])
        finally:
            await db.close()

    asyncio.run(old_tables())
    cli = get_cli()
    first = CliRunner().invoke(cli, ["--root", str(tmp_path), "db:migrate"])
    assert first.exit_code == 0, first.output
    assert "Upgraded table jobs" in first.output
    second = CliRunner().invoke(cli, ["--root", str(tmp_path), "db:migrate"])
    assert second.exit_code == 0, second.output
    assert "Upgraded" not in second.output
