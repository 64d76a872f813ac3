"""Offload to R2 through the Worker's R2 binding, on Miniflare's REAL local R2 bucket
(wrangler@4.86.0), from real Pyodide.

A connection with ``"offload": {"to": "r2://R2/haze-payloads"}`` writes a 5 MiB payload
to the bucket through ``env.R2`` (bytes cross into JS as a ``Uint8Array``; they come back
through ``arrayBuffer()``), queues a small message on the real local queue, and the
Worker's ``queue()`` handler reads the object back, runs the job and deletes the object
after the ack. An object changed in the bucket fails its job with "checksum mismatch",
and a failed job keeps its object. The scenario is ``cf_miniflare_r2.py``; the harness is
tests/cloudflare/miniflare-harness.mjs (see test_cf_miniflare.py for what is real in it).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from cf_build import haze_wheels, miniflare_node, run_miniflare

pytestmark = pytest.mark.pyodide

HERE = Path(__file__).resolve().parent
FIVE_MIB = 5 * 1024 * 1024


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    node = miniflare_node()
    wheels = haze_wheels(tmp_path_factory)
    result: dict[str, Any] = run_miniflare(node, wheels, HERE / "cf_miniflare_r2.py", 300)
    python: dict[str, Any] = result["python"]
    if "error" in python:
        pytest.fail(f"the scenario raised inside Pyodide:\n{python['error']}")
    return python


def test_the_r2_store_writes_reads_lists_and_deletes_through_the_binding(
    run: dict[str, Any],
) -> None:
    s = run["store"]
    assert s["is_store"] and s["type"] == "R2ObjectStore"
    assert bytes(s["get"]) == b"\x00\xffbytes"  # binary bytes survive the JS boundary
    assert s["missing"] is None
    assert s["objects"] == ["probe.1"]  # a key under the prefix, without it
    assert s["raw_keys"] == ["haze-payloads/probe.1"]
    assert -5 < s["modified_age"] < 60
    assert s["after_delete"] is None


def test_a_5_mib_payload_round_trips_and_its_object_goes_after_the_ack(
    run: dict[str, Any],
) -> None:
    (big,) = [r for r in run["runs"] if r["key"] == "big"]
    assert big["len"] == FIVE_MIB
    assert big["sha"] == run["big_sha"] == hashlib.sha256(b"x" * FIVE_MIB).hexdigest()
    assert len(run["seen_objects"][0]) == 1  # in R2 while the job ran
    assert run["after_big"] == []  # deleted once acked


def test_a_tampered_object_fails_its_job_with_checksum_mismatch_and_is_kept(
    run: dict[str, Any],
) -> None:
    assert not any(r["key"] == "tampered" for r in run["runs"])  # the job never ran
    tampered = [f for f in run["failed"] if f["name"] == "cf_r2_big"]
    assert len(tampered) == 1, run["failed"]
    assert "checksum mismatch" in tampered[0]["exception"]
    assert run["tampered_key"] in run["after_all"]


def test_a_failed_job_keeps_its_object(run: dict[str, Any]) -> None:
    assert [r["len"] for r in run["runs"] if r["key"] == "fails"] == [200_000]
    assert [f["name"] for f in run["failed"]].count("cf_r2_fails") == 1
    assert len(run["after_all"]) == 2  # the tampered job's object and this one's


def test_miniflare_enforces_the_queue_message_cap(run: dict[str, Any]) -> None:
    cap = run["cap"]
    assert cap["128000"] == "sent", cap
    assert "exceeds limit of 128000" in cap["128001"], cap
    assert "exceeds limit of 128000" in cap["131072"], cap


def test_a_body_between_128000_bytes_and_128_kib_is_offloaded_or_refused_by_haze(
    run: dict[str, Any],
) -> None:
    assert [r["len"] for r in run["runs"] if r["key"] == "mid"] == [129_500]
    refused = run["mid_plain"]
    assert refused.startswith("PayloadTooLargeError"), refused
    assert "128000-byte" in refused, refused
