"""Job middleware (seed: 任务中间件; SPEC §9, §12, §13) on every driver.

Built-ins keep their state in the queue store; releases are not failures; a skip
counts as done; global middleware (config) runs before the job's own.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import haze
import pytest
from haze import (
    JobContext,
    Queue,
    define_cache_config,
    define_job,
    define_queue_config,
    fail_on_exception,
    rate_limited,
    skip_if,
    skip_if_batch_cancelled,
    throttles_exceptions,
    without_overlapping,
)
from haze._base.errors import ConfigError

RUNS: list[dict[str, Any]] = []
ORDER: list[str] = []
GATES: dict[str, asyncio.Event] = {}
STATE: dict[str, Any] = {}


async def quietly(aw: Any) -> Any:
    """Await; return the raised exception instead of propagating it (sync raises)."""
    try:
        return await aw
    except Exception as e:
        return e


@pytest.fixture(autouse=True)
def _reset() -> Any:
    RUNS.clear()
    ORDER.clear()
    GATES.clear()
    STATE.clear()


def _record(name: str, payload: Any, job: JobContext) -> None:
    RUNS.append(
        {"job": name, "payload": payload, "id": job.id, "attempt": job.attempt, "t": time.time()}
    )


def _mw_keys(store: Any, kind: str) -> list[str]:
    return [k for k in list(store._data) if k.startswith("haze:mw:") and f":{kind}:" in k]


async def _failed_names(driver: Any) -> list[str]:
    return [f.name for f in await Queue.failed()] if driver.stores_failed else []


# ============================================================================ rate_limited

RATE_WINDOW = 0.3


@define_job(name="mw_rate_a", middleware=[rate_limited("mw_rate_shared", max=2, per=RATE_WINDOW)])
async def mw_rate_a(payload: dict, job: JobContext) -> None:
    _record("a", payload, job)


@define_job(name="mw_rate_b", middleware=[rate_limited("mw_rate_shared", max=2, per=RATE_WINDOW)])
async def mw_rate_b(payload: dict, job: JobContext) -> None:
    _record("b", payload, job)


@define_job(
    name="mw_rate_keyed",
    middleware=[rate_limited("mw_rate_keyed", max=1, per=RATE_WINDOW, key=lambda p: p["acct"])],
)
async def mw_rate_keyed(payload: dict, job: JobContext) -> None:
    _record("k", payload, job)


async def _fresh_window(window: float) -> float:
    """Sleep into the start of a window so the test does not straddle a boundary."""
    now = time.time()
    left = (math.floor(now / window) + 1) * window - now
    if left < window * 0.6:
        await asyncio.sleep(left + 0.005)
    return math.floor(time.time() / window)


def _per_window(key: Callable[[dict[str, Any]], Any] = lambda r: None) -> Counter[Any]:
    """Runs counted by (window, key(run)). Run times are taken in the handler, right after
    the limiter let the run through."""
    return Counter((math.floor(r["t"] / RATE_WINDOW), key(r)) for r in RUNS)


@pytest.mark.requires("release")
async def test_rate_limited_releases_over_limit_runs_to_the_next_window(app, driver, done):
    await _fresh_window(RATE_WINDOW)
    for i in range(3):
        await mw_rate_a.dispatch({"n": i})
    await done()
    assert sorted(r["payload"]["n"] for r in RUNS) == [0, 1, 2], "released, not dropped"
    assert max(_per_window().values()) <= 2, "max=2 per window"
    assert len(_per_window()) >= 2, "the third run waited for another window"
    assert all(r["attempt"] == 1 for r in RUNS), "a release is not a failed attempt"
    assert await _failed_names(driver) == []
    # the counter is in the queue store, keyed by the limiter name and the window
    assert any("mw_rate_shared" in k for k in _mw_keys(app.queue_store, "rate"))


async def test_rate_limited_on_sync_drops_the_released_run(app, driver, caplog):
    if not driver.inline:
        pytest.skip("sync-only rule")
    await _fresh_window(RATE_WINDOW)
    with caplog.at_level(logging.WARNING, logger="haze"):
        for i in range(3):
            await mw_rate_a.dispatch({"n": i})
    assert [r["payload"]["n"] for r in RUNS] == [0, 1]
    assert "release()" in caplog.text
    assert "dropped" in caplog.text


async def test_rate_limited_is_shared_by_name_across_jobs(app, driver, done):
    await _fresh_window(RATE_WINDOW)
    await mw_rate_a.dispatch({"n": 1})
    await mw_rate_b.dispatch({"n": 2})
    await mw_rate_b.dispatch({"n": 3})
    await done()
    assert max(_per_window().values()) <= 2, "both jobs count against one limit"
    if driver.supports_release:
        assert len(RUNS) == 3
    else:  # sync: the three dispatches ran inside one window; the third was dropped
        assert [r["payload"]["n"] for r in RUNS] == [1, 2]


async def test_rate_limited_key_splits_the_limit(app, driver, done):
    await _fresh_window(RATE_WINDOW)
    await mw_rate_keyed.dispatch({"acct": "x"})
    await mw_rate_keyed.dispatch({"acct": "y"})
    await mw_rate_keyed.dispatch({"acct": "x"})
    await done()
    assert max(_per_window(lambda r: r["payload"]["acct"]).values()) == 1
    if driver.supports_release:
        assert sorted(r["payload"]["acct"] for r in RUNS) == ["x", "x", "y"]
    else:
        assert [r["payload"]["acct"] for r in RUNS] == ["x", "y"]


async def test_rate_limited_keys_are_scoped_by_tenant(app, done):
    await _fresh_window(RATE_WINDOW)
    with haze.tenant("t1"):
        await mw_rate_keyed.dispatch({"acct": "z"})
    with haze.tenant("t2"):
        await mw_rate_keyed.dispatch({"acct": "z"})
    await done()
    assert len(RUNS) == 2
    keys = _mw_keys(app.queue_store, "rate")
    assert any(":t1:" in k for k in keys)
    assert any(":t2:" in k for k in keys)


# ============================================================================ without_overlapping


async def _wait_for(cond: Callable[[], bool], limit: float = 5.0) -> None:
    """Poll ``cond`` (remote drivers poll their queue, so this may take a moment)."""
    deadline = time.monotonic() + limit
    while not cond() and time.monotonic() < deadline:
        await asyncio.sleep(0.005)


async def _gated(name: str, payload: dict, job: JobContext) -> None:
    STATE["running"] = STATE.get("running", 0) + 1
    STATE["max"] = max(STATE.get("max", 0), STATE["running"])
    _record(name, payload, job)
    try:
        gate = GATES.get(payload.get("gate", ""))
        if gate is not None:
            await asyncio.wait_for(gate.wait(), 5)
        else:
            await asyncio.sleep(0.03)
    finally:
        STATE["running"] -= 1


@define_job(name="mw_overlap", middleware=[without_overlapping(release_after=0.02)])
async def mw_overlap(payload: dict, job: JobContext) -> None:
    await _gated("overlap", payload, job)


@define_job(name="mw_overlap_drop", middleware=[without_overlapping(release_after=False)])
async def mw_overlap_drop(payload: dict, job: JobContext) -> None:
    await _gated("drop", payload, job)


@define_job(name="mw_overlap_k1", middleware=[without_overlapping("k", release_after=0.02)])
async def mw_overlap_k1(payload: dict, job: JobContext) -> None:
    await _gated("k1", payload, job)


@define_job(name="mw_overlap_k2", middleware=[without_overlapping("k", release_after=0.02)])
async def mw_overlap_k2(payload: dict, job: JobContext) -> None:
    await _gated("k2", payload, job)


@define_job(
    name="mw_overlap_s1", middleware=[without_overlapping("k", release_after=0.02, shared=True)]
)
async def mw_overlap_s1(payload: dict, job: JobContext) -> None:
    await _gated("s1", payload, job)


@define_job(
    name="mw_overlap_s2", middleware=[without_overlapping("k", release_after=0.02, shared=True)]
)
async def mw_overlap_s2(payload: dict, job: JobContext) -> None:
    await _gated("s2", payload, job)


@define_job(
    name="mw_overlap_keyfn",
    middleware=[
        without_overlapping(lambda p: f"user:{p['user']}", release_after=0.02, expire_after="5m")
    ],
)
async def mw_overlap_keyfn(payload: dict, job: JobContext) -> None:
    keys = _mw_keys(job.app.queue_store, "overlap")
    STATE.setdefault("ttls", []).extend([await job.app.queue_store.ttl(k) for k in keys])
    STATE.setdefault("keys", []).extend(keys)
    await _gated("keyfn", payload, job)


@pytest.mark.requires("concurrency", "release")
async def test_without_overlapping_releases_the_second_run(make_app, driver, done):
    async with make_app(concurrency=3) as app:
        for i in range(3):
            await mw_overlap.dispatch({"n": i})
        await done()
        assert sorted(r["payload"]["n"] for r in RUNS) == [0, 1, 2]
        assert STATE["max"] == 1
        assert all(r["attempt"] == 1 for r in RUNS)
        assert await Queue.failed() == []
        assert _mw_keys(app.queue_store, "overlap") == []


@pytest.mark.requires("concurrency")
async def test_without_overlapping_release_after_false_drops(make_app, done):
    finished: list[str] = []

    def on_after(job: JobContext) -> None:
        finished.append(job.id)

    async with make_app(concurrency=2):
        GATES["g"] = asyncio.Event()
        await mw_overlap_drop.dispatch({"n": 0, "gate": "g"})
        await _wait_for(lambda: STATE.get("running") == 1)
        haze._engine.manager.events.on("after", on_after)
        try:
            dropped = await mw_overlap_drop.dispatch({"n": 1})
            await _wait_for(lambda: dropped in finished)  # dropped = done, without running
        finally:
            haze._engine.manager.events.off("after", on_after)
            GATES["g"].set()
        await done()
        assert [r["payload"]["n"] for r in RUNS] == [0]
        assert await Queue.failed() == []


@pytest.mark.requires("concurrency", "release")
async def test_without_overlapping_is_scoped_to_the_job_name(make_app, done):
    async with make_app(concurrency=4):
        GATES["g"] = asyncio.Event()
        await mw_overlap_k1.dispatch({"gate": "g"})
        await mw_overlap_k2.dispatch({"gate": "g"})
        await _wait_for(lambda: STATE.get("running") == 2)
        assert STATE.get("running") == 2, "same key, different jobs: no overlap lock shared"
        GATES["g"].set()
        await done()


@pytest.mark.requires("concurrency", "release")
async def test_without_overlapping_shared_key_spans_jobs(make_app, done):
    async with make_app(concurrency=4):
        await mw_overlap_s1.dispatch({})
        await mw_overlap_s2.dispatch({})
        await mw_overlap_s1.dispatch({})
        await done()
        assert STATE["max"] == 1
        assert sorted(r["job"] for r in RUNS) == ["s1", "s1", "s2"]


async def test_without_overlapping_key_function_and_expiry(app, done):
    await mw_overlap_keyfn.dispatch({"user": 7})
    await done()
    assert len(RUNS) == 1
    assert len(STATE["keys"]) == 1
    assert "mw_overlap_keyfn" in STATE["keys"][0]
    assert "user:7" in STATE["keys"][0]
    assert 0 < STATE["ttls"][0] <= 300
    assert _mw_keys(app.queue_store, "overlap") == []  # released after the run


async def test_without_overlapping_on_sync_nested_run_is_dropped(app, driver, caplog):
    """On sync a nested dispatch of the same job finds the lock held; its release drops it."""
    if not driver.inline:
        pytest.skip("sync-only rule")

    @define_job(name="mw_overlap_nested", middleware=[without_overlapping(release_after=0.01)])
    async def nested(payload: dict, job: JobContext) -> None:
        _record("nested", payload, job)
        if payload["n"] == 0:
            await nested.dispatch({"n": 1})

    with caplog.at_level(logging.WARNING, logger="haze"):
        await nested.dispatch({"n": 0})
    assert [r["payload"]["n"] for r in RUNS] == [0]
    assert "dropped" in caplog.text


# ============================================================================ throttles_exceptions


@define_job(
    name="mw_throttle",
    tries=3,
    backoff=60,
    middleware=[throttles_exceptions(max=2, per=0.4, backoff=0.01)],
)
async def mw_throttle(payload: dict, job: JobContext) -> None:
    _record("throttle", payload, job)
    raise RuntimeError("upstream down")


@define_job(name="mw_throttle_once", tries=1, middleware=[throttles_exceptions(max=5, per="1m")])
async def mw_throttle_once(payload: dict, job: JobContext) -> None:
    _record("once", payload, job)
    if payload.get("fail"):
        raise RuntimeError("nope")


@define_job(
    name="mw_throttle_when",
    tries=1,
    middleware=[
        throttles_exceptions(
            max=1,
            per="1m",
            key="mw_throttle_when_key",
            when=lambda p, job: p["count"] and isinstance(job.error, RuntimeError),
        )
    ],
)
async def mw_throttle_when(payload: dict, job: JobContext) -> None:
    _record("when", payload, job)
    raise RuntimeError("x")


@pytest.mark.requires("retries", "release")
async def test_throttles_exceptions_opens_the_circuit(app, done, monkeypatch):
    drv = app.driver("main")
    releases: list[tuple[float, bool]] = []
    real = drv.release

    async def spy(job: Any, delay: float, *, consume_attempt: bool) -> None:
        releases.append((delay, consume_attempt))
        await real(job, delay, consume_attempt=consume_attempt)

    monkeypatch.setattr(drv, "release", spy)
    await mw_throttle.dispatch({})
    await done()
    # attempt 1 and 2 raise (counted as failed attempts, retried after `backoff`, not the
    # job's 60 s); the 2nd exception opens the circuit, so the next run is released
    # until the window ends without using a try; then attempt 3 runs and fails for good.
    assert [r["attempt"] for r in RUNS] == [1, 2, 3]
    assert releases[0] == (0.01, True)
    assert releases[1] == (0.01, True)
    assert releases[2][1] is False
    assert 0 < releases[2][0] <= 0.4
    failed = await Queue.failed()
    assert [f.name for f in failed] == ["mw_throttle"]
    assert "upstream down" in failed[0].exception


async def test_throttles_exceptions_still_fails_the_attempt(app, driver, done):
    err = await quietly(mw_throttle_once.dispatch({"fail": True}))
    await done()
    if driver.inline:
        assert isinstance(err, RuntimeError)
    assert await _failed_names(driver) == (["mw_throttle_once"] if driver.stores_failed else [])
    keys = _mw_keys(app.queue_store, "throttle")
    assert any(k.endswith(":count") for k in keys)


async def test_throttles_exceptions_success_resets_the_count(app, done):
    await quietly(mw_throttle_once.dispatch({"fail": True}))
    await done()
    assert any(k.endswith(":count") for k in _mw_keys(app.queue_store, "throttle"))
    await mw_throttle_once.dispatch({"fail": False})
    await done()
    assert not any(k.endswith(":count") for k in _mw_keys(app.queue_store, "throttle"))


async def test_throttles_exceptions_when_limits_what_counts(app, driver, done, monkeypatch):
    await quietly(mw_throttle_when.dispatch({"count": False}))
    await done()
    assert _mw_keys(app.queue_store, "throttle") == []
    await quietly(mw_throttle_when.dispatch({"count": True}))
    await done()
    keys = _mw_keys(app.queue_store, "throttle")
    assert any("mw_throttle_when_key" in k and k.endswith(":until") for k in keys)
    # the circuit is open: the next run is released (for the rest of the window) before
    # it reaches the handler
    n = len(RUNS)
    released: list[float] = []
    if not driver.inline:
        drv = app.driver("main")
        real = drv.release

        async def spy(job: Any, delay: float, *, consume_attempt: bool) -> None:
            released.append(delay)
            await real(job, delay, consume_attempt=consume_attempt)

        monkeypatch.setattr(drv, "release", spy)
    await quietly(mw_throttle_when.dispatch({"count": True}))
    if not driver.inline:
        await _wait_for(lambda: bool(released))
        assert 0 < released[0] <= 60
    assert len(RUNS) == n


# ============================================================================ skip_if and custom


@define_job(name="mw_skip", tries=3, middleware=[skip_if(lambda p, job: p["user_id"] == 0)])
async def mw_skip(payload: dict, job: JobContext) -> None:
    _record("skip", payload, job)


async def _async_pred(payload: dict, job: JobContext) -> bool:
    await asyncio.sleep(0)
    STATE["pred_job"] = job.name
    return bool(payload.get("skip"))


@define_job(name="mw_skip_async", middleware=[skip_if(_async_pred)])
async def mw_skip_async(payload: dict, job: JobContext) -> None:
    _record("skip_async", payload, job)


async def test_skip_if_skips_and_counts_as_done(app, driver, done):
    after: list[str] = []

    def on_after(job: JobContext) -> None:
        after.append(job.id)

    haze._engine.manager.events.on("after", on_after)
    try:
        skipped = await mw_skip.dispatch({"user_id": 0})
        await mw_skip.dispatch({"user_id": 5})
        await done()
    finally:
        haze._engine.manager.events.off("after", on_after)
    assert [r["payload"]["user_id"] for r in RUNS] == [5]
    assert skipped in after, "a skipped run is a completed run"
    assert await _failed_names(driver) == []


async def test_skip_if_async_predicate_gets_payload_and_job(app, done):
    await mw_skip_async.dispatch({"skip": True})
    await mw_skip_async.dispatch({"skip": False})
    await done()
    assert len(RUNS) == 1
    assert STATE["pred_job"] == "mw_skip_async"


async def _mw_outer(payload: Any, job: JobContext, call_next: Any) -> Any:
    ORDER.append("outer:before")
    result = await call_next()
    ORDER.append("outer:after")
    return result


def _mw_inner_sync(payload: Any, job: JobContext, call_next: Any) -> Any:
    ORDER.append("inner")
    return call_next()  # a plain function may return the awaitable


async def _mw_gate(payload: Any, job: JobContext, call_next: Any) -> Any:
    mode = payload.get("mode")
    if mode == "skip":
        return None
    if mode == "release" and job.attempt == 1 and not STATE.get("released"):
        STATE["released"] = True
        job.release(0.01)
        return None
    return await call_next()


@define_job(name="mw_custom", tries=1, middleware=[_mw_outer, _mw_inner_sync, _mw_gate])
async def mw_custom(payload: dict, job: JobContext) -> None:
    ORDER.append("handle")
    _record("custom", payload, job)


async def test_custom_middleware_wraps_the_handler_in_order(app, done):
    await mw_custom.dispatch({})
    await done()
    assert ORDER == ["outer:before", "inner", "handle", "outer:after"]


async def test_custom_middleware_not_calling_next_skips(app, driver, done):
    await mw_custom.dispatch({"mode": "skip"})
    await done()
    assert RUNS == []
    assert await _failed_names(driver) == []


@pytest.mark.requires("release")
async def test_custom_middleware_release_then_return(app, done):
    rid = await mw_custom.dispatch({"mode": "release"})
    await done()
    assert [r["id"] for r in RUNS] == [rid]
    assert RUNS[0]["attempt"] == 1, "release() consumes no try"
    assert ORDER.count("outer:before") == 2
    assert await Queue.failed() == []


async def test_custom_middleware_release_on_sync_drops(app, driver, caplog):
    if not driver.inline:
        pytest.skip("sync-only rule")
    with caplog.at_level(logging.WARNING, logger="haze"):
        await mw_custom.dispatch({"mode": "release"})
    assert RUNS == []
    assert "dropped" in caplog.text


async def test_middleware_runs_in_the_jobs_app_and_tenant(app, done):
    seen: dict[str, Any] = {}

    async def mw(payload: Any, job: JobContext, call_next: Any) -> Any:
        seen["app"] = haze.use_app()
        seen["tenant"] = haze.current_tenant()
        return await call_next()

    @define_job(name="mw_context", middleware=[mw])
    async def ctx_job(payload: dict) -> None: ...

    with haze.tenant("acme"):
        await ctx_job.dispatch({})
    await done()
    assert seen == {"app": app, "tenant": "acme"}


# ============================================================================ global middleware


async def _global_mw(payload: Any, job: JobContext, call_next: Any) -> Any:
    ORDER.append(f"global:{job.name}")
    return await call_next()


async def _own_mw(payload: Any, job: JobContext, call_next: Any) -> Any:
    ORDER.append("own")
    return await call_next()


@define_job(name="mw_with_own", middleware=[_own_mw])
async def mw_with_own(payload: dict) -> None:
    ORDER.append("handle")


async def test_global_middleware_runs_before_the_jobs_own(make_app, done):
    async with make_app(middleware=[_global_mw]):
        await mw_with_own.dispatch({})
        await done()
    assert ORDER == ["global:mw_with_own", "own", "handle"]


def test_global_middleware_must_be_callable():
    with pytest.raises(ConfigError, match=r"middleware\[1\]"):
        haze.App(queue=define_queue_config(middleware=[_global_mw, "nope"]))


# ============================================================================ store


async def test_middleware_state_lives_in_the_queue_store(make_app, done):
    cache = define_cache_config(
        default="memory", stores={"memory": {"driver": "memory"}, "locks": {"driver": "memory"}}
    )
    async with make_app(store="locks", cache=cache) as app:
        await _fresh_window(RATE_WINDOW)
        await mw_rate_keyed.dispatch({"acct": "s"})
        await done()
        assert app.queue_store is app.store("locks")
        assert _mw_keys(app.store("locks"), "rate")
        assert _mw_keys(app.store("memory"), "rate") == []


# ============================================================================ fail_on_exception


class PermissionRevoked(Exception):
    pass


@define_job(name="mw_fail_on", tries=3, middleware=[fail_on_exception([PermissionRevoked])])
async def mw_fail_on(payload: dict, job: JobContext) -> None:
    _record("fail_on", payload, job)
    if payload["kind"] == "perm":
        raise PermissionRevoked("revoked")
    raise ConnectionError("flaky")


@define_job(
    name="mw_fail_on_fn",
    tries=3,
    middleware=[fail_on_exception(lambda e, job: "fatal" in str(e))],
)
async def mw_fail_on_fn(payload: dict, job: JobContext) -> None:
    _record("fail_on_fn", payload, job)
    raise RuntimeError(payload["msg"])


@pytest.mark.requires("retries")
async def test_fail_on_exception_fails_without_remaining_tries(app, done):
    await mw_fail_on.dispatch({"kind": "perm"})
    await mw_fail_on.dispatch({"kind": "flaky"})
    await done()
    perm = [r for r in RUNS if r["payload"]["kind"] == "perm"]
    flaky = [r for r in RUNS if r["payload"]["kind"] == "flaky"]
    assert len(perm) == 1
    assert len(flaky) == 3
    failed = {f.payload["kind"]: f for f in await Queue.failed()}
    assert "PermissionRevoked" in failed["perm"].exception
    assert "ConnectionError" in failed["flaky"].exception


@pytest.mark.requires("retries")
async def test_fail_on_exception_with_a_callable(app, done):
    await mw_fail_on_fn.dispatch({"msg": "fatal: gone"})
    await mw_fail_on_fn.dispatch({"msg": "try again"})
    await done()
    assert [r["payload"]["msg"] for r in RUNS].count("fatal: gone") == 1
    assert [r["payload"]["msg"] for r in RUNS].count("try again") == 3


async def test_fail_on_exception_on_sync_raises_to_the_caller(app, driver):
    if not driver.inline:
        pytest.skip("sync-only rule")
    with pytest.raises(PermissionRevoked):
        await mw_fail_on.dispatch({"kind": "perm"})


# ========================================================================== skip_if_batch_cancelled


async def _cancel_batch_mw(payload: Any, job: JobContext, call_next: Any) -> Any:
    batch = job.batch()
    if payload.get("cancel") and batch is not None:
        await batch.cancel()
    return await call_next()


@define_job(name="mw_batch_guarded", middleware=[_cancel_batch_mw, skip_if_batch_cancelled()])
async def mw_batch_guarded(payload: dict, job: JobContext) -> None:
    _record("guarded", payload, job)


async def test_skip_if_batch_cancelled_reads_the_batch_fresh(app, done):
    batch = (
        await Queue.batch([mw_batch_guarded.with_({"cancel": True})]).allow_failures().dispatch()
    )
    await done()
    assert RUNS == [], "cancelled between the snapshot and the handler: skipped"
    assert (await batch.fresh()).cancelled


async def test_skip_if_batch_cancelled_runs_outside_batches_and_live_batches(app, done):
    await mw_batch_guarded.dispatch({"n": 1})
    await Queue.batch([mw_batch_guarded.with_({"n": 2})]).dispatch()
    await done()
    assert sorted(r["payload"]["n"] for r in RUNS) == [1, 2]


# ============================================================================ definition errors


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda: rate_limited("", max=1, per="1m"), "name"),
        (lambda: rate_limited("x", max=0, per="1m"), "max"),
        (lambda: rate_limited("x", max=1, per="soon"), "per"),
        (lambda: rate_limited("x", max=1, per="1m", key="acct"), "key"),
        (lambda: without_overlapping(5), "key"),
        (lambda: without_overlapping(release_after=True), "release_after"),
        (lambda: without_overlapping(release_after="later"), "release_after"),
        (lambda: without_overlapping(expire_after=0), "expire_after"),
        (lambda: throttles_exceptions(max=0), "max"),
        (lambda: throttles_exceptions(per="x"), "per"),
        (lambda: throttles_exceptions(backoff="x"), "backoff"),
        (lambda: throttles_exceptions(key=3), "key"),
        (lambda: throttles_exceptions(when="x"), "when"),
        (lambda: skip_if("x"), "predicate"),
        (lambda: fail_on_exception([]), "fail_on_exception"),
        (lambda: fail_on_exception(["ValueError"]), "ValueError"),
    ],
)
def test_bad_middleware_arguments_fail_at_definition(make, needle):
    with pytest.raises(ValueError, match=needle):
        make()


def test_non_callable_middleware_fails_at_definition():
    with pytest.raises(ValueError, match=r"middleware\[1\]") as ei:

        @define_job(name="mw_bad_list", middleware=[_own_mw, 42])
        async def bad(payload: dict) -> None: ...

    assert "mw_bad_list" in str(ei.value)
    with pytest.raises(ValueError, match="middleware must be a list"):

        @define_job(name="mw_bad_list", middleware=_own_mw)
        async def bad2(payload: dict) -> None: ...
