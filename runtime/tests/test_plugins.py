"""Plugins by name: the driver, store and connector registries look a name up in their
built-in table, then in-process registrations, then the installed entry points."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from typing import Any

import pytest
from haze._base import plugins
from haze._base.errors import ConfigError
from haze.connectors import connector_class, register_connector
from haze.drivers import driver_class, register_driver
from haze.drivers.memory import MemoryDriver
from haze.stores import register_store, store_class


@pytest.fixture(autouse=True)
def _clean_registry() -> Iterator[None]:
    registered = {g: dict(t) for g, t in plugins._registered.items()}
    published, loaded = dict(plugins._published), dict(plugins._loaded)
    yield
    plugins._registered.clear()
    plugins._registered.update(registered)
    plugins._published.clear()
    plugins._published.update(published)
    plugins._loaded.clear()
    plugins._loaded.update(loaded)


class Made:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs


def test_a_built_in_name_is_found_without_reading_entry_points(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(**kw: Any) -> Any:
        raise AssertionError("entry points read for a built-in name")

    monkeypatch.setattr(importlib.metadata, "entry_points", refuse)
    plugins._published.clear()
    assert driver_class("memory") is MemoryDriver


def test_a_registered_name_is_imported_on_first_use() -> None:
    register_driver("made", f"{__name__}:Made")
    assert ("haze.drivers", "made") not in plugins._loaded
    assert driver_class("made") is Made
    register_store("made", Made)
    assert store_class("made") is Made
    register_connector("madedb", f"{__name__}:Made")
    assert connector_class("madedb://x/y") is Made


def test_a_built_in_name_cannot_be_taken_over() -> None:
    with pytest.raises(ValueError, match="built-in queue driver"):
        register_driver("redis", Made)
    with pytest.raises(ValueError, match="built-in store"):
        register_store("memory", Made)
    with pytest.raises(ValueError, match="built-in database backend"):
        register_connector("sqlite", Made)


def test_an_entry_point_provides_a_name(monkeypatch: pytest.MonkeyPatch) -> None:
    ep = importlib.metadata.EntryPoint("viaep", f"{__name__}:Made", "haze.drivers")
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda group: [ep] if group == "haze.drivers" else [],
    )
    plugins._published.clear()
    assert driver_class("viaep") is Made
    assert "viaep" in plugins.names("haze.drivers")


def test_an_unknown_name_says_what_is_known() -> None:
    register_driver("made", Made)
    with pytest.raises(ConfigError, match=r"no queue driver is named 'nope' \(known: .*made"):
        driver_class("nope", key="connections.x.driver")
    with pytest.raises(ConfigError, match=r"'haze\.stores' entry point group"):
        store_class("nope")
    with pytest.raises(ConfigError, match="unsupported database URL 'nope://x'"):
        connector_class("nope://x")


def test_a_plugin_that_fails_to_import_says_which() -> None:
    register_store("broken", "haze_t_no_such_module:Store")
    with pytest.raises(ModuleNotFoundError) as e:
        store_class("broken")
    assert "haze.stores plugin 'broken'" in "".join(e.value.__notes__)
