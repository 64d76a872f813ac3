"""A bulk send on the SQL driver that fails after one of its INSERTs went through.

Real: haze, SQLite (a file under tmp_path). The refusal is SQLite's own: a trigger on
the jobs table aborts the INSERT of any row whose body holds a marker, as a constraint
would, so the driver's second multi-row INSERT (rows 501-600) fails after the first
(rows 1-500) was committed.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from haze import (
    App,
    DispatchIncompleteError,
    Queue,
    define_database_config,
    define_job,
    define_queue_config,
)
from haze.connectors.migrations import ensure_queue_tables


@define_job(name="dbp_job")
async def dbp_job(payload: Any) -> None:
    return None


async def test_an_insert_refused_after_another_went_through_names_the_rows_not_queued(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/q.db"
    app = App(
        queue=define_queue_config(default="db", connections={"db": {"driver": "database"}}),
        database=define_database_config(default="main", connections={"main": {"url": url}}),
    )
    await ensure_queue_tables(app)
    with sqlite3.connect(tmp_path / "q.db") as db:
        db.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON jobs WHEN NEW.payload LIKE '%refuse-me%' "
            "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
        )
    async with app:
        jobs = [
            dbp_job.with_({"n": n, "mark": "refuse-me" if n == 550 else ""}) for n in range(600)
        ]
        with pytest.raises(DispatchIncompleteError) as e:
            await Queue.bulk(jobs)
        assert len(e.value.failed) == 100 and e.value.unsent == 100, str(e.value)[:300]
        assert "500 of 600" in str(e.value)
        assert await app.driver("db").size("default") == 500
