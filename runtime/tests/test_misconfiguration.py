"""No silent in-memory fallback: the app root, the implicit default app, and the lock and
batch store that follows the default connection's backend."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import haze._app.app as haze_app
import pytest
from haze import (
    App,
    ConfigError,
    Queue,
    define_cache_config,
    define_database_config,
    define_job,
    define_queue_config,
    define_redis_config,
)
from haze.connectors.migrations import ensure_queue_tables


@define_job(name="misconfig_noop")
async def noop(payload: dict[str, Any]) -> None:
    pass


# --------------------------------------------------------------------------- App(root=...)


def test_a_root_with_neither_config_nor_app_is_a_config_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        App(root=tmp_path)
    message = str(info.value)
    assert str(tmp_path.resolve()) in message
    assert "neither config/ nor app/" in message
    assert "App(root=__file__)" in message


def test_a_root_that_does_not_exist_is_a_config_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ConfigError, match="does not exist") as info:
        App(root=missing)
    assert str(missing) in str(info.value)


@pytest.mark.usefixtures("isolated_imports")
def test_a_file_as_root_means_its_folder(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "queue.py").write_text(
        "from haze import define_queue_config\n"
        "config = define_queue_config(default='edge', connections={'edge': {'driver': 'memory'}})\n"
    )
    script = tmp_path / "cron.py"
    script.write_text("")
    app = App(root=script)
    assert app.root == tmp_path.resolve()
    assert app.queue_config.default == "edge"


# --------------------------------------------------------------------------- implicit app


async def test_the_implicit_default_app_warns_once_per_process(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(haze_app, "_warned_implicit", False)
    caplog.set_level(logging.WARNING, logger="haze")
    await noop.dispatch({})
    await noop.dispatch({})
    await Queue.idle()
    warnings = [r.getMessage() for r in caplog.records if "implicit" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "lost when this process exits" in warnings[0]
    assert "config/queue.py" in warnings[0]


async def test_the_implicit_app_in_an_app_folder_says_to_enter_the_app(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """config/queue.py is here but no App read it: say that, and how to enter the App,
    not "Create config/queue.py"."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "queue.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(haze_app, "_warned_implicit", False)
    caplog.set_level(logging.WARNING, logger="haze")
    await noop.dispatch({})
    await Queue.idle()
    (warning,) = [r.getMessage() for r in caplog.records if "implicit" in r.getMessage()]
    assert "Create config/queue.py" not in warning
    assert "config/queue.py is here, but only an App reads it" in warning
    assert "with App(root=__file__):" in warning


async def test_a_bulk_dispatch_on_the_implicit_app_warns_too(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(haze_app, "_warned_implicit", False)
    caplog.set_level(logging.WARNING, logger="haze")
    await Queue.bulk([noop.with_({}), noop.with_({})])
    await Queue.idle()
    warnings = [r.getMessage() for r in caplog.records if "implicit" in r.getMessage()]
    assert len(warnings) == 1, warnings


async def test_an_app_of_your_own_does_not_warn_about_the_implicit_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, app: App
) -> None:
    monkeypatch.setattr(haze_app, "_warned_implicit", False)
    caplog.set_level(logging.WARNING, logger="haze")
    await noop.dispatch({})
    await Queue.idle()
    assert not [r for r in caplog.records if "implicit" in r.getMessage()]


# --------------------------------------------------------------------------- the store


def _sqlite(tmp_path: Path, name: str = "main") -> Any:
    return define_database_config(
        default=name, connections={name: {"url": f"sqlite:///{tmp_path}/app.db"}}
    )


def test_a_database_connection_keeps_its_locks_and_batches_in_the_same_database(
    tmp_path: Path,
) -> None:
    app = App(
        queue=define_queue_config(
            default="db",
            connections={"db": {"driver": "database", "connection": "jobsdb"}},
        ),
        database=define_database_config(
            default="other",
            connections={
                "other": {"url": f"sqlite:///{tmp_path}/other.db"},
                "jobsdb": {"url": f"sqlite:///{tmp_path}/jobs.db"},
            },
        ),
    )
    store: Any = app.queue_store
    assert type(store).__name__ == "DatabaseStore"
    assert store.shared
    assert store.db is app.database("jobsdb")
    assert app.batch_store is store


def test_a_redis_connection_keeps_its_locks_and_batches_on_the_same_redis(
    tmp_path: Path,
) -> None:
    app = App(
        queue=define_queue_config(
            default="r", connections={"r": {"driver": "redis", "connection": "jobs"}}
        ),
        redis=define_redis_config(
            default="cache",
            connections={
                "cache": {"url": "redis://127.0.0.1:6379/3"},
                "jobs": {"url": "redis://127.0.0.1:6379/5", "key_prefix": "p:"},
            },
        ),
    )
    store: Any = app.queue_store
    assert type(store).__name__ == "RedisStore"
    assert store._url == "redis://127.0.0.1:6379/5"
    assert store.prefix == "p:"
    assert app.batch_store is store


def test_an_inline_redis_url_is_followed_too() -> None:
    app = App(
        queue=define_queue_config(
            default="r", connections={"r": {"driver": "redis", "url": "redis://127.0.0.1:6379/7"}}
        )
    )
    store: Any = app.queue_store
    assert type(store).__name__ == "RedisStore"
    assert store._url == "redis://127.0.0.1:6379/7"


def test_a_memory_connection_keeps_the_memory_store() -> None:
    app = App(queue=define_queue_config(default="m", connections={"m": {"driver": "memory"}}))
    assert type(app.queue_store).__name__ == "MemoryStore"


def test_a_store_named_in_config_queue_or_as_cache_default_wins(tmp_path: Path) -> None:
    conns = {"db": {"driver": "database"}}
    cache = define_cache_config(stores={"mem": {"driver": "memory"}, "db": {"driver": "database"}})
    named = App(
        queue=define_queue_config(default="db", connections=conns, store="mem"),
        cache=cache,
        database=_sqlite(tmp_path),
    )
    assert named.queue_store.name == "mem"
    by_default = App(
        queue=define_queue_config(default="db", connections=conns),
        cache=define_cache_config(default="mem", stores={"mem": {"driver": "memory"}}),
        database=_sqlite(tmp_path),
    )
    assert by_default.queue_store.name == "mem"
    # A cache config without a default names no store: the connection's backend decides.
    unnamed = App(
        queue=define_queue_config(default="db", connections=conns),
        cache=cache,
        database=_sqlite(tmp_path),
    )
    assert type(unnamed.queue_store).__name__ == "DatabaseStore"


def test_an_sqs_connection_without_a_store_is_a_start_up_error_saying_what_to_set() -> None:
    app = App(
        queue=define_queue_config(
            default="q",
            connections={"q": {"driver": "sqs", "queue_url": "https://sqs.eu-west-1.x/1/q"}},
        )
    )
    with pytest.raises(ConfigError) as info:
        app.queue_store  # noqa: B018 - the property raises
    message = str(info.value)
    assert 'connection "q" (sqs)' in message
    assert "store=" in message
    assert "config/cache.py" in message

    async def enter() -> None:
        async with app:
            pass

    import asyncio

    with pytest.raises(ConfigError, match="store="):
        asyncio.run(enter())


def test_an_sqs_connection_with_a_database_failed_store_keeps_its_locks_there(
    tmp_path: Path,
) -> None:
    app = App(
        queue=define_queue_config(
            default="q",
            connections={
                "q": {"driver": "sqs", "queue_url": "https://x/1/q", "failed_store": "main"}
            },
        ),
        database=_sqlite(tmp_path),
    )
    store: Any = app.queue_store
    assert type(store).__name__ == "DatabaseStore"
    assert store.db is app.database("main")


def test_a_cloudflare_connection_uses_its_d1_database(tmp_path: Path) -> None:
    app = App(
        queue=define_queue_config(
            default="cf", connections={"cf": {"driver": "cloudflare", "binding": "QUEUE"}}
        ),
        database=define_database_config(
            default="main",
            connections={"main": {"url": "d1://local/haze", "options": {"binding": "DB"}}},
        ),
    )
    store: Any = app.queue_store
    assert type(store).__name__ == "DatabaseStore"
    assert store._db_name == "main"


def test_a_cloudflare_connection_uses_a_kv_store_when_there_is_no_d1() -> None:
    app = App(
        queue=define_queue_config(
            default="cf", connections={"cf": {"driver": "cloudflare", "binding": "QUEUE"}}
        ),
        cache=define_cache_config(stores={"kv": {"driver": "kv", "binding": "KV"}}),
    )
    assert type(app.queue_store).__name__ == "KVStore"


def test_a_cloudflare_connection_without_d1_or_kv_is_a_start_up_error() -> None:
    app = App(
        queue=define_queue_config(
            default="cf", connections={"cf": {"driver": "cloudflare", "binding": "QUEUE"}}
        )
    )
    with pytest.raises(ConfigError) as info:
        app.batch_store  # noqa: B018 - the property raises
    message = str(info.value)
    assert 'connection "cf" (cloudflare)' in message
    assert "d1://" in message
    assert '"driver": "kv"' in message


async def test_an_explicit_memory_store_beside_a_remote_connection_warns_once_for_batches(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = App(
        queue=define_queue_config(default="db", connections={"db": {"driver": "database"}}),
        cache=define_cache_config(default="memory", stores={"memory": {"driver": "memory"}}),
        database=_sqlite(tmp_path),
    )
    caplog.set_level(logging.WARNING, logger="haze")
    async with app:
        await ensure_queue_tables(app)
        await Queue.batch([noop.with_({})]).dispatch()
        await Queue.batch([noop.with_({})]).dispatch()
    warnings = [r.getMessage() for r in caplog.records if "batches" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert '"memory" store' in warnings[0]
    assert 'connection "db"' in warnings[0]
    assert "then/catch/finally" in warnings[0]


# --------------------------------------------------------------------------- D1 size


def d1_app(**queue_options: Any) -> App:
    return App(
        queue=define_queue_config(
            default="d1", connections={"d1": {"driver": "database", **queue_options}}
        ),
        database=define_database_config(
            default="main", connections={"main": {"url": "d1://acct/db", "api_token": "t"}}
        ),
    )


def test_a_database_queue_on_d1_caps_messages_below_d1s_row_limit() -> None:
    from haze.drivers.sql import D1_MAX_MESSAGE_SIZE, D1_ROW_LIMIT

    assert D1_ROW_LIMIT == 2_000_000  # Cloudflare's documented string, BLOB and row limit
    assert d1_app().driver("d1").max_message_size == D1_MAX_MESSAGE_SIZE < D1_ROW_LIMIT
    assert d1_app(max_message_size=100_000).driver("d1").max_message_size == 100_000
    with pytest.raises(ConfigError) as info:
        d1_app(max_message_size=4 * 1024 * 1024).driver("d1")
    message = str(info.value)
    assert "connections.d1.max_message_size" in message
    assert "2,000,000 bytes a row" in message and str(D1_MAX_MESSAGE_SIZE) in message


@pytest.mark.parametrize("where", ["/proc/haze-nowhere/app.db", "{tmp}/a-folder"])
async def test_a_sqlite_file_that_cannot_be_opened_is_one_config_line(
    tmp_path: Path, where: str
) -> None:
    # /proc refuses a new folder; an existing folder is not a database file. Either way
    # it will not open by waiting (as a locked file would): a config error naming both.
    (tmp_path / "a-folder").mkdir()
    path = where.format(tmp=tmp_path)
    app = App(
        queue=define_queue_config(default="db", connections={"db": {"driver": "database"}}),
        database=define_database_config(
            default="main", connections={"main": {"url": f"sqlite:///{path}"}}
        ),
    )
    async with app:
        with pytest.raises(ConfigError) as info:
            await noop.dispatch({})
    text = str(info.value)
    assert "\n" not in text and "'main'" in text and path in text, text
    assert "cannot open" in text, text
