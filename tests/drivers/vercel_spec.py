"""Vercel Queues test support shared by ``tests/drivers/test_vercel.py`` and the contract.

Real: the ``vercel`` driver and the official ``vercel-queue`` SDK client it is built on,
speaking the Queue API over HTTP to the SDK's own local queue service
(``vercel.queue.devserver``: the embedded Queue API server the SDK ships for local
development, served by uvicorn on a loopback port, real clock). It keeps the hosted
service's API: topics, consumer groups, leases (visibility), delivery counts, delays,
retention and idempotency keys. Stand-in: that server itself for the hosted service
(its limits are the documented ones, except that it does not enforce the 100 MB
message cap, which the driver checks itself).

One server per test session, started on first use in this process (a thread; the
storm test starts its own as a process). Each test gets its own topics (a fresh
topic prefix), so tests never see each other's messages.

The contract's orchestration suites wait until a connection is idle and check what is
left queued by asking its driver, and the Queue API tells no queue depth (the real
driver's ``size`` says so): they run the driver as ``VercelTestDriver``, the real driver
plus ``pending()`` and a ``size()`` that count the unsettled messages of its topics in
the server's own state (the test's peek at the server, not anything the driver does).
The public driver contract runs the real ``vercel`` driver.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import types
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

_STATE_NAME = "haze_test_vercel_state"
_state = sys.modules.get(_STATE_NAME)
if _state is None:
    _state = types.ModuleType(_STATE_NAME)
    _state.server = None  # type: ignore[attr-defined]
    _state.stack = None  # type: ignore[attr-defined]
    sys.modules[_STATE_NAME] = _state

TOKEN = "local-token"
REGION = "iad1"


def _missing() -> str | None:
    try:
        import uvicorn  # noqa: F401
        import vercel.queue.devserver  # noqa: F401
    except ImportError as e:
        return f"vercel-queue[devserver] is needed for the vercel tests ({e})"
    return None


_MISSING = _missing()


def server() -> Any:
    """The session's local queue service (``EmbeddedQueueDevServer``), started once."""
    if _state.server is None:
        if _MISSING is not None:
            pytest.fail(_MISSING, pytrace=False)
        from vercel.queue.devserver import embedded_queue_dev_server

        stack = contextlib.ExitStack()
        _state.server = stack.enter_context(embedded_queue_dev_server(manual_clock=False))
        _state.stack = stack
        atexit.register(stack.close)
    return _state.server


def base_url() -> str:
    return str(server().base_url)


def unique_topic(kind: str = "t") -> str:
    """A topic template no other test uses: ``<kind><hex>-{queue}``."""
    return f"{kind}{uuid.uuid4().hex[:10]}-{{queue}}"


def connection(tmp: Path | None = None, **extra: Any) -> dict[str, Any]:
    """A vercel connection on the session's server, with topics of its own."""
    return {
        "driver": "vercel",
        "base_url": base_url(),
        "token": TOKEN,
        "region": REGION,
        "topic": unique_topic(),
        **extra,
    }


def pending_on(template: str, consumer_group: str = "haze", topic: str | None = None) -> int:
    """Messages of the topics ``template`` makes (or of ``topic`` alone) that the consumer
    group has not settled (ready, delayed or leased), in the server's own state."""
    from vercel.queue import sanitize_name

    prefix = template.split("{queue}")[0]
    group = str(sanitize_name(consumer_group))
    state = server().state
    now = datetime.now(UTC)
    return sum(
        1
        for m in list(state.messages)
        if (m.topic == topic if topic is not None else m.topic.startswith(prefix))
        and m.duplicate_of is None
        and m.expires_at > now
        and not m.acknowledged_for(group)
    )


def _test_driver_class() -> type:
    from haze.drivers.vercel import VercelDriver

    class VercelTestDriver(VercelDriver):
        """The real driver, plus the test's peek at the server (see the module doc)."""

        def pending(self) -> int:
            return pending_on(self.topic_template, self.consumer_group)

        async def size(self, queue: str) -> int:
            return pending_on(self.topic_template, self.consumer_group, self.topic_name(queue))

    return VercelTestDriver


#: Contract tests that need what Vercel Queues cannot give, skipped on "vercel" with the
#: reason (checked when the test opens its app, as the sqs spec does).
LIMITS = {
    "test_throttles_exceptions_opens_the_circuit": (
        "needs a 0.01 s retry backoff to end inside a 0.4 s circuit window; Vercel Queues "
        "visibility timeouts and delays are whole seconds (0.01 s becomes 1 s)"
    ),
}


def _register() -> Callable[[], None]:
    import os

    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    reason = LIMITS.get(current.split("::")[-1].split(" ")[0].split("[")[0])
    if reason:
        pytest.skip(f"vercel driver: {reason}")
    from haze.drivers import register_driver

    module = sys.modules.get("haze_test_vercel_spec")
    if module is None:
        module = types.ModuleType("haze_test_vercel_spec")
        module.VercelTestDriver = _test_driver_class()  # type: ignore[attr-defined]
        sys.modules["haze_test_vercel_spec"] = module
    # Registered for the whole session (a plugin name, not a built-in one): registering
    # it again is a no-op, and no other test uses the name.
    register_driver("test_vercel", "haze_test_vercel_spec:VercelTestDriver")

    def undo() -> None:
        pass

    return undo


def _spec() -> Any:
    contract = sys.modules["haze_contract_conftest"]
    return contract.DriverSpec(
        "vercel",
        # the queues the in-process worker polls: those the contract tests use
        connection=lambda tmp: {
            **connection(tmp),
            "driver": "test_vercel",
            "queues": list(contract._DATABASE_QUEUES),
        },
        capabilities=contract.FULL | {"remote"},
        setup=_register,
        # one HTTP send per message; the public driver contract runs the driver itself
        extra={"big_batch": 200, "public_driver": "vercel"},
    )


SPEC = _spec() if "haze_contract_conftest" in sys.modules else None
