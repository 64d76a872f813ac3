"""Operator commands: ``make:queue-tables``, ``db:migrate``, ``queue:restart``/``pause``/
``continue``/``monitor``/``prune-failed``/``prune-batches``/``retry-batch``, and the batch
index behind ``queue:prune-batches`` (``haze.batches.prune``).

Apps live under ``tmp_path`` on one SQLite file: ``cfg`` holds only ``config/`` (the
CliRunner commands and the test's own dispatches use it, with jobs defined in this
module), ``root`` holds the same config plus ``app/job/`` for worker subprocesses. The
subprocess defines its own ``adm_touch`` job; the test process only dispatches it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
import pytest
from click.testing import CliRunner, Result
from haze import App, Batch, Queue, define_job
from haze._engine import manager as haze_manager
from haze._engine.control import paused_queues
from haze._orchestration.batches import _INDEX_COUNT, _index_key, find, prune
from haze.cli import get_cli
from haze.cli.queue_admin import parse_target
from haze.connectors.migrations import ensure_queue_tables
from rich.console import Console

T = TypeVar("T")

ran: list[Any] = []
boom = {"fail": True}


@define_job(name="adm_ok")
async def adm_ok(payload: Any) -> None:
    ran.append(payload)


@define_job(name="adm_boom", tries=1)
async def adm_boom(payload: Any) -> None:
    if boom["fail"]:
        raise ValueError(f"adm boom {payload}")
    ran.append(payload)


@define_job(name="adm_touch")
async def adm_touch(payload: Any) -> None:  # pragma: no cover - runs in the worker child
    raise AssertionError("adm_touch runs in the worker subprocess only")


# The worker child's version of adm_touch: appends its tag to a file.
TOUCH_JOB = """\
from pathlib import Path
from haze import define_job

@define_job(name="adm_touch")
async def adm_touch(payload: dict) -> None:
    with open(payload["file"], "a") as f:
        f.write(payload["tag"] + "\\n")
"""


def config_files(db: Path, *, store: str = "database") -> dict[str, str]:
    return {
        "database.py": f"""\
            from haze import define_database_config
            config = define_database_config(
                default="main", connections={{"main": {{"url": "sqlite:///{db}"}}}}
            )
            """,
        "cache.py": """\
            from haze import define_cache_config
            config = define_cache_config(default="database", stores={
                "database": {"driver": "database"}, "memory": {"driver": "memory"}})
            """,
        "queue.py": f"""\
            from haze import define_queue_config
            config = define_queue_config(
                default="database",
                connections={{
                    "database": {{"driver": "database", "sleep": 0.05, "max_sleep": 0.2}},
                    "other": {{"driver": "database", "table": "other_jobs",
                               "failed_table": "other_failed"}},
                    "memory": {{"driver": "memory"}},
                    "sync": {{"driver": "sync"}},
                }},
                store={store!r},
            )
            """,
    }


def write_app(root: Path, db: Path, *, store: str = "database", jobs: bool = False) -> Path:
    for name, text in config_files(db, store=store).items():
        path = root / "config" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    if jobs:
        job = root / "app" / "job" / "adm_touch.py"
        job.parent.mkdir(parents=True)
        job.write_text(TOUCH_JOB)
    return root


@dataclass
class Site:
    cfg: Path  # config only: for CliRunner and the test's dispatches
    root: Path  # config + app/job: for worker subprocesses
    db: Path


def in_app(root: Path, fn: Callable[[App], Awaitable[T]]) -> T:
    async def go() -> T:
        async with App(root=root) as app:
            return await fn(app)

    return asyncio.run(go())


@pytest.fixture
def site(tmp_path: Path) -> Site:
    db = tmp_path / "queue.db"
    s = Site(write_app(tmp_path / "cfg", db), write_app(tmp_path / "root", db, jobs=True), db)
    in_app(s.cfg, ensure_queue_tables)
    ran.clear()
    boom["fail"] = True
    return s


def haze(root: Path, *args: str) -> Result:
    return CliRunner().invoke(get_cli(), ["--root", str(root), *args])


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


def rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as c:
        return c.execute(sql).fetchall()


def work(site: Site, *extra: str) -> str:
    """Run this module's jobs waiting on ``database`` in-process until the queues are empty."""
    return ok(haze(site.cfg, "queue:work", "--connection", "database", "--stop-when-empty", *extra))


# --------------------------------------------------------------------------- make / migrate


def test_make_queue_tables_then_migrate_is_idempotent(tmp_path: Path) -> None:
    db = tmp_path / "fresh.db"
    root = write_app(tmp_path / "app", db)
    out = ok(haze(root, "make:queue-tables"))
    files = sorted((root / "database" / "migrations").glob("*"))
    assert len(files) == 1
    assert files[0].name.endswith("_create_jobs_and_failed_jobs_tables.py")
    assert f"Migration written to {files[0]}" in out.replace("\n", "")
    # the DDL is chosen when it is applied, for the dialect of that database
    assert "up = queue_tables(jobs='jobs', failed='failed_jobs')" in files[0].read_text()

    again = ok(haze(root, "make:queue-tables"))
    assert "already exists" in again
    assert "--force" in again
    forced = ok(haze(root, "make:queue-tables", "--force"))
    assert "rewritten" in forced
    assert len(list((root / "database" / "migrations").glob("*"))) == 1

    first = ok(haze(root, "db:migrate"))
    assert f"Applied {files[0].name}" in first
    assert 'Applied 1 migration(s) on database "main".' in first
    tables = {r[0] for r in rows(db, "SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"jobs", "failed_jobs", "haze_migrations"} <= tables

    second = ok(haze(root, "db:migrate", "--database", "main"))
    assert "Skipped" in second
    assert "already applied" in second
    assert 'Nothing to migrate on database "main".' in second
    assert rows(db, "SELECT count(*) FROM haze_migrations") == [(1,)]


def test_make_queue_tables_for_another_connection_uses_its_table_names(tmp_path: Path) -> None:
    db = tmp_path / "fresh.db"
    root = write_app(tmp_path / "app", db)
    ok(haze(root, "make:queue-tables", "--connection", "other"))
    (path,) = (root / "database" / "migrations").glob("*")
    assert path.name.endswith("_create_other_jobs_and_other_failed_tables.py")
    ok(haze(root, "db:migrate"))
    tables = {r[0] for r in rows(db, "SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"other_jobs", "other_failed"} <= tables


def test_make_queue_tables_needs_a_database_connection(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    (bare / "app").mkdir(parents=True)
    result = haze(bare, "make:queue-tables")  # no config: one memory connection
    assert result.exit_code == 1
    assert "database driver" in result.output
    result = haze(
        write_app(tmp_path / "app", tmp_path / "x.db"),
        "make:queue-tables",
        "--connection",
        "memory",
    )
    assert result.exit_code == 1
    assert "does not use the database driver" in result.output


def test_migrate_without_migrations_and_with_bad_sql(tmp_path: Path) -> None:
    root = write_app(tmp_path / "app", tmp_path / "x.db")
    out = ok(haze(root, "db:migrate"))
    assert "No migrations in database/migrations/" in out
    assert "make:queue-tables" in out
    bad = root / "database" / "migrations" / "20200101000000_broken.sql"
    bad.parent.mkdir(parents=True)
    bad.write_text("CREATE TABLE ok_one (id INTEGER);\nCREATE TABLEX nope;\n")
    result = haze(root, "db:migrate")
    assert result.exit_code == 1
    assert "db:migrate stopped" in result.output
    assert "Traceback" not in result.output
    # The failed file ran in one transaction: nothing of it stays, and it is not recorded.
    names = {r[0] for r in rows(tmp_path / "x.db", "SELECT name FROM sqlite_master")}
    assert "ok_one" not in names


# --------------------------------------------------------------------------- CONN:QUEUE


def test_parse_target(site: Site) -> None:
    app = App(root=site.cfg)
    assert parse_target(app, "other:emails") == ("other", "emails")
    assert parse_target(app, "emails") == ("database", "emails")  # the default connection
    assert parse_target(app, "memory:a:b") == ("memory", "a:b")
    # dispatch and queue:work --queue take a queue name with an inner space: so do these
    assert parse_target(app, "database:a b") == ("database", "a b")
    for bad in (":x", "database:", "", "database:a,b", "database: "):
        with pytest.raises(click.BadParameter, match="expected CONNECTION:QUEUE"):
            parse_target(app, bad)
    with pytest.raises(click.BadParameter, match=r"unknown connection 'nope'.*database, other"):
        parse_target(app, "nope:default")
    with pytest.raises(click.BadParameter, match="256 characters; a queue name has at most 255"):
        parse_target(app, "database:" + "q" * 256)
    assert parse_target(app, "database:" + "q" * 255) == ("database", "q" * 255)


@pytest.mark.parametrize("command", ["queue:pause", "queue:continue"])
def test_pause_and_continue_reject_bad_targets(site: Site, command: str) -> None:
    result = haze(site.cfg, command, "nope:default")
    assert result.exit_code == 2
    assert "unknown connection 'nope'" in result.output
    assert "configured connections: database, other, memory, sync" in result.output
    result = haze(site.cfg, command, "database:")
    assert result.exit_code == 2
    assert "expected CONNECTION:QUEUE" in result.output
    result = haze(site.cfg, command)
    assert result.exit_code == 2
    assert "Missing argument 'CONNECTION:QUEUE'" in result.output


def test_pause_refuses_sync(site: Site) -> None:
    result = haze(site.cfg, "queue:pause", "sync:default")
    assert result.exit_code == 1
    assert "nothing to pause" in result.output


def test_pause_and_continue_write_the_signal_to_the_store(site: Site) -> None:
    out = ok(haze(site.cfg, "queue:pause", "database:emails"))
    assert 'Paused queue "emails" on connection "database"' in out

    async def paused(app: App) -> set[str]:
        return await paused_queues(app, "database", ["default", "emails"])

    assert in_app(site.cfg, paused) == {"emails"}
    out = ok(haze(site.cfg, "queue:continue", "emails"))  # bare queue: the default connection
    assert 'Resumed queue "emails" on connection "database"' in out
    assert in_app(site.cfg, paused) == set()
    out = ok(haze(site.cfg, "queue:continue", "database:emails"))
    assert "was not paused" in out


@pytest.mark.parametrize(
    "args", [("queue:restart",), ("queue:pause", "memory:default"), ("queue:continue", "x")]
)
def test_worker_signals_refuse_a_process_local_store(tmp_path: Path, args: tuple[str, ...]) -> None:
    root = write_app(tmp_path / "app", tmp_path / "x.db", store="memory")
    result = haze(root, *args)
    assert result.exit_code == 1
    assert "needs a store every process shares" in result.output
    assert 'queue store "memory"' in result.output


# --------------------------------------------------------------------------- worker processes


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.pop("HAZE_APP_ROOT", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Worker:
    """``haze queue:work`` as a subprocess, its stdout collected by a thread."""

    def __init__(self, root: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "haze.cli", "--root", str(root), "queue:work", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        self.out: list[str] = []
        self._ready = threading.Event()
        self._pumping = threading.Thread(target=self._pump, daemon=True)
        self._pumping.start()
        if not self._ready.wait(20):
            self.stop()
            raise AssertionError(f"worker did not start: {self.out!r}")

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.out.append(line)
            if "Working connection" in line:
                self._ready.set()

    def wait(self, timeout: float) -> tuple[int, str]:
        """The exit code and stderr (killing the child if it outlives ``timeout``)."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise
        assert self.proc.stderr is not None
        self._pumping.join(timeout=5)  # the last stdout lines
        return code, self.proc.stderr.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._pumping.join(timeout=5)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for w in started:
        w.stop()


pytestmark_posix = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def wait_until(check: Callable[[], bool], timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def touched(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def dispatch_touch(site: Site, file: Path, *targets: tuple[str, str]) -> None:
    async def go(app: App) -> None:
        for queue, tag in targets:
            await adm_touch.dispatch({"file": str(file), "tag": tag}, queue=queue)

    in_app(site.cfg, go)


@pytestmark_posix
def test_restart_makes_a_running_worker_exit_0(site: Site, workers: list[Worker]) -> None:
    worker = Worker(site.root, "--connection", "database")
    workers.append(worker)
    sent = time.monotonic()
    assert "Broadcasting queue restart signal" in ok(haze(site.cfg, "queue:restart"))
    code, err = worker.wait(timeout=10)
    assert code == 0, err
    assert time.monotonic() - sent < 5
    assert "restart requested" in err
    assert "Traceback" not in err
    assert "Worker stopped after 0 job(s)." in "".join(worker.out)


@pytestmark_posix
def test_pause_stops_claiming_and_continue_resumes(
    site: Site, workers: list[Worker], tmp_path: Path
) -> None:
    file = tmp_path / "touched.txt"
    worker = Worker(site.root, "--connection", "database", "--queue", "default,emails")
    workers.append(worker)
    ok(haze(site.cfg, "queue:pause", "database:default"))
    time.sleep(1.5)  # workers read the signals about once a second
    dispatch_touch(site, file, ("default", "paused-job"), ("emails", "free-job"))
    assert wait_until(lambda: "free-job" in touched(file)), worker.out
    time.sleep(1.0)
    assert touched(file) == ["free-job"]  # default is paused: its job waits
    assert rows(site.db, "SELECT queue FROM jobs") == [("default",)]

    ok(haze(site.cfg, "queue:continue", "database:default"))
    assert wait_until(lambda: "paused-job" in touched(file)), worker.out
    assert rows(site.db, "SELECT count(*) FROM jobs") == [(0,)]
    worker.proc.send_signal(signal.SIGTERM)
    code, err = worker.wait(timeout=10)
    assert code == 0, err
    assert "Worker stopped after 2 job(s)." in "".join(worker.out)


# --------------------------------------------------------------------------- queue:monitor


def test_monitor_shows_sizes_and_emits_queue_busy(site: Site) -> None:
    async def fill(app: App) -> None:
        for i in range(3):
            await adm_ok.dispatch(i)
        await adm_ok.dispatch(9, queue="emails")

    in_app(site.cfg, fill)
    busy: list[tuple[str, str, int]] = []

    async def listener(connection: str, queue: str, size: int) -> None:
        busy.append((connection, queue, size))

    haze_manager.events.on("queue_busy", listener)
    try:
        out = ok(
            haze(
                site.cfg,
                "queue:monitor",
                "database:default,database:emails",
                "memory:x",
                "--max",
                "2",
            )
        )
    finally:
        haze_manager.events.off("queue_busy", listener)
    assert busy == [("database", "default", 3)]
    lines = {
        ln.split("│")[1].strip() + ":" + ln.split("│")[2].strip(): ln
        for ln in out.splitlines()
        if ln.count("│") == 5
    }
    assert set(lines) == {"database:default", "database:emails", "memory:x"}
    assert "3" in lines["database:default"]
    assert "ALERT" in lines["database:default"]
    assert "1" in lines["database:emails"]
    assert "OK" in lines["database:emails"]
    assert "OK" in lines["memory:x"]
    assert "1 queue(s) at or over 2 job(s): queue_busy emitted." in out


def test_monitor_without_busy_queues_and_bad_input(site: Site) -> None:
    out = ok(haze(site.cfg, "queue:monitor", "default"))  # --max defaults to 1000
    assert "OK" in out
    assert "ALERT" not in out
    assert "queue_busy" not in out
    result = haze(site.cfg, "queue:monitor", "nope:default")
    assert result.exit_code == 2
    assert "unknown connection 'nope'" in result.output
    result = haze(site.cfg, "queue:monitor", ",")
    assert result.exit_code == 2
    result = haze(site.cfg, "queue:monitor", "default", "--max", "0")
    assert result.exit_code == 2


# --------------------------------------------------------------------------- prune-failed


def test_prune_failed_deletes_only_old_records(site: Site) -> None:
    async def fill(app: App) -> None:
        for i in range(3):
            await adm_boom.dispatch(i)

    in_app(site.cfg, fill)
    work(site)
    ids = [r[0] for r in rows(site.db, "SELECT uuid FROM failed_jobs ORDER BY id")]
    assert len(ids) == 3
    with sqlite3.connect(site.db) as c:
        c.execute(
            "UPDATE failed_jobs SET failed_at = ? WHERE uuid = ?", (time.time() - 3 * 3600, ids[0])
        )
    out = ok(haze(site.cfg, "queue:prune-failed", "--hours", "2"))
    assert 'Pruned 1 failed job(s) older than 2 hour(s) on connection "database".' in out
    assert [r[0] for r in rows(site.db, "SELECT uuid FROM failed_jobs ORDER BY id")] == ids[1:]
    out = ok(haze(site.cfg, "queue:prune-failed"))  # 24 hours by default
    assert "Pruned 0 failed job(s) older than 24 hour(s)" in out
    out = ok(haze(site.cfg, "queue:prune-failed", "--hours", "0"))
    assert "Pruned 2 failed job(s)" in out
    result = haze(site.cfg, "queue:prune-failed", "--connection", "nope")
    assert result.exit_code == 1
    assert "unknown queue connection 'nope'" in result.output


# --------------------------------------------------------------------------- batches.prune


async def age(app: App, batch_id: str, hours: float) -> None:
    """Make a batch look ``hours`` older (created, finished and cancelled times)."""
    store = app.batch_store
    shift = hours * 3600
    key = f"haze:batch:{batch_id}"
    record = await store.get(key)
    assert record is not None
    record["created_at"] -= shift
    await store.put(key, record, await store.ttl(key))
    for part in ("finished", "cancelled"):
        value = await store.get(f"{key}:{part}")
        if value is not None:
            await store.put(f"{key}:{part}", value - shift, await store.ttl(key))


async def make_batches(app: App) -> dict[str, Batch]:
    """finished/old, finished/new, unfinished/old, cancelled (unfinished)/old, failed/old."""
    made = {
        "finished_old": await Queue.batch([]).dispatch(),
        "finished_new": await Queue.batch([]).dispatch(),
        "unfinished_old": await Queue.batch([adm_ok.with_(1)]).dispatch(),
        "cancelled_old": await Queue.batch([adm_ok.with_(2)]).dispatch(),
    }
    await made["cancelled_old"].cancel()
    for name in ("finished_old", "unfinished_old", "cancelled_old"):
        await age(app, made[name].id, 48)
    return made


async def alive(app: App, made: dict[str, Batch]) -> set[str]:
    return {name for name, b in made.items() if await find(app.manager, b.id) is not None}


def test_prune_batches_follows_laravels_rules(site: Site) -> None:
    day = 24 * 3600

    async def scenario(app: App) -> None:
        made = await make_batches(app)
        assert made["finished_new"].finished
        assert not made["unfinished_old"].finished
        now = time.time()
        assert await prune(app.manager, finished_before=now - day) == 1
        assert await alive(app, made) == {"finished_new", "unfinished_old", "cancelled_old"}
        # Cancelled batches count as unfinished too (Laravel: finished_at is null).
        assert await prune(app.manager, finished_before=now - day, cancelled_before=now - day) == 1
        assert await alive(app, made) == {"finished_new", "unfinished_old"}
        assert (
            await prune(app.manager, finished_before=now - day, unfinished_before=now - 72 * 3600)
            == 0
        )
        assert await prune(app.manager, finished_before=now - day, unfinished_before=now - day) == 1
        assert await alive(app, made) == {"finished_new"}
        assert await prune(app.manager, finished_before=now) == 1
        assert await alive(app, made) == set()

    in_app(site.cfg, scenario)


def test_prune_deletes_every_named_key_and_the_index_slot(site: Site) -> None:
    async def scenario(app: App) -> Batch:
        jobs = [adm_boom.with_(1), adm_boom.with_(2), adm_ok.with_(3)]
        pending = Queue.batch(jobs).allow_failures().catch(adm_ok.with_("caught"))
        return await pending.dispatch()

    batch = in_app(site.cfg, scenario)
    work(site)

    async def check(app: App) -> None:
        store = app.batch_store
        b = await find(app.manager, batch.id)
        assert b is not None
        assert b.finished
        assert b.failed == 2
        assert len(b.failed_job_ids) == 2
        parts = [
            "",
            ":total",
            ":pending",
            ":processed",
            ":failed",
            ":finished",
            ":outcome",
            ":cb:catch",
            ":failed:1",
            ":failed:2",
            ":cancelled",
        ]
        keys = [f"haze:batch:{batch.id}{p}" for p in parts]
        assert [v is not None for v in await store.get_many(keys)] == [True] * 10 + [False]
        count = int(await store.get(_INDEX_COUNT) or 0)
        assert await store.get(_index_key(count)) == batch.id
        assert await prune(app.manager, finished_before=time.time() + 1) == 1
        assert await store.get_many(keys) == [None] * len(keys)
        assert await store.get(_index_key(count)) is None

    in_app(site.cfg, check)


def test_prune_walks_only_slots_above_the_floor(site: Site) -> None:
    async def scenario(app: App) -> None:
        store = app.batch_store
        for _ in range(3):
            await Queue.batch([]).dispatch()
        # A slot allocated but not written yet (a dispatch in flight in another process).
        await store.increment(_INDEX_COUNT)
        await Queue.batch([adm_ok.with_(1)]).dispatch()  # unfinished: stays

        def walk() -> Callable[[int, int], None]:
            seen.clear()
            return lambda done, total: seen.append((done, total))

        seen: list[tuple[int, int]] = []
        assert await prune(app.manager, finished_before=time.time() + 1, progress=walk()) == 3
        assert seen == [(5, 5)]
        # The empty slot 4 might have been written any moment: the floor stopped below it.
        assert await prune(app.manager, finished_before=time.time() + 1, progress=walk()) == 0
        assert seen == [(2, 2)]
        # Slot 4 was allocated before the previous prune began: now known to be empty.
        assert await prune(app.manager, finished_before=time.time() + 1, progress=walk()) == 0
        assert seen == [(1, 1)]  # only the unfinished batch's slot is left to walk
        await Queue.batch([]).dispatch()
        assert await prune(app.manager, finished_before=time.time() + 1, progress=walk()) == 1
        assert seen == [(2, 2)]

    in_app(site.cfg, scenario)


def test_prune_skips_slots_whose_batch_expired(site: Site) -> None:
    async def scenario(app: App) -> None:
        store = app.batch_store
        first = await Queue.batch([adm_ok.with_(1)]).dispatch()
        await store.delete(f"haze:batch:{first.id}")  # expired record, slot still there
        assert await prune(app.manager, finished_before=time.time() + 1) == 0
        assert await store.get(_index_key(1)) is None

    in_app(site.cfg, scenario)


# --------------------------------------------------------------------------- prune-batches CLI


def test_prune_batches_command(site: Site) -> None:
    made = in_app(site.cfg, make_batches)
    out = ok(haze(site.cfg, "queue:prune-batches"))
    assert "Pruned 1 batch(es)." in out
    out = ok(haze(site.cfg, "queue:prune-batches", "--hours", "72", "--cancelled", "24"))
    assert "Pruned 1 batch(es)." in out
    out = ok(haze(site.cfg, "queue:prune-batches", "--unfinished", "24"))
    assert "Pruned 1 batch(es)." in out

    async def left(app: App) -> set[str]:
        return await alive(app, made)

    assert in_app(site.cfg, left) == {"finished_new"}
    out = ok(haze(site.cfg, "queue:prune-batches", "--hours", "0"))
    assert "Pruned 1 batch(es)." in out
    result = haze(site.cfg, "queue:prune-batches", "--hours", "-1")
    assert result.exit_code == 2


def test_prune_batches_shows_a_progress_bar_on_a_terminal(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    from haze.cli import queue_admin

    in_app(site.cfg, make_batches)
    screens: list[Console] = []

    def terminal() -> Console:
        c = Console(force_terminal=True, record=True, width=100)
        screens.append(c)
        return c

    monkeypatch.setattr(queue_admin, "console", terminal)
    ok(haze(site.cfg, "queue:prune-batches", "--hours", "0"))
    text = screens[0].export_text()
    assert "Pruning batches" in text
    assert "Pruned 2 batch(es)." in text


def test_prune_batches_with_a_process_local_store(tmp_path: Path) -> None:
    root = write_app(tmp_path / "app", tmp_path / "x.db", store="memory")
    out = ok(haze(root, "queue:prune-batches"))
    assert 'The batches store "memory" lives in each process only' in out


# --------------------------------------------------------------------------- retry-batch


def test_retry_batch_retries_only_that_batchs_failed_jobs(site: Site) -> None:
    async def fill(app: App) -> tuple[Batch, Batch]:
        a = (
            await Queue.batch([adm_boom.with_("a1"), adm_boom.with_("a2"), adm_ok.with_("a3")])
            .allow_failures()
            .dispatch()
        )
        b = await Queue.batch([adm_boom.with_("b1")]).allow_failures().dispatch()
        await adm_boom.dispatch("loose")
        return a, b

    a, b = in_app(site.cfg, fill)
    work(site)
    assert ran == ["a3"]
    assert rows(site.db, "SELECT count(*) FROM failed_jobs") == [(4,)]
    boom["fail"] = False
    out = ok(haze(site.cfg, "queue:retry-batch", a.id))
    assert f'Retried 2 failed job(s) of batch "{a.id}" on connection "database".' in out
    assert "cancelled" not in out
    assert rows(site.db, "SELECT count(*) FROM failed_jobs") == [(2,)]
    work(site)
    assert sorted(ran) == ["a1", "a2", "a3"]

    async def state(app: App) -> Batch | None:
        return await Queue.find_batch(a.id)

    after = in_app(site.cfg, state)
    assert after is not None
    # The two retried jobs now count as processed, not failed (Laravel's retry too).
    assert (after.failed, after.processed, after.failed_job_ids) == (0, 3, [])
    out = ok(haze(site.cfg, "queue:retry-batch", a.id))
    assert "has no failed jobs" in out
    failed = {r[0] for r in rows(site.db, "SELECT payload FROM failed_jobs")}
    assert len(failed) == 2
    assert any(b.id in p for p in failed)


def test_retry_batch_warns_about_cancelled_and_unknown_batches(site: Site) -> None:
    async def fill(app: App) -> Batch:
        return await Queue.batch([adm_boom.with_("c1")]).dispatch()

    batch = in_app(site.cfg, fill)
    work(site)
    boom["fail"] = False
    out = ok(haze(site.cfg, "queue:retry-batch", batch.id))
    assert "is cancelled" in out
    assert "Retried 1 failed job(s)" in out

    result = haze(site.cfg, "queue:retry-batch", "no-such-batch")
    assert result.exit_code == 1
    assert 'no batch "no-such-batch"' in result.output

    async def orphan(app: App) -> Batch:
        b = await Queue.batch([adm_boom.with_("o1")]).allow_failures().dispatch()
        return b

    boom["fail"] = True
    gone = in_app(site.cfg, orphan)
    work(site)
    ok(haze(site.cfg, "queue:prune-batches", "--hours", "0"))
    out = ok(haze(site.cfg, "queue:retry-batch", gone.id, "--connection", "database"))
    assert "gone from the batches store" in out
    assert "Retried 1 failed job(s)" in out
