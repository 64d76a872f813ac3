"""Finding an app on disk: its root folder, its job modules and its schedule file.

``App(root=...)`` imports every ``app/job/**/*.py`` (under a private package name when
another app in this process owns the name ``app``), then runs ``config/schedule.py``.
A module that fails to import is one ``ConfigError`` naming the file.

>>> # discover_jobs(Path("."))  -> ["app.job.send_invoice", ...]
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from haze._base.errors import ConfigError, HazeError

__all__ = ["discover_jobs", "load_schedules"]


def _app_root(root: str | os.PathLike[str]) -> Path:
    """The app folder: ``root`` itself, or the folder of a file (``App(root=__file__)``)."""
    path = Path(root).expanduser().resolve()
    if path.is_file():
        path = path.parent
    elif not path.exists():
        raise ConfigError("the app root does not exist", source=str(path))
    elif not path.is_dir():
        raise ConfigError("the app root is not a directory", source=str(path))
    if not (path / "config").is_dir() and not (path / "app").is_dir():
        raise ConfigError(
            "neither config/ nor app/ is here, so this is not a haze app; point root at the "
            "folder that holds them (from a file in that folder: App(root=__file__))",
            source=str(path),
        )
    return path


def _load_module_file(path: Path, module_name: str) -> Any:
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:  # pragma: no cover
        raise ConfigError("cannot be imported", source=str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except HazeError:
        sys.modules.pop(module_name, None)
        raise
    except Exception as e:
        sys.modules.pop(module_name, None)
        raise ConfigError(f"failed to import: {type(e).__name__}: {e}", source=str(path)) from e
    return module


def discover_jobs(root_dir: Path) -> list[str]:
    """Import every ``app/job/**/*.py`` under ``root_dir``; returns the module names."""
    job_dir = root_dir / "app" / "job"
    if not job_dir.is_dir():
        return []
    root = str(root_dir)
    if root not in sys.path:
        sys.path.insert(0, root)
    names: list[str] = []
    for path in sorted(job_dir.rglob("*.py")):
        if path.name.startswith("_") and path.name != "__init__.py":
            continue
        if path.name == "__init__.py":
            continue
        rel = path.relative_to(root_dir).with_suffix("")
        dotted = ".".join(rel.parts)
        names.append(_import_job_module(root_dir, path, dotted))
    return names


def load_schedules(root_dir: Path) -> None:
    """Run ``config/schedule.py`` (after the jobs, which it names) for its schedule()s."""
    path = root_dir / "config" / "schedule.py"
    if not path.is_file():
        return
    # When another app in this process owns the ``app`` package name, this root's job
    # modules live under a private name; ``from app.job.x import y`` in the schedule
    # file must still reach them, so ``app.*`` names this root's modules meanwhile.
    private = f"{_private_jobs_package(root_dir)}."
    mine = {n[len(private) :]: m for n, m in sys.modules.items() if n.startswith(private)}
    theirs = {n: m for n, m in sys.modules.items() if n == "app" or n.startswith("app.")}
    if mine:
        for name in theirs:
            del sys.modules[name]
        sys.modules.update(mine)
    try:
        _load_module_file(path, f"_haze_config_{abs(hash(str(path)))}_schedule")
    finally:
        if mine:
            for name in [n for n in sys.modules if n == "app" or n.startswith("app.")]:
                module = sys.modules.pop(name)
                if name not in mine:  # first imported by the schedule file: keep it ours
                    sys.modules[private + name] = module
            sys.modules.update(theirs)


def _private_jobs_package(root_dir: Path) -> str:
    return f"_haze_jobs_{abs(hash(str(root_dir)))}"


def _import_job_module(root_dir: Path, path: Path, dotted: str) -> str:
    existing = sys.modules.get(dotted)
    if existing is not None and Path(getattr(existing, "__file__", "") or "").resolve() == path:
        return dotted
    top = sys.modules.get(dotted.split(".")[0])
    top_paths = [str(Path(p).resolve()) for p in getattr(top, "__path__", [])]
    # An app.py beside app/ is the module ``app`` (a web app's, often): importing
    # it to reach app.job would run it, and still not find the package.
    shadowed = top is None and (root_dir / "app.py").is_file()
    if not shadowed and (top is None or str(root_dir / "app") in top_paths):
        try:
            module = importlib.import_module(dotted)
            # ``app`` is a namespace package spanning every root on sys.path: the
            # name can resolve to another app's module of the same path.
            if Path(getattr(module, "__file__", "") or "").resolve() == path:
                return dotted
        except HazeError:
            raise
        except ImportError:
            pass
        except Exception as e:
            raise ConfigError(
                f"failed to import job module: {type(e).__name__}: {e}", source=str(path)
            ) from e
    # Another app already owns the ``app`` package name in this process: load under
    # a private top-level name, with parent packages so relative imports resolve.
    top_name = _private_jobs_package(root_dir)
    name = f"{top_name}.{dotted}"
    if name in sys.modules:  # already imported by a sibling's relative import
        return name
    parts = [top_name, *dotted.split(".")[:-1]]
    for depth in range(1, len(parts) + 1):
        pkg = ".".join(parts[:depth])
        if pkg not in sys.modules:
            where = root_dir.joinpath(*parts[1:depth])
            spec = importlib.machinery.ModuleSpec(pkg, None, is_package=True)
            spec.submodule_search_locations = [str(where)]
            sys.modules[pkg] = importlib.util.module_from_spec(spec)
    _load_module_file(path, name)
    return name
