"""``haze queue:*`` in-process through CliRunner, on an app whose queues we fill.

The CLI normally builds ``App(root=...)``; here ``State.app`` hands it a prepared app so
the memory driver already holds waiting and failed jobs. ``queue:work`` refuses memory
connections, so its tests run on a SQLite ``database`` connection (``db_app``).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from haze import (
    App,
    JobDefinition,
    Queue,
    define_database_config,
    define_job,
    define_queue_config,
)
from haze._base.ids import short_id
from haze.cli import MISSING_DEPENDENCIES, get_cli, main
from haze.cli._core import State
from haze.cli.queue import MEMORY_REFUSAL, SYNC_REFUSAL, exception_summary

ran: list[Any] = []
boom = {"fail": True}  # retry tests turn it off so the retried jobs succeed


@define_job(name="cli_test_ok")
async def cli_ok(payload: dict[str, Any]) -> None:
    ran.append(payload)


@define_job(name="cli_test_boom")
async def cli_boom(payload: dict[str, Any]) -> None:
    if boom["fail"]:
        raise ValueError(f"boom {payload['n']}\nsecond line")
    ran.append(payload)


def make_app() -> App:
    return App(
        queue=define_queue_config(
            default="memory",
            connections={"memory": {"driver": "memory"}, "sync": {"driver": "sync"}},
        )
    )


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> App:
    a = make_app()
    monkeypatch.setattr(State, "app", lambda self: a)
    ran.clear()
    boom["fail"] = True
    return a


@pytest.fixture
def db_app(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> App:
    """The default connection "db" on a SQLite file with its tables (plus memory, sync)."""
    from haze.connectors.migrations import ensure_queue_tables

    a = App(
        queue=define_queue_config(
            default="db",
            connections={
                "db": {"driver": "database", "sleep": "10ms", "max_sleep": "50ms"},
                "memory": {"driver": "memory"},
                "sync": {"driver": "sync"},
            },
        ),
        database=define_database_config(
            default="main", connections={"main": {"url": f"sqlite:///{tmp_path}/q.db"}}
        ),
    )

    async def tables() -> None:
        await ensure_queue_tables(a)
        await a.stop()

    asyncio.run(tables())
    monkeypatch.setattr(State, "app", lambda self: a)
    ran.clear()
    boom["fail"] = True
    return a


def haze(root: Path, *args: str) -> Result:
    return CliRunner().invoke(get_cli(), ["--root", str(root), *args])


async def enqueue(app: App, job: JobDefinition[Any], payload: Any, queue: str = "default") -> str:
    """Queue a message without starting the app's in-process consumer."""
    pending = job.with_(payload).on_queue(queue)
    connection, q = app.manager.resolve(pending)
    message = app.manager.build(pending, connection, q)
    driver = app.driver(connection)
    await driver.enqueue(app.manager.encode(message, driver, job), message, 0.0)
    return message.id


def fail_jobs(app: App, n: int, queue: str = "default") -> list[str]:
    async def go() -> list[str]:
        async with app:
            ids = [(await cli_boom.dispatch({"n": i}, queue=queue)) for i in range(n)]
            await Queue.idle()
        return ids

    return asyncio.run(go())


def failed_ids(app: App, connection: str = "memory") -> list[str]:
    return [j.id for j in asyncio.run(app.manager.failed(connection))]


# --------------------------------------------------------------------------- queue:work


def test_work_runs_waiting_jobs_and_prints_a_line_per_job(db_app: App, tmp_path: Path) -> None:
    app = db_app

    async def fill() -> list[str]:
        return [
            await enqueue(app, cli_ok, {"n": 1}),
            await enqueue(app, cli_boom, {"n": 2}, queue="emails"),
        ]

    ok_id, boom_id = asyncio.run(fill())
    result = haze(tmp_path, "queue:work", "--stop-when-empty", "--queue", "default,emails")
    assert result.exit_code == 0, result.output
    assert ran == [{"n": 1}]
    lines = result.output.splitlines()
    assert any("DONE" in ln and "cli_test_ok" in ln and short_id(ok_id) in ln for ln in lines)
    assert any("FAILED" in ln and "cli_test_boom" in ln and short_id(boom_id) in ln for ln in lines)
    assert "Worker stopped after 2 job(s)." in result.output
    assert failed_ids(app, "db") == [boom_id]


def test_work_honours_queue_priority_and_max_jobs(db_app: App, tmp_path: Path) -> None:
    app = db_app

    async def fill() -> None:
        await enqueue(app, cli_ok, {"q": "low"}, queue="low")
        await enqueue(app, cli_ok, {"q": "high"}, queue="high")

    asyncio.run(fill())
    result = haze(tmp_path, "queue:work", "--queue", "high,low", "--max-jobs", "1")
    assert result.exit_code == 0, result.output
    assert ran == [{"q": "high"}]
    result = haze(tmp_path, "queue:work", "--queue", "high", "--once")
    assert result.exit_code == 0, result.output
    assert ran == [{"q": "high"}]  # "low" was not among the queues


def test_work_without_jobs_stops_when_empty(db_app: App, tmp_path: Path) -> None:
    result = haze(tmp_path, "queue:work", "--stop-when-empty", "--concurrency", "3")
    assert result.exit_code == 0, result.output
    assert "concurrency 3" in result.output


def test_work_max_time(db_app: App, tmp_path: Path) -> None:
    result = haze(tmp_path, "queue:work", "--max-time", "50ms", "--sleep", "0.01")
    assert result.exit_code == 0, result.output


def test_work_refuses_the_sync_connection(app: App, tmp_path: Path) -> None:
    result = haze(tmp_path, "queue:work", "--connection", "sync")
    assert result.exit_code == 1
    assert SYNC_REFUSAL in result.output
    assert "Traceback" not in result.output


def test_work_refuses_a_memory_connection(app: App, tmp_path: Path) -> None:
    result = haze(tmp_path, "queue:work", "--connection", "memory")
    assert result.exit_code == 1
    assert f'connection "memory" {MEMORY_REFUSAL}' in result.output
    assert "Traceback" not in result.output


def test_work_unknown_connection(app: App, tmp_path: Path) -> None:
    result = haze(tmp_path, "queue:work", "--connection", "nope")
    assert result.exit_code == 1
    assert "unknown queue connection 'nope'" in result.output


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--sleep", "soon"], "--sleep"),
        (["--max-time", "-1"], "--max-time"),
        (["--max-time", "0"], "--max-time"),
        (["--concurrency", "0"], "--concurrency"),
        (["--max-jobs", "x"], "--max-jobs"),
        (["--queue", ","], "--queue"),
    ],
)
def test_work_bad_arguments_name_the_flag(
    app: App, tmp_path: Path, args: list[str], flag: str
) -> None:
    result = haze(tmp_path, "queue:work", *args)
    assert result.exit_code == 2
    assert flag in result.output
    assert "Traceback" not in result.output


# --------------------------------------------------------------------------- failed jobs


def test_failed_lists_failed_jobs(app: App, tmp_path: Path) -> None:
    ids = fail_jobs(app, 2)
    result = haze(tmp_path, "queue:failed")
    assert result.exit_code == 0, result.output
    for job_id in ids:
        assert short_id(job_id) in result.output
    assert "cli_test_boom" in result.output
    assert "ValueError: boom 0" in result.output
    assert "second line" not in result.output


@define_job(name="cli_test_secret", encrypted=True, tries=1)
async def cli_secret(payload: dict[str, Any]) -> None:
    raise ValueError(f"card {payload['card']} declined\nsecond line")


def test_failed_decrypts_an_encrypted_job_with_the_key_and_says_encrypted_without(
    app: App, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from haze._base.crypto import generate_key

    monkeypatch.setenv("APP_KEY", generate_key())

    async def go() -> str:
        async with app:
            job_id = await cli_secret.dispatch({"card": "4242-SECRET"})
            await Queue.idle()
        return job_id

    job_id = asyncio.run(go())
    listed = haze(tmp_path, "queue:failed")
    assert listed.exit_code == 0, listed.output
    assert "ValueError: card 4242-SECRET declined" in listed.output
    shown = haze(tmp_path, "queue:failed", job_id).output
    assert '"card": "4242-SECRET"' in shown and "Payload null" not in " ".join(shown.split())
    assert "card 4242-SECRET declined" in shown and "Traceback" in shown
    monkeypatch.delenv("APP_KEY")
    listed = haze(tmp_path, "queue:failed")
    assert "4242-SECRET" not in listed.output and "ValueError (encrypted)" in listed.output
    shown = haze(tmp_path, "queue:failed", job_id).output
    assert "4242-SECRET" not in shown and "null" not in shown
    assert "set APP_KEY to show it" in " ".join(shown.split())


def test_failed_when_there_are_none(app: App, tmp_path: Path) -> None:
    result = haze(tmp_path, "queue:failed", "--connection", "sync")
    assert result.exit_code == 0, result.output
    assert 'No failed jobs on connection "sync".' in result.output


def test_retry_all(app: App, tmp_path: Path) -> None:
    fail_jobs(app, 3)
    boom["fail"] = False
    result = haze(tmp_path, "queue:retry", "all")
    assert result.exit_code == 0, result.output
    assert "Retried 3 failed job(s)" in result.output
    assert failed_ids(app) == []


def test_retry_all_filters_by_queue(app: App, tmp_path: Path) -> None:
    fail_jobs(app, 1, queue="emails")
    kept = fail_jobs(app, 1)
    boom["fail"] = False
    result = haze(tmp_path, "queue:retry", "all", "--queue", "emails")
    assert result.exit_code == 0, result.output
    assert "Retried 1 failed job(s)" in result.output
    assert failed_ids(app) == kept


def test_retry_ids_reports_unknown_ones(app: App, tmp_path: Path) -> None:
    first, second = fail_jobs(app, 2)
    boom["fail"] = False
    result = haze(tmp_path, "queue:retry", first, "nope")
    assert result.exit_code == 1
    assert 'no failed job with id "nope"' in result.output
    assert "Retried 1 failed job(s)" in result.output
    assert failed_ids(app) == [second]


def test_retry_rejects_all_mixed_with_ids(app: App, tmp_path: Path) -> None:
    result = haze(tmp_path, "queue:retry", "all", "abc")
    assert result.exit_code == 2


def test_forget(app: App, tmp_path: Path) -> None:
    first, second = fail_jobs(app, 2)
    result = haze(tmp_path, "queue:forget", first)
    assert result.exit_code == 0, result.output
    assert failed_ids(app) == [second]
    result = haze(tmp_path, "queue:forget", first)
    assert result.exit_code == 1
    assert f'no failed job with id "{first}"' in result.output


def test_flush(app: App, tmp_path: Path) -> None:
    fail_jobs(app, 2)
    result = haze(tmp_path, "queue:flush", "--hours", "1")
    assert result.exit_code == 0, result.output
    assert "Deleted 0 failed job(s)" in result.output
    result = haze(tmp_path, "queue:flush")
    assert result.exit_code == 0, result.output
    assert "Deleted 2 failed job(s)" in result.output
    assert failed_ids(app) == []


# --------------------------------------------------------------------------- waiting jobs


def test_clear_and_size(app: App, tmp_path: Path) -> None:
    async def fill() -> None:
        for i in range(3):
            await enqueue(app, cli_ok, {"i": i})
        await enqueue(app, cli_ok, {"i": 9}, queue="emails")

    asyncio.run(fill())
    result = haze(tmp_path, "queue:size", "--queue", "default,emails")
    assert result.exit_code == 0, result.output
    assert next(ln.split() for ln in result.output.splitlines() if "default" in ln)[-2] == "3"
    result = haze(tmp_path, "queue:clear")
    assert result.exit_code == 0, result.output
    assert 'Cleared 3 job(s) from queue "default"' in result.output
    result = haze(tmp_path, "queue:clear", "--queue", "emails")
    assert 'Cleared 1 job(s) from queue "emails"' in result.output
    assert ran == []


# --------------------------------------------------------------------------- errors


def test_config_error_is_one_line_naming_file_and_key(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    path = tmp_path / "config" / "queue.py"
    path.write_text(
        "from haze import define_queue_config\n"
        'config = define_queue_config(default="x", connections={"x": {"driver": "nope"}})\n'
    )
    result = haze(tmp_path, "queue:failed")
    assert result.exit_code == 1
    assert str(path) in result.output
    assert "connections.x.driver" in result.output
    assert isinstance(result.exception, SystemExit)


def test_unknown_command(tmp_path: Path) -> None:
    result = haze(tmp_path, "queue:nope")
    assert result.exit_code == 2
    assert "No such command" in result.output


def test_main_without_click(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "click", None)
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 1
    assert MISSING_DEPENDENCIES in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "summary"),
    [
        (
            "Traceback (most recent call last):\n"
            '  File "x.py", line 1, in f\n'
            '    raise ValueError("a")\n'
            "ValueError: a\nmore",
            "ValueError: a",
        ),
        ("RuntimeError: plain\nline two", "RuntimeError: plain"),
        ("", ""),
    ],
)
def test_exception_summary(text: str, summary: str) -> None:
    assert exception_summary(text) == summary


# --------------------------------------------------------------------------- --queue values


QUEUE_COMMANDS = [
    ["queue:work", "--stop-when-empty"],
    ["queue:failed"],
    ["queue:retry", "all"],
    ["queue:clear"],
    ["queue:size"],
]


@pytest.mark.parametrize("command", QUEUE_COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("q" * 256, "256 characters"),
        ("high,,default", "empty entry"),
        ("high,", "empty entry"),
        (",", "empty"),
    ],
    ids=["empty", "blank", "too-long", "double-comma", "trailing-comma", "only-comma"],
)
def test_every_queue_option_refuses_bad_names_before_touching_the_queue(
    app: App, tmp_path: Path, command: list[str], value: str, reason: str
) -> None:
    asyncio.run(enqueue(app, cli_ok, {"i": 1}))
    result = haze(tmp_path, *command, "--queue", value)
    assert result.exit_code == 2, result.output
    assert "--queue" in result.output
    assert reason in result.output
    assert "Traceback" not in result.output
    errors = [ln for ln in result.output.splitlines() if ln.startswith("Error")]
    assert len(errors) == 1, result.output
    # nothing was cleared, run or retried: the default queue still holds its job
    assert asyncio.run(app.manager.size("default", "memory")) == 1
    assert ran == []


def test_single_queue_commands_refuse_a_list(app: App, tmp_path: Path) -> None:
    result = haze(tmp_path, "queue:clear", "--queue", "high,default")
    assert result.exit_code == 2
    assert "one queue" in result.output


def test_a_255_character_queue_name_is_accepted(app: App, tmp_path: Path) -> None:
    name = "q" * 255
    result = haze(tmp_path, "queue:size", "--queue", f" {name} ,default")
    assert result.exit_code == 0, result.output
    result = haze(tmp_path, "queue:clear", "--queue", name)
    assert result.exit_code == 0, result.output
    assert "Cleared 0 job(s)" in result.output


def test_every_command_with_a_queue_option_validates_it() -> None:
    """A command that gains --queue later must use the same check (QUEUE_NAME(S))."""
    from haze.cli._core import QueueNamesType, QueueNameType

    validated_in_body = {"queue:work", "queue:size"}  # through _queue_list, tested above
    found = []
    for name, command in get_cli().commands.items():
        for param in command.params:
            if "--queue" in getattr(param, "opts", ()):
                found.append(name)
                if name not in validated_in_body:
                    assert isinstance(param.type, (QueueNameType, QueueNamesType)), name
    assert {"queue:work", "queue:clear", "queue:failed", "queue:retry"} <= set(found)
