"""Where a ``haze-memory`` job's time goes, by step (bench/README.md, "Memory driver: profile").

    .venv/bin/python bench/profile_memory.py              # 20,000 jobs under cProfile
    .venv/bin/python bench/profile_memory.py --n 50000 --top 30

Runs the ``haze-memory`` entry once to warm up, then once under cProfile, and sums each
function's own time (``tottime``) into the steps of a job's path: dispatch (build the
envelope, encode it, the checks for locks/recorder/telemetry/transactions, the driver's
enqueue) and execution (claim and decode, guards, the JobContext and Run objects, the
handler and its pipeline, outcome hooks, logging checks, ack, and the coroutine layers
that only pass the job on). cProfile charges every Python call a fixed overhead, so
shares of steps made of many small calls are overstated; read the shares, not the µs.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import memory_driver  # noqa: E402

#: (file suffix, function name) -> step; a name alone matches any file. The short
#: path of a plain job (``haze._engine.plain``) first, then the full path's steps.
STEPS: dict[str, list[str]] = {
    "plain dispatch: job.dispatch() and its awaitable (warning on drop)": [
        "definition.py:dispatch",
        "pending.py:__await__",
        "pending.py:__del__",
        "current.py:use_app",
    ],
    "plain dispatch: plan, checks, id (Dispatcher.quick, new_id)": [
        "dispatcher.py:quick",
        "id_prefix.py:new_id",
    ],
    "plain dispatch: payload copy (copy_payload)": [
        "json_text.py:copy_payload",
        "json_text.py:_copy",
        "json_text.py:_copy_dict",
        "json_text.py:_copy_list",
    ],
    "plain dispatch: memory keep_plain": ["memory.py:keep_plain"],
    "plain run: claim, its ack, payload copy (claim_plain, plain_done, copy_tree)": [
        "memory.py:claim_plain",
        "memory.py:plain_done",
        "json_text.py:copy_tree",
        "<method 'copy' of 'dict' objects>",
    ],
    "plain run: checks and the handler's first step (PlainRuns.run)": [
        "plain.py:run",
        "__init__.py:isEnabledFor",
        "<method 'send' of 'coroutine' objects>",
    ],
    "bench: the producer loop (memory_driver._haze)": ["memory_driver.py:_haze"],
    "dispatch: build envelope": [
        "dispatcher.py:build",
        "dispatcher.py:resolve",
        "message.py:new_id",
        "message.py:__init__",
        "definition.py:to_wire",
        "definition.py:__init__",
        "definition.py:_set",
        "tracking.py:meta_for",
        "durations.py:check_delay",
        "app.py:connection_name",
        "app.py:driver",
    ],
    "dispatch: encode (JSON)": [
        "message.py:encode",
        "message.py:to_dict",
        "message.py:dumps",
        "dispatcher.py:encode",
        "message.py:encode_payload",
        "message.py:_encode_plain",
        "message.py:encode_plain",
        "dispatcher.py:_checked_size",
    ],
    "dispatch: lock/recorder/otel/tx checks": [
        "dispatcher.py:dispatch",
        "dispatcher.py:_send_now",
        "dispatcher.py:send",
        "dispatcher.py:_keeper",
        "dispatcher.py:_plain",
        "otel.py:get",
        "transactions.py:current_transaction",
    ],
    "dispatch: driver enqueue": [
        "dispatcher.py:_sink",
        "memory.py:enqueue",
        "memory.py:keep_next",
        "memory.py:_push",
        "memory.py:_bind",
        "local.py:ensure",
    ],
    "execute: claim + decode (JSON)": [
        "memory.py:reserve_nowait",
        "memory.py:_order",
        "message.py:decode",
        "message.py:_fast_loads",
        "message.py:from_dict",
        "message.py:decode_payload",
        "memory.py:_claim_kept",
        "driver.py:__init__",
    ],
    "execute: guards, cancel check": [
        "execution.py:_guarded",
        "execution.py:_guard",
        "hooks.py:guarded",
        "tracking.py:may_be_cancelled",
        "tracking.py:started",
        "tracking.py:ended",
        "definition.py:get_job",
        "definition.py:find_job",
        "execution.py:_decode",
        "definition.py:from_wire",
        "hooks.py:<genexpr>",
        "admit",
        "execution.py:_claimed_elsewhere",
    ],
    "execute: JobContext, Run, Reserved": ["context.py:__init__", "<string>:__init__"],
    "execute: handler + pipeline": [
        "execution.py:_attempt",
        "execution.py:pipeline",
        "pipeline.py:call",
        "memory_driver.py:noop",
    ],
    "execute: outcome hooks": [
        "hooks.py:choose",
        "hooks.py:wanted",
        "hooks.py:<listcomp>",
        "hooks.py:tracked",
        "wants",
        "settling",
        "settled",
    ],
    "execute: ack": [
        "execution.py:_ack",
        "memory.py:ack",
        "memory.py:_settled",
        "memory.py:pending",
    ],
    "execute: layers (worker, delivery, process)": [
        "worker.py:_slot",
        "worker.py:_run",
        "worker.py:_limit_reached",
        "delivery.py:run",
        "execution.py:process",
        "execution.py:_process",
        "execution.py:_run",
        "execution.py:_success",
        "execution.py:_classify",
        "manager.py:process",
        "manager.py:dispatch",
    ],
}


def _step_of(path: str, func: str) -> str:
    name = Path(path).name
    for step, keys in STEPS.items():
        for key in keys:
            file, _, fn = key.rpartition(":")
            if fn == func and (not file or name == file):
                return step
    return "other (asyncio, builtins, contextvars, ...)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--top", type=int, default=0, help="also print the top functions")
    args = ap.parse_args()
    memory_driver.haze_memory(2_000)
    prof = cProfile.Profile()
    prof.enable()
    memory_driver.haze_memory(args.n)
    prof.disable()
    stats = pstats.Stats(prof)
    raw = stats.stats  # type: ignore[attr-defined]
    steps: dict[str, float] = {}
    calls = 0
    for (path, _line, func), (_cc, nc, tt, _ct, _callers) in raw.items():
        step = _step_of(path, func)
        steps[step] = steps.get(step, 0.0) + tt
        calls += nc
    total = sum(steps.values())
    per_job = total / args.n * 1e6
    print(
        f"{args.n:,} jobs, {calls / args.n:.0f} Python calls and {per_job:.1f} us "
        "per job (profiled)\n"
    )
    print("| step | share of profiled time | profiled us/job |\n|---|---|---|")
    for step, tt in sorted(steps.items(), key=lambda kv: -kv[1]):
        print(f"| {step} | {tt / total:.0%} | {tt / args.n * 1e6:.1f} |")
    if args.top:
        print()
        stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
