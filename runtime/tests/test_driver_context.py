"""A connection is built into its route when the app starts (no I/O: the driver object,
not a connection), and a driver is built as ``cls(name, options, context)``: it is handed
a ``DriverContext`` (its database connector, the other connections, two engine calls),
never the App."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from haze import (
    App,
    ConfigError,
    define_database_config,
    define_job,
    define_queue_config,
    define_redis_config,
)
from haze._base import plugins
from haze._base.errors import MissingDependencyError
from haze.driver_api import DriverContext
from haze.drivers import register_driver
from haze.drivers.failover import FailoverDriver
from haze.drivers.memory import MemoryDriver
from haze.drivers.sql import DatabaseDriver


@define_job(name="context_noop")
async def noop(payload: dict[str, Any]) -> None:
    pass


@pytest.fixture(autouse=True)
def _clean_registry() -> Iterator[None]:
    registered = {g: dict(t) for g, t in plugins._registered.items()}
    loaded = dict(plugins._loaded)
    yield
    plugins._registered.clear()
    plugins._registered.update(registered)
    plugins._loaded.clear()
    plugins._loaded.update(loaded)


def _app(tmp_path: Path, extra: dict[str, Any]) -> App:
    return App(
        queue=define_queue_config(
            default="mem", connections={"mem": {"driver": "memory"}, **extra}
        ),
        database=define_database_config(
            default="main",
            connections={
                "main": {"url": f"sqlite:///{tmp_path / 'q.db'}"},
                "d1": {"url": "d1://DB"},
            },
        ),
        redis=define_redis_config(default="r", connections={"r": {"url": "redis://127.0.0.1"}}),
    )


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"driver": "database", "connection": "nope"}, "not a connection in config/database.py"),
        ({"driver": "redis", "connection": "nope"}, "not a connection in config/redis.py"),
        (
            {"driver": "database", "connection": "d1", "max_message_size": 3_000_000},
            "more than a D1 row can hold",
        ),
    ],
)
async def test_a_connection_that_cannot_be_built_is_refused_when_the_app_starts(
    tmp_path: Path, options: dict[str, Any], said: str
) -> None:
    app = _app(tmp_path, {"bad": options})
    with pytest.raises(ConfigError, match=said) as info:
        async with app:
            pytest.fail("the app started with a connection that cannot be built")
    assert "connections.bad." in str(info.value)
    assert "\n" not in str(info.value)


async def test_every_connection_has_its_route_once_the_app_started(tmp_path: Path) -> None:
    app = _app(tmp_path, {"jobs": {"driver": "database"}, "cache": {"driver": "redis"}})
    async with app:
        built = app.open_drivers()
        assert set(built) == {"mem", "jobs", "cache"}
        # building a driver opens nothing: the connector has not connected yet
        assert isinstance(built["jobs"], DatabaseDriver)
        route = app.manager.dispatcher.route("jobs")
        assert route.driver is built["jobs"]


async def test_a_connection_whose_client_is_not_installed_stays_lazy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = tmp_path / "needs_a_client.py"
    module.write_text(
        "from haze._base.errors import MissingDependencyError\n"
        "raise MissingDependencyError('the needy driver', 'needy', 'needy_client')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "needs_a_client", raising=False)
    register_driver("needy", "needs_a_client:Needy")
    app = _app(tmp_path, {"edge": {"driver": "needy"}})
    async with app:
        assert "edge" not in app.open_drivers()
        with pytest.raises(MissingDependencyError, match="needy"):
            await noop.dispatch({}, connection="edge")


def test_the_database_driver_is_handed_its_connector_not_the_app(tmp_path: Path) -> None:
    app = _app(tmp_path, {"jobs": {"driver": "database", "table": "jobs"}})
    driver = app.driver("jobs")
    assert isinstance(driver, DatabaseDriver)
    assert driver.db is app.database("main")
    assert not any(value is app for value in vars(driver).values())


def test_the_failover_driver_is_handed_its_members_not_the_app(tmp_path: Path) -> None:
    app = _app(
        tmp_path,
        {
            "other": {"driver": "memory"},
            "both": {"driver": "failover", "connections": ["mem", "other"]},
        },
    )
    driver = app.driver("both")
    assert isinstance(driver, FailoverDriver)
    assert driver.members == [app.driver("mem"), app.driver("other")]
    assert not any(value is app for value in vars(driver).values())


class OldStylePlugin(MemoryDriver):
    """A plugin written for ``cls(name, options, app)`` that reads only what a driver is
    handed (the root, the default connection): it keeps working."""

    def __init__(self, name: str, options: dict[str, Any], app: Any = None):
        super().__init__(name, options, app)
        self.seen = (app.root, app.default_connection, app.database().dialect)


class ReachesForTheApp(MemoryDriver):
    """A plugin that asks its third argument for the app's engine: refused in one line."""

    def __init__(self, name: str, options: dict[str, Any], app: Any = None):
        super().__init__(name, options, app)
        self.manager = app.manager


def test_a_plugin_built_on_what_it_is_handed_keeps_working(tmp_path: Path) -> None:
    register_driver("oldstyle", OldStylePlugin)
    app = _app(tmp_path, {"plug": {"driver": "oldstyle"}})
    driver = app.driver("plug")
    assert isinstance(driver, OldStylePlugin)
    assert driver.seen == (None, "mem", "sqlite")


async def test_a_plugin_that_reaches_for_the_app_is_refused_in_one_line(tmp_path: Path) -> None:
    register_driver("reacher", ReachesForTheApp)
    app = _app(tmp_path, {"plug": {"driver": "reacher"}})
    with pytest.raises(ConfigError) as info:
        async with app:
            pass
    message = str(info.value)
    assert "\n" not in message
    assert "connections.plug.driver" in message
    assert "'manager'" in message
    assert "DriverContext" in message


def test_the_context_a_driver_is_handed_is_the_declared_protocol(tmp_path: Path) -> None:
    seen: list[object] = []

    class Looks(MemoryDriver):
        def __init__(self, name: str, options: dict[str, Any], context: Any = None):
            super().__init__(name, options, context)
            seen.append(context)

    register_driver("looks", Looks)
    app = _app(tmp_path, {"plug": {"driver": "looks"}})
    app.driver("plug")
    [context] = seen
    assert isinstance(context, DriverContext)
    assert context is not app


async def test_an_app_that_fails_to_start_is_not_left_current(tmp_path: Path) -> None:
    """A start refused (a connection that cannot be built) leaves no half-entered app
    behind: later dispatches go where they went before."""
    from haze._base import current

    before = current.explicit_app()
    app = _app(tmp_path, {"bad": {"driver": "database", "connection": "nope"}})
    with pytest.raises(ConfigError):
        async with app:
            pass
    assert current.explicit_app() is before
    assert not app.entered
