"""The rule for tests whose server is down: skip locally, fail under ``CI=true``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import services


@pytest.fixture
def closed_url() -> str:
    """A URL at a port nothing listens on (bound once for a free number, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


def test_a_missing_server_fails_under_ci_naming_it_and_how_to_start_it(
    monkeypatch: pytest.MonkeyPatch, closed_url: str
) -> None:
    monkeypatch.setattr(services, "CI", True)
    with pytest.raises(pytest.fail.Exception) as failed:
        services.require_server("Redis", closed_url)
    message = str(failed.value)
    assert f"no Redis at {closed_url}" in message
    assert "redis-server" in message and "CI=true" in message


def test_a_missing_server_skips_outside_ci(
    monkeypatch: pytest.MonkeyPatch, closed_url: str
) -> None:
    monkeypatch.setattr(services, "CI", False)
    with pytest.raises(pytest.skip.Exception, match="no PostgreSQL at"):
        services.require_server("PostgreSQL", closed_url)


def test_a_needs_server_mark_is_checked_at_setup(
    monkeypatch: pytest.MonkeyPatch, closed_url: str
) -> None:
    class Item:
        def iter_markers(self, name: str) -> Any:
            return iter([services.needs_server("Redis", closed_url).mark] if name else [])

    monkeypatch.setattr(services, "CI", True)
    with pytest.raises(pytest.fail.Exception, match="no Redis at"):
        services.check_marked_servers(Item())  # type: ignore[arg-type]


def test_a_reachable_server_lets_the_test_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(services, "CI", True)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        services.require_server("Redis", f"redis://127.0.0.1:{listener.getsockname()[1]}/0")


@pytest.mark.parametrize(
    ("value", "ci"), [("true", True), ("TRUE", True), ("", False), ("0", False)]
)
def test_ci_is_read_from_the_environment(value: str, ci: bool) -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import services; print(services.CI)"],
        cwd=Path(__file__).parent,
        env={**os.environ, "CI": value},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == str(ci)
