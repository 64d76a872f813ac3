"""``scripts/test`` (pytest over every test path) runs the fast tests first: a module with
a ``slow`` (fault, storm, soak) test runs after the others, the Pyodide ones in between,
so ``-x`` stops at a simple failure in seconds, not after minutes of storms."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_slow_modules_are_collected_after_the_fast_ones() -> None:
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"),
            *("tests/batch_storm", "tests/test_docs.py", "tests/test_services.py"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = [ln.split("::")[0] for ln in proc.stdout.splitlines() if "::" in ln]
    order = list(dict.fromkeys(files))
    assert order[-1] == "tests/batch_storm/test_batch_storm.py", order
    assert set(order[:-1]) == {"tests/test_docs.py", "tests/test_services.py"}, order


def test_under_xdist_a_module_runs_in_one_worker() -> None:
    """``--dist loadgroup`` (scripts/test) keeps each module's tests in one worker: with
    pytest 9.2, xdist's group suffix on the test id was lost and every test went to any
    worker (the Miniflare and Pyodide modules ran in all workers at once)."""
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v"),
            *("-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder"),
            *("tests/test_services.py", "runtime/tests/test_message_fields.py"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    workers: dict[str, set[str]] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("[gw") and " PASSED " in line:
            module = line.split(" PASSED ")[1].split("::")[0]
            workers.setdefault(module, set()).add(line.split("]")[0])
    assert len(workers) == 2 and all(len(w) == 1 for w in workers.values()), workers


#: What a test module calls to start Node.js heavily: Pyodide, Miniflare's workerd, wrangler.
NODE_STARTERS = ("run_pyodide", "pyodide_node", "run_miniflare", "miniflare_node", "_dry_run")


def test_every_module_that_starts_node_is_in_the_node_lane() -> None:
    """Under xdist, the modules marked ``pyodide`` or ``workerd`` run one after the other
    in one worker (tests/conftest.py); two of them at once on two cores run out of their
    time limits, so a module that starts Pyodide, workerd or wrangler carries a mark."""
    unmarked = []
    for folder in ("tests", "runtime/tests", "adapters", "infra/tests"):
        for path in sorted((REPO / folder).rglob("test_*.py")):
            if "node_modules" in path.parts:
                continue
            text = path.read_text()
            starts = [name for name in NODE_STARTERS if f"{name}(" in text]
            marked = "mark.pyodide" in text or "mark.workerd" in text
            if starts and not marked:
                unmarked.append(f"{path.relative_to(REPO)} ({', '.join(starts)})")
    assert unmarked == [], "mark these pytest.mark.workerd (or pyodide): " + "; ".join(unmarked)


def _ensure_tools(tmp_path: Path, **env: str) -> tuple[str, str]:
    """``ensure_tools`` of scripts/_services.sh on a PATH without chromium and tmux, with
    a stand-in ``apt-get`` that records its arguments (a fake: the test must not install
    anything on the machine that runs it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    calls = tmp_path / "apt-calls"
    (bin_dir / "apt-get").write_text(f'#!/bin/bash\necho "$*" >> {calls}\n')
    (bin_dir / "apt-get").chmod(0o755)
    (bin_dir / "id").symlink_to("/usr/bin/id")
    proc = subprocess.run(
        ["/bin/bash", "-c", "source scripts/_services.sh && ensure_tools"],
        cwd=REPO,
        env={"PATH": str(bin_dir), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stderr, calls.read_text() if calls.exists() else ""


def test_scripts_test_says_what_it_installs_and_why_before_apt_get(tmp_path: Path) -> None:
    import os

    if os.geteuid() != 0:
        import pytest

        pytest.skip("ensure_tools installs only as root")
    told, calls = _ensure_tools(tmp_path / "a")
    assert calls == "update -qq\ninstall -y -qq chromium tmux\n"
    assert "chromium tmux not found; the dashboard's browser tests need chromium" in told
    assert "HAZE_NO_APT=1 skips this" in told
    told, calls = _ensure_tools(tmp_path / "b", HAZE_NO_APT="1")
    assert calls == "" and told == ""


def test_no_two_test_modules_share_a_name() -> None:
    # The test folders are not packages: pytest imports each module by its basename, so a
    # second test_x.py anywhere stops the whole run at collection ("import file mismatch").
    paths = [REPO / p for p in ("tests", "runtime/tests", "adapters", "infra/tests")]
    seen: dict[str, list[str]] = {}
    for base in paths:
        for f in base.rglob("test_*.py"):
            if "node_modules" not in f.parts and ".venv" not in f.parts:
                seen.setdefault(f.name, []).append(str(f.relative_to(REPO)))
    assert {n: fs for n, fs in seen.items() if len(fs) > 1} == {}
