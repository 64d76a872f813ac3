"""A scheduler that dies between any two writes of a tick loses no tick and runs none
twice, on every store of the Store contract (memory, database on SQLite, PostgreSQL and
MariaDB, redis).

A "crash" is simulated as in ``test_batch_crash``: the store and the queue driver count
the scheduler's writes (store put/add/increment/delete, driver enqueue), and the k-th
write raises :class:`Crash` instead of happening, for every k. A ``BaseException`` so
that no handler in haze swallows it; after it every write of that scheduler raises too,
as nothing runs after a SIGKILL. A second scheduler, in the same process against the
same store and queue, then takes over once the dead one's leases expire (real time:
the stores' TTLs are real). The queue is a real memory driver drained by hand; only its
write methods are wrapped, to count.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from crash_points import Crash, CrashingStore, Injector
from haze import (
    App,
    JobContext,
    define_cache_config,
    define_job,
    define_queue_config,
    schedule,
)
from haze._orchestration import scheduling
from haze._orchestration.scheduling import Scheduler
from haze.stores import Store

# `store` is the Store contract's fixture (memory, database-*, redis).
from test_store_contract import store  # noqa: F401

#: tag -> ids of the tick messages whose handler ran.
RAN: collections.defaultdict[str, list[str]] = collections.defaultdict(list)
_tags = itertools.count()

#: Leader lease and tick claim of both schedulers: short, so a takeover takes ~1 s.
LEASE = 0.4


@define_job(name="scx_tick")
async def scx_tick(payload: dict[str, Any], job: JobContext) -> None:
    RAN[payload["tag"]].append(job.id)


@pytest.fixture(autouse=True)
def _clean_registry() -> Iterator[None]:
    saved = dict(scheduling._registry)
    yield
    scheduling._registry.clear()
    scheduling._registry.update(saved)


@dataclass
class Run:
    writes: int
    crashed: str | None
    ran: list[str]
    messages: int


async def _run(real: Store, crash_at: int | None) -> Run:
    tag = f"t{next(_tags)}-{time.time_ns()}"  # fresh tick keys on a persistent store
    injector = Injector(crash_at, stay_dead=True)
    app = App(
        queue=define_queue_config(default="main", connections={"main": {"driver": "memory"}}),
        cache=define_cache_config(default="crash", stores={"crash": {"driver": "memory"}}),
    )
    manager = app.manager
    # No in-process consumer: this test takes every message off the queue itself.
    manager.ensure_local_worker = lambda connection: None  # type: ignore[method-assign]
    sched = schedule(scx_tick.with_({"tag": tag}), every="1m", name=f"scx-{tag}")
    # Steady state: the schedule fired a minute ago, and its next tick is due.
    t0 = datetime.fromtimestamp(60 * (int(time.time()) // 60), UTC)
    await real.put(f"haze:schedule:{sched.name}:last", (t0 - timedelta(minutes=1)).timestamp())
    messages = 0
    async with app:
        app._stores["crash"] = CrashingStore(real, injector)  # type: ignore[assignment]
        driver = app.driver("main")
        for name in ("enqueue", "enqueue_many"):
            inner = getattr(driver, name)

            def counted(inner: Any = inner, name: str = name) -> Any:
                async def wrapper(*args: Any, **kw: Any) -> Any:
                    injector.tick(name)
                    return await inner(*args, **kw)

                return wrapper

            setattr(driver, name, counted())
        first = Scheduler(app, schedules=[sched], lease=LEASE)
        try:
            await first.step(t0 - timedelta(seconds=2))  # takes the leader lease
            assert first.leader, "a leader lease was left from an earlier run"
            await first.step(t0 + timedelta(seconds=0.5))  # the tick at t0
        except Crash:
            pass
        injector.armed = False  # the first scheduler is dead: never stepped again
        died = time.monotonic()
        second = Scheduler(app, schedules=[sched], lease=LEASE)
        deadline = died + 10 * LEASE
        while time.monotonic() < deadline:
            now = t0 + timedelta(seconds=0.5 + time.monotonic() - died)
            await second.step(now)
            if second.leader and second._cursors.get(sched.name, t0) > t0:
                break  # the tick at t0 is behind the new leader
            await asyncio.sleep(LEASE / 4)
        # The next run starts with no leader: the lease key is the same on every run.
        await real.delete("haze:schedule:leader", owner=second.id)
        while (reserved := driver.reserve_nowait()) is not None:
            messages += 1
            await manager.process(reserved, driver)
    return Run(injector.writes, injector.crashed, RAN[tag], messages)


@pytest.mark.storm
async def test_a_scheduler_dying_between_any_two_writes_runs_each_tick_once(
    store: Store,  # noqa: F811
) -> None:
    clean = await _run(store, None)
    assert clean.crashed is None
    assert len(clean.ran) == 1, clean
    n = clean.writes
    assert n >= 4, f"only {n} writes (leader lease, claim, dispatch, done): the counting is broken"
    problems = []
    sent_twice = 0
    for k in range(1, n + 1):
        run = await _run(store, k)
        assert run.crashed is not None, f"crash point {k} of {n} was never reached"
        sent_twice += run.messages > 1
        if len(run.ran) != 1:
            problems.append(
                f"crash at {run.crashed}: the tick ran {len(run.ran)} times "
                f"({run.messages} messages)"
            )
    assert not problems, f"{len(problems)} of {n} crash points went wrong:\n" + "\n".join(problems)
    # Dead after the dispatch, before marking the tick done: the next leader sends it
    # again, and the once key is what keeps it to one run.
    assert sent_twice >= 1, "no crash point sent a tick twice: the once key went untested"
