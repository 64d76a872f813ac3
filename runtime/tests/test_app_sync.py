"""``with App(...)`` and ``App.start_blocking()``/``stop_blocking()`` for sync code
(Flask, Django, scripts): the app is current, memory jobs run between calls, and
leaving waits for the running jobs."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from haze import App, Queue, define_job, define_queue_config, use_app

done: list[Any] = []


@define_job(name="app_sync_record")
def app_sync_record(payload: dict[str, Any]) -> None:
    time.sleep(payload.get("sleep", 0))
    done.append(payload["n"])


def memory_app() -> App:
    return App(
        queue=define_queue_config(
            default="memory", connections={"memory": {"driver": "memory", "concurrency": 2}}
        )
    )


def test_with_app_is_a_sync_context_manager() -> None:
    done.clear()
    with memory_app() as app:
        assert use_app() is app
        app_sync_record.dispatch_blocking({"n": 1})
        Queue.idle_blocking()
        assert done == [1]
    assert use_app() is not app, "the app is no longer current after the block"


def test_leaving_the_block_waits_for_running_jobs() -> None:
    done.clear()
    with memory_app():
        app_sync_record.dispatch_blocking({"n": 2, "sleep": 0.3})
        time.sleep(0.05)  # the in-process consumer has picked it up
    assert done == [2]


def test_start_blocking_and_stop_blocking_from_sync_code_and_threads() -> None:
    done.clear()
    app = memory_app().start_blocking()
    try:
        assert use_app() is app
        threads = [
            threading.Thread(target=app_sync_record.dispatch_blocking, args=({"n": n},))
            for n in range(5)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        Queue.idle_blocking()
        assert sorted(done) == [0, 1, 2, 3, 4]
    finally:
        app.stop_blocking()
    app.stop_blocking()  # a second stop is harmless


def test_with_app_reads_the_root(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "queue.py").write_text(
        "from haze import define_queue_config\n"
        'config = define_queue_config(default="mem", connections={"mem": {"driver": "memory"}})\n'
    )
    with App(root=tmp_path) as app:
        assert app.queue_config.default == "mem"
        assert use_app() is app
