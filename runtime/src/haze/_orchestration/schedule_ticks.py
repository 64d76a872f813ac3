"""A tick's record in the shared store: the claim on (schedule, fire time), the mark
that it was sent, its once key, and ``TickEnd``, which marks that its job has ended.
"""

from __future__ import annotations

import hashlib
import logging
import time
from datetime import datetime
from typing import TYPE_CHECKING

from haze._base.errors import ConfigError
from haze._engine.hooks import Outcome, Run
from haze._orchestration.schedules import Schedule

if TYPE_CHECKING:
    from haze._engine.manager import QueueManager
    from haze._engine.view import EngineApp
    from haze.stores import Store


log = logging.getLogger("haze")


def _tick_store(app: EngineApp) -> Store | None:
    try:
        return app.queue_store
    except ConfigError:
        return None  # cloudflare/sqs without a store: the platform's trigger fires once


#: The value of a tick's key once its job is queued (before: the claimer's lease).
_DONE = "done"
#: What the first version of the scheduler stored: a tick it claimed and dispatched.
_LEGACY_DONE = "claimed"
#: The first word of a claimed tick's record until it is done: "unsent:<lease end>:<owner>".
_CLAIMED = "unsent"
#: How long a claimed tick's record outlives its claimer: a trigger invocation killed
#: before it sent the tick leaves it to the next invocation, which on a platform whose
#: only trigger is daily comes a day later.
UNSENT_KEEP = 2 * 86400.0
#: How long the once key of a tick sent again after a crash is kept (its id's claim):
#: as long as a queue may keep the dead scheduler's message (SQS keeps one 14 days).
RESENT_ONCE_KEEP = 14 * 86400.0
#: How many of a schedule's past ticks each trigger invocation looks at for one that
#: was claimed and not sent (one store read for all of them).
UNSENT_SCAN = 8


async def _mark_sent(store: Store, sched: Schedule, key: str, at: datetime, ttl: float) -> None:
    try:
        await store.put(key, _DONE, ttl)
        await store.put(f"haze:schedule:{sched.name}:last", at.timestamp())
    except Exception:
        # Only where a new leader resumes from, and whether it asks about this tick
        # again: sent again, the once key keeps it to one run.
        log.debug("haze: could not record the tick of %s", sched.name, exc_info=True)


async def _resend_id(app: EngineApp, once: str) -> str | None:
    """The id of the message that sends a tick again after its scheduler died between
    the dispatch and marking it sent, claimed on the tick's once key before it is sent;
    None when the first message has claimed it (it started, and runs the tick).

    The claim is kept :data:`RESENT_ONCE_KEEP`, not the tick's window: the first message
    may still wait behind a backlog, or come after this one on a queue that is not FIFO,
    and finds the key taken whenever it comes. The id is the tick's own, so a re-sender
    that dies too leaves the claim to the next, which sends under the same id."""
    resent = hashlib.sha256(once.encode()).hexdigest()[:32]
    if await app.manager.callbacks.claim_once(once, resent, RESENT_ONCE_KEEP):
        return resent
    return None


def tick_ended_key(sched_once_key: str) -> str:
    """Set when a tick's job has ended (done, failed or cancelled): see ``TickEnd``."""
    return sched_once_key + ":end"


class TickEnd:
    """Outcome hook: marks a tick's job as ended, so that the scheduler can tell at the
    next tick whether it is still queued (no once key yet) or still running (no end
    marker) and warn that the schedule outruns its job."""

    plain_quiet = True  # wants() is False for a plain success (PlainQuiet)

    def __init__(self, manager: QueueManager) -> None:
        self.manager = manager

    def wants(self, run: Run) -> bool:
        meta = run.message.meta
        return (
            meta is not None
            and "schedule" in meta
            and isinstance(meta.get("once"), str)
            and run.outcome in (Outcome.SUCCESS, Outcome.FAILED, Outcome.CANCELLED)
        )

    async def settling(self, run: Run) -> None:
        return None

    async def settled(self, run: Run) -> None:
        meta = run.message.meta
        assert meta is not None
        ttl = meta.get("once_ttl")
        ttl = float(ttl) if ttl.__class__ in (int, float) and ttl > 0 else None
        try:
            await self.manager.stores.batches().put(tick_ended_key(meta["once"]), 1, ttl)
        except Exception:  # only a warning's input: the job itself has settled
            log.debug("haze: could not mark the end of %s", meta["once"], exc_info=True)


async def _claim(store: Store, key: str, owner: str, lease: float) -> tuple[str, str] | str:
    """Take the tick ``key``: ``(key, value)`` of what this call now holds, else
    ``"done"`` or ``"busy"``.

    A first claim is the tick's record, ``unsent:<lease end, ms>:<owner>``, kept for
    :data:`UNSENT_KEEP` whether or not its claimer lives. Once its lease ended, the
    right to send it again is a second key, ``<key>:resend``, under its own lease: the
    record stays in place, so a re-sender that dies as well leaves it to the next one.
    """
    for _ in range(2):
        record = f"{_CLAIMED}:{round((time.time() + lease) * 1000)}:{owner}"
        if await store.add(key, record, UNSENT_KEEP):
            return key, record
        value = await store.get(key)
        if value is None:
            continue  # the record expired between the two calls: claim it again
        if value in (_DONE, _LEGACY_DONE):
            return "done"
        if not _unsent_and_free(value):
            return "busy"
        held = f"lease:{owner}"
        if await store.add(f"{key}:resend", held, lease):
            return f"{key}:resend", held
        return "busy"
    return "busy"


def _unsent_and_free(value: object) -> bool:
    """True for a tick record that says "claimed, not sent" whose claimer's lease ended.
    (The first scheduler's ``lease:<owner>`` claims expire by themselves: busy till then.)
    """
    if not isinstance(value, str) or not value.startswith(f"{_CLAIMED}:"):
        return False
    until = value.split(":", 2)[1]
    return until.isdigit() and int(until) <= time.time() * 1000


def tick_once_key(sched: Schedule, at: datetime) -> str:
    """The once key a tick's message carries: of the messages a tick may get (its
    scheduler died after the dispatch, before marking it done), only one runs."""
    return sched.tick_key(at) + ":once"
