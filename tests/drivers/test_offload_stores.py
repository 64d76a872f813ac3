"""The object stores offloaded payloads go to, on their real backends: a local folder
(``file://``) and S3 (``s3://``, on the moto server the sqs tests use). Each keeps
bytes under a key, says None for a missing key, deletes a missing key without error
and lists what is under its prefix with the time each object was written."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from haze.contracts.offload import ObjectStore
from haze.offload import object_store

SQS_SPEC = __import__("runpy").run_path(str(Path(__file__).parent / "sqs_spec.py"))


def _file(tmp_path: Path) -> str:
    return f"file://{tmp_path}/objects"


def _s3(tmp_path: Path) -> str:
    if SQS_SPEC["_MISSING"] is not None:
        pytest.skip(SQS_SPEC["_MISSING"])
    import boto3

    endpoint = SQS_SPEC["endpoint"]()
    bucket = f"haze-store-{os.urandom(5).hex()}"
    client = boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint)
    client.create_bucket(Bucket=bucket)
    # an object beside the prefix and one under a deeper prefix: neither is listed
    client.put_object(Bucket=bucket, Key="elsewhere", Body=b"x")
    client.put_object(Bucket=bucket, Key="jobs/deeper/x", Body=b"x")
    return f"s3://{bucket}/jobs?endpoint_url={endpoint}&region=us-east-1"


@pytest.mark.parametrize("url_of", [_file, _s3], ids=["file", "s3"])
async def test_put_get_delete_and_list(tmp_path: Path, url_of: Callable[[Path], str]) -> None:
    store: Any = object_store(url_of(tmp_path))
    assert isinstance(store, ObjectStore)
    assert [o async for o in store.objects()] == []
    before = time.time() - 5
    await store.put("a1.00ff", b"\x00payload\xff")
    await store.put("b2.00ff", b"{}")
    assert await store.get("a1.00ff") == b"\x00payload\xff"
    assert await store.get("nope") is None
    listed = sorted([o async for o in store.objects()], key=lambda o: o.key)
    assert [o.key for o in listed] == ["a1.00ff", "b2.00ff"]
    assert all(before < o.modified < time.time() + 5 for o in listed)
    await store.delete("a1.00ff")
    await store.delete("a1.00ff")  # again, as after a crash: no error
    assert await store.get("a1.00ff") is None
    assert [o.key async for o in store.objects()] == ["b2.00ff"]


def test_one_store_per_url_and_no_io_to_build_one(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/never-made"
    assert object_store(url) is object_store(url)
    assert not (tmp_path / "never-made").exists()


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("endpoint=http://127.0.0.1:9000", "'endpoint'"),  # a typo: never AWS instead
        ("endpoint_url=minio:9000", "endpoint_url"),
    ],
)
async def test_an_s3_url_with_an_unknown_or_bad_query_stops_the_app_at_start(
    query: str, says: str
) -> None:
    from haze import App, ConfigError, define_queue_config

    to = f"s3://haze-bucket/odd-{os.urandom(3).hex()}?{query}"
    conn = {"driver": "memory", "offload": {"to": to, "over": 10}}
    with pytest.raises(ConfigError, match=f"offload.to: .*{says}") as caught:
        async with App(queue=define_queue_config(default="m", connections={"m": conn})):
            pass
    assert "\n" not in str(caught.value)


async def test_an_s3_store_that_is_down_at_dispatch_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # nothing listens on port 9: botocore's EndpointConnectionError, worded by haze
    pytest.importorskip("boto3")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")  # dummies: no request reaches a server
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    from haze import App, OffloadStoreError, define_job, define_queue_config

    @define_job(name="os_down_big")
    async def big(payload: Any) -> None: ...

    to = "s3://haze-bucket/down?endpoint_url=http://127.0.0.1:9&region=us-east-1"
    conn = {"driver": "memory", "offload": {"to": to, "over": 10}}
    async with App(queue=define_queue_config(default="m", connections={"m": conn})) as app:
        with pytest.raises(OffloadStoreError) as caught:
            await big.dispatch({"blob": "x" * 100})
        assert await app.driver("m").size("default") == 0
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f'connection "m": its offload store {to} could not be written (')
    assert "EndpointConnectionError" in message


async def test_an_s3_store_that_is_down_when_a_worker_reads_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the read a worker makes before the job runs: an unreachable store is an outage
    # (OffloadStoreError, a BackendUnavailableError), not a missing payload (OffloadError)
    pytest.importorskip("boto3")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    from haze import App, BackendUnavailableError, OffloadError, define_queue_config

    to = "s3://haze-bucket/down?endpoint_url=http://127.0.0.1:9&region=us-east-1"
    conn = {"driver": "memory", "offload": {"to": to, "over": 10}}
    ref = {"offloaded": "m1.abc", "size": 3, "sha256": "0" * 64}
    async with App(queue=define_queue_config(default="m", connections={"m": conn})) as app:
        with pytest.raises(BackendUnavailableError) as caught:
            await app.manager.execution.offload.fetch(ref, "m", 'job "os_down_read" (m1)')
    assert not isinstance(caught.value, OffloadError)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(
        f"job \"os_down_read\" (m1): its offloaded payload 'm1.abc' could not be read from "
        f"the offload store {to} ("
    )
    assert "EndpointConnectionError" in message
