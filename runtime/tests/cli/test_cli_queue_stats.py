"""``haze queue:stats [--json]`` and ``haze queue:top`` on a SQLite database queue.

A running job is a row this test claims through the driver and does not finish; the
worker runs in-process through CliRunner.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from haze import App, define_job
from haze._base.ids import short_id
from haze.cli import get_cli
from haze.cli.queue_stats import QueueStats, render
from haze.connectors.migrations import ensure_queue_tables
from haze.contracts.driver import RunningJob
from rich.console import Console


@define_job(name="qs_work", queue="mail")
async def qs_work(payload: Any) -> None: ...


@define_job(name="qs_fail", tries=1)
async def qs_fail(payload: Any) -> None:
    raise ValueError("no")


QUEUE = """\
from haze import define_queue_config
config = define_queue_config(
    default="database",
    connections={{"database": {{"driver": "database", "sleep": 0.05}}}},{store}
)
"""
DATABASE = """\
from haze import define_database_config
config = define_database_config(default="main", connections={"main": {"url": "sqlite:///q.db"}})
"""


def make_root(tmp_path: Path, store: str = "") -> Path:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "queue.py").write_text(QUEUE.format(store=store))
    (tmp_path / "config" / "database.py").write_text(DATABASE)

    async def migrate() -> None:
        async with App(root=tmp_path) as app:
            await ensure_queue_tables(app)

    asyncio.run(migrate())
    return tmp_path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return make_root(tmp_path)


def haze(root: Path, *args: str) -> Result:
    return CliRunner().invoke(get_cli(), ["--root", str(root), *args], env={"COLUMNS": "120"})


def setup_queues(root: Path) -> str:
    """mail: 1 running (claimed here, never finished), 2 ready, 1 delayed; default: 1
    failed. Returns the running job's id."""

    async def go() -> str:
        async with App(root=root) as app:
            running = await qs_work.dispatch(None)
            claimed = await app.driver("database").reserve(["mail"], 0)
            assert claimed is not None and claimed.message is not None
            assert claimed.message.id == running
            await qs_work.dispatch(None)
            await qs_work.dispatch(None)
            await qs_work.dispatch(None, delay=600)
            await qs_fail.dispatch(None)
            return running

    running = asyncio.run(go())
    result = haze(root, "queue:work", "--queue", "default", "--stop-when-empty", "--quiet")
    assert result.exit_code == 0, result.output
    return running


def test_stats_json_gives_the_numbers_and_the_running_jobs(root: Path) -> None:
    dispatched = time.time()
    running = setup_queues(root)
    before = time.time()
    # --queue: in a full run other test modules' jobs name queues of their own
    result = haze(root, "queue:stats", "--json", "--jobs", "5", "--queue", "default,mail")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["connection"] == "database"
    assert data["at"] >= before - 1
    queues = {q["queue"]: q for q in data["queues"]}
    assert set(queues) == {"default", "mail"}
    mail, default = queues["mail"], queues["default"]
    assert (mail["ready"], mail["delayed"], mail["running"], mail["failed"]) == (2, 1, 1, 0)
    assert mail["waiting"] == 4 and mail["paused"] is False
    [job] = mail["running_jobs"]
    assert (job["id"], job["job"], job["attempt"]) == (running, "qs_work", 1)
    assert abs(job["started_at"] - time.time()) < 120
    assert (default["ready"], default["delayed"], default["running"]) == (0, 0, 0)
    assert default["failed"] == 1
    # the oldest of mail's two ready jobs has waited since its dispatch; default has none
    assert dispatched <= mail["oldest_ready_at"] <= before
    assert 0 <= mail["oldest_ready_seconds"] <= time.time() - dispatched + 0.1
    assert default["oldest_ready_at"] is None and default["oldest_ready_seconds"] is None
    # the worker finished one job on "default" (it failed) and wrote it at shutdown
    assert default["per_minute"] > 0
    assert mail["per_minute"] == 0
    assert "unknown" not in mail and "unknown" not in default


def test_stats_json_without_jobs_leaves_the_list_out(root: Path) -> None:
    data = json.loads(haze(root, "queue:stats", "--json", "--queue", "mail").output)
    [mail] = data["queues"]
    assert mail["queue"] == "mail" and mail["running_jobs"] is None
    assert "unknown" not in mail  # not asked for, so not "cannot tell"


def test_a_process_local_store_is_named_not_guessed(tmp_path: Path) -> None:
    root = make_root(tmp_path, store='\n    store="memory",')
    data = json.loads(haze(root, "queue:stats", "--json", "--queue", "mail").output)
    [mail] = data["queues"]
    assert mail["paused"] is None and mail["per_minute"] is None
    assert "lives in each process only" in mail["unknown"]["per_minute"]
    assert set(mail["unknown"]) == {"paused", "per_minute"}
    text = haze(root, "queue:stats", "--queue", "mail").output
    assert "n/a (paused, per_minute): the queue store" in " ".join(text.split())


def test_stats_table_for_people(root: Path) -> None:
    setup_queues(root)
    result = haze(root, "queue:stats", "--queue", "default,mail")
    assert result.exit_code == 0, result.output
    lines = [" ".join(line.replace("│", " ").split()) for line in result.output.splitlines()]
    assert "Oldest ready" in result.output
    mail = re.compile(r"^mail 2 \d+s 1 1 0 0\.0 no")
    assert any(mail.match(line) for line in lines), result.output
    # nothing ready: a known "-", not "n/a" (which is for what the backend cannot tell)
    assert any(line.startswith("default 0 - 0 0 1 ") for line in lines), result.output


def test_top_refreshes_and_shows_the_running_jobs(root: Path) -> None:
    running = setup_queues(root)
    result = haze(
        root, "queue:top", "--interval", "0.05", "--iterations", "3", "--queue", "default,mail"
    )
    assert result.exit_code == 0, result.output
    out = result.output
    assert 'haze queue:top · "database"' in out
    assert "Running now" in out
    assert short_id(running) in out and "qs_work" in out


def test_top_rejects_a_bad_interval(root: Path) -> None:
    result = haze(root, "queue:top", "--interval", "soon")
    assert result.exit_code == 2
    assert "--interval" in result.output and "Traceback" not in result.output


def test_render_says_what_the_backend_cannot_tell() -> None:
    rows = [
        QueueStats(
            "sqs",
            "emails",
            "sqs",
            ready=4,
            delayed=0,
            running=2,
            waiting=6,
            failed=1,
            per_minute=12.5,
            paused=False,
            running_jobs=None,
            unknown={
                "running_jobs": "SQS cannot list the messages in flight",
                "oldest_ready": "SQS keeps the age of its oldest message only in CloudWatch",
            },
        ),
        QueueStats(
            "cf",
            "default",
            "cloudflare",
            waiting=9,
            unknown={
                "ready": "Cloudflare reports one backlog",
                "delayed": "Cloudflare reports one backlog",
                "running": "Cloudflare reports one backlog",
            },
            running_jobs=[RunningJob("a" * 32, "<b>bold</b>", "default", 2, 100.0)],
        ),
    ]
    console = Console(record=True, width=100, color_system=None)
    console.print(render(rows, now=130.0, title="t"))
    text = console.export_text()
    lines = [" ".join(line.replace("│", " ").split()) for line in text.splitlines()]
    assert any(line.startswith("emails 4 n/a 0 2 1 12.5 no") for line in lines), text
    assert any(line.startswith("default n/a n/a n/a n/a n/a n/a n/a") for line in lines), text
    assert "n/a (oldest_ready): SQS keeps the age of its oldest message only in" in text
    assert "n/a (running_jobs): SQS cannot list the messages in flight" in text
    assert "n/a (delayed, ready, running): Cloudflare reports one backlog" in text
    assert "aaaaaaaa <b>bold</b> default 2 30s" in " ".join(text.split())  # escaped, not markup


def test_oldest_ready_reads_as_an_age() -> None:
    row = QueueStats("db", "mail", "database", ready=3, delayed=0, running=0)
    row.oldest_ready_at = 100.0
    console = Console(record=True, width=120, color_system=None)
    console.print(render([row], now=345.0, title="t"))
    lines = [
        " ".join(line.replace("│", " ").split()) for line in console.export_text().splitlines()
    ]
    assert any(line.startswith("mail 3 4m 05s 0 0") for line in lines), lines
    assert row.oldest_ready_seconds(now=345.0) == 245.0
