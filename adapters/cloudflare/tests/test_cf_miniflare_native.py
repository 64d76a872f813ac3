"""Workflows of a ``"workflows": "native"`` cloudflare connection on Miniflare's REAL
local Workflows engine (wrangler@4.86.0, in workerd), against the same definitions on
haze's own engine (SQLite).

Real: the engine (it keeps each step's result, retries a step with the retries config
haze gives it, sleeps, keeps an event sent before the wait, replays run() from the top
after a pause and resume, and reports the instance's status), the built app's
``wrangler.json`` workflows entries (binding, name, class) that the harness configures,
the relay classes it runs (tests/cloudflare/workflow-worker.mjs) and the bindings'
create/get/status/sendEvent/pause/resume calls made inside that Worker; haze's code
(``haze_cloudflare.workflows``) in real Pyodide. The one model: the Python Workflows
SDK's ``step`` wrapper (cf_miniflare_native.py's ``RelayStep``), since workerd's Python
runtime cannot be loaded offline; each of its calls is carried out by the engine's step.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cf_build import CF_DIR, haze_wheels, miniflare_node
from haze.build._cloudflare_workflows import workflow_binding, workflow_class

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "tests" / "workflows"))

import cf_native_flows  # noqa: E402
import recipes  # noqa: E402
from haze import (  # noqa: E402
    App,
    Workflow,
    define_cache_config,
    define_database_config,
    define_queue_config,
)
from haze._workflows.definition import find_workflow  # noqa: E402
from haze._workflows.engine import set_clock, workflow_state  # noqa: E402

# The module fixture's one workerd run has a 600 s budget of its own (a loaded box):
# pytest's 300 s default timeout must not cut it short.
pytestmark = [pytest.mark.pyodide, pytest.mark.timeout(720)]

RECIPES = ROOT / "tests" / "workflows" / "recipes.py"
NAMES = ["signup", "payment", "import", "cf_replay", "cf_nondet", "cf_big", "cf_names"]
CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("signup", {"email": "ada@example.com"}, {}),
    ("payment", {"order_id": "A-1", "cents": 1200}, {"paid": {"amount": 1200}}),
    ("import", {"source": "c.csv", "chunks": 4}, {}),
]


def built_classes() -> list[dict[str, str]]:
    """The ``workflows`` entries ``haze build`` writes into wrangler.json."""
    return [
        {"binding": workflow_binding(n), "name": n, "class_name": workflow_class(n)} for n in NAMES
    ]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    node = miniflare_node()
    wheels = haze_wheels(tmp_path_factory)
    script = tmp_path_factory.mktemp("cf-mf-native") / "cf_miniflare_native.py"
    classes = built_classes()
    script.write_text(
        f"RECIPES_SRC = {RECIPES.read_text()!r}\n"
        f"FLOWS_SRC = {(HERE / 'cf_native_flows.py').read_text()!r}\n"
        f"CLASSES = {classes!r}\n" + (HERE / "cf_miniflare_native.py").read_text()
    )
    args = [node, str(CF_DIR / "miniflare-harness.mjs")]
    for w in wheels:
        args += ["--wheel", str(w)]
    args += ["--workflows", json.dumps(classes), str(script)]
    proc = subprocess.run(
        args, cwd=CF_DIR, capture_output=True, text=True, timeout=600, check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"miniflare harness failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
    result: dict[str, Any] = json.loads(proc.stdout)["python"]
    if "error" in result:
        pytest.fail(f"the scenario raised inside Pyodide:\n{result['error']}")
    return result


# ------------------------------------------------------------- haze's engine (SQLite)


async def on_store(
    tmp: Path, name: str, given: dict[str, Any], run_id: str, events: dict[str, Any]
) -> tuple[Any, dict[str, Any], list[str]]:
    """Run workflow ``name`` on haze's own engine, its state in a SQLite file; sleeps and
    timeouts pass on the workflows' clock. Its status, kept values and step order."""
    app = App(
        queue=define_queue_config(default="m", store="db", connections={"m": {"driver": "memory"}}),
        cache=define_cache_config(
            default="db", stores={"db": {"driver": "database", "connection": "main"}}
        ),
        database=define_database_config(
            default="main", connections={"main": {"url": f"sqlite:///{tmp / 'store.db'}"}}
        ),
    )
    clock = [time.time()]
    set_clock(lambda: clock[0])
    try:
        async with app:
            wf = find_workflow(name)
            assert wf is not None
            await Workflow.start(wf, id=run_id, **given)  # type: ignore[arg-type]
            st = await settle(run_id)
            while st.state in ("sleeping", "waiting"):
                if st.state == "waiting" and st.waiting_for in events:
                    await Workflow.send_event(run_id, st.waiting_for, events[st.waiting_for])
                else:  # the sleep's (or the wait's timeout's) time passes
                    clock[0] = max(clock[0], st.resume_at or clock[0]) + 1
                    await wf.pending({"run": run_id}).dispatch()
                st = await settle(run_id, st)
            run = await workflow_state(app.manager.state_store()).kept(run_id)
            kept = {s.name: json.loads(run.results.get(s.name) or "null") for s in st.steps}
            await asyncio.sleep(0.2)  # the receipt job (memory connection) runs
            return st, kept, [s.name for s in st.steps]
    finally:
        set_clock(None)


async def settle(run_id: str, before: Any = None) -> Any:
    st = None
    for _ in range(500):
        st = await Workflow.status(run_id)
        if st is not None and st.state != "running" and (before is None or st != before):
            return st
        await asyncio.sleep(0.01)
    raise AssertionError(f"run {run_id} did not settle: {st}")


def engine_steps(run: dict[str, Any], rid: str) -> tuple[dict[str, Any], list[str]]:
    """What the Workflows engine handed back for each step, sleep and event of the run's
    first run() call, and their order: the names its position marks (haze's own steps
    ``haze:at:<position>``) keep."""
    asked = run["asked"][rid]
    first = asked[0][0]
    kept: dict[str, Any] = {}
    marks: dict[int, str] = {}
    for session, op, name, value in asked:
        if session != first:
            continue
        if name.startswith("haze:at:"):
            marks[int(name.rsplit(":", 1)[1])] = value
        else:
            kept[name] = value["payload"] if op == "wait" else value
    return kept, [marks[p] for p in sorted(marks)]


def no_ids(kept: dict[str, Any]) -> dict[str, Any]:
    """A dispatch keeps its job's id: a new one on each engine."""
    out = dict(kept)
    for step in [k for k in out if k.startswith("dispatch:")]:
        assert isinstance(out[step], str) and len(out[step]) == 32
        out[step] = "<job id>"
    return out


# ------------------------------------------------------------------------------ tests


@pytest.mark.parametrize(("name", "given", "events"), CASES, ids=[c[0] for c in CASES])
def test_the_recipes_reach_the_same_steps_results_and_output_on_both_engines(
    run: dict[str, Any], tmp_path: Path, name: str, given: dict[str, Any], events: dict[str, Any]
) -> None:
    recipes.reset()
    rid = {"signup": "cf-signup", "payment": "cf-pay-1", "import": "cf-import"}[name]
    store, store_kept, store_order = asyncio.run(on_store(tmp_path, name, given, rid, events))
    case = run["cases"][name]
    assert case["raw"]["status"] == "complete", case
    assert store.state == case["haze"]["state"] == "done", (store.error, case)
    assert case["raw"]["output"] == case["haze"]["result"] == store.result
    kept, order = engine_steps(run, rid)
    assert no_ids(kept) == no_ids(store_kept)
    assert order == store_order
    # each side effect ran once on both engines
    ran = {k: v for k, v in run["calls"].items() if k != "receipt"}
    mine = {
        "signup": {"create_account", "mail:welcome", "has_logged_in", "mail:nudge"},
        "payment": {"create_payment_intent", "ship_order"},
        "import": {"list_chunks", *(f"import:c.csv#{i}" for i in range(4))},
    }[name]
    assert (
        {k: ran[k] for k in mine} == {k: recipes.CALLS[k] for k in mine} == dict.fromkeys(mine, 1)
    )


def test_the_runs_are_started_and_reached_through_the_bindings(run: dict[str, Any]) -> None:
    assert run["started"] == "cf-import"
    assert run["again"] == "cf-signup"  # a second start of an id starts nothing
    # Miniflare's engine reports a run that waits for an event as "running" (its
    # "waiting" status is never set locally); haze shows what the platform reports
    assert run["waiting"]["state"] in ("running", "waiting"), run["waiting"]
    assert run["sent"] is True
    assert run["calls"]["receipt"] == 1  # run.dispatch sent the job once, a queue ran it
    assert run["calls"]["create_account"] == 1  # the second start ran nothing


def test_an_event_sent_before_the_wait_is_kept_by_the_engine(run: dict[str, Any]) -> None:
    assert run["early"]["status"] == "complete", run["early"]
    assert run["early"]["output"] == {
        "order": "A-2",
        "state": "shipped",
        "paid": {"amount": 900},
    }


def test_a_step_that_raises_once_is_retried_by_the_engine_across_a_replay(
    run: dict[str, Any],
) -> None:
    assert run["paused"] == "paused"
    assert run["replay"]["status"] == "complete", run["replay"]
    assert run["replay"]["output"] == ["before", "go", "ok", "after"]
    sessions = {a[0] for a in run["asked"]["cf-replay-1"]}
    assert len(sessions) == 2  # run() ran again from the top after the resume
    # the steps before the flaky one kept their results: their functions ran once
    assert run["replay_effects"] == {"before": 1, "flaky": 2, "after": 1}


def test_nondeterminism_fails_the_run_with_the_store_engines_text(
    run: dict[str, Any], tmp_path: Path
) -> None:
    cf_native_flows.EFFECTS.clear()
    store, _, _ = asyncio.run(on_store(tmp_path, "cf_nondet", {}, "nondet-1", {}))
    assert store.state == "failed"
    assert run["nondet"]["status"] == "errored", run["nondet"]
    error = run["nondet"]["error"]
    assert store.error == error["message"]
    assert store.error.startswith("WorkflowNondeterminismError: ")
    assert 'step 1 of this run is "first", but this replay reached "changed"' in store.error


def test_bad_input_gets_one_clear_line(run: dict[str, Any]) -> None:
    kind, text = run["bad"]["event_unknown"]
    assert kind == "WorkflowRunError"
    assert text == (
        "Workflow.send_event: no workflow run 'no-such-run'; check the id "
        "(Workflow.start returns it)"
    )
    kind, text = run["bad"]["event_finished"]
    assert kind == "WorkflowRunError"
    assert "is done; an event can only reach a run that has not finished" in text
    assert "\n" not in text
    assert run["cancel_finished"] is False  # like Queue.cancel: nothing to cancel
    assert run["status_unknown"] is None


def test_a_cancel_terminates_the_instance(run: dict[str, Any]) -> None:
    assert run["cancelled"] is True
    assert run["cancelled_status"]["state"] == "cancelled", run["cancelled_status"]


def test_a_result_past_the_platforms_limit_fails_the_run_with_haze_s_line(
    run: dict[str, Any],
) -> None:
    assert run["big"]["status"] == "errored", run["big"]
    message = run["big"]["error"]["message"]
    assert message.startswith("WorkflowLimitError: "), message
    assert "1048576 bytes" in message and "Cloudflare Workflows" in message
    assert "\n" not in message


def test_a_step_name_the_platform_cannot_hold_is_escaped(run: dict[str, Any]) -> None:
    assert run["names"]["status"] == "complete", run["names"]
    assert run["names"]["output"] == "tab"
