"""The runtime imports and runs memory-driver jobs inside real Pyodide, with no threads.

Node.js loads the npm ``pyodide`` package from ``tests/pyodide/node_modules`` (nothing
comes from a CDN), installs the freshly built ``haze`` wheel and runs SCENARIOS.
With ``HAZE_PYODIDE_HOME=tests/pyodide-0.28`` every Pyodide test (this file's, the
Cloudflare adapter's and the Miniflare harness's) runs on Pyodide 0.28.2 instead of the
newest: the version Cloudflare Python Workers run from compatibility date 2025-09-29,
which ``haze build --preset cloudflare`` pins. CI runs them on both.
Booting Pyodide costs seconds, so every scenario runs in one Pyodide session and each
test checks its own scenario's outcome; a scenario that raises only fails its own test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from services import tool_missing

pytestmark = pytest.mark.pyodide

ROOT = Path(__file__).resolve().parent.parent
PYODIDE_DIR = Path(__file__).resolve().parent / "pyodide"
RUN_MJS = PYODIDE_DIR / "run.mjs"
#: Where run.mjs loads Pyodide from (see the module docstring).
PYODIDE_HOME = ROOT / os.environ.get("HAZE_PYODIDE_HOME", PYODIDE_DIR)


class PyodideRunner:
    """Runs a Python snippet in a fresh Pyodide (``node run.mjs``) and returns its result."""

    def __init__(self, node: str, wheels: list[Path], workdir: Path) -> None:
        self.node = node
        self.wheels = wheels
        self.workdir = workdir
        self._n = 0

    def run_raw(
        self, code: str, *, wheels: list[Path] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        self._n += 1
        script = self.workdir / f"script_{self._n}.py"
        script.write_text(textwrap.dedent(code))
        args = [self.node, str(RUN_MJS)]
        for wheel in self.wheels if wheels is None else wheels:
            args += ["--wheel", str(wheel)]
        args.append(str(script))
        return subprocess.run(
            args, cwd=PYODIDE_DIR, capture_output=True, text=True, timeout=timeout, check=False
        )

    def run(self, code: str, *, wheels: list[Path] | None = None, timeout: float = 60) -> Any:
        proc = self.run_raw(code, wheels=wheels, timeout=timeout)
        if proc.returncode != 0:
            pytest.fail(f"pyodide run failed (exit {proc.returncode}):\n{proc.stderr}")
        return json.loads(proc.stdout)


@pytest.fixture(scope="session")
def pyodide_node() -> str:
    node = shutil.which("node")
    if node is None:
        tool_missing("Node.js is not installed")
    if not (PYODIDE_DIR / "node_modules" / "pyodide").is_dir():
        npm = shutil.which("npm")
        if npm is None:
            tool_missing("npm is not installed")
        # A fresh clone has no node_modules; the lock file pins the exact Pyodide.
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=PYODIDE_DIR,
            check=True,
            timeout=300,
            capture_output=True,
        )
    return node


@pytest.fixture(scope="session")
def haze_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("haze-wheel")
    uv = shutil.which("uv")
    if uv is not None:
        cmd = [uv, "build", "--wheel", "runtime", "-o", str(out)]
    else:
        cmd = [sys.executable, "-m", "build", "--wheel", "runtime", "-o", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, f"building the haze wheel failed:\n{proc.stdout}\n{proc.stderr}"
    (wheel,) = out.glob("haze_jobs-*.whl")
    return wheel


@pytest.fixture(scope="session")
def pyodide_runner(
    pyodide_node: str, haze_wheel: Path, tmp_path_factory: pytest.TempPathFactory
) -> PyodideRunner:
    return PyodideRunner(pyodide_node, [haze_wheel], tmp_path_factory.mktemp("pyodide-scripts"))


# Runs inside Pyodide. The thread guard is installed before haze is imported so it
# sees any thread the runtime would start, at import or later.
SCENARIOS = r"""
import _thread
import asyncio
import sys
import threading
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

import haze
from haze import App, JobContext, Queue, define_job, define_queue_config

MAIN_IDENT = threading.get_ident()


def new_app():
    return App(queue=define_queue_config(
        default="memory", connections={"memory": {"driver": "memory"}}))


async def retry_cycle():
    attempts = []

    @define_job(tries=2, backoff=0.01)
    async def pyo_flaky(payload, job: JobContext):
        attempts.append(job.attempt)
        if job.attempt == 1:
            raise RuntimeError("first attempt fails")
        return payload["n"]

    async with new_app():
        job_id = await pyo_flaky.dispatch({"n": 1})
        await Queue.idle()
        failed = await Queue.failed()
    return {"job_id": job_id, "attempts": attempts, "failed": [f.name for f in failed]}


async def exhausted():
    attempts = []

    @define_job(tries=2, backoff=0.01)
    async def pyo_always_fails(payload, job: JobContext):
        attempts.append(job.attempt)
        raise ValueError(f"no luck {payload['n']}")

    async with new_app():
        job_id = await pyo_always_fails.dispatch({"n": 7})
        await Queue.idle()
        failed = await Queue.failed()
    return {
        "job_id": job_id,
        "attempts": attempts,
        "failed": [{"id": f.id, "name": f.name, "payload": f.payload, "exception": f.exception}
                   for f in failed],
    }


async def delayed():
    loop = asyncio.get_running_loop()
    ran_at = []

    @define_job()
    async def pyo_delayed(payload, job: JobContext):
        ran_at.append(loop.time())

    async with new_app():
        start = loop.time()
        await pyo_delayed.dispatch({}, delay="300ms")
        await asyncio.sleep(0.1)
        early = list(ran_at)
        await Queue.idle()
    return {"early": early, "elapsed": [t - start for t in ran_at]}


async def sync_handler():
    calls = []

    @define_job()
    def pyo_sync(payload, job: JobContext):
        calls.append({
            "attempt": job.attempt,
            "payload": payload,
            "main_thread": threading.get_ident() == MAIN_IDENT
                           and threading.current_thread() is threading.main_thread(),
        })

    async with new_app():
        await pyo_sync.dispatch({"k": "v"})
        await Queue.idle()
        failed = await Queue.failed()
    return {"calls": calls, "failed": [f.exception for f in failed]}


async def release():
    attempts = []

    @define_job(tries=1)
    async def pyo_release(payload, job: JobContext):
        attempts.append(job.attempt)
        if len(attempts) == 1:
            job.release(0.01)

    async with new_app():
        await pyo_release.dispatch({})
        await Queue.idle()
        failed = await Queue.failed()
    return {"attempts": attempts, "failed": [f.exception for f in failed]}


results = {}
for scenario in (retry_cycle, exhausted, delayed, sync_handler, release):
    try:
        # A hang (e.g. a timer that never fired) fails its own scenario, not the whole run.
        value = await asyncio.wait_for(scenario(), 20)
        results[scenario.__name__] = {"ok": True, "value": value}
    except BaseException:
        results[scenario.__name__] = {"ok": False, "error": traceback.format_exc()}

starts_during_scenarios = list(thread_starts)
# Prove the guard is wired: a deliberate start must be seen (it fails under Pyodide).
try:
    threading.Thread(target=lambda: None).start()
except RuntimeError:
    pass

import pyodide

results["environment"] = {"ok": True, "value": {
    "platform": sys.platform,
    "pyodide": pyodide.__version__,
    "python": sys.version.split()[0],
    "haze_file": haze.__file__,
    "thread_starts": starts_during_scenarios,
    "guard_probe": thread_starts[len(starts_during_scenarios):],
    "active_count": threading.active_count(),
    "threads": [t.name for t in threading.enumerate()],
    "default_executor": asyncio.get_running_loop()._default_executor is not None
                        if hasattr(asyncio.get_running_loop(), "_default_executor") else None,
}}
results
"""


@pytest.fixture(scope="session")
def scenarios(pyodide_runner: PyodideRunner) -> dict[str, Any]:
    result: dict[str, Any] = pyodide_runner.run(SCENARIOS, timeout=120)
    return result


def outcome(scenarios: dict[str, Any], name: str) -> Any:
    entry = scenarios[name]
    if not entry["ok"]:
        pytest.fail(f"scenario {name} raised inside Pyodide:\n{entry['error']}")
    return entry["value"]


def test_haze_imports_under_emscripten(scenarios: dict[str, Any]) -> None:
    env = outcome(scenarios, "environment")
    assert env["platform"] == "emscripten"
    # The wheel, not some copy of the source tree, is what Pyodide imported.
    assert "site-packages" in env["haze_file"]


def test_the_pyodide_is_the_one_installed_where_asked(scenarios: dict[str, Any]) -> None:
    env = outcome(scenarios, "environment")
    pinned = json.loads((PYODIDE_HOME / "package.json").read_text())["dependencies"]["pyodide"]
    assert env["pyodide"] == pinned, (
        f"{PYODIDE_HOME}/package.json pins {pinned}, but {env['pyodide']} ran: "
        f"run npm ci in {PYODIDE_HOME}"
    )
    # the two versions CI runs: Cloudflare's current one (Python 3.13) and the newest (3.14)
    assert env["python"].startswith("3.13." if pinned.startswith("0.28.") else "3.14.")


def test_dispatch_execute_retry_cycle(scenarios: dict[str, Any]) -> None:
    value = outcome(scenarios, "retry_cycle")
    assert value["attempts"] == [1, 2]
    assert value["failed"] == []
    assert value["job_id"]


def test_exhausted_job_lands_in_failed(scenarios: dict[str, Any]) -> None:
    value = outcome(scenarios, "exhausted")
    assert value["attempts"] == [1, 2]
    (failed,) = value["failed"]
    assert failed["id"] == value["job_id"]
    assert failed["name"] == "pyo_always_fails"
    assert failed["payload"] == {"n": 7}
    assert "no luck 7" in failed["exception"]


def test_delayed_job_runs_after_its_delay(scenarios: dict[str, Any]) -> None:
    value = outcome(scenarios, "delayed")
    assert value["early"] == []
    (elapsed,) = value["elapsed"]
    # JS timers may fire a hair early relative to the loop clock.
    assert 0.28 <= elapsed < 5


def test_sync_handler_runs_inline(scenarios: dict[str, Any]) -> None:
    value = outcome(scenarios, "sync_handler")
    assert value["failed"] == []
    assert value["calls"] == [{"attempt": 1, "payload": {"k": "v"}, "main_thread": True}]


def test_release_reruns_without_consuming_a_try(scenarios: dict[str, Any]) -> None:
    value = outcome(scenarios, "release")
    # tries=1: if release() consumed a try, the second run would never happen.
    assert value["attempts"] == [1, 1]
    assert value["failed"] == []


def test_no_thread_was_started(scenarios: dict[str, Any]) -> None:
    # Runs last in the session script, so it covers every scenario above.
    env = outcome(scenarios, "environment")
    assert env["guard_probe"], "the thread guard did not see a deliberate Thread.start()"
    assert env["thread_starts"] == []
    assert env["active_count"] == 1
    assert env["threads"] == ["MainThread"]
    assert env["default_executor"] in (False, None)


def test_runner_exits_non_zero_on_python_error(pyodide_runner: PyodideRunner) -> None:
    proc = pyodide_runner.run_raw("raise RuntimeError('boom from pyodide')", wheels=[])
    assert proc.returncode != 0
    assert "boom from pyodide" in proc.stderr
    assert proc.stdout == ""
