# Runs INSIDE real Pyodide under tests/cloudflare/miniflare-harness.mjs, not under pytest.
#
# test_cf_miniflare_store.py prepends CONTRACT_SRC: the test functions of
# tests/contract/test_store_contract.py, unchanged (cut out with ast). Each one runs here
# against haze's database store on Miniflare's real D1 binding (js.cfHarness.env.DB), on
# a fresh table: every parameter haze binds crosses the JS boundary as a JS number or
# string and is bound by workerd's D1 (which binds every JS number as REAL). After the
# contract, the database queue driver runs its statements on D1 too (enqueue, claim,
# retry, release, fail) and the column types it left are read back.
# The last expression (a dict) is printed as JSON by the harness.
# ruff: noqa: F704, F821
import __future__

import ast
import asyncio
import itertools
import json
import time
import traceback
from typing import Any

import js
from haze import App, define_database_config, define_queue_config
from haze._base.message import Message, encode
from haze.connectors.migrations import ensure_queue_tables
from haze.contracts.driver import FailedJob
from haze.stores import Store
from haze.stores.database import DatabaseStore
from haze_cloudflare import bind_env
from haze_cloudflare._js import to_py

H = js.cfHarness
bind_env(H.env)


def load_contract():
    """The contract's test functions, compiled from the file's own text (its line numbers
    in tracebacks). TTLs are scaled up: each statement is a round trip through
    Miniflare's binding proxy, which is slower than the 0.1 s the contract allows."""
    tree = ast.parse(CONTRACT_SRC)
    # the test functions, their undecorated helpers and constants; not the fixtures,
    # the store factories or the imports (pytest is not installed here)
    tree.body = [
        n
        for n in tree.body
        if (isinstance(n, (ast.AsyncFunctionDef, ast.FunctionDef)) and not n.decorator_list)
        or (isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant))
    ]
    namespace = {"asyncio": asyncio, "Store": Store, "Any": Any}
    flags = __future__.annotations.compiler_flag
    exec(compile(tree, "tests/contract/test_store_contract.py", "exec", flags=flags), namespace)
    namespace.update(TTL=1.0, PAST_TTL=1.5)
    return namespace


contract = load_contract()

app = App(
    queue=define_queue_config(
        default="database",
        connections={"database": {"driver": "database", "connection": "main"}},
    ),
    database=define_database_config(
        default="main",
        connections={"main": {"url": "d1://local/haze-d1", "options": {"binding": "DB"}}},
    ),
)
tables = itertools.count()


async def read(sql):
    return to_py(await H.read(sql))


async def run_contract():
    out = {}
    for name in CONTRACT_TESTS:
        table = f"haze_store_d1_{next(tables)}"
        store = DatabaseStore("contract", {"connection": "main", "table": table}, app)
        try:
            await asyncio.wait_for(contract[name](store), 180)
            out[name] = {"ok": True}
        except BaseException:
            out[name] = {"ok": False, "error": traceback.format_exc()}
        finally:
            try:  # read back through Miniflare's D1 directly, not through haze
                rows = await read(f"SELECT key, typeof(value) AS t, value FROM {table}")
            except Exception:  # the test never touched the store: no table
                rows = []
            out[name]["types"] = sorted({r["t"] for r in rows})
            out[name]["values"] = [r["value"] for r in rows]
            await app.database("main").execute(f"DROP TABLE IF EXISTS {table}")
    return out


async def run_driver():
    """The queue driver's statements on D1: every column keeps its declared type."""
    await ensure_queue_tables(app, "database")
    driver = app.driver("database")
    msg = Message(id="d1-types-1", job="nobody", payload={"n": 1}, queue="d1types")
    await driver.enqueue(encode(msg), msg, 0)
    seen = []
    first = await driver.reserve(["d1types"], 0)
    seen.append(first.attempt)
    await driver.release(first, 0, consume_attempt=True)  # a retry
    second = await driver.reserve(["d1types"], 0)
    seen.append(second.attempt)
    await driver.release(second, 0, consume_attempt=False)  # job.release(): a new row
    third = await driver.reserve(["d1types"], 0)
    seen.append(third.attempt)
    jobs = await read(
        "SELECT typeof(attempts) AS attempts, typeof(available_at) AS available_at, "
        "typeof(created_at) AS created_at, typeof(reserved_at) AS reserved_at FROM jobs "
        "WHERE queue = 'd1types'"
    )
    failed = FailedJob(
        id=msg.id,
        name=msg.job,
        connection="database",
        queue="d1types",
        payload=msg.payload,
        exception="RuntimeError: no",
        failed_at=time.time(),
        body=third.body,
    )
    await driver.fail(third, failed)
    return {
        "attempts_seen": seen,
        "jobs": jobs,
        "left": await driver.size("d1types"),
        "failed": await read(
            "SELECT typeof(failed_at) AS failed_at FROM failed_jobs WHERE queue = 'd1types'"
        ),
    }


VARS_FILES = {
    "config/queue.py": """
from haze import define_queue_config, env

config = define_queue_config(
    default=env("QUEUE_CONNECTION", "memory"),
    connections={
        "memory": {"driver": "memory"},
        "database": {"driver": "database", "connection": "main"},
    },
)
""",
    "config/database.py": """
from haze import define_database_config, env

config = define_database_config(
    default="main", connections={"main": {"url": env("DATABASE_URL", "sqlite:///app.db")}}
)
""",
    "config/cache.py": """
from haze import define_cache_config

config = define_cache_config(
    default="db", stores={"db": {"driver": "database", "connection": "main"}}
)
""",
    "app/job/mf_vars_jobs.py": """
from haze import define_job


@define_job()
async def mf_vars_probe(payload: dict) -> None:
    pass
""",
}


def write_files(root, files):
    import os

    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


async def run_worker_vars():
    """An app whose config files read DATABASE_URL and QUEUE_CONNECTION with env(), run by
    QueueWorker.fetch() with those set as Worker vars (JS properties of env, beside the
    real DB binding): the dispatch lands in Miniflare's D1, for a d1://ACCOUNT/DATABASE
    URL (binding DB by default) and for a d1://BINDING one."""
    import os
    import sys

    from haze_cloudflare import QueueWorker
    from pyodide.code import run_js
    from pyodide.ffi import to_js

    root = "/tmp/mf_vars_app"
    write_files(root, VARS_FILES)
    out = {}
    for tag, url in (("account", "d1://local/haze-d1"), ("binding", "d1://DB")):

        class VarsWorker(QueueWorker):
            app_root = root

        variables = {"QUEUE_CONNECTION": "database", "DATABASE_URL": url, "HAZE_HTTP_SECRET": "s"}
        env = run_js("(e, v) => Object.assign({}, e, v)")(
            H.env, to_js(variables, dict_converter=js.Object.fromEntries)
        )
        body = json.dumps({"job": "mf_vars_probe", "payload": {"tag": tag}, "queue": "vars"})
        init = {"method": "POST", "headers": {"authorization": "Bearer s"}, "body": body}
        request = js.Request.new(
            "https://w.example/", to_js(init, dict_converter=js.Object.fromEntries)
        )
        response = await VarsWorker(None, env).fetch(request, env)
        rows = await read("SELECT payload FROM jobs WHERE queue = 'vars'")
        out[tag] = {
            "status": response.status,
            "answer": response.json(),
            "row_ids": [json.loads(r["payload"])["id"] for r in rows],
            "connector": type((await VarsWorker(None, env).get_app()).database("main")).__name__,
        }
    out["sqlite_loaded"] = "haze.connectors.sqlite" in sys.modules
    out["os_environ"] = "DATABASE_URL" in os.environ
    return out


result = {"started": time.time()}
try:
    await app.__aenter__()
    result["contract"] = await run_contract()
    try:
        result["driver"] = await run_driver()
    except BaseException:
        result["driver"] = {"error": traceback.format_exc()}
    try:
        result["worker_vars"] = await run_worker_vars()
    except BaseException:
        result["worker_vars"] = {"error": traceback.format_exc()}
except BaseException:
    result["error"] = traceback.format_exc()
result  # noqa: B018 - the harness prints the last expression
