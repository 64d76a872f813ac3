"""``queue:failed | retry | forget`` filters: --queue, --job, --exception, --since, --range.

Each test has its own SQLite app under ``tmp_path``; failed jobs are written straight
into ``failed_jobs`` with the queue, job, exception and time each test needs.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from haze import App, define_job
from haze.cli import get_cli
from haze.connectors.migrations import ensure_queue_tables


@define_job(name="ff_send")
async def ff_send(payload: Any) -> None: ...


@define_job(name="ff_charge")
async def ff_charge(payload: Any) -> None: ...


QUEUE = """\
from haze import define_queue_config
config = define_queue_config(default="database", connections={"database": {"driver": "database"}})
"""
DATABASE = """\
from haze import define_database_config
config = define_database_config(default="main", connections={"main": {"url": "sqlite:///q.db"}})
"""
#: (id, job, queue, exception, failed seconds ago), oldest first
ROWS = [
    ("a" * 32, "ff_send", "mail", "TimeoutError: smtp timed out", 3 * 86400),
    ("b" * 32, "ff_charge", "billing", "ValueError: card declined", 2 * 3600),
    ("c" * 32, "ff_send", "mail", "ConnectionError: SMTP refused", 1800),
    ("d" * 32, "ff_send", "default", "ValueError: bad address", 600),
    ("e" * 32, "ff_charge", "billing", "TimeoutError: gateway Timed Out", 60),
]


@pytest.fixture
def now() -> float:
    # Taken when the test runs, not at import: in a full run a test can start half an
    # hour after collection, and "--since 15m" must still mean the rows' last 15 min.
    return time.time()


@pytest.fixture
def root(tmp_path: Path, now: float) -> Path:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "queue.py").write_text(QUEUE)
    (tmp_path / "config" / "database.py").write_text(DATABASE)

    async def migrate() -> None:
        async with App(root=tmp_path) as app:
            await ensure_queue_tables(app)

    asyncio.run(migrate())
    with sqlite3.connect(tmp_path / "q.db") as c:
        for job_id, job, queue, exception, ago in ROWS:
            body = json.dumps({"v": 1, "id": job_id, "job": job, "payload": None, "queue": queue})
            c.execute(
                "INSERT INTO failed_jobs (uuid, connection, queue, payload, exception, failed_at) "
                "VALUES (?, 'database', ?, ?, ?, ?)",
                (job_id, queue, body, exception, now - ago),
            )
    return tmp_path


def haze(root: Path, *args: str) -> Result:
    return CliRunner().invoke(get_cli(), ["--root", str(root), *args], env={"COLUMNS": "120"})


def failed_ids(root: Path) -> list[str]:
    with sqlite3.connect(root / "q.db") as c:
        return [r[0] for r in c.execute("SELECT uuid FROM failed_jobs ORDER BY id")]


def waiting(root: Path) -> list[str]:
    with sqlite3.connect(root / "q.db") as c:
        return sorted(json.loads(r[0])["id"] for r in c.execute("SELECT payload FROM jobs"))


def listed(result: Result) -> list[tuple[str, str]]:
    """(number, short id) of each row queue:failed printed."""
    assert result.exit_code == 0, result.output
    rows = []
    for line in result.output.splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[0].isdigit():
            rows.append((parts[0], parts[1]))
    return rows


def short(letter: str) -> str:
    return letter * 8


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], [("1", "a"), ("2", "b"), ("3", "c"), ("4", "d"), ("5", "e")]),
        (["--queue", "mail"], [("1", "a"), ("2", "c")]),
        (["--job", "ff_charge"], [("1", "b"), ("2", "e")]),
        (["--exception", "timed out"], [("1", "a"), ("2", "e")]),  # any case
        (["--since", "1h"], [("1", "c"), ("2", "d"), ("3", "e")]),
        (["--since", "1h", "--job", "ff_send"], [("1", "c"), ("2", "d")]),
        (["--range", "2-3"], [("2", "b"), ("3", "c")]),
        (["--range", "5", "--range", "1"], [("1", "a"), ("5", "e")]),
        (["--job", "ff_send", "--range", "2-9"], [("2", "c"), ("3", "d")]),
    ],
)
def test_failed_lists_what_the_filters_pick_numbered_oldest_first(
    root: Path, args: list[str], expected: list[tuple[str, str]]
) -> None:
    got = listed(haze(root, "queue:failed", *args))
    assert got == [(n, short(letter)) for n, letter in expected]


def test_since_takes_an_iso_time(root: Path, now: float) -> None:
    cutoff = datetime.fromtimestamp(now - 2 * 3600 - 60).isoformat(timespec="seconds")
    got = listed(haze(root, "queue:failed", "--since", cutoff))
    assert [s for _, s in got] == [short(x) for x in "bcde"]
    zoned = datetime.fromtimestamp(now - 700).astimezone().isoformat()
    assert [s for _, s in listed(haze(root, "queue:failed", "--since", zoned))] == [
        short("d"),
        short("e"),
    ]


def test_nothing_matching_says_what_was_asked(root: Path) -> None:
    result = haze(root, "queue:failed", "--job", "ff_nope", "--exception", "boom")
    assert result.exit_code == 0
    assert 'No failed jobs matching job "ff_nope", exception containing "boom" on connection' in (
        " ".join(result.output.split())
    )


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--since", "yesterday"], "--since"),
        (["--since", "-5m"], "--since"),
        (["--range", "5-1"], "--range"),
        (["--range", "0"], "--range"),
        (["--range", "a-b"], "--range"),
        (["--job", " "], "--job"),
        (["--exception", ""], "--exception"),
    ],
)
def test_a_bad_filter_is_one_line_naming_the_option(
    root: Path, args: list[str], named: str
) -> None:
    for command in ("queue:failed", "queue:retry", "queue:forget"):
        result = haze(root, command, *args)
        assert result.exit_code == 2, (command, result.output)
        assert named in result.output
        assert "Traceback" not in result.output
    assert len(failed_ids(root)) == 5


def test_retry_with_filters_retries_only_the_matches(root: Path) -> None:
    result = haze(root, "queue:retry", "--exception", "timeout", "--queue", "billing")
    assert result.exit_code == 0, result.output
    assert "Retried 1 failed job(s)" in result.output
    assert waiting(root) == ["e" * 32]
    assert failed_ids(root) == ["a" * 32, "b" * 32, "c" * 32, "d" * 32]


def test_retry_range_as_laravel_does(root: Path) -> None:
    result = haze(root, "queue:retry", "--range", "1-2")
    assert result.exit_code == 0, result.output
    assert "Retried 2 failed job(s)" in result.output
    assert waiting(root) == ["a" * 32, "b" * 32]


def test_retry_queue_alone_retries_that_queue(root: Path) -> None:
    result = haze(root, "queue:retry", "--queue", "mail")
    assert result.exit_code == 0, result.output
    assert waiting(root) == ["a" * 32, "c" * 32]


def test_retry_all_with_filters_narrows_it(root: Path) -> None:
    result = haze(root, "queue:retry", "all", "--since", "15m")
    assert result.exit_code == 0, result.output
    assert waiting(root) == ["d" * 32, "e" * 32]


def test_ids_and_filters_together_are_refused(root: Path) -> None:
    for command in ("queue:retry", "queue:forget", "queue:failed"):
        result = haze(root, command, short("a"), "--job", "ff_send")
        assert result.exit_code == 2, result.output
        assert "not both" in result.output
    assert len(failed_ids(root)) == 5


def test_forget_without_ids_or_filters_asks(root: Path) -> None:
    result = haze(root, "queue:forget")
    assert result.exit_code == 2
    assert "--since" in result.output and "ID" in result.output
    assert len(failed_ids(root)) == 5


def test_forget_with_filters_and_ranges(root: Path) -> None:
    result = haze(root, "queue:forget", "--job", "ff_send", "--since", "1h")
    assert result.exit_code == 0, result.output
    assert "Deleted 2 failed job(s) matching" in result.output
    assert failed_ids(root) == ["a" * 32, "b" * 32, "e" * 32]
    result = haze(root, "queue:forget", "--range", "2")
    assert result.exit_code == 0, result.output
    assert failed_ids(root) == ["a" * 32, "e" * 32]
    assert waiting(root) == []


def test_forget_takes_several_ids(root: Path) -> None:
    result = haze(root, "queue:forget", short("a"), short("c"))
    assert result.exit_code == 0, result.output
    assert "Deleted 2 failed job(s)" in result.output
    assert failed_ids(root) == ["b" * 32, "d" * 32, "e" * 32]
