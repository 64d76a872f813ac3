# Runs INSIDE real Pyodide under tests/cloudflare/miniflare-harness.mjs, not under pytest.
#
# Offload to R2 through the Worker's R2 binding (env.R2 is Miniflare's real local R2
# bucket): a 5 MiB payload dispatched here goes to R2 and its message to the real local
# queue; workerd delivers it to haze_cloudflare.QueueWorker.queue(), which reads the
# object back, runs the job and deletes the object after the ack. A tampered object fails
# its job ("checksum mismatch"); a failed job keeps its object. The store's own calls
# (put/get/delete/objects) run on the binding directly, and Cloudflare Queues' message cap
# is probed on Miniflare's queue. The last expression (a dict) is printed as JSON.
# ruff: noqa: F704
import asyncio
import hashlib
import time
import traceback

import js
from haze import App, JobContext, Queue, define_database_config, define_job, define_queue_config
from haze.connectors.migrations import ensure_queue_tables
from haze.driver_api import ObjectStore
from haze.offload import object_store
from haze_cloudflare import QueueWorker
from haze_cloudflare._js import to_js
from pyodide.ffi import create_proxy

H = js.cfHarness
env = H.env
URL = "r2://R2/haze-payloads"
FIVE_MIB = 5 * 1024 * 1024
NAMES = {"cf_r2_big", "cf_r2_fails"}

app = App(
    queue=define_queue_config(
        default="cloudflare",
        connections={
            "cloudflare": {
                "driver": "cloudflare",
                "binding": "QUEUE",
                "failed_store": "main",
                "offload": {"to": URL},  # over: the driver's cap (128 KB)
            },
            # the same queue without offload: a body over the cap is refused at dispatch
            "plain": {"driver": "cloudflare", "binding": "QUEUE", "failed_store": "main"},
            "database": {"driver": "database", "connection": "main", "queues": ["default"]},
        },
    ),
    database=define_database_config(
        default="main",
        connections={"main": {"url": "d1://local/haze-d1", "options": {"binding": "DB"}}},
    ),
)


class Default(QueueWorker):
    haze_app = app


worker = Default(None, env)
runs = []
seen_objects = []


@define_job()
async def cf_r2_big(payload: dict, job: JobContext) -> None:
    data = payload["b"].encode()
    seen_objects.append(sorted([o.key async for o in object_store(URL).objects()]))
    runs.append({"key": payload["key"], "len": len(data), "sha": hashlib.sha256(data).hexdigest()})


@define_job(tries=1)
async def cf_r2_fails(payload: dict, job: JobContext) -> None:
    runs.append({"key": payload["key"], "len": len(payload["b"])})
    raise RuntimeError("this job fails")


async def handle_batch(batch):
    await worker.queue(batch, env, None)


H.setHandler(create_proxy(handle_batch))


async def listed(prefix="haze-payloads/"):
    """Keys in the bucket, read through the binding directly (not through haze)."""
    found = await env.R2.list(to_js({"prefix": prefix}))
    return sorted(str(o.key) for o in found.objects)


async def until(check, seconds=60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not check():
        await asyncio.sleep(0.1)


async def store_calls():
    store = object_store(URL)
    out = {"is_store": isinstance(store, ObjectStore), "type": type(store).__name__}
    await store.put("probe.1", b"\x00\xffbytes")
    out["get"] = list(await store.get("probe.1"))
    out["missing"] = await store.get("nope")
    listing = [o async for o in store.objects()]
    out["objects"] = [o.key for o in listing]
    out["modified_age"] = time.time() - listing[0].modified
    out["raw_keys"] = await listed("")
    await store.delete("probe.1")
    await store.delete("probe.1")  # twice: no error
    out["after_delete"] = await store.get("probe.1")
    return out


async def queue_cap():
    """What Miniflare's queue accepts: Cloudflare documents 128 KB per message."""
    out = {}
    for size in (128_000, 128_001, 128 * 1024):
        try:
            await env.QUEUE.send("x" * size, to_js({"contentType": "text"}))
            out[str(size)] = "sent"
        except Exception as e:
            out[str(size)] = str(e)[:200]
    return out


result = {}
try:
    await worker.get_app()
    await ensure_queue_tables(app, "database")
    result["store"] = await store_calls()
    big = "x" * FIVE_MIB
    result["big_sha"] = hashlib.sha256(big.encode()).hexdigest()
    await cf_r2_big.dispatch({"key": "big", "b": big})
    await until(lambda: any(r["key"] == "big" for r in runs))
    await asyncio.sleep(1)  # the delete after the ack
    result["after_big"] = await listed()

    # tampered: dispatched late enough to change the object before delivery
    await cf_r2_big.dispatch({"key": "tampered", "b": big}, delay=2)
    (key,) = await listed()
    await env.R2.put(key, to_js(b"y" * FIVE_MIB))
    result["tampered_key"] = key

    await cf_r2_fails.dispatch({"key": "fails", "b": "z" * 200_000})
    await until(lambda: any(r["key"] == "fails" for r in runs))
    failed = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and {f.name for f in failed} != NAMES:
        failed = await Queue.failed()
        await asyncio.sleep(0.2)
    await asyncio.sleep(1)
    result["failed"] = [{"name": f.name, "exception": f.exception} for f in failed]
    result["after_all"] = await listed()
    result["runs"] = runs
    result["seen_objects"] = seen_objects
    # between Cloudflare's 128,000 bytes and 128 KiB (131,072): offloaded by default,
    # refused by haze (naming the cap) without offload, never by the queue's own error
    mid = "m" * 129_500
    await cf_r2_big.dispatch({"key": "mid", "b": mid})
    await until(lambda: any(r["key"] == "mid" for r in runs))
    try:
        await cf_r2_big.with_({"key": "mid-plain", "b": mid}).on_connection("plain").dispatch()
        result["mid_plain"] = "sent"
    except Exception as e:
        result["mid_plain"] = f"{type(e).__name__}: {e}"
    result["runs"] = runs
    # last: what it sends is no haze message, and fails into failed jobs when delivered
    result["cap"] = await queue_cap()
except BaseException:
    result["error"] = traceback.format_exc()
result  # noqa: B018 - the harness prints the last expression
