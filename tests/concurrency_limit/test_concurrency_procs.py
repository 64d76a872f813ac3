"""Global concurrency limits across real worker processes, with SIGKILLs.

Three ``haze queue:work`` processes (concurrency 8 each: 24 consumers) run jobs limited
to 3 at once, on PostgreSQL and on Redis, with the slots in the same backend's shared
store. The limit comes from ``limit_concurrency(3, "cls-storm")`` on the job, or (the
``queue`` runs) from the connection's ``"queues": {"limited": {"concurrency": 3}}``, or
(the ``group`` runs: every job in group "tenant-1") from its ``"groups": {"concurrency":
3}``.

The jobs measure it themselves: each appends ``start`` once it holds a slot and ``end``
before giving it back to an O_APPEND file (``app/job/cls_jobs.py``). Every few seconds a
worker that is running a job is SIGKILLed and a fresh one started; its slot stays taken
until its lease (``expire_after`` 6 s) runs out. A run that was killed counts as running
until the moment its process was seen dead. The test checks that no more than 3 ever
overlapped, that 3 did (the limit is not stricter than asked), that no job was lost, and
that no slot is left taken at the end. Bounded: about a minute per run.
"""

from __future__ import annotations

import asyncio
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
from services import require_server, throwaway_pg_database

pytestmark = [pytest.mark.slow, pytest.mark.storm, pytest.mark.timeout(240)]

APP = Path(__file__).parent
PG_ADMIN_URL = os.environ.get(
    "HAZE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("HAZE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

JOBS, WORKERS, CONCURRENCY, MAX = 120, 3, 8, 3
GROUP = "tenant-1"
JOB_SLEEP = (0.2, 0.5)
EXPIRE_AFTER = 6.0
#: Kills happen during the first STORM_SECONDS; the run fails if not done by DEADLINE.
STORM_SECONDS, DEADLINE = 35.0, 120.0

_spec = importlib.util.spec_from_file_location(
    "cls_jobs_in_tests", APP / "app" / "job" / "cls_jobs.py"
)
assert _spec is not None and _spec.loader is not None
jobs_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jobs_module)
cls_limited = jobs_module.cls_limited
cls_plain = jobs_module.cls_plain


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    require_server("PostgreSQL", PG_ADMIN_URL)
    with throwaway_pg_database(PG_ADMIN_URL, f"cls_{os.getpid()}") as url:
        yield url


class Run(BackendProcs):
    def __init__(self, tmp: Path, backend: str, url: str, queue: str) -> None:
        limited = {"concurrency": MAX, "expire_after": EXPIRE_AFTER}
        queues = {"queues": {"default": {}, "limited": limited}}
        super().__init__(
            tmp,
            APP,
            backend,
            url,
            name="cls",
            redis_url=REDIS_URL,
            db_options=queues,
            redis_options=queues,
        )
        self.queue = queue

    def start_worker(self) -> subprocess.Popen[bytes]:
        args = ["--concurrency", str(CONCURRENCY), "--sleep", "0.2", "--quiet"]
        env = self.env("CLS", MAX=str(MAX), QUEUE_LIMIT=str(MAX), EXPIRE_AFTER=f"{EXPIRE_AFTER:g}s")
        queue = "default" if self.queue == "group" else self.queue
        return self.spawn(self.connection, queue, args, env)

    def slot_keys(self) -> list[str]:
        base = {
            "default": "haze:mw:conc:name:cls-storm",
            "limited": f"haze:mw:conc:queue:{self.connection}:limited",
            "group": f"haze:mw:group:{self.connection}:{GROUP}",
        }[self.queue]
        return [f"{base}:slot:{i}" for i in range(MAX)]


def limited_run(
    tmp: Path, backend: str, url: str, queue: str
) -> contextlib.AbstractAsyncContextManager[Run]:
    return backend_run(Run(tmp, backend, url, queue))


def max_overlap(
    events: list[tuple[str, str, int, int, float]], killed_at: dict[int, float]
) -> tuple[int, list[str]]:
    """The most runs holding a slot at one instant, and the runs that had no end.

    A run is ``start`` to its ``end`` in the same process; a run whose process was
    killed first ends when the test saw that process dead (later than it really ended:
    this can only overcount)."""
    open_runs: dict[tuple[str, int], float] = {}
    points: list[tuple[float, int]] = []
    for event, key, _attempt, pid, at in events:
        if event == "start":
            open_runs[(key, pid)] = at
            points.append((at, +1))
        elif event == "end":
            open_runs.pop((key, pid))
            points.append((at, -1))
    unended = []
    for (key, pid), _at in open_runs.items():
        if pid in killed_at:
            points.append((killed_at[pid], -1))
        else:
            unended.append(key)
    # At one instant an end comes first: a slot is given back before another takes it.
    points.sort(key=lambda p: (p[0], p[1]))
    running = peak = 0
    for _, step in points:
        running += step
        peak = max(peak, running)
    return peak, unended


def _url(request: pytest.FixtureRequest, backend: str) -> str:
    if backend == "postgres":
        return str(request.getfixturevalue("pg_url"))
    require_server("Redis", REDIS_URL)
    return REDIS_URL


@pytest.mark.parametrize(
    ("backend", "queue"),
    [
        ("postgres", "default"),
        ("redis", "default"),
        ("redis", "limited"),
        ("postgres", "limited"),
        ("postgres", "group"),
        ("redis", "group"),
    ],
    ids=[
        "postgres-middleware",
        "redis-middleware",
        "redis-queue-config",
        "postgres-queue-config",
        "postgres-group-config",
        "redis-group-config",
    ],
)
async def test_never_more_than_max_run_at_once_under_sigkills(
    request: pytest.FixtureRequest,
    backend: str,
    queue: str,
    tmp_path: Path,
    record_property: Any,
) -> None:
    rng = random.Random(20261202)
    async with limited_run(tmp_path, backend, _url(request, backend), queue) as r:
        job = cls_limited if queue == "default" else cls_plain
        for i in range(JOBS):
            pending = job.with_({"k": f"j{i}", "sleep": rng.uniform(*JOB_SLEEP)})
            if queue == "group":
                pending.in_group(GROUP)
            else:
                pending.on_queue(queue)
            await pending.dispatch()
        keys = {f"j{i}" for i in range(JOBS)}

        live = [r.start_worker() for _ in range(WORKERS)]
        for p in live:
            await r.wait_ready(p)
        started = time.monotonic()
        kills = 0
        killed_at: dict[int, float] = {}
        next_kill = started + rng.uniform(3.0, 5.0)
        while not keys <= set(r.counts("end")):
            now = time.monotonic()
            assert now - started < DEADLINE, (
                f"not done after {DEADLINE:.0f}s: {len(keys - set(r.counts('end')))} jobs "
                "unfinished; worker logs:\n" + "\n".join(r.log(p)[-3000:] for p in live)
            )
            for p in live:
                assert p.poll() is None, f"worker {p.pid} died on its own:\n{r.log(p)}"
            if now - started < STORM_SECONDS and now >= next_kill:
                # A victim in the middle of a job: its slot is held by a dead process.
                ended = {(k, pid) for e, k, _, pid, _ in r.events() if e == "end"}
                holding = {
                    pid for e, k, _, pid, _ in r.events() if e == "start" and (k, pid) not in ended
                }
                victims = [p for p in live if p.pid in holding]
                if victims:
                    victim = victims[rng.randrange(len(victims))]
                    live.remove(victim)
                    victim.send_signal(signal.SIGKILL)
                    await r.wait_exit(victim)
                    killed_at[victim.pid] = time.time()
                    kills += 1
                    live.append(r.start_worker())
                    next_kill = time.monotonic() + rng.uniform(3.0, 5.0)
            await asyncio.sleep(0.1)
        elapsed = time.monotonic() - started

        for p in live:
            await r.wait_ready(p)  # a SIGTERM before its handlers are in would just kill it
            p.send_signal(signal.SIGTERM)
        codes = [await r.wait_exit(p) for p in live]

        events = r.events()
        peak, unended = max_overlap(events, killed_at)
        # The slots of the last killed holders expire within EXPIRE_AFTER; every other
        # slot was given back by its run.
        await asyncio.sleep(EXPIRE_AFTER + 0.5)
        left = [v for v in await r.app.queue_store.get_many(r.slot_keys()) if v is not None]
        starts = r.counts("start")
        data = {
            "backend": backend,
            "limit_from": {"default": "middleware", "limited": "queue config"}.get(
                queue, "group config"
            ),
            "jobs": JOBS,
            "workers": WORKERS,
            "concurrency": CONCURRENCY,
            "max": MAX,
            "kills": kills,
            "seconds": round(elapsed, 1),
            "peak_running": peak,
            "lost": len(keys - set(r.counts("end"))),
            "runs_cut_by_kills": sum(n - 1 for n in starts.values()),
            "slots_left": len(left),
        }
        for k, v in data.items():
            record_property(k, v)
        (tmp_path / "concurrency_report.json").write_text(json.dumps(data, indent=2))
        print(json.dumps(data))

        assert kills >= 3, "the run must include SIGKILLs of workers holding slots"
        assert peak <= MAX, f"{peak} jobs ran at once; the limit is {MAX}"
        assert peak == MAX, f"only {peak} ran at once: the limit is stricter than {MAX}"
        assert not unended, f"runs with no end in a process that was not killed: {unended}"
        assert data["lost"] == 0
        assert left == [], f"slots still taken after every run ended: {left}"
        assert codes == [0] * len(codes), [r.log(p) for p in live]
