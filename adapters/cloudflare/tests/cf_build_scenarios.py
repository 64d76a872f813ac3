# Runs INSIDE real Pyodide (node tests/pyodide/run.mjs), not under pytest.
#
# test_build_cloudflare.py prepends SIM_JS (cf_queue_sim.js) and CONSUMER (the consumer
# entry of the generated dist/wrangler.json) and runs this file with three wheels made
# from the build output loaded: haze and haze_cloudflare (the vendored copies under
# dist/cloudflare/src/) and the app (entry.py, config/, app/ of dist/cloudflare/src/).
# It imports the generated entry, checks what it is, and drives Default.queue() with
# MessageBatch objects that are real JS objects (cf_queue_sim.js), the queue configured
# as the generated consumer says (max_retries, dead-letter queue, batch size).
# The last expression (a dict of outcomes) is printed as JSON.
# ruff: noqa: F821, E402, F704
import asyncio
import json
import os
import sys
import traceback

import js
from pyodide.code import run_js
from pyodide.ffi import to_js

run_js(SIM_JS)
sim = js.cfSim

import entry
import haze
import haze_cloudflare
from haze import Queue
from haze._jobs.definition import get_job
from haze_cloudflare import QueueWorker
from haze_cloudflare._js import is_nullish


def jsonable(x):
    x = x.to_py() if hasattr(x, "to_py") else x
    return json.loads(json.dumps(x, default=lambda o: None))


dlq = sim.SimQueue.new(CONSUMER["dead_letter_queue"])
opts = {"maxRetries": CONSUMER["max_retries"], "deadLetter": dlq}
q = sim.SimQueue.new(CONSUMER["queue"], to_js(opts, dict_converter=js.Object.fromEntries))
kv = sim.SimKV.new()
env = run_js("(q, kv) => ({QUEUE: q, KV: kv})")(q, kv)
haze_cloudflare.bind_env(env)  # the scenario's own dispatches go through the binding


async def pump(limit=200):
    """Deliver batches like Cloudflare (a new Worker instance each) until the queue is empty."""
    outcomes = []
    for _ in range(limit):
        batch = q.nextBatch(CONSUMER["max_batch_size"])
        if is_nullish(batch):
            wait = q.nextIn()
            if wait < 0:
                return outcomes
            await asyncio.sleep(wait / 1000 + 0.002)
            continue
        threw = False
        worker = entry.Default(None, env)
        try:
            await worker.queue(batch, env, None)
            outcomes.extend(worker.outcomes)
        except Exception:
            threw = True
            traceback.print_exc()
        q.settle(batch, threw)
    raise RuntimeError("the queue did not drain")


async def main():
    worker = entry.Default(None, env)
    app = await worker.get_app()
    ids = {
        "ok": await get_job("bld_cf_ok").dispatch({"key": "a"}),
        "flaky": await get_job("bld_cf_flaky").dispatch({"key": "f", "ok_at": 3}),
        "dead": await get_job("bld_cf_dead").dispatch({"key": "d"}),
    }
    sends = jsonable(q.sends)
    outcomes = await pump()
    jobs = sys.modules["app.job.bld_cf_jobs"]
    failed = [
        {"id": f.id, "name": f.name, "exception": f.exception, "connection": f.connection}
        for f in await Queue.failed()
    ]
    return {
        "environment": {
            "platform": sys.platform,
            "haze_file": haze.__file__,
            "adapter_file": haze_cloudflare.__file__,
            "entry_file": entry.__file__,
            "app_root": entry.APP_ROOT,
            "entry_dir": os.path.dirname(entry.__file__),
            "is_queue_worker": issubclass(entry.Default, QueueWorker),
            "default_mro": [f"{c.__module__}.{c.__qualname__}" for c in entry.Default.__mro__],
            "app_root_used": str(app.root),
            "config_source": app.queue_config.source,
            "jobs_file": jobs.__file__,
        },
        "ids": ids,
        "sends": sends,
        "calls": jsonable(q.calls),
        "runs": list(jobs.RUNS),
        "outcomes": outcomes,
        "failed": failed,
        "dead": jsonable(q.dead),
        "dlq": jsonable(dlq.sends),
        "size": q.size,
    }


await main()
