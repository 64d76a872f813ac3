"""A local STAND-IN for Cloudflare's Workflows REST API, for tests (a MODEL: Miniflare
runs the Workflows engine and its bindings, but serves no ``/client/v4`` account API).

It implements the documented request and response shapes, with the Cloudflare envelope
``{"success", "errors", "messages", "result"}`` and a Bearer-token check:

- ``POST   /client/v4/accounts/{account}/workflows/{name}/instances``
  (``{"instance_id", "params"}`` -> ``{"id", "status", ...}``)
- ``GET    …/workflows/{name}/instances?status=&per_page=&direction=`` (a list)
- ``GET    …/workflows/{name}/instances/{id}`` (``status``, ``params``, ``output``,
  ``error: {name, message}``, ``queued``/``start``/``end``, ``steps``: ``step`` entries
  with ``attempts``, ``sleep`` and ``waitForEvent`` entries); 404 for an unknown id
- ``PATCH  …/instances/{id}/status`` (``{"status": "terminate"}``; a finished instance
  cannot be terminated)
- ``POST   …/instances/{id}/events/{type}`` (the body is the payload)

The test writes the instances it needs (``StandIn.instances``); nothing here runs a
workflow.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

ACCOUNT = "acc0123"
TOKEN = "wf-token"
_PATH = re.compile(
    r"^/client/v4/accounts/(?P<acc>[^/]+)/workflows/(?P<wf>[^/]+)/instances"
    r"(?:/(?P<id>[^/]+)(?P<rest>/status|/events/[^/]+)?)?$"
)
FINAL = {"complete", "errored", "terminated"}


class StandIn:
    """``with StandIn() as cf: cf.api_url`` — the stand-in API on 127.0.0.1."""

    def __init__(self) -> None:
        #: (workflow, instance id) -> the instance as GET returns it
        self.instances: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[tuple[str, str, str, Any]] = []
        self.requests: list[tuple[str, str]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/client/v4"

    def __enter__(self) -> StandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, result: Any = None, error: str | None = None) -> None:
                errors = [] if error is None else [{"code": 10000 + status, "message": error}]
                body = {
                    "success": error is None,
                    "errors": errors,
                    "messages": [],
                    "result": result,
                }
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> Any:
                n = int(self.headers.get("content-length") or 0)
                return json.loads(self.rfile.read(n) or b"null")

            def _route(self, method: str) -> None:
                standin.requests.append((method, self.path))
                if self.headers.get("authorization") != f"Bearer {TOKEN}":
                    return self._send(401, error="Authentication error")
                url = urlparse(self.path)
                m = _PATH.match(url.path)
                if m is None or m["acc"] != ACCOUNT:
                    return self._send(404, error=f"no route {url.path}")
                wf, rid, rest = m["wf"], m["id"], m["rest"]
                if rid is None:
                    return self._instances(method, wf, parse_qs(url.query))
                found = standin.instances.get((wf, rid))
                if found is None:
                    return self._send(404, error="instance.not_found")
                if method == "GET" and rest is None:
                    return self._send(200, found)
                if method == "PATCH" and rest == "/status":
                    if found["status"] in FINAL:
                        return self._send(
                            409,
                            error="instance.cannot_terminate: Cannot terminate instance "
                            "since its on a finite state",
                        )
                    found["status"] = "terminated"
                    return self._send(200, {"status": "terminated"})
                if method == "POST" and rest and rest.startswith("/events/"):
                    standin.events.append((wf, rid, unquote(rest[len("/events/") :]), self._body()))
                    return self._send(200, None)
                return self._send(405, error=f"{method} {url.path}")

            def _instances(self, method: str, wf: str, query: dict[str, list[str]]) -> None:
                if method == "POST":
                    body = self._body()
                    rid = body["instance_id"]
                    standin.instances.setdefault(
                        (wf, rid),
                        {"id": rid, "status": "queued", "params": body.get("params"), "steps": []},
                    )
                    return self._send(201, {"id": rid, "status": "queued"})
                wanted = (query.get("status") or [None])[0]
                found = [
                    {
                        "id": rid,
                        "status": i["status"],
                        "created_on": i.get("queued"),
                        "modified_on": i.get("end") or i.get("queued"),
                        "workflow_id": wf,
                    }
                    for (w, rid), i in standin.instances.items()
                    if w == wf and (wanted is None or i["status"] == wanted)
                ]
                return self._send(200, found)

            def do_GET(self) -> None:
                self._route("GET")

            def do_POST(self) -> None:
                self._route("POST")

            def do_PATCH(self) -> None:
                self._route("PATCH")

        return Handler
