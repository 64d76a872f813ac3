"""The Store contract on Miniflare's REAL D1 binding (wrangler@4.86.0), from real Pyodide.

``tests/contract/test_store_contract.py``'s test functions, unchanged (cut out of the file
with ``ast``), run inside Pyodide against haze's ``database`` store on a ``d1://``
connection whose env holds Miniflare's own D1 binding (``getD1Database``): every
parameter leaves Python as a JS number or string and is bound by workerd's D1, which
binds every JS number as REAL. A statement that lets such a number reach a TEXT column
or a result (``'2.0'`` for a counter) fails a contract test here. The database queue
driver's statements (enqueue, claim, retry, release, fail) then run on D1 too, and the
column types they leave are checked.

The harness is tests/cloudflare/miniflare-harness.mjs (see test_cf_miniflare.py for what
is real in it).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from cf_build import haze_wheels, miniflare_node, run_miniflare

# The module fixture's one workerd run has a 600 s budget of its own (a loaded box):
# pytest's 300 s default timeout must not cut it short.
pytestmark = [pytest.mark.pyodide, pytest.mark.timeout(720)]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
CONTRACT = ROOT / "tests" / "contract" / "test_store_contract.py"


def contract_tests() -> list[str]:
    """The names of the contract's test functions (the Pyodide side cuts them out the
    same way, from the same text, so tracebacks carry the contract file's line numbers)."""
    tree = ast.parse(CONTRACT.read_text())
    return [
        n.name
        for n in tree.body
        if isinstance(n, ast.AsyncFunctionDef) and n.name.startswith("test_")
    ]


TESTS = contract_tests()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    node = miniflare_node()
    wheels = haze_wheels(tmp_path_factory)
    script = tmp_path_factory.mktemp("cf-mf-store") / "cf_miniflare_store.py"
    script.write_text(
        f"CONTRACT_SRC = {CONTRACT.read_text()!r}\nCONTRACT_TESTS = {TESTS!r}\n"
        + (HERE / "cf_miniflare_store.py").read_text()
    )
    result: dict[str, Any] = run_miniflare(node, wheels, script, 600)["python"]
    if "error" in result:
        pytest.fail(f"the run raised inside Pyodide:\n{result['error']}")
    return result


def test_the_contract_was_found() -> None:
    assert "test_increment" in TESTS
    assert "test_concurrent_increments_sum_exactly" in TESTS
    assert len(TESTS) >= 10


@pytest.mark.parametrize("name", TESTS)
def test_store_contract_on_d1(run: dict[str, Any], name: str) -> None:
    outcome = run["contract"][name]
    if not outcome["ok"]:
        pytest.fail(f"{name} failed on D1 (inside Pyodide):\n{outcome['error']}")
    # values are JSON text; a number bound as REAL would have made some 'real'
    assert set(outcome["types"]) <= {"text"}, outcome


def test_counters_are_stored_as_integer_text(run: dict[str, Any]) -> None:
    values = run["contract"]["test_increment"]["values"]
    assert values, run["contract"]["test_increment"]
    assert all("." not in v for v in values), values


def test_queue_driver_columns_keep_their_types_on_d1(run: dict[str, Any]) -> None:
    d = run["driver"]
    assert "error" not in d, d.get("error")
    # a retry uses a try; a release hands it back
    assert d["attempts_seen"] == [1, 2, 2]
    (row,) = d["jobs"]
    assert row == {
        "attempts": "integer",
        "available_at": "real",
        "created_at": "real",
        "reserved_at": "real",
    }
    assert d["left"] == 0
    assert d["failed"] == [{"failed_at": "real"}]


def test_worker_vars_route_the_database_connection_to_the_d1_binding(
    run: dict[str, Any],
) -> None:
    v = run["worker_vars"]
    assert "error" not in v, v.get("error")
    ids = []
    for tag in ("account", "binding"):
        r = v[tag]
        assert r["status"] == 202, r
        assert r["connector"] == "D1Connector"
        ids.append(r["answer"]["id"])
        assert r["answer"]["id"] in r["row_ids"]  # the row is in Miniflare's D1
    assert v["binding"]["row_ids"] == ids
    assert v["sqlite_loaded"] is False  # the SQLite default of config/database.py was not used
    assert v["os_environ"] is False
