"""A local STAND-IN for the Cloudflare REST API (Queues messages + D1 query), for tests.

This is not Cloudflare: it implements the documented request and response shapes of

- ``POST /client/v4/accounts/{account}/queues/{queue}/messages``        (one message)
- ``POST …/queues/{queue}/messages/batch``                               (``messages: [...]``)
- ``POST …/queues/{queue}/messages/pull``  (``batch_size``, ``visibility_timeout_ms``;
  JSON bodies come back base64-encoded, as Cloudflare documents for pull consumers)
- ``POST …/queues/{queue}/messages/ack``   (``acks: [{lease_id}]``,
  ``retries: [{lease_id, delay_seconds}]``)
- ``POST …/queues/{queue}/purge``
- ``POST /client/v4/accounts/{account}/d1/database/{db}/query`` (``sql``, ``params``;
  rows as objects, ``meta.changes``), on a real SQLite file

with the Cloudflare envelope ``{"success", "errors", "messages", "result"}``, Bearer-token
checks, visibility timeouts, ``delay_seconds``, attempts counting and ``max_retries`` +
a dead-letter list. It runs in a thread (``http.server``) so the async code under test
talks to it over real HTTP.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ACCOUNT = "acc0123"
QUEUE_ID = "q0123"
D1_ID = "d1db0123"
TOKEN = "test-token"


@dataclass
class StoredMessage:
    id: str
    body: Any
    content_type: str
    available_at: float
    attempts: int = 0
    lease_id: str | None = None
    lease_until: float = 0.0
    timestamp_ms: int = field(default_factory=lambda: int(time.time() * 1000))


class QueueState:
    def __init__(self, max_retries: int = 3):
        self.messages: list[StoredMessage] = []
        self.dead_letter: list[StoredMessage] = []
        self.max_retries = max_retries
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.acked: list[str] = []
        self.retried: list[tuple[str, int]] = []
        self.lock = threading.Lock()
        self._seq = itertools.count(1)

    def push(self, msg: dict[str, Any], default_delay: int = 0) -> None:
        delay = int(msg.get("delay_seconds") or default_delay or 0)
        if delay > 43200:
            raise ValueError("delay_seconds must be at most 43200")
        self.messages.append(
            StoredMessage(
                id=f"m{next(self._seq):04d}",
                body=msg.get("body"),
                content_type=str(msg.get("content_type") or "json"),
                available_at=time.time() + delay,
            )
        )

    def pull(self, batch_size: int, visibility_ms: int) -> dict[str, Any]:
        now = time.time()
        out = []
        for m in self.messages:
            if len(out) >= batch_size:
                break
            if m.available_at > now or (m.lease_id and m.lease_until > now):
                continue
            m.attempts += 1
            m.lease_id = uuid.uuid4().hex
            m.lease_until = now + visibility_ms / 1000
            if m.content_type == "json":
                body = base64.b64encode(json.dumps(m.body).encode()).decode()
            else:
                body = m.body
            out.append(
                {
                    "id": m.id,
                    "body": body,
                    "attempts": m.attempts,
                    "lease_id": m.lease_id,
                    "timestamp_ms": m.timestamp_ms,
                    "metadata": {
                        "CF-Content-Type": m.content_type,
                        "CF-sourceMessageSource": "api",
                    },
                }
            )
        backlog = len(self.messages) - len(out)
        return {"messages": out, "message_backlog_count": backlog}

    def settle(self, acks: list[dict[str, Any]], retries: list[dict[str, Any]]) -> dict[str, Any]:
        by_lease = {m.lease_id: m for m in self.messages if m.lease_id}
        now = time.time()
        ack_count = retry_count = 0
        for a in acks:
            m = by_lease.get(a.get("lease_id"))
            if m is not None and m.lease_until > now:
                self.messages.remove(m)
                self.acked.append(m.id)
                ack_count += 1
        for r in retries:
            m = by_lease.get(r.get("lease_id"))
            if m is None or m.lease_until <= now:
                continue
            delay = int(r.get("delay_seconds") or 0)
            self.retried.append((m.id, delay))
            retry_count += 1
            m.lease_id = None
            if m.attempts > self.max_retries:
                self.messages.remove(m)
                self.dead_letter.append(m)
            else:
                m.available_at = now + delay
        return {"ackCount": ack_count, "retryCount": retry_count, "warnings": []}


class D1State:
    def __init__(self, path: str):
        self.conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.lock = threading.Lock()
        self.statements: list[str] = []
        #: the next statement starting with this: its reply is lost (``"cut"``: the
        #: connection closes unanswered; ``"504"``: the gateway times out) and it runs
        #: ``late`` seconds after, as a statement the API had passed on still would
        self.lose_next: tuple[str, str, float] | None = None

    def query(self, sql: str, params: list[Any]) -> dict[str, Any]:
        with self.lock:
            self.statements.append(sql)
            cur = self.conn.execute(sql, params)
            rows = cur.fetchall() if cur.description else []
            cols = [d[0] for d in cur.description] if cur.description else []
            changes = self.conn.total_changes
            return {
                "results": [dict(zip(cols, r, strict=True)) for r in rows],
                "success": True,
                "meta": {
                    "changes": cur.rowcount if cur.rowcount > 0 else 0,
                    "last_row_id": cur.lastrowid or 0,
                    "rows_read": len(rows),
                    "changed_db": cur.rowcount > 0,
                    "total_changes": changes,
                },
            }


_QUEUE_PATH = re.compile(
    r"^/client/v4/accounts/(?P<acc>[^/]+)/queues/(?P<q>[^/]+)(?P<rest>/messages(?:/batch|/pull"
    r"|/ack)?|/purge)$"
)
_D1_PATH = re.compile(r"^/client/v4/accounts/(?P<acc>[^/]+)/d1/database/(?P<db>[^/]+)/query$")


class StandIn:
    """``with StandIn(tmp_path) as cf: cf.api_url`` — the stand-in API on 127.0.0.1."""

    def __init__(self, db_path: str, max_retries: int = 3):
        self.queue = QueueState(max_retries)
        self.d1 = D1State(db_path)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def api_url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/client/v4"

    def __enter__(self) -> StandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.d1.conn.close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, result: Any = None, errors: Any = None) -> None:
                payload = {
                    "success": status < 400,
                    "errors": errors or [],
                    "messages": [],
                    "result": result,
                }
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    self._send(400, errors=[{"code": 10001, "message": "invalid JSON"}])
                    return
                if self.headers.get("authorization") != f"Bearer {TOKEN}":
                    self._send(401, errors=[{"code": 10000, "message": "Authentication error"}])
                    return
                m = _QUEUE_PATH.match(self.path)
                if m and m["acc"] == ACCOUNT and m["q"] == QUEUE_ID:
                    self._queue(m["rest"], body)
                    return
                m = _D1_PATH.match(self.path)
                if m and m["acc"] == ACCOUNT and m["db"] == D1_ID:
                    if self._lost(body):
                        return
                    try:
                        result = standin.d1.query(body["sql"], list(body.get("params") or []))
                    except sqlite3.Error as e:
                        self._send(400, errors=[{"code": 7500, "message": f"{e}: SQLITE_ERROR"}])
                        return
                    self._send(200, [result])
                    return
                self._send(404, errors=[{"code": 7003, "message": f"no route {self.path}"}])

            def _lost(self, body: dict[str, Any]) -> bool:
                d1 = standin.d1
                lose = d1.lose_next
                if lose is None or not str(body.get("sql", "")).startswith(lose[0]):
                    return False
                d1.lose_next = None
                params = list(body.get("params") or [])
                late = threading.Timer(lose[2], d1.query, (body["sql"], params))
                late.daemon = True
                late.start()
                if lose[1] == "504":
                    self._send(504, errors=[{"code": 504, "message": "Gateway Timeout"}])
                else:
                    self.close_connection = True
                return True

            def _queue(self, rest: str, body: dict[str, Any]) -> None:
                q = standin.queue
                with q.lock:
                    q.requests.append((rest, body))
                    try:
                        if rest == "/messages":
                            q.push(body)
                            self._send(200, None)
                        elif rest == "/messages/batch":
                            msgs = body.get("messages") or []
                            if len(msgs) > 100:
                                raise ValueError("at most 100 messages per batch")
                            for msg in msgs:
                                q.push(msg, int(body.get("delay_seconds") or 0))
                            self._send(200, None)
                        elif rest == "/messages/pull":
                            self._send(
                                200,
                                q.pull(
                                    int(body.get("batch_size") or 5),
                                    int(body.get("visibility_timeout_ms") or 30000),
                                ),
                            )
                        elif rest == "/messages/ack":
                            self._send(
                                200, q.settle(body.get("acks") or [], body.get("retries") or [])
                            )
                        elif rest == "/purge":
                            q.messages.clear()
                            self._send(200, None)
                    except ValueError as e:
                        self._send(400, errors=[{"code": 10002, "message": str(e)}])

        return Handler
