"""A worker that dies between any two writes of a long chain (its tail stored in the
batches store) loses no link: every link runs, in order, the chain ends, and its stored
links are deleted, on every store of the Store contract (memory, database on SQLite,
PostgreSQL and MariaDB, redis).

As in test_batch_crash.py: the batches store and the queue driver count their writes,
and the k-th write raises :class:`Crash` instead of happening, for every k; the message
being processed is then redelivered unless its ack/fail had happened. A redelivered
link that had dispatched its next link dispatches it again (chains are at-least-once),
so a link may run twice; what must hold is that none is skipped and the order holds.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import pytest
from crash_points import Crash, CrashingStore, Injector
from haze import App, JobContext, Queue, define_cache_config, define_job, define_queue_config
from haze._base.message import decode
from haze.drivers import Reserved
from haze.stores import Store

# `store` is the Store contract's fixture (memory, database-*, redis).
from test_store_contract import store  # noqa: F401

#: Links of the chain: with 800-character payloads, 30 links are 3 stored chunks after
#: the one carried inline.
LINKS = 30
RAN: dict[str, list[int]] = {}
TAILS: dict[str, set[str]] = {}
_tags = itertools.count()


@define_job(name="ccx_link", tries=3)
async def ccx_link(payload: dict[str, Any], job: JobContext) -> None:
    RAN.setdefault(payload["tag"], []).append(payload["n"])
    if payload["n"] == 0 and job.message is not None:
        tails = [link["tail"] for link in job.message.chain or [] if "tail" in link]
        TAILS.setdefault(payload["tag"], set()).update(tails)


def _app() -> App:
    return App(
        queue=define_queue_config(
            default="main", connections={"main": {"driver": "memory"}}, batches={"store": "crash"}
        ),
        cache=define_cache_config(default="crash", stores={"crash": {"driver": "memory"}}),
    )


async def _run(real: Store, crash_at: int | None) -> tuple[str, int, str | None, list[str]]:
    """The chain's tag, the writes counted after dispatch, the crash, the tail ids."""
    tag = f"t{next(_tags)}"
    injector = Injector(None)
    app = _app()
    manager = app.manager
    manager.ensure_local_worker = lambda connection: None  # type: ignore[method-assign]
    async with app:
        app._stores["crash"] = CrashingStore(real, injector)  # type: ignore[assignment]
        driver = app.driver("main")
        terminal: list[Any] = []

        def counted(name: str, terminal_op: bool) -> None:
            inner = getattr(driver, name)

            async def wrapper(*args: Any, **kw: Any) -> Any:
                injector.tick(name)
                result = await inner(*args, **kw)
                if terminal_op:
                    terminal.append(args[0])
                return result

            setattr(driver, name, wrapper)

        for name in ("enqueue", "enqueue_many"):
            counted(name, False)
        for name in ("ack", "fail", "release"):
            counted(name, True)
        links = [ccx_link.with_({"tag": tag, "n": i, "pad": "x" * 800}) for i in range(LINKS)]
        await Queue.chain(links).dispatch()
        base = injector.writes
        injector.crash_at = None if crash_at is None else base + crash_at
        while (reserved := driver.reserve_nowait()) is not None:
            try:
                await manager.process(reserved, driver)
            except Crash:
                if not any(r is reserved for r in terminal):
                    again = Reserved(
                        decode(reserved.body), reserved.attempt + 1, reserved.body, "default"
                    )
                    await manager.process(again, driver)
        writes = injector.writes - base
        tails = TAILS.get(tag, set())
        keys = [f"haze:chain:{t}:{n}" for t in tails for n in range(1, 8)]
        left = [k for k, v in zip(keys, await real.get_many(keys), strict=True) if v is not None]
    return tag, writes, injector.crashed, [*sorted(tails), *left]


def _in_order(ran: list[int]) -> bool:
    """Every link ran, and each one's first run came after the previous link's."""
    firsts = [ran.index(n) for n in range(LINKS)] if set(ran) == set(range(LINKS)) else None
    return firsts is not None and firsts == sorted(firsts)


@pytest.mark.storm
async def test_a_crash_between_any_two_writes_loses_no_link(
    store: Store,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    tag, n, crashed, state = await _run(store, None)
    assert crashed is None and RAN[tag] == list(range(LINKS))
    assert len(state) == 1, f"one stored tail, deleted at the end: {state}"
    assert n >= 2 * LINKS, f"only {n} writes after dispatch: the counting is broken"
    problems = []
    for k in range(1, n + 1):
        tag, _, crashed, state = await _run(store, k)
        assert crashed is not None, f"crash point {k} of {n} was never reached"
        if not _in_order(RAN.get(tag, [])) or len(state) != 1:
            problems.append(f"crash at {crashed}: ran {RAN.get(tag)}, tail and keys {state}")
    # A redelivered link that finds its tail ended by the chain it had already
    # continued does nothing: no lost-tail error.
    lost = [r for r in caplog.records if "ChainTailLostError" in str(r.exc_info)]
    assert not lost, lost[0].exc_info
    assert not problems, f"{len(problems)} of {n} crash points went wrong:\n" + "\n".join(problems)


async def test_a_tail_that_expired_is_a_loud_error(
    store: Store,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    tag = f"t{next(_tags)}"
    app = _app()
    app.manager.ensure_local_worker = lambda connection: None  # type: ignore[method-assign]
    async with app:
        app._stores["crash"] = store  # type: ignore[assignment]
        driver = app.driver("main")
        links = [ccx_link.with_({"tag": tag, "n": i, "pad": "x" * 800}) for i in range(LINKS)]
        await Queue.chain(links).dispatch()
        with caplog.at_level(logging.ERROR, logger="haze"):
            while (reserved := driver.reserve_nowait()) is not None:
                await app.manager.process(reserved, driver)
                for tail in TAILS.pop(tag, ()):  # as if batches.ttl had run out
                    for k in range(1, 8):
                        await store.delete(f"haze:chain:{tail}:{k}")
                    lost = f"haze:chain:{tail}:1"
    assert 0 < len(RAN[tag]) < LINKS
    assert any("ChainTailLostError" in r.getMessage() + str(r.exc_info) for r in caplog.records)
    assert any(f"{lost} are gone" in str(r.exc_info) for r in caplog.records)


async def test_a_link_redelivered_after_the_chain_ended_does_nothing(
    store: Store,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A link whose next link is stored, delivered again after the chain went on and
    ended (its worker died after dispatching, before the ack): the stored links are
    gone, and the ``ended`` marker says why."""
    tag = f"t{next(_tags)}"
    app = _app()
    app.manager.ensure_local_worker = lambda connection: None  # type: ignore[method-assign]
    async with app:
        app._stores["crash"] = store  # type: ignore[assignment]
        driver = app.driver("main")
        links = [ccx_link.with_({"tag": tag, "n": i, "pad": "x" * 800}) for i in range(LINKS)]
        await Queue.chain(links).dispatch()
        bodies = []
        while (reserved := driver.reserve_nowait()) is not None:
            bodies.append(reserved.body)
            await app.manager.process(reserved, driver)
        assert RAN[tag] == list(range(LINKS))
        (tail,) = TAILS[tag]
        assert await store.get(f"haze:chain:{tail}:1") is None
        body = next(b for b in bodies if "tail" in (decode(b).chain or [{}])[0])
        with caplog.at_level(logging.ERROR, logger="haze"):
            await app.manager.process(Reserved(decode(body), 2, body, "default"), driver)
        assert driver.reserve_nowait() is None
    assert len(RAN[tag]) == LINKS + 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
