"""Attacks on delayed jobs on SQLite, PostgreSQL and MariaDB: claims with many rows not
due yet, tenant groups, cancels, two workers; and the delay's own limits."""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

import pytest
from atk_harness import db_app, drain, memory_app
from haze import DelayTooLongError, JobContext, Queue, define_job
from haze._workers.worker import Worker

pytestmark = pytest.mark.timeout(120)

RAN: list[Any] = []


@pytest.fixture(autouse=True)
def _clear() -> None:
    RAN.clear()


@define_job(name="attack3_delayed")
async def delayed(payload: Any, job: JobContext) -> None:
    RAN.append(payload["n"])


async def test_due_jobs_are_claimed_past_thousands_not_due(sql_url: str) -> None:
    """configuration.md, Claims: "It reads them from an index that starts at the due rows,
    so a table full of jobs delayed for later costs a claim nothing"; guide.md, Limits:
    a delay of at most 365 days. Held up on each dialect: with 2,000 jobs an hour away in
    50 groups (and two a year away), the five due jobs (grouped and not) run, no job not
    due runs, and `Queue.size` still counts every delayed one."""
    async with db_app(sql_url) as app:
        await Queue.bulk(
            [
                delayed.with_({"n": f"late{i}"}).in_group(f"t{i % 50}").delay(3600)
                for i in range(2000)
            ]
        )
        await delayed.dispatch({"n": "year"}, delay="365d")
        await delayed.with_({"n": "year-g"}).in_group("t1").delay(31536000).dispatch()
        for i in range(3):
            await delayed.with_({"n": f"due{i}"}).in_group(f"t{i}").dispatch()
        await delayed.dispatch({"n": "due-plain"})
        await delayed.dispatch({"n": "due-tiny"}, delay=1e-9)
        await drain(app, concurrency=4)
        assert sorted(RAN) == ["due-plain", "due-tiny", "due0", "due1", "due2"]
        assert await Queue.size() == 2002


async def test_due_order_and_a_groups_delayed_head(sql_url: str) -> None:
    """configuration.md: "A claim takes rows in due order: the one that became due first
    ..., and among rows due at the same moment the one queued first"; guide.md, Tenant
    groups: "each group's next job before any group's job after it". Held up: a job that
    came due before a later immediate one runs first; a group whose first job is delayed
    an hour still has its due job run in turn, and the delayed one does not run."""
    async with db_app(sql_url) as app:
        await delayed.dispatch({"n": "came due first"}, delay=0.3)
        await asyncio.sleep(0.8)
        await delayed.dispatch({"n": "dispatched later"})
        await drain(app)
        assert RAN == ["came due first", "dispatched later"]
        RAN.clear()
        await delayed.with_({"n": "g-in-an-hour"}).in_group("g").delay(3600).dispatch()
        await delayed.with_({"n": "g-now"}).in_group("g").dispatch()
        for i in range(4):
            await delayed.with_({"n": f"h{i}"}).in_group("h").dispatch()
        await drain(app)
        assert sorted(RAN) == ["g-now", "h0", "h1", "h2", "h3"]
        assert RAN.index("g-now") <= 1  # in turn, not behind every h job
        assert await Queue.size() == 1


@define_job(name="attack3_delayed_tracked", track=True)
async def delayed_tracked(payload: Any, job: JobContext) -> None:
    RAN.append(payload["n"])


async def test_a_cancelled_delayed_job_never_runs(sql_url: str) -> None:
    """guide.md, Cancelling jobs: "A queued or delayed job never runs: when a worker
    receives it, it acknowledges it unrun (a tracked one is marked `cancelled` at once)."
    Held up on each dialect, with the cancel marker in the database store."""
    async with db_app(sql_url) as app:
        victim = await delayed_tracked.dispatch({"n": "cancelled"}, delay=0.3)
        await delayed_tracked.dispatch({"n": "kept"}, delay=0.3)
        assert await Queue.cancel(victim) is True
        await asyncio.sleep(0.8)
        await drain(app)
        assert RAN == ["kept"]
        status = await Queue.status(victim)
        assert status is not None and status.state == "cancelled"


ACTIVE: collections.Counter[str] = collections.Counter()
PEAK: collections.Counter[str] = collections.Counter()
RUNS: collections.Counter[int] = collections.Counter()
EARLY: list[int] = []


@define_job(name="attack3_delayed_grouped")
async def delayed_grouped(payload: Any, job: JobContext) -> None:
    if time.time() < payload["due"] - 0.05:
        EARLY.append(payload["n"])
    group = payload["g"]
    ACTIVE[group] += 1
    PEAK[group] = max(PEAK[group], ACTIVE[group])
    await asyncio.sleep(0.01)
    ACTIVE[group] -= 1
    RUNS[payload["n"]] += 1


async def test_delayed_grouped_jobs_with_a_group_limit_and_two_workers(sql_url: str) -> None:
    """guide.md, Tenant groups: `concurrency` "is the most jobs of one group running at
    once, across every worker"; a delayed job runs once, not before its time. Held up on
    each dialect: 120 jobs in 8 groups, delayed 0 to 1.5 s (a sixth of them an hour),
    bulk and single dispatches mixed, two workers of 4 slots with a group limit of 1: each
    due job ran once, none early, none of a group beside another of its group, and the
    hour-away ones wait."""
    for c in (ACTIVE, PEAK, RUNS):
        c.clear()
    EARLY.clear()
    async with db_app(sql_url, groups={"concurrency": 1}) as app:
        now = time.time()
        delays = [0, 0.5, 1.0, 1.5, 3600, 0.25]
        pending = [
            delayed_grouped.with_({"n": n, "g": f"g{n % 8}", "due": now + delays[n % 6]})
            .in_group(f"g{n % 8}")
            .delay(delays[n % 6])
            for n in range(120)
        ]
        await Queue.bulk(pending[:60])
        for p in pending[60:]:
            await p.dispatch()
        due = {n for n in range(120) if delays[n % 6] < 10}
        workers = [Worker(app, "db", ["default"], 4, sleep=0.05, max_sleep=0.2) for _ in range(2)]
        for w in workers:
            w.start()
        try:
            deadline = time.monotonic() + 60
            while set(RUNS) != due and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        finally:
            for w in workers:
                await w.stop()
        assert set(RUNS) == due
        assert max(RUNS.values()) == 1
        assert EARLY == []
        assert max(PEAK.values()) == 1
        assert await Queue.size() == 120 - len(due)


async def test_a_huge_integer_delay_is_too_long() -> None:
    """guide.md, Limits: "Delays are finite and at most 365 days. Longer raises
    `DelayTooLongError`; `inf`, `nan` or a negative delay raises `ValueError`."

    ``delay=10**400`` (an int: finite, positive, longer than 365 days) raises
    ``ValueError: delay: duration must be a finite number >= 0, got 1000…`` -- the message
    for inf and nan, and not a DelayTooLongError; ``delay="9…9s"`` (400 digits) the same.
    (``10**20`` is a DelayTooLongError as it should be.) Low severity."""
    async with memory_app():
        with pytest.raises(DelayTooLongError):
            await delayed.dispatch({"n": 1}, delay=10**400)


@define_job(name="attack3_delayed_lapsed", tries=3)
async def lapsed(payload: Any, job: JobContext) -> None:
    RAN.append((payload["n"], job.attempt))


async def test_a_dead_workers_jobs_are_taken_over_past_rows_not_due(sql_url: str) -> None:
    """configuration.md, Claims: a claim takes due rows "together with rows whose worker
    died (their lease ran out)"; `retry_after`: "a claimed job whose worker stopped
    renewing it is claimed again after this". Held up on each dialect: two jobs claimed
    by a worker that then vanished (one in a group), behind 2,000 rows an hour away, are
    claimed again once `retry_after` passed (attempt 2), and the group's next job runs."""
    async with db_app(sql_url, retry_after=1) as app:
        await lapsed.with_({"n": "dead-g"}).in_group("g").dispatch()
        await lapsed.dispatch({"n": "dead"})
        driver: Any = app.driver("db")
        assert await driver.reserve(["default"], 0) is not None  # the worker that dies
        assert await driver.reserve(["default"], 0) is not None
        await Queue.bulk(
            [
                lapsed.with_({"n": f"late{i}"}).in_group(f"t{i % 20}").delay(3600)
                for i in range(2000)
            ]
        )
        await lapsed.with_({"n": "g-next"}).in_group("g").dispatch()
        await asyncio.sleep(2.5)  # past retry_after (1 s) and its check interval
        await drain(app, concurrency=2)
        assert sorted(RAN) == [("dead", 2), ("dead-g", 2), ("g-next", 1)]
        assert await Queue.size() == 2000
