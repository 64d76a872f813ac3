"""AWS's local durable-execution engine behind one Lambda endpoint, for the tests.

What is real: ``aws-durable-execution-sdk-python-testing``'s ``WebRunner`` (AWS's own
local engine) keeps every execution, checkpoint, wait timer, step retry and callback
and serves the durable-execution API (``GetDurableExecution``, ``...History``,
``StopDurableExecution``, ``SendDurableExecutionCallbackSuccess``,
``ListDurableExecutionsByFunction``, ``CheckpointDurableExecution``). The handler under
test runs through the real SDK (``@durable_execution``), which checkpoints to that
engine over HTTP with boto3; haze's ``Workflow.*`` calls go through boto3 as well.

What stands in for Lambda itself (no Lambda service can run here): ``LambdaEndpoint``,
a small HTTP server at the address both boto3 clients use (``AWS_ENDPOINT_URL_LAMBDA``).
It answers ``Invoke`` the way Lambda does for a durable function: an invocation from
the engine (marked ``X-Dex-Handler-Invoke``) runs the handler in this process and
returns its output; a caller's asynchronous ``Invoke`` with a
``DurableExecutionName`` starts an execution on the engine (the runner's own
``/start-durable-execution``) and returns its ARN. Every other request is passed to the
engine unchanged.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

from aws_durable_execution_sdk_python.lambda_service import LambdaClient
from aws_durable_execution_sdk_python_testing.invoker import create_test_lambda_context
from aws_durable_execution_sdk_python_testing.runner import WebRunner, WebRunnerConfig
from aws_durable_execution_sdk_python_testing.web.server import WebServiceConfig

REGION = "us-east-1"
ACCOUNT = "123456789012"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LambdaEndpoint(ThreadingHTTPServer):
    """Lambda's Invoke for the registered functions; the rest goes to the engine."""

    daemon_threads = True

    def __init__(self, port: int, engine_url: str) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.engine_url = engine_url
        self.functions: dict[str, Callable[[Any, Any], Any]] = {}


class _Handler(BaseHTTPRequestHandler):
    server: LambdaEndpoint

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_GET(self) -> None:
        self._proxy(b"")

    def do_PUT(self) -> None:
        self._proxy(self._body())

    def do_POST(self) -> None:
        body = self._body()
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) == 4 and parts[1] == "functions" and parts[3] == "invocations":
            self._invoke(unquote(parts[2]), body)
        else:
            self._proxy(body)

    def _invoke(self, function: str, body: bytes) -> None:
        handler = self.server.functions.get(function.split(":")[0])
        if handler is None:
            msg = {"Type": "User", "Message": f"Function not found: {function}"}
            self._reply(
                404, json.dumps(msg).encode(), {"x-amzn-ErrorType": "ResourceNotFoundException"}
            )
            return
        if self.headers.get("X-Dex-Handler-Invoke"):
            ctx = create_test_lambda_context(
                region=REGION, account_id=ACCOUNT, function_name=function
            )
            out = handler(json.loads(body), ctx)
            self._reply(200, json.dumps(out).encode())
            return
        start = {
            "AccountId": ACCOUNT,
            "FunctionName": function,
            "FunctionQualifier": "$LATEST",
            "ExecutionName": self.headers.get("X-Amz-Durable-Execution-Name"),
            "ExecutionTimeoutSeconds": 900,
            "ExecutionRetentionPeriodDays": 7,
            "Input": body.decode() or None,
        }
        status, out, headers = _send(
            f"{self.server.engine_url}/start-durable-execution",
            "POST",
            json.dumps(start).encode(),
            {},
        )
        if status not in (200, 201):
            self._reply(status, out, headers)
            return
        arn = json.loads(out)["ExecutionArn"]
        self._reply(202, b"", {"X-Amz-Durable-Execution-Arn": arn})

    def _proxy(self, body: bytes) -> None:
        headers = {
            k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")
        }
        status, out, got = _send(
            f"{self.server.engine_url}{self.path}", self.command, body, headers
        )
        self._reply(status, out, got)


def _send(
    url: str, method: str, body: bytes, headers: dict[str, str]
) -> tuple[int, bytes, dict[str, str]]:
    req = urllib.request.Request(url, data=body or None, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read(), _kept(r.headers.items())
    except urllib.error.HTTPError as e:
        return e.code, e.read(), _kept(e.headers.items())


def _kept(items: Any) -> dict[str, str]:
    drop = ("content-length", "transfer-encoding", "connection", "date", "server")
    return {k: v for k, v in items if k.lower() not in drop}


@contextlib.contextmanager
def local_durable_engine(functions: dict[str, Callable[[Any, Any], Any]]) -> Iterator[str]:
    """Run the engine and the endpoint; yield the endpoint URL (set as the process's
    ``AWS_ENDPOINT_URL_LAMBDA`` while it runs, with test credentials)."""
    engine_port, endpoint_port = free_port(), free_port()
    endpoint_url = f"http://127.0.0.1:{endpoint_port}"
    config = WebRunnerConfig(
        web_service=WebServiceConfig(host="127.0.0.1", port=engine_port),
        lambda_endpoint=endpoint_url,
        local_runner_region=REGION,
        skip_time=True,
        invocation_timeout_seconds=120,
    )
    env = {
        "AWS_ENDPOINT_URL_LAMBDA": endpoint_url,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    LambdaClient._cached_boto_client = None  # the SDK caches its client per process
    runner = WebRunner(config)
    runner.start()
    endpoint = LambdaEndpoint(endpoint_port, f"http://127.0.0.1:{engine_port}")
    endpoint.functions.update(functions)
    threads = [
        threading.Thread(target=runner.serve_forever, daemon=True),
        threading.Thread(target=endpoint.serve_forever, daemon=True),
    ]
    for t in threads:
        t.start()
    try:
        yield endpoint_url
    finally:
        endpoint.shutdown()
        endpoint.server_close()
        if runner._server is not None:
            runner._server.shutdown()
        runner.stop()
        LambdaClient._cached_boto_client = None
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
