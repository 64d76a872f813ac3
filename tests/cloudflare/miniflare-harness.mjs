// Harness (b): real local Cloudflare Queues + D1 (Miniflare/workerd from wrangler@4.86.0)
// with the haze adapter running inside real Pyodide in this Node.js process.
//
//   node miniflare-harness.mjs [--wheel PATH]... [--workflows JSON] SCRIPT.py
//
// Python Workers cannot run in local workerd here: workerd downloads its Python runtime
// bundle from the network (pyodide-capnp-bin.edgeworker.net), and this machine is
// offline. So the pieces are split, and each piece is real:
//   * Miniflare runs consumer-worker.mjs (a JS Worker, in workerd) bound to a real local
//     queue "haze-jobs" (max_retries 2, dead-letter queue "haze-dlq"), a real local D1
//     database and a real local R2 bucket (binding R2). workerd owns delivery, batching,
//     attempts, retry delays and dead-lettering.
//   * haze (haze + haze_cloudflare wheels) runs in Pyodide here. Its env holds Miniflare's
//     own Queue producer, D1 and R2 bindings (mf.getQueueProducer / getD1Database /
//     getR2Bucket, proxies to the same local queue, database and bucket), so haze's
//     send/sendBatch, re-sends on release, D1 statements and R2 objects go to the real
//     local services.
//   * The JS Worker hands each delivery (id, body, attempts) to Node through the HAZE
//     service binding; Node runs haze_cloudflare.QueueWorker.queue() on relay messages
//     whose ack()/retry({delaySeconds}) record a verdict; the JS Worker applies the
//     verdict to the real message.
// The script (SCRIPT.py) is run with runPythonAsync after Miniflare is up; it finds the
// harness at js.cfHarness: env (QUEUE, DB bindings), setHandler(fn), events (what the
// JS Worker delivered and what haze answered), dlq (dead-lettered messages), read(sql).
// Printed: one JSON line {"python": <the script's last expression>, "events": [...],
// "dlq": [...], "d1": {...rows read back through Miniflare's D1, not through haze}}.
//
// --workflows JSON (a built wrangler.json's `workflows` list: binding, name, class_name)
// adds a Worker "workflows" (workflow-worker.mjs) whose classes Miniflare's REAL local
// Workflows engine runs, each relaying its step calls to haze in Pyodide (see that file).
// The script then also finds: setWorkflowHandler(fn) (fn(kind, session, json) runs a
// session's workflow ("open") or one step body ("body") in Pyodide), stepCall(session,
// json) (a step call for the engine's step; resolves with the outcome's JSON) and
// workflow(op, json) (a binding call made inside the "workflows" Worker); env holds each
// Workflow binding too (Miniflare's proxy of it), as a Worker's env does.
import { readFile } from "node:fs/promises";
import { existsSync } from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { Miniflare, Response } from "miniflare";

const HERE = path.dirname(fileURLToPath(import.meta.url));

function parseArgs(argv) {
  const wheels = [];
  let script = null;
  let workflows = null;
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--wheel") wheels.push(argv[++i]);
    else if (argv[i] === "--workflows") workflows = JSON.parse(argv[++i]);
    else if (script === null) script = argv[i];
    else throw new Error(`unexpected argument ${argv[i]}`);
  }
  if (!script) throw new Error("usage: node miniflare-harness.mjs [--wheel PATH]... SCRIPT.py");
  return { wheels, script, workflows };
}

// One session per run() call of a relay class (a replay opens a new one).
function workflowSessions() {
  const sessions = new Map();
  let next = 0;
  const open = () => {
    const id = String(++next);
    sessions.set(id, { queue: [], takers: [], pending: new Map(), calls: 0 });
    return id;
  };
  const push = (id, cmd) => {
    const s = sessions.get(id);
    const taker = s.takers.shift();
    if (taker) taker(cmd);
    else s.queue.push(cmd);
  };
  const take = (id) => {
    const s = sessions.get(id);
    if (s.queue.length) return Promise.resolve(s.queue.shift());
    return new Promise((resolve) => s.takers.push(resolve));
  };
  const call = (id, cmd) => {
    const s = sessions.get(id);
    const n = String(++s.calls);
    const done = new Promise((resolve) => s.pending.set(n, resolve));
    push(id, { ...cmd, call: n });
    return done;
  };
  const done = (id, n, outcome) => {
    const s = sessions.get(id);
    const resolve = s.pending.get(n);
    s.pending.delete(n);
    resolve?.(JSON.stringify(outcome));
  };
  return { open, push, take, call, done };
}

async function workflowWorker(workflows) {
  let text = await readFile(path.join(HERE, "workflow-worker.mjs"), "utf8");
  for (const w of workflows) {
    text += `\nexport class ${w.class_name} extends HazeRelay { workflow = ${JSON.stringify(w.name)}; }\n`;
  }
  return text;
}

async function loadPython(wheels) {
  // The same Pyodide as tests/pyodide/run.mjs loads (tests/pyodide's, or the one in
  // $HAZE_PYODIDE_HOME when set), from disk only.
  const env = process.env.HAZE_PYODIDE_HOME;
  const home = env ? path.resolve(HERE, "..", "..", env) : path.join(HERE, "..", "pyodide");
  const pkg = path.join(home, "node_modules", "pyodide", "package.json");
  if (!existsSync(pkg)) throw new Error(`no pyodide installed in ${home}: run npm ci there`);
  const indexURL = path.dirname(pkg) + path.sep;
  const { loadPyodide } = await import(pathToFileURL(path.join(indexURL, "pyodide.mjs")).href);
  const realFetch = globalThis.fetch;
  globalThis.fetch = (input, init) => {
    const url = String(input?.url ?? input);
    if (/^https?:/i.test(url)) {
      return Promise.reject(new Error(`network fetch while loading Pyodide: ${url}`));
    }
    return realFetch(input, init);
  };
  const toStderr = (line) => process.stderr.write(line + "\n");
  try {
    const pyodide = await loadPyodide({ indexURL, stdout: toStderr, stderr: toStderr });
    const errors = [];
    await pyodide.loadPackage(
      wheels.map((w) => pathToFileURL(path.resolve(w)).href),
      { messageCallback: () => {}, errorCallback: (m) => errors.push(m) },
    );
    if (errors.length) throw new Error(`loadPackage failed: ${errors.join("; ")}`);
    return pyodide;
  } finally {
    globalThis.fetch = realFetch;
  }
}

async function main() {
  const { wheels, script, workflows } = parseArgs(process.argv.slice(2));
  const code = await readFile(script, "utf8");
  const t0 = performance.now();
  const now = () => (performance.now() - t0) / 1000;
  const events = [];
  const dlq = [];
  const scheduled = [];
  let handler = null;
  let scheduledHandler = null;
  let workflowHandler = null;
  const sessions = workflowSessions();

  const pyodide = await loadPython(wheels);

  async function serveHaze(request) {
    const url = new URL(request.url);
    const data = await request.json();
    if (url.pathname.startsWith("/wf/")) return serveWorkflow(url.pathname, data);
    if (url.pathname === "/dlq") {
      dlq.push({ t: now(), ...data });
      return new Response("ok");
    }
    if (url.pathname === "/scheduled") {
      // What workerd's scheduled() got (controller.cron, controller.scheduledTime).
      scheduled.push({ t: now(), ...data });
      if (!scheduledHandler) return new Response("no scheduled handler", { status: 503 });
      try {
        await scheduledHandler(data);
      } catch (e) {
        return new Response(String(e), { status: 500 });
      }
      return new Response("ok");
    }
    if (!handler) return new Response("haze is not ready", { status: 503 });
    const verdicts = {};
    const messages = data.messages.map((m) => ({
      id: m.id,
      body: m.body,
      attempts: m.attempts,
      timestamp: new Date(m.timestamp),
      ack() {
        verdicts[m.id] ??= { action: "ack" };
      },
      retry(options) {
        verdicts[m.id] ??= { action: "retry", delaySeconds: options?.delaySeconds ?? null };
      },
    }));
    const t = now();
    try {
      await handler({ queue: data.queue, messages });
    } catch (e) {
      events.push({ t, queue: data.queue, error: String(e) });
      return new Response(String(e), { status: 500 });
    }
    events.push({
      t,
      queue: data.queue,
      messages: data.messages.map((m) => ({
        id: m.id,
        attempts: m.attempts,
        job: m.body?.job ?? null,
        key: m.body?.payload?.key ?? null,
        env_attempts: m.body?.attempts ?? 0,
      })),
      verdicts,
    });
    return new Response(JSON.stringify(verdicts), {
      headers: { "content-type": "application/json" },
    });
  }

  async function serveWorkflow(pathname, data) {
    const json = (v) =>
      new Response(JSON.stringify(v), { headers: { "content-type": "application/json" } });
    if (!workflowHandler) return new Response("no workflow handler", { status: 503 });
    if (pathname === "/wf/open") {
      const session = sessions.open();
      workflowHandler("open", session, JSON.stringify(data)).then(
        (out) => sessions.push(session, JSON.parse(out)),
        (e) => sessions.push(session, { op: "throw", name: "Error", message: String(e) }),
      );
      return json({ session });
    }
    if (pathname === "/wf/next") return json(await sessions.take(data.session));
    if (pathname === "/wf/done") {
      const { session, call, ...outcome } = data;
      sessions.done(session, call, outcome);
      return json({ ok: true });
    }
    if (pathname === "/wf/body") {
      return json(JSON.parse(await workflowHandler("body", data.session, JSON.stringify(data))));
    }
    return new Response(`unknown ${pathname}`, { status: 404 });
  }

  const workers = [];
  if (workflows) {
    workers.push({
      name: "workflows",
      modules: true,
      script: await workflowWorker(workflows),
      scriptPath: path.join(HERE, "workflow-worker.mjs"),
      compatibilityDate: "2025-01-01",
      workflows: Object.fromEntries(
        workflows.map((w) => [w.binding, { name: w.name, className: w.class_name }]),
      ),
      serviceBindings: { HAZE: serveHaze },
    });
  }
  const mf = new Miniflare({
    // /cdn-cgi/handler/scheduled?cron=…&time=… runs the Worker's scheduled() handler
    unsafeTriggerHandlers: true,
    workers: [
      {
        name: "consumer",
        modules: true,
        scriptPath: path.join(HERE, "consumer-worker.mjs"),
        compatibilityDate: "2025-01-01",
        bindings: { DLQ_NAME: "haze-dlq" },
        queueProducers: { QUEUE: "haze-jobs" },
        queueConsumers: {
          "haze-jobs": {
            maxBatchSize: 10,
            maxBatchTimeout: 0,
            maxRetries: 2,
            deadLetterQueue: "haze-dlq",
          },
          "haze-dlq": { maxBatchSize: 10, maxBatchTimeout: 0 },
        },
        d1Databases: { DB: "haze-d1" },
        r2Buckets: { R2: "haze-r2" },
        serviceBindings: { HAZE: serveHaze },
      },
      ...workers,
    ],
  });
  let output;
  try {
    const queue = await mf.getQueueProducer("QUEUE", "consumer");
    const db = await mf.getD1Database("DB", "consumer");
    // workerd's own R2 bucket (a local one, on disk in Miniflare's temp storage)
    const r2 = await mf.getR2Bucket("R2", "consumer");
    const env = { QUEUE: queue, DB: db, R2: r2 };
    if (workflows) {
      // the Workflow bindings themselves (Miniflare's proxies to the "workflows" Worker's)
      const bound = await mf.getBindings("workflows");
      for (const w of workflows) env[w.binding] = bound[w.binding];
    }
    globalThis.cfHarness = {
      env,
      setHandler(fn) {
        handler = fn;
      },
      setScheduledHandler(fn) {
        scheduledHandler = fn;
      },
      setWorkflowHandler(fn) {
        workflowHandler = fn;
      },
      stepCall: (session, cmd) => sessions.call(session, JSON.parse(cmd)),
      async workflow(op, data) {
        const worker = await mf.getWorker("workflows");
        const res = await worker.fetch(`http://workflows/${op}`, { method: "POST", body: data });
        return await res.text();
      },
      // Fire the consumer Worker's Cron Trigger the way `wrangler dev --test-scheduled` does.
      async trigger(cron, time) {
        const q = `cron=${encodeURIComponent(cron)}&time=${time}`;
        const res = await mf.dispatchFetch(`http://localhost/cdn-cgi/handler/scheduled?${q}`);
        return { status: res.status, body: await res.text() };
      },
      scheduled,
      events,
      dlq,
      now,
      // rows read through Miniflare's D1 directly (not through haze)
      read: async (sql) => (await db.prepare(sql).all()).results,
    };
    const result = await pyodide.runPythonAsync(code, { filename: path.resolve(script) });
    const json = pyodide.pyimport("json");
    const python = JSON.parse(json.dumps(result));
    json.destroy();
    result.destroy?.();
    const read = async (sql) => {
      try {
        return (await db.prepare(sql).all()).results;
      } catch (e) {
        return { error: String(e) };
      }
    };
    output = {
      python,
      events,
      dlq,
      scheduled,
      d1: {
        failed_jobs: await read("SELECT uuid, connection, queue, exception FROM failed_jobs"),
        jobs: await read("SELECT id, queue, attempts, reserved_at FROM jobs"),
        cache_keys: await read("SELECT key FROM haze_cache ORDER BY key"),
        tables: await read(
          "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE '\\_%' " +
            "ESCAPE '\\' ORDER BY name",
        ),
      },
    };
  } finally {
    await mf.dispose();
  }
  await new Promise((resolve) => process.stdout.write(JSON.stringify(output) + "\n", resolve));
}

main().then(
  () => process.exit(0),
  (err) => {
    process.stderr.write(`${err && err.stack ? err.stack : err}\n`);
    process.exit(1);
  },
);
