"""The message envelope: what a queued job looks like on every driver.

A message is one JSON object. Only ``v``, ``id``, ``job`` and ``payload`` are always
present; the rest are written only when set, so a plain job stays small::

    {"v": 1, "id": "8f0c…", "job": "send_invoice", "payload": {"invoice_id": 42},
     "queue": "emails", "ts": 1764433200.12,
     "attempts": 0,                        # tries already used before this message existed
     "tenant": "acme",                     # captured from haze.tenant(...)
     "chain": [{"job": "publish", "payload": {...}, "queue": "media"}],  # links still to run
     "chain_id": "…", "chain_catch": [{"job": "cleanup", "payload": {...}}],
     "batch_id": "…",
     "unique": {"key": "haze:unique:sync_feed:1", "until": "processed"},
     "meta": {"exceptions": 2, "first_ts": …, "group": "…"}}

An encrypted job (``encrypted=True``) stores ``{"enc": "<base64 AES-GCM>"}`` in
place of ``payload``. No code is ever named by a message beyond a registered job name.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from dataclasses import dataclass
from typing import Any

from .errors import MessageDecodeError

__all__ = ["Message", "check_json", "decode", "encode", "new_id"]

_encoder = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, separators=(",", ":"), check_circular=True
)
_dumps = _encoder.encode
_loads = json.loads


def _c_dumps() -> Any:
    """``_dumps`` minus JSONEncoder.encode's per-call Python set-up (about a quarter of
    its cost on a small message): the same C encoder it builds, built the same way.
    None when ``_json`` is missing or builds something else (a future signature)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    e, esc = _encoder, json.encoder.encode_basestring
    args = (
        e.default,
        esc,
        e.indent,
        e.key_separator,
        e.item_separator,
        e.sort_keys,
        e.skipkeys,
        e.allow_nan,
    )

    def dumps(o: Any) -> str:
        # a fresh markers dict per call, as in iterencode: thread-safe, no stale marks
        return "".join(make({}, *args)(o, 0))

    try:
        sample = {"v": 1, "s": 'é\u2028"\n', "f": [1.5, -0.0, 10**20], "n": None, "b": True}
        if dumps(sample) == _dumps(sample):
            return dumps
    except Exception:
        pass
    return None


_dumps = _c_dumps() or _dumps
_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _fast_loads(body: Any) -> Any:
    # json.loads adds type and BOM checks and two whitespace regex matches around
    # scan_once; a body haze wrote has no surrounding whitespace, so scan it directly
    # and let json.loads handle (and word the errors of) anything else.
    if body.__class__ is str:
        try:
            data, end = _scan(body, 0)
        except StopIteration:
            pass
        else:
            if end == len(body):
                return data
    return _loads(body)


_getpid = os.getpid
_prefix = ""
_prefix_pid = -1
_counter = itertools.count()


def new_id() -> str:
    """A fresh id: 32 lowercase hex characters, unique across processes.

    A 64-bit random prefix per process (drawn again after a fork) and a 64-bit
    counter: one syscall per process instead of one per job, and ``next()`` on the
    counter is atomic, so threads never share an id.
    """
    global _prefix, _prefix_pid
    if _prefix_pid != _getpid():
        _prefix, _prefix_pid = os.urandom(8).hex(), _getpid()
    return f"{_prefix}{next(_counter):016x}"


@dataclass(slots=True)
class Message:
    id: str
    job: str
    payload: Any
    queue: str = "default"
    connection: str | None = None
    ts: float = 0.0
    attempts: int = 0
    tenant: str | None = None
    chain: list[dict[str, Any]] | None = None
    chain_id: str | None = None
    chain_catch: list[dict[str, Any]] | None = None
    batch_id: str | None = None
    unique: dict[str, Any] | None = None
    meta: dict[str, Any] | None = None
    enc: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"v": 1, "id": self.id, "job": self.job}
        if self.enc is not None:
            d["enc"] = self.enc
        else:
            d["payload"] = self.payload
        d["queue"] = self.queue
        d["ts"] = self.ts
        if self.connection is not None:
            d["connection"] = self.connection
        if self.attempts:
            d["attempts"] = self.attempts
        if self.tenant is not None:
            d["tenant"] = self.tenant
        if self.chain:
            d["chain"] = self.chain
        if self.chain_id is not None:
            d["chain_id"] = self.chain_id
        if self.chain_catch:
            d["chain_catch"] = self.chain_catch
        if self.batch_id is not None:
            d["batch_id"] = self.batch_id
        if self.unique is not None:
            d["unique"] = self.unique
        if self.meta:
            d["meta"] = self.meta
        return d

    @classmethod
    def from_dict(cls, d: Any) -> Message:
        if not isinstance(d, dict) or not isinstance(d.get("job"), str) or "id" not in d:
            raise MessageDecodeError(
                "not a haze message: expected a JSON object with 'id' and 'job' "
                f"(got {type(d).__name__})"
            )
        if "payload" not in d and "enc" not in d:
            raise MessageDecodeError(f'haze message {d.get("id")!r} has no "payload"')
        get = d.get
        # Positional, in field order: half the cost of 15 keywords on every reserve.
        return cls(
            str(d["id"]),  # id
            d["job"],  # job
            get("payload"),  # payload
            get("queue") or "default",  # queue
            get("connection"),  # connection
            float(get("ts") or 0.0),  # ts
            int(get("attempts") or 0),  # attempts
            get("tenant"),  # tenant
            get("chain"),  # chain
            get("chain_id"),  # chain_id
            get("chain_catch"),  # chain_catch
            get("batch_id"),  # batch_id
            get("unique"),  # unique
            get("meta"),  # meta
            get("enc"),  # enc
        )


def encode(message: Message) -> str:
    """The JSON body of a message. Raises ``TypeError`` naming the bad path in the payload."""
    try:
        return _dumps(message.to_dict())
    except (TypeError, ValueError):
        check_json(message.payload, "payload")
        raise


def decode(body: str | bytes) -> Message:
    """Parse a JSON body into a Message, or raise MessageDecodeError saying what is wrong."""
    try:
        data = _fast_loads(body)
    except (ValueError, TypeError) as e:
        preview = body[:80] if isinstance(body, str) else body[:80].decode("utf-8", "replace")
        raise MessageDecodeError(f"message body is not valid JSON ({e}): {preview!r}") from None
    return Message.from_dict(data)


def check_json(value: Any, path: str = "payload") -> None:
    """Raise ``TypeError`` naming the first path in ``value`` that JSON cannot carry."""
    _walk(value, path, set())


def _walk(value: Any, path: str, seen: set[int]) -> None:
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise TypeError(f"{path} is {value!r}, which JSON cannot represent")
        return
    if isinstance(value, (list, tuple)):
        if id(value) in seen:
            raise TypeError(f"{path} contains a reference to itself")
        seen.add(id(value))
        for i, v in enumerate(value):
            _walk(v, f"{path}[{i}]", seen)
        seen.discard(id(value))
        return
    if isinstance(value, dict):
        if id(value) in seen:
            raise TypeError(f"{path} contains a reference to itself")
        seen.add(id(value))
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(
                    f"{path} has a key {k!r} of type {type(k).__name__}; JSON object keys "
                    "must be strings"
                )
            _walk(v, f"{path}[{k!r}]", seen)
        seen.discard(id(value))
        return
    raise TypeError(
        f"{path} is a {type(value).__module__}.{type(value).__qualname__}, which is not "
        "JSON-serialisable; pass plain data (ids, str, int, float, bool, None, list, dict)"
    )


def now() -> float:
    return time.time()
