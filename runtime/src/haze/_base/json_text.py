"""JSON as haze writes and reads it: compact, strict, and every error naming its path.

A message body is strict JSON: no ``NaN`` or ``Infinity`` (Python's ``json`` writes
and reads them, JSON has no such tokens), no lone surrogate (valid in a Python str,
not storable as UTF-8 anywhere). Writing is the C encoder without ``JSONEncoder``'s
per-call set-up; reading a body haze wrote skips ``json.loads``' own checks.

>>> _dumps({"a": [1.5, None]}), _fast_loads('{"a":1}')
('{"a":[1.5,null]}', {'a': 1})
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator
from typing import Any

from haze._base.errors import PayloadError

__all__ = ["check_encodable", "check_json", "check_links"]


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


def _strict_loads(text: Any) -> Any:
    return json.loads(text, parse_constant=_refuse_constant)


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


def _check_utf8(text: str, payload: Any, whole: Any, where: str = "payload") -> None:
    """A lone surrogate (``"\\ud800"`` from a bad decode) is valid in a Python str and in
    JSON text, but no backend can store it as UTF-8: refuse it here, naming where."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        _find_surrogate(payload, where)
        _find_surrogate(whole(), "message")
        raise


def _find_surrogate(value: Any, path: str) -> None:
    """Raise ``PayloadError`` naming the first str in ``value`` with a lone surrogate."""
    if isinstance(value, str):
        for i, ch in enumerate(value):
            if "\ud800" <= ch <= "\udfff":
                raise PayloadError(
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


_esc = json.encoder.encode_basestring  # what the encoder writes a string with


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


def check_json(value: Any, path: str = "payload") -> None:
    """Raise ``PayloadError`` naming the first path in ``value`` that JSON cannot carry."""
    _walk(value, path, set())


#: The deepest nesting of arrays and objects a payload may have. Reading deeper JSON
#: recurses: CPython raises RecursionError (a worker could not read the message), and
#: Pyodide (a Cloudflare Worker) can overflow the JavaScript stack and abort.
MAX_PAYLOAD_DEPTH = 200

#: a whole string (skipped), an opening bracket (group 1) or a closing one (group 2)
_TOKENS = r'"[^"\\]*(?:\\.[^"\\]*)*"|([\[{])|([\]}])'
_TEXT_TOKENS = re.compile(_TOKENS, re.DOTALL)
# In UTF-8 every byte of a multi-byte character is >= 0x80, so the brackets, quotes and
# backslashes of a bytes body are its characters' own: it is scanned without decoding.
_BYTE_TOKENS = re.compile(_TOKENS.encode(), re.DOTALL)


def too_deep(text: str | bytes, limit: int = MAX_PAYLOAD_DEPTH) -> bool:
    """Whether the JSON ``text`` (or its UTF-8 bytes) nests arrays/objects more than
    ``limit`` deep, without recursing; strings are skipped whole. Text with fewer
    brackets than that is not scanned (most payloads: two counts in C)."""
    tokens: Iterator[re.Match[Any]]
    if isinstance(text, bytes):
        if text.count(b"[") + text.count(b"{") <= limit:
            return False
        tokens = _BYTE_TOKENS.finditer(text)
    else:
        if text.count("[") + text.count("{") <= limit:
            return False
        tokens = _TEXT_TOKENS.finditer(text)
    depth = 0
    for m in tokens:
        if m.lastindex == 1:
            depth += 1
            if depth > limit:
                return True
        elif m.lastindex == 2:
            depth -= 1
    return False


def too_deep_error(where: str) -> PayloadError:
    return PayloadError(
        f"{where} is nested more than {MAX_PAYLOAD_DEPTH} levels deep (arrays and objects), "
        "deeper than a worker can read; send a flatter payload (ids instead of data)"
    )


def _walk(value: Any, path: str, seen: set[int]) -> None:
    if value is None or isinstance(value, (str, bool)):
        return
    if isinstance(value, int):
        if _too_many_digits(value):
            raise _long_int_error(path, value)
        return
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise PayloadError(f"{path} is {value!r}, which JSON cannot represent")
        return
    if isinstance(value, (list, tuple)):
        if id(value) in seen:
            raise PayloadError(f"{path} contains a reference to itself")
        seen.add(id(value))
        for i, v in enumerate(value):
            _walk(v, f"{path}[{i}]", seen)
        seen.discard(id(value))
        return
    if isinstance(value, dict):
        if id(value) in seen:
            raise PayloadError(f"{path} contains a reference to itself")
        seen.add(id(value))
        for k, v in value.items():
            _check_key(k, path)
            _walk(v, f"{path}[{_key_repr(k)}]", seen)
        seen.discard(id(value))
        return
    raise PayloadError(
        f"{path} is a {type(value).__module__}.{type(value).__qualname__}, which is not "
        "JSON-serialisable; pass plain data (ids, str, int, float, bool, None, list, dict)"
    )


def _check_key(key: Any, path: str) -> None:
    """JSON writes a key that is an int, a float, a bool or None as a string; any other
    type, and a key whose text JSON cannot write, is refused naming it."""
    if key is None or isinstance(key, (str, bool)):
        return
    if isinstance(key, int):
        if _too_many_digits(key):
            raise _long_int_error(f"{path} has a key that", key)
        return
    if isinstance(key, float):
        if math.isnan(key) or math.isinf(key):
            raise PayloadError(f"{path} has a key {key!r}, which JSON cannot represent")
        return
    raise PayloadError(
        f"{path} has a key {key!r} of type {type(key).__name__}; JSON object keys must be "
        "str (an int, float, bool or None key is written as a string)"
    )


def _too_many_digits(n: int) -> bool:
    """Whether ``n`` has more decimal digits than Python turns into text (CPython's
    ``sys.get_int_max_str_digits()``, 4,300 by default): JSON cannot write it."""
    limit = sys.get_int_max_str_digits()
    if not limit or n.bit_length() < limit * 3.3:  # fewer digits than the limit: text
        return False
    try:
        int.__repr__(n)
    except ValueError:
        return True
    return False


def _digits(n: int) -> int:
    """About how many decimal digits ``n`` has, without converting it to text."""
    return int(abs(n).bit_length() * 0.30103) + 1


def _key_repr(key: Any) -> str:
    if isinstance(key, int) and not isinstance(key, bool) and _too_many_digits(key):
        return f"<int of about {_digits(key)} digits>"
    return repr(key)


def _long_int_error(path: str, n: int) -> PayloadError:
    return PayloadError(
        f"{path} is an int of about {_digits(n)} digits, more than Python writes as text "
        f"({sys.get_int_max_str_digits()} digits), so JSON cannot carry it; send it as a "
        "string, or send a smaller number"
    )


def check_encodable(value: Any, where: str) -> None:
    """Raise ``PayloadError`` (``check_links``) when haze's JSON cannot write ``value``:
    for what is kept as it is (a memory store) and written only later."""
    try:
        _dumps(value)
    except (TypeError, ValueError):
        check_links(value, where)
        raise


def check_links(value: Any, where: str) -> None:
    """Raise ``PayloadError`` naming the job and the path of a link (a chain's next jobs,
    a batch's callbacks, anything shaped ``{"job", "payload"}``) in ``value`` whose
    payload JSON cannot carry; then the first bad path anywhere else in ``value``."""
    _links(value, 0)
    check_json(value, where)


def _links(value: Any, depth: int) -> None:
    if depth > MAX_PAYLOAD_DEPTH:
        return
    items: Any = ()
    if isinstance(value, dict):
        job = value.get("job")
        if isinstance(job, str) and "payload" in value:
            check_json(value["payload"], f'job "{job}": payload')
        items = (v for k, v in value.items() if k != "payload")
    elif isinstance(value, (list, tuple)):
        items = value
    for v in items:
        _links(v, depth + 1)


#: Ints JSON carries and reads back as the same int on every driver's decoder.
_INT_BOUND = 2**53
_INT_MIN = -_INT_BOUND
#: How deep a payload copied without JSON may nest; deeper ones take the JSON path.
_COPY_DEPTH = 32
#: What a plain copy holds that ``.copy()`` shares: ``copy_plain`` makes every sequence
#: a list.
_CONTAINERS = frozenset({dict, list})


class _NotPlain(Exception):
    """A value outside what ``copy_plain`` copies: the caller goes through JSON."""


def _copy_list(items: Any, depth: int, size: list[int]) -> list[Any]:
    # Scalars inline, as in _copy_dict
    out = []
    n = 0
    for v in items:
        cls = v.__class__
        if cls is int and _INT_MIN < v < _INT_BOUND:
            n += 18
        elif cls is str and v.isascii():
            n += 6 * len(v) + 3
        else:
            v = _copy(v, depth, size)
        out.append(v)
    size[0] += n
    return out


def _copy_dict(d: dict[Any, Any], depth: int, size: list[int]) -> dict[str, Any]:
    # Scalars inline: a flat dict (most payloads) costs no call per value.
    out = {}
    n = 2
    for k, v in d.items():
        if k.__class__ is not str or not k.isascii():
            raise _NotPlain
        cls = v.__class__
        if cls is int and _INT_MIN < v < _INT_BOUND:
            n += 6 * len(k) + 22
        elif cls is str and v.isascii():
            n += 6 * (len(k) + len(v)) + 7
        else:
            v = _copy(v, depth, size)
            n += 6 * len(k) + 4
        out[k] = v
    size[0] += n
    return out


def copy_tree(value: Any) -> Any:
    """A fresh copy of a value ``copy_plain`` made (so plain: nothing to check or
    measure), one call per dict or list in it.

    >>> v = {"a": [1, {"b": 2}], "c": "x"}; w = copy_tree(v); w == v, w["a"][1] is v["a"][1]
    (True, False)
    """
    cls = value.__class__
    if cls is dict:
        out = value.copy()
        for k, v in value.items():
            if v.__class__ in _CONTAINERS:
                out[k] = copy_tree(v)
        return out
    if cls is list:
        out = value.copy()
        for i, v in enumerate(value):
            if v.__class__ in _CONTAINERS:
                out[i] = copy_tree(v)
        return out
    return value


def _copy(v: Any, depth: int, size: list[int]) -> Any:
    cls = v.__class__
    if cls is str:
        if not v.isascii():
            raise _NotPlain
        size[0] += 6 * len(v) + 3  # each char at most a \u00XX escape
        return v
    if cls is int:
        if not _INT_MIN < v < _INT_BOUND:
            raise _NotPlain
        size[0] += 18
        return v
    if cls is float:
        if v - v != 0.0:  # NaN or an infinity: JSON refuses them
            raise _NotPlain
        size[0] += 26
        return v
    if v is None or cls is bool:
        size[0] += 6
        return v
    if depth > _COPY_DEPTH:
        raise _NotPlain
    if cls is dict:
        return _copy_dict(v, depth + 1, size)
    if cls is list or cls is tuple:
        size[0] += 2 + len(v)
        return _copy_list(v, depth + 1, size)
    raise _NotPlain


def copy_payload(value: Any) -> tuple[Any, int, bool] | None:
    """``copy_plain`` for a dispatch: the copy, the bound of its JSON's size, and whether
    the copy is *flat* (a dict or list holding no dict or list, so that its ``.copy()``
    is a full copy: what a claim hands the job, without a walk). A dict of ints and
    ASCII strings (most payloads) is copied in this one frame.

    >>> copy_payload({"a": 1, "b": "x"}), copy_payload([1, [2]]), copy_payload({1: 2})
    (({'a': 1, 'b': 'x'}, 49, True), ([1, [2]], 43, False), None)
    """
    if value.__class__ is not dict:
        copied = copy_plain(value)
        if copied is None:
            return None
        out = copied[0]
        return out, copied[1], out.__class__ is list and _CONTAINERS.isdisjoint(map(type, out))
    out = {}
    n = 2
    flat = True
    try:
        for k, v in value.items():
            if k.__class__ is not str or not k.isascii():
                return None
            cls = v.__class__
            if cls is int and _INT_MIN < v < _INT_BOUND:
                n += 6 * len(k) + 22
            elif cls is str and v.isascii():
                n += 6 * (len(k) + len(v)) + 7
            else:
                size = [0]
                if cls is dict:  # what _copy(v, 1, size) does, without its frame
                    v, flat = _copy_dict(v, 2, size), False
                elif cls is list or cls is tuple:
                    size[0] = 2 + len(v)
                    v, flat = _copy_list(v, 2, size), False
                else:
                    v = _copy(v, 1, size)
                n += 6 * len(k) + 4 + size[0]
            out[k] = v
    except (_NotPlain, RecursionError):
        return None
    return out, n, flat


def copy_plain(value: Any) -> tuple[Any, int] | None:
    """A fresh copy of ``value`` equal to what a JSON round trip through haze gives, and
    an upper bound of its JSON's size in bytes; None when ``value`` holds anything
    beyond plain dicts (str keys), lists, tuples, ASCII str, ints within 2**53, finite
    floats, bools and None (the caller then encodes it, which refuses what JSON cannot
    carry and words the error). No JSON text is written or read.

    >>> copy_plain({"a": (1, 2.5, None)})[0], copy_plain({1: "x"})
    ({'a': [1, 2.5, None]}, None)
    """
    size = [0]
    try:
        if value.__class__ is dict:  # most payloads: one frame fewer, same result as _copy
            return _copy_dict(value, 1, size), size[0]
        return _copy(value, 0, size), size[0]
    except (_NotPlain, RecursionError):
        return None
