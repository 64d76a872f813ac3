"""The ``cloudflare`` entry of the driver contract, for the suite run INSIDE Pyodide.

``tests/contract/conftest.py`` loads this file by path (``runpy.run_path``) when it runs
under Pyodide (``sys.platform == "emscripten"``) and takes ``SPEC``; under CPython it is
never loaded (there is no Worker runtime there). The runner is
``test_cf_contract_pyodide.py`` (CPython) -> ``cf_contract_runner.py`` (Pyodide).

What each contract test gets:

producer  the contract app's ``main`` connection is ``{"driver": "cloudflare", "binding":
          "QUEUE"}``; the Worker env holding the binding is bound with
          ``haze_cloudflare.bind_env`` (as ``QueueWorker`` does on every invocation), so
          dispatches go through ``env.QUEUE.send`` / ``sendBatch`` of the JS stand-in.
queue     ``cf_queue_sim.js`` (a JavaScript model of Cloudflare Queues, see its header),
          on the real clock (``scaleMs: 1000``), ``max_retries`` 100 (Cloudflare's
          maximum) and a dead-letter queue.
consumer  ``CloudflareConsumer`` below plays Cloudflare's side: it takes batches of at
          most 10 ready messages (``max_batch_size``; ``max_batch_timeout`` 0) and calls
          ``queue(batch, env, ctx)`` on a fresh ``QueueWorker`` subclass instance per
          invocation, running at most ``concurrency`` invocations at a time (the
          consumer's ``max_concurrency``), then settles the batch as Cloudflare does
          (explicit ack/retry win; unsettled messages are acked, or retried when
          ``queue()`` threw).
failed    the driver's default failed store (this isolate's memory, with its warning):
          D1 needs SQLite, which the offline Pyodide used here does not ship.

Tests the driver cannot pass for a reason of the platform are skipped by name in
``LIMITS`` (checked when the test opens its app), with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
SIM_JS = HERE / "cf_queue_sim.js"

#: Cloudflare's consumer settings the stand-in applies.
MAX_BATCH_SIZE = 10
MAX_RETRIES = 100

_STATE_NAME = "haze_test_cf_contract_state"
_state = sys.modules.get(_STATE_NAME)
if _state is None:
    _state = types.ModuleType(_STATE_NAME)
    _state.sim = None  # type: ignore[attr-defined]
    _state.env = None  # type: ignore[attr-defined]
    _state.queue = None  # type: ignore[attr-defined]
    _state.dlq = None  # type: ignore[attr-defined]
    #: traffic over the whole session, for the runner's report (proof the suite really
    #: went through the Queue binding and QueueWorker.queue())
    _state.totals = dict.fromkeys(  # type: ignore[attr-defined]
        ("apps", "sends", "send_batch_calls", "invocations", "acks", "retries", "dead"), 0
    )
    sys.modules[_STATE_NAME] = _state


def _sim() -> Any:
    if _state.sim is None:
        import js  # type: ignore[import-not-found]
        from pyodide.code import run_js  # type: ignore[import-not-found]

        run_js(SIM_JS.read_text())
        _state.sim = js.cfSim
    return _state.sim


def _js_options(**kw: Any) -> Any:
    import js
    from pyodide.ffi import to_js  # type: ignore[import-not-found]

    return to_js(kw, dict_converter=js.Object.fromEntries)


#: Contract tests that need what Cloudflare Queues cannot give, by test function name.
LIMITS: dict[str, str] = {
    "test_throttles_exceptions_opens_the_circuit": (
        "needs a 0.01 s retry backoff to end inside a 0.4 s circuit window; Cloudflare "
        "Queues delays (delaySeconds) are whole seconds, so 0.01 s becomes 1 s"
    ),
}


#: Encrypted-job tests: they need ``cryptography`` (haze[encryption]). Cloudflare Python
#: Workers can use it (Pyodide builds it), but it is a compiled package that Pyodide
#: serves from its CDN only, and this harness runs offline from the npm ``pyodide``.
NEEDS_CRYPTOGRAPHY = frozenset(
    {
        "test_encrypted_payload_has_no_plaintext_at_rest",
        "test_encrypted_failed_job_keeps_the_payload_encrypted",
        "test_encrypted_job_runs_with_app_key_from_env",
        "test_encrypted_job_without_a_key_fails_at_dispatch",
        "test_key_rotation_reads_old_messages_with_previous_keys",
        "test_undecryptable_payload_fails_clearly_and_is_kept",
        "test_decrypt_error_type",
        "test_encrypted_unique_key_sees_the_payload",
        "test_fake_records_the_plain_payload_of_encrypted_jobs",
        "test_long_chain_of_encrypted_links_stores_them_encrypted",
        "test_key_rotation_reads_previous_keys_from_the_invocations_env",
        "test_a_worker_without_the_key_still_ends_the_status_record",
        "test_an_encrypted_payload_that_is_not_strict_json_is_never_run",
        "test_an_encrypted_jobs_payload_is_checked_like_a_plain_one",
    }
)


def _skip_limits() -> None:
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    name = current.split("::")[-1].split(" ")[0].split("[")[0]
    reason = LIMITS.get(name)
    if reason:
        pytest.skip(f"cloudflare driver: {reason}")
    if name in NEEDS_CRYPTOGRAPHY and importlib.util.find_spec("cryptography") is None:
        pytest.skip(
            "needs the cryptography package (haze[encryption]): Pyodide serves it from its "
            "CDN only, and this harness loads Pyodide offline from npm"
        )


class CloudflareConsumer:
    """Cloudflare's side of a queue consumer, delivering batches to ``QueueWorker.queue()``.

    Shaped like ``haze.worker.Worker`` for the contract's ``wait_done``: ``running`` (the
    invocations in flight) and ``driver.pending()`` (messages stored, delayed included).
    """

    def __init__(self, app: Any, concurrency: int | None):
        from haze_cloudflare import QueueWorker

        self.app = app
        self.queue = _state.queue
        self.env = _state.env
        self.max_concurrency = max(1, concurrency or 1)
        # The generated entry is ``class Default(QueueWorker)`` over the app; the contract's
        # app is already entered, so the subclass hands it over as ``haze_app``.
        self.entry = type("ContractEntry", (QueueWorker,), {"haze_app": app})
        self.driver = self
        self.invocations: set[asyncio.Task[None]] = set()
        self.errors: list[BaseException] = []
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def running(self) -> int:
        return len(self.invocations)

    def pending(self) -> bool:
        return bool(self.queue.size)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._deliver())

    async def _invoke(self, batch: Any) -> None:
        threw = False
        _state.totals["invocations"] += 1
        try:
            # Cloudflare constructs the entrypoint per invocation, with ctx and env.
            worker = self.entry(None, self.env)
            await worker.queue(batch, self.env, None)
        except Exception as e:
            threw = True
            self.errors.append(e)
        finally:
            self.queue.settle(batch, threw)

    async def _deliver(self) -> None:
        from haze_cloudflare._js import is_nullish

        while not self._stopping:
            while len(self.invocations) < self.max_concurrency:
                batch = self.queue.nextBatch(MAX_BATCH_SIZE)
                if is_nullish(batch):
                    break
                task = asyncio.get_running_loop().create_task(self._invoke(batch))
                self.invocations.add(task)
                task.add_done_callback(self.invocations.discard)
            wait = self.queue.nextIn()
            # Poll for new sends every few ms; wake up for the next delayed message.
            await asyncio.sleep(0.005 if wait < 0 else min(0.005, wait / 1000))

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.invocations:
            # Like a worker's drain: let running invocations finish, but bounded so a
            # job stuck on a failed test's event cannot hang the session.
            _, stuck = await asyncio.wait(set(self.invocations), timeout=15)
            for task in stuck:
                task.cancel()
        from haze_cloudflare import worker as cf_worker

        cf_worker._apps.pop(self.entry, None)
        cf_worker._boot_locks.pop(self.entry, None)
        if self.errors:
            # queue() settles every message itself; Cloudflare's retry of a whole batch
            # after a throw would hide the bug, so the test fails on it.
            raise AssertionError(f"QueueWorker.queue() raised: {self.errors!r}")


def _consumer(app: Any, concurrency: int | None) -> CloudflareConsumer:
    return CloudflareConsumer(app, concurrency)


def _setup() -> Callable[[], None]:
    import haze_cloudflare
    from pyodide.code import run_js

    _skip_limits()
    sim = _sim()
    dlq = sim.SimQueue.new("haze-contract-dlq", _js_options(scaleMs=1000))
    queue = sim.SimQueue.new(
        "haze-contract", _js_options(maxRetries=MAX_RETRIES, deadLetter=dlq, scaleMs=1000)
    )
    env = run_js("(q, kv) => ({QUEUE: q, KV: kv})")(queue, sim.SimKV.new())
    _state.queue, _state.dlq, _state.env = queue, dlq, env
    haze_cloudflare.bind_env(env)

    def undo() -> None:
        totals = _state.totals
        totals["apps"] += 1
        totals["sends"] += int(queue.sends.length)
        totals["send_batch_calls"] += int(queue.batchCalls.length)
        calls = [str(c[1]) for c in queue.calls.to_py()]
        totals["acks"] += calls.count("ack")
        totals["retries"] += calls.count("retry")
        totals["dead"] += int(queue.dead.length)
        haze_cloudflare.bind_env(None)
        _state.queue = _state.dlq = _state.env = None

    return undo


def _take_one(app: Any) -> tuple[Any, Callable[[bool], None]] | None:
    """One message off the simulated queue as the Worker's ``queue()`` would get it
    (a batch of one), for a test that runs it by hand: its ``Reserved``, and what ends
    the invocation (``finish(threw)``: the platform settles what was left unsettled).
    None when no message is ready."""
    from haze_cloudflare import QueueWorker
    from haze_cloudflare._js import is_nullish
    from haze_cloudflare.worker import MessageDelivery

    queue = _state.queue
    batch = queue.nextBatch(1)
    if is_nullish(batch):
        return None
    message = next(iter(batch.messages))
    entry = type("ContractEntry", (QueueWorker,), {"haze_app": app})(None, _state.env)
    reserved, _ = entry.reserved(app, message, MessageDelivery(message))
    return reserved, lambda threw: queue.settle(batch, threw)


def _stored() -> int:
    """Messages in the simulated queue: ready, delayed and in flight."""
    return int(_state.queue.size)


def _connection(tmp: Path) -> dict[str, Any]:
    return {"driver": "cloudflare", "binding": "QUEUE"}


def _driver_spec() -> Any:
    contract = sys.modules.get("haze_contract_conftest")
    if contract is None:
        return None
    return contract.DriverSpec(
        "cloudflare",
        connection=_connection,
        capabilities=contract.FULL | {"remote"},
        setup=_setup,
        # Every asyncio step on Pyodide's WebLoop is a JS macrotask: 1,000 jobs took 6-30 s
        # on the loaded test box against the test's 40 s budget. Same rules, fewer jobs.
        extra={"consumer": _consumer, "big_batch": 300, "take_one": _take_one, "stored": _stored},
    )


SPEC = _driver_spec()
