// The Workflows half of the Miniflare harness: JS WorkflowEntrypoint classes that
// Miniflare's REAL local Workflows engine (wrangler@4.86.0, in workerd) runs, one per
// entry of the built wrangler.json's `workflows` (miniflare-harness.mjs appends one
// `export class <class_name> extends HazeRelay { workflow = "<name>" }` per entry).
//
// The engine calls run(event, step) with its own `step` (an RpcTarget of the engine).
// The workflow's code is haze's, running in Pyodide in the harness's Node process, so
// run() relays: it opens a session (HAZE /wf/open: Node starts the generated
// <Name>Workflow's run() in Pyodide with a step object that sends each call here), then
// takes the calls one by one (HAZE /wf/next) and carries each out on the engine's REAL
// step, concurrently (run.gather):
//   do     -> step.do(name, config, callback): the callback asks Node (HAZE /wf/body) to
//             run the step's Python function once; its value comes back as JSON (what
//             the engine keeps must be structured-clonable: JSON is).
//   sleep  -> step.sleep(name, duration)
//   wait   -> step.waitForEvent(name, {type, timeout})
// and posts each outcome back (HAZE /wf/done). The run returns the value the Python
// run returned, or throws an Error named and worded like the Python exception.
// An engine abort (pause, terminate) thrown by a step is rethrown as it is, so the
// engine treats it as its own (a later resume replays run() from the top).
//
// The default export's fetch() gives Node the bindings' calls from inside this Worker
// (create, get().status(), sendEvent, terminate, pause, resume, and the engine's test
// hook that turns sleeps off: the platform's own test clock).
import { WorkflowEntrypoint } from "cloudflare:workers";

const ABORT_PREFIX = "Aborting engine:";

async function post(env, pathname, data) {
  const res = await env.HAZE.fetch(`http://haze${pathname}`, {
    method: "POST",
    body: JSON.stringify(data),
  });
  if (!res.ok) throw new Error(`haze harness ${pathname}: HTTP ${res.status} ${await res.text()}`);
  return res.json();
}

function named(name, message) {
  const err = new Error(message);
  err.name = name || "Error";
  return err;
}

async function perform(env, session, step, cmd) {
  if (cmd.op === "do") {
    const body = async () => {
      const out = await post(env, "/wf/body", { session, body: cmd.body });
      if ("error" in out) throw named(out.name, out.error);
      return out.value;
    };
    return cmd.config ? step.do(cmd.name, cmd.config, body) : step.do(cmd.name, body);
  }
  if (cmd.op === "sleep") {
    await step.sleep(cmd.name, cmd.duration);
    return null;
  }
  if (cmd.op === "wait") {
    const event = await step.waitForEvent(cmd.name, { type: cmd.type, timeout: cmd.timeout });
    return { payload: event.payload, type: event.type };
  }
  throw new Error(`unknown step call ${cmd.op}`);
}

export class HazeRelay extends WorkflowEntrypoint {
  async run(event, step) {
    const env = this.env;
    const { session } = await post(env, "/wf/open", {
      class_name: this.constructor.name,
      workflow: this.workflow,
      event: { payload: event.payload, instanceId: event.instanceId },
    });
    let abort = null;
    let aborted;
    const abortPromise = new Promise((resolve) => {
      aborted = resolve;
    });
    for (;;) {
      const cmd = await Promise.race([post(env, "/wf/next", { session }), abortPromise]);
      if (abort) throw abort;
      if (cmd.op === "return") return cmd.value;
      if (cmd.op === "throw") throw named(cmd.name, cmd.message);
      perform(env, session, step, cmd).then(
        (value) => post(env, "/wf/done", { session, call: cmd.call, value: value ?? null }),
        (e) => {
          const message = String(e?.message ?? e);
          if (message.startsWith(ABORT_PREFIX)) {
            abort = e;
            aborted();
          }
          return post(env, "/wf/done", {
            session,
            call: cmd.call,
            error: message,
            name: e?.name ?? "Error",
          });
        },
      );
    }
  }
}

async function admin(env, op, data) {
  const binding = env[data.binding];
  if (!binding) throw new Error(`no workflow binding ${data.binding}`);
  if (op === "create") {
    const instance = await binding.create({ id: data.id, params: data.params ?? {} });
    return { id: instance.id };
  }
  if (op === "disableSleeps") {
    const modifier = await binding.unsafeGetInstanceModifier(data.id);
    await modifier.disableSleeps();
    return { ok: true };
  }
  const instance = await binding.get(data.id);
  if (op === "status") return await instance.status();
  if (op === "sendEvent") {
    await instance.sendEvent({ type: data.type, payload: data.payload });
    return { ok: true };
  }
  if (op === "terminate" || op === "pause" || op === "resume") {
    await instance[op]();
    return { ok: true };
  }
  throw new Error(`unknown binding call ${op}`);
}

export default {
  async fetch(request, env) {
    const op = new URL(request.url).pathname.slice(1);
    try {
      const out = await admin(env, op, await request.json());
      return Response.json({ ok: true, value: out ?? null });
    } catch (e) {
      return Response.json({ ok: false, error: String(e?.message ?? e), name: e?.name ?? "Error" });
    }
  },
};
