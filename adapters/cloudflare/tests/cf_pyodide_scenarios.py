# Runs INSIDE real Pyodide (node tests/pyodide/run.mjs), not under pytest.
#
# test_cf_pyodide.py prepends SIM_JS (the JavaScript source of cf_queue_sim.js) and runs
# this file with the haze, haze_cloudflare and cf_pyo_app wheels loaded. Every scenario
# drives the generated entry (cf_pyo_app.entry.Default, a QueueWorker) with MessageBatch
# objects that are real JS objects: message.body is a JS object, message.attempts a JS
# number, message.ack()/retry() JS functions (retry receives {delaySeconds} from
# Pyodide's keyword-argument convention). Producers call the JS Queue binding's
# send/sendBatch; the KV store and the failed store use the JS KV stand-in.
# The last expression (a dict of scenario outcomes) is printed as JSON.
# ruff: noqa: F821, E402
import _thread
import asyncio
import json
import logging
import sys
import threading
import time
import traceback

thread_starts = []


def _guard(name, real):
    def wrapper(*args, **kwargs):
        thread_starts.append(name)
        return real(*args, **kwargs)

    return wrapper


_thread.start_new_thread = _guard("_thread.start_new_thread", _thread.start_new_thread)
if hasattr(_thread, "start_joinable_thread"):
    _thread.start_joinable_thread = _guard(
        "_thread.start_joinable_thread", _thread.start_joinable_thread
    )
threading.Thread.start = _guard("threading.Thread.start", threading.Thread.start)

import js
from pyodide.code import run_js
from pyodide.ffi import to_js

run_js(SIM_JS)
sim = js.cfSim

import haze
import haze_cloudflare
from cf_pyo_app import state
from cf_pyo_app.entry import Default
from haze import Queue
from haze._base.errors import DelayTooLongError, PayloadTooLargeError
from haze._jobs.definition import get_job
from haze_cloudflare._js import is_nullish


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(f"{record.name}: {record.getMessage()}")


captured = _Capture()
logging.getLogger("haze").addHandler(captured)


def new_env(max_retries=3, dead_letter=None, secret="s3cret"):
    opts = {"maxRetries": max_retries}
    if dead_letter is not None:
        opts["deadLetter"] = dead_letter
    q = sim.SimQueue.new("cf-pyo-jobs", to_js(opts, dict_converter=js.Object.fromEntries))
    kv = sim.SimKV.new()
    make = run_js(
        "(q, kv, s) => (s ? {QUEUE: q, KV: kv, HAZE_HTTP_SECRET: s} : {QUEUE: q, KV: kv})"
    )
    env = make(q, kv, secret)
    haze_cloudflare.bind_env(env)  # for dispatches made by the scenario itself
    return env, q, kv


worker = Default(None, None)


async def pump(env, q, max_batch=10, limit=400):
    """Deliver batches like Cloudflare until the queue is empty (waiting out delays)."""
    for _ in range(limit):
        batch = q.nextBatch(max_batch)
        if is_nullish(batch):  # JS null arrives as jsnull
            wait = q.nextIn()
            if wait < 0:
                return
            await asyncio.sleep(wait / 1000 + 0.002)
            continue
        threw = False
        try:
            await worker.queue(batch, env, None)
        except Exception:
            threw = True
            traceback.print_exc()
        q.settle(batch, threw)
    raise RuntimeError("the queue did not drain")


def py(x):
    return x.to_py() if hasattr(x, "to_py") else x


def jsonable(x):
    return json.loads(json.dumps(py(x), default=lambda o: None))


def runs(name):
    return [r for r in state.runs if r[0] == name]


async def success_and_boundary():
    env, q, _ = new_env()
    await worker.get_app()
    payload = {"key": "a", "none": None, "nested": {"l": [1, None, 2.5], "s": "é", "t": True}}
    job_id = await get_job("cf_pyo_ok").dispatch(payload)
    sends = jsonable(q.sends)
    await pump(env, q)
    return {
        "id": job_id,
        "sends": sends,
        "calls": jsonable(q.calls),
        "runs": runs("ok"),
        "size": q.size,
        "outcomes": list(worker.outcomes),
    }


async def retry_backoff():
    env, q, _ = new_env()
    await get_job("cf_pyo_flaky").dispatch({"key": "f", "ok_at": 3})
    await pump(env, q)
    return {"calls": jsonable(q.calls), "runs": runs("flaky"), "size": q.size}


async def release():
    env, q, _ = new_env()
    job_id = await get_job("cf_pyo_release").dispatch({"key": "r"})
    await pump(env, q)
    return {
        "id": job_id,
        "calls": jsonable(q.calls),
        "sends": jsonable(q.sends),
        "runs": runs("release"),
        "size": q.size,
    }


async def final_failure():
    env, q, _ = new_env()
    job_id = await get_job("cf_pyo_dead").dispatch({"key": "d"})
    await pump(env, q)
    failed = await Queue.failed()
    listed = [
        {
            "id": f.id,
            "name": f.name,
            "payload": f.payload,
            "exception": f.exception,
            "connection": f.connection,
        }
        for f in failed
    ]
    retried = await Queue.retry(job_id)
    after = await Queue.failed()
    return {
        "id": job_id,
        "calls": jsonable(q.calls),
        "runs": runs("dead"),
        "failed": listed,
        "failed_calls": list(state.failed_calls),
        "retried": retried,
        "after_retry": [f.id for f in after],
        "resent": jsonable(q.sends)[-1],
        "outcomes": list(worker.outcomes),
    }


async def dead_letter():
    dlq = sim.SimQueue.new("cf-pyo-dlq")
    env, q, _ = new_env(max_retries=1, dead_letter=dlq)
    job_id = await get_job("cf_pyo_many").dispatch({"key": "m"})
    await pump(env, q)
    return {
        "id": job_id,
        "calls": jsonable(q.calls),
        "runs": runs("many"),
        "dead": jsonable(q.dead),
        "dlq": jsonable(dlq.sends),
        "failed": [f.id for f in await Queue.failed()],
    }


async def limits():
    _env, q, _ = new_env()
    ok = get_job("cf_pyo_ok")
    await ok.dispatch({"key": "late"}, delay=30)
    await ok.dispatch({"key": "max"}, delay="12h")
    errors = {}
    try:
        await ok.dispatch({"key": "too-late"}, delay="13h")
    except DelayTooLongError as e:
        errors["delay"] = str(e)
    try:
        await ok.dispatch({"key": "big", "blob": "x" * 140_000})
    except PayloadTooLargeError as e:
        errors["size"] = str(e)
    return {"sends": jsonable(q.sends), "errors": errors}


async def bulk():
    env, q, _ = new_env()
    ok = get_job("cf_pyo_ok")
    ids = await Queue.bulk([ok.with_({"key": f"b{i}"}) for i in range(120)])
    batch_calls = jsonable(q.batchCalls)
    sends = jsonable(q.sends)
    await pump(env, q, max_batch=100)
    ran = [r[1] for r in runs("ok") if str(r[1]).startswith("b")]
    return {
        "ids": ids,
        "batch_calls": batch_calls,
        "vias": sorted({s["via"] for s in sends}),
        "body_ids": [s["body"]["id"] for s in sends],
        "ran": ran,
        "size": q.size,
    }


async def chain():
    env, q, _ = new_env()
    ok = get_job("cf_pyo_ok")
    result = await Queue.chain(
        [ok.with_({"key": "c1"}), ok.with_({"key": "c2"}), ok.with_({"key": "c3"})]
    ).dispatch()
    await pump(env, q)
    ran = [r[1] for r in runs("ok") if str(r[1]).startswith("c")]
    return {"chain_id": result.chain_id, "ran": ran, "sends": len(jsonable(q.sends))}


async def batch():
    env, q, _ = new_env()
    ok = get_job("cf_pyo_ok")
    b = await (
        Queue.batch([ok.with_({"key": f"x{i}"}) for i in range(3)])
        .name("import")
        .then(ok.with_({"key": "then"}))
        .finally_(ok.with_({"key": "finally"}))
        .dispatch()
    )
    await pump(env, q)
    fresh = await b.fresh()
    ran = [r[1] for r in runs("ok") if str(r[1]).startswith(("x", "then", "finally"))]
    return {
        "ran": ran,
        "finished": fresh.finished,
        "processed": fresh.processed,
        "failed": fresh.failed,
        "progress": fresh.progress,
    }


async def unique():
    env, q, _ = new_env()
    u = get_job("cf_pyo_unique")
    first = await u.dispatch({"key": "u"})
    second = await u.dispatch({"key": "u"})
    skipped = await u.with_({"key": "u"}).dispatch()
    await pump(env, q)
    third = await u.dispatch({"key": "u"})
    await pump(env, q)
    return {
        "first": first,
        "second": second,
        "skipped": skipped.skipped,
        "third": third,
        "runs": runs("unique"),
    }


async def rate_limited_release():
    env, q, _ = new_env()
    lim = get_job("cf_pyo_limited")
    a = await lim.dispatch({"key": "l1"})
    b = await lim.dispatch({"key": "l2"})
    batch = q.nextBatch(10)
    await worker.queue(batch, env, None)
    q.settle(batch, False)
    return {
        "ids": [a, b],
        "runs": runs("limited"),
        "calls": jsonable(q.calls),
        "sends": jsonable(q.sends),
        "outcomes": list(worker.outcomes),
        "size": q.size,
    }


async def kv_lease():
    """KVStore.touch (limit_concurrency's lease renewal) on the KV stand-in."""
    from haze_cloudflare import bind_env
    from haze_cloudflare.kv import KVStore

    env, _, _ = new_env()
    bind_env(env)
    store = KVStore("kv", {"binding": "KV"})
    store._warned = True  # the app's own KV store logs the one warning another test counts
    taken = await store.add("slot:0", "run-1", 30)
    other = await store.touch("slot:0", "run-2", 600)
    ttl_after_other = await store.ttl("slot:0")
    own = await store.touch("slot:0", "run-1", 600)
    ttl_after_own = await store.ttl("slot:0")
    absent = await store.touch("slot:9", "run-1", 600)
    return {
        "taken": taken,
        "other": other,
        "ttl_after_other": ttl_after_other,
        "own": own,
        "ttl_after_own": ttl_after_own,
        "absent": absent,
        "holder": await store.get("slot:0"),
    }


async def kv_batch_list():
    """KVStore.settle_batch_job lists the first ``keep`` jobs it counts (the dashboard's
    batch page), as the atomic stores do."""
    from haze_cloudflare import bind_env
    from haze_cloudflare.kv import KVStore

    env, _, _ = new_env()
    bind_env(env)
    store = KVStore("kv", {"binding": "KV"})
    store._warned = True
    b = "haze:batch:kvlist"
    await store.put(f"{b}:pending", 3, 60)
    await store.settle_batch_job(b, "j1", "done", ttl=60, keep=2)
    await store.settle_batch_job(b, "j1", "done", ttl=60, keep=2)
    await store.settle_batch_job(b, "j2", "failed", ttl=60, keep=2)
    await store.settle_batch_job(b, "j3", "done", ttl=60, keep=2)
    return {
        "jobs": await store.get(f"{b}:jobs"),
        "listed": await store.get_many([f"{b}:jobs:1", f"{b}:jobs:2", f"{b}:jobs:3"]),
    }


async def undecodable():
    env, q, _ = new_env()
    bad = q.inject("this is not JSON", "text")
    unknown = q.inject(
        to_js(
            {"v": 1, "id": "nobody-1", "job": "cf_pyo_no_such_job", "payload": {}},
            dict_converter=js.Object.fromEntries,
        )
    )
    await pump(env, q)
    failed = {f.id: f.exception for f in await Queue.failed()}
    return {
        "bad": bad,
        "unknown": unknown,
        "calls": jsonable(q.calls),
        "failed": failed,
        "outcomes": list(worker.outcomes),
    }


async def not_json_bodies():
    """Bodies another producer sent with the default v8 content type: a Date reaches
    Python as its ISO string (as workerd delivers it), so a lone Date is not JSON text
    and a Date inside a payload runs as a string; a RegExp stays a JS object that has
    no JSON form."""
    env, q, _ = new_env()
    date = q.inject(run_js("new Date(0)"), "v8")
    nested = q.inject(
        run_js("({v: 1, id: 'x', job: 'cf_pyo_ok', payload: {key: 're', re: /a+/}})"), "v8"
    )
    dated = q.inject(
        run_js("({v: 1, id: 'd1', job: 'cf_pyo_ok', payload: {key: 'dated', when: new Date(0)}})"),
        "v8",
    )
    before = {f.id for f in await Queue.failed()}
    await pump(env, q)
    failed = [
        {"id": f.id, "exception": f.exception, "payload": f.payload}
        for f in await Queue.failed()
        if f.id not in before
    ]
    return {
        "date": date,
        "nested": nested,
        "dated": dated,
        "dated_runs": [r[3] for r in runs("ok") if r[1] == "dated"],
        "calls": jsonable(q.calls),
        "failed": failed,
        "outcomes": list(worker.outcomes),
        "size": q.size,
        "dead": jsonable(q.dead),
    }


VARS_APP = "/tmp/cf_vars_app"
VARS_FILES = {
    "config/queue.py": """
from haze import define_queue_config, env

config = define_queue_config(
    default=env("QUEUE_CONNECTION", "memory"),
    connections={
        "memory": {"driver": "memory"},
        "cloudflare": {"driver": "cloudflare", "binding": "QUEUE", "failed_store": "kv"},
    },
    store="kv",
)
""",
    "config/cache.py": """
from haze import define_cache_config

config = define_cache_config(default="kv", stores={"kv": {"driver": "kv", "binding": "KV"}})
""",
    "app/job/vars_jobs.py": """
from haze import define_job, env

seen = []


@define_job()
async def cf_vars_probe(payload: dict) -> None:
    seen.append([payload["tag"], env("PROBE"), env("HAZE_ONLY_IN_ONE")])
""",
}


def write_vars_app():
    import os

    for rel, text in VARS_FILES.items():
        path = os.path.join(VARS_APP, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


async def worker_vars():
    """env() in config files and jobs reads the Worker's vars (JS properties of env, as
    workerd passes them), only for the invocation that carries them."""
    import os

    from haze import env as haze_env

    write_vars_app()

    class VarsWorker(Default.__mro__[1]):  # QueueWorker over the app written above
        app_root = VARS_APP

    def vars_env(q, kv, **vars):
        make = run_js("(q, kv, vars) => Object.assign({QUEUE: q, KV: kv}, vars)")
        return make(q, kv, to_js(vars, dict_converter=js.Object.fromEntries))

    q = sim.SimQueue.new("cf-vars", to_js({"maxRetries": 1}, dict_converter=js.Object.fromEntries))
    kv = sim.SimKV.new()
    env_a = vars_env(
        q,
        kv,
        QUEUE_CONNECTION="cloudflare",
        PROBE="a",
        HAZE_ONLY_IN_ONE="1",
        HAZE_HTTP_SECRET="s",
    )
    env_b = vars_env(q, kv, QUEUE_CONNECTION="cloudflare", PROBE="b", HAZE_HTTP_SECRET="s")
    worker_a = VarsWorker(None, env_a)
    body = json.dumps({"job": "cf_vars_probe", "payload": {"tag": "http"}})
    init = {"method": "POST", "headers": {"authorization": "Bearer s"}, "body": body}
    response = await worker_a.fetch(
        js.Request.new("https://w.example/", to_js(init, dict_converter=js.Object.fromEntries)),
        env_a,
    )
    app = await worker_a.get_app()
    sends_after_fetch = len(jsonable(q.sends))
    # the same message delivered twice at once, once per env: each run sees its own vars
    await get_job("cf_vars_probe").dispatch({"tag": "b"})
    first, second = q.nextBatch(1), q.nextBatch(1)
    if not (is_nullish(first) or is_nullish(second)):
        await asyncio.gather(
            VarsWorker(None, env_a).queue(first, env_a, None),
            VarsWorker(None, env_b).queue(second, env_b, None),
        )
    module = next(
        m for n, m in sys.modules.items() if n.endswith("vars_jobs") and hasattr(m, "seen")
    )
    return {
        "status": response.status,
        "default": app.queue_config.default,
        "sends_after_fetch": sends_after_fetch,
        "seen": sorted(module.seen),
        "outside": [haze_env("PROBE"), haze_env("QUEUE_CONNECTION", "unset")],
        "os_environ": "PROBE" in os.environ or "QUEUE_CONNECTION" in os.environ,
    }


async def fetch_dispatch():
    env, q, _ = new_env()
    body = json.dumps({"job": "cf_pyo_ok", "payload": {"key": "http"}, "delay": 5})

    def request(method="POST", token="s3cret", data=body, extra=None):
        headers = {"content-type": "application/json", **(extra or {})}
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        init = {"method": method, "headers": headers}
        if method == "POST":
            init["body"] = data
        return js.Request.new(
            "https://worker.example/dispatch", to_js(init, dict_converter=js.Object.fromEntries)
        )

    ok = await worker.fetch(request(), env)
    wrong_request, missing_request = request(token="nope"), request(token=None)
    wrong = await worker.fetch(wrong_request, env)
    missing = await worker.fetch(missing_request, env)
    get = await worker.fetch(request(method="GET"), env)
    unknown = await worker.fetch(
        request(data=json.dumps({"job": "cf_pyo_nope", "payload": {}})), env
    )
    from haze.integrations.http_dispatch import signed_headers

    signed = signed_headers(body.encode(), "s3cret")
    signed_ok = await worker.fetch(request(token=None, extra=signed), env)
    stale = signed_headers(body.encode(), "s3cret", timestamp=int(time.time()) - 301)
    signed_stale = await worker.fetch(request(token=None, extra=stale), env)
    untimed = {"x-haze-signature": signed["x-haze-signature"]}
    signed_untimed = await worker.fetch(request(token=None, extra=untimed), env)
    deep = '{"job": "cf_pyo_ok", "payload": ' + "[" * 200_000 + "]" * 200_000 + "}"
    too_deep = await worker.fetch(request(data=deep), env)
    env2, q2, _ = new_env(secret=None)
    disabled = await worker.fetch(request(), env2)
    return {
        "ok": [ok.status, ok.json()],
        "wrong": wrong.status,
        "missing": missing.status,
        "unread": [bool(wrong_request.bodyUsed), bool(missing_request.bodyUsed)],
        "get": get.status,
        "signed": [signed_ok.status, signed_stale.status, signed_stale.json()["error"]],
        "signed_untimed": [signed_untimed.status, signed_untimed.json()["error"]],
        "too_deep": [too_deep.status, too_deep.json()["error"]],
        "unknown": [unknown.status, unknown.json()],
        "disabled": [disabled.status, disabled.json()],
        "sends": jsonable(q.sends),
        "sends_disabled": jsonable(q2.sends),
    }


results = {}
for scenario in (
    success_and_boundary,
    retry_backoff,
    release,
    final_failure,
    dead_letter,
    limits,
    bulk,
    chain,
    batch,
    unique,
    rate_limited_release,
    kv_lease,
    kv_batch_list,
    undecodable,
    not_json_bodies,
    worker_vars,
    fetch_dispatch,
):
    try:
        value = await asyncio.wait_for(scenario(), 30)  # noqa: F704 - top-level await
        results[scenario.__name__] = {"ok": True, "value": value}
    except BaseException:
        results[scenario.__name__] = {"ok": False, "error": traceback.format_exc()}

starts = list(thread_starts)
try:
    threading.Thread(target=lambda: None).start()
except RuntimeError:
    pass
results["environment"] = {
    "ok": True,
    "value": {
        "platform": sys.platform,
        "haze_file": haze.__file__,
        "adapter_file": haze_cloudflare.__file__,
        "worker_bases": [c.__module__ + "." + c.__qualname__ for c in Default.__mro__],
        "thread_starts": starts,
        "guard_probe": thread_starts[len(starts) :],
        "threads": [t.name for t in threading.enumerate()],
        "warnings": list(captured.lines),
    },
}
results  # noqa: B018 - run.mjs prints the last expression
