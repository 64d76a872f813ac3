"""``haze.testing.run_workflow`` runs the docs recipes (``recipes.py``) to their end in a
test: sleeps skipped on a ``WorkflowClock``, events delivered at their wait, waits
without an event timing out, and the steps there to assert on."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import recipes
from haze import WorkflowRunError, workflow
from haze.testing import FakeQueue, WorkflowClock, run_workflow


@pytest.fixture(autouse=True)
def _counts() -> Iterator[None]:
    recipes.reset()
    yield
    recipes.reset()


async def test_the_signup_sleeps_two_days_on_the_test_clock() -> None:
    clock = WorkflowClock(start=1_000_000)
    st = await run_workflow(recipes.signup, email="ada@example.com", clock=clock)
    assert st.state == "done", st.error
    assert st.result == {"user": recipes.create_account("ada@example.com")["id"], "nudged": True}
    assert [(s.name, s.kind, s.state) for s in st.steps] == [
        ("create-account", "step", "done"),
        ("welcome-mail", "step", "done"),
        ("two-days", "sleep", "done"),
        ("logged-in?", "step", "done"),
        ("nudge-mail", "step", "done"),
    ]
    assert clock.slept == 2 * 86400
    assert clock.now() == 1_000_000 + 2 * 86400
    # every replay after the sleep returned the kept results: each effect ran once
    recipes.CALLS["create_account"] -= 1  # the call in the assertion above
    assert recipes.CALLS == {
        "create_account": 1,
        "mail:welcome": 1,
        "has_logged_in": 1,
        "mail:nudge": 1,
    }


async def test_the_payment_ships_on_its_webhook_and_sends_the_receipt_once(
    queue_fake: FakeQueue,
) -> None:
    st = await run_workflow(
        recipes.payment, order_id="A-1", cents=1200, events={"paid": {"amount": 1200}}
    )
    assert st.state == "done", st.error
    assert st.result == {"order": "A-1", "state": "shipped", "paid": {"amount": 1200}}
    assert [(s.name, s.kind) for s in st.steps] == [
        ("intent", "step"),
        ("paid", "event"),
        ("ship", "step"),
        ("dispatch:recipes.receipt", "dispatch"),
    ]
    queue_fake.assert_dispatched(recipes.send_receipt, lambda p: p["order"] == "A-1", times=1)
    assert recipes.CALLS["receipt"] == 1
    assert recipes.CALLS["create_payment_intent"] == 1
    assert recipes.CALLS["ship_order"] == 1
    assert "cancel_order" not in recipes.CALLS


async def test_a_payment_without_its_webhook_times_out_and_cancels() -> None:
    clock = WorkflowClock()
    st = await run_workflow(recipes.payment, order_id="A-2", cents=900, clock=clock)
    assert st.state == "done", st.error
    assert st.result == {"order": "A-2", "state": "cancelled"}
    assert clock.slept == 3 * 86400  # the wait's timeout
    assert recipes.CALLS["cancel_order"] == 1 and "ship_order" not in recipes.CALLS


async def test_the_import_fans_out_and_joins() -> None:
    st = await run_workflow(recipes.import_file, source="c.csv", chunks=5)
    assert st.state == "done", st.error
    assert st.result == {"source": "c.csv", "rows": 510, "chunks": 5}
    assert st.steps[0].name == "list"
    assert sorted(s.name for s in st.steps[1:]) == [f"chunk c.csv#{i}" for i in range(5)]
    assert all(recipes.CALLS[f"import:c.csv#{i}"] == 1 for i in range(5))


@workflow(name="tests.forever")
async def forever(run: Any) -> Any:
    return await run.wait_for_event("never")  # no timeout


async def test_a_wait_that_can_never_end_is_an_assertion_not_a_hang() -> None:
    with pytest.raises(AssertionError, match='waiting for event "never"'):
        await run_workflow(forever)


@workflow(name="tests.breaks")
async def breaks(run: Any) -> Any:
    def boom() -> None:
        raise ValueError("card declined")

    return await run.step("charge", boom, tries=2)


async def test_a_failed_run_is_returned_with_its_error() -> None:
    st = await run_workflow(breaks)
    assert st.state == "failed"
    assert "card declined" in (st.error or "")
    assert st.steps[0].name == "charge" and st.steps[0].attempts == 2


async def test_an_event_for_an_unknown_run_is_one_clear_error() -> None:
    from haze import Workflow

    with pytest.raises(WorkflowRunError, match="no workflow run"):
        await Workflow.send_event("no-such-run", "paid", {})


async def test_run_workflow_keeps_its_clock_on_an_app_whose_connection_is_sync() -> None:
    # The fake queue carries the run, not the sync driver: the sleeps and the wait's
    # timeout pass on the test clock as on any other app.
    from haze import App, define_queue_config

    config = define_queue_config(default="main", connections={"main": {"driver": "sync"}})
    async with App(queue=config):
        clock = WorkflowClock()
        unpaid = await run_workflow(recipes.payment, order_id="S-1", cents=900, clock=clock)
        assert (unpaid.state, unpaid.result) == ("done", {"order": "S-1", "state": "cancelled"})
        assert clock.slept == 3 * 86400
        clock = WorkflowClock()
        signup = await run_workflow(recipes.signup, email="ada@example.com", clock=clock)
        assert signup.state == "done", signup.error
        assert clock.slept == 2 * 86400
