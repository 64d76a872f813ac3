# Runs INSIDE real Pyodide (node tests/pyodide/run.mjs), not under CPython's pytest.
#
# test_cf_contract_pyodide.py starts it with the haze, haze_cloudflare, pytest (and
# pluggy, iniconfig, packaging, pygments, pytest-asyncio) wheels loaded, the repository
# mounted at its own path, and Node's JSPI flag, then runs pytest itself over
# tests/contract: conftest.py sees sys.platform == "emscripten" and parametrises every
# contract test with the cloudflare driver only (cf_contract_spec.py).
#
# Async tests: pytest-asyncio drives each coroutine through asyncio.Runner, which refuses
# to start because Pyodide's WebLoop always counts as running. WebLoopRunner below takes
# its place: WebLoop.run_until_complete blocks through JSPI (pyodide.ffi.run_sync), so a
# test really runs to completion before pytest goes on. Each run is bounded in time.
#
# Environment: HAZE_CF_CONTRACT_ROOT (repository root), HAZE_CF_CONTRACT_RESULTS (a JSON
# lines file, one record per test phase, written as they happen so a killed run still
# reports what finished), HAZE_CF_CONTRACT_SELECT (optional: node ids, one per line),
# HAZE_CF_CONTRACT_RUN_TIMEOUT (seconds per fixture/test coroutine).
# The last expression (a summary dict) is printed as JSON by run.mjs.
# ruff: noqa: E402
import asyncio
import json
import os
import sys
import time

sys.dont_write_bytecode = True  # the repository is mounted from the host: leave it clean

from pyodide.ffi import can_run_sync

ROOT = os.environ["HAZE_CF_CONTRACT_ROOT"]
RESULTS = os.environ["HAZE_CF_CONTRACT_RESULTS"]
SELECT = [s for s in os.environ.get("HAZE_CF_CONTRACT_SELECT", "").splitlines() if s.strip()]
RUN_TIMEOUT = float(os.environ.get("HAZE_CF_CONTRACT_RUN_TIMEOUT", "60"))

if not can_run_sync():
    raise RuntimeError(
        "Pyodide cannot block on a coroutine here (no JSPI): start node with "
        "--experimental-wasm-stack-switching (Node 20) or --experimental-wasm-jspi (Node 22)"
    )


class WebLoopRunner:
    """asyncio.Runner's surface (what pytest-asyncio uses) over Pyodide's WebLoop."""

    def __init__(self, *, debug=None, loop_factory=None):
        self._factory = loop_factory
        self._loop = None

    def __enter__(self):
        self.get_loop()
        return self

    def __exit__(self, *exc):
        self.close()

    def get_loop(self):
        if self._loop is None:
            self._loop = self._factory() if self._factory else asyncio.new_event_loop()
        return self._loop

    def run(self, coro, *, context=None):
        loop = self.get_loop()
        task = loop.create_task(asyncio.wait_for(coro, RUN_TIMEOUT), context=context)
        try:
            return loop.run_until_complete(task)
        except TimeoutError:
            raise TimeoutError(
                f"timed out after {RUN_TIMEOUT:g}s inside Pyodide (HAZE_CF_CONTRACT_RUN_TIMEOUT)"
            ) from None

    def close(self):
        self._loop = None


asyncio.Runner = WebLoopRunner
asyncio.runners.Runner = WebLoopRunner

import pytest


class Reporter:
    """Writes one JSON line per test phase (and per collection error) as it happens."""

    def __init__(self, path):
        self.out = open(path, "a", encoding="utf-8")  # noqa: SIM115

    def _write(self, record):
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()

    def pytest_runtest_logstart(self, nodeid, location):
        self._write({"nodeid": nodeid, "when": "start", "t": time.time()})

    def pytest_runtest_logreport(self, report):
        record = {
            "nodeid": report.nodeid,
            "when": report.when,
            "outcome": report.outcome,
            "duration": round(report.duration, 3),
        }
        if report.skipped and isinstance(report.longrepr, tuple):
            record["reason"] = str(report.longrepr[2])
        elif report.failed:
            record["longrepr"] = report.longreprtext[-6000:]
        if report.capstderr and report.failed:
            record["stderr"] = report.capstderr[-3000:]
        if report.caplog and report.failed:
            record["log"] = report.caplog[-3000:]
        self._write(record)

    def pytest_collectreport(self, report):
        if report.failed:
            self._write(
                {
                    "nodeid": report.nodeid,
                    "when": "collect",
                    "outcome": "failed",
                    "longrepr": report.longreprtext[-6000:],
                }
            )


os.chdir(ROOT)
reporter = Reporter(RESULTS)
started = time.monotonic()
outer = asyncio.events._get_running_loop()
try:
    exit_code = pytest.main(
        [
            "-p",
            "no:cacheprovider",
            "-q",
            "--color=no",
            "-o",
            "console_output_style=classic",
            # suites parametrised by store, not by driver; the public driver contract runs
            # on the server-side drivers (and starts processes, which Pyodide cannot)
            *(
                "--ignore=tests/contract/" + f
                for f in (
                    "test_store_contract.py",
                    "test_batch_crash.py",
                    "test_chain_crash.py",
                    "test_schedule_crash.py",
                    "test_public_driver_contract.py",
                    "test_failed_store_contract.py",
                    "test_workflow_state.py",
                )
            ),
            *(SELECT or ["tests/contract"]),
        ],
        plugins=[reporter],
    )
finally:
    # Every WebLoop installs itself as the running loop; give the script's own back.
    asyncio.events._set_running_loop(outer)
    state = sys.modules.get("haze_test_cf_contract_state")
    if state is not None:
        reporter._write({"nodeid": "", "when": "stats", **state.totals})
    reporter.out.close()

{"exit_code": int(exit_code), "seconds": round(time.monotonic() - started, 1)}
