"""The short path of a plain job on an in-process queue: claim to ack in one call.

A plain job is most jobs: a message with nothing but immutable fields and a payload
(dispatched with no option by a job with no lock, record, group, encryption or
after-commit: ``Dispatcher.quick``), run by an async handler that takes only its
payload, with no middleware, timeout or ``max_exceptions``. For such a message,
``PlainRuns.run`` claims it (``PlainQueue.claim_plain``), copies its payload, runs
the handler's first step and, when that step ends the handler without an error,
acknowledges it with the next claim (``claim_plain(queues, ended=True)``) and goes on
with that one, in the same frame: no ``Message``, ``Reserved``, ``JobContext`` or
``Run`` is built and no hook is asked, because none would do anything for it.

Anything else goes the full way, with the same outcome: a listener of ``before`` or
``after``, the ``haze.job`` lines (DEBUG), telemetry, a cancel that may be pending, a
guard that looks at plain runs, a reclaimed attempt past ``tries``: the claim becomes
the ``Reserved`` the driver's ``reserve_nowait`` would have made, before the handler
starts. A handler that raises, or suspends (awaits I/O), carries on as that
``Reserved`` with its context and run built then (``Execution.resume``), so a retry,
a release, a failure, ``Queue.running()`` and a cancel see what they always see.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Generator, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from haze._base.current import app_var
from haze._base.json_text import copy_tree
from haze._engine.hooks import Run
from haze._jobs.context import _tenant
from haze._jobs.registry import _registry

if TYPE_CHECKING:
    from haze._engine.execution import Execution
    from haze._engine.local import LocalWorker
    from haze._jobs.definition import JobDefinition
    from haze.contracts.driver import Driver, Reserved
    from haze.contracts.plain import PlainClaim, PlainQueue

__all__ = ["PlainRuns"]

job_log = logging.getLogger("haze.job")
_DEBUG = logging.DEBUG
_perf = time.perf_counter

#: What ``run`` gives a worker's slot after the jobs it ran to their end: a claim and
#: the rest of its run, to await; a claim for the full path; or nothing (queued).
Next: TypeAlias = "tuple[Reserved, Awaitable[str]] | Reserved | None"


class PlainRuns:
    """The short path of one in-process connection's worker (see the module doc)."""

    __slots__ = ("_driver", "_queue", "_tries", "execution")

    def __init__(self, execution: Execution, driver: Driver, queue: PlainQueue) -> None:
        self.execution = execution
        self._driver = driver
        self._queue = queue
        #: job -> its ``tries`` when its handler and options allow the short path, else 0
        #: (fixed once the job is defined and the app started: its middleware is
        #: composed once too)
        self._tries: dict[JobDefinition[Any], int] = {}

    def enter(self) -> None:
        """Called by a worker's slot when it starts, in its own task: the slot runs as
        its app and as no tenant, so a plain job sets neither (a job's own tenant is
        set around it). A job on the full path sets both around it, as always."""
        app_var.set(self.execution.app)
        _tenant.set(None)

    def run(self, queues: Sequence[str] | None, worker: LocalWorker) -> tuple[int, Next]:
        """Claim and run plain jobs one after another, in this one frame, while each
        ends in its first step without an error and ``worker`` is not stopping: (how
        many ended so, what came next: None, the rest of a run to await, or a claim
        for the full path). See the module doc."""
        source, tries_of, ex = self._queue, self._tries, self.execution
        claim_plain = source.claim_plain
        events, slot, tracking = ex.events, ex.telemetry, ex.tracking
        ran = 0
        ended = False  # the claim before this one succeeded: claim_plain settles it
        while True:
            claim = claim_plain(queues, ended)  # type: ignore[arg-type]
            if claim.__class__ is not tuple:
                return ran, claim  # type: ignore[return-value]
            kept, attempt, _ = claim
            job = _registry.get(kept[2])
            tries = tries_of.get(job) if job is not None else 0
            if tries is None:
                tries = tries_of[job] = job.tries if self._fit(job) else 0  # type: ignore[index,arg-type,union-attr]
            started = _perf()  # the job's clock, and the cancel hint's
            if (
                attempt > tries  # a job that does not fit: 0
                or events.before
                or events.after
                or (slot.value if slot.resolved else slot.get()) is not None
                or job_log.isEnabledFor(_DEBUG)
                or started > tracking.quiet_until  # may_be_cancelled(False), no frame
            ):
                return ran, source.plain_claim(claim)
            assert job is not None
            value = kept[3]  # copied by copy_payload at dispatch: plain
            # flat: no dict or list inside, so a shallow copy is a whole one
            payload = value.copy() if kept[9] else copy_tree(value)
            # The slot runs as its app already (``enter``); the tenant is set when it differs
            tenant = kept[8]
            tenant_token = _tenant.set(tenant) if _tenant.get() != tenant else None
            try:
                coro = job.handler(payload) if job._n_params else job.handler()
                try:
                    waiting = coro.send(None)
                except StopIteration:
                    ran += 1
                    if worker.stopping or events.looping:
                        source.plain_done()
                        return ran, None  # the slot stops, or tells its listeners first
                    ended = True
                    continue
                except BaseException as e:
                    rest: Awaitable[Any] = _Raise(e)
                else:
                    rest = _Rest(coro, waiting)
            finally:
                if tenant_token is not None:
                    _tenant.reset(tenant_token)
            return ran, self._carry_on(claim, job, payload, rest, started)

    def _carry_on(
        self,
        claim: PlainClaim,
        job: JobDefinition[Any],
        payload: Any,
        rest: Awaitable[Any],
        started: float,
    ) -> tuple[Reserved, Awaitable[str]]:
        """The handler raised or suspended: from here on it is the full path's run."""
        ex, driver = self.execution, self._driver
        reserved = self._queue.plain_claim(claim, payload)
        message = reserved.message
        assert message is not None
        run = Run(job, message, reserved, driver, ex.app, False)
        run.payload = payload if job._n_params else None
        run.started = True
        ex.tracking.started(run.ctx, False)
        return reserved, ex.resume(run, rest, started)

    def _fit(self, job: JobDefinition[Any]) -> bool:
        ex = self.execution
        middleware = [mw for source in ex.middleware_sources for mw in source()]
        return (
            job.is_async
            and job._n_params < 2
            and job.timeout is None
            and job.max_exceptions is None
            and not job.encrypted
            and (job._n_params == 0 or job.payload_type is None)
            and not job.middleware
            and not middleware
            and not ex.app.queue_config.middleware
            and ex.hooks.plain_success_quiet(job)
        )


class _Rest:
    """The rest of a handler whose first step suspended on ``first``."""

    __slots__ = ("coro", "first")

    def __init__(self, coro: Any, first: Any) -> None:
        self.coro = coro
        self.first = first

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, out = self.coro, self.first
        while True:
            try:
                sent = yield out
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as e:
                try:
                    out = coro.throw(e)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    out = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


class _Raise:
    """What a handler's first step raised, raised again where the full path awaits it."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __await__(self) -> Generator[Any, Any, Any]:
        raise self.error
        yield  # a generator: raised when awaited
