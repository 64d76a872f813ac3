"""The CLI as a real process: signals, exit codes, no tracebacks, generated files import."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from cli_procs import Lines, db_root

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def env() -> dict[str, str]:
    e = dict(os.environ)
    e.pop("HAZE_APP_ROOT", None)
    e["PYTHONUNBUFFERED"] = "1"
    return e


def haze(root: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "haze.cli", "--root", str(root), *args],
        capture_output=True,
        text=True,
        env=env(),
        timeout=timeout,
    )


def spawn(root: Path, *args: str) -> Lines:
    proc = subprocess.Popen(
        [sys.executable, "-m", "haze.cli", "--root", str(root), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )
    return Lines(proc)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_work_exits_0_promptly_on_signal(tmp_path: Path, sig: signal.Signals) -> None:
    child = spawn(db_root(tmp_path), "queue:work", "--connection", "db")
    child.wait_for("Working connection")
    sent = time.monotonic()
    child.proc.send_signal(sig)
    out, err = child.finish()
    assert child.proc.returncode == 0, err
    assert time.monotonic() - sent < 5
    assert "Worker stopped after 0 job(s)." in out
    assert "Traceback" not in err


# A job module that queues one slow job when the worker first loops. It enqueues through
# the driver so the CLI's worker, not an in-app consumer, is the one that runs it.
SLOW_JOB = """\
import asyncio
from haze import Queue, define_job, use_app

@define_job(name="cli_process_slow")
async def slow(payload: dict) -> None:
    print("started", flush=True)
    await asyncio.sleep(payload["seconds"])
    print("finished", flush=True)

sent = []

@Queue.on("looping")
async def queue_one(connection, queues):
    if sent:
        return
    sent.append(True)
    app = use_app()
    pending = slow.with_({"seconds": SECONDS})
    conn, q = app.manager.resolve(pending)
    message = app.manager.build(pending, conn, q)
    driver = app.driver(conn)
    await driver.enqueue(app.manager.encode(message, driver, slow), message, 0.0)
"""


def start_slow_worker(root: Path, seconds: float) -> Lines:
    job = root / "app" / "job" / "slow.py"
    job.parent.mkdir(parents=True)
    job.write_text(SLOW_JOB.replace("SECONDS", repr(seconds)))
    return spawn(db_root(root), "queue:work", "-v")


def test_sigterm_lets_the_running_job_finish(tmp_path: Path) -> None:
    child = start_slow_worker(tmp_path, 0.5)
    child.wait_for("started")
    child.proc.send_signal(signal.SIGTERM)
    out, err = child.finish()
    assert child.proc.returncode == 0, err
    assert "waiting for 1 running job(s)" in out
    assert "finished" in out
    assert "DONE" in out
    assert "cli_process_slow" in out
    assert "Worker stopped after 1 job(s)." in out


def test_a_second_signal_quits_without_waiting(tmp_path: Path) -> None:
    child = start_slow_worker(tmp_path, 60)
    child.wait_for("started")
    child.proc.send_signal(signal.SIGTERM)
    child.wait_for("Send it again")
    sent = time.monotonic()
    child.proc.send_signal(signal.SIGTERM)
    out, err = child.finish()
    assert child.proc.returncode == 128 + signal.SIGTERM, err
    assert time.monotonic() - sent < 5
    assert "finished" not in out
    assert "Stopped without waiting" in out
    assert "Traceback" not in err


def test_config_error_names_file_and_key_without_traceback(tmp_path: Path) -> None:
    config = tmp_path / "config" / "queue.py"
    config.parent.mkdir()
    config.write_text(
        textwrap.dedent(
            """\
            from haze import define_queue_config
            config = define_queue_config(
                default="main", connections={"main": {"driver": "carrier-pigeon"}}
            )
            """
        )
    )
    result = haze(tmp_path, "queue:work")
    assert result.returncode == 1
    assert str(config) in result.stderr
    assert "connections.main.driver" in result.stderr
    assert "carrier-pigeon" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_unknown_command_exits_2_without_traceback(tmp_path: Path) -> None:
    result = haze(tmp_path, "queue:frobnicate")
    assert result.returncode == 2
    assert "No such command 'queue:frobnicate'" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_make_job_writes_a_module_that_registers(tmp_path: Path) -> None:
    result = haze(tmp_path, "make:job", "SendInvoice")
    assert result.returncode == 0, result.stderr
    path = tmp_path / "app" / "job" / "send_invoice.py"
    assert str(path) in result.stdout
    check = textwrap.dedent(
        f"""\
        import asyncio
        from haze import App, Queue
        from haze._jobs.definition import get_job
        app = App(root={str(tmp_path)!r})
        job = get_job("send_invoice")
        assert job.name == "send_invoice", job.name

        async def main():
            async with app:
                await job.dispatch({{"invoice_id": 1}})
                await Queue.idle()
            assert await Queue.failed() == []
            print("ok", job.tries)

        asyncio.run(main())
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, env=env(), timeout=30
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["ok", "3"]
