"""Shared by every test directory below: this folder is on ``sys.path`` (pytest puts a
rootdir-level conftest's folder there), so ``import worker_procs`` works everywhere."""

from __future__ import annotations

import pytest
from services import check_marked_servers


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "needs_server(server, url): skips when the server is down; fails under CI=true "
        "(services.needs_server)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # CI reruns a failed test (a shared 2-core box makes some timing tests flaky); a
    # storm or exactly-once test never gets a rerun: a pass on the second try would hide
    # the race it hunts.
    for item in items:
        if item.get_closest_marker("storm"):
            item.add_marker(pytest.mark.flaky(reruns=0))


def pytest_runtest_setup(item: pytest.Item) -> None:
    check_marked_servers(item)
