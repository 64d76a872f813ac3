"""Batches under a SIGKILL storm: every batch's ``then`` and ``finally`` fire exactly once.

60 batches of 50 jobs go through 3 real ``haze queue:work`` processes (concurrency 16)
on PostgreSQL, Redis and SQLite, with the batch state in the same backend's shared
store. A random worker that is running jobs is SIGKILLed every 1 to 2 seconds and a
fresh one started. Jobs and callbacks append lines to an O_APPEND runs file
(``app/job/bst_jobs.py``); the test then checks that no job was lost, that each
callback ran from exactly one dispatched message (a redelivery of the same message,
after a kill before its ack, is at-least-once as for any job, and counted apart), and
that no batch is left with a pending counter or unfinished. One line of figures is
printed per backend. Bounded: about two minutes each.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib.util
import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from backend_procs import BackendProcs, backend_run
from haze import (
    Queue,
)
from services import require_server, throwaway_pg_database

pytestmark = [pytest.mark.slow, pytest.mark.storm, pytest.mark.timeout(300)]

APP = Path(__file__).parent
PG_ADMIN_URL = os.environ.get(
    "HAZE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("HAZE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

BATCHES, PER_BATCH, WORKERS, CONCURRENCY = 60, 50, 3, 16
#: Seconds a job sleeps: every backend runs the jobs so fast (PostgreSQL too, since the
#: batched claim and acks) that, with short jobs, the run would end after a handful of
#: kills.
JOB_SLEEP = {"postgres": (0.1, 0.4), "sqlite": (0.2, 0.8), "redis": (0.2, 0.8)}
#: Storm phase: the run stops killing after this long, and fails if not done by DEADLINE.
STORM_SECONDS, DEADLINE = 75.0, 150.0
#: Fewer kills than this and the run proves little.
MIN_KILLS = 5

_spec = importlib.util.spec_from_file_location(
    "bst_jobs_in_tests", APP / "app" / "job" / "bst_jobs.py"
)
assert _spec is not None and _spec.loader is not None
jobs_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jobs_module)
bst_member = jobs_module.bst_member
bst_callback = jobs_module.bst_callback


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    require_server("PostgreSQL", PG_ADMIN_URL)
    # Workers are killed here, never the server: only speed changes.
    with throwaway_pg_database(
        PG_ADMIN_URL, f"bst_{os.getpid()}", "synchronous_commit = off"
    ) as url:
        yield url


class Storm(BackendProcs):
    def __init__(self, tmp: Path, backend: str, url: str) -> None:
        super().__init__(
            tmp,
            APP,
            backend,
            url,
            name="bst",
            redis_url=REDIS_URL,
            db_options={"retry_after": "3s"},
            redis_options={"queues": ["default"], "retry_after": "3s"},
        )

    def start_worker(self) -> subprocess.Popen[bytes]:
        args = ["--concurrency", str(CONCURRENCY), "--sleep", "0.2"]
        return self.spawn(self.connection, "default", args, self.env("BST"))

    async def queued(self) -> int:
        driver = self.app.driver(self.connection)
        return int(await driver.size("default"))


def storm(tmp: Path, backend: str, url: str) -> contextlib.AbstractAsyncContextManager[Storm]:
    return backend_run(Storm(tmp, backend, url))


def _url(request: pytest.FixtureRequest, backend: str, tmp: Path) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp}/bst.db"
    if backend == "postgres":
        return str(request.getfixturevalue("pg_url"))
    require_server("Redis", REDIS_URL)
    return REDIS_URL


@pytest.mark.parametrize("backend", ["postgres", "redis", "sqlite"])
async def test_batch_callbacks_fire_once_under_sigkills(
    request: pytest.FixtureRequest,
    backend: str,
    tmp_path: Path,
    record_property: Any,
    capsys: Any,
) -> None:
    rng = random.Random(20261202)
    async with storm(tmp_path, backend, _url(request, backend, tmp_path)) as s:
        ids: list[str] = []
        for b in range(BATCHES):
            members = [
                bst_member.with_({"b": b, "j": j, "sleep": rng.uniform(*JOB_SLEEP[backend])})
                for j in range(PER_BATCH)
            ]
            batch = (
                await Queue.batch(members)
                .then(bst_callback.with_({"b": b, "kind": "then"}))
                .finally_(bst_callback.with_({"b": b, "kind": "finally"}))
                .dispatch()
            )
            ids.append(batch.id)
        members_all = {f"{b}.{j}" for b in range(BATCHES) for j in range(PER_BATCH)}

        def fired() -> dict[tuple[str, str], set[str]]:
            out: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
            for event, key, *_ in s.events():
                if event == "fire":
                    kind, b, message_id = key.split(".")
                    out[(kind, b)].add(message_id)
            return out

        def all_fired() -> bool:
            f = fired()
            return all(f.get((k, str(b))) for b in range(BATCHES) for k in ("then", "finally"))

        live = [s.start_worker() for _ in range(WORKERS)]
        for p in live:
            await s.wait_ready(p)
        started = time.monotonic()
        kills = 0
        next_kill = started + rng.uniform(1.0, 2.0)
        while True:
            ended = s.counts("end")
            if members_all <= set(ended) and all_fired():
                break
            now = time.monotonic()
            assert now - started < DEADLINE, (
                f"not done after {DEADLINE:.0f}s: {len(members_all - set(ended))} jobs unfinished, "
                f"{sum(1 for b in range(BATCHES) for k in ('then', 'finally') if not fired().get((k, str(b))))} "
                f"callbacks not fired; worker logs:\n" + "\n".join(s.log(p)[-3000:] for p in live)
            )
            for p in live:
                assert p.poll() is None, f"worker {p.pid} died on its own:\n{s.log(p)}"
            working = {pid for e, _, _, pid, _ in s.events() if e in ("start", "fire")}
            ready = [p for p in live if p.pid in working]
            if now - started < STORM_SECONDS and now >= next_kill and len(ready) >= 2:
                victim = ready[rng.randrange(len(ready))]
                live.remove(victim)
                victim.send_signal(signal.SIGKILL)
                await s.wait_exit(victim)
                kills += 1
                live.append(s.start_worker())
                # The first kills come faster: a backend that drains the run in ten
                # seconds (PostgreSQL with batched acks) still takes enough of them.
                pause = (0.5, 1.0) if kills < MIN_KILLS else (1.0, 2.0)
                next_kill = time.monotonic() + rng.uniform(*pause)
            await asyncio.sleep(0.2)
        elapsed = time.monotonic() - started

        # Jobs held by the last killed workers come back after retry_after (3 s): wait
        # for the queue to drain, so a late second fire would be seen.
        drain_until = time.monotonic() + 30
        while await s.queued() > 0:
            assert time.monotonic() < drain_until, f"{await s.queued()} jobs still queued"
            await asyncio.sleep(0.5)
        await asyncio.sleep(4)
        for p in live:
            await s.wait_ready(p)
            p.send_signal(signal.SIGTERM)
        codes = [await s.wait_exit(p) for p in live]

        starts, ends = s.counts("start"), s.counts("end")
        f = fired()
        fired_twice = sum(1 for v in f.values() if len(v) > 1)
        missed = sum(
            1 for b in range(BATCHES) for k in ("then", "finally") if not f.get((k, str(b)))
        )
        fire_runs = collections.Counter(
            (kind, b) for e, key, *_ in s.events() if e == "fire" for kind, b, _ in [key.split(".")]
        )
        states = [await Queue.find_batch(i) for i in ids]
        left = [
            (i, b.pending, b.processed, b.failed, b.finished)
            for i, b in zip(ids, states, strict=True)
            if b is None or b.pending != 0 or not b.finished or b.processed != PER_BATCH or b.failed
        ]
        data = {
            "backend": backend,
            "batches": BATCHES,
            "jobs": len(members_all),
            "workers": WORKERS,
            "concurrency": CONCURRENCY,
            "kills": kills,
            "seconds": round(elapsed, 1),
            "lost": len(members_all - set(ends)),
            "run_twice": sum(1 for n in starts.values() if n > 1),
            "callbacks_fired_twice": fired_twice,
            "callbacks_missed": missed,
            "callback_redeliveries": sum(fire_runs.values()) - sum(len(v) for v in f.values()),
            "batches_left_unfinished": len(left),
        }
        for k, v in data.items():
            record_property(k, v)
        (tmp_path / "batch_storm_report.json").write_text(json.dumps(data, indent=2))
        with capsys.disabled():
            print(f"\n[batch storm] {json.dumps(data)}")

        assert data["lost"] == 0, "no job is lost"
        assert fired_twice == 0 and missed == 0, f"then/finally fire once per batch: {data}"
        assert not left, f"batches left with a counter or unfinished: {left[:5]}"
        assert codes == [0] * WORKERS, "SIGTERM: clean exits"
        assert kills >= MIN_KILLS, f"the storm killed too few workers to mean anything: {data}"
