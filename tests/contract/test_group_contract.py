"""Tenant groups on every driver: a group (``define_job(group=...)`` or
``.in_group(...)``) is accepted and reaches the job with its message, spelled exactly
as given. What a group does to the claim order is each driver's: turns on the database
driver (``tests/database/test_sql_groups.py``), the MessageGroupId on SQS FIFO, order only
elsewhere (docs/guide.md, "Tenant groups")."""

from __future__ import annotations

from typing import Any

import pytest
from haze import JobContext, define_job

LOG: list[Any] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    LOG.clear()


@define_job(name="grp_record", group=lambda payload: payload["tenant"])
async def grp_record(payload: dict[str, Any], job: JobContext) -> None:
    meta = job.message.meta if job.message is not None else None
    LOG.append((payload["k"], (meta or {}).get("group")))


async def test_a_group_reaches_the_job_on_every_driver(app: Any, done: Any) -> None:
    await grp_record.dispatch({"tenant": "Tenant", "k": 1})
    await grp_record.dispatch({"tenant": "tenant", "k": 2})
    await grp_record.with_({"tenant": "x", "k": 3}).in_group("t-42").dispatch()
    await done()
    assert sorted(LOG) == [(1, "Tenant"), (2, "tenant"), (3, "t-42")]
