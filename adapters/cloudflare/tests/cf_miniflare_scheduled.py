# Runs INSIDE real Pyodide under tests/cloudflare/miniflare-harness.mjs, not under pytest.
#
# The Cron Trigger path end to end on Miniflare/workerd: the harness fires the consumer
# Worker's scheduled() through /cdn-cgi/handler/scheduled?cron=…&time=… (what
# `wrangler dev --test-scheduled` serves); the JS Worker relays controller.cron and
# controller.scheduledTime to haze_cloudflare.QueueWorker.scheduled() here, which claims
# the tick in the real local D1 and sends the jobs to the real local queue; workerd
# delivers them back through queue(). The last expression is printed as JSON.
# ruff: noqa: F704
import asyncio
import traceback

import js
from haze import (
    App,
    JobContext,
    define_cache_config,
    define_database_config,
    define_job,
    define_queue_config,
    schedule,
)
from haze_cloudflare import QueueWorker
from haze_cloudflare._js import to_py
from pyodide.ffi import create_proxy

H = js.cfHarness
env = H.env

app = App(
    queue=define_queue_config(
        default="cloudflare",
        connections={"cloudflare": {"driver": "cloudflare", "binding": "QUEUE"}},
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
runs = []
fired = []


@define_job()
async def cf_mf_tick(payload: dict, job: JobContext) -> None:
    runs.append([payload["kind"], (job.message.meta or {}).get("fire_at")])


schedule(cf_mf_tick.with_({"kind": "paris"}), cron="30 9 * * *", tz="Europe/Paris", name="paris")
schedule(cf_mf_tick.with_({"kind": "hourly"}), cron="30 * * * *", name="hourly")
schedule(cf_mf_tick.with_({"kind": "quarter"}), every="15m", name="quarter")


async def handle_batch(batch):
    await worker.queue(batch, env, None)


async def handle_scheduled(controller):
    fired.append(
        {"cron": str(controller.cron), "names": list(await worker.scheduled(controller, env, None))}
    )


H.setHandler(create_proxy(handle_batch))
H.setScheduledHandler(create_proxy(handle_scheduled))

MS = {  # scheduledTime values, ms since the epoch
    "2026-07-01T07:30:00Z": 1782891000000,
    "2026-07-01T08:30:00Z": 1782894600000,
    "2026-12-01T08:45:00Z": 1796114700000,
}

result = {}
try:
    await worker.get_app()
    answers = []
    for cron, at in (
        ("30 * * * *", "2026-07-01T07:30:00Z"),
        ("30 * * * *", "2026-07-01T07:30:00Z"),  # delivered twice: claimed in D1
        ("30 * * * *", "2026-07-01T08:30:00Z"),
        ("*/15 * * * *", "2026-12-01T08:45:00Z"),
    ):
        answers.append(to_py(await H.trigger(cron, MS[at])))
    for _ in range(100):
        if len(runs) >= 4:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)  # a duplicate, if any, would show up
    result = {"answers": answers, "fired": fired, "runs": runs}
except BaseException:
    result = {"error": traceback.format_exc()}
result  # noqa: B018 - the harness prints the last expression
