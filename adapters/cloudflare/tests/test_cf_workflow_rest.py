"""Native Cloudflare workflows reached from outside a Worker: ``Workflow.start``,
``send_event``, ``status``, ``cancel``, ``haze workflow:list|show|cancel`` and the
dashboard's Workflows pages read and drive the instances through Cloudflare's REST API.

Real: haze's REST client (``haze._workflows.cloudflare_runs``, httpx over real HTTP), the
CLI (click's runner, in this process) and the dashboard (starlette's TestClient).
A MODEL: the server, ``cf_workflows_standin.py``, which serves the documented shapes of
Cloudflare's Workflows REST API. Miniflare runs the engine and its bindings (see
test_cf_miniflare_native.py) but serves no ``/client/v4`` account API, and no Cloudflare
account is reachable here: anything Cloudflare does beyond those shapes is not checked.
"""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from cf_workflows_standin import ACCOUNT, TOKEN, StandIn
from click.testing import CliRunner, Result
from haze import App, Workflow, workflow
from haze.cli import get_cli
from haze.dashboard import create_app
from haze.errors import ConfigError, WorkflowLimitError, WorkflowRunError
from starlette.testclient import TestClient

T = TypeVar("T")


@workflow(name="cfr_pay")
async def cfr_pay(run: Any, order: str) -> Any:
    intent = await run.step("intent", lambda: {"order": order})
    paid = await run.wait_for_event("paid", timeout="3d")
    return {"intent": intent, "paid": paid}


QUEUE_PY = """\
    from haze import define_queue_config
    # the runs live on Cloudflare; the store only keeps this process's unique locks
    config = define_queue_config(
        default="edge",
        store="memory",
        connections={{"edge": {{
            "driver": "cloudflare", "binding": "QUEUE", "workflows": "native",
            {creds}
        }}}},
    )
    """


def write_app(root: Path, creds: str) -> Path:
    (root / "config").mkdir(parents=True)
    (root / "config" / "queue.py").write_text(textwrap.dedent(QUEUE_PY.format(creds=creds)))
    return root


def step(name: str, output: Any, attempts: int = 1) -> dict[str, Any]:
    at = "2026-12-01T10:00:00.000Z"
    return {
        "type": "step",
        "name": name,
        "start": at,
        "end": "2026-12-01T10:00:01.000Z",
        "success": True,
        "output": output,
        "error": None,
        "config": {"retries": {"limit": 0, "delay": "1 second", "backoff": "constant"}},
        "attempts": [{"start": at, "end": at, "success": True, "error": None}] * attempts,
    }


def wait(name: str, finished: bool, output: Any = None) -> dict[str, Any]:
    return {
        "type": "waitForEvent",
        "name": name,
        "start": "2026-12-01T10:00:02.000Z",
        "end": None,
        "finished": finished,
        "output": output,
        "error": None,
    }


@pytest.fixture
def cf() -> Iterator[StandIn]:
    with StandIn() as standin:
        standin.instances[("cfr_pay", "pay-1")] = {
            "status": "complete",
            "params": {"order": "A-1"},
            "queued": "2026-12-01T09:59:59.000Z",
            "end": "2026-12-01T10:00:05.000Z",
            "output": {"intent": {"order": "A-1"}, "paid": {"amount": 5}},
            "error": None,
            "steps": [
                step("haze:at:0", "intent"),
                step("intent", {"order": "A-1"}, attempts=2),
                step("haze:at:1", "paid"),
                wait("paid", True, {"amount": 5}),
            ],
        }
        standin.instances[("cfr_pay", "pay-2")] = {
            "status": "waiting",
            "params": {"order": "A-2"},
            "queued": "2026-12-01T11:00:00.000Z",
            "steps": [
                step("haze:at:0", "intent"),
                step("intent", {"order": "A-2"}),
                step("haze:at:1", "paid"),
                wait("paid", False),
            ],
        }
        standin.instances[("cfr_pay", "pay-3")] = {
            "status": "errored",
            "params": {"order": "A-3"},
            "queued": "2026-12-01T08:00:00.000Z",
            "error": {"name": "Error", "message": "ValueError: card declined"},
            "steps": [],
        }
        yield standin


@pytest.fixture
def root(tmp_path: Path, cf: StandIn) -> Path:
    creds = f'"account_id": "{ACCOUNT}", "api_token": "{TOKEN}", "api_url": "{cf.api_url}"'
    return write_app(tmp_path / "app", creds)


def in_app(root: Path, fn: Callable[[App], Awaitable[T]]) -> T:
    async def go() -> T:
        async with App(root=root) as app:
            return await fn(app)

    return asyncio.run(go())


def haze(root: Path, *args: str) -> Result:
    return CliRunner().invoke(get_cli(), ["--root", str(root), *args])


def test_the_cli_lists_shows_and_cancels_runs_through_the_rest_api(root: Path, cf: StandIn) -> None:
    listed = haze(root, "workflow:list")
    assert listed.exit_code == 0, listed.output
    lines = {ln.split()[0]: ln for ln in listed.output.splitlines() if "pay-" in ln}
    assert "done" in lines["pay-1"] and "cfr_pay" in lines["pay-1"]
    assert "waiting" in lines["pay-2"] and "failed" in lines["pay-3"]
    assert list(lines) == ["pay-2", "pay-1", "pay-3"]  # newest first

    shown = haze(root, "workflow:show", "pay-1")
    assert shown.exit_code == 0, shown.output
    assert "cfr_pay run pay-1: done" in shown.output
    assert "haze:at" not in shown.output  # haze's own position marks are not shown
    steps = {ln.split()[1]: ln for ln in shown.output.splitlines() if ln.strip()[:1].isdigit()}
    assert list(steps) == ["intent", "paid"]
    assert "done" in steps["intent"]
    failed = haze(root, "workflow:show", "pay-3")
    assert "ValueError: card declined" in failed.output

    cancelled = haze(root, "workflow:cancel", "pay-2")
    assert cancelled.exit_code == 0, cancelled.output
    assert cf.instances[("cfr_pay", "pay-2")]["status"] == "terminated"
    finished = haze(root, "workflow:cancel", "pay-1")
    assert finished.exit_code == 1 and "Traceback" not in finished.output
    assert finished.output.strip().splitlines() == [
        'Error: run "pay-1" of "cfr_pay" is done: nothing to cancel'
    ]


def test_start_and_events_from_outside_a_worker(root: Path, cf: StandIn) -> None:
    async def go(app: App) -> Any:
        rid = await Workflow.start(cfr_pay, id="pay-9", order="A-9")
        again = await Workflow.start(cfr_pay, id="pay-9", order="other")
        sent = await Workflow.send_event("pay-2", "paid", {"amount": 7})
        errors = []
        for call in (
            lambda: Workflow.send_event("no-such-run", "paid", 1),
            lambda: Workflow.send_event("pay-1", "paid", 1),
        ):
            try:
                await call()
            except WorkflowRunError as e:
                errors.append(str(e))
        return rid, again, sent, errors, await Workflow.status("pay-9")

    rid, again, sent, errors, st = in_app(root, go)
    assert rid == again == "pay-9"
    assert cf.instances[("cfr_pay", "pay-9")]["params"] == {"order": "A-9"}
    assert st is not None and st.state == "running" and st.input == {"order": "A-9"}
    assert sent is True
    assert cf.events == [("cfr_pay", "pay-2", "paid", {"amount": 7})]
    assert errors == [
        "Workflow.send_event: no workflow run 'no-such-run'; check the id "
        "(Workflow.start returns it)",
        "Workflow.send_event: run 'pay-1' of \"cfr_pay\" is done; an event can only reach "
        "a run that has not finished",
    ]


def test_a_run_id_cloudflare_cannot_take_is_refused_in_one_line(root: Path, cf: StandIn) -> None:
    async def go(app: App) -> str:
        with pytest.raises(WorkflowRunError) as e:
            await Workflow.start(cfr_pay, id="order 7/2026", order="A")
        return str(e.value)

    message = in_app(root, go)
    assert message == (
        'Workflow.start("cfr_pay"): Cloudflare Workflows instance ids are 1-100 of '
        "A-Z a-z 0-9 _ - (not starting with -), got 'order 7/2026'; pass another id"
    )
    assert not [r for r in cf.requests if r[0] == "POST"]


MIB = 1024 * 1024


def test_an_input_or_event_over_1_mib_is_refused_before_it_is_sent(root: Path, cf: StandIn) -> None:
    """Cloudflare Workflows takes at most 1 MiB of JSON as an event's payload, and haze
    holds a run's input (the payload of the event that starts it) to the same: past it,
    one line naming the workflow and the limit, and nothing is sent (a start makes no
    request at all; an event is refused once its run is found, before the POST)."""

    async def go(app: App) -> tuple[list[str], int]:
        errors = []
        with pytest.raises(WorkflowLimitError) as e:
            await Workflow.start(cfr_pay, id="pay-big", order="x" * MIB)
        errors.append(str(e.value))
        asked = len(cf.requests)
        with pytest.raises(WorkflowLimitError) as e:
            await Workflow.send_event("pay-2", "paid", "é" * (MIB // 2))  # 2 bytes each
        errors.append(str(e.value))
        await Workflow.send_event("pay-2", "paid", "x" * (MIB - 2))  # '"x…x"': 1 MiB exactly
        return errors, asked

    errors, asked = in_app(root, go)
    assert asked == 0, cf.requests
    size = len('{"order":""}') + MIB
    assert errors == [
        f'Workflow.start("cfr_pay"): the input is {size:,} bytes of JSON, over Cloudflare '
        "Workflows' limit of 1,048,576 bytes (1 MiB) for a run's input; keep large data "
        "outside (a file, a bucket) and pass its key",
        'Workflow.send_event(\'pay-2\', "paid") of "cfr_pay": the payload is 1,048,578 '
        "bytes of JSON, over Cloudflare Workflows' limit of 1,048,576 bytes (1 MiB) for an "
        "event's payload; keep large data outside (a file, a bucket) and send its key",
    ]
    assert ("cfr_pay", "pay-big") not in cf.instances
    assert [(wf, rid, name, len(p)) for wf, rid, name, p in cf.events] == [
        ("cfr_pay", "pay-2", "paid", MIB - 2)
    ]


def test_without_credentials_outside_a_worker_one_line(tmp_path: Path) -> None:
    root = write_app(tmp_path / "app", "")
    result = haze(root, "workflow:list")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "needs account_id and api_token" in result.output
    assert len(result.output.strip().splitlines()) == 1

    async def go(app: App) -> None:
        await Workflow.start(cfr_pay, id="x", order="A")

    with pytest.raises(ConfigError, match="needs account_id and api_token"):
        in_app(root, go)


def test_the_dashboard_reads_the_runs_and_steps_from_the_api(root: Path, cf: StandIn) -> None:
    async def page(app: App) -> tuple[str, str]:
        with TestClient(create_app(app, authorize=lambda request: True)) as client:
            listing = client.get("/workflows")
            detail = client.get("/workflows/pay-1")
        assert listing.status_code == detail.status_code == 200
        return listing.text, detail.text

    listing, detail = in_app(root, page)
    assert "pay-1" in listing and "pay-2" in listing and "pay-3" in listing
    assert "intent" in detail and "haze:at" not in detail


def test_odd_run_ids_and_event_names_stay_inside_their_url_segment(root: Path, cf: StandIn) -> None:
    """An id no instance can have is unknown without a request (a ``/``, ``..`` or ``?``
    in it must not reach another endpoint); an event's name travels %-escaped, whole."""

    async def go(app: App) -> Any:
        odd = ["a/b", "../cfr_pay", "pay-2?status=x", "pay-2/events/paid", "-x", "é"]
        statuses = [await Workflow.status(rid) for rid in odd]
        cancels = [await Workflow.cancel(rid) for rid in odd]
        seen = len(cf.requests)
        errors = []
        for rid in odd:
            try:
                await Workflow.send_event(rid, "paid", 1)
            except WorkflowRunError as e:
                errors.append(str(e))
        sent = await Workflow.send_event("pay-2", "paid/now?x=1 %", {"amount": 1})
        return statuses, cancels, seen, errors, sent

    statuses, cancels, seen, errors, sent = in_app(root, go)
    assert statuses == [None] * 6 and cancels == [False] * 6
    assert seen == 0, cf.requests
    assert errors == [
        f"Workflow.send_event: no workflow run {rid!r}; check the id (Workflow.start returns it)"
        for rid in ["a/b", "../cfr_pay", "pay-2?status=x", "pay-2/events/paid", "-x", "é"]
    ]
    assert sent is True
    assert cf.events == [("cfr_pay", "pay-2", "paid/now?x=1 %", {"amount": 1})]


def test_retry_of_a_native_run_says_in_one_line_that_the_platform_keeps_it(
    root: Path, cf: StandIn
) -> None:
    """haze replays failed runs of its own engine only: a failed run on Cloudflare
    Workflows is not "of a workflow this app does not define" (nor a store error)."""
    result = haze(root, "workflow:retry", "pay-3")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines() == [
        "Error: Workflow.retry: run 'pay-3' of \"cfr_pay\" runs on the platform's own "
        "workflow engine, which keeps its runs: haze cannot replay it; start a new run "
        "(Workflow.start) instead"
    ]
    assert not [r for r in cf.requests if r[0] != "GET"]


def test_a_workflow_routed_to_the_native_connection_runs_there(tmp_path: Path, cf: StandIn) -> None:
    """A route, like a definition's connection=, puts a workflow on Cloudflare Workflows
    when the default connection is another one (it ran on haze's engine instead)."""
    root = tmp_path / "app"
    (root / "config").mkdir(parents=True)
    (root / "config" / "queue.py").write_text(
        "from haze import define_queue_config\n"
        "config = define_queue_config(\n"
        '    default="memory",\n'
        '    store="memory",\n'
        "    connections={\n"
        '        "memory": {"driver": "memory"},\n'
        '        "edge": {"driver": "cloudflare", "binding": "QUEUE", "workflows": "native",\n'
        f'                 "account_id": "{ACCOUNT}", "api_token": "{TOKEN}",\n'
        f'                 "api_url": "{cf.api_url}"}},\n'
        "    },\n"
        '    routes={"cfr_*": {"connection": "edge"}},\n'
        ")\n"
    )

    async def go(app: App) -> Any:
        rid = await Workflow.start(cfr_pay, id="pay-7", order="A-7")
        return rid, await Workflow.status("pay-1")

    rid, st = in_app(root, go)
    assert rid == "pay-7"
    assert cf.instances[("cfr_pay", "pay-7")]["params"] == {"order": "A-7"}
    assert st is not None and st.state == "done" and st.name == "cfr_pay"
