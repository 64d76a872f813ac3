"""Runs of workflows on Cloudflare Workflows: start, events, status, list, cancel.

A cloudflare connection with ``"workflows": "native"`` runs each workflow as a Workflow
of its own (``haze build`` names it like the workflow, bound as ``HAZE_WF_<NAME>``); a
run is one instance, its id the run id. Inside a Worker the calls go through that
binding (``create``, ``get(id).status()``, ``sendEvent``, ``terminate``; the adapter
registers the lookup as the ``workflows`` binding); anywhere else through Cloudflare's
REST API with the connection's ``account_id`` and ``api_token`` (``api_url`` points it
elsewhere): ``/accounts/{account}/workflows/{name}/instances[/{id}[/status|/events/{type}]]``.

The engine keeps an event sent before the run waits for it and hands it over at the
wait, so ``send_event`` needs no store.
"""

from __future__ import annotations

import builtins
import json
import re
import weakref
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Protocol
from urllib.parse import quote

from haze._base import plugins
from haze._base.errors import ConfigError, WorkflowLimitError, WorkflowRunError
from haze._base.http import LoopClient
from haze._workflows.definition import find_workflow, registered_workflows
from haze.contracts.workflow import FINAL_STATES, StepStatus, WorkflowStatus

__all__ = [
    "API_URL",
    "MAX_EVENT_SIZE",
    "CloudflareRuns",
    "WorkflowApi",
    "cloudflare_runs",
    "is_cloudflare_native",
    "register_workflow_binding",
]

API_URL = "https://api.cloudflare.com/client/v4"
_BINDINGS = "workflows"
_STATES = {
    "queued": "running",
    "running": "running",
    "paused": "running",
    "waitingForPause": "running",
    "unknown": "running",
    "waiting": "waiting",
    "complete": "done",
    "errored": "failed",
    "terminated": "cancelled",
}
_KINDS = {"step": "step", "sleep": "sleep", "waitForEvent": "event"}
_NOT_FOUND = re.compile(r"not[._ ]found", re.IGNORECASE)
#: What Cloudflare takes as an instance id.
_INSTANCE_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,99}")
#: Cloudflare Workflows takes at most 1 MiB of JSON as an event's payload; a run's input
#: (the payload of the event that starts it) is held to the same.
MAX_EVENT_SIZE = 1024 * 1024


class WorkflowApi(Protocol):
    """One Workflow's instances: its binding in a Worker, or the REST API."""

    async def create(self, run_id: str, params: Any) -> None: ...

    async def get(self, run_id: str) -> Mapping[str, Any] | None:
        """The instance's status (``status``, ``output``, ``error``, and ``steps`` and
        ``params`` where the API gives them), or None for an unknown instance."""

    async def send_event(self, run_id: str, event_type: str, payload: Any) -> None: ...

    async def terminate(self, run_id: str) -> None: ...

    async def list(self, status: str | None, limit: int) -> builtins.list[Mapping[str, Any]]:
        """Instances, newest first (``id``, ``status``; the REST API only)."""


def register_workflow_binding(fn: Callable[[str], WorkflowApi | None]) -> None:
    """The adapter's lookup of a Workflow binding by name (None: not bound here)."""
    plugins.register(plugins.BINDINGS, _BINDINGS, fn)


def _binding(name: str) -> WorkflowApi | None:
    try:
        lookup: Callable[[str], WorkflowApi | None] | None = plugins.find(
            plugins.BINDINGS, _BINDINGS
        )
    except ConfigError:
        return None
    return None if lookup is None else lookup(name)


def binding_name(workflow: str) -> str:
    """``send-receipt`` -> ``HAZE_WF_SEND_RECEIPT`` (what ``haze build`` binds)."""
    return "HAZE_WF_" + re.sub(r"[^A-Za-z0-9]", "_", workflow).upper()


class RestWorkflow:
    """One Workflow's instances through Cloudflare's REST API (httpx)."""

    def __init__(self, options: Mapping[str, Any], workflow: str) -> None:
        base = str(options.get("api_url") or API_URL).rstrip("/")
        account, name = options["account_id"], quote(workflow, safe="")
        self.base = f"{base}/accounts/{account}/workflows/{name}/instances"
        self._http = LoopClient(
            what="native workflows outside a Worker (REST API)",
            extra="cloudflare",
            timeout=30.0,
            headers={"authorization": f"Bearer {options['api_token']}"},
        )

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        url = self.base + path
        try:
            response = await self._http.get().request(method, url, **kwargs)
        except self._http.httpx.HTTPError as e:
            raise WorkflowRunError(f"cannot reach {url} ({type(e).__name__}: {e})") from e
        try:
            data = response.json()
        except ValueError:
            data = None
        if response.status_code == 404:
            raise LookupError(url)
        if response.status_code >= 400 or not isinstance(data, dict) or not data.get("success"):
            errors = data.get("errors") if isinstance(data, dict) else None
            detail = "; ".join(
                f"{e.get('code', '')} {e.get('message', '')}".strip()
                for e in errors or []
                if isinstance(e, dict)
            )
            raise WorkflowRunError(f"{method} {url}: {detail or response.text[:300]}")
        return data.get("result")

    async def create(self, run_id: str, params: Any) -> None:
        await self._call("POST", "", json={"instance_id": run_id, "params": params})

    async def get(self, run_id: str) -> Mapping[str, Any] | None:
        try:
            found = await self._call("GET", f"/{quote(run_id, safe='')}")
        except LookupError:
            return None
        return found if isinstance(found, dict) else None

    async def send_event(self, run_id: str, event_type: str, payload: Any) -> None:
        # the type is the wait's name as written: escaped, a "/" or "?" in it stays in it
        path = f"/{quote(run_id, safe='')}/events/{quote(event_type, safe='')}"
        try:
            await self._call("POST", path, json=payload)
        except LookupError as e:
            raise WorkflowRunError(f"Workflow.send_event: no workflow run {run_id!r}") from e

    async def terminate(self, run_id: str) -> None:
        path = f"/{quote(run_id, safe='')}/status"
        try:
            await self._call("PATCH", path, json={"status": "terminate"})
        except LookupError as e:  # gone meanwhile: nothing left to terminate
            raise WorkflowRunError(f"cannot terminate {run_id!r}: not found") from e

    async def list(self, status: str | None, limit: int) -> builtins.list[Mapping[str, Any]]:
        query: dict[str, Any] = {"per_page": max(1, min(limit, 100)), "direction": "desc"}
        if status:
            query["status"] = status
        found = await self._call("GET", "", params=query)
        return [f for f in found or [] if isinstance(f, dict)]


class CloudflareRuns:
    """``WorkflowRuns`` (and the start and events) of one native cloudflare connection."""

    def __init__(self, connection: str, options: Mapping[str, Any], app: Any = None) -> None:
        self.connection = connection
        self.options = options
        # weak: _runs is keyed weakly by this app, and a strong ref here would keep it alive
        self._app = None if app is None else weakref.ref(app)
        self._rest: dict[str, RestWorkflow] = {}

    def api(self, workflow: str) -> WorkflowApi:
        """The binding of ``workflow`` in a Worker, else the REST API."""
        bound = _binding(binding_name(workflow))
        if bound is not None:
            return bound
        missing = [k for k in ("account_id", "api_token") if not self.options.get(k)]
        if missing:
            raise ConfigError(
                f"queue connection {self.connection!r} runs workflows on Cloudflare "
                f"Workflows: outside a Worker its runs are reached through the REST API, "
                f"which needs {' and '.join(missing)} in the connection (inside a Worker, "
                f"bind the env with haze_cloudflare.bind_env: {binding_name(workflow)})",
                key=f"connections.{self.connection}",
            )
        if workflow not in self._rest:
            self._rest[workflow] = RestWorkflow(self.options, workflow)
        return self._rest[workflow]

    def _workflows(self) -> builtins.list[str]:
        return sorted(n for n in registered_workflows() if self._owns(n))

    def _owns(self, workflow: str) -> bool:
        wf = find_workflow(workflow)
        if wf is None:
            return False
        app = None if self._app is None else self._app()
        if app is None:
            return (wf.job.connection or self.connection) == self.connection
        return _connection_of(app, workflow) == self.connection

    async def _find(self, run_id: str) -> tuple[str, Mapping[str, Any]] | None:
        if not _INSTANCE_ID.fullmatch(run_id):
            return None  # no instance has it; asking would put its "/" or "?" in the URL
        for workflow in self._workflows():
            found = await _get(self.api(workflow), run_id)
            if found is not None:
                return workflow, found
        return None

    async def start(self, workflow: str, run_id: str, input_text: str) -> str:
        """Create instance ``run_id`` with the input; a start of an id that exists
        starts nothing."""
        if not _INSTANCE_ID.fullmatch(run_id):
            raise WorkflowRunError(
                f'Workflow.start("{workflow}"): Cloudflare Workflows instance ids are 1-100 '
                f"of A-Z a-z 0-9 _ - (not starting with -), got {run_id!r}; pass another id"
            )
        _check_size(input_text, f'Workflow.start("{workflow}")', "input", "a run's input", "pass")
        api = self.api(workflow)
        if await _get(api, run_id) is not None:
            return run_id
        try:
            await api.create(run_id, json.loads(input_text))
        except Exception as e:
            if "already" not in str(e).lower():
                raise WorkflowRunError(f'Workflow.start("{workflow}") of {run_id!r}: {e}') from e
        return run_id

    async def send_event(
        self, run_id: str, name: str, payload_text: str, keep: object = None
    ) -> bool:
        """Send event ``name`` (its type); the engine keeps one sent before the wait."""
        found = await self._find(run_id)
        if found is None:
            raise WorkflowRunError(
                f"Workflow.send_event: no workflow run {run_id!r}; check the id "
                "(Workflow.start returns it)"
            )
        workflow, data = found
        state = _STATES.get(str(data.get("status")), "running")
        if state in FINAL_STATES:
            raise WorkflowRunError(
                f'Workflow.send_event: run {run_id!r} of "{workflow}" is {state}; '
                "an event can only reach a run that has not finished"
            )
        where = f'Workflow.send_event({run_id!r}, "{name}") of "{workflow}"'
        _check_size(payload_text, where, "payload", "an event's payload", "send")
        await self.api(workflow).send_event(run_id, name, json.loads(payload_text))
        return True

    async def status(self, run_id: str) -> WorkflowStatus | None:
        found = await self._find(run_id)
        return None if found is None else _status(run_id, found[0], found[1])

    async def list(
        self, state: str | None = None, name: str | None = None, limit: int = 50
    ) -> builtins.list[WorkflowStatus]:
        wanted = [k for k, v in _STATES.items() if v == state] if state else [None]
        out: builtins.list[WorkflowStatus] = []
        for workflow in self._workflows():
            if name is not None and workflow != name:
                continue
            for status in wanted:
                for item in await self.api(workflow).list(status, limit):
                    st = _status(str(item.get("id", "")), workflow, item)
                    if state is None or st.state == state:
                        out.append(st)
        out.sort(key=lambda st: st.created_at or 0.0, reverse=True)
        return out[:limit]

    async def cancel(self, run_id: str) -> bool:
        found = await self._find(run_id)
        if found is None or _STATES.get(str(found[1].get("status"))) in FINAL_STATES:
            return False
        try:
            await self.api(found[0]).terminate(run_id)
        except Exception as e:  # it finished meanwhile: "cannot terminate ... finite state"
            if "terminate" in str(e).lower():
                return False
            raise
        return True


def _check_size(text: str, where: str, what: str, whose: str, verb: str) -> None:
    """Refuse JSON past the platform's limit here, in one line naming the workflow,
    before anything is sent (through the REST API or a binding alike), rather than leave
    it to whatever the platform answers to an oversized request."""
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if size > MAX_EVENT_SIZE:
        raise WorkflowLimitError(
            f"{where}: the {what} is {size:,} bytes of JSON, over Cloudflare Workflows' "
            f"limit of {MAX_EVENT_SIZE:,} bytes (1 MiB) for {whose}; keep large data "
            f"outside (a file, a bucket) and {verb} its key"
        )


async def _get(api: WorkflowApi, run_id: str) -> Mapping[str, Any] | None:
    try:
        return await api.get(run_id)
    except WorkflowRunError:
        raise
    except Exception as e:  # the binding's get() of an unknown instance throws
        if _NOT_FOUND.search(str(e)):
            return None
        raise


def _status(run_id: str, workflow: str, data: Mapping[str, Any]) -> WorkflowStatus:
    state = _STATES.get(str(data.get("status")), "running")
    steps = [_step(s, i) for i, s in enumerate(data.get("steps") or []) if isinstance(s, dict)]
    shown = [s for s in steps if not s.name.startswith("haze:")]
    if state == "waiting" and shown and shown[-1].kind == "sleep":
        state = "sleeping"
    waiting = shown[-1].name if state == "waiting" and shown else None
    return WorkflowStatus(
        id=run_id,
        name=workflow,
        state=state,
        steps=shown,
        result=data.get("output") if state == "done" else None,
        error=_error(data.get("error")) if state == "failed" else None,
        input=data.get("params"),
        created_at=_epoch(data.get("queued") or data.get("created_on")),
        updated_at=_epoch(data.get("end") or data.get("modified_on")),
        waiting_for=waiting,
    )


def _error(error: Any) -> str | None:
    """``Name: message``, as haze's engine words a run's error (the platform may have
    put the name into the message already)."""
    if not isinstance(error, Mapping):
        return None if error is None else str(error)
    name, message = str(error.get("name") or ""), str(error.get("message") or "")
    if name in ("", "Error") or message.startswith(f"{name}:"):
        return message
    return f"{name}: {message}"


def _step(data: Mapping[str, Any], position: int) -> StepStatus:
    kind = _KINDS.get(str(data.get("type")), "step")
    done = data.get("success") is True or data.get("finished") is True
    failed = data.get("success") is False
    state = "done" if done else "failed" if failed else {"sleep": "sleeping"}.get(kind, "running")
    if kind == "event" and not done:
        state = "waiting"
    attempts = data.get("attempts")
    return StepStatus(
        name=str(data.get("name", "")),
        state=state,
        attempts=len(attempts) if isinstance(attempts, list) else 0,
        started_at=_epoch(data.get("start")),
        finished_at=_epoch(data.get("end")),
        position=position,
        kind=kind,
        error=_error(data.get("error")) if failed else None,
    )


def _epoch(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


_runs: weakref.WeakKeyDictionary[Any, dict[str, CloudflareRuns]] = weakref.WeakKeyDictionary()


def is_cloudflare_native(options: Mapping[str, Any] | None) -> bool:
    return (
        bool(options)
        and (options or {}).get("driver") == "cloudflare"
        and (options or {}).get("workflows") == "native"
    )


def _connection_of(app: Any, workflow: str) -> str:
    """Where a workflow's runs go: its definition's connection, else its route's, else
    the default connection (as for any job)."""
    wf = find_workflow(workflow)
    own = None if wf is None else wf.job.connection
    routed: str | None = app.queue_config.routes.connection_for(workflow, own)
    return routed or str(app.queue_config.default)


def cloudflare_runs(app: Any, workflow: str | None = None) -> CloudflareRuns | None:
    """The Cloudflare runs of workflow ``workflow`` (None: of the app's native
    cloudflare connection, if it has one), or None when they run elsewhere."""
    connections: Mapping[str, Mapping[str, Any]] = app.queue_config.connections
    if workflow is not None:
        name = _connection_of(app, workflow)
        if not is_cloudflare_native(connections.get(name)):
            return None
    else:
        found = [n for n, o in connections.items() if is_cloudflare_native(o)]
        if not found:
            return None
        name = found[0]
    kept = _runs.setdefault(app, {})
    if name not in kept:
        kept[name] = CloudflareRuns(name, connections[name], app)
    return kept[name]
