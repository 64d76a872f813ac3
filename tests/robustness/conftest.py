"""Fixtures of the robustness tests: the session's PostgreSQL database."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rb_harness import pg_database


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    yield from pg_database("haze_rb")
