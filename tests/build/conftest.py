"""Each test builds its own copy of an app in this process: its jobs and imported job
modules are forgotten afterwards, so the next copy registers its own (and not a
``DuplicateJobError`` against the previous test's files)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from haze._jobs import definition as jobs


@pytest.fixture(autouse=True)
def _forget_built_apps() -> Iterator[None]:
    registry = dict(jobs._registry)
    path = list(sys.path)
    before = set(sys.modules)
    yield
    jobs._registry.clear()
    jobs._registry.update(registry)
    sys.path[:] = path
    for name in set(sys.modules) - before:
        if name == "app" or name.startswith(("app.", "_haze_jobs_", "_haze_config_")):
            sys.modules.pop(name, None)
