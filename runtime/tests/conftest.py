"""Shared fixtures for the runtime's unit tests.

Job names are registered process-wide, so every test module defines its jobs at
module level with names unique to the module (or passes ``name=``).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from haze import App, Queue, define_queue_config
from haze import testing as haze_testing


@pytest.fixture(autouse=True)
def _piped_output_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test reads the CLI's output as a script piping ``haze`` does: 200 columns
    wide, unless the test sets ``COLUMNS`` itself (``haze.cli._core.console``). A
    pytest-xdist worker's environment gains ``COLUMNS=80`` and ``LINES=24`` before its
    first test (the no-terminal default readline exports), and a developer's shell may
    export its own: tables then wrapped only there."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


def make_app(**connections: dict[str, Any]) -> App:
    """An app with a ``memory`` default connection, a ``sync`` one, and any extras."""
    conns: dict[str, dict[str, Any]] = {
        "memory": {"driver": "memory"},
        "sync": {"driver": "sync"},
    }
    conns.update(connections)
    return App(queue=define_queue_config(default="memory", connections=conns))


@pytest.fixture(name="make_app")
def make_app_fixture() -> Any:
    """The ``make_app(**extra_connections)`` factory (test modules are not a package)."""
    return make_app


@pytest.fixture
async def app() -> AsyncIterator[App]:
    """An entered app: ``memory`` (default, concurrency 1) and ``sync`` connections."""
    a = make_app()
    async with a:
        yield a


@pytest.fixture(autouse=True)
def _no_fake_left_behind() -> Iterator[None]:
    """A test that fails between ``Queue.fake()`` and ``Queue.restore()`` must not leak."""
    yield
    if haze_testing._active_fake is not None:
        Queue.restore()


@pytest.fixture
def isolated_imports() -> Iterator[None]:
    """Undo ``sys.path`` and ``app.*`` module changes made by ``App(root=...)`` discovery."""
    path = list(sys.path)
    before = set(sys.modules)
    yield
    sys.path[:] = path
    for name in set(sys.modules) - before:
        if name == "app" or name.startswith(("app.", "_haze_jobs_", "_haze_config_")):
            sys.modules.pop(name, None)
