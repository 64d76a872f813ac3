"""The ``Message`` envelope's fields, and the checks a decoded envelope passes.

``haze._base.message`` writes and reads bodies; this module holds what a body
becomes: the ``Message`` dataclass, the limits every driver shares (queue name
length, message size), and the checks of each field's type that turn a hand-edited
row into one ``MessageDecodeError`` naming the field.

>>> Message.from_dict({"v": 1, "id": "a1", "job": "ping", "payload": None}).queue
'default'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from haze._base.durations import MAX_DELAY
from haze._base.errors import MessageDecodeError

__all__ = [
    "MAX_GROUP_NAME",
    "MAX_MESSAGE_SIZE",
    "MAX_QUEUE_NAME",
    "VERSION",
    "Message",
    "check_group",
    "check_queue_name",
    "is_plain",
    "redis_key_part_error",
]


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


#: The longest tenant group name: what an SQS FIFO ``MessageGroupId`` takes, and the
#: database drivers' group column.
MAX_GROUP_NAME = 128


def check_group(group: object, where: str) -> str:
    """Return ``group`` if it is a tenant group name (a string of 1 to 128 characters on
    one line, no NUL), else raise ``ValueError`` saying so, prefixed with ``where``."""
    if not isinstance(group, str):
        raise ValueError(f"{where}: a group must be a string, got {_shown(group)}")
    if not 0 < len(group) <= MAX_GROUP_NAME:
        raise ValueError(
            f"{where}: a group name has 1 to {MAX_GROUP_NAME} characters (an SQS FIFO "
            f"MessageGroupId's limit), got {len(group)}"
        )
    if "\x00" in group:
        # PostgreSQL refuses it in a text column.
        raise ValueError(f"{where}: a group name cannot contain a NUL character")
    if group.splitlines() != [group]:
        # queue:stats and the dashboard show one group a line (\u2028, \x85 break too).
        raise ValueError(f"{where}: a group name cannot contain a line break, got {group[:60]!r}")
    if any("\ud800" <= c <= "\udfff" for c in group):
        # UTF-8 (every queue's message) cannot encode it.
        raise ValueError(f"{where}: a group name cannot contain a lone surrogate, got {group!r}")
    return group


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
