"""The run state of an ``encrypted`` workflow: what may hold the user's data (the input,
step results, kept events, the run's result, its error and its steps' errors) is kept
encrypted with the app key (AES-GCM, ``APP_PREVIOUS_KEYS`` after a rotation), as an
encrypted job's payload is. Names, states, times and the engine's own keys stay plain.

A sealed value is the JSON text ``{"haze:enc": "<base64>"}`` (a store parses results
and inputs as JSON), authenticated with the run's id and the field, so a sealed value
cannot be moved to another run or step. Reads open sealed values with the key; without
one (or with the wrong one) the status says the run is encrypted.

>>> # state = sealed_state(workflow_state(store), app, encrypt=wf.encrypted)
"""

from __future__ import annotations

import builtins
import dataclasses
import json
from typing import Any

from haze._base.crypto import seal, unseal
from haze._base.errors import ConfigError, MessageDecodeError
from haze.contracts.workflow import KeptRun, StepStatus, WorkflowStateStore, WorkflowStatus

__all__ = ["SealedState", "sealed_state"]

_MARK = "haze:enc"
_HIDDEN = "encrypted with the app key; set APP_KEY (or APP_PREVIOUS_KEYS) to show it"


def _blob(text: str | None) -> str | None:
    """The sealed blob in ``text``, or None when ``text`` is plain."""
    if text is None or not text.startswith('{"' + _MARK):
        return None
    value = _parsed_blob(json.loads(text))
    return value


def _parsed_blob(value: Any) -> str | None:
    """The blob of an already parsed sealed value, or None."""
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get(_MARK), str):
        return str(value[_MARK])
    return None


class SealedState:
    """A ``WorkflowStateStore`` that seals (``encrypt``) and opens a run's user data
    around another one. Opening needs no flag: sealed values are recognised."""

    def __init__(self, inner: WorkflowStateStore, app: Any, *, encrypt: bool) -> None:
        self.inner = inner
        self.app = app
        self.encrypt = encrypt

    # -- sealing -----------------------------------------------------------------------

    def _seal(self, run_id: str, field: str, text: str) -> str:
        blob = seal(self.app, text, f"haze:workflow:{run_id}:{field}")
        return json.dumps({_MARK: blob})

    def _maybe(self, run_id: str, field: str, text: str | None) -> str | None:
        if text is None or not self.encrypt:
            return text
        return self._seal(run_id, field, text)

    def _open(self, run_id: str, field: str, text: str | None) -> str | None:
        blob = _blob(text)
        if blob is None:
            return text
        what = f"workflow run {run_id} ({field})"
        return str(unseal(self.app, blob, f"haze:workflow:{run_id}:{field}", what))

    # -- writes ------------------------------------------------------------------------

    async def create_run(
        self, run_id: str, name: str, input: str, now: float, connection: str | None = None
    ) -> bool:
        sealed = self._maybe(run_id, "input", input)
        return await self.inner.create_run(run_id, name, sealed or input, now, connection)

    async def finish(
        self, run_id: str, state: str, now: float, result: str | None, error: str | None
    ) -> bool:
        result = self._maybe(run_id, "result", result)
        error = self._maybe(run_id, "error", error)
        return await self.inner.finish(run_id, state, now, result, error)

    async def keep_result(self, run_id: str, name: str, result: str, now: float) -> str:
        field = f"res:{name}"
        kept = await self.inner.keep_result(
            run_id, name, self._maybe(run_id, field, result) or result, now
        )
        return self._open(run_id, field, kept) or kept

    async def keep_step(
        self, run_id: str, position: int, name: str, result: str, started: float, now: float
    ) -> tuple[str, str | None]:
        sealed = self._maybe(run_id, f"res:{name}", result) or result
        kept_name, kept = await self.inner.keep_step(run_id, position, name, sealed, started, now)
        if kept is None:
            return kept_name, None
        return kept_name, self._open(run_id, f"res:{kept_name}", kept) or kept

    async def step_failed(self, run_id: str, name: str, error: str, now: float) -> None:
        sealed = self._maybe(run_id, f"fail:{name}", error) or error
        await self.inner.step_failed(run_id, name, sealed, now)

    async def put_event(self, run_id: str, name: str, payload: str) -> bool:
        # sealed when the run is: an event may come from a process without its workflow
        encrypt = self.encrypt or _blob(await self.inner.run_input(run_id)) is not None
        if encrypt:
            payload = self._seal(run_id, f"ev:{name}", payload)
        return await self.inner.put_event(run_id, name, payload)

    # -- reads of the engine -----------------------------------------------------------

    async def run_input(self, run_id: str) -> str | None:
        return self._open(run_id, "input", await self.inner.run_input(run_id))

    async def kept(self, run_id: str) -> KeptRun:
        kept = await self.inner.kept(run_id)
        results = {n: self._open(run_id, f"res:{n}", t) or t for n, t in kept.results.items()}
        return dataclasses.replace(
            kept, input=self._open(run_id, "input", kept.input), results=results
        )

    async def result(self, run_id: str, name: str) -> str | None:
        return self._open(run_id, f"res:{name}", await self.inner.result(run_id, name))

    async def event(self, run_id: str, name: str) -> str | None:
        return self._open(run_id, f"ev:{name}", await self.inner.event(run_id, name))

    # -- reads of operations -----------------------------------------------------------

    async def get_run(self, run_id: str) -> WorkflowStatus | None:
        run = await self.inner.get_run(run_id)
        return None if run is None else self._opened(run)

    async def list_runs(
        self, state: str | None = None, name: str | None = None, limit: int = 50
    ) -> builtins.list[WorkflowStatus]:
        return [self._opened(r) for r in await self.inner.list_runs(state, name, limit)]

    def _opened(self, run: WorkflowStatus) -> WorkflowStatus:
        """``run`` with its sealed fields opened. Without the key (or with a wrong one)
        the input and result are None and an error says why it cannot be shown."""
        blob = _parsed_blob(run.input)
        if blob is None:
            return run
        rid = run.id
        try:
            result = _parsed_blob(run.result)
            return dataclasses.replace(
                run,
                encrypted=True,
                input=json.loads(self._open_blob(rid, "input", blob)),
                result=None
                if result is None
                else json.loads(self._open_blob(rid, "result", result)),
                error=self._open(rid, "error", run.error),
                steps=[self._step(rid, s) for s in run.steps],
            )
        except (ConfigError, MessageDecodeError) as e:
            hidden = _HIDDEN if isinstance(e, ConfigError) else f"encrypted: {e}"
            return dataclasses.replace(
                run,
                encrypted=True,
                input=None,
                result=None,
                error=None if run.error is None else hidden,
                steps=[dataclasses.replace(s, error=s.error and "encrypted") for s in run.steps],
            )

    def _open_blob(self, run_id: str, field: str, blob: str) -> str:
        what = f"workflow run {run_id} ({field})"
        return str(unseal(self.app, blob, f"haze:workflow:{run_id}:{field}", what))

    def _step(self, run_id: str, step: StepStatus) -> StepStatus:
        if step.error is None:
            return step
        return dataclasses.replace(step, error=self._open(run_id, f"fail:{step.name}", step.error))

    # -- the rest is plain -------------------------------------------------------------

    async def set_state(
        self,
        run_id: str,
        state: str,
        now: float,
        resume_at: float | None = None,
        waiting_for: str | None = None,
    ) -> None:
        await self.inner.set_state(run_id, state, now, resume_at, waiting_for)

    async def final_state(self, run_id: str) -> str | None:
        return await self.inner.final_state(run_id)

    async def reopen(self, run_id: str) -> bool:
        return await self.inner.reopen(run_id)

    async def mark(self, run_id: str, position: int, name: str, kind: str, now: float) -> str:
        return await self.inner.mark(run_id, position, name, kind, now)

    async def started(self, run_id: str, name: str, now: float) -> int:
        return await self.inner.started(run_id, name, now)

    async def keep(self, run_id: str, key: str, value: str) -> str:
        return await self.inner.keep(run_id, key, value)

    async def replace(self, run_id: str, key: str, old: str, new: str) -> bool:
        return await self.inner.replace(run_id, key, old, new)


def sealed_state(inner: WorkflowStateStore, app: Any, *, encrypt: bool) -> WorkflowStateStore:
    """``inner`` that seals a run's user data when ``encrypt`` and opens sealed data."""
    return SealedState(inner, app, encrypt=encrypt)
