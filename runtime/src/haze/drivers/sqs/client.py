"""The sqs driver's settings, the SQS queue of each haze queue, and its boto3 calls (on a
thread pool of its own: boto3 is synchronous)."""

from __future__ import annotations

import asyncio
import importlib
import logging
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from haze._base.errors import BackendUnavailableError, ConfigError, UnknownQueueError
from haze._base.message import Message
from haze._failed import failed_store
from haze.contracts.driver import FailedJobStore
from haze.drivers.context import DriverContext
from haze.drivers.sqs.messages import (
    _HEADROOM,
    _NO_QUEUE,
    SQS_MAX_DELAY,
    SQS_MAX_MESSAGE_SIZE,
    SQS_MAX_VISIBILITY,
    SQS_MAX_WAIT,
    _boto3,
    _error_code,
)

log = logging.getLogger("haze.sqs")


class _SqsClient:
    """What every part of ``SqsDriver`` reads; see the package docstring for the rules."""

    #: ``_call`` turns botocore's connection errors into this (one line, no traceback)
    outage_errors: tuple[type[BaseException], ...] = (BackendUnavailableError,)

    #: The longest DelaySeconds used; tests lower it to exercise forwarding.
    max_delay: float = SQS_MAX_DELAY

    def __init__(
        self, name: str, options: dict[str, Any], context: DriverContext | None = None
    ) -> None:
        _boto3()  # fail at first use of the connection, naming haze-jobs[sqs]
        self.name = name
        self.settings = options
        queue_url = options.get("queue_url")
        if not queue_url:
            raise ConfigError("is required for the sqs driver", key=f"connections.{name}.queue_url")
        self.queue_url: str = queue_url
        self.max_message_size: int = min(
            options.get("max_message_size") or SQS_MAX_MESSAGE_SIZE,
            SQS_MAX_MESSAGE_SIZE - _HEADROOM,
        )
        self.concurrency: int = options.get("concurrency") or 1
        self.retry_after: float = float(options.get("retry_after") or 90.0)
        if not 0 < self.retry_after <= SQS_MAX_VISIBILITY:
            raise ConfigError(
                f"must be between 1s and 12h (the SQS visibility timeout range), "
                f"got {self.retry_after:g}s",
                key=f"connections.{name}.retry_after",
            )
        self.wait_time: float = min(float(options.get("wait_time") or SQS_MAX_WAIT), SQS_MAX_WAIT)
        self.heartbeat_interval: float = max(1.0, self.retry_after / 3)
        fifo = options.get("fifo")
        self.fifo: bool = bool(fifo) if fifo is not None else self._default_name().endswith(".fifo")
        self.region: str | None = options.get("region") or self._region_from_url()
        self.endpoint_url: str | None = options.get("endpoint_url")
        self.credentials: dict[str, Any] = dict(options.get("credentials") or {})
        self.failed: FailedJobStore = failed_store(name, options.get("failed_store"), context, log)
        #: The wall clock (seconds since the epoch); tests may replace it.
        self.clock: Callable[[], float] = time.time
        self._client_obj: Any = None
        self._client_lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._stop: asyncio.Event | None = None
        self._stop_loop: asyncio.AbstractEventLoop | None = None
        self._abandoned: set[asyncio.Future[Any]] = set()

    # -- configuration ------------------------------------------------------------

    def _default_name(self) -> str:
        return urlsplit(self.queue_url).path.rstrip("/").rsplit("/", 1)[-1]

    def _region_from_url(self) -> str | None:
        host = urlsplit(self.queue_url).netloc
        m = re.match(r"^(?:sqs|queue)\.([a-z0-9-]+)\.amazonaws\.com", host)
        return m.group(1) if m else None

    def queue_url_for(self, queue: str) -> str:
        """The SQS queue URL of haze queue ``queue`` (see "Queues" in the package docstring)."""
        if queue.startswith(("https://", "http://")):
            return queue
        if "{queue}" in self.queue_url:
            return self.queue_url.replace("{queue}", queue)
        if queue == "default":
            return self.queue_url
        base = self.queue_url.rstrip("/").rsplit("/", 1)[0]
        if self.fifo and not queue.endswith(".fifo"):
            queue += ".fifo"
        return f"{base}/{queue}"

    def queue_for_name(self, sqs_name: str) -> str | None:
        """The haze queue whose SQS queue is named ``sqs_name``, None if not this connection's."""
        if "{queue}" in self.queue_url:
            template = self._name_of(self.queue_url)
            head, _, tail = template.partition("{queue}")
            fits = len(sqs_name) > len(head) + len(tail)
            if fits and sqs_name.startswith(head) and sqs_name.endswith(tail):
                queue = sqs_name[len(head) : len(sqs_name) - len(tail)]
                # "myapp-{queue}" must not take "myapp-orders.fifo" (a FIFO queue served
                # as a standard one loses its order)
                return queue if self.fifo == sqs_name.endswith(".fifo") else None
            return None
        if sqs_name == self._default_name():
            return "default"
        if self.fifo != sqs_name.endswith(".fifo"):
            return None
        return sqs_name[: -len(".fifo")] if self.fifo else sqs_name

    def url_for_arn(self, arn: str) -> str | None:
        """The URL (through ``endpoint_url`` if set) of the queue ``arn`` names, when this
        connection serves it (the Lambda SQS trigger gives ARNs, not URLs)."""
        parts = arn.split(":")
        if len(parts) < 6 or parts[2] != "sqs":
            return None
        account, name = parts[4], parts[5]
        queue = self.queue_for_name(name)
        if queue is None:
            return None
        url = self.queue_url_for(queue)
        url_account = urlsplit(url).path.strip("/").split("/")[0]
        if url_account.isdigit() and account.isdigit() and url_account != account:
            return None
        return url

    @staticmethod
    def _name_of(url: str) -> str:
        return urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1]

    def _queue_of_url(self, url: str) -> str:
        return self.queue_for_name(self._name_of(url)) or self._name_of(url)

    # -- the client ---------------------------------------------------------------

    def _client(self) -> Any:
        with self._client_lock:
            if self._client_obj is None:
                boto3 = _boto3()
                config_mod = importlib.import_module("botocore.config")
                c = self.credentials
                session = boto3.session.Session(
                    aws_access_key_id=(
                        c.get("access_key_id") or c.get("aws_access_key_id") or c.get("key")
                    ),
                    aws_secret_access_key=(
                        c.get("secret_access_key")
                        or c.get("aws_secret_access_key")
                        or c.get("secret")
                    ),
                    aws_session_token=(
                        c.get("session_token") or c.get("aws_session_token") or c.get("token")
                    ),
                    profile_name=c.get("profile"),
                    region_name=self.region,
                )
                config = config_mod.Config(
                    max_pool_connections=max(10, self.concurrency * 2 + 4),
                    read_timeout=SQS_MAX_WAIT + 20,
                    connect_timeout=10,
                    retries={"max_attempts": 4, "mode": "standard"},
                )
                self._client_obj = session.client(
                    "sqs",
                    region_name=self.region or "us-east-1",
                    endpoint_url=self.endpoint_url,
                    config=config,
                )
            return self._client_obj

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=max(4, self.concurrency * 2 + 2),
                thread_name_prefix=f"haze-sqs-{self.name}",
            )
        return self._executor

    def _submit(self, op: str, **params: Any) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()

        def call() -> Any:
            return getattr(self._client(), op)(**params)

        return loop.run_in_executor(self._pool(), call)

    async def _call(self, op: str, **params: Any) -> Any:
        try:
            return await self._submit(op, **params)
        except Exception as e:
            self._translate(e, params)
            raise

    def _translate(self, error: BaseException, params: dict[str, Any]) -> None:
        exceptions = importlib.import_module("botocore.exceptions")
        if isinstance(error, (exceptions.ConnectionError, exceptions.HTTPClientError)):
            # botocore already retried: the endpoint is down or unreachable. One line, not
            # the urllib3/botocore traceback chain.
            where = self.endpoint_url or params.get("QueueUrl") or "SQS"
            reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise BackendUnavailableError(
                f"queue connection {self.name!r} cannot reach SQS at {where} "
                f"({type(error).__name__}: {reason}); check the network, endpoint_url and "
                "region"
            ) from None
        if _error_code(error) in _NO_QUEUE:
            url = params.get("QueueUrl", "?")
            raise UnknownQueueError(
                f"the SQS queue {url} does not exist; haze does not create queues (create "
                "it, or check queue_url and the queue name)",
                queue=self._queue_of_url(url),
                connection=self.name,
                key=f"connections.{self.name}.queue_url",
            ) from error

    def now(self) -> float:
        return self.clock()

    def _group_of(self, message: Message | None, queue: str) -> str:
        group = (message.meta or {}).get("group") if message is not None else None
        return str(group) if group else queue
