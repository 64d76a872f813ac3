"""SQS test support shared by ``tests/drivers/test_sqs.py`` and the driver contract.

Real: boto3 and botocore (the driver's own client), speaking the SQS JSON protocol
over HTTP to ``moto`` in server mode (``moto.server.ThreadedMotoServer``, one per test
session on a free loopback port). Stand-in: moto itself for Amazon SQS. moto keeps
SQS's limits that matter here (DelaySeconds 0-900, no per-message delay on FIFO,
the 12-hour visibility limit, FIFO group blocking, receive counts, batch limits), but
its timing is coarse and its ``ReceiveMessage`` is not safe under concurrency, so no
test may rely on exactly-once delivery.

The contract file loads this module by path (``runpy.run_path``), as it does for
``redis_spec.py``, and takes ``SPEC``. State that must be shared between the copies
(the server) lives in one module registered in ``sys.modules``.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import types
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from services import CI, tool_missing

ACCOUNT = "123456789012"
REGION = "us-east-1"
#: moto accepts any credentials; set them so botocore never looks for real ones.
CREDENTIALS = {"access_key_id": "testing", "secret_access_key": "testing"}

_STATE_NAME = "haze_test_sqs_state"
_state = sys.modules.get(_STATE_NAME)
if _state is None:
    _state = types.ModuleType(_STATE_NAME)
    _state.server = None  # type: ignore[attr-defined]
    _state.endpoint = None  # type: ignore[attr-defined]
    sys.modules[_STATE_NAME] = _state


def _missing() -> str | None:
    try:
        import boto3  # noqa: F401
        from moto.server import ThreadedMotoServer  # noqa: F401
    except ImportError as e:
        return f"boto3 and moto[server] are needed for the sqs tests ({e})"
    return None


_MISSING = _missing()
# Under CI=true the tests run and endpoint() fails them (moto is a dev dependency).
needs_moto = pytest.mark.skipif(_MISSING is not None and not CI, reason=_MISSING or "")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def endpoint() -> str:
    """The moto server's URL, starting it on first use (stopped at exit)."""
    if _state.endpoint is None:
        if _MISSING is not None:
            tool_missing(_MISSING)
        from moto.server import ThreadedMotoServer

        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        os.environ.setdefault("AWS_DEFAULT_REGION", REGION)
        port = _free_port()
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        _state.server = server
        _state.endpoint = f"http://127.0.0.1:{port}"
        atexit.register(server.stop)
    return str(_state.endpoint)


def client() -> Any:
    """A plain boto3 SQS client on the moto server (the test's own view of SQS)."""
    import boto3

    return boto3.client(
        "sqs",
        region_name=REGION,
        endpoint_url=endpoint(),
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def create_queues(
    names: list[str], *, fifo: bool = False, attributes: dict[str, str] | None = None
) -> dict[str, str]:
    """Create SQS queues (1 MiB message size, FIFO when asked); name -> URL."""
    c = client()
    urls = {}
    for name in names:
        attrs = {"MaximumMessageSize": "1048576", **(attributes or {})}
        if fifo:
            attrs["FifoQueue"] = "true"
        urls[name] = c.create_queue(QueueName=name, Attributes=attrs)["QueueUrl"]
    return urls


def delete_queues(urls: list[str]) -> None:
    c = client()
    for url in urls:
        try:
            c.delete_queue(QueueUrl=url)
        except Exception:
            pass


def unique_prefix(kind: str = "t") -> str:
    return f"hz{kind}{uuid.uuid4().hex[:10]}"


# --------------------------------------------------------------------------- driver contract

_prefixes: list[str] = []
_created: dict[str, list[str]] = {}


def _contract_queues() -> list[str]:
    contract = sys.modules["haze_contract_conftest"]
    return list(getattr(contract, "_DATABASE_QUEUES", contract.QUEUES))


#: Contract tests that need what moto (or SQS) cannot give, skipped on "sqs" with the
#: reason. Checked when the test opens its app (``DriverSpec.setup``), so the contract
#: files need no sqs-specific code.
MOTO_LIMITS = {
    "test_thousand_jobs_sixteen_consumers_callbacks_exactly_once": (
        "relies on exactly-once delivery to 16 concurrent consumers; moto's ReceiveMessage "
        "is not safe under concurrency (SQS itself is at-least-once), and 1000 jobs through "
        "moto's HTTP server overrun the test's 40 s budget"
    ),
    "test_throttles_exceptions_opens_the_circuit": (
        "needs a 0.01 s retry backoff to end inside a 0.4 s circuit window; SQS visibility "
        "timeouts and delays are whole seconds (0.01 s becomes 1 s)"
    ),
    "test_batch_state_expires_after_batches_ttl": (
        "needs the job done within the batch's 0.2 s ttl; a poll of moto's SQS over HTTP "
        "takes longer than that"
    ),
}


def _skip_moto_limits() -> None:
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    name = current.split("::")[-1].split(" ")[0].split("[")[0]
    reason = MOTO_LIMITS.get(name)
    if reason:
        pytest.skip(f"sqs driver under moto: {reason}")


def _setup() -> Callable[[], None]:
    _skip_moto_limits()
    prefix = unique_prefix("c")
    _prefixes.append(prefix)
    urls = create_queues([f"{prefix}-{q}" for q in _contract_queues()])
    _created[prefix] = list(urls.values())

    def undo() -> None:
        _prefixes.remove(prefix)
        delete_queues(_created.pop(prefix, []))

    return undo


def _connection(tmp: Path) -> dict[str, Any]:
    return {
        "driver": "sqs",
        # a template: haze queue "high" is the SQS queue "<prefix>-high" (fresh per test)
        "queue_url": f"{endpoint()}/{ACCOUNT}/{_prefixes[-1]}-{{queue}}",
        "endpoint_url": endpoint(),
        "region": REGION,
        "credentials": dict(CREDENTIALS),
        "queues": _contract_queues(),
        "retry_after": "30s",
        "failed_store": "main",  # the failed_jobs table of the tmp SQLite database below
    }


def _app_kwargs(tmp: Path) -> dict[str, Any]:
    from haze import define_database_config

    # The failed store is shared (a SQLite file); the queue store stays the contract's
    # memory store because the contract's worker runs in this process.
    url = f"sqlite:///{tmp}/contract-sqs-failed.db"
    return {"database": define_database_config(default="main", connections={"main": {"url": url}})}


def _driver_spec() -> Any:
    contract = sys.modules.get("haze_contract_conftest")
    if contract is None:
        return None
    return contract.DriverSpec(
        "sqs",
        connection=_connection,
        capabilities=contract.FULL | {"remote"},
        app_kwargs=_app_kwargs,
        setup=_setup,
        marks=(needs_moto,),
    )


SPEC = _driver_spec()
