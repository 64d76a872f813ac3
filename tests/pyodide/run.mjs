// Runs a Python script inside real Pyodide under Node.js, offline.
//
//   node run.mjs [--wheel PATH_OR_URL]... [--mount HOST_DIR[:GUEST_DIR]]...
//                [--env NAME=VALUE]... SCRIPT.py
//
// Every wheel is installed with pyodide.loadPackage before the script runs. Each
// --mount makes a host directory visible inside Pyodide's file system (NODEFS; at the
// same path unless GUEST_DIR is given), each --env sets a variable in os.environ. The
// script runs with runPythonAsync (top-level await works); the value of its last
// expression is printed to stdout as one line of JSON. Python's own stdout and
// stderr go to this process's stderr so stdout stays machine-readable. Any error
// exits non-zero with the Python traceback on stderr.
//
// The Pyodide is this directory's (package.json: the newest release), or the one
// installed in $HAZE_PYODIDE_HOME when set (tests/pyodide-0.28: the version Cloudflare
// Python Workers run; see pyodideIndexURL).
import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

function usage(message) {
  process.stderr.write(
    `${message}\nusage: node run.mjs [--wheel PATH_OR_URL]... [--mount HOST[:GUEST]]... ` +
      `[--env NAME=VALUE]... SCRIPT.py\n`,
  );
  process.exit(2);
}

function parseArgs(argv) {
  const wheels = [];
  const mounts = [];
  const env = {};
  let script = null;
  const valueOf = (i, flag) => {
    if (i + 1 >= argv.length) usage(`${flag} needs a value`);
    return argv[i + 1];
  };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === "--wheel") {
      wheels.push(valueOf(i++, arg));
    } else if (arg.startsWith("--wheel=")) {
      wheels.push(arg.slice("--wheel=".length));
    } else if (arg === "--mount") {
      const spec = valueOf(i++, arg);
      const at = spec.indexOf(":");
      const host = path.resolve(at < 0 ? spec : spec.slice(0, at));
      mounts.push({ host, guest: at < 0 ? host : spec.slice(at + 1) });
    } else if (arg === "--env") {
      const pair = valueOf(i++, arg);
      const eq = pair.indexOf("=");
      if (eq <= 0) usage(`--env expects NAME=VALUE, got ${pair}`);
      env[pair.slice(0, eq)] = pair.slice(eq + 1);
    } else if (script === null && !arg.startsWith("--")) {
      script = arg;
    } else {
      usage(`unexpected argument: ${arg}`);
    }
  }
  if (script === null) usage("missing SCRIPT.py");
  return { wheels, mounts, env, script };
}

// loadPackage treats anything that is not a URL as a package name to look up in
// the lock file, so local paths become file:// URLs.
function wheelUrl(spec) {
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(spec)) return spec;
  return pathToFileURL(path.resolve(spec)).href;
}

function writeOut(text) {
  return new Promise((resolve) => process.stdout.write(text, resolve));
}

// The directory of the npm pyodide package to load: $HAZE_PYODIDE_HOME's when set (a
// directory holding package.json and node_modules/pyodide; a relative path is taken from
// the repository root, whatever the working directory), else this directory's.
// (tests/cloudflare/miniflare-harness.mjs follows the same rule.)
function pyodideIndexURL() {
  const here = path.dirname(fileURLToPath(import.meta.url));
  const home = process.env.HAZE_PYODIDE_HOME
    ? path.resolve(here, "..", "..", process.env.HAZE_PYODIDE_HOME)
    : here;
  // Only this directory's own node_modules: resolving upwards could find another Pyodide.
  const pkg = path.join(home, "node_modules", "pyodide", "package.json");
  if (!existsSync(pkg)) throw new Error(`no pyodide installed in ${home}: run npm ci there`);
  return path.dirname(pkg) + path.sep;
}

async function main() {
  const { wheels, mounts, env, script } = parseArgs(process.argv.slice(2));
  const code = await readFile(script, "utf8");

  // Point indexURL at the installed package so the runtime, stdlib and lock file
  // come from disk; nothing may be fetched from a CDN.
  const indexURL = pyodideIndexURL();
  const { loadPyodide } = await import(pathToFileURL(path.join(indexURL, "pyodide.mjs")).href);

  // Loading must work offline, so a network fetch here is a bug, not a fallback.
  // The script itself keeps the real fetch (it may talk to a local test server).
  const realFetch = globalThis.fetch;
  globalThis.fetch = (input, init) => {
    const url = String(input?.url ?? input);
    if (/^https?:/i.test(url)) {
      return Promise.reject(new Error(`network fetch while loading Pyodide: ${url}`));
    }
    return realFetch(input, init);
  };
  const toStderr = (line) => process.stderr.write(line + "\n");
  let pyodide;
  try {
    pyodide = await loadPyodide({ indexURL, stdout: toStderr, stderr: toStderr, env });
    for (const { host, guest } of mounts) {
      pyodide.FS.mkdirTree(guest);
      pyodide.FS.mount(pyodide.FS.filesystems.NODEFS, { root: host }, guest);
    }
    if (wheels.length > 0) {
      // loadPackage reports a failed wheel through errorCallback and still resolves.
      const errors = [];
      await pyodide.loadPackage(wheels.map(wheelUrl), {
        messageCallback: toStderr,
        errorCallback: (msg) => {
          errors.push(msg);
          toStderr(msg);
        },
      });
      if (errors.length > 0) throw new Error(`loadPackage failed: ${errors.join("; ")}`);
    }
  } finally {
    globalThis.fetch = realFetch;
  }

  const result = await pyodide.runPythonAsync(code, { filename: path.resolve(script) });
  let text;
  if (result instanceof pyodide.ffi.PyProxy) {
    // Python's json keeps None as null inside containers, which toJs would drop.
    const json = pyodide.pyimport("json");
    try {
      text = json.dumps(result);
    } finally {
      json.destroy();
      result.destroy();
    }
  } else {
    text = JSON.stringify(result ?? null);
  }
  await writeOut(text + "\n");
}

// Exit explicitly: timers left behind by the script (e.g. jobs still delayed)
// would otherwise keep Node alive.
main().then(
  () => process.exit(0),
  (err) => {
    process.stderr.write(`${err && err.stack ? err.stack : err}\n`);
    process.exit(1);
  },
);
