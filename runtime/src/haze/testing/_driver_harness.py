"""The harness of ``haze.testing.driver_contract``: one test's open driver
(``DriverUnderTest``) with the steps the contract repeats, the checks it shares, and
``contract_test``, which turns ``async def test_...(self, d)`` into a pytest test."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

from haze._app.app import App
from haze._base.errors import QueueCountUnavailableError
from haze._base.message import Message, decode, encode, new_id
from haze.contracts.driver import (
    AcksInClaim,
    Advises,
    Backlog,
    BatchConsumer,
    Concurrent,
    ConnectionAware,
    DelayStep,
    DispatchOnly,
    Driver,
    FailedJob,
    IdlePolling,
    Interruptible,
    Leased,
    LocalQueue,
    QueueInspector,
    Reserved,
    UncountedQueues,
)

#: The optional capability Protocols of ``haze.contracts.driver``.
CAPABILITIES: tuple[type, ...] = (
    AcksInClaim,
    Advises,
    Backlog,
    BatchConsumer,
    Concurrent,
    ConnectionAware,
    DelayStep,
    DispatchOnly,
    IdlePolling,
    Interruptible,
    Leased,
    LocalQueue,
    QueueInspector,
    UncountedQueues,
)


@dataclass
class DriverUnderTest:
    """One test's open App and its ``"main"`` driver, with the calls the contract repeats."""

    app: App
    driver: Driver
    queue: str
    other: str
    patience: float

    def message(self, queue: str | None = None, payload: Any = None, attempts: int = 0) -> Message:
        """A fresh envelope for ``queue`` (the first test queue by default)."""
        return Message(
            id=new_id(),
            job="haze_driver_contract",
            payload={"n": 0} if payload is None else payload,
            queue=queue or self.queue,
            connection=self.driver.name,
            ts=time.time(),
            attempts=attempts,
        )

    async def put(
        self,
        queue: str | None = None,
        *,
        payload: Any = None,
        delay: float = 0.0,
        attempts: int = 0,
    ) -> Message:
        """Enqueue a fresh message; returns it."""
        message = self.message(queue, payload, attempts)
        await self.driver.enqueue(encode(message), message, delay)
        return message

    async def take(
        self, queues: Sequence[str] | None = None, within: float | None = None
    ) -> Reserved:
        """Claim the next message of ``queues``, waiting up to ``within`` seconds (default
        ``patience``) for one; fails the test when none comes."""
        wanted = list(queues or [self.queue])
        deadline = time.monotonic() + (self.patience if within is None else within)
        while True:
            left = deadline - time.monotonic()
            got = await self.driver.reserve(wanted, max(0.05, min(1.0, left)))
            if got is not None:
                return got
            assert time.monotonic() < deadline, (
                f"{self.driver.name}: nothing could be reserved from {wanted} within "
                f"{self.patience if within is None else within:g}s"
            )

    async def size_is(self, queue: str, n: int, why: str = "") -> None:
        """``size(queue)`` is ``n``; not asked of a driver whose backend tells no queue
        depth (``UncountedQueues``), whose ``size`` must then say so."""
        if isinstance(self.driver, UncountedQueues):
            with pytest.raises(QueueCountUnavailableError):
                await self.driver.size(queue)
            return
        got = await self.driver.size(queue)
        assert got == n, why or f"size({queue!r}) is {got}, expected {n}"

    async def nothing(self, queues: Sequence[str] | None = None, wait: float = 0.3) -> None:
        """Nothing can be claimed from ``queues`` now."""
        wanted = list(queues or [self.queue])
        got = await self.driver.reserve(wanted, wait)
        assert got is None, f"{self.driver.name}: reserved {got!r} from {wanted}, expected nothing"

    async def expect(
        self,
        sent: Message,
        queues: Sequence[str] | None = None,
        *,
        within: float | None = None,
        attempt: int | None = None,
        why: str = "the claim",
        ack: bool = True,
    ) -> Reserved:
        """Claim the next message of ``queues`` (``take``), check it is ``sent``, intact,
        on ``attempt`` when one is given (``why`` says why that one), and ack it (the ack
        must find the claim still held) unless ``ack`` is False; returns the claim."""
        job = await self.take(queues, within)
        same_message(job, sent)
        if attempt is not None:
            assert job.attempt == attempt, f"{why}: expected attempt {attempt}, got {job.attempt}"
        if ack:
            await self.ack(job)
        return job

    async def ack(self, *jobs: Reserved) -> None:
        """Ack each of ``jobs``, which this consumer holds: each ack answers True."""
        for job in jobs:
            assert await self.driver.ack(job) is True, "ack of a job this consumer holds is True"


def failure_of(job: Reserved, driver: Driver, exception: str = "RuntimeError: boom") -> FailedJob:
    """The record the engine hands ``Driver.fail`` for ``job``."""
    return FailedJob.from_body(
        job.body,
        id=None,
        connection=driver.name,
        queue=job.queue,
        exception=exception,
        failed_at=time.time(),
    )


def _is_protocol_class(cls: type) -> bool:
    # typing marks each class that is itself a Protocol in its own namespace.
    return cls.__module__ == "typing" or vars(cls).get("_is_protocol") is True


def same_message(got: Reserved, sent: Message) -> None:
    """``got`` is ``sent``, intact."""
    assert got.error is None, f"the reserved body did not decode: {got.error}"
    assert got.message is not None
    assert got.message.id == sent.id, f"reserved {got.message.id}, expected {sent.id}"
    assert got.message.job == sent.job
    assert got.message.payload == sent.payload
    assert got.queue == sent.queue, f"reserved from {got.queue!r}, sent to {sent.queue!r}"
    assert decode(got.body).id == sent.id


class _RunsContracts(Protocol):
    async def run_contract(
        self,
        tmp_path: Path,
        body: Callable[[Any, DriverUnderTest], Awaitable[None]],
        *,
        needs: type | None = None,
        lease: bool = False,
    ) -> None: ...


_Contract = TypeVar("_Contract", bound=_RunsContracts)
_Body = Callable[[_Contract, DriverUnderTest], Awaitable[None]]
_Test = Callable[[_Contract, Path], None]


def contract_test(
    *, needs: type | None = None, lease: bool = False
) -> Callable[[_Body[_Contract]], _Test[_Contract]]:
    """Turn ``async def body(self, d)`` into a pytest test ``test(self, tmp_path)`` that
    opens the driver, skips unless it declares ``needs`` and runs ``body``.

    The wrapper has its own signature on purpose (no ``functools.wraps``): pytest reads
    the parameters of ``__wrapped__`` and would ask for a fixture named ``d``."""

    def decorate(body: _Body[_Contract]) -> _Test[_Contract]:
        def test(self: _Contract, tmp_path: Path) -> None:
            asyncio.run(self.run_contract(tmp_path, body, needs=needs, lease=lease))

        test.__name__ = body.__name__
        test.__qualname__ = body.__qualname__
        test.__doc__ = body.__doc__
        return test

    return decorate


async def _main_driver(app: App) -> Driver:
    """The driver under test, with no consumer of the app's own taking its messages: the
    contract claims them itself, and an App starts an in-process consumer for a memory
    connection."""
    await app.manager.stop_local_workers()
    return app.driver("main")


def _lease_of(driver: Driver) -> float:
    """About the lease, in seconds: drivers renew it two or three times per lease (only
    used to bound the waits; ``lease_options`` sets the lease itself)."""
    assert isinstance(driver, Leased)
    return max(1.0, driver.heartbeat_interval * 3)
