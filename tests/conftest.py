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


def pytest_runtest_setup(item: pytest.Item) -> None:
    check_marked_servers(item)


def _weight(item: pytest.Item) -> int:
    if item.get_closest_marker("slow") is not None:
        return 2
    return 1 if item.get_closest_marker("pyodide") is not None else 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Fast tests first, then the Pyodide ones, then the slow (fault, storm, soak) ones,
    so ``scripts/test -x`` meets a simple failure early. A module moves as a whole (its
    heaviest test decides), so its module-scoped fixtures are set up once; the order
    inside each group is pytest's."""
    heaviest: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        heaviest[module] = max(heaviest.get(module, 0), _weight(item))
    items.sort(key=lambda item: heaviest[item.nodeid.split("::")[0]])
    # CI reruns a failed test (a shared 2-core box makes some timing tests flaky); a
    # storm or exactly-once test never gets a rerun: a pass on the second try would hide
    # the race it hunts.
    # (only where pytest-rerunfailures runs: Pyodide's pytest has no `flaky` marker)
    if not config.pluginmanager.hasplugin("rerunfailures"):
        return
    for item in items:
        if item.get_closest_marker("storm"):
            item.add_marker(pytest.mark.flaky(reruns=0))
