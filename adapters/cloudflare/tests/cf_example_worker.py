# Runs INSIDE real Pyodide under tests/cloudflare/miniflare-harness.mjs, not under pytest.
#
# test_example_worker.py builds examples/ with `haze build --preset cloudflare`, installs
# the output (the vendored haze and haze_cloudflare, and src/ as the Worker's modules)
# and prepends WRANGLER (the generated dist/wrangler.json). This script is the Worker as
# workerd would run it, given only what wrangler.json declares: an env whose QUEUE and
# DB are Miniflare's real Queue producer and D1 bindings and whose vars are the
# wrangler.json vars (JS properties of env, never os.environ), plus the HAZE_HTTP_SECRET
# secret. It applies the app's migrations to D1 (what `wrangler d1 migrations apply`
# does), dispatches through fetch() and from the Worker's own code, lets the real queue
# deliver to Default.queue(), and reads back what the jobs left in D1.
# ruff: noqa: F704, F821, E402, ASYNC230
import asyncio
import json
import os
import sys
import traceback

import js
from pyodide.code import run_js
from pyodide.ffi import create_proxy, to_js

H = js.cfHarness
SECRET = "example-secret"
variables = {**WRANGLER["vars"], "HAZE_HTTP_SECRET": SECRET}
env = run_js("(e, v) => Object.assign({}, e, v)")(
    H.env, to_js(variables, dict_converter=js.Object.fromEntries)
)

import entry
from haze import Queue
from haze._app.app import run_in_app
from haze._app.config import env_source
from haze_cloudflare._js import env_vars, to_py


async def read(sql):
    return to_py(await H.read(sql))


async def apply_migrations():
    """Each statement of database/migrations/*.sql, in name order, on the D1 binding."""
    folder = os.path.join(entry.APP_ROOT, "database", "migrations")
    applied = []
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name)) as f:
            text = "\n".join(
                line for line in f.read().splitlines() if not line.lstrip().startswith("--")
            )
        for statement in (s.strip() for s in text.split(";")):
            if statement:
                await H.env.DB.prepare(statement).run()
        applied.append(name)
    return applied


async def handle_batch(batch):
    # a new Worker instance per delivery, as workerd makes one per invocation
    await entry.Default(None, env).queue(batch, env, None)


H.setHandler(create_proxy(handle_batch))


async def post(job, payload):
    body = json.dumps({"job": job, "payload": payload})
    init = {"method": "POST", "headers": {"authorization": f"Bearer {SECRET}"}, "body": body}
    request = js.Request.new(
        "https://haze-example.example/", to_js(init, dict_converter=js.Object.fromEntries)
    )
    response = await entry.Default(None, env).fetch(request, env)
    return {"status": response.status, "answer": response.json()}


async def main():
    out = {"migrations": await apply_migrations()}
    # fetch(): the first invocation boots the app from its config files and the vars
    out["fetch"] = [
        await post("sync_feed", {"feed_id": 1}),
        await post("sync_feed", {"feed_id": 1}),  # unique: skipped while the first waits
        await post("charge_card", {"card": "4000-0000-0000-0002"}),
    ]
    worker = entry.Default(None, env)
    app = await worker.get_app()
    out["app"] = {
        "default": app.queue_config.default,
        "database": type(app.database("main")).__name__,
        "lock_store": type(app.queue_store).__name__,
        "batch_store": type(app.batch_store).__name__,
    }

    # the Worker's own code (as in a handler of its own), inside its vars: a chain, whose
    # links are dispatched from inside the jobs, and a batch whose then() callback is
    from app.job.feeds import sync_feed  # noqa: F401  (registered by the app's discovery)
    from app.job.imports import import_finished, import_rows
    from app.job.media import notify_author, publish_post, resize_image

    async def dispatch_more():
        chain = await Queue.chain(
            [
                resize_image.with_({"post_id": 7}),
                publish_post.with_({"post_id": 7}),
                notify_author.with_({"post_id": 7}),
            ]
        ).dispatch()
        batch = await (
            Queue.batch([import_rows.with_({"row": i}) for i in range(4)])
            .name("customers.csv")
            .then(import_finished.with_({"name": "customers.csv"}))
            .dispatch()
        )
        return {"chain": chain.chain_id, "batch": batch.id}

    with env_source(env_vars(env)):
        out["dispatched"] = await run_in_app(app, dispatch_more)

    wanted = {"sync_feed", "resize_image", "publish_post", "notify_author", "import_finished"}
    for _ in range(1200):  # up to 2 minutes on a loaded machine
        outcomes = await read("SELECT job, attempt, what FROM outcomes ORDER BY id")
        failed = await read("SELECT uuid, connection, queue, payload, exception FROM failed_jobs")
        if wanted <= {o["job"] for o in outcomes} and failed:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)  # let stray redeliveries (there should be none) show up
    out["outcomes"] = await read("SELECT job, attempt, what FROM outcomes ORDER BY id")
    out["failed_jobs"] = [
        {**f, "payload": json.loads(f["payload"])}
        for f in await read("SELECT uuid, connection, queue, payload, exception FROM failed_jobs")
    ]
    out["haze_cache_keys"] = [r["key"] for r in await read("SELECT key FROM haze_cache")]
    with env_source(env_vars(env)):

        async def batch_state():
            found = await Queue.find_batch(out["dispatched"]["batch"])
            return (
                None
                if found is None
                else {
                    "total": found.total,
                    "pending": found.pending,
                    "failed": found.failed,
                    "finished": found.finished,
                }
            )

        out["batch"] = await run_in_app(app, batch_state)
    out["modules"] = {
        "sqlite": "haze.connectors.sqlite" in sys.modules or "sqlite3" in sys.modules,
        "os_environ": sorted(k for k in WRANGLER["vars"] if k in os.environ),
    }
    return out


try:
    result = await main()
except BaseException:
    result = {"error": traceback.format_exc()}
result  # noqa: B018 - the harness prints the last expression
