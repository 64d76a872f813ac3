"""Workflow runs kept in an atomic key/value ``Store`` (memory, database, redis, D1).

Every decision is one insert-if-absent (``Store.add``), which each atomic store does
in one statement or command, so two replays of one run agree and a crash between two
writes never records a step's result twice:

``haze:wf:<run>:run``         name, input, connection, created_at (added once)
``haze:wf:<run>:state``       running / sleeping / waiting, for display (put)
``haze:wf:<run>:final``       done / failed / cancelled with result or error (added once)
``haze:wf:<run>:pos:<i>``     the step name reached at position i (added once); a step
                              that succeeds at its first try keeps its result, start
                              and one attempt in this same record (one write a step)
``haze:wf:<run>:res:<name>``  the result, JSON text, and when (added once), of a sleep,
                              wait, dispatch, or a step whose position was marked first
                              (a failed try)
``haze:wf:<run>:att:<name>``  attempts (increment; only once a try failed);
                              ``first:<name>`` the first start
``haze:wf:<run>:fail:<name>`` the last failure, for display (put)
``haze:wf:<run>:ev:<name>``   an event's payload (added once: the first event wins)
``haze:wf:<run>:k:<key>``     a sleep's end, a resume chain's owner (added once)
``haze:wf:runs`` / ``haze:wf:runs:<n>``  the listing: a counter and run ids by number

A replay reads ``run``, ``state``, ``final`` and the first hundred ``pos`` records in
one ``get_many`` (one query, one MGET), and the ``res`` of positions kept without a
result in a second one only when there are some.

Crash windows: a run is added and numbered in the listing in one write where the store
can (``AddsListed``: memory, SQL, Redis); elsewhere a run added but not yet numbered is
missing from ``list_runs`` (``status`` still finds it); a step's first try is one write (nothing
of the step is kept before it ends); every other write is either the decision itself
or display beside it.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from haze.contracts.store import AddsListed, Store
from haze.contracts.workflow import KeptRun, StepStatus, WorkflowStatus

__all__ = ["KeyValueWorkflowState"]

_PREFIX = "haze:wf"
_PAGE = 100


class KeyValueWorkflowState:
    """``WorkflowStateStore`` on an atomic ``Store``."""

    def __init__(self, store: Store, prefix: str = _PREFIX) -> None:
        self.store = store
        self.prefix = prefix

    def _k(self, run_id: str, *parts: object) -> str:
        return ":".join((self.prefix, run_id, *(str(p) for p in parts)))

    # -- runs --------------------------------------------------------------------------

    async def create_run(
        self, run_id: str, name: str, input: str, now: float, connection: str | None = None
    ) -> bool:
        record = {"name": name, "input": input, "connection": connection, "created_at": now}
        if isinstance(self.store, AddsListed):  # added and listed in one write
            return await self.store.add_listed(
                self._k(run_id, "run"), record, f"{self.prefix}:runs", run_id
            )
        if not await self.store.add(self._k(run_id, "run"), record):
            return False
        n = await self.store.increment(f"{self.prefix}:runs")
        await self.store.put(f"{self.prefix}:runs:{n}", run_id)
        return True

    async def run_input(self, run_id: str) -> str | None:
        record = await self.store.get(self._k(run_id, "run"))
        return None if record is None else str(record["input"])

    async def set_state(
        self,
        run_id: str,
        state: str,
        now: float,
        resume_at: float | None = None,
        waiting_for: str | None = None,
    ) -> None:
        value = {"state": state, "at": now, "resume_at": resume_at, "waiting_for": waiting_for}
        await self.store.put(self._k(run_id, "state"), value)

    async def finish(
        self, run_id: str, state: str, now: float, result: str | None, error: str | None
    ) -> bool:
        value = {"state": state, "at": now, "result": result, "error": error}
        return await self.store.add(self._k(run_id, "final"), value)

    async def final_state(self, run_id: str) -> str | None:
        final = await self.store.get(self._k(run_id, "final"))
        return None if final is None else str(final["state"])

    async def reopen(self, run_id: str, state: str = "failed") -> bool:
        """Forget the run's final state while it is ``state`` (``workflow:retry``): the
        next delivery replays it. True when this call removed it."""
        key = self._k(run_id, "final")
        final = await self.store.get(key)
        if final is None or final.get("state") != state:
            return False
        return await self.store.delete(key, owner=final)

    async def get_run(self, run_id: str) -> WorkflowStatus | None:
        found = await self._runs([run_id])
        if not found:
            return None
        run = found[0]
        steps = await self._steps(run_id, run.state == "cancelled")
        return WorkflowStatus(**{**_fields(run), "steps": steps})

    async def list_runs(
        self, state: str | None = None, name: str | None = None, limit: int = 50
    ) -> builtins.list[WorkflowStatus]:
        top = await self.store.get(f"{self.prefix}:runs")
        n = int(top or 0)
        out: list[WorkflowStatus] = []
        # newest first, a page of ids at a time, until ``limit`` runs match
        while n > 0 and len(out) < limit:
            numbers = range(n, max(0, n - _PAGE), -1)
            ids = await self.store.get_many([f"{self.prefix}:runs:{i}" for i in numbers])
            n -= len(numbers)
            for run in await self._runs([str(i) for i in ids if i is not None]):
                if (state is None or run.state == state) and (name is None or run.name == name):
                    out.append(run)
        return out[:limit]

    async def _runs(self, run_ids: Sequence[str]) -> list[WorkflowStatus]:
        keys = [self._k(r, part) for r in run_ids for part in ("run", "state", "final")]
        values = await self.store.get_many(keys) if keys else []
        runs = []
        for i, run_id in enumerate(run_ids):
            record, state, final = values[3 * i : 3 * i + 3]
            if record is None:
                continue
            runs.append(_status(run_id, record, state, final))
        return runs

    # -- steps -------------------------------------------------------------------------

    async def mark(self, run_id: str, position: int, name: str, kind: str, now: float) -> str:
        key = self._k(run_id, "pos", position)
        if await self.store.add(key, {"name": name, "kind": kind, "at": now}):
            return name
        kept = await self.store.get(key)
        return name if kept is None else str(kept["name"])

    async def kept(self, run_id: str) -> KeptRun:
        head = [self._k(run_id, p) for p in ("run", "state", "final")]
        values = await self.store.get_many([*head, *self._page(run_id, 0)])
        record, state, final = values[:3]
        found = dict(enumerate(values[3:]))
        # a further page only when this one is full to its end (a run past _PAGE steps);
        # a position missed past a gap is found by its insert-if-absent instead
        while found.get(len(found) - 1) is not None:
            start = len(found)
            page = await self.store.get_many(self._page(run_id, start))
            found.update((start + i, m) for i, m in enumerate(page))
        marks = {i: m for i, m in found.items() if m is not None}
        results = {str(m["name"]): str(m["result"]) for m in marks.values() if "result" in m}
        bare = [str(m["name"]) for m in marks.values() if "result" not in m]
        kept = await self.store.get_many([self._k(run_id, "res", n) for n in bare]) if bare else []
        results.update((n, str(r["result"])) for n, r in zip(bare, kept, strict=True) if r)
        return KeptRun(
            input=None if record is None else str(record["input"]),
            final=None if final is None else str(final["state"]),
            state=None if state is None else str(state["state"]),
            marks={i: (str(m["name"]), str(m.get("kind", "step"))) for i, m in marks.items()},
            results=results,
        )

    def _page(self, run_id: str, start: int) -> list[str]:
        return [self._k(run_id, "pos", i) for i in range(start, start + _PAGE)]

    async def keep_step(
        self,
        run_id: str,
        position: int,
        name: str,
        result: str,
        started: float,
        now: float,
    ) -> tuple[str, str | None]:
        key = self._k(run_id, "pos", position)
        record = {"name": name, "kind": "step", "at": started, "result": result, "done": now}
        if await self.store.add(key, {**record, "attempts": 1}):
            return name, result
        kept = await self.store.get(key)
        if kept is None:  # cannot happen: a kept position is never removed
            return name, None
        return str(kept["name"]), None if "result" not in kept else str(kept["result"])

    async def started(self, run_id: str, name: str, now: float) -> int:
        await self.store.add(self._k(run_id, "first", name), now)
        return await self.store.increment(self._k(run_id, "att", name))

    async def keep_result(self, run_id: str, name: str, result: str, now: float) -> str:
        key = self._k(run_id, "res", name)
        if await self.store.add(key, {"result": result, "at": now}):
            return result
        kept = await self.store.get(key)
        return result if kept is None else str(kept["result"])

    async def result(self, run_id: str, name: str) -> str | None:
        kept = await self.store.get(self._k(run_id, "res", name))
        return None if kept is None else str(kept["result"])

    async def step_failed(self, run_id: str, name: str, error: str, now: float) -> None:
        await self.store.put(self._k(run_id, "fail", name), {"error": error, "at": now})

    async def keep(self, run_id: str, key: str, value: str) -> str:
        full = self._k(run_id, "k", key)
        if await self.store.add(full, value):
            return value
        kept = await self.store.get(full)
        return value if kept is None else str(kept)

    async def replace(self, run_id: str, key: str, old: str, new: str) -> bool:
        full = self._k(run_id, "k", key)
        await self.store.delete(full, owner=old)
        return await self.store.add(full, new)

    async def put_event(self, run_id: str, name: str, payload: str) -> bool:
        return await self.store.add(self._k(run_id, "ev", name), payload)

    async def event(self, run_id: str, name: str) -> str | None:
        kept = await self.store.get(self._k(run_id, "ev", name))
        return None if kept is None else str(kept)

    async def _steps(self, run_id: str, cancelled: bool = False) -> list[StepStatus]:
        # concurrent steps keep their positions in the order they end, so a gap can
        # occur: a further page is read when this one is full to its end (a step past
        # a gap at a page's end is not shown until the gap's step is kept)
        marks: list[tuple[int, Any]] = []
        start = 0
        while True:
            page = await self.store.get_many(self._page(run_id, start))
            marks.extend((start + i, m) for i, m in enumerate(page) if m is not None)
            start += _PAGE
            if page[-1] is None:
                break
        parts = ("res", "att", "first", "fail")
        keys = [self._k(run_id, p, m["name"]) for _, m in marks for p in parts]
        values = await self.store.get_many(keys) if keys else []
        events = [self._k(run_id, "ev", m["name"]) for _, m in marks]
        kept_events = await self.store.get_many(events) if events else []
        steps = []
        for i, (position, m) in enumerate(marks):
            res, att, first, fail = values[4 * i : 4 * i + 4]
            if "result" in m:  # kept with its mark in one write (first try succeeded)
                res, att = {"result": m["result"], "at": m["done"]}, m["attempts"]
            step = _step(position, m, res, att, first, fail, kept_events[i])
            if cancelled and step.state not in ("done", "failed"):
                # the run stopped there: the step never ends
                step = dataclasses.replace(step, state="cancelled")
            steps.append(step)
        return steps


def _step(
    position: int, mark: Any, res: Any, att: Any, first: Any, fail: Any, event: Any
) -> StepStatus:
    kind = str(mark.get("kind", "step"))
    if res is not None:
        state = "done"
    elif fail is not None:
        state = "failed"
    elif kind == "sleep":
        state = "sleeping"
    elif kind == "event":
        state = "waiting"
    else:
        state = "running"
    started = float(first) if first is not None else float(mark["at"])
    return StepStatus(
        name=str(mark["name"]),
        state=state,
        attempts=int(att or 0),
        started_at=started,
        finished_at=None if res is None else float(res["at"]),
        result_size=None if res is None else len(str(res["result"]).encode()),
        position=position,
        kind=kind,
        error=None if fail is None or res is not None else str(fail["error"]),
    )


def _status(run_id: str, record: Any, state: Any, final: Any) -> WorkflowStatus:
    current = final if final is not None else state
    name = str(record["name"])
    result = None
    if final is not None and final.get("result") is not None:
        result = json.loads(final["result"])
    return WorkflowStatus(
        id=run_id,
        name=name,
        state=str(current["state"]) if current is not None else "running",
        result=result,
        error=None if final is None else final.get("error"),
        input=json.loads(record["input"]),
        created_at=float(record["created_at"]),
        updated_at=None if current is None else float(current["at"]),
        resume_at=None if final is not None or state is None else state.get("resume_at"),
        waiting_for=None if final is not None or state is None else state.get("waiting_for"),
    )


def _fields(run: WorkflowStatus) -> dict[str, Any]:
    return {f: getattr(run, f) for f in WorkflowStatus.__dataclass_fields__ if f != "steps"}
