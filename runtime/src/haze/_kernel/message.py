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

import itertools
import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

from haze._kernel.durations import MAX_DELAY
from haze._kernel.errors import MessageDecodeError

__all__ = [
    "MAX_DELAY",
    "MAX_MESSAGE_SIZE",
    "MAX_QUEUE_NAME",
    "RETRIED",
    "RETRY_CLAIM",
    "UNRECORDED_FAILURE",
    "FailedJob",
    "Message",
    "check_json",
    "check_queue_name",
    "decode",
    "decode_payload",
    "encode",
    "encode_payload",
    "encode_plain",
    "envelope_of",
    "new_id",
    "redis_key_part_error",
    "retry_claim_of",
    "with_meta",
    "with_retry_claim",
]

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


class _NotJsonConstant(ValueError):
    """``NaN``, ``Infinity`` or ``-Infinity`` in a body: Python's json reads them, JSON
    has no such tokens, and haze never writes them (a producer's bug or a forged row)."""


def _refuse_constant(token: str) -> Any:
    raise _NotJsonConstant(token)


_dumps = _c_dumps() or _dumps
_scan = json.JSONDecoder(parse_constant=_refuse_constant).scan_once  # type: ignore[attr-defined]


def _strict_loads(body: Any) -> Any:
    return json.loads(body, parse_constant=_refuse_constant)


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
    return _strict_loads(body)


_prefix = ""
_counter = itertools.count()


def new_id() -> str:
    """A fresh id: 32 lowercase hex characters, unique across processes.

    A 64-bit random prefix per process and a 64-bit counter: one syscall per process
    instead of one per job, and ``next()`` on the counter is atomic, so threads never
    share an id. The prefix is drawn at the first id, never at import: a process forked
    after it (``register_at_fork``) and a Python Worker isolate started from a memory
    snapshot (``new_id_prefix`` at its first request) each draw their own.
    """
    global _prefix
    if not _prefix:
        _prefix = os.urandom(8).hex()
    return f"{_prefix}{next(_counter):016x}"


def new_id_prefix() -> None:
    """Draw the id prefix again at the next id: this process's memory was copied (a
    fork, or a Worker isolate restored from a snapshot) and may share it."""
    global _prefix
    _prefix = ""


if hasattr(os, "register_at_fork"):  # not on Windows or Pyodide (no fork there)
    os.register_at_fork(after_in_child=new_id_prefix)


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
        """Build a message from its decoded JSON, checking every field's type.

        A field of the wrong type (a hand-edited row, another producer's bug) raises
        ``MessageDecodeError`` naming it, so the job goes to failed jobs once instead of
        breaking inside the pipeline on every reclaim.

        >>> Message.from_dict({"v": 1, "id": "a1", "job": "ping", "payload": None}).queue
        'default'
        """
        if d.__class__ is not dict:
            raise MessageDecodeError(
                "not a haze message: expected a JSON object with 'id' and 'job' "
                f"(got {type(d).__name__})"
            )
        get = d.get
        mid, job = get("id"), get("job")
        if mid is None and job is None:  # another producer's JSON, not a broken envelope
            raise MessageDecodeError(
                "not a haze message: a JSON object without 'id' and 'job' "
                f"(keys: {', '.join(sorted(map(repr, d))[:5]) or 'none'})"
            )
        if mid.__class__ is not str or not mid:
            raise _field_error(d, "id", "a non-empty string")
        if job.__class__ is not str or not job:
            raise _field_error(d, "job", "a non-empty string (a registered job name)")
        if "payload" not in d and "enc" not in d:
            raise MessageDecodeError(f'haze message {mid!r} (job "{job}") has no "payload"')
        if len(d) > 7 or not _PLAIN.issuperset(d):
            _check_fields(d)
        else:  # a plain job's envelope: only these can be wrong
            queue, ts, conn, v = get("queue"), get("ts"), get("connection"), get("v", 1)
            if (
                (queue is not None and (queue.__class__ is not str or not 0 < len(queue) <= 255))
                or (ts is not None and not _is_number(ts))
                or (conn is not None and conn.__class__ is not str)
                or v.__class__ is not int
                or v != VERSION
            ):
                _check_fields(d)
        # Positional, in field order: half the cost of 15 keywords on every reserve.
        return cls(
            mid,  # id
            job,  # job
            get("payload"),  # payload
            get("queue") or "default",  # queue
            get("connection"),  # connection
            float(get("ts") or 0.0),  # ts
            get("attempts") or 0,  # attempts
            get("tenant"),  # tenant
            get("chain"),  # chain
            get("chain_id"),  # chain_id
            get("chain_catch"),  # chain_catch
            get("batch_id"),  # batch_id
            get("unique"),  # unique
            get("meta"),  # meta
            get("enc"),  # enc
        )


#: The largest queue name any driver accepts (database columns are VARCHAR(255)).
MAX_QUEUE_NAME = 255
#: The default ``max_message_size`` of the sync, memory, database and redis drivers, in
#: bytes of JSON: 4 MiB. A queue carries ids, not files; SQS (1 MiB) and Cloudflare
#: (128 KB) keep their own lower limits.
MAX_MESSAGE_SIZE = 4 * 1024 * 1024
_STRINGS = ("connection", "tenant", "chain_id", "batch_id", "enc")
#: The keys of a plain job's envelope (no chain, batch, lock, tenant or meta).
_PLAIN = frozenset(("v", "id", "job", "payload", "queue", "ts", "connection"))
#: The envelope version this haze writes and reads; any other fails as a decode error.
VERSION = 1


def check_queue_name(queue: object, where: str) -> str:
    """Return ``queue`` if it is a queue name (a string of 1 to 255 characters without a
    comma or NUL, and no whitespace at either end), else raise ``ValueError`` saying so,
    prefixed with ``where``."""
    if isinstance(queue, str) and 0 < len(queue) <= MAX_QUEUE_NAME:
        if "," in queue:
            # `queue:work --queue a,b` lists two queues: no worker could name this one.
            raise ValueError(
                f"{where}: a queue name cannot contain a comma (a worker's --queue a,b "
                f"lists queues), got {queue[:60]!r}"
            )
        if queue != queue.strip():
            # `queue:work --queue " a"` works the queue "a": no worker would take these jobs.
            raise ValueError(
                f"{where}: a queue name cannot start or end with whitespace (a worker's "
                f"--queue trims it), got {queue[:60]!r}"
            )
        if "\x00" in queue:
            # No command line can name it (argv holds no NUL), and PostgreSQL refuses it.
            raise ValueError(
                f"{where}: a queue name cannot contain a NUL character, got {queue[:60]!r}"
            )
        return queue
    shown = f"a name of {len(queue)} characters" if isinstance(queue, str) else repr(queue)
    raise ValueError(
        f"{where}: a queue name must be a string of 1 to {MAX_QUEUE_NAME} characters, got {shown}"
    )


def redis_key_part_error(what: str, value: str) -> str:
    """The one-line refusal of a ``:`` in a redis connection's prefix or queue name."""
    # Keys are <prefix>:<queue>:<suffix>: a ":" in either would let the prefix "p" with
    # the queue "a:b" share its keys with the prefix "p:a" and the queue "b".
    return (
        f"{what} on a redis connection cannot contain ':' (it separates the parts of "
        f"BullMQ's keys), got {value[:60]!r}; use '-', '_' or '.' instead"
    )


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _field_error(d: dict[str, Any], field: str, expected: str) -> MessageDecodeError:
    value: Any = d
    for part in field.replace("]", "").replace("[", ".").split("."):
        value = value[int(part)] if isinstance(value, list) else value.get(part)
    mid, job = d.get("id"), d.get("job")
    who = f"haze message {mid!r}" if isinstance(mid, str) else "a haze message"
    if isinstance(job, str):
        who += f' (job "{job}")'
    return MessageDecodeError(f'{who}: field "{field}" must be {expected}, got {_shown(value)}')


def _is_number(value: Any) -> bool:
    if value.__class__ is int:
        return -_FLOAT_MAX < value < _FLOAT_MAX  # a JSON integer of 400 digits is no time
    return value.__class__ is float and math.isfinite(value)


#: Integers at least this large have no float (``float()`` raises OverflowError).
_FLOAT_MAX = 2**1024


def _check_fields(d: dict[str, Any]) -> None:
    """Every optional field of the envelope has its type (None = absent)."""
    get = d.get
    v = get("v")
    if v is not None and v.__class__ is not int:
        raise _field_error(d, "v", "an integer (the envelope version, 1)")
    if v is not None and v != VERSION:
        # A newer haze wrote it (or a producer's bug): running it as version 1 could
        # misread fields whose meaning changed.
        raise _field_error(
            d,
            "v",
            f"{VERSION}, the envelope version this haze reads (a newer haze wrote it: "
            "upgrade haze on this worker, then retry it from failed jobs)",
        )
    queue = get("queue")
    if queue is not None and (queue.__class__ is not str or not 0 < len(queue) <= MAX_QUEUE_NAME):
        raise _field_error(d, "queue", f"a queue name of 1 to {MAX_QUEUE_NAME} characters")
    ts = get("ts")
    if ts is not None and not _is_number(ts):
        raise _field_error(d, "ts", "a finite number (epoch seconds)")
    attempts = get("attempts")
    if attempts is not None and (attempts.__class__ is not int or attempts < 0):
        raise _field_error(d, "attempts", "an integer >= 0")
    for name in _STRINGS:
        value = get(name)
        if value is not None and value.__class__ is not str:
            raise _field_error(d, name, "a string")
    chain = get("chain")
    if chain is not None:
        _check_links(d, "chain", chain, ("job", "batch"))
    catch = get("chain_catch")
    if catch is not None:
        _check_links(d, "chain_catch", catch, ("job", "fn"))
    unique = get("unique")
    if unique is not None:
        if unique.__class__ is not dict:
            raise _field_error(d, "unique", 'an object {"key": ..., "until": ...}')
        if unique.get("key").__class__ is not str:
            raise _field_error(d, "unique.key", "a string (the lock key)")
        until = unique.get("until")
        if until is not None and until.__class__ is not str:
            raise _field_error(d, "unique.until", "a string")
    meta = get("meta")
    if meta is not None:
        _check_meta(d, meta)


def _check_meta(d: dict[str, Any], meta: Any) -> None:
    """The envelope's ``meta`` object and the fields haze reads from it."""
    if meta.__class__ is not dict:
        raise _field_error(d, "meta", "an object")
    for key in ("first_ts", "due"):
        value = meta.get(key)
        if value is not None and not _is_number(value):
            raise _field_error(d, f"meta.{key}", "a finite number (epoch seconds)")
    for key in ("track", "keep"):  # status record TTLs (haze.status)
        value = meta.get(key)
        if value is not None and (not _is_number(value) or value <= 0):
            raise _field_error(d, f"meta.{key}", "a positive number of seconds")
    for key in ("debounce", "group"):
        value = meta.get(key)
        if value is not None and value.__class__ is not str:
            raise _field_error(d, f"meta.{key}", "a string")
    failed_attempt = meta.get("failed_attempt")  # a failed record's last attempt
    if failed_attempt is not None and (failed_attempt.__class__ is not int or failed_attempt < 1):
        raise _field_error(d, "meta.failed_attempt", "an integer >= 1")
    for key in ("traceparent", "tracestate"):  # W3C trace context (haze.otel)
        value = meta.get(key)
        if value is not None and (value.__class__ is not str or len(value) > 512):
            raise _field_error(d, f"meta.{key}", "a W3C trace-context string")


def _check_links(d: dict[str, Any], field: str, links: Any, kinds: tuple[str, str]) -> None:
    """A chain's links (``{"job": ...}`` or a batch) or its catch callbacks."""
    if links.__class__ is not list:
        raise _field_error(d, field, "a list of links")
    for i, link in enumerate(links):
        at = f"{field}[{i}]"
        if link.__class__ is not dict:
            raise _field_error(d, at, "an object")
        if "job" in link:
            if link["job"].__class__ is not str or not link["job"]:
                raise _field_error(d, f"{at}.job", "a job name")
        elif link.get(kinds[1]).__class__ is (dict if kinds[1] == "batch" else str):
            continue
        elif kinds[1] == "batch" and link.get("tail").__class__ is str:
            _check_tail_ref(d, at, link)
            continue
        else:
            raise _field_error(d, at, f'an object with "{kinds[0]}" or "{kinds[1]}"')
        queue = link.get("queue")
        if queue is not None and (queue.__class__ is not str or not 0 < len(queue) <= 255):
            raise _field_error(d, f"{at}.queue", "a queue name of 1 to 255 characters")
        for key in ("connection", "group"):
            if link.get(key) is not None and link[key].__class__ is not str:
                raise _field_error(d, f"{at}.{key}", "a string")
        delay = link.get("delay")
        if delay is not None and not (_is_number(delay) and 0 <= delay <= MAX_DELAY):
            raise _field_error(d, f"{at}.delay", f"seconds from 0 to {MAX_DELAY:g}")


def _check_tail_ref(d: dict[str, Any], at: str, link: dict[str, Any]) -> None:
    """A reference to a long chain's stored links (haze._orchestration.tails)."""
    for key in ("chunk", "of", "links"):
        if link.get(key).__class__ is not int or link[key] < 0:
            raise _field_error(d, f"{at}.{key}", "a whole number from 0")


def encode(message: Message) -> str:
    """The JSON body of a message. Raises ``TypeError`` naming the bad path in the payload."""
    try:
        body: str = _dumps(message.to_dict())
    except (TypeError, ValueError):
        check_json(message.payload, "payload")
        raise
    if not body.isascii():
        _check_utf8(body, message.payload, message.to_dict)
    return body


def encode_payload(payload: Any) -> str:
    """The JSON of a payload alone, failing as ``encode`` fails on it: for a driver that
    keeps a plain message's envelope and copies only its payload (``KeepsMessages``)."""
    try:
        text: str = _dumps(payload)
    except (TypeError, ValueError):
        check_json(payload, "payload")
        raise
    if not text.isascii():
        _check_utf8(text, payload, dict)
    return text


def _check_utf8(text: str, payload: Any, whole: Any) -> None:
    """A lone surrogate (``"\\ud800"`` from a bad decode) is valid in a Python str and in
    JSON text, but no backend can store it as UTF-8: refuse it here, naming where."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        _find_surrogate(payload, "payload")
        _find_surrogate(whole(), "message")
        raise


def _find_surrogate(value: Any, path: str) -> None:
    """Raise ``TypeError`` naming the first str in ``value`` with a lone surrogate."""
    if isinstance(value, str):
        for i, ch in enumerate(value):
            if "\ud800" <= ch <= "\udfff":
                raise TypeError(
                    f"{path} holds a lone surrogate {ch!r} at index {i}, which UTF-8 cannot "
                    "encode; decode the text with errors='replace' (or drop the character) "
                    "before dispatch"
                )
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _find_surrogate(v, f"{path}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            _find_surrogate(k, f"{path} key {k!r}")
            _find_surrogate(v, f"{path}[{k!r}]")


def decode_payload(text: str) -> Any:
    """The payload ``encode_payload`` wrote (a fresh copy of it)."""
    return _fast_loads(text)


_esc = json.encoder.encode_basestring  # what the encoder writes a string with


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


def is_plain(message: Message) -> bool:
    """Nothing in the envelope but immutable fields and the payload: no chain, batch,
    lock, meta or encryption (what ``encode_plain`` and ``KeepsMessages`` take)."""
    return (
        message.chain is None
        and message.chain_catch is None
        and message.chain_id is None
        and message.batch_id is None
        and message.unique is None
        and message.meta is None
        and message.enc is None
    )


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


def decode(body: str | bytes) -> Message:
    """Parse a JSON body into a Message, or raise MessageDecodeError saying what is wrong."""
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


def _non_finite_path(value: Any, path: str, depth: int) -> str | None:
    """The path of the first NaN or infinity in ``value`` (None: none found)."""
    if isinstance(value, float) and not math.isfinite(value):
        return path
    if depth > 200:
        return None
    if isinstance(value, dict):
        subs = [(f"{path}.{k}" if path else str(k), v) for k, v in value.items()]
    elif isinstance(value, list):
        subs = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
    else:
        return None
    for sub, v in subs:
        found = _non_finite_path(v, sub, depth + 1)
        if found is not None:
            return found
    return None


_NOT_JSON = object()


def _loads_or_not_json(body: Any) -> Any:
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
