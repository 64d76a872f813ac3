"""A worker whose leases lapsed while its event loop was starved does not run its own
running jobs a second time, on every SQL backend.

A claim renews nothing while the loop is blocked (a CPU-bound handler, a loaded
machine): past ``retry_after`` its rows look like a dead worker's, and the next claim's
lapsed branch took them back for the same worker, which ran them again (the lease storm
ran 42 of 8,000 jobs twice on SQLite at load 8-10). Now the worker tells the driver which
jobs it renews; a claim that meets one of them passes the new lease to the run that
holds it and does not hand the job out again. A row released for a retry and claimed
again while the old run still sits in the renewal set is a new attempt and runs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import BACKENDS, backend_url, database_app, mysql_database, pg_database
from haze import App, Queue, define_database_config, define_job, define_queue_config
from haze._workers.worker import Worker
from haze.contracts.driver import HeldLeases, Reserved

pytestmark = [pytest.mark.timeout(120)]

#: the lease: a blocked loop outlasts it
LEASE = 1.0
_names = itertools.count()
RUNS: collections.Counter[str] = collections.Counter()
GATE: dict[str, asyncio.Event] = {}


@define_job(name="dbx_own_hold", tries=3)
async def dbx_own_hold(payload: dict[str, Any]) -> None:
    """Counts its run; a held one stays running until the test opens the gate."""
    RUNS[payload["k"]] += 1
    if payload.get("hold"):
        await GATE["open"].wait()


@pytest.fixture(autouse=True)
def _reset() -> None:
    RUNS.clear()
    GATE.clear()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    yield from pg_database("dbx_own")


@pytest.fixture(scope="session")
def mysql_url() -> Iterator[str]:
    yield from mysql_database("dbx_own")


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request, request.param, tmp_path)


@contextlib.asynccontextmanager
async def open_app(db_url: str) -> AsyncIterator[tuple[App, str]]:
    """An app on ``db_url`` with a lease of ``LEASE``, and its jobs table's name."""
    async with database_app(db_url, "owner4_own", retry_after=LEASE) as app:
        yield app, app.driver("db").table


def _another_worker(db_url: str, table: str) -> App:
    """An app of its own (another worker's) on the jobs table ``table``."""
    conn = {"driver": "database", "connection": "main", "table": table, "retry_after": LEASE}
    return App(
        queue=define_queue_config(default="db", connections={"db": conn}),
        database=define_database_config(default="main", connections={"main": {"url": db_url}}),
    )


async def until(predicate: Any, within: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        if loop.time() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.01)


async def test_a_starved_worker_does_not_run_its_own_running_jobs_again(db_url: str) -> None:
    """Two jobs run (waiting on a gate) while the worker's event loop is blocked for
    2.5 leases; the idle slot's next claim meets their lapsed rows. Each job runs once,
    the held runs keep their rows (their acks find them owned), and jobs dispatched
    after still run.

    The loop is blocked by a ``looping`` listener (``time.sleep``), which runs right
    before a slot's claim: the starvation a CPU-bound handler causes, but ending where
    the claim, not a heartbeat, is the first statement sent (a finished job's buffered
    ack would go first on SQLite and let the heartbeat renew the leases in between);
    the first heartbeat after it is held back a moment for the same reason."""
    GATE["open"] = asyncio.Event()
    async with open_app(db_url) as (app, table):
        await Queue.bulk([dbx_own_hold.with_({"k": k, "hold": True}) for k in ("a", "b")])
        worker = Worker(app, "db", ["default"], 3, sleep=0.05, max_sleep=0.05)
        blocked: dict[Any, Any] = {}  # row id -> its claim when the loop was blocked

        def starve(connection: str, queues: Any) -> None:
            if not blocked and RUNS["a"] and RUNS["b"]:
                blocked.update(job.token for job in worker.running_jobs())
                time.sleep(2.5 * LEASE)  # the whole loop: no heartbeat renews anything

        driver: Any = app.driver("db")
        renew, late = driver.heartbeat, []

        async def late_heartbeat(jobs: Any) -> None:
            # The first round after the block comes late, as on a loaded machine: on
            # MariaDB its UPDATE could otherwise lock the rows before the claim's SELECT.
            if blocked and not late:
                late.append(1)
                await asyncio.sleep(0.2)
            await renew(jobs)

        driver.heartbeat = late_heartbeat
        app.manager.events.on("looping", starve)
        worker.start()
        try:
            await until(lambda: blocked)
            await Queue.bulk([dbx_own_hold.with_({"k": f"q{i}"}) for i in range(4)])
            # the claims after the block: the quick jobs, and any held row taken back
            await until(lambda: all(RUNS[f"q{i}"] for i in range(4)) or max(RUNS.values()) > 1)
            await asyncio.sleep(3 * 0.05)  # a few more claims that look for lapsed rows
            rows = await app.database().fetchall(f"SELECT id, reserved_at FROM {table}")
            taken = [r for r in rows if int(r[0]) in blocked and float(r[1]) != blocked[int(r[0])]]
            assert taken, "no claim met the lapsed rows: the test proves nothing"
        finally:
            GATE["open"].set()
            await until(lambda: worker.running == 0)
            await worker.stop()
            app.manager.events.off("looping", starve)
        assert {k: n for k, n in RUNS.items() if n != 1} == {}, "a job ran twice"
        assert sorted(RUNS) == ["a", "b", "q0", "q1", "q2", "q3"]
        assert worker.leases_lost == 0, "a held run lost its row to its own worker"
        assert await app.database().fetchall(f"SELECT id FROM {table}") == []


# --------------------------------------------------------------------------- the driver


async def _lapse() -> None:
    """Past the lease, and past the pause between two looks for lapsed rows."""
    await asyncio.sleep(LEASE * 1.3)


async def _row(app: App, table: str, row_id: Any) -> tuple[float, int] | None:
    row = await app.database().fetchone(
        f"SELECT reserved_at, attempts FROM {table} WHERE id = ?", (row_id,)
    )
    return None if row is None else (float(row[0]), int(row[1]))


async def test_a_claim_leaves_a_held_job_to_its_run_with_the_new_lease(db_url: str) -> None:
    """A job in a consumer's renewal set whose lease lapsed: the next claim of the same
    driver takes the row but hands nothing out; the run holds the new lease (heartbeat
    and ack use it) and the row's attempts stay those of the run. Another lapsed job,
    not held, is handed out as the next attempt (a dead worker's)."""
    async with open_app(db_url) as (app, table):
        driver: Any = app.driver("db")
        assert isinstance(driver, HeldLeases)
        await Queue.bulk([dbx_own_hold.with_({"k": k}) for k in ("held", "dead")])
        held, _ = await driver.reserve_many(["default"], 2, 0)
        renewal: list[Reserved] = [held]
        stop = driver.hold_leases(lambda: renewal)
        try:
            first = held.token
            await _lapse()
            claimed = await driver.reserve_many(["default"], 5, 0)
            assert [(j.message.payload["k"], j.attempt) for j in claimed] == [("dead", 2)]
            assert await driver.ack(claimed[0]) is True
            assert held.token != first, "the run did not take the claim's lease"
            assert await _row(app, table, held.token[0]) == (held.token[1], 1)
            await _lapse()  # no renewal yet: a claim meets it again, and leaves it again
            assert await driver.reserve_many(["default"], 5, 0) == []
            await driver.heartbeat([held])
            await _lapse()
            await driver.heartbeat([held])  # renewed within the lease: not lapsed
            assert await driver.reserve_many(["default"], 5, 0) == []
            assert await driver.ack(held) is True
        finally:
            stop()
        assert await app.database().fetchall(f"SELECT id FROM {table}") == []


async def test_a_row_released_for_a_retry_is_claimed_while_its_old_run_is_held(
    db_url: str,
) -> None:
    """release(consume_attempt=True) ends the run: a claim of its row (here while the
    ended run is still in the renewal set, as it is until the consumer's run returns)
    is the next attempt, not the held run's lapsed lease."""
    async with open_app(db_url) as (app, table):
        driver: Any = app.driver("db")
        await dbx_own_hold.dispatch({"k": "retry"})
        [old] = await driver.reserve_many(["default"], 1, 0)
        stop = driver.hold_leases(lambda: [old])
        try:
            assert await driver.release(old, 0.2, consume_attempt=True) is True
            await _lapse()  # the claim below looks for lapsed rows too
            [again] = await driver.reserve_many(["default"], 5, 0)
            assert again.token[0] == old.token[0] and again.attempt == 2
            assert await _row(app, table, again.token[0]) == (again.token[1], 2)
            assert await driver.ack(again) is True
        finally:
            stop()


async def test_a_consumer_that_stopped_holding_its_jobs_gets_them_back(db_url: str) -> None:
    """Once its renewal set is withdrawn (the worker stopped), a lapsed claim is a dead
    worker's again: handed out, counted as an attempt."""
    async with open_app(db_url) as (app, _table):
        driver: Any = app.driver("db")
        await dbx_own_hold.dispatch({"k": "gone"})
        [job] = await driver.reserve_many(["default"], 1, 0)
        driver.hold_leases(lambda: [job])()
        await _lapse()
        [again] = await driver.reserve_many(["default"], 1, 0)
        assert again.token[0] == job.token[0] and again.attempt == 2
        assert await driver.ack(again) is True


@pytest.mark.parametrize("batched", [False, True], ids=["ack", "ack_many"])
async def test_an_ack_that_crossed_the_claim_taking_its_lease_is_sent_again(
    db_url: str, batched: bool
) -> None:
    """The ack of a held job left with the claim it had, and a claim of the same driver
    passed the job a new lease before the ack reached the row: the ack found the row
    under that lease and goes again with it (done, not a lost lease). The claim is
    injected right before the ack's statement (a wrapper of the connector's ``execute``
    for ``ack``, of the driver's batched delete for ``ack_many``): real servers cannot
    order the two on cue."""
    async with open_app(db_url) as (app, table):
        driver: Any = app.driver("db")
        await dbx_own_hold.dispatch({"k": "crossed"})
        [job] = await driver.reserve_many(["default"], 1, 0)
        stop = driver.hold_leases(lambda: [job])
        first, crossed = job.token, []

        async def claim_first() -> None:
            if not crossed:
                crossed.append(await driver.reserve_many(["default"], 5, 0))

        try:
            await _lapse()
            if batched:
                real_pairs = driver._ack_pairs

                async def ack_pairs(pairs: Any) -> Any:
                    await claim_first()
                    return await real_pairs(pairs)

                driver._ack_pairs = ack_pairs
                assert await driver.ack_many([job]) == [True]
            else:
                db, real_execute = app.database(), app.database().execute

                async def execute(sql: str, params: Any = ()) -> int:
                    if sql == driver.sql["ack"]:
                        await claim_first()
                    return await real_execute(sql, params)

                db.execute = execute
                try:
                    assert await driver.ack(job) is True
                finally:
                    db.execute = real_execute
        finally:
            stop()
        assert crossed == [[]], "the claim handed the held job out"
        assert job.token != first
        assert await app.database().fetchall(f"SELECT id FROM {table}") == []


@pytest.mark.parametrize("batched", [False, True], ids=["ack", "ack_many"])
async def test_an_ack_that_lost_to_a_claim_still_adopting_waits_for_it(
    db_url: str, batched: bool
) -> None:
    """A claim of the same driver took the held job's lapsed row and committed, but has
    not yet passed the new lease to the run (its statement's answer is still on its way
    back, or its rows are being refreshed) when the run's ack finds the row under that
    lease: the ack is not a lost lease until that claim has finished, and then goes
    again with the lease it passed (done, the job not handed out). CI's MariaDB storm ran
    8 of 60 jobs twice this way. The claim is held after its commit by a wrapper of the
    driver's refresh step, and let go once the ack's statement has run: real servers
    cannot order the two on cue."""
    async with open_app(db_url) as (app, table):
        driver: Any = app.driver("db")
        await dbx_own_hold.dispatch({"k": "adopting"})
        [job] = await driver.reserve_many(["default"], 1, 0)
        stop = driver.hold_leases(lambda: [job])
        first, ack_ran = job.token, asyncio.Event()
        real_fresh = driver._fresh

        async def fresh(rows: Any, token: Any) -> Any:
            await ack_ran.wait()
            return await real_fresh(rows, token)

        try:
            await _lapse()
            driver._fresh = fresh
            claim = asyncio.create_task(driver.reserve_many(["default"], 5, 0))
            taken: list[Any] = []  # the claim committed: the row is under its lease
            while not taken and not claim.done():
                row = await _row(app, table, first[0])
                if row is not None and row[0] != float(first[1]):
                    taken.append(row)
                await asyncio.sleep(0.01)
            if batched:
                real_pairs = driver._ack_pairs

                async def ack_pairs(pairs: Any) -> Any:
                    try:
                        return await real_pairs(pairs)
                    finally:
                        ack_ran.set()

                driver._ack_pairs = ack_pairs
                assert await asyncio.wait_for(driver.ack_many([job]), 30) == [True]
            else:
                db, real_execute = app.database(), app.database().execute

                async def execute(sql: str, params: Any = ()) -> int:
                    try:
                        return await real_execute(sql, params)
                    finally:
                        if sql == driver.sql["ack"]:
                            ack_ran.set()

                db.execute = execute
                try:
                    assert await asyncio.wait_for(driver.ack(job), 30) is True
                finally:
                    db.execute = real_execute
            assert await claim == [], "the claim handed the held job out"
        finally:
            ack_ran.set()
            stop()
        assert job.token != first
        assert await app.database().fetchall(f"SELECT id FROM {table}") == []


async def test_a_retry_sent_while_its_claim_adopts_the_row_keeps_the_attempt_count(
    db_url: str,
) -> None:
    """A claim of the same driver took the held job's lapsed row and is passing it to
    the run when the run releases it for a retry: the claim's counted attempt is handed
    back and the retry is recorded, whatever the order, so the next run is attempt 2.
    The run got the new lease before the claim's statement handing the attempt back had
    run, its retry went with it and cleared the lease, the hand-back then matched no row:
    the next run was told attempt 3 (the two-worker lease storm ran a job's attempts 1
    and 3). The retry is sent from a wrapper of the connector's ``execute`` right before
    the hand-back, and the hand-back waits until the retry's statement has run: real
    servers cannot order the two on cue."""
    async with open_app(db_url) as (app, table):
        driver: Any = app.driver("db")
        await dbx_own_hold.dispatch({"k": "adopted-retry"})
        [job] = await driver.reserve_many(["default"], 1, 0)
        stop = driver.hold_leases(lambda: [job])
        db, real_execute = app.database(), app.database().execute
        retried, release = asyncio.Event(), []

        async def execute(sql: str, params: Any = ()) -> int:
            if sql.startswith(driver.sql["adopt"].split("{", 1)[0]) and not release:
                release.append(asyncio.create_task(driver.release(job, 0, consume_attempt=True)))
                await asyncio.wait_for(retried.wait(), 10)
            try:
                return await real_execute(sql, params)
            finally:
                if sql == driver.sql["retry"]:
                    retried.set()

        try:
            await _lapse()
            db.execute = execute
            try:
                assert await driver.reserve_many(["default"], 5, 0) == []
                assert release, "no claim met the lapsed row: the test proves nothing"
                assert await asyncio.wait_for(release[0], 30) is True
            finally:
                db.execute = real_execute
            [again] = await driver.reserve_many(["default"], 5, 0)
        finally:
            stop()
        assert again.attempt == 2, "an attempt was skipped"
        assert await driver.ack(again) is True
        assert await app.database().fetchall(f"SELECT id FROM {table}") == []


async def test_a_claim_does_not_take_over_rows_its_driver_has_not_handed_out_yet(
    db_url: str,
) -> None:
    """A claim's statement returned, and its rows sat unrenewed past the lease before
    the claim handed them out (the event loop starved right then): a claim of the same
    driver looking for lapsed leases took them over, counting an attempt, and the first
    claim dropped them as another's: attempt 1 never ran (the two-worker lease storm ran
    a job's attempts 1 and 3). That claim now waits for the claims in flight; the first
    one hands its job out as attempt 1. The first claim is held after its statement by a
    wrapper of the driver's refresh step: real servers cannot order the two on cue."""
    async with open_app(db_url) as (app, table):
        driver: Any = app.driver("db")
        await dbx_own_hold.dispatch({"k": "in-flight"})
        gate, paused = asyncio.Event(), asyncio.Event()
        real_fresh = driver._fresh

        async def fresh(rows: Any, token: Any) -> Any:
            if not paused.is_set():
                paused.set()
                await gate.wait()
            return await real_fresh(rows, token)

        driver._fresh = fresh
        first = asyncio.create_task(driver.reserve_many(["default"], 1, 0))
        try:
            await asyncio.wait_for(paused.wait(), 10)
            await _lapse()  # the first claim's rows look abandoned now
            second = asyncio.create_task(driver.reserve_many(["default"], 5, 0))
            await asyncio.wait([second], timeout=2)
        finally:
            gate.set()
        [job] = await asyncio.wait_for(first, 30)
        assert job.attempt == 1, "the first claim's attempt was skipped"
        assert await asyncio.wait_for(second, 30) == []
        assert await driver.ack(job) is True
        assert await app.database().fetchall(f"SELECT id FROM {table}") == []


async def test_jobs_an_ack_and_claim_took_are_not_taken_over_before_it_returns(
    db_url: str,
) -> None:
    """``ack_and_claim`` claimed a job, and before it returned (its ack, not owned, went
    on to wait for the claims in flight) the event loop starved past the lease: a claim
    of the same driver looking for lapsed leases took the job over, not yet in any
    renewal set, and handed it out as attempt 2 while the first call handed it out as
    attempt 1 (the two-worker lease storm on MariaDB ran a job's attempts 1, 3 and 2).
    That claim now waits for the first call to return; the job it claimed is then
    held, and stays with it. The pause is a wrapper of the driver's wait for the claims
    in flight, and the ack is made not owned by a second app's claim of its lapsed row
    (another worker): real servers cannot order these on cue."""
    async with open_app(db_url) as (app, table):
        driver: Any = app.driver("db")
        if driver.dialect not in ("postgres", "mysql"):
            pytest.skip("ack_and_claim is ack_many, then a claim of its own, here")
        await dbx_own_hold.dispatch({"k": "lost"})
        [lost] = await driver.reserve_many(["default"], 1, 0)
        held: list[Reserved] = [lost]
        stop = driver.hold_leases(lambda: held)
        await _lapse()
        async with _another_worker(db_url, driver.table) as other:
            theirs: Any = other.driver("db")
            [taken] = await theirs.reserve_many(["default"], 1, 0)  # the lapsed row
            await dbx_own_hold.dispatch({"k": "fresh"})
            real_done, second = driver._claims_done, []

            async def starved_done() -> None:
                if not second:
                    await asyncio.sleep(LEASE * 1.3)  # what this call claimed lapses
                    await theirs.heartbeat([taken])  # the other worker's stays renewed
                    second.append(asyncio.create_task(driver.reserve_many(["default"], 5, 0)))
                    await asyncio.sleep(0.3)
                await real_done()

            driver._claims_done = starved_done
            try:
                owned, claimed = await driver.ack_and_claim([lost], "default", 5)
                held[:] = claimed  # the worker's renewal set, as soon as the call returns
                assert owned == [False]
                assert [(j.message.payload["k"], j.attempt) for j in claimed] == [("fresh", 1)]
                assert await asyncio.wait_for(second[0], 30) == [], "taken over: ran twice"
                assert await driver.ack(claimed[0]) is True
            finally:
                driver._claims_done = real_done
                stop()
        assert taken.attempt == 2
        rows = await app.database().fetchall(f"SELECT id FROM {table}")
        assert [int(r[0]) for r in rows] == [int(taken.token[0])]


async def test_two_ack_and_claims_whose_acks_crossed_claims_do_not_wait_for_each_other(
    db_url: str,
) -> None:
    """Two consumers of one driver (two Worker objects of one app) each send an
    ``ack_and_claim`` whose ack found its row under another worker's lease, at the same
    time: each waits for the claims that may be passing it a lease, and each is itself a
    claim still open. Waiting for each other's whole claim, they would never end; a
    settle waits only until the other claims have passed on what they took. The two are
    brought to that wait together by a wrapper of it (a barrier): real servers cannot
    order them on cue."""
    async with open_app(db_url) as (app, _table):
        driver: Any = app.driver("db")
        if driver.dialect not in ("postgres", "mysql"):
            pytest.skip("ack_and_claim is ack_many, then a claim of its own, here")
        await Queue.bulk([dbx_own_hold.with_({"k": k}) for k in ("x1", "x2")])
        lost = await driver.reserve_many(["default"], 2, 0)
        stop = driver.hold_leases(lambda: lost)
        await _lapse()
        async with _another_worker(db_url, driver.table) as other:
            taken = await other.driver("db").reserve_many(["default"], 2, 0)
            assert len(taken) == 2
        real_done, arrived, both = driver._claims_done, [], asyncio.Event()

        async def barrier() -> None:
            arrived.append(1)
            if len(arrived) == 2:
                both.set()
            await asyncio.wait_for(both.wait(), 10)
            await real_done()

        driver._claims_done = barrier
        driver._lapsed_looks["default"] = time.time()  # two claims of ready rows
        try:
            results = await asyncio.wait_for(
                asyncio.gather(
                    driver.ack_and_claim([lost[0]], "default", 5),
                    driver.ack_and_claim([lost[1]], "default", 5),
                ),
                30,
            )
        finally:
            driver._claims_done = real_done
            stop()
        assert [owned for owned, _ in results] == [[False], [False]]
