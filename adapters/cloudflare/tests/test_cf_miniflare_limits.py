"""D1's size limit on Miniflare's REAL D1 binding (wrangler@4.86.0), from real Pyodide.

D1 refuses a string, BLOB or table row over 2,000,000 bytes (SQLITE_TOOBIG). The
``database`` driver on a ``d1://`` connection therefore caps a message below that by
default (room left for the row's other columns and a failed job's exception text), and
refuses a larger one at dispatch with ``PayloadTooLargeError`` naming the job, the size
and the cap, instead of D1's raw error. The scenario is ``cf_miniflare_limits.py``; the
harness is tests/cloudflare/miniflare-harness.mjs (see test_cf_miniflare.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from cf_build import haze_wheels, miniflare_node, run_miniflare
from haze.drivers.sql import D1_MAX_MESSAGE_SIZE, D1_ROW_LIMIT

pytestmark = pytest.mark.pyodide

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    node = miniflare_node()
    wheels = haze_wheels(tmp_path_factory)
    result: dict[str, Any] = run_miniflare(node, wheels, HERE / "cf_miniflare_limits.py", 300)
    python: dict[str, Any] = result["python"]
    if "error" in python:
        pytest.fail(f"the scenario raised inside Pyodide:\n{python['error']}")
    return python


def test_d1_refuses_an_oversized_row_with_its_own_raw_error(run: dict[str, Any]) -> None:
    probe = run["probe"]
    assert probe[str(D1_MAX_MESSAGE_SIZE)] == "stored"
    # Cloudflare documents 2,000,000 bytes; Miniflare's workerd lets a little more through
    assert "SQLITE_TOOBIG" in probe["3000000"]


def test_the_default_cap_on_d1_is_what_a_row_holds(run: dict[str, Any]) -> None:
    assert run["cap"] == D1_MAX_MESSAGE_SIZE < D1_ROW_LIMIT
    assert run["at_cap_rows"] == 1
    assert D1_MAX_MESSAGE_SIZE - 8 <= run["at_cap_len"] <= D1_MAX_MESSAGE_SIZE
    assert run["at_cap_failed"] is True  # its failed_jobs row fits too, exception and all


@pytest.mark.parametrize("key", ["over", "far_over"])
def test_a_larger_payload_is_refused_at_dispatch(run: dict[str, Any], key: str) -> None:
    refused = run[key]
    match = re.match(
        r'job "cf_limits_big": the message is (\d+) bytes, over the (\d+)-byte', refused
    )
    assert match, refused
    assert int(match[1]) > D1_MAX_MESSAGE_SIZE
    assert int(match[2]) == D1_MAX_MESSAGE_SIZE
    assert run[f"{key}_rows"] == 0
