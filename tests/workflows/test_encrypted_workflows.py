"""An ``encrypted`` workflow's run keeps its input, step results, kept events, result
and error text encrypted at rest, and ``Workflow.status`` opens them with the app key
(``APP_PREVIOUS_KEYS`` after a rotation) or says they are encrypted without it.

As for encrypted jobs, the tests read what haze wrote as raw bytes: the SQLite file
(and its WAL) and every Redis key of the test, value by value on a real Redis. The
marker must appear nowhere; a plain workflow's run shows it (the reader can see it).
"""

from __future__ import annotations

import logging
import runpy
from pathlib import Path
from typing import Any

import pytest
from haze import (
    App,
    Workflow,
    define_cache_config,
    define_database_config,
    define_queue_config,
    define_redis_config,
    workflow,
)
from haze._base.crypto import generate_key
from haze._workers.worker import Worker
from haze.connectors.migrations import ensure_queue_tables

_spec = runpy.run_path(str(Path(__file__).parents[1] / "drivers" / "redis_spec.py"))
REDIS_URL: str = _spec["REDIS_URL"]
delete_prefix, needs_redis, unique_prefix = (
    _spec["delete_prefix"],
    _spec["needs_redis"],
    _spec["unique_prefix"],
)

MARKER = "WORKFLOW-SECRET-7731"


def _boom(card: str) -> None:
    raise RuntimeError(f"card {card}:error declined")


async def _flow(run: Any, card: str, fail: bool = False) -> Any:
    got = await run.step("charge", lambda: {"receipt": f"{card}:step"})
    confirmed = await run.wait_for_event("confirm", timeout="1h")
    if fail:
        await run.step("refund", _boom, card, tries=2)
    return {"card": card, "got": got, "confirmed": confirmed}


wfe_secret = workflow(name="wfenc_secret", encrypted=True)(_flow)
wfe_plain = workflow(name="wfenc_plain")(_flow)


async def _finish(app: App, connection: str, rid: str) -> Any:
    for _ in range(40):
        await Worker(app, connection, ["default"], 2, sleep=0.02, stop_when_empty=True).run()
        st = await Workflow.status(rid)
        if st is not None and st.finished:
            return st
    raise AssertionError(f"run {rid} did not finish")


async def _runs(app: App, connection: str) -> tuple[str, str]:
    """A run that finishes and one that fails, each with the marker in its input, a step
    result, an event payload and (the second) an error text."""
    done = await Workflow.start(wfe_secret, card=f"{MARKER}:input-done")
    failed = await Workflow.start(wfe_secret, card=f"{MARKER}:input-failed", fail=True)
    for rid in (done, failed):
        await Workflow.send_event(rid, "confirm", {"by": f"{MARKER}:event"})
    st = await _finish(app, connection, done)
    assert st.state == "done", st.error
    assert st.encrypted
    assert st.input == {"card": f"{MARKER}:input-done"}
    assert st.result == {
        "card": f"{MARKER}:input-done",
        "got": {"receipt": f"{MARKER}:input-done:step"},
        "confirmed": {"by": f"{MARKER}:event"},
    }
    st = await _finish(app, connection, failed)
    assert st.state == "failed"
    assert st.error is not None and f"{MARKER}:input-failed:error" in st.error
    refund = [s for s in st.steps if s.name == "refund"]
    assert refund and refund[0].error is not None and MARKER in refund[0].error
    return done, failed


def _assert_no_marker(blobs: dict[str, bytes]) -> None:
    leaks = [where for where, data in blobs.items() if MARKER.encode() in data]
    assert not leaks, f"the plaintext marker is stored in: {leaks[:10]}"


async def _assert_keys(app_of: Any, key: str, runs: tuple[str, str]) -> None:
    """Without a key a run says it is encrypted; a rotated key still opens it."""
    done, failed = runs
    async with app_of(None):
        st = await Workflow.status(done)
        assert st is not None and st.encrypted and st.state == "done"
        assert st.input is None and st.result is None and st.error is None
        st = await Workflow.status(failed)
        assert st is not None and st.encrypted and st.state == "failed"
        assert st.error is not None and "APP_KEY" in st.error and MARKER not in st.error
        assert all(s.error in (None, "encrypted") for s in st.steps)
        assert [r.encrypted for r in await Workflow.list(name="wfenc_secret")] == [True, True]
    async with app_of(generate_key(), key):
        st = await Workflow.status(done)
        assert st is not None and st.input == {"card": f"{MARKER}:input-done"}
        assert st.error is None
        st = await Workflow.status(failed)
        assert st is not None and st.error is not None and MARKER in st.error


def sqlite_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in path.parent.glob(path.name + "*")}


async def test_sqlite_file_holds_no_plaintext_of_an_encrypted_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "queue.db"
    key = generate_key()

    def app_of(k: str | None, previous: str | None = None) -> App:
        if previous is None:
            monkeypatch.delenv("APP_PREVIOUS_KEYS", raising=False)
        else:
            monkeypatch.setenv("APP_PREVIOUS_KEYS", previous)
        monkeypatch.delenv("APP_KEY", raising=False)
        return App(
            queue=define_queue_config(
                default="db",
                connections={"db": {"driver": "database", "connection": "main"}},
                store="database",
            ),
            cache=define_cache_config(
                stores={"database": {"driver": "database", "connection": "main"}}
            ),
            database=define_database_config(
                default="main", connections={"main": {"url": f"sqlite:///{db}"}}
            ),
            key=k,
        )

    app = app_of(key)
    async with app:
        await ensure_queue_tables(app)
        runs = await _runs(app, "db")
        _assert_no_marker(sqlite_bytes(db))
    _assert_no_marker(sqlite_bytes(db))
    await _assert_keys(app_of, key, runs)
    async with app_of(key):  # the reader sees a marker a plain workflow keeps
        await Workflow.start(wfe_plain, card=MARKER)
    assert any(MARKER.encode() in data for data in sqlite_bytes(db).values())


def redis_values(token: str) -> dict[str, bytes]:
    """Every key containing ``token`` and every byte of its value, read by type."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    out: dict[str, bytes] = {}
    try:
        for k in client.scan_iter(match=f"*{token}*", count=1000):
            kind = client.type(k).decode()
            parts: list[bytes] = [k]
            if kind == "string":
                parts.append(client.get(k) or b"")
            elif kind == "hash":
                for f, v in client.hgetall(k).items():
                    parts += [f, v]
            elif kind in ("list",):
                parts += client.lrange(k, 0, -1)
            elif kind == "set":
                parts += list(client.smembers(k))
            elif kind == "zset":
                parts += [m for m, _ in client.zrange(k, 0, -1, withscores=True)]
            elif kind == "stream":
                for _id, fields in client.xrange(k):
                    for f, v in fields.items():
                        parts += [f, v]
            else:
                raise AssertionError(f"unexpected Redis type {kind} for {k!r}")
            out[k.decode()] = b"\x00".join(parts)
    finally:
        client.close()
    return out


@needs_redis
async def test_redis_keys_hold_no_plaintext_of_an_encrypted_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    token = unique_prefix("wfenc")
    key = generate_key()

    def app_of(k: str | None, previous: str | None = None) -> App:
        if previous is None:
            monkeypatch.delenv("APP_PREVIOUS_KEYS", raising=False)
        else:
            monkeypatch.setenv("APP_PREVIOUS_KEYS", previous)
        monkeypatch.delenv("APP_KEY", raising=False)
        return App(
            queue=define_queue_config(
                default="r",
                connections={"r": {"driver": "redis", "url": REDIS_URL, "prefix": f"{token}q"}},
                store="redis",
            ),
            redis=define_redis_config(
                default="default",
                connections={"default": {"url": REDIS_URL, "key_prefix": f"{token}s:"}},
            ),
            cache=define_cache_config(
                stores={"redis": {"driver": "redis", "connection": "default"}}
            ),
            key=k,
        )

    try:
        async with app_of(key) as app:
            runs = await _runs(app, "r")
            values = redis_values(token)
            assert any(":wf:" in k for k in values), sorted(values)
            _assert_no_marker(values)
        await _assert_keys(app_of, key, runs)
        async with app_of(key):
            await Workflow.start(wfe_plain, card=MARKER)
        assert any(MARKER.encode() in v for v in redis_values(token).values())
    finally:
        delete_prefix(token)


def _span_text(spans: Any) -> str:
    """Every name, attribute, event and status text of the recorded spans."""
    parts: list[str] = []
    for s in spans:
        parts += [s.name, repr(dict(s.attributes or {})), str(s.status.description)]
        parts += [f"{e.name}{dict(e.attributes or {})!r}" for e in s.events]
    return "\n".join(parts)


async def test_spans_and_logs_of_an_encrypted_run_carry_none_of_its_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from haze import Queue
    from haze._engine.otel import Telemetry
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    app = App(
        queue=define_queue_config(connections={"memory": {"driver": "memory"}}),
        key=generate_key(),
    )
    caplog.set_level(logging.INFO, logger="haze")
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    async with app:
        # the recorder the app would build from global providers (those cannot be unset)
        app.manager._otel = Telemetry(tracer_provider=provider)
        for wf in (wfe_secret, wfe_plain):
            rid = await Workflow.start(wf, card=f"{MARKER}:{wf.name}", fail=True)
            await Workflow.send_event(rid, "confirm", {"by": f"{MARKER}:event"})
            await Queue.idle()
            st = await Workflow.wait(rid, timeout=20)
            assert st.state == "failed" and st.error is not None and MARKER in st.error
            text = _span_text(spans.get_finished_spans()) + caplog.text
            spans.clear()
            caplog.clear()
            if wf is wfe_secret:
                assert "wfenc_secret" in text and MARKER not in text, text
            else:  # a plain run's error text is in its span: the check can see it
                assert f"{MARKER}:wfenc_plain:error" in text
                assert f'"refund" failed (card {MARKER}' in text  # its retry's log line
