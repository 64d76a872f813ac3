"""A worker that dies between any two writes of a batch loses no callback (then, catch,
finally, and each job's progress) and runs none twice, and leaves no counter behind, on every store of the Store contract (memory, database on SQLite,
PostgreSQL and MariaDB, redis).

A "crash" is simulated deterministically: the batch store and the queue driver count
their writes (store put/add/increment/delete/settle_batch_job, driver enqueue/ack/fail/
release), and the k-th write raises :class:`Crash` instead of happening, for every k.
A ``BaseException`` so that no handler in haze swallows it, as nothing runs after a
SIGKILL. The message being processed is then redelivered (the same body, the next
attempt) unless its ack/fail had already happened, as a real driver does after
``retry_after``. Jobs run by hand here (no in-process worker) so the order is fixed.
The queue is a real memory driver; only its write methods are wrapped, to count.
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from crash_points import Crash, CrashingStore, Injector
from haze import App, JobContext, Queue, define_cache_config, define_job, define_queue_config
from haze._base.message import decode
from haze.drivers import Reserved
from haze.stores import Store

# `store` is the Store contract's fixture (memory, database-*, redis).
from test_store_contract import store  # noqa: F401

#: (tag, kind) -> ids of the callback messages that ran. A redelivery of one message (its
#: worker died after the handler, before the ack) is the same id: at-least-once, as for
#: any job. A second id would be a second dispatch that ran: a callback fired twice.
FIRED: collections.defaultdict[tuple[str, str], set[str]] = collections.defaultdict(set)
_tags = itertools.count()


@define_job(name="bcx_work", tries=3)
async def bcx_work(payload: dict[str, Any], job: JobContext) -> None:
    return None


@define_job(name="bcx_fail", tries=1)
async def bcx_fail(payload: dict[str, Any], job: JobContext) -> None:
    raise RuntimeError("bcx_fail fails")


@define_job(name="bcx_callback", tries=3)
async def bcx_callback(payload: dict[str, Any], job: JobContext) -> None:
    FIRED[(payload["tag"], payload["kind"])].add(job.id)


@dataclass
class Run:
    tag: str
    writes: int
    crashed: str | None
    batch: Any
    fired: dict[str, int]
    failed_jobs: int


async def _run(real: Store, scenario: str, crash_at: int | None) -> Run:
    tag = f"t{next(_tags)}"
    injector = Injector(None)
    app = App(
        queue=define_queue_config(
            default="main", connections={"main": {"driver": "memory"}}, batches={"store": "crash"}
        ),
        cache=define_cache_config(default="crash", stores={"crash": {"driver": "memory"}}),
    )
    manager = app.manager
    # No in-process consumer: this test takes every message off the queue itself.
    manager.ensure_local_worker = lambda connection: None  # type: ignore[method-assign]
    async with app:
        app._stores["crash"] = CrashingStore(real, injector)  # type: ignore[assignment]
        driver = app.driver("main")
        terminal: list[Any] = []  # Reserved objects acked/failed/released (ids get reused)

        def counted(name: str, terminal_op: bool) -> None:
            real = getattr(driver, name)

            async def wrapper(*args: Any, **kw: Any) -> Any:
                injector.tick(name)
                result = await real(*args, **kw)
                if terminal_op:
                    terminal.append(args[0])
                return result

            setattr(driver, name, wrapper)

        for name in ("enqueue", "enqueue_many"):
            counted(name, False)
        for name in ("ack", "fail", "release"):
            counted(name, True)

        def cb(kind: str) -> Any:
            return bcx_callback.with_({"tag": tag, "kind": kind})

        second = bcx_fail if scenario == "fail" else bcx_work
        items = [bcx_work.with_({"i": 1}), [second.with_({"i": 2}), bcx_work.with_({"i": 3})]]
        items.append(bcx_work.with_({"i": 4}))
        pending = Queue.batch(items).then(cb("then")).catch(cb("catch")).finally_(cb("finally"))
        pending = pending.progress(cb("progress"))
        batch = await pending.dispatch()
        base = injector.writes
        injector.crash_at = None if crash_at is None else base + crash_at
        # Every message until the queue is empty; one that crashed is delivered again.
        while (reserved := driver.reserve_nowait()) is not None:
            try:
                await manager.process(reserved, driver)
            except Crash:
                if not any(r is reserved for r in terminal):
                    again = Reserved(
                        decode(reserved.body), reserved.attempt + 1, reserved.body, "default"
                    )
                    await manager.process(again, driver)
        state = await Queue.find_batch(batch.id)
        failed = len(await Queue.failed("main"))
        writes = injector.writes - base
    fired = {k: len(FIRED[(tag, k)]) for k in ("then", "catch", "finally", "progress")}
    return Run(tag, writes, injector.crashed, state, fired, failed)


#: progress runs once for each job that ends done (in "fail" only bcx_work 1: the failure
#: cancels the batch, so 3 and 4 are skipped).
EXPECT = {
    "ok": {
        "fired": {"then": 1, "catch": 0, "finally": 1, "progress": 4},
        "processed": 4,
        "failed": 0,
    },
    "fail": {
        "fired": {"then": 0, "catch": 1, "finally": 1, "progress": 1},
        "processed": 3,
        "failed": 1,
    },
}


@pytest.mark.storm
@pytest.mark.parametrize("scenario", ["ok", "fail"])
async def test_a_crash_between_any_two_writes_loses_no_callback(
    store: Store,  # noqa: F811
    scenario: str,
    tmp_path: Path,
) -> None:
    expect = EXPECT[scenario]
    clean = await _run(store, scenario, None)
    assert clean.crashed is None
    assert clean.fired == expect["fired"]
    n = clean.writes
    assert n >= 10, f"only {n} writes after dispatch: the counting is broken"
    problems = []
    for k in range(1, n + 1):
        run = await _run(store, scenario, k)
        assert run.crashed is not None, f"crash point {k} of {n} was never reached"
        b = run.batch
        got = {
            "fired": run.fired,
            "pending": b.pending,
            "processed": b.processed,
            "failed": b.failed,
            "finished": b.finished,
        }
        want = {
            "fired": expect["fired"],
            "pending": 0,
            "processed": expect["processed"],
            "failed": expect["failed"],
            "finished": True,
        }
        if got != want:
            problems.append(f"crash at {run.crashed}: {got}")
    assert not problems, f"{len(problems)} of {n} crash points went wrong:\n" + "\n".join(problems)
