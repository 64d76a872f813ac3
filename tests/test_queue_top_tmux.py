"""``haze queue:top`` in a real terminal (tmux) against a PostgreSQL queue with a worker
running one job: the live view shows the counts and the running job, refreshes, and
Ctrl-C quits it cleanly.

Needs ``tmux`` (scripts/_services.sh installs it; skipped without it locally, a failure
under CI) and PostgreSQL.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from services import CI, server_missing, throwaway_pg_database

PG_ADMIN = os.environ.get("HAZE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture(autouse=True)
def _tmux() -> None:
    if shutil.which("tmux") is None:
        message = "tmux is not installed (scripts/_services.sh ensure_tools installs it)"
        if CI:
            pytest.fail(message)
        pytest.skip(message)


QUEUE = """\
from haze import define_queue_config
config = define_queue_config(
    default="database",
    connections={"database": {"driver": "database", "sleep": 0.1, "concurrency": 1}},
)
"""
DATABASE = """\
from haze import define_database_config, env
config = define_database_config(default="main", connections={"main": {"url": env("TOP_DB_URL")}})
"""
JOBS = """\
import asyncio
from haze import define_job

@define_job(name="top_slow", queue="reports")
async def top_slow(payload):
    await asyncio.sleep(payload["seconds"])
"""


@pytest.fixture
def pg_url() -> Iterator[str]:
    psycopg = pytest.importorskip("psycopg")
    try:
        psycopg.connect(PG_ADMIN, autocommit=True).close()
    except psycopg.OperationalError as e:
        server_missing("PostgreSQL", PG_ADMIN, str(e))
    with throwaway_pg_database(PG_ADMIN, f"haze_top_{os.getpid()}") as url:
        yield url


def _haze(root: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "haze.cli", "--root", str(root), *args]


def test_queue_top_in_a_terminal(tmp_path: Path, pg_url: str) -> None:
    root = tmp_path / "app"
    (root / "config").mkdir(parents=True)
    (root / "app" / "job").mkdir(parents=True)
    (root / "config" / "queue.py").write_text(QUEUE)
    (root / "config" / "database.py").write_text(DATABASE)
    (root / "app" / "job" / "top_jobs.py").write_text(JOBS)
    env = {**os.environ, "TOP_DB_URL": pg_url}
    run: dict[str, Any] = {"env": env, "capture_output": True, "text": True, "timeout": 120}
    for args in (("make:queue-tables",), ("db:migrate",)):
        done = subprocess.run(_haze(root, *args), **run)
        assert done.returncode == 0, done.stdout + done.stderr
    dispatch = (
        "import asyncio\n"
        "from haze import App\n"
        "from app.job.top_jobs import top_slow\n"
        "async def main():\n"
        "    async with App(root='.'):\n"
        "        for s in (60, 1, 1):\n"
        "            await top_slow.dispatch({'seconds': s})\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run([sys.executable, "-c", dispatch], cwd=root, **run)
    assert done.returncode == 0, done.stderr
    worker = subprocess.Popen(
        _haze(root, "queue:work", "--queue", "reports", "--quiet"),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    sock = f"haze-top-{os.getpid()}"
    tmux = ["tmux", "-L", sock]
    command = " ".join(
        shlex.quote(a)
        for a in ["env", f"TOP_DB_URL={pg_url}", *_haze(root, "queue:top", "--interval", "0.3")]
    )
    try:
        subprocess.run(
            [
                *tmux,
                "new-session",
                "-d",
                "-s",
                "top",
                "-x",
                "110",
                "-y",
                "30",
                f"{command}; echo EXITED $?; sleep 60",
            ],
            check=True,
        )

        def screen() -> str:
            return subprocess.run(
                [*tmux, "capture-pane", "-p", "-t", "top"], capture_output=True, text=True
            ).stdout

        def wait_for(check: object, within: float = 60.0) -> str:
            deadline = time.monotonic() + within
            text = ""
            while time.monotonic() < deadline:
                text = screen()
                if check(text):  # type: ignore[operator]
                    return text
                time.sleep(0.2)
            raise AssertionError(f"not on screen after {within}s:\n{text}")

        def row(text: str) -> list[str]:
            # cells between the box lines: Queue, Ready, Oldest ready, Delayed, Running, ...
            for line in text.splitlines():
                cells = [c.strip() for c in line.replace("┃", "│").split("│")]
                cells = [c for c in cells if c]
                if cells[:1] == ["reports"]:
                    return cells
            return []

        def waiting_behind_the_slow_job(text: str) -> bool:
            cells = row(text)
            return (
                len(cells) >= 5
                and (cells[1], cells[3], cells[4]) == ("2", "0", "1")
                and cells[2].endswith("s")  # the oldest ready job's age, e.g. "59s"
                and "top_slow" in text
            )

        # the worker holds the 60 s job; the two others wait behind it
        text = wait_for(waiting_behind_the_slow_job)
        assert "Running now" in text
        assert 'haze queue:top · "database"' in text
        stamp = next(line for line in text.splitlines() if "haze queue:top" in line)
        wait_for(lambda t: stamp not in t)  # the clock in the title moved: it refreshes
        subprocess.run([*tmux, "send-keys", "-t", "top", "C-c"], check=True)
        text = wait_for(lambda t: "EXITED" in t, within=30)
        assert "Traceback" not in text
        assert "EXITED 0" in text or "EXITED 130" in text, text
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
