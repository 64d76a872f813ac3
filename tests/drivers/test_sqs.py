"""The ``sqs`` driver against SQS's API.

Real: haze (App, manager, Worker, SqsDriver), boto3/botocore, HTTP, the SQLite failed
store. Stand-in: ``moto`` in server mode for Amazon SQS (``sqs_spec.py`` starts it). moto
keeps the limits these tests exercise (DelaySeconds <= 900, no per-message delay on FIFO,
12 h visibility, FIFO groups and deduplication, batch limits), but its timing is coarse
and its ``ReceiveMessage`` is not safe under concurrency: no test relies on
exactly-once delivery (runs are counted as "at least", or with one consumer only).

``RejectEntries`` is a stand-in for SQS refusing some entries of a ``SendMessageBatch``
(a partial failure): moto only ever fails an entry whose ``DelaySeconds`` is over 900,
which the driver never sends, so the wrapper keeps the chosen entries from moto and
lists them under ``Failed`` as SQS does.

``SpyCalls`` wraps the driver's thread-pool submit to record the SQS calls it makes
(the calls still go to moto), so the tests can check parameters such as
``DelaySeconds``, ``VisibilityTimeout``, ``MessageGroupId`` and the batch sizes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import runpy
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from haze import (
    App,
    Queue,
    define_cache_config,
    define_database_config,
    define_job,
    define_queue_config,
)
from haze._base.errors import (
    ConfigError,
    DispatchIncompleteError,
    MissingDependencyError,
    PayloadTooLargeError,
    UnknownQueueError,
)
from haze._base.message import Message, encode, new_id
from haze._workers.worker import Worker

_SPEC = runpy.run_path(str(Path(__file__).with_name("sqs_spec.py")))
pytestmark = [_SPEC["needs_moto"], pytest.mark.timeout(120)]
ACCOUNT: str = _SPEC["ACCOUNT"]

# --------------------------------------------------------------------------- jobs

RUNS: dict[str, list[dict[str, Any]]] = {}


def _note(name: str, payload: Any, job: Any) -> None:
    RUNS.setdefault(name, []).append(
        {"payload": payload, "attempt": job.attempt, "at": time.monotonic(), "id": job.id}
    )


@define_job(tries=1)
async def sqs_ok(payload: dict[str, Any], job: Any) -> None:
    _note("sqs_ok", payload, job)


@define_job(tries=3, backoff=3)
async def sqs_flaky(payload: dict[str, Any], job: Any) -> None:
    _note("sqs_flaky", payload, job)
    if job.attempt < 2:
        raise RuntimeError("sqs_flaky: the first attempt fails")


@define_job(tries=1)
async def sqs_release_once(payload: dict[str, Any], job: Any) -> None:
    _note("sqs_release_once", payload, job)
    if len(RUNS["sqs_release_once"]) == 1:
        job.release(0)


@define_job(tries=1)
async def sqs_release_twice(payload: dict[str, Any], job: Any) -> None:
    _note("sqs_release_twice", payload, job)
    if len(RUNS["sqs_release_twice"]) <= 2:
        job.release(0)


@define_job(tries=3)
async def sqs_fail_then_release(payload: dict[str, Any], job: Any) -> None:
    _note("sqs_fail_then_release", payload, job)
    n = len(RUNS["sqs_fail_then_release"])
    if n == 1:
        raise RuntimeError("first run fails (a retry: uses a try)")
    if n == 2:
        job.release(0)  # uses no try: the next run is attempt 2 again


@define_job(tries=1)
async def sqs_always_fails(payload: dict[str, Any], job: Any) -> None:
    _note("sqs_always_fails", payload, job)
    raise ValueError("sqs_always_fails: nope")


@define_job(tries=1)
async def sqs_slow(payload: dict[str, Any], job: Any) -> None:
    _note("sqs_slow_started", payload, job)
    await asyncio.sleep(payload["seconds"])
    _note("sqs_slow", payload, job)


# --------------------------------------------------------------------------- helpers


class SpyCalls:
    """Records ``(operation, params)`` of every SQS call the driver makes."""

    def __init__(self, driver: Any) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        original = driver._submit

        def submit(op: str, **params: Any) -> Any:
            self.calls.append((op, params))
            return original(op, **params)

        driver._submit = submit

    def of(self, op: str) -> list[dict[str, Any]]:
        return [p for o, p in self.calls if o == op]


class RejectEntries:
    """SQS failing the ``SendMessageBatch`` entries whose payload's "i" is in ``reject``
    (see the module docstring); the other entries go to moto."""

    def __init__(self, driver: Any, reject: set[int]) -> None:
        original = driver._submit

        def submit(op: str, **params: Any) -> Any:
            if op != "send_message_batch":
                return original(op, **params)
            entries = params["Entries"]
            refused = [e for e in entries if _payload_i(e) in reject]
            kept = [e for e in entries if e not in refused]

            async def answer() -> dict[str, Any]:
                r = await original(op, **{**params, "Entries": kept}) if kept else {}
                failed = [
                    {
                        "Id": e["Id"],
                        "SenderFault": True,
                        "Code": "InvalidMessageContents",
                        "Message": "refused by the test",
                    }
                    for e in refused
                ]
                return {**r, "Failed": [*(r.get("Failed") or []), *failed]}

            return asyncio.ensure_future(answer())

        driver._submit = submit


def _payload_i(entry: dict[str, Any]) -> Any:
    return json.loads(entry["MessageBody"])["payload"].get("i")


def _queues(prefix: str, names: list[str], fifo: bool = False) -> dict[str, str]:
    suffix = ".fifo" if fifo else ""
    return _SPEC["create_queues"]([f"{prefix}-{n}{suffix}" for n in names], fifo=fifo)


@pytest.fixture
def make_app(tmp_path: Path) -> Callable[..., App]:
    """``make_app(**options)``: an App whose "sqs" connection uses fresh moto queues."""
    created: list[str] = []

    def make(
        *,
        fifo: bool = False,
        queues: tuple[str, ...] = ("default",),
        cache: Any = None,
        store: str | None = None,
        **options: Any,
    ) -> App:
        prefix = _SPEC["unique_prefix"]("d")
        created.extend(_queues(prefix, list(queues), fifo).values())
        suffix = ".fifo" if fifo else ""
        conn = {
            "driver": "sqs",
            "queue_url": f"{_SPEC['endpoint']()}/{ACCOUNT}/{prefix}-{{queue}}{suffix}",
            "endpoint_url": _SPEC["endpoint"](),
            "region": _SPEC["REGION"],
            "credentials": dict(_SPEC["CREDENTIALS"]),
            "failed_store": "main",
            "queues": list(queues),
            **options,
        }
        conn = {k: v for k, v in conn.items() if v is not None}
        db = f"sqlite:///{tmp_path}/sqs-{prefix}.db"
        return App(
            queue=define_queue_config(default="sqs", connections={"sqs": conn}, store=store),
            database=define_database_config(default="main", connections={"main": {"url": db}}),
            cache=cache,
        )

    yield make
    _SPEC["delete_queues"](created)


@pytest.fixture(autouse=True)
def _clear_runs() -> None:
    RUNS.clear()


async def run_until(
    app: App, done: Callable[[], bool], *, limit: float = 30.0, concurrency: int = 1
) -> None:
    """Run a worker on "sqs" until ``done()`` (or fail after ``limit`` seconds)."""
    worker = Worker(app, "sqs", None, concurrency, sleep=0.05, max_sleep=0.2)
    worker.start()
    try:
        deadline = time.monotonic() + limit
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"not done after {limit}s; runs: {RUNS}")
            await asyncio.sleep(0.05)
    finally:
        await worker.stop()


def _attrs(app: App, queue: str = "default") -> dict[str, int]:
    url = app.driver("sqs").queue_url_for(queue)  # type: ignore[attr-defined]
    a = _SPEC["client"]().get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
    return {k: int(v) for k, v in a["Attributes"].items() if k.startswith("ApproximateNumber")}


@pytest.fixture
async def app(make_app: Callable[..., App]) -> AsyncIterator[App]:
    a = make_app()
    async with a:
        yield a


# --------------------------------------------------------------------------- basics


async def test_send_receive_delete(app: App) -> None:
    job_id = await sqs_ok.dispatch({"n": 1})
    assert await app.driver("sqs").size("default") == 1
    await run_until(app, lambda: bool(RUNS.get("sqs_ok")))
    assert RUNS["sqs_ok"][0]["id"] == job_id
    assert RUNS["sqs_ok"][0]["attempt"] == 1
    assert RUNS["sqs_ok"][0]["payload"] == {"n": 1}
    assert await app.driver("sqs").size("default") == 0  # deleted on success


async def test_queues_map_to_sqs_queues(make_app: Callable[..., App]) -> None:
    app = make_app(queues=("high", "default"))
    driver: Any = app.driver("sqs")
    url_high = driver.queue_url_for("high")
    assert url_high.endswith("-high")
    assert driver.queue_for_name(url_high.rsplit("/", 1)[-1]) == "high"
    arn = f"arn:aws:sqs:us-east-1:{ACCOUNT}:{url_high.rsplit('/', 1)[-1]}"
    assert driver.url_for_arn(arn) == url_high
    assert (
        driver.url_for_arn(f"arn:aws:sqs:us-east-1:999999999999:{url_high.rsplit('/', 1)[-1]}")
        is None
    )
    async with app:
        await sqs_ok.dispatch({"q": "default"})
        await sqs_ok.with_({"q": "high"}).on_queue("high").dispatch()
        await run_until(app, lambda: len(RUNS.get("sqs_ok", [])) >= 2)
    assert [r["payload"]["q"] for r in RUNS["sqs_ok"]][:1] == ["high"]  # priority order
    # the sibling rule (no template): queue "emails" next to the default queue
    plain = App(
        queue=define_queue_config(
            default="s",
            connections={
                "s": {"driver": "sqs", "queue_url": "https://sqs.eu-west-1.amazonaws.com/1/app"}
            },
        )
    )
    d: Any = plain.driver("s")
    assert d.region == "eu-west-1"
    assert d.queue_url_for("default") == "https://sqs.eu-west-1.amazonaws.com/1/app"
    assert d.queue_url_for("emails") == "https://sqs.eu-west-1.amazonaws.com/1/emails"


def test_a_standard_template_never_takes_a_fifo_queue() -> None:
    base = f"https://sqs.eu-west-1.amazonaws.com/{ACCOUNT}"
    app = App(
        queue=define_queue_config(
            default="std",
            connections={
                "std": {"driver": "sqs", "queue_url": f"{base}/myapp-{{queue}}"},
                "fifo": {"driver": "sqs", "queue_url": f"{base}/myapp-{{queue}}.fifo"},
            },
        )
    )
    std: Any = app.driver("std")
    fifo: Any = app.driver("fifo")
    assert (std.queue_for_name("myapp-orders"), fifo.queue_for_name("myapp-orders")) == (
        "orders",
        None,
    )
    assert std.queue_for_name("myapp-orders.fifo") is None
    assert fifo.queue_for_name("myapp-orders.fifo") == "orders"
    assert std.url_for_arn(f"arn:aws:sqs:eu-west-1:{ACCOUNT}:myapp-orders.fifo") is None


async def test_a_standard_connection_sends_only_to_its_own_standard_queues(app: App) -> None:
    """A queue name ending in ".fifo" on a standard template names a FIFO queue, which
    takes no message without a group (SQS's raw MissingParameter error); a queue given as
    a URL must be one this connection's queue_url names (not any queue of the account)."""
    driver: Any = app.driver("sqs")
    base = driver.queue_url_for("default").rsplit("-", 1)[0]
    fifo_url = _SPEC["create_queues"]([f"{base.rsplit('/', 1)[-1]}-orders.fifo"], fifo=True)
    other = _SPEC["create_queues"]([_SPEC["unique_prefix"]("other")])
    other_url = next(iter(other.values()))
    try:
        with pytest.raises(UnknownQueueError, match="FIFO") as e:
            await sqs_ok.with_({"n": 1}).on_queue("orders.fifo").dispatch()
        assert "\n" not in str(e.value)
        with pytest.raises(UnknownQueueError, match="not a queue of connection"):
            await sqs_ok.with_({"n": 2}).on_queue(other_url).dispatch()
        with pytest.raises(UnknownQueueError, match="FIFO"):
            await Queue.bulk([sqs_ok.with_({"n": 3}).on_queue("orders.fifo")])
        assert not _SPEC["client"]().receive_message(QueueUrl=other_url).get("Messages")
        # the URL this connection derives for one of its queues still works
        await sqs_ok.with_({"n": 4}).on_queue(driver.queue_url_for("default")).dispatch()
    finally:
        _SPEC["delete_queues"]([*fifo_url.values(), *other.values()])


async def test_a_missing_queue_is_a_clear_error(app: App) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        await sqs_ok.with_({}).on_queue("nowhere").dispatch()


def test_missing_boto3_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 -> ImportError
    app = App(
        queue=define_queue_config(
            default="s", connections={"s": {"driver": "sqs", "queue_url": "https://x/1/q"}}
        )
    )
    with pytest.raises(MissingDependencyError, match=r"(haze-jobs|runtime)\[sqs\]"):
        app.driver("s")


# --------------------------------------------------------------------------- delays


async def test_short_delay_uses_delay_seconds(app: App) -> None:
    spy = SpyCalls(app.driver("sqs"))
    start = time.monotonic()
    await sqs_ok.dispatch({"n": "later"}, delay=1.5)
    [sent] = spy.of("send_message")
    assert sent["DelaySeconds"] == 2  # whole seconds, rounded up
    assert "due" not in sent["MessageBody"]
    assert _attrs(app)["ApproximateNumberOfMessagesDelayed"] == 1
    await run_until(app, lambda: bool(RUNS.get("sqs_ok")))
    assert RUNS["sqs_ok"][0]["at"] - start >= 1.0


async def test_a_delay_over_15_minutes_is_sent_with_due(app: App) -> None:
    spy = SpyCalls(app.driver("sqs"))
    before = time.time()
    await sqs_ok.dispatch({"n": "tomorrow"}, delay="1d")
    [sent] = spy.of("send_message")
    assert sent["DelaySeconds"] == 900
    due = json.loads(sent["MessageBody"])["meta"]["due"]
    assert before + 86400 - 0.01 <= due <= time.time() + 86400 + 1
    assert await app.driver("sqs").size("default") == 1


async def test_long_delays_are_forwarded_until_due(app: App) -> None:
    driver: Any = app.driver("sqs")
    driver.max_delay = 1  # a tiny SQS delay cap, so forwarding happens in seconds
    spy = SpyCalls(driver)
    start = time.monotonic()
    await sqs_ok.dispatch({"n": "forwarded"}, delay=6)  # 1 s hops: forwarded ~4 times
    first = spy.of("send_message")[0]
    assert first["DelaySeconds"] == 1
    assert "due" in json.loads(first["MessageBody"])["meta"]
    await run_until(app, lambda: bool(RUNS.get("sqs_ok")))
    ran = RUNS["sqs_ok"][0]
    assert ran["at"] - start >= 5.0  # not at 1 s, when SQS first delivered it
    assert ran["attempt"] == 1  # forwarding used no try
    sends = spy.of("send_message")
    assert len(sends) >= 2  # forwarded at least once (a new message each time)
    assert sends[-1]["DelaySeconds"] >= 1
    assert len(spy.of("delete_message")) >= 2  # each forwarded message, then the run's


async def test_delay_on_fifo_is_a_hold_that_uses_no_try(make_app: Callable[..., App]) -> None:
    app = make_app(fifo=True)
    async with app:
        spy = SpyCalls(app.driver("sqs"))
        start = time.monotonic()
        await sqs_ok.dispatch({"n": "fifo-later"}, delay=4)
        [sent] = spy.of("send_message")
        assert "DelaySeconds" not in sent  # FIFO queues have no per-message delay
        assert "due" in json.loads(sent["MessageBody"])["meta"]
        await run_until(app, lambda: bool(RUNS.get("sqs_ok")))
        assert RUNS["sqs_ok"][0]["at"] - start >= 3.0
        assert RUNS["sqs_ok"][0]["attempt"] == 1  # the held receive is not an attempt
        holds = spy.of("change_message_visibility")
        assert holds
        assert 1 <= holds[0]["VisibilityTimeout"] <= 6  # until due (+1 s)


# --------------------------------------------------------------------------- retries and release


async def test_retry_sets_the_visibility_to_the_backoff(app: App) -> None:
    spy = SpyCalls(app.driver("sqs"))
    await sqs_flaky.dispatch({"n": 1})
    await run_until(app, lambda: len(RUNS.get("sqs_flaky", [])) >= 2)
    first, second = RUNS["sqs_flaky"][:2]
    assert (first["attempt"], second["attempt"]) == (1, 2)
    assert second["at"] - first["at"] >= 2.0  # backoff 3 s (moto's clock is coarse)
    [retry] = [p for p in spy.of("change_message_visibility") if p["VisibilityTimeout"] > 0]
    assert retry["VisibilityTimeout"] == 3
    assert not spy.of("send_message")[1:]  # a retry keeps the same message


async def test_release_sends_a_new_message_and_uses_no_try(app: App) -> None:
    spy = SpyCalls(app.driver("sqs"))
    await sqs_release_once.dispatch({"n": 1})
    await run_until(app, lambda: len(RUNS.get("sqs_release_once", [])) >= 2)
    # tries=1: a release that used a try would fail the second run instead
    assert [r["attempt"] for r in RUNS["sqs_release_once"][:2]] == [1, 1]
    assert await Queue.failed() == []
    resent = json.loads(spy.of("send_message")[1]["MessageBody"])
    assert "attempts" not in resent  # attempt - 1 = 0 tries used so far


async def test_release_after_a_retry_keeps_the_used_try(app: App) -> None:
    spy = SpyCalls(app.driver("sqs"))
    await sqs_fail_then_release.dispatch({"n": 1})
    await run_until(app, lambda: len(RUNS.get("sqs_fail_then_release", [])) >= 3)
    assert [r["attempt"] for r in RUNS["sqs_fail_then_release"][:3]] == [1, 2, 2]
    resent = json.loads(spy.of("send_message")[1]["MessageBody"])
    assert resent["attempts"] == 1  # the envelope offset: one try used before it existed


async def test_a_crashed_worker_s_message_comes_back_as_the_next_attempt(
    make_app: Callable[..., App],
) -> None:
    app = make_app(retry_after="1s")
    async with app:
        driver: Any = app.driver("sqs")
        await sqs_ok.dispatch({"n": "crash"})
        lost = await driver.reserve(["default"], 0)
        assert lost is not None
        assert lost.attempt == 1  # never settled: the "worker" died
        again = None
        deadline = time.monotonic() + 10
        while again is None and time.monotonic() < deadline:
            again = await driver.reserve(["default"], 1)
        assert again is not None
        assert again.attempt == 2
        await driver.ack(again)


async def test_heartbeats_extend_the_visibility_of_running_jobs(
    make_app: Callable[..., App],
) -> None:
    app = make_app(retry_after="2s")  # heartbeat every max(1 s, retry_after / 3)
    async with app:
        driver: Any = app.driver("sqs")
        spy = SpyCalls(driver)
        assert driver.heartbeat_interval == 1.0
        await sqs_slow.dispatch({"seconds": 5})
        seen_by_other: list[int] = []

        async def peek() -> None:
            while not RUNS.get("sqs_slow_started"):
                await asyncio.sleep(0.05)
            await asyncio.sleep(3)  # past retry_after: only the heartbeat keeps it hidden
            other = _SPEC["client"]()
            url = driver.queue_url_for("default")
            r = other.receive_message(QueueUrl=url, WaitTimeSeconds=0, VisibilityTimeout=0)
            seen_by_other.append(len(r.get("Messages") or []))

        peeker = asyncio.ensure_future(peek())
        await run_until(app, lambda: bool(RUNS.get("sqs_slow")))
        await peeker
        assert seen_by_other == [0]
        beats = spy.of("change_message_visibility_batch")
        assert len(beats) >= 2
        assert beats[0]["Entries"][0]["VisibilityTimeout"] == 2


async def test_one_heartbeat_round_renews_every_running_job_in_calls_of_ten(
    app: App,
) -> None:
    """95 running jobs: ten calls of at most ten entries (several in flight at once), each
    receipt renewed once, none refused."""
    driver: Any = app.driver("sqs")
    await Queue.bulk([sqs_ok.with_({"i": i}) for i in range(95)])
    running: list[Any] = []
    while len(running) < 95:
        got = await driver.reserve(["default"], 1)
        assert got is not None, f"only {len(running)} of 95 received"
        running.append(got)
    spy = SpyCalls(driver)
    await driver.heartbeat(running)
    beats = spy.of("change_message_visibility_batch")
    assert sorted(len(b["Entries"]) for b in beats) == [5] + [10] * 9
    handles = [e["ReceiptHandle"] for b in beats for e in b["Entries"]]
    assert sorted(handles) == sorted(j.token.handle for j in running)
    for job in running:
        await driver.ack(job)


async def test_stop_interrupts_a_long_poll(make_app: Callable[..., App]) -> None:
    app = make_app(wait_time="10s")
    async with app:
        worker = Worker(app, "sqs", None, 1, sleep=10, max_sleep=10)
        worker.start()
        await asyncio.sleep(1.5)  # the slot is in a 10 s long poll now
        started = time.monotonic()
        await worker.stop()
        assert time.monotonic() - started < 3


# --------------------------------------------------------------------------- FIFO


async def test_fifo_groups_order_and_deduplication(make_app: Callable[..., App]) -> None:
    app = make_app(fifo=True)
    async with app:
        driver: Any = app.driver("sqs")
        spy = SpyCalls(driver)
        for i in range(3):
            await sqs_ok.with_({"g": "a", "i": i}).on_group("customer-a").dispatch()
        await sqs_ok.dispatch({"g": "default", "i": 0})
        sends = spy.of("send_message")
        assert [s["MessageGroupId"] for s in sends] == ["customer-a"] * 3 + ["default"]
        ids = [json.loads(s["MessageBody"])["id"] for s in sends]
        stamps = [json.loads(s["MessageBody"])["ts"] for s in sends]
        assert [s["MessageDeduplicationId"] for s in sends] == [
            f"{i}-{int(t * 1000)}" for i, t in zip(ids, stamps, strict=True)
        ]
        # the same message sent twice (an SDK-level resend) is dropped by SQS
        message = Message(
            id=new_id(), job="sqs_ok", payload={"dup": 1}, queue="default", ts=time.time()
        )
        await driver.enqueue(encode(message), message, 0)
        await driver.enqueue(encode(message), message, 0)
        assert await driver.size("default") == 5
        await run_until(app, lambda: len(RUNS.get("sqs_ok", [])) >= 5)
        group_a = [r["payload"]["i"] for r in RUNS["sqs_ok"] if r["payload"].get("g") == "a"]
        assert group_a == [0, 1, 2]  # one consumer: the group's order holds


async def test_fifo_a_group_sqs_would_refuse_is_a_value_error_at_dispatch(
    make_app: Callable[..., App],
) -> None:
    """SQS takes a MessageGroupId of 1 to 128 printable ASCII characters without spaces
    (moto does not check it): haze refuses any other group itself, on one line, before
    anything is sent, instead of SQS's raw InvalidParameterValue error."""
    app = make_app(fifo=True)
    async with app:
        for group in ("customer 42", "x" * 129, "café", "a\tb"):
            with pytest.raises(ValueError, match="MessageGroupId") as e:
                await sqs_ok.with_({"g": group}).on_group(group).dispatch()
            assert "\n" not in str(e.value)
        with pytest.raises(ValueError, match="MessageGroupId"):
            await Queue.bulk([sqs_ok.with_({"g": 1}).on_group("customer 42")])
        assert await app.driver("sqs").size("default") == 0
        await sqs_ok.with_({"g": "ok"}).on_group("customer-42:eu/" + "x" * 113).dispatch()
        assert await app.driver("sqs").size("default") == 1


async def test_fifo_retry_and_release(make_app: Callable[..., App]) -> None:
    app = make_app(fifo=True)
    async with app:
        spy = SpyCalls(app.driver("sqs"))
        await sqs_fail_then_release.dispatch({"n": "fifo"})
        await run_until(app, lambda: len(RUNS.get("sqs_fail_then_release", [])) >= 3)
        assert [r["attempt"] for r in RUNS["sqs_fail_then_release"][:3]] == [1, 2, 2]
        first, resent = spy.of("send_message")[:2]
        assert resent["MessageGroupId"] == first["MessageGroupId"]
        assert resent["MessageDeduplicationId"] != first["MessageDeduplicationId"]


async def test_fifo_a_job_released_twice_by_one_process_is_not_deduplicated(
    make_app: Callable[..., App],
) -> None:
    """Each re-send is a new message to SQS: a deduplication id repeated within SQS's
    5-minute window would make SQS accept the send and drop the message (the job lost)."""
    app = make_app(fifo=True)
    async with app:
        spy = SpyCalls(app.driver("sqs"))
        await sqs_release_twice.dispatch({"n": "fifo"})
        await run_until(app, lambda: len(RUNS.get("sqs_release_twice", [])) >= 3, limit=15)
        assert [r["attempt"] for r in RUNS["sqs_release_twice"]] == [1, 1, 1]
        dedup = [s["MessageDeduplicationId"] for s in spy.of("send_message")]
        assert len(dedup) == 3 and len(set(dedup)) == 3


# --------------------------------------------------------------------------- failed jobs


async def test_failed_jobs_in_a_database_connection(app: App) -> None:
    job_id = await sqs_always_fails.dispatch({"n": 1})
    await run_until(app, lambda: bool(RUNS.get("sqs_always_fails")))
    for _ in range(50):
        if await Queue.failed():
            break
        await asyncio.sleep(0.05)
    [failed] = await Queue.failed()
    assert (failed.id, failed.name, failed.connection, failed.queue) == (
        job_id,
        "sqs_always_fails",
        "sqs",
        "default",
    )
    assert "sqs_always_fails: nope" in failed.exception
    assert failed.payload == {"n": 1}
    assert await app.driver("sqs").size("default") == 0  # deleted from SQS
    assert await Queue.retry(job_id) == [job_id]
    assert await Queue.failed() == []
    await run_until(app, lambda: len(RUNS["sqs_always_fails"]) >= 2)
    for _ in range(50):
        if await Queue.failed():
            break
        await asyncio.sleep(0.05)
    assert [f.id for f in await Queue.failed()] == [job_id]
    assert await Queue.forget(job_id)
    assert await Queue.failed() == []


async def test_failed_jobs_in_a_cache_store(make_app: Callable[..., App], tmp_path: Path) -> None:
    cache = define_cache_config(
        default="db", stores={"db": {"driver": "database", "connection": "main"}}
    )
    app = make_app(failed_store="db", cache=cache)
    async with app:
        from haze._failed import StoreFailedJobs
        from haze.contracts.driver import FailedJob

        store = app.driver("sqs").failed
        assert isinstance(store, StoreFailedJobs)
        for i, queue in enumerate(["default", "high", "default"]):
            await store.record(
                FailedJob(
                    id=f"f{i}",
                    name="sqs_ok",
                    connection="sqs",
                    queue=queue,
                    payload={"i": i},
                    exception="boom",
                    failed_at=time.time() + i,
                    body="{}",
                )
            )
        await store.record(
            FailedJob(
                id="f0",
                name="sqs_ok",
                connection="sqs",
                queue="default",
                payload={"i": 0},
                exception="again",
                failed_at=time.time() + 5,
                body="{}",
            )
        )
        assert [j.id for j in await store.list()] == ["f1", "f2", "f0"]
        assert [j.id for j in await store.list("high")] == ["f1"]
        found = await store.find("f0")
        assert found is not None
        assert found.exception == "again"
        assert await store.forget("f1")
        assert not await store.forget("f1")
        assert await store.flush(older_than=3600) == 0
        assert await store.flush() == 2
        assert await store.list() == []
        await store.record(
            FailedJob(
                id="f9",
                name="sqs_ok",
                connection="sqs",
                queue="default",
                payload=None,
                exception="x",
                failed_at=time.time(),
                body="{}",
            )
        )
        assert [j.id for j in await store.list()] == ["f9"]


async def test_no_failed_store_keeps_failures_in_memory_with_a_warning(
    make_app: Callable[..., App], caplog: pytest.LogCaptureFixture
) -> None:
    # Without a failed_store an sqs connection names its lock store itself (else start-up
    # refuses): memory here, as the failed jobs are.
    app = make_app(failed_store=None, store="memory")
    async with app:
        await sqs_always_fails.dispatch({"n": 1})
        with caplog.at_level(logging.WARNING, logger="haze.sqs"):
            await run_until(app, lambda: bool(RUNS.get("sqs_always_fails")))
            for _ in range(50):
                if await Queue.failed():
                    break
                await asyncio.sleep(0.05)
        assert len(await Queue.failed()) == 1
        assert "keeps failed jobs in the memory of this process" in caplog.text


def test_an_unknown_failed_store_is_a_config_error(make_app: Callable[..., App]) -> None:
    app = make_app(failed_store="nowhere")
    with pytest.raises(ConfigError, match="neither a cache store"):
        app.driver("sqs")


# --------------------------------------------------------------------------- bulk, sizes


async def test_bulk_uses_send_message_batch_in_chunks_of_10(app: App) -> None:
    spy = SpyCalls(app.driver("sqs"))
    ids = await Queue.bulk([sqs_ok.with_({"i": i}) for i in range(25)])
    assert len(set(ids)) == 25
    assert [len(p["Entries"]) for p in spy.of("send_message_batch")] == [10, 10, 5]
    assert not spy.of("send_message")
    assert await app.driver("sqs").size("default") == 25
    await run_until(
        app, lambda: len({r["id"] for r in RUNS.get("sqs_ok", [])}) >= 25, concurrency=4
    )
    assert {r["id"] for r in RUNS["sqs_ok"]} == set(ids)  # every job ran (at least once)


async def test_bulk_reports_every_entry_sqs_refused(app: App) -> None:
    driver: Any = app.driver("sqs")
    RejectEntries(driver, {2, 14, 23})  # one in each SendMessageBatch of 10
    spy = SpyCalls(driver)  # sees every entry sent, the refused ones too
    with pytest.raises(DispatchIncompleteError) as e:
        await Queue.bulk([sqs_ok.with_({"i": i}) for i in range(25)])
    sent = [m for p in spy.of("send_message_batch") for m in p["Entries"]]
    refused = {json.loads(m["MessageBody"])["id"] for m in sent if _payload_i(m) in {2, 14, 23}}
    assert set(e.value.failed) == refused and len(refused) == 3
    assert "3 of 25" in str(e.value)
    assert all(job_id in str(e.value) for job_id in refused)
    assert "InvalidMessageContents" in str(e.value)
    assert await driver.size("default") == 22  # the others were sent


class UnreachableOnce:
    """SQS unreachable for the ``n``-th ``SendMessageBatch`` call only (the connection
    dropped for that one request); the other calls go to moto."""

    def __init__(self, driver: Any, n: int) -> None:
        original = driver._submit
        calls = [0]

        def submit(op: str, **params: Any) -> Any:
            if op == "send_message_batch":
                calls[0] += 1
                if calls[0] == n:
                    from botocore.exceptions import EndpointConnectionError

                    async def down() -> Any:
                        raise EndpointConnectionError(endpoint_url="http://sqs.test")

                    return asyncio.ensure_future(down())
            return original(op, **params)

        driver._submit = submit


async def test_a_call_that_cannot_reach_sqs_names_its_messages_when_others_were_queued(
    app: App,
) -> None:
    driver: Any = app.driver("sqs")
    UnreachableOnce(driver, 2)
    with pytest.raises(DispatchIncompleteError) as e:
        await Queue.bulk([sqs_ok.with_({"i": i}) for i in range(25)])
    assert len(e.value.failed) == 10, e.value  # the second call's ten
    assert "15 of 25" in str(e.value), e.value
    assert await driver.size("default") == 15


async def test_a_batch_whose_members_partly_failed_to_send_still_finishes(app: App) -> None:
    RejectEntries(app.driver("sqs"), {1})
    pending = (
        Queue.batch([sqs_ok.with_({"i": i}) for i in range(3)])
        .allow_failures()
        .finally_(sqs_ok.with_({"finally": True}))
    )
    with pytest.raises(DispatchIncompleteError):
        await pending.dispatch()
    # the two members sent run; the one SQS refused counts as failed, so the batch ends
    await run_until(app, lambda: any(r["payload"].get("finally") for r in RUNS.get("sqs_ok", [])))
    assert sorted(r["payload"].get("i", -1) for r in RUNS["sqs_ok"]) == [-1, 0, 2]


async def test_messages_over_the_limit_are_rejected_at_dispatch(
    app: App, make_app: Callable[..., App]
) -> None:
    driver: Any = app.driver("sqs")
    # SQS's 1 MiB less the 48 bytes a release or a long delay may add to the body
    assert driver.max_message_size == 1024 * 1024 - 48
    with pytest.raises(PayloadTooLargeError, match="1048528-byte limit"):
        await sqs_ok.dispatch({"blob": "x" * (1024 * 1024)})
    with pytest.raises(PayloadTooLargeError):
        await Queue.bulk([sqs_ok.with_({"blob": "y" * (1024 * 1024)})])
    assert await driver.size("default") == 0  # nothing was enqueued
    await sqs_ok.dispatch({"blob": "z" * (1024 * 1024 - 200)})  # just under: SQS takes it
    assert await driver.size("default") == 1
    small = make_app(max_message_size=1000)
    async with small:
        with pytest.raises(PayloadTooLargeError, match="1000-byte limit"):
            await sqs_ok.dispatch({"blob": "x" * 1000})


async def test_every_message_dispatch_accepts_can_be_released_or_delayed(app: App) -> None:
    """A release or a delay over 15 minutes adds "attempts" and "meta.due" to the body:
    dispatch keeps room for them, so neither pushes an accepted message past SQS's
    limit, and a message too big for them is a PayloadTooLargeError, never SQS's error."""
    driver: Any = app.driver("sqs")
    spy = SpyCalls(driver)
    await sqs_ok.dispatch({"blob": ""})
    overhead = len(spy.of("send_message")[0]["MessageBody"])
    first = await driver.reserve(["default"], 0)
    await driver.ack(first)
    accepted = []
    for room in (300, 40, 12, 1):
        payload = {"blob": "x" * (1024 * 1024 - overhead - room)}
        # with meta.due added: accepted, or refused by haze (not SQS's ClientError)
        with contextlib.suppress(PayloadTooLargeError):
            await sqs_ok.dispatch(payload, delay="20m")
        try:
            await sqs_ok.dispatch(payload)
        except PayloadTooLargeError:
            continue
        accepted.append(room)
        job = await driver.reserve(["default"], 0)
        assert job is not None and len(job.body) > 1024 * 1024 - 400
        # past the 12 h visibility limit: re-sent with "attempts" and "meta.due"
        await driver.release(job, 13 * 3600, consume_attempt=True)
        resent = json.loads(spy.of("send_message")[-1]["MessageBody"])
        assert (resent["attempts"], "due" in resent["meta"]) == (1, True)
    assert 300 in accepted


async def test_size_counts_waiting_delayed_and_in_flight_and_purge(app: App) -> None:
    driver: Any = app.driver("sqs")
    await sqs_ok.dispatch({"n": 1})
    await sqs_ok.dispatch({"n": 2})
    await sqs_ok.dispatch({"n": 3}, delay=60)
    in_flight = await driver.reserve(["default"], 0)
    assert in_flight is not None
    assert await driver.size("default") == 3  # 1 waiting + 1 delayed + 1 in flight
    assert await driver.purge("default") == 3
    assert await driver.size("default") == 0
