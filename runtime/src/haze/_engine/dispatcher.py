"""The dispatch path, once for every driver: build -> defer -> lock -> encode -> route.

build message ─ (after-commit in a transaction? defer to COMMIT) ─ payload to JSON
(once) ─ debounce ─ unique lock ─ envelope to JSON ─ the app's recorder (a test fake),
or the connection's route (``_engine/route.py``: status record, then driver.enqueue;
an inline driver runs the job now)
"""

from __future__ import annotations

import copy
import logging
import time
from asyncio import get_running_loop
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from haze._base.crypto import encrypt_payload, seal, unseal
from haze._base.durations import check_delay
from haze._base.errors import DispatchIncompleteError, DispatchOutcomeUnknownError
from haze._base.json_text import copy_payload, copy_plain
from haze._base.message import (
    MAX_QUEUE_NAME,
    Message,
    check_queue_name,
    encode,
    encode_payload,
    encode_with,
    is_plain,
    new_id,
)
from haze._engine.offload import Offload, reference
from haze._engine.partial import Sent
from haze._engine.route import Route, RunInline, checked_size
from haze._jobs.context import _tenant
from haze._jobs.definition import DispatchResult, PendingDispatch
from haze.contracts.plain import PlainQueue
from haze.transactions import current_transaction

if TYPE_CHECKING:
    from haze._engine.local import LocalWorker
    from haze._engine.locks import Locks
    from haze._engine.otel import TelemetrySlot
    from haze._engine.tracking import Tracking
    from haze._engine.view import EngineApp
    from haze._jobs.definition import JobDefinition
    from haze.contracts.driver import Driver

__all__ = ["Dispatcher"]

log = logging.getLogger("haze")
_time = time.time

Batch = list[tuple[str, Message, float]]
#: A payload this close to a connection's size limit has its envelope's size checked
#: before its locks are taken (an envelope and its marks are far smaller).
_ENVELOPE_ROOM = 4096


#: Payload classes ``to_wire`` hands back as they are (checked here without its frame).
_WIRE = frozenset({dict, list, str, int, float, bool, type(None)})
#: A job's short path: (its queue, its connection, the driver, that driver's size limit
#: less what the envelope of a plain message adds besides its payload and tenant, whether
#: the app is the implicit default one).
Plan = tuple[str, str, PlainQueue, int | None, bool]
_UNPLANNED: Any = object()


class Dispatcher:
    """Dispatch for one app."""

    def __init__(
        self,
        app: EngineApp,
        locks: Locks,
        tracking: Tracking,
        telemetry: TelemetrySlot,
        *,
        run_inline: RunInline,
        ensure_local_worker: Callable[[str], None],
        warn_implicit: Callable[[], None],
        offload: Offload | None = None,
        local_workers: Mapping[str, LocalWorker] | None = None,
    ) -> None:
        self.app = app
        self.offload = offload if offload is not None else Offload(app)
        self.locks = locks
        self.tracking = tracking
        self.telemetry = telemetry
        self.run_inline = run_inline
        self.ensure_local_worker = ensure_local_worker
        #: connection -> its running in-process consumer: a plain dispatch asks
        #: ``ensure_local_worker`` only when none is running on this loop
        self._local_workers: Mapping[str, LocalWorker] = (
            local_workers if local_workers is not None else {}
        )
        self.warn_implicit = warn_implicit
        #: connection -> its route, resolved on the connection's first dispatch
        self._routes: dict[str, Route] = {}
        #: job -> its short path (None: it has none), found on its first dispatch
        self._plans: dict[JobDefinition[Any], Plan | None] = {}

    # ------------------------------------------------------------ build and encode

    def resolve(
        self,
        pending: PendingDispatch[Any],
        *,
        queue: str | None = None,
        connection: str | None = None,
    ) -> tuple[str, str]:
        """Connection and queue, each by precedence: pending > chain/batch > define_job
        > the config's route for the job's name > the default (``haze._base.routes``)."""
        job = pending.job
        conn = pending._connection or connection or job.connection
        q = pending._queue or queue or job.queue
        if conn is None or q is None:
            route = self.app.queue_config.routes.match(job.name)
            if route is not None:
                conn = conn or route.connection
                q = q or route.queue
        if conn is None:  # the default connection: nothing to check
            return self.app.queue_config.default, q or "default"
        return self.app.connection_name(conn), q or "default"

    def build(
        self,
        pending: PendingDispatch[Any],
        connection: str,
        queue: str,
        *,
        id: str | None = None,
        chain: list[dict[str, Any]] | None = None,
        chain_id: str | None = None,
        chain_catch: list[dict[str, Any]] | None = None,
        batch_id: str | None = None,
        attempts: int = 0,
        meta: dict[str, Any] | None = None,
    ) -> Message:
        job = pending.job
        if queue.__class__ is not str or not 0 < len(queue) <= MAX_QUEUE_NAME or "," in queue:
            check_queue_name(queue, f'job "{job.name}": queue')  # raises, saying why
        payload = pending.payload
        if payload.__class__ not in _WIRE:  # a dataclass or model (a subclass: to_wire decides)
            payload = job.to_wire(payload)
        group = None if pending._group is None and job.group is None else pending._resolved_group()
        if group is not None:
            meta = {**(meta or {}), "group": group}
        known = self.tracking.meta
        track = known[job] if job in known else self.tracking.meta_for(job)
        if track is not None:
            meta = {**(meta or {}), **track}
        # Positional, in field order (as in Message.from_dict): keywords cost more.
        return Message(
            id or new_id(),  # id
            job.name,  # job
            payload,  # payload
            queue,  # queue
            connection,  # connection
            _time(),  # ts
            attempts,  # attempts
            _tenant.get(),  # tenant
            chain,  # chain
            chain_id,  # chain_id
            chain_catch,  # chain_catch
            batch_id,  # batch_id
            None,  # unique
            meta,  # meta
        )

    def route(self, connection: str) -> Route:
        """The route of ``connection`` (resolved on its first dispatch, then kept)."""
        route = self._routes.get(connection)
        if route is None:
            route = self._routes[connection] = Route(
                self.app,
                connection,
                self.app.driver(connection),
                tracking=self.tracking,
                locks=self.locks,
                run_inline=self.run_inline,
                ensure_local_worker=self.ensure_local_worker,
            )
        return route

    def encode(self, message: Message, driver: Driver, job: JobDefinition[Any]) -> str:
        """The body of a built ``message`` for ``driver``'s connection (size checked)."""
        return self._body(message, encode_payload(message.payload, message.job), driver, job)

    def _body(self, message: Message, payload: str, driver: Driver, job: JobDefinition[Any]) -> str:
        """The body, from the payload's JSON, its size checked."""
        return checked_size(self._unchecked(message, payload, job)[0], driver, job)

    def _unchecked(
        self, message: Message, payload: str, job: JobDefinition[Any]
    ) -> tuple[str, Message]:
        """The body and the message it encodes: encrypted for an ``encrypted`` job (a
        copy: the message keeps its plain payload for key functions, the fake and inline
        runs)."""
        if job.encrypted:
            sealed = copy.copy(message)
            encrypt_payload(self.app, sealed, payload)
            return encode(sealed), sealed
        return encode_with(message, payload), message

    async def _encoded(
        self, route: Route, message: Message, payload: str, job: JobDefinition[Any]
    ) -> tuple[str, Message]:
        """The body and the message it encodes, its payload offloaded first when the
        connection offloads and it is over the threshold (encrypted before the write)."""
        body, sent = self._unchecked(message, payload, job)
        plan = self.offload.plan(route.name) if route.recorder is None else None
        if plan is not None:
            content = sent.enc if sent.enc is not None else payload
            if self.offload.wanted(plan, content, body, route.driver):
                sent = await Offload.write(plan, sent, content, encrypted=sent.enc is not None)
                try:
                    return checked_size(encode(sent), route.driver, job, offloaded=True), sent
                except BaseException:
                    # nothing is queued: no message will ever read the object
                    await self.offload.discard(sent.meta, route.name)
                    raise
        return checked_size(body, route.driver, job), sent

    # ------------------------------------------------------------ one dispatch

    async def dispatch(
        self,
        pending: PendingDispatch[Any],
        *,
        queue: str | None = None,
        connection: str | None = None,
        chain: list[dict[str, Any]] | None = None,
        chain_id: str | None = None,
        chain_catch: list[dict[str, Any]] | None = None,
        batch_id: str | None = None,
        attempts: int = 0,
        id: str | None = None,
        defer: bool = True,
        meta: dict[str, Any] | None = None,
    ) -> DispatchResult:
        """Queue one pending dispatch (the path under ``Job.dispatch`` and ``with_().dispatch``)."""
        job = pending.job
        conn, q = self.resolve(pending, queue=queue, connection=connection)
        after_commit = (
            pending._after_commit if pending._after_commit is not None else job.after_commit
        )
        message = self.build(
            pending,
            conn,
            q,
            id=id,
            chain=chain,
            chain_id=chain_id,
            chain_catch=chain_catch,
            batch_id=batch_id,
            attempts=attempts,
            meta=meta,
        )
        # The option name is only formatted when there is a delay to check.
        delay = check_delay(pending._delay, f'job "{job.name}": delay') if pending._delay else 0.0
        if defer and after_commit:
            tx = current_transaction()
            if tx is not None:
                # a payload JSON cannot carry raises PayloadError now, not at COMMIT
                encode_payload(message.payload, message.job)
                encode(message)
                return self._defer(tx, message, job, delay)
        return await self.send(message, job, delay)

    def _defer(
        self, tx: Any, message: Message, job: JobDefinition[Any], delay: float
    ) -> DispatchResult:
        sealed: str | None = None
        if job.encrypted:
            # The buffer lives until COMMIT: it holds the payload encrypted, like the queue.
            sealed, message.payload = seal(self.app, message.payload, f"buffer:{message.id}"), None

        async def later() -> None:
            try:
                if sealed is not None:
                    message.payload = unseal(self.app, sealed, f"buffer:{message.id}", job.name)
                await self.send(message, job, delay)
            except Exception:
                log.exception('after-commit dispatch of job "%s" (%s) failed', job.name, message.id)

        tx.on_commit(later)
        return DispatchResult(message.id, skipped=False, deferred=True, chain_id=message.chain_id)

    def send(
        self, message: Message, job: JobDefinition[Any], delay: float
    ) -> Awaitable[DispatchResult]:
        """The message is built: lock, encode, and hand it to its route (in a producer
        span when telemetry is on and no test recorder takes it)."""
        assert message.connection is not None
        route = self._routes.get(message.connection)
        if route is None:
            route = self.route(message.connection)
        slot = self.telemetry
        otel = slot.value if slot.resolved else slot.get()
        if otel is not None and route.recorder is None:
            sent: Awaitable[DispatchResult] = otel.send(
                message, delay, lambda: self._send(route, message, job, delay)
            )
            return sent
        return self._send(route, message, job, delay)

    async def _send(
        self, route: Route, message: Message, job: JobDefinition[Any], delay: float
    ) -> DispatchResult:
        recorder = route.recorder
        if recorder is None:
            if self.app.implicit:
                self.warn_implicit()
            if self._kept(route, message, job, delay):
                return DispatchResult(message.id, chain_id=message.chain_id)
        # The payload is encoded once, before any lock: one JSON cannot carry fails here,
        # with nothing taken; the envelope is written after the locks marked it.
        payload = encode_payload(message.payload, message.job)
        locked = message.batch_id is None and (job.debounce is not None or job.unique is not None)
        if locked:
            self._check_before_locks(message, payload, route, job)
            if job.debounce is not None:
                delay = await self.locks.debounce(job, message, delay)
            if job.unique is not None:
                holder = await self.locks.lock(job, message, route.driver)
                if holder is not None:
                    if recorder is not None:
                        recorder.record_skipped(job, message)
                    return DispatchResult(holder, skipped=True, chain_id=message.chain_id)
        try:
            body, sent = await self._encoded(route, message, payload, job)
        except BaseException:
            # Too large with the lock's few bytes: a lock held for a job that was never
            # queued would block every dispatch until it expires.
            await self.locks.unlock(message)
            raise
        if recorder is not None:
            recorder.record(job, message, delay)
        elif reference(sent.meta) is None:
            keep = route.keeper is not None and not job.encrypted and is_plain(message)
            await route.send(message, body, payload, delay, keep=keep)
        else:
            await self._send_offloaded(route, sent, body, payload, delay)
        return DispatchResult(message.id, chain_id=message.chain_id)

    async def _send_offloaded(
        self, route: Route, sent: Message, body: str, payload: str, delay: float
    ) -> None:
        """Queue a message whose payload was offloaded; its object goes when the
        enqueue fails (a crash here leaves it to ``queue:prune-offload``)."""
        try:
            await route.send(sent, body, payload, delay, keep=False)
        except BaseException:
            await self.offload.discard(sent.meta, route.name)
            raise

    def _kept(self, route: Route, message: Message, job: JobDefinition[Any], delay: float) -> bool:
        """An in-process queue keeps a plain message with a structural copy of its
        payload (what JSON would give back): no body is written, no JSON read at the
        claim. A payload outside what ``copy_plain`` copies, or that might come near the
        size limit, takes the JSON path, which refuses it or checks its size exactly."""
        if (
            route.keeper is None
            or job.encrypted
            or job.unique is not None
            or job.debounce is not None
            or not is_plain(message)
            or self.offload.plan(route.name) is not None  # its threshold needs the JSON size
        ):
            return False
        copied = copy_plain(message.payload)
        if copied is None:
            return False
        limit = route.driver.max_message_size
        if limit is not None:
            fields = len(message.id) + len(message.job) + len(message.queue)
            fields += len(message.connection or "") + len(message.tenant or "")
            if copied[1] + 6 * fields + _ENVELOPE_ROOM > limit:
                return False
        return route.keep(message, copied[0], delay)

    def _check_before_locks(
        self, message: Message, payload: str, route: Route, job: JobDefinition[Any]
    ) -> None:
        """Refuse a message over the size limit before a lock or a debounce mark is
        written for it (a mark for a message never queued would drop its burst). Only a
        payload within a few KiB of the limit costs an envelope encoded here."""
        limit = route.driver.max_message_size
        if limit is not None and self.offload.plan(route.name) is not None:
            return  # a payload over the limit is offloaded after the locks
        if limit is None or job.encrypted:
            size = None
        else:
            size = len(payload) if payload.isascii() else len(payload.encode("utf-8"))
        if limit is not None and (size is None or size > limit - _ENVELOPE_ROOM):
            self._body(message, payload, route.driver, job)

    # ------------------------------------------------------------ plain jobs

    def quick(self, job: JobDefinition[Any], payload: Any) -> str | None:
        """``job.dispatch(payload)`` with no option, on the short path: the job is
        plain (``_plan``), nothing watches dispatches (a test recorder, telemetry) and the
        payload is plain data, copied here as JSON would give it back; queued with no
        ``Message`` built. Its id; None: not taken (the full path dispatches it)."""
        plan = self._plans.get(job, _UNPLANNED)
        if plan is _UNPLANNED:
            plan = self._plans[job] = self._plan(job)
        if plan is None:
            return None
        app = self.app
        slot = self.telemetry
        if app.recorder is not None or (slot.value if slot.resolved else slot.get()) is not None:
            return None
        copied = copy_payload(payload)
        if copied is None:
            return None  # the full path refuses it, or copies it through JSON
        queue, connection, driver, room, implicit = plan
        tenant = _tenant.get()
        if room is not None and copied[1] + (6 * len(tenant) if tenant else 0) > room:
            return None  # near the size limit: the full path measures the body
        if implicit:
            self.warn_implicit()
        mid = new_id()
        if not driver.keep_plain(mid, job.name, copied[0], queue, tenant, copied[2]):
            return None
        worker = self._local_workers.get(connection)
        if worker is None or worker.stopping or worker.loop is not get_running_loop():
            self.ensure_local_worker(connection)
        return mid

    def _plan(self, job: JobDefinition[Any]) -> Plan | None:
        """The short path of ``job``'s dispatches with no option (None: none): nothing
        of it needs a lock, a record, a transaction, encryption, a group or an object
        store, and its connection is an in-process ``PlainQueue``. Found once per job
        definition: these are fixed when the job is defined and the app configured."""
        if (
            job.unique is not None
            or job.debounce is not None
            or job.encrypted
            or job.after_commit
            or job.group is not None
            or self.tracking.meta_for(job) is not None
        ):
            return None
        connection, queue = self.resolve(PendingDispatch(job, None))
        if queue.__class__ is not str or not 0 < len(queue) <= MAX_QUEUE_NAME or "," in queue:
            return None  # the full path says why
        route = self.route(connection)
        driver = route.plain
        if driver is None or self.offload.plan(connection) is not None:
            return None
        limit, implicit = driver.max_message_size, self.app.implicit
        if limit is None:
            return queue, connection, driver, None, implicit
        fields = 32 + len(job.name) + len(queue) + len(connection)  # an id is 32 characters
        return queue, connection, driver, limit - 6 * fields - _ENVELOPE_ROOM, implicit

    # ------------------------------------------------------------ many dispatches

    def check(
        self,
        pending: PendingDispatch[Any],
        *,
        queue: str | None = None,
        connection: str | None = None,
        batch_id: str | None = None,
    ) -> None:
        """Raise what ``bulk`` would raise for ``pending`` before sending it (its queue
        name, payload, size and delay), sending nothing and keeping nothing: a batch
        checks every member before its first chunk goes out."""
        job = pending.job
        conn, q = self.resolve(pending, queue=queue, connection=connection)
        wire = pending.payload
        if wire.__class__ not in _WIRE:
            wire = job.to_wire(wire)
        payload = encode_payload(wire, job.name)
        route = self.route(conn)
        limit = route.driver.max_message_size
        size = len(payload) if payload.isascii() else len(payload.encode("utf-8"))
        if limit is not None and (job.encrypted or size > limit - _ENVELOPE_ROOM):
            # near the limit: the whole envelope, as it will be sent (built only here:
            # a batch of a million small jobs is checked at the cost of their JSON)
            message = self.build(pending, conn, q, batch_id=batch_id)
            self._check_before_locks(message, payload, route, job)
        else:
            if q.__class__ is not str or not 0 < len(q) <= MAX_QUEUE_NAME or "," in q:
                check_queue_name(q, f'job "{job.name}": queue')  # raises, as build() does
            if pending._group is not None or job.group is not None:
                pending._resolved_group()
        if pending._delay:
            check_delay(pending._delay, f'job "{job.name}": delay')

    async def bulk(
        self,
        pendings: Sequence[PendingDispatch[Any]],
        *,
        queue: str | None = None,
        connection: str | None = None,
        batch_id: str | None = None,
    ) -> list[str]:
        """Queue many jobs, grouped by connection with each driver's batch primitive.

        Jobs that need more than a plain enqueue (unique or debounced outside a batch, an
        after-commit dispatch inside a transaction, a test recorder) go one by one."""
        groups: dict[str, Batch] = {}
        ids: list[str] = []
        singles: list[PendingDispatch[Any]] = []
        in_tx = current_transaction() is not None
        try:
            for p in pendings:
                if not isinstance(p, PendingDispatch):
                    raise TypeError(f"Queue.bulk: expected job.with_(payload) items, got {p!r}")
                if self._alone(p, batch_id, in_tx):
                    singles.append(p)
                    ids.append("")
                    continue
                conn, message, item = await self._grouped(p, queue, connection, batch_id)
                groups.setdefault(conn, []).append(item)
                ids.append(message.id)
        except BaseException:
            await self._discard(groups, None)  # nothing was sent: no message reads them
            raise
        if groups and self.app.implicit:
            self.warn_implicit()
        sent = Sent(len(pendings))
        for conn, items in groups.items():
            try:
                await self.route(conn).send_many(items)
            except BaseException as e:
                later = list(groups)[list(groups).index(conn) :]
                lost = e.failed if isinstance(e, DispatchIncompleteError) else None
                if isinstance(e, DispatchOutcomeUnknownError):
                    # the payloads of jobs that may be queued stay with them
                    lost = {m.id: "" for _, m, _ in items if m.id not in e.job_ids}
                await self._discard({c: groups[c] for c in later}, (conn, lost))
                sent.failed(e, [m.id for _, m, _ in items], groups, conn)
            sent.queued += len(items)
        if singles:
            it = iter(singles)
            for i, v in enumerate(ids):
                if v == "":
                    one = await self.dispatch(
                        next(it), queue=queue, connection=connection, batch_id=batch_id
                    )
                    ids[i] = one.id
                    sent.queued += 1
        return ids

    async def _discard(
        self, groups: dict[str, Batch], partly: tuple[str, dict[str, str] | None] | None
    ) -> None:
        """Delete the offloaded payloads of messages not queued (``partly``: on that
        connection, only those its ``DispatchIncompleteError`` names)."""
        for conn, items in groups.items():
            named = partly[1] if partly is not None and conn == partly[0] else None
            for _, message, _ in items:
                if reference(message.meta) is not None and (named is None or message.id in named):
                    await self.offload.discard(message.meta, conn)

    def _alone(self, p: PendingDispatch[Any], batch_id: str | None, in_tx: bool) -> bool:
        job = p.job
        after_commit = p._after_commit if p._after_commit is not None else job.after_commit
        return (
            (batch_id is None and (job.unique is not None or job.debounce is not None))
            or self.app.recorder is not None
            or (in_tx and after_commit)
        )

    async def _grouped(
        self,
        p: PendingDispatch[Any],
        queue: str | None,
        connection: str | None,
        batch_id: str | None,
    ) -> tuple[str, Message, tuple[str, Message, float]]:
        job = p.job
        conn, q = self.resolve(p, queue=queue, connection=connection)
        message = self.build(p, conn, q, batch_id=batch_id)
        otel = self.telemetry.get()
        if otel is not None:
            otel.created(message)
        route = self.route(conn)
        body, sent = await self._encoded(
            route, message, encode_payload(message.payload, message.job), job
        )
        delay = check_delay(p._delay or 0.0, f'job "{job.name}": delay')
        return conn, message, (body, sent if reference(sent.meta) is not None else message, delay)
