"""Install hints name haze's own distributions (``haze`` on PyPI is another project):
``haze-jobs[extra]`` for an installed haze, the checkout's ``./runtime[extra]`` when
haze runs from a checkout of its repository."""

from __future__ import annotations

import re
from pathlib import Path

import haze._base.hints
import pytest
from haze._base.errors import MissingDependencyError
from haze._base.hints import install_hint

REPO = Path(__file__).resolve().parents[2]

#: ``haze[`` not preceded by a name character or ``-``: the bare distribution name.
BARE = re.compile(r"(?<![\w./-])haze\[")


def test_an_installed_haze_names_the_distributions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # haze installed from a wheel: its package is in site-packages, no checkout around it
    fake = tmp_path / "lib" / "site-packages" / "haze" / "_base" / "hints.py"
    monkeypatch.setattr(haze._base.hints, "__file__", str(fake))
    assert install_hint("redis") == "pip install 'haze-jobs[redis]'"
    assert install_hint("cli,postgres") == "pip install 'haze-jobs[cli,postgres]'"
    assert install_hint() == "pip install haze-jobs"
    assert install_hint(package="haze_cloudflare") == "pip install haze-cloudflare"
    assert install_hint("aws", package="haze_infra") == "pip install 'haze-infra[aws]'"
    error = MissingDependencyError("the redis driver", "redis", "redis")
    assert str(error).endswith("Install it with: pip install 'haze-jobs[redis]'")


def test_from_a_checkout_the_hint_is_the_checkouts_project(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(REPO)
    assert install_hint("dashboard") == "pip install './runtime[dashboard]'"
    assert install_hint(package="haze_lambda").startswith("pip install ./adapters/lambda")
    monkeypatch.chdir(tmp_path)  # elsewhere: the checkout's path, which works from anywhere
    assert install_hint("redis") == f"pip install '{REPO / 'runtime'}[redis]'"


def test_no_hint_names_the_bare_haze_distribution() -> None:
    """Nothing haze prints or documents says ``pip install 'haze[...]'``."""
    roots = [REPO / "runtime" / "src", REPO / "adapters", REPO / "infra", REPO / "docs"]
    files = [REPO / "README.md", REPO / "pyproject.toml"]
    for root in roots:
        files += [
            p
            for p in root.rglob("*")
            if p.suffix in (".py", ".md", ".toml", ".txt", ".html", ".sh")
            and "node_modules" not in p.parts
            and "tests" not in p.parts
        ]
    found = [
        f"{p.relative_to(REPO)}:{n}: {line.strip()}"
        for p in files
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if BARE.search(line)
    ]
    assert found == []
