"""Periodic jobs: ``schedule(job, cron=...)`` or ``schedule(job, every=...)``.

Declare schedules in ``config/schedule.py`` (the app loads it after the jobs) or in any
app module; ``haze schedule:work`` or ``haze queue:work --schedule`` dispatches them.

>>> from haze import schedule
>>> # schedule(send_report.with_({"kind": "daily"}), cron="0 9 * * *", tz="Europe/Paris")
>>> # schedule(prune_tokens, every="15m")

Each tick's job runs once however many schedulers run, and whichever of them dies: a
scheduler takes a short lease on the tick with ``store.add`` on (schedule name, fire
time) in the app's shared store, dispatches with the tick's once key, then marks the
tick done (see ``_fire``). A manual ``schedule:run`` is no tick: no claim, no once key.

One scheduler at a time holds a leader lease and does the work; the others only try to
take the lease, so an idle fleet costs one store call per few seconds each.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from haze._base.durations import Duration, parse_duration
from haze._base.errors import ConfigError, MissingDependencyError, ScheduleError
from haze._base.hints import did_you_mean
from haze._engine.hooks import Outcome, Run
from haze._jobs.definition import JobDefinition, PendingDispatch

if TYPE_CHECKING:
    from haze._engine.manager import QueueManager
    from haze._engine.view import EngineApp
    from haze.stores import Store

__all__ = ["Schedule", "Scheduler", "registered_schedules", "schedule"]

log = logging.getLogger("haze")

#: A tick up to this late still fires (a leader handover, a restart, a slow store);
#: older ones were missed: skipped, or the latest replayed with ``catch_up=True``.
MISFIRE_GRACE = 60.0
#: How long the leader lease lasts without renewal (a dead leader is replaced after it).
LEASE = 10.0
#: The shortest ``every=``: a tick is claimed in the store, which is no sub-second clock.
MIN_EVERY = 1.0

_LEADER_KEY = "haze:schedule:leader"


@dataclass(eq=False)
class Schedule:
    """One declared schedule: what to dispatch and when. Made by :func:`schedule`."""

    name: str
    pending: PendingDispatch[Any]
    cron: str | None
    every: float | None
    tz: str | None
    catch_up: bool
    origin: str
    _zone: Any = field(default=None, repr=False)

    @property
    def job_name(self) -> str:
        return self.pending.job.name

    def describe(self) -> str:
        """``cron 0 9 * * * (Europe/Paris)`` or ``every 15m``."""
        if self.cron is not None:
            return f"cron {self.cron}" + (f" ({self.tz})" if self.tz else " (UTC)")
        assert self.every is not None
        return f"every {_format_every(self.every)}"

    def next_after(self, t: datetime) -> datetime:
        """The first fire time strictly after ``t`` (aware, UTC)."""
        return next(self.fire_times(t))

    def fire_times(self, after: datetime, until: datetime | None = None) -> Iterator[datetime]:
        """Fire times in ``(after, until]`` (unbounded without ``until``), in UTC."""
        if self.every is not None:
            step = self.every
            n = math.floor(after.timestamp() / step) + 1
            while True:
                at = datetime.fromtimestamp(n * step, UTC)
                if until is not None and at > until:
                    return
                yield at
                n += 1
        from cronsim import CronSim

        assert self.cron is not None
        start = after.astimezone(self._zone or UTC)
        # CronSim works in whole seconds and yields times after its start.
        it = CronSim(self.cron, start.replace(microsecond=0))
        for local in it:
            at = local.astimezone(UTC)
            if at <= after:
                continue
            if until is not None and at > until:
                return
            yield at

    def latest_at_or_before(self, t: datetime) -> datetime | None:
        """The last fire time at or before ``t`` (UTC), None when there is none in a year."""
        if self.every is not None:
            return datetime.fromtimestamp(math.floor(t.timestamp() / self.every) * self.every, UTC)
        from cronsim import CronSim

        assert self.cron is not None
        local = t.astimezone(self._zone or UTC)
        if local.microsecond == 0:
            local = local + timedelta(microseconds=1)  # reverse iteration starts below t
        it = CronSim(self.cron, local, reverse=True)
        for candidate in it:
            at = candidate.astimezone(UTC)
            if at <= t:
                return at
            if t - at > timedelta(days=366):  # pragma: no cover - defensive
                return None
        return None  # pragma: no cover

    def is_due_at(self, t: datetime) -> bool:
        """True when ``t`` (to the second) is one of this schedule's fire times."""
        t = t.astimezone(UTC).replace(microsecond=0)
        return self.next_after(t - timedelta(seconds=1)) == t

    def tick_key(self, at: datetime) -> str:
        return f"haze:schedule:{self.name}:{round(at.timestamp() * 1000)}"

    def __repr__(self) -> str:
        return f"<Schedule {self.name!r} {self.describe()} -> {self.job_name}>"


_registry: dict[str, Schedule] = {}


def registered_schedules() -> dict[str, Schedule]:
    """Every declared schedule by name, in declaration order."""
    return dict(_registry)


def _format_every(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _caller_origin() -> str:
    frame = sys._getframe(2)  # the caller of schedule()
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _zone(tz: str, where: str) -> Any:
    try:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError
    except ImportError:  # pragma: no cover - every supported Python has zoneinfo
        raise ScheduleError(f"{where}: tz needs the zoneinfo module") from None
    try:
        return ZoneInfo(tz)
    except ZoneInfoNotFoundError:
        raise ScheduleError(
            f"{where}: tz {tz!r} is not a known time zone; use an IANA name such as "
            "'Europe/Paris' or 'America/New_York' (where the system has no zone database, "
            "pip install tzdata)"
        ) from None
    except (ValueError, TypeError) as e:
        raise ScheduleError(f"{where}: tz {tz!r} is not a time zone name ({e})") from None


def _check_cron(cron: object, where: str) -> str:
    if not isinstance(cron, str) or not cron.strip():
        raise ScheduleError(
            f"{where}: cron must be a cron expression such as '0 9 * * *', got {cron!r}"
        )
    expr = " ".join(cron.split())
    try:
        from cronsim import CronSim, CronSimError
    except ImportError:
        raise MissingDependencyError("schedule(cron=...)", "schedule", "cronsim") from None
    fields = len(expr.split())
    if fields not in (5, 6):
        raise ScheduleError(
            f"{where}: cron {cron!r} has {fields} fields; give 5 (minute hour day-of-month "
            "month day-of-week, e.g. '0 9 * * *') or 6 with seconds first"
        )
    try:
        CronSim(expr, datetime.now(UTC))
    except CronSimError as e:
        raise ScheduleError(
            f"{where}: cron {cron!r} is not a valid cron expression ({e}); fields are minute "
            "hour day-of-month month day-of-week, e.g. '0 9 * * *'"
        ) from None
    return expr


def schedule(
    job_or_pending: JobDefinition[Any] | PendingDispatch[Any],
    cron: str | None = None,
    every: Duration | None = None,
    tz: str | None = None,
    name: str | None = None,
    catch_up: bool = False,
) -> Schedule:
    """Dispatch a job periodically: on a ``cron`` expression (in ``tz``, default UTC) or
    ``every`` fixed interval (aligned to the Unix epoch, so ``every="15m"`` fires at
    :00, :15, :30 and :45).

    ``name`` (default: the job's name) identifies the schedule: it must be unique, and
    ``haze schedule:run NAME`` fires it. A tick missed while no scheduler ran is skipped,
    or, with ``catch_up=True``, the latest missed tick is dispatched when one starts.

    >>> # schedule(send_report.with_({"kind": "daily"}), cron="0 9 * * *",
    >>> #          tz="Europe/Paris", name="daily-report")
    >>> # schedule(prune_tokens, every="15m")
    """
    origin = _caller_origin()
    pending = _pending_of(job_or_pending, origin)
    label = pending.job.name if name is None else name
    if not isinstance(label, str) or not label.strip() or len(label) > 200:
        raise ScheduleError(
            f"schedule ({origin}): name must be a non-empty string of at most 200 "
            f"characters, got {name!r}"
        )
    where = f'schedule "{label}" ({origin})'
    if (cron is None) == (every is None):
        raise ScheduleError(f"{where}: give exactly one of cron='0 9 * * *' or every='15m'")
    if not isinstance(catch_up, bool):
        raise ScheduleError(f"{where}: catch_up must be True or False, got {catch_up!r}")
    zone = None
    if tz is not None:
        zone = _zone_of(tz, every, where)
    seconds: float | None = None
    expr: str | None = None
    if every is not None:
        seconds = _every_seconds(every, where)
    else:
        expr = _check_cron(cron, where)
    made = Schedule(label, pending, expr, seconds, tz, catch_up, origin, zone)
    existing = _registry.get(label)
    if existing is not None and existing.origin != origin:
        raise ScheduleError(
            f'two schedules are named "{label}": {existing.origin} and {origin}; '
            'pass name="..." to one of them'
        )
    _registry[label] = made  # the same declaration read again (another App) replaces itself
    return made


def _pending_of(job_or_pending: object, origin: str) -> PendingDispatch[Any]:
    if isinstance(job_or_pending, JobDefinition):
        pending: PendingDispatch[Any] = job_or_pending.with_()
        return pending
    if isinstance(job_or_pending, PendingDispatch):
        return job_or_pending
    raise ScheduleError(
        f"schedule ({origin}): expected a job (from @define_job) or job.with_(payload), "
        f"got {type(job_or_pending).__name__} {job_or_pending!r}"
    )


def _zone_of(tz: object, every: Duration | None, where: str) -> Any:
    if every is not None:
        raise ScheduleError(
            f"{where}: tz applies to cron schedules; every= counts from the Unix epoch. "
            "For a time of day in a zone use cron, e.g. cron='0 0 * * *', tz=" + repr(tz)
        )
    if not isinstance(tz, str) or not tz:
        raise ScheduleError(f"{where}: tz must be a time zone name, got {tz!r}")
    return _zone(tz, where)


def _every_seconds(every: Duration, where: str) -> float:
    try:
        seconds = parse_duration(every, f"{where}: every", allow_zero=False)
    except ValueError as e:
        raise ScheduleError(str(e)) from None
    if seconds < MIN_EVERY:
        raise ScheduleError(f"{where}: every={every!r} is under 1s; the shortest is '1s'")
    return seconds


def get_schedule(name: str) -> Schedule:
    """The schedule called ``name``, or ``ScheduleError`` listing the known ones."""
    try:
        return _registry[name]
    except KeyError:
        known = ", ".join(_registry) or "none are declared (config/schedule.py)"
        raise ScheduleError(
            f"no schedule named {name!r}{did_you_mean(name, _registry)}; schedules: {known}"
        ) from None


# -- dispatching a tick ---------------------------------------------------------------


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


async def fire(
    app: EngineApp, sched: Schedule, at: datetime, *, store: Store | None = None
) -> bool:
    """Dispatch ``sched``'s tick at ``at`` unless another scheduler did or is doing it:
    True when this call dispatched it. See :func:`_fire` for the crash rules.
    """
    # A later trigger invocation may send it again up to UNSENT_KEEP on: its once key
    # must outlive that.
    owner = f"trigger-{uuid.uuid4().hex[:12]}"
    return await _fire(app, sched, at, store, owner=owner, resend=UNSENT_KEEP) == "sent"


async def _fire(
    app: EngineApp,
    sched: Schedule,
    at: datetime,
    store: Store | None,
    *,
    owner: str,
    lease: float | None = None,
    grace: float = MISFIRE_GRACE,
    resend: float = 0.0,
) -> str:
    """``"sent"`` (this call dispatched the tick), ``"done"`` (someone did) or ``"busy"``
    (another scheduler holds the tick's lease: ask again after it).

    Three writes: the claim (:func:`_claim`: a record of the tick, "claimed, not sent",
    with the claimer's lease), the dispatch, then the tick key set to done for the rest
    of the grace window. The message carries a once key (:func:`tick_once_key`): however
    many messages a tick gets, the first to run claims it and the others are acked
    unrun. A scheduler or trigger invocation that dies holding the claim leaves the
    record: whichever asks after its lease ended (the new leader while the tick is in
    grace, a later trigger invocation within :data:`UNSENT_KEEP`) sends the tick again,
    and it runs once either way.
    """
    lease = LEASE if lease is None else lease
    key = sched.tick_key(at)
    meta: dict[str, Any] = {"schedule": sched.name, "fire_at": at.isoformat()}
    options: dict[str, Any] = {}
    held: tuple[str, str] | None = None
    if store is not None:
        claim = await _claim(store, key, owner, lease)
        if isinstance(claim, str):
            return claim
        held = claim
        meta["once"] = tick_once_key(sched, at)
        meta["once_ttl"] = tick_window(sched, at, grace, lease) + resend
        if held[0] != key:
            resent = await _resend_id(app, meta["once"])
            if resent is None:  # the dead one's message has started: it runs the tick
                await _mark_sent(store, sched, key, at, grace * 2 + lease)
                return "done"
            options["id"] = resent
            log.warning(
                'haze: schedule "%s" sends its tick of %s, which a scheduler claimed and '
                "stopped before marking it sent",
                sched.name,
                at.isoformat(),
            )
    try:
        await app.manager.dispatch(sched.pending, meta=meta, **options)
    except BaseException:
        if store is not None and held is not None:
            try:
                await store.delete(held[0], owner=held[1])
            except Exception:  # the lease expires by itself; the dispatch error matters
                log.debug("haze: could not drop the claim on %s", key, exc_info=True)
        raise
    if store is not None:
        await _mark_sent(store, sched, key, at, grace * 2 + lease)
    return "sent"


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


def tick_window(
    sched: Schedule, at: datetime, grace: float = MISFIRE_GRACE, lease: float = LEASE
) -> float:
    """Seconds a tick's once key (and its end marker) is kept: until the next tick, plus
    the grace in which a scheduler may still send this one and a claim's lease (a
    platform trigger's tick adds ``UNSENT_KEEP``, while a later invocation may re-send
    it). A per-second schedule keeps about two minutes of ticks, not a week of them."""
    return (sched.next_after(at) - at).total_seconds() + 2 * grace + lease


def tick_ended_key(sched_once_key: str) -> str:
    """Set when a tick's job has ended (done, failed or cancelled): see ``TickEnd``."""
    return sched_once_key + ":end"


class TickEnd:
    """Outcome hook: marks a tick's job as ended, so that the scheduler can tell at the
    next tick whether it is still queued (no once key yet) or still running (no end
    marker) and warn that the schedule outruns its job."""

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


async def run_now(app: EngineApp, name: str) -> Schedule:
    """Dispatch schedule ``name`` once now (``haze schedule:run NAME``): not a tick, so
    no claim and no once key (each manual run runs), and the timetable is untouched."""
    sched = get_schedule(name)
    now = datetime.now(UTC)
    await app.manager.dispatch(
        sched.pending, meta={"schedule": sched.name, "fire_at": now.isoformat(), "manual": True}
    )
    return sched


async def dispatch_due(
    app: EngineApp, at: datetime, schedules: Sequence[Schedule] | None = None
) -> list[str]:
    """Dispatch the schedules (default: all) that fire at ``at`` — a platform trigger's
    scheduled time (Cloudflare cron trigger, EventBridge rule). Returns their names.

    Where the app has a shared store, the claim on (name, fire time) keeps a trigger
    delivered twice to one dispatch, and the once key to one run.
    """
    at = at.astimezone(UTC).replace(microsecond=0)
    store = _tick_store(app)
    fired: list[str] = []
    for sched in registered_schedules().values() if schedules is None else schedules:
        if sched.is_due_at(at) and await fire(app, sched, at, store=store):
            fired.append(sched.name)
    return fired


# -- the scheduler loop -----------------------------------------------------------------


class Scheduler:
    """Runs the app's schedules: ``haze schedule:work`` and ``haze queue:work --schedule``.

    Any number may run against one shared store. The one holding the leader lease
    dispatches; the others retry the lease every few seconds. A new leader resumes from
    the last dispatched tick, so a handover within :data:`MISFIRE_GRACE` loses nothing.

    >>> # async with App(root="."):
    >>> #     await Scheduler(use_app()).run()   # until cancelled
    """

    def __init__(
        self,
        app: EngineApp,
        *,
        schedules: Sequence[Schedule] | None = None,
        lease: float = LEASE,
        grace: float = MISFIRE_GRACE,
        on_fire: Callable[[Schedule, datetime], None] | None = None,
    ) -> None:
        self.app = app
        self.on_fire = on_fire
        self.schedules = list(registered_schedules().values() if schedules is None else schedules)
        self.lease = lease
        self.grace = grace
        self.id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.leader = False
        self.dispatched = 0
        self._cursors: dict[str, datetime] = {}
        #: the last tick of each schedule this scheduler sent, and when it last warned
        #: that a tick's job was still queued or running at the next one
        self._sent: dict[str, datetime] = {}
        self._warned: dict[str, float] = {}
        self._renewed = 0.0
        self._store: Store | None = None

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = self.app.queue_store
            if not self._store.shared:
                log.warning(
                    "haze: the scheduler's store %r is not shared between processes: run one "
                    "scheduler only, or each tick is dispatched by every one",
                    self._store.name,
                )
        return self._store

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Step until ``stop`` is set (or the task is cancelled); releases the lease."""
        stop = stop or asyncio.Event()
        try:
            while not stop.is_set():
                try:
                    wait = await self.step()
                except Exception as e:
                    # An unreachable store or queue: keep the process, try again soon.
                    log.warning(
                        "haze: the scheduler could not run its step: %s: %s", type(e).__name__, e
                    )
                    wait = self.lease / 3
                try:
                    await asyncio.wait_for(stop.wait(), timeout=wait)
                except TimeoutError:
                    pass
        finally:
            if self.leader and self._store is not None:
                try:
                    await self._store.delete(_LEADER_KEY, owner=self.id)
                except Exception:  # the lease expires by itself
                    log.debug("haze: could not release the scheduler lease", exc_info=True)

    async def step(self, now: datetime | None = None) -> float:
        """One round: hold or take the lease, dispatch due ticks. Returns seconds to wait."""
        if not self.schedules:
            return self.lease
        now = now or datetime.now(UTC)
        store = self.store
        mono = time.monotonic()
        if not self.leader:
            if not await store.add(_LEADER_KEY, self.id, self.lease):
                return self.lease / 3
            self.leader = True
            self._renewed = mono
            await self._resume(now)
        elif mono - self._renewed >= self.lease / 3:
            # Owner-checked renewal. Even two leaders at once (a stalled one whose lease
            # ran out) run each tick once: each tick has its own claim and once key.
            if not await store.touch(_LEADER_KEY, self.id, self.lease):
                self.leader = False
                log.info("haze: scheduler %s lost the leader lease", self.id)
                return self.lease / 3
            self._renewed = mono
        for sched in self.schedules:
            await self._run_schedule(sched, now)
        soonest = min(s.next_after(now) for s in self.schedules)
        until = (soonest - datetime.now(UTC)).total_seconds()
        return max(0.05, min(until, self.lease / 3))

    async def _resume(self, now: datetime) -> None:
        """Set each schedule's cursor from the last tick any scheduler dispatched."""
        store = self.store
        for sched in self.schedules:
            last = await store.get(f"haze:schedule:{sched.name}:last")
            if isinstance(last, (int, float)):
                self._cursors[sched.name] = datetime.fromtimestamp(float(last), UTC)
            else:
                # Never fired: nothing was missed. Recorded, so that a leader after this
                # one resumes from here and still sends a first tick this one claimed
                # and died before sending.
                self._cursors[sched.name] = now
                await store.add(f"haze:schedule:{sched.name}:last", now.timestamp())

    async def _warn_if_behind(self, sched: Schedule, at: datetime) -> None:
        """Warn (at most once a minute per schedule) when the job of the tick sent before
        ``at`` has not ended: the schedule fires faster than its job runs, and the
        backlog grows."""
        previous = self._sent.get(sched.name)
        mono = time.monotonic()
        if previous is None or mono - self._warned.get(sched.name, -math.inf) < 60:
            return
        once = tick_once_key(sched, previous)
        try:
            started, ended = await self.app.manager.stores.batches().get_many(
                [once, tick_ended_key(once)]
            )
        except Exception:  # a warning's input only
            log.debug("haze: could not read the state of %s", once, exc_info=True)
            return
        if ended is not None:
            return
        self._warned[sched.name] = mono
        log.warning(
            'haze: schedule "%s": the job of its tick of %s is still %s at the next tick '
            "(%s); the schedule fires faster than its job runs, so the queue keeps growing. "
            "Fire it less often, or make the job faster",
            sched.name,
            previous.isoformat(),
            "queued" if started is None else "running",
            at.isoformat(),
        )

    async def _run_schedule(self, sched: Schedule, now: datetime) -> None:
        cursor = self._cursors.get(sched.name, now)
        edge = now - timedelta(seconds=self.grace)
        due = list(sched.fire_times(max(cursor, edge), now))
        if not due and sched.catch_up and cursor < edge:
            missed = sched.latest_at_or_before(edge)
            if missed is not None and missed > cursor:
                due = [missed]
                log.info(
                    'haze: schedule "%s" catches up its tick of %s', sched.name, missed.isoformat()
                )
        for at in due:
            await self._warn_if_behind(sched, at)
            try:
                outcome = await _fire(
                    self.app,
                    sched,
                    at,
                    self.store,
                    owner=self.id,
                    lease=self.lease,
                    grace=self.grace,
                )
                if outcome == "busy":
                    # Another scheduler holds this tick (a stalled leader, or a dead one
                    # whose lease has not run out): the cursor stays before it, so it is
                    # asked about again next step and sent if that lease expires unmarked.
                    return
                if outcome == "sent":
                    self.dispatched += 1
                    self._sent[sched.name] = at
                    if self.on_fire is not None:
                        self.on_fire(sched, at)
            except Exception as e:
                # The cursor stays before this tick: it is tried again while in grace.
                log.warning(
                    'haze: schedule "%s" could not dispatch its tick of %s: %s: %s',
                    sched.name,
                    at.isoformat(),
                    type(e).__name__,
                    e,
                )
                return
            self._cursors[sched.name] = at
        self._cursors[sched.name] = now


# -- platform triggers (Cloudflare Cron Triggers, EventBridge rules) --------------------------

_UTC_NAMES = {"UTC", "Etc/UTC", "Etc/UCT", "UCT", "Etc/GMT", "GMT", "Zulu", "Etc/Zulu"}


def _whole_hour_zone(sched: Schedule) -> bool:
    """True when every offset of the zone this year and next is a whole number of hours."""
    year = datetime.now(UTC).year
    for y in (year, year + 1):
        for month in range(1, 13):
            for day in (1, 15):
                offset = datetime(y, month, day, 12, tzinfo=UTC).astimezone(sched._zone)
                delta = offset.utcoffset() or timedelta(0)
                if delta.total_seconds() % 3600:
                    return False
    return True


def utc_cron(sched: Schedule, platform: str = "Cloudflare") -> str:
    """The 5-field UTC cron of the trigger that wakes ``sched`` on a platform whose cron
    triggers run in UTC at minute resolution. ``ScheduleError`` when there is none.

    A schedule with a time zone gets a trigger every hour at its minutes (the hour and
    day in UTC move with daylight saving time); the handler dispatches it only at the
    triggers where it is due in its zone.
    """
    where = f'schedule "{sched.name}" ({sched.origin})'
    if sched.every is not None:
        seconds = sched.every
        minutes, rest = divmod(seconds, 60)
        if not rest:
            m = int(minutes)
            if m < 60 and 60 % m == 0:
                return "* * * * *" if m == 1 else f"*/{m} * * * *"
            if m % 60 == 0:
                h = m // 60
                if h < 24 and 24 % h == 0:
                    return "0 * * * *" if h == 1 else f"0 */{h} * * *"
                if h == 24:
                    return "0 0 * * *"
        raise ScheduleError(
            f"{where}: every={_format_every(seconds)} has no {platform} cron trigger, which "
            "fires on whole minutes: use an interval that divides an hour (1m, 5m, 15m, 30m) "
            "or a day (1h, 2h, 6h, 12h, 1d), or cron="
        )
    assert sched.cron is not None
    fields = sched.cron.split()
    if len(fields) == 6:
        if fields[0] != "0":
            raise ScheduleError(
                f"{where}: cron {sched.cron!r} has a seconds field; {platform} cron triggers "
                "fire on whole minutes: use 5 fields"
            )
        fields = fields[1:]
    if sched.tz is None or sched.tz in _UTC_NAMES:
        return " ".join(_days(fields, sched, where))
    if not _whole_hour_zone(sched):
        raise ScheduleError(
            f"{where}: tz {sched.tz!r} is not a whole number of hours from UTC, and {platform} "
            "cron triggers run in UTC: write the cron in UTC (drop tz)"
        )
    return f"{fields[0]} * * * *"


def _trigger_dow(value: str, where: str) -> str:
    """Cron day-of-week (0-7, Sunday 0 or 7) to the triggers' (1-7, Sunday 1): Cloudflare
    Cron Triggers and EventBridge count weekdays the Quartz way."""

    def one(day: int) -> int:
        return day % 7 + 1

    out: list[str] = []
    for item in value.split(","):
        suffix = ""
        if "#" in item:
            item, nth = item.split("#", 1)
            suffix = f"#{nth}"
        elif item.endswith("L") and item[:-1].isdigit():
            item, suffix = item[:-1], "L"
        base, _, every = item.partition("/")
        if item.isdigit():
            out.append(f"{one(int(item))}{suffix}")
        elif (base == "*" or re.fullmatch(r"\d-\d", base)) and (not every or every.isdigit()):
            lo, hi = (0, 6) if base == "*" else (int(p) for p in base.split("-"))
            days = [one(d) for d in range(lo, hi + 1, int(every or 1))]
            if not every and base != "*" and days == list(range(days[0], days[-1] + 1)):
                out.append(f"{days[0]}-{days[-1]}{suffix}")  # still a range: 1-5 -> 2-6
            else:
                out.extend(str(d) for d in days)
        elif all(p.isalpha() and len(p) == 3 for p in item.split("-", 1)):
            out.append(item.upper() + suffix)  # MON, MON-FRI: the triggers take the names
        else:
            raise ScheduleError(
                f"{where}: day-of-week {value!r} has no cron trigger form; use numbers, "
                "ranges or names (MON-FRI)"
            )
    return ",".join(dict.fromkeys(out))


def _days(fields: list[str], sched: Schedule, where: str) -> list[str]:
    """``fields`` (5, UTC) with the weekday counted from Sunday = 1; refuses a day of the
    month together with a day of the week (cron fires on either: no trigger says OR)."""
    minute, hour, dom, month, dow = fields
    if dow not in ("*", "?"):
        if dom not in ("*", "?"):
            raise ScheduleError(
                f"{where}: cron {sched.cron!r} names both a day of the month and a day of the "
                "week (it fires on either), which platform cron triggers cannot combine: "
                "split it into two schedules"
            )
        dow = _trigger_dow(dow, where)
    return [minute, hour, dom, month, dow]


def eventbridge_cron(sched: Schedule) -> str:
    """The ``cron(...)`` expression of the EventBridge rule that wakes ``sched`` (UTC,
    6 fields with a year, ``?`` in the day field it leaves open). See :func:`utc_cron`.
    """
    minute, hour, dom, month, dow = utc_cron(sched, "EventBridge").split()

    def step(field: str, start: str) -> str:
        return start + field[1:] if field.startswith("*/") else field

    minute, hour = step(minute, "0"), step(hour, "0")
    dom, month = step(dom, "1"), step(month, "1")
    if dow in ("*", "?"):
        dow = "?"
    else:
        dom = "?"
    return f"cron({minute} {hour} {dom} {month} {dow} *)"


def trigger_schedules(platform: str, trigger: str) -> list[Schedule]:
    """The schedules whose ``platform`` trigger (``"cloudflare"``: :func:`utc_cron`,
    ``"eventbridge"``: :func:`eventbridge_cron`) is ``trigger``."""
    wanted = " ".join(trigger.split())
    return [sched for sched, each in _triggered(platform) if each == wanted]


def _triggered(platform: str) -> list[tuple[Schedule, str]]:
    """Each schedule that has a ``platform`` trigger, with it."""
    convert = utc_cron if platform == "cloudflare" else eventbridge_cron
    found = []
    for sched in registered_schedules().values():
        try:
            found.append((sched, convert(sched)))
        except ScheduleError:
            continue  # the build reported it
    return found


def app_schedules(root: str | os.PathLike[str] | None) -> list[Schedule]:
    """The schedules declared in files under ``root`` (all of them without a root)."""
    from pathlib import Path

    schedules = list(registered_schedules().values())
    if root is None:
        return schedules
    base = Path(root).resolve()
    mine = []
    for sched in schedules:
        try:
            if Path(sched.origin.rsplit(":", 1)[0]).resolve().is_relative_to(base):
                mine.append(sched)
        except (OSError, ValueError):
            continue
    return mine


def bundle_packages(root: str | os.PathLike[str] | None) -> tuple[str, ...]:
    """The packages a bundle (Worker, Lambda zip) needs for the schedules under ``root``:
    cronsim for cron expressions, tzdata for time zones (Pyodide and slim images have no
    system zone database)."""
    schedules = app_schedules(root)
    extra: list[str] = []
    if any(s.cron is not None for s in schedules):
        extra.append("cronsim")
    if any(s.tz is not None for s in schedules):
        extra.append("tzdata")
    return tuple(extra)


def platform_triggers(
    platform: str, root: str | os.PathLike[str] | None = None
) -> dict[str, list[str]]:
    """Each distinct trigger of the schedules (declared under ``root``) on ``platform``
    -> their names. Raises the first ``ScheduleError`` (the build reports it)."""
    convert = utc_cron if platform == "cloudflare" else eventbridge_cron
    out: dict[str, list[str]] = {}
    for sched in app_schedules(root):
        out.setdefault(convert(sched), []).append(sched.name)
    return out


async def dispatch_trigger(app: EngineApp, platform: str, trigger: str, at: datetime) -> list[str]:
    """What a platform's cron handler does: the schedules of ``trigger`` due at ``at``
    (to the minute), dispatched once each. Returns their names.

    First it sends the ticks of every triggered schedule that an earlier invocation
    claimed and was killed before sending (:func:`send_unsent`)."""
    minute = at.astimezone(UTC).replace(second=0, microsecond=0)
    await send_unsent(app, minute, [sched for sched, _ in _triggered(platform)])
    schedules = trigger_schedules(platform, trigger)
    if not schedules:
        log.warning(
            "haze: the %s trigger %r matches no schedule of this app; rebuild and redeploy "
            "after changing config/schedule.py",
            platform,
            trigger,
        )
        return []
    return await dispatch_due(app, minute, schedules)


async def send_unsent(app: EngineApp, at: datetime, schedules: Sequence[Schedule]) -> None:
    """Send the ticks of ``schedules`` before ``at`` (the last :data:`UNSENT_SCAN` of
    each, within :data:`UNSENT_KEEP`) whose record still says claimed and not sent after
    its claimer's lease ended: a trigger invocation was killed between the claim and the
    dispatch. Each is claimed again first (:func:`_claim`), and runs once however many
    invocations send it (its once key). Errors are logged: the record stays for the next.
    """
    store = _tick_store(app)
    ticks = [(sched, t) for sched in schedules for t in _recent_ticks(sched, at)]
    if store is None or not ticks:
        return
    try:
        values = await store.get_many([sched.tick_key(t) for sched, t in ticks])
    except Exception as e:
        log.warning(
            "haze: could not look for claimed ticks that were not sent: %s: %s",
            type(e).__name__,
            e,
        )
        return
    for (sched, t), value in zip(ticks, values, strict=True):
        if not _unsent_and_free(value):
            continue
        try:
            await fire(app, sched, t, store=store)
        except Exception as e:
            log.warning(
                'haze: schedule "%s" could not dispatch its tick of %s: %s: %s',
                sched.name,
                t.isoformat(),
                type(e).__name__,
                e,
            )


def _recent_ticks(sched: Schedule, at: datetime) -> list[datetime]:
    """Up to :data:`UNSENT_SCAN` fire times of ``sched`` before ``at``, newest first,
    none older than :data:`UNSENT_KEEP` (no record lives longer)."""
    oldest = at - timedelta(seconds=UNSENT_KEEP)
    ticks: list[datetime] = []
    t: datetime | None = at
    while t is not None and len(ticks) < UNSENT_SCAN:
        t = sched.latest_at_or_before(t - timedelta(seconds=1))
        if t is None or t <= oldest:
            break
        ticks.append(t)
    return ticks
