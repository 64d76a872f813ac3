"""A finished job's ack that fails is kept and sent again, on every driver a worker
consumes.

The fault is injected into the driver under test, in this process: its ack calls
(``ack``, and ``ack_many``/``ack_and_claim`` where the driver batches them) raise a
plain ``RuntimeError`` (not one of the driver's outage errors) the first few times,
before anything reaches the backend, then go through to the real backend. Every job
must still run exactly once, and its entry must leave the backend well inside the
lease (``retry_after``: 30 s on Redis, 90 s on the database and SQS drivers), instead
of staying claimed until the lease runs out and the job runs again.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from haze import App, JobContext, Queue, define_job
from haze.contracts.driver import QueueInspector

RUNS: collections.Counter[str] = collections.Counter()

#: Ack calls that raise before the real ones go through.
FAILURES = 5
#: Far inside every driver's default lease: a kept ack is sent again within this.
WITHIN = 12.0


@define_job(name="ct_ack_fault_count")
async def ct_ack_fault_count(payload: dict[str, Any], job: JobContext) -> None:
    RUNS[payload["k"]] += 1


@pytest.fixture(autouse=True)
def _reset() -> None:
    RUNS.clear()


def inject_ack_failures(driver: Any, n: int) -> list[str]:
    """Make the first ``n`` ack calls of ``driver`` (this instance) raise; returns the
    list the failed calls are named in."""
    failed: list[str] = []
    for name in ("ack", "ack_many", "ack_and_claim"):
        real = getattr(type(driver), name, None)
        if real is None:
            continue

        def wrap(real: Callable[..., Awaitable[Any]], name: str) -> Callable[..., Awaitable[Any]]:
            async def call(*args: Any) -> Any:
                if len(failed) < n:
                    failed.append(name)
                    raise RuntimeError(f"injected failure of {name}")
                return await real(driver, *args)

            return call

        setattr(driver, name, wrap(real, name))
    return failed


async def _settled(app: App, queue: str) -> bool:
    driver = app.driver("main")
    if not isinstance(driver, QueueInspector):
        # Vercel Queues count nothing: its test driver peeks at the local server
        return bool(driver.pending() == 0)  # type: ignore[attr-defined]
    counts = await driver.counts(queue)
    return (counts.ready, counts.delayed, counts.running) == (0, 0, 0)


@pytest.mark.requires("queued")
async def test_a_failed_ack_is_kept_and_sent_again_until_it_succeeds(
    driver: Any, make_app: Any
) -> None:
    if driver.extra.get("consumer") is not None:
        pytest.skip(
            "a platform consumer (Cloudflare queue()) acks with a local call on the "
            "delivered message, recorded by the platform when the batch returns"
        )
    n = 12
    async with make_app(concurrency=3) as app:
        failed = inject_ack_failures(app.driver("main"), FAILURES)
        began = time.monotonic()
        await Queue.bulk([ct_ack_fault_count.with_({"k": f"j{i}"}) for i in range(n)])
        while not (len(RUNS) == n and len(failed) == FAILURES and await _settled(app, "default")):
            assert time.monotonic() - began < WITHIN, (
                f"after {WITHIN}s: runs {dict(RUNS)}, failed acks {failed}"
            )
            await asyncio.sleep(0.05)
        assert dict(RUNS) == {f"j{i}": 1 for i in range(n)}
