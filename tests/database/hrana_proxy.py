"""A small HTTP proxy in front of a real ``sqld`` that misbehaves on purpose.

sqld cannot be told to stall its writes or to answer ``SQLITE_BUSY`` to a plain
statement, so the tests put this proxy between haze and the server: every Hrana
request goes through ``rule(statements)``, which says what to do with it:

- ``"forward"``: send it to sqld and hand back sqld's answer, unchanged;
- ``"stall"``: never answer (the connection stays open until ``release()`` or the
  proxy stops), as a stuck sqld that still accepts connections does;
- ``("answer", status, body)``: answer that instead of sqld (``busy_answer`` is the
  answer sqld itself gives to a statement that found the database locked);
- ``("late", status, seconds)``: answer ``status`` now (a gateway's 504, say) and send
  the request on to sqld ``seconds`` later, as a gateway that timed out waiting for its
  upstream (which runs it still) does.

``statements`` is the list of SQL texts of the request (batch steps included).

    with HranaProxy(server.url, rule) as proxy:
        proxy.url  # "http://127.0.0.1:<port>"
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

__all__ = ["WRITES", "HranaProxy", "busy_answer", "is_write", "statements_of"]

Rule = Callable[[list[str]], Any]
#: the first word of a statement that writes (or takes the write lock)
WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "BEGIN")


def statements_of(body: dict[str, Any]) -> list[str]:
    """The SQL texts of a Hrana pipeline request body, in order."""
    out: list[str] = []
    for request in body.get("requests") or []:
        if request.get("type") == "execute":
            out.append(str(request["stmt"]["sql"]))
        elif request.get("type") == "batch":
            out.extend(str(step["stmt"]["sql"]) for step in request["batch"]["steps"])
    return out


def is_write(statements: list[str]) -> bool:
    return any(s.lstrip().upper().startswith(WRITES) for s in statements)


def busy_answer(body: dict[str, Any]) -> tuple[str, int, dict[str, Any]]:
    """What sqld answers when the first statement of ``body`` found the database locked."""
    error = {"message": "SQLite error: database is locked", "code": "SQLITE_BUSY"}
    results: list[dict[str, Any]] = []
    for request in body.get("requests") or []:
        if request.get("type") == "execute":
            results.append({"type": "error", "error": error})
        elif request.get("type") == "batch":
            steps = request["batch"]["steps"]
            result = {
                "step_results": [None] * len(steps),
                "step_errors": [error] + [None] * (len(steps) - 1),
            }
            results.append({"type": "ok", "response": {"type": "batch", "result": result}})
        else:  # close
            results.append({"type": "ok", "response": {"type": "close"}})
    return "answer", 200, {"baton": None, "base_url": None, "results": results}


class HranaProxy:
    def __init__(self, upstream: str, rule: Callable[[dict[str, Any]], Any]):
        self.upstream = upstream.rstrip("/")
        self.rule = rule  # called with the request body (a dict)
        self.released = threading.Event()
        self.seen: list[tuple[list[str], str]] = []  # (statements, what was done)
        self.log: list[tuple[float, list[str], str]] = []
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def release(self) -> None:
        """Stalled requests get no answer still, but new ones are no longer stalled."""
        self.released.set()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def _reply(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _forward(self, method: str, body: bytes | None) -> None:
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() in ("authorization", "content-type")
                }
                request = urllib.request.Request(
                    proxy.upstream + self.path, data=body, headers=headers, method=method
                )
                try:
                    with urllib.request.urlopen(request, timeout=60) as response:
                        self._reply(response.status, response.read())
                except urllib.error.HTTPError as e:
                    self._reply(e.code, e.read())

            def do_GET(self) -> None:
                self._forward("GET", None)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                body = json.loads(raw or b"{}")
                action = proxy.rule(body) if not proxy.released.is_set() else "forward"
                proxy.seen.append((statements_of(body), str(action)[:20]))
                proxy.log.append((time.monotonic(), statements_of(body)[:3], str(action)[:8]))
                if action == "stall":
                    proxy.released.wait(600)
                    self.close_connection = True
                    return
                if isinstance(action, tuple) and action[0] == "late":
                    _, status, seconds = action
                    later = threading.Timer(seconds, _send_on, (self.path, raw, dict(self.headers)))
                    later.daemon = True
                    later.start()
                    self._reply(status, b'{"error": "gateway timeout"}')
                    return
                if isinstance(action, tuple):
                    _, status, answer = action
                    self._reply(status, json.dumps(answer).encode())
                    return
                self._forward("POST", raw)

        def _send_on(path: str, body: bytes, headers: dict[str, str]) -> None:
            keep = {
                k: v for k, v in headers.items() if k.lower() in ("authorization", "content-type")
            }
            request = urllib.request.Request(proxy.upstream + path, data=body, headers=keep)
            with urllib.request.urlopen(request, timeout=60) as response:
                response.read()

        return Handler

    def __enter__(self) -> HranaProxy:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.released.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
