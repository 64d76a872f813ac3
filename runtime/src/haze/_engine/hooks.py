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
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from haze._jobs.context import JobContext

if TYPE_CHECKING:
    from collections.abc import Callable

    from haze._base.message import Message
    from haze._jobs.definition import JobDefinition
    from haze._jobs.views import JobsApp
    from haze.contracts.driver import Driver, Reserved

__all__ = [
    "Hooks",
    "Outcome",
    "OutcomeHook",
    "PlainQuiet",
    "QuietFor",
    "Run",
    "RunGuard",
    "Selective",
    "Skip",
    "Stage",
]


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


@dataclass(slots=True, eq=False, init=False)
class Run:
    """One attempt of one job, as execution and the hooks see it."""

    job: JobDefinition[Any]
    message: Message
    reserved: Reserved
    driver: Driver
    ctx: JobContext
    inline: bool
    payload: Any
    outcome: str
    error: BaseException | None
    #: What ``handle()`` returned (a success).
    result: Any
    #: Seconds until the job is due again (a retry or a release).
    delay: float
    #: ``delay`` as the driver will apply it (whole seconds on SQS): what logs say.
    shown_delay: float
    #: Why a skipped or cancelled run did not run; None: nothing to record.
    note: str | None
    #: Raised to the dispatch() caller after the run settled (a sync chain's next link).
    raise_after: BaseException | None
    #: The hooks its ``settling`` step chose; ``settled`` calls the same ones.
    hooks: list[OutcomeHook] | None
    #: Whether the handler was started (False: skipped or cancelled before it ran).
    started: bool

    def __init__(
        self,
        job: JobDefinition[Any],
        message: Message,
        reserved: Reserved,
        driver: Driver,
        app: JobsApp,
        inline: bool,
    ) -> None:
        # The job's context is built here, the one place both paths (``Execution`` and
        # a plain job carrying on) build it, in the frame the Run costs anyway.
        self.job = job
        self.message = message
        self.reserved = reserved
        self.driver = driver
        self.ctx = JobContext(
            id=message.id,
            name=job.name,
            attempt=reserved.attempt,
            tries=job.tries,
            queue=message.queue,
            connection=driver.name,
            app=app,
            message=message,
        )
        self.inline = inline
        self.payload = self.result = None
        self.outcome = ""
        self.error = self.raise_after = None
        self.delay = self.shown_delay = 0.0
        self.note = None
        self.hooks = None
        self.started = False

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


@runtime_checkable
class Selective(Protocol):
    """A hook or guard that can tell, without awaiting, that a run is none of its
    business: most runs are plain (no chain, batch, lock, record or listener), and
    awaiting every hook's two steps for them was a large share of a job's cost."""

    def wants(self, run: Run) -> bool:
        """False: neither step (or ``admit``) would do anything for ``run`` as it is now."""


@runtime_checkable
class PlainQuiet(Selective, Protocol):
    """A ``Selective`` hook or guard that declares, once, that it never wants a run of a
    plain message (no meta, lock, chain, catch or batch) that succeeded without adding
    a chain link, nor (a guard) such a message before it runs. ``Hooks`` then does not
    even ask it for those runs: a plain job is most jobs, and one call per hook per job
    was a large share of its cost."""

    plain_quiet: bool


@runtime_checkable
class QuietFor(Protocol):
    """A hook that can tell from the job alone that its ``wants`` is False for every
    plain success of it (an option not set): a plain job then runs with no ``Run``
    built for the hooks (``haze._engine.plain``). Asked once per job definition, so
    the answer may depend on nothing else, except the ``before`` and ``after``
    listeners of the queue events, which the short path reads at every claim."""

    def quiet_for(self, job: JobDefinition[Any]) -> bool:
        """True: ``wants`` is False for a plain success of ``job`` (with no ``before``
        or ``after`` listener)."""


#: A hook or guard with its ``wants`` (None: it always runs).
_Entry = tuple[Any, "Callable[[Run], bool] | None"]


class Hooks:
    """The hooks and guards of one app's engine, in stage order.

    A hook that is ``Selective`` is skipped for the runs it does not want; which
    hooks a run's ``settled`` step calls is decided once, in its ``settling`` step,
    from the same state (the outcome is set before either step)."""

    def __init__(self) -> None:
        self._hooks: list[tuple[int, int, OutcomeHook]] = []
        self._ordered: tuple[_Entry, ...] = ()
        #: ``_ordered`` without the ``PlainQuiet`` ones: what a plain success asks
        self._loud: tuple[_Entry, ...] = ()
        self.guards: list[RunGuard] = []
        self._guards: tuple[_Entry, ...] = ()
        self._loud_guards: tuple[_Entry, ...] = ()
        #: each loud hook's ``quiet_for`` (None: a loud hook cannot tell, so no job
        #: takes the short path)
        self._quiet_for: tuple[Callable[[JobDefinition[Any]], bool], ...] | None = ()

    def add(self, hook: OutcomeHook, stage: Stage) -> None:
        self._hooks.append((int(stage), len(self._hooks), hook))
        ordered = [h for _, _, h in sorted(self._hooks, key=lambda x: x[:2])]
        self._ordered = tuple(_entry(h) for h in ordered)
        self._loud = tuple(e for e in self._ordered if not _quiet(e[0]))
        loud = [h for h, _ in self._loud]
        fits = all(isinstance(h, QuietFor) for h in loud)
        self._quiet_for = tuple(h.quiet_for for h in loud) if fits else None

    def guard(self, guard: RunGuard) -> None:
        self.guards.append(guard)
        self._guards = tuple(_entry(g) for g in self.guards)
        self._loud_guards = tuple(e for e in self._guards if not _quiet(e[0]))

    def plain_success_quiet(self, job: JobDefinition[Any]) -> bool:
        """Whether a plain run of ``job`` that succeeds needs no hook and no guard (with
        no ``before`` or ``after`` listener): ``choose`` and ``guarded`` would find none."""
        checks = self._quiet_for
        if checks is None or self._loud_guards:
            return False
        for quiet in checks:  # noqa: SIM110 - all(<genexpr>) costs a frame, per job
            if not quiet(job):
                return False
        return True

    def wanted(self, run: Run) -> list[OutcomeHook]:
        """The hooks that have something to do for ``run`` (often none)."""
        return [h for h, wants in self._ordered if wants is None or wants(run)]

    def choose(self, run: Run) -> list[OutcomeHook]:
        """Decide (once) which hooks settle ``run``: both steps call the same ones."""
        hooks = run.hooks
        if hooks is None:
            # wanted(), without its two frames: this runs for every job
            hooks = []
            m, ctx = run.message, run.ctx
            entries = (
                self._loud
                if run.outcome == Outcome.SUCCESS
                and m.meta is None
                and m.unique is None
                and m.batch_id is None
                and m.chain_id is None
                and not m.chain
                and not m.chain_catch
                and not ctx._chain_appended
                and not ctx._chain_prepended
                else self._ordered
            )
            for hook, wants in entries:
                if wants is None or wants(run):
                    hooks.append(hook)
            run.hooks = hooks
        return hooks

    async def settling(self, run: Run) -> None:
        for hook in self.choose(run):
            await hook.settling(run)

    async def settled(self, run: Run) -> None:
        for hook in self.choose(run):
            await hook.settled(run)

    def guarded(self, run: Run) -> bool:
        """Whether any guard wants to look at ``run`` before it runs."""
        # A loop, not any(<genexpr>): this runs for every job, and the generator's frame
        # cost more than the one guard it usually asks.
        m = run.message
        plain = (
            m.meta is None
            and m.unique is None
            and m.batch_id is None
            and m.chain_id is None
            and not m.chain
            and not m.chain_catch
        )
        for _, wants in self._loud_guards if plain else self._guards:
            if wants is None or wants(run):
                return True
        return False

    async def admit(self, run: Run) -> Skip | None:
        for guard, wants in self._guards:
            if wants is not None and not wants(run):
                continue
            skip: Skip | None = await guard.admit(run)
            if skip is not None:
                return skip
        return None


def _quiet(hook: Any) -> bool:
    return isinstance(hook, PlainQuiet) and hook.plain_quiet


def _entry(hook: Any) -> _Entry:
    return hook, hook.wants if isinstance(hook, Selective) else None
