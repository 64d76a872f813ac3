"""The public driver contract (``haze.testing.driver_contract``) run the way a driver
author runs it: one ``DriverContract`` subclass per built-in driver, on the real servers
of the contract suite (``conftest.DRIVERS``: the same connections, tables and queues),
and proof that it fails a driver that breaks the contract.

A class per driver, not a parametrised fixture: that is what an author writes, and the
skips a driver earns (a capability it does not declare) show per class.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from haze._base.message import Message
from haze.contracts.driver import FailedJob, Interruptible, Reserved
from haze.drivers import register_driver
from haze.drivers.memory import MemoryDriver
from haze.testing.driver_contract import DriverContract

_contract = sys.modules["haze_contract_conftest"]

#: The built-in queued drivers with a server here (``sync`` runs jobs inside dispatch();
#: ``failover`` only dispatches; ``cloudflare`` has its own Pyodide suite).
_IDS = (
    "memory",
    "database-sqlite",
    "database-postgres",
    "database-mariadb",
    "database-libsql",
    "redis",
    "sqs",
    "vercel",
)


def _suite(spec: Any) -> type[DriverContract]:
    """The subclass an author would write for ``spec``'s connection."""

    class Suite(DriverContract):
        # Queues the contract's SQS spec creates and its database worker polls.
        queues = ("q1", "q2")
        # SQS standard queues promise no order.
        ordered = spec.id != "sqs"
        pytestmark: ClassVar[list[Any]] = list(spec.marks)

        def connection_options(self, tmp_path: Path) -> dict[str, Any]:
            options = dict(spec.connection(tmp_path))
            if spec.extra.get("public_driver"):
                options["driver"] = spec.extra["public_driver"]
            return options

        def app_options(self, tmp_path: Path) -> dict[str, Any]:
            return dict(spec.app_kwargs(tmp_path)) if spec.app_kwargs else {}

        @pytest.fixture(autouse=True)
        def _backend(self) -> Iterator[None]:
            """A fresh key prefix (redis) or set of queues (sqs) per test."""
            undo = spec.setup() if spec.setup else None
            yield
            if undo is not None:
                undo()

    name = "TestContract_" + spec.id.replace("-", "_")
    Suite.__name__ = Suite.__qualname__ = name
    return Suite


for _spec in _contract.DRIVERS:
    if _spec is not None and _spec.id in _IDS:
        globals()[f"TestContract_{_spec.id.replace('-', '_')}"] = _suite(_spec)


# --------------------------------------------------------------------------- broken drivers


class ForgetsAttempts(MemoryDriver):
    """Puts a retried job back as if it had never run."""

    async def release(self, job: Reserved, delay: float, *, consume_attempt: bool) -> bool:
        return await super().release(job, delay, consume_attempt=False)


class DropsReleases(MemoryDriver):
    """Loses every released job."""

    async def release(self, job: Reserved, delay: float, *, consume_attempt: bool) -> bool:
        return await self.ack(job)


class KeepsNoFailures(MemoryDriver):
    """Removes a failed job without keeping it."""

    async def fail(self, job: Reserved, failed: FailedJob) -> bool:
        return await self.ack(job)


class IgnoresDelays(MemoryDriver):
    """Queues every message ready at once."""

    async def enqueue(self, body: str, message: Message, delay: float) -> None:
        await super().enqueue(body, message, 0.0)


class ClaimsInterruptible(MemoryDriver, Interruptible):
    """Declares Interruptible and never defines interrupt(): the Protocol's stub answers."""


def _register(name: str, cls: type[MemoryDriver]) -> None:
    register_driver(name, cls)


_register("contract_forgets_attempts", ForgetsAttempts)
_register("contract_drops_releases", DropsReleases)
_register("contract_keeps_no_failures", KeepsNoFailures)
_register("contract_ignores_delays", IgnoresDelays)
_register("contract_claims_interruptible", ClaimsInterruptible)


class _Forgetful(DriverContract):
    connection: ClassVar[dict[str, Any]] = {"driver": "contract_forgets_attempts"}


class _Dropping(DriverContract):
    connection: ClassVar[dict[str, Any]] = {"driver": "contract_drops_releases"}


class _NoFailures(DriverContract):
    connection: ClassVar[dict[str, Any]] = {"driver": "contract_keeps_no_failures"}


class _Hasty(DriverContract):
    connection: ClassVar[dict[str, Any]] = {"driver": "contract_ignores_delays"}


class _Pretender(DriverContract):
    connection: ClassVar[dict[str, Any]] = {"driver": "contract_claims_interruptible"}


def _breaks(test: Callable[[Path], None], tmp_path: Path, why: str) -> None:
    with pytest.raises(AssertionError) as caught:
        test(tmp_path)
    assert why in str(caught.value), str(caught.value)


def test_the_contract_fails_a_driver_that_forgets_attempts(tmp_path: Path) -> None:
    suite = _Forgetful()
    suite.test_enqueue_reserve_ack(tmp_path)  # what it does not break still passes
    _breaks(suite.test_release_consuming_an_attempt, tmp_path, "attempt 2")
    _breaks(suite.test_attempts_count_across_redeliveries, tmp_path, "attempt 4")


def test_the_contract_fails_a_driver_that_drops_releases(tmp_path: Path) -> None:
    suite = _Dropping()
    suite.test_fail_keeps_the_job_in_the_failed_store(tmp_path)
    _breaks(suite.test_release_without_consuming_an_attempt, tmp_path, "nothing could be reserved")
    _breaks(suite.test_release_with_a_delay, tmp_path, "counts in size")


def test_the_contract_fails_a_driver_that_keeps_no_failures(tmp_path: Path) -> None:
    suite = _NoFailures()
    suite.test_release_consuming_an_attempt(tmp_path)
    _breaks(suite.test_fail_keeps_the_job_in_the_failed_store, tmp_path, "failed.list")
    _breaks(suite.test_a_failed_job_can_be_retried, tmp_path, "")


def test_the_contract_fails_a_driver_that_ignores_delays(tmp_path: Path) -> None:
    _breaks(_Hasty().test_delayed_message_waits_its_delay, tmp_path, "expected nothing")


def test_the_contract_fails_a_capability_declared_but_not_defined(tmp_path: Path) -> None:
    _breaks(
        _Pretender().test_declared_capabilities_are_implemented,
        tmp_path,
        "declares Interruptible but does not define interrupt()",
    )


# --------------------------------------------------------------------------- an author's suite

_AUTHOR_SUITE = """
from haze.drivers import register_driver
from haze.drivers.memory import MemoryDriver
from haze.testing.driver_contract import DriverContract


class Honest(MemoryDriver):
    pass


class Forgetful(MemoryDriver):
    async def release(self, job, delay, *, consume_attempt):
        return await super().release(job, delay, consume_attempt=False)


for name, cls in (("honest", Honest), ("forgetful", Forgetful)):
    register_driver(name, cls)


class TestHonest(DriverContract):
    connection = {"driver": "honest"}


class TestForgetful(DriverContract):
    connection = {"driver": "forgetful"}
"""


#: No random order, no cache directory in the author's folder.
_QUIET = ("-p", "no:randomly", "-p", "no:cacheprovider")


def test_an_authors_suite_reports_the_broken_driver(tmp_path: Path) -> None:
    """pytest run on an author's test file: the honest driver passes every test, the
    broken one fails exactly the tests of what it breaks."""
    (tmp_path / "test_my_driver.py").write_text(textwrap.dedent(_AUTHOR_SUITE))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not this repository's settings
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfs", *_QUIET, "test_my_driver.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = run.stdout + run.stderr
    failed = sorted(
        line.split("::")[-1].split(" ")[0] for line in out.splitlines() if line.startswith("FAILED")
    )
    assert run.returncode == 1, out
    assert not [
        line for line in out.splitlines() if line.startswith("FAILED") and "TestHonest" in line
    ], out
    assert failed == [
        "test_attempts_count_across_redeliveries",
        "test_release_consuming_an_attempt",
    ], out
    # The memory driver declares neither Leased, QueueInspector, BatchConsumer nor
    # Interruptible: those tests skip, naming the capability.
    assert "does not declare Leased" in out, out
