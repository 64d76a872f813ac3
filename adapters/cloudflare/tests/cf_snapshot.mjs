// Isolates from one memory snapshot, the way Cloudflare starts Python Workers.
//
//   node cf_snapshot.mjs --bundle DIR [--isolates N] SETUP.py REQUEST.py
//
// A deployed Python Worker runs its top-level code (imports, job discovery) once, when
// the Worker is uploaded; Cloudflare then takes a memory snapshot of Pyodide and starts
// every isolate from it. This does the same with Pyodide's own snapshot API (the npm
// pyodide of tests/pyodide, or of $HAZE_PYODIDE_HOME; offline): one Pyodide loaded
// with _makeSnapshot runs SETUP.py (top level), makeMemorySnapshot() is taken, then N fresh Pyodides are started
// with _loadSnapshot and each runs REQUEST.py (what a request runs). DIR holds the
// Worker's packages unpacked (haze, haze_cloudflare, the app); it is mounted at /bundle
// in every Pyodide, as Cloudflare mounts a Worker's bundle: the snapshot holds the
// WebAssembly memory, not the file system. (pyodide.loadPackage is not used: it leaves
// a JS reference behind that makeMemorySnapshot refuses.)
// Printed: one JSON line {"setup": <SETUP's last expression>, "isolates": [<REQUEST's
// last expression>, ...]} (each converted with Python's json.dumps).
import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.join(HERE, "..", "..", "..");

function parseArgs(argv) {
  let bundle = null;
  const scripts = [];
  let isolates = 2;
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--bundle") bundle = path.resolve(argv[++i]);
    else if (argv[i] === "--isolates") isolates = Number(argv[++i]);
    else scripts.push(argv[i]);
  }
  if (scripts.length !== 2 || bundle === null) {
    throw new Error("usage: node cf_snapshot.mjs --bundle DIR [--isolates N] SETUP.py REQUEST.py");
  }
  return { bundle, setup: scripts[0], request: scripts[1], isolates };
}

async function main() {
  const { bundle, setup, request, isolates } = parseArgs(process.argv.slice(2));
  // The same Pyodide as tests/pyodide/run.mjs loads: tests/pyodide's, or the one in
  // $HAZE_PYODIDE_HOME (relative to the repository) when set.
  const home = path.resolve(ROOT, process.env.HAZE_PYODIDE_HOME || path.join("tests", "pyodide"));
  const require = createRequire(path.join(home, "package.json"));
  const indexURL = path.dirname(require.resolve("pyodide/package.json")) + path.sep;
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
  const mount = (py) => {
    py.FS.mkdirTree("/bundle");
    py.FS.mount(py.FS.filesystems.NODEFS, { root: bundle }, "/bundle");
  };
  const run = async (py, file) => {
    const code = await readFile(file, "utf8");
    const result = await py.runPythonAsync(code, { filename: path.resolve(file) });
    const json = py.pyimport("json");
    try {
      return JSON.parse(json.dumps(result));
    } finally {
      json.destroy();
      result?.destroy?.();
    }
  };

  const base = await loadPyodide({ indexURL, stdout: toStderr, stderr: toStderr, _makeSnapshot: true });
  mount(base);
  base.runPython("import sys; sys.path.insert(0, '/bundle')");
  const out = { setup: await run(base, setup), isolates: [] };
  const snapshot = base.makeMemorySnapshot();
  for (let i = 0; i < isolates; i++) {
    const py = await loadPyodide({
      indexURL,
      stdout: toStderr,
      stderr: toStderr,
      _loadSnapshot: snapshot,
    });
    mount(py);
    out.isolates.push(await run(py, request));
  }
  globalThis.fetch = realFetch;
  await new Promise((resolve) => process.stdout.write(JSON.stringify(out) + "\n", resolve));
}

main().then(
  () => process.exit(0),
  (err) => {
    process.stderr.write(`${err && err.stack ? err.stack : err}\n`);
    process.exit(1);
  },
);
