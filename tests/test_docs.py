"""The README's and the docs' Python blocks run as shown (``tests/docs_blocks.py``), and
the example app (``examples/main.py``, the README's first command) runs end to end.

Each document runs in its own process in an empty folder, so the blocks must carry
their own imports and files. A block that cannot run here is marked in the Markdown
with ``<!-- docs-test: skip REASON -->``; the reasons are checked to exist, and the
number of skips is pinned so a new one is a deliberate change.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from docs_blocks import blocks

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# Values the blocks read from the environment, as a deployed app would have them.
DOC_ENV = {
    "HAZE_HTTP_SECRET": "docs-test-secret",
    "SQS_URL": "https://sqs.eu-west-1.amazonaws.com/000000000000/docs-{queue}",
}


def run_doc(doc: Path, workdir: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAZE_", "QUEUE_"))}
    env.update(DOC_ENV)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "tests"), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, str(REPO / "tests" / "docs_blocks.py"), str(doc), str(workdir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_python_blocks_run(doc: Path, tmp_path: Path) -> None:
    found = blocks(doc.read_text(encoding="utf-8"))
    if not found:
        pytest.skip(f"{doc.name} has no Python blocks")
    result = run_doc(doc, tmp_path / "app")
    assert result.returncode == 0, f"{doc.name}\n{result.stdout}\n{result.stderr}"
    done = [
        ln for ln in result.stdout.splitlines() if ln.startswith(("ran ", "wrote ", "skipped "))
    ]
    assert len(done) == len(found), result.stdout


def test_skips_are_few_and_explained() -> None:
    skipped = {
        doc.name: [b.skip for b in blocks(doc.read_text(encoding="utf-8")) if b.skip is not None]
        for doc in DOCS
    }
    for name, reasons in skipped.items():
        assert all(reasons), f"{name}: a skip marker without a reason"
    counts = {name: len(reasons) for name, reasons in skipped.items() if reasons}
    # Pulumi programs need the Pulumi engine and a cloud account; framework recipes
    # need frameworks the workspace does not install; one block calls a live server.
    assert counts == {
        "aws-lambda.md": 1,
        "container.md": 1,
        "frameworks.md": 2,
        "infra.md": 5,
    }, counts


def test_no_document_cites_the_spec_or_the_seed() -> None:
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for word in ("SPEC", "the seed", "seed's", "hazejs docs", "§"):
            assert word not in text, f"{doc.name} mentions {word!r}"


def test_the_example_app_runs_end_to_end(tmp_path: Path) -> None:
    """``examples/main.py`` (``scripts/demo``) on a copy of examples/: the README's demo."""
    import shutil

    copy = tmp_path / "examples"
    shutil.copytree(
        REPO / "examples", copy, ignore=shutil.ignore_patterns("storage", "__pycache__", "dist")
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAZE_", "QUEUE_"))}
    env["COLUMNS"] = "100"
    result = subprocess.run(
        [sys.executable, str(copy / "main.py")],
        cwd=copy,
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "batch    customers.csv: 60/60 processed, 0 failed, finished=True" in out, out
    assert "failed   charge_card: ValueError: card 4000-0000-0000-0002 declined" in out
    assert "left     0 queued jobs" in out
    assert "publish_post    │ 2 " in out, "the chain's middle link succeeded on its retry"


def test_getting_started_shows_the_files_haze_init_writes() -> None:
    from haze.cli.init import _JOB, _MAIN

    code = {b.code for b in blocks((REPO / "docs" / "getting-started.md").read_text())}
    assert "# app/job/example.py\n" + _JOB in code
    assert "# main.py\n" + _MAIN in code
