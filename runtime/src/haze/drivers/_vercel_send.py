"""What a send to Vercel Queues that failed on every try may have done.

The ``vercel`` driver sends a message up to three times under one idempotency key, so
the service keeps one message however many of the tries reached it. When the last
try fails too, the message is surely not stored only when no try can have reached
the service: each one got no connection, or a 429 (the service refused it before
taking it). A try whose answer was lost after its request went out, or that got a
5xx (the service may fail after writing), may have stored it. The Queue API cannot
look a message up, so such a dispatch raises ``DispatchOutcomeUnknownError`` rather
than an outage (which says nothing was queued): a bulk lists the message as
``unknown``, and a batch keeps the job pending instead of counting as failed a job
that may run.
"""

from __future__ import annotations

from typing import Any

from haze._base.describe import error_line
from haze._base.errors import DispatchOutcomeUnknownError

__all__ = ["lost_answer", "may_have_landed"]


def may_have_landed(error: BaseException, sdk: Any) -> bool:
    """Whether the failed try that raised ``error`` (an outage error of the driver)
    may have stored its message."""
    if isinstance(error, sdk.ThrottledError):
        return False
    if isinstance(error, sdk.CommunicationError):
        import httpx2  # the SDK's HTTP client (its dependency): read only once a try failed

        unsent = (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout)
        return not isinstance(error.__cause__, unsent)
    return True  # a 5xx answer


def lost_answer(
    connection: str, job_id: str, topic: str, tries: int, error: BaseException
) -> DispatchOutcomeUnknownError:
    """The error of the send of job ``job_id`` whose ``tries`` all failed, one of them
    after it may have reached the service (``error``: the last one's)."""
    return DispatchOutcomeUnknownError(
        f"queue connection {connection!r}: the send of job {job_id} to topic {topic!r} "
        f"failed {tries} times ({error_line(error)}) after a try that may have reached "
        "Vercel Queues: it may be queued, and the Queue API cannot look a message up, "
        "so dispatching it again may run it twice",
        job_ids=(job_id,),
    )
