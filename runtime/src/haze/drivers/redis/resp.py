"""RESP for the lean connection (``wire.py``): commands encoded as bytes, with the
short strings a job's script call repeats cached, and replies parsed like
``decode_responses=True`` (hiredis's parser when it is installed, ours otherwise)."""

from __future__ import annotations

from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

try:  # the C parser redis-py also uses when present
    import hiredis  # type: ignore[import-not-found,unused-ignore]

    _HIREDIS = True
except ImportError:  # pragma: no cover - depends on the environment
    _HIREDIS = False


def _error(message: str) -> ResponseError:
    if message.startswith("NOSCRIPT"):
        return NoScriptError(message)
    return ResponseError(message)


class _PyReader:
    """RESP2 replies from a byte stream, decoded to ``str`` (hiredis's ``Reader`` API)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> None:
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def gets(self) -> Any:
        try:
            value, pos = self._parse(self._pos)
        except (IndexError, ValueError):  # incomplete: wait for more bytes
            return False
        self._pos = pos
        return value

    def _parse(self, pos: int) -> tuple[Any, int]:
        buf = self._buf
        end = buf.index(b"\r\n", pos)  # ValueError: incomplete
        kind = buf[pos]
        if kind == 0x24:  # $ bulk string
            n = int(buf[pos + 1 : end])
            if n < 0:
                return None, end + 2
            start = end + 2
            if start + n + 2 > len(buf):
                raise IndexError
            return buf[start : start + n].decode("utf-8", "surrogateescape"), start + n + 2
        if kind == 0x2A:  # * array; its bulk strings inline (a job's fields come as one)
            n = int(buf[pos + 1 : end])
            if n < 0:
                return None, end + 2
            items: list[Any] = []
            p = end + 2
            size = len(buf)
            for _ in range(n):
                if p < size and buf[p] == 0x24:
                    e = buf.index(b"\r\n", p)
                    m = int(buf[p + 1 : e])
                    if m < 0:
                        items.append(None)
                        p = e + 2
                        continue
                    start = e + 2
                    if start + m + 2 > size:
                        raise IndexError
                    items.append(buf[start : start + m].decode("utf-8", "surrogateescape"))
                    p = start + m + 2
                else:
                    item, p = self._parse(p)
                    items.append(item)
            return items, p
        if kind == 0x3A:  # : integer
            return int(buf[pos + 1 : end]), end + 2
        if kind == 0x2B:  # + simple string
            return buf[pos + 1 : end].decode("utf-8", "surrogateescape"), end + 2
        if kind == 0x2D:  # - error
            return _error(buf[pos + 1 : end].decode("utf-8", "replace")), end + 2
        raise RedisConnectionError(f"unexpected byte {kind!r} in a Redis reply")


def _reader() -> Any:
    if _HIREDIS:
        return hiredis.Reader(encoding="utf-8", errors="surrogateescape")
    return _PyReader()


#: RESP bulk strings of short strings seen before (keys, script shas, names): a job's
#: script call repeats about ten of them. Cleared when full rather than evicted.
_BULK: dict[str, bytes] = {}
_BULK_MAX = 4096
_BULK_LEN = 200


def _bulk(a: Any) -> bytes:
    if type(a) is str:
        b = _BULK.get(a)
        if b is not None:
            return b
        raw = a.encode("utf-8", "surrogateescape")
        b = b"$%d\r\n%s\r\n" % (len(raw), raw)
        if len(a) <= _BULK_LEN:
            if len(_BULK) >= _BULK_MAX:
                _BULK.clear()
            _BULK[a] = b
        return b
    if isinstance(a, bytes):
        raw = a
    elif isinstance(a, str):
        raw = a.encode("utf-8", "surrogateescape")
    elif isinstance(a, bool):  # redis-py refuses booleans too
        raise TypeError("a boolean cannot be sent to Redis; convert it to int or str")
    elif isinstance(a, (int, float)):
        raw = repr(a).encode()
    elif a is None:
        raise TypeError("None cannot be sent to Redis")
    else:
        raw = bytes(a)
    return b"$%d\r\n%s\r\n" % (len(raw), raw)


def _fresh(args: tuple[Any, ...]) -> bytes:
    """``_bulk`` for arguments that differ from call to call (a job's body, a timestamp):
    the cache would only churn on them."""
    out = []
    for a in args:
        if type(a) is str:
            raw = a.encode("utf-8", "surrogateescape")
        elif type(a) is int:
            raw = b"%d" % a
        else:
            out.append(_bulk(a))
            continue
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


def _pack(args: tuple[Any, ...]) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(map(_bulk, args))


def encode(*args: Any) -> bytes:
    """One command as RESP, for ``Wire.pipeline``."""
    return _pack(args)
