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
from typing import Any

from haze._base.errors import PayloadError

__all__ = ["check_json"]


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

_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)


def too_deep(text: str, limit: int = MAX_PAYLOAD_DEPTH) -> bool:
    """Whether the JSON ``text`` nests arrays/objects more than ``limit`` deep, without
    recursing; strings are skipped whole. Text with fewer brackets than that is not
    scanned (most payloads: two counts in C)."""
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    for m in _TOKENS.finditer(text):
        token = m.group()
        if token in ("[", "{"):
            depth += 1
            if depth > limit:
                return True
        elif token in ("]", "}"):
            depth -= 1
    return False


def too_deep_error(where: str) -> PayloadError:
    return PayloadError(
        f"{where} is nested more than {MAX_PAYLOAD_DEPTH} levels deep (arrays and objects), "
        "deeper than a worker can read; send a flatter payload (ids instead of data)"
    )


def _walk(value: Any, path: str, seen: set[int]) -> None:
    if value is None or isinstance(value, (str, bool, int)):
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
            if not isinstance(k, str):
                raise PayloadError(
                    f"{path} has a key {k!r} of type {type(k).__name__}; JSON object keys "
                    "must be strings"
                )
            _walk(v, f"{path}[{k!r}]", seen)
        seen.discard(id(value))
        return
    raise PayloadError(
        f"{path} is a {type(value).__module__}.{type(value).__qualname__}, which is not "
        "JSON-serialisable; pass plain data (ids, str, int, float, bool, None, list, dict)"
    )


#: Ints JSON carries and reads back as the same int on every driver's decoder.
_INT_BOUND = 2**53
#: How deep a payload copied without JSON may nest; deeper ones take the JSON path.
_COPY_DEPTH = 32


class _NotPlain(Exception):
    """A value outside what ``copy_plain`` copies: the caller goes through JSON."""


def _copy_list(items: Any, depth: int, size: list[int]) -> list[Any]:
    return [_copy(v, depth, size) for v in items]


def _copy_dict(d: dict[Any, Any], depth: int, size: list[int]) -> dict[str, Any]:
    # Scalars inline: a flat dict (most payloads) costs no call per value.
    out = {}
    n = 2
    for k, v in d.items():
        if k.__class__ is not str or not k.isascii():
            raise _NotPlain
        cls = v.__class__
        if cls is int and -_INT_BOUND < v < _INT_BOUND:
            n += 6 * len(k) + 22
        elif cls is str and v.isascii():
            n += 6 * (len(k) + len(v)) + 7
        else:
            v = _copy(v, depth, size)
            n += 6 * len(k) + 4
        out[k] = v
    size[0] += n
    return out


#: ``copy_plain``'s copier of a dict, for one that ``copy_plain`` already copied (so it
#: is plain): ``copy_plain_dict(d, 1, [0])``, without ``copy_plain``'s frame.
copy_plain_dict = _copy_dict


def _copy(v: Any, depth: int, size: list[int]) -> Any:
    cls = v.__class__
    if cls is str:
        if not v.isascii():
            raise _NotPlain
        size[0] += 6 * len(v) + 3  # each char at most a \u00XX escape
        return v
    if cls is int:
        if not -_INT_BOUND < v < _INT_BOUND:
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
