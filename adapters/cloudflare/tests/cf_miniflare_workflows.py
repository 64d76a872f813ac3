# Runs INSIDE real Pyodide under tests/cloudflare/miniflare-harness.mjs, not under pytest.
#
# test_cf_miniflare_workflows.py prepends RECIPES_SRC: tests/workflows/recipes.py, the
# one definition file of the docs' three workflow recipes, unchanged. They run here on
# haze's own workflow engine with every delivery coming from workerd's real local queue
# ("haze-jobs", through the JS consumer Worker) into haze_cloudflare.QueueWorker.queue(),
# and the runs' state in Miniflare's real D1 (the database store on a d1:// connection,
# through the binding). The payment's webhook arrives through the Worker's fetch() (the
# signed dispatch endpoint) and through QueueWorker.send_event. The sign-up's two-day
# sleep runs on a moved clock: its resume (12 h, the Queues cap) stays queued, and a
# resume dispatched after the clock moved finds the sleep over.
# The last expression (a dict) is printed as JSON by the harness.
# ruff: noqa: F704, F821
import asyncio
import os
import sys
import time
import traceback
import types

import js
from haze import (
    App,
    Workflow,
    define_cache_config,
    define_database_config,
    define_queue_config,
)
from haze._workflows.engine import set_clock
from haze.connectors.migrations import ensure_queue_tables
from haze_cloudflare import QueueWorker
from haze_cloudflare._js import to_py
from pyodide.ffi import create_proxy, to_js

recipes = types.ModuleType("recipes")
exec(compile(RECIPES_SRC, "tests/workflows/recipes.py", "exec"), recipes.__dict__)
sys.modules["recipes"] = recipes

H = js.cfHarness
env = H.env
os.environ["HAZE_HTTP_SECRET"] = "wf-secret"
shift = [0.0]
set_clock(lambda: time.time() + shift[0])

app = App(
    queue=define_queue_config(
        default="cloudflare",
        connections={
            "cloudflare": {"driver": "cloudflare", "binding": "QUEUE", "failed_store": "main"},
            # only for its tables: the failed jobs of "cloudflare" go to D1's failed_jobs
            "database": {"driver": "database", "connection": "main", "queues": ["default"]},
        },
        store="d1",
    ),
    database=define_database_config(
        default="main",
        connections={"main": {"url": "d1://local/haze-d1", "options": {"binding": "DB"}}},
    ),
    cache=define_cache_config(
        default="d1", stores={"d1": {"driver": "database", "connection": "main"}}
    ),
)


class Default(QueueWorker):
    haze_app = app


worker = Default(None, env)


async def handle_batch(batch):
    await worker.queue(batch, env, None)


H.setHandler(create_proxy(handle_batch))


async def until(rid, states, timeout=60):
    deadline = time.monotonic() + timeout
    st = None
    while time.monotonic() < deadline:
        st = await Workflow.status(rid)
        if st is not None and st.state in states:
            return st
        await asyncio.sleep(0.1)
    raise AssertionError(f"run {rid} never reached {states}: {st}")


def shown(st):
    return {
        "state": st.state,
        "result": st.result,
        "error": st.error,
        "steps": [[s.name, s.kind, s.state, s.attempts, s.result_size] for s in st.steps],
    }


def request(body):
    init = {
        "method": "POST",
        "headers": {"authorization": "Bearer wf-secret", "content-type": "application/json"},
        "body": body,
    }
    return js.Request.new(
        "https://worker.example/dispatch", to_js(init, dict_converter=js.Object.fromEntries)
    )


result = {}
try:
    import json

    await worker.get_app()
    await ensure_queue_tables(app, "database")
    recipes.reset()
    signup = await Workflow.start(recipes.signup, email="ada@example.com", id="mf-signup")
    paid = await Workflow.start(recipes.payment, order_id="A-1", cents=1200, id="mf-pay-1")
    paid2 = await Workflow.start(recipes.payment, order_id="A-2", cents=900, id="mf-pay-2")
    imported = await Workflow.start(recipes.import_file, source="c.csv", chunks=4, id="mf-import")

    sleeping = await until(signup, {"sleeping"})
    result["signup_sleeping"] = {"resume_in": sleeping.resume_at - time.time()}
    shift[0] = 2 * 86400 + 1  # two days later
    await recipes.signup.pending({"run": signup}).dispatch()

    await until(paid, {"waiting"})
    body = json.dumps({"event": "paid", "run": paid, "payload": {"amount": 1200}})
    response = await worker.fetch(request(body), env)
    result["fetch"] = {"status": response.status, "body": json.loads(str(response.body))}
    await until(paid2, {"waiting"})
    result["send_event"] = await worker.send_event(paid2, "paid", {"amount": 900})

    runs = {"signup": signup, "payment": paid, "payment2": paid2, "import": imported}
    result["runs"] = {
        k: shown(await until(rid, {"done", "failed", "cancelled"})) for k, rid in runs.items()
    }
    deadline = time.monotonic() + 30
    while recipes.CALLS["receipt"] < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)  # stray redeliveries (there should be none) show up here
    result["calls"] = dict(recipes.CALLS)
    rows = to_py(await H.read("SELECT key FROM haze_cache WHERE key LIKE 'haze:wf:mf-%'"))
    result["d1_keys"] = len(rows)
except BaseException:
    result["error"] = traceback.format_exc()
result  # noqa: B018 - the harness prints the last expression
