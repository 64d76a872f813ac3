"""``haze build --preset vercel`` for an app on a ``vercel`` connection: the consumer
function ``api/queue.py``, called the way Vercel Queues calls it.

Real: the built ``dist/vercel/`` (``api/queue.py`` and ``api/dispatch.py``, the vendored
haze, the bundled app), its ASGI ``app`` served by uvicorn from ``api/`` in a
subprocess; the official ``vercel-queue`` SDK on both sides; the SDK's own local queue
service (``vercel.queue.devserver``, see ``tests/drivers/vercel_spec.py``), which
leases each visible message of a topic as a push delivery (the CloudEvent headers and
body Vercel POSTs to a consumer function) with ``iter_push_deliveries``; the test POSTs
each delivery to the function, as Vercel's push path does. The failed store is an
SQLite file. Stand-in: Vercel's Python runtime, played by uvicorn (as for
``api/dispatch.py``); the ``vercel.json`` trigger is checked for its shape, not deployed.
"""

from __future__ import annotations

import json
import runpy
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
from haze.build import build
from preset_support import clean_env, lines_of, uvicorn, write_app

spec = runpy.run_path(str(Path(__file__).parents[1] / "drivers" / "vercel_spec.py"))

JOBS = """\
from haze import JobContext, define_job


def note(payload: dict, text: str) -> None:
    with open(payload["file"], "a") as f:
        f.write(text + "\\n")


@define_job(name="vq_flaky", tries=3, backoff=[1])
async def vq_flaky(payload: dict, job: JobContext) -> None:
    note(payload, f"flaky {job.attempt}")
    if job.attempt == 1:
        raise RuntimeError("first try fails")


@define_job(name="vq_release", tries=1)
async def vq_release(payload: dict, job: JobContext) -> None:
    with open(payload["file"]) as f:
        first = "release" not in f.read()
    note(payload, f"release {job.attempt}")
    if first:
        job.release(0)


@define_job(name="vq_broken", tries=1)
async def vq_broken(payload: dict, job: JobContext) -> None:
    raise ValueError("broken on purpose")
"""


def _config(tmp: Path, topic: str) -> dict[str, str]:
    return {
        "config/database.py": f"""\
            from haze import define_database_config
            config = define_database_config(
                default="main", connections={{"main": {{"url": "sqlite:///{tmp}/failed.db"}}}}
            )
            """,
        "config/queue.py": f"""\
            from haze import define_queue_config, env
            config = define_queue_config(
                default="vercel",
                connections={{
                    "vercel": {{
                        "driver": "vercel",
                        "topic": "{topic}",
                        "base_url": env("VQ_URL"),
                        "token": "local-token",
                        "region": "iad1",
                        "retry_after": "60s",
                        "failed_store": "main",
                    }},
                }},
            )
            """,
        "app/job/vq_jobs.py": JOBS,
    }


def _push_all(server: Any, topic: str, url: str, rounds: float = 8.0) -> int:
    """POST every push delivery of ``topic`` to the function until none comes for a
    while (retries come back after their backoff); returns how many were POSTed."""
    posted, quiet_since = 0, time.monotonic()
    deadline = quiet_since + 90
    while time.monotonic() - quiet_since < rounds:
        assert time.monotonic() < deadline, f"deliveries kept coming: {posted} POSTs"
        got = False
        for delivery in server.iter_push_deliveries(topic, "haze"):
            answer = httpx.post(url, content=delivery.body, headers=delivery.headers, timeout=60)
            assert answer.status_code == 200, answer.text
            posted += 1
            got = True
        if got:
            quiet_since = time.monotonic()
        time.sleep(0.2)
    return posted


def test_the_queue_function_runs_each_pushed_message(tmp_path: Path) -> None:
    server = spec["server"]()
    template = spec["unique_topic"]("push")
    topic = template.format(queue="default")
    root = write_app(tmp_path / "site", _config(tmp_path, template), name="vq_write")
    result = build(root, "vercel", tmp_path / "dist")
    dest = result.path
    config = json.loads((dest / "vercel.json").read_text())
    assert set(config["functions"]) == {"api/dispatch.py", "api/queue.py"}
    consumer = config["functions"]["api/queue.py"]
    assert consumer["maxDuration"] == 300
    assert consumer["includeFiles"] == config["functions"]["api/dispatch.py"]["includeFiles"]
    assert consumer["experimentalTriggers"] == [
        {
            "type": "queue/v2beta",
            "topic": template.split("{queue}")[0] + "*",
            "consumer": "haze",
            "retryAfterSeconds": 60,
        }
    ]
    assert "vercel-queue>=0.10" in (dest / "requirements.txt").read_text()
    assert any("api/queue.py" in n for n in result.notes), result.notes

    env = clean_env(VQ_URL=str(server.base_url))
    out = tmp_path / "ran.txt"
    # Vercel's runtime loads the function from its path; loaded as a module named
    # "queue" from api/ it would shadow the standard library's queue module.
    loader = tmp_path / "vercel_loader"
    loader.mkdir()
    (loader / "vq_entry.py").write_text(
        f"import runpy\napp = runpy.run_path({str(dest / 'api' / 'queue.py')!r})['app']\n"
    )
    proc, base = uvicorn(loader, "vq_entry:app", env, "/api/queue")
    try:
        url = base + "/api/queue"
        assert httpx.get(url, timeout=30).status_code == 405
        # A producer (the app, as the dispatch function would) sends the jobs.
        runner = (
            "import asyncio, sys\n"
            "from haze import App, Queue\n"
            "async def main():\n"
            f"    async with App(root={str(dest)!r}):\n"
            "        f = sys.argv[1]\n"
            "        await Queue.dispatch('vq_flaky', {'file': f})\n"
            "        await Queue.dispatch('vq_release', {'file': f})\n"
            "        await Queue.dispatch('vq_broken', {'file': f})\n"
            "        await Queue.dispatch('vq_write', {'file': f, 'tag': 'plain'})\n"
            "asyncio.run(main())\n"
        )
        import subprocess
        import sys

        sent = subprocess.run(
            [sys.executable, "-c", runner, str(out)],
            env=env,
            cwd=dest,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert sent.returncode == 0, sent.stdout + sent.stderr
        posted = _push_all(server, topic, url)
    finally:
        proc.kill()
    ran = lines_of(out)
    # flaky: retried through the message's visibility after its 1 s backoff, as try 2
    assert ran.count("flaky 1") == 1 and ran.count("flaky 2") == 1, ran
    # release: a new message, and the release used no try (tries=1, still attempt 1)
    assert ran.count("release 1") == 2, ran
    assert ran.count("start plain") == 1 and ran.count("end plain") == 1, ran
    assert posted == 6, f"4 messages, a retry and a released copy: {posted} POSTs"
    with sqlite3.connect(tmp_path / "failed.db") as db:
        rows = db.execute("SELECT exception FROM failed_jobs").fetchall()
    assert len(rows) == 1 and "broken on purpose" in rows[0][0], rows
    # every message is settled: nothing is left for the consumer group
    assert spec["pending_on"](template) == 0


def test_the_example_app_builds_for_vercel_with_a_consumer(
    tmp_path: Path, monkeypatch: Any
) -> None:
    import shutil

    repo = Path(__file__).resolve().parents[2]
    copy = tmp_path / "examples"
    shutil.copytree(
        repo / "examples", copy, ignore=shutil.ignore_patterns("storage", "__pycache__", "dist")
    )
    monkeypatch.setenv("QUEUE_CONNECTION", "vercel")
    result = build(copy, "vercel", tmp_path / "dist")
    config = json.loads((result.path / "vercel.json").read_text())
    assert set(config["functions"]) == {"api/dispatch.py", "api/queue.py"}
    [trigger] = config["functions"]["api/queue.py"]["experimentalTriggers"]
    assert trigger["topic"] == "haze-example-*" and trigger["consumer"] == "haze"
    assert (result.path / "api" / "queue.py").is_file()


async def test_the_trigger_names_the_consumer_group_the_poll_workers_read_as(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # A consumer group with an underscore: the SDK escapes it ("haze_workers" is read as
    # "haze__workers"), so a trigger naming it unescaped made a second group, and each
    # message went to the push function (which had no subscriber for it) and to the
    # poll workers both.
    from haze import App, Queue
    from haze.drivers.vercel import VercelDriver
    from haze.integrations.vercel_queue import QueueFunction

    server = spec["server"]()
    template = spec["unique_topic"]("grp")
    files = _config(tmp_path, template)
    files["config/queue.py"] = files["config/queue.py"].replace(
        '"failed_store": "main",', '"failed_store": "main", "consumer_group": "haze_workers",'
    )
    root = write_app(tmp_path / "site", files, name="vq_write")
    result = build(root, "vercel", tmp_path / "dist")
    config = json.loads((result.path / "vercel.json").read_text())
    [trigger] = config["functions"]["api/queue.py"]["experimentalTriggers"]
    monkeypatch.setenv("VQ_URL", str(server.base_url))
    out = tmp_path / "ran.txt"
    async with App(root=root) as app:
        await Queue.dispatch("vq_write", {"file": str(out), "tag": "grp"})
        function = QueueFunction(app=app)
        transport = httpx.ASGITransport(app=function)
        async with httpx.AsyncClient(transport=transport, base_url="http://fn") as client:
            deliveries = list(
                server.iter_push_deliveries(template.format(queue="default"), trigger["consumer"])
            )
            assert len(deliveries) == 1
            answer = await client.post(
                "/api/queue", content=deliveries[0].body, headers=dict(deliveries[0].headers)
            )
            assert answer.status_code == 200, answer.text
        driver = app.driver("vercel")
        assert isinstance(driver, VercelDriver)
        # the poll workers' group: the message was settled for it too
        assert await driver.reserve(["default"], 0) is None
    assert lines_of(out).count("end grp") == 1, lines_of(out)


def test_the_trigger_lease_is_the_drivers_for_a_fractional_retry_after(tmp_path: Path) -> None:
    # "0.5s" is a lease of 1 s on the driver (whole seconds, rounded up); the trigger
    # said 0, which is no lease at all
    template = spec["unique_topic"]("frac")
    files = _config(tmp_path, template)
    files["config/queue.py"] = files["config/queue.py"].replace('"60s"', '"0.5s"')
    root = write_app(tmp_path / "site", files, name="vq_write")
    result = build(root, "vercel", tmp_path / "dist")
    config = json.loads((result.path / "vercel.json").read_text())
    [trigger] = config["functions"]["api/queue.py"]["experimentalTriggers"]
    assert trigger["retryAfterSeconds"] == 1, trigger
