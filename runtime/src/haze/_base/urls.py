"""URLs as errors, log lines and pages may show them: without their credentials.

A database or Redis URL can carry a secret in three places: the password of the
userinfo (``postgresql://user:pass@``, ``redis://:pass@``), the whole userinfo (a token
used as the user name, ``http://TOKEN@host``), and a query option (``?authToken=``,
``?password=``, ``?sslpassword=``). ``redact_url`` masks all three; it never raises, so
it can word the error about a URL it cannot parse.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

__all__ = ["redact_text", "redact_url", "redis_url_problem"]

#: a query option whose name contains one of these carries a secret
_SECRET_WORDS = ("pass", "pwd", "token", "secret", "key", "auth", "sig", "credential")
_MASK = "***"


def _secret(option: str) -> bool:
    name = option.lower()
    return any(word in name for word in _SECRET_WORDS)


def redact_url(url: str, *, keep_user: bool = True) -> str:
    """``url`` with its password and secret query options replaced by ``***``.

    ``keep_user=False`` masks the whole userinfo, user name too: for URLs whose user
    name may be a token (libSQL over HTTP).
    """
    masked = _mask_ambiguous_userinfo(url)
    try:
        parts = urlsplit(masked)
    except ValueError:  # shown masked when nothing is left that could hold a secret
        return masked if masked != url and "?" not in masked else "<unparseable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user, has_password, _ = userinfo.partition(":")
        if not keep_user and userinfo:
            userinfo = _MASK
        elif has_password:
            userinfo = f"{user}:{_MASK}"
        netloc = f"{userinfo}@{host}"
    query = parts.query
    if query:
        query = "&".join(
            f"{k}={_MASK if _secret(k) else quote(v, safe='/:,')}"
            for k, v in parse_qsl(query, keep_blank_values=True)
        )
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _mask_ambiguous_userinfo(url: str) -> str:
    """``url`` with all it holds before its last ``@`` masked, when a parser could end the
    host before that ``@``: an unescaped ``/``, ``?`` or ``#`` in a password (libpq reads
    ``postgresql://u:pa#ss@h/db`` as written), or a URL that does not parse at all. The
    host is then shown without knowing where the password ended, so all of it goes."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    try:
        if "@" in urlsplit(url).netloc:
            return url
    except ValueError:
        pass
    return f"{scheme}://{_MASK}@{rest.rsplit('@', 1)[1]}"


def redact_text(text: str, url: str) -> str:
    """``text`` (a parser's own error about ``url``) with ``url`` masked and without its
    password, whole or in the pieces a parser may cut it into at ``/``, ``?`` or ``#``."""
    if url in text:
        text = text.replace(url, redact_url(url))
    _, sep, rest = url.partition("://")
    _, colon, password = rest.rsplit("@", 1)[0].partition(":") if "@" in rest else ("", "", "")
    if not (sep and colon):
        return text
    for piece in sorted({password, *re.split(r"[/?#]", password)}, key=len, reverse=True):
        if len(piece) >= 3 and piece in text:  # a shorter piece would mask unrelated words
            text = text.replace(piece, _MASK)
    return text


def redis_url_problem(url: str) -> str | None:
    """What redis-py would take from ``url`` in silence or choke on later, if anything:
    a database path that is not a number (``/abc`` was database 0)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # redis-py's own parse names it
        return None
    if parts.scheme not in ("redis", "rediss"):
        return None
    database = parts.path.strip("/")
    if database and not (database.isascii() and database.isdigit()):
        return (
            f"{redact_url(url)!r}: the path names the database, a number such as /0, "
            f"got /{database[:40]}"
        )
    return None
