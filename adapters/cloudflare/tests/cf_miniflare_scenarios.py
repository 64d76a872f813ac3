# Runs INSIDE real Pyodide under tests/cloudflare/miniflare-harness.mjs, not under pytest.
#
# haze's env is Miniflare's real Queue producer (QUEUE -> local queue "haze-jobs") and
# real D1 binding (DB -> local database "haze-d1"). Every delivery of "haze-jobs" comes
# from workerd through the JS consumer Worker and reaches handle_batch() below, which runs
# haze_cloudflare.QueueWorker.queue(); the JS Worker applies the verdicts to the real
# messages. The last expression (a dict) is printed as JSON by the harness.
# ruff: noqa: F704
import asyncio
import json
import time
import traceback

import js
from haze import (
    App,
    JobContext,
    Queue,
    define_cache_config,
    define_database_config,
    define_job,
    define_queue_config,
)
from haze._workers.worker import Worker
from haze.connectors.migrations import ensure_queue_tables
from haze_cloudflare import QueueWorker
from haze_cloudflare._js import to_py
from pyodide.ffi import create_proxy

H = js.cfHarness
env = H.env


def now():
    """Seconds on the harness's clock (the same clock as the delivery events)."""
    return round(float(H.now()), 3)


app = App(
    queue=define_queue_config(
        default="cloudflare",
        connections={
            # final failures go to failed_jobs in D1, through the binding
            "cloudflare": {"driver": "cloudflare", "binding": "QUEUE", "failed_store": "main"},
            # the database driver on D1, through the binding (dispatch from the edge)
            "database": {"driver": "database", "connection": "main", "queues": ["default"]},
        },
        store="d1",
        batches={"store": "d1"},
    ),
    database=define_database_config(
        default="main",
        connections={"main": {"url": "d1://local/haze-d1", "options": {"binding": "DB"}}},
    ),
    # unique locks in D1 too (the database store: one atomic statement per operation)
    cache=define_cache_config(
        default="d1", stores={"d1": {"driver": "database", "connection": "main"}}
    ),
)


class Default(QueueWorker):
    haze_app = app


worker = Default(None, env)
runs = []


def note(name, payload, job):
    runs.append(
        {
            "job": name,
            "key": payload.get("key"),
            "attempt": job.attempt,
            "t": now(),
            "connection": job.connection,
        }
    )


@define_job()
async def cf_mf_ok(payload: dict, job: JobContext) -> None:
    note("ok", payload, job)


@define_job(tries=3, backoff=1)
async def cf_mf_flaky(payload: dict, job: JobContext) -> None:
    note("flaky", payload, job)
    if job.attempt < 3:
        raise RuntimeError(f"flaky attempt {job.attempt}")


@define_job(tries=3, backoff=1)
async def cf_mf_release(payload: dict, job: JobContext) -> None:
    n = sum(1 for r in runs if r["job"] == "release")
    note("release", payload, job)
    if n == 0:
        raise RuntimeError("the first run fails: a retry uses a try")
    if n == 1:
        job.release(1)


@define_job(tries=2, backoff=1)
async def cf_mf_dead(payload: dict, job: JobContext) -> None:
    note("dead", payload, job)
    raise ValueError(f"dead {payload['key']}")


@define_job(tries=5, backoff=1)
async def cf_mf_many(payload: dict, job: JobContext) -> None:
    note("many", payload, job)
    raise RuntimeError("never works: the queue's max_retries (2) ends it first")


@define_job(unique={"key": lambda p: p["key"], "for": "1h"})
async def cf_mf_unique(payload: dict, job: JobContext) -> None:
    note("unique", payload, job)


async def handle_batch(batch):
    await worker.queue(batch, env, None)


H.setHandler(create_proxy(handle_batch))


def count(job):
    return sum(1 for r in runs if r["job"] == job)


async def read(sql):
    return to_py(await H.read(sql))  # JS null arrives as jsnull: to_py makes it None


result = {}
try:
    await worker.get_app()
    await ensure_queue_tables(app, "database")  # CREATE TABLE … on D1 through the binding
    dispatched = {"t": now()}
    dispatched["ok"] = await cf_mf_ok.dispatch({"key": "ok"})
    dispatched["delayed_at"] = now()
    dispatched["delayed"] = await cf_mf_ok.dispatch({"key": "delayed"}, delay=2)
    dispatched["flaky"] = await cf_mf_flaky.dispatch({"key": "flaky"})
    dispatched["release"] = await cf_mf_release.dispatch({"key": "release"})
    dispatched["dead"] = await cf_mf_dead.dispatch({"key": "dead"})
    dispatched["many"] = await cf_mf_many.dispatch({"key": "many"})
    # delayed, so the lock is certainly still held when it is read back below
    u1 = await cf_mf_unique.dispatch({"key": "u"}, delay=3)
    u2 = await cf_mf_unique.with_({"key": "u"}).dispatch()
    dispatched["unique"] = [u1, u2.id, u2.skipped]
    dispatched["locks"] = [r["key"] for r in await read("SELECT key FROM haze_cache")]
    dispatched["bulk"] = await Queue.bulk([cf_mf_ok.with_({"key": f"bulk{i}"}) for i in range(3)])

    # database driver: dispatch through the D1 binding (one row, then a 25-row bulk:
    # 125 bound values, over D1's limit of 100 per statement)
    d1_one = await cf_mf_ok.dispatch({"key": "d1-0"}, connection="database")
    d1_bulk = await Queue.bulk(
        [cf_mf_ok.with_({"key": f"d1-{i}"}).on_connection("database") for i in range(1, 26)]
    )
    d1_rows = await read("SELECT queue, payload, attempts, reserved_at FROM jobs ORDER BY id")
    result["d1_dispatch"] = {
        "ids": [d1_one, *d1_bulk],
        "row_ids": [json.loads(r["payload"])["id"] for r in d1_rows],
        "queues": sorted({r["queue"] for r in d1_rows}),
        "reserved": [r["reserved_at"] for r in d1_rows if r["reserved_at"] is not None],
        "size": await app.driver("database").size("default"),
    }

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done = (
            count("flaky") >= 3
            and count("release") >= 3
            and count("dead") >= 2
            and count("many") >= 3
            and len(H.dlq) >= 1
            and count("unique") >= 1
            and any(r["key"] == "delayed" for r in runs)
            and sum(1 for r in runs if str(r["key"]).startswith("bulk")) >= 3
        )
        if done:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.5)  # let stray redeliveries (there should be none) show up

    # claim from the D1 queue too (UPDATE … RETURNING on D1); a long-running worker
    # elsewhere would do this (the seed's Edge rule)
    w = Worker(app, "database", ["default"], 1, max_jobs=2, stop_when_empty=True)
    result["d1_consumed"] = await w.run()
    result["d1_left"] = await app.driver("database").size("default")

    failed = await Queue.failed()
    result["failed"] = [
        {
            "id": f.id,
            "name": f.name,
            "payload": f.payload,
            "exception": f.exception.splitlines()[-1],
        }
        for f in failed
    ]
    result["dispatched"] = dispatched
    result["runs"] = runs
except BaseException:
    result["error"] = traceback.format_exc()
result  # noqa: B018 - the harness prints the last expression
