"""Fixtures for the infra tests: one test app per session (job names are process-wide)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from infra_apps import INF_APP, write_app, write_dist


@pytest.fixture(scope="session")
def inf_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The app of ``infra_mocks.INF_APP``, with a stand-in ``dist/``."""
    root = write_app(tmp_path_factory.mktemp("inf_app"), INF_APP)
    write_dist(root)
    return root


@pytest.fixture(scope="session")
def inf_stack(inf_root: Path) -> Any:
    """``stack_config`` of the test app (loaded once: its jobs register process-wide)."""
    from haze_infra.config import stack_config

    return stack_config(inf_root)
