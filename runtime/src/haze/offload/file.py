"""Offloaded payloads in a local folder: ``file:///var/haze/offload``.

For one machine, or a folder every worker mounts. Each object is a file named by its
key, written to a temporary name and renamed, so a reader never sees half of one.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

from haze.contracts.offload import StoredObject

__all__ = ["FileObjectStore"]

_TEMP = ".part-"


class FileObjectStore:
    """``file:///absolute/folder``: one file per object."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.root = Path(unquote(urlsplit(url).path))

    def _path(self, key: str) -> Path:
        if key in ("", ".", "..") or "/" in key or "\\" in key:
            raise ValueError(f"not an offload key: {key!r}")
        return self.root / key

    async def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        self.root.mkdir(parents=True, exist_ok=True)
        temp = self.root / f"{_TEMP}{key}"
        temp.write_bytes(data)
        os.replace(temp, path)

    async def get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            if not self.root.is_dir():
                # The whole folder is gone (a volume not mounted, a directory removed):
                # the store is down, not this object lost. None would fail its job for
                # good; raising lets the worker put the job back until the folder returns.
                raise FileNotFoundError(
                    f"the offload folder {self.root} does not exist (not mounted, or removed)"
                ) from None
            return None

    async def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    async def objects(self) -> AsyncIterator[StoredObject]:
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return
        for entry in entries:
            # a temporary file is a write that died: listed, so prune sweeps it too
            try:
                modified = entry.stat().st_mtime
            except FileNotFoundError:
                continue
            yield StoredObject(entry.name, modified)
