"""Outcome hooks: what runs around a job's outcome, beside the driver's ack/fail/release.

Execution decides the outcome of an attempt (``Outcome``) and records it with the
driver; everything else that reacts to an outcome is an ``OutcomeHook``: the status
record, the next link of a chain, a batch's counters and callbacks, the unique lock,
the ``max_exceptions`` counter, a chain's ``catch`` callbacks, the ``after`` event and
the OpenTelemetry span events. Each hook has two steps:

``settling(run)``
    before the driver records the outcome (``ack``/``fail``/``release``): work that
    must not be lost when the process dies after the record (the next link, the batch
    count), so that a redelivery does it again.
``settled(run)``
    after it: work whose order after the record matters (the status record says what
    the queue already did; a chain's ``catch`` runs once the job is in the failed list).

Hooks run in the order of their ``Stage``, then in the order they were added. Chains
and batches live above the engine and are added by the app (``haze._app``), so the
engine never imports them.

A ``RunGuard`` runs before an attempt and may skip it (a batch that was cancelled, a
callback that already ran elsewhere); a skipped run then settles as ``SKIPPED``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from haze._jobs.context import JobContext
    from haze._jobs.definition import JobDefinition
    from haze._kernel.message import Message
    from haze.contracts.driver import Driver, Reserved

__all__ = ["Hooks", "Outcome", "OutcomeHook", "Run", "RunGuard", "Skip", "Stage"]


class Outcome:
    """An attempt's outcome (the strings workers, the tally and telemetry count)."""

    SUCCESS = "done"
    RELEASED = "released"
    RETRY = "retry"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


class Stage(enum.IntEnum):
    """Where a hook runs among the others, in each of its two steps."""

    RECORD = 10  # the status record
    CONTINUE = 20  # the next link of a chain
    COUNT = 30  # batch counters and callbacks
    RELEASE = 40  # the unique lock, the max_exceptions counter
    CALLBACK = 50  # a chain's catch callbacks
    NOTIFY = 60  # queue events, telemetry


@dataclass(slots=True, eq=False)
class Run:
    """One attempt of one job, as execution and the hooks see it."""

    job: JobDefinition[Any]
    message: Message
    reserved: Reserved
    driver: Driver
    ctx: JobContext
    inline: bool
    payload: Any = None
    outcome: str = ""
    error: BaseException | None = None
    #: What ``handle()`` returned (a success).
    result: Any = None
    #: Seconds until the job is due again (a retry or a release).
    delay: float = 0.0
    #: ``delay`` as the driver will apply it (whole seconds on SQS): what logs say.
    shown_delay: float = 0.0
    #: Why a skipped or cancelled run did not run; None: nothing to record.
    note: str | None = None
    #: Raised to the dispatch() caller after the run settled (a sync chain's next link).
    raise_after: BaseException | None = None

    @property
    def tracked(self) -> bool:
        meta = self.message.meta
        return meta is not None and "track" in meta


@dataclass(frozen=True, slots=True)
class Skip:
    """A guard's verdict: do not run this attempt. ``note`` is what the status record
    says (None: nothing is written)."""

    note: str | None = None


class OutcomeHook(Protocol):
    """Reacts to the outcome of an attempt (see the module doc)."""

    async def settling(self, run: Run) -> None:
        """Before the driver records ``run.outcome``."""

    async def settled(self, run: Run) -> None:
        """After the driver recorded ``run.outcome``."""


class RunGuard(Protocol):
    """Decides before an attempt runs whether it runs at all."""

    async def admit(self, run: Run) -> Skip | None:
        """None: run it; a ``Skip``: acknowledge it unrun."""


class Hooks:
    """The hooks and guards of one app's engine, in stage order."""

    def __init__(self) -> None:
        self._hooks: list[tuple[int, int, OutcomeHook]] = []
        self._ordered: tuple[OutcomeHook, ...] = ()
        self.guards: list[RunGuard] = []

    def add(self, hook: OutcomeHook, stage: Stage) -> None:
        self._hooks.append((int(stage), len(self._hooks), hook))
        self._ordered = tuple(h for _, _, h in sorted(self._hooks, key=lambda x: x[:2]))

    def guard(self, guard: RunGuard) -> None:
        self.guards.append(guard)

    async def settling(self, run: Run) -> None:
        for hook in self._ordered:
            await hook.settling(run)

    async def settled(self, run: Run) -> None:
        for hook in self._ordered:
            await hook.settled(run)

    async def admit(self, run: Run) -> Skip | None:
        for guard in self.guards:
            skip = await guard.admit(run)
            if skip is not None:
                return skip
        return None
