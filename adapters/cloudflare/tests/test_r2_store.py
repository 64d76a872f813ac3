"""The ``r2://BINDING/prefix`` store outside a Worker: R2's S3-compatible API through
boto3. Stand-in: moto's S3 server (the one the sqs tests start) plays R2's S3 API, as no
R2 can run here; inside a Worker the store uses the R2 binding, tested on Miniflare's real
R2 in test_cf_miniflare_r2.py."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from haze.driver_api import ConfigError, ObjectStore
from haze.offload import object_store
from haze_cloudflare.r2 import R2ObjectStore


@pytest.fixture(scope="module")
def moto_s3() -> Iterator[str]:
    """A moto server (S3 API) on a free loopback port: its URL."""
    pytest.importorskip("boto3")
    server_mod = pytest.importorskip("moto.server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def moto_bucket(moto_s3: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    import boto3

    # moto takes any key pair: set one, as an R2 API token's would be
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    bucket = f"haze-r2-{os.urandom(5).hex()}"
    boto3.client("s3", region_name="us-east-1", endpoint_url=moto_s3).create_bucket(Bucket=bucket)
    return moto_s3, bucket


async def test_outside_a_worker_it_uses_r2s_s3_api(moto_bucket: tuple[str, str]) -> None:
    endpoint, bucket = moto_bucket
    store: Any = object_store(f"r2://PAYLOADS/jobs?bucket={bucket}&endpoint_url={endpoint}")
    assert isinstance(store, ObjectStore)
    before = time.time() - 5
    await store.put("a1.00ff", b"\x00payload\xff")
    assert await store.get("a1.00ff") == b"\x00payload\xff"
    assert await store.get("nope") is None
    listed = [o async for o in store.objects()]
    assert [o.key for o in listed] == ["a1.00ff"]
    assert before < listed[0].modified < time.time() + 5
    import boto3  # the object is where a Worker's binding of that bucket reads it

    raw = boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint)
    assert raw.get_object(Bucket=bucket, Key="jobs/a1.00ff")["Body"].read() == b"\x00payload\xff"
    await store.delete("a1.00ff")
    await store.delete("a1.00ff")
    assert [o async for o in store.objects()] == []


def test_the_bucket_and_endpoint_come_from_the_binding_and_the_account(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CLOUDFLARE_ACCOUNT_ID", "acc123")
    store = R2ObjectStore("r2://HAZE_PAYLOADS/p")
    assert store.bucket == "haze-payloads"
    s3: Any = store._over_s3()
    assert s3.bucket == "haze-payloads" and s3.prefix == "p/"
    assert s3._client_options["endpoint_url"] == "https://acc123.r2.cloudflarestorage.com"


async def test_outside_a_worker_without_an_account_it_says_what_to_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CLOUDFLARE_ACCOUNT_ID", raising=False)
    store = object_store("r2://NOACCOUNT/p")
    with pytest.raises(ConfigError, match="set CLOUDFLARE_ACCOUNT_ID") as e:
        await store.put("k", b"x")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["my-bucket", "1ST", "a.b"])
def test_a_binding_name_that_is_no_identifier_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="not an R2 binding name") as e:
        object_store(f"r2://{name}/prefix")
    assert "\n" not in str(e.value)
