"""The docs' three workflow recipes (``tests/workflows/recipes.py``, unchanged) on haze's
own engine inside a Cloudflare Worker: real Pyodide, every delivery from Miniflare's real
local queue through ``QueueWorker.queue()``, the runs' state in Miniflare's real D1
(wrangler@4.86.0). The payment's webhook comes in through the Worker's ``fetch()`` and
through ``QueueWorker.send_event``. See cf_miniflare_workflows.py for the scenario and
test_cf_miniflare.py for what is real in the harness."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cf_build import haze_wheels, miniflare_node, run_miniflare

# The module fixture's one workerd run has a 600 s budget of its own (a loaded box):
# pytest's 300 s default timeout must not cut it short.
pytestmark = [pytest.mark.pyodide, pytest.mark.timeout(720)]

HERE = Path(__file__).resolve().parent
RECIPES = HERE.parents[2] / "tests" / "workflows" / "recipes.py"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    node = miniflare_node()
    wheels = haze_wheels(tmp_path_factory)
    script = tmp_path_factory.mktemp("cf-mf-wf") / "cf_miniflare_workflows.py"
    script.write_text(
        f"RECIPES_SRC = {RECIPES.read_text()!r}\n"
        + (HERE / "cf_miniflare_workflows.py").read_text()
    )
    result: dict[str, Any] = run_miniflare(node, wheels, script, 600)["python"]
    if "error" in result:
        pytest.fail(f"the scenario raised inside Pyodide:\n{result['error']}")
    return result


def test_the_signup_sleeps_two_days_and_holds_no_delivery(run: dict[str, Any]) -> None:
    # the resume waits past the queue's 12 h cap in hops: the first hop is queued for 12 h
    assert 2 * 86400 - 60 < run["signup_sleeping"]["resume_in"] <= 2 * 86400
    st = run["runs"]["signup"]
    assert st["state"] == "done", st
    assert st["result"] == {"user": 1471, "nudged": True}
    assert [s[0] for s in st["steps"]] == [
        "create-account",
        "welcome-mail",
        "two-days",
        "logged-in?",
        "nudge-mail",
    ]


def test_the_payments_resume_on_their_webhooks(run: dict[str, Any]) -> None:
    assert run["fetch"]["status"] == 202, run["fetch"]
    assert run["fetch"]["body"] == {"run": "mf-pay-1", "event": "paid", "kept": True}
    assert run["send_event"] is True
    one, two = run["runs"]["payment"], run["runs"]["payment2"]
    assert one["state"] == two["state"] == "done", (one, two)
    assert one["result"] == {"order": "A-1", "state": "shipped", "paid": {"amount": 1200}}
    assert two["result"] == {"order": "A-2", "state": "shipped", "paid": {"amount": 900}}


def test_the_import_fans_out_and_joins(run: dict[str, Any]) -> None:
    st = run["runs"]["import"]
    assert st["state"] == "done", st
    assert st["result"] == {"source": "c.csv", "rows": 406, "chunks": 4}


def test_every_side_effect_ran_once(run: dict[str, Any]) -> None:
    calls = run["calls"]
    assert calls == {
        "create_account": 1,
        "mail:welcome": 1,
        "has_logged_in": 1,
        "mail:nudge": 1,
        "create_payment_intent": 2,
        "ship_order": 2,
        "receipt": 2,
        "list_chunks": 1,
        **{f"import:c.csv#{i}": 1 for i in range(4)},
    }, calls
    assert run["d1_keys"] > 20  # the runs' state is in D1's table, through the binding
