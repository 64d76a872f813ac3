# Runs INSIDE real Pyodide (node tests/pyodide/run.mjs), not under pytest.
#
# test_cf_scheduled.py prepends SIM_JS (cf_queue_sim.js) and runs this file with the
# haze, haze_cloudflare, cronsim, tzdata and cf_sched_app wheels loaded. The generated
# entry's scheduled() gets a JS controller object ({cron, scheduledTime, type}) as
# Cloudflare passes it; the dispatched messages land on the simulated Queue binding and
# are then delivered to queue(). The last expression is printed as JSON.
# ruff: noqa: F821, E402
import asyncio
import json
import traceback

import js
from pyodide.code import run_js
from pyodide.ffi import to_js

run_js(SIM_JS)
sim = js.cfSim

import haze_cloudflare
from cf_sched_app.entry import Default
from haze._orchestration.scheduling import platform_triggers
from haze_cloudflare._js import is_nullish

worker = Default(None, None)


def new_env():
    opts = to_js({"maxRetries": 3}, dict_converter=js.Object.fromEntries)
    q = sim.SimQueue.new("cf-sched-jobs", opts)
    kv = sim.SimKV.new()
    env = run_js("(q, kv) => ({QUEUE: q, KV: kv})")(q, kv)
    haze_cloudflare.bind_env(env)
    return env, q


def controller(cron, iso):
    ms = run_js(f"Date.parse({json.dumps(iso)})")
    make = run_js("(cron, t) => ({cron: cron, scheduledTime: t, type: 'scheduled'})")
    return make(cron, ms)


def sent(q):
    out = []
    for s in json.loads(js.JSON.stringify(q.sends)):
        body = s["body"]
        out.append([body["payload"]["kind"], (body.get("meta") or {}).get("fire_at")])
    return out


async def pump(env, q):
    for _ in range(50):
        batch = q.nextBatch(10)
        if is_nullish(batch):
            return
        await worker.queue(batch, env, None)
        q.settle(batch, False)


async def scheduled():
    env, q = new_env()
    fired = {}
    # 07:30 UTC on 1 July is 09:30 in Paris (CEST): "paris" and "hourly" share the trigger.
    fired["summer"] = list(
        await worker.scheduled(controller("30 * * * *", "2026-07-01T07:30:00Z"), env, None)
    )
    # The same trigger delivered again: claimed in KV, nothing dispatched twice.
    fired["again"] = list(
        await worker.scheduled(controller("30 * * * *", "2026-07-01T07:30:00Z"), env, None)
    )
    # 08:30 UTC is 10:30 in Paris: only "hourly".
    fired["later"] = list(
        await worker.scheduled(controller("30 * * * *", "2026-07-01T08:30:00Z"), env, None)
    )
    # In winter (CET) 09:30 in Paris is 08:30 UTC.
    fired["winter"] = list(
        await worker.scheduled(controller("30 * * * *", "2026-12-01T08:30:00Z"), env, None)
    )
    fired["quarter"] = list(
        await worker.scheduled(controller("*/15 * * * *", "2026-12-01T08:45:00Z"), env, None)
    )
    fired["unknown"] = list(
        await worker.scheduled(controller("5 4 * * *", "2026-12-01T04:05:00Z"), env, None)
    )
    sends = sent(q)
    await pump(env, q)
    from app.job.cf_sched_jobs import ran

    return {"fired": fired, "sends": sends, "ran": [list(r) for r in ran], "left": q.size}


results = {}
try:
    results["triggers"] = {"ok": True, "value": platform_triggers("cloudflare")}
    value = await asyncio.wait_for(scheduled(), 30)  # noqa: F704 - top-level await
    results["scheduled"] = {"ok": True, "value": value}
except BaseException:
    results["scheduled"] = {"ok": False, "error": traceback.format_exc()}
results  # noqa: B018 - run.mjs prints the last expression
