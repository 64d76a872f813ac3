"""Import time of haze's entry points: CPython (``-X importtime``) and Pyodide under Node.

    .venv/bin/python bench/import_time.py                 # CPython, 15 fresh processes each
    .venv/bin/python bench/import_time.py --runs 30 --json /tmp/imports.json
    .venv/bin/python bench/import_time.py --pyodide       # + Pyodide under Node.js (slow)

CPython: each of ``import haze``, ``import haze_lambda`` and ``import haze_cloudflare``,
and what the generated entry points import (``from haze_lambda import sqs_handler, …``
in ``dist/aws-lambda/handler.py``, ``from haze_cloudflare import QueueWorker`` in
``dist/cloudflare/src/entry.py``), runs in a fresh ``python -X importtime -c "…"``
process, twice: with bytecode (as an installed package or a built bundle has it: one
warm-up process writes it into a private cache, ``PYTHONPYCACHEPREFIX``, whatever
``PYTHONDONTWRITEBYTECODE`` says) and without (each module compiled from source, as in a
read-only directory with no ``__pycache__``). ``--src DIR`` measures
another checkout (a ``git worktree`` of an older commit) through ``PYTHONPATH``.
The figure is the sum of the *self* times of haze's own modules (``haze``, ``haze.*``,
``haze_lambda*``, ``haze_cloudflare*``), so third-party and standard-library imports do
not count; the table gives the median and the lowest of the runs, the modules loaded,
and the three slowest modules of the median run.

Pyodide (``--pyodide``): the haze and haze_cloudflare wheels (``uv build``) are
installed in a fresh Pyodide by ``tests/pyodide/run.mjs``, which then times
``import haze``, then ``import haze_cloudflare`` with ``from haze_cloudflare import
QueueWorker`` (the generated entry), then the modules a first ``queue()`` batch loads
on top (app, manager, Queue and D1 binding modules: deferred, not saved, by lazy
imports), with ``time.perf_counter()``, once per Pyodide instance.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OWN = re.compile(r"^(haze|haze_lambda|haze_cloudflare)(\.|$)")
LINE = re.compile(r"^import time:\s+(\d+)\s+\|\s+(\d+)\s+\|(\s*)(\S+)\s*$")
#: What each entry point runs at import: the packages, then what the generated bundles
#: import (dist/aws-lambda/handler.py, dist/cloudflare/src/entry.py).
ENTRIES = (
    "import haze",
    "import haze_lambda",
    "from haze_lambda import sqs_handler, schedule_handler, http_handler",
    "import haze_cloudflare",
    "from haze_cloudflare import QueueWorker",
)


def one_run(
    statement: str, python: str, src: Path | None, cache: Path, bytecode: bool
) -> dict[str, int]:
    """Self time in µs of each haze module ``statement`` imports (a fresh process).

    ``cache`` is the bytecode cache: written and read with ``bytecode``, an empty directory
    that nothing is written to without.
    """
    env = dict(os.environ)
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    if src is not None:  # another checkout's sources, ahead of the installed ones
        paths = [src / "runtime/src", src / "adapters/lambda/src", src / "adapters/cloudflare/src"]
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    proc = subprocess.run(
        [python, "-X", "importtime", "-c", statement],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    own: dict[str, int] = {}
    for line in proc.stderr.splitlines():
        match = LINE.match(line)
        if match and OWN.match(match.group(4)):
            own[match.group(4)] = int(match.group(1))
    return own


def cpython(
    runs: int, python: str, src: Path | None, bytecode: bool
) -> dict[str, dict[str, object]]:
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp)
        for module in ENTRIES:
            one_run(module, python, src, cache, bytecode)  # warm-up: writes the bytecode
            samples = [one_run(module, python, src, cache, bytecode) for _ in range(runs)]
            totals = [sum(s.values()) for s in samples]
            median = statistics.median(totals)
            middle = min(samples, key=lambda s: abs(sum(s.values()) - median))
            slowest = sorted(middle.items(), key=lambda kv: -kv[1])[:3]
            results[module] = {
                "median_ms": median / 1000,
                "min_ms": min(totals) / 1000,
                "modules": len(middle),
                "slowest": [(name, us / 1000) for name, us in slowest],
                "loaded": sorted(middle),
            }
    return results


PYODIDE_SCRIPT = """
import time
t0 = time.perf_counter()
import haze
t1 = time.perf_counter()
import haze_cloudflare
from haze_cloudflare import QueueWorker
t2 = time.perf_counter()
# what the first queue() batch of a Worker loads on top (app, manager, driver, D1)
import haze._app.app, haze._engine.manager, haze._base.message, haze.contracts.driver
import haze._base.plugins, haze_cloudflare.driver, haze_cloudflare.d1
t3 = time.perf_counter()
import sys
{"haze_ms": (t1 - t0) * 1000, "haze_cloudflare_ms": (t2 - t1) * 1000,
 "first_batch_ms": (t3 - t2) * 1000, "version": sys.version.split()[0]}
"""


def pyodide(runs: int, src: Path) -> dict[str, object]:
    node = shutil.which("node")
    uv = shutil.which("uv")
    run_mjs = ROOT / "tests" / "pyodide" / "run.mjs"
    if node is None or uv is None or not (ROOT / "tests/pyodide/node_modules/pyodide").is_dir():
        return {"skipped": "needs node, uv and `npm ci` in tests/pyodide"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for project in ("runtime", "adapters/cloudflare"):
            subprocess.run(
                [uv, "build", "--wheel", project, "-o", str(out)],
                cwd=src,
                check=True,
                capture_output=True,
            )
        script = out / "imports.py"
        script.write_text(PYODIDE_SCRIPT)
        args = [node, str(run_mjs)]
        for wheel in sorted(out.glob("*.whl")):
            args += ["--wheel", str(wheel)]
        samples = []
        for _ in range(runs):
            proc = subprocess.run(
                [*args, str(script)],
                cwd=run_mjs.parent,
                capture_output=True,
                text=True,
                check=True,
            )
            samples.append(json.loads(proc.stdout))
    return {
        "python": samples[0]["version"],
        "haze_ms": statistics.median(s["haze_ms"] for s in samples),
        "haze_cloudflare_ms": statistics.median(s["haze_cloudflare_ms"] for s in samples),
        "first_batch_ms": statistics.median(s["first_batch_ms"] for s in samples),
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=15, help="fresh processes per entry point")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to measure")
    parser.add_argument(
        "--src", type=Path, help="measure this haze checkout's sources (e.g. a git worktree)"
    )
    parser.add_argument("--pyodide", action="store_true", help="also time imports in Pyodide")
    parser.add_argument("--pyodide-runs", type=int, default=3)
    parser.add_argument("--json", help="write the results to this file too")
    args = parser.parse_args(argv)

    results: dict[str, object] = {
        "cpython": cpython(args.runs, args.python, args.src, bytecode=True),
        "cpython_source": cpython(args.runs, args.python, args.src, bytecode=False),
    }
    print(f"CPython {sys.version.split()[0]}: haze's own modules, self time, {args.runs} runs")
    print("| statement | median ms | min ms | modules | slowest (ms) | no bytecode: median ms |")
    print("|---|---:|---:|---:|---|---:|")
    source = results["cpython_source"]
    for module, r in results["cpython"].items():  # type: ignore[union-attr]
        slow = ", ".join(f"{n} {ms:.1f}" for n, ms in r["slowest"])
        compiled = source[module]["median_ms"]  # type: ignore[index]
        print(
            f"| `{module}` | {r['median_ms']:.1f} | {r['min_ms']:.1f} | {r['modules']} | {slow} "
            f"| {compiled:.1f} |"
        )
    if args.pyodide:
        p = pyodide(args.pyodide_runs, args.src or ROOT)
        results["pyodide"] = p
        if "skipped" in p:
            print(f"\nPyodide: skipped ({p['skipped']})")
        else:
            print(
                f"\nPyodide (Python {p['python']}, median of {p['runs']} instances): "
                f"import haze {p['haze_ms']:.0f} ms, then `import haze_cloudflare; from "
                f"haze_cloudflare import QueueWorker` {p['haze_cloudflare_ms']:.0f} ms, then "
                f"what a first queue() batch loads {p['first_batch_ms']:.0f} ms"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
