"""The envelope fields a driver rewrites when it re-sends a message: its ``attempts``
offset, and ``meta.due`` for a delay longer than the backend holds one message (sent in
hops, each re-sent until it is due). Shared by the SQS and Vercel drivers."""

from __future__ import annotations

import json

from haze._base.message import Message, envelope_of

__all__ = ["due_of", "rewrite_hop"]


def rewrite_hop(
    body: str, *, attempts: int | None = None, due: float | None = None, keep_due: bool = False
) -> str:
    """``body`` with another ``attempts`` offset (None: kept) and ``meta.due`` (None:
    removed, unless ``keep_due``); a body that is not a JSON object is left as it is."""
    data = envelope_of(body)
    if data is None:
        return body
    if attempts is not None:
        if attempts > 0:
            data["attempts"] = attempts
        else:
            data.pop("attempts", None)
    meta = dict(data.get("meta") or {})
    if due is not None:
        meta["due"] = round(due, 3)
    elif not keep_due:
        meta.pop("due", None)
    if meta:
        data["meta"] = meta
    else:
        data.pop("meta", None)
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def due_of(message: Message | None) -> float | None:
    """``meta.due`` of a message sent in hops (None: none, or not a number)."""
    if message is None or not message.meta:
        return None
    due = message.meta.get("due")
    try:
        return float(due) if due is not None else None
    except (TypeError, ValueError):
        return None
