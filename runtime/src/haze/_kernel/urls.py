"""URLs as errors, log lines and pages may show them: without their credentials.

A database or Redis URL can carry a secret in three places: the password of the
userinfo (``postgresql://user:pass@``, ``redis://:pass@``), the whole userinfo (a token
used as the user name, ``http://TOKEN@host``), and a query option (``?authToken=``,
``?password=``, ``?sslpassword=``). ``redact_url`` masks all three; it never raises, so
it can word the error about a URL it cannot parse.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

__all__ = ["redact_url"]

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
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
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
