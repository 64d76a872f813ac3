# Runs INSIDE real Pyodide under tests/cloudflare/miniflare-harness.mjs --workflows, not
# under pytest. test_cf_miniflare_native.py prepends RECIPES_SRC (tests/workflows/
# recipes.py, unchanged), FLOWS_SRC (cf_native_flows.py) and CLASSES (the built
# wrangler.json's workflows entries).
#
# What is real: Miniflare's local Workflows engine (wrangler@4.86.0, in workerd) runs
# the JS relay classes of tests/cloudflare/workflow-worker.mjs, one per built class; it
# keeps every step's result, retries steps with their retries config, sleeps, waits for
# events, replays run() after a pause/resume, and reports status. The step functions
# and the workflow's code are haze's (haze_cloudflare.workflows.HazeWorkflow.run with
# CloudflareStepEngine), run here in Pyodide. The model: RelayStep below stands for the
# Python Workflows SDK's `step` wrapper (do(name, config=) decorator, sleep,
# wait_for_event), which exists only in workerd's Python runtime (not loadable offline);
# every call it gets goes to the engine's real step and comes back as JSON.
# The last expression (a dict) is printed as JSON by the harness.
# ruff: noqa: F704, F821
import asyncio
import json
import sys
import time
import traceback
import types

import js
from haze import App, Workflow, define_cache_config, define_database_config, define_queue_config
from haze_cloudflare import QueueWorker, bind_env
from haze_cloudflare.workflows import HazeWorkflow
from pyodide.ffi import create_proxy

recipes = types.ModuleType("recipes")
exec(compile(RECIPES_SRC, "tests/workflows/recipes.py", "exec"), recipes.__dict__)
sys.modules["recipes"] = recipes
flows = types.ModuleType("cf_native_flows")
exec(compile(FLOWS_SRC, "cf_native_flows.py", "exec"), flows.__dict__)

H = js.cfHarness
env = H.env

app = App(
    queue=define_queue_config(
        default="cloudflare",
        connections={
            "cloudflare": {"driver": "cloudflare", "binding": "QUEUE", "workflows": "native"},
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

# The generated classes, as `haze build` writes them into src/entry.py.
GENERATED = {
    c["class_name"]: type(c["class_name"], (HazeWorkflow,), {"workflow": c["name"]})
    for c in CLASSES
}
for cls in GENERATED.values():
    cls._app = app
BINDINGS = {c["name"]: c["binding"] for c in CLASSES}


class JsError(Exception):
    """An error the engine's step threw (its JS name and message)."""

    def __init__(self, name, message):
        super().__init__(message)
        self.js_name = name


#: What the engine was asked, by instance: [session, op, name, value] in call order.
ASKED = {}


class RelayStep:
    """The SDK's ``step`` (model, see the top): each call runs on the engine's step."""

    def __init__(self, session, instance):
        self.session = session
        self.instance = instance
        self.bodies = {}

    async def _call(self, cmd):
        asked = [self.session, cmd["op"], cmd["name"]]
        ASKED.setdefault(self.instance, []).append(asked)
        out = json.loads(await H.stepCall(self.session, json.dumps(cmd)))
        if "error" in out:
            asked.append({"error": out["error"]})
            raise JsError(out.get("name"), out["error"])
        asked.append(out.get("value"))  # what the engine handed back (kept, or new)
        return out.get("value")

    def do(self, name, config=None):
        def decorate(fn):
            async def call():
                key = str(len(self.bodies) + 1)
                self.bodies[key] = fn
                return await self._call({"op": "do", "name": name, "config": config, "body": key})

            return call

        return decorate

    async def sleep(self, name, duration):
        await self._call({"op": "sleep", "name": name, "duration": duration})

    async def wait_for_event(self, name, event_type, timeout=None):
        return await self._call(
            {"op": "wait", "name": name, "type": event_type, "timeout": timeout}
        )


STEPS = {}


async def on_workflow(kind, session, data):
    data = json.loads(data)
    if kind == "body":
        fn = STEPS[session].bodies[data["body"]]
        try:
            return json.dumps({"value": await fn()})
        except Exception as e:
            return json.dumps({"error": str(e), "name": type(e).__name__})
    event = data["event"]
    step = STEPS[session] = RelayStep(session, event["instanceId"])
    instance = GENERATED[data["class_name"]](None, env)
    ev = types.SimpleNamespace(payload=event["payload"], instance_id=event["instanceId"])
    try:
        value = await instance.run(ev, step)
        return json.dumps({"op": "return", "value": value})
    except BaseException as e:
        name = e.js_name if isinstance(e, JsError) else type(e).__name__
        return json.dumps({"op": "throw", "name": name, "message": str(e)})


H.setWorkflowHandler(create_proxy(on_workflow))


async def binding(op, **data):
    out = json.loads(await H.workflow(op, json.dumps(data)))
    if not out["ok"]:
        raise RuntimeError(f"{op}: {out['error']}")
    return out["value"]


async def until(workflow, rid, states, timeout=60):
    deadline = time.monotonic() + timeout
    st = None
    while time.monotonic() < deadline:
        st = await binding("status", binding=BINDINGS[workflow], id=rid)
        if st["status"] in states:
            return st
        await asyncio.sleep(0.1)
    raise AssertionError(f"run {rid} never reached {states}: {st}")


async def asked_until(rid, name):
    for _ in range(600):
        if any(a[2] == name for a in ASKED.get(rid, [])):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {rid} never reached {name}: {ASKED.get(rid)}")


def shown(st):
    if st is None:
        return None
    return {"state": st.state, "result": st.result, "error": st.error, "name": st.name}


def snap(calls):
    out = dict(calls)
    calls.clear()
    return out


FINAL = {"complete", "errored", "terminated"}
RECIPE_INPUTS = {
    "signup": {"email": "ada@example.com"},
    "payment": {"order_id": "A-1", "cents": 1200},
    "import": {"source": "c.csv", "chunks": 4},
}
result = {"cases": {}}
try:
    await worker.get_app()
    bind_env(env)
    # the docs' recipes, started and reached through haze's calls (the bindings); the
    # sign-up's two-day sleep on the engine's test clock
    ids = {"signup": "cf-signup", "payment": "cf-pay-1", "import": "cf-import"}
    await binding("disableSleeps", binding=BINDINGS["signup"], id=ids["signup"])
    for name, given in RECIPE_INPUTS.items():
        result["started"] = await Workflow.start(recipes.RECIPES[name], id=ids[name], **given)
    await asked_until(ids["payment"], "paid")
    result["waiting"] = shown(await Workflow.status(ids["payment"]))
    result["sent"] = await Workflow.send_event(ids["payment"], "paid", {"amount": 1200})
    for name, rid in ids.items():
        raw = await until(name, rid, FINAL)
        result["cases"][name] = {"raw": raw, "haze": shown(await Workflow.status(rid))}
    deadline = time.monotonic() + 30
    while recipes.CALLS["receipt"] < 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    result["calls"] = snap(recipes.CALLS)
    result["again"] = await Workflow.start(recipes.signup, id=ids["signup"], email="x@y")

    # bad input: each one line
    result["bad"] = {}
    for what, call in {
        "event_unknown": lambda: Workflow.send_event("no-such-run", "paid", 1),
        "event_finished": lambda: Workflow.send_event(ids["import"], "paid", 1),
    }.items():
        try:
            result["bad"][what] = ["no error", await call()]
        except Exception as e:
            result["bad"][what] = [type(e).__name__, str(e)]
    result["cancel_finished"] = await Workflow.cancel(ids["import"])
    result["status_unknown"] = await Workflow.status("no-such-run")

    # an event sent before the run waits for it is kept by the engine, handed over there
    await binding(
        "create",
        binding=BINDINGS["payment"],
        id="cf-pay-early",
        params={"order_id": "A-2", "cents": 900},
    )
    await binding(
        "sendEvent",
        binding=BINDINGS["payment"],
        id="cf-pay-early",
        type="paid",
        payload={"amount": 900},
    )
    result["early"] = await until("payment", "cf-pay-early", FINAL)

    # a step that raises once, retried by the engine, across a pause and a replay
    await binding("create", binding=BINDINGS["cf_replay"], id="cf-replay-1")
    await asked_until("cf-replay-1", "go")
    await binding("pause", binding=BINDINGS["cf_replay"], id="cf-replay-1")
    result["paused"] = (await until("cf_replay", "cf-replay-1", {"paused"}))["status"]
    await binding("resume", binding=BINDINGS["cf_replay"], id="cf-replay-1")
    for _ in range(600):  # the replay reaches the wait again, in a new session
        if len({a[0] for a in ASKED["cf-replay-1"] if a[2] == "go"}) > 1:
            break
        await asyncio.sleep(0.05)
    await binding(
        "sendEvent", binding=BINDINGS["cf_replay"], id="cf-replay-1", type="go", payload="go"
    )
    result["replay"] = await until("cf_replay", "cf-replay-1", FINAL)
    result["replay_effects"] = snap(flows.EFFECTS)

    # a cancel of a running run: the binding's terminate
    await Workflow.start(flows.cf_replay, id="cf-cancel-1")
    await asked_until("cf-cancel-1", "go")
    result["cancelled"] = await Workflow.cancel("cf-cancel-1")
    result["cancelled_status"] = shown(await Workflow.status("cf-cancel-1"))
    flows.EFFECTS.clear()

    # the platform's limits: a step's result past 1 MiB, a step name it cannot hold
    await Workflow.start(flows.cf_big, id="cf-big-1")
    result["big"] = await until("cf_big", "cf-big-1", FINAL)
    result["big"].pop("__LOCAL_DEV_STEP_OUTPUTS", None)
    await Workflow.start(flows.cf_names, id="cf-names-1")
    result["names"] = await until("cf_names", "cf-names-1", FINAL)
    flows.EFFECTS.clear()

    # nondeterminism: the replay after a pause takes another path
    await binding("create", binding=BINDINGS["cf_nondet"], id="nondet-1")
    await asked_until("nondet-1", "go")
    await binding("pause", binding=BINDINGS["cf_nondet"], id="nondet-1")
    await until("cf_nondet", "nondet-1", {"paused"})
    await binding("resume", binding=BINDINGS["cf_nondet"], id="nondet-1")
    result["nondet"] = await until("cf_nondet", "nondet-1", FINAL)
except BaseException:
    result["error"] = traceback.format_exc()
result["asked"] = ASKED
result  # noqa: B018 - the harness prints the last expression
