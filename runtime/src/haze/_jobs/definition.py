"""Defining and dispatching jobs: ``define_job``, ``JobDefinition``, ``PendingDispatch``.

>>> @define_job(tries=3, backoff=[10, 60], timeout="30s", queue="emails")
... async def send_invoice(payload: dict, job: JobContext) -> None:
...     job.logger.info("Sending invoice %s", payload["invoice_id"])
>>> # await send_invoice.dispatch({"invoice_id": 42})
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, Unpack, overload

from haze._base.blocking import blocking_method
from haze._base.durations import Duration, parse_backoff
from haze._base.errors import JobDefinitionError, JobOptionError
from haze._base.hints import did_you_mean
from haze._jobs.options import (
    DebounceOptions,
    JobOptions,
    UniqueOptions,
    _arity,
    _check_callable,
    _check_flag,
    _check_max_exceptions,
    _check_target,
    _is_async,
    _name_of,
    _origin_of,
    _parse_debounce,
    _parse_dont_retry,
    _parse_group,
    _parse_middleware,
    _parse_tracking,
    _parse_unique,
    _payload_type,
    _positive_duration,
    checked,
)
from haze._jobs.pending import (
    DispatchResult,
    PendingDispatch,
    _Dispatching,
    _Quick,
    link_to_pending,
)
from haze._jobs.registry import _register, find_job, get_job, registered_jobs
from haze._jobs.registry import _registry as _registry  # tests save and restore it here
from haze.contracts.app import use_app

if TYPE_CHECKING:
    from haze._jobs.context import JobContext
    from haze._jobs.views import JobsApp

__all__ = [
    "DebounceOptions",
    "DispatchResult",
    "JobDefinition",
    "PendingDispatch",
    "UniqueOptions",
    "define_job",
    "find_job",
    "get_job",
    "link_to_pending",
    "registered_jobs",
]

P = TypeVar("P")
P_co = TypeVar("P_co", covariant=True)
_R = TypeVar("_R")

_UNSET: Any = object()
_new = object.__new__


# --------------------------------------------------------------------------- registry


# --------------------------------------------------------------------------- options


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
        group: str | Callable[[Any], str | None] | None = None,
        origin: str | None = None,
    ) -> None:
        if not callable(handler):
            raise JobOptionError(f"define_job: the handler must be a function, got {handler!r}")
        self.handler = handler
        self.name = name if name is not None else _name_of(handler)
        self.origin = origin or _origin_of(handler)
        where = f'job "{self.name}" ({self.origin})'
        if not isinstance(self.name, str) or not self.name or len(self.name) > 200:
            raise JobOptionError(f"{where}: name must be a non-empty string, got {self.name!r}")
        _check_name_characters(self.name, self.origin)
        if isinstance(tries, bool) or not isinstance(tries, int) or tries < 1:
            raise JobOptionError(f"{where}: tries must be an integer >= 1, got {tries!r}")
        self.tries = tries
        self.backoff = checked(parse_backoff, backoff, f"{where}: backoff")
        self.timeout = _positive_duration(timeout, f"{where}: timeout")
        self.queue, self.connection = _check_target(queue, connection, where)
        self.unique = _parse_unique(unique, where)
        self.middleware: tuple[Callable[..., Any], ...] = _parse_middleware(middleware, where)
        self.after_commit = _check_flag(after_commit, "after_commit", where)
        _check_callable(failed, "failed", where)
        self.failed = failed
        self.max_exceptions = _check_max_exceptions(max_exceptions, where)
        self.retry_until = _positive_duration(retry_until, f"{where}: retry_until")
        self.fail_on_timeout = _check_flag(fail_on_timeout, "fail_on_timeout", where)
        self.debounce = _parse_debounce(debounce, max_wait, where)
        self.encrypted = _check_flag(encrypted, "encrypted", where)
        self.dont_retry: tuple[type[BaseException], ...] = _parse_dont_retry(dont_retry, where)
        #: None: the queue config's ``track`` decides (off unless it says True).
        self.track, self.keep_result = _parse_tracking(track, keep_result, where)
        self.group = _parse_group(group, where)  # a name, or a function of the payload
        self.is_async = _is_async(handler, where)
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
        tp = self._payload_type
        if tp is _UNSET:
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
        if (
            delay is None
            and queue is None
            and connection is None
            and after_commit is None
            and group is None
        ):
            # _Quick's fields set here: an __init__ would be one more frame per dispatch
            quick: _Quick = _new(_Quick)
            quick._definition, quick._payload, quick._used = self, payload, False
            caller = sys._getframe(1)
            quick._code, quick._lasti = caller.f_code, caller.f_lasti
            return quick
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


#: The keyword options of ``define_job``, in the order the docs list them.
_OPTIONS: tuple[str, ...] = tuple(JobOptions.__annotations__)


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
def define_job(**options: Unpack[JobOptions]) -> _JobDecorator: ...
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
    ``Queue.wait``), ``keep_result`` (a duration: also keep ``handle()``'s return value)
    and ``group`` (the tenant group: a name, or a function of the payload such as
    ``lambda payload: payload["tenant"]``; workers take groups round-robin).
    """
    if fn is not None:
        if options:
            raise JobDefinitionError("define_job: pass options as @define_job(...) keywords")
        return JobDefinition(fn, origin=_origin_of(fn))

    def decorate(handler: Callable[..., Any]) -> JobDefinition[Any]:
        origin = _origin_of(handler)
        for option in options:
            if option not in _OPTIONS:
                # Checked here, not at define_job(...): the line names the job and its
                # file, as a wrong value does, in an app of many job modules.
                name = options.get("name", _name_of(handler))
                raise JobDefinitionError(
                    f'job "{name}" ({origin}): unknown option {option!r}'
                    f"{did_you_mean(option, _OPTIONS)}; options: {', '.join(_OPTIONS)}"
                )
        return JobDefinition(handler, origin=origin, **options)

    return decorate


def _check_name_characters(name: str, origin: str) -> None:
    """A job name is written into logs, failed records and database rows: a control
    character (NUL, newline, tab, ...) would cut a log line or be refused by
    PostgreSQL, costing the job its failed record. Everything else is kept."""
    for i, ch in enumerate(name):
        if ch < " " or "\x7f" <= ch <= "\x9f":
            raise JobOptionError(
                f"job {name!r} ({origin}): a job name cannot hold control characters "
                f"(NUL, newline, tab, ...); it has {ch!r} at position {i}: rename the job"
            )
