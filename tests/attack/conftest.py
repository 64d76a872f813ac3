"""Fixtures of the attack tests: one PostgreSQL and one MariaDB database per session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from atk_harness import mysql_database, pg_database, sqlite_url


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    yield from pg_database("attack3_s")


@pytest.fixture(scope="session")
def mysql_url() -> Iterator[str]:
    yield from mysql_database("attack3_s")


@pytest.fixture(params=["sqlite", "postgres", "mariadb"])
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL on each SQL dialect the docs name for delayed jobs and groups."""
    if request.param == "sqlite":
        return sqlite_url(tmp_path)
    return str(
        request.getfixturevalue({"postgres": "pg_url", "mariadb": "mysql_url"}[request.param])
    )
