"""The redis driver's lean connection (haze.drivers.redis.wire) against a real Redis.

The reply parser is checked on its own too (byte streams cut at every position), since
it only runs when hiredis is not installed.
"""

from __future__ import annotations

import asyncio
import contextvars
import runpy
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest

pytest.importorskip("redis")
from haze._base.errors import ConfigError
from haze.drivers.redis.resp import _PyReader
from haze.drivers.redis.wire import Wire, wire_for
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

_spec = runpy.run_path(str(Path(__file__).with_name("redis_spec.py")))
REDIS_URL: str = _spec["REDIS_URL"]
pytestmark = _spec["needs_redis"]


def _wire() -> Wire:
    parts = urlsplit(REDIS_URL)
    db = int(parts.path.strip("/") or 0)
    return Wire(parts.hostname or "127.0.0.1", parts.port or 6379, db=db, password=parts.password)


def _replies(chunks: list[bytes]) -> list[str]:
    reader = _PyReader()
    out = []
    for chunk in chunks:
        reader.feed(chunk)
        while (value := reader.gets()) is not False:
            out.append(repr(value))
    return out


def test_python_parser_handles_replies_cut_anywhere() -> None:
    data = (
        b"*3\r\n$1\r\na\r\n*2\r\n:5\r\n$-1\r\n-ERR inner\r\n+OK\r\n$3\r\na\xc3\xa9\r\n"
        b"*0\r\n:-3\r\n*-1\r\n-NOSCRIPT No matching script\r\n"
    )
    whole = _replies([data])
    assert len(whole) == 7
    assert whole[1:4] == ["'OK'", "'aé'", "[]"]
    for i in range(len(data)):
        for j in range(i, len(data), 3):
            assert _replies([data[:i], data[i:j], data[j:]]) == whole
    reader = _PyReader()
    reader.feed(data)
    first = reader.gets()
    assert first[:2] == ["a", [5, None]] and isinstance(first[2], ResponseError)
    for _ in range(5):
        reader.gets()
    assert isinstance(reader.gets(), NoScriptError)


async def test_commands_pipelined_in_order_and_scripts_reloaded() -> None:
    wire = _wire()
    key = f"hzwire-{uuid.uuid4().hex[:12]}"
    try:
        # many callers in the same loop turn share writes; replies keep their order
        results = await asyncio.gather(*(wire.execute("INCR", key) for _ in range(200)))
        assert results == list(range(1, 201))
        assert await wire.execute("GET", key) == "200"
        with pytest.raises(ResponseError):
            await wire.execute("INCR", key, "extra-argument")
        # redis-py's AsyncScript runs on it, loading the script after NOSCRIPT
        client = Redis.from_url(REDIS_URL, decode_responses=True)
        try:
            # a script no server has seen yet (its text names the unique key): NOSCRIPT
            # first, without flushing the scripts other tests on this server rely on
            script = client.register_script(f"return {{KEYS[1], ARGV[1], '{key}'}}")
            assert await script(keys=[key], args=["x"], client=wire) == [key, "x", key]
        finally:
            await client.aclose()
        replies = await wire.execute_many([("MULTI",), ("INCR", key), ("EXEC",)])
        assert replies == ["OK", "QUEUED", [201]]
        assert await wire.run_script(script, [key], ["y"], fixed_keys=True) == [key, "y", key]
        assert await wire.run_script(script, [key], ["z"], fixed_keys=True) == [key, "z", key]
    finally:
        await wire.execute("DEL", key)
        wire.close()


async def test_a_cancelled_caller_does_not_put_replies_out_of_step() -> None:
    wire = _wire()
    key = f"hzwire-{uuid.uuid4().hex[:12]}"
    try:
        slow = asyncio.ensure_future(wire.execute("BLPOP", key, "0.2"))
        await asyncio.sleep(0.05)
        slow.cancel()
        # the caller is woken by the cancellation itself, not by the late reply
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(slow, 0.1)
        assert await wire.execute("ECHO", "after") == "after"
    finally:
        wire.close()


async def test_replies_resume_their_callers_in_order_in_their_own_context() -> None:
    """A reply resumes its task straight from ``data_received`` (no extra loop pass):
    still in the order of the commands, in the task's own context, and a task that
    sends its next command while being resumed keeps the connection in step."""
    wire = _wire()
    var: contextvars.ContextVar[int] = contextvars.ContextVar("var")
    seen: list[tuple[int, str, int, bool]] = []

    async def call(i: int) -> None:
        var.set(i)
        task = asyncio.current_task()
        reply = await wire.execute("ECHO", str(i))
        seen.append((i, reply, var.get(), asyncio.current_task() is task))
        assert await wire.execute("ECHO", f"next{i}") == f"next{i}"

    try:
        await asyncio.gather(*(call(i) for i in range(50)))
        assert seen == [(i, str(i), i, True) for i in range(50)]
        for i in range(200):  # one caller at a time: each reply resumes it at once
            assert await wire.execute("ECHO", str(i)) == str(i)
    finally:
        wire.close()


async def test_a_killed_connection_fails_in_flight_calls_and_reconnects() -> None:
    wire = _wire()
    admin = Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        my_id = await wire.execute("CLIENT", "ID")
        # killed while idle: the next call goes out on a fresh connection
        await admin.execute_command("CLIENT", "KILL", "ID", my_id)
        assert await asyncio.wait_for(wire.execute("ECHO", "back"), 10) == "back"
        new_id = await wire.execute("CLIENT", "ID")
        assert new_id != my_id
        # killed with calls in flight: those fail, later ones reconnect
        with pytest.raises(RedisConnectionError):
            await asyncio.wait_for(
                wire.execute_many(
                    [("CLIENT", "KILL", "ID", new_id, "SKIPME", "no"), ("ECHO", "lost")]
                ),
                10,
            )
        assert await asyncio.wait_for(wire.execute("ECHO", "again"), 10) == "again"
        assert await wire.execute("CLIENT", "ID") not in (my_id, new_id)
    finally:
        await admin.aclose()
        wire.close()


async def test_wire_for_uses_plain_tcp_only() -> None:
    tcp = Redis.from_url(REDIS_URL)
    unix = Redis(unix_socket_path="/nonexistent/redis.sock")
    try:
        wire = wire_for(tcp)
        assert wire is not None
        assert await wire.execute("PING") == "PONG"
        wire.close()
        assert wire_for(unix) is None
    finally:
        await tcp.aclose()
        await unix.aclose()


async def test_the_wire_keeps_tcp_keepalive_like_the_store_clients() -> None:
    # A half-open connection (the peer gone without a reset) must fail, not hang.
    import socket

    from haze.drivers.redis.wire import wire_for
    from haze.stores.redis import new_client

    client = new_client("redis://127.0.0.1:6379/0", {})
    wire = wire_for(client)
    assert wire is not None
    try:
        await wire.execute("PING")
        sock = wire._protocol.transport.get_extra_info("socket")  # type: ignore[union-attr]
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_KEEPIDLE"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
    finally:
        wire.close()
        await client.aclose()


async def test_a_database_the_server_lacks_is_one_config_line() -> None:
    """SELECT of a database past the server's ``databases`` fails the first command with
    a ConfigError naming the server and the database, not redis-py's ResponseError."""
    parts = urlsplit(REDIS_URL)
    wire = Wire(parts.hostname or "127.0.0.1", parts.port or 6379, db=99, password=parts.password)
    try:
        with pytest.raises(ConfigError, match=r"has no database 99 \(DB index is out of range\)"):
            await wire.execute("PING")
    finally:
        wire.close()
