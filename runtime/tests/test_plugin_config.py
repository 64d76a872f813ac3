"""A driver or store a package adds is configured like a built-in one: the app checks
its options against what its class declares (``DeclaresOptions``) and refuses the rest."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from haze import App, ConfigError, define_cache_config, define_queue_config, drivers, stores
from haze._kernel import plugins
from haze.contracts.driver import DeclaresOptions
from haze.drivers import register_driver
from haze.drivers.memory import MemoryDriver
from haze.stores import register_store
from haze.stores.memory import MemoryStore


class LoftDriver(MemoryDriver):
    options: ClassVar[dict[str, str]] = {"url": "str", "retry_after": "duration"}


class PlainDriver(MemoryDriver):
    """Declares no options: it takes the common ones only."""


class LoftStore(MemoryStore):
    options: ClassVar[dict[str, str]] = {"prefix": "str"}


@pytest.fixture(autouse=True)
def registered() -> Iterator[None]:
    register_driver("cfg_loft", LoftDriver)
    register_driver("cfg_plain", PlainDriver)
    register_store("cfg_loft", LoftStore)
    yield
    for group in (plugins.DRIVERS, plugins.STORES):
        for name in ("cfg_loft", "cfg_plain"):
            plugins.unregister(group, name)


def queue(**connection: Any) -> Any:
    return define_queue_config(connections={"main": connection})


def test_a_plugin_driver_takes_the_options_its_class_declares() -> None:
    app = App(queue=queue(driver="cfg_loft", url="loft://x", retry_after="30s", concurrency=4))
    options = app.queue_config.connections["main"]
    assert options["url"] == "loft://x"
    assert options["retry_after"] == 30.0
    assert options["concurrency"] == 4


def test_a_plugin_driver_refuses_an_undeclared_or_mistyped_option() -> None:
    with pytest.raises(ConfigError, match=r"connections\.main.*urll"):
        App(queue=queue(driver="cfg_loft", urll="loft://x"))
    with pytest.raises(ConfigError, match=r"connections\.main\.retry_after"):
        App(queue=queue(driver="cfg_loft", retry_after="soon"))
    with pytest.raises(ConfigError, match=r"connections\.main.*url"):
        App(queue=queue(driver="cfg_plain", url="loft://x"))


def test_an_unknown_driver_names_the_plugins_and_the_entry_point_group() -> None:
    with pytest.raises(ConfigError) as e:
        App(queue=queue(driver="carrier-pigeon"))
    message = str(e.value)
    assert "cfg_loft" in message and "memory" in message
    assert "'haze.drivers' entry point group" in message


def test_a_plugin_store_takes_the_options_its_class_declares() -> None:
    cache = define_cache_config(stores={"s": {"driver": "cfg_loft", "prefix": "p"}})
    assert App(cache=cache).cache_config.stores["s"]["prefix"] == "p"
    bad = define_cache_config(stores={"s": {"driver": "cfg_loft", "table": "t"}})
    with pytest.raises(ConfigError, match=r"stores\.s.*table"):
        App(cache=bad)


@pytest.mark.parametrize("name", sorted(drivers.REGISTRY.built_in))
def test_every_built_in_driver_declares_its_options(name: str) -> None:
    assert isinstance(drivers.driver_class(name), DeclaresOptions)


@pytest.mark.parametrize("name", sorted(stores.REGISTRY.built_in))
def test_every_built_in_store_declares_its_options(name: str) -> None:
    assert isinstance(stores.store_class(name), DeclaresOptions)


def test_a_built_in_driver_refuses_what_its_class_does_not_declare() -> None:
    with pytest.raises(ConfigError, match=r"connections\.main\.prefix.*allowed here:.*table"):
        App(queue=queue(driver="database", prefix="p"))
    with pytest.raises(ConfigError, match=r"connections\.main\.concurrency.*allowed here"):
        App(
            queue=define_queue_config(
                connections={
                    "main": {"driver": "failover", "connections": ["m"], "concurrency": 2},
                    "m": {"driver": "memory"},
                }
            )
        )


def test_a_bad_table_name_is_refused_once_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"connections\.main\.failed_table.*SQL identifier"):
        App(queue=queue(driver="database", failed_table="failed-jobs"))
    bad = define_cache_config(stores={"s": {"driver": "database", "table": "1cache"}})
    with pytest.raises(ConfigError, match=r"stores\.s\.table.*SQL identifier"):
        App(cache=bad)
