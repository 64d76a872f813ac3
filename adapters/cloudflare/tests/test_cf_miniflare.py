"""Harness (b): real local Cloudflare Queues and D1 (Miniflare/workerd, wrangler@4.86.0).

What is real:
- workerd (Miniflare 4, from wrangler 4.86.0 in tests/cloudflare) runs a JS consumer
  Worker bound to a local queue ``haze-jobs`` (``max_retries`` 2, dead-letter queue
  ``haze-dlq``) and a local D1 database. workerd does the batching, ``attempts``
  counting, ``retry({delaySeconds})`` delays, ``delaySeconds`` on send, dead-lettering
  and D1's SQLite (including its limit of 100 bound values per statement).
- haze runs in real Pyodide (the haze and haze_cloudflare wheels) in the Node.js process
  that hosts Miniflare. haze's env holds Miniflare's own Queue producer and D1 bindings
  (``getQueueProducer``/``getD1Database``: proxies to the same local queue and database),
  so every haze ``send``/``sendBatch``, release re-send and D1 statement hits the real
  local services through the binding API.

What is not Cloudflare's: Python Workers do not run in local workerd offline (workerd
fetches its Python runtime bundle from pyodide-capnp-bin.edgeworker.net; this was tried),
so the Worker is JavaScript (tests/cloudflare/consumer-worker.mjs). It relays each
delivery (id, body, attempts) over a service binding to ``haze_cloudflare.QueueWorker``
in Node/Pyodide, whose relay messages record haze's verdict (``ack()`` /
``retry({delaySeconds})``); the JS Worker applies that verdict to the real message.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from cf_build import haze_wheels, miniflare_node, run_miniflare

pytestmark = pytest.mark.pyodide

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    node = miniflare_node()
    wheels = haze_wheels(tmp_path_factory)
    result = run_miniflare(node, wheels, HERE / "cf_miniflare_scenarios.py", 240)
    if "error" in result["python"]:
        pytest.fail(f"the scenario raised inside Pyodide:\n{result['python']['error']}")
    return result


def deliveries(run: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """Every delivery workerd made of the message(s) with this payload key, in order."""
    out = []
    for e in run["events"]:
        for m in e.get("messages", []):
            if m["key"] == key:
                out.append({**m, "t": e["t"], "verdict": e["verdicts"].get(m["id"])})
    return out


def runs(run: dict[str, Any], key: str) -> list[dict[str, Any]]:
    return [r for r in run["python"]["runs"] if r["key"] == key]


def test_success_is_acked_once(run: dict[str, Any]) -> None:
    (d,) = deliveries(run, "ok")
    assert d["attempts"] == 1
    assert d["verdict"] == {"action": "ack"}
    assert [r["attempt"] for r in runs(run, "ok")] == [1]


def test_retries_use_workerd_attempts_and_haze_backoff(run: dict[str, Any]) -> None:
    ds = deliveries(run, "flaky")
    assert len({d["id"] for d in ds}) == 1  # the same Cloudflare message, redelivered
    assert [d["attempts"] for d in ds] == [1, 2, 3]
    assert [d["verdict"] for d in ds] == [{"action": "retry", "delaySeconds": 1}] * 2 + [
        {"action": "ack"}
    ]
    assert [r["attempt"] for r in runs(run, "flaky")] == [1, 2, 3]
    # workerd held each retry for its delaySeconds before redelivering
    assert all(b["t"] - a["t"] >= 0.9 for a, b in itertools.pairwise(ds))


def test_delayed_dispatch_waits_for_delay_seconds(run: dict[str, Any]) -> None:
    (d,) = deliveries(run, "delayed")
    assert d["verdict"] == {"action": "ack"}
    assert d["t"] - run["python"]["dispatched"]["delayed_at"] >= 1.9


def test_release_is_a_new_message_that_keeps_the_attempt(run: dict[str, Any]) -> None:
    ds = deliveries(run, "release")
    first, second, resent = ds
    assert first["id"] == second["id"] != resent["id"]
    assert (first["attempts"], second["attempts"], resent["attempts"]) == (1, 2, 1)
    assert first["verdict"] == {"action": "retry", "delaySeconds": 1}
    assert second["verdict"] == {"action": "ack"}  # released: re-sent, then acked
    assert resent["env_attempts"] == 1
    assert resent["verdict"] == {"action": "ack"}
    # attempt 1 failed, attempt 2 released, and the re-sent message ran as attempt 2
    assert [r["attempt"] for r in runs(run, "release")] == [1, 2, 2]
    assert resent["t"] - second["t"] >= 0.9  # sent with delaySeconds=1


def test_final_failure_lands_in_d1_failed_jobs_and_is_acked(run: dict[str, Any]) -> None:
    ds = deliveries(run, "dead")
    assert [d["attempts"] for d in ds] == [1, 2]
    assert [d["verdict"]["action"] for d in ds] == ["retry", "ack"]
    dead_id = run["python"]["dispatched"]["dead"]
    (f,) = run["python"]["failed"]  # Queue.failed(): read by haze through the binding
    assert f["id"] == dead_id
    assert f["name"] == "cf_mf_dead"
    assert f["payload"] == {"key": "dead"}
    assert f["exception"] == "ValueError: dead dead"
    (row,) = run["d1"]["failed_jobs"]  # read back through Miniflare's D1, not haze
    assert row["uuid"] == dead_id
    assert row["connection"] == "cloudflare"
    assert all(m["body"]["id"] != dead_id for m in run["dlq"])


def test_queue_max_retries_sends_to_the_dead_letter_queue(run: dict[str, Any]) -> None:
    ds = deliveries(run, "many")
    assert [d["attempts"] for d in ds] == [1, 2, 3]  # 1 + max_retries (2)
    assert all(d["verdict"]["action"] == "retry" for d in ds)  # haze had tries left (5)
    many_id = run["python"]["dispatched"]["many"]
    (dead,) = run["dlq"]
    assert dead["body"]["id"] == many_id
    assert dead["body"]["job"] == "cf_mf_many"
    assert [f["id"] for f in run["python"]["failed"]] != [many_id]


def test_bulk_goes_through_send_batch(run: dict[str, Any]) -> None:
    ids = run["python"]["dispatched"]["bulk"]
    for i in range(3):
        (d,) = deliveries(run, f"bulk{i}")
        assert d["verdict"] == {"action": "ack"}
    assert len(ids) == 3


def test_unique_lock_lives_in_d1(run: dict[str, Any]) -> None:
    u1, u2, skipped = run["python"]["dispatched"]["unique"]
    assert u1 == u2
    assert skipped is True
    assert any(
        k.startswith("haze:unique:cf_mf_unique") for k in run["python"]["dispatched"]["locks"]
    )
    assert len(deliveries(run, "u")) == 1
    # Released when the job finished. The workers' per-minute throughput counts stay, and
    # so does the isolate's presence record (the dashboard's Workers page): it is not
    # removed after each batch, it expires after its short lease.
    kept = ("haze:throughput:", "haze:workers:")
    keys = [k["key"] for k in run["d1"]["cache_keys"]]
    assert [k for k in keys if not k.startswith(kept)] == []
    assert any(k.startswith("haze:workers:record:") for k in keys), keys


def test_database_driver_dispatches_through_the_d1_binding(run: dict[str, Any]) -> None:
    d1 = run["python"]["d1_dispatch"]
    assert d1["row_ids"] == d1["ids"]
    assert len(d1["ids"]) == 26
    assert d1["queues"] == ["default"]
    assert d1["reserved"] == []
    assert d1["size"] == 26
    # claimed (UPDATE … RETURNING) and run from D1 through the binding as well
    assert run["python"]["d1_consumed"] == 2
    assert run["python"]["d1_left"] == 24
    assert [r["connection"] for r in runs(run, "d1-0")] == ["database"]
    assert {t["name"] for t in run["d1"]["tables"]} >= {"jobs", "failed_jobs", "haze_cache"}
    assert len(run["d1"]["jobs"]) == 24


def test_no_delivery_was_lost_or_duplicated(run: dict[str, Any]) -> None:
    errors = [e for e in run["events"] if "error" in e]
    assert errors == []
    for key in ("ok", "delayed", "u", "bulk0", "bulk1", "bulk2"):
        assert len(runs(run, key)) == 1, key
