"""Contract: Queue.fake() for chains and batches (seed 测试; SPEC §11).

The fake replaces every connection, so these run once per driver to prove the
driver under the fake does not matter (sync does not run inline under the fake).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from haze import Batch, JobContext, Queue, define_job
from haze.testing import FakeQueue

LOG: list[tuple[str, Any]] = []


@define_job(name="fo_process")
async def fo_process(payload: Any) -> None:
    LOG.append(("fo_process", payload))


@define_job(name="fo_publish")
async def fo_publish(payload: Any) -> None:
    LOG.append(("fo_publish", payload))


@define_job(name="fo_notify")
async def fo_notify(payload: Any) -> None:
    LOG.append(("fo_notify", payload))


@define_job(name="fo_bad")
async def fo_bad(payload: Any) -> None:
    LOG.append(("fo_bad", payload))
    raise RuntimeError("fo boom")


@define_job(name="fo_cleanup")
async def fo_cleanup(payload: Any) -> None:
    LOG.append(("fo_cleanup", payload))


@define_job(name="fo_grow")
async def fo_grow(payload: Any, job: JobContext) -> None:
    LOG.append(("fo_grow", payload))
    job.prepend_to_chain(fo_notify.with_("prepended"))


@pytest.fixture(autouse=True)
def _reset() -> None:
    LOG.clear()


@pytest.fixture
def fake(app: Any) -> Iterator[FakeQueue]:
    f = Queue.fake()
    try:
        yield f
    finally:
        Queue.restore()


def dispatched_names(fake: FakeQueue) -> list[str]:
    return [r.name for r in fake.dispatched]


# ---------------------------------------------------------------------------- chains


async def test_assert_chained_compares_names_and_with_payloads(fake):
    await Queue.chain([fo_process.with_({"id": 1}), fo_publish.with_({"id": 1})]).dispatch()
    fake.assert_chained([fo_process, fo_publish])
    fake.assert_chained(["fo_process", "fo_publish"])
    fake.assert_chained([fo_process, fo_publish.with_({"id": 1})])
    fake.assert_chained([fo_process.with_({"id": 1}), fo_publish.with_({"id": 1})])
    with pytest.raises(AssertionError):
        fake.assert_chained([fo_process, fo_publish.with_({"id": 2})])  # payload differs
    with pytest.raises(AssertionError):
        fake.assert_chained([fo_publish, fo_process])  # order matters
    with pytest.raises(AssertionError):
        fake.assert_chained([fo_process])  # length matters
    with pytest.raises(AssertionError):
        fake.assert_chained([fo_process, fo_publish, fo_notify])


async def test_assert_chained_with_nothing_chained_raises(fake):
    await fo_process.dispatch(1)
    with pytest.raises(AssertionError):
        fake.assert_chained([fo_process])


async def test_chain_is_recorded_not_run(fake):
    res = await Queue.chain([fo_process.with_(1), fo_publish.with_(2)]).dispatch()
    assert isinstance(res.chain_id, str) and res.chain_id
    assert LOG == []
    assert dispatched_names(fake) == ["fo_process"]  # only the first link is queued
    assert fake.dispatched[0].message.chain_id == res.chain_id


async def test_drain_records_the_next_link_then_drain_again(fake):
    await Queue.chain([fo_process.with_(1), fo_publish.with_(2), fo_notify.with_(3)]).dispatch()
    assert await fake.drain() == 1
    assert LOG == [("fo_process", 1)]
    assert dispatched_names(fake) == ["fo_process", "fo_publish"]  # recorded, not run
    assert fake.dispatched[1].payload == 2
    assert fake.dispatched[1].message.chain_id == fake.dispatched[0].message.chain_id
    await fake.drain()
    assert LOG == [("fo_process", 1), ("fo_publish", 2)]
    await fake.drain()
    assert LOG == [("fo_process", 1), ("fo_publish", 2), ("fo_notify", 3)]
    assert await fake.drain() == 0
    fake.assert_dispatched(fo_notify, lambda p: p == 3, times=1)


async def test_drain_failed_link_records_the_catch_job_and_drops_the_rest(fake):
    await (
        Queue.chain([fo_bad.with_(1), fo_publish.with_(2)])
        .catch(fo_cleanup.with_({"id": 9}))
        .dispatch()
    )
    await fake.drain()
    assert LOG == [("fo_bad", 1)]
    fake.assert_not_dispatched(fo_publish)
    fake.assert_dispatched(fo_cleanup, lambda p: p == {"id": 9}, times=1)
    assert [f.name for f in fake.failed] == ["fo_bad"]
    await fake.drain()
    assert LOG == [("fo_bad", 1), ("fo_cleanup", {"id": 9})]


@pytest.mark.requires("local_callbacks")
async def test_drain_failed_link_calls_a_function_catch(fake):
    got: list[BaseException] = []
    await Queue.chain([fo_bad.with_(1), fo_publish.with_(2)]).catch(got.append).dispatch()
    await fake.drain()
    assert [str(e) for e in got] == ["fo boom"]


async def test_chain_options_are_recorded(fake):
    await (
        Queue.chain([fo_process.with_(1), fo_publish.with_(2).on_queue("q2")])
        .on_queue("q1")
        .dispatch()
    )
    assert fake.dispatched[0].queue == "q1"
    await fake.drain()
    assert fake.dispatched[1].queue == "q2"


async def test_prepend_to_chain_is_recorded_by_drain(fake):
    await Queue.chain([fo_grow.with_(1), fo_publish.with_(2)]).dispatch()
    await fake.drain()
    assert dispatched_names(fake) == ["fo_grow", "fo_notify"]
    await fake.drain()
    await fake.drain()
    assert [x[0] for x in LOG] == ["fo_grow", "fo_notify", "fo_publish"]


# ---------------------------------------------------------------------------- batches


async def test_assert_batched_with_a_predicate(fake):
    batch = (
        await Queue.batch([fo_process.with_({"f": "a.csv"}), fo_process.with_({"f": "b.csv"})])
        .name("import")
        .then(fo_notify.with_(1))
        .dispatch()
    )
    assert isinstance(batch, Batch) and isinstance(batch.id, str)
    assert batch.name == "import" and batch.total == 2
    fake.assert_batched(lambda b: b.name == "import" and len(b.jobs) == 2)
    with pytest.raises(AssertionError):
        fake.assert_batched(lambda b: b.name == "export")
    with pytest.raises(AssertionError):
        fake.assert_batched(lambda b: len(b.jobs) == 3)
    fake.assert_batch_count(1)
    with pytest.raises(AssertionError):
        fake.assert_batch_count(2)
    with pytest.raises(AssertionError):
        fake.assert_nothing_batched()


async def test_batched_jobs_are_recorded_not_run(fake):
    await (
        Queue.batch([fo_process.with_(1), fo_publish.with_(2)]).then(fo_notify.with_(3)).dispatch()
    )
    assert len(fake.batches) == 1
    rec = fake.batches[0]
    assert [j.job.name for j in rec.jobs] == ["fo_process", "fo_publish"]
    assert [j.payload for j in rec.jobs] == [1, 2]
    assert fake.dispatched == []
    assert await fake.drain() == 0
    assert LOG == []
    fake.assert_not_dispatched(fo_notify)


async def test_batches_with_chains_are_recorded(fake):
    await (
        Queue.batch([[fo_process.with_(1), fo_publish.with_(1)], fo_notify.with_(2)])
        .name("mixed")
        .dispatch()
    )
    fake.assert_batched(lambda b: b.name == "mixed" and len(b.jobs) == 2)
    assert fake.batches[0].batch.total == 3


async def test_batch_count_and_nothing_batched(fake):
    fake.assert_nothing_batched()
    fake.assert_batch_count(0)
    await Queue.batch([fo_process.with_(1)]).dispatch()
    await Queue.batch([fo_process.with_(2)]).name("second").dispatch()
    fake.assert_batch_count(2)
    fake.assert_batched(lambda b: b.name == "second")
    fake.assert_nothing_dispatched()


async def test_restore_goes_back_to_the_real_connection(app, done):
    fake = Queue.fake()
    try:
        await Queue.chain([fo_process.with_(1)]).dispatch()
        await Queue.batch([fo_publish.with_(2)]).dispatch()
        assert LOG == []
    finally:
        Queue.restore()
    fake.assert_batch_count(1)
    await Queue.chain([fo_process.with_(3), fo_publish.with_(4)]).dispatch()
    batch = await Queue.batch([fo_notify.with_(5)]).dispatch()
    await done()
    assert sorted(LOG) == [("fo_notify", 5), ("fo_process", 3), ("fo_publish", 4)]
    assert (await batch.fresh()).finished
    assert len(fake.batches) == 1 and len(fake.chains) == 1


async def test_batch_inside_a_chain_is_recorded_in_fake_batches_when_reached(fake):
    await Queue.chain(
        [
            fo_process.with_(1),
            Queue.batch([fo_publish.with_(2), fo_publish.with_(3)]).name("inner"),
            fo_notify.with_(4),
        ]
    ).dispatch()
    fake.assert_nothing_batched()  # not reached yet
    await fake.drain()
    assert LOG == [("fo_process", 1)]
    fake.assert_batched(lambda b: b.name == "inner" and len(b.jobs) == 2)
    assert await fake.drain() == 0  # batched jobs are recorded, not run
    assert LOG == [("fo_process", 1)]
    fake.assert_not_dispatched(fo_publish)


async def test_chain_starting_with_a_batch_records_the_batch(fake):
    res = await Queue.chain(
        [Queue.batch([fo_publish.with_(1)]).name("first"), fo_notify.with_(2)]
    ).dispatch()
    assert res.chain_id
    fake.assert_batch_count(1)
    fake.assert_batched(lambda b: b.name == "first")
    assert fake.dispatched == [] and LOG == []
