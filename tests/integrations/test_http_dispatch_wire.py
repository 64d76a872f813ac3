"""HTTP dispatch on the wire: a real uvicorn process serving ``DispatchApp``, spoken to
over raw sockets, so that a request can declare a body it never sends.

The endpoint decides from the headers first: credentials (a bearer token, or the
timestamp half of a signed request), then the declared ``Content-Length``, and reads a
body only under the limit. An unauthenticated client can make the server read nothing,
and a client that declares a huge body gets 413 at once instead of a hung connection.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from haze.integrations.http_dispatch import signed_headers

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX server process"),
]

SECRET = "wire-secret-for-tests"
LIMIT = 64 * 1024
#: HAZE_HTTP_BODY_TIMEOUT of the test server: short, so a stalled body is answered fast.
BODY_TIMEOUT = 2

APP = """\
    from haze import App, define_job, define_queue_config
    from haze.integrations.http_dispatch import DispatchApp

    @define_job(name="wire_ok")
    async def wire_ok(payload: dict) -> None:
        if "mark" in payload:  # the sync driver runs it inside the request: a trace of it
            with open("marks.txt", "a") as f:
                f.write(payload["mark"] + " ")

    haze_app = App(queue=define_queue_config(default="s", connections={"s": {"driver": "sync"}}))
    app = DispatchApp(haze_app)
    """


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("wire")


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[int]:
    (root / "wire_app.py").write_text(textwrap.dedent(APP))
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "HAZE_"))}
    env.update(
        HAZE_HTTP_SECRET=SECRET,
        HAZE_HTTP_MAX_BODY=str(LIMIT),
        HAZE_HTTP_BODY_TIMEOUT=f"{BODY_TIMEOUT}s",
        PYTHONPATH=str(root),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "wire_app:app", "--port", str(port)],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, "uvicorn exited"
                assert time.monotonic() < deadline, "uvicorn did not start in 60 s"
                time.sleep(0.1)
        yield port
    finally:
        proc.kill()
        proc.wait(timeout=30)


def request(port: int, headers: dict[str, str], body: bytes = b"") -> tuple[int, str]:
    """Send a POST's head (and ``body``, which may be shorter than the Content-Length it
    declares) and read the status line and body of the answer, within 10 s."""
    head = "POST /dispatch HTTP/1.1\r\nHost: haze.test\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head.encode() + body)
        answer = b""
        while b"\r\n\r\n" not in answer or not _complete(answer):
            chunk = s.recv(65536)  # socket.timeout here: the server is still reading
            if not chunk:
                break
            answer += chunk
    status_line, _, rest = answer.decode("latin-1").partition("\r\n")
    return int(status_line.split()[1]), rest.partition("\r\n\r\n")[2]


def _complete(answer: bytes) -> bool:
    head, _, body = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return True


BODY = json.dumps({"job": "wire_ok", "payload": {"n": 1}}).encode()
BEARER = {"Authorization": f"Bearer {SECRET}"}


def test_a_small_authenticated_request_is_dispatched(server: int) -> None:
    status, body = request(server, {**BEARER, "Content-Length": str(len(BODY))}, BODY)
    assert status == 202, body


def test_an_unauthenticated_big_body_gets_401_without_being_read(server: int) -> None:
    status, body = request(server, {"Content-Length": str(60_000_000)}, b"x" * 4096)
    assert status == 401, body
    assert "authentication required" in json.loads(body)["error"]


def test_a_wrong_bearer_with_a_big_body_gets_403_without_being_read(server: int) -> None:
    headers = {"Authorization": "Bearer nope", "Content-Length": str(60_000_000)}
    status, _ = request(server, headers, b"x" * 4096)
    assert status == 403


def test_a_stale_signature_with_a_big_body_gets_401_without_being_read(server: int) -> None:
    stale = signed_headers(b"", SECRET, timestamp=int(time.time()) - 3600)
    status, body = request(server, {**stale, "Content-Length": str(60_000_000)}, b"x" * 10)
    assert status == 401 and "X-Haze-Timestamp" in json.loads(body)["error"]


@pytest.mark.parametrize("auth", ["bearer", "signed"])
def test_an_over_limit_content_length_gets_413_at_once(server: int, auth: str) -> None:
    headers = BEARER if auth == "bearer" else signed_headers(b"unsent", SECRET)
    status, body = request(server, {**headers, "Content-Length": "999999999999"})
    assert status == 413, body
    assert f"{LIMIT}-byte limit" in json.loads(body)["error"]


def test_a_chunked_body_past_the_limit_gets_413(server: int) -> None:
    chunk = b"x" * 8192
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(LIMIT // 8192 + 2))
    status, answer = request(server, {**BEARER, "Transfer-Encoding": "chunked"}, body)
    assert status == 413, answer


def test_a_signed_request_is_still_checked_against_its_body(server: int) -> None:
    headers = signed_headers(BODY, SECRET)
    ok, _ = request(server, {**headers, "Content-Length": str(len(BODY))}, BODY)
    assert ok == 202
    other = BODY.replace(b'"n": 1', b'"n": 2')
    forged, answer = request(server, {**headers, "Content-Length": str(len(other))}, other)
    assert forged == 403, answer


@pytest.mark.parametrize("auth", ["bearer", "forged signature"])
def test_a_body_that_stops_arriving_gets_408_instead_of_a_hung_connection(
    server: int, auth: str
) -> None:
    # A slowloris client: the head declares 100 bytes, 10 arrive, then nothing. A forged
    # signature passes the header check (its HMAC needs the body), so without a deadline
    # on the body an unauthenticated client could hold connections open for ever.
    headers = (
        BEARER
        if auth == "bearer"
        else {"X-Haze-Timestamp": str(int(time.time())), "X-Haze-Signature": "sha256=00"}
    )
    status, answer = request(server, {**headers, "Content-Length": "100"}, BODY[:10])
    assert status == 408, answer
    assert "HAZE_HTTP_BODY_TIMEOUT" in json.loads(answer)["error"]


def test_a_body_cut_off_by_a_disconnect_is_not_dispatched(server: int, root: Path) -> None:
    # The client declares 200 bytes and hangs up after a complete JSON object: it saw no
    # answer, so it will send again; the part that arrived must not be dispatched.
    cut = json.dumps({"job": "wire_ok", "payload": {"mark": "cut"}}).encode()
    head = "POST /dispatch HTTP/1.1\r\nHost: haze.test\r\nContent-Length: 200\r\n"
    head += f"Authorization: Bearer {SECRET}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server), timeout=10) as s:
        s.sendall(head.encode() + cut)
        # Let the server hand the bytes to the app before the hang-up: a disconnect that
        # comes first drops them in uvicorn already (then this test cannot fail).
        time.sleep(0.5)
    whole = json.dumps({"job": "wire_ok", "payload": {"mark": "whole"}}).encode()
    status, answer = request(server, {**BEARER, "Content-Length": str(len(whole))}, whole)
    assert status == 202, answer
    marks = (root / "marks.txt").read_text().split()
    assert marks == ["whole"]
