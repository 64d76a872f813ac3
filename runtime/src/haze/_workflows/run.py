"""``WorkflowRun``: the ``run`` a workflow's handler receives, and every rule of a run.

The rules are here, once, whatever engine carries the calls out (haze's store engine,
Cloudflare Workflows, Lambda durable functions): step names (1-255 characters, unique in
a run), the step limit, sleep and wait lengths, JSON results and their size, step
retries, ``step_key``, and the nondeterminism check with its message. The effect of
each call is the ``StepEngine``'s (``haze.contracts.workflow``).

>>> # @workflow(name="onboard")
>>> # async def onboard(run, user_id: int):
>>> #     user = await run.step("fetch", fetch_user, user_id)
>>> #     await run.sleep("cool-off", "2d")
"""

from __future__ import annotations

import contextvars
import inspect
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from haze._base.durations import Duration, parse_backoff, parse_duration
from haze._base.errors import (
    WorkflowLimitError,
    WorkflowNondeterminismError,
    WorkflowResultError,
)
from haze.contracts.app import use_app
from haze.contracts.workflow import StepEngine, StepRetry

if TYPE_CHECKING:
    from haze._jobs.definition import PendingDispatch

__all__ = [
    "DEFAULT_MAX_STEPS",
    "MAX_NAME",
    "MAX_WAIT",
    "WorkflowRun",
    "check_name",
    "decode",
    "encode_result",
    "nondeterminism",
]

#: Steps (of every kind) one run may reach, unless ``@workflow(max_steps=...)`` says.
DEFAULT_MAX_STEPS = 10_000
#: The longest step or event name.
MAX_NAME = 255
#: The longest sleep or wait: 365 days.
MAX_WAIT = 365 * 86400.0

_T = TypeVar("_T")
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
#: The step whose call is running in this task (``run.step_key``).
_current_step: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "haze_workflow_step", default=None
)


def check_name(name: object, what: str, where: str) -> str:
    """``name`` if it can name a step or an event: a string of 1-255 characters."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        shown = f"{len(name)} characters" if isinstance(name, str) and name else repr(name)
        article = "an" if what[:1] in "aeiou" else "a"
        raise WorkflowLimitError(
            f"{where}: {article} {what} name must be a string of 1-{MAX_NAME} characters, "
            f"got {shown}"
        )
    return name


def encode_result(value: Any, where: str, limit: int | None = None, rule: str | None = None) -> str:
    """The JSON text of a step's result (or a run's output); ``WorkflowResultError``
    when it is not JSON, ``WorkflowLimitError`` when past ``limit`` bytes (``rule`` names
    whose limit it is, when not the connection's ``max_message_size``)."""
    try:
        text: str = _encode(value)
    except (TypeError, ValueError) as e:
        raise WorkflowResultError(
            f"{where} returned {type(value).__name__}, which is not JSON ({e}); return "
            "dicts, lists, strings, numbers, booleans or None"
        ) from None
    if limit is not None:
        size = len(text.encode())
        if size > limit and rule is not None:
            raise WorkflowLimitError(
                f"{where} returned {size} bytes of JSON, over {rule} of {limit} bytes; "
                "keep large data outside (a file, a bucket) and return its key"
            )
        if size > limit:
            raise WorkflowLimitError(
                f"{where} returned {size} bytes of JSON, over the connection's "
                f"max_message_size of {limit} bytes; keep large data outside (a file, a "
                'bucket) and return its key, or give the connection an "offload" store'
            )
    return text


def nondeterminism(where: str, position: int, kept: str, name: str) -> WorkflowNondeterminismError:
    """The error of a replay that reached ``name`` where ``kept`` was recorded."""
    return WorkflowNondeterminismError(
        f'{where}: step {position + 1} of this run is "{kept}", but this '
        f'replay reached "{name}" there; the steps must come in the same order on '
        "every replay (do not branch on anything but step results; let runs of "
        "the old code finish or cancel them before changing the order of steps)"
    )


def decode(text: str | None) -> Any:
    return None if text is None else json.loads(text)


class LargeResults(Protocol):
    """Where a step result over the threshold goes instead of the run's record (the
    store engine's offload: ``haze._workflows.results``)."""

    def wanted(self, text: str) -> bool: ...

    async def put(self, text: str) -> str: ...

    async def get(self, text: str) -> str: ...


class WorkflowRun:
    """What a workflow's handler receives as ``run``: steps, sleeps, events, fan-out
    and once-per-run dispatches, each by a name unique in the run.

    >>> # user = await run.step("fetch", fetch_user, 7, tries=3, backoff="10s")
    >>> # await run.sleep("cool-off", "2d")
    >>> # answer = await run.wait_for_event("approved", timeout="7d")  # None on timeout
    >>> # a, b = await run.gather(run.step("mail", mail, user), run.step("crm", crm, user))
    >>> # await run.dispatch(audit.with_({"user": 7}))
    """

    def __init__(
        self,
        id: str,
        workflow: str,
        engine: StepEngine,
        *,
        max_steps: int = DEFAULT_MAX_STEPS,
        max_result_size: int | None = None,
        attempt: int = 1,
        result_rule: str | None = None,
        results: LargeResults | None = None,
    ) -> None:
        self.id = id
        self.workflow = workflow
        self.engine = engine
        self.max_steps = max_steps
        self.max_result_size = max_result_size
        self.result_rule = result_rule
        self._results = results
        #: Which delivery of this run's messages is replaying it (1 = the first).
        self.attempt = attempt
        self._names: set[str] = set()
        self._next = 0

    def __repr__(self) -> str:
        return f"<WorkflowRun {self.workflow} {self.id}>"

    @property
    def step_key(self) -> str:
        """A stable idempotency key for the running step (``<run id>:<step name>``): the
        same on every try and replay, so an outside service can drop a repeat. Outside
        a step, the run's id.

        >>> # await run.step("charge", lambda: stripe.charge(..., idempotency_key=run.step_key))
        """
        step = _current_step.get()
        return self.id if step is None else f"{self.id}:{step}"

    # -- the rules -----------------------------------------------------------------

    def _where(self, name: str | None = None) -> str:
        step = f' step "{name}"' if name is not None else ""
        return f'workflow "{self.workflow}" (run {self.id}){step}'

    def _claim(self, name: object, what: str = "step") -> tuple[str, int]:
        """Check a new step's name and the step limit; the step's position."""
        checked = check_name(name, what, self._where())
        if checked in self._names:
            raise WorkflowLimitError(
                f'{self._where()}: the step name "{checked}" is used twice in one run; '
                "give each step its own name (e.g. add the item's id)"
            )
        if self._next >= self.max_steps:
            raise WorkflowLimitError(
                f"{self._where()}: more than {self.max_steps} steps in one run; raise "
                "@workflow(max_steps=...) or split the work into runs of their own"
            )
        self._names.add(checked)
        position = self._next
        self._next += 1
        return checked, position

    async def _mark(self, name: str, position: int, kind: str) -> None:
        kept = await self.engine.mark(position, name, kind)
        if kept != name:
            raise nondeterminism(self._where(), position, kept, name)

    def _duration(self, value: Duration, what: str, name: str, call: str) -> float:
        seconds = _rule(parse_duration, value, f"{self._where()}: {call}")
        if seconds > MAX_WAIT:
            raise WorkflowLimitError(
                f"{self._where(name)}: {what} of {seconds:g}s is over the 365-day limit; "
                "wait in several steps, or start a new run later"
            )
        return seconds

    # -- steps -----------------------------------------------------------------------

    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        tries: int = 1,
        backoff: object = 0,
        **kwargs: Any,
    ) -> Awaitable[Any]:
        """Run ``fn(*args, **kwargs)`` (sync or async) as the step ``name`` and return
        its result, kept as JSON: a replay gets the kept result without calling ``fn``.
        ``tries``/``backoff`` are the step's own retries; a step that fails for good
        raises its error here (uncaught, it fails the run).

        The name and position are taken when ``run.step(...)`` is called, so steps
        passed to ``run.gather`` keep the order they are written in.
        """
        checked, position = self._claim(name)
        if isinstance(tries, bool) or not isinstance(tries, int) or tries < 1:
            raise WorkflowLimitError(
                f"{self._where(checked)}: tries must be an integer >= 1, got {tries!r}"
            )
        if not callable(fn):
            raise TypeError(f"{self._where(checked)}: expected a function to run, got {fn!r}")
        call = f'{self._where()}: run.step("{checked}", backoff=...)'
        retry = StepRetry(tries, _rule(parse_backoff, backoff, call))
        return self._step(checked, position, fn, args, kwargs, retry)

    async def _step(
        self,
        name: str,
        position: int,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        retry: StepRetry,
    ) -> Any:
        await self._mark(name, position, "step")
        where = self._where(name)

        async def attempt(n: int) -> str:
            token = _current_step.set(name)
            try:
                value = fn(*args, **kwargs)
                if inspect.isawaitable(value):
                    value = await value
            finally:
                _current_step.reset(token)
            results = self._results
            if results is None:
                return encode_result(value, where, self.max_result_size, self.result_rule)
            text = encode_result(value, where)
            return await results.put(text) if results.wanted(text) else text

        kept = await self.engine.step(name, position, attempt, retry)
        return decode(kept if self._results is None else await self._results.get(kept))

    async def sleep(self, name: str, duration: Duration) -> None:
        """Wait ``duration`` (seconds or ``"2d"``, at most 365 days) from when the run
        first reached this sleep. No worker is held meanwhile: the attempt ends and a
        delayed message resumes the run."""
        checked, position = self._claim(name, "sleep")
        seconds = self._duration(duration, "a sleep", checked, f'run.sleep("{checked}", ...)')
        await self._mark(checked, position, "sleep")
        await self.engine.sleep(checked, position, seconds)

    async def wait_for_event(self, name: str, timeout: Duration | None = None) -> Any:
        """The payload of the event ``name`` sent with ``Workflow.send_event`` (also one
        sent before the wait began), or None after ``timeout`` (None: no limit)."""
        checked, position = self._claim(name, "event")
        call = f'run.wait_for_event("{checked}", timeout=...)'
        seconds = None if timeout is None else self._duration(timeout, "a timeout", checked, call)
        await self._mark(checked, position, "event")
        return decode(await self.engine.wait_for_event(checked, position, seconds))

    async def gather(self, *steps: Awaitable[Any]) -> list[Any]:
        """Run steps concurrently (fan-out) and return their results in order (fan-in).

        >>> # a, b = await run.gather(run.step("a", fa), run.step("b", fb))
        """
        branches: Sequence[Callable[[], Awaitable[Any]]] = [_branch(s) for s in steps]
        return await self.engine.gather(branches)

    async def dispatch(self, pending: PendingDispatch[Any], name: str | None = None) -> str:
        """Queue a job once per run (not once per replay); the job's id.

        ``name`` defaults to ``dispatch:<job name>`` (``#2``, ``#3`` for more of one job).
        """
        if name is None:
            base = f"dispatch:{pending.job.name}"
            name, n = base, 1
            while name in self._names:
                n += 1
                name = f"{base}#{n}"
        checked, position = self._claim(name)
        await self._mark(checked, position, "dispatch")

        async def send() -> str:
            # the job claims this key before it runs: a crash between this dispatch and
            # its record queues a second copy on the next replay, and only one runs
            once = f"haze:wf-once:{self.id}:{checked}"
            result = await use_app().manager.dispatch(pending, meta={"once": once})
            return str(result.id)

        return await self.engine.dispatch_once(checked, position, send)


def _rule(parse: Callable[[Any, str], _T], value: object, where: str) -> _T:
    """``parse(value, where)``, its ``ValueError`` a broken rule (``WorkflowLimitError``):
    a replay would break it again, so the run fails at once instead of retrying."""
    try:
        return parse(value, where)
    except WorkflowLimitError:
        raise
    except ValueError as e:
        raise WorkflowLimitError(str(e)) from None


def _branch(step: Awaitable[Any]) -> Callable[[], Awaitable[Any]]:
    return lambda: step
