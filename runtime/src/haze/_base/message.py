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
     "meta": {"exceptions": 2, "first_ts": …, "group": "…",
              "traceparent": "00-<trace id>-<span id>-01",    # W3C, when tracing (haze.otel)
              "failed_attempt": 3}}   # in a failed record's body: the attempt that failed

An encrypted job (``encrypted=True``) stores ``{"enc": "<base64 AES-GCM>"}`` in
place of ``payload``. No code is ever named by a message beyond a registered job name.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from haze._base.durations import MAX_DELAY
from haze._base.errors import MessageDecodeError
from haze._base.id_prefix import new_id, new_id_prefix
from haze._base.json_text import (
    MAX_PAYLOAD_DEPTH,
    _check_utf8,
    _dumps,
    _esc,
    _fast_loads,
    _loads,
    _non_finite_path,
    _NotJsonConstant,
    check_json,
    check_links,
    too_deep,
    too_deep_error,
)
from haze._base.message_fields import (
    MAX_GROUP_NAME,
    MAX_MESSAGE_SIZE,
    MAX_QUEUE_NAME,
    VERSION,
    Message,
    check_group,
    check_queue_name,
    is_plain,
    redis_key_part_error,
)

__all__ = [
    "MAX_DELAY",
    "MAX_GROUP_NAME",
    "MAX_MESSAGE_SIZE",
    "MAX_QUEUE_NAME",
    "OFFLOADED",
    "RETRIED",
    "RETRY_CLAIM",
    "UNRECORDED_FAILURE",
    "VERSION",
    "FailedJob",
    "Message",
    "check_group",
    "check_json",
    "check_queue_name",
    "decode",
    "decode_payload",
    "encode",
    "encode_payload",
    "encode_plain",
    "encode_with",
    "envelope_of",
    "is_plain",
    "new_id",
    "new_id_prefix",
    "redis_key_part_error",
    "retry_claim_of",
    "with_meta",
    "with_retry_claim",
]


def encode(message: Message) -> str:
    """The JSON body of a message. Raises ``PayloadError`` naming the bad path in the
    payload (and the job)."""
    where = f'job "{message.job}": payload'
    try:
        body: str = _dumps(message.to_dict())
    except RecursionError:
        raise too_deep_error(where) from None
    except (TypeError, ValueError):
        # the payload first, then the links it carries (a chain's next jobs, callbacks)
        check_links(message.to_dict(), f'job "{message.job}": message')
        raise
    if not body.isascii():
        _check_utf8(body, message.payload, message.to_dict, where)
    return body


def encode_payload(payload: Any, job: str | None = None) -> str:
    """The JSON of a payload alone, failing as ``encode`` fails on it, and refusing one
    nested deeper than a worker can read (the dispatcher encodes every payload here
    first). ``job`` names the job in the error."""
    where = "payload" if job is None else f'job "{job}": payload'
    try:
        text: str = _dumps(payload)
    except RecursionError:
        raise too_deep_error(where) from None
    except (TypeError, ValueError):
        check_json(payload, where)
        raise
    if too_deep(text):
        raise too_deep_error(where)
    if not text.isascii():
        _check_utf8(text, payload, dict, where)
    return text


def decode_payload(text: str) -> Any:
    """The payload ``encode_payload`` wrote (a fresh copy of it)."""
    return _fast_loads(text)


def _encode_plain(message: Message, payload: str) -> str:
    """``encode(message)`` of a plain message (no chain, batch, lock, meta or
    encryption) whose payload encodes to ``payload``: its fields written in place
    instead of a dict built and walked (a third of the cost)."""
    ts, attempts, conn, tenant = message.ts, message.attempts, message.connection, message.tenant
    if ts.__class__ is not float or attempts.__class__ is not int or not math.isfinite(ts):
        return encode(message)
    text = (
        f'{{"v":1,"id":{_esc(message.id)},"job":{_esc(message.job)},"payload":{payload},'
        f'"queue":{_esc(message.queue)},"ts":{float.__repr__(ts)}'
    )
    if conn is not None:
        text += f',"connection":{_esc(conn)}'
    if attempts:
        text += f',"attempts":{int.__repr__(attempts)}'
    if tenant is not None:
        text += f',"tenant":{_esc(tenant)}'
    return text + "}"


def _checked_encode_plain() -> Any:
    """``_encode_plain`` if it writes what ``encode`` writes here, else None."""
    try:
        for tenant, attempts in ((None, 0), ('t"\\u00e9\u2028\x01', 3)):
            m = Message(
                "a1", 'j"\n', {"é": [1.5, None]}, "q", "c", 1764433200.125, attempts, tenant
            )
            if _encode_plain(m, _dumps(m.payload)) != encode(m):
                return None
    except Exception:
        return None
    return _encode_plain


def encode_plain(message: Message, payload: str) -> str:
    """``encode(message)`` for a plain message whose payload ``encode_payload`` wrote as
    ``payload``: the same text."""
    return encode(message)


encode_plain = _checked_encode_plain() or encode_plain


def _encode_with(message: Message, payload: str) -> str:
    """``encode(message)`` of any unencrypted message whose payload ``encode_payload``
    wrote as ``payload``: the payload is not walked again, only the envelope's fields."""
    if is_plain(message):
        return encode_plain(message, payload)
    if message.enc is not None:
        return encode(message)
    rest = message.to_dict()
    del rest["v"], rest["id"], rest["job"], rest["payload"]
    try:
        tail: str = _dumps(rest)
    except (TypeError, ValueError):
        return encode(message)  # raises, naming the field
    if not tail.isascii():
        _check_utf8(tail, None, message.to_dict)
    head = f'{{"v":1,"id":{_esc(message.id)},"job":{_esc(message.job)},"payload":{payload}'
    return f"{head},{tail[1:]}"


def _checked_encode_with() -> Any:
    """``_encode_with`` if it writes what ``encode`` writes here, else None."""
    try:
        m = Message("a1", 'j"\n', {"é": [1.5, None]}, "q", "c", 1764433200.125, 2, 't"é')
        m.chain, m.chain_id, m.batch_id = [{"job": "n", "payload": "\u2028"}], "c1", "b1"
        m.unique, m.meta = {"key": "k", "until": "processing"}, {"debounce": "d\x01"}
        if _encode_with(m, _dumps(m.payload)) != encode(m):
            return None
    except Exception:
        return None
    return _encode_with


def encode_with(message: Message, payload: str) -> str:
    """``encode(message)`` for a message whose payload ``encode_payload`` wrote as
    ``payload`` (the dispatcher encodes a payload once, before the locks, and the
    envelope after them): the same text."""
    return encode(message)


encode_with = _checked_encode_with() or encode_with


#: the deepest body a worker reads: a payload's limit and the envelope's own levels
MAX_BODY_DEPTH = MAX_PAYLOAD_DEPTH + 16


def _too_deep_body(body: str | bytes) -> bool:
    return too_deep(body, MAX_BODY_DEPTH)


def decode(body: str | bytes) -> Message:
    """Parse a JSON body into a Message, or raise MessageDecodeError saying what is wrong."""
    # Read the depth from the text before parsing: json recurses, and in Pyodide (a
    # Cloudflare Worker) a deep body overflows the JavaScript stack and aborts the
    # isolate long before CPython's RecursionError. The envelope (meta, a chain's links)
    # wraps a payload in a few levels more.
    if _too_deep_body(body):
        raise MessageDecodeError("message body is nested too deeply to be read as JSON")
    try:
        data = _fast_loads(body)
    except RecursionError:
        raise MessageDecodeError("message body is nested too deeply to be read as JSON") from None
    except _NotJsonConstant as e:
        raise _constant_error(body, str(e)) from None
    except (ValueError, TypeError) as e:
        preview = body[:80] if isinstance(body, str) else body[:80].decode("utf-8", "replace")
        raise MessageDecodeError(f"message body is not valid JSON ({e}): {preview!r}") from None
    return Message.from_dict(data)


def _constant_error(body: str | bytes, token: str) -> MessageDecodeError:
    """The error of a body holding ``token`` (NaN, Infinity), naming the first field
    that holds one (read again, leniently, only on this error path)."""
    try:
        data = _loads(body)
    except (ValueError, TypeError, RecursionError):
        data = None
    path = _non_finite_path(data, "", 0) if isinstance(data, dict) else None
    who = "a haze message"
    if isinstance(data, dict):
        mid, job = data.get("id"), data.get("job")
        who = f"haze message {mid!r}" if isinstance(mid, str) else who
        who += f' (job "{job}")' if isinstance(job, str) else ""
    where = f'field "{path}"' if path else "the body"
    return MessageDecodeError(
        f"{who}: {where} holds {token}, which is not JSON (haze messages are strict JSON; "
        "send null or a string instead)"
    )


_NOT_JSON = object()


def _loads_or_not_json(body: Any) -> Any:
    if isinstance(body, (str, bytes)) and _too_deep_body(body):
        return _NOT_JSON  # too deep to read (see decode): unreadable
    try:
        return _loads(body)
    except (ValueError, TypeError, RecursionError):  # too deep to read: unreadable too
        return _NOT_JSON


def envelope_of(body: Any) -> dict[str, Any] | None:
    """The JSON object of a stored body, unchecked; None when the body is not one.

    For reading failed records, whose body may be anything a producer sent: unlike
    ``decode`` it never raises, and it checks no field.

    >>> envelope_of('{"id": "a1", "job": "ping"}')["job"], envelope_of("[1]")
    ('ping', None)
    """
    data = _loads_or_not_json(body)
    return data if isinstance(data, dict) else None


#: The envelope ``meta`` field of a message whose final failure the failed-job store
#: could not keep when it happened: ``{"exception", "attempt", "handed_back"}``. Its next
#: delivery records that failure, and runs neither the job nor its ``failed()``.
UNRECORDED_FAILURE = "unrecorded_failure"

#: The envelope ``meta`` field of a message whose payload was offloaded to an object
#: store (``haze._engine.offload``): ``{"offloaded": key, "size": n, "sha256": hex}``,
#: with ``"enc": true`` when the object holds the encrypted payload. Its ``payload`` is null.
OFFLOADED = "offload"

#: The envelope ``meta`` field of a message queued again by a retry from failed jobs:
#: ``{"token", "connection"}``, the claim on the failed record (of that connection's
#: store) that its first run deletes, in case the retry died before it did.
RETRIED = "retry"

#: The envelope ``meta`` field of a failed record that a retry has claimed (SQL stores
#: keep the claim in the stored body): ``{"token": ..., "until": <unix time>}``.
RETRY_CLAIM = "retry_claim"


def retry_claim_of(body: str) -> tuple[str, float] | None:
    """The (token, end) of the retry claim a stored body carries; None when none.

    >>> retry_claim_of('{"id": "a", "meta": {"retry_claim": {"token": "t", "until": 5}}}')
    ('t', 5.0)
    """
    data = envelope_of(body)
    meta = data.get("meta") if data is not None else None
    claim = meta.get(RETRY_CLAIM) if isinstance(meta, dict) else None
    if not isinstance(claim, dict) or not isinstance(claim.get("token"), str):
        return None
    until = claim.get("until")
    return claim["token"], float(until) if isinstance(until, (int, float)) else 0.0


def with_retry_claim(body: str, claim: dict[str, Any] | None) -> str | None:
    """``body`` with its retry claim set to ``claim`` (None: removed); None when the
    body is no envelope (an unreadable record is never retried)."""
    return with_meta(body, RETRY_CLAIM, claim)


def with_meta(body: str, key: str, value: Any) -> str | None:
    """``body`` with ``meta[key]`` set to ``value`` (None: removed), every other field
    as it was (an encrypted payload stays encrypted); None when the body is no
    envelope.

    >>> with_meta('{"id": "a", "job": "j"}', "k", 1)
    '{"id":"a","job":"j","meta":{"k":1}}'
    """
    data = envelope_of(body)
    if data is None:
        return None
    meta = data.get("meta")
    meta = dict(meta) if isinstance(meta, dict) else {}
    meta.pop(key, None)
    if value is not None:
        meta[key] = value
    if meta:
        data["meta"] = meta
    else:
        data.pop("meta", None)
    try:
        return str(_dumps(data))
    except ValueError:  # NaN in a body written by another producer: not re-encodable
        return None


@dataclass
class FailedJob:
    """One job that used all its tries (``Queue.failed()``, ``haze queue:failed``)."""

    id: str
    name: str
    connection: str
    queue: str
    payload: Any
    exception: str
    failed_at: float
    chain_id: str | None = None
    batch_id: str | None = None
    body: str = field(default="", repr=False)

    @classmethod
    def from_body(
        cls,
        body: str,
        *,
        id: str | None,
        connection: str,
        queue: str,
        exception: str,
        failed_at: float,
        name: str | None = None,
    ) -> FailedJob:
        """The record of a failure stored as its envelope ``body``: the one place a failed
        row's job name, payload, ``chain_id`` and ``batch_id`` are read from the body.

        ``id`` None takes the envelope's own id ("" when it has none). ``name`` is the
        job name when the envelope names none (default ``<unknown>``, or
        ``<undecodable>`` for a body that is not JSON); a body that is not a JSON object
        becomes the payload.

        >>> FailedJob.from_body('{"id": "a1", "job": "ping", "payload": 1, "batch_id": "b"}',
        ...     id=None, connection="c", queue="q", exception="E", failed_at=0.0).batch_id
        'b'
        """
        data = _loads_or_not_json(body)
        if not isinstance(data, dict):
            if name is None:
                name = "<undecodable>" if data is _NOT_JSON else "<unknown>"
            return cls(id or "", name, connection, queue, body, exception, failed_at, body=body)
        job = data.get("job")
        if id is None:
            own = data.get("id")
            id = "" if own is None else str(own)
        return cls(
            id=id,
            name=job if isinstance(job, str) else (name or "<unknown>"),
            connection=connection,
            queue=queue,
            payload=data.get("payload"),
            exception=exception,
            failed_at=failed_at,
            chain_id=data.get("chain_id"),
            batch_id=data.get("batch_id"),
            body=body,
        )

    @property
    def attempt(self) -> int | None:
        """The attempt it failed on (1 = its first run); None for a record written before
        haze kept it, or one whose message could not be decoded.

        >>> job.attempt  # doctest: +SKIP
        3
        """
        data = envelope_of(self.body) if self.body else None
        meta = data.get("meta") if data is not None else None
        value = meta.get("failed_attempt") if isinstance(meta, dict) else None
        return value if value.__class__ is int and value >= 1 else None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "connection": self.connection,
            "queue": self.queue,
            "payload": self.payload,
            "exception": self.exception,
            "failed_at": self.failed_at,
        }
        if self.chain_id:
            d["chain_id"] = self.chain_id
        if self.batch_id:
            d["batch_id"] = self.batch_id
        attempt = self.attempt
        if attempt is not None:
            d["attempt"] = attempt
        return d


def now() -> float:
    return time.time()
