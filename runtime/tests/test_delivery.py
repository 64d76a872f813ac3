"""The consumer core (``haze._workers.delivery``) that the worker, the Lambda SQS handler
and the Cloudflare Worker's ``queue()`` share."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from haze._engine.events import Events
from haze._workers.delivery import Delivery
from haze.contracts.driver import Leased, Reserved


class _Manager:
    """Stands in for the manager: each job's outcome is its body."""

    def __init__(self) -> None:
        self.events = Events()
        self.running = 0
        self.most = 0

    async def process(self, job: Reserved, driver: Any) -> str:
        self.running += 1
        self.most = max(self.most, self.running)
        await asyncio.sleep(0.01)
        self.running -= 1
        return job.body


class _Leases:
    heartbeat_interval = 0.01

    def __init__(self) -> None:
        self.beats: list[list[str]] = []

    async def heartbeat(self, jobs: Sequence[Reserved]) -> None:
        self.beats.append([j.body for j in jobs])


def _job(body: str) -> Reserved:
    return Reserved(None, 1, body, "default")


def test_delivered_adds_the_envelope_offset_to_the_delivery_count() -> None:
    body = '{"v":1,"id":"a","job":"j","payload":null,"attempts":2,"queue":"q"}'
    job = Reserved.delivered(body, 3, "t", queue="ignored")
    assert (job.attempt, job.queue, job.token, job.error) == (5, "q", "t", None)
    bad = Reserved.delivered("not json", 1, None)
    assert bad.message is None and bad.error is not None and bad.attempt == 1
    assert bad.queue == "default"
    # a body known bad already is not decoded again; its queue is the caller's
    known = Reserved.delivered(body, 2, "t", ValueError("not text"), queue="orders")
    assert (known.message, known.attempt, known.queue) == (None, 2, "orders")
    assert str(known.error) == "not text"
    # receives that ran nothing can outnumber the count: the attempt stays at least 1
    assert Reserved.delivered(body, -4, "t").attempt == 1


async def test_run_batch_keeps_order_and_the_concurrency_limit() -> None:
    manager = _Manager()
    delivery = Delivery(manager, "c")  # type: ignore[arg-type]
    jobs = [_job(s) for s in ["success", "retry", "success", "failed"]]

    async def one(job: Reserved) -> str:
        return await delivery.run(job, None)  # type: ignore[arg-type]

    results = await delivery.run_batch(jobs, one, concurrency=2)
    assert results == ["success", "retry", "success", "failed"]
    assert manager.most == 2
    assert delivery.outcomes == {"success": 2, "retry": 1, "failed": 1}


async def test_a_fifo_batch_runs_in_order_and_stops_at_the_first_accepted_result() -> None:
    manager = _Manager()
    delivery = Delivery(manager)  # type: ignore[arg-type]
    jobs = [_job(s) for s in ["success", "retry", "success"]]

    async def one(job: Reserved) -> bool:
        return await delivery.run(job, None) == "retry"  # type: ignore[arg-type]

    assert await delivery.run_batch(jobs, one, concurrency=5, stop=bool) == [False, True]
    assert manager.most == 1


async def test_events_name_the_connection_around_the_batch() -> None:
    manager = _Manager()
    seen: list[tuple[str, str, Any]] = []
    manager.events.on("looping", lambda c, q: seen.append(("looping", c, q)))
    manager.events.on("worker_idle", lambda c, q: seen.append(("idle", c, q)))
    delivery = Delivery(manager, "cf")  # type: ignore[arg-type]

    async def one(job: Reserved) -> str:
        return await delivery.run(job, None)  # type: ignore[arg-type]

    await delivery.run_batch([_job("a"), _job("b")], one, events=True)
    assert seen == [("looping", "cf", None), ("looping", "cf", None), ("idle", "cf", None)]
    seen.clear()
    await Delivery(manager).run_batch([_job("a")], one, events=True)  # type: ignore[arg-type]
    assert seen == []  # no connection: nothing to name


async def test_running_jobs_have_their_leases_renewed_per_driver() -> None:
    manager = _Manager()
    delivery = Delivery(manager)  # type: ignore[arg-type]
    a, b = _Leases(), _Leases()
    assert isinstance(a, Leased)
    beating = asyncio.ensure_future(delivery.keep_leases(0.002, lambda e: None))
    await asyncio.gather(
        delivery.run(_job("x"), None, leased=a),  # type: ignore[arg-type]
        delivery.run(_job("y"), None, leased=b),  # type: ignore[arg-type]
        delivery.run(_job("z"), None, leased=a),  # type: ignore[arg-type]
    )
    beating.cancel()
    assert ["x", "z"] in a.beats and ["y"] in b.beats
    assert delivery.running() == []


async def test_a_failed_renewal_goes_to_on_error() -> None:
    class Broken(_Leases):
        async def heartbeat(self, jobs: Sequence[Reserved]) -> None:
            raise OSError("down")

    delivery = Delivery(_Manager())  # type: ignore[arg-type]
    errors: list[Exception] = []
    await delivery.renew(errors.append, [(Broken(), _job("x"))])
    assert [str(e) for e in errors] == ["down"]


async def test_a_round_that_ends_an_interval_behind_schedule_is_told() -> None:
    # A round that takes longer than the interval leaves leases unrenewed for longer
    # than the driver planned: the consumer is told (the worker warns, naming
    # --concurrency and retry_after) instead of finding out from jobs run twice.
    class Slow(_Leases):
        async def heartbeat(self, jobs: Sequence[Reserved]) -> None:
            await asyncio.sleep(self.heartbeat_interval * 3)
            self.beats.append([j.body for j in jobs])

    delivery = Delivery(_Manager())  # type: ignore[arg-type]
    slow = Slow()
    told: list[tuple[float, int]] = []
    beating = asyncio.ensure_future(
        delivery.keep_leases(
            slow.heartbeat_interval,
            lambda e: None,
            also=lambda: [(slow, _job("ready")), (slow, _job("acked"))],
            late=lambda behind, n: told.append((behind, n)),
        )
    )
    while not told:
        await asyncio.sleep(0.005)
    beating.cancel()
    behind, leases = told[0]
    assert behind > slow.heartbeat_interval and leases == 2
    assert slow.beats[0] == ["ready", "acked"]
