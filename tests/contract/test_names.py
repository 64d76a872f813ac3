"""Queue names on every driver: two names that differ only in case or accents are two
queues (a queue is often a tenant, so sharing one would leak jobs across tenants); a
name with whitespace at either end is refused (no worker's --queue could name it)."""

from __future__ import annotations

from typing import Any

import pytest
from haze import Queue, define_job

LOG: list[Any] = []

#: Names a case- or accent-insensitive comparison would fold into one.
LOOKALIKES = ("Tenant", "tenant", "TENANT", "ténant", "tenánt")


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
    if driver.id == "cloudflare":
        pytest.skip("Cloudflare counts the whole queue, not each haze queue on it")
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


@pytest.mark.parametrize("bad", ["tenant ", " tenant", "tenant\t", "\ntenant"])
async def test_whitespace_at_either_end_of_a_queue_name_is_refused(
    app: Any, driver: Any, done: Any, bad: str
) -> None:
    # `queue:work --queue "tenant "` trims it and works "tenant": these jobs would wait.
    with pytest.raises(ValueError, match="cannot start or end with whitespace") as info:
        await nm_record.dispatch({"queue": bad}, queue=bad)
    assert "\n" not in str(info.value).replace(repr(bad), "")
    with pytest.raises(ValueError, match="cannot start or end with whitespace"):
        await nm_record.with_({"queue": bad}).on_queue(bad).dispatch()
    with pytest.raises(ValueError, match="cannot start or end with whitespace"):
        Queue.chain([nm_record.with_({"queue": bad})]).on_queue(bad)


async def test_a_comma_in_a_queue_name_is_refused_wherever_a_queue_is_named(
    app: Any, driver: Any, done: Any
) -> None:
    # `queue:work --queue a,b` reads two queues: jobs on "a,b" would wait for ever.
    bad = "emails,high"
    with pytest.raises(ValueError, match="cannot contain a comma") as info:
        await nm_record.dispatch({"queue": bad}, queue=bad)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="cannot contain a comma"):
        await nm_record.with_({"queue": bad}).on_queue(bad).dispatch()
    with pytest.raises(ValueError, match="cannot contain a comma"):
        Queue.chain([nm_record.with_({"queue": bad})]).on_queue(bad)
    with pytest.raises(ValueError, match="cannot contain a comma"):
        Queue.batch([nm_record.with_({"queue": bad})]).on_queue(bad)
    with pytest.raises(ValueError, match="cannot contain a comma"):
        define_job(name="nm_comma", queue=bad)(nm_record.handler)
    await done()
    assert LOG == []


async def test_a_nul_in_a_queue_name_is_refused_wherever_a_queue_is_named(
    app: Any, driver: Any, done: Any
) -> None:
    # No command line can name such a queue (argv cannot hold a NUL) and PostgreSQL
    # refuses the character: SQLite, MariaDB and Redis queued jobs no worker could take.
    bad = "emails\x00"
    with pytest.raises(ValueError, match="cannot contain a NUL") as info:
        await nm_record.dispatch({"queue": bad}, queue=bad)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="cannot contain a NUL"):
        Queue.chain([nm_record.with_({"queue": bad})]).on_queue(bad)
    with pytest.raises(ValueError, match="cannot contain a NUL"):
        Queue.batch([nm_record.with_({"queue": bad})]).on_queue(bad)
    with pytest.raises(ValueError, match="cannot contain a NUL"):
        define_job(name="nm_nul", queue=bad)(nm_record.handler)
    await done()
    assert LOG == []
