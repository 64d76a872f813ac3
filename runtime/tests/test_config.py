"""Config files: defaults, env(), and errors that name the file and the key."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from haze import App, ConfigError, HazeError, define_queue_config, env

pytestmark = pytest.mark.usefixtures("isolated_imports")


def write(root: Path, rel: str, body: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(body))
    return path


def queue_config(root: Path, body: str) -> Path:
    return write(root, "config/queue.py", "from haze import *\n" + textwrap.dedent(body))


def config_error(root: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        App(root=root)
    assert isinstance(info.value, HazeError)
    return info.value


def test_no_config_file_means_one_memory_connection(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()  # a root needs config/ or app/ to be an app at all
    app = App(root=tmp_path)
    assert app.queue_config.default == "memory"
    assert app.queue_config.connections == {"memory": {"driver": "memory"}}
    assert type(app.driver()).__name__ == "MemoryDriver"
    assert app.queue_config.batches_ttl == 7 * 86400


def test_no_root_and_no_config_means_one_memory_connection() -> None:
    app = App()
    assert list(app.queue_config.connections) == ["memory"]
    assert app.driver().concurrency == 1


def test_config_file_is_read(tmp_path: Path) -> None:
    path = queue_config(
        tmp_path,
        """
        config = define_queue_config(
            default="sync",
            connections={
                "memory": {"driver": "memory", "concurrency": 2, "queues": ["high", "default"]},
                "sync": {"driver": "sync"},
            },
            batches={"ttl": "1d"},
        )
        """,
    )
    app = App(root=tmp_path)
    qc = app.queue_config
    assert qc.default == "sync"
    assert qc.source == str(path)
    assert qc.connections["memory"] == {
        "driver": "memory",
        "concurrency": 2,
        "queues": ["high", "default"],
    }
    assert qc.batches_ttl == 86400.0
    assert app.driver("memory").concurrency == 2
    assert app.driver("memory").priority == ["high", "default"]
    assert app.driver().inline is True


def test_config_object_passed_in_wins_over_the_file(tmp_path: Path) -> None:
    queue_config(
        tmp_path,
        'config = define_queue_config(default="sync", connections={"sync": {"driver": "sync"}})\n',
    )
    app = App(root=tmp_path, queue=define_queue_config(connections={"mem": {"driver": "memory"}}))
    assert app.queue_config.default == "mem"


def test_default_is_the_first_connection_when_omitted() -> None:
    app = App(
        queue=define_queue_config(connections={"s": {"driver": "sync"}, "m": {"driver": "memory"}})
    )
    assert app.queue_config.default == "s"


def test_unknown_driver_names_file_and_key(tmp_path: Path) -> None:
    path = queue_config(
        tmp_path, 'config = define_queue_config(connections={"jobs": {"driver": "rabbit"}})\n'
    )
    err = config_error(tmp_path)
    assert str(path) in str(err)
    assert "connections.jobs.driver" in str(err)
    assert "rabbit" in str(err)
    assert err.source == str(path)
    assert err.key == "connections.jobs.driver"


def test_missing_driver_key_names_file_and_key(tmp_path: Path) -> None:
    path = queue_config(
        tmp_path, 'config = define_queue_config(connections={"jobs": {"concurrency": 2}})\n'
    )
    err = config_error(tmp_path)
    assert str(path) in str(err)
    assert "connections.jobs.driver" in str(err)
    assert "required" in str(err)


@pytest.mark.parametrize(
    ("body", "key"),
    [
        (
            'connections={"m": {"driver": "memory", "concurrency": "2"}}',
            "connections.m.concurrency",
        ),
        ('connections={"m": {"driver": "memory", "concurrency": 0}}', "connections.m.concurrency"),
        ('connections={"m": {"driver": "memory", "queues": 5}}', "connections.m.queues"),
        ('connections={"m": "memory"}', "connections.m"),
        ('connections=["memory"]', "connections"),
        ('connections={"m": {"driver": "memory", "colour": "red"}}', "connections.m.colour"),
        ('connections={"m": {"driver": "memory"}}, default="other"', "default"),
        ('connections={"m": {"driver": "memory"}}, default=3', "default"),
        ('connections={"m": {"driver": "memory"}}, middleware=["not callable"]', "middleware[0]"),
        (
            'connections={"m": {"driver": "memory"}}, batches={"store": "memory", "size": 3}',
            "batches.size",
        ),
        ('connections={"m": {"driver": "memory"}}, colour="red"', "queue.colour"),
    ],
)
def test_wrong_typed_or_unknown_keys_name_file_and_key(tmp_path: Path, body: str, key: str) -> None:
    path = queue_config(tmp_path, f"config = define_queue_config({body})\n")
    err = config_error(tmp_path)
    assert str(path) in str(err)
    assert f"{key}:" in str(err)


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ('batches={"ttl": "a week"}', "batches.ttl"),
        ('batches={"ttl": 0}', "batches.ttl"),
        (
            'connections={"db": {"driver": "database", "retry_after": "soon"}}',
            "connections.db.retry_after",
        ),
        ('connections={"db": {"driver": "database", "sleep": -1}}', "connections.db.sleep"),
    ],
)
def test_bad_durations_name_file_and_key(tmp_path: Path, body: str, key: str) -> None:
    path = queue_config(tmp_path, f"config = define_queue_config({body})\n")
    err = config_error(tmp_path)
    assert str(path) in str(err)
    assert f"{key}:" in str(err)


def test_unknown_store_names_file_and_key(tmp_path: Path) -> None:
    path = queue_config(tmp_path, 'config = define_queue_config(store="nope")\n')
    err = config_error(tmp_path)
    assert str(path) in str(err)
    assert "store:" in str(err)
    assert "'nope'" in str(err)


def test_unknown_batches_store_names_key(tmp_path: Path) -> None:
    path = queue_config(tmp_path, 'config = define_queue_config(batches={"store": "nope"})\n')
    err = config_error(tmp_path)
    assert str(path) in str(err)
    assert "batches.store:" in str(err)


def test_unknown_cache_store_driver_names_cache_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "config/cache.py",
        """
        from haze import define_cache_config
        config = define_cache_config(stores={"memory": {"driver": "memcached"}})
        """,
    )
    err = config_error(tmp_path)
    assert str(path) in str(err)
    assert "stores.memory.driver:" in str(err)


def test_store_named_in_queue_config_must_exist_in_cache_config(tmp_path: Path) -> None:
    write(
        tmp_path,
        "config/cache.py",
        """
        from haze import define_cache_config
        config = define_cache_config(
            stores={"memory": {"driver": "memory"}, "other": {"driver": "memory"}}
        )
        """,
    )
    queue_config(tmp_path, 'config = define_queue_config(store="other")\n')
    app = App(root=tmp_path)
    assert app.queue_store is app.store("other")


def test_config_file_without_config_variable(tmp_path: Path) -> None:
    path = write(tmp_path, "config/queue.py", "QUEUE = 1\n")
    err = config_error(tmp_path)
    assert str(path) in str(err)
    assert "config" in str(err)


def test_config_file_with_the_wrong_helper(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "config/queue.py",
        "from haze import define_cache_config\nconfig = define_cache_config()\n",
    )
    err = config_error(tmp_path)
    assert str(path) in str(err)
    assert "define_queue_config" in str(err)


def test_config_file_that_raises_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "config/queue.py", "raise RuntimeError('boom')\n")
    err = config_error(tmp_path)
    assert str(path) in str(err)
    assert "boom" in str(err)


def test_inline_config_error_names_where_it_was_defined() -> None:
    spec = define_queue_config(connections={"m": {"driver": "nope"}})
    with pytest.raises(ConfigError, match=r"test_config\.py:\d+: connections\.m\.driver:"):
        App(queue=spec)


def test_a_queue_connection_name_has_at_most_64_characters() -> None:
    # Failed jobs record the connection's name; no store may have to cut it.
    App(queue=define_queue_config(default="c" * 64, connections={"c" * 64: {"driver": "memory"}}))
    name = "c" * 200
    spec = define_queue_config(default=name, connections={name: {"driver": "memory"}})
    with pytest.raises(ConfigError, match="1 to 64 characters, got 200") as info:
        App(queue=spec)
    assert "\n" not in str(info.value)


def test_root_must_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        App(root=tmp_path / "missing")


def test_unknown_connection_name_at_use() -> None:
    app = App(queue=define_queue_config(connections={"m": {"driver": "memory"}}))
    with pytest.raises(ConfigError, match="'redis'"):
        app.driver("redis")


def test_env_reads_and_casts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HAZE_TEST_UNSET", raising=False)
    assert env("HAZE_TEST_UNSET") is None
    assert env("HAZE_TEST_UNSET", "memory") == "memory"
    monkeypatch.setenv("HAZE_TEST_STR", "redis")
    assert env("HAZE_TEST_STR", "memory") == "redis"
    monkeypatch.setenv("HAZE_TEST_INT", "5")
    assert env("HAZE_TEST_INT", 1) == 5
    monkeypatch.setenv("HAZE_TEST_BOOL", "yes")
    assert env("HAZE_TEST_BOOL", False) is True
    monkeypatch.setenv("HAZE_TEST_FLOAT", "1.5")
    assert env("HAZE_TEST_FLOAT", 0.0) == 1.5
    monkeypatch.setenv("HAZE_TEST_INT", "five")
    with pytest.raises(ConfigError, match="HAZE_TEST_INT"):
        env("HAZE_TEST_INT", 1)


def test_env_in_a_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    queue_config(
        tmp_path,
        """
        config = define_queue_config(
            default=env("HAZE_TEST_QUEUE_CONNECTION", "memory"),
            connections={"memory": {"driver": "memory"}, "sync": {"driver": "sync"}},
        )
        """,
    )
    monkeypatch.setenv("HAZE_TEST_QUEUE_CONNECTION", "sync")
    assert App(root=tmp_path).queue_config.default == "sync"


def test_redis_connection_socket_settings_are_validated() -> None:
    from haze import define_redis_config

    ok = App(
        redis=define_redis_config(
            default="main",
            connections={"main": {"url": "redis://h/0", "socket_timeout": "30s"}},
        )
    )
    assert ok.redis_config.connections["main"]["socket_timeout"] == 30.0
    for key, value in (("socket_timeout", "soon"), ("socket_keepalive", "yes please")):
        with pytest.raises(ConfigError, match=f"connections.main.{key}"):
            App(redis=define_redis_config(default="main", connections={"main": {key: value}}))


def test_redis_clients_detect_dead_peers_and_take_the_configured_timeouts() -> None:
    pytest.importorskip("redis")
    from haze import define_redis_config
    from haze.stores.redis import new_client, redis_settings

    app = App(
        redis=define_redis_config(
            default="main",
            connections={"main": {"url": "redis://h/0", "socket_timeout": 45}},
        )
    )
    url, kwargs, _ = redis_settings(app, None)
    kw = new_client(url, kwargs).connection_pool.connection_kwargs
    assert kw["socket_timeout"] == 45.0  # applied with a url too
    assert kw["socket_keepalive"] is True
    assert kw["socket_keepalive_options"]  # a dead peer is noticed in about a minute
    assert kw["health_check_interval"] == 30.0


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("busy_timeout", "30 seconds", "connections.main.busy_timeout: expected an integer"),
        ("busy_timeout", -1, "connections.main.busy_timeout: must be >= 0"),
        ("pool_size", "ten", "connections.main.pool_size: expected an integer"),
        ("pool_size", 0, "connections.main.pool_size: must be >= 1"),
        ("pool_size", 10.5, "connections.main.pool_size: expected an integer"),
        ("pool_size", True, "connections.main.pool_size: expected an integer"),
        ("options", "sslmode=require", "connections.main.options: expected a dict"),
    ],
)
def test_a_bad_database_option_is_refused_when_the_app_starts(
    option: str, value: object, expected: str
) -> None:
    """Not a traceback from the driver on the first connect (busy_timeout '30 seconds'
    was an int() ValueError inside queue:work), nor a pool of 0 accepted in silence."""
    from haze import define_database_config

    with pytest.raises(ConfigError) as info:
        App(
            database=define_database_config(
                default="main",
                connections={"main": {"url": "sqlite:///x.db", option: value}},
            )
        )
    assert expected in str(info.value)


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("QUEUE_CONNECTION", "", "default: expected a non-empty string, got ''"),
        ("DATABASE_URL", "", "connections.main.url: expected a non-empty string, got ''"),
        ("DATABASE_URL", "postgress://h/db", "unsupported URL scheme 'postgress'"),
    ],
)
def test_a_bad_value_from_the_environment_names_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, expected: str
) -> None:
    from haze import define_database_config

    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as info:
        App(
            queue=define_queue_config(
                default=env("QUEUE_CONNECTION", "memory"),
                connections={"memory": {"driver": "memory"}},
            ),
            database=define_database_config(
                default="main", connections={"main": {"url": env("DATABASE_URL", "sqlite:///x.db")}}
            ),
        )
    message = str(info.value)
    assert expected in message, message
    assert f"(from the environment variable {variable})" in message, message


async def test_a_mistyped_database_name_is_reported_where_it_was_written() -> None:
    """``"connection": "mian"`` in config/queue.py (and in config/cache.py) is that file's
    mistake, not config/database.py's."""
    from haze import define_cache_config, define_database_config

    queue = define_queue_config(
        default="database",
        connections={"database": {"driver": "database", "connection": "mian"}},
    )
    cache = define_cache_config(
        default="db", stores={"db": {"driver": "database", "connection": "mian"}}
    )
    database = define_database_config(
        default="main", connections={"main": {"url": "sqlite:///x.db"}}
    )
    with pytest.raises(ConfigError) as info:
        App(queue=queue, database=database).driver("database")
    by_queue = str(info.value)
    assert by_queue.startswith(f"{queue.source}: connections.database.connection: 'mian'")
    with pytest.raises(ConfigError) as info:
        await App(database=database, cache=cache).store("db").get("k")
    by_cache = str(info.value)
    assert by_cache.startswith(f"{cache.source}: stores.db.connection: 'mian'"), by_cache
    for message in (by_queue, by_cache):
        assert "(did you mean 'main'?)" in message, message


def test_a_redis_store_without_its_connection_is_reported_in_config_cache() -> None:
    from haze import define_cache_config

    cache = define_cache_config(
        default="r", stores={"r": {"driver": "redis", "connection": "main"}}
    )
    with pytest.raises(ConfigError) as info:
        App(cache=cache).store("r")
    message = str(info.value)
    assert message.startswith(f"{cache.source}: stores.r.connection: 'main'"), message
