"""The ``vercel`` driver outside the contract: poll mode with real ``haze queue:work``
processes, and bad input (each one clear line, or a failed job naming the reason).

Real: the driver and the official ``vercel-queue`` SDK, the SDK's local queue service
(``tests/drivers/vercel_spec.py``), ``haze queue:work`` subprocesses, an SQLite failed
store. The SDK client also plays a foreign producer that sends what haze never would
(a body that is not JSON, a job name no app registered).
"""

from __future__ import annotations

import asyncio
import json
import os
import runpy
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from haze import App, define_database_config, define_job, define_queue_config
from haze.errors import ConfigError, DelayTooLongError, PayloadTooLargeError

spec = runpy.run_path(str(Path(__file__).parent / "vercel_spec.py"))

APP_JOBS = """\
from haze import JobContext, define_job


@define_job(name="vp_note", tries=3, backoff=[1])
async def vp_note(payload: dict, job: JobContext) -> None:
    if payload.get("fail_first") and job.attempt == 1:
        raise RuntimeError("first try fails")
    with open(payload["file"], "a") as f:
        f.write(f"{payload['n']} {job.attempt}\\n")
"""


def _write_app(root: Path, template: str, tmp: Path) -> Path:
    files = {
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
                connections={{"vercel": {{
                    "driver": "vercel", "topic": "{template}", "base_url": env("VQ_URL"),
                    "token": "local-token", "region": "iad1", "retry_after": "30s",
                    "failed_store": "main", "queues": ["default", "high"],
                }}}},
            )
            """,
        "app/job/vp_jobs.py": APP_JOBS,
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def _env(**extra: str) -> dict[str, str]:
    drop = ("PYTEST", "HAZE_", "VERCEL")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(extra)
    return env


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=180
    )


def _failed_rows(tmp: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(tmp / "failed.db") as db:
        return list(db.execute("SELECT payload, exception FROM failed_jobs ORDER BY id"))


def test_queue_work_consumes_the_topics_and_a_foreign_body_fails_naming_why(
    tmp_path: Path,
) -> None:
    server = spec["server"]()
    template = spec["unique_topic"]("poll")
    root = _write_app(tmp_path / "site", template, tmp_path)
    env = _env(VQ_URL=str(server.base_url))
    out = tmp_path / "ran.txt"
    producer = textwrap.dedent(
        f"""\
        import asyncio, sys
        from haze import App, Queue
        from vercel.queue import QueueClient, ALL_DEPLOYMENTS
        async def main():
            async with App(root={str(root)!r}):
                for n in range(20):
                    await Queue.dispatch("vp_note", {{"file": sys.argv[1], "n": n,
                                         "fail_first": n % 5 == 0}},
                                         queue="high" if n % 2 else "default")
                await Queue.dispatch("vp_note", {{"file": sys.argv[1], "n": 99}}, delay=2)
            client = QueueClient(token="local-token", region="iad1", base_url=sys.argv[2],
                                 deployment=ALL_DEPLOYMENTS)
            topic = {template!r}.format(queue="default")
            await client.send(topic, b"this is not json {{", )
            await client.send(topic, {{"v": 1, "id": "f00d", "job": "no_such_job",
                                       "payload": {{}}, "queue": "default", "ts": 1.0}})
        asyncio.run(main())
        """
    )
    sent = _run(["-c", producer, str(out), str(server.base_url)], env, tmp_path)
    assert sent.returncode == 0, sent.stdout + sent.stderr
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "haze.cli",
                "--root",
                str(root),
                "queue:work",
                "--connection",
                "vercel",
                "--queue",
                "high,default",
                "--sleep",
                "0.1",
                "--stop-when-empty",
            ],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [w.communicate(timeout=120)[0] for w in workers]
    assert all(w.returncode == 0 for w in workers), outputs
    # what --stop-when-empty left (the delayed job, a retry's backoff) a last worker takes
    for _ in range(10):
        if spec["pending_on"](template) == 0:
            break
        last = _run(
            [
                "-m",
                "haze.cli",
                "--root",
                str(root),
                "queue:work",
                "--connection",
                "vercel",
                "--queue",
                "high,default",
                "--sleep",
                "0.1",
                "--stop-when-empty",
            ],
            env,
            tmp_path,
        )
        assert last.returncode == 0, last.stdout + last.stderr
    ran = sorted(out.read_text().splitlines(), key=lambda line: int(line.split()[0]))
    expected = [f"{n} {2 if n % 5 == 0 else 1}" for n in range(20)] + ["99 1"]
    assert ran == expected, ran
    rows = _failed_rows(tmp_path)
    reasons = " | ".join(e.strip().splitlines()[-1] for _, e in rows)
    assert len(rows) == 2, rows
    assert "JSON" in reasons or "json" in reasons, reasons
    assert "no_such_job" in reasons, reasons
    assert spec["pending_on"](template) == 0


@define_job(name="vb_echo")
async def vb_echo(payload: dict[str, Any]) -> None:
    pass


def _app(**options: Any) -> App:
    connection = {**spec["connection"](), **options}
    return App(
        queue=define_queue_config(default="v", connections={"v": connection}, store="memory"),
        database=define_database_config(default="m", connections={"m": {"url": "sqlite://"}}),
    )


async def test_an_oversize_payload_names_the_cap() -> None:
    async with _app(max_message_size=2000):
        with pytest.raises(PayloadTooLargeError, match="over the 2000-byte limit") as e:
            await vb_echo.dispatch({"blob": "x" * 3000})
        assert "\n" not in str(e.value)
    async with _app():  # the default: 4 MiB, under a Vercel function's request limit
        with pytest.raises(PayloadTooLargeError, match="over the 4194304-byte limit"):
            await vb_echo.dispatch({"blob": "x" * 4 * 1024 * 1024})


async def test_a_max_message_size_over_the_service_cap_is_refused() -> None:
    with pytest.raises(ConfigError, match="100 MB") as e:
        async with _app(max_message_size=200_000_000):
            await vb_echo.dispatch({})
    assert "\n" not in str(e.value)


async def test_a_delay_past_the_cap_without_hops_is_refused_and_with_hops_is_sent() -> None:
    async with _app(hops=False) as app:
        with pytest.raises(DelayTooLongError, match="cap") as e:
            await vb_echo.dispatch({}, delay="8d")
        assert "\n" not in str(e.value) and "hops" in str(e.value)
        del app
    template = spec["unique_topic"]("hop")
    async with _app(topic=template):
        await vb_echo.dispatch({}, delay="8d")
    state = spec["server"]().state
    [stored] = [m for m in state.messages if m.topic == template.format(queue="default")]
    body = json.loads(stored.payload.read())
    # one hop: held the longest the service keeps a message less an hour to run it
    assert stored.delay_seconds == 7 * 24 * 3600 - 3600
    assert body["meta"]["due"] > stored.created_at.timestamp() + 8 * 24 * 3600 - 60


async def test_no_token_or_url_outside_vercel_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("VERCEL", "VERCEL_QUEUE_TOKEN", "VERCEL_OIDC_TOKEN", "VERCEL_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("VERCEL_QUEUE_BASE_URL", raising=False)
    async with _app(token=None):
        with pytest.raises(ConfigError, match="needs a token") as e:
            await vb_echo.dispatch({})
        assert "\n" not in str(e.value)
    async with _app(base_url=None, region=None):
        with pytest.raises(ConfigError, match="region") as e:
            await vb_echo.dispatch({})
        assert "\n" not in str(e.value)


async def test_the_queue_count_says_what_the_api_does_not_tell() -> None:
    from haze import queue_check

    async with _app():
        report = await queue_check()
        assert report.ok, report
        assert any("tells no queue depth" in note for note in report.notes), report
        assert report.sizes == {}


def test_an_unreachable_service_is_an_outage_not_a_traceback() -> None:
    async def go() -> None:
        async with _app(base_url="http://127.0.0.1:9"):
            await vb_echo.dispatch({})

    with pytest.raises(Exception) as e:
        asyncio.run(go())
    assert "unavailable" in str(e.value) and "\n" not in str(e.value), e.value
    # no try got a connection: nothing can be queued, so not "may be queued"
    from haze import DispatchOutcomeUnknownError

    assert not isinstance(e.value, DispatchOutcomeUnknownError), e.value


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("haze-fixed", "{queue}"),  # every haze queue would share one topic
        ("haze-{tenant}-{queue}", "{tenant}"),
        ("haze-{0}-{queue}", "{0}"),
        ("haze-{queue", "{queue}"),
    ],
)
async def test_a_topic_template_that_is_not_one_topic_per_queue_is_one_line(
    template: str, says: str
) -> None:
    with pytest.raises(ConfigError, match="topic") as e:
        async with _app(topic=template):
            await vb_echo.dispatch({}, queue="a")
    assert says in str(e.value) and "\n" not in str(e.value), e.value


@pytest.mark.parametrize(
    ("options", "key"),
    [({"region": "US-EAST"}, "region"), ({"base_url": "not a url"}, "base_url")],
)
async def test_a_bad_region_or_base_url_is_one_line_naming_the_key(
    options: dict[str, Any], key: str
) -> None:
    with pytest.raises(ConfigError, match=key) as e:
        async with _app(**options):
            await vb_echo.dispatch({})
    assert "\n" not in str(e.value), e.value


RUNS: list[Any] = []


@define_job(name="vb_count")
async def vb_count(payload: dict[str, Any]) -> None:
    RUNS.append(payload["n"])


async def _post(function: Any, body: bytes, headers: dict[str, str]) -> int:
    """One push callback to the consumer function, as Vercel POSTs it (the ASGI app
    called in process: uvicorn would only carry the same bytes)."""
    sent: list[Any] = []
    scope = {
        "type": "http",
        "method": "POST",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(event: Any) -> None:
        sent.append(event)

    await function(scope, receive, send)
    return int(sent[0]["status"])


async def test_a_push_callback_replayed_after_its_ack_or_forged_does_not_run_the_job() -> None:
    from haze.integrations.vercel_queue import QueueFunction

    RUNS.clear()
    template = spec["unique_topic"]("replay")
    async with _app(topic=template) as app:
        await vb_count.dispatch({"n": 1})
        function = QueueFunction(app=app)
        server = spec["server"]()
        [delivery] = list(server.iter_push_deliveries(template.format(queue="default"), "haze"))
        headers = dict(delivery.headers)
        assert await _post(function, delivery.body, headers) == 200
        assert RUNS == [1]
        # the same callback again (an HTTP retry of a delivery already acknowledged)
        assert await _post(function, delivery.body, headers) < 500
        # a callback no delivery of the service made: another payload, a made-up handle
        forged = {**headers, "ce-vqsmessageid": "msg_forged", "ce-vqsreceipthandle": "rh_x"}
        body = delivery.body.replace(b'"n":1', b'"n":2')
        assert await _post(function, body, forged) < 500
        assert RUNS == [1], RUNS


async def test_a_short_retention_keeps_half_of_it_to_run_the_job_not_an_hour() -> None:
    # retention "10m" is allowed (1 min to 7 days): an hour kept to run a message left a
    # 1 s hop, so a 30 s delay was refused (or bounced through 30 hops)
    template = spec["unique_topic"]("ret")
    async with _app(topic=template, retention="10m", hops=False):
        await vb_echo.dispatch({}, delay=30)
        with pytest.raises(DelayTooLongError, match="over the 300s cap") as e:
            await vb_echo.dispatch({}, delay=301)
        assert "\n" not in str(e.value)
    state = spec["server"]().state
    [stored] = [m for m in state.messages if m.topic == template.format(queue="default")]
    assert stored.delay_seconds == 30
    assert "meta" not in json.loads(stored.payload.read())


SLOW_JOB = """\
import asyncio, os
from haze import define_job


@define_job(name="vp_slow", tries=3)
async def vp_slow(payload: dict) -> None:
    with open(payload["file"], "a") as f:
        f.write(f"start {os.getpid()}\\n")
    await asyncio.sleep(payload["secs"])
"""


def test_a_job_longer_than_the_shortest_lease_runs_once(tmp_path: Path) -> None:
    # retry_after "1s" is allowed (the service's shortest lease): a heartbeat every
    # second renewed it too late, so a 4 s job ran on each worker in turn and failed
    # with its tries used up
    server = spec["server"]()
    template = spec["unique_topic"]("lease")
    root = _write_app(tmp_path / "site", template, tmp_path)
    queue_py = root / "config" / "queue.py"
    queue_py.write_text(queue_py.read_text().replace('"30s"', '"1s"'))
    (root / "app" / "job" / "vp_jobs.py").write_text(SLOW_JOB)
    env = _env(VQ_URL=str(server.base_url))
    out = tmp_path / "ran.txt"
    producer = (
        "import asyncio, sys\nfrom haze import App, Queue\nasync def main():\n"
        f"    async with App(root={str(root)!r}):\n"
        "        await Queue.dispatch('vp_slow', {'file': sys.argv[1], 'secs': 4})\n"
        "asyncio.run(main())\n"
    )
    sent = _run(["-c", producer, str(out)], env, tmp_path)
    assert sent.returncode == 0, sent.stdout + sent.stderr
    args = ["-m", "haze.cli", "--root", str(root), "queue:work", "--max-time", "9s"]
    workers = [
        subprocess.Popen(
            [sys.executable, *args],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    logs = [w.communicate(timeout=120)[0] for w in workers]
    assert out.read_text().count("start") == 1, (out.read_text(), logs)
    assert "FAILED" not in "".join(logs), logs


async def test_a_post_that_is_no_push_delivery_is_a_400_naming_what_is_missing() -> None:
    from haze.integrations.vercel_queue import QueueFunction

    template = spec["unique_topic"]("junk")
    async with _app(topic=template) as app:
        function = QueueFunction(app=app)
        assert await _post(function, b"", {}) == 400
        assert await _post(function, b"{}", {"ce-type": "com.example.other"}) == 400
        only_type = {"ce-type": "com.vercel.queue.v2beta"}
        assert await _post(function, b"{}", only_type) == 400


async def test_queue_check_is_not_ok_when_the_queue_api_cannot_be_reached(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # no queue depth to read must not mean nothing to check: the service is still asked
    from haze import queue_check

    for name in ("VERCEL", "VERCEL_QUEUE_TOKEN", "VERCEL_OIDC_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for options, says in [
        ({"base_url": "http://127.0.0.1:9"}, "unavailable"),
        ({"token": None}, "token"),
    ]:
        async with _app(**options):
            report = await queue_check()
        assert not report.ok and not report.reachable, (options, report)
        assert report.error and says in report.error and "\n" not in report.error, report.error


async def test_a_foreign_body_keeps_the_queue_it_was_sent_to() -> None:
    # a body that is not JSON names no queue: it failed as queue "default", so its failed
    # record (and queue:retry) pointed at a queue it was never on
    from haze.drivers.vercel import VercelDriver

    template = spec["unique_topic"]("foreign")
    async with _app(topic=template) as app:
        driver = app.driver("v")
        assert isinstance(driver, VercelDriver)
        await driver.client().send(driver.topic("high"), b"not json {")
        job = await driver.reserve(["high"], 5)
        assert job is not None and job.error is not None
        assert job.queue == "high", job.queue
        await driver.ack(job)


async def test_a_bulk_reaches_each_topic_in_dispatch_order() -> None:
    # the members were sent all at once, so the service stored them in whatever order
    # the requests ended: a worker of concurrency 1 ran a batch's later members first
    # (a first failure cancelled nothing; a member held at a gate ran after the others)
    from haze import Queue

    template = spec["unique_topic"]("order")
    # the first member of each queue the largest, as a batch's data-carrying head may be
    blob = {0: "x" * 1_000_000, 1: "x" * 1_000_000}
    async with _app(topic=template):
        await Queue.bulk(
            [
                vb_echo.with_({"n": n, "blob": blob.get(n, "")}).on_queue(
                    "high" if n % 3 else "default"
                )
                for n in range(30)
            ]
        )
    state = spec["server"]().state
    for queue in ("default", "high"):
        topic = template.format(queue=queue)
        sent = [
            json.loads(m.payload.read())["payload"]["n"] for m in state.messages if m.topic == topic
        ]
        want = [n for n in range(30) if (queue == "high") == bool(n % 3)]
        assert sent == want, (queue, sent)


class _RefuseSends:
    """The local queue service refusing (400) each send whose body holds ``marker``, as
    the hosted one refuses a message it will not take; the other sends reach it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, marker: bytes) -> None:
        server = spec["server"]().app.server
        put = server.put

        def refusing(topic: str, payload: bytes, headers: Any) -> Any:
            if marker in payload:
                raise ValueError("refused by the test")  # the service answers 400
            return put(topic, payload, headers)

        monkeypatch.setattr(server, "put", refusing)


async def test_a_send_refused_mid_bulk_names_the_messages_not_queued(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from haze import DispatchIncompleteError, Queue

    _RefuseSends(monkeypatch, b'"refuse"')
    template = spec["unique_topic"]("partial")
    async with _app(topic=template):
        jobs = [vb_echo.with_({"n": n, "mark": "refuse" if n == 2 else ""}) for n in range(5)]
        with pytest.raises(DispatchIncompleteError) as e:
            await Queue.bulk(jobs)
    # the two before it were sent; it and the two after it (same topic) were not
    assert spec["pending_on"](template) == 2
    assert len(e.value.failed) == 3 and e.value.unsent == 3, e.value
    assert "queued 2 of 5" in str(e.value) and "\n" not in str(e.value)


async def test_a_batch_whose_send_is_refused_mid_way_still_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from haze import DispatchIncompleteError, Queue

    _RefuseSends(monkeypatch, b'"refuse"')
    async with _app() as app:
        jobs = [vb_echo.with_({"n": n, "mark": "refuse" if n == 1 else ""}) for n in range(3)]
        with pytest.raises(DispatchIncompleteError) as e:
            await Queue.batch(jobs).allow_failures().dispatch()
        assert e.value.batch_id is not None
        # counted before dispatch() returned: the refused one and the one after it
        batch = await Queue.find_batch(e.value.batch_id)
        assert batch is not None
        assert (batch.total, batch.failed, batch.pending) == (3, 2, 1), batch
        del app


class _LoseAnswers:
    """The local queue service storing each send whose body holds ``marker`` and then
    failing before it answers (a 500, every try), as a service that wrote the message
    and lost its answer: the client cannot know whether it was stored."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, marker: bytes) -> None:
        server = spec["server"]().app.server
        put = server.put

        def losing(topic: str, payload: bytes, headers: Any) -> Any:
            stored = put(topic, payload, headers)
            if marker in payload:
                raise RuntimeError("answer lost by the test")  # the service answers 500
            return stored

        monkeypatch.setattr(server, "put", losing)


def _stored_ids(template: str) -> dict[int, str]:
    """Payload ``n`` -> job id of the messages the service kept on the "default" topic."""
    state = spec["server"]().state
    topic = template.format(queue="default")
    bodies = [
        json.loads(m.payload.read())
        for m in list(state.messages)
        if m.topic == topic and m.duplicate_of is None
    ]
    return {b["payload"]["n"]: b["id"] for b in bodies}


async def test_a_send_whose_answer_is_lost_mid_bulk_is_named_as_may_be_queued(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # it went out: counted "not queued", a batch counted a job that runs as failed
    from haze import DispatchIncompleteError, Queue

    _LoseAnswers(monkeypatch, b'"lose"')
    template = spec["unique_topic"]("lost")
    async with _app(topic=template):
        jobs = [vb_echo.with_({"n": n, "mark": "lose" if n == 2 else ""}) for n in range(4)]
        with pytest.raises(DispatchIncompleteError) as e:
            await Queue.bulk(jobs)
    stored = _stored_ids(template)
    assert sorted(stored) == [0, 1, 2], stored  # the service kept the one it did not answer
    assert e.value.unknown == [stored[2]], e.value
    assert len(e.value.failed) == 1 and stored[2] not in e.value.failed, e.value
    assert e.value.unsent == 1, e.value
    assert "queued 2 of 4" in str(e.value) and "1 may be queued" in str(e.value)
    assert "\n" not in str(e.value)


async def test_a_dispatch_whose_answer_is_lost_may_be_queued() -> None:
    from haze import DispatchOutcomeUnknownError

    template = spec["unique_topic"]("lost1")
    with pytest.MonkeyPatch.context() as monkeypatch:
        _LoseAnswers(monkeypatch, b'"lose"')
        async with _app(topic=template):
            with pytest.raises(DispatchOutcomeUnknownError) as e:
                await vb_echo.dispatch({"n": 0, "mark": "lose"})
    assert list(e.value.job_ids) == [_stored_ids(template)[0]], e.value
    assert "may be queued" in str(e.value) and "\n" not in str(e.value), e.value


@define_job(name="vb_note")
async def vb_note(payload: Any) -> None:
    RUNS.append(payload)


async def test_a_batch_whose_send_lost_its_answer_waits_for_that_job_and_ends_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the job whose answer was lost was counted failed at dispatch, and ran as well
    from haze import DispatchIncompleteError, Queue
    from haze._workers.worker import Worker

    RUNS.clear()
    _LoseAnswers(monkeypatch, b'"lose"')
    template = spec["unique_topic"]("lostb")
    async with _app(topic=template) as app:
        jobs = [vb_note.with_({"n": n, "mark": "lose" if n == 1 else ""}) for n in range(3)]
        pending = Queue.batch(jobs).allow_failures()
        pending = pending.catch(vb_note.with_("catch")).finally_(vb_note.with_("finally"))
        with pytest.raises(DispatchIncompleteError) as e:
            await pending.dispatch()
        assert e.value.batch_id is not None and len(e.value.unknown) == 1, e.value
        batch = await Queue.find_batch(e.value.batch_id)
        assert batch is not None
        # the one after it was not sent: failed; the one whose answer was lost: pending
        assert (batch.total, batch.failed, batch.pending, batch.unknown) == (3, 1, 2, 1), batch
        worker = Worker(app, "v", None, 1, sleep=0.01, max_sleep=0.05)
        worker.start()
        try:
            for _ in range(400):  # until the batch ended and every message was taken
                batch = await Queue.find_batch(e.value.batch_id)
                assert batch is not None
                if batch.finished and "finally" in RUNS and spec["pending_on"](template) == 0:
                    break
                await asyncio.sleep(0.05)
        finally:
            await worker.stop()
    assert batch.finished, batch
    # it ran and counted, or (taken after the batch's other job had ended: the Queue API
    # cannot look it up) counted failed and was skipped: never both
    ran = sorted(r["n"] for r in RUNS if isinstance(r, dict))
    assert ran in ([0], [0, 1]), RUNS
    assert (batch.processed, batch.failed) == (len(ran), 3 - len(ran)), batch
    assert sorted(r for r in RUNS if isinstance(r, str)) == ["catch", "finally"], RUNS
