"""Chains: run jobs one after another; the rest of the chain travels in each message
(a long rest is stored once and referenced: haze._orchestration.tails).

>>> # await Queue.chain([process_video.with_({"id": 1}), publish.with_({"id": 1})]) \\
>>> #     .on_queue("media").catch(cleanup.with_({"id": 1})).dispatch()

A link is ``{"job", "payload", "queue"?, "connection"?, "delay"?}`` (``enc`` in place of
``payload`` for an ``encrypted`` job) or, for a batch inside a chain, ``{"batch": {...}}``.
Any worker that finishes a link dispatches the next one, so chains work on every driver.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from haze._base.blocking import blocking_method
from haze._base.durations import Duration, parse_delay
from haze._base.message import Message, check_queue_name, new_id
from haze._engine.hooks import Outcome, Run
from haze._engine.manager import QueueManager
from haze._jobs.definition import DispatchResult, JobDefinition, PendingDispatch
from haze._orchestration import tails
from haze._orchestration.batches import (
    PendingBatch,
    check_function_callbacks,
    check_link_queues,
    start_links,
)
from haze.contracts.app import use_app

if TYPE_CHECKING:
    from haze._jobs.context import JobContext

__all__ = ["ChainCatch", "ChainNext", "PendingChain"]

log = logging.getLogger("haze")

ChainItem = "PendingDispatch[Any] | JobDefinition[Any] | PendingBatch"


def _as_pending(item: object, where: str) -> PendingDispatch[Any] | PendingBatch:
    if isinstance(item, (PendingDispatch, PendingBatch)):
        return item
    if isinstance(item, JobDefinition):
        return PendingDispatch(item, None)
    raise TypeError(
        f"{where}: expected job.with_(payload), a job or a Queue.batch(...), got {item!r}"
    )


class PendingChain:
    """Built by ``Queue.chain([...])``; ``await .dispatch()`` queues the first link."""

    def __init__(self, jobs: Sequence[Any]) -> None:
        if not isinstance(jobs, (list, tuple)) or not jobs:
            raise ValueError("Queue.chain: expected a non-empty list of jobs")
        self.jobs = [_as_pending(j, f"Queue.chain[{i}]") for i, j in enumerate(jobs)]
        self._connection: str | None = None
        self._queue: str | None = None
        self._delay: float | None = None
        self._catch: list[Any] = []

    def on_connection(self, connection: str) -> PendingChain:
        self._connection = connection
        return self

    def on_queue(self, queue: str) -> PendingChain:
        self._queue = check_queue_name(queue, "chain on_queue")
        return self

    def delay(self, delay: Duration) -> PendingChain:
        """Delay the first link."""
        self._delay = parse_delay(delay, "chain delay")
        return self

    def catch(self, callback: Any) -> PendingChain:
        """On a link's final failure: dispatch this job reference or call ``fn(error)``."""
        if not (callable(callback) or isinstance(callback, (PendingDispatch, JobDefinition))):
            raise ValueError(
                f"chain.catch: expected a job reference or a function, got {callback!r}"
            )
        self._catch.append(callback)
        return self

    def links(self, manager: QueueManager, connection: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for item in self.jobs:
            out.append(link_of(manager, item, self._queue, self._connection, connection))
        return out

    async def dispatch(self) -> DispatchResult:
        manager: QueueManager = use_app().manager
        first = self.jobs[0]
        connection = manager.app.connection_name(
            (first._connection if isinstance(first, PendingDispatch) else None)
            or self._connection
            or (
                manager.app.queue_config.routes.connection_for(first.job.name, first.job.connection)
                if isinstance(first, PendingDispatch)
                else None
            )
        )
        chain_id = new_id()
        check_function_callbacks(
            manager, self._catch, self.jobs, (self._connection,), "chain.catch"
        )
        catch = [manager.callback_ref(c, connection, "chain.catch") for c in self._catch]
        links = self.links(manager, connection)
        if self._delay and "job" in links[0]:
            links[0]["delay"] = links[0].get("delay") or self._delay
        recorder = manager.app.recorder
        if recorder is not None:
            recorder.record_chain(self, links, chain_id)
        else:
            check_link_queues(manager, links[1:])
        result = await start_links(manager, links, chain_id, catch or None, batch_id=None)
        return DispatchResult(result.id, result.skipped, result.deferred, chain_id)

    dispatch_blocking = blocking_method(dispatch)


def link_of(
    manager: QueueManager,
    item: PendingDispatch[Any] | PendingBatch,
    queue: str | None,
    connection: str | None,
    default_connection: str,
) -> dict[str, Any]:
    if isinstance(item, PendingBatch):
        return {"batch": item.to_spec(manager, connection or default_connection)}
    link = item.to_link(manager.app)
    if queue is not None and "queue" not in link:
        link["queue"] = queue
    if connection is not None and "connection" not in link:
        link["connection"] = connection
    return link


async def dispatch_next_link(manager: QueueManager, message: Message, ctx: JobContext) -> None:
    rest = list(message.chain or [])
    connection = message.connection or manager.app.queue_config.default
    if ctx._chain_prepended:
        rest = [link_of(manager, p, None, None, connection) for p in ctx._chain_prepended] + rest
    if ctx._chain_appended:
        rest = rest + [link_of(manager, p, None, None, connection) for p in ctx._chain_appended]
    rest = await tails.expand(manager, rest, message.chain_id)
    if not rest:
        return
    chain_id = message.chain_id or new_id()
    # Inside a batch the next link's id derives from this one: a redelivery of this
    # link that dispatches it again is then counted in the batch once, not twice.
    next_id = None if message.batch_id is None else derived_id(message.id, "next")
    await start_links(
        manager, rest, chain_id, message.chain_catch, batch_id=message.batch_id, id=next_id
    )


def derived_id(base: str, what: str) -> str:
    """A message id (32 hex characters) that is always the same for ``base`` and ``what``."""
    return hashlib.blake2b(f"{base}:{what}".encode(), digest_size=16).hexdigest()


async def chain_failed(manager: QueueManager, message: Message, error: BaseException) -> None:
    """A link failed for good: drop the rest, run the chain's catch callbacks once."""
    # Inside a batch, the links that will never run are counted when the failed job
    # is (batches.settle), in the same crash-safe way.
    # A long chain's stored links stay until batches.ttl: retrying the failed link
    # (queue:retry) continues the chain from them.
    for ref in message.chain_catch or []:
        await manager.run_callback(ref, (error,), connection=message.connection)
    manager.forget_callbacks(message.chain_catch)


class ChainNext:
    """Outcome hook: a link that succeeded dispatches the next one before it is acked
    (a crash in between runs the link again, and it dispatches the next link again)."""

    plain_quiet = True  # wants() is False for a plain success (PlainQuiet)

    def __init__(self, manager: QueueManager) -> None:
        self.manager = manager

    def wants(self, run: Run) -> bool:
        ctx = run.ctx
        return run.outcome == Outcome.SUCCESS and bool(
            run.message.chain or ctx._chain_appended or ctx._chain_prepended
        )

    async def settling(self, run: Run) -> None:
        message, ctx = run.message, run.ctx
        if run.outcome != Outcome.SUCCESS or not (
            message.chain or ctx._chain_appended or ctx._chain_prepended
        ):
            return
        try:
            await dispatch_next_link(self.manager, message, ctx)
        except Exception as e:
            # sync: the next link ran inline and failed; finish this job first, then
            # raise that failure to the dispatch() caller.
            if run.inline:
                run.raise_after = e
            else:
                # This job did its work; leaving it un-acked would only run it again.
                log.exception(
                    'job "%s" (%s) succeeded but dispatching the next link of chain %s failed',
                    run.job.name,
                    message.id,
                    message.chain_id,
                )

    async def settled(self, run: Run) -> None:
        return None


class ChainCatch:
    """Outcome hook: a link that failed for good runs the chain's ``catch`` callbacks
    (once it is in the failed list); a chain that ended drops its function callbacks."""

    plain_quiet = True  # wants() is False for a plain success (PlainQuiet)

    def __init__(self, manager: QueueManager) -> None:
        self.manager = manager

    def wants(self, run: Run) -> bool:
        message = run.message
        return bool(message.chain_catch) or (
            run.outcome == Outcome.FAILED and message.chain_id is not None
        )

    async def settling(self, run: Run) -> None:
        message, ctx = run.message, run.ctx
        if not message.chain_catch:
            return
        ended = run.outcome == Outcome.SUCCESS and not (
            tails.chain_length(message.chain) or ctx._chain_appended or ctx._chain_prepended
        )
        if ended or run.outcome == Outcome.CANCELLED:
            self.manager.forget_callbacks(message.chain_catch)

    async def settled(self, run: Run) -> None:
        if run.outcome == Outcome.FAILED and run.message.chain_id is not None:
            assert run.error is not None
            await chain_failed(self.manager, run.message, run.error)
