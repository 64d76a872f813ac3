"""``Workflow.start/send_event/status/wait/cancel`` on a ``"workflows": "native"`` sqs
connection, through boto3 and the durable-execution API.

What is real: AWS's local durable-execution engine (the testing package's
``WebRunner``) keeps the executions and serves the API; boto3's Lambda client calls it
(``Invoke`` with a ``DurableExecutionName``, ``ListDurableExecutionsByFunction``,
``GetDurableExecution``, ``GetDurableExecutionHistory``,
``SendDurableExecutionCallbackSuccess``, ``StopDurableExecution``); the handler runs
under the real SDK and checkpoints to the engine over HTTP. What stands in for Lambda
itself is ``durable_local.LambdaEndpoint`` (see there): it runs the handler in this
process when the engine invokes it, and turns a caller's asynchronous ``Invoke`` into a
started execution, as Lambda does for a durable function.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "workflows"))

import haze_lambda
import recipes
from durable_local import local_durable_engine
from haze import (
    App,
    Workflow,
    WorkflowRunError,
    define_cache_config,
    define_database_config,
    define_queue_config,
    workflow,
)
from haze_lambda import workflow_handler

pytestmark = pytest.mark.timeout(180)

FUNCTION = "haze-workflows"
NATIVE = {
    "driver": "sqs",
    "queue_url": "http://127.0.0.1:1/1/jobs",
    "region": "us-east-1",
    "workflows": "native",
}
LAMBDA_CONFIG = {
    "queue.py": f"""\
from haze import define_queue_config

config = define_queue_config(default="jobs", store="db", connections={{
    "jobs": {{"driver": "sync"}},
    "lambda": {NATIVE!r},
}})
""",
    "cache.py": """\
from haze import define_cache_config

config = define_cache_config(stores={"db": {"driver": "database", "connection": "main"}})
""",
    # the same store as the dispatching side's: an event sent early is kept there
    "database.py": """\
from haze import define_database_config

config = define_database_config(default="main", connections={"main": {"url": "sqlite:///{db}"}})
""",
}

GATE = threading.Event()


def _gate() -> str:
    GATE.wait(30)
    return "open"


@workflow(name="lam_gated")
async def lam_gated(run: Any) -> Any:
    await run.step("gate", _gate)
    return {"go": await run.wait_for_event("go", timeout="1h")}


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    root = tmp_path / "lambda_app"
    (root / "config").mkdir(parents=True)
    for name, text in LAMBDA_CONFIG.items():
        (root / "config" / name).write_text(text.replace("{db}", str(tmp_path / "shared.db")))
    monkeypatch.setenv("HAZE_APP_ROOT", str(root))
    monkeypatch.setenv("HAZE_WORKFLOW_FUNCTION", FUNCTION)
    recipes.reset()
    GATE.clear()
    with local_durable_engine({FUNCTION: workflow_handler}) as url:
        yield url
    GATE.set()
    haze_lambda.reset()


def client_app(tmp: Path) -> App:
    """The dispatching side: its workflows' connection runs them on Lambda. (An sqs
    app needs a store for its locks; its store holds no run here: each status is looked
    up there first, then on Lambda.)"""
    return App(
        queue=define_queue_config(default="lambda", store="db", connections={"lambda": NATIVE}),
        cache=define_cache_config(stores={"db": {"driver": "database", "connection": "main"}}),
        database=define_database_config(
            default="main", connections={"main": {"url": f"sqlite:///{tmp / 'shared.db'}"}}
        ),
    )


async def until(run_id: str, state: str) -> Any:
    for _ in range(600):
        st = await Workflow.status(run_id)
        if st is not None and st.state == state:
            return st
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} never became {state}: {st}")


async def test_start_wait_for_the_webhook_send_it_and_read_the_run(
    engine: str, tmp_path: Path
) -> None:
    async with client_app(tmp_path):
        rid = await Workflow.start(recipes.payment, order_id="A-1", cents=1200, id="pay-1")
        assert rid == "pay-1"
        assert await Workflow.start(recipes.payment, order_id="A-1", cents=1200, id="pay-1") == rid
        st = await until(rid, "waiting")
        assert st.name == "payment" and st.waiting_for == "paid"
        assert [(s.name, s.kind, s.state) for s in st.steps] == [
            ("intent", "step", "done"),
            ("paid", "event", "waiting"),
        ]
        assert await Workflow.send_event(rid, "paid", {"amount": 1200}) is True
        done = await Workflow.wait(rid, timeout=60)
        assert done.state == "done", done.error
        assert done.result == {"order": "A-1", "state": "shipped", "paid": {"amount": 1200}}
        assert [(s.name, s.kind, s.state) for s in done.steps] == [
            ("intent", "step", "done"),
            ("paid", "event", "done"),
            ("ship", "step", "done"),
            ("dispatch:recipes.receipt", "dispatch", "done"),
        ]
        assert done.steps[0].attempts == 1 and (done.steps[0].result_size or 0) > 0
        assert done.input == {"order_id": "A-1", "cents": 1200}
        # one execution for the id, though started twice; each effect ran once
        assert recipes.CALLS == {"create_payment_intent": 1, "ship_order": 1, "receipt": 1}
        # a finished run: cancel is False (like Queue.cancel), an event is one line
        assert await Workflow.cancel(rid) is False
        with pytest.raises(WorkflowRunError) as e:
            await Workflow.send_event(rid, "paid", {})
        assert "is done" in str(e.value) and "\n" not in str(e.value)


async def test_an_event_before_its_wait_is_kept_and_an_unknown_run_is_one_line(
    engine: str, tmp_path: Path
) -> None:
    async with client_app(tmp_path):
        rid = await Workflow.start(lam_gated, id="gated-1")  # type: ignore[arg-type]
        await until(rid, "running")
        # the run is in its first step: the wait for "go" has not begun
        assert await Workflow.send_event(rid, "go", {"ok": True}) is True
        assert await Workflow.send_event(rid, "go", {"ok": False}) is False  # the first wins
        GATE.set()
        done = await Workflow.wait(rid, timeout=60)
        assert done.result == {"go": {"ok": True}}
        assert [(s.name, s.kind, s.state) for s in done.steps] == [
            ("gate", "step", "done"),
            ("go", "event", "done"),
        ]
        with pytest.raises(WorkflowRunError) as unknown:
            await Workflow.send_event("no-such-run", "go", 1)
        assert "no workflow run 'no-such-run'" in str(unknown.value)
        assert await Workflow.status("no-such-run") is None


async def test_cancel_stops_a_waiting_run(engine: str, tmp_path: Path) -> None:
    async with client_app(tmp_path):
        rid = await Workflow.start(recipes.payment, order_id="A-3", cents=5, id="pay-3")
        await until(rid, "waiting")
        assert await Workflow.cancel(rid) is True
        st = await until(rid, "cancelled")
        assert st.error == "cancelled" or st.error
        assert await Workflow.cancel(rid) is False
        runs = await Workflow.list(name="payment")
        assert [r.id for r in runs] == ["pay-3"] and runs[0].state == "cancelled"


def write_client(root: Path) -> Path:
    files = {
        "queue.py": f"""\
from haze import define_queue_config

config = define_queue_config(default="lambda", store="db", connections={{"lambda": {NATIVE!r}}})
""",
        "cache.py": """\
from haze import define_cache_config

config = define_cache_config(stores={"db": {"driver": "database", "connection": "main"}})
""",
        "database.py": f"""\
from haze import define_database_config

config = define_database_config(
    default="main", connections={{"main": {{"url": "sqlite:///{root.parent / "shared.db"}"}}}}
)
""",
    }
    for name, text in files.items():
        (root / "config").mkdir(parents=True, exist_ok=True)
        (root / "config" / name).write_text(text)
    return root


def test_the_cli_shows_lists_and_cancels_a_lambda_run(engine: str, tmp_path: Path) -> None:
    from click.testing import CliRunner
    from haze.cli import get_cli

    root = write_client(tmp_path / "client")

    async def start() -> None:
        async with App(root=root):
            rid = await Workflow.start(recipes.payment, order_id="C-1", cents=7, id="pay-cli")
            await until(rid, "waiting")

    asyncio.run(start())

    def haze(*args: str) -> str:
        result = CliRunner().invoke(get_cli(), ["--root", str(root), *args])
        assert result.exit_code == 0, result.output
        return result.output

    shown = haze("workflow:show", "pay-cli")
    assert "payment" in shown and "waiting" in shown and "intent" in shown and "paid" in shown
    assert "pay-cli" in haze("workflow:list", "--name", "payment")
    haze("workflow:cancel", "pay-cli")
    assert "cancelled" in haze("workflow:show", "pay-cli")


def _brew(kind: str) -> str:
    return f"{kind} ready"


@workflow(name="lam_names")
async def lam_names(run: Any, kind: str) -> Any:
    a = await run.step("café ☕", _brew, kind)  # escaped for Lambda, shown as written
    b = await run.step("café ☕ " + "x" * 240, _brew, "long")  # 260 once escaped: hashed
    return [a, b]


async def test_names_lambda_cannot_store_are_bridged(engine: str, tmp_path: Path) -> None:
    # a run id past Lambda's 64 [A-Za-z0-9_-] and a step name outside printable ASCII
    rid = "order/ü/" + "7" * 100
    async with client_app(tmp_path):
        assert await Workflow.start(lam_names, kind="flat white", id=rid) == rid  # type: ignore[arg-type]
        done = await Workflow.wait(rid, timeout=60)
        assert done.id == rid and done.state == "done", done.error
        assert done.result == ["flat white ready", "long ready"]
        short, long = (s.name for s in done.steps)
        assert short == "café ☕"
        # too long for Lambda even escaped: kept under a hash, shown cut
        assert long.startswith("café ☕ xxx") and len(long) < 247
        assert await Workflow.start(lam_names, kind="again", id=rid) == rid  # type: ignore[arg-type]
        assert (await Workflow.status(rid)).result[0] == "flat white ready"  # type: ignore[union-attr]


async def test_a_native_connection_without_its_function_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HAZE_WORKFLOW_FUNCTION", raising=False)
    from haze.errors import ConfigError

    async with client_app(tmp_path):
        with pytest.raises(ConfigError) as e:
            await Workflow.start(recipes.payment, order_id="X", cents=1)
    assert "set HAZE_WORKFLOW_FUNCTION" in str(e.value) and "\n" not in str(e.value)
