"""The ``options`` of a SQL connection, checked against what its client takes."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from haze._base.errors import ConfigError
from haze._base.hints import did_you_mean

__all__ = [
    "check_client_options",
    "check_server_encoding",
    "check_utf8",
    "connect_refusal",
]

#: what a PostgreSQL server answers a UTF8 client of a database it cannot convert for
_UNCONVERTIBLE = re.compile(r"conversion between UTF8 and (\w+) is not supported")


def check_client_options(
    options: Mapping[str, Any], known: Iterable[str], *, key: str, client: str
) -> None:
    """Refuse an option the database client's connect() does not take, in one line, at
    start (the client's own TypeError came at the first statement, as a traceback)."""
    names = set(known)
    for option in options:
        if option not in names:
            raise ConfigError(
                f"{client} takes no connection option {option!r}"
                f"{did_you_mean(str(option), names)}; these keys are passed to it as they are",
                key=f"{key}.{option}",
            )


def check_utf8(
    value: Any, accepted: Iterable[str], *, setting: str, connection: str, client: str
) -> None:
    """Refuse a client encoding ``setting`` that cannot carry every character: haze's
    tables hold payloads and error messages of any language, and such a connection
    failed at the first character it lacks (an emoji), mid-dispatch, as a raw error."""
    if value is None or str(value).replace("-", "").replace("_", "").upper() in accepted:
        return
    raise ConfigError(
        f"{client} connection {connection!r} sets {setting} {value!r}: haze keeps text of "
        f"any language in its tables and needs {' or '.join(accepted).lower()}; remove "
        "the setting",
        key=f"connections.{connection}",
    )


def check_server_encoding(encoding: str | None, dbname: str, connection: str) -> None:
    """Refuse a PostgreSQL database whose encoding cannot hold every character (UTF-8
    text the server converts to LATIN1 fails on an emoji); SQL_ASCII keeps the bytes."""
    if encoding in (None, "UTF8", "SQL_ASCII"):
        return
    raise ConfigError(
        f"PostgreSQL database {dbname!r} (connection {connection!r}) stores text as "
        f"{encoding}, which cannot hold every character a job's payload or error may "
        "carry: give haze a UTF8 database (CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE "
        "template0)",
        key=f"connections.{connection}.url",
    )


def connect_refusal(error: BaseException, dbname: str | None, connection: str) -> str:
    """The first line of a failed PostgreSQL connect; a database whose encoding the
    server cannot convert to UTF8 (MULE_INTERNAL) refuses the connection itself, and is
    refused here like a LATIN1 one (not as a server that may be down)."""
    text = str(error).strip()
    if found := _UNCONVERTIBLE.search(text):
        check_server_encoding(found.group(1), str(dbname), connection)
    return text.splitlines()[0] if text else type(error).__name__
