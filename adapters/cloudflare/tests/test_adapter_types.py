"""haze_cloudflare type-checks against workers-runtime-sdk, Cloudflare's typed Python
Workers SDK (the ``workers`` module the Workers runtime provides).

The SDK is installed in a virtualenv of its own (it ships top-level ``webbrowser`` and
``asgi`` modules that must not shadow the workspace's standard library), with mypy and
the runtime's optional imports, and mypy --strict runs there with the workspace's
config. Elsewhere ``workers`` is Any (pyproject.toml: ignore_missing_imports).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cf_build import tool_missing

ROOT = Path(__file__).resolve().parents[3]
SDK = "workers-runtime-sdk==1.9.5"


@pytest.fixture(scope="module")
def sdk_mypy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    uv = shutil.which("uv")
    if uv is None:
        tool_missing("uv is not installed")
    venv = tmp_path_factory.mktemp("workers-sdk") / "venv"
    packages = [
        SDK,
        "mypy",
        "httpx",
        "cronsim",
        "opentelemetry-api",
        "opentelemetry-sdk",
        "psycopg",
    ]
    for cmd in (
        [uv, "venv", "-q", "-p", sys.executable, str(venv)],
        [uv, "pip", "install", "-q", "-p", str(venv / "bin" / "python"), *packages],
    ):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        if proc.returncode != 0:
            pytest.skip(f"cannot install {SDK} (offline?): {proc.stderr[-1000:]}")
    return venv / "bin" / "mypy"


def mypy(exe: Path, *targets: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(exe), "--config-file", "pyproject.toml", "--strict", "--no-incremental", *targets],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_the_adapter_is_strictly_typed_against_the_sdk(sdk_mypy: Path, tmp_path: Path) -> None:
    proc = mypy(sdk_mypy, "adapters/cloudflare/src/haze_cloudflare")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # QueueWorker is the SDK's WorkerEntrypoint to mypy, not an Any or the local stand-in
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from workers import WorkerEntrypoint\n"
        "from haze_cloudflare.worker import QueueWorker\n\n"
        "entry: WorkerEntrypoint = QueueWorker(None, None)\n"
        "wrong: int = QueueWorker(None, None)\n"
    )
    proc = mypy(sdk_mypy, str(probe))
    out = proc.stdout
    assert "probe.py:4" not in out, out
    assert (
        'probe.py:5: error: Incompatible types in assignment (expression has type "QueueWorker"'
        in out
    ), out
