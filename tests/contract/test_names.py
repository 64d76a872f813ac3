"""Queue names on every driver: two names that differ only in case, accents or a
trailing space are two queues (a queue is often a tenant, so sharing one would leak
jobs across tenants)."""

from __future__ import annotations

from typing import Any

import pytest
from haze import Queue, define_job

LOG: list[Any] = []

#: Names a case-, accent- or space-insensitive comparison would fold into one.
LOOKALIKES = ("Tenant", "tenant", "TENANT", "tenant ", "ténant")


@pytest.fixture(autouse=True)
def _reset() -> None:
    LOG.clear()


@define_job(name="nm_record")
async def nm_record(payload: dict[str, Any]) -> None:
    LOG.append(payload["queue"])


async def test_queue_names_differing_in_case_accent_or_space_are_distinct(
    app: Any, driver: Any, done: Any
) -> None:
    if driver.id.startswith("sqs"):
        pytest.skip("an SQS queue name allows only letters, digits, '-' and '_'")
    if not driver.remote:
        pytest.skip("consumed in this process: the queues are never counted")
    for i, name in enumerate(LOOKALIKES):
        for _ in range(i + 1):  # a different count per name: a fold would add them up
            await nm_record.dispatch({"queue": name}, queue=name)
    sizes = {name: await Queue.size(name) for name in LOOKALIKES}
    assert sizes == {name: i + 1 for i, name in enumerate(LOOKALIKES)}
    # A worker on one of them claims only that queue's job.
    reserved = await app.driver("main").reserve(["tenant"], 0)
    assert reserved is not None
    assert reserved.message.payload == {"queue": "tenant"}
    for name in LOOKALIKES:
        await Queue.clear(name)
