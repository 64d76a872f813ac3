"""The ``sqs`` driver (``haze-jobs[sqs]``, boto3): Amazon SQS standard and FIFO queues.

Configuration (``config/queue.py``)::

    "sqs": {"driver": "sqs", "queue_url": env("SQS_URL"), "region": "eu-west-1",
            "endpoint_url": None,          # an SQS-compatible server (moto, ElasticMQ)
            "retry_after": "90s",          # the visibility timeout asked for on receive
            "wait_time": "20s",            # cap of one long poll (SQS allows 0-20 s)
            "fifo": None,                  # default: the URL ends in ".fifo"
            "failed_store": "main",        # a database connection or a cache store
            "credentials": {"access_key_id": ..., "secret_access_key": ...},
            "max_message_size": 1048528, "concurrency": 4, "queues": ["high", "default"]}

**Queues.** ``queue_url`` is the SQS queue of the haze queue ``"default"``; another haze
queue ``q`` is the sibling queue ``q`` in the same account (``q.fifo`` on FIFO). A
``queue_url`` containing ``{queue}`` is a template instead:
``https://sqs.eu-west-1.amazonaws.com/123456789012/myapp-{queue}.fifo``. haze never
creates queues.

**Attempts.** SQS counts receives (``ApproximateReceiveCount``) but a message body can
never be changed in place. The attempt number is therefore
``envelope "attempts" + ApproximateReceiveCount``: a retry changes the message's
visibility to the backoff (the next receive counts one more), while ``job.release()``
must not use a try, so it sends a NEW message whose envelope carries
``attempts = attempt - 1`` and deletes the received one (its receive count starts again
at zero). A retry whose backoff does not fit in SQS's 12-hour visibility limit is
re-sent the same way with ``attempts = attempt``. A crashed worker's message comes back
after ``retry_after`` with a higher receive count, which counts as the lost attempt.
A receive that ran nothing (a record a FIFO Lambda trigger reported unprocessed, or
one an invocation that died never started) is not an attempt: the Lambda handler
counts those in the app's store and sets ``SqsReceipt.unused``, which ``admit``
subtracts.

**Delays.** SQS holds a message for at most 15 minutes (``DelaySeconds`` 0-900, whole
seconds, rounded up). A longer delay is sent with ``DelaySeconds=900`` and
``meta.due`` (epoch seconds) in the envelope; a worker that receives it before it is
due forwards it (re-sends it with the time left, up to 900 s, and deletes the old one)
without running it, until it is due. FIFO queues have no per-message delay: a delayed
FIFO message (dispatch delay, or ``job.release(delay)``) is sent at once with
``meta.due`` and, on its first receive, *held* invisible until due
(``ChangeMessageVisibility``, at most 12 h a hold; a message still not due on a later
receive is re-sent fresh). Holding keeps the FIFO order: later messages of the group
wait behind it. That one held receive is not counted as an attempt.

**Visibility.** ``retry_after`` (default 90 s) is the visibility timeout requested on
every receive: a message whose worker died is received again after it. While a job
runs, the worker's heartbeat (every ``retry_after / 3``) extends it again
(``ChangeMessageVisibilityBatch``), so long jobs are not handed to a second worker.
Success deletes the message; a final failure records it in the failed store and
deletes it.

**FIFO.** ``MessageGroupId`` is the dispatch's ``on_group(...)`` (``meta.group``),
else the haze queue name (one ordered stream per queue). ``MessageDeduplicationId`` is
the haze message id plus its dispatch time in ms (``<id>-<ms>``): SDK resends of one
dispatch are dropped by SQS, while ``Queue.retry()`` of a failed job (same id, new
dispatch time) is not; a re-send (release, forwarding) gets a fresh suffix (a whole new
id, so no two re-sends of one message share it).

**Failed jobs.** SQS has no table to keep them in, so ``failed_store`` names one:

- a database connection of ``config/database.py``: the ``failed_jobs`` table (created
  if missing, the same schema as the database driver's), rows filtered by connection;
- a cache store of ``config/cache.py`` (``database`` or ``redis``): records under
  ``haze:failed:<connection>:``, with an append-only index for listing (see
  ``haze._failed.StoreFailedJobs``).

A bare name that is both is the database connection (``haze._failed.failed_target``).

Without ``failed_store`` the failures are kept in this process's memory and a warning
says so on the first one. A dead-letter queue pairs with this: give the source queue a
redrive policy with ``maxReceiveCount`` of at least ``tries + 2`` (one FIFO hold and one
crash of slack; on FIFO ``10 × tries + 2``, as a Lambda trigger's record is received
again behind each retry of the up to 9 records ahead of it in its batch), so haze's own
final failure (``failed()`` callbacks, chain ``catch``, batch bookkeeping, the failed
store) happens first. The DLQ then only catches messages
whose consumer died every time (a crash or a Lambda timeout), which haze never saw
fail; redrive them back with ``StartMessageMoveTask`` once fixed (their envelope is
intact, and the receive count starts again).

**Sizes.** A body over ``max_message_size`` is rejected at dispatch. The default is SQS's
limit (1 MiB since 2025) less 48 bytes, kept for the ``attempts`` and ``meta.due`` that a
release, a retry re-sent past 12 h or a delay over 15 minutes adds to a body; a body
that still would not fit is a ``PayloadTooLargeError``, not SQS's error.
``size(queue)`` is ``ApproximateNumberOfMessages +
ApproximateNumberOfMessagesDelayed + ApproximateNumberOfMessagesNotVisible``: waiting,
delayed, and in flight (running, or waiting out a retry backoff: SQS cannot tell these
apart). SQS's figures are approximate and lag.

**Receive.** Queues are polled in priority order, one message per call; when all are
empty the first queue is long-polled for the worker's idle wait (whole seconds, at most
``wait_time``). ``receive`` is at-least-once: a message may be delivered twice.

boto3 is synchronous: every call runs on the driver's own thread pool with one client
per driver (boto3 clients are thread-safe).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from haze._failed import failed_store
from haze._kernel.deps import require
from haze._kernel.describe import cap_text, error_line
from haze._kernel.errors import (
    BackendUnavailableError,
    ConfigError,
    DispatchIncompleteError,
    PayloadTooLargeError,
    UnknownQueueError,
)
from haze._kernel.message import UNRECORDED_FAILURE, Message, decode, new_id, with_meta
from haze.contracts.driver import (
    Concurrent,
    DelayStep,
    FailedJob,
    FailedJobStore,
    Interruptible,
    Leased,
    MaxDelay,
    QueueCounts,
    Reserved,
    RunningJob,
)

__all__ = [
    "SQS_MAX_DELAY",
    "SQS_MAX_MESSAGE_SIZE",
    "SQS_MAX_VISIBILITY",
    "SqsDriver",
    "SqsReceipt",
]

log = logging.getLogger("haze.sqs")

#: SQS's message size limit (1 MiB since August 2025), also the send_message_batch total.
SQS_MAX_MESSAGE_SIZE = 1_048_576
#: The longest ``DelaySeconds`` SQS accepts.
SQS_MAX_DELAY = 900
#: The longest a message can stay invisible (visibility timeout), in seconds.
SQS_MAX_VISIBILITY = 43_200
#: The longest ``WaitTimeSeconds`` of one long poll.
SQS_MAX_WAIT = 20
_BATCH = 10
#: A failure the failed store could not keep is sent back after 10 s, then 20 s, 40 s,
#: ... (up to SQS's 15 minutes), 8 times at most; then the record is reported, and
#: the queue's redrive policy takes over.
_HAND_BACK_DELAY = 10
_MAX_HANDED_BACK = 8
#: The most of the error text a sent-back message carries (it counts toward its size).
_UNRECORDED_TEXT = 8 * 1024
#: Seconds kept back from the 12-hour visibility limit (clock skew, call latency).
_VISIBILITY_MARGIN = 60
#: Bytes of the size limit kept free at dispatch for what the driver may add to a body
#: later: ``,"attempts":NNNNN`` and ``,"meta":{"due":NNNNNNNNNN.NNN}`` (a release, a
#: retry re-sent past 12 h, a delay over 15 minutes).
_HEADROOM = 48
#: A message this close to its ``due`` time counts as due (SQS delays are whole seconds).
_DUE_TOLERANCE = 1.0
_SYSTEM_ATTRIBUTES = [
    "ApproximateReceiveCount",
    "SentTimestamp",
    "ApproximateFirstReceiveTimestamp",
    "MessageGroupId",
]
_NO_QUEUE = {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}
_BAD_RECEIPT = {
    "ReceiptHandleIsInvalid",
    "InvalidParameterValue",
    "MessageNotInflight",
    "AWS.SimpleQueueService.MessageNotInflight",
}


def _boto3() -> Any:
    return require("boto3", what="the sqs driver", extra="sqs")


def _error_code(error: BaseException) -> str:
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        return str((response.get("Error") or {}).get("Code") or "")
    return ""


@dataclass(slots=True)
class SqsReceipt:
    """The driver's token on a received message (``Reserved.token``)."""

    url: str
    handle: str
    message_id: str
    receive_count: int
    sent_at: float
    first_received_at: float
    group: str | None = None
    #: Receives of this message that ran nothing (a FIFO trigger's records reported
    #: unprocessed): not attempts. Kept by the Lambda handler in the app's store.
    unused: int = 0


def _rewrite(
    body: str, *, attempts: int | None = None, due: float | None = None, keep_due: bool = False
) -> str:
    """``body`` with another ``attempts`` offset and ``meta.due`` (None: removed)."""
    try:
        data = json.loads(body)
    except ValueError:
        return body
    if not isinstance(data, dict):
        return body
    if attempts is not None:
        if attempts > 0:
            data["attempts"] = attempts
        else:
            data.pop("attempts", None)
    meta = dict(data.get("meta") or {})
    if due is not None:
        meta["due"] = round(due, 3)
    elif not keep_due:
        meta.pop("due", None)
    if meta:
        data["meta"] = meta
    else:
        data.pop("meta", None)
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _due_of(message: Message | None) -> float | None:
    if message is None or not message.meta:
        return None
    due = message.meta.get("due")
    try:
        return float(due) if due is not None else None
    except (TypeError, ValueError):
        return None


# --------------------------------------------------------------------------- the driver


#: What SQS takes as a MessageGroupId: 1 to 128 printable ASCII characters, no space.
_GROUP_ID = re.compile(r"[!-~]{1,128}")


def _group_id(group: str) -> str:
    """``group`` as a MessageGroupId; a ValueError (before any call) for one SQS refuses."""
    if not _GROUP_ID.fullmatch(group):
        raise ValueError(
            f"on_group: {group[:40]!r}{'…' if len(group) > 40 else ''} ({len(group)} "
            "characters) cannot be an SQS MessageGroupId, which is 1 to 128 printable ASCII "
            "characters without spaces (letters, digits and punctuation); use an id such as "
            "'customer-42' (nothing was enqueued)"
        )
    return group


class SqsDriver(Interruptible, Leased, DelayStep, MaxDelay, Concurrent):
    """Queue connection on Amazon SQS; see the module docstring for the rules."""

    remote = True
    #: delays are whole seconds (a retry backoff is rounded up): what logs report
    delay_step = 1.0
    local_callbacks = False
    inline = False
    #: ``_call`` turns botocore's connection errors into this (one line, no traceback)
    outage_errors: tuple[type[BaseException], ...] = (BackendUnavailableError,)

    #: The longest DelaySeconds used; tests lower it to exercise forwarding.
    max_delay: float = SQS_MAX_DELAY

    def __init__(self, name: str, options: dict[str, Any], app: Any = None) -> None:
        _boto3()  # fail at first use of the connection, naming haze-jobs[sqs]
        self.name = name
        self.app = app
        self.options = options
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
        self.failed: FailedJobStore = failed_store(name, options.get("failed_store"), app, log)
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
        """The SQS queue URL of haze queue ``queue`` (see "Queues" in the module docstring)."""
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

    # -- producer -----------------------------------------------------------------

    def _group_of(self, message: Message | None, queue: str) -> str:
        group = (message.meta or {}).get("group") if message is not None else None
        return str(group) if group else queue

    def _entry(
        self,
        body: str,
        message: Message,
        delay: float,
        *,
        resend: bool,
        attempts: int | None = None,
        group: str | None = None,
    ) -> dict[str, Any]:
        """SendMessage parameters (without QueueUrl) for ``body`` available after ``delay``."""
        due: float | None = None
        seconds = 0
        if delay > 0:
            if self.fifo:
                due = self.now() + delay
            elif delay > self.max_delay:
                due = self.now() + delay
                seconds = math.ceil(self.max_delay)
            else:
                seconds = math.ceil(delay)
        if resend or due is not None:
            body = _rewrite(body, attempts=attempts, due=due)
            self._check_size(body, message)
        entry: dict[str, Any] = {"MessageBody": body}
        if seconds:
            entry["DelaySeconds"] = min(seconds, SQS_MAX_DELAY)
        if self.fifo:
            entry["MessageGroupId"] = _group_id(group or self._group_of(message, message.queue))
            if resend:
                # a whole new id: its process prefix alone repeats on every re-send from
                # one process, its counter alone across processes, and SQS drops a repeat
                # within 5 minutes as a duplicate (the job lost)
                entry["MessageDeduplicationId"] = f"{message.id}-r{new_id()}"
            else:
                entry["MessageDeduplicationId"] = f"{message.id}-{int(message.ts * 1000)}"
        return entry

    def _check_size(self, body: str, message: Message) -> None:
        """A body the driver added fields to still fits: dispatch keeps ``_HEADROOM``
        bytes free for them, so only a body sent before that rule can fail this."""
        limit = self.max_message_size + _HEADROOM
        size = len(body) if body.isascii() else len(body.encode("utf-8"))
        if size > limit:
            raise PayloadTooLargeError(
                f'job "{message.job}": the message is {size} bytes with the fields the sqs '
                f'driver adds, over the {limit}-byte limit of connection "{self.name}"; pass '
                "ids instead of data (nothing was enqueued)"
            )

    def _send_url(self, queue: str) -> str:
        """The URL a dispatch to ``queue`` goes to, refused (before any call) when it is
        not one of this connection's queues of its own kind."""
        url = self.queue_url_for(queue)
        sqs_name = self._name_of(url)
        if sqs_name.endswith(".fifo") != self.fifo:
            kind = "a FIFO" if sqs_name.endswith(".fifo") else "a standard"
            raise UnknownQueueError(
                f'queue "{queue}" is {kind} SQS queue ({sqs_name}), which the '
                f'{"FIFO" if self.fifo else "standard"} connection "{self.name}" cannot '
                "send to; dispatch it on a connection whose queue_url is of that kind, or "
                'name the queue without ".fifo"',
                queue=queue,
                connection=self.name,
                key=f"connections.{self.name}.queue_url",
            )
        if queue.startswith(("https://", "http://")):
            own = self.queue_for_name(sqs_name)
            if own is None or self.queue_url_for(own) != url:
                # else a dispatch (an HTTP one too) could send to any queue of any account
                raise UnknownQueueError(
                    f'the queue URL {url} is not a queue of connection "{self.name}" (its '
                    "queue_url does not name it); dispatch by queue name",
                    queue=sqs_name,
                    connection=self.name,
                    key=f"connections.{self.name}.queue_url",
                )
        return url

    async def enqueue(self, body: str, message: Message, delay: float) -> None:
        entry = self._entry(body, message, delay, resend=False)
        await self._call("send_message", QueueUrl=self._send_url(message.queue), **entry)

    async def enqueue_many(self, items: Sequence[tuple[str, Message, float]]) -> None:
        """``SendMessageBatch`` per SQS queue: 10 entries and at most 1 MiB per call.

        Entries SQS refuses are raised together, each with its message id
        (``DispatchIncompleteError``); on FIFO the batches after a refused one are not
        sent (they would go ahead of it) and are listed too."""
        by_url: dict[str, list[tuple[dict[str, Any], Message]]] = {}
        for body, message, delay in items:
            by_url.setdefault(self._send_url(message.queue), []).append(
                (self._entry(body, message, delay, resend=False), message)
            )
        chunks: list[tuple[str, list[tuple[dict[str, Any], Message]]]] = []
        for url, entries in by_url.items():
            chunk: list[tuple[dict[str, Any], Message]] = []
            size = 0
            for entry, message in entries:
                n = len(entry["MessageBody"].encode("utf-8"))
                if chunk and (len(chunk) == _BATCH or size + n > SQS_MAX_MESSAGE_SIZE):
                    chunks.append((url, chunk))
                    chunk, size = [], 0
                chunk.append((entry, message))
                size += n
            if chunk:
                chunks.append((url, chunk))
        failed: dict[str, str] = {}
        if self.fifo:  # one batch after the other: the order within a group is the order sent
            for i, (url, chunk) in enumerate(chunks):
                failed.update(await self._send_batch(url, chunk))
                if failed:
                    for _, rest in chunks[i + 1 :]:
                        failed.update(
                            (m.id, "not sent: it would go ahead of one refused") for _, m in rest
                        )
                    break
        else:
            results = await asyncio.gather(
                *(self._send_batch(url, chunk) for url, chunk in chunks), return_exceptions=True
            )
            for result in results:
                if isinstance(result, BaseException):
                    raise result
                failed.update(result)
        if failed:
            listed = ", ".join(f"{job_id} ({why})" for job_id, why in failed.items())
            raise DispatchIncompleteError(
                f"SQS refused {len(failed)} of {len(items)} messages sent by connection "
                f'"{self.name}"; the others were queued. Not queued: {listed}',
                failed=failed,
            )

    async def _send_batch(
        self, url: str, chunk: list[tuple[dict[str, Any], Message]]
    ) -> dict[str, str]:
        """Send one ``SendMessageBatch``; the ids of the messages SQS refused, with why."""
        numbered = [{"Id": str(i), **e} for i, (e, _) in enumerate(chunk)]
        response = await self._call("send_message_batch", QueueUrl=url, Entries=numbered)
        failed = response.get("Failed") or []
        if failed and not any(f.get("SenderFault") for f in failed):
            # SQS's own fault on every entry refused: retry those once
            retry = [numbered[int(f["Id"])] for f in failed]
            again = await self._call("send_message_batch", QueueUrl=url, Entries=retry)
            failed = [{**f, "Id": retry[int(f["Id"])]["Id"]} for f in again.get("Failed") or []]
        return {chunk[int(f["Id"])][1].id: f"{f.get('Code')}: {f.get('Message')}" for f in failed}

    # -- consumer -----------------------------------------------------------------

    def _stop_event(self) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        if self._stop is None or self._stop_loop is not loop:
            self._stop = asyncio.Event()
            self._stop_loop = loop
        return self._stop

    def interrupt(self) -> None:
        """End an idle wait now (the worker is stopping). A long poll still running in its
        thread is abandoned; a message it returns later is handed back without using a try."""
        if self._stop is not None:
            self._stop.set()

    def _receive_params(self, url: str, wait: int) -> dict[str, Any]:
        return {
            "QueueUrl": url,
            "MaxNumberOfMessages": 1,
            "WaitTimeSeconds": wait,
            "VisibilityTimeout": math.ceil(self.retry_after),
            "MessageSystemAttributeNames": _SYSTEM_ATTRIBUTES,
        }

    async def reserve(self, queues: Sequence[str], wait: float) -> Reserved | None:
        queues = list(queues) or list(self.options.get("queues") or ["default"])
        stop = self._stop_event()
        if stop.is_set():
            stop.clear()
        for queue in queues:
            job = await self._poll(queue, 0)
            if job is not None:
                return job
        if wait <= 0:
            return None
        seconds = int(min(wait, self.wait_time))
        started = time.monotonic()
        if seconds >= 1:
            job = await self._poll(queues[0], seconds, stop)
            if job is not None:
                return job
        left = wait - (time.monotonic() - started)
        if left > 0 and not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), left)
            except TimeoutError:
                pass
        return None

    async def _poll(
        self, queue: str, wait: int, stop: asyncio.Event | None = None
    ) -> Reserved | None:
        url = self.queue_url_for(queue)
        for _ in range(_BATCH):  # skip past messages forwarded because they are not due
            params = self._receive_params(url, wait)
            if stop is None:
                response = await self._call("receive_message", **params)
            else:
                future = self._submit("receive_message", **params)
                stopper = asyncio.ensure_future(stop.wait())
                try:
                    await asyncio.wait({future, stopper}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stopper.cancel()
                if not future.done():
                    self._abandon(future, url)
                    return None
                try:
                    response = future.result()
                except Exception as e:
                    self._translate(e, params)
                    raise
            raw = (response.get("Messages") or [None])[0]
            if raw is None:
                return None
            job, _ = await self.admit(url, self.receipt_from_api(url, raw), raw.get("Body") or "")
            if job is not None:
                return job
            wait = 0
        return None

    def _abandon(self, future: asyncio.Future[Any], url: str) -> None:
        """A long poll outlived the worker's stop: hand back what it receives."""
        self._abandoned.add(future)

        def done(f: asyncio.Future[Any]) -> None:
            self._abandoned.discard(f)
            if f.cancelled() or f.exception() is not None:
                return
            for raw in f.result().get("Messages") or []:
                task = asyncio.ensure_future(self._hand_back(url, raw))
                self._abandoned.add(task)
                task.add_done_callback(self._abandoned.discard)

        future.add_done_callback(done)

    async def _hand_back(self, url: str, raw: dict[str, Any]) -> None:
        try:
            job, _ = await self.admit(url, self.receipt_from_api(url, raw), raw.get("Body") or "")
            if job is None:
                return
            if job.message is None:
                await self._change_visibility(job.token, 0)
            else:
                await self.release(job, 0.0, consume_attempt=False)
        except Exception as e:
            log.warning("haze sqs: could not hand back a message received after stop: %s", e)

    @staticmethod
    def receipt_from_api(url: str, raw: dict[str, Any]) -> SqsReceipt:
        """The token of a ``ReceiveMessage`` result."""
        attrs = raw.get("Attributes") or {}
        return SqsReceipt(
            url=url,
            handle=raw["ReceiptHandle"],
            message_id=raw.get("MessageId", ""),
            receive_count=int(attrs.get("ApproximateReceiveCount") or 1),
            sent_at=int(attrs.get("SentTimestamp") or 0) / 1000.0,
            first_received_at=int(attrs.get("ApproximateFirstReceiveTimestamp") or 0) / 1000.0,
            group=attrs.get("MessageGroupId"),
        )

    @staticmethod
    def receipt_from_record(url: str, record: dict[str, Any]) -> SqsReceipt:
        """The token of one record of a Lambda SQS event (``event["Records"][i]``)."""
        attrs = record.get("attributes") or {}
        return SqsReceipt(
            url=url,
            handle=record["receiptHandle"],
            message_id=record.get("messageId", ""),
            receive_count=int(attrs.get("ApproximateReceiveCount") or 1),
            sent_at=int(attrs.get("SentTimestamp") or 0) / 1000.0,
            first_received_at=int(attrs.get("ApproximateFirstReceiveTimestamp") or 0) / 1000.0,
            group=attrs.get("MessageGroupId"),
        )

    async def admit(self, url: str, receipt: SqsReceipt, body: str) -> tuple[Reserved | None, bool]:
        """Turn a received message into a ``Reserved``, or forward it when it is not due.

        Returns ``(job, kept)``: ``job`` is None when the message was not due; ``kept``
        then says whether it stays in its queue (a FIFO hold: the Lambda handler must
        report it as a batch item failure) or was replaced by a new message.
        """
        try:
            message: Message | None = decode(body)
            error: BaseException | None = None
        except Exception as e:
            message, error = None, e
        queue = message.queue if message is not None else self._queue_of_url(url)
        due = _due_of(message)
        now = self.now()
        if message is not None and due is not None and due - now > _DUE_TOLERANCE:
            return None, await self._not_due(url, receipt, message, body, due - now)
        attempts = message.attempts if message is not None else 0
        holds = 0
        if (
            self.fifo
            and due is not None
            and receipt.receive_count > 1
            and receipt.first_received_at < due - _DUE_TOLERANCE
        ):
            holds = 1  # the first receive only held it until due
        attempt = max(1, attempts + receipt.receive_count - holds - receipt.unused)
        return Reserved(message, attempt, body, queue, receipt, error), False

    async def _not_due(
        self, url: str, receipt: SqsReceipt, message: Message, body: str, left: float
    ) -> bool:
        if self.fifo and receipt.receive_count <= 1:
            budget = self._visibility_budget(receipt)
            seconds = min(math.ceil(left) + 1, budget)
            if seconds > 0:
                await self._change_visibility(receipt, seconds)
                return True
        # Forward: the same envelope (same attempts, same due) as a new message.
        # (Standard queues: the last hop, within max_delay, drops "due" and its
        # DelaySeconds ends exactly when due.)
        entry = self._entry(
            body, message, left, resend=True, attempts=message.attempts, group=receipt.group
        )
        await self._call("send_message", QueueUrl=url, **entry)
        await self._delete(receipt)
        return False

    def _visibility_budget(self, receipt: SqsReceipt) -> int:
        """Seconds of visibility SQS still allows (12 h counted from the send, which is
        what moto enforces and never more than SQS allows)."""
        if not receipt.sent_at:
            return SQS_MAX_VISIBILITY - _VISIBILITY_MARGIN
        used = max(0.0, self.now() - receipt.sent_at)
        return int(SQS_MAX_VISIBILITY - _VISIBILITY_MARGIN - used)

    async def _change_visibility(self, receipt: SqsReceipt, seconds: int) -> None:
        await self._call(
            "change_message_visibility",
            QueueUrl=receipt.url,
            ReceiptHandle=receipt.handle,
            VisibilityTimeout=max(0, int(seconds)),
        )

    async def visibility_timeout(self, url: str) -> int:
        """The queue's own ``VisibilityTimeout`` (what Lambda's trigger receives with)."""
        response = await self._call(
            "get_queue_attributes", QueueUrl=url, AttributeNames=["VisibilityTimeout"]
        )
        return int((response.get("Attributes") or {}).get("VisibilityTimeout") or 30)

    async def hand_back(self, receipts: Sequence[SqsReceipt]) -> None:
        """Make received messages visible again now (records a FIFO trigger reports
        unprocessed: their group resumes when its head's own delay ends, not after the
        queue's visibility timeout)."""
        by_url: dict[str, list[SqsReceipt]] = {}
        for r in receipts:
            by_url.setdefault(r.url, []).append(r)
        for url, same in by_url.items():
            for i in range(0, len(same), _BATCH):
                chunk = same[i : i + _BATCH]
                entries = [
                    {"Id": str(n), "ReceiptHandle": r.handle, "VisibilityTimeout": 0}
                    for n, r in enumerate(chunk)
                ]
                response = await self._call(
                    "change_message_visibility_batch", QueueUrl=url, Entries=entries
                )
                for f in response.get("Failed") or []:
                    # it comes back after its visibility timeout instead: later, not lost
                    log.warning(
                        "haze sqs: could not hand back message %s at once (%s: %s)",
                        chunk[int(f["Id"])].message_id,
                        f.get("Code"),
                        f.get("Message"),
                    )

    async def _delete(self, receipt: SqsReceipt) -> bool:
        """Delete a received message; False when its receipt had expired (the message was
        visible again, maybe received by another worker: a lost lease)."""
        try:
            await self._call("delete_message", QueueUrl=receipt.url, ReceiptHandle=receipt.handle)
        except Exception as e:
            if _error_code(e) not in _BAD_RECEIPT:
                raise
            log.debug(
                "haze sqs: could not delete message %s (%s): its receipt expired, so it "
                "may run again",
                receipt.message_id,
                _error_code(e),
            )
            return False
        return True

    async def ack(self, job: Reserved) -> bool:
        return await self._delete(job.token)

    async def release(self, job: Reserved, delay: float, *, consume_attempt: bool) -> bool:
        await self.settle_release(job, delay, consume_attempt=consume_attempt)
        return True

    async def settle_release(self, job: Reserved, delay: float, *, consume_attempt: bool) -> bool:
        """``release`` that says how: True when the message stays in its queue with a new
        visibility timeout (a retry), False when a new message replaced it."""
        receipt: SqsReceipt = job.token
        seconds = math.ceil(delay) if delay > 0 else 0
        if consume_attempt and seconds <= self._visibility_budget(receipt):
            await self._change_visibility(receipt, seconds)
            return True
        if job.message is None:  # undecodable bodies are failed, never released
            await self._change_visibility(receipt, min(seconds, self._visibility_budget(receipt)))
            return True
        used = job.attempt if consume_attempt else job.attempt - 1
        entry = self._entry(
            job.body, job.message, delay, resend=True, attempts=max(0, used), group=receipt.group
        )
        await self._call("send_message", QueueUrl=receipt.url, **entry)
        await self._delete(receipt)
        return False

    async def fail(self, job: Reserved, failed: FailedJob) -> bool:
        try:
            await self.failed.record(failed)
        except Exception as e:
            if not await self._hand_back_failure(job, failed, e):
                raise
        return await self._delete(job.token)

    async def _hand_back_failure(self, job: Reserved, failed: FailedJob, error: Exception) -> bool:
        """The failed store could not keep ``failed`` (it is down, most often): send the
        message back carrying the failure, for a later delivery to record it with the
        job's own error, without running the job or its ``failed()`` again (reporting
        the record instead would run both again, as a job with no try left). False when
        it cannot: an undecodable body, or one sent back too often already."""
        if job.message is None:
            return False
        earlier = (job.message.meta or {}).get(UNRECORDED_FAILURE)
        n = 1 + (earlier.get("handed_back", 0) if isinstance(earlier, dict) else 0)
        pending = {
            "exception": cap_text(failed.exception, _UNRECORDED_TEXT),
            "attempt": failed.attempt or job.attempt,
            "handed_back": n,
        }
        body = with_meta(job.body, UNRECORDED_FAILURE, pending)
        if body is None or n > _MAX_HANDED_BACK:
            return False
        delay = min(_HAND_BACK_DELAY * 2 ** (n - 1), SQS_MAX_DELAY)
        log.warning(
            "haze sqs: the failed-job store could not record the failure of job %s (%s); "
            "its message is sent back to record it in %ds",
            failed.id,
            error_line(error),
            delay,
        )
        receipt: SqsReceipt = job.token
        entry = self._entry(
            body, job.message, delay, resend=True, attempts=job.attempt, group=receipt.group
        )
        await self._call("send_message", QueueUrl=receipt.url, **entry)
        return True

    async def heartbeat(self, jobs: Sequence[Reserved]) -> None:
        """Extend the visibility of running jobs to ``retry_after`` again."""
        by_url: dict[str, list[SqsReceipt]] = {}
        for job in jobs:
            if isinstance(job.token, SqsReceipt):
                by_url.setdefault(job.token.url, []).append(job.token)
        visibility = math.ceil(self.retry_after)
        for url, receipts in by_url.items():
            for i in range(0, len(receipts), _BATCH):
                chunk = receipts[i : i + _BATCH]
                entries = [
                    {
                        "Id": str(n),
                        "ReceiptHandle": r.handle,
                        "VisibilityTimeout": max(0, min(visibility, self._visibility_budget(r))),
                    }
                    for n, r in enumerate(chunk)
                ]
                response = await self._call(
                    "change_message_visibility_batch", QueueUrl=url, Entries=entries
                )
                for f in response.get("Failed") or []:
                    r = chunk[int(f["Id"])]
                    log.warning(
                        "haze sqs: heartbeat of message %s failed (%s: %s)",
                        r.message_id,
                        f.get("Code"),
                        f.get("Message"),
                    )

    # -- inspection ---------------------------------------------------------------

    _SIZE_ATTRIBUTES = (
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesDelayed",
        "ApproximateNumberOfMessagesNotVisible",
    )

    async def size(self, queue: str) -> int:
        """Waiting + delayed + in flight (see "Sizes" in the module docstring)."""
        response = await self._call(
            "get_queue_attributes",
            QueueUrl=self.queue_url_for(queue),
            AttributeNames=list(self._SIZE_ATTRIBUTES),
        )
        attrs = response.get("Attributes") or {}
        return sum(int(attrs.get(a) or 0) for a in self._SIZE_ATTRIBUTES)

    async def counts(self, queue: str) -> QueueCounts:
        """SQS's approximate counts: visible (ready), delayed, and in flight (running; a
        message received by a worker that died stays in flight until its visibility
        timeout ends). ``oldest_ready_at`` stays None: the age of the oldest message is
        the CloudWatch metric ApproximateAgeOfOldestMessage, not a queue attribute."""
        response = await self._call(
            "get_queue_attributes",
            QueueUrl=self.queue_url_for(queue),
            AttributeNames=list(self._SIZE_ATTRIBUTES),
        )
        ready, delayed, running = (
            int((response.get("Attributes") or {}).get(a) or 0) for a in self._SIZE_ATTRIBUTES
        )
        return QueueCounts(ready, delayed, running)

    async def running(self, queue: str, limit: int = 50) -> list[RunningJob] | None:
        """None: SQS cannot list the messages in flight."""
        return None

    async def purge(self, queue: str) -> int:
        """``PurgeQueue`` (every message, in flight too); returns the approximate count.
        Within 60 s of a previous purge SQS refuses, and the visible messages are received
        and deleted instead."""
        url = self.queue_url_for(queue)
        n = await self.size(queue)
        try:
            await self._call("purge_queue", QueueUrl=url)
            return n
        except Exception as e:
            if "PurgeQueueInProgress" not in _error_code(e):
                raise
        deleted = 0
        while True:
            response = await self._call(
                "receive_message",
                QueueUrl=url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=0,
                VisibilityTimeout=30,
            )
            messages = response.get("Messages") or []
            if not messages:
                return deleted
            entries = [
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
            ]
            await self._call("delete_message_batch", QueueUrl=url, Entries=entries)
            deleted += len(messages)

    async def close(self) -> None:
        pending = [f for f in self._abandoned if not f.done()]
        if pending:
            await asyncio.wait(pending, timeout=SQS_MAX_WAIT + 5)
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
