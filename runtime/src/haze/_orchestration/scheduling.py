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
import logging
import math
import os
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from haze._orchestration.schedule_ticks import RESENT_ONCE_KEEP as RESENT_ONCE_KEEP
from haze._orchestration.schedule_ticks import UNSENT_KEEP as UNSENT_KEEP
from haze._orchestration.schedule_ticks import UNSENT_SCAN as UNSENT_SCAN
from haze._orchestration.schedule_ticks import TickEnd as TickEnd
from haze._orchestration.schedule_ticks import _claim as _claim
from haze._orchestration.schedule_ticks import _mark_sent as _mark_sent
from haze._orchestration.schedule_ticks import _resend_id as _resend_id
from haze._orchestration.schedule_ticks import _tick_store as _tick_store
from haze._orchestration.schedule_ticks import _unsent_and_free as _unsent_and_free
from haze._orchestration.schedule_ticks import tick_ended_key as tick_ended_key
from haze._orchestration.schedule_ticks import tick_once_key as tick_once_key
from haze._orchestration.schedule_triggers import _triggered as _triggered
from haze._orchestration.schedule_triggers import app_schedules as app_schedules
from haze._orchestration.schedule_triggers import bundle_packages as bundle_packages
from haze._orchestration.schedule_triggers import eventbridge_cron as eventbridge_cron
from haze._orchestration.schedule_triggers import platform_triggers as platform_triggers
from haze._orchestration.schedule_triggers import trigger_schedules as trigger_schedules
from haze._orchestration.schedule_triggers import utc_cron as utc_cron
from haze._orchestration.schedules import MIN_EVERY as MIN_EVERY
from haze._orchestration.schedules import Schedule as Schedule
from haze._orchestration.schedules import _registry as _registry
from haze._orchestration.schedules import get_schedule as get_schedule
from haze._orchestration.schedules import registered_schedules as registered_schedules
from haze._orchestration.schedules import schedule as schedule

if TYPE_CHECKING:
    from haze._engine.view import EngineApp
    from haze.stores import Store

__all__ = ["Schedule", "Scheduler", "registered_schedules", "schedule"]

log = logging.getLogger("haze")

#: A tick up to this late still fires (a leader handover, a restart, a slow store);
#: older ones were missed: skipped, or the latest replayed with ``catch_up=True``.
MISFIRE_GRACE = 60.0
#: How long the leader lease lasts without renewal (a dead leader is replaced after it).
LEASE = 10.0

_LEADER_KEY = "haze:schedule:leader"


# -- dispatching a tick ---------------------------------------------------------------


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


def tick_window(
    sched: Schedule, at: datetime, grace: float = MISFIRE_GRACE, lease: float = LEASE
) -> float:
    """Seconds a tick's once key (and its end marker) is kept: until the next tick, plus
    the grace in which a scheduler may still send this one and a claim's lease (a
    platform trigger's tick adds ``UNSENT_KEEP``, while a later invocation may re-send
    it). A per-second schedule keeps about two minutes of ticks, not a week of them."""
    return (sched.next_after(at) - at).total_seconds() + 2 * grace + lease


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
