"""Global concurrency limits on every driver: ``limit_concurrency(max, key=...)`` and the
per-queue ``"queues": {"q1": {"concurrency": n}}`` of a connection.

The contract app keeps its state in a memory store (its worker runs in this process);
limits across real worker processes, with SIGKILLs, are proven in
``tests/robustness/test_concurrency_limit_procs.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import haze
import pytest
from haze import JobContext, Queue, define_job, limit_concurrency

STATE: dict[str, Any] = {}
GATES: dict[str, asyncio.Event] = {}
RUNS: list[dict[str, Any]] = []


@pytest.fixture(autouse=True)
def _reset() -> Any:
    STATE.clear()
    GATES.clear()
    RUNS.clear()


async def _wait_for(cond: Callable[[], bool], limit: float = 5.0) -> None:
    deadline = time.monotonic() + limit
    while not cond() and time.monotonic() < deadline:
        await asyncio.sleep(0.005)


async def _gated(name: str, payload: dict, job: JobContext) -> None:
    running = STATE.setdefault("running", {})
    running[name] = running.get(name, 0) + 1
    total = sum(running.values())
    STATE["max"] = max(STATE.get("max", 0), total)
    RUNS.append({"job": name, "payload": payload, "attempt": job.attempt, "t0": time.time()})
    try:
        gate = GATES.get(payload.get("gate", ""))
        if gate is not None:
            await asyncio.wait_for(gate.wait(), 10)
        else:
            await asyncio.sleep(payload.get("sleep", 0.03))
    finally:
        running[name] -= 1
        RUNS[-1]["t1"] = time.time()


def _running() -> int:
    return sum(STATE.get("running", {}).values())


def _slot_keys(store: Any) -> list[str]:
    return [k for k in list(store._data) if k.startswith("haze:") and ":conc:" in k]


@define_job(name="cl_two", middleware=[limit_concurrency(2, release_after=0.02)])
async def cl_two(payload: dict, job: JobContext) -> None:
    await _gated("two", payload, job)


@define_job(
    name="cl_per_user",
    middleware=[limit_concurrency(1, key=lambda p: p["user"], release_after=0.02)],
)
async def cl_per_user(payload: dict, job: JobContext) -> None:
    await _gated(f"user:{payload['user']}", payload, job)


@define_job(name="cl_named_a", middleware=[limit_concurrency(1, "cl-shared", release_after=0.02)])
async def cl_named_a(payload: dict, job: JobContext) -> None:
    await _gated("a", payload, job)


@define_job(name="cl_named_b", middleware=[limit_concurrency(1, "cl-shared", release_after=0.02)])
async def cl_named_b(payload: dict, job: JobContext) -> None:
    await _gated("b", payload, job)


@define_job(name="cl_drop", middleware=[limit_concurrency(1, release_after=False)])
async def cl_drop(payload: dict, job: JobContext) -> None:
    await _gated("drop", payload, job)


@define_job(
    name="cl_lease",
    middleware=[limit_concurrency(1, release_after=0.02, expire_after=1)],
)
async def cl_lease(payload: dict, job: JobContext) -> None:
    await _gated("lease", payload, job)


@define_job(name="cl_plain")
async def cl_plain(payload: dict, job: JobContext) -> None:
    await _gated(f"plain:{job.queue}", payload, job)


@pytest.mark.requires("concurrency", "release")
async def test_at_most_max_run_at_once_and_the_rest_are_released(make_app, done):
    async with make_app(concurrency=6) as app:
        GATES["g"] = asyncio.Event()
        for i in range(5):
            await cl_two.dispatch({"n": i, "gate": "g"})
        await _wait_for(lambda: _running() == 2)
        await asyncio.sleep(0.3)  # the others keep being released meanwhile
        assert _running() == 2, "exactly max runs hold a slot"
        GATES["g"].set()
        await done()
        assert sorted(r["payload"]["n"] for r in RUNS) == [0, 1, 2, 3, 4]
        assert STATE["max"] == 2
        assert all(r["attempt"] == 1 for r in RUNS), "a release uses no try"
        assert await Queue.failed() == []
        assert _slot_keys(app.queue_store) == [], "every slot was given back"


@pytest.mark.requires("concurrency", "release")
async def test_a_key_function_limits_each_partition(make_app, done):
    async with make_app(concurrency=4):
        GATES["g"] = asyncio.Event()
        await cl_per_user.dispatch({"user": 1, "gate": "g"})
        await cl_per_user.dispatch({"user": 1, "gate": "g"})
        await cl_per_user.dispatch({"user": 2, "gate": "g"})
        await _wait_for(lambda: _running() == 2)
        await asyncio.sleep(0.2)
        assert STATE["running"] == {"user:1": 1, "user:2": 1}
        GATES["g"].set()
        await done()
        assert len(RUNS) == 3


@pytest.mark.requires("concurrency", "release")
async def test_a_named_limit_is_shared_by_every_job_using_it(make_app, done):
    async with make_app(concurrency=4):
        await cl_named_a.dispatch({"sleep": 0.05})
        await cl_named_b.dispatch({"sleep": 0.05})
        await cl_named_a.dispatch({"sleep": 0.05})
        await done()
        assert STATE["max"] == 1
        assert sorted(r["job"] for r in RUNS) == ["a", "a", "b"]


@pytest.mark.requires("concurrency")
async def test_release_after_false_drops_the_run(make_app, done):
    finished: list[str] = []

    def on_after(job: JobContext) -> None:
        finished.append(job.id)

    async with make_app(concurrency=2):
        GATES["g"] = asyncio.Event()
        await cl_drop.dispatch({"n": 0, "gate": "g"})
        await _wait_for(lambda: _running() == 1)
        haze._engine.manager.events.on("after", on_after)
        try:
            dropped = await cl_drop.dispatch({"n": 1})
            await _wait_for(lambda: dropped in finished)
        finally:
            haze._engine.manager.events.off("after", on_after)
            GATES["g"].set()
        await done()
        assert [r["payload"]["n"] for r in RUNS] == [0]
        assert await Queue.failed() == []


@pytest.mark.requires("release")
async def test_a_crashed_holders_slot_frees_itself_when_its_lease_expires(app, done):
    # A worker that died holding the only slot: its key stays until its lease runs out.
    store = app.queue_store
    assert await store.add("haze:mw:conc:job:cl_lease:slot:0", "dead-worker:1", 0.4)
    t0 = time.time()
    await cl_lease.dispatch({"sleep": 0.01})
    await done()
    assert len(RUNS) == 1
    assert RUNS[0]["t0"] - t0 >= 0.35, "it ran only once the dead holder's lease expired"
    assert RUNS[0]["attempt"] == 1
    assert _slot_keys(store) == []


@pytest.mark.requires("concurrency", "release")
async def test_a_running_job_renews_its_lease(make_app, done):
    # The lease is 1 s (the shortest); a run of 1.6 s keeps its slot, so the second
    # never overlaps it.
    async with make_app(concurrency=2):
        await cl_lease.dispatch({"n": 0, "sleep": 1.6})
        await _wait_for(lambda: _running() == 1)
        await cl_lease.dispatch({"n": 1, "sleep": 0.01})
        await done()
        assert STATE["max"] == 1
        first, second = sorted(RUNS, key=lambda r: r["payload"]["n"])
        assert second["t0"] >= first["t1"]


@pytest.mark.requires("release")
async def test_slot_keys_are_scoped_by_tenant(app, done):
    seen: list[list[str]] = []

    @define_job(name="cl_tenant", middleware=[limit_concurrency(1, "cl-t")])
    async def cl_tenant(payload: dict, job: JobContext) -> None:
        seen.append(_slot_keys(job.app.queue_store))

    with haze.tenant("acme"):
        await cl_tenant.dispatch({})
    await done()
    assert seen == [["haze:mw:acme:conc:name:cl-t:slot:0"]]


@pytest.mark.requires("concurrency", "release")
async def test_a_queue_limit_in_config_holds_on_every_worker(make_app, done):
    options = {"queues": {"q1": {"concurrency": 2, "release_after": "20ms"}, "default": {}}}
    async with make_app(concurrency=8, options=options) as app:
        GATES["g"] = asyncio.Event()
        for i in range(4):
            await cl_plain.with_({"n": i, "gate": "g"}).on_queue("q1").dispatch()
        for i in range(3):
            await cl_plain.with_({"n": 10 + i, "gate": "g"}).on_queue("default").dispatch()
        await _wait_for(lambda: _running() == 5)
        await asyncio.sleep(0.3)
        assert STATE["running"] == {"plain:q1": 2, "plain:default": 3}, (
            "q1 runs at most 2; default has no limit"
        )
        GATES["g"].set()
        await done()
        assert len(RUNS) == 7
        assert all(r["attempt"] == 1 for r in RUNS)
        assert _slot_keys(app.queue_store) == []


@pytest.mark.requires("release")
async def test_a_memory_store_beside_a_remote_connection_warns(
    make_app, driver, remote_sim, caplog
):
    if driver.id != "memory":
        pytest.skip("runs once, on the simulated remote connection")
    async with make_app(spec=remote_sim):
        with caplog.at_level(logging.WARNING, logger="haze"):
            await cl_two.dispatch({"sleep": 0.01})
            await _wait_for(lambda: "concurrency slots" in caplog.text)
    assert "each process gets its own limit" in caplog.text


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda: limit_concurrency(0), "max"),
        (lambda: limit_concurrency(True), "max"),
        (lambda: limit_concurrency(2, key=5), "key"),
        (lambda: limit_concurrency(2, key=""), "key"),
        (lambda: limit_concurrency(2, release_after="soon"), "release_after"),
        (lambda: limit_concurrency(2, release_after=True), "release_after"),
        (lambda: limit_concurrency(2, expire_after=0), "expire_after"),
    ],
)
def test_bad_arguments_fail_at_definition(make, needle):
    with pytest.raises(ValueError, match=needle):
        make()
