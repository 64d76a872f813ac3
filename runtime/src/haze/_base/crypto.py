"""Payload encryption for ``encrypted=True`` jobs: AES-256-GCM keyed by the app key.

The key comes from ``App(key=...)`` or ``APP_KEY`` (``base64:<32 bytes>`` as Laravel
writes it, or any passphrase, hashed with SHA-256). ``APP_PREVIOUS_KEYS`` (comma
separated) lets workers read messages written before a key rotation.

Every copy of such a payload that haze writes is encrypted: the message itself
(``enc``), a chain link or callback carrying the job (``{"job", "enc"}`` in place of
``payload``: the rest of a chain, a chain's ``catch``, a batch's callbacks in its store
record, a batch inside a chain), the failed-job record, and the after-commit buffer.
So is what the job's run reveals of it: the failed record's exception text and
traceback (``meta.failed_exception`` of the stored body; the record's ``exception``
says only ``<Type> (encrypted)``), and the status record's progress, result and error
(``sealed``). Its unique, debounce and middleware keys hold a keyed hash of the key
function's value.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from typing import TYPE_CHECKING, Any, Protocol

from haze._base.deps import require
from haze._base.errors import ConfigError, MessageDecodeError
from haze._base.message import encode_payload, envelope_of

if TYPE_CHECKING:
    from haze._base.message import FailedJob, Message


class Keyed(Protocol):
    """What encryption reads of an App: its key and the keys it replaced."""

    @property
    def key(self) -> str | None: ...
    @property
    def previous_keys(self) -> str | None: ...


__all__ = [
    "check_keys",
    "decrypt_payload",
    "encrypt_payload",
    "failed_is_encrypted",
    "generate_key",
    "keyed_digest",
    "open_failed",
    "seal",
    "seal_link",
    "sealed_error",
    "unseal",
    "unseal_link",
]


def generate_key() -> str:
    """A new random key in the ``base64:`` form for ``APP_KEY``."""
    return "base64:" + base64.b64encode(os.urandom(32)).decode()


#: The shortest passphrase taken as a key (a ``base64:`` key is 32 random bytes).
MIN_PASSPHRASE = 16


def _material(key: str, variable: str = "APP_KEY") -> bytes:
    """The 32 bytes of ``key``; ``ConfigError`` naming ``variable`` (never the key: it is
    a secret) when it is not a usable key."""
    fix = "haze.crypto.generate_key() makes one"
    if key != key.strip():
        # ' base64:…' would be hashed as a passphrase: another key than the one meant
        raise ConfigError(
            "the key has whitespace before or after it (a space after '=', a newline read "
            "from a file); remove it",
            key=variable,
        )
    try:
        text = key.encode("utf-8")
    except UnicodeEncodeError:
        # a byte that is not UTF-8 in the environment arrives as a lone surrogate
        raise ConfigError(
            f"the key is not UTF-8 text (a stray byte in the environment?); {fix}",
            key=variable,
        ) from None
    if key.startswith("base64:"):
        try:
            raw = base64.b64decode(key[7:], validate=True)
        except ValueError:
            raise ConfigError(
                f"the text after 'base64:' is not valid base64 ({fix})", key=variable
            ) from None
        if len(raw) != 32:
            raise ConfigError(
                f"a base64 key must decode to 32 bytes, got {len(raw)} ({fix})",
                key=variable,
            )
        return raw
    if len(key) < MIN_PASSPHRASE:
        raise ConfigError(
            f"a passphrase key needs at least {MIN_PASSPHRASE} characters, got "
            f"{len(key)} (or use a 'base64:' key: {fix})",
            key=variable,
        )
    return hashlib.sha256(text).digest()


def _previous(keys: str | None) -> list[str]:
    return [k.strip() for k in (keys or "").split(",") if k.strip()]


def check_keys(key: str | None, variable: str = "APP_KEY", previous: str | None = None) -> None:
    """Raise ``ConfigError`` naming the variable when the app key (``variable`` says where
    it came from) or one of ``previous`` (``APP_PREVIOUS_KEYS``) is not a usable key:
    checked when an app with encrypted jobs starts, instead of at each job."""
    if key:
        _material(key, variable)
    for old in _previous(previous):
        _material(old, "APP_PREVIOUS_KEYS")


def _aesgcm() -> Any:
    aead = require(
        "cryptography.hazmat.primitives.ciphers.aead", what="encrypted jobs", extra="encryption"
    )
    return aead.AESGCM


def _keys(app: Keyed) -> list[bytes]:
    key = app.key
    if not key:
        raise ConfigError(
            "encrypted jobs need an app key: set APP_KEY (haze.crypto.generate_key() makes one) "
            "or pass App(key=...)",
            key="APP_KEY",
        )
    old = _previous(app.previous_keys)
    return [_material(key), *(_material(k, "APP_PREVIOUS_KEYS") for k in old)]


def seal(app: Keyed, value: Any, context: str) -> str:
    """``value`` as JSON, encrypted with the app key: base64 of nonce + ciphertext.

    ``context`` is authenticated with it (AES-GCM associated data): :func:`unseal`
    needs the same one, so a sealed value cannot be moved to another message or link.
    """
    data = json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    return _seal_bytes(app, data, context)


def _seal_payload(app: Keyed, payload: Any, context: str) -> str:
    """:func:`seal` of a job's payload, refused as a plain job's is (``TypeError`` naming
    the path JSON cannot carry, a lone surrogate included) before it is encrypted."""
    return _seal_bytes(app, encode_payload(payload).encode("utf-8"), context)


def _seal_bytes(app: Keyed, data: bytes, context: str) -> str:
    aes = _aesgcm()(_keys(app)[0])
    nonce = os.urandom(12)
    return base64.b64encode(nonce + aes.encrypt(nonce, data, context.encode())).decode()


def unseal(app: Keyed, blob: object, context: str, what: str) -> Any:
    """The value :func:`seal` encrypted; tries the current key, then the previous ones.

    ``what`` names the value in the ``MessageDecodeError`` raised when it cannot be read.
    """
    cls = _aesgcm()
    try:
        if not isinstance(blob, str):
            raise ValueError
        raw = base64.b64decode(blob, validate=True)
    except ValueError:
        raise MessageDecodeError(f"the encrypted payload of {what} is not base64") from None
    nonce, ct = raw[:12], raw[12:]
    for k in _keys(app):
        try:
            plain = cls(k).decrypt(nonce, ct, context.encode())
        except Exception:
            continue
        return _strict_json(plain, what)
    raise MessageDecodeError(
        f"cannot decrypt the payload of {what} with APP_KEY or APP_PREVIOUS_KEYS; if the key "
        "was rotated, add the old key to APP_PREVIOUS_KEYS"
    )


class _NotJsonToken(ValueError):
    pass


def _refuse_token(token: str) -> Any:
    raise _NotJsonToken(token)


def _strict_json(plain: bytes, what: str) -> Any:
    """The decrypted JSON, read as strictly as a plain message's body (no ``NaN`` or
    ``Infinity``: haze never writes them). The error names no field: the payload's keys
    are its plaintext too, and this error is stored in the clear."""
    try:
        return json.loads(plain, parse_constant=_refuse_token)
    except _NotJsonToken as e:
        raise MessageDecodeError(
            f"the decrypted payload of {what} holds {e}, which is not JSON (haze messages "
            "are strict JSON; its producer must send null or a string instead)"
        ) from None
    except (ValueError, RecursionError):
        raise MessageDecodeError(
            f"the payload of {what} decrypts with the app key but is not JSON (a producer "
            "sealed something else)"
        ) from None


def encrypt_payload(app: Keyed, message: Message, payload: str | None = None) -> None:
    """Replace ``message.payload`` by ``message.enc`` (nonce + ciphertext, base64);
    ``payload`` is its JSON when the caller has it already (``encode_payload``)."""
    if payload is None:
        message.enc = _seal_payload(app, message.payload, message.id)
    else:
        message.enc = _seal_bytes(app, payload.encode("utf-8"), message.id)
    message.payload = None


def decrypt_payload(app: Keyed, message: Message) -> Any:
    """The decrypted payload; tries the current key, then the previous ones."""
    assert message.enc is not None
    return unseal(app, message.enc, message.id, f'job "{message.job}" ({message.id})')


def _link_context(job: str) -> str:
    return f"haze:link:{job}"


def seal_link(app: Keyed, link: dict[str, Any]) -> dict[str, Any]:
    """A chain link or callback ``{"job", "payload", ...}`` with ``enc`` in place of
    ``payload`` (done when the job is ``encrypted``: the link is stored with the chain,
    the batch or the failed job)."""
    sealed = {k: v for k, v in link.items() if k != "payload"}
    sealed["enc"] = _seal_payload(app, link.get("payload"), _link_context(str(link["job"])))
    return sealed


def unseal_link(app: Keyed, link: dict[str, Any]) -> Any:
    """The payload of a link made by :func:`seal_link`."""
    job = str(link.get("job"))
    return unseal(app, link["enc"], _link_context(job), f'a chain link or callback of job "{job}"')


def keyed_digest(app: Keyed, text: str) -> str:
    """A keyed hash of ``text`` (HMAC-SHA256 with the app key, 32 hex characters): equal
    texts give equal digests in every process with that key, and the text cannot be read
    back. Used for the lock keys of encrypted jobs."""
    mac = hmac.new(_keys(app)[0], b"haze:key:" + text.encode(), hashlib.sha256)
    return mac.hexdigest()[:32]


def _failure_context(job_id: str) -> str:
    return f"haze:failed:{job_id}"


def sealed_error(error: BaseException) -> str:
    """What an encrypted job's failure shows where it is not encrypted (the failed
    record's ``exception``, the worker's log line): the exception type only."""
    return f"{type(error).__name__} (encrypted)"


def seal_failure(app: Keyed, job_id: str, text: str) -> str:
    """An encrypted job's exception text and traceback, for its failed record."""
    return seal(app, text, _failure_context(job_id))


def failed_is_encrypted(job: FailedJob) -> bool:
    """Whether a failed record holds an encrypted payload or exception."""
    data = envelope_of(job.body) if job.body else None
    if data is None:
        return False
    meta = data.get("meta")
    return data.get("enc") is not None or (isinstance(meta, dict) and "failed_exception" in meta)


def open_failed(app: Keyed, job: FailedJob) -> tuple[Any, str]:
    """``(payload, exception)`` of a failed record, decrypted with the app key when the
    job was encrypted (raises ``MessageDecodeError`` when no key opens them)."""
    data = envelope_of(job.body) if job.body else None
    if data is None:
        return job.payload, job.exception
    payload = job.payload
    if data.get("enc") is not None:
        what = f'job "{job.name}" ({job.id})'
        payload = unseal(app, data["enc"], str(data.get("id")), what)
    meta = data.get("meta")
    sealed = meta.get("failed_exception") if isinstance(meta, dict) else None
    if sealed is None:
        return payload, job.exception
    text = unseal(app, sealed, _failure_context(job.id), f'the exception of job "{job.name}"')
    return payload, str(text)
