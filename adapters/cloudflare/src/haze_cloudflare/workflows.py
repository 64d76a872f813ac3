"""haze's workflow calls on Cloudflare Workflows (the Python Workflows SDK).

``haze build --preset cloudflare`` writes one ``HazeWorkflow`` subclass per workflow of
a ``"workflows": "native"`` cloudflare connection into ``src/entry.py``
(``onboard`` -> ``OnboardWorkflow``), each listed under ``workflows`` in
``wrangler.json`` with the binding ``HAZE_WF_<NAME>``. Its ``run(event, step)`` runs the
workflow with the event's payload as its input; ``CloudflareStepEngine`` carries out
the run's calls (``WorkflowRun`` has checked every rule first):

==========================  ===================================================
haze                        Cloudflare Workflows
==========================  ===================================================
``run.step``                ``step.do`` named like the step; ``tries``/``backoff``
                            as its ``retries`` config
``run.sleep``               ``step.sleep`` (whole seconds)
``run.wait_for_event``      ``step.wait_for_event`` of the event's name as its type
``run.gather``              the steps run concurrently
``run.dispatch``            a ``step.do`` that sends the job (once per run)
nondeterminism check        a step ``haze:at:<position>`` whose kept result is the
                            name first reached there
==========================  ===================================================

The platform's limits are kept by haze first, with its own one-line errors: a step's
result (and the run's output) at most 1 MiB of JSON, at most ``MAX_STEPS`` steps of the
workflow's (each takes two of the platform's: the position mark and the step), and a
step name the platform cannot hold (a control character, past 256 characters) is
%-escaped (with a hash when still too long).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from haze.errors import WorkflowRunError

from haze_cloudflare._js import binding, to_js, to_py

if TYPE_CHECKING:
    from haze.contracts.workflow import StepRetry

#: Cloudflare Workflows keeps at most 1 MiB per step result.
MAX_RESULT_SIZE = 1024 * 1024
_RESULT_RULE = "Cloudflare Workflows' limit for a step's result"
#: haze steps per run: the platform's default 10,000 steps, two for each of haze's.
MAX_STEPS = 5_000
_MAX_NAME = 256
_UNSAFE = re.compile(r"[\x00-\x1f\x7f%]")

__all__ = [
    "MAX_RESULT_SIZE",
    "MAX_STEPS",
    "BindingWorkflow",
    "CloudflareStepEngine",
    "HazeWorkflow",
    "binding_workflow",
    "retries",
    "step_name",
]

try:  # the Cloudflare Python Workers runtime
    from workers import WorkflowEntrypoint as _Base
except ImportError:

    class _Base:  # type: ignore[no-redef, unused-ignore]
        """Stand-in for ``workers.WorkflowEntrypoint`` outside the Cloudflare runtime."""

        def __init__(self, ctx: Any = None, env: Any = None):
            self.ctx = ctx
            self.env = env


def step_name(name: str) -> str:
    """A name the platform's step can hold: control characters and ``%`` escaped as
    ``%XX``; past 256 characters cut, with a hash of the whole name."""
    escaped = _UNSAFE.sub(lambda m: f"%{ord(m.group()):02X}", name)
    if len(escaped) <= _MAX_NAME:
        return escaped
    return f"{escaped[:230]}~{hashlib.sha256(name.encode()).hexdigest()[:24]}"


def retries(retry: StepRetry) -> dict[str, Any]:
    """A ``step.do`` config of a step's ``tries``/``backoff``."""
    exponential = retry.backoff == "exponential"
    first = max(1, math.ceil(retry.delay(1)))
    return {
        "retries": {
            "limit": retry.tries - 1,
            "delay": f"{first} seconds",
            "backoff": "exponential" if exponential else "constant",
        }
    }


class CloudflareStepEngine:
    """A ``StepEngine`` on one Workflows instance's ``step``."""

    def __init__(self, step: Any) -> None:
        self._steps: Any = step

    async def _do(
        self, name: str, fn: Callable[[], Awaitable[Any]], config: dict[str, Any] | None = None
    ) -> Any:
        """``step.do(name, config=...)`` around ``fn``, awaited: its kept result."""
        name = step_name(name)
        decorate: Any = self._steps.do(name, config=config) if config else self._steps.do(name)
        return await decorate(fn)()

    async def mark(self, position: int, name: str, kind: str) -> str:
        async def reached() -> str:
            return name

        return str(await self._do(f"haze:at:{position}", reached))

    async def step(
        self,
        name: str,
        position: int,
        attempt: Callable[[int], Awaitable[str]],
        retry: StepRetry,
    ) -> str:
        tried = [0]

        async def run() -> Any:
            tried[0] += 1
            return json.loads(await attempt(tried[0]))

        kept = await self._do(name, run, retries(retry))
        return json.dumps(kept, separators=(",", ":"), ensure_ascii=False)

    async def sleep(self, name: str, position: int, seconds: float) -> None:
        await self._steps.sleep(step_name(name), f"{max(1, math.ceil(seconds))} seconds")

    async def wait_for_event(self, name: str, position: int, timeout: float | None) -> str | None:
        limit = f"{math.ceil(timeout)} seconds" if timeout else "365 days"
        try:
            event = await self._steps.wait_for_event(step_name(name), name, timeout=limit)
        except Exception as e:  # the SDK raises on a timeout
            if "timeout" in str(e).lower() or "timed out" in str(e).lower():
                return None
            raise
        payload = getattr(event, "payload", event)
        if isinstance(payload, dict) and "payload" in payload:
            payload = payload["payload"]
        return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)

    async def gather(self, branches: Sequence[Callable[[], Awaitable[Any]]]) -> list[Any]:
        return list(await asyncio.gather(*(b() for b in branches)))

    async def dispatch_once(
        self, name: str, position: int, send: Callable[[], Awaitable[str]]
    ) -> str:
        return str(await self._do(name, send))


class HazeWorkflow(_Base):  # type: ignore[misc, unused-ignore]
    """The base of the generated ``<Name>Workflow`` classes: ``workflow`` names the
    app's ``@workflow``, ``app_root`` the bundled app."""

    workflow: str = ""
    app_root: str | None = None
    _app: Any = None

    async def run(self, event: Any, step: Any) -> Any:
        from haze.driver_api import App, WorkflowRun, encode_result, find_workflow, run_in_app

        from haze_cloudflare._js import bind_env, to_py

        bind_env(getattr(self, "env", None))
        cls = type(self)
        if cls._app is None:
            cls._app = App(root=cls.app_root)
            await cls._app.__aenter__()
        wf = find_workflow(cls.workflow)
        if wf is None:
            raise LookupError(f"no workflow named {cls.workflow!r} in the bundled app")
        payload = to_py(getattr(event, "payload", None)) or {}
        run_id = str(getattr(event, "instance_id", None) or getattr(event, "instanceId", ""))

        async def go() -> Any:
            run = WorkflowRun(
                run_id,
                wf.name,
                CloudflareStepEngine(step),
                max_steps=min(wf.max_steps, MAX_STEPS),
                max_result_size=MAX_RESULT_SIZE,
                result_rule=_RESULT_RULE,
            )
            value = await wf.fn(run, **dict(payload))
            where = f'workflow "{wf.name}" (run {run_id})'
            return json.loads(encode_result(value, where, MAX_RESULT_SIZE, _RESULT_RULE))

        return await run_in_app(cls._app, go)


class BindingWorkflow:
    """One Workflow's instances through its binding in the Worker's env (``create``,
    ``get(id)`` -> ``status()``/``sendEvent``/``terminate``): what ``Workflow.start``,
    ``send_event``, ``status`` and ``cancel`` of a native cloudflare connection use inside
    a Worker. Listing runs needs the REST API (a binding cannot list)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def _binding(self) -> Any:
        found = binding(self.name)
        if found is None:
            raise LookupError(f"the Worker env has no Workflow binding {self.name!r}")
        return found

    async def create(self, run_id: str, params: Any) -> None:
        await _settle(self._binding().create(to_js({"id": run_id, "params": params})))

    async def _instance(self, run_id: str) -> Any:
        return await _settle(self._binding().get(run_id))

    async def get(self, run_id: str) -> dict[str, Any] | None:
        found: Any = to_py(await _settle((await self._instance(run_id)).status()))
        return found if isinstance(found, dict) else None

    async def send_event(self, run_id: str, event_type: str, payload: Any) -> None:
        instance = await self._instance(run_id)
        await _settle(instance.sendEvent(to_js({"type": event_type, "payload": payload})))

    async def terminate(self, run_id: str) -> None:
        await _settle((await self._instance(run_id)).terminate())

    async def list(self, status: str | None, limit: int) -> list[dict[str, Any]]:
        raise WorkflowRunError(
            f"a Workflow binding ({self.name}) cannot list its instances: list runs "
            "outside the Worker (haze workflow:list, the dashboard), through the REST API"
        )


async def _settle(value: Any) -> Any:
    """Await a JS promise (or a coroutine from a Python stand-in); pass other values."""
    if inspect.isawaitable(value):
        return await value
    return value


def binding_workflow(name: str) -> BindingWorkflow | None:
    """The ``haze.bindings`` plugin ``workflows``: the Workflow binding ``name`` of the
    bound env, or None (not bound: the runs are reached through the REST API)."""
    return BindingWorkflow(name) if binding(name) is not None else None
