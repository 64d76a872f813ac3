"""Fixtures for the infra tests: one test app per session (job names are process-wide)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from infra_apps import INF_APP, isolated_stack_config, write_app, write_dist


@pytest.fixture(scope="session")
def inf_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The app of ``infra_mocks.INF_APP``, built with ``haze build`` (aws-lambda, cloudflare)."""
    root = write_app(tmp_path_factory.mktemp("inf_app"), INF_APP)
    write_dist(root)
    return root


@pytest.fixture(scope="session")
def inf_stack(inf_root: Path) -> Any:
    """``stack_config`` of the test app (loaded once: its jobs register process-wide)."""
    return isolated_stack_config(inf_root)


@pytest.fixture(autouse=True)
def _free_the_app_package() -> Iterator[None]:
    """Apps loaded by a test (the CLI, stack_config) leave ``app`` to the next one."""
    path, before = list(sys.path), set(sys.modules)
    yield
    sys.path[:] = path
    for name in set(sys.modules) - before:
        if name == "app" or name.startswith(("app.", "_haze_jobs_", "_haze_config_")):
            sys.modules.pop(name, None)
