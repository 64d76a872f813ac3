"""The seams of durable workflows: what runs a step, where a run's state lives, and
where operations read runs from.

A workflow's handler sees one ``WorkflowRun`` (``haze._workflows.run``). The run owns
every rule that must hold the same on every engine (step names, limits, JSON results,
the nondeterminism check and its text, step retries) and hands the effect of each call
to a ``StepEngine``:

- haze's own engine (``haze._workflows.engine``) keeps the run's state in a
  ``WorkflowStateStore`` (memory, SQL, Redis, D1) and suspends a run by ending the
  attempt and enqueueing its resume as a delayed message;
- a platform's own engine (Cloudflare Workflows, Lambda durable functions) maps the
  same calls onto ``step.do``/``context.step`` and their sleeps and waits.

Every call carries the step's ``position``: the order in which the run first reached
it. ``StepEngine.mark`` keeps the name reached at a position (insert-if-absent) and
returns the kept one, so the run can tell a replay that took another path; a platform
engine that keeps only name -> result can keep it as a step of its own (named by the
position) whose result is the name. The store engine keeps a new step's name with its
result, in the one write of the step, and checks it there (``keep_step``).

Operations (``Workflow.status/list``, the CLI, the dashboard) read through
``WorkflowRuns``: the store is one implementation; a platform's API is another.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from haze._base.durations import backoff_delay

__all__ = [
    "FINAL_STATES",
    "RUN_STATES",
    "HasWorkflowState",
    "KeptRun",
    "RunState",
    "StepEngine",
    "StepRetry",
    "StepStatus",
    "WorkflowRuns",
    "WorkflowStateStore",
    "WorkflowStatus",
]

RunState = Literal["running", "sleeping", "waiting", "done", "failed", "cancelled"]
RUN_STATES: tuple[str, ...] = ("running", "sleeping", "waiting", "done", "failed", "cancelled")
#: A run in one of these states never changes again.
FINAL_STATES: frozenset[str] = frozenset({"done", "failed", "cancelled"})


@dataclass(frozen=True, slots=True)
class StepStatus:
    """One step of a run, as ``Workflow.status(id).steps`` lists it (in the order first
    reached). ``state``: ``running``, ``done``, ``failed``, ``sleeping``, ``waiting``, or
    ``cancelled`` (the step a cancelled run stopped at).
    ``kind``: ``step``, ``sleep``, ``event``, ``dispatch``."""

    name: str
    state: str
    attempts: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    result_size: int | None = None
    position: int = 0
    kind: str = "step"
    error: str | None = None

    @property
    def duration(self) -> float | None:
        """Seconds from the first start to the recorded result, when finished."""
        if self.started_at is None or self.finished_at is None:
            return None
        return max(0.0, self.finished_at - self.started_at)


@dataclass(frozen=True, slots=True)
class WorkflowStatus:
    """A run as ``Workflow.status(id)`` returns it.

    >>> # st = await Workflow.status(rid)
    >>> # st.state, [s.name for s in st.steps], st.result
    ('done', ['fetch', 'cool-off', 'approved', 'mail', 'crm'], {'mail': 1, 'crm': 2})
    """

    id: str
    name: str
    state: str
    steps: builtins.list[StepStatus] = field(default_factory=builtins.list)
    result: Any = None
    error: str | None = None
    input: Any = None
    created_at: float | None = None
    updated_at: float | None = None
    #: When a sleeping run resumes, or a waiting run's wait times out (epoch seconds).
    resume_at: float | None = None
    #: The event a ``waiting`` run waits for.
    waiting_for: str | None = None
    #: The run's workflow is ``encrypted``: its input, results and errors are stored
    #: encrypted; without the app key they are None here and ``error`` says so.
    encrypted: bool = False

    @property
    def finished(self) -> bool:
        return self.state in FINAL_STATES


@dataclass(frozen=True, slots=True)
class StepRetry:
    """A step's own retries: ``tries`` attempts, ``backoff`` seconds between them (a
    number, a list by retry, or ``"exponential"``; see ``define_job``)."""

    tries: int = 1
    backoff: float | tuple[float, ...] | str = 0.0

    def delay(self, retry: int) -> float:
        """Seconds before retry number ``retry`` (1 = the second attempt)."""
        return backoff_delay(self.backoff, retry)


@dataclass(frozen=True, slots=True)
class KeptRun:
    """What one replay of a run reads once, at its start (``WorkflowStateStore.kept``):
    the run's input (None: unknown run), its final and display states, the name and
    kind kept at each position, and each kept step result (JSON text) by name."""

    input: str | None
    final: str | None = None
    state: str | None = None
    marks: dict[int, tuple[str, str]] = field(default_factory=dict)
    results: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class StepEngine(Protocol):
    """What carries out a run's calls. ``WorkflowRun`` has checked every rule (name,
    limits, position) before it calls, and checks what comes back.

    A call either returns, or ends the attempt with a signal of the engine's own (the
    store engine's suspend; a platform's own suspension): code around it never catches
    that signal, since it is not an ``Exception``.
    """

    async def mark(self, position: int, name: str, kind: str) -> str:
        """Keep ``name`` as the step at ``position`` unless one is kept there; return the
        kept name (the run compares it: another name is nondeterminism)."""

    async def step(
        self,
        name: str,
        position: int,
        attempt: Callable[[int], Awaitable[str]],
        retry: StepRetry,
    ) -> str:
        """The kept result (JSON text) of step ``name``; when there is none, run
        ``attempt(n)`` (n = 1, 2, ...; up to ``retry.tries`` times, waiting
        ``retry.delay(n)`` between), which returns the checked JSON text, and keep the
        first returned result exactly once. The last failure is raised when no try
        succeeded (the step is then recorded failed). A ``WorkflowError`` from
        ``attempt`` (a broken rule) is raised at once, never retried."""

    async def sleep(self, name: str, position: int, seconds: float) -> None:
        """Return once ``seconds`` have passed since the run first reached this sleep."""

    async def wait_for_event(self, name: str, position: int, timeout: float | None) -> str | None:
        """The payload (JSON text) of event ``name`` sent to this run (also one sent
        before the wait began), or None once ``timeout`` seconds passed without one."""

    async def gather(self, branches: Sequence[Callable[[], Awaitable[Any]]]) -> list[Any]:
        """Run ``branches`` concurrently; their results in order (fan-out, fan-in)."""

    async def dispatch_once(
        self, name: str, position: int, send: Callable[[], Awaitable[str]]
    ) -> str:
        """Call ``send`` (a job dispatch; returns the job id) once per run; a replay
        returns the kept id."""


@runtime_checkable
class WorkflowStateStore(Protocol):
    """A run's state, kept by haze's own engine. Every write that decides something is
    insert-if-absent, so two replays of one run (a redelivered message, a duplicate
    resume) agree: the first write wins and both read it back.

    Values are JSON text (``str``), so a store never re-encodes a result.
    """

    async def create_run(
        self, run_id: str, name: str, input: str, now: float, connection: str | None = None
    ) -> bool:
        """Keep a new run (state ``running``) unless ``run_id`` exists. True when new."""

    async def get_run(self, run_id: str) -> WorkflowStatus | None:
        """The run with its steps, or None when unknown."""

    async def run_input(self, run_id: str) -> str | None:
        """The run's input (JSON text), or None when unknown."""

    async def set_state(
        self,
        run_id: str,
        state: str,
        now: float,
        resume_at: float | None = None,
        waiting_for: str | None = None,
    ) -> None:
        """Record ``running``, ``sleeping`` or ``waiting`` (for display; a final state,
        once kept, wins over it)."""

    async def finish(
        self, run_id: str, state: str, now: float, result: str | None, error: str | None
    ) -> bool:
        """Keep the run's final state (``done``/``failed``/``cancelled``) unless one is
        kept. True when this call kept it."""

    async def final_state(self, run_id: str) -> str | None:
        """The kept final state, or None while the run goes on."""

    async def reopen(self, run_id: str) -> bool:
        """Drop a ``failed`` final state so the run can replay again (a retry). True when
        this call reopened it; a run in any other state is left alone."""

    async def mark(self, run_id: str, position: int, name: str, kind: str, now: float) -> str:
        """Keep ``name`` at ``position`` unless a name is kept there; the kept name."""

    async def started(self, run_id: str, name: str, now: float) -> int:
        """Count one more attempt of step ``name``; the new count."""

    async def kept(self, run_id: str) -> KeptRun:
        """Everything a replay reads, in one read (one query, one MGET) for a run of up
        to about a hundred steps."""

    async def keep_step(
        self,
        run_id: str,
        position: int,
        name: str,
        result: str,
        started: float,
        now: float,
    ) -> tuple[str, str | None]:
        """Keep step ``name`` at ``position`` with its first try's ``result`` (one
        attempt, begun at ``started``) in ONE insert-if-absent write, unless something
        is kept at ``position``. The kept name and result; the result is None when the
        position holds a mark without one (then keep it with ``keep_result``)."""

    async def keep_result(self, run_id: str, name: str, result: str, now: float) -> str:
        """Keep ``result`` as step ``name``'s result unless one is kept; the kept one."""

    async def result(self, run_id: str, name: str) -> str | None:
        """Step ``name``'s kept result, or None."""

    async def step_failed(self, run_id: str, name: str, error: str, now: float) -> None:
        """Record that step ``name`` failed for good (display; a kept result wins)."""

    async def keep(self, run_id: str, key: str, value: str) -> str:
        """Keep ``value`` under the run's ``key`` unless one is kept; the kept value
        (a sleep's end, a resume's owner)."""

    async def replace(self, run_id: str, key: str, old: str, new: str) -> bool:
        """Set the run's ``key`` to ``new`` only while it holds ``old`` (or is absent)."""

    async def put_event(self, run_id: str, name: str, payload: str) -> bool:
        """Keep event ``name``'s payload unless one is kept. True when this call kept it."""

    async def event(self, run_id: str, name: str) -> str | None:
        """Event ``name``'s kept payload, or None."""

    async def list_runs(
        self, state: str | None = None, name: str | None = None, limit: int = 50
    ) -> builtins.list[WorkflowStatus]:
        """Runs, newest first (without their steps)."""


@runtime_checkable
class HasWorkflowState(Protocol):
    """A store that can keep workflow runs atomically (memory, database, redis, D1). A
    store without it (a KV store) is refused for workflows."""

    def workflow_state(self) -> WorkflowStateStore:
        """The run state kept in this store."""


@runtime_checkable
class WorkflowRuns(Protocol):
    """Where a workflow's runs live, for operations: haze's store, or a platform's API."""

    async def status(self, run_id: str) -> WorkflowStatus | None:
        """The run with its steps, or None when unknown."""

    async def list(
        self, state: str | None = None, name: str | None = None, limit: int = 50
    ) -> builtins.list[WorkflowStatus]:
        """Runs, newest first."""

    async def cancel(self, run_id: str) -> bool:
        """Cancel a run that has not finished. True when this call cancelled it."""
