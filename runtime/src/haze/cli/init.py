"""``haze init [DIR]``: a new app that runs at once (SQLite by default), never overwriting.

The files written are the ones a new user would otherwise copy from the docs: the four
config modules with every option commented, a job, a ``main.py`` that dispatches it,
the queue-tables migration (database queues) and a ``.gitignore`` entry for ``storage/``.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any

import click

from haze._app.app import App, _load_module_file
from haze._base.hints import install_hint
from haze.cli._core import cli, console
from haze.connectors import dialect_of
from haze.connectors.migrations import make_queue_tables

__all__ = ["init", "scaffold"]

_SQLITE_URL = "sqlite:///storage/app.db"
_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/{name}"
_REDIS_URL = "redis://127.0.0.1:6379/0"

_QUEUE = '''\
"""Queue connections: where jobs wait and which worker runs them.

Pick one with QUEUE_CONNECTION (default: "{default}"). Every option is listed; the
commented ones show their default.
"""

from haze import define_queue_config, env

config = define_queue_config(
    default=env("QUEUE_CONNECTION", "{default}"),
    connections={{
{connections}
        # Runs each job inside dispatch(): handy in tests and scripts, no worker.
        "sync": {{"driver": "sync"}},
        # In this process only, lost on exit; `async with App(...)` runs its jobs.
        "memory": {{
            "driver": "memory",
            # "concurrency": 1,          # jobs run at once by the in-process consumer
            # "queues": None,            # priority order of its queues (None: every queue)
            # "max_message_size": None,  # bytes; a bigger payload raises at dispatch
        }},
        # Amazon SQS (pip install 'haze-jobs[sqs]'): uncomment and set SQS_URL.
        # "sqs": {{
        #     "driver": "sqs",
        #     "queue_url": env("SQS_URL"),  # "{{queue}}" in it is replaced by the queue name
        #     "region": "eu-west-1",       # default: read from the URL
        #     "endpoint_url": None,        # for SQS-compatible servers (ElasticMQ, LocalStack)
        #     "retry_after": "90s",        # visibility timeout of a claimed job
        #     "wait_time": "20s",          # long-poll wait, at most 20s
        #     "fifo": False,               # default: True when the URL ends in .fifo
        #     "failed_store": None,        # the store keeping failed jobs (config/cache.py)
        #     "credentials": {{}},           # access_key_id, secret_access_key, profile, ...
        # }},
        # Cloudflare Queues (haze build --preset cloudflare), by binding or REST API.
        # "cloudflare": {{
        #     "driver": "cloudflare",
        #     "binding": "QUEUE",          # the producer binding inside a Worker
        #     "account_id": None,          # REST (outside a Worker): account, queue, token
        #     "queue_id": None,
        #     "api_token": None,
        #     "api_url": None,
        #     "failed_store": None,
        #     "visibility_timeout": "30s",
        # }},
    }},
    # The store for unique locks, rate limits and batch state (a name in config/cache.py).
    # Every process that dispatches or works jobs must share it.
    store={store},
    batches={{
        # "store": None,  # default: the store above
        "ttl": "7d",  # batch state is kept this long
    }},
    # Middleware run around every job, before the job's own, e.g. [rate_limited(...)].
    middleware=[],
    # Run a worker inside your ASGI server's lifespan (True, or connection/queues/concurrency).
    run_in_server=False,
)
'''

_DATABASE_QUEUE = """\
        # Jobs in a SQL table (the tables come from `haze db:migrate`).
        "database": {
            "driver": "database",
            "connection": "main",  # a connection in config/database.py
            "queues": ["default"],  # what `haze queue:work` works, in priority order
            # "concurrency": 1,        # jobs a worker runs at once (--concurrency wins)
            # "retry_after": "90s",    # a claimed job whose worker died is retried after this
            # "sleep": "1s",           # idle polling interval (PostgreSQL is woken by NOTIFY)
            # "max_sleep": "5s",       # idle polling doubles up to this
            # "table": "jobs",
            # "failed_table": "failed_jobs",
            # "max_message_size": None,
        },"""

_REDIS_QUEUE = """\
        # Jobs in Redis (BullMQ's data model; pip install 'haze-jobs[redis]').
        "redis": {
            "driver": "redis",
            "connection": "default",  # a connection in config/redis.py
            "queues": ["default"],  # what `haze queue:work` works, in priority order
            # "concurrency": 1,        # jobs a worker runs at once (--concurrency wins)
            # "prefix": "haze",        # key prefix (BullMQ's "prefix")
            # "retry_after": "30s",    # lock duration; a stalled job is retried after it
            # "keep_completed": 1000,  # finished jobs kept for inspection
            # "keep_failed": None,     # failed jobs kept (None: all)
            # "url": None,             # instead of "connection": a redis:// URL
            # "max_message_size": None,
        },"""

_DATABASE = '''\
"""SQL connections, by URL. DATABASE_URL overrides the default one.

URL schemes: sqlite:///relative/path.db (relative to the app root) or
sqlite:////absolute/path.db, postgresql://user:pass@host:5432/db (pip install
'haze-jobs[postgres]'), mysql://user:pass@host:3306/db (MariaDB/MySQL,
'haze-jobs[mysql]'), libsql:// or https:// (Turso/sqld, 'haze-jobs[libsql]'), d1://ACCOUNT_ID/DATABASE_ID
(Cloudflare D1 over REST).
"""

from haze import define_database_config, env

config = define_database_config(
    default="main",
    connections={{
        "main": {{
            "url": env("DATABASE_URL", "{url}"),
            # "pool_size": 10,          # connections kept open (PostgreSQL, MySQL)
            # "busy_timeout": 30000,    # SQLite: milliseconds to wait for a locked database
            # "auth_token": None,       # libSQL/Turso token
            # "api_token": None,        # Cloudflare D1 REST token
            # "options": {{}},            # passed to the client library's connect()
        }},
    }},
)
'''

_REDIS = '''\
"""Redis connections. REDIS_URL overrides the default one."""

from haze import define_redis_config, env

config = define_redis_config(
    default="default",
    connections={{
        "default": {{
            "url": env("REDIS_URL", "{url}"),
            "key_prefix": "",  # prepended to every key haze writes
            # Instead of "url": "host", "port", "db", "username", "password", "ssl".
            # "socket_timeout": None,          # a reply slower than this is an error
            # "socket_connect_timeout": "10s",
            # "socket_keepalive": True,
            # "health_check_interval": "30s",  # ping an idle connection before using it
        }},
    }},
)
'''

_CACHE = '''\
"""Stores: where unique locks, rate limits, batch state and worker signals live.

`store=` in config/queue.py picks one (default: the default store below).
"""

from haze import define_cache_config

config = define_cache_config(
    default="{default}",
    stores={{
{stores}
        # This process only: fine for tests and the memory connection.
        "memory": {{"driver": "memory"}},
        # Cloudflare Workers KV, inside a Worker:
        # "kv": {{"driver": "kv", "binding": "CACHE", "prefix": "haze:"}},
    }},
)
'''

_DATABASE_STORE = '''\
        # A table on a config/database.py connection (created on first use).
        "database": {"driver": "database", "connection": "main"},  # "table": "haze_cache"'''

_REDIS_STORE_LINE = '"redis": {"driver": "redis", "connection": "default"},'
_REDIS_CONNECTION_LINE = (
    '"redis": {"driver": "redis", "connection": "default", "queues": ["default"]},'
)

_REDIS_STORE = (
    "        # Keys on a config/redis.py connection.\n"
    f'        {_REDIS_STORE_LINE}  # "prefix": "haze:cache:"'
)

_JOB = '''\
"""An example job: `python main.py` dispatches it, `haze queue:work` runs it."""

from typing import Any

from haze import JobContext, define_job


@define_job(tries=3, backoff=[5, 30])
async def example(payload: dict[str, Any], job: JobContext) -> None:
    if payload.get("fail"):
        # Any exception fails this attempt: it is retried 5s, then 30s later, and after
        # the third try it is kept in the failed jobs (`haze queue:failed`).
        raise RuntimeError(f"example failed on purpose (attempt {job.attempt})")
    job.logger.warning("Hello, %s!", payload.get("name", "world"))
'''

_MAIN = '''\
"""Dispatch the example job. Then run it with: haze queue:work --stop-when-empty"""

import sys
from pathlib import Path

from haze import App, short_id

from app.job.example import example

with App(root=Path(__file__).parent):
    fail = "--fail" in sys.argv
    job_id = example.dispatch_blocking({"name": "world", "fail": fail})
    print(f"Dispatched example {short_id(job_id)}")
'''

_GITIGNORE = "# haze: the SQLite database and other local state\nstorage/\n"


def scaffold(directory: Path, *, redis: bool = False, postgres: bool = False) -> dict[Path, bool]:
    """Write the new app's files under ``directory``: path -> True if written, False if
    it existed (nothing is ever overwritten; ``.gitignore`` only gains its entry)."""
    store = "redis" if redis else "database"
    files: dict[str, str] = {
        "config/queue.py": _QUEUE.format(
            default=store,
            connections=_REDIS_QUEUE + "\n" + _DATABASE_QUEUE if redis else _DATABASE_QUEUE,
            store=repr(store),
        ),
        "config/database.py": _DATABASE.format(
            url=_POSTGRES_URL.format(name=database_name(directory)) if postgres else _SQLITE_URL
        ),
        "config/cache.py": _CACHE.format(
            default=store,
            stores=_REDIS_STORE + "\n" + _DATABASE_STORE if redis else _DATABASE_STORE,
        ),
        "app/job/example.py": _JOB,
        "main.py": _MAIN,
    }
    if redis:
        files["config/redis.py"] = _REDIS.format(url=_REDIS_URL)
    written: dict[Path, bool] = {}
    for rel, text in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        written[path] = _create(path, text)
    written[directory / ".gitignore"] = _ignore_storage(directory / ".gitignore")
    return written


def database_name(directory: Path) -> str:
    """The app's own PostgreSQL database: its folder's name as an SQL identifier (never
    the server's ``postgres`` maintenance database)."""
    name = re.sub(r"[^a-z0-9_]+", "_", directory.name.lower()).strip("_")
    if not name or name[0].isdigit() or name in ("postgres", "template0", "template1"):
        name = f"haze_{name}".rstrip("_")
    return name[:63]


def _create(path: Path, text: str) -> bool:
    """Write a new file whole, or not at all; False if ``path`` exists (it is kept).

    The text goes to a temporary file that is then hard-linked into place: the link
    fails if the file exists, and a process killed midway leaves no half-written file
    for the next ``haze init`` to keep.
    """
    if path.exists():
        return False
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    except OSError:  # no hard links here (some network filesystems): exclusive create
        try:
            with path.open("x", encoding="utf-8") as f:
                f.write(text)
        except FileExistsError:
            return False
    finally:
        tmp.unlink(missing_ok=True)
    return True


def _ignore_storage(path: Path) -> bool:
    """Add ``storage/`` to ``.gitignore`` (created if missing); False if already there."""
    if path.exists():
        lines = path.read_text(encoding="utf-8").splitlines()
        if any(line.strip() in ("storage", "storage/", "/storage", "/storage/") for line in lines):
            return False
        with path.open("a", encoding="utf-8") as f:
            f.write(("\n" if lines and lines[-1].strip() else "") + _GITIGNORE)
        return True
    path.write_text(_GITIGNORE, encoding="utf-8")
    return True


def _existing_app(directory: Path) -> App:
    """The app the config files under ``directory`` make (config only)."""
    # Config only: importing the job modules here could clash with jobs of the same
    # name already registered in this process.
    configs: dict[str, Any] = {}
    for kind in ("queue", "cache", "redis", "database"):
        path = directory / "config" / f"{kind}.py"
        if path.is_file():
            module = _load_module_file(path, f"_haze_init_{kind}_{abs(hash(str(path)))}")
            configs[kind] = getattr(module, "config", None)
    app = App(**configs)
    app.root = directory
    return app


def _queue_tables(app: App) -> Path | None:
    """Write the queue-tables migration when the default connection is a database one
    (an existing migration is kept). None for other drivers: they need no tables."""
    if app.queue_config.connections[app.queue_config.default]["driver"] != "database":
        return None
    return make_queue_tables(app)


def redis_additions(app: App) -> list[str]:
    """What an existing app's config/queue.py and config/cache.py lack to run on Redis
    (``haze init --redis`` kept them): the lines to add, ready to paste."""
    qc, cc = app.queue_config, app.cache_config
    lines: list[str] = []
    queue: list[str] = []
    if "redis" not in qc.connections:
        queue.append(f"in connections={{...}}:\n        {_REDIS_CONNECTION_LINE}")
    if qc.default != "redis":
        queue.append('set its default:\n    default=env("QUEUE_CONNECTION", "redis"),')
    if qc.store != "redis":
        queue.append('its store:\n    store="redis",')
    if queue:
        lines.append("Add to config/queue.py, " + "\nand ".join(queue))
    if "redis" not in cc.stores:
        lines.append(f"Add to config/cache.py, in stores={{...}}:\n        {_REDIS_STORE_LINE}")
    return lines


def postgres_note(app: App, directory: Path) -> str | None:
    """``init --postgres`` kept a config/database.py whose default database (as read,
    DATABASE_URL included) is not PostgreSQL: the line saying how to point it there."""
    config = app.database_config
    url = str(config.connections.get(config.default, {}).get("url") or "")
    dialect = dialect_of(url) if url else "none"
    if dialect == "postgres":
        return None
    wanted = _POSTGRES_URL.format(name=database_name(directory))
    return (
        f"config/database.py is kept and its database is {dialect}: export "
        f"DATABASE_URL={wanted} (or set that url in config/database.py)"
    )


def _steps(directory: Path, postgres: bool, migrate: bool) -> list[str]:
    """The commands that run the new app, the folder quoted for the shell."""
    here = Path.cwd().resolve()
    shown = os.path.relpath(directory, here)
    where = str(directory) if shown.startswith("..") else shown
    steps = [] if directory == here else [f"cd {shlex.quote(where)}"]
    if postgres:
        steps.append(f"createdb -h 127.0.0.1 -U postgres {database_name(directory)}")
    if migrate:
        steps.append("haze db:migrate")
    return [*steps, "python main.py", "haze queue:work --stop-when-empty"]


@cli.command("init", short_help="Create a new app here or in DIRECTORY.")
@click.argument(
    "directory",
    required=False,
    default=".",
    type=click.Path(file_okay=False, path_type=Path),
)
@click.option("--redis", is_flag=True, help="Queue jobs in Redis (writes config/redis.py).")
@click.option(
    "--postgres", is_flag=True, help="PostgreSQL in config/database.py instead of SQLite."
)
def init(directory: Path, redis: bool, postgres: bool) -> None:
    """Write a new app in DIRECTORY (default: the current one): config/queue.py,
    database.py, cache.py (every option commented), app/job/example.py and main.py.
    Files that exist are kept as they are."""
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    out = console()
    for path, written in scaffold(directory, redis=redis, postgres=postgres).items():
        rel = path.relative_to(directory)
        if path.name == ".gitignore":
            out.print(f"{'Updated' if written else 'Kept'} {rel}", markup=False)
        else:
            out.print(f"Created {rel}" if written else f"Kept {rel} (it exists)", markup=False)
    app = _existing_app(directory)
    additions = redis_additions(app) if redis else []
    for lines in additions:
        out.print(lines, markup=False)
    migration = None if redis else _queue_tables(app)
    if migration is not None:
        out.print(f"Migration {migration.relative_to(directory)}", markup=False)
    extras = [name for name, wanted in (("postgres", postgres), ("redis", redis)) if wanted]
    if extras:
        # The clients are optional extras: say so before the first command needs them.
        out.print(f"Needs the client: {install_hint(','.join(['cli', *extras]))}", markup=False)
    if (directory / "app.py").is_file():
        out.print(
            "app.py here hides the app/ folder from Python: `from app.job.example import "
            "example` fails while it exists; rename app.py (e.g. to web.py)",
            markup=False,
        )
    note = postgres_note(app, directory) if postgres else None
    if note is not None:
        out.print(note, markup=False)
    steps = _steps(directory, postgres, migration is not None)
    wait = [w for w, on in (("those lines in place", additions), ("DATABASE_URL set", note)) if on]
    then = f"Then, with {' and '.join(wait)}: " if wait else "Next: "
    out.print(then + " && ".join(steps), markup=False)
