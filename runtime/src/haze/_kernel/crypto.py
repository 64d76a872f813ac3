"""Payload encryption for ``encrypted=True`` jobs: AES-256-GCM keyed by the app key.

The key comes from ``App(key=...)`` or ``APP_KEY`` (``base64:<32 bytes>`` as Laravel
writes it, or any passphrase, hashed with SHA-256). ``APP_PREVIOUS_KEYS`` (comma
separated) lets workers read messages written before a key rotation.

Every copy of such a payload that haze writes is encrypted: the message itself
(``enc``), a chain link or callback carrying the job (``{"job", "enc"}`` in place of
``payload``: the rest of a chain, a chain's ``catch``, a batch's callbacks in its store
record, a batch inside a chain), the failed-job record, and the after-commit buffer.
Its unique and debounce lock keys hold a keyed hash of the key function's value.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from typing import TYPE_CHECKING, Any

from haze._kernel.deps import require
from haze._kernel.errors import ConfigError, MessageDecodeError

if TYPE_CHECKING:
    from haze._app.app import App
    from haze._kernel.message import Message

__all__ = [
    "decrypt_payload",
    "encrypt_payload",
    "generate_key",
    "keyed_digest",
    "seal",
    "seal_link",
    "unseal",
    "unseal_link",
]


def generate_key() -> str:
    """A new random key in the ``base64:`` form for ``APP_KEY``."""
    return "base64:" + base64.b64encode(os.urandom(32)).decode()


def _material(key: str) -> bytes:
    if key.startswith("base64:"):
        raw = base64.b64decode(key[7:])
        if len(raw) != 32:
            raise ConfigError(f"APP_KEY: a base64 key must decode to 32 bytes, got {len(raw)}")
        return raw
    return hashlib.sha256(key.encode()).digest()


def _aesgcm() -> Any:
    aead = require(
        "cryptography.hazmat.primitives.ciphers.aead", what="encrypted jobs", extra="encryption"
    )
    return aead.AESGCM


def _keys(app: App) -> list[bytes]:
    key = app.key
    if not key:
        raise ConfigError(
            "encrypted jobs need an app key: set APP_KEY (haze.crypto.generate_key() makes one) "
            "or pass App(key=...)",
            key="APP_KEY",
        )
    previous = [k.strip() for k in os.environ.get("APP_PREVIOUS_KEYS", "").split(",") if k.strip()]
    return [_material(k) for k in [key, *previous]]


def seal(app: App, value: Any, context: str) -> str:
    """``value`` as JSON, encrypted with the app key: base64 of nonce + ciphertext.

    ``context`` is authenticated with it (AES-GCM associated data): :func:`unseal`
    needs the same one, so a sealed value cannot be moved to another message or link.
    """
    aes = _aesgcm()(_keys(app)[0])
    nonce = os.urandom(12)
    data = json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    return base64.b64encode(nonce + aes.encrypt(nonce, data, context.encode())).decode()


def unseal(app: App, blob: object, context: str, what: str) -> Any:
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
            return json.loads(cls(k).decrypt(nonce, ct, context.encode()))
        except Exception:
            continue
    raise MessageDecodeError(
        f"cannot decrypt the payload of {what} with APP_KEY or APP_PREVIOUS_KEYS; if the key "
        "was rotated, add the old key to APP_PREVIOUS_KEYS"
    )


def encrypt_payload(app: App, message: Message) -> None:
    """Replace ``message.payload`` by ``message.enc`` (nonce + ciphertext, base64)."""
    message.enc = seal(app, message.payload, message.id)
    message.payload = None


def decrypt_payload(app: App, message: Message) -> Any:
    """The decrypted payload; tries the current key, then the previous ones."""
    assert message.enc is not None
    return unseal(app, message.enc, message.id, f'job "{message.job}" ({message.id})')


def _link_context(job: str) -> str:
    return f"haze:link:{job}"


def seal_link(app: App, link: dict[str, Any]) -> dict[str, Any]:
    """A chain link or callback ``{"job", "payload", ...}`` with ``enc`` in place of
    ``payload`` (done when the job is ``encrypted``: the link is stored with the chain,
    the batch or the failed job)."""
    sealed = {k: v for k, v in link.items() if k != "payload"}
    sealed["enc"] = seal(app, link.get("payload"), _link_context(str(link["job"])))
    return sealed


def unseal_link(app: App, link: dict[str, Any]) -> Any:
    """The payload of a link made by :func:`seal_link`."""
    job = str(link.get("job"))
    return unseal(app, link["enc"], _link_context(job), f'a chain link or callback of job "{job}"')


def keyed_digest(app: App, text: str) -> str:
    """A keyed hash of ``text`` (HMAC-SHA256 with the app key, 32 hex characters): equal
    texts give equal digests in every process with that key, and the text cannot be read
    back. Used for the lock keys of encrypted jobs."""
    mac = hmac.new(_keys(app)[0], b"haze:key:" + text.encode(), hashlib.sha256)
    return mac.hexdigest()[:32]
