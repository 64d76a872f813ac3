"""The ``sync`` driver: the job runs inside ``dispatch()``, in the caller's context.

No queue at all: delays are ignored, there are no retries, ``job.release()`` drops
the job with a warning, a failure calls ``failed()`` and is raised to the caller,
and nothing is stored (``queue:failed`` is always empty; ``queue:work`` refuses it).
The manager sees ``inline = True`` and runs the pipeline itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from haze._base.message import MAX_MESSAGE_SIZE, Message
from haze._failed import NoFailedJobs
from haze.contracts.driver import FailedJob, Reserved
from haze.drivers.context import DriverContext

__all__ = ["SyncDriver"]


class SyncDriver:
    #: the config options it takes besides the common ones (``DeclaresOptions``)
    options: ClassVar[Mapping[str, str]] = {}
    remote = False
    local_callbacks = True
    inline = True
    #: in-process: there is no backend to become unreachable
    outage_errors: tuple[type[BaseException], ...] = ()

    def __init__(self, name: str, options: dict[str, Any], context: DriverContext | None = None):
        self.name = name
        self.max_message_size: int | None = options.get("max_message_size") or MAX_MESSAGE_SIZE
        self.failed = NoFailedJobs()

    async def enqueue(self, body: str, message: Message, delay: float) -> None:
        raise AssertionError("the manager runs sync jobs inline")  # pragma: no cover

    async def enqueue_many(self, items: Sequence[tuple[str, Message, float]]) -> None:
        raise AssertionError("the manager runs sync jobs inline")  # pragma: no cover

    async def reserve(self, queues: Sequence[str], wait: float) -> Reserved | None:
        return None

    async def ack(self, job: Reserved) -> bool:
        return True

    async def release(self, job: Reserved, delay: float, *, consume_attempt: bool) -> bool:
        return True

    async def fail(self, job: Reserved, failed: FailedJob) -> bool:
        return True

    async def size(self, queue: str) -> int:
        return 0

    async def purge(self, queue: str) -> int:
        return 0

    async def close(self) -> None:
        return None
