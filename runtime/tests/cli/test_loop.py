"""``--loop`` and ``HAZE_LOOP``: real ``queue:work`` / ``schedule:work`` processes on uvloop.

The jobs print the class of the loop they run on, so a test sees the loop the worker
really uses, not only what its start line says. uvloop "not installed" is a real failed
import: a ``uvloop`` package that raises ImportError, first on the child's PYTHONPATH.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from cli_procs import Lines, db_root
from haze._base.hints import install_hint

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals, no uvloop")

uvloop = pytest.importorskip("uvloop")

REDIS_URL = "redis://127.0.0.1:6379/0"

JOB = """\
import asyncio
from haze import define_job

@define_job(name="loop_probe")
async def loop_probe(payload: dict) -> None:
    loop = type(asyncio.get_running_loop())
    print(f"probe {payload['n']} on {loop.__module__}.{loop.__qualname__}", flush=True)
"""

SEND = """\
import asyncio
from haze import App, Queue

async def main() -> None:
    async with App(root=__file__):
        for n in range(COUNT):
            await Queue.dispatch("loop_probe", {"n": n})

asyncio.run(main())
"""


def child_env(haze_loop: str | None = None, *, no_uvloop: Path | None = None) -> dict[str, str]:
    e = dict(os.environ)
    e.pop("HAZE_APP_ROOT", None)
    e.pop("HAZE_LOOP", None)
    e["PYTHONUNBUFFERED"] = "1"
    if haze_loop is not None:
        e["HAZE_LOOP"] = haze_loop
    if no_uvloop is not None:
        e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(no_uvloop), e.get("PYTHONPATH")]))
    return e


def without_uvloop(tmp_path: Path) -> Path:
    """A folder whose ``uvloop`` fails to import, as it does where it is not installed."""
    folder = tmp_path / "no_uvloop"
    (folder / "uvloop").mkdir(parents=True)
    (folder / "uvloop" / "__init__.py").write_text("raise ImportError('no uvloop here')\n")
    return folder


def haze(root: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "haze.cli", "--root", str(root), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def spawn(root: Path, *args: str, env: dict[str, str]) -> Lines:
    proc = subprocess.Popen(
        [sys.executable, "-m", "haze.cli", "--root", str(root), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    return Lines(proc)


def with_jobs(root: Path, count: int) -> Path:
    (root / "app" / "job").mkdir(parents=True, exist_ok=True)
    (root / "app" / "job" / "probe.py").write_text(JOB)
    (root / "send.py").write_text(SEND.replace("COUNT", str(count)))
    return root


def send(root: Path) -> None:
    sent = subprocess.run(
        [sys.executable, str(root / "send.py")],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
        cwd=root,
    )
    assert sent.returncode == 0, sent.stderr


def redis_root(root: Path, prefix: str) -> Path:
    (root / "config").mkdir(parents=True, exist_ok=True)
    (root / "config" / "queue.py").write_text(
        textwrap.dedent(
            f"""\
            from haze import define_queue_config
            config = define_queue_config(default="r", connections={{"r": {{
                "driver": "redis", "url": "{REDIS_URL}", "prefix": "{prefix}"}}}})
            """
        )
    )
    return root


def require_redis() -> None:
    try:
        with socket.create_connection(("127.0.0.1", 6379), 0.5):
            return
    except OSError:
        message = "no Redis at 127.0.0.1:6379 (scripts/test starts it)"
    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(f"{message}. CI=true: the tests need every server", pytrace=False)
    pytest.skip(message)


def work_on_uvloop_until_sigterm(root: Path, count: int) -> None:
    """Send ``count`` jobs, run them with ``queue:work --loop uvloop``, stop it with SIGTERM."""
    send(root)
    child = spawn(root, "queue:work", "--loop", "uvloop", env=child_env())
    child.wait_for("loop uvloop)", timeout=20)
    for n in range(count):
        child.wait_for(f"probe {n} on uvloop.Loop", timeout=20)
    child.wait_for("DONE", timeout=20)  # the last job's line follows its print
    child.proc.send_signal(signal.SIGTERM)
    out, err = child.finish()
    assert child.proc.returncode == 0, err
    assert f"Worker stopped after {count} job(s)." in out
    assert "asyncio" not in out.replace("asyncio.", "")  # no job ran on asyncio's loop
    assert "Traceback" not in err


def test_queue_work_runs_jobs_on_uvloop_on_sqlite_and_stops_on_sigterm(tmp_path: Path) -> None:
    work_on_uvloop_until_sigterm(with_jobs(db_root(tmp_path), 5), 5)


def test_queue_work_runs_jobs_on_uvloop_on_redis_and_stops_on_sigterm(tmp_path: Path) -> None:
    require_redis()
    import redis

    prefix = f"hzloop{uuid.uuid4().hex[:8]}"
    try:
        work_on_uvloop_until_sigterm(with_jobs(redis_root(tmp_path, prefix), 5), 5)
    finally:
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(f"{prefix}:*"))
        if keys:
            client.delete(*keys)
        client.close()


def loop_of(root: Path, *args: str, env: dict[str, str]) -> str:
    """The loop a ``queue:work --stop-when-empty`` run names in its start line."""
    result = haze(root, "queue:work", "--stop-when-empty", *args, env=env)
    assert result.returncode == 0, result.stderr
    start = next(line for line in result.stdout.splitlines() if "Working connection" in line)
    return start.split(", loop ")[1].split(")")[0]


def test_auto_takes_uvloop_when_installed_else_asyncio(tmp_path: Path) -> None:
    root = db_root(tmp_path)
    assert loop_of(root, env=child_env()) == "uvloop"
    assert loop_of(root, "--loop", "auto", env=child_env()) == "uvloop"
    blocked = child_env(no_uvloop=without_uvloop(tmp_path))
    assert loop_of(root, env=blocked) == "asyncio"
    assert loop_of(root, "--loop", "asyncio", env=child_env()) == "asyncio"


def test_the_flag_wins_over_haze_loop(tmp_path: Path) -> None:
    root = db_root(tmp_path)
    assert loop_of(root, env=child_env("asyncio")) == "asyncio"
    assert loop_of(root, env=child_env(" UVLOOP ")) == "uvloop"
    assert loop_of(root, "--loop", "uvloop", env=child_env("asyncio")) == "uvloop"
    assert loop_of(root, "--loop", "asyncio", env=child_env("uvloop")) == "asyncio"
    # A bad variable is never read when the flag says which loop.
    assert loop_of(root, "--loop", "asyncio", env=child_env("bogus")) == "asyncio"


@pytest.mark.parametrize("command", ["queue:work", "schedule:work"])
def test_uvloop_asked_for_but_not_installed_is_one_line_and_exit_2(
    tmp_path: Path, command: str
) -> None:
    root = db_root(tmp_path)
    blocked = without_uvloop(tmp_path)
    hint = install_hint("uvloop")  # the child runs in this folder too
    result = haze(root, command, "--loop", "uvloop", env=child_env(no_uvloop=blocked))
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "Error: --loop uvloop needs the 'uvloop' package, which is not installed. "
        f"Install it with: {hint}"
    ]
    result = haze(root, command, env=child_env("uvloop", no_uvloop=blocked))
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "Error: HAZE_LOOP=uvloop needs the 'uvloop' package, which is not installed. "
        f"Install it with: {hint}"
    ]


@pytest.mark.parametrize("command", ["queue:work", "schedule:work"])
def test_a_bad_haze_loop_is_one_line_naming_the_variable(tmp_path: Path, command: str) -> None:
    result = haze(db_root(tmp_path), command, env=child_env("trio"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "Error: environment variable HAZE_LOOP='trio' is not an event loop; "
        "use auto, asyncio or uvloop"
    ]


def test_a_bad_loop_flag_is_a_usage_error(tmp_path: Path) -> None:
    result = haze(db_root(tmp_path), "queue:work", "--loop", "trio", env=child_env())
    assert result.returncode == 2
    assert "Invalid value for '--loop': 'trio' is not one of 'auto', 'asyncio', 'uvloop'" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr


def test_schedule_work_runs_on_uvloop_and_stops_on_sigterm(tmp_path: Path) -> None:
    root = with_jobs(db_root(tmp_path), 0)
    (root / "config" / "schedule.py").write_text(
        "from haze import schedule\n"
        "from app.job.probe import loop_probe\n"
        "schedule(loop_probe.with_({'n': 0}), every='1s', name='probe')\n"
    )
    child = spawn(root, "schedule:work", "--loop", "uvloop", env=child_env())
    child.wait_for("loop uvloop)", timeout=20)
    child.wait_for('Schedule "probe" dispatched', timeout=20)
    child.proc.send_signal(signal.SIGTERM)
    out, err = child.finish()
    assert child.proc.returncode == 0, err
    assert "Scheduler stopped after dispatching" in out
    assert "Traceback" not in err
