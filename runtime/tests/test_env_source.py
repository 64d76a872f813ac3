"""``env()`` reading a per-context source (a Cloudflare Worker's vars) before os.environ."""

from __future__ import annotations

import asyncio
import os

import pytest
from haze import env
from haze._app.config import env_source, read_env
from haze._base.errors import ConfigError


def test_the_source_wins_inside_the_block_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAZE_T_FROM_OS", "os")
    monkeypatch.delenv("HAZE_T_VAR", raising=False)
    with env_source({"HAZE_T_VAR": "worker", "HAZE_T_FROM_OS": "worker"}.get):
        assert env("HAZE_T_VAR") == "worker"
        assert env("HAZE_T_FROM_OS") == "worker"
        assert env("HAZE_T_ABSENT", "default") == "default"
    assert env("HAZE_T_VAR") is None
    assert env("HAZE_T_FROM_OS") == "os"
    assert "HAZE_T_VAR" not in os.environ


def test_a_missing_var_falls_back_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAZE_T_FROM_OS", "os")
    with env_source({}.get):
        assert read_env("HAZE_T_FROM_OS") == "os"


def test_casts_and_errors_apply_to_the_source() -> None:
    with env_source({"HAZE_T_N": "3", "HAZE_T_B": "yes", "HAZE_T_BAD": "many"}.get):
        assert env("HAZE_T_N", 1) == 3
        assert env("HAZE_T_B", False) is True
        with pytest.raises(ConfigError, match="HAZE_T_BAD"):
            env("HAZE_T_BAD", 1)


async def test_concurrent_invocations_each_see_their_own_vars() -> None:
    seen: list[tuple[str, str | None]] = []

    async def read_later() -> str | None:
        await asyncio.sleep(0)
        return env("HAZE_T_TAG")

    async def invocation(tag: str) -> None:
        with env_source({"HAZE_T_TAG": tag}.get):
            await asyncio.sleep(0)  # interleave with the other invocation
            seen.append((tag, env("HAZE_T_TAG")))
            seen.append((tag, await asyncio.create_task(read_later())))  # a task it starts

    await asyncio.gather(invocation("a"), invocation("b"))
    assert sorted(seen) == [("a", "a"), ("a", "a"), ("b", "b"), ("b", "b")]
    assert env("HAZE_T_TAG") is None
