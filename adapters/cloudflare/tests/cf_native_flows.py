"""The workflows of the Cloudflare Workflows tests besides the docs' recipes: one
definition, run on haze's own engine by the test (CPython, SQLite) and on Miniflare's
Workflows engine by cf_miniflare_native.py (Pyodide), which prepends this file."""

from __future__ import annotations

from collections import Counter
from typing import Any

from haze import workflow

#: Side effects by name (per process).
EFFECTS: Counter[str] = Counter()


def count(name: str) -> str:
    EFFECTS[name] += 1
    return name


def flaky() -> str:
    EFFECTS["flaky"] += 1
    if EFFECTS["flaky"] == 1:
        raise RuntimeError("the first try fails")
    return "ok"


@workflow(name="cf_replay")
async def cf_replay(run: Any) -> Any:
    before = await run.step("before", count, "before")
    go = await run.wait_for_event("go", timeout="1h")  # paused here: run() is replayed
    ok = await run.step("flaky", flaky, tries=2, backoff=1)
    after = await run.step("after", count, "after")
    return [before, go, ok, after]


@workflow(name="cf_nondet")
async def cf_nondet(run: Any) -> str:
    EFFECTS["replays"] += 1
    first = "first" if EFFECTS["replays"] == 1 else "changed"  # not a step result: forbidden
    await run.step(first, count, first)
    await run.wait_for_event("go", timeout="1h")
    return "unreachable"


def big() -> str:
    return "x" * (1024 * 1024 + 10)  # past Cloudflare's 1 MiB for a step's result


@workflow(name="cf_big")
async def cf_big(run: Any) -> str:
    return str(await run.step("big", big))


@workflow(name="cf_names")
async def cf_names(run: Any) -> str:
    # a control character: haze takes it, the platform's step names may not hold it
    return str(await run.step("tab\there", count, "tab"))
