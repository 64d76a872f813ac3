"""Harness (a): the Cloudflare entry inside REAL Pyodide (npm ``pyodide`` under Node.js).

What is real: Pyodide (CPython 3.14 on WebAssembly, offline: ``tests/pyodide/run.mjs``
blocks CDN fetches while loading), the ``haze``, ``haze_cloudflare`` and app wheels
installed with ``pyodide.loadPackage``, the generated entry (``class Default(QueueWorker)``
over the app root, as ``dist/cloudflare/src/entry.py``), Pyodide's JS boundary (JS objects
as message bodies, ``to_js``/``to_py``, JS ``null`` → ``jsnull``, keyword arguments to a
JS function arriving as an options object) and the absence of threads.

What is a stand-in: Cloudflare itself. ``cf_queue_sim.js`` is a JavaScript model of the
documented Queue binding (``send``/``sendBatch``), ``MessageBatch``/``Message``
(``ack``, ``retry({delaySeconds})``, ``attempts``, implicit ack, ``max_retries`` and a
dead-letter queue) and Workers KV; one simulated second lasts 10 ms. Real queue
semantics are checked against Miniflare in test_cf_miniflare.py.

The scenarios run in one Pyodide session (booting costs seconds); each test checks one
scenario's outcome. They are the contract checks that make sense on this driver:
success, retries with backoff, release without using a try, final failure into the
failed store (and ``Queue.retry``), dead-lettering, delay/size limits, bulk, chains,
batches, unique jobs, middleware releases, undecodable messages and HTTP dispatch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cf_build import haze_wheels, pure_wheel, pyodide_node, run_pyodide

pytestmark = pytest.mark.pyodide

HERE = Path(__file__).resolve().parent


def _app_wheel(out: Path) -> Path:
    """A wheel of tests/cf_pyo_app (config, jobs and the generated entry)."""
    name = "cf_pyo_app"
    src = HERE / name
    files = {
        f"{name}/{path.relative_to(src).as_posix()}": path.read_bytes()
        for path in sorted(src.rglob("*.py"))
    }
    return pure_wheel(out, name, files)


@pytest.fixture(scope="module")
def node() -> str:
    return pyodide_node()


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return [*haze_wheels(tmp_path_factory), _app_wheel(tmp_path_factory.mktemp("cf-app"))]


@pytest.fixture(scope="module")
def scenarios(
    node: str, wheels: list[Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    script = tmp_path_factory.mktemp("cf-pyodide") / "cf_scenarios.py"
    sim = (HERE / "cf_queue_sim.js").read_text()
    script.write_text(
        f"SIM_JS = {json.dumps(sim)}\n" + (HERE / "cf_pyodide_scenarios.py").read_text()
    )
    result: dict[str, Any] = run_pyodide(node, script, 180, wheels)
    return result


def outcome(scenarios: dict[str, Any], name: str) -> Any:
    entry = scenarios[name]
    if not entry["ok"]:
        pytest.fail(f"scenario {name} raised inside Pyodide:\n{entry['error']}")
    return entry["value"]


def calls_by_message(calls: list[list[Any]]) -> dict[str, list[list[Any]]]:
    out: dict[str, list[list[Any]]] = {}
    for c in calls:
        out.setdefault(c[0], []).append(c[1:])
    return out


def test_loads_in_pyodide_without_threads(scenarios: dict[str, Any]) -> None:
    env = outcome(scenarios, "environment")
    assert env["platform"] == "emscripten"
    assert "site-packages" in env["haze_file"]
    assert "site-packages" in env["adapter_file"]
    # no `workers` module outside Cloudflare: the local base class stands in for it
    assert "haze_cloudflare.worker._Base" in env["worker_bases"]
    assert env["guard_probe"], "the thread guard did not see a deliberate Thread.start()"
    assert env["thread_starts"] == []
    assert env["threads"] == ["MainThread"]


def test_success_acks_and_bodies_cross_the_js_boundary(scenarios: dict[str, Any]) -> None:
    v = outcome(scenarios, "success_and_boundary")
    (send,) = v["sends"]
    assert send["via"] == "send"
    assert send["contentType"] == "json"
    assert send["delaySeconds"] is None
    body = send["body"]  # what Cloudflare stored: a JSON object, nulls kept
    assert body["id"] == v["id"]
    assert body["job"] == "cf_pyo_ok"
    assert body["payload"] == {
        "key": "a",
        "none": None,
        "nested": {"l": [1, None, 2.5], "s": "é", "t": True},
    }
    assert v["calls"] == [[send["id"], "ack"]]
    (run,) = v["runs"]
    assert run[:3] == ["ok", "a", 1]
    assert run[3]["none"] is None
    assert run[3]["nested"]["l"] == [1, None, 2.5]
    assert v["outcomes"] == ["done"]
    assert v["size"] == 0


def test_retry_uses_haze_backoff_as_delay_seconds(scenarios: dict[str, Any]) -> None:
    v = outcome(scenarios, "retry_backoff")
    assert [r[2] for r in v["runs"]] == [1, 2, 3]  # Cloudflare's attempts counter
    (msg_calls,) = calls_by_message(v["calls"]).values()
    assert msg_calls == [["retry", 2], ["retry", 5], ["ack"]]  # backoff=[2, 5]
    assert v["size"] == 0


def test_release_is_resent_as_a_new_message_without_using_a_try(scenarios: dict[str, Any]) -> None:
    v = outcome(scenarios, "release")
    # attempt 1 fails (retry), attempt 2 releases, the re-sent message runs as attempt 2
    assert [r[2] for r in v["runs"]] == [1, 2, 2]
    first, resent = v["sends"]
    assert resent["via"] == "send"
    assert resent["delaySeconds"] == 3
    assert resent["body"]["id"] == v["id"]
    assert resent["body"]["attempts"] == 1
    by_msg = calls_by_message(v["calls"])
    assert by_msg[first["id"]] == [["retry", 2], ["ack"]]
    assert by_msg[resent["id"]] == [["ack"]]
    assert v["size"] == 0


def test_final_failure_goes_to_failed_store_then_ack(scenarios: dict[str, Any]) -> None:
    v = outcome(scenarios, "final_failure")
    assert [r[2] for r in v["runs"]] == [1, 2]
    (msg_calls,) = calls_by_message(v["calls"]).values()
    assert msg_calls == [["retry", 1], ["ack"]]
    (failed,) = v["failed"]
    assert failed["id"] == v["id"]
    assert failed["name"] == "cf_pyo_dead"
    assert failed["payload"] == {"key": "d"}
    assert failed["connection"] == "cloudflare"
    assert "dead d" in failed["exception"]
    assert v["failed_calls"] == [["d", "dead d", 2]]
    assert v["outcomes"] == ["failed"]
    # Queue.retry re-sends it through the binding, with its tries reset
    assert v["retried"] == [v["id"]]
    assert v["after_retry"] == []
    assert v["resent"]["body"]["id"] == v["id"]
    assert "attempts" not in v["resent"]["body"]


def test_queue_max_retries_dead_letters_before_haze_gives_up(scenarios: dict[str, Any]) -> None:
    v = outcome(scenarios, "dead_letter")
    # tries=5 but the queue allows one retry: Cloudflare moves it to the DLQ
    assert [r[2] for r in v["runs"]] == [1, 2]
    assert len(v["dead"]) == 1
    (dlq,) = v["dlq"]
    assert dlq["via"] == "dlq"
    assert dlq["body"]["id"] == v["id"]
    assert v["failed"] == []


def test_delay_and_size_limits(scenarios: dict[str, Any]) -> None:
    v = outcome(scenarios, "limits")
    assert [s["delaySeconds"] for s in v["sends"]] == [30, 43200]
    assert "12-hour (43200 s) limit" in v["errors"]["delay"]
    assert "128000-byte limit" in v["errors"]["size"]


def test_bulk_uses_send_batch(scenarios: dict[str, Any]) -> None:
    v = outcome(scenarios, "bulk")
    assert v["batch_calls"] == [100, 20]
    assert v["vias"] == ["sendBatch"]
    assert v["body_ids"] == v["ids"]
    assert sorted(v["ran"]) == sorted(f"b{i}" for i in range(120))
    assert v["size"] == 0


def test_chain_runs_in_order(scenarios: dict[str, Any]) -> None:
    v = outcome(scenarios, "chain")
    assert v["ran"] == ["c1", "c2", "c3"]
    assert v["chain_id"]
    assert v["sends"] == 3  # each next link is sent through the binding


def test_batch_callbacks_run_once(scenarios: dict[str, Any]) -> None:
    v = outcome(scenarios, "batch")
    assert sorted(v["ran"]) == ["finally", "then", "x0", "x1", "x2"]
    assert v["finished"]
    assert v["processed"] == 3
    assert v["failed"] == 0
    assert v["progress"] == 100


def test_unique_job_lock_in_kv(scenarios: dict[str, Any]) -> None:
    v = outcome(scenarios, "unique")
    assert v["second"] == v["first"]
    assert v["skipped"] is True
    assert v["third"] != v["first"]  # the lock was released after the run
    assert [r[1] for r in v["runs"]] == ["u", "u"]


def test_kv_store_logs_the_non_atomic_warning(scenarios: dict[str, Any]) -> None:
    outcome(scenarios, "unique")
    warnings = outcome(scenarios, "environment")["warnings"]
    kv = [w for w in warnings if w.startswith("haze.stores.kv")]
    assert len(kv) == 1
    assert "not atomic" in kv[0]
    assert "KV" in kv[0]


def test_middleware_release_is_resent(scenarios: dict[str, Any]) -> None:
    v = outcome(scenarios, "rate_limited_release")
    assert len(v["runs"]) == 1  # max=1 per hour
    assert sorted(v["outcomes"]) == ["done", "released"]
    first, second, resent = v["sends"]
    assert 0 < resent["delaySeconds"] <= 3600
    released_id = resent["body"]["id"]
    assert released_id in v["ids"]
    assert "attempts" not in resent["body"]
    by_msg = calls_by_message(v["calls"])
    assert by_msg[first["id"]] == [["ack"]]
    assert by_msg[second["id"]] == [["ack"]]
    assert v["size"] == 1


def test_kv_lease_renewal_checks_the_owner(scenarios: dict[str, Any]) -> None:
    v = outcome(scenarios, "kv_lease")
    assert v["taken"] is True
    assert v["other"] is False
    assert 0 < v["ttl_after_other"] <= 30, "another owner's touch left the expiry alone"
    assert v["own"] is True
    assert 590 < v["ttl_after_own"] <= 600
    assert v["absent"] is False
    assert v["holder"] == "run-1"


def test_kv_store_lists_the_first_jobs_of_a_batch(scenarios: dict[str, Any]) -> None:
    v = outcome(scenarios, "kv_batch_list")
    assert v["jobs"] == 3
    assert v["listed"] == ["j1", "j2", None]


def test_undecodable_messages_are_failed_and_acked(scenarios: dict[str, Any]) -> None:
    v = outcome(scenarios, "undecodable")
    assert v["outcomes"] == ["failed", "failed"]
    by_msg = calls_by_message(v["calls"])
    assert by_msg[v["bad"]] == [["ack"]]
    assert by_msg[v["unknown"]] == [["ack"]]
    excs = v["failed"]
    assert "UnknownJobError" in excs["nobody-1"]
    assert any("MessageDecodeError" in e for k, e in excs.items() if k != "nobody-1")


def test_a_body_that_is_not_json_is_failed_with_the_reason_and_acked(
    scenarios: dict[str, Any],
) -> None:
    v = outcome(scenarios, "not_json_bodies")
    by_msg = calls_by_message(v["calls"])
    assert by_msg[v["date"]] == [["ack"]]  # not retried into the dead-letter queue
    assert by_msg[v["nested"]] == [["ack"]]
    assert by_msg[v["dated"]] == [["ack"]]
    assert sorted(v["outcomes"]) == ["done", "failed", "failed"]
    assert v["dead"] == []
    assert v["size"] == 0
    assert len(v["failed"]) == 2
    for f in v["failed"]:
        assert "MessageDecodeError" in f["exception"]
        assert "RecursionError" not in f["exception"]
    date, regexp = sorted(v["failed"], key=lambda f: "RegExp" in f["exception"])
    # workerd hands a Date over as its ISO string: alone, that is not a JSON body
    assert "not valid JSON" in date["exception"] and "1970-01-01T00:00:00.000Z" in date["exception"]
    assert "holds a JavaScript RegExp" in regexp["exception"]
    # ... and inside a payload it is a string the job receives (haze cannot tell)
    assert v["dated_runs"] == [{"key": "dated", "when": "1970-01-01T00:00:00.000Z"}]


def test_env_reads_the_worker_vars_of_the_invocation_only(scenarios: dict[str, Any]) -> None:
    v = outcome(scenarios, "worker_vars")
    assert v["status"] == 202
    # config/queue.py's env("QUEUE_CONNECTION", "memory") saw the Worker var at boot
    assert v["default"] == "cloudflare"
    assert v["sends_after_fetch"] == 1  # the fetch() dispatch went to the Queue binding
    # two invocations at once, with different envs: each job saw its own vars (the
    # fetch()-dispatched message ran under env A, the other under env B)
    assert v["seen"] == [["b", "b", None], ["http", "a", "1"]]
    # outside an invocation nothing is left behind, and os.environ was never written
    assert v["outside"] == [None, "unset"]
    assert v["os_environ"] is False


def test_fetch_dispatch_endpoint(scenarios: dict[str, Any]) -> None:
    v = outcome(scenarios, "fetch_dispatch")
    status, body = v["ok"]
    # the same answers as the Lambda, server and Vercel entrypoints (http_dispatch)
    assert status == 202
    assert body["skipped"] is False
    assert body["job"] == "cf_pyo_ok"
    assert body["id"]
    first, signed = v["sends"]  # the bearer and the signed dispatch
    assert first["body"]["id"] == body["id"]
    assert first["delaySeconds"] == 5
    assert signed["body"]["payload"] == {"key": "http"}
    # signed: X-Haze-Timestamp within 5 minutes, HMAC over "{timestamp}.{body}"
    assert v["signed"][:2] == [202, 401]
    assert "X-Haze-Timestamp" in v["signed"][2]
    # refused from the headers: the request's body was never read
    assert [v["wrong"], v["missing"]] == [403, 401]
    assert v["unread"] == [False, False]
    assert v["signed_untimed"][0] == 401
    assert "X-Haze-Timestamp" in v["signed_untimed"][1]
    assert v["too_deep"][0] == 400
    assert "nested too deeply" in v["too_deep"][1]
    assert v["wrong"] == 403
    assert v["missing"] == 401
    assert v["get"] == 405
    assert v["unknown"][0] == 404
    assert "cf_pyo_nope" in v["unknown"][1]["error"]
    assert v["disabled"][0] == 500
    assert "HAZE_HTTP_SECRET" in v["disabled"][1]["error"]
    assert v["sends_disabled"] == []
