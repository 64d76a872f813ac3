"""Chains: run jobs one after another; the rest of the chain travels in each message.

>>> # await Queue.chain([process_video.with_({"id": 1}), publish.with_({"id": 1})]) \\
>>> #     .on_queue("media").catch(cleanup.with_({"id": 1})).dispatch()

A link is ``{"job", "payload", "queue"?, "connection"?, "delay"?}`` (``enc`` in place of
``payload`` for an ``encrypted`` job) or, for a batch inside a chain, ``{"batch": {...}}``.
Any worker that finishes a link dispatches the next one, so chains work on every driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from haze._jobs.definition import DispatchResult, JobDefinition, PendingDispatch
from haze._kernel.blocking import blocking_method
from haze._kernel.durations import Duration, check_delay, parse_duration
from haze._kernel.message import Message, check_queue_name, new_id

if TYPE_CHECKING:
    from haze._engine.manager import QueueManager
    from haze._jobs.context import JobContext
    from haze._orchestration.batches import PendingBatch

__all__ = ["PendingChain"]

ChainItem = "PendingDispatch[Any] | JobDefinition[Any] | PendingBatch"


def _as_pending(item: object, where: str) -> PendingDispatch[Any] | PendingBatch:
    from haze._orchestration.batches import PendingBatch

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
        self._delay = check_delay(parse_duration(delay, "chain delay"), "chain delay")
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
        from haze._app.app import use_app

        manager = use_app().manager
        first = self.jobs[0]
        connection = manager.app.connection_name(
            (first._connection if isinstance(first, PendingDispatch) else None)
            or self._connection
            or (first.job.connection if isinstance(first, PendingDispatch) else None)
        )
        chain_id = new_id()
        check_function_callbacks(
            manager, self._catch, self.jobs, (self._connection,), "chain.catch"
        )
        catch = [manager.callback_ref(c, connection, "chain.catch") for c in self._catch]
        links = self.links(manager, connection)
        if self._delay and "job" in links[0]:
            links[0]["delay"] = links[0].get("delay") or self._delay
        from haze import testing

        fake = testing._active_fake
        if fake is not None:
            fake.record_chain(self, links, chain_id)
        result = await start_links(manager, links, chain_id, catch or None, batch_id=None)
        return DispatchResult(result.id, result.skipped, result.deferred, chain_id)

    dispatch_blocking = blocking_method(dispatch)


def _item_connections(item: Any, defaults: tuple[str | None, ...]) -> list[str | None]:
    """Connections the jobs of a chain/batch item run on (None: the config default)."""
    from haze._orchestration.batches import PendingBatch

    if isinstance(item, PendingBatch):
        out: list[str | None] = []
        for m in item.jobs:
            for p in m if isinstance(m, list) else [m]:
                out += _item_connections(p, (item._connection, *defaults))
        return out
    if isinstance(item, list):
        return [c for p in item for c in _item_connections(p, defaults)]
    return [next((c for c in (item._connection, *defaults, item.job.connection) if c), None)]


def check_function_callbacks(
    manager: QueueManager,
    callbacks: Sequence[Any],
    items: Sequence[Any],
    defaults: tuple[str | None, ...],
    where: str,
) -> None:
    """A plain-function callback needs every job of the chain/batch on a local connection
    (its settle may run the callback in the worker that ran the job)."""
    if not any(
        callable(cb) and not isinstance(cb, (PendingDispatch, JobDefinition)) for cb in callbacks
    ):
        return
    for item in items:
        for c in _item_connections(item, defaults):
            name = manager.app.connection_name(c)
            driver = manager.app.driver(name)
            if not driver.local_callbacks:
                raise ValueError(
                    f"{where}: a plain function cannot travel to the workers of connection "
                    f'"{name}" (driver {type(driver).__name__}); pass a job reference '
                    "such as cleanup.with_({...}) instead"
                )


def link_of(
    manager: QueueManager,
    item: PendingDispatch[Any] | PendingBatch,
    queue: str | None,
    connection: str | None,
    default_connection: str,
) -> dict[str, Any]:
    from haze._orchestration.batches import PendingBatch

    if isinstance(item, PendingBatch):
        return {"batch": item.to_spec(manager, connection or default_connection)}
    link = item.to_link(manager.app)
    if queue is not None and "queue" not in link:
        link["queue"] = queue
    if connection is not None and "connection" not in link:
        link["connection"] = connection
    return link


async def start_links(
    manager: QueueManager,
    links: list[dict[str, Any]],
    chain_id: str,
    catch: list[dict[str, Any]] | None,
    *,
    batch_id: str | None,
    attempts: int = 0,
    id: str | None = None,
    meta: dict[str, Any] | None = None,
) -> DispatchResult:
    """Dispatch ``links[0]`` carrying the rest of the chain (as message ``id`` when given,
    with ``meta`` when it is a job)."""
    from haze._engine.manager import link_to_pending

    head, rest = links[0], links[1:]
    if "batch" in head:
        from haze import testing
        from haze._orchestration.batches import dispatch_spec

        if testing._active_fake is not None:
            # Under Queue.fake() a batch is recorded in fake.batches, not run (seed 测试).
            from haze._orchestration.batches import PendingBatch

            spec = head["batch"]
            pb = PendingBatch(
                [
                    [link_to_pending(x, manager.app) for x in j["chain"]]
                    if "chain" in j
                    else link_to_pending(j, manager.app)
                    for j in spec["jobs"]
                ]
            )
            pb._name, pb._queue = spec.get("name"), spec.get("queue")
            pb._connection, pb._allow_failures = (
                spec.get("connection"),
                bool(spec.get("allow_failures")),
            )
            batch = testing._active_fake.record_batch(pb, spec)
            return DispatchResult(batch.id, chain_id=chain_id)
        batch = await dispatch_spec(
            manager, head["batch"], chain={"links": rest, "chain_id": chain_id, "catch": catch}
        )
        return DispatchResult(batch.id, chain_id=chain_id)
    pending = link_to_pending(head, manager.app)
    return await manager.dispatch(
        pending,
        chain=rest or None,
        chain_id=chain_id,
        chain_catch=catch,
        batch_id=batch_id,
        id=id,
        meta=meta,
    )


async def dispatch_next_link(manager: QueueManager, message: Message, ctx: JobContext) -> None:
    rest = list(message.chain or [])
    connection = message.connection or manager.app.queue_config.default
    if ctx._chain_prepended:
        rest = [link_of(manager, p, None, None, connection) for p in ctx._chain_prepended] + rest
    if ctx._chain_appended:
        rest = rest + [link_of(manager, p, None, None, connection) for p in ctx._chain_appended]
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
    import hashlib

    return hashlib.blake2b(f"{base}:{what}".encode(), digest_size=16).hexdigest()


async def chain_failed(manager: QueueManager, message: Message, error: BaseException) -> None:
    """A link failed for good: drop the rest, run the chain's catch callbacks once."""
    # Inside a batch, the links that will never run are counted when the failed job
    # is (batches.settle), in the same crash-safe way.
    for ref in message.chain_catch or []:
        await manager.run_callback(ref, (error,), connection=message.connection)
    manager.forget_callbacks(message.chain_catch)
