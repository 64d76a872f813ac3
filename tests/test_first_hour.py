"""A new user's first hour, as real processes: ``haze init``, then
``haze db:migrate && python main.py && haze queue:work --stop-when-empty`` in the new
folder, on SQLite, on the real PostgreSQL (a fresh database) and on the real Redis (a
database leased for the test: its keys have no prefix); and one app
migrated on SQLite, PostgreSQL, MariaDB and libSQL (a real sqld) in turn.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from haze._base.sqlfiles import queue_schema
from services import leased_redis_db, server_missing, throwaway_pg_database, tool_missing

PG_ADMIN = os.environ.get("HAZE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HAZE_", "QUEUE_"))}
    e.pop("DATABASE_URL", None)
    e.pop("REDIS_URL", None)
    e["PYTHONUNBUFFERED"] = "1"
    e.update(extra)
    return e


def run(cwd: Path, *cmd: str, **extra: str) -> str:
    """Run ``haze ...`` or ``python ...`` in ``cwd``; returns stdout, fails on exit != 0."""
    argv = (
        [sys.executable, "-m", "haze.cli", *cmd[1:]]
        if cmd[0] == "haze"
        else [
            sys.executable,
            *cmd[1:],
        ]
    )
    proc = subprocess.run(
        argv, cwd=cwd, env=env(**extra), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    # One format: the job lines are not repeated by the logging module's own handler.
    assert "haze.job" not in proc.stderr + proc.stdout, proc.stderr
    return proc.stdout


def first_hour(tmp_path: Path, *flags: str, **extra: str) -> Path:
    """``haze init`` then the three commands the issue names, checked line by line."""
    out = run(tmp_path, "haze", "init", "app1", *flags)
    app = tmp_path / "app1"
    assert "Created config/queue.py" in out
    for rel in (
        "config/queue.py",
        "config/database.py",
        "config/cache.py",
        "app/job/example.py",
        "main.py",
    ):
        assert (app / rel).is_file(), rel
    assert "storage/" in (app / ".gitignore").read_text().splitlines()
    run(app, "haze", "db:migrate", **extra)
    dispatched = run(app, "python", "main.py", **extra)
    short = re.fullmatch(r"Dispatched example (\w+)\n", dispatched)
    assert short, dispatched
    worked = run(app, "haze", "queue:work", "--stop-when-empty", **extra)
    assert re.search(rf"example \.+ {short[1]} RUNNING", worked), worked
    assert re.search(rf"example \.+ {short[1]} WARNING Hello, world!", worked), worked
    assert re.search(rf"example \.+ {short[1]} DONE \d+ms", worked), worked
    assert "Worker stopped after 1 job(s)." in worked
    # the first failure: retried with the job's backoff, shown once with its exception
    failing = run(app, "python", "main.py", "--fail", **extra)
    short = re.fullmatch(r"Dispatched example (\w+)\n", failing)
    assert short, failing
    worked = run(app, "haze", "queue:work", "--stop-when-empty", **extra)
    assert re.search(
        rf"example \.+ {short[1]} RETRY in 5s  RuntimeError: example failed on purpose "
        r"\(attempt 1\)",
        worked,
    ), worked
    return app


def test_init_runs_at_once_on_sqlite(tmp_path: Path) -> None:
    app = first_hour(tmp_path)
    assert (app / "storage" / "app.db").is_file()
    assert "sqlite:///storage/app.db" in (app / "config" / "database.py").read_text()


@pytest.fixture
def pg_url() -> Iterator[str]:
    psycopg = pytest.importorskip("psycopg")
    try:
        psycopg.connect(PG_ADMIN, autocommit=True).close()
    except psycopg.OperationalError as e:
        server_missing("PostgreSQL", PG_ADMIN, str(e))
    with throwaway_pg_database(PG_ADMIN, f"haze_first_hour_{os.getpid()}") as url:
        yield url


def test_init_postgres_runs_against_the_real_server(tmp_path: Path, pg_url: str) -> None:
    app = first_hour(tmp_path, "--postgres", DATABASE_URL=pg_url)
    # a database of the app's own, never the server's `postgres` maintenance database
    config = (app / "config" / "database.py").read_text()
    assert '"postgresql://postgres@127.0.0.1:5432/app1"' in config
    assert '/postgres"' not in config
    out = run(tmp_path, "haze", "init", "app1", "--postgres")
    assert "createdb -h 127.0.0.1 -U postgres app1" in out
    assert not (app / "storage").exists(), "nothing went to SQLite"
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(pg_url) as c:
        assert c.execute("SELECT count(*) FROM jobs").fetchone() == (1,), "the retry waits"


@pytest.fixture
def redis_db() -> Iterator[str]:
    """A Redis database of this test's own: the app ``haze init`` writes has no key prefix."""
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    try:
        client.ping()
    except redis.ConnectionError as e:
        server_missing("Redis", "redis://127.0.0.1:6379", str(e))
    finally:
        client.close()
    with leased_redis_db() as url:
        yield url


def test_init_redis_runs_against_the_real_server(tmp_path: Path, redis_db: str) -> None:
    app = first_hour(tmp_path, "--redis", REDIS_URL=redis_db)
    assert (app / "config" / "redis.py").is_file()
    assert not (app / "database" / "migrations").exists(), "redis needs no tables"
    import redis

    client = redis.Redis.from_url(redis_db)
    try:
        assert client.zcard("haze:default:delayed") == 1, "the retry waits in Redis"
    finally:
        client.close()


def test_init_never_overwrites_a_file(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    mine = "# my own queue config\n"
    (tmp_path / "config" / "queue.py").write_text(mine)
    (tmp_path / "main.py").write_text("print('mine')\n")
    (tmp_path / ".gitignore").write_text("*.pyc")
    out = run(tmp_path, "haze", "init")
    assert "Kept config/queue.py (it exists)" in out
    assert "Kept main.py (it exists)" in out
    assert "Created config/database.py" in out
    assert (tmp_path / "config" / "queue.py").read_text() == mine
    assert (tmp_path / "main.py").read_text() == "print('mine')\n"
    assert (tmp_path / ".gitignore").read_text().splitlines()[0] == "*.pyc"
    # a second run changes nothing at all
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    out = run(tmp_path, "haze", "init")
    assert "Created" not in out
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert (tmp_path / ".gitignore").read_text().count("storage/") == 1


MYSQL_ADMIN = os.environ.get("HAZE_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/")


@pytest.fixture
def mariadb_url() -> Iterator[str]:
    """A fresh database on the real MariaDB, dropped afterwards."""
    pymysql = pytest.importorskip("pymysql")
    parts = urlsplit(MYSQL_ADMIN)
    admin = {
        "host": parts.hostname,
        "port": parts.port or 3306,
        "user": parts.username or "root",
        "password": parts.password or "",
    }
    name = f"haze_first_hour_{os.getpid()}"
    try:
        conn = pymysql.connect(**admin, autocommit=True)
    except pymysql.err.OperationalError as e:
        server_missing("MySQL/MariaDB", MYSQL_ADMIN, str(e))
    with contextlib.closing(conn), conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {name}")
        cur.execute(f"CREATE DATABASE {name}")
    yield MYSQL_ADMIN.rstrip("/") + f"/{name}"
    with contextlib.closing(pymysql.connect(**admin, autocommit=True)) as c, c.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {name}")


@pytest.fixture
def sqld_url(tmp_path: Path) -> Iterator[str]:
    """A real sqld (libSQL server) of its own (tests/database/sqld.py)."""
    spec = importlib.util.spec_from_file_location(
        "haze_first_hour_sqld", Path(__file__).parent / "database" / "sqld.py"
    )
    assert spec is not None and spec.loader is not None
    sqld = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sqld)
    reason = sqld.sqld_available()
    if reason:
        tool_missing(reason)
    with sqld.SqldServer(tmp_path / "sqld") as server:
        yield server.url


def run_one_job(app: Path, **extra: str) -> None:
    """``haze db:migrate && python main.py && haze queue:work --stop-when-empty``, the job done."""
    run(app, "haze", "db:migrate", **extra)
    short = re.fullmatch(r"Dispatched example (\w+)\n", run(app, "python", "main.py", **extra))
    assert short
    worked = run(app, "haze", "queue:work", "--stop-when-empty", **extra)
    assert re.search(rf"example \.+ {short[1]} DONE \d+ms", worked), worked


def test_one_app_migrates_on_every_database(
    tmp_path: Path, pg_url: str, mariadb_url: str, sqld_url: str
) -> None:
    """The migration `haze init` writes is applied on SQLite, PostgreSQL, MariaDB and
    libSQL in turn (the DDL chosen when applied), and a job runs on each."""
    run(tmp_path, "haze", "init", "app1")
    app = tmp_path / "app1"
    (migration,) = (app / "database" / "migrations").iterdir()
    before = migration.read_bytes()
    for url in ("", pg_url, mariadb_url, sqld_url):
        run_one_job(app, **({"DATABASE_URL": url} if url else {}))
        assert migration.read_bytes() == before, "applying it never rewrites it"
    # make:queue-tables agrees that the tables are written for every database: no loop
    out = run(app, "haze", "make:queue-tables", DATABASE_URL=pg_url)
    assert "already exists" in out


def test_an_old_sqlite_migration_says_how_to_convert_it(tmp_path: Path, pg_url: str) -> None:
    """An app whose queue-tables migration is an older haze's SQLite-only .sql: one line
    says how to convert it; converted, it stays applied on SQLite and applies on PostgreSQL."""
    run(tmp_path, "haze", "init", "app1")
    app = tmp_path / "app1"
    (migration,) = (app / "database" / "migrations").iterdir()
    old = migration.with_suffix(".sql")
    migration.unlink()
    old.write_text(
        "-- haze queue tables for connection 'database' (sqlite, database 'main').\n"
        "-- Written by `haze make:queue-tables`; applied by `haze db:migrate`.\n"
        + ";\n".join(queue_schema("sqlite"))
        + ";\n"
    )
    run_one_job(app)
    refused = subprocess.run(
        [sys.executable, "-m", "haze.cli", "db:migrate"],
        cwd=app,
        env=env(DATABASE_URL=pg_url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1
    (line,) = [ln for ln in refused.stderr.splitlines() if ln.strip()]
    assert f"{old.name} holds sqlite SQL only; run `haze make:queue-tables --force`" in line
    hint = run(app, "haze", "make:queue-tables")
    assert "haze make:queue-tables --force" in hint
    run(app, "haze", "make:queue-tables", "--force")
    assert sorted(p.name for p in old.parent.iterdir()) == [f"{old.stem}.py"]
    assert "Nothing to migrate" in run(app, "haze", "db:migrate")
    run_one_job(app, DATABASE_URL=pg_url)


def test_a_made_job_says_something_the_worker_shows(tmp_path: Path) -> None:
    """`haze make:job` writes a job whose log line the worker prints without -v."""
    run(tmp_path, "haze", "init", "app1")
    app = tmp_path / "app1"
    run(app, "haze", "make:job", "SendInvoice")
    run(app, "haze", "db:migrate")
    (app / "send.py").write_text(
        "from pathlib import Path\n"
        "from haze import App\n"
        "from app.job.send_invoice import send_invoice\n"
        "with App(root=Path(__file__).parent):\n"
        "    send_invoice.dispatch_blocking({})\n"
    )
    run(app, "python", "send.py")
    worked = run(app, "haze", "queue:work", "--stop-when-empty")
    assert re.search(r"send_invoice \.+ \w+ \w+ send_invoice running \(attempt 1\)", worked), worked


def test_init_postgres_on_a_sqlite_app_says_how_to_point_it_at_postgresql(
    tmp_path: Path,
) -> None:
    """The kept config/database.py still names SQLite: the steps must not createdb and
    then migrate SQLite again as if the app had moved."""
    run(tmp_path, "haze", "init", "shop")
    out = run(tmp_path / "shop", "haze", "init", "--postgres")
    assert "Kept config/database.py (it exists)" in out
    url = "postgresql://postgres@127.0.0.1:5432/shop"
    assert (
        f"config/database.py is kept and its database is sqlite: export DATABASE_URL={url}" in out
    )
    last = out.strip().splitlines()[-1]
    assert last.startswith("Then, with DATABASE_URL set: createdb "), last
    assert "haze db:migrate" in last, last
    # A fresh --postgres app needs none of that: its config names PostgreSQL already.
    out = run(tmp_path, "haze", "init", "--postgres", "fresh")
    assert "export DATABASE_URL" not in out


def test_init_quotes_the_folder_in_the_commands_it_prints(tmp_path: Path) -> None:
    out = run(tmp_path, "haze", "init", "My App ☃")
    last = out.strip().splitlines()[-1]
    assert last.startswith("Next: cd 'My App ☃' && haze db:migrate"), last


def test_init_beside_an_app_py_says_it_hides_the_app_folder(tmp_path: Path) -> None:
    """Flask's quickstart names its file app.py: then ``app`` is that module, so
    ``from app.job.example import example`` cannot work, and the worker must not run the
    web app's module to find its jobs."""
    (tmp_path / "app.py").write_text(
        "from pathlib import Path\nPath(__file__).with_name('ran').write_text('x')\n"
    )
    out = run(tmp_path, "haze", "init")
    assert (
        "app.py here hides the app/ folder from Python: `from app.job.example import "
        "example` fails while it exists; rename app.py (e.g. to web.py)"
    ) in out
    run(tmp_path, "haze", "db:migrate")
    run(tmp_path, "haze", "queue:work", "--once")
    assert not (tmp_path / "ran").exists(), "the worker imported app.py"
