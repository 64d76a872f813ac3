"""``PlainQueue``: an in-process queue that runs plain jobs on a short path.

A plain job is a message with nothing but immutable fields and a payload (no chain,
batch, lock, meta or encryption), dispatched with no option. On a ``PlainQueue`` (the
``memory`` driver) the dispatcher queues it with ``keep_plain`` (no ``Message``, no
body), and the worker takes it with ``claim_plain``: a ``PlainClaim`` the engine runs
without building a ``Message``, a ``Reserved``, a ``JobContext`` or a ``Run``, and
settles with the next ``claim_plain(queues, ended=True)`` (``plain_done`` when no
claim follows). Whatever the short path cannot do alone (the job raised, suspended,
asks for its context, a listener or a log line wants it) goes through
``plain_claim``: the very ``Reserved`` ``reserve_nowait`` would have returned.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from haze.contracts.driver import Reserved

__all__ = ["PlainClaim", "PlainQueue"]

#: A claimed plain message: (what the queue kept, the attempt, the queue). The kept
#: item is the driver's own; only the driver reads it, besides its job name (index 2),
#: its payload (index 3, copied for the job: ``.copy()`` when flat, else with
#: ``copy_plain``), its tenant (8) and whether its payload is flat (9).
PlainClaim = tuple[tuple[Any, ...], int, str]


@runtime_checkable
class PlainQueue(Protocol):
    """See the module doc. Checked once, when a route or a worker is built."""

    name: str
    max_message_size: int | None

    def keep_plain(
        self, mid: str, job: str, payload: Any, queue: str, tenant: str | None, flat: bool
    ) -> bool:
        """Queue a plain message now (no delay, first attempt), stamped with the time
        of this call. ``payload`` is the dispatcher's own copy (``copy_payload``), never
        handed to a job as it is; ``flat``: it is a dict or list of scalars, so its
        ``.copy()`` is a full copy. False: not kept (the full dispatch path then runs)."""

    def claim_plain(
        self, queues: list[str] | None, ended: bool = False
    ) -> PlainClaim | Reserved | None:
        """The next job in claim order: a ``PlainClaim`` when it is a kept plain
        message, else what ``reserve_nowait`` gives (a ``Reserved``, or None).
        ``ended``: the plain claim running before succeeded; acknowledged first, as
        ``plain_done`` would (one call per job in a burst of plain jobs)."""

    def plain_claim(self, claim: PlainClaim, payload: Any = None) -> Reserved:
        """``claim`` as the ``Reserved`` ``reserve_nowait`` would have made, its message
        carrying ``payload`` (the job's copy; None: a fresh copy), now running as that."""

    def plain_done(self) -> None:
        """The running plain claim succeeded: acknowledged."""
