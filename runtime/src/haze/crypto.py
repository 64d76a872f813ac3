"""Payload encryption for ``encrypted=True`` jobs: AES-256-GCM keyed by the app key.

The key comes from ``App(key=...)`` or ``APP_KEY`` (``base64:<32 bytes>`` as Laravel
writes it, or any passphrase, hashed with SHA-256). ``APP_PREVIOUS_KEYS`` (comma
separated) lets workers read messages written before a key rotation.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from typing import TYPE_CHECKING, Any

from ._deps import require
from .errors import ConfigError, MessageDecodeError

if TYPE_CHECKING:
    from .app import App
    from .message import Message

__all__ = ["decrypt_payload", "encrypt_payload", "generate_key"]


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


def encrypt_payload(app: App, message: Message) -> None:
    """Replace ``message.payload`` by ``message.enc`` (nonce + ciphertext, base64)."""
    aes = _aesgcm()(_keys(app)[0])
    nonce = os.urandom(12)
    data = json.dumps(message.payload, separators=(",", ":"), allow_nan=False).encode()
    ct = aes.encrypt(nonce, data, message.id.encode())
    message.enc = base64.b64encode(nonce + ct).decode()
    message.payload = None


def decrypt_payload(app: App, message: Message) -> Any:
    """The decrypted payload; tries the current key, then the previous ones."""
    assert message.enc is not None
    cls = _aesgcm()
    try:
        blob = base64.b64decode(message.enc)
    except ValueError:
        raise MessageDecodeError(f"encrypted payload of job {message.id} is not base64") from None
    nonce, ct = blob[:12], blob[12:]
    for k in _keys(app):
        try:
            return json.loads(cls(k).decrypt(nonce, ct, message.id.encode()))
        except Exception:
            continue
    raise MessageDecodeError(
        f'cannot decrypt the payload of job "{message.job}" ({message.id}) with APP_KEY or '
        "APP_PREVIOUS_KEYS; if the key was rotated, add the old key to APP_PREVIOUS_KEYS"
    )
