"""haze's workflow calls on AWS Lambda durable functions (the AWS durable execution SDK).

``LambdaStepEngine`` carries out a ``WorkflowRun``'s calls on the SDK's
``DurableContext``; ``WorkflowRun`` has checked every rule before each call, so the
rules and their messages are the same as on haze's own engine:

==========================  ===================================================
haze                        Lambda durable functions
==========================  ===================================================
``run.step``                ``context.step`` named like the step; its
                            ``tries``/``backoff`` are the step's retry strategy
                            (the platform re-invokes the function for a retry,
                            at least 1 s later)
``run.sleep``               ``context.wait`` (whole seconds, at least 1)
``run.wait_for_event``      ``context.create_callback`` named like the event;
                            ``Workflow.send_event`` completes it. An event sent
                            before the wait is kept in the app's store: once the
                            callback exists, a step ``haze:early:<position>``
                            reads it from there
``run.gather``              ``context.parallel``, a branch per step
``run.dispatch``            ``context.step`` that sends the job (once per run)
nondeterminism check        the name the execution recorded for the operation
                            at that position (the SDK numbers operations in
                            order, as haze numbers steps)
==========================  ===================================================

The SDK is synchronous and suspends an execution by raising ``SuspendExecution`` (a
``BaseException``: no ``except Exception`` in a workflow swallows it). The workflow's
coroutine runs on the function's event loop; each SDK call runs on a worker thread
(``asyncio.to_thread``) and calls back into the loop for the step's own code
(``run_coroutine_threadsafe``), so both the SDK and haze's async code run as they do
elsewhere.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import math
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from aws_durable_execution_sdk_python.config import (
    CallbackConfig,
    Duration,
    ParallelConfig,
    StepConfig,
)
from aws_durable_execution_sdk_python.exceptions import CallbackTimeoutError
from aws_durable_execution_sdk_python.retries import RetryDecision
from aws_durable_execution_sdk_python.serdes import PassThroughSerDes
from haze.driver_api import DISPATCH_SUB_TYPE, operation_name, shown_name

if TYPE_CHECKING:
    from aws_durable_execution_sdk_python.context import DurableContext
    from aws_durable_execution_sdk_python.types import StepContext
    from haze.contracts.workflow import StepRetry, WorkflowStateStore

__all__ = ["LambdaStepEngine", "retry_strategy"]

T = TypeVar("T")

_AS_IS: PassThroughSerDes[str] = PassThroughSerDes()
_KEPT_AS_IS = StepConfig(serdes=_AS_IS)

#: The durable context of the branch a call belongs to (``run.gather`` runs each
#: branch in a child context of its own).
_context: contextvars.ContextVar[DurableContext | None] = contextvars.ContextVar(
    "haze_durable_context", default=None
)


def retry_strategy(retry: StepRetry) -> Callable[[Exception, int], RetryDecision]:
    """The SDK retry strategy of a step's ``tries``/``backoff``. A broken haze rule
    (``WorkflowError``) is never retried: a replay would break it again."""
    from haze.driver_api import WorkflowError

    def decide(error: Exception, attempt: int) -> RetryDecision:
        if isinstance(error, WorkflowError) or attempt >= retry.tries:
            return RetryDecision.no_retry()
        return RetryDecision.retry(Duration(max(1, math.ceil(retry.delay(attempt)))))

    return decide


class LambdaStepEngine:
    """A ``StepEngine`` on one durable execution's ``DurableContext``."""

    def __init__(
        self,
        context: DurableContext,
        loop: asyncio.AbstractEventLoop,
        run_id: str = "",
        events: WorkflowStateStore | None = None,
    ) -> None:
        self._root = context
        self._loop = loop
        self._run_id = run_id
        #: Where ``Workflow.send_event`` keeps an event sent before its wait (the app's
        #: store); None: such an event is refused by the sender.
        self._events = events
        #: Failures of this invocation's steps, by step name: raised as themselves
        #: (the SDK hands back its own ``StepError`` naming only the type).
        self._errors: dict[str, BaseException] = {}

    def _ctx(self) -> DurableContext:
        return _context.get() or self._root

    def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the workflow's loop from an SDK thread; wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def mark(self, position: int, name: str, kind: str) -> str:
        # The SDK names each operation by its order in the context, as haze numbers
        # steps: the name recorded for the next operation is the one kept here.
        kept = self._ctx()._peek_next_checkpoint()
        if kept.operation is not None and kept.operation.name:
            recorded = str(kept.operation.name)
            return name if recorded == operation_name(name) else shown_name(recorded)
        return name

    async def step(
        self,
        name: str,
        position: int,
        attempt: Callable[[int], Awaitable[str]],
        retry: StepRetry,
    ) -> str:
        ctx = self._ctx()

        def body(step: StepContext) -> str:
            try:
                return self._on_loop(_awaited(attempt(step.attempt)))
            except Exception as e:
                self._errors[name] = e
                raise

        # the platform keeps haze's JSON text as it is (no envelope of its own)
        config = StepConfig(retry_strategy=retry_strategy(retry), serdes=_AS_IS)
        try:
            result = await asyncio.to_thread(ctx.step, body, operation_name(name), config)
        except Exception:
            kept = self._errors.pop(name, None)
            if kept is not None:
                raise kept from None
            raise
        return str(result)

    async def sleep(self, name: str, position: int, seconds: float) -> None:
        ctx = self._ctx()
        wait = Duration(max(1, math.ceil(seconds)))
        await asyncio.to_thread(ctx.wait, wait, operation_name(name))

    async def wait_for_event(self, name: str, position: int, timeout: float | None) -> str | None:
        ctx = self._ctx()
        limit = Duration(math.ceil(timeout)) if timeout else Duration()
        kept = self._events

        def read(step: StepContext) -> str:
            found = None if kept is None else self._on_loop(kept.event(self._run_id, name))
            return json.dumps(found)

        def wait() -> str | None:
            callback = ctx.create_callback(operation_name(name), CallbackConfig(timeout=limit))
            if kept is not None:
                # An event sent before the callback existed is in the store: read once the
                # callback exists, so a sender either sees the callback or is seen here.
                early = json.loads(ctx.step(read, f"haze:early:{position}", _KEPT_AS_IS))
                if early is not None:
                    return str(early)
            try:
                payload = callback.result()
            except CallbackTimeoutError:
                return None
            return None if payload is None else str(payload)

        return await asyncio.to_thread(wait)

    async def gather(self, branches: Sequence[Callable[[], Awaitable[Any]]]) -> list[Any]:
        ctx = self._ctx()
        failures: dict[int, BaseException] = {}

        def branch(index: int, make: Callable[[], Awaitable[Any]]) -> Callable[..., Any]:
            def run(child: DurableContext) -> Any:
                try:
                    return self._on_loop(_in_context(child, make))
                except Exception as e:
                    failures[index] = e
                    raise

            return run

        functions = [branch(i, b) for i, b in enumerate(branches)]
        batch = await asyncio.to_thread(ctx.parallel, functions, None, ParallelConfig())
        if batch.has_failure:
            for item in batch.failed():
                if item.index in failures:
                    raise failures[item.index] from None
            batch.throw_if_error()
        return list(batch.get_results())

    async def dispatch_once(
        self, name: str, position: int, send: Callable[[], Awaitable[str]]
    ) -> str:
        ctx = self._ctx()

        def body(step: StepContext) -> str:
            return json.dumps(self._on_loop(_awaited(send())))

        config = StepConfig(serdes=_AS_IS, sub_type=DISPATCH_SUB_TYPE)
        result = await asyncio.to_thread(ctx.step, body, operation_name(name), config)
        return str(json.loads(result))


async def _awaited(value: Awaitable[T]) -> T:
    return await value


async def _in_context(child: DurableContext, make: Callable[[], Awaitable[Any]]) -> Any:
    _context.set(child)  # this task's own copy of the context variables
    return await make()
