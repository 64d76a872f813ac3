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

from haze.drivers.sqs.driver import SqsDriver
from haze.drivers.sqs.messages import (
    SQS_MAX_DELAY,
    SQS_MAX_MESSAGE_SIZE,
    SQS_MAX_VISIBILITY,
    SqsReceipt,
)

__all__ = [
    "SQS_MAX_DELAY",
    "SQS_MAX_MESSAGE_SIZE",
    "SQS_MAX_VISIBILITY",
    "SqsDriver",
    "SqsReceipt",
]
