"""Laravel extras (SPEC §12): max_exceptions, retry_until, fail_on_timeout, debounce,
encrypted, job.fail(), dont_retry, and queue events."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import haze
import pytest
from haze import (
    JobContext,
    JobFailedError,
    JobTimeoutError,
    MaxExceptionsError,
    MessageDecodeError,
    Queue,
    RetryUntilExpiredError,
    define_job,
)
from haze._base.crypto import generate_key
from haze._base.errors import ConfigError
from haze._engine.locks import Locks

RUNS: list[dict[str, Any]] = []
FAILED: list[dict[str, Any]] = []
SECRET = "card-4242-4242-4242-4242"


async def quietly(aw: Any) -> Any:
    """Await; return the raised exception instead of propagating it (sync raises)."""
    try:
        return await aw
    except Exception as e:
        return e


@pytest.fixture(autouse=True)
def _reset() -> Any:
    RUNS.clear()
    FAILED.clear()


def _record(name: str, payload: Any, job: JobContext) -> None:
    RUNS.append({"job": name, "payload": payload, "id": job.id, "attempt": job.attempt})


def _on_failed(payload: Any, error: BaseException, job: JobContext) -> None:
    FAILED.append({"payload": payload, "error": error, "attempt": job.attempt})


# ============================================================================ max_exceptions


@define_job(name="ex_max_exc", tries=10, max_exceptions=2, failed=_on_failed)
async def ex_max_exc(payload: dict, job: JobContext) -> None:
    _record("max_exc", payload, job)
    if payload.get("release_first") and len(RUNS) == 1:
        job.release(0)  # a release is not an exception
        return
    raise RuntimeError(f"exception {len(RUNS)}")


@pytest.mark.requires("retries")
async def test_max_exceptions_fails_before_tries_run_out(app, done):
    await ex_max_exc.dispatch({})
    await done()
    assert len(RUNS) == 2
    assert len(FAILED) == 1
    assert isinstance(FAILED[0]["error"], MaxExceptionsError)
    assert "exception 2" in str(FAILED[0]["error"])
    failed = await Queue.failed()
    assert len(failed) == 1
    assert "MaxExceptionsError" in failed[0].exception


@pytest.mark.requires("retries", "release")
async def test_max_exceptions_does_not_count_releases(app, done):
    await ex_max_exc.dispatch({"release_first": True})
    await done()
    assert len(RUNS) == 3  # release, exception, exception
    assert isinstance(FAILED[0]["error"], MaxExceptionsError)
    # the per-message counter is cleaned up
    assert [k for k in app.queue_store._data if k.startswith("haze:exceptions:")] == []


def test_max_exceptions_must_be_a_positive_int():
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="max_exceptions"):

            @define_job(name="ex_bad_max_exc", max_exceptions=bad)
            async def bad_job(payload: dict) -> None: ...


# ============================================================================ retry_until


#: The manager's clock, frozen by the test and moved forward 0.1 s by every attempt.
CLOCK: list[float] = [0.0]


@define_job(name="ex_retry_until", tries=1, backoff=0.01, retry_until=0.25, failed=_on_failed)
async def ex_retry_until(payload: dict, job: JobContext) -> None:
    _record("retry_until", payload, job)
    CLOCK[0] += 0.1
    raise RuntimeError("still failing")


@pytest.mark.requires("retries")
async def test_retry_until_retries_past_tries_until_the_deadline(app, done, monkeypatch):
    import haze._engine.failures

    CLOCK[0] = time.time()
    monkeypatch.setattr(haze._engine.failures, "_time", lambda: CLOCK[0])
    await ex_retry_until.dispatch({})
    await done()
    # failures at +0.1 and +0.2 are retried although tries=1; the one at +0.3 is final
    assert [r["attempt"] for r in RUNS] == [1, 2, 3]
    assert len(FAILED) == 1
    assert isinstance(FAILED[0]["error"], RetryUntilExpiredError)
    assert "still failing" in str(FAILED[0]["error"])


def test_retry_until_is_a_duration():
    with pytest.raises(ValueError, match="retry_until"):

        @define_job(name="ex_bad_retry_until", retry_until="tomorrow")
        async def bad_job(payload: dict) -> None: ...


# ============================================================================ fail_on_timeout


@define_job(name="ex_timeout_fail", tries=3, timeout=0.05, fail_on_timeout=True, failed=_on_failed)
async def ex_timeout_fail(payload: dict, job: JobContext) -> None:
    _record("timeout_fail", payload, job)
    await asyncio.sleep(2)


@define_job(name="ex_timeout_retry", tries=3, timeout=0.05, failed=_on_failed)
async def ex_timeout_retry(payload: dict, job: JobContext) -> None:
    _record("timeout_retry", payload, job)
    await asyncio.sleep(2)


@pytest.mark.requires("retries")
async def test_fail_on_timeout_fails_at_the_first_timeout(app, done):
    await ex_timeout_fail.dispatch({})
    await ex_timeout_retry.dispatch({})
    await done()
    assert [r["job"] for r in RUNS].count("timeout_fail") == 1
    assert [r["job"] for r in RUNS].count("timeout_retry") == 3
    assert all(isinstance(f["error"], JobTimeoutError) for f in FAILED)
    assert len(FAILED) == 2


async def test_timeout_on_sync_raises_to_the_caller(app, driver):
    if not driver.inline:
        pytest.skip("sync-only rule")
    with pytest.raises(JobTimeoutError):
        await ex_timeout_fail.dispatch({})
    assert len(FAILED) == 1


# ============================================================================ debounce


@define_job(name="ex_debounce", debounce=0.3)
async def ex_debounce(payload: dict, job: JobContext) -> None:
    _record("debounce", payload, job)


@define_job(name="ex_debounce_keyed", debounce={"for": 0.3, "key": lambda p: p["doc"]})
async def ex_debounce_keyed(payload: dict, job: JobContext) -> None:
    _record("keyed", payload, job)


@define_job(name="ex_debounce_max", debounce=0.12, max_wait=0.2)
async def ex_debounce_max(payload: dict, job: JobContext) -> None:
    _record("max", payload, job)


@define_job(name="ex_debounce_max2", debounce=0.3, max_wait=0.4)
async def ex_debounce_max2(payload: dict, job: JobContext) -> None:
    _record("max2", payload, job)


@contextlib.asynccontextmanager
async def _burst(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    """Dispatches inside the block form one burst however slow the machine: a debounced
    run decides whether it was superseded only once the block is over. (Without the gate
    a dispatch slower than the 0.3 s window lets an earlier one run first, rightly.)"""
    real = Locks.superseded
    gate = asyncio.Event()

    async def after_the_burst(self: Locks, job: Any, message: Any) -> bool:
        await gate.wait()
        return await real(self, job, message)

    monkeypatch.setattr(Locks, "superseded", after_the_burst)
    try:
        yield
    finally:
        gate.set()


@pytest.mark.requires("delay")
async def test_debounce_runs_only_the_latest_dispatch(app, done, monkeypatch):
    async with _burst(monkeypatch):
        ids = [await ex_debounce.dispatch({"n": n}) for n in range(4)]
    assert len(set(ids)) == 4
    await done()
    assert [r["payload"]["n"] for r in RUNS] == [3]
    assert RUNS[0]["id"] == ids[-1]
    assert await Queue.failed() == []


@pytest.mark.requires("delay")
async def test_debounce_key_separates_streams(app, done, monkeypatch):
    async with _burst(monkeypatch):
        for n in range(3):
            await ex_debounce_keyed.dispatch({"doc": "a", "n": n})
            await ex_debounce_keyed.dispatch({"doc": "b", "n": n})
    await done()
    assert sorted((r["payload"]["doc"], r["payload"]["n"]) for r in RUNS) == [("a", 2), ("b", 2)]


@pytest.mark.requires("delay")
async def test_debounce_max_wait_caps_the_wait(app, done):
    """Dispatches every 30 ms would postpone a 120 ms debounce forever; max_wait=200 ms
    makes one run while they keep coming."""
    n = 0
    deadline = time.monotonic() + 3.0
    while not RUNS and time.monotonic() < deadline:
        await ex_debounce_max.dispatch({"n": n})
        n += 1
        await asyncio.sleep(0.03)
    assert RUNS, "a job ran within max_wait although dispatches kept coming"
    await done()
    assert RUNS[-1]["payload"]["n"] == n - 1, "the latest dispatch still runs in the end"


@pytest.mark.requires("delay")
async def test_debounce_max_wait_starts_over_after_a_run(app, done, monkeypatch):
    drv = app.driver("main")
    delays: list[float] = []
    real = drv.enqueue

    async def spy(body: str, message: Any, delay: float) -> None:
        delays.append(delay)
        await real(body, message, delay)

    monkeypatch.setattr(drv, "enqueue", spy)
    await ex_debounce_max2.dispatch({"burst": 1})
    await done()
    assert len(RUNS) == 1
    await asyncio.sleep(0.15)  # now past the first burst's max_wait
    # a new burst is debounced again: it does not inherit the old burst's start (which
    # would make its max_wait already spent, i.e. no delay at all)
    await ex_debounce_max2.dispatch({"burst": 2})
    assert delays[0] == pytest.approx(0.3)
    assert delays[1] == pytest.approx(0.3, abs=0.05)
    await done()
    assert len(RUNS) == 2


def test_debounce_option_errors():
    with pytest.raises(ValueError, match="max_wait"):

        @define_job(name="ex_bad_debounce", max_wait="1m")
        async def a(payload: dict) -> None: ...

    with pytest.raises(ValueError, match="max_wait"):

        @define_job(name="ex_bad_debounce", debounce="1m", max_wait="30s")
        async def b(payload: dict) -> None: ...

    with pytest.raises(ValueError, match="debounce"):

        @define_job(name="ex_bad_debounce", debounce="soon")
        async def c(payload: dict) -> None: ...

    with pytest.raises(ValueError, match="wait"):

        @define_job(name="ex_bad_debounce", debounce={"for": "1s", "wait": 2})
        async def d(payload: dict) -> None: ...


# ============================================================================ encrypted


@define_job(name="ex_secret", encrypted=True, tries=1)
async def ex_secret(payload: dict, job: JobContext) -> None:
    _record("secret", payload, job)
    if payload.get("fail"):
        raise RuntimeError("declined")


# the lock key is derived from a non-secret field: lock keys are stored in plaintext
@define_job(name="ex_secret_unique", encrypted=True, unique={"key": lambda p: str(p["order"])})
async def ex_secret_unique(payload: dict, job: JobContext) -> None:
    _record("secret_unique", payload, job)


@pytest.mark.requires("queued")
async def test_encrypted_payload_has_no_plaintext_at_rest(make_app, done, monkeypatch):
    """What the driver is handed (and stores) carries only the ciphertext: single
    dispatch, the unique path (re-encoded with its lock) and bulk."""
    async with make_app(key=generate_key()) as app:
        drv = app.driver("main")
        bodies: list[str] = []
        real_one, real_many = drv.enqueue, drv.enqueue_many

        async def one(body: str, message: Any, delay: float) -> None:
            bodies.append(body)
            await real_one(body, message, delay)

        async def many(items: Any) -> None:
            bodies.extend(b for b, _, _ in items)
            await real_many(items)

        monkeypatch.setattr(drv, "enqueue", one)
        monkeypatch.setattr(drv, "enqueue_many", many)
        await ex_secret.dispatch({"card": SECRET})
        await ex_secret_unique.dispatch({"card": SECRET, "order": 1})
        await Queue.bulk([ex_secret.with_({"card": SECRET}), ex_secret.with_({"card": SECRET})])
        await done()
        assert len(bodies) == 4
        for body in bodies:
            assert SECRET not in body
            data = json.loads(body)
            assert "payload" not in data
            assert data["enc"]
        assert json.loads(bodies[1])["unique"]["key"]
        assert [r["payload"]["card"] for r in RUNS] == [SECRET] * 4


@pytest.mark.requires("failed_store")
async def test_encrypted_failed_job_keeps_the_payload_encrypted(make_app, done):
    async with make_app(key="a passphrase is hashed into a key") as app:
        await ex_secret.dispatch({"card": SECRET, "fail": True})
        await done()
        [failed] = await Queue.failed()
        assert failed.payload is None
        assert SECRET not in failed.body
        assert SECRET not in failed.exception
        # a retry decrypts again
        await Queue.retry(failed.id)
        await done()
        assert [r["payload"]["card"] for r in RUNS] == [SECRET, SECRET]
        assert app.key


async def test_encrypted_job_runs_with_app_key_from_env(make_app, done, monkeypatch):
    monkeypatch.setenv("APP_KEY", generate_key())
    async with make_app():
        await ex_secret.dispatch({"card": SECRET})
        await done()
    assert RUNS[0]["payload"] == {"card": SECRET}


async def test_encrypted_job_without_a_key_fails_at_dispatch(app, done, monkeypatch):
    monkeypatch.delenv("APP_KEY", raising=False)
    with pytest.raises(ConfigError, match="APP_KEY"):
        await ex_secret.dispatch({"card": SECRET})
    await done()
    assert RUNS == []


@pytest.mark.requires("delay")
async def test_key_rotation_reads_old_messages_with_previous_keys(make_app, done, monkeypatch):
    old, new = generate_key(), generate_key()
    monkeypatch.setenv("APP_KEY", old)
    monkeypatch.delenv("APP_PREVIOUS_KEYS", raising=False)
    async with make_app():
        await ex_secret.dispatch({"card": SECRET}, delay=0.05)
        monkeypatch.setenv("APP_KEY", new)
        monkeypatch.setenv("APP_PREVIOUS_KEYS", f"{generate_key()}, {old}")
        await done()
    assert RUNS[0]["payload"] == {"card": SECRET}


@pytest.mark.requires("delay")
async def test_key_rotation_reads_previous_keys_from_the_invocations_env(
    make_app, done, monkeypatch
):
    """Inside a Cloudflare Worker the vars and secrets arrive with each invocation
    (``env_source``), not in ``os.environ``: ``APP_PREVIOUS_KEYS`` is read from there as
    ``APP_KEY`` is, or a rotated key fails every old message in a Worker."""
    from haze._app.config import env_source

    old, new = generate_key(), generate_key()
    monkeypatch.delenv("APP_KEY", raising=False)
    monkeypatch.delenv("APP_PREVIOUS_KEYS", raising=False)
    worker_env = {"APP_KEY": old}
    with env_source(worker_env.get):
        async with make_app():
            await ex_secret.dispatch({"card": SECRET}, delay=0.05)
            worker_env.update(APP_KEY=new, APP_PREVIOUS_KEYS=old)
            await done()
    assert [r["payload"] for r in RUNS] == [{"card": SECRET}]


@define_job(name="ex_secret_tracked", encrypted=True, tries=1, track=True)
async def ex_secret_tracked(payload: dict, job: JobContext) -> None:
    _record("secret_tracked", payload, job)


@pytest.mark.requires("delay", "failed_store")
async def test_a_worker_without_the_key_still_ends_the_status_record(make_app, done, monkeypatch):
    """A worker started without APP_KEY cannot read an encrypted message: the job fails
    (kept in failed jobs, to retry once the key is set) and its status record says so,
    rather than staying 'queued' while Queue.wait waits for ever."""
    monkeypatch.setenv("APP_KEY", generate_key())
    monkeypatch.delenv("APP_PREVIOUS_KEYS", raising=False)
    async with make_app():
        job_id = await ex_secret_tracked.dispatch({"card": SECRET}, delay=0.05)
        monkeypatch.delenv("APP_KEY")
        await done()
        final = await Queue.wait(job_id, timeout=10)
        assert final.state == "failed"
        assert final.error is not None and "APP_KEY" in final.error
        assert SECRET not in final.error
        [failed] = await Queue.failed()
        assert failed.id == job_id
    assert RUNS == []


@pytest.mark.requires("delay", "failed_store")
async def test_undecryptable_payload_fails_clearly_and_is_kept(make_app, done, monkeypatch):
    monkeypatch.setenv("APP_KEY", generate_key())
    monkeypatch.delenv("APP_PREVIOUS_KEYS", raising=False)
    async with make_app():
        job_id = await ex_secret.dispatch({"card": SECRET}, delay=0.05)
        monkeypatch.setenv("APP_KEY", generate_key())
        await done()
        assert RUNS == []
        [failed] = await Queue.failed()
        assert failed.id == job_id
        assert failed.name == "ex_secret"
        assert "MessageDecodeError" in failed.exception
        assert "APP_PREVIOUS_KEYS" in failed.exception
        assert SECRET not in failed.body
        assert json.loads(failed.body)["enc"]


def _forged_seal(key: str, plain: bytes, message_id: str) -> str:
    """What a producer holding the app key could write as ``enc``: ``plain`` sealed as
    haze seals a payload (the message id authenticated with it)."""
    import base64
    import os

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from haze._base.crypto import _material

    nonce = os.urandom(12)
    sealed = AESGCM(_material(key)).encrypt(nonce, plain, message_id.encode())
    return base64.b64encode(nonce + sealed).decode()


@pytest.mark.requires("queued", "failed_store")
@pytest.mark.parametrize(
    ("plain", "says"),
    [
        (b'{"card": NaN}', "holds NaN, which is not JSON"),
        (b'{"card": [1, {"x": -Infinity}]}', "holds -Infinity, which is not JSON"),
        (b"card 4242", "decrypts with the app key but is not JSON"),
    ],
)
async def test_an_encrypted_payload_that_is_not_strict_json_is_never_run(
    make_app, done, monkeypatch, plain, says
):
    """The decrypted payload is held to the rules of a plain body: NaN or Infinity inside
    the ciphertext fails the message (never run), as it does in the clear, and a payload
    that decrypts but is not JSON is not reported as a wrong key."""
    key = generate_key()
    async with make_app(key=key) as app:
        drv = app.driver("main")
        real_one = drv.enqueue

        async def forge(body: str, message: Any, delay: float) -> None:
            data = json.loads(body)
            data["enc"] = _forged_seal(key, plain, data["id"])
            await real_one(json.dumps(data), message, delay)

        monkeypatch.setattr(drv, "enqueue", forge)
        job_id = await ex_secret.dispatch({"card": SECRET})
        await done()
        assert RUNS == []
        [failed] = await Queue.failed()
        assert failed.id == job_id
        assert "MessageDecodeError" in failed.exception
        assert says in failed.exception
        assert "card" not in failed.exception.replace('"ex_secret"', "")  # no field named


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"when": __import__("datetime").date(2026, 1, 1)}, "payload['when'] is a datetime.date"),
        ({"amount": float("nan")}, "payload['amount'] is nan, which JSON cannot represent"),
        ({"name": "caf\udce9"}, "payload['name'] holds a lone surrogate"),
    ],
)
@pytest.mark.parametrize("how", ["dispatch", "chain link"])
async def test_an_encrypted_jobs_payload_is_checked_like_a_plain_one(
    make_app, done, bad, says, how
):
    """Encryption does not skip the dispatch check: the error names the path, as for a
    plain job, instead of json's own 'Object of type date is not JSON serializable'."""
    async with make_app(key=generate_key()):
        pending = (
            ex_secret.with_(bad)
            if how == "dispatch"
            else Queue.chain([ex_secret.with_({"card": SECRET}), ex_secret.with_(bad)])
        )
        with pytest.raises(TypeError) as caught:
            await pending.dispatch()
        assert says in str(caught.value)
        await done()
    assert RUNS == []


async def test_decrypt_error_type(app):
    from haze._base.crypto import decrypt_payload, encrypt_payload
    from haze._base.message import Message

    a = haze.App(key=generate_key())
    b = haze.App(key=generate_key())
    m = Message(id="m1", job="ex_secret", payload={"card": SECRET})
    encrypt_payload(a, m)
    assert m.payload is None
    assert SECRET not in m.enc
    with pytest.raises(MessageDecodeError, match="cannot decrypt"):
        decrypt_payload(b, m)
    assert decrypt_payload(a, m) == {"card": SECRET}


async def test_encrypted_unique_key_sees_the_payload(make_app, done):
    async with make_app(key=generate_key()):
        first = await ex_secret_unique.with_({"card": SECRET, "order": 1}).dispatch()
        other = await ex_secret_unique.with_({"card": SECRET, "order": 2}).dispatch()
        await done()
    assert not first.skipped
    assert not other.skipped
    assert sorted(r["payload"]["order"] for r in RUNS) == [1, 2]


async def test_fake_records_the_plain_payload_of_encrypted_jobs(make_app, queue_fake):
    async with make_app(key=generate_key()):
        await ex_secret.dispatch({"card": SECRET})
        queue_fake.assert_dispatched(ex_secret, lambda p: p["card"] == SECRET)
        await queue_fake.drain()
    assert RUNS[0]["payload"] == {"card": SECRET}


# ========================================================================== job.fail and dont_retry


class Declined(Exception):
    pass


@define_job(name="ex_job_fail", tries=5, failed=_on_failed)
async def ex_job_fail(payload: dict, job: JobContext) -> None:
    _record("job_fail", payload, job)
    how = payload["how"]
    if how == "str":
        job.fail("card expired")
    elif how == "exc":
        job.fail(Declined("declined"))
    else:
        job.fail()


@pytest.mark.parametrize(
    ("how", "kind", "text"),
    [
        ("str", JobFailedError, "card expired"),
        ("exc", Declined, "declined"),
        ("none", JobFailedError, "ex_job_fail"),
    ],
)
async def test_job_fail_fails_now_without_remaining_tries(app, driver, done, how, kind, text):
    err = await quietly(ex_job_fail.dispatch({"how": how}))
    await done()
    if driver.inline:
        assert isinstance(err, kind)
    assert len(RUNS) == 1
    assert len(FAILED) == 1
    assert isinstance(FAILED[0]["error"], kind)
    assert text in str(FAILED[0]["error"])
    if driver.stores_failed:
        [f] = await Queue.failed()
        assert text in f.exception


@define_job(name="ex_dont_retry", tries=3, dont_retry=[Declined, KeyError], failed=_on_failed)
async def ex_dont_retry(payload: dict, job: JobContext) -> None:
    _record("dont_retry", payload, job)
    raise {"declined": Declined("no"), "key": KeyError("k"), "other": ConnectionError("x")}[
        payload["raise"]
    ]


@pytest.mark.requires("retries")
async def test_dont_retry_fails_at_once_for_listed_types(app, done):
    for kind in ("declined", "key", "other"):
        await ex_dont_retry.dispatch({"raise": kind})
    await done()
    counts = {
        k: sum(1 for r in RUNS if r["payload"]["raise"] == k) for k in ("declined", "key", "other")
    }
    assert counts == {"declined": 1, "key": 1, "other": 3}
    assert len(FAILED) == 3


def test_dont_retry_must_list_exception_classes():
    with pytest.raises(ValueError, match="dont_retry"):

        @define_job(name="ex_bad_dont_retry", dont_retry=["ValueError"])
        async def bad_job(payload: dict) -> None: ...


# ============================================================================ queue events


@define_job(name="ex_evented", tries=1)
async def ex_evented(payload: dict, job: JobContext) -> None:
    _record("evented", payload, job)
    if payload.get("fail"):
        raise RuntimeError("event failure")


@pytest.fixture
def listen() -> Any:
    added: list[tuple[str, Callable[..., Any]]] = []

    def on(event: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        Queue.on(event, fn)
        added.append((event, fn))
        return fn

    yield on
    for event, fn in added:
        haze._engine.manager.events.off(event, fn)


async def test_before_after_failing_events(app, driver, done, listen):
    seen: list[tuple[str, str, Any]] = []
    listen("before", lambda job: seen.append(("before", job.name, job.id)))

    async def after(job: JobContext) -> None:
        seen.append(("after", job.name, job.id))

    listen("after", after)
    listen("failing", lambda job, error: seen.append(("failing", job.name, str(error))))

    ok = await ex_evented.dispatch({})
    await quietly(ex_evented.dispatch({"fail": True}))
    await done()
    assert ("before", "ex_evented", ok) in seen
    assert ("after", "ex_evented", ok) in seen
    assert ("failing", "ex_evented", "event failure") in seen
    assert [e for e, _, _ in seen].count("before") == 2
    assert [e for e, _, _ in seen].count("after") == 1


async def test_a_failing_listener_never_breaks_a_job(app, done, listen, caplog):
    def broken(job: JobContext) -> None:
        raise RuntimeError("listener bug")

    listen("before", broken)
    with caplog.at_level(logging.ERROR, logger="haze"):
        await ex_evented.dispatch({})
        await done()
    assert len(RUNS) == 1
    assert "listener bug" in caplog.text


@pytest.mark.requires("queued")
async def test_looping_and_worker_idle_events(app, done, listen):
    loops: list[tuple[str, Any]] = []
    idles: list[tuple[str, Any]] = []
    listen("looping", lambda conn, queues: loops.append((conn, queues)))
    listen("worker_idle", lambda conn, queues: idles.append((conn, queues)))
    await ex_evented.dispatch({})
    await done()
    for _ in range(50):
        if loops and idles:
            break
        await asyncio.sleep(0.005)
    assert loops
    assert loops[0][0] == "main"
    assert idles
    assert idles[0][0] == "main"


def test_unknown_event_is_rejected():
    with pytest.raises(ValueError, match="unknown queue event"):
        Queue.on("finished", lambda job: None)
    with pytest.raises(TypeError):
        Queue.on("before", "not callable")  # type: ignore[arg-type]


def test_queue_on_as_decorator():
    @Queue.on("before")
    def listener(job: JobContext) -> None: ...

    try:
        assert listener in haze._engine.manager.events.before
    finally:
        haze._engine.manager.events.off("before", listener)
    assert listener not in haze._engine.manager.events.before
