"""The short path of a plain job on an in-process queue: claim to ack in one call.

A plain job is most jobs: a message with nothing but immutable fields and a payload
(dispatched with no option by a job with no lock, record, group, encryption or
after-commit: ``Dispatcher.quick``), run by an async handler that takes only its
payload, with no middleware, timeout or ``max_exceptions``. For such a message,
``PlainRuns.next`` claims it (``PlainQueue.claim_plain``), copies its payload, runs
the handler's first step and, when that step ends the handler without an error,
acknowledges it: no ``Message``, ``Reserved``, ``JobContext`` or ``Run`` is built and
no hook is asked, because none would do anything for it.

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
from haze._base.json_text import copy_plain, copy_plain_dict
from haze._engine.hooks import Outcome, Run
from haze._jobs.context import JobContext, _tenant
from haze._jobs.registry import _registry

if TYPE_CHECKING:
    from haze._engine.execution import Execution
    from haze._jobs.definition import JobDefinition
    from haze.contracts.driver import Driver, Reserved
    from haze.contracts.plain import PlainClaim, PlainQueue

__all__ = ["PlainRuns"]

job_log = logging.getLogger("haze.job")
_DEBUG = logging.DEBUG
_perf = time.perf_counter
_time = time.time

#: What ``next`` gives a worker's slot: the outcome of a job it ran to its end; a claim
#: and the rest of its run, to await; a claim for the full path; or nothing queued.
Next: TypeAlias = "str | tuple[Reserved, Awaitable[str]] | Reserved | None"


class PlainRuns:
    """The short path of one in-process connection's worker (see the module doc)."""

    __slots__ = ("_driver", "_fits", "_queue", "execution")

    def __init__(self, execution: Execution, driver: Driver, queue: PlainQueue) -> None:
        self.execution = execution
        self._driver = driver
        self._queue = queue
        #: job -> whether its handler and options allow the short path (fixed once the
        #: job is defined and the app started: its middleware is composed once too)
        self._fits: dict[JobDefinition[Any], bool] = {}

    def enter(self) -> None:
        """Called by a worker's slot when it starts, in its own task: the slot runs as
        its app and as no tenant, so a plain job sets neither (a job's own tenant is
        set around it). A job on the full path sets both around it, as always."""
        app_var.set(self.execution.app)
        _tenant.set(None)

    def next(self, queues: Sequence[str] | None) -> Next:
        """Claim the next job; run it here when it is plain (see the module doc)."""
        source = self._queue
        claim = source.claim_plain(queues)  # type: ignore[arg-type]
        if claim.__class__ is not tuple:
            return claim  # type: ignore[return-value]
        kept, attempt, _ = claim
        job = _registry.get(kept[2])
        ex = self.execution
        fits = self._fits.get(job) if job is not None else False
        if fits is None:
            fits = self._fits[job] = self._fit(job)  # type: ignore[index,arg-type]
        events, slot = ex.events, ex.telemetry
        if (
            not fits
            or attempt > job.tries  # type: ignore[union-attr]
            or events.before
            or events.after
            or (slot.value if slot.resolved else slot.get()) is not None
            or job_log.isEnabledFor(_DEBUG)
            or _time() > ex.tracking.quiet_until  # may_be_cancelled(False), no frame
        ):
            return source.plain_claim(claim)
        assert job is not None
        value = kept[3]  # copied by copy_plain at dispatch: plain
        payload = copy_plain_dict(value, 1, [0]) if value.__class__ is dict else _copy(value)
        started = _perf()
        # The slot runs as its app already (``enter``); the tenant is set when it differs
        tenant = kept[8]
        tenant_token = _tenant.set(tenant) if _tenant.get() != tenant else None
        try:
            coro = job.handler(payload) if job._n_params else job.handler()
            try:
                waiting = coro.send(None)
            except StopIteration:
                source.plain_done()
                return Outcome.SUCCESS
            except BaseException as e:
                rest: Awaitable[Any] = _Raise(e)
            else:
                rest = _Rest(coro, waiting)
        finally:
            if tenant_token is not None:
                _tenant.reset(tenant_token)
        return self._carry_on(claim, job, payload, rest, started)

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
        ctx = JobContext(
            id=message.id,
            name=job.name,
            attempt=reserved.attempt,
            tries=job.tries,
            queue=message.queue,
            connection=driver.name,
            app=ex.app,
            message=message,
        )
        run = Run(job, message, reserved, driver, ctx, False)
        run.payload = payload if job._n_params else None
        run.started = True
        ex.tracking.started(ctx, False)
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


def _copy(value: Any) -> Any:
    copied = copy_plain(value)
    assert copied is not None  # it was copied once already
    return copied[0]


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
