"""Offloaded payloads in Cloudflare R2: ``r2://BINDING/prefix``.

Inside a Worker (the bound env has ``BINDING``) the store uses that R2 binding's JS API
(``put``/``get``/``delete``/``list``): bytes go to JS as a ``Uint8Array`` and come back
through ``arrayBuffer()``. Anywhere else (a producer in a container, ``haze
queue:prune-offload`` on a laptop) it uses R2's S3-compatible API through boto3
(``haze-jobs[sqs]``), at ``https://<account id>.r2.cloudflarestorage.com``, with an R2
API token's access key pair as boto3's usual credentials (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``). The URL's query sets the rest:

- ``bucket``: the bucket's name (default: the binding's name in lower case, ``_`` as
  ``-``: the bucket ``haze build`` names for it);
- ``account_id``: the Cloudflare account (default: ``CLOUDFLARE_ACCOUNT_ID``);
- ``endpoint_url``: any other S3 endpoint (replaces the account's).

>>> R2ObjectStore("r2://PAYLOADS/haze?account_id=abc").bucket
'payloads'
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from haze.driver_api import ConfigError, ObjectStore, StoredObject
from haze.offload.s3 import S3ObjectStore

from haze_cloudflare._js import IN_PYODIDE, binding, is_nullish, to_js

__all__ = ["BINDING_NAME", "R2ObjectStore", "bucket_name", "r2_url_error"]

#: What a Worker binding's name may be (a JS identifier wrangler accepts).
BINDING_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def bucket_name(binding_name: str) -> str:
    """The default bucket of a binding: ``PAYLOADS_R2`` -> ``payloads-r2``."""
    return binding_name.lower().replace("_", "-")


def r2_url_error(url: str) -> str | None:
    """Why ``url`` cannot name an R2 store (None: it can)."""
    name = urlsplit(url).netloc
    if not BINDING_NAME.match(name):
        return (
            f"{url!r}: {name!r} is not an R2 binding name; use r2://BINDING/prefix with "
            "letters, digits and _ (not starting with a digit), such as r2://PAYLOADS/haze"
        )
    return None


async def _settle(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


def _bytes(buffer: Any) -> bytes:
    if isinstance(buffer, (bytes, bytearray, memoryview)):
        return bytes(buffer)
    return bytes(buffer.to_bytes())  # a JS ArrayBuffer (Pyodide's JsProxy)


class R2ObjectStore:
    """``r2://BINDING/prefix``: the Worker's R2 binding, else R2's S3 API."""

    def __init__(self, url: str) -> None:
        problem = r2_url_error(url)
        if problem is not None:
            raise ConfigError(problem)
        self.url = url
        parts = urlsplit(url)
        self.binding_name = parts.netloc
        prefix = parts.path.strip("/")
        self.prefix = f"{prefix}/" if prefix else ""
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        self.bucket = query.get("bucket") or bucket_name(self.binding_name)
        self._query = query
        self._s3: ObjectStore | None = None

    def _binding(self) -> Any:
        found = binding(self.binding_name)
        if found is None and IN_PYODIDE:
            raise ConfigError(
                f"offloading to {self.url} needs the R2 binding {self.binding_name!r} in "
                "the Worker's env: add it to wrangler's \"r2_buckets\" (haze build does)"
            )
        return found

    def _over_s3(self) -> ObjectStore:
        """R2's S3-compatible API (outside a Worker)."""
        if self._s3 is None:
            endpoint = self._query.get("endpoint_url")
            account = self._query.get("account_id") or os.environ.get("CLOUDFLARE_ACCOUNT_ID")
            if not endpoint and not account:
                raise ConfigError(
                    f"offloading to {self.url} outside a Worker uses R2's S3 API: set "
                    "CLOUDFLARE_ACCOUNT_ID (or ?account_id= in the URL) and an R2 API "
                    "token's AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
                )
            endpoint = endpoint or f"https://{account}.r2.cloudflarestorage.com"
            options = {"region": self._query.get("region", "auto"), "endpoint_url": endpoint}
            path = f"/{self.prefix}" if self.prefix else ""
            self._s3 = S3ObjectStore(f"s3://{self.bucket}{path}?{urlencode(options)}")
        return self._s3

    async def put(self, key: str, data: bytes) -> None:
        bucket = self._binding()
        if bucket is None:
            return await self._over_s3().put(key, data)
        await _settle(bucket.put(self.prefix + key, to_js(data)))

    async def get(self, key: str) -> bytes | None:
        bucket = self._binding()
        if bucket is None:
            return await self._over_s3().get(key)
        found = await _settle(bucket.get(self.prefix + key))
        if is_nullish(found):
            return None
        return _bytes(await _settle(found.arrayBuffer()))

    async def delete(self, key: str) -> None:
        bucket = self._binding()
        if bucket is None:
            return await self._over_s3().delete(key)
        await _settle(bucket.delete(self.prefix + key))

    async def objects(self) -> AsyncIterator[StoredObject]:
        bucket = self._binding()
        if bucket is None:
            async for found in self._over_s3().objects():
                yield found
            return
        cursor: str | None = None
        while True:
            options: dict[str, Any] = {"prefix": self.prefix, "delimiter": "/"}
            if cursor:
                options["cursor"] = cursor
            page = await _settle(bucket.list(to_js(options)))
            for item in page.objects:
                # ``uploaded`` is a JS Date: milliseconds since the epoch
                yield StoredObject(
                    str(item.key)[len(self.prefix) :], item.uploaded.getTime() / 1000
                )
            if not page.truncated:
                return
            cursor = str(page.cursor)
