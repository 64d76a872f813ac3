"""Poison input reaches failed jobs once, with a message naming the field, and never loops.

Real ``haze queue:work --stop-when-empty`` processes over rows written raw (as a
hand-edited row or another producer's bug would be): SQLite, PostgreSQL and Redis.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rb_harness import envelope, jobs, needs_redis, rig

pytestmark = [pytest.mark.timeout(120)]

#: One wrong-typed value per envelope field.
WRONG = {
    "v": "1",
    "id": 5,
    "job": 7,
    "queue": 12,
    "connection": 3,
    "ts": "now",
    "attempts": "2",
    "tenant": ["acme"],
    "chain": "zzz",
    "chain_id": 1,
    "chain_catch": {"job": "rb_record"},
    "batch_id": 2.5,
    "unique": "zzz",
    "meta": 5,
    "enc": 9,
}

KINDS = [
    "sqlite",
    pytest.param("postgres"),
    pytest.param("redis", marks=needs_redis),
]


@pytest.mark.parametrize("kind", KINDS)
async def test_wrong_typed_envelope_fields_fail_once_naming_the_field(
    request: pytest.FixtureRequest, kind: str, tmp_path: Path
) -> None:
    db_url = request.getfixturevalue("pg_url") if kind == "postgres" else None
    async with rig(kind, tmp_path, db_url) as r:
        for field, value in WRONG.items():
            await r.insert_raw(envelope(**{field: value}))
        # a payload of any JSON type is the job's business: this one runs
        await r.insert_raw(envelope(payload=5))
        await jobs.rb_record.dispatch({"k": "after"}, connection=r.connection)

        code, log = await r.run_until_empty()
        assert code == 0, log
        assert await r.leftover() == [], f"nothing is left to reclaim\n{log}"
        assert r.counts("end") == {"x": 1, "after": 1}, log
        failed = await r.failed()
        assert len(failed) == len(WRONG), [f.exception for f in failed]
        for field in WRONG:
            hits = [f for f in failed if f'field "{field}"' in f.exception]
            assert len(hits) == 1, (field, [f.exception.splitlines()[-1] for f in failed])
            assert "MessageDecodeError" in hits[0].exception
        assert "unexpected error" not in log and "unavailable" not in log, log


@needs_redis
async def test_corrupt_bullmq_counters_go_to_failed_and_spare_other_jobs(
    tmp_path: Path,
) -> None:
    """``atm``/``stc`` hand-edited to values that are not integers: that job is failed
    with the reason, the others run once, and Redis is never taken for unreachable."""
    async with rig("redis", tmp_path) as r:
        client = r.redis()
        await jobs.rb_record.dispatch({"k": "before"}, connection="r")
        bad_atm = await r.insert_raw(envelope(payload={"k": "bad_atm"}))
        await client.hset(f"{r.prefix}:default:{bad_atm}", "atm", "abc")
        await jobs.rb_record.dispatch({"k": "between"}, connection="r")
        bad_stc = await r.insert_raw(envelope(payload={"k": "bad_stc"}))
        await client.hset(f"{r.prefix}:default:{bad_stc}", "stc", "1e400")
        await jobs.rb_record.dispatch({"k": "after"}, connection="r")

        code, log = await r.run_until_empty()
        assert code == 0, log
        assert r.counts("end") == {"before": 1, "between": 1, "after": 1}, log
        assert "bad_atm" not in r.counts("start") and "bad_stc" not in r.counts("start")
        assert await r.leftover() == [], log
        failed = {json.loads(f.body)["payload"]["k"]: f for f in await r.failed()}
        assert set(failed) == {"bad_atm", "bad_stc"}, log
        assert '"atm"' in failed["bad_atm"].exception and "'abc'" in failed["bad_atm"].exception
        assert '"stc"' in failed["bad_stc"].exception and "1e400" in failed["bad_stc"].exception
        for job_id in (bad_atm, bad_stc):
            h = await r.redis_hash(job_id)
            assert h.get("failedReason"), h
            assert int(await client.zscore(f"{r.prefix}:default:failed", job_id) or 0) > 0
        assert "unavailable" not in log and "unexpected error" not in log, log
        # a stalled check over the queue still works (it counts restarts with HINCRBY)
        driver = r.app.driver("r")
        await driver.check_stalled(["default"])  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", KINDS)
async def test_future_versions_and_nan_tokens_fail_naming_the_field_and_never_run(
    request: pytest.FixtureRequest, kind: str, tmp_path: Path
) -> None:
    db_url = request.getfixturevalue("pg_url") if kind == "postgres" else None
    bodies = {
        '"v"': envelope(v=2),
        '"payload.amount"': envelope(payload={"k": "nan", "amount": float("nan")}),
        '"payload[0]"': envelope(payload=[float("inf")]),
        '"payload.k"': envelope(payload={"k": float("-inf")}),
    }
    tokens = ("NaN", "Infinity", "-Infinity")
    assert all(t in b for t, b in zip(tokens, list(bodies.values())[1:], strict=True))
    async with rig(kind, tmp_path, db_url) as r:
        for body in bodies.values():
            await r.insert_raw(body)
        await jobs.rb_record.dispatch({"k": "after"}, connection=r.connection)
        code, log = await r.run_until_empty()
        assert code == 0, log
        assert await r.leftover() == [], log
        assert r.counts("end") == {"after": 1}, log  # none of them ran
        failed = await r.failed()
        assert len(failed) == len(bodies), [f.exception for f in failed]
        for field in bodies:
            hits = [f for f in failed if f"field {field}" in f.exception]
            assert len(hits) == 1, (field, [f.exception.splitlines()[-1] for f in failed])
            assert "MessageDecodeError" in hits[0].exception
