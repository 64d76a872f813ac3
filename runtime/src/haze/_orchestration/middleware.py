"""Job middleware: ``(payload, job, call_next)`` wrappers around a job's handle.

>>> @define_job(tries=5, middleware=[rate_limited("github", max=10, per="1m"),
...                                  skip_if(lambda p, job: p["user_id"] == 0)])
... async def sync_user(payload: dict) -> None: ...

Not calling ``call_next`` skips the attempt (it counts as done); calling
``job.release(delay)`` first retries it later without using a try. The built-ins keep
their state in the queue ``store`` (config/queue.py), with keys scoped by tenant.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import random
import secrets
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from haze._base.crypto import keyed_digest
from haze._base.durations import MIN_SLOT_LEASE, Duration, parse_duration
from haze._base.errors import ConfigError
from haze._jobs.definition import find_job
from haze.contracts.store import Store

if TYPE_CHECKING:
    from haze._jobs.context import JobContext

__all__ = [
    "JobMiddleware",
    "fail_on_exception",
    "limit_concurrency",
    "rate_limited",
    "skip_if",
    "skip_if_batch_cancelled",
    "throttles_exceptions",
    "without_overlapping",
]

CallNext: TypeAlias = Callable[[], Awaitable[Any]]
JobMiddleware: TypeAlias = Callable[[Any, "JobContext", CallNext], Awaitable[Any]]

log = logging.getLogger("haze")


async def _maybe(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


def _store(job: JobContext) -> Store:
    return job.app.manager.state_store()


def _scoped(job: JobContext, *parts: object) -> str:
    return job.app.manager.scoped_key("mw", *parts)


async def _key_value(job: JobContext, key_fn: Callable[[Any], Any], payload: Any) -> str:
    """``key_fn(payload)`` as a key part: an encrypted job's value is often a field of
    its secret payload, so its keys hold a keyed hash of it (as its unique keys do)."""
    value = str(await _maybe(key_fn(payload)))
    definition = find_job(job.name)
    if definition is not None and definition.encrypted:
        return keyed_digest(job.app, value)
    return value


def _positive_int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: expected an integer >= 1, got {value!r}")
    return value


def _check_key(key: object, where: str) -> None:
    if key is not None and not (callable(key) or isinstance(key, str)):
        raise ConfigError(
            f"{where}: key must be a string or a function of the payload, got {key!r}"
        )


def _key_fn(key: object, where: str) -> Callable[[Any], Any] | None:
    if key is not None and not callable(key):
        raise ConfigError(f"{where}: key must be a function of the payload, got {key!r}")
    return key


def rate_limited(
    name: str, *, max: int, per: Duration, key: Callable[[Any], Any] | None = None
) -> JobMiddleware:
    """At most ``max`` runs per fixed window of ``per`` (aligned to the epoch) for every job
    using ``name``; ``key(payload)`` splits it further. Over the limit: released to the
    next window."""
    where = f"rate_limited({name!r})"
    if not isinstance(name, str) or not name:
        raise ConfigError(f"rate_limited: name must be a non-empty string, got {name!r}")
    limit = _positive_int(max, f"{where}: max")
    window = _duration(per, f"{where}: per", allow_zero=False)
    key_fn = _key_fn(key, where)

    async def rate_limit(payload: Any, job: JobContext, call_next: CallNext) -> Any:
        now = time.time()
        slot = math.floor(now / window)
        sub = "" if key_fn is None else await _key_value(job, key_fn, payload)
        k = _scoped(job, "rate", name, sub, slot)
        n = await _store(job).increment(k, 1, window * 2)
        if n > limit:
            job.release(max_(0.001, (slot + 1) * window - now))
            return None
        return await call_next()

    return rate_limit


def max_(a: float, b: float) -> float:
    return a if a > b else b


def _release_delay(release_after: Duration | bool, where: str) -> float | None:
    if release_after is False:
        return None
    if release_after is True:
        raise ConfigError(f"{where}: release_after must be a duration or False, got True")
    return _duration(release_after, f"{where}: release_after")


def _duration(value: object, what: str, *, allow_zero: bool = True) -> float:
    """``parse_duration``, its error a ConfigError like the middleware's others."""
    try:
        return parse_duration(value, what, allow_zero=allow_zero)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _lease(value: object, where: str) -> float:
    """A slot's ``expire_after``: renewed every third of it while the job runs."""
    lease = _duration(value, f"{where}: expire_after", allow_zero=False)
    if lease < MIN_SLOT_LEASE:
        raise ConfigError(
            f"{where}: expire_after must be at least {MIN_SLOT_LEASE:g}s (the lease of a "
            f"running job's slot, renewed every third of it), got {value!r}"
        )
    return lease


#: The stores already warned about (once per store, as for unique locks).
_warned_local: weakref.WeakSet[Store] = weakref.WeakSet()


def _warn_local_store(job: JobContext, store: Store) -> None:
    """A store only this process sees cannot limit what other processes run."""
    if store.shared or store in _warned_local:
        return
    # The driver that delivered the job exists already; under Queue.fake() none may.
    driver = job.app.open_drivers().get(job.connection)
    if driver is None or not driver.remote:
        return
    _warned_local.add(store)
    log.warning(
        'The "%s" store holds concurrency slots, but connection "%s" is consumed by other '
        "processes, which cannot see them: each process gets its own limit. Set "
        "store='redis' (or 'database') in config/queue.py.",
        store.name,
        job.connection,
    )


async def _hold_slot(
    job: JobContext,
    keys: Sequence[str],
    lease: float,
    retry: float | None,
    call_next: CallNext,
) -> Any:
    """Run ``call_next`` holding one of ``keys`` (taken with ``add``, renewed with
    ``touch`` every third of ``lease`` while it runs, deleted by its owner after), or
    release the job after ``retry`` (None: drop it) when every key is held."""
    store = _store(job)
    _warn_local_store(job, store)
    # One owner per execution: a redelivery of the same message is another holder.
    owner = f"{job.id}:{secrets.token_hex(6)}"
    n = len(keys)
    # Starting at a random slot spreads contenders, so a refused run rarely tries all.
    first = random.randrange(n) if n > 1 else 0
    held: str | None = None
    for i in range(n):
        k = keys[(first + i) % n]
        if await store.add(k, owner, lease):
            held = k
            break
    if held is None:
        if retry is not None:
            job.release(retry)
        return None
    renewer = asyncio.ensure_future(_renew(store, held, owner, lease, job))
    try:
        return await call_next()
    finally:
        renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewer
        try:
            await store.delete(held, owner=owner)
        except Exception as e:
            # The run's outcome stands; the slot frees itself when its lease runs out.
            log.warning(
                "could not give back concurrency slot %s (%s); it frees itself within %gs",
                held,
                e,
                lease,
            )


async def _renew(store: Any, key: str, owner: str, lease: float, job: JobContext) -> None:
    """The slot's heartbeat: a long run keeps its slot; a crashed one frees it when its
    lease runs out."""
    while True:
        await asyncio.sleep(lease / 3)
        try:
            if not await store.touch(key, owner, lease):
                log.warning(
                    'Job "%s" (%s) lost its concurrency slot %s: the lease (%gs) ran out '
                    "before it was renewed; the limit may be exceeded until the job ends.",
                    job.name,
                    job.id,
                    key,
                    lease,
                )
                return
        except Exception as e:  # the store is down: the lease may still be renewed later
            log.warning("could not renew concurrency slot %s: %s", key, e)


def limit_concurrency(
    max: int,
    key: Callable[[Any], Any] | str | None = None,
    *,
    release_after: Duration | bool = "1s",
    expire_after: Duration = "1h",
) -> JobMiddleware:
    """At most ``max`` runs at once, across every worker and process sharing the queue
    store. The others are released after ``release_after`` (no try used; ``False``:
    dropped) and run later.

    ``key=None`` limits this job; a string names a limit shared by every job that uses
    it; a function of the payload splits this job's limit into partitions (``max`` per
    partition). A run holds a slot with a lease of ``expire_after``, renewed every third
    of it while it runs: a long job keeps its slot, and a crashed worker's slot frees
    itself when the lease runs out. Keys are scoped by tenant::

        @define_job(middleware=[limit_concurrency(3, key=lambda p: p["customer"],
                                                  expire_after="1m")])
        async def sync_customer(payload: dict) -> None: ...
    """
    where = f"limit_concurrency({max!r})"
    limit = _positive_int(max, f"{where}: max")
    _check_key(key, where)
    if isinstance(key, str) and not key:
        raise ConfigError(f"{where}: key must be a non-empty string")
    retry = _release_delay(release_after, where)
    lease = _lease(expire_after, where)

    async def concurrency(payload: Any, job: JobContext, call_next: CallNext) -> Any:
        if key is None:
            base = _scoped(job, "conc", "job", job.name)
        elif isinstance(key, str):
            base = _scoped(job, "conc", "name", key)
        else:
            base = _scoped(job, "conc", "job", job.name, await _key_value(job, key, payload))
        keys = [f"{base}:slot:{i}" for i in range(limit)]
        return await _hold_slot(job, keys, lease, retry, call_next)

    return concurrency


def queue_limits(app: Any) -> list[JobMiddleware]:
    """The per-queue limits of ``config/queue.py`` (``"queues": {"emails":
    {"concurrency": 5}}`` on a connection) as one middleware, or none when no connection
    has any. The worker runs it before every other middleware.

    Queue limits are global, not per tenant: queues are shared by every tenant.
    """
    limits: dict[str, dict[str, dict[str, float]]] = app.queue_config.queue_limits
    if not limits:
        return []

    async def queue_concurrency(payload: Any, job: JobContext, call_next: CallNext) -> Any:
        limit = limits.get(job.connection, {}).get(job.queue)
        if limit is None:
            return await call_next()
        base = f"haze:mw:conc:queue:{job.connection}:{job.queue}"
        keys = [f"{base}:slot:{i}" for i in range(int(limit["max"]))]
        return await _hold_slot(job, keys, limit["expire_after"], limit["release_after"], call_next)

    return [queue_concurrency]


def group_limits(app: Any) -> list[JobMiddleware]:
    """The per-group limits of ``config/queue.py`` (``"groups": {"concurrency": 2,
    "rate": "100/m"}`` on a connection) as one middleware, or none when no connection
    has any. A job without a group (``meta.group``) is not limited.

    Crash safety: a run holds its group's slot with a lease of ``expire_after`` (renewed
    every third of it while it runs), so a SIGKILLed worker's slot frees itself when the
    lease runs out; the rate is a counter per fixed window that expires with it.
    """
    connections: dict[str, dict[str, Any]] = app.queue_config.connections
    limits = {name: c["groups"] for name, c in connections.items() if c.get("groups")}
    if not limits:
        return []

    async def group_limit(payload: Any, job: JobContext, call_next: CallNext) -> Any:
        limit = limits.get(job.connection)
        meta = job.message.meta if job.message is not None else None
        group = meta.get("group") if meta else None
        if limit is None or not isinstance(group, str):
            return await call_next()
        base = f"haze:mw:group:{job.connection}:{group}"
        rate = limit.get("rate")
        rated = call_next if rate is None else lambda: _rated(job, base, rate, call_next)
        if limit.get("concurrency") is None:
            return await rated()
        keys = [f"{base}:slot:{i}" for i in range(int(limit["concurrency"]))]
        return await _hold_slot(job, keys, limit["expire_after"], 1.0, rated)

    return [group_limit]


async def _rated(job: JobContext, base: str, rate: tuple[int, float], call_next: CallNext) -> Any:
    """At most ``rate[0]`` starts of the group per window of ``rate[1]`` seconds; the
    others are released to the next window (no try used)."""
    count, window = rate
    now = time.time()
    slot = math.floor(now / window)
    if await _store(job).increment(f"{base}:rate:{slot}", 1, window * 2) > count:
        job.release(max_(0.001, (slot + 1) * window - now))
        return None
    return await call_next()


def without_overlapping(
    key: Callable[[Any], Any] | str | None = None,
    *,
    release_after: Duration | bool = "1s",
    expire_after: Duration = "1h",
    shared: bool = False,
) -> JobMiddleware:
    """One run at a time per key (default: the job name): ``limit_concurrency`` with one
    slot. Others are released after ``release_after`` (``False``: dropped). The lock is a
    lease of ``expire_after``, renewed while the job runs. Keys are scoped to the job name
    unless ``shared=True``."""
    where = "without_overlapping"
    _check_key(key, where)
    retry = _release_delay(release_after, where)
    expire = _lease(expire_after, where)

    async def no_overlap(payload: Any, job: JobContext, call_next: CallNext) -> Any:
        if key is None:
            sub = ""
        elif isinstance(key, str):
            sub = key
        else:
            sub = await _key_value(job, key, payload)
        k = _scoped(job, "overlap", sub) if shared else _scoped(job, "overlap", job.name, sub)
        return await _hold_slot(job, [k], expire, retry, call_next)

    return no_overlap


def throttles_exceptions(
    *,
    max: int = 10,
    per: Duration = "10m",
    backoff: Duration | None = None,
    key: Callable[[Any], Any] | str | None = None,
    when: Callable[[Any, Any], Any] | None = None,
) -> JobMiddleware:
    """A circuit breaker: after ``max`` exceptions within ``per``, later runs are released
    until the window ends. Exceptions still count as failed attempts; ``backoff``
    replaces the job's retry wait; one success resets the count. ``when(payload, job)``
    limits which exceptions count; the exception is ``job.error``::

        throttles_exceptions(max=5, per="1m", when=lambda p, job: isinstance(job.error, IOError))
    """
    where = "throttles_exceptions"
    limit = _positive_int(max, f"{where}: max")
    window = _duration(per, f"{where}: per", allow_zero=False)
    wait = None if backoff is None else _duration(backoff, f"{where}: backoff")
    _check_key(key, where)
    if when is not None and not callable(when):
        raise ConfigError(f"{where}: when must be a predicate (payload, job), got {when!r}")

    async def throttle(payload: Any, job: JobContext, call_next: CallNext) -> Any:
        if key is None:
            sub = job.name
        elif isinstance(key, str):
            sub = key
        else:
            sub = await _key_value(job, key, payload)
        base = _scoped(job, "throttle", sub)
        store = _store(job)
        until = await store.get(base + ":until")
        now = time.time()
        if until is not None and float(until) > now:
            job.release(float(until) - now)
            return None
        try:
            result = await call_next()
        except Exception as e:
            if when is not None:
                job._error = e
                try:
                    counts = await _maybe(when(payload, job))
                finally:
                    job._error = None
                if not counts:
                    raise
            n = await store.increment(base + ":count", 1, window)
            if n >= limit:
                await store.put(base + ":until", time.time() + window, window)
                await store.delete(base + ":count")
            if wait is not None:
                job._retry_delay = wait
            raise
        await store.delete(base + ":count")
        return result

    return throttle


def skip_if(predicate: Callable[[Any, Any], Any]) -> JobMiddleware:
    """Skip the run (it counts as done) when ``predicate(payload, job)`` is true."""
    if not callable(predicate):
        raise ConfigError(f"skip_if: expected a predicate (payload, job), got {predicate!r}")

    async def skip(payload: Any, job: JobContext, call_next: CallNext) -> Any:
        if await _maybe(predicate(payload, job)):
            return None
        return await call_next()

    return skip


def fail_on_exception(
    exceptions: Sequence[type[BaseException]] | Callable[[BaseException, Any], Any],
) -> JobMiddleware:
    """Fail at once, without the remaining tries, when the handler raises one of
    ``exceptions`` (or when ``exceptions(error, job)`` is true)."""
    if callable(exceptions) and not isinstance(exceptions, type):
        test: Callable[[BaseException, Any], Any] = exceptions
    else:
        if isinstance(exceptions, type):
            exceptions = [exceptions]
        if not isinstance(exceptions, (list, tuple)) or not exceptions:
            raise ConfigError(
                f"fail_on_exception: expected a list of exception classes, got {exceptions!r}"
            )
        for t in exceptions:
            if not (isinstance(t, type) and issubclass(t, BaseException)):
                raise ConfigError(f"fail_on_exception: {t!r} is not an exception class")
        types = tuple(exceptions)

        def test(error: BaseException, job: Any) -> bool:
            return isinstance(error, types)

    async def fail_fast(payload: Any, job: JobContext, call_next: CallNext) -> Any:
        try:
            return await call_next()
        except Exception as e:
            if await _maybe(test(e, job)):
                job.fail(e)
                return None
            raise

    return fail_fast


def skip_if_batch_cancelled() -> JobMiddleware:
    """Skip the run when the job's batch has been cancelled (read fresh)."""

    async def skip_cancelled(payload: Any, job: JobContext, call_next: CallNext) -> Any:
        batch = job.batch()
        if batch is not None and (await batch.fresh()).cancelled:
            return None
        return await call_next()

    return skip_cancelled
