"""The checks of single config values: each raises one ``ConfigError`` line naming the
file and the key. A driver's or store's options are checked against what its class
declares (``DeclaresOptions``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from haze._app.config.environment import origin
from haze._base.durations import MIN_SLOT_LEASE, parse_duration
from haze._base.errors import ConfigError, MissingDependencyError
from haze._base.message_fields import check_queue_name
from haze._base.sizes import parse_size
from haze.contracts.driver import DeclaresOptions, DispatchOnly
from haze.offload import OBJECT_STORES, object_store, url_error

__all__ = [
    "COMMON_QUEUE_OPTIONS",
    "MAX_CONNECTION_NAME",
    "Checks",
    "check_options",
    "declared_schema",
]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,200}$")
_RATE = re.compile(r"^\s*([1-9][0-9]*)\s*/\s*(s|m|h|d)\s*$")
_RATE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
#: The longest queue connection name (failed jobs keep it in every store).
MAX_CONNECTION_NAME = 64


class Checks:
    """Small validators; each raises ConfigError naming source and key."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(message, source=self.source, key=key)

    def mapping(self, value: object, key: str, *, required: bool = False) -> dict[str, Any]:
        if value is None:
            if required:
                raise self.fail(key, "is required (a dict)")
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(key, f"expected a dict, got {type(value).__name__} {value!r}")
        for k in value:
            if not isinstance(k, str):
                raise self.fail(key, f"keys must be strings, got {k!r}")
        return dict(value)

    def string(self, value: object, key: str, *, required: bool = False) -> str | None:
        if value is None:
            if required:
                raise self.fail(key, "is required (a string)")
            return None
        if not isinstance(value, str) or not value:
            raise self.fail(key, f"expected a non-empty string, got {value!r}{origin(value)}")
        return value

    def name(self, value: object, key: str) -> str:
        s = self.string(value, key, required=True)
        assert s is not None
        if not _NAME.match(s):
            raise self.fail(key, f"{s!r} is not a valid name (letters, digits, _ . : -)")
        return s

    def identifier(self, value: object, key: str) -> str:
        s = self.string(value, key, required=True)
        assert s is not None
        if not _IDENT.match(s):
            raise self.fail(
                key, f"{s!r} is not a valid SQL identifier (letters, digits and _, max 63 chars)"
            )
        return s

    def integer(self, value: object, key: str, *, minimum: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"expected an integer, got {value!r}")
        if value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {value}")
        return value

    def boolean(self, value: object, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {value!r}")
        return value

    def duration(self, value: object, key: str, *, allow_zero: bool = True) -> float:
        try:
            return parse_duration(value, key, allow_zero=allow_zero)
        except ValueError as e:
            raise self.fail(key, str(e).split(": ", 1)[-1]) from None

    def queue_names(self, value: object, key: str) -> list[str]:
        """Queue names, by the rules dispatch applies (``check_queue_name``). The dict
        form (``{"emails": {"concurrency": 5}}``) gives its keys, in order;
        ``queue_limits`` reads its values."""
        if isinstance(value, str):
            value = [value]
        mapping = isinstance(value, Mapping)
        if not (mapping or isinstance(value, (list, tuple))) or not value:
            raise self.fail(
                key,
                "expected a non-empty list of queue names, or a dict of queue name to "
                f"options ({{'emails': {{'concurrency': 5}}}}), got {value!r}",
            )
        assert isinstance(value, (Mapping, list, tuple))
        for i, q in enumerate(value):
            where = f"{key}.{q}" if mapping else f"{key}[{i}]"
            try:
                # The rules dispatch applies: a queue a job may go to can be listed here.
                check_queue_name(q, where)
            except ValueError as e:
                raise self.fail(where, str(e).removeprefix(f"{where}: ")) from None
        return list(value)

    def queue_limits(self, value: object, key: str) -> dict[str, dict[str, float]]:
        """The concurrency limits of the dict form of a connection's ``queues``:
        queue -> ``{"max", "release_after", "expire_after"}``; queues without one are left
        out."""
        if not isinstance(value, Mapping):
            return {}
        out: dict[str, dict[str, float]] = {}
        for q, raw in value.items():
            sub = f"{key}.{q}"
            opts = self.mapping(raw, sub)
            self.unknown(opts, set(_QUEUE_LIMIT_DEFAULTS) | {"concurrency"}, sub)
            if opts.get("concurrency") is None:
                if opts:
                    raise self.fail(
                        f"{sub}.concurrency",
                        "is required with release_after or "
                        "expire_after (the most jobs of this queue running at once)",
                    )
                continue
            limit: dict[str, float] = {
                "max": self.integer(opts["concurrency"], f"{sub}.concurrency", minimum=1)
            }
            for name, default in _QUEUE_LIMIT_DEFAULTS.items():
                given = opts.get(name)
                limit[name] = (
                    default
                    if given is None
                    else self.duration(given, f"{sub}.{name}", allow_zero=name == "release_after")
                )
            if limit["expire_after"] < MIN_SLOT_LEASE:
                raise self.lease_error(f"{sub}.expire_after", opts["expire_after"])
            out[q] = limit
        return out

    def lease_error(self, key: str, given: object) -> ConfigError:
        return self.fail(
            key,
            f"must be at least {MIN_SLOT_LEASE:g}s (the lease of a running job's slot, "
            f"renewed every third of it), got {given!r}",
        )

    def groups(self, value: object, key: str) -> dict[str, Any]:
        """A connection's per-group limits: ``{"concurrency": 2, "rate": "100/m"}`` ->
        ``{"concurrency": 2 or None, "rate": (100, 60.0) or None, "expire_after": 30.0}``
        (``expire_after``: the lease of a concurrency slot, after which a crashed
        worker's slot frees itself)."""
        raw = self.mapping(value, key)
        self.unknown(raw, {"concurrency", "rate", "expire_after"}, key)
        expire = raw.get("expire_after")
        expire_after = (
            30.0
            if expire is None
            else self.duration(expire, f"{key}.expire_after", allow_zero=False)
        )
        if expire_after < MIN_SLOT_LEASE:
            raise self.lease_error(f"{key}.expire_after", expire)
        concurrency = raw.get("concurrency")
        if concurrency is not None:
            concurrency = self.integer(concurrency, f"{key}.concurrency", minimum=1)
        rate = raw.get("rate")
        if rate is not None:
            match = _RATE.match(rate) if isinstance(rate, str) else None
            if match is None:
                raise self.fail(
                    f"{key}.rate",
                    f'expected jobs per period of one group, such as "100/m" (s, m, h or d), '
                    f"got {rate!r}",
                )
            rate = (int(match.group(1)), _RATE_UNITS[match.group(2)])
        return {"concurrency": concurrency, "rate": rate, "expire_after": expire_after}

    def names(self, value: object, key: str) -> list[str]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)) or not value:
            raise self.fail(key, f"expected a non-empty list of names, got {value!r}")
        return [self.name(v, f"{key}[{i}]") for i, v in enumerate(value)]

    def unknown(self, raw: Mapping[str, Any], allowed: set[str], key: str) -> None:
        for k in raw:
            if k not in allowed:
                hint = ", ".join(sorted(allowed))
                raise self.fail(f"{key}.{k}", f"unknown option; allowed here: {hint}")


#: A per-queue concurrency limit's other options (``"queues": {"emails": {"concurrency":
#: 5}}``): the released job's wait, and the lease after which a crashed worker's slot
#: frees itself (renewed while the job runs, so a short lease costs a renewal per third).
_QUEUE_LIMIT_DEFAULTS = {"release_after": 1.0, "expire_after": 60.0}

#: The options every queue driver takes besides those its class declares
#: (``DeclaresOptions``); a dispatch-only connection (``failover``) takes ``driver`` only.
COMMON_QUEUE_OPTIONS = {
    "driver": "str",
    "max_message_size": "int",
    "concurrency": "int",
    "queues": "queues",
    "offload": "offload",
}


def declared_schema(
    v: Checks, driver: str, common: dict[str, str], key: str, lookup: Callable[..., Any]
) -> dict[str, str] | None:
    """The options ``driver`` takes: ``common`` and those its class declares. ``lookup``
    (``driver_class``/``store_class``) also refuses a name nothing provides. None when
    the class needs a client this install lacks: the connection's first use names the
    extra to install, as it would without a config check."""
    try:
        found = lookup(driver, source=v.source, key=f"{key}.driver")
    except MissingDependencyError:
        return None
    if isinstance(found, type) and issubclass(found, DispatchOnly):
        common = {"driver": "str"}
    declared = found.options if isinstance(found, DeclaresOptions) else {}
    return {**common, **declared}


def check_options(
    v: Checks, raw: dict[str, Any], schema: dict[str, str], key: str
) -> dict[str, Any]:
    v.unknown(raw, set(schema), key)
    out: dict[str, Any] = {}
    for k, value in raw.items():
        kind = schema[k]
        sub = f"{key}.{k}"
        if value is None:
            out[k] = None
            continue
        if kind == "str":
            out[k] = v.string(value, sub)
        elif kind == "int":
            out[k] = v.integer(value, sub, minimum=1)
        elif kind == "names":
            out[k] = v.names(value, sub)
        elif kind == "queues":
            out[k] = v.queue_names(value, sub)
        elif kind == "duration":
            out[k] = v.duration(value, sub)
        elif kind == "ident":
            out[k] = v.identifier(value, sub)
        elif kind == "bool":
            out[k] = v.boolean(value, sub)
        elif kind == "dict":
            out[k] = v.mapping(value, sub)
        elif kind == "offload":
            out[k] = offload_option(v, value, sub)
        elif kind == "groups":
            out[k] = v.groups(value, sub)
        else:  # pragma: no cover - schema typo
            raise AssertionError(kind)
    return out


def offload_option(v: Checks, value: object, key: str) -> dict[str, Any]:
    """``{"to": url, "over": size}``: ``to`` names a store whose scheme is known here,
    ``over`` is bytes or a size such as ``"192KiB"`` (None: the driver's cap)."""
    raw = v.mapping(value, key, required=True)
    v.unknown(raw, {"to", "over"}, key)
    to = raw.get("to")
    problem = url_error(to)
    if problem is not None:
        raise v.fail(f"{key}.to", problem)
    assert isinstance(to, str)
    scheme = urlsplit(to).scheme
    if scheme not in OBJECT_STORES.names():
        known = ", ".join(f"{name}://" for name in OBJECT_STORES.names())
        raise v.fail(
            f"{key}.to",
            f"no object store handles {scheme}:// here (known: {known}); r2:// needs "
            "haze-jobs[cloudflare]",
        )
    object_store(to, source=v.source, key=f"{key}.to")  # the store checks the rest of its URL
    over = raw.get("over")
    if over is None:
        return {"to": to, "over": None}
    if isinstance(over, int) and not isinstance(over, bool) and over >= 1:
        return {"to": to, "over": over}
    if isinstance(over, str):
        try:
            return {"to": to, "over": parse_size(over, f"{key}.over")}
        except ValueError as e:
            raise v.fail(f"{key}.over", str(e)) from None
    raise v.fail(f"{key}.over", f'expected bytes or a size such as "192KiB", got {over!r}')
