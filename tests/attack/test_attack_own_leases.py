"""Attacks on the promise of docs/guide.md (Leases), written from the docs only:

    "On ``database``, the worker's own claims never take a job back from itself: when its
    blocked loop let a running job's lease lapse and its next claim meets the job before
    any other worker does, the job stays with the run that holds it (under the new
    claim) and runs once."

and its counterpart: a job released for a retry still runs its next attempt, and no job
loses or gains a try. Async handlers block the whole event loop with ``time.sleep``
past ``retry_after`` while others await, fail with a tiny backoff, or fail every try;
the process runs one worker or two (one connection, one driver) at concurrency 1 or 20,
on SQLite, PostgreSQL and MariaDB. Every run records the attempt it was told; each job
must show attempts 1..n exactly once each, a job failing every try exactly ``tries`` runs
and one failed record, no row left, and no lease lost (only this process claims).
"""

from __future__ import annotations

import asyncio
import collections
import random
import time
from typing import Any

import pytest
from atk_harness import db_app
from haze import Queue, define_job
from haze._workers.worker import Worker

pytestmark = [pytest.mark.timeout(150), pytest.mark.slow, pytest.mark.storm]

LEASE = 1.0
TRIES = 3
#: job key -> the attempts its runs were told, in run order
RUNS: collections.defaultdict[str, list[int]] = collections.defaultdict(list)
LIVE: collections.Counter[str] = collections.Counter()


@define_job(name="attack5_lease_storm", tries=TRIES, backoff=0.01)
async def attack5_lease_storm(payload: dict[str, Any], job: Any) -> None:
    key = payload["k"]
    RUNS[key].append(job.attempt)
    LIVE[key] += 1
    try:
        assert LIVE[key] == 1, f"{key} runs twice at once"
        await asyncio.sleep(payload["wait"])
        if payload["block"] and job.attempt <= payload["block"]:
            time.sleep(1.4 * LEASE)  # noqa: ASYNC251 - the whole loop: no heartbeat renews anything
        if job.attempt <= payload["fail"]:
            raise RuntimeError(f"{key} fails attempt {job.attempt}")
    finally:
        LIVE[key] -= 1


def _jobs(n: int, seed: int) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    jobs = []
    for i in range(n):
        jobs.append(
            {
                "k": f"j{i}",
                "wait": rnd.choice([0, 0.05, 0.3, 1.2 * LEASE]),
                # block on attempt 1 (or on 1 and 2): a job that fails while blocked too
                "block": rnd.choice([0, 0, 0, 1, 2]) if i % 4 == 0 else 0,
                "fail": rnd.choice([0, 0, 1, 2, TRIES]),
            }
        )
    return jobs


# Concurrency 20, the harsher of the cases explored (1 or 20), with one Worker or two on
# one app (one driver). Two once ran 4 of 60 jobs again after their success on SQLite (an
# ack that met a claim of the same driver still adopting the row), and skipped attempts
# (a retry crossing the adoption; a claim taking over another claim's rows not yet
# handed out): tests/database/test_own_lapsed_claims.py pins each of those.
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("concurrency", [20])
async def test_blocked_loops_run_no_job_twice_and_count_every_try(
    sql_url: str, workers: int, concurrency: int
) -> None:
    RUNS.clear()
    LIVE.clear()
    payloads = _jobs(24 if concurrency == 1 else 60, seed=concurrency * 10 + workers)
    async with db_app(sql_url, retry_after=LEASE) as app:
        await Queue.bulk([attack5_lease_storm.with_(p) for p in payloads])
        pool = [
            Worker(app, "db", ["default"], concurrency, sleep=0.02, max_sleep=0.05)
            for _ in range(workers)
        ]
        for w in pool:
            w.start()
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 110
            expected = {p["k"]: min(p["fail"], TRIES - 1) + 1 for p in payloads}
            while sum(map(len, RUNS.values())) < sum(expected.values()) or any(
                w.running for w in pool
            ):
                assert loop.time() < deadline, (
                    "the storm did not finish",
                    {k: RUNS[k] for k in expected if len(RUNS[k]) != expected[k]},
                    [(w.running, [j.token for j in w.running_jobs()]) for w in pool],
                )
                await asyncio.sleep(0.05)
            await asyncio.sleep(3 * LEASE)  # any row a lapsed lease would hand out again
        finally:
            for w in pool:
                await w.stop()
        runs = {k: RUNS[k] for k in expected}
        wrong = {k: r for k, r in runs.items() if r != list(range(1, expected[k] + 1))}
        assert wrong == {}, "a job ran twice, lost a try or skipped one"
        failed = sorted(f.payload["k"] for f in await Queue.failed())
        assert failed == sorted(p["k"] for p in payloads if p["fail"] >= TRIES)
        assert await Queue.size() == 0
        assert sum(w.leases_lost for w in pool) == 0


async def test_a_retry_that_crossed_its_own_next_claim_is_recorded(sql_url: str) -> None:
    """The storm above (SQLite, one worker, concurrency 1) logged "its retry was not
    recorded, because this worker no longer owned the job ... another worker took it
    over" and counted ``leases_lost`` twice, with no other worker anywhere: the run's
    lease lapsed while the loop was blocked, its retry noted the claim as released, and a
    claim of the same driver took the lapsed row (the next attempt, rightly) before the
    retry's UPDATE reached it. The retry found 0 rows and called that a lost lease. The
    next attempt is this process's own claim: the retry is done, not lost. The claim is
    injected right before the retry's statement (a wrapper of the connector's
    ``execute``): real servers cannot order the two on cue."""
    async with db_app(sql_url, retry_after=LEASE) as app:
        driver: Any = app.driver("db")
        await attack5_lease_storm.dispatch({"k": "x", "wait": 0, "block": 0, "fail": 1})
        [job] = await driver.reserve_many(["default"], 1, 0)
        stop = driver.hold_leases(lambda: [job])
        db, real_execute = app.database(), app.database().execute
        crossed: list[Any] = []

        async def execute(sql: str, params: Any = ()) -> int:
            if sql == driver.sql["retry"] and not crossed:
                crossed.append(await driver.reserve_many(["default"], 5, 0))
            return await real_execute(sql, params)

        try:
            await asyncio.sleep(LEASE * 1.3)  # lapsed, and past the look for lapsed rows
            db.execute = execute
            try:
                assert await driver.release(job, 0.01, consume_attempt=True) is True
            finally:
                db.execute = real_execute
        finally:
            stop()
        [[again]] = crossed
        assert again.token[0] == job.token[0] and again.attempt == 2
        assert await driver.ack(again) is True
        assert await Queue.size() == 0
