"""Shared by the Cloudflare harnesses: wheels built once per pytest session, npm ci, and
the runs of the Pyodide harness (tests/pyodide/run.mjs) and the Miniflare harness
(tests/cloudflare/miniflare-harness.mjs)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[3]
CF_DIR = ROOT / "tests" / "cloudflare"
PYODIDE_DIR = ROOT / "tests" / "pyodide"


def build_wheel(project: str, out: Path, pattern: str) -> Path:
    """``uv build --wheel PROJECT -o OUT`` (or ``python -m build``); the built wheel."""
    uv = shutil.which("uv")
    cmd = (
        [uv, "build", "--wheel", project, "-o", str(out)]
        if uv
        else [sys.executable, "-m", "build", "--wheel", project, "-o", str(out)]
    )
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, f"building {project} failed:\n{proc.stdout}\n{proc.stderr}"
    (wheel,) = out.glob(pattern)
    return wheel


def pure_wheel(out: Path, name: str, files: dict[str, bytes], version: str = "0.1.0") -> Path:
    """A pure-Python wheel holding ``files`` (archive name -> content), with the
    metadata and RECORD that ``pyodide.loadPackage`` and micropip need."""
    wheel = out / f"{name}-{version}-py3-none-any.whl"
    dist = f"{name}-{version}.dist-info"
    files = dict(files)
    files[f"{dist}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    )
    files[f"{dist}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: haze-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for arc, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{arc},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in sorted(files.items()):
            z.writestr(arc, data)
    return wheel


def haze_wheels(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The haze and haze_cloudflare wheels, built once per session."""
    out = tmp_path_factory.getbasetemp() / "cf-shared-wheels"
    if out.is_dir():
        found = [*out.glob("haze_jobs-*.whl"), *out.glob("haze_cloudflare-*.whl")]
        if len(found) == 2:
            return found
        shutil.rmtree(out)
    out.mkdir()
    return [
        build_wheel("runtime", out, "haze_jobs-*.whl"),
        build_wheel("adapters/cloudflare", out, "haze_cloudflare-*.whl"),
    ]


#: CI installs Node.js, npm and uv: a missing tool fails the test there instead of skipping.
CI = os.environ.get("CI", "").strip().lower() == "true"


def tool_missing(message: str) -> NoReturn:
    """Skip the test for a missing tool (Node.js, npm, uv); fail it under CI=true."""
    if CI:
        pytest.fail(f"{message}. CI=true: the tests need every tool", pytrace=False)
    pytest.skip(message)


def npm_ci(directory: Path, marker: str) -> None:
    """``npm ci`` in ``directory`` unless ``node_modules/<marker>`` exists (bounded)."""
    if (directory / "node_modules" / marker).is_dir():
        return
    npm = shutil.which("npm")
    if npm is None:
        tool_missing("npm is not installed")
    proc = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund"],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"npm ci in {directory} failed (offline?):\n{proc.stderr[-2000:]}")


def pyodide_node() -> str:
    """The ``node`` to run the Pyodide harness with, once Pyodide is installed (the test
    skips where Node.js or npm is missing, or npm ci fails)."""
    node = shutil.which("node")
    if node is None:
        tool_missing("Node.js is not installed")
    npm_ci(PYODIDE_DIR, "pyodide")
    return node


def run_pyodide(
    node: str, script: Path, timeout: float, wheels: Sequence[Path] = (), mount: Path | None = None
) -> Any:
    """``run.mjs [--wheel W]... [--mount DIR] SCRIPT``: its JSON report (the test fails
    with the harness's stderr when it exits non-zero)."""
    args = [node, str(PYODIDE_DIR / "run.mjs")]
    for w in wheels:
        args += ["--wheel", str(w)]
    if mount is not None:
        args += ["--mount", str(mount)]
    args.append(str(script))
    proc = subprocess.run(
        args, cwd=PYODIDE_DIR, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"pyodide run failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
    return json.loads(proc.stdout)


def miniflare_node() -> str:
    """The ``node`` to run the Miniflare harness with, once Pyodide and wrangler are
    installed (the test skips where Node.js or npm is missing, or npm ci fails)."""
    node = pyodide_node()
    npm_ci(CF_DIR, "wrangler")
    return node


def run_miniflare(node: str, wheels: list[Path], script: Path, timeout: float) -> dict[str, Any]:
    """``miniflare-harness.mjs --wheel W... SCRIPT``: its JSON report (the test fails
    with the harness's stderr when it exits non-zero)."""
    args = [node, str(CF_DIR / "miniflare-harness.mjs")]
    for w in wheels:
        args += ["--wheel", str(w)]
    args.append(str(script))
    proc = subprocess.run(
        args, cwd=CF_DIR, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"miniflare harness failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result
