"""Offloaded payloads in Amazon S3 (or any S3 API): ``s3://bucket/prefix``.

boto3 (``haze-jobs[sqs]``) is imported when the store is first used, never at import.
Its calls block, so each runs in a thread. Credentials, region and endpoint come from
boto3's usual sources (``AWS_REGION``, ``AWS_ENDPOINT_URL_S3`` ...); a URL may also
name them: ``s3://bucket/prefix?region=eu-west-1&endpoint_url=http://127.0.0.1:9000``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

from haze._base.deps import require
from haze.contracts.offload import StoredObject

__all__ = ["S3ObjectStore"]


class S3ObjectStore:
    """``s3://bucket/prefix``: one object per key, under the prefix."""

    def __init__(self, url: str) -> None:
        self.url = url
        parts = urlsplit(url)
        self.bucket = parts.netloc
        prefix = parts.path.strip("/")
        self.prefix = f"{prefix}/" if prefix else ""
        query = parse_qs(parts.query)
        self._client_options = {
            name: query.pop(key)[-1]
            for key, name in (("region", "region_name"), ("endpoint_url", "endpoint_url"))
            if key in query
        }
        # a typo (?endpoint=) would otherwise send the payloads to AWS itself
        if query:
            raise ValueError(
                f"{url!r}: unknown query option(s) {', '.join(map(repr, sorted(query)))}; "
                "an s3:// URL takes region and endpoint_url"
            )
        endpoint = urlsplit(self._client_options.get("endpoint_url", "http://x"))
        if endpoint.scheme not in ("http", "https") or not endpoint.netloc:
            raise ValueError(
                f"{url!r}: endpoint_url must be an http:// or https:// URL "
                "(endpoint_url=http://127.0.0.1:9000)"
            )
        self._client: Any = None

    def client(self) -> Any:
        if self._client is None:
            boto3 = require("boto3", what="offloading to s3://", extra="sqs")
            self._client = boto3.client("s3", **self._client_options)
        return self._client

    async def put(self, key: str, data: bytes) -> None:
        client = self.client()
        await asyncio.to_thread(
            client.put_object, Bucket=self.bucket, Key=self.prefix + key, Body=data
        )

    async def get(self, key: str) -> bytes | None:
        return await asyncio.to_thread(self._get, self.prefix + key)

    def _get(self, name: str) -> bytes | None:
        client = self.client()
        try:
            found = client.get_object(Bucket=self.bucket, Key=name)
        except client.exceptions.NoSuchKey:
            return None
        data: bytes = found["Body"].read()
        return data

    async def delete(self, key: str) -> None:
        client = self.client()
        await asyncio.to_thread(client.delete_object, Bucket=self.bucket, Key=self.prefix + key)

    async def objects(self) -> AsyncIterator[StoredObject]:
        pages = await asyncio.to_thread(self._listing)
        for name, modified in pages:
            yield StoredObject(name[len(self.prefix) :], modified)

    def _listing(self) -> list[tuple[str, float]]:
        paginator = self.client().get_paginator("list_objects_v2")
        found: list[tuple[str, float]] = []
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix):
            for item in page.get("Contents", ()):
                name = item["Key"]
                if "/" not in name[len(self.prefix) :]:  # not a deeper prefix's object
                    found.append((name, item["LastModified"].timestamp()))
        return found
