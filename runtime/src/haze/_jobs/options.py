"""The options of ``define_job``, parsed and checked once, when a job is defined.

Each bad option value is one ``JobDefinitionError`` line naming the job and the option;
``JobOptions`` is the one list of the keywords (``define_job``'s overloads read it).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar

from haze._base.durations import Duration, parse_duration
from haze._base.errors import HazeError, JobDefinitionError, JobOptionError, KeyFunctionError
from haze._base.message import check_group, check_queue_name

__all__ = ["DebounceOptions", "JobOptions", "UniqueOptions", "checked"]

_T = TypeVar("_T")


def checked(parse: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``parse(*args)``: the kernel's checks (durations, names) raise a plain ValueError,
    which a define_job option turns into its own JobOptionError (the same one line).
    haze's own errors (a backoff past the longest delay: ``DelayTooLongError``) keep
    their class: code catches them by it."""
    try:
        return parse(*args, **kwargs)
    except HazeError:
        raise
    except ValueError as e:
        raise JobOptionError(str(e)) from None


class JobOptions(TypedDict, total=False):
    """The keyword options of ``define_job`` (and of ``JobDefinition``), in the order
    the docs list them: the one list the overloads and the unknown-option check read."""

    name: str | None
    tries: int
    backoff: object
    timeout: Duration | None
    queue: str | None
    connection: str | None
    unique: object
    middleware: Sequence[Callable[..., Any]] | None
    after_commit: bool
    failed: Callable[..., Any] | None
    max_exceptions: int | None
    retry_until: Duration | None
    fail_on_timeout: bool
    debounce: object
    max_wait: Duration | None
    encrypted: bool
    dont_retry: Sequence[type[BaseException]] | type[BaseException] | None
    track: bool | None
    keep_result: Duration | None
    group: str | Callable[[Any], str | None] | None


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
        raise JobOptionError(
            f"{where}: unique must be True or a dict with 'key', 'for', 'until', got {value!r}"
        )
    unknown = set(value) - {"key", "for", "until"}
    if unknown:
        raise JobOptionError(
            f"{where}: unique has unknown option(s) {sorted(unknown)}; allowed: key, for, until"
        )
    key = value.get("key")
    if key is not None and not callable(key):
        raise JobOptionError(
            f"{where}: unique['key'] must be a function of the payload, got {key!r}"
        )
    ttl = checked(
        parse_duration, value.get("for", "1d"), f"{where}: unique['for']", allow_zero=False
    )
    until = value.get("until", "processed")
    if until not in ("processed", "processing"):
        raise JobOptionError(
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
            raise JobOptionError(f"{where}: max_wait needs debounce")
        return None
    key = None
    if isinstance(value, dict):
        unknown = set(value) - {"for", "max_wait", "key"}
        if unknown:
            raise JobOptionError(f"{where}: debounce has unknown option(s) {sorted(unknown)}")
        key = value.get("key")
        if key is not None and not callable(key):
            raise JobOptionError(f"{where}: debounce['key'] must be a function of the payload")
        if max_wait is None:
            max_wait = value.get("max_wait")
        value = value.get("for")
    wait = checked(parse_duration, value, f"{where}: debounce", allow_zero=False)
    mw = None if max_wait is None else checked(parse_duration, max_wait, f"{where}: max_wait")
    if mw is not None and mw < wait:
        raise JobOptionError(f"{where}: max_wait ({mw}s) must be at least debounce ({wait}s)")
    return DebounceOptions(wait, mw, key)


def _parse_group(value: object, where: str) -> str | Callable[[Any], str | None] | None:
    """``group``: one tenant group for every dispatch, or a function of the payload."""
    if value is None or callable(value):
        return value
    if isinstance(value, str):
        return checked(check_group, value, f"{where}: group")
    raise JobOptionError(
        f"{where}: group must be a group name or a function of the payload "
        f"(group=lambda payload: payload['tenant']), got {value!r}"
    )


def group_of(job_name: str, group: Callable[[Any], str | None], payload: Any) -> str | None:
    """The group ``define_job(group=fn)`` gives ``payload``: one line naming the job when
    the function raises (``KeyFunctionError``, as a unique or debounce key function's) or
    returns something that is no group (``ValueError``)."""
    try:
        value = group(payload)
    except Exception as e:
        said = (str(e).splitlines() or [""])[0]  # the error stays one line
        raise KeyFunctionError(
            f'Job "{job_name}": its group key function raised {type(e).__name__}: '
            f"{said} for this payload; nothing was queued"
        ) from e
    return None if value is None else check_group(value, f'job "{job_name}": group')


def _check_callable(value: object, option: str, where: str) -> None:
    if value is not None and not callable(value):
        raise JobOptionError(f"{where}: {option} must be callable, got {value!r}")


def _check_flag(value: object, option: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise JobOptionError(f"{where}: {option} must be True or False, got {value!r}")
    return value


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


def _positive_duration(value: Duration | None, what: str) -> float | None:
    return None if value is None else checked(parse_duration, value, what, allow_zero=False)


def _check_target(queue: object, connection: object, where: str) -> tuple[Any, Any]:
    for opt, val in (("queue", queue), ("connection", connection)):
        if val is not None and (not isinstance(val, str) or not val):
            raise JobOptionError(f"{where}: {opt} must be a non-empty string, got {val!r}")
    if queue is not None:
        checked(check_queue_name, queue, f"{where}: queue")
    return queue, connection


def _parse_middleware(middleware: object, where: str) -> tuple[Callable[..., Any], ...]:
    if middleware is None:
        middleware = ()
    if not isinstance(middleware, (list, tuple)):
        raise JobOptionError(f"{where}: middleware must be a list, got {middleware!r}")
    for i, mw in enumerate(middleware):
        if not callable(mw):
            raise JobOptionError(f"{where}: middleware[{i}] must be callable, got {mw!r}")
    return tuple(middleware)


def _check_max_exceptions(value: object, where: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise JobOptionError(f"{where}: max_exceptions must be an integer >= 1, got {value!r}")
    return value


def _parse_dont_retry(
    value: Sequence[type[BaseException]] | type[BaseException] | None, where: str
) -> tuple[type[BaseException], ...]:
    if value is not None and not isinstance(value, (type, list, tuple)):
        raise JobOptionError(
            f"{where}: dont_retry must be an exception class or a list of them, got {value!r}"
        )
    items: Sequence[object] = (
        () if value is None else (value,) if isinstance(value, type) else value
    )
    for t in items:
        if not (isinstance(t, type) and issubclass(t, BaseException)):
            raise JobOptionError(f"{where}: dont_retry must list exception classes, got {t!r}")
    return tuple(t for t in items if isinstance(t, type) and issubclass(t, BaseException))


def _parse_tracking(
    track: object, keep_result: Duration | None, where: str
) -> tuple[bool | None, float | None]:
    if track is not None and not isinstance(track, bool):
        raise JobOptionError(f"{where}: track must be True or False, got {track!r}")
    keep = _positive_duration(keep_result, f"{where}: keep_result")
    if track is False and keep is not None:
        raise JobOptionError(
            f"{where}: keep_result needs a status record; drop track=False (keep_result "
            "tracks the job)"
        )
    return track, keep


def _is_async(handler: Callable[..., Any], where: str) -> bool:
    """Whether calling ``handler`` returns a coroutine: an ``async def`` function or
    method, a ``functools.partial`` of one, or an object whose class's ``__call__`` is
    ``async def``. A plain ``def`` wrapping an async function (a decorator) is not
    counted even with ``__wrapped__``: it may run the function itself (a sync adapter).
    It runs as a sync handler, and the pipeline awaits whatever awaitable it returns.

    A generator function is refused: calling it runs none of its body, so every run
    would count as done with nothing done."""
    fn: Any = handler
    while isinstance(fn, functools.partial):
        fn = fn.func
    if not (inspect.isfunction(fn) or inspect.ismethod(fn) or isinstance(fn, type)):
        fn = type(fn).__call__  # a callable object: what calling it runs
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise JobDefinitionError(
            f"{where}: the handler yields, so calling it runs none of its body; return "
            "(or await) instead of yield"
        )
    return inspect.iscoroutinefunction(fn)


def _name_of(handler: Callable[..., Any]) -> str:
    """The job name a handler gives: its ``__name__`` (a callable object or a partial
    has none: the job is named with ``name=``)."""
    name = getattr(handler, "__name__", None)
    if not isinstance(name, str):
        raise JobDefinitionError(
            f"define_job: the handler {handler!r} has no __name__ to name the job by; "
            "name it: @define_job(name=...)"
        )
    return name


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
    while isinstance(fn, functools.partial):
        fn = fn.func
    code = getattr(fn, "__code__", None)
    if code is None and not isinstance(fn, type):  # a callable object: its __call__
        code = getattr(type(fn).__call__, "__code__", None)
    if code is not None:
        return f"{code.co_filename}:{code.co_firstlineno}"
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    return f"{getattr(module, '__file__', '?')}:{getattr(fn, '__qualname__', '?')}"
