"""Large payloads through an object store (``"offload"`` on a connection), on every
driver: the payload is written to a ``file://`` folder at dispatch, the message carries
its reference, the worker reads it back and checks it, and the object goes after the
job's final ack; a failed job keeps it until its record is forgotten.

The S3 store (moto) and the 1,000-job sweep are in tests/drivers/test_offload_stores.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from haze import (
    JobContext,
    OffloadError,
    OffloadStoreError,
    PayloadTooLargeError,
    Queue,
    define_job,
)
from haze.crypto import generate_key

SEEN: list[Any] = []
OBJECTS_WHILE_RUNNING: list[int] = []
FOLDER: list[Path] = []
FIVE_MIB = 5 * 1024 * 1024


@pytest.fixture(autouse=True)
def _reset(tmp_path: Path) -> None:
    SEEN.clear()
    OBJECTS_WHILE_RUNNING.clear()
    FAIL[:] = [True]
    FOLDER[:] = [tmp_path / "offload"]


def objects() -> list[str]:
    folder = FOLDER[0]
    return sorted(os.listdir(folder)) if folder.exists() else []


def offload(over: str | int = "1KiB") -> dict[str, Any]:
    return {"offload": {"to": f"file://{FOLDER[0]}", "over": over}}


@define_job(name="ol_big")
async def ol_big(payload: dict[str, Any], job: JobContext) -> None:
    OBJECTS_WHILE_RUNNING.append(len(objects()))
    SEEN.append((payload["n"], len(payload["blob"]), payload["blob"][:3]))


FAIL: list[bool] = [True]


@define_job(name="ol_fails", tries=1)
async def ol_fails(payload: dict[str, Any], job: JobContext) -> None:
    SEEN.append(len(payload["blob"]))
    if FAIL[0]:
        raise RuntimeError("told to fail")


@define_job(name="ol_secret", encrypted=True)
async def ol_secret(payload: dict[str, Any], job: JobContext) -> None:
    SEEN.append(payload["blob"][:6])


def blob(size: int, mark: str = "abc") -> str:
    return mark + "x" * (size - len(mark))


async def test_a_5_mib_payload_round_trips_and_its_object_goes_after_the_ack(
    make_app, done
) -> None:
    async with make_app(options=offload()):
        await ol_big.dispatch({"n": 1, "blob": blob(FIVE_MIB)})
        await ol_big.dispatch({"n": 2, "blob": "small"})  # under the threshold: inline
        await done()
    assert sorted(SEEN) == [(1, FIVE_MIB, "abc"), (2, 5, "sma")]
    assert max(OBJECTS_WHILE_RUNNING) >= 1  # it was offloaded, not sent in the message
    assert objects() == []


async def test_bulk_and_chain_links_over_the_threshold_are_offloaded_too(make_app, done) -> None:
    async with make_app(options=offload()):
        await Queue.bulk([ol_big.with_({"n": i, "blob": blob(4096)}) for i in range(3)])
        await Queue.chain(
            [ol_big.with_({"n": 10, "blob": blob(4096)}), ol_big.with_({"n": 11, "blob": blob(8)})]
        ).dispatch()
        await done()
    assert sorted(n for n, _, _ in SEEN) == [0, 1, 2, 10, 11]
    assert objects() == []


async def test_an_encrypted_payload_is_encrypted_before_it_is_written(make_app, done) -> None:
    pytest.importorskip("cryptography", reason="encrypted jobs need haze[encryption]")
    async with make_app(options=offload(), key=generate_key()):
        await ol_secret.dispatch({"blob": blob(4096, "secret")})
        if objects():  # still queued: the object holds ciphertext only
            stored = (FOLDER[0] / objects()[0]).read_bytes()
            assert b"secret" not in stored and b"xxxx" not in stored
        await done()
    assert SEEN == ["secret"]
    assert objects() == []


@pytest.mark.requires("failed_store", "queued")
async def test_a_failed_job_keeps_its_object_a_retry_reads_it_and_forget_deletes_it(
    make_app, done
) -> None:
    async with make_app(options=offload()):
        await ol_fails.dispatch({"blob": blob(4096)})
        await done()
        [record] = await Queue.failed()
        assert len(objects()) == 1  # kept while the job is in failed jobs
        ref = json.loads(record.body)["meta"]["offload"]
        assert ref["offloaded"] == objects()[0] and ref["size"] > 4096
        FAIL[0] = False
        assert await Queue.retry(record.id) == [record.id]
        await done()
        assert SEEN == [4096, 4096]  # the retry read the same object back
        assert objects() == []

        FAIL[0] = True
        await ol_fails.dispatch({"blob": blob(2048)})
        await done()
        [record] = await Queue.failed()
        assert len(objects()) == 1
        assert await Queue.forget(record.id)
        assert objects() == []


async def _tampered(make_app, done, change) -> str:
    async with make_app(options=offload()):
        await ol_big.with_({"n": 1, "blob": blob(4096)}).delay(0.6).dispatch()
        [name] = objects()
        change(FOLDER[0] / name)
        await asyncio.sleep(0.6)
        await done()
        assert SEEN == []  # the job never ran with a wrong payload
        [record] = await Queue.failed()
    return record.exception


@pytest.mark.requires("failed_store", "delay")
async def test_a_tampered_object_fails_the_job_with_checksum_mismatch(make_app, done) -> None:
    def tamper(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[20] ^= 1
        path.write_bytes(bytes(data))

    assert "checksum mismatch" in await _tampered(make_app, done, tamper)


@pytest.mark.requires("failed_store", "delay")
async def test_a_missing_object_fails_the_job_saying_so(make_app, done) -> None:
    assert "is missing from file://" in await _tampered(make_app, done, Path.unlink)


async def test_without_offload_an_oversized_message_names_the_setting(make_app) -> None:
    async with make_app(options={"max_message_size": 2048}):
        with pytest.raises(PayloadTooLargeError, match='"offload"'):
            await ol_big.dispatch({"n": 1, "blob": blob(4096)})


async def test_without_over_the_drivers_cap_decides(make_app, done) -> None:
    async with make_app(
        options={"max_message_size": 2048, "offload": {"to": f"file://{FOLDER[0]}"}}
    ):
        await ol_big.dispatch({"n": 1, "blob": blob(4096)})
        await ol_big.dispatch({"n": 2, "blob": blob(1024)})
        await done()
    assert sorted(n for n, _, _ in SEEN) == [1, 2]
    assert objects() == []


@define_job(name="ol_some_fail", tries=1)
async def ol_some_fail(payload: dict[str, Any], job: JobContext) -> None:
    if payload["n"] % 100 == 7:
        raise RuntimeError(f"job {payload['n']} fails")


async def test_1000_offloaded_jobs_leave_only_the_objects_of_the_failed_ones(
    driver, make_app, done
) -> None:
    if driver.id != "redis":
        pytest.skip("1,000 jobs on one backend (redis); the rest is the same engine path")
    async with make_app(options=offload(200), concurrency=8):
        await Queue.bulk([ol_some_fail.with_({"n": i, "blob": blob(300)}) for i in range(1000)])
        await done(timeout=60)
        failed = await Queue.failed()
    assert sorted(json.loads(f.body)["payload"] is None for f in failed) == [True] * 10
    refs = sorted(json.loads(f.body)["meta"]["offload"]["offloaded"] for f in failed)
    assert objects() == refs  # 990 deleted after their ack, the 10 failed keep theirs


S3: list[Any] = []


@define_job(name="ol_s3")
async def ol_s3(payload: dict[str, Any], job: JobContext) -> None:
    client, bucket = S3
    listed = client.list_objects_v2(Bucket=bucket, Prefix="jobs/").get("Contents", [])
    OBJECTS_WHILE_RUNNING.extend(o["Size"] for o in listed)
    SEEN.append(len(payload["blob"]))


def _s3() -> tuple[Any, str]:
    """A boto3 S3 client on the moto server the sqs tests use, and a fresh bucket."""
    spec = __import__("runpy").run_path(str(Path(__file__).parents[1] / "drivers/sqs_spec.py"))
    if spec["_MISSING"] is not None:
        pytest.skip(spec["_MISSING"])
    import boto3

    endpoint = spec["endpoint"]()
    client = boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint)
    bucket = f"haze-offload-{os.urandom(5).hex()}"
    client.create_bucket(Bucket=bucket)
    return client, f"s3://{bucket}/jobs?endpoint_url={endpoint}&region=us-east-1"


async def test_a_5_mib_payload_round_trips_through_s3(driver, make_app, done) -> None:
    if driver.id not in ("sqs", "redis", "database-postgres"):
        pytest.skip("S3 (moto) on the sqs, redis and postgres drivers")
    client, url = _s3()
    bucket = url.split("/")[2]
    S3[:] = [client, bucket]
    async with make_app(options={"offload": {"to": url}}):  # over: the driver's own cap
        await ol_s3.dispatch({"blob": blob(FIVE_MIB)})
        await done()
    assert SEEN == [FIVE_MIB]
    assert [FIVE_MIB + len('{"blob":""}')] == OBJECTS_WHILE_RUNNING  # it was in S3
    assert client.list_objects_v2(Bucket=bucket).get("KeyCount") == 0


@pytest.mark.requires("queued")
async def test_the_object_stays_until_the_ack_is_recorded(driver, make_app, done) -> None:
    if driver.extra.get("consumer") is not None:
        pytest.skip("a platform consumer acks with one local call: no ack is kept")
    seen_at_failed_acks: list[int] = []
    async with make_app(options=offload()) as app:
        main = app.driver("main")
        for name in ("ack", "ack_many", "ack_and_claim"):
            real = getattr(type(main), name, None)
            if real is None:
                continue

            def wrap(real: Any) -> Any:
                async def call(*args: Any) -> Any:
                    if len(seen_at_failed_acks) < 3:
                        # a crash now redelivers the job: its payload must still be there
                        seen_at_failed_acks.append(len(objects()))
                        raise RuntimeError("injected ack failure")
                    return await real(main, *args)

                return call

            setattr(main, name, wrap(real))
        await ol_big.dispatch({"n": 1, "blob": blob(4096)})
        for _ in range(400):
            if len(seen_at_failed_acks) == 3 and not objects():
                break
            await asyncio.sleep(0.05)
        await done()
    assert seen_at_failed_acks == [1, 1, 1]
    assert objects() == []


ONE_MIB = 1024 * 1024


async def test_a_chain_of_five_1_mib_links_fits_a_128_kb_cap(make_app, done) -> None:
    # the rest of the chain travels in each message (or in its stored tail): a link's
    # payload must go through the store there too, not inline
    async with make_app(
        options={"max_message_size": 128_000, "offload": {"to": f"file://{FOLDER[0]}"}}
    ):
        await Queue.chain(
            [ol_big.with_({"n": i, "blob": blob(ONE_MIB)}) for i in range(5)]
        ).dispatch()
        await done(timeout=30)
    assert sorted(SEEN) == [(i, ONE_MIB, "abc") for i in range(5)]
    assert objects() == []


async def test_batch_callbacks_with_1_mib_payloads_fit_a_128_kb_cap(make_app, done) -> None:
    async with make_app(
        options={"max_message_size": 128_000, "offload": {"to": f"file://{FOLDER[0]}"}}
    ):
        batch = (
            Queue.batch([ol_big.with_({"n": i, "blob": "small"}) for i in range(2)])
            .then(ol_big.with_({"n": 10, "blob": blob(ONE_MIB)}))
            .progress(ol_big.with_({"n": 20, "blob": blob(ONE_MIB)}))
        )
        await batch.dispatch()
        await done(timeout=30)
    assert (
        sorted(SEEN)
        == [(0, 5, "sma"), (1, 5, "sma"), (10, ONE_MIB, "abc")] + [(20, ONE_MIB, "abc")] * 2
    )
    # the callbacks' own copies stay with the batch record (a callback may be dispatched
    # again) until queue:prune-offload; each dispatched message's object is gone
    assert len(objects()) == 2


@define_job(name="ol_debounced", debounce=0.3)
async def ol_debounced(payload: dict[str, Any], job: JobContext) -> None:
    SEEN.append(payload["n"])


@pytest.mark.requires("delay")
async def test_a_debounced_job_superseded_by_a_later_one_has_its_object_deleted(
    make_app, done
) -> None:
    async with make_app(options=offload()):
        for n in range(3):  # one burst: dispatched well inside the 0.3 s window
            await ol_debounced.dispatch({"n": n, "blob": blob(4096)})
        assert len(objects()) == 3
        await asyncio.sleep(0.4)
        await done()
    assert SEEN[-1:] == [2]  # (a slow machine may run an earlier one: not the point here)
    assert objects() == []  # the superseded runs deleted theirs too


@pytest.mark.requires("failed_store", "queued", "delay")
async def test_a_duplicate_retry_that_is_skipped_leaves_the_object_to_the_copy_that_ran(
    make_app, done
) -> None:
    from haze._base.message import decode
    from haze._engine.admin import Admin

    async with make_app(options=offload()) as app:
        await ol_fails.dispatch({"blob": blob(4096)})
        await done()
        [record] = await Queue.failed()
        # a retry that died after queueing its copy, and the retry that took its claim
        # over: two copies of one record; the second, later, is skipped
        message = decode(record.body)
        main = app.driver("main")
        body = Admin._fresh(message, main, "a-retry-that-died", record.failed_at)
        await main.enqueue(body, message, 0.5)
        assert await Queue.retry(record.id) == [record.id]
        await asyncio.sleep(0.6)
        await done()
        assert SEEN == [4096, 4096]  # the first copy ran, and failed again
        [again] = await Queue.failed()
        assert len(objects()) == 1  # its failed record still has its payload
        FAIL[0] = False
        assert await Queue.retry(again.id) == [again.id]
        await done()
    assert SEEN == [4096, 4096, 4096]
    assert objects() == []


@pytest.mark.requires("failed_store", "queued")
async def test_prune_spares_the_objects_of_a_failed_chain_and_a_retry_continues_it(
    make_app, done
) -> None:
    async with make_app(options=offload()) as app:
        big = blob(20_000)
        await Queue.chain(
            [ol_fails.with_({"blob": big}), ol_big.with_({"n": 1, "blob": big})]
        ).dispatch()
        await done()
        [record] = await Queue.failed()
        assert len(objects()) == 2  # the failed job's payload, and its next link's
        assert await app.manager.prune_offload(0, "main") == 0  # both still referenced
        FAIL[0] = False
        assert await Queue.retry(record.id) == [record.id]
        await done()
    assert SEEN == [20_000, 20_000, (1, 20_000, "abc")]
    assert objects() == []


@pytest.mark.requires("failed_store", "queued")
async def test_forgetting_a_failed_chain_link_deletes_the_objects_of_the_links_after_it(
    make_app, done
) -> None:
    async with make_app(options=offload()):
        big = blob(20_000)
        await Queue.chain(
            [ol_fails.with_({"blob": big}), ol_big.with_({"n": 1, "blob": big})]
        ).dispatch()
        await done()
        [record] = await Queue.failed()
        assert len(objects()) == 2
        assert await Queue.forget(record.id)
        assert objects() == []


async def test_a_message_still_too_large_once_offloaded_leaves_no_object(make_app) -> None:
    # the reference alone is over this cap: the dispatch fails, and its object goes too
    async with make_app(
        options={"max_message_size": 120, "offload": {"to": f"file://{FOLDER[0]}"}}
    ):
        with pytest.raises(PayloadTooLargeError, match="even with its payload offloaded"):
            await ol_big.dispatch({"n": 1, "blob": blob(5000)})
        assert objects() == []


@pytest.mark.parametrize("first", [{"n": 1, "blob": "x" * 900}, {"n": 1, "blob": {1, 2}}])
async def test_a_batch_whose_dispatch_raises_leaves_no_callback_object(
    driver, make_app, first
) -> None:
    # the callbacks' payloads go to the store before the jobs are queued; the first job
    # is refused (over the cap though under "over", or not JSON): nothing of the batch
    # runs (on sync neither: every job is checked before the first one runs), so
    # nothing may keep their objects
    async with make_app(options={"max_message_size": 600, **offload("1KiB")}):
        batch = (
            Queue.batch([ol_big.with_(first), ol_big.with_({"n": 2, "blob": "small"})])
            .then(ol_big.with_({"n": 10, "blob": blob(4096)}))
            .catch(ol_big.with_({"n": 11, "blob": blob(4096)}))
        )
        with pytest.raises((PayloadTooLargeError, TypeError)):
            await batch.dispatch()
        assert objects() == []
    assert SEEN == []


async def test_a_store_that_is_down_at_dispatch_is_one_line_naming_it(make_app, tmp_path) -> None:
    # the store's folder cannot be made (a file is in its way): what an unreachable
    # store does to a write; the dispatch names the connection, the store and the cause
    blocker = tmp_path / "blocked"
    blocker.write_text("a file, not a folder")
    url = f"file://{blocker}/offload"
    async with make_app(options={"offload": {"to": url, "over": "1KiB"}}) as app:
        with pytest.raises(OffloadStoreError) as info:
            await ol_big.dispatch({"n": 1, "blob": blob(4096)})
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith(f'connection "main": its offload store {url} ')
        assert "Error" in message  # the cause
        assert not isinstance(info.value, OffloadError)  # not a payload that is lost
        assert await app.driver("main").size("default") == 0
    assert SEEN == []


@define_job(name="ol_outage", tries=1)
async def ol_outage(payload: dict[str, Any], job: JobContext) -> None:
    SEEN.append((job.attempt, len(payload["blob"])))


@pytest.mark.requires("delay")
@pytest.mark.parametrize("outage", ["a file in its way", "its folder gone"])
async def test_a_store_that_is_down_when_the_worker_reads_releases_the_job(
    make_app, done, caplog, outage
) -> None:
    # The object is there, but the store cannot be read: a file is in the way of its
    # folder (what an unreachable store does to a read), or the folder itself is gone (a
    # volume not mounted, a directory removed: not one object missing). An outage, not
    # a lost payload: the job goes back to its queue with its attempt handed back
    # (tries=1 would fail it otherwise), says so in one line naming the store and the
    # job, and runs once the store is back.
    folder = FOLDER[0]
    aside = folder.with_name("offload-aside")
    async with make_app(options=offload()):
        job_id = (await ol_outage.with_({"blob": blob(4096)}).delay(0.6).dispatch()).id
        [name] = objects()
        with caplog.at_level(logging.WARNING, logger="haze"):
            folder.rename(aside)
            if outage == "a file in its way":
                folder.write_text("a file, not a folder")
            deadline = asyncio.get_running_loop().time() + 20
            while "could not be read" not in caplog.text:
                assert asyncio.get_running_loop().time() < deadline, caplog.text
                assert await Queue.failed() == []
                await asyncio.sleep(0.05)
            folder.unlink(missing_ok=True)
            aside.rename(folder)
            await done()
        assert SEEN == [(1, 4096)]  # once, as its first attempt, with its payload
        [line] = [r.getMessage() for r in caplog.records if "could not be read" in r.getMessage()]
        assert "\n" not in line and "Traceback" not in caplog.text
        assert f"file://{folder}" in line and '"ol_outage"' in line and job_id in line
        assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
        assert await Queue.failed() == []
        assert name not in objects()  # deleted after the ack, as always
