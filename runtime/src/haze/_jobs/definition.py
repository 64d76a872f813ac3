"""Defining and dispatching jobs: ``define_job``, ``JobDefinition``, ``PendingDispatch``.

>>> @define_job(tries=3, backoff=[10, 60], timeout="30s", queue="emails")
... async def send_invoice(payload: dict, job: JobContext) -> None:
...     job.logger.info("Sending invoice %s", payload["invoice_id"])
>>> # await send_invoice.dispatch({"invoice_id": 42})
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import typing
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, overload

from haze._jobs import status
from haze._kernel.blocking import blocking_method
from haze._kernel.crypto import seal_link, unseal_link
from haze._kernel.durations import Duration, check_delay, parse_backoff, parse_duration
from haze._kernel.errors import DuplicateJobError, JobDefinitionError, UnknownJobError
from haze._kernel.hints import did_you_mean
from haze._kernel.message import check_queue_name
from haze.contracts.app import use_app

if TYPE_CHECKING:
    from haze._jobs.context import JobContext
    from haze._jobs.views import JobsApp

__all__ = [
    "DispatchResult",
    "JobDefinition",
    "PendingDispatch",
    "define_job",
    "get_job",
    "link_to_pending",
    "registered_jobs",
]

P = TypeVar("P")
P_co = TypeVar("P_co", covariant=True)
_R = TypeVar("_R")

_UNSET: Any = object()


@dataclass(frozen=True, slots=True)
class DispatchResult:
    """What a pending dispatch, chain or deferred dispatch returns.

    ``skipped``: a unique job already held the lock (``id`` is then the holder's id).
    ``deferred``: the enqueue waits for the outermost transaction commit.
    """

    id: str
    skipped: bool = False
    deferred: bool = False
    chain_id: str | None = None

    def __init__(
        self, id: str, skipped: bool = False, deferred: bool = False, chain_id: str | None = None
    ) -> None:
        # The generated frozen __init__ looks up object.__setattr__ once per field; one is
        # made per dispatch, and this halves its cost. Still frozen: __setattr__ raises.
        _set(self, "id", id)
        _set(self, "skipped", skipped)
        _set(self, "deferred", deferred)
        _set(self, "chain_id", chain_id)

    async def wait(self, timeout: Duration | None = None) -> status.JobStatus:
        """Wait until the job (tracked: ``track=True`` or ``keep_result``) is final and
        return its ``JobStatus``; ``TimeoutError`` after ``timeout``. A deferred dispatch
        waits for its commit too.

        >>> # status = await report.with_({"month": 11}).dispatch(); (await status.wait(60)).result
        """
        limit = None if timeout is None else parse_duration(timeout, "DispatchResult.wait(timeout)")
        app: JobsApp = use_app()
        return await status.wait_final(app.manager, self.id, limit, pending_ok=self.deferred)

    wait_blocking = blocking_method(wait)


_set = object.__setattr__

# --------------------------------------------------------------------------- registry

_registry: dict[str, JobDefinition[Any]] = {}


def _register(defn: JobDefinition[Any]) -> None:
    existing = _registry.get(defn.name)
    if existing is not None and existing is not defn and existing.origin != defn.origin:
        raise DuplicateJobError(
            f'Two different jobs are named "{defn.name}": one defined at {existing.origin}, '
            f"the other at {defn.origin}. Rename one of them or pass name=... to define_job."
        )
    _registry[defn.name] = defn


def get_job(name: str) -> JobDefinition[Any]:
    """The job registered under ``name``; raises ``UnknownJobError``."""
    try:
        return _registry[name]
    except KeyError:
        raise UnknownJobError(name, _registry) from None


def find_job(name: str) -> JobDefinition[Any] | None:
    """The job registered under ``name``, or None."""
    return _registry.get(name)


def registered_jobs() -> dict[str, JobDefinition[Any]]:
    """A copy of the process-wide registry (name -> definition)."""
    return dict(_registry)


# --------------------------------------------------------------------------- options


@dataclass(slots=True)
class UniqueOptions:
    key: Callable[[Any], Any] | None
    ttl: float
    until: str


def _parse_unique(value: object, where: str) -> UniqueOptions | None:
    if value is None or value is False:
        return None
    if value is True:
        return UniqueOptions(None, 86400.0, "processed")
    if not isinstance(value, dict):
        raise ValueError(
            f"{where}: unique must be True or a dict with 'key', 'for', 'until', got {value!r}"
        )
    unknown = set(value) - {"key", "for", "until"}
    if unknown:
        raise ValueError(
            f"{where}: unique has unknown option(s) {sorted(unknown)}; allowed: key, for, until"
        )
    key = value.get("key")
    if key is not None and not callable(key):
        raise ValueError(f"{where}: unique['key'] must be a function of the payload, got {key!r}")
    ttl = parse_duration(value.get("for", "1d"), f"{where}: unique['for']", allow_zero=False)
    until = value.get("until", "processed")
    if until not in ("processed", "processing"):
        raise ValueError(
            f"{where}: unique['until'] must be 'processed' or 'processing', got {until!r}"
        )
    return UniqueOptions(key, ttl, until)


@dataclass(slots=True)
class DebounceOptions:
    wait: float
    max_wait: float | None
    key: Callable[[Any], Any] | None


def _parse_debounce(value: object, max_wait: object, where: str) -> DebounceOptions | None:
    if value is None or value is False:
        if max_wait is not None:
            raise ValueError(f"{where}: max_wait needs debounce")
        return None
    key = None
    if isinstance(value, dict):
        unknown = set(value) - {"for", "max_wait", "key"}
        if unknown:
            raise ValueError(f"{where}: debounce has unknown option(s) {sorted(unknown)}")
        key = value.get("key")
        if key is not None and not callable(key):
            raise ValueError(f"{where}: debounce['key'] must be a function of the payload")
        if max_wait is None:
            max_wait = value.get("max_wait")
        value = value.get("for")
    wait = parse_duration(value, f"{where}: debounce", allow_zero=False)
    mw = None if max_wait is None else parse_duration(max_wait, f"{where}: max_wait")
    if mw is not None and mw < wait:
        raise ValueError(f"{where}: max_wait ({mw}s) must be at least debounce ({wait}s)")
    return DebounceOptions(wait, mw, key)


def _check_callable(value: object, option: str, where: str) -> None:
    if value is not None and not callable(value):
        raise ValueError(f"{where}: {option} must be callable, got {value!r}")


def _payload_type(fn: Callable[..., Any]) -> Any:
    """The annotation of the handler's first parameter, if it is a dataclass or pydantic model."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        return None
    params = list(inspect.signature(fn).parameters)
    if not params:
        return None
    tp = hints.get(params[0])
    if isinstance(tp, type) and (dataclasses.is_dataclass(tp) or hasattr(tp, "model_validate")):
        return tp
    return None


# --------------------------------------------------------------------------- definition


class JobDefinition(Generic[P]):
    """A registered job: its handler and options. Made by ``@define_job``.

    Call ``await job.dispatch(payload)`` to queue it, ``job.with_(payload)`` for a
    pending dispatch (chains, batches, options), or ``await job(payload, ctx)`` to
    run the handler directly in a test.
    """

    def __init__(
        self,
        handler: Callable[..., Any],
        *,
        name: str | None = None,
        tries: int = 1,
        backoff: object = 0,
        timeout: Duration | None = None,
        queue: str | None = None,
        connection: str | None = None,
        unique: object = None,
        middleware: Sequence[Callable[..., Any]] | None = None,
        after_commit: bool = False,
        failed: Callable[..., Any] | None = None,
        max_exceptions: int | None = None,
        retry_until: Duration | None = None,
        fail_on_timeout: bool = False,
        debounce: object = None,
        max_wait: Duration | None = None,
        encrypted: bool = False,
        dont_retry: Sequence[type[BaseException]] | type[BaseException] | None = None,
        track: bool | None = None,
        keep_result: Duration | None = None,
        origin: str | None = None,
    ) -> None:
        if not callable(handler):
            raise ValueError(f"define_job: the handler must be a function, got {handler!r}")
        self.handler = handler
        self.name = name if name is not None else handler.__name__
        self.origin = origin or _origin_of(handler)
        where = f'job "{self.name}" ({self.origin})'
        if not isinstance(self.name, str) or not self.name or len(self.name) > 200:
            raise ValueError(f"{where}: name must be a non-empty string, got {self.name!r}")
        if isinstance(tries, bool) or not isinstance(tries, int) or tries < 1:
            raise ValueError(f"{where}: tries must be an integer >= 1, got {tries!r}")
        self.tries = tries
        self.backoff = parse_backoff(backoff, f"{where}: backoff")
        self.timeout = _positive_duration(timeout, f"{where}: timeout")
        self.queue, self.connection = _check_target(queue, connection, where)
        self.unique = _parse_unique(unique, where)
        self.middleware: tuple[Callable[..., Any], ...] = _parse_middleware(middleware, where)
        if not isinstance(after_commit, bool):
            raise ValueError(f"{where}: after_commit must be True or False, got {after_commit!r}")
        self.after_commit = after_commit
        _check_callable(failed, "failed", where)
        self.failed = failed
        self.max_exceptions = _check_max_exceptions(max_exceptions, where)
        self.retry_until = _positive_duration(retry_until, f"{where}: retry_until")
        self.fail_on_timeout = bool(fail_on_timeout)
        self.debounce = _parse_debounce(debounce, max_wait, where)
        self.encrypted = bool(encrypted)
        self.dont_retry: tuple[type[BaseException], ...] = _parse_dont_retry(dont_retry, where)
        #: None: the queue config's ``track`` decides (off unless it says True).
        self.track, self.keep_result = _parse_tracking(track, keep_result, where)
        self.is_async = inspect.iscoroutinefunction(handler)
        self._n_params = _arity(handler, where)
        self._payload_type: Any = _UNSET
        _register(self)

    # -- payload conversion (dataclass / pydantic) ---------------------------------

    @property
    def payload_type(self) -> Any:
        if self._payload_type is _UNSET:
            self._payload_type = _payload_type(self.handler) if self._n_params else None
        return self._payload_type

    def to_wire(self, payload: Any) -> Any:
        """The JSON form of ``payload`` (dataclasses and pydantic models become dicts)."""
        if payload is None or isinstance(payload, (dict, list, str, int, float, bool)):
            return payload
        if dataclasses.is_dataclass(payload) and not isinstance(payload, type):
            return dataclasses.asdict(payload)
        dump = getattr(payload, "model_dump", None)
        if callable(dump):
            return dump(mode="json")
        return payload

    def from_wire(self, data: Any) -> Any:
        tp = self.payload_type
        if tp is None or data is None:
            return data
        if hasattr(tp, "model_validate"):
            return tp.model_validate(data)
        if isinstance(data, dict):
            return tp(**data)
        return data

    # -- calling -----------------------------------------------------------------

    def __call__(self, payload: P | None = None, job: JobContext | None = None) -> Any:
        """Run the handler directly (no queue, no middleware): for unit tests."""
        if self._n_params == 0:
            return self.handler()
        if self._n_params == 1:
            return self.handler(payload)
        return self.handler(payload, job)

    def on_failed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: ``fn(payload, error, job)`` runs after the last try failed."""
        _check_callable(fn, "on_failed", f'job "{self.name}"')
        self.failed = fn
        return fn

    def with_(self, payload: P | None = None) -> PendingDispatch[P]:
        """A pending dispatch for chains, batches and per-dispatch options."""
        return PendingDispatch(self, payload)

    def dispatch(
        self,
        payload: P | None = None,
        *,
        delay: Duration | None = None,
        queue: str | None = None,
        connection: str | None = None,
        after_commit: bool | None = None,
        group: str | None = None,
    ) -> Coroutine[Any, Any, str]:
        """Queue the job; returns its id (for a unique job already queued: the holder's id).

        Nothing is queued until it is awaited; one never awaited warns, naming the job.
        """
        coro = self._dispatch(payload, delay, queue, connection, after_commit, group)
        return _Dispatching(coro, self.name, sys._getframe(1))

    async def _dispatch(
        self,
        payload: P | None,
        delay: Duration | None,
        queue: str | None,
        connection: str | None,
        after_commit: bool | None,
        group: str | None,
    ) -> str:
        pending = PendingDispatch(self, payload)
        if delay is not None or queue is not None or connection is not None:
            pending._set(delay=delay, queue=queue, connection=connection)
        if after_commit is not None or group is not None:
            pending._set(after_commit=after_commit, group=group)
        app: JobsApp = use_app()
        result = await app.manager.dispatcher.dispatch(pending)
        return result.id

    dispatch_blocking = blocking_method(dispatch)

    def __repr__(self) -> str:
        return f"<JobDefinition {self.name!r} from {self.origin}>"


class _Dispatching(Coroutine[Any, Any, _R]):
    """A dispatch's coroutine that, dropped without being awaited, warns naming the job
    and the line that dispatched (Python's own warning names only ``dispatch``)."""

    __slots__ = ("_coro", "_job", "_line", "_used")

    def __init__(self, coro: Coroutine[Any, Any, _R], job: str, caller: FrameType) -> None:
        self._coro = coro
        self._job = job
        self._line = (caller.f_code.co_filename, caller.f_lineno)
        self._used = False

    def __await__(self) -> Generator[Any, None, _R]:
        self._used = True
        return self._coro.__await__()

    def send(self, value: Any) -> Any:
        self._used = True
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        self._used = True
        return self._coro.throw(typ, val, tb)

    def close(self) -> None:
        self._used = True
        self._coro.close()

    def __del__(self) -> None:
        if self._used:
            return
        self._coro.close()  # not started: closing it silences Python's own warning
        warnings.warn_explicit(
            f"job {self._job!r}: dispatch() was never awaited, so nothing was queued; "
            "did you forget `await`?",
            RuntimeWarning,
            *self._line,
        )


def _positive_duration(value: Duration | None, what: str) -> float | None:
    return None if value is None else parse_duration(value, what, allow_zero=False)


def _check_target(queue: object, connection: object, where: str) -> tuple[Any, Any]:
    for opt, val in (("queue", queue), ("connection", connection)):
        if val is not None and (not isinstance(val, str) or not val):
            raise ValueError(f"{where}: {opt} must be a non-empty string, got {val!r}")
    if queue is not None:
        check_queue_name(queue, f"{where}: queue")
    return queue, connection


def _parse_middleware(middleware: object, where: str) -> tuple[Callable[..., Any], ...]:
    if middleware is None:
        middleware = ()
    if not isinstance(middleware, (list, tuple)):
        raise ValueError(f"{where}: middleware must be a list, got {middleware!r}")
    for i, mw in enumerate(middleware):
        if not callable(mw):
            raise ValueError(f"{where}: middleware[{i}] must be callable, got {mw!r}")
    return tuple(middleware)


def _check_max_exceptions(value: object, where: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{where}: max_exceptions must be an integer >= 1, got {value!r}")
    return value


def _parse_dont_retry(
    value: Sequence[type[BaseException]] | type[BaseException] | None, where: str
) -> tuple[type[BaseException], ...]:
    items: Sequence[object] = (
        () if value is None else (value,) if isinstance(value, type) else value
    )
    for t in items:
        if not (isinstance(t, type) and issubclass(t, BaseException)):
            raise ValueError(f"{where}: dont_retry must list exception classes, got {t!r}")
    return tuple(t for t in items if isinstance(t, type) and issubclass(t, BaseException))


def _parse_tracking(
    track: object, keep_result: Duration | None, where: str
) -> tuple[bool | None, float | None]:
    if track is not None and not isinstance(track, bool):
        raise ValueError(f"{where}: track must be True or False, got {track!r}")
    keep = _positive_duration(keep_result, f"{where}: keep_result")
    if track is False and keep is not None:
        raise ValueError(
            f"{where}: keep_result needs a status record; drop track=False (keep_result "
            "tracks the job)"
        )
    return track, keep


def _arity(handler: Callable[..., Any], where: str) -> int:
    """How many of ``(payload, job)`` the handler takes: 0, 1 or 2.

    A handler that needs more than that (a third required parameter, a required
    keyword-only one) could never run: it is refused here, at import, not by the worker.
    """
    try:
        params = list(inspect.signature(handler).parameters.values())
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return 2
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p.name for p in positional if p.default is p.empty]
    keyword_only = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    if len(required) > 2 or keyword_only:
        extra = required[2:] + keyword_only
        raise JobDefinitionError(
            f"{where}: the handler must be callable as (payload) or (payload, job), but it "
            f"also requires {', '.join(repr(n) for n in extra)}; give "
            f"{'it' if len(extra) == 1 else 'them'} a default or remove "
            f"{'it' if len(extra) == 1 else 'them'}"
        )
    if positional and _is_job_context(positional[0], positional[1:2]):
        first = positional[0].name
        rest = [p.name for p in positional[1:2] if p.name != first]
        context = first if first != "payload" else "job"
        data = rest[0] if rest and rest[0] != context else "payload"
        raise JobDefinitionError(
            f"{where}: the handler's first parameter receives the payload and the second "
            f"the JobContext, but {first!r} comes first and is the job; write the handler "
            f"as ({data}, {context}: JobContext)"
        )
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 2
    return min(len(positional), 2)


#: Names a handler gives its JobContext parameter.
_JOB_NAMES = frozenset({"job", "ctx", "context", "job_context"})


def _is_job_context(first: inspect.Parameter, rest: list[inspect.Parameter]) -> bool:
    """Whether ``first`` (the parameter haze passes the payload to) is meant for the
    JobContext: annotated so, or named like it with a parameter after it that is not."""
    annotation = first.annotation
    # by name: a string under `from __future__ import annotations`, the class otherwise
    named = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    if named.rsplit(".", 1)[-1] == "JobContext":
        return True
    if first.name not in _JOB_NAMES or not rest:
        return False
    # (job, data) as much as (job, payload): the second gets the JobContext, so any
    # name but a context's own means the two are swapped ((job, ctx): job is the data).
    second = rest[0].annotation
    second_named = second if isinstance(second, str) else getattr(second, "__name__", "")
    return rest[0].name not in _JOB_NAMES and second_named.rsplit(".", 1)[-1] != "JobContext"


def _origin_of(fn: Callable[..., Any]) -> str:
    code = getattr(fn, "__code__", None)
    if code is not None:
        return f"{code.co_filename}:{code.co_firstlineno}"
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    return f"{getattr(module, '__file__', '?')}:{getattr(fn, '__qualname__', '?')}"


class PendingDispatch(Generic[P]):
    """A job with a payload and per-dispatch options, not yet queued.

    >>> # await send_invoice.with_({"invoice_id": 42}).on_queue("high").delay("1m").dispatch()
    """

    __slots__ = ("_after_commit", "_connection", "_delay", "_group", "_queue", "job", "payload")

    def __init__(self, job: JobDefinition[P], payload: P | None) -> None:
        self.job = job
        self.payload = payload
        self._queue: str | None = None
        self._connection: str | None = None
        self._delay: float | None = None
        self._after_commit: bool | None = None
        self._group: str | None = None

    def _set(
        self,
        *,
        delay: Duration | None = None,
        queue: str | None = None,
        connection: str | None = None,
        after_commit: bool | None = None,
        group: str | None = None,
    ) -> None:
        if delay is not None:
            self.delay(delay)
        if queue is not None:
            self.on_queue(queue)
        if connection is not None:
            self.on_connection(connection)
        if after_commit is not None:
            self.after_commit(after_commit)
        if group is not None:
            self.on_group(group)

    def on_queue(self, queue: str) -> PendingDispatch[P]:
        self._queue = check_queue_name(queue, "on_queue")
        return self

    def on_connection(self, connection: str) -> PendingDispatch[P]:
        if not isinstance(connection, str) or not connection:
            raise ValueError(f"on_connection: expected a connection name, got {connection!r}")
        self._connection = connection
        return self

    def delay(self, delay: Duration) -> PendingDispatch[P]:
        self._delay = check_delay(parse_duration(delay, "delay"))
        return self

    def after_commit(self, flag: bool = True) -> PendingDispatch[P]:
        if not isinstance(flag, bool):
            raise ValueError(f"after_commit: expected True or False, got {flag!r}")
        self._after_commit = flag
        return self

    def on_group(self, group: str) -> PendingDispatch[P]:
        """SQS FIFO message group id (ignored by other drivers)."""
        if not isinstance(group, str) or not group:
            raise ValueError(f"on_group: expected a group id, got {group!r}")
        self._group = group
        return self

    def to_link(self, app: JobsApp | None = None) -> dict[str, Any]:
        """The JSON form used in chains and callbacks (name, payload, explicit options).

        An ``encrypted`` job's link carries ``enc`` (encrypted with the key of ``app``,
        default: the current app) in place of ``payload``: links are stored with the
        chain, the batch or the failed job.
        """
        link: dict[str, Any] = {"job": self.job.name, "payload": self.job.to_wire(self.payload)}
        if self._queue is not None:
            link["queue"] = self._queue
        if self._connection is not None:
            link["connection"] = self._connection
        if self._delay:
            link["delay"] = self._delay
        if self._group is not None:
            link["group"] = self._group
        if self.job.encrypted:
            link = seal_link(app if app is not None else use_app(), link)
        return link

    def dispatch(self) -> Coroutine[Any, Any, DispatchResult]:
        """Queue it. Nothing is queued until it is awaited; one never awaited warns."""
        return _Dispatching(self._dispatch(), self.job.name, sys._getframe(1))

    async def _dispatch(self) -> DispatchResult:
        app: JobsApp = use_app()
        return await app.manager.dispatcher.dispatch(self)

    dispatch_blocking = blocking_method(dispatch)

    def __repr__(self) -> str:
        return f"<PendingDispatch {self.job.name} payload={self.payload!r}>"


def link_to_pending(link: dict[str, Any], app: JobsApp) -> PendingDispatch[Any]:
    """Rebuild a pending dispatch from its JSON link (chains, callbacks; the inverse of
    ``PendingDispatch.to_link``); an encrypted link is decrypted with ``app``'s key."""
    job = get_job(link["job"])
    payload = unseal_link(app, link) if "enc" in link else link.get("payload")
    p: PendingDispatch[Any] = PendingDispatch(job, job.from_wire(payload))
    if link.get("queue"):
        p._queue = link["queue"]
    if link.get("connection"):
        p._connection = link["connection"]
    if link.get("delay"):
        p._delay = float(link["delay"])
    if link.get("group"):
        p._group = link["group"]
    return p


#: The keyword options of ``define_job``, in the order the docs list them.
_OPTIONS: tuple[str, ...] = tuple(
    name
    for name in inspect.signature(JobDefinition.__init__).parameters
    if name not in ("self", "handler", "origin")
)


# --------------------------------------------------------------------------- define_job


class _JobDecorator(Protocol):
    @overload
    def __call__(self, fn: Callable[[P, JobContext], Awaitable[Any]]) -> JobDefinition[P]: ...
    @overload
    def __call__(self, fn: Callable[[P], Awaitable[Any]]) -> JobDefinition[P]: ...
    @overload
    def __call__(self, fn: Callable[[], Awaitable[Any]]) -> JobDefinition[None]: ...
    @overload
    def __call__(self, fn: Callable[[P, JobContext], Any]) -> JobDefinition[P]: ...
    @overload
    def __call__(self, fn: Callable[[P], Any]) -> JobDefinition[P]: ...
    @overload
    def __call__(self, fn: Callable[[], Any]) -> JobDefinition[None]: ...


@overload
def define_job(fn: Callable[[P, JobContext], Awaitable[Any]], /) -> JobDefinition[P]: ...
@overload
def define_job(fn: Callable[[P], Awaitable[Any]], /) -> JobDefinition[P]: ...
@overload
def define_job(fn: Callable[[], Awaitable[Any]], /) -> JobDefinition[None]: ...
@overload
def define_job(fn: Callable[[P, JobContext], Any], /) -> JobDefinition[P]: ...
@overload
def define_job(fn: Callable[[P], Any], /) -> JobDefinition[P]: ...
@overload
def define_job(fn: Callable[[], Any], /) -> JobDefinition[None]: ...
@overload
def define_job(
    *,
    name: str | None = None,
    tries: int = 1,
    backoff: object = 0,
    timeout: Duration | None = None,
    queue: str | None = None,
    connection: str | None = None,
    unique: object = None,
    middleware: Sequence[Callable[..., Any]] | None = None,
    after_commit: bool = False,
    failed: Callable[..., Any] | None = None,
    max_exceptions: int | None = None,
    retry_until: Duration | None = None,
    fail_on_timeout: bool = False,
    debounce: object = None,
    max_wait: Duration | None = None,
    encrypted: bool = False,
    dont_retry: Sequence[type[BaseException]] | type[BaseException] | None = None,
    track: bool | None = None,
    keep_result: Duration | None = None,
) -> _JobDecorator: ...
def define_job(fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Define a job from a handler ``(payload, job)`` (async or plain, both params optional).

    >>> @define_job(tries=3, backoff="exponential", queue="emails")
    ... async def send_invoice(payload: dict, job: JobContext) -> None: ...

    Options: ``name`` (default: the function name), ``tries`` (1), ``backoff`` (0:
    seconds, "5m", a list by retry, or "exponential"), ``timeout``, ``queue``
    ("default"), ``connection`` (the config default), ``unique`` (True or
    ``{"key", "for", "until"}``), ``middleware``, ``after_commit``, ``failed``, and
    ``max_exceptions``, ``retry_until``, ``fail_on_timeout``, ``debounce``/``max_wait``,
    ``encrypted``, ``dont_retry``, ``track`` (keep a status record: ``Queue.status``,
    ``Queue.wait``) and ``keep_result`` (a duration: also keep ``handle()``'s return value).
    """
    if fn is not None:
        if options:
            raise TypeError("define_job: pass options as @define_job(...) keywords")
        return JobDefinition(fn, origin=_origin_of(fn))
    for option in options:
        if option not in _OPTIONS:
            raise JobDefinitionError(
                f"define_job: unknown option {option!r}{did_you_mean(option, _OPTIONS)}; "
                f"options: {', '.join(_OPTIONS)}"
            )

    def decorate(handler: Callable[..., Any]) -> JobDefinition[Any]:
        return JobDefinition(handler, origin=_origin_of(handler), **options)

    return decorate
