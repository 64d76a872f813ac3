"""A backend that cannot be reached is one line, not a traceback (Redis, SQS).

Each test points a connection at a loopback port nothing listens on: a real refused
TCP connection, the same thing a stopped server gives. Dispatch raises
``BackendUnavailableError`` with a one-line message naming the connection and no chained
client traceback; every ``haze`` command prints one ``Error:`` line and exits 1; a worker
that starts while the backend is down logs one warning and keeps waiting.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from haze import App, BackendUnavailableError, define_job, define_queue_config

pytestmark = pytest.mark.timeout(120)


def dead_port() -> int:
    """A loopback port with no listener (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@define_job(name="outage_probe")
async def outage_probe(payload: dict[str, int]) -> None:
    return None


def write_app(root: Path, queue_py: str, redis_py: str | None = None) -> Path:
    (root / "config").mkdir(parents=True)
    (root / "app" / "job").mkdir(parents=True)
    (root / "config" / "queue.py").write_text(textwrap.dedent(queue_py))
    if redis_py is not None:
        (root / "config" / "redis.py").write_text(textwrap.dedent(redis_py))
    (root / "app" / "job" / "probe.py").write_text(
        textwrap.dedent(
            """
            from haze import define_job

            @define_job(name="outage_probe")
            async def outage_probe(payload: dict) -> None:
                return None
            """
        )
    )
    (root / "dispatch.py").write_text(
        textwrap.dedent(
            """
            import asyncio
            from haze import App

            async def main() -> None:
                async with App(root=".") as app:
                    from app.job.probe import outage_probe
                    await outage_probe.dispatch({"n": 1})

            asyncio.run(main())
            """
        )
    )
    return root


def env() -> dict[str, str]:
    e = dict(os.environ)
    e.pop("HAZE_APP_ROOT", None)
    e.update(PYTHONUNBUFFERED="1", COLUMNS="200", AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x")
    return e


def haze(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "haze.cli", "--root", str(root), *args],
        capture_output=True,
        text=True,
        env=env(),
        timeout=90,
        cwd=root,
    )


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    err = lines(proc.stderr)
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(err) == 1 and err[0].startswith("Error: "), proc.stderr
    for needle in needles:
        assert needle in err[0], err[0]


def assert_short_dispatch_traceback(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    """A script whose dispatch failed: one traceback, ending in the one-line haze error."""
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("Traceback") == 1, proc.stderr
    assert "The above exception" not in proc.stderr, proc.stderr
    assert "During handling" not in proc.stderr, proc.stderr
    last = lines(proc.stderr)[-1]
    assert last.startswith("haze.errors.BackendUnavailableError: "), proc.stderr
    for needle in needles:
        assert needle in last, last


# --------------------------------------------------------------------------- Redis


REDIS_QUEUE = """
    from haze import define_queue_config
    config = define_queue_config(
        default="cache", connections={"cache": {"driver": "redis", "connection": "main"}}
    )
"""


def redis_app(tmp_path: Path) -> tuple[Path, int]:
    port = dead_port()
    redis_py = f"""
        from haze import define_redis_config
        config = define_redis_config(
            default="main", connections={{"main": {{"url": "redis://127.0.0.1:{port}/0"}}}}
        )
    """
    return write_app(tmp_path / "app", REDIS_QUEUE, redis_py), port


async def test_dispatch_to_a_dead_redis_raises_one_line() -> None:
    port = dead_port()
    app = App(
        queue=define_queue_config(
            default="cache",
            connections={"cache": {"driver": "redis", "url": f"redis://127.0.0.1:{port}/0"}},
        )
    )
    async with app:
        with pytest.raises(BackendUnavailableError) as info:
            await outage_probe.dispatch({"n": 1})
        with pytest.raises(BackendUnavailableError):
            await app.manager.bulk([outage_probe.with_({"n": 2})])
    message = str(info.value)
    assert "\n" not in message
    assert "'cache'" in message and f"127.0.0.1:{port}" in message
    assert info.value.__cause__ is None and info.value.__suppress_context__


@pytest.mark.parametrize(
    "command",
    [
        ["queue:size"],
        ["queue:failed"],
        ["queue:clear", "--queue", "default"],
        ["queue:retry", "all"],
    ],
    ids=lambda c: c[0],
)
def test_cli_commands_on_a_dead_redis_print_one_line(tmp_path: Path, command: list[str]) -> None:
    root, port = redis_app(tmp_path)
    assert_one_line_error(haze(root, *command), "'cache'", f"127.0.0.1:{port}")


@pytest.mark.parametrize("command", [["queue:pause", "default"], ["queue:restart"]], ids=str)
def test_cli_commands_on_a_dead_redis_store_print_one_line(
    tmp_path: Path, command: list[str]
) -> None:
    root, port = redis_app(tmp_path)  # the store is the redis store of that connection
    assert_one_line_error(haze(root, *command), f"127.0.0.1:{port}")


def test_a_script_dispatching_to_a_dead_redis_shows_one_short_traceback(tmp_path: Path) -> None:
    root, port = redis_app(tmp_path)
    proc = subprocess.run(
        [sys.executable, "dispatch.py"],
        capture_output=True,
        text=True,
        env=env(),
        timeout=60,
        cwd=root,
    )
    assert_short_dispatch_traceback(proc, "'cache'", f"127.0.0.1:{port}")
    assert len(lines(proc.stderr)) < 40, proc.stderr  # user, asyncio and haze frames only


def test_a_worker_started_while_redis_is_down_logs_one_line_and_waits(tmp_path: Path) -> None:
    root, port = redis_app(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "haze.cli", "--root", str(root), "queue:work", "--sleep", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        cwd=root,
    )
    try:
        time.sleep(4)  # several claim retries, each refused
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, (out, err)
    assert "Traceback" not in err, err
    warnings = lines(err)
    assert len(warnings) == 1, err
    assert "'cache' is unavailable" in warnings[0] and f"127.0.0.1:{port}" in warnings[0]


# --------------------------------------------------------------------------- SQS


def sqs_queue_py(port: int) -> str:
    return f"""
        from haze import define_queue_config
        config = define_queue_config(
            default="jobs",
            connections={{"jobs": {{"driver": "sqs", "region": "eu-west-1",
                "queue_url": "http://127.0.0.1:{port}/123456789012/default",
                "endpoint_url": "http://127.0.0.1:{port}"}}}},
            store="memory",
        )
    """


needs_boto3 = pytest.mark.skipif(
    __import__("importlib").util.find_spec("boto3") is None, reason="boto3 is not installed"
)


@needs_boto3
async def test_dispatch_to_an_unreachable_sqs_raises_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    port = dead_port()
    url = f"http://127.0.0.1:{port}"
    app = App(
        queue=define_queue_config(
            default="jobs",
            connections={
                "jobs": {
                    "driver": "sqs",
                    "region": "eu-west-1",
                    "queue_url": f"{url}/123456789012/default",
                    "endpoint_url": url,
                }
            },
            store="memory",
        )
    )
    async with app:
        with pytest.raises(BackendUnavailableError) as info:
            await outage_probe.dispatch({"n": 1})
    message = str(info.value)
    assert "\n" not in message and "'jobs'" in message and f"127.0.0.1:{port}" in message
    assert info.value.__cause__ is None and info.value.__suppress_context__


@needs_boto3
def test_cli_on_an_unreachable_sqs_prints_one_line(tmp_path: Path) -> None:
    port = dead_port()
    root = write_app(tmp_path / "app", sqs_queue_py(port))
    assert_one_line_error(haze(root, "queue:size"), "'jobs'", f"127.0.0.1:{port}")


def test_dead_port_is_dead() -> None:
    """The premise of every test here: connecting to ``dead_port()`` is refused."""

    async def connect(port: int) -> None:
        await asyncio.open_connection("127.0.0.1", port)

    with pytest.raises(OSError):
        asyncio.run(connect(dead_port()))
