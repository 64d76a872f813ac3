"""The CLI tells a new user what is wrong instead of working something invisible: the app
root found like git finds its repository, no worker on a memory queue, the queues that
registered jobs use but the worker does not consume, and missing queue tables."""

from __future__ import annotations

import os
import re
import textwrap
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from haze.cli import get_cli

pytestmark = pytest.mark.usefixtures("isolated_imports")

MISSING = 'the queue tables are missing on database "main": run '


def haze(*args: str, root: Path | None = None) -> Result:
    argv = ["--root", str(root), *args] if root is not None else list(args)
    return CliRunner().invoke(get_cli(), argv)


def write(root: Path, rel: str, body: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(body))


def sqlite_app(root: Path, uid: str, connection: str = "") -> Path:
    """An app on a SQLite ``database`` connection ("db"), tables not created."""
    write(
        root,
        "config/database.py",
        f"""\
        from haze import define_database_config
        config = define_database_config(default="main",
            connections={{"main": {{"url": "sqlite:///{root}/app.db"}}}})
        """,
    )
    write(
        root,
        "config/queue.py",
        f"""\
        from haze import define_queue_config
        config = define_queue_config(default="db", connections={{
            "db": {{"driver": "database", "sleep": "50ms", "max_sleep": "100ms"{connection}}},
            "mem": {{"driver": "memory"}}}})
        """,
    )
    return root


def jobs_on(root: Path, uid: str, queue: str, *names: str, fail: bool = False) -> None:
    body = "from haze import define_job\n"
    for name in names:
        body += textwrap.dedent(
            f"""
            @define_job(name="{name}", queue="{queue}", tries=1)
            async def {name}(payload: dict) -> None:
                {"raise ValueError('boom')" if fail else "pass"}
            """
        )
    write(root, f"app/job/jobs_{queue}_{uid}.py", body)


@pytest.fixture
def uid() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture
def no_root_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HAZE_APP_ROOT", raising=False)


# --------------------------------------------------------------------------- --root


@pytest.mark.usefixtures("no_root_env")
def test_root_is_found_above_the_working_directory_like_git(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(
        tmp_path,
        "config/queue.py",
        """\
        from haze import define_queue_config
        config = define_queue_config(default="found_it", connections={"found_it": {"driver": "memory"}})
        """,
    )
    deep = tmp_path / "app" / "job" / "nested"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    result = haze("queue:size")
    assert result.exit_code == 0, result.output
    assert 'Queues on "found_it"' in result.output


@pytest.mark.usefixtures("no_root_env")
def test_without_an_app_above_the_working_directory_it_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = haze("queue:size")
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"Error: {tmp_path.resolve()}: neither config/ nor app/ is here, so this is not a haze "
        "app; point root at the folder that holds them (from a file in that folder: "
        "App(root=__file__))"
    ]


# --------------------------------------------------------------------------- queue:work


def test_work_refuses_a_memory_connection(tmp_path: Path, uid: str) -> None:
    root = sqlite_app(tmp_path, uid)
    result = haze("queue:work", "--connection", "mem", root=root)
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        'Error: connection "mem" is a memory queue: it lives inside the process that '
        "dispatches to it, so a worker in another process would never see its jobs. Point "
        "config/queue.py at a database or redis connection (memory jobs run inside your app, "
        "under async with App(...))"
    ]


def test_work_names_the_queues_registered_jobs_use_that_it_does_not_consume(
    tmp_path: Path, uid: str
) -> None:
    root = sqlite_app(tmp_path, uid)
    assert haze("make:queue-tables", root=root).exit_code == 0
    assert haze("db:migrate", root=root).exit_code == 0
    emails = f"emails_{uid}"
    jobs_on(root, uid, emails, f"send_invoice_{uid}", f"sync_feed_{uid}")
    jobs_on(root, uid, "default", f"plain_{uid}")
    result = haze("queue:work", "--stop-when-empty", root=root)
    assert result.exit_code == 0, result.output
    line = re.search(
        rf'jobs send_invoice_{uid}, sync_feed_{uid} use queue "{emails}", which this worker '
        r"does not consume: add --queue (\S+)",
        result.output,
    )
    assert line is not None, result.output
    suggested = line.group(1).split(",")
    assert emails in suggested
    assert suggested[-1] == "default"
    assert f"plain_{uid}" not in result.output  # its queue is consumed
    # Consuming it: no word about it.
    result = haze("queue:work", "--stop-when-empty", "--queue", f"default,{emails}", root=root)
    assert result.exit_code == 0, result.output
    assert f'use queue "{emails}"' not in result.output


def test_work_on_sqs_without_a_lock_store_stops_at_start_saying_what_to_set(
    tmp_path: Path,
) -> None:
    write(
        tmp_path,
        "config/queue.py",
        """\
        from haze import define_queue_config
        config = define_queue_config(default="q", connections={"q": {
            "driver": "sqs", "queue_url": "http://127.0.0.1:9/000000000000/{queue}"}})
        """,
    )
    result = haze("queue:work", root=tmp_path)
    assert result.exit_code == 1
    [line] = result.output.strip().splitlines()
    assert line.startswith(f"Error: {tmp_path / 'config' / 'queue.py'}")
    assert 'store: connection "q" (sqs) has no store for unique locks and batches' in line
    assert "set store= in config/queue.py" in line


# --------------------------------------------------------------------------- admin commands


def test_size_monitor_and_flush_cover_the_queues_registered_jobs_name(
    tmp_path: Path, uid: str
) -> None:
    root = sqlite_app(tmp_path, uid)
    assert haze("make:queue-tables", root=root).exit_code == 0
    assert haze("db:migrate", root=root).exit_code == 0
    a, b = f"qa_{uid}", f"qb_{uid}"
    jobs_on(root, uid, a, f"fail_a_{uid}", fail=True)
    jobs_on(root, uid, b, f"fail_b_{uid}", fail=True)
    write(
        root,
        "send.py",
        f"""\
        import asyncio
        from haze import App, Queue

        async def main() -> None:
            async with App(root=__file__):
                for name in ("fail_a_{uid}", "fail_b_{uid}", "fail_b_{uid}"):
                    await Queue.dispatch(name, {{}})

        asyncio.run(main())
        """,
    )
    import runpy

    runpy.run_path(str(root / "send.py"))
    size = haze("queue:size", root=root)
    assert size.exit_code == 0, size.output
    assert re.search(rf"{a}\W+1\b", size.output), size.output
    assert re.search(rf"{b}\W+2\b", size.output), size.output
    monitor = haze("queue:monitor", root=root)
    assert monitor.exit_code == 0, monitor.output
    assert re.search(rf"db\W+{b}\W+2\W+OK", monitor.output), monitor.output
    only = haze("queue:monitor", "--queue", a, "--max", "1", root=root)
    assert only.exit_code == 0, only.output
    assert re.search(rf"db\W+{a}\W+1\W+ALERT", only.output), only.output
    assert b not in only.output
    assert haze("queue:work", "--stop-when-empty", "--queue", f"{a},{b}", root=root).exit_code == 0
    flushed = haze("queue:flush", "--queue", b, root=root)
    assert flushed.exit_code == 0, flushed.output
    assert f'Deleted 2 failed job(s) from queue "{b}" on connection "db".' in flushed.output
    failed = haze("queue:failed", root=root)
    assert f"fail_a_{uid}" in failed.output
    assert f"fail_b_{uid}" not in failed.output


# --------------------------------------------------------------------------- missing tables

COMMANDS = [
    ["queue:work", "--stop-when-empty"],
    ["queue:size"],
    ["queue:monitor"],
    ["queue:monitor", "db:default"],
    ["queue:failed"],
    ["queue:failed", "abc"],
    ["queue:retry", "all"],
    ["queue:retry", "abc"],
    ["queue:forget", "abc"],
    ["queue:flush"],
    ["queue:flush", "--queue", "default"],
    ["queue:clear"],
    ["queue:prune-failed"],
    ["queue:retry-batch", "abc"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a))
def test_every_queue_command_says_the_tables_are_missing_in_one_line(
    tmp_path: Path, uid: str, args: list[str]
) -> None:
    root = sqlite_app(tmp_path, uid)
    result = haze(*args, root=root)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1] == (
        f"Error: {MISSING}haze make:queue-tables, then haze db:migrate"
    )
    assert "no such table" not in result.output


def test_once_the_migration_is_written_it_says_to_run_db_migrate(tmp_path: Path, uid: str) -> None:
    root = sqlite_app(tmp_path, uid)
    assert haze("make:queue-tables", root=root).exit_code == 0
    result = haze("queue:work", root=root)
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines()[-1] == f"Error: {MISSING}haze db:migrate"


def _redis_up() -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", 6379), 0.5):
            return True
    except OSError:
        return False


def _require_redis() -> None:
    """Skip without Redis; under CI=true fail (as tests/services.py does for tests/)."""
    if _redis_up():
        return
    message = (
        "no Redis at 127.0.0.1:6379: start it with redis-server --port 6379 --save '' "
        "--daemonize yes, or scripts/test (starts it when installed)"
    )
    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(f"{message}. CI=true: the tests need every server", pytrace=False)
    pytest.skip(message)


def test_failed_and_retry_see_the_failed_sets_of_queues_only_jobs_name_on_redis(
    tmp_path: Path, uid: str
) -> None:
    _require_redis()
    import redis

    prefix = f"hzmis{uid}"
    write(
        tmp_path,
        "config/queue.py",
        f"""\
        from haze import define_queue_config
        config = define_queue_config(default="r", connections={{"r": {{
            "driver": "redis", "url": "redis://127.0.0.1:6379/0", "prefix": "{prefix}"}}}})
        """,
    )
    mail = f"mail_{uid}"
    jobs_on(tmp_path, uid, mail, f"redis_fails_{uid}", fail=True)
    write(
        tmp_path,
        "send.py",
        f"""\
        import asyncio
        from haze import App, Queue

        async def main() -> None:
            async with App(root=__file__):
                await Queue.dispatch("redis_fails_{uid}", {{}})

        asyncio.run(main())
        """,
    )
    import runpy

    try:
        runpy.run_path(str(tmp_path / "send.py"))
        worked = haze("queue:work", "--queue", mail, "--stop-when-empty", root=tmp_path)
        assert worked.exit_code == 0, worked.output
        failed = haze("queue:failed", root=tmp_path)
        assert failed.exit_code == 0, failed.output
        assert f"redis_fails_{uid}" in failed.output
        retried = haze("queue:retry", "all", root=tmp_path)
        assert retried.exit_code == 0, retried.output
        assert 'Retried 1 failed job(s) on connection "r".' in retried.output
        size = haze("queue:size", root=tmp_path)
        assert re.search(rf"{mail}\W+1\b", size.output), size.output
    finally:
        client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
        keys = list(client.scan_iter(f"{prefix}:*"))
        if keys:
            client.delete(*keys)


# --------------------------------------------------------------------------- app keys


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("APP_KEY", "base64:short"),  # not base64 (bad padding)
        ("APP_KEY", "base64:c2hvcnQ="),  # base64 of 5 bytes, not 32
        ("APP_KEY", "abc"),  # a passphrase too short to be a key
        ("APP_PREVIOUS_KEYS", "base64:AAAA"),
    ],
)
def test_an_unusable_app_key_is_one_config_line_naming_the_variable(
    tmp_path: Path, uid: str, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    from haze.crypto import generate_key

    sqlite_app(tmp_path, uid)
    write(
        tmp_path,
        f"app/job/secret_{uid}.py",
        f"""\
        from haze import define_job
        @define_job(name="secret_{uid}", encrypted=True)
        async def secret_{uid}(payload: dict) -> None:
            pass
        """,
    )
    monkeypatch.setenv("APP_KEY", generate_key())
    monkeypatch.setenv(variable, value)
    result = haze("queue:failed", root=tmp_path)
    assert result.exit_code == 1, result.output  # as every other config error
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1, result.output
    assert variable in lines[0] and "Traceback" not in result.output
    assert value not in lines[0]  # a key is a secret: never shown


def test_db_migrate_over_an_apps_own_jobs_table_says_to_rename_the_queue_tables(
    tmp_path: Path, uid: str
) -> None:
    """The app already has a ``jobs`` table of its own: the migration keeps it (IF NOT
    EXISTS) and then fails on its index. One line naming the option to set, not the
    database's "no such column" (PostgreSQL's spans three lines)."""
    import sqlite3

    root = sqlite_app(tmp_path, uid)
    with sqlite3.connect(root / "app.db") as c:
        c.execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY, title TEXT)")
    assert haze("make:queue-tables", root=root).exit_code == 0
    result = haze("db:migrate", root=root)
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: db:migrate stopped: "), lines
    assert 'a table of the queue\'s name exists with other columns: set "table" and' in lines[0]
